//! Crash consistency against a reference model, with the fault-injecting
//! device.
//!
//! Random transactions (several open at once, commits, aborts, explicit
//! checkpoints, a tiny journal so that checkpoints and ring wraps happen
//! often) run until an injected I/O failure or a chosen crash point; the
//! image a reboot would find (unsynced writes dropped, kept, torn, or kept
//! sector by sector at random) is reopened and must hold exactly the
//! committed transactions — plus or minus the one whose commit failed, all
//! or nothing — pass `verify`, and pass the full `check`.
//!
//! Transactions also put and delete records, which must come back exactly
//! as committed (announcements restate them at every checkpoint, so the
//! tiny journal exercises that too).
//!
//! `BLOCKALLOC_CRASH_ITERS=N` multiplies the number of random cases (CI runs
//! the default of 1).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{CrashMode, FaultDevice, MemDevice};
use blockalloc_store::{check, Store, StoreError, Txn};
use common::{crash_mode, fresh_image, iters, matching_model, Model};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Outcome of one run of operations.
struct Run {
    /// Transactions whose commit failed: durable or not, all or nothing.
    uncertain: Vec<(Vec<Extent>, Vec<Extent>)>,
    /// Their record changes.
    uncertain_records: Vec<Change>,
}

/// A record change: the new value, or `None` for a delete.
type Change = (Vec<u8>, Option<Vec<u8>>);

/// The committed records.
type Records = BTreeMap<Vec<u8>, Vec<u8>>;

fn apply_records(model: &mut Records, changes: &[Change]) {
    for (k, v) in changes {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
}

fn is_device_failure(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { .. } | StoreError::Poisoned { .. })
}

/// Runs random operations on `store` until `steps` are done or the device
/// fails. Updates `model` with every commit that returned `Ok`.
fn run_ops(
    store: &Store,
    rng: &mut Xoshiro256PlusPlus,
    model: &mut Model,
    records: &mut Records,
    steps: usize,
) -> Run {
    let mut open: Vec<(Txn<'_>, Vec<Change>)> = Vec::new();
    let mut uncertain = Vec::new();
    let mut uncertain_records = Vec::new();
    store.set_checkpoint_interval(rng.random_range(1..12));
    'steps: for _ in 0..steps {
        match rng.random_range(0..100) {
            0..10 if open.len() < 3 => open.push((store.begin(), Vec::new())),
            0..45 if !open.is_empty() => {
                let i = rng.random_range(0..open.len());
                let len = rng.random_range(1..=40);
                let hint = rng.random_bool(0.3).then(|| rng.random_range(0..1024));
                if rng.random_bool(0.3) {
                    // A record change with it: up to a few hundred bytes,
                    // so that announcements take several pages.
                    let key = vec![b'k', rng.random_range(0..24u8)];
                    let (t, changes) = &mut open[i];
                    if rng.random_bool(0.25) {
                        t.delete_record(&key).unwrap();
                        changes.push((key, None));
                    } else {
                        let n = rng.random_range(0..400);
                        let value: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                        match t.put_record(&key, &value) {
                            Ok(()) => changes.push((key, Some(value))),
                            Err(StoreError::BadRecord { .. }) => {}
                            Err(e) => panic!("put_record: {e}"),
                        }
                    }
                }
                match open[i].0.allocate(len, hint) {
                    Ok(_) | Err(StoreError::Alloc(_)) => {}
                    Err(e) if is_device_failure(&e) => break 'steps,
                    Err(e) => panic!("allocate: {e}"),
                }
            }
            45..70 if !open.is_empty() && !model.live.is_empty() => {
                let i = rng.random_range(0..open.len());
                let k = rng.random_range(0..model.live.len());
                let (&s, &l) = model.live.iter().nth(k).unwrap();
                match open[i].0.free(Extent::new(s, l).unwrap()) {
                    Ok(()) | Err(StoreError::FreeConflict { .. }) => {}
                    Err(e) if is_device_failure(&e) => break 'steps,
                    Err(e) => panic!("free: {e}"),
                }
            }
            70..90 if !open.is_empty() => {
                let (t, changes) = open.swap_remove(rng.random_range(0..open.len()));
                let (a, f) = (t.allocations().to_vec(), t.frees().to_vec());
                match t.commit() {
                    Ok(_) => {
                        model.apply(&a, &f);
                        apply_records(records, &changes);
                    }
                    Err(e) if is_device_failure(&e) => {
                        uncertain.push((a, f));
                        uncertain_records = changes;
                        break 'steps;
                    }
                    Err(e) => panic!("commit: {e}"),
                }
            }
            90..96 if !open.is_empty() => {
                open.swap_remove(rng.random_range(0..open.len())).0.abort();
            }
            96..100 => match store.checkpoint() {
                Ok(()) => {}
                Err(e) if is_device_failure(&e) => break 'steps,
                Err(e) => panic!("checkpoint: {e}"),
            },
            _ => {}
        }
    }
    drop(open);
    Run {
        uncertain,
        uncertain_records,
    }
}

