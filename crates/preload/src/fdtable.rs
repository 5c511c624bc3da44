//! Open MadFS files as real file descriptors.
//!
//! Each MadFS open reserves a kernel descriptor: a memfd (`memfd_create`),
//! so the number is the lowest free one as open(2) would give, nothing else
//! in the process can get it, and dup/dup2/fork/exec treat it as they treat
//! any descriptor. A table maps the number to the open file description
//! (`Desc`): inode, flags, the client's open file. Several numbers share a
//! `Desc` after dup, as they share a kernel description.
//!
//! The kernel object carries what must be shared beyond this process:
//! - the file offset *is* the memfd's offset, so it is shared across dup,
//!   fork and exec exactly as POSIX says (read/write set it with lseek);
//! - its name (`madfs:1:<kind>:<ino>:<flags>:<path>`) lets a program started
//!   by exec recognise descriptors it inherited (see `inherit`);
//! - for a file open for writing, writes that bypass this library (stdio on
//!   a redirected stdout: glibc writes with its internal write, which cannot
//!   be interposed) land in the memfd at the current offset. They are
//!   "harvested" into MadFS at the next call on that descriptor, at close,
//!   fork, exec and exit: the bytes between the offset our last call left
//!   (the mark, stored in the memfd at `MARK_OFFSET`, past any MadFS file
//!   size, so every process sharing the description sees it) and the current
//!   offset. This is exact for sequential writers, which is what redirected
//!   output is.
//! - a read-only file installed as stdin/stdout/stderr is copied into its
//!   memfd ("prefilled", up to `PREFILL_MAX`) and sealed, so stdio reads
//!   that bypass us read the right bytes.

