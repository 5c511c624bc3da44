//! A FUSE mount of a `TestCluster` for the tests of the mount
//! (`madfs mount DIR --cluster FILE`), torn down when the guard is dropped,
//! even when the test panics: `madfs umount DIR`, then `fusermount3 -uz DIR`
//! if the mount is still there, then the mount process is reaped.
//!
//! Every wait is bounded. A watchdog ends a mount that outlives its time
//! limit (a hung daemon would otherwise hang its test forever): it kills the
//! mount's processes and detaches the mount, so every blocked system call on
//! it fails (ENOTCONN) and the test fails instead of hanging.
//!
//! Include it next to `common` with
//! `#[path = "common/mount.rs"] mod mount;`.
#![allow(dead_code)]

use crate::common::{tail, TestCluster, MADFS};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `Mount::new` waits for the file system to appear.
const MOUNT_DEADLINE: Duration = Duration::from_secs(30);
/// How long one unmount command may take.
const UMOUNT_DEADLINE: Duration = Duration::from_secs(30);
/// How long the mount process may take to exit once unmounted.
const EXIT_DEADLINE: Duration = Duration::from_secs(15);
/// The watchdog's default limit on a mount's life.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

pub struct Mount<'a> {
    tc: &'a TestCluster,
    /// Holds the mount point; 0755 (a temporary directory is 0700) so that
    /// other users can reach the mount.
    holder: Option<tempfile::TempDir>,
    dir: PathBuf,
    log: PathBuf,
    /// `madfs mount` while it runs (in the foreground, or until it has
    /// daemonized).
    child: Option<Child>,
    watchdog: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// Is a FUSE file system mounted exactly at `dir`?
pub fn is_mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = escape_mountinfo(dir);
    info.lines().any(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let fstype = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 1));
        fields.get(4) == Some(&want.as_str()) && fstype.is_some_and(|t| t.starts_with("fuse"))
    })
}

/// A path as /proc/self/mountinfo writes it (space, tab, newline and
/// backslash as octal escapes).
fn escape_mountinfo(p: &Path) -> String {
    let mut s = String::new();
    for c in p.to_string_lossy().chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => s.push_str(&format!("\\{:03o}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

/// Run a command to completion within `limit` (killed after it); its exit
/// status and combined output, or a description of what went wrong.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<String, String> {
    let out_file = tempfile::tempfile().map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(out_file.try_clone().map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{cmd:?} did not finish within {limit:?}"));
            }
        }
    };
    let mut out = String::new();
    {
        use std::io::{Read, Seek};
        let mut f = out_file;
        let _ = f.rewind();
        let _ = f.read_to_string(&mut out);
    }
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{cmd:?}: {status}: {}", out.trim()))
    }
}

/// Pids of the processes whose command line mentions `dir` and `mount`
/// (the mount daemon, also after it daemonized): ours, as `dir` is unique.
fn mount_pids(dir: &Path) -> Vec<i32> {
    let want = dir.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&want) && args.contains(&&b"mount"[..]) {
            pids.push(pid);
        }
    }
    pids
}

impl<'a> Mount<'a> {
    /// Mount `tc` (`madfs mount DIR --cluster FILE`) and wait until the file
    /// system is there and answers.
    pub fn new(tc: &'a TestCluster) -> Mount<'a> {
        Mount::with_lifetime(tc, DEFAULT_LIFETIME)
    }

    /// As `new`, with the watchdog's limit on the mount's life.
    pub fn with_lifetime(tc: &'a TestCluster, lifetime: Duration) -> Mount<'a> {
        let holder = tempfile::Builder::new()
            .prefix("madfs-mnt-")
            .tempdir()
            .expect("tempdir for the mount point");
        std::fs::set_permissions(holder.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod mount holder");
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).expect("create mount point");
        let log = holder.path().join("mount.log");
        let log_file = std::fs::File::create(&log).expect("create mount log");
        let mut cmd = Command::new(MADFS);
        cmd.arg("mount")
            .arg(&dir)
            .arg("--cluster")
            .arg(tc.cluster_file())
            .env("MADFS_CLUSTER", tc.cluster_file())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        // Safety net when the test process dies: a mount process still in
        // the foreground is told to stop (and unmount) with its thread.
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn madfs mount");
        let mut m = Mount {
            tc,
            holder: Some(holder),
            dir,
            log,
            child: Some(child),
            watchdog: None,
        };
        m.wait_mounted();
        m.start_watchdog(lifetime);
        m
    }

    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + MOUNT_DEADLINE;
        loop {
            if is_mounted(&self.dir) {
                // Mounted: the root must answer too.
                match std::fs::metadata(&self.dir) {
                    Ok(md) if md.is_dir() => return,
                    Ok(_) => panic!("mount root {} is not a directory", self.dir.display()),
                    Err(e) => panic!(
                        "mount root {} does not answer: {e}\nmount log:\n{}",
                        self.dir.display(),
                        tail(&self.log, 40)
                    ),
                }
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    if !status.success() {
                        panic!(
                            "`madfs mount {}` exited ({status}) without mounting\n{}",
                            self.dir.display(),
                            self.log_tails()
                        );
                    }
                    // Exited successfully: it daemonized; keep polling.
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "{} not mounted within {MOUNT_DEADLINE:?}\n{}",
                    self.dir.display(),
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_watchdog(&mut self, lifetime: Duration) {
        let (tx, rx) = mpsc::channel::<()>();
        let dir = self.dir.clone();
        let child_pid = self.child.as_ref().map(|c| c.id() as i32);
        let h = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(lifetime) {
                eprintln!(
                    "WATCHDOG: mount {} outlived its limit of {lifetime:?} (hung?): \
                     killing its daemon and detaching it",
                    dir.display()
                );
                let mut pids = mount_pids(&dir);
                pids.extend(child_pid);
                for pid in pids {
                    // SAFETY: signalling a process we started (found by our
                    // unique mount point, or our own child).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let _ = run_bounded(
                    Command::new("fusermount3").arg("-uz").arg(&dir),
                    UMOUNT_DEADLINE,
                );
            }
        });
        self.watchdog = Some((tx, h));
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// A path inside the mount (`rel` relative to its root; a leading `/`
    /// is ignored).
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.dir.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// The mount's log (stdout and stderr of `madfs mount`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The tails of the logs of `madfs mount` and of the mount daemons
    /// (`mount*.log` beside the cluster file), for failure reports.
    pub fn log_tails(&self) -> String {
        let mut s = format!(
            "---- madfs mount {} (tail) ----\n{}\n",
            self.dir.display(),
            tail(&self.log, 30)
        );
        // The daemon's log is named after the mount point; the holder's
        // unique name (non-alphanumerics as `_`) picks this mount's.
        let holder_tag: String = self
            .dir
            .parent()
            .and_then(|p| p.file_name())
            .unwrap_or_default()
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let all_logs: Vec<PathBuf> = std::fs::read_dir(self.tc.root())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with("mount") && n.ends_with(".log")
            })
            .collect();
        let mut daemon_logs: Vec<PathBuf> = all_logs
            .iter()
            .filter(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .contains(&holder_tag)
            })
            .cloned()
            .collect();
        if daemon_logs.is_empty() {
            daemon_logs = all_logs;
        }
        daemon_logs.sort();
        for p in daemon_logs {
            s.push_str(&format!(
                "---- {} (tail) ----\n{}\n",
                p.display(),
                tail(&p, 30)
            ));
        }
        s
    }

