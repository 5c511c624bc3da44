//! What the phases run on: an [`Engine`] is a file system seen through a
//! handful of operations. [`MadfsEngine`] goes through the MadFS client
//! library; [`LocalEngine`] through `std::fs` on a directory (the kernel's
//! file system: the baseline); [`ClientEngine`] is `LocalEngine` on MadFS
//! seen through `madfs run` or the FUSE mount, with the server-side find.

use crate::ClientKind;
use madfs_client::{
    BlockingClient, BlockingFile, FileKind, FileName, FindQuery, InodeId, OpenOptions, SizeCmp,
    SizeTest, Timestamp,
};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, String>;

/// A directory resolved once, for the per-file operations of the mdtest
/// phases (as a real client caches the directory's lookup).
#[derive(Clone, Debug)]
pub struct DirRef {
    pub path: String,
    ino: Option<InodeId>,
}

/// The find phase's filters, as IO500 runs `find DIR -newer TS -size 3901c
/// -name "*01*"`.
#[derive(Clone, Debug)]
pub struct FindSpec {
    /// Match only files modified strictly after this time (seconds, nanos).
    pub newer_than: (i64, u32),
    /// Match only files of exactly this size.
    pub size: u64,
    /// Shell pattern on the name (`*` and `?`).
    pub name: String,
}

/// What a find saw: entries examined and entries that matched every filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FindCount {
    pub scanned: u64,
    pub matched: u64,
}

/// An open file of the ior phases.
pub trait BenchFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    /// `write_at` of a buffer given away (a client that sends it later
    /// need not copy it).
    fn write_owned(&mut self, offset: u64, data: Vec<u8>) -> Result<()> {
        self.write_at(offset, &data)
    }
    /// Read exactly `buf.len()` bytes (a short read is an error).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Close, after an fsync if `sync`.
    fn finish(self: Box<Self>, sync: bool) -> Result<()>;
}

pub trait Engine {
    /// A short name for reports ("madfs", "local").
    fn name(&self) -> &'static str;
    fn mkdir_all(&self, path: &str) -> Result<()>;
    fn dir(&self, path: &str) -> Result<DirRef>;
    /// Create `name` in `dir` (it must not exist) holding `data`.
    fn create(&self, dir: &DirRef, name: &str, data: &[u8]) -> Result<()>;
    /// The size of `name` in `dir`.
    fn stat(&self, dir: &DirRef, name: &str) -> Result<u64>;
    /// The whole of `name` in `dir`, which holds `len` bytes.
    fn read(&self, dir: &DirRef, name: &str, len: usize) -> Result<Vec<u8>>;
    fn unlink(&self, dir: &DirRef, name: &str) -> Result<()>;
    /// Open for writing (creating it if missing) or for reading.
    fn open(&self, path: &str, write: bool) -> Result<Box<dyn BenchFile>>;
    /// Modification time of a path (seconds, nanos).
    fn mtime(&self, path: &str) -> Result<(i64, u32)>;
    /// Count the files under `root` matching `spec`.
    fn find(&self, root: &str, spec: &FindSpec) -> Result<FindCount>;
    fn remove_all(&self, path: &str) -> Result<()>;
}

/// Shell-style match of `name` against `pat` (`*` any run, `?` one byte).
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

// ---------------------------------------------------------------- MadFS

/// MadFS through the blocking client library.
pub struct MadfsEngine {
    bc: BlockingClient,
}

impl MadfsEngine {
    pub fn connect(cluster: Option<&Path>) -> Result<MadfsEngine> {
        // A rank is one thread issuing one request at a time.
        let bc = BlockingClient::connect_single_threaded(cluster).map_err(|e| e.to_string())?;
        Ok(MadfsEngine { bc })
    }
}

fn fname(name: &str) -> Result<FileName> {
    FileName::new(name.as_bytes()).map_err(|e| format!("bad name '{name}': {e:?}"))
}

fn ino(dir: &DirRef) -> InodeId {
    dir.ino.expect("a MadFS DirRef has its inode")
}

struct MadfsFile(BlockingFile);

