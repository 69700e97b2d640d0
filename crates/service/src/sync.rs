//! The crate's one mutex helper.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning (every critical section leaves its
/// data consistent before anything in it can panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