use crate::conn;
use crate::real;
use crate::shim::{debug, Errno, R};
use madfs_client::{Attr, DirCursor, File, FileKind, InodeId, OpenOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Where the mark lives in a capturing memfd: past the largest MadFS file.
pub const MARK_OFFSET: u64 = 1 << 47;

/// Largest file copied into a memfd for stdio readers of a redirected stdin.
const PREFILL_MAX_DEFAULT: u64 = 256 << 20;

/// Bytes moved per step when harvesting or prefilling.
const STEP: usize = 8 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// One open file description.
pub struct Desc {
    pub kind: Kind,
    pub ino: InodeId,
    /// The MadFS path it was opened by (normalized), if known.
    pub path: Option<Vec<u8>>,
    /// Access mode and status flags, as F_GETFL shows them.
    pub flags: AtomicI32,
    /// Attributes at open, if opened in this process image.
    base_attr: Option<Attr>,
    /// The largest size this description has seen (kept outside the lock so
    /// a forked child can rebuild the description without locking).
    pub size_hint: AtomicU64,
    file: Mutex<Option<Arc<File>>>,
    /// Serialises calls that use the shared offset.
    pub io: Mutex<()>,
    /// Writes bypassing us are captured in the memfd (open for writing).
    pub capture: bool,
    /// The mark when it cannot be kept in the memfd (RLIMIT_FSIZE set).
    local_mark: AtomicU64,
    /// For directories: the entries listed so far.
    pub listing: Mutex<Listing>,
    /// st_ino of the memfd: a number that the kernel closed behind our
    /// back (inside the C library) and gave to something else is noticed.
    memfd_ino: AtomicU64,
    /// A private duplicate of the memfd (high, close-on-exec), made when
    /// the description becomes a standard stream or is inherited over exec:
    /// the background harvester works through it, so it is always this
    /// description whatever the program does to its own numbers.
    shadow: AtomicI32,
    /// How many numbers of the table refer to it (other holders of the Arc,
    /// such as the harvester, do not count): at zero it is closed.
    table_refs: AtomicUsize,
}

/// A directory listing in progress: "." and ".." then the entries, fetched
/// a page at a time; positions index this sequence.
#[derive(Default)]
pub struct Listing {
    pub entries: Vec<(Vec<u8>, u64, FileKind)>,
    cursor: DirCursor,
    done: bool,
}

impl Desc {
    pub fn new(
        kind: Kind,
        attr: Attr,
        path: Option<Vec<u8>>,
        flags: i32,
        file: Option<File>,
    ) -> Desc {
        let capture = kind == Kind::File && writable(flags);
        Desc {
            kind,
            ino: attr.ino,
            path,
            flags: AtomicI32::new(flags),
            size_hint: AtomicU64::new(attr.size),
            base_attr: Some(attr),
            file: Mutex::new(file.map(Arc::new)),
            io: Mutex::new(()),
            capture,
            local_mark: AtomicU64::new(0),
            listing: Mutex::new(Listing::default()),
            memfd_ino: AtomicU64::new(0),
            shadow: AtomicI32::new(-1),
            table_refs: AtomicUsize::new(0),
        }
    }

    /// A description known only by inode (inherited over exec).
    fn inherited(kind: Kind, ino: InodeId, path: Option<Vec<u8>>, flags: i32) -> Desc {
        Desc {
            kind,
            ino,
            path,
            flags: AtomicI32::new(flags),
            size_hint: AtomicU64::new(0),
            base_attr: None,
            file: Mutex::new(None),
            io: Mutex::new(()),
            capture: kind == Kind::File && writable(flags),
            local_mark: AtomicU64::new(0),
            listing: Mutex::new(Listing::default()),
            memfd_ino: AtomicU64::new(0),
            shadow: AtomicI32::new(-1),
            table_refs: AtomicUsize::new(0),
        }
    }

    /// A copy for a forked child: same identity, nothing of the parent's
    /// connection, fresh locks (the parent's may be held by threads the
    /// child does not have).
    fn fork_copy(&self) -> Desc {
        Desc {
            kind: self.kind,
            ino: self.ino,
            path: self.path.clone(),
            flags: AtomicI32::new(self.flags.load(Ordering::Relaxed)),
            size_hint: AtomicU64::new(self.size_hint.load(Ordering::Relaxed)),
            base_attr: self.base_attr.clone(),
            file: Mutex::new(None),
            io: Mutex::new(()),
            capture: self.capture,
            local_mark: AtomicU64::new(self.local_mark.load(Ordering::Relaxed)),
            listing: Mutex::new(Listing::default()),
            memfd_ino: AtomicU64::new(self.memfd_ino.load(Ordering::Relaxed)),
            // Inherited by fork, still ours (and still the same description).
            shadow: AtomicI32::new(self.shadow.load(Ordering::Relaxed)),
            table_refs: AtomicUsize::new(0),
        }
    }

    pub fn flags(&self) -> i32 {
        self.flags.load(Ordering::Relaxed)
    }

    pub fn readable(&self) -> bool {
        let acc = self.flags() & libc::O_ACCMODE;
        self.flags() & libc::O_PATH == 0 && (acc == libc::O_RDONLY || acc == libc::O_RDWR)
    }

    pub fn writable(&self) -> bool {
        self.flags() & libc::O_PATH == 0 && writable(self.flags())
    }

    pub fn lock_io(&self) -> MutexGuard<'_, ()> {
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock_listing(&self) -> MutexGuard<'_, Listing> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client's open file, made on first use here (after exec or fork).
    pub fn file(&self) -> R<(&'static conn::Conn, Arc<File>)> {
        let c = conn::get()?;
        let mut slot = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &*slot {
            return Ok((c, f.clone()));
        }
        let mut attr = match &self.base_attr {
            Some(a) => a.clone(),
            None => c.block_on(c.client.getattr(self.ino))?,
        };
        attr.size = attr.size.max(self.size_hint.load(Ordering::Relaxed));
        let f = Arc::new(File::new(&c.client, attr, &opts_of(self.flags())));
        *slot = Some(f.clone());
        Ok((c, f))
    }

    /// The open file if one exists (no connection made).
    pub fn file_if_open(&self) -> Option<Arc<File>> {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn note_size(&self, f: &File) {
        self.size_hint.fetch_max(f.size(), Ordering::Relaxed);
    }

    /// Publish the size of our writes (what close does). Errors are returned
    /// for close(2) to report.
    pub fn publish(&self) -> R<()> {
        if let Some(f) = self.file_if_open() {
            if f.needs_size_update() || f.writes_behind() {
                let c = conn::get()?;
                c.block_on(f.close())?;
            }
        }
        Ok(())
    }

    /// The descriptor to use for the memfd: our shadow if there is one.
    fn io_fd(&self, fd: i32) -> i32 {
        match self.shadow.load(Ordering::Relaxed) {
            s if s >= 0 => s,
            _ => fd,
        }
    }

    /// Make the shadow descriptor (see `shadow`) if there is none.
    pub fn ensure_shadow(&self, fd: i32) {
        if !self.capture || self.shadow.load(Ordering::Relaxed) >= 0 {
            return;
        }
        // SAFETY: duplicating our memfd.
        let s = crate::internal::adopt(unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) });
        if s >= 0
            && self
                .shadow
                .compare_exchange(-1, s, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            crate::internal::forget(s);
            // SAFETY: our duplicate, unused.
            unsafe { real::close(s) };
        }
    }

    pub fn has_shadow(&self) -> bool {
        self.shadow.load(Ordering::Relaxed) >= 0
    }

    fn read_mark(&self, fd: i32) -> u64 {
        let fd = self.io_fd(fd);
        if !shared_marks() {
            return self.local_mark.load(Ordering::Relaxed);
        }
        let mut b = [0u8; 8];
        // SAFETY: an 8-byte buffer.
        let n = unsafe { real::pread64(fd, b.as_mut_ptr().cast(), 8, MARK_OFFSET as i64) };
        if n == 8 {
            u64::from_le_bytes(b)
        } else {
            0
        }
    }

    pub fn write_mark(&self, fd: i32, v: u64) {
        let fd = self.io_fd(fd);
        self.local_mark.store(v, Ordering::Relaxed);
        if self.capture && shared_marks() {
            let b = v.to_le_bytes();
            // SAFETY: an 8-byte buffer.
            unsafe { real::pwrite64(fd, b.as_ptr().cast(), 8, MARK_OFFSET as i64) };
        }
    }

    /// The shared offset, after moving bytes written around us into MadFS.
    /// Call with the io lock held.
    pub fn sync_offset(&self, fd: i32) -> R<u64> {
        let fd = self.io_fd(fd);
        // SAFETY: lseek on our descriptor.
        let off = unsafe { real::seek(fd, 0, libc::SEEK_CUR) };
        if off < 0 {
            return Err(Errno(crate::shim::errno()));
        }
        let off = off as u64;
        if !self.capture {
            return Ok(off);
        }
        let mark = self.read_mark(fd);
        if off == mark {
            return Ok(off);
        }
        if off > mark {
            self.harvest(fd, mark, off)?;
        }
        self.write_mark(fd, off);
        Ok(off)
    }

    /// Copy [from, to) of the memfd into the file, if bytes were written there.
    fn harvest(&self, fd: i32, from: u64, to: u64) -> R<()> {
        let probe = ProbeFd::open(fd)?;
        // SAFETY: lseek on our private descriptor of the memfd.
        let data = unsafe { real::seek(probe.0, from as i64, libc::SEEK_DATA) };
        if data < 0 || data as u64 >= to {
            // The offset moved without writes (an lseek we did not see).
            return Ok(());
        }
        let (c, f) = self.file()?;
        let mut pos = from;
        let mut buf = vec![0u8; STEP.min((to - from) as usize)];
        while pos < to {
            let want = ((to - pos) as usize).min(buf.len());
            // SAFETY: `want` bytes of `buf`.
            let n = unsafe { real::pread64(probe.0, buf.as_mut_ptr().cast(), want, pos as i64) };
            if n <= 0 {
                break;
            }
            // In append mode the bytes go to the end, as the kernel would
            // have put them.
            let at = if self.flags() & libc::O_APPEND != 0 {
                pos.max(f.size())
            } else {
                pos
            };
            c.block_on(f.write_at(at, &buf[..n as usize]))?;
            let done = pos + n as u64;
            // Saved: move the mark, and give the memory back as we go (the
            // whole pages only: a partial page at the end may be taking a
            // concurrent write).
            self.write_mark(fd, done);
            let (start, end) = (pos.div_ceil(4096) * 4096, done & !4095);
            if end > start {
                // SAFETY: fallocate on our memfd; failure only costs memory.
                unsafe {
                    real::fallocate64(
                        fd,
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        start as i64,
                        (end - start) as i64,
                    )
                };
            }
            pos = done;
        }
        self.note_size(&f);
        debug!(
            "harvested {} bytes written around us into inode {}",
            pos - from,
            self.ino.0
        );
        Ok(())
    }

    /// Copy the file into the memfd and seal it, for readers that bypass us.
    pub fn prefill(&self, fd: i32) -> R<()> {
        if self.kind != Kind::File || self.capture || !self.readable() {
            return Ok(());
        }
        // SAFETY: fcntl on our descriptor.
        let seals = unsafe { real::fcntl(fd, libc::F_GET_SEALS, 0) };
        if seals < 0 || seals & libc::F_SEAL_WRITE != 0 {
            return Ok(()); // done already (or not sealable)
        }
        let (c, f) = self.file()?;
        let size = c.block_on(c.client.getattr(self.ino))?.size.max(f.size());
        let max = std::env::var("MADFS_PREFILL_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PREFILL_MAX_DEFAULT);
        if size > max {
            crate::shim::warn_once(
                "prefill",
                format_args!(
                    "a MadFS file of {size} bytes is a standard stream: reads through stdio see \
                     only its first {max} bytes (MADFS_PREFILL_MAX)"
                ),
            );
        }
        let size = size.min(max);
        let mut pos = 0u64;
        while pos < size {
            let want = ((size - pos) as usize).min(STEP);
            let data = c.block_on(f.read_at(pos, want))?;
            if data.is_empty() {
                break;
            }
            // SAFETY: writes `data` to our memfd at `pos`.
            let n = unsafe { real::pwrite64(fd, data.as_ptr().cast(), data.len(), pos as i64) };
            if n != data.len() as isize {
                return Err(Errno(libc::EIO));
            }
            pos += n as u64;
        }
        let all = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our descriptor.
        unsafe { real::fcntl(fd, libc::F_ADD_SEALS, all as libc::c_long) };
        debug!("prefilled fd {fd} with {pos} bytes of inode {}", self.ino.0);
        Ok(())
    }

    /// The entry at `pos` of the listing: (name, inode, kind), or None at the end.
    pub fn entry_at(&self, listing: &mut Listing, pos: u64) -> R<Option<(Vec<u8>, u64, FileKind)>> {
        match pos {
            0 => return Ok(Some((b".".to_vec(), self.ino.0, FileKind::Dir))),
            1 => return Ok(Some((b"..".to_vec(), self.ino.0, FileKind::Dir))),
            _ => {}
        }
        let idx = (pos - 2) as usize;
        while idx >= listing.entries.len() && !listing.done {
            let c = conn::get()?;
            let (page, next) =
                c.block_on(c.client.readdir_page(self.ino, &listing.cursor, 1024))?;
            listing.entries.extend(
                page.into_iter()
                    .map(|e| (e.name.as_bytes().to_vec(), e.ino.0, e.kind)),
            );
            listing.done = next.is_done();
            listing.cursor = next;
        }
        Ok(listing.entries.get(idx).cloned())
    }
}

impl Listing {
    pub fn reset(&mut self) {
        *self = Listing::default();
    }
}

impl Drop for Desc {
    /// The last reference gone without close (dup'd numbers closed by
    /// close_range, a racing close): still publish the size.
    fn drop(&mut self) {
        let shadow = *self.shadow.get_mut();
        if shadow >= 0 && !crate::config::foreign_child() {
            crate::internal::forget(shadow);
            // SAFETY: our private duplicate.
            unsafe { real::close(shadow) };
        }
        if let Some(f) = self
            .file
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            if (f.needs_size_update() || f.writes_behind()) && !crate::config::foreign_child() {
                if let Ok(c) = conn::get() {
                    let _ = c.block_on(f.close());
                }
            }
            // The last handle of a file unlinked while open: free it now
            // (dropped off the runtime, the file only queued that).
            drop(f);
            if !crate::config::foreign_child() {
                if let Ok(c) = conn::get() {
                    if c.client.has_unlinked_to_release() {
                        let _ = c.block_on(c.client.release_unlinked());
                    }
                }
            }
        }
    }
}

