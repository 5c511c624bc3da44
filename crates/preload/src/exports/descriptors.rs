//! Calls on descriptors beyond reading and writing: truncate, sync, dup,
//! fcntl, file locks, advice, allocation, copies between descriptors,
//! mmap.

use super::{on_path, AT_FDCWD};
use crate::config;
use crate::fdtable;
use crate::guard;
use crate::internal;
use crate::meta;
use crate::ops;
use crate::real;
use crate::shim::{self, unsupported, Errno, R};
use libc::{c_char, c_int, c_long, c_uint, c_void, off64_t, size_t, ssize_t};

// ---- truncate, sync

/// truncate(2).
///
/// # Safety
/// `path` is NULL or a C string.
unsafe fn truncate_impl(path: *const c_char, len: off64_t) -> c_int {
    // SAFETY: pure forward.
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::truncate64(p, len),
            |m| meta::truncate(m, len).map(|_| 0),
        )
    }
}

/// ftruncate(2).
///
/// # Safety
/// None beyond ftruncate's: integers only.
unsafe fn ftruncate_impl(fd: c_int, len: off64_t) -> c_int {
    on_fd!(fd, -1, real::ftruncate64(fd, len), |d| ops::ftruncate(
        fd, &d, len
    )
    .map(|_| 0))
}

aliases! {
    truncate, truncate64: (path: *const c_char, len: off64_t) -> c_int
        => truncate_impl(path, len);
    ftruncate, ftruncate64: (fd: c_int, len: off64_t) -> c_int => ftruncate_impl(fd, len);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    on_fd!(fd, -1, real::fsync(fd), |d| ops::fsync(fd, &d).map(|_| 0))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    on_fd!(fd, -1, real::fdatasync(fd), |d| ops::fsync(fd, &d)
        .map(|_| 0))
}

/// syncfs(2) on a MadFS descriptor syncs every server.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    on_fd!(fd, -1, real::syncfs(fd), |_d| ops::sync_all().map(|_| 0))
}

/// sync(2): the kernel's file systems, then MadFS's servers, if this
/// program runs under `madfs run` with a cluster it can reach (`sync` run
/// after another process wrote expects their data durable). It has no
/// result to fail with: a failure is reported on stderr.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sync() {
    // SAFETY: pure forward.
    unsafe { real::sync() };
    if crate::guard::busy() || crate::config::foreign_child() {
        return;
    }
    crate::shim::run_void(|| {
        if let Err(e) = ops::sync_all() {
            crate::shim::warn_once(
                "sync",
                format_args!("sync: the MadFS servers were not synced (errno {})", e.0),
            );
        }
    });
}

