//! Transaction semantics, journal and checkpoint mechanics, group commit.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockalloc::{Extent, FreeError};
use blockalloc_store::device::{Device, MemDevice};
use blockalloc_store::{check, FormatOptions, FreeConflict, JournalEnd, Store, StoreError};
use common::{format_with_slots, matching_model, Model};

fn small(dev: Arc<MemDevice>) -> Store {
    Store::format(
        dev,
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap()
}

fn reopen(dev: &MemDevice) -> Store {
    let (s, _) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    s.verify().unwrap();
    s
}

#[test]
fn free_validation_errors() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = small(dev);
    let mut t = store.begin();
    let a = t.allocate(10, None).unwrap();
    t.commit().unwrap();

    let mut t1 = store.begin();
    let b = t1.allocate(5, None).unwrap();
    let mut t2 = store.begin();
    // Freeing another transaction's uncommitted allocation.
    let e = t2.free(b).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::FreeConflict {
                conflict: FreeConflict::Uncommitted,
                ..
            }
        ),
        "{e}"
    );
    // Two transactions freeing the same blocks.
    t1.free(a).unwrap();
    let part = Extent::new(a.start() + 2, 3).unwrap();
    let e = t2.free(part).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::FreeConflict {
                conflict: FreeConflict::PendingFree,
                overlap,
                ..
            } if overlap == part
        ),
        "{e}"
    );
    // Metadata, never-allocated space, past the end.
    let e = t2.free(Extent::new(0, 1).unwrap()).unwrap_err();
    assert!(matches!(e, StoreError::FreeMetadata { .. }), "{e}");
    let free_spot = Extent::new(store.layout().capacity_blocks - 1, 1).unwrap();
    let e = t2.free(free_spot).unwrap_err();
    assert!(
        matches!(e, StoreError::Free(FreeError::NotAllocated { .. })),
        "{e}"
    );
    let e = t2
        .free(Extent::new(store.layout().capacity_blocks, 1).unwrap())
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Free(FreeError::OutOfRange { .. })),
        "{e}"
    );
    // Errors leave the transactions usable.
    t2.allocate(1, None).unwrap();
    t1.commit().unwrap();
    t2.commit().unwrap();
    // Now a double free.
    let mut t3 = store.begin();
    let e = t3.free(a).unwrap_err();
    assert!(
        matches!(e, StoreError::Free(FreeError::NotAllocated { .. })),
        "{e}"
    );
    store.verify().unwrap();
}

#[test]
fn abort_and_drop_return_allocations_at_once() {
    let store = small(Arc::new(MemDevice::new(16 << 20)));
    let used0 = store.status().space.used_blocks;
    let mut t = store.begin();
    t.allocate(100, None).unwrap();
    assert_eq!(store.status().reserved_blocks, 100);
    assert_eq!(store.status().open_txns, 1);
    t.abort();
    assert_eq!(store.status().space.used_blocks, used0);
    {
        let mut t = store.begin();
        t.allocate_scattered(50).unwrap();
    }
    let st = store.status();
    assert_eq!(
        (st.space.used_blocks, st.reserved_blocks, st.open_txns),
        (used0, 0, 0)
    );
    let info = store.begin().commit().unwrap();
    assert_eq!(info.seq, 0, "an empty transaction writes nothing");
    assert_eq!(store.stats().entries, 0);
}

#[test]
fn journal_wraps_and_checkpoints_keep_the_state() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = small(dev.clone());
    store.set_checkpoint_interval(5);
    let mut model = Model::default();
    for i in 0..600u64 {
        let mut t = store.begin();
        let a = t.allocate(1 + i % 7, None).unwrap();
        let mut freed = Vec::new();
        if i % 3 == 0 {
            if let Some((&s, &l)) = model.live.iter().next() {
                let e = Extent::new(s, l).unwrap();
                t.free(e).unwrap();
                freed.push(e);
            }
        }
        t.commit().unwrap();
        model.apply(&[a], &freed);
    }
    let st = store.stats();
    assert_eq!(st.commits, 600);
    assert!(st.checkpoints > 50, "{st:?}");
    assert!(
        store.status().journal.tail_pos > 3 * 64,
        "the ring wrapped several times"
    );
    let s2 = reopen(&dev);
    matching_model(&s2, &model, &[]).unwrap();
    assert!(check(&*dev).unwrap().is_consistent());
    // A clean close leaves nothing to replay.
    store.close().unwrap();
    let (s3, report) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    assert_eq!(report.entries, 0);
    assert_eq!(report.journal_end, JournalEnd::Clean);
    matching_model(&s3, &model, &[]).unwrap();
}

