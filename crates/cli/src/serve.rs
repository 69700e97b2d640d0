//! `blockalloc serve`: the allocation service over one or more devices.
//! Flags and the configuration file (flags win) → validated settings → the
//! server of `blockalloc-service`; this file opens (or creates) the devices
//! and waits for a signal, nothing more. `blockalloc token new` makes a
//! tenant's token.
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
use blockalloc_service::pb;
use blockalloc_service::{ConfigFile, Launch, ServedDevice, Server, Tenants};
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
    /// `[server]` tunables and `[[tenant]]` entries (docs/operations.md lists
    /// every key, with its default and bounds). Flags given on the command
    /// line override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Directory of the region ownership files (`NAME.owners`) of a server
    /// with tenants [default: each device's directory].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Address to listen on; port 0 picks a free port. The listener answers
    /// health checks (NOT_SERVING) while the devices open; once they are
    /// open the bound address is printed on stdout as `listening on ADDR`
    /// [default: 127.0.0.1:7878]. HOST:PORT: an IP address or a host name
    /// (`localhost:7878`; its first IPv4 address); a port alone is refused
    /// (0.0.0.0:PORT listens on every interface).
    #[arg(long, value_name = "HOST:PORT", value_parser = blockalloc_service::parse_listen_addr)]
    pub listen: Option<SocketAddr>,

    /// Create and format, with this size, each device file that does not
    /// exist (fallocated, 4 KiB blocks, zeroed in the background as
    /// `server.zero_share` allows). A size beyond the
    /// file system's free space is refused before anything is reserved
    /// (see --sparse).
    #[arg(long, value_name = "SIZE")]
    pub format: Option<ByteSize>,

    /// With --format: do not fallocate, make sparse files (blocks found at
    /// first write; a full file system fails writes later). Needed for
    /// sizes beyond the free space.
    #[arg(long, requires = "format")]
    pub sparse: bool,

    /// Seconds a lease lives without a renewal or a commit [default: 10].
    ///
    /// Seconds, or a duration with a unit: `400ms`, `2m`.
    #[arg(long, value_name = "DURATION", value_parser = crate::checks::seconds)]
    pub lease_ttl: Option<f64>,

    /// Take every device with this owner epoch (a coordination service's
    /// revision, say) instead of its epoch plus one. It must be above each
    /// device's epoch, or the server refuses to start: another owner took
    /// the device since. Replies carry the epoch; clients that saw a newer
    /// one refuse this server's replies.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub epoch: Option<u64>,

    /// Membership of a cluster of servers on etcd.
    #[command(flatten)]
    pub cluster: ClusterArgs,

    #[command(flatten)]
    pub ops: crate::ops_args::ServeOpsArgs,
    /// Limits per client and per connection.
    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

/// Flags of `blockalloc serve` for a cluster on etcd (docs/operations.md,
/// "A cluster on etcd").
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// etcd endpoints (HOST:PORT; repeat, or separate with commas). The
    /// server joins the cluster named by --cluster under an etcd lease,
    /// takes each device only if no live server owns it (the device's owner
    /// key in etcd; its revision becomes the device's owner epoch), stops
    /// acknowledging calls when it cannot renew the lease in time, and
    /// gives its devices up at once when it stops.
    #[arg(
        long,
        value_name = "HOST:PORT",
        value_delimiter = ',',
        conflicts_with = "epoch"
    )]
    pub etcd: Vec<String>,

    /// The cluster's name: its keys are under `/blockalloc/NAME/` in etcd.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,

    /// This server's name in the cluster, unique among live servers
    /// [default: the advertised address].
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,

    /// The address clients reach this server at, as registered in etcd
    /// [default: the bound listen address].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,

    /// The etcd lease's TTL in whole seconds [default: 5]: a server that
    /// dies gives its devices up this long after its last renewal, and a
    /// server that cannot renew stops acknowledging after two thirds of it.
    #[arg(
        long,
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(2..=3600)
    )]
    pub etcd_ttl: Option<u64>,

    /// Wait while another live server owns any of the devices, and take
    /// them all over when it stops or its etcd lease ends (a standby for
    /// devices that two servers reach). The listener answers health checks
    /// NOT_SERVING while it waits. Without it, a device owned elsewhere
    /// refuses the start.
    #[arg(long)]
    pub standby: bool,

    /// A label of this server, `KEY=VALUE` (for example `zone=a`);
    /// repeatable. Its devices carry its labels and `server=NAME`, and
    /// clients can restrict placement to devices with a label.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,

    #[command(flatten)]
    pub tls: crate::cluster::EtcdTlsArgs,
}

