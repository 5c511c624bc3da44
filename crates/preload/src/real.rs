//! The functions we interpose, as the C library (or whatever comes after us
//! in the lookup order) defines them: looked up once with
//! `dlsym(RTLD_NEXT, name)` and cached.
//!
//! Variadic C functions (`open`, `openat`, `fcntl`) are declared here, as in
//! our own definitions, with their optional argument as a plain parameter:
//! on x86-64 (and aarch64) Linux a variadic argument travels in the same
//! register as a fixed one, so passing or reading one that the caller did not
//! supply is harmless (the callee ignores it).

#![allow(clippy::missing_safety_doc)]

use libc::{
    c_char, c_int, c_long, c_uint, c_void, dirent64, gid_t, mode_t, off64_t, off_t, size_t,
    ssize_t, uid_t, DIR, FILE,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Look `name` (NUL-terminated) up after this library; 0 if nothing defines it.
fn lookup(name: &'static str) -> usize {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT is valid in a
    // shared object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// A function the process must have: without it we cannot forward, so stop
/// loudly rather than misbehave.
fn missing(name: &str) -> ! {
    let msg = format!(
        "madfs preload: cannot find the real '{}' (dlsym RTLD_NEXT)\n",
        name.trim_end_matches('\0')
    );
    // SAFETY: raw write of a valid buffer to stderr, then abort.
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr() as *const c_void, msg.len());
        libc::abort()
    }
}

macro_rules! real_fns {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*) => {
        $(
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                static PTR: AtomicUsize = AtomicUsize::new(0);
                let mut p = PTR.load(Ordering::Relaxed);
                if p == 0 {
                    p = lookup(concat!(stringify!($name), "\0"));
                    if p == 0 {
                        missing(stringify!($name));
                    }
                    PTR.store(p, Ordering::Relaxed);
                }
                // SAFETY: `p` is the address dlsym returned for a function
                // with this C signature.
                let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
                // SAFETY: a pure forward: the caller's arguments, under the
                // same C contract as ours (see "Safety" in exports/mod.rs).
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real_fns! {
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t;
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t;
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t;
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t;
    fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t;
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int;
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    fn truncate64(path: *const c_char, len: off64_t) -> c_int;
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn sync() -> ();
    fn syncfs(fd: c_int) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn renameat(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int;
    fn renameat2(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char, flags: c_uint) -> c_int;
    fn linkat(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char, flags: c_int) -> c_int;
    fn symlinkat(target: *const c_char, newdir: c_int, linkpath: *const c_char) -> c_int;
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
    fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int;
    fn fchownat(dirfd: c_int, path: *const c_char, uid: uid_t, gid: gid_t, flags: c_int) -> c_int;
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int;
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    fn opendir(path: *const c_char) -> *mut DIR;
    fn fdopendir(fd: c_int) -> *mut DIR;
    fn readdir64(dir: *mut DIR) -> *mut dirent64;
    fn readdir64_r(dir: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int;
    fn closedir(dir: *mut DIR) -> c_int;
    fn dirfd(dir: *mut DIR) -> c_int;
    fn rewinddir(dir: *mut DIR) -> ();
    fn telldir(dir: *mut DIR) -> c_long;
    fn seekdir(dir: *mut DIR, pos: c_long) -> ();
    fn scandir64(
        path: *const c_char,
        list: *mut *mut *mut dirent64,
        filter: Option<unsafe extern "C" fn(*const dirent64) -> c_int>,
        compar: Option<unsafe extern "C" fn(*mut *const dirent64, *mut *const dirent64) -> c_int>,
    ) -> c_int;
    fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, new: c_int) -> c_int;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    fn statfs64(path: *const c_char, buf: *mut libc::statfs64) -> c_int;
    fn fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int;
    fn statvfs64(path: *const c_char, buf: *mut libc::statvfs64) -> c_int;
    fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int;
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE;
    fn fclose(stream: *mut FILE) -> c_int;
    fn fflush(stream: *mut FILE) -> c_int;
    fn fileno(stream: *mut FILE) -> c_int;
    fn fileno_unlocked(stream: *mut FILE) -> c_int;
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void;
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, count: size_t) -> ssize_t;
    fn copy_file_range(in_fd: c_int, off_in: *mut off64_t, out_fd: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t;
    fn splice(in_fd: c_int, off_in: *mut off64_t, out_fd: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t;
    fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int;
    fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int;
    fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int;
    fn flock(fd: c_int, op: c_int) -> c_int;
    fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    fn llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    fn mkostemps64(template: *mut c_char, suffixlen: c_int, flags: c_int) -> c_int;
    fn mkdtemp(template: *mut c_char) -> *mut c_char;
    fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn _exit(status: c_int) -> ();
    fn _Exit(status: c_int) -> ();
    fn umask(mask: mode_t) -> mode_t;
    fn pathconf(path: *const c_char, name: c_int) -> c_long;
    fn fpathconf(fd: c_int, name: c_int) -> c_long;
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn closefrom(lowfd: c_int) -> ();
    fn chroot(path: *const c_char) -> c_int;
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn epoll_create(size: c_int) -> c_int;
    fn eventfd(initval: c_uint, flags: c_int) -> c_int;
    fn socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int) -> c_int;
    fn pipe(fds: *mut c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int;
}

/// lseek on a descriptor we reserved (always a valid memfd).
pub unsafe fn seek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: pure forward (integers only).
    unsafe { lseek64(fd, off, whence) }
}
