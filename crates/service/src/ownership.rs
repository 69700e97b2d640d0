//! Who owns which space, durably: per-tenant regions.
//!
//! With tenants, each device is cut into regions of `region_blocks`
//! blocks (a power of two; [`region_blocks_for`] picks it from the
//! capacity). A region belongs to at most one tenant, and a tenant
//! allocates and leases only inside its own regions, so the owner of any
//! extent is the owner of its regions: nothing is recorded per object.
//!
//! * The ownership table (region → tenant) lives in a sidecar file next to
//!   the device (`NAME.owners`), rewritten whole and atomically on each
//!   change: write a temporary file, fsync it, rename it over the old one,
//!   fsync the directory. A change is rare (a region is thousands of
//!   objects) and the file is small, so a sidecar costs nothing on the
//!   allocation path and leaves the store's on-device format alone.
//! * Crash consistency: a region is recorded as the tenant's **before** any
//!   of its blocks is handed to the tenant, and recorded free again only
//!   **after** the tenant's last block in it is free and while nothing can
//!   be allocated from it. So after any crash every allocated block lies in
//!   a region recorded for its owner; at worst a region is recorded for a
//!   tenant that holds nothing in it. On start, [`DeviceOwners::load`]
//!   checks exactly that against the store: an allocated block in an
//!   unrecorded region is refused with an error naming the region.
//! * In memory, each (device, tenant) has a [`Pool`]: a store
//!   [`Reservation`] holding the free space of the tenant's regions (so no
//!   one else can take it, and a crash loses nothing: reserved space is
//!   free on the device) and a segfit engine over the same free space that
//!   picks extents for the tenant's allocations and leases. Frees go to the
//!   store and come back into the pool once durable.
//! * A region whose data blocks are all free in the pool goes back to the
//!   device (unless it is the tenant's last one, so that a tenant that
//!   allocates and frees one object does not rewrite the table each time).
//! * Regions of a tenant no longer configured are settled at load: those
//!   with no allocated block go back to the device (recorded before anyone
//!   can be given them); those holding allocations stay the tenant's, out
//!   of every configured tenant's reach, and are reported ([`RemovedSpace`],
//!   a warning in the log) until the tenant is declared again and frees
//!   them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use blockalloc::{AllocError, Allocator, Extent, FromFreeExtents, SegFitAllocator};
use blockalloc_store::{Reservation, Store, StoreError, Txn};
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;
use crate::sync::lock;
use crate::tenants::{to_hex, Tenant, Tenants};

/// The format tag of an ownership file.
const FORMAT: &str = "blockalloc-owners/1";

/// The smallest automatic region: 64 MiB, sixteen of the largest objects.
const MIN_REGION_BYTES: u64 = 64 << 20;

/// The automatic region size for a device: the capacity / 4096, rounded up
/// to a power of two, at least 64 MiB (so a 4 MiB object always fits and a
/// 1 TiB device has 4096 regions of 256 MiB).
pub fn region_blocks_for(capacity_blocks: u64, block_size: u64) -> u64 {
    let bytes = (capacity_blocks.saturating_mul(block_size) / 4096)
        .max(MIN_REGION_BYTES)
        .next_power_of_two();
    (bytes / block_size).max(1)
}

/// The ownership file, as JSON.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnersFile {
    format: String,
    /// The store's uuid, so that a file is never applied to another device
    /// (or to a reformatted one).
    store_uuid: String,
    capacity_blocks: u64,
    region_blocks: u64,
    /// Tenant name → its regions, ascending.
    tenants: BTreeMap<String, Vec<u64>>,
}

