//! What Status reports of a device: its space, read from the store and the
//! counters its owner keeps (for the Status RPC and the metrics alike).

use crate::device::ServedDevice;
use crate::pb;
use crate::tenants::Tenant;

/// Blocks allocated on a device of `capacity` blocks with `free` blocks
/// outside the leases and `leased` unused inside them (metadata, committed
/// allocations and calls in flight): what Status and a refusal's
/// `NoSpaceDetails` report as used.
pub(crate) fn used_blocks(capacity: u64, free: u64, leased: u64) -> u64 {
    let free = free.min(capacity);
    capacity - free - leased.min(capacity - free)
}

/// The Status entry of device `i`. Costs a pass over the device's free
/// extents.
pub(crate) fn device_status(i: usize, d: &ServedDevice) -> pb::DeviceStatus {
    let st = d.store.status();
    let leased = d.leased_unused_blocks();
    let cap = st.space.capacity_blocks;
    let free = st.space.free_blocks;
    let removed = d.owners.get().map(|o| o.removed()).unwrap_or_default();
    // The free space of the tenants' regions is reserved in the store, not
    // allocated.
    let pooled = d.owners.get().map(|o| o.pooled_free()).unwrap_or_default();
    let zero = d.store.zero_progress();
    pb::DeviceStatus {
        zeroed_through: zero.as_ref().map_or(0, |z| z.position),
        zeroed_bytes: zero.as_ref().map_or(0, |z| z.written_bytes),
        zeroing_stopped: zero.and_then(|z| z.stopped).unwrap_or_default(),
        name: d.name.clone(),
        index: i as u32,
        block_size: st.geometry.block_size(),
        capacity_blocks: cap,
        used_blocks: used_blocks(cap, free.saturating_add(pooled), leased),
        free_blocks: free,
        leased_unused_blocks: leased,
        leases: d.live_leases(),
        free_extents: st.space.free_extents,
        largest_free_extent: st.space.largest_free_extent,
        fragmentation: st.space.fragmentation,
        meta_blocks: st.meta_blocks,
        leased_fragment_blocks: d.leased_fragment_blocks(),
        // The caller's own tenant entry is added by the Status handler.
        tenants: Vec::new(),
        region_blocks: 0,
        removed_tenant_regions: removed.regions,
        removed_tenant_blocks: removed.blocks,
        epoch: d.epoch(),
    }
}

/// The caller's own entry in a device's Status (on a server with
/// tenants), and the device's region size.
pub(crate) fn tenant_status(d: &ServedDevice, t: Option<&Tenant>) -> (Vec<pb::TenantStatus>, u64) {
    let (Some(o), Some(t)) = (d.owners.get(), t) else {
        return (Vec::new(), 0);
    };
    let u = o.usage(t);
    (
        vec![pb::TenantStatus {
            name: t.name.clone(),
            used_blocks: u.used,
            leased_unused_blocks: u.leased,
            quota_blocks: u.quota,
            regions: u.regions,
            free_blocks: u.free,
        }],
        o.region_blocks(),
    )
}
