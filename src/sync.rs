//! Lock helpers shared by every module that keeps state behind a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the value even if a thread panicked while holding it.
///
/// tgsync's mutexes guard whole values that are replaced, never half-updated, so a
/// poisoned lock still holds a consistent one; refusing it would turn one panic into a
/// stuck container.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
