//! Guards how a pool finds a replica set that moved while the server it
//! knew for it hangs (its host cut off: connects and handshakes get no
//! answer). A pool new to the set used to wait its whole connect timeout
//! before it asked where the set went, and the caller watching that
//! connect could not take the answer in (`set_routes` waited for the slot
//! the stuck connect held), so a fresh `madfs put` to a cut-off host's set
//! took 5 s per server out of reach.
//!
//! And how a pool treats a replica set none of whose servers answers
//! (every copy gone): the first call waits the whole failover wait for the
//! set to move, and fails; the calls after it ask for the routes once and
//! fail at once, until the set answers again. A server that answers with a
//! refusal (no lease: starting, or cut off) is alive, and its set waited
//! for as before. Before, every call waited the whole wait (30 s by
//! default): `ls -l` of a directory with a quarter of its files on such a
//! set waited 30 s per file.
//!
//! And how a pool new to such a set learns from the routes' answer that
//! no copy has answered the membership group for a while: it waits only
//! the rest of its failover wait, counted from then, and none once the set
//! has been silent that long. Before, each new process waited the whole
//! wait on its first call to the set.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::{ClusterConfig, Pool, RpcError};
use madfs_types::{Credentials, InodeId, ServerId};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A GetAttr of an inode of set 0, through `pool`.
async fn get_attr(pool: &Pool) -> Result<madfs_rpc::Response, RpcError> {
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
}

/// A server of set 0 taken over after a failover: it says set 0 is its
/// own now (map epoch 7) and answers GetAttr for it.
struct NewPrimary;

impl Handler for NewPrimary {
    async fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        _data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        match req.op {
            Op::GetRoutes => Ok((
                Reply::Routes {
                    epoch: 7,
                    serving: vec![ServerId(1), ServerId(1), ServerId(2)],
                    in_sync: Vec::new(),
                    addresses: Vec::new(),
                    voters: Vec::new(),
                    lost: Vec::new(),
                },
                Vec::new(),
            )),
            Op::GetAttr { .. } if ctx.set == ServerId(0) => Err(WireError::new(
                ErrorCode::NotFound,
                "answered by the new primary of set 0",
            )),
            _ => Err(WireError::new(ErrorCode::InvalidArgument, "unexpected")),
        }
    }

    fn serves(&self, set: ServerId, home: ServerId) -> bool {
        set == home || set == ServerId(0)
    }
}

/// A server that takes TCP connections and never says a word: a host cut
/// off after the connection was accepted looks the same to the caller.
async fn silent_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_set_whose_server_hangs_goes_where_the_set_moved() {
    let key = ClusterKey([9; 32]);
    let (hung0, _t0) = silent_server().await;
    let (hung2, _t2) = silent_server().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let primary = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        ServerId(1),
        key.clone(),
        Arc::new(NewPrimary),
    ));
    let cfg = ClusterConfig::from_toml(&format!(
        "cluster_id = \"t\"\nchunk_size = 1048576\nkey_file = \"k\"\nreplicas = 2\n\
         [[server]]\nid = 0\naddress = \"{hung0}\"\ndata_dir = \"d0\"\n\
         [[server]]\nid = 1\naddress = \"{primary}\"\ndata_dir = \"d1\"\n\
         [[server]]\nid = 2\naddress = \"{hung2}\"\ndata_dir = \"d2\"\n"
    ))
    .unwrap();
    // Connects (with their handshake) that would outlast the test: the
    // call must not wait for one to fail.
    let connect_timeout = Duration::from_secs(60);
    let pool = Pool::new(
        &cfg,
        key,
        Role::Client,
        Timeouts {
            connect: connect_timeout,
            call: Duration::from_secs(60),
        },
    );
    let t = Instant::now();
    let answer = get_attr(&pool).await;
    match answer {
        Err(madfs_rpc::RpcError::Remote(w)) => {
            assert_eq!(w.code, ErrorCode::NotFound, "{w:?}");
            assert!(w.message.contains("new primary"), "{w:?}");
        }
        other => panic!("expected the new primary's answer, got {other:?}"),
    }
    assert_eq!(pool.route(ServerId(0)), ServerId(1));
    assert!(
        t.elapsed() < connect_timeout / 2,
        "the call waited for the connect to the hung server: {:?}",
        t.elapsed()
    );
}

/// Every server of the test: server 0 serves set 0 as `mode` says; the
/// others say the routes (set 0 still on server 0: it has nowhere to go)
/// and count the asks.
struct ModalServer {
    mode: AtomicU8,
    asks: AtomicUsize,
    /// How long the routes say set 0 has had no live copy, in ms
    /// (`NOT_LOST`: not lost).
    lost_ms: AtomicU64,
}

