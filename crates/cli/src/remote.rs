//! `blockalloc bench --remote ADDR`: a bench workload (`--workload`, any of
//! the registry) against an allocation server, per call (`--lease off`) or
//! through leases (`--lease auto|SIZE`), from `--clients` connections at
//! once.
//!
//! Each client runs its own copy of the workload as `bench --threads` runs
//! one per thread (`WorkloadSpec::for_worker`: seed + client index, rounds
//! of round-size / clients requests, and for the workloads whose phases end
//! at fill levels 1 / clients of the device), frees the objects each round
//! names (this round's, or earlier rounds' for the workloads whose frees
//! cross rounds), and stops at the first failure of any client, at a limit,
//! or when every client's stream has ended (`end_of_workload`). Every call is timed on its own
//! with an `Instant::now()` pair, and the pair's own cost, calibrated at
//! start-up as for a local run (`timer_overhead_ns`), is subtracted from
//! each sample (it matters only for local, leased allocations, which take
//! about as long as the timer). Leased allocations become durable at
//! the commit that ends each round, or with `--commit-every N` at a commit
//! after every N of them; the commits' time is reported apart and also
//! spread over the allocations ("with commit"), and each commit call is
//! timed (`commit_ns`).
//!
//! Per call, `--count N` batches: a client takes the workload's next N
//! requests and sends one `Allocate` per distinct size among them (the call
//! asks for `count` objects of one size), so the request stream, and with
//! it the sizes asked for, is the same for every N; a fixed size makes it
//! one call per N objects. An object's cost is its call's time divided by
//! the objects the call returned. A batch refused for lack of space is
//! retried one object at a time, so a run still stops at the first single
//! allocation the server cannot serve, whatever N.
//!
//! `--reference ENGINE` replays the clients' requests, in the order they
//! made them, through one in-process engine over the server's device, its
//! metadata area set aside ([`blockalloc_bench::replay_interleaved`]): the
//! engine on the same workload, whose utilisation at the first failure
//! each record carries beside the server's, and whether it refused the
//! very request the server refused.
//!
//! `--max-ops` is one budget for the whole run: every allocation and every
//! free takes one operation from a counter all clients share before it is
//! sent, so the run makes exactly that many (unless it stops earlier), as a
//! local run does.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use blockalloc::{ByteSize, Extent, Geometry};
use blockalloc_bench::{
    replay_interleaved, units, After, BenchEngine, Interleave, Interleaved, Round,
    TimerCalibration, Workload, WorkloadSpec,
};
use blockalloc_client::{
    Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator, NoSpaceDetails, QuotaDetails,
};

use crate::bench::BenchSettings;
use crate::error::UsageError;
use crate::flags::BenchArgs;

/// The most objects one `Allocate` may ask for: the server's default batch
/// limit (`max_batch`).
const MAX_COUNT: u32 = 4096;

/// How clients allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseMode {
    /// Every allocation is an `Allocate` call.
    Off,
    /// Leases sized by the server.
    Auto,
    /// Leases of this many bytes.
    Size(u64),
}

impl LeaseMode {
    fn parse(s: &str) -> Result<LeaseMode, UsageError> {
        match s {
            "off" => Ok(LeaseMode::Off),
            "auto" => Ok(LeaseMode::Auto),
            size => match size.parse::<ByteSize>() {
                Ok(b) if b.bytes() > 0 => Ok(LeaseMode::Size(b.bytes())),
                _ => Err(UsageError::new(format!(
                    "--lease {s:?}: expected off, auto or a size such as 64MiB"
                ))),
            },
        }
    }

    fn name(self) -> String {
        match self {
            LeaseMode::Off => "off".into(),
            LeaseMode::Auto => "auto".into(),
            LeaseMode::Size(b) => ByteSize(b).to_string(),
        }
    }

    /// [`name`](Self::name) for people: a size as every command prints one.
    fn label(self) -> String {
        match self {
            LeaseMode::Size(b) => units::bytes(b),
            _ => self.name(),
        }
    }
}

/// `--clients` and `--count`, checked against each other and `--lease`.
fn check_flags(a: &BenchArgs, mode: LeaseMode) -> Result<(), UsageError> {
    if a.clients == 0 || a.clients > 1024 {
        return Err(UsageError::new("--clients must be from 1 to 1024"));
    }
    if a.count == 0 || a.count > MAX_COUNT {
        return Err(UsageError::new(format!(
            "--count {} must be from 1 to {MAX_COUNT} (the server's batch limit)",
            a.count
        )));
    }
    if a.count > 1 && mode != LeaseMode::Off {
        return Err(UsageError::new(format!(
            "--count {} batches per-call Allocate calls; add --lease off (a leasing client \
             allocates locally, one object at a time)",
            a.count
        )));
    }
    match a.commit_every {
        Some(0) => Err(UsageError::new("--commit-every must be at least 1")),
        Some(n) if mode == LeaseMode::Off => Err(UsageError::new(format!(
            "--commit-every {n} commits leased allocations; with --lease off every \
             allocation is durable when its call returns"
        ))),
        _ => Ok(()),
    }
}

