//! The work items of a copy and how one is carried out, the same in the
//! coordinator's own tasks and in a worker on another host: a whole file,
//! a part of a large file, a symlink, a special file, or a comparison of
//! checksums. A file is written under a temporary name in its directory and
//! renamed when complete, so no name ever shows a partial file; a small new
//! file going into MadFS is instead created with all its bytes in one
//! request, which nobody can see half done either.

use super::fs::{join, show, split_path, Fs, Meta, Preserve, Reader, Result, Writer};
use madfs_client::FileKind;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes read and written per request: a few chunks in flight at once, as
/// `madfs put` moves them, and aligned to them.
pub const BLOCK_BYTES: u64 = 8 << 20;
/// Files larger than this are cut into parts of this size, which the
/// workers copy independently (a large file spreads over every node, and
/// no node is left holding a long tail).
const PART_BYTES: u64 = 64 << 20;

/// `MADFS_STAGE_PART_BYTES` (at least 64 KiB), which tests set to cut
/// small files into many parts.
fn part_bytes_from_env() -> Option<u64> {
    std::env::var("MADFS_STAGE_PART_BYTES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|v| v.max(64 << 10))
}

/// The size of the parts large files are cut into: for workers on several
/// hosts `PART_BYTES`, so a large file spreads over them; on one host none
/// (`u64::MAX`): one stream per file already keeps several requests in
/// flight (write-behind, read-ahead), and parts copied at once by one
/// process only compete with each other (measured: docs/PERFORMANCE.md,
/// "Staging").
pub fn part_bytes(spread: bool) -> u64 {
    part_bytes_from_env().unwrap_or(if spread { PART_BYTES } else { u64::MAX })
}

/// Zero runs this long and aligned are skipped (left as holes) when the
/// source cannot say where its holes are (MadFS reads holes as zeros).
const ZERO_RUN_BYTES: usize = 64 << 10;
/// The prefix and suffix of temporary names (`.madfs-stage-HASH.tmp`):
/// `sync` removes leftovers of an interrupted run by them.
pub const TEMP_PREFIX: &[u8] = b".madfs-stage-";
pub const TEMP_SUFFIX: &[u8] = b".tmp";

/// One unit of work, with paths absolute on their sides.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Work {
    /// Copy a regular file. `fresh`: nothing is known at `dst` (a small
    /// file may then be created there directly).
    File {
        src: Vec<u8>,
        dst: Vec<u8>,
        fresh: bool,
    },
    /// Copy `[offset, offset + len)` of `src` into the temporary file
    /// `tmp`, which the coordinator made with the final size.
    Part {
        src: Vec<u8>,
        tmp: Vec<u8>,
        offset: u64,
        len: u64,
    },
    Symlink {
        src: Vec<u8>,
        dst: Vec<u8>,
        replace: bool,
    },
    /// A FIFO, socket or device node.
    Special {
        src: Vec<u8>,
        dst: Vec<u8>,
        replace: bool,
    },
    /// Are the contents of `src` and `dst` the same (by checksum)?
    Compare { src: Vec<u8>, dst: Vec<u8> },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Item {
    pub id: u64,
    pub work: Work,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub id: u64,
    /// File bytes moved (or compared).
    pub bytes: u64,
    /// What failed, naming the path.
    pub error: Option<String>,
    /// For `Compare`: the contents are equal.
    pub same: bool,
}

impl Outcome {
    pub fn failed(id: u64, error: String) -> Outcome {
        Outcome {
            id,
            bytes: 0,
            error: Some(error),
            same: false,
        }
    }
}

/// The temporary name a file is written under before it is renamed to
/// `dst`: in the same directory, a fixed length whatever the name (so a
/// 255-byte name still has one), the same for every run (a rerun reuses
/// the leftover of an interrupted one instead of piling up more).
pub fn temp_path(dst: &[u8]) -> Vec<u8> {
    let (dir, name) = split_path(dst);
    let hash = xxhash_rust::xxh3::xxh3_64(name);
    let mut t = TEMP_PREFIX.to_vec();
    t.extend_from_slice(format!("{hash:016x}").as_bytes());
    t.extend_from_slice(TEMP_SUFFIX);
    join(dir, &t)
}

pub fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)
}

