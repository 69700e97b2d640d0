//! The lease table: which client holds which reservation of which device,
//! until when, and how large its next grant should be.
//!
//! A lease is a [`Reservation`] of the device's store with a deadline. It
//! is charged against free space when granted (the blocks leave the engine's
//! free space), so a grant never over-commits the device and Status's free
//! space never counts a lease's unused part.
//!
//! Operations:
//! * grant — sized from the client's rate: a client that comes back for a
//!   new lease within one TTL of its last grant used it up quickly, so its
//!   next grant doubles (up to the cap); one silent for four TTLs is
//!   forgotten and starts over at the initial size. A grant is at most 1/8 of the
//!   device's unleased free space (Lustre's rule near full), and shrinks by
//!   halves to the client's minimum when no free run is long enough.
//! * extend — a grant sized and limited exactly as a new one, added to a
//!   live lease of the caller (one deadline, one unused remainder, one
//!   release) instead of starting another: a client that keeps one lease
//!   never strands the unused tail of an older one.
//! * commit — publishes allocations inside the lease; idempotent per
//!   (lease, sequence): the last sequence's reply is kept and resent. The
//!   reply asks for the lease back while a recall is in progress. With
//!   recycling, the blocks the commit frees join the lease once the free is
//!   durable (not during a recall): the client reuses them locally, as an
//!   in-process engine reuses freed space at once. Replies carry what a
//!   further grant could take (`grantable`), which the client's engine
//!   counts as long runs it can add, so that it asks for a run rather than
//!   cut slivers from fragments.
//! * renew — moves the deadline; the reply asks for the lease back
//!   (recall) when the device's unleased free space is low or a recall is
//!   in progress.
//! * recall — a grant refused for want of space (less unleased room than
//!   its minimum, which the leases' unused space would make up, or the
//!   device in its per-call end) starts a recall on its device for one
//!   TTL (a minimum no grant could meet, above the largest lease, the
//!   device or the tenant's quota, is refused alone): commit and renew
//!   replies ask every holder for its lease back (and the device's
//!   `WatchRecalls` streams announce it at once), and no lease is granted
//!   meanwhile (clients allocate per call), so that the unused remainders
//!   return to free space and a client reports "no space" only once the
//!   device truly has none.
//! * release / expiry — the unused rest returns to free space. Ended ids are
//!   remembered as "expired or released" for as long as the server runs
//!   (ids are sequential within a run), so a late caller learns why.
//!
//! Locks: the table lock is held only to find, insert or remove entries;
//! each lease has its own lock, held across a commit (which waits for the
//! device), so commits of different leases proceed in parallel.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use blockalloc::{AllocError, Extent};
use blockalloc_store::{Reservation, Store, StoreError};

use crate::config::Config;
use crate::error::{LeaseEnd, ServiceError};
use crate::limits::LeaseSlot;
use crate::ownership::DeviceOwners;
use crate::pace::StorePace;
use crate::tenants::Tenant;

/// The per-call end of a device is at most `1 / PER_CALL_END_DIVISOR` of it.
const PER_CALL_END_DIVISOR: u64 = 4;

/// With `lease_max_blocks = 0`, the largest lease is 1 / this of a device,
/// and at least [`LEASE_MAX_FLOOR`] blocks.
const LEASE_MAX_DIVISOR: u64 = 128;
const LEASE_MAX_FLOOR: u64 = 1 << 18;

/// The longest free run that counts as a fragment, as segfit's
/// `fragment_blocks` counts them (the largest object, 4 MiB at 4 KiB).
const FRAGMENT_MAX_BLOCKS: u64 = blockalloc::FRAGMENTATION_REFERENCE_BLOCKS;

/// The blocks of `extents` (in address order) in runs of at most
/// [`FRAGMENT_MAX_BLOCKS`], touching extents taken as one run.
fn fragment_blocks_of(extents: &[Extent]) -> u64 {
    let (mut total, mut run, mut end) = (0, 0, None);
    for e in extents {
        if end != Some(e.start()) {
            total += short_run(run);
            run = 0;
        }
        run += e.len();
        end = Some(e.end());
    }
    total + short_run(run)
}

fn short_run(len: u64) -> u64 {
    if len <= FRAGMENT_MAX_BLOCKS {
        len
    } else {
        0
    }
}

/// How long past one TTL a per-call allocation waits for recalled leases.
const PER_CALL_RECALL_MARGIN: Duration = Duration::from_millis(500);

pub(crate) use crate::sync::lock;

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
    /// Per recall scope (a tenant's leases, or all), the live leases and
    /// the fragments their holders last reported (free blocks in runs of
    /// at most 1024 blocks inside them).
    pub(crate) lease_fragments: Mutex<HashMap<Scope, ScopeFragments>>,
    /// Per recall scope, until when a recall runs: leases are asked back
    /// and none is granted (set when a grant is refused for want of space).
    pub(crate) pressure_until: Mutex<HashMap<Scope, Instant>>,
    /// Lease events since the server started, for metrics.
    pub(crate) events: LeaseEvents,
    /// Recalls as they start, for the `WatchRecalls` streams.
    pub(crate) recalls: tokio::sync::watch::Sender<RecallSignal>,
    /// Where the region ownership of the device is recorded (a server with
    /// tenants needs one per device).
    pub(crate) owners_file: Option<PathBuf>,
    /// With tenants: the regions and tenant pools.
    pub(crate) owners: OnceLock<Arc<DeviceOwners>>,
    /// How long its store calls took lately: where they run.
    pub(crate) pace: Arc<StorePace>,
}

