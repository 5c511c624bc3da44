//! What the library was started with (environment, read once per process
//! image) and process-wide facts it tracks: the umask and our pid.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub const DEFAULT_PREFIX: &str = "/madfs";

pub struct Config {
    /// Whether a usable prefix was given; otherwise every call goes to the kernel.
    pub enabled: bool,
    /// The prefix, absolute and normalized, without a trailing slash ("/madfs").
    pub prefix: Vec<u8>,
    /// Its components.
    pub parts: Vec<Vec<u8>>,
    /// Its last component: a path can only lead into the prefix if it
    /// contains these bytes (a cheap first test).
    pub tail: Vec<u8>,
    /// $MADFS_CLUSTER, if set (else the client's default lookup).
    pub cluster: Option<PathBuf>,
    /// $MADFS_STATS set (and not "0"): at exit, print the requests this
    /// process sent and how its metadata cache answered (`madfs run --stats`).
    pub stats: bool,
}

pub fn get() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(load)
}

fn load() -> Config {
    let raw = std::env::var_os("MADFS_PREFIX")
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .unwrap_or_else(|| DEFAULT_PREFIX.as_bytes().to_vec());
    let cluster = std::env::var_os("MADFS_CLUSTER").map(PathBuf::from);
    let stats = std::env::var_os("MADFS_STATS").is_some_and(|v| !v.is_empty() && v != "0");
    let parts: Vec<Vec<u8>> = raw
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .map(|p| p.to_vec())
        .collect();
    let valid =
        raw.first() == Some(&b'/') && !parts.is_empty() && !parts.iter().any(|p| p == b"..");
    if !valid {
        crate::shim::log(format_args!(
            "MADFS_PREFIX '{}' is not an absolute directory other than '/': MadFS is disabled",
            String::from_utf8_lossy(&raw)
        ));
    }
    let mut prefix = Vec::new();
    for p in &parts {
        prefix.push(b'/');
        prefix.extend_from_slice(p);
    }
    Config {
        enabled: valid,
        tail: parts.last().cloned().unwrap_or_default(),
        prefix,
        parts,
        cluster,
        stats,
    }
}

static UMASK: AtomicU32 = AtomicU32::new(0o022);
static PID: AtomicU32 = AtomicU32::new(0);

/// The process umask, as last set through umask(3) (read once at start).
pub fn umask() -> u32 {
    UMASK.load(Ordering::Relaxed)
}

pub fn set_umask(m: u32) {
    UMASK.store(m & 0o777, Ordering::Relaxed);
}

/// Read the umask without changing it (at start, single-threaded).
pub fn init_umask() {
    // SAFETY: umask cannot fail; the old value is put back at once.
    let old = unsafe {
        let old = crate::real::umask(0);
        crate::real::umask(old);
        old
    };
    set_umask(old);
}

/// The pid our tables belong to (updated in a forked child).
pub fn set_pid() {
    // SAFETY: getpid cannot fail.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}

/// True in a child made by vfork (or clone) that shares our memory but not
/// our pid: it must not touch the tables, which belong to the parent.
pub fn foreign_child() -> bool {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() } as u32;
    let ours = PID.load(Ordering::Relaxed);
    ours != 0 && me != ours
}
