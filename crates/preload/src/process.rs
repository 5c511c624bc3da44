//! The process around the tables: start-up, fork, exec and exit.
//!
//! - Start (an ELF constructor): read the configuration, the umask, take
//!   over MadFS descriptors and the MadFS working directory inherited over
//!   exec, register the fork and exit handlers. No connection is made.
//! - fork: before, every description's captured bytes and pending size are
//!   pushed to MadFS and our locks are taken (so none is held by a thread
//!   the child will not have); in the child, the table is rebuilt with fresh
//!   descriptions and the parent's connection is forgotten (leaked, never
//!   used: its sockets and epoll instance are shared with the parent); the
//!   child connects again on its first MadFS call.
//! - exec (execve, execv, execvp, execvpe): the same push, then the
//!   environment carries the MadFS working directory. Descriptors without
//!   O_CLOEXEC survive as memfds and the new program takes them over; see
//!   fdtable.rs. execl*, posix_spawn and fexecve are not intercepted: the
//!   working directory still travels in `environ`, and inherited
//!   descriptors are still taken over, but sizes not yet published by the
//!   calling process itself are only published by its fork handler or exit.
//! - exit and _exit: the same push, after flushing stdio.

use crate::config;
use crate::conn;
use crate::fdtable;
use crate::forklock;
use crate::harvest::ensure_harvester;
use crate::paths;
use crate::real;
use crate::shim::{self, debug};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::{Arc, MutexGuard, RwLockWriteGuard};

/// Push everything pending of every description to MadFS: bytes written
/// around us, and sizes of writes not yet published.
pub fn flush_all() {
    if config::foreign_child() {
        return;
    }
    let all = fdtable::all();
    let mut seen: Vec<*const fdtable::Desc> = Vec::new();
    for (fd, d) in &all {
        if d.capture {
            let _io = d.lock_io();
            if let Err(e) = d.sync_offset(*fd) {
                shim::log(format_args!(
                    "cannot save output written to fd {fd} into MadFS: errno {}",
                    e.0
                ));
            }
        }
        let key = Arc::as_ptr(d);
        if !seen.contains(&key) {
            seen.push(key);
            if let Err(e) = d.publish() {
                shim::log(format_args!(
                    "cannot publish the size of a MadFS file (fd {fd}): errno {}",
                    e.0
                ));
            }
        }
    }
}

// ---- fork ----

type TableGuard = RwLockWriteGuard<'static, BTreeMap<i32, Arc<fdtable::Desc>>>;

thread_local! {
    static HELD: RefCell<Option<HeldAll>> = const { RefCell::new(None) };
}

struct HeldAll {
    table: TableGuard,
    conn: MutexGuard<'static, Option<&'static conn::Conn>>,
    // The other modules' locks (open directory streams, C streams).
    _others: forklock::HeldLocks,
}

extern "C" fn before_fork() {
    shim::run_void(|| {
        flush_all();
        let held = HeldAll {
            table: fdtable::TABLE.write().unwrap_or_else(|e| e.into_inner()),
            conn: conn::CONN.lock().unwrap_or_else(|e| e.into_inner()),
            _others: forklock::hold_all(),
        };
        HELD.with(|h| *h.borrow_mut() = Some(held));
    });
}

extern "C" fn after_fork_parent() {
    shim::run_void(|| {
        HELD.with(|h| drop(h.borrow_mut().take()));
    });
}

extern "C" fn after_fork_child() {
    shim::run_void(|| {
        config::set_pid();
        HELD.with(|h| {
            if let Some(mut held) = h.borrow_mut().take() {
                fdtable::rebuild_after_fork(&mut held.table);
                // The parent's connection: leaked, never used here.
                *held.conn = None;
            }
        });
        if fdtable::all().iter().any(|(_, d)| d.has_shadow()) {
            ensure_harvester();
        }
        debug!("forked: tables rebuilt");
    });
}

// ---- exec ----

