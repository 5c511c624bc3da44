//! The locks taken around fork.
//!
//! A thread that forks while another holds one of our locks would leave the
//! child with a lock nobody can release. So the fork handler (process.rs)
//! takes every lock first and releases it on both sides after. The modules
//! that own such a lock (dirs.rs, stdio.rs) make it a `ForkMutex`, which
//! registers itself here the first time it is taken; the fork handler holds
//! whatever is registered. This module knows none of them: the arrows go
//! from the owners to here, and from process.rs to here, never back.
//!
//! A lock is registered before it is first taken, so none that anyone could
//! hold is missed. A thread registering waits for the fork in progress (the
//! registry itself is held across fork); it holds none of our locks then.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Something the fork handler can hold.
trait Holdable: Sync {
    fn hold(&'static self) -> Box<dyn Any>;
}

static REGISTRY: Mutex<Vec<&'static dyn Holdable>> = Mutex::new(Vec::new());

/// A mutex held by the fork handler (see the module docs).
pub struct ForkMutex<T: Send + 'static> {
    inner: Mutex<T>,
    // Not a `Once`: a thread stopped inside `call_once` by a fork would
    // leave the child's `Once` running forever.
    registered: AtomicBool,
}

impl<T: Send + 'static> ForkMutex<T> {
    pub const fn new(value: T) -> Self {
        ForkMutex {
            inner: Mutex::new(value),
            registered: AtomicBool::new(false),
        }
    }

    /// Take the lock (a poisoned lock is taken all the same: the data is
    /// plain tables, consistent between statements).
    pub fn lock(&'static self) -> MutexGuard<'static, T> {
        if !self.registered.load(Ordering::Acquire) {
            let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
            if !self.registered.load(Ordering::Acquire) {
                r.push(self);
                self.registered.store(true, Ordering::Release);
            }
        }
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: Send + 'static> Holdable for ForkMutex<T> {
    fn hold(&'static self) -> Box<dyn Any> {
        Box::new(self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Every registered lock, held until dropped.
pub struct HeldLocks {
    // Dropped in this order: the locks, then the registry.
    _locks: Vec<Box<dyn Any>>,
    _registry: MutexGuard<'static, Vec<&'static dyn Holdable>>,
}

/// Take every registered lock (in the order they were registered) and the
/// registry itself.
pub fn hold_all() -> HeldLocks {
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let locks = registry.iter().map(|l| l.hold()).collect();
    HeldLocks {
        _locks: locks,
        _registry: registry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: ForkMutex<u32> = ForkMutex::new(0);

    #[test]
    fn held_locks_are_the_registered_ones() {
        *A.lock() += 1;
        let held = hold_all();
        assert!(A.inner.try_lock().is_err());
        drop(held);
        assert_eq!(*A.lock(), 1);
    }
}
