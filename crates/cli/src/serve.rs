//! `blockalloc serve`: the allocation service over one or more devices.
//! Flags and the configuration file (flags win) → validated settings → the
//! server of `blockalloc-service`; this file opens (or creates) the devices
//! and waits for a signal, nothing more. `blockalloc token new` makes a
//! tenant's token.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use blockalloc::ByteSize;
use blockalloc_service::{ConfigFile, ServedDevice, Server, Tenants};
use blockalloc_store::device::{DirectIo, FileDevice, Preallocation, ZeroMode};
use blockalloc_store::{FormatOptions, Store};
use clap::{Args, Subcommand};

use crate::error::UsageError;

/// Flags of `blockalloc serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A formatted device to serve (repeat for several). Clients address a
    /// device by its file name or by its position in this list, from 0.
    /// The server holds each device exclusively while it runs. Replaces the
    /// configuration file's `devices`.
    #[arg(long, value_name = "PATH")]
    pub device: Vec<PathBuf>,

    /// A TOML configuration file: `listen`, `devices`, `state_dir`, the
    /// `[server]` tunables and `[[tenant]]` entries (see docs/design.md).
    /// Flags given on the command line override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory of the region ownership files (`NAME.owners`) of a server
    /// with tenants [default: each device's directory].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Address to listen on; port 0 picks a free port. The bound address is
    /// printed on stdout as `listening on ADDR` [default: 127.0.0.1:7878].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Create and format, with this size, each device file that does not
    /// exist (fallocated, not zeroed, 4 KiB blocks).
    #[arg(long, value_name = "SIZE")]
    pub format: Option<ByteSize>,

    /// Seconds a lease lives without a renewal or a commit [default: 10].
    #[arg(long, value_name = "SECS")]
    pub lease_ttl: Option<f64>,
}

/// Flags of `blockalloc token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: TokenAction,
}

/// `blockalloc token` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Print a fresh random bearer token, and the line to paste into the
    /// tenant's `[[tenant]]` entry of the configuration file (the server
    /// keeps only the token's SHA-256).
    New {
        /// Print a whole `[[tenant]]` entry for this tenant name.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
    },
}

/// Runs `blockalloc token`.
///
/// # Errors
/// When the system has no random numbers to give.
pub fn token(a: &TokenArgs) -> anyhow::Result<()> {
    match &a.action {
        TokenAction::New { tenant } => {
            let token = blockalloc_service::new_token()
                .map_err(|e| anyhow::anyhow!("no random numbers from the system: {e}"))?;
            let line = format!(
                "token_sha256 = \"{}\"",
                blockalloc_service::to_hex(&blockalloc_service::token_sha256(&token))
            );
            let mut out = String::new();
            out.push_str(&format!("token: {token}\n"));
            out.push_str("# paste into the configuration file; give the token to the tenant:\n");
            if let Some(t) = tenant {
                out.push_str(&format!("[[tenant]]\nname = {t:?}\n"));
            }
            out.push_str(&line);
            out.push('\n');
            use std::io::Write;
            std::io::stdout().lock().write_all(out.as_bytes())?;
            Ok(())
        }
    }
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
    let file = match &a.config {
        Some(p) => ConfigFile::load(p).map_err(|e| UsageError::new(e.to_string()))?,
        None => ConfigFile::default(),
    };
    let mut cfg = file.server.clone();
    if let Some(ttl) = a.lease_ttl {
        if !(ttl.is_finite() && (0.05..=86_400.0).contains(&ttl)) {
            return Err(UsageError::new(format!(
                "--lease-ttl {ttl} must be between 0.05 and 86400 seconds"
            ))
            .into());
        }
        cfg.lease_ttl = Duration::from_secs_f64(ttl);
        cfg.expiry_interval = Duration::from_secs_f64((ttl / 8.0).min(0.25));
    }
    let paths = if a.device.is_empty() {
        &file.devices
    } else {
        &a.device
    };
    if paths.is_empty() {
        return Err(UsageError::new(
            "no device to serve: give --device PATH (or `devices` in the --config file)",
        )
        .into());
    }
    let listen = a
        .listen
        .or(file.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7878)));
    let state_dir = a.state_dir.as_ref().or(file.state_dir.as_ref());
    let tenants =
        Tenants::new(&file.tenants).map_err(|(k, why)| UsageError::new(format!("{k}: {why}")))?;
    let mut devices = Vec::with_capacity(paths.len());
    for p in paths {
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
        let owners = match state_dir {
            Some(d) => d.join(format!("{name}.owners")),
            None => {
                let mut f = p.as_os_str().to_owned();
                f.push(".owners");
                PathBuf::from(f)
            }
        };
        devices.push(ServedDevice::new(name, Arc::new(store)).with_owners_file(owners));
    }
    let server =
        Server::with_tenants(devices, cfg, tenants).map_err(|e| UsageError::new(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
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