/// The records `store` holds: `model`, or `model` with the uncertain
/// transaction's changes (all or nothing). Returns the one that matched.
fn matching_records(store: &Store, model: &Records, uncertain: &[Change], ctx: &str) -> Records {
    let got: Records = store.records().into_iter().collect();
    if got == *model {
        return got;
    }
    let mut with = model.clone();
    apply_records(&mut with, uncertain);
    assert!(
        got == with,
        "{ctx}: the records are neither the committed ones nor those plus the transaction in \
         flight: got keys {:?}, committed keys {:?}",
        got.keys().collect::<Vec<_>>(),
        model.keys().collect::<Vec<_>>()
    );
    got
}

/// Reopens `image`, checks it against `model`, and returns the store, its
/// device and the model that matched.
fn reopen_and_check(
    image: Vec<u8>,
    model: &Model,
    uncertain: &[(Vec<Extent>, Vec<Extent>)],
    ctx: &str,
) -> (Store, Arc<FaultDevice>, Model) {
    let probe = MemDevice::from_image(image.clone());
    let report = check(&probe).unwrap_or_else(|e| panic!("{ctx}: check failed: {e}"));
    assert!(
        report.is_consistent(),
        "{ctx}: check found problems: {:?}",
        report.problems
    );
    let dev = Arc::new(FaultDevice::new(image));
    let (store, _report) =
        Store::open(dev.clone()).unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
    store.verify().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let m = matching_model(&store, model, uncertain).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    (store, dev, m)
}

/// One random case: several crash cycles on one device.
fn random_case(seed: u64) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut image = fresh_image();
    let mut model = Model::default();
    let mut uncertain = Vec::new();
    let mut records = Records::new();
    let mut uncertain_records = Vec::new();
    for cycle in 0..5 {
        let ctx = format!("seed {seed} cycle {cycle}");
        // Opening on a failing device is an error, never a panic or damage.
        let flaky = FaultDevice::new(image.clone());
        flaky.fail_after(rng.random_range(0..4));
        if let Err(e) = Store::open(flaky) {
            assert!(matches!(e, StoreError::Io { .. }), "{ctx}: {e}");
        }
        let (store, dev, m) = reopen_and_check(image, &model, &uncertain, &ctx);
        model = m;
        records = matching_records(&store, &records, &uncertain_records, &ctx);
        if rng.random_bool(0.8) {
            dev.fail_after(rng.random_range(0..400));
        }
        let steps = rng.random_range(50..400);
        let run = run_ops(&store, &mut rng, &mut model, &mut records, steps);
        uncertain = run.uncertain;
        uncertain_records = run.uncertain_records;
        if rng.random_bool(0.1) && uncertain.is_empty() && dev.stats().failed == 0 {
            dev.heal();
            store
                .close()
                .unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
            image = dev.crash_image(CrashMode::DropUnsynced);
            let (s, _, _) = reopen_and_check(image.clone(), &model, &[], &ctx);
            assert_eq!(s.status().journal.pages_since_checkpoint, 0);
            matching_records(&s, &records, &[], &ctx);
        } else {
            image = dev.crash_image(crash_mode(&mut rng));
            drop(store);
        }
    }
    let ctx = format!("seed {seed} final");
    let (s, _d, _m) = reopen_and_check(image, &model, &uncertain, &ctx);
    matching_records(&s, &records, &uncertain_records, &ctx);
}

#[test]
fn random_transactions_survive_random_crashes() {
    for seed in 0..40 * iters() {
        random_case(seed);
    }
}

