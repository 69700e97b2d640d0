//! Raw flags of `blockalloc replay` (clap derive, no I/O).

use std::path::PathBuf;

use blockalloc::ByteSize;
use clap::Args;

use crate::args::ModeArg;

pub const REPLAY_ABOUT: &str = "\
Replay a trace through engines and compare them; with --verify, check every
byte of every object on a device.

Every engine replays the identical operation stream, one after another in
this process. The trace is read twice per engine at most and never held in
memory: first one validating pass (counts for the progress bar; a free of an
object that is not live, or an allocation of a live id, is an error naming
the operation), then one pass per engine. A trace without allocations or
frees is refused (exit 2): there is nothing to replay.

Sizes become whole blocks of --block-size (rounded up, at least one block:
a zero-byte allocation takes one block).
A run stops at the first allocation that fails for lack of space
(stopped = no_space, with the utilisation at that moment), as in `bench`;
with --keep-going it counts the failures and goes on, skipping the frees of
the objects that got no space. Otherwise it ends with the trace
(stopped = end_of_trace) or at a limit.

ROUNDS
  Per-round times and utilisation (the JSON's per_round, the plot) follow the
  trace's round markers; --round-ops N makes a round of every N requests
  instead (the default when the trace has no markers: about 200 rounds).

DATA VERIFICATION (--verify)
  Pattern write and read-back. Each allocated block is written with a
  pattern derived from (object, block of the object, byte): 16 bytes naming
  the object and block, then a hash stream. Before each free the object is
  read back and compared byte by byte; at the end every live object is. The
  first difference stops the engine's run with an error naming the object,
  its block (index in the object and device block number), the byte offset,
  the bytes expected and found, and whose data the block holds instead (for
  a block handed out twice: the other object). The engine's own verify() is
  also called at the end. Data throughput is reported. The device is
  --device PATH (created and sized if missing; an existing non-empty file or
  block device needs --force: its content is overwritten), or a temporary
  sparse file.

HOW LATENCY IS MEASURED
  As in `bench`: runs of consecutive allocations (or frees) are timed as
  wholes, mean = time / operations; one operation in 16 is timed on its own
  for p50/p99/p99.9/max, minus the calibrated cost of an Instant::now() pair.
  Map bookkeeping and data verification happen outside the timed loops.";

/// The after-help of `replay`: output (its JSON fields from the bench
/// contract), exit status, examples.
pub fn replay_after() -> String {
    format!(
        "{REPLAY_AFTER_HEAD}\n{}, ...\n{REPLAY_AFTER_TAIL}",
        crate::help::paragraph(&crate::help::contract_fields())
    )
}

const REPLAY_AFTER_HEAD: &str = "\
OUTPUT
  People: a progress bar per engine on stderr (hidden when stderr is not a
  terminal, and with --quiet), a line per round with --verbose, the bench
  comparison table and, with --verify, data throughput per engine.
  Machines: --json writes JSON Lines, one object per engine run, with every
  field of `bench --json`:";

const REPLAY_AFTER_TAIL: &str = "\
  plus trace, trace_requests, requests_replayed, failed_allocations,
  skipped_frees and data_check {objects_written, objects_checked,
  bytes_written, bytes_checked, write_mib_per_sec, check_mib_per_sec, ...}.
  workload, sizes, seed, round_size and free_prob come from the trace's
  metadata when it has them (free_prob otherwise: frees / allocations).
  `--json PATH` writes them to a file; `--json` alone or `--json -` to
  stdout, and then the table goes to stderr. `--json` followed by the trace
  (`replay --json t.trace`) reads that trace and writes JSON to stdout.
  --plot writes an SVG: utilisation and time per round, one line per engine.

EXIT STATUS
  0 every engine ran; 1 an I/O error (trace file, device, outputs);
  2 bad flags or values, or no engine could run; 3 an engine failed (data
  verification found a wrong byte, or an engine refused a valid request or
  broke its invariants); 4 the trace is damaged or invalid.

EXAMPLES
  blockalloc trace gen --workload churn --capacity 1GiB --round-size 1000 -o churn.trace
  blockalloc replay churn.trace --engine all --plot churn.svg
  blockalloc replay churn.trace --engine all --verify --device /tmp/scratch.img
  blockalloc replay mylog.csv --capacity 2TiB --keep-going --json -";

fn engine_help() -> String {
    format!(
        "Engines to replay: NAME[,NAME...] or all. Core engines: {}.",
        blockalloc::EngineKind::names().join(", ")
    )
}

/// Flags of `blockalloc replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace (binary or CSV, recognised by content).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Engines to run (see `engine_help`).
    #[arg(long, value_name = "ENGINES", default_value = "segfit", help = engine_help())]
    pub engine: String,

    /// Device size (default: the capacity the trace was made for).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<ByteSize>,

    /// Block size (default: the trace's, else 4KiB).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<ByteSize>,

    /// contiguous: one extent per object; scattered: allocate_scattered.
    #[arg(long, value_enum, default_value_t = ModeArg::Contiguous)]
    pub mode: ModeArg,

    /// Write every allocated block with a pattern and check every byte before
    /// each free and at the end (see DATA VERIFICATION); also checks the
    /// engine's invariants at the end.
    #[arg(long)]
    pub verify: bool,

    /// The device file (or block device) for --verify; default: a temporary
    /// sparse file.
    #[arg(long, value_name = "PATH", requires = "verify")]
    pub device: Option<PathBuf>,

    /// Overwrite an existing, non-empty --device.
    #[arg(long, requires = "device")]
    pub force: bool,

    /// Go on after allocations that fail for lack of space (count them, skip
    /// the frees of their objects) instead of stopping.
    #[arg(long)]
    pub keep_going: bool,

    /// A round every N requests instead of the trace's round markers.
    #[arg(long, value_name = "N")]
    pub round_ops: Option<u64>,

    /// Stop each engine after N requests (allocations and frees).
    #[arg(long, value_name = "N")]
    pub max_ops: Option<u64>,

    /// Stop each engine after N rounds.
    #[arg(long, value_name = "N")]
    pub max_rounds: Option<u64>,

    /// Stop each engine after SECS seconds.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub time_limit: Option<f64>,

    /// Write JSON Lines, one object per engine run: `--json` alone or
    /// `--json -` to stdout (the table then goes to stderr), `--json PATH`
    /// to a file. `--json TRACE` with no other trace argument reads TRACE and
    /// writes JSON to stdout.
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,

    /// Write an SVG plot: utilisation and time per round, one line per engine.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Print a line per round.
    #[arg(long, short, conflicts_with = "quiet")]
    pub verbose: bool,

    /// No progress bar and no table (warnings and errors still go to stderr).
    #[arg(long, short)]
    pub quiet: bool,
}