/// Parts of large files copied at once by one worker: each streams blocks
/// with several requests in flight already (write-behind, read-ahead), so
/// two streams fill the servers; more only compete for memory and cores
/// (measured: docs/PERFORMANCE.md, "Staging").
const PARTS_IN_FLIGHT: usize = 2;

fn parts_in_flight() -> usize {
    std::env::var("MADFS_STAGE_PARTS_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PARTS_IN_FLIGHT)
        .max(1)
}

/// Carries out work items between two sides.
#[derive(Clone)]
pub struct Executor {
    pub src: Fs,
    pub dst: Fs,
    pub keep: Preserve,
    /// Bounds the parts copied at once (`PARTS_IN_FLIGHT`).
    parts: Arc<tokio::sync::Semaphore>,
    /// File bytes written so far, as they are written (the progress bar
    /// follows a large file with it, not only whole files).
    moved: Arc<AtomicU64>,
}

impl Executor {
    pub fn new(src: Fs, dst: Fs, keep: Preserve) -> Executor {
        Executor {
            src,
            dst,
            keep,
            parts: Arc::new(tokio::sync::Semaphore::new(parts_in_flight())),
            moved: Arc::new(AtomicU64::new(0)),
        }
    }

    /// File bytes written so far by this executor and its clones.
    pub fn moved(&self) -> Arc<AtomicU64> {
        self.moved.clone()
    }

    pub async fn run(&self, item: Item) -> Outcome {
        let id = item.id;
        let r = match item.work {
            Work::File { src, dst, fresh } => self.copy_file(&src, &dst, fresh).await,
            Work::Part {
                src,
                tmp,
                offset,
                len,
            } => {
                let _turn = self.parts.acquire().await.expect("never closed");
                self.copy_part(&src, &tmp, offset, len).await
            }
            Work::Symlink { src, dst, replace } => self.copy_symlink(&src, &dst, replace).await,
            Work::Special { src, dst, replace } => self.copy_special(&src, &dst, replace).await,
            Work::Compare { src, dst } => {
                return match self.compare(&src, &dst).await {
                    Ok((bytes, same)) => Outcome {
                        id,
                        bytes,
                        error: None,
                        same,
                    },
                    Err(e) => Outcome::failed(id, e),
                }
            }
        };
        match r {
            Ok(bytes) => Outcome {
                id,
                bytes,
                error: None,
                same: false,
            },
            Err(e) => Outcome::failed(id, e),
        }
    }

    /// The attributes a copy gets: the source's, with the mode less the
    /// umask when modes are not preserved (as cp without -p).
    fn target_meta(&self, meta: &Meta) -> (Meta, Preserve) {
        let mut m = meta.clone();
        if !self.keep.mode {
            m.perm &= 0o777 & !super::fs::umask();
        }
        (
            m,
            Preserve {
                mode: true,
                ..self.keep
            },
        )
    }

    async fn copy_file(&self, src: &[u8], dst: &[u8], fresh: bool) -> Result<u64> {
        let (reader, meta) = self.src.open_read(src).await?;
        if meta.kind != FileKind::File {
            reader.close().await;
            return Err(format!("'{}' is not a regular file", self.src.display(src)));
        }
        let (target, keep) = self.target_meta(&meta);
        let small = meta.size <= madfs_client::limits::INLINE_DATA_MAX_BYTES;
        if fresh && small && self.dst.side() == super::fs::SideKind::Madfs {
            let data = reader.read_at(0, meta.size as usize, src).await;
            reader.close().await;
            let data = data?;
            check_length(&self.src, src, data.len() as u64, meta.size)?;
            match self.dst.create_whole(dst, &data, &target, keep).await {
                Ok(_) => return Ok(meta.size),
                // Something is there after all: replace it by rename.
                Err(e) if e.ends_with("file exists") => {}
                Err(e) => return Err(e),
            }
            let (reader, _) = self.src.open_read(src).await?;
            return self.via_temp(&reader, src, dst, &meta, &target, keep).await;
        }
        let r = self.via_temp(&reader, src, dst, &meta, &target, keep).await;
        reader.close().await;
        r
    }

    /// Write the file under its temporary name, then rename it to `dst`.
    async fn via_temp(
        &self,
        reader: &Reader,
        src: &[u8],
        dst: &[u8],
        meta: &Meta,
        target: &Meta,
        keep: Preserve,
    ) -> Result<u64> {
        let tmp = temp_path(dst);
        let r = async {
            let writer = self.dst.create(&tmp, 0o600).await?;
            let written = copy_range(self, reader, src, &writer, &tmp, 0, meta.size).await;
            if let Err(e) = written {
                let _ = writer.close(&tmp).await;
                return Err(e);
            }
            writer.close_with_attrs(&tmp, target, keep).await?;
            self.dst.rename(&tmp, dst).await
        }
        .await;
        if r.is_err() {
            let _ = self.dst.remove_file(&tmp).await;
        }
        r.map(|()| meta.size)
    }

    async fn copy_part(&self, src: &[u8], tmp: &[u8], offset: u64, len: u64) -> Result<u64> {
        let (reader, meta) = self.src.open_read(src).await?;
        let r = async {
            check_length(&self.src, src, meta.size, offset + len)?;
            let writer = self.dst.open_write(tmp).await?;
            let written = copy_range(self, &reader, src, &writer, tmp, offset, offset + len);
            let written = written.await;
            let closed = writer.close(tmp).await;
            written?;
            closed
        }
        .await;
        reader.close().await;
        r.map(|()| len)
    }

    async fn copy_symlink(&self, src: &[u8], dst: &[u8], replace: bool) -> Result<u64> {
        let meta = self.src.lstat(src).await?;
        let target = self.src.read_link(src).await?;
        if replace {
            self.dst.remove_file(dst).await?;
        }
        self.dst.symlink(&target, dst).await?;
        let keep = Preserve {
            mode: false,
            ..self.keep
        };
        self.dst.set_attrs(dst, &meta, keep).await?;
        Ok(0)
    }

    async fn copy_special(&self, src: &[u8], dst: &[u8], replace: bool) -> Result<u64> {
        let meta = self.src.lstat(src).await?;
        if replace {
            self.dst.remove_file(dst).await?;
        }
        let (target, keep) = self.target_meta(&meta);
        self.dst.mknod(dst, &target).await?;
        self.dst.set_attrs(dst, &target, keep).await?;
        Ok(0)
    }

    /// Checksums (XXH3-128) of both files, block by block.
    async fn compare(&self, src: &[u8], dst: &[u8]) -> Result<(u64, bool)> {
        let (a, ma) = self.src.open_read(src).await?;
        let (b, mb) = match self.dst.open_read(dst).await {
            Ok(x) => x,
            Err(e) => {
                a.close().await;
                return Err(e);
            }
        };
        let r = async {
            if ma.size != mb.size {
                return Ok((0, false));
            }
            let ha = checksum(&a, src, ma.size).await?;
            let hb = checksum(&b, dst, mb.size).await?;
            Ok((ma.size, ha == hb))
        }
        .await;
        a.close().await;
        b.close().await;
        r
    }
}

async fn checksum(r: &Reader, path: &[u8], size: u64) -> Result<u128> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut at = 0;
    while at < size {
        let n = (size - at).min(BLOCK_BYTES) as usize;
        let data = r.read_at(at, n, path).await?;
        if data.is_empty() {
            break;
        }
        h.update(&data);
        at += data.len() as u64;
    }
    if at != size {
        return Err(format!("'{}' changed while it was read", show(path)));
    }
    Ok(h.digest128())
}

