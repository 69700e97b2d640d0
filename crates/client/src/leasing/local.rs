//! The local side of the leases: each lease's own [`SegFitAllocator`] over
//! its extents, the allocations and frees not committed yet, and what the
//! commit rounds found (losses, errors). Plain data under the allocator's
//! one mutex; no I/O, so every rule here is tested without a server.

use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent, SegFitAllocator};

use crate::error::ClientError;
use crate::retry::Backoff;

/// A commit sent but not yet acknowledged: resent as is (same sequence,
/// same contents) until the server answers, which makes it idempotent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Inflight {
    pub(super) seq: u64,
    pub(super) allocs: Vec<Extent>,
    pub(super) frees: Vec<Extent>,
}

pub(super) struct LocalLease {
    pub(super) id: u64,
    /// Spans the whole device; everything outside the lease counts as
    /// allocated.
    pub(super) engine: SegFitAllocator,
    /// The sequence of the last acknowledged commit.
    pub(super) last_seq: u64,
    pub(super) inflight: Option<Inflight>,
    /// Recalled (or given back): not used for new allocations; released
    /// once everything is committed.
    pub(super) retiring: bool,
    /// Where the next extension should start: the end of the last grant,
    /// so that it continues the lease's newest run.
    pub(super) grow_at: u64,
    pub(super) ttl: Duration,
    /// When the request that last extended the lease (its grant, a
    /// renewal, a commit) was sent: renewals are due a third of a TTL
    /// later.
    pub(super) renewed: Instant,
    /// The writer's deadline: the send time of the request that last
    /// extended the lease, plus its TTL, minus the margin. Past it the lease
    /// hands out nothing more, and its uncommitted allocations must not be
    /// written.
    pub(super) deadline: Instant,
    /// The unacknowledged batch was cut off once (outcome unknown): the
    /// server may still be applying it, so a refusal of a resend is not
    /// final.
    pub(super) unsure: bool,
    /// After a failed renewal: not before then again, and the pause after.
    pub(super) renew_after: Option<Instant>,
    pub(super) renew_backoff: Backoff,
}

/// The writer's deadline of a lease extended by a request sent at `sent`
/// whose reply gave `ttl` and `margin_ms` (0: none given, a twentieth of
/// the TTL is kept).
pub(super) fn deadline(sent: Instant, ttl: Duration, margin_ms: u64) -> Instant {
    let margin = match margin_ms {
        0 => ttl / 20,
        ms => Duration::from_millis(ms),
    };
    sent + ttl.saturating_sub(margin)
}

impl LocalLease {
    /// A lease just granted by a request sent at `sent`: nothing
    /// committed, serving.
    pub(super) fn new(
        id: u64,
        engine: SegFitAllocator,
        grow_at: u64,
        ttl: Duration,
        margin_ms: u64,
        sent: Instant,
    ) -> Self {
        LocalLease {
            id,
            engine,
            last_seq: 0,
            inflight: None,
            retiring: false,
            grow_at,
            ttl,
            renewed: sent,
            deadline: deadline(sent, ttl, margin_ms),
            unsure: false,
            renew_after: None,
            renew_backoff: Backoff::default(),
        }
    }

    /// The server extended the lease for `ttl` (and `margin_ms`) in answer
    /// to a request sent at `sent`. Neither the renewal time nor the
    /// deadline goes back: replies may arrive out of order.
    pub(super) fn extended(&mut self, sent: Instant, ttl: Duration, margin_ms: u64) {
        self.ttl = ttl;
        self.renewed = self.renewed.max(sent);
        self.deadline = self.deadline.max(deadline(sent, ttl, margin_ms));
    }

    /// Blocks of the lease not allocated yet.
    pub(super) fn unused(&self) -> u64 {
        self.engine.capacity() - self.engine.used()
    }
}

