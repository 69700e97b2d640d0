//! Raw command-line flags (clap derive). No I/O and no cross-flag rules
//! here: each flag is parsed on its own; `bench::settings` validates them
//! together.

use blockalloc::{ByteSize, EngineKind};
use blockalloc_bench::{AgingSpec, ChurnSpec, SizeSpec, WorkloadName, PEER_NAMES, SAMPLE_STRIDE};
use std::ffi::OsString;

use clap::error::ErrorKind;

pub use crate::args::ModeArg;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Space allocators for storage systems with lots of small files.
#[derive(Debug, Parser)]
#[command(
    name = "blockalloc",
    version,
    propagate_version = true,
    after_long_help = crate::error::exit_status_help()
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Parses the command line like `Cli::try_parse_from`, with one rule clap
/// cannot express: `--json` takes an optional value, so in
/// `replay --json TRACE` clap reads TRACE as the JSON path and then misses
/// the trace. When a required argument is missing and a bare `--json` is
/// followed by a value, that value is taken as the positional argument and
/// JSON goes to stdout (`--json=PATH` always names the JSON file).
///
/// # Errors
/// clap's error for the original command line when neither reading works.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    match Cli::try_parse_from(&args) {
        Err(e) if e.kind() == ErrorKind::MissingRequiredArgument => {
            let took_positional = args.iter().rposition(|a| a == "--json").filter(|&i| {
                args.get(i + 1)
                    .is_some_and(|v| !v.is_empty() && !v.to_string_lossy().starts_with('-'))
            });
            if let Some(i) = took_positional {
                let mut fixed = args.clone();
                fixed.insert(i + 1, OsString::from("-"));
                if let Ok(cli) = Cli::try_parse_from(&fixed) {
                    return Ok(cli);
                }
            }
            Err(e)
        }
        other => other,
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run allocation workloads against engines and compare them.
    #[command(long_about = bench_about(), after_long_help = bench_after())]
    Bench(Box<BenchArgs>),
    /// Create a device (file or block device) holding an empty durable store.
    Format(crate::device::args::FormatArgs),
    /// Show a device's geometry, space, free-space histogram, fragmentation,
    /// journal and checkpoints (writes nothing; runs beside a writer).
    Inspect(crate::device::args::InspectArgs),
    /// Check a device's consistency in full (writes nothing; runs beside a
    /// writer); exit code 0 only when consistent, 4 when not, 6 when
    /// consistent but a damaged journal tail was discarded (format version 1).
    #[command(after_long_help = CHECK_AFTER)]
    Check(crate::device::args::CheckArgs),
    /// Free the space no live object owns: give the live extents of your
    /// object index (one `start,len` per line, in blocks, sorted) and every
    /// other allocation outside the metadata is freed. Exit code 2 for a
    /// malformed list, 4 when the list names free space.
    #[command(after_long_help = crate::device::reconcile::AFTER_HELP)]
    Reconcile(crate::device::args::ReconcileArgs),
    /// Make, convert and inspect allocation traces (gen, convert, info).
    Trace(crate::trace::args::TraceArgs),
    /// Replay a trace through engines; with --verify, check every byte of
    /// every object on a device.
    #[command(
        long_about = crate::replay::args::REPLAY_ABOUT,
        after_long_help = crate::replay::args::replay_after()
    )]
    Replay(crate::replay::args::ReplayArgs),
    /// Serve devices over gRPC: per-call allocation and leases for
    /// client-side allocation (see
    /// crates/proto/proto/blockalloc/v1/allocator.proto).
    Serve(crate::serve::ServeArgs),
    /// Show a running server's devices (space, leases, fragmentation) and
    /// its live leases (client, size, age, expiry).
    Status(crate::status::StatusArgs),
    /// Make bearer tokens for the tenants of `serve --config`.
    Token(crate::serve::TokenArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell).
    Completions(crate::manual::args::CompletionsArgs),
    /// Print the manual page (roff), or write one page per subcommand into
    /// --out-dir.
    Man(crate::manual::args::ManArgs),
}

const BENCH_ABOUT_HEAD: &str = "\
Run allocation workloads against engines and compare them.

