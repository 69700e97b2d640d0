//! Keeping leases alive: each is renewed a third of its TTL after the
//! server last heard of it (a grant, a commit or a renewal), so that two
//! renewals may fail before it expires.

use std::time::{Duration, Instant};

use blockalloc_proto::pb;

use super::local::Local;
use super::options::lease_gone;
use super::shared::{drop_lease, lock, Shared};
use crate::error::ClientError;

/// How long the background loop sleeps at most when no lease is held.
const IDLE_RENEW_CHECK: Duration = Duration::from_secs(1);

/// How long the background loop may sleep before a lease needs renewing:
/// a third of the shortest TTL held.
pub(super) fn renew_every(l: &Local) -> Duration {
    l.leases
        .iter()
        .map(|x| x.ttl / 3)
        .min()
        .unwrap_or(IDLE_RENEW_CHECK)
}

impl Local {
    /// The leases due for renewal at `now`, with their fragment blocks
    /// (for the server's sizing).
    pub(super) fn due_for_renewal(&self, now: Instant) -> Vec<(u64, u64)> {
        self.leases
            .iter()
            .filter(|x| now.duration_since(x.renewed) >= x.ttl / 3)
            .map(|x| (x.id, x.engine.fragment_blocks()))
            .collect()
    }

    /// The server renewed lease `id`: its TTL starts again (at least a
    /// millisecond), and a recall retires it. True when it was recalled.
    pub(super) fn renewed(&mut self, id: u64, r: &pb::RenewResponse, now: Instant) -> bool {
        let mut recalled = false;
        if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
            lease.renewed = now;
            lease.ttl = Duration::from_millis(r.ttl_ms.max(1));
            if r.recall {
                lease.retiring = true;
                recalled = true;
            }
        }
        self.set_refill(r.grantable_blocks);
        recalled
    }
}

/// Renews leases due for it; a recalled lease retires, a lease the server
/// no longer has is dropped.
pub(super) async fn renew_round(sh: &Shared) {
    let due = lock(&sh.local).due_for_renewal(Instant::now());
    for (id, fragments) in due {
        let r = sh
            .client
            .rpc()
            .renew(pb::RenewRequest {
                lease_id: id,
                fragment_blocks: fragments,
                epoch: 0,
            })
            .await;
        let mut l = lock(&sh.local);
        match r {
            Ok(r) => {
                if l.renewed(id, &r.into_inner(), Instant::now()) {
                    sh.urge();
                }
            }
            Err(s) => {
                if lease_gone(&ClientError::from(s)) {
                    drop_lease(&mut l, sh, id, true);
                }
            }
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
        assert_eq!(renew_every(&holding(vec![a, b])), Duration::from_secs(3));
        assert_eq!(renew_every(&holding(Vec::new())), IDLE_RENEW_CHECK);
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