fn check_length(fs: &Fs, path: &[u8], got: u64, want: u64) -> Result<()> {
    if got < want {
        return Err(format!(
            "'{}' changed while it was copied ({got} bytes, {want} expected)",
            fs.display(path)
        ));
    }
    Ok(())
}

/// Copy `[start, end)` of the source into the same range of the writer,
/// block by block, leaving holes where the source has them. The writer's
/// size is set to `end` when the range ends in a hole (a sparse tail).
async fn copy_range(
    exec: &Executor,
    reader: &Reader,
    src: &[u8],
    writer: &Writer,
    dst: &[u8],
    start: u64,
    end: u64,
) -> Result<()> {
    let src_fs = &exec.src;
    let skip_zeros = src_fs.side() == super::fs::SideKind::Madfs;
    let mut written_end = start;
    for (seg_start, seg_end) in reader.segments(start, end) {
        let mut at = seg_start;
        while at < seg_end {
            // Blocks end on multiples of BLOCK_BYTES: chunk-aligned writes.
            let block_end = ((at / BLOCK_BYTES + 1) * BLOCK_BYTES).min(seg_end);
            let want = block_end - at;
            let data = reader.read_at(at, want as usize, src).await?;
            check_length(src_fs, src, at + data.len() as u64, block_end)?;
            let runs = if skip_zeros {
                nonzero_runs(&data, at)
            } else {
                vec![(0, data.len())]
            };
            if runs == [(0, data.len())] {
                // All data (the usual case): the block goes as it is.
                writer.write_at(at, data, dst).await?;
                written_end = block_end;
            } else if skip_zeros {
                for (from, to) in runs {
                    writer
                        .write_at(at + from as u64, data[from..to].to_vec(), dst)
                        .await?;
                    written_end = written_end.max(at + to as u64);
                }
            } else {
                writer.write_at(at, data, dst).await?;
                written_end = block_end;
            }
            exec.moved.fetch_add(want, Ordering::Relaxed);
            at = block_end;
        }
    }
    if written_end < end {
        writer.set_len_at_least(end, dst).await?;
    }
    Ok(())
}

