//! Guards how a pool finds a replica set that moved while the server it
//! knew for it hangs (its host cut off: connects and handshakes get no
//! answer). A pool new to the set used to wait its whole connect timeout
//! before it asked where the set went, and the caller watching that
//! connect could not take the answer in (`set_routes` waited for the slot
//! the stuck connect held), so a fresh `madfs put` to a cut-off host's set
//! took 5 s per server out of reach.

use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::{ClusterConfig, Pool};
use madfs_types::{Credentials, InodeId, ServerId};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let answer = pool
        .call(
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
        .await;
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
