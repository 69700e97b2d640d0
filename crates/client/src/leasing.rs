//! [`LeasingAllocator`]: allocation inside leased regions, at local speed;
//! the type documents the life of an allocation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};
use blockalloc_proto::pb;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tonic::Code;

use crate::client::{extent, to_pb, BearerToken, Client, DeviceId};
use crate::error::{ClientError, Result};

/// Every refusal of the server for a lease that ended or is unknown
/// contains this phrase (see `crates/proto/proto/blockalloc/v1/allocator.proto`).
pub const LEASE_GONE_PHRASE: &str = "take a new lease";

/// How a [`LeasingAllocator`] leases and commits.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// The device to allocate on.
    pub device: DeviceId,
    /// Smallest useful lease, in blocks (at least the largest object).
    pub min_blocks: u64,
    /// Lease size to ask for; 0 lets the server size leases from this
    /// client's rate.
    pub want_blocks: u64,
    /// How long pending allocations wait for the background commit when
    /// nobody calls [`LeasingAllocator::commit`].
    pub commit_interval: Duration,
    /// This client's id for the server's lease sizing.
    pub client_id: String,
    /// The bearer token to send instead of the client's own (a server with
    /// tenants wants one), checked when made ([`BearerToken::new`]); `None`
    /// keeps the client's.
    pub token: Option<BearerToken>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            device: DeviceId::default(),
            min_blocks: 1024,
            want_blocks: 0,
            commit_interval: Duration::from_millis(5),
            client_id: format!("pid-{}", std::process::id()),
            token: None,
        }
    }
}

/// Counters of a [`LeasingAllocator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Allocations served from a lease, locally.
    pub local_allocations: u64,
    /// Allocations that fell back to a per-call `Allocate`.
    pub remote_allocations: u64,
    /// Leases granted.
    pub leases: u64,
    /// Grants added to the serving lease.
    pub extensions: u64,
    /// Serving leases retired because their unused space had become
    /// slivers that could not serve a request.
    pub rotations: u64,
    /// `Commit` calls sent (resends included).
    pub commit_calls: u64,
    /// Allocations reported lost.
    pub lost: u64,
}

/// A commit sent but not yet acknowledged: resent as is (same sequence,
/// same contents) until the server answers, which makes it idempotent.
#[derive(Clone, Debug)]
struct Inflight {
    seq: u64,
    allocs: Vec<Extent>,
    frees: Vec<Extent>,
}

struct LocalLease {
    id: u64,
    engine: SegFitAllocator,
    last_seq: u64,
    inflight: Option<Inflight>,
    /// Recalled (or given back): not used for new allocations; released
    /// once everything is committed.
    retiring: bool,
    /// Where the next extension should start: the end of the last grant,
    /// so that it continues the lease's newest run.
    grow_at: u64,
    ttl: Duration,
    renewed: Instant,
}

#[derive(Default)]
struct Local {
    leases: Vec<LocalLease>,
    /// Uncommitted allocations and their lease, oldest first.
    pending: Vec<(u64, Extent)>,
    /// Frees of committed allocations, not yet sent.
    frees: Vec<Extent>,
    /// Generation of the batch being gathered.
    open_gen: u64,
    lost: Vec<Extent>,
    /// The newest generation whose commit failed as unavailable or was cut
    /// off (outcome unknown), and the error.
    unavailable: Option<(u64, ClientError)>,
    /// Another error of a commit, not reported yet (the newest).
    refused: Option<ClientError>,
    /// Until then, requests no lease can serve go per call: the last grant
    /// was only a few objects' worth, so the long free runs are gone, and
    /// more small leases would only strand their tails; or the last grant
    /// was refused.
    per_call_until: Option<Instant>,
    /// The lease TTL the server last granted: how long an unanswered
    /// recall can take.
    ttl_seen: Duration,
    /// Blocks of the last grant.
    last_grant: u64,
    /// Free blocks of the serving leases below which the next lease is
    /// fetched in the background: doubled (up to a few grants) each time
    /// an allocation had to wait for a lease, so that it covers what this
    /// client allocates while a lease request is on its way.
    low_water: u64,
    /// No prefetch before then: the last one was refused.
    prefetch_after: Option<Instant>,
}

