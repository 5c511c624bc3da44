//! The order chunk changes reach the replicas in (issue 16): with a
//! mirror (a primary that keeps replicas), a change to the disk and its
//! record in the replication stream happen under one lock, so two writes
//! racing over the same bytes are recorded in the order the disk applied
//! them, and the replica ends with the bytes the primary serves.
//!
//! Writes lock their chunk (a stripe of chunk locks, by inode and index)
//! and share their inode's lock; truncates and purges, which change every
//! chunk of an inode, hold the inode's lock alone. Locks are taken inode
//! first, so no two changes wait for each other in a circle. Writes to
//! different chunks still run side by side.

use madfs_types::{ChunkIndex, InodeId};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Stripes of each kind: collisions only serialize unrelated changes.
const STRIPES: usize = 256;

pub(crate) struct WriteOrder {
    inodes: Box<[RwLock<()>]>,
    chunks: Box<[Mutex<()>]>,
}

/// Held across one write and its record.
pub(crate) struct WriteTurn<'a> {
    _inode: RwLockReadGuard<'a, ()>,
    _chunk: MutexGuard<'a, ()>,
}

impl WriteOrder {
    pub(crate) fn new() -> WriteOrder {
        WriteOrder {
            inodes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            chunks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn inode_stripe(ino: InodeId) -> usize {
        (ino.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % STRIPES
    }

    fn chunk_stripe(ino: InodeId, index: ChunkIndex) -> usize {
        let h = ino
            .0
            .wrapping_add((index.0 as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 56) as usize % STRIPES
    }

    /// The turn of a write to chunk `index` of `ino`.
    pub(crate) fn write(&self, ino: InodeId, index: ChunkIndex) -> WriteTurn<'_> {
        let inode = self.inodes[Self::inode_stripe(ino)]
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let chunk = self.chunks[Self::chunk_stripe(ino, index)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        WriteTurn {
            _inode: inode,
            _chunk: chunk,
        }
    }

    /// The turn of a change to every chunk of `ino` (truncate, purge).
    pub(crate) fn whole(&self, ino: InodeId) -> RwLockWriteGuard<'_, ()> {
        self.inodes[Self::inode_stripe(ino)]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_inode_change_waits_for_its_writes_and_others_do_not() {
        let order = WriteOrder::new();
        let (a, b) = (InodeId(7), InodeId(8));
        assert_ne!(WriteOrder::inode_stripe(a), WriteOrder::inode_stripe(b));
        assert_ne!(
            WriteOrder::chunk_stripe(a, ChunkIndex(0)),
            WriteOrder::chunk_stripe(a, ChunkIndex(1))
        );
        let turn = order.write(a, ChunkIndex(0));
        // Another chunk of the same inode, and another inode, go on.
        drop(order.write(a, ChunkIndex(1)));
        drop(order.whole(b));
        assert!(order.inodes[WriteOrder::inode_stripe(a)]
            .try_write()
            .is_err());
        drop(turn);
        drop(order.whole(a));
    }
}
