//! An in-memory copy of what find tests and reports of the inodes this
//! server holds (size, mtime, owner, permission bits), so that `-size`,
//! `-newer`, `-uid` and `madfs du` look each inode up in a hash table
//! instead of RocksDB. Kept in step by [`crate::dentry_index::IndexedKv`]
//! exactly as the dentry copy is: after every batch the inode keys it
//! touched are read back from the store under this copy's lock, so the
//! copy converges whatever order concurrent writers finish in. Dropped for
//! good past the memory budget (shared with the dentry copy) or on a
//! malformed record or a read error; find then reads the store.

use crate::dentry_index::Budget;
use crate::inode::Inode;
use crate::keys;
use madfs_kv::KvStore;
use madfs_proto::find::FindAttrs;
use madfs_rpc::log_warn;
use madfs_types::{Attr, InodeId, Timestamp};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The attributes find uses, 40 bytes (a whole record is about 90).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FindInode {
    pub size: u64,
    pub mtime: Timestamp,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (0o7777).
    pub perm: u32,
}

impl FindInode {
    pub(crate) fn of(a: &Attr) -> FindInode {
        FindInode {
            size: a.size,
            mtime: a.mtime,
            uid: a.uid,
            gid: a.gid,
            perm: a.perm,
        }
    }

    pub(crate) fn find_attrs(&self) -> FindAttrs {
        FindAttrs {
            size: self.size,
            mtime: self.mtime,
            uid: self.uid,
        }
    }

    /// (perm, uid, gid), as find's directory entries carry them.
    pub(crate) fn access(&self) -> (u32, u32, u32) {
        (self.perm, self.uid, self.gid)
    }
}

/// Inode ids are a server number over a counter, so one server's ids are
/// nearly consecutive: multiplying by an odd constant keeps the low bits (the
/// bucket) a permutation of the counter's and mixes the high bits (the
/// table's tag byte). SipHash would cost more than the lookup it serves.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else in byte by byte.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Table = HashMap<u64, FindInode, BuildHasherDefault<IdHasher>>;

/// Bytes the table's allocation takes: its buckets (a power of two, at
/// most 7/8 used), one entry and one control byte each.
fn table_bytes(t: &Table) -> usize {
    match t.capacity() {
        0 => 0,
        cap => (cap * 8 / 7).next_power_of_two() * (std::mem::size_of::<(u64, FindInode)>() + 1),
    }
}

/// Decode a stored inode record into what find needs.
fn decode(value: &[u8]) -> Option<FindInode> {
    Inode::decode(value).ok().map(|i| FindInode::of(&i.attr))
}

pub(crate) struct InodeIndex {
    copy: Mutex<Option<Table>>,
    /// Whether `copy` is Some, read without the lock on every write.
    on: AtomicBool,
}

impl InodeIndex {
    /// Copy every inode of `store` within what `budget` leaves (the dentry
    /// copy is built first). Runs before the server serves.
    pub(crate) fn build(store: &dyn KvStore, budget: &Budget) -> InodeIndex {
        let index = InodeIndex {
            copy: Mutex::new(None),
            on: AtomicBool::new(false),
        };
        if budget.limit() == 0 {
            return index;
        }
        let mut table = Table::default();
        let mut why: Option<String> = None;
        let scanned = store.scan_visit(keys::INODE, keys::INODE, &mut |k, v| {
            match (keys::ino_from_key(k).filter(|_| k.len() == 12), decode(v)) {
                (Some(ino), Some(found)) => {
                    let grew = table.len() == table.capacity();
                    table.insert(ino.0, found);
                    if grew && !budget.set_inodes(table_bytes(&table)) {
                        why = Some(format!(
                            "more inodes than its budget of {} bytes leaves",
                            budget.limit()
                        ));
                    }
                }
                _ => why = Some("a malformed inode record".into()),
            }
            why.is_none()
        });
        if let Err(e) = scanned {
            why = Some(format!("reading the inodes failed: {e}"));
        }
        match why {
            None => {
                *index.lock() = Some(table);
                index.on.store(true, Ordering::Release);
            }
            Some(why) => {
                budget.set_inodes(0);
                log_warn!("find reads inodes from RocksDB, without its in-memory copy: {why}");
            }
        }
        index
    }

