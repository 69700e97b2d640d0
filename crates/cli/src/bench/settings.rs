//! Validated settings of `blockalloc bench`: every cross-flag rule lives
//! here, so the action never sees a value it must refuse.

use std::path::PathBuf;

use blockalloc::Geometry;
use blockalloc_bench::{
    check_threaded, parse_thread_counts, AgingSpec, AgingSpecError, BenchConfig, BenchEngine,
    ChurnSpec, ChurnSpecError, Limits, Mode, SharedConfig, SharedTunables, SharedTunablesError,
    ThreadedRunError, WorkloadSpec,
};

use super::args::{BenchArgs, ModeArg, ReferenceArg};
pub use crate::checks::JsonTarget;
use crate::checks::{self};
use crate::error::UsageError;

/// Everything `bench` needs, checked.
#[derive(Clone, Debug)]
pub struct BenchSettings {
    /// Device, workload, limits.
    pub config: BenchConfig,
    /// Engines to run, in order.
    pub engines: Vec<BenchEngine>,
    /// JSON Lines output, if any.
    pub json: Option<JsonTarget>,
    /// A line per round.
    pub verbose: bool,
    /// No bar, no table.
    pub quiet: bool,
    /// Thread counts for a threaded run (`--threads`); empty for the usual
    /// one-engine-at-a-time run.
    pub threads: Vec<u32>,
    /// The shared handle's tunables for `--threads` runs.
    pub shared: SharedConfig,
    /// Passes over `threads` (`--repeat`, at least 1).
    pub repeat: u32,
    /// `--record`: the trace file to write.
    pub record: Option<PathBuf>,
    /// `--plot`: the SVG file to write.
    pub plot: Option<PathBuf>,
    /// `--reference`: the engine whose packing every report carries.
    pub reference: Option<BenchEngine>,
}

impl BenchSettings {
    /// Validates the raw flags.
    ///
    /// # Errors
    /// [`UsageError`] naming the flag and what is wrong with it.
    pub fn from_args(a: &BenchArgs) -> Result<Self, UsageError> {
        let geometry = checks::geometry(a.capacity.bytes(), a.block_size.bytes())?;
        checks::round_size(a.round_size)?;
        WorkloadSpec::check_free_prob(a.free_prob)
            .map_err(|e| UsageError::new(format!("--free-prob {e}")))?;
        let engines = BenchEngine::parse_list(&a.engine)
            .map_err(|e| UsageError::new(format!("--engine: {e}")))?;
        let positive = checks::positive;
        let time_limit = checks::time_limit(a.time_limit)?;
        let reference = a.reference.map(|r| match r {
            ReferenceArg::BestFit => BenchEngine::BestFit,
            ReferenceArg::Segfit => BenchEngine::default(),
        });
        let threads = match a.threads.as_deref() {
            None => Vec::new(),
            Some(list) => {
                let v = parse_thread_counts(list)
                    .map_err(|e| UsageError::new(format!("--threads: {e}")))?;
                check_threaded(&engines, reference).map_err(|e| {
                    UsageError::new(match e {
                        ThreadedRunError::NotDefaultEngine => {
                            "--threads runs the shared handle of the default engine (segfit); \
                             leave out --engine"
                                .to_string()
                        }
                        ThreadedRunError::Reference => "--reference compares engines on one \
                             stream; it does not apply to --threads"
                            .to_string(),
                        e => format!("--threads: {e}"),
                    })
                })?;
                v
            }
        };
        let aging = AgingSpec {
            high: a.aging_high,
            low: a.aging_low,
            cycles: a.aging_cycles,
            large: a.aging_large,
        };
        aging.validate().map_err(|e| {
            let flag = match e {
                AgingSpecError::High(_) => "--aging-high",
                AgingSpecError::Low { .. } => "--aging-low",
                _ => "--aging-cycles",
            };
            UsageError::new(format!("{flag}: {e}"))
        })?;
        let churn = ChurnSpec {
            fill: a.churn_fill,
            volume: a.churn_volume,
        };
        churn.validate().map_err(|e| {
            let flag = match e {
                ChurnSpecError::Fill(_) => "--churn-fill",
                _ => "--churn-volume",
            };
            UsageError::new(format!("{flag}: {e}"))
        })?;
        let sizes = a.workload.sizes(a.sizes);
        let shared = shared_config(a, &geometry)?;
        let json = JsonTarget::parse(a.json.as_deref())?;
        Ok(BenchSettings {
            config: BenchConfig {
                geometry,
                mode: match a.mode {
                    ModeArg::Contiguous => Mode::Contiguous,
                    ModeArg::Scattered => Mode::Scattered,
                },
                workload: WorkloadSpec {
                    kind: a.workload.kind,
                    sizes,
                    free_prob: a.free_prob,
                    round_size: a.round_size,
                    seed: a.seed,
                    aging,
                    churn,
                },
                limits: Limits {
                    max_rounds: positive("--max-rounds", a.max_rounds)?,
                    max_ops: positive("--max-ops", a.max_ops)?,
                    time_limit,
                },
                verify: a.verify,
            },
            engines,
            json,
            verbose: a.verbose,
            quiet: a.quiet,
            threads,
            shared,
            repeat: {
                let n = a.tunables.repeat.unwrap_or(1);
                positive("--repeat", Some(u64::from(n)))?;
                n
            },
            record: a.record.clone(),
            plot: a.plot.clone(),
            reference,
        })
    }
}