/// The run's operation budget (`--max-ops`), shared by every client.
struct OpBudget {
    /// Operations still allowed; `None` without a limit.
    left: Option<AtomicU64>,
}

impl OpBudget {
    fn new(max_ops: Option<u64>) -> OpBudget {
        OpBudget {
            left: max_ops.map(AtomicU64::new),
        }
    }

    /// Takes up to `n` operations; returns how many were granted (fewer
    /// than `n` only once the budget runs out).
    fn take(&self, n: u64) -> u64 {
        let Some(left) = &self.left else { return n };
        let before = left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(l - l.min(n)))
            .unwrap_or_else(|l| l);
        before.min(n)
    }

    /// True once every operation of a limited budget was taken.
    fn exhausted(&self) -> bool {
        self.left
            .as_ref()
            .is_some_and(|l| l.load(Ordering::Relaxed) == 0)
    }
}

/// One client's results.
#[derive(Default)]
struct ClientRun {
    /// The cost of an empty `Instant::now()` pair, subtracted from every
    /// sample.
    timer_ns: u64,
    /// Each allocated object's cost: its call's time divided by the objects
    /// the call returned (a local allocation's own time when leased).
    alloc_ns: Vec<u64>,
    /// Each successful per-call `Allocate`'s round trip.
    call_ns: Vec<u64>,
    alloc_time: Duration,
    /// The commits of allocations: every `--commit-every` allocations and
    /// at each round's end.
    commit_time: Duration,
    /// Each commit call's time (of allocations or of frees), when the call
    /// sent a `Commit`.
    commit_ns: Vec<u64>,
    frees: u64,
    rounds: u64,
    /// This client's copy of the workload ended.
    ended: bool,
    /// used / capacity when this client's allocation was the run's first
    /// to fail.
    util_at_failure: Option<f64>,
    /// The device's status then.
    status_at_failure: Option<blockalloc_client::DeviceStatus>,
    /// The quota this client's allocation went past when it was the run's
    /// first to fail for a quota (the device may have had room).
    quota_at_failure: Option<QuotaDetails>,
    leases: u64,
    commit_calls: u64,
    remote_fallbacks: u64,
    /// Per-call `Allocate` calls sent, refused ones included.
    allocate_calls: u64,
    /// Per-call `Free` calls sent.
    free_calls: u64,
    /// With `--reference`: when each allocation and free of this client's
    /// stream was made, in nanoseconds since the run began.
    op_ns: Vec<u64>,
    /// When this client's rounds ended (before it freed what was left).
    finished: Option<Instant>,
}

impl ClientRun {
    /// Files the time of a successful call that returned `objects`.
    fn record_call(&mut self, dt: Duration, objects: u32) {
        let (ns, dt) = self.net(dt);
        self.call_ns.push(ns);
        self.alloc_time += dt;
        let each = ns / u64::from(objects.max(1));
        self.alloc_ns
            .extend(std::iter::repeat_n(each, objects as usize));
    }

    /// With `--reference`, notes that `n` operations of the stream were
    /// made now.
    fn stamp(&mut self, plan: &RunPlan, n: usize) {
        if let Some(t0) = plan.record_from {
            let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.op_ns.extend(std::iter::repeat_n(ns, n));
        }
    }

    /// Commits what `l` holds uncommitted and times the call; `allocations`
    /// says whether it is a commit of allocations (counted in
    /// `commit_time`) or of frees.
    async fn commit(&mut self, l: &LeasingAllocator, allocations: bool) -> anyhow::Result<()> {
        let sent = l.stats().commit_calls;
        let t = Instant::now();
        l.commit().await?;
        let dt = t.elapsed();
        if allocations {
            self.commit_time += dt;
        }
        if l.stats().commit_calls > sent {
            self.commit_ns.push(self.net(dt).0);
        }
        Ok(())
    }

    /// Files a local (leased) allocation that took `dt`.
    fn record_local(&mut self, dt: Duration) {
        let (ns, dt) = self.net(dt);
        self.alloc_ns.push(ns);
        self.alloc_time += dt;
    }

