//! Size classes of free extents, and the two-level bitmap that finds the
//! smallest non-empty class at or above a request in O(1).
//!
//! Classes `0..EXACT` hold extents of exactly `class + 1` blocks: every size
//! of a 0–4 MiB object at 4 KiB blocks has its own class, so the smallest
//! non-empty class is a true best fit and an exact fit is a pop (the speed
//! of the original notes' fast bins). Longer extents fall into TLSF-style
//! classes: the power of two below the length, cut into `SUB` linear steps,
//! so a class spans less than 1/16 of its sizes.

/// Classes of one exact size each: lengths `1..=EXACT`.
pub(crate) const EXACT: u64 = 1024;
const EXACT_BITS: u32 = EXACT.trailing_zeros();
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// All classes: the exact ones, then `SUB` per power of two from `EXACT` up
/// to 2^63.
pub(crate) const CLASSES: usize = EXACT as usize + (64 - EXACT_BITS as usize) * SUB as usize;
const WORDS: usize = CLASSES.div_ceil(64);

/// The class of extents of `len` blocks (`len >= 1`).
#[inline]
pub(crate) fn class_of(len: u64) -> usize {
    debug_assert!(len > 0);
    if len <= EXACT {
        return (len - 1) as usize;
    }
    let f = 63 - len.leading_zeros();
    let sub = (len >> (f - SUB_BITS)) & (SUB - 1);
    EXACT as usize + ((f - EXACT_BITS) as u64 * SUB + sub) as usize
}

/// The shortest length in class `c`.
#[cfg(test)]
pub(crate) fn class_min(c: usize) -> u64 {
    if (c as u64) < EXACT {
        return c as u64 + 1;
    }
    let i = c as u64 - EXACT;
    let f = i / SUB + EXACT_BITS as u64;
    let sub = i % SUB;
    // The first range class starts right after the last exact size.
    ((SUB + sub) << (f - SUB_BITS as u64)).max(EXACT + 1)
}

/// Which classes are non-empty: one bit per class and one summary bit per
/// word.
#[derive(Clone, Debug)]
pub(crate) struct ClassBits {
    words: [u64; WORDS],
    summary: u64,
}

const _: () = assert!(WORDS <= 64, "summary must fit in one word");

impl ClassBits {
    pub(crate) fn new() -> Self {
        ClassBits {
            words: [0; WORDS],
            summary: 0,
        }
    }

    #[inline]
    pub(crate) fn set(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    #[inline]
    pub(crate) fn clear(&mut self, c: usize) {
        let w = &mut self.words[c / 64];
        *w &= !(1 << (c % 64));
        if *w == 0 {
            self.summary &= !(1 << (c / 64));
        }
    }

    #[inline]
    pub(crate) fn get(&self, c: usize) -> bool {
        self.words[c / 64] >> (c % 64) & 1 == 1
    }

    /// The smallest non-empty class `>= c`.
    #[inline(always)]
    pub(crate) fn first_at_or_after(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let wi = c / 64;
        let w = self.words[wi] & (u64::MAX << (c % 64));
        if w != 0 {
            return Some(wi * 64 + w.trailing_zeros() as usize);
        }
        let s = self.summary & u64::MAX.checked_shl(wi as u32 + 1).unwrap_or(0);
        if s == 0 {
            return None;
        }
        let wi = s.trailing_zeros() as usize;
        Some(wi * 64 + self.words[wi].trailing_zeros() as usize)
    }

    /// The largest non-empty class.
    #[inline]
    pub(crate) fn last(&self) -> Option<usize> {
        if self.summary == 0 {
            return None;
        }
        let wi = 63 - self.summary.leading_zeros() as usize;
        Some(wi * 64 + 63 - self.words[wi].leading_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_partition_lengths() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(1024), 1023);
        assert_eq!(class_of(1025), 1024);
        assert_eq!(class_min(1024), 1025);
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        // Every class's minimum maps to the class, and the length just below
        // maps to the class before.
        for c in 1..CLASSES {
            let m = class_min(c);
            assert_eq!(class_of(m), c, "class {c} min {m}");
            assert_eq!(class_of(m - 1), c - 1, "below class {c}");
        }
        // Lengths in a range class differ by less than 1/16.
        for len in [1025u64, 5000, 1 << 20, (1 << 40) + 12345] {
            let c = class_of(len);
            let (lo, hi) = (class_min(c), class_min(c + 1));
            assert!(lo <= len && len < hi && (hi - lo) * 16 <= hi);
        }
    }

    #[test]
    fn bit_search() {
        let mut b = ClassBits::new();
        assert_eq!(b.first_at_or_after(0), None);
        assert_eq!(b.last(), None);
        b.set(5);
        b.set(700);
        b.set(CLASSES - 1);
        assert_eq!(b.first_at_or_after(0), Some(5));
        assert_eq!(b.first_at_or_after(6), Some(700));
        assert_eq!(b.first_at_or_after(701), Some(CLASSES - 1));
        assert_eq!(b.last(), Some(CLASSES - 1));
        b.clear(CLASSES - 1);
        assert_eq!(b.first_at_or_after(701), None);
        assert_eq!(b.last(), Some(700));
        assert!(b.get(5) && !b.get(6));
    }
}
