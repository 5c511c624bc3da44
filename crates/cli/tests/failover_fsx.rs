//! The file exerciser (crates/fsx, checked against its in-memory model
//! after every operation) across failovers (issue 16): on 4 servers that
//! keep 2 copies of everything, servers are killed (kill -9) in the middle
//! of seeded runs, through the mount and through `madfs run`. The runs go
//! on after a pause and must agree with the model to the end: no write,
//! truncate or size that was acknowledged is lost or undone by the
//! failover, and no read returns bytes the model does not have.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;
#[path = "common/mount.rs"]
mod mount;

use common::{Options, TestCluster, CHUNK};
use madfs_fsx::{Config, Exerciser};
use mount::Mount;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn replicated_cluster() -> TestCluster {
    TestCluster::start_with(
        4,
        Options {
            replicas: 2,
            ..Options::default()
        },
    )
}

/// Run `n` more operations of `ex`; panic with its report on a mismatch.
fn steps(ex: &mut Exerciser, n: u64) {
    for _ in 0..n {
        if let Err(f) = ex.step() {
            panic!("{f}");
        }
    }
}

/// Through the mount, in this process: server 3 (not a voter) dies after
/// 400 operations, server 1 (a voter) after 800; both files are read back
/// whole against the model after each loss and at the end.
#[test]
fn the_exerciser_agrees_with_its_model_across_kills_through_the_mount() {
    let tc = replicated_cluster();
    let m = Mount::new(&tc);
    // The mount borrows the cluster: kill by pid (reaped when it drops).
    // SAFETY: server processes this test started.
    let kill9 = |i: usize| unsafe { libc::kill(tc.pid(i) as i32, libc::SIGKILL) };
    let dir = m.join("fsx");
    std::fs::create_dir(&dir).unwrap();
    let mut cfg = Config::new(&dir);
    cfg.seed = 16;
    cfg.ops = 1200;
    cfg.max_len = 3 * CHUNK;
    cfg.file_count = 2;
    let mut ex = Exerciser::new(cfg).unwrap_or_else(|f| panic!("{f}"));
    steps(&mut ex, 400);
    kill9(3);
    let t = Instant::now();
    ex.verify()
        .unwrap_or_else(|f| panic!("after server 3 died: {f}"));
    eprintln!("both files read back {:?} after server 3 died", t.elapsed());
    steps(&mut ex, 400);
    kill9(1);
    ex.verify()
        .unwrap_or_else(|f| panic!("after server 1 died: {f}"));
    steps(&mut ex, 400);
    let summary = ex.finish().unwrap_or_else(|f| panic!("{f}"));
    eprintln!("{summary}");
    m.unmount();
}

/// Through `madfs run` (LD_PRELOAD), as its own process: server 2 dies
/// once the run has logged some 300 operations; the run must still pass.
#[test]
fn the_exerciser_agrees_with_its_model_across_a_kill_through_madfs_run() {
    let mut tc = replicated_cluster();
    tc.madfs_ok(["mkdir", "/fsx"]);
    helpers::preload_lib();
    let log = tc.root().join("fsx.log");
    let (seed, ops) = (17, 1500);
    let mut run = Command::new(common::MADFS)
        .args(["run", "--", common::MADFS, "fsx", "/madfs/fsx"])
        .arg(format!("--seed={seed}"))
        .arg(format!("--ops={ops}"))
        .arg(format!("--max-len={}", 3 * CHUNK))
        .args(["--file-count=2", "--no-mmap-write"])
        .arg("--log")
        .arg(&log)
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env_remove("MADFS_LOG")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start madfs run");
    // The log is written in 8 KiB blocks of about 50 bytes an operation.
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::metadata(&log).map_or(0, |m| m.len()) < 16 * 1024 {
        if let Ok(Some(status)) = run.try_wait() {
            panic!("the run ended ({status}) before the kill");
        }
        assert!(Instant::now() < deadline, "the run made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    tc.kill9(2);
    let deadline = Instant::now() + Duration::from_secs(300);
    while run.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the run did not end within 300 s of the kill");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "madfs run -- madfs fsx (seed {seed}) failed across the kill ({}):\n{said}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("seed {seed}: {ops} ops on 2 file(s) passed")),
        "{said}"
    );
}