/// Why a device's ownership could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    /// The ownership file could not be read or written.
    #[error("ownership file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged or belongs to another device.
    #[error("ownership file {path}: {reason}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The directory of the ownership file is missing or not writable
    /// (the file is rewritten there on each change of ownership).
    #[error("device {device}: the directory of its ownership file {file}, {dir}, {reason}; point state_dir at a writable directory (the one holding {file}, if the device has one)")]
    StateDir {
        /// The device.
        device: String,
        /// The directory.
        dir: PathBuf,
        /// The ownership file's name.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The device holds allocations but has no ownership file where it is
    /// looked for: most likely `state_dir` points elsewhere than before.
    #[error("device {device} holds {blocks} allocated blocks but there is no ownership file at {path}; point state_dir at the directory holding its ownership file (a device served without tenants has none and cannot be served with tenants)")]
    Missing {
        /// The device.
        device: String,
        /// Where the file was looked for.
        path: PathBuf,
        /// Allocated blocks on the device (the metadata area not counted).
        blocks: u64,
    },
    /// The device holds allocations that no tenant owns (e.g. it was served
    /// without tenants before, or the file is an older copy).
    #[error("device {device}: region {region} (blocks {start}..{end}) holds {blocks} allocated blocks but belongs to no tenant in {path}; is state_dir pointing at an older copy of the ownership file? (a device served without tenants cannot be served with tenants)")]
    Unowned {
        /// The device.
        device: String,
        /// The ownership file.
        path: PathBuf,
        /// The region.
        region: u64,
        /// Its first block.
        start: u64,
        /// Its end.
        end: u64,
        /// Allocated blocks in it.
        blocks: u64,
    },
    /// The store refused to reserve a region's free space.
    #[error("device {device}: {source}")]
    Store {
        /// The device.
        device: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

/// A tenant's pool on a device, where its allocations and leases come from
/// and return to.
#[derive(Clone)]
pub(crate) struct Home {
    pub owners: Arc<DeviceOwners>,
    pub tenant: Arc<Tenant>,
}

/// A per-call allocation taken from a tenant's pool and put in a
/// transaction ([`DeviceOwners::allocate_in`]), until it is durable.
pub(crate) struct PoolAllocation {
    /// The objects' extents.
    pub objects: Vec<Vec<Extent>>,
    /// What was handed out of the pool (empty once published).
    res: Reservation,
    total: u64,
}

/// One tenant's space on one device.
pub(crate) struct PoolState {
    /// The free space of the tenant's regions.
    res: Reservation,
    /// The same free space, for choosing extents.
    engine: SegFitAllocator,
    /// Blocks allocated (committed or in flight) in the tenant's regions.
    pub used: u64,
    /// Blocks in the tenant's live leases, not yet committed.
    pub leased: u64,
    /// The tenant's regions → their data blocks not free in the pool.
    regions: BTreeMap<u64, u64>,
}

/// One tenant's space on one device, as Status and the metrics report it
/// (in blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TenantUsage {
    /// Allocated (committed or in flight).
    pub used: u64,
    /// In live leases, not committed yet.
    pub leased: u64,
    /// Free inside the tenant's regions, outside its leases: what it can
    /// take without being assigned another region.
    pub free: u64,
    /// Maximal free runs inside the tenant's regions.
    pub free_extents: u64,
    /// Regions assigned to the tenant.
    pub regions: u64,
    /// Its quota on this device; 0 for none.
    pub quota: u64,
}

/// A [`PoolState`] behind its lock, with the tenant it belongs to.
pub(crate) struct Pool {
    pub tenant: Arc<Tenant>,
    pub state: Mutex<PoolState>,
}

/// The region table and tenant pools of one device.
pub(crate) struct DeviceOwners {
    device: String,
    store: Arc<Store>,
    path: PathBuf,
    uuid: String,
    capacity: u64,
    meta: u64,
    region_blocks: u64,
    /// Region → owner's name (possibly a tenant no longer configured, whose
    /// regions all hold allocations: its empty ones are returned at load).
    table: Mutex<Vec<Option<String>>>,
    /// Indexed by tenant id.
    pools: Vec<Pool>,
    /// Held by tenants no longer configured, found at load.
    removed: RemovedSpace,
}

/// Regions of a device assigned to tenants no longer configured, and the
/// blocks allocated in them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RemovedSpace {
    /// Regions.
    pub regions: u64,
    /// Allocated blocks in them.
    pub blocks: u64,
}

impl std::fmt::Debug for DeviceOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceOwners")
            .field("device", &self.device)
            .field("region_blocks", &self.region_blocks)
            .finish_non_exhaustive()
    }
}

