//! Benchmark, not a timed test (ignored by default): server-side `madfs find`
//! against GNU find walking the same directory through the FUSE mount.
//! Run: `cargo test --release -p madfs-cli --test find_bench -- --ignored
//! --nocapture` (MADFS_FIND_BENCH_FILES sets the file count, default 1M).

mod common;

use common::TestCluster;
use madfs_client::FileName;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVERS: usize = 4;
const IN_FLIGHT: usize = 64;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Run a command, count its stdout lines, time it.
fn timed_count(cmd: &mut Command) -> (Duration, usize) {
    let t = Instant::now();
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    let el = t.elapsed();
    assert!(out.status.success());
    (el, out.stdout.iter().filter(|&&b| b == b'\n').count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn million_files_find_vs_gnu_find_through_fuse() {
    let n: usize = std::env::var("MADFS_FIND_BENCH_FILES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let dir = c.mkdir("/dir", 0o755).await.unwrap().ino;
    let t = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (c, next) = (c.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let name = FileName::new(format!("f{i}").as_bytes()).unwrap();
                    c.create(dir, &name, 0o644, true).await.unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    eprintln!("created {n} files in {:?}", t.elapsed());
    let want = (0..n).filter(|i| format!("f{i}").contains("01")).count();

    let holder = tempfile::tempdir().unwrap();
    let mnt = holder.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = tc.madfs([Path::new("mount"), &mnt]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // For profiling by hand: keep the cluster up for this many seconds.
    if let Some(secs) = std::env::var("MADFS_FIND_BENCH_HOLD")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        eprintln!(
            "holding: MADFS_CLUSTER={} mount {}",
            tc.cluster_file().display(),
            mnt.display()
        );
        std::thread::sleep(Duration::from_secs(secs));
    }
    let mut mine = Vec::new();
    let mut gnu = Vec::new();
    for _ in 0..3 {
        let (d, count) = timed_count(
            Command::new(common::MADFS)
                .args(["find", "/dir", "-name", "*01*"])
                .env("MADFS_CLUSTER", tc.cluster_file()),
        );
        assert_eq!(count, want);
        mine.push(d);
        let (d, count) = timed_count(
            Command::new("find")
                .arg(mnt.join("dir"))
                .args(["-name", "*01*"]),
        );
        assert_eq!(count, want);
        gnu.push(d);
    }
    // Tests on attributes: the servers look every inode up; GNU find and du
    // stat every file through the mount. (The files are empty: nothing
    // matches `-size +0`, so printing costs nothing on either side.)
    let (mut du, mut size, mut gnu_du, mut gnu_size) = (vec![], vec![], vec![], vec![]);
    for _ in 0..3 {
        let t = Instant::now();
        tc.madfs_ok(["du", "/dir"]);
        du.push(t.elapsed());
        let (d, count) = timed_count(
            Command::new(common::MADFS)
                .args(["find", "/dir", "-size", "+0"])
                .env("MADFS_CLUSTER", tc.cluster_file()),
        );
        assert_eq!(count, 0);
        size.push(d);
        let (d, count) = timed_count(
            Command::new("find")
                .arg(mnt.join("dir"))
                .args(["-size", "+0"]),
        );
        assert_eq!(count, 0);
        gnu_size.push(d);
        let (d, _) = timed_count(Command::new("du").arg("-s").arg(mnt.join("dir")));
        gnu_du.push(d);
    }
    let _ = tc.madfs([Path::new("umount"), &mnt]);
    let (m, g) = (median(mine.clone()), median(gnu.clone()));
    eprintln!(
        "{n} files, {want} matches: madfs find median {m:?} (runs {mine:?}); \
         GNU find via FUSE median {g:?} (runs {gnu:?}); speedup {:.1}x; \
         madfs find -size +0 median {:?}, GNU find -size +0 via FUSE median {:?}; \
         madfs du median {:?}, GNU du -s via FUSE median {:?}",
        g.as_secs_f64() / m.as_secs_f64(),
        median(size),
        median(gnu_size),
        median(du),
        median(gnu_du),
    );
}