/// The cluster settings of `serve`: the flags over the file's `[cluster]`.
#[derive(Debug, Default)]
struct ClusterSettings {
    etcd: Vec<String>,
    cluster: Option<String>,
    server_name: Option<String>,
    advertise: Option<String>,
    etcd_ttl: Option<u64>,
    standby: bool,
    labels: Vec<String>,
    tls: Option<blockalloc_cluster::EtcdTls>,
}

impl ClusterSettings {
    fn new(
        a: &ClusterArgs,
        file: Option<&blockalloc_service::ClusterFile>,
    ) -> anyhow::Result<Self> {
        let f = file.cloned().unwrap_or_default();
        let s = ClusterSettings {
            etcd: if a.etcd.is_empty() {
                f.etcd
            } else {
                a.etcd.clone()
            },
            cluster: a.cluster.clone().or((!f.name.is_empty()).then_some(f.name)),
            server_name: a.server_name.clone().or(f.server_name),
            advertise: a.advertise.clone().or(f.advertise),
            etcd_ttl: a.etcd_ttl.or(f.etcd_ttl),
            standby: a.standby || f.standby,
            labels: if a.labels.is_empty() {
                f.labels
            } else {
                a.labels.clone()
            },
            tls: crate::cluster::EtcdTlsArgs::load(
                a.tls.etcd_ca.as_deref().or(f.etcd_ca.as_deref()),
                a.tls.etcd_cert.as_deref().or(f.etcd_cert.as_deref()),
                a.tls.etcd_key.as_deref().or(f.etcd_key.as_deref()),
            )?,
        };
        if let Some(t) = s.etcd_ttl {
            if !(2..=3600).contains(&t) {
                return Err(UsageError::new(format!(
                    "[cluster] etcd_ttl {t} must be 2-3600 seconds"
                ))
                .into());
            }
        }
        let extra = s.server_name.is_some()
            || s.advertise.is_some()
            || s.etcd_ttl.is_some()
            || s.standby
            || !s.labels.is_empty()
            || s.tls.is_some();
        if s.etcd.is_empty() != s.cluster.is_none() || (s.cluster.is_none() && extra) {
            return Err(UsageError::new(
                "a cluster needs etcd endpoints and its name: --etcd and --cluster, \
                 or `etcd` and `name` under [cluster]",
            )
            .into());
        }
        for l in &s.labels {
            blockalloc_cluster::check_label(l).map_err(|e| UsageError::new(e.to_string()))?;
        }
        Ok(s)
    }

    /// The member settings, in a cluster.
    fn member(&self, addr: SocketAddr) -> Option<blockalloc_cluster::MemberConfig> {
        let cluster = self.cluster.clone()?;
        let advertise = self.advertise.clone().unwrap_or_else(|| addr.to_string());
        let server = self
            .server_name
            .clone()
            .unwrap_or_else(|| advertise.clone());
        let mut c =
            blockalloc_cluster::MemberConfig::new(self.etcd.clone(), cluster, server, advertise);
        if let Some(t) = self.etcd_ttl {
            c.ttl = Duration::from_secs(t);
        }
        c.tls = self.tls.clone();
        c.labels = self.labels.clone();
        Some(c)
    }
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
    /// Make a fresh random bearer token: print it, and the line to paste
    /// into the tenant's `[[tenant]]` entry of the configuration file (the
    /// server keeps only the token's SHA-256). With --out, the token goes
    /// alone to a file for `--token-file`.
    New {
        /// Print a whole `[[tenant]]` entry for this tenant name.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,

        /// Write the token alone to FILE (a new file, mode 0600), which
        /// clients read with `--token-file FILE`; stdout then shows only
        /// the configuration entry. `-` prints the token alone on stdout
        /// and the entry on stderr.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// Runs `blockalloc token`.
///
/// # Errors
/// When the system has no random numbers to give; an --out file that
/// exists or cannot be written.
pub fn token(a: &TokenArgs) -> anyhow::Result<()> {
    use std::io::Write;
    match &a.action {
        TokenAction::New { tenant, out } => {
            let token = blockalloc_service::new_token()
                .map_err(|e| anyhow::anyhow!("no random numbers from the system: {e}"))?;
            let mut entry = String::new();
            if let Some(t) = tenant {
                entry.push_str(&format!("[[tenant]]\nname = {t:?}\n"));
            }
            entry.push_str(&format!(
                "token_sha256 = \"{}\"\n",
                blockalloc_service::to_hex(&blockalloc_service::token_sha256(&token))
            ));
            let paste = "# paste into the configuration file";
            match out.as_deref() {
                None => {
                    let text =
                        format!("token: {token}\n{paste}; give the token to the tenant:\n{entry}");
                    std::io::stdout().lock().write_all(text.as_bytes())?;
                }
                Some(p) if p.as_os_str() == "-" => {
                    std::io::stderr()
                        .lock()
                        .write_all(format!("{paste}:\n{entry}").as_bytes())?;
                    std::io::stdout()
                        .lock()
                        .write_all(format!("{token}\n").as_bytes())?;
                }
                Some(p) => {
                    write_secret(p, &token)?;
                    let text = format!(
                        "# the token is in {} (for --token-file; give it to the tenant)\n\
                         {paste}:\n{entry}",
                        p.display()
                    );
                    std::io::stdout().lock().write_all(text.as_bytes())?;
                }
            }
            Ok(())
        }
    }
}

/// Writes `token` and a newline to the new file `path`, readable by its
/// owner only from the start: an existing file is refused, not replaced.
fn write_secret(path: &std::path::Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                UsageError::new(format!(
                    "--out {} exists; refusing to replace it (remove it, or choose another file)",
                    path.display()
                ))
                .into()
            } else {
                anyhow::Error::new(e).context(format!("cannot create --out {}", path.display()))
            }
        })?;
    f.write_all(format!("{token}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write --out {}", path.display()))
}

