//! `blockalloc status --remote ADDR [--json]`: a running server's devices
//! (space, leases, fragmentation), on a server with tenants the caller's
//! own tenant (used, leased, quota, regions) and the space still held by
//! tenants taken out of the configuration, and the live leases, as an
//! operator looks at them.

use anyhow::Context;
use blockalloc_bench::units;
use blockalloc_service::pb;
use clap::Args;

use crate::ops_args::ConnectArgs;
use crate::out::outln;

/// Flags of `blockalloc status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The server (host:port, http://… or https://…).
    #[arg(long, value_name = "ADDR")]
    pub remote: String,

    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Runs `status`.
///
/// # Errors
/// Usage errors; the server unreachable or refusing the call.
pub fn run(a: &StatusArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let st = rt.block_on(async {
        let c = a.connect.connect(&a.remote).await?;
        c.status_with_leases()
            .await
            .with_context(|| format!("Status call to {}", a.remote))
    })?;
    if a.json {
        outln!("{}", to_json(&a.remote, &st))?;
    } else {
        print_text(&a.remote, &st)?;
    }
    Ok(())
}

fn to_json(addr: &str, st: &pb::StatusResponse) -> serde_json::Value {
    let devices: Vec<_> = st
        .devices
        .iter()
        .map(|d| {
            serde_json::json!({
                "name": d.name,
                "index": d.index,
                "block_size": d.block_size,
                "capacity_blocks": d.capacity_blocks,
                "used_blocks": d.used_blocks,
                "free_blocks": d.free_blocks,
                "leased_blocks": d.leased_unused_blocks,
                "leased_fragment_blocks": d.leased_fragment_blocks,
                "leases": d.leases,
                "free_extents": d.free_extents,
                "largest_free_extent_blocks": d.largest_free_extent,
                "fragmentation": d.fragmentation,
                "meta_blocks": d.meta_blocks,
                "removed_tenant_regions": d.removed_tenant_regions,
                "removed_tenant_blocks": d.removed_tenant_blocks,
                "zeroed_through_block": d.zeroed_through,
                "zeroed_fraction": zeroed_fraction(d),
                "zeroed_bytes": d.zeroed_bytes,
                "zeroing_stopped": d.zeroing_stopped,
                "tenants": d.tenants.iter().map(|t| serde_json::json!({
                    "name": t.name,
                    "used_blocks": t.used_blocks,
                    "leased_blocks": t.leased_unused_blocks,
                    "quota_blocks": t.quota_blocks,
                    "regions": t.regions,
                    "free_blocks": t.free_blocks,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let leases: Vec<_> = st
        .leases
        .iter()
        .map(|l| {
            serde_json::json!({
                "id": l.lease_id,
                "client": l.client_id,
                "device": l.device_name,
                "device_index": l.device_index,
                "granted_blocks": l.granted_blocks,
                "unused_blocks": l.unused_blocks,
                "age_ms": l.age_ms,
                "expires_in_ms": l.expires_in_ms,
            })
        })
        .collect();
    serde_json::json!({ "server": addr, "devices": devices, "leases": leases })
}

/// The share of the data area that background zeroing has passed; `-`
/// when the device has nothing to zero.
fn zeroed_fraction(d: &pb::DeviceStatus) -> Option<f64> {
    if d.zeroed_through == 0 {
        return None;
    }
    let all = d.capacity_blocks.saturating_sub(d.meta_blocks).max(1);
    Some(d.zeroed_through.saturating_sub(d.meta_blocks).min(all) as f64 / all as f64)
}

fn zeroed_text(d: &pb::DeviceStatus) -> String {
    zeroed_fraction(d).map_or("-".into(), |f| format!("{:.1}%", f * 100.0))
}

/// `blocks` of `block_size` bytes, for people.
fn size(blocks: u64, block_size: u64) -> String {
    units::bytes(blocks.saturating_mul(block_size))
}

/// Milliseconds, for people.
fn millis(ms: u64) -> String {
    units::nanos(ms as f64 * 1e6)
}

fn print_text(addr: &str, st: &pb::StatusResponse) -> std::io::Result<()> {
    outln!(
        "server {addr}: {} device(s), {} lease(s)",
        st.devices.len(),
        st.leases.len()
    )?;
    outln!()?;
    outln!(
        "{:<16} {:>12} {:>12} {:>12} {:>12} {:>7} {:>12} {:>12} {:>6} {:>7}",
        "DEVICE",
        "CAPACITY",
        "USED",
        "FREE",
        "LEASED",
        "LEASES",
        "FREE RUNS",
        "LARGEST",
        "FRAG",
        "ZEROED"
    )?;
    for d in &st.devices {
        let bs = d.block_size;
        outln!(
            "{:<16} {:>12} {:>12} {:>12} {:>12} {:>7} {:>12} {:>12} {:>6.3} {:>7}",
            d.name,
            size(d.capacity_blocks, bs),
            size(d.used_blocks, bs),
            size(d.free_blocks, bs),
            size(d.leased_unused_blocks, bs),
            d.leases,
            d.free_extents,
            size(d.largest_free_extent, bs),
            d.fragmentation,
            zeroed_text(d)
        )?;
    }
    for d in st.devices.iter().filter(|d| !d.zeroing_stopped.is_empty()) {
        outln!(
            "background zeroing of {} stopped: {}",
            d.name,
            d.zeroing_stopped
        )?;
    }
    let tenants: Vec<_> = st
        .devices
        .iter()
        .flat_map(|d| d.tenants.iter().map(move |t| (d, t)))
        .collect();
    let removed: Vec<_> = st
        .devices
        .iter()
        .filter(|d| d.removed_tenant_regions > 0)
        .collect();
    if !tenants.is_empty() || !removed.is_empty() {
        outln!()?;
        outln!(
            "{:<16} {:<16} {:>12} {:>12} {:>12} {:>8} {:>12}",
            "TENANT",
            "DEVICE",
            "USED",
            "LEASED",
            "QUOTA",
            "REGIONS",
            "FREE"
        )?;
        for (d, t) in tenants {
            let bs = d.block_size;
            let quota = if t.quota_blocks == 0 {
                "-".to_string()
            } else {
                size(t.quota_blocks, bs)
            };
            outln!(
                "{:<16} {:<16} {:>12} {:>12} {:>12} {:>8} {:>12}",
                t.name,
                d.name,
                size(t.used_blocks, bs),
                size(t.leased_unused_blocks, bs),
                quota,
                t.regions,
                size(t.free_blocks, bs)
            )?;
        }
        // Space of tenants taken out of the configuration: held until it
        // is freed (the server's log names them).
        for d in removed {
            outln!(
                "{:<16} {:<16} {:>12} {:>12} {:>12} {:>8} {:>12}",
                "(removed)",
                d.name,
                size(d.removed_tenant_blocks, d.block_size),
                "-",
                "-",
                d.removed_tenant_regions,
                "-"
            )?;
        }
    }
    if st.leases.is_empty() {
        return outln!("\nno live leases");
    }
    outln!()?;
    outln!(
        "{:<20} {:<24} {:<16} {:>12} {:>12} {:>9} {:>11}",
        "LEASE",
        "CLIENT",
        "DEVICE",
        "SIZE",
        "UNUSED",
        "AGE",
        "EXPIRES IN"
    )?;
    for l in &st.leases {
        let bs = st
            .devices
            .iter()
            .find(|d| d.index == l.device_index)
            .map_or(0, |d| d.block_size);
        outln!(
            "{:<20} {:<24} {:<16} {:>12} {:>12} {:>9} {:>11}",
            l.lease_id,
            l.client_id,
            l.device_name,
            size(l.granted_blocks, bs),
            size(l.unused_blocks, bs),
            millis(l.age_ms),
            millis(l.expires_in_ms)
        )?;
    }
    Ok(())
}
