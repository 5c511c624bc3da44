//! How many requests each of mdtest's per-file operations costs, through the
//! client library and through `madfs run` (the interception library), with
//! the directories already looked up: stat, open for reading and unlink one
//! each (the open of a small file brings its bytes, so reading it costs
//! nothing more); creating a file one; creating one with data two (the
//! create, then the data with its size). Counts, never timings: the library counts every
//! request it sends, and `madfs run --stats` prints them at exit.
//!
//! Guards against path walks from the root on every call (a 6-component
//! path cost 6 lookups per stat before the metadata cache) and against
//! extra requests creeping into open (a separate access check used to cost
//! a second one).

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::{TestCluster, MADFS};
use helpers::{compile, preload_lib};
use madfs_client::{BlockingClient, CacheConfig, Opcode, OpenOptions, RequestCounts};
use std::process::{Command, Stdio};
use std::time::Duration;

const DIR: &str = "/run/mdtest/tree.0/sub/leaf";
/// Directories in DIR.
const DEPTH: u64 = 5;
const FILES: usize = 40;
/// mdtest-hard's file size.
const HARD: usize = 3901;

/// A client whose cache outlives the test (the counts below must not
/// depend on how fast the machine runs).
fn client(tc: &TestCluster) -> BlockingClient {
    let c = tc
        .client()
        .with_cache(CacheConfig::with_ttl(Duration::from_secs(600)));
    BlockingClient::from_client(c).unwrap()
}

/// Look DIR up, twice: the first walk asks for each directory, the second
/// is answered from the cache, which needs the root's attributes once (for
/// its permission check): after this, the path costs nothing.
fn warm(c: &BlockingClient) {
    c.stat(DIR).unwrap();
    c.stat(DIR).unwrap();
}

fn path(i: usize) -> String {
    format!("{DIR}/f{i}")
}

/// Run `f` and return the requests it sent.
fn counted(c: &BlockingClient, f: impl FnOnce()) -> RequestCounts {
    let before = c.request_counts();
    f();
    c.request_counts().since(&before)
}

fn only(counts: &RequestCounts, expected: &[(Opcode, u64)]) {
    let total: u64 = expected.iter().map(|&(_, n)| n).sum();
    for &(op, n) in expected {
        assert_eq!(counts.get(op), n, "{op:?} in {counts}");
    }
    assert_eq!(counts.total(), total, "unexpected requests in {counts}");
}

#[test]
fn each_mdtest_operation_costs_one_request_through_the_library() {
    let tc = TestCluster::start(4);
    let writer = client(&tc);
    writer.mkdir_all(DIR, 0o755).unwrap();
    warm(&writer);
    let data = vec![7u8; HARD];
    let n = FILES as u64;

    // mdtest-easy create: open(O_CREAT) + close of an empty file.
    let c = counted(&writer, || {
        for i in 0..FILES {
            let f = writer
                .open(
                    format!("{DIR}/e{i}"),
                    OpenOptions::new().write(true).create(true),
                )
                .unwrap();
            f.close().unwrap();
        }
    });
    only(&c, &[(Opcode::Create, n)]);

    // mdtest-hard create: create, write 3,901 bytes, close.
    let c = counted(&writer, || {
        for i in 0..FILES {
            let f = writer
                .open(path(i), OpenOptions::new().write(true).create(true))
                .unwrap();
            f.write_at(0, &data).unwrap();
            f.close().unwrap();
        }
    });
    only(&c, &[(Opcode::Create, n), (Opcode::Write, n)]);

    // Another client (as mdtest's next rank), its directories warm.
    let reader = client(&tc);
    warm(&reader);
    let c = counted(&reader, || {
        for i in 0..FILES {
            assert_eq!(reader.stat(path(i)).unwrap().size, HARD as u64);
        }
    });
    only(&c, &[(Opcode::Lookup, n)]);

    // Open for reading (a fresh lookup of the name: close-to-open), which
    // brings a small file's bytes along: the reads (to the end, and past
    // it) cost nothing more.
    let c = counted(&reader, || {
        for i in 0..FILES {
            let f = reader.open(path(i), OpenOptions::new().read(true)).unwrap();
            assert_eq!(f.read_at(0, HARD + 1).unwrap(), data);
            assert!(f.read_at(HARD as u64, 100).unwrap().is_empty());
            f.close().unwrap();
        }
    });
    only(&c, &[(Opcode::Open, n)]);
    // A file larger than the inline limit: the open, then its reads.
    let big = vec![3u8; 200_000];
    writer.write_file(format!("{DIR}/big"), &big).unwrap();
    let c = counted(&reader, || {
        let f = reader
            .open(format!("{DIR}/big"), OpenOptions::new().read(true))
            .unwrap();
        assert_eq!(f.read_at(0, 300_000).unwrap(), big);
    });
    assert_eq!(c.get(Opcode::Open), 1, "{c}");
    assert_eq!(c.get(Opcode::Lookup) + c.get(Opcode::GetAttr), 0, "{c}");

    // On a cold path, the directories cost one walk (and the root's
    // attributes once), not one per file.
    let cold = client(&tc);
    let c = counted(&cold, || {
        for i in 0..FILES {
            cold.remove_file(path(i)).unwrap();
        }
    });
    only(
        &c,
        &[
            (Opcode::Lookup, DEPTH),
            (Opcode::GetAttr, 1),
            (Opcode::Remove, n),
        ],
    );
}

