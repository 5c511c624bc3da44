//! A C program (tests/preload/posix.c) calling every function the
//! interception library serves, with their error cases, under `madfs run`;
//! then what it left behind, read through the CLI.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::TestCluster;
use helpers::{cli_cat, cli_ls, compile, run, run_ok};

#[test]
fn c_program_exercises_every_call() {
    common::need("cc", "gcc");
    let tc = TestCluster::start(3);
    // The "special" section forks a child that drops to nobody; it makes
    // its own connection and so reads the cluster file and key: give both
    // to nobody (root still reads them).
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        let dir = tc.cluster_file().parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::fs::chown(dir.join(&tc.config().key_file), Some(65534), Some(65534))
            .unwrap();
    }
    let work = tempfile::tempdir().unwrap();
    let exe = compile("posix.c", work.path());
    let local = work.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let out = run(
        &tc,
        &[exe.as_os_str(), "/madfs/c".as_ref(), local.as_os_str()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "posix failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for section in [
        "files",
        "large",
        "meta",
        "dirs",
        "cwd",
        "fds",
        "stdio",
        "processes",
        "special",
        "errors",
    ] {
        assert!(
            stdout.contains(&format!("ok {section}\n")),
            "{stdout}\n{stderr}"
        );
    }
    assert!(stdout.ends_with("failures 0\n"), "{stdout}\n{stderr}");
    // Each refused call said so once.
    for call in ["flock", "fcntl(F_*LK)", "setxattr", "mmap"] {
        assert_eq!(
            stderr.matches(&format!("{call} is not supported")).count(),
            1,
            "{call}: {stderr}"
        );
    }
    // What it left, as the client library sees it.
    let names = cli_ls(&tc, "/c");
    for n in [
        "f",
        "f-hard",
        "large",
        "copy2",
        "d",
        "ls",
        "stdio",
        "forked",
        "exec-out",
        "rel",
        "child-made",
        "freopened",
    ] {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
    }
    assert_eq!(cli_ls(&tc, "/c/ls").len(), 301);
    let n = 3 * 1024 * 1024 + 4097;
    let want: Vec<u8> = (0..n).map(|i| (i * 7 + (i >> 13)) as u8).collect();
    assert_eq!(cli_cat(&tc, "/c/large"), want);
    assert_eq!(cli_cat(&tc, "/c/copy2"), want);
    assert_eq!(std::fs::read(local.join("copy")).unwrap(), want);
    assert_eq!(cli_cat(&tc, "/c/forked"), b"parent1\nchild\nparent2\n");
    assert_eq!(cli_cat(&tc, "/c/exec-out"), b"from-exec\n");
    assert_eq!(cli_cat(&tc, "/c/freopened"), b"through stdout\n");
    let stat = tc.madfs_ok(["stat", "/c/f"]);
    assert!(stat.contains("(0600/"), "{stat}");
    assert!(stat.contains("Links: 3"), "{stat}");
    assert!(tc.madfs_ok(["ls", "-l", "/c"]).contains("sym -> f"));
}

/// Creating, removing or renaming an entry under `madfs run` moves the
/// parent directory's mtime and ctime on (both parents' for rename), as the
/// process sees them at once (its metadata cache held the directory's older
/// attributes) and as another client sees them; a directory's link count
/// is 2 plus its subdirectories.
#[test]
fn directory_times_and_link_counts() {
    common::need("python3", "python3");
    let tc = TestCluster::start(3);
    let script = r#"
import os, time
PAST = 1_000_000
def age(d):
    os.stat(d)                      # cached now
    os.utime(d, (PAST, PAST))
    st = os.stat(d)
    assert st.st_mtime == PAST, st
    while time.time_ns() <= st.st_ctime_ns:
        pass
    return st.st_ctime_ns
def check(what, d, ctime):
    st = os.stat(d)
    assert st.st_mtime > PAST, (what, d, st)
    assert st.st_ctime_ns > ctime, (what, d, st, ctime)
d, e = "/madfs/d", "/madfs/e"
os.mkdir(d); os.mkdir(e)
for i in range(6):
    t = age(d); open(f"{d}/f{i}", "w").close(); check("create", d, t)
    t = age(d); os.mkdir(f"{d}/s{i}"); check("mkdir", d, t)
    t = age(d); os.symlink("f0", f"{d}/l{i}"); check("symlink", d, t)
    t = age(d); os.link(f"{d}/f{i}", f"{d}/h{i}"); check("link", d, t)
    t = age(d); os.unlink(f"{d}/h{i}"); check("unlink", d, t)
    t = age(d); os.rename(f"{d}/f{i}", f"{d}/g{i}"); check("rename", d, t)
print(os.stat(d).st_nlink)
td, te = age(d), age(e)
os.rename(f"{d}/s0", f"{e}/s0")
check("rename dir: source", d, td); check("rename dir: destination", e, te)
print(os.stat(d).st_nlink, os.stat(e).st_nlink)
t = age(d); os.rmdir(f"{d}/s1"); check("rmdir", d, t)
print(os.stat(d).st_nlink)
"#;
    let out = run_ok(&tc, &["python3", "-c", script]);
    assert_eq!(out, "8\n7 3\n6\n");
    let other = tc.client().with_cache(madfs_client::CacheConfig::off());
    let a = common::block_on_thread(other.stat("/d")).unwrap();
    assert!(a.mtime.secs > 1_000_000 && a.nlink == 6, "{a:?}");
}
