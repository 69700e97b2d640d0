//! [`LeasingAllocator`]: allocation inside leased regions, at local speed;
//! the type documents the life of an allocation.
//!
//! The handle lives here; the parts it runs on are:
//! * [`options`] — the options and counters, and how the server says a
//!   lease is gone;
//! * [`shared`] — what the handle and its tasks share;
//! * [`local`] — each lease's local engine, the pending allocations and
//!   frees, and what commit rounds found (losses, errors): plain data, no
//!   I/O;
//! * [`grant`] — asking the server for space and adding a grant to the
//!   local engines (a new lease or an extension);
//! * [`prefetch`] — the low-water mark and the task that takes the next
//!   grant before an allocation has to wait for it;
//! * [`commit`] — the background loop, and its commit rounds: batches per
//!   lease with sequence numbers, resent as they were until answered;
//! * [`renew`] — keeping leases alive;
//! * [`recall`] — following the server's recalls, giving leases back and
//!   releasing them, and the per-call fallback when no lease is granted.

mod commit;
mod grant;
mod local;
mod options;
mod prefetch;
mod recall;
mod renew;
mod shared;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use blockalloc::Extent;
use tokio::task::JoinHandle;
use tonic::Code;

use crate::client::Client;
use crate::error::{ClientError, Result};
pub use options::{LeaseOptions, LeaseStats, LEASE_GONE_PHRASE};
use shared::{lock, Shared, LOCAL, REMOTE, ROTATIONS};

/// An allocator that leases regions from the server and allocates inside
/// them locally.
///
/// The allocator leases a region of the device from the server and serves
/// allocations from it with a local
/// [`SegFitAllocator`](blockalloc::SegFitAllocator) built over the leased
/// extents — no round trip. Allocations are recorded as *pending*;
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
/// * a lease that ends before its allocations were committed (the server
///   answers NOT_FOUND, or FAILED_PRECONDITION for an expired lease, or
///   the lease's deadline passed with its commit unanswered) makes them
///   *lost*: the next `commit` reports them as [`ClientError::Lost`], and
///   later allocations take a new lease.
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
/// The writer's rule. Each lease has a local deadline: the instant the
/// request that last extended it (its grant, a renewal, a commit) was
/// *sent*, plus the TTL the reply gave, minus the reply's margin (a
/// twentieth of the TTL when the server gives none). The server frees an
/// expired lease's space only a margin after it expires, so until the
/// deadline the caller may write its data into an uncommitted allocation,
/// whatever the network or the scheduler did meanwhile. After it, it must
/// not: commit first (a commit that succeeds makes the space the caller's
/// for good), or drop the allocation. [`deadline`](Self::deadline) (or
/// [`allocate_with_deadline`](Self::allocate_with_deadline)) tells the
/// deadline of an allocation; past it the lease hands out nothing more and
/// retires (what it holds is committed, the rest released).
///
/// Across cuts and restarts: a `Commit` or `Renew` that fails because the
/// server cannot be reached, is restarting, cut the call off or answered
/// from a stale owner (an older epoch of the device than one seen) is sent
/// again (the same sequence: the server applies a commit once), after 10
/// ms, doubling up to a second, until the lease's deadline. A restarted
/// server restores its leases, so nothing is lost when it is back in time;
/// [`commit`](Self::commit) waits meanwhile. Only the server saying the
/// lease is gone, or the deadline passing unanswered, loses a lease's
/// uncommitted allocations.
///
/// ```no_run
/// # async fn demo(alloc: &blockalloc_client::LeasingAllocator) -> Result<(), blockalloc_client::ClientError> {
/// use std::time::Instant;
///
/// # fn write_object(_: blockalloc_client::Extent) {}
/// let (e, deadline) = alloc.allocate_with_deadline(256).await?;
/// match deadline {
///     // Leased and uncommitted: write before the deadline...
///     Some(t) if Instant::now() < t => write_object(e),
///     // ...or commit first; then the space is the caller's for good.
///     Some(_) => {
///         alloc.commit().await?;
///         write_object(e);
///     }
///     // Allocated per call: durable already.
///     None => write_object(e),
/// }
/// alloc.commit().await?; // the object's space is durable now
/// # Ok(()) }
/// ```
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

impl LeasingAllocator {
    /// A leasing allocator over `client`. Starts a background task on the
    /// current tokio runtime (so call it inside one). Cannot fail: a token
    /// that a header cannot carry is refused when it is made
    /// ([`BearerToken::new`](crate::BearerToken::new)).
    pub fn new(client: Client, opts: LeaseOptions) -> LeasingAllocator {
        let client = match &opts.token {
            Some(t) => client.with_bearer(t.clone()),
            None => client,
        };
        let shared = Arc::new(Shared::new(client, opts));
        let task = tokio::spawn(commit::background(Arc::clone(&shared)));
        tokio::spawn(prefetch::prefetcher(Arc::clone(&shared)));
        tokio::spawn(recall::recall_watcher(Arc::clone(&shared)));
        LeasingAllocator {
            shared,
            task: Some(task),
        }
    }

    /// The same as [`LeasingAllocator::new`], which cannot fail.
    ///
    /// # Errors
    /// None: `opts.token` was checked by [`BearerToken::new`](crate::BearerToken::new).
    #[deprecated(note = "use LeasingAllocator::new, which cannot fail")]
    pub fn with_token(client: Client, opts: LeaseOptions) -> Result<LeasingAllocator> {
        Ok(LeasingAllocator::new(client, opts))
    }

