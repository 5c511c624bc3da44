//! The server: its state (metadata store, chunk store, peers, caches), how
//! it opens its data directory, and the local records every operation reads
//! and writes (inodes, dentries, free space). The operations themselves are
//! in ops/ (one file per family), rename.rs, find.rs and touch.rs; the table
//! from opcode to them is dispatch.rs; calls to other servers are peers.rs.
//!
//! RocksDB reads and unsynced writes touch only the memtable and the page
//! cache (microseconds) and run inline; chunk file I/O and syncs, which wait
//! on the disk, run on tokio's blocking pool.

use crate::chunks::ChunkStore;
use crate::counter::Counter;
use crate::dentry_index::IndexedKv;
use crate::errors::{err, io_err, kv_err};
use crate::inode::{decode_dentry, encode_dentry, Inode};
use crate::locks::Locks;
use crate::seals::SealState;
use crate::space::SpaceGauge;
use crate::sync::SyncCoalescer;
use crate::{keys, RunOptions, ServerError};
use madfs_kv::{KvStore, RocksStore, WriteBatch};
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::FsStats;
use madfs_proto::{ErrorCode, Reply, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::{ClusterConfig, Pool};
use madfs_types::{dentry_server, Credentials, FileKind, FileName, InodeId, ServerId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// How long a stopping server waits for its replicas to take its last records.
const SHUTDOWN_REPLICATION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Server {
    pub(crate) id: ServerId,
    pub(crate) servers: usize,
    /// With replicas: this store was last opened in another boot of the
    /// kernel and not stopped cleanly, so a power loss may have taken
    /// writes its copies acknowledged (restart.rs `opened_after_power_loss`).
    pub(crate) after_power_loss: bool,
    /// What writes and fsyncs are answered with (restart.rs
    /// `load_write_verifier`); renewed when a held store is served after
    /// all (failover.rs `release`).
    pub(crate) write_verifier: AtomicU64,
    /// The copies this store's acknowledgements waited for when it was
    /// last served (`META_WAITED_COPIES`, read before anything rewrites
    /// it): after a power loss, the ones that may have what it lost.
    pub(crate) waited_before: Vec<ServerId>,
    pub(crate) chunk_size: u64,
    /// Free space of the data directory's file system.
    pub(crate) space: SpaceGauge,
    /// Which file system the data directory is on (`space::disk_id`).
    disk: u64,
    /// The cluster's copies of every byte (its `replicas`).
    replicas: u8,
    pub(crate) kv: Arc<dyn KvStore>,
    /// The same store, typed: find reads its in-memory copies.
    pub(crate) indexed: Arc<IndexedKv>,
    pub(crate) chunks: Arc<ChunkStore>,
    pub(crate) sync: SyncCoalescer,
    pub(crate) peers: Pool,
    pub(crate) locks: Locks,
    pub(crate) inode_counter: Counter,
    pub(crate) inode_count: AtomicU64,
    /// Permissions of directories owned by other servers, leased.
    pub(crate) dir_cache: crate::peers::DirPermCache,
    pub(crate) seals: Mutex<HashMap<InodeId, SealState>>,
    pub(crate) seal_changed: Notify,
    /// Seals lost with a restart, asked of the others (seals.rs).
    pub(crate) seal_recall: crate::seals::SealRecall,
    /// Directories whose removal every server heard: their DIR_REMOVAL
    /// records go with the next removal's batch (or the periodic sweep),
    /// not in a write of their own (ops/remove.rs).
    pub(crate) removals_done: Mutex<Vec<InodeId>>,
    /// Links being dropped on other servers, and the resender's wake-up
    /// (link_drops.rs).
    pub(crate) link_drops: crate::link_drops::LinkDrops,
    pub(crate) tx_counter: Counter,
    /// Directory times and link counts sent to other servers (touch.rs).
    pub(crate) touches: crate::touch::Touches,
    /// With replicas: the stream of this server's changes (replication.rs).
    pub(crate) replication: Option<Arc<crate::replication::Replicator>>,
    /// The store below replication: for what no replica must get (the
    /// clean-stop marker, restart.rs).
    pub(crate) unreplicated: Arc<dyn KvStore>,
    /// The copies of other servers' sets kept here (replica.rs).
    pub(crate) copies: crate::replica::ReplicaCopies,
    /// On set 0's server: the cluster's directory-move lock (dir_moves.rs).
    pub(crate) dir_moves: crate::dir_moves::DirMoveLock,
}

impl Drop for Server {
    fn drop(&mut self) {
        tracing::info!("the store of set {} is closed here", self.id);
    }
}

impl Server {
    /// Open server `id`'s store under its data directory, set up as `opts`
    /// says (dentry index budget, direct I/O).
    pub fn open(
        cfg: &ClusterConfig,
        id: ServerId,
        key: ClusterKey,
        opts: &RunOptions,
    ) -> Result<Server, ServerError> {
        let entry = cfg
            .server(id)
            .ok_or_else(|| ServerError::Config(format!("no server {id}")))?;
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| entry.data_dir.clone());
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| ServerError::Storage(format!("{}: {e}", data_dir.display())))?;
        let kv: Arc<dyn KvStore> = Arc::new(
            RocksStore::open(&data_dir.join("meta"))
                .map_err(|e| ServerError::Storage(e.to_string()))?,
        );
        tracing::info!(
            "server {id}: RocksDB from {}",
            madfs_kv::rocksdb_library().unwrap_or("?")
        );
        Self::with_store(cfg, id, key, kv, data_dir, opts)
    }

    pub fn with_store(
        cfg: &ClusterConfig,
        id: ServerId,
        key: ClusterKey,
        kv: Arc<dyn KvStore>,
        data_dir: PathBuf,
        opts: &RunOptions,
    ) -> Result<Server, ServerError> {
        let peers = Pool::new(cfg, key, Role::Peer, Timeouts::default());
        Self::with_store_and_peers(cfg, id, kv, data_dir, opts, peers)
    }

    /// `with_store`, reaching the other servers through `peers` (the
    /// simulation's in-process network, crates/sim).
    pub fn with_store_and_peers(
        cfg: &ClusterConfig,
        id: ServerId,
        kv: Arc<dyn KvStore>,
        data_dir: PathBuf,
        opts: &RunOptions,
        peers: Pool,
    ) -> Result<Server, ServerError> {
        Self::with_parts(cfg, id, kv, data_dir, opts, peers, None)
    }

    /// `with_store_and_peers`, the copies of other sets opened through
    /// `stores` where given (crates/sim), else as RocksDB directories.
    pub fn with_parts(
        cfg: &ClusterConfig,
        id: ServerId,
        kv: Arc<dyn KvStore>,
        data_dir: PathBuf,
        opts: &RunOptions,
        peers: Pool,
        stores: Option<Arc<dyn crate::injected::Stores>>,
    ) -> Result<Server, ServerError> {
        // With replicas, every change is also a record shipped to them:
        // metadata below the index (which only mirrors), chunks through
        // the store's mirror (set below).
        let replicas = match &opts.replicas {
            Some(list) => list.clone(),
            None => cfg.replica_set(id)[1..].to_vec(),
        };
        // With replicas in the cluster, always a stream: a set left with
        // one member ships to the servers that resync to it later. After a
        // clean stop, the same stream, continued (restart.rs).
        let stopped = crate::restart::take_stopped_stream(kv.as_ref())
            .map_err(|e| ServerError::Storage(e.to_string()))?;
        let copies = crate::replica::ReplicaCopies::new(
            id,
            data_dir.clone(),
            cfg.servers
                .iter()
                .map(|s| ServerId(s.id))
                // Its own set too: after a failover it catches up on it
                // as another server's replica.
                .filter(|&s| cfg.replicas > 1 && cfg.replica_set(s).contains(&id))
                .collect(),
            stores,
            Some(kv.clone()),
        );
        let boot = copies.boot();
        let lost_unsynced =
            crate::restart::opened_after_power_loss(kv.as_ref(), boot, stopped.is_some())
                .map_err(|e| ServerError::Storage(e.to_string()))?;
        let after_power_loss = lost_unsynced && cfg.replicas > 1;
        let waited_before = crate::replication::waited_copies(kv.as_ref())
            .map_err(|e| ServerError::Storage(e.to_string()))?;
        let replication = (cfg.replicas > 1 || !replicas.is_empty()).then(|| {
            Arc::new(match stopped {
                Some((stream, last)) => {
                    tracing::info!(
                        "set {id} continues its record stream after record {last} (a clean stop)"
                    );
                    crate::replication::Replicator::continuing(id, &replicas, stream, last)
                }
                None => crate::replication::Replicator::new(id, &replicas),
            })
        });
        let unreplicated = kv.clone();
        let kv: Arc<dyn KvStore> = match &replication {
            Some(r) => Arc::new(crate::replication::ReplicatedKv::new(kv, r.clone())),
            None => kv,
        };
        // Every write from here on goes through the index's wrapper.
        let indexed = Arc::new(IndexedKv::new(kv, opts.find_index_bytes));
        let kv: Arc<dyn KvStore> = indexed.clone();
        let storage = |e: madfs_kv::KvError| ServerError::Storage(e.to_string());
        let format = kv.get(keys::META_FORMAT).map_err(storage)?;
        let new_store = format.is_none();
        match format {
            None => {
                let mut b = WriteBatch::new();
                b.put(keys::META_FORMAT, &keys::FORMAT_VERSION.to_le_bytes());
                kv.write(b, true).map_err(storage)?;
            }
            Some(v) => {
                let version = v
                    .as_slice()
                    .try_into()
                    .map(u32::from_le_bytes)
                    .unwrap_or(u32::MAX);
                if version > keys::FORMAT_VERSION {
                    return Err(ServerError::Storage(format!(
                        "data dir has format {version}, this server understands up to {}",
                        keys::FORMAT_VERSION
                    )));
                }
            }
        }
        // After a power loss, a new verifier, kept from the copies (they may
        // have every write this store lost: held, members.rs `hand_over`).
        let write_verifier = if lost_unsynced {
            let v = crate::restart::renew_write_verifier(unreplicated.as_ref()).map_err(storage)?;
            tracing::warn!(
                "set {id}: its store may have lost writes it had not synced (a power loss): \
                 clients' fsyncs of writes made before fail"
            );
            v
        } else {
            crate::restart::load_write_verifier(kv.as_ref()).map_err(storage)?
        };
        // Counter 1 on server 0 is the root; start everyone above it.
        let inode_counter =
            Counter::load(kv.as_ref(), keys::META_NEXT_INODE, 16).map_err(storage)?;
        let tx_counter = Counter::load(kv.as_ref(), keys::META_NEXT_TX, 1).map_err(storage)?;
        let touches = crate::touch::Touches::load(kv.as_ref()).map_err(storage)?;
        let chunks = Arc::new(
            ChunkStore::open_cached(data_dir.join("chunks"), opts.cache_bytes)
                .map_err(|e| ServerError::Storage(e.to_string()))?,
        );
        chunks.set_direct_io(opts.direct_io);
        if let Some(r) = &replication {
            chunks.set_mirror(r.clone());
        }
        // A failed sync stops metadata writes too (sync.rs).
        let kv: Arc<dyn KvStore> = Arc::new(crate::sync::PoisonGuard::new(kv, chunks.clone()));
        let held = free_held_inodes(kv.as_ref()).map_err(storage)?;
        if held > 0 {
            tracing::info!(
                "server {id}: freed {held} unlinked inodes held open before the restart"
            );
        }
        let mut inodes = 0u64;
        let mut start = keys::INODE.to_vec();
        loop {
            let page = kv.scan(keys::INODE, &start, 10_000).map_err(storage)?;
            inodes += page.len() as u64;
            match page.last() {
                Some((k, _)) if page.len() == 10_000 => {
                    start = k.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        let server = Server {
            id,
            servers: cfg.server_count(),
            after_power_loss,
            write_verifier: AtomicU64::new(write_verifier.0),
            waited_before,
            chunk_size: cfg.chunk_size,
            disk: crate::space::disk_id(
                &data_dir,
                crate::replica::kernel_boot_id().as_ref().map(|b| &b[..]),
            ),
            replicas: cfg.replicas.max(1),
            space: SpaceGauge::new(data_dir),
            kv: kv.clone(),
            indexed,
            sync: SyncCoalescer::start(chunks.clone(), kv.clone()),
            chunks,
            peers,
            locks: Locks::default(),
            inode_counter,
            inode_count: AtomicU64::new(inodes),
            dir_cache: crate::peers::DirPermCache::from_env(),
            seals: Mutex::new(HashMap::new()),
            removals_done: Mutex::new(Vec::new()),
            link_drops: Default::default(),
            seal_changed: Notify::new(),
            seal_recall: crate::seals::SealRecall::after_start(new_store),
            tx_counter,
            touches,
            replication,
            unreplicated,
            copies,
            dir_moves: Default::default(),
        };
        let unsettled =
            crate::rename::hold_unsettled(&server).map_err(|e| ServerError::Storage(e.message))?;
        if unsettled > 0 {
            tracing::info!("server {id}: {unsettled} renames to settle, their source names held");
        }
        if id == ServerId(0)
            && server
                .load_inode(InodeId::ROOT)
                .map_err(|e| ServerError::Storage(e.message))?
                .is_none()
        {
            let creds = Credentials::current_process();
            let root = Inode::new(
                InodeId::ROOT,
                FileKind::Dir,
                0o755,
                creds.uid,
                creds.gid,
                Vec::new(),
            );
            let mut b = WriteBatch::new();
            b.put(&keys::inode(InodeId::ROOT), &root.encode());
            kv.write(b, true).map_err(storage)?;
            server.inode_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(server)
    }

    /// What this store answers writes and fsyncs with.
    pub(crate) fn write_verifier(&self) -> madfs_proto::message::WriteVerifier {
        madfs_proto::message::WriteVerifier(self.write_verifier.load(Ordering::Acquire))
    }

    /// What `Op::Fsync` answers once its sync is done (dispatch.rs, and
    /// the simulation's own fsync).
    pub fn synced_reply(&self) -> Reply {
        Reply::Synced {
            verifier: self.write_verifier(),
        }
    }

    pub(crate) fn set_write_verifier(&self, v: madfs_proto::message::WriteVerifier) {
        self.write_verifier.store(v.0, Ordering::Release);
    }

    pub async fn shutdown(&self) {
        // Nothing written after the final sync: it would be on neither
        // the disk nor the copies (touches are the one background writer
        // that runs often; their intents wait for the next start).
        self.touches
            .stopped
            .store(true, std::sync::atomic::Ordering::Release);
        if let Err(e) = self.sync.sync().await {
            tracing::warn!("final sync failed: {e}");
        }
        // A clean stop leaves the replicas with everything, the final sync
        // included, unless they are gone too.
        if let Some(r) = &self.replication {
            let last = r.last_seq();
            if tokio::time::timeout(SHUTDOWN_REPLICATION_WAIT, r.wait_replicated(last))
                .await
                .is_err()
            {
                tracing::warn!(
                    "stopping with records up to {last} not on every replica after {:?}",
                    SHUTDOWN_REPLICATION_WAIT
                );
            }
        }
        let sync = self.sync.clone();
        let _ = tokio::task::spawn_blocking(move || sync.stop()).await;
    }

    pub(crate) fn load_inode(&self, ino: InodeId) -> Result<Option<Inode>, WireError> {
        match self.kv.get(&keys::inode(ino)).map_err(kv_err)? {
            None => Ok(None),
            Some(v) => Inode::decode(&v)
                .map(Some)
                .map_err(|e| err(ErrorCode::Io, format!("corrupt inode {ino}: {e}"))),
        }
    }

    pub(crate) fn must_inode(&self, ino: InodeId) -> Result<Inode, WireError> {
        if ino.owner() != self.id {
            return Err(err(
                ErrorCode::Stale,
                format!("inode {ino} is not held by server {}", self.id),
            ));
        }
        self.load_inode(ino)?
            .ok_or_else(|| err(ErrorCode::NotFound, format!("inode {ino}")))
    }

    pub(crate) fn load_dentry(
        &self,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Option<(FileKind, InodeId)>, WireError> {
        match self.kv.get(&keys::dentry(parent, name)).map_err(kv_err)? {
            None => Ok(None),
            Some(v) => decode_dentry(&v)
                .map(Some)
                .ok_or_else(|| err(ErrorCode::Io, format!("corrupt dentry {name} in {parent}"))),
        }
    }

    pub(crate) fn put_dentry(
        b: &mut WriteBatch,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        ino: InodeId,
    ) {
        b.put(&keys::dentry(parent, name), &encode_dentry(kind, ino));
    }

    /// Refuse growth (ENOSPC) once free space would drop into the reserve
    /// (`space::reserve`).
    pub(crate) fn check_space(&self, growth: u64) -> Result<(), WireError> {
        let granted = self
            .space
            .grant(growth, crate::space::reserve)
            .map_err(io_err)?;
        granted.map_err(|reserve| {
            err(
                ErrorCode::NoSpace,
                format!("server {} keeps its last {reserve} bytes free", self.id),
            )
        })
    }

    pub(crate) fn statfs(&self) -> Result<FsStats, WireError> {
        let (total, free, avail) = self.space.measure().map_err(io_err)?;
        Ok(FsStats {
            bytes_total: total,
            bytes_free: free,
            bytes_avail: avail,
            inodes: self.inode_count.load(Ordering::Relaxed),
            data_bytes: self.chunks.bytes_used(),
            failure: self.chunks.failure(),
            rebuilds: self
                .replication
                .as_ref()
                .map(|r| r.rebuilds())
                .unwrap_or_default(),
            disk: self.disk,
            bytes_reserved: crate::space::reserve(total),
            copies: self.replicas,
        })
    }

    /// Is `name` in `parent` held by this server?
    pub(crate) fn holds_dentry(&self, parent: InodeId, name: &FileName) -> bool {
        dentry_server(parent, name, self.servers) == self.id
    }
}

/// Chunk writes this short run on the runtime thread, on the primary and
/// on a copy: they are buffered (direct I/O starts at 256 KiB), a copy
/// into the page cache of a few microseconds, less than the hand-over to
/// a blocking thread and back. ior-hard's 47,008-byte writes through
/// `madfs run` (2 ranks, 4 servers): 397-451 -> 443-478 MiB/s at R = 1
/// and 203-222 -> 224-230 at R = 2, servers' CPU 23-30% and 12-18% less
/// (docs/PERFORMANCE.md). As RocksDB's inline WAL appends, such a write
/// can stall the thread when the kernel throttles dirty pages.
pub(crate) const SMALL_WRITE_INLINE_MAX_BYTES: usize = 64 << 10;

/// Set by `run_disk_io_inline`.
static DISK_IO_INLINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Run chunk file I/O on the calling task instead of the blocking pool,
/// in every server of this process: the deterministic simulation
/// (crates/sim) needs it, since a blocking-pool thread finishes at a
/// moment the runtime's scheduler does not choose.
pub fn run_disk_io_inline(on: bool) {
    DISK_IO_INLINE.store(on, Ordering::Relaxed);
}

/// Run disk work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    if DISK_IO_INLINE.load(Ordering::Relaxed) {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(format!("disk task failed: {e}")))?
}

/// Free every inode held for a client at its last unlink (`Hold`): the
/// process that held it may be gone, and a restart forgets who held what.
/// Runs before the server serves, so a hold made after the start is never
/// taken; their chunks are purged by the orphan recovery that follows
/// (always: a writer that died may have left chunks past the size the
/// owner knows). Returns how many were freed.
fn free_held_inodes(kv: &dyn KvStore) -> Result<usize, madfs_kv::KvError> {
    let mut freed = 0;
    loop {
        let page = kv.scan(keys::HELD, keys::HELD, 10_000)?;
        if page.is_empty() {
            return Ok(freed);
        }
        let mut b = WriteBatch::new();
        for (k, _) in &page {
            b.delete(k);
            let Some(ino) = keys::ino_from_key(k) else {
                continue;
            };
            let unlinked = match kv.get(&keys::inode(ino))? {
                Some(v) => Inode::decode(&v).is_ok_and(|i| i.attr.nlink == 0),
                None => false,
            };
            if unlinked {
                b.delete(&keys::inode(ino));
                b.delete(&keys::inline_data(ino));
                b.put(&keys::orphan(ino), &[]);
                freed += 1;
            }
        }
        kv.write(b, true)?;
    }
}