/// How the library opens a file for `flags`: writes go behind (a write
/// returns once its data is handed to a task, up to 8 per file and 64 MiB
/// per process in flight, as the mount and a kernel's page cache do; reads,
/// truncates and fsyncs through any descriptor of the file in this process
/// wait for them; a failure comes back from a later write, fsync or close),
/// except with O_SYNC/O_DSYNC; a file open only to read is read ahead while
/// its reads are sequential or strided.
pub fn open_options(flags: i32, mode: u32) -> OpenOptions {
    let mut opts = OpenOptions::from_flags(flags, mode);
    opts.write_behind = opts.write && flags & libc::O_DSYNC == 0;
    opts.read_ahead = !opts.write && !opts.append;
    opts
}

fn writable(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR
}

fn opts_of(flags: i32) -> OpenOptions {
    // Only the access mode and O_DSYNC matter: appends are positioned by
    // ops.rs.
    open_options(flags & (libc::O_ACCMODE | libc::O_DSYNC), 0)
}

/// A read-only descriptor of a memfd of ours, for SEEK_DATA and reading
/// captured bytes without moving the shared offset.
struct ProbeFd(i32);

impl ProbeFd {
    fn open(fd: i32) -> R<ProbeFd> {
        let path = format!("/proc/self/fd/{fd}\0");
        // SAFETY: a NUL-terminated path.
        let p = unsafe { real::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
        if p < 0 {
            return Err(Errno(crate::shim::errno()));
        }
        Ok(ProbeFd(p))
    }
}

impl Drop for ProbeFd {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { real::close(self.0) };
    }
}