/// Whose leases a recall asks back: on a server with tenants a tenant's
/// (by id) — its leases come from its own pool, so nobody else's space
/// would help it — else everyone's (`None`).
pub(crate) type Scope = Option<usize>;

/// The recall scope of a caller with `home` (its tenant's pool) or none.
pub(crate) fn scope(home: Option<&Home>) -> Scope {
    home.map(|h| h.tenant.id)
}

/// What the `WatchRecalls` streams of a device follow.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecallSignal {
    /// Per scope, the recalls started since the server started.
    pub started: HashMap<Scope, u64>,
    /// The server is stopping: the streams end.
    pub closed: bool,
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
}

impl ServedDevice {
    /// A device named `name` over `store`.
    pub fn new(name: impl Into<String>, store: Arc<Store>) -> Self {
        ServedDevice {
            name: name.into(),
            store,
            leased: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            lease_fragments: Mutex::new(HashMap::new()),
            pressure_until: Mutex::new(HashMap::new()),
            events: LeaseEvents::default(),
            recalls: tokio::sync::watch::channel(RecallSignal::default()).0,
            owners_file: None,
            owners: OnceLock::new(),
            pace: Arc::default(),
        }
    }

    /// Records the device's region ownership (with tenants) in `path`,
    /// written atomically on each change; see `docs/design.md`.
    pub fn with_owners_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.owners_file = Some(path.into());
        self
    }

    /// Calls whose store work ran on the runtime thread that decoded them
    /// (the device answered fast lately; see `Config::inline_store_us`).
    pub fn store_calls_inline(&self) -> u64 {
        self.pace.inline.load(Ordering::Relaxed)
    }

    /// Calls whose store work ran on the blocking pool.
    pub fn store_calls_pooled(&self) -> u64 {
        self.pace.pooled.load(Ordering::Relaxed)
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
        lock(&self.lease_fragments).values().map(|f| f.blocks).sum()
    }

    /// Live leases.
    pub fn live_leases(&self) -> u64 {
        self.leases.load(Ordering::Relaxed)
    }
}

/// The live leases of one recall scope and the fragments reported in them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScopeFragments {
    leases: u64,
    blocks: u64,
}

impl ServedDevice {
    /// The fragments of `scope`'s leases out of any one lease's reach: the
    /// reported sum × (leases − 1) / leases (a lease's engine sees its own;
    /// none with a single lease).
    fn split_fragments(&self, scope: Scope) -> u64 {
        let f = lock(&self.lease_fragments)
            .get(&scope)
            .copied()
            .unwrap_or_default();
        let split = u128::from(f.blocks) * u128::from(f.leases.saturating_sub(1))
            / u128::from(f.leases.max(1));
        u64::try_from(split).unwrap_or(u64::MAX)
    }

    /// Adds a live lease of `scope` (`+1`) or removes one with the
    /// fragments it reported (`-1`).
    fn count_lease(&self, scope: Scope, added: bool, fragments: u64) {
        let mut m = lock(&self.lease_fragments);
        let f = m.entry(scope).or_default();
        if added {
            f.leases += 1;
        } else {
            f.leases = f.leases.saturating_sub(1);
            f.blocks = f.blocks.saturating_sub(fragments);
            if f.leases == 0 {
                m.remove(&scope);
            }
        }
    }
}

/// What a `Commit` carries besides its lease and sequence number.
pub(crate) struct CommitBatch<'a> {
    /// Allocations inside the lease.
    pub allocs: &'a [Extent],
    /// Committed extents to free.
    pub frees: &'a [Extent],
    /// Whether the freed blocks join the lease.
    pub recycle: bool,
    /// The fragments the holder reports in the lease.
    pub fragments: u64,
}

/// What the last commit of a lease was, for idempotent resends.
#[derive(Clone, Debug, Default)]
struct LastCommit {
    seq: u64,
    digest: u64,
    unused_blocks: u64,
    /// The freed blocks it added to the lease.
    recycled: Vec<Extent>,
}

/// A tenant's pool on a device, where its leases come from and return to.
#[derive(Clone)]
pub(crate) struct Home {
    pub owners: Arc<DeviceOwners>,
    pub tenant: Arc<Tenant>,
}

/// One lease.
pub(crate) struct Lease {
    pub id: u64,
    pub device: Arc<ServedDevice>,
    /// The holder's client id.
    client: String,
    /// Blocks granted, extensions and recycled frees included.
    granted: u64,
    granted_at: Instant,
    home: Option<Home>,
    /// `None` once ended.
    res: Option<Reservation>,
    ended: Option<LeaseEnd>,
    deadline: Instant,
    last: LastCommit,
    /// Its place in its client's lease count; `None` once ended.
    slot: Option<LeaseSlot>,
    /// The object size its grants were asked for (the grant's minimum, at
    /// most the first lease size), which sizes the per-call end.
    object: u64,
    /// The fragments its holder last reported, counted in its scope's
    /// entry of the device's `lease_fragments`.
    fragments: u64,
}

/// The unleased free space within reach of a caller with `home`: its
/// tenant's pool and the unassigned regions, or with no tenant the device's.
fn unleased_free(dev: &ServedDevice, home: Option<&Home>) -> u64 {
    match home {
        Some(h) => h.owners.reachable_free(&h.tenant),
        None => dev.store.free_blocks(),
    }
}

