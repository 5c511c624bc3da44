//! The interposed C functions. Each one goes straight to the real function
//! when the calling thread is already inside our code (reentrancy), when the
//! descriptor is not ours, or when the path is not under the prefix;
//! otherwise it runs the MadFS implementation inside `shim::run` (panics
//! caught, errors as errno).
//!
//! One file per family: open.rs (open, creat, close), readwrite.rs (read,
//! write, their vector and positioned forms, lseek), stat.rs (stat,
//! statx, statfs, statvfs, access), namespace.rs (unlink, mkdir, rename,
//! link, symlink, readlink, mknod), attrs.rs (modes, owners, times),
//! directories.rs (DIR streams, getdents64, the working directory),
//! descriptors.rs (truncate, sync, dup, fcntl, locks, advice, allocation,
//! copies between descriptors, mmap), xattr.rs, streams.rs (fopen and the
//! other FILE calls), names.rs (temporary files, realpath, pathconf),
//! proc.rs (the library's own descriptors, umask, chroot, exec, _exit).
//! This file holds what they share: `on_path`, `on_two_paths`, `on_fd!`
//! and `aliases!`.
//!
//! # Safety
//!
//! Every exported function is `unsafe extern "C"`: its callers are C
//! programs, bound by the C API of the function they call. A path is NULL
//! or a NUL-terminated string; a buffer given with a length is valid for
//! that many bytes (writable when the function fills it); a `struct stat`,
//! `statfs`, `timespec[2]`... pointer points to one; a `DIR *` or `FILE *`
//! came from the C library or from us and is not yet closed. All of it
//! stays valid for the duration of the call, no longer.
//!
//! **Pure forwards.** Most unsafe blocks here only hand the caller's C
//! arguments on: to the real function (`real::*`, the next definition of
//! the same name, found with dlsym RTLD_NEXT), to another of our exports,
//! or to an internal implementation whose `# Safety` section asks for what
//! the C API already promises (`on_path`, `open_common`, `stat_common`...),
//! adding at most constants (AT_FDCWD, a flag, a zero mode) or a path that
//! we made and that outlives the call (`KPath`). Such a call is sound
//! because the callee needs exactly the caller's obligations: the same
//! pointers with the same validity, lengths and lifetimes, none kept past
//! the call. Those blocks say `// SAFETY: pure forward.` and nothing more;
//! the alias families (`aliases!`) and the kernel branches of `on_fd!` are
//! all pure forwards. Every other unsafe block says why it is sound.

#![allow(clippy::missing_safety_doc)]

use crate::guard;
use crate::paths::{classify, Target};
use crate::shim::{self, Errno, R};
use libc::{c_char, c_int};

const AT_FDCWD: c_int = libc::AT_FDCWD;

/// Export several C names for one call, each a pure forward (see "Safety"
/// above) to one expression over its arguments:
/// `name, name64: (args) -> ret => body;`.
macro_rules! aliases {
    () => {};
    ($($name:ident),+ : $args:tt -> $ret:ty => $body:expr; $($rest:tt)*) => {
        $(
            #[cfg_attr(not(test), no_mangle)]
            pub unsafe extern "C" fn $name $args -> $ret {
                // SAFETY: pure forward (see "Safety" in exports/mod.rs).
                unsafe { $body }
            }
        )+
        aliases!($($rest)*);
    };
}

/// A call on a descriptor: `$real` (the real function with the caller's
/// arguments) when it is not ours, else `$body` with its description.
macro_rules! on_fd {
    ($fd:expr, $fail:expr, $real:expr, |$d:ident| $body:expr) => {{
        let fd: c_int = $fd;
        if crate::guard::busy() || !crate::fdtable::maybe_ours(fd) {
            #[allow(unused_unsafe)]
            // SAFETY: pure forward (see "Safety" in exports/mod.rs).
            return unsafe { $real };
        }
        crate::shim::run($fail, || match crate::fdtable::get(fd) {
            #[allow(unused_unsafe)]
            // SAFETY: pure forward (see "Safety" in exports/mod.rs).
            None => Ok(unsafe { $real }),
            Some($d) => crate::shim::ours(|| $body),
        })
    }};
}

mod attrs;
mod descriptors;
mod directories;
mod names;
mod namespace;
mod open;
mod proc;
mod readwrite;
mod stat;
mod streams;
mod xattr;

/// A call on one path: the kernel function (given the path to use) or the
/// MadFS one.
///
/// # Safety
/// `path` is NULL or a C string valid for the call. `kernel` gets `path`
/// itself or a path we made, valid until it returns.
unsafe fn on_path<T>(
    fail: T,
    dirfd: c_int,
    path: *const c_char,
    kernel: impl FnOnce(*const c_char) -> T,
    madfs: impl FnOnce(&[u8]) -> R<T>,
) -> T {
    if guard::busy() {
        return kernel(path);
    }
    shim::run(fail, || {
        // SAFETY: the caller's path (this function's contract).
        match unsafe { classify(dirfd, path)? } {
            Target::Kernel(k) => Ok(kernel(k.ptr())),
            Target::Madfs(p) => shim::ours(|| madfs(&p)),
        }
    })
}

/// A call on two paths: both in MadFS, both in the kernel, or EXDEV.
///
/// # Safety
/// As `on_path`, for both paths.
#[allow(clippy::too_many_arguments)]
unsafe fn on_two_paths<T>(
    fail: T,
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    kernel: impl FnOnce(*const c_char, *const c_char) -> T,
    madfs: impl FnOnce(&[u8], &[u8]) -> R<T>,
) -> T {
    if guard::busy() {
        return kernel(p1, p2);
    }
    shim::run(fail, || {
        // SAFETY: the caller's paths (this function's contract).
        let (a, b) = unsafe { (classify(d1, p1)?, classify(d2, p2)?) };
        match (a, b) {
            (Target::Kernel(a), Target::Kernel(b)) => Ok(kernel(a.ptr(), b.ptr())),
            (Target::Madfs(a), Target::Madfs(b)) => shim::ours(|| madfs(&a, &b)),
            _ => Err(Errno(libc::EXDEV)),
        }
    })
}

/// Whether `path` is the empty string (for AT_EMPTY_PATH).
///
/// # Safety
/// `path` is NULL or a C string.
unsafe fn is_empty_path(path: *const c_char) -> bool {
    // SAFETY: not NULL, so a C string by the contract: its first byte is
    // readable.
    !path.is_null() && unsafe { *path } == 0
}

/// The fortified (`__*_chk`) variants: a buffer smaller than the length
/// asked for is a bug the C library aborts on.
fn check_fortified(len: usize, buflen: usize) {
    if len > buflen {
        // SAFETY: abort takes no arguments and does not return.
        unsafe { libc::abort() };
    }
}
