//! read and write with their vector, positioned and fortified forms, lseek.

use super::check_fortified;
use crate::fdtable;
use crate::ops;
use crate::real;
use crate::shim::R;
use libc::{c_int, c_void, iovec, off64_t, size_t, ssize_t};

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::read(fd, buf, n), |d| {
        // SAFETY: read(2)'s contract: `buf` is writable for `n` bytes.
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
    check_fortified(n, buflen);
    // SAFETY: pure forward.
    unsafe { read(fd, buf, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::write(fd, buf, n), |d| {
        // SAFETY: write(2)'s contract: `buf` is readable for `n` bytes.
        Ok(ops::write(fd, &d, unsafe { ops::slice(buf, n)? })? as ssize_t)
    })
}

/// pread(2).
///
/// # Safety
/// pread(2)'s contract: `buf` is writable for `n` bytes.
unsafe fn pread_impl(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::pread64(fd, buf, n, off), |d| {
        // SAFETY: this function's contract: `buf` is writable for `n` bytes.
        Ok(ops::pread(fd, &d, unsafe { ops::slice_mut(buf, n)? }, off)? as ssize_t)
    })
}

/// __pread_chk: pread after the fortified check.
///
/// # Safety
/// As `pread_impl`.
unsafe fn pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    buflen: size_t,
) -> ssize_t {
    check_fortified(n, buflen);
    // SAFETY: pure forward.
    unsafe { pread_impl(fd, buf, n, off) }
}

/// pwrite(2).
///
/// # Safety
/// pwrite(2)'s contract: `buf` is readable for `n` bytes.
unsafe fn pwrite_impl(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::pwrite64(fd, buf, n, off), |d| {
        // SAFETY: this function's contract: `buf` is readable for `n` bytes.
        Ok(ops::pwrite(fd, &d, unsafe { ops::slice(buf, n)? }, off)? as ssize_t)
    })
}

aliases! {
    pread, pread64: (fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t
        => pread_impl(fd, buf, n, off);
    __pread_chk, __pread64_chk:
        (fd: c_int, buf: *mut c_void, n: size_t, off: off64_t, buflen: size_t) -> ssize_t
        => pread_chk(fd, buf, n, off, buflen);
    pwrite, pwrite64: (fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t
        => pwrite_impl(fd, buf, n, off);
}

/// readv/preadv on ours: read into one buffer, then scatter.
///
/// # Safety
/// readv(2)'s contract: `iov` holds `cnt` iovecs, each writable for its
/// length.
unsafe fn readv_ours(
    fd: c_int,
    d: &fdtable::Desc,
    iov: *const iovec,
    cnt: c_int,
    off: Option<i64>,
) -> R<ssize_t> {
    // SAFETY: this function's contract.
    let v = unsafe { ops::iovecs(iov, cnt)? };
    let mut buf = vec![0u8; ops::iov_total(v)];
    let n = match off {
        Some(o) => ops::pread(fd, d, &mut buf, o)?,
        None => ops::read(fd, d, &mut buf)?,
    };
    // SAFETY: the iovecs of this function's contract, writable; `n` is at
    // most their total length.
    unsafe { ops::scatter(v, &buf[..n])? };
    Ok(n as ssize_t)
}

/// writev/pwritev on ours: gather into one buffer, then write.
///
/// # Safety
/// writev(2)'s contract: `iov` holds `cnt` iovecs, each readable for its
/// length.
unsafe fn writev_ours(
    fd: c_int,
    d: &fdtable::Desc,
    iov: *const iovec,
    cnt: c_int,
    off: Option<i64>,
) -> R<ssize_t> {
    // SAFETY: this function's contract.
    let v = unsafe { ops::iovecs(iov, cnt)? };
    // SAFETY: the iovecs of this function's contract, readable.
    let buf = unsafe { ops::gather(v)? };
    let n = match off {
        Some(o) => ops::pwrite(fd, d, &buf, o)?,
        None => ops::write(fd, d, &buf)?,
    };
    Ok(n as ssize_t)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    on_fd!(fd, -1, real::readv(fd, iov, cnt), |d| {
        // SAFETY: pure forward (readv_ours asks for readv's contract).
        unsafe { readv_ours(fd, &d, iov, cnt, None) }
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    on_fd!(fd, -1, real::writev(fd, iov, cnt), |d| {
        // SAFETY: pure forward (writev_ours asks for writev's contract).
        unsafe { writev_ours(fd, &d, iov, cnt, None) }
    })
}

/// preadv(2).
///
/// # Safety
/// As `readv_ours`.
unsafe fn preadv_impl(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::preadv64(fd, iov, cnt, off), |d| {
        // SAFETY: pure forward.
        unsafe { readv_ours(fd, &d, iov, cnt, Some(off)) }
    })
}

/// pwritev(2).
///
/// # Safety
/// As `writev_ours`.
unsafe fn pwritev_impl(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t {
    on_fd!(fd, -1, real::pwritev64(fd, iov, cnt, off), |d| {
        // SAFETY: pure forward.
        unsafe { writev_ours(fd, &d, iov, cnt, Some(off)) }
    })
}

/// preadv2(2): an offset of -1 is the descriptor's own.
///
/// # Safety
/// As `readv_ours`.
unsafe fn preadv2_impl(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    on_fd!(fd, -1, real::preadv64v2(fd, iov, cnt, off, flags), |d| {
        // SAFETY: pure forward.
        unsafe { readv_ours(fd, &d, iov, cnt, (off != -1).then_some(off)) }
    })
}

/// pwritev2(2): an offset of -1 is the descriptor's own.
///
/// # Safety
/// As `writev_ours`.
unsafe fn pwritev2_impl(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    on_fd!(fd, -1, real::pwritev64v2(fd, iov, cnt, off, flags), |d| {
        // SAFETY: pure forward.
        unsafe { writev_ours(fd, &d, iov, cnt, (off != -1).then_some(off)) }
    })
}

/// lseek(2) (64-bit offsets).
///
/// # Safety
/// None beyond lseek's: integers only.
unsafe fn lseek_impl(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    on_fd!(fd, -1, real::lseek64(fd, off, whence), |d| ops::lseek(
        fd, &d, off, whence
    ))
}

aliases! {
    preadv, preadv64: (fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t
        => preadv_impl(fd, iov, cnt, off);
    pwritev, pwritev64: (fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t
        => pwritev_impl(fd, iov, cnt, off);
    preadv2, preadv64v2:
        (fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t
        => preadv2_impl(fd, iov, cnt, off, flags);
    pwritev2, pwritev64v2:
        (fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t
        => pwritev2_impl(fd, iov, cnt, off, flags);
    lseek, lseek64: (fd: c_int, off: off64_t, whence: c_int) -> off64_t
        => lseek_impl(fd, off, whence);
}
