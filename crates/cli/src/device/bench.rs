//! `blockalloc bench --device PATH`: the workload committed durably on a
//! real device (see `blockalloc_bench::run_durable`).

use std::fs::File;
use std::io::Write;

use anyhow::Context;
use blockalloc_bench::Stream;
use blockalloc_bench::{print_line, Bar, Meter};
use blockalloc_bench::{run_durable, DurableConfig, DurableProgress};
use blockalloc_store::device::DirectIo;

use crate::bench::args::BenchArgs;
use crate::bench::BenchSettings;
use crate::error::UsageError;

/// Runs the durable bench.
///
/// # Errors
/// Usage errors, store and I/O errors.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let path = a.device.as_ref().expect("called with --device");
    let s = BenchSettings::from_args(a)?;
    let threads = match s.threads.as_slice() {
        [] => 1,
        [n] => *n as usize,
        _ => {
            return Err(UsageError::new(
                "--device takes one --threads count (each run fills the device; format it again between runs)",
            )
            .into())
        }
    };
    let cfg = DurableConfig {
        workload: s.config.workload,
        threads,
        batch: a.batch,
        write_data: a.write_data,
        limits: s.config.limits,
        direct: DirectIo::Auto,
        keep: a.keep,
    };
    let verbose = a.verbose;
    let bar = (!a.quiet).then(|| {
        let bar = Bar::new("durable", Meter::Utilization);
        bar.set_message("opening the store");
        bar
    });
    let show = |p: &DurableProgress| {
        if let Some(bar) = &bar {
            bar.set_utilization(p.utilization);
            bar.set_message(format!(
                "round {}, {} allocations, {} frees, utilisation {:.4}",
                p.round, p.allocations, p.frees, p.utilization
            ));
        }
        if verbose && p.round_finished {
            let line = format!(
                "round {}: {} allocations committed, utilisation {:.4}",
                p.round, p.allocations, p.utilization
            );
            print_line(bar.as_ref(), Stream::Stderr, &line);
        }
    };
    let report = run_durable(path, &cfg, show);
    if let Some(bar) = bar {
        match &report {
            Ok(r) => bar.abandon(format!("{} rounds, stopped: {}", r.rounds, r.stopped)),
            Err(_) => bar.abandon("failed"),
        }
    }
    let report = report?;
    match a.json.as_deref() {
        Some("-") => println!("{}", report.to_json_line()),
        Some(p) => {
            let mut f = File::create(p).with_context(|| format!("cannot create {p}"))?;
            writeln!(f, "{}", report.to_json_line()).context("cannot write the JSON output")?;
        }
        None => {}
    }
    if !a.quiet && a.json.as_deref() != Some("-") {
        println!("{}", report.render());
    } else if !a.quiet {
        eprintln!("{}", report.render());
    }
    Ok(())
}
