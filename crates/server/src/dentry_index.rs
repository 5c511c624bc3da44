//! An in-memory copy of this server's dentries (the `DENT` keyspace), so
//! that server-side find walks a B-tree in RAM instead of RocksDB's merging
//! iterator, which costs about 170 ns per entry on top of the find's own
//! work (docs/PERFORMANCE.md).
//!
//! [`IndexedKv`] wraps the store: every batch goes to RocksDB first, then
//! the dentry keys it touched are read back and their current values copied
//! into the index under one lock. Reading back, instead of replaying the
//! batch, makes the copy converge whatever order concurrent writers finish
//! in: the last writer to take the lock reads a store that already holds
//! every write before it. Only `scan_visit` over the `DENT` prefix (used by
//! find alone) reads the copy; every other read goes to RocksDB.
//!
//! The copy is bounded by a byte budget. Past it, or on any read error or
//! malformed record, it is dropped for good and find scans RocksDB as
//! before: slower, never wrong.

use crate::keys;
use madfs_kv::{KvStore, Result, WriteBatch};
use madfs_rpc::{log_info, log_warn};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

/// A dentry key is the prefix, the parent's id, then the name.
const KEY_HEAD: usize = 12;
/// A dentry value: kind (u8) and inode id (u64).
const VALUE_LEN: usize = 9;
/// Names up to this long live in the tree's nodes themselves, so a scan
/// reads them without chasing a pointer to a cache line of their own.
const INLINE_NAME_MAX: usize = 22;
/// Estimated bytes one entry takes: 48 in the sorted array (a 32-byte key
/// and a 9-byte value, padded), plus a share of the changes not yet folded.
const ENTRY_BYTES: usize = 56;
/// Changes kept apart before they are folded into the array: at least this
/// many, and at least an eighth of the array, so that folding (one pass
/// over the array, a copy of 48 bytes per entry) costs a few bytes per
/// change.
/// (Tests fold after a few changes, to cover folding.)
const UNFOLDED_MIN: usize = if cfg!(test) { 8 } else { 4096 };

// ENTRY_BYTES assumes a 24-byte name.
const _: () = assert!(std::mem::size_of::<Name>() == 24);

/// A dentry's name, inline when short.
#[derive(Clone, Debug)]
enum Name {
    Inline {
        len: u8,
        bytes: [u8; INLINE_NAME_MAX],
    },
    Heap(Box<[u8]>),
}

