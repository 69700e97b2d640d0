//! `pool-compact`: the original notes' pooling allocator with its proposed fix,
//! offline compaction, run whenever an allocation fails.
//!
//! The note suggests merging adjacent fragments "offline" when a workload
//! shift strands free space in the wrong bins. This engine does exactly
//! that, as late as possible: an allocation that fails triggers
//! [`PoolAllocator::compact`] (O(f log f) over all fragments, counted in the
//! allocation's time) and is retried once. It shows what compaction buys and
//! what it costs, next to `pool` without it and `segfit`, which never needs it.

use blockalloc::{
    AllocError, Allocator, BuildError, Extent, FreeError, FromFreeExtents, PoolAllocator, Status,
    VerifyError,
};

/// [`PoolAllocator`] that compacts and retries when an allocation fails.
#[derive(Debug)]
pub struct CompactingPool {
    pool: PoolAllocator,
    compactions: u64,
}

impl CompactingPool {
    /// Engine name.
    pub const NAME: &'static str = "pool-compact";

    /// A fresh device of `capacity` blocks.
    ///
    /// # Errors
    /// As [`PoolAllocator`]'s constructor.
    pub fn new(capacity: u64) -> Result<Self, BuildError> {
        Ok(CompactingPool {
            pool: PoolAllocator::with_capacity(capacity)?,
            compactions: 0,
        })
    }

    /// Compactions run so far.
    #[cfg(test)]
    fn compactions(&self) -> u64 {
        self.compactions
    }

    fn retry<T>(
        &mut self,
        mut f: impl FnMut(&mut PoolAllocator) -> Result<T, AllocError>,
    ) -> Result<T, AllocError> {
        match f(&mut self.pool) {
            Err(AllocError::NoSpace { .. }) => {
                self.compactions += 1;
                self.pool.compact();
                f(&mut self.pool)
            }
            r => r,
        }
    }
}

impl Allocator for CompactingPool {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn capacity(&self) -> u64 {
        self.pool.capacity()
    }
    fn used(&self) -> u64 {
        self.pool.used()
    }
    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        self.retry(|p| p.allocate(len, hint))
    }
    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        self.retry(|p| p.allocate_scattered(len, out))
    }
    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        self.pool.free(extent)
    }
    fn status(&self) -> Status {
        self.pool.status()
    }
    fn memory_bytes(&self) -> usize {
        self.pool.memory_bytes()
    }
    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        self.pool.for_each_free_extent(f);
    }
    fn verify(&self) -> Result<(), VerifyError> {
        self.pool.verify()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_then_retries() {
        let mut a = CompactingPool::new(2048).unwrap();
        let x: Vec<Extent> = (0..4).map(|_| a.allocate(512, None).unwrap()).collect();
        // Two adjacent 512-block fragments: a plain pool cannot serve 1024.
        a.free(x[1]).unwrap();
        a.free(x[2]).unwrap();
        let e = a.allocate(1024, None).unwrap();
        assert_eq!(e, Extent::new(512, 1024).unwrap());
        assert_eq!(a.compactions(), 1);
        a.verify().unwrap();
        // A real shortage still fails, after one more compaction.
        assert!(matches!(
            a.allocate(1, None),
            Err(AllocError::NoSpace { .. })
        ));
        assert_eq!(a.compactions(), 2);
    }
}
