//! Checks and outputs shared by several subcommands: one definition of each
//! rule, so that `bench`, `replay` and `trace gen` refuse the same things
//! with the same words.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use blockalloc::Geometry;
use blockalloc_bench::Stream;

use crate::error::UsageError;

/// Largest `--round-size`: a round's requests and results are held in memory
/// (about 40 bytes per request).
pub const MAX_ROUND_SIZE: u64 = 10_000_000;

/// Where JSON Lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTarget {
    /// Standard output (`--json -`).
    Stdout,
    /// A file, created or truncated.
    File(PathBuf),
}

impl JsonTarget {
    /// Parses `--json [PATH|-]` (a bare `--json` arrives as `-`).
    ///
    /// # Errors
    /// [`UsageError`] for an empty path.
    pub fn parse(arg: Option<&str>) -> Result<Option<JsonTarget>, UsageError> {
        match arg {
            None => Ok(None),
            Some("-") => Ok(Some(JsonTarget::Stdout)),
            Some("") => Err(UsageError::new("--json needs a path, or - for stdout")),
            Some(p) => Ok(Some(JsonTarget::File(PathBuf::from(p)))),
        }
    }
}

/// Writes the one JSON object of `inspect`, `check` or `trace info` to its
/// target.
///
/// # Errors
/// When the file cannot be written, or stdout is closed.
pub fn write_json_object(target: &JsonTarget, value: &serde_json::Value) -> anyhow::Result<()> {
    match target {
        JsonTarget::Stdout => crate::out::outln!("{value}")?,
        JsonTarget::File(p) => std::fs::write(p, format!("{value}\n"))
            .with_context(|| format!("cannot write --json {}", p.display()))?,
    }
    Ok(())
}

/// The human output's stream and the JSON writer for `--json`: with
/// `--json -` the tables go to stderr so that stdout is pure JSON Lines.
///
/// # Errors
/// When the JSON file cannot be created.
pub fn outputs(json: Option<&JsonTarget>) -> anyhow::Result<(Stream, Option<Box<dyn Write>>)> {
    Ok(match json {
        None => (Stream::Stdout, None),
        Some(JsonTarget::Stdout) => (Stream::Stderr, Some(Box::new(io::stdout().lock()))),
        Some(JsonTarget::File(p)) => (
            Stream::Stdout,
            Some(Box::new(BufWriter::new(File::create(p).with_context(
                || format!("cannot create {}", p.display()),
            )?))),
        ),
    })
}

/// `--capacity` and `--block-size` as a geometry.
///
/// # Errors
/// [`UsageError`] when they do not make a device.
pub fn geometry(capacity: u64, block_size: u64) -> Result<Geometry, UsageError> {
    Geometry::new(capacity, block_size)
        .map_err(|e| UsageError::new(format!("--capacity/--block-size: {e}")))
}

/// `--round-size` in 1..=[`MAX_ROUND_SIZE`].
///
/// # Errors
/// [`UsageError`] outside that range.
pub fn round_size(n: u64) -> Result<u64, UsageError> {
    if (1..=MAX_ROUND_SIZE).contains(&n) {
        Ok(n)
    } else {
        Err(UsageError::new(format!(
            "--round-size {n} must be between 1 and {MAX_ROUND_SIZE}"
        )))
    }
}

/// A count flag that must be at least 1 when given.
///
/// # Errors
/// [`UsageError`] for 0.
pub fn positive(flag: &str, v: Option<u64>) -> Result<Option<u64>, UsageError> {
    match v {
        Some(0) => Err(UsageError::new(format!("{flag} must be at least 1"))),
        _ => Ok(v),
    }
}

/// `--time-limit SECS`: positive, finite, at most 1e9.
///
/// # Errors
/// [`UsageError`] otherwise.
pub fn time_limit(v: Option<f64>) -> Result<Option<Duration>, UsageError> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(UsageError::new(format!(
            "--time-limit {s:?} must be a positive number of seconds (at most 1e9)"
        ))),
    }
}

/// Parses a duration flag as the configuration file takes it: seconds
/// (`1.5`) or a number with a unit (`400ms`, `2m`); the value is in seconds.
///
/// # Errors
/// Why the text is not a duration.
pub fn seconds(text: &str) -> Result<f64, String> {
    blockalloc_service::parse_duration(text).map(|d| d.as_secs_f64())
}