/// The environment for a new program: MADFS_CWD as our working directory
/// says. None when `envp` is right as it is.
///
/// # Safety
/// `envp` is NULL or a NULL-terminated array of C strings.
pub unsafe fn exec_env(envp: *const *const libc::c_char) -> Option<Vec<CString>> {
    let want = paths::vcwd().map(|v| {
        let mut e = format!("{}=", paths::CWD_ENV).into_bytes();
        e.extend_from_slice(&v);
        e
    });
    let key = format!("{}=", paths::CWD_ENV).into_bytes();
    let mut out = Vec::new();
    let mut changed = false;
    let mut have_right = false;
    if !envp.is_null() {
        let mut p = envp;
        // SAFETY: the caller's contract.
        unsafe {
            while !(*p).is_null() {
                let s = std::ffi::CStr::from_ptr(*p).to_bytes();
                if s.starts_with(&key) {
                    if want.as_deref() == Some(s) && !have_right {
                        have_right = true;
                        out.push(CString::from_vec_unchecked(s.to_vec()));
                    } else {
                        changed = true;
                    }
                } else {
                    out.push(CString::from_vec_unchecked(s.to_vec()));
                }
                p = p.add(1);
            }
        }
    }
    if let Some(w) = want {
        if !have_right {
            changed = true;
            // SAFETY: no NUL inside (a path and a name).
            out.push(unsafe { CString::from_vec_unchecked(w) });
        }
    }
    changed.then_some(out)
}

/// Run before exec: push pending state (not in a vfork child, whose memory
/// is its parent's); the environment to use.
///
/// # Safety
/// As `exec_env`.
pub unsafe fn before_exec(envp: *const *const libc::c_char) -> Option<Vec<CString>> {
    // (C streams are not flushed: exec discards their buffers, as it would
    // without us; a forked child flushing its copy would duplicate output.)
    flush_all();
    // SAFETY: the caller's contract.
    unsafe { exec_env(envp) }
}

// ---- exit ----

extern "C" fn at_exit() {
    shim::run_void(|| {
        // SAFETY: flushing every C stream before harvesting.
        unsafe { real::fflush(std::ptr::null_mut()) };
        flush_all();
        if !config::foreign_child() {
            crate::conn::release_unlinked_at_exit();
        }
        if config::get().stats && !config::foreign_child() {
            crate::conn::report_stats();
        }
    });
}

/// For _exit: what is in the kernel already (our memfds) is saved, C
/// stream buffers are not flushed (that is _exit's contract).
pub fn before_exit() {
    flush_all();
}

// ---- start ----

extern "C" fn init() {
    shim::run_void(|| {
        let cfg = config::get();
        config::set_pid();
        config::init_umask();
        // SAFETY: registering plain extern "C" functions.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            );
            libc::atexit(at_exit);
        }
        if !cfg.enabled {
            return;
        }
        paths::init_vcwd();
        fdtable::inherit();
        if fdtable::all().iter().any(|(_, d)| d.has_shadow()) {
            ensure_harvester();
        }
        // Inherited read-only standard streams: prefill for stdio readers.
        for (fd, d) in fdtable::all() {
            if fd <= 2 {
                let _ = d.prefill(fd);
            }
        }
    });
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[&str]) -> (Vec<CString>, Vec<*const libc::c_char>) {
        let owned: Vec<CString> = v.iter().map(|s| CString::new(*s).unwrap()).collect();
        let mut ptrs: Vec<*const libc::c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        (owned, ptrs)
    }

    #[test]
    fn exec_environment_follows_the_working_directory() {
        // Outside MadFS: a stale MADFS_CWD is dropped, else nothing changes.
        let (_o, p) = env(&["A=1", "MADFS_CWD=/old"]);
        // SAFETY: a NULL-terminated array of C strings, alive in `_o`.
        let out = unsafe { exec_env(p.as_ptr()) }.unwrap();
        assert_eq!(out, vec![CString::new("A=1").unwrap()]);
        let (_o, p) = env(&["A=1"]);
        // SAFETY: a NULL-terminated array of C strings, alive in `_o`.
        assert!(unsafe { exec_env(p.as_ptr()) }.is_none());
        // Inside: it is added (once).
        paths::set_vcwd(Some(b"/w".to_vec()));
        let (_o, p) = env(&["A=1"]);
        // SAFETY: a NULL-terminated array of C strings, alive in `_o`.
        let out = unsafe { exec_env(p.as_ptr()) }.unwrap();
        assert_eq!(out[1], CString::new("MADFS_CWD=/w").unwrap());
        let (_o, p) = env(&["MADFS_CWD=/w", "B=2"]);
        // SAFETY: a NULL-terminated array of C strings, alive in `_o`.
        assert!(unsafe { exec_env(p.as_ptr()) }.is_none());
        paths::set_vcwd(None);
    }
}
