//! Where a call's store work runs: on the runtime thread that decoded the
//! call, or on tokio's blocking pool.
//!
//! Store work blocks: a commit waits for its group's journal write and
//! sync, a grant for the store's state lock. On the blocking pool it costs
//! two thread hand-offs per call (wake a pool thread; wake the runtime
//! thread with the result), each a cross-CPU wake-up of tens of µs on a
//! small VM — more than the work itself on a memory-backed device or a
//! device with a fast sync. So a device's store work runs inline while
//! its recent calls were fast (a moving average below
//! [`Config::inline_store_us`](crate::Config::inline_store_us)), and never
//! on more than all runtime threads but one at once: however long a
//! device stalls, one is always free to read sockets and to serve the
//! other devices, health checks and the lease renewals. A device whose sync takes milliseconds
//! stays on the pool, where concurrent calls join one group commit instead
//! of holding up the runtime. A device starts on the pool until its first
//! call is measured.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tonic::Status;

use crate::ServiceError;

/// The moving average's weight of the newest call: 1 / 2^`SHIFT`.
const SHIFT: u32 = 3;

/// A device's recent store-call time.
#[derive(Debug)]
pub(crate) struct StorePace {
    /// Moving average of the store calls' wall time, ns; `u64::MAX` until
    /// the first call is measured.
    recent_ns: AtomicU64,
    /// Calls whose store work ran inline, for metrics.
    pub(crate) inline: AtomicU64,
    /// Calls whose store work ran on the blocking pool, for metrics.
    pub(crate) pooled: AtomicU64,
}

impl Default for StorePace {
    fn default() -> Self {
        StorePace {
            recent_ns: AtomicU64::new(u64::MAX),
            inline: AtomicU64::new(0),
            pooled: AtomicU64::new(0),
        }
    }
}

impl StorePace {
    /// The moving average, ns (`u64::MAX` before the first call).
    pub(crate) fn recent_ns(&self) -> u64 {
        self.recent_ns.load(Ordering::Relaxed)
    }

    /// Adds one call's wall time. Racing updates may lose one sample,
    /// which an average does not miss.
    fn record(&self, ns: u64) {
        let old = self.recent_ns();
        let new = if old == u64::MAX {
            ns
        } else {
            old - (old >> SHIFT) + (ns >> SHIFT)
        };
        self.recent_ns.store(new, Ordering::Relaxed);
    }
}

/// The runtime threads running store work inline at this moment, server
/// wide.
#[derive(Debug, Default)]
pub(crate) struct InlineSlots {
    busy: AtomicUsize,
}

/// Held while a call's store work runs inline.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InlineSlots {
    /// A slot, if fewer than `workers - 1` calls run inline.
    fn take(&self, workers: usize) -> Option<Slot<'_>> {
        let limit = workers.saturating_sub(1);
        self.busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b < limit).then_some(b + 1)
            })
            .ok()
            .map(|_| Slot(&self.busy))
    }
}

/// Whether a device whose store calls average `recent_ns` is fast enough
/// to run inline under a bound of `inline_us` (0: never).
fn fast(recent_ns: u64, inline_us: u64) -> bool {
    recent_ns < inline_us.saturating_mul(1000)
}

/// The runtime's worker threads (1 for a current-thread runtime, or
/// outside one).
fn workers() -> usize {
    tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers())
}

/// What undoes a piece of store work whose caller is gone.
pub(crate) type Undo<T> = Box<dyn FnOnce(T) + Send>;

/// A result on its way from the blocking pool to its call. Dropped before
/// the call takes it — the call's deadline passed, or its client left,
/// while the work ran — it undoes the work on the blocking pool, since
/// nobody will learn of it.
struct Handoff<T: Send + 'static> {
    value: Option<T>,
    undo: Option<Undo<T>>,
}

impl<T: Send + 'static> Handoff<T> {
    fn take(mut self) -> T {
        self.value.take().expect("a hand-off is taken once")
    }

    /// The result and its undo, if the result was not taken and there is
    /// an undo; leaves nothing behind, so work is undone at most once.
    fn untaken(&mut self) -> Option<(T, Undo<T>)> {
        self.value.take().zip(self.undo.take())
    }

    /// Undoes the work on this thread (a blocking-pool thread).
    fn undo_here(mut self) {
        if let Some((v, undo)) = self.untaken() {
            undo(v);
        }
    }
}

impl<T: Send + 'static> Drop for Handoff<T> {
    fn drop(&mut self) {
        if let Some((v, undo)) = self.untaken() {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => drop(h.spawn_blocking(move || undo(v))),
                Err(_) => undo(v),
            }
        }
    }
}

/// Runs `f` and adds its wall time to `pace`.
fn timed<R>(pace: &StorePace, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    pace.record(t.elapsed().as_nanos() as u64);
    r
}

