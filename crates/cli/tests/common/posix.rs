//! System calls by path with exact errno results, for the POSIX
//! conformance tests of the mount, and `as_user`: one system call made by
//! another user (uid/gid/groups) in a forked child, with its errno.
//!
//! Include it next to `common` with
//! `#[path = "common/posix.rs"] mod posix;`.
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The unprivileged user of the permission tests (nobody/nogroup).
pub const NOBODY: u32 = 65534;
pub const NOGROUP: u32 = 65534;

/// A path as a C string.
pub fn c(p: impl AsRef<Path>) -> CString {
    CString::new(p.as_ref().as_os_str().as_bytes()).expect("path with NUL")
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// 0 for a non-negative result, else errno (for system call results).
pub fn rc(ret: libc::c_int) -> i32 {
    if ret < 0 {
        errno()
    } else {
        0
    }
}

/// The name of an errno, for messages.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        0 => "OK",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EMLINK => "EMLINK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOTCONN => "ENOTCONN",
        libc::ESTALE => "ESTALE",
        libc::EPROTO => "EPROTO",
        libc::ETXTBSY => "ETXTBSY",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

/// Assert that a call gave `want` (0: success, else an errno).
#[track_caller]
pub fn expect(got: i32, want: i32, what: &str) {
    assert!(
        got == want,
        "{what}: expected {}, got {}",
        errno_name(want),
        errno_name(got)
    );
}

/// Assert that an `io::Result` failed with `want`.
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {}, got Ok({v:?})", errno_name(want)),
        Err(e) => assert!(
            e.raw_os_error() == Some(want),
            "{what}: expected {}, got {e}",
            errno_name(want)
        ),
    }
}

/// `io::Result` to 0 / errno.
pub fn code<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

// ---- calls by path: 0 or errno -----------------------------------------

/// open(2); the descriptor (closed by the caller) or errno.
pub fn open(p: &Path, flags: i32, mode: u32) -> Result<i32, i32> {
    let cp = c(p);
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(cp.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// open(2) and close at once: 0 or errno.
pub fn open_rc(p: &Path, flags: i32, mode: u32) -> i32 {
    match open(p, flags, mode) {
        Ok(fd) => {
            close(fd);
            0
        }
        Err(e) => e,
    }
}

pub fn close(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd) };
}

pub fn mkdir(p: &Path, mode: u32) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::mkdir(cp.as_ptr(), mode as libc::mode_t) })
}

pub fn rmdir(p: &Path) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::rmdir(cp.as_ptr()) })
}

pub fn unlink(p: &Path) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::unlink(cp.as_ptr()) })
}

pub fn link(from: &Path, to: &Path) -> i32 {
    let (a, b) = (c(from), c(to));
    // SAFETY: valid C strings.
    rc(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

pub fn symlink(target: impl AsRef<Path>, linkpath: &Path) -> i32 {
    let (a, b) = (c(target), c(linkpath));
    // SAFETY: valid C strings.
    rc(unsafe { libc::symlink(a.as_ptr(), b.as_ptr()) })
}

pub fn rename(from: &Path, to: &Path) -> i32 {
    let (a, b) = (c(from), c(to));
    // SAFETY: valid C strings.
    rc(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

/// renameat2(2) with `flags` (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (c(from), c(to));
    // SAFETY: valid C strings; the raw system call (older glibc lacks the wrapper).
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        errno()
    } else {
        0
    }
}

pub fn chmod(p: &Path, mode: u32) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::chmod(cp.as_ptr(), mode as libc::mode_t) })
}

/// chown(2); `u32::MAX` (-1) leaves that id.
pub fn chown(p: &Path, uid: u32, gid: u32) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::chown(cp.as_ptr(), uid, gid) })
}

pub fn lchown(p: &Path, uid: u32, gid: u32) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::lchown(cp.as_ptr(), uid, gid) })
}

pub fn truncate(p: &Path, len: i64) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::truncate(cp.as_ptr(), len) })
}

pub fn ftruncate(fd: i32, len: i64) -> i32 {
    // SAFETY: plain system call.
    rc(unsafe { libc::ftruncate(fd, len) })
}

pub fn access(p: &Path, mode: i32) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::access(cp.as_ptr(), mode) })
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> i32 {
    let cp = c(p);
    // SAFETY: a valid C string.
    rc(unsafe { libc::mknod(cp.as_ptr(), mode as libc::mode_t, dev as libc::dev_t) })
}

/// A timespec for utimensat: seconds and nanoseconds, or UTIME_NOW / UTIME_OMIT
/// in `nsec`.
pub fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as _,
    }
}

/// utimensat(2) (AT_FDCWD); `times` None sets both to now; `flags` e.g.
/// AT_SYMLINK_NOFOLLOW.
pub fn utimensat(p: &Path, times: Option<[libc::timespec; 2]>, flags: i32) -> i32 {
    let cp = c(p);
    let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: a valid C string and a null or two-element array.
    rc(unsafe { libc::utimensat(libc::AT_FDCWD, cp.as_ptr(), ptr, flags) })
}

/// write(2) of all of `buf` at the descriptor's offset; 0 or errno.
pub fn write_fd(fd: i32, buf: &[u8]) -> i32 {
    // SAFETY: a valid buffer.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        errno()
    } else {
        assert_eq!(n as usize, buf.len(), "short write");
        0
    }
}