    /// A sample without the timer's own cost (at least zero), in
    /// nanoseconds and as a duration.
    fn net(&self, dt: Duration) -> (u64, Duration) {
        let ns = u64::try_from(dt.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_sub(self.timer_ns);
        (ns, Duration::from_nanos(ns))
    }
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Sorted latencies and their summary.
struct Latency {
    sorted: Vec<u64>,
    total: Duration,
}

impl Latency {
    fn new(runs: &[ClientRun], of: fn(&ClientRun) -> &[u64], total: Duration) -> Latency {
        let mut sorted: Vec<u64> = runs.iter().flat_map(|r| of(r).iter().copied()).collect();
        sorted.sort_unstable();
        Latency { sorted, total }
    }

    fn count(&self) -> u64 {
        self.sorted.len() as u64
    }

    /// The total time over the samples: the mean cost even where samples
    /// were rounded down.
    fn mean(&self) -> f64 {
        per(self.total.as_secs_f64() * 1e9, self.count())
    }

    fn at(&self, q: f64) -> u64 {
        percentile(&self.sorted, q)
    }

    fn max(&self) -> u64 {
        self.sorted.last().copied().unwrap_or(0)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "mean": self.mean(),
            "p50": self.at(0.5),
            "p99": self.at(0.99),
            "p999": self.at(0.999),
            "max": self.max(),
        })
    }

    fn line(&self) -> String {
        let ns = |n: u64| units::nanos(n as f64);
        format!(
            "mean {}  p50 {}  p99 {}  p99.9 {}  max {}",
            units::nanos(self.mean()),
            ns(self.at(0.5)),
            ns(self.at(0.99)),
            ns(self.at(0.999)),
            ns(self.max())
        )
    }
}

/// `x / n`, 0 when `n` is 0.
fn per(x: f64, n: u64) -> f64 {
    if n > 0 {
        x / n as f64
    } else {
        0.0
    }
}

/// What every client of a run shares.
struct RunPlan {
    mode: LeaseMode,
    count: u32,
    /// Every client's workload, before [`WorkloadSpec::for_worker`].
    workload: WorkloadSpec,
    clients: u32,
    /// The device.
    geometry: Geometry,
    limits: blockalloc_bench::Limits,
    block_size: u64,
    budget: OpBudget,
    stop: AtomicBool,
    /// The calibrated cost of an empty `Instant::now()` pair.
    timer_ns: u64,
    /// With `--reference`: the run's start, from which every client times
    /// its operations.
    record_from: Option<Instant>,
    /// `--commit-every`: leased allocations between commits within a round.
    commit_every: Option<u32>,
    /// `--keep`: leave the run's objects allocated at the end.
    keep: bool,
    /// Every client waits here after its rounds, before freeing its
    /// objects: an early client's frees would give the others room the run
    /// did not have, and show the device emptier at another's failure.
    rounds_done: tokio::sync::Barrier,
    /// Set by Ctrl-C (with `stop`).
    interrupted: AtomicBool,
}

