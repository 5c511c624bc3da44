//! Seals of directories being removed, driven one message at a time on a
//! simulated one-server cluster (the simulated clock: a create that waits
//! for a seal is seen waiting, without sleeping): an Unseal lifts only
//! the seal of the rmdir attempt that sent it.

use madfs_client::{CacheConfig, Client};
use madfs_proto::auth::Role;
use madfs_proto::message::{Op, Reply, Request, SealAction};
use madfs_rpc::{ClusterConfig, Pool, ServerEntry};
use madfs_server::{RunOptions, Server};
use madfs_sim::disk::SimDisk;
use madfs_sim::net::{Caller, SimNet};
use madfs_types::{Credentials, FileName, InodeId, SealId, ServerId};
use std::sync::Arc;
use std::time::Duration;

struct OneServer {
    client: Client,
    /// Sends peer operations, as another server would.
    peer: Pool,
    _dir: tempfile::TempDir,
}

fn one_server() -> OneServer {
    madfs_server::run_disk_io_inline(true);
    let dir = tempfile::tempdir().unwrap();
    let cfg = ClusterConfig {
        cluster_id: "seals".into(),
        chunk_size: 1 << 16,
        key_file: dir.path().join("key"),
        replicas: 1,
        servers: vec![ServerEntry {
            id: 0,
            address: std::net::SocketAddr::from(([127, 0, 0, 1], 7000)),
            data_dir: dir.path().join("server0"),
            metrics: None,
            host: None,
        }],
    };
    let net = SimNet::new(1, 1);
    let id = ServerId(0);
    let inc = net.next_incarnation(id);
    let kv = Arc::new(Arc::new(SimDisk::default()).open());
    let peers = Pool::in_process(net.endpoint(Caller::Server(id, inc)), 1, Role::Peer);
    let opts = RunOptions {
        threads: Some(1),
        find_index_bytes: 0,
        direct_io: false,
        cache_bytes: 0,
        ..RunOptions::default()
    };
    let server = Server::with_store_and_peers(
        &cfg,
        id,
        kv.clone(),
        cfg.servers[0].data_dir.clone(),
        &opts,
        peers,
    )
    .unwrap();
    let server = Arc::new(server);
    net.install(id, inc, server.clone(), kv);
    server.start_background();
    let client = Client::from_pool(
        &cfg,
        Pool::in_process(net.endpoint(Caller::Client(0)), 1, Role::Client),
    )
    .unwrap()
    .with_cache(CacheConfig::off());
    let peer = Pool::in_process(net.endpoint(Caller::Client(1)), 1, Role::Peer);
    OneServer {
        client,
        peer,
        _dir: dir,
    }
}

async fn seal(peer: &Pool, dir: InodeId, action: SealAction, seal: SealId) -> Reply {
    let req = Request {
        creds: Credentials::root(),
        op: Op::Seal {
            dir,
            parent: InodeId::ROOT,
            name: FileName::new(b"d").unwrap(),
            action,
            seal,
        },
        once: None,
    };
    peer.call(ServerId(0), &req, &[]).await.unwrap().reply
}

#[test]
fn a_late_unseal_lifts_only_its_own_attempts_seal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let s = one_server();
        let d = s.client.mkdir("/d", 0o755).await.unwrap().ino;
        // The first attempt sealed and gave up; its Unseal is late. The
        // second attempt (another rmdir of /d) sealed meanwhile.
        let (first, second) = (SealId::fresh(), SealId::fresh());
        assert_eq!(
            seal(&s.peer, d, SealAction::Seal, first).await,
            Reply::Sealed { empty: true }
        );
        assert_eq!(
            seal(&s.peer, d, SealAction::Seal, second).await,
            Reply::Sealed { empty: true }
        );
        seal(&s.peer, d, SealAction::Unseal, first).await;
        // Still sealed by the second attempt: a create into /d waits (the
        // lease is 30 s of the simulated clock; 5 s pass here).
        let client = s.client.clone();
        let create = tokio::spawn(async move { client.write_file("/d/f", b"x").await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !create.is_finished(),
            "a create went into a directory that an rmdir holds sealed: {:?}",
            create.await
        );
        // The second attempt's own Unseal lets it in.
        seal(&s.peer, d, SealAction::Unseal, second).await;
        tokio::time::timeout(Duration::from_secs(5), create)
            .await
            .expect("the create goes on once the seal is lifted")
            .unwrap()
            .unwrap();
        assert_eq!(s.client.read_file("/d/f").await.unwrap(), b"x");
    });
    rt.shutdown_background();
}
