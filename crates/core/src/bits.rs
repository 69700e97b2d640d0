//! A plain bitmap over block numbers, shared by the bitmap-based engines.
//!
//! Bit `i` set means block `i` is allocated. All searches work a 64-bit word
//! at a time, so a scan costs one step per word or per run it crosses.

use crate::allocator::check_free_range;
use crate::error::{BuildError, FreeError};
use crate::Extent;

/// A fixed-size bitmap of `len` bits, all clear initially.
///
/// Bits past `len` in the last word are kept clear and never reported.
#[derive(Clone, Debug)]
pub(crate) struct Bitmap {
    words: Vec<u64>,
    len: u64,
}

#[inline]
fn mask_from(bit: u64) -> u64 {
    // Bits `bit..64` of a word.
    u64::MAX << (bit & 63)
}

#[inline]
fn mask_below(bit: u64) -> u64 {
    // Bits `0..bit` of a word; `bit` in 0..=64.
    if bit >= 64 {
        u64::MAX
    } else {
        (1u64 << bit) - 1
    }
}

impl Bitmap {
    /// A bitmap of `len` clear bits, or `OutOfMemory` naming `engine` when
    /// the memory cannot be had (a huge capacity must not abort the process).
    pub(crate) fn try_new(len: u64, engine: &'static str) -> Result<Self, BuildError> {
        let oom = BuildError::OutOfMemory {
            engine,
            bytes: len.div_ceil(8),
        };
        let words = usize::try_from(len.div_ceil(64)).map_err(|_| oom.clone())?;
        let mut v: Vec<u64> = Vec::new();
        v.try_reserve_exact(words).map_err(|_| oom)?;
        v.resize(words, 0);
        Ok(Bitmap { words: v, len })
    }

