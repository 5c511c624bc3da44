//! Chunk files on the server's local disk. Chunk `(ino, index)` is the file
//! `chunks/<xx>/<ino hex>/<index>` where `xx` spreads inodes over 256
//! directories, so no directory grows without bound and all chunks of one
//! inode can be dropped by removing one directory.
//!
//! Every call here blocks on the disk: callers run them on tokio's blocking
//! pool, never on the async threads.

use crate::writeback::EarlyWriteback;
use madfs_types::{stable_hash, ChunkIndex, InodeId};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub struct ChunkStore {
    root: PathBuf,
    /// Files (and new directories) written since the last sync.
    dirty: Mutex<HashSet<PathBuf>>,
    /// Bytes held in chunk files (kept up to date on growth and removal).
    bytes: AtomicU64,
    early_writeback: EarlyWriteback,
}

impl ChunkStore {
    pub fn open(root: PathBuf) -> io::Result<ChunkStore> {
        fs::create_dir_all(&root)?;
        let bytes = du(&root)?;
        Ok(ChunkStore {
            root,
            dirty: Mutex::new(HashSet::new()),
            bytes: AtomicU64::new(bytes),
            early_writeback: EarlyWriteback::new(),
        })
    }

    pub fn bytes_used(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
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
        let mut done = 0;
        while done < n {
            match f.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                k => done += k,
            }
        }
        buf.truncate(done);
        Ok(buf)
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
        if let Err(e) = f.write_all_at(data, offset) {
            // Nothing of a failed write is acknowledged: give back what it
            // appended (the space, and no stale bytes past the end that a
            // later extension would expose), keeping the byte count exact.
            if f.metadata().map(|m| m.len() > before).unwrap_or(false) {
                let _ = f.set_len(before);
            }
            return Err(e);
        }
        let after = offset + data.len() as u64;
        if after > before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        }
        if before < chunk_size && after >= chunk_size && self.early_writeback.allowed() {
            // This write completed the chunk (a sequential writer has
            // moved on): see writeback.rs. Overwrites of a full chunk
            // leave it to the page cache.
            start_writeback(&f);
        }
        self.mark_dirty(path);
        Ok(())
    }

    /// Drop this server's data of `ino` at and beyond byte `size` of the file.
    pub fn truncate(&self, ino: InodeId, size: u64, chunk_size: u64) -> io::Result<()> {
        let dir = self.inode_dir(ino);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let Some(index) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let start = index * chunk_size;
            let len = entry.metadata()?.len();
            if start >= size {
                fs::remove_file(entry.path())?;
                self.bytes
                    .fetch_sub(len.min(self.bytes_used()), Ordering::Relaxed);
            } else if size - start < len {
                let keep = size - start;
                OpenOptions::new()
                    .write(true)
                    .open(entry.path())?
                    .set_len(keep)?;
                self.bytes
                    .fetch_sub((len - keep).min(self.bytes_used()), Ordering::Relaxed);
                self.mark_dirty(entry.path());
            }
        }
        self.mark_dirty(dir);
        Ok(())
    }

    /// Remove every chunk of `ino` held here.
    pub fn purge(&self, ino: InodeId) -> io::Result<()> {
        let dir = self.inode_dir(ino);
        let freed = du(&dir).unwrap_or(0);
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        self.bytes
            .fetch_sub(freed.min(self.bytes_used()), Ordering::Relaxed);
        if let Some(parent) = dir.parent() {
            self.mark_dirty(parent.to_path_buf());
        }
        Ok(())
    }

    /// fsync every file and directory written since the last call.
    /// Called only by the sync thread. A path that cannot be synced stays
    /// dirty, so the next fsync tries it again instead of passing over it.
    pub fn sync_dirty(&self) -> io::Result<()> {
        let dirty: Vec<PathBuf> = {
            let mut d = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
            d.drain().collect()
        };
        let mut first_err = None;
        for batch in dirty.chunks(SYNC_BATCH_FILES) {
            if let Err((e, failed)) = sync_batch(batch) {
                first_err.get_or_insert(e);
                for p in failed {
                    self.mark_dirty(p);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Files one sync pass holds open at once: bounded, so a sync of
/// thousands of dirty chunks never runs the server out of descriptors.
const SYNC_BATCH_FILES: usize = 256;

/// Sync `paths` in two passes: first start the writeback of every file, so
/// the disk sees all of it at once, then wait for each (and its metadata);
/// one fsync after another would write one chunk at a time. On failure,
/// the first error and the paths not known to be durable.
fn sync_batch(paths: &[PathBuf]) -> Result<(), (io::Error, Vec<PathBuf>)> {
    let mut first_err = None;
    let mut failed = Vec::new();
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        match File::open(p) {
            Ok(f) => files.push((p, f)),
            // Removed since it was written: nothing left to make durable.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                first_err.get_or_insert(e);
                failed.push(p.clone());
            }
        }
    }
    for (_, f) in &files {
        start_writeback(f);
    }
    for (p, f) in files {
        if let Err(e) = f.sync_all() {
            first_err.get_or_insert(e);
            failed.push(p.clone());
        }
    }
    match first_err {
        Some(e) => Err((e, failed)),
        None => Ok(()),
    }
}

/// Ask the kernel to start writing `f`'s dirty pages without waiting
/// (a hint: errors surface in the fsync that follows).
fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only schedules I/O.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
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
}
