//! Model checking of `blockalloc-shared` with [Shuttle](https://docs.rs/shuttle).
//!
//! This crate compiles the *same source files* as `blockalloc-shared`
//! (through `#[path]`), with one difference: its `sync` module hands them
//! Shuttle's instrumented mutexes, atomics and thread-locals instead of
//! std's. Every lock and atomic of the shipped code then becomes a point
//! where Shuttle's scheduler may switch threads, and `tests/handoff.rs`
//! explores many interleavings of leasing, freeing across threads, handing
//! regions back and reclaiming.

#![allow(dead_code, missing_docs)]

#[path = "../../shared/src/arena.rs"]
mod arena;
#[path = "../../shared/src/config.rs"]
mod config;
#[path = "../../shared/src/regions.rs"]
mod regions;
#[path = "../../shared/src/shared.rs"]
mod shared;

mod sync {
    pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    pub(crate) use shuttle::sync::{Arc, Mutex, MutexGuard, Weak};
    pub(crate) use shuttle::thread_local;

    pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub use config::{ConfigError, SharedConfig, MAX_ARENAS, MAX_REGIONS};
pub use shared::{SharedAllocator, SharedStats};
