//! A bounded in-memory cache of chunk extents, so data written with
//! O_DIRECT (which bypasses the page cache, chunks.rs) is read back from
//! memory instead of the disk. IO500 and checkpoint/restart jobs read what
//! they just wrote; without this every such read went to the disk at its
//! direct rate (docs/PERFORMANCE.md, "Reads of what was just written").
//!
//! What enters: the page-aligned copy a direct write already makes (no
//! extra copy), and what a direct read brought in while the cache has free
//! room (reads never evict). Buffered writes and reads leave their data in
//! the page cache, so they only invalidate here.
//!
//! Coherence (a stale byte served is data corruption). Every operation that
//! changes chunk data registers before it touches the disk and leaves after
//! (`Ticket`, `InodeTicket`; dropping one leaves, so an error path cannot
//! forget). Registering drops what is cached of the range it changes. An
//! extent is inserted when its operation leaves, and only if no other
//! operation that changes an overlapping range of the chunk (or any chunk
//! of the inode, for truncate and purge) was in flight at any moment
//! between the two: each registering operation marks the overlapping
//! operations in flight as conflicted, and marks itself conflicted if it
//! meets one. So whatever order the disk applied overlapping operations in,
//! none of them can leave bytes here that the disk no longer holds. The
//! invariant, checked after every step by the tests: every cached byte
//! lies inside its chunk file and equals it, unless an operation changing
//! it is in flight (and then it is not cached). Reads of the disk that
//! fill the cache register too, and are conflicted by any overlapping
//! change. A read is served from here only when extents cover all of it.
//!
//! Memory: buffers are counted in bytes (their allocation, while any
//! extent shows part of them) plus a fixed cost per extent, against the
//! budget (`madfs server --cache-mib`). A write that pushes the count over
//! it evicts whole chunks, least recently used first, under the same short
//! lock; nothing waits for the disk, and freed buffers are dropped after
//! the lock is released. Unlike the page cache, this memory cannot be
//! reclaimed by the kernel, so the cache also leaves an eighth of the
//! machine's memory available (memory.rs): past that it stops growing and
//! gives memory back, on the next request or within a second (a thread
//! watches). The cache never holds the only copy of anything:
//! data is on disk (or in the page cache) before it is inserted, and fsync
//! still syncs every chunk file.

use crate::memory::MemInfo;
use madfs_types::{ChunkIndex, InodeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Bytes counted for each extent besides its buffer: its map slot and
/// record (under 64 bytes each in a B-tree node).
const EXTENT_OVERHEAD_BYTES: usize = 64;
/// Extents one chunk holds at most. Small overwrites into cached data cut
/// extents in two; past this the pieces are dropped instead, so a chunk
/// cannot be cut into ever more pieces.
const EXTENTS_PER_CHUNK_MAX: usize = 64;

/// Memory the cache can hold: bytes and what their allocation costs.
pub trait CacheBytes: Send + Sync + 'static {
    fn bytes(&self) -> &[u8];
    /// The same bytes, to fill a recycled buffer.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Memory held, in bytes (at least `bytes().len()`).
    fn footprint(&self) -> usize;
}

impl CacheBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn footprint(&self) -> usize {
        self.capacity()
    }
}

/// A buffer the cache holds, shared by the extents cut from it.
struct Buffer {
    /// Taken out only when the buffer is dropped.
    data: Option<Box<dyn CacheBytes>>,
    /// Extents showing part of it. Changed under the cache's lock only
    /// (atomic just to share the buffer between threads); its memory is
    /// counted while this is above 0.
    views: AtomicU32,
    /// The cache whose pool takes the memory back when the last reference
    /// (an extent's or a reader's) goes.
    home: Weak<Shared>,
}

impl Buffer {
    fn new(data: Box<dyn CacheBytes>, home: Weak<Shared>) -> Buffer {
        Buffer {
            data: Some(data),
            views: AtomicU32::new(0),
            home,
        }
    }

    fn data(&self) -> &dyn CacheBytes {
        self.data
            .as_deref()
            .expect("a buffer keeps its data until dropped")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let (Some(data), Some(home)) = (self.data.take(), self.home.upgrade()) {
            home.recycle(data);
        }
    }
}

/// Buffers no extent shows any more, by length, for the next direct
/// writes: memory this process has touched already. A buffer it never
/// touched costs the kernel a fault and a zeroed page per 4 KiB; on the
/// test VM that was a third of the servers' CPU time while a write filled
/// the cache, and glibc did not hand freed cache buffers back to later
/// writes (a second 2 GiB write after a removal grew the servers by as
/// much again; docs/PERFORMANCE.md).
#[derive(Default)]
struct Pool {
    by_len: HashMap<usize, Vec<Box<dyn CacheBytes>>>,
    /// Footprint of every buffer held: counted with the cache's bytes
    /// against its budget.
    bytes: usize,
}

impl Pool {
    fn put(&mut self, data: Box<dyn CacheBytes>) {
        self.bytes += data.footprint();
        self.by_len
            .entry(data.bytes().len())
            .or_default()
            .push(data);
    }

    fn take(&mut self, len: usize) -> Option<Box<dyn CacheBytes>> {
        let list = self.by_len.get_mut(&len)?;
        let data = list.pop()?;
        if list.is_empty() {
            self.by_len.remove(&len);
        }
        self.bytes = self
            .bytes
            .checked_sub(data.footprint())
            .expect("chunk cache: pool bytes counted short");
        Some(data)
    }

    /// Any buffer, to give memory back.
    fn take_any(&mut self) -> Option<Box<dyn CacheBytes>> {
        let len = *self.by_len.keys().next()?;
        self.take(len)
    }
}

/// Part of a buffer cached at some offset of a chunk.
struct Extent {
    buf: Arc<Buffer>,
    /// Where in the buffer the extent starts.
    at: usize,
    len: u64,
}

#[cfg(test)]
impl Extent {
    fn bytes(&self) -> &[u8] {
        &self.buf.data().bytes()[self.at..self.at + self.len as usize]
    }
}

/// An operation on a chunk between its start and its end.
struct InFlight {
    id: u64,
    start: u64,
    end: u64,
    /// Changes the chunk (a write), or only reads it to fill the cache.
    mutates: bool,
    /// Another operation overlapped it in range and time, so what it
    /// wrote or read may not be what the disk holds now.
    conflicted: bool,
}

#[derive(Default)]
struct ChunkState {
    /// Non-overlapping extents by offset in the chunk.
    extents: BTreeMap<u64, Extent>,
    /// Operations in flight: at most the blocking pool's threads, since
    /// each runs start to end on one of them.
    inflight: Vec<InFlight>,
    /// Position in the LRU order while the chunk holds extents.
    stamp: Option<u64>,
}

