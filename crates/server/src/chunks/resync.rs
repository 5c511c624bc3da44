//! What a resync needs of a chunk store beyond reads and writes: a digest
//! of one chunk file (so a copy that already holds a file as its primary
//! does is not sent it again), and, on a copy only, the removal of one
//! chunk file and the fsync of one it keeps (replication/resync.rs `load`).

use super::ChunkStore;
use madfs_proto::message::ChunkDigest;
use madfs_types::{ChunkIndex, InodeId};
use std::fs;
use std::io::{self, Read};
use std::path::Path;

/// Bytes read at a time while hashing a chunk file.
const DIGEST_READ_BYTES: usize = 1 << 20;

impl ChunkStore {
    /// Length and xxh3-128 hash of chunk file `(ino, index)` as it is now;
    /// None where there is none. 128 bits: two files that differ get the
    /// same digest with a chance of about 2^-128, far below that of a disk
    /// returning a wrong sector unnoticed.
    pub fn digest(&self, ino: InodeId, index: ChunkIndex) -> io::Result<Option<ChunkDigest>> {
        let mut f = match fs::File::open(self.chunk_path(ino, index)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = vec![0u8; DIGEST_READ_BYTES];
        let mut len = 0u64;
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        Ok(Some(ChunkDigest {
            len,
            hash: hasher.digest128().to_le_bytes(),
        }))
    }

    /// Have the next sync pass fsync chunk file `(ino, index)`: a copy
    /// keeps it through a resync, and the load's closing sync must make it
    /// durable like the files it wrote (it may sit in the page cache only,
    /// written before this process was killed), and the directories that
    /// name it.
    pub fn sync_later(&self, ino: InodeId, index: ChunkIndex) {
        self.mark_dirty(self.chunk_path(ino, index));
        // And the directories that name it, which may be as new.
        let dir = self.inode_dir(ino);
        if let Some(spread) = dir.parent() {
            self.mark_dirty(spread.to_path_buf());
        }
        self.mark_dirty(dir);
    }

    /// Remove chunk file `(ino, index)` alone (a copy's file that differs
    /// from its primary's, which follows). Copies only: a primary's
    /// changes are recorded for its replicas, and this is not.
    pub fn drop_chunk(&self, ino: InodeId, index: ChunkIndex) -> io::Result<()> {
        self.drop_file(&self.chunk_path(ino, index))
    }

    /// Remove one file `list_chunks` found (a copy's chunk file its
    /// primary no longer has). By its path: one that is not where this
    /// store would put it goes too.
    pub fn drop_file(&self, path: &Path) -> io::Result<()> {
        assert!(
            self.mirror.get().is_none(),
            "a single chunk file is dropped on copies only"
        );
        self.check_poisoned()?;
        let len = match fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        self.forget_bytes(len);
        if let Some(dir) = path.parent() {
            self.mark_dirty(dir.to_path_buf());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_files_apart_and_drops_remove_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let (ino, chunk_size) = (InodeId(7), 1u64 << 20);
        assert_eq!(store.digest(ino, ChunkIndex(0)).unwrap(), None);
        store
            .write(ino, ChunkIndex(0), 0, b"abc", chunk_size)
            .unwrap();
        store
            .write(ino, ChunkIndex(1), 0, b"abc", chunk_size)
            .unwrap();
        let a = store.digest(ino, ChunkIndex(0)).unwrap().unwrap();
        assert_eq!(a.len, 3);
        assert_eq!(Some(a), store.digest(ino, ChunkIndex(1)).unwrap());
        // One byte changed, and one byte more: both seen.
        store
            .write(ino, ChunkIndex(1), 1, b"x", chunk_size)
            .unwrap();
        let b = store.digest(ino, ChunkIndex(1)).unwrap().unwrap();
        assert_eq!(b.len, 3);
        assert_ne!(a.hash, b.hash);
        store
            .write(ino, ChunkIndex(0), 3, b"\0", chunk_size)
            .unwrap();
        let c = store.digest(ino, ChunkIndex(0)).unwrap().unwrap();
        assert_eq!(c.len, 4);
        assert_ne!(a.hash, c.hash);

        store.drop_chunk(ino, ChunkIndex(0)).unwrap();
        assert_eq!(store.digest(ino, ChunkIndex(0)).unwrap(), None);
        assert_eq!(Some(b), store.digest(ino, ChunkIndex(1)).unwrap());
        assert_eq!(store.bytes_used(), 3);
        // Dropping what is not there is no error.
        store.drop_chunk(ino, ChunkIndex(5)).unwrap();
    }
}
