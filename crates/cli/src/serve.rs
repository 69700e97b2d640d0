//! `blockalloc serve`: the allocation service over one or more devices.
//! Flags → validated settings → the server of `blockalloc-service`; this
//! file opens (or creates) the devices and waits for a signal, nothing more.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use blockalloc::ByteSize;
use blockalloc_service::{Config, ServedDevice, Server};
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

    /// Address to listen on; port 0 picks a free port. The bound address is
    /// printed on stdout as `listening on ADDR`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,

    /// Create and format, with this size, each device file that does not
    /// exist (fallocated, not zeroed, 4 KiB blocks).
    #[arg(long, value_name = "SIZE")]
    pub format: Option<ByteSize>,

    /// Seconds a lease lives without a renewal or a commit.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lease_ttl: f64,

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
        eprintln!("formatted {} ({size})", path.display());
        return Ok(store);
    }
    let dev = FileDevice::open(path, DirectIo::Auto)
        .with_context(|| format!("cannot open the device {}", path.display()))?;
    let (store, report) =
        Store::open(dev).with_context(|| format!("cannot open the store on {}", path.display()))?;
    eprintln!(
        "opened {}: {} journal entries replayed",
        path.display(),
        report.entries
    );
    Ok(store)
}

/// Resolves on SIGTERM or SIGINT.
async fn signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
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
    let mut devices = Vec::with_capacity(a.device.len());
    for p in &a.device {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| UsageError::new(format!("--device {} has no file name", p.display())))?;
        if devices.iter().any(|d: &ServedDevice| d.name == name) {
            return Err(UsageError::new(format!(
                "two devices are named {name:?}; clients address devices by file name"
            ))
            .into());
        }
        let store = open_device(p, a.format)?;
        devices.push(ServedDevice::new(name, Arc::new(store)));
    }
    let cfg = Config {
        lease_ttl: Duration::from_secs_f64(a.lease_ttl),
        expiry_interval: Duration::from_secs_f64((a.lease_ttl / 8.0).min(0.25)),
        limits,
        ..Config::default()
    };
    let server = Server::new(devices, cfg).map_err(|e| UsageError::new(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        let addr = listener.local_addr()?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {addr}")?;
            out.flush()?;
        }
        server.serve(listener, signal()).await?;
        eprintln!("stopped: leases ended, devices checkpointed");
        anyhow::Ok(())
    })
}
