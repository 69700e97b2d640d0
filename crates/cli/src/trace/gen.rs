//! `trace gen`: validated settings, then the action.

use std::path::PathBuf;

use blockalloc_bench::{
    generate, units, ChurnSpecError, GenSpec, WorkloadInfo, WorkloadKind, WorkloadName, WORKLOADS,
};
use blockalloc_trace::{TraceFormat, TraceSink};

use super::args::GenArgs;
use crate::error::UsageError;

/// Everything `trace gen` needs, checked.
#[derive(Clone, Debug)]
pub struct GenSettings {
    /// The workload as named (`lognormal:64KiB:1`).
    pub name: WorkloadName,
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
        let name = a.workload;
        let info = name.kind.info();
        // Which workloads take a flag comes from the workload registry.
        let only = |flag: &str, set: bool, applies: fn(&WorkloadInfo) -> bool| {
            if set && !applies(info) {
                let allowed: Vec<&str> = WORKLOADS
                    .iter()
                    .filter(|w| applies(w))
                    .map(|w| w.name)
                    .collect();
                Err(UsageError::new(format!(
                    "{flag} does not apply to the {} workload (only to {})",
                    info.name,
                    allowed.join(", ")
                )))
            } else {
                Ok(())
            }
        };
        only("--free-prob", a.free_prob.is_some(), |w| w.uses_free_prob)?;
        only("--sizes", a.sizes.is_some(), |w| w.uses_sizes)?;
        let churn = |w: &WorkloadInfo| w.kind == WorkloadKind::Churn;
        only("--fill", a.fill.is_some(), churn)?;
        only("--volume", a.volume.is_some(), churn)?;
        let mut spec = GenSpec::new(name.kind, geometry);
        let w = &mut spec.workload;
        w.round_size = a.round_size;
        w.seed = a.seed;
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
            w.free_prob = p;
        }
        if let Some(s) = a.sizes.or(name.sizes) {
            w.sizes = s;
        }
        w.churn.fill = a.fill.unwrap_or(w.churn.fill);
        w.churn.volume = a.volume.unwrap_or(w.churn.volume);
        w.churn.validate().map_err(|e| {
            let flag = match e {
                ChurnSpecError::Fill(_) => "--fill",
                _ => "--volume",
            };
            UsageError::new(format!("{flag}: {e}"))
        })?;
        if a.output.as_os_str().is_empty() {
            return Err(UsageError::new("--output needs a path, or - for stdout"));
        }
        Ok(GenSettings {
            name,
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
        s.name,
        units::bytes(s.spec.geometry.capacity_bytes()),
        out.ops,
        t.allocs,
        t.frees,
        t.rounds,
        out.end.describe()
    );
    Ok(())
}