    pub fn cluster(&self) -> &'a TestCluster {
        self.tc
    }

    /// Unmount with `madfs umount DIR` and insist that it works: the mount
    /// is gone and the mount process exits successfully.
    pub fn unmount(mut self) {
        self.stop_watchdog();
        let r = run_bounded(
            Command::new(MADFS)
                .arg("umount")
                .arg(&self.dir)
                .env("MADFS_CLUSTER", self.tc.cluster_file()),
            UMOUNT_DEADLINE,
        );
        if let Err(e) = r {
            panic!(
                "madfs umount failed: {e}\nmount log:\n{}",
                tail(&self.log, 40)
            );
        }
        assert!(
            !is_mounted(&self.dir),
            "{} still mounted after `madfs umount`",
            self.dir.display()
        );
        if let Some(mut c) = self.child.take() {
            let status = wait_bounded(&mut c, EXIT_DEADLINE);
            match status {
                Some(s) => assert!(
                    s.success(),
                    "madfs mount exited with {s} after unmount; log:\n{}",
                    tail(&self.log, 40)
                ),
                None => panic!(
                    "madfs mount still running {EXIT_DEADLINE:?} after unmount; log:\n{}",
                    tail(&self.log, 40)
                ),
            }
        }
        let deadline = Instant::now() + EXIT_DEADLINE;
        while !mount_pids(&self.dir).is_empty() {
            assert!(
                Instant::now() < deadline,
                "mount daemon of {} still running {EXIT_DEADLINE:?} after unmount",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some((tx, h)) = self.watchdog.take() {
            let _ = tx.send(());
            let _ = h.join();
        }
    }

    /// Best effort teardown (Drop): never panics.
    fn teardown(&mut self) {
        self.stop_watchdog();
        if is_mounted(&self.dir) {
            if let Err(e) = run_bounded(
                Command::new(MADFS)
                    .arg("umount")
                    .arg(&self.dir)
                    .env("MADFS_CLUSTER", self.tc.cluster_file()),
                UMOUNT_DEADLINE,
            ) {
                eprintln!("mount teardown: {e}");
            }
        }
        if is_mounted(&self.dir) {
            if let Err(e) = run_bounded(
                Command::new("fusermount3").arg("-uz").arg(&self.dir),
                UMOUNT_DEADLINE,
            ) {
                eprintln!("mount teardown: {e}");
            }
        }
        if let Some(mut c) = self.child.take() {
            if wait_bounded(&mut c, EXIT_DEADLINE).is_none() {
                eprintln!("mount teardown: madfs mount did not exit; killing it");
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // A daemonized mount process exits once unmounted; give it a
        // moment, then end it.
        let deadline = Instant::now() + EXIT_DEADLINE;
        loop {
            let pids = mount_pids(&self.dir);
            if pids.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for pid in pids {
                    // SAFETY: a process serving our unique mount point.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(h) = self.holder.take() {
            if is_mounted(&self.dir) {
                // Never recurse into a live mount: leave the directory.
                eprintln!("mount teardown: {} is still mounted", self.dir.display());
                std::mem::forget(h);
            } else {
                let _ = h.close();
            }
        }
    }
}

fn wait_bounded(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails());
        }
        self.teardown();
    }
}
