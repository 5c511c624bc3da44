//! Real programs on the FUSE mount, each result checked: `cp -a` and
//! `tar` of a 1,000-file tree (compared with `diff -r` and attribute by
//! attribute), git, SQLite (python3's module and the `sqlite3` shell),
//! rsync, a large `dd` with checksums through the mount, `madfs get` and a
//! second mount; files crossing between the mount and the `madfs` command;
//! two mounts of one cluster; and the mount guard itself.
//!
//! Needs the programs git, rsync, sqlite3, python3 (with its sqlite3
//! module), tar, diffutils and coreutils (Debian: git rsync sqlite3
//! python3 tar diffutils coreutils); a missing one fails its test with the
//! package to install.

mod common;
#[path = "common/mount.rs"]
mod mount;

use common::{need, pattern, TestCluster};
use mount::{is_mounted, Mount};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

const SERVERS: usize = 3;

/// Bytes of the large `dd` file.
const DD_MIB: usize = 1024;

// ---- helpers ------------------------------------------------------------

/// Run a command with a clean, deterministic environment; insist that it
/// succeeds; its stdout.
#[track_caller]
fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn sh(script: &str) -> String {
    run(Command::new("sh").arg("-c").arg(script))
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_string()
}

fn sha256_bytes(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Open `path` once and read it whole: its content and the size fstat
/// gives on that descriptor (what a program opening the file sees).
fn open_and_read(path: &Path) -> (Vec<u8>, u64) {
    use std::io::Read;
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut data = Vec::new();
    f.read_to_end(&mut data).unwrap();
    let size = f.metadata().unwrap().len();
    (data, size)
}

/// Close-to-open: after another client replaced `path` (and closed it), a
/// new open here reads exactly `want`, and fstat and stat give its size.
#[track_caller]
fn assert_sees(path: &Path, want: &[u8], what: &str) {
    let (data, fsize) = open_and_read(path);
    if data != want {
        let common = data.len().min(want.len());
        let first_diff = (0..common).find(|&i| data[i] != want[i]);
        let extra = &data[common..];
        panic!(
            "{what}: a new open read {} bytes, want {}; first differing byte: {first_diff:?}; \
             bytes past the wanted end: {} ({}); fstat size {fsize}",
            data.len(),
            want.len(),
            extra.len(),
            if extra.iter().all(|b| *b == 0) {
                "all zero"
            } else {
                "not zero"
            },
        );
    }
    assert_eq!(
        fsize,
        want.len() as u64,
        "{what}: fstat size after a new open"
    );
    let size = std::fs::metadata(path).unwrap().len();
    assert_eq!(size, want.len() as u64, "{what}: stat size");
}

/// A local scratch directory (0755, so other users could read it too).
fn scratch(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Generate the test tree under `root`: 1,000 files in 40 directories three
/// levels deep, of many sizes (empty, inline, past the 64 KiB inline limit,
/// over several 1 MiB chunks), modes and past modification times; 30
/// symlinks (relative, to directories, dangling, absolute); an empty
/// directory; odd names.
fn make_tree(root: &Path) -> usize {
    std::fs::create_dir_all(root).unwrap();
    let mut n = 0;
    for a in 0..5 {
        for b in 0..4 {
            for c in 0..2 {
                let dir = root.join(format!("a{a}/b{b}/c{c}"));
                std::fs::create_dir_all(&dir).unwrap();
                for i in 0..25 {
                    let k = n as u64;
                    let size = match n {
                        n if n % 250 == 7 => 2 * 1024 * 1024 + 12345, // several chunks
                        n if n % 50 == 3 => 100 * 1024 + n,           // past inline
                        n if n % 13 == 0 => 0,
                        n => (n * 37) % 5000,
                    };
                    let name = if i == 24 {
                        format!("odd name {n} \u{e9}")
                    } else {
                        format!("f{i}.dat")
                    };
                    let p = dir.join(name);
                    std::fs::write(&p, pattern(k, size)).unwrap();
                    let mode = match n % 11 {
                        0 => 0o600,
                        1 => 0o755,
                        2 => 0o640,
                        3 => 0o444,
                        _ => 0o644,
                    };
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
                    let f = std::fs::OpenOptions::new().write(true).open(&p);
                    // 0444 files: set the time through a read-only handle.
                    let f = f.or_else(|_| std::fs::File::open(&p)).unwrap();
                    let t = UNIX_EPOCH + Duration::new(1_600_000_000 + k * 3600, (k * 7919) as u32);
                    f.set_times(std::fs::FileTimes::new().set_modified(t).set_accessed(t))
                        .unwrap();
                    n += 1;
                }
            }
        }
    }
    let links: [(&str, &str); 6] = [
        ("a0/b0/c0/l-sibling", "f1.dat"),
        ("a0/b0/l-dir", "c1"),
        ("a1/l-up", "../a2/b1/c0/f3.dat"),
        ("a2/b3/c1/l-dangling", "no/such/file"),
        ("a3/l-abs", "/etc/hostname"),
        ("a4/b2/l-self-dir", "."),
    ];
    let mut count = 0;
    for round in 0..5 {
        for (p, t) in links {
            std::os::unix::fs::symlink(t, root.join(format!("{p}-{round}"))).unwrap();
            count += 1;
        }
    }
    assert_eq!(count, 30);
    std::fs::create_dir_all(root.join("a4/empty")).unwrap();
    set_dir_times(root);
    n
}

/// Give every directory under `root` (and `root`) a distinct modification
/// time in the past, so that copies must carry them over (rsync skips a
/// directory whose time is in the same second as the copy's).
fn set_dir_times(root: &Path) {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        for e in std::fs::read_dir(&dirs[i]).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            }
        }
        i += 1;
    }
    for (k, d) in dirs.iter().enumerate() {
        let t = UNIX_EPOCH + Duration::new(1_500_000_000 + k as u64 * 86_400, 1000 * k as u32 + 1);
        std::fs::File::open(d)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_modified(t).set_accessed(t))
            .unwrap();
    }
}