#[derive(Default)]
struct InodeState {
    /// Truncates and purges of the inode in flight.
    busy: u32,
    chunks: HashMap<u32, ChunkState>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<InodeId, InodeState>,
    /// Chunks holding extents, least recently used first.
    lru: BTreeMap<u64, (InodeId, u32)>,
    /// Source of ticket ids and LRU stamps.
    seq: u64,
    /// Bytes counted against the budget.
    charged: usize,
    /// Set when a panic left the state in doubt: nothing is served or
    /// inserted any more (always safe), until the server restarts.
    dead: bool,
}

/// Counters for the log and the tests.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    /// Reads that went to the disk while the cache was on.
    pub misses: u64,
    pub hit_bytes: u64,
    pub inserted_bytes: u64,
    pub evicted_bytes: u64,
    /// Bytes counted against the budget now: extents, and buffers kept
    /// for reuse.
    pub charged: usize,
    pub pooled: usize,
}

/// This machine's memory now (memory.rs; a stand-in in tests).
pub type MemoryProbe = Arc<dyn Fn() -> Option<MemInfo> + Send + Sync>;

/// The share of the machine's memory the cache leaves available: it stops
/// growing when less would remain, and gives back what it holds beyond
/// that (the kernel cannot reclaim it as it would the page cache).
const MEMORY_RESERVE_DIVISOR: u64 = 8;
/// How often a watched cache checks the machine's memory while no request
/// does (an idle server under memory pressure gives memory back too).
const TRIM_PERIOD: Duration = Duration::from_secs(1);

pub struct ChunkCache {
    shared: Arc<Shared>,
}

/// The cache's state and counters, shared with its memory watch.
pub struct Shared {
    budget: usize,
    state: Mutex<State>,
    /// Locked after `state` when both are (never the other way round);
    /// a buffer's drop takes only this.
    pool: Mutex<Pool>,
    /// `State::charged`, readable without the state's lock.
    charged_now: AtomicUsize,
    memory: Option<MemoryProbe>,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    inserted_bytes: AtomicU64,
    evicted_bytes: AtomicU64,
}

impl std::ops::Deref for ChunkCache {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// Counting views of buffers in and out while the lock is held; buffers
/// given back are kept to drop after it is released.
struct Acct<'a> {
    charged: &'a mut usize,
    freed: &'a mut Vec<Arc<Buffer>>,
}

impl Acct<'_> {
    fn view(&mut self, buf: &Arc<Buffer>, at: usize, len: u64) -> Extent {
        if buf.views.fetch_add(1, Ordering::Relaxed) == 0 {
            *self.charged += buf.data().footprint();
        }
        *self.charged += EXTENT_OVERHEAD_BYTES;
        Extent {
            buf: buf.clone(),
            at,
            len,
        }
    }

    /// Give back an extent; its buffer's memory too if it was the last view.
    /// Returns the bytes given back.
    fn release(&mut self, e: Extent) -> usize {
        let before = e.buf.views.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "chunk cache: a buffer lost count of its views");
        let mut refund = EXTENT_OVERHEAD_BYTES;
        if before == 1 {
            refund += e.buf.data().footprint();
        }
        *self.charged = self
            .charged
            .checked_sub(refund)
            .expect("chunk cache: more bytes given back than counted");
        self.freed.push(e.buf);
        refund
    }
}

/// Drop what `extents` cache of `[start, end)`, keeping the parts of
/// extents outside it (views of the same buffers, no copy).
fn cut(extents: &mut BTreeMap<u64, Extent>, start: u64, end: u64, acct: &mut Acct) {
    if start >= end {
        return;
    }
    let mut keys = Vec::new();
    if let Some((&k, e)) = extents.range(..start).next_back() {
        if k + e.len > start {
            keys.push(k);
        }
    }
    keys.extend(extents.range(start..end).map(|(&k, _)| k));
    for k in keys {
        let e = extents.remove(&k).expect("a key just listed");
        let e_end = k + e.len;
        // Pieces first, then the original: a buffer kept by a piece is
        // never counted out and in again.
        if k < start && extents.len() < EXTENTS_PER_CHUNK_MAX {
            let piece = acct.view(&e.buf, e.at, start - k);
            extents.insert(k, piece);
        }
        if e_end > end && extents.len() < EXTENTS_PER_CHUNK_MAX {
            let piece = acct.view(&e.buf, e.at + (end - k) as usize, e_end - end);
            extents.insert(end, piece);
        }
        acct.release(e);
    }
}

fn overlaps(a: &InFlight, start: u64, end: u64) -> bool {
    a.start < end && start < a.end
}

impl State {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Register an operation on `[start, end)` of a chunk; its id.
    fn register(
        &mut self,
        ino: InodeId,
        index: u32,
        (start, end): (u64, u64),
        mutates: bool,
        freed: &mut Vec<Arc<Buffer>>,
    ) -> u64 {
        let id = self.next_seq();
        let State {
            inodes,
            lru,
            charged,
            ..
        } = self;
        let inode = inodes.entry(ino).or_default();
        // A truncate or purge in flight may undo whatever this does.
        let mut conflicted = inode.busy > 0;
        let chunk = inode.chunks.entry(index).or_default();
        for op in chunk.inflight.iter_mut() {
            if !overlaps(op, start, end) || !(mutates || op.mutates) {
                continue;
            }
            // A change conflicts with every overlapping operation; a fill
            // only with overlapping changes, and changes nothing itself.
            if op.mutates {
                conflicted = true;
            }
            if mutates {
                op.conflicted = true;
                conflicted = true;
            }
        }
        if mutates {
            let mut acct = Acct { charged, freed };
            cut(&mut chunk.extents, start, end, &mut acct);
            if chunk.extents.is_empty() {
                if let Some(s) = chunk.stamp.take() {
                    lru.remove(&s);
                }
            }
        }
        chunk.inflight.push(InFlight {
            id,
            start,
            end,
            mutates,
            conflicted,
        });
        id
    }

    /// End operation `id`; whether it may insert what it wrote or read.
    fn unregister(&mut self, ino: InodeId, index: u32, id: u64) -> Option<(u64, u64, bool)> {
        let chunk = self.inodes.get_mut(&ino)?.chunks.get_mut(&index)?;
        let pos = chunk.inflight.iter().position(|op| op.id == id)?;
        let op = chunk.inflight.swap_remove(pos);
        (!op.conflicted).then_some((op.start, op.end, op.mutates))
    }

