//! Guards the client's cancel safety: a caller dropped at any moment (the
//! read-ahead aborts tasks mid-send) must never leave half a frame on the
//! socket, since the connection is shared and the next frame would then be
//! read from the middle of the torn one. Its own file, so that the
//! process-wide `protocol_errors` counter sees only this test's server.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::serve::{protocol_errors, serve_with_budget, CallContext, Handler};
use madfs_rpc::{Connection, RpcError};
use madfs_types::{ChunkIndex, Credentials, InodeId, ServerId};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The payload of request `ino`: a pattern unique enough that a frame torn
/// and spliced with another one shows up as wrong bytes.
/// Byte `i` is `(start + i) % 251`, built (and compared) a period at a
/// time so that debug builds move the test's megabytes at memcpy speed.
fn pattern(ino: u64, len: usize) -> Vec<u8> {
    let table: Vec<u8> = (0..2 * 251).map(|j| (j % 251) as u8).collect();
    let start = (ino.wrapping_mul(0x9E37) % 251) as usize;
    let period = &table[start..start + 251];
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        let n = (len - data.len()).min(251);
        data.extend_from_slice(&period[..n]);
    }
    data
}

fn answer(ino: u64, len: usize) -> u32 {
    (ino as u32) ^ (len as u32)
}

/// Checks every Write's data against its pattern, slowly enough that the
/// socket fills and senders really are stopped in the middle of frames.
#[derive(Default)]
struct Checker {
    good: AtomicU64,
    bad: AtomicU64,
}

impl Handler for Checker {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        let Op::Write { ino, file_size, .. } = req.op else {
            return Ok((Reply::Empty, Vec::new()));
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        if data.len() as u64 != file_size || data != pattern(ino.0, data.len()) {
            self.bad.fetch_add(1, SeqCst);
            return Err(WireError::new(ErrorCode::Io, "torn payload"));
        }
        self.good.fetch_add(1, SeqCst);
        Ok((
            Reply::Links {
                nlink: answer(ino.0, data.len()),
            },
            Vec::new(),
        ))
    }
}

/// SplitMix64: a seeded, replayable choice of sizes and abort times.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn write(conn: &Connection, ino: u64, len: usize) -> Result<u32, RpcError> {
    let req = Request {
        creds: Credentials::root(),
        op: Op::Write {
            ino: InodeId(ino),
            chunk: ChunkIndex(0),
            offset: 0,
            file_size: len as u64,
        },
        once: None,
    };
    // Odd requests lend their data (copied into the frame), even ones give
    // it away (written from the caller's buffer): both paths are covered.
    let response = if ino % 2 == 1 {
        conn.call(&req, &pattern(ino, len)).await?
    } else {
        conn.call_owned(&req, pattern(ino, len)).await?
    };
    match response.reply {
        Reply::Links { nlink } => Ok(nlink),
        other => panic!("request {ino}: unexpected reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_aborted_mid_send_leave_the_connection_intact() {
    let key = ClusterKey([9; 32]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let checker = Arc::new(Checker::default());
    // A small budget: the server stops reading while a few megabytes are
    // being handled, so the client's sends stall part-way through frames.
    tokio::spawn(serve_with_budget(
        listener,
        ServerId(0),
        key.clone(),
        checker.clone(),
        2 << 20,
    ));
    let conn = Connection::connect(
        ServerId(0),
        addr,
        &key,
        Role::Client,
        Duration::from_secs(5),
        Duration::from_secs(20),
    )
    .await
    .unwrap();

    let mut rng = Rng(0x5EED_0014);
    let mut ino = 0u64;
    let (mut aborted, mut finished) = (0, 0);
    for _round in 0..8 {
        let mut tasks = Vec::new();
        for _ in 0..300 {
            ino += 1;
            let len = 16 * 1024 + rng.below(512 * 1024) as usize;
            let c = conn.clone();
            let task = tokio::spawn(async move { (ino, len, write(&c, ino, len).await) });
            if rng.below(2) == 0 {
                let delay = Duration::from_micros(rng.below(250_000));
                let handle = task.abort_handle();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    handle.abort();
                });
            }
            tasks.push(task);
        }
        for t in tasks {
            match t.await {
                Ok((ino, len, result)) => {
                    finished += 1;
                    match result {
                        Ok(n) => assert_eq!(n, answer(ino, len), "request {ino}"),
                        Err(e) => panic!("request {ino} of {len} bytes failed: {e}"),
                    }
                }
                Err(e) if e.is_cancelled() => aborted += 1,
                Err(e) => panic!("caller task failed: {e}"),
            }
        }
    }
    eprintln!("{aborted} callers aborted, {finished} finished");
    assert!(aborted > 100, "only {aborted} callers were aborted");
    assert!(finished > 100, "only {finished} callers finished");

    // The same connection still answers, correctly, after all the aborts.
    assert!(!conn.is_closed(), "the connection was closed");
    for _ in 0..20 {
        ino += 1;
        let len = 1 + rng.below(1 << 20) as usize;
        assert_eq!(write(&conn, ino, len).await.unwrap(), answer(ino, len));
    }
    assert_eq!(
        conn.call(
            &Request {
                creds: Credentials::root(),
                op: Op::StatFs,
                once: None,
            },
            &[],
        )
        .await
        .unwrap()
        .reply,
        Reply::Empty
    );
    assert_eq!(checker.bad.load(SeqCst), 0, "the server got torn payloads");
    assert_eq!(protocol_errors(), 0, "the server saw malformed frames");
    assert!(checker.good.load(SeqCst) >= finished + 20);
}
