//! A metadata store for unit tests whose writes and syncs fail on demand:
//! a full disk (every write refused), a failing fsync (synced writes and
//! log syncs refused) or a dead disk (every write fails with EIO), over an
//! in-memory store.

use madfs_kv::{KvError, KvStore, MemStore, WriteBatch};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
pub(crate) struct FaultyKv {
    inner: MemStore,
    full: AtomicBool,
    fsync_fails: AtomicBool,
    dead: AtomicBool,
}

impl FaultyKv {
    /// Every write fails with ENOSPC from now on (or no longer).
    pub(crate) fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Every write fails with EIO from now on (or no longer).
    pub(crate) fn set_dead(&self, dead: bool) {
        self.dead.store(dead, Ordering::SeqCst);
    }

    /// A store whose synced writes and log syncs all fail with EIO.
    pub(crate) fn failing_fsync() -> FaultyKv {
        let kv = FaultyKv::default();
        kv.fsync_fails.store(true, Ordering::SeqCst);
        kv
    }

    /// A store on a full disk.
    pub(crate) fn full() -> FaultyKv {
        let kv = FaultyKv::default();
        kv.set_full(true);
        kv
    }

    fn fsync_error() -> KvError {
        KvError::Io("IO error: fsync: Input/output error".into())
    }
}

impl KvStore for FaultyKv {
    fn get(&self, key: &[u8]) -> madfs_kv::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> madfs_kv::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(KvError::Io("IO error: No space left on device".into()));
        }
        if sync && self.fsync_fails.load(Ordering::SeqCst) {
            return Err(Self::fsync_error());
        }
        if self.dead.load(Ordering::SeqCst) {
            return Err(KvError::Io(
                "IO error: While appending to file: Input/output error".into(),
            ));
        }
        self.inner.write(batch, sync)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start: &[u8],
        limit: usize,
    ) -> madfs_kv::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(prefix, start, limit)
    }

    fn sync_wal(&self) -> madfs_kv::Result<()> {
        if self.fsync_fails.load(Ordering::SeqCst) {
            return Err(Self::fsync_error());
        }
        self.inner.sync_wal()
    }
}