impl BenchFile for MadfsFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.0.write_at(offset, data).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn write_owned(&mut self, offset: u64, data: Vec<u8>) -> Result<()> {
        self.0
            .write_owned(offset, data)
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let got = self
            .0
            .read_at(offset, buf.len())
            .map_err(|e| e.to_string())?;
        if got.len() != buf.len() {
            return Err(format!(
                "short read at {offset}: {} of {} bytes",
                got.len(),
                buf.len()
            ));
        }
        buf.copy_from_slice(&got);
        Ok(())
    }

    fn finish(self: Box<Self>, sync: bool) -> Result<()> {
        if sync {
            self.0.fsync().map_err(|e| e.to_string())?;
        }
        self.0.close().map_err(|e| e.to_string())
    }
}

impl Engine for MadfsEngine {
    fn name(&self) -> &'static str {
        "madfs"
    }

    fn mkdir_all(&self, path: &str) -> Result<()> {
        self.bc
            .mkdir_all(path, 0o755)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn dir(&self, path: &str) -> Result<DirRef> {
        let attr = self.bc.stat(path).map_err(|e| e.to_string())?;
        Ok(DirRef {
            path: path.to_string(),
            ino: Some(attr.ino),
        })
    }

    fn create(&self, dir: &DirRef, name: &str, data: &[u8]) -> Result<()> {
        let err = |e: madfs_client::ClientError| format!("create {}/{name}: {e}", dir.path);
        self.bc
            .create_with_data(ino(dir), &fname(name)?, 0o644, data)
            .map_err(err)?;
        Ok(())
    }

    fn stat(&self, dir: &DirRef, name: &str) -> Result<u64> {
        let attr = self
            .bc
            .lookup(ino(dir), &fname(name)?)
            .map_err(|e| format!("stat {}/{name}: {e}", dir.path))?;
        Ok(attr.size)
    }

    fn read(&self, dir: &DirRef, name: &str, len: usize) -> Result<Vec<u8>> {
        let err = |e: madfs_client::ClientError| format!("read {}/{name}: {e}", dir.path);
        let attr = self.bc.lookup(ino(dir), &fname(name)?).map_err(err)?;
        let f = self.bc.file(attr, &OpenOptions::new().read(true));
        f.read_at(0, len).map_err(err)
    }

    fn unlink(&self, dir: &DirRef, name: &str) -> Result<()> {
        self.bc
            .unlink(ino(dir), &fname(name)?)
            .map_err(|e| format!("unlink {}/{name}: {e}", dir.path))
    }

    fn open(&self, path: &str, write: bool) -> Result<Box<dyn BenchFile>> {
        let opts = if write {
            // As the kernel's page cache does for the baseline: a write
            // returns once copied; finish() waits (and fsyncs if asked).
            OpenOptions::new()
                .write(true)
                .create(true)
                .write_behind(true)
        } else {
            // As the kernel's read-ahead does for the baseline: the next
            // reads are sent while the rank checks the last one.
            OpenOptions::new().read(true).read_ahead(true)
        };
        let f = self.bc.open(path, opts).map_err(|e| e.to_string())?;
        Ok(Box::new(MadfsFile(f)))
    }

    fn mtime(&self, path: &str) -> Result<(i64, u32)> {
        let a = self.bc.stat(path).map_err(|e| e.to_string())?;
        Ok((a.mtime.secs, a.mtime.nanos))
    }

    /// The server-side find (every server scans its shard at once): files
    /// named like `spec.name`, of exactly `spec.size` bytes, modified after
    /// `spec.newer_than`. `scanned` is the servers' count of entries
    /// examined: the whole file system's, which in a benchmark run is the
    /// run directory (see docs/ARCHITECTURE.md).
    fn find(&self, root: &str, spec: &FindSpec) -> Result<FindCount> {
        let query = FindQuery {
            name: Some(spec.name.as_bytes().to_vec()),
            newer: Some(Timestamp {
                secs: spec.newer_than.0,
                nanos: spec.newer_than.1,
            }),
            size: Some(SizeTest {
                cmp: SizeCmp::Equal,
                n: spec.size,
                unit: 1,
            }),
            kind: Some(FileKind::File),
            ..FindQuery::default()
        };
        let client = self.bc.client();
        let out = self
            .bc
            .runtime()
            .block_on(client.find_count(root, &query))
            .map_err(|e| format!("find {root}: {e}"))?;
        if let Some(d) = out.denied.first() {
            return Err(format!(
                "find {root}: permission denied: {}",
                String::from_utf8_lossy(d)
            ));
        }
        Ok(FindCount {
            scanned: out.scanned,
            matched: out.found.len() as u64,
        })
    }

    fn remove_all(&self, path: &str) -> Result<()> {
        self.bc.remove_dir_all(path).map_err(|e| e.to_string())
    }
}

