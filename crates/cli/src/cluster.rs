//! `blockalloc cluster status --etcd HOST:PORT --cluster NAME [--json]`:
//! a cluster's live servers and its devices' owners and epochs, as etcd
//! holds them.

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::out::outln;

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
    /// Show the live servers (name, address, devices they reach) and each
    /// owned device's owner and owner epoch (its fencing token).
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
    },
}

/// Runs `cluster`.
///
/// # Errors
/// etcd unreachable, or a value in it this version cannot read.
pub fn run(a: &ClusterCmdArgs) -> anyhow::Result<()> {
    let ClusterAction::Status {
        etcd,
        cluster,
        json,
    } = &a.action;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let view = rt
        .block_on(blockalloc_cluster::View::read(etcd, cluster))
        .with_context(|| format!("cannot read cluster {cluster:?} from etcd"))?;
    if *json {
        outln!("{}", serde_json::to_string(&view)?)?;
        return Ok(());
    }
    outln!("cluster {cluster} (etcd revision {})", view.revision)?;
    outln!("{:<24} {:<24} devices", "server", "address")?;
    for s in &view.servers {
        outln!("{:<24} {:<24} {}", s.name, s.addr, s.devices.join(","))?;
    }
    let unowned: Vec<&str> = view
        .servers
        .iter()
        .flat_map(|s| s.devices.iter().map(String::as_str))
        .filter(|d| !view.owners.iter().any(|o| o.device == *d))
        .collect();
    outln!()?;
    outln!("{:<24} {:<24} {:>12}", "device", "owner", "epoch")?;
    for o in &view.owners {
        outln!("{:<24} {:<24} {:>12}", o.device, o.owner.server, o.token)?;
    }
    let mut unowned = unowned;
    unowned.sort_unstable();
    unowned.dedup();
    for d in unowned {
        outln!("{:<24} {:<24} {:>12}", d, "-", "-")?;
    }
    Ok(())
}
