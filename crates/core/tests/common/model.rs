//! The reference model: the set of free blocks as maximal runs.
//!
//! `runs` maps the start of every maximal free run to its end. Invariants:
//! runs lie in `[0, capacity)`, are disjoint and never touch (a run ending
//! where another starts would have been merged), and `free == Σ run lengths`.
//! Every operation is a few `BTreeMap` lookups, simple enough to trust.

use std::collections::BTreeMap;

use blockalloc::{Extent, GROUP_BLOCKS};

/// `[start, start + len)`; panics on a malformed test extent.
pub fn ext(start: u64, len: u64) -> Extent {
    Extent::new(start, len).unwrap_or_else(|e| panic!("bad test extent {start}+{len}: {e}"))
}

/// `[start, end)`; panics on a malformed test extent.
pub fn span(start: u64, end: u64) -> Extent {
    Extent::from_range(start, end).unwrap_or_else(|e| panic!("bad test range {start}..{end}: {e}"))
}

/// Free space of a device of `capacity` blocks, as maximal runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    capacity: u64,
    runs: BTreeMap<u64, u64>,
    free: u64,
}

impl Model {
    /// A device with every block free.
    pub fn new(capacity: u64) -> Self {
        Self::from_free(capacity, &[span(0, capacity)])
    }

    /// A device where exactly the blocks of `free` are free. `free` must be
    /// sorted and disjoint (adjacent extents are merged), as for
    /// `FromFreeExtents`.
    pub fn from_free(capacity: u64, free: &[Extent]) -> Self {
        let mut m = Model {
            capacity,
            runs: BTreeMap::new(),
            free: 0,
        };
        for w in free.windows(2) {
            assert!(w[0].end() <= w[1].start(), "test free list unsorted: {w:?}");
        }
        for &e in free {
            m.give(e);
        }
        m
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free_blocks(&self) -> u64 {
        self.free
    }

    pub fn used(&self) -> u64 {
        self.capacity - self.free
    }

    /// Maximal free runs in address order.
    pub fn runs(&self) -> Vec<Extent> {
        self.runs.iter().map(|(&s, &e)| span(s, e)).collect()
    }

    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Length of the longest free run (0 when nothing is free).
    pub fn largest_run(&self) -> u64 {
        self.runs.iter().map(|(&s, &e)| e - s).max().unwrap_or(0)
    }

    /// True when `e` lies inside the device.
    pub fn in_range(&self, e: Extent) -> bool {
        e.end() <= self.capacity
    }

    /// The free run holding `block`, if the block is free.
    pub fn run_containing(&self, block: u64) -> Option<Extent> {
        let (&s, &end) = self.runs.range(..=block).next_back()?;
        (block < end).then(|| span(s, end))
    }

    /// The free run that starts exactly at `block`.
    pub fn run_starting_at(&self, block: u64) -> Option<Extent> {
        self.runs.get(&block).map(|&end| span(block, end))
    }

    /// The first free run ending after `block` (it holds `block` or lies
    /// beyond it).
    pub fn first_run_ending_after(&self, block: u64) -> Option<Extent> {
        self.run_containing(block).or_else(|| {
            self.runs
                .range(block.saturating_add(1)..)
                .next()
                .map(|(&s, &e)| span(s, e))
        })
    }

    /// The first free run starting after `block`.
    pub fn first_run_starting_after(&self, block: u64) -> Option<Extent> {
        self.runs
            .range(block.saturating_add(1)..)
            .next()
            .map(|(&s, &e)| span(s, e))
    }

    /// True when every block of `e` is free.
    pub fn is_free(&self, e: Extent) -> bool {
        self.run_containing(e.start())
            .is_some_and(|r| r.contains(&e))
    }

    /// True when at least one block of `e` is free.
    pub fn overlaps_free(&self, e: Extent) -> bool {
        // Runs are sorted and disjoint, so the last one starting before
        // `e.end()` reaches furthest.
        self.runs
            .range(..e.end())
            .next_back()
            .is_some_and(|(_, &end)| end > e.start())
    }

    /// True when `e` lies in the device and none of its blocks is free: the
    /// only extents `free` may accept.
    pub fn is_allocated(&self, e: Extent) -> bool {
        self.in_range(e) && !self.overlaps_free(e)
    }

    /// Free runs clipped to `[lo, hi)`, in address order.
    pub fn runs_within(&self, lo: u64, hi: u64) -> Vec<Extent> {
        let first = self.run_containing(lo).map_or(lo, |r| r.start());
        self.runs
            .range(first..hi)
            .filter_map(|(&s, &e)| Extent::from_range(s.max(lo), e.min(hi)).ok())
            .collect()
    }

    /// Free blocks in `[lo, hi)`.
    pub fn free_within(&self, lo: u64, hi: u64) -> u64 {
        self.runs_within(lo, hi).iter().map(|r| r.len()).sum()
    }

    /// The lowest `s` with `[s, s + len)` free and inside `[lo, hi)`.
    pub fn first_fit(&self, len: u64, lo: u64, hi: u64) -> Option<u64> {
        self.runs_within(lo, hi)
            .into_iter()
            .find(|r| r.len() >= len)
            .map(|r| r.start())
    }

    /// Length of the shortest free run that holds `len` blocks.
    pub fn best_fit_len(&self, len: u64) -> Option<u64> {
        self.runs
            .iter()
            .map(|(&s, &e)| e - s)
            .filter(|&l| l >= len)
            .min()
    }

    /// Number of block groups of the `groups` engine.
    pub fn groups(&self) -> u64 {
        self.capacity.div_ceil(GROUP_BLOCKS)
    }

    /// Blocks of group `g`.
    pub fn group_range(&self, g: u64) -> (u64, u64) {
        let s = g * GROUP_BLOCKS;
        (s, (s + GROUP_BLOCKS).min(self.capacity))
    }

    /// Free blocks of group `g`.
    pub fn group_free(&self, g: u64) -> u64 {
        let (s, e) = self.group_range(g);
        self.free_within(s, e)
    }

    /// The group with the most free blocks (the leftmost on a tie) and its
    /// free count.
    pub fn emptiest_group(&self) -> (u64, u64) {
        let mut best = (0, self.group_free(0));
        for g in 1..self.groups() {
            let f = self.group_free(g);
            if f > best.1 {
                best = (g, f);
            }
        }
        best
    }

    /// Marks the free blocks `e` allocated. Panics unless all were free.
    pub fn take(&mut self, e: Extent) {
        let r = self
            .run_containing(e.start())
            .filter(|r| r.contains(&e))
            .unwrap_or_else(|| panic!("model: {e:?} is not entirely free"));
        self.runs.remove(&r.start());
        if r.start() < e.start() {
            self.runs.insert(r.start(), e.start());
        }
        if e.end() < r.end() {
            self.runs.insert(e.end(), r.end());
        }
        self.free -= e.len();
    }

    /// Marks the allocated blocks `e` free, merging with touching runs.
    /// Panics unless `e` is in range and entirely allocated.
    pub fn give(&mut self, e: Extent) {
        assert!(
            self.is_allocated(e),
            "model: {e:?} is not entirely allocated"
        );
        let mut start = e.start();
        let mut end = e.end();
        if let Some((&s, &le)) = self.runs.range(..start).next_back() {
            if le == start {
                self.runs.remove(&s);
                start = s;
            }
        }
        if let Some(re) = self.runs.remove(&end) {
            end = re;
        }
        self.runs.insert(start, end);
        self.free += e.len();
    }
}
