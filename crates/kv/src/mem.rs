//! In-memory [`KvStore`]: a `BTreeMap` behind a `Mutex`. Used by unit tests
//! of the layers above (and as the reference model in this crate's tests).
//! `sync` flags are accepted and ignored: nothing here is durable.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::{scan_seek_key, KvStore, Op, Result, WriteBatch};

/// A [`KvStore`] held entirely in memory.
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // The map is never left half-updated by a panic (each mutation is a
        // single insert/remove), so a poisoned lock is still consistent.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl KvStore for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.lock().get(key).cloned())
    }

    fn write(&self, batch: WriteBatch, _sync: bool) -> Result<()> {
        // Holding the lock for the whole batch makes it atomic to readers.
        let mut map = self.lock();
        for op in batch.ops {
            match op {
                Op::Put(k, v) => {
                    map.insert(k, v);
                }
                Op::Delete(k) => {
                    map.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn scan(&self, prefix: &[u8], start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let map = self.lock();
        let seek = scan_seek_key(prefix, start).to_vec();
        Ok(map
            .range(seek..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn sync_wal(&self) -> Result<()> {
        Ok(())
    }
}