/// A fixed workload, crashed at every I/O call in turn, with every crash
/// mode.
#[test]
fn crash_at_every_io() {
    // Count the I/O calls of the fault-free run.
    let script =
        |store: &Store, rng: &mut Xoshiro256PlusPlus, model: &mut Model, records: &mut Records| {
            run_ops(store, rng, model, records, 300)
        };
    let base = fresh_image();
    let total = {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        let mut m = Model::default();
        let mut recs = Records::new();
        let r = script(
            &store,
            &mut Xoshiro256PlusPlus::seed_from_u64(7),
            &mut m,
            &mut recs,
        );
        assert!(!recs.is_empty(), "the script keeps records");
        assert!(r.uncertain.is_empty());
        let s = dev.stats();
        s.writes + s.syncs
    };
    assert!(total > 20, "the script does I/O ({total})");
    let modes = [
        CrashMode::DropUnsynced,
        CrashMode::KeepUnsynced,
        CrashMode::TearLast { keep_sectors: 1 },
        CrashMode::RandomSectors { seed: 1 },
    ];
    for n in 0..=total {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        dev.fail_after(n);
        let mut model = Model::default();
        let mut records = Records::new();
        let run = script(
            &store,
            &mut Xoshiro256PlusPlus::seed_from_u64(7),
            &mut model,
            &mut records,
        );
        for mode in modes {
            let ctx = format!("failure at I/O {n} of {total}, {mode:?}");
            let img = dev.crash_image(mode);
            let (s, _, m) = reopen_and_check(img, &model, &run.uncertain, &ctx);
            matching_records(&s, &records, &run.uncertain_records, &ctx);
            // The reopened store works: one more transaction commits.
            let mut t = s.begin();
            if let Ok(e) = t.allocate(1, None) {
                t.commit().unwrap();
                assert!(m
                    .free_list(s.layout().meta_blocks, s.layout().capacity_blocks)
                    .iter()
                    .any(|f| f.contains(&e)));
            }
        }
    }
}

