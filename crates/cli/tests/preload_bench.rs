//! Figures, not a check (ignored by default): the interception library
//! against the client library on a 4-server local cluster, alternating
//! rounds (best of each, so load from elsewhere affects both alike).
//!
//!     cargo test --release -p madfs-cli --test preload_bench -- --ignored --nocapture

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::TestCluster;
use helpers::{compile, run_ok};
use madfs_client::{BlockingClient, OpenOptions};
use std::time::Instant;

const FILES: usize = 2000;
const MIB: usize = 256;
const ROUNDS: usize = 3;

fn value(line: &str) -> f64 {
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// (creates/s, write MiB/s, read MiB/s) through `madfs run`.
fn through_preload(tc: &TestCluster, exe: &str, round: usize) -> (f64, f64, f64) {
    let dir = format!("/pre{round}");
    tc.madfs_ok(["mkdir", &dir]);
    let c = run_ok(
        tc,
        &[exe, "create", &FILES.to_string(), &format!("/madfs{dir}")],
    );
    let big = format!("/madfs{dir}-big");
    let w = run_ok(tc, &[exe, "write", &MIB.to_string(), &big]);
    let r = run_ok(tc, &[exe, "read", &big]);
    (value(&c), value(&w), value(&r))
}

/// The same with the client library directly (blocking facade, one thread).
fn through_library(c: &BlockingClient, round: usize) -> (f64, f64, f64) {
    let dir = format!("/lib{round}");
    c.mkdir(dir.as_str(), 0o755).unwrap();
    let t0 = Instant::now();
    for i in 0..FILES {
        let opts = OpenOptions::new().write(true).create_new(true);
        c.open(format!("{dir}/f{i}"), opts)
            .unwrap()
            .close()
            .unwrap();
    }
    let create = FILES as f64 / t0.elapsed().as_secs_f64();
    let buf = vec![b'w'; 1 << 20];
    let big = format!("{dir}-big");
    let t0 = Instant::now();
    let opts = OpenOptions::new().write(true).create(true).truncate(true);
    let f = c.open(big.as_str(), opts).unwrap();
    for i in 0..MIB {
        f.write_at((i << 20) as u64, &buf).unwrap();
    }
    f.fsync().unwrap();
    f.close().unwrap();
    let write = MIB as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let f = c.open(big.as_str(), OpenOptions::new().read(true)).unwrap();
    let mut off = 0u64;
    loop {
        let d = f.read_at(off, 1 << 20).unwrap();
        if d.is_empty() {
            break;
        }
        off += d.len() as u64;
    }
    let read = off as f64 / 1048576.0 / t0.elapsed().as_secs_f64();
    (create, write, read)
}

fn best(v: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    v.iter().fold((0.0, 0.0, 0.0), |a, b| {
        (a.0.max(b.0), a.1.max(b.1), a.2.max(b.2))
    })
}

#[test]
#[ignore]
fn preload_against_library() {
    let tc = TestCluster::start(4);
    let work = tempfile::tempdir().unwrap();
    let exe = compile("bench.c", work.path());
    let exe = exe.to_str().unwrap();
    let c = BlockingClient::connect(Some(tc.cluster_file())).unwrap();
    let (mut pre, mut lib) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        pre.push(through_preload(&tc, exe, round));
        lib.push(through_library(&c, round));
    }
    let show = |name: &str, all: &[(f64, f64, f64)]| {
        let b = best(all);
        println!(
            "{name:<11} create+close {:>7.0}/s   1 MiB writes (+fsync) {:>6.1} MiB/s   \
             1 MiB reads {:>6.1} MiB/s   rounds: {all:.0?}",
            b.0, b.1, b.2
        );
    };
    show("madfs run", &pre);
    show("library", &lib);

    // `madfs put` of a file in /dev/shm (a process per copy, 8 MiB requests).
    let shm = tempfile::Builder::new().tempfile_in("/dev/shm").unwrap();
    std::fs::write(shm.path(), vec![b'p'; MIB << 20]).unwrap();
    let mut put = 0f64;
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        tc.madfs_ok([
            std::ffi::OsStr::new("put"),
            shm.path().as_os_str(),
            format!("/put{round}").as_ref(),
        ]);
        put = put.max(MIB as f64 / t0.elapsed().as_secs_f64());
    }
    println!("madfs put   {put:.1} MiB/s (no fsync)");
}
