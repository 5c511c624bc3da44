//! `madfs run [--prefix /madfs] -- CMD ARGS`: run a program with the
//! interception library preloaded, so paths under the prefix go to MadFS.
//!
//! The library (libmadfs_preload.so) is looked for next to this executable
//! (cargo builds cdylibs into the same target/<profile>/ directory), then in
//! ../lib; MADFS_PRELOAD_LIB overrides. The program gets LD_PRELOAD (the
//! library first, any existing value after it), MADFS_CLUSTER (absolute),
//! MADFS_PREFIX, and with the options MADFS_CACHE_TTL and MADFS_STATS, and
//! this process is replaced by it (exec).

use madfs_rpc::ClusterConfig;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub const LIB_NAME: &str = "libmadfs_preload.so";

/// Where the library is, or why it was not found.
pub fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MADFS_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            absolute(&p)
        } else {
            Err(format!(
                "run: MADFS_PRELOAD_LIB names '{}', which is not a file",
                p.display()
            ))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("run: cannot locate the madfs executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(LIB_NAME), dir.join("../lib").join(LIB_NAME)];
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    Err(format!(
        "run: the interception library {LIB_NAME} is not next to {} \
         (build it with `cargo build -p madfs-preload`, with the same profile \
         and CARGO_TARGET_DIR as madfs; or set MADFS_PRELOAD_LIB)",
        exe.display()
    ))
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("run: '{}': {e}", p.display()))
}

/// The prefix, checked and normalized: absolute, not "/", no "." or "..",
/// no trailing slash.
pub fn normalize_prefix(prefix: &str) -> Result<String, String> {
    if !prefix.starts_with('/') {
        return Err(format!("run: --prefix '{prefix}' must be an absolute path"));
    }
    let parts: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err("run: --prefix cannot be '/' (every path would go to MadFS)".into());
    }
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(format!(
            "run: --prefix '{prefix}' must not contain '.' or '..'"
        ));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// LD_PRELOAD with `lib` first, then what was there (minus `lib` itself).
pub fn ld_preload(lib: &Path, existing: Option<&OsStr>) -> OsString {
    let mut out = lib.as_os_str().to_os_string();
    if let Some(old) = existing {
        for item in old
            .as_bytes()
            .split(|&b| b == b':' || b == b' ')
            .filter(|i| !i.is_empty())
        {
            if item != lib.as_os_str().as_bytes() {
                out.push(":");
                out.push(OsStr::from_bytes(item));
            }
        }
    }
    out
}

/// What `madfs run` passes on to the library besides the cluster.
pub struct RunOptions {
    pub prefix: String,
    /// MADFS_CACHE_TTL for the program (else whatever the environment has).
    pub cache_ttl: Option<std::time::Duration>,
    /// MADFS_STATS=1: every process reports its requests at exit.
    pub stats: bool,
}

pub fn run(
    cluster: Option<&Path>,
    opts: &RunOptions,
    cmd: &[OsString],
) -> Result<ExitCode, String> {
    let Some((program, args)) = cmd.split_first() else {
        return Err("run: no command given (madfs run [--prefix DIR] -- CMD ARGS...)".into());
    };
    let prefix = normalize_prefix(&opts.prefix)?;
    let lib = find_library()?;
    let cluster_file = absolute(&ClusterConfig::locate(cluster))?;
    // Fail here, clearly, rather than on the program's first MadFS call.
    let cfg = ClusterConfig::load(&cluster_file).map_err(|e| format!("run: {e}"))?;
    cfg.load_key().map_err(|e| format!("run: {e}"))?;
    let preload = ld_preload(&lib, std::env::var_os("LD_PRELOAD").as_deref());
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .env("LD_PRELOAD", preload)
        .env("MADFS_CLUSTER", &cluster_file)
        .env("MADFS_PREFIX", &prefix)
        .env_remove("MADFS_CWD");
    if let Some(ttl) = opts.cache_ttl {
        command.env(
            madfs_client::CacheConfig::TTL_ENV,
            ttl.as_secs_f64().to_string(),
        );
    } else if let Some(v) = std::env::var_os(madfs_client::CacheConfig::TTL_ENV) {
        // Checked here, so a typo fails now and not in the program.
        madfs_client::parse_ttl(&v.to_string_lossy()).map_err(|e| {
            format!(
                "run: {}='{}': {e}",
                madfs_client::CacheConfig::TTL_ENV,
                v.to_string_lossy()
            )
        })?;
    }
    if opts.stats {
        command.env("MADFS_STATS", "1");
    }
    let err = command.exec();
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    eprintln!(
        "madfs: run: cannot execute '{}': {err}",
        String::from_utf8_lossy(&program.clone().into_vec())
    );
    Ok(ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked() {
        assert_eq!(normalize_prefix("/madfs").unwrap(), "/madfs");
        assert_eq!(normalize_prefix("//scratch//m/").unwrap(), "/scratch/m");
        assert!(normalize_prefix("/").is_err());
        assert!(normalize_prefix("madfs").is_err());
        assert!(normalize_prefix("/a/../b").is_err());
    }

    #[test]
    fn preload_list_puts_ours_first_once() {
        let lib = Path::new("/t/libmadfs_preload.so");
        assert_eq!(
            ld_preload(lib, None),
            OsString::from("/t/libmadfs_preload.so")
        );
        assert_eq!(
            ld_preload(lib, Some(OsStr::new("/x.so /t/libmadfs_preload.so:/y.so"))),
            OsString::from("/t/libmadfs_preload.so:/x.so:/y.so")
        );
    }
}
