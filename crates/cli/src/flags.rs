//! Raw command-line flags (clap derive). No I/O and no cross-flag rules
//! here: each flag is parsed on its own; `bench::settings` validates them
//! together.

use std::ffi::OsString;

use clap::error::ErrorKind;

use clap::{Parser, Subcommand};

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
    Bench(Box<crate::bench::args::BenchArgs>),
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
    Serve(Box<crate::serve::ServeArgs>),
    /// Show a running server's devices (space, leases, fragmentation) and
    /// its live leases (client, size, age, expiry).
    Status(crate::status::StatusArgs),
    /// Make bearer tokens for the tenants of `serve --config`.
    Token(crate::serve::TokenArgs),
    /// A cluster of servers on etcd (`serve --etcd`): its servers and its
    /// devices' owners.
    Cluster(crate::cluster::ClusterCmdArgs),
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
