//! Runs `blockalloc replay`: one validating pass over the trace, then every
//! engine in turn, JSON Lines as each finishes, the table (and data
//! throughput) at the end, the plot.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use blockalloc_bench::method_description;
use blockalloc_bench::units;
use blockalloc_bench::{
    render_table, replay_engine, PatternDevice, ReplayConfig, ReplayError, ReplayProgress,
    ReplayReport, RunReport, TimerCalibration, TraceInfo,
};
use blockalloc_trace::{TraceSource, TraceSummary};

use super::args::ReplayArgs;
use super::settings::{DeviceChoice, ReplaySettings};
use crate::error::{EnginesFailed, UsageError};

/// Runs the replay.
///
/// # Errors
/// [`UsageError`] for bad flags or when no engine could run; trace errors
/// (exit 4 for a damaged or invalid trace); I/O errors; [`EnginesFailed`]
/// when an engine failed (data verification included).
pub fn run(a: &ReplayArgs) -> anyhow::Result<()> {
    let bad_trace = crate::trace::in_trace(&a.trace);
    let mut source = TraceSource::open(&a.trace).map_err(&bad_trace)?;
    let header = source.header().clone();
    let mut s = ReplaySettings::new(a, &header)?;
    let geometry = s.config.geometry;
    let summary = TraceSummary::scan(&mut source, geometry.block_size()).map_err(&bad_trace)?;
    if summary.requests() == 0 {
        // Nothing to measure: every figure would be empty.
        return Err(UsageError::new(format!(
            "{} holds no allocations or frees ({} round markers): nothing to replay",
            a.trace.display(),
            summary.rounds
        ))
        .into());
    }
    let format = source.format();
    drop(source);
    if s.config.round_ops.is_none() {
        s.config.round_ops = summary.default_round_ops();
    }
    let (human, mut json) = crate::checks::outputs(s.json.as_ref())?;
    let mut device = match &s.device {
        None => None,
        Some(choice) => Some(open_device(choice, &s.config)?),
    };
    let timer = TimerCalibration::measure();
    let name = s.trace.display().to_string();
    if !s.quiet {
        human.line(&header_line(
            &s,
            &name,
            format.name(),
            &summary,
            device.as_ref(),
            timer,
        ));
    }
    let info = TraceInfo {
        name,
        header,
        summary: Some(summary),
    };
    let mut progress = ReplayProgress::new(!s.quiet, s.verbose, human);
    let mut reports: Vec<ReplayReport> = Vec::new();
    let (mut skipped, mut failed) = (Vec::new(), Vec::new());
    for (i, &engine) in s.engines.iter().enumerate() {
        if let Some(d) = device.as_mut() {
            d.begin_run(i as u64 + 1);
        }
        let ops = TraceSource::open(&s.trace).map_err(&bad_trace)?;
        match replay_engine(
            engine,
            ops,
            &info,
            &s.config,
            device.as_mut(),
            timer,
            &mut progress,
        ) {
            Ok(r) => {
                if let Some(out) = json.as_mut() {
                    writeln!(out, "{}", r.to_json_line())
                        .and_then(|()| out.flush())
                        .context("cannot write the JSON output")?;
                }
                reports.push(r);
            }
            Err(e) if e.is_skip() => {
                eprintln!("warning: {e}");
                skipped.push(e.to_string());
            }
            Err(ReplayError::Trace(e)) => return Err(e.into()),
            Err(e) if e.is_engine_fault() => {
                eprintln!("error: {e}");
                failed.push(e.to_string());
            }
            Err(e) => return Err(e.into()),
        }
    }
    if !s.quiet && !reports.is_empty() {
        let runs: Vec<RunReport> = reports.iter().map(|r| r.run.clone()).collect();
        human.line(render_table(&runs).trim_end());
        for r in &reports {
            if let Some(d) = &r.data_check {
                human.line(&format!(
                    "data check {}: {} objects written ({}, {:.0} MiB/s), {} objects read back and \
                     compared byte by byte ({}, {:.0} MiB/s): no difference",
                    r.run.engine,
                    d.objects_written,
                    units::bytes(d.bytes_written),
                    d.write_mib_per_sec,
                    d.objects_checked,
                    units::bytes(d.bytes_checked),
                    d.check_mib_per_sec
                ));
            }
        }
    }
    if let Some(path) = &s.plot {
        let runs: Vec<&RunReport> = reports.iter().map(|r| &r.run).collect();
        let x = match s.config.round_ops {
            Some(n) => format!("round ({n} requests each)"),
            None => "round (trace round markers)".to_string(),
        };
        crate::plot::write(
            path,
            format!("replay {}", info.name),
            subtitle(&s.config, &info),
            x,
            &runs,
        )?;
    }
    if let Some(first) = failed.first() {
        return Err(EnginesFailed {
            count: failed.len(),
            first: first.clone(),
        }
        .into());
    }
    if reports.is_empty() {
        return Err(UsageError::new(format!("no engine could run: {}", skipped.join("; "))).into());
    }
    Ok(())
}

