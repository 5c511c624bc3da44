//! Calls between servers: a peer call (or a direct call when the peer is
//! this server), attributes of inodes other servers own, the cache of
//! directory permissions other servers own (leased, see `DIR_LEASE`), and
//! broadcasts to every server.

use crate::errors::{err, rpc_err, BoxFuture, OpResult};
use crate::perm::{owner_of, Owner};
use crate::seals::SealState;
use crate::service::Server;
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::join::join_bounded;
use madfs_types::{Attr, Credentials, FileKind, InodeId, ServerId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused and advances it.
use tokio::time::Instant;

/// Directories whose permissions one server keeps at once.
const DIR_CACHE_MAX: usize = 100_000;
/// How long a server trusts the permissions of another server's directory
/// without asking again. The owner also sends an invalidation at chmod and
/// chown, but a lost one (a peer restarting, a dropped connection) must not
/// leave a revoked permission in force: the lease bounds how long it can.
/// A create in a directory owned elsewhere costs one GetAttr per lease.
const DIR_LEASE_DEFAULT: Duration = Duration::from_secs(2);
/// Calls a broadcast to every server keeps in flight at once.
const BROADCAST_IN_FLIGHT_MAX: usize = 64;

/// Permissions of directories other servers own, each trusted for a lease.
pub(crate) struct DirPermCache {
    entries: Mutex<HashMap<InodeId, (Owner, Instant)>>,
    lease: Duration,
    /// Test fault: ignore invalidations from owners (a lost broadcast).
    drop_invalidations: bool,
    /// Invalidations this server sent that a peer did not acknowledge.
    pub(crate) invalidations_lost: AtomicU64,
}

impl DirPermCache {
    /// A cache with the lease `MADFS_DIR_LEASE_MS` gives (default
    /// `DIR_LEASE_DEFAULT`), dropping invalidations when the test fault
    /// `MADFS_FAULT_DROP_INVALIDATIONS=1` is set.
    pub(crate) fn from_env() -> DirPermCache {
        let lease = std::env::var("MADFS_DIR_LEASE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or(DIR_LEASE_DEFAULT);
        let drop_invalidations = crate::test_fault("MADFS_FAULT_DROP_INVALIDATIONS");
        DirPermCache {
            entries: Mutex::new(HashMap::new()),
            lease,
            drop_invalidations,
            invalidations_lost: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, (Owner, Instant)>> {
        // Every mutation is one insert or remove: never half-done.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, dir: InodeId) -> Option<Owner> {
        let mut map = self.lock();
        match map.get(&dir) {
            Some(&(o, at)) if at.elapsed() < self.lease => Some(o),
            Some(_) => {
                map.remove(&dir);
                None
            }
            None => None,
        }
    }

    /// Keep `owner`, fetched at `fetched` (before the request went out, so
    /// the lease never outlives what the owner said).
    fn insert(&self, dir: InodeId, owner: Owner, fetched: Instant) {
        let mut map = self.lock();
        if map.len() >= DIR_CACHE_MAX {
            let lease = self.lease;
            map.retain(|_, (_, at)| at.elapsed() < lease);
            if map.len() >= DIR_CACHE_MAX {
                map.clear();
            }
        }
        map.insert(dir, (owner, fetched));
    }

    /// The owner says `dir` changed (or is gone).
    pub(crate) fn invalidate(&self, dir: InodeId) {
        if !self.drop_invalidations {
            self.lock().remove(&dir);
        }
    }

    /// Forget `dir` whatever the test fault says (this server removed it).
    pub(crate) fn forget(&self, dir: InodeId) {
        self.lock().remove(&dir);
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }
}

impl Server {
    /// Call another server (or this one, directly) as a peer.
    pub(crate) fn call_peer(
        &self,
        server: ServerId,
        op: Op,
    ) -> BoxFuture<'_, Result<Reply, WireError>> {
        Box::pin(async move {
            if server == self.id {
                return self.local_peer_op(op).await.map(|(r, _)| r);
            }
            let once = op
                .runs_once()
                .then(|| madfs_proto::RunOnce::first(madfs_types::next_op_id()));
            self.call_remote_peer(server, op, once).await
        })
    }

    /// Call another server as a peer with a request id of the caller's
    /// (a request sent again after a failure, with the id of its first
    /// send: link_drops.rs).
    pub(crate) async fn call_peer_once(
        &self,
        server: ServerId,
        op: Op,
        once: madfs_proto::RunOnce,
    ) -> Result<Reply, WireError> {
        assert!(
            op.runs_once(),
            "an id for {:?}, which does not run once",
            op.opcode()
        );
        if server == self.id {
            return Err(err(
                ErrorCode::Io,
                format!("a request with an id sent by server {} to itself", self.id),
            ));
        }
        self.call_remote_peer(server, op, Some(once)).await
    }

    async fn call_remote_peer(
        &self,
        server: ServerId,
        op: Op,
        once: Option<madfs_proto::RunOnce>,
    ) -> Result<Reply, WireError> {
        let req = Request {
            creds: Credentials::root(),
            op,
            once,
        };
        self.peers
            .call(server, &req, &[])
            .await
            .map(|r| r.reply)
            .map_err(rpc_err)
    }

    /// Peer operations this server can run for itself without the network.
    pub(crate) async fn local_peer_op(&self, op: Op) -> OpResult {
        match op {
            Op::Seal {
                dir,
                parent,
                name,
                action,
                seal,
            } => self.seal(dir, parent, name, action, seal).await,
            Op::ReportSeals { dir } => self.report_seals(dir),
            Op::PurgeChunks { ino } => self.purge_local(ino).await,
            Op::ChunkExtent { ino, first, last } => self.chunk_extent_local(ino, first, last).await,
            Op::InvalidateDir { dir } => {
                self.dir_cache.invalidate(dir);
                Ok((Reply::Empty, Vec::new()))
            }
            Op::GetAttr { ino, .. } => Ok((Reply::Attr(self.must_inode(ino)?.attr), Vec::new())),
            Op::DirMoveSettled { token } => Ok((self.dir_move_settled(token)?, Vec::new())),
            other => Err(err(
                ErrorCode::Protocol,
                format!("{:?} is not a local peer op", other.opcode()),
            )),
        }
    }

    /// Attributes of any inode, from its owner.
    pub(crate) async fn attr_of(&self, ino: InodeId) -> Result<Attr, WireError> {
        if ino.owner() == self.id {
            return Ok(self.must_inode(ino)?.attr);
        }
        let op = Op::GetAttr { ino, after: vec![] };
        match self.call_peer(ino.owner(), op).await? {
            Reply::Attr(a) => Ok(a),
            other => Err(err(
                ErrorCode::Protocol,
                format!("GetAttr answered {other:?}"),
            )),
        }
    }

    /// Permission bits of directory `dir`, wherever it lives. ENOENT if it
    /// is gone, ENOTDIR if it is not a directory.
    pub(crate) async fn dir_owner(&self, dir: InodeId) -> Result<Owner, WireError> {
        if matches!(self.seal_state(dir), Some(SealState::Removed)) {
            return Err(err(
                ErrorCode::NotFound,
                format!("directory {dir} was removed"),
            ));
        }
        let owner = if dir.owner() == self.id {
            owner_of(&self.must_inode(dir)?.attr)
        } else {
            match self.dir_cache.get(dir) {
                Some(o) => o,
                None => {
                    let fetched = Instant::now();
                    let o = owner_of(&self.attr_of(dir).await?);
                    if o.kind == FileKind::Dir {
                        self.dir_cache.insert(dir, o, fetched);
                    }
                    o
                }
            }
        };
        if owner.kind != FileKind::Dir {
            return Err(err(
                ErrorCode::NotDir,
                format!("inode {dir} is not a directory"),
            ));
        }
        Ok(owner)
    }

    /// Send `op` to every server (this one directly), a bounded number at
    /// once, and return each server's answer.
    pub(crate) async fn broadcast(&self, op: Op) -> Vec<(ServerId, Result<Reply, WireError>)> {
        let futs: Vec<_> = self
            .peers
            .servers()
            .map(|s| {
                let op = op.clone();
                async move { (s, self.call_peer(s, op).await) }
            })
            .collect();
        join_bounded(futs, BROADCAST_IN_FLIGHT_MAX).await
    }

    /// `broadcast`, each server given at most `limit` to answer (a server
    /// that did not is answered TimedOut here, and may still act on it).
    pub(crate) async fn broadcast_within(
        &self,
        op: Op,
        limit: Duration,
    ) -> Vec<(ServerId, Result<Reply, WireError>)> {
        let futs: Vec<_> = self
            .peers
            .servers()
            .map(|s| {
                let op = op.clone();
                async move {
                    let answer = tokio::time::timeout(limit, self.call_peer(s, op))
                        .await
                        .unwrap_or_else(|_| {
                            Err(WireError::new(
                                ErrorCode::TimedOut,
                                format!("server {s} did not answer within {limit:?}"),
                            ))
                        });
                    (s, answer)
                }
            })
            .collect();
        join_bounded(futs, BROADCAST_IN_FLIGHT_MAX).await
    }

    /// Tell every server that directory `dir`'s permissions changed. Waits
    /// at most one lease: by then every cached copy has expired anyway, so
    /// a dead or slow peer cannot hold up a chmod. Failures are logged and
    /// counted; the lease bounds how long a peer that missed it can allow
    /// what the change forbade.
    pub(crate) async fn invalidate_dir_everywhere(&self, dir: InodeId) {
        let lease = self.dir_cache.lease();
        let lost =
            match tokio::time::timeout(lease, self.broadcast(Op::InvalidateDir { dir })).await {
                Ok(answers) => answers
                    .into_iter()
                    .filter_map(|(s, r)| r.err().map(|e| (s, e)))
                    .inspect(|(s, e)| {
                        tracing::warn!("invalidation of directory {dir} on server {s} failed: {e}")
                    })
                    .count(),
                Err(_) => {
                    tracing::warn!(
                    "invalidation of directory {dir} not answered by every server within {lease:?}"
                );
                    1
                }
            };
        self.dir_cache
            .invalidations_lost
            .fetch_add(lost as u64, Ordering::Relaxed);
    }
}
