//! Guards what a full disk does: the write that finds no space fails with
//! ENOSPC (ErrorCode::NoSpace), the server stays up, everything acknowledged
//! before is intact, space freed by a remove is usable again, and `madfs put`
//! says "no space left on device". Both stores are run out of space: the
//! chunk files (bulk data) and the RocksDB log (metadata, inline data).
//!
//! The one server of each cluster has its data directory on a private tmpfs
//! (`Options::tmpfs_bytes`), which dies with it: these tests never restart it.

mod common;

use common::{assert_err, key_of, pattern, tail, write_synced, Options, TestCluster, CHUNK};
use madfs_client::{Client, ClientError, ErrorCode, FileKind, OpenOptions, Timeouts};
use std::future::Future;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Each server's disk. At start-up RocksDB preallocates its log (1.1 x the
/// 16 MiB write buffer) and its MANIFEST (4 MiB) on it, leaving ~10 MiB.
const DISK: u64 = 32 << 20;
/// The unit of the fill loops (one chunk).
const PIECE: usize = CHUNK as usize;
/// Inline files (kept in RocksDB, at most 64 KiB) used to fill the log.
const INLINE: usize = 60_000;
/// Each test as a whole (it takes well under a second), and each CLI run.
const TEST_DEADLINE: Duration = Duration::from_secs(30);
const CLI_DEADLINE: Duration = Duration::from_secs(30);
/// Waiting for a remove's chunks to be purged (done in the background).
const PURGE_DEADLINE: Duration = Duration::from_secs(10);

const A_LEN: usize = PIECE;
const S_LEN: usize = 3_901;

fn start() -> TestCluster {
    TestCluster::start_with(
        1,
        Options {
            tmpfs_bytes: Some(DISK),
            ..Options::default()
        },
    )
}

/// A client that gives up quickly: a hung server fails the test, not CI.
fn client(tc: &TestCluster) -> Client {
    Client::from_config_with_timeouts(
        tc.config(),
        key_of(tc),
        Timeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(10),
        },
    )
    .expect("client")
}

async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(TEST_DEADLINE, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {TEST_DEADLINE:?}"))
}

fn a_data() -> Vec<u8> {
    pattern(1, A_LEN)
}

fn s_data() -> Vec<u8> {
    pattern(2, S_LEN)
}

fn b_piece(i: usize) -> Vec<u8> {
    pattern(1000 + i as u64, PIECE)
}

/// Step 1: file A (one chunk, fsynced), small inline file S, directory D.
async fn populate(c: &Client) {
    write_synced(c, "/a", &a_data()).await;
    write_synced(c, "/s", &s_data()).await;
    c.mkdir("/d", 0o755).await.expect("mkdir /d");
    check_intact(c, "after populating").await;
}

/// A, S and D as `populate` made them.
async fn check_intact(c: &Client, when: &str) {
    let a = c
        .read_file("/a")
        .await
        .unwrap_or_else(|e| panic!("{when}: read /a: {e}"));
    assert_eq!(a.len(), A_LEN, "{when}: size of /a");
    assert!(a == a_data(), "{when}: the content of /a changed");
    let s = c
        .read_file("/s")
        .await
        .unwrap_or_else(|e| panic!("{when}: read /s: {e}"));
    assert!(s == s_data(), "{when}: the content of /s changed");
    let d = c
        .stat("/d")
        .await
        .unwrap_or_else(|e| panic!("{when}: stat /d: {e}"));
    assert_eq!(d.kind, FileKind::Dir, "{when}: /d");
}

/// The server process runs and answers.
async fn assert_alive(tc: &mut TestCluster, c: &Client, when: &str) {
    let answer = c.statfs().await;
    if answer.is_ok() && tc.is_running(0) {
        return;
    }
    // It does not answer: give a dying process a moment to be seen dead.
    let deadline = Instant::now() + Duration::from_secs(2);
    while tc.is_running(0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{when}: the server {} ({answer:?}); its log:\n{}",
        if tc.is_running(0) {
            "runs but does not answer"
        } else {
            "died"
        },
        tail(&tc.log_path(0), 20)
    );
}

/// The server's own statistics: its disk as it is, reserve included
/// (statfs says what writes can use: that, less the reserve).
async fn stats(c: &Client) -> madfs_client::FsStats {
    let (_, one) = c
        .server_stats()
        .await
        .into_iter()
        .next()
        .expect("one server");
    one.expect("server statistics")
}