/// Runs `bench --remote`.
///
/// # Errors
/// Usage errors; the server unreachable or refusing requests.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let addr = a.remote.clone().expect("called with --remote");
    let s = BenchSettings::from_args(a)?;
    let mode = LeaseMode::parse(&a.lease)?;
    // Bad TLS or token flags are usage errors before anything runs.
    a.connect.options()?;
    a.connect.token()?;
    check_flags(a, mode)?;
    let w = s.config.workload;
    let timer_ns = TimerCalibration::measure().pair_ns;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (runs, wall, util, at_failure, block_size, geometry, meta_blocks, interrupted) = rt
        .block_on(async {
            let probe = a.connect.connect(&addr).await?;
            let st = probe.status().await?;
            let dev = st
                .first()
                .ok_or_else(|| anyhow::anyhow!("the server serves no device"))?;
            let block_size = dev.block_size;
            let geometry = dev
                .capacity_blocks
                .checked_mul(block_size)
                .and_then(|bytes| Geometry::new(bytes, block_size).ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "the server reports an unusable device: {} blocks of {block_size} bytes",
                        dev.capacity_blocks
                    )
                })?;
            let plan = Arc::new(RunPlan {
                mode,
                count: a.count,
                workload: w,
                clients: a.clients as u32,
                geometry,
                limits: s.config.limits,
                block_size,
                budget: OpBudget::new(s.config.limits.max_ops),
                stop: AtomicBool::new(false),
                timer_ns,
                record_from: s.reference.map(|_| Instant::now()),
                commit_every: a.commit_every,
                keep: a.keep,
                rounds_done: tokio::sync::Barrier::new(a.clients),
                interrupted: AtomicBool::new(false),
            });
            let clients_done = Arc::new(AtomicBool::new(false));
            on_interrupt(Arc::clone(&plan), Arc::clone(&clients_done));
            let t0 = Instant::now();
            // Every connection first: a client that cannot connect stops the
            // run before any allocation.
            let mut clients = Vec::with_capacity(a.clients);
            for _ in 0..a.clients {
                clients.push(a.connect.connect(&addr).await?);
            }
            let mut tasks = Vec::new();
            for (c, client) in clients.into_iter().enumerate() {
                let plan = Arc::clone(&plan);
                tasks.push(tokio::spawn(
                    async move { client_run(client, c, &plan).await },
                ));
            }
            // Every client is awaited, also after one failed (the others stop
            // at their next call), so that each frees its objects.
            let mut runs = Vec::new();
            let mut first_error = None;
            for t in tasks {
                match t.await.context("a client task failed").and_then(|r| r) {
                    Ok(r) => runs.push(r),
                    Err(e) => {
                        plan.stop.store(true, Ordering::Relaxed);
                        first_error.get_or_insert(e);
                    }
                }
            }
            clients_done.store(true, Ordering::Relaxed);
            if let Some(e) = first_error {
                return Err(e);
            }
            // The run ends with the last client's rounds, before the frees of
            // what was left allocated.
            let wall = runs
                .iter()
                .filter_map(|r| r.finished)
                .max()
                .map_or_else(|| t0.elapsed(), |end| end.duration_since(t0));
            // The first failure of any client ends the run, as the first
            // failure ends a local run.
            let util = runs.iter().find_map(|r: &ClientRun| r.util_at_failure);
            let at_failure = runs.iter().find_map(|r| r.status_at_failure.clone());
            anyhow::Ok((
                runs,
                wall,
                util,
                at_failure,
                block_size,
                geometry,
                dev.meta_blocks,
                plan.interrupted.load(Ordering::Relaxed),
            ))
        })?;
    let quota = runs.iter().find_map(|r| r.quota_at_failure.clone());
    let reference = match s.reference {
        Some(engine) => Some(same_order_reference(
            engine,
            &runs,
            &s,
            geometry,
            meta_blocks,
        )?),
        None => None,
    };
    let sum = |f: fn(&ClientRun) -> u64| runs.iter().map(f).sum::<u64>();
    let alloc_time: Duration = runs.iter().map(|r| r.alloc_time).sum();
    let commit_secs: f64 = runs.iter().map(|r| r.commit_time.as_secs_f64()).sum();
    let lat = Latency::new(&runs, |r| &r.alloc_ns, alloc_time);
    let calls = Latency::new(&runs, |r| &r.call_ns, alloc_time);
    let commit_total = Duration::from_nanos(runs.iter().flat_map(|r| &r.commit_ns).sum());
    let commits = Latency::new(&runs, |r| &r.commit_ns, commit_total);
    let n = lat.count();
    let with_commit = per((alloc_time.as_secs_f64() + commit_secs) * 1e9, n);
    // The calls the allocations cost: Allocate per call; Lease, Commit and
    // per-call fallbacks when leased.
    let rpcs = sum(|r| r.allocate_calls + r.leases + r.commit_calls + r.remote_fallbacks);
    let stopped = if util.is_some() {
        "no_space"
    } else if quota.is_some() {
        "quota"
    } else if interrupted {
        "interrupted"
    } else if runs.iter().all(|r| r.ended) {
        "end_of_workload"
    } else {
        "limit"
    };
    let mut v = serde_json::json!({
        "kind": "remote",
        "remote": addr,
        "workload": w.kind.name(),
        "lease": mode.name(),
        "clients": a.clients,
        "count": a.count,
        "block_size": block_size,
        "free_prob": w.free_prob,
        "seed": w.seed,
        "max_ops": s.config.limits.max_ops,
        "allocations": n,
        "frees": sum(|r| r.frees),
        "rounds": runs.iter().map(|r| r.rounds).max().unwrap_or(0),
        "stopped": stopped,
        "utilization_at_first_failure": util,
        "free_blocks_at_first_failure": at_failure.as_ref().map(|d| d.free_blocks),
        "leased_unused_blocks_at_first_failure": at_failure.as_ref().map(|d| d.leased_unused_blocks),
        "largest_free_extent_at_first_failure": at_failure.as_ref().map(|d| d.largest_free_extent),
        "quota_at_first_failure": quota.as_ref().map(|q| serde_json::json!({
            "tenant": q.tenant,
            "device": q.device,
            "quota_bytes": q.quota_bytes,
            "held_bytes": q.held_bytes,
            "asked_bytes": q.asked_bytes,
        })),
        "alloc_ns": lat.json(),
        "timer_overhead_ns": timer_ns,
        "ns_per_allocation": lat.mean(),
        "allocate_calls": sum(|r| r.allocate_calls),
        "allocate_call_ns": calls.json(),
        "free_calls": sum(|r| r.free_calls),
        "rpcs_per_allocation": per(rpcs as f64, n),
        "commit_every": a.commit_every,
        "commit_secs": commit_secs,
        "commit_ns": commits.json(),
        "ns_per_allocation_with_commit": with_commit,
        "allocations_per_sec": n as f64 / wall.as_secs_f64(),
        "wall_secs": wall.as_secs_f64(),
        "leases": sum(|r| r.leases),
        "commit_calls": sum(|r| r.commit_calls),
        "commit_calls_per_sec": sum(|r| r.commit_calls) as f64 / wall.as_secs_f64(),
        "per_call_fallbacks": sum(|r| r.remote_fallbacks),
    });
    if let Some(r) = &reference {
        v["reference"] = serde_json::json!({
            "engine": r.engine,
            "order": "as_made",
            "utilization_at_first_failure": r.outcome.utilization_at_first_failure,
            "failed_within_order": r.outcome.failed_within_order,
            "ops": r.outcome.ops,
            "ops_after_order": r.outcome.ops_after_order,
            "refused_the_same_request": r.refused_the_same_request(),
        });
    }
    match a.json.as_deref() {
        Some("-") => println!("{v}"),
        Some(p) => {
            let mut f = File::create(p).with_context(|| format!("cannot create {p}"))?;
            writeln!(f, "{v}").context("cannot write the JSON output")?;
        }
        None => {}
    }
    if !a.quiet {
        let size = |blocks: u64| units::bytes(blocks.saturating_mul(block_size));
        let mut out: Box<dyn Write> = if a.json.as_deref() == Some("-") {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        };
        writeln!(
            out,
            "remote {addr}: {}, lease {}, {} client(s), {n} allocations in {} ({:.0}/s)",
            w.kind.name(),
            mode.label(),
            a.clients,
            units::duration(wall),
            n as f64 / wall.as_secs_f64()
        )?;
        writeln!(out, "  allocate   {}", lat.line())?;
        if mode == LeaseMode::Off {
            writeln!(
                out,
                "  calls      {} Allocate of up to {} objects ({:.4} per allocation): {}",
                calls.count(),
                a.count,
                per(rpcs as f64, n),
                calls.line()
            )?;
        }
        writeln!(
            out,
            "  commits    {} in {} calls ({:.0}/s); with commits {} per allocation",
            units::nanos(commit_secs * 1e9),
            sum(|r| r.commit_calls),
            sum(|r| r.commit_calls) as f64 / wall.as_secs_f64(),
            units::nanos(with_commit)
        )?;
        if commits.count() > 0 {
            writeln!(out, "  commit     {}", commits.line())?;
        }
        if let (Some(u), Some(d)) = (util, &at_failure) {
            writeln!(
                out,
                "  stopped    no space at utilisation {u:.5}: {} free (longest run {}), {} leased unused",
                size(d.free_blocks),
                size(d.largest_free_extent),
                size(d.leased_unused_blocks)
            )?;
        }
        if let Some(q) = &quota {
            writeln!(
                out,
                "  stopped    over quota: tenant {:?} on device {:?} has a quota of {}; \
                 it held {} (allocated or leased) and asked {} more",
                q.tenant,
                q.device,
                units::bytes(q.quota_bytes),
                units::bytes(q.held_bytes),
                units::bytes(q.asked_bytes)
            )?;
        }
        if let Some(r) = &reference {
            writeln!(out, "  reference  {}", r.line(util))?;
        }
    }
    Ok(())
}

