//! An in-memory copy of this server's dentries (the `DENT` keyspace), so
//! that server-side find reads sorted arrays in RAM instead of RocksDB's
//! merging iterator: on 1,000,000 files over 4 servers the servers' CPU per
//! find fell from 168 ms to 48 ms (docs/PERFORMANCE.md).
//!
//! [`IndexedKv`] wraps the store: every batch goes to RocksDB first, then
//! the dentry keys it touched are read back and their current values copied
//! into the index under one lock. Reading back, instead of replaying the
//! batch, makes the copy converge whatever order concurrent writers finish
//! in: the last writer to take the lock reads a store that already holds
//! every write before it. (Keys are read one by one, not from a snapshot;
//! the server's dentry locks, held across each write, keep two batches from
//! touching one name at once, so no mix of two batches is ever seen.) Only
//! `scan_visit` over the `DENT` prefix (used by find alone) reads the copy;
//! every other read goes to RocksDB.
//!
//! The copy is sorted blocks of at most `BLOCK_ENTRIES` entries: an insert
//! or removal moves at most one block's entries, and a scan streams through
//! memory. A scan copies a few hundred entries out at a time and calls its
//! visitor without the lock, so writes wait microseconds, never a whole
//! find page. The copy is bounded by a byte budget that counts every
//! block's full capacity. Past it, or on any read error or malformed
//! record, it is dropped for good and find scans RocksDB: slower, never
//! wrong.

use crate::find_copy::{Budget, CopySlot, Share};
use crate::inode_index::{FindInode, InodeIndex};
use crate::keys;
use madfs_kv::{KvStore, Result, WriteBatch};
use madfs_types::InodeId;
use std::sync::Arc;

/// A dentry key is the prefix, the parent's id, then the name.
const KEY_HEAD: usize = 12;
/// A dentry value: kind (u8) and inode id (u64).
const VALUE_LEN: usize = 9;
/// Names up to this long are stored in the entry itself, so a scan reads
/// them without chasing a pointer to a cache line of their own.
const INLINE_NAME_MAX: usize = 22;
/// Entries per block at most (tests use tiny blocks to split and merge
/// often). A full block is 48 KiB: moving half of one costs a few us.
const BLOCK_ENTRIES: usize = if cfg!(test) { 8 } else { 1024 };
/// Entries a scan copies out per turn of the lock.
const VISIT_CHUNK: usize = if cfg!(test) { 3 } else { 512 };
/// Bytes of one entry in a block: a 32-byte key, a 9-byte value, padding.
const ENTRY_BYTES: usize = std::mem::size_of::<(Key, Value)>();
/// Bytes of one block, counted in full whatever its length.
const BLOCK_BYTES: usize = BLOCK_ENTRIES * ENTRY_BYTES + std::mem::size_of::<Vec<(Key, Value)>>();

