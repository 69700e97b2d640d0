//! A workload against an allocation server ([`run_remote`], behind
//! `blockalloc bench --remote ADDR`): any workload of the registry, per call
//! ([`LeaseMode::Off`]) or through leases ([`LeaseMode::Auto`],
//! [`LeaseMode::Size`]), from [`RemoteConfig::clients`] connections at once.
//!
//! Each client runs its own copy of the workload as a threaded run runs one
//! per thread ([`WorkloadSpec::for_worker`]: seed + client index, rounds of
//! round-size / clients requests, and for the workloads whose phases end at
//! fill levels 1 / clients of the device), frees the objects each round
//! names (this round's, or earlier rounds' for the workloads whose frees
//! cross rounds), and stops at the first failure of any client, at a limit,
//! or when every client's stream has ended (`end_of_workload`). Every call
//! is timed on its own with an `Instant::now()` pair, and the pair's own
//! cost, calibrated at start-up as for a local run (`timer_overhead_ns`),
//! is subtracted from each sample (it matters only for local, leased
//! allocations, which take about as long as the timer). The samples feed
//! the harness's latency histograms ([`crate::latency`]), as a local run's
//! do. Leased allocations become durable at the commit that ends each
//! round, or with [`RemoteConfig::commit_every`] N at a commit after every
//! N of them; the commits' time is reported apart and also spread over the
//! allocations ("with commit"), and each commit call is timed (`commit_ns`).
//!
//! Per call, [`RemoteConfig::count`] N batches: a client takes the
//! workload's next N requests and sends one `Allocate` per distinct size
//! among them (the call asks for `count` objects of one size), so the
//! request stream, and with it the sizes asked for, is the same for every
//! N; a fixed size makes it one call per N objects. An object's cost is its
//! call's time divided by the objects the call returned. A batch refused
//! for lack of space is retried one object at a time, so a run still stops
//! at the first single allocation the server cannot serve, whatever N.
//!
//! [`RemoteConfig::reference`] replays the clients' requests, in the order
//! they made them, through one in-process engine over the server's device,
//! its metadata area set aside ([`replay_interleaved`]): the engine on the
//! same workload, whose utilisation at the first failure each record
//! carries beside the server's, and whether it refused the very request the
//! server refused.
//!
//! `max_ops` is one budget for the whole run: every allocation and every
//! free takes one operation from a counter all clients share before it is
//! sent, so the run makes exactly that many (unless it stops earlier), as a
//! local run does.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::{ByteSize, ErrorClass, Extent, Geometry};
use blockalloc_client::{
    Client, ClientError, DeviceId, DeviceStatus, LeaseOptions, LeasingAllocator, NoSpaceDetails,
    QuotaDetails,
};

use crate::config::Limits;
use crate::engines::BenchEngine;
use crate::interleave::{replay_interleaved, After, Interleave, InterleaveError, Interleaved};
use crate::latency::{LatencySummary, OpLatency, TimerCalibration};
use crate::sizes::MAX_OBJECT_BYTES;
use crate::units;
use crate::workload::{Round, Workload, WorkloadSpec};

/// The most objects one `Allocate` may ask for: the server's default batch
/// limit (`max_batch`).
pub const MAX_COUNT: u32 = 4096;

/// The most clients a run may have.
pub const MAX_CLIENTS: usize = 1024;

/// How clients allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseMode {
    /// Every allocation is an `Allocate` call.
    Off,
    /// Leases sized by the server.
    Auto,
    /// Leases of this many bytes.
    Size(u64),
}

/// A lease mode that is none of `off`, `auto` or a size above zero.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected off, auto or a size such as 64MiB")]
pub struct UnknownLease(pub String);

impl FromStr for LeaseMode {
    type Err = UnknownLease;

    fn from_str(s: &str) -> Result<LeaseMode, UnknownLease> {
        match s {
            "off" => Ok(LeaseMode::Off),
            "auto" => Ok(LeaseMode::Auto),
            size => match size.parse::<ByteSize>() {
                Ok(b) if b.bytes() > 0 => Ok(LeaseMode::Size(b.bytes())),
                _ => Err(UnknownLease(s.to_string())),
            },
        }
    }
}

impl LeaseMode {
    /// The name in JSON: `off`, `auto` or the size (`64MiB`).
    pub fn name(self) -> String {
        match self {
            LeaseMode::Off => "off".into(),
            LeaseMode::Auto => "auto".into(),
            LeaseMode::Size(b) => ByteSize(b).to_string(),
        }
    }

    /// [`name`](Self::name) for people: a size as every command prints one.
    pub fn label(self) -> String {
        match self {
            LeaseMode::Size(b) => units::bytes(b),
            _ => self.name(),
        }
    }
}

