//! Runs `blockalloc bench` from validated settings: engines one after
//! another, JSON Lines as each finishes, the table at the end.

use std::io::Write;

use anyhow::Context;
use blockalloc_bench::method_description;
use blockalloc_bench::thread_summary;
use blockalloc_bench::units;
use blockalloc_bench::{
    bench_header, render_table, run_engines, run_thread_passes, HumanProgress, Recorder, RunReport,
    Stream, TimerCalibration,
};

use super::settings::BenchSettings;
use crate::error::{EnginesFailed, UsageError};
use blockalloc_trace::TraceSink;

/// Runs the bench.
///
/// # Errors
/// I/O errors on the JSON output, [`EnginesFailed`] when an engine broke,
/// [`UsageError`] when no engine could run.
pub fn run(s: &BenchSettings) -> anyhow::Result<()> {
    let (human, mut json) = crate::checks::outputs(s.json.as_ref())?;
    let timer = TimerCalibration::measure();
    if !s.quiet {
        human.line(&header(s, timer));
    }
    let mut progress = HumanProgress::new(!s.quiet, s.verbose, human);
    if !s.threads.is_empty() {
        return run_threaded(s, timer, &mut progress, json.as_mut(), human);
    }
    let sink = match &s.record {
        Some(path) => Some(
            TraceSink::create(
                path,
                None,
                &bench_header(&s.config.workload, s.config.geometry),
            )
            .with_context(|| format!("--record {}", path.display()))?,
        ),
        None => None,
    };
    let mut recorder = Recorder::new(sink, s.config.workload, s.config.geometry, &mut progress);
    let ran = run_engines(
        &s.engines,
        s.reference,
        &s.config,
        timer,
        &mut recorder,
        |outcome| -> anyhow::Result<()> {
            match outcome {
                Ok(r) => {
                    if let Some(out) = json.as_mut() {
                        writeln!(out, "{}", r.to_json_line())
                            .and_then(|()| out.flush())
                            .context("cannot write the JSON output")?;
                    }
                }
                Err(e) if e.is_skip() => eprintln!("warning: {e}"),
                Err(e) => eprintln!("error: {e}"),
            }
            Ok(())
        },
    )?;
    let reports = ran.reports;
    let recorded = recorder.finish().context("--record")?;
    if !s.quiet && !reports.is_empty() {
        human.line(render_table(&reports).trim_end());
    }
    if let (Some(path), false) = (&s.record, s.quiet) {
        human.line(&format!(
            "recorded {} operations ({} allocs, {} frees, {} round markers) to {}",
            recorded.ops,
            recorded.allocs,
            recorded.frees,
            recorded.rounds,
            path.display()
        ));
    }
    plot(s, &reports)?;
    if let Some(first) = ran.failed.first() {
        return Err(EnginesFailed {
            count: ran.failed.len(),
            first: first.to_string(),
        }
        .into());
    }
    if reports.is_empty() {
        let skipped: Vec<String> = ran.skipped.iter().map(ToString::to_string).collect();
        return Err(UsageError::new(format!("no engine could run: {}", skipped.join("; "))).into());
    }
    Ok(())
}

/// `--threads N[,N...]`: the shared allocator under each thread count, then
/// the speed-up of each over the 1-thread run of the same pass. With
/// `--repeat`, the list runs that many times (interleaved, so that a slow
/// spell of the machine hits every count alike) and each count is summarised
/// by medians.
fn run_threaded(
    s: &BenchSettings,
    timer: TimerCalibration,
    progress: &mut HumanProgress,
    json: Option<&mut Box<dyn Write>>,
    human: Stream,
) -> anyhow::Result<()> {
    let reports =
        match run_thread_passes(&s.threads, s.repeat, &s.config, s.shared, timer, progress) {
            Ok(reports) => reports,
            Err(e) if e.is_skip() => {
                return Err(UsageError::new(format!("cannot run: {e}")).into());
            }
            Err(e) => {
                return Err(EnginesFailed {
                    count: 1,
                    first: e.to_string(),
                }
                .into())
            }
        };
    if let Some(out) = json {
        for r in &reports {
            writeln!(out, "{}", r.to_json_line()).context("cannot write the JSON output")?;
        }
        out.flush().context("cannot write the JSON output")?;
    }
    if !s.quiet {
        human.line(render_table(&reports).trim_end());
        for line in thread_summary(&s.threads, &reports) {
            human.line(&line);
        }
    }
    plot(s, &reports)?;
    Ok(())
}

/// `--plot`: one line per run.
fn plot(s: &BenchSettings, reports: &[RunReport]) -> anyhow::Result<()> {
    let Some(path) = &s.plot else {
        return Ok(());
    };
    let c = &s.config;
    let w = &c.workload;
    let subtitle = format!(
        "{} in {} blocks, {}, sizes {}, free prob {}, {} requests/round, seed {}",
        units::bytes(c.geometry.capacity_bytes()),
        units::bytes(c.geometry.block_size()),
        c.mode,
        w.sizes,
        w.free_prob,
        w.round_size,
        w.seed
    );
    let runs: Vec<&RunReport> = reports.iter().collect();
    crate::plot::write(
        path,
        format!("bench {}", w.kind),
        subtitle,
        "round".to_string(),
        &runs,
    )
}

fn header(s: &BenchSettings, timer: TimerCalibration) -> String {
    let c = &s.config;
    let w = &c.workload;
    let stream = w.describe();
    format!(
        "bench {}: {} ({} blocks of {}), {}, {stream}, {} requests/round, seed {}\nlatency: {}",
        w.kind,
        units::bytes(c.geometry.capacity_bytes()),
        c.geometry.capacity_blocks(),
        units::bytes(c.geometry.block_size()),
        c.mode,
        w.round_size,
        w.seed,
        method_description(timer),
    )
}