/// Compare two trees entry by entry: kinds, permission bits, sizes,
/// contents (by diff -r), symlink targets, and modification times of files
/// and directories (to `time_granularity_ns`). A list of differences.
fn compare_trees(a: &Path, b: &Path, time_granularity_ns: i128) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(rel) = stack.pop() {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = match (
            std::fs::symlink_metadata(&pa),
            std::fs::symlink_metadata(&pb),
        ) {
            (Ok(x), Ok(y)) => (x, y),
            (x, y) => {
                diffs.push(format!("{}: {:?} vs {:?}", rel.display(), x.err(), y.err()));
                continue;
            }
        };
        seen += 1;
        let (ta, tb) = (ma.file_type(), mb.file_type());
        if (ta.is_dir(), ta.is_file(), ta.is_symlink())
            != (tb.is_dir(), tb.is_file(), tb.is_symlink())
        {
            diffs.push(format!("{}: kind {ta:?} vs {tb:?}", rel.display()));
            continue;
        }
        if ta.is_symlink() {
            let (la, lb) = (
                std::fs::read_link(&pa).unwrap(),
                std::fs::read_link(&pb).unwrap(),
            );
            if la != lb {
                diffs.push(format!("{}: link {la:?} vs {lb:?}", rel.display()));
            }
            continue;
        }
        if ma.mode() & 0o7777 != mb.mode() & 0o7777 {
            diffs.push(format!(
                "{}: mode {:o} vs {:o}",
                rel.display(),
                ma.mode() & 0o7777,
                mb.mode() & 0o7777
            ));
        }
        let t = |m: &std::fs::Metadata| {
            (m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128) / time_granularity_ns
        };
        if t(&ma) != t(&mb) {
            diffs.push(format!(
                "{}: mtime {}.{:09} vs {}.{:09}",
                rel.display(),
                ma.mtime(),
                ma.mtime_nsec(),
                mb.mtime(),
                mb.mtime_nsec()
            ));
        }
        if ta.is_file() && ma.len() != mb.len() {
            diffs.push(format!(
                "{}: size {} vs {}",
                rel.display(),
                ma.len(),
                mb.len()
            ));
        }
        if ta.is_dir() {
            let list = |p: &Path| {
                let mut v: Vec<_> = std::fs::read_dir(p)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                v.sort();
                v
            };
            let (la, lb) = (list(&pa), list(&pb));
            if la != lb {
                diffs.push(format!("{}: entries {la:?} vs {lb:?}", rel.display()));
            }
            for name in la {
                stack.push(rel.join(name));
            }
        }
    }
    assert!(seen > 1, "compared nothing");
    let out = output(
        Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(a)
            .arg(b),
    );
    if !out.status.success() {
        diffs.push(format!(
            "diff -r: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    diffs
}

#[track_caller]
fn assert_same_trees(a: &Path, b: &Path, time_granularity_ns: i128) {
    let d = compare_trees(a, b, time_granularity_ns);
    assert!(
        d.is_empty(),
        "{} differs from {}:\n{}",
        b.display(),
        a.display(),
        d.iter().take(30).cloned().collect::<Vec<_>>().join("\n")
    );
}

// ---- the mount guard ----------------------------------------------------

#[test]
fn mount_guard_unmounts_on_unmount_drop_and_panic() {
    let tc = TestCluster::start(SERVERS);
    // Explicit `madfs umount`: the mount goes, the daemon exits.
    let m = Mount::new(&tc);
    let dir = m.path().to_path_buf();
    std::fs::write(m.join("f"), b"kept").unwrap();
    m.unmount();
    assert!(!is_mounted(&dir));
    // The data stays in the cluster.
    assert_eq!(tc.madfs_ok(["cat", "/f"]), "kept");
    // Dropped by a panic: unmounted, and the mount point removed.
    let mut dir = PathBuf::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let m = Mount::new(&tc);
        dir = m.path().to_path_buf();
        assert_eq!(std::fs::read(m.join("f")).unwrap(), b"kept");
        panic!("deliberate panic with a mount up");
    }));
    assert!(r.is_err());
    assert!(!is_mounted(&dir), "mount left behind after a panic");
    assert!(!dir.exists(), "mount point left behind after a panic");
    // Two mounts of one cluster at once.
    let a = Mount::new(&tc);
    let b = Mount::new(&tc);
    assert_eq!(std::fs::read(a.join("f")).unwrap(), b"kept");
    assert_eq!(std::fs::read(b.join("f")).unwrap(), b"kept");
}

