//! Many writers at once through the interception library: threads sharing
//! descriptors, and processes forked with descriptors open (each child
//! connects again; the offset of a shared descriptor stays shared).

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::TestCluster;
use helpers::{cli_cat, compile, run_ok};

const PIECE: usize = 65536;
const PIECES: usize = 24;

/// What writers.c writes for writer `who` (its own file, and its slice of
/// the shared file).
fn expected(who: usize) -> Vec<u8> {
    (0..PIECE * PIECES)
        .map(|j| ((who * 31 + j) % 251) as u8)
        .collect()
}

fn check_files(tc: &TestCluster, dir: &str, n: usize) {
    let shared = cli_cat(tc, &format!("{dir}/shared"));
    assert_eq!(shared.len(), n * PIECE * PIECES);
    for who in 0..n {
        let want = expected(who);
        assert_eq!(cli_cat(tc, &format!("{dir}/t{who}")), want, "t{who}");
        let slice = &shared[who * PIECE * PIECES..(who + 1) * PIECE * PIECES];
        assert!(slice == want.as_slice(), "slice {who} of the shared file");
    }
}

#[test]
fn threads_share_descriptors() {
    common::need("cc", "gcc");
    let tc = TestCluster::start(4);
    let work = tempfile::tempdir().unwrap();
    let exe = compile("writers.c", work.path());
    tc.madfs_ok(["mkdir", "/t"]);
    let out = run_ok(&tc, &[exe.to_str().unwrap(), "threads", "8", "/madfs/t"]);
    assert_eq!(out, "done\n");
    check_files(&tc, "/t", 8);
    // Appends through one O_APPEND descriptor from 8 threads: every line
    // present, none torn.
    let log = String::from_utf8(cli_cat(&tc, "/t/log")).unwrap();
    let mut lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 8 * PIECES, "{log}");
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 8 * PIECES);
    assert!(lines.iter().all(|l| l.starts_with("writer ")));
}

#[test]
fn forked_children_write() {
    common::need("cc", "gcc");
    let tc = TestCluster::start(4);
    let work = tempfile::tempdir().unwrap();
    let exe = compile("writers.c", work.path());
    tc.madfs_ok(["mkdir", "/f"]);
    let out = run_ok(&tc, &[exe.to_str().unwrap(), "fork", "6", "/madfs/f"]);
    assert_eq!(out, "done\n");
    check_files(&tc, "/f", 6);
    // (Concurrent appends from several processes are not atomic in MadFS:
    // the log is not checked line by line here; see the crate docs.)
}

#[test]
fn python_threads_and_processes() {
    common::need("python3", "python3");
    let tc = TestCluster::start(2);
    let script = r#"
import os, threading, multiprocessing
os.mkdir("/madfs/p")
def writer(i):
    with open(f"/madfs/p/thread{i}", "wb") as f:
        for k in range(50):
            f.write(bytes([i]) * 10000)
ts = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
[t.start() for t in ts]; [t.join() for t in ts]
def child(i):
    with open(f"/madfs/p/proc{i}", "w") as f:
        f.write(f"child {i}\n" * 1000)
ctx = multiprocessing.get_context("fork")
ps = [ctx.Process(target=child, args=(i,)) for i in range(4)]
[p.start() for p in ps]; [p.join() for p in ps]
print(sorted(os.listdir("/madfs/p")), [p.exitcode for p in ps])
"#;
    let out = run_ok(&tc, &["python3", "-c", script]);
    assert_eq!(
        out,
        "['proc0', 'proc1', 'proc2', 'proc3', 'thread0', 'thread1', 'thread2', 'thread3', \
         'thread4', 'thread5'] [0, 0, 0, 0]\n"
    );
    for i in 0..6u8 {
        assert_eq!(cli_cat(&tc, &format!("/p/thread{i}")), vec![i; 500_000]);
    }
    for i in 0..4 {
        assert_eq!(
            cli_cat(&tc, &format!("/p/proc{i}")),
            format!("child {i}\n").repeat(1000).into_bytes()
        );
    }
}
