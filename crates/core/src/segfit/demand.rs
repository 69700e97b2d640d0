//! [`Demand`]: which exact sizes are in surplus.
//!
//! The original notes' pooling allocator packs a stationary workload almost
//! perfectly because a freed fragment of `k` blocks waits for the next
//! request of exactly `k` instead of being cut into slivers. It fails when
//! the size mix shifts: fragments of sizes nobody asks for any more are
//! stranded. This module tells the engine which is which.
//!
//! For each exact size `k` (1..=1024 blocks) it keeps `count[k]`, the free
//! extents of that size, and `demand[k]`, an exponentially decaying count of
//! recent requests for it (every [`HALF_LIFE`] requests the counts halve,
//! spread over the requests in steps of [`DECAY_STEP`] classes so that no
//! single request pays for all of them). A size is in **surplus** when it
//! has more free extents than recent requests: splitting one of those costs
//! nothing the workload is waiting for.
//!
//! It also tells the engine whether free extents of exact sizes (the
//! *fragments*, at most 1024 blocks) can still wait for their exact
//! requests. Waiting pays while other requests are cut from the large
//! extents: no sliver is left behind. But if the large extents run out
//! before the fragments are taken, the device fails with the fragments
//! still free, and every request cut from a large extent meanwhile used
//! space that a long request needed. So it keeps two decaying sums over the
//! same window as the demand: blocks served by exact fits (the rate at
//! which fragments go) and blocks cut from extents longer than 1024 blocks
//! (the rate at which the large extents go). Fragments may wait while, at
//! those rates, they would be used up no later than the large extents:
//! `fragment_blocks / exact_rate <= large_blocks / large_rate`
//! ([`Demand::fragments_may_wait`]). The same comparison for one size, the
//! fragment a best fit would cut, asks whether the requests of exactly
//! that size would take its free extents first: `count[k] / demand[k] <=
//! large_blocks / large_rate` ([`Demand::size_may_wait`]).
//!
//! Last, it tells the engine whether a best fit would leave a remainder
//! that the workload is about to take whole ([`Demand::takes_soon`]): a
//! *popular* size, asked for more than [`POPULAR`] times as often as the
//! average size asked for, whose free extents (the remainder among them)
//! number at most `1 / COVER` of its recent requests and would go, at the
//! rates above, before the large extents. Such a cut strands nothing, so
//! the engine need not spend a large extent to keep the fragment whole.
//!
//! Invariants: `surplus` bit `k` is set iff `count[k] > demand[k]`;
//! `wanted` bit `k` iff `demand[k] > 0`; `fragment_blocks ==
//! Σ count[k] · (k + 1)` over the exact classes; `asked_total ==
//! Σ demand[k]` and `wanted_sizes` is the number of `wanted` bits.

use super::classes::{class_of, ClassBits, EXACT};

/// Requests after which a size's demand has halved.
pub(crate) const HALF_LIFE: u32 = 1 << 14;
/// Classes halved at a time; `HALF_LIFE / (EXACT / DECAY_STEP)` requests
/// apart.
const DECAY_STEP: usize = 32;
/// A size is popular when its demand exceeds this many times the average
/// demand of the sizes asked for.
pub(crate) const POPULAR: u64 = 4;
/// A popular size takes a remainder soon while its recent requests number
/// at least this many times its free extents, the remainder included.
pub(crate) const COVER: u64 = 2;
const EXACT_CLASSES: usize = EXACT as usize;
const DECAY_EVERY: u32 = HALF_LIFE / (EXACT_CLASSES / DECAY_STEP) as u32;

/// The two counters of one exact size, side by side so that an update
/// touches one cache line.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    /// Free extents of this size.
    free: u32,
    /// Decaying count of recent requests for this size.
    asked: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct Demand {
    counts: Box<[Counts; EXACT_CLASSES]>,
    surplus: ClassBits,
    /// Bit `k` set iff `demand[k] > 0`.
    wanted: ClassBits,
    /// Requests since the last decay step.
    since: u32,
    /// Next class to halve.
    cursor: usize,
    /// Free blocks in extents of exact sizes (at most `EXACT` blocks).
    fragment_blocks: u64,
    /// Decaying sum of blocks served by exact fits.
    exact_served: u64,
    /// Decaying sum of blocks cut from extents longer than `EXACT`.
    large_served: u64,
    /// Σ `asked` over the exact classes.
    asked_total: u64,
    /// Exact classes with `asked > 0` (the `wanted` bits).
    wanted_sizes: u64,
}

