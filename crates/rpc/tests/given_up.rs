//! Guards how a pool treats a replica set none of whose servers answers
//! (every copy gone): the first call waits the whole failover wait for the
//! set to move, and fails; the calls after it ask for the routes once and
//! fail at once, until the set answers again. Before, every call waited
//! the whole wait (30 s by default): `ls -l` of a directory with a
//! quarter of its files on such a set waited 30 s per file.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::{ClusterConfig, Pool, RpcError};
use madfs_types::{Credentials, InodeId, ServerId};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Every server of the test: server 0 serves set 0 and, while `down`,
/// refuses as a server without a lease does; the others say the routes
/// (set 0 still on server 0: it has nowhere to go) and count the asks.
struct Server {
    down: AtomicBool,
    asks: AtomicUsize,
}

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
            Op::GetAttr { .. } if self.down.load(Ordering::SeqCst) => Err(WireError::new(
                ErrorCode::Unavailable,
                "server 0 holds no lease",
            )),
            Op::GetAttr { .. } => Err(WireError::new(ErrorCode::NotFound, "answered")),
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
        down: AtomicBool::new(true),
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
    let mut pool = Pool::new(&cfg, key, Role::Client, Timeouts::default());
    pool.set_failover_wait(Duration::from_millis(1500));
    let asks = || server.asks.load(Ordering::SeqCst);
    let refused = |r: Result<(), RpcError>| match r {
        Err(RpcError::Remote(w)) if w.code == ErrorCode::Unavailable => {}
        other => panic!("expected the refusal to stand, got {other:?}"),
    };

    // The first call waits for the set to move, asking every round.
    refused(get_attr(&pool).await);
    let first = asks();
    assert!(
        first >= 4,
        "the first call asked for the routes {first} times"
    );

    // The calls after it ask once each (one round: both other servers).
    for _ in 0..3 {
        let before = asks();
        refused(get_attr(&pool).await);
        let now = asks() - before;
        assert!(now <= 2, "a call to the given-up set asked {now} times");
    }

    // The set answers again: calls go through, and once it is gone again
    // the next call waits the whole wait again.
    server.down.store(false, Ordering::SeqCst);
    match get_attr(&pool).await {
        Err(RpcError::Remote(w)) if w.code == ErrorCode::NotFound => {}
        other => panic!("expected the server's answer, got {other:?}"),
    }
    server.down.store(true, Ordering::SeqCst);
    let before = asks();
    refused(get_attr(&pool).await);
    let again = asks() - before;
    assert!(
        again >= 4,
        "after the set answered, a call asked {again} times"
    );
}