/// read(2) of up to `len` bytes at the descriptor's offset.
pub fn read_fd(fd: i32, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    // SAFETY: a valid buffer of len bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn lseek(fd: i32, off: i64, whence: i32) -> i64 {
    // SAFETY: plain system call.
    unsafe { libc::lseek(fd, off, whence) }
}

/// lstat, panicking on failure.
#[track_caller]
pub fn lstat(p: &Path) -> std::fs::Metadata {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()))
}

/// stat (following symlinks), panicking on failure.
#[track_caller]
pub fn stat(p: &Path) -> std::fs::Metadata {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
}

/// Does `p` exist (lstat succeeds)?
pub fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// lstat: 0 or errno.
pub fn lstat_rc(p: &Path) -> i32 {
    code(std::fs::symlink_metadata(p))
}

/// stat: 0 or errno.
pub fn stat_rc(p: &Path) -> i32 {
    code(std::fs::metadata(p))
}

/// The permission bits (07777) of `p` (lstat).
#[track_caller]
pub fn perm(p: &Path) -> u32 {
    lstat(p).mode() & 0o7777
}

/// Create a file with `content` (as the calling user).
#[track_caller]
pub fn put(p: &Path, content: &[u8]) {
    std::fs::write(p, content).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

// ---- another user -------------------------------------------------------

/// Run `f` as user `uid`, group `gid`, supplementary `groups`, in a forked
/// child; `f` makes system calls and returns 0 or an errno (< 256), which is
/// what `as_user` returns.
///
/// The child of a multi-threaded process may only make async-signal-safe
/// calls: `f` must not allocate, lock or print. Build every C string
/// before (`c(path)`), and call `libc` directly.
pub fn as_user<F: FnOnce() -> i32>(uid: u32, gid: u32, groups: &[u32], f: F) -> i32 {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    // SAFETY: the child only makes raw system calls and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls; the child never returns.
        unsafe {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                libc::_exit(251);
            }
            if libc::setresgid(gid, gid, gid) != 0 {
                libc::_exit(252);
            }
            if libc::setresuid(uid, uid, uid) != 0 {
                libc::_exit(253);
            }
            let r = f();
            libc::_exit(r & 0xff);
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        assert!(
            r < 0 && errno() == libc::EINTR,
            "waitpid: {}",
            std::io::Error::last_os_error()
        );
    }
    assert!(
        libc::WIFEXITED(status),
        "as_user child died: status {status:#x}"
    );
    let code = libc::WEXITSTATUS(status);
    assert!(
        code < 250,
        "as_user could not switch to {uid}:{gid} ({code})"
    );
    code
}

/// As nobody:nogroup with no supplementary groups.
pub fn as_nobody<F: FnOnce() -> i32>(f: F) -> i32 {
    as_user(NOBODY, NOGROUP, &[], f)
}

// Allocation-free system calls for `as_user` closures (C strings prepared
// by the caller).

pub fn u_open(p: &CString, flags: i32, mode: u32) -> i32 {
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(p.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        errno()
    } else {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        0
    }
}

/// Open `p` for writing and write `data` at its offset.
pub fn u_write(p: &CString, flags: i32, data: &[u8]) -> i32 {
    // SAFETY: a valid C string and buffer.
    unsafe {
        let fd = libc::open(p.as_ptr(), flags, 0o644);
        if fd < 0 {
            return errno();
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let e = if n < 0 { errno() } else { 0 };
        if libc::close(fd) != 0 && e == 0 {
            return errno();
        }
        e
    }
}

pub fn u_mkdir(p: &CString, mode: u32) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::mkdir(p.as_ptr(), mode as libc::mode_t) })
}

pub fn u_unlink(p: &CString) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::unlink(p.as_ptr()) })
}

pub fn u_rmdir(p: &CString) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::rmdir(p.as_ptr()) })
}

pub fn u_rename(a: &CString, b: &CString) -> i32 {
    // SAFETY: valid C strings.
    rc(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

pub fn u_link(a: &CString, b: &CString) -> i32 {
    // SAFETY: valid C strings.
    rc(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

pub fn u_symlink(target: &CString, p: &CString) -> i32 {
    // SAFETY: valid C strings.
    rc(unsafe { libc::symlink(target.as_ptr(), p.as_ptr()) })
}

pub fn u_chmod(p: &CString, mode: u32) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })
}

pub fn u_chown(p: &CString, uid: u32, gid: u32) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::chown(p.as_ptr(), uid, gid) })
}

pub fn u_truncate(p: &CString, len: i64) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::truncate(p.as_ptr(), len) })
}

pub fn u_access(p: &CString, mode: i32) -> i32 {
    // SAFETY: a valid C string.
    rc(unsafe { libc::access(p.as_ptr(), mode) })
}

pub fn u_stat(p: &CString) -> i32 {
    // SAFETY: a valid C string and a stat buffer on the stack.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        rc(libc::stat(p.as_ptr(), &mut st))
    }
}

pub fn u_utimensat(p: &CString, times: Option<&[libc::timespec; 2]>) -> i32 {
    let ptr = times.map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: a valid C string and a null or two-element array.
    rc(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ptr, 0) })
}

/// opendir + readdir to the end: 0 or errno.
pub fn u_readdir(p: &CString) -> i32 {
    // SAFETY: a valid C string; the stream is closed.
    unsafe {
        let d = libc::opendir(p.as_ptr());
        if d.is_null() {
            return errno();
        }
        *libc::__errno_location() = 0;
        while !libc::readdir(d).is_null() {}
        let e = errno();
        libc::closedir(d);
        e
    }
}
