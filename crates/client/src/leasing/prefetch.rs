//! Prefetching: the next grant is asked for while the serving lease still
//! has room (below a low-water mark), so that allocations seldom wait for
//! a round trip; the mark grows each time one had to wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::grant;
use super::local::Local;
use super::shared::{lock, Shared};

/// The low-water mark grows up to this many grants.
const LOW_WATER_GRANTS: u64 = 4;

impl Local {
    /// True when an allocation that left `spare` unused blocks in the
    /// serving lease should wake the prefetcher: below the low-water mark,
    /// and not in the pause after a refused prefetch.
    pub(super) fn prefetch_due(&self, spare: u64, now: Instant) -> bool {
        spare < self.low_water && self.prefetch_after.is_none_or(|t| now >= t)
    }

    /// An allocation had to wait for a grant although a lease is held:
    /// the low-water mark doubles, up to [`LOW_WATER_GRANTS`] grants (the
    /// last one, or the smallest useful lease `min_blocks` if larger), so
    /// that the next prefetch starts early enough.
    pub(super) fn waited_for_lease(&mut self, min_blocks: u64) {
        if !self.leases.is_empty() {
            let grant = self.last_grant.max(min_blocks);
            self.low_water = (self.low_water * 2).min(LOW_WATER_GRANTS * grant);
        }
    }

    /// True when the prefetcher, once its turn to lease comes, still has to
    /// ask: the serving leases are below the mark (an allocation may have
    /// taken a lease meanwhile) and requests are not going per call.
    pub(super) fn prefetch_needed(&self, now: Instant) -> bool {
        let spare: u64 = self
            .leases
            .iter()
            .filter(|x| !x.retiring)
            .map(|x| x.unused())
            .sum();
        let per_call = self.per_call_until.is_some_and(|t| now < t);
        spare < self.low_water && !per_call
    }

    /// A prefetch was refused: none before a TTL has passed.
    pub(super) fn prefetch_refused(&mut self, now: Instant) {
        self.prefetch_after = Some(now + self.ttl_seen);
    }
}

/// The prefetch task: takes the next lease while the serving ones still
/// have room, so that allocations seldom wait for a round trip. A refused
/// prefetch is not an error (an allocation that finds no room asks again
/// and falls back to per-call allocation); prefetching pauses for a TTL.
pub(super) async fn prefetcher(sh: Arc<Shared>) {
    loop {
        sh.prefetch.notified().await;
        if sh.closing.load(Ordering::Relaxed) {
            return;
        }
        {
            let _g = sh.leasing.lock().await;
            let needed = lock(&sh.local).prefetch_needed(Instant::now());
            if needed && grant::take_lease(&sh, sh.opts.min_blocks).await.is_err() {
                lock(&sh.local).prefetch_refused(Instant::now());
            }
        }
        sh.prefetching.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::local::tests::{ext, holding, lease};
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_allocation_below_the_mark_asks_for_a_prefetch() {
        let mut l = Local::new(100);
        let now = Instant::now();
        assert!(l.prefetch_due(99, now));
        assert!(!l.prefetch_due(100, now));
        l.low_water = 400;
        assert!(l.prefetch_due(399, now));
    }

    #[test]
    fn a_refused_prefetch_pauses_prefetching_for_a_ttl() {
        let mut l = Local::new(100);
        l.ttl_seen = Duration::from_secs(20);
        let t = Instant::now();
        l.prefetch_refused(t);
        assert!(!l.prefetch_due(0, t));
        assert!(!l.prefetch_due(0, t + Duration::from_secs(19)));
        assert!(l.prefetch_due(0, t + Duration::from_secs(20)));
    }

    #[test]
    fn waiting_for_a_lease_doubles_the_mark_up_to_four_grants() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        l.low_water = 100;
        l.last_grant = 300;
        l.waited_for_lease(100);
        assert_eq!(l.low_water, 200);
        l.waited_for_lease(100);
        assert_eq!(l.low_water, 400);
        for _ in 0..10 {
            l.waited_for_lease(100);
        }
        assert_eq!(l.low_water, 1200, "four grants of 300");
        // The smallest useful lease counts when the last grant was smaller.
        l.last_grant = 10;
        l.low_water = 1000;
        l.waited_for_lease(500);
        assert_eq!(l.low_water, 2000);
    }

    #[test]
    fn the_first_lease_does_not_raise_the_mark() {
        let mut l = Local::new(100);
        l.waited_for_lease(100);
        assert_eq!(l.low_water, 100);
    }

    #[test]
    fn the_prefetcher_counts_only_serving_leases() {
        let mut retiring = lease(1, &[ext(0, 10_000)]);
        retiring.retiring = true;
        let mut l = holding(vec![retiring, lease(2, &[ext(20_000, 50)])]);
        l.low_water = 100;
        let now = Instant::now();
        assert!(l.prefetch_needed(now));
        l.leases.push(lease(3, &[ext(30_000, 50)]));
        assert!(!l.prefetch_needed(now), "100 serving blocks are enough");
    }

    #[test]
    fn the_prefetcher_asks_nothing_while_requests_go_per_call() {
        let mut l = holding(Vec::new());
        l.low_water = 100;
        let now = Instant::now();
        assert!(l.prefetch_needed(now), "no lease at all");
        l.per_call_until = Some(now + Duration::from_secs(5));
        assert!(!l.prefetch_needed(now));
        assert!(l.prefetch_needed(now + Duration::from_secs(5)));
    }
}