    #[cfg(test)]
    fn new(len: u64) -> Self {
        Self::try_new(len, "test").unwrap()
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    /// Applies `f(word_index, mask)` to every word overlapping `[start, end)`.
    #[inline]
    fn for_words(&mut self, start: u64, end: u64, f: impl Fn(&mut u64, u64)) {
        debug_assert!(start <= end && end <= self.len);
        if start == end {
            return;
        }
        let (ws, we) = (start / 64, (end - 1) / 64);
        if ws == we {
            f(
                &mut self.words[ws as usize],
                mask_from(start) & mask_below(end - ws * 64),
            );
            return;
        }
        f(&mut self.words[ws as usize], mask_from(start));
        for w in &mut self.words[(ws + 1) as usize..we as usize] {
            f(w, u64::MAX);
        }
        f(&mut self.words[we as usize], mask_below(end - we * 64));
    }

    pub(crate) fn set_range(&mut self, start: u64, end: u64) {
        self.for_words(start, end, |w, m| *w |= m);
    }

    pub(crate) fn clear_range(&mut self, start: u64, end: u64) {
        self.for_words(start, end, |w, m| *w &= !m);
    }

    /// First bit in `[from, end)` whose value is `value`.
    #[inline]
    pub(crate) fn find(&self, value: bool, from: u64, end: u64) -> Option<u64> {
        debug_assert!(end <= self.len);
        if from >= end {
            return None;
        }
        let flip = if value { 0 } else { u64::MAX };
        let mut wi = from / 64;
        let last = (end - 1) / 64;
        let mut w = (self.words[wi as usize] ^ flip) & mask_from(from);
        loop {
            if w != 0 {
                let bit = wi * 64 + w.trailing_zeros() as u64;
                return (bit < end).then_some(bit);
            }
            wi += 1;
            if wi > last {
                return None;
            }
            w = self.words[wi as usize] ^ flip;
        }
    }

    /// The first run of `n` clear bits inside `[from, end)` (first fit).
    pub(crate) fn find_clear_run(&self, n: u64, from: u64, end: u64) -> Option<u64> {
        let mut pos = from;
        while pos < end && end - pos >= n {
            let z = self.find(false, pos, end)?;
            if end - z < n {
                return None;
            }
            match self.find(true, z, z + n) {
                None => return Some(z),
                Some(one) => pos = one + 1,
            }
        }
        None
    }

    /// The clear run starting at or after `from` in `[from, end)`, as `(start, end)`.
    pub(crate) fn next_clear_run(&self, from: u64, end: u64) -> Option<(u64, u64)> {
        let z = self.find(false, from, end)?;
        let e = self.find(true, z, end).unwrap_or(end);
        Some((z, e))
    }

    /// Calls `f` with every clear run in `[from, end)`, in address order.
    pub(crate) fn for_each_clear_run(&self, from: u64, end: u64, f: &mut dyn FnMut(Extent)) {
        let mut pos = from;
        while let Some((s, e)) = self.next_clear_run(pos, end) {
            f(Extent::new_unchecked(s, e - s));
            pos = e;
        }
    }

    /// First fit over runs: appends to `out` the clear runs of `[from, end)`
    /// in address order, the last one cut short, until `need` blocks are
    /// gathered or the range is exhausted, and returns how many were. Marks
    /// nothing: the caller sets the runs it keeps.
    pub(crate) fn gather_clear_runs(
        &self,
        from: u64,
        end: u64,
        need: u64,
        out: &mut Vec<Extent>,
    ) -> u64 {
        let mut got = 0;
        let mut pos = from;
        while got < need {
            let Some(s) = self.find(false, pos, end) else {
                break;
            };
            // The run's end is looked for only as far as it is needed: on a
            // mostly free device the run reaches the end of the device, and
            // scanning to it would cost a pass over the whole bitmap.
            let limit = end.min(s + (need - got));
            let e = self.find(true, s, limit).unwrap_or(limit);
            out.push(Extent::new_unchecked(s, e - s));
            got += e - s;
            pos = e;
        }
        got
    }

    /// Checks a request to free `extent`: inside the bitmap, and every bit
    /// of it set (allocated). A double free is refused naming the first
    /// clear run inside `extent`, which is what it overlaps.
    pub(crate) fn check_free(&self, extent: Extent) -> Result<(), FreeError> {
        check_free_range(self.len, extent)?;
        match self.find(false, extent.start(), extent.end()) {
            None => Ok(()),
            Some(z) => {
                let end = self.find(true, z, extent.end()).unwrap_or(extent.end());
                Err(FreeError::NotAllocated {
                    extent,
                    overlap: Extent::new_unchecked(z, end - z),
                })
            }
        }
    }

    /// Number of set bits in `[start, end)`.
    pub(crate) fn count_ones(&self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let (ws, we) = (start / 64, (end - 1) / 64);
        if ws == we {
            let m = mask_from(start) & mask_below(end - ws * 64);
            return (self.words[ws as usize] & m).count_ones() as u64;
        }
        let mut n = (self.words[ws as usize] & mask_from(start)).count_ones() as u64;
        n += self.words[(ws + 1) as usize..we as usize]
            .iter()
            .map(|w| w.count_ones() as u64)
            .sum::<u64>();
        n + (self.words[we as usize] & mask_below(end - we * 64)).count_ones() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_searches() {
        let mut b = Bitmap::new(200);
        b.set_range(3, 130);
        assert_eq!(b.count_ones(0, 200), 127);
        assert_eq!(b.find(false, 0, 200), Some(0));
        assert_eq!(b.find(true, 0, 200), Some(3));
        assert_eq!(b.find(false, 3, 200), Some(130));
        assert_eq!(b.find(false, 3, 130), None);
        assert_eq!(b.find_clear_run(3, 0, 200), Some(0));
        assert_eq!(b.find_clear_run(4, 0, 200), Some(130));
        assert_eq!(b.find_clear_run(70, 0, 200), Some(130));
        assert_eq!(b.find_clear_run(71, 0, 200), None);
        assert_eq!(b.next_clear_run(3, 200), Some((130, 200)));
        let mut runs = Vec::new();
        b.for_each_clear_run(1, 200, &mut |e| runs.push((e.start(), e.end())));
        assert_eq!(runs, [(1, 3), (130, 200)]);
        let mut out = Vec::new();
        assert_eq!(b.gather_clear_runs(0, 200, 10, &mut out), 10);
        assert_eq!(
            out,
            [Extent::new(0, 3).unwrap(), Extent::new(130, 7).unwrap()]
        );
        assert_eq!(b.gather_clear_runs(0, 140, 100, &mut out), 13);
        assert_eq!(out.len(), 4);
        assert!(b.check_free(Extent::new(3, 127).unwrap()).is_ok());
        assert_eq!(
            b.check_free(Extent::new(100, 40).unwrap()),
            Err(FreeError::NotAllocated {
                extent: Extent::new(100, 40).unwrap(),
                overlap: Extent::new(130, 10).unwrap(),
            })
        );
        assert!(matches!(
            b.check_free(Extent::new(199, 2).unwrap()),
            Err(FreeError::OutOfRange { .. })
        ));
        b.clear_range(64, 65);
        assert_eq!(b.find_clear_run(1, 3, 200), Some(64));
        assert_eq!(b.count_ones(63, 66), 2);
        b.set_range(0, 200);
        assert_eq!(b.count_ones(0, 200), 200);
        assert_eq!(b.find(false, 0, 200), None);
        b.clear_range(199, 200);
        assert_eq!(b.find(false, 0, 200), Some(199));
        assert_eq!(b.count_ones(128, 200), 71);
    }

    #[test]
    fn matches_naive() {
        // A deterministic pseudo-random pattern checked against bit-by-bit scans.
        let n = 1000u64;
        let mut b = Bitmap::new(n);
        let mut x = 0x9E3779B97F4A7C15u64;
        let mut naive = vec![false; n as usize];
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s = x % n;
            let e = (s + x % 97 + 1).min(n);
            if x & 1 == 0 {
                b.set_range(s, e);
            } else {
                b.clear_range(s, e);
            }
            for v in &mut naive[s as usize..e as usize] {
                *v = x & 1 == 0;
            }
            let from = (x >> 20) % n;
            let want = (from..n).find(|&i| !naive[i as usize]);
            assert_eq!(b.find(false, from, n), want);
            let want = (from..n).find(|&i| naive[i as usize]);
            assert_eq!(b.find(true, from, n), want);
            let run = (x >> 30) % 20 + 1;
            let want = (0..=n - run).find(|&i| (i..i + run).all(|j| !naive[j as usize]));
            assert_eq!(b.find_clear_run(run, 0, n), want);
            let ones = naive.iter().filter(|&&v| v).count() as u64;
            assert_eq!(b.count_ones(0, n), ones);
        }
    }
}
