//! A C program (tests/preload/posix.c) calling every function the
//! interception library serves, with their error cases, under `madfs run`;
//! then what it left behind, read through the CLI.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::TestCluster;
use helpers::{cli_cat, cli_ls, compile, run};

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
