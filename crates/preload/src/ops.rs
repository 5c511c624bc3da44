//! Operations on MadFS descriptors: open, close, read, write, seek, dup,
//! fcntl, and the fd-based metadata calls. Callers have established that
//! the path or descriptor is ours.

use crate::config;
use crate::conn;
use crate::fdtable::{self, Desc, Kind};
use crate::real;
use crate::shim::{debug, errno, unsupported, Errno, R};
use madfs_client::{Attr, FileKind, SetAttrs, TimeSet, Timestamp, ACCESS_READ};
use std::sync::Arc;

/// Linux caps one read or write at this many bytes.
const RW_MAX: usize = 0x7fff_f000;

/// Refuse MadFS work in a vfork child: its memory is its parent's.
pub fn not_in_vfork_child() -> R<()> {
    if config::foreign_child() {
        return Err(unsupported(
            "MadFS calls",
            "in a child made by vfork or clone before it calls exec",
        ));
    }
    Ok(())
}

/// A MadFS path without a trailing slash (the root stays "/").
pub fn clean(path: &[u8]) -> Vec<u8> {
    let mut p = path.to_vec();
    while p.len() > 1 && p.last() == Some(&b'/') {
        p.pop();
    }
    p
}

pub fn stat_path(path: &[u8], follow: bool) -> R<Attr> {
    let c = conn::get()?;
    Ok(c.block_on(c.client.resolve(path, follow))?)
}

/// open(2) on a MadFS path.
pub fn open(path: &[u8], flags: i32, mode: u32) -> R<i32> {
    not_in_vfork_child()?;
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(unsupported("open", "O_TMPFILE"));
    }
    let c = conn::get()?;
    let creation = libc::O_CREAT
        | libc::O_EXCL
        | libc::O_NOCTTY
        | libc::O_TRUNC
        | libc::O_CLOEXEC
        | libc::O_DIRECTORY
        | libc::O_NOFOLLOW;
    let status = flags & !creation;
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let (kind, attr, file) = if flags & libc::O_PATH != 0 {
        let attr = stat_path(path, !nofollow)?;
        if flags & libc::O_DIRECTORY != 0 && attr.kind != FileKind::Dir {
            return Err(Errno(libc::ENOTDIR));
        }
        let kind = if attr.kind == FileKind::Dir {
            Kind::Dir
        } else {
            Kind::File
        };
        (kind, attr, None)
    } else if flags & libc::O_DIRECTORY != 0 && flags & libc::O_CREAT == 0 {
        let attr = stat_path(path, !nofollow)?;
        match attr.kind {
            FileKind::Dir => {}
            FileKind::Symlink => return Err(Errno(libc::ELOOP)),
            _ => return Err(Errno(libc::ENOTDIR)),
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno(libc::EISDIR));
        }
        let attr = c.block_on(c.client.access(attr.ino, ACCESS_READ))?;
        (Kind::Dir, attr, None)
    } else {
        if nofollow && flags & libc::O_EXCL == 0 {
            if let Ok(a) = stat_path(path, false) {
                if a.kind == FileKind::Symlink {
                    return Err(Errno(libc::ELOOP));
                }
            }
        }
        let opts = fdtable::open_options(flags, mode & !config::umask());
        let f = c.block_on(c.client.open(path, opts))?;
        let attr = f.attr();
        if attr.kind == FileKind::Dir {
            (Kind::Dir, attr, None)
        } else {
            (Kind::File, attr, Some(f))
        }
    };
    let path = clean(path);
    let fd = fdtable::reserve(
        kind,
        attr.ino,
        status,
        Some(&path),
        flags & libc::O_CLOEXEC != 0,
    )?;
    debug!(
        "open {} flags {flags:#x} -> fd {fd} (inode {})",
        String::from_utf8_lossy(&path),
        attr.ino.0
    );
    let size = attr.size;
    let desc = Arc::new(Desc::new(kind, attr, Some(path), status, file));
    if desc.capture && status & libc::O_APPEND != 0 && size > 0 {
        // Writes that bypass us land at the offset: start it at the end.
        set_offset(fd, &desc, size);
    }
    fdtable::insert(fd, desc);
    Ok(fd)
}