impl Demand {
    pub(crate) fn new() -> Self {
        Demand {
            counts: Box::new([Counts::default(); EXACT_CLASSES]),
            surplus: ClassBits::new(),
            wanted: ClassBits::new(),
            since: 0,
            cursor: 0,
            fragment_blocks: 0,
            exact_served: 0,
            large_served: 0,
            asked_total: 0,
            wanted_sizes: 0,
        }
    }

    /// Brings the surplus bit of class `c` up to date (a change of its free
    /// count cannot change the `wanted` bit).
    #[inline]
    fn update_surplus(&mut self, c: usize) {
        let Counts { free, asked } = self.counts[c];
        // Most updates change no bit: test before writing.
        if (free > asked) != self.surplus.get(c) {
            if free > asked {
                self.surplus.set(c);
            } else {
                self.surplus.clear(c);
            }
        }
    }

    #[inline]
    fn update(&mut self, c: usize) {
        self.update_surplus(c);
        let asked = self.counts[c].asked;
        if (asked > 0) != self.wanted.get(c) {
            if asked > 0 {
                self.wanted.set(c);
                self.wanted_sizes += 1;
            } else {
                self.wanted.clear(c);
                self.wanted_sizes -= 1;
            }
        }
    }

    /// A free extent joined class `c`.
    #[inline]
    pub(crate) fn linked(&mut self, c: usize) {
        if c < EXACT_CLASSES {
            self.counts[c].free += 1;
            self.fragment_blocks += c as u64 + 1;
            self.update_surplus(c);
        }
    }

    /// A free extent left class `c`.
    #[inline]
    pub(crate) fn unlinked(&mut self, c: usize) {
        if c < EXACT_CLASSES {
            self.counts[c].free -= 1;
            self.fragment_blocks -= c as u64 + 1;
            self.update_surplus(c);
        }
    }

    /// Someone asked for `len` blocks.
    #[inline]
    pub(crate) fn requested(&mut self, len: u64) {
        if len <= EXACT {
            let c = class_of(len);
            let asked = self.counts[c].asked;
            if asked < u32::MAX {
                self.counts[c].asked = asked + 1;
                self.asked_total += 1;
            }
            self.update(c);
        }
        self.since += 1;
        if self.since >= DECAY_EVERY {
            self.decay();
        }
    }

    /// Halves the next [`DECAY_STEP`] classes' demand (once in
    /// `DECAY_EVERY` requests, kept out of line).
    #[cold]
    #[inline(never)]
    fn decay(&mut self) {
        self.since = 0;
        for c in self.cursor..self.cursor + DECAY_STEP {
            let asked = self.counts[c].asked;
            self.counts[c].asked = asked / 2;
            self.asked_total -= u64::from(asked - asked / 2);
            self.update(c);
        }
        self.cursor = (self.cursor + DECAY_STEP) % EXACT_CLASSES;
        if self.cursor == 0 {
            // Once per half-life, like each class's demand.
            self.exact_served /= 2;
            self.large_served /= 2;
        }
    }

    /// A request for `len` blocks was served from a free extent of `have`
    /// blocks.
    #[inline]
    pub(crate) fn served(&mut self, len: u64, have: u64) {
        // Saturating: a request may be as long as the device.
        if have == len {
            self.exact_served = self.exact_served.saturating_add(len);
        } else if have > EXACT {
            self.large_served = self.large_served.saturating_add(len);
        }
    }

    /// True when the fragments, taken at the recent rate of exact fits,
    /// would be used up no later than `large_blocks` (the free blocks in
    /// extents longer than `EXACT`) at the recent rate of cuts from them:
    /// then a request with no exact fit may be cut from a large extent and
    /// leave the fragments to their exact requests.
    #[inline]
    pub(crate) fn fragments_may_wait(&self, large_blocks: u64) -> bool {
        u128::from(self.fragment_blocks) * u128::from(self.large_served)
            <= u128::from(large_blocks) * u128::from(self.exact_served)
    }

