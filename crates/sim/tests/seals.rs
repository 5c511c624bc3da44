//! Seals of directories being removed, driven one message at a time on a
//! simulated cluster (the simulated clock: a create that waits for a seal
//! is seen waiting, without sleeping): an Unseal lifts only the seal of
//! the rmdir attempt that sent it, and a server restarted while a
//! directory was sealed takes its seals up again from the others.

use madfs_client::{CacheConfig, Client};
use madfs_proto::auth::Role;
use madfs_proto::message::{Op, Reply, Request, SealAction};
use madfs_rpc::{ClusterConfig, Pool, ServerEntry};
use madfs_server::{RunOptions, Server};
use madfs_sim::disk::SimDisk;
use madfs_sim::net::{Caller, SimNet};
use madfs_types::{dentry_server, Credentials, FileName, InodeId, SealId, ServerId};
use std::sync::Arc;
use std::time::Duration;

struct Cluster {
    cfg: ClusterConfig,
    net: Arc<SimNet>,
    disks: Vec<Arc<SimDisk>>,
    client: Client,
    /// Sends peer operations, as another server would.
    peer: Pool,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn new(servers: u16) -> Cluster {
        madfs_server::run_disk_io_inline(true);
        let dir = tempfile::tempdir().unwrap();
        let cfg = ClusterConfig {
            cluster_id: "seals".into(),
            chunk_size: 1 << 16,
            key_file: dir.path().join("key"),
            replicas: 1,
            servers: (0..servers)
                .map(|id| ServerEntry {
                    id,
                    address: std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + id)),
                    data_dir: dir.path().join(format!("server{id}")),
                    metrics: None,
                    host: None,
                })
                .collect(),
        };
        let n = usize::from(servers);
        let net = SimNet::new(1, n);
        let client = Client::from_pool(
            &cfg,
            Pool::in_process(net.endpoint(Caller::Client(0)), n, Role::Client),
        )
        .unwrap()
        .with_cache(CacheConfig::off());
        let peer = Pool::in_process(net.endpoint(Caller::Client(1)), n, Role::Peer);
        let c = Cluster {
            cfg,
            net,
            disks: (0..n).map(|_| Arc::new(SimDisk::default())).collect(),
            client,
            peer,
            _dir: dir,
        };
        for id in 0..servers {
            c.start(ServerId(id));
        }
        c
    }

    fn start(&self, id: ServerId) {
        let inc = self.net.next_incarnation(id);
        let kv = Arc::new(self.disks[usize::from(id.0)].open());
        let n = self.disks.len();
        let peers = Pool::in_process(self.net.endpoint(Caller::Server(id, inc)), n, Role::Peer);
        let opts = RunOptions {
            threads: Some(1),
            find_index_bytes: 0,
            direct_io: false,
            cache_bytes: 0,
            ..RunOptions::default()
        };
        let data_dir = self.cfg.servers[usize::from(id.0)].data_dir.clone();
        let server =
            Server::with_store_and_peers(&self.cfg, id, kv.clone(), data_dir, &opts, peers)
                .unwrap();
        let server = Arc::new(server);
        self.net.install(id, inc, server.clone(), kv);
        server.start_background();
    }

    /// Kill server `id` and start it again on its store (all of it kept).
    fn restart(&self, id: ServerId) {
        drop(self.net.kill(id));
        self.start(id);
    }
}

