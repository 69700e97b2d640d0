//! [`SharedConfig`]: the tunables of the thread-safe handle.

/// How a [`SharedAllocator`](crate::SharedAllocator) cuts the device and
/// caches space per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedConfig {
    /// Blocks per region: the unit a thread arena leases from the pool and
    /// hands back (a power of two). Bigger regions mean fewer trips to the
    /// pool; smaller ones less space parked in each thread.
    pub region_blocks: u64,
    /// Thread arenas. Threads beyond this share arenas (still correct,
    /// more contention).
    pub max_arenas: usize,
    /// Entirely free regions a thread arena may keep before handing the
    /// extra ones back to the pool (the high-water mark).
    pub keep_empty_regions: usize,
}

impl SharedConfig {
    /// Defaults for a device of `capacity` blocks: regions of 1/256 of the
    /// device, between 2^12 and 2^18 blocks (16 MiB and 1 GiB at 4 KiB
    /// blocks: at least four of the largest 4 MiB objects); 64 arenas; keep
    /// 2 empty regions.
    pub fn for_capacity(capacity: u64) -> SharedConfig {
        let want = (capacity / 256).max(1).next_power_of_two();
        SharedConfig {
            region_blocks: want.clamp(1 << 12, 1 << 18),
            max_arenas: 64,
            keep_empty_regions: 2,
        }
    }
}