/// Step 2: write /b in whole chunks until a write fails. Returns the
/// number of pieces acknowledged and the failure. The handle is fsynced
/// (which must work: it only covers acknowledged writes) and closed.
async fn fill_with_chunks(c: &Client) -> (usize, ClientError) {
    let avail = stats(c).await.bytes_avail;
    assert!(
        avail >= 2 * PIECE as u64,
        "only {avail} bytes free on the fresh {DISK}-byte disk: make DISK larger"
    );
    let max = (DISK as usize / PIECE) * 2;
    let f = c
        .open("/b", OpenOptions::new().write(true).create(true))
        .await
        .expect("create /b");
    let mut failure = None;
    let mut acked = 0;
    for i in 0..max {
        match f.write_at((i * PIECE) as u64, &b_piece(i)).await {
            Ok(n) => {
                assert_eq!(n, PIECE);
                acked += 1;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.unwrap_or_else(|| {
        panic!("{max} MiB written to a {DISK}-byte disk without an error: is it a tmpfs?")
    });
    assert!(acked >= 1, "not one piece of /b fitted: {failure}");
    f.fsync()
        .await
        .expect("fsync of the acknowledged part of /b on a full disk");
    f.close().await.expect("close /b on a full disk");
    (acked, failure)
}

/// /b holds exactly its `acked` acknowledged pieces.
async fn check_b(c: &Client, acked: usize) {
    let b = c.read_file("/b").await.expect("read /b");
    assert_eq!(
        b.len(),
        acked * PIECE,
        "size of /b: its acknowledged pieces"
    );
    for (i, got) in b.chunks(PIECE).enumerate() {
        assert!(got == b_piece(i), "piece {i} of /b changed");
    }
}

/// Remove /b and wait until its chunks are purged (in the background) and
/// the space shows as free again.
async fn remove_b(c: &Client, acked: usize) {
    let data_before = stats(c).await.data_bytes;
    c.remove_file("/b").await.expect("remove /b on a full disk");
    assert_err(c.stat("/b").await, ErrorCode::NotFound, libc::ENOENT);
    let deadline = Instant::now() + PURGE_DEADLINE;
    loop {
        let s = stats(c).await;
        if s.data_bytes < data_before && s.bytes_avail >= (acked * PIECE) as u64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the space of /b ({acked} MiB) was not freed within {PURGE_DEADLINE:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `madfs` with a deadline (killed after it).
fn run_cli(tc: &TestCluster, args: &[&std::ffi::OsStr]) -> Output {
    let mut child = Command::new(common::MADFS)
        .args(args)
        .env("MADFS_CLUSTER", tc.cluster_file())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run madfs");
    let deadline = Instant::now() + CLI_DEADLINE;
    while child.try_wait().expect("wait for madfs").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("madfs {args:?} did not finish within {CLI_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // It has exited: the pipes hold all its (short) output.
    child.wait_with_output().expect("madfs output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_gives_enospc_and_loses_nothing_acknowledged() {
    let mut tc = start();
    let c = client(&tc);
    bounded("full disk", async {
        // 1. A (fsynced), S (inline), D.
        populate(&c).await;

        // 2. Fill the disk with /b: the failing write says ENOSPC.
        let (acked, failure) = fill_with_chunks(&c).await;
        assert_err(Err::<(), _>(failure), ErrorCode::NoSpace, libc::ENOSPC);
        // The server refuses growth while it still keeps a reserve back
        // (the smaller of 64 MiB and an eighth of its disk) for RocksDB and
        // for removals: the disk is full up to that reserve.
        let st = stats(&c).await;
        let reserve = (64u64 << 20).min(st.bytes_total / 8);
        assert!(
            st.bytes_avail < reserve + PIECE as u64,
            "{} bytes free after ENOSPC, reserve {reserve}",
            st.bytes_avail
        );
        // statfs (what `df` shows) says the file system is full.
        let usable = c.statfs().await.expect("statfs").bytes_avail;
        assert!(
            usable < PIECE as u64,
            "statfs says {usable} bytes available after ENOSPC"
        );

        // 3. The server is alive and answers; nothing acknowledged is lost.
        assert_alive(&mut tc, &c, "with a full disk").await;
        check_intact(&c, "with a full disk").await;
        check_b(&c, acked).await;
        let fresh = client(&tc);
        check_intact(&fresh, "with a full disk, a new client").await;

        // 4. Removing /b frees its space for a new file.
        remove_b(&c, acked).await;
        let c_data = pattern(3, PIECE);
        write_synced(&c, "/c", &c_data).await;
        assert!(c.read_file("/c").await.unwrap() == c_data, "content of /c");
        check_intact(&c, "after removing /b and writing /c").await;
        assert_alive(&mut tc, &c, "after removing /b and writing /c").await;

        // 5. `madfs put` of a local file larger than the free space.
        let avail = stats(&c).await.bytes_avail;
        let local = tc.root().join("too-big");
        std::fs::write(&local, pattern(4, avail as usize + 2 * PIECE)).unwrap();
        let out = run_cli(&tc, &["put".as_ref(), local.as_os_str(), "/big".as_ref()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "put of {} bytes onto {avail} free succeeded: stdout {:?}, stderr {stderr:?}",
            avail as usize + 2 * PIECE,
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains("no space left on device") && stderr.contains("/big"),
            "put onto a full disk should say 'no space left on device' for /big; \
             stderr: {stderr:?}"
        );
        eprintln!(
            "madfs put onto a full disk: {}; stderr: {stderr:?}",
            out.status
        );
        std::fs::remove_file(&local).unwrap();
        assert_alive(&mut tc, &c, "after the failed put").await;
        check_intact(&c, "after the failed put").await;
        assert!(
            c.read_file("/c").await.unwrap() == c_data,
            "/c after the failed put"
        );
    })
    .await;
}

/// Metadata needs disk space too: when the RocksDB log can grow no more, a
/// metadata write must fail with ENOSPC like a data write, and the server
/// must stay up and recover once space is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_metadata_log_gives_enospc_and_server_stays_up() {
    let mut tc = start();
    let c = client(&tc);
    bounded("full metadata log", async {
        populate(&c).await;
        let (acked, failure) = fill_with_chunks(&c).await;
        assert_err(Err::<(), _>(failure), ErrorCode::NoSpace, libc::ENOSPC);

        // The data disk is full; RocksDB's log still has preallocated room.
        // Inline files go to that log alone: write them until it is full.
        let max = 2 * DISK as usize / INLINE;
        let mut written = 0;
        let mut failure = None;
        for i in 0..max {
            match c
                .write_file(format!("/m{i}"), &pattern(5000 + i as u64, INLINE))
                .await
            {
                Ok(()) => written += 1,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let failure = failure.unwrap_or_else(|| {
            panic!("{max} inline files of {INLINE} bytes written to a full disk without an error")
        });
        // Whatever failed (the create or the write), the server must still run.
        assert_alive(
            &mut tc,
            &c,
            &format!("after the metadata write that failed with {failure:?}"),
        )
        .await;
        assert_err(Err::<(), _>(failure), ErrorCode::NoSpace, libc::ENOSPC);

        check_intact(&c, "with a full metadata log").await;
        check_b(&c, acked).await;
        for i in 0..written {
            let got = c.read_file(format!("/m{i}")).await.expect("read /m<i>");
            assert!(
                got == pattern(5000 + i as u64, INLINE),
                "acknowledged inline file /m{i} changed"
            );
        }

        // Freeing space makes metadata writes work again.
        remove_b(&c, acked).await;
        c.mkdir("/after", 0o755)
            .await
            .expect("mkdir once space was freed");
        write_synced(&c, "/after/s", &s_data()).await;
        check_intact(&c, "after freeing space").await;
        assert_alive(&mut tc, &c, "after freeing space").await;
    })
    .await;
}

/// The bytes a server reports storing (`madfs status`, statfs) stay exact
/// through a write that failed half-way for want of space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_bytes_stay_exact_after_a_failed_write() {
    let tc = start();
    let c = client(&tc);
    bounded("data bytes", async {
        populate(&c).await;
        let before = stats(&c).await.data_bytes;
        let (acked, _) = fill_with_chunks(&c).await;
        remove_b(&c, acked).await;
        let after = stats(&c).await.data_bytes;
        assert_eq!(
            after, before,
            "data bytes before /b was written ({before}) and after it was removed ({after})"
        );
    })
    .await;
}

/// With write-behind a write returns before its server answers, so the
/// ENOSPC of a write comes back from a later write, fsync or close of the
/// handle; nothing else is lost and the server stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_behind_reports_a_full_disk_at_a_later_call() {
    let mut tc = start();
    let c = client(&tc);
    bounded("write-behind on a full disk", async {
        populate(&c).await;
        let opts = OpenOptions::new()
            .write(true)
            .create(true)
            .write_behind(true);
        let f = c.open("/wb", opts).await.expect("create /wb");
        let max = (DISK as usize / PIECE) * 2;
        let mut failure = None;
        for i in 0..max {
            if let Err(e) = f.write_at((i * PIECE) as u64, &b_piece(i)).await {
                failure = Some(e);
                break;
            }
        }
        let failure = match failure {
            Some(e) => e,
            None => f
                .fsync()
                .await
                .expect_err("fsync after writing twice the disk's size"),
        };
        assert_err(Err::<(), _>(failure), ErrorCode::NoSpace, libc::ENOSPC);
        // Later failures of writes still in flight may be reported by close.
        let _ = f.close().await;
        assert_alive(&mut tc, &c, "after write-behind filled the disk").await;
        check_intact(&c, "after write-behind filled the disk").await;
        // The published size ends where a write that landed ends: the last
        // piece inside it holds what was written there. (A size raised by
        // a write that failed would end in zeros. Pieces below may be
        // holes: writes in flight land in any order, so an earlier one can
        // fail after a later one got the last space.)
        let wb = c.read_file("/wb").await.expect("read /wb");
        assert_eq!(wb.len() % PIECE, 0, "size of /wb: whole pieces");
        if let Some(last) = (wb.len() / PIECE).checked_sub(1) {
            assert!(
                wb[last * PIECE..] == b_piece(last)[..],
                "the last piece of /wb ({last}) is not what was written"
            );
        }
        c.remove_file("/wb")
            .await
            .expect("remove /wb on a full disk");
    })
    .await;
}