/// The first Ctrl-C stops the clients at their next call, so that they
/// free what they allocated and the run reports what it measured; a second
/// one, or one after the clients are done, ends the process at once.
/// Without a handler (none can be installed) Ctrl-C ends the process as
/// before.
fn on_interrupt(plan: Arc<RunPlan>, clients_done: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed now, not when the task first runs, so that no early Ctrl-C
    // is lost.
    let Ok(mut int) = signal(SignalKind::interrupt()) else {
        return;
    };
    tokio::spawn(async move {
        if int.recv().await.is_none() {
            return;
        }
        if !clients_done.load(Ordering::Relaxed) {
            plan.interrupted.store(true, Ordering::Relaxed);
            plan.stop.store(true, Ordering::Relaxed);
            eprintln!(
                "blockalloc: interrupted; freeing the run's objects (Ctrl-C again to quit now)"
            );
            if int.recv().await.is_none() {
                return;
            }
        }
        std::process::exit(130);
    });
}

/// How a batch of allocations ended.
enum Batch {
    /// Every object was allocated.
    Done,
    /// The server had no room for one more object; the device then, when
    /// the server said.
    NoSpace(Option<NoSpaceDetails>),
    /// One more object would take the caller's tenant past its quota.
    Quota(QuotaDetails),
}