    /// Forget a chunk (and its inode) that holds nothing and has nothing
    /// in flight.
    fn tidy(&mut self, ino: InodeId, index: u32) {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return;
        };
        if let Some(chunk) = inode.chunks.get_mut(&index) {
            if chunk.extents.is_empty() {
                if let Some(s) = chunk.stamp.take() {
                    self.lru.remove(&s);
                }
                if chunk.inflight.is_empty() {
                    inode.chunks.remove(&index);
                }
            }
        }
        if inode.chunks.is_empty() && inode.busy == 0 {
            self.inodes.remove(&ino);
        }
    }

    fn touch(&mut self, ino: InodeId, index: u32) {
        let s = self.next_seq();
        let Some(chunk) = self
            .inodes
            .get_mut(&ino)
            .and_then(|i| i.chunks.get_mut(&index))
        else {
            return;
        };
        if let Some(old) = chunk.stamp.replace(s) {
            self.lru.remove(&old);
        }
        self.lru.insert(s, (ino, index));
    }

    /// Insert `buf` at `offset` of a chunk (replacing whatever is cached
    /// there). Whether it went in.
    fn insert(
        &mut self,
        ino: InodeId,
        index: u32,
        offset: u64,
        buf: Arc<Buffer>,
        freed: &mut Vec<Arc<Buffer>>,
    ) -> bool {
        let len = buf.data().bytes().len() as u64;
        let State {
            inodes, charged, ..
        } = self;
        let Some(chunk) = inodes.get_mut(&ino).and_then(|i| i.chunks.get_mut(&index)) else {
            return false;
        };
        let mut acct = Acct { charged, freed };
        cut(&mut chunk.extents, offset, offset + len, &mut acct);
        if chunk.extents.len() >= EXTENTS_PER_CHUNK_MAX {
            return false;
        }
        let e = acct.view(&buf, 0, len);
        chunk.extents.insert(offset, e);
        self.touch(ino, index);
        true
    }

    /// Evict least recently used chunks until at most `target` bytes are
    /// counted; the bytes evicted.
    fn evict_to(&mut self, target: usize, freed: &mut Vec<Arc<Buffer>>) -> usize {
        let mut evicted = 0;
        while self.charged > target {
            let Some((_, (ino, index))) = self.lru.pop_first() else {
                break;
            };
            let State {
                inodes, charged, ..
            } = self;
            if let Some(chunk) = inodes.get_mut(&ino).and_then(|i| i.chunks.get_mut(&index)) {
                chunk.stamp = None;
                let mut acct = Acct { charged, freed };
                for (_, e) in std::mem::take(&mut chunk.extents) {
                    evicted += acct.release(e);
                }
            }
            self.tidy(ino, index);
        }
        evicted
    }
}

