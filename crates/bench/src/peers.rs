//! Peers: other crates' allocators behind [`blockalloc::Allocator`], so they
//! run in the same bench table (cargo feature `peers`).
//!
//! * `peer-offset-allocator` — [`offset_allocator`] 0.2, a Rust port of
//!   Sebastian Aaltonen's OffsetAllocator (TLSF-like: two-level bitmap over
//!   size bins, O(1) allocate and free with neighbour merging).
//! * `peer-range-alloc` — [`range_alloc`] 0.1 (gfx-rs), best fit over a
//!   sorted `Vec` of free ranges: O(free ranges) per operation.
//!
//! Both crates free by handle; our users free by extent. Each adapter keeps a
//! map `start block → (handle, length)`, and its cost is part of the peer's
//! measured time, which is fair: a storage system using the crate would need
//! the same map. Consequences, which differ from the core engines' contract:
//!
//! * A peer can only free **exactly** an extent it handed out. Part of an
//!   allocation, or a union of adjacent ones, is refused with
//!   [`FreeError::NotAllocated`] (with `overlap` set to the whole extent).
//! * `allocate_scattered` is all-or-nothing in a single extent.
//! * The hint of `allocate` is ignored.
//! * [`Allocator::memory_bytes`] is an **estimate** from capacities: the
//!   map's buckets plus the crate's own structures, whose layout is private.
//! * `status` and `for_each_free_extent` are computed from the map (the
//!   complement of the allocated extents), O(n log n) — the crates do not
//!   expose their free lists.

use std::ops::Range;

use blockalloc::{
    check_alloc, AllocError, Allocator, BuildError, Extent, FreeError, Status, StatusBuilder,
    VerifyError,
};
use offset_allocator::Allocation;
use range_alloc::RangeAllocator;

use blockalloc_trace::IdMap;

/// The peer allocators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKind {
    /// [`OffsetAllocatorPeer`].
    OffsetAllocator,
    /// [`RangeAllocPeer`].
    RangeAlloc,
}

impl PeerKind {
    /// Every peer.
    pub const ALL: [PeerKind; 2] = [PeerKind::OffsetAllocator, PeerKind::RangeAlloc];

    /// The name `bench --engine` uses.
    pub const fn name(self) -> &'static str {
        match self {
            PeerKind::OffsetAllocator => OffsetAllocatorPeer::NAME,
            PeerKind::RangeAlloc => RangeAllocPeer::NAME,
        }
    }

    /// A fresh peer over `capacity` blocks.
    ///
    /// # Errors
    /// As the adapters' constructors.
    pub fn build(self, capacity: u64) -> Result<Box<dyn Allocator>, BuildError> {
        Ok(match self {
            PeerKind::OffsetAllocator => Box::new(OffsetAllocatorPeer::new(capacity)?),
            PeerKind::RangeAlloc => Box::new(RangeAllocPeer::new(capacity)?),
        })
    }
}

fn extent(start: u64, len: u64) -> Extent {
    Extent::new(start, len).expect("a peer returned a non-empty range inside the device")
}

fn not_allocated(e: Extent) -> FreeError {
    FreeError::NotAllocated {
        extent: e,
        overlap: e,
    }
}

/// Calls `f` with the gaps between the (disjoint) allocated extents.
fn for_each_gap(capacity: u64, mut allocated: Vec<(u64, u64)>, f: &mut dyn FnMut(Extent)) {
    allocated.sort_unstable();
    let mut pos = 0;
    for (start, len) in allocated {
        if start > pos {
            f(extent(pos, start - pos));
        }
        pos = pos.max(start + len);
    }
    if pos < capacity {
        f(extent(pos, capacity - pos));
    }
}

