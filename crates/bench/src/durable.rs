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
//! first allocation that finds no space, or at a limit. Limits are checked
//! before every transaction, not only between rounds: one round of a large
//! workload can take many seconds, and `--time-limit` must hold within
//! about one commit.
//!
//! Commit latency is the time `Txn::commit` takes, each one timed (a commit
//! costs at least a device sync, so the timer's tens of nanoseconds do not
//! matter). After the run, the store is dropped without a checkpoint — the
//! state a crash leaves — and reopened (recovery replays the journal), then
//! closed cleanly and reopened again; both reopen times are reported.
//! Finally every object the run left allocated is freed, in large
//! transactions, so that the device is as the run found it — unless
//! [`DurableConfig::keep`] asks to leave them for `inspect`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use blockalloc::{AllocError, ErrorClass, Extent};
use blockalloc_store::device::{AlignedBuf, DeviceBusy, DirectIo, FileDevice, IO_ALIGN};
use blockalloc_store::{Store, StoreError};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::config::Limits;
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
    /// Leave the run's objects allocated at the end (else they are freed).
    pub keep: bool,
}

impl Default for DurableConfig {
    /// The seed workload on one thread, one operation per transaction, no
    /// object data, no limits, `O_DIRECT` where supported, the run's
    /// objects freed at the end.
    fn default() -> Self {
        DurableConfig {
            workload: WorkloadSpec::default(),
            threads: 1,
            batch: 1,
            write_data: false,
            limits: Limits::default(),
            direct: DirectIo::Auto,
            keep: false,
        }
    }
}

/// Where a run is, for progress displays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DurableProgress {
    /// The round under way (from 1).
    pub round: u64,
    /// Allocations committed so far.
    pub allocations: u64,
    /// Frees committed so far.
    pub frees: u64,
    /// Used / capacity now (metadata included).
    pub utilization: f64,
    /// Time since the workload started.
    pub elapsed: Duration,
    /// True once per round, when the round is done; false for the updates
    /// in between (a few per second).
    pub round_finished: bool,
}

/// A failure of the durable bench.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// The device could not be opened.
    #[error("{source}")]
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
    /// A batch of zero operations per transaction.
    #[error("the batch must be at least 1 (allocations or frees per transaction)")]
    ZeroBatch,
    /// Object data cannot be written in blocks this small.
    #[error(
        "cannot write object data in blocks of {block_size} bytes: device I/O is in units of \
         {IO_ALIGN} bytes, so objects would share them (run without writing data, or format \
         with blocks of {IO_ALIGN} bytes or more)"
    )]
    BlocksTooSmall {
        /// The store's block size.
        block_size: u64,
    },
}

impl DurableError {
    /// What kind of failure this is: that of the device or the store, or
    /// [`ErrorClass::InvalidInput`] for blocks too small for object data.
    pub fn class(&self) -> ErrorClass {
        match self {
            DurableError::Open { source, .. } => DeviceBusy::class_of_io(source),
            DurableError::Store(e) => e.class(),
            DurableError::ZeroBatch | DurableError::BlocksTooSmall { .. } => {
                ErrorClass::InvalidInput
            }
        }
    }
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
    /// Objects live at the end of the workload.
    pub live_objects: u64,
    /// True when the run's objects were left allocated (`keep`).
    pub kept: bool,
    /// Objects freed after the run to leave the device as it was found (0
    /// when kept).
    pub freed_at_end: u64,
    /// Wall time of that clean-up, seconds.
    pub cleanup_secs: f64,
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
             commit latency: mean {}, p50 {}, p99 {}, max {}\n\
             {} syncs ({:.2} commits per sync), {} journal entries, {} checkpoints\n\
             utilisation {:.4}, {} live objects\n\
             reopen after crash: {:.3} s ({} journal entries replayed, {} free extents)\n\
             reopen after clean close: {:.3} s\n\
             {}",
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
            crate::units::micros(self.commit_latency.mean_us),
            crate::units::micros(self.commit_latency.p50_us),
            crate::units::micros(self.commit_latency.p99_us),
            crate::units::micros(self.commit_latency.max_us),
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
            if self.kept {
                format!(
                    "kept the run's {} objects allocated (--keep); format again to reuse the space",
                    self.live_objects
                )
            } else {
                format!(
                    "freed the run's {} remaining objects in {:.3} s (--keep leaves them)",
                    self.freed_at_end, self.cleanup_secs
                )
            },
        )
    }
}

