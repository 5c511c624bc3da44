//! Chunk files on the server's local disk. Chunk `(ino, index)` is the file
//! `chunks/<xx>/<ino hex>/<index>` where `xx` spreads inodes over 256
//! directories, so no directory grows without bound and all chunks of one
//! inode can be dropped by removing one directory.
//!
//! Every call here blocks on the disk: callers run them on tokio's blocking
//! pool, never on the async threads.
//!
//! Large aligned writes bypass the page cache (O_DIRECT, from a page-aligned
//! copy): on the test VM the kernel's copy into the page cache cost about
//! 1.45 CPU-s per GB, a user-space copy 0.04-0.1, and the disk took direct
//! 1 MiB writes at 1.4 GB/s where buffered ones reached 0.6
//! (docs/PERFORMANCE.md). Smaller or unaligned writes (IOR-hard's 47,008
//! bytes, small files) go through the page cache, which merges them. A
//! large aligned read goes direct too unless the page cache holds all of it
//! (cachestat(2)). A file system that refuses O_DIRECT (EINVAL) turns it
//! off for the store.
//!
//! The page-aligned copy a direct write makes is kept in the chunk cache
//! (chunk_cache.rs), so reads of what was just written come from memory;
//! every write, truncate and purge here goes through the cache's tickets,
//! which keep it coherent with the files.
//!
//! A failed fsync poisons the store: from then on every write, truncate,
//! purge and sync fails with EIO and the reason, until the server is
//! restarted (why not retry: see `ChunkStore::poison`).

use crate::chunk_cache::{CacheBytes, CacheStats, ChunkCache};
use crate::memory::MemoryGauge;
use crate::replication::SharedBytes;
use crate::writeback::EarlyWriteback;
use madfs_types::{stable_hash, ChunkIndex, InodeId};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod direct;
mod resync;

use direct::*;

/// Test fault (read when the store opens, see docs/ARCHITECTURE.md): the
/// first N sync passes succeed and the next fails with EIO, as if the
/// disk had lost a write, so tests drive the store's poisoning in a real
/// server process.
pub const FSYNC_FAULT_ENV: &str = "MADFS_FAULT_FSYNC_FAIL_AFTER";

/// Test seam: `MADFS_FAULT_MIRROR_PAUSE_US` pauses each chunk write for
/// up to that long (at most 10 ms) between the disk and its record in the
/// replication stream, widening the window two racing writes could be
/// recorded out of order in, for the test that they are not.
fn mirror_pause() -> Option<std::time::Duration> {
    static PAUSE: OnceLock<Option<std::time::Duration>> = OnceLock::new();
    *PAUSE.get_or_init(|| {
        madfs_types::env_number("MADFS_FAULT_MIRROR_PAUSE_US")
            .map(|us| std::time::Duration::from_micros(us.min(10_000)))
    })
}

pub struct ChunkStore {
    root: PathBuf,
    /// Files (and new directories) written since the last sync.
    dirty: Mutex<HashSet<PathBuf>>,
    /// Bytes held in chunk files (kept up to date on growth and removal).
    bytes: AtomicU64,
    early_writeback: EarlyWriteback,
    /// Whether large aligned writes use O_DIRECT (off once the file system
    /// refused it).
    direct: AtomicBool,
    /// Recently written (and read) extents of direct I/O.
    cache: ChunkCache,
    /// Why the store refuses writes and syncs: set once, at the first
    /// failed fsync (see `poison`), never cleared but by a restart.
    poisoned: OnceLock<String>,
    /// Test fault: the errno a sync pass fails with (0: none armed) ...
    fault_errno: AtomicI32,
    /// ... once this many more passes have succeeded.
    fault_after: AtomicU64,
    /// Where writes, truncates and purges are reported once done (the
    /// replication stream of a primary with replicas; none otherwise).
    mirror: OnceLock<Arc<dyn crate::replication::ChunkMirror>>,
    /// With a mirror: each change and its record under one lock.
    order: crate::write_order::WriteOrder,
    /// Without a chunk cache (a replica's copy): the aligned buffers of
    /// direct writes, kept for the next ones. A fresh buffer costs the
    /// kernel a cleared page and a fault per 4 KiB (with the primaries'
    /// growing caches, a fifth of the servers' CPU in ior-easy-write at
    /// R = 2, docs/PERFORMANCE.md).
    spare: Mutex<Vec<Box<dyn CacheBytes>>>,
    /// Aligned buffers made afresh for direct writes.
    fresh_buffers: AtomicU64,
}

/// Spare aligned buffers a store without a cache keeps, at most (writes
/// to one store run side by side on the blocking pool).
const SPARE_BUFFERS_MAX: usize = 4;

impl ChunkStore {
    /// The store under `root`, without a chunk cache.
    pub fn open(root: PathBuf) -> io::Result<ChunkStore> {
        Self::open_cached(root, 0)
    }

