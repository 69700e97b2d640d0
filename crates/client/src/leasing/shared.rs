//! What the handle and its tasks share: the local state under one mutex,
//! the flags and notifications between them, and the counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::{watch, Notify};

use super::local::Local;
use super::options::{LeaseOptions, LeaseStats};
use crate::client::Client;
use crate::error::{ClientError, Result};

/// The state of one leasing allocator, shared by its handle and its tasks
/// (the background loop, the prefetcher, the recall watcher).
pub(super) struct Shared {
    pub(super) client: Client,
    pub(super) opts: LeaseOptions,
    pub(super) local: Mutex<Local>,
    /// Serialises lease requests, so that many tasks that find no space at
    /// once take one lease, not one each.
    pub(super) leasing: tokio::sync::Mutex<()>,
    /// Wakes the background task (`notify_waiters` only: the flags below
    /// say why, so no stale permit causes a needless commit).
    pub(super) wake: Notify,
    /// The newest generation a `commit` call waits for.
    pub(super) wanted: AtomicU64,
    /// Leases retired or recalled: commit and release them now.
    pub(super) urgent: AtomicBool,
    /// The newest generation the background task has finished.
    pub(super) done: watch::Sender<u64>,
    pub(super) closing: AtomicBool,
    /// Wakes the prefetch task.
    pub(super) prefetch: Notify,
    /// A prefetch was asked for and has not finished.
    pub(super) prefetching: AtomicBool,
    /// Stops the recall watcher (a permit, so that a stop before it waits
    /// is not lost).
    pub(super) stop_watching: Notify,
    /// The counters of [`LeaseStats`], by the indices below.
    pub(super) stats: [AtomicU64; 7],
}

pub(super) use crate::calls::lock;

pub(super) const LOCAL: usize = 0;
pub(super) const REMOTE: usize = 1;
pub(super) const LEASES: usize = 2;
pub(super) const COMMITS: usize = 3;
pub(super) const LOST: usize = 4;
pub(super) const EXTENSIONS: usize = 5;
pub(super) const ROTATIONS: usize = 6;

impl Shared {
    /// A fresh state for `client` (already carrying the options' token).
    pub(super) fn new(client: Client, opts: LeaseOptions) -> Shared {
        let (done, _) = watch::channel(0);
        Shared {
            client,
            local: Mutex::new(Local::new(opts.min_blocks)),
            opts,
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
        }
    }

    /// Counts `n` more of counter `which`.
    pub(super) fn count(&self, which: usize, n: u64) {
        self.stats[which].fetch_add(n, Ordering::Relaxed);
    }

    /// The counters so far.
    pub(super) fn stats(&self) -> LeaseStats {
        let g = |i: usize| self.stats[i].load(Ordering::Relaxed);
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

    /// Has the background task commit and release retired leases now.
    pub(super) fn urge(&self) {
        self.urgent.store(true, Ordering::Relaxed);
    }

    /// The ids of the leases held now, oldest first.
    pub(super) fn lease_ids(&self) -> Vec<u64> {
        lock(&self.local).leases.iter().map(|x| x.id).collect()
    }

    /// Waits until every allocation and free made before the call is
    /// durable, as `LeasingAllocator::commit` does, and returns the commit
    /// round it waited for (`None` when there was nothing to send or
    /// report), leaving what the round found (losses, refusals) for
    /// `commit` to report.
    pub(super) async fn flush(&self) -> Result<Option<u64>> {
        let my = {
            let l = lock(&self.local);
            if !l.has_work() {
                return Ok(None);
            }
            l.open_gen
        };
        let mut rx = self.done.subscribe();
        self.wanted.fetch_max(my, Ordering::Relaxed);
        self.wake.notify_waiters();
        loop {
            if *rx.borrow_and_update() >= my {
                return Ok(Some(my));
            }
            if rx.changed().await.is_err() {
                return Err(ClientError::Closed);
            }
        }
    }
}

/// Forgets a lease the server no longer has ([`Local::drop_lease`]) and
/// counts its lost allocations.
pub(super) fn drop_lease(l: &mut Local, sh: &Shared, id: u64, resend_frees: bool) {
    let lost = l.drop_lease(id, resend_frees);
    sh.count(LOST, lost);
}