#[test]
fn oversized_transactions_are_refused_and_rolled_back() {
    // The largest entry is a quarter of the 64-page ring: 64 KiB, about
    // 13 000 one-block allocations of 5 bytes each.
    let store = small(Arc::new(MemDevice::new(128 << 20)));
    let used0 = store.status().space.used_blocks;
    let mut t = store.begin();
    for _ in 0..20_000 {
        t.allocate(1, Some(store.layout().capacity_blocks)).unwrap();
    }
    let e = t.commit().unwrap_err();
    assert!(matches!(e, StoreError::TxnTooLarge { .. }), "{e}");
    assert_eq!(store.status().space.used_blocks, used0);
    store.verify().unwrap();
}

#[test]
fn a_free_list_too_large_for_its_slot_keeps_the_journal_working() {
    // Only a store formatted with slots smaller than the worst case (as
    // earlier versions sized them) can get here. 256 MiB in 512-byte
    // blocks: 524288 blocks, slots of 64 KiB. Every other block free gives
    // 256 Ki free extents: about 512 KiB as a list, 16 bitmaps of 4 KiB
    // chunked — neither fits. The journal (1 MiB) holds the frees made
    // after the last checkpoint that fitted.
    let dev = Arc::new(MemDevice::new(256 << 20));
    format_with_slots(&dev, 512, 64 << 10, Some(1 << 20));
    let (store, _) = Store::open(dev.clone()).unwrap();
    assert!(!store.layout().slots_hold_any_checkpoint());
    let meta = store.layout().meta_blocks;
    let cap = store.layout().capacity_blocks;
    let mut t = store.begin();
    let all = t.allocate(cap - meta, None).unwrap();
    t.commit().unwrap();
    let mut model = Model::default();
    model.alloc(all);
    let mut t = store.begin();
    t.free(all).unwrap();
    t.commit().unwrap();
    model.free(all);
    let mut t = store.begin();
    let mut pieces = Vec::new();
    for _ in meta..cap {
        pieces.push(t.allocate(1, Some(cap)).unwrap_or_else(|_| unreachable!()));
    }
    t.commit().unwrap_err(); // too large for one entry
    for chunk in pieces.chunks(400).map(|c| c.to_vec()).collect::<Vec<_>>() {
        let mut t = store.begin();
        let mut got = Vec::new();
        for e in &chunk {
            got.push(t.allocate(e.len(), Some(e.start())).unwrap());
        }
        t.commit().unwrap();
        model.apply(&got, &[]);
    }
    for chunk in model
        .extents()
        .chunks(800)
        .map(|c| c.to_vec())
        .collect::<Vec<_>>()
    {
        let mut t = store.begin();
        let odd: Vec<_> = chunk
            .iter()
            .copied()
            .filter(|e| e.start() % 2 == 1)
            .collect();
        for &e in &odd {
            t.free(e).unwrap();
        }
        t.commit().unwrap();
        model.apply(&[], &odd);
    }
    let e = store.checkpoint().unwrap_err();
    assert!(matches!(e, StoreError::CheckpointTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("checkpoint too large"));
    // The store still works, and the journal holds the truth.
    let mut t = store.begin();
    let x = t.allocate(1, None).unwrap();
    t.commit().unwrap();
    model.alloc(x);
    let s2 = reopen(&dev);
    matching_model(&s2, &model, &[]).unwrap();
}

/// A device whose sync takes a while, like a real disk's cache flush.
struct SlowSync {
    inner: MemDevice,
    syncs: AtomicU64,
}

impl Device for SlowSync {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    }
    fn describe(&self) -> String {
        "slow-sync memory device".into()
    }
}