    fn lock(&self) -> MutexGuard<'_, Option<Table>> {
        // A panic while holding the lock may have left the copy half
        // updated: drop it.
        self.copy.lock().unwrap_or_else(|poisoned| {
            let mut g = poisoned.into_inner();
            if g.take().is_some() {
                log_warn!("find reads inodes from RocksDB from now on: a panic");
            }
            self.on.store(false, Ordering::Release);
            g
        })
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Entries held, when there is a copy.
    pub(crate) fn len(&self) -> Option<usize> {
        self.lock().as_ref().map(HashMap::len)
    }

    /// Mirror the current values of `touched` inode keys from `store`.
    pub(crate) fn refresh(&self, store: &dyn KvStore, touched: &[Vec<u8>], budget: &Budget) {
        let mut guard = self.lock();
        let Some(table) = guard.as_mut() else { return };
        let mut why: Option<String> = None;
        for key in touched {
            let Some(ino) = keys::ino_from_key(key).filter(|_| key.len() == 12) else {
                why = Some("a malformed inode key was written".into());
                break;
            };
            match store.get(key) {
                Ok(Some(v)) => match decode(&v) {
                    Some(found) => {
                        table.insert(ino.0, found);
                    }
                    None => {
                        why = Some("a malformed inode record was written".into());
                        break;
                    }
                },
                Ok(None) => {
                    table.remove(&ino.0);
                    // Give memory back after mass removals (mdtest's delete
                    // phases), not on every one.
                    if table.capacity() > 4096 && table.len() < table.capacity() / 4 {
                        table.shrink_to(table.len() * 2);
                    }
                }
                Err(e) => {
                    why = Some(format!("reading an inode back failed: {e}"));
                    break;
                }
            }
        }
        if why.is_none() && !budget.set_inodes(table_bytes(table)) {
            why = Some(format!(
                "more inodes than its budget of {} bytes leaves",
                budget.limit()
            ));
        }
        if let Some(why) = why {
            *guard = None;
            self.on.store(false, Ordering::Release);
            budget.set_inodes(0);
            log_warn!("find reads inodes from RocksDB from now on: {why}");
        }
    }

    /// What the copy holds of `ino`: None when there is no copy (ask the
    /// store), Some(None) when the inode does not exist.
    pub(crate) fn get(&self, ino: InodeId) -> Option<Option<FindInode>> {
        if !self.is_on() {
            return None;
        }
        self.lock().as_ref().map(|t| t.get(&ino.0).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dentry_index::IndexedKv;
    use madfs_kv::{MemStore, WriteBatch};
    use madfs_types::FileKind;
    use std::sync::Arc;

    /// A stored inode record with these attributes.
    fn record(ino: u64, size: u64, uid: u32, secs: i64) -> Vec<u8> {
        let mut i = Inode::new(InodeId(ino), FileKind::File, 0o640, uid, 7, Vec::new());
        i.attr.size = size;
        i.attr.mtime = Timestamp { secs, nanos: 3 };
        i.encode()
    }

    /// What the store holds of `ino`, decoded as find would.
    fn stored(kv: &IndexedKv, ino: u64) -> Option<FindInode> {
        kv.get(&keys::inode(InodeId(ino)))
            .unwrap()
            .map(|v| decode(&v).unwrap())
    }

    /// Random puts and deletes of inode records (and of other records),
    /// several per batch; `deletes` in 10 of the changes are deletes.
    fn random_batches(kv: &IndexedKv, seed: u64, batches: usize, deletes: u64, ids: u64) {
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..batches {
            let mut b = WriteBatch::new();
            for _ in 0..1 + next() % 4 {
                let ino = 1 + next() % ids;
                match next() % 10 {
                    d if d < deletes => b.delete(&keys::inode(InodeId(ino))),
                    9 => b.put(&keys::inline_data(InodeId(ino)), b"bytes"),
                    _ => b.put(
                        &keys::inode(InodeId(ino)),
                        &record(ino, next() % 100_000, (next() % 3) as u32, 1_700_000_000),
                    ),
                }
            }
            kv.write(b, false).unwrap();
        }
    }

    fn assert_same(kv: &IndexedKv, ids: u64) {
        for ino in 0..=ids + 1 {
            assert_eq!(
                kv.copied_inode(InodeId(ino)),
                Some(stored(kv, ino)),
                "inode {ino}"
            );
        }
    }

    #[test]
    fn the_copy_answers_as_the_store_does() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let kv = IndexedKv::new(store.clone(), 1 << 20);
        // Growing, then mostly removing (the table shrinks), then growing.
        for (round, deletes) in [2, 2, 2, 8, 8, 9, 9, 2].into_iter().enumerate() {
            random_batches(&kv, round as u64 + 1, 3000, deletes, 10_000);
            assert_same(&kv, 10_000);
        }
        assert!(kv.inodes_on());
        let mut b = WriteBatch::new();
        b.put(&keys::inode(InodeId(5)), &record(5, 3901, 1, 42));
        kv.write(b, false).unwrap();
        assert_eq!(
            kv.copied_inode(InodeId(5)),
            Some(Some(FindInode {
                size: 3901,
                mtime: Timestamp { secs: 42, nanos: 3 },
                uid: 1,
                gid: 7,
                perm: 0o640,
            }))
        );
        // The test covered the copy: it holds inodes.
        assert!((1..=10_000).any(|i| kv.copied_inode(InodeId(i)).flatten().is_some()));
        // A copy built from the same store (a restart) holds the same.
        let restarted = IndexedKv::new(store, 1 << 20);
        assert!(restarted.inodes_on());
        assert_same(&restarted, 10_000);
    }

    #[test]
    fn a_copy_built_at_start_holds_every_inode() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let mut b = WriteBatch::new();
        for ino in 1..=500u64 {
            b.put(&keys::inode(InodeId(ino)), &record(ino, ino * 10, 0, 1));
        }
        store.write(b, false).unwrap();
        let kv = IndexedKv::new(store, 1 << 20);
        assert!(kv.inodes_on());
        assert_same(&kv, 500);
        assert_eq!(kv.copied_inode(InodeId(77)).flatten().unwrap().size, 770);
    }

