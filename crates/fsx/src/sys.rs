//! The system calls the exerciser makes, as thin wrappers over libc (not
//! std::fs): each is exactly the one call a C program would make, so the
//! same code tests a kernel file system (a FUSE mount, a local disk) and
//! the interception library of `madfs run`, which interposes these libc
//! entry points. Errors carry the call, the path and the reason.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub type SysResult<T> = Result<T, String>;

fn last_error(what: &str, path: &Path) -> String {
    format!("{what} {}: {}", path.display(), io::Error::last_os_error())
}

/// A path as C wants it.
pub fn c_path(path: &Path) -> SysResult<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains a NUL byte", path.display()))
}

/// An open descriptor of the exercised file, closed when dropped (errors
/// of an explicit close are reported by `close`).
#[derive(Debug)]
pub struct Fd {
    fd: libc::c_int,
    path: PathBuf,
}

impl Fd {
    /// open(2) read-write, creating and emptying the file if `create`.
    pub fn open(path: &Path, create: bool) -> SysResult<Fd> {
        let c = c_path(path)?;
        let mut flags = libc::O_RDWR | libc::O_CLOEXEC;
        if create {
            flags |= libc::O_CREAT | libc::O_TRUNC;
        }
        // SAFETY: a valid NUL-terminated path; mode is read only with O_CREAT.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            return Err(last_error("open", path));
        }
        Ok(Fd {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// open(2) read-only, for the final read-back after close.
    pub fn open_read_only(path: &Path) -> SysResult<Fd> {
        let c = c_path(path)?;
        // SAFETY: a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(last_error("open (read-only)", path));
        }
        Ok(Fd {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// close(2), reporting its error (on network file systems the one of a
    /// write that failed after it was answered).
    pub fn close(mut self) -> SysResult<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        // SAFETY: our descriptor, closed once (Drop sees -1).
        if unsafe { libc::close(fd) } != 0 {
            return Err(last_error("close", &self.path));
        }
        Ok(())
    }

    /// pwrite(2) all of `data` at `offset` (continuing after short writes).
    pub fn pwrite_all(&self, offset: u64, data: &[u8]) -> SysResult<()> {
        let mut done = 0usize;
        while done < data.len() {
            let rest = &data[done..];
            // SAFETY: `rest` is valid for reads of its length.
            let n = unsafe {
                libc::pwrite(
                    self.fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!(
                    "pwrite {} (0x{:x} bytes at 0x{:x}): {e}",
                    self.path.display(),
                    rest.len(),
                    offset + done as u64
                ));
            }
            if n == 0 {
                return Err(format!(
                    "pwrite {} (0x{:x} bytes at 0x{:x}) wrote nothing",
                    self.path.display(),
                    rest.len(),
                    offset + done as u64
                ));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// pread(2) up to `len` bytes at `offset`, continuing after short reads
    /// until `len` or the end of file.
    pub fn pread_full(&self, offset: u64, len: u64) -> SysResult<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: `rest` is valid for writes of its length.
            let n = unsafe {
                libc::pread(
                    self.fd,
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!(
                    "pread {} (0x{:x} bytes at 0x{:x}): {e}",
                    self.path.display(),
                    rest.len(),
                    offset + done as u64
                ));
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// The size fstat(2) reports.
    pub fn fstat_size(&self) -> SysResult<u64> {
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our descriptor and a valid stat buffer.
        if unsafe { libc::fstat(self.fd, &mut st) } != 0 {
            return Err(last_error("fstat", &self.path));
        }
        Ok(st.st_size as u64)
    }

    /// Where lseek(2) with SEEK_END puts the offset (the size as the file
    /// system's llseek sees it).
    pub fn seek_end(&self) -> SysResult<u64> {
        // SAFETY: our descriptor.
        let r = unsafe { libc::lseek(self.fd, 0, libc::SEEK_END) };
        if r < 0 {
            return Err(last_error("lseek(SEEK_END)", &self.path));
        }
        Ok(r as u64)
    }

    /// ftruncate(2).
    pub fn ftruncate(&self, size: u64) -> SysResult<()> {
        // SAFETY: our descriptor.
        if unsafe { libc::ftruncate(self.fd, size as libc::off_t) } != 0 {
            return Err(format!(
                "ftruncate {} to 0x{size:x}: {}",
                self.path.display(),
                io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// posix_fadvise(POSIX_FADV_DONTNEED) over the whole file.
    pub fn drop_cache(&self) -> SysResult<()> {
        // SAFETY: our descriptor. posix_fadvise returns the error number.
        let e = unsafe { libc::posix_fadvise(self.fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        if e != 0 {
            return Err(format!(
                "posix_fadvise(DONTNEED) {}: {}",
                self.path.display(),
                io::Error::from_raw_os_error(e)
            ));
        }
        Ok(())
    }

    /// fsync(2).
    pub fn fsync(&self) -> SysResult<()> {
        // SAFETY: our descriptor.
        if unsafe { libc::fsync(self.fd) } != 0 {
            return Err(last_error("fsync", &self.path));
        }
        Ok(())
    }

    /// Read `len` bytes at `offset` through a shared read-only mapping; if
    /// `tail` is given (the read reaches the end of file, `tail` being the
    /// size), the rest of the last page, past the end of file, is returned
    /// too (mmap(2) says it reads as zeros).
    pub fn map_read(&self, offset: u64, len: u64, tail: Option<u64>) -> SysResult<Vec<u8>> {
        let page = page_size();
        let map_start = offset - offset % page;
        let mut map_end = offset + len;
        if let Some(size) = tail {
            map_end = size.div_ceil(page) * page;
        }
        let map = Mapping::new(self, map_start, map_end - map_start, false)?;
        let from = (offset - map_start) as usize;
        Ok(map.bytes()[from..].to_vec())
    }

    /// Write `data` at `offset` through a shared writable mapping (the file
    /// must already be long enough), msync(MS_SYNC) and unmap.
    pub fn map_write(&self, offset: u64, data: &[u8]) -> SysResult<()> {
        let page = page_size();
        let map_start = offset - offset % page;
        let map_len = offset + data.len() as u64 - map_start;
        let mut map = Mapping::new(self, map_start, map_len, true)?;
        let from = (offset - map_start) as usize;
        map.bytes_mut()[from..].copy_from_slice(data);
        map.sync()
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// truncate(2) by path.
pub fn truncate_path(path: &Path, size: u64) -> SysResult<()> {
    let c = c_path(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::truncate(c.as_ptr(), size as libc::off_t) } != 0 {
        return Err(format!(
            "truncate {} to 0x{size:x}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The size stat(2) by path reports.
pub fn stat_size(path: &Path) -> SysResult<u64> {
    let c = c_path(path)?;
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and stat buffer.
    if unsafe { libc::stat(c.as_ptr(), &mut st) } != 0 {
        return Err(last_error("stat", path));
    }
    Ok(st.st_size as u64)
}

/// unlink(2).
pub fn unlink(path: &Path) -> SysResult<()> {
    let c = c_path(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::unlink(c.as_ptr()) } != 0 {
        return Err(last_error("unlink", path));
    }
    Ok(())
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// A MAP_SHARED mapping of part of a file, unmapped when dropped.
struct Mapping<'a> {
    fd: &'a Fd,
    addr: *mut libc::c_void,
    len: usize,
    offset: u64,
}

impl<'a> Mapping<'a> {
    fn new(fd: &'a Fd, offset: u64, len: u64, writable: bool) -> SysResult<Mapping<'a>> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel; our descriptor.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot,
                libc::MAP_SHARED,
                fd.fd,
                offset as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!(
                "mmap {} ({}, 0x{len:x} bytes at 0x{offset:x}): {}",
                fd.path.display(),
                if writable {
                    "shared, writable"
                } else {
                    "shared, read-only"
                },
                io::Error::last_os_error()
            ));
        }
        Ok(Mapping {
            fd,
            addr,
            len: len as usize,
            offset,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long and readable (a page the
        // file does not back raises SIGBUS: see `install_sigbus_report`).
        unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes long and writable (made so by
        // `new` with `writable`); it is ours alone.
        unsafe { std::slice::from_raw_parts_mut(self.addr.cast::<u8>(), self.len) }
    }

    fn sync(&self) -> SysResult<()> {
        // SAFETY: our mapping.
        if unsafe { libc::msync(self.addr, self.len, libc::MS_SYNC) } != 0 {
            return Err(format!(
                "msync {} (0x{:x} bytes at 0x{:x}): {}",
                self.fd.path.display(),
                self.len,
                self.offset,
                io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// The operation in progress, for the SIGBUS report (a signal handler can
/// only read plain atomics).
static CURRENT_OP: AtomicU64 = AtomicU64::new(0);
static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);

/// Record the operation about to run, for a SIGBUS report.
pub fn set_current_op(seed: u64, op: u64) {
    CURRENT_SEED.store(seed, Ordering::Relaxed);
    CURRENT_OP.store(op, Ordering::Relaxed);
}

/// Install the SIGBUS reporter (idempotent). Touching a mapped page past
/// what the kernel thinks is the end of file raises SIGBUS; on a file
/// system whose size is wrong that is how a mapped access fails, and
/// without this the process would die with no word of seed or operation.
pub fn install_sigbus_report() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: a handler that only calls async-signal-safe functions
        // (write, _exit) and reads atomics.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(_sig: libc::c_int) {
    let mut buf = [0u8; 256];
    let mut n = 0;
    let mut put = |s: &[u8]| {
        for &b in s {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
    };
    put(b"fsx: FAILED: SIGBUS in a mapped access at op #");
    put_number(&mut put, CURRENT_OP.load(Ordering::Relaxed));
    put(b" (seed ");
    put_number(&mut put, CURRENT_SEED.load(Ordering::Relaxed));
    put(b"): the mapping reached past the kernel's end of file\n");
    // SAFETY: write and _exit are async-signal-safe.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
        libc::_exit(3);
    }
}

/// Decimal digits without allocating (inside a signal handler).
fn put_number(put: &mut impl FnMut(&[u8]), mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(&digits[i..]);
}
