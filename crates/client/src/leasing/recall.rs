//! Giving leases back: following the device's recalls, retiring leases
//! (recalled, given back, or on close), releasing them once their
//! allocations are committed, and the per-call fallback that gives this
//! client's leases back and waits for other clients' when no lease is
//! granted.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_proto::pb;
use tonic::Code;

use super::local::Local;
use super::options::lease_gone;
use super::shared::{lock, Shared};
use crate::error::{ClientError, Result};

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

impl Local {
    /// Retires every serving lease (the server recalls them): no new
    /// allocation uses them, and the next round commits what they hold and
    /// releases them. True when one was serving.
    pub(super) fn recall_all(&mut self) -> bool {
        let mut any = false;
        for lease in self.leases.iter_mut().filter(|x| !x.retiring) {
            lease.retiring = true;
            any = true;
        }
        any
    }

    /// Retires every lease (to give them back); their ids.
    pub(super) fn retire_all(&mut self) -> Vec<u64> {
        for x in &mut self.leases {
            x.retiring = true;
        }
        self.leases.iter().map(|x| x.id).collect()
    }

    /// The leases to release now: retiring ones (every one when
    /// `closing`) with nothing waiting to be committed.
    pub(super) fn releasable(&self, closing: bool) -> Vec<u64> {
        self.leases
            .iter()
            .filter(|x| (x.retiring || closing) && x.inflight.is_none())
            .filter(|x| !self.pending.iter().any(|&(i, _)| i == x.id))
            .map(|x| x.id)
            .collect()
    }
}

/// The recall watcher: follows the device's `WatchRecalls` stream and
/// hands every lease back as soon as a recall starts, instead of at the
/// next renewal (a third of a TTL) or commit. A lost stream is opened
/// again after a pause; a server without the call, or one that refuses it
/// for good (permission, authentication, unknown device), leaves recalls
/// to the renewals.
pub(super) async fn recall_watcher(sh: Arc<Shared>) {
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
    let any = lock(&sh.local).recall_all();
    if any {
        sh.urge();
        sh.wake.notify_waiters();
    }
}

/// Releases retiring leases (every lease when closing) once nothing of
/// theirs waits to be committed. One the server cannot be asked about past
/// its deadline is forgotten: nothing of it is uncommitted, and the server
/// ends it when it expires.
pub(super) async fn release_round(sh: &Shared, closing: bool) {
    let ready = lock(&sh.local).releasable(closing);
    for id in ready {
        let until = lock(&sh.local).attempt_until(id, Instant::now());
        let call = sh.client.release_call(
            &sh.opts.device,
            pb::ReleaseRequest {
                lease_id: id,
                epoch: 0,
            },
        );
        let r = super::commit::within(until, call).await;
        let mut l = lock(&sh.local);
        let gone = match r {
            Ok(_) => true,
            Err(e) if e.retryable() => {
                let now = Instant::now();
                l.leases.iter().any(|x| x.id == id && now >= x.deadline)
            }
            Err(e) => lease_gone(&e),
        };
        if gone {
            l.leases.retain(|x| x.id != id);
        }
    }
}

/// A per-call allocation, for when no lease is granted. When even that
/// finds no room, leases may still hold it: this client's own are given
/// back, and those of other clients are being recalled (the refused
/// grant started a recall on the server), so it waits until they are
/// back and tries once more. Only then is "no space" the answer.
pub(super) async fn allocate_per_call(sh: &Shared, blocks: u64) -> Result<Extent> {
    let dev = &sh.opts.device;
    match sh.client.allocate(dev, 1, blocks, None).await {
        Err(ClientError::NoSpace { .. }) => {}
        // This client's unused leased space counts against its tenant's
        // quota: given back, it may make room. A quota refusal starts no
        // recall, so there is nothing else to wait for.
        Err(ClientError::Quota { .. }) if !sh.lease_ids().is_empty() => {
            give_back(sh).await?;
            return Ok(sh.client.allocate(dev, 1, blocks, None).await?[0]);
        }
        r => return r.map(|v| v[0]),
    }
    if !sh.lease_ids().is_empty() {
        give_back(sh).await?;
    }
    wait_for_recalled_leases(sh).await?;
    Ok(sh.client.allocate(dev, 1, blocks, None).await?[0])
}

/// Waits until no lease on the device holds unused blocks, at most one
/// TTL and the expiry margin: a holder hands its lease back at its next
/// commit or renewal, and one that does not has expired by then.
async fn wait_for_recalled_leases(sh: &Shared) -> Result<()> {
    let ttl = lock(&sh.local).ttl_seen;
    let deadline = Instant::now() + ttl + RECALL_MARGIN;
    loop {
        let st = sh.client.status().await?;
        let held = st
            .iter()
            .find(|d| sh.opts.device.names(d))
            .map_or(0, |d| d.leased_unused_blocks);
        if held == 0 || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(RECALL_POLL).await;
    }
}

/// Commits everything and releases every lease held now; waits (at most
/// a second) for the releases.
async fn give_back(sh: &Shared) -> Result<()> {
    let ids = lock(&sh.local).retire_all();
    // Losses and refusals the round finds concern earlier allocations
    // and frees, not the allocation that is giving back: they stay for
    // the next `commit` to report.
    if let Some(my) = sh.flush().await? {
        if let Some(e) = lock(&sh.local).unavailable_since(my) {
            return Err(e);
        }
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) && sh.lease_ids().iter().any(|id| ids.contains(id)) {
        sh.urge();
        sh.wake.notify_waiters();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::local::tests::{ext, holding, lease};
    use super::super::local::Inflight;

    #[test]
    fn a_recall_retires_the_serving_leases_once() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)]), lease(2, &[ext(100, 10)])]);
        l.leases[0].retiring = true;
        assert!(l.recall_all());
        assert!(l.leases.iter().all(|x| x.retiring));
        assert_eq!(l.allocate_now(1), None, "nothing serves");
        assert!(!l.recall_all(), "nothing was serving");
        assert!(!holding(Vec::new()).recall_all());
    }

    #[test]
    fn giving_back_retires_every_lease() {
        let mut l = holding(vec![lease(4, &[ext(0, 10)]), lease(9, &[ext(100, 10)])]);
        assert_eq!(l.retire_all(), [4, 9]);
        assert!(l.leases.iter().all(|x| x.retiring));
    }

    #[test]
    fn a_retired_lease_is_released_once_its_allocations_are_committed() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)]), lease(2, &[ext(200, 100)])]);
        let (a, _) = l.allocate_now(5).unwrap();
        l.recall_all();
        assert!(l.releasable(false).contains(&2));
        assert!(
            !l.releasable(false).contains(&1),
            "an allocation is pending"
        );

        l.pending.clear();
        l.leases[0].inflight = Some(Inflight {
            seq: 1,
            allocs: vec![a],
            frees: Vec::new(),
        });
        assert_eq!(l.releasable(false), [2], "a commit is unanswered");
        l.leases[0].inflight = None;
        assert_eq!(l.releasable(false), [1, 2]);
    }

    #[test]
    fn serving_leases_are_released_only_when_closing() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        assert!(l.releasable(false).is_empty());
        assert_eq!(l.releasable(true), [1]);
        l.allocate_now(1).unwrap();
        assert!(l.releasable(true).is_empty(), "committed first");
    }
}