    /// The store under `root`, keeping up to `cache_bytes` of direct I/O
    /// in memory (0: no cache).
    /// Arms the test fault `FSYNC_FAULT_ENV` if the environment sets it.
    pub fn open_cached(root: PathBuf, cache_bytes: usize) -> io::Result<ChunkStore> {
        let gauge = MemoryGauge::default();
        let probe = Arc::new(move || gauge.sample());
        let store = Self::with_cache(root, ChunkCache::with_memory(cache_bytes, probe, true))?;
        if let Some(v) = std::env::var_os(FSYNC_FAULT_ENV) {
            let after = v
                .to_str()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{FSYNC_FAULT_ENV}={v:?}: expected a number of sync passes"),
                    )
                })?;
            tracing::warn!(
                "chunk store {}: test fault {FSYNC_FAULT_ENV}={after}: sync pass {} will fail \
                 with EIO",
                store.root.display(),
                after + 1
            );
            store.inject_fsync_failure(after, libc::EIO);
        }
        Ok(store)
    }

    fn with_cache(root: PathBuf, cache: ChunkCache) -> io::Result<ChunkStore> {
        fs::create_dir_all(&root)?;
        let bytes = du(&root)?;
        Ok(ChunkStore {
            root,
            dirty: Mutex::new(HashSet::new()),
            bytes: AtomicU64::new(bytes),
            early_writeback: EarlyWriteback::new(),
            direct: AtomicBool::new(true),
            cache,
            poisoned: OnceLock::new(),
            fault_errno: AtomicI32::new(0),
            fault_after: AtomicU64::new(0),
            mirror: OnceLock::new(),
            order: crate::write_order::WriteOrder::new(),
            spare: Mutex::new(Vec::new()),
            fresh_buffers: AtomicU64::new(0),
        })
    }

    /// Report every later write, truncate and purge to `mirror`.
    pub fn set_mirror(&self, mirror: Arc<dyn crate::replication::ChunkMirror>) {
        assert!(
            self.mirror.set(mirror).is_ok(),
            "a chunk store has one mirror"
        );
    }

    /// Test seam: after `after_passes` more sync passes have succeeded,
    /// the next one fails with `errno` (its first fsync, or the store's
    /// directory if it has nothing to sync), as a disk error would, and
    /// poisons the store. Costs a sync pass one atomic load when unarmed.
    pub fn inject_fsync_failure(&self, after_passes: u64, errno: i32) {
        self.fault_after.store(after_passes, Ordering::Relaxed);
        self.fault_errno.store(errno, Ordering::Release);
    }

    /// Whether the armed test fault fails this sync pass (then disarmed):
    /// its errno.
    fn fault_fires(&self) -> Option<i32> {
        let errno = self.fault_errno.load(Ordering::Acquire);
        if errno == 0 {
            return None;
        }
        // Only the sync thread runs passes: no race between the two.
        match self
            .fault_after
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        {
            Ok(_) => None,
            Err(_) => {
                self.fault_errno.store(0, Ordering::Relaxed);
                Some(errno)
            }
        }
    }

    /// Why the store refuses writes and syncs (None: it does not).
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.get().map(String::as_str)
    }

    /// The same as a sentence of its own, for `madfs status`.
    pub fn failure(&self) -> Option<String> {
        self.poisoned().map(|r| format!("chunk store {r}"))
    }

    /// Refuse writes and syncs from now on, because of `cause` (e.g.
    /// "fsync of <path> failed: <error>"), until the server restarts. Only
    /// the first cause is kept, and logged.
    ///
    /// Why not retry: after a failed fsync Linux may have dropped the
    /// dirty pages it could not write and cleared the error, so a later
    /// fsync, even on a new descriptor, succeeds without the data being on
    /// the disk (PostgreSQL's "fsyncgate"); only a restart, which goes back
    /// to what the disk holds, is honest. Reads still work: they return
    /// what the files hold now, and all a client can have been told
    /// durable was synced before the failure; what the failed pass covered
    /// was never acknowledged (its fsync answered EIO).
    pub fn poison(&self, cause: &str) {
        let reason = format!(
            "poisoned since {}: {cause}; it refuses writes and syncs until the \
             server is restarted (data written since the last successful sync may be lost)",
            utc_now()
        );
        if self.poisoned.set(reason).is_ok() {
            tracing::error!(
                "chunk store {}: {}",
                self.root.display(),
                self.poisoned().unwrap_or_default()
            );
        }
    }

    /// EIO with the reason, where the store is poisoned.
    fn check_poisoned(&self) -> io::Result<()> {
        match self.poisoned() {
            None => Ok(()),
            Some(reason) => Err(poisoned_error(reason)),
        }
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Whether large aligned writes and reads bypass the page cache (on
    /// unless the server was told otherwise or the file system refused).
    pub fn direct_io(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// Turn direct I/O on or off (`direct_io`).
    pub fn set_direct_io(&self, on: bool) {
        self.direct.store(on, Ordering::Relaxed);
    }

    pub fn bytes_used(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `n` bytes of chunk files are gone (never below zero: the count is
    /// an estimate taken at open and kept up as files change).
    fn forget_bytes(&self, n: u64) {
        self.bytes
            .fetch_sub(n.min(self.bytes_used()), Ordering::Relaxed);
    }

    fn inode_dir(&self, ino: InodeId) -> PathBuf {
        let spread = stable_hash(&[&ino.0.to_le_bytes()]) % 256;
        self.root
            .join(format!("{spread:02x}"))
            .join(format!("{:016x}", ino.0))
    }

    fn chunk_path(&self, ino: InodeId, index: ChunkIndex) -> PathBuf {
        self.inode_dir(ino).join(index.0.to_string())
    }

    /// Every chunk file held here: (inode, chunk, path). A resync copies
    /// them to a replica; files appearing or going meanwhile are the
    /// record stream's business.
    pub fn list_chunks(&self) -> io::Result<Vec<(InodeId, ChunkIndex, PathBuf)>> {
        let mut out = Vec::new();
        let spreads = match fs::read_dir(&self.root) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for spread in spreads.flatten() {
            let Ok(inodes) = fs::read_dir(spread.path()) else {
                continue;
            };
            for inode in inodes.flatten() {
                let Some(ino) = inode
                    .file_name()
                    .to_str()
                    .and_then(|n| u64::from_str_radix(n, 16).ok())
                else {
                    continue;
                };
                let Ok(chunks) = fs::read_dir(inode.path()) else {
                    continue;
                };
                for chunk in chunks.flatten() {
                    if let Some(index) = chunk
                        .file_name()
                        .to_str()
                        .and_then(|n| n.parse::<u32>().ok())
                    {
                        out.push((InodeId(ino), ChunkIndex(index), chunk.path()));
                    }
                }
            }
        }
        Ok(out)
    }

    fn mark_dirty(&self, p: PathBuf) {
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p);
    }

    /// Read up to `len` bytes at `offset`; shorter (or empty) where the chunk
    /// file ends or does not exist: the caller fills holes with zeros.
    pub fn read(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        if let Some(hit) = self.cache.read(ino, index, offset, len) {
            return Ok(hit);
        }
        self.cache.count_miss();
        let f = match File::open(self.chunk_path(ino, index)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let file_len = f.metadata()?.len();
        if offset >= file_len {
            return Ok(Vec::new());
        }
        let n = (len as u64).min(file_len - offset) as usize;
        let mut buf = vec![0u8; n];
        // Large and aligned: straight from the disk (see the top of this
        // file: data written with O_DIRECT is not cached), unless the page
        // cache holds all of it. The kernel keeps the two coherent (a
        // direct read first writes back dirty pages in its range).
        let mut done = 0;
        if n >= DIRECT_WRITE_MIN_BYTES
            && offset.is_multiple_of(DIRECT_ALIGN as u64)
            && self.direct.load(Ordering::Relaxed)
            && !fully_cached(&f, offset, n)
        {
            // Registered before the disk is read: a change racing with
            // the read keeps what it read out of the cache.
            let fill = self.cache.begin_fill(ino, index, offset, n);
            match read_direct(&f, &mut buf, offset) {
                Ok((k, pages)) => {
                    done = k;
                    if let Some(t) = fill {
                        t.finish(Some(Box::new(PageBuf { pages, len: k })));
                    }
                    if done < n {
                        set_direct(&f, false)?; // the rest, if any, buffered
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        "chunk store {}: O_DIRECT refused ({e}); using the page cache",
                        self.root.display()
                    );
                    set_direct(&f, false)?;
                }
                Err(e) => return Err(e),
            }
        }
        while done < n {
            match f.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                k => done += k,
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// `len` bytes at `offset` of a chunk if the chunk cache holds all of
    /// them: memory only, so callers may serve it without the blocking pool.
    pub fn read_cached(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        len: usize,
    ) -> Option<Vec<u8>> {
        self.cache.read(ino, index, offset, len)
    }

    /// Write `data` at `offset` of a chunk of `chunk_size` bytes.
    pub fn write(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        data: &[u8],
        chunk_size: u64,
    ) -> io::Result<()> {
        self.write_inner(ino, index, offset, data, None, chunk_size)
    }

    /// `write` of bytes the caller shares: the replication record keeps
    /// them as they are instead of a copy.
    pub fn write_shared(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        data: &SharedBytes,
        chunk_size: u64,
    ) -> io::Result<()> {
        self.write_inner(ino, index, offset, data, Some(data), chunk_size)
    }

    /// A spare aligned buffer of `len` bytes (stores without a cache).
    fn take_spare(&self, len: usize) -> Option<Box<dyn CacheBytes>> {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let at = spare.iter().position(|b| b.bytes().len() == len)?;
        Some(spare.swap_remove(at))
    }

    fn keep_spare(&self, buf: Box<dyn CacheBytes>) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() == SPARE_BUFFERS_MAX {
            // The oldest goes: writes of another length took over.
            spare.remove(0);
        }
        spare.push(buf);
    }

    /// Aligned buffers made afresh for direct writes so far.
    pub fn fresh_buffers(&self) -> u64 {
        self.fresh_buffers.load(Ordering::Relaxed)
    }

    /// With a mirror, its leave to change the chunks (`ChunkMirror::admit`):
    /// a deposed primary's store, which becomes this server's copy of the
    /// set again, takes no change that its new primary never recorded.
    fn admit(&self) -> io::Result<Option<std::sync::RwLockReadGuard<'_, ()>>> {
        self.mirror.get().map(|m| m.admit()).transpose()
    }

    /// `data`, also as `shared` when the caller shares it.
    fn write_inner(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        data: &[u8],
        shared: Option<&SharedBytes>,
        chunk_size: u64,
    ) -> io::Result<()> {
        self.check_poisoned()?;
        let _admitted = self.admit()?;
        // With replicas, racing writes are recorded in the order the disk
        // applied them (write_order.rs).
        let _turn = self.mirror.get().map(|_| self.order.write(ino, index));
        // Registered before the file is touched; an early return drops it.
        let ticket = self.cache.begin_write(ino, index, offset, data.len());
        let path = self.chunk_path(ino, index);
        let f = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let dir = self.inode_dir(ino);
                fs::create_dir_all(&dir)?;
                // The new directory entries must reach the disk with the data.
                self.mark_dirty(dir.clone());
                if let Some(parent) = dir.parent() {
                    self.mark_dirty(parent.to_path_buf());
                }
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)?
            }
            Err(e) => return Err(e),
        };
        let before = f.metadata()?.len();
        let direct = self.direct.load(Ordering::Relaxed)
            && data.len() >= DIRECT_WRITE_MIN_BYTES
            && data.len().is_multiple_of(DIRECT_ALIGN)
            && offset.is_multiple_of(DIRECT_ALIGN as u64);
        // The aligned copy a direct write needs, in memory the cache gave
        // back if it has some of this length; kept by the cache after.
        let mut kept = None;
        let written = if direct {
            let copy = match self
                .cache
                .take_buffer(data.len())
                .or_else(|| self.take_spare(data.len()))
            {
                Some(mut b) => {
                    b.bytes_mut().copy_from_slice(data);
                    b
                }
                None => {
                    self.fresh_buffers.fetch_add(1, Ordering::Relaxed);
                    Box::new(PageBuf {
                        pages: aligned_copy(data),
                        len: data.len(),
                    })
                }
            };
            match set_direct(&f, true).and_then(|()| f.write_all_at(copy.bytes(), offset)) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL) && before == f.metadata()?.len() =>
                {
                    // The file system does not do O_DIRECT (or not with
                    // this alignment): the page cache from now on.
                    self.direct.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        "chunk store {}: O_DIRECT refused ({e}); writing through the page cache",
                        self.root.display()
                    );
                    set_direct(&f, false).and_then(|()| f.write_all_at(data, offset))
                }
                Ok(()) => {
                    kept = Some(copy);
                    Ok(())
                }
                other => other,
            }
        } else {
            f.write_all_at(data, offset)
        };
        if let Err(e) = written {
            // Nothing of a failed write is acknowledged: give back what it
            // appended (the space, and no stale bytes past the end that a
            // later extension would expose), keeping the byte count exact.
            if f.metadata().map(|m| m.len() > before).unwrap_or(false) {
                let _ = f.set_len(before);
            }
            // The disk's own failure, unlike a full one: the store is
            // unusable, and with replicas its set moves to a copy.
            if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EROFS)) {
                self.poison(&format!("writing {} failed: {e}", path.display()));
            }
            return Err(e);
        }
        let after = offset + data.len() as u64;
        if after > before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        }
        if !direct && before < chunk_size && after >= chunk_size && self.early_writeback.allowed() {
            // This write completed the chunk (a sequential writer has
            // moved on): see writeback.rs. Overwrites of a full chunk
            // leave it to the page cache.
            start_writeback(&f);
        }
        self.mark_dirty(path);
        // Data the page cache holds (buffered writes) is not kept twice.
        match kept {
            Some(buf) if self.cache.budget() == 0 => {
                ticket.finish(None);
                self.keep_spare(buf);
            }
            kept => ticket.finish(kept),
        }
        if let Some(m) = self.mirror.get() {
            if let Some(max) = mirror_pause() {
                // A pause of its own for each write (up to the maximum), so
                // a later write may get to its record first.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos() as u128);
                std::thread::sleep(max.mul_f64((nanos % 1000) as f64 / 1000.0));
            }
            let data = shared.map_or_else(|| SharedBytes::new(data.to_vec()), Clone::clone);
            m.wrote(ino, index, offset, data, chunk_size);
        }
        Ok(())
    }

    /// The file offset just past the last byte of `ino`'s chunk data held
    /// here among chunks `first..=last` (0: none). A chunk file is exactly
    /// as long as its data (writes extend it, truncates cut it), so the
    /// highest non-empty chunk gives the end.
    pub fn extent(
        &self,
        ino: InodeId,
        first: ChunkIndex,
        last: ChunkIndex,
        chunk_size: u64,
    ) -> io::Result<u64> {
        /// Up to this many chunks, each is looked at by name; over it, the
        /// inode's directory is listed once.
        const BY_NAME_MAX: u32 = 64;
        let end_of = |index: u32, len: u64| index as u64 * chunk_size + len;
        if last.0 < first.0 {
            return Ok(0);
        }
        if last.0 - first.0 < BY_NAME_MAX {
            for index in (first.0..=last.0).rev() {
                match fs::metadata(self.chunk_path(ino, ChunkIndex(index))) {
                    Ok(m) if m.len() > 0 => return Ok(end_of(index, m.len())),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(0);
        }
        let mut end = 0;
        for (index, entry) in self.chunk_files(ino)?.unwrap_or_default() {
            if (first.0 as u64..=last.0 as u64).contains(&index) {
                let len = entry.metadata()?.len();
                if len > 0 {
                    end = end.max(end_of(index as u32, len));
                }
            }
        }
        Ok(end)
    }

    /// The chunk files of `ino` held here, with their indexes; None if
    /// the inode has no directory here.
    fn chunk_files(&self, ino: InodeId) -> io::Result<Option<Vec<(u64, fs::DirEntry)>>> {
        let entries = match fs::read_dir(self.inode_dir(ino)) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry?;
            if let Some(index) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u64>().ok())
            {
                files.push((index, entry));
            }
        }
        Ok(Some(files))
    }

    /// Drop this server's data of `ino` at and beyond byte `size` of the file.
    pub fn truncate(&self, ino: InodeId, size: u64, chunk_size: u64) -> io::Result<()> {
        self.check_poisoned()?;
        let _admitted = self.admit()?;
        let _turn = self.mirror.get().map(|_| self.order.whole(ino));
        let _ticket = self.cache.begin_truncate(ino, size, chunk_size);
        let Some(files) = self.chunk_files(ino)? else {
            return Ok(());
        };
        let dir = self.inode_dir(ino);
        for (index, entry) in files {
            let start = index.saturating_mul(chunk_size);
            let cut = || -> io::Result<()> {
                let len = entry.metadata()?.len();
                if start >= size {
                    fs::remove_file(entry.path())?;
                    self.forget_bytes(len);
                } else if size - start < len {
                    let keep = size - start;
                    OpenOptions::new()
                        .write(true)
                        .open(entry.path())?
                        .set_len(keep)?;
                    self.forget_bytes(len - keep);
                    self.mark_dirty(entry.path());
                }
                Ok(())
            };
            match cut() {
                // Removed meanwhile by a truncate racing with this one.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        self.mark_dirty(dir);
        if let Some(m) = self.mirror.get() {
            m.truncated(ino, size, chunk_size);
        }
        Ok(())
    }

    /// Remove every chunk of `ino` held here.
    pub fn purge(&self, ino: InodeId) -> io::Result<()> {
        self.check_poisoned()?;
        let _admitted = self.admit()?;
        let _turn = self.mirror.get().map(|_| self.order.whole(ino));
        let _ticket = self.cache.begin_purge(ino);
        let dir = self.inode_dir(ino);
        let freed = du(&dir).unwrap_or(0);
        if let Some(m) = self.mirror.get() {
            // Before the removal, which may find nothing here while a
            // replica still holds chunks of `ino`; purging there is
            // harmless if it has none either.
            m.purged(ino);
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        self.forget_bytes(freed);
        if let Some(parent) = dir.parent() {
            self.mark_dirty(parent.to_path_buf());
        }
        Ok(())
    }

    /// fsync every file and directory written since the last call.
    /// Called only by the sync thread. A file that cannot be opened stays
    /// dirty for the next pass (nothing of it was synced); a failed fsync
    /// poisons the store and the pass's paths leave the dirty set, since no
    /// later fsync could vouch for them.
    pub fn sync_dirty(&self) -> io::Result<()> {
        self.check_poisoned()?;
        let mut fault = self.fault_fires();
        let dirty: Vec<PathBuf> = {
            let mut d = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
            d.drain().collect()
        };
        let mut first_err = None;
        for batch in dirty.chunks(SYNC_BATCH_FILES) {
            match sync_batch(batch, &mut fault) {
                Ok(()) => {}
                Err(BatchError::Open(e, failed)) => {
                    first_err.get_or_insert(e);
                    for p in failed {
                        self.mark_dirty(p);
                    }
                }
                Err(BatchError::Fsync(path, e)) => {
                    self.poison(&format!("fsync of {} failed: {e}", path.display()));
                    return self.check_poisoned();
                }
            }
        }
        if let Some(errno) = fault {
            // Armed for this pass, which had no file to fail on.
            let e = io::Error::from_raw_os_error(errno);
            self.poison(&format!(
                "fsync of {} failed: {e} (test fault)",
                self.root.display()
            ));
            return self.check_poisoned();
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for ChunkStore {
    fn drop(&mut self) {
        if self.cache.budget() > 0 {
            let s = self.cache.stats();
            tracing::info!(
                "chunk cache: {} hits ({} MiB), {} misses, {} MiB inserted, {} MiB evicted, \
                 {} MiB held, {} MiB kept for reuse",
                s.hits,
                s.hit_bytes >> 20,
                s.misses,
                s.inserted_bytes >> 20,
                s.evicted_bytes >> 20,
                s.charged >> 20,
                s.pooled >> 20
            );
        }
    }
}

/// Files one sync pass holds open at once: bounded, so a sync of
/// thousands of dirty chunks never runs the server out of descriptors.
const SYNC_BATCH_FILES: usize = 256;

/// How a sync batch failed.
enum BatchError {
    /// A file could not be opened (the first error), so these paths were
    /// not synced; nothing was lost.
    Open(io::Error, Vec<PathBuf>),
    /// The fsync of a file failed: its data may be lost.
    Fsync(PathBuf, io::Error),
}

/// Sync `paths` in two passes: first start the writeback of every file, so
/// the disk sees all of it at once, then wait for each (and its metadata);
/// one fsync after another would write one chunk at a time. Stops at the
/// first failed fsync. `fault` (the test fault, taken here) fails the first
/// fsync in its place.
fn sync_batch(paths: &[PathBuf], fault: &mut Option<i32>) -> Result<(), BatchError> {
    let mut open_err = None;
    let mut failed = Vec::new();
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        match File::open(p) {
            Ok(f) => files.push((p, f)),
            // Removed since it was written: nothing left to make durable.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                open_err.get_or_insert(e);
                failed.push(p.clone());
            }
        }
    }
    for (_, f) in &files {
        start_writeback(f);
    }
    for (p, f) in files {
        let synced = match fault.take() {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => f.sync_all(),
        };
        if let Err(e) = synced {
            return Err(BatchError::Fsync(p.clone(), e));
        }
    }
    match open_err {
        Some(e) => Err(BatchError::Open(e, failed)),
        None => Ok(()),
    }
}

/// The error every write and sync of a poisoned store returns: the
/// reason, with no errno, which the wire carries as ErrorCode::Io (EIO).
fn poisoned_error(reason: &str) -> io::Error {
    io::Error::other(reason.to_string())
}

/// The time now as `YYYY-MM-DD hh:mm:ss UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

fn du(path: &Path) -> io::Result<u64> {
    let mut total = 0;
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            total += du(&entry?.path())?;
        }
    } else {
        total += meta.len();
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deposed primary's chunk store (its set moved to another server)
    /// changes nothing more, and says why: a write still running there
    /// would land in what becomes this server's copy of the set, unknown
    /// to the set's new primary (the metadata twin: seed 8093).
    #[test]
    fn a_deposed_store_takes_no_chunk_change() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let stream = Arc::new(crate::replication::Replicator::new(
            madfs_types::ServerId(0),
            &[madfs_types::ServerId(1)],
        ));
        s.set_mirror(stream.clone());
        let (ino, cs) = (InodeId(7), 100);
        s.write(ino, ChunkIndex(0), 0, b"kept", cs).unwrap();
        let seq = stream.last_seq();
        stream.retire();
        let refused = s.write(ino, ChunkIndex(1), 0, b"late", cs).unwrap_err();
        assert!(
            refused.to_string().contains("moved to another server"),
            "{refused}"
        );
        assert!(s.truncate(ino, 2, cs).is_err());
        assert!(s.purge(ino).is_err());
        assert_eq!(s.extent(ino, ChunkIndex(0), ChunkIndex(9), cs).unwrap(), 4);
        assert_eq!(s.read(ino, ChunkIndex(0), 0, 4).unwrap(), b"kept");
        assert_eq!(stream.last_seq(), seq, "nothing more recorded");
        assert!(s.poisoned().is_none(), "a refusal is no lost write");
    }

    #[test]
    fn extent_is_the_end_of_the_highest_chunk_with_data_in_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let (ino, cs) = (InodeId(7), 100);
        let ext = |first: u32, last: u32| s.extent(ino, ChunkIndex(first), ChunkIndex(last), cs);
        assert_eq!(ext(0, 10).unwrap(), 0, "no chunk yet");
        s.write(ino, ChunkIndex(2), 10, b"abc", cs).unwrap();
        s.write(ino, ChunkIndex(5), 0, b"x", cs).unwrap();
        assert_eq!(ext(5, 5).unwrap(), 501);
        assert_eq!(ext(0, 9).unwrap(), 501);
        assert_eq!(ext(0, 4).unwrap(), 213, "chunk 5 is out of the range");
        assert_eq!(ext(3, 4).unwrap(), 0);
        assert_eq!(ext(6, 5).unwrap(), 0, "an empty range");
        // Over 64 chunks the directory is listed instead: the same answers.
        assert_eq!(ext(0, 1000).unwrap(), 501);
        assert_eq!(ext(3, 1000).unwrap(), 501);
        assert_eq!(ext(6, 1000).unwrap(), 0);
        // A truncate to 212 leaves chunk 2 two bytes long, chunk 5 gone.
        s.truncate(ino, 212, cs).unwrap();
        assert_eq!(ext(0, 9).unwrap(), 212);
        assert_eq!(ext(0, 1000).unwrap(), 212);
        // A truncate to 200 removes chunk 2 as well.
        s.truncate(ino, 200, cs).unwrap();
        assert_eq!(ext(0, 9).unwrap(), 0);
        assert_eq!(ext(0, 1000).unwrap(), 0);
    }

    #[test]
    fn write_read_truncate_purge() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let ino = InodeId(42);
        assert_eq!(s.read(ino, ChunkIndex(1), 0, 10).unwrap(), b"");
        s.write(ino, ChunkIndex(1), 5, b"hello", 1 << 20).unwrap();
        assert_eq!(
            s.read(ino, ChunkIndex(1), 0, 100).unwrap(),
            b"\0\0\0\0\0hello"
        );
        assert_eq!(s.read(ino, ChunkIndex(1), 6, 2).unwrap(), b"el");
        assert_eq!(s.read(ino, ChunkIndex(1), 50, 2).unwrap(), b"");
        s.write(ino, ChunkIndex(2), 0, b"xyz", 1 << 20).unwrap();
        assert_eq!(s.bytes_used(), 13);
        s.sync_dirty().unwrap();
        // Chunk size 100: keep 103 bytes = chunk 1 up to byte 3.
        s.truncate(ino, 103, 100).unwrap();
        assert_eq!(s.read(ino, ChunkIndex(1), 0, 100).unwrap(), b"\0\0\0");
        assert_eq!(s.read(ino, ChunkIndex(2), 0, 100).unwrap(), b"");
        assert_eq!(s.bytes_used(), 3);
        s.purge(ino).unwrap();
        assert_eq!(s.read(ino, ChunkIndex(1), 0, 100).unwrap(), b"");
        assert_eq!(s.bytes_used(), 0);
        s.purge(ino).unwrap();
        s.sync_dirty().unwrap();
    }

    /// The error of a poisoned store: EIO on the wire, and it says why
    /// (`cause`) and what to do.
    #[track_caller]
    fn assert_poisoned<T: std::fmt::Debug>(r: io::Result<T>, cause: &str, what: &str) {
        let e = r.expect_err(what);
        assert_eq!(
            madfs_proto::ErrorCode::from_io(&e),
            madfs_proto::ErrorCode::Io,
            "{what}: {e}"
        );
        let m = e.to_string();
        for part in ["poisoned since", cause, "restarted", "may be lost"] {
            assert!(m.contains(part), "{what}: {m:?} lacks {part:?}");
        }
    }

    #[test]
    fn a_failed_fsync_poisons_the_store_until_restart() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("chunks");
        let s = ChunkStore::open(root.clone()).unwrap();
        let ino = InodeId(42);
        s.write(ino, ChunkIndex(1), 0, b"synced", 1 << 20).unwrap();
        s.sync_dirty().unwrap();
        assert!(s.poisoned().is_none());
        s.write(ino, ChunkIndex(1), 0, b"lost?!", 1 << 20).unwrap();
        s.inject_fsync_failure(0, libc::EIO);
        // Only the chunk file is dirty: its fsync fails.
        let chunk = s.chunk_path(ino, ChunkIndex(1));
        let cause = format!("fsync of {} failed: Input/output error", chunk.display());
        assert_poisoned(s.sync_dirty(), &cause, "the failing sync");
        assert!(s.poisoned().unwrap().contains(&cause));
        assert!(s
            .failure()
            .unwrap()
            .starts_with("chunk store poisoned since"));
        // No later sync succeeds, though a new descriptor's fsync would.
        for i in 0..3 {
            assert_poisoned(s.sync_dirty(), &cause, &format!("sync {i} after it"));
        }
        assert_poisoned(
            s.write(ino, ChunkIndex(1), 0, b"more", 1 << 20),
            &cause,
            "a write",
        );
        assert_poisoned(
            s.write(InodeId(7), ChunkIndex(0), 0, b"new", 1 << 20),
            &cause,
            "a write of a new chunk",
        );
        assert!(
            !s.inode_dir(InodeId(7)).exists(),
            "a refused write made a file"
        );
        assert_poisoned(s.truncate(ino, 0, 1 << 20), &cause, "a truncate");
        assert_poisoned(s.purge(ino), &cause, "a purge");
        // Reads go on: what the file holds now.
        assert_eq!(s.read(ino, ChunkIndex(1), 0, 100).unwrap(), b"lost?!");
        drop(s);
        // A restart (a new store on the same files) takes writes again.
        let s = ChunkStore::open(root).unwrap();
        assert!(s.poisoned().is_none());
        s.write(ino, ChunkIndex(1), 0, b"again!", 1 << 20).unwrap();
        s.sync_dirty().unwrap();
    }

    #[test]
    fn the_fsync_fault_fails_the_pass_after_the_given_number() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("chunks");
        let s = ChunkStore::open(root.clone()).unwrap();
        s.inject_fsync_failure(2, libc::EIO);
        // Passes with and without files to sync count alike.
        s.write(InodeId(3), ChunkIndex(1), 0, b"a", 1 << 20)
            .unwrap();
        s.sync_dirty().unwrap();
        s.sync_dirty().unwrap();
        s.write(InodeId(3), ChunkIndex(1), 0, b"b", 1 << 20)
            .unwrap();
        assert_poisoned(s.sync_dirty(), "failed", "the third pass");
        // A pass with nothing dirty fails on the store's directory.
        let s = ChunkStore::open(dir.path().join("other")).unwrap();
        s.inject_fsync_failure(0, libc::EIO);
        let cause = format!("fsync of {} failed", dir.path().join("other").display());
        assert_poisoned(s.sync_dirty(), &cause, "an empty pass");
    }

    #[test]
    fn a_store_without_a_cache_reuses_its_aligned_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let (len, chunk) = (DIRECT_WRITE_MIN_BYTES, 4 << 20);
        for i in 0..6u8 {
            let data = vec![i + 1; len];
            s.write(InodeId(9), ChunkIndex(i as u32), 0, &data, chunk)
                .unwrap();
            // Another length now and then takes a buffer of its own.
            if i == 3 {
                s.write(InodeId(9), ChunkIndex(9), 0, &vec![7; 2 * len], chunk)
                    .unwrap();
            }
        }
        assert!(s.direct_io(), "the test's file system refused O_DIRECT");
        assert_eq!(s.fresh_buffers(), 2, "one buffer per length");
        for i in 0..6u8 {
            let back = s.read(InodeId(9), ChunkIndex(i as u32), 0, len).unwrap();
            assert!(back.iter().all(|&b| b == i + 1), "chunk {i}");
        }
    }

    #[test]
    fn large_aligned_writes_bypass_the_page_cache_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let ino = InodeId(7);
        let big: Vec<u8> = (0..DIRECT_WRITE_MIN_BYTES * 2)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let chunk = 4 << 20;
        // Aligned and large: direct (where the file system allows it).
        s.write(ino, ChunkIndex(0), 4096, &big, chunk).unwrap();
        // Large but unaligned, and small: through the page cache, over
        // the direct write's bytes.
        s.write(
            ino,
            ChunkIndex(0),
            4096 + 100,
            &big[..DIRECT_WRITE_MIN_BYTES],
            chunk,
        )
        .unwrap();
        s.write(ino, ChunkIndex(0), 8192, b"small", chunk).unwrap();
        let mut want = vec![0u8; 4096];
        want.extend_from_slice(&big);
        want[4196..4196 + DIRECT_WRITE_MIN_BYTES].copy_from_slice(&big[..DIRECT_WRITE_MIN_BYTES]);
        want[8192..8197].copy_from_slice(b"small");
        assert_eq!(s.read(ino, ChunkIndex(0), 0, chunk as usize).unwrap(), want);
        assert_eq!(s.bytes_used(), want.len() as u64);
        // A direct write over cached pages replaces them.
        s.write(
            ino,
            ChunkIndex(0),
            4096,
            &big[DIRECT_WRITE_MIN_BYTES..],
            chunk,
        )
        .unwrap();
        want[4096..4096 + DIRECT_WRITE_MIN_BYTES].copy_from_slice(&big[DIRECT_WRITE_MIN_BYTES..]);
        assert_eq!(s.read(ino, ChunkIndex(0), 0, chunk as usize).unwrap(), want);
        s.sync_dirty().unwrap();
    }

    #[test]
    fn the_page_cache_is_asked_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let big = vec![5u8; DIRECT_WRITE_MIN_BYTES];
        let chunk = 4 << 20;
        // Written direct: not cached, and asking does not cache it.
        s.write(InodeId(1), ChunkIndex(1), 0, &big, chunk).unwrap();
        let f = File::open(s.chunk_path(InodeId(1), ChunkIndex(1))).unwrap();
        let Some(before) = cached_pages(&f, 0, big.len()) else {
            return; // a kernel without cachestat(2): reads go direct
        };
        assert_eq!(before, 0);
        assert!(!fully_cached(&f, 0, big.len()));
        assert_eq!(cached_pages(&f, 0, big.len()), Some(0));
        // Written through the page cache (unaligned): cached.
        s.write(InodeId(1), ChunkIndex(2), 1, &big, chunk).unwrap();
        let g = File::open(s.chunk_path(InodeId(1), ChunkIndex(2))).unwrap();
        assert!(fully_cached(&g, 0, big.len() + 1));
        assert_eq!(
            s.read(InodeId(1), ChunkIndex(2), 1, big.len()).unwrap(),
            big
        );
    }

    #[test]
    fn aligned_copies_are_page_aligned_and_exact() {
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN).map(|i| i as u8).collect();
        let pages = aligned_copy(&data);
        let bytes = page_bytes(&pages);
        assert_eq!(bytes.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert_eq!(bytes, &data[..]);
    }

    use crate::chunk_cache::tests::{seeds, Rng};
    use std::collections::HashMap;

    const MIB: u64 = 1 << 20;

    /// The chunk files as the model says they should be.
    type Model = HashMap<(InodeId, u32), Vec<u8>>;

    /// Every cached extent equals the model's bytes (and the cache's own
    /// accounting recounts).
    fn cache_matches(s: &ChunkStore, model: &Model, ctx: &str) {
        for (ino, index, off, bytes) in s.cache.check() {
            let file = model.get(&(ino, index)).map(Vec::as_slice).unwrap_or(&[]);
            let end = off as usize + bytes.len();
            assert!(
                end <= file.len(),
                "{ctx}: {ino:?}/{index} cached past its end"
            );
            assert!(
                file[off as usize..end] == bytes[..],
                "{ctx}: stale bytes cached at {ino:?}/{index} offset {off}"
            );
        }
    }

    /// The files on disk equal the model (checks the model itself).
    fn disk_matches(s: &ChunkStore, model: &Model, ctx: &str) {
        for ino in [InodeId(1), InodeId(2)] {
            for index in 0..4u32 {
                let on_disk = fs::read(s.chunk_path(ino, ChunkIndex(index))).unwrap_or_default();
                let want = model.get(&(ino, index)).map(Vec::as_slice).unwrap_or(&[]);
                assert!(on_disk == want, "{ctx}: {ino:?}/{index} on disk differs");
            }
        }
    }

    fn model_write(model: &mut Model, ino: InodeId, index: u32, off: u64, data: &[u8]) {
        let file = model.entry((ino, index)).or_default();
        let end = off as usize + data.len();
        if file.len() < end {
            file.resize(end, 0);
        }
        file[off as usize..end].copy_from_slice(data);
    }

    /// Model-based: random writes (direct, large unaligned, small), reads
    /// (direct and buffered), truncates and purges against the store with
    /// a small cache, compared with a plain model after every step.
    #[test]
    fn random_operations_read_back_what_a_plain_model_holds() {
        let cs = MIB;
        for seed in seeds(0..4) {
            let dir = tempfile::tempdir().unwrap();
            let mut rng = Rng::new(seed);
            let budget = (MIB / 2 + rng.below(3 * MIB)) as usize;
            let s =
                ChunkStore::with_cache(dir.path().join("chunks"), ChunkCache::new(budget)).unwrap();
            let mut model = Model::new();
            let page = DIRECT_ALIGN as u64;
            for step in 0..150 {
                let ctx = format!("seed {seed} step {step} (MADFS_CACHE_SEED={seed} replays it)");
                let ino = InodeId(1 + rng.below(2));
                let index = rng.below(4) as u32;
                let roll = rng.below(100);
                if roll < 30 {
                    // Large and aligned: direct, kept by the cache.
                    let pages = 64 + rng.below(65);
                    let off = page * rng.below(cs / page - pages + 1);
                    let data = rng.bytes((pages * page) as usize);
                    s.write(ino, ChunkIndex(index), off, &data, cs).unwrap();
                    model_write(&mut model, ino, index, off, &data);
                } else if roll < 40 {
                    // Large and unaligned: through the page cache.
                    let len = DIRECT_WRITE_MIN_BYTES as u64 + rng.below(50_000);
                    let off = rng.below(cs - len);
                    let data = rng.bytes(len as usize);
                    s.write(ino, ChunkIndex(index), off, &data, cs).unwrap();
                    model_write(&mut model, ino, index, off, &data);
                } else if roll < 55 {
                    let len = 1 + rng.below(8192);
                    let off = rng.below(cs - len);
                    let data = rng.bytes(len as usize);
                    s.write(ino, ChunkIndex(index), off, &data, cs).unwrap();
                    model_write(&mut model, ino, index, off, &data);
                } else if roll < 62 {
                    let size = rng.below(4 * cs + 1);
                    s.truncate(ino, size, cs).unwrap();
                    model.retain(|&(i, index), file| {
                        let start = index as u64 * cs;
                        if i != ino {
                            true
                        } else if start >= size {
                            false
                        } else {
                            file.truncate(((size - start) as usize).min(file.len()));
                            true
                        }
                    });
                } else if roll < 65 {
                    s.purge(ino).unwrap();
                    model.retain(|&(i, _), _| i != ino);
                } else {
                    let (off, len) = if rng.chance(60) {
                        let pages = 64 + rng.below(cs / page - 63);
                        (page * rng.below(cs / page - pages + 1), pages * page)
                    } else {
                        let len = 1 + rng.below(300_000);
                        (rng.below(cs - len), len)
                    };
                    let got = s.read(ino, ChunkIndex(index), off, len as usize).unwrap();
                    let file = model.get(&(ino, index)).map(Vec::as_slice).unwrap_or(&[]);
                    let start = (off as usize).min(file.len());
                    let end = (off + len).min(file.len() as u64) as usize;
                    assert!(
                        got == file[start..end],
                        "{ctx}: read {len} at {off} differs"
                    );
                }
                cache_matches(&s, &model, &ctx);
                if step % 25 == 0 {
                    disk_matches(&s, &model, &ctx);
                }
            }
            disk_matches(&s, &model, &format!("seed {seed} at the end"));
        }
    }

    /// A direct write that fails part-way over cached bytes (the file
    /// system's largest file size, EFBIG) is cut back, and what it
    /// overwrote before failing is not served from the cache.
    #[test]
    fn a_write_that_fails_part_way_leaves_no_stale_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s =
            ChunkStore::with_cache(dir.path().join("chunks"), ChunkCache::new(64 << 20)).unwrap();
        let (ino, ch) = (InodeId(3), ChunkIndex(1));
        let k = DIRECT_WRITE_MIN_BYTES as u64;
        // ext4 with 4 KiB blocks stops files at 16 TiB - 4 KiB.
        let limit = (1u64 << 44) - DIRECT_ALIGN as u64;
        let old = vec![1u8; k as usize];
        if s.write(ino, ch, limit - 2 * k, &old, 1 << 50).is_err() {
            return; // a file system without that limit near here
        }
        let new = vec![2u8; 2 * k as usize];
        let failed = s.write(ino, ch, limit - k - k / 2, &new, 1 << 50);
        if failed.is_ok() {
            return; // a file system with larger files: nothing failed
        }
        // What the disk holds now, read around the cache.
        let mut want = vec![0u8; k as usize];
        File::open(s.chunk_path(ino, ch))
            .unwrap()
            .read_exact_at(&mut want, limit - 2 * k)
            .unwrap();
        assert_eq!(
            File::open(s.chunk_path(ino, ch))
                .unwrap()
                .metadata()
                .unwrap()
                .len(),
            limit - k,
            "cut back to its old length"
        );
        assert!(
            want[k as usize / 2..] != old[k as usize / 2..],
            "it wrote before failing"
        );
        assert_eq!(s.read(ino, ch, limit - 2 * k, k as usize).unwrap(), want);
        for (_, _, off, bytes) in s.cache.check() {
            let mut on_disk = vec![0u8; bytes.len()];
            File::open(s.chunk_path(ino, ch))
                .unwrap()
                .read_exact_at(&mut on_disk, off)
                .unwrap();
            assert!(on_disk == bytes, "stale bytes cached at {off}");
        }
    }

    /// Threads writing (direct and buffered), reading and truncating
    /// overlapping ranges of the same chunks at once: when they are done,
    /// every cached byte equals the file.
    #[test]
    fn concurrent_overlapping_operations_leave_the_cache_equal_to_the_files() {
        let cs = MIB;
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::with_cache(
            dir.path().join("chunks"),
            ChunkCache::new((8 * MIB) as usize),
        )
        .unwrap();
        let ino = InodeId(5);
        for round in 0..6u64 {
            std::thread::scope(|scope| {
                for t in 0..4u64 {
                    let s = &s;
                    scope.spawn(move || {
                        let mut rng = Rng::new(round * 100 + t);
                        let k = DIRECT_WRITE_MIN_BYTES as u64;
                        for _ in 0..60 {
                            let index = ChunkIndex(rng.below(2) as u32);
                            // Starts on a 64 KiB grid: writes overlap often.
                            let off = (64 << 10) * rng.below((cs - k) / (64 << 10));
                            match rng.below(10) {
                                0..=3 => {
                                    let data = rng.bytes(k as usize);
                                    s.write(ino, index, off, &data, cs).unwrap();
                                }
                                4..=5 => {
                                    let len = 1 + rng.below(9000) as usize;
                                    let data = rng.bytes(len);
                                    s.write(ino, index, off + rng.below(100), &data, cs)
                                        .unwrap();
                                }
                                6 => s.truncate(ino, rng.below(2 * cs), cs).unwrap(),
                                _ => {
                                    s.read(ino, index, off, k as usize).unwrap();
                                }
                            }
                        }
                    });
                }
            });
            for (i, index, off, bytes) in s.cache.check() {
                let file = fs::read(s.chunk_path(i, ChunkIndex(index))).unwrap_or_default();
                let end = off as usize + bytes.len();
                assert!(
                    end <= file.len(),
                    "round {round}: cached past the file's end"
                );
                assert!(
                    file[off as usize..end] == bytes[..],
                    "round {round}: stale bytes cached at chunk {index} offset {off}"
                );
            }
        }
        assert!(s.cache_stats().inserted_bytes > 0);
    }
}