/// Checks the adapter map: extents in range, disjoint, lengths summing to
/// `used`. Returns the extents sorted.
fn verify_map(
    name: &'static str,
    capacity: u64,
    used: u64,
    mut allocated: Vec<(u64, u64)>,
) -> Result<Vec<(u64, u64)>, VerifyError> {
    let err = |what: String| VerifyError { engine: name, what };
    allocated.sort_unstable();
    let mut sum = 0u64;
    let mut prev_end = 0u64;
    for &(start, len) in &allocated {
        match start.checked_add(len) {
            Some(end) if len > 0 && end <= capacity => {}
            _ => {
                return Err(err(format!(
                    "allocation {start}+{len} is out of the device ({capacity} blocks)"
                )))
            }
        }
        if start < prev_end {
            return Err(err(format!(
                "allocation at {start} overlaps the one ending at {prev_end}"
            )));
        }
        prev_end = start + len;
        sum += len;
    }
    if sum != used {
        return Err(err(format!(
            "used counter {used} != {sum} blocks in the allocation map"
        )));
    }
    Ok(allocated)
}

fn status_from(a: &dyn Allocator) -> Status {
    let mut b = StatusBuilder::new(a.capacity());
    a.for_each_free_extent(&mut |e| b.push(e));
    b.finish()
}

/// Bytes per bucket of an [`IdMap`] holding `V`: key, value, control byte.
const fn map_bucket_bytes<V>() -> usize {
    8 + std::mem::size_of::<V>() + 1
}

/// `peer-offset-allocator`: [`offset_allocator::Allocator`] over block
/// units.
///
/// The crate counts in `u32` units, so devices are limited to
/// [`Self::MAX_CAPACITY`] blocks (16 TiB − 4 KiB with 4 KiB blocks). It
/// preallocates a fixed node pool of `max_allocs` nodes (one per live
/// allocation or free region) and fails allocations when the pool runs out;
/// the adapter sizes the pool at one node per 64 blocks (at least 64 Ki),
/// enough when objects average more than ~128 blocks.
pub struct OffsetAllocatorPeer {
    inner: offset_allocator::Allocator<u32>,
    capacity: u64,
    max_allocs: u32,
    /// Invariant: `used == Σ len over live`.
    used: u64,
    live: IdMap<(Allocation<u32>, u64)>,
}

/// Size of one `offset_allocator` node (`u32` offset and size, four optional
/// `NonMaxU32` links, a flag) plus its free-list slot: the crate keeps both
/// private, so this is derived from its source.
const OFFSET_ALLOCATOR_NODE_BYTES: usize = 28 + 4;

impl OffsetAllocatorPeer {
    /// The engine name.
    pub const NAME: &'static str = "peer-offset-allocator";

    /// Largest device the crate can manage, in blocks.
    pub const MAX_CAPACITY: u64 = u32::MAX as u64;

