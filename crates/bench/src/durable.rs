//! The durable bench: a workload committed in transactions on a real
//! device (`blockalloc bench --device PATH`).
//!
//! Each round's allocation requests are split among `threads` threads; each
//! thread allocates `batch` objects per transaction and commits, so
//! concurrent commits share journal writes and syncs (group commit). With
//! `write_data`, each object's blocks are written (whole blocks, a fixed
//! pattern) before its transaction commits — the data-then-publish order of
//! a real object store — and the commit's `fdatasync` makes them durable
//! too. The round's frees follow, batched the same way. The run stops at the
//! first allocation that finds no space, or at a limit.
//!
//! Commit latency is the time `Txn::commit` takes, each one timed (a commit
//! costs at least a device sync, so the timer's tens of nanoseconds do not
//! matter). After the run, the store is dropped without a checkpoint — the
//! state a crash leaves — and reopened (recovery replays the journal), then
//! closed cleanly and reopened again; both reopen times are reported.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use blockalloc::{AllocError, Extent};
use blockalloc_store::device::{AlignedBuf, DirectIo, FileDevice};
use blockalloc_store::{Store, StoreError};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::runner::Limits;
use crate::workload::{Round, Workload, WorkloadSpec};

/// What to run.
#[derive(Clone, Debug)]
pub struct DurableConfig {
    /// The workload (its geometry comes from the device).
    pub workload: WorkloadSpec,
    /// Committing threads.
    pub threads: usize,
    /// Allocations (or frees) per transaction.
    pub batch: usize,
    /// Write each object's blocks before committing it.
    pub write_data: bool,
    /// Stop conditions.
    pub limits: Limits,
    /// `O_DIRECT` for the store's metadata.
    pub direct: DirectIo,
}

/// A failure of the durable bench.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// The device could not be opened.
    #[error("cannot open the device {path}: {source}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The workload frees objects of earlier rounds, which this bench does
    /// not track (it forgets each round's objects at the round's end).
    #[error("the durable bench runs workloads that free within rounds (seed, shift), not {0}")]
    Unsupported(crate::workload::WorkloadKind),
}

/// Latency summary in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CommitLatency {
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest.
    pub max_us: f64,
}

/// One reopen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Reopen {
    /// Wall time of `Store::open`, seconds.
    pub secs: f64,
    /// Journal entries replayed.
    pub entries_replayed: u64,
    /// Free extents in the checkpoint plus journal.
    pub free_extents: u64,
}

/// The result, one JSON Lines record.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DurableReport {
    /// Always `"durable"`.
    pub kind: &'static str,
    /// The device.
    pub device: String,
    /// Device capacity in bytes.
    pub capacity_bytes: u64,
    /// Block size in bytes.
    pub block_size: u64,
    /// Metadata bytes reserved at the start of the device.
    pub metadata_bytes: u64,
    /// Workload name.
    pub workload: String,
    /// Committing threads.
    pub threads: usize,
    /// Operations per transaction.
    pub batch: usize,
    /// Whether object data was written.
    pub write_data: bool,
    /// Rounds run.
    pub rounds: u64,
    /// Objects allocated.
    pub allocations: u64,
    /// Objects freed.
    pub frees: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Journal entries written (group commits and checkpoint announcements).
    pub journal_entries: u64,
    /// Device syncs.
    pub syncs: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Wall time of the run, seconds.
    pub secs: f64,
    /// Transactions committed per second.
    pub commits_per_sec: f64,
    /// Allocations committed per second.
    pub allocs_per_sec: f64,
    /// Allocations plus frees committed per second.
    pub ops_per_sec: f64,
    /// Object bytes written per second (0 without `write_data`).
    pub data_mib_per_sec: f64,
    /// Latency of `commit`.
    pub commit_latency: CommitLatency,
    /// `no_space`, `max_rounds`, `max_ops` or `time_limit`.
    pub stopped: &'static str,
    /// Used / capacity at the end (metadata included).
    pub utilization: f64,
    /// Objects live at the end.
    pub live_objects: u64,
    /// Reopen after dropping the store without a checkpoint (as after a
    /// crash): checkpoint plus journal replay.
    pub reopen_after_crash: Reopen,
    /// Reopen after a clean close (checkpoint only).
    pub reopen_after_close: Reopen,
}