/// close(2) of one of our numbers.
pub fn close(fd: i32, desc: Arc<Desc>) -> R<i32> {
    if config::foreign_child() {
        // SAFETY: closing the kernel descriptor only; the table is the parent's.
        return Ok(unsafe { real::close(fd) });
    }
    let harvested = if desc.capture {
        let _io = desc.lock_io();
        desc.sync_offset(fd).map(|_| ())
    } else {
        Ok(())
    };
    drop(fdtable::remove(fd));
    // SAFETY: our reserved descriptor.
    let r = unsafe { real::close(fd) };
    let e = errno();
    let published = fdtable::release(desc);
    debug!("close fd {fd}");
    if r < 0 {
        crate::shim::set_errno(e);
        return Ok(r);
    }
    harvested?;
    published?;
    Ok(0)
}

fn set_offset(fd: i32, desc: &Desc, off: u64) {
    // SAFETY: lseek on our descriptor.
    unsafe { real::seek(fd, off as i64, libc::SEEK_SET) };
    desc.write_mark(fd, off);
}

/// Read at `off` into `buf`; the byte count.
fn read_at(desc: &Desc, buf: &mut [u8], off: u64) -> R<usize> {
    match desc.kind {
        Kind::Dir => return Err(Errno(libc::EISDIR)),
        Kind::File if !desc.readable() => return Err(Errno(libc::EBADF)),
        Kind::File => {}
    }
    if buf.is_empty() {
        return Ok(0);
    }
    let (c, f) = desc.file()?;
    let data = c.block_on(f.read_at(off, buf.len()))?;
    buf[..data.len()].copy_from_slice(&data);
    Ok(data.len())
}

/// Write `data` at `off`, or in append mode at the end as this process
/// knows it: the larger of the shared offset `off` (left at the end by the
/// last append through this description, in any process) and our size.
/// Appends through one description are atomic within a process; MadFS has
/// no server-side append, so concurrent appenders in several processes (or
/// through separate opens) may overwrite each other. The offset after it.
fn write_at(desc: &Desc, data: &[u8], off: u64) -> R<u64> {
    if desc.kind == Kind::Dir || !desc.writable() {
        return Err(Errno(libc::EBADF));
    }
    let (c, f) = desc.file()?;
    let pos = if desc.flags() & libc::O_APPEND != 0 {
        off.max(f.size())
    } else {
        off
    };
    if data.is_empty() {
        return Ok(pos);
    }
    c.block_on(f.write_at(pos, data))?;
    desc.note_size(&f);
    if desc.flags() & libc::O_DSYNC != 0 {
        c.block_on(f.fsync())?;
    }
    Ok(pos + data.len() as u64)
}

pub fn read(fd: i32, desc: &Desc, buf: &mut [u8]) -> R<usize> {
    not_in_vfork_child()?;
    let _io = desc.lock_io();
    let off = desc.sync_offset(fd)?;
    let n = read_at(desc, buf, off)?;
    set_offset(fd, desc, off + n as u64);
    Ok(n)
}

pub fn write(fd: i32, desc: &Desc, data: &[u8]) -> R<usize> {
    not_in_vfork_child()?;
    let _io = desc.lock_io();
    let off = desc.sync_offset(fd)?;
    let end = write_at(desc, data, off)?;
    set_offset(fd, desc, end);
    Ok(data.len())
}

pub fn pread(fd: i32, desc: &Desc, buf: &mut [u8], off: i64) -> R<usize> {
    not_in_vfork_child()?;
    if off < 0 {
        return Err(Errno(libc::EINVAL));
    }
    if desc.capture {
        let _io = desc.lock_io();
        desc.sync_offset(fd)?;
    }
    read_at(desc, buf, off as u64)
}

