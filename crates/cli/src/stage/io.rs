//! Reading and writing the bytes of open files on either side: positioned
//! reads and writes, a local file's data segments (so holes stay holes),
//! sizes.

use super::fs::{io_msg, is_root, madfs_msg, madfs_set_attrs, timespec, Meta, Preserve, Result};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// An open source file.
pub enum Reader {
    Local(std::fs::File),
    Madfs(Box<madfs_client::File>),
}

/// An open destination file.
pub enum Writer {
    Local(std::fs::File),
    Madfs(Box<madfs_client::File>),
}

impl Reader {
    /// Up to `len` bytes at `offset` (fewer only at the end of the file).
    pub async fn read_at(&self, offset: u64, len: usize, path: &[u8]) -> Result<Vec<u8>> {
        match self {
            // Local I/O runs on the task's own thread, as `madfs put` and
            // `get` do theirs: handing each 8 MiB transfer to the blocking
            // pool cost a large file's copy a fifth of its speed
            // (docs/PERFORMANCE.md, "Staging"); a runtime thread held a few
            // milliseconds by the page cache holds up little.
            Reader::Local(f) => {
                let mut buf = vec![0u8; len];
                let mut filled = 0;
                while filled < len {
                    match f.read_at(&mut buf[filled..], offset + filled as u64) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(io_msg("read", path, &e)),
                    }
                }
                buf.truncate(filled);
                Ok(buf)
            }
            Reader::Madfs(f) => f
                .read_at(offset, len)
                .await
                .map_err(|e| madfs_msg("read", path, &e)),
        }
    }

    /// The data segments of `[start, end)`: where a local file has data
    /// (SEEK_DATA/SEEK_HOLE), all of it for MadFS (its holes read as
    /// zeros, which the copy skips block by block).
    pub fn segments(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let Reader::Local(f) = self else {
            return vec![(start, end)];
        };
        let fd = f.as_raw_fd();
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            // SAFETY: lseek on a descriptor we own; no memory involved.
            let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::ENXIO) {
                    break; // only a hole is left
                }
                // No SEEK_DATA here: the whole range is data.
                return vec![(start, end)];
            }
            let data = data as u64;
            if data >= end {
                break;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
            let hole = if hole < 0 {
                end
            } else {
                (hole as u64).min(end)
            };
            out.push((data, hole));
            at = hole;
        }
        out
    }

    pub async fn close(self) {
        if let Reader::Madfs(f) = self {
            let _ = f.close().await;
        }
    }
}

impl Writer {
    pub async fn write_at(&self, offset: u64, data: Vec<u8>, path: &[u8]) -> Result<()> {
        match self {
            // On this thread: see `Reader::read_at`.
            Writer::Local(f) => f
                .write_all_at(&data, offset)
                .map_err(|e| io_msg("write", path, &e)),
            Writer::Madfs(f) => f
                .write_owned(offset, data)
                .await
                .map(|_| ())
                .map_err(|e| madfs_msg("write", path, &e)),
        }
    }

    pub async fn set_len(&self, size: u64, path: &[u8]) -> Result<()> {
        match self {
            Writer::Local(f) => f.set_len(size).map_err(|e| io_msg("truncate", path, &e)),
            Writer::Madfs(f) => f
                .set_len(size)
                .await
                .map(|_| ())
                .map_err(|e| madfs_msg("truncate", path, &e)),
        }
    }

    /// Finish the writes (a write-behind failure shows here).
    pub async fn close(self, path: &[u8]) -> Result<()> {
        match self {
            Writer::Local(_) => Ok(()),
            Writer::Madfs(f) => f.close().await.map_err(|e| madfs_msg("write", path, &e)),
        }
    }

    /// Close, and give the file `meta`'s attributes as `keep` says,
    /// through the open file (no path walked again): a local file through
    /// its descriptor before it is closed, a MadFS file by inode after its
    /// close (which publishes its size and mtime).
    pub async fn close_with_attrs(self, path: &[u8], meta: &Meta, keep: Preserve) -> Result<()> {
        match self {
            Writer::Local(f) => {
                let fd = f.as_raw_fd();
                let fail = |what| Err(io_msg(what, path, &std::io::Error::last_os_error()));
                // SAFETY: a descriptor we own, valid timespecs; these calls
                // only read their arguments. Owner first: chown clears the
                // set-id bits chmod then sets.
                unsafe {
                    if keep.owner && is_root() && libc::fchown(fd, meta.uid, meta.gid) != 0 {
                        return fail("change ownership of");
                    }
                    if keep.mode && libc::fchmod(fd, meta.perm as libc::mode_t) != 0 {
                        return fail("change permissions of");
                    }
                    if keep.times {
                        let times = [timespec(meta.atime), timespec(meta.mtime)];
                        if libc::futimens(fd, times.as_ptr()) != 0 {
                            return fail("set times of");
                        }
                    }
                }
                Ok(())
            }
            Writer::Madfs(f) => {
                f.close().await.map_err(|e| madfs_msg("write", path, &e))?;
                madfs_set_attrs(f.client(), f.ino(), path, meta, keep).await
            }
        }
    }
}