// ---- dup, fcntl, locks

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return internal::adopt(unsafe { real::dup(fd) });
    }
    on_fd!(fd, -1, real::dup(fd), |d| {
        // SAFETY: pure forward.
        let r = unsafe { real::dup(fd) };
        if r >= 0 && !config::foreign_child() {
            ops::dup_installed(&d, r);
        }
        Ok(r)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if !guard::busy() && internal::is_internal(new) && old != new {
        shim::set_errno(libc::EBUSY);
        return -1;
    }
    if guard::busy() || (!fdtable::maybe_ours(old) && !fdtable::maybe_ours(new)) {
        // SAFETY: pure forward.
        return unsafe { real::dup2(old, new) };
    }
    shim::run(-1, || ops::dup3(old, new, 0, true))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if !guard::busy() && internal::is_internal(new) && old != new {
        shim::set_errno(libc::EBUSY);
        return -1;
    }
    if guard::busy() || (!fdtable::maybe_ours(old) && !fdtable::maybe_ours(new)) {
        // SAFETY: pure forward.
        return unsafe { real::dup3(old, new, flags) };
    }
    shim::run(-1, || ops::dup3(old, new, flags, false))
}

/// fcntl(2) (the optional argument as a plain one: see lib.rs).
///
/// # Safety
/// fcntl's contract for `cmd`: `arg` is what that command takes.
unsafe fn fcntl_impl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    if guard::busy() && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        // Our own code cloning a descriptor (tokio clones its epoll
        // instance and sockets): the copy is ours too.
        // SAFETY: pure forward.
        return internal::adopt(unsafe { real::fcntl(fd, cmd, arg) });
    }
    on_fd!(fd, -1, real::fcntl(fd, cmd, arg), |d| ops::fcntl(
        fd, &d, cmd, arg
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    on_fd!(fd, -1, real::flock(fd, op), |_d| Err(unsupported(
        "flock",
        "file locks"
    )))
}

/// lockf(3).
///
/// # Safety
/// None beyond lockf's: integers only.
unsafe fn lockf_impl(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    on_fd!(fd, -1, real::lockf64(fd, cmd, len), |_d| Err(unsupported(
        "lockf",
        "file locks"
    )))
}

aliases! {
    fcntl, fcntl64: (fd: c_int, cmd: c_int, arg: c_long) -> c_int => fcntl_impl(fd, cmd, arg);
    lockf, lockf64: (fd: c_int, cmd: c_int, len: off64_t) -> c_int => lockf_impl(fd, cmd, len);
}

// ---- advice, allocation

/// posix_fadvise(2): advice only, nothing to do on ours.
///
/// # Safety
/// None beyond posix_fadvise's: integers only.
unsafe fn posix_fadvise_impl(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    if guard::busy() || !fdtable::maybe_ours(fd) {
        // SAFETY: pure forward.
        return unsafe { real::posix_fadvise64(fd, off, len, advice) };
    }
    // Advice only: nothing to do. (Returns an error number, not -1.)
    match fdtable::get(fd) {
        Some(_) => 0,
        // SAFETY: pure forward.
        None => unsafe { real::posix_fadvise64(fd, off, len, advice) },
    }
}

/// Make the file at least `off + len` long (allocation is implicit in MadFS).
fn extend(fd: c_int, d: &fdtable::Desc, off: i64, len: i64) -> R<()> {
    if off < 0 || len <= 0 {
        return Err(Errno(libc::EINVAL));
    }
    let end = off.checked_add(len).ok_or(Errno(libc::EFBIG))?;
    if (ops::current_size(d)? as i64) < end {
        ops::ftruncate(fd, d, end)?;
    }
    Ok(())
}

/// posix_fallocate(3): extends ours. (Returns an error number, not -1.)
///
/// # Safety
/// None beyond posix_fallocate's: integers only.
unsafe fn posix_fallocate_impl(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    if guard::busy() || !fdtable::maybe_ours(fd) {
        // SAFETY: pure forward.
        return unsafe { real::posix_fallocate64(fd, off, len) };
    }
    let r = shim::run(-1, || match fdtable::get(fd) {
        // SAFETY: pure forward.
        None => Ok(unsafe { real::posix_fallocate64(fd, off, len) }),
        Some(d) => extend(fd, &d, off, len).map(|_| 0),
    });
    if r == -1 {
        shim::errno()
    } else {
        r
    }
}

/// fallocate(2): mode 0 extends ours, KEEP_SIZE does nothing.
///
/// # Safety
/// None beyond fallocate's: integers only.
unsafe fn fallocate_impl(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    on_fd!(
        fd,
        -1,
        real::fallocate64(fd, mode, off, len),
        |d| match mode {
            0 => extend(fd, &d, off, len).map(|_| 0),
            libc::FALLOC_FL_KEEP_SIZE => Ok(0),
            _ => Err(unsupported("fallocate", "punching holes and other modes")),
        }
    )
}

aliases! {
    posix_fadvise, posix_fadvise64: (fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int
        => posix_fadvise_impl(fd, off, len, advice);
    posix_fallocate, posix_fallocate64: (fd: c_int, off: off64_t, len: off64_t) -> c_int
        => posix_fallocate_impl(fd, off, len);
    fallocate, fallocate64: (fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int
        => fallocate_impl(fd, mode, off, len);
}

// ---- copies between descriptors

/// sendfile(2).
///
/// # Safety
/// sendfile's contract: `off` is NULL or points to a writable offset.
unsafe fn sendfile_impl(out_fd: c_int, in_fd: c_int, off: *mut off64_t, count: size_t) -> ssize_t {
    if guard::busy() || (!fdtable::maybe_ours(in_fd) && !fdtable::maybe_ours(out_fd)) {
        // SAFETY: pure forward.
        return unsafe { real::sendfile64(out_fd, in_fd, off, count) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            // SAFETY: pure forward.
            return Ok(unsafe { real::sendfile64(out_fd, in_fd, off, count) });
        }
        // SAFETY: pure forward (copy_between asks for valid or NULL
        // offsets; the output offset is the descriptor's own).
        unsafe { ops::copy_between(in_fd, off, out_fd, std::ptr::null_mut(), count) }
    })
}

aliases! {
    sendfile, sendfile64: (out_fd: c_int, in_fd: c_int, off: *mut off64_t, count: size_t) -> ssize_t
        => sendfile_impl(out_fd, in_fd, off, count);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    in_fd: c_int,
    off_in: *mut off64_t,
    out_fd: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if guard::busy() || (!fdtable::maybe_ours(in_fd) && !fdtable::maybe_ours(out_fd)) {
        // SAFETY: pure forward.
        return unsafe { real::copy_file_range(in_fd, off_in, out_fd, off_out, len, flags) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            // SAFETY: pure forward.
            return Ok(unsafe {
                real::copy_file_range(in_fd, off_in, out_fd, off_out, len, flags)
            });
        }
        if flags != 0 {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: pure forward (the offsets are NULL or writable, by
        // copy_file_range's contract).
        unsafe { ops::copy_between(in_fd, off_in, out_fd, off_out, len) }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn splice(
    in_fd: c_int,
    off_in: *mut off64_t,
    out_fd: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if guard::busy() || (!fdtable::maybe_ours(in_fd) && !fdtable::maybe_ours(out_fd)) {
        // SAFETY: pure forward.
        return unsafe { real::splice(in_fd, off_in, out_fd, off_out, len, flags) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            // SAFETY: pure forward.
            return Ok(unsafe { real::splice(in_fd, off_in, out_fd, off_out, len, flags) });
        }
        // SAFETY: pure forward (the offsets are NULL or writable, by
        // splice's contract).
        unsafe { ops::copy_between(in_fd, off_in, out_fd, off_out, len) }
    })
}

// ---- mmap

/// mmap(2): a private copy of ours.
///
/// # Safety
/// mmap's contract (`addr` a hint or a range the caller may replace).
unsafe fn mmap_impl(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    if guard::busy() || flags & libc::MAP_ANONYMOUS != 0 || !fdtable::maybe_ours(fd) {
        // SAFETY: pure forward.
        return unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    }
    shim::run(libc::MAP_FAILED, || match fdtable::get(fd) {
        // SAFETY: pure forward.
        None => Ok(unsafe { real::mmap64(addr, len, prot, flags, fd, off) }),
        Some(d) => ops::mmap(&d, addr, len, prot, flags, off),
    })
}

aliases! {
    mmap, mmap64: (
        addr: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: off64_t,
    ) -> *mut c_void
        => mmap_impl(addr, len, prot, flags, fd, off);
}