impl Batch {
    /// True when the server refused an object (no room, or the quota).
    fn refused(&self) -> bool {
        !matches!(self, Batch::Done)
    }

    /// The batch a refusal ends, or `e` back when it is no refusal.
    fn of_refusal(e: ClientError) -> Result<Batch, ClientError> {
        match e {
            ClientError::NoSpace { details, .. } => Ok(Batch::NoSpace(details)),
            ClientError::Quota { details, .. } => Ok(Batch::Quota(details)),
            e => Err(e),
        }
    }
}

/// Allocates objects of `sizes` blocks per call into `got`, in the order
/// of `sizes`: one `Allocate` per distinct size. A batch refused for lack
/// of space is retried object by object, so that only a single
/// allocation's failure stops the run (then `got` is incomplete).
async fn allocate_per_call(
    client: &Client,
    dev: &DeviceId,
    sizes: &[u64],
    r: &mut ClientRun,
    got: &mut Vec<Extent>,
) -> Result<Batch, ClientError> {
    let mut groups = BTreeMap::<u64, Vec<usize>>::new();
    for (i, &b) in sizes.iter().enumerate() {
        groups.entry(b).or_default().push(i);
    }
    let mut slots: Vec<Option<Extent>> = vec![None; sizes.len()];
    let mut one = Vec::new();
    let mut outcome = Batch::Done;
    for (blocks, at) in groups {
        one.clear();
        let count = at.len() as u32;
        outcome = allocate_call(client, dev, blocks, count, r, &mut one).await?;
        if outcome.refused() && count > 1 {
            for _ in 0..count {
                outcome = allocate_call(client, dev, blocks, 1, r, &mut one).await?;
                if outcome.refused() {
                    break;
                }
            }
        }
        for (&i, &e) in at.iter().zip(&one) {
            slots[i] = Some(e);
        }
        if outcome.refused() {
            break;
        }
    }
    got.extend(slots.into_iter().flatten());
    Ok(outcome)
}

/// One `Allocate` of `count` objects of `blocks` blocks, all or nothing.
async fn allocate_call(
    client: &Client,
    dev: &DeviceId,
    blocks: u64,
    count: u32,
    r: &mut ClientRun,
    got: &mut Vec<Extent>,
) -> Result<Batch, ClientError> {
    let t = Instant::now();
    let res = client.allocate(dev, count, blocks, None).await;
    let dt = t.elapsed();
    r.allocate_calls += 1;
    match res {
        Ok(v) => {
            r.record_call(dt, count);
            got.extend(v);
            Ok(Batch::Done)
        }
        Err(e) => Batch::of_refusal(e),
    }
}

/// The leasing allocator of a client in leased mode.
fn leasing_allocator(
    client: &Client,
    mode: LeaseMode,
    index: usize,
    block_size: u64,
) -> Option<LeasingAllocator> {
    let want = match mode {
        LeaseMode::Off => return None,
        LeaseMode::Size(b) => b.div_ceil(block_size),
        LeaseMode::Auto => 0,
    };
    let max_obj = blockalloc_bench::MAX_OBJECT_BYTES.div_ceil(block_size);
    Some(LeasingAllocator::new(
        client.clone(),
        LeaseOptions {
            device: DeviceId::Index(0),
            min_blocks: if want > 0 { want.min(max_obj) } else { max_obj },
            want_blocks: want,
            commit_interval: Duration::from_secs(3600),
            client_id: format!("bench-{}-{index}", std::process::id()),
            ..LeaseOptions::default()
        },
    ))
}

/// One client's copy of the workload until a stop: its rounds' allocations
/// (per call or leased), then the frees each round names. At the end, on
/// success or failure, the objects still allocated are freed unless
/// `--keep`, so that a run leaves the server as it found it.
async fn client_run(client: Client, index: usize, plan: &RunPlan) -> anyhow::Result<ClientRun> {
    let leasing = leasing_allocator(&client, plan.mode, index, plan.block_size);
    let mut r = ClientRun {
        timer_ns: plan.timer_ns,
        ..ClientRun::default()
    };
    // Every object of this client not freed yet, by the workload's id.
    let mut live: HashMap<u64, Extent> = HashMap::new();
    let ran = run_rounds(&client, leasing.as_ref(), index, plan, &mut r, &mut live).await;
    r.finished = Some(Instant::now());
    if ran.is_err() {
        plan.stop.store(true, Ordering::Relaxed);
    }
    plan.rounds_done.wait().await;
    let freed = if plan.keep {
        Ok(())
    } else {
        free_all(&client, leasing.as_ref(), live).await
    };
    if let Some(l) = leasing {
        let st = l.stats();
        r.leases = st.leases;
        r.commit_calls = st.commit_calls;
        r.remote_fallbacks = st.remote_allocations;
        // Closing commits the frees above.
        let closed = l.close().await;
        ran?;
        closed.context("cannot free the run's objects")?;
    } else {
        ran?;
    }
    freed.context("cannot free the run's objects")?;
    Ok(r)
}

