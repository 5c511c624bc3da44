//! Guards the transport's promises: many requests in flight on one
//! connection each get their own answer; a wrong key is refused at the
//! handshake; clients cannot send peer operations; a malformed frame closes
//! only its own connection, and a frame the server would refuse is not sent;
//! a panicking handler costs only its own request.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply, SealAction};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::{Connection, RpcError};
use madfs_types::{Credentials, FileName, InodeId, ServerId};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers GetAttr{ino} with an error whose message is the inode number,
/// after a delay that makes later requests finish first.
struct Echo;

impl Handler for Echo {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        match req.op {
            Op::GetAttr { ino, .. } => {
                tokio::time::sleep(Duration::from_millis(100 - (ino.0 % 100))).await;
                Err(WireError::new(ErrorCode::NotFound, ino.0.to_string()))
            }
            Op::Write { .. } => Ok((
                Reply::Links {
                    nlink: data.len() as u32,
                },
                Vec::new(),
            )),
            _ => Ok((Reply::Empty, Vec::new())),
        }
    }
}

async fn start(key: ClusterKey) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, ServerId(0), key, Arc::new(Echo)));
    addr
}

async fn connect(
    addr: std::net::SocketAddr,
    key: &ClusterKey,
    role: Role,
) -> Result<Connection, RpcError> {
    Connection::connect(
        ServerId(0),
        addr,
        key,
        role,
        Duration::from_secs(5),
        Duration::from_secs(10),
    )
    .await
}

