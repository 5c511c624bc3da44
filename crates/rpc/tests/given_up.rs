//! Guards how a pool treats a replica set none of whose servers answers
//! (every copy gone): the first call waits the whole failover wait for the
//! set to move, and fails; the calls after it ask for the routes once and
//! fail at once, until the set answers again. A server that answers with a
//! refusal (no lease: starting, or cut off) is alive, and its set waited
//! for as before. Before, every call waited
//! the whole wait (30 s by default): `ls -l` of a directory with a
//! quarter of its files on such a set waited 30 s per file.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::{ClusterConfig, Pool, RpcError};
use madfs_types::{Credentials, InodeId, ServerId};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Every server of the test: server 0 serves set 0 as `mode` says; the
/// others say the routes (set 0 still on server 0: it has nowhere to go)
/// and count the asks.
struct Server {
    mode: AtomicU8,
    asks: AtomicUsize,
}

/// Server 0 hangs (a server gone without a word: the call times out)...
const HANGS: u8 = 0;
/// ...answers...
const ANSWERS: u8 = 1;
/// ...or refuses as a server without a lease does (alive: starting, or
/// cut off from the membership group).
const REFUSES: u8 = 2;

impl Handler for Server {
    async fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        req: Request,
        _data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        match req.op {
            Op::GetRoutes => {
                self.asks.fetch_add(1, Ordering::SeqCst);
                Ok((
                    Reply::Routes {
                        epoch: 3,
                        serving: vec![ServerId(0), ServerId(1), ServerId(2)],
                        in_sync: Vec::new(),
                        addresses: Vec::new(),
                        voters: Vec::new(),
                    },
                    Vec::new(),
                ))
            }
            Op::GetAttr { .. } => match self.mode.load(Ordering::SeqCst) {
                HANGS => std::future::pending().await,
                ANSWERS => Err(WireError::new(ErrorCode::NotFound, "answered")),
                _ => Err(WireError::new(
                    ErrorCode::Unavailable,
                    "server 0 holds no lease",
                )),
            },
            _ => Err(WireError::new(ErrorCode::InvalidArgument, "unexpected")),
        }
    }
}

async fn get_attr(pool: &Pool) -> Result<(), RpcError> {
    pool.call(
        ServerId(0),
        &Request {
            creds: Credentials::root(),
            op: Op::GetAttr {
                ino: InodeId(5),
                after: Vec::new(),
            },
            once: None,
        },
        &[],
    )
    .await
    .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_set_given_up_fail_at_once_until_it_answers_again() {
    let key = ClusterKey([7; 32]);
    let server = Arc::new(Server {
        mode: AtomicU8::new(HANGS),
        asks: AtomicUsize::new(0),
    });
    let mut addrs = Vec::new();
    for id in 0..3u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        tokio::spawn(serve(listener, ServerId(id), key.clone(), server.clone()));
    }
    let cfg = ClusterConfig::from_toml(&format!(
        "cluster_id = \"t\"\nchunk_size = 1048576\nkey_file = \"k\"\nreplicas = 2\n\
         [[server]]\nid = 0\naddress = \"{}\"\ndata_dir = \"d0\"\n\
         [[server]]\nid = 1\naddress = \"{}\"\ndata_dir = \"d1\"\n\
         [[server]]\nid = 2\naddress = \"{}\"\ndata_dir = \"d2\"\n",
        addrs[0], addrs[1], addrs[2]
    ))
    .unwrap();
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        call: Duration::from_millis(300),
    };
    let mut pool = Pool::new(&cfg, key, Role::Client, timeouts);
    pool.set_failover_wait(Duration::from_millis(1500));
    // How many times one call asked for the routes, and how it failed.
    let call = |mode: u8| {
        server.mode.store(mode, Ordering::SeqCst);
        let before = server.asks.load(Ordering::SeqCst);
        let pool = &pool;
        let server = &server;
        async move {
            let r = get_attr(pool).await;
            (server.asks.load(Ordering::SeqCst) - before, r)
        }
    };
    let timed_out = |r: &Result<(), RpcError>| matches!(r, Err(RpcError::Timeout(_)));

    // The first call waits for the set to move, asking every round.
    let (asks, r) = call(HANGS).await;
    assert!(timed_out(&r) && asks >= 4, "first call: {asks} asks, {r:?}");
    // The calls after it ask once each (one round: both other servers).
    for _ in 0..3 {
        let (asks, r) = call(HANGS).await;
        assert!(timed_out(&r) && asks <= 2, "given up: {asks} asks, {r:?}");
    }
    // A server that refuses is alive: its set is waited for again...
    let (asks, r) = call(REFUSES).await;
    assert!(
        matches!(&r, Err(RpcError::Remote(w)) if w.code == ErrorCode::Unavailable) && asks >= 4,
        "refused: {asks} asks, {r:?}"
    );
    // ...and so it is once gone again.
    let (asks, r) = call(HANGS).await;
    assert!(
        timed_out(&r) && asks >= 4,
        "after a refusal: {asks} asks, {r:?}"
    );
    let (asks, r) = call(HANGS).await;
    assert!(
        timed_out(&r) && asks <= 2,
        "given up again: {asks} asks, {r:?}"
    );
    // The set answers: calls go through, and once it is gone again the
    // next call waits the whole wait again.
    let (_, r) = call(ANSWERS).await;
    assert!(
        matches!(&r, Err(RpcError::Remote(w)) if w.code == ErrorCode::NotFound),
        "expected the server's answer, got {r:?}"
    );
    let (asks, r) = call(HANGS).await;
    assert!(
        timed_out(&r) && asks >= 4,
        "after an answer: {asks} asks, {r:?}"
    );
}