/// Runs `f` (store work on `dev`) inline or on the blocking pool (see the
/// module docs), and adds its wall time to the device's pace. With `undo`,
/// a result whose call is gone by the time the work finishes is undone
/// (only pooled work can outlive its call: inline work returns within the
/// poll that runs it).
pub(crate) async fn store_work<T: Send + 'static>(
    pace: &Arc<StorePace>,
    slots: &InlineSlots,
    inline_us: u64,
    f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
    undo: Option<Undo<T>>,
) -> Result<T, Status> {
    if fast(pace.recent_ns(), inline_us) {
        if let Some(_slot) = slots.take(workers()) {
            pace.inline.fetch_add(1, Ordering::Relaxed);
            // A panic is a failed call, as on the pool, not a lost task.
            let r = timed(pace, || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            });
            return match r {
                Ok(r) => r.map_err(Status::from),
                Err(_) => Err(Status::internal("request task failed")),
            };
        }
    }
    pace.pooled.fetch_add(1, Ordering::Relaxed);
    let d = Arc::clone(pace);
    let (tx, rx) = tokio::sync::oneshot::channel();
    drop(tokio::task::spawn_blocking(move || {
        let r = timed(&d, f);
        let sent = tx.send(r.map(|value| Handoff {
            value: Some(value),
            undo,
        }));
        // The call is gone; had it gone after the send, dropping the
        // unread hand-off would undo the work.
        if let Err(Ok(h)) = sent {
            h.undo_here();
        }
    }));
    match rx.await {
        Ok(r) => r.map(Handoff::take).map_err(Status::from),
        // The work panicked (the sender went without a result).
        Err(_) => Err(Status::internal("request task failed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_runs_inline_only_once_measured_below_the_bound() {
        let p = StorePace::default();
        assert!(!fast(p.recent_ns(), 50), "unmeasured: the pool");
        p.record(10_000);
        assert_eq!(p.recent_ns(), 10_000);
        assert!(fast(p.recent_ns(), 50));
        assert!(!fast(p.recent_ns(), 0), "0 turns inline work off");
        // A device that turns slow leaves inline work within a few calls.
        let mut calls = 0;
        while fast(p.recent_ns(), 50) {
            p.record(5_000_000);
            calls += 1;
        }
        assert_eq!(calls, 1, "one 5 ms call outweighs 10 µs calls");
        // And comes back once its calls are fast again.
        let mut calls = 0;
        while !fast(p.recent_ns(), 50) {
            p.record(10_000);
            calls += 1;
        }
        assert!((20..60).contains(&calls), "{calls} fast calls to come back");
    }

    fn handoff(v: u32) -> (Handoff<u32>, std::sync::mpsc::Receiver<u32>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let undo: Undo<u32> = Box::new(move |v| tx.send(v).unwrap());
        let h = Handoff {
            value: Some(v),
            undo: Some(undo),
        };
        (h, rx)
    }

    #[tokio::test]
    async fn a_result_left_unread_in_its_channel_is_undone() {
        // The call went after the pool had sent its result.
        let (h, undone) = handoff(7);
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(tx.send(h).is_ok());
        drop(rx);
        let got = undone.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok(7));
        // A result the call took is not.
        let (h, undone) = handoff(8);
        assert_eq!(h.take(), 8);
        assert!(undone
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        // Nor is one undone here undone twice.
        let (h, undone) = handoff(9);
        h.undo_here();
        assert_eq!(undone.try_recv(), Ok(9));
        assert!(undone
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_work_that_panics_fails_its_call_inline_and_on_the_pool() {
        let pace = Arc::new(StorePace::default());
        let slots = InlineSlots::default();
        let boom = || -> Result<(), ServiceError> { panic!("a bug in store work") };
        // Unmeasured: the pool.
        let e = store_work(&pace, &slots, 1000, boom, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
        assert_eq!(pace.pooled.load(Ordering::Relaxed), 1);
        pace.record(1_000);
        let e = store_work(&pace, &slots, 1000, boom, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
        assert_eq!(pace.inline.load(Ordering::Relaxed), 1);
        assert_eq!(slots.busy.load(Ordering::Relaxed), 0, "the slot is back");
        let ok = store_work(&pace, &slots, 1000, || Ok(7), None)
            .await
            .unwrap();
        assert_eq!(ok, 7);
    }

    #[test]
    fn one_runtime_thread_is_always_left_to_the_runtime() {
        let s = InlineSlots::default();
        assert!(s.take(1).is_none(), "a single thread never blocks");
        let a = s.take(3).expect("first of two");
        let b = s.take(3).expect("second of two");
        assert!(s.take(3).is_none(), "the third thread stays free");
        drop(a);
        let c = s.take(3).expect("a released slot is taken again");
        drop((b, c));
        assert_eq!(s.busy.load(Ordering::Relaxed), 0);
    }
}
