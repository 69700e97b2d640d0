//! Raw flags of `blockalloc bench` (clap derive, no I/O).

use blockalloc::{ByteSize, EngineKind};
use blockalloc_bench::{AgingSpec, ChurnSpec, SizeSpec, WorkloadName, PEER_NAMES, SAMPLE_STRIDE};
use clap::{Args, ValueEnum};

pub use crate::args::ModeArg;

/// `bench --reference`: an engine whose packing every report shows beside
/// its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReferenceArg {
    /// Plain best fit with immediate coalescing (the `best-fit` engine).
    BestFit,
    /// The recommended engine, the one a server runs (`segfit`).
    Segfit,
}

fn engine_help() -> String {
    format!(
        "Engines to run: NAME[,NAME...] or all.\n\
         Core engines: {}. Peers (builds with --features peers only): {}.\n\
         Reference engines: best-fit (plain best fit with coalescing), \
         pool-compact (pool compacting when an allocation fails).\n\
         `all` runs every engine of this build.",
        EngineKind::names().join(", "),
        PEER_NAMES.join(", ")
    )
}

/// Flags of `blockalloc bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Device size, e.g. 16TiB, 2TiB, 1GiB (rounded down to whole blocks).
    #[arg(long, value_name = "SIZE", default_value = "16TiB")]
    pub capacity: ByteSize,

    /// Block size: a power of two from 512B to 1GiB.
    #[arg(long, value_name = "SIZE", default_value = "4KiB")]
    pub block_size: ByteSize,

    /// Allocation requests per round (1 to 10000000).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub round_size: u64,

    /// Probability in [0, 1] that an object is freed at the end of its round
    /// (seed workload; ignored by shift).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.5,
        allow_negative_numbers = true
    )]
    pub free_prob: f64,

    /// Object sizes (seed workload, the fill phases of aging, churn; ignored
    /// by shift, fill-shift and lognormal): uniform:MIN..MAX
    /// (bytes, both ends included), fixed:SIZE, lognormal:MEDIAN:SIGMA
    /// (capped at 4MiB), or a weighted mix of up to four of those,
    /// mix:W*DIST+W*DIST (e.g. mix:3*fixed:64KiB+1*uniform:1MiB..4MiB).
    /// Sizes take units: 1B, 4KiB, 1.5MiB, 10MB. Default: uniform:1B..4MiB
    /// (churn: lognormal:32KiB:1).
    #[arg(long, value_name = "DIST")]
    pub sizes: Option<SizeSpec>,

    /// contiguous: one extent per object; scattered: allocate_scattered,
    /// any number of extents.
    #[arg(long, value_enum, default_value_t = ModeArg::Contiguous)]
    pub mode: ModeArg,

    /// Engines to run (see `engine_help`).
    #[arg(
        long,
        value_name = "ENGINES",
        default_value_t = EngineKind::default().name().to_string(),
        help = engine_help()
    )]
    pub engine: String,

    /// Workload: seed (stationary rounds), shift, fill-shift, aging,
    /// lognormal[:MEDIAN:SIGMA] or churn (see above).
    #[arg(long, value_name = "NAME", default_value = "seed")]
    pub workload: WorkloadName,

    /// aging: the share of the device each fill phase fills to, in (0, 1].
    #[arg(long, value_name = "F", default_value_t = AgingSpec::default().high, allow_negative_numbers = true)]
    pub aging_high: f64,

    /// aging: the share of the device each delete phase deletes down to, at
    /// least 0 and below --aging-high.
    #[arg(long, value_name = "F", default_value_t = AgingSpec::default().low, allow_negative_numbers = true)]
    pub aging_low: f64,

    /// aging: fill/delete cycles before the large objects (at least 1).
    #[arg(long, value_name = "N", default_value_t = AgingSpec::default().cycles)]
    pub aging_cycles: u32,

    /// aging: sizes of the final phase's objects (a size distribution as
    /// for --sizes).
    #[arg(long, value_name = "DIST", default_value_t = AgingSpec::default().large)]
    pub aging_large: SizeSpec,

    /// churn: the share of the device kept live, in (0, 1].
    #[arg(long, value_name = "F", default_value_t = ChurnSpec::default().fill, allow_negative_numbers = true)]
    pub churn_fill: f64,

    /// churn: blocks allocated after the fill before the workload ends, in
    /// capacities (0 to 1e6).
    #[arg(long, value_name = "K", default_value_t = ChurnSpec::default().volume, allow_negative_numbers = true)]
    pub churn_volume: f64,

    /// Also run this engine over the same request stream and show its
    /// utilisation at the first failure beside every engine's (a column of
    /// the table; a `reference` object in each JSON line). With --remote:
    /// the clients' requests, in the order they made them, through this
    /// engine in-process, then the clients' streams in turn until it fails
    /// (segfit is the server's engine).
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub reference: Option<ReferenceArg>,

    /// Seed of the workload's random stream; the same seed gives every
    /// engine, and every run, the same requests.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Stop each engine after N whole rounds.
    #[arg(long, value_name = "N")]
    pub max_rounds: Option<u64>,

    /// Stop each engine after N operations (allocate + free calls; with
    /// --device, checked before every transaction; with --threads or
    /// --remote, the operations of all threads or clients together: each
    /// allocation and each free takes one from a budget they share, so the
    /// run makes exactly N unless it stops earlier).
    #[arg(long, value_name = "N")]
    pub max_ops: Option<u64>,

    /// Stop each engine after SECS seconds (checked every 256 operations;
    /// with --device, before every transaction).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub time_limit: Option<f64>,

    /// Write JSON Lines, one object per engine run: `--json` alone or
    /// `--json -` to stdout (the table then goes to stderr), `--json PATH`
    /// to a file.
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,

    /// Call the engine's verify() after every round (slow; for small runs).
    #[arg(long)]
    pub verify: bool,

    /// Run the workload from N threads at once against one shared allocator
    /// (the recommended engine behind per-thread arenas); a list such as
    /// 1,2,8 runs each count in turn and reports the speed-up over 1 thread.
    /// Each thread runs its own copy of the workload (seed + thread index)
    /// with rounds of round-size / N requests.
    #[arg(long, value_name = "N[,N...]")]
    pub threads: Option<String>,

    /// Tunables of `--threads` runs.
    #[command(flatten)]
    pub tunables: ThreadTunables,

    /// Run the workload durably on a formatted device (see `blockalloc
    /// format`): transactions of --batch operations, committed from
    /// --threads threads; reports commits/s, commit latency, and the time to
    /// reopen the device after a crash and after a clean close.
    #[arg(long, value_name = "PATH", group = "target")]
    pub device: Option<std::path::PathBuf>,

    /// Run the workload (--workload, any of them) against an allocation
    /// server (`blockalloc serve`) at ADDR (host:port), on its first
    /// device, and report the latency of each allocation and of the
    /// commits.
    #[arg(
        long,
        value_name = "ADDR",
        group = "target",
        conflicts_with_all = ["device", "threads", "record", "plot"]
    )]
    pub remote: Option<String>,

    /// With --remote: off (every allocation is an RPC), auto (the client
    /// leases regions, sized by the server, and allocates inside them
    /// locally), or a lease size such as 64MiB.
    #[arg(
        long,
        value_name = "off|auto|SIZE",
        default_value = "auto",
        requires = "remote"
    )]
    pub lease: String,

    /// With --remote: clients (connections) running at once, each with its
    /// own leases and its own copy of the workload.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "remote")]
    pub clients: usize,

    /// With --remote --lease off: objects per Allocate call, 1 to 4096 (the
    /// server's default batch limit). An Allocate asks for `count` objects
    /// of one size, so each client takes its round's next N requests and
    /// sends one call per distinct size among them: the requests, and so
    /// the sizes asked for, stay the same for every N, and a run compares
    /// with a --count 1 run of the same seed. With a fixed size (--sizes
    /// fixed:64KiB) that is one call per N objects; with a distribution,
    /// sizes rarely repeat within a batch and the calls stay near one per
    /// object (see rpcs_per_allocation). An object's cost (alloc_ns) is its
    /// call's time divided by the objects the call returned; each call's
    /// own round trip is allocate_call_ns. A batch refused for lack of space
    /// is retried one object at a time, so the run stops at the first
    /// single allocation the server cannot serve, whatever N.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "remote")]
    pub count: u32,

    /// With --remote and leases: commit after every N leased allocations
    /// (1 makes each object durable before the next is allocated), instead
    /// of once at the end of each round. Each commit call is timed
    /// (commit_ns); commits per second are commit_calls_per_sec.
    #[arg(long, value_name = "N", requires = "remote")]
    pub commit_every: Option<u32>,

    /// With --remote: TLS and plaintext settings.
    #[command(flatten)]
    pub connect: crate::ops_args::ConnectArgs,

    /// With --device: allocations (or frees) per transaction.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "device")]
    pub batch: usize,

    /// With --device: write each object's blocks before committing it.
    #[arg(long, requires = "device")]
    pub write_data: bool,

    /// With --device or --remote: leave the run's objects allocated at the
    /// end (for `inspect` or `status`); by default they are freed, leaving
    /// the device as the run found it.
    #[arg(long, requires = "target")]
    pub keep: bool,

    /// Record the operation stream as a trace (binary, or CSV for a .csv
    /// name) for `blockalloc replay`. The engines run prefixes of one
    /// deterministic stream; the trace holds the longest: up to where the
    /// engine that went furthest stopped (including the allocation that
    /// failed, so a replay fails at the same request).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["device", "threads"])]
    pub record: Option<std::path::PathBuf>,

    /// Write an SVG plot: utilisation and time per round as the device
    /// fills, one line per engine.
    #[arg(long, value_name = "FILE.svg", conflicts_with = "device")]
    pub plot: Option<std::path::PathBuf>,

    /// Print a line per round.
    #[arg(long, short, conflicts_with = "quiet")]
    pub verbose: bool,

    /// No progress bar and no table (warnings and errors still go to stderr).
    #[arg(long, short)]
    pub quiet: bool,
}

