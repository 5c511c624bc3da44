//! C streams: fopen, fdopen, freopen, fclose, fileno.

use super::{on_path, AT_FDCWD};
use crate::guard;
use crate::real;
use crate::shim;
use crate::stdio;
use libc::{c_char, c_int, FILE};

/// fopen(3).
///
/// # Safety
/// fopen's contract: `path` is NULL or a C string, `mode` a C string.
unsafe fn fopen_common(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: pure forward (stdio::fopen asks for a valid `mode`).
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
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    on_fd!(fd, std::ptr::null_mut(), real::fdopen(fd, mode), |_d| {
        stdio::stream_of(fd, mode)
    })
}

/// freopen(3).
///
/// # Safety
/// freopen's contract: `path` is NULL or a C string, `mode` a C string,
/// `stream` an open stream.
unsafe fn freopen_common(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
    if path.is_null() || guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::freopen64(path, mode, stream) };
    }
    // SAFETY: pure forward; release_stream_fd and stdio::freopen ask for
    // the valid `mode` and `stream` of this function's contract.
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

aliases! {
    fopen, fopen64: (path: *const c_char, mode: *const c_char) -> *mut FILE
        => fopen_common(path, mode);
    freopen, freopen64: (path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE
        => freopen_common(path, mode, stream);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    if guard::busy() || stream.is_null() {
        // SAFETY: pure forward.
        return unsafe { real::fclose(stream) };
    }
    // SAFETY: pure forward (stdio::fclose asks for an open stream).
    shim::run(libc::EOF, || unsafe { stdio::fclose(stream) })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fileno(stream: *mut FILE) -> c_int {
    if !guard::busy() {
        if let Some(fd) = stdio::fd_of(stream) {
            return fd;
        }
    }
    // SAFETY: pure forward.
    unsafe { real::fileno(stream) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut FILE) -> c_int {
    if !guard::busy() {
        if let Some(fd) = stdio::fd_of(stream) {
            return fd;
        }
    }
    // SAFETY: pure forward.
    unsafe { real::fileno_unlocked(stream) }
}