pub fn pwrite(fd: i32, desc: &Desc, data: &[u8], off: i64) -> R<usize> {
    not_in_vfork_child()?;
    if off < 0 {
        return Err(Errno(libc::EINVAL));
    }
    if desc.flags() & libc::O_APPEND != 0 {
        // Linux appends even with an offset given; the shared offset moves.
        return write(fd, desc, data);
    }
    if desc.capture {
        let _io = desc.lock_io();
        desc.sync_offset(fd)?;
    }
    write_at(desc, data, off as u64)?;
    Ok(data.len())
}

/// The current size: the owner's, or larger if this process's writes
/// (through any descriptor) say so.
pub fn current_size(desc: &Desc) -> R<u64> {
    let c = conn::get()?;
    let a = c.block_on(c.client.fstat(desc.ino))?;
    let mine = desc.file_if_open().map(|f| f.size()).unwrap_or(0);
    Ok(a.size.max(mine))
}

pub fn lseek(fd: i32, desc: &Desc, off: i64, whence: i32) -> R<i64> {
    not_in_vfork_child()?;
    let _io = desc.lock_io();
    let cur = desc.sync_offset(fd)? as i64;
    let new = match (desc.kind, whence) {
        (_, libc::SEEK_SET) => Some(off),
        (_, libc::SEEK_CUR) => cur.checked_add(off),
        (Kind::File, libc::SEEK_END) => (current_size(desc)? as i64).checked_add(off),
        (Kind::File, libc::SEEK_DATA) => {
            let size = current_size(desc)? as i64;
            if off >= size {
                return Err(Errno(libc::ENXIO));
            }
            Some(off)
        }
        (Kind::File, libc::SEEK_HOLE) => {
            let size = current_size(desc)? as i64;
            if off >= size {
                return Err(Errno(libc::ENXIO));
            }
            Some(size)
        }
        _ => None,
    };
    let new = match new {
        Some(n) if n >= 0 => n,
        _ => return Err(Errno(libc::EINVAL)),
    };
    if desc.kind == Kind::Dir && new == 0 {
        desc.lock_listing().reset();
    }
    set_offset(fd, desc, new as u64);
    Ok(new)
}

/// fstat's attributes of a descriptor.
pub fn fstat(fd: i32, desc: &Desc) -> R<Attr> {
    not_in_vfork_child()?;
    if desc.capture {
        let _io = desc.lock_io();
        desc.sync_offset(fd)?;
    }
    let c = conn::get()?;
    let mut a = c.block_on(c.client.fstat(desc.ino))?;
    if let Some(f) = desc.file_if_open() {
        a.size = a.size.max(f.size());
    }
    Ok(a)
}

pub fn ftruncate(fd: i32, desc: &Desc, len: i64) -> R<()> {
    not_in_vfork_child()?;
    if len < 0 || desc.kind != Kind::File || !desc.writable() {
        return Err(Errno(libc::EINVAL));
    }
    let _io = desc.lock_io();
    desc.sync_offset(fd)?;
    let (c, f) = desc.file()?;
    c.block_on(f.set_len(len as u64))?;
    desc.size_hint
        .store(len as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

pub fn fsync(fd: i32, desc: &Desc) -> R<()> {
    not_in_vfork_child()?;
    if desc.kind != Kind::File {
        // A directory's entries live on every server (by name): syncing
        // them all makes the names made and removed in it durable, as the
        // mount's fsyncdir does.
        return sync_all();
    }
    if desc.capture {
        let _io = desc.lock_io();
        desc.sync_offset(fd)?;
    }
    // Through a descriptor not used for I/O yet too (`sync FILE`, a
    // reader's fsync): what other handles and processes wrote must be
    // made durable (`File::fsync` of a handle that wrote nothing syncs the
    // servers holding the file's chunks).
    let (c, f) = desc.file()?;
    c.block_on(f.fsync())?;
    Ok(())
}

/// Make everything every server acknowledged durable (syncfs(2) of
/// MadFS, a directory's fsync).
pub fn sync_all() -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.fsync_all())?;
    Ok(())
}

