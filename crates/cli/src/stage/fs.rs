//! The two sides a copy moves between, behind one interface: a local file
//! system (std and libc calls) and MadFS (the client library). Paths are
//! bytes, absolute on their side. Every error is a message that names the
//! path and the reason, ready for the user.

use madfs_client::{Client, ErrorCode, FileKind, InodeId, OpenOptions, SetAttrs, TimeSet};
use madfs_client::{FileName, Timestamp};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

pub use super::io::{Reader, Writer};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Directories whose inode a MadFS side remembers, so a small file's
/// create is one request to its name's server (no path walk, no GetAttr).
const DIR_CACHE_ENTRIES_MAX: usize = 65_536;

pub type Result<T> = std::result::Result<T, String>;

/// Which side a path is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SideKind {
    Local,
    Madfs,
}

/// What a copy needs to know about an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    /// A device node's (major, minor).
    pub dev: (u32, u32),
    /// Identifies the inode on its side (with the device for local files):
    /// names sharing it are hard links of one file.
    pub link_key: u64,
    pub nlink: u32,
}

/// Which attributes to carry over (cp -a, sync: all; plain cp: none but
/// the mode, less the umask).
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Preserve {
    pub mode: bool,
    pub owner: bool,
    pub times: bool,
}

pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn os(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

pub(super) fn io_msg(what: &str, path: &[u8], e: &std::io::Error) -> String {
    let text = e.to_string();
    // "Permission denied (os error 13)" reads better without the number.
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    format!("cannot {what} '{}': {text}", show(path))
}

pub(super) fn madfs_msg(what: &str, path: &[u8], e: &madfs_client::ClientError) -> String {
    match e.code {
        ErrorCode::Unavailable | ErrorCode::TimedOut | ErrorCode::Io | ErrorCode::Protocol => {
            format!("cannot {what} 'madfs:{}': {e}", show(path))
        }
        code => format!("cannot {what} 'madfs:{}': {}", show(path), code.describe()),
    }
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_fifo() {
        FileKind::Fifo
    } else if ft.is_socket() {
        FileKind::Socket
    } else if ft.is_char_device() {
        FileKind::CharDev
    } else if ft.is_block_device() {
        FileKind::BlockDev
    } else {
        FileKind::File
    }
}

pub fn local_meta(m: &std::fs::Metadata) -> Meta {
    let rdev = m.rdev();
    Meta {
        kind: kind_of(m.file_type()),
        perm: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        size: m.size(),
        atime: ts(m.atime(), m.atime_nsec()),
        mtime: ts(m.mtime(), m.mtime_nsec()),
        dev: (libc::major(rdev), libc::minor(rdev)),
        link_key: m.dev().rotate_left(32) ^ m.ino(),
        nlink: m.nlink() as u32,
    }
}

fn ts(secs: i64, nanos: i64) -> Timestamp {
    Timestamp {
        secs,
        nanos: nanos.clamp(0, 999_999_999) as u32,
    }
}

pub fn madfs_meta(a: &madfs_client::Attr) -> Meta {
    Meta {
        kind: a.kind,
        perm: a.perm,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        dev: a.rdev_parts(),
        link_key: a.ino.0,
        nlink: a.nlink,
    }
}

fn cstr(path: &[u8]) -> Result<CString> {
    CString::new(path).map_err(|_| format!("'{}': a NUL byte in the path", show(path)))
}

pub(super) fn timespec(t: Timestamp) -> libc::timespec {
    libc::timespec {
        tv_sec: t.secs as libc::time_t,
        tv_nsec: t.nanos as libc::c_long,
    }
}

/// Whether this process may give files away (chown to any owner).
pub fn is_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: geteuid takes no arguments and cannot fail.
    *ROOT.get_or_init(|| unsafe { libc::geteuid() == 0 })
}

/// One side of a copy.
#[derive(Clone)]
pub enum Fs {
    Local,
    Madfs(MadfsSide),
}

#[derive(Clone)]
pub struct MadfsSide {
    pub client: Client,
    dirs: Arc<Mutex<HashMap<Vec<u8>, InodeId>>>,
}

