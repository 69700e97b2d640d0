//! The [`Allocator`] trait every engine implements, and [`Status`].

use crate::error::{AllocError, BuildError, FreeError, VerifyError};
use crate::Extent;

/// Free extents shorter than this many blocks count as fragmented in
/// [`Status::fragmentation`]: 1024 blocks is 4 MiB with 4 KiB blocks, the
/// largest object of the workloads blockalloc is built for.
pub const FRAGMENTATION_REFERENCE_BLOCKS: u64 = 1024;

/// A snapshot of an allocator's space accounting.
///
/// Invariant: `used_blocks + free_blocks == capacity_blocks`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Status {
    /// Blocks on the device.
    pub capacity_blocks: u64,
    /// Blocks handed out and not yet freed.
    pub used_blocks: u64,
    /// Blocks free.
    pub free_blocks: u64,
    /// Number of maximal free runs (adjacent free blocks count as one run,
    /// whether or not the engine has merged them internally).
    pub free_extents: u64,
    /// Length of the longest free run, in blocks.
    pub largest_free_extent: u64,
    /// Fragmentation score in `[0, 1]`, see [`fragmentation_score`].
    pub fragmentation: f64,
}

impl Status {
    /// `used / capacity`.
    pub fn utilization(&self) -> f64 {
        self.used_blocks as f64 / self.capacity_blocks as f64
    }
}

/// Accumulates [`Status`] fields over the free runs of an engine.
///
/// Feed it every maximal free run in address order with [`push`](Self::push);
/// adjacent runs are merged, so engines that keep unmerged fragments report
/// the same numbers as engines that merge.
#[derive(Debug)]
pub struct StatusBuilder {
    capacity: u64,
    free: u64,
    runs: u64,
    largest: u64,
    weighted: u128,
    pending: Option<(u64, u64)>,
}

impl StatusBuilder {
    /// Starts an empty accumulation for a device of `capacity` blocks.
    pub fn new(capacity: u64) -> Self {
        StatusBuilder {
            capacity,
            free: 0,
            runs: 0,
            largest: 0,
            weighted: 0,
            pending: None,
        }
    }

    /// Adds one free extent; extents must arrive in address order.
    pub fn push(&mut self, e: Extent) {
        match self.pending {
            Some((s, end)) if end == e.start() => self.pending = Some((s, e.end())),
            Some((s, end)) => {
                self.close(end - s);
                self.pending = Some((e.start(), e.end()));
            }
            None => self.pending = Some((e.start(), e.end())),
        }
    }

    fn close(&mut self, len: u64) {
        self.free += len;
        self.runs += 1;
        self.largest = self.largest.max(len);
        self.weighted += len as u128 * len.min(FRAGMENTATION_REFERENCE_BLOCKS) as u128;
    }

    /// The finished status.
    pub fn finish(mut self) -> Status {
        if let Some((s, e)) = self.pending.take() {
            self.close(e - s);
        }
        Status {
            capacity_blocks: self.capacity,
            used_blocks: self.capacity - self.free,
            free_blocks: self.free,
            free_extents: self.runs,
            largest_free_extent: self.largest,
            fragmentation: score(self.weighted, self.free),
        }
    }
}

fn score(weighted: u128, free: u64) -> f64 {
    if free == 0 {
        return 0.0;
    }
    let ideal = free as u128 * FRAGMENTATION_REFERENCE_BLOCKS as u128;
    (1.0 - weighted as f64 / ideal as f64).clamp(0.0, 1.0)
}

/// The fragmentation score of a set of free runs (lengths in blocks).
///
/// `1 − Σ len·min(len, R) / (R · Σ len)` with `R` =
/// [`FRAGMENTATION_REFERENCE_BLOCKS`]: each free block is weighted by how
/// close its run comes to holding a maximum-size object. The score is `0`
/// when every free run is at least `R` blocks long (or nothing is free), and
/// approaches `1` when free space is shattered into single blocks. A run of
/// `R/2` blocks counts half.
///
/// ```
/// use blockalloc::fragmentation_score;
/// assert_eq!(fragmentation_score([5000u64]), 0.0);
/// assert_eq!(fragmentation_score([512u64, 512]), 0.5);
/// assert!(fragmentation_score([1u64; 100]) > 0.99);
/// ```
pub fn fragmentation_score(runs: impl IntoIterator<Item = u64>) -> f64 {
    let (mut w, mut f) = (0u128, 0u64);
    for len in runs {
        w += len as u128 * len.min(FRAGMENTATION_REFERENCE_BLOCKS) as u128;
        f += len;
    }
    score(w, f)
}

/// A space allocator over a device of `capacity()` blocks.
///
/// All engines share these semantics (the conformance suite checks them):
///
/// * On any `Err`, the allocator is unchanged.
/// * `allocate(n, hint)` returns one extent of exactly `n` blocks. The hint is
///   a block number (at most `capacity()`) the caller would like the extent
///   to start at or near, e.g. the end of its previous extent; engines may
///   ignore it.
/// * `allocate_scattered(n, out)` appends extents totalling exactly `n`
///   blocks to `out`, or appends nothing and fails. Engines document how hard
///   they try to use few extents.
/// * `free(e)` accepts any allocated extent, including part of an earlier
///   allocation or a union of adjacent ones. It refuses, with
///   [`FreeError::NotAllocated`], an extent any block of which is free.
pub trait Allocator: Send {
    /// The engine's name as `bench --engine` spells it.
    fn name(&self) -> &'static str;