/// `--region-size`, `--keep-empty-regions` and `--arenas` over the
/// device's defaults.
fn shared_config(a: &BenchArgs, geometry: &Geometry) -> Result<SharedConfig, UsageError> {
    let t = &a.tunables;
    SharedTunables {
        region_bytes: t.region_size.map(|s| s.bytes()),
        keep_empty_regions: t.keep_empty_regions,
        arenas: t.arenas,
    }
    .config(geometry)
    .map_err(|e| {
        UsageError::new(match e {
            SharedTunablesError::Arenas => format!("--arenas {e}"),
            e => format!("--region-size {e}"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc_bench::WorkloadKind;
    use clap::Parser;
    use std::time::Duration;

    /// `bench`'s flags alone, as the command line parses them.
    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn settings(args: &[&str]) -> Result<BenchSettings, UsageError> {
        let b = Bench::try_parse_from(["bench"].iter().chain(args)).unwrap();
        BenchSettings::from_args(&b.args)
    }

    #[test]
    fn defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.config.geometry, Geometry::parse("16TiB", "4KiB").unwrap());
        assert_eq!(s.engines, vec![BenchEngine::default()]);
        assert_eq!(s.config.workload, WorkloadSpec::default());
        assert_eq!(s.config.mode, Mode::Contiguous);
        assert_eq!(s.config.limits, Limits::default());
        assert_eq!(s.json, None);
    }

    #[test]
    fn refuses_bad_values() {
        for (args, needle) in [
            (&["--free-prob", "1.5"][..], "--free-prob"),
            (&["--free-prob", "NaN"], "--free-prob"),
            (&["--round-size", "0"], "--round-size"),
            (&["--round-size", "100000000"], "--round-size"),
            (&["--block-size", "3000"], "block size"),
            (&["--capacity", "1KiB"], "capacity"),
            (&["--engine", "nope"], "unknown engine"),
            (&["--max-rounds", "0"], "--max-rounds"),
            (&["--time-limit", "-1"], "--time-limit"),
            (&["--json", ""], "--json"),
            (&["--threads=1", "--region-size=12KiB"], "--region-size"),
            (&["--threads=1", "--region-size=6KiB"], "--region-size"),
            (&["--aging-high", "0"], "--aging-high"),
            (&["--aging-high", "1.5"], "--aging-high"),
            (&["--aging-low", "0.95"], "--aging-low"),
            (&["--aging-low", "-0.1"], "--aging-low"),
            (&["--aging-cycles", "0"], "--aging-cycles"),
            (&["--threads=1", "--reference=best-fit"], "--reference"),
            (&["--churn-fill", "0"], "--churn-fill"),
            (&["--churn-fill", "1.01"], "--churn-fill"),
            (&["--churn-volume", "-1"], "--churn-volume"),
            (&["--churn-volume", "inf"], "--churn-volume"),
        ] {
            let e = settings(args).err().unwrap_or_else(|| panic!("{args:?}"));
            assert!(e.to_string().contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn accepts_good_values() {
        let s = settings(&[
            "--capacity=2TiB",
            "--engine=pool,segfit",
            "--json=-",
            "--mode=scattered",
            "--workload=shift",
            "--time-limit=0.5",
            "--max-ops=10",
            "--sizes=fixed:64KiB",
        ])
        .unwrap();
        assert_eq!(s.engines.len(), 2);
        assert_eq!(s.json, Some(JsonTarget::Stdout));
        assert_eq!(s.config.mode, Mode::Scattered);
        assert_eq!(s.config.workload.kind, WorkloadKind::Shift);
        assert_eq!(s.config.limits.time_limit, Some(Duration::from_millis(500)));
        assert_eq!(s.config.limits.max_ops, Some(10));
    }

    #[test]
    fn json_alone_means_stdout() {
        assert_eq!(
            settings(&["--json"]).unwrap().json,
            Some(JsonTarget::Stdout)
        );
        assert_eq!(
            settings(&["--json", "--quiet"]).unwrap().json,
            Some(JsonTarget::Stdout)
        );
        assert_eq!(
            settings(&["--json", "out.jsonl"]).unwrap().json,
            Some(JsonTarget::File("out.jsonl".into()))
        );
    }

    #[test]
    fn aging_flags_reach_the_workload() {
        let s = settings(&[
            "--workload=aging",
            "--aging-high=0.8",
            "--aging-low=0.3",
            "--aging-cycles=2",
            "--aging-large=fixed:4MiB",
            "--reference=best-fit",
        ])
        .unwrap();
        let w = s.config.workload;
        assert_eq!(w.kind, WorkloadKind::Aging);
        assert_eq!(
            w.aging,
            AgingSpec {
                high: 0.8,
                low: 0.3,
                cycles: 2,
                large: "fixed:4MiB".parse().unwrap(),
            }
        );
        assert_eq!(s.reference, Some(BenchEngine::BestFit));
    }

    /// Every workload of the registry runs from `bench --workload`, with
    /// its registry sizes unless `--sizes` applies to it and is given.
    #[test]
    fn every_workload_of_the_registry_is_a_bench_workload() {
        for w in blockalloc_bench::WORKLOADS {
            let s = settings(&["--workload", w.name]).unwrap();
            assert_eq!(s.config.workload.kind, w.kind);
            assert_eq!(s.config.workload.sizes, w.default_sizes, "{}", w.name);
            let s = settings(&["--workload", w.name, "--sizes", "fixed:8KiB"]).unwrap();
            let given = s.config.workload.sizes == "fixed:8KiB".parse().unwrap();
            assert_eq!(given, w.uses_sizes, "{}", w.name);
        }
        let s = settings(&["--workload=lognormal:256KiB:1", "--sizes=fixed:8KiB"]).unwrap();
        assert_eq!(s.config.workload.kind, WorkloadKind::LogNormal);
        assert_eq!(
            s.config.workload.sizes,
            "lognormal:256KiB:1".parse().unwrap()
        );
        let s = settings(&[
            "--workload=churn",
            "--churn-fill=0.8",
            "--churn-volume=0.25",
        ])
        .unwrap();
        assert_eq!(
            s.config.workload.churn,
            ChurnSpec {
                fill: 0.8,
                volume: 0.25
            }
        );
    }

    #[test]
    fn shared_tunables() {
        let s = settings(&["--threads=1,2"]).unwrap();
        assert_eq!(s.shared, SharedConfig::for_capacity(1 << 32));
        let s = settings(&[
            "--threads=2",
            "--region-size=64MiB",
            "--keep-empty-regions=0",
        ])
        .unwrap();
        assert_eq!(s.shared.region_blocks, 16384);
        assert_eq!(s.shared.keep_empty_regions, 0);
        // Both need --threads.
        assert!(Bench::try_parse_from(["bench", "--region-size=64MiB"]).is_err());
    }
}
