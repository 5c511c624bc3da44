//! Permissions, owners and times: chmod, chown, utimensat and the older
//! time calls (utime, utimes, lutimes, futimes, futimesat).

use super::{is_empty_path, on_path, AT_FDCWD};
use crate::meta;
use crate::ops;
use crate::real;
use crate::shim;
use libc::{c_char, c_int, gid_t, mode_t, uid_t};

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    // SAFETY: pure forward.
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
    // SAFETY: pure forward (`path` is NULL or a C string).
    if flags & libc::AT_EMPTY_PATH != 0 && unsafe { is_empty_path(path) } {
        // SAFETY: pure forward.
        return unsafe { fchown(dirfd, uid, gid) };
    }
    // SAFETY: pure forward.
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
pub unsafe extern "C" fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int {
    on_fd!(fd, -1, real::fchown(fd, uid, gid), |d| ops::setattr(
        &d,
        meta::chown_changes(uid, gid)
    )
    .map(|_| 0))
}

aliases! {
    chmod: (path: *const c_char, mode: mode_t) -> c_int => fchmodat(AT_FDCWD, path, mode, 0);
    lchmod: (path: *const c_char, mode: mode_t) -> c_int
        => fchmodat(AT_FDCWD, path, mode, libc::AT_SYMLINK_NOFOLLOW);
    chown: (path: *const c_char, uid: uid_t, gid: gid_t) -> c_int
        => fchownat(AT_FDCWD, path, uid, gid, 0);
    lchown: (path: *const c_char, uid: uid_t, gid: gid_t) -> c_int
        => fchownat(AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    // SAFETY: pure forward (`path` is NULL or a C string).
    if path.is_null() || (flags & libc::AT_EMPTY_PATH != 0 && unsafe { is_empty_path(path) }) {
        // Linux: a NULL path changes `dirfd` itself.
        // SAFETY: pure forward.
        return unsafe { futimens(dirfd, times) };
    }
    // SAFETY: pure forward; the MadFS branch reads `times`, NULL or two
    // timespecs by utimensat's contract.
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
        // SAFETY: futimens's contract: `times` is NULL or two timespecs.
        let changes = unsafe { ops::time_changes(times)? };
        ops::setattr(&d, changes).map(|_| 0)
    })
}

/// timevals (utimes, futimes, lutimes) as timespecs.
///
/// # Safety
/// `tv` is NULL or points to two timevals.
unsafe fn tv_to_ts(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: not NULL, so two timevals by this function's contract.
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

/// The timespecs for utimensat: a pointer into `ts`, or NULL.
fn ts_ptr(ts: &Option<[libc::timespec; 2]>) -> *const libc::timespec {
    match ts {
        Some(a) => a.as_ptr(),
        None => std::ptr::null(),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: utimes's contract: `tv` is NULL or two timevals.
    let ts = unsafe { tv_to_ts(tv) };
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's path; `ts` (NULL or two timespecs) outlives the
    // call.
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: lutimes's contract: `tv` is NULL or two timevals.
    let ts = unsafe { tv_to_ts(tv) };
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's path; `ts` (NULL or two timespecs) outlives the
    // call.
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), libc::AT_SYMLINK_NOFOLLOW) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    // SAFETY: futimes's contract: `tv` is NULL or two timevals.
    let ts = unsafe { tv_to_ts(tv) };
    // SAFETY: `ts` (NULL or two timespecs) outlives the call.
    unsafe { futimens(fd, ts_ptr(&ts)) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn futimesat(
    dirfd: c_int,
    path: *const c_char,
    tv: *const libc::timeval,
) -> c_int {
    // SAFETY: futimesat's contract: `tv` is NULL or two timevals.
    let ts = unsafe { tv_to_ts(tv) };
    // SAFETY: the caller's path; `ts` (NULL or two timespecs) outlives the
    // call.
    unsafe { utimensat(dirfd, path, ts_ptr(&ts), 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    if path.is_null() {
        shim::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: utime's contract: `times` is NULL or points to a utimbuf.
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
    // SAFETY: the caller's path; `ts` (NULL or two timespecs) outlives the
    // call.
    unsafe { utimensat(AT_FDCWD, path, ts_ptr(&ts), 0) }
}
