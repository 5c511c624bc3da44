//! The library's own descriptors (socket, epoll, eventfd, pipe made while
//! inside our code are moved out of the program's way), and the process:
//! umask, chroot, exec, _exit.

use super::{on_path, AT_FDCWD};
use crate::config;
use crate::guard;
use crate::internal;
use crate::paths::{self, cstr, KPath, Target};
use crate::process;
use crate::real;
use crate::shim::{self, unsupported, R};
use libc::{c_char, c_int, c_uint, mode_t};
use std::ffi::CString;

// ---- our own descriptors

/// A descriptor just made: ours (moved high, see internal.rs) when our own
/// code made it.
fn adopt_if_ours(fd: c_int) -> c_int {
    if guard::busy() {
        internal::adopt(fd)
    } else {
        fd
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: pure forward.
    adopt_if_ours(unsafe { real::socket(domain, ty, proto) })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: pure forward.
    adopt_if_ours(unsafe { real::epoll_create1(flags) })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: pure forward.
    adopt_if_ours(unsafe { real::epoll_create(size) })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn eventfd(initval: c_uint, flags: c_int) -> c_int {
    // SAFETY: pure forward.
    adopt_if_ours(unsafe { real::eventfd(initval, flags) })
}

/// A pair of descriptors just made into `fds` (result `r`): ours when our
/// own code made them.
///
/// # Safety
/// `fds` is NULL or points to two writable ints (pipe's contract).
unsafe fn adopt_pair(r: c_int, fds: *mut c_int) -> c_int {
    if r == 0 && guard::busy() && !fds.is_null() {
        // SAFETY: not NULL, so two ints by this function's contract; the
        // call just filled them.
        unsafe {
            *fds = internal::adopt(*fds);
            *fds.add(1) = internal::adopt(*fds.add(1));
        }
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socketpair(
    domain: c_int,
    ty: c_int,
    proto: c_int,
    sv: *mut c_int,
) -> c_int {
    // SAFETY: pure forward (adopt_pair asks for socketpair's `sv`).
    unsafe { adopt_pair(real::socketpair(domain, ty, proto, sv), sv) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: pure forward (adopt_pair asks for pipe's `fds`).
    unsafe { adopt_pair(real::pipe(fds), fds) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: pure forward (adopt_pair asks for pipe2's `fds`).
    unsafe { adopt_pair(real::pipe2(fds, flags), fds) }
}

// ---- the process

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: pure forward.
    let old = unsafe { real::umask(mask) };
    config::set_umask(mask);
    old
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn chroot(path: *const c_char) -> c_int {
    // SAFETY: pure forward.
    unsafe {
        on_path(
            -1,
            AT_FDCWD,
            path,
            |p| real::chroot(p),
            |_m| Err(unsupported("chroot", "into MadFS")),
        )
    }
}

/// The path to give the kernel for exec: made absolute when the working
/// directory is in MadFS.
///
/// # Safety
/// `path` is NULL (EFAULT) or a C string that outlives the result.
unsafe fn exec_kpath(path: *const c_char) -> R<KPath> {
    // SAFETY: this function's contract.
    let bytes = unsafe { cstr(path)? };
    if !bytes.contains(&b'/') {
        return Ok(KPath::Orig(path));
    }
    match paths::classify_bytes(AT_FDCWD, bytes, path)? {
        Target::Kernel(k) => Ok(k),
        Target::Madfs(_) => Err(unsupported("execve", "running programs stored in MadFS")),
    }
}

/// A NULL-terminated array of pointers into `env` (valid while it lives).
fn env_ptrs(env: &[CString]) -> Vec<*const c_char> {
    let mut v: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    v.push(std::ptr::null());
    v
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::execve(path, argv, envp) };
    }
    shim::run(-1, || {
        // SAFETY: execve's contract: `path` is a C string.
        let k = unsafe { exec_kpath(path)? };
        // SAFETY: execve's contract: `envp` is NULL or a NULL-terminated
        // array of C strings.
        let env = unsafe { process::before_exec(envp) };
        Ok(match env {
            // SAFETY: `k` (a path) and `e` (the environment behind the
            // pointer array, which lives until execve returns) outlive the
            // call; `argv` is the caller's.
            Some(e) => unsafe { real::execve(k.ptr(), argv, env_ptrs(&e).as_ptr()) },
            // SAFETY: `k` outlives the call; `argv` and `envp` are the
            // caller's.
            None => unsafe { real::execve(k.ptr(), argv, envp) },
        })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::execv(path, argv) };
    }
    shim::run(-1, || {
        // SAFETY: execv's contract: `path` is a C string.
        let k = unsafe { exec_kpath(path)? };
        // SAFETY: a NULL environment (only the pending state is pushed).
        unsafe { process::before_exec(std::ptr::null()) };
        // SAFETY: `k` outlives the call; `argv` is the caller's.
        Ok(unsafe { real::execv(k.ptr(), argv) })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::execvp(file, argv) };
    }
    shim::run(-1, || {
        // SAFETY: execvp's contract: `file` is a C string.
        let k = unsafe { exec_kpath(file)? };
        // SAFETY: a NULL environment (only the pending state is pushed).
        unsafe { process::before_exec(std::ptr::null()) };
        // SAFETY: `k` outlives the call; `argv` is the caller's.
        Ok(unsafe { real::execvp(k.ptr(), argv) })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if guard::busy() {
        // SAFETY: pure forward.
        return unsafe { real::execvpe(file, argv, envp) };
    }
    shim::run(-1, || {
        // SAFETY: execvpe's contract: `file` is a C string.
        let k = unsafe { exec_kpath(file)? };
        // SAFETY: execvpe's contract: `envp` is NULL or a NULL-terminated
        // array of C strings.
        let env = unsafe { process::before_exec(envp) };
        Ok(match env {
            // SAFETY: `k` and `e` (behind the pointer array) outlive the
            // call; `argv` is the caller's.
            Some(e) => unsafe { real::execvpe(k.ptr(), argv, env_ptrs(&e).as_ptr()) },
            // SAFETY: `k` outlives the call; `argv` and `envp` are the
            // caller's.
            None => unsafe { real::execvpe(k.ptr(), argv, envp) },
        })
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    if !guard::busy() {
        shim::run_void(process::before_exit);
    }
    // SAFETY: pure forward.
    unsafe { real::_exit(status) };
    #[allow(clippy::empty_loop)]
    loop {}
}

#[cfg_attr(not(test), no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    if !guard::busy() {
        shim::run_void(process::before_exit);
    }
    // SAFETY: pure forward.
    unsafe { real::_Exit(status) };
    #[allow(clippy::empty_loop)]
    loop {}
}