// ---- another user ---------------------------------------------------------

/// Run a shell command as nobody:nogroup (util-linux setpriv).
fn sh_as_nobody(script: &str) -> Output {
    output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["sh", "-c", script]),
    )
}

#[test]
fn another_user_runs_shell_commands_on_the_mount() {
    need("setpriv", "util-linux");
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let pubd = m.join("pub");
    std::fs::create_dir(&pubd).unwrap();
    std::fs::set_permissions(&pubd, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(m.join("rootfile"), b"root\n").unwrap();
    // nobody creates, appends, lists, renames and removes in its directory.
    let script = format!(
        "set -e; cd '{}'; echo one > f; echo two >> f; mkdir d; mv f d/g; \
         cat d/g; ls d; ln -s d/g l; cat l; rm l d/g; rmdir d; id -u",
        pubd.display()
    );
    let out = sh_as_nobody(&script);
    assert!(
        out.status.success(),
        "as nobody: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "one\ntwo\ng\none\ntwo\n65534\n"
    );
    assert!(std::fs::read_dir(&pubd).unwrap().next().is_none());
    // and is refused what is root's.
    for (script, what) in [
        (
            format!("echo x > '{}'", m.join("rootfile").display()),
            "write root's file",
        ),
        (
            format!("echo x > '{}'", m.join("new").display()),
            "create in root's directory",
        ),
        (
            format!("rm -f '{}'", m.join("rootfile").display()),
            "remove root's file",
        ),
        (
            format!("chmod 777 '{}'", m.join("rootfile").display()),
            "chmod root's file",
        ),
    ] {
        let out = sh_as_nobody(&script);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: allowed");
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "{what}: {err}"
        );
    }
    assert_eq!(std::fs::read(m.join("rootfile")).unwrap(), b"root\n");
    assert!(!m.join("new").exists());
}

