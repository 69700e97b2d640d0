//! [`Extent`]: a half-open run of blocks.

use std::fmt;

/// An extent could not be built from the given numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtentError {
    /// The extent would contain no blocks.
    #[error("zero-length extent at block {start}: an extent holds at least one block")]
    ZeroLength {
        /// Where the empty extent would start.
        start: u64,
    },
    /// `start + len` does not fit in a `u64`.
    #[error("extent of {len} blocks at block {start} runs past the largest block number")]
    Overflow {
        /// First block.
        start: u64,
        /// Number of blocks.
        len: u64,
    },
}

crate::invalid_input_errors!(ExtentError);

/// A run of `len` contiguous blocks starting at block `start`: the half-open
/// range `[start, start + len)`.
///
/// Block numbers and lengths count blocks, never bytes; [`crate::Geometry`]
/// converts. An `Extent` built with [`Extent::new`] is never empty and its end
/// never overflows `u64`, so `end()` is always valid.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Extent {
    start: u64,
    len: u64,
}

impl Extent {
    /// Builds `[start, start + len)`.
    ///
    /// # Errors
    /// [`ExtentError::ZeroLength`] when `len == 0`, [`ExtentError::Overflow`]
    /// when `start + len` does not fit in a `u64`.
    ///
    /// ```
    /// use blockalloc::Extent;
    /// let e = Extent::new(10, 4).unwrap();
    /// assert_eq!((e.start(), e.end(), e.len()), (10, 14, 4));
    /// assert!(Extent::new(10, 0).is_err());
    /// assert!(Extent::new(u64::MAX, 2).is_err());
    /// ```
    pub fn new(start: u64, len: u64) -> Result<Self, ExtentError> {
        if len == 0 {
            return Err(ExtentError::ZeroLength { start });
        }
        if start.checked_add(len).is_none() {
            return Err(ExtentError::Overflow { start, len });
        }
        Ok(Extent { start, len })
    }

    /// Builds the extent `[start, end)`.
    ///
    /// # Errors
    /// [`ExtentError::ZeroLength`] when `end <= start`.
    pub fn from_range(start: u64, end: u64) -> Result<Self, ExtentError> {
        if end <= start {
            return Err(ExtentError::ZeroLength { start });
        }
        Ok(Extent {
            start,
            len: end - start,
        })
    }

    /// Internal constructor for values the caller has already validated.
    #[inline]
    pub(crate) const fn new_unchecked(start: u64, len: u64) -> Self {
        debug_assert!(len > 0);
        Extent { start, len }
    }

    /// First block.
    #[inline]
    pub const fn start(&self) -> u64 {
        self.start
    }

    /// Number of blocks (never zero).
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// One past the last block.
    #[inline]
    pub const fn end(&self) -> u64 {
        self.start + self.len
    }

    /// True when the two extents share at least one block.
    #[inline]
    pub const fn overlaps(&self, other: &Extent) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// True when `other` lies entirely inside `self`.
    #[inline]
    pub const fn contains(&self, other: &Extent) -> bool {
        self.start <= other.start && other.end() <= self.end()
    }

    /// True when `block` lies inside `self`.
    #[inline]
    pub const fn contains_block(&self, block: u64) -> bool {
        self.start <= block && block < self.end()
    }

    /// The blocks the two extents share, if any.
    pub fn intersection(&self, other: &Extent) -> Option<Extent> {
        let s = self.start.max(other.start);
        let e = self.end().min(other.end());
        (s < e).then(|| Extent::new_unchecked(s, e - s))
    }
}

impl fmt::Debug for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}..{})", self.start, self.end())
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "blocks {}..{} ({} block{})",
            self.start,
            self.end(),
            self.len,
            if self.len == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges() {
        assert!(Extent::new(u64::MAX - 1, 1).is_ok());
        assert!(Extent::new(u64::MAX, 1).is_err());
        assert!(Extent::from_range(5, 5).is_err());
        let a = Extent::new(0, 10).unwrap();
        let b = Extent::new(10, 5).unwrap();
        assert!(!a.overlaps(&b));
        assert!(a.intersection(&b).is_none());
        let c = Extent::new(9, 2).unwrap();
        assert!(a.overlaps(&c) && b.overlaps(&c));
        assert_eq!(a.intersection(&c), Some(Extent::new(9, 1).unwrap()));
        assert!(a.contains(&Extent::new(0, 10).unwrap()));
        assert!(!a.contains(&c));
        assert_eq!(
            format!("{}", Extent::new(3, 1).unwrap()),
            "blocks 3..4 (1 block)"
        );
    }
}
