//! The object-index protocol under crashes, with reconcile closing the gap.
//!
//! A model embedder keeps an index of objects that survives every crash
//! (its own durable structure) and follows the protocol: a create commits
//! the allocation, then records the object; a delete removes the object
//! from the index, then commits the free. Runs stop at an injected I/O
//! failure or at a random point between the two steps of an operation; the
//! crash image is reopened and must never hold an indexed object as free.
//! Reconcile (itself crashed at random I/O calls, in small batches) then
//! leaves exactly the indexed objects (and the metadata) allocated.
//!
//! `BLOCKALLOC_CRASH_ITERS=N` multiplies the number of random cases.

mod common;

use std::convert::Infallible;
use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{CrashMode, FaultDevice, MemDevice};
use blockalloc_store::{check, ReconcileOptions, Store, StoreError};
use common::{crash_mode, fresh_image, iters, Model};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

fn is_device_failure(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { .. } | StoreError::Poisoned { .. })
}

/// Creates and deletes objects following the protocol until `steps` are
/// done, the device fails, or a crash is chosen between two steps.
fn run_protocol(store: &Store, rng: &mut Xoshiro256PlusPlus, index: &mut Model, steps: usize) {
    store.set_checkpoint_interval(rng.random_range(1..12));
    for _ in 0..steps {
        match rng.random_range(0..100) {
            0..55 => {
                // Create: allocate and commit, then record in the index.
                let mut t = store.begin();
                let n = rng.random_range(1..=3);
                for _ in 0..n {
                    match t.allocate(rng.random_range(1..=40), None) {
                        Ok(_) | Err(StoreError::Alloc(_)) => {}
                        Err(e) if is_device_failure(&e) => return,
                        Err(e) => panic!("allocate: {e}"),
                    }
                }
                let made = t.allocations().to_vec();
                match t.commit() {
                    Ok(_) => {}
                    Err(e) if is_device_failure(&e) => return,
                    Err(e) => panic!("commit: {e}"),
                }
                if rng.random_bool(0.05) {
                    return; // Crash after the commit, before the index.
                }
                for e in made {
                    index.alloc(e);
                }
            }
            55..95 if !index.live.is_empty() => {
                // Delete: remove from the index, then commit the free.
                let k = rng.random_range(0..index.live.len());
                let (&s, &l) = index.live.iter().nth(k).unwrap();
                let e = Extent::new(s, l).unwrap();
                index.free(e);
                if rng.random_bool(0.05) {
                    return; // Crash after the index, before the free.
                }
                let mut t = store.begin();
                t.free(e).unwrap_or_else(|err| {
                    if !is_device_failure(&err) {
                        panic!("free {e}: {err}")
                    }
                });
                match t.commit() {
                    Ok(_) => {}
                    Err(e) if is_device_failure(&e) => return,
                    Err(e) => panic!("commit: {e}"),
                }
            }
            95..100 => match store.checkpoint() {
                Ok(()) => {}
                Err(e) if is_device_failure(&e) => return,
                Err(e) => panic!("checkpoint: {e}"),
            },
            _ => {}
        }
    }
}

/// Reopens `image` after a crash: consistent, and no indexed object is
/// free (a crash may leak, never free an object's space).
fn reopen(image: Vec<u8>, index: &Model, ctx: &str) -> (Store, Arc<FaultDevice>) {
    let report = check(&MemDevice::from_image(image.clone()))
        .unwrap_or_else(|e| panic!("{ctx}: check failed: {e}"));
    assert!(report.is_consistent(), "{ctx}: {:?}", report.problems);
    let dev = Arc::new(FaultDevice::new(image));
    let (store, _) = Store::open(dev.clone()).unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
    store.verify().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    for e in index.extents() {
        store
            .check_allocated(e)
            .unwrap_or_else(|err| panic!("{ctx}: indexed object {e} is free: {err}"));
    }
    (store, dev)
}

fn reconcile(store: &Store, index: &Model, batch: usize) -> Result<(), StoreError> {
    let live = index.extents();
    store
        .reconcile(
            || live.iter().map(|&e| Ok::<_, Infallible>(e)),
            ReconcileOptions {
                dry_run: false,
                batch_extents: batch,
            },
        )
        .map(|_| ())
}

/// The store holds exactly the index's objects plus the metadata.
fn assert_matches_index(store: &Store, index: &Model, ctx: &str) {
    let l = store.layout();
    assert_eq!(
        store.committed_free_extents(),
        index.free_list(l.meta_blocks, l.capacity_blocks),
        "{ctx}: allocated space differs from the index"
    );
    let objects: u64 = index.live.values().sum();
    assert_eq!(
        store.status().space.used_blocks,
        l.meta_blocks + objects,
        "{ctx}"
    );
}

fn random_case(seed: u64) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut image = fresh_image();
    let mut index = Model::default();
    for cycle in 0..6 {
        let ctx = format!("seed {seed} cycle {cycle}");
        let (store, dev) = reopen(image, &index, &ctx);
        // Reconcile, possibly crashed part-way; each crash is reopened (no
        // object lost) and reconciled again until a run completes.
        let mut tries = 0;
        let (store, dev) = {
            let (mut store, mut dev) = (store, dev);
            loop {
                let batch = rng.random_range(1..=6);
                if tries < 2 && rng.random_bool(0.5) {
                    dev.fail_after(rng.random_range(0..12));
                }
                match reconcile(&store, &index, batch) {
                    Ok(()) => break,
                    Err(e) if is_device_failure(&e) => {
                        tries += 1;
                        let img = dev.crash_image(crash_mode(&mut rng));
                        drop(store);
                        let ctx = format!("{ctx}, reconcile crash {tries}");
                        (store, dev) = reopen(img, &index, &ctx);
                    }
                    Err(e) => panic!("{ctx}: reconcile: {e}"),
                }
            }
            (store, dev)
        };
        dev.heal();
        assert_matches_index(&store, &index, &ctx);
        store.verify().unwrap();
        if rng.random_bool(0.8) {
            dev.fail_after(rng.random_range(0..300));
        }
        let steps = rng.random_range(20..200);
        run_protocol(&store, &mut rng, &mut index, steps);
        image = dev.crash_image(crash_mode(&mut rng));
        drop(store);
    }
    let ctx = format!("seed {seed} final");
    let (store, _dev) = reopen(image, &index, &ctx);
    reconcile(&store, &index, 4).unwrap();
    assert_matches_index(&store, &index, &ctx);
    store.close().unwrap();
}

#[test]
fn reconcile_after_random_crashes_leaves_exactly_the_indexed_objects() {
    for seed in 0..30 * iters() {
        random_case(seed);
    }
}

#[test]
fn a_leak_between_commit_and_index_is_freed_and_stays_freed() {
    let dev = Arc::new(FaultDevice::new(fresh_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let mut index = Model::default();
    let mut t = store.begin();
    let kept = t.allocate(10, None).unwrap();
    let leaked = t.allocate(20, None).unwrap();
    t.commit().unwrap();
    index.alloc(kept);
    // The crash comes before `leaked` reaches the index.
    let img = dev.crash_image(CrashMode::DropUnsynced);
    drop(store);
    let (store, dev) = reopen(img, &index, "first reopen");
    store.check_allocated(leaked).unwrap();
    reconcile(&store, &index, 16).unwrap();
    assert_matches_index(&store, &index, "after reconcile");
    // The frees are durable without a checkpoint.
    let img = dev.crash_image(CrashMode::DropUnsynced);
    drop(store);
    let (store, _) = reopen(img, &index, "second reopen");
    assert_matches_index(&store, &index, "after the second reopen");
}
