//! `blockalloc bench --remote ADDR`: the flags as a
//! [`RemoteConfig`], the run ([`run_remote`]), and its report printed.
//! What the run does and measures is `blockalloc_bench`'s remote driver.

use std::fs::File;
use std::io::Write;

use anyhow::Context;
use blockalloc_bench::{
    run_remote, LeaseMode, RemoteConfig, RemoteConfigError, RemoteStop, TimerCalibration,
};

use crate::bench::args::BenchArgs;
use crate::bench::BenchSettings;
use crate::error::UsageError;

/// The flags of `bench --remote` as a checked [`RemoteConfig`].
///
/// # Errors
/// [`UsageError`] naming the flag and what is wrong with it.
fn config(a: &BenchArgs, addr: &str) -> Result<RemoteConfig, UsageError> {
    let s = BenchSettings::from_args(a)?;
    let lease = a
        .lease
        .parse::<LeaseMode>()
        .map_err(|e| UsageError::new(format!("--lease {e}")))?;
    // Bad TLS or token flags are usage errors before anything runs.
    a.connect.options()?;
    a.connect.token()?;
    let c = RemoteConfig {
        server: addr.to_string(),
        workload: s.config.workload,
        limits: s.config.limits,
        lease,
        clients: a.clients,
        count: a.count,
        commit_every: a.commit_every,
        keep: a.keep,
        reference: s.reference,
    };
    c.check().map_err(|e| {
        UsageError::new(match e {
            RemoteConfigError::Clients(_) => format!("--clients {e}"),
            RemoteConfigError::Count(_) => format!("--count {e}"),
            RemoteConfigError::CountLeased(n) => format!(
                "--count {n} batches per-call Allocate calls; add --lease off (a leasing client \
                 allocates locally, one object at a time)"
            ),
            RemoteConfigError::CommitEveryZero => format!("--commit-every {e}"),
            RemoteConfigError::CommitEveryPerCall(n) => format!(
                "--commit-every {n} commits leased allocations; with --lease off every \
                 allocation is durable when its call returns"
            ),
            e => e.to_string(),
        })
    })?;
    Ok(c)
}

/// Runs `bench --remote`.
///
/// # Errors
/// Usage errors; the server unreachable or refusing requests.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let addr = a.remote.clone().expect("called with --remote");
    let c = config(a, &addr)?;
    let timer = TimerCalibration::measure();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = rt.block_on(async {
        let stop = RemoteStop::new();
        on_interrupt(stop.clone());
        run_remote(&c, timer, &stop, || a.connect.connect(&addr)).await
    })?;
    let v = report.to_json();
    match a.json.as_deref() {
        Some("-") => println!("{v}"),
        Some(p) => {
            let mut f = File::create(p).with_context(|| format!("cannot create {p}"))?;
            writeln!(f, "{v}").context("cannot write the JSON output")?;
        }
        None => {}
    }
    if !a.quiet {
        let text = report.render();
        if a.json.as_deref() == Some("-") {
            std::io::stderr().write_all(text.as_bytes())?;
        } else {
            std::io::stdout().write_all(text.as_bytes())?;
        }
    }
    Ok(())
}

/// The first Ctrl-C stops the clients at their next call, so that they
/// free what they allocated and the run reports what it measured; a second
/// one, or one before the clients start or after they are done, ends the
/// process at once.
/// Without a handler (none can be installed) Ctrl-C ends the process as
/// before.
fn on_interrupt(stop: RemoteStop) {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed now, not when the task first runs, so that no early Ctrl-C
    // is lost.
    let Ok(mut int) = signal(SignalKind::interrupt()) else {
        return;
    };
    tokio::spawn(async move {
        if int.recv().await.is_none() {
            return;
        }
        if stop.interrupt() {
            eprintln!(
                "blockalloc: interrupted; freeing the run's objects (Ctrl-C again to quit now)"
            );
            if int.recv().await.is_none() {
                return;
            }
        }
        std::process::exit(130);
    });
}