// The layout the budget assumes.
const _: () = assert!(std::mem::size_of::<Name>() == 24 && ENTRY_BYTES == 48);

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

    /// Bytes on the heap besides the entry (with the allocator's header).
    fn heap_bytes(&self) -> usize {
        match self {
            Name::Inline { .. } => 0,
            Name::Heap(b) => 16 + b.len().next_multiple_of(16),
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
    // Bytewise, as RocksDB orders the keys (and the big-endian parent id
    // before it compares as the number does).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

type Key = (u64, Name);
type Value = [u8; VALUE_LEN];
type Block = Vec<(Key, Value)>;

/// (parent, name) of a dentry key; None for a malformed key.
fn split_key(key: &[u8]) -> Option<(u64, &[u8])> {
    if key.len() < KEY_HEAD || !key.starts_with(keys::DENTRY) {
        return None;
    }
    let parent = u64::from_be_bytes(key[4..KEY_HEAD].try_into().ok()?);
    Some((parent, &key[KEY_HEAD..]))
}

/// The copy: sorted, non-empty blocks, each allocated for `BLOCK_ENTRIES`
/// and in order (every key of a block is below every key of the next).
#[derive(Default)]
struct Mirror {
    blocks: Vec<Block>,
    /// Bytes of long names on the heap.
    heap_bytes: usize,
}

impl Mirror {
    fn new_block() -> Block {
        Vec::with_capacity(BLOCK_ENTRIES)
    }

    /// What the copy takes in memory, every block counted in full.
    fn bytes(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES + self.heap_bytes
    }

    fn entries(&self) -> usize {
        self.blocks.iter().map(Vec::len).sum()
    }

    /// The block that holds `key` or would: the first whose last key is at
    /// or after it, else the last block.
    fn block_for(&self, key: &Key) -> usize {
        let i = self
            .blocks
            .partition_point(|b| b.last().is_some_and(|(k, _)| k < key));
        i.min(self.blocks.len().saturating_sub(1))
    }

    /// Append an entry above every key held (building from a sorted scan).
    fn push_last(&mut self, key: Key, value: Value) {
        // Leave a quarter of each block free for the inserts to come.
        if self
            .blocks
            .last()
            .is_none_or(|b| b.len() >= BLOCK_ENTRIES * 3 / 4)
        {
            self.blocks.push(Self::new_block());
        }
        self.heap_bytes += key.1.heap_bytes();
        self.blocks
            .last_mut()
            .expect("just pushed")
            .push((key, value));
    }

    /// Set `key`.
    fn insert(&mut self, key: Key, value: Value) {
        if self.blocks.is_empty() {
            self.blocks.push(Self::new_block());
        }
        let mut b = self.block_for(&key);
        let mut at = match self.blocks[b].binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => {
                self.blocks[b][i].1 = value;
                return;
            }
            Err(i) => i,
        };
        if self.blocks[b].len() == BLOCK_ENTRIES {
            // Full: move its upper half to a new block after it, or only
            // its last quarter when the key goes at its end (ascending
            // creates), so that blocks left behind stay three quarters full.
            let cut = if at == BLOCK_ENTRIES {
                BLOCK_ENTRIES * 3 / 4
            } else {
                BLOCK_ENTRIES / 2
            };
            let mut upper = Self::new_block();
            upper.extend(self.blocks[b].drain(cut..));
            self.blocks.insert(b + 1, upper);
            if at > cut {
                b += 1;
                at -= cut;
            }
        }
        self.heap_bytes += key.1.heap_bytes();
        self.blocks[b].insert(at, (key, value));
    }

    /// Remove `key` if present.
    fn remove(&mut self, key: &Key) {
        if self.blocks.is_empty() {
            return;
        }
        let b = self.block_for(key);
        let Ok(i) = self.blocks[b].binary_search_by(|(k, _)| k.cmp(key)) else {
            return;
        };
        let (old, _) = self.blocks[b].remove(i);
        self.heap_bytes -= old.1.heap_bytes();
        // Keep blocks at least a quarter full where a neighbour has room,
        // so that removals give memory back.
        let len = self.blocks[b].len();
        if len == 0 {
            self.blocks.remove(b);
        } else if len < BLOCK_ENTRIES / 4
            && self
                .blocks
                .get(b + 1)
                .is_some_and(|next| len + next.len() <= BLOCK_ENTRIES * 3 / 4)
        {
            let next = self.blocks.remove(b + 1);
            self.blocks[b].extend(next);
        }
    }

    /// Every invariant the scans and the budget rely on.
    #[cfg(test)]
    fn check(&self) {
        let mut last: Option<&Key> = None;
        let mut heap = 0;
        for b in &self.blocks {
            assert!(!b.is_empty(), "an empty block");
            assert_eq!(b.capacity(), BLOCK_ENTRIES, "a block grew or shrank");
            for (k, _) in b {
                assert!(last.is_none_or(|l| l < k), "keys out of order");
                last = Some(k);
                heap += k.1.heap_bytes();
            }
        }
        assert_eq!(heap, self.heap_bytes);
    }

    /// Call `emit` on up to `max` entries from `from` on (after it when
    /// `!inclusive`), in key order; how many.
    fn each_from(
        &self,
        from: &Key,
        inclusive: bool,
        max: usize,
        mut emit: impl FnMut(&Key, &Value),
    ) -> usize {
        let mut b = self
            .blocks
            .partition_point(|blk| blk.last().is_some_and(|(k, _)| k < from));
        let mut first = true;
        let mut n = 0;
        while n < max {
            let Some(blk) = self.blocks.get(b) else {
                break;
            };
            let start = if first {
                blk.partition_point(|(k, _)| if inclusive { k < from } else { k <= from })
            } else {
                0
            };
            for (k, v) in blk[start..].iter().take(max - n) {
                emit(k, v);
                n += 1;
            }
            first = false;
            b += 1;
        }
        n
    }
}

/// How a scan of the copy ended.
enum Visited {
    /// Every entry seen, or the visitor stopped.
    Done,
    /// There is no copy (or no more): scan the store from this key on.
    Dropped(Vec<u8>),
}

/// The index proper: the copy, or nothing once it was dropped.
pub(crate) struct DentryIndex {
    slot: CopySlot<Mirror>,
}

impl DentryIndex {
    /// Copy every dentry of `store`, within `budget` (limit 0: no index).
    /// Runs before the server serves, so no write races with it.
    fn build(store: &dyn KvStore, budget: Arc<Budget>) -> DentryIndex {
        let index = DentryIndex {
            slot: CopySlot::empty(
                budget,
                Share::Dentries,
                "find runs without its in-memory index",
            ),
        };
        if index.slot.budget().limit() == 0 {
            return index;
        }
        let mut copy = Mirror::default();
        let mut why: Option<String> = None;
        let mut last: Option<Key> = None;
        let scanned = store.scan_visit(keys::DENTRY, keys::DENTRY, &mut |k, v| {
            match (split_key(k), <Value>::try_from(v)) {
                (Some((parent, name)), Ok(value)) => {
                    let key = (parent, Name::new(name));
                    // RocksDB hands the keys over in order; make sure rather
                    // than assume, since the blocks rely on it.
                    if last.as_ref().is_some_and(|l| *l >= key) {
                        why = Some("the store returned dentries out of order".into());
                    } else {
                        last = Some(key.clone());
                        copy.push_last(key, value);
                        if !index.slot.set_bytes(copy.bytes()) {
                            why = Some(index.over_budget());
                        }
                    }
                }
                _ => why = Some("a malformed dentry record".into()),
            }
            why.is_none()
        });
        if let Err(e) = scanned {
            why = Some(format!("reading the dentries failed: {e}"));
        }
        index.slot.install(why.map_or(Ok(copy), Err));
        index
    }

    fn over_budget(&self) -> String {
        format!(
            "more dentries than its budget of {} bytes",
            self.slot.budget().limit()
        )
    }

    /// Entries held, when there is a copy.
    fn entries(&self) -> Option<usize> {
        self.slot.lock().as_ref().map(Mirror::entries)
    }

    /// Whether finds read the copy (false once it was dropped).
    fn is_on(&self) -> bool {
        self.slot.is_on()
    }

    /// Mirror the current values of `touched` dentry keys from `store`.
    fn refresh(&self, store: &dyn KvStore, touched: &[Vec<u8>]) {
        let mut guard = self.slot.lock();
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
                    copy.insert((parent, Name::new(name)), value);
                }
                Ok(None) => copy.remove(&(parent, Name::new(name))),
                Err(e) => {
                    why = Some(format!("reading a dentry back failed: {e}"));
                    break;
                }
            }
        }
        if why.is_none() && !self.slot.set_bytes(copy.bytes()) {
            why = Some(self.over_budget());
        }
        if let Some(why) = why {
            self.slot.drop_locked(&mut guard, &why);
        }
    }

    /// `scan_visit` over the dentries from `start` (a key that begins with
    /// the `DENT` prefix), from the copy, a chunk at a time.
    fn visit(&self, start: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Visited {
        // The smallest (parent, name) whose key is >= start: pad a short
        // parent with zero bytes (the prefix itself gives parent 0).
        let tail = start.get(4..).unwrap_or_default();
        let mut head = [0u8; 8];
        let n = tail.len().min(8);
        head[..n].copy_from_slice(&tail[..n]);
        let name = tail.get(8..).unwrap_or_default();
        let mut from: Key = (u64::from_be_bytes(head), Name::new(name));
        let mut inclusive = true;
        // A chunk: the entries' keys and values encoded back to back, and
        // where each key ends (its value is the next VALUE_LEN bytes).
        let mut bytes = Vec::with_capacity(VISIT_CHUNK * (KEY_HEAD + 16 + VALUE_LEN));
        let mut ends = Vec::with_capacity(VISIT_CHUNK);
        loop {
            bytes.clear();
            ends.clear();
            let taken = match self.slot.lock().as_ref() {
                Some(copy) => copy.each_from(&from, inclusive, VISIT_CHUNK, |(parent, name), v| {
                    bytes.extend_from_slice(keys::DENTRY);
                    bytes.extend_from_slice(&parent.to_be_bytes());
                    bytes.extend_from_slice(name.as_bytes());
                    ends.push(bytes.len());
                    bytes.extend_from_slice(v);
                }),
                None if inclusive => {
                    // Dropped before anything was visited: the store scans
                    // from the caller's own start.
                    return Visited::Dropped(start.to_vec());
                }
                None => {
                    // Dropped under the scan: go on from the store.
                    let mut key = keys::DENTRY.to_vec();
                    key.extend_from_slice(&from.0.to_be_bytes());
                    key.extend_from_slice(from.1.as_bytes());
                    key.push(0); // the first key after the last one visited
                    return Visited::Dropped(key);
                }
            };
            // The visitor runs without the lock: it may read the store.
            let mut start = 0;
            for &end in &ends {
                if !f(&bytes[start..end], &bytes[end..end + VALUE_LEN]) {
                    return Visited::Done;
                }
                start = end + VALUE_LEN;
            }
            if taken < VISIT_CHUNK {
                return Visited::Done;
            }
            // Go on after the chunk's last key.
            let last_start = ends.len().checked_sub(2).map_or(0, |i| ends[i] + VALUE_LEN);
            let (parent, name) = split_key(&bytes[last_start..ends[ends.len() - 1]])
                .expect("keys encoded just above");
            from = (parent, Name::new(name));
            inclusive = false;
        }
    }
}