/// A name in `dir` whose entry lives on server `on` of `servers`.
fn name_on(dir: InodeId, on: ServerId, servers: usize) -> String {
    (0..)
        .map(|i| format!("f{i}"))
        .find(|n| dentry_server(dir, &FileName::new(n.as_bytes()).unwrap(), servers) == on)
        .unwrap()
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

async fn seal(peer: &Pool, on: ServerId, dir: InodeId, action: SealAction, seal: SealId) -> Reply {
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
    peer.call(on, &req, &[]).await.unwrap().reply
}

#[test]
fn a_late_unseal_lifts_only_its_own_attempts_seal() {
    let rt = paused_runtime();
    rt.block_on(async {
        let s = Cluster::new(1);
        let peer = |dir, action, id| seal(&s.peer, ServerId(0), dir, action, id);
        let d = s.client.mkdir("/d", 0o755).await.unwrap().ino;
        // The first attempt sealed and gave up; its Unseal is late. The
        // second attempt (another rmdir of /d) sealed meanwhile.
        let (first, second) = (SealId::fresh(), SealId::fresh());
        assert_eq!(
            peer(d, SealAction::Seal, first).await,
            Reply::Sealed { empty: true }
        );
        assert_eq!(
            peer(d, SealAction::Seal, second).await,
            Reply::Sealed { empty: true }
        );
        peer(d, SealAction::Unseal, first).await;
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
        peer(d, SealAction::Unseal, second).await;
        tokio::time::timeout(Duration::from_secs(5), create)
            .await
            .expect("the create goes on once the seal is lifted")
            .unwrap()
            .unwrap();
        assert_eq!(s.client.read_file("/d/f").await.unwrap(), b"x");
    });
    rt.shutdown_background();
}

#[test]
fn a_restarted_server_takes_up_the_seals_the_others_hold() {
    let rt = paused_runtime();
    rt.block_on(async {
        let s = Cluster::new(2);
        let d = s.client.mkdir("/d", 0o755).await.unwrap().ino;
        // An rmdir sealed /d on both servers, then server 1 restarted
        // (its seals were in memory) before the rmdir wrote its removal.
        let rmdir = SealId::fresh();
        for on in [ServerId(0), ServerId(1)] {
            assert_eq!(
                seal(&s.peer, on, d, SealAction::Seal, rmdir).await,
                Reply::Sealed { empty: true }
            );
        }
        s.restart(ServerId(1));
        // A create of a name on server 1 waits for the seal...
        let path = format!("/d/{}", name_on(d, ServerId(1), 2));
        let (client, p) = (s.client.clone(), path.clone());
        let create = tokio::spawn(async move { client.write_file(&p, b"x").await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !create.is_finished(),
            "a create went into a directory sealed before its server restarted: {:?}",
            create.await
        );
        // ...and goes on once the rmdir lifts it, everywhere.
        for on in [ServerId(0), ServerId(1)] {
            seal(&s.peer, on, d, SealAction::Unseal, rmdir).await;
        }
        tokio::time::timeout(Duration::from_secs(5), create)
            .await
            .expect("the create goes on once the seal is lifted")
            .unwrap()
            .unwrap();
        assert_eq!(s.client.read_file(&path).await.unwrap(), b"x");
        // Had the rmdir removed it instead, the create would fail.
        let gone = s.client.mkdir("/e", 0o755).await.unwrap().ino;
        let rmdir = SealId::fresh();
        for on in [ServerId(0), ServerId(1)] {
            seal(&s.peer, on, gone, SealAction::Seal, rmdir).await;
        }
        s.restart(ServerId(0));
        seal(&s.peer, ServerId(1), gone, SealAction::Removed, rmdir).await;
        let path = format!("/e/{}", name_on(gone, ServerId(0), 2));
        let e = s.client.write_file(&path, b"y").await.unwrap_err();
        assert_eq!(e.code, madfs_client::ErrorCode::NotFound, "{e}");
    });
    rt.shutdown_background();
}

#[test]
fn a_seal_lifted_on_a_restarted_server_is_not_brought_back_by_a_slower_one() {
    let rt = paused_runtime();
    rt.block_on(async {
        let s = Cluster::new(2);
        let d = s.client.mkdir("/d", 0o755).await.unwrap().ino;
        let rmdir = SealId::fresh();
        for on in [ServerId(0), ServerId(1)] {
            seal(&s.peer, on, d, SealAction::Seal, rmdir).await;
        }
        // Server 1 restarts and hears the rmdir give up; server 0 has not
        // heard it yet, and still reports the seal.
        s.restart(ServerId(1));
        seal(&s.peer, ServerId(1), d, SealAction::Unseal, rmdir).await;
        let path = format!("/d/{}", name_on(d, ServerId(1), 2));
        tokio::time::timeout(Duration::from_secs(5), s.client.write_file(&path, b"x"))
            .await
            .expect("a create waited for a seal lifted here before")
            .unwrap();
        // Another directory's seal, still held, is taken up as before.
        let e = s.client.mkdir("/e", 0o755).await.unwrap().ino;
        for on in [ServerId(0), ServerId(1)] {
            seal(&s.peer, on, e, SealAction::Seal, SealId::fresh()).await;
        }
        s.restart(ServerId(1));
        let path = format!("/e/{}", name_on(e, ServerId(1), 2));
        let waited = tokio::time::timeout(Duration::from_secs(5), s.client.write_file(&path, b"y"));
        assert!(
            waited.await.is_err(),
            "a create went into a sealed directory"
        );
    });
    rt.shutdown_background();
}