/// Publishes each device's space every second when it changed (and at
/// once at start), as long as the server runs.
async fn publish_space(m: blockalloc_cluster::Publisher, server: Server) {
    let mut last: Vec<Option<blockalloc_cluster::DeviceSpace>> = vec![None; server.devices().len()];
    let mut warned = false;
    loop {
        for (d, last) in server.devices().iter().zip(last.iter_mut()) {
            let geo = d.store.geometry();
            let space = blockalloc_cluster::DeviceSpace {
                block_size: geo.block_size(),
                capacity_blocks: geo.capacity_blocks(),
                free_blocks: d.store.free_blocks(),
                leased_blocks: d.leased_unused_blocks(),
                epoch: d.epoch(),
            };
            if *last == Some(space) {
                continue;
            }
            match m.publish_space(&d.name, &space).await {
                Ok(true) => *last = Some(space),
                Ok(false) => {}
                Err(e) if !warned => {
                    tracing::warn!(error = %e, "cannot publish the devices' space to etcd");
                    warned = true;
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The cluster as clients see it (`WatchTopology`) in `view`.
fn topology(cluster: &str, view: &blockalloc_cluster::View) -> pb::Topology {
    let labels = |server: &str| {
        view.servers
            .iter()
            .find(|s| s.name == server)
            .map(|s| s.labels.clone())
            .unwrap_or_default()
    };
    pb::Topology {
        revision: view.revision,
        cluster: cluster.to_owned(),
        servers: view
            .servers
            .iter()
            .map(|s| pb::ClusterServer {
                name: s.name.clone(),
                address: s.addr.clone(),
                devices: s.devices.clone(),
                labels: s.labels.clone(),
                version: s.version.clone(),
            })
            .collect(),
        devices: view
            .owners
            .iter()
            .map(|o| {
                let mut labels = labels(&o.owner.server);
                labels.push(format!("server={}", o.owner.server));
                let sp = o.space.unwrap_or_default();
                pb::ClusterDevice {
                    name: o.device.clone(),
                    server: o.owner.server.clone(),
                    address: o.owner.addr.clone(),
                    epoch: o.token,
                    space_known: o.space.is_some(),
                    block_size: sp.block_size,
                    capacity_blocks: sp.capacity_blocks,
                    free_blocks: sp.free_blocks,
                    leased_blocks: sp.leased_blocks,
                    labels,
                }
            })
            .collect(),
    }
}

/// Takes `names` in the cluster, all at once; a `standby` waits while
/// another live server owns any of them. Returns their owner epoch.
async fn take_devices(
    m: &blockalloc_cluster::Member,
    names: &[String],
    standby: bool,
) -> anyhow::Result<u64> {
    loop {
        match m.claim_all(names).await {
            Ok(t) => {
                tracing::info!(epoch = t, "took the devices in the cluster");
                return Ok(t);
            }
            Err(blockalloc_cluster::ClusterError::Owned { device, owner, .. }) if standby => {
                tracing::info!(%device, %owner, "standby: waiting until the owner stops or its lease ends");
                match m.wait_free(names).await {
                    Ok(()) => {}
                    Err(blockalloc_cluster::ClusterError::Etcd(e)) => {
                        tracing::warn!(error = %e, "standby: etcd unreachable; trying again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(anyhow::Error::new(e).context("standby")),
                }
            }
            Err(blockalloc_cluster::ClusterError::Etcd(e)) if standby => {
                tracing::warn!(error = %e, "standby: etcd unreachable; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context("cannot take the devices in the cluster"))
            }
        }
    }
}

/// [`open_device`] for a device this server owns in the cluster: while
/// another process of this host still holds it (an old owner that is
/// paused, or still closing), waits, as long as the ownership lasts.
fn open_owned_device(
    path: &PathBuf,
    format: Option<ByteSize>,
    sparse: bool,
    fence: &blockalloc_cluster::Fence,
) -> anyhow::Result<Store> {
    let mut told = false;
    loop {
        match open_device(path, format, sparse) {
            Err(e) if is_busy(&e) && !fence.lost() => {
                if !told {
                    tracing::warn!(device = %path.display(), "another process of this host holds the device (its old owner?); waiting for it");
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// True when `e` says another process holds the device's lock.
fn is_busy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ResourceBusy)
    })
}

/// Opens `path`, creating and formatting it first when it is missing and
/// `format` gives a size.
fn open_device(path: &PathBuf, format: Option<ByteSize>, sparse: bool) -> anyhow::Result<Store> {
    if !path.exists() {
        let Some(size) = format else {
            return Err(UsageError::new(format!(
                "{} does not exist (create it with `blockalloc format`, or pass --format SIZE)",
                path.display()
            ))
            .into());
        };
        let prealloc = Preallocation {
            allocate: !sparse,
            zero: ZeroMode::None,
        };
        let dev = FileDevice::create(path, size.bytes(), prealloc, DirectIo::Auto)
            .with_context(|| format!("cannot create the device {}", path.display()))?;
        let store = Store::format(dev, FormatOptions::default())?;
        if !sparse {
            // Object writes into unwritten extents update filesystem
            // metadata: the server zeroes the file ahead of allocation.
            store.plan_zeroing()?;
        }
        tracing::info!(
            device = %path.display(),
            size = %blockalloc_bench::units::bytes(size.bytes()),
            sparse,
            "formatted"
        );
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
    if let blockalloc_store::JournalEnd::Interrupted { seq, reason, .. } = &report.journal_end {
        tracing::info!(device = %path.display(), entry = seq, "the write in flight at a crash was discarded: {reason}");
    }
    if let blockalloc_store::JournalEnd::TornTail { seq, reason, .. } = &report.journal_end {
        tracing::warn!(device = %path.display(), entry = seq, "a damaged last journal entry was discarded (a torn write, or a commit damaged later; format version 1 cannot tell): {reason}");
    }
    let version = store.superblock().version;
    if report.format_version != version {
        tracing::info!(device = %path.display(), "upgraded the store from format version {} to {version}", report.format_version);
    }
    for p in &report.problems {
        tracing::warn!(device = %path.display(), "damage found and worked around: {p} (run `blockalloc check` after stopping)");
    }
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

/// `stop`, a drain request (`blockalloc cluster drain`), or the end of
/// the cluster lease behind `fence`.
async fn cluster_stop(
    stop: impl std::future::Future<Output = ()>,
    fence: Arc<blockalloc_cluster::Fence>,
    drain: impl std::future::Future<Output = ()>,
) {
    let lost = async {
        while !fence.lost() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        () = stop => {}
        () = drain => tracing::info!("drain requested: handing the devices over"),
        () = lost => tracing::error!("the cluster lease ended: this server owns nothing any more; stopping"),
    }
}

/// Runs `serve` until SIGTERM or SIGINT, then stops gracefully: every call
/// sent is answered (or refused as not run), leases end and every store
/// closes cleanly.
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
    let state_dir = a.state_dir.clone().or(file.state_dir.clone());
    let cluster = ClusterSettings::new(&a.cluster, file.cluster.as_ref())?;
    if cluster.cluster.is_some() && a.epoch.is_some() {
        return Err(UsageError::new(
            "--epoch cannot be given in a cluster: the cluster sets the epoch",
        )
        .into());
    }
    let mut tenants =
        Tenants::new(&file.tenants).map_err(|(k, why)| UsageError::new(format!("{k}: {why}")))?;
    if cluster.cluster.is_some() {
        // The servers of a cluster share one tenants file.
        tenants = tenants.in_cluster();
    }
    cfg.limits = a.limits.apply(cfg.limits.clone())?;
    let cfg = a.ops.apply(cfg)?;
    let mut names: Vec<String> = Vec::with_capacity(paths.len());
    for p in paths {
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
    init_logging();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let stop = signal().context("cannot install the SIGTERM and SIGINT handlers")?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
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
        // In a cluster, each device is taken in etcd before it is opened:
        // its journal is replayed only by its owner, and the owner key's
        // revision is the epoch it is taken with.
        let mut member = match cluster.member(addr) {
            Some(c) => Some(
                blockalloc_cluster::Member::join(c, names.clone())
                    .await
                    .context("cannot join the cluster")?,
            ),
            None => None,
        };
        let mut epoch = a.epoch;
        let mut taken_at = None;
        if let Some(m) = member.take() {
            let r = take_devices(&m, &names, cluster.standby).await;
            taken_at = Some(std::time::Instant::now());
            match r {
                Ok(t) => epoch = Some(t),
                Err(e) => {
                    // Gone from the cluster at once, with any device it took.
                    let _ = m.leave().await;
                    return Err(e);
                }
            }
            member = Some(m);
        }
        let fence = member.as_ref().map(|m| m.fence());
        let paths = paths.clone();
        let format = a.format;
        let sparse = a.sparse;
        let devices = tokio::task::spawn_blocking(move || {
            let mut devices = Vec::with_capacity(paths.len());
            for (p, name) in paths.iter().zip(names) {
                let store = match &fence {
                    Some(f) => open_owned_device(p, format, sparse, f)?,
                    None => open_device(p, format, sparse)?,
                };
                let owners = match &state_dir {
                    Some(d) => d.join(format!("{name}.owners")),
                    None => {
                        let mut f = p.as_os_str().to_owned();
                        f.push(".owners");
                        PathBuf::from(f)
                    }
                };
                let mut d = ServedDevice::new(name, Arc::new(store)).with_owners_file(owners);
                if let Some(e) = epoch {
                    d = d.with_epoch(e);
                }
                devices.push(d);
            }
            anyhow::Ok(devices)
        })
        .await
        .context("opening the devices failed")?;
        let devices = match devices {
            Ok(d) => d,
            Err(e) => {
                if let Some(m) = member {
                    let _ = m.leave().await;
                }
                return Err(e);
            }
        };
        let server = Server::with_tenants(devices, cfg.clone(), tenants)
            .map_err(|e| UsageError::new(e.to_string()))?;
        let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &member {
            Some(m) => {
                let fence = m.fence();
                let check = Arc::clone(&fence);
                server.fence_with(Arc::new(move || check.is_fenced()));
                // A member whose lease ended owns nothing: it stops (a
                // supervisor restarts it, and it joins afresh).
                Box::pin(cluster_stop(stop, fence, m.drain_requested()))
            }
            None => Box::pin(stop),
        };
        // The listener has been answering health checks (NOT_SERVING) since
        // it was bound; this line says the devices are open and served.
        launch.open(&server).await;
        // The owner publishes its devices' space to etcd (for `cluster
        // status` and placement), each write conditional on still owning.
        let publisher = member
            .as_ref()
            .map(|m| tokio::spawn(publish_space(m.publisher(), server.clone())));
        // It follows the cluster in etcd and feeds `WatchTopology` from it.
        let follower = member.as_ref().map(|m| {
            let (views, mut rx) = tokio::sync::watch::channel(blockalloc_cluster::View::default());
            let (topo, topo_rx) = tokio::sync::watch::channel(pb::Topology::default());
            server.topology_from(topo_rx);
            let name = m.config().cluster.clone();
            let follow = m.follow(views);
            tokio::spawn(async move {
                tokio::join!(follow, async move {
                    while rx.changed().await.is_ok() {
                        let t = topology(&name, &rx.borrow_and_update());
                        topo.send_replace(t);
                    }
                });
            })
        });
        if let Some(t) = taken_at {
            let took = t.elapsed();
            launch.metrics().record_takeover(took);
            tracing::info!(
                took_ms = took.as_millis() as u64,
                "serving the devices taken in the cluster"
            );
        }
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
        for t in [publisher, follower].into_iter().flatten() {
            t.abort();
        }
        if let Some(m) = member {
            if m.fence().lost() {
                anyhow::bail!(
                    "the cluster lease ended (etcd unreachable for longer than --etcd-ttl): \
                     this server owns nothing any more"
                );
            }
            // Every call is answered and every store closed: the devices
            // go to their standbys now rather than after the lease's TTL.
            if let Err(e) = m.leave().await {
                tracing::warn!(error = %e, "could not end the etcd lease; the devices are free after its TTL");
            }
        }
        let _ = metrics_stop.send(());
        if let Some(t) = metrics_task {
            t.await.context("the metrics endpoint failed")??;
        }
        anyhow::Ok(())
    })
}
