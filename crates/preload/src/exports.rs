//! The interposed C functions. Each one goes straight to the real function
//! when the calling thread is already inside our code (reentrancy), when the
//! descriptor is not ours, or when the path is not under the prefix;
//! otherwise it runs the MadFS implementation inside `shim::run` (panics
//! caught, errors as errno).

#![allow(clippy::missing_safety_doc)]

use crate::dirs;
use crate::fdtable::{self, Kind};
use crate::guard;
use crate::meta;
use crate::ops;
use crate::paths::{self, classify, cstr, KPath, Target};
use crate::process;
use crate::real;
use crate::shim::{self, unsupported, Errno, R};
use crate::stdio;
use libc::{
    c_char, c_int, c_long, c_uint, c_void, dirent64, gid_t, mode_t, off64_t, size_t, ssize_t,
    uid_t, DIR, FILE,
};
use std::ffi::CString;

const AT_FDCWD: c_int = libc::AT_FDCWD;

/// A call on one path: the kernel function (given the path to use) or the
/// MadFS one.
unsafe fn on_path<T>(
    fail: T,
    dirfd: c_int,
    path: *const c_char,
    kernel: impl FnOnce(*const c_char) -> T,
    madfs: impl FnOnce(&[u8]) -> R<T>,
) -> T {
    if guard::busy() {
        return kernel(path);
    }
    shim::run(fail, || {
        // SAFETY: the caller's path.
        match unsafe { classify(dirfd, path)? } {
            Target::Kernel(k) => Ok(kernel(k.ptr())),
            Target::Madfs(p) => shim::ours(|| madfs(&p)),
        }
    })
}

/// A call on two paths: both in MadFS, both in the kernel, or EXDEV.
#[allow(clippy::too_many_arguments)]
unsafe fn on_two_paths<T>(
    fail: T,
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    kernel: impl FnOnce(*const c_char, *const c_char) -> T,
    madfs: impl FnOnce(&[u8], &[u8]) -> R<T>,
) -> T {
    if guard::busy() {
        return kernel(p1, p2);
    }
    shim::run(fail, || {
        // SAFETY: the caller's paths.
        let (a, b) = unsafe { (classify(d1, p1)?, classify(d2, p2)?) };
        match (a, b) {
            (Target::Kernel(a), Target::Kernel(b)) => Ok(kernel(a.ptr(), b.ptr())),
            (Target::Madfs(a), Target::Madfs(b)) => shim::ours(|| madfs(&a, &b)),
            _ => Err(Errno(libc::EXDEV)),
        }
    })
}

macro_rules! on_fd {
    ($fd:expr, $fail:expr, $real:expr, |$d:ident| $body:expr) => {{
        let fd: c_int = $fd;
        if guard::busy() || !fdtable::maybe_ours(fd) {
            #[allow(unused_unsafe)]
            return unsafe { $real };
        }
        shim::run($fail, || match fdtable::get(fd) {
            #[allow(unused_unsafe)]
            None => Ok(unsafe { $real }),
            Some($d) => shim::ours(|| $body),
        })
    }};
}

// ---------------------------------------------------------------- open/close