// ---------------------------------------------------------------- clients

/// `path` (below `root`, which is MadFS's `/`) as a MadFS path; unchanged
/// if it is not below `root`.
pub fn fs_path(root: &Path, path: &str) -> String {
    match Path::new(path).strip_prefix(root) {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => path.to_string(),
    }
}

/// MadFS through a user-facing client: every operation is the local
/// engine's (`std::fs`, which the interception library or the FUSE mount
/// serves), but find is the server-side find, as `madfs find --io500` runs
/// it for IO500.
pub struct ClientEngine {
    kind: ClientKind,
    root: PathBuf,
    local: LocalEngine,
    madfs: MadfsEngine,
}

impl ClientEngine {
    pub fn connect(kind: ClientKind, root: &Path, cluster: &Path) -> Result<ClientEngine> {
        Ok(ClientEngine {
            kind,
            root: root.to_path_buf(),
            local: LocalEngine,
            madfs: MadfsEngine::connect(Some(cluster))?,
        })
    }
}

impl Engine for ClientEngine {
    fn name(&self) -> &'static str {
        match self.kind {
            ClientKind::Run => "madfs-run",
            ClientKind::Mount => "madfs-mount",
        }
    }
    fn mkdir_all(&self, path: &str) -> Result<()> {
        self.local.mkdir_all(path)
    }
    fn dir(&self, path: &str) -> Result<DirRef> {
        self.local.dir(path)
    }
    fn create(&self, dir: &DirRef, name: &str, data: &[u8]) -> Result<()> {
        self.local.create(dir, name, data)
    }
    fn stat(&self, dir: &DirRef, name: &str) -> Result<u64> {
        self.local.stat(dir, name)
    }
    fn read(&self, dir: &DirRef, name: &str, len: usize) -> Result<Vec<u8>> {
        self.local.read(dir, name, len)
    }
    fn unlink(&self, dir: &DirRef, name: &str) -> Result<()> {
        self.local.unlink(dir, name)
    }
    fn open(&self, path: &str, write: bool) -> Result<Box<dyn BenchFile>> {
        self.local.open(path, write)
    }
    fn mtime(&self, path: &str) -> Result<(i64, u32)> {
        self.local.mtime(path)
    }
    fn find(&self, root: &str, spec: &FindSpec) -> Result<FindCount> {
        self.madfs.find(&fs_path(&self.root, root), spec)
    }
    fn remove_all(&self, path: &str) -> Result<()> {
        self.local.remove_all(path)
    }
}

// ---------------------------------------------------------------- local

/// A directory of the local (kernel) file system.
pub struct LocalEngine;

fn io(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

struct LocalFile(std::fs::File, PathBuf);

impl BenchFile for LocalFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.0
            .write_all_at(data, offset)
            .map_err(|e| io("write", &self.1, e))
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0
            .read_exact_at(buf, offset)
            .map_err(|e| io("read", &self.1, e))
    }

    fn finish(self: Box<Self>, sync: bool) -> Result<()> {
        if sync {
            self.0.sync_all().map_err(|e| io("fsync", &self.1, e))?;
        }
        Ok(())
    }
}

fn mtime_of(m: &std::fs::Metadata) -> (i64, u32) {
    use std::os::unix::fs::MetadataExt;
    (m.mtime(), m.mtime_nsec() as u32)
}