impl Name {
    fn new(name: &[u8]) -> Name {
        if name.len() <= INLINE_NAME_MAX {
            let mut bytes = [0; INLINE_NAME_MAX];
            bytes[..name.len()].copy_from_slice(name);
            Name::Inline {
                len: name.len() as u8,
                bytes,
            }
        } else {
            Name::Heap(name.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Name::Inline { len, bytes } => &bytes[..*len as usize],
            Name::Heap(b) => b,
        }
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Name {}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    // Bytewise, as RocksDB orders the keys.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

type Key = (u64, Name);
type Value = [u8; VALUE_LEN];

fn entry_bytes(name: &[u8]) -> usize {
    if name.len() <= INLINE_NAME_MAX {
        ENTRY_BYTES
    } else {
        // The allocator's 16-byte header and rounding.
        ENTRY_BYTES + 16 + name.len().next_multiple_of(16)
    }
}

/// (parent, name) of a dentry key; None for a malformed key.
fn split_key(key: &[u8]) -> Option<(u64, &[u8])> {
    if key.len() < KEY_HEAD || !key.starts_with(keys::DENTRY) {
        return None;
    }
    let parent = u64::from_be_bytes(key[4..KEY_HEAD].try_into().ok()?);
    Some((parent, &key[KEY_HEAD..]))
}

/// The copy: a sorted array, which a scan reads front to back at memory
/// speed (a B-tree of the same entries costs a cache miss per node), and
/// the changes since it was last rebuilt (None: removed), folded into it
/// once they are many.
struct Mirror {
    sorted: Vec<(Key, Value)>,
    unfolded: BTreeMap<Key, Option<Value>>,
    bytes: usize,
}

impl Mirror {
    fn in_sorted(&self, key: &Key) -> bool {
        self.sorted.binary_search_by(|(k, _)| k.cmp(key)).is_ok()
    }

    fn contains(&self, key: &Key) -> bool {
        match self.unfolded.get(key) {
            Some(v) => v.is_some(),
            None => self.in_sorted(key),
        }
    }

    /// Set `key`; whether it is new.
    fn insert(&mut self, key: Key, value: Value) -> bool {
        let new = !self.contains(&key);
        self.unfolded.insert(key, Some(value));
        self.fold_if_many();
        new
    }

    /// Remove `key`; whether it was there.
    fn remove(&mut self, key: Key) -> bool {
        let was = self.contains(&key);
        if self.in_sorted(&key) {
            self.unfolded.insert(key, None);
        } else {
            self.unfolded.remove(&key);
        }
        self.fold_if_many();
        was
    }

    fn fold_if_many(&mut self) {
        if self.unfolded.len() <= UNFOLDED_MIN.max(self.sorted.len() / 8) {
            return;
        }
        let changes = std::mem::take(&mut self.unfolded);
        let old = std::mem::take(&mut self.sorted);
        let mut sorted = Vec::with_capacity(old.len() + changes.len());
        let mut old = old.into_iter().peekable();
        for (key, value) in changes {
            while let Some(entry) = old.next_if(|(k, _)| *k < key) {
                sorted.push(entry);
            }
            old.next_if(|(k, _)| *k == key); // replaced or removed
            if let Some(v) = value {
                sorted.push((key, v));
            }
        }
        sorted.extend(old);
        sorted.shrink_to_fit();
        self.sorted = sorted;
    }

    /// Call `f` on every entry at or after `from`, in key order, until it
    /// returns false: a merge of the array and the unfolded changes.
    fn visit(&self, from: &Key, f: &mut dyn FnMut(&Key, &Value) -> bool) {
        let mut i = self.sorted.partition_point(|(k, _)| k < from);
        let mut changes = self
            .unfolded
            .range::<Key, _>((Bound::Included(from), Bound::Unbounded))
            .peekable();
        loop {
            let go = match (self.sorted.get(i), changes.peek()) {
                (None, None) => return,
                (Some((k, v)), None) => {
                    i += 1;
                    f(k, v)
                }
                (Some((k, v)), Some((ck, _))) if k < *ck => {
                    i += 1;
                    f(k, v)
                }
                (old, Some(_)) => {
                    let (ck, cv) = changes.next().expect("peeked");
                    if old.is_some_and(|(k, _)| k == ck) {
                        i += 1; // replaced or removed by the change
                    }
                    match cv {
                        Some(v) => f(ck, v),
                        None => true,
                    }
                }
            };
            if !go {
                return;
            }
        }
    }
}

/// The index proper: the copy, or nothing once it was dropped.
pub(crate) struct DentryIndex {
    copy: Mutex<Option<Mirror>>,
    budget_bytes: usize,
}

impl DentryIndex {
    /// Copy every dentry of `store`, within `budget_bytes` (0: no index).
    /// Runs before the server serves, so no write races with it.
    fn build(store: &dyn KvStore, budget_bytes: usize) -> DentryIndex {
        let index = DentryIndex {
            copy: Mutex::new(None),
            budget_bytes,
        };
        if budget_bytes == 0 {
            return index;
        }
        let mut copy = Mirror {
            sorted: Vec::new(),
            unfolded: BTreeMap::new(),
            bytes: 0,
        };
        let mut why: Option<String> = None;
        let scanned = store.scan_visit(keys::DENTRY, keys::DENTRY, &mut |k, v| {
            match (split_key(k), <Value>::try_from(v)) {
                (Some((parent, name)), Ok(value)) => {
                    // RocksDB hands the keys over in order.
                    copy.bytes += entry_bytes(name);
                    copy.sorted.push(((parent, Name::new(name)), value));
                    if copy.bytes > budget_bytes {
                        why = Some(format!(
                            "more dentries than its budget of {budget_bytes} bytes"
                        ));
                    }
                }
                _ => why = Some("a malformed dentry record".into()),
            }
            why.is_none()
        });
        if let Err(e) = scanned {
            why = Some(format!("reading the dentries failed: {e}"));
        }
        // RocksDB orders keys as the array does; make sure rather than
        // assume, since a scan relies on it.
        if !copy.sorted.is_sorted_by(|a, b| a.0 < b.0) {
            why = Some("the store returned dentries out of order".into());
        }
        match why {
            None => {
                log_info!(
                    "find index: {} dentries in about {} MiB (budget {} MiB)",
                    copy.sorted.len(),
                    copy.bytes >> 20,
                    budget_bytes >> 20
                );
                *index.lock() = Some(copy);
            }
            Some(why) => log_warn!("find runs without its in-memory index: {why}"),
        }
        index
    }

    fn lock(&self) -> MutexGuard<'_, Option<Mirror>> {
        // A panic while holding the lock may have left the copy half
        // updated: drop it.
        self.copy.lock().unwrap_or_else(|poisoned| {
            let mut g = poisoned.into_inner();
            *g = None;
            g
        })
    }

    /// Whether finds read the copy (false once it was dropped).
    #[cfg(test)]
    fn is_on(&self) -> bool {
        self.lock().is_some()
    }

    /// Mirror the current values of `touched` dentry keys from `store`.
    fn refresh(&self, store: &dyn KvStore, touched: &[Vec<u8>]) {
        let mut guard = self.lock();
        let Some(copy) = guard.as_mut() else { return };
        let mut why: Option<String> = None;
        for key in touched {
            let Some((parent, name)) = split_key(key) else {
                why = Some("a malformed dentry key was written".into());
                break;
            };
            match store.get(key) {
                Ok(Some(v)) => {
                    let Ok(value) = <Value>::try_from(v.as_slice()) else {
                        why = Some("a malformed dentry record was written".into());
                        break;
                    };
                    if copy.insert((parent, Name::new(name)), value) {
                        copy.bytes += entry_bytes(name);
                    }
                }
                Ok(None) => {
                    if copy.remove((parent, Name::new(name))) {
                        copy.bytes -= entry_bytes(name);
                    }
                }
                Err(e) => {
                    why = Some(format!("reading a dentry back failed: {e}"));
                    break;
                }
            }
        }
        if why.is_none() && copy.bytes > self.budget_bytes {
            why = Some(format!(
                "more dentries than its budget of {} bytes",
                self.budget_bytes
            ));
        }
        if let Some(why) = why {
            *guard = None;
            log_warn!("find runs without its in-memory index from now on: {why}");
        }
    }

    /// `scan_visit` over the dentries from `start` (a key at or after the
    /// `DENT` prefix), from the copy; false when there is no copy.
    fn visit(&self, start: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> bool {
        let guard = self.lock();
        let Some(copy) = guard.as_ref() else {
            return false;
        };
        // The smallest (parent, name) whose key is >= start: pad a short
        // parent with zero bytes (the prefix itself gives parent 0).
        let tail = start.get(4..).unwrap_or_default();
        let mut head = [0u8; 8];
        let n = tail.len().min(8);
        head[..n].copy_from_slice(&tail[..n]);
        let name = tail.get(8..).unwrap_or_default();
        let from: Key = (u64::from_be_bytes(head), Name::new(name));
        let mut key = Vec::with_capacity(KEY_HEAD + 256);
        copy.visit(&from, &mut |(parent, name), value| {
            key.clear();
            key.extend_from_slice(keys::DENTRY);
            key.extend_from_slice(&parent.to_be_bytes());
            key.extend_from_slice(name.as_bytes());
            f(&key, value)
        });
        true
    }
}

/// The store as the server sees it: RocksDB, with the dentry index kept in
/// step on every write and read by find's scans.
pub(crate) struct IndexedKv {
    inner: Arc<dyn KvStore>,
    index: DentryIndex,
}

impl IndexedKv {
    /// Wrap `inner`, copying its dentries within `budget_bytes` (0: none).
    pub(crate) fn new(inner: Arc<dyn KvStore>, budget_bytes: usize) -> IndexedKv {
        let index = DentryIndex::build(inner.as_ref(), budget_bytes);
        IndexedKv { inner, index }
    }

    /// Whether finds are served from memory.
    #[cfg(test)]
    fn index_on(&self) -> bool {
        self.index.is_on()
    }
}

impl KvStore for IndexedKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let touched: Vec<Vec<u8>> = batch
            .keys()
            .filter(|k| k.starts_with(keys::DENTRY))
            .map(<[u8]>::to_vec)
            .collect();
        let written = self.inner.write(batch, sync);
        // Even after an error: read back whatever the store now holds.
        if !touched.is_empty() {
            self.index.refresh(self.inner.as_ref(), &touched);
        }
        written
    }

    fn scan(&self, prefix: &[u8], start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(prefix, start, limit)
    }

    fn sync_wal(&self) -> Result<()> {
        self.inner.sync_wal()
    }

    fn scan_visit(
        &self,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if prefix == keys::DENTRY && start.starts_with(prefix) && self.index.visit(start, f) {
            return Ok(());
        }
        self.inner.scan_visit(prefix, start, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::MemStore;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn dkey(parent: u64, name: &[u8]) -> Vec<u8> {
        let mut k = keys::DENTRY.to_vec();
        k.extend_from_slice(&parent.to_be_bytes());
        k.extend_from_slice(name);
        k
    }

    /// Short names (kept inline) and long ones (on the heap), interleaved
    /// in key order.
    fn test_name(i: u64) -> String {
        if i.is_multiple_of(4) {
            format!("n{i}-a-name-longer-than-the-inline-limit")
        } else {
            format!("n{i}")
        }
    }

    fn dval(kind: u8, ino: u64) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend_from_slice(&ino.to_le_bytes());
        v
    }

    fn visit_all(kv: &dyn KvStore, start: &[u8], stop_after: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        kv.scan_visit(keys::DENTRY, start, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            out.len() < stop_after
        })
        .unwrap();
        out
    }

    /// Random puts and deletes of dentries (and of other records), several
    /// per batch; the copy must answer every scan as the store does.
    fn random_batches(kv: &IndexedKv, rng: &mut Rng, batches: usize) {
        for _ in 0..batches {
            let mut b = WriteBatch::new();
            for _ in 0..1 + rng.below(4) {
                let parent = 1 + rng.below(5);
                let name = test_name(rng.below(60));
                match rng.below(5) {
                    0 => b.delete(&dkey(parent, name.as_bytes())),
                    1 => b.put(&keys::inode(madfs_types::InodeId(parent)), b"attr"),
                    _ => b.put(
                        &dkey(parent, name.as_bytes()),
                        &dval(1 + rng.below(3) as u8, rng.next()),
                    ),
                }
            }
            kv.write(b, false).unwrap();
        }
    }

    fn assert_same_scans(kv: &IndexedKv, rng: &mut Rng) {
        let inner = kv.inner.as_ref();
        let mut starts = vec![
            keys::DENTRY.to_vec(),
            b"DENT\x00\x00".to_vec(),
            dkey(3, b""),
            dkey(3, b"n3"),
            dkey(3, b"n3\0"),
            dkey(9, b""),
        ];
        for _ in 0..20 {
            starts.push(dkey(rng.below(7), test_name(rng.below(70)).as_bytes()));
            starts.push(dkey(rng.below(7), format!("n{}", rng.below(70)).as_bytes()));
        }
        for start in starts {
            for stop in [1, 7, usize::MAX] {
                assert_eq!(
                    visit_all(kv, &start, stop),
                    visit_all(inner, &start, stop),
                    "start {start:?}, stop after {stop}"
                );
            }
        }
    }

    #[test]
    fn the_copy_answers_scans_as_the_store_does() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let kv = IndexedKv::new(Arc::new(MemStore::new()), 1 << 20);
        for _ in 0..10 {
            random_batches(&kv, &mut rng, 50);
            assert_same_scans(&kv, &mut rng);
        }
        assert!(kv.index_on());
        // A fresh copy built from the same store holds the same entries.
        let rebuilt = IndexedKv::new(kv.inner.clone(), 1 << 20);
        assert!(rebuilt.index_on());
        assert_eq!(
            visit_all(&rebuilt, keys::DENTRY, usize::MAX),
            visit_all(kv.inner.as_ref(), keys::DENTRY, usize::MAX)
        );
        // The test really covered the copy: it holds entries.
        assert!(!visit_all(&kv, keys::DENTRY, usize::MAX).is_empty());
    }

