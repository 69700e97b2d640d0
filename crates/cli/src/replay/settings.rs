//! Validated settings of `blockalloc replay`. The trace's header supplies
//! defaults, so settings are built from the flags and the header (read by
//! the action, which is the only one doing I/O).

use std::path::PathBuf;
use std::time::Duration;

use blockalloc::Geometry;
use blockalloc_bench::{BenchEngine, Limits, Mode};
use blockalloc_trace::{ReplayConfig, TraceHeader};

use super::args::ReplayArgs;
use crate::error::UsageError;
use crate::flags::ModeArg;

/// Where JSON Lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTarget {
    /// Standard output.
    Stdout,
    /// A file, created or truncated.
    File(PathBuf),
}

/// Where verification data goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// A temporary sparse file, removed at the end.
    Temporary,
    /// This file or block device.
    Path {
        /// The device.
        path: PathBuf,
        /// Overwrite existing content.
        force: bool,
    },
}

/// Everything `replay` needs, checked.
#[derive(Clone, Debug)]
pub struct ReplaySettings {
    /// The trace file.
    pub trace: PathBuf,
    /// Engines, in order.
    pub engines: Vec<BenchEngine>,
    /// Device, mode, limits, rounds.
    pub config: ReplayConfig,
    /// Data verification.
    pub device: Option<DeviceChoice>,
    /// JSON Lines output.
    pub json: Option<JsonTarget>,
    /// SVG output.
    pub plot: Option<PathBuf>,
    /// A line per round.
    pub verbose: bool,
    /// No bar, no table.
    pub quiet: bool,
}

impl ReplaySettings {
    /// Validates the flags against the trace's header.
    ///
    /// # Errors
    /// [`UsageError`] naming the flag.
    pub fn new(a: &ReplayArgs, header: &TraceHeader) -> Result<Self, UsageError> {
        if a.trace.as_os_str() == "-" {
            return Err(UsageError::new(
                "replay reads the trace once per engine: give a file, not - (stdin)",
            ));
        }
        let capacity = match (a.capacity, header.capacity_bytes) {
            (Some(c), _) => c.bytes(),
            (None, Some(c)) => c,
            (None, None) => {
                return Err(UsageError::new(
                    "the trace does not say which capacity it was made for: pass --capacity \
                     (`blockalloc trace info` shows its peak live data)",
                ))
            }
        };
        let block_size = a
            .block_size
            .map(|b| b.bytes())
            .or(header.block_size)
            .unwrap_or(4096);
        let geometry = Geometry::new(capacity, block_size)
            .map_err(|e| UsageError::new(format!("--capacity/--block-size: {e}")))?;
        let engines = BenchEngine::parse_list(&a.engine)
            .map_err(|e| UsageError::new(format!("--engine: {e}")))?;
        let positive = |flag: &str, v: Option<u64>| match v {
            Some(0) => Err(UsageError::new(format!("{flag} must be at least 1"))),
            _ => Ok(v),
        };
        let time_limit = match a.time_limit {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Some(Duration::from_secs_f64(s)),
            Some(s) => {
                return Err(UsageError::new(format!(
                    "--time-limit {s:?} must be a positive number of seconds (at most 1e9)"
                )))
            }
        };
        let json = match a.json.as_deref() {
            None => None,
            Some("-") => Some(JsonTarget::Stdout),
            Some("") => return Err(UsageError::new("--json needs a path, or - for stdout")),
            Some(p) => Some(JsonTarget::File(PathBuf::from(p))),
        };
        let device = match (&a.device, a.verify) {
            (Some(path), _) => Some(DeviceChoice::Path {
                path: path.clone(),
                force: a.force,
            }),
            (None, true) => Some(DeviceChoice::Temporary),
            (None, false) => None,
        };
        Ok(ReplaySettings {
            trace: a.trace.clone(),
            engines,
            config: ReplayConfig {
                geometry,
                mode: match a.mode {
                    ModeArg::Contiguous => Mode::Contiguous,
                    ModeArg::Scattered => Mode::Scattered,
                },
                limits: Limits {
                    max_rounds: positive("--max-rounds", a.max_rounds)?,
                    max_ops: positive("--max-ops", a.max_ops)?,
                    time_limit,
                },
                keep_going: a.keep_going,
                round_ops: positive("--round-ops", a.round_ops)?,
                check_invariants: a.verify,
            },
            device,
            json,
            plot: a.plot.clone(),
            verbose: a.verbose,
            quiet: a.quiet,
        })
    }
}
