//! Process-level crash test: a child process runs random transactions on a
//! real file device from several threads and logs each one; the parent kills
//! it with SIGKILL at a random moment, reopens the device and checks that it
//! holds every transaction the child saw committed, nothing else, and that
//! each transaction in flight at the kill is all or nothing.
//!
//! The child is this test binary itself, run with `BLOCKALLOC_CRASH_CHILD`
//! set (the `crash_child` test does nothing otherwise). For each transaction
//! it logs `B ...` (begin, with its extents) and syncs the log *before*
//! committing, then `C` after `commit` returns. So a `B` without a `C` is a
//! commit that may or may not have become durable.
//!
//! CI runs 25 kills; `BLOCKALLOC_CRASH_ITERS=N` runs N times as many.
//!
//! SIGKILL does not lose data the kernel already holds, so this tests the
//! store's own crash points (between its writes, mid-group, mid-checkpoint);
//! power loss and torn writes are the fault-device suite's job (crash.rs).

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_store::device::{DirectIo, FileDevice, Preallocation};
use blockalloc_store::{check, FormatOptions, Store, StoreError};
use common::{matching_counts, Model};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const CHILD_ENV: &str = "BLOCKALLOC_CRASH_CHILD";
const THREADS: usize = 4;

fn fmt_extents(v: &[Extent]) -> String {
    v.iter()
        .map(|e| format!("{}+{}", e.start(), e.len()))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_extents(s: &str) -> Option<Vec<Extent>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',')
        .map(|p| {
            let (a, b) = p.split_once('+')?;
            Extent::new(a.parse().ok()?, b.parse().ok()?).ok()
        })
        .collect()
}

/// The child: random transactions until killed (or 60 s pass).
fn child_main(spec: &str) {
    let mut parts = spec.split('|');
    let device = PathBuf::from(parts.next().unwrap());
    let logs = PathBuf::from(parts.next().unwrap());
    let seed: u64 = parts.next().unwrap().parse().unwrap();
    let dev = FileDevice::open(&device, DirectIo::Auto).unwrap();
    let (store, _) = Store::open(dev).unwrap();
    let store = Arc::new(store);
    store.set_checkpoint_interval(4);
    // The objects that exist: every maximal allocated run, dealt out to the
    // threads round robin.
    let runs = Model::runs_of(&store);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            let mut mine: Vec<Extent> = runs.iter().skip(t).step_by(THREADS).copied().collect();
            let log_path = logs.join(format!("t{t}.log"));
            std::thread::spawn(move || {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed * 31 + t as u64);
                let mut log = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log_path)
                    .unwrap();
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(60) {
                    let mut txn = store.begin();
                    for _ in 0..rng.random_range(1..=3) {
                        match txn.allocate(rng.random_range(1..=64), None) {
                            Ok(_) | Err(StoreError::Alloc(_)) => {}
                            Err(e) => panic!("allocate: {e}"),
                        }
                    }
                    let mut frees = Vec::new();
                    for _ in 0..rng.random_range(0..=2) {
                        if mine.is_empty() {
                            break;
                        }
                        let e = mine.swap_remove(rng.random_range(0..mine.len()));
                        txn.free(e).unwrap();
                        frees.push(e);
                    }
                    let allocs = txn.allocations().to_vec();
                    writeln!(log, "B {} {}", fmt_extents(&allocs), fmt_extents(&frees)).unwrap();
                    log.sync_data().unwrap();
                    txn.commit().unwrap();
                    writeln!(log, "C").unwrap();
                    log.sync_data().unwrap();
                    mine.extend(allocs);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn crash_child() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_main(&spec);
    }
}

type Txns = Vec<(Vec<Extent>, Vec<Extent>)>;

/// Reads one thread's log: committed transactions and the one in flight.
fn read_log(path: &Path) -> (Txns, Txns) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut committed = Vec::new();
    let mut open: Option<(Vec<Extent>, Vec<Extent>)> = None;
    for line in text.split_inclusive('\n') {
        let Some(line) = line.strip_suffix('\n') else {
            break; // a partial last line: its write never finished
        };
        if line == "C" {
            committed.push(open.take().expect("C follows B"));
        } else if let Some(rest) = line.strip_prefix("B ") {
            let (a, f) = rest.split_once(' ').unwrap_or((rest, ""));
            open = Some((parse_extents(a).unwrap(), parse_extents(f).unwrap()));
        }
    }
    (committed, open.into_iter().collect())
}

#[test]
fn sigkill_at_random_moments_loses_no_committed_transaction() {
    let iters = std::env::var("BLOCKALLOC_CRASH_ITERS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1)
        * 25;
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let dev =
        FileDevice::create(&device, 32 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
    Store::format(
        dev,
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(12345);
    let mut committed_total = 0;
    let mut uncertain_total = 0;
    for i in 0..iters {
        // The state before this child.
        let (store, _) = Store::open(FileDevice::open(&device, DirectIo::Auto).unwrap()).unwrap();
        let initial = Model::runs_of(&store);
        if rng.random_bool(0.3) {
            store.close().unwrap();
        } else {
            drop(store);
        }
        let logs = dir.path().join(format!("logs{i}"));
        std::fs::create_dir(&logs).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(
                CHILD_ENV,
                format!("{}|{}|{i}", device.display(), logs.display()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(30..400)));
        let finished_early = child.try_wait().unwrap();
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        if let Some(s) = finished_early {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("iteration {i}: the child exited by itself ({s}): {err}");
        }
        assert!(!status.success());
        // What the child saw.
        let (mut plus, mut minus, mut uncertain) = (initial, Vec::new(), Vec::new());
        let mut txns = 0;
        for t in 0..THREADS {
            let (c, u) = read_log(&logs.join(format!("t{t}.log")));
            for (a, f) in &c {
                plus.extend_from_slice(a);
                minus.extend_from_slice(f);
            }
            txns += c.len();
            uncertain.extend(u);
        }
        committed_total += txns;
        uncertain_total += uncertain.len();
        let ctx = format!(
            "iteration {i} ({txns} committed, {} in flight)",
            uncertain.len()
        );
        let dev = FileDevice::open(&device, DirectIo::Auto).unwrap();
        let report = check(&dev).unwrap_or_else(|e| panic!("{ctx}: check: {e}"));
        assert!(report.is_consistent(), "{ctx}: {:?}", report.problems);
        let (store, _) = Store::open(dev).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        store.verify().unwrap();
        matching_counts(&store, &plus, &minus, &uncertain).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    }
    assert!(committed_total > 0, "the children committed nothing");
    eprintln!(
        "{iters} kills, {committed_total} committed transactions, {uncertain_total} in flight"
    );
}

#[test]
fn log_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l");
    let mut f = File::create(&p).unwrap();
    write!(f, "B 1+2,5+1 \nC\nB 9+1 3+4\nC\nB 20+2 \nC\nB 30+1 ").unwrap();
    let (c, u) = read_log(&p);
    assert_eq!(c.len(), 3);
    assert_eq!(c[1].1, vec![Extent::new(3, 4).unwrap()]);
    assert!(u.is_empty(), "a partial line is ignored");
}