/// Whether the mark can live in the memfd: writing at MARK_OFFSET would
/// raise SIGXFSZ under a file size limit.
fn shared_marks() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit out-parameter.
        unsafe {
            libc::getrlimit(libc::RLIMIT_FSIZE, &mut r) == 0 && r.rlim_cur == libc::RLIM_INFINITY
        }
    })
}

// ---- the table ----

/// Numbers below this are tracked in a bitmap, so asking "is it ours" costs
/// one atomic load for the descriptors every program uses.
const BITMAP_FDS: usize = 1 << 16;
static BITS: [AtomicU64; BITMAP_FDS / 64] = [const { AtomicU64::new(0) }; BITMAP_FDS / 64];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Set once a number at or above BITMAP_FDS was ever ours.
static HIGH: AtomicBool = AtomicBool::new(false);

pub static TABLE: RwLock<BTreeMap<i32, Arc<Desc>>> = RwLock::new(BTreeMap::new());

fn set_bit(fd: i32, on: bool) {
    let fd = fd as usize;
    if fd < BITMAP_FDS {
        let mask = 1u64 << (fd % 64);
        if on {
            BITS[fd / 64].fetch_or(mask, Ordering::Release);
        } else {
            BITS[fd / 64].fetch_and(!mask, Ordering::Release);
        }
    } else if on {
        HIGH.store(true, Ordering::Release);
    }
}