// ---- cp -a, tar, rsync ----------------------------------------------------

#[test]
fn cp_a_of_a_thousand_file_tree_is_identical() {
    need("cp", "coreutils");
    need("diff", "diffutils");
    let local = scratch("madfs-tools-");
    let src = local.path().join("src");
    assert_eq!(make_tree(&src), 1000);
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let t = Instant::now();
    run(Command::new("cp").arg("-a").arg(&src).arg(m.join("tree")));
    eprintln!("cp -a into the mount: {:?}", t.elapsed());
    // find walks the copy as it walks the source (it must not trust
    // directory link counts it does not get).
    let find = |root: &Path| {
        let out = run(Command::new("find")
            .arg(".")
            .arg("-printf")
            .arg("%y %m %s %P\\n")
            .current_dir(root));
        let mut lines: Vec<String> = out
            .lines()
            .map(|l| {
                // Directory sizes are file system specific.
                if l.starts_with("d ") {
                    let f: Vec<&str> = l.splitn(4, ' ').collect();
                    format!("d {} - {}", f[1], f.get(3).unwrap_or(&""))
                } else {
                    l.to_string()
                }
            })
            .collect();
        lines.sort();
        lines
    };
    let (fs, fm) = (find(&src), find(&m.join("tree")));
    // 1,000 files, 30 symlinks, 5 + 20 + 40 + 1 directories and the root.
    assert_eq!(fs.len(), 1000 + 30 + 66 + 1, "entries found in the source");
    assert!(fs == fm, "find lists the copy differently from the source");
    assert_same_trees(&src, &m.join("tree"), 1);
    // And out again, through the mount.
    let back = local.path().join("back");
    run(Command::new("cp").arg("-a").arg(m.join("tree")).arg(&back));
    assert_same_trees(&src, &back, 1);
    // The cluster agrees with the mount (through the client library).
    let big = "/tree/a0/b0/c0/f7.dat";
    let via_cli = tc.madfs(["cat", big]);
    assert!(via_cli.status.success());
    assert_eq!(via_cli.stdout, std::fs::read(m.join(big)).unwrap());
    assert_eq!(via_cli.stdout.len(), 2 * 1024 * 1024 + 12345);
}

#[test]
fn tar_round_trip_is_identical() {
    need("tar", "tar");
    need("diff", "diffutils");
    let local = scratch("madfs-tools-");
    let src = local.path().join("src");
    make_tree(&src);
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let dst = m.join("untarred");
    std::fs::create_dir(&dst).unwrap();
    sh(&format!(
        "set -e; tar -C '{}' -cf - . | tar -C '{}' -xpf -",
        src.display(),
        dst.display()
    ));
    // tar keeps whole seconds of mtime (its default format).
    assert_same_trees(&src, &dst, 1_000_000_000);
    // From the mount back out: tar also checks that nothing changes while
    // it reads (it fails with "file changed as we read it").
    let back = local.path().join("back");
    std::fs::create_dir(&back).unwrap();
    sh(&format!(
        "set -e; tar -C '{}' -cf '{}/t.tar' .; tar -C '{}' -xpf '{}/t.tar'",
        dst.display(),
        local.path().display(),
        back.display(),
        local.path().display()
    ));
    assert_same_trees(&src, &back, 1_000_000_000);
    // An archive written into the mount lists the same members.
    sh(&format!(
        "set -e; tar -C '{}' -cf '{}' .",
        src.display(),
        m.join("t.tar").display()
    ));
    let list = run(Command::new("tar").arg("-tf").arg(m.join("t.tar")));
    assert_eq!(list.lines().filter(|l| !l.ends_with('/')).count(), 1030);
}