    /// Device size in blocks.
    fn capacity(&self) -> u64;

    /// Blocks currently allocated. O(1).
    fn used(&self) -> u64;

    /// Allocates `len` contiguous blocks, near `hint` if the engine can.
    ///
    /// # Errors
    /// [`AllocError::ZeroLength`], [`AllocError::NoSpace`] when no free run
    /// long enough is found, [`AllocError::HintOutOfRange`].
    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError>;

    /// Allocates `len` blocks in one or more extents, appended to `out`.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate); `out` is left as it was.
    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError>;

    /// Returns `extent` to free space.
    ///
    /// # Errors
    /// [`FreeError::OutOfRange`] or [`FreeError::NotAllocated`].
    fn free(&mut self, extent: Extent) -> Result<(), FreeError>;

    /// Space accounting. May cost a pass over the engine's free-space
    /// structures; use [`used`](Self::used) on hot paths.
    fn status(&self) -> Status;

    /// Bytes of memory the engine holds (its own structures, capacity not
    /// length).
    fn memory_bytes(&self) -> usize;

    /// Calls `f` with free extents in increasing address order, each one
    /// disjoint from and not touching the previous one (maximal runs).
    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent));

    /// Checks every invariant of the engine's structures.
    ///
    /// # Errors
    /// A [`VerifyError`] saying what broke. That is always a bug in the engine.
    fn verify(&self) -> Result<(), VerifyError>;

    /// All free extents in address order (maximal runs).
    fn free_extents(&self) -> Vec<Extent> {
        let mut v = Vec::new();
        self.for_each_free_extent(&mut |e| v.push(e));
        v
    }
}

/// Engines that can be rebuilt from a list of free extents (the durable store
/// restores engines this way).
pub trait FromFreeExtents: Sized {
    /// Builds an engine over `capacity` blocks where exactly the blocks of
    /// `free` are free. `free` must be sorted by address and disjoint; adjacent
    /// extents are allowed and are merged.
    ///
    /// # Errors
    /// [`BuildError`] for a zero or unsupported capacity, or a list that is
    /// unsorted, overlapping or out of range.
    fn from_free_extents(capacity: u64, free: &[Extent]) -> Result<Self, BuildError>;

    /// A fresh engine with the whole device free.
    ///
    /// # Errors
    /// As [`from_free_extents`](Self::from_free_extents).
    fn with_capacity(capacity: u64) -> Result<Self, BuildError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity);
        }
        Self::from_free_extents(capacity, &[Extent::new_unchecked(0, capacity)])
    }
}

/// Checks a list of free extents for [`FromFreeExtents`]: a capacity above
/// zero, extents inside it, sorted by address and disjoint (adjacent ones
/// are allowed). Engines outside this crate call it too, so that every
/// engine refuses the same lists the same way.
///
/// # Errors
/// [`BuildError::ZeroCapacity`], [`BuildError::OutOfRange`] or
/// [`BuildError::NotSortedOrOverlapping`] for the first extent at fault.
pub fn check_free_list(capacity: u64, free: &[Extent]) -> Result<(), BuildError> {
    if capacity == 0 {
        return Err(BuildError::ZeroCapacity);
    }
    let mut prev: Option<Extent> = None;
    for &e in free {
        if e.end() > capacity {
            return Err(BuildError::OutOfRange {
                extent: e,
                capacity,
            });
        }
        if let Some(p) = prev {
            if e.start() < p.end() {
                return Err(BuildError::NotSortedOrOverlapping {
                    previous: p,
                    next: e,
                });
            }
        }
        prev = Some(e);
    }
    Ok(())
}

/// Checks the bounds of a free request.
#[inline]
pub(crate) fn check_free_range(capacity: u64, extent: Extent) -> Result<(), FreeError> {
    if extent.end() > capacity {
        return Err(FreeError::OutOfRange { extent, capacity });
    }
    Ok(())
}

/// Checks an allocation request's length and hint against the contract
/// every engine keeps: [`AllocError::ZeroLength`] for a zero length,
/// [`AllocError::HintOutOfRange`] for a hint past `capacity` (the capacity
/// itself is a valid hint). Engines outside this crate call it too, so that
/// every engine refuses the same requests the same way.
///
/// # Errors
/// As above.
#[inline]
pub fn check_alloc(capacity: u64, len: u64, hint: Option<u64>) -> Result<(), AllocError> {
    if len == 0 {
        return Err(AllocError::ZeroLength);
    }
    if let Some(h) = hint {
        // `capacity` itself is allowed: it is the end of an extent that
        // reaches the end of the device.
        if h > capacity {
            return Err(AllocError::HintOutOfRange { hint: h, capacity });
        }
    }
    Ok(())
}