impl MadfsSide {
    pub fn new(client: Client) -> MadfsSide {
        MadfsSide {
            client,
            dirs: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The inode of directory `dir`, remembered after the first walk.
    async fn dir_ino(&self, dir: &[u8]) -> Result<InodeId> {
        if let Some(ino) = self.dirs.lock().expect("dir cache").get(dir) {
            return Ok(*ino);
        }
        let a = self
            .client
            .stat(dir)
            .await
            .map_err(|e| madfs_msg("access", dir, &e))?;
        if a.kind != FileKind::Dir {
            return Err(format!("'madfs:{}' is not a directory", show(dir)));
        }
        let mut cache = self.dirs.lock().expect("dir cache");
        if cache.len() >= DIR_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        cache.insert(dir.to_vec(), a.ino);
        Ok(a.ino)
    }

    fn forget_dirs(&self) {
        self.dirs.lock().expect("dir cache").clear();
    }
}

/// The directory part and the name of an absolute path.
pub fn split_path(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (b".", path),
    }
}

/// `dir/name`.
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") && !name.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

impl Fs {
    pub fn side(&self) -> SideKind {
        match self {
            Fs::Local => SideKind::Local,
            Fs::Madfs(_) => SideKind::Madfs,
        }
    }

    /// How paths of this side print: MadFS ones with the `madfs:` prefix.
    pub fn display(&self, path: &[u8]) -> String {
        match self {
            Fs::Local => show(path),
            Fs::Madfs(_) => format!("madfs:{}", show(path)),
        }
    }

    pub async fn lstat(&self, path: &[u8]) -> Result<Meta> {
        match self {
            Fs::Local => std::fs::symlink_metadata(os(path))
                .map(|m| local_meta(&m))
                .map_err(|e| io_msg("stat", path, &e)),
            Fs::Madfs(m) => m
                .client
                .lstat(path)
                .await
                .map(|a| madfs_meta(&a))
                .map_err(|e| madfs_msg("stat", path, &e)),
        }
    }

    /// lstat, None when nothing has that name.
    pub async fn lstat_opt(&self, path: &[u8]) -> Result<Option<Meta>> {
        match self {
            Fs::Local => match std::fs::symlink_metadata(os(path)) {
                Ok(m) => Ok(Some(local_meta(&m))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_msg("stat", path, &e)),
            },
            Fs::Madfs(m) => match m.client.lstat(path).await {
                Ok(a) => Ok(Some(madfs_meta(&a))),
                Err(e) if e.code == ErrorCode::NotFound => Ok(None),
                Err(e) => Err(madfs_msg("stat", path, &e)),
            },
        }
    }

    /// Make a directory; one that exists already is fine.
    pub async fn mkdir(&self, path: &[u8], perm: u32) -> Result<()> {
        match self {
            Fs::Local => {
                let mut b = std::fs::DirBuilder::new();
                std::os::unix::fs::DirBuilderExt::mode(&mut b, perm);
                match b.create(os(path)) {
                    Ok(()) => Ok(()),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AlreadyExists && os(path).is_dir() =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(io_msg("create directory", path, &e)),
                }
            }
            Fs::Madfs(m) => match m.client.mkdir(path, perm).await {
                Ok(_) => Ok(()),
                Err(e) if e.code == ErrorCode::Exists => match m.client.stat(path).await {
                    Ok(a) if a.kind == FileKind::Dir => Ok(()),
                    _ => Err(madfs_msg("create directory", path, &e)),
                },
                Err(e) => Err(madfs_msg("create directory", path, &e)),
            },
        }
    }

    /// Make a directory and any missing parents.
    pub async fn mkdir_all(&self, path: &[u8]) -> Result<()> {
        match self {
            Fs::Local => {
                std::fs::create_dir_all(os(path)).map_err(|e| io_msg("create directory", path, &e))
            }
            Fs::Madfs(m) => m
                .client
                .mkdir_all(path, 0o755)
                .await
                .map(|_| ())
                .map_err(|e| madfs_msg("create directory", path, &e)),
        }
    }

    pub async fn read_link(&self, path: &[u8]) -> Result<Vec<u8>> {
        match self {
            Fs::Local => std::fs::read_link(os(path))
                .map(|t| t.into_os_string().into_encoded_bytes())
                .map_err(|e| io_msg("read symbolic link", path, &e)),
            Fs::Madfs(m) => m
                .client
                .read_link(path)
                .await
                .map_err(|e| madfs_msg("read symbolic link", path, &e)),
        }
    }

    pub async fn symlink(&self, target: &[u8], path: &[u8]) -> Result<()> {
        match self {
            Fs::Local => std::os::unix::fs::symlink(os(target), os(path))
                .map_err(|e| io_msg("create symbolic link", path, &e)),
            Fs::Madfs(m) => m
                .client
                .symlink(target, path)
                .await
                .map(|_| ())
                .map_err(|e| madfs_msg("create symbolic link", path, &e)),
        }
    }

