//! Where a path a program sees lives in MadFS: under the `madfs run`
//! prefix (MADFS_PREFIX, default /madfs), inside a MadFS FUSE mount, or
//! given as a MadFS path; and which cluster serves it. Used by commands that
//! take the paths of programs running on MadFS (`madfs find --io500`, the
//! external find of IO500; `madfs bench io500 --client mount --mount DIR`).
//!
//! A mount does not record its cluster (its source is "madfs"), but its
//! daemon's command line does (`madfs --cluster FILE mount DIR
//! --foreground`, as `madfs mount` starts it). Whatever cluster file is
//! chosen, the mount is checked to be that cluster by comparing inode
//! number and change time of one path seen both ways: inode numbers
//! through the mount are MadFS's own.

use madfs_client::Client;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The prefix `madfs run` uses when not told otherwise.
pub const DEFAULT_PREFIX: &str = "/madfs";

/// How a path reached MadFS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// Under the `madfs run` prefix (lexically, as the interception
    /// library matches it).
    Prefix(String),
    /// Inside the MadFS FUSE mount at this mount point.
    Mount(PathBuf),
    /// A MadFS path as it is.
    Plain,
}

/// A path given by the user and what it is in MadFS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// As given.
    pub given: String,
    /// The MadFS path ("/" is MadFS's root).
    pub fs_path: String,
    pub via: Via,
}

/// The prefix in force: $MADFS_PREFIX (set by `madfs run`) without its
/// trailing slashes, else /madfs.
pub fn prefix() -> String {
    match std::env::var("MADFS_PREFIX") {
        Ok(p) if p.starts_with('/') && p.trim_end_matches('/').len() > 1 => {
            p.trim_end_matches('/').to_string()
        }
        _ => DEFAULT_PREFIX.to_string(),
    }
}

/// `path` below `prefix` as a MadFS path, when it is (lexically) below it.
pub fn under_prefix(path: &str, prefix: &str) -> Option<String> {
    let rest = path.strip_prefix(prefix)?;
    if rest.is_empty() {
        return Some("/".into());
    }
    if !rest.starts_with('/') {
        return None; // "/madfsx" is not under "/madfs"
    }
    let trimmed = rest.trim_start_matches('/');
    Some(format!("/{trimmed}"))
}

/// The MadFS FUSE mount holding the local path `path` (which must exist),
/// and `path`'s MadFS path in it; None if it is in no MadFS mount.
pub fn in_mount(path: &Path) -> Option<(PathBuf, String)> {
    let canon = std::fs::canonicalize(path).ok()?;
    // The deepest mount point at or above the path holds it.
    let mut at = Some(canon.as_path());
    while let Some(dir) = at {
        if let Some(m) = madfs_fuse::mount_at(dir) {
            if !m.is_madfs() {
                return None;
            }
            let rel = canon.strip_prefix(&m.mount_point).ok()?;
            let fs_path = format!("/{}", rel.to_string_lossy());
            return Some((m.mount_point, fs_path));
        }
        at = dir.parent();
    }
    None
}

/// Classify one path: under the prefix, in a MadFS mount, else a MadFS
/// path (which must then be absolute).
pub fn locate(given: &str, prefix: &str) -> Result<Located, String> {
    if let Some(fs_path) = under_prefix(given, prefix) {
        return Ok(Located {
            given: given.into(),
            fs_path,
            via: Via::Prefix(prefix.into()),
        });
    }
    if let Some((mnt, fs_path)) = in_mount(Path::new(given)) {
        return Ok(Located {
            given: given.into(),
            fs_path,
            via: Via::Mount(mnt),
        });
    }
    if !given.starts_with('/') {
        return Err(format!(
            "'{given}': not under {prefix}, not in a MadFS mount, and not an absolute MadFS path"
        ));
    }
    Ok(Located {
        given: given.into(),
        fs_path: given.into(),
        via: Via::Plain,
    })
}