/// Everything a remote run needs but the server's connections.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteConfig {
    /// The server's address, as the report names it.
    pub server: String,
    /// Every client's workload, before [`WorkloadSpec::for_worker`].
    pub workload: WorkloadSpec,
    /// When to stop; `max_ops` counts the operations of all clients
    /// together.
    pub limits: Limits,
    /// How clients allocate.
    pub lease: LeaseMode,
    /// Clients (connections) running at once, 1 to [`MAX_CLIENTS`].
    pub clients: usize,
    /// Per call: objects per `Allocate`, 1 to [`MAX_COUNT`].
    pub count: u32,
    /// Leased: commit after every this many allocations, besides at each
    /// round's end.
    pub commit_every: Option<u32>,
    /// Leave the run's objects allocated at the end.
    pub keep: bool,
    /// The engine that replays the clients' requests in the order made.
    pub reference: Option<BenchEngine>,
}

/// A [`RemoteConfig`] whose values do not go together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteConfigError {
    /// Clients out of range.
    #[error("must be from 1 to {MAX_CLIENTS}")]
    Clients(usize),
    /// Objects per call out of range.
    #[error("{0} must be from 1 to {MAX_COUNT} (the server's batch limit)")]
    Count(u32),
    /// Several objects per call, but leased: a leasing client allocates
    /// locally, one object at a time.
    #[error("{0} objects per call batch per-call Allocate calls; a leasing client allocates locally, one object at a time")]
    CountLeased(u32),
    /// Commits after every 0 allocations.
    #[error("must be at least 1")]
    CommitEveryZero,
    /// Commits of leased allocations asked of a per-call run, where every
    /// allocation is durable when its call returns.
    #[error("{0} commits leased allocations; per call, every allocation is durable when its call returns")]
    CommitEveryPerCall(u32),
}

impl RemoteConfigError {
    /// [`ErrorClass::InvalidInput`].
    pub fn class(&self) -> ErrorClass {
        ErrorClass::InvalidInput
    }
}

impl RemoteConfig {
    /// Checks the clients, the objects per call and the commits against
    /// each other and the lease mode.
    ///
    /// # Errors
    /// The first [`RemoteConfigError`] found.
    pub fn check(&self) -> Result<(), RemoteConfigError> {
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return Err(RemoteConfigError::Clients(self.clients));
        }
        if self.count == 0 || self.count > MAX_COUNT {
            return Err(RemoteConfigError::Count(self.count));
        }
        if self.count > 1 && self.lease != LeaseMode::Off {
            return Err(RemoteConfigError::CountLeased(self.count));
        }
        match self.commit_every {
            Some(0) => Err(RemoteConfigError::CommitEveryZero),
            Some(n) if self.lease == LeaseMode::Off => {
                Err(RemoteConfigError::CommitEveryPerCall(n))
            }
            _ => Ok(()),
        }
    }
}