/// Writes `bytes` to `path` atomically: a temporary file, fsync, rename,
/// fsync of the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Checks that the directory of the ownership file `path` exists and takes
/// new files (the file is rewritten through a temporary file beside it),
/// so that a wrong `state_dir` is refused at start rather than at the
/// first change of ownership.
fn check_dir(device: &str, path: &Path) -> Result<(), OwnershipError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let fail = |reason: String| OwnershipError::StateDir {
        device: device.to_string(),
        dir: dir.to_path_buf(),
        file: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        reason,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(fail("is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail("does not exist".into()))
        }
        Err(e) => return Err(fail(format!("cannot be read: {e}"))),
    }
    let mut probe = path.as_os_str().to_owned();
    probe.push(".tmp");
    let probe = PathBuf::from(probe);
    std::fs::File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| fail(format!("is not writable ({e})")))
}

/// Blocks of `e` inside each region it touches.
fn by_region(e: Extent, region_blocks: u64) -> impl Iterator<Item = (u64, u64)> {
    let first = e.start() / region_blocks;
    let last = (e.end() - 1) / region_blocks;
    (first..=last).map(move |r| {
        let s = e.start().max(r * region_blocks);
        let end = e.end().min((r + 1) * region_blocks);
        (r, end - s)
    })
}

