//! Directory streams (opendir, readdir, scandir...), getdents64, and the
//! working directory (chdir, fchdir, getcwd).

use super::{check_fortified, on_path, AT_FDCWD};
use crate::dirs;
use crate::fdtable::{self, Kind};
use crate::guard;
use crate::meta;
use crate::ops;
use crate::paths;
use crate::real;
use crate::shim::{self, unsupported, Errno, R};
use libc::{c_char, c_int, c_long, c_void, dirent64, size_t, ssize_t, DIR};

/// A call on a directory stream: `$real` (the real function with the
/// caller's arguments) when it is not one of ours, else `$ours`.
macro_rules! on_dir {
    ($dir:expr, $fail:expr, $real:expr, $ours:expr) => {{
        let dir: *mut DIR = $dir;
        if guard::busy() || !dirs::is_ours(dir) {
            #[allow(unused_unsafe)]
            // SAFETY: pure forward (see "Safety" in exports/mod.rs).
            return unsafe { $real };
        }
        shim::run($fail, || shim::ours(|| $ours))
    }};
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    // SAFETY: pure forward.
    unsafe {
        on_path(
            std::ptr::null_mut(),
            AT_FDCWD,
            path,
            |p| real::opendir(p),
            |m| {
                let fd = ops::open(m, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
                dirs::open_stream(fd).inspect_err(|_| {
                    if let Some(d) = fdtable::get(fd) {
                        let _ = ops::close(fd, d);
                    }
                })
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    on_fd!(fd, std::ptr::null_mut(), real::fdopendir(fd), |d| {
        if d.kind != Kind::Dir {
            return Err(Errno(libc::ENOTDIR));
        }
        dirs::open_stream(fd)
    })
}

/// readdir(3) (the 64-bit entry).
///
/// # Safety
/// `dir` is a stream from opendir, not yet closed.
unsafe fn readdir_impl(dir: *mut DIR) -> *mut dirent64 {
    on_dir!(
        dir,
        std::ptr::null_mut(),
        real::readdir64(dir),
        dirs::readdir(dir)
    )
}

/// readdir_r(3).
///
/// # Safety
/// As `readdir_impl`; `entry` and `result` are writable.
unsafe fn readdir_r_impl(dir: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int {
    on_dir!(
        dir,
        libc::EIO,
        real::readdir64_r(dir, entry, result),
        // SAFETY: this function's contract: `entry` and `result` writable.
        Ok(unsafe { dirs::readdir_r(dir, entry, result) })
    )
}

aliases! {
    readdir, readdir64: (dir: *mut DIR) -> *mut dirent64 => readdir_impl(dir);
    readdir_r, readdir64_r:
        (dir: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int
        => readdir_r_impl(dir, entry, result);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closedir(dir: *mut DIR) -> c_int {
    on_dir!(dir, -1, real::closedir(dir), dirs::closedir(dir))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dirfd(dir: *mut DIR) -> c_int {
    on_dir!(dir, -1, real::dirfd(dir), Ok(dirs::dirfd(dir)))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn telldir(dir: *mut DIR) -> c_long {
    on_dir!(dir, -1, real::telldir(dir), Ok(dirs::telldir(dir)))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn seekdir(dir: *mut DIR, pos: c_long) {
    on_dir!(dir, (), real::seekdir(dir, pos), {
        dirs::seekdir(dir, pos);
        Ok(())
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rewinddir(dir: *mut DIR) {
    on_dir!(dir, (), real::rewinddir(dir), {
        dirs::rewinddir(dir);
        Ok(())
    })
}

type ScanFilter = Option<unsafe extern "C" fn(*const dirent64) -> c_int>;
type ScanCompar = Option<unsafe extern "C" fn(*mut *const dirent64, *mut *const dirent64) -> c_int>;

/// scandir(3).
///
/// # Safety
/// scandir's contract: `path` is NULL or a C string, `list` is writable,
/// `filter` and `compar` are NULL or valid functions.
unsafe fn scandir_impl(
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    // SAFETY: pure forward (dirs::scandir asks for scandir's contract).
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::scandir64(p, list, filter, compar),
            |m| dirs::scandir(m, list, filter, compar),
        )
    }
}

aliases! {
    scandir, scandir64: (
        path: *const c_char,
        list: *mut *mut *mut dirent64,
        filter: ScanFilter,
        compar: ScanCompar,
    ) -> c_int
        => scandir_impl(path, list, filter, compar);
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    on_fd!(fd, -1, real::getdents64(fd, buf, n), |_d| {
        // SAFETY: getdents64's contract: `buf` is writable for `n` bytes.
        Ok(dirs::getdents64(fd, unsafe { ops::slice_mut(buf, n)? })? as ssize_t)
    })
}

// ---- the working directory

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: pure forward.
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| {
                let r = real::chdir(p);
                if r == 0 {
                    paths::invalidate_kernel_cwd();
                    if paths::vcwd().is_some() {
                        paths::set_vcwd(None);
                    }
                }
                r
            },
            |m| {
                let a = meta::stat(m, true)?;
                if a.kind != madfs_client::FileKind::Dir {
                    return Err(Errno(libc::ENOTDIR));
                }
                meta::access(m, libc::X_OK, 0)?;
                paths::set_vcwd(Some(ops::clean(m)));
                Ok(0)
            },
        )
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::fchdir(fd) };
    }
    shim::run(-1, || match fdtable::get(fd) {
        Some(d) => {
            if d.kind != Kind::Dir {
                return Err(Errno(libc::ENOTDIR));
            }
            let p = d.path.clone().ok_or_else(|| {
                unsupported("fchdir", "a directory fd inherited without its path")
            })?;
            paths::set_vcwd(Some(p));
            Ok(0)
        }
        None => {
            // SAFETY: pure forward.
            let r = unsafe { real::fchdir(fd) };
            if r == 0 {
                paths::invalidate_kernel_cwd();
                if paths::vcwd().is_some() {
                    paths::set_vcwd(None);
                }
            }
            Ok(r)
        }
    })
}

/// The virtual working directory into `buf` (getcwd's conventions).
///
/// # Safety
/// getcwd's contract: `buf` is NULL or writable for `size` bytes.
unsafe fn vcwd_into(v: &[u8], buf: *mut c_char, size: size_t) -> R<*mut c_char> {
    let s = paths::outside_form(v);
    let need = s.len() + 1;
    let dst = if buf.is_null() {
        let n = if size == 0 { need } else { size };
        if n < need {
            return Err(Errno(libc::ERANGE));
        }
        // SAFETY: malloc of a nonzero size; NULL is checked.
        let p = unsafe { libc::malloc(n) }.cast::<c_char>();
        if p.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        p
    } else {
        if size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        if size < need {
            return Err(Errno(libc::ERANGE));
        }
        buf
    };
    // SAFETY: `dst` is writable for at least `need` = len + 1 bytes (our
    // allocation, or the caller's buffer of `size` >= need bytes), and does
    // not overlap `s`, which we own.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), dst, s.len());
        *dst.add(s.len()) = 0;
    }
    Ok(dst)
}

/// getcwd(3).
///
/// # Safety
/// As `vcwd_into`.
unsafe fn getcwd_impl(buf: *mut c_char, size: size_t) -> *mut c_char {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::getcwd(buf, size) };
    }
    shim::run(std::ptr::null_mut(), || match paths::vcwd() {
        // SAFETY: pure forward.
        Some(v) => unsafe { vcwd_into(&v, buf, size) },
        // SAFETY: pure forward.
        None => Ok(unsafe { real::getcwd(buf, size) }),
    })
}

/// __getcwd_chk: getcwd after the fortified check.
///
/// # Safety
/// As `getcwd_impl`.
unsafe fn getcwd_chk(buf: *mut c_char, size: size_t, buflen: size_t) -> *mut c_char {
    check_fortified(size, buflen);
    // SAFETY: pure forward.
    unsafe { getcwd_impl(buf, size) }
}

aliases! {
    getcwd: (buf: *mut c_char, size: size_t) -> *mut c_char => getcwd_impl(buf, size);
    __getcwd_chk: (buf: *mut c_char, size: size_t, buflen: size_t) -> *mut c_char
        => getcwd_chk(buf, size, buflen);
    get_current_dir_name: () -> *mut c_char => getcwd_impl(std::ptr::null_mut(), 0);
}