/// Frees `live`: through the leasing allocator when leased (its close
/// commits them), else per call.
async fn free_all(
    client: &Client,
    leasing: Option<&LeasingAllocator>,
    live: HashMap<u64, Extent>,
) -> Result<(), ClientError> {
    let extents: Vec<Extent> = live.into_values().collect();
    match leasing {
        Some(l) => {
            for e in extents {
                l.free(e).await?;
            }
        }
        None => {
            for chunk in extents.chunks(MAX_COUNT as usize) {
                client.free(&DeviceId::Index(0), chunk).await?;
            }
        }
    }
    Ok(())
}

/// The rounds of [`client_run`]; `live` keeps every object allocated and
/// not freed, whatever ends the run.
async fn run_rounds(
    client: &Client,
    leasing: Option<&LeasingAllocator>,
    index: usize,
    plan: &RunPlan,
    r: &mut ClientRun,
    live: &mut HashMap<u64, Extent>,
) -> anyhow::Result<()> {
    let dev = DeviceId::Index(0);
    let (spec, geometry) = plan
        .workload
        .for_worker(plan.geometry, index as u32, plan.clients);
    let mut workload = Workload::new(spec, geometry);
    let limits = plan.limits;
    let start = Instant::now();
    let mut round = Round::default();
    let mut sizes = Vec::new();
    // This round's objects, in request order.
    let mut got = Vec::new();
    // Leased allocations since the last commit, for --commit-every.
    let mut uncommitted = 0u32;
    loop {
        if plan.stop.load(Ordering::Relaxed) {
            break;
        }
        if !workload.next_round(&mut round) {
            r.ended = true;
            break;
        }
        got.clear();
        let mut failed = false;
        let mut interrupted = false;
        while got.len() < round.allocs.len() {
            if plan.stop.load(Ordering::Relaxed) {
                interrupted = true;
                break;
            }
            let left = (round.allocs.len() - got.len()) as u64;
            let k = plan.budget.take(left.min(u64::from(plan.count)));
            if k == 0 {
                break;
            }
            let next = &round.allocs[got.len()..got.len() + k as usize];
            sizes.clear();
            sizes.extend(next.iter().map(|a| a.blocks.max(1)));
            let batch = match leasing {
                Some(l) => {
                    let t = Instant::now();
                    match l.allocate(sizes[0]).await {
                        Ok(e) => {
                            r.record_local(t.elapsed());
                            got.push(e);
                            live.insert(next[0].object, e);
                            r.stamp(plan, 1);
                            uncommitted += 1;
                            if plan.commit_every.is_some_and(|n| uncommitted >= n) {
                                r.commit(l, true).await?;
                                uncommitted = 0;
                            }
                            Batch::Done
                        }
                        Err(e) => Batch::of_refusal(e)?,
                    }
                }
                None => {
                    let before = got.len();
                    let b = allocate_per_call(client, &dev, &sizes, r, &mut got).await;
                    for (req, &e) in round.allocs[before..].iter().zip(&got[before..]) {
                        live.insert(req.object, e);
                    }
                    let b = b?;
                    r.stamp(plan, got.len() - before);
                    b
                }
            };
            if let Batch::Quota(q) = batch {
                if !plan.stop.swap(true, Ordering::Relaxed) {
                    r.quota_at_failure = Some(q);
                }
                failed = true;
                break;
            }
            if let Batch::NoSpace(refusal) = batch {
                if !plan.stop.swap(true, Ordering::Relaxed) {
                    let st = client.status().await?;
                    let mut d = st[0].clone();
                    // The device as the refusal found it: frees and lease
                    // releases of other clients may land before the Status
                    // call, and would show it emptier than it was.
                    if let Some(at) = refusal {
                        d.used_blocks = at.used_blocks;
                        d.free_blocks = at.free_blocks;
                        d.largest_free_extent = at.largest_free_extent;
                        d.leased_unused_blocks = at.leased_unused_blocks;
                    }
                    r.util_at_failure = Some(d.used_blocks as f64 / d.capacity_blocks as f64);
                    r.status_at_failure = Some(d);
                }
                failed = true;
                break;
            }
        }
        if interrupted {
            break;
        }
        if let Some(l) = leasing {
            r.commit(l, true).await?;
            uncommitted = 0;
        }
        // Another client's failure ends the run here, before this round's
        // frees: frees landing between that failure and its status call
        // would show the device emptier than it was when it failed.
        if failed || plan.stop.load(Ordering::Relaxed) {
            break;
        }
        // The round's frees, of the objects that were allocated: this
        // round's, or earlier rounds' for the workloads whose frees cross
        // rounds.
        let mut to_free: Vec<u64> = round
            .frees
            .iter()
            .copied()
            .filter(|object| live.contains_key(object))
            .collect();
        let allowed = plan.budget.take(to_free.len() as u64);
        to_free.truncate(allowed as usize);
        let to_free: Vec<Extent> = to_free.iter().filter_map(|o| live.remove(o)).collect();
        r.frees += to_free.len() as u64;
        match leasing {
            Some(l) => {
                for e in to_free {
                    l.free(e).await?;
                    r.stamp(plan, 1);
                }
                r.commit(l, false).await?;
            }
            None => {
                for chunk in to_free.chunks(4096) {
                    client.free(&dev, chunk).await?;
                    r.free_calls += 1;
                    r.stamp(plan, chunk.len());
                }
            }
        }
        r.rounds += 1;
        let limit_hit = plan.budget.exhausted()
            || limits.max_rounds.is_some_and(|m| r.rounds >= m)
            || limits.time_limit.is_some_and(|t| start.elapsed() >= t);
        if limit_hit {
            break;
        }
    }
    Ok(())
}