impl Shared {
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The state, or None when a panic under the lock left it in doubt.
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        let st = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                let mut g = poisoned.into_inner();
                if !g.dead {
                    tracing::warn!("chunk cache: turned off after a panic");
                    g.dead = true;
                    g.inodes.clear();
                    g.lru.clear();
                    g.charged = 0;
                }
                g
            }
        };
        (!st.dead).then_some(st)
    }

    /// What the cache may hold now that it holds `charged` bytes: its
    /// budget, less whatever would eat into the machine's reserve.
    fn limit(&self, charged: usize) -> usize {
        let Some(m) = self.memory.as_ref().and_then(|probe| probe()) else {
            return self.budget;
        };
        let limit = m.limit_for(charged as u64, MEMORY_RESERVE_DIVISOR);
        usize::try_from(limit).map_or(self.budget, |l| l.min(self.budget))
    }

    /// Count a read the cache could not serve (the caller read the disk).
    pub fn count_miss(&self) {
        if self.budget > 0 {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bring the cache's bytes and its pool's down to `target` in all,
    /// the pool's idle buffers first, then least recently used chunks
    /// (their buffers, dropped by the caller after the lock, come back to
    /// the pool where they fit). Called with the state's lock held.
    fn shrink(
        &self,
        st: &mut State,
        target: usize,
        freed: &mut Vec<Arc<Buffer>>,
        idle: &mut Vec<Box<dyn CacheBytes>>,
    ) {
        let pooled = {
            let mut pool = self.pool();
            while st.charged + pool.bytes > target {
                match pool.take_any() {
                    Some(b) => idle.push(b),
                    None => break,
                }
            }
            pool.bytes
        };
        let evicted = st.evict_to(target.saturating_sub(pooled), freed);
        self.evicted_bytes
            .fetch_add(evicted as u64, Ordering::Relaxed);
        self.charged_now.store(st.charged, Ordering::Relaxed);
    }

    /// Keep `data` for a later write if the budget (and the machine's
    /// memory) has room for it beside what the cache holds; else free it.
    fn recycle(&self, data: Box<dyn CacheBytes>) {
        if self.budget == 0 {
            return;
        }
        let charged = self.charged_now.load(Ordering::Relaxed);
        let limit = self.limit(charged);
        let mut pool = self.pool();
        if charged + pool.bytes + data.footprint() <= limit {
            pool.put(data);
        }
    }

    /// Give back what the machine's memory no longer allows.
    pub fn trim(&self) {
        let Some(mut st) = self.lock() else { return };
        let limit = self.limit(st.charged);
        let (mut freed, mut idle) = (Vec::new(), Vec::new());
        self.shrink(&mut st, limit, &mut freed, &mut idle);
        drop(st);
        drop(freed);
    }
}

impl ChunkCache {
    /// A cache of at most `budget` bytes (0: off, every call a no-op),
    /// whatever the machine's memory.
    pub fn new(budget: usize) -> ChunkCache {
        Self::build(budget, None)
    }

    /// A cache of at most `budget` bytes that also leaves an eighth of the
    /// machine's memory available, as `memory` tells; with `watch`, a
    /// thread checks that every `TRIM_PERIOD` while no request does.
    pub fn with_memory(budget: usize, memory: MemoryProbe, watch: bool) -> ChunkCache {
        let cache = Self::build(budget, Some(memory));
        if watch && budget > 0 {
            let shared = Arc::downgrade(&cache.shared);
            let spawned = std::thread::Builder::new()
                .name("madfs-cache-trim".into())
                .spawn(move || loop {
                    std::thread::sleep(TRIM_PERIOD);
                    // Ends with the cache.
                    let Some(s) = shared.upgrade() else { break };
                    s.trim();
                });
            if let Err(e) = spawned {
                tracing::warn!("chunk cache: no memory watch ({e}); requests trim it");
            }
        }
        cache
    }

    fn build(budget: usize, memory: Option<MemoryProbe>) -> ChunkCache {
        ChunkCache {
            shared: Arc::new(Shared {
                budget,
                state: Mutex::new(State::default()),
                pool: Mutex::new(Pool::default()),
                charged_now: AtomicUsize::new(0),
                memory,
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                hit_bytes: AtomicU64::new(0),
                inserted_bytes: AtomicU64::new(0),
                evicted_bytes: AtomicU64::new(0),
            }),
        }
    }

    /// `len` bytes at `offset` of a chunk, if extents cover all of them.
    pub fn read(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
    ) -> Option<Vec<u8>> {
        if self.budget == 0 || len == 0 {
            return None;
        }
        let end = offset.checked_add(len as u64)?;
        let pieces = {
            let mut st = self.lock()?;
            let chunk = st
                .inodes
                .get(&ino)
                .and_then(|i| i.chunks.get(&index.0))
                .filter(|c| !c.extents.is_empty())?;
            let mut pieces = Vec::new();
            let mut pos = offset;
            while pos < end {
                // Extents do not overlap: the one covering `pos`, if any,
                // is the last starting at or before it.
                match chunk.extents.range(..=pos).next_back() {
                    Some((&k, e)) if k + e.len > pos => {
                        let from = pos - k;
                        let take = (e.len - from).min(end - pos);
                        pieces.push((e.buf.clone(), e.at + from as usize, take as usize));
                        pos += take;
                    }
                    _ => return None,
                }
            }
            st.touch(ino, index.0);
            pieces
        };
        // The buffers never change once cached: copy outside the lock.
        let mut out = Vec::with_capacity(len);
        for (buf, at, n) in &pieces {
            out.extend_from_slice(&buf.data().bytes()[*at..*at + *n]);
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_bytes.fetch_add(len as u64, Ordering::Relaxed);
        Some(out)
    }

    /// Start a change of `len` bytes at `offset` of a chunk: call before
    /// the disk is touched; finish (or drop) the ticket after.
    pub fn begin_write(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
    ) -> Ticket<'_> {
        self.begin(ino, index, offset, len, true)
            .unwrap_or_else(|| Ticket::inert(self))
    }

    /// Start a read of the disk whose bytes may fill the cache: None when
    /// there is no free room for `len` bytes (reads never evict).
    pub fn begin_fill(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
    ) -> Option<Ticket<'_>> {
        self.begin(ino, index, offset, len, false)
    }

    fn begin(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
        mutates: bool,
    ) -> Option<Ticket<'_>> {
        if self.budget == 0 {
            return None;
        }
        let end = offset.saturating_add(len as u64);
        let mut st = self.lock()?;
        // A fill only takes room that is free or that idle pooled
        // buffers hold (they go first when it is inserted).
        if !mutates && st.charged + len + EXTENT_OVERHEAD_BYTES > self.limit(st.charged) {
            return None;
        }
        let (mut freed, mut idle) = (Vec::new(), Vec::new());
        let id = st.register(ino, index.0, (offset, end), mutates, &mut freed);
        if !freed.is_empty() {
            // It cut extents; cutting one in two counts one more extent.
            let limit = self.limit(st.charged);
            self.shrink(&mut st, limit, &mut freed, &mut idle);
        }
        drop(st);
        drop(freed); // buffers whose last view went: recycled outside the lock
        Some(Ticket {
            cache: self,
            id,
            ino,
            index: index.0,
            offset,
            done: false,
        })
    }

    /// Start a truncate of the inode's data at byte `size` of the file
    /// (chunks of `chunk_size` bytes): drops what lies beyond it, and no
    /// operation on the inode in flight meanwhile inserts anything.
    pub fn begin_truncate(&self, ino: InodeId, size: u64, chunk_size: u64) -> InodeTicket<'_> {
        self.begin_inode(ino, Some((size, chunk_size)))
    }

    /// Start removing every chunk of the inode held here.
    pub fn begin_purge(&self, ino: InodeId) -> InodeTicket<'_> {
        self.begin_inode(ino, None)
    }

    fn begin_inode(&self, ino: InodeId, cut_at: Option<(u64, u64)>) -> InodeTicket<'_> {
        let inert = InodeTicket {
            cache: self,
            ino,
            live: false,
        };
        if self.budget == 0 {
            return inert;
        }
        let Some(mut st) = self.lock() else {
            return inert;
        };
        let mut freed = Vec::new();
        let State {
            inodes,
            lru,
            charged,
            ..
        } = &mut *st;
        let inode = inodes.entry(ino).or_default();
        inode.busy += 1;
        let mut acct = Acct {
            charged,
            freed: &mut freed,
        };
        for (&index, chunk) in inode.chunks.iter_mut() {
            for op in chunk.inflight.iter_mut() {
                op.conflicted = true;
            }
            let keep = match cut_at {
                None => 0,
                Some((size, cs)) => size.saturating_sub(index as u64 * cs),
            };
            cut(&mut chunk.extents, keep, u64::MAX, &mut acct);
            if chunk.extents.is_empty() {
                if let Some(s) = chunk.stamp.take() {
                    lru.remove(&s);
                }
            }
        }
        inode
            .chunks
            .retain(|_, c| !c.inflight.is_empty() || !c.extents.is_empty());
        self.charged_now.store(*charged, Ordering::Relaxed);
        drop(st);
        drop(freed);
        InodeTicket {
            cache: self,
            ino,
            live: true,
        }
    }

    fn end(&self, t: &Ticket, data: Option<Box<dyn CacheBytes>>) {
        let Some(mut st) = self.lock() else { return };
        let verdict = st.unregister(t.ino, t.index, t.id);
        let (mut freed, mut idle) = (Vec::new(), Vec::new());
        // What is not kept goes back to the pool for the next write.
        let mut unused = data;
        if let (Some((start, end, mutates)), Some(data)) = (verdict, unused.as_ref()) {
            let len = data.bytes().len() as u64;
            let cost = data.footprint() + EXTENT_OVERHEAD_BYTES;
            // Only what the operation registered for, and only what fits:
            // a fill into free room, a write evicting what it must.
            let limit = self.limit(st.charged);
            let fits = if mutates {
                cost <= limit
            } else {
                st.charged + cost <= limit
            };
            if len > 0 && t.offset >= start && t.offset + len <= end && fits {
                let data = unused.take().expect("just matched");
                let buf = Arc::new(Buffer::new(data, Arc::downgrade(&self.shared)));
                if st.insert(t.ino, t.index, t.offset, buf, &mut freed) {
                    self.inserted_bytes.fetch_add(len, Ordering::Relaxed);
                }
                self.shrink(&mut st, limit, &mut freed, &mut idle);
            }
        }
        st.tidy(t.ino, t.index);
        self.charged_now.store(st.charged, Ordering::Relaxed);
        drop(st);
        drop(freed);
        if let Some(data) = unused {
            self.recycle(data); // not kept: memory for the next write
        }
    }

    /// A buffer of exactly `len` bytes that the cache no longer uses, for a
    /// direct write to fill; None if there is none, after making room for
    /// a new one (so that the least recently used chunk's memory is what
    /// the next write reuses).
    pub fn take_buffer(&self, len: usize) -> Option<Box<dyn CacheBytes>> {
        if self.budget == 0 {
            return None;
        }
        if let Some(b) = self.pool().take(len) {
            return Some(b);
        }
        let mut st = self.lock()?;
        let limit = self.limit(st.charged);
        let (mut freed, mut idle) = (Vec::new(), Vec::new());
        self.shrink(&mut st, limit.saturating_sub(len), &mut freed, &mut idle);
        drop(st);
        drop(freed); // evicted buffers go to the pool here
        drop(idle);
        self.pool().take(len)
    }

    fn end_inode(&self, ino: InodeId) {
        let Some(mut st) = self.lock() else { return };
        let inode = st
            .inodes
            .get_mut(&ino)
            .expect("chunk cache: an inode operation in flight keeps its record");
        assert!(inode.busy > 0, "chunk cache: inode operation count is off");
        inode.busy -= 1;
        if inode.chunks.is_empty() && inode.busy == 0 {
            st.inodes.remove(&ino);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let charged = self.charged_now.load(Ordering::Relaxed);
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            hit_bytes: self.hit_bytes.load(Ordering::Relaxed),
            inserted_bytes: self.inserted_bytes.load(Ordering::Relaxed),
            evicted_bytes: self.evicted_bytes.load(Ordering::Relaxed),
            charged,
            pooled: self.pool().bytes,
        }
    }

    /// Every cached extent: (inode, chunk, offset, bytes), for the tests'
    /// comparison with the disk; and a recount of the bytes and the LRU
    /// order against what the cache keeps (panics on a mismatch).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Vec<(InodeId, u32, u64, Vec<u8>)> {
        let st = self.state.lock().unwrap();
        let mut out = Vec::new();
        let mut buffers: HashMap<*const Buffer, (Arc<Buffer>, u32)> = HashMap::new();
        let mut charged = 0;
        let mut stamped = 0;
        for (&ino, inode) in &st.inodes {
            assert!(
                inode.busy > 0 || !inode.chunks.is_empty(),
                "an empty inode record was kept"
            );
            for (&index, chunk) in &inode.chunks {
                assert!(
                    !chunk.extents.is_empty() || !chunk.inflight.is_empty(),
                    "an empty chunk record was kept"
                );
                assert!(chunk.extents.len() <= EXTENTS_PER_CHUNK_MAX);
                assert_eq!(chunk.stamp.is_some(), !chunk.extents.is_empty());
                if let Some(s) = chunk.stamp {
                    assert_eq!(st.lru.get(&s), Some(&(ino, index)));
                    stamped += 1;
                }
                let mut last_end = 0;
                for (&k, e) in &chunk.extents {
                    assert!(k >= last_end, "extents overlap");
                    assert!(e.len > 0);
                    last_end = k + e.len;
                    charged += EXTENT_OVERHEAD_BYTES;
                    let entry = buffers
                        .entry(Arc::as_ptr(&e.buf))
                        .or_insert((e.buf.clone(), 0));
                    entry.1 += 1;
                    out.push((ino, index, k, e.bytes().to_vec()));
                }
            }
        }
        assert_eq!(stamped, st.lru.len(), "LRU entries without a chunk");
        for (buf, views) in buffers.into_values() {
            assert_eq!(
                buf.views.load(Ordering::Relaxed),
                views,
                "a buffer's view count is off"
            );
            charged += buf.data().footprint();
        }
        assert_eq!(charged, st.charged, "bytes counted differ from a recount");
        assert_eq!(st.charged, self.charged_now.load(Ordering::Relaxed));
        let pool = self.pool();
        let pooled: usize = pool.by_len.values().flatten().map(|b| b.footprint()).sum();
        assert_eq!(pooled, pool.bytes, "pool bytes differ from a recount");
        assert!(pool.by_len.values().all(|l| !l.is_empty()));
        assert!(st.charged + pool.bytes <= self.budget, "over budget");
        out
    }
}

