//! What every interposed function does around its body: mark the thread as
//! inside our code, catch panics (a bug of ours must not take the host
//! program down: it becomes EIO), and turn `Err(errno)` into the C
//! convention (a failure value and `errno`).

use madfs_client::ClientError;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// An errno value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub libc::c_int);

pub type R<T> = Result<T, Errno>;

impl From<ClientError> for Errno {
    fn from(e: ClientError) -> Errno {
        if debug_enabled() {
            log(format_args!("error: {e}"));
        }
        Errno(e.errno())
    }
}

pub fn set_errno(e: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> libc::c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// Run an interposed function's body. Results of real calls travel as
/// `Ok(value)` with errno already set by the C library, so errno is only
/// written for our own errors.
pub fn run<T>(fail: T, f: impl FnOnce() -> R<T>) -> T {
    let _inside = crate::guard::Enter::new();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(Errno(e))) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Run our own implementation of a call: a success leaves errno as the
/// caller had it (the client library's internals set it freely, and
/// programs such as ls test errno after readdir returns NULL).
pub fn ours<T>(f: impl FnOnce() -> R<T>) -> R<T> {
    let saved = errno();
    let r = f();
    if r.is_ok() {
        set_errno(saved);
    }
    r
}

/// As `run`, for functions without a result (rewinddir, seekdir, _exit).
pub fn run_void(f: impl FnOnce()) {
    let _inside = crate::guard::Enter::new();
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Whether MADFS_LOG=debug: then every MadFS call is traced on stderr.
pub fn debug_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MADFS_LOG").as_deref() == Ok("debug"))
}

/// One line on stderr, written with the real write(2).
pub fn log(args: std::fmt::Arguments<'_>) {
    let line = format!("madfs[{}]: {args}\n", std::process::id());
    // SAFETY: a valid buffer to fd 2; a short or failed write is ignored.
    unsafe {
        crate::real::write(2, line.as_ptr().cast(), line.len());
    }
}

macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::shim::debug_enabled() {
            $crate::shim::log(format_args!($($arg)*));
        }
    };
}
pub(crate) use debug;

/// The answer for a call MadFS cannot serve: ENOTSUP, and one line on
/// stderr the first time each call is refused.
pub fn unsupported(call: &'static str, detail: &str) -> Errno {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let first = {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        seen.get_or_insert_with(HashSet::new).insert(call)
    };
    if first {
        log(format_args!(
            "{call} is not supported on MadFS ({detail}): returning ENOTSUP"
        ));
    }
    Errno(libc::ENOTSUP)
}

/// A warning printed once per `key`.
pub fn warn_once(key: &'static str, args: std::fmt::Arguments<'_>) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let first = {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        seen.get_or_insert_with(HashSet::new).insert(key)
    };
    if first {
        log(args);
    }
}