/// Returns a reservation taken for a lease to where it came from: the
/// tenant's pool, else the device's free space; returns its blocks.
fn give_back(home: Option<&Home>, res: Reservation) -> u64 {
    match home {
        Some(h) => h.owners.return_lease(&h.tenant, res),
        None => res.cancel(),
    }
}

impl Lease {
    fn end(&mut self, how: LeaseEnd) -> u64 {
        self.ended = Some(how);
        self.slot = None;
        match self.res.take() {
            Some(r) => {
                let n = give_back(self.home.as_ref(), r);
                let d = &self.device;
                d.leased.fetch_sub(n, Ordering::Relaxed);
                let fragments = std::mem::take(&mut self.fragments);
                d.count_lease(scope(self.home.as_ref()), false, fragments);
                d.leases.fetch_sub(1, Ordering::Relaxed);
                let counter = match how {
                    LeaseEnd::Expired => &d.events.expiries,
                    _ => &d.events.releases,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    lease = self.id,
                    client = %self.client,
                    device = %d.name,
                    unused_blocks = n,
                    "lease {}",
                    match how {
                        LeaseEnd::Expired => "expired",
                        _ => "released",
                    }
                );
                n
            }
            None => 0,
        }
    }

    /// Records the holder's report of the fragments in its unused part: at
    /// most that part (a report is advisory and cannot inflate the sum).
    fn note_fragments(&mut self, reported: u64) {
        let Some(res) = &self.res else { return };
        let n = reported.min(res.blocks());
        let old = std::mem::replace(&mut self.fragments, n);
        let mut m = lock(&self.device.lease_fragments);
        let f = m.entry(scope(self.home.as_ref())).or_default();
        f.blocks = f.blocks.saturating_sub(old).saturating_add(n);
    }

    /// What Status shows of this lease; `None` once ended.
    fn info(&self, now: Instant) -> Option<LeaseInfo> {
        let res = self.res.as_ref()?;
        Some(LeaseInfo {
            id: self.id,
            client: self.client.clone(),
            device: Arc::clone(&self.device),
            granted_blocks: self.granted,
            unused_blocks: res.blocks(),
            age: now.saturating_duration_since(self.granted_at),
            expires_in: self.deadline.saturating_duration_since(now),
        })
    }

    fn usable(&mut self, now: Instant) -> Result<&mut Reservation, ServiceError> {
        if self.ended.is_none() && now > self.deadline {
            self.end(LeaseEnd::Expired);
        }
        if let Some(end) = self.ended {
            return Err(ServiceError::LeaseEnded { id: self.id, end });
        }
        Ok(self
            .res
            .as_mut()
            .expect("a live lease holds its reservation"))
    }
}

/// A lease found by id ([`Leases::find`]).
pub(crate) struct Found(Arc<Entry>);

impl Found {
    /// The device the lease is on.
    pub(crate) fn device(&self) -> &Arc<ServedDevice> {
        &self.0.device
    }
}

/// The outcome of a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommitOutcome {
    pub unused_blocks: u64,
    pub replayed: bool,
    pub recall: bool,
    /// The freed blocks added to the lease, in address order.
    pub recycled: Vec<Extent>,
    /// What a further grant could take ([`Leases::grantable`]).
    pub grantable: u64,
}

/// The outcome of a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RenewOutcome {
    pub ttl: Duration,
    pub recall: bool,
    pub unused_blocks: u64,
    /// What a further grant could take ([`Leases::grantable`]).
    pub grantable: u64,
}

/// A live lease as Status shows it.
#[derive(Clone, Debug)]
pub(crate) struct LeaseInfo {
    pub id: u64,
    pub client: String,
    pub device: Arc<ServedDevice>,
    pub granted_blocks: u64,
    pub unused_blocks: u64,
    pub age: Duration,
    pub expires_in: Duration,
}

/// The outcome of a grant.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    pub id: u64,
    pub extents: Vec<Extent>,
    pub ttl: Duration,
    /// What a further grant could take ([`Leases::grantable`]).
    pub grantable: u64,
}

/// What a client asks for in a grant.
pub(crate) struct LeaseAsk<'a> {
    /// The client's own id, which sizes its grants by its rate.
    pub client: &'a str,
    /// The smallest useful grant, in blocks.
    pub min: u64,
    /// The grant it would like, in blocks; 0 for "by my rate".
    pub want: u64,
    /// A block to lease at or near.
    pub hint: Option<u64>,
    /// A live lease of the caller on the device to add the grant to,
    /// instead of starting a new lease.
    pub extend: Option<u64>,
}

/// How large a client's next lease should be.
#[derive(Clone, Copy, Debug)]
struct ClientRate {
    next_blocks: u64,
    last_grant: Instant,
}

/// A table entry: the device is kept outside the lease's lock, so that
/// finding it never waits for a commit in progress.
struct Entry {
    device: Arc<ServedDevice>,
    /// The tenant holding the lease (by id), on a server with tenants.
    tenant: Option<usize>,
    lease: Mutex<Lease>,
}

struct Table {
    leases: HashMap<u64, Arc<Entry>>,
    clients: HashMap<(String, usize), ClientRate>,
    next_seq: u64,
}

