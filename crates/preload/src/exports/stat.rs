//! The stat family (stat, lstat, fstat, fstatat, statx and the pre-2.33
//! `__xstat` entry points), statfs and statvfs, access.

use super::{is_empty_path, on_path, AT_FDCWD};
use crate::meta;
use crate::ops;
use crate::real;
use crate::shim::{Errno, R};
use libc::{c_char, c_int, c_uint};

/// Fill the caller's `struct stat64`.
///
/// # Safety
/// `buf` is NULL (EFAULT) or points to a writable `struct stat64`.
unsafe fn fill_stat(buf: *mut libc::stat64, a: &madfs_client::Attr) -> R<c_int> {
    // SAFETY: this function's contract.
    let st = unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?;
    meta::fill_stat(st, a);
    Ok(0)
}

/// fstatat(2), the call behind every path form.
///
/// # Safety
/// fstatat's contract: `path` is NULL or a C string, `buf` points to a
/// writable `struct stat64`.
unsafe fn stat_common(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: pure forward (`path` is NULL or a C string).
    if flags & libc::AT_EMPTY_PATH != 0 && unsafe { is_empty_path(path) } {
        // SAFETY: pure forward.
        return unsafe { fstat_impl(dirfd, buf) };
    }
    // SAFETY: on_path gets the caller's path; the kernel branch forwards
    // the caller's `buf`; the MadFS branch fills it, as this function's
    // contract allows.
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

/// fstat(2).
///
/// # Safety
/// `buf` points to a writable `struct stat64`.
unsafe fn fstat_impl(fd: c_int, buf: *mut libc::stat64) -> c_int {
    on_fd!(fd, -1, real::fstat64(fd, buf), |d| {
        let a = ops::fstat(fd, &d)?;
        // SAFETY: this function's contract: `buf` is the caller's stat.
        unsafe { fill_stat(buf, &a) }
    })
}

aliases! {
    stat, stat64: (path: *const c_char, buf: *mut libc::stat64) -> c_int
        => stat_common(AT_FDCWD, path, buf, 0);
    lstat, lstat64: (path: *const c_char, buf: *mut libc::stat64) -> c_int
        => stat_common(AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW);
    fstatat, fstatat64, newfstatat:
        (dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int
        => stat_common(dirfd, path, buf, flags);
    fstat, fstat64: (fd: c_int, buf: *mut libc::stat64) -> c_int => fstat_impl(fd, buf);
    // The pre-2.33 glibc entry points (binaries built against older glibc).
    __xstat, __xstat64: (_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int
        => stat_common(AT_FDCWD, path, buf, 0);
    __lxstat, __lxstat64: (_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int
        => stat_common(AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW);
    __fxstat, __fxstat64: (_ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int
        => fstat_impl(fd, buf);
    __fxstatat, __fxstatat64: (
        _ver: c_int,
        dirfd: c_int,
        path: *const c_char,
        buf: *mut libc::stat64,
        flags: c_int,
    ) -> c_int
        => stat_common(dirfd, path, buf, flags);
}

/// Fill the caller's `struct statx`.
///
/// # Safety
/// `buf` is NULL (EFAULT) or points to a writable `struct statx`.
unsafe fn fill_statx(buf: *mut libc::statx, a: &madfs_client::Attr) -> R<c_int> {
    // SAFETY: this function's contract.
    let stx = unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?;
    meta::fill_statx(stx, a);
    Ok(0)
}

/// statx on the descriptor itself (AT_EMPTY_PATH).
///
/// # Safety
/// statx's contract.
unsafe fn statx_fd(
    fd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    on_fd!(fd, -1, real::statx(fd, path, flags, mask, buf), |d| {
        let a = ops::fstat(fd, &d)?;
        // SAFETY: this function's contract: `buf` is the caller's statx.
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
    // SAFETY: pure forward (`path` is NULL or a C string).
    if flags & libc::AT_EMPTY_PATH != 0 && unsafe { is_empty_path(path) } {
        // SAFETY: pure forward.
        return unsafe { statx_fd(dirfd, path, flags, mask, buf) };
    }
    // SAFETY: on_path gets the caller's path; the kernel branch forwards
    // the caller's `buf`; the MadFS branch fills it, as statx's contract
    // allows.
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

/// statfs(2).
///
/// # Safety
/// statfs's contract: `path` is NULL or a C string, `buf` is NULL (EFAULT
/// from us) or points to a writable `struct statfs64`.
unsafe fn statfs_common(path: *const c_char, buf: *mut libc::statfs64) -> c_int {
    // SAFETY: on_path gets the caller's path; the kernel branch forwards
    // `buf`; the MadFS branch writes through it only when it is not NULL,
    // as this function's contract allows.
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

/// fstatfs(2).
///
/// # Safety
/// As `statfs_common`, for a descriptor.
unsafe fn fstatfs_impl(fd: c_int, buf: *mut libc::statfs64) -> c_int {
    on_fd!(fd, -1, real::fstatfs64(fd, buf), |_d| {
        let s = meta::statfs()?;
        // SAFETY: this function's contract: NULL or a writable statfs64.
        meta::fill_statfs(unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?, &s);
        Ok(0)
    })
}

/// statvfs(3).
///
/// # Safety
/// As `statfs_common`, for a `struct statvfs64`.
unsafe fn statvfs_common(path: *const c_char, buf: *mut libc::statvfs64) -> c_int {
    // SAFETY: on_path gets the caller's path; the kernel branch forwards
    // `buf`; the MadFS branch writes through it only when it is not NULL,
    // as this function's contract allows.
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

/// fstatvfs(3).
///
/// # Safety
/// As `statvfs_common`, for a descriptor.
unsafe fn fstatvfs_impl(fd: c_int, buf: *mut libc::statvfs64) -> c_int {
    on_fd!(fd, -1, real::fstatvfs64(fd, buf), |_d| {
        let s = meta::statfs()?;
        // SAFETY: this function's contract: NULL or a writable statvfs64.
        meta::fill_statvfs(unsafe { buf.as_mut() }.ok_or(Errno(libc::EFAULT))?, &s);
        Ok(0)
    })
}

aliases! {
    statfs, statfs64: (path: *const c_char, buf: *mut libc::statfs64) -> c_int
        => statfs_common(path, buf);
    fstatfs, fstatfs64: (fd: c_int, buf: *mut libc::statfs64) -> c_int => fstatfs_impl(fd, buf);
    statvfs, statvfs64: (path: *const c_char, buf: *mut libc::statvfs64) -> c_int
        => statvfs_common(path, buf);
    fstatvfs, fstatvfs64: (fd: c_int, buf: *mut libc::statvfs64) -> c_int
        => fstatvfs_impl(fd, buf);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: pure forward.
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

aliases! {
    access: (path: *const c_char, mode: c_int) -> c_int => faccessat(AT_FDCWD, path, mode, 0);
    eaccess, euidaccess: (path: *const c_char, mode: c_int) -> c_int
        => faccessat(AT_FDCWD, path, mode, libc::AT_EACCESS);
}
