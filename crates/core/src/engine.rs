//! [`EngineKind`]: every engine by name, for tools that choose one at run time.

use std::fmt;
use std::str::FromStr;

use crate::error::{BuildError, Error};
use crate::{
    Allocator, BitmapAllocator, Extent, FromFreeExtents, GroupsAllocator, PoolAllocator,
    SegFitAllocator,
};

/// The engines of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum EngineKind {
    /// [`SegFitAllocator`], the recommended engine.
    #[default]
    SegFit,
    /// [`BitmapAllocator`], seed method 1.
    Bitmap,
    /// [`GroupsAllocator`], seed method 2.
    Groups,
    /// [`PoolAllocator`], seed method 3.
    Pool,
}

impl EngineKind {
    /// Every engine, recommended first.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::SegFit,
        EngineKind::Bitmap,
        EngineKind::Groups,
        EngineKind::Pool,
    ];

    /// The name `bench --engine` uses.
    pub const fn name(self) -> &'static str {
        match self {
            EngineKind::SegFit => SegFitAllocator::NAME,
            EngineKind::Bitmap => BitmapAllocator::NAME,
            EngineKind::Groups => GroupsAllocator::NAME,
            EngineKind::Pool => PoolAllocator::NAME,
        }
    }

    /// All engine names.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|k| k.name()).collect()
    }

    /// A fresh engine over `capacity` blocks, all free.
    ///
    /// # Errors
    /// [`BuildError`] for a zero or unsupported capacity.
    pub fn build(self, capacity: u64) -> Result<Box<dyn Allocator>, BuildError> {
        if capacity == 0 {
            return Err(BuildError::ZeroCapacity);
        }
        self.from_free_extents(capacity, &[Extent::new_unchecked(0, capacity)])
    }

    /// An engine over `capacity` blocks where exactly `free` is free.
    ///
    /// # Errors
    /// See [`FromFreeExtents::from_free_extents`].
    pub fn from_free_extents(
        self,
        capacity: u64,
        free: &[Extent],
    ) -> Result<Box<dyn Allocator>, BuildError> {
        Ok(match self {
            EngineKind::SegFit => Box::new(SegFitAllocator::from_free_extents(capacity, free)?),
            EngineKind::Bitmap => Box::new(BitmapAllocator::from_free_extents(capacity, free)?),
            EngineKind::Groups => Box::new(GroupsAllocator::from_free_extents(capacity, free)?),
            EngineKind::Pool => Box::new(PoolAllocator::from_free_extents(capacity, free)?),
        })
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::UnknownEngine {
                name: s.to_string(),
                known: Self::names(),
            })
    }
}