#[test]
fn concurrent_commits_share_syncs() {
    let dev = Arc::new(SlowSync {
        inner: MemDevice::new(64 << 20),
        syncs: AtomicU64::new(0),
    });
    let store = Arc::new(Store::format(dev.clone(), FormatOptions::default()).unwrap());
    let syncs_at_start = dev.syncs.load(Ordering::Relaxed);
    const THREADS: usize = 8;
    const PER_THREAD: usize = 50;
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut groups = 0u64;
                for _ in 0..PER_THREAD {
                    let mut t = store.begin();
                    let e = t.allocate(3, None).unwrap();
                    let info = t.commit().unwrap();
                    groups += info.group as u64;
                    mine.push(e);
                }
                (mine, groups)
            })
        })
        .collect();
    let mut model = Model::default();
    let mut grouped = 0;
    for h in handles {
        let (mine, g) = h.join().unwrap();
        model.apply(&mine, &[]);
        grouped += g;
    }
    let commits = (THREADS * PER_THREAD) as u64;
    let syncs = dev.syncs.load(Ordering::Relaxed) - syncs_at_start;
    let st = store.stats();
    assert_eq!(st.commits, commits);
    assert!(
        syncs < commits,
        "group commit: {syncs} syncs for {commits} commits"
    );
    assert!(grouped > commits, "some commits shared an entry");
    matching_model(&store, &model, &[]).unwrap();
    store.verify().unwrap();
}

#[test]
fn a_shared_store_closes_cleanly_and_refuses_later_writes() {
    let dev = Arc::new(MemDevice::new(128 << 20));
    let store = Arc::new(small(Arc::clone(&dev)));
    let mut t = store.begin();
    let a = t.allocate(8, None).unwrap();
    t.commit().unwrap();
    // A reservation taken before the close: its publish must be refused.
    let mut r = store.reserve(16, None).unwrap();
    let shared = Arc::clone(&store);
    std::thread::spawn(move || shared.close_shared().unwrap())
        .join()
        .unwrap();
    // Closing again does nothing.
    store.close_shared().unwrap();
    let used = store.status().space.used_blocks;
    let mut t = store.begin();
    let e = match t.allocate(8, None) {
        Err(e) => e,
        Ok(_) => t.commit().unwrap_err(),
    };
    assert!(matches!(e, StoreError::Closed { .. }), "{e}");
    assert!(e.to_string().contains("closed"), "{e}");
    let e = store.checkpoint().unwrap_err();
    assert!(matches!(e, StoreError::Closed { .. }), "{e}");
    let part = r.extents()[0];
    let e = r.publish(&[part], &[]).unwrap_err();
    assert!(matches!(e, StoreError::Closed { .. }), "{e}");
    assert_eq!(store.status().space.used_blocks, used, "nothing changed");
    store.check_allocated(a).unwrap();
    let (s2, report) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    assert!(report.closed_cleanly, "{report:?}");
    assert_eq!(report.entries, 0);
    s2.check_allocated(a).unwrap();
}

#[test]
fn commit_all_writes_many_transactions_in_one_entry_and_keeps_each_outcome() {
    let dev = Arc::new(MemDevice::new(128 << 20));
    let store = Arc::new(small(Arc::clone(&dev)));
    let mut t = store.begin();
    let old = t.allocate(8, None).unwrap();
    t.commit().unwrap();
    let mut lease = store.reserve(64, None).unwrap();
    let piece = Extent::new(lease.extents()[0].start(), 4).unwrap();
    let before = store.stats();

    let mut a = store.begin();
    let x = a.allocate(3, None).unwrap();
    let mut b = store.begin();
    b.free(old).unwrap();
    let mut c = store.begin();
    lease.publish_in(&mut c, &[piece], &[]).unwrap();
    let empty = store.begin();
    // Too large for any entry: refused alone, its allocation rolled back.
    let mut big = store.begin();
    let mut big_allocs = Vec::new();
    for _ in 0..20_000 {
        big_allocs.push(
            big.allocate(1, Some(store.layout().capacity_blocks))
                .unwrap(),
        );
    }
    let out = store.commit_all(vec![a, b, big, c, empty]);
    assert_eq!(out.len(), 5);
    assert!(
        out[0].is_ok() && out[1].is_ok() && out[3].is_ok(),
        "{out:?}"
    );
    assert!(
        matches!(out[2], Err(StoreError::TxnTooLarge { .. })),
        "{:?}",
        out[2]
    );
    assert_eq!(
        out[4].as_ref().unwrap().seq,
        0,
        "an empty transaction writes nothing"
    );
    let seqs: Vec<u64> = [0, 1, 3]
        .iter()
        .map(|&i| out[i].as_ref().unwrap().seq)
        .collect();
    assert!(seqs.iter().all(|&s| s == seqs[0]), "one entry: {seqs:?}");
    let after = store.stats();
    assert_eq!(after.syncs - before.syncs, 1, "one sync for the three");
    assert_eq!(after.commits - before.commits, 3);
    for e in &big_allocs {
        store.check_allocated(*e).unwrap_err();
    }
    store.verify().unwrap();
    drop(lease);

    // Durable as committed: the allocation and the published piece stay,
    // the freed extent is free.
    let s = reopen(&dev);
    s.check_allocated(x).unwrap();
    s.check_allocated(piece).unwrap();
    s.check_allocated(old).unwrap_err();
}