pub fn setattr(desc: &Desc, changes: SetAttrs) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.setattr(desc.ino, changes))?;
    Ok(())
}

/// utimensat's `times` as MadFS changes (NULL: both now).
///
/// # Safety
/// `times` is NULL or points to two timespecs.
pub unsafe fn time_changes(times: *const libc::timespec) -> R<SetAttrs> {
    let conv = |t: &libc::timespec| -> R<TimeSet> {
        match t.tv_nsec {
            libc::UTIME_NOW => Ok(TimeSet::Now),
            libc::UTIME_OMIT => Ok(TimeSet::Omit),
            n if (0..1_000_000_000).contains(&n) => Ok(TimeSet::At(Timestamp {
                secs: t.tv_sec,
                nanos: n as u32,
            })),
            _ => Err(Errno(libc::EINVAL)),
        }
    };
    let (atime, mtime) = if times.is_null() {
        (TimeSet::Now, TimeSet::Now)
    } else {
        // SAFETY: two timespecs by the caller's contract.
        let ts = unsafe { std::slice::from_raw_parts(times, 2) };
        (conv(&ts[0])?, conv(&ts[1])?)
    };
    Ok(SetAttrs {
        atime,
        mtime,
        ..SetAttrs::default()
    })
}

/// The description installed at `new` after a successful dup of `old`.
pub fn dup_installed(desc: &Arc<Desc>, new: i32) {
    if let Some(old) = fdtable::insert(new, desc.clone()) {
        let _ = fdtable::release(old);
    }
    if new <= 2 {
        let _ = desc.prefill(new);
        // A standard stream: written through stdio (around us) for as long
        // as the program runs; the harvester keeps the memfd small.
        if desc.capture {
            desc.ensure_shadow(new);
            crate::harvest::ensure_harvester();
        }
    }
}

/// dup2/dup3 where `old` or `new` is ours.
pub fn dup3(old: i32, new: i32, flags: i32, two: bool) -> R<i32> {
    let old_desc = fdtable::get(old);
    let new_desc = fdtable::get(new);
    if old == new {
        // SAFETY: plain forwarding.
        return Ok(unsafe {
            if two {
                real::dup2(old, new)
            } else {
                real::dup3(old, new, flags)
            }
        });
    }
    if let Some(d) = &new_desc {
        if !config::foreign_child() && d.capture {
            let _io = d.lock_io();
            let _ = d.sync_offset(new);
        }
    }
    // SAFETY: plain forwarding.
    let r = unsafe {
        if two {
            real::dup2(old, new)
        } else {
            real::dup3(old, new, flags)
        }
    };
    if r < 0 || config::foreign_child() {
        return Ok(r);
    }
    match old_desc {
        Some(d) => dup_installed(&d, new),
        None => {
            if let Some(o) = fdtable::remove(new) {
                let _ = fdtable::release(o);
            }
        }
    }
    debug!("dup {old} -> {new}");
    Ok(r)
}

