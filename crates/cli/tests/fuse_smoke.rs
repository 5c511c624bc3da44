//! Smoke test of the FUSE mount: `madfs mount` a test cluster, use it with
//! plain std::fs while the CLI (the client library, no mount) checks the
//! other side, then `madfs umount`. A guard unmounts whatever happens
//! (lazily if need be), so a failing test never leaves a mount behind.

mod common;

use common::{pattern, TestCluster};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Unmounts on drop: `madfs umount`, then `madfs umount -l`, then
/// fusermount3 -uz, stopping at the first that leaves no mount.
struct MountGuard<'a> {
    tc: &'a TestCluster,
    dir: PathBuf,
    _holder: tempfile::TempDir,
}

impl MountGuard<'_> {
    fn mount(tc: &TestCluster) -> MountGuard<'_> {
        let holder = tempfile::Builder::new()
            .prefix("madfs-smoke-")
            .tempdir()
            .expect("tempdir");
        let dir = holder.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let out = tc.madfs([Path::new("mount"), &dir]);
        assert!(
            out.status.success(),
            "madfs mount failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // `madfs mount` returns only once the mount is there.
        assert!(
            madfs_fuse::is_madfs_mount(&dir),
            "not mounted after madfs mount"
        );
        MountGuard {
            tc,
            dir,
            _holder: holder,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

impl Drop for MountGuard<'_> {
    fn drop(&mut self) {
        let attempts: [&[&str]; 2] = [&["umount"], &["umount", "-l"]];
        for args in attempts {
            if !madfs_fuse::is_madfs_mount(&self.dir) {
                return;
            }
            let mut a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
            a.push(self.dir.as_os_str());
            let _ = self.tc.madfs(a);
        }
        if madfs_fuse::is_madfs_mount(&self.dir) {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.dir)
                .status();
        }
    }
}

fn wait_unmounted(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while madfs_fuse::is_madfs_mount(dir) {
        assert!(Instant::now() < deadline, "{} still mounted", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mount_read_write_rename_unlink_umount() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "no /dev/fuse on this machine: the mount cannot be tested"
    );
    let tc = TestCluster::start(3);
    let m = MountGuard::mount(&tc);

    // Written through the mount, read through the library.
    std::fs::write(m.path("hello.txt"), b"hello from the mount\n").unwrap();
    assert_eq!(tc.madfs_ok(["cat", "/hello.txt"]), "hello from the mount\n");

    // A file over several chunks (1 MiB chunks in test clusters), so writes
    // go to several servers and the size is published at close.
    let big = pattern(7, 3 * 1024 * 1024 + 12345);
    std::fs::write(m.path("big.bin"), &big).unwrap();
    let local = tc.root().join("big.copy");
    tc.madfs_ok([Path::new("get"), Path::new("/big.bin"), &local]);
    assert!(std::fs::read(&local).unwrap() == big, "big.bin differs");

    // Written through the library, read through the mount.
    let src = tc.root().join("src.bin");
    let data = pattern(9, 2 * 1024 * 1024 + 1);
    std::fs::write(&src, &data).unwrap();
    tc.madfs_ok([Path::new("put"), &src, Path::new("/from-cli.bin")]);
    assert!(std::fs::read(m.path("from-cli.bin")).unwrap() == data);
    assert_eq!(
        std::fs::metadata(m.path("from-cli.bin")).unwrap().len(),
        data.len() as u64
    );

    // readdir
    std::fs::create_dir(m.path("dir")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["big.bin", "dir", "from-cli.bin", "hello.txt"]);

    // rename (into another directory) and unlink
    std::fs::rename(m.path("hello.txt"), m.path("dir/renamed.txt")).unwrap();
    assert!(!m.path("hello.txt").exists());
    assert_eq!(
        tc.madfs_ok(["cat", "/dir/renamed.txt"]),
        "hello from the mount\n"
    );
    std::fs::remove_file(m.path("big.bin")).unwrap();
    let ls = tc.madfs_ok(["ls", "/"]);
    assert!(!ls.contains("big.bin"), "{ls}");
    assert_eq!(
        std::fs::metadata(m.path("big.bin")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );

    // umount
    let dir = m.dir.clone();
    tc.madfs_ok([Path::new("umount"), &dir]);
    wait_unmounted(&dir);
    let again = tc.madfs([Path::new("umount"), &dir]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not mounted"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    drop(m);
}
