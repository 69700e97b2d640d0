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
//! * release / expiry — the unused rest returns to free space. A lease
//!   past its deadline refuses commits and renewals at once, but its space
//!   stays out of use for the lease margin ([`Config::lease_margin`]) more:
//!   a client stops writing a margin before the deadline it computes from
//!   when it sent its request, so nobody writes into space granted anew.
//!   Ended ids are remembered as "expired or released" for as long as the
//!   server runs (ids are sequential within a run), so a late caller
//!   learns why.
//!
//! Durability: a grant and an extension write the lease's record (the
//! extents it may hold), a recycling commit adds its frees to it, each
//! commit writes its commit record (sequence, digest), and the end of a
//! lease deletes both ([`crate::records`]), each in the transaction that
//! does it; so a restarted server restores every live lease
//! ([`LeaseTable::restore`]) with a full TTL, and answers a resent commit
//! as the first one. Renewals are not journaled (a restart renews).
//!
//! One table per device, owned by the device's owner ([`crate::owner`]):
//! no locks. A commit is two steps around the owner's group commit:
//! [`LeaseTable::stage_commit`] puts the lease's publish in a store
//! transaction, [`LeaseTable::finish_commit`] settles the lease once the
//! transaction is durable (or failed).
//!
//! Lease ids: bits 63..48 the low bits of the device's owner epoch when it
//! was granted, 47..32 the device's index, 31..0 a sequence number; the
//! server routes a lease's calls by the device bits alone.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::{AllocError, Extent};
use blockalloc_store::{CommitInfo, Reservation, StoreError, Txn};

use crate::config::Config;
use crate::device::{count, scope, Scope, ServedDevice};
use crate::error::{LeaseEnd, ServiceError};
use crate::limits::LeaseSlot;
use crate::ownership::Home;
use crate::records::{
    commit_key, delta_key, encode_delta, lease_key, CommitRecord, LeaseRecord, MAX_DELTAS,
};

/// The per-call end of a device is at most `1 / PER_CALL_END_DIVISOR` of it.
const PER_CALL_END_DIVISOR: u64 = 4;

/// With `lease_max_blocks = 0`, the largest lease is 1 / this of a device,
/// and at least [`LEASE_MAX_FLOOR`] blocks.
const LEASE_MAX_DIVISOR: u64 = 128;
const LEASE_MAX_FLOOR: u64 = 1 << 18;

/// The longest free run that counts as a fragment, as segfit's
/// `fragment_blocks` counts them (the largest object, 4 MiB at 4 KiB).
const FRAGMENT_MAX_BLOCKS: u64 = blockalloc::FRAGMENTATION_REFERENCE_BLOCKS;

/// The most ended leases whose last commit is kept, so that a resend of it
/// is answered as a replay (not as a lease gone, which tells its client
/// the commit did not run): fewer on a device whose records hold fewer
/// ([`ended_window`]).
const ENDED_WINDOW: usize = 4096;

/// The bytes a kept commit record takes, at most, in the store's records.
const COMMIT_RECORD_BYTES: usize = 40;

/// How many ended leases' last commits device `dev` keeps: at most an
/// eighth of its records (call results take at most a quarter, live
/// leases the rest).
fn ended_window(dev: &ServedDevice) -> usize {
    (dev.store.records_limit() / 8 / COMMIT_RECORD_BYTES).clamp(16, ENDED_WINDOW)
}

/// How long past one TTL a per-call allocation waits for recalled leases.
const PER_CALL_RECALL_MARGIN: Duration = Duration::from_millis(500);

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

/// The parts of a lease id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseId {
    pub epoch: u16,
    pub device: u16,
    pub seq: u32,
}

impl LeaseId {
    pub(crate) fn of(id: u64) -> LeaseId {
        LeaseId {
            epoch: (id >> 48) as u16,
            device: (id >> 32) as u16,
            seq: id as u32,
        }
    }

    pub(crate) fn id(self) -> u64 {
        (u64::from(self.epoch) << 48) | (u64::from(self.device) << 32) | u64::from(self.seq)
    }
}

/// What a `Commit` carries besides its lease and sequence number.
#[derive(Clone, Debug)]
pub(crate) struct CommitBatch {
    /// Allocations inside the lease.
    pub allocs: Vec<Extent>,
    /// Committed extents to free.
    pub frees: Vec<Extent>,
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

/// One lease.
struct Lease {
    id: u64,
    /// The holder's client id.
    client: String,
    /// Blocks granted, extensions and recycled frees included.
    granted: u64,
    granted_at: Instant,
    home: Option<Home>,
    res: Reservation,
    deadline: Instant,
    last: LastCommit,
    /// Its place in its client's lease count, given back when it ends.
    _slot: Option<LeaseSlot>,
    /// The object size its grants were asked for (the grant's minimum, at
    /// most the first lease size), which sizes the per-call end.
    object: u64,
    /// The fragments its holder last reported, counted in its scope's
    /// entry of the table's `fragments`.
    fragments: u64,
    /// The keys of its `H` records (extents added since its record was
    /// written).
    deltas: Vec<Vec<u8>>,
}

impl Lease {
    fn tenant(&self) -> Scope {
        scope(self.home.as_ref())
    }

    /// Its journal record, listing `held`, written as the device's
    /// `order`-th.
    fn record(&self, order: u64, held: Vec<Extent>) -> LeaseRecord {
        LeaseRecord {
            id: self.id,
            client: self.client.clone(),
            tenant: self
                .home
                .as_ref()
                .map(|h| h.tenant.name.clone())
                .unwrap_or_default(),
            object: self.object,
            order,
            held,
        }
    }