Every engine runs, one after another in this process, over the identical
request stream (deterministic given --seed). A run stops at the first failed
allocation (stopped = no_space; the utilisation at that moment is reported),
when a limit hits, or when a workload that ends by itself (churn) ends
(stopped = end_of_workload).

WORKLOADS
";

const BENCH_ABOUT_TAIL: &str = "
Each request is rounded up to whole blocks, at least one block.

HOW LATENCY IS MEASURED
  Timing every operation would add ~40 ns (an Instant::now() pair) to a
  ~50 ns operation. Instead each round's allocation loop and free loop are
  timed as wholes: mean = loop time / operations. One operation in 16 (fixed
  stride) is also timed individually with an Instant::now() pair; the cost of
  an empty pair, calibrated at start-up (median of 20001), is subtracted from
  each sample (and from the loop times), and the samples go into an HDR
  histogram for p50 / p99 / p99.9 / max, overall and per fill level (decile
  of used/capacity before the operation). Mops/s = allocate+free calls per
  second spent in those loops.";

const CHECK_AFTER: &str = "\
OUTPUT
  Text for people; with --json exactly one JSON object, also when the device
  cannot be opened or recovered (then \"error\": {message, class, exit_code}).
  Fields: device, consistent, problems, notes, used_blocks, free_blocks,
  free_extents, journal_entries_replayed, journal_tail_discarded,
  discarded_entry {seq, bytes, reason, torn_write}, closed_cleanly,
  format_version, in_use_by_writer, writer_pid, error.

EXIT STATUS
  0 consistent (the write in flight at a crash, torn, is discarded and
  noted: torn_write true); 1 an I/O error; 2 not a store, or truncated;
  4 corrupt or inconsistent, a journal entry damaged after it was written
  included; 6 consistent, but recovery discarded a damaged last journal
  entry of a format version 1 store: the write in flight at a crash, or a
  committed transaction lost to later damage (version 1 cannot tell them
  apart; a writable open upgrades the store).";

/// The after-help of `bench`: output (its JSON fields from the contract),
/// exit status, examples.
fn bench_after() -> String {
    format!(
        "{BENCH_AFTER_HEAD}\n{}, and more.\n{BENCH_AFTER_TAIL}",
        crate::help::paragraph(&crate::help::contract_fields())
    )
}

const BENCH_AFTER_HEAD: &str = "\
OUTPUT
  People: a progress bar per engine on stderr (hidden when stderr is not a
  terminal, and with --quiet), a line per round with --verbose, and a final
  comparison table. Machines: --json writes JSON Lines, one object per engine
  run, with the fields";

const BENCH_AFTER_TAIL: &str = "\
  `--json PATH` writes them to a file; `--json` alone or `--json -` to
  stdout, and then the table goes to stderr so that stdout carries only
  JSON. A closed stdout (`| head`) ends the command quietly with status 0.

  Peak RSS is the process's VmHWM, reset before each engine; it includes the
  harness's object map. Engine memory is the engine's own memory_bytes().

EXIT STATUS
  0 every engine ran (engines that cannot serve the device are skipped with a
    warning); 1 an I/O error; 2 bad flags or values, or no engine could run;
  3 an engine failed (--verify found a broken invariant, or an engine
    refused a valid request); 5 (--device) the device is in use by another
    writer (a device has one writer at a time).

EXAMPLES
  blockalloc bench
  blockalloc bench --engine all --capacity 2TiB --round-size 10000 --time-limit 60
  blockalloc bench --workload shift --engine segfit,pool --json results.jsonl
  blockalloc bench --workload aging --capacity 64GiB --round-size 10000 --engine segfit,pool --reference best-fit
  blockalloc bench --workload churn --capacity 64GiB --engine segfit --reference best-fit
  blockalloc bench --capacity 1GiB --round-size 1000 --verify --verbose";

/// The long help of `bench`, its WORKLOADS section from the workload
/// registry.
fn bench_about() -> String {
    format!(
        "{BENCH_ABOUT_HEAD}{}{BENCH_ABOUT_TAIL}",
        crate::help::workloads()
    )
}

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
    /// (bytes, both ends included), fixed:SIZE, or lognormal:MEDIAN:SIGMA
    /// (capped at 4MiB). Sizes take units: 1B, 4KiB, 1.5MiB, 10MB.
    /// Default: uniform:1B..4MiB (churn: lognormal:32KiB:1).
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