/// A registered chunk operation (write or fill). Finish it with what it
/// wrote or read once the disk is done; dropping it ends it inserting
/// nothing (the error paths).
pub struct Ticket<'a> {
    cache: &'a ChunkCache,
    id: u64,
    ino: InodeId,
    index: u32,
    offset: u64,
    done: bool,
}

impl<'a> Ticket<'a> {
    fn inert(cache: &'a ChunkCache) -> Ticket<'a> {
        Ticket {
            cache,
            id: 0,
            ino: InodeId(0),
            index: 0,
            offset: 0,
            done: true,
        }
    }

    /// End the operation; `data`, what now lies at its offset on disk, is
    /// cached unless another operation overlapped it.
    pub fn finish(mut self, data: Option<Box<dyn CacheBytes>>) {
        if !self.done {
            self.done = true;
            self.cache.end(&self, data);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.cache.end(self, None);
        }
    }
}

/// A registered truncate or purge; dropping it ends it.
pub struct InodeTicket<'a> {
    cache: &'a ChunkCache,
    ino: InodeId,
    live: bool,
}

impl Drop for InodeTicket<'_> {
    fn drop(&mut self) {
        if self.live {
            self.cache.end_inode(self.ino);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*): a seed replays a run.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        pub(crate) fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
        pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
            let tag = self.next() as u8;
            (0..n)
                .map(|i| tag.wrapping_add(i as u8) ^ (i >> 8) as u8)
                .collect()
        }
    }

    /// The seeds to run: `MADFS_CACHE_SEED=N` replays one.
    pub(crate) fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
        match std::env::var("MADFS_CACHE_SEED") {
            Ok(s) => vec![s.parse().expect("MADFS_CACHE_SEED is a number")],
            Err(_) => default.collect(),
        }
    }

    /// Chunk files of the simulated disk.
    type Disk = HashMap<(InodeId, u32), Vec<u8>>;

    /// The invariant: every cached byte lies inside its chunk file and
    /// equals it (also checks the cache's own accounting).
    fn check_against(cache: &ChunkCache, disk: &Disk, ctx: &str) {
        for (ino, index, off, bytes) in cache.check() {
            let file = disk
                .get(&(ino, index))
                .unwrap_or_else(|| panic!("{ctx}: {ino:?}/{index} cached without a file"));
            let end = off as usize + bytes.len();
            assert!(
                end <= file.len(),
                "{ctx}: {ino:?}/{index} cached up to {end}, file ends at {}",
                file.len()
            );
            assert!(
                file[off as usize..end] == bytes[..],
                "{ctx}: stale bytes cached at {ino:?}/{index} offset {off}"
            );
        }
    }

    enum Kind {
        Write {
            off: u64,
            data: Vec<u8>,
            /// Fails after writing this many bytes (then cut back).
            fail_at: Option<usize>,
            /// What a direct write hands the cache (a copy of `data`, in
            /// a buffer the cache gave back when it had one); None for a
            /// buffered write.
            keep: Option<Box<dyn CacheBytes>>,
        },
        Fill {
            off: u64,
            len: usize,
            read: Vec<u8>,
        },
        Truncate {
            size: u64,
        },
        Purge,
    }

    struct Active<'a> {
        ino: InodeId,
        index: u32,
        kind: Kind,
        ticket: Option<Ticket<'a>>,
        inode_ticket: Option<InodeTicket<'a>>,
        disk_done: bool,
    }

    const CS: u64 = 256;

    fn apply_disk(disk: &mut Disk, a: &mut Active) {
        match &mut a.kind {
            Kind::Write {
                off, data, fail_at, ..
            } => {
                let file = disk.entry((a.ino, a.index)).or_default();
                let before = file.len();
                let n = fail_at.unwrap_or(data.len());
                let end = *off as usize + n;
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[*off as usize..end].copy_from_slice(&data[..n]);
                if fail_at.is_some() && file.len() > before {
                    file.truncate(before); // as ChunkStore cuts a failed write back
                }
            }
            Kind::Fill { off, len, read } => {
                if let Some(file) = disk.get(&(a.ino, a.index)) {
                    let start = (*off as usize).min(file.len());
                    let end = (*off as usize + *len).min(file.len());
                    *read = file[start..end].to_vec();
                }
            }
            Kind::Truncate { size } => {
                let size = *size;
                disk.retain(|&(ino, index), file| {
                    if ino != a.ino {
                        return true;
                    }
                    let start = index as u64 * CS;
                    if start >= size {
                        return false;
                    }
                    file.truncate(((size - start) as usize).min(file.len()));
                    true
                });
            }
            Kind::Purge => disk.retain(|&(ino, _), _| ino != a.ino),
        }
        a.disk_done = true;
    }

    fn end(a: Active) {
        match a.kind {
            Kind::Write { fail_at, keep, .. } => {
                let t = a.ticket.expect("writes hold a ticket");
                if fail_at.is_some() {
                    drop(t); // the error path: dropped, not finished
                } else {
                    t.finish(keep);
                }
            }
            Kind::Fill { read, .. } => {
                a.ticket
                    .expect("fills hold a ticket")
                    .finish(Some(Box::new(read)));
            }
            Kind::Truncate { .. } | Kind::Purge => drop(a.inode_ticket),
        }
    }

    /// One seeded run: up to 4 operations in flight, each in three steps
    /// (register, disk, end) interleaved at random, the invariant checked
    /// after every step; reads served from the cache are compared with the
    /// disk as they are served. Returns the cache's counters.
    fn simulate(seed: u64, steps: usize) -> CacheStats {
        let mut rng = Rng::new(seed);
        let budget = 400 + rng.below(3000) as usize;
        let cache = ChunkCache::new(budget);
        let mut disk = Disk::new();
        let mut active: Vec<Active> = Vec::new();
        for step in 0..steps {
            let ctx = format!("seed {seed} step {step} (MADFS_CACHE_SEED={seed} replays it)");
            let ino = InodeId(1 + rng.below(2));
            let index = rng.below(3) as u32;
            if active.is_empty() || (active.len() < 4 && rng.chance(45)) {
                let off = rng.below(CS - 1);
                let len = 1 + rng.below(CS - off) as usize;
                let roll = rng.below(100);
                if roll < 45 {
                    let ticket = cache.begin_write(ino, ChunkIndex(index), off, len);
                    let fail_at = rng.chance(10).then(|| rng.below(len as u64) as usize);
                    let data = rng.bytes(len);
                    // Reused memory must be memory no extent shows any more:
                    // the invariant check would see its bytes change.
                    let keep = rng.chance(75).then(|| match cache.take_buffer(len) {
                        Some(mut b) => {
                            b.bytes_mut().copy_from_slice(&data);
                            b
                        }
                        None => Box::new(data.clone()) as Box<dyn CacheBytes>,
                    });
                    active.push(Active {
                        ino,
                        index,
                        kind: Kind::Write {
                            off,
                            data,
                            fail_at,
                            keep,
                        },
                        ticket: Some(ticket),
                        inode_ticket: None,
                        disk_done: false,
                    });
                } else if roll < 65 {
                    if let Some(ticket) = cache.begin_fill(ino, ChunkIndex(index), off, len) {
                        active.push(Active {
                            ino,
                            index,
                            kind: Kind::Fill {
                                off,
                                len,
                                read: Vec::new(),
                            },
                            ticket: Some(ticket),
                            inode_ticket: None,
                            disk_done: false,
                        });
                    }
                } else if roll < 75 {
                    let size = rng.below(3 * CS + 10);
                    active.push(Active {
                        ino,
                        index: 0,
                        kind: Kind::Truncate { size },
                        ticket: None,
                        inode_ticket: Some(cache.begin_truncate(ino, size, CS)),
                        disk_done: false,
                    });
                } else if roll < 79 {
                    active.push(Active {
                        ino,
                        index: 0,
                        kind: Kind::Purge,
                        ticket: None,
                        inode_ticket: Some(cache.begin_purge(ino)),
                        disk_done: false,
                    });
                } else if let Some(got) = cache.read(ino, ChunkIndex(index), off, len) {
                    let file = disk.get(&(ino, index)).map(Vec::as_slice).unwrap_or(&[]);
                    let end = off as usize + len;
                    assert!(end <= file.len(), "{ctx}: served past the file's end");
                    assert!(got == file[off as usize..end], "{ctx}: served stale bytes");
                }
            } else {
                let i = rng.below(active.len() as u64) as usize;
                if !active[i].disk_done {
                    apply_disk(&mut disk, &mut active[i]);
                } else {
                    end(active.swap_remove(i));
                }
            }
            check_against(&cache, &disk, &ctx);
        }
        while let Some(mut a) = active.pop() {
            if !a.disk_done {
                apply_disk(&mut disk, &mut a);
            }
            end(a);
            check_against(&cache, &disk, &format!("seed {seed} draining"));
        }
        // Nothing in flight: only chunks holding extents keep records.
        let st = cache.state.lock().unwrap();
        for inode in st.inodes.values() {
            assert_eq!(inode.busy, 0);
            assert!(inode.chunks.values().all(|c| c.inflight.is_empty()));
        }
        drop(st);
        cache.stats()
    }

    #[test]
    fn interleaved_operations_never_leave_stale_bytes() {
        let mut total = CacheStats::default();
        for seed in seeds(0..200) {
            let s = simulate(seed, 3000);
            total.pooled += s.pooled;
            total.hits += s.hits;
            total.inserted_bytes += s.inserted_bytes;
            total.evicted_bytes += s.evicted_bytes;
        }
        // The runs did exercise the cache: hits, inserts and evictions.
        assert!(total.hits > 0 && total.inserted_bytes > 0 && total.evicted_bytes > 0);
        assert!(total.pooled > 0, "buffers were kept for reuse");
    }

    fn buf(data: &[u8]) -> Option<Box<dyn CacheBytes>> {
        Some(Box::new(data.to_vec()))
    }

    #[test]
    fn serves_only_what_extents_cover_and_counts_bytes() {
        let c = ChunkCache::new(1 << 20);
        let (ino, ch) = (InodeId(9), ChunkIndex(3));
        c.begin_write(ino, ch, 100, 50).finish(buf(&[1; 50]));
        c.begin_write(ino, ch, 150, 50).finish(buf(&[2; 50]));
        let mut want = vec![1u8; 50];
        want.extend_from_slice(&[2; 50]);
        assert_eq!(c.read(ino, ch, 100, 100), Some(want));
        assert_eq!(c.read(ino, ch, 120, 60).map(|v| v.len()), Some(60));
        assert_eq!(c.read(ino, ch, 99, 2), None, "a byte before the extents");
        assert_eq!(c.read(ino, ch, 199, 2), None, "a byte after them");
        assert_eq!(c.read(ino, ChunkIndex(4), 100, 1), None);
        // A buffered write in the middle splits an extent; the pieces
        // still serve, the overwritten bytes do not.
        c.begin_write(ino, ch, 110, 10).finish(None);
        assert_eq!(c.read(ino, ch, 100, 10), Some(vec![1; 10]));
        assert_eq!(c.read(ino, ch, 120, 30), Some(vec![1; 30]));
        assert_eq!(c.read(ino, ch, 105, 10), None);
        let extents = c.check();
        assert_eq!(extents.len(), 3);
        // Two views of the first buffer, one of the second: both buffers
        // counted once, each extent's overhead once.
        assert_eq!(c.stats().charged, 50 + 50 + 3 * EXTENT_OVERHEAD_BYTES);
        // Truncating the file at byte 3 * chunk + 130 keeps 130 bytes of
        // chunk 3; purging drops the rest.
        let t = c.begin_truncate(ino, 3 * 1000 + 130, 1000);
        assert_eq!(c.read(ino, ch, 125, 5), Some(vec![1; 5]));
        assert_eq!(c.read(ino, ch, 125, 6), None);
        drop(t);
        drop(c.begin_purge(ino));
        assert_eq!(c.read(ino, ch, 100, 10), None);
        assert!(c.check().is_empty());
        assert_eq!(c.stats().charged, 0);
        assert!(c.state.lock().unwrap().inodes.is_empty(), "records left");
    }

    #[test]
    fn overlapping_changes_in_flight_insert_nothing() {
        let c = ChunkCache::new(1 << 20);
        let (ino, ch) = (InodeId(1), ChunkIndex(0));
        // Two writes to one range at once: whichever the disk applied last,
        // neither is kept.
        let a = c.begin_write(ino, ch, 0, 10);
        let b = c.begin_write(ino, ch, 5, 10);
        b.finish(buf(&[2; 10]));
        a.finish(buf(&[1; 10]));
        assert!(c.check().is_empty());
        // Writes to different ranges of one chunk do not conflict.
        let a = c.begin_write(ino, ch, 0, 10);
        let b = c.begin_write(ino, ch, 10, 10);
        a.finish(buf(&[1; 10]));
        b.finish(buf(&[2; 10]));
        assert_eq!(c.check().len(), 2);
        // A write that started and ended while another was in flight
        // conflicts with it even though it ended first.
        let a = c.begin_write(ino, ch, 40, 10);
        c.begin_write(ino, ch, 45, 10).finish(buf(&[3; 10]));
        a.finish(buf(&[4; 10]));
        assert_eq!(c.read(ino, ch, 40, 1), None);
        assert_eq!(c.read(ino, ch, 50, 1), None);
        // A fill that a change overlapped keeps nothing; fills do not
        // conflict with each other.
        let f = c.begin_fill(ino, ch, 100, 10).unwrap();
        let g = c.begin_fill(ino, ch, 100, 10).unwrap();
        c.begin_write(ino, ch, 105, 1).finish(None);
        f.finish(buf(&[5; 10]));
        assert_eq!(c.read(ino, ch, 100, 1), None);
        drop(g);
        let f = c.begin_fill(ino, ch, 100, 10).unwrap();
        let g = c.begin_fill(ino, ch, 100, 10).unwrap();
        f.finish(buf(&[5; 10]));
        g.finish(buf(&[5; 10]));
        assert_eq!(c.read(ino, ch, 100, 10), Some(vec![5; 10]));
        // A truncate in flight keeps every write of the inode out, even to
        // a range it does not cut, started before or during it.
        let w = c.begin_write(ino, ChunkIndex(7), 0, 10);
        let t = c.begin_truncate(ino, u64::MAX / 2, 1 << 20);
        let v = c.begin_write(ino, ChunkIndex(8), 0, 10);
        drop(t);
        w.finish(buf(&[6; 10]));
        v.finish(buf(&[6; 10]));
        assert_eq!(c.read(ino, ChunkIndex(7), 0, 1), None);
        assert_eq!(c.read(ino, ChunkIndex(8), 0, 1), None);
        c.check();
    }

    #[test]
    fn writes_evict_least_recently_used_chunks_and_fills_only_take_free_room() {
        let per = 1000 + EXTENT_OVERHEAD_BYTES;
        let c = ChunkCache::new(3 * per);
        let ino = InodeId(1);
        for i in 0..3 {
            c.begin_write(ino, ChunkIndex(i), 0, 1000)
                .finish(buf(&[i as u8; 1000]));
        }
        assert_eq!(c.stats().charged, 3 * per);
        // Chunk 0 is used again, so chunk 1 is the least recently used.
        assert!(c.read(ino, ChunkIndex(0), 0, 1).is_some());
        assert!(
            c.begin_fill(ino, ChunkIndex(5), 0, 1000).is_none(),
            "no room"
        );
        c.begin_write(ino, ChunkIndex(3), 0, 1000)
            .finish(buf(&[3; 1000]));
        assert!(c.read(ino, ChunkIndex(1), 0, 1).is_none());
        for i in [0, 2, 3] {
            assert!(c.read(ino, ChunkIndex(i), 0, 1000).is_some(), "chunk {i}");
        }
        assert_eq!(c.stats().evicted_bytes, per as u64);
        // Larger than the whole budget: not kept, nothing evicted for it.
        c.begin_write(ino, ChunkIndex(9), 0, 4 * per)
            .finish(buf(&vec![9; 4 * per]));
        assert!(c.read(ino, ChunkIndex(9), 0, 1).is_none());
        assert_eq!(c.check().len(), 3);
        // Room made by a purge takes a fill.
        drop(c.begin_purge(ino));
        let f = c.begin_fill(ino, ChunkIndex(5), 0, 1000).unwrap();
        f.finish(buf(&[7; 1000]));
        assert_eq!(c.read(ino, ChunkIndex(5), 0, 1000), Some(vec![7; 1000]));
        c.check();
    }

    #[test]
    fn freed_buffers_are_reused_by_later_writes_within_the_budget() {
        let per = 1000 + EXTENT_OVERHEAD_BYTES;
        let c = ChunkCache::new(3 * per);
        let ino = InodeId(1);
        assert!(c.take_buffer(1000).is_none(), "nothing to reuse yet");
        for i in 0..2 {
            c.begin_write(ino, ChunkIndex(i), 0, 1000)
                .finish(buf(&[i as u8; 1000]));
        }
        // Removed: both buffers wait in the pool, counted in the budget.
        drop(c.begin_purge(ino));
        assert_eq!(c.stats().pooled, 2000);
        c.check();
        assert!(c.take_buffer(999).is_none(), "only the same length");
        let mut b = c.take_buffer(1000).expect("a buffer to reuse");
        b.bytes_mut().fill(7);
        c.begin_write(ino, ChunkIndex(5), 0, 1000).finish(Some(b));
        assert_eq!(c.read(ino, ChunkIndex(5), 0, 1000), Some(vec![7; 1000]));
        assert_eq!(c.stats().pooled, 1000);
        c.check();
        // A full cache: the next write's buffer is the least recently used
        // chunk's, evicted for it (the pool's idle buffer goes first).
        for i in 6..8 {
            let b = c
                .take_buffer(1000)
                .unwrap_or_else(|| Box::new(vec![0u8; 1000]));
            c.begin_write(ino, ChunkIndex(i), 0, 1000).finish(Some(b));
            c.check();
        }
        assert_eq!(c.stats().pooled, 0);
        assert!(c.take_buffer(1000).is_some(), "chunk 5's buffer, evicted");
        assert!(c.read(ino, ChunkIndex(5), 0, 1).is_none());
        assert!(c.read(ino, ChunkIndex(7), 0, 1).is_some());
        // Buffers not kept (a conflicted write) are reused too.
        let a = c.begin_write(ino, ChunkIndex(9), 0, 10);
        c.begin_write(ino, ChunkIndex(9), 0, 10)
            .finish(buf(&[1; 10]));
        a.finish(buf(&[2; 10]));
        assert!(c.take_buffer(10).is_some());
        c.check();
    }

    #[test]
    fn an_extent_is_cut_into_a_bounded_number_of_pieces() {
        let c = ChunkCache::new(1 << 20);
        let (ino, ch) = (InodeId(1), ChunkIndex(0));
        c.begin_write(ino, ch, 0, 10_000)
            .finish(buf(&vec![1; 10_000]));
        for i in 0..(EXTENTS_PER_CHUNK_MAX as u64 * 2) {
            c.begin_write(ino, ch, 10 + i * 70, 1).finish(None);
        }
        let extents = c.check();
        assert!(extents.len() <= EXTENTS_PER_CHUNK_MAX);
        assert_eq!(c.read(ino, ch, 0, 10), Some(vec![1; 10]));
    }

    #[test]
    fn memory_pressure_stops_growth_and_gives_memory_back() {
        use std::sync::atomic::AtomicU64;
        let available = Arc::new(AtomicU64::new(1 << 30));
        let probe = {
            let available = available.clone();
            Arc::new(move || {
                Some(MemInfo {
                    total: 8 << 30,
                    available: available.load(Ordering::Relaxed),
                })
            })
        };
        let c = ChunkCache::with_memory(1 << 20, probe, false);
        let ino = InodeId(1);
        // 1 GiB available, 1 GiB reserved (an eighth of 8): no growth.
        c.begin_write(ino, ChunkIndex(0), 0, 1000)
            .finish(buf(&[1; 1000]));
        assert!(c.check().is_empty());
        assert!(c.begin_fill(ino, ChunkIndex(0), 0, 1000).is_none());
        // Room again: the budget rules.
        available.store(2 << 30, Ordering::Relaxed);
        for i in 0..4 {
            c.begin_write(ino, ChunkIndex(i), 0, 1000)
                .finish(buf(&[1; 1000]));
        }
        assert_eq!(c.check().len(), 4);
        // Others take memory: 2 KiB below the reserve gives back at least
        // 2 KiB, least recently used chunks first (1064 bytes each).
        available.store((1 << 30) - 2048, Ordering::Relaxed);
        c.trim();
        assert_eq!(c.check().len(), 2);
        assert!(c.read(ino, ChunkIndex(1), 0, 1000).is_none());
        assert!(c.read(ino, ChunkIndex(2), 0, 1000).is_some());
        assert!(c.read(ino, ChunkIndex(3), 0, 1000).is_some());
    }

    #[test]
    fn off_means_no_memory_and_no_hits() {
        let c = ChunkCache::new(0);
        let (ino, ch) = (InodeId(1), ChunkIndex(0));
        c.begin_write(ino, ch, 0, 10).finish(buf(&[1; 10]));
        assert!(c.begin_fill(ino, ch, 0, 10).is_none());
        drop(c.begin_truncate(ino, 0, 100));
        assert_eq!(c.read(ino, ch, 0, 10), None);
        assert!(c.state.lock().unwrap().inodes.is_empty());
    }
}