unsafe fn open_common(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::openat(dirfd, p, flags, mode),
            |m| ops::open(m, flags, mode),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    unsafe { open_common(AT_FDCWD, path, flags, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    unsafe { open_common(AT_FDCWD, path, flags, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_common(AT_FDCWD, path, flags, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_common(AT_FDCWD, path, flags, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    unsafe { open_common(dirfd, path, flags, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    unsafe { open_common(dirfd, path, flags, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_common(dirfd, path, flags, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { open_common(dirfd, path, flags, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    unsafe {
        open_common(
            AT_FDCWD,
            path,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            mode,
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { creat(path, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if crate::internal::is_internal(fd) {
        if guard::busy() {
            crate::internal::forget(fd);
            return unsafe { real::close(fd) };
        }
        // The program closing a descriptor of ours (a close-everything
        // loop): it is not the program's, keep it.
        return 0;
    }
    on_fd!(fd, -1, real::close(fd), |d| ops::close(fd, d))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if guard::busy() || flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        return unsafe { real::close_range(first, last, flags) };
    }
    shim::run(-1, || {
        if !crate::config::foreign_child() {
            for (fd, d) in fdtable::all() {
                if fd as u32 >= first && fd as u32 <= last {
                    ops::close(fd, d)?;
                }
            }
        }
        let mut r = 0;
        for (a, b) in crate::internal::ranges_without_internal(first, last) {
            r = unsafe { real::close_range(a, b, flags) };
            if r < 0 {
                break;
            }
        }
        Ok(r)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if !guard::busy() {
        shim::run_void(|| {
            if !crate::config::foreign_child() {
                for (fd, d) in fdtable::all() {
                    if fd >= low {
                        let _ = ops::close(fd, d);
                    }
                }
            }
        });
    }
    if guard::busy() || low < 0 {
        return unsafe { real::closefrom(low) };
    }
    for (a, b) in crate::internal::ranges_without_internal(low as u32, u32::MAX) {
        unsafe { real::close_range(a, b, 0) };
    }
}

// ---------------------------------------------------------------- read/write

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::read(fd, buf, n), |d| {
        Ok(ops::read(fd, &d, unsafe { ops::slice_mut(buf, n)? })? as ssize_t)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        unsafe { libc::abort() };
    }
    unsafe { read(fd, buf, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::write(fd, buf, n), |d| {
        Ok(ops::write(fd, &d, unsafe { ops::slice(buf, n)? })? as ssize_t)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::pread64(fd, buf, n, off), |d| {
        Ok(ops::pread(fd, &d, unsafe { ops::slice_mut(buf, n)? }, off)? as ssize_t)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pread(fd, buf, n, off) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        unsafe { libc::abort() };
    }
    unsafe { pread(fd, buf, n, off) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    buflen: size_t,
) -> ssize_t {
    unsafe { __pread_chk(fd, buf, n, off, buflen) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::pwrite64(fd, buf, n, off), |d| {
        Ok(ops::pwrite(fd, &d, unsafe { ops::slice(buf, n)? }, off)? as ssize_t)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    unsafe { pwrite(fd, buf, n, off) }
}

/// readv/preadv on ours: read into one buffer, then scatter.
unsafe fn readv_ours(
    fd: c_int,
    d: &fdtable::Desc,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> R<ssize_t> {
    let v = unsafe { ops::iovecs(iov, cnt)? };
    let mut buf = vec![0u8; ops::iov_total(v)];
    let n = match off {
        Some(o) => ops::pread(fd, d, &mut buf, o)?,
        None => ops::read(fd, d, &mut buf)?,
    };
    unsafe { ops::scatter(v, &buf[..n])? };
    Ok(n as ssize_t)
}

unsafe fn writev_ours(
    fd: c_int,
    d: &fdtable::Desc,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> R<ssize_t> {
    let v = unsafe { ops::iovecs(iov, cnt)? };
    let buf = unsafe { ops::gather(v)? };
    let n = match off {
        Some(o) => ops::pwrite(fd, d, &buf, o)?,
        None => ops::write(fd, d, &buf)?,
    };
    Ok(n as ssize_t)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    on_fd!(fd, -1, real::readv(fd, iov, cnt), |d| unsafe {
        readv_ours(fd, &d, iov, cnt, None)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    on_fd!(fd, -1, real::writev(fd, iov, cnt), |d| unsafe {
        writev_ours(fd, &d, iov, cnt, None)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    on_fd!(fd, -1, real::preadv64(fd, iov, cnt, off), |d| unsafe {
        readv_ours(fd, &d, iov, cnt, Some(off))
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { preadv(fd, iov, cnt, off) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    on_fd!(fd, -1, real::pwritev64(fd, iov, cnt, off), |d| unsafe {
        writev_ours(fd, &d, iov, cnt, Some(off))
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { pwritev(fd, iov, cnt, off) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    on_fd!(
        fd,
        -1,
        real::preadv64v2(fd, iov, cnt, off, flags),
        |d| unsafe { readv_ours(fd, &d, iov, cnt, (off != -1).then_some(off)) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { preadv2(fd, iov, cnt, off, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    on_fd!(
        fd,
        -1,
        real::pwritev64v2(fd, iov, cnt, off, flags),
        |d| unsafe { writev_ours(fd, &d, iov, cnt, (off != -1).then_some(off)) }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { pwritev2(fd, iov, cnt, off, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    on_fd!(fd, -1, real::lseek64(fd, off, whence), |d| ops::lseek(
        fd, &d, off, whence
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    unsafe { lseek(fd, off, whence) }
}

// ---------------------------------------------------------------- stat

unsafe fn fill_stat(buf: *mut libc::stat64, a: &madfs_client::Attr) -> R<c_int> {
    let st = unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?;
    meta::fill_stat(st, a);
    Ok(0)
}

unsafe fn stat_common(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return unsafe { fstat(dirfd, buf) };
    }
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::fstatat64(dirfd, p, buf, flags),
            |m| {
                let a = meta::stat(m, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
                fill_stat(buf, &a)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_common(AT_FDCWD, path, buf, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_common(AT_FDCWD, path, buf, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { stat_common(AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int {
    unsafe { lstat(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_common(dirfd, path, buf, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_common(dirfd, path, buf, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn newfstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_common(dirfd, path, buf, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat64) -> c_int {
    on_fd!(fd, -1, real::fstat64(fd, buf), |d| {
        let a = ops::fstat(fd, &d)?;
        unsafe { fill_stat(buf, &a) }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat(fd, buf) }
}

// The pre-2.33 glibc entry points (binaries built against older glibc).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __xstat(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    unsafe { stat(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __xstat64(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    unsafe { stat(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __lxstat(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    unsafe { lstat(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __lxstat64(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
) -> c_int {
    unsafe { lstat(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat(fd, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
    unsafe { fstat(fd, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_common(dirfd, path, buf, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_common(dirfd, path, buf, flags) }
}

unsafe fn fill_statx(buf: *mut libc::statx, a: &madfs_client::Attr) -> R<c_int> {
    let stx = unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?;
    meta::fill_statx(stx, a);
    Ok(0)
}

unsafe fn statx_fd(
    fd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    on_fd!(fd, -1, real::statx(fd, path, flags, mask, buf), |d| {
        let a = ops::fstat(fd, &d)?;
        unsafe { fill_statx(buf, &a) }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return unsafe { statx_fd(dirfd, path, flags, mask, buf) };
    }
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::statx(dirfd, p, flags, mask, buf),
            |m| {
                let a = meta::stat(m, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
                fill_statx(buf, &a)
            },
        )
    }
}

// ---------------------------------------------------------------- statfs

unsafe fn statfs_common(path: *const c_char, buf: *mut libc::statfs64) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::statfs64(p, buf),
            |m| {
                meta::stat(m, true)?;
                let s = meta::statfs()?;
                meta::fill_statfs(buf.as_mut().ok_or(Errno(libc::EFAULT))?, &s);
                Ok(0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statfs(path: *const c_char, buf: *mut libc::statfs64) -> c_int {
    unsafe { statfs_common(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statfs64(path: *const c_char, buf: *mut libc::statfs64) -> c_int {
    unsafe { statfs_common(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatfs(fd: c_int, buf: *mut libc::statfs64) -> c_int {
    on_fd!(fd, -1, real::fstatfs64(fd, buf), |_d| {
        let s = meta::statfs()?;
        meta::fill_statfs(unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?, &s);
        Ok(0)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int {
    unsafe { fstatfs(fd, buf) }
}

unsafe fn statvfs_common(path: *const c_char, buf: *mut libc::statvfs64) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::statvfs64(p, buf),
            |m| {
                meta::stat(m, true)?;
                let s = meta::statfs()?;
                meta::fill_statvfs(buf.as_mut().ok_or(Errno(libc::EFAULT))?, &s);
                Ok(0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statvfs(path: *const c_char, buf: *mut libc::statvfs64) -> c_int {
    unsafe { statvfs_common(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statvfs64(path: *const c_char, buf: *mut libc::statvfs64) -> c_int {
    unsafe { statvfs_common(path, buf) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatvfs(fd: c_int, buf: *mut libc::statvfs64) -> c_int {
    on_fd!(fd, -1, real::fstatvfs64(fd, buf), |_d| {
        let s = meta::statfs()?;
        meta::fill_statvfs(unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?, &s);
        Ok(0)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int {
    unsafe { fstatvfs(fd, buf) }
}

// ---------------------------------------------------------------- access

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::faccessat(dirfd, p, mode, flags),
            |m| meta::access(m, mode, flags).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    unsafe { faccessat(AT_FDCWD, path, mode, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe { faccessat(AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe { faccessat(AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

// ---------------------------------------------------------------- truncate/sync

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off64_t) -> c_int {
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

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off64_t) -> c_int {
    unsafe { truncate(path, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    on_fd!(fd, -1, real::ftruncate64(fd, len), |d| ops::ftruncate(
        fd, &d, len
    )
    .map(|_| 0))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    unsafe { ftruncate(fd, len) }
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

// ---------------------------------------------------------------- namespace

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::unlinkat(dirfd, p, flags),
            |m| {
                if flags & libc::AT_REMOVEDIR != 0 {
                    meta::rmdir(m)?;
                } else {
                    meta::unlink(m)?;
                }
                Ok(0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    unsafe { unlinkat(AT_FDCWD, path, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    unsafe { unlinkat(AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

/// stdio's remove(3): unlink, or rmdir for a directory.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| {
                let r = real::unlinkat(AT_FDCWD, p, 0);
                if r < 0 && shim::errno() == libc::EISDIR {
                    real::unlinkat(AT_FDCWD, p, libc::AT_REMOVEDIR)
                } else {
                    r
                }
            },
            |m| match meta::unlink(m) {
                Err(Errno(libc::EISDIR)) | Err(Errno(libc::EPERM)) => meta::rmdir(m).map(|_| 0),
                other => other.map(|_| 0),
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::mkdirat(dirfd, p, mode),
            |m| meta::mkdir(m, mode).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mkdirat(AT_FDCWD, path, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    unsafe {
        on_two_paths(
            -1,
            olddir,
            old,
            newdir,
            new,
            |a, b| {
                if flags == 0 {
                    real::renameat(olddir, a, newdir, b)
                } else {
                    real::renameat2(olddir, a, newdir, b, flags)
                }
            },
            |a, b| meta::rename(a, b, flags).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn renameat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> c_int {
    unsafe { renameat2(olddir, old, newdir, new, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    unsafe { renameat2(AT_FDCWD, old, AT_FDCWD, new, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn linkat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    unsafe {
        on_two_paths(
            -1,
            olddir,
            old,
            newdir,
            new,
            |a, b| real::linkat(olddir, a, newdir, b, flags),
            |a, b| meta::link(a, b, flags & libc::AT_SYMLINK_FOLLOW != 0).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    unsafe { linkat(AT_FDCWD, old, AT_FDCWD, new, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    newdir: c_int,
    linkpath: *const c_char,
) -> c_int {
    unsafe {
        on_path(
            -1,
            newdir,
            linkpath,
            |p| real::symlinkat(target, newdir, p),
            |m| meta::symlink(cstr(target)?, m).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn symlink(target: *const c_char, linkpath: *const c_char) -> c_int {
    unsafe { symlinkat(target, AT_FDCWD, linkpath) }
}

/// For "/proc/self/fd/N" and "/dev/fd/N" naming one of our descriptors:
/// the MadFS path it was opened by, as the program sees it (the kernel
/// would name the memfd).
fn fd_link_target(path: &[u8]) -> Option<Vec<u8>> {
    let n = path
        .strip_prefix(b"/proc/self/fd/")
        .or_else(|| path.strip_prefix(b"/dev/fd/"))?;
    let fd: i32 = std::str::from_utf8(n).ok()?.parse().ok()?;
    let d = fdtable::get(fd)?;
    d.path.as_deref().map(paths::outside_form)
}

/// Copy a link target into a readlink buffer (truncating, no NUL).
unsafe fn put_link(t: &[u8], buf: *mut c_char, size: size_t) -> R<ssize_t> {
    if size == 0 {
        return Err(Errno(libc::EINVAL));
    }
    let n = t.len().min(size);
    unsafe { ops::slice_mut(buf.cast(), n)? }.copy_from_slice(&t[..n]);
    Ok(n as ssize_t)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| {
                let ours = fdtable::maybe_ours_any()
                    .then(|| fd_link_target(cstr(p).unwrap_or_default()))
                    .flatten();
                match ours {
                    Some(t) => put_link(&t, buf, size).unwrap_or_else(|Errno(e)| {
                        shim::set_errno(e);
                        -1
                    }),
                    None => real::readlinkat(dirfd, p, buf, size),
                }
            },
            |m| put_link(&meta::readlink(m)?, buf, size),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    unsafe { readlinkat(AT_FDCWD, path, buf, size) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __readlink_chk(
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> ssize_t {
    if size > buflen {
        unsafe { libc::abort() };
    }
    unsafe { readlinkat(AT_FDCWD, path, buf, size) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __readlinkat_chk(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> ssize_t {
    if size > buflen {
        unsafe { libc::abort() };
    }
    unsafe { readlinkat(dirfd, path, buf, size) }
}

unsafe fn mknod_common(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::mknodat(dirfd, p, mode, dev),
            |m| match madfs_client::FileKind::from_mode(mode) {
                Some(madfs_client::FileKind::File) => {
                    let fd = ops::open(m, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
                    if let Some(d) = fdtable::get(fd) {
                        ops::close(fd, d)?;
                    }
                    Ok(0)
                }
                Some(kind) if kind.is_special() => meta::mknod(m, kind, mode, dev).map(|()| 0),
                _ => Err(Errno(libc::EINVAL)),
            },
        )
    }
}

// glibc before 2.33 (binaries built against it) calls these for mknod.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __xmknod(
    _ver: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    unsafe { __xmknodat(_ver, AT_FDCWD, path, mode, dev) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __xmknodat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    // SAFETY: the caller's pointer, checked for null.
    match unsafe { dev.as_ref() } {
        Some(&dev) => unsafe { mknod_common(dirfd, path, mode, dev) },
        None => {
            shim::set_errno(libc::EFAULT);
            -1
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    unsafe { mknod_common(dirfd, path, mode, dev) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    unsafe { mknod_common(AT_FDCWD, path, mode, dev) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mknod_common(dirfd, path, (mode & 0o7777) | libc::S_IFIFO, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mknod_common(AT_FDCWD, path, (mode & 0o7777) | libc::S_IFIFO, 0) }
}

// ---------------------------------------------------------------- permissions, owners, times

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::fchmodat(dirfd, p, mode, flags),
            |m| {
                let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
                meta::setattr(m, meta::chmod_changes(mode), follow).map(|_| 0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { fchmodat(AT_FDCWD, path, mode, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lchmod(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { fchmodat(AT_FDCWD, path, mode, libc::AT_SYMLINK_NOFOLLOW) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    on_fd!(fd, -1, real::fchmod(fd, mode), |d| ops::setattr(
        &d,
        meta::chmod_changes(mode)
    )
    .map(|_| 0))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: uid_t,
    gid: gid_t,
    flags: c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return unsafe { fchown(dirfd, uid, gid) };
    }
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::fchownat(dirfd, p, uid, gid, flags),
            |m| {
                let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
                meta::setattr(m, meta::chown_changes(uid, gid), follow).map(|_| 0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
    unsafe { fchownat(AT_FDCWD, path, uid, gid, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
    unsafe { fchownat(AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int {
    on_fd!(fd, -1, real::fchown(fd, uid, gid), |d| ops::setattr(
        &d,
        meta::chown_changes(uid, gid)
    )
    .map(|_| 0))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() || (flags & libc::AT_EMPTY_PATH != 0 && unsafe { *path } == 0) {
        // Linux: a NULL path changes `dirfd` itself.
        return unsafe { futimens(dirfd, times) };
    }
    unsafe {
        on_path(
            -1,
            dirfd,
            path,
            |p| real::utimensat(dirfd, p, times, flags),
            |m| {
                let changes = ops::time_changes(times)?;
                meta::setattr(m, changes, flags & libc::AT_SYMLINK_NOFOLLOW == 0).map(|_| 0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    on_fd!(fd, -1, real::futimens(fd, times), |d| {
        let changes = unsafe { ops::time_changes(times)? };
        ops::setattr(&d, changes).map(|_| 0)
    })
}

/// timevals (utimes, futimes, lutimes) as timespecs.
unsafe fn tv_to_ts(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    Some([
        libc::timespec {
            tv_sec: t[0].tv_sec,
            tv_nsec: t[0].tv_usec * 1000,
        },
        libc::timespec {
            tv_sec: t[1].tv_sec,
            tv_nsec: t[1].tv_usec * 1000,
        },
    ])
}

unsafe fn ts_ptr(ts: &Option<[libc::timespec; 2]>) -> *const libc::timespec {
    match ts {
        Some(a) => a.as_ptr(),
        None => std::ptr::null(),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    let ts = unsafe { tv_to_ts(tv) };
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    let ts = unsafe { tv_to_ts(tv) };
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), libc::AT_SYMLINK_NOFOLLOW) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    let ts = unsafe { tv_to_ts(tv) };
    unsafe { futimens(fd, ts_ptr(&ts)) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn futimesat(
    dirfd: c_int,
    path: *const c_char,
    tv: *const libc::timeval,
) -> c_int {
    let ts = unsafe { tv_to_ts(tv) };
    unsafe { utimensat(dirfd, path, ts_ptr(&ts), 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    let ts = unsafe { times.as_ref() }.map(|t| {
        [
            libc::timespec {
                tv_sec: t.actime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: t.modtime,
                tv_nsec: 0,
            },
        ]
    });
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), 0) }
}

// ---------------------------------------------------------------- directories

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            path,
            |p| real::opendir(p),
            |m| {
                let fd = ops::open(m, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
                dirs::open_stream(fd).inspect_err(|_| {
                    if let Some(d) = fdtable::get(fd) {
                        let _ = ops::close(fd, d);
                    }
                })
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    on_fd!(fd, std::ptr::null_mut(), real::fdopendir(fd), |d| {
        if d.kind != Kind::Dir {
            return Err(Errno(libc::ENOTDIR));
        }
        dirs::open_stream(fd)
    })
}

macro_rules! on_dir {
    ($dir:expr, $fail:expr, $real:expr, $ours:expr) => {{
        let dir: *mut DIR = $dir;
        if guard::busy() || !dirs::is_ours(dir) {
            #[allow(unused_unsafe)]
            return unsafe { $real };
        }
        shim::run($fail, || shim::ours(|| $ours))
    }};
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readdir(dir: *mut DIR) -> *mut dirent64 {
    on_dir!(
        dir,
        std::ptr::null_mut(),
        real::readdir64(dir),
        dirs::readdir(dir)
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readdir64(dir: *mut DIR) -> *mut dirent64 {
    unsafe { readdir(dir) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readdir_r(
    dir: *mut DIR,
    entry: *mut dirent64,
    result: *mut *mut dirent64,
) -> c_int {
    on_dir!(
        dir,
        libc::EIO,
        real::readdir64_r(dir, entry, result),
        Ok(unsafe { dirs::readdir_r(dir, entry, result) })
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut DIR,
    entry: *mut dirent64,
    result: *mut *mut dirent64,
) -> c_int {
    unsafe { readdir_r(dir, entry, result) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closedir(dir: *mut DIR) -> c_int {
    on_dir!(dir, -1, real::closedir(dir), dirs::closedir(dir))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dirfd(dir: *mut DIR) -> c_int {
    on_dir!(dir, -1, real::dirfd(dir), Ok(dirs::dirfd(dir)))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn telldir(dir: *mut DIR) -> c_long {
    on_dir!(dir, -1, real::telldir(dir), Ok(dirs::telldir(dir)))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn seekdir(dir: *mut DIR, pos: c_long) {
    on_dir!(dir, (), real::seekdir(dir, pos), {
        dirs::seekdir(dir, pos);
        Ok(())
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rewinddir(dir: *mut DIR) {
    on_dir!(dir, (), real::rewinddir(dir), {
        dirs::rewinddir(dir);
        Ok(())
    })
}

type ScanFilter = Option<unsafe extern "C" fn(*const dirent64) -> c_int>;
type ScanCompar = Option<unsafe extern "C" fn(*mut *const dirent64, *mut *const dirent64) -> c_int>;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn scandir(
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::scandir64(p, list, filter, compar),
            |m| dirs::scandir(m, list, filter, compar),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn scandir64(
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    unsafe { scandir(path, list, filter, compar) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::getdents64(fd, buf, n), |_d| {
        Ok(dirs::getdents64(fd, unsafe { ops::slice_mut(buf, n)? })? as ssize_t)
    })
}

// ---------------------------------------------------------------- working directory

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| {
                let r = real::chdir(p);
                if r == 0 {
                    paths::invalidate_kernel_cwd();
                    if paths::vcwd().is_some() {
                        paths::set_vcwd(None);
                    }
                }
                r
            },
            |m| {
                let a = meta::stat(m, true)?;
                if a.kind != madfs_client::FileKind::Dir {
                    return Err(Errno(libc::ENOTDIR));
                }
                meta::access(m, libc::X_OK, 0)?;
                paths::set_vcwd(Some(ops::clean(m)));
                Ok(0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if guard::busy() {
        return unsafe { real::fchdir(fd) };
    }
    shim::run(-1, || match fdtable::get(fd) {
        Some(d) => {
            if d.kind != Kind::Dir {
                return Err(Errno(libc::ENOTDIR));
            }
            let p = d.path.clone().ok_or_else(|| {
                unsupported("fchdir", "a directory fd inherited without its path")
            })?;
            paths::set_vcwd(Some(p));
            Ok(0)
        }
        None => {
            let r = unsafe { real::fchdir(fd) };
            if r == 0 {
                paths::invalidate_kernel_cwd();
                if paths::vcwd().is_some() {
                    paths::set_vcwd(None);
                }
            }
            Ok(r)
        }
    })
}

/// The virtual working directory into `buf` (getcwd's conventions).
unsafe fn vcwd_into(v: &[u8], buf: *mut c_char, size: size_t) -> R<*mut c_char> {
    let s = paths::outside_form(v);
    let need = s.len() + 1;
    let dst = if buf.is_null() {
        let n = if size == 0 { need } else { size };
        if n < need {
            return Err(Errno(libc::ERANGE));
        }
        let p = unsafe { libc::malloc(n) }.cast::<c_char>();
        if p.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        p
    } else {
        if size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        if size < need {
            return Err(Errno(libc::ERANGE));
        }
        buf
    };
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), dst, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(dst)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    if guard::busy() {
        return unsafe { real::getcwd(buf, size) };
    }
    shim::run(std::ptr::null_mut(), || match paths::vcwd() {
        Some(v) => unsafe { vcwd_into(&v, buf, size) },
        None => Ok(unsafe { real::getcwd(buf, size) }),
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __getcwd_chk(
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> *mut c_char {
    if size > buflen {
        unsafe { libc::abort() };
    }
    unsafe { getcwd(buf, size) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    unsafe { getcwd(std::ptr::null_mut(), 0) }
}

// ---------------------------------------------------------------- dup, fcntl

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if guard::busy() {
        return crate::internal::adopt(unsafe { real::dup(fd) });
    }
    on_fd!(fd, -1, real::dup(fd), |d| {
        let r = unsafe { real::dup(fd) };
        if r >= 0 && !crate::config::foreign_child() {
            ops::dup_installed(&d, r);
        }
        Ok(r)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if !guard::busy() && crate::internal::is_internal(new) && old != new {
        shim::set_errno(libc::EBUSY);
        return -1;
    }
    if guard::busy() || (!fdtable::maybe_ours(old) && !fdtable::maybe_ours(new)) {
        return unsafe { real::dup2(old, new) };
    }
    shim::run(-1, || ops::dup3(old, new, 0, true))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if !guard::busy() && crate::internal::is_internal(new) && old != new {
        shim::set_errno(libc::EBUSY);
        return -1;
    }
    if guard::busy() || (!fdtable::maybe_ours(old) && !fdtable::maybe_ours(new)) {
        return unsafe { real::dup3(old, new, flags) };
    }
    shim::run(-1, || ops::dup3(old, new, flags, false))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    if guard::busy() && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        // Our own code cloning a descriptor (tokio clones its epoll
        // instance and sockets): the copy is ours too.
        return crate::internal::adopt(unsafe { real::fcntl(fd, cmd, arg) });
    }
    on_fd!(fd, -1, real::fcntl(fd, cmd, arg), |d| ops::fcntl(
        fd, &d, cmd, arg
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    unsafe { fcntl(fd, cmd, arg) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    on_fd!(fd, -1, real::flock(fd, op), |_d| Err(unsupported(
        "flock",
        "file locks"
    )))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    on_fd!(fd, -1, real::lockf64(fd, cmd, len), |_d| Err(unsupported(
        "lockf",
        "file locks"
    )))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    unsafe { lockf(fd, cmd, len) }
}

// ---------------------------------------------------------------- advice, allocation

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    if guard::busy() || !fdtable::maybe_ours(fd) {
        return unsafe { real::posix_fadvise64(fd, off, len, advice) };
    }
    // Advice only: nothing to do. (Returns an error number, not -1.)
    match fdtable::get(fd) {
        Some(_) => 0,
        None => unsafe { real::posix_fadvise64(fd, off, len, advice) },
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    unsafe { posix_fadvise(fd, off, len, advice) }
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

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    if guard::busy() || !fdtable::maybe_ours(fd) {
        return unsafe { real::posix_fallocate64(fd, off, len) };
    }
    let r = shim::run(-1, || match fdtable::get(fd) {
        None => Ok(unsafe { real::posix_fallocate64(fd, off, len) }),
        Some(d) => extend(fd, &d, off, len).map(|_| 0),
    });
    if r == -1 {
        shim::errno()
    } else {
        r
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { posix_fallocate(fd, off, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
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

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { fallocate(fd, mode, off, len) }
}

// ---------------------------------------------------------------- copies between descriptors

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut off64_t,
    count: size_t,
) -> ssize_t {
    if guard::busy() || (!fdtable::maybe_ours(in_fd) && !fdtable::maybe_ours(out_fd)) {
        return unsafe { real::sendfile64(out_fd, in_fd, off, count) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            return Ok(unsafe { real::sendfile64(out_fd, in_fd, off, count) });
        }
        unsafe { ops::copy_between(in_fd, off, out_fd, std::ptr::null_mut(), count) }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut off64_t,
    count: size_t,
) -> ssize_t {
    unsafe { sendfile(out_fd, in_fd, off, count) }
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
        return unsafe { real::copy_file_range(in_fd, off_in, out_fd, off_out, len, flags) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            return Ok(unsafe {
                real::copy_file_range(in_fd, off_in, out_fd, off_out, len, flags)
            });
        }
        if flags != 0 {
            return Err(Errno(libc::EINVAL));
        }
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
        return unsafe { real::splice(in_fd, off_in, out_fd, off_out, len, flags) };
    }
    shim::run(-1, || {
        if fdtable::get(in_fd).is_none() && fdtable::get(out_fd).is_none() {
            return Ok(unsafe { real::splice(in_fd, off_in, out_fd, off_out, len, flags) });
        }
        unsafe { ops::copy_between(in_fd, off_in, out_fd, off_out, len) }
    })
}

// ---------------------------------------------------------------- mmap

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    if guard::busy() || flags & libc::MAP_ANONYMOUS != 0 || !fdtable::maybe_ours(fd) {
        return unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    }
    shim::run(libc::MAP_FAILED, || match fdtable::get(fd) {
        None => Ok(unsafe { real::mmap64(addr, len, prot, flags, fd, off) }),
        Some(d) => ops::mmap(&d, addr, len, prot, flags, off),
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

// ---------------------------------------------------------------- extended attributes

/// MadFS keeps no extended attributes: reading finds none (after checking
/// the path exists), setting is not supported.
fn xattr_get(m: &[u8], follow: bool) -> R<ssize_t> {
    meta::stat(m, follow)?;
    Err(Errno(libc::ENODATA))
}

fn xattr_list(m: &[u8], follow: bool) -> R<ssize_t> {
    meta::stat(m, follow)?;
    Ok(0)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::getxattr(p, name, value, size),
            |m| xattr_get(m, true),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lgetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::lgetxattr(p, name, value, size),
            |m| xattr_get(m, false),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    on_fd!(fd, -1, real::fgetxattr(fd, name, value, size), |_d| Err(
        Errno(libc::ENODATA)
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listxattr(
    path: *const c_char,
    list: *mut c_char,
    size: size_t,
) -> ssize_t {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::listxattr(p, list, size),
            |m| xattr_list(m, true),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn llistxattr(
    path: *const c_char,
    list: *mut c_char,
    size: size_t,
) -> ssize_t {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::llistxattr(p, list, size),
            |m| xattr_list(m, false),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t {
    on_fd!(fd, -1, real::flistxattr(fd, list, size), |_d| Ok(0))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setxattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::setxattr(p, name, value, size, flags),
            |_m| Err(unsupported("setxattr", "extended attributes")),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lsetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::lsetxattr(p, name, value, size, flags),
            |_m| Err(unsupported("setxattr", "extended attributes")),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    on_fd!(
        fd,
        -1,
        real::fsetxattr(fd, name, value, size, flags),
        |_d| Err(unsupported("setxattr", "extended attributes"))
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn removexattr(path: *const c_char, name: *const c_char) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::removexattr(p, name),
            |m| xattr_get(m, true).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::lremovexattr(p, name),
            |m| xattr_get(m, false).map(|_| 0),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    on_fd!(fd, -1, real::fremovexattr(fd, name), |_d| Err(Errno(
        libc::ENODATA
    )))
}

// ---------------------------------------------------------------- stdio

unsafe fn fopen_common(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            path,
            |p| real::fopen64(p, mode),
            |m| stdio::fopen(m, mode),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen_common(path, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen_common(path, mode) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    on_fd!(fd, std::ptr::null_mut(), real::fdopen(fd, mode), |_d| {
        stdio::stream_of(fd, mode)
    })
}

unsafe fn freopen_common(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
    if path.is_null() || guard::busy() {
        return unsafe { real::freopen64(path, mode, stream) };
    }
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            path,
            |p| {
                // The C library closes the stream's descriptor itself: if
                // it is ours, save what is pending and let go of it first.
                shim::run_void(|| stdio::release_stream_fd(stream));
                real::freopen64(p, mode, stream)
            },
            |m| stdio::freopen(m, mode, stream),
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    unsafe { freopen_common(path, mode, stream) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    unsafe { freopen_common(path, mode, stream) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    if guard::busy() || stream.is_null() {
        return unsafe { real::fclose(stream) };
    }
    shim::run(libc::EOF, || unsafe { stdio::fclose(stream) })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fileno(stream: *mut FILE) -> c_int {
    if !guard::busy() {
        if let Some(fd) = stdio::fd_of(stream) {
            return fd;
        }
    }
    unsafe { real::fileno(stream) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut FILE) -> c_int {
    if !guard::busy() {
        if let Some(fd) = stdio::fd_of(stream) {
            return fd;
        }
    }
    unsafe { real::fileno_unlocked(stream) }
}

// ---------------------------------------------------------------- temporary files

const TEMP_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Fill the X's of a template (before `suffix` bytes) and try `make` until
/// a name is free.
unsafe fn with_temp_name(
    template: *mut c_char,
    suffix: c_int,
    mut make: impl FnMut(&[u8]) -> R<c_int>,
    madfs_path: &[u8],
) -> R<c_int> {
    let t = unsafe { cstr(template)? }.len();
    let suffix = usize::try_from(suffix).map_err(|_| Errno(libc::EINVAL))?;
    if t < 6 + suffix {
        return Err(Errno(libc::EINVAL));
    }
    let xs = t - suffix - 6;
    let bytes = unsafe { std::slice::from_raw_parts_mut(template.cast::<u8>(), t) };
    if &bytes[xs..xs + 6] != b"XXXXXX" {
        return Err(Errno(libc::EINVAL));
    }
    // The MadFS path ends with the same template: patch both alike.
    let mlen = madfs_path.len();
    if mlen < 6 + suffix {
        return Err(Errno(libc::EINVAL));
    }
    let mxs = mlen - suffix - 6;
    let mut mpath = madfs_path.to_vec();
    for _ in 0..100 {
        let mut rnd = [0u8; 6];
        // SAFETY: a 6-byte buffer.
        if unsafe { libc::getrandom(rnd.as_mut_ptr().cast(), 6, 0) } != 6 {
            return Err(Errno(libc::EIO));
        }
        for (i, r) in rnd.iter().enumerate() {
            let c = TEMP_CHARS[*r as usize % TEMP_CHARS.len()];
            bytes[xs + i] = c;
            mpath[mxs + i] = c;
        }
        match make(&mpath) {
            Err(Errno(libc::EEXIST)) => continue,
            other => return other,
        }
    }
    Err(Errno(libc::EEXIST))
}

unsafe fn mkstemp_common(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            template,
            |_p| real::mkostemps64(template, suffix, flags),
            |m| {
                with_temp_name(
                    template,
                    suffix,
                    |p| {
                        let f = libc::O_RDWR
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | (flags & !libc::O_ACCMODE);
                        ops::open(p, f, 0o600)
                    },
                    m,
                )
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkstemp(template: *mut c_char) -> c_int {
    unsafe { mkstemp_common(template, 0, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkstemp64(template: *mut c_char) -> c_int {
    unsafe { mkstemp_common(template, 0, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
    unsafe { mkstemp_common(template, 0, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
    unsafe { mkstemp_common(template, 0, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkstemps(template: *mut c_char, suffix: c_int) -> c_int {
    unsafe { mkstemp_common(template, suffix, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkstemps64(template: *mut c_char, suffix: c_int) -> c_int {
    unsafe { mkstemp_common(template, suffix, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkostemps(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    unsafe { mkstemp_common(template, suffix, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkostemps64(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    unsafe { mkstemp_common(template, suffix, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            template,
            |_p| real::mkdtemp(template),
            |m| {
                with_temp_name(template, 0, |p| meta::mkdir(p, 0o700).map(|_| 0), m)?;
                Ok(template)
            },
        )
    }
}

// ---------------------------------------------------------------- realpath

unsafe fn realpath_common(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            path,
            |p| real::realpath(p, resolved),
            |m| {
                let r = paths::outside_form(&meta::realpath(m)?);
                if r.len() >= libc::PATH_MAX as usize {
                    return Err(Errno(libc::ENAMETOOLONG));
                }
                let dst = if resolved.is_null() {
                    let p = libc::malloc(r.len() + 1).cast::<c_char>();
                    if p.is_null() {
                        return Err(Errno(libc::ENOMEM));
                    }
                    p
                } else {
                    resolved
                };
                std::ptr::copy_nonoverlapping(r.as_ptr().cast(), dst, r.len());
                *dst.add(r.len()) = 0;
                Ok(dst)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    unsafe { realpath_common(path, resolved) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    reslen: size_t,
) -> *mut c_char {
    if !resolved.is_null() && reslen < libc::PATH_MAX as usize {
        unsafe { libc::abort() };
    }
    unsafe { realpath_common(path, resolved) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    unsafe { realpath_common(path, std::ptr::null_mut()) }
}

// ---------------------------------------------------------------- pathconf

fn pathconf_value(name: c_int) -> c_long {
    match name {
        libc::_PC_LINK_MAX => 65000,
        libc::_PC_NAME_MAX => madfs_client::limits::NAME_MAX_BYTES as c_long,
        libc::_PC_PATH_MAX => libc::PATH_MAX as c_long,
        libc::_PC_PIPE_BUF => 4096,
        libc::_PC_CHOWN_RESTRICTED | libc::_PC_NO_TRUNC => 1,
        libc::_PC_FILESIZEBITS => 64,
        libc::_PC_SYMLINK_MAX => madfs_client::limits::SYMLINK_MAX_BYTES as c_long,
        _ => -1,
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pathconf(path: *const c_char, name: c_int) -> c_long {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::pathconf(p, name),
            |m| {
                meta::stat(m, true)?;
                Ok(pathconf_value(name))
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fpathconf(fd: c_int, name: c_int) -> c_long {
    on_fd!(fd, -1, real::fpathconf(fd, name), |_d| Ok(pathconf_value(
        name
    )))
}

// ---------------------------------------------------------------- our own descriptors

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    let fd = unsafe { real::socket(domain, ty, proto) };
    if guard::busy() {
        crate::internal::adopt(fd)
    } else {
        fd
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    let fd = unsafe { real::epoll_create1(flags) };
    if guard::busy() {
        crate::internal::adopt(fd)
    } else {
        fd
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    let fd = unsafe { real::epoll_create(size) };
    if guard::busy() {
        crate::internal::adopt(fd)
    } else {
        fd
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn eventfd(initval: c_uint, flags: c_int) -> c_int {
    let fd = unsafe { real::eventfd(initval, flags) };
    if guard::busy() {
        crate::internal::adopt(fd)
    } else {
        fd
    }
}

unsafe fn adopt_pair(r: c_int, fds: *mut c_int) -> c_int {
    if r == 0 && guard::busy() && !fds.is_null() {
        unsafe {
            *fds = crate::internal::adopt(*fds);
            *fds.add(1) = crate::internal::adopt(*fds.add(1));
        }
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    proto: c_int,
    sv: *mut c_int,
) -> c_int {
    unsafe { adopt_pair(real::socketpair(domain, ty, proto, sv), sv) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    unsafe { adopt_pair(real::pipe(fds), fds) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    unsafe { adopt_pair(real::pipe2(fds, flags), fds) }
}

// ---------------------------------------------------------------- process

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    let old = unsafe { real::umask(mask) };
    crate::config::set_umask(mask);
    old
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chroot(path: *const c_char) -> c_int {
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::chroot(p),
            |_m| Err(unsupported("chroot", "into MadFS")),
        )
    }
}

/// The path to give the kernel for exec: made absolute when the working
/// directory is in MadFS.
unsafe fn exec_kpath(path: *const c_char) -> R<KPath> {
    let bytes = unsafe { cstr(path)? };
    if !bytes.contains(&b'/') {
        return Ok(KPath::Orig(path));
    }
    match paths::classify_bytes(AT_FDCWD, bytes, path)? {
        Target::Kernel(k) => Ok(k),
        Target::Madfs(_) => Err(unsupported("execve", "running programs stored in MadFS")),
    }
}

fn env_ptrs(env: &[CString]) -> Vec<*const c_char> {
    let mut v: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    v.push(std::ptr::null());
    v
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if guard::busy() {
        return unsafe { real::execve(path, argv, envp) };
    }
    shim::run(-1, || {
        let k = unsafe { exec_kpath(path)? };
        let env = unsafe { process::before_exec(envp) };
        Ok(match env {
            Some(e) => unsafe { real::execve(k.ptr(), argv, env_ptrs(&e).as_ptr()) },
            None => unsafe { real::execve(k.ptr(), argv, envp) },
        })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    if guard::busy() {
        return unsafe { real::execv(path, argv) };
    }
    shim::run(-1, || {
        let k = unsafe { exec_kpath(path)? };
        unsafe { process::before_exec(std::ptr::null()) };
        Ok(unsafe { real::execv(k.ptr(), argv) })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    if guard::busy() {
        return unsafe { real::execvp(file, argv) };
    }
    shim::run(-1, || {
        let k = unsafe { exec_kpath(file)? };
        unsafe { process::before_exec(std::ptr::null()) };
        Ok(unsafe { real::execvp(k.ptr(), argv) })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if guard::busy() {
        return unsafe { real::execvpe(file, argv, envp) };
    }
    shim::run(-1, || {
        let k = unsafe { exec_kpath(file)? };
        let env = unsafe { process::before_exec(envp) };
        Ok(match env {
            Some(e) => unsafe { real::execvpe(k.ptr(), argv, env_ptrs(&e).as_ptr()) },
            None => unsafe { real::execvpe(k.ptr(), argv, envp) },
        })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    if !guard::busy() {
        shim::run_void(process::before_exit);
    }
    unsafe { real::_exit(status) };
    #[allow(clippy::empty_loop)]
    loop {}
}

#[cfg_attr(not(test), no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    if !guard::busy() {
        shim::run_void(process::before_exit);
    }
    unsafe { real::_Exit(status) };
    #[allow(clippy::empty_loop)]
    loop {}
}
