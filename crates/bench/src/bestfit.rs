//! `best-fit`: the packing reference. A plain best fit with immediate
//! coalescing over two `BTreeMap`s, written to be obviously right rather
//! than fast.
//!
//! Free space is the set of maximal free extents, kept twice: by start
//! (`start → len`) and by `(len, start)`. Every packing figure of a bench
//! can be shown beside this engine's on the same request stream
//! (`bench --reference best-fit`), so a packing claim always has a plain,
//! well-known policy to stand against.
//!
//! Operations:
//! * allocate(n): the shortest free extent of at least `n` blocks, the
//!   lowest address among equals; `n` blocks are cut from its front. Hints
//!   are ignored: best fit has no notion of a goal.
//! * allocate_scattered(n): one extent when one holds `n`; otherwise the
//!   longest extents whole, then a best fit for the rest. Fails only when
//!   fewer than `n` blocks are free.
//! * free(e): refused if any block of `e` is free; otherwise it creates a
//!   free extent, extends the one before or after it, or merges both.
//!
//! Invariants (checked by `verify`): both maps hold the same extents; free
//! extents lie inside the device, are disjoint and no two touch;
//! `used + Σ free lengths == capacity`.
//!
//! Each operation is `O(log F)` for `F` free extents, with the constant of
//! two or three B-tree updates; memory is about 60–80 bytes per free extent.

use std::collections::{BTreeMap, BTreeSet};

use blockalloc::{
    AllocError, Allocator, BuildError, Extent, FreeError, FromFreeExtents, Status, StatusBuilder,
    VerifyError,
};

/// An extent the engine computed itself: never empty, never overflowing.
fn ext(start: u64, len: u64) -> Extent {
    Extent::new(start, len).expect("free extents and cuts are never empty")
}

/// Plain best fit with immediate coalescing.
///
/// ```
/// use blockalloc::{Allocator, FromFreeExtents};
/// use blockalloc_bench::BestFit;
/// let mut a = BestFit::with_capacity(100)?;
/// let x = a.allocate(10, None)?;
/// let y = a.allocate(30, None)?;
/// a.free(x)?; // a 10-block hole at 0
/// // 8 blocks go to the smallest hole that holds them: the 10-block one.
/// assert_eq!(a.allocate(8, None)?.start(), 0);
/// a.free(y)?;
/// a.verify()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct BestFit {
    capacity: u64,
    used: u64,
    /// Free extents by start: `start → len`.
    by_start: BTreeMap<u64, u64>,
    /// Free extents by `(len, start)`.
    by_len: BTreeSet<(u64, u64)>,
}

impl BestFit {
    /// Engine name.
    pub const NAME: &'static str = "best-fit";

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
    }

    /// Cuts `len` blocks from the front of the free extent `(have, start)`.
    fn take_front(&mut self, start: u64, have: u64, len: u64) -> Extent {
        debug_assert!(have >= len);
        self.remove(start, have);
        if have > len {
            self.insert(start + len, have - len);
        }
        self.used += len;
        ext(start, len)
    }

    fn best(&self, len: u64) -> Option<(u64, u64)> {
        self.by_len.range((len, 0)..).next().copied()
    }

    fn no_space(&self, requested: u64) -> AllocError {
        AllocError::NoSpace {
            requested,
            free: self.capacity - self.used,
            largest_free: self.by_len.last().map_or(0, |&(l, _)| l),
        }
    }
}

impl FromFreeExtents for BestFit {
    fn from_free_extents(capacity: u64, free: &[Extent]) -> Result<Self, BuildError> {
        blockalloc::check_free_list(capacity, free)?;
        let mut a = BestFit {
            capacity,
            used: capacity,
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
        };
        let mut pending: Option<(u64, u64)> = None;
        for &e in free {
            pending = match pending {
                Some((s, end)) if end == e.start() => Some((s, e.end())),
                Some((s, end)) => {
                    a.insert(s, end - s);
                    Some((e.start(), e.end()))
                }
                None => Some((e.start(), e.end())),
            };
        }
        if let Some((s, end)) = pending {
            a.insert(s, end - s);
        }
        a.used -= a.by_start.values().sum::<u64>();
        Ok(a)
    }
}