    #[test]
    fn past_the_budget_the_copy_is_dropped_and_the_dentries_stay() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let mut b = WriteBatch::new();
        b.put(b"DENT\0\0\0\0\0\0\0\x01f", &[1, 2, 0, 0, 0, 0, 0, 0, 0]);
        for ino in 1..=100u64 {
            b.put(&keys::inode(InodeId(ino)), &record(ino, 1, 0, 1));
        }
        store.write(b, false).unwrap();
        // Room for the dentry copy (one small block) and for a table of
        // about a thousand inodes, not of five thousand.
        let kv = IndexedKv::new(store, 80 << 10);
        assert!(kv.index_on() && kv.inodes_on());
        random_batches(&kv, 3, 3000, 0, 5000);
        assert!(!kv.inodes_on(), "the copy outgrew its budget");
        assert!(kv.index_on(), "the dentry copy fits on its own");
        assert_eq!(kv.copied_inode(InodeId(1)), None);
        // No budget: no copy at all.
        assert!(!IndexedKv::new(Arc::new(MemStore::new()), 0).inodes_on());
    }

    #[test]
    fn a_malformed_inode_record_drops_the_copy() {
        let kv = IndexedKv::new(Arc::new(MemStore::new()), 1 << 20);
        let mut b = WriteBatch::new();
        b.put(&keys::inode(InodeId(1)), &record(1, 1, 0, 1));
        kv.write(b, false).unwrap();
        assert!(kv.inodes_on());
        let mut b = WriteBatch::new();
        b.put(&keys::inode(InodeId(2)), b"not a record");
        kv.write(b, false).unwrap();
        assert!(!kv.inodes_on());
        assert_eq!(kv.copied_inode(InodeId(1)), None, "ask the store");
    }

    #[test]
    fn concurrent_writers_of_the_same_inodes_converge() {
        let kv = Arc::new(IndexedKv::new(Arc::new(MemStore::new()), 1 << 20));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let kv = kv.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let ino = 1 + (i * 7 + t) % 8;
                        let mut b = WriteBatch::new();
                        if (i + t) % 3 == 0 {
                            b.delete(&keys::inode(InodeId(ino)));
                        } else {
                            b.put(
                                &keys::inode(InodeId(ino)),
                                &record(ino, t * 10_000 + i, 0, 1),
                            );
                        }
                        kv.write(b, false).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert!(kv.inodes_on());
        assert_same(&kv, 8);
    }
}