struct Shared {
    client: Client,
    opts: LeaseOptions,
    local: Mutex<Local>,
    /// Serialises lease requests, so that many tasks that find no space at
    /// once take one lease, not one each.
    leasing: tokio::sync::Mutex<()>,
    /// Wakes the background task (`notify_waiters` only: the flags below
    /// say why, so no stale permit causes a needless commit).
    wake: Notify,
    /// The newest generation a `commit` call waits for.
    wanted: AtomicU64,
    /// Leases retired or recalled: commit and release them now.
    urgent: AtomicBool,
    /// The newest generation the background task has finished.
    done: watch::Sender<u64>,
    closing: AtomicBool,
    /// Wakes the prefetch task.
    prefetch: Notify,
    /// A prefetch was asked for and has not finished.
    prefetching: AtomicBool,
    /// Stops the recall watcher (a permit, so that a stop before it waits
    /// is not lost).
    stop_watching: Notify,
    stats: [AtomicU64; 7],
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An allocator that leases regions from the server and allocates inside
/// them locally.
///
/// The allocator leases a region of the device from the server and serves
/// allocations from it with a local [`SegFitAllocator`] built over the
/// leased extents — no round trip. Allocations are recorded as *pending*;
/// a background task sends them, with pending frees, in one `Commit` (so
/// allocations of many tasks and threads share one RPC), keeps the lease
/// alive with `Renew`, and gives it back when the server recalls it.
///
/// Life of a lease: the client holds **one** serving lease, whose local
/// engine spans the whole device (everything outside the lease counts as
/// allocated):
/// * the first allocation takes it (`Lease`);
/// * when its free blocks fall below a low-water mark, a background
///   prefetch *extends* it (`Lease` with `extend_lease_id`, hinted at the
///   end of the last grant) and adds the granted extents to the engine, so
///   the unused tail of earlier grants stays in use and is never stranded;
/// * every `Commit` asks the server to recycle its frees: once durable the
///   freed blocks join the lease (`CommitResponse.recycled`, added to the
///   engine once per sequence, also when a resent commit is replayed), so
///   freed space is reused at once, as an in-process engine reuses it;
/// * a recall (the device is nearly full) or a give-back before "no space"
///   retires it: it serves nothing more, its pending allocations are
///   committed and the rest is released; the next lease is a new one. A
///   task follows the device's recalls (`WatchRecalls`), so the lease
///   retires as soon as a recall starts, not at the next `Renew`;
/// * a lease the server no longer has (restart, expiry) is dropped: its
///   uncommitted allocations are lost (below), and the next request takes
///   a new lease.
///
/// Life of an allocation:
/// * `allocate` → pending (its blocks are the caller's, but a crash of the
///   server or an expired lease frees them again);
/// * the next commit → durable; [`LeasingAllocator::commit`] waits for it;
/// * a lease that ends before its allocations were committed (server
///   restart: the server answers NOT_FOUND; expiry: FAILED_PRECONDITION)
///   makes them *lost*: the next `commit` reports them as
///   [`ClientError::Lost`], and later allocations take a new lease.
///
/// When no lease can be had (the server is nearly full), `allocate` falls
/// back to a per-call `Allocate`, which is durable at once; when that finds
/// no room, it waits for the leases the server recalls and tries again, so
/// that "no space" means no space.
///
/// A retiring lease and a new one can briefly coexist; each has its own
/// local engine, because extents of two leases may touch and one engine
/// would merge them into an allocation no single lease contains.
///
/// ```no_run
/// # async fn demo() -> Result<(), blockalloc_client::ClientError> {
/// use blockalloc_client::{Client, LeaseOptions, LeasingAllocator};
///
/// let client = Client::connect("127.0.0.1:7878").await?;
/// let alloc = LeasingAllocator::new(client, LeaseOptions::default());
/// let a = alloc.allocate(256).await?; // local, after the first lease
/// let b = alloc.allocate(16).await?;
/// alloc.commit().await?; // both durable now
/// alloc.free(a).await?;
/// alloc.close().await?; // commits the free, returns the unused rest
/// # let _ = b; Ok(()) }
/// ```
pub struct LeasingAllocator {
    shared: Arc<Shared>,
    task: Option<JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for LeasingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasingAllocator")
            .field("options", &self.shared.opts)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const LOCAL: usize = 0;
const REMOTE: usize = 1;
const LEASES: usize = 2;
const COMMITS: usize = 3;
const LOST: usize = 4;
const EXTENSIONS: usize = 5;
const ROTATIONS: usize = 6;

impl LeasingAllocator {
    /// A leasing allocator over `client`. Starts a background task on the
    /// current tokio runtime (so call it inside one). Cannot fail: a token
    /// that a header cannot carry is refused when it is made
    /// ([`BearerToken::new`]).
    pub fn new(client: Client, opts: LeaseOptions) -> LeasingAllocator {
        let client = match &opts.token {
            Some(t) => client.with_bearer(t.clone()),
            None => client,
        };
        let (done, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            client,
            opts: opts.clone(),
            local: Mutex::new(Local {
                open_gen: 1,
                ttl_seen: DEFAULT_TTL,
                low_water: opts.min_blocks,
                ..Local::default()
            }),
            leasing: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            wanted: AtomicU64::new(0),
            urgent: AtomicBool::new(false),
            done,
            closing: AtomicBool::new(false),
            prefetch: Notify::new(),
            prefetching: AtomicBool::new(false),
            stop_watching: Notify::new(),
            stats: Default::default(),
        });
        let task = tokio::spawn(background(Arc::clone(&shared)));
        tokio::spawn(prefetcher(Arc::clone(&shared)));
        tokio::spawn(recall_watcher(Arc::clone(&shared)));
        LeasingAllocator {
            shared,
            task: Some(task),
        }
    }

    /// The same as [`LeasingAllocator::new`], which cannot fail.
    ///
    /// # Errors
    /// None: `opts.token` was checked by [`BearerToken::new`].
    #[deprecated(note = "use LeasingAllocator::new, which cannot fail")]
    pub fn with_token(client: Client, opts: LeaseOptions) -> Result<LeasingAllocator> {
        Ok(LeasingAllocator::new(client, opts))
    }

    /// Counters so far.
    pub fn stats(&self) -> LeaseStats {
        let s = &self.shared.stats;
        let g = |i: usize| s[i].load(Ordering::Relaxed);
        LeaseStats {
            local_allocations: g(LOCAL),
            remote_allocations: g(REMOTE),
            leases: g(LEASES),
            commit_calls: g(COMMITS),
            lost: g(LOST),
            extensions: g(EXTENSIONS),
            rotations: g(ROTATIONS),
        }
    }

    /// The ids of the leases held now, oldest first.
    pub fn lease_ids(&self) -> Vec<u64> {
        lock(&self.shared.local)
            .leases
            .iter()
            .map(|x| x.id)
            .collect()
    }

