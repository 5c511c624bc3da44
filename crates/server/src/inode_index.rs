//! An in-memory copy of what find tests and reports of the inodes this
//! server holds (size, mtime, owner, permission bits), so that `-size`,
//! `-newer`, `-uid` and `madfs du` look each inode up in a hash table
//! instead of RocksDB. Kept in step by [`crate::dentry_index::IndexedKv`]
//! exactly as the dentry copy is: after every batch the inode keys it
//! touched are read back from the store under this copy's lock, so the
//! copy converges whatever order concurrent writers finish in. Dropped for
//! good past the memory budget (shared with the dentry copy) or on a
//! malformed record or a read error; find then reads the store.

use crate::find_copy::{Budget, CopySlot, Share};
use crate::inode::Inode;
use crate::keys;
use madfs_kv::KvStore;
use madfs_proto::find::FindAttrs;
use madfs_types::{Attr, InodeId, Timestamp};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

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

/// The table and the capacity of its allocation. `HashMap::capacity` is
/// entries plus free slots, and a removal's tombstone takes a slot without
/// giving memory back, so after churn it can read below what is allocated. The largest value seen since the last (re)allocation is the
/// allocation's: right after one, nothing is a tombstone.
#[derive(Default)]
struct Held {
    table: Table,
    allocated: usize,
}

impl Held {
    fn insert(&mut self, ino: u64, found: FindInode) {
        self.table.insert(ino, found);
        self.allocated = self.allocated.max(self.table.capacity());
    }

    fn remove(&mut self, ino: u64) {
        self.table.remove(&ino);
        // Give memory back after mass removals (mdtest's delete phases),
        // not on every one.
        if self.allocated > 4096 && self.table.len() < self.allocated / 4 {
            self.table.shrink_to(self.table.len() * 2);
            self.allocated = self.table.capacity();
        }
    }

    /// Bytes the allocation takes: its buckets (a power of two, at most 7/8
    /// used), one entry and one control byte each.
    fn bytes(&self) -> usize {
        match self.allocated {
            0 => 0,
            cap => {
                (cap * 8 / 7).next_power_of_two() * (std::mem::size_of::<(u64, FindInode)>() + 1)
            }
        }
    }
}

/// Decode a stored inode record into what find needs.
fn decode(value: &[u8]) -> Option<FindInode> {
    Inode::decode(value).ok().map(|i| FindInode::of(&i.attr))
}

pub(crate) struct InodeIndex {
    slot: CopySlot<Held>,
}

impl InodeIndex {
    /// Copy every inode of `store` within what `budget` leaves (the dentry
    /// copy is built first). Runs before the server serves.
    pub(crate) fn build(store: &dyn KvStore, budget: Arc<Budget>) -> InodeIndex {
        let index = InodeIndex {
            slot: CopySlot::empty(budget, Share::Inodes, "find reads inodes from RocksDB"),
        };
        if index.slot.budget().limit() == 0 {
            return index;
        }
        let mut held = Held::default();
        let mut why: Option<String> = None;
        let scanned = store.scan_visit(keys::INODE, keys::INODE, &mut |k, v| {
            match (keys::ino_from_key(k).filter(|_| k.len() == 12), decode(v)) {
                (Some(ino), Some(found)) => {
                    let before = held.allocated;
                    held.insert(ino.0, found);
                    if held.allocated != before && !index.slot.set_bytes(held.bytes()) {
                        why = Some(index.over_budget());
                    }
                }
                _ => why = Some("a malformed inode record".into()),
            }
            why.is_none()
        });
        if let Err(e) = scanned {
            why = Some(format!("reading the inodes failed: {e}"));
        }
        index.slot.install(why.map_or(Ok(held), Err));
        index
    }

    fn over_budget(&self) -> String {
        format!(
            "more inodes than its budget of {} bytes leaves",
            self.slot.budget().limit()
        )
    }

    pub(crate) fn is_on(&self) -> bool {
        self.slot.is_on()
    }

    /// Entries held, when there is a copy.
    pub(crate) fn len(&self) -> Option<usize> {
        self.slot.lock().as_ref().map(|h| h.table.len())
    }

    /// Mirror the current values of `touched` inode keys from `store`.
    pub(crate) fn refresh(&self, store: &dyn KvStore, touched: &[Vec<u8>]) {
        let mut guard = self.slot.lock();
        let Some(held) = guard.as_mut() else { return };
        let mut why: Option<String> = None;
        for key in touched {
            let Some(ino) = keys::ino_from_key(key).filter(|_| key.len() == 12) else {
                why = Some("a malformed inode key was written".into());
                break;
            };
            match store.get(key) {
                Ok(Some(v)) => match decode(&v) {
                    Some(found) => held.insert(ino.0, found),
                    None => {
                        why = Some("a malformed inode record was written".into());
                        break;
                    }
                },
                Ok(None) => held.remove(ino.0),
                Err(e) => {
                    why = Some(format!("reading an inode back failed: {e}"));
                    break;
                }
            }
        }
        if why.is_none() && !self.slot.set_bytes(held.bytes()) {
            why = Some(self.over_budget());
        }
        if let Some(why) = why {
            self.slot.drop_locked(&mut guard, &why);
        }
    }