/// The lease table of a server.
pub(crate) struct Leases {
    cfg: Config,
    /// The high 32 bits of every lease id of this server run.
    epoch: u64,
    table: Mutex<Table>,
}

fn random_epoch() -> u64 {
    use std::hash::BuildHasher;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now().hash(&mut h);
    std::process::id().hash(&mut h);
    // Never 0, so that a zeroed id is never valid.
    (h.finish() >> 32).max(1)
}

fn digest(allocs: &[Extent], frees: &[Extent], recycle: bool) -> u64 {
    let mut h = DefaultHasher::new();
    recycle.hash(&mut h);
    for e in allocs {
        (0u8, e.start(), e.len()).hash(&mut h);
    }
    for e in frees {
        (1u8, e.start(), e.len()).hash(&mut h);
    }
    h.finish()
}

impl Leases {
    pub(crate) fn new(cfg: Config) -> Self {
        Leases {
            cfg,
            epoch: random_epoch(),
            table: Mutex::new(Table {
                leases: HashMap::new(),
                clients: HashMap::new(),
                next_seq: 1,
            }),
        }
    }

    /// Finds a lease of `caller`, or says why there is none.
    fn get(&self, id: u64, caller: Option<&Tenant>) -> Result<Arc<Entry>, ServiceError> {
        let t = lock(&self.table);
        if let Some(l) = t.leases.get(&id) {
            if l.tenant != caller.map(|c| c.id) {
                return Err(ServiceError::PermissionDenied(format!(
                    "lease {id} belongs to another tenant"
                )));
            }
            return Ok(Arc::clone(l));
        }
        if id >> 32 == self.epoch && (1..t.next_seq).contains(&(id & 0xffff_ffff)) {
            // Granted by this run and gone from the table: it expired or
            // was released.
            return Err(ServiceError::LeaseEnded {
                id,
                end: LeaseEnd::Ended,
            });
        }
        Err(ServiceError::UnknownLease(id))
    }

    /// True while a recall of `scope` runs on the device (a grant was
    /// refused for want of space less than one TTL ago).
    pub(crate) fn recalling(&self, dev: &ServedDevice, now: Instant, scope: Scope) -> bool {
        lock(&dev.pressure_until)
            .get(&scope)
            .is_some_and(|&t| now < t)
    }

    /// Starts (or prolongs) a recall of `scope` on the device; one that
    /// starts is announced to the device's `WatchRecalls` streams.
    fn start_recall(&self, dev: &ServedDevice, now: Instant, scope: Scope) {
        let mut until = lock(&dev.pressure_until);
        // Ended recalls go, so that the map holds live ones only.
        until.retain(|_, t| now < *t);
        let running = until.contains_key(&scope);
        until.insert(scope, now + self.cfg.lease_ttl);
        drop(until);
        if !running {
            dev.recalls
                .send_modify(|r| *r.started.entry(scope).or_default() += 1);
        }
    }

    /// Unused blocks of the leases a recall in `home`'s scope asks back:
    /// the tenant's, on a server with tenants, else every lease's on `dev`.
    pub(crate) fn leased_in_scope(&self, dev: &ServedDevice, home: Option<&Home>) -> u64 {
        match home {
            Some(h) => h.owners.usage(&h.tenant).leased,
            None => dev.leased.load(Ordering::Relaxed),
        }
    }

    /// A per-call allocation of `needed` blocks found no room while leases
    /// in its scope (`home`'s tenant's, or all on `dev`) hold unused space:
    /// starts a recall of that scope and says until when the caller should
    /// try again (one TTL and a margin); `None` when the leases' space would
    /// not make room (none held, or the free space within reach and the
    /// leased blocks together are fewer than `needed`).
    pub(crate) fn recall_for_per_call(
        &self,
        dev: &ServedDevice,
        needed: u64,
        home: Option<&Home>,
    ) -> Option<Instant> {
        let leased = self.leased_in_scope(dev, home);
        let free = unleased_free(dev, home);
        if leased == 0 || free.saturating_add(leased) < needed {
            return None;
        }
        let now = Instant::now();
        self.start_recall(dev, now, scope(home));
        Some(now + self.cfg.lease_ttl + PER_CALL_RECALL_MARGIN)
    }

    /// True when the unleased free space within reach is low enough to ask
    /// for leases back: the device's, or with a `home` the tenant's (its
    /// pool and the unassigned regions; other tenants' free space is no
    /// use to it).
    pub(crate) fn under_pressure(
        &self,
        dev: &ServedDevice,
        now: Instant,
        home: Option<&Home>,
    ) -> bool {
        if self.recalling(dev, now, scope(home)) {
            return true;
        }
        let free = unleased_free(dev, home);
        free < dev.store.geometry().capacity_blocks() / self.cfg.recall_below_divisor.max(1)
    }

    /// The object size a grant's minimum `min` stands for: a minimum above
    /// the first lease size asks for a region, not for room for an object,
    /// so the object size is capped there.
    fn object_of(&self, min: u64) -> u64 {
        min.min(self.cfg.lease_initial_blocks)
    }

