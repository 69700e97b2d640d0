//! Raw flags of `blockalloc trace convert|gen|info` (clap derive, no I/O).

use std::path::PathBuf;

use blockalloc::ByteSize;
use blockalloc_bench::{SizeSpec, WorkloadName};
use blockalloc_trace::TraceFormat;
use clap::{Args, Subcommand};

/// `blockalloc trace …`.
#[derive(Debug, Args)]
#[command(long_about = TRACE_ABOUT, after_long_help = TRACE_AFTER)]
pub struct TraceArgs {
    /// What to do with traces.
    #[command(subcommand)]
    pub command: TraceCommand,
}

pub const TRACE_ABOUT: &str = "\
Make, convert and inspect allocation traces.

A trace is the stream of allocations and frees of a run: `alloc OBJECT BYTES`,
`free OBJECT`, and optional round markers. `blockalloc replay` runs a trace
through every engine, and with --verify checks every byte of every object on
a device. Traces come from `bench --record`, from `trace gen`, or from your
own storage logs as CSV.";

pub const TRACE_AFTER: &str = "\
FORMATS
  binary  Compact and checksummed: a versioned header (block size, capacity,
          key=value metadata), then chunks of up to 64 KiB of operations
          (object ids delta + zigzag + varint encoded, sizes as varints,
          2-4 bytes per operation) each with a CRC-32C, then an end marker
          with the totals. Streams: tens of millions of operations never sit
          in memory. Damage is reported with its byte offset.
  csv     One operation per line, for traces made from logs:
              op,object,bytes
              alloc,17,40960
              free,17,
              round,,1
          The header line is optional; objects are decimal or 0x-hex u64
          ids (reusable once freed); sizes are bytes (units allowed: 4KiB).
          `round` ends a round (third field: phase, default 1). Leading
          comments `# key=value` are metadata; `# block_size=4096` and
          `# capacity_bytes=1073741824` give replay its defaults.
  Readers recognise the format by content; writers choose by --format or
  the output's extension (.csv is CSV, anything else binary).

EXAMPLES
  blockalloc trace gen --workload churn --capacity 64GiB -o churn.trace
  blockalloc trace gen --workload lognormal:64KiB:1.5 --capacity 1TiB --round-size 10000 -o ln.trace
  blockalloc trace convert mylog.csv -o mylog.trace
  blockalloc trace info churn.trace";

/// The trace subcommands.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Convert a trace between the binary and CSV formats (streaming).
    Convert(ConvertArgs),
    /// Write a built-in workload to a trace file without running an engine.
    #[command(long_about = gen_about())]
    Gen(Box<GenArgs>),
    /// Check a trace and summarise it: header, counts, sizes, peak live data.
    Info(InfoArgs),
}

/// Flags of `trace convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The trace to read (binary or CSV, recognised by content); - for stdin.
    #[arg(value_name = "INPUT")]
    pub input: PathBuf,

    /// Where to write; - for stdout.
    #[arg(long, short, value_name = "OUTPUT")]
    pub output: PathBuf,

    /// Output format: binary or csv. Default: by the output's extension
    /// (.csv is CSV); for stdout, the other format than the input's.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<TraceFormat>,
}

/// The long help of `trace gen`, its WORKLOADS section from the workload
/// registry.
pub fn gen_about() -> String {
    format!(
        "{GEN_ABOUT_HEAD}{}{GEN_ABOUT_TAIL}",
        crate::help::workloads()
    )
}

const GEN_ABOUT_HEAD: &str = "\
Write a built-in workload to a trace file without running an engine: the
operations `bench` runs, in the same order. (In trace gen, the churn flags
are --fill and --volume; --churn-fill and --churn-volume are accepted too.
aging runs with its default marks: 90%, 50%, 4 cycles, uniform:3MiB..4MiB.)

WORKLOADS
";

const GEN_ABOUT_TAIL: &str = "
WHERE A TRACE ENDS
  Nothing fails without an engine, so a rule ends the trace: at the first
  allocation that no allocator could serve - the one that makes the live
  blocks exceed the capacity. It is the trace's last operation; every engine
  replaying the trace on this capacity runs out of space at or before it, as
  in `bench`. A workload that ends by itself (churn: once the blocks
  allocated after the fill reach --volume times the capacity) ends the
  trace there if nothing impossible came first. --max-ops N ends any trace
  after N allocations and frees.

Sizes are written in whole blocks of --block-size (as bench requests them);
the header records the capacity, block size and workload parameters.";

/// Flags of `trace gen`.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// Workload: seed, shift, fill-shift, aging, lognormal (or
    /// lognormal:MEDIAN:SIGMA) or churn.
    #[arg(long, value_name = "NAME", default_value = "seed")]
    pub workload: WorkloadName,

    /// Device size the trace is made for, e.g. 1GiB, 2TiB.
    #[arg(long, value_name = "SIZE")]
    pub capacity: ByteSize,

    /// Block size: a power of two from 512B to 1GiB.
    #[arg(long, value_name = "SIZE", default_value = "4KiB")]
    pub block_size: ByteSize,

    /// Seed of the random stream.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Allocation requests per round (churn: frees per round after the fill).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub round_size: u64,

    /// Probability in [0, 1] that an object is freed at the end of its round
    /// (seed, lognormal).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub free_prob: Option<f64>,

    /// Object sizes (seed, churn, aging): uniform:MIN..MAX, fixed:SIZE,
    /// lognormal:MEDIAN:SIGMA or mix:W*DIST+W*DIST.
    #[arg(long, value_name = "DIST")]
    pub sizes: Option<SizeSpec>,

    /// churn: fraction of the capacity kept live, in (0, 1].
    #[arg(
        long,
        visible_alias = "churn-fill",
        value_name = "F",
        allow_negative_numbers = true
    )]
    pub fill: Option<f64>,

    /// churn: blocks allocated after the fill, in capacities.
    #[arg(
        long,
        visible_alias = "churn-volume",
        value_name = "K",
        allow_negative_numbers = true
    )]
    pub volume: Option<f64>,

    /// End the trace after N allocations and frees.
    #[arg(long, value_name = "N")]
    pub max_ops: Option<u64>,

    /// Output format: binary or csv (default: by the output's extension).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<TraceFormat>,

    /// The trace file to write; - for stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
}

/// Flags of `trace info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The trace (binary or CSV); - for stdin.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Block size for the peak live blocks (default: the trace's, else 4KiB).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<ByteSize>,

    /// Write the summary as one JSON object: `--json` alone or `--json -`
    /// to stdout instead of the text, `--json PATH` to a file (the text
    /// still goes to stdout).
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,
}