#[derive(Default)]
pub(super) struct Local {
    pub(super) leases: Vec<LocalLease>,
    /// Uncommitted allocations and their lease, oldest first.
    pub(super) pending: Vec<(u64, Extent)>,
    /// Frees of committed allocations, not yet sent.
    pub(super) frees: Vec<Extent>,
    /// Frees of allocations whose commit is in flight, by lease: queued
    /// once it is acknowledged, forgotten if the lease is lost (a free of
    /// an allocation never committed would be refused, or free blocks
    /// someone else was given since).
    pub(super) after_commit: Vec<(u64, Extent)>,
    /// Batches cut off and unanswered when their lease's deadline passed
    /// (their allocations were reported lost), by lease, and since when:
    /// resent until the server says whether they ran ([`Local::settled`]).
    pub(super) in_doubt: Vec<(u64, Inflight, Instant)>,
    /// Generation of the batch being gathered.
    pub(super) open_gen: u64,
    pub(super) lost: Vec<Extent>,
    /// The newest generation whose commit failed as unavailable or was cut
    /// off (outcome unknown), and the error.
    pub(super) unavailable: Option<(u64, ClientError)>,
    /// Another error of a commit, not reported yet (the newest).
    pub(super) refused: Option<ClientError>,
    /// Until then, requests no lease can serve go per call: the last grant
    /// was only a few objects' worth, so the long free runs are gone, and
    /// more small leases would only strand their tails; or the last grant
    /// was refused.
    pub(super) per_call_until: Option<Instant>,
    /// When the first allocation in `lost` was lost: the deadline
    /// [`Local::deadline_of`] gives them.
    pub(super) lost_at: Option<Instant>,
    /// The lease TTL the server last granted: how long an unanswered
    /// recall can take.
    pub(super) ttl_seen: Duration,
    /// Blocks of the last grant.
    pub(super) last_grant: u64,
    /// Free blocks of the serving leases below which the next lease is
    /// fetched in the background: doubled (up to a few grants) each time
    /// an allocation had to wait for a lease, so that it covers what this
    /// client allocates while a lease request is on its way.
    pub(super) low_water: u64,
    /// No prefetch before then: the last one was refused.
    pub(super) prefetch_after: Option<Instant>,
}

/// The server's default lease TTL: how long an unanswered recall is
/// waited for before this client has seen a grant.
const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// A serving lease with this many requests' worth of unused blocks that
/// cannot serve the request is slivers: it is retired, not grown.
const ROTATE_OBJECTS: u64 = 8;

impl Local {
    /// No lease yet; the first batch is generation 1, and the low-water
    /// mark starts at the smallest useful lease.
    pub(super) fn new(min_blocks: u64) -> Local {
        Local {
            open_gen: 1,
            ttl_seen: DEFAULT_TTL,
            low_water: min_blocks,
            ..Local::default()
        }
    }

    /// Allocates `blocks` from the serving lease and records the
    /// allocation as pending; with the serving lease's unused blocks left
    /// and its deadline, which the caller checks before it hands the
    /// allocation out ([`Local::take_back`] if past). `None` when no lease
    /// serves or it has no room.
    pub(super) fn allocate(&mut self, blocks: u64) -> Option<(Extent, u64, Instant)> {
        // At most one lease serves; a retiring one only waits for its
        // commit and release.
        let lease = self.leases.iter_mut().find(|x| !x.retiring)?;
        let e = lease.engine.allocate(blocks, None).ok()?;
        let (id, spare) = (lease.id, lease.unused());
        self.pending.push((id, e));
        Some((e, spare, lease.deadline))
    }

