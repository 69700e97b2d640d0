//! Runs `blockalloc bench` from validated settings: engines one after
//! another, JSON Lines as each finishes, the table at the end.

use std::fs::File;
use std::io::{self, BufWriter, Write};

use anyhow::Context;
use blockalloc::ByteSize;
use blockalloc_bench::latency::method_description;
use blockalloc_bench::{
    render_table, run_engine, HumanProgress, RunReport, Stream, TimerCalibration, WorkloadKind,
};

use super::settings::{BenchSettings, JsonTarget};
use crate::error::{EnginesFailed, UsageError};

/// Runs the bench.
///
/// # Errors
/// I/O errors on the JSON output, [`EnginesFailed`] when an engine broke,
/// [`UsageError`] when no engine could run.
pub fn run(s: &BenchSettings) -> anyhow::Result<()> {
    let human = match s.json {
        Some(JsonTarget::Stdout) => Stream::Stderr,
        _ => Stream::Stdout,
    };
    let mut json: Option<Box<dyn Write>> = match &s.json {
        None => None,
        Some(JsonTarget::Stdout) => Some(Box::new(io::stdout().lock())),
        Some(JsonTarget::File(p)) => Some(Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        ))),
    };
    let timer = TimerCalibration::measure();
    if !s.quiet {
        human.line(&header(s, timer));
    }
    let mut progress = HumanProgress::new(!s.quiet, s.verbose, human);
    let mut reports: Vec<RunReport> = Vec::new();
    let (mut skipped, mut failed) = (Vec::new(), Vec::new());
    for &engine in &s.engines {
        match run_engine(engine, &s.config, timer, &mut progress) {
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
            Err(e) => {
                eprintln!("error: {e}");
                failed.push(e.to_string());
            }
        }
    }
    if !s.quiet && !reports.is_empty() {
        human.line(render_table(&reports).trim_end());
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

fn header(s: &BenchSettings, timer: TimerCalibration) -> String {
    let c = &s.config;
    let w = &c.workload;
    let stream = match w.kind {
        WorkloadKind::Seed => format!("sizes {}, free prob {}", w.sizes, w.free_prob),
        WorkloadKind::Shift => {
            "phase 1 uniform:1B..1MiB p=0.8, phase 2 uniform:3MiB..4MiB p=0.5".to_string()
        }
    };
    format!(
        "bench {}: {} ({} blocks of {}), {}, {stream}, {} requests/round, seed {}\nlatency: {}",
        w.kind,
        ByteSize(c.geometry.capacity_bytes()),
        c.geometry.capacity_blocks(),
        ByteSize(c.geometry.block_size()),
        c.mode,
        w.round_size,
        w.seed,
        method_description(timer),
    )
}