const NOT_LOST: u64 = u64::MAX;

/// Server 0 hangs (a server gone without a word: the call times out)...
const HANGS: u8 = 0;
/// ...answers...
const ANSWERS: u8 = 1;
/// ...or refuses as a server without a lease does (alive: starting, or
/// cut off from the membership group).
const REFUSES: u8 = 2;

impl Handler for ModalServer {
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
                        lost: match self.lost_ms.load(Ordering::SeqCst) {
                            NOT_LOST => Vec::new(),
                            ms => vec![(ServerId(0), ms)],
                        },
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

/// A pool of `cfg` as a client, whose calls time out after 300 ms and
/// wait `failover_wait` for their set to move.
fn modal_pool(cfg: &ClusterConfig, key: ClusterKey, failover_wait: Duration) -> Pool {
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        call: Duration::from_millis(300),
    };
    let mut pool = Pool::new(cfg, key, Role::Client, timeouts);
    pool.set_failover_wait(failover_wait);
    pool
}

/// Three servers of a `ModalServer` (server 0 hanging, set 0 not lost) on
/// loopback, and the cluster file that names them (2 copies: sets may
/// move).
async fn modal_cluster(key: &ClusterKey) -> (Arc<ModalServer>, ClusterConfig) {
    let server = Arc::new(ModalServer {
        mode: AtomicU8::new(HANGS),
        asks: AtomicUsize::new(0),
        lost_ms: AtomicU64::new(NOT_LOST),
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
    (server, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_set_given_up_fail_at_once_until_it_answers_again() {
    let key = ClusterKey([7; 32]);
    let (server, cfg) = modal_cluster(&key).await;
    let pool = modal_pool(&cfg, key, Duration::from_millis(1500));
    // How many times one call asked for the routes, and how it failed.
    let call = |mode: u8| {
        server.mode.store(mode, Ordering::SeqCst);
        let before = server.asks.load(Ordering::SeqCst);
        let pool = &pool;
        let server = &server;
        async move {
            let r = get_attr(pool).await.map(drop);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pool_waits_only_until_its_set_has_been_silent_the_failover_wait() {
    let key = ClusterKey([9; 32]);
    let (server, cfg) = modal_cluster(&key).await;
    let wait = Duration::from_secs(4);
    // A fresh pool (a new process) per call, so nothing is given up yet.
    let call = |mode: u8, lost_ms: u64| {
        server.mode.store(mode, Ordering::SeqCst);
        server.lost_ms.store(lost_ms, Ordering::SeqCst);
        let before = server.asks.load(Ordering::SeqCst);
        let (cfg, key, server) = (&cfg, key.clone(), &server);
        async move {
            let pool = modal_pool(cfg, key, wait);
            let t = Instant::now();
            let r = get_attr(&pool).await.map(drop);
            (server.asks.load(Ordering::SeqCst) - before, t.elapsed(), r)
        }
    };
    // The error says for how long, in whole seconds, at least `secs`.
    let says_lost = |r: &Result<(), RpcError>, secs: u64| {
        matches!(r, Err(RpcError::Timeout(m)) if (secs..secs + 3).any(|n| m.contains(&format!(
            "no copy of set 0 has answered the membership group for {n} s"
        ))))
    };

    // Silent longer than the wait: one ask, and the call fails.
    let (asks, took, r) = call(HANGS, 7_000).await;
    assert!(
        says_lost(&r, 7) && asks <= 2 && took < wait / 2,
        "lost for 7 s: {asks} asks in {took:?}, {r:?}"
    );
    // Silent for 3 of the 4 s: the call waits about the last second.
    let (asks, took, r) = call(HANGS, 3_000).await;
    assert!(
        says_lost(&r, 3) && took < wait * 2 / 3,
        "lost for 3 s: {asks} asks in {took:?}, {r:?}"
    );
    // A server that refuses is alive (starting, without its lease yet):
    // waited for the whole wait whatever the routes say.
    let (asks, took, r) = call(REFUSES, 7_000).await;
    assert!(
        matches!(&r, Err(RpcError::Remote(w)) if w.code == ErrorCode::Unavailable)
            && took >= wait * 3 / 4,
        "refused: {asks} asks in {took:?}, {r:?}"
    );
    // Not lost (a set moving, or its server restarting): the whole wait.
    let (asks, took, r) = call(HANGS, NOT_LOST).await;
    assert!(
        matches!(&r, Err(RpcError::Timeout(m)) if !m.contains("membership group"))
            && took >= wait * 3 / 4,
        "not lost: {asks} asks in {took:?}, {r:?}"
    );
}
