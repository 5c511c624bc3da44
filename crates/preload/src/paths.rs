//! Which paths are ours. A path is MadFS's when, made absolute and
//! normalized lexically ("." and ".." applied to the names, as the shell's
//! `cd -L` does; symlinks in the kernel part are not followed), it lies
//! under the prefix. Relative paths are taken against the directory they are
//! relative to: a MadFS directory fd, the virtual working directory (after a
//! chdir into MadFS), or the kernel's working directory.
//!
//! Everything else goes to the kernel untouched, except relative paths
//! while the working directory is in MadFS: the kernel's working directory
//! is elsewhere then, so they are handed over made absolute.

use crate::config;
use crate::fdtable::{self, Kind};
use crate::shim::{Errno, R};
use libc::c_char;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Where a path goes.
pub enum Target {
    Kernel(KPath),
    /// A MadFS path ("/" or "/a/b", a trailing '/' kept when the original
    /// named a directory explicitly).
    Madfs(Vec<u8>),
}

/// A path for the kernel: the caller's own pointer, or a rewritten one.
pub enum KPath {
    Orig(*const c_char),
    Owned(CString),
}

impl KPath {
    pub fn ptr(&self) -> *const c_char {
        match self {
            KPath::Orig(p) => *p,
            KPath::Owned(c) => c.as_ptr(),
        }
    }
}

/// The bytes of a C string; EFAULT for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives the result.
pub unsafe fn cstr<'a>(p: *const c_char) -> R<&'a [u8]> {
    if p.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Lexical normalization of an absolute path: its names, and whether it
/// must name a directory (ends in '/', "." or "..").
pub fn lexical(path: &[u8]) -> (Vec<&[u8]>, bool) {
    let mut out: Vec<&[u8]> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            name => out.push(name),
        }
    }
    let last = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
    (out, matches!(last, b"" | b"." | b".."))
}

fn join(names: &[&[u8]], must_be_dir: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names {
        out.push(b'/');
        out.extend_from_slice(n);
    }
    if out.is_empty() || must_be_dir {
        out.push(b'/');
    }
    out
}

/// The MadFS path of an absolute path, if it lies under the prefix.
pub fn madfs_of_absolute(path: &[u8]) -> Option<Vec<u8>> {
    let cfg = config::get();
    let (names, dir) = lexical(path);
    let k = cfg.parts.len();
    if names.len() < k || names[..k].iter().zip(&cfg.parts).any(|(a, b)| *a != &b[..]) {
        return None;
    }
    Some(join(&names[k..], dir))
}

/// Whether walking `path` (absolute) component by component ever stands at
/// the prefix.
fn passes_through_prefix(path: &[u8]) -> bool {
    let parts = &config::get().parts;
    let mut stack: Vec<&[u8]> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                stack.pop();
            }
            name => stack.push(name),
        }
        if stack.len() == parts.len() && stack.iter().zip(parts).all(|(a, b)| *a == &b[..]) {
            return true;
        }
    }
    false
}

/// A MadFS path as the program sees it: under the prefix.
pub fn outside_form(madfs: &[u8]) -> Vec<u8> {
    let mut out = config::get().prefix.clone();
    if madfs != b"/" {
        out.extend_from_slice(madfs);
    }
    out
}

/// Classify an absolute path made by joining a base and a relative path.
fn classify_joined(full: &[u8]) -> R<Target> {
    if let Some(m) = madfs_of_absolute(full) {
        return Ok(Target::Madfs(m));
    }
    let (names, dir) = lexical(full);
    let k = join(&names, dir);
    Ok(Target::Kernel(KPath::Owned(
        CString::new(k).map_err(|_| Errno(libc::EINVAL))?,
    )))
}

fn joined(base: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut full = base.to_vec();
    full.push(b'/');
    full.extend_from_slice(rel);
    full
}

/// Decide where `path` (relative to `dirfd` as the *at calls take it) goes.
///
/// # Safety
/// `path` is NULL or a valid C string.
pub unsafe fn classify(dirfd: libc::c_int, path: *const c_char) -> R<Target> {
    // SAFETY: the caller's contract.
    let bytes = unsafe { cstr(path)? };
    classify_bytes(dirfd, bytes, path)
}