pub fn fcntl(fd: i32, desc: &Arc<Desc>, cmd: i32, arg: libc::c_long) -> R<i32> {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: plain forwarding.
            let r = unsafe { real::fcntl(fd, cmd, arg) };
            if r >= 0 && !config::foreign_child() {
                dup_installed(desc, r);
            }
            Ok(r)
        }
        libc::F_GETFL => Ok(desc.flags()),
        libc::F_SETFL => {
            let settable = libc::O_APPEND
                | libc::O_NONBLOCK
                | libc::O_ASYNC
                | libc::O_DIRECT
                | libc::O_NOATIME;
            let old = desc.flags();
            let new = (old & !settable) | (arg as i32 & settable);
            desc.flags.store(new, std::sync::atomic::Ordering::Relaxed);
            Ok(0)
        }
        libc::F_GETFD | libc::F_SETFD => {
            // SAFETY: plain forwarding: close-on-exec is the kernel's.
            Ok(unsafe { real::fcntl(fd, cmd, arg) })
        }
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => Err(unsupported("fcntl(F_*LK)", "file locks")),
        libc::F_ADD_SEALS | libc::F_GET_SEALS => Err(Errno(libc::EINVAL)),
        libc::F_SETLEASE | libc::F_GETLEASE | libc::F_NOTIFY => Err(unsupported(
            "fcntl(F_SETLEASE/F_NOTIFY)",
            "leases and notifications",
        )),
        // F_GETOWN, F_SETSIG, pipe sizes...: what the kernel says of the memfd.
        // SAFETY: plain forwarding.
        _ => Ok(unsafe { real::fcntl(fd, cmd, arg) }),
    }
}

/// A slice from a C buffer; EFAULT for NULL with a length.
///
/// # Safety
/// `p` is NULL or valid for `n` bytes.
pub unsafe fn slice<'a>(p: *const libc::c_void, n: usize) -> R<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), n.min(RW_MAX)) })
}

/// # Safety
/// `p` is NULL or valid for writing `n` bytes.
pub unsafe fn slice_mut<'a>(p: *mut libc::c_void, n: usize) -> R<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast(), n.min(RW_MAX)) })
}

/// The iovecs as slices.
///
/// # Safety
/// `iov` is valid for `cnt` entries, each valid for its length.
pub unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: i32) -> R<&'a [libc::iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(Errno(libc::EINVAL));
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// Gather iovecs into one buffer (for writev).
///
/// # Safety
/// As `iovecs`.
pub unsafe fn gather(iov: &[libc::iovec]) -> R<Vec<u8>> {
    let mut out = Vec::new();
    for v in iov {
        // SAFETY: the caller's contract.
        out.extend_from_slice(unsafe { slice(v.iov_base, v.iov_len)? });
        if out.len() >= RW_MAX {
            out.truncate(RW_MAX);
            break;
        }
    }
    Ok(out)
}

/// Scatter `data` over iovecs (for readv).
///
/// # Safety
/// As `iovecs`, writable.
pub unsafe fn scatter(iov: &[libc::iovec], mut data: &[u8]) -> R<()> {
    for v in iov {
        if data.is_empty() {
            break;
        }
        let n = v.iov_len.min(data.len());
        // SAFETY: the caller's contract.
        let dst = unsafe { slice_mut(v.iov_base, n)? };
        dst.copy_from_slice(&data[..n]);
        data = &data[n..];
    }
    Ok(())
}

pub fn iov_total(iov: &[libc::iovec]) -> usize {
    iov.iter()
        .fold(0usize, |a, v| a.saturating_add(v.iov_len))
        .min(RW_MAX)
}

// ---- copying between any two descriptors (sendfile, copy_file_range, splice) ----

/// Read from any descriptor: at `off` if given, else at its offset.
fn read_any(fd: i32, buf: &mut [u8], off: Option<i64>) -> R<usize> {
    if let Some(d) = fdtable::get(fd) {
        return match off {
            Some(o) => pread(fd, &d, buf, o),
            None => read(fd, &d, buf),
        };
    }
    // SAFETY: a valid buffer.
    let n = unsafe {
        match off {
            Some(o) => real::pread64(fd, buf.as_mut_ptr().cast(), buf.len(), o),
            None => real::read(fd, buf.as_mut_ptr().cast(), buf.len()),
        }
    };
    if n < 0 {
        return Err(Errno(errno()));
    }
    Ok(n as usize)
}

