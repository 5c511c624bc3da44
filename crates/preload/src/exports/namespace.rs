//! The namespace: unlink, rmdir, remove, mkdir, rename, link, symlink,
//! readlink, mknod and mkfifo.

use super::{check_fortified, on_path, on_two_paths, AT_FDCWD};
use crate::fdtable;
use crate::meta;
use crate::ops;
use crate::paths::{self, cstr};
use crate::real;
use crate::shim::{self, Errno, R};
use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t};

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: pure forward.
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

aliases! {
    unlink: (path: *const c_char) -> c_int => unlinkat(AT_FDCWD, path, 0);
    rmdir: (path: *const c_char) -> c_int => unlinkat(AT_FDCWD, path, libc::AT_REMOVEDIR);
}

/// stdio's remove(3): unlink, or rmdir for a directory.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    // SAFETY: pure forward: the kernel branch hands on_path's path to
    // unlinkat twice, within the call.
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
    // SAFETY: pure forward.
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
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: pure forward (renameat when there are no flags: the same
    // paths, with older kernels' support).
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
pub unsafe extern "C" fn linkat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: pure forward.
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
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    newdir: c_int,
    linkpath: *const c_char,
) -> c_int {
    // SAFETY: pure forward; the MadFS branch reads `target`, NULL or a C
    // string by symlinkat's contract.
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

aliases! {
    mkdir: (path: *const c_char, mode: mode_t) -> c_int => mkdirat(AT_FDCWD, path, mode);
    renameat: (olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int
        => renameat2(olddir, old, newdir, new, 0);
    rename: (old: *const c_char, new: *const c_char) -> c_int
        => renameat2(AT_FDCWD, old, AT_FDCWD, new, 0);
    link: (old: *const c_char, new: *const c_char) -> c_int
        => linkat(AT_FDCWD, old, AT_FDCWD, new, 0);
    symlink: (target: *const c_char, linkpath: *const c_char) -> c_int
        => symlinkat(target, AT_FDCWD, linkpath);
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
///
/// # Safety
/// readlink's contract: `buf` is writable for `size` bytes.
unsafe fn put_link(t: &[u8], buf: *mut c_char, size: size_t) -> R<ssize_t> {
    if size == 0 {
        return Err(Errno(libc::EINVAL));
    }
    let n = t.len().min(size);
    // SAFETY: `n` is at most `size`, for which `buf` is writable.
    unsafe { ops::slice_mut(buf.cast(), n)? }.copy_from_slice(&t[..n]);
    Ok(n as ssize_t)
}

/// readlinkat(2).
///
/// # Safety
/// readlinkat's contract: `path` is NULL or a C string, `buf` is writable
/// for `size` bytes.
unsafe fn readlinkat_impl(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: on_path gets the caller's path and hands the kernel branch a
    // valid one (read by cstr for /proc/self/fd/N); `buf` and `size` go to
    // put_link or the real readlinkat, which ask for what this function's
    // contract gives.
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

/// __readlinkat_chk: readlinkat after the fortified check.
///
/// # Safety
/// As `readlinkat_impl`.
unsafe fn readlinkat_chk(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> ssize_t {
    check_fortified(size, buflen);
    // SAFETY: pure forward.
    unsafe { readlinkat_impl(dirfd, path, buf, size) }
}

aliases! {
    readlinkat: (dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t
        => readlinkat_impl(dirfd, path, buf, size);
    readlink: (path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t
        => readlinkat_impl(AT_FDCWD, path, buf, size);
    __readlink_chk:
        (path: *const c_char, buf: *mut c_char, size: size_t, buflen: size_t) -> ssize_t
        => readlinkat_chk(AT_FDCWD, path, buf, size, buflen);
    __readlinkat_chk: (
        dirfd: c_int,
        path: *const c_char,
        buf: *mut c_char,
        size: size_t,
        buflen: size_t,
    ) -> ssize_t
        => readlinkat_chk(dirfd, path, buf, size, buflen);
}

/// mknodat(2).
///
/// # Safety
/// `path` is NULL or a C string.
unsafe fn mknod_common(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: pure forward.
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

/// glibc before 2.33 (binaries built against it) calls these for mknod:
/// the device number by pointer.
///
/// # Safety
/// `path` is NULL or a C string, `dev` is NULL (EFAULT) or points to a
/// device number.
unsafe fn xmknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    // SAFETY: this function's contract: NULL or a readable dev_t.
    match unsafe { dev.as_ref() } {
        // SAFETY: pure forward.
        Some(&dev) => unsafe { mknod_common(dirfd, path, mode, dev) },
        None => {
            shim::set_errno(libc::EFAULT);
            -1
        }
    }
}

aliases! {
    __xmknod: (_ver: c_int, path: *const c_char, mode: mode_t, dev: *const libc::dev_t) -> c_int
        => xmknodat(AT_FDCWD, path, mode, dev);
    __xmknodat: (
        _ver: c_int,
        dirfd: c_int,
        path: *const c_char,
        mode: mode_t,
        dev: *const libc::dev_t,
    ) -> c_int
        => xmknodat(dirfd, path, mode, dev);
    mknodat: (dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int
        => mknod_common(dirfd, path, mode, dev);
    mknod: (path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int
        => mknod_common(AT_FDCWD, path, mode, dev);
    mkfifoat: (dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int
        => mknod_common(dirfd, path, (mode & 0o7777) | libc::S_IFIFO, 0);
    mkfifo: (path: *const c_char, mode: mode_t) -> c_int
        => mknod_common(AT_FDCWD, path, (mode & 0o7777) | libc::S_IFIFO, 0);
}
