//! The synchronisation primitives this crate uses, in one place, so that the
//! model-checking crate (`crates/shared-model`) can compile the same modules
//! against Shuttle's instrumented versions instead.

pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Mutex, MutexGuard, Weak};
pub(crate) use std::thread_local;

/// Locks `m`, ignoring poisoning: the engines never panic on input, and a
/// panic on an internal bug has already been reported by the thread that hit
/// it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
