//! Validated settings of `blockalloc replay`. The trace's header supplies
//! defaults, so settings are built from the flags and the header (read by
//! the action, which is the only one doing I/O).

use std::path::PathBuf;

use blockalloc_bench::{BenchEngine, Limits, Mode, ReplayConfig};
use blockalloc_trace::TraceHeader;

use super::args::ReplayArgs;
use crate::args::ModeArg;
use crate::checks;
pub use crate::checks::JsonTarget;
use crate::error::UsageError;

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
        let geometry = checks::geometry(capacity, block_size)?;
        let engines = BenchEngine::parse_list(&a.engine)
            .map_err(|e| UsageError::new(format!("--engine: {e}")))?;
        let positive = checks::positive;
        let time_limit = checks::time_limit(a.time_limit)?;
        let json = JsonTarget::parse(a.json.as_deref())?;
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