#[test]
fn rsync_a_mirrors_and_updates_a_tree() {
    need("rsync", "rsync");
    need("diff", "diffutils");
    let local = scratch("madfs-tools-");
    let src = local.path().join("src");
    make_tree(&src);
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let dst = m.join("mirror");
    let src_slash = format!("{}/", src.display());
    run(Command::new("rsync").arg("-a").arg(&src_slash).arg(&dst));
    assert_same_trees(&src, &dst, 1);
    // Change the source: edit, grow, delete, add; rsync again (temporary
    // files renamed over the old ones, deletions).
    std::fs::write(src.join("a0/b0/c0/f0.dat"), b"changed").unwrap();
    std::fs::write(src.join("a1/b1/c1/f5.dat"), pattern(99, 300_000)).unwrap();
    std::fs::remove_file(src.join("a2/b2/c0/f3.dat")).unwrap();
    std::fs::remove_dir_all(src.join("a3/b3")).unwrap();
    std::fs::write(src.join("a4/empty/new"), b"new").unwrap();
    set_dir_times(&src);
    run(Command::new("rsync")
        .arg("-a")
        .arg("--delete")
        .arg(&src_slash)
        .arg(&dst));
    assert_same_trees(&src, &dst, 1);
    // A second run has nothing to do (sizes and times match exactly).
    let out = run(Command::new("rsync")
        .arg("-a")
        .arg("--delete")
        .arg("--itemize-changes")
        .arg(&src_slash)
        .arg(&dst));
    assert!(out.trim().is_empty(), "rsync found differences: {out}");
    // Checksums agree too.
    let out = run(Command::new("rsync")
        .arg("-a")
        .arg("--checksum")
        .arg("--itemize-changes")
        .arg(&src_slash)
        .arg(&dst));
    assert!(
        out.trim().is_empty(),
        "rsync --checksum found differences: {out}"
    );
}

// ---- git ----------------------------------------------------------------