    /// A fresh allocator over `capacity` blocks.
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`], or [`BuildError::CapacityTooLarge`]
    /// beyond [`Self::MAX_CAPACITY`].
    pub fn new(capacity: u64) -> Result<Self, BuildError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity);
        }
        let size = u32::try_from(capacity).map_err(|_| BuildError::CapacityTooLarge {
            engine: Self::NAME,
            max: Self::MAX_CAPACITY,
            capacity,
        })?;
        // The crate requires max_allocs < u32::MAX - 1.
        let max_allocs = (size / 64).clamp(64 * 1024, u32::MAX - 2);
        Ok(OffsetAllocatorPeer {
            inner: offset_allocator::Allocator::with_max_allocs(size, max_allocs),
            capacity,
            max_allocs,
            used: 0,
            live: IdMap::default(),
        })
    }

    fn allocated(&self) -> Vec<(u64, u64)> {
        self.live.iter().map(|(&s, &(_, len))| (s, len)).collect()
    }
}

impl Allocator for OffsetAllocatorPeer {
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
        check_alloc(self.capacity, len, hint)?;
        let no_space = |s: &Self| AllocError::NoSpace {
            requested: len,
            free: s.capacity - s.used,
            largest_free: s.inner.storage_report().largest_free_region as u64,
        };
        let Some(size) = u32::try_from(len)
            .ok()
            .filter(|&n| n as u64 <= self.capacity)
        else {
            return Err(no_space(self));
        };
        let Some(a) = self.inner.allocate(size) else {
            return Err(no_space(self));
        };
        let start = a.offset as u64;
        self.live.insert(start, (a, len));
        self.used += len;
        Ok(extent(start, len))
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        out.push(self.allocate(len, None)?);
        Ok(())
    }

    fn free(&mut self, e: Extent) -> Result<(), FreeError> {
        if e.end() > self.capacity {
            return Err(FreeError::OutOfRange {
                extent: e,
                capacity: self.capacity,
            });
        }
        match self.live.get(&e.start()) {
            Some(&(a, len)) if len == e.len() => {
                self.live.remove(&e.start());
                self.inner.free(a);
                self.used -= len;
                Ok(())
            }
            _ => Err(not_allocated(e)),
        }
    }

    fn status(&self) -> Status {
        status_from(self)
    }

    fn memory_bytes(&self) -> usize {
        self.max_allocs as usize * OFFSET_ALLOCATOR_NODE_BYTES
            + self.live.capacity() * map_bucket_bytes::<(Allocation<u32>, u64)>()
    }

    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        for_each_gap(self.capacity, self.allocated(), f);
    }

    fn verify(&self) -> Result<(), VerifyError> {
        verify_map(Self::NAME, self.capacity, self.used, self.allocated())?;
        // The crate reports zero free space when its node pool is exhausted.
        let reported = self.inner.storage_report().total_free_space as u64;
        let free = self.capacity - self.used;
        if reported != free && reported != 0 {
            return Err(VerifyError {
                engine: Self::NAME,
                what: format!("crate reports {reported} free blocks, adapter counts {free}"),
            });
        }
        Ok(())
    }
}

/// `peer-range-alloc`: [`range_alloc::RangeAllocator`] over block numbers.
/// Best fit by a linear scan of a sorted `Vec` of free ranges, so each
/// operation costs O(free ranges): expect it to slow down badly as free
/// space fragments (the bench's time limit is checked inside rounds for such
/// engines).
pub struct RangeAllocPeer {
    inner: RangeAllocator<u64>,
    capacity: u64,
    /// Invariant: `used == Σ len over live`.
    used: u64,
    live: IdMap<u64>,
}

impl RangeAllocPeer {
    /// The engine name.
    pub const NAME: &'static str = "peer-range-alloc";

    /// A fresh allocator over `capacity` blocks.
    ///
    /// # Errors
    /// [`BuildError::ZeroCapacity`].
    pub fn new(capacity: u64) -> Result<Self, BuildError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity);
        }
        Ok(RangeAllocPeer {
            inner: RangeAllocator::new(0..capacity),
            capacity,
            used: 0,
            live: IdMap::default(),
        })
    }

    fn allocated(&self) -> Vec<(u64, u64)> {
        self.live.iter().map(|(&s, &len)| (s, len)).collect()
    }
}

impl Allocator for RangeAllocPeer {
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
        check_alloc(self.capacity, len, hint)?;
        let no_space = |free| AllocError::NoSpace {
            requested: len,
            free,
            largest_free: 0,
        };
        if len > self.capacity - self.used {
            return Err(no_space(self.capacity - self.used));
        }
        match self.inner.allocate_range(len) {
            Ok(r) => {
                self.live.insert(r.start, len);
                self.used += len;
                Ok(extent(r.start, len))
            }
            Err(e) => Err(no_space(e.fragmented_free_length)),
        }
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        out.push(self.allocate(len, None)?);
        Ok(())
    }

    fn free(&mut self, e: Extent) -> Result<(), FreeError> {
        if e.end() > self.capacity {
            return Err(FreeError::OutOfRange {
                extent: e,
                capacity: self.capacity,
            });
        }
        match self.live.get(&e.start()) {
            Some(&len) if len == e.len() => {
                self.live.remove(&e.start());
                self.inner.free_range(e.start()..e.end());
                self.used -= len;
                Ok(())
            }
            _ => Err(not_allocated(e)),
        }
    }

    fn status(&self) -> Status {
        status_from(self)
    }

    fn memory_bytes(&self) -> usize {
        // Free ranges are about as many as maximal allocated runs, plus one.
        let free_ranges = self.inner.allocated_ranges().count() + 1;
        free_ranges * std::mem::size_of::<Range<u64>>()
            + self.live.capacity() * map_bucket_bytes::<u64>()
    }

    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        for_each_gap(self.capacity, self.allocated(), f);
    }

    fn verify(&self) -> Result<(), VerifyError> {
        let err = |what: String| VerifyError {
            engine: Self::NAME,
            what,
        };
        let sorted = verify_map(Self::NAME, self.capacity, self.used, self.allocated())?;
        let available = self.inner.total_available();
        if available != self.capacity - self.used {
            return Err(err(format!(
                "crate reports {available} free blocks, adapter counts {}",
                self.capacity - self.used
            )));
        }
        // The crate's allocated runs must be the adapter's extents, merged.
        let mut merged: Vec<Range<u64>> = Vec::new();
        for (s, len) in sorted {
            match merged.last_mut() {
                Some(r) if r.end == s => r.end = s + len,
                _ => merged.push(s..s + len),
            }
        }
        if !self.inner.allocated_ranges().eq(merged.iter().cloned()) {
            return Err(err(
                "crate's allocated ranges differ from the adapter's map".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(capacity: u64) -> Vec<Box<dyn Allocator>> {
        PeerKind::ALL
            .iter()
            .map(|k| k.build(capacity).unwrap())
            .collect()
    }

    #[test]
    fn allocate_free_by_extent() {
        for mut a in peers(1000) {
            let x = a.allocate(100, None).unwrap();
            let y = a.allocate(50, Some(1000)).unwrap();
            assert!(!x.overlaps(&y));
            assert_eq!(a.used(), 150);
            a.verify().unwrap();
            let st = a.status();
            assert_eq!(st.free_blocks, 850);
            assert_eq!(st.used_blocks + st.free_blocks, 1000);
            // Part of an allocation, a double free, out of range.
            let part = Extent::new(x.start(), 10).unwrap();
            assert!(matches!(a.free(part), Err(FreeError::NotAllocated { .. })));
            a.free(x).unwrap();
            assert!(matches!(a.free(x), Err(FreeError::NotAllocated { .. })));
            assert!(matches!(
                a.free(Extent::new(990, 20).unwrap()),
                Err(FreeError::OutOfRange { .. })
            ));
            a.free(y).unwrap();
            assert_eq!(a.used(), 0);
            assert_eq!(a.free_extents(), vec![Extent::new(0, 1000).unwrap()]);
            a.verify().unwrap();
        }
    }

    #[test]
    fn errors_and_scattered() {
        for mut a in peers(64) {
            assert_eq!(a.allocate(0, None), Err(AllocError::ZeroLength));
            assert!(matches!(
                a.allocate(1, Some(65)),
                Err(AllocError::HintOutOfRange { .. })
            ));
            assert!(matches!(
                a.allocate(65, None),
                Err(AllocError::NoSpace { .. })
            ));
            let mut out = Vec::new();
            a.allocate_scattered(64, &mut out).unwrap();
            assert_eq!(out.len(), 1);
            assert!(a.allocate_scattered(1, &mut out).is_err());
            assert_eq!(out.len(), 1);
            assert!(a.memory_bytes() > 0);
            a.verify().unwrap();
        }
    }

    #[test]
    fn offset_allocator_refuses_large_devices() {
        let err = OffsetAllocatorPeer::new(1 << 32).err().unwrap();
        assert!(matches!(err, BuildError::CapacityTooLarge { .. }));
        assert!(err.to_string().contains("peer-offset-allocator"));
        assert!(OffsetAllocatorPeer::new(0).is_err());
        assert!(RangeAllocPeer::new(0).is_err());
        assert!(RangeAllocPeer::new(1 << 40).is_ok());
    }
}
