//! stdio over MadFS: fopen of a MadFS path (and fdopen of a MadFS
//! descriptor) returns a `fopencookie` stream whose read, write, seek and
//! close go to our descriptor, so fread, fwrite, fgets, fprintf, fflush,
//! fseek and ftell work unmodified inside the C library. fileno on such a
//! stream gives the descriptor (the C library would say -1).

use crate::fdtable;
use crate::forklock::ForkMutex;
use crate::ops;
use crate::real;
use crate::shim::{self, Errno, R};
use libc::{c_char, c_int, c_void, FILE};
use std::collections::BTreeMap;

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    fn setvbuf(stream: *mut FILE, buf: *mut c_char, mode: c_int, size: usize) -> c_int;
    fn clearerr(stream: *mut FILE);
}

/// Buffer of our streams: large writes and reads, few requests.
const BUF_BYTES: usize = 1 << 20;

pub struct Stream {
    fd: i32,
    buf: usize,
}

/// Our streams: FILE* -> descriptor and buffer.
static STREAMS: ForkMutex<BTreeMap<usize, Stream>> = ForkMutex::new(BTreeMap::new());

pub fn fd_of(stream: *mut FILE) -> Option<i32> {
    if stream.is_null() {
        return None;
    }
    STREAMS.lock().get(&(stream as usize)).map(|s| s.fd)
}

fn cookie_fd(cookie: *mut c_void) -> i32 {
    cookie as usize as i32
}

unsafe extern "C" fn ck_read(cookie: *mut c_void, buf: *mut c_char, size: usize) -> isize {
    let fd = cookie_fd(cookie);
    shim::run(-1, || {
        let d = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
        // SAFETY: glibc hands a buffer of `size` bytes.
        let b = unsafe { ops::slice_mut(buf.cast(), size)? };
        Ok(ops::read(fd, &d, b)? as isize)
    })
}

unsafe extern "C" fn ck_write(cookie: *mut c_void, buf: *const c_char, size: usize) -> isize {
    let fd = cookie_fd(cookie);
    // glibc takes a short count as an error; 0 reports it.
    shim::run(0, || {
        let d = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
        // SAFETY: glibc hands `size` bytes.
        let b = unsafe { ops::slice(buf.cast(), size)? };
        Ok(ops::write(fd, &d, b)? as isize)
    })
}

