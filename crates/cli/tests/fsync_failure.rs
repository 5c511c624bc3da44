//! Guards what a failed fsync does to a server (issue 14, "fsyncgate"):
//! Linux may drop the pages it could not write and clear the error, so the
//! server must never retry and report success. Driven by the test fault
//! `MADFS_FAULT_FSYNC_FAIL_AFTER` in a real `madfs server`: the fsync that
//! fails answers EIO, every later write and fsync fails with EIO and says
//! why, reads go on, `madfs status` shows the server `failed` with the
//! reason and exits non-zero, and a restart without the fault serves again.

mod common;

use common::{assert_err, pattern, tail, write_synced, TestCluster, CHUNK};
use madfs_client::{ErrorCode, OpenOptions};
use madfs_server::chunks::FSYNC_FAULT_ENV;

/// Two chunks: the data lands in chunk files, not inline in RocksDB.
const LEN: usize = 2 * CHUNK as usize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_fails_the_server_until_it_restarts() {
    // The first sync pass succeeds, the second fails.
    let mut tc = TestCluster::start_with(
        1,
        common::Options {
            server_env: vec![(FSYNC_FAULT_ENV.into(), "1".into())],
            ..common::Options::default()
        },
    );
    let c = tc.client();
    write_synced(&c, "/kept", &pattern(1, LEN)).await;
    tc.madfs_ok(["status"]);

    let f = c
        .open(
            "/lost",
            OpenOptions::new().write(true).create(true).truncate(true),
        )
        .await
        .expect("create /lost");
    f.write_at(0, &pattern(2, LEN)).await.expect("write /lost");
    let e = f.fsync().await.expect_err("the fsync the fault fails");
    assert_eq!((e.code, e.errno()), (ErrorCode::Io, libc::EIO), "{e}");
    for part in ["poisoned since", "fsync of", "failed", "restarted"] {
        assert!(
            e.to_string().contains(part),
            "fsync error lacks {part:?}: {e}"
        );
    }
    // No later fsync succeeds, and writes of data and metadata are refused.
    let e = f.fsync().await.expect_err("a second fsync");
    assert!(e.to_string().contains("poisoned since"), "{e}");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let r = f.write_at(0, b"more").await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.to_string().contains("poisoned since")),
        "a later write: {r:?}"
    );
    assert_err(r, ErrorCode::Io, libc::EIO);
    let r = c.mkdir("/d", 0o755).await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.to_string().contains("poisoned since")),
        "a later mkdir: {r:?}"
    );
    assert_err(r, ErrorCode::Io, libc::EIO);
    drop(f);
    // Reads go on: what was acknowledged durable is there.
    assert!(c.read_file("/kept").await.expect("read /kept") == pattern(1, LEN));

    // `madfs status`: failed, why, and a non-zero exit.
    let out = tc.madfs(["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "status of a failed server:\n{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with('0'))
        .unwrap_or_else(|| panic!("no row for server 0:\n{text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[2], "failed", "status row: {row}");
    for part in ["chunk store poisoned since", "fsync of", "restarted"] {
        assert!(row.contains(part), "status row lacks {part:?}: {row}");
    }
    // The log says it too.
    let log = tail(&tc.log_path(0), 50);
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("poisoned since")),
        "server log:\n{log}"
    );

    // A restart without the fault serves again, from what the disk holds.
    tc.stop(0);
    tc.set_server_env(&[]);
    tc.restart(0);
    let c = tc.client();
    let out = tc.madfs_ok(["status"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with('0') && l.contains(" up ")),
        "status after the restart:\n{out}"
    );
    assert!(c.read_file("/kept").await.expect("read /kept") == pattern(1, LEN));
    write_synced(&c, "/after", &pattern(3, LEN)).await;
    assert!(c.read_file("/after").await.expect("read /after") == pattern(3, LEN));
    c.mkdir("/d", 0o755).await.expect("mkdir after the restart");
}