    /// Takes back `e`, the allocation [`Local::allocate`] just made, found
    /// past its lease's deadline: the lease retires, and hands out nothing
    /// more.
    pub(super) fn take_back(&mut self, e: Extent) {
        if let Some(i) = self.pending.iter().rposition(|&(_, p)| p == e) {
            let (id, _) = self.pending.remove(i);
            if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
                lease
                    .engine
                    .free(e)
                    .expect("a pending allocation is allocated in its lease");
                lease.retiring = true;
            }
        }
    }

    /// Frees `e`: an uncommitted allocation goes straight back to its
    /// lease (nothing to tell the server); one whose commit is in flight
    /// waits for its outcome; any other is queued for the next commit.
    pub(super) fn free(&mut self, e: Extent) {
        if let Some(i) = self.pending.iter().position(|&(_, p)| p == e) {
            let (id, _) = self.pending.swap_remove(i);
            if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
                lease
                    .engine
                    .free(e)
                    .expect("a pending allocation is allocated in its lease");
            }
            return;
        }
        let sent = self
            .leases
            .iter()
            .find(|x| x.inflight.as_ref().is_some_and(|i| i.allocs.contains(&e)));
        if let Some(x) = sent {
            self.after_commit.push((x.id, e));
            return;
        }
        self.frees.push(e);
    }

    /// Lease `id`'s commit in flight was acknowledged: the frees waiting
    /// for it are queued.
    pub(super) fn commit_acknowledged(&mut self, id: u64) {
        let frees = &mut self.frees;
        self.after_commit.retain(|&(l, e)| {
            if l == id {
                frees.push(e);
                false
            } else {
                true
            }
        });
    }

    /// Until when the caller may write into `e` uncommitted: its lease's
    /// deadline while it is pending or being committed; an instant already
    /// past for an allocation lost and not yet reported; `None` for
    /// anything else (committed, freed, a loss already reported, or not
    /// this allocator's).
    pub(super) fn deadline_of(&self, e: Extent) -> Option<Instant> {
        let lease_deadline = |id: u64| self.leases.iter().find(|x| x.id == id).map(|x| x.deadline);
        let gone = || Some(self.lost_at.unwrap_or_else(Instant::now));
        if let Some(&(id, _)) = self.pending.iter().find(|&&(_, p)| p == e) {
            // A lease dropped meanwhile: the allocation is lost.
            return lease_deadline(id).or_else(gone);
        }
        let sent = self
            .leases
            .iter()
            .find(|x| x.inflight.as_ref().is_some_and(|i| i.allocs.contains(&e)));
        if let Some(x) = sent {
            return Some(x.deadline);
        }
        if self.lost.contains(&e) {
            return gone();
        }
        None
    }

    /// Retires every lease past its deadline at `now`; true when one was
    /// serving.
    pub(super) fn retire_expired(&mut self, now: Instant) -> bool {
        let mut any = false;
        for x in self.leases.iter_mut().filter(|x| !x.retiring) {
            if now >= x.deadline {
                x.retiring = true;
                any = true;
            }
        }
        any
    }

    /// True when a commit has something to send or to report: pending
    /// allocations or frees, an unacknowledged batch, a loss or refusal.
    pub(super) fn has_work(&self) -> bool {
        !(self.pending.is_empty()
            && self.frees.is_empty()
            && self.lost.is_empty()
            && self.refused.is_none()
            && self.in_doubt.is_empty()
            && self.leases.iter().all(|x| x.inflight.is_none()))
    }

    /// The server answered in-doubt batch `inf` of lease `id`: it ran
    /// (`ran`), so its allocations, reported lost, are committed and freed
    /// now; or it did not, so its frees go again.
    pub(super) fn settled(&mut self, id: u64, inf: &Inflight, ran: bool) {
        self.in_doubt
            .retain(|(l, b, _)| !(*l == id && b.seq == inf.seq));
        if ran {
            self.frees.extend(&inf.allocs);
        } else {
            self.frees.extend(&inf.frees);
        }
    }

    /// Tells the leases' engines how much the server could add to them (its
    /// `grantable_blocks`; see `SegFitAllocator::set_refill_blocks`): while
    /// that is plenty, a request the policy would cut from a long run, when
    /// the lease holds none, waits for an extension instead of cutting a
    /// sliver from fragments that other requests fit exactly.
    pub(super) fn set_refill(&mut self, grantable: u64) {
        for lease in &mut self.leases {
            lease.engine.set_refill_blocks(grantable);
        }
    }

    /// Retires the serving lease when it holds many requests' worth of
    /// unused blocks yet none of its runs fits `blocks`, and the server has
    /// no long runs to add (the engine's refill is below its minimum): its
    /// space has become slivers (cut tails, recycled frees). Growing it
    /// would hoard them; retired, the lease is committed and released, so
    /// the slivers return to the server, where per-call allocation and
    /// other leases can use them, and the next grant starts a fresh lease.
    /// True when a lease was retired.
    pub(super) fn retire_fragmented(&mut self, blocks: u64, min_blocks: u64) -> bool {
        let request = blocks.max(min_blocks);
        let mut rotated = false;
        for lease in self.leases.iter_mut().filter(|x| !x.retiring) {
            // A lease with a run that fits has room: its engine only
            // declined to cut a fragment. And while the server can add runs
            // (the refill), its fragments are kept for their exact
            // requests: handed back, they would wait in the store for the
            // per-call end (a client whose extension came late under load
            // rotated twice and stopped at 99.855 % instead of 99.995 %).
            if lease.unused() >= ROTATE_OBJECTS.saturating_mul(request)
                && lease.engine.largest_free() < blocks
                && lease.engine.refill_blocks() < SegFitAllocator::MIN_REFILL
            {
                lease.retiring = true;
                rotated = true;
            }
        }
        rotated
    }

    /// Forgets a lease the server no longer has: its unacknowledged and
    /// pending allocations are lost (reported by the next `commit`); the
    /// frees of its unacknowledged batch go back to the queue when
    /// `resend_frees` (they were never applied) and the batch was never cut
    /// off (it may have been). Returns how many
    /// allocations were lost.
    pub(super) fn drop_lease(&mut self, id: u64, resend_frees: bool) -> u64 {
        let mut lost = Vec::new();
        if let Some(i) = self.leases.iter().position(|x| x.id == id) {
            let lease = self.leases.remove(i);
            if let Some(inf) = lease.inflight {
                lost.extend(inf.allocs.iter().copied());
                // A batch cut off once may have been applied: its frees
                // sent again could free blocks allocated since. It stays
                // in doubt until the server tells.
                if lease.unsure {
                    self.in_doubt.push((id, inf, Instant::now()));
                } else if resend_frees {
                    self.frees.extend(inf.frees);
                }
            }
        }
        self.pending.retain(|&(i, e)| {
            if i == id {
                lost.push(e);
                false
            } else {
                true
            }
        });
        // What the caller freed meanwhile it no longer wants: neither lost
        // nor to free.
        let mut freed = Vec::new();
        self.after_commit.retain(|&(l, e)| {
            if l == id {
                freed.push(e);
                false
            } else {
                true
            }
        });
        lost.retain(|e| !freed.contains(e));
        let n = lost.len() as u64;
        self.note_lost(lost);
        n
    }

    /// Adds `lost` to the losses to report.
    pub(super) fn note_lost(&mut self, lost: Vec<Extent>) {
        if lost.is_empty() {
            return;
        }
        if self.lost.is_empty() {
            self.lost_at = Some(Instant::now());
        }
        self.lost.extend(lost);
    }

    /// The unavailable (or outcome unknown) error of commit round `gen` or
    /// a later one, if one failed so.
    pub(super) fn unavailable_since(&self, gen: u64) -> Option<ClientError> {
        match &self.unavailable {
            Some((g, e)) if *g >= gen => Some(e.clone()),
            _ => None,
        }
    }

    /// Keeps the error of round `gen` for the `commit` calls to report:
    /// an unavailable or cut-off one for every caller waiting for this
    /// round or an earlier one, another one (the newest) once.
    pub(super) fn note_error(&mut self, gen: u64, e: ClientError) {
        match e {
            e @ (ClientError::Unavailable(_) | ClientError::OutcomeUnknown(_)) => {
                self.unavailable = Some((gen, e))
            }
            other => self.refused = Some(other),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use blockalloc::FromFreeExtents;

    /// Blocks of the device the test leases are cut from.
    pub(in crate::leasing) const DEVICE: u64 = 1 << 20;

    pub(in crate::leasing) fn ext(start: u64, len: u64) -> Extent {
        Extent::new(start, len).unwrap()
    }

    /// A serving lease `id` holding exactly `free` of a [`DEVICE`].
    pub(in crate::leasing) fn lease(id: u64, free: &[Extent]) -> LocalLease {
        let engine = SegFitAllocator::from_free_extents(DEVICE, free).unwrap();
        let grow_at = free.last().map_or(0, |e| e.end());
        LocalLease::new(
            id,
            engine,
            grow_at,
            Duration::from_secs(60),
            0,
            Instant::now(),
        )
    }

    impl Local {
        /// [`Local::allocate`] now.
        pub(in crate::leasing) fn allocate_now(&mut self, blocks: u64) -> Option<(Extent, u64)> {
            self.allocate_at(blocks, Instant::now())
        }

        /// [`Local::allocate`] at `now`, as the allocator makes it: taken
        /// back past the lease's deadline.
        pub(in crate::leasing) fn allocate_at(
            &mut self,
            blocks: u64,
            now: Instant,
        ) -> Option<(Extent, u64)> {
            let (e, spare, deadline) = self.allocate(blocks)?;
            if now >= deadline {
                self.take_back(e);
                return None;
            }
            Some((e, spare))
        }
    }

    /// A fresh `Local` holding `leases`.
    pub(in crate::leasing) fn holding(leases: Vec<LocalLease>) -> Local {
        let mut l = Local::new(64);
        l.leases = leases;
        l
    }

    #[test]
    fn a_new_local_starts_at_generation_one_with_the_default_ttl() {
        let l = Local::new(512);
        assert_eq!(l.open_gen, 1);
        assert_eq!(l.ttl_seen, DEFAULT_TTL);
        assert_eq!(l.low_water, 512);
        assert!(!l.has_work());
    }

    #[test]
    fn allocations_come_from_the_lease_and_are_pending_until_committed() {
        let mut l = holding(vec![lease(1, &[ext(1000, 100)])]);
        let (a, spare) = l.allocate_now(30).unwrap();
        assert!(
            a.start() >= 1000 && a.end() <= 1100,
            "{a} is outside the lease"
        );
        assert_eq!(spare, 70);
        let (b, spare) = l.allocate_now(70).unwrap();
        assert_eq!(spare, 0);
        assert_eq!(l.pending, vec![(1, a), (1, b)]);
        assert!(l.has_work());
        // Nothing outside the lease is handed out.
        assert_eq!(l.allocate_now(1), None);
        assert_eq!(l.pending.len(), 2);
    }

    #[test]
    fn only_the_serving_lease_allocates() {
        let mut old = lease(1, &[ext(0, 100)]);
        old.retiring = true;
        let mut l = holding(vec![old, lease(2, &[ext(500, 100)])]);
        let (e, _) = l.allocate_now(10).unwrap();
        assert!(e.start() >= 500, "{e} came from the retiring lease");
        assert_eq!(l.pending, vec![(2, e)]);

        l.leases[1].retiring = true;
        assert_eq!(l.allocate_now(10), None, "no lease serves");
        assert_eq!(holding(Vec::new()).allocate_now(1), None);
    }

    #[test]
    fn a_lease_past_its_deadline_hands_out_nothing_and_retires() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let d = l.leases[0].deadline;
        let before = d - Duration::from_millis(1);
        let (a, _) = l.allocate_at(10, before).unwrap();
        assert_eq!(l.allocate_at(10, d), None, "refused at the deadline");
        assert!(l.leases[0].retiring, "and retired");
        assert_eq!(l.allocate_at(10, before), None, "for good");
        assert_eq!(l.pending, vec![(1, a)]);
        assert_eq!(l.leases[0].unused(), 90, "nothing kept of the refusal");
    }

    #[test]
    fn an_allocation_may_be_written_until_its_leases_deadline_while_uncommitted() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let d = l.leases[0].deadline;
        let (a, _) = l.allocate_now(10).unwrap();
        assert_eq!(l.deadline_of(a), Some(d));
        // Being committed: still uncommitted.
        l.pending.clear();
        l.leases[0].inflight = Some(Inflight {
            seq: 1,
            allocs: vec![a],
            frees: Vec::new(),
        });
        assert_eq!(l.deadline_of(a), Some(d));
        // The lease extended: the deadline moves on.
        let later = d + Duration::from_secs(5);
        l.leases[0].deadline = later;
        assert_eq!(l.deadline_of(a), Some(later));
        // Committed: no deadline.
        l.leases[0].inflight = None;
        assert_eq!(l.deadline_of(a), None);
        assert_eq!(l.deadline_of(ext(500, 1)), None, "not an allocation");
    }

    #[test]
    fn a_lost_allocations_deadline_is_past() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let (a, _) = l.allocate_now(10).unwrap();
        let before = Instant::now();
        l.drop_lease(1, true);
        let t = l.deadline_of(a).expect("lost, not committed");
        assert!(t >= before && t <= Instant::now(), "already past");
        // Reported: forgotten.
        l.lost.clear();
        assert_eq!(l.deadline_of(a), None);
    }

    #[test]
    fn leases_past_their_deadline_retire() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)]), lease(2, &[ext(200, 100)])]);
        l.leases[1].deadline += Duration::from_secs(10);
        let d = l.leases[0].deadline;
        assert!(!l.retire_expired(d - Duration::from_millis(1)));
        assert!(l.retire_expired(d));
        assert!(l.leases[0].retiring && !l.leases[1].retiring);
        assert!(!l.retire_expired(d), "once");
    }

    #[test]
    fn a_deadline_is_the_send_time_plus_the_ttl_minus_the_margin() {
        let t = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(deadline(t, ttl, 1_500), t + Duration::from_millis(8_500));
        // No margin given: a twentieth of the TTL.
        assert_eq!(deadline(t, ttl, 0), t + Duration::from_millis(9_500));
        // A margin past the TTL leaves no time at all.
        assert_eq!(deadline(t, ttl, 60_000), t);
    }

    #[test]
    fn freeing_a_pending_allocation_gives_its_blocks_back_at_once() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let (a, _) = l.allocate_now(100).unwrap();
        l.free(a);
        assert!(l.pending.is_empty());
        assert!(l.frees.is_empty(), "nothing to tell the server");
        assert!(!l.has_work());
        assert_eq!(l.leases[0].unused(), 100);
        assert_eq!(l.allocate_now(100).map(|(e, _)| e), Some(a));
    }

    #[test]
    fn freeing_a_committed_allocation_waits_for_the_next_commit() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let committed = ext(5000, 8);
        l.free(committed);
        assert_eq!(l.frees, vec![committed]);
        assert!(l.has_work());
        // The lease gets nothing back before the server recycles it.
        assert_eq!(l.leases[0].unused(), 100);
    }

    /// A free of an allocation whose commit was in flight was queued at
    /// once: when the lease was then lost, the free went to the server as
    /// a double free, refused with the whole batch (its other frees
    /// leaked), and the allocation was reported lost although freed.
    #[test]
    fn a_free_of_an_allocation_in_flight_waits_for_its_commit() {
        let sent = ext(0, 8);
        let inflight = || Inflight {
            seq: 1,
            allocs: vec![sent],
            frees: Vec::new(),
        };
        let mut l = holding(vec![lease(1, &[ext(8, 92)])]);
        l.leases[0].inflight = Some(inflight());
        l.free(sent);
        assert!(l.frees.is_empty(), "not before the commit is acknowledged");
        l.commit_acknowledged(1);
        assert_eq!(l.frees, vec![sent]);
        // The lease is lost instead: the free is forgotten, nothing lost.
        let mut l = holding(vec![lease(1, &[ext(8, 92)])]);
        l.leases[0].inflight = Some(inflight());
        l.free(sent);
        assert_eq!(l.drop_lease(1, true), 0);
        assert!(l.frees.is_empty() && l.lost.is_empty());
    }

    /// A batch cut off and unanswered at its lease's deadline may have run:
    /// its frees were dropped (sent again, they could free blocks given to
    /// someone since), and leaked when it had not run. Now it stays in
    /// doubt until the server tells.
    #[test]
    fn a_batch_in_doubt_at_the_deadline_is_settled_by_the_server() {
        for ran in [false, true] {
            let batch = Inflight {
                seq: 3,
                allocs: vec![ext(0, 8)],
                frees: vec![ext(9000, 2)],
            };
            let mut l = holding(vec![lease(1, &[ext(8, 92)])]);
            l.leases[0].inflight = Some(batch.clone());
            l.leases[0].unsure = true;
            assert_eq!(
                l.drop_lease(1, true),
                1,
                "its allocation is lost to the caller"
            );
            assert!(l.frees.is_empty());
            assert!(l.has_work(), "resent until settled");
            l.settled(1, &batch, ran);
            assert!(l.in_doubt.is_empty());
            // It ran: the allocation is committed, and freed as nobody's;
            // it did not: its frees go again.
            let want = if ran {
                batch.allocs.clone()
            } else {
                batch.frees.clone()
            };
            assert_eq!(l.frees, want);
        }
    }

    #[test]
    fn an_unacknowledged_batch_a_loss_or_a_refusal_is_work_for_commit() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        l.leases[0].inflight = Some(Inflight {
            seq: 1,
            allocs: vec![ext(0, 1)],
            frees: Vec::new(),
        });
        assert!(l.has_work());
        let mut l = holding(Vec::new());
        l.lost.push(ext(0, 1));
        assert!(l.has_work());
        let mut l = holding(Vec::new());
        l.refused = Some(ClientError::Closed);
        assert!(l.has_work());
    }

    #[test]
    fn dropping_a_lease_loses_its_uncommitted_allocations_only() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)]), lease(2, &[ext(200, 100)])]);
        let sent = ext(0, 10);
        let freed = ext(9000, 4);
        l.leases[0].inflight = Some(Inflight {
            seq: 3,
            allocs: vec![sent],
            frees: vec![freed],
        });
        let waiting = ext(10, 5);
        let other = ext(200, 5);
        l.pending = vec![(1, waiting), (2, other)];

        assert_eq!(l.drop_lease(1, true), 2);
        assert_eq!(l.lost, vec![sent, waiting]);
        assert_eq!(l.pending, vec![(2, other)]);
        assert_eq!(l.frees, vec![freed], "never applied: sent again");
        assert_eq!(l.leases.iter().map(|x| x.id).collect::<Vec<_>>(), [2]);

        // Without resending, the batch's frees go with it.
        l.leases[0].inflight = Some(Inflight {
            seq: 1,
            allocs: Vec::new(),
            frees: vec![ext(9100, 1)],
        });
        assert_eq!(l.drop_lease(2, false), 1);
        assert_eq!(l.frees, vec![freed]);
        assert!(l.leases.is_empty());
        // An unknown lease: nothing happens.
        assert_eq!(l.drop_lease(9, true), 0);
    }

    #[test]
    fn an_unavailable_round_is_reported_to_that_round_and_earlier_ones() {
        let mut l = Local::new(64);
        l.note_error(5, ClientError::Unavailable("down".into()));
        assert!(l.unavailable_since(4).is_some());
        assert!(l.unavailable_since(5).is_some());
        assert!(
            l.unavailable_since(6).is_none(),
            "a later round went through"
        );
        assert!(l.refused.is_none());

        l.note_error(6, ClientError::OutcomeUnknown("cut off".into()));
        assert!(l.unavailable_since(6).unwrap().is_outcome_unknown());
    }

    #[test]
    fn a_refusal_is_kept_apart_from_unavailability() {
        let mut l = Local::new(64);
        let e = ClientError::Refused {
            code: tonic::Code::FailedPrecondition,
            reason: "double free".into(),
        };
        l.note_error(2, e);
        assert!(l.unavailable.is_none());
        assert!(matches!(l.refused, Some(ClientError::Refused { .. })));
    }

    #[test]
    fn refill_reaches_every_lease() {
        let mut l = holding(vec![lease(1, &[ext(0, 10)]), lease(2, &[ext(100, 10)])]);
        l.set_refill(12345);
        assert!(l.leases.iter().all(|x| x.engine.refill_blocks() == 12345));
    }

    /// A lease of slivers: `n` runs of `len` blocks with gaps between.
    fn slivers(id: u64, n: u64, len: u64) -> LocalLease {
        let free: Vec<Extent> = (0..n).map(|i| ext(i * 2 * len, len)).collect();
        lease(id, &free)
    }

    #[test]
    fn a_lease_of_slivers_with_no_refill_retires() {
        // 64 slivers of 8 blocks: 512 unused, none fits 16.
        let mut l = holding(vec![slivers(1, 64, 8)]);
        l.set_refill(0);
        assert!(l.retire_fragmented(16, 16));
        assert!(l.leases[0].retiring);
        // Retired once; nothing serves now.
        assert!(!l.retire_fragmented(16, 16));
    }

    #[test]
    fn a_lease_is_kept_while_it_fits_the_request_or_the_server_can_add_runs() {
        let mut l = holding(vec![slivers(1, 64, 8)]);
        l.set_refill(0);
        assert!(!l.retire_fragmented(8, 8), "a run fits");

        l.set_refill(SegFitAllocator::MIN_REFILL);
        assert!(!l.retire_fragmented(16, 16), "the server can add runs");
        assert!(!l.leases[0].retiring);
    }

    #[test]
    fn a_nearly_used_lease_is_grown_not_retired() {
        // 16 unused blocks are fewer than 8 requests of 16.
        let mut l = holding(vec![slivers(1, 2, 8)]);
        l.set_refill(0);
        assert!(!l.retire_fragmented(16, 16));
        // The smallest useful lease counts as the request.
        let mut l = holding(vec![slivers(1, 64, 8)]);
        l.set_refill(0);
        assert!(!l.retire_fragmented(16, 1024));
    }
}