    #[test]
    fn past_its_budget_the_copy_is_dropped_and_scans_stay_right() {
        let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let mut b = WriteBatch::new();
        for i in 0..10u64 {
            b.put(&dkey(1, format!("f{i}").as_bytes()), &dval(1, i));
        }
        store.write(b, false).unwrap();
        // Ten entries do not fit in the budget of five.
        let small = IndexedKv::new(store.clone(), 5 * entry_bytes(b"f0"));
        assert!(!small.index_on());
        assert_eq!(visit_all(&small, keys::DENTRY, usize::MAX).len(), 10);
        // Growing past the budget after start drops it too.
        let kv = IndexedKv::new(store, 12 * entry_bytes(b"f10"));
        assert!(kv.index_on());
        let mut rng = Rng(7);
        random_batches(&kv, &mut rng, 400);
        assert!(!kv.index_on());
        assert_same_scans(&kv, &mut rng);
        // No budget: no copy at all.
        assert!(!IndexedKv::new(Arc::new(MemStore::new()), 0).index_on());
    }

    #[test]
    fn a_malformed_dentry_drops_the_copy() {
        let kv = IndexedKv::new(Arc::new(MemStore::new()), 1 << 20);
        let mut b = WriteBatch::new();
        b.put(&dkey(1, b"ok"), &dval(1, 5));
        kv.write(b, false).unwrap();
        assert!(kv.index_on());
        let mut b = WriteBatch::new();
        b.put(&dkey(1, b"bad"), b"short");
        kv.write(b, false).unwrap();
        assert!(!kv.index_on());
        assert_eq!(visit_all(&kv, keys::DENTRY, usize::MAX).len(), 2);
    }

    #[test]
    fn concurrent_writers_of_the_same_names_converge() {
        let kv = Arc::new(IndexedKv::new(Arc::new(MemStore::new()), 1 << 20));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let kv = kv.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(t + 1);
                    for _ in 0..2000 {
                        let name = format!("n{}", rng.below(8));
                        let mut b = WriteBatch::new();
                        if rng.below(2) == 0 {
                            b.delete(&dkey(1, name.as_bytes()));
                        } else {
                            b.put(&dkey(1, name.as_bytes()), &dval(1, t));
                        }
                        kv.write(b, false).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert!(kv.index_on());
        assert_eq!(
            visit_all(kv.as_ref(), keys::DENTRY, usize::MAX),
            visit_all(kv.inner.as_ref(), keys::DENTRY, usize::MAX)
        );
    }
}
