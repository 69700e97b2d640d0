//! Typed errors. One enum per family of operations, all convertible into the
//! umbrella [`Error`]. Every message names the blocks involved so that a user
//! can act on it without reading the code.

use crate::extent::ExtentError;
use crate::{ErrorClass, Extent};

/// An allocation request could not be served. The allocator is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// A request for zero blocks.
    #[error("cannot allocate zero blocks")]
    ZeroLength,
    /// Not enough free space of the required shape.
    #[error(
        "no space: {requested} blocks requested, {free} blocks free, largest free extent {largest_free} blocks"
    )]
    NoSpace {
        /// Blocks requested.
        requested: u64,
        /// Blocks free in total (0 when the engine does not know it cheaply).
        free: u64,
        /// Longest free run the engine could offer (0 when unknown).
        largest_free: u64,
    },
    /// The hint names a block beyond the device.
    #[error("hint block {hint} is beyond the end of the device ({capacity} blocks)")]
    HintOutOfRange {
        /// The hint given.
        hint: u64,
        /// Device capacity in blocks.
        capacity: u64,
    },
}

/// A free request was refused. The allocator is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FreeError {
    /// The extent reaches past the end of the device.
    #[error("{extent} is out of range: the device has {capacity} blocks")]
    OutOfRange {
        /// The extent passed to `free`.
        extent: Extent,
        /// Device capacity in blocks.
        capacity: u64,
    },
    /// Part of the extent is already free: a double free, or a free of space
    /// that was never allocated.
    #[error("{extent} is not allocated: {overlap} is already free (double free?)")]
    NotAllocated {
        /// The extent passed to `free`.
        extent: Extent,
        /// A part of it that is already free.
        overlap: Extent,
    },
}

/// An engine could not be built from a list of free extents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The device has no blocks.
    #[error("capacity must be at least one block")]
    ZeroCapacity,
    /// The engine cannot address a device this large.
    #[error("{engine} supports at most {max} blocks, {capacity} requested")]
    CapacityTooLarge {
        /// Engine name.
        engine: &'static str,
        /// Largest supported capacity in blocks.
        max: u64,
        /// Requested capacity in blocks.
        capacity: u64,
    },
    /// The engine's structures for this capacity do not fit in memory.
    #[error("{engine} needs {bytes} bytes of memory for this capacity and could not get them")]
    OutOfMemory {
        /// Engine name.
        engine: &'static str,
        /// Bytes it tried to reserve.
        bytes: u64,
    },
    /// A free extent reaches past the end of the device.
    #[error("free {extent} is out of range: the device has {capacity} blocks")]
    OutOfRange {
        /// Offending extent.
        extent: Extent,
        /// Device capacity in blocks.
        capacity: u64,
    },
    /// The free extents are not in increasing address order, or overlap.
    #[error("free extents must be sorted and disjoint: {previous} is followed by {next}")]
    NotSortedOrOverlapping {
        /// The earlier extent in the list.
        previous: Extent,
        /// The extent after it.
        next: Extent,
    },
}

/// `verify()` found a broken invariant: a bug in the engine, never bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{engine}: invariant broken: {what}")]
pub struct VerifyError {
    /// Engine name.
    pub engine: &'static str,
    /// What broke, with the numbers involved.
    pub what: String,
}

impl VerifyError {
    pub(crate) fn new(engine: &'static str, what: impl Into<String>) -> Self {
        VerifyError {
            engine,
            what: what.into(),
        }
    }
}

/// A size or geometry could not be parsed or is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GeometryError {
    /// A size string did not parse.
    #[error("cannot parse size {input:?}: {reason} (examples: 4096, 4KiB, 16TiB, 1.5GiB)")]
    BadSize {
        /// The text given.
        input: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Block size is not a power of two between 512 B and 1 GiB.
    #[error("block size {0} bytes must be a power of two between 512 B and 1 GiB")]
    BadBlockSize(u64),
    /// Capacity is smaller than one block.
    #[error("capacity {capacity} bytes is smaller than one block of {block_size} bytes")]
    CapacityTooSmall {
        /// Capacity in bytes.
        capacity: u64,
        /// Block size in bytes.
        block_size: u64,
    },
}

/// Any error of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// See [`ExtentError`].
    #[error(transparent)]
    Extent(#[from] ExtentError),
    /// See [`AllocError`].
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// See [`FreeError`].
    #[error(transparent)]
    Free(#[from] FreeError),
    /// See [`BuildError`].
    #[error(transparent)]
    Build(#[from] BuildError),
    /// See [`VerifyError`].
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// See [`GeometryError`].
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// An engine name that does not exist.
    #[error("unknown engine {name:?} (known: {known})", known = .known.join(", "))]
    UnknownEngine {
        /// The name given.
        name: String,
        /// The engines' names.
        known: Vec<&'static str>,
    },
}

impl AllocError {
    /// The class of this error: [`ErrorClass::NoSpace`] for
    /// [`AllocError::NoSpace`], else [`ErrorClass::InvalidInput`].
    pub fn class(&self) -> ErrorClass {
        match self {
            AllocError::NoSpace { .. } => ErrorClass::NoSpace,
            AllocError::ZeroLength | AllocError::HintOutOfRange { .. } => ErrorClass::InvalidInput,
        }
    }
}

impl FreeError {
    /// The class of this error: [`ErrorClass::InvalidInput`] for an extent
    /// past the device, [`ErrorClass::Conflict`] for a free of free space.
    pub fn class(&self) -> ErrorClass {
        match self {
            FreeError::OutOfRange { .. } => ErrorClass::InvalidInput,
            FreeError::NotAllocated { .. } => ErrorClass::Conflict,
        }
    }
}

impl BuildError {
    /// The class of this error: [`ErrorClass::NoSpace`] when memory ran
    /// out, else [`ErrorClass::InvalidInput`].
    pub fn class(&self) -> ErrorClass {
        match self {
            BuildError::OutOfMemory { .. } => ErrorClass::NoSpace,
            BuildError::ZeroCapacity
            | BuildError::CapacityTooLarge { .. }
            | BuildError::OutOfRange { .. }
            | BuildError::NotSortedOrOverlapping { .. } => ErrorClass::InvalidInput,
        }
    }
}

impl VerifyError {
    /// The class of this error: always [`ErrorClass::Bug`].
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Bug
    }
}

crate::invalid_input_errors!(GeometryError);

impl Error {
    /// The class of this error (that of the wrapped error).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Extent(e) => e.class(),
            Error::Alloc(e) => e.class(),
            Error::Free(e) => e.class(),
            Error::Build(e) => e.class(),
            Error::Verify(e) => e.class(),
            Error::Geometry(e) => e.class(),
            Error::UnknownEngine { .. } => ErrorClass::InvalidInput,
        }
    }
}