/// `classify` for bytes already read from `orig`.
pub fn classify_bytes(dirfd: libc::c_int, bytes: &[u8], orig: *const c_char) -> R<Target> {
    let cfg = config::get();
    let kernel = || Ok(Target::Kernel(KPath::Orig(orig)));
    if !cfg.enabled || bytes.is_empty() {
        return kernel();
    }
    if bytes[0] == b'/' {
        if !contains(bytes, &cfg.tail) {
            return kernel();
        }
        if let Some(m) = madfs_of_absolute(bytes) {
            return Ok(Target::Madfs(m));
        }
        // A path that passes through the prefix and leaves it again
        // ("/madfs/.."): the kernel cannot walk through a directory that
        // exists only here, so it gets the normalized path.
        if passes_through_prefix(bytes) {
            return classify_joined(bytes);
        }
        return kernel();
    }
    if dirfd != libc::AT_FDCWD {
        let Some(desc) = fdtable::get(dirfd) else {
            return kernel();
        };
        if desc.kind != Kind::Dir {
            return Err(Errno(libc::ENOTDIR));
        }
        let Some(dir) = &desc.path else {
            return Err(crate::shim::unsupported(
                "*at",
                "a directory fd inherited over exec whose path was too long to pass on",
            ));
        };
        return classify_joined(&joined(&outside_form(dir), bytes));
    }
    if let Some(v) = vcwd() {
        return classify_joined(&joined(&outside_form(&v), bytes));
    }
    if !contains(bytes, &cfg.tail) {
        return kernel();
    }
    match kernel_cwd() {
        Some(cwd) => match madfs_of_absolute(&joined(&cwd, bytes)) {
            Some(m) => Ok(Target::Madfs(m)),
            None => kernel(),
        },
        None => kernel(),
    }
}

// ---- working directory ----

static VCWD_ON: AtomicBool = AtomicBool::new(false);
static VCWD: Mutex<Option<Vec<u8>>> = Mutex::new(None);
static KCWD: Mutex<Option<Vec<u8>>> = Mutex::new(None);

/// The environment variable that carries a MadFS working directory over exec.
pub const CWD_ENV: &str = "MADFS_CWD";

/// The virtual working directory (a MadFS path), when the process is in MadFS.
pub fn vcwd() -> Option<Vec<u8>> {
    if !VCWD_ON.load(Ordering::Acquire) {
        return None;
    }
    VCWD.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Enter a MadFS directory (Some) or leave MadFS (None). The environment
/// follows, so that programs started by exec (or posix_spawn) start there too.
pub fn set_vcwd(dir: Option<Vec<u8>>) {
    let mut slot = VCWD.lock().unwrap_or_else(|e| e.into_inner());
    VCWD_ON.store(dir.is_some(), Ordering::Release);
    let name = CString::new(CWD_ENV).expect("no NUL");
    match &dir {
        Some(d) => {
            if let Ok(v) = CString::new(d.clone()) {
                // SAFETY: valid C strings; setenv copies them.
                unsafe { libc::setenv(name.as_ptr(), v.as_ptr(), 1) };
            }
        }
        // SAFETY: a valid C string.
        None => unsafe {
            libc::unsetenv(name.as_ptr());
        },
    }
    *slot = dir;
}

/// At start: a MadFS working directory handed over by our parent.
pub fn init_vcwd() {
    if let Some(v) = std::env::var_os(CWD_ENV) {
        let v = std::os::unix::ffi::OsStringExt::into_vec(v);
        if v.first() == Some(&b'/') {
            *VCWD.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            VCWD_ON.store(true, Ordering::Release);
        }
    }
}

/// The kernel's working directory (cached; chdir and fchdir invalidate it).
pub fn kernel_cwd() -> Option<Vec<u8>> {
    let mut slot = KCWD.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: a buffer of the given size.
        let p = unsafe { crate::real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
        if p.is_null() {
            return None;
        }
        let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(len);
        *slot = Some(buf);
    }
    slot.clone()
}

pub fn invalidate_kernel_cwd() {
    *KCWD.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_normalization() {
        let (n, d) = lexical(b"/a//b/./c/../d/");
        assert_eq!(n, vec![&b"a"[..], b"b", b"d"]);
        assert!(d);
        let (n, d) = lexical(b"/../x");
        assert_eq!(n, vec![&b"x"[..]]);
        assert!(!d);
        assert!(lexical(b"/a/..").1);
        assert_eq!(join(&[], true), b"/");
        assert_eq!(join(&[b"a", b"b"], true), b"/a/b/");
    }

    #[test]
    fn prefix_matching() {
        // The default prefix, /madfs (tests do not set MADFS_PREFIX).
        assert_eq!(madfs_of_absolute(b"/madfs"), Some(b"/".to_vec()));
        assert_eq!(madfs_of_absolute(b"/madfs/"), Some(b"/".to_vec()));
        assert_eq!(madfs_of_absolute(b"/madfs/a/b"), Some(b"/a/b".to_vec()));
        assert_eq!(madfs_of_absolute(b"//madfs/./a/"), Some(b"/a/".to_vec()));
        assert_eq!(madfs_of_absolute(b"/tmp/../madfs/x"), Some(b"/x".to_vec()));
        assert_eq!(madfs_of_absolute(b"/madfsx/a"), None);
        assert_eq!(madfs_of_absolute(b"/madfs/../etc"), None);
        assert_eq!(madfs_of_absolute(b"/etc/madfs"), None);
        assert_eq!(outside_form(b"/"), b"/madfs");
        assert!(passes_through_prefix(b"/madfs/.."));
        assert!(!passes_through_prefix(b"/tmp/madfsx/.."));
        assert_eq!(outside_form(b"/a"), b"/madfs/a");
    }
}