    /// Journals `added` as the lease's (an extension, recycled frees) in
    /// `txn`, as the `order`-th record: an `H` record, or after
    /// [`MAX_DELTAS`] of them the lease record rewritten with `unused`
    /// and `added` (its `H` records deleted).
    fn journal_added(
        &mut self,
        txn: &mut Txn<'_>,
        order: u64,
        added: &[Extent],
        unused: impl FnOnce(&Lease) -> Vec<Extent>,
    ) -> Result<(), StoreError> {
        if self.deltas.len() < MAX_DELTAS {
            let key = delta_key(self.id, order);
            txn.put_record(&key, &encode_delta(added))?;
            self.deltas.push(key);
            return Ok(());
        }
        let held = merged(&unused(self), added);
        txn.put_record(&lease_key(self.id), &self.record(order, held).encode())?;
        for key in self.deltas.drain(..) {
            txn.delete_record(&key)?;
        }
        Ok(())
    }
}

/// The blocks of `a` (in address order) outside every extent of `cut`
/// (pairwise disjoint, any order), in address order.
fn minus(a: &[Extent], cut: &[Extent]) -> Vec<Extent> {
    let mut cut = cut.to_vec();
    cut.sort_unstable_by_key(|c| c.start());
    let mut cuts = cut.iter().peekable();
    let mut out = Vec::with_capacity(a.len());
    for &e in a {
        let mut at = e.start();
        // Cuts ending before e touch no later extent of `a` either.
        while cuts.next_if(|c| c.end() <= e.start()).is_some() {}
        while let Some(&&c) = cuts.peek() {
            if c.start() >= e.end() {
                break;
            }
            out.extend(Extent::from_range(at, c.start().max(at)).ok());
            at = at.max(c.end());
            if c.end() > e.end() {
                // It reaches into the next extent of `a` too.
                break;
            }
            cuts.next();
        }
        out.extend(Extent::from_range(at, e.end()).ok());
    }
    out
}

/// The extents of `a` and `b` (disjoint, each in address order) in address
/// order.
fn merged(a: &[Extent], b: &[Extent]) -> Vec<Extent> {
    let mut out: Vec<Extent> = a.iter().chain(b).copied().collect();
    out.sort_unstable_by_key(|e| e.start());
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommitOutcome {
    /// The lease lives this long from the commit unless renewed.
    pub ttl: Duration,
    pub unused_blocks: u64,
    pub replayed: bool,
    pub recall: bool,
    pub recycled: Vec<Extent>,
    pub grantable: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RenewOutcome {
    pub ttl: Duration,
    pub recall: bool,
    pub unused_blocks: u64,
    pub grantable: u64,
}

/// What Status shows of a lease.
#[derive(Clone, Debug)]
pub(crate) struct LeaseInfo {
    pub id: u64,
    pub client: String,
    pub granted_blocks: u64,
    pub unused_blocks: u64,
    pub age: Duration,
    pub expires_in: Duration,
}

#[derive(Clone, Debug)]
pub(crate) struct Grant {
    pub id: u64,
    pub extents: Vec<Extent>,
    pub ttl: Duration,
    pub grantable: u64,
}

/// A Lease call.
pub(crate) struct LeaseAsk {
    pub client: String,
    pub min: u64,
    pub want: u64,
    pub hint: Option<u64>,
    /// The live lease to add the grant to.
    pub extend: Option<u64>,
}

/// A lease a restarted server found journaled.
pub(crate) struct RestoredLease {
    pub rec: LeaseRecord,
    /// Its last commit.
    pub last: Option<CommitRecord>,
    /// The keys of its `H` records, and the newest order among its records.
    pub deltas: Vec<Vec<u8>>,
    pub order: u64,
    /// The space it holds again.
    pub res: blockalloc_store::Reservation,
    /// Its holder's home (with tenants).
    pub home: Option<Home>,
}

/// A grant staged in a transaction (its record), waiting for it to be
/// durable.
pub(crate) struct StagedGrant {
    id: u64,
    extend: bool,
    res: Reservation,
    client: String,
    home: Option<Home>,
    slot: Option<LeaseSlot>,
    object: u64,
    min: u64,
}

impl StagedGrant {
    /// Whether it extends a live lease.
    pub(crate) fn extends(&self) -> bool {
        self.extend
    }
}

/// A commit staged in a transaction, waiting for it to be durable.
pub(crate) struct StagedCommit {
    id: u64,
    seq: u64,
    digest: u64,
    batch: CommitBatch,
    recycling: bool,
}

/// How a commit went on: answered at once (a resend of the last commit),
/// or staged.
pub(crate) enum CommitStep {
    Replayed(CommitOutcome),
    Staged(StagedCommit),
}

#[derive(Clone, Copy, Debug)]
struct ClientRate {
    next_blocks: u64,
    last_grant: Instant,
}

/// The live leases of one recall scope and the fragments reported in them.
#[derive(Clone, Copy, Debug, Default)]
struct ScopeFragments {
    leases: u64,
    blocks: u64,
}

/// The leases of one device.
pub(crate) struct LeaseTable {
    cfg: Config,
    dev: Arc<ServedDevice>,
    /// This run's epoch and the device's index, the top of every id.
    epoch: u16,
    index: u16,
    next_seq: u32,
    /// The order of the last lease record written.
    next_order: u64,
    leases: HashMap<u64, Lease>,
    clients: HashMap<String, ClientRate>,
    /// Per recall scope, until when a recall runs: leases are asked back
    /// and none is granted (set when a grant is refused for want of space).
    pressure_until: HashMap<Scope, Instant>,
    /// Per recall scope, the live leases and the fragments their holders
    /// last reported.
    fragments: HashMap<Scope, ScopeFragments>,
    /// A lease ended (its unused space came back) since the owner last
    /// asked ([`LeaseTable::take_ended`]).
    ended: bool,
    /// The last commits of recently ended leases, oldest first, and the
    /// keys of records to delete: commit records that left that window,
    /// ended leases' `H` records.
    ended_commits: HashMap<u64, LastCommit>,
    ended_order: VecDeque<u64>,
    stale: Vec<Vec<u8>>,
}

fn digest(allocs: &[Extent], frees: &[Extent], recycle: bool) -> u64 {
    // Kept in the commit records, so the same on every build (std's
    // `DefaultHasher` may change between Rust releases): each word folded
    // in through splitmix64's finaliser.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut h = mix(u64::from(recycle));
    for (tag, list) in [(0u64, allocs), (1, frees)] {
        for e in list {
            h = mix(h ^ tag ^ e.start().rotate_left(1));
            h = mix(h ^ e.len());
        }
    }
    h
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

impl LeaseTable {
    /// The table of device `index` (`dev`), for ids of `epoch` (the low
    /// bits of the device's owner epoch).
    pub(crate) fn new(cfg: Config, dev: Arc<ServedDevice>, epoch: u16, index: u16) -> Self {
        LeaseTable {
            cfg,
            dev,
            epoch,
            index,
            next_seq: 1,
            next_order: 0,
            leases: HashMap::new(),
            clients: HashMap::new(),
            pressure_until: HashMap::new(),
            fragments: HashMap::new(),
            ended: false,
            ended_commits: HashMap::new(),
            ended_order: VecDeque::new(),
            stale: Vec::new(),
        }
    }

    /// Keeps the last commit of ended lease `id` (see [`ended_window`]).
    fn remember_ended(&mut self, id: u64, last: LastCommit) {
        if last.seq == 0 {
            return;
        }
        self.ended_commits.insert(id, last);
        self.ended_order.push_back(id);
        while self.ended_order.len() > ended_window(&self.dev) {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended_commits.remove(&old);
                self.stale.push(commit_key(old));
            }
        }
    }

    /// A commit record a restarted server found without its lease: the
    /// lease had ended.
    pub(crate) fn restore_ended(&mut self, id: u64, c: CommitRecord) {
        let last = LastCommit {
            seq: c.seq,
            digest: c.digest,
            unused_blocks: c.unused,
            recycled: Vec::new(),
        };
        self.remember_ended(id, last);
    }

    /// Forgets the oldest ended lease's last commit, its record deleted in
    /// `txn`.
    fn forget_oldest_ended(&mut self, txn: &mut Txn<'_>) {
        if let Some(old) = self.ended_order.pop_front() {
            self.ended_commits.remove(&old);
            let _ = txn.delete_record(&commit_key(old));
        }
    }

    /// The keys of records to delete (see `stale`).
    pub(crate) fn take_stale(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.stale)
    }

    /// A resend of lease `id`'s last commit, answered as a replay while
    /// the lease is past its deadline or ended (a commit that ran).
    fn replay_after_end(&self, id: u64, seq: u64, d: u64, now: Instant) -> Option<CommitOutcome> {
        let last = match self.leases.get(&id) {
            Some(l) if now > l.deadline => &l.last,
            Some(_) => return None,
            None => self.ended_commits.get(&id)?,
        };
        (seq > 0 && seq == last.seq && d == last.digest).then(|| CommitOutcome {
            ttl: self.cfg.lease_ttl,
            unused_blocks: last.unused_blocks,
            replayed: true,
            recall: false,
            recycled: Vec::new(),
            grantable: 0,
        })
    }

    /// The live lease `id` of `caller`'s tenant, or why not: ended
    /// (expired or released), unknown, or another tenant's. A lease past
    /// its deadline ends here.
    fn get(&mut self, id: u64, caller: Scope, now: Instant) -> Result<&mut Lease, ServiceError> {
        match self.leases.get(&id) {
            Some(l) if l.tenant() != caller => {
                return Err(ServiceError::PermissionDenied(format!(
                    "lease {id} belongs to another tenant"
                )))
            }
            // Its space stays out of use for the margin ([`Self::expire`]).
            Some(l) if now > l.deadline => {
                return Err(ServiceError::LeaseEnded {
                    id,
                    end: LeaseEnd::Expired,
                });
            }
            Some(_) => {}
            None => {
                let parts = LeaseId::of(id);
                let ours = parts.epoch == self.epoch && parts.device == self.index;
                return Err(if ours && (1..self.next_seq).contains(&parts.seq) {
                    ServiceError::LeaseEnded {
                        id,
                        end: LeaseEnd::Ended,
                    }
                } else {
                    ServiceError::UnknownLease(id)
                });
            }
        }
        Ok(self.leases.get_mut(&id).expect("found above"))
    }

    /// Whether a recall of `scope` runs.
    fn recalling(&self, now: Instant, scope: Scope) -> bool {
        self.pressure_until.get(&scope).is_some_and(|&t| now < t)
    }

    /// Starts (or prolongs) a recall of `scope`'s leases for one TTL; the
    /// `WatchRecalls` streams hear of a recall that was not running.
    fn start_recall(&mut self, now: Instant, scope: Scope) {
        self.pressure_until.retain(|_, t| now < *t);
        let running = self.pressure_until.contains_key(&scope);
        let until = now + self.cfg.lease_ttl;
        self.pressure_until.insert(scope, until);
        self.dev.recalls.send_modify(|r| {
            if !running {
                *r.started.entry(scope).or_default() += 1;
            }
            r.until.insert(scope, until);
        });
    }

    /// Blocks inside the live leases of `home`'s scope (all leases of the
    /// device without tenants), not committed yet.
    pub(crate) fn leased_in_scope(&self, home: Option<&Home>) -> u64 {
        match home {
            Some(h) => h.owners.usage(&h.tenant).leased,
            None => self.dev.leased.load(Ordering::Relaxed),
        }
    }

    /// A per-call allocation of `needed` blocks found no room: when the
    /// leases of its scope hold enough unused space to make it up, starts a
    /// recall and returns how long the allocation may wait for them.
    pub(crate) fn recall_for_per_call(
        &mut self,
        needed: u64,
        home: Option<&Home>,
    ) -> Option<Instant> {
        let leased = self.leased_in_scope(home);
        let free = unleased_free(&self.dev, home);
        if leased == 0 || free.saturating_add(leased) < needed {
            return None;
        }
        let now = Instant::now();
        self.start_recall(now, scope(home));
        Some(now + self.cfg.lease_ttl + self.cfg.lease_margin() + PER_CALL_RECALL_MARGIN)
    }

    /// Whether the leases of `home`'s scope are to be handed back: a recall
    /// runs, or the unleased free space is below the recall threshold.
    fn under_pressure(&self, now: Instant, home: Option<&Home>) -> bool {
        if self.recalling(now, scope(home)) {
            return true;
        }
        let free = unleased_free(&self.dev, home);
        free < self.dev.store.geometry().capacity_blocks() / self.cfg.recall_below_divisor.max(1)
    }

    fn object_of(&self, min: u64) -> u64 {
        min.min(self.cfg.lease_initial_blocks)
    }

    /// The fragments of `scope`'s leases out of any one lease's reach: the
    /// reported sum × (leases − 1) / leases (a lease's engine sees its own;
    /// none with a single lease).
    fn split_fragments(&self, scope: Scope) -> u64 {
        let f = self.fragments.get(&scope).copied().unwrap_or_default();
        let split = u128::from(f.blocks) * u128::from(f.leases.saturating_sub(1))
            / u128::from(f.leases.max(1));
        u64::try_from(split).unwrap_or(u64::MAX)
    }

    /// The unleased space kept for per-call allocation in `scope`: room
    /// for `per_call_objects` objects per live lease and one, or for the
    /// fragments the leases report, whichever is more, at most a quarter of
    /// the device.
    fn per_call_end(&self, object: u64, scope: Scope) -> u64 {
        let live = self.dev.leases.load(Ordering::Relaxed);
        let split = self.split_fragments(scope);
        object
            .saturating_mul(live + 1)
            .saturating_mul(self.cfg.per_call_objects)
            .max(split.saturating_mul(self.cfg.per_call_fragments))
            .min(self.dev.store.geometry().capacity_blocks() / PER_CALL_END_DIVISOR)
    }

    /// What a further grant could take in `home`'s scope (0 during a
    /// recall).
    fn grantable(&self, home: Option<&Home>, now: Instant, min: u64) -> u64 {
        if self.recalling(now, scope(home)) {
            return 0;
        }
        let free = unleased_free(&self.dev, home);
        free.saturating_sub(self.per_call_end(self.object_of(min), scope(home)))
    }

    /// Grants a lease (or extends one, `ask.extend`), first step: sized
    /// from the client's rate, taken from the device (or the tenant's
    /// pool), its record put in `txn`.
    pub(crate) fn stage_grant(
        &mut self,
        ask: &LeaseAsk,
        slot: Option<LeaseSlot>,
        home: Option<Home>,
        txn: &mut Txn<'_>,
    ) -> Result<StagedGrant, ServiceError> {
        let now = Instant::now();
        if let Some(id) = ask.extend {
            match self.get(id, scope(home.as_ref()), now) {
                Err(ServiceError::UnknownLease(id)) => {
                    return Err(ServiceError::LeaseEnded {
                        id,
                        end: LeaseEnd::Unknown,
                    })
                }
                r => drop(r?),
            }
        }
        let target = self.next_size(ask, now);
        let res = self.take_space(ask, target, home.as_ref(), now)?;
        // Leased from now on (Status keeps `used + leased + free`), also
        // while the record is being written.
        self.dev.leased.fetch_add(res.blocks(), Ordering::Relaxed);
        let order = self.next_order();
        let added = res.extents();
        let (id, journaled) = match ask.extend {
            Some(id) => {
                let l = self.leases.get_mut(&id).expect("checked above");
                // Listed even if the grant fails: a superset is what the
                // records promise.
                (id, l.journal_added(txn, order, &added, |l| l.res.extents()))
            }
            None => {
                let id = self.next_id();
                let rec = LeaseRecord {
                    id,
                    client: ask.client.clone(),
                    tenant: home
                        .as_ref()
                        .map(|h| h.tenant.name.clone())
                        .unwrap_or_default(),
                    object: self.object_of(ask.min),
                    order,
                    held: added,
                };
                (id, txn.put_record(&lease_key(id), &rec.encode()))
            }
        };
        if let Err(e) = journaled {
            let n = give_back(home.as_ref(), res);
            self.dev.leased.fetch_sub(n, Ordering::Relaxed);
            return Err(match e {
                StoreError::BadRecord { reason } => ServiceError::NoLease(format!(
                    "device {} journals no more leases ({reason})",
                    self.dev.name
                )),
                e => e.into(),
            });
        }
        Ok(StagedGrant {
            id,
            extend: ask.extend.is_some(),
            res,
            client: ask.client.clone(),
            home,
            slot,
            object: self.object_of(ask.min),
            min: ask.min,
        })
    }

    /// The order of the next lease record written.
    fn next_order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// A fresh lease id: this epoch's next, skipping ids still live (a
    /// restored lease of an epoch with the same low bits).
    fn next_id(&mut self) -> u64 {
        loop {
            let id = LeaseId {
                epoch: self.epoch,
                device: self.index,
                seq: self.next_seq,
            }
            .id();
            self.next_seq = self.next_seq.wrapping_add(1).max(1);
            if !self.leases.contains_key(&id) {
                return id;
            }
        }
    }

    /// Grant, second step, once its record is durable (or failed).
    pub(crate) fn finish_grant(
        &mut self,
        g: StagedGrant,
        durable: Result<CommitInfo, StoreError>,
    ) -> Result<Grant, ServiceError> {
        if let Err(e) = durable {
            let n = give_back(g.home.as_ref(), g.res);
            self.dev.leased.fetch_sub(n, Ordering::Relaxed);
            return Err(e.into());
        }
        let now = Instant::now();
        let extents = g.res.extents();
        let granted = g.res.blocks();
        let id = g.id;
        if g.extend {
            let Some(l) = self.leases.get_mut(&id) else {
                // Commands on a lease wait while it has a grant staged.
                let n = give_back(g.home.as_ref(), g.res);
                self.dev.leased.fetch_sub(n, Ordering::Relaxed);
                return Err(ServiceError::LeaseEnded {
                    id,
                    end: LeaseEnd::Ended,
                });
            };
            l.res
                .merge(g.res)
                .expect("the lease and the grant are on one device");
            l.granted += granted;
            l.deadline = now + self.cfg.lease_ttl;
            count(&self.dev.events.extensions, 1);
        } else {
            self.insert(id, &g.client, g.res, g.slot, g.home.clone(), g.object, now);

            count(&self.dev.events.grants, 1);
        }
        tracing::info!(
            lease = id,
            client = %g.client,
            device = %self.dev.name,
            blocks = granted,
            extents = extents.len(),
            "lease {}",
            if g.extend { "extended" } else { "granted" }
        );
        Ok(Grant {
            id,
            extents,
            ttl: self.cfg.lease_ttl,
            grantable: self.grantable(g.home.as_ref(), Instant::now(), g.min),
        })
    }

    /// Serves again a lease a restarted server found journaled (`rec`,
    /// its last commit `last`), with the space it holds again (taken back
    /// by the caller) and a full TTL.
    pub(crate) fn restore(&mut self, r: RestoredLease) {
        let RestoredLease {
            rec,
            last,
            deltas,
            order,
            res,
            home,
        } = r;
        let now = Instant::now();
        let blocks = res.blocks();
        let id = rec.id;
        self.next_order = self.next_order.max(order);
        self.insert(id, &rec.client, res, None, home, rec.object, now);
        let l = self.leases.get_mut(&id).expect("inserted");
        l.deltas = deltas;
        if let Some(c) = last {
            l.last = LastCommit {
                seq: c.seq,
                digest: c.digest,
                unused_blocks: c.unused,
                recycled: Vec::new(),
            };
        }
        self.dev.leased.fetch_add(blocks, Ordering::Relaxed);
        count(&self.dev.events.restored, 1);
        tracing::info!(
            lease = id,
            client = %rec.client,
            device = %self.dev.name,
            unused_blocks = blocks,
            "lease restored from the journal"
        );
    }

    fn lease_max(&self) -> u64 {
        match self.cfg.lease_max_blocks {
            0 => (self.dev.store.geometry().capacity_blocks() / LEASE_MAX_DIVISOR)
                .max(LEASE_MAX_FLOOR),
            n => n,
        }
    }

    /// Why no grant could ever give `min` blocks, if none could: more than
    /// the largest lease, the device's data blocks or the tenant's quota.
    fn beyond_any_grant(&self, min: u64, home: Option<&Home>) -> Option<String> {
        let dev = &self.dev;
        let max = self.lease_max();
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

    /// The size of the client's next grant: doubled when it comes back
    /// within one TTL, reset after four TTLs of silence.
    fn next_size(&mut self, ask: &LeaseAsk, now: Instant) -> u64 {
        let max = self.lease_max();
        let initial = self.cfg.lease_initial_blocks;
        let ttl = self.cfg.lease_ttl;
        let rate = self
            .clients
            .entry(ask.client.clone())
            .or_insert(ClientRate {
                next_blocks: initial,
                last_grant: now,
            });
        let since = now.duration_since(rate.last_grant);
        if since < ttl && since > Duration::ZERO {
            rate.next_blocks = (rate.next_blocks * 2).min(max);
        } else if since > ttl * 4 {
            rate.next_blocks = initial;
        }
        rate.last_grant = now;
        if ask.want > 0 {
            ask.want.min(max)
        } else {
            rate.next_blocks
        }
    }

    /// Takes `min..=target` blocks for a grant, within the rules of the
    /// module docs; starts a recall when leases hold the room it lacks.
    fn take_space(
        &mut self,
        ask: &LeaseAsk,
        target: u64,
        home: Option<&Home>,
        now: Instant,
    ) -> Result<Reservation, ServiceError> {
        let (min, hint) = (ask.min, ask.hint);
        if let Some(why) = self.beyond_any_grant(min, home) {
            return Err(ServiceError::NoLease(why));
        }
        if self.recalling(now, scope(home)) {
            return Err(ServiceError::NoLease(
                "the device is nearly full and its leases are being recalled; allocate per call"
                    .into(),
            ));
        }
        let free = unleased_free(&self.dev, home);
        let object = self.object_of(min);
        let leases = self.dev.leases.load(Ordering::Relaxed) + 1;
        let low = self.per_call_end(object, scope(home));
        if free < low {
            self.start_recall(now, scope(home));
            let split = self.split_fragments(scope(home));
            return Err(ServiceError::NoLease(format!(
                "{free} unleased free blocks are left, fewer than the {low} kept for per-call \
                 allocation (per_call_objects x {object} blocks x {leases} leases, or \
                 per_call_fragments x the {split} blocks of fragments split among leases)"
            )));
        }
        let ceiling = free / self.cfg.grant_fraction_divisor.max(1);
        let mut size = target.min(ceiling).max(min);
        if size > ceiling {
            let leased = self.leased_in_scope(home);
            if free < min && free.saturating_add(leased) >= min {
                self.start_recall(now, scope(home));
            }
            return Err(ServiceError::NoLease(format!(
                "{min} blocks asked, at most {ceiling} of the {free} unleased free blocks can be leased"
            )));
        }
        if let Some(h) = home {
            return h.owners.carve(&h.tenant, min, size, hint);
        }
        loop {
            match self.dev.store.reserve(size, hint) {
                Ok(r) => return Ok(r),
                Err(StoreError::Alloc(AllocError::NoSpace { .. })) if size / 2 >= min => {
                    size /= 2;
                }
                Err(StoreError::Alloc(AllocError::NoSpace { largest_free, .. })) => {
                    self.start_recall(now, scope(home));
                    return Err(ServiceError::NoLease(format!(
                        "no free run of {min} blocks (the longest is {largest_free})"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        id: u64,
        client: &str,
        res: Reservation,
        slot: Option<LeaseSlot>,
        home: Option<Home>,
        object: u64,
        now: Instant,
    ) {
        self.dev.leases.fetch_add(1, Ordering::Relaxed);
        self.fragments
            .entry(scope(home.as_ref()))
            .or_default()
            .leases += 1;
        self.leases.insert(
            id,
            Lease {
                id,
                client: client.to_string(),
                granted: res.blocks(),
                granted_at: now,
                home,
                res,
                deadline: now + self.cfg.lease_ttl,
                last: LastCommit::default(),
                _slot: slot,
                object,
                fragments: 0,
                deltas: Vec::new(),
            },
        );
    }

    /// Records the holder's report of the fragments in its unused part: at
    /// most that part (a report is advisory and cannot inflate the sum).
    fn note_fragments(&mut self, id: u64, reported: u64) {
        let Some(l) = self.leases.get_mut(&id) else {
            return;
        };
        let n = reported.min(l.res.blocks());
        let old = std::mem::replace(&mut l.fragments, n);
        let f = self.fragments.entry(l.tenant()).or_default();
        f.blocks = f.blocks.saturating_sub(old).saturating_add(n);
        self.publish_fragments();
    }

    fn publish_fragments(&self) {
        let total = self.fragments.values().map(|f| f.blocks).sum();
        self.dev.lease_fragments.store(total, Ordering::Relaxed);
    }

    /// Ends lease `id`: its unused rest returns to free space (or the
    /// tenant's pool). Returns its blocks.
    fn end(&mut self, id: u64, how: LeaseEnd) -> u64 {
        let Some(l) = self.leases.remove(&id) else {
            return 0;
        };
        let n = give_back(l.home.as_ref(), l.res);
        self.remember_ended(id, l.last.clone());
        self.stale.extend(l.deltas);
        self.ended = true;
        let d = &self.dev;
        d.leased.fetch_sub(n, Ordering::Relaxed);
        d.leases.fetch_sub(1, Ordering::Relaxed);
        let scope = scope(l.home.as_ref());
        if let Some(f) = self.fragments.get_mut(&scope) {
            f.leases = f.leases.saturating_sub(1);
            f.blocks = f.blocks.saturating_sub(l.fragments);
            if f.leases == 0 {
                self.fragments.remove(&scope);
            }
        }
        self.publish_fragments();
        count(
            match how {
                LeaseEnd::Expired => &d.events.expiries,
                _ => &d.events.releases,
            },
            1,
        );
        tracing::info!(
            lease = id,
            client = %l.client,
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

    /// Whether a lease ended (expired, released) since the last call.
    pub(crate) fn take_ended(&mut self) -> bool {
        std::mem::take(&mut self.ended)
    }

    /// Commit, first step: answers a resend of the last commit at once,
    /// or checks the batch and puts its publish in `txn`.
    pub(crate) fn stage_commit(
        &mut self,
        id: u64,
        caller: Scope,
        seq: u64,
        batch: CommitBatch,
        txn: &mut Txn<'_>,
    ) -> Result<CommitStep, ServiceError> {
        let now = Instant::now();
        let d = digest(&batch.allocs, &batch.frees, batch.recycle);
        let ttl = self.cfg.lease_ttl;
        if let Some(out) = self.replay_after_end(id, seq, d, now) {
            return Ok(CommitStep::Replayed(out));
        }
        let l = self.get(id, caller, now)?;
        let last = l.last.clone();
        if seq == last.seq && seq > 0 {
            if d != last.digest {
                return Err(ServiceError::SequenceConflict {
                    id,
                    got: seq,
                    why: "it was committed before with other contents".into(),
                });
            }
            l.deadline = now + ttl;
            let (home, object) = (l.home.clone(), l.object);
            self.note_fragments(id, batch.fragments);
            return Ok(CommitStep::Replayed(CommitOutcome {
                ttl,
                unused_blocks: last.unused_blocks,
                replayed: true,
                recall: self.recalling(now, caller),
                recycled: last.recycled,
                grantable: self.grantable(home.as_ref(), now, object),
            }));
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
        if let Some(h) = &l.home {
            h.owners.check_owned(&h.tenant, &batch.frees)?;
        }
        let mut recycling =
            batch.recycle && !batch.frees.is_empty() && !self.recalling(now, caller);
        let order = self.next_order();
        let l = self.leases.get_mut(&id).expect("found above");
        // The records first (when the publish is refused, the transaction
        // is dropped with them): the commit's, and with recycling the
        // lease's, which lists the frees once durable. The allocations
        // need no record: they are allocated in the store.
        let sum = |x: &[Extent]| x.iter().map(|e| e.len()).sum::<u64>();
        let unused = l.res.blocks().saturating_sub(sum(&batch.allocs))
            + if recycling { sum(&batch.frees) } else { 0 };
        let last = CommitRecord {
            seq,
            digest: d,
            unused,
        };
        let value = last.encode();
        loop {
            match txn.put_record(&commit_key(id), &value) {
                Ok(()) => break,
                // The records are full: the oldest ended lease's commit
                // goes first.
                Err(StoreError::BadRecord { .. }) if !self.ended_order.is_empty() => {
                    self.forget_oldest_ended(txn)
                }
                Err(e) => return Err(e.into()),
            }
        }
        let l = self.leases.get_mut(&id).expect("found above");
        if recycling {
            let allocs = &batch.allocs;
            match l.journal_added(txn, order, &batch.frees, |l| {
                minus(&l.res.extents(), allocs)
            }) {
                Ok(()) => {}
                // Too large for the device's records: the frees go to free
                // space instead.
                Err(StoreError::BadRecord { .. }) => recycling = false,
                Err(e) => return Err(e.into()),
            }
        }
        let before = l.res.blocks();
        l.res.publish_in(txn, &batch.allocs, &batch.frees)?;
        let taken = before - l.res.blocks();
        if let Some(h) = &l.home {
            h.owners
                .committed(&h.tenant, batch.allocs.iter().map(|a| a.len()).sum());
        }
        self.dev.leased.fetch_sub(taken, Ordering::Relaxed);
        Ok(CommitStep::Staged(StagedCommit {
            id,
            seq,
            digest: d,
            batch,
            recycling,
        }))
    }

    /// Commit, second step, once the transaction of
    /// [`Self::stage_commit`] is durable (or failed): the freed blocks join
    /// the lease (recycling) or go back to the tenant's pool, and the reply
    /// is kept for resends.
    pub(crate) fn finish_commit(
        &mut self,
        staged: StagedCommit,
        durable: Result<CommitInfo, StoreError>,
    ) -> Result<CommitOutcome, ServiceError> {
        let StagedCommit {
            id,
            seq,
            digest,
            batch,
            recycling,
        } = staged;
        let Some(l) = self.leases.get_mut(&id) else {
            // Commands on a lease wait while it has a commit staged.
            return Err(ServiceError::LeaseEnded {
                id,
                end: LeaseEnd::Ended,
            });
        };
        let home = l.home.clone();
        if let Err(e) = durable {
            if let Some(h) = &home {
                // The allocations were charged as committed when staged.
                let n = batch.allocs.iter().map(|a| a.len()).sum();
                h.owners.committed_failed(&h.tenant, n);
                // The pieces went back to the store's free space.
                h.owners.publish_failed(&h.tenant, &batch.allocs);
            }
            return Err(e.into());
        }
        let mut recycled = Vec::new();
        match &home {
            Some(h) if recycling => {
                recycled = h.owners.recycle(&h.tenant, &batch.frees, &mut l.res)
            }
            Some(h) => h.owners.freed(&h.tenant, &batch.frees),
            None if recycling => {
                for &f in &batch.frees {
                    recycled.extend(l.res.take_range(f).unwrap_or_default());
                }
            }
            None => {}
        }
        recycled.sort_unstable_by_key(|e| e.start());
        let back: u64 = recycled.iter().map(|e| e.len()).sum();
        let after = l.res.blocks();
        l.granted += back;
        let now = Instant::now();
        l.deadline = now + self.cfg.lease_ttl;
        l.last = LastCommit {
            seq,
            digest,
            unused_blocks: after,
            recycled: recycled.clone(),
        };
        let object = l.object;
        self.dev.leased.fetch_add(back, Ordering::Relaxed);
        count(&self.dev.events.recycled_blocks, back);
        let short = fragment_blocks_of(&recycled);
        self.note_fragments(id, batch.fragments.saturating_add(short));
        Ok(CommitOutcome {
            ttl: self.cfg.lease_ttl,
            unused_blocks: after,
            replayed: false,
            recall: self.recalling(now, scope(home.as_ref())),
            recycled,
            grantable: self.grantable(home.as_ref(), now, object),
        })
    }

    /// Moves a lease's deadline; the reply asks for it back when its
    /// scope is short of unleased space.
    pub(crate) fn renew(
        &mut self,
        id: u64,
        fragments: u64,
        caller: Scope,
    ) -> Result<RenewOutcome, ServiceError> {
        let now = Instant::now();
        let ttl = self.cfg.lease_ttl;
        let l = self.get(id, caller, now)?;
        let unused = l.res.blocks();
        l.deadline = now + ttl;
        let (home, object, client) = (l.home.clone(), l.object, l.client.clone());
        self.note_fragments(id, fragments);
        let recall = self.under_pressure(now, home.as_ref());
        if recall {
            count(&self.dev.events.recalls, 1);
            tracing::info!(
                lease = id,
                client = %client,
                device = %self.dev.name,
                unused_blocks = unused,
                "lease recalled (device short of unleased space)"
            );
        }
        Ok(RenewOutcome {
            ttl,
            recall,
            unused_blocks: unused,
            grantable: self.grantable(home.as_ref(), now, object),
        })
    }

    /// Ends a lease at its holder's request; returns the unused blocks.
    pub(crate) fn release(&mut self, id: u64, caller: Scope) -> Result<u64, ServiceError> {
        self.get(id, caller, Instant::now())?;
        Ok(self.end(id, LeaseEnd::Released))
    }

    /// Ends the leases past their deadline and the margin after it;
    /// returns their ids (whose records are to be deleted).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<u64> {
        let margin = self.cfg.lease_margin();
        let due: Vec<u64> = self
            .leases
            .values()
            .filter(|l| now > l.deadline + margin)
            .map(|l| l.id)
            .collect();
        for &id in &due {
            self.end(id, LeaseEnd::Expired);
        }
        // A client's rate is forgotten once it would be reset anyway, so
        // that clients that come and go (or invent ids) do not grow the
        // table.
        let horizon = self.cfg.lease_ttl * 4;
        self.clients
            .retain(|_, r| now.saturating_duration_since(r.last_grant) <= horizon);
        due
    }

    /// Ends every lease in memory (server shutdown): their records stay,
    /// so that the next server restores them. Returns how many were live.
    pub(crate) fn end_all(&mut self) -> usize {
        let ids: Vec<u64> = self.leases.keys().copied().collect();
        for &id in &ids {
            // Its records stay, `H` ones included.
            if let Some(l) = self.leases.get_mut(&id) {
                l.deltas.clear();
            }
            self.end(id, LeaseEnd::Released);
        }
        ids.len()
    }

    /// The live leases of `caller`'s tenant (all without tenants), in
    /// grant order.
    pub(crate) fn list(&self, caller: Option<Scope>) -> Vec<LeaseInfo> {
        let now = Instant::now();
        let mut out: Vec<LeaseInfo> = self
            .leases
            .values()
            .filter(|l| caller.is_none_or(|c| l.tenant() == c))
            .map(|l| LeaseInfo {
                id: l.id,
                client: l.client.clone(),
                granted_blocks: l.granted,
                unused_blocks: l.res.blocks(),
                age: now.saturating_duration_since(l.granted_at),
                expires_in: l.deadline.saturating_duration_since(now),
            })
            .collect();
        out.sort_unstable_by_key(|l| l.id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(start: u64, len: u64) -> Extent {
        Extent::new(start, len).unwrap()
    }

    /// Commit records keep the digest: a build that computed it otherwise
    /// would call a restored lease's resent commit a conflict.
    #[test]
    fn the_commit_digest_is_the_same_on_every_build() {
        assert_eq!(
            digest(&[x(10, 2)], &[x(40, 1)], true),
            0x39a1_b87e_a0d3_9aa8
        );
        assert_ne!(
            digest(&[x(10, 2)], &[], true),
            digest(&[], &[x(10, 2)], true)
        );
        assert_ne!(
            digest(&[x(10, 2)], &[], true),
            digest(&[x(10, 2)], &[], false)
        );
    }

    #[test]
    fn minus_cuts_published_pieces_out_of_the_unused_extents() {
        assert_eq!(minus(&[x(0, 10)], &[]), vec![x(0, 10)]);
        assert_eq!(minus(&[x(0, 10)], &[x(0, 10)]), vec![]);
        assert_eq!(
            minus(&[x(0, 10), x(20, 10)], &[x(8, 4), x(2, 2), x(25, 1)]),
            vec![x(0, 2), x(4, 4), x(20, 5), x(26, 4)]
        );
        // A cut across touching extents.
        assert_eq!(
            minus(&[x(0, 10), x(10, 10), x(30, 5)], &[x(31, 1), x(8, 4)]),
            vec![x(0, 8), x(12, 8), x(30, 1), x(32, 3)]
        );
        assert_eq!(merged(&[x(20, 1)], &[x(0, 5)]), vec![x(0, 5), x(20, 1)]);
    }

    #[test]
    fn an_expired_leases_space_stays_out_of_use_for_the_margin() {
        use blockalloc_store::device::MemDevice;
        use blockalloc_store::{FormatOptions, Store};
        let store =
            Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap());
        let dev = Arc::new(ServedDevice::new("d", Arc::clone(&store)));
        let cfg = Config {
            lease_ttl: Duration::from_secs(10),
            ..Config::default()
        };
        let (ttl, margin) = (cfg.lease_ttl, cfg.lease_margin());
        assert!(margin > Duration::ZERO);
        let mut t = LeaseTable::new(cfg, Arc::clone(&dev), 1, 0);
        let ask = LeaseAsk {
            client: "c".into(),
            min: 16,
            want: 16,
            hint: None,
            extend: None,
        };
        let before = Instant::now();
        let mut txn = store.begin();
        let g = t.stage_grant(&ask, None, None, &mut txn).unwrap();
        let r = txn.commit();
        let g = t.finish_grant(g, r).unwrap();
        let after = Instant::now();
        let free = store.free_blocks();
        // Past its deadline, not past the margin: still held.
        assert!(t.expire(before + ttl + margin / 2).is_empty());
        assert_eq!(store.free_blocks(), free);
        assert_eq!(dev.live_leases(), 1);
        // Past both: ended, its record to delete, its space free.
        assert_eq!(
            t.expire(after + ttl + margin + Duration::from_millis(1)),
            vec![g.id]
        );
        assert_eq!(store.free_blocks(), free + 16);
        assert_eq!(dev.live_leases(), 0);
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

    #[test]
    fn a_lease_id_carries_its_epoch_device_and_sequence() {
        let parts = LeaseId {
            epoch: 0xbeef,
            device: 3,
            seq: 0xffff_fffe,
        };
        assert_eq!(LeaseId::of(parts.id()), parts);
        assert_eq!(parts.id() >> 48, 0xbeef);
    }
}