fn write_all_any(fd: i32, mut data: &[u8], off: Option<i64>) -> R<usize> {
    if let Some(d) = fdtable::get(fd) {
        return match off {
            Some(o) => pwrite(fd, &d, data, o),
            None => write(fd, &d, data),
        };
    }
    let total = data.len();
    let mut off = off;
    while !data.is_empty() {
        // SAFETY: a valid buffer.
        let n = unsafe {
            match off {
                Some(o) => real::pwrite64(fd, data.as_ptr().cast(), data.len(), o),
                None => real::write(fd, data.as_ptr().cast(), data.len()),
            }
        };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            if total == data.len() {
                return Err(Errno(errno()));
            }
            break;
        }
        data = &data[n as usize..];
        off = off.map(|o| o + n as i64);
    }
    Ok(total - data.len())
}

/// Copy up to `len` bytes between two descriptors, one of them ours, by
/// reading and writing (the kernel cannot help with our side). Offsets
/// given by pointer are used and advanced instead of the descriptors' own.
///
/// # Safety
/// `off_in`/`off_out` are NULL or valid.
pub unsafe fn copy_between(
    in_fd: i32,
    off_in: *mut i64,
    out_fd: i32,
    off_out: *mut i64,
    len: usize,
) -> R<isize> {
    const STEP: usize = 8 << 20;
    let want = len.min(STEP);
    if want == 0 {
        return Ok(0);
    }
    let mut buf = vec![0u8; want];
    // SAFETY: the caller's contract.
    let oi = unsafe { off_in.as_ref().copied() };
    // SAFETY: the caller's contract.
    let oo = unsafe { off_out.as_ref().copied() };
    let n = read_any(in_fd, &mut buf, oi)?;
    if n == 0 {
        return Ok(0);
    }
    let w = write_all_any(out_fd, &buf[..n], oo)?;
    if !off_in.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *off_in += w as i64 };
    } else if w < n {
        // Give back what was read but not written.
        if let Some(d) = fdtable::get(in_fd) {
            let _ = lseek(in_fd, &d, -((n - w) as i64), libc::SEEK_CUR);
        } else {
            // SAFETY: plain lseek.
            unsafe { real::lseek64(in_fd, -((n - w) as i64), libc::SEEK_CUR) };
        }
    }
    if !off_out.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *off_out += w as i64 };
    }
    Ok(w as isize)
}

/// mmap of a MadFS file: a private copy (MAP_PRIVATE, or MAP_SHARED
/// read-only: later changes by others are not seen); shared writable
/// mappings are refused.
pub fn mmap(
    desc: &Desc,
    addr: *mut libc::c_void,
    len: usize,
    prot: i32,
    flags: i32,
    off: i64,
) -> R<*mut libc::c_void> {
    not_in_vfork_child()?;
    if desc.kind != Kind::File || !desc.readable() {
        return Err(Errno(libc::EACCES));
    }
    if flags & libc::MAP_SHARED != 0 && prot & libc::PROT_WRITE != 0 {
        return Err(unsupported(
            "mmap",
            "shared writable mappings of MadFS files",
        ));
    }
    if len == 0 || off < 0 || off % 4096 != 0 {
        return Err(Errno(libc::EINVAL));
    }
    let keep =
        libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE | libc::MAP_POPULATE;
    let aflags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (flags & keep);
    // SAFETY: an anonymous mapping, as the caller asked for its address.
    let p = unsafe { real::mmap64(addr, len, libc::PROT_READ | libc::PROT_WRITE, aflags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(Errno(errno()));
    }
    // SAFETY: the mapping is `len` bytes, readable and writable.
    let dst = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let mut done = 0usize;
    while done < len {
        let step = (done + (8 << 20)).min(len);
        match read_at(desc, &mut dst[done..step], off as u64 + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) => {
                // SAFETY: our mapping, unused.
                unsafe { libc::munmap(p, len) };
                return Err(e);
            }
        }
    }
    // SAFETY: our mapping.
    unsafe { libc::mprotect(p, len, prot) };
    Ok(p)
}
