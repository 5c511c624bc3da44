//! open and its variants, creat, close, close_range, closefrom.

use super::{on_path, AT_FDCWD};
use crate::config;
use crate::fdtable;
use crate::guard;
use crate::internal;
use crate::ops;
use crate::real;
use crate::shim;
use libc::{c_char, c_int, c_uint, mode_t};

/// open/openat on `dirfd`.
///
/// # Safety
/// `path` is NULL or a C string valid for the call.
unsafe fn open_common(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: pure forward.
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

aliases! {
    open, open64: (path: *const c_char, flags: c_int, mode: mode_t) -> c_int
        => open_common(AT_FDCWD, path, flags, mode);
    __open_2, __open64_2: (path: *const c_char, flags: c_int) -> c_int
        => open_common(AT_FDCWD, path, flags, 0);
    openat, openat64: (dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int
        => open_common(dirfd, path, flags, mode);
    __openat_2, __openat64_2: (dirfd: c_int, path: *const c_char, flags: c_int) -> c_int
        => open_common(dirfd, path, flags, 0);
    creat, creat64: (path: *const c_char, mode: mode_t) -> c_int
        => open_common(AT_FDCWD, path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if internal::is_internal(fd) {
        if guard::busy() {
            internal::forget(fd);
            // SAFETY: pure forward.
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
        // SAFETY: pure forward.
        return unsafe { real::close_range(first, last, flags) };
    }
    shim::run(-1, || {
        if !config::foreign_child() {
            for (fd, d) in fdtable::all() {
                if fd as u32 >= first && fd as u32 <= last {
                    ops::close(fd, d)?;
                }
            }
        }
        let mut r = 0;
        for (a, b) in internal::ranges_without_internal(first, last) {
            // SAFETY: integers only: the caller's range minus our own
            // descriptors, with the caller's flags.
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
            if !config::foreign_child() {
                for (fd, d) in fdtable::all() {
                    if fd >= low {
                        let _ = ops::close(fd, d);
                    }
                }
            }
        });
    }
    if guard::busy() || low < 0 {
        // SAFETY: pure forward.
        return unsafe { real::closefrom(low) };
    }
    for (a, b) in internal::ranges_without_internal(low as u32, u32::MAX) {
        // SAFETY: integers only: the caller's range minus our own
        // descriptors.
        unsafe { real::close_range(a, b, 0) };
    }
}
