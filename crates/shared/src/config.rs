//! [`SharedConfig`]: the tunables of the thread-safe handle, and
//! [`ConfigError`]: the configurations it refuses.

use blockalloc::{BuildError, ErrorClass};

/// Most regions a device is cut into. The ownership table holds 4 bytes
/// per region and the pool an entry per region with free space, so this
/// bounds their memory (4 MiB and about 30 MiB) whatever the device size;
/// [`SharedConfig::for_capacity`] picks regions large enough to stay below.
pub const MAX_REGIONS: u64 = 1 << 20;

/// Most thread arenas. Each one is an engine of its own; the arena index is
/// a `u32`.
pub const MAX_ARENAS: usize = 1 << 12;

/// How a [`SharedAllocator`](crate::SharedAllocator) cuts the device and
/// caches space per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedConfig {
    /// Blocks per region: the unit a thread arena leases from the pool and
    /// hands back (a power of two). Bigger regions mean fewer trips to the
    /// pool; smaller ones less space parked in each thread.
    pub region_blocks: u64,
    /// Thread arenas (1 to [`MAX_ARENAS`]). Threads beyond this share
    /// arenas (still correct, more contention).
    pub max_arenas: usize,
    /// Entirely free regions a thread arena may keep before handing the
    /// extra ones back to the pool (the high-water mark).
    pub keep_empty_regions: usize,
}

impl SharedConfig {
    /// Defaults for a device of `capacity` blocks: regions of 1/256 of the
    /// device, between 2^12 and 2^18 blocks (16 MiB and 1 GiB at 4 KiB
    /// blocks: at least four of the largest 4 MiB objects), or larger on
    /// devices beyond 2^38 blocks so that there are at most [`MAX_REGIONS`];
    /// 64 arenas; keep 2 empty regions.
    pub fn for_capacity(capacity: u64) -> SharedConfig {
        let want = (capacity / 256).max(1).next_power_of_two();
        // capacity / 2^20 < 2^44: the power of two above it exists.
        let fewest = capacity.div_ceil(MAX_REGIONS).next_power_of_two();
        SharedConfig {
            region_blocks: want.clamp(1 << 12, 1 << 18).max(fewest),
            max_arenas: 64,
            keep_empty_regions: 2,
        }
    }

    /// Checks this configuration for a device of `capacity` blocks and
    /// returns log2 of the region size.
    ///
    /// # Errors
    /// As [`ConfigError`].
    pub fn region_shift(&self, capacity: u64) -> Result<u32, ConfigError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity.into());
        }
        if !self.region_blocks.is_power_of_two() {
            return Err(ConfigError::RegionNotPowerOfTwo {
                region_blocks: self.region_blocks,
            });
        }
        if self.max_arenas == 0 || self.max_arenas > MAX_ARENAS {
            return Err(ConfigError::Arenas {
                max_arenas: self.max_arenas,
                max: MAX_ARENAS,
            });
        }
        let regions = capacity.div_ceil(self.region_blocks);
        if regions > MAX_REGIONS {
            return Err(ConfigError::TooManyRegions {
                capacity,
                region_blocks: self.region_blocks,
                regions,
                max: MAX_REGIONS,
            });
        }
        Ok(self.region_blocks.trailing_zeros())
    }
}

impl ConfigError {
    /// What kind of failure this is: that of the engine's refusal, else
    /// [`ErrorClass::InvalidInput`].
    pub fn class(&self) -> ErrorClass {
        match self {
            ConfigError::Build(e) => e.class(),
            ConfigError::RegionNotPowerOfTwo { .. }
            | ConfigError::TooManyRegions { .. }
            | ConfigError::Arenas { .. } => ErrorClass::InvalidInput,
        }
    }
}

/// A configuration or device the shared handle cannot be built for. Nothing
/// is allocated before these checks pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The engine refused the device or the free list (zero capacity, a
    /// free extent out of range or overlapping another).
    #[error(transparent)]
    Build(#[from] BuildError),
    /// `region_blocks` is not a power of two (0 included).
    #[error("region_blocks must be a power of two, not {region_blocks}")]
    RegionNotPowerOfTwo {
        /// The value given.
        region_blocks: u64,
    },
    /// The device would have more regions than supported.
    #[error("{capacity} blocks in regions of {region_blocks} blocks make {regions} regions, at most {max} are supported (use larger regions)")]
    TooManyRegions {
        /// Device size in blocks.
        capacity: u64,
        /// Blocks per region.
        region_blocks: u64,
        /// Regions needed.
        regions: u64,
        /// Most regions supported.
        max: u64,
    },
    /// `max_arenas` is 0 or above the limit.
    #[error("max_arenas must be from 1 to {max}, not {max_arenas}")]
    Arenas {
        /// The value given.
        max_arenas: usize,
        /// Most arenas supported.
        max: usize,
    },
}