    /// True when the free extents of exact class `c`, taken by requests of
    /// exactly their size at the recent rate, would be used up no later
    /// than `large_blocks` (the free blocks in extents longer than `EXACT`)
    /// at the recent rate of cuts from them: then a request that one of
    /// them would serve only by a cut may be cut from a large extent
    /// instead, and leave them to their own requests. Both rates are over
    /// the same decaying window, so its length cancels out:
    /// `count / demand <= large_blocks / large_served`.
    #[inline]
    pub(crate) fn size_may_wait(&self, c: usize, large_blocks: u64) -> bool {
        let Counts { free, asked } = self.counts[c];
        self.taken_in_time(u64::from(free), u64::from(asked), large_blocks)
    }

    /// True when `extents` free extents of one size, taken by `asked`
    /// recent requests for it, would go no later than `large_blocks` at the
    /// recent rate of cuts from large extents.
    #[inline]
    fn taken_in_time(&self, extents: u64, asked: u64, large_blocks: u64) -> bool {
        u128::from(extents) * u128::from(self.large_served)
            <= u128::from(large_blocks) * u128::from(asked)
    }

    /// True when a free extent of exact class `c`, added to those there
    /// are, would be taken whole soon: the size is popular (its demand
    /// above [`POPULAR`] times the average demand of the sizes asked for),
    /// its recent requests number at least [`COVER`] times its free
    /// extents with the new one, and at the recent rates they would take
    /// those extents no later than cuts use up `large_blocks` (the test of
    /// [`size_may_wait`](Self::size_may_wait), one extent more).
    #[inline]
    pub(crate) fn takes_soon(&self, c: usize, large_blocks: u64) -> bool {
        let Counts { free, asked } = self.counts[c];
        let (asked, extents) = (u64::from(asked), u64::from(free) + 1);
        asked * self.wanted_sizes > POPULAR * self.asked_total
            && COVER * extents <= asked
            && self.taken_in_time(extents, asked, large_blocks)
    }

    /// Free blocks in extents of exact sizes.
    pub(crate) fn fragment_blocks(&self) -> u64 {
        self.fragment_blocks
    }

    /// The smallest exact class above `c` in surplus.
    #[inline]
    pub(crate) fn surplus_above(&self, c: usize) -> Option<usize> {
        self.surplus
            .first_at_or_after(c + 1)
            .filter(|&m| m < EXACT_CLASSES)
    }

    /// True when someone asked recently for `len` blocks or fewer: a free
    /// extent of `len` blocks can still be used, whole or cut.
    #[inline]
    pub(crate) fn wanted_up_to(&self, len: u64) -> bool {
        self.wanted
            .first_at_or_after(0)
            .is_some_and(|c| c <= class_of(len.clamp(1, EXACT)))
    }

    /// Free extents filed in exact class `c`, as counted here.
    pub(crate) fn count(&self, c: usize) -> u32 {
        self.counts[c].free
    }