unsafe extern "C" fn ck_seek(cookie: *mut c_void, off: *mut i64, whence: c_int) -> c_int {
    let fd = cookie_fd(cookie);
    shim::run(-1, || {
        let d = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
        if off.is_null() {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: glibc passes a valid offset.
        let new = ops::lseek(fd, &d, unsafe { *off }, whence)?;
        // SAFETY: as above.
        unsafe { *off = new };
        Ok(0)
    })
}

unsafe extern "C" fn ck_close(cookie: *mut c_void) -> c_int {
    let fd = cookie_fd(cookie);
    shim::run(-1, || match fdtable::get(fd) {
        Some(d) => ops::close(fd, d),
        // SAFETY: plain close.
        None => Ok(unsafe { real::close(fd) }),
    })
}

/// open(2) flags of an fopen mode ("r", "w+", "ae", "wx", ...).
pub fn mode_flags(mode: &[u8]) -> R<i32> {
    let mut it = mode.iter();
    let mut flags = match it.next() {
        Some(b'r') => libc::O_RDONLY,
        Some(b'w') => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        Some(b'a') => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return Err(Errno(libc::EINVAL)),
    };
    for &c in it {
        match c {
            b'+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => flags |= libc::O_EXCL,
            b'e' => flags |= libc::O_CLOEXEC,
            b',' => break, // ",ccs=" and the like
            _ => {}
        }
    }
    Ok(flags)
}

/// A stream over our descriptor `fd` (which it then owns).
pub fn stream_of(fd: i32, mode: *const c_char) -> R<*mut FILE> {
    let io = CookieIo {
        read: Some(ck_read),
        write: Some(ck_write),
        seek: Some(ck_seek),
        close: Some(ck_close),
    };
    // SAFETY: the cookie is the descriptor number; the mode is the caller's.
    let fp = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if fp.is_null() {
        return Err(Errno(shim::errno()));
    }
    // SAFETY: a buffer that lives until fclose (freed there).
    let buf = unsafe {
        let b = libc::malloc(BUF_BYTES);
        if !b.is_null() {
            setvbuf(fp, b.cast(), libc::_IOFBF, BUF_BYTES);
        }
        b
    };
    STREAMS.lock().insert(
        fp as usize,
        Stream {
            fd,
            buf: buf as usize,
        },
    );
    Ok(fp)
}

/// fopen of a MadFS path.
///
/// # Safety
/// `mode` is a valid C string.
pub unsafe fn fopen(path: &[u8], mode: *const c_char) -> R<*mut FILE> {
    // SAFETY: the caller's contract.
    let flags = mode_flags(unsafe { crate::paths::cstr(mode)? })?;
    let fd = ops::open(path, flags, 0o666)?;
    match stream_of(fd, mode) {
        Ok(fp) => Ok(fp),
        Err(e) => {
            if let Some(d) = fdtable::get(fd) {
                let _ = ops::close(fd, d);
            }
            Err(e)
        }
    }
}

/// fclose: our streams, and C library streams over our descriptors (stdout
/// after a redirection): their buffered bytes are flushed into the memfd
/// and harvested before the C library closes the descriptor itself.
///
/// # Safety
/// `stream` is a valid stream.
pub unsafe fn fclose(stream: *mut FILE) -> R<c_int> {
    let ours = STREAMS.lock().remove(&(stream as usize));
    if let Some(s) = ours {
        // SAFETY: the caller's stream; our close runs inside.
        let r = unsafe { real::fclose(stream) };
        // SAFETY: our buffer, no longer used by the closed stream.
        unsafe { libc::free(s.buf as *mut c_void) };
        return Ok(r);
    }
    // SAFETY: the caller's stream.
    let fd = unsafe { real::fileno(stream) };
    let Some(desc) = fdtable::get(fd) else {
        // SAFETY: as above.
        return Ok(unsafe { real::fclose(stream) });
    };
    // SAFETY: as above.
    unsafe { real::fflush(stream) };
    if desc.capture && !crate::config::foreign_child() {
        let _io = desc.lock_io();
        let _ = desc.sync_offset(fd);
    }
    // SAFETY: as above; this closes `fd` inside the C library.
    let r = unsafe { real::fclose(stream) };
    if !crate::config::foreign_child() {
        drop(fdtable::remove(fd));
        fdtable::release(desc)?;
    }
    Ok(r)
}

/// Before the C library closes a stream's descriptor itself (freopen onto
/// a kernel path): if the descriptor is ours, flush the stream into it,
/// save what it captured, and drop it from the table.
///
/// # Safety
/// `stream` is a valid stream.
pub unsafe fn release_stream_fd(stream: *mut FILE) {
    if fd_of(stream).is_some() || crate::config::foreign_child() {
        return;
    }
    // SAFETY: the caller's stream.
    let fd = unsafe { real::fileno(stream) };
    if let Some(desc) = fdtable::get(fd) {
        // SAFETY: as above.
        unsafe { real::fflush(stream) };
        if desc.capture {
            let _io = desc.lock_io();
            let _ = desc.sync_offset(fd);
        }
        drop(fdtable::remove(fd));
        let _ = fdtable::release(desc);
    }
}

/// freopen onto a MadFS path: the stream's descriptor is replaced by ours
/// (dup2), so a C library stream (stdout) writes into the capturing memfd.
///
/// # Safety
/// `mode` and `stream` are valid.
pub unsafe fn freopen(path: &[u8], mode: *const c_char, stream: *mut FILE) -> R<*mut FILE> {
    if fd_of(stream).is_some() {
        return Err(shim::unsupported("freopen", "of a MadFS stream"));
    }
    // SAFETY: the caller's stream.
    unsafe { real::fflush(stream) };
    // SAFETY: as above.
    let target = unsafe { real::fileno(stream) };
    if target < 0 {
        return Err(shim::unsupported(
            "freopen",
            "of a stream without a descriptor",
        ));
    }
    // SAFETY: the caller's contract.
    let flags = mode_flags(unsafe { crate::paths::cstr(mode)? })?;
    let fd = ops::open(path, flags & !libc::O_CLOEXEC, 0o666)?;
    let r = ops::dup3(fd, target, 0, true);
    if let Some(d) = fdtable::get(fd) {
        let _ = ops::close(fd, d);
    }
    r?;
    // SAFETY: the caller's stream.
    unsafe { clearerr(stream) };
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_map_to_open_flags() {
        assert_eq!(mode_flags(b"r").unwrap(), libc::O_RDONLY);
        assert_eq!(
            mode_flags(b"w").unwrap(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC
        );
        assert_eq!(
            mode_flags(b"a+e").unwrap(),
            libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC
        );
        assert_eq!(
            mode_flags(b"wbx").unwrap(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL
        );
        assert_eq!(mode_flags(b"r+,ccs=UTF-8").unwrap(), libc::O_RDWR);
        assert!(mode_flags(b"").is_err());
        assert!(mode_flags(b"q").is_err());
    }
}
