//! `blockalloc serve`: the allocation service over one or more devices.
//! Flags → validated settings → the server of `blockalloc-service`; this
//! file opens (or creates) the devices and waits for a signal, nothing more.
//!
//! The listener starts before the devices open, so that health checks see
//! NOT_SERVING while journals replay. Logs (`tracing`) go to stderr,
//! filtered by `RUST_LOG` (default `info`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use blockalloc::ByteSize;
use blockalloc_service::{Config, Launch, ServedDevice, Server};
use blockalloc_store::device::{DirectIo, FileDevice, Preallocation, ZeroMode};
use blockalloc_store::{FormatOptions, Store};
use clap::Args;

use crate::error::UsageError;

/// Flags of `blockalloc serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A formatted device to serve (repeat for several). Clients address a
    /// device by its file name or by its position in this list, from 0.
    /// The server holds each device exclusively while it runs.
    #[arg(long, value_name = "PATH", required = true)]
    pub device: Vec<PathBuf>,

    /// Address to listen on; port 0 picks a free port. The listener answers
    /// health checks (NOT_SERVING) while the devices open; once they are
    /// open the bound address is printed on stdout as `listening on ADDR`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,

    /// Create and format, with this size, each device file that does not
    /// exist (fallocated, not zeroed, 4 KiB blocks).
    #[arg(long, value_name = "SIZE")]
    pub format: Option<ByteSize>,

    /// Seconds a lease lives without a renewal or a commit.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lease_ttl: f64,

    #[command(flatten)]
    pub ops: crate::ops_args::ServeOpsArgs,
    /// Limits per client and per connection.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// Opens `path`, creating and formatting it first when it is missing and
/// `format` gives a size.
fn open_device(path: &PathBuf, format: Option<ByteSize>) -> anyhow::Result<Store> {
    if !path.exists() {
        let Some(size) = format else {
            return Err(UsageError::new(format!(
                "{} does not exist (create it with `blockalloc format`, or pass --format SIZE)",
                path.display()
            ))
            .into());
        };
        let prealloc = Preallocation {
            allocate: true,
            zero: ZeroMode::None,
        };
        let dev = FileDevice::create(path, size.bytes(), prealloc, DirectIo::Auto)
            .with_context(|| format!("cannot create the device {}", path.display()))?;
        let store = Store::format(dev, FormatOptions::default())?;
        tracing::info!(device = %path.display(), %size, "formatted");
        return Ok(store);
    }
    let dev = FileDevice::open(path, DirectIo::Auto)
        .with_context(|| format!("cannot open the device {}", path.display()))?;
    let (store, report) =
        Store::open(dev).with_context(|| format!("cannot open the store on {}", path.display()))?;
    tracing::info!(
        device = %path.display(),
        replayed = report.entries,
        "opened: {} journal entries replayed",
        report.entries
    );
    Ok(store)
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`): lease grants,
/// ends and recalls, refused calls, opening and stopping; nothing per
/// allocation.
fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second call (tests running `run` twice in one process) keeps the
    // first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed by this call,
/// not when the future is first polled, so that a signal while the devices
/// open stops the server gracefully as soon as they are open instead of
/// killing it.
///
/// # Errors
/// The handlers cannot be installed.
fn signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Runs `serve` until SIGTERM or SIGINT, then stops gracefully: leases end
/// and every store checkpoints.
///
/// # Errors
/// Usage errors, device and store errors, transport errors.
pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    if !(a.lease_ttl.is_finite() && a.lease_ttl >= 0.05 && a.lease_ttl <= 86_400.0) {
        return Err(UsageError::new(format!(
            "--lease-ttl {} must be between 0.05 and 86400 seconds",
            a.lease_ttl
        ))
        .into());
    }
    let limits = a.limits.to_limits()?;
    let mut names: Vec<String> = Vec::with_capacity(a.device.len());
    for p in &a.device {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| UsageError::new(format!("--device {} has no file name", p.display())))?;
        if names.contains(&name) {
            return Err(UsageError::new(format!(
                "two devices are named {name:?}; clients address devices by file name"
            ))
            .into());
        }
        names.push(name);
    }
    let cfg = Config {
        lease_ttl: Duration::from_secs_f64(a.lease_ttl),
        expiry_interval: Duration::from_secs_f64((a.lease_ttl / 8.0).min(0.25)),
        limits,
        ..a.ops.apply(Config::default())?
    };
    init_logging();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let stop = signal().context("cannot install the SIGTERM and SIGINT handlers")?;
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let addr = listener.local_addr()?;
        let metrics_listener = match cfg.metrics_addr {
            Some(m) => Some(
                tokio::net::TcpListener::bind(m)
                    .await
                    .with_context(|| format!("cannot listen on {m} (--metrics)"))?,
            ),
            None => None,
        };
        let launch = Launch::start(listener, &cfg).await?;
        let metrics_addr = match &metrics_listener {
            Some(m) => Some(m.local_addr()?),
            None => None,
        };
        let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics_task = metrics_listener.map(|l| {
            let m = launch.metrics();
            tokio::spawn(async move {
                m.serve(l, async {
                    let _ = metrics_stopped.await;
                })
                .await
            })
        });
        let paths = a.device.clone();
        let format = a.format;
        let devices = tokio::task::spawn_blocking(move || {
            let mut devices = Vec::with_capacity(paths.len());
            for (p, name) in paths.iter().zip(names) {
                let store = open_device(p, format)?;
                devices.push(ServedDevice::new(name, Arc::new(store)));
            }
            anyhow::Ok(devices)
        })
        .await
        .context("opening the devices failed")??;
        let server = Server::new(devices, cfg).map_err(|e| UsageError::new(e.to_string()))?;
        // The listener has been answering health checks (NOT_SERVING) since
        // it was bound; this line says the devices are open and served.
        launch.open(&server).await;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {addr}")?;
            if let Some(m) = metrics_addr {
                writeln!(out, "metrics on http://{m}/metrics")?;
            }
            out.flush()?;
        }
        launch.serve(server, stop).await?;
        let _ = metrics_stop.send(());
        if let Some(t) = metrics_task {
            t.await.context("the metrics endpoint failed")??;
        }
        anyhow::Ok(())
    })
}