fn open(path: &Path, direct: DirectIo) -> Result<(Store, Reopen), DurableError> {
    let dev = FileDevice::open(path, direct).map_err(|source| {
        // Another writer: the store's own error, which names the holder.
        if DeviceBusy::from_io(&source).is_some() {
            DurableError::Store(StoreError::from_open(path, source))
        } else {
            DurableError::Open {
                path: path.to_path_buf(),
                source,
            }
        }
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

/// Why the workload stopped early, first reason wins; `RUNNING` until then.
const RUNNING: u8 = 0;
const NO_SPACE: u8 = 1;
const TIME_LIMIT: u8 = 2;
const MAX_OPS: u8 = 3;

/// Shared counters of one run.
struct Shared {
    stop: AtomicU8,
    deadline: Option<Instant>,
    max_ops: Option<u64>,
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

impl Shared {
    fn set_stop(&self, why: u8) {
        let _ = self
            .stop
            .compare_exchange(RUNNING, why, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// True when no further transaction may start: checked before each one,
    /// so a limit holds within one commit even when a round is long.
    fn stopped(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) != RUNNING {
            return true;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.set_stop(TIME_LIMIT);
            return true;
        }
        let ops = self.allocs.load(Ordering::Relaxed) + self.frees.load(Ordering::Relaxed);
        if self.max_ops.is_some_and(|m| ops >= m) {
            self.set_stop(MAX_OPS);
            return true;
        }
        false
    }

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
        if shared.stopped() {
            break;
        }
        let mut txn = store.begin();
        let lens: Vec<u64> = chunk.iter().map(|&(_, blocks)| blocks).collect();
        let mut extents = Vec::with_capacity(chunk.len());
        match txn.allocate_each(&lens, None, &mut extents) {
            Ok(()) => {}
            Err(StoreError::Alloc(AllocError::NoSpace { .. })) => shared.set_stop(NO_SPACE),
            Err(e) => return Err(e),
        }
        let mut got = Vec::with_capacity(extents.len());
        for (&(obj, _), e) in chunk.iter().zip(extents) {
            if let Some(buf) = data {
                write_object(store, e, buf)?;
                shared.bytes.fetch_add(e.len() * bs, Ordering::Relaxed);
            }
            got.push((obj, e));
        }
        shared.commit(txn)?;
        shared.allocs.fetch_add(got.len() as u64, Ordering::Relaxed);
        out.extend(got);
    }
    Ok(out)
}

/// Writes the pattern in `buf` over every block of `e`, in pieces of at
/// most `buf.len()` bytes, a multiple of [`IO_ALIGN`] (`--sizes` may ask for
/// objects larger than the buffer, and blocks may be larger too).
fn write_object(store: &Store, e: Extent, buf: &AlignedBuf) -> Result<(), StoreError> {
    let bs = store.geometry().block_size();
    let (mut at, end) = (e.start() * bs, e.end() * bs);
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        store
            .device()
            .write_at(at, &buf.as_slice()[..n])
            .map_err(|err| StoreError::Io {
                context: format!("while writing object data to {e}"),
                source: err,
            })?;
        at += n as u64;
    }
    Ok(())
}

/// Frees `objects` in transactions of `batch`, while the run is not
/// stopped. Returns how many (a prefix of `objects`) were freed.
fn free_part(
    store: &Store,
    shared: &Shared,
    objects: &[(u64, Extent)],
    batch: usize,
) -> Result<usize, StoreError> {
    let mut done = 0;
    for chunk in objects.chunks(batch) {
        if shared.stopped() {
            break;
        }
        let mut txn = store.begin();
        let extents: Vec<Extent> = chunk.iter().map(|&(_, e)| e).collect();
        txn.free_each(&extents)?;
        shared.commit(txn)?;
        shared
            .frees
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        done += chunk.len();
    }
    Ok(done)
}

/// Frees every extent in transactions as large as the journal takes:
/// starting at 4096 frees, halving when a transaction is too large.
fn free_all(store: &Store, extents: &[Extent]) -> Result<(), StoreError> {
    let mut batch = 4096;
    let mut rest = extents;
    while !rest.is_empty() {
        let n = batch.min(rest.len());
        let mut txn = store.begin();
        txn.free_each(&rest[..n])?;
        match txn.commit() {
            Ok(_) => rest = &rest[n..],
            Err(StoreError::TxnTooLarge { .. }) if batch > 1 => batch /= 2,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// How often progress is reported while a round runs.
const TICK: Duration = Duration::from_millis(200);

/// Runs one phase of a round on up to `threads` threads, one part each,
/// calling `tick` every [`TICK`] until all are done.
fn run_parts<T: Sync, R: Send>(
    parts: &[T],
    threads: usize,
    work: impl Fn(&[T]) -> Result<R, StoreError> + Sync,
    mut tick: impl FnMut(),
) -> Result<Vec<R>, StoreError> {
    let per = parts.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<()>();
        let hs: Vec<_> = parts
            .chunks(per)
            .map(|part| {
                let (work, tx) = (&work, tx.clone());
                s.spawn(move || {
                    let r = work(part);
                    drop(tx);
                    r
                })
            })
            .collect();
        drop(tx);
        // Every sender is dropped when its thread ends: then `recv` fails.
        while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TICK) {
            tick();
        }
        let mut out = Vec::with_capacity(hs.len());
        for h in hs {
            out.push(h.join().expect("bench thread panicked")?);
        }
        Ok(out)
    })
}

/// Runs the durable bench on the formatted device at `path`. `on_progress`
/// is called a few times per second while a round runs, and once at the
/// end of each round.
///
/// # Errors
/// When the device cannot be opened, its blocks are too small for object
/// data, or the store fails.
pub fn run_durable(
    path: &Path,
    cfg: &DurableConfig,
    mut on_progress: impl FnMut(&DurableProgress),
) -> Result<DurableReport, DurableError> {
    if cfg.batch == 0 {
        return Err(DurableError::ZeroBatch);
    }
    let threads = cfg.threads.max(1);
    let batch = cfg.batch;
    let (store, _) = open(path, cfg.direct)?;
    let geo = store.geometry();
    let bs = geo.block_size();
    if cfg.write_data && bs < IO_ALIGN as u64 {
        return Err(DurableError::BlocksTooSmall { block_size: bs });
    }
    let mut workload = Workload::new(cfg.workload, geo);
    let data = cfg.write_data.then(|| {
        // A multiple of the I/O unit; larger objects are written in pieces.
        let mut b = AlignedBuf::zeroed(crate::sizes::MAX_OBJECT_BYTES as usize);
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        b
    });
    let start = Instant::now();
    let shared = Shared {
        stop: AtomicU8::new(RUNNING),
        deadline: cfg.limits.time_limit.map(|t| start + t),
        max_ops: cfg.limits.max_ops,
        allocs: AtomicU64::new(0),
        frees: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        latency: Mutex::new(Histogram::new_with_bounds(1, 1 << 40, 3).expect("valid bounds")),
    };
    let stats0 = store.stats();
    let mut round = Round::default();
    let mut rounds = 0;
    // Every object the run holds, so that frees of earlier rounds' objects
    // find their extents and the clean-up finds them all.
    let mut live: HashMap<u64, Extent> = HashMap::new();
    let progress = |round: u64, round_finished: bool| DurableProgress {
        round,
        allocations: shared.allocs.load(Ordering::Relaxed),
        frees: shared.frees.load(Ordering::Relaxed),
        utilization: store.status().space.utilization(),
        elapsed: start.elapsed(),
        round_finished,
    };
    let stopped = loop {
        if cfg.limits.max_rounds.is_some_and(|m| rounds >= m) {
            break "max_rounds";
        }
        if shared.stopped() {
            break stop_name(&shared);
        }
        if !workload.next_round(&mut round) {
            break "end_of_workload";
        }
        rounds += 1;
        let reqs: Vec<(u64, u64)> = round.allocs.iter().map(|a| (a.object, a.blocks)).collect();
        let got = run_parts(
            &reqs,
            threads,
            |part| alloc_part(&store, &shared, part, batch, data.as_ref()),
            || on_progress(&progress(rounds, false)),
        )?;
        live.extend(got.into_iter().flatten());
        if shared.stopped() {
            break stop_name(&shared);
        }
        let frees: Vec<(u64, Extent)> = round
            .frees
            .iter()
            .filter_map(|o| live.get(o).map(|&e| (*o, e)))
            .collect();
        let per = frees.len().div_ceil(threads).max(1);
        let done = run_parts(
            &frees,
            threads,
            |part| free_part(&store, &shared, part, batch),
            || on_progress(&progress(rounds, false)),
        )?;
        for (part, n) in frees.chunks(per).zip(done) {
            for (o, _) in &part[..n] {
                live.remove(o);
            }
        }
        on_progress(&progress(rounds, true));
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
    let t = Instant::now();
    let freed_at_end = if cfg.keep {
        0
    } else {
        let mut extents: Vec<Extent> = live.values().copied().collect();
        extents.sort_unstable_by_key(|e| e.start());
        free_all(&store, &extents)?;
        extents.len() as u64
    };
    store.close()?;
    let cleanup_secs = t.elapsed().as_secs_f64();
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
        live_objects: live.len() as u64,
        kept: cfg.keep,
        freed_at_end,
        cleanup_secs,
        reopen_after_crash,
        reopen_after_close,
    })
}

fn stop_name(shared: &Shared) -> &'static str {
    match shared.stop.load(Ordering::Relaxed) {
        NO_SPACE => "no_space",
        TIME_LIMIT => "time_limit",
        MAX_OPS => "max_ops",
        _ => unreachable!("stop_name is called once the run has stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadKind;
    use blockalloc_store::device::Preallocation;
    use blockalloc_store::FormatOptions;

    #[test]
    fn workloads_whose_frees_cross_rounds_run_and_clean_up() {
        for kind in [WorkloadKind::FillShift, WorkloadKind::Aging] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("dev");
            let dev =
                FileDevice::create(&p, 64 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
            Store::format(dev, FormatOptions::default()).unwrap();
            let cfg = DurableConfig {
                workload: WorkloadSpec {
                    kind,
                    round_size: 20,
                    ..WorkloadSpec::default()
                },
                batch: 4,
                ..DurableConfig::default()
            };
            let r = run_durable(&p, &cfg, |_| {}).unwrap();
            assert_eq!(r.stopped, "no_space", "{kind:?}");
            assert!(r.frees > 0, "{kind:?}");
            let (store, _) = Store::open(FileDevice::open(&p, DirectIo::Auto).unwrap()).unwrap();
            let st = store.status();
            assert_eq!(st.space.used_blocks, st.meta_blocks, "{kind:?}");
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
            ..DurableConfig::default()
        };
        let mut rounds = 0;
        let r = run_durable(&p, &cfg, |p| rounds += u64::from(p.round_finished)).unwrap();
        assert_eq!(r.stopped, "no_space");
        assert!(r.utilization > 0.5, "{}", r.utilization);
        assert!(r.commits >= r.allocations / 4);
        assert!(r.data_mib_per_sec > 0.0);
        assert!(rounds > 0);
        assert!(r.render().contains("reopen after crash"));
        assert!(r.to_json_line().starts_with("{\"kind\":\"durable\""));
        assert_eq!(r.reopen_after_close.entries_replayed, 0);
        let e = run_durable(&dir.path().join("missing"), &cfg, |_| {}).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    /// A formatted sparse file device of `len` bytes in `blocks`-byte blocks.
    fn device(dir: &Path, len: u64, block_size: u64) -> PathBuf {
        let p = dir.join("dev");
        let prealloc = Preallocation {
            allocate: false,
            zero: blockalloc_store::device::ZeroMode::None,
        };
        let dev = FileDevice::create(&p, len, prealloc, DirectIo::Auto).unwrap();
        Store::format(
            dev,
            FormatOptions {
                block_size,
                ..FormatOptions::default()
            },
        )
        .unwrap();
        p
    }

    fn used_blocks(p: &Path) -> (u64, u64) {
        let (store, _) = open(p, DirectIo::Auto).unwrap();
        let st = store.status();
        (st.space.used_blocks, st.meta_blocks)
    }

    #[test]
    fn bench_frees_what_it_allocated_unless_keep() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 64 << 20, 4096);
        // Something allocated before the run stays allocated after it.
        let (store, _) = open(&p, DirectIo::Auto).unwrap();
        let mut txn = store.begin();
        let before = txn.allocate(10, None).unwrap();
        txn.commit().unwrap();
        store.close().unwrap();
        let mut cfg = DurableConfig {
            workload: WorkloadSpec {
                round_size: 50,
                ..WorkloadSpec::default()
            },
            threads: 2,
            batch: 4,
            ..DurableConfig::default()
        };
        let r = run_durable(&p, &cfg, |_| {}).unwrap();
        assert_eq!(r.stopped, "no_space");
        assert!(r.utilization > 0.5, "{}", r.utilization);
        assert!(!r.kept);
        assert_eq!(r.freed_at_end, r.live_objects);
        assert!(r.render().contains("--keep leaves them"), "{}", r.render());
        let (used, meta) = used_blocks(&p);
        assert_eq!(used, meta + before.len());
        cfg.keep = true;
        let r = run_durable(&p, &cfg, |_| {}).unwrap();
        assert!(r.kept);
        assert_eq!(r.freed_at_end, 0);
        assert!(r.render().contains("kept the run's"), "{}", r.render());
        let (used, meta) = used_blocks(&p);
        assert!(used > meta + before.len() + 1000, "{used}");
    }

    #[test]
    fn time_limit_holds_within_a_long_round() {
        let dir = tempfile::tempdir().unwrap();
        // One round of a million one-block objects takes many seconds of
        // commits, even where a sync costs nothing.
        let p = device(dir.path(), 16 << 30, 4096);
        let cfg = DurableConfig {
            workload: WorkloadSpec {
                round_size: 1_000_000,
                sizes: crate::sizes::SizeSpec::Fixed(4096),
                ..WorkloadSpec::default()
            },
            threads: 2,
            batch: 16,
            limits: Limits {
                time_limit: Some(Duration::from_secs(1)),
                ..Limits::default()
            },
            ..DurableConfig::default()
        };
        let t = Instant::now();
        let mut ticks = 0;
        let r = run_durable(&p, &cfg, |p| ticks += u64::from(!p.round_finished)).unwrap();
        let wall = t.elapsed().as_secs_f64();
        assert_eq!(r.stopped, "time_limit");
        assert_eq!(r.rounds, 1);
        assert!(r.allocations < 1_000_000, "{}", r.allocations);
        assert!(
            r.secs < 1.0 + 0.5,
            "the limit holds within a commit: {}",
            r.secs
        );
        assert!(wall < 1.0 + 2.0, "reopens and clean-up are short: {wall}");
        assert!(ticks >= 1, "progress while the round runs");
        let (used, meta) = used_blocks(&p);
        assert_eq!(used, meta, "every object of the cut round was freed");
    }

    #[test]
    fn frees_of_earlier_rounds_find_their_objects() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 64 << 20, 4096);
        // fill-shift's deletion round frees objects of every earlier round.
        let cfg = DurableConfig {
            workload: WorkloadSpec {
                kind: crate::workload::WorkloadKind::FillShift,
                round_size: 8,
                ..WorkloadSpec::default()
            },
            threads: 2,
            batch: 4,
            keep: true,
            ..DurableConfig::default()
        };
        let mut w = Workload::new(cfg.workload, used_geometry(&p));
        let mut round = Round::default();
        let mut earlier_frees = 0;
        for _ in 0..200 {
            w.next_round(&mut round);
            let first = round.allocs.first().map_or(u64::MAX, |a| a.object);
            earlier_frees += round.frees.iter().filter(|&&o| o < first).count();
        }
        assert!(earlier_frees > 0, "the workload frees earlier objects");
        let r = run_durable(&p, &cfg, |_| {}).unwrap();
        assert!(
            r.frees > r.allocations / 4,
            "{} of {}",
            r.frees,
            r.allocations
        );
        assert_eq!(
            r.live_objects,
            r.allocations - r.frees,
            "every free found its object"
        );
    }

    fn used_geometry(p: &Path) -> blockalloc::Geometry {
        open(p, DirectIo::Auto).unwrap().0.geometry()
    }

    #[test]
    fn data_writes_in_blocks_below_4k_are_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 64 << 20, 512);
        let mut cfg = DurableConfig {
            workload: WorkloadSpec {
                round_size: 20,
                ..WorkloadSpec::default()
            },
            batch: 4,
            write_data: true,
            ..DurableConfig::default()
        };
        let e = run_durable(&p, &cfg, |_| {}).unwrap_err();
        assert!(
            matches!(e, DurableError::BlocksTooSmall { block_size: 512 }),
            "{e}"
        );
        assert!(e.to_string().contains("4096"), "{e}");
        let (used, meta) = used_blocks(&p);
        assert_eq!(used, meta, "nothing was allocated");
        // Without data the store's own I/O works in 512-byte blocks.
        cfg.write_data = false;
        let r = run_durable(&p, &cfg, |_| {}).unwrap();
        assert_eq!(r.block_size, 512);
        assert_eq!(r.stopped, "no_space");
    }

    #[test]
    fn a_zero_batch_is_refused_before_the_device_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let cfg = DurableConfig {
            batch: 0,
            ..DurableConfig::default()
        };
        let e = run_durable(&missing, &cfg, |_| {}).unwrap_err();
        assert!(matches!(e, DurableError::ZeroBatch), "{e}");
        assert_eq!(e.class(), ErrorClass::InvalidInput);
    }

    #[test]
    fn a_device_held_by_another_writer_is_the_stores_busy_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 64 << 20, 4096);
        let (_holder, _) = Store::open(FileDevice::open(&p, DirectIo::Off).unwrap()).unwrap();
        let e = run_durable(&p, &DurableConfig::default(), |_| {}).unwrap_err();
        assert!(
            matches!(e, DurableError::Store(StoreError::Busy { .. })),
            "{e}"
        );
        assert_eq!(e.class(), ErrorClass::Busy);
        assert!(e.to_string().contains("in use by another writer"), "{e}");
    }

    #[test]
    fn objects_larger_than_the_data_buffer_are_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 64 << 20, 4096);
        let cfg = DurableConfig {
            workload: WorkloadSpec {
                round_size: 2,
                sizes: crate::sizes::SizeSpec::Fixed(6 << 20),
                ..WorkloadSpec::default()
            },
            write_data: true,
            limits: Limits {
                max_rounds: Some(1),
                ..Limits::default()
            },
            direct: DirectIo::Off,
            keep: true,
            ..DurableConfig::default()
        };
        let r = run_durable(&p, &cfg, |_| {}).unwrap();
        assert_eq!(r.allocations, 2);
        let dev = FileDevice::open(&p, DirectIo::Off).unwrap();
        let (store, _) = Store::open(dev).unwrap();
        let meta = store.status().meta_blocks;
        drop(store);
        // The last 4 KiB of the first object carry the pattern, not zeros.
        let bytes = std::fs::read(&p).unwrap();
        let end = ((meta << 12) + (6 << 20)) as usize;
        assert!(bytes[end - 4096..end].iter().any(|&b| b != 0));
    }
}