fn req(op: Op) -> Request {
    Request {
        creds: Credentials::root(),
        op,
        once: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_get_their_own_answers() {
    let key = ClusterKey([7; 32]);
    let addr = start(key.clone()).await;
    let conn = connect(addr, &key, Role::Client).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let r = conn
                .call(
                    &req(Op::GetAttr {
                        ino: InodeId(i),
                        after: vec![],
                    }),
                    &[],
                )
                .await;
            (i, r)
        }));
    }
    for t in tasks {
        let (i, r) = t.await.unwrap();
        match r {
            Err(RpcError::Remote(e)) => assert_eq!(e.message, i.to_string()),
            other => panic!("request {i}: unexpected {other:?}"),
        }
    }
    // Bulk data travels with the request.
    let w = Op::Write {
        ino: InodeId(1),
        chunk: madfs_types::ChunkIndex(0),
        offset: 0,
        file_size: 5,
    };
    let r = conn.call(&req(w), &[1u8; 12345]).await.unwrap();
    assert_eq!(r.reply, Reply::Links { nlink: 12345 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_is_refused() {
    let addr = start(ClusterKey([1; 32])).await;
    match connect(addr, &ClusterKey([2; 32]), Role::Client).await {
        Err(RpcError::Auth(m)) => assert!(m.contains("wrong cluster key"), "{m}"),
        Err(e) => panic!("expected an auth error, got {e}"),
        Ok(_) => panic!("a wrong key was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_send_peer_operations() {
    let key = ClusterKey([3; 32]);
    let addr = start(key.clone()).await;
    let op = Op::Seal {
        dir: InodeId(5),
        parent: InodeId::ROOT,
        name: FileName::new(b"d").unwrap(),
        action: SealAction::Seal,
        seal: madfs_types::SealId(1),
    };
    let client = connect(addr, &key, Role::Client).await.unwrap();
    match client.call(&req(op.clone()), &[]).await {
        Err(RpcError::Remote(e)) => assert_eq!(e.code, ErrorCode::NotPermitted),
        other => panic!("expected NotPermitted, got {other:?}"),
    }
    let peer = connect(addr, &key, Role::Peer).await.unwrap();
    assert_eq!(peer.call(&req(op), &[]).await.unwrap().reply, Reply::Empty);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_closes_only_its_own_connection() {
    let key = ClusterKey([4; 32]);
    let addr = start(key.clone()).await;
    let good = connect(addr, &key, Role::Client).await.unwrap();
    // Before authenticating: the server sends its challenge, we send junk.
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut challenge = [0u8; 32 + 34];
    raw.read_exact(&mut challenge).await.unwrap();
    raw.write_all(&[0xAB; 64]).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(
        n, 0,
        "the server should close a connection that sends garbage"
    );
    // Everyone else is still served.
    assert_eq!(
        good.call(&req(Op::StatFs), &[]).await.unwrap().reply,
        Reply::Empty
    );
}

/// Counts the Write requests running at once.
#[derive(Default)]
struct Gauge {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl Handler for Gauge {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        _req: Request,
        data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(n, SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.now.fetch_sub(1, SeqCst);
        Ok((
            Reply::Links {
                nlink: data.len() as u32,
            },
            Vec::new(),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_bytes_budget_bounds_what_a_server_holds() {
    let key = ClusterKey([5; 32]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gauge = Arc::new(Gauge::default());
    tokio::spawn(madfs_rpc::serve::serve_with_budget(
        listener,
        ServerId(0),
        key.clone(),
        gauge.clone(),
        1 << 20,
    ));
    let conn = connect(addr, &key, Role::Client).await.unwrap();
    let write = |size: usize| {
        let conn = conn.clone();
        tokio::spawn(async move {
            let op = Op::Write {
                ino: InodeId(1),
                chunk: madfs_types::ChunkIndex(1),
                offset: 0,
                file_size: 0,
            };
            conn.call(&req(op), &vec![7u8; size]).await
        })
    };
    // Two 600 kB writes never fit in 1 MiB together: they run one by one.
    let tasks: Vec<_> = (0..4).map(|_| write(600_000)).collect();
    for t in tasks {
        assert_eq!(
            t.await.unwrap().unwrap().reply,
            Reply::Links { nlink: 600_000 }
        );
    }
    assert_eq!(gauge.max.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A request larger than the whole budget still runs (alone).
    assert_eq!(
        write(3 << 20).await.unwrap().unwrap().reply,
        Reply::Links { nlink: 3 << 20 }
    );
}

/// Panics on Write (with a literal) and on Fsync (with a formatted
/// message); answers everything else.
struct Buggy;

impl Handler for Buggy {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        tokio::task::yield_now().await;
        match req.op {
            Op::Write { .. } => panic!("write handler exploded"),
            Op::Fsync => panic!("fsync of {} bytes exploded", data.len()),
            _ => Ok((Reply::Empty, Vec::new())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_at_once_and_frees_what_it_held() {
    let key = ClusterKey([6; 32]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // 1 MiB of budget: two 600 kB writes whose bytes leaked would hang the
    // second one.
    tokio::spawn(madfs_rpc::serve::serve_with_budget(
        listener,
        ServerId(0),
        key.clone(),
        Arc::new(Buggy),
        1 << 20,
    ));
    let conn = connect(addr, &key, Role::Client).await.unwrap();
    let before = madfs_rpc::serve::handler_panics();
    let write = Op::Write {
        ino: InodeId(1),
        chunk: madfs_types::ChunkIndex(0),
        offset: 0,
        file_size: 0,
    };
    for (op, data, says) in [
        (write.clone(), vec![5u8; 600_000], "write handler exploded"),
        (write.clone(), vec![5u8; 600_000], "write handler exploded"),
        (write, vec![5u8; 600_000], "write handler exploded"),
        (Op::Fsync, Vec::new(), "fsync of 0 bytes exploded"),
    ] {
        let started = std::time::Instant::now();
        match conn.call(&req(op), &data).await {
            Err(RpcError::Remote(e)) => {
                assert_eq!(e.code, ErrorCode::Io);
                assert!(e.message.contains("request handler panicked"), "{e}");
                assert!(e.message.contains(says), "{e}");
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the error took {:?}",
            started.elapsed()
        );
    }
    // The connection still serves everything else.
    assert!(!conn.is_closed());
    assert_eq!(
        conn.call(&req(Op::StatFs), &[]).await.unwrap().reply,
        Reply::Empty
    );
    assert!(madfs_rpc::serve::handler_panics() >= before + 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_the_server_would_refuse_fail_only_their_call() {
    let key = ClusterKey([8; 32]);
    let addr = start(key.clone()).await;
    let conn = connect(addr, &key, Role::Client).await.unwrap();
    // Data on an opcode that carries none: refused before it is sent.
    match conn.call(&req(Op::StatFs), &[1, 2, 3]).await {
        Err(RpcError::Protocol(madfs_proto::ProtoError::UnexpectedData(_))) => {}
        other => panic!("expected UnexpectedData, got {other:?}"),
    }
    // More data than a frame may hold: refused too.
    let too_much = vec![0u8; madfs_proto::frame::DATA_MAX_BYTES as usize + 1];
    let w = Op::Write {
        ino: InodeId(1),
        chunk: madfs_types::ChunkIndex(0),
        offset: 0,
        file_size: 0,
    };
    match conn.call_owned(&req(w.clone()), too_much).await {
        Err(RpcError::Protocol(madfs_proto::ProtoError::DataTooLong(_))) => {}
        other => panic!("expected DataTooLong, got {other:?}"),
    }
    // The connection was never touched: it still serves, by lent and by
    // given data alike.
    assert!(!conn.is_closed());
    let r = conn.call_owned(&req(w.clone()), vec![3u8; 70_000]).await;
    assert_eq!(r.unwrap().reply, Reply::Links { nlink: 70_000 });
    let r = conn.call(&req(w), &[3u8; 1000]).await;
    assert_eq!(r.unwrap().reply, Reply::Links { nlink: 1000 });
}

/// Never answers a Write.
struct Stuck;

impl Handler for Stuck {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        _req: Request,
        _data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok((Reply::Empty, Vec::new()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_gone_mid_send_fails_every_caller_at_once() {
    let key = ClusterKey([10; 32]);
    // The server runs on its own runtime, so shutting that down closes
    // its sockets as a crash would.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let server_key = key.clone();
    server_rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        // A small budget: the server stops reading, the client's writer
        // stalls with frames queued behind the one it is sending.
        madfs_rpc::serve::serve_with_budget(
            listener,
            ServerId(0),
            server_key,
            Arc::new(Stuck),
            1 << 20,
        )
        .await
    });
    let conn = connect(addr, &key, Role::Client).await.unwrap();
    let w = Op::Write {
        ino: InodeId(1),
        chunk: madfs_types::ChunkIndex(0),
        offset: 0,
        file_size: 0,
    };
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let (conn, w) = (conn.clone(), w.clone());
            tokio::spawn(async move { conn.call(&req(w), &vec![1u8; 1 << 20]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gone = std::time::Instant::now();
    server_rt.shutdown_background();
    for c in callers {
        match c.await.unwrap() {
            // The writer's error or the reader's, whichever sees it first.
            Err(RpcError::Io(m)) => assert!(m.contains("server 0"), "{m}"),
            other => panic!("expected a connection error, got {other:?}"),
        }
    }
    assert!(
        gone.elapsed() < Duration::from_secs(5),
        "{:?}",
        gone.elapsed()
    );
    assert!(conn.is_closed());
    match conn.call(&req(Op::StatFs), &[]).await {
        Err(RpcError::Io(m)) => assert!(m.contains("closed"), "{m}"),
        other => panic!("expected a closed connection, got {other:?}"),
    }
}
