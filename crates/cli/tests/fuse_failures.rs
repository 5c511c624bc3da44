//! What a mount does when things go wrong underneath it: a server killed
//! while mounted must give a prompt error (EIO-style, never a hang), and the
//! mount must work again once that server is back, with nothing that was
//! fsynced lost; unmounting while files are open must refuse (busy) or, when
//! lazy, detach while the open files keep working and their data lands.

mod common;

use common::{pattern, TestCluster};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MADFS: &str = env!("CARGO_BIN_EXE_madfs");
/// An operation on a mount whose server died must answer within this.
const OP_DEADLINE: Duration = Duration::from_secs(40);

/// A mount owned by the test alone (the cluster stays mutable for kill9 and
/// restart); unmounted lazily on drop, whatever happened.
struct Mounted {
    dir: PathBuf,
    cluster: PathBuf,
    _holder: tempfile::TempDir,
}

impl Mounted {
    fn new(tc: &TestCluster) -> Mounted {
        let holder = tempfile::Builder::new()
            .prefix("madfs-fail-")
            .tempdir()
            .unwrap();
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let out = Command::new(MADFS)
            .arg("mount")
            .arg(&dir)
            .arg("--cluster")
            .arg(tc.cluster_file())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "madfs mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            madfs_fuse::is_madfs_mount(&dir),
            "not mounted after madfs mount"
        );
        Mounted {
            dir,
            cluster: tc.cluster_file().to_path_buf(),
            _holder: holder,
        }
    }

    fn umount(&self, lazy: bool) -> std::process::Output {
        let mut cmd = Command::new(MADFS);
        cmd.arg("umount");
        if lazy {
            cmd.arg("-l");
        }
        cmd.arg(&self.dir)
            .env("MADFS_CLUSTER", &self.cluster)
            .output()
            .unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if madfs_fuse::is_madfs_mount(&self.dir) {
            let _ = self.umount(true);
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.dir)
                .output();
        }
    }
}

/// Run `f` on its own thread; None if it did not finish by the deadline
/// (the thread is left behind: the test fails anyway).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(OP_DEADLINE)
        .unwrap_or_else(|_| panic!("{what} did not return within {OP_DEADLINE:?}: the mount hangs"))
}

fn read_all(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    std::fs::File::open(p)?.read_to_end(&mut v)?;
    Ok(v)
}

#[test]
fn a_dead_server_gives_prompt_errors_and_the_mount_recovers_after_restart() {
    let mut tc = TestCluster::start(3);
    let m = Mounted::new(&tc);
    // Enough files that every server holds some names and inodes.
    let files: Vec<(PathBuf, Vec<u8>)> = (0..24)
        .map(|i| {
            (
                m.dir.join(format!("f{i}")),
                pattern(i, 5000 + i as usize * 97),
            )
        })
        .collect();
    for (p, data) in &files {
        let mut f = std::fs::File::create(p).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    }

    tc.kill9(1);
    let probe = files.clone();
    let errors = bounded("reads with a dead server", move || {
        // Past the kernel's 1 s attribute cache, so every open asks.
        std::thread::sleep(Duration::from_millis(1100));
        probe
            .iter()
            .filter_map(|(p, _)| read_all(p).err())
            .map(|e| e.raw_os_error().unwrap_or(0))
            .collect::<Vec<i32>>()
    });
    assert!(
        !errors.is_empty(),
        "no read failed although server 1 was killed"
    );
    for errno in &errors {
        assert!(
            [libc::EIO, libc::ETIMEDOUT, libc::EHOSTDOWN].contains(errno),
            "a dead server must give EIO-style errors, got errno {errno}"
        );
    }
    // Files on the other servers keep working meanwhile: not everything failed.
    assert!(
        errors.len() < files.len(),
        "every read failed with one of three servers down"
    );

    tc.restart(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let bad: Vec<&PathBuf> = files
            .iter()
            .filter(|(p, data)| read_all(p).ok().as_ref() != Some(data))
            .map(|(p, _)| p)
            .collect();
        if bad.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after restart these still fail: {bad:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn unmounting_with_open_files_is_busy_and_lazy_unmount_keeps_them_working() {
    let tc = TestCluster::start(2);
    let m = Mounted::new(&tc);
    let path = m.dir.join("open-while-unmounting");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(b"before unmount\n").unwrap();

    let busy = m.umount(false);
    assert!(
        !busy.status.success(),
        "umount with an open file should refuse"
    );
    assert!(
        madfs_fuse::is_madfs_mount(&m.dir),
        "a refused umount must leave the mount"
    );

    let lazy = m.umount(true);
    assert!(
        lazy.status.success(),
        "umount -l: {}",
        String::from_utf8_lossy(&lazy.stderr)
    );
    assert!(
        !madfs_fuse::is_madfs_mount(&m.dir),
        "umount -l must detach the mount at once"
    );
    // The open file still works, and what it writes reaches the cluster.
    f.write_all(b"after unmount\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = tc.madfs(["cat", "/open-while-unmounting"]);
        if out.stdout == b"before unmount\nafter unmount\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "data written after a lazy unmount did not arrive: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
