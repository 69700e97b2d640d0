//! # blockalloc-shared
//!
//! A thread-safe handle over the recommended engine,
//! [`SegFitAllocator`](blockalloc::SegFitAllocator), for storage servers that
//! allocate from many threads.
//!
//! One idea, reused at every level of blockalloc: **a big allocator hands
//! out regions; a small, fast, local allocator serves from a region.** Here
//! the device is cut into aligned regions; a pool owns those no thread has
//! leased; each thread allocates from its own arena (a cache of leased
//! regions) under a lock nobody else normally takes, and trades with the pool
//! a whole region at a time. Frees go to whichever arena owns the address,
//! so double frees are caught exactly, from any thread. Before an allocation
//! reports "no space", every arena's cached space is reclaimed and the
//! request retried; a thread that exits hands its space back.
//!
//! See [`SharedAllocator`] for an example and `docs/design.md` for the
//! protocol and its invariants.

mod arena;
mod config;
mod regions;
mod shared;
mod sync;

pub use config::{ConfigError, SharedConfig, MAX_ARENAS, MAX_REGIONS};
pub use shared::{SharedAllocator, SharedStats};
