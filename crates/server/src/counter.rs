//! A persistent counter handing out unique ids (inode numbers, rename
//! transaction ids) across restarts. The store keeps a high-water mark that
//! runs ahead of the counter by a block, so most allocations write nothing,
//! and after a crash the counter restarts above every id ever handed out
//! (the ids of the unused rest of a block are skipped, never reused).

use madfs_kv::{KvError, KvStore, WriteBatch};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const BLOCK: u64 = 1024;

pub struct Counter {
    key: &'static [u8],
    next: AtomicU64,
    mark: Mutex<u64>,
}

impl Counter {
    /// Load the counter stored at `key`, starting at `first` if none is.
    pub fn load(kv: &dyn KvStore, key: &'static [u8], first: u64) -> Result<Counter, KvError> {
        let start = match kv.get(key)? {
            None => first,
            Some(v) => {
                let b: [u8; 8] = v.as_slice().try_into().map_err(|_| {
                    KvError::Io(format!("corrupt counter {}", String::from_utf8_lossy(key)))
                })?;
                u64::from_le_bytes(b).max(first)
            }
        };
        Ok(Counter {
            key,
            next: AtomicU64::new(start),
            mark: Mutex::new(start),
        })
    }

    /// Whether `id` may have been handed out: below the next id (ids
    /// skipped at a restart count as handed out).
    pub fn issued(&self, id: u64) -> bool {
        id < self.next.load(Ordering::Relaxed)
    }

    /// A fresh id. The mark is written synced: an id must never be handed
    /// out twice, even across a power cut.
    pub fn next(&self, kv: &dyn KvStore) -> Result<u64, KvError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut mark = self.mark.lock().unwrap_or_else(|e| e.into_inner());
        if n >= *mark {
            let new_mark = n + BLOCK;
            let mut b = WriteBatch::new();
            b.put(self.key, &new_mark.to_le_bytes());
            kv.write(b, true)?;
            *mark = new_mark;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::MemStore;

    #[test]
    fn ids_stay_unique_across_reloads() {
        let kv = MemStore::new();
        let c = Counter::load(&kv, b"METAt", 16).unwrap();
        let first: Vec<u64> = (0..3000).map(|_| c.next(&kv).unwrap()).collect();
        assert_eq!(first[0], 16);
        // A restart (the in-memory state is lost) continues above them all.
        let c = Counter::load(&kv, b"METAt", 16).unwrap();
        let again = c.next(&kv).unwrap();
        assert!(again > *first.iter().max().unwrap());
        let mut all = first.clone();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 3000);
    }
}
