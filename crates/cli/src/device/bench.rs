//! `blockalloc bench --device PATH`: the workload committed durably on a
//! real device (see `blockalloc_bench::durable`).

use std::fs::File;
use std::io::Write;

use anyhow::Context;
use blockalloc_bench::durable::{run_durable, DurableConfig, DurableError};
use blockalloc_store::device::{DeviceBusy, DirectIo};
use blockalloc_store::StoreError;

use crate::bench::BenchSettings;
use crate::error::UsageError;
use crate::flags::BenchArgs;

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
    if a.batch == 0 {
        return Err(UsageError::new("--batch must be at least 1").into());
    }
    let cfg = DurableConfig {
        workload: s.config.workload,
        threads,
        batch: a.batch,
        write_data: a.write_data,
        limits: s.config.limits,
        direct: DirectIo::Auto,
    };
    let verbose = a.verbose;
    let report = run_durable(path, &cfg, |round, allocs, util| {
        if verbose {
            eprintln!("round {round}: {allocs} allocations committed, utilisation {util:.4}");
        }
    })
    .map_err(|e| match e {
        // Another writer: the store's own error, with its exit code.
        DurableError::Open { path, source } if DeviceBusy::from_io(&source).is_some() => {
            anyhow::Error::new(StoreError::from_open(&path, source))
        }
        other => other.into(),
    })?;
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
