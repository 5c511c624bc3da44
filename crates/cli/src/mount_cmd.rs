//! `madfs mount` and `madfs umount`: the FUSE mount (crates/fuse) as a
//! command. By default `mount` starts itself again with --foreground as a
//! detached daemon (own session, output to a log file), waits until the
//! directory really is a MadFS mount, and returns; --foreground serves in
//! this process until unmounted or signalled.

use madfs_fuse::{absolute, is_madfs_mount, MountConfig};
use madfs_rpc::ClusterConfig;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// How long `madfs mount` waits for its daemon to have mounted.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

pub fn mount(cluster: Option<&Path>, dir: &Path, foreground: bool) -> Result<ExitCode, String> {
    if foreground {
        madfs_fuse::run(&MountConfig::new(cluster, dir))?;
        return Ok(ExitCode::SUCCESS);
    }
    // Check what can be checked here, so mistakes show in this terminal
    // rather than only in the daemon's log.
    let cluster_path =
        absolute(&ClusterConfig::locate(cluster)).map_err(|e| format!("cluster file: {e}"))?;
    ClusterConfig::load(&cluster_path).map_err(|e| e.to_string())?;
    let abs = absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if is_madfs_mount(&abs) {
        return Err(format!("{} is already a MadFS mount", abs.display()));
    }
    if !abs.is_dir() {
        return Err(format!("{} is not a directory", abs.display()));
    }
    // The daemon is told the directory as given when absolute, so that it
    // shows in its command line as the user typed it.
    let daemon_dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        abs.clone()
    };
    let log_path = log_file(&cluster_path, &abs);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("mount log {}: {e}", log_path.display()))?;
    let start_len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("--cluster")
        .arg(&cluster_path)
        .arg("mount")
        .arg(&daemon_dir)
        .arg("--foreground")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // A session of its own: no terminal, no SIGINT/SIGHUP from the shell
    // that started it.
    // SAFETY: setsid is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the mount daemon: {e}"))?;
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    loop {
        if is_madfs_mount(&abs) {
            println!(
                "MadFS mounted on {} (pid {}, log {})",
                abs.display(),
                child.id(),
                log_path.display()
            );
            println!("  madfs umount {}   # to unmount", abs.display());
            return Ok(ExitCode::SUCCESS);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // The daemon exits successfully only after it mounted: it was
            // unmounted again between two looks (a quick `madfs umount`).
            if status.success() {
                println!(
                    "MadFS mounted on {} and already unmounted again (log {})",
                    abs.display(),
                    log_path.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            return Err(format!(
                "mounting {} failed ({status}):\n{}",
                abs.display(),
                log_since(&log_path, start_len)
            ));
        }
        if Instant::now() > deadline {
            // SAFETY: signalling the daemon this process just started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_millis(500));
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} was not mounted within {MOUNT_TIMEOUT:?}; the daemon's log ({}):\n{}",
                abs.display(),
                log_path.display(),
                log_since(&log_path, start_len)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where the daemon logs: next to the cluster file when that directory is
/// writable (a local cluster's data directory), else in /tmp; one file per
/// mount point.
fn log_file(cluster_path: &Path, mountpoint: &Path) -> PathBuf {
    let tag: String = mountpoint
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let name = format!("mount{tag}.log");
    if let Some(dir) = cluster_path.parent() {
        let p = dir.join(&name);
        if std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .is_ok()
        {
            return p;
        }
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("madfs-{uid}-{name}"))
}

/// What the log gained since it was `from` bytes long (at most the last
/// 40 lines).
fn log_since(path: &Path, from: u64) -> String {
    let all = std::fs::read(path).unwrap_or_default();
    let new = String::from_utf8_lossy(all.get(from as usize..).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = new.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

pub fn umount(dir: &Path, lazy: bool) -> Result<ExitCode, String> {
    madfs_fuse::unmount(dir, lazy)?;
    // The daemon notices the unmount and exits by itself.
    Ok(ExitCode::SUCCESS)
}
