//! `madfs run` itself: the prefix, its errors, staying quiet, and output
//! that C programs write through stdio onto redirected standard streams
//! (which the C library writes without going through interposable calls).

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::{TestCluster, MADFS};
use helpers::{cli_cat, cli_ls, preload_lib, run, sh};
use std::process::{Command, Stdio};

#[test]
fn custom_prefix_and_quiet_start() {
    let tc = TestCluster::start(2);
    preload_lib();
    let out = Command::new(MADFS)
        .args(["--cluster"])
        .arg(tc.cluster_file())
        .args(["run", "--prefix", "/scratch//fast/", "--", "bash", "-c"])
        .arg(
            "mkdir /scratch/fast/d && echo hi > /scratch/fast/d/x && ls /scratch/fast/d && \
              ls /madfs 2>/dev/null; echo $MADFS_PREFIX",
        )
        .env_remove("MADFS_CLUSTER")
        .env_remove("MADFS_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n/scratch/fast\n");
    assert_eq!(cli_cat(&tc, "/d/x"), b"hi\n");
    // Nothing on stderr when all is well.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let out = run(&tc, &["ls", "/madfs/d"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    // A program that never touches MadFS makes no connection (and says nothing).
    let out = run(&tc, &["true"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}

#[test]
fn run_reports_its_errors() {
    let tc = TestCluster::start(1);
    preload_lib();
    let out = tc.madfs(["run", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot execute '/no/such/program'"));
    let out = tc.madfs(["run", "--prefix", "/", "--", "true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prefix cannot be '/'"));
    let out = tc.madfs(["run", "--prefix", "rel", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"));
    let out = Command::new(MADFS)
        .args(["run", "--", "true"])
        .env("MADFS_CLUSTER", "/no/such/cluster.toml")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cluster.toml"),
        "{out:?}"
    );
    let out = Command::new(MADFS)
        .args(["run", "--", "true"])
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env("MADFS_PRELOAD_LIB", "/no/such/lib.so")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("MADFS_PRELOAD_LIB"),
        "{out:?}"
    );
    // The program's exit status comes back.
    let out = tc.madfs(["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

#[test]
fn stdio_output_on_redirected_streams() {
    let tc = TestCluster::start(3);
    // Several MiB written by seq through stdio onto a redirected stdout.
    sh(
        &tc,
        "seq 1 1000000 > /madfs/seq; yes abcdefgh | head -c 3000000 > /madfs/yes; \
             seq 1 10 >> /madfs/seq; (echo sub; seq 3) > /madfs/subshell 2>&1",
    );
    let mut want = String::new();
    for i in 1..=1_000_000 {
        want.push_str(&format!("{i}\n"));
    }
    for i in 1..=10 {
        want.push_str(&format!("{i}\n"));
    }
    assert!(
        cli_cat(&tc, "/seq") == want.as_bytes(),
        "seq output differs"
    );
    let yes = cli_cat(&tc, "/yes");
    assert_eq!(yes.len(), 3_000_000);
    assert!(yes == "abcdefgh\n".repeat(333_334).as_bytes()[..3_000_000]);
    assert_eq!(cli_cat(&tc, "/subshell"), b"sub\n1\n2\n3\n");
    // Reading them back through stdin (stdio readers of a redirected stdin).
    let got = sh(
        &tc,
        "tail -n 2 < /madfs/seq; sort -n < /madfs/subshell | tail -1; wc -c < /madfs/yes",
    );
    assert_eq!(got, "9\n10\n3\n3000000\n");
    // stderr too.
    sh(&tc, "ls /madfs/nope 2> /madfs/err || true");
    assert!(String::from_utf8_lossy(&cli_cat(&tc, "/err")).contains("No such file"));

    common::need("cc", "gcc");
    // A C program: buffered stdout, then fork + _exit in the child: the
    // buffered bytes are written once (by the parent), as without MadFS.
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("dup.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
int main(void) {
    printf("before fork ");
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, 0, 0);
    printf("after\n");
    for (int i = 0; i < 100000; i++) printf("%d\n", i);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = work.path().join("dup");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    sh(&tc, &format!("{} > /madfs/dup", exe.display()));
    let mut want = String::from("before fork after\n");
    for i in 0..100_000 {
        want.push_str(&format!("{i}\n"));
    }
    assert!(cli_cat(&tc, "/dup") == want.as_bytes());
    assert_eq!(cli_ls(&tc, "/"), ["dup", "err", "seq", "subshell", "yes"]);
}

#[test]
fn library_descriptors_survive_the_program() {
    let tc = TestCluster::start(2);
    // Shells dup2 onto small numbers: after the first MadFS call has made
    // the connection (epoll, sockets), `exec 3>` ... `exec 9>` must not
    // clobber it.
    let got = sh(
        &tc,
        "ls /madfs >/dev/null; for n in 3 4 5 6 7 8 9; do eval \"exec $n>/madfs/fd$n\"; done; \
         for n in 3 4 5 6 7 8 9; do eval \"echo $n >&$n\"; done; \
         exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; cat /madfs/fd3 /madfs/fd9",
    );
    assert_eq!(got, "3\n9\n");
    common::need("python3", "python3");
    // A program closing every descriptor it does not know keeps working.
    let script = r#"
import os
open("/madfs/before", "w").write("b")
os.closerange(3, 65536)
open("/madfs/after", "w").write("a")
print(open("/madfs/before").read() + open("/madfs/after").read())
"#;
    let out = helpers::run_ok(&tc, &["python3", "-c", script]);
    assert_eq!(out, "ba\n");
    assert_eq!(cli_cat(&tc, "/after"), b"a");
}
