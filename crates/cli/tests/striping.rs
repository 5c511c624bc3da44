//! Guards striping end to end: a 100 MiB file written through the client in
//! 4 MiB pieces comes back bit for bit through `madfs get` (compared by
//! SHA-256), and its chunks really are spread over all 4 servers (each
//! reports stored data bytes, through the client and through `madfs status`).

mod common;

use common::{pattern, TestCluster, CHUNK};
use madfs_client::OpenOptions;
use sha2::{Digest, Sha256};

const SERVERS: usize = 4;
const PIECE: usize = 4 << 20;
const TOTAL: usize = 100 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_file_round_trips_and_stripes_over_every_server() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let before: Vec<u64> = c
        .server_stats()
        .await
        .into_iter()
        .map(|(_, r)| r.unwrap().data_bytes)
        .collect();

    let f = c
        .open(
            "/big.bin",
            OpenOptions::new().write(true).create(true).truncate(true),
        )
        .await
        .unwrap();
    let mut hasher = Sha256::new();
    for i in 0..TOTAL / PIECE {
        let piece = pattern(1000 + i as u64, PIECE);
        hasher.update(&piece);
        assert_eq!(f.write_at((i * PIECE) as u64, &piece).await.unwrap(), PIECE);
    }
    f.fsync().await.unwrap();
    f.close().await.unwrap();
    let source_sha = hasher.finalize();
    assert_eq!(c.stat("/big.bin").await.unwrap().size, TOTAL as u64);

    // Read it back whole through the CLI, into a local file.
    let local = tc.root().join("big.copy");
    let out = tc.madfs(["get".as_ref(), "/big.bin".as_ref(), local.as_os_str()]);
    assert!(
        out.status.success(),
        "madfs get failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = std::fs::read(&local).unwrap();
    assert_eq!(copy.len(), TOTAL);
    assert_eq!(
        Sha256::digest(&copy),
        source_sha,
        "contents differ after a round trip"
    );
    drop(copy);

    // Every server stores a share of the 100 chunks.
    let after: Vec<u64> = c
        .server_stats()
        .await
        .into_iter()
        .map(|(_, r)| r.unwrap().data_bytes)
        .collect();
    let grown: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    for (i, g) in grown.iter().enumerate() {
        assert!(
            *g >= CHUNK,
            "server {i} stores only {g} new bytes: {grown:?}"
        );
    }
    assert!(
        grown.iter().sum::<u64>() >= TOTAL as u64,
        "total stored {grown:?} is less than the file"
    );

    let status = tc.madfs_ok(["status"]);
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), SERVERS, "status:\n{status}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[2], "up", "status row: {row}");
        let data: u64 = cols[4].parse().unwrap();
        assert!(data >= CHUNK, "status row shows no data: {row}");
    }

    // `get` to stdout gives the same bytes.
    let out = tc.madfs(["get", "/big.bin", "-"]);
    assert!(out.status.success());
    assert_eq!(Sha256::digest(&out.stdout), source_sha);
}