#[test]
fn git_init_add_commit_log_fsck_gc_clone() {
    need("git", "git");
    let local = scratch("madfs-tools-");
    let home = local.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let repo = m.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| -> String {
        run(Command::new("git")
            .args([
                "-c",
                "user.name=MadFS Test",
                "-c",
                "user.email=test@madfs.invalid",
            ])
            .args(["-c", "init.defaultBranch=main", "-c", "gc.auto=0"])
            .args(args)
            .current_dir(&repo)
            .env("HOME", &home)
            .env("GIT_CONFIG_NOSYSTEM", "1"))
    };
    git(&["init", "-q"]);
    // Some files and directories, a large one, an executable, a symlink.
    for i in 0..50 {
        let d = repo.join(format!("src/mod{}", i % 5));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("file{i}.txt")),
            format!("line {i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    std::fs::write(repo.join("big.bin"), pattern(5, 3 * 1024 * 1024)).unwrap();
    std::fs::write(repo.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(repo.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/mod0/file0.txt", repo.join("link")).unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "first"]);
    // A second commit: edit, delete, rename.
    std::fs::write(repo.join("src/mod1/file1.txt"), b"edited\n").unwrap();
    std::fs::remove_file(repo.join("src/mod2/file2.txt")).unwrap();
    std::fs::rename(repo.join("src/mod3/file3.txt"), repo.join("renamed.txt")).unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "second"]);
    let log = git(&["log", "--format=%s"]);
    assert_eq!(log.lines().collect::<Vec<_>>(), vec!["second", "first"]);
    assert_eq!(git(&["status", "--porcelain"]), "", "clean work tree");
    git(&["fsck", "--full", "--strict"]);
    // Packing (packfiles are read by mmap) and fsck again.
    git(&["gc", "-q", "--aggressive", "--prune=now"]);
    git(&["fsck", "--full", "--strict"]);
    assert_eq!(git(&["status", "--porcelain"]), "");
    let files = git(&["ls-files"]);
    // 50 files, one deleted, plus big.bin, run.sh and link.
    assert_eq!(files.lines().count(), 50 - 1 + 3);
    // A clone out of the mount has the same content.
    let clone = local.path().join("clone");
    run(Command::new("git")
        .arg("clone")
        .arg("-q")
        .arg(&repo)
        .arg(&clone)
        .env("HOME", &home)
        .env("GIT_CONFIG_NOSYSTEM", "1"));
    assert_eq!(
        sha256(&clone.join("big.bin")),
        sha256(&repo.join("big.bin"))
    );
    assert_eq!(
        std::fs::read_link(clone.join("link")).unwrap(),
        Path::new("src/mod0/file0.txt")
    );
    assert_eq!(
        std::fs::metadata(clone.join("run.sh")).unwrap().mode() & 0o111,
        0o111
    );
}

// ---- SQLite ---------------------------------------------------------------

const SQLITE_PY: &str = r#"
import sqlite3, sys
path, mode = sys.argv[1], sys.argv[2]
con = sqlite3.connect(path, isolation_level=None)
if mode == "wal":
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, val REAL, blob BLOB)")
con.execute("BEGIN")
for i in range(1000):
    con.execute("INSERT INTO t VALUES (?, ?, ?, ?)", (i, "row%d" % i, i * 0.5, bytes([i % 256]) * (i % 700)))
con.execute("COMMIT")
# A transaction rolled back leaves nothing.
con.execute("BEGIN")
con.execute("DELETE FROM t")
con.execute("ROLLBACK")
con.execute("CREATE INDEX t_name ON t(name)")
con.close()
con = sqlite3.connect(path)
n, s, b = con.execute("SELECT count(*), sum(val), sum(length(blob)) FROM t").fetchone()
assert n == 1000, n
assert s == sum(i * 0.5 for i in range(1000)), s
assert b == sum(i % 700 for i in range(1000)), b
assert con.execute("SELECT name FROM t WHERE id = 777").fetchone()[0] == "row777"
assert con.execute("SELECT id FROM t WHERE name = 'row5'").fetchone()[0] == 5
assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
con.execute("UPDATE t SET val = -1 WHERE id % 2 = 0")
con.commit()
assert con.execute("SELECT count(*) FROM t WHERE val = -1").fetchone()[0] == 500
con.execute("VACUUM")
assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
con.close()
print("ok")
"#;

