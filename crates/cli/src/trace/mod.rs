//! `blockalloc trace convert|gen|info`: flags in [`args`], one action per
//! subcommand. The work is `blockalloc-trace`'s; this module translates flags
//! and prints.

pub mod args;
mod gen;
mod info;

use std::path::Path;

use anyhow::Context;
use blockalloc_trace::{convert, TraceFormat, TraceSink, TraceSource};

use self::args::{ConvertArgs, TraceArgs, TraceCommand};

/// Runs a `trace` subcommand.
///
/// # Errors
/// [`crate::error::UsageError`] for bad flags; trace errors (exit code 4 for
/// bad data, 1 for I/O).
pub fn run(args: &TraceArgs) -> anyhow::Result<()> {
    match &args.command {
        TraceCommand::Convert(a) => run_convert(a),
        TraceCommand::Gen(a) => gen::run(&gen::GenSettings::from_args(a)?),
        TraceCommand::Info(a) => info::run(a),
    }
}

fn run_convert(a: &ConvertArgs) -> anyhow::Result<()> {
    let source = TraceSource::open(&a.input)?;
    let format = a.format.unwrap_or_else(|| {
        if a.output == Path::new("-") {
            match source.format() {
                TraceFormat::Binary => TraceFormat::Csv,
                TraceFormat::Csv => TraceFormat::Binary,
            }
        } else {
            TraceFormat::for_path(&a.output)
        }
    });
    let from = source.format();
    let header = source.header().clone();
    let sink = TraceSink::create(&a.output, Some(format), &header)?;
    let totals = convert(source, sink)
        .with_context(|| format!("converting {} to {}", a.input.display(), a.output.display()))?;
    eprintln!(
        "{} ({from}) -> {} ({format}): {} operations ({} allocs, {} frees, {} round markers)",
        a.input.display(),
        a.output.display(),
        totals.ops,
        totals.allocs,
        totals.frees,
        totals.rounds
    );
    Ok(())
}
