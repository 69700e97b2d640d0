//! Runs under several thread counts and how they compare: the passes over
//! a list of counts ([`run_thread_passes`]), the speed-up of each run over
//! the one-thread run of the same pass ([`set_speedups`]), and one line per
//! thread count summarising every pass ([`thread_summary`]).
//!
//! A pass runs every count of the list once; with several passes (the
//! `--repeat` of `bench --threads`), `reports` holds them one after another
//! in the list's order. Ratios are taken within a pass, so that a slow spell
//! of the machine hits both sides of a ratio alike, and then summarised by
//! their median.

use blockalloc_shared::SharedConfig;

use crate::config::BenchConfig;
use crate::latency::TimerCalibration;
use crate::observer::Observer;
use crate::report::RunError;
use crate::report::RunReport;
use crate::threads::run_threads_with;

/// Runs the shared allocator under each thread count of `counts`, the list
/// `passes` times (at least once) one pass after another, so that a slow
/// spell of the machine hits every count alike, and sets each pass's
/// speed-ups ([`set_speedups`]). With several passes each report names its
/// pass (`repeat`).
///
/// # Errors
/// The first run's [`RunError`]; the runs after it are not made.
pub fn run_thread_passes(
    counts: &[u32],
    passes: u32,
    cfg: &BenchConfig,
    shared: SharedConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
) -> Result<Vec<RunReport>, RunError> {
    let passes = passes.max(1);
    let mut reports: Vec<RunReport> = Vec::new();
    for pass in 0..passes {
        let first = reports.len();
        for &n in counts {
            let mut r = run_threads_with(n, cfg, shared, timer, observer)?;
            r.repeat = (passes > 1).then_some(pass);
            reports.push(r);
        }
        set_speedups(&mut reports[first..]);
    }
    Ok(reports)
}

/// Sets `speedup_vs_one_thread` of every report of one pass: its throughput
/// over that of the pass's one-thread run. `None` when the pass has no
/// one-thread run, or that run did nothing.
pub fn set_speedups(pass: &mut [RunReport]) {
    let one = pass
        .iter()
        .find(|r| r.threads == 1)
        .map(|r| r.ops_per_sec)
        .filter(|&o| o > 0.0);
    for r in pass {
        r.speedup_vs_one_thread = one.map(|o| r.ops_per_sec / o);
    }
}

/// One line per thread count of `counts`: its throughput and its ratios to
/// one thread and to the previous count of the list, as medians over the
/// passes in `reports` (with the range when there is more than one pass).
/// A count whose runs are all missing gets no line.
pub fn thread_summary(counts: &[u32], reports: &[RunReport]) -> Vec<String> {
    let passes = reports.len() / counts.len().max(1);
    let ops = |pass: usize, i: usize| reports.get(pass * counts.len() + i).map(|r| r.ops_per_sec);
    let mut out = Vec::new();
    let one = counts.iter().position(|&n| n == 1);
    for (i, &n) in counts.iter().enumerate() {
        let mops: Vec<f64> = (0..passes)
            .filter_map(|p| ops(p, i))
            .map(|x| x / 1e6)
            .collect();
        if mops.is_empty() {
            continue;
        }
        let mut line = format!("{n} threads: {}", median_range(mops, " Mops/s"));
        let ratio_to = |j: usize| -> Vec<f64> {
            (0..passes)
                .filter_map(|p| Some(ops(p, i)? / ops(p, j).filter(|&b| b > 0.0)?))
                .collect()
        };
        if let Some(j) = one.filter(|&j| j != i) {
            line += &format!(", {} one thread", median_range(ratio_to(j), "x"));
        }
        if i > 0 && Some(i - 1) != one {
            line += &format!(
                ", {} {} threads",
                median_range(ratio_to(i - 1), "x"),
                counts[i - 1]
            );
        }
        if passes > 1 {
            line += &format!(" — medians of {passes} passes");
        }
        out.push(line);
    }
    out
}

/// `median unit (min–max)` with two decimals; the range only for more than
/// one value. `v` is not empty.
fn median_range(mut v: Vec<f64>, unit: &str) -> String {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let med = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    if v.len() > 1 {
        format!("{med:.2}{unit} ({:.2}–{:.2})", v[0], v[v.len() - 1])
    } else {
        format!("{med:.2}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real report of a tiny run, with the two fields the summary reads
    /// set.
    fn run(threads: u32, ops_per_sec: f64) -> RunReport {
        use crate::{run_engine, BenchConfig, BenchEngine, Limits, Mode, NoObserver};
        use crate::{TimerCalibration, WorkloadSpec};
        let config = BenchConfig {
            geometry: blockalloc::Geometry::parse("64MiB", "4KiB").unwrap(),
            mode: Mode::Contiguous,
            workload: WorkloadSpec {
                round_size: 100,
                ..WorkloadSpec::default()
            },
            limits: Limits::default(),
            verify: false,
        };
        let mut r = run_engine(
            BenchEngine::default(),
            &config,
            TimerCalibration::measure(),
            &mut NoObserver,
        )
        .unwrap();
        r.threads = threads;
        r.ops_per_sec = ops_per_sec;
        r.speedup_vs_one_thread = None;
        r
    }

    #[test]
    fn speedups_are_over_the_one_thread_run_of_the_same_pass() {
        let mut pass = [run(1, 2e6), run(2, 3e6), run(4, 5e6)];
        set_speedups(&mut pass);
        let s: Vec<_> = pass.iter().map(|r| r.speedup_vs_one_thread).collect();
        assert_eq!(s, [Some(1.0), Some(1.5), Some(2.5)]);
        let mut no_one = [run(2, 3e6), run(4, 5e6)];
        set_speedups(&mut no_one);
        assert!(no_one.iter().all(|r| r.speedup_vs_one_thread.is_none()));
        let mut idle = [run(1, 0.0), run(2, 3e6)];
        set_speedups(&mut idle);
        assert!(idle.iter().all(|r| r.speedup_vs_one_thread.is_none()));
    }

    #[test]
    fn the_summary_takes_medians_of_ratios_within_each_pass() {
        let counts = [1, 2, 4];
        let reports = [
            run(1, 1e6),
            run(2, 2e6),
            run(4, 3e6),
            run(1, 2e6),
            run(2, 3e6),
            run(4, 8e6),
            run(1, 1e6),
            run(2, 1e6),
            run(4, 4e6),
        ];
        let lines = thread_summary(&counts, &reports);
        assert_eq!(
            lines,
            [
                "1 threads: 1.00 Mops/s (1.00–2.00) — medians of 3 passes",
                "2 threads: 2.00 Mops/s (1.00–3.00), 1.50x (1.00–2.00) one thread — medians of 3 passes",
                "4 threads: 4.00 Mops/s (3.00–8.00), 4.00x (3.00–4.00) one thread, 2.67x (1.50–4.00) 2 threads — medians of 3 passes",
            ]
        );
        let single = thread_summary(&[2], &[run(2, 5e6)]);
        assert_eq!(single, ["2 threads: 5.00 Mops/s"]);
    }
}
