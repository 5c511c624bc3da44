//! `madfs cp` and `madfs sync` against real servers: trees with every kind
//! of entry go in and come back out identical, by `diff -r` and by
//! metadata (kinds, modes, owners, times, symlink targets, hard-link
//! structure, holes); `sync` copies only what changed, deletes with
//! --delete, compares contents with --checksum, and resumes a copy killed
//! half way (leaving no temporary file behind); a file the copier may not
//! read is reported by name while the rest is copied. Guards against
//! copies that lose metadata or leave partial files looking complete.

mod common;

use common::command::{must, output_within, text};
use common::{block_on_thread, need, pattern, TestCluster, MADFS};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const CMD_TIMEOUT: Duration = Duration::from_secs(60);
/// Parts of 1 MiB (MADFS_STAGE_PART_BYTES): a few MiB file is copied in
/// parts by several tasks, as an 8 GiB one would be.
const PART: &str = "1048576";

/// Run `madfs ARGS` on this cluster with `env`, killed after CMD_TIMEOUT.
fn madfs_env(tc: &TestCluster, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(MADFS);
    cmd.args(args)
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env("MADFS_STAGE_PART_BYTES", PART);
    for (k, v) in env {
        cmd.env(k, v);
    }
    output_within(cmd, CMD_TIMEOUT, None)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn set_mtime(p: &Path, secs: i64, nanos: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: nanos,
    };
    // SAFETY: valid C string and timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

/// A tree with every kind of entry the copy must carry over.
fn make_tree(root: &Path) {
    let long = "L".repeat(255);
    for d in ["a/b/c", "empty_dir", "with space", "ro"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("a/b/c/deep"), b"deep\n").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("with space/line\nbreak"), b"newline in the name").unwrap();
    std::fs::write(root.join(&long), b"a 255-byte name").unwrap();
    std::fs::write(root.join("a").join(&long), b"another").unwrap();
    for i in 0..40 {
        std::fs::write(
            root.join(format!("a/small{i}")),
            pattern(i, 100 + 97 * i as usize),
        )
        .unwrap();
    }
    std::fs::write(root.join("medium"), pattern(77, 300_000)).unwrap();
    // Cut into parts (1 MiB each here), copied by several tasks at once.
    std::fs::write(root.join("parted"), pattern(78, 5 * 1024 * 1024 + 12345)).unwrap();
    // Sparse: data at 0, a hole, data at 9 MiB, a hole to the end.
    let f = std::fs::File::create(root.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&pattern(5, 70_000), 0).unwrap();
    f.write_all_at(&pattern(6, 4096), 9 << 20).unwrap();
    f.set_len(16 << 20).unwrap();
    drop(f);
    std::fs::hard_link(root.join("a/b/c/deep"), root.join("hard1")).unwrap();
    std::fs::hard_link(root.join("a/b/c/deep"), root.join("with space/hard2")).unwrap();
    std::os::unix::fs::symlink("a/b/c/deep", root.join("sym")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at all", root.join("dangling")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    for (p, mode) in [
        ("a/small3", 0o600),
        ("medium", 0o4755),
        ("ro", 0o555),
        ("a/b", 0o750),
    ] {
        std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::lchown(root.join("a/small4"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::lchown(root.join("sym"), Some(42), Some(43)).unwrap();
    // Times with nanoseconds, set last (children before their parents).
    let mut all: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.symlink_metadata().unwrap().is_dir() {
                stack.push(p.clone());
            }
            all.push(p);
        }
    }
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(p, 1_600_000_000 + i as i64 * 1000, 123_456_789);
    }
    set_mtime(root, 1_500_000_000, 5);
}

/// Every entry below `root` by relative path: kind and mode, owner, size
/// (not for directories), mtime, symlink target, and for a file with
/// several names the first of them (the hard-link structure).
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut first_name: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut paths = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.symlink_metadata().unwrap().is_dir() {
                stack.push(p.clone());
            }
            paths.push(p);
        }
    }
    paths.sort();
    for p in paths {
        let m = p.symlink_metadata().unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let size = if m.is_dir() { 0 } else { m.size() };
        let target = if m.file_type().is_symlink() {
            std::fs::read_link(&p)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        let link = if m.is_file() && m.nlink() > 1 {
            first_name
                .entry(m.ino())
                .or_insert_with(|| rel.clone())
                .clone()
        } else {
            String::new()
        };
        out.insert(
            rel,
            format!(
                "mode {:o} owner {}:{} size {size} mtime {}.{:09} target '{target}' link '{link}'",
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec()
            ),
        );
    }
    out
}

fn assert_same_tree(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .args(["-r", "--no-dereference", "--exclude=fifo", s(a), s(b)])
        .output()
        .expect("diff");
    assert!(out.status.success(), "diff -r: {}", text(&out));
    let (sa, sb) = (snapshot(a), snapshot(b));
    for (k, v) in &sa {
        assert_eq!(Some(v), sb.get(k), "{k} differs");
    }
    assert_eq!(
        sa.len(),
        sb.len(),
        "{:?}",
        sb.keys()
            .filter(|k| !sa.contains_key(*k))
            .collect::<Vec<_>>()
    );
}