impl DurableReport {
    /// The record as one line of JSON.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("the report serialises")
    }

    /// A few lines for people.
    pub fn render(&self) -> String {
        format!(
            "durable bench on {}: {} threads, {} ops/txn{}\n\
             {} allocations + {} frees in {} commits over {:.2} s ({} rounds, stopped: {})\n\
             {:.0} commits/s, {:.0} allocations/s, {:.0} ops/s{}\n\
             commit latency: mean {:.0} us, p50 {:.0} us, p99 {:.0} us, max {:.0} us\n\
             {} syncs ({:.2} commits per sync), {} journal entries, {} checkpoints\n\
             utilisation {:.4}, {} live objects\n\
             reopen after crash: {:.3} s ({} journal entries replayed, {} free extents)\n\
             reopen after clean close: {:.3} s",
            self.device,
            self.threads,
            self.batch,
            if self.write_data {
                ", writing data"
            } else {
                ""
            },
            self.allocations,
            self.frees,
            self.commits,
            self.secs,
            self.rounds,
            self.stopped,
            self.commits_per_sec,
            self.allocs_per_sec,
            self.ops_per_sec,
            if self.write_data {
                format!(", {:.1} MiB/s of object data", self.data_mib_per_sec)
            } else {
                String::new()
            },
            self.commit_latency.mean_us,
            self.commit_latency.p50_us,
            self.commit_latency.p99_us,
            self.commit_latency.max_us,
            self.syncs,
            self.commits as f64 / self.syncs.max(1) as f64,
            self.journal_entries,
            self.checkpoints,
            self.utilization,
            self.live_objects,
            self.reopen_after_crash.secs,
            self.reopen_after_crash.entries_replayed,
            self.reopen_after_crash.free_extents,
            self.reopen_after_close.secs,
        )
    }
}

