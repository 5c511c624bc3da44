//! What find's two in-memory copies (dentry_index.rs, inode_index.rs)
//! share: the memory budget they split, and the slot each copy lives in.
//! A copy is dropped for good on the first sign it may be wrong or too big
//! (past the budget, a malformed record, a read error, a panic under its
//! lock); its slot then gives its share of the budget back and logs why,
//! and find reads RocksDB instead: slower, never wrong.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Which copy a share of the budget belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    Dentries,
    Inodes,
}

/// The memory the dentry and inode copies may hold together
/// (`--find-index-mib`). Each copy records its own size here after every
/// change. The dentry copy comes first (every find scans it; only finds on
/// attributes read inodes): it is dropped only when it alone passes the
/// limit, and when it grows into the inode copy's room the inode copy is
/// dropped instead. The inode copy is dropped when the two pass the limit.
pub(crate) struct Budget {
    limit: usize,
    dentry_bytes: AtomicUsize,
    inode_bytes: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            limit,
            dentry_bytes: AtomicUsize::new(0),
            inode_bytes: AtomicUsize::new(0),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes both copies hold.
    pub(crate) fn used(&self) -> usize {
        self.dentry_bytes.load(Ordering::Relaxed) + self.inode_bytes.load(Ordering::Relaxed)
    }

    /// Record a copy's size; whether it fits (the dentries on their own,
    /// the inodes next to the dentries).
    pub(crate) fn set(&self, share: Share, bytes: usize) -> bool {
        match share {
            Share::Dentries => {
                self.dentry_bytes.store(bytes, Ordering::Relaxed);
                bytes <= self.limit
            }
            Share::Inodes => {
                self.inode_bytes.store(bytes, Ordering::Relaxed);
                self.used() <= self.limit
            }
        }
    }

    /// Whether the two copies together are past the limit.
    pub(crate) fn over(&self) -> bool {
        self.used() > self.limit
    }
}

/// Where one copy lives: the copy, or nothing once it was dropped.
pub(crate) struct CopySlot<T> {
    copy: Mutex<Option<T>>,
    /// Whether `copy` is Some, read without the lock on every write.
    on: AtomicBool,
    budget: Arc<Budget>,
    share: Share,
    /// What find does without the copy, as the log says it.
    without: &'static str,
}

impl<T> CopySlot<T> {
    /// A slot with no copy yet.
    pub(crate) fn empty(budget: Arc<Budget>, share: Share, without: &'static str) -> CopySlot<T> {
        CopySlot {
            copy: Mutex::new(None),
            on: AtomicBool::new(false),
            budget,
            share,
            without,
        }
    }

    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Record the copy's size; whether it fits.
    pub(crate) fn set_bytes(&self, bytes: usize) -> bool {
        self.budget.set(self.share, bytes)
    }

    /// Put the copy built at start in place, or say why there is none.
    pub(crate) fn install(&self, built: Result<T, String>) {
        match built {
            Ok(copy) => {
                *self.lock() = Some(copy);
                self.on.store(true, Ordering::Release);
            }
            Err(why) => {
                self.budget.set(self.share, 0);
                tracing::warn!("{}: {why}", self.without);
            }
        }
    }

    /// Whether there is a copy (false once it was dropped).
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<T>> {
        // A panic while holding the lock may have left the copy half
        // updated: drop it.
        self.copy.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            if guard.is_some() {
                self.drop_locked(&mut guard, "a panic");
            }
            guard
        })
    }

    /// Drop the copy held under `guard` for good.
    pub(crate) fn drop_locked(&self, guard: &mut MutexGuard<'_, Option<T>>, why: &str) {
        **guard = None;
        self.on.store(false, Ordering::Release);
        self.budget.set(self.share, 0);
        tracing::warn!("{} from now on: {why}", self.without);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dentries_fit_alone_and_the_inodes_next_to_them() {
        let b = Budget::new(100);
        assert!(b.set(Share::Inodes, 60));
        // The dentries may grow into the inodes' room; the caller then
        // drops the inode copy.
        assert!(b.set(Share::Dentries, 70));
        assert!(b.over());
        assert!(!b.set(Share::Inodes, 60), "no room left next to them");
        assert!(b.set(Share::Inodes, 30) && !b.over());
        assert!(!b.set(Share::Dentries, 101), "alone past the limit");
    }

    #[test]
    fn a_panic_under_the_lock_drops_the_copy_and_gives_its_room_back() {
        let budget = Arc::new(Budget::new(1000));
        let slot = Arc::new(CopySlot::empty(budget.clone(), Share::Inodes, "test"));
        slot.install(Ok(vec![1u8, 2, 3]));
        assert!(slot.set_bytes(400) && slot.is_on());
        assert_eq!(budget.used(), 400);
        let holder = slot.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = holder.lock();
            panic!("while updating the copy");
        })
        .join();
        assert!(panicked.is_err());
        assert!(slot.lock().is_none(), "a half-updated copy is not kept");
        assert!(!slot.is_on());
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_copy_that_failed_to_build_holds_no_room() {
        let budget = Arc::new(Budget::new(1000));
        let slot = CopySlot::<Vec<u8>>::empty(budget.clone(), Share::Dentries, "test");
        assert!(!slot.set_bytes(1001));
        slot.install(Err("too big".into()));
        assert!(!slot.is_on() && slot.lock().is_none());
        assert_eq!(budget.used(), 0);
    }
}
