//! Seams for assembling a server process of a cluster that keeps replicas
//! without TCP and without RocksDB directories: the deterministic
//! simulation (crates/sim) puts together the same parts `run()` does
//! (Server, Router, the membership group, following the map), with the
//! metadata stores and the pools to other processes supplied by the
//! caller. Nothing here runs in a real server process.

use crate::failover::Router;
use crate::members::Members;
use crate::metrics::Metrics;
use crate::{RunOptions, Server, ServerError};
use madfs_kv::KvStore;
use madfs_proto::auth::ClusterKey;
use madfs_proto::{ErrorCode, WireError};
use madfs_rpc::{ClusterConfig, Pool};
use madfs_types::ServerId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where a process's stores and pools come from.
pub trait Stores: Send + Sync + 'static {
    /// The metadata store of the copy of a set kept in directory `dir`
    /// (DATA/replica-of-S), which is also the store the set is served from
    /// once promoted. A copy whose directory does not exist (never made,
    /// or removed by a resync) must come back empty.
    fn open_meta(&self, dir: &Path) -> std::io::Result<Arc<dyn KvStore>>;
    /// A pool to the other server processes, for a server this process
    /// starts (a promoted set) or for its membership messages.
    fn peers(&self) -> Pool;
    /// The boot the process runs in: a copy whose position was written in
    /// the same boot lost nothing (replica.rs `Position::whole`). By
    /// default the kernel's.
    fn boot(&self) -> Option<crate::replica::BootId> {
        crate::replica::kernel_boot_id()
    }
}

/// One server process that keeps replicas, as `run()` assembles it.
pub struct ReplicatedProcess {
    pub server: Arc<Server>,
    pub router: Arc<Router>,
    group: Option<Arc<Members>>,
}

/// The key promoted sets would use for TCP pools: unused with `Stores`.
fn unused_key() -> ClusterKey {
    ClusterKey::from_hex(&"00".repeat(32)).expect("a valid key")
}

impl ReplicatedProcess {
    /// Open server `id` over `kv` (its home set) with its router, as
    /// `run()` does before it listens; `join_group` comes once the process
    /// is reachable (voters must reach each other to start).
    pub fn open(
        cfg: &ClusterConfig,
        id: ServerId,
        kv: Arc<dyn KvStore>,
        data_dir: PathBuf,
        opts: &RunOptions,
        stores: Arc<dyn Stores>,
    ) -> Result<ReplicatedProcess, ServerError> {
        let server = Arc::new(Server::with_parts(
            cfg,
            id,
            kv,
            data_dir,
            opts,
            stores.peers(),
            Some(stores.clone()),
        )?);
        let metrics = Arc::new(Metrics::new(server.sync.stats()));
        // The router starts the server's background work (not while its
        // set is held after a power loss).
        let router = Arc::new(Router::new(
            server.clone(),
            cfg.clone(),
            unused_key(),
            opts.clone(),
            metrics,
        ));
        router.set_stores(stores);
        Ok(ReplicatedProcess {
            server,
            router,
            group: None,
        })
    }

    /// Take part in the membership group (the Raft state of a voter in
    /// `raft`), and follow its map from now on, as `run()` does.
    pub async fn join_group(
        &mut self,
        cfg: &ClusterConfig,
        data_dir: &Path,
        stores: &Arc<dyn Stores>,
        raft: Arc<dyn KvStore>,
    ) -> Result<(), ServerError> {
        let id = self.server.id;
        let g = Members::start_with(
            cfg,
            id,
            Arc::new(stores.peers()),
            Some(raft),
            data_dir,
            false,
        )
        .await?;
        self.router.join(g.clone());
        g.follow(self.router.clone());
        self.group = Some(g);
        Ok(())
    }

    pub fn id(&self) -> ServerId {
        self.server.id
    }

    /// Stop the group's node and detector (of a process that died: its
    /// timers would otherwise run on).
    pub async fn stop_group(&self) {
        if let Some(g) = &self.group {
            g.shutdown().await;
        }
    }

    /// The voters of the membership group, as this process last heard.
    pub fn voters(&self) -> Vec<ServerId> {
        self.group.as_ref().map_or(Vec::new(), |g| g.voters())
    }

    /// The map epoch this process applied last, and which process serves
    /// each set by it.
    pub fn routes(&self) -> (u64, Vec<ServerId>) {
        let r = self.router.routes();
        (r.epoch, r.serving)
    }

    /// The members of each set (in sync, then catching up) by the newest
    /// map this process knows; empty before it knows one.
    pub fn sets(&self) -> Vec<(Vec<ServerId>, Vec<ServerId>)> {
        self.group.as_ref().map_or(Vec::new(), |g| {
            g.map()
                .sets
                .iter()
                .map(|s| (s.members.clone(), s.syncing.clone()))
                .collect()
        })
    }
}

/// Open promoted `set` from the copy in `dir` through `stores` (`Router::
/// promote` with `Router::set_stores`).
pub(crate) fn open_promoted(
    cfg: &ClusterConfig,
    set: ServerId,
    dir: &Path,
    opts: &RunOptions,
    stores: &Arc<dyn Stores>,
) -> Result<Server, ServerError> {
    let kv = stores
        .open_meta(dir)
        .map_err(|e| ServerError::Storage(format!("opening set {set}: {e}")))?;
    Server::with_parts(
        cfg,
        set,
        kv,
        dir.to_path_buf(),
        opts,
        stores.peers(),
        Some(stores.clone()),
    )
}

/// How long an fsync waits for the replicas, as any request does
/// (dispatch.rs).
const SYNC_REPLICATION_WAIT: Duration = Duration::from_secs(10);

impl Server {
    /// What `Op::Fsync` does, on the calling task instead of the sync
    /// thread (whose wait would let the simulation's paused clock run):
    /// sync the chunk files and the metadata log (a sync record for the
    /// replicas), then wait until every replica in the set has it.
    pub async fn sync_inline(&self) -> Result<(), WireError> {
        let io = |e: String| WireError::new(ErrorCode::Io, e);
        let chunks = self.chunks.clone();
        crate::service::blocking(move || chunks.sync_dirty())
            .await
            .map_err(|e| io(format!("syncing chunk files: {e}")))?;
        self.kv
            .sync_wal()
            .map_err(|e| io(format!("syncing metadata log: {e}")))?;
        if let Some(r) = &self.replication {
            let last = r.last_seq();
            tokio::time::timeout(SYNC_REPLICATION_WAIT, r.wait_replicated(last))
                .await
                .map_err(|_| {
                    // As dispatch.rs answers: done here, not acknowledged.
                    WireError::new(
                        ErrorCode::TimedOut,
                        format!(
                            "server {}: not on every replica within {SYNC_REPLICATION_WAIT:?}; \
                             not acknowledged",
                            self.id
                        ),
                    )
                })?;
        }
        Ok(())
    }
}