#[test]
fn a_crash_with_open_transactions_leaks_nothing() {
    let dev = Arc::new(FaultDevice::new(fresh_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let mut kept = store.begin();
    let k = kept.allocate(10, None).unwrap();
    kept.commit().unwrap();
    let mut open = store.begin();
    open.allocate(100, None).unwrap();
    open.free(k).unwrap();
    // A checkpoint while the transaction is open counts its allocation as
    // free and its pending free as allocated.
    store.checkpoint().unwrap();
    let img = dev.crash_image(CrashMode::DropUnsynced);
    drop(open);
    let (s, _) = Store::open(MemDevice::from_image(img)).unwrap();
    assert_eq!(s.status().space.used_blocks, s.layout().meta_blocks + 10);
    s.check_allocated(k).unwrap();
}

#[test]
fn freed_blocks_are_not_reused_before_the_free_is_durable() {
    let dev = Arc::new(FaultDevice::new(fresh_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    // Fill the device so that the only space left is what gets freed.
    let mut t = store.begin();
    let cap = store.layout().capacity_blocks - store.layout().meta_blocks;
    let all = t.allocate(cap, None).unwrap();
    t.commit().unwrap();
    let mut f = store.begin();
    f.free(all).unwrap();
    let mut other = store.begin();
    assert!(
        matches!(other.allocate(1, None), Err(StoreError::Alloc(_))),
        "a pending free must not be handed out"
    );
    f.commit().unwrap();
    other.allocate(1, None).unwrap();
    other.commit().unwrap();
    // Now crash without syncing anything more: the free and the new
    // allocation are both durable.
    let img = dev.crash_image(CrashMode::DropUnsynced);
    let (s, _) = Store::open(MemDevice::from_image(img)).unwrap();
    assert_eq!(s.status().space.used_blocks, s.layout().meta_blocks + 1);
}

/// A store image with committed transactions (not closed) and its model.
fn used_image(seed: u64) -> (Vec<u8>, Model) {
    let dev = Arc::new(FaultDevice::new(fresh_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let mut model = Model::default();
    let r = run_ops(
        &store,
        &mut Xoshiro256PlusPlus::seed_from_u64(seed),
        &mut model,
        &mut Records::new(),
        150,
    );
    assert!(r.uncertain.is_empty());
    drop(store);
    (dev.crash_image(CrashMode::DropUnsynced), model)
}

const MODES: [CrashMode; 5] = [
    CrashMode::DropUnsynced,
    CrashMode::KeepUnsynced,
    CrashMode::TearLast { keep_sectors: 0 },
    CrashMode::TearLast { keep_sectors: 1 },
    CrashMode::RandomSectors { seed: 9 },
];

/// Crashes at every I/O of a clean close: the close record must never make
/// recovery call a crash state corrupt.
#[test]
fn a_crash_at_any_point_of_a_clean_close_is_never_taken_for_corruption() {
    for seed in 0..3 {
        let (base, model) = used_image(seed);
        let total = {
            let dev = Arc::new(FaultDevice::new(base.clone()));
            let (store, _) = Store::open(dev.clone()).unwrap();
            store.close().unwrap();
            let s = dev.stats();
            s.writes + s.syncs
        };
        for n in 0..=total {
            let dev = Arc::new(FaultDevice::new(base.clone()));
            let (store, _) = Store::open(dev.clone()).unwrap();
            dev.fail_after(n);
            let closed = store.close().is_ok();
            for mode in MODES {
                let ctx = format!("seed {seed}, close failing at I/O {n} of {total}, {mode:?}");
                let img = dev.crash_image(mode);
                let (_, report) = Store::open(MemDevice::from_image(img.clone()))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                if closed {
                    assert!(report.closed_cleanly, "{ctx}");
                }
                reopen_and_check(img, &model, &[], &ctx);
            }
        }
    }
}

/// Crashes at every I/O of the first writes after a clean close, with a
/// first entry of one sector and one of many: the close record is replaced
/// cleanly, and a torn first entry is a torn tail, not corruption.
#[test]
fn a_crash_in_the_first_commits_after_a_clean_close_is_never_taken_for_corruption() {
    let (base, before) = used_image(11);
    let closed = {
        let dev = Arc::new(FaultDevice::new(base));
        let (store, _) = Store::open(dev.clone()).unwrap();
        store.close().unwrap();
        dev.crash_image(CrashMode::DropUnsynced)
    };
    for big_first in [false, true] {
        let script = |store: &Store, model: &mut Model| -> Run {
            let mut t = store.begin();
            for _ in 0..if big_first { 300 } else { 1 } {
                t.allocate(1, None).unwrap();
            }
            let a = t.allocations().to_vec();
            match t.commit() {
                Ok(_) => model.apply(&a, &[]),
                Err(e) if is_device_failure(&e) => {
                    return Run {
                        uncertain: vec![(a, Vec::new())],
                        uncertain_records: Vec::new(),
                    }
                }
                Err(e) => panic!("commit: {e}"),
            }
            run_ops(
                store,
                &mut Xoshiro256PlusPlus::seed_from_u64(5),
                model,
                &mut Records::new(),
                40,
            )
        };
        let total = {
            let dev = Arc::new(FaultDevice::new(closed.clone()));
            let (store, _) = Store::open(dev.clone()).unwrap();
            let mut m = before.clone();
            assert!(script(&store, &mut m).uncertain.is_empty());
            let s = dev.stats();
            s.writes + s.syncs
        };
        for n in 0..=total.min(12) {
            let dev = Arc::new(FaultDevice::new(closed.clone()));
            let (store, _) = Store::open(dev.clone()).unwrap();
            dev.fail_after(n);
            let mut model = before.clone();
            let run = script(&store, &mut model);
            for mode in MODES {
                let ctx = format!("big first entry {big_first}, failure at I/O {n}, {mode:?}");
                reopen_and_check(dev.crash_image(mode), &model, &run.uncertain, &ctx);
            }
        }
    }
}

/// A checkpoint whose announcement is durable but whose slot write never
/// landed, then a later writer's commits: the journal shows the
/// announcement followed by entries, yet the slot was never written. That
/// is a crash, not a wiped slot.
#[test]
fn an_announced_checkpoint_lost_in_a_crash_and_later_commits_are_not_damage() {
    for n in 0..6 {
        let dev = Arc::new(FaultDevice::new(fresh_image()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        let mut model = Model::default();
        let mut t = store.begin();
        let e = t.allocate(4, None).unwrap();
        t.commit().unwrap();
        model.alloc(e);
        dev.fail_after(n);
        let done = store.checkpoint().is_ok();
        drop(store);
        let img = dev.crash_image(CrashMode::DropUnsynced);
        let ctx = format!("checkpoint failing after {n} I/O (completed: {done})");
        let (s2, d2, m) = reopen_and_check(img, &model, &[], &ctx);
        model = m;
        for len in [2, 3] {
            let mut t = s2.begin();
            let e = t.allocate(len, None).unwrap();
            t.commit().unwrap();
            model.alloc(e);
        }
        drop(s2);
        reopen_and_check(d2.crash_image(CrashMode::DropUnsynced), &model, &[], &ctx);
    }
}
