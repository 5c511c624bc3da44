//! Calls about names: temporary files (mkstemp family, mkdtemp), realpath,
//! pathconf.

use super::{on_path, AT_FDCWD};
use crate::meta;
use crate::ops;
use crate::paths::{self, cstr};
use crate::real;
use crate::shim::{Errno, R};
use libc::{c_char, c_int, c_long, size_t};

// ---- temporary files

const TEMP_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Fill the X's of a template (before `suffix` bytes) and try `make` until
/// a name is free.
///
/// # Safety
/// mkstemp's contract: `template` is a writable C string (NULL: EFAULT).
unsafe fn with_temp_name(
    template: *mut c_char,
    suffix: c_int,
    mut make: impl FnMut(&[u8]) -> R<c_int>,
    madfs_path: &[u8],
) -> R<c_int> {
    // SAFETY: this function's contract.
    let t = unsafe { cstr(template)? }.len();
    let suffix = usize::try_from(suffix).map_err(|_| Errno(libc::EINVAL))?;
    if t < 6 + suffix {
        return Err(Errno(libc::EINVAL));
    }
    let xs = t - suffix - 6;
    // SAFETY: the template's `t` bytes before its NUL, writable by this
    // function's contract; nothing else refers to them during the call.
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

/// mkostemps(3), behind the whole mkstemp family.
///
/// # Safety
/// As `with_temp_name`.
unsafe fn mkstemp_common(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: pure forward (on_path reads the template; the MadFS branch
    // patches it, as with_temp_name's contract, the same as this
    // function's, allows).
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

aliases! {
    mkstemp, mkstemp64: (template: *mut c_char) -> c_int => mkstemp_common(template, 0, 0);
    mkostemp, mkostemp64: (template: *mut c_char, flags: c_int) -> c_int
        => mkstemp_common(template, 0, flags);
    mkstemps, mkstemps64: (template: *mut c_char, suffix: c_int) -> c_int
        => mkstemp_common(template, suffix, 0);
    mkostemps, mkostemps64: (template: *mut c_char, suffix: c_int, flags: c_int) -> c_int
        => mkstemp_common(template, suffix, flags);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: pure forward (as mkstemp_common: mkdtemp's contract is
    // with_temp_name's).
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

// ---- realpath

/// realpath(3).
///
/// # Safety
/// realpath's contract: `path` is NULL or a C string, `resolved` is NULL
/// or writable for PATH_MAX bytes.
unsafe fn realpath_common(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // SAFETY: on_path gets the caller's path, the kernel branch is a pure
    // forward; the MadFS branch writes at most PATH_MAX bytes (the length
    // is checked) into `resolved`, writable for that many by this
    // function's contract, or into a malloc'd buffer of len + 1 bytes
    // (NULL checked); `r` is ours, so the copy does not overlap.
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

aliases! {
    realpath: (path: *const c_char, resolved: *mut c_char) -> *mut c_char
        => realpath_common(path, resolved);
    canonicalize_file_name: (path: *const c_char) -> *mut c_char
        => realpath_common(path, std::ptr::null_mut());
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    reslen: size_t,
) -> *mut c_char {
    if !resolved.is_null() && reslen < libc::PATH_MAX as usize {
        // SAFETY: abort takes no arguments and does not return.
        unsafe { libc::abort() };
    }
    // SAFETY: pure forward.
    unsafe { realpath_common(path, resolved) }
}

// ---- pathconf

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
    // SAFETY: pure forward.
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