    /// Drop the copy for good because the dentry copy needs the room (it
    /// comes first: name-only finds are the common ones).
    pub(crate) fn give_way(&self) {
        let mut guard = self.slot.lock();
        if guard.is_some() {
            let why = format!(
                "the dentries need the budget of {} bytes",
                self.slot.budget().limit()
            );
            self.slot.drop_locked(&mut guard, &why);
        }
    }

    /// What the copy holds of `ino`: None when there is no copy (ask the
    /// store), Some(None) when the inode does not exist.
    pub(crate) fn get(&self, ino: InodeId) -> Option<Option<FindInode>> {
        if !self.is_on() {
            return None;
        }
        self.slot
            .lock()
            .as_ref()
            .map(|h| h.table.get(&ino.0).copied())
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

    /// A stored dentry key of `name` in directory 1.
    fn dentry_key(name: &str) -> Vec<u8> {
        let mut k = keys::DENTRY.to_vec();
        k.extend_from_slice(&1u64.to_be_bytes());
        k.extend_from_slice(name.as_bytes());
        k
    }

    /// Create batches as the server writes them: a dentry and its inode.
    fn create_files(kv: &IndexedKv, from: u64, to: u64) {
        for ino in from..to {
            let mut b = WriteBatch::new();
            b.put(&keys::inode(InodeId(ino)), &record(ino, 1, 0, 1));
            b.put(
                &dentry_key(&format!("f{ino}")),
                &[1, 0, 0, 0, 0, 0, 0, 0, ino as u8],
            );
            kv.write(b, false).unwrap();
        }
    }

    #[test]
    fn past_the_budget_the_inodes_go_and_the_dentries_stay() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        // Room for both copies of a few hundred files, not of four thousand;
        // the dentries alone (about 64 bytes each) fit.
        let kv = IndexedKv::new(store.clone(), 400 << 10);
        create_files(&kv, 1, 300);
        assert!(kv.index_on() && kv.inodes_on());
        create_files(&kv, 300, 4000);
        assert!(!kv.inodes_on(), "the inode copy outgrew the budget");
        assert!(kv.index_on(), "the dentry copy fits on its own");
        assert_eq!(kv.copied_inode(InodeId(1)), None);
        // At a restart the dentries are copied first and keep their room.
        let kv = IndexedKv::new(store, 400 << 10);
        assert!(kv.index_on() && !kv.inodes_on());
        // No budget: no copy at all.
        assert!(!IndexedKv::new(Arc::new(MemStore::new()), 0).inodes_on());
    }

    #[test]
    fn dentries_growing_into_the_inodes_room_drop_the_inode_copy() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let kv = IndexedKv::new(store, 400 << 10);
        create_files(&kv, 1, 1000);
        assert!(kv.index_on() && kv.inodes_on());
        // Names only (hard links, as far as the copies go): only the
        // dentry copy grows, and the inode copy makes room for it.
        for i in 0..2500u64 {
            let mut b = WriteBatch::new();
            b.put(
                &dentry_key(&format!("link{i}")),
                &[1, 0, 0, 0, 0, 0, 0, 0, 1],
            );
            kv.write(b, false).unwrap();
        }
        assert!(kv.index_on(), "the dentry copy comes first");
        assert!(!kv.inodes_on(), "the inode copy gave way");
    }

    fn any_inode() -> FindInode {
        FindInode {
            size: 1,
            mtime: Timestamp { secs: 1, nanos: 0 },
            uid: 0,
            gid: 0,
            perm: 0o644,
        }
    }

    #[test]
    fn the_counted_bytes_follow_the_allocation_through_churn() {
        let mut held = Held::default();
        for ino in 0..7000u64 {
            held.insert(ino, any_inode());
        }
        let full = held.bytes();
        assert!(full >= 7000 * std::mem::size_of::<(u64, FindInode)>());
        // Remove one, add another, at a steady size: tombstones take slots
        // and `capacity()` falls (the table may even grow to get rid of
        // them); the allocation never shrinks, and neither may the count.
        let mut most = full;
        for i in 0..20_000u64 {
            held.remove(i);
            held.insert(7000 + i, any_inode());
            assert_eq!(held.table.len(), 7000);
            assert!(
                held.bytes() >= most,
                "counted {} after {most} at {i}",
                held.bytes()
            );
            most = held.bytes();
        }
        // Mass removal gives memory back, and the count follows.
        for i in 20_000..26_500u64 {
            held.remove(i);
        }
        assert_eq!(held.table.len(), 500);
        assert!(
            held.bytes() <= full / 2,
            "{} after shrinking from {full}",
            held.bytes()
        );
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