impl DeviceOwners {
    /// Loads (or starts) the ownership table of `store` from `path`, checks
    /// it against the store's allocations, and moves the free space of every
    /// configured tenant's regions into its pool.
    pub(crate) fn load(
        device: &str,
        store: &Arc<Store>,
        path: &Path,
        tenants: &Tenants,
        region_bytes: u64,
    ) -> Result<DeviceOwners, OwnershipError> {
        let geo = store.geometry();
        let capacity = geo.capacity_blocks();
        let uuid = to_hex(&store.superblock().uuid);
        let bad = |reason: String| OwnershipError::Bad {
            path: path.to_path_buf(),
            reason,
        };
        let io = |source| OwnershipError::Io {
            path: path.to_path_buf(),
            source,
        };
        check_dir(device, path)?;
        let file = match std::fs::read(path) {
            Ok(b) => Some(
                serde_json::from_slice::<OwnersFile>(&b)
                    .map_err(|e| bad(format!("not an ownership file: {e}")))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        if file.is_none() {
            // Allocated space with no file: the file is elsewhere (or the
            // device was served without tenants), never a fresh start.
            let free: u64 = store.committed_free_extents().iter().map(|e| e.len()).sum();
            let blocks = capacity.saturating_sub(free + store.layout().meta_blocks);
            if blocks > 0 {
                return Err(OwnershipError::Missing {
                    device: device.to_string(),
                    path: path.to_path_buf(),
                    blocks,
                });
            }
        }
        let region_blocks = match &file {
            Some(f) => {
                if f.format != FORMAT {
                    return Err(bad(format!("format {:?}, expected {FORMAT:?}", f.format)));
                }
                if f.store_uuid != uuid || f.capacity_blocks != capacity {
                    return Err(bad(format!(
                        "it describes store {} of {} blocks, but {device} is store {uuid} of {capacity} blocks",
                        f.store_uuid, f.capacity_blocks
                    )));
                }
                if f.region_blocks == 0 || !f.region_blocks.is_power_of_two() {
                    return Err(bad(format!("region size {} blocks", f.region_blocks)));
                }
                f.region_blocks
            }
            None if region_bytes > 0 => (region_bytes / geo.block_size()).max(1),
            None => region_blocks_for(capacity, geo.block_size()),
        };
        let n = capacity.div_ceil(region_blocks);
        let mut table = vec![None; n as usize];
        if let Some(f) = &file {
            for (name, regions) in &f.tenants {
                for &r in regions {
                    match table.get_mut(r as usize) {
                        Some(slot @ None) => *slot = Some(name.clone()),
                        Some(Some(other)) => {
                            return Err(bad(format!(
                                "region {r} is listed for both {other:?} and {name:?}"
                            )))
                        }
                        None => return Err(bad(format!("region {r} is past the device"))),
                    }
                }
            }
        }
        let pools = tenants
            .iter()
            .map(|t| Pool {
                tenant: Arc::clone(t),
                state: Mutex::new(PoolState {
                    res: store.empty_reservation(),
                    engine: SegFitAllocator::from_free_extents(capacity, &[])
                        .expect("an empty free list is valid"),
                    used: 0,
                    leased: 0,
                    regions: BTreeMap::new(),
                }),
            })
            .collect();
        let mut owners = DeviceOwners {
            device: device.to_string(),
            store: Arc::clone(store),
            path: path.to_path_buf(),
            uuid,
            capacity,
            meta: store.layout().meta_blocks,
            region_blocks,
            table: Mutex::new(table),
            pools,
            removed: RemovedSpace::default(),
        };
        owners.check_and_fill(tenants)?;
        Ok(owners)
    }

    /// The blocks of region `r` that can hold data (the metadata area cut
    /// off), if any.
    fn data_extent(&self, r: u64) -> Option<Extent> {
        let start = (r * self.region_blocks).max(self.meta);
        let end = ((r + 1) * self.region_blocks).min(self.capacity);
        Extent::from_range(start, end).ok()
    }

    /// Checks every region against the store's allocations, fills the
    /// configured tenants' pools, and settles the regions of tenants no
    /// longer configured: an empty one returns to the unassigned regions
    /// (recorded before anyone can be given it), one holding allocations
    /// stays theirs and is reported.
    fn check_and_fill(&mut self, tenants: &Tenants) -> Result<(), OwnershipError> {
        let table = lock(&self.table).clone();
        let mut free_in = vec![0u64; table.len()];
        for f in self.store.committed_free_extents() {
            for (r, n) in by_region(f, self.region_blocks) {
                free_in[r as usize] += n;
            }
        }
        let mut emptied: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        let mut kept: BTreeMap<&str, RemovedSpace> = BTreeMap::new();
        for (r, owner) in table.iter().enumerate() {
            let r = r as u64;
            let Some(data) = self.data_extent(r) else {
                continue;
            };
            let allocated = data.len() - free_in[r as usize];
            match owner.as_deref().map(|n| (n, tenants.by_name(n))) {
                None if allocated > 0 => {
                    return Err(OwnershipError::Unowned {
                        device: self.device.clone(),
                        path: self.path.clone(),
                        region: r,
                        start: data.start(),
                        end: data.end(),
                        blocks: allocated,
                    })
                }
                None => {}
                Some((_, Some(t))) => {
                    let mut p = lock(&self.pools[t.id].state);
                    self.take_region(&mut p, r, data)
                        .map_err(|source| OwnershipError::Store {
                            device: self.device.clone(),
                            source,
                        })?;
                    p.used += allocated;
                }
                Some((name, None)) if allocated == 0 => emptied.entry(name).or_default().push(r),
                Some((name, None)) => {
                    let k = kept.entry(name).or_default();
                    k.regions += 1;
                    k.blocks += allocated;
                }
            }
        }
        if !emptied.is_empty() {
            let mut next = table.clone();
            for &r in emptied.values().flatten() {
                next[r as usize] = None;
            }
            // Unwritable, the regions stay assigned: safe, only not reused.
            match self.save(&next) {
                Ok(()) => {
                    *lock(&self.table) = next;
                    for (tenant, regions) in &emptied {
                        tracing::info!(
                            device = %self.device,
                            tenant,
                            regions = regions.len(),
                            "empty regions of a tenant no longer configured returned to the device"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(device = %self.device, error = %e, "keeping the empty regions of tenants no longer configured")
                }
            }
        }
        for (tenant, k) in &kept {
            tracing::warn!(
                device = %self.device,
                tenant,
                regions = k.regions,
                blocks = k.blocks,
                "a tenant no longer configured holds allocations; its regions stay assigned until they are freed (declare the tenant again and free them)"
            );
            self.removed.regions += k.regions;
            self.removed.blocks += k.blocks;
        }
        Ok(())
    }

    /// The free blocks of every configured tenant's pool: free space the
    /// store counts as reserved.
    pub(crate) fn pooled_free(&self) -> u64 {
        self.pools.iter().map(|p| lock(&p.state).res.blocks()).sum()
    }

    /// The regions of tenants no longer configured that still hold
    /// allocations (fixed while the server runs: no caller can reach
    /// them).
    pub(crate) fn removed(&self) -> RemovedSpace {
        self.removed
    }

    /// Moves the free blocks of region `r` into a pool.
    fn take_region(&self, p: &mut PoolState, r: u64, data: Extent) -> Result<(), StoreError> {
        let taken = p.res.take_range(data)?;
        let mut free = 0;
        for e in taken {
            p.engine
                .free(e)
                .expect("taken from the store, so not free here");
            free += e.len();
        }
        p.regions.insert(r, data.len() - free);
        Ok(())
    }

    fn save(&self, table: &[Option<String>]) -> Result<(), ServiceError> {
        let mut tenants: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (r, o) in table.iter().enumerate() {
            if let Some(o) = o {
                tenants.entry(o.clone()).or_default().push(r as u64);
            }
        }
        let f = OwnersFile {
            format: FORMAT.into(),
            store_uuid: self.uuid.clone(),
            capacity_blocks: self.capacity,
            region_blocks: self.region_blocks,
            tenants,
        };
        let mut bytes = serde_json::to_vec_pretty(&f).expect("plain data serializes");
        bytes.push(b'\n');
        write_atomically(&self.path, &bytes).map_err(|e| {
            ServiceError::Ownership(format!(
                "cannot record region ownership in {}: {e}",
                self.path.display()
            ))
        })
    }

    /// Assigns one more region to the pool's tenant: recorded durably
    /// first, then its free space moves into the pool. False when every
    /// region is taken.
    fn grow(&self, pool: &Pool, p: &mut PoolState) -> Result<bool, ServiceError> {
        let mut table = lock(&self.table);
        // Next to the tenant's last region when free (a run of regions lets
        // large objects span them), else the first free one.
        let after = p.regions.keys().next_back().map_or(0, |&r| r + 1);
        let pick = (after..table.len() as u64)
            .chain(0..after)
            .find(|&r| table[r as usize].is_none() && self.data_extent(r).is_some());
        let Some(r) = pick else {
            return Ok(false);
        };
        let mut next = table.clone();
        next[r as usize] = Some(pool.tenant.name.clone());
        self.save(&next)?;
        *table = next;
        drop(table);
        let data = self.data_extent(r).expect("picked with data");
        self.take_region(p, r, data)?;
        Ok(true)
    }

    /// Gives back every region of `touched` the tenant no longer uses
    /// (keeping at least one).
    fn shrink(&self, p: &mut PoolState, touched: impl IntoIterator<Item = u64>) {
        for r in touched {
            if p.regions.len() <= 1 || p.regions.get(&r) != Some(&0) {
                continue;
            }
            let mut table = lock(&self.table);
            let mut next = table.clone();
            next[r as usize] = None;
            // When the table cannot be written the region stays the
            // tenant's, which is safe.
            if self.save(&next).is_err() {
                continue;
            }
            *table = next;
            drop(table);
            let data = self.data_extent(r).expect("an owned region has data");
            p.engine.take_free_range(data);
            p.res.release_range(data);
            p.regions.remove(&r);
        }
    }

    /// [`Self::shrink`] over every region of the pool (after a request
    /// that grew the pool failed).
    fn shrink_all(&self, p: &mut PoolState) {
        let all: Vec<u64> = p.regions.keys().copied().collect();
        self.shrink(p, all);
    }

    fn charge(p: &mut PoolState, e: Extent, region_blocks: u64, sign: i8) {
        for (r, n) in by_region(e, region_blocks) {
            if let Some(u) = p.regions.get_mut(&r) {
                if sign > 0 {
                    *u += n;
                } else {
                    *u -= n;
                }
            }
        }
    }

    /// The pool of `tenant`.
    pub(crate) fn pool(&self, tenant: &Tenant) -> &Pool {
        &self.pools[tenant.id]
    }

    /// The region size in blocks.
    pub(crate) fn region_blocks(&self) -> u64 {
        self.region_blocks
    }

    /// The tenant's quota in blocks of this device.
    fn quota_blocks(&self, tenant: &Tenant) -> Option<u64> {
        tenant
            .quota_bytes
            .map(|b| b / self.store.geometry().block_size())
    }

    /// `Ok` when `blocks` more fit in the tenant's quota.
    fn check_quota(&self, t: &Tenant, p: &PoolState, blocks: u64) -> Result<(), ServiceError> {
        match self.quota_blocks(t) {
            Some(q) if p.used + p.leased + blocks > q => {
                let bs = self.store.geometry().block_size();
                Err(ServiceError::QuotaExceeded {
                    tenant: t.name.clone(),
                    device: self.device.clone(),
                    quota_bytes: t.quota_bytes.unwrap_or(0),
                    held_bytes: (p.used + p.leased) * bs,
                    asked_bytes: blocks * bs,
                })
            }
            _ => Ok(()),
        }
    }

    /// Quota blocks the tenant may still take (`u64::MAX` without a quota).
    fn room(&self, t: &Tenant, p: &PoolState) -> u64 {
        self.quota_blocks(t)
            .map_or(u64::MAX, |q| q.saturating_sub(p.used + p.leased))
    }

    /// Picks `len` blocks from the pool (one extent, or several when
    /// `scattered`), growing it by regions as needed: at most as many as
    /// `len` could fill, plus one, so that a request that can never fit does
    /// not sweep the device's regions into the pool.
    fn pick(
        &self,
        pool: &Pool,
        p: &mut PoolState,
        len: u64,
        scattered: bool,
        hint: Option<u64>,
    ) -> Result<Vec<Extent>, ServiceError> {
        let mut growth = len.div_ceil(self.region_blocks) + 1;
        loop {
            let r = if scattered {
                let mut out = Vec::new();
                p.engine.allocate_scattered(len, &mut out).map(|()| out)
            } else {
                p.engine.allocate(len, hint).map(|e| vec![e])
            };
            match r {
                Ok(v) => return Ok(v),
                Err(AllocError::NoSpace { .. }) => {
                    if growth == 0 || !self.grow(pool, p)? {
                        return Err(ServiceError::TenantFull {
                            tenant: pool.tenant.name.clone(),
                            device: self.device.clone(),
                            blocks: len,
                        });
                    }
                    growth -= 1;
                }
                Err(e) => return Err(ServiceError::Store(StoreError::Alloc(e))),
            }
        }
    }

    /// Takes `extents` (picked from the pool) out of it into a reservation
    /// of their own and charges them to the tenant.
    fn hand_out(&self, p: &mut PoolState, extents: &[Extent]) -> Reservation {
        let mut out = p.res.store().empty_reservation();
        for &e in extents {
            let piece = p.res.split_off(e).expect("picked from the pool");
            out.merge(piece).expect("same store");
            Self::charge(p, e, self.region_blocks, 1);
        }
        out
    }

    /// Returns extents that were not allocated after all (free in the
    /// store, or still held by `back`) to the pool.
    fn take_back_extents(&self, p: &mut PoolState, back: Reservation, extents: &[Extent]) {
        let _ = p.res.merge(back);
        for &e in extents {
            // Pieces a failed publish gave back to the store's free space.
            let _ = p.res.take_range(e);
            if p.engine.free(e).is_ok() {
                Self::charge(p, e, self.region_blocks, -1);
            }
        }
    }

    /// Allocates `count` objects of `blocks` blocks for `tenant`, all or
    /// nothing, in `txn`: durable with it. When `txn` fails, hand the
    /// allocation to [`Self::allocation_failed`].
    pub(crate) fn allocate_in(
        &self,
        tenant: &Tenant,
        count: u32,
        blocks: u64,
        scattered: bool,
        hint: Option<u64>,
        txn: &mut Txn<'_>,
    ) -> Result<PoolAllocation, ServiceError> {
        let pool = self.pool(tenant);
        let total = blocks.saturating_mul(u64::from(count));
        let mut p = lock(&pool.state);
        self.check_quota(tenant, &p, total)?;
        let mut objects = Vec::with_capacity(count as usize);
        let mut hint = hint;
        for _ in 0..count {
            match self.pick(pool, &mut p, blocks, scattered, hint) {
                Ok(o) => {
                    hint = hint.map(|_| o[o.len() - 1].end());
                    objects.push(o);
                }
                Err(e) => {
                    for o in &objects {
                        for &x in o {
                            p.engine.free(x).expect("picked before");
                        }
                    }
                    self.shrink_all(&mut p);
                    return Err(e);
                }
            }
        }
        let all: Vec<Extent> = objects.iter().flatten().copied().collect();
        let mut res = self.hand_out(&mut p, &all);
        p.used += total;
        if let Err(e) = res.publish_in(txn, &all, &[]) {
            p.used -= total;
            self.take_back_extents(&mut p, res, &all);
            return Err(e.into());
        }
        Ok(PoolAllocation {
            objects,
            res,
            total,
        })
    }

    /// The transaction of an [`Self::allocate_in`] failed: its blocks come
    /// back into the pool.
    pub(crate) fn allocation_failed(&self, tenant: &Tenant, a: PoolAllocation) {
        let mut p = lock(&self.pool(tenant).state);
        p.used -= a.total;
        let all: Vec<Extent> = a.objects.iter().flatten().copied().collect();
        self.take_back_extents(&mut p, a.res, &all);
    }

    /// `Ok` when every block of `extents` lies in regions of `tenant`.
    pub(crate) fn check_owned(
        &self,
        tenant: &Tenant,
        extents: &[Extent],
    ) -> Result<(), ServiceError> {
        let table = lock(&self.table);
        for &e in extents {
            for (r, _) in by_region(e, self.region_blocks) {
                if table.get(r as usize).and_then(|o| o.as_deref()) != Some(tenant.name.as_str()) {
                    return Err(ServiceError::PermissionDenied(format!(
                        "extent {}+{} on device {} is not space of tenant {}",
                        e.start(),
                        e.len(),
                        self.device,
                        tenant.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// After `extents` (owned by the tenant) were freed durably: their
    /// blocks come back into the pool.
    pub(crate) fn freed(&self, tenant: &Tenant, extents: &[Extent]) {
        let pool = self.pool(tenant);
        let mut p = lock(&pool.state);
        let mut touched = Vec::new();
        for &e in extents {
            p.used -= e.len();
            if let Ok(taken) = p.res.take_range(e) {
                for piece in taken {
                    p.engine.free(piece).expect("was allocated in the pool");
                }
            }
            Self::charge(&mut p, e, self.region_blocks, -1);
            touched.extend(by_region(e, self.region_blocks).map(|(r, _)| r));
        }
        self.shrink(&mut p, touched);
    }

    /// After `frees` (owned by the tenant) were freed durably by a commit
    /// of the lease holding `lease`: their blocks join the lease instead of
    /// the pool (they move from the tenant's used blocks to its leased
    /// ones, so the quota charge stays). Returns the extents taken.
    pub(crate) fn recycle(
        &self,
        tenant: &Tenant,
        frees: &[Extent],
        lease: &mut Reservation,
    ) -> Vec<Extent> {
        let mut p = lock(&self.pool(tenant).state);
        let mut out = Vec::new();
        let mut lost = Vec::new();
        for &e in frees {
            p.used -= e.len();
            // Nobody else allocates in the tenant's regions, so all of `e`
            // is free and taken, unless the store failed: then the blocks
            // are free in the store and no longer the tenant's.
            let taken = lease.take_range(e).unwrap_or_default();
            let mut at = e.start();
            for &t in &taken {
                lost.extend(Extent::from_range(at, t.start()).ok());
                at = t.end();
                p.leased += t.len();
            }
            lost.extend(Extent::from_range(at, e.end()).ok());
            out.extend(taken);
        }
        for gap in lost {
            Self::charge(&mut p, gap, self.region_blocks, -1);
        }
        out
    }

    /// Carves a lease of `min..=target` blocks (contiguous) for `tenant`
    /// from its pool, charging it to the quota.
    pub(crate) fn carve(
        &self,
        tenant: &Tenant,
        min: u64,
        target: u64,
        hint: Option<u64>,
    ) -> Result<Reservation, ServiceError> {
        let pool = self.pool(tenant);
        let mut p = lock(&pool.state);
        let room = self.room(tenant, &p);
        if room < min {
            self.check_quota(tenant, &p, min)?;
        }
        let cap = self.region_blocks.min(room);
        let mut size = target.min(cap).max(min);
        let mut growth = min.div_ceil(self.region_blocks) + 1;
        let e = loop {
            match p.engine.allocate(size, hint) {
                Ok(e) => break e,
                Err(AllocError::NoSpace { .. }) if size / 2 >= min => size /= 2,
                Err(AllocError::NoSpace { .. }) => {
                    if growth == 0 || !self.grow(pool, &mut p)? {
                        self.shrink_all(&mut p);
                        return Err(ServiceError::TenantFull {
                            tenant: tenant.name.clone(),
                            device: self.device.clone(),
                            blocks: min,
                        });
                    }
                    growth -= 1;
                    size = target.min(cap).max(min);
                }
                Err(e) => return Err(ServiceError::Store(StoreError::Alloc(e))),
            }
        };
        let res = self.hand_out(&mut p, &[e]);
        p.leased += e.len();
        Ok(res)
    }

    /// A lease's commit published `allocs` blocks: they move from leased to
    /// used.
    pub(crate) fn committed(&self, tenant: &Tenant, allocs: u64) {
        let mut p = lock(&self.pool(tenant).state);
        p.leased -= allocs;
        p.used += allocs;
    }

    /// The commit that [`Self::committed`] counted failed: its `allocs`
    /// blocks are leased again (until [`Self::publish_failed`] takes them
    /// back).
    pub(crate) fn committed_failed(&self, tenant: &Tenant, allocs: u64) {
        let mut p = lock(&self.pool(tenant).state);
        p.used -= allocs;
        p.leased += allocs;
    }

    /// The unused rest of a lease comes back into the pool; returns its
    /// blocks.
    pub(crate) fn return_lease(&self, tenant: &Tenant, res: Reservation) -> u64 {
        let pool = self.pool(tenant);
        let mut p = lock(&pool.state);
        let extents = res.extents();
        let n = res.blocks();
        let _ = p.res.merge(res);
        let mut touched = Vec::new();
        for e in extents {
            p.engine.free(e).expect("handed out of the pool");
            Self::charge(&mut p, e, self.region_blocks, -1);
            touched.extend(by_region(e, self.region_blocks).map(|(r, _)| r));
        }
        p.leased -= n;
        self.shrink(&mut p, touched);
        n
    }

    /// A lease restored from the journal holds `blocks` of the tenant's
    /// regions: the load counted them as allocated, they are leased.
    pub(crate) fn adopt_lease(&self, tenant: &Tenant, blocks: u64) {
        let mut p = lock(&self.pool(tenant).state);
        p.used -= blocks;
        p.leased += blocks;
    }

    /// A failed lease publish gave `allocs` back to the store's free space:
    /// take what is free of them back into the pool.
    pub(crate) fn publish_failed(&self, tenant: &Tenant, allocs: &[Extent]) {
        let mut p = lock(&self.pool(tenant).state);
        for &a in allocs {
            if let Ok(taken) = p.res.take_range(a) {
                for piece in taken {
                    p.engine.free(piece).expect("was handed out");
                    p.leased -= piece.len();
                    Self::charge(&mut p, piece, self.region_blocks, -1);
                }
            }
        }
    }

    /// The tenant's numbers on this device. O(1): counters kept by every
    /// operation, read under the pool's lock.
    pub(crate) fn usage(&self, tenant: &Tenant) -> TenantUsage {
        let p = lock(&self.pool(tenant).state);
        TenantUsage {
            used: p.used,
            leased: p.leased,
            free: p.res.blocks(),
            free_extents: p.engine.free_extent_count(),
            regions: p.regions.len() as u64,
            quota: self.quota_blocks(tenant).unwrap_or(0),
        }
    }

    /// Every configured tenant with its [`Self::usage`], in configuration
    /// order.
    pub(crate) fn usages(&self) -> impl Iterator<Item = (&Tenant, TenantUsage)> + '_ {
        self.pools
            .iter()
            .map(|p| (&*p.tenant, self.usage(&p.tenant)))
    }

    /// The free blocks of the pool and of the device's unassigned space:
    /// what the tenant could still get.
    pub(crate) fn reachable_free(&self, tenant: &Tenant) -> u64 {
        lock(&self.pool(tenant).state).res.blocks() + self.store.free_blocks()
    }
}