#[test]
fn publish_in_a_transaction_that_aborts_frees_the_pieces() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Arc::new(small(dev));
    let mut lease = store.reserve(64, None).unwrap();
    let held = lease.blocks();
    let piece = Extent::new(lease.extents()[0].start(), 4).unwrap();
    let free_before = store.free_blocks();
    let mut t = store.begin();
    lease.publish_in(&mut t, &[piece], &[]).unwrap();
    assert_eq!(lease.blocks(), held - 4);
    t.abort();
    assert_eq!(store.free_blocks(), free_before + 4, "back in free space");
    store.verify().unwrap();
    // A piece outside the lease is refused and changes nothing.
    let mut t = store.begin();
    let outside = Extent::new(lease.extents()[0].end() + 100, 2).unwrap();
    assert!(lease.publish_in(&mut t, &[outside], &[]).is_err());
    assert_eq!(lease.blocks(), held - 4);
    t.commit().unwrap();
    // A transaction of another store is refused.
    let other = Arc::new(small(Arc::new(MemDevice::new(16 << 20))));
    let mut t = other.begin();
    let p2 = Extent::new(lease.extents()[0].start(), 2).unwrap();
    assert!(matches!(
        lease.publish_in(&mut t, &[p2], &[]),
        Err(StoreError::NotReserved { .. })
    ));
    assert_eq!(lease.blocks(), held - 4);
}

/// A fenced store writes nothing — commits, checkpoints, the close — and
/// changes nothing: a refused commit's allocations are free again. Once
/// the fence lifts it writes again, and a reopen sees exactly what was
/// committed outside the fence.
#[test]
fn a_fenced_store_writes_nothing_until_the_fence_lifts() {
    use std::sync::atomic::AtomicBool;
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = small(Arc::clone(&dev));
    let fenced = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&fenced);
    store.set_fence(Arc::new(move || f.load(Ordering::SeqCst)));
    let mut t = store.begin();
    let kept = t.allocate(8, None).unwrap();
    t.commit().unwrap();
    let free = store.free_blocks();
    let image = dev.image();

    fenced.store(true, Ordering::SeqCst);
    let mut t = store.begin();
    t.allocate(16, None).unwrap();
    t.free(kept).unwrap();
    assert!(matches!(t.commit(), Err(StoreError::Fenced { .. })));
    assert!(matches!(store.checkpoint(), Err(StoreError::Fenced { .. })));
    assert!(matches!(
        store.close_shared(),
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(
        store.free_blocks(),
        free,
        "a refused commit changes nothing"
    );
    store.verify().unwrap();
    assert!(dev.image() == image, "a fenced store wrote to its device");

    fenced.store(false, Ordering::SeqCst);
    let mut t = store.begin();
    let later = t.allocate(4, None).unwrap();
    t.commit().unwrap();
    store.checkpoint().unwrap();
    let again = reopen(&dev);
    again.check_allocated(kept).unwrap();
    again.check_allocated(later).unwrap();
    assert_eq!(again.free_blocks(), free - 4);
}