impl Allocator for BestFit {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        blockalloc::check_alloc(self.capacity, len, hint)?;
        match self.best(len) {
            Some((have, start)) => Ok(self.take_front(start, have, len)),
            None => Err(self.no_space(len)),
        }
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        blockalloc::check_alloc(self.capacity, len, None)?;
        if len > self.capacity - self.used {
            return Err(self.no_space(len));
        }
        let mut need = len;
        loop {
            if let Some((have, start)) = self.best(need) {
                out.push(self.take_front(start, have, need));
                return Ok(());
            }
            let (have, start) = *self
                .by_len
                .last()
                .expect("free blocks remain, so some extent is free");
            out.push(self.take_front(start, have, have));
            need -= have;
        }
    }

    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        let (s, e) = (extent.start(), extent.end());
        if e > self.capacity {
            return Err(FreeError::OutOfRange {
                extent,
                capacity: self.capacity,
            });
        }
        // The last free extent starting before `e` is the only one that can
        // overlap the freed range or end right at its start.
        let before = self
            .by_start
            .range(..e)
            .next_back()
            .map(|(&start, &len)| (start, len));
        if let Some((start, len)) = before {
            if let Some(overlap) = ext(start, len).intersection(&extent) {
                return Err(FreeError::NotAllocated { extent, overlap });
            }
        }
        let left = before.filter(|&(start, len)| start + len == s);
        let right = self.by_start.get(&e).map(|&len| (e, len));
        let (mut start, mut end) = (s, e);
        if let Some((ls, ll)) = left {
            self.remove(ls, ll);
            start = ls;
        }
        if let Some((rs, rl)) = right {
            self.remove(rs, rl);
            end = rs + rl;
        }
        self.insert(start, end - start);
        self.used -= extent.len();
        Ok(())
    }

    fn status(&self) -> Status {
        let mut b = StatusBuilder::new(self.capacity);
        self.for_each_free_extent(&mut |e| b.push(e));
        b.finish()
    }

    fn memory_bytes(&self) -> usize {
        // A B-tree node of either map holds up to 11 entries of 16 bytes
        // plus its links; about 40 bytes per entry in each map is the usual
        // figure at 2/3 occupancy.
        self.by_start.len() * 40 + self.by_len.len() * 40
    }

    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        for (&start, &len) in &self.by_start {
            f(ext(start, len));
        }
    }

    fn verify(&self) -> Result<(), VerifyError> {
        let fail = |what: String| {
            Err(VerifyError {
                engine: Self::NAME,
                what,
            })
        };
        if self.by_start.len() != self.by_len.len() {
            return fail(format!(
                "{} extents by start, {} by length",
                self.by_start.len(),
                self.by_len.len()
            ));
        }
        let mut free = 0u64;
        let mut prev_end: Option<u64> = None;
        for (&start, &len) in &self.by_start {
            if len == 0 || start.checked_add(len).is_none_or(|end| end > self.capacity) {
                return fail(format!(
                    "free extent [{start}+{len}] is empty or out of range"
                ));
            }
            if prev_end.is_some_and(|p| p >= start) {
                return fail(format!(
                    "free extent at {start} touches or overlaps the one before"
                ));
            }
            if !self.by_len.contains(&(len, start)) {
                return fail(format!(
                    "free extent [{start}+{len}] missing from the length index"
                ));
            }
            prev_end = Some(start + len);
            free += len;
        }
        if self.used + free != self.capacity {
            return fail(format!(
                "used {} + free {free} != capacity {}",
                self.used, self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bit per block: the trivially correct model.
    fn model_free(m: &[bool]) -> Vec<Extent> {
        let mut v = Vec::new();
        let mut i = 0;
        while i < m.len() {
            if m[i] {
                let s = i;
                while i < m.len() && m[i] {
                    i += 1;
                }
                v.push(Extent::new(s as u64, (i - s) as u64).unwrap());
            } else {
                i += 1;
            }
        }
        v
    }

    #[test]
    fn random_operations_match_a_bitmap_model() {
        let cap = 3000u64;
        let mut a = BestFit::with_capacity(cap).unwrap();
        let mut m = vec![true; cap as usize];
        let mut live: Vec<Extent> = Vec::new();
        let mut x = 7u64;
        for step in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            if !r.is_multiple_of(3) || live.is_empty() {
                let len = r % 90 + 1;
                let free = model_free(&m);
                let best = free
                    .iter()
                    .filter(|e| e.len() >= len)
                    .min_by_key(|e| (e.len(), e.start()))
                    .copied();
                match (a.allocate(len, None), best) {
                    (Ok(got), Some(want)) => {
                        assert_eq!(got, Extent::new(want.start(), len).unwrap(), "step {step}");
                        for b in got.start()..got.end() {
                            m[b as usize] = false;
                        }
                        live.push(got);
                    }
                    (Err(AllocError::NoSpace { .. }), None) => {}
                    (got, want) => panic!("step {step}: {got:?} but best fit is {want:?}"),
                }
            } else {
                let e = live.swap_remove(r as usize % live.len());
                // Free part of it first: any allocated extent may be freed.
                let half = e.len() / 2;
                if half > 0 {
                    let (h, t) = (
                        Extent::new(e.start(), half).unwrap(),
                        Extent::new(e.start() + half, e.len() - half).unwrap(),
                    );
                    a.free(t).unwrap();
                    assert!(matches!(a.free(t), Err(FreeError::NotAllocated { .. })));
                    a.free(h).unwrap();
                } else {
                    a.free(e).unwrap();
                }
                for b in e.start()..e.end() {
                    m[b as usize] = true;
                }
                assert!(matches!(a.free(e), Err(FreeError::NotAllocated { .. })));
            }
            assert_eq!(a.free_extents(), model_free(&m), "step {step}");
            a.verify().unwrap();
        }
    }

    #[test]
    fn bad_requests_change_nothing() {
        let mut a = BestFit::with_capacity(100).unwrap();
        let x = a.allocate(10, None).unwrap();
        let before = a.free_extents();
        assert_eq!(a.allocate(0, None), Err(AllocError::ZeroLength));
        assert!(matches!(
            a.allocate(1, Some(101)),
            Err(AllocError::HintOutOfRange { .. })
        ));
        assert!(matches!(
            a.allocate(91, None),
            Err(AllocError::NoSpace { .. })
        ));
        assert!(matches!(
            a.free(Extent::new(95, 10).unwrap()),
            Err(FreeError::OutOfRange { .. })
        ));
        assert!(matches!(
            a.free(Extent::new(5, 10).unwrap()),
            Err(FreeError::NotAllocated { .. })
        ));
        assert_eq!(a.free_extents(), before);
        a.free(x).unwrap();
        assert_eq!(a.free_extents(), vec![Extent::new(0, 100).unwrap()]);
    }

    #[test]
    fn scattered_takes_the_longest_extents_then_a_best_fit() {
        let mut a = BestFit::with_capacity(100).unwrap();
        let x: Vec<Extent> = (0..10).map(|_| a.allocate(10, None).unwrap()).collect();
        a.free(x[1]).unwrap();
        a.free(x[3]).unwrap();
        a.free(x[4]).unwrap();
        let mut out = Vec::new();
        a.allocate_scattered(25, &mut out).unwrap();
        assert_eq!(
            out,
            vec![Extent::new(30, 20).unwrap(), Extent::new(10, 5).unwrap()]
        );
        let mut more = Vec::new();
        assert!(a.allocate_scattered(6, &mut more).is_err());
        assert!(more.is_empty());
        a.verify().unwrap();
    }

    #[test]
    fn refuses_the_free_lists_the_core_engines_refuse() {
        let e = |s, l| Extent::new(s, l).unwrap();
        for (cap, list) in [
            (0, vec![]),
            (100, vec![e(90, 20)]),
            (100, vec![e(10, 10), e(15, 10)]),
            (100, vec![e(50, 10), e(10, 10)]),
        ] {
            assert_eq!(
                BestFit::from_free_extents(cap, &list).unwrap_err(),
                blockalloc::SegFitAllocator::from_free_extents(cap, &list).unwrap_err(),
                "{cap} {list:?}"
            );
        }
        let a = BestFit::from_free_extents(100, &[e(10, 10), e(20, 5), e(50, 1)]).unwrap();
        assert_eq!(a.free_extents(), [e(10, 15), e(50, 1)]);
        assert_eq!(a.used(), 84);
    }
}
