//! # blockalloc
//!
//! Space allocators for storage systems that keep lots of small objects
//! (0–4 MiB) on big block devices or preallocated files. An allocator hands
//! out [`Extent`]s of blocks, takes them back, and can check its own
//! invariants.
//!
//! * [`SegFitAllocator`] (`segfit`) is the engine to use: a best fit
//!   (shortest fitting extent, lowest address) in O(log n), that keeps freed
//!   fragments whole for their exact requests within a bound of 1/1024 of
//!   the device; immediate merging of free neighbours, double-free
//!   detection, memory proportional to the number of free extents.
//! * [`BitmapAllocator`], [`GroupsAllocator`] and [`PoolAllocator`] are the
//!   three methods of the original design notes, kept as honest baselines.
//!
//! This crate is pure in-memory data structures: no I/O, no threads.
//!
//! ```
//! use blockalloc::{Allocator, FromFreeExtents, SegFitAllocator, Geometry};
//!
//! let geo = Geometry::parse("1GiB", "4KiB")?;
//! let mut a = SegFitAllocator::with_capacity(geo.capacity_blocks())?;
//!
//! // A 1 MiB object: 256 contiguous blocks.
//! let obj = a.allocate(geo.blocks_for_bytes(1 << 20), None)?;
//! assert_eq!(obj.len(), 256);
//!
//! // The next object of the same stream lands right after it.
//! let next = a.allocate(16, Some(obj.end()))?;
//! assert_eq!(next.start(), obj.end());
//!
//! // Freeing merges with free neighbours at once; a double free is refused.
//! a.free(obj)?;
//! assert!(a.free(obj).is_err());
//! a.free(next)?;
//! assert_eq!(a.status().free_extents, 1);
//! a.verify()?;
//! # Ok::<(), blockalloc::Error>(())
//! ```

mod allocator;
mod bitmap;
mod bits;
mod class;
mod engine;
mod error;
mod extent;
mod extent_set;
mod geometry;
mod groups;
mod pool;
mod segfit;

pub use allocator::{
    check_alloc, check_free_list, fragmentation_score, Allocator, FromFreeExtents, Status,
    StatusBuilder, FRAGMENTATION_REFERENCE_BLOCKS,
};
pub use bitmap::BitmapAllocator;
pub use class::ErrorClass;
pub use engine::EngineKind;
pub use error::{AllocError, BuildError, Error, FreeError, GeometryError, VerifyError};
pub use extent::{Extent, ExtentError};
pub use extent_set::ExtentSet;
pub use geometry::{ByteSize, Geometry};
pub use groups::{GroupsAllocator, GROUP_BLOCKS};
pub use pool::{CompactStats, PoolAllocator, FASTBIN_MAX};
pub use segfit::SegFitAllocator;