    /// Counters so far.
    pub fn stats(&self) -> LeaseStats {
        self.shared.stats()
    }

    /// The ids of the leases held now, oldest first.
    pub fn lease_ids(&self) -> Vec<u64> {
        self.shared.lease_ids()
    }

    /// Allocates `blocks` contiguous blocks from the serving lease, without
    /// a round trip, or `None` when it has no room or is past its deadline
    /// (never waits).
    pub fn try_allocate_local(&self, blocks: u64) -> Option<Extent> {
        let mut l = lock(&self.shared.local);
        let (e, spare, deadline) = l.allocate(blocks)?;
        self.shared.count(LOCAL, 1);
        // Read under the lock, before the allocation is handed out, so
        // that none leaves a lease past its deadline however long the lock
        // took; and last, where it costs least (read before the search, it
        // cost the fast path a fifth more).
        let now = Instant::now();
        if now >= deadline {
            l.take_back(e);
            self.shared.stats[LOCAL].fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if l.prefetch_due(spare, now) && !self.shared.prefetching.swap(true, Ordering::Relaxed) {
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
            // This allocation waits for a lease although it holds one:
            // fetch earlier next time.
            lock(&self.shared.local).waited_for_lease(self.shared.opts.min_blocks);
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
                grant::take_lease(&self.shared, blocks).await
            };
            match leased {
                Ok(()) => continue,
                // A quota refusal too: a per-call allocation smaller than a
                // grant may still fit under the quota.
                Err(ClientError::NoSpace { .. } | ClientError::Quota { .. }) => {
                    // No more space to add: the leases' own fragments serve.
                    {
                        let mut l = lock(&self.shared.local);
                        l.set_refill(0);
                        if !fragmented {
                            // A refused grant: the next ones would be
                            // refused too (a recall lasts a TTL) and cost a
                            // round trip each before every per-call
                            // allocation.
                            let pause = l.ttl_seen / REFUSED_PAUSE;
                            l.per_call_until = Some(Instant::now() + pause);
                        }
                    }
                    let e = recall::allocate_per_call(&self.shared, blocks).await?;
                    self.shared.count(REMOTE, 1);
                    return Ok(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Allocates as [`allocate`](Self::allocate) does, with the
    /// allocation's [`deadline`](Self::deadline): `Some(t)` for a leased
    /// allocation, to be written before `t` or committed first; `None` for
    /// one made per call, durable already.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate).
    pub async fn allocate_with_deadline(&self, blocks: u64) -> Result<(Extent, Option<Instant>)> {
        let e = self.allocate(blocks).await?;
        Ok((e, self.deadline(e)))
    }

    /// Until when the caller may write into `e` without committing it (see
    /// "The writer's rule" on the type): `Some(t)` while `e` is an
    /// uncommitted allocation of a lease, `t` being the lease's deadline
    /// now (it moves on as the lease is renewed); an instant already past
    /// for an allocation lost and not yet reported by
    /// [`commit`](Self::commit); `None` once `e` is committed (and for
    /// anything this allocator does not hold uncommitted: a per-call
    /// allocation, a freed one, a loss already reported).
    pub fn deadline(&self, e: Extent) -> Option<Instant> {
        lock(&self.shared.local).deadline_of(e)
    }

    /// Retires the serving lease when its unused blocks have become
    /// slivers (`Local::retire_fragmented`), and wakes the background
    /// task to commit and release it.
    fn rotate_if_fragmented(&self, blocks: u64) {
        let rotated =
            lock(&self.shared.local).retire_fragmented(blocks, self.shared.opts.min_blocks);
        if rotated {
            self.shared.count(ROTATIONS, 1);
            self.shared.urge();
            self.shared.wake.notify_waiters();
        }
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
        lock(&self.shared.local).free(e);
        Ok(())
    }

    /// Waits until every allocation and free made before the call is
    /// durable.
    ///
    /// # Errors
    /// [`ClientError::Lost`] with the allocations (of this caller or any
    /// other) that were lost since the last report; each loss is reported
    /// once. A commit that fails for a cause a resend may cure (the
    /// server unreachable or restarting, the call cut off after it was
    /// sent) is resent with its sequence number, which the server applies
    /// once, until the lease's deadline: `commit` waits meanwhile, and
    /// past the deadline the allocations are lost. A per-call free (no
    /// lease held) that stays unavailable past the client's
    /// [`retry_for`](crate::Client::with_retry_for) is
    /// [`ClientError::Unavailable`] or [`ClientError::OutcomeUnknown`].
    /// Other refusals as the server sent them; when the server
    /// refused a batch that held frees (a double free, a free of a lost
    /// allocation), the frees are dropped with that error and the batch's
    /// allocations are resent at once without them, so a later `commit`
    /// returns once they are durable. A refusal in a periodic round (one
    /// no `commit` waited for) is reported by the next `commit`, once.
    pub async fn commit(&self) -> Result<()> {
        let Some(my) = self.shared.flush().await? else {
            return Ok(());
        };
        let mut l = lock(&self.shared.local);
        if !l.lost.is_empty() {
            let extents = std::mem::take(&mut l.lost);
            return Err(ClientError::Lost { extents });
        }
        if let Some(e) = l.unavailable_since(my) {
            return Err(e);
        }
        // A refusal is reported once, to this commit or, when it came in a
        // round no commit waited for, to the next one.
        if let Some(e) = l.refused.take() {
            return Err(e);
        }
        Ok(())
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

/// After a refused grant, requests no lease serves go per call for this
/// fraction of a TTL before a lease is asked for again.
const REFUSED_PAUSE: u32 = 4;
