//! Keeping leases alive: each is renewed a third of its TTL after the
//! request that last extended it (a grant, a commit or a renewal) was
//! sent, so that two renewals may fail before it expires. A renewal that
//! fails for a cause a resend may cure (the server restarting, a cut
//! connection) is tried again after a pause (10 ms, doubling up to a
//! second) until the lease's deadline: a restarted server restores its
//! leases, so the lease lives on. Past the deadline such a lease is dropped
//! and its uncommitted allocations are lost.

use std::time::{Duration, Instant};

use blockalloc_proto::pb;

use super::local::Local;
use super::options::lease_gone;
use super::shared::{drop_lease, lock, Shared};
use crate::retry::Backoff;

/// How long the background loop sleeps at most when no lease is held.
const IDLE_RENEW_CHECK: Duration = Duration::from_secs(1);

/// How long the background loop may sleep before a lease needs renewing
/// at `now`: a third of the shortest TTL held, or less when a failed
/// renewal is due again sooner or a lease's deadline comes first (it
/// retires then).
pub(super) fn renew_every(l: &Local, now: Instant) -> Duration {
    l.leases
        .iter()
        .map(|x| {
            let mut d = x.ttl / 3;
            if let Some(t) = x.renew_after {
                d = d.min(t.saturating_duration_since(now));
            }
            if !x.retiring {
                d = d.min(x.deadline.saturating_duration_since(now));
            }
            d
        })
        .min()
        .unwrap_or(IDLE_RENEW_CHECK)
}

impl Local {
    /// The leases due for renewal at `now`, with their fragment blocks
    /// (for the server's sizing).
    pub(super) fn due_for_renewal(&self, now: Instant) -> Vec<(u64, u64)> {
        self.leases
            .iter()
            .filter(|x| now.saturating_duration_since(x.renewed) >= x.ttl / 3)
            .filter(|x| x.renew_after.is_none_or(|t| now >= t))
            .map(|x| (x.id, x.engine.fragment_blocks()))
            .collect()
    }

    /// The server renewed lease `id` in answer to a renewal sent at `sent`:
    /// its TTL (at least a millisecond) counts from then, and a recall
    /// retires it. True when it was recalled.
    pub(super) fn renewed(&mut self, id: u64, r: &pb::RenewResponse, sent: Instant) -> bool {
        let mut recalled = false;
        if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
            lease.extended(sent, Duration::from_millis(r.ttl_ms.max(1)), r.margin_ms);
            lease.renew_after = None;
            lease.renew_backoff = Backoff::default();
            if r.recall {
                lease.retiring = true;
                recalled = true;
            }
        }
        self.set_refill(r.grantable_blocks);
        recalled
    }

    /// A renewal of lease `id` failed at `now` for a cause a resend may
    /// cure: it is tried again after a pause, until the lease's deadline.
    /// True when the deadline has passed (the lease is to be dropped).
    pub(super) fn renewal_failed(&mut self, id: u64, now: Instant) -> bool {
        let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) else {
            return false;
        };
        if now >= lease.deadline {
            return true;
        }
        lease.renew_after = Some(now + lease.renew_backoff.next_pause());
        false
    }
}