/// The store as the server sees it: RocksDB, with the dentry and inode
/// copies kept in step on every write and read by find alone.
pub(crate) struct IndexedKv {
    inner: Arc<dyn KvStore>,
    index: DentryIndex,
    inodes: InodeIndex,
    budget: Arc<Budget>,
}

impl IndexedKv {
    /// Wrap `inner`, copying its dentries and then its inodes within
    /// `budget_bytes` together (0: no copies).
    pub(crate) fn new(inner: Arc<dyn KvStore>, budget_bytes: usize) -> IndexedKv {
        let budget = Arc::new(Budget::new(budget_bytes));
        let index = DentryIndex::build(inner.as_ref(), budget.clone());
        let inodes = InodeIndex::build(inner.as_ref(), budget.clone());
        if let (Some(dentries), Some(inode_count)) = (index.entries(), inodes.len()) {
            tracing::info!(
                "find index: {dentries} dentries and {inode_count} inodes in {} MiB (budget {} MiB)",
                budget.used() >> 20,
                budget_bytes >> 20
            );
        }
        IndexedKv {
            inner,
            index,
            inodes,
            budget,
        }
    }

    /// What the inode copy holds of `ino`: None when there is no copy (ask
    /// the store), Some(None) when there is no such inode.
    pub(crate) fn copied_inode(&self, ino: InodeId) -> Option<Option<FindInode>> {
        self.inodes.get(ino)
    }

