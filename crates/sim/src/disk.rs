//! A metadata store that models what a crash keeps: RocksDB with its
//! write-ahead log. Every batch is applied to the live state at once; a
//! batch written with `sync = true` (or a `sync_wal`) makes it and every
//! earlier batch durable. A crash keeps the durable batches and a random
//! prefix of the later ones (a power cut keeps some of what the OS had not
//! written yet, in order; a process kill keeps all of it), and loses the
//! rest. The disk can be made full: then every write fails with the error
//! RocksDB gives on ENOSPC.
//!
//! Each server incarnation gets its own handle (`SimKv`); a crash fences
//! the old handles, so tasks of a crashed server that are still around
//! (the runtime does not kill them) can neither read nor write.

use madfs_kv::{KvError, KvStore, MemStore, Result, WriteBatch};
use std::sync::{Arc, Mutex, MutexGuard};

struct State {
    live: Arc<MemStore>,
    durable: MemStore,
    /// Batches written since the last sync, oldest first.
    pending: Vec<WriteBatch>,
    epoch: u64,
    full: bool,
}

/// One server's metadata disk, surviving crashes of the server.
pub struct SimDisk {
    state: Mutex<State>,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk {
            state: Mutex::new(State {
                live: Arc::new(MemStore::new()),
                durable: MemStore::new(),
                pending: Vec::new(),
                epoch: 0,
                full: false,
            }),
        }
    }
}

fn copy(from: &MemStore) -> MemStore {
    let to = MemStore::new();
    let mut b = WriteBatch::new();
    for (k, v) in from.scan(b"", b"", usize::MAX).expect("MemStore scans") {
        b.put(&k, &v);
    }
    to.write(b, false).expect("MemStore writes");
    to
}

impl SimDisk {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handle for the server incarnation starting now.
    pub fn open(self: &Arc<Self>) -> SimKv {
        SimKv {
            disk: self.clone(),
            epoch: self.lock().epoch,
        }
    }

    /// The server died: keep the durable batches and the first `keep` of
    /// the others (clamped), fence every open handle. Returns how many
    /// unsynced batches were lost.
    pub fn crash(&self, keep: usize) -> usize {
        let mut s = self.lock();
        let pending = std::mem::take(&mut s.pending);
        let keep = keep.min(pending.len());
        let lost = pending.len() - keep;
        for b in pending.into_iter().take(keep) {
            s.durable.write(b, false).expect("MemStore writes");
        }
        s.live = Arc::new(copy(&s.durable));
        s.epoch += 1;
        lost
    }

    /// Unsynced batches a crash now could lose.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    pub fn is_full(&self) -> bool {
        self.lock().full
    }

    /// Every live pair with key starting with `prefix` (for the checker).
    pub fn scan_live(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let live = self.lock().live.clone();
        live.scan(prefix, prefix, usize::MAX)
            .expect("MemStore scans")
    }

    fn make_durable(s: &mut State) {
        for b in std::mem::take(&mut s.pending) {
            s.durable.write(b, false).expect("MemStore writes");
        }
    }
}

/// One incarnation's view of a `SimDisk`.
pub struct SimKv {
    disk: Arc<SimDisk>,
    epoch: u64,
}

impl SimKv {
    fn live(&self) -> Result<Arc<MemStore>> {
        let s = self.disk.lock();
        if s.epoch != self.epoch {
            return Err(KvError::Io("simulated crash: this server is gone".into()));
        }
        Ok(s.live.clone())
    }
}

impl KvStore for SimKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.live()?.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let mut s = self.disk.lock();
        if s.epoch != self.epoch {
            return Err(KvError::Io("simulated crash: this server is gone".into()));
        }
        if s.full {
            return Err(KvError::Io(
                "IO error: No space left on device (simulated)".into(),
            ));
        }
        s.live.write(batch.clone(), false)?;
        s.pending.push(batch);
        if sync {
            SimDisk::make_durable(&mut s);
        }
        Ok(())
    }

    fn scan(&self, prefix: &[u8], start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.live()?.scan(prefix, start, limit)
    }

    fn sync_wal(&self) -> Result<()> {
        let mut s = self.disk.lock();
        if s.epoch != self.epoch {
            return Err(KvError::Io("simulated crash: this server is gone".into()));
        }
        SimDisk::make_durable(&mut s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(kv: &SimKv, k: &[u8], sync: bool) {
        let mut b = WriteBatch::new();
        b.put(k, b"v");
        kv.write(b, sync).unwrap();
    }

    #[test]
    fn a_crash_keeps_the_synced_prefix_and_fences_old_handles() {
        let disk = Arc::new(SimDisk::default());
        let kv = disk.open();
        put(&kv, b"a", false);
        put(&kv, b"b", true); // makes a durable too
        put(&kv, b"c", false);
        put(&kv, b"d", false);
        assert_eq!(disk.crash(1), 1);
        assert!(kv.get(b"a").is_err(), "the old incarnation is fenced");
        let kv = disk.open();
        for (k, there) in [(b"a", true), (b"b", true), (b"c", true), (b"d", false)] {
            assert_eq!(kv.get(k).unwrap().is_some(), there, "{k:?}");
        }
        disk.set_full(true);
        let mut b = WriteBatch::new();
        b.put(b"e", b"v");
        assert!(kv.write(b, false).unwrap_err().is_no_space());
    }
}