/// Cheap test before the table is consulted.
#[inline]
pub fn maybe_ours(fd: i32) -> bool {
    if fd < 0 || COUNT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let f = fd as usize;
    if f < BITMAP_FDS {
        BITS[f / 64].load(Ordering::Acquire) & (1u64 << (f % 64)) != 0
    } else {
        HIGH.load(Ordering::Acquire)
    }
}

/// Whether any descriptor is ours.
#[inline]
pub fn maybe_ours_any() -> bool {
    COUNT.load(Ordering::Relaxed) > 0
}

pub fn get(fd: i32) -> Option<Arc<Desc>> {
    if !maybe_ours(fd) {
        return None;
    }
    let d = TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()?;
    if memfd_ino(fd) == Some(d.memfd_ino.load(Ordering::Relaxed)) {
        return Some(d);
    }
    // Closed inside the C library (fclose, freopen, daemon...) and maybe
    // reused: not ours any more.
    debug!("fd {fd} is no longer ours");
    if !crate::config::foreign_child() {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        if t.get(&fd).is_some_and(|cur| Arc::ptr_eq(cur, &d)) {
            t.remove(&fd);
            d.table_refs.fetch_sub(1, Ordering::AcqRel);
            COUNT.fetch_sub(1, Ordering::Relaxed);
            set_bit(fd, false);
        }
    }
    None
}