    /// The per-call end of `dev` for objects of `object` blocks: below this
    /// much unleased free space, no lease is granted (see `take_space`).
    /// A few objects per lease, or more when the leases hold many
    /// fragments (`per_call_fragments`). At most a quarter of the device:
    /// on a small device a few large minimums would otherwise keep all of
    /// it per call.
    fn per_call_end(&self, dev: &ServedDevice, object: u64, scope: Scope) -> u64 {
        let live = dev.leases.load(Ordering::Relaxed);
        let split = dev.split_fragments(scope);
        object
            .saturating_mul(live + 1)
            .saturating_mul(self.cfg.per_call_objects)
            .max(split.saturating_mul(self.cfg.per_call_fragments))
            .min(dev.store.geometry().capacity_blocks() / PER_CALL_END_DIVISOR)
    }

    /// What a further grant of objects of `min` blocks could take from
    /// (the unleased free space within reach above the per-call end), or 0
    /// while none would be granted (a recall runs, or the device is in its
    /// per-call end). Clients count it as space they can add to a lease
    /// (`LeaseResponse.grantable_blocks`); advisory, as a grant may still
    /// find no run long enough.
    pub(crate) fn grantable(
        &self,
        dev: &ServedDevice,
        home: Option<&Home>,
        now: Instant,
        min: u64,
    ) -> u64 {
        if self.recalling(dev, now, scope(home)) {
            return 0;
        }
        let free = unleased_free(dev, home);
        free.saturating_sub(self.per_call_end(dev, self.object_of(min), scope(home)))
    }

    /// Grants a lease of at least `ask.min` blocks on `dev`, counted in
    /// `slot` until it ends, from the tenant's pool when there is a `home`;
    /// or, with `ask.extend`, adds such a grant to that live lease of the
    /// caller (no slot needed: the lease has one).
    pub(crate) fn grant(
        &self,
        dev: &Arc<ServedDevice>,
        dev_index: usize,
        ask: LeaseAsk<'_>,
        slot: Option<LeaseSlot>,
        home: Option<Home>,
    ) -> Result<Grant, ServiceError> {
        let now = Instant::now();
        // The lease to extend is checked before anything is taken, so that
        // a refused extension changes nothing.
        let extended = match ask.extend {
            Some(id) => Some(self.extendable(id, dev, home.as_ref(), now)?),
            None => None,
        };
        let target = self.next_size(dev, &ask, dev_index, now);
        let res = self.take_space(dev, &ask, target, home.as_ref(), now)?;
        let extents = res.extents();
        let granted = res.blocks();
        let id = match extended {
            Some(e) => self.extend(&e, res, home.as_ref())?,
            None => self.insert(dev, &ask, res, slot, home.clone(), now),
        };
        dev.leased.fetch_add(granted, Ordering::Relaxed);
        tracing::info!(
            lease = id,
            client = ask.client,
            device = %dev.name,
            blocks = granted,
            extents = extents.len(),
            "lease {}",
            if ask.extend.is_some() {
                "extended"
            } else {
                "granted"
            }
        );
        Ok(Grant {
            id,
            extents,
            ttl: self.cfg.lease_ttl,
            grantable: self.grantable(dev, home.as_ref(), Instant::now(), ask.min),
        })
    }

    /// The live lease `id` of the caller (`home`'s tenant) on `dev`, to
    /// extend.
    fn extendable(
        &self,
        id: u64,
        dev: &Arc<ServedDevice>,
        home: Option<&Home>,
        now: Instant,
    ) -> Result<Arc<Entry>, ServiceError> {
        let e = match self.get(id, home.map(|h| &*h.tenant)) {
            // An extension needs a live lease: one this run never granted
            // is as gone as an ended one.
            Err(ServiceError::UnknownLease(id)) => {
                return Err(ServiceError::LeaseEnded {
                    id,
                    end: LeaseEnd::Unknown,
                })
            }
            r => r?,
        };
        if !Arc::ptr_eq(&e.device, dev) {
            return Err(ServiceError::BadRequest(format!(
                "lease {id} is on device {}, not on {}; extend it on its own device",
                e.device.name, dev.name
            )));
        }
        lock(&e.lease).usable(now)?;
        Ok(e)
    }

    /// The largest lease on `dev`: `lease_max_blocks`, or when that is 0
    /// (automatic) 1/128 of the device and at least 2^18 blocks (1 GiB of
    /// 4 KiB blocks). A client that allocates faster than a round trip per
    /// lease waits for its extensions; the original notes leased 16 GiB of
    /// a 2 TiB disk.
    fn lease_max(&self, dev: &ServedDevice) -> u64 {
        match self.cfg.lease_max_blocks {
            0 => (dev.store.geometry().capacity_blocks() / LEASE_MAX_DIVISOR).max(LEASE_MAX_FLOOR),
            n => n,
        }
    }

    /// Why a grant of at least `min` blocks could never be made on `dev`
    /// for a caller with `home`, if so: more than the largest lease, the
    /// device's data blocks, or the tenant's quota there.
    fn beyond_any_grant(
        &self,
        dev: &ServedDevice,
        min: u64,
        home: Option<&Home>,
    ) -> Option<String> {
        let max = self.lease_max(dev);
        if min > max {
            return Some(format!(
                "{min} blocks asked, more than the largest lease on device {} ({max} blocks, \
                 lease_max_blocks)",
                dev.name
            ));
        }
        let data = dev.store.geometry().capacity_blocks() - dev.store.layout().meta_blocks;
        if min > data {
            return Some(format!(
                "{min} blocks asked, more than the {data} data blocks of device {}",
                dev.name
            ));
        }
        let h = home?;
        let quota = h.owners.usage(&h.tenant).quota;
        (quota > 0 && min > quota).then(|| {
            format!(
                "{min} blocks asked, more than the quota of tenant {} on device {} ({quota} \
                 blocks)",
                h.tenant.name, dev.name
            )
        })
    }

