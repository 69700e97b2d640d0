//! `trace gen`: validated settings, then the action.

use std::path::PathBuf;

use blockalloc_bench::{generate, units, GenSpec, GenWorkload};
use blockalloc_trace::{TraceFormat, TraceSink};

use super::args::GenArgs;
use crate::error::UsageError;

/// Everything `trace gen` needs, checked.
#[derive(Clone, Debug)]
pub struct GenSettings {
    /// The workload.
    pub spec: GenSpec,
    /// Output file (`-` for stdout).
    pub output: PathBuf,
    /// Output format, if forced.
    pub format: Option<TraceFormat>,
}

impl GenSettings {
    /// Validates the raw flags.
    ///
    /// # Errors
    /// [`UsageError`] naming the flag.
    pub fn from_args(a: &GenArgs) -> Result<Self, UsageError> {
        let geometry = crate::checks::geometry(a.capacity.bytes(), a.block_size.bytes())?;
        crate::checks::round_size(a.round_size)?;
        let w = a.workload;
        // Which workloads take a flag comes from the workload registry.
        let only = |flag: &str, set: bool, applies: fn(&GenWorkload) -> bool| {
            if set && !applies(&w) {
                let allowed: Vec<&str> = GenWorkload::ALL
                    .iter()
                    .filter(|g| applies(g))
                    .map(GenWorkload::name)
                    .collect();
                Err(UsageError::new(format!(
                    "{flag} does not apply to the {} workload (only to {})",
                    w.name(),
                    allowed.join(", ")
                )))
            } else {
                Ok(())
            }
        };
        only(
            "--free-prob",
            a.free_prob.is_some(),
            GenWorkload::uses_free_prob,
        )?;
        only("--sizes", a.sizes.is_some(), GenWorkload::uses_sizes)?;
        let churn = |g: &GenWorkload| *g == GenWorkload::Churn;
        only("--fill", a.fill.is_some(), churn)?;
        only("--volume", a.volume.is_some(), churn)?;
        let mut spec = GenSpec::new(w, geometry);
        spec.round_size = a.round_size;
        spec.seed = a.seed;
        spec.max_ops = match a.max_ops {
            Some(0) => return Err(UsageError::new("--max-ops must be at least 1")),
            m => m,
        };
        if let Some(p) = a.free_prob {
            if !(0.0..=1.0).contains(&p) {
                return Err(UsageError::new(format!(
                    "--free-prob {p} must be a probability in [0, 1]"
                )));
            }
            spec.free_prob = p;
        }
        if let Some(s) = a.sizes {
            match w {
                GenWorkload::Churn => spec.churn.sizes = s,
                _ => spec.sizes = s,
            }
        }
        if let Some(f) = a.fill {
            if !(f > 0.0 && f <= 1.0) {
                return Err(UsageError::new(format!("--fill {f} must be in (0, 1]")));
            }
            spec.churn.fill = f;
        }
        if let Some(v) = a.volume {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(UsageError::new(format!(
                    "--volume {v} must be a number of capacities from 0 to 1e6"
                )));
            }
            spec.churn.volume = v;
        }
        if a.output.as_os_str().is_empty() {
            return Err(UsageError::new("--output needs a path, or - for stdout"));
        }
        Ok(GenSettings {
            spec,
            output: a.output.clone(),
            format: a.format,
        })
    }
}

/// Writes the trace.
///
/// # Errors
/// Trace I/O errors.
pub fn run(s: &GenSettings) -> anyhow::Result<()> {
    let mut sink = TraceSink::create(&s.output, s.format, &s.spec.header())?;
    let format = sink.format();
    let out = generate(&s.spec, &mut sink)?;
    let t = sink.finish()?;
    eprintln!(
        "{} ({format}): {} workload on {}, {} operations ({} allocs, {} frees, {} round markers); \
         it ends because {}",
        s.output.display(),
        s.spec.workload,
        units::bytes(s.spec.geometry.capacity_bytes()),
        out.ops,
        t.allocs,
        t.frees,
        t.rounds,
        out.end.describe()
    );
    Ok(())
}
