//! [`ServedDevice`]: a device the server serves, and what the rest of the
//! server reads of it without asking its owner (counters for metrics and
//! Status, recall signals for the `WatchRecalls` streams).
//!
//! Only the device's owner ([`crate::owner`]) changes the counters; they are
//! atomics so that a scrape never waits for the owner.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use blockalloc_store::Store;

use crate::error::ServiceError;
use crate::ownership::{DeviceOwners, Home};
use crate::tenants::Tenant;

/// A device served by the server.
#[derive(Debug)]
pub struct ServedDevice {
    /// The name clients address it by.
    pub name: String,
    /// Its store.
    pub store: Arc<Store>,
    /// Blocks inside live leases not yet committed.
    pub(crate) leased: AtomicU64,
    /// Live leases.
    pub(crate) leases: AtomicU64,
    /// The fragments the holders of the live leases last reported (free
    /// blocks in runs of at most 1024 blocks inside them), over all of them.
    pub(crate) lease_fragments: AtomicU64,
    /// Calls sent to the device's owner and not yet taken by it.
    pub(crate) queued: AtomicU64,
    /// Lease events since the server started, for metrics.
    pub(crate) events: LeaseEvents,
    /// Recalls as they start, for the `WatchRecalls` streams.
    pub(crate) recalls: tokio::sync::watch::Sender<RecallSignal>,
    /// Where the region ownership of the device is recorded (a server with
    /// tenants needs one per device).
    pub(crate) owners_file: Option<PathBuf>,
    /// With tenants: the regions and tenant pools.
    pub(crate) owners: OnceLock<Arc<DeviceOwners>>,
    /// Its owner epoch (see `docs/design.md`), raised when the server
    /// takes it.
    epoch: AtomicU64,
    /// The least epoch to take it with, from outside (a coordination
    /// service's revision).
    pub(crate) min_epoch: Option<u64>,
}

/// Whose leases a recall asks back: on a server with tenants a tenant's
/// (by id) — its leases come from its own pool, so nobody else's space
/// would help it — else everyone's (`None`).
pub(crate) type Scope = Option<usize>;

/// The recall scope of a caller of tenant `t` (none on a server without
/// tenants).
pub(crate) fn scope_of(t: Option<&Tenant>) -> Scope {
    t.map(|t| t.id)
}

/// The recall scope of a caller with `home` (its tenant's pool) or none.
pub(crate) fn scope(home: Option<&Home>) -> Scope {
    scope_of(home.map(|h| &*h.tenant))
}

/// What the `WatchRecalls` streams of a device follow.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecallSignal {
    /// Per scope, the recalls started since the server started.
    pub started: HashMap<Scope, u64>,
    /// Per scope, until when the newest recall runs.
    pub until: HashMap<Scope, Instant>,
    /// The server is stopping: the streams end.
    pub closed: bool,
}

impl RecallSignal {
    /// Whether a recall of `scope` runs at `now`.
    pub(crate) fn recalling(&self, scope: Scope, now: Instant) -> bool {
        self.until.get(&scope).is_some_and(|&t| now < t)
    }
}

/// Counts of lease events on one device.
#[derive(Debug, Default)]
pub(crate) struct LeaseEvents {
    pub grants: AtomicU64,
    pub extensions: AtomicU64,
    pub recycled_blocks: AtomicU64,
    pub releases: AtomicU64,
    pub expiries: AtomicU64,
    pub recalls: AtomicU64,
    /// Leases restored from the journal at start.
    pub restored: AtomicU64,
}

/// Adds one to an event counter.
pub(crate) fn count(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl ServedDevice {
    /// A device named `name` over `store`.
    pub fn new(name: impl Into<String>, store: Arc<Store>) -> Self {
        ServedDevice {
            name: name.into(),
            store,
            leased: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            lease_fragments: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            events: LeaseEvents::default(),
            recalls: tokio::sync::watch::channel(RecallSignal::default()).0,
            owners_file: None,
            owners: OnceLock::new(),
            epoch: AtomicU64::new(0),
            min_epoch: None,
        }
    }

    /// Takes the device with owner epoch `epoch` (from a coordination
    /// service, say) instead of its epoch plus one: it must be above the
    /// device's epoch, or the server refuses to start (another owner took
    /// the device since).
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.min_epoch = Some(epoch);
        self
    }

    /// Its owner epoch: 0 until the server took it.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub(crate) fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// Records the device's region ownership (with tenants) in `path`,
    /// written atomically on each change; see `docs/design.md`.
    pub fn with_owners_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.owners_file = Some(path.into());
        self
    }

    /// The tenant `t` may use this device: `Err(PermissionDenied)` if not.
    pub(crate) fn check_tenant(&self, t: Option<&Tenant>) -> Result<(), ServiceError> {
        match t {
            Some(t) if !t.may_use(&self.name) => Err(ServiceError::PermissionDenied(format!(
                "tenant {} may not use device {}",
                t.name, self.name
            ))),
            _ => Ok(()),
        }
    }

    /// The caller's tenant and this device's pools, on a server with
    /// tenants.
    pub(crate) fn home(&self, t: Option<&Arc<Tenant>>) -> Option<Home> {
        Some(Home {
            owners: Arc::clone(self.owners.get()?),
            tenant: Arc::clone(t?),
        })
    }

    /// Blocks inside live leases that are not committed yet.
    pub fn leased_unused_blocks(&self) -> u64 {
        self.leased.load(Ordering::Relaxed)
    }

    /// The fragments the holders of the live leases last reported, over
    /// all of them.
    pub fn leased_fragment_blocks(&self) -> u64 {
        self.lease_fragments.load(Ordering::Relaxed)
    }

    /// Calls sent to the device's owner thread and not yet taken by it.
    pub fn queued_calls(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Live leases.
    pub fn live_leases(&self) -> u64 {
        self.leases.load(Ordering::Relaxed)
    }
}