    /// The size the client's next grant aims at, from its rate (or what it
    /// asks for), capped at the largest lease.
    fn next_size(
        &self,
        dev: &ServedDevice,
        ask: &LeaseAsk<'_>,
        dev_index: usize,
        now: Instant,
    ) -> u64 {
        let (client, want) = (ask.client, ask.want);
        let max = self.lease_max(dev);
        let mut t = lock(&self.table);
        let initial = self.cfg.lease_initial_blocks;
        let rate = t
            .clients
            .entry((client.to_string(), dev_index))
            .or_insert(ClientRate {
                next_blocks: initial,
                last_grant: now,
            });
        let since = now.duration_since(rate.last_grant);
        if since < self.cfg.lease_ttl && since > Duration::ZERO {
            rate.next_blocks = (rate.next_blocks * 2).min(max);
        } else if since > self.cfg.lease_ttl * 4 {
            // Not yet pruned by the expiry task.
            rate.next_blocks = initial;
        }
        rate.last_grant = now;
        if want > 0 {
            want.min(max)
        } else {
            rate.next_blocks
        }
    }

    /// Reserves `ask.min..=target` blocks (contiguous) for a grant, within
    /// the ceiling (a fraction of the unleased free space within reach),
    /// from the tenant's pool when there is a `home`; a refusal for want of
    /// space starts a recall.
    fn take_space(
        &self,
        dev: &ServedDevice,
        ask: &LeaseAsk<'_>,
        target: u64,
        home: Option<&Home>,
        now: Instant,
    ) -> Result<Reservation, ServiceError> {
        let (min, hint) = (ask.min, ask.hint);
        // A minimum no grant could ever meet is refused on its own: a
        // recall would stop every other client's grants for a TTL and
        // could free nothing that meets it.
        if let Some(why) = self.beyond_any_grant(dev, min, home) {
            return Err(ServiceError::NoLease(why));
        }
        if self.recalling(dev, now, scope(home)) {
            // Granting now would take back the space the recall frees for
            // the clients that found none.
            return Err(ServiceError::NoLease(
                "the device is nearly full and its leases are being recalled; allocate per call"
                    .into(),
            ));
        }
        let free = unleased_free(dev, home);
        // The last of the device goes per call: each lease's engine keeps
        // its own slivers of space, up to a few of its largest objects,
        // which only one engine, the store's, can fill once the leases are
        // handed back (the refusal recalls them). Granting on would use up
        // the long runs and leave the slivers for the end, so the window
        // scales with the leases and their object size, and with the
        // fragments the leases hold (recycled frees waiting for requests of
        // their size): the one engine that takes them over needs long runs
        // beside them, as it would have had if it had served every request.
        let object = self.object_of(min);
        let leases = dev.leases.load(Ordering::Relaxed) + 1;
        let low = self.per_call_end(dev, object, scope(home));
        if free < low {
            self.start_recall(dev, now, scope(home));
            let split = dev.split_fragments(scope(home));
            return Err(ServiceError::NoLease(format!(
                "{free} unleased free blocks are left, fewer than the {low} kept for per-call \
                 allocation (per_call_objects x {object} blocks x {leases} leases, or \
                 per_call_fragments x the {split} blocks of fragments split among leases)"
            )));
        }
        let ceiling = free / self.cfg.grant_fraction_divisor.max(1);
        let mut size = target.min(ceiling).max(min);
        if size > ceiling {
            // Only a real shortage recalls: less unleased room than the
            // minimum, which the leases' unused space would make up. A
            // minimum above the ceiling with room to spare is only refused
            // (the client allocates per call), or one client asking for
            // much would stop everyone's grants.
            let leased = self.leased_in_scope(dev, home);
            if free < min && free.saturating_add(leased) >= min {
                self.start_recall(dev, now, scope(home));
            }
            return Err(ServiceError::NoLease(format!(
                "{min} blocks asked, at most {ceiling} of the {free} unleased free blocks can be leased"
            )));
        }
        if let Some(h) = home {
            return h.owners.carve(&h.tenant, min, size, hint);
        }
        loop {
            match dev.store.reserve(size, hint) {
                Ok(r) => return Ok(r),
                Err(StoreError::Alloc(AllocError::NoSpace { .. })) if size / 2 >= min => {
                    size /= 2;
                }
                Err(StoreError::Alloc(AllocError::NoSpace { largest_free, .. })) => {
                    self.start_recall(dev, now, scope(home));
                    return Err(ServiceError::NoLease(format!(
                        "no free run of {min} blocks (the longest is {largest_free})"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Enters a new lease holding `res` into the table; returns its id.
    fn insert(
        &self,
        dev: &Arc<ServedDevice>,
        ask: &LeaseAsk<'_>,
        res: Reservation,
        slot: Option<LeaseSlot>,
        home: Option<Home>,
        now: Instant,
    ) -> u64 {
        dev.leases.fetch_add(1, Ordering::Relaxed);
        dev.count_lease(scope(home.as_ref()), true, 0);
        dev.events.grants.fetch_add(1, Ordering::Relaxed);
        let (client, object) = (ask.client, self.object_of(ask.min));
        let mut t = lock(&self.table);
        let id = (self.epoch << 32) | t.next_seq;
        t.next_seq += 1;
        t.leases.insert(
            id,
            Arc::new(Entry {
                device: Arc::clone(dev),
                tenant: home.as_ref().map(|h| h.tenant.id),
                lease: Mutex::new(Lease {
                    id,
                    device: Arc::clone(dev),
                    client: client.to_string(),
                    granted: res.blocks(),
                    granted_at: now,
                    home,
                    res: Some(res),
                    ended: None,
                    deadline: now + self.cfg.lease_ttl,
                    last: LastCommit::default(),
                    slot,
                    object,
                    fragments: 0,
                }),
            }),
        );
        id
    }

    /// Adds `res` to the lease of `e` and moves its deadline; returns the
    /// lease's id. When the lease ended meanwhile, `res` goes back where it
    /// came from and the answer is why the lease ended.
    fn extend(
        &self,
        e: &Entry,
        res: Reservation,
        home: Option<&Home>,
    ) -> Result<u64, ServiceError> {
        let mut l = lock(&e.lease);
        let now = Instant::now();
        let held = match l.usable(now) {
            Ok(held) => held,
            Err(why) => {
                drop(l);
                give_back(home, res);
                return Err(why);
            }
        };
        let n = res.blocks();
        held.merge(res)
            .expect("the lease and the grant are on one device");
        l.granted += n;
        l.deadline = now + self.cfg.lease_ttl;
        e.device.events.extensions.fetch_add(1, Ordering::Relaxed);
        Ok(l.id)
    }

    /// The lease `id`, looked up once for a call (a lease that ends
    /// meanwhile is seen as ended when the call locks it).
    pub(crate) fn find(&self, id: u64, caller: Option<&Tenant>) -> Result<Found, ServiceError> {
        Ok(Found(self.get(id, caller)?))
    }

    /// Commits allocations inside a lease and frees; blocks on the device.
    /// With `recycle`, the freed blocks join the lease once durable.
    pub(crate) fn commit(
        &self,
        found: &Found,
        seq: u64,
        batch: CommitBatch<'_>,
    ) -> Result<CommitOutcome, ServiceError> {
        let CommitBatch {
            allocs,
            frees,
            recycle,
            fragments,
        } = batch;
        let e = &found.0;
        let mut l = lock(&e.lease);
        let id = l.id;
        let now = Instant::now();
        let d = digest(allocs, frees, recycle);
        let last = l.last.clone();
        l.usable(now)?;
        // The report counts once the commit is accepted: a refused call
        // changes nothing.
        if seq == last.seq && seq > 0 {
            if d != last.digest {
                return Err(ServiceError::SequenceConflict {
                    id,
                    got: seq,
                    why: "it was committed before with other contents".into(),
                });
            }
            l.note_fragments(fragments);
            l.deadline = now + self.cfg.lease_ttl;
            return Ok(CommitOutcome {
                unused_blocks: last.unused_blocks,
                replayed: true,
                recall: self.recalling(&e.device, now, e.tenant),
                recycled: last.recycled,
                grantable: self.grantable(&e.device, l.home.as_ref(), now, l.object),
            });
        }
        if seq != last.seq + 1 {
            return Err(ServiceError::SequenceConflict {
                id,
                got: seq,
                why: format!(
                    "the last committed sequence is {}, so the next is {}",
                    last.seq,
                    last.seq + 1
                ),
            });
        }
        let dev = Arc::clone(&l.device);
        let home = l.home.clone();
        if let Some(h) = &home {
            h.owners.check_owned(&h.tenant, frees)?;
        }
        // Freed blocks stay out of the lease during a recall: the clients
        // that found no room wait for exactly such space. Until then they
        // join it even near full, where the lease's engine fits them
        // exactly; handed to the store, no lease would take them (grants
        // are long runs) and they would wait for the per-call end.
        let recycling =
            recycle && !frees.is_empty() && !self.recalling(&dev, now, scope(home.as_ref()));
        let res = l.usable(now)?;
        let before = res.blocks();
        let r = res.publish(allocs, frees);
        dev.leased
            .fetch_sub(before - res.blocks(), Ordering::Relaxed);
        let mut recycled = Vec::new();
        if let Some(h) = &home {
            match &r {
                Ok(_) => {
                    h.owners
                        .committed(&h.tenant, allocs.iter().map(|a| a.len()).sum());
                    if recycling {
                        recycled = h.owners.recycle(&h.tenant, frees, res);
                    } else {
                        h.owners.freed(&h.tenant, frees);
                    }
                }
                // Only a failed journal write takes the pieces out of the
                // lease (back to the store's free space); a refused batch
                // changed nothing.
                Err(
                    StoreError::TxnTooLarge { .. }
                    | StoreError::JournalFull { .. }
                    | StoreError::Io { .. },
                ) => h.owners.publish_failed(&h.tenant, allocs),
                Err(_) => {}
            }
        }
        r?;
        if recycling && home.is_none() {
            for &f in frees {
                // Only a failed store (poisoned) refuses; the blocks are
                // free all the same.
                recycled.extend(res.take_range(f).unwrap_or_default());
            }
        }
        recycled.sort_unstable_by_key(|e| e.start());
        let back: u64 = recycled.iter().map(|e| e.len()).sum();
        let after = res.blocks();
        dev.leased.fetch_add(back, Ordering::Relaxed);
        dev.events
            .recycled_blocks
            .fetch_add(back, Ordering::Relaxed);
        l.granted += back;
        // The holder counted its fragments before this commit; the frees
        // it gets back join them now, and it would report them only at its
        // next call, a round later. Until then the device's end counts the
        // short ones too (at most the lease's unused blocks): at a recall
        // they come back to the store's engine as fragments whether or not
        // the holder has said so. An overestimate, since some will join
        // free space beside them in the holder's engine; the next report
        // replaces it.
        let short = fragment_blocks_of(&recycled);
        l.note_fragments(fragments.saturating_add(short));
        l.last = LastCommit {
            seq,
            digest: d,
            unused_blocks: after,
            recycled: recycled.clone(),
        };
        let now = Instant::now();
        l.deadline = now + self.cfg.lease_ttl;
        Ok(CommitOutcome {
            unused_blocks: after,
            replayed: false,
            recall: self.recalling(&dev, now, scope(home.as_ref())),
            recycled,
            grantable: self.grantable(&dev, home.as_ref(), now, l.object),
        })
    }

    /// Renews a lease.
    pub(crate) fn renew(
        &self,
        id: u64,
        fragments: u64,
        caller: Option<&Tenant>,
    ) -> Result<RenewOutcome, ServiceError> {
        let e = self.get(id, caller)?;
        let mut l = lock(&e.lease);
        let now = Instant::now();
        let unused = l.usable(now)?.blocks();
        l.note_fragments(fragments);
        l.deadline = now + self.cfg.lease_ttl;
        let recall = self.under_pressure(&l.device, now, l.home.as_ref());
        if recall {
            l.device.events.recalls.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                lease = id,
                client = %l.client,
                device = %l.device.name,
                unused_blocks = unused,
                "lease recalled (device short of unleased space)"
            );
        }
        Ok(RenewOutcome {
            ttl: self.cfg.lease_ttl,
            recall,
            unused_blocks: unused,
            grantable: self.grantable(&l.device, l.home.as_ref(), now, l.object),
        })
    }

    /// Ends a lease at its holder's request; returns the blocks freed.
    pub(crate) fn release(&self, id: u64, caller: Option<&Tenant>) -> Result<u64, ServiceError> {
        let e = self.get(id, caller)?;
        let n = {
            let mut g = lock(&e.lease);
            g.usable(Instant::now())?;
            g.end(LeaseEnd::Released)
        };
        lock(&self.table).leases.remove(&id);
        Ok(n)
    }

    /// Ends every lease past its deadline; returns how many ended. A lease
    /// busy in a commit is looked at on the next pass.
    pub(crate) fn expire(&self, now: Instant) -> usize {
        let candidates: Vec<(u64, Arc<Entry>)> = lock(&self.table)
            .leases
            .iter()
            .map(|(&id, l)| (id, Arc::clone(l)))
            .collect();
        let mut ended = Vec::new();
        for (id, l) in candidates {
            let Ok(mut g) = l.lease.try_lock() else {
                continue;
            };
            if g.ended.is_none() && now > g.deadline {
                g.end(LeaseEnd::Expired);
            }
            if g.ended.is_some() {
                ended.push(id);
            }
        }
        let mut t = lock(&self.table);
        for id in &ended {
            t.leases.remove(id);
        }
        // A client's rate is forgotten once it would be reset anyway, so
        // that clients that come and go (or invent ids) do not grow the
        // table.
        let horizon = self.cfg.lease_ttl * 4;
        t.clients
            .retain(|_, r| now.saturating_duration_since(r.last_grant) <= horizon);
        ended.len()
    }

    /// Ends every lease (server shutdown); returns how many were live.
    pub(crate) fn end_all(&self) -> usize {
        let all: Vec<Arc<Entry>> = lock(&self.table).leases.drain().map(|(_, l)| l).collect();
        let mut live = 0;
        for l in all {
            let mut g = lock(&l.lease);
            if g.ended.is_none() {
                live += 1;
                g.end(LeaseEnd::Released);
            }
        }
        live
    }

    /// The live leases, in grant order. A lease busy in a commit is
    /// waited for.
    pub(crate) fn list(&self, caller: Option<&Tenant>) -> Vec<LeaseInfo> {
        let mut all: Vec<(u64, Arc<Entry>)> = lock(&self.table)
            .leases
            .iter()
            // A tenant sees only its own leases.
            .filter(|(_, l)| caller.is_none_or(|t| l.tenant == Some(t.id)))
            .map(|(&id, l)| (id, Arc::clone(l)))
            .collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        let now = Instant::now();
        all.iter()
            .filter_map(|(_, l)| lock(&l.lease).info(now))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(start: u64, len: u64) -> Extent {
        Extent::new(start, len).unwrap()
    }

    #[test]
    fn fragments_are_short_runs_with_touching_members_joined() {
        assert_eq!(fragment_blocks_of(&[]), 0);
        assert_eq!(fragment_blocks_of(&[x(0, 10), x(20, 1024)]), 1034);
        assert_eq!(fragment_blocks_of(&[x(0, 1025)]), 0);
        // Two touching members make one run of 1030 blocks: not a fragment.
        assert_eq!(fragment_blocks_of(&[x(0, 600), x(600, 430), x(2000, 7)]), 7);
        assert_eq!(
            fragment_blocks_of(&[x(0, 500), x(500, 524), x(1025, 1)]),
            1025
        );
    }
}