/// The runs of `data` (which starts at file offset `base`) that are not
/// whole aligned zero blocks of `ZERO_RUN_BYTES`: what must be written.
fn nonzero_runs(data: &[u8], base: u64) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    while at < data.len() {
        // Pieces end on absolute multiples of ZERO_RUN_BYTES.
        let abs = base + at as u64;
        let piece = ZERO_RUN_BYTES - (abs % ZERO_RUN_BYTES as u64) as usize;
        let to = (at + piece).min(data.len());
        if data[at..to].iter().any(|&b| b != 0) {
            match runs.last_mut() {
                Some(last) if last.1 == at => last.1 = to,
                _ => runs.push((at, to)),
            }
        }
        at = to;
    }
    runs
}

impl Writer {
    /// Grow the file to `size` if it is shorter (a trailing hole); another
    /// part may already have written past it.
    async fn set_len_at_least(&self, size: u64, path: &[u8]) -> Result<()> {
        let current = match self {
            Writer::Local(f) => f.metadata().map(|m| m.len()).unwrap_or(0),
            Writer::Madfs(f) => f.size(),
        };
        if current < size {
            self.set_len(size, path).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_stay_short_and_in_the_directory() {
        let long = vec![b'x'; 255];
        let t = temp_path(&join(b"/a/b", &long));
        let (dir, name) = split_path(&t);
        assert_eq!(dir, b"/a/b");
        assert!(is_temp_name(name) && name.len() < 40, "{}", show(name));
        assert_eq!(temp_path(b"/a/f"), temp_path(b"/a/f"));
        assert_ne!(temp_path(b"/a/f"), temp_path(b"/a/g"));
        assert!(!is_temp_name(b"f.tmp"));
    }

    #[test]
    fn zero_blocks_are_skipped_on_aligned_boundaries() {
        let z = ZERO_RUN_BYTES;
        let mut data = vec![0u8; 4 * z];
        data[z + 5] = 1;
        data[3 * z] = 1;
        assert_eq!(nonzero_runs(&data, 0), [(z, 2 * z), (3 * z, 4 * z)]);
        assert!(nonzero_runs(&vec![0u8; 2 * z], 0).is_empty());
        // Starting mid-block: the first piece ends at the next boundary.
        let mut d = vec![0u8; z];
        d[z - 1] = 7;
        assert_eq!(nonzero_runs(&d, (z / 2) as u64), [(z / 2, z)]);
        let dense = vec![1u8; 3 * z];
        assert_eq!(nonzero_runs(&dense, 0), [(0, 3 * z)]);
    }
}