/// The cluster file the daemon serving the MadFS mount at `mount_point`
/// was started with, read from its command line (`--cluster FILE`), else
/// its environment (MADFS_CLUSTER), else its working directory's
/// madfs-data/cluster.toml (as ClusterConfig::locate would have chosen).
/// None if no such daemon is visible (another user's, another namespace).
pub fn mount_cluster(mount_point: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let proc_dir = entry.path();
        let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
            continue;
        };
        let Some(args) = parse_mount_daemon(&cmdline) else {
            continue;
        };
        let cwd = std::fs::read_link(proc_dir.join("cwd")).unwrap_or_else(|_| "/".into());
        let dir = cwd.join(&args.dir);
        let same = dir == mount_point
            || madfs_fuse::absolute(&dir).is_ok_and(|d| d == mount_point)
            || std::fs::canonicalize(&dir).is_ok_and(|d| d == mount_point);
        if !same {
            continue;
        }
        if let Some(c) = args.cluster {
            return Some(cwd.join(c));
        }
        let env = std::fs::read(proc_dir.join("environ")).unwrap_or_default();
        let from_env = env
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(b"MADFS_CLUSTER="))
            .map(|v| PathBuf::from(std::ffi::OsStr::from_bytes(v)));
        return Some(cwd.join(from_env.unwrap_or_else(|| "madfs-data/cluster.toml".into())));
    }
    None
}

/// The arguments of a mount daemon that matter here.
#[derive(Debug, PartialEq, Eq)]
pub struct DaemonArgs {
    pub dir: PathBuf,
    pub cluster: Option<PathBuf>,
}

/// `madfs [--cluster FILE] mount DIR --foreground [--cluster FILE]` from a
/// NUL-separated command line; None for anything else.
pub fn parse_mount_daemon(cmdline: &[u8]) -> Option<DaemonArgs> {
    let args: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let exe = Path::new(std::ffi::OsStr::from_bytes(args.first()?));
    if exe.file_name()?.as_bytes() != b"madfs" {
        return None;
    }
    let (mut cluster, mut dir, mut sub, mut foreground) = (None, None, false, false);
    let mut i = 1;
    while i < args.len() {
        let a = args[i];
        if a == b"--cluster" {
            cluster = args
                .get(i + 1)
                .map(|c| PathBuf::from(std::ffi::OsStr::from_bytes(c)));
            i += 1;
        } else if let Some(c) = a.strip_prefix(b"--cluster=") {
            cluster = Some(PathBuf::from(std::ffi::OsStr::from_bytes(c)));
        } else if a == b"--foreground" {
            foreground = true;
        } else if !sub {
            if a != b"mount" {
                return None;
            }
            sub = true;
        } else if dir.is_none() && !a.starts_with(b"-") {
            dir = Some(PathBuf::from(std::ffi::OsStr::from_bytes(a)));
        }
        i += 1;
    }
    if !foreground {
        return None;
    }
    Some(DaemonArgs { dir: dir?, cluster })
}

/// Whether `client`'s cluster is the file system `local` (a path inside a
/// MadFS mount) shows: `fs_path` has the same inode number and change time
/// both ways. Err says why not.
pub async fn same_fs(client: &Client, fs_path: &str, local: &Path) -> Result<(), String> {
    let k = std::fs::symlink_metadata(local)
        .map_err(|e| format!("cannot stat '{}': {e}", local.display()))?;
    let a = client
        .lstat(fs_path)
        .await
        .map_err(|e| format!("'{fs_path}': {}", crate::files::shown(&e)))?;
    let kernel = (k.ino(), k.ctime(), k.ctime_nsec());
    let madfs = (a.ino.0, a.ctime.secs, i64::from(a.ctime.nanos));
    if kernel == madfs {
        Ok(())
    } else {
        Err(format!(
            "'{}' is inode {} (ctime {}.{:09}) through the mount, but '{fs_path}' is inode {} \
             (ctime {}.{:09}) in the cluster",
            local.display(),
            kernel.0,
            kernel.1,
            kernel.2,
            madfs.0,
            madfs.1,
            madfs.2
        ))
    }
}