    /// Allocates `blocks` contiguous blocks from the serving lease, without
    /// a round trip, or `None` when it has no room (never waits).
    pub fn try_allocate_local(&self, blocks: u64) -> Option<Extent> {
        let mut l = lock(&self.shared.local);
        let l = &mut *l;
        // At most one lease serves; a retiring one only waits for its
        // commit and release.
        let lease = l.leases.iter_mut().find(|x| !x.retiring)?;
        let e = lease.engine.allocate(blocks, None).ok()?;
        let (id, spare) = (lease.id, unused(lease));
        l.pending.push((id, e));
        self.shared.stats[LOCAL].fetch_add(1, Ordering::Relaxed);
        let prefetch_allowed = l.prefetch_after.is_none_or(|t| Instant::now() >= t);
        if spare < l.low_water
            && prefetch_allowed
            && !self.shared.prefetching.swap(true, Ordering::Relaxed)
        {
            self.shared.prefetch.notify_one();
        }
        Some(e)
    }

    /// Allocates `blocks` contiguous blocks: locally from a lease when one
    /// has room, else after leasing a new region, else (when the server
    /// grants no lease) by a per-call allocation, durable at once.
    /// A leased allocation is durable after the next [`commit`](Self::commit).
    ///
    /// # Errors
    /// [`ClientError::NoSpace`], [`ClientError::Quota`],
    /// [`ClientError::Unavailable`], [`ClientError::Refused`],
    /// [`ClientError::Closed`].
    pub async fn allocate(&self, blocks: u64) -> Result<Extent> {
        if blocks == 0 {
            return Err(ClientError::Refused {
                code: Code::InvalidArgument,
                reason: "cannot allocate zero blocks".into(),
            });
        }
        loop {
            if self.shared.closing.load(Ordering::Relaxed) {
                return Err(ClientError::Closed);
            }
            if let Some(e) = self.try_allocate_local(blocks) {
                return Ok(e);
            }
            {
                // This allocation waits for a lease although it holds one:
                // fetch earlier next time.
                let mut l = lock(&self.shared.local);
                if !l.leases.is_empty() {
                    let grant = l.last_grant.max(self.shared.opts.min_blocks);
                    l.low_water = (l.low_water * 2).min(LOW_WATER_GRANTS * grant);
                }
            }
            let _g = self.shared.leasing.lock().await;
            if let Some(e) = self.try_allocate_local(blocks) {
                return Ok(e);
            }
            let fragmented = lock(&self.shared.local)
                .per_call_until
                .is_some_and(|t| Instant::now() < t);
            let leased = if fragmented {
                Err(ClientError::NoSpace {
                    reason: "free space is fragmented".into(),
                    details: None,
                })
            } else {
                self.rotate_if_fragmented(blocks);
                take_lease(&self.shared, blocks).await
            };
            match leased {
                Ok(()) => continue,
                // A quota refusal too: a per-call allocation smaller than a
                // grant may still fit under the quota.
                Err(ClientError::NoSpace { .. } | ClientError::Quota { .. }) => {
                    // No more space to add: the leases' own fragments serve.
                    {
                        let mut l = lock(&self.shared.local);
                        set_refill(&mut l, 0);
                        if !fragmented {
                            // A refused grant: the next ones would be
                            // refused too (a recall lasts a TTL) and cost a
                            // round trip each before every per-call
                            // allocation.
                            let pause = l.ttl_seen / REFUSED_PAUSE;
                            l.per_call_until = Some(Instant::now() + pause);
                        }
                    }
                    let e = self.allocate_per_call(blocks).await?;
                    self.shared.stats[REMOTE].fetch_add(1, Ordering::Relaxed);
                    return Ok(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Retires the serving lease when it holds many requests' worth of
    /// unused blocks yet none of its runs fits `blocks`, and the server has
    /// no long runs to add (the engine's refill is below its minimum): its
    /// space has become slivers (cut tails, recycled frees). Growing it
    /// would hoard them; retired, the lease is committed and released, so
    /// the slivers return to the server, where per-call allocation and
    /// other leases can use them, and the next grant starts a fresh lease.
    fn rotate_if_fragmented(&self, blocks: u64) {
        let mut l = lock(&self.shared.local);
        let request = blocks.max(self.shared.opts.min_blocks);
        let mut rotated = false;
        for lease in l.leases.iter_mut().filter(|x| !x.retiring) {
            // A lease with a run that fits has room: its engine only
            // declined to cut a fragment. And while the server can add runs
            // (the refill), its fragments are kept for their exact
            // requests: handed back, they would wait in the store for the
            // per-call end (a client whose extension came late under load
            // rotated twice and stopped at 99.855 % instead of 99.995 %).
            if unused(lease) >= ROTATE_OBJECTS.saturating_mul(request)
                && lease.engine.largest_free() < blocks
                && lease.engine.refill_blocks() < SegFitAllocator::MIN_REFILL
            {
                lease.retiring = true;
                rotated = true;
            }
        }
        drop(l);
        if rotated {
            self.shared.stats[ROTATIONS].fetch_add(1, Ordering::Relaxed);
            self.shared.urgent.store(true, Ordering::Relaxed);
            self.shared.wake.notify_waiters();
        }
    }

    /// A per-call allocation, for when no lease is granted. When even that
    /// finds no room, leases may still hold it: this client's own are given
    /// back, and those of other clients are being recalled (the refused
    /// grant started a recall on the server), so it waits until they are
    /// back and tries once more. Only then is "no space" the answer.
    async fn allocate_per_call(&self, blocks: u64) -> Result<Extent> {
        let dev = &self.shared.opts.device;
        match self.shared.client.allocate(dev, 1, blocks, None).await {
            Err(ClientError::NoSpace { .. }) => {}
            // This client's unused leased space counts against its tenant's
            // quota: given back, it may make room. A quota refusal starts no
            // recall, so there is nothing else to wait for.
            Err(ClientError::Quota { .. }) if !self.lease_ids().is_empty() => {
                self.give_back().await?;
                return Ok(self.shared.client.allocate(dev, 1, blocks, None).await?[0]);
            }
            r => return r.map(|v| v[0]),
        }
        if !self.lease_ids().is_empty() {
            self.give_back().await?;
        }
        self.wait_for_recalled_leases().await?;
        Ok(self.shared.client.allocate(dev, 1, blocks, None).await?[0])
    }

    /// Waits until no lease on the device holds unused blocks, at most one
    /// TTL and the expiry margin: a holder hands its lease back at its next
    /// commit or renewal, and one that does not has expired by then.
    async fn wait_for_recalled_leases(&self) -> Result<()> {
        let ttl = lock(&self.shared.local).ttl_seen;
        let deadline = Instant::now() + ttl + RECALL_MARGIN;
        loop {
            let st = self.shared.client.status().await?;
            let held = st
                .iter()
                .find(|d| self.shared.opts.device.names(d))
                .map_or(0, |d| d.leased_unused_blocks);
            if held == 0 || Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(RECALL_POLL).await;
        }
    }

    /// Commits everything and releases every lease held now; waits (at most
    /// a second) for the releases.
    async fn give_back(&self) -> Result<()> {
        let ids = {
            let mut l = lock(&self.shared.local);
            for x in &mut l.leases {
                x.retiring = true;
            }
            l.leases.iter().map(|x| x.id).collect::<Vec<_>>()
        };
        // Losses and refusals the round finds concern earlier allocations
        // and frees, not the allocation that is giving back: they stay for
        // the next `commit` to report.
        if let Some(my) = self.flush().await? {
            if let Some(e) = unavailable_since(&lock(&self.shared.local), my) {
                return Err(e);
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1)
            && self.lease_ids().iter().any(|id| ids.contains(id))
        {
            self.shared.urgent.store(true, Ordering::Relaxed);
            self.shared.wake.notify_waiters();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Frees `e`: an uncommitted allocation goes straight back to its
    /// lease; a committed one is freed with the next commit (durable when a
    /// later [`commit`](Self::commit) returns).
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn free(&self, e: Extent) -> Result<()> {
        if self.shared.closing.load(Ordering::Relaxed) {
            return Err(ClientError::Closed);
        }
        let mut l = lock(&self.shared.local);
        let l = &mut *l;
        if let Some(i) = l.pending.iter().position(|&(_, p)| p == e) {
            let (id, _) = l.pending.swap_remove(i);
            if let Some(lease) = l.leases.iter_mut().find(|x| x.id == id) {
                lease
                    .engine
                    .free(e)
                    .expect("a pending allocation is allocated in its lease");
            }
            return Ok(());
        }
        l.frees.push(e);
        Ok(())
    }

    /// Waits until every allocation and free made before the call is
    /// durable.
    ///
    /// # Errors
    /// [`ClientError::Lost`] with the allocations (of this caller or any
    /// other) that were lost since the last report; each loss is reported
    /// once. [`ClientError::Unavailable`] when the server could not be
    /// reached, [`ClientError::OutcomeUnknown`] when the commit was cut off
    /// after it was sent: either way the batch stays pending and is resent
    /// with its sequence number, which the server applies once, so call
    /// `commit` again. Other refusals as the server sent them; when the server
    /// refused a batch that held frees (a double free, a free of a lost
    /// allocation), the frees are dropped with that error and the batch's
    /// allocations are resent at once without them, so a later `commit`
    /// returns once they are durable. A refusal in a periodic round (one
    /// no `commit` waited for) is reported by the next `commit`, once.
    pub async fn commit(&self) -> Result<()> {
        let Some(my) = self.flush().await? else {
            return Ok(());
        };
        let mut l = lock(&self.shared.local);
        if !l.lost.is_empty() {
            let extents = std::mem::take(&mut l.lost);
            return Err(ClientError::Lost { extents });
        }
        if let Some(e) = unavailable_since(&l, my) {
            return Err(e);
        }
        // A refusal is reported once, to this commit or, when it came in a
        // round no commit waited for, to the next one.
        if let Some(e) = l.refused.take() {
            return Err(e);
        }
        Ok(())
    }

    /// Waits until every allocation and free made before the call is
    /// durable, as [`commit`](Self::commit) does, and returns the commit
    /// round it waited for (`None` when there was nothing to send or
    /// report), leaving what the round found (losses, refusals) for
    /// `commit` to report.
    async fn flush(&self) -> Result<Option<u64>> {
        let my = {
            let l = lock(&self.shared.local);
            let inflight = l.leases.iter().any(|x| x.inflight.is_some());
            if l.pending.is_empty()
                && l.frees.is_empty()
                && l.lost.is_empty()
                && l.refused.is_none()
                && !inflight
            {
                return Ok(None);
            }
            l.open_gen
        };
        let mut rx = self.shared.done.subscribe();
        self.shared.wanted.fetch_max(my, Ordering::Relaxed);
        self.shared.wake.notify_waiters();
        loop {
            if *rx.borrow_and_update() >= my {
                return Ok(Some(my));
            }
            if rx.changed().await.is_err() {
                return Err(ClientError::Closed);
            }
        }
    }

    /// Commits everything, releases every lease (their unused rest becomes
    /// free on the server) and stops the background task.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub async fn close(mut self) -> Result<()> {
        let r = self.commit().await;
        self.shared.closing.store(true, Ordering::Relaxed);
        self.shared.wake.notify_waiters();
        self.shared.prefetch.notify_one();
        self.shared.stop_watching.notify_one();
        let t = self.task.take().expect("the task runs until close or drop");
        let bg = t
            .await
            .map_err(|e| ClientError::Unavailable(format!("background task failed: {e}")))?;
        r.and(bg)
    }
}

impl Drop for LeasingAllocator {
    /// Stops the background task after a last commit and release of every
    /// lease (it finishes on its own if the runtime keeps running).
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        self.shared.wake.notify_waiters();
        self.shared.prefetch.notify_one();
        self.shared.stop_watching.notify_one();
    }
}

/// Asks the server for space: `extend` (a serving lease and the block to
/// grow it at) adds to that lease, else a new lease. Near full a lease of
/// the preferred minimum may be too much while one of exactly this
/// allocation is still granted, so that is asked next.
async fn ask_for_space(
    sh: &Shared,
    blocks: u64,
    extend: Option<(u64, u64)>,
) -> Result<pb::LeaseResponse> {
    let o = &sh.opts;
    let req = |min_blocks, want_blocks| pb::LeaseRequest {
        device: Some(o.device.to_pb()),
        client_id: o.client_id.clone(),
        min_blocks,
        want_blocks,
        hint: extend.map(|(_, at)| at),
        extend_lease_id: extend.map_or(0, |(id, _)| id),
    };
    match sh
        .client
        .rpc()
        .lease(req(blocks.max(o.min_blocks), o.want_blocks))
        .await
    {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == Code::ResourceExhausted && blocks < o.min_blocks => Ok(sh
            .client
            .rpc()
            .lease(req(blocks, blocks))
            .await?
            .into_inner()),
        Err(s) => Err(sh.client.fail(s).await),
    }
}

/// Gets at least `blocks` more blocks to allocate from: grows the serving
/// lease, or takes a new one when there is none or it is gone.
async fn take_lease(sh: &Shared, blocks: u64) -> Result<()> {
    let serving = lock(&sh.local)
        .leases
        .iter()
        .find(|x| !x.retiring)
        .map(|x| (x.id, x.grow_at));
    let r = match ask_for_space(sh, blocks, serving).await {
        Err(e) if lease_gone(&e) => {
            if let Some((id, _)) = serving {
                drop_lease(&mut lock(&sh.local), sh, id, true);
            }
            ask_for_space(sh, blocks, None).await?
        }
        r => r?,
    };
    let extents: Vec<Extent> = r.extents.iter().map(extent).collect::<Result<_>>()?;
    let granted: u64 = extents.iter().map(|e| e.len()).sum();
    let ttl = Duration::from_millis(r.ttl_ms.max(1));
    let mut l = lock(&sh.local);
    l.last_grant = granted;
    l.ttl_seen = ttl;
    if granted < FRAGMENTED_GRANT_OBJECTS * blocks.max(sh.opts.min_blocks) {
        l.per_call_until = Some(Instant::now() + ttl);
    }
    // The grant is a run and perhaps some fragments: the lease grows at the
    // end of the run.
    let grow_at = extents
        .iter()
        .max_by_key(|e| e.len())
        .map_or(0, |e| e.end());
    if let Some(lease) = l.leases.iter_mut().find(|x| x.id == r.lease_id) {
        for &e in &extents {
            lease.engine.free(e).map_err(|_| {
                ClientError::BadReply(format!(
                    "lease {}: the extension {e} overlaps space it held",
                    r.lease_id
                ))
            })?;
        }
        lease.grow_at = grow_at;
        lease.renewed = Instant::now();
        sh.stats[EXTENSIONS].fetch_add(1, Ordering::Relaxed);
        set_refill(&mut l, r.grantable_blocks);
        return Ok(());
    }
    if serving.is_some_and(|(id, _)| id == r.lease_id) {
        // Released meanwhile (recalled): the release returned this too.
        return Ok(());
    }
    let mut engine = SegFitAllocator::from_free_extents(r.capacity_blocks, &extents)
        .map_err(|e| ClientError::BadReply(format!("lease {}: {e}", r.lease_id)))?;
    engine.set_refill_blocks(r.grantable_blocks);
    l.leases.push(LocalLease {
        id: r.lease_id,
        engine,
        last_seq: 0,
        inflight: None,
        retiring: false,
        grow_at,
        ttl,
        renewed: Instant::now(),
    });
    sh.stats[LEASES].fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Tells the leases' engines how much the server could add to them (its
/// `grantable_blocks`; see `SegFitAllocator::set_refill_blocks`): while
/// that is plenty, a request the policy would cut from a long run, when the
/// lease holds none, waits for an extension instead of cutting a sliver
/// from fragments that other requests fit exactly.
fn set_refill(l: &mut Local, grantable: u64) {
    for lease in &mut l.leases {
        lease.engine.set_refill_blocks(grantable);
    }
}

/// Blocks of a lease not allocated yet.
fn unused(lease: &LocalLease) -> u64 {
    lease.engine.capacity() - lease.engine.used()
}

/// The prefetch task: takes the next lease while the serving ones still
/// have room, so that allocations seldom wait for a round trip. A refused
/// prefetch is not an error (an allocation that finds no room asks again
/// and falls back to per-call allocation); prefetching pauses for a TTL.
async fn prefetcher(sh: Arc<Shared>) {
    loop {
        sh.prefetch.notified().await;
        if sh.closing.load(Ordering::Relaxed) {
            return;
        }
        {
            let _g = sh.leasing.lock().await;
            let needed = {
                let l = lock(&sh.local);
                let spare: u64 = l.leases.iter().filter(|x| !x.retiring).map(unused).sum();
                let per_call = l.per_call_until.is_some_and(|t| Instant::now() < t);
                spare < l.low_water && !per_call
            };
            if needed && take_lease(&sh, sh.opts.min_blocks).await.is_err() {
                let mut l = lock(&sh.local);
                l.prefetch_after = Some(Instant::now() + l.ttl_seen);
            }
        }
        sh.prefetching.store(false, Ordering::Relaxed);
    }
}

/// The background task: commits, renews, releases; on close, commits and
/// releases everything.
async fn background(sh: Arc<Shared>) -> Result<()> {
    let mut closing_rounds = 0u32;
    let mut last_commit = Instant::now();
    loop {
        // Registered before the flags are read, so a wake between the
        // check and the wait is not lost.
        let notified = sh.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (renew_every, open) = {
            let l = lock(&sh.local);
            let r = l
                .leases
                .iter()
                .map(|x| x.ttl / 3)
                .min()
                .unwrap_or(Duration::from_secs(1));
            (r, l.open_gen)
        };
        let demanded = |sh: &Shared| {
            sh.closing.load(Ordering::Relaxed)
                || sh.urgent.load(Ordering::Relaxed)
                || sh.wanted.load(Ordering::Relaxed) >= open
        };
        if !demanded(&sh) {
            let until_commit = sh
                .opts
                .commit_interval
                .saturating_sub(last_commit.elapsed());
            let _ = tokio::time::timeout(until_commit.min(renew_every), notified).await;
        }
        let closing = sh.closing.load(Ordering::Relaxed);
        // Commit when asked to, or when the interval has passed; a wake
        // for renewals alone commits nothing.
        if demanded(&sh) || last_commit.elapsed() >= sh.opts.commit_interval {
            sh.urgent.store(false, Ordering::Relaxed);
            commit_round(&sh).await;
            last_commit = Instant::now();
        }
        renew_round(&sh).await;
        release_round(&sh, closing).await;
        if closing {
            closing_rounds += 1;
            let released = lock(&sh.local).leases.is_empty();
            if released || closing_rounds >= 5 {
                let _ = sh.done.send(u64::MAX);
                return if released {
                    Ok(())
                } else {
                    Err(ClientError::Unavailable(
                        "leases could not be released; they expire on the server".into(),
                    ))
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A grant of fewer than this many of the largest objects means the
/// server's long free runs are gone: requests no lease serves then go per
/// call for a lease's lifetime.
const FRAGMENTED_GRANT_OBJECTS: u64 = 4;

/// After a refused grant, requests no lease serves go per call for this
/// fraction of a TTL before a lease is asked for again.
const REFUSED_PAUSE: u32 = 4;

/// A serving lease with this many requests' worth of unused blocks that
/// cannot serve the request is slivers: it is retired, not grown.
const ROTATE_OBJECTS: u64 = 8;

/// The server's default lease TTL: how long an unanswered recall is
/// waited for before this client has seen a grant.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Beyond one TTL, how long a recall is waited for: the server's expiry
/// task ends an expired lease within this.
const RECALL_MARGIN: Duration = Duration::from_millis(500);

/// How often a client that found no room asks whether the recalled leases
/// are back.
const RECALL_POLL: Duration = Duration::from_millis(2);

/// Refusals of `WatchRecalls` that opening it again would only repeat.
const PERMANENT: [Code; 4] = [
    Code::Unimplemented,
    Code::PermissionDenied,
    Code::Unauthenticated,
    Code::NotFound,
];

/// How long the recall watcher waits before opening a lost stream again.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// The low-water mark grows up to this many grants.
const LOW_WATER_GRANTS: u64 = 4;

/// Allocations plus frees in one `Commit`: the server's default limit per
/// request. A larger batch goes out in several commits of the same round.
const MAX_PER_COMMIT: usize = 4096;

/// Takes the gathered batch and commits it, lease by lease, in as many
/// passes as the per-request limit needs; then tells the waiters.
async fn commit_round(sh: &Shared) {
    let gen = loop {
        let (gen, more) = commit_pass(sh).await;
        if !more {
            break gen;
        }
    };
    let _ = sh.done.send_if_modified(|d| {
        if *d < gen {
            *d = gen;
            true
        } else {
            false
        }
    });
}

/// One pass of a round: at most [`MAX_PER_COMMIT`] operations per lease.
/// Returns the pass's generation and whether a batch was cut at the limit
/// (and everything sent was accepted), so that another pass must follow.
async fn commit_pass(sh: &Shared) -> (u64, bool) {
    let mut cut = false;
    let mut failed = false;
    let (gen, work) = {
        let mut l = lock(&sh.local);
        let l = &mut *l;
        let gen = l.open_gen;
        l.open_gen += 1;
        let mut by_lease: HashMap<u64, Vec<Extent>> = HashMap::new();
        for (id, e) in l.pending.drain(..) {
            by_lease.entry(id).or_default().push(e);
        }
        let mut frees = std::mem::take(&mut l.frees);
        let mut work = Vec::new();
        for lease in &mut l.leases {
            let mut allocs = by_lease.remove(&lease.id).unwrap_or_default();
            if lease.inflight.is_none() && (!allocs.is_empty() || !frees.is_empty()) {
                if allocs.len() > MAX_PER_COMMIT {
                    let rest = allocs.split_off(MAX_PER_COMMIT);
                    l.pending.extend(rest.into_iter().map(|e| (lease.id, e)));
                    cut = true;
                }
                let n = frees.len().min(MAX_PER_COMMIT - allocs.len());
                cut |= n < frees.len();
                lease.inflight = Some(Inflight {
                    seq: lease.last_seq + 1,
                    allocs,
                    frees: frees.drain(..n).collect(),
                });
            } else if !allocs.is_empty() {
                // Waits behind an unacknowledged commit of the same lease.
                l.pending.extend(allocs.into_iter().map(|e| (lease.id, e)));
            }
            if let Some(i) = &lease.inflight {
                work.push((lease.id, i.clone(), lease.engine.fragment_blocks()));
            }
        }
        // Allocations of leases dropped meanwhile are lost.
        for (_, extents) in by_lease {
            sh.stats[LOST].fetch_add(extents.len() as u64, Ordering::Relaxed);
            l.lost.extend(extents);
        }
        l.frees.extend(frees);
        (gen, work)
    };
    let mut frees_without_lease = Vec::new();
    {
        let l = lock(&sh.local);
        if l.leases.is_empty() && !l.frees.is_empty() {
            frees_without_lease = l.frees.clone();
        }
    }
    for chunk in frees_without_lease.chunks(MAX_PER_COMMIT) {
        match sh.client.free(&sh.opts.device, chunk).await {
            Ok(_) => {
                let mut l = lock(&sh.local);
                l.frees.retain(|f| !chunk.contains(f));
            }
            Err(e) => {
                if e.is_outcome_unknown() {
                    // The free may have run: sent again, it could free
                    // blocks allocated since by someone else. Dropped with
                    // the error instead; at worst they stay allocated
                    // until a `reconcile` finds them.
                    lock(&sh.local).frees.retain(|f| !chunk.contains(f));
                }
                failed = true;
                note_error(sh, gen, e);
                break;
            }
        }
    }
    for (id, inf, fragments) in work {
        sh.stats[COMMITS].fetch_add(1, Ordering::Relaxed);
        // On the connection's `Calls` stream (unary where it has none).
        let r = sh
            .client
            .commit_call(pb::CommitRequest {
                lease_id: id,
                sequence: inf.seq,
                allocations: inf.allocs.iter().copied().map(to_pb).collect(),
                frees: inf.frees.iter().copied().map(to_pb).collect(),
                recycle_frees: true,
                fragment_blocks: fragments,
            })
            .await;
        let mut l = lock(&sh.local);
        match r {
            Ok(r) => {
                let mut bad = None;
                if let Some(lease) = l.leases.iter_mut().find(|x| x.id == id) {
                    lease.last_seq = inf.seq;
                    lease.inflight = None;
                    lease.renewed = Instant::now();
                    // Once per sequence: the inflight commit is gone now,
                    // and a replayed reply arrives only in place of a lost
                    // one.
                    bad = reuse_recycled(lease, &r.recycled);
                    if r.recall {
                        recall(sh, lease);
                    }
                }
                set_refill(&mut l, r.grantable_blocks);
                if let Some(e) = bad {
                    drop(l);
                    failed = true;
                    note_error(sh, gen, e);
                }
            }
            Err(e) => {
                failed = true;
                match &e {
                    // Not run, or cut off with its outcome unknown: either
                    // way the batch stays in flight and is sent again with
                    // the same sequence number, which the server applies
                    // once (a replay answers a batch that did run). So a
                    // cut-off commit is neither taken as lost (its
                    // allocations may be durable) nor as done (they may
                    // not be).
                    ClientError::Unavailable(_) | ClientError::OutcomeUnknown(_) => {}
                    ClientError::Refused {
                        code: Code::NotFound | Code::FailedPrecondition,
                        ..
                    } if lease_gone(&e) => {
                        // Its frees were never applied: send them again.
                        drop_lease(&mut l, sh, id, true);
                        continue;
                    }
                    _ if !inf.frees.is_empty() => {
                        // Refused as a whole, and the frees are the likely
                        // cause (a double free, a free of a lost
                        // allocation): nothing was applied, so the same
                        // sequence is resent at once without the frees,
                        // which are dropped with the error.
                        if let Some(lease) = l.leases.iter_mut().find(|x| x.id == id) {
                            lease.inflight = (!inf.allocs.is_empty()).then(|| Inflight {
                                seq: inf.seq,
                                allocs: inf.allocs.clone(),
                                frees: Vec::new(),
                            });
                        }
                        sh.urgent.store(true, Ordering::Relaxed);
                    }
                    _ => {
                        // Allocations alone refused: a bug on one side or
                        // the other. Nothing of it is durable; the lease is
                        // left to expire.
                        drop_lease(&mut l, sh, id, false);
                    }
                }
                drop(l);
                note_error(sh, gen, e);
            }
        }
    }
    (gen, cut && !failed)
}

/// Adds the freed blocks a commit handed back to its lease to the lease's
/// engine; the error for a reply that lists blocks the lease holds free
/// already (the rest is added all the same).
fn reuse_recycled(lease: &mut LocalLease, recycled: &[pb::Extent]) -> Option<ClientError> {
    let mut bad = None;
    for e in recycled {
        let ok = extent(e).is_ok_and(|e| lease.engine.free(e).is_ok());
        if !ok {
            bad = Some(ClientError::BadReply(format!(
                "lease {}: recycled extent {}+{} is not an allocation of the lease",
                lease.id, e.start, e.len
            )));
        }
    }
    bad
}

/// True for refusals that mean the lease no longer exists on the server:
/// NOT_FOUND, or FAILED_PRECONDITION with the phrase the schema promises
/// for ended leases.
fn lease_gone(e: &ClientError) -> bool {
    match e {
        ClientError::Refused { code, reason } => {
            *code == Code::NotFound
                || (*code == Code::FailedPrecondition && reason.contains(LEASE_GONE_PHRASE))
        }
        _ => false,
    }
}

/// The unavailable (or outcome unknown) error of commit round `gen` or a
/// later one, if one failed so.
fn unavailable_since(l: &Local, gen: u64) -> Option<ClientError> {
    match &l.unavailable {
        Some((g, e)) if *g >= gen => Some(e.clone()),
        _ => None,
    }
}

fn note_error(sh: &Shared, gen: u64, e: ClientError) {
    let mut l = lock(&sh.local);
    match e {
        e @ (ClientError::Unavailable(_) | ClientError::OutcomeUnknown(_)) => {
            l.unavailable = Some((gen, e))
        }
        other => l.refused = Some(other),
    }
}

/// Forgets a lease the server no longer has; its pending allocations are
/// lost.
fn drop_lease(l: &mut Local, sh: &Shared, id: u64, resend_frees: bool) {
    let mut lost = Vec::new();
    if let Some(i) = l.leases.iter().position(|x| x.id == id) {
        let lease = l.leases.remove(i);
        if let Some(inf) = lease.inflight {
            lost.extend(inf.allocs);
            if resend_frees {
                l.frees.extend(inf.frees);
            }
        }
    }
    l.pending.retain(|&(i, e)| {
        if i == id {
            lost.push(e);
            false
        } else {
            true
        }
    });
    sh.stats[LOST].fetch_add(lost.len() as u64, Ordering::Relaxed);
    l.lost.extend(lost);
}

/// The recall watcher: follows the device's `WatchRecalls` stream and
/// hands every lease back as soon as a recall starts, instead of at the
/// next renewal (a third of a TTL) or commit. A lost stream is opened
/// again after a pause; a server without the call, or one that refuses it
/// for good (permission, authentication, unknown device), leaves recalls
/// to the renewals.
async fn recall_watcher(sh: Arc<Shared>) {
    let req = pb::WatchRecallsRequest {
        device: Some(sh.opts.device.to_pb()),
    };
    loop {
        if sh.closing.load(Ordering::Relaxed) {
            return;
        }
        let mut rpc = sh.client.rpc();
        let opened = tokio::select! {
            () = sh.stop_watching.notified() => return,
            r = rpc.watch_recalls(req.clone()) => r,
        };
        match opened {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    let event = tokio::select! {
                        () = sh.stop_watching.notified() => return,
                        m = stream.message() => m,
                    };
                    match event {
                        Ok(Some(e)) if e.recall => recall_all(&sh),
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            // The call is missing, or will not be allowed: renewals and
            // commits still carry recalls.
            Err(s) if PERMANENT.contains(&s.code()) => return,
            Err(_) => {}
        }
        tokio::select! {
            () = sh.stop_watching.notified() => return,
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    }
}

/// Retires every lease (the server recalls them) and wakes the background
/// task to commit and release them.
fn recall_all(sh: &Shared) {
    let mut l = lock(&sh.local);
    let mut any = false;
    for lease in l.leases.iter_mut().filter(|x| !x.retiring) {
        recall(sh, lease);
        any = true;
    }
    drop(l);
    if any {
        sh.wake.notify_waiters();
    }
}

/// Retires a lease the server asked back: no new allocation uses it, and
/// the next round commits what it holds and releases it.
fn recall(sh: &Shared, lease: &mut LocalLease) {
    lease.retiring = true;
    sh.urgent.store(true, Ordering::Relaxed);
}

/// Renews leases due for it; a recalled lease retires.
async fn renew_round(sh: &Shared) {
    let due: Vec<(u64, u64)> = {
        let l = lock(&sh.local);
        let now = Instant::now();
        l.leases
            .iter()
            .filter(|x| now.duration_since(x.renewed) >= x.ttl / 3)
            .map(|x| (x.id, x.engine.fragment_blocks()))
            .collect()
    };
    for (id, fragments) in due {
        let r = sh
            .client
            .rpc()
            .renew(pb::RenewRequest {
                lease_id: id,
                fragment_blocks: fragments,
            })
            .await;
        let mut l = lock(&sh.local);
        match r {
            Ok(r) => {
                let r = r.into_inner();
                if let Some(lease) = l.leases.iter_mut().find(|x| x.id == id) {
                    lease.renewed = Instant::now();
                    lease.ttl = Duration::from_millis(r.ttl_ms.max(1));
                    if r.recall {
                        recall(sh, lease);
                    }
                }
                set_refill(&mut l, r.grantable_blocks);
            }
            Err(s) => {
                let e = ClientError::from(s);
                if lease_gone(&e) {
                    drop_lease(&mut l, sh, id, true);
                }
            }
        }
    }
}

/// Releases retiring leases (every lease when closing) once nothing of
/// theirs waits to be committed.
async fn release_round(sh: &Shared, closing: bool) {
    let ready: Vec<u64> = {
        let l = lock(&sh.local);
        l.leases
            .iter()
            .filter(|x| (x.retiring || closing) && x.inflight.is_none())
            .filter(|x| !l.pending.iter().any(|&(i, _)| i == x.id))
            .map(|x| x.id)
            .collect()
    };
    for id in ready {
        let r = sh
            .client
            .rpc()
            .release(pb::ReleaseRequest { lease_id: id })
            .await;
        let gone = match r {
            Ok(_) => true,
            Err(s) => lease_gone(&ClientError::from(s)),
        };
        if gone {
            lock(&sh.local).leases.retain(|x| x.id != id);
        }
    }
}