/// Asserts at compile time that the help text's "1 in 16" stays true.
const _: () = assert!(SAMPLE_STRIDE == 16);

/// `bench --threads` tunables: the shared handle's configuration and how
/// often the list of thread counts runs. Each needs `--threads` (the group
/// says so once for all) and none goes with `--device`.
#[derive(Args, Debug, Clone)]
#[group(multiple = true, requires = "threads")]
pub struct ThreadTunables {
    /// With --threads: the region a thread arena leases from the shared pool
    /// and hands back, as a size (e.g. 64MiB; a power-of-two number of
    /// blocks). Default: 1/256 of the device, between 4096 and 262144
    /// blocks (16 MiB and 1 GiB at 4 KiB blocks).
    #[arg(long, value_name = "SIZE", conflicts_with = "device")]
    pub region_size: Option<ByteSize>,

    /// With --threads: entirely free regions a thread arena keeps before
    /// handing the extra ones back to the pool (the high-water mark).
    /// Default: 2.
    #[arg(long, value_name = "N", conflicts_with = "device")]
    pub keep_empty_regions: Option<usize>,

    /// With --threads: thread arenas (caches); threads beyond this share
    /// them. Default: 64.
    #[arg(long, value_name = "N", conflicts_with = "device")]
    pub arenas: Option<usize>,

    /// With --threads: run the whole list of thread counts N times, one pass
    /// after the other, and summarise each count by its median throughput
    /// and its median ratio to the previous count within a pass. A single
    /// one-second run on a shared machine varies by ±10 %; the median of
    /// interleaved passes does not. Default: 1.
    #[arg(long, value_name = "N", conflicts_with = "device")]
    pub repeat: Option<u32>,
}