/// The inode of what `fd` refers to, if it is open.
fn memfd_ino(fd: i32) -> Option<u64> {
    // SAFETY: fstat into a zeroed buffer.
    unsafe {
        let mut st: libc::stat64 = std::mem::zeroed();
        (real::fstat64(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// Install `desc` at `fd`; the description that was there, if any.
pub fn insert(fd: i32, desc: Arc<Desc>) -> Option<Arc<Desc>> {
    if desc.memfd_ino.load(Ordering::Relaxed) == 0 {
        if let Some(i) = memfd_ino(fd) {
            desc.memfd_ino.store(i, Ordering::Relaxed);
        }
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    desc.table_refs.fetch_add(1, Ordering::AcqRel);
    let old = t.insert(fd, desc);
    match &old {
        None => {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        Some(o) => {
            o.table_refs.fetch_sub(1, Ordering::AcqRel);
        }
    }
    set_bit(fd, true);
    old
}

pub fn remove(fd: i32) -> Option<Arc<Desc>> {
    if !maybe_ours(fd) {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let old = t.remove(&fd);
    if let Some(o) = &old {
        o.table_refs.fetch_sub(1, Ordering::AcqRel);
        COUNT.fetch_sub(1, Ordering::Relaxed);
        set_bit(fd, false);
    }
    old
}

/// After a number let go of `desc`: if no number refers to it any more, it
/// is closed: publish the size of its writes (as close(2) reports errors).
pub fn release(desc: Arc<Desc>) -> R<()> {
    if desc.table_refs.load(Ordering::Acquire) == 0 {
        desc.publish()
    } else {
        Ok(())
    }
}

/// Every entry (a snapshot).
pub fn all() -> Vec<(i32, Arc<Desc>)> {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

/// In a forked child, with the table's write lock held by the fork handler:
/// replace every description by a fresh copy (dup'd numbers keep sharing
/// one), leaking the parent's.
pub fn rebuild_after_fork(t: &mut BTreeMap<i32, Arc<Desc>>) {
    let old = std::mem::take(t);
    let mut copies: Vec<(*const Desc, Arc<Desc>)> = Vec::new();
    for (fd, d) in old.iter() {
        let key = Arc::as_ptr(d);
        let copy = match copies.iter().find(|(k, _)| *k == key) {
            Some((_, c)) => c.clone(),
            None => {
                let c = Arc::new(d.fork_copy());
                copies.push((key, c.clone()));
                c
            }
        };
        copy.table_refs.fetch_add(1, Ordering::AcqRel);
        t.insert(*fd, copy);
    }
    std::mem::forget(old);
}

// ---- reserving descriptors ----

/// Make the kernel descriptor for a new description: a memfd whose name
/// describes it (for exec), at the lowest free number.
pub fn reserve(kind: Kind, ino: InodeId, flags: i32, path: Option<&[u8]>, cloexec: bool) -> R<i32> {
    let k = match kind {
        Kind::File => 'F',
        Kind::Dir => 'D',
    };
    let mut name = format!("madfs:1:{k}:{:x}:{:x}:", ino.0, flags).into_bytes();
    if let Some(p) = path {
        // memfd names are at most 249 bytes; a longer path is left out.
        if name.len() + p.len() <= 249 {
            name.extend_from_slice(p);
        }
    }
    name.push(0);
    let mut mflags = libc::MFD_ALLOW_SEALING;
    if cloexec {
        mflags |= libc::MFD_CLOEXEC;
    }
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr().cast(), mflags) };
    if fd < 0 {
        return Err(Errno(crate::shim::errno()));
    }
    Ok(fd)
}

/// Parse a memfd link ("/memfd:madfs:1:F:ino:flags:path (deleted)").
pub fn parse_memfd_link(link: &[u8]) -> Option<(Kind, InodeId, i32, Option<Vec<u8>>)> {
    let rest = link.strip_prefix(b"/memfd:madfs:1:")?;
    let rest = rest.strip_suffix(b" (deleted)").unwrap_or(rest);
    let mut it = rest.splitn(4, |&b| b == b':');
    let kind = match it.next()? {
        b"F" => Kind::File,
        b"D" => Kind::Dir,
        _ => return None,
    };
    let ino = u64::from_str_radix(std::str::from_utf8(it.next()?).ok()?, 16).ok()?;
    let flags = u32::from_str_radix(std::str::from_utf8(it.next()?).ok()?, 16).ok()? as i32;
    let path = it.next()?;
    let path = if path.first() == Some(&b'/') {
        Some(path.to_vec())
    } else {
        None
    };
    Some((kind, InodeId(ino), flags, path))
}

/// At start: take over the MadFS descriptors inherited over exec.
pub fn inherit() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let mut found = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let link = std::os::unix::ffi::OsStrExt::as_bytes(link.as_os_str()).to_vec();
        if let Some(parsed) = parse_memfd_link(&link) {
            found.push((fd, parsed));
        }
    }
    // Numbers sharing a kernel description share a Desc: the memfd inode
    // tells them apart.
    let mut by_inode: Vec<(u64, Arc<Desc>)> = Vec::new();
    for (fd, (kind, ino, flags, path)) in found {
        // SAFETY: fstat of an open descriptor into a zeroed buffer.
        let st_ino = unsafe {
            let mut st: libc::stat64 = std::mem::zeroed();
            if real::fstat64(fd, &mut st) != 0 {
                continue;
            }
            st.st_ino
        };
        let desc = match by_inode.iter().find(|(i, _)| *i == st_ino) {
            Some((_, d)) => d.clone(),
            None => {
                let d = Arc::new(Desc::inherited(kind, ino, path, flags));
                by_inode.push((st_ino, d.clone()));
                d
            }
        };
        debug!("inherited fd {fd} (inode {})", ino.0);
        desc.ensure_shadow(fd);
        insert(fd, desc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_links_parse() {
        let (k, ino, flags, path) =
            parse_memfd_link(b"/memfd:madfs:1:F:1a:8001:/a:b/c (deleted)").unwrap();
        assert_eq!(k, Kind::File);
        assert_eq!(ino, InodeId(0x1a));
        assert_eq!(flags, 0x8001);
        assert_eq!(path.unwrap(), b"/a:b/c");
        let (k, _, _, path) = parse_memfd_link(b"/memfd:madfs:1:D:1:0: (deleted)").unwrap();
        assert_eq!(k, Kind::Dir);
        assert!(path.is_none());
        assert!(parse_memfd_link(b"/memfd:other (deleted)").is_none());
        assert!(parse_memfd_link(b"/tmp/x").is_none());
    }
}