fn open(path: &Path, direct: DirectIo) -> Result<(Store, Reopen), DurableError> {
    let dev = FileDevice::open(path, direct).map_err(|source| DurableError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let t = Instant::now();
    let (store, report) = Store::open(dev)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((
        store,
        Reopen {
            secs,
            entries_replayed: report.entries,
            free_extents: report.free_extents,
        },
    ))
}

/// Shared counters of one run.
struct Shared {
    no_space: AtomicBool,
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

impl Shared {
    fn commit(&self, txn: blockalloc_store::Txn<'_>) -> Result<(), StoreError> {
        let t = Instant::now();
        txn.commit()?;
        let ns = t.elapsed().as_nanos() as u64;
        let mut h = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        h.saturating_record(ns.max(1));
        Ok(())
    }
}

/// Allocates `objects` (ids and block counts) in transactions of `batch`.
/// Returns the extents got, by object.
fn alloc_part(
    store: &Store,
    shared: &Shared,
    objects: &[(u64, u64)],
    batch: usize,
    data: Option<&AlignedBuf>,
) -> Result<Vec<(u64, Extent)>, StoreError> {
    let bs = store.geometry().block_size();
    let mut out = Vec::with_capacity(objects.len());
    for chunk in objects.chunks(batch) {
        if shared.no_space.load(Ordering::Relaxed) {
            break;
        }
        let mut txn = store.begin();
        for &(obj, blocks) in chunk {
            match txn.allocate(blocks, None) {
                Ok(e) => {
                    if let Some(buf) = data {
                        let bytes = (e.len() * bs) as usize;
                        store
                            .device()
                            .write_at(e.start() * bs, &buf.as_slice()[..bytes])
                            .map_err(|err| StoreError::Io {
                                context: format!("while writing object data to {e}"),
                                source: err,
                            })?;
                        shared.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    }
                    out.push((obj, e));
                }
                Err(StoreError::Alloc(AllocError::NoSpace { .. })) => {
                    shared.no_space.store(true, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let n = txn.allocations().len() as u64;
        shared.commit(txn)?;
        shared.allocs.fetch_add(n, Ordering::Relaxed);
    }
    Ok(out)
}

fn free_part(
    store: &Store,
    shared: &Shared,
    extents: &[Extent],
    batch: usize,
) -> Result<(), StoreError> {
    for chunk in extents.chunks(batch) {
        let mut txn = store.begin();
        for &e in chunk {
            txn.free(e)?;
        }
        shared.commit(txn)?;
        shared
            .frees
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Runs the durable bench on the formatted device at `path`. `on_round` is
/// called after each round with (round, allocations so far, utilisation).
///
/// # Errors
/// When the device cannot be opened or the store fails;
/// [`DurableError::Unsupported`] for a workload whose frees cross rounds
/// (`fill-shift`, `aging`), before the device is touched.
pub fn run_durable(
    path: &Path,
    cfg: &DurableConfig,
    mut on_round: impl FnMut(u64, u64, f64),
) -> Result<DurableReport, DurableError> {
    let threads = cfg.threads.max(1);
    let batch = cfg.batch.max(1);
    if !cfg.workload.kind.frees_within_round() {
        return Err(DurableError::Unsupported(cfg.workload.kind));
    }
    let (store, _) = open(path, cfg.direct)?;
    let geo = store.geometry();
    let mut workload = Workload::new(cfg.workload, geo);
    let data = cfg.write_data.then(|| {
        let mut b = AlignedBuf::zeroed(crate::sizes::MAX_OBJECT_BYTES as usize + 4096);
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        b
    });
    let shared = Shared {
        no_space: AtomicBool::new(false),
        allocs: AtomicU64::new(0),
        frees: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        latency: Mutex::new(Histogram::new_with_bounds(1, 1 << 40, 3).expect("valid bounds")),
    };
    let stats0 = store.stats();
    let start = Instant::now();
    let mut round = Round::default();
    let mut rounds = 0;
    let mut live: u64 = 0;
    let stopped = loop {
        if shared.no_space.load(Ordering::Relaxed) {
            break "no_space";
        }
        if cfg.limits.max_rounds.is_some_and(|m| rounds >= m) {
            break "max_rounds";
        }
        let ops = shared.allocs.load(Ordering::Relaxed) + shared.frees.load(Ordering::Relaxed);
        if cfg.limits.max_ops.is_some_and(|m| ops >= m) {
            break "max_ops";
        }
        if cfg.limits.time_limit.is_some_and(|t| start.elapsed() >= t) {
            break "time_limit";
        }
        workload.next_round(&mut round);
        rounds += 1;
        let reqs: Vec<(u64, u64)> = round.allocs.iter().map(|a| (a.object, a.blocks)).collect();
        let per = reqs.len().div_ceil(threads).max(1);
        let got: Vec<(u64, Extent)> = std::thread::scope(|s| {
            let hs: Vec<_> = reqs
                .chunks(per)
                .map(|part| {
                    let (store, shared, data) = (&store, &shared, data.as_ref());
                    s.spawn(move || alloc_part(store, shared, part, batch, data))
                })
                .collect();
            let mut all = Vec::new();
            for h in hs {
                all.extend(h.join().expect("bench thread panicked")?);
            }
            Ok::<_, StoreError>(all)
        })?;
        live += got.len() as u64;
        if shared.no_space.load(Ordering::Relaxed) {
            break "no_space";
        }
        let first = round.allocs.first().map_or(0, |a| a.object);
        let mut by_obj: Vec<Option<Extent>> = vec![None; round.allocs.len()];
        for (obj, e) in got {
            by_obj[(obj - first) as usize] = Some(e);
        }
        let frees: Vec<Extent> = round
            .frees
            .iter()
            .filter_map(|&o| by_obj.get((o - first) as usize).copied().flatten())
            .collect();
        let per = frees.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let hs: Vec<_> = frees
                .chunks(per)
                .map(|part| {
                    let (store, shared) = (&store, &shared);
                    s.spawn(move || free_part(store, shared, part, batch))
                })
                .collect();
            for h in hs {
                h.join().expect("bench thread panicked")?;
            }
            Ok::<_, StoreError>(())
        })?;
        live -= frees.len() as u64;
        let st = store.status();
        on_round(
            rounds,
            shared.allocs.load(Ordering::Relaxed),
            st.space.utilization(),
        );
    };
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let stats = store.stats();
    let status = store.status();
    let device = store.device().describe();
    let h = shared
        .latency
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let us = |ns: u64| ns as f64 / 1000.0;
    let allocations = shared.allocs.load(Ordering::Relaxed);
    let frees = shared.frees.load(Ordering::Relaxed);
    let commits = stats.commits - stats0.commits;
    drop(store); // as a crash would: no final checkpoint
    let (store, reopen_after_crash) = open(path, cfg.direct)?;
    store.close()?;
    let (store, reopen_after_close) = open(path, cfg.direct)?;
    drop(store);
    Ok(DurableReport {
        kind: "durable",
        device,
        capacity_bytes: geo.capacity_bytes(),
        block_size: geo.block_size(),
        metadata_bytes: status.meta_blocks * geo.block_size(),
        workload: cfg.workload.kind.name().to_string(),
        threads,
        batch,
        write_data: cfg.write_data,
        rounds,
        allocations,
        frees,
        commits,
        journal_entries: stats.entries - stats0.entries,
        syncs: stats.syncs - stats0.syncs,
        checkpoints: stats.checkpoints - stats0.checkpoints,
        secs,
        commits_per_sec: commits as f64 / secs,
        allocs_per_sec: allocations as f64 / secs,
        ops_per_sec: (allocations + frees) as f64 / secs,
        data_mib_per_sec: shared.bytes.load(Ordering::Relaxed) as f64 / secs / (1 << 20) as f64,
        commit_latency: CommitLatency {
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        },
        stopped,
        utilization: status.space.utilization(),
        live_objects: live,
        reopen_after_crash,
        reopen_after_close,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadKind;
    use blockalloc_store::device::Preallocation;
    use blockalloc_store::FormatOptions;

    #[test]
    fn durable_bench_refuses_workloads_that_free_across_rounds() {
        // Its rounds forget their objects at the end; a free of an earlier
        // round's object must be refused up front, not dropped (or worse).
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        let dev =
            FileDevice::create(&p, 64 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
        Store::format(dev, FormatOptions::default()).unwrap();
        for kind in [WorkloadKind::FillShift, WorkloadKind::Aging] {
            let cfg = DurableConfig {
                workload: WorkloadSpec {
                    kind,
                    round_size: 20,
                    ..WorkloadSpec::default()
                },
                threads: 1,
                batch: 4,
                write_data: false,
                limits: Limits::default(),
                direct: DirectIo::Auto,
            };
            let e = run_durable(&p, &cfg, |_, _, _| {}).unwrap_err();
            assert!(
                matches!(e, DurableError::Unsupported(k) if k == kind),
                "{e}"
            );
            assert!(e.to_string().contains(kind.name()), "{e}");
        }
    }

    #[test]
    fn runs_to_no_space_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        let dev =
            FileDevice::create(&p, 64 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
        Store::format(dev, FormatOptions::default()).unwrap();
        let cfg = DurableConfig {
            workload: WorkloadSpec {
                round_size: 20,
                ..WorkloadSpec::default()
            },
            threads: 2,
            batch: 4,
            write_data: true,
            limits: Limits::default(),
            direct: DirectIo::Auto,
        };
        let mut rounds = 0;
        let r = run_durable(&p, &cfg, |_, _, _| rounds += 1).unwrap();
        assert_eq!(r.stopped, "no_space");
        assert!(r.utilization > 0.5, "{}", r.utilization);
        assert!(r.commits >= r.allocations / 4);
        assert!(r.data_mib_per_sec > 0.0);
        assert!(rounds > 0);
        assert!(r.render().contains("reopen after crash"));
        assert!(r.to_json_line().starts_with("{\"kind\":\"durable\""));
        assert_eq!(r.reopen_after_close.entries_replayed, 0);
        let e = run_durable(&dir.path().join("missing"), &cfg, |_, _, _| {}).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