/// Names of temporary files left anywhere in MadFS.
fn madfs_temps(tc: &TestCluster) -> String {
    String::from_utf8_lossy(&tc.madfs(["find", "/", "-name", ".madfs-stage-*"]).stdout).into_owned()
}

#[test]
fn trees_of_every_kind_round_trip_with_their_metadata() {
    need("diff", "diffutils");
    // (Each call below takes a fresh client: a client's connections
    // belong to the runtime that opened them, and each block_on_thread
    // is a new one.)
    let tc = TestCluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    make_tree(&src);

    // A sparse file alone first: its holes are not stored.
    must(madfs_env(
        &tc,
        &["cp", "-a", s(&src.join("sparse")), "madfs:/sparse"],
        &[],
    ));
    let a = block_on_thread(tc.client().lstat("/sparse")).unwrap();
    assert_eq!(a.size, 16 << 20);
    let stored: u64 = block_on_thread(tc.client().server_stats())
        .into_iter()
        .map(|(_, s)| s.unwrap().data_bytes)
        .sum();
    assert!(
        stored < 2 << 20,
        "the servers hold {stored} bytes of a 16 MiB sparse file"
    );

    // In (making the missing /in), with checksums compared after the
    // copy; again over the first copy; then out.
    let out = must(madfs_env(
        &tc,
        &["cp", "-a", "--verify", s(&src), "madfs:/in/"],
        &[],
    ));
    assert!(out.contains("verified") && !out.contains("FAILED"), "{out}");
    must(madfs_env(&tc, &["cp", "-a", s(&src), "madfs:/in/"], &[]));
    let back = work.path().join("back");
    must(madfs_env(
        &tc,
        &["cp", "-a", "--verify", "madfs:/in/src", s(&back)],
        &[],
    ));
    assert_same_tree(&src, &back);
    assert_eq!(madfs_temps(&tc), "");
    // The holes stayed holes on the way out.
    let blocks = std::fs::metadata(back.join("sparse")).unwrap().blocks();
    assert!(
        blocks * 512 < 1 << 20,
        "sparse came back with {blocks} blocks"
    );

    // Within MadFS, and local to local, by the same engine.
    must(madfs_env(
        &tc,
        &["cp", "-a", "madfs:/in/src", "madfs:/copy"],
        &[],
    ));
    let back2 = work.path().join("back2");
    must(madfs_env(
        &tc,
        &["cp", "-r", "-a", "madfs:/copy", s(&back2)],
        &[],
    ));
    assert_same_tree(&src, &back2);

    // Plain -r: contents and kinds, but new times and no owner change.
    let plain = work.path().join("plain");
    must(madfs_env(
        &tc,
        &["cp", "-r", "madfs:/in/src", s(&plain)],
        &[],
    ));
    let out = Command::new("diff")
        .args([
            "-r",
            "--no-dereference",
            "--exclude=fifo",
            s(&src),
            s(&plain),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_ne!(
        std::fs::metadata(plain.join("medium")).unwrap().mtime(),
        1_600_000_000
    );

    // A directory without -r is refused by name; a missing source too,
    // while the other sources are copied; the exit status says so.
    let out = madfs_env(
        &tc,
        &[
            "cp",
            s(&src),
            "/nonexistent/x",
            s(&src.join("empty")),
            "madfs:/in/",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-r not specified; omitting directory"),
        "{err}"
    );
    assert!(err.contains("'/nonexistent/x'"), "{err}");
    assert!(block_on_thread(tc.client().lstat("/in/empty")).is_ok());
}

#[test]
fn sync_copies_what_changed_and_resumes_after_a_kill() {
    need("diff", "diffutils");
    let tc = TestCluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    make_tree(&src);

    // One item at a time, killed (SIGKILL, by the test fault) once 8 are
    // reported: the 6 parts of "parted" (its copy complete and renamed),
    // and 2 of the 16 parts of "sparse" (maybe a few more: the task runs
    // ahead of the reports), written under a temporary name that nobody
    // takes for the file.
    let kill = [("MADFS_FAULT_STAGE_EXIT_AFTER", "8")];
    let out = madfs_env(&tc, &["sync", "--jobs", "1", s(&src), "madfs:/t"], &kill);
    assert_eq!(out.status.code(), None, "not killed: {}", text(&out));
    assert!(block_on_thread(tc.client().lstat("/t/parted")).is_ok());
    if let Ok(a) = block_on_thread(tc.client().lstat("/t/sparse")) {
        panic!("the sparse file looks complete after the kill: {a:?}");
    }
    assert_ne!(madfs_temps(&tc), "", "no temporary file left by the kill");

    // A rerun copies the rest, and only the rest (the finished parted
    // file, and whatever the worker finished before the kill, is kept),
    // and cleans up.
    let out = must(madfs_env(&tc, &["sync", s(&src), "madfs:/t"], &[]));
    assert!(out.contains(" up to date"), "{out}");
    assert_eq!(madfs_temps(&tc), "");
    let back = work.path().join("back");
    must(madfs_env(&tc, &["sync", "madfs:/t", s(&back)], &[]));
    assert_same_tree(&src, &back);

    // Unchanged: nothing to copy.
    let out = must(madfs_env(&tc, &["sync", s(&src), "madfs:/t"], &[]));
    assert!(out.starts_with("madfs sync: 0 files"), "{out}");

    // One file changed, one added, one removed: the dry run says so and
    // changes nothing; the sync copies the two; --delete removes the third.
    std::fs::write(src.join("a/small7"), b"changed").unwrap();
    std::fs::write(src.join("a/b/new"), b"new").unwrap();
    std::fs::remove_file(src.join("a/small8")).unwrap();
    let dry = must(madfs_env(
        &tc,
        &["sync", "--dry-run", "--delete", s(&src), "madfs:/t"],
        &[],
    ));
    let actions: Vec<&str> = dry.lines().filter(|l| !l.starts_with("would")).collect();
    assert_eq!(actions.len(), 3, "{dry}");
    assert!(dry.contains("delete madfs:/t/a/small8"), "{dry}");
    assert!(block_on_thread(tc.client().lstat("/t/a/b/new")).is_err());
    let out = must(madfs_env(&tc, &["sync", s(&src), "madfs:/t"], &[]));
    assert!(out.starts_with("madfs sync: 2 files"), "{out}");
    assert!(block_on_thread(tc.client().lstat("/t/a/small8")).is_ok());
    must(madfs_env(
        &tc,
        &["sync", "--delete", s(&src), "madfs:/t"],
        &[],
    ));
    assert!(block_on_thread(tc.client().lstat("/t/a/small8")).is_err());

    // Same size and mtime, other contents: only --checksum sees it.
    let p = src.join("a/small9");
    let m = std::fs::symlink_metadata(&p).unwrap();
    let mut data = std::fs::read(&p).unwrap();
    data[0] ^= 0xff;
    std::fs::write(&p, &data).unwrap();
    set_mtime(&p, m.mtime(), m.mtime_nsec());
    let out = must(madfs_env(&tc, &["sync", s(&src), "madfs:/t"], &[]));
    assert!(out.starts_with("madfs sync: 0 files"), "{out}");
    let out = must(madfs_env(
        &tc,
        &["sync", "--checksum", s(&src), "madfs:/t"],
        &[],
    ));
    assert!(out.starts_with("madfs sync: 1 files"), "{out}");
    let back = work.path().join("back2");
    must(madfs_env(
        &tc,
        &["sync", "--delete", "madfs:/t", s(&back)],
        &[],
    ));
    assert_same_tree(&src, &back);

    // A file where a directory now is, and the reverse: replaced.
    std::fs::remove_dir_all(src.join("empty_dir")).unwrap();
    std::fs::write(src.join("empty_dir"), b"now a file").unwrap();
    std::fs::remove_file(src.join("medium")).unwrap();
    std::fs::create_dir(src.join("medium")).unwrap();
    must(madfs_env(&tc, &["sync", s(&src), "madfs:/t"], &[]));
    must(madfs_env(&tc, &["sync", "madfs:/t", s(&back)], &[]));
    assert_same_tree(&src, &back);
}

#[test]
fn an_unreadable_file_is_reported_by_name_and_the_rest_is_copied() {
    need("setpriv", "util-linux");
    const NOBODY: u32 = 65534;
    let tc = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The copier runs as nobody (root could read anything): it gets its
    // own copy of the cluster file and key.
    let conf = work.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    std::fs::copy(tc.cluster_file(), conf.join("cluster.toml")).unwrap();
    std::fs::copy(tc.root().join("cluster.key"), conf.join("cluster.key")).unwrap();
    for p in [&conf, &conf.join("cluster.toml"), &conf.join("cluster.key")] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..10 {
        std::fs::write(src.join(format!("d/f{i}")), format!("file {i}")).unwrap();
    }
    std::fs::write(src.join("d/secret"), b"root only").unwrap();
    std::fs::set_permissions(src.join("d/secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    block_on_thread(tc.client().mkdir("/drop", 0o755)).unwrap();
    block_on_thread(tc.client().chown("/drop", Some(NOBODY), Some(NOBODY))).unwrap();

    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ])
    .arg(MADFS)
    .args([
        "--cluster",
        s(&conf.join("cluster.toml")),
        "cp",
        "-r",
        s(&src),
        "madfs:/drop/",
    ]);
    let out = output_within(cmd, CMD_TIMEOUT, None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let secret = src.join("d/secret");
    assert!(
        err.contains(&format!(
            "cannot open '{}': Permission denied",
            secret.display()
        )),
        "{err}"
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains("10 files") && summary.contains("1 FAILED"),
        "{summary}"
    );
    for i in 0..10 {
        let got = block_on_thread(tc.client().read_file(format!("/drop/src/d/f{i}"))).unwrap();
        assert_eq!(got, format!("file {i}").as_bytes());
    }
    assert!(block_on_thread(tc.client().lstat("/drop/src/d/secret")).is_err());
    assert_eq!(madfs_temps(&tc), "");
}