/// Renews leases due for it; a recalled lease retires, a lease the server
/// no longer has (or that stayed unreachable past its deadline) is
/// dropped. Leases past their deadline retire first.
pub(super) async fn renew_round(sh: &Shared) {
    let due = {
        let mut l = lock(&sh.local);
        let now = Instant::now();
        if l.retire_expired(now) {
            sh.urge();
        }
        l.due_for_renewal(now)
    };
    for (id, fragments) in due {
        let sent = Instant::now();
        let until = lock(&sh.local).attempt_until(id, sent);
        let call = sh.client.renew_call(
            &sh.opts.device,
            pb::RenewRequest {
                lease_id: id,
                fragment_blocks: fragments,
                epoch: 0,
            },
        );
        let r = super::commit::within(until, call).await;
        let mut l = lock(&sh.local);
        match r {
            Ok(r) => {
                if l.renewed(id, &r, sent) {
                    sh.urge();
                }
            }
            Err(e) if lease_gone(&e) => drop_lease(&mut l, sh, id, true),
            Err(e) if e.retryable() => {
                if l.renewal_failed(id, Instant::now()) {
                    drop_lease(&mut l, sh, id, true);
                }
            }
            // Refused otherwise (a denied tenant, say): the renewal is due
            // again at the next round; the server ends the lease if it must.
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::local::tests::{ext, holding, lease};
    use super::*;

    #[test]
    fn the_loop_wakes_for_the_shortest_lease() {
        let mut a = lease(1, &[ext(0, 10)]);
        a.ttl = Duration::from_secs(30);
        let mut b = lease(2, &[ext(100, 10)]);
        b.ttl = Duration::from_secs(9);
        let now = Instant::now();
        assert_eq!(
            renew_every(&holding(vec![a, b]), now),
            Duration::from_secs(3)
        );
        assert_eq!(renew_every(&holding(Vec::new()), now), IDLE_RENEW_CHECK);
    }

    #[test]
    fn a_lease_is_due_a_third_of_its_ttl_after_it_was_renewed() {
        let mut a = lease(1, &[ext(0, 10)]);
        a.ttl = Duration::from_secs(30);
        let t = a.renewed;
        let mut b = lease(2, &[ext(100, 10)]);
        b.ttl = Duration::from_secs(60);
        b.renewed = t;
        let l = holding(vec![a, b]);
        assert!(l.due_for_renewal(t).is_empty());
        assert!(l
            .due_for_renewal(t + Duration::from_millis(9_999))
            .is_empty());
        let due = l.due_for_renewal(t + Duration::from_secs(10));
        assert_eq!(due.iter().map(|d| d.0).collect::<Vec<_>>(), [1]);
        let due = l.due_for_renewal(t + Duration::from_secs(20));
        assert_eq!(due.iter().map(|d| d.0).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_renewal_restarts_the_ttl_the_server_gives() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)])]);
        let t = l.leases[0].renewed + Duration::from_secs(25);
        let r = pb::RenewResponse {
            ttl_ms: 4_500,
            grantable_blocks: 777,
            ..Default::default()
        };
        assert!(!l.renewed(1, &r, t));
        let x = &l.leases[0];
        assert_eq!((x.renewed, x.ttl), (t, Duration::from_millis(4_500)));
        assert!(!x.retiring);
        assert_eq!(x.engine.refill_blocks(), 777);
        assert!(l
            .due_for_renewal(t + Duration::from_millis(1_499))
            .is_empty());
        assert_eq!(l.due_for_renewal(t + Duration::from_millis(1_500)).len(), 1);
    }

    #[test]
    fn a_renewal_counts_from_when_it_was_sent() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)])]);
        let granted = l.leases[0].renewed;
        let sent = granted + Duration::from_secs(20);
        let r = pb::RenewResponse {
            ttl_ms: 10_000,
            margin_ms: 2_000,
            ..Default::default()
        };
        // The grant's deadline (57 s after it) is later: it stays.
        l.renewed(1, &r, sent);
        assert_eq!(l.leases[0].deadline, granted + Duration::from_secs(57));
        assert_eq!(l.leases[0].renewed, sent);
        let sent = sent + Duration::from_secs(50);
        l.renewed(1, &r, sent);
        assert_eq!(l.leases[0].deadline, sent + Duration::from_secs(8));
    }

    #[test]
    fn a_failed_renewal_is_retried_after_a_pause_until_the_deadline() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)])]);
        let due = l.leases[0].renewed + Duration::from_secs(20);
        assert_eq!(l.due_for_renewal(due).len(), 1);
        assert!(!l.renewal_failed(1, due));
        assert!(l.due_for_renewal(due).is_empty(), "pausing");
        let again = due + Duration::from_millis(10);
        assert_eq!(l.due_for_renewal(again).len(), 1);
        assert!(renew_every(&l, due) <= Duration::from_millis(10));
        assert!(!l.renewal_failed(1, again));
        assert!(l
            .due_for_renewal(again + Duration::from_millis(19))
            .is_empty());
        // Past the deadline: to be dropped.
        let d = l.leases[0].deadline;
        assert!(l.renewal_failed(1, d));
        // Renewed: no pause any more.
        let r = pb::RenewResponse {
            ttl_ms: 60_000,
            ..Default::default()
        };
        l.renewed(1, &r, again);
        assert!(l.leases[0].renew_after.is_none());
    }

    #[test]
    fn a_zero_ttl_is_read_as_a_millisecond_and_a_recall_retires() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)])]);
        let t = Instant::now();
        let r = pb::RenewResponse {
            ttl_ms: 0,
            recall: true,
            ..Default::default()
        };
        assert!(l.renewed(1, &r, t));
        assert_eq!(l.leases[0].ttl, Duration::from_millis(1));
        assert!(l.leases[0].retiring);
        // A lease dropped meanwhile: nothing to renew.
        assert!(!l.renewed(9, &r, t));
    }
}