/// The requests reported by the last `stats:` line of `madfs run --stats`.
fn parse_stats(stderr: &str) -> Vec<(String, u64)> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("stats: "))
        .unwrap_or_else(|| panic!("no stats line in: {stderr}"));
    let list = line
        .split("requests: ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or_else(|| panic!("malformed stats line: {line}"));
    if list.trim() == "none" {
        return Vec::new();
    }
    list.split(", ")
        .map(|item| {
            let (op, n) = item
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("malformed item '{item}' in {line}"));
            (op.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// Run `program` under `madfs run --stats` with `opts`: the requests it
/// reported.
fn run_with_stats(
    tc: &TestCluster,
    opts: &[&str],
    program: &[&std::ffi::OsStr],
) -> Vec<(String, u64)> {
    let out = Command::new(MADFS)
        .args(["run", "--stats"])
        .args(opts)
        .arg("--")
        .args(program)
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env_remove("MADFS_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program:?}: {stderr}");
    parse_stats(&stderr)
}

fn count_of(stats: &[(String, u64)], op: &str) -> u64 {
    stats
        .iter()
        .find(|(o, _)| o == op)
        .map(|&(_, n)| n)
        .unwrap_or(0)
}

#[test]
fn each_mdtest_operation_costs_one_request_through_madfs_run() {
    let tc = TestCluster::start(4);
    preload_lib();
    let tmp = tempfile::tempdir().unwrap();
    let mdops = compile("mdops.c", tmp.path());
    client(&tc).mkdir_all(DIR, 0o755).unwrap();
    let dir = format!("/madfs{DIR}");
    let n = FILES as u64;
    let run = |args: &[&str]| -> Vec<(String, u64)> {
        let mut program = vec![mdops.as_os_str()];
        program.extend(args.iter().map(std::ffi::OsStr::new));
        run_with_stats(&tc, &["--cache-ttl", "600"], &program)
    };
    let files = FILES.to_string();
    let hard = HARD.to_string();
    // Each phase is a new process, its cache cold: the directory's walk
    // (DEPTH lookups, and the root's attributes once) comes on top.
    let walk = DEPTH + 1;
    let check = |phase: &str, stats: &[(String, u64)], per_file: &[(&str, u64)]| {
        let total: u64 = stats.iter().map(|(_, c)| c).sum();
        let expected: u64 = per_file.iter().map(|&(_, k)| k * n).sum();
        for &(op, k) in per_file {
            let got = count_of(stats, op);
            assert!(
                got >= k * n && got <= k * n + walk,
                "{phase}: {got} {op} for {n} files (want {k} each): {stats:?}"
            );
        }
        assert!(
            total <= expected + walk,
            "{phase}: {total} requests for {n} files (want at most {expected} + {walk}): {stats:?}"
        );
    };
    let s = run(&["create", &files, &dir]);
    check("create", &s, &[("Create", 1)]);
    let s = run(&["stat", &files, &dir]);
    check("stat", &s, &[("Lookup", 1)]);
    let s = run(&["unlink", &files, &dir]);
    check("unlink", &s, &[("Remove", 1)]);
    let s = run(&["write", &files, &dir, &hard]);
    check("create+write", &s, &[("Create", 1), ("Write", 1)]);
    let s = run(&["read", &files, &dir, &hard]);
    check("open+read", &s, &[("Open", 1)]);
}

#[test]
fn stats_report_nothing_for_a_program_that_never_used_madfs() {
    let tc = TestCluster::start(1);
    preload_lib();
    let out = Command::new(MADFS)
        .args(["run", "--stats", "--", "true"])
        .env("MADFS_CLUSTER", tc.cluster_file())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // And a malformed TTL is refused before the program runs.
    let out = Command::new(MADFS)
        .args(["run", "--cache-ttl", "soon", "--", "true"])
        .env("MADFS_CLUSTER", tc.cluster_file())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cache-ttl"));
}

/// Syncs through `madfs run` reach the servers they must: an fsync of a
/// directory, syncfs (`sync -f`) and sync(2) (`sync`) every server; `sync
/// FILE` (an fsync through a descriptor that wrote nothing, in a process
/// that did not write the file) the servers holding the file's chunks.
/// Before, each of them sent nothing, and a power loss could take what the
/// program had been told was durable.
#[test]
fn syncs_through_madfs_run_reach_the_servers() {
    common::need("python3", "python3");
    const SERVERS: usize = 4;
    let tc = TestCluster::start(SERVERS);
    preload_lib();
    let c = client(&tc);
    c.mkdir_all("/s", 0o755).unwrap();
    // Written by another client: four chunks, on the servers they hash to.
    let data = common::pattern(5, 4 * common::CHUNK as usize);
    c.write_file("/s/f", &data).unwrap();
    let ino = c.stat("/s/f").unwrap().ino;
    let holders: std::collections::BTreeSet<_> = (0..4)
        .map(|k| madfs_types::chunk_server(ino, madfs_client::ChunkIndex(k), SERVERS))
        .collect();
    let fsyncs = |args: &[&str]| -> u64 {
        let program: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        count_of(&run_with_stats(&tc, &[], &program), "Fsync")
    };
    // Python, not coreutils' sync: that one closes stderr at exit, before
    // the library reports its requests.
    let py = |code: &str| fsyncs(&["python3", "-c", code]);
    assert_eq!(py("import os; os.sync()"), SERVERS as u64, "sync(2)");
    let syncfs = "import ctypes, os; fd = os.open('/madfs/s', os.O_RDONLY); \
                  assert ctypes.CDLL(None).syncfs(fd) == 0";
    assert_eq!(py(syncfs), SERVERS as u64, "syncfs(2)");
    assert_eq!(
        py("import os; os.fsync(os.open('/madfs/s/f', os.O_RDONLY))"),
        holders.len() as u64,
        "fsync of a file another process wrote"
    );
    let dir_fsync = "import os; fd = os.open('/madfs/s', os.O_RDONLY); os.fsync(fd)";
    assert_eq!(py(dir_fsync), SERVERS as u64, "fsync of a directory");
}
