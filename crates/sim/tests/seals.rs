//! Seals of directories being removed, driven one message at a time on a
//! simulated cluster (the simulated clock: a create that waits for a seal
//! is seen waiting, without sleeping): an Unseal lifts only the seal of
//! the rmdir attempt that sent it, and a server restarted while a
//! directory was sealed takes its seals up again from the others.

use madfs_client::{CacheConfig, Client, ClientError};
use madfs_proto::auth::Role;
use madfs_proto::message::{Op, Reply, Request, SealAction};
use madfs_rpc::{ClusterConfig, Pool, ServerEntry};
use madfs_server::{RunOptions, Server};
use madfs_sim::disk::SimDisk;
use madfs_sim::net::{Caller, SimNet};
use madfs_types::{dentry_server, Credentials, FileName, InodeId, SealId, ServerId};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

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
            voters: 3,
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

    /// Send `action` of attempt `id` on `dir` to every server; the
    /// answers must all be `Sealed { empty: true }`.
    async fn seal_all(&self, dir: InodeId, action: SealAction, id: SealId) {
        for on in 0..self.disks.len() as u16 {
            assert_eq!(
                seal(&self.peer, ServerId(on), dir, action, id).await,
                Reply::Sealed { empty: true }
            );
        }
    }

    /// Make directory `path` and seal it on every server for a new
    /// attempt; the directory and the attempt.
    async fn sealed_dir(&self, path: &str) -> (InodeId, SealId) {
        let dir = self.client.mkdir(path, 0o755).await.unwrap().ino;
        let id = SealId::fresh();
        self.seal_all(dir, SealAction::Seal, id).await;
        (dir, id)
    }

    /// Start writing `data` to `path` and see it still waiting after 5 s
    /// of the simulated clock (a seal's lease is 30 s); the write, to
    /// await once the seal is lifted.
    async fn create_waits(
        &self,
        path: &str,
        data: &'static [u8],
    ) -> JoinHandle<Result<(), ClientError>> {
        let (client, p) = (self.client.clone(), path.to_string());
        let create = tokio::spawn(async move { client.write_file(&p, data).await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            !create.is_finished(),
            "a create went into a sealed directory: {:?}",
            create.await
        );
        create
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

/// Run `test` on a new cluster of `servers` under the simulated clock.
fn simulated<F: Future<Output = ()>>(servers: u16, test: impl FnOnce(Cluster) -> F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async { test(Cluster::new(servers)).await });
    rt.shutdown_background();
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

/// Await `create`, which must finish within 5 s of the simulated clock.
async fn finishes(create: JoinHandle<Result<(), ClientError>>) {
    tokio::time::timeout(Duration::from_secs(5), create)
        .await
        .expect("the create goes on once the seal is lifted")
        .unwrap()
        .unwrap();
}

#[test]
fn a_late_unseal_lifts_only_its_own_attempts_seal() {
    simulated(1, |s| async move {
        // The first attempt sealed and gave up; its Unseal is late. The
        // second attempt (another rmdir of /d) sealed meanwhile.
        let (d, first) = s.sealed_dir("/d").await;
        let second = SealId::fresh();
        s.seal_all(d, SealAction::Seal, second).await;
        s.seal_all(d, SealAction::Unseal, first).await;
        // Still sealed by the second attempt: a create into /d waits.
        let create = s.create_waits("/d/f", b"x").await;
        // The second attempt's own Unseal lets it in.
        s.seal_all(d, SealAction::Unseal, second).await;
        finishes(create).await;
        assert_eq!(s.client.read_file("/d/f").await.unwrap(), b"x");
    });
}

#[test]
fn a_restarted_server_takes_up_the_seals_the_others_hold() {
    simulated(2, |s| async move {
        // An rmdir sealed /d on both servers, then server 1 restarted
        // (its seals were in memory) before the rmdir wrote its removal.
        let (d, rmdir) = s.sealed_dir("/d").await;
        s.restart(ServerId(1));
        // A create of a name on server 1 waits for the seal...
        let path = format!("/d/{}", name_on(d, ServerId(1), 2));
        let create = s.create_waits(&path, b"x").await;
        // ...and goes on once the rmdir lifts it, everywhere.
        s.seal_all(d, SealAction::Unseal, rmdir).await;
        finishes(create).await;
        assert_eq!(s.client.read_file(&path).await.unwrap(), b"x");
        // Had the rmdir removed it instead, the create would fail.
        let (gone, rmdir) = s.sealed_dir("/e").await;
        s.restart(ServerId(0));
        seal(&s.peer, ServerId(1), gone, SealAction::Removed, rmdir).await;
        let path = format!("/e/{}", name_on(gone, ServerId(0), 2));
        let e = s.client.write_file(&path, b"y").await.unwrap_err();
        assert_eq!(e.code, madfs_client::ErrorCode::NotFound, "{e}");
    });
}

#[test]
fn a_seal_lifted_on_a_restarted_server_is_not_brought_back_by_a_slower_one() {
    simulated(2, |s| async move {
        let (d, rmdir) = s.sealed_dir("/d").await;
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
        let (e, _) = s.sealed_dir("/e").await;
        s.restart(ServerId(1));
        s.create_waits(&format!("/e/{}", name_on(e, ServerId(1), 2)), b"y")
            .await;
    });
}