    /// Memory the dentry and inode copies take now.
    pub(crate) fn index_bytes(&self) -> usize {
        self.budget.used()
    }

    /// Whether finds are served from memory.
    #[cfg(test)]
    pub(crate) fn index_on(&self) -> bool {
        self.index.is_on()
    }

    /// Whether finds look inodes up in memory.
    #[cfg(test)]
    pub(crate) fn inodes_on(&self) -> bool {
        self.inodes.is_on()
    }
}

impl KvStore for IndexedKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        let (dentries_on, inodes_on) = (self.index.is_on(), self.inodes.is_on());
        if !dentries_on && !inodes_on {
            return self.inner.write(batch, sync);
        }
        let (mut dentries, mut inodes) = (Vec::new(), Vec::new());
        for k in batch.keys() {
            if dentries_on && k.starts_with(keys::DENTRY) {
                dentries.push(k.to_vec());
            } else if inodes_on && k.starts_with(keys::INODE) {
                inodes.push(k.to_vec());
            }
        }
        let written = self.inner.write(batch, sync);
        // Even after an error: read back whatever the store now holds.
        // Inodes first, so a find that sees a new dentry finds its inode.
        if !inodes.is_empty() {
            self.inodes.refresh(self.inner.as_ref(), &inodes);
        }
        if !dentries.is_empty() {
            self.index.refresh(self.inner.as_ref(), &dentries);
            if self.budget.over() {
                self.inodes.give_way();
            }
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
        if prefix != keys::DENTRY || !start.starts_with(prefix) || !self.index.is_on() {
            return self.inner.scan_visit(prefix, start, f);
        }
        match self.index.visit(start, f) {
            Visited::Done => Ok(()),
            Visited::Dropped(from) => self.inner.scan_visit(prefix, &from, f),
        }
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
    /// per batch, `deletes` in 10 of them deletes; the copy must answer
    /// every scan as the store does.
    fn random_batches(kv: &IndexedKv, rng: &mut Rng, batches: usize, deletes: u64) {
        for _ in 0..batches {
            let mut b = WriteBatch::new();
            for _ in 0..1 + rng.below(4) {
                let parent = 1 + rng.below(5);
                let name = test_name(rng.below(60));
                let dice = rng.below(10);
                match dice {
                    _ if dice < deletes => b.delete(&dkey(parent, name.as_bytes())),
                    _ if dice == 9 => b.put(&keys::inode(madfs_types::InodeId(parent)), b"attr"),
                    _ => b.put(
                        &dkey(parent, name.as_bytes()),
                        &dval(1 + rng.below(3) as u8, rng.next()),
                    ),
                }
            }
            kv.write(b, false).unwrap();
            if let Some(m) = kv.index.slot.lock().as_ref() {
                m.check();
            }
        }
    }

    fn assert_same_scans(kv: &IndexedKv, rng: &mut Rng) {
        let inner = kv.inner.as_ref();
        let mut starts = vec![
            keys::DENTRY.to_vec(),
            b"DENT\x00\x00".to_vec(),
            b"DENT\x00\x00\x00\x00\x00\x00\x03".to_vec(), // a short, non-zero parent
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
        // Growing (blocks split), then shrinking (blocks empty and merge).
        for deletes in [2, 2, 2, 2, 2, 8, 8, 8, 8, 2, 9, 9, 9] {
            random_batches(&kv, &mut rng, 50, deletes);
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
        // Ten entries take two blocks (built three quarters full).
        let small = IndexedKv::new(store.clone(), BLOCK_BYTES);
        assert!(!small.index_on());
        assert_eq!(visit_all(&small, keys::DENTRY, usize::MAX).len(), 10);
        // Growing past the budget after start drops it too.
        let kv = IndexedKv::new(store, 4 * BLOCK_BYTES);
        assert!(kv.index_on());
        let mut rng = Rng(7);
        random_batches(&kv, &mut rng, 400, 2);
        assert!(!kv.index_on());
        assert_same_scans(&kv, &mut rng);
        // No budget: no copy at all.
        assert!(!IndexedKv::new(Arc::new(MemStore::new()), 0).index_on());
    }

    #[test]
    fn a_copy_dropped_during_a_scan_hands_over_to_the_store() {
        // Dropped inside the first chunk, mid-chunk, at a chunk's last entry.
        for drop_at in [0, 1, 4, 5] {
            let store: Arc<dyn KvStore> = Arc::new(MemStore::new());
            let mut b = WriteBatch::new();
            for i in 0..40u64 {
                b.put(&dkey(1, format!("f{i:02}").as_bytes()), &dval(1, i));
            }
            store.write(b, false).unwrap();
            let kv = IndexedKv::new(store, 40 * BLOCK_BYTES);
            assert!(kv.index_on());
            let mut seen = Vec::new();
            kv.scan_visit(keys::DENTRY, keys::DENTRY, &mut |k, _| {
                if seen.len() == drop_at {
                    // Past the budget from the visitor (which runs without
                    // the lock): more entries, all after the scan's position.
                    let mut b = WriteBatch::new();
                    for i in 0..1000u64 {
                        b.put(&dkey(2, format!("g{i:04}").as_bytes()), &dval(1, i));
                    }
                    kv.write(b, false).unwrap();
                    assert!(!kv.index_on());
                }
                seen.push(k.to_vec());
                true
            })
            .unwrap();
            let all: Vec<Vec<u8>> = visit_all(kv.inner.as_ref(), keys::DENTRY, usize::MAX)
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            assert_eq!(
                seen, all,
                "dropped at {drop_at}: every entry once, in order, across the hand-over"
            );
        }
    }

    #[test]
    fn a_full_block_splits_wherever_the_key_goes() {
        for at in 0..=BLOCK_ENTRIES as u64 {
            let mut m = Mirror::default();
            for i in 0..BLOCK_ENTRIES as u64 {
                m.insert(
                    (1, Name::new(&[b'a', b'0' + 2 * i as u8 + 2])),
                    [0; VALUE_LEN],
                );
            }
            assert_eq!(m.blocks.len(), 1);
            // Odd keys fall between the even ones: position `at`.
            m.insert(
                (1, Name::new(&[b'a', b'0' + 2 * at as u8 + 1])),
                [1; VALUE_LEN],
            );
            m.check();
            assert_eq!(m.blocks.len(), 2);
            assert_eq!(m.entries(), BLOCK_ENTRIES + 1);
            let mut seen = Vec::new();
            m.each_from(&(0, Name::new(b"")), true, usize::MAX, |k, _| {
                seen.push(k.1.as_bytes()[1])
            });
            assert!(
                seen.is_sorted() && seen.len() == BLOCK_ENTRIES + 1,
                "at {at}"
            );
        }
    }

    #[test]
    fn removals_give_blocks_back() {
        let mut m = Mirror::default();
        for i in 0..400u64 {
            m.insert(
                (1, Name::new(format!("f{i:03}").as_bytes())),
                [1; VALUE_LEN],
            );
        }
        assert!(m.blocks.len() >= 400 / BLOCK_ENTRIES);
        for i in 0..400u64 {
            if i % 40 != 0 {
                m.remove(&(1, Name::new(format!("f{i:03}").as_bytes())));
            }
        }
        m.check();
        assert_eq!(m.entries(), 10);
        assert!(m.blocks.len() <= 10, "{} blocks", m.blocks.len());
        assert!(m.blocks.iter().all(|b| !b.is_empty()));
        for i in (0..400u64).step_by(40) {
            m.remove(&(1, Name::new(format!("f{i:03}").as_bytes())));
        }
        assert_eq!(m.bytes(), 0);
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
