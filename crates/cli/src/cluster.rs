//! `blockalloc cluster status --etcd HOST:PORT --cluster NAME [--json]`:
//! a cluster's live servers and its devices' owners and epochs, as etcd
//! holds them; `blockalloc cluster drain SERVER`: a graceful handoff.

use anyhow::Context;
use clap::{Args, Subcommand};

use blockalloc_bench::units;

use std::path::PathBuf;

use crate::error::UsageError;
use crate::out::outln;

/// TLS to etcd (serve and `cluster`).
#[derive(Debug, Default, Args)]
pub struct EtcdTlsArgs {
    /// Talk to etcd over TLS, trusting this CA (PEM) for its certificates.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,

    /// This client's certificate for etcd's `--client-cert-auth` (PEM; with
    /// --etcd-key and --etcd-ca).
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,

    /// The key of --etcd-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// The TLS settings, reading the files (none without --etcd-ca).
    ///
    /// # Errors
    /// A certificate or key without --etcd-ca; a file that cannot be read.
    pub fn load(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<blockalloc_cluster::EtcdTls>> {
        match ca {
            None if cert.is_some() || key.is_some() => Err(UsageError::new(
                "a client certificate for etcd needs --etcd-ca (etcd_ca) too",
            )
            .into()),
            None => Ok(None),
            Some(ca) => Ok(Some(
                blockalloc_cluster::EtcdTls::from_files(ca, cert, key)
                    .map_err(|e| UsageError::new(e.to_string()))?,
            )),
        }
    }

    fn tls(&self) -> anyhow::Result<Option<blockalloc_cluster::EtcdTls>> {
        Self::load(
            self.etcd_ca.as_deref(),
            self.etcd_cert.as_deref(),
            self.etcd_key.as_deref(),
        )
    }
}

/// Flags of `blockalloc cluster`.
#[derive(Debug, Args)]
pub struct ClusterCmdArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ClusterAction,
}

/// `blockalloc cluster` subcommands.
#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Show the live servers (name, address, devices they reach, labels) and each
    /// owned device's owner, owner epoch (its fencing token) and space as
    /// its owner publishes it (capacity, free, leased).
    Status {
        /// etcd endpoints (HOST:PORT; repeat, or separate with commas).
        #[arg(long, value_name = "HOST:PORT", value_delimiter = ',', required = true)]
        etcd: Vec<String>,

        /// The cluster's name.
        #[arg(long, value_name = "NAME")]
        cluster: String,

        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,

        #[command(flatten)]
        tls: EtcdTlsArgs,
    },
    /// Ask a live server to hand its devices over and stop: it answers the
    /// calls it has, closes its devices and leaves the cluster, and their
    /// standbys (`serve --standby`) take them over at once.
    Drain {
        /// The server's name (`serve --server-name`).
        server: String,

        /// etcd endpoints (HOST:PORT; repeat, or separate with commas).
        #[arg(long, value_name = "HOST:PORT", value_delimiter = ',', required = true)]
        etcd: Vec<String>,

        /// The cluster's name.
        #[arg(long, value_name = "NAME")]
        cluster: String,

        #[command(flatten)]
        tls: EtcdTlsArgs,
    },
}

/// Runs `cluster`.
///
/// # Errors
/// etcd unreachable, or a value in it this version cannot read.
pub fn run(a: &ClusterCmdArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (etcd, cluster, json, tls) = match &a.action {
        ClusterAction::Status {
            etcd,
            cluster,
            json,
            tls,
        } => (etcd, cluster, *json, tls.tls()?),
        ClusterAction::Drain {
            server,
            etcd,
            cluster,
            tls,
        } => {
            let tls = tls.tls()?;
            rt.block_on(blockalloc_cluster::request_drain(
                etcd,
                tls.as_ref(),
                cluster,
                server,
            ))
            .with_context(|| format!("cannot ask {server:?} to drain"))?;
            outln!("asked {server} to drain")?;
            return Ok(());
        }
    };
    let view = rt
        .block_on(blockalloc_cluster::View::read(etcd, tls.as_ref(), cluster))
        .with_context(|| format!("cannot read cluster {cluster:?} from etcd"))?;
    if json {
        outln!("{}", serde_json::to_string(&view)?)?;
        return Ok(());
    }
    outln!("cluster {cluster} (etcd revision {})", view.revision)?;
    outln!(
        "{:<24} {:<24} {:<24} labels",
        "server",
        "address",
        "devices"
    )?;
    for s in &view.servers {
        outln!(
            "{:<24} {:<24} {:<24} {}",
            s.name,
            s.addr,
            s.devices.join(","),
            s.labels.join(",")
        )?;
    }
    let unowned: Vec<&str> = view
        .servers
        .iter()
        .flat_map(|s| s.devices.iter().map(String::as_str))
        .filter(|d| !view.owners.iter().any(|o| o.device == *d))
        .collect();
    outln!()?;
    outln!(
        "{:<24} {:<24} {:>12} {:>12} {:>12} {:>12}",
        "device",
        "owner",
        "epoch",
        "capacity",
        "free",
        "leased"
    )?;
    for o in &view.owners {
        let size = |blocks: u64, s: &blockalloc_cluster::DeviceSpace| {
            units::bytes(blocks.saturating_mul(s.block_size))
        };
        let (cap, free, leased) = match &o.space {
            Some(s) => (
                size(s.capacity_blocks, s),
                size(s.free_blocks, s),
                size(s.leased_blocks, s),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        outln!(
            "{:<24} {:<24} {:>12} {:>12} {:>12} {:>12}",
            o.device,
            o.owner.server,
            o.token,
            cap,
            free,
            leased
        )?;
    }
    let mut unowned = unowned;
    unowned.sort_unstable();
    unowned.dedup();
    for d in unowned {
        outln!("{:<24} {:<24} {:>12}", d, "-", "-")?;
    }
    Ok(())
}