#[test]
fn sqlite_transactions_queries_and_integrity() {
    need("python3", "python3");
    need("sqlite3", "sqlite3");
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let dir = m.join("db");
    std::fs::create_dir(&dir).unwrap();
    // python3's sqlite3 module, with the rollback journal and with WAL
    // (which maps its -shm file shared).
    for mode in ["journal", "wal"] {
        let db = dir.join(format!("{mode}.sqlite"));
        let out = run(Command::new("python3")
            .arg("-c")
            .arg(SQLITE_PY)
            .arg(&db)
            .arg(mode));
        assert_eq!(out.trim(), "ok", "{mode}");
        // The sqlite3 shell reads what python wrote.
        let out = run(Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT count(*), sum(val < 0) FROM t; PRAGMA integrity_check;"));
        assert_eq!(out.trim(), "1000|500\nok", "{mode}");
    }
    // The shell writes a database of its own in one transaction.
    let db = dir.join("shell.sqlite");
    let script = "BEGIN; CREATE TABLE k (a INTEGER, b TEXT); \
        WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000) \
        INSERT INTO k SELECT x, printf('v%04d', x) FROM n; COMMIT; \
        SELECT count(*), max(b) FROM k;";
    let out = run(Command::new("sqlite3").arg(&db).arg(script));
    assert_eq!(out.trim(), "1000|v1000");
    // A second mount sees the committed database.
    let m2 = Mount::new(&tc);
    let out = run(Command::new("sqlite3")
        .arg(m2.join("db/shell.sqlite"))
        .arg("SELECT sum(a) FROM k; PRAGMA integrity_check;"));
    assert_eq!(out.trim(), "500500\nok");
}

// ---- large dd and checksums ----------------------------------------------

#[test]
fn dd_large_file_checksums_agree_everywhere() {
    need("dd", "coreutils");
    need("sha256sum", "coreutils");
    let local = scratch("madfs-tools-");
    let src = local.path().join("x");
    run(Command::new("dd")
        .arg("if=/dev/urandom")
        .arg(format!("of={}", src.display()))
        .arg("bs=1M")
        .arg(format!("count={DD_MIB}"))
        .arg("status=none"));
    let want = sha256(&src);
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let t = Instant::now();
    run(Command::new("dd")
        .arg(format!("if={}", src.display()))
        .arg(format!("of={}", m.join("x").display()))
        .arg("bs=1M")
        .arg("conv=fsync")
        .arg("status=none"));
    let write_time = t.elapsed();
    let size = (DD_MIB as u64) << 20;
    assert_eq!(std::fs::metadata(m.join("x")).unwrap().len(), size);
    let t = Instant::now();
    assert_eq!(sha256(&m.join("x")), want, "read back through the mount");
    let read_time = t.elapsed();
    eprintln!(
        "dd {DD_MIB} MiB into the mount: {write_time:?} ({:.0} MiB/s); sha256 through it: {read_time:?}",
        DD_MIB as f64 / write_time.as_secs_f64()
    );
    // Through the client library, bypassing the mount and its caches.
    let got = local.path().join("got");
    tc.madfs_ok(["get".as_ref(), "/x".as_ref(), got.as_os_str()]);
    assert_eq!(sha256(&got), want, "madfs get of what dd wrote");
    // Through a fresh mount (nothing cached).
    let m2 = Mount::new(&tc);
    assert_eq!(sha256(&m2.join("x")), want, "read through a second mount");
    assert!(
        tc.madfs_ok(["stat", "/x"]).contains(&size.to_string()),
        "madfs stat shows the size"
    );
}

// ---- between the mount and the madfs command --------------------------------

#[test]
fn files_cross_between_mount_and_madfs_commands() {
    let local = scratch("madfs-tools-");
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    // Written through the mount, read by `madfs cat`: small (inline) and
    // large (chunks on every server).
    let small = b"hello from the mount\n".to_vec();
    let large = pattern(11, 5 * 1024 * 1024 + 333);
    std::fs::create_dir(m.join("dir")).unwrap();
    std::fs::write(m.join("dir/small"), &small).unwrap();
    std::fs::write(m.join("dir/large"), &large).unwrap();
    let out = tc.madfs(["cat", "/dir/small"]);
    assert!(out.status.success());
    assert_eq!(out.stdout, small);
    let out = tc.madfs(["cat", "/dir/large"]);
    assert!(out.status.success());
    assert_eq!(sha256_bytes(&out.stdout), sha256_bytes(&large));
    let ls = tc.madfs_ok(["ls", "/dir"]);
    assert!(
        ls.contains("small") && ls.contains("large"),
        "madfs ls: {ls}"
    );

    // Written by `madfs put`, read through the mount.
    let data = pattern(12, 3 * 1024 * 1024 + 5);
    let f = local.path().join("put");
    std::fs::write(&f, &data).unwrap();
    tc.madfs_ok(["put".as_ref(), f.as_os_str(), "/dir/put".as_ref()]);
    assert_sees(
        &m.join("dir/put"),
        &data,
        "madfs put, read through the mount",
    );
    // Replaced by `madfs put` right after the mount read it, with shorter
    // and then with longer content: a new open sees the new content whole
    // (close-to-open), whatever the mount had cached.
    for (seed, len) in [
        (13, 1024 * 1024 + 17),
        (14, 4 * 1024 * 1024 + 3),
        (15, 100),
        (16, 70_000),
    ] {
        let _ = open_and_read(&m.join("dir/put"));
        let data = pattern(seed, len);
        std::fs::write(&f, &data).unwrap();
        tc.madfs_ok(["put".as_ref(), f.as_os_str(), "/dir/put".as_ref()]);
        assert_sees(
            &m.join("dir/put"),
            &data,
            &format!("replaced by madfs put with {len} bytes"),
        );
    }
    // Names made by the command show in the mount, and the reverse.
    tc.madfs_ok(["mkdir", "-p", "/made/by/cli"]);
    tc.madfs_ok(["ln", "-s", "../dir/small", "/made/link"]);
    assert_eq!(std::fs::read(m.join("made/link")).unwrap(), small);
    assert!(std::fs::metadata(m.join("made/by/cli")).unwrap().is_dir());
    std::fs::rename(m.join("dir/small"), m.join("made/small")).unwrap();
    assert_eq!(tc.madfs_ok(["cat", "/made/small"]).as_bytes(), small);
    let out = tc.madfs(["stat", "/dir/small"]);
    assert!(
        !out.status.success(),
        "the old name is gone for the command too"
    );
}

// ---- two mounts -------------------------------------------------------------

#[test]
fn two_mounts_see_each_others_closed_files() {
    let tc = TestCluster::start(SERVERS);
    let a = Mount::new(&tc);
    let b = Mount::new(&tc);
    // Written and closed on A: whole on B.
    let data = pattern(21, 6 * 1024 * 1024 + 99);
    std::fs::write(a.join("shared"), &data).unwrap();
    assert_eq!(
        sha256(&b.join("shared")),
        sha256_bytes(&data),
        "sha256sum on B"
    );
    assert_sees(&b.join("shared"), &data, "written on A, read on B");
    // Replaced on one right after the other read it, shorter and longer,
    // both ways: the reader's next open sees the new content whole.
    let mut last = data;
    for (i, len) in [2 * 1024 * 1024 + 1, 5 * 1024 * 1024 + 7, 10, 200_000]
        .into_iter()
        .enumerate()
    {
        let (writer, reader, name) = if i % 2 == 0 {
            (&b, &a, "B->A")
        } else {
            (&a, &b, "A->B")
        };
        let (seen, _) = open_and_read(&reader.join("shared"));
        assert_eq!(seen.len(), last.len());
        let data = pattern(30 + i as u64, len);
        std::fs::write(writer.join("shared"), &data).unwrap();
        assert_sees(
            &reader.join("shared"),
            &data,
            &format!("{name}: replaced with {len} bytes"),
        );
        last = data;
    }
    let data2 = last;
    // B appends; A sees the longer file.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(b.join("shared"))
            .unwrap();
        f.write_all(b"tail").unwrap();
    }
    let mut want = data2.clone();
    want.extend_from_slice(b"tail");
    assert_eq!(
        std::fs::read(a.join("shared")).unwrap(),
        want,
        "append seen on A"
    );
    // Many small files created on A are all listed and readable on B.
    std::fs::create_dir(a.join("many")).unwrap();
    for i in 0..200 {
        std::fs::write(a.join(format!("many/f{i}")), format!("{i}")).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(b.join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 200);
    for i in [0, 57, 199] {
        assert_eq!(
            std::fs::read_to_string(b.join(format!("many/f{i}"))).unwrap(),
            format!("{i}")
        );
    }
    // Deleted on A: gone on B.
    std::fs::remove_file(a.join("many/f57")).unwrap();
    let r = std::fs::File::open(b.join("many/f57"));
    assert_eq!(
        r.map(|_| ()).map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOENT)),
        "a file unlinked on A opened on B"
    );
}