/// The cluster file to use for a path in the MadFS mount at `mount_point`:
/// its daemon's, else `fallback` (--cluster, $MADFS_CLUSTER, default), the
/// first that connects and serves the same file system as the mount (see
/// [`same_fs`]). Returns the file and a connected client.
pub async fn mount_client(
    mount_point: &Path,
    local: &Path,
    fs_path: &str,
    fallback: Option<&Path>,
) -> Result<(PathBuf, Client), String> {
    let mut tried = Vec::new();
    let fallback = madfs_client::ClusterConfig::locate(fallback);
    let candidates = mount_cluster(mount_point)
        .into_iter()
        .chain(std::iter::once(fallback));
    for file in candidates {
        if tried.iter().any(|(f, _): &(PathBuf, String)| *f == file) {
            continue;
        }
        match Client::connect(Some(&file)) {
            Ok(c) => match same_fs(&c, fs_path, local).await {
                Ok(()) => return Ok((file, c)),
                Err(e) => tried.push((file, e)),
            },
            Err(e) => tried.push((file, e.to_string())),
        }
    }
    Err(format!(
        "'{}' is in the MadFS mount at {}, but no cluster file serves it ({}); \
         give the right one with --cluster",
        local.display(),
        mount_point.display(),
        tried
            .iter()
            .map(|(f, e)| format!("{}: {e}", f.display()))
            .collect::<Vec<_>>()
            .join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_paths_are_matched_lexically() {
        assert_eq!(under_prefix("/madfs", "/madfs").as_deref(), Some("/"));
        assert_eq!(under_prefix("/madfs/", "/madfs").as_deref(), Some("/"));
        assert_eq!(
            under_prefix("/madfs/a/b", "/madfs").as_deref(),
            Some("/a/b")
        );
        assert_eq!(under_prefix("/madfs//a", "/madfs").as_deref(), Some("/a"));
        assert_eq!(under_prefix("/madfsx/a", "/madfs"), None);
        assert_eq!(under_prefix("/tmp/madfs/a", "/madfs"), None);
        assert_eq!(
            under_prefix("/scratch/m/x", "/scratch/m").as_deref(),
            Some("/x")
        );
    }

    #[test]
    fn daemon_command_lines_are_recognized() {
        let line = |s: &str| s.replace(' ', "\0").into_bytes();
        assert_eq!(
            parse_mount_daemon(&line(
                "/x/madfs --cluster /d/cluster.toml mount /tmp/m --foreground"
            )),
            Some(DaemonArgs {
                dir: "/tmp/m".into(),
                cluster: Some("/d/cluster.toml".into())
            })
        );
        assert_eq!(
            parse_mount_daemon(&line("madfs mount --foreground mnt --cluster=c.toml")),
            Some(DaemonArgs {
                dir: "mnt".into(),
                cluster: Some("c.toml".into())
            })
        );
        assert_eq!(
            parse_mount_daemon(&line("madfs mount m --foreground")),
            Some(DaemonArgs {
                dir: "m".into(),
                cluster: None
            })
        );
        // Not the daemon: `madfs mount` returns after starting it.
        assert_eq!(parse_mount_daemon(&line("madfs mount /tmp/m")), None);
        assert_eq!(
            parse_mount_daemon(&line("madfs ls /tmp/m --foreground")),
            None
        );
        assert_eq!(parse_mount_daemon(&line("cp mount /x --foreground")), None);
        assert_eq!(parse_mount_daemon(b""), None);
    }

    #[test]
    fn plain_and_relative_paths() {
        let l = locate("/no/such/madfs/dir", "/madfs").unwrap();
        assert_eq!(l.via, Via::Plain);
        assert_eq!(l.fs_path, "/no/such/madfs/dir");
        let l = locate("/madfs/run/d", "/madfs").unwrap();
        assert_eq!(l.via, Via::Prefix("/madfs".into()));
        assert_eq!(l.fs_path, "/run/d");
        assert!(locate("no-such-relative-dir", "/madfs").is_err());
    }
}