fn open_device(choice: &DeviceChoice, cfg: &ReplayConfig) -> anyhow::Result<PatternDevice> {
    match choice {
        DeviceChoice::Temporary => {
            let file = tempfile::tempfile().context("cannot create a temporary device file")?;
            Ok(PatternDevice::new(
                file,
                "(temporary file)".into(),
                cfg.geometry,
            )?)
        }
        DeviceChoice::Path { path, force } => {
            // Whatever --force says: no device can be there (and opening a
            // FIFO would block).
            blockalloc_store::device::device_kind(path)?;
            if let Ok(meta) = std::fs::metadata(path) {
                let used = !meta.is_file() || meta.len() > 0;
                if used && !force {
                    return Err(UsageError::new(format!(
                        "--device {} exists and is not empty: replay --verify overwrites it with \
                         test patterns; pass --force to allow that",
                        path.display()
                    ))
                    .into());
                }
            }
            let existed = path.exists();
            check_writable(path)?;
            PatternDevice::open(path, cfg.geometry).map_err(|e| {
                // A refused replay leaves no file it made.
                if !existed {
                    let _ = std::fs::remove_file(path);
                }
                e.into()
            })
        }
    }
}

/// A clear error before any engine runs when the device cannot be opened.
fn check_writable(path: &Path) -> anyhow::Result<()> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open --device {}", path.display()))?;
    Ok(())
}

fn subtitle(cfg: &ReplayConfig, info: &TraceInfo) -> String {
    let mut s = format!(
        "{} in {} blocks, {}",
        units::bytes(cfg.geometry.capacity_bytes()),
        units::bytes(cfg.geometry.block_size()),
        cfg.mode
    );
    for key in ["workload", "sizes", "free_prob", "seed"] {
        if let Some(v) = info.header.get(key) {
            s.push_str(&format!(", {key} {v}"));
        }
    }
    if let Some(sum) = &info.summary {
        s.push_str(&format!(", {} requests", sum.requests()));
    }
    s
}

fn header_line(
    s: &ReplaySettings,
    name: &str,
    format: &str,
    sum: &TraceSummary,
    device: Option<&PatternDevice>,
    timer: TimerCalibration,
) -> String {
    let g = s.config.geometry;
    let peak = sum.peak_live_blocks as f64 / g.capacity_blocks() as f64 * 100.0;
    let mut out = format!(
        "replay {name} ({format}): {} requests ({} allocs, {} frees), {} round markers; \
         peak live {} blocks = {peak:.2}% of {} ({} blocks of {}), {}",
        sum.requests(),
        sum.allocs,
        sum.frees,
        sum.rounds,
        sum.peak_live_blocks,
        units::bytes(g.capacity_bytes()),
        g.capacity_blocks(),
        units::bytes(g.block_size()),
        s.config.mode,
    );
    if let Some(n) = s.config.round_ops {
        out.push_str(&format!(", a round every {n} requests"));
    }
    if let Some(d) = device {
        out.push_str(&format!("\ndata verification on {}", d.path().display()));
    }
    if peak > 100.0 {
        out.push_str(
            "\nnote: the trace's live data exceeds the capacity: every engine will run out of space",
        );
    }
    out.push_str(&format!("\nlatency: {}", method_description(timer)));
    out
}
