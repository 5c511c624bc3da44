//! Extended attributes. MadFS keeps none: reading finds none (after
//! checking the path exists), listing finds an empty list, setting is not
//! supported, removing says there is nothing to remove.

use super::{on_path, AT_FDCWD};
use crate::meta;
use crate::real;
use crate::shim::{unsupported, Errno, R};
use libc::{c_char, c_int, c_void, size_t, ssize_t};

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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
    // SAFETY: pure forward.
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
