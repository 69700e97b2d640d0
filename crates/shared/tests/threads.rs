//! The shared handle under threads: no block is ever handed to two owners,
//! cross-thread frees work, double frees are caught from any thread, cached
//! space is never stranded and goes home when a thread exits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use blockalloc::{AllocError, Extent, FreeError};
use blockalloc_shared::{SharedAllocator, SharedConfig};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

fn small_config() -> SharedConfig {
    SharedConfig {
        region_blocks: 1 << 10,
        max_arenas: 8,
        keep_empty_regions: 1,
    }
}

/// Marks every block of `e` as owned by `who`; panics if any block already
/// has an owner: that would be a double hand-out.
fn claim(shadow: &[AtomicU32], e: Extent, who: u32) {
    for b in e.start()..e.end() {
        let prev = shadow[b as usize].swap(who, Ordering::SeqCst);
        assert_eq!(
            prev, 0,
            "block {b} handed to thread {who} while owned by {prev}"
        );
    }
}

/// Clears the owner marks of `e` (before it is freed).
fn release(shadow: &[AtomicU32], e: Extent, who: u32) {
    for b in e.start()..e.end() {
        let prev = shadow[b as usize].swap(0, Ordering::SeqCst);
        assert_eq!(prev, who, "block {b}: expected owner {who}, found {prev}");
    }
}

#[test]
fn stress_no_block_has_two_owners() {
    const THREADS: u32 = 6;
    const CAP: u64 = 1 << 16;
    let a = SharedAllocator::with_config(CAP, small_config()).unwrap();
    let shadow: Arc<Vec<AtomicU32>> = Arc::new((0..CAP).map(|_| AtomicU32::new(0)).collect());
    // Extents handed to other threads to free: (owner mark, extent).
    let handoff: Arc<Mutex<Vec<(u32, Extent)>>> = Arc::new(Mutex::new(Vec::new()));
    let start = Arc::new(Barrier::new(THREADS as usize));
    let workers: Vec<_> = (1..=THREADS)
        .map(|who| {
            let (a, shadow, handoff, start) =
                (a.clone(), shadow.clone(), handoff.clone(), start.clone());
            thread::spawn(move || {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(u64::from(who));
                let mut live: Vec<Extent> = Vec::new();
                start.wait();
                for i in 0..20_000u32 {
                    match rng.random_range(0..10) {
                        0..=4 => {
                            let len = rng.random_range(1..=64);
                            let hint = rng.random_bool(0.2).then(|| rng.random_range(0..CAP));
                            match a.allocate(len, hint) {
                                Ok(e) => {
                                    assert_eq!(e.len(), len);
                                    claim(&shadow, e, who);
                                    live.push(e);
                                }
                                Err(AllocError::NoSpace { .. }) => {}
                                Err(e) => panic!("thread {who}: {e}"),
                            }
                        }
                        5 => {
                            let mut out = Vec::new();
                            if a.allocate_scattered(rng.random_range(1..=200), &mut out)
                                .is_ok()
                            {
                                for e in out {
                                    claim(&shadow, e, who);
                                    live.push(e);
                                }
                            }
                        }
                        6..=7 if !live.is_empty() => {
                            let e = live.swap_remove(rng.random_range(0..live.len()));
                            release(&shadow, e, who);
                            a.free(e).unwrap();
                        }
                        8 if !live.is_empty() => {
                            // Hand one to another thread to free.
                            let e = live.swap_remove(rng.random_range(0..live.len()));
                            handoff.lock().unwrap().push((who, e));
                        }
                        _ => {
                            let got = handoff.lock().unwrap().pop();
                            if let Some((owner, e)) = got {
                                release(&shadow, e, owner);
                                a.free(e).unwrap();
                            }
                        }
                    }
                    if i % 5000 == 0 && who == 1 {
                        a.verify().unwrap();
                    }
                }
                live
            })
        })
        .collect();
    let mut live: Vec<Extent> = Vec::new();
    for w in workers {
        live.extend(w.join().unwrap());
    }
    live.extend(handoff.lock().unwrap().drain(..).map(|(_, e)| e));
    a.verify().unwrap();
    let held: u64 = live.iter().map(|e| e.len()).sum();
    assert_eq!(a.used(), held);
    assert_eq!(a.status().used_blocks, held);
    // Every thread has exited: nothing is cached any more.
    assert_eq!(a.cached_blocks(), 0);
    for e in live {
        a.free(e).unwrap();
    }
    assert_eq!(a.used(), 0);
    assert_eq!(a.free_extents(), vec![Extent::new(0, CAP).unwrap()]);
    a.verify().unwrap();
}

#[test]
fn double_free_is_caught_from_another_thread() {
    let a = SharedAllocator::with_config(1 << 14, small_config()).unwrap();
    let e = a.allocate(10, None).unwrap();
    let b = a.clone();
    thread::spawn(move || b.free(e).unwrap()).join().unwrap();
    assert!(matches!(a.free(e), Err(FreeError::NotAllocated { .. })));
    // Part of a cached free extent, freed by a third thread.
    let c = a.clone();
    let err = thread::spawn(move || c.free(Extent::new(e.start() + 2, 3).unwrap()))
        .join()
        .unwrap();
    assert!(matches!(err, Err(FreeError::NotAllocated { .. })));
    a.verify().unwrap();
}