    /// Checks the surplus bits against the counters.
    pub(crate) fn check(&self) -> Result<(), String> {
        let blocks: u64 = (0..EXACT_CLASSES)
            .map(|c| u64::from(self.counts[c].free) * (c as u64 + 1))
            .sum();
        if blocks != self.fragment_blocks {
            return Err(format!(
                "fragment blocks counted as {}, the exact classes hold {blocks}",
                self.fragment_blocks
            ));
        }
        let asked_total: u64 = self.counts.iter().map(|c| u64::from(c.asked)).sum();
        if asked_total != self.asked_total {
            return Err(format!(
                "demand counted as {}, the exact classes hold {asked_total}",
                self.asked_total
            ));
        }
        let wanted_sizes = self.counts.iter().filter(|c| c.asked > 0).count() as u64;
        if wanted_sizes != self.wanted_sizes {
            return Err(format!(
                "sizes asked for counted as {}, the exact classes hold {wanted_sizes}",
                self.wanted_sizes
            ));
        }
        for c in 0..EXACT_CLASSES {
            let Counts { free, asked } = self.counts[c];
            if self.surplus.get(c) != (free > asked) {
                return Err(format!("surplus bit of class {c} is stale"));
            }
            if self.wanted.get(c) != (asked > 0) {
                return Err(format!("wanted bit of class {c} is stale"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surplus_follows_counts_and_decays() {
        let mut d = Demand::new();
        d.linked(9); // one free 10-block extent, no demand yet
        assert_eq!(d.surplus_above(0), Some(9));
        d.requested(10); // demand 1, count 1: no surplus
        assert_eq!(d.surplus_above(0), None);
        d.linked(9);
        assert_eq!(d.surplus_above(0), Some(9));
        assert_eq!(d.surplus_above(9), None);
        d.unlinked(9);
        // Decay: after a half-life of other requests the demand is gone.
        for _ in 0..2 * HALF_LIFE {
            d.requested(2000);
        }
        assert_eq!(d.surplus_above(0), Some(9));
        d.check().unwrap();
    }

    #[test]
    fn fragments_wait_only_while_they_would_go_first() {
        let mut d = Demand::new();
        // Nothing served yet and no fragments: waiting costs nothing.
        assert!(d.fragments_may_wait(0));
        d.linked(99); // one fragment of 100 blocks
        assert_eq!(d.fragment_blocks(), 100);
        // Exact fits take 10 blocks for every 10 cut from large extents:
        // the 100 fragment blocks go no later than 100 large blocks.
        d.served(10, 10);
        d.served(10, 5000);
        assert!(d.fragments_may_wait(100));
        assert!(!d.fragments_may_wait(99));
        // Cuts from fragments count as neither.
        d.served(10, 20);
        assert!(d.fragments_may_wait(100));
        // Exact fits stop: once their sum has decayed to nothing, the
        // fragments would outlast any large space.
        for _ in 0..8 * HALF_LIFE {
            d.requested(2000);
            d.served(3000, 5000);
        }
        assert!(!d.fragments_may_wait(1 << 40));
        d.unlinked(99);
        assert!(d.fragments_may_wait(0));
        d.check().unwrap();
    }

    #[test]
    fn a_remainder_is_taken_soon_only_in_a_popular_size_with_few_free_extents() {
        let mut d = Demand::new();
        // Ten requests for 5 blocks, one each for 20 other sizes: the
        // average demand of the 21 sizes is 30 / 21, and 10 is more than
        // four times that.
        for _ in 0..10 {
            d.requested(5);
        }
        for len in 100..120 {
            d.requested(len);
        }
        assert!(d.takes_soon(4, 0));
        // A size asked for once is not popular.
        assert!(!d.takes_soon(99, 1 << 40));
        // With the new one, at most one free extent per two requests.
        for _ in 0..4 {
            d.linked(4);
        }
        assert!(d.takes_soon(4, 1 << 40));
        d.linked(4);
        assert!(!d.takes_soon(4, 1 << 40));
        d.unlinked(4);
        // 1000 blocks cut from large extents per ten requests for the size:
        // its five extents go within half that time, which 500 large blocks
        // would last and 499 would not.
        d.served(1000, 5000);
        assert!(d.takes_soon(4, 500));
        assert!(!d.takes_soon(4, 499));
        // Once the demand has decayed the size is no longer popular.
        for _ in 0..8 * HALF_LIFE {
            d.requested(2000);
        }
        assert!(!d.takes_soon(4, 1 << 40));
        d.check().unwrap();
    }

    #[test]
    fn a_size_waits_only_while_its_requests_would_take_it_first() {
        let mut d = Demand::new();
        // Two free 100-block extents, five recent requests for the size.
        d.linked(99);
        d.linked(99);
        for _ in 0..5 {
            d.requested(100);
        }
        // Nothing cut from large extents yet: waiting costs nothing.
        assert!(d.size_may_wait(99, 0));
        // 500 blocks cut from large extents per five requests for the
        // size: its two extents go within 2/5 of that time, which 200 large
        // blocks would last and 199 would not.
        d.served(500, 5000);
        assert!(d.size_may_wait(99, 200));
        assert!(!d.size_may_wait(99, 199));
        // Exact fits and cuts from fragments do not use the large extents.
        d.served(100, 100);
        d.served(50, 100);
        assert!(d.size_may_wait(99, 200));
        // A size nobody asks for any more would outlast any large space
        // once its demand has decayed to nothing.
        for _ in 0..8 * HALF_LIFE {
            d.requested(2000);
            d.served(2000, 5000);
        }
        assert!(!d.size_may_wait(99, 1 << 40));
        d.check().unwrap();
    }
}
