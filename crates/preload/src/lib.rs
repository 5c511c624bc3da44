//! MadFS interception library, `libmadfs_preload.so`: loaded with
//! LD_PRELOAD (by `madfs run`), it serves paths under a prefix
//! (`MADFS_PREFIX`, default `/madfs`) from the cluster named by
//! `MADFS_CLUSTER`, and hands every other path and descriptor to the C
//! library untouched. Build it with `cargo build -p madfs-preload` (cargo
//! puts it next to the `madfs` binary, where `madfs run` looks).
//!
//! # What is served
//! open/open64/openat/openat64/creat (and the fortified `__open*_2`),
//! close, close_range, closefrom, read/pread/pread64/readv/preadv(2),
//! write/pwrite/pwrite64/writev/pwritev(2), lseek/lseek64 (SEEK_DATA and
//! SEEK_HOLE: one data extent), fstat/stat/lstat/fstatat/newfstatat/statx
//! and the old `__xstat`/`__fxstat`/`__lxstat`/`__fxstatat` (+64) entry
//! points, access/faccessat/eaccess, truncate/ftruncate, fsync/fdatasync (of a
//! directory too: every server), syncfs, sync (the kernel's, then every server),
//! unlink/unlinkat/rmdir/remove, mkdir/mkdirat, rename/renameat/renameat2
//! (NOREPLACE, EXCHANGE), link/linkat/symlink/symlinkat/readlink/readlinkat,
//! chmod/fchmod/fchmodat/lchmod, chown/fchown/lchown/fchownat,
//! utimensat/futimens/utime/utimes/lutimes/futimes/futimesat,
//! opendir/fdopendir/readdir(64)(_r)/closedir/dirfd/rewinddir/telldir/
//! seekdir/scandir(64)/getdents64, chdir/fchdir/getcwd/get_current_dir_name
//! into and out of the prefix, dup/dup2/dup3/fcntl (F_DUPFD(_CLOEXEC),
//! F_GETFL, F_SETFL, F_GETFD, F_SETFD), statfs/statvfs/fstatfs/fstatvfs
//! (+64), fopen/fopen64/fdopen/freopen/fclose/fileno (a `fopencookie`
//! stream: fread, fwrite, fgets, fprintf, fseek, ftell... work unmodified),
//! mmap of a file (a private copy), sendfile/copy_file_range/splice (by
//! reading and writing), posix_fadvise (ignored), posix_fallocate/fallocate
//! mode 0 (extends), mkstemp family, mkdtemp, realpath/canonicalize_file_name,
//! pathconf/fpathconf, the xattr calls (MadFS has none: get says ENODATA,
//! list says empty), readlink of /proc/self/fd/N and /dev/fd/N (the MadFS
//! path), umask, mknod/mknodat/`__xmknod`/`__xmknodat`/mkfifo/mkfifoat
//! (FIFOs, sockets, devices as root: made in MadFS, and stat, readdir's
//! d_type, rename, unlink, chmod, chown, utimens work on them; opening
//! one answers ENXIO, as for a socket: the library has no kernel pipe or
//! socket to hand out).
//!
//! Refused with ENOTSUP and one line on stderr per call name: file locks
//! (flock, lockf, fcntl F_*LK), leases and F_NOTIFY, shared writable mmap,
//! setxattr, O_TMPFILE,
//! fallocate modes other than 0/KEEP_SIZE, chroot into MadFS, exec of a
//! program stored in MadFS, and any MadFS call in a vfork child before its
//! exec.
//!
//! # Descriptors, fork, exec, threads
//! A MadFS file is a real descriptor number: a memfd reserved at the
//! lowest free number (see fdtable.rs), so nothing can collide with it, and
//! dup/dup2/fork/exec/close-on-exec behave as for any descriptor. Its
//! kernel offset is the file offset, shared as POSIX says across dup, fork
//! and exec. Writes that bypass the library (the C library's stdio on a
//! redirected stdout, `echo x > /madfs/f` in bash) land in the memfd and
//! are copied into MadFS at the next call on the descriptor, at close,
//! fork, exec and exit; a read-only MadFS file installed as stdin is copied
//! into its memfd (up to MADFS_PREFILL_MAX bytes, 256 MiB by default) for
//! stdio readers.
//! - fork: pending data and sizes are pushed before; the child keeps its
//!   descriptors (fresh table entries) and makes its own connection on its
//!   first MadFS call (the parent's runtime has no threads there; its
//!   objects are leaked, never dropped).
//! - exec: descriptors without O_CLOEXEC survive (their memfd names say
//!   what they are: inode, flags, path) and the new program takes them
//!   over; O_CLOEXEC ones vanish with their memfd. The MadFS working
//!   directory travels in MADFS_CWD. execve/execv/execvp/execvpe push
//!   pending sizes first; execl*, posix_spawn and fexecve are not
//!   intercepted (descriptors and the working directory still carry over).
//! - threads: one client and runtime per process, shared; the table is
//!   behind locks; calls on one descriptor that use its offset are
//!   serialised.
//! - the library's own descriptors (epoll, eventfd, sockets) are moved to
//!   high numbers and protected from close-everything loops (internal.rs).
//!
//! # Limits worth knowing
//! - Paths are matched lexically: a kernel symlink pointing into the prefix
//!   is not followed into MadFS, and absolute symlink targets inside MadFS
//!   are resolved from MadFS's root (a target "/x" is "<prefix>/x").
//! - O_APPEND is atomic within a process; concurrent appenders in several
//!   processes (or through separate opens) may overwrite each other: MadFS
//!   has no server-side append.
//! - Bytes written around the library are placed exactly for sequential
//!   writers (redirected output); a program that seeks with raw system
//!   calls and writes through stdio on a MadFS stdout is not.
//! - A program that kills itself (SIGKILL, abort) loses the size update of
//!   its writes beyond the first chunk, as the client library does.
//! - Statically linked programs and programs that make system calls
//!   themselves (Go) are not intercepted.
//! - `open`, `openat` and `fcntl` are variadic in C. Stable Rust cannot
//!   define variadic functions, so they are defined with the optional
//!   argument as a plain one: on x86-64 and aarch64 Linux it travels in
//!   the same register either way, so reading it when the caller passed
//!   none is harmless (its value is ignored then).
//!
//! MADFS_LOG=debug traces every MadFS call on stderr; otherwise the library
//! prints nothing but refusals and failures to reach the cluster.
//!
//! # Layout
//! - exports/: the interposed C functions (open, read, stat, opendir,
//!   fopen, ... about 200 names, with their 64-bit and fortified variants),
//!   one file per family; exports/mod.rs has the helpers they share and the
//!   safety contract of the exported functions;
//! - paths.rs: which paths are ours (prefix, working directory, dirfd);
//! - fdtable.rs: MadFS files as real descriptor numbers (memfd-backed),
//!   shared offsets, output written around us, inheritance over exec;
//! - ops.rs, meta.rs, dirs.rs, stdio.rs: the operations;
//! - process.rs: start-up, fork, exec, exit;
//! - forklock.rs: the locks of other modules that fork must hold;
//! - harvest.rs: the thread saving output written around us into MadFS;
//! - conn.rs: the lazily made client and runtime, made again after fork;
//! - internal.rs: the library's own descriptors, kept out of the way;
//! - guard.rs, shim.rs, real.rs: reentrancy, errno and panics, the real
//!   functions (dlsym RTLD_NEXT).
//!
//! # Module graph
//! Who uses whom (`use crate::...`); it has no cycles, so every arrow points
//! down this list, and a module only knows the ones below it:
//! ```text
//! exports  -> every module below but forklock, harvest, conn
//! process  -> fdtable, conn, forklock, harvest, paths, config, shim, real
//! stdio    -> ops, fdtable, forklock, paths, config, shim, real
//! dirs     -> ops, fdtable, forklock, guard, shim, real
//! meta     -> ops, conn, config, shim
//! ops      -> harvest, fdtable, conn, config, shim, real
//! paths    -> fdtable, config, shim, real
//! harvest  -> fdtable, conn, config, guard, shim
//! fdtable  -> conn, internal, config, shim, real
//! conn     -> config, guard, shim
//! internal -> real
//! config   -> shim, real
//! shim     -> guard, real
//! forklock, guard, real -> (nothing of ours)
//! ```
//! The fork handler (process.rs) must hold every lock across fork; it takes
//! the table's and the connection's itself, and the rest (open directory
//! streams, C streams) through forklock.rs, with which dirs.rs and stdio.rs
//! register: process.rs does not know them, nor do they know it. The
//! harvester lives apart from process.rs for the same reason (ops.rs
//! starts it).
//!
//! The interposed functions are only exported from the shared library, not
//! from this crate's unit tests (which would otherwise intercept their own
//! test harness).

// Unit tests see the crate without its exports, so most of it is unused there.
#![cfg_attr(test, allow(dead_code, unused_imports))]

mod config;
mod conn;
mod dirs;
mod exports;
mod fdtable;
mod forklock;
mod guard;
mod harvest;
mod internal;
mod meta;
mod ops;
mod paths;
mod process;
mod real;
mod shim;
mod stdio;