/// The reference engine's figure for a remote run.
struct SameOrder {
    engine: &'static str,
    outcome: Interleaved,
}

impl SameOrder {
    /// The engine, given the server's requests up to its first failure,
    /// refused the very request the server refused next.
    fn refused_the_same_request(&self) -> bool {
        let o = &self.outcome;
        o.utilization_at_first_failure.is_some() && !o.failed_within_order && o.ops_after_order == 1
    }

    /// The human line: the engine's utilisation at its first failure and the
    /// service's distance from it.
    fn line(&self, service: Option<f64>) -> String {
        let o = &self.outcome;
        let head = format!(
            "{} in-process, the same requests in the order the clients made them",
            self.engine
        );
        match (o.utilization_at_first_failure, service) {
            (Some(r), Some(u)) => format!(
                "{head}: no space at utilisation {r:.5} ({:+.3} points for the server); {}",
                100.0 * (u - r),
                if o.failed_within_order {
                    "it failed on a request the server had served".to_string()
                } else if self.refused_the_same_request() {
                    "it refused the request the server refused".to_string()
                } else {
                    format!(
                        "it served the request the server refused and {} more operations",
                        o.ops_after_order.saturating_sub(2)
                    )
                }
            ),
            (Some(r), None) => format!("{head}: no space at utilisation {r:.5}"),
            (None, _) => format!("{head}: no failure in {} operations", o.ops),
        }
    }
}

/// Replays every client's requests in the order they were made (a stable
/// merge of the clients' timestamps) through `engine` over the server's
/// device; after a run that ended for lack of space, goes on with the
/// clients' streams in turn until the engine fails too.
fn same_order_reference(
    engine: BenchEngine,
    runs: &[ClientRun],
    s: &BenchSettings,
    geometry: Geometry,
    metadata_blocks: u64,
) -> anyhow::Result<SameOrder> {
    let mut order: Vec<(u64, u32)> = runs
        .iter()
        .zip(0u32..)
        .flat_map(|(r, c)| r.op_ns.iter().map(move |&t| (t, c)))
        .collect();
    order.sort_unstable();
    let order: Vec<u32> = order.into_iter().map(|(_, c)| c).collect();
    // The turns start with the client whose request the server refused,
    // so that the engine's first request after the order is that one.
    let refused = runs.iter().position(|r| r.util_at_failure.is_some());
    let after = match refused {
        Some(c) => After::InTurn { first: c as u32 },
        None => After::Stop,
    };
    let setup = Interleave {
        engine,
        spec: s.config.workload,
        geometry,
        metadata_blocks,
        workers: runs.len() as u32,
        limits: s.config.limits,
    };
    let outcome = replay_interleaved(&setup, &order, after).context("the reference run failed")?;
    Ok(SameOrder {
        engine: engine.name(),
        outcome,
    })
}