    pub async fn hard_link(&self, existing: &[u8], path: &[u8]) -> Result<()> {
        match self {
            Fs::Local => std::fs::hard_link(os(existing), os(path))
                .map_err(|e| io_msg("create hard link", path, &e)),
            Fs::Madfs(m) => m
                .client
                .hard_link(existing, path)
                .await
                .map(|_| ())
                .map_err(|e| madfs_msg("create hard link", path, &e)),
        }
    }

    pub async fn mknod(&self, path: &[u8], meta: &Meta) -> Result<()> {
        match self {
            Fs::Local => {
                let c = cstr(path)?;
                let mode = meta.kind.mode_bits() | (meta.perm & 0o7777);
                let dev = libc::makedev(meta.dev.0, meta.dev.1);
                // SAFETY: a valid C string; mknod only reads it.
                let r = unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, dev) };
                if r != 0 {
                    return Err(io_msg("create", path, &std::io::Error::last_os_error()));
                }
                Ok(())
            }
            Fs::Madfs(m) => {
                let rdev = if meta.kind.is_device() {
                    madfs_client::Attr::make_rdev(meta.dev.0, meta.dev.1)
                        .ok_or_else(|| format!("'{}': device number too large", show(path)))?
                } else {
                    0
                };
                m.client
                    .mknod(path, meta.kind, meta.perm, rdev)
                    .await
                    .map(|_| ())
                    .map_err(|e| madfs_msg("create", path, &e))
            }
        }
    }

    /// rename(2): replaces a non-directory at `to`.
    pub async fn rename(&self, from: &[u8], to: &[u8]) -> Result<()> {
        match self {
            Fs::Local => std::fs::rename(os(from), os(to)).map_err(|e| io_msg("rename", from, &e)),
            Fs::Madfs(m) => m
                .client
                .rename(from, to)
                .await
                .map_err(|e| madfs_msg("rename", from, &e)),
        }
    }

    /// Remove a file, symlink or special file; gone already is fine.
    pub async fn remove_file(&self, path: &[u8]) -> Result<()> {
        match self {
            Fs::Local => match std::fs::remove_file(os(path)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io_msg("remove", path, &e))
                }
                _ => Ok(()),
            },
            Fs::Madfs(m) => match m.client.remove_file(path).await {
                Err(e) if e.code != ErrorCode::NotFound => Err(madfs_msg("remove", path, &e)),
                _ => Ok(()),
            },
        }
    }

    /// Remove a directory and everything below it.
    pub async fn remove_tree(&self, path: &[u8]) -> Result<()> {
        match self {
            Fs::Local => match std::fs::remove_dir_all(os(path)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io_msg("remove", path, &e))
                }
                _ => Ok(()),
            },
            Fs::Madfs(m) => {
                m.forget_dirs();
                match m.client.remove_dir_all(path).await {
                    Err(e) if e.code != ErrorCode::NotFound => Err(madfs_msg("remove", path, &e)),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Carry `meta`'s attributes over to `path` as `keep` says: the owner
    /// first (chown clears set-id bits), then the mode, then the times.
    /// A symlink's mode is left alone (it has none that matters).
    pub async fn set_attrs(&self, path: &[u8], meta: &Meta, keep: Preserve) -> Result<()> {
        let owner = keep.owner && is_root();
        if !(owner || keep.mode || keep.times) {
            return Ok(());
        }
        match self {
            Fs::Local => {
                let c = cstr(path)?;
                let fail = |what| Err(io_msg(what, path, &std::io::Error::last_os_error()));
                // SAFETY: valid C strings and timespecs; these calls only
                // read their arguments.
                unsafe {
                    if owner && libc::lchown(c.as_ptr(), meta.uid, meta.gid) != 0 {
                        return fail("change ownership of");
                    }
                    if keep.mode
                        && meta.kind != FileKind::Symlink
                        && libc::chmod(c.as_ptr(), meta.perm as libc::mode_t) != 0
                    {
                        return fail("change permissions of");
                    }
                    if keep.times {
                        let times = [timespec(meta.atime), timespec(meta.mtime)];
                        let r = libc::utimensat(
                            libc::AT_FDCWD,
                            c.as_ptr(),
                            times.as_ptr(),
                            libc::AT_SYMLINK_NOFOLLOW,
                        );
                        if r != 0 {
                            return fail("set times of");
                        }
                    }
                }
                Ok(())
            }
            Fs::Madfs(m) => {
                let a = m
                    .client
                    .lstat(path)
                    .await
                    .map_err(|e| madfs_msg("stat", path, &e))?;
                madfs_set_attrs(&m.client, a.ino, path, meta, keep).await
            }
        }
    }

    /// Open a source file to read; its attributes as the open saw them.
    pub async fn open_read(&self, path: &[u8]) -> Result<(Reader, Meta)> {
        match self {
            Fs::Local => {
                let f = std::fs::File::open(os(path)).map_err(|e| io_msg("open", path, &e))?;
                let m = f.metadata().map_err(|e| io_msg("stat", path, &e))?;
                Ok((Reader::Local(f), local_meta(&m)))
            }
            Fs::Madfs(m) => {
                let opts = OpenOptions::new().read(true).read_ahead(true);
                let f = m
                    .client
                    .open(path, opts)
                    .await
                    .map_err(|e| madfs_msg("open", path, &e))?;
                let meta = madfs_meta(&f.attr());
                Ok((Reader::Madfs(Box::new(f)), meta))
            }
        }
    }

    /// Create (or truncate) `path` to write.
    pub async fn create(&self, path: &[u8], perm: u32) -> Result<Writer> {
        match self {
            Fs::Local => std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(perm | 0o200)
                .open(os(path))
                .map(Writer::Local)
                .map_err(|e| io_msg("create", path, &e)),
            Fs::Madfs(m) => {
                let opts = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .perm(perm | 0o200)
                    .write_behind(true);
                m.client
                    .open(path, opts)
                    .await
                    .map(|f| Writer::Madfs(Box::new(f)))
                    .map_err(|e| madfs_msg("create", path, &e))
            }
        }
    }

    /// Open an existing file to write parts of it (no truncation).
    pub async fn open_write(&self, path: &[u8]) -> Result<Writer> {
        match self {
            Fs::Local => std::fs::OpenOptions::new()
                .write(true)
                .open(os(path))
                .map(Writer::Local)
                .map_err(|e| io_msg("open", path, &e)),
            Fs::Madfs(m) => {
                let opts = OpenOptions::new().write(true).write_behind(true);
                m.client
                    .open(path, opts)
                    .await
                    .map(|f| Writer::Madfs(Box::new(f)))
                    .map_err(|e| madfs_msg("open", path, &e))
            }
        }
    }

    /// Create `path`, which must not exist, holding all of `data` in one
    /// step that nobody sees half done (MadFS: one request up to 64 KiB),
    /// and give it `meta`'s attributes. False when this side has no such
    /// step: the caller writes a temporary name and renames it.
    pub async fn create_whole(
        &self,
        path: &[u8],
        data: &[u8],
        meta: &Meta,
        keep: Preserve,
    ) -> Result<bool> {
        let Fs::Madfs(m) = self else {
            return Ok(false);
        };
        if data.len() as u64 > madfs_client::limits::INLINE_DATA_MAX_BYTES {
            return Ok(false);
        }
        let (dir, name) = split_path(path);
        let parent = m.dir_ino(dir).await?;
        let name =
            FileName::new(name).map_err(|e| format!("'{}': bad name ({e:?})", show(path)))?;
        let perm = if keep.mode {
            meta.perm
        } else {
            meta.perm & !umask()
        };
        let a = m
            .client
            .create_with_data(parent, &name, perm, data)
            .await
            .map_err(|e| madfs_msg("create", path, &e))?;
        let keep_rest = Preserve {
            mode: false,
            ..keep
        };
        madfs_set_attrs(&m.client, a.ino, path, meta, keep_rest).await?;
        Ok(true)
    }
}

/// One SetAttr with every attribute `keep` asks for.
pub(super) async fn madfs_set_attrs(
    client: &Client,
    ino: InodeId,
    path: &[u8],
    meta: &Meta,
    keep: Preserve,
) -> Result<()> {
    let owner = keep.owner && is_root();
    let changes = SetAttrs {
        perm: (keep.mode && meta.kind != FileKind::Symlink).then_some(meta.perm),
        uid: owner.then_some(meta.uid),
        gid: owner.then_some(meta.gid),
        atime: if keep.times {
            TimeSet::At(meta.atime)
        } else {
            TimeSet::Omit
        },
        mtime: if keep.times {
            TimeSet::At(meta.mtime)
        } else {
            TimeSet::Omit
        },
        ..SetAttrs::default()
    };
    if changes == SetAttrs::default() {
        return Ok(());
    }
    client
        .setattr(ino, changes)
        .await
        .map(|_| ())
        .map_err(|e| madfs_msg("set attributes of", path, &e))
}

/// This process's umask (read without changing it for good).
pub fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        // SAFETY: umask cannot fail; set back at once, before any thread
        // of ours creates files (called first from the command's start).
        unsafe {
            let old = libc::umask(0o022);
            libc::umask(old);
            old as u32
        }
    })
}