impl Engine for LocalEngine {
    fn name(&self) -> &'static str {
        "local"
    }

    fn mkdir_all(&self, path: &str) -> Result<()> {
        std::fs::create_dir_all(path).map_err(|e| io("mkdir", Path::new(path), e))
    }

    fn dir(&self, path: &str) -> Result<DirRef> {
        Ok(DirRef {
            path: path.to_string(),
            ino: None,
        })
    }

    fn create(&self, dir: &DirRef, name: &str, data: &[u8]) -> Result<()> {
        use std::io::Write;
        let p = Path::new(&dir.path).join(name);
        let mut f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(|e| io("create", &p, e))?;
        if !data.is_empty() {
            f.write_all(data).map_err(|e| io("write", &p, e))?;
        }
        Ok(())
    }

    fn stat(&self, dir: &DirRef, name: &str) -> Result<u64> {
        let p = Path::new(&dir.path).join(name);
        let m = std::fs::symlink_metadata(&p).map_err(|e| io("stat", &p, e))?;
        Ok(m.len())
    }

    fn read(&self, dir: &DirRef, name: &str, _len: usize) -> Result<Vec<u8>> {
        let p = Path::new(&dir.path).join(name);
        std::fs::read(&p).map_err(|e| io("read", &p, e))
    }

    fn unlink(&self, dir: &DirRef, name: &str) -> Result<()> {
        let p = Path::new(&dir.path).join(name);
        std::fs::remove_file(&p).map_err(|e| io("unlink", &p, e))
    }

    fn open(&self, path: &str, write: bool) -> Result<Box<dyn BenchFile>> {
        let p = PathBuf::from(path);
        let f = if write {
            std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
        } else {
            std::fs::File::open(&p)
        }
        .map_err(|e| io("open", &p, e))?;
        Ok(Box::new(LocalFile(f, p)))
    }

    fn mtime(&self, path: &str) -> Result<(i64, u32)> {
        let m = std::fs::metadata(path).map_err(|e| io("stat", Path::new(path), e))?;
        Ok(mtime_of(&m))
    }

    fn find(&self, root: &str, spec: &FindSpec) -> Result<FindCount> {
        let mut count = FindCount::default();
        let mut dirs = vec![PathBuf::from(root)];
        while let Some(d) = dirs.pop() {
            let rd = std::fs::read_dir(&d).map_err(|e| io("readdir", &d, e))?;
            for e in rd {
                let e = e.map_err(|e| io("readdir", &d, e))?;
                count.scanned += 1;
                let ft = e.file_type().map_err(|err| io("stat", &e.path(), err))?;
                if ft.is_dir() {
                    dirs.push(e.path());
                } else if ft.is_file()
                    && glob_match(spec.name.as_bytes(), e.file_name().as_encoded_bytes())
                {
                    let m = e.metadata().map_err(|err| io("stat", &e.path(), err))?;
                    if m.len() == spec.size && mtime_of(&m) > spec.newer_than {
                        count.matched += 1;
                    }
                }
            }
        }
        Ok(count)
    }

    fn remove_all(&self, path: &str) -> Result<()> {
        std::fs::remove_dir_all(path).map_err(|e| io("remove", Path::new(path), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_paths_map_to_madfs_paths() {
        let root = Path::new("/madfs");
        assert_eq!(fs_path(root, "/madfs/io500.1/x"), "/io500.1/x");
        assert_eq!(fs_path(root, "/madfs"), "/");
        assert_eq!(fs_path(root, "/madfsx/y"), "/madfsx/y");
        assert_eq!(fs_path(Path::new("/tmp/m"), "/tmp/m/a"), "/a");
    }

    #[test]
    fn glob() {
        assert!(glob_match(b"*01*", b"file.mdtest.0.101"));
        assert!(glob_match(b"*01*", b"01"));
        assert!(!glob_match(b"*01*", b"file.mdtest.1.10"));
        assert!(glob_match(b"a?c*", b"abcdef"));
        assert!(!glob_match(b"a?c", b"abcd"));
        assert!(glob_match(b"*", b""));
    }
}
