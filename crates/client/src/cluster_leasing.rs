//! [`ClusterLeasing`]: leased allocation across a cluster's devices — one
//! lease per device in use, moving to another device when one fills.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use blockalloc::Extent;

use crate::calls::lock;
use crate::cluster::{Cluster, Placement};
use crate::error::{ClientError, Result};
use crate::leasing::{LeaseOptions, LeasingAllocator};

/// Allocation at local speed across a cluster: a [`LeasingAllocator`] per
/// device it uses, each following its device's owner
/// ([`Cluster::leasing`]), so that a lease survives a failover.
///
/// Allocations go to one device at a time, chosen as
/// [`Cluster::allocate`] chooses (two random choices over free space, within
/// the [`Placement`]); when that device has no room (its lease and the
/// per-call fallback both say so), the allocator moves to the next device
/// the placement chooses, keeping the old lease for frees and commits.
/// Every allocation names its device; free it with the same name.
///
/// ```no_run
/// # async fn demo(cluster: blockalloc_client::Cluster) -> Result<(), blockalloc_client::ClientError> {
/// use blockalloc_client::{ClusterLeasing, LeaseOptions, Placement};
///
/// let alloc = ClusterLeasing::new(cluster, Placement::default(), LeaseOptions::default());
/// let (device, extent) = alloc.allocate(256).await?; // local, after the first lease
/// alloc.commit().await?; // durable now
/// alloc.free(&device, extent).await?;
/// alloc.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ClusterLeasing {
    cluster: Cluster,
    place: Placement,
    opts: LeaseOptions,
    /// The device allocations go to now.
    current: Mutex<Option<String>>,
    /// A leasing allocator per device used.
    leases: Mutex<HashMap<String, Arc<LeasingAllocator>>>,
}

impl ClusterLeasing {
    /// Leased allocation on `cluster`'s devices that `place` allows, each
    /// lease with `opts` (its device is chosen here). Call it inside a
    /// tokio runtime.
    pub fn new(cluster: Cluster, place: Placement, opts: LeaseOptions) -> ClusterLeasing {
        ClusterLeasing {
            cluster,
            place,
            opts,
            current: Mutex::default(),
            leases: Mutex::default(),
        }
    }

    /// The leasing allocator of `device`, made at first use.
    fn lease(&self, device: &str) -> Result<Arc<LeasingAllocator>> {
        let mut m = lock(&self.leases);
        if let Some(l) = m.get(device) {
            return Ok(Arc::clone(l));
        }
        let l = Arc::new(self.cluster.leasing(device, &self.opts)?);
        m.insert(device.to_owned(), Arc::clone(&l));
        Ok(l)
    }

    /// Allocates `blocks` contiguous blocks on the current device, or on
    /// the next one the placement chooses when it has no room. Returns the
    /// device and the extent, pending until committed (see
    /// [`LeasingAllocator`] for the writer's rule).
    ///
    /// # Errors
    /// [`ClientError::NoSpace`] when no device the placement allows has
    /// room; as [`LeasingAllocator::allocate`].
    pub async fn allocate(&self, blocks: u64) -> Result<(String, Extent)> {
        let mut tried = HashSet::new();
        loop {
            let current = lock(&self.current).clone();
            let device = match current {
                Some(d) if !tried.contains(&d) => d,
                _ => {
                    let Some(d) = self.cluster.choose(&self.place, blocks, &tried) else {
                        return Err(ClientError::NoSpace {
                            reason: format!(
                                "no device of the cluster that the placement allows has room \
                                 for {blocks} blocks ({} tried)",
                                tried.len()
                            ),
                            details: None,
                        });
                    };
                    *lock(&self.current) = Some(d.clone());
                    d
                }
            };
            tried.insert(device.clone());
            match self.lease(&device)?.allocate(blocks).await {
                Ok(e) => return Ok((device, e)),
                Err(ClientError::NoSpace { .. }) => {
                    self.cluster.set_free_estimate(&device, 0);
                    let mut cur = lock(&self.current);
                    if cur.as_deref() == Some(device.as_str()) {
                        *cur = None;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Frees `e`, allocated on `device` by this allocator (see
    /// [`LeasingAllocator::free`]).
    ///
    /// # Errors
    /// [`ClientError::Refused`] for a device this allocator never used; as
    /// [`LeasingAllocator::free`].
    pub async fn free(&self, device: &str, e: Extent) -> Result<()> {
        let l = lock(&self.leases).get(device).cloned();
        match l {
            Some(l) => l.free(e).await,
            None => Err(ClientError::Refused {
                code: tonic::Code::InvalidArgument,
                reason: format!("device {device:?}: this allocator allocated nothing there"),
            }),
        }
    }

    /// Commits what every device's lease holds pending.
    ///
    /// # Errors
    /// The first error of a device's [`LeasingAllocator::commit`] (every
    /// device is committed regardless).
    pub async fn commit(&self) -> Result<()> {
        let all: Vec<_> = lock(&self.leases).values().cloned().collect();
        let mut first = Ok(());
        for l in all {
            let r = l.commit().await;
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Commits everything pending and closes every device's lease.
    ///
    /// # Errors
    /// The first error of a device's [`LeasingAllocator::close`].
    pub async fn close(self) -> Result<()> {
        let all: Vec<_> = lock(&self.leases).drain().map(|(_, l)| l).collect();
        let mut first = Ok(());
        for l in all {
            let r = match Arc::try_unwrap(l) {
                Ok(l) => l.close().await,
                // Still borrowed by a call in flight elsewhere: commit.
                Err(l) => l.commit().await,
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}