#[test]
fn cached_space_is_never_stranded() {
    // Region 1024 blocks, device 8 regions. This thread caches most of a
    // region; another thread then asks for everything else in one piece.
    const CAP: u64 = 8 << 10;
    let a = SharedAllocator::with_config(CAP, small_config()).unwrap();
    let x = a.allocate(1, None).unwrap();
    assert!(
        a.cached_blocks() > 0,
        "the first allocation leased a region"
    );
    let b = a.clone();
    let big = thread::spawn(move || b.allocate(CAP - 1, None))
        .join()
        .unwrap();
    let big = big.expect("free space cached by another thread must be reclaimed");
    assert_eq!(a.used(), CAP);
    assert!(matches!(
        a.allocate(1, None),
        Err(AllocError::NoSpace { .. })
    ));
    a.free(x).unwrap();
    a.free(big).unwrap();
    assert_eq!(a.used(), 0);
    a.verify().unwrap();
}

#[test]
fn scattered_fails_only_when_the_device_is_short() {
    const CAP: u64 = 4 << 10;
    let a = SharedAllocator::with_config(CAP, small_config()).unwrap();
    // Fill with 100-block pieces from two threads, free every other one.
    let mut mine: Vec<Extent> = (0..20).map(|_| a.allocate(100, None).unwrap()).collect();
    let b = a.clone();
    let theirs: Vec<Extent> =
        thread::spawn(move || (0..20).map(|_| b.allocate(100, None).unwrap()).collect())
            .join()
            .unwrap();
    for (i, e) in theirs.iter().enumerate() {
        if i % 2 == 0 {
            a.free(*e).unwrap();
        }
    }
    mine.retain(|e| {
        let keep = e.start() % 200 == 0;
        if !keep {
            a.free(*e).unwrap();
        }
        keep
    });
    let free = CAP - a.used();
    let mut out = Vec::new();
    assert!(matches!(
        a.allocate_scattered(free + 1, &mut out),
        Err(AllocError::NoSpace { .. })
    ));
    assert!(out.is_empty());
    a.allocate_scattered(free, &mut out).unwrap();
    assert_eq!(out.iter().map(|e| e.len()).sum::<u64>(), free);
    assert_eq!(a.used(), CAP);
    a.verify().unwrap();
}

#[test]
fn exiting_thread_returns_its_cache_and_status_counts_it_free() {
    let a = SharedAllocator::with_config(1 << 14, small_config()).unwrap();
    let b = a.clone();
    let kept = thread::spawn(move || {
        let e = b.allocate(5, None).unwrap();
        let f = b.allocate(7, None).unwrap();
        b.free(f).unwrap();
        // While this thread lives its arena caches free space, counted free.
        assert!(b.cached_blocks() > 0);
        assert_eq!(b.used(), 5);
        assert_eq!(b.status().used_blocks, 5);
        e
    })
    .join()
    .unwrap();
    assert_eq!(
        a.cached_blocks(),
        0,
        "the exited thread handed its space back"
    );
    assert_eq!(a.used(), 5);
    a.free(kept).unwrap();
    assert_eq!(a.free_extents(), vec![Extent::new(0, 1 << 14).unwrap()]);
    a.verify().unwrap();
}

#[test]
fn more_threads_than_arenas_share_them() {
    let cfg = SharedConfig {
        max_arenas: 2,
        ..small_config()
    };
    let a = SharedAllocator::with_config(1 << 15, cfg).unwrap();
    let hs: Vec<_> = (0..6)
        .map(|i| {
            let a = a.clone();
            thread::spawn(move || {
                let v: Vec<_> = (0..200)
                    .map(|j| a.allocate((i + j) % 17 + 1, None).unwrap())
                    .collect();
                for e in v {
                    a.free(e).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(a.used(), 0);
    assert_eq!(a.cached_blocks(), 0);
    a.verify().unwrap();
}

#[test]
fn bad_input_is_refused() {
    let a = SharedAllocator::new(1000).unwrap();
    assert_eq!(a.allocate(0, None), Err(AllocError::ZeroLength));
    assert!(matches!(
        a.allocate(1, Some(1001)),
        Err(AllocError::HintOutOfRange { .. })
    ));
    assert!(matches!(
        a.free(Extent::new(990, 20).unwrap()),
        Err(FreeError::OutOfRange { .. })
    ));
    assert!(matches!(
        a.free(Extent::new(0, 1).unwrap()),
        Err(FreeError::NotAllocated { .. })
    ));
    assert!(matches!(
        a.allocate(1001, None),
        Err(AllocError::NoSpace { .. })
    ));
    assert_eq!(a.used(), 0);
    a.verify().unwrap();
}
