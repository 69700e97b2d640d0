//! `bitmap`: one bitmap over the whole device, first fit (seed method 1).
//!
//! * allocate: scan from the lowest possibly-free block for the first run of
//!   `n` clear bits. Cost grows with the allocated prefix and the number of
//!   holes in it: this is the baseline that collapses as the device fills.
//! * allocate_scattered: take clear runs in address order (first fit) until
//!   `n` blocks are gathered; no attempt to use few extents.
//! * free: check that every bit is set (double-free detection costs one pass
//!   over the extent's words, nothing extra), then clear them.
//!
//! Memory: one bit per block (64 MiB for 2 TiB of 4 KiB blocks).
//!
//! Invariants: `used == popcount(bits)`; every block below `lowest_free` is
//! allocated.

use crate::allocator::{check_alloc, check_free_list};
use crate::bits::Bitmap;
use crate::error::{AllocError, BuildError, FreeError, VerifyError};
use crate::{Allocator, Extent, FromFreeExtents, Status, StatusBuilder};

/// Seed method 1: a single bitmap with first-fit search.
#[derive(Debug, Clone)]
pub struct BitmapAllocator {
    bits: Bitmap,
    used: u64,
    /// Every block below this one is allocated (a search shortcut that does
    /// not change first-fit results).
    lowest_free: u64,
}

impl BitmapAllocator {
    /// Engine name.
    pub const NAME: &'static str = "bitmap";

    fn no_space(&self, requested: u64) -> AllocError {
        AllocError::NoSpace {
            requested,
            free: self.bits.len() - self.used,
            largest_free: 0,
        }
    }

    fn advance_lowest(&mut self) {
        self.lowest_free = self
            .bits
            .find(false, self.lowest_free, self.bits.len())
            .unwrap_or(self.bits.len());
    }
}

impl FromFreeExtents for BitmapAllocator {
    fn from_free_extents(capacity: u64, free: &[Extent]) -> Result<Self, BuildError> {
        check_free_list(capacity, free)?;
        let mut bits = Bitmap::try_new(capacity, Self::NAME)?;
        bits.set_range(0, capacity);
        let mut free_blocks = 0;
        for e in free {
            bits.clear_range(e.start(), e.end());
            free_blocks += e.len();
        }
        let mut a = BitmapAllocator {
            bits,
            used: capacity - free_blocks,
            lowest_free: 0,
        };
        a.advance_lowest();
        Ok(a)
    }
}

impl Allocator for BitmapAllocator {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn capacity(&self) -> u64 {
        self.bits.len()
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        let cap = self.bits.len();
        check_alloc(cap, len, hint)?;
        if len > cap - self.used {
            return Err(self.no_space(len));
        }
        let start = self
            .bits
            .find_clear_run(len, self.lowest_free, cap)
            .ok_or_else(|| self.no_space(len))?;
        self.bits.set_range(start, start + len);
        self.used += len;
        if start == self.lowest_free {
            self.advance_lowest();
        }
        Ok(Extent::new_unchecked(start, len))
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        let cap = self.bits.len();
        check_alloc(cap, len, None)?;
        if len > cap - self.used {
            return Err(self.no_space(len));
        }
        let first = out.len();
        let got = self.bits.gather_clear_runs(self.lowest_free, cap, len, out);
        assert_eq!(got, len, "free counter says enough blocks are clear");
        for e in &out[first..] {
            self.bits.set_range(e.start(), e.end());
        }
        self.used += len;
        self.advance_lowest();
        Ok(())
    }

    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        self.bits.check_free(extent)?;
        self.bits.clear_range(extent.start(), extent.end());
        self.used -= extent.len();
        self.lowest_free = self.lowest_free.min(extent.start());
        Ok(())
    }

    fn status(&self) -> Status {
        let mut b = StatusBuilder::new(self.capacity());
        self.for_each_free_extent(&mut |e| b.push(e));
        b.finish()
    }

    fn memory_bytes(&self) -> usize {
        self.bits.memory_bytes()
    }

    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        self.bits
            .for_each_clear_run(self.lowest_free, self.bits.len(), f);
    }

    fn verify(&self) -> Result<(), VerifyError> {
        let cap = self.bits.len();
        let ones = self.bits.count_ones(0, cap);
        if ones != self.used {
            return Err(VerifyError::new(
                Self::NAME,
                format!("used counter {} but {} bits set", self.used, ones),
            ));
        }
        if self.bits.count_ones(0, self.lowest_free) != self.lowest_free {
            return Err(VerifyError::new(
                Self::NAME,
                format!("a block below lowest_free {} is free", self.lowest_free),
            ));
        }
        Ok(())
    }
}