/// Why a remote run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The configuration does not hold together.
    #[error(transparent)]
    Config(#[from] RemoteConfigError),
    /// A call to the server failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The server serves no device.
    #[error("the server serves no device")]
    NoDevice,
    /// The server's first device has no usable geometry.
    #[error("the server reports an unusable device: {blocks} blocks of {block_size} bytes")]
    UnusableDevice {
        /// Its capacity in blocks.
        blocks: u64,
        /// Its block size.
        block_size: u64,
    },
    /// Freeing the run's objects at its end failed.
    #[error("cannot free the run's objects")]
    Free(#[source] ClientError),
    /// A client's task ended without its result.
    #[error("a client task failed")]
    Task(#[source] tokio::task::JoinError),
    /// The reference engine's replay failed.
    #[error("the reference run failed")]
    Reference(#[source] InterleaveError),
}

impl RemoteError {
    /// The class of the server's refusal when a call failed, else
    /// [`ErrorClass::InvalidInput`] for a configuration and
    /// [`ErrorClass::Io`].
    pub fn class(&self) -> ErrorClass {
        match self {
            RemoteError::Config(e) => e.class(),
            RemoteError::Client(e) | RemoteError::Free(e) => e.class(),
            _ => ErrorClass::Io,
        }
    }
}

/// Stops a remote run from outside (Ctrl-C): the clients stop at their
/// next call, free what they allocated, and the run reports what it
/// measured, `stopped: interrupted`.
#[derive(Clone, Debug, Default)]
pub struct RemoteStop(Arc<StopFlags>);

#[derive(Debug, Default)]
struct StopFlags {
    /// Every client stops at its next call: set by the first failure or by
    /// an interrupt.
    stop: AtomicBool,
    /// Set by [`RemoteStop::interrupt`].
    interrupted: AtomicBool,
    /// The run has found the server's device and is about to start its
    /// clients.
    started: AtomicBool,
    /// Every client has ended, its objects freed.
    clients_done: AtomicBool,
}

impl RemoteStop {
    /// A handle for one run.
    pub fn new() -> RemoteStop {
        RemoteStop::default()
    }

    /// Stops the clients at their next call. Returns false, stopping
    /// nothing, when there is nothing to stop: the run has not started its
    /// clients yet (it is still reaching the server), or they are done.
    pub fn interrupt(&self) -> bool {
        if !self.0.started.load(Ordering::Relaxed) || self.0.clients_done.load(Ordering::Relaxed) {
            return false;
        }
        self.0.interrupted.store(true, Ordering::Relaxed);
        self.0.stop.store(true, Ordering::Relaxed);
        true
    }
}

/// The run's operation budget (`max_ops`), shared by every client.
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
    /// The commits of allocations: every `commit_every` allocations and
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
    status_at_failure: Option<DeviceStatus>,
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
    /// With a reference engine: when each allocation and free of this client's
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

    /// With a reference engine, notes that `n` operations of the stream were
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
    async fn commit(&mut self, l: &LeasingAllocator, allocations: bool) -> Result<(), ClientError> {
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

/// `x / n`, 0 when `n` is 0.
fn per(x: f64, n: u64) -> f64 {
    if n > 0 {
        x / n as f64
    } else {
        0.0
    }
}

/// The latency of `runs`' samples `of` each, `busy` the time they took
/// together. The samples have the timer's cost taken off already.
fn latency(
    runs: &[ClientRun],
    of: fn(&ClientRun) -> &[u64],
    busy: fn(&ClientRun) -> Duration,
) -> LatencySummary {
    let mut l = OpLatency::new(TimerCalibration::ZERO);
    for r in runs {
        l.add_timed(busy(r), of(r));
    }
    l.summary()
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
    limits: Limits,
    block_size: u64,
    budget: OpBudget,
    /// Stops every client; says why.
    flags: Arc<StopFlags>,
    /// The calibrated cost of an empty `Instant::now()` pair.
    timer_ns: u64,
    /// With a reference engine: the run's start, from which every client
    /// times its operations.
    record_from: Option<Instant>,
    /// Leased allocations between commits within a round.
    commit_every: Option<u32>,
    /// Leave the run's objects allocated at the end.
    keep: bool,
    /// Every client waits here after its rounds, before freeing its
    /// objects: an early client's frees would give the others room the run
    /// did not have, and show the device emptier at another's failure.
    rounds_done: tokio::sync::Barrier,
    /// The server's CPU time when the last client finished its rounds (the
    /// first client through `rounds_done` asks).
    server_cpu_end: std::sync::Mutex<Option<Duration>>,
}

impl RunPlan {
    /// True once the run is to stop.
    fn stopping(&self) -> bool {
        self.flags.stop.load(Ordering::Relaxed)
    }

    /// Stops the run; true when this is the first stop (the failure that
    /// ends the run).
    fn stop_first(&self) -> bool {
        !self.flags.stop.swap(true, Ordering::Relaxed)
    }
}

/// Why a remote run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteStopReason {
    /// The server had no room for an allocation.
    NoSpace,
    /// An allocation would have taken the tenant past its quota.
    Quota,
    /// [`RemoteStop::interrupt`].
    Interrupted,
    /// Every client's stream ended.
    EndOfWorkload,
    /// A limit was reached.
    Limit,
}

impl RemoteStopReason {
    /// The name in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            RemoteStopReason::NoSpace => "no_space",
            RemoteStopReason::Quota => "quota",
            RemoteStopReason::Interrupted => "interrupted",
            RemoteStopReason::EndOfWorkload => "end_of_workload",
            RemoteStopReason::Limit => "limit",
        }
    }
}

/// What a remote run measured: a JSON object ([`to_json`](Self::to_json))
/// and lines for people ([`render`](Self::render)).
#[derive(Clone, Debug)]
pub struct RemoteReport {
    /// The run's configuration.
    pub config: RemoteConfig,
    /// The device's block size.
    pub block_size: u64,
    /// Objects allocated, by all clients.
    pub allocations: u64,
    /// Objects freed within the rounds.
    pub frees: u64,
    /// The most rounds a client completed.
    pub rounds: u64,
    /// Why the run stopped.
    pub stopped: RemoteStopReason,
    /// used / capacity at the first failure for lack of space.
    pub utilization_at_first_failure: Option<f64>,
    /// The device as the first refusal for lack of space found it.
    pub device_at_first_failure: Option<DeviceStatus>,
    /// The quota the first refused allocation went past.
    pub quota_at_first_failure: Option<QuotaDetails>,
    /// Each object's cost: its call's time divided by the objects it
    /// returned, or a local (leased) allocation's own time.
    pub alloc_ns: LatencySummary,
    /// Each successful per-call `Allocate`'s round trip.
    pub allocate_call_ns: LatencySummary,
    /// Each commit call's time.
    pub commit_ns: LatencySummary,
    /// The calibrated cost of an empty `Instant::now()` pair, taken off
    /// every sample.
    pub timer_overhead_ns: u64,
    /// The allocations' time, all clients together.
    pub alloc_time: Duration,
    /// `Allocate` calls sent, refused ones included.
    pub allocate_calls: u64,
    /// `Free` calls sent within the rounds.
    pub free_calls: u64,
    /// The calls the allocations cost: `Allocate` per call; `Lease`,
    /// `Commit` and per-call fallbacks when leased.
    pub rpcs: u64,
    /// The time of the commits of allocations, all clients together.
    pub commit_secs: f64,
    /// From the start to the end of the last client's rounds.
    pub wall: Duration,
    /// Leases taken.
    pub leases: u64,
    /// Commit calls sent.
    pub commit_calls: u64,
    /// Leased allocations that fell back to a per-call `Allocate`.
    pub per_call_fallbacks: u64,
    /// The server's CPU time (user + system) over the rounds, from its
    /// Status replies; `None` when the server does not report it.
    pub server_cpu: Option<Duration>,
    /// The reference engine's replay of the clients' requests.
    pub reference: Option<SameOrder>,
}

/// Runs `config`'s workload against the server that `connect` reaches,
/// from [`RemoteConfig::clients`] connections of `connect` at once (and
/// one more for the server's status), until a stop (see the module). The
/// server's first device is the device. `timer` is taken off every sample;
/// `stop` stops the run from outside.
///
/// # Errors
/// `connect`'s errors; a [`RemoteError`]: the configuration, the server
/// unreachable or refusing requests other than for space or quota.
pub async fn run_remote<C, F, E>(
    config: &RemoteConfig,
    timer: TimerCalibration,
    stop: &RemoteStop,
    mut connect: C,
) -> Result<RemoteReport, E>
where
    C: FnMut() -> F,
    F: Future<Output = Result<Client, E>>,
    E: From<RemoteError>,
{
    config.check().map_err(RemoteError::from)?;
    let probe = connect().await?;
    let st = probe.status().await.map_err(RemoteError::from)?;
    let dev = st.first().ok_or(RemoteError::NoDevice)?;
    let block_size = dev.block_size;
    let geometry = dev
        .capacity_blocks
        .checked_mul(block_size)
        .and_then(|bytes| Geometry::new(bytes, block_size).ok())
        .ok_or(RemoteError::UnusableDevice {
            blocks: dev.capacity_blocks,
            block_size,
        })?;
    let plan = Arc::new(RunPlan {
        mode: config.lease,
        count: config.count,
        workload: config.workload,
        clients: config.clients as u32,
        geometry,
        limits: config.limits,
        block_size,
        budget: OpBudget::new(config.limits.max_ops),
        flags: Arc::clone(&stop.0),
        timer_ns: timer.pair_ns,
        record_from: config.reference.map(|_| Instant::now()),
        commit_every: config.commit_every,
        keep: config.keep,
        rounds_done: tokio::sync::Barrier::new(config.clients),
        server_cpu_end: std::sync::Mutex::new(None),
    });
    plan.flags.started.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    // Every connection first: a client that cannot connect stops the run
    // before any allocation.
    let mut clients = Vec::with_capacity(config.clients);
    for _ in 0..config.clients {
        clients.push(connect().await?);
    }
    // A server too old to report its CPU time says 0.
    let server_cpu_start = probe.server_cpu().await.ok().filter(|t| !t.is_zero());
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let plan = Arc::clone(&plan);
        tasks.push(tokio::spawn(
            async move { client_run(client, c, &plan).await },
        ));
    }
    // Every client is awaited, also after one failed (the others stop at
    // their next call), so that each frees its objects.
    let mut runs = Vec::new();
    let mut first_error = None;
    for t in tasks {
        match t.await.map_err(RemoteError::Task).and_then(|r| r) {
            Ok(r) => runs.push(r),
            Err(e) => {
                plan.flags.stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
        }
    }
    plan.flags.clients_done.store(true, Ordering::Relaxed);
    if let Some(e) = first_error {
        return Err(e.into());
    }
    // The run ends with the last client's rounds, before the frees of what
    // was left allocated.
    let wall = runs
        .iter()
        .filter_map(|r| r.finished)
        .max()
        .map_or_else(|| t0.elapsed(), |end| end.duration_since(t0));
    let interrupted = plan.flags.interrupted.load(Ordering::Relaxed);
    let reference = match config.reference {
        Some(engine) => {
            let (setup, order, after) =
                same_order(engine, &runs, config, geometry, dev.meta_blocks);
            let outcome =
                replay_interleaved(&setup, &order, after).map_err(RemoteError::Reference)?;
            Some(SameOrder {
                engine: engine.name(),
                outcome,
            })
        }
        None => None,
    };
    let server_cpu_end = *plan
        .server_cpu_end
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let server_cpu = server_cpu_start
        .zip(server_cpu_end)
        .map(|(a, b)| b.saturating_sub(a));
    let mut report = summarize(
        config,
        &runs,
        block_size,
        timer,
        wall,
        interrupted,
        reference,
    );
    report.server_cpu = server_cpu;
    Ok(report)
}

/// The report of `runs`.
fn summarize(
    config: &RemoteConfig,
    runs: &[ClientRun],
    block_size: u64,
    timer: TimerCalibration,
    wall: Duration,
    interrupted: bool,
    reference: Option<SameOrder>,
) -> RemoteReport {
    // The first failure of any client ends the run, as the first failure
    // ends a local run.
    let util = runs.iter().find_map(|r| r.util_at_failure);
    let at_failure = runs.iter().find_map(|r| r.status_at_failure.clone());
    let quota = runs.iter().find_map(|r| r.quota_at_failure.clone());
    let sum = |f: fn(&ClientRun) -> u64| runs.iter().map(f).sum::<u64>();
    let alloc_ns = latency(runs, |r| &r.alloc_ns, |r| r.alloc_time);
    let stopped = if util.is_some() {
        RemoteStopReason::NoSpace
    } else if quota.is_some() {
        RemoteStopReason::Quota
    } else if interrupted {
        RemoteStopReason::Interrupted
    } else if runs.iter().all(|r| r.ended) {
        RemoteStopReason::EndOfWorkload
    } else {
        RemoteStopReason::Limit
    };
    RemoteReport {
        config: config.clone(),
        block_size,
        allocations: alloc_ns.samples,
        frees: sum(|r| r.frees),
        rounds: runs.iter().map(|r| r.rounds).max().unwrap_or(0),
        stopped,
        utilization_at_first_failure: util,
        device_at_first_failure: at_failure,
        quota_at_first_failure: quota,
        alloc_ns,
        allocate_call_ns: latency(runs, |r| &r.call_ns, |r| r.alloc_time),
        commit_ns: latency(
            runs,
            |r| &r.commit_ns,
            |r| Duration::from_nanos(r.commit_ns.iter().sum()),
        ),
        timer_overhead_ns: timer.pair_ns,
        alloc_time: runs.iter().map(|r| r.alloc_time).sum(),
        allocate_calls: sum(|r| r.allocate_calls),
        free_calls: sum(|r| r.free_calls),
        rpcs: sum(|r| r.allocate_calls + r.leases + r.commit_calls + r.remote_fallbacks),
        commit_secs: runs.iter().map(|r| r.commit_time.as_secs_f64()).sum(),
        wall,
        leases: sum(|r| r.leases),
        commit_calls: sum(|r| r.commit_calls),
        per_call_fallbacks: sum(|r| r.remote_fallbacks),
        server_cpu: None,
        reference,
    }
}

/// A latency summary in JSON: 0 where nothing was measured.
fn latency_json(l: &LatencySummary) -> serde_json::Value {
    serde_json::json!({
        "mean": l.mean.unwrap_or(0.0),
        "p50": l.p50.unwrap_or(0),
        "p99": l.p99.unwrap_or(0),
        "p999": l.p999.unwrap_or(0),
        "max": l.max.unwrap_or(0),
    })
}

/// A latency summary for people.
fn latency_line(l: &LatencySummary) -> String {
    let ns = |n: Option<u64>| units::nanos(n.unwrap_or(0) as f64);
    format!(
        "mean {}  p50 {}  p99 {}  p99.9 {}  max {}",
        units::nanos(l.mean.unwrap_or(0.0)),
        ns(l.p50),
        ns(l.p99),
        ns(l.p999),
        ns(l.max)
    )
}

impl RemoteReport {
    /// The mean time of an allocation, the commits spread over them.
    pub fn ns_per_allocation_with_commit(&self) -> f64 {
        per(
            (self.alloc_time.as_secs_f64() + self.commit_secs) * 1e9,
            self.allocations,
        )
    }

    /// The JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let c = &self.config;
        let w = &c.workload;
        let n = self.allocations;
        let wall = self.wall.as_secs_f64();
        let at_failure = self.device_at_first_failure.as_ref();
        let mut v = serde_json::json!({
            "kind": "remote",
            "remote": c.server,
            "workload": w.kind.name(),
            "lease": c.lease.name(),
            "clients": c.clients,
            "count": c.count,
            "block_size": self.block_size,
            "free_prob": w.free_prob,
            "seed": w.seed,
            "max_ops": c.limits.max_ops,
            "allocations": n,
            "frees": self.frees,
            "rounds": self.rounds,
            "stopped": self.stopped.name(),
            "utilization_at_first_failure": self.utilization_at_first_failure,
            "free_blocks_at_first_failure": at_failure.map(|d| d.free_blocks),
            "leased_unused_blocks_at_first_failure": at_failure.map(|d| d.leased_unused_blocks),
            "largest_free_extent_at_first_failure": at_failure.map(|d| d.largest_free_extent),
            "quota_at_first_failure": self.quota_at_first_failure.as_ref().map(|q| serde_json::json!({
                "tenant": q.tenant,
                "device": q.device,
                "quota_bytes": q.quota_bytes,
                "held_bytes": q.held_bytes,
                "asked_bytes": q.asked_bytes,
            })),
            "alloc_ns": latency_json(&self.alloc_ns),
            "timer_overhead_ns": self.timer_overhead_ns,
            "ns_per_allocation": self.alloc_ns.mean.unwrap_or(0.0),
            "allocate_calls": self.allocate_calls,
            "allocate_call_ns": latency_json(&self.allocate_call_ns),
            "free_calls": self.free_calls,
            "rpcs_per_allocation": per(self.rpcs as f64, n),
            "commit_every": c.commit_every,
            "commit_secs": self.commit_secs,
            "commit_ns": latency_json(&self.commit_ns),
            "ns_per_allocation_with_commit": self.ns_per_allocation_with_commit(),
            "allocations_per_sec": n as f64 / wall,
            "wall_secs": wall,
            "leases": self.leases,
            "commit_calls": self.commit_calls,
            "commit_calls_per_sec": self.commit_calls as f64 / wall,
            "per_call_fallbacks": self.per_call_fallbacks,
            "server_cpu_secs": self.server_cpu.map(|t| t.as_secs_f64()),
            "server_cpu_ns_per_op": self.server_cpu_per_op(),
        });
        if let Some(r) = &self.reference {
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
        v
    }

    /// The server's CPU time per allocation or free of the rounds, in
    /// nanoseconds.
    pub fn server_cpu_per_op(&self) -> Option<f64> {
        let ops = self.allocations + self.frees;
        self.server_cpu
            .filter(|_| ops > 0)
            .map(|t| t.as_nanos() as f64 / ops as f64)
    }

    /// The lines for people, each ending in a newline.
    pub fn render(&self) -> String {
        let c = &self.config;
        let n = self.allocations;
        let wall = self.wall.as_secs_f64();
        let size = |blocks: u64| units::bytes(blocks.saturating_mul(self.block_size));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "remote {}: {}, lease {}, {} client(s), {n} allocations in {} ({:.0}/s)",
            c.server,
            c.workload.kind.name(),
            c.lease.label(),
            c.clients,
            units::duration(self.wall),
            n as f64 / wall
        );
        let _ = writeln!(out, "  allocate   {}", latency_line(&self.alloc_ns));
        if c.lease == LeaseMode::Off {
            let _ = writeln!(
                out,
                "  calls      {} Allocate of up to {} objects ({:.4} per allocation): {}",
                self.allocate_call_ns.samples,
                c.count,
                per(self.rpcs as f64, n),
                latency_line(&self.allocate_call_ns)
            );
        }
        let _ = writeln!(
            out,
            "  commits    {} in {} calls ({:.0}/s); with commits {} per allocation",
            units::nanos(self.commit_secs * 1e9),
            self.commit_calls,
            self.commit_calls as f64 / wall,
            units::nanos(self.ns_per_allocation_with_commit())
        );
        if self.commit_ns.samples > 0 {
            let _ = writeln!(out, "  commit     {}", latency_line(&self.commit_ns));
        }
        if let (Some(t), Some(per_op)) = (self.server_cpu, self.server_cpu_per_op()) {
            let _ = writeln!(
                out,
                "  server     {} CPU, {} per allocation or free ({} per-call fallbacks)",
                units::duration(t),
                units::nanos(per_op),
                self.per_call_fallbacks
            );
        }
        if let (Some(u), Some(d)) = (
            self.utilization_at_first_failure,
            &self.device_at_first_failure,
        ) {
            let _ = writeln!(
                out,
                "  stopped    no space at utilisation {u:.5}: {} free (longest run {}), {} leased unused",
                size(d.free_blocks),
                size(d.largest_free_extent),
                size(d.leased_unused_blocks)
            );
        }
        if let Some(q) = &self.quota_at_first_failure {
            let _ = writeln!(
                out,
                "  stopped    over quota: tenant {:?} on device {:?} has a quota of {}; \
                 it held {} (allocated or leased) and asked {} more",
                q.tenant,
                q.device,
                units::bytes(q.quota_bytes),
                units::bytes(q.held_bytes),
                units::bytes(q.asked_bytes)
            );
        }
        if let Some(r) = &self.reference {
            let _ = writeln!(
                out,
                "  reference  {}",
                r.line(self.utilization_at_first_failure)
            );
        }
        out
    }
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
    let max_obj = MAX_OBJECT_BYTES.div_ceil(block_size);
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
/// `keep`, so that a run leaves the server as it found it.
async fn client_run(
    client: Client,
    index: usize,
    plan: &RunPlan,
) -> Result<ClientRun, RemoteError> {
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
        plan.flags.stop.store(true, Ordering::Relaxed);
    }
    if plan.rounds_done.wait().await.is_leader() {
        if let Ok(t) = client.server_cpu().await {
            *plan
                .server_cpu_end
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(t);
        }
    }
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
        closed.map_err(RemoteError::Free)?;
    } else {
        ran?;
    }
    freed.map_err(RemoteError::Free)?;
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
) -> Result<(), RemoteError> {
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
    // Leased allocations since the last commit, for `commit_every`.
    let mut uncommitted = 0u32;
    loop {
        if plan.stopping() {
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
            if plan.stopping() {
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
                if plan.stop_first() {
                    r.quota_at_failure = Some(q);
                }
                failed = true;
                break;
            }
            if let Batch::NoSpace(refusal) = batch {
                if plan.stop_first() {
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
        if failed || plan.stopping() {
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
                for chunk in to_free.chunks(MAX_COUNT as usize) {
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

/// The reference engine's figure for a remote run: the clients' requests
/// replayed through it in the order they were made.
#[derive(Clone, Debug)]
pub struct SameOrder {
    /// The engine's name.
    pub engine: &'static str,
    /// What the replay found.
    pub outcome: Interleaved,
}

impl SameOrder {
    /// The engine, given the server's requests up to its first failure,
    /// refused the very request the server refused next.
    pub fn refused_the_same_request(&self) -> bool {
        let o = &self.outcome;
        o.utilization_at_first_failure.is_some() && !o.failed_within_order && o.ops_after_order == 1
    }

    /// The human line: the engine's utilisation at its first failure and the
    /// service's distance from it.
    pub fn line(&self, service: Option<f64>) -> String {
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

/// The replay of every client's requests in the order they were made (a
/// stable merge of the clients' timestamps) through `engine` over the
/// server's device; after a run that ended for lack of space, it goes on
/// with the clients' streams in turn until the engine fails too.
fn same_order(
    engine: BenchEngine,
    runs: &[ClientRun],
    config: &RemoteConfig,
    geometry: Geometry,
    metadata_blocks: u64,
) -> (Interleave, Vec<u32>, After) {
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
        spec: config.workload,
        geometry,
        metadata_blocks,
        workers: runs.len() as u32,
        limits: config.limits,
    };
    (setup, order, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: LeaseMode) -> RemoteConfig {
        RemoteConfig {
            server: "127.0.0.1:1".into(),
            workload: WorkloadSpec::default(),
            limits: Limits::default(),
            lease,
            clients: 1,
            count: 1,
            commit_every: None,
            keep: false,
            reference: None,
        }
    }

    #[test]
    fn lease_modes_parse_and_name_themselves() {
        assert_eq!("off".parse(), Ok(LeaseMode::Off));
        assert_eq!("auto".parse(), Ok(LeaseMode::Auto));
        assert_eq!("64MiB".parse(), Ok(LeaseMode::Size(64 << 20)));
        assert_eq!(LeaseMode::Size(64 << 20).name(), "64MiB");
        assert_eq!(LeaseMode::Off.label(), "off");
        for bad in ["lots", "0", ""] {
            let e = bad.parse::<LeaseMode>().unwrap_err();
            assert_eq!(e, UnknownLease(bad.into()));
            assert!(
                e.to_string().contains("expected off, auto or a size"),
                "{e}"
            );
        }
    }

    #[test]
    fn check_refuses_what_does_not_go_together() {
        use RemoteConfigError as E;
        let off = config(LeaseMode::Off);
        let auto = config(LeaseMode::Auto);
        assert_eq!(off.check(), Ok(()));
        assert_eq!(auto.check(), Ok(()));
        for (c, want) in [
            (
                RemoteConfig {
                    clients: 0,
                    ..off.clone()
                },
                E::Clients(0),
            ),
            (
                RemoteConfig {
                    clients: MAX_CLIENTS + 1,
                    ..off.clone()
                },
                E::Clients(1025),
            ),
            (
                RemoteConfig {
                    count: 0,
                    ..off.clone()
                },
                E::Count(0),
            ),
            (
                RemoteConfig {
                    count: MAX_COUNT + 1,
                    ..off.clone()
                },
                E::Count(4097),
            ),
            (
                RemoteConfig {
                    count: 16,
                    ..auto.clone()
                },
                E::CountLeased(16),
            ),
            (
                RemoteConfig {
                    commit_every: Some(0),
                    ..auto.clone()
                },
                E::CommitEveryZero,
            ),
            (
                RemoteConfig {
                    commit_every: Some(2),
                    ..off.clone()
                },
                E::CommitEveryPerCall(2),
            ),
        ] {
            assert_eq!(c.check(), Err(want));
        }
        let batched = RemoteConfig {
            count: MAX_COUNT,
            ..off
        };
        assert_eq!(batched.check(), Ok(()));
        let committed = RemoteConfig {
            commit_every: Some(1),
            clients: MAX_CLIENTS,
            ..auto
        };
        assert_eq!(committed.check(), Ok(()));
    }

    #[test]
    fn the_op_budget_grants_exactly_its_operations() {
        let b = OpBudget::new(Some(10));
        assert_eq!(b.take(4), 4);
        assert!(!b.exhausted());
        assert_eq!(b.take(8), 6);
        assert!(b.exhausted());
        assert_eq!(b.take(1), 0);
        let free = OpBudget::new(None);
        assert_eq!(free.take(u64::MAX), u64::MAX);
        assert!(!free.exhausted());
    }

    #[test]
    fn an_interrupt_stops_only_a_run_whose_clients_are_running() {
        let stop = RemoteStop::new();
        // Still reaching the server: nothing to stop.
        assert!(!stop.interrupt());
        assert!(!stop.0.stop.load(Ordering::Relaxed));
        stop.0.started.store(true, Ordering::Relaxed);
        assert!(stop.interrupt());
        assert!(stop.0.stop.load(Ordering::Relaxed));
        assert!(stop.0.interrupted.load(Ordering::Relaxed));
        let done = RemoteStop::new();
        done.0.started.store(true, Ordering::Relaxed);
        done.0.clients_done.store(true, Ordering::Relaxed);
        assert!(!done.interrupt());
        assert!(!done.0.interrupted.load(Ordering::Relaxed));
    }

    #[test]
    fn the_report_summarises_every_client_with_the_shared_histograms() {
        let run = |alloc_ns: Vec<u64>, rounds| ClientRun {
            alloc_time: Duration::from_nanos(alloc_ns.iter().sum()),
            call_ns: alloc_ns.clone(),
            alloc_ns,
            allocate_calls: 3,
            rounds,
            ..ClientRun::default()
        };
        let runs = [run(vec![100, 200, 300], 2), run(vec![400, 500, 600], 3)];
        let r = summarize(
            &config(LeaseMode::Off),
            &runs,
            4096,
            TimerCalibration::ZERO,
            Duration::from_secs(1),
            false,
            None,
        );
        assert_eq!(r.allocations, 6);
        assert_eq!(r.rounds, 3);
        assert_eq!(r.stopped, RemoteStopReason::Limit);
        let v = r.to_json();
        assert_eq!(v["alloc_ns"]["mean"], 350.0);
        assert_eq!(v["alloc_ns"]["p50"], 300);
        assert_eq!(v["alloc_ns"]["max"], 600);
        assert_eq!(v["allocate_calls"], 6);
        assert_eq!(v["rpcs_per_allocation"], 1.0);
        // Nothing measured reads as zeros, not nulls.
        assert_eq!(
            v["commit_ns"],
            serde_json::json!({"mean": 0.0, "p50": 0, "p99": 0, "p999": 0, "max": 0})
        );
        let text = r.render();
        assert!(text.starts_with("remote 127.0.0.1:1: "), "{text}");
        assert!(
            text.contains("  calls      6 Allocate of up to 1 objects"),
            "{text}"
        );
        assert!(!text.contains("  commit     "), "{text}");
    }
}
