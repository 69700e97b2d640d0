//! `blockalloc trace convert|gen|info`: flags in [`args`], one action per
//! subcommand. The work is `blockalloc-trace`'s; this module translates flags
//! and prints.

pub mod args;
mod gen;
mod info;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use blockalloc_trace::{convert, TraceError, TraceFormat, TraceSink, TraceSource};

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

/// The error of reading the trace at `path`: bad data is prefixed with the
/// file's name (its position is in the error), so that `trace info`,
/// `trace convert` and `replay` report a bad trace alike; I/O errors name
/// the file already.
pub(crate) fn in_trace(path: &Path) -> impl Fn(TraceError) -> anyhow::Error + '_ {
    move |e| {
        if e.is_bad_data() {
            anyhow::Error::new(e).context(path.display().to_string())
        } else {
            e.into()
        }
    }
}

fn run_convert(a: &ConvertArgs) -> anyhow::Result<()> {
    let source = TraceSource::open(&a.input).map_err(in_trace(&a.input))?;
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
    let describe = |e: TraceError| -> anyhow::Error {
        // A bad trace reads the same as from `trace info` and `replay`.
        if e.is_bad_data() {
            in_trace(&a.input)(e)
        } else {
            anyhow::Error::new(e).context(format!(
                "converting {} to {}",
                a.input.display(),
                a.output.display()
            ))
        }
    };
    let totals = if a.output == Path::new("-") {
        let sink = TraceSink::create(&a.output, Some(format), &header)?;
        convert(source, sink).map_err(describe)?
    } else {
        // Into a temporary file beside the output, renamed over it only when
        // the whole input converted: a bad input leaves no partial output
        // and an existing output untouched (even when it is the input).
        let dir = match a.output.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("cannot create a file in {}", dir.display()))?;
        let file = tmp
            .as_file()
            .try_clone()
            .context("cannot write the temporary output")?;
        let sink = TraceSink::to_writer(Box::new(file), format, &header)?;
        let totals = convert(source, sink).map_err(describe)?;
        let mode = std::fs::metadata(&a.output).map_or(0o644, |m| m.permissions().mode());
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
            .context("cannot set the output's permissions")?;
        tmp.persist(&a.output)
            .with_context(|| format!("cannot write {}", a.output.display()))?;
        totals
    };
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
