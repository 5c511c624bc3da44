//! Request handling: every operation a server performs on its shard, and the
//! peer traffic (directory attributes, seals, link counts) that operations
//! spanning servers need. Cross-server rename lives in rename.rs.
//!
//! RocksDB reads and unsynced writes touch only the memtable and the page
//! cache (microseconds) and run inline; chunk file I/O and syncs, which wait
//! on the disk, run on tokio's blocking pool.

use crate::chunks::ChunkStore;
use crate::counter::Counter;
use crate::dentry_index::IndexedKv;
use crate::inode::{decode_dentry, encode_dentry, Inode};
use crate::locks::{LockKey, Locks};
use crate::perm::{self, Owner};
use crate::space::SpaceGauge;
use crate::sync::SyncCoalescer;
use crate::touch::DirChanges;
use crate::{keys, RunOptions, ServerError};
use madfs_kv::{KvStore, RocksStore, WriteBatch};
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{DirEntry, Entry, FsStats, Hold, Op, Reply, SealAction, SetAttrs};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::serve::{CallContext, Handler};
use madfs_rpc::{log_info, log_warn, ClusterConfig, Pool, RpcError};
use madfs_types::{
    dentry_server, limits, Attr, ChunkIndex, Credentials, FileKind, FileName, InodeId, ServerId,
    TimeSet, Timestamp,
};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused and advances it.
use tokio::sync::Notify;
use tokio::time::Instant;

pub(crate) type OpResult = Result<(Reply, Vec<u8>), WireError>;
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A seal that its rmdir never lifted expires (the rmdir's server died).
const SEAL_LEASE: Duration = Duration::from_secs(30);
const DIR_CACHE_MAX: usize = 100_000;
/// Free space kept back from operations that grow the store: RocksDB needs
/// room to roll its log and flush memtables (up to its 64 MiB memtable
/// budget), and removals must keep working on a full disk. Without it,
/// RocksDB itself hits ENOSPC and refuses every later write until restart.
const SPACE_RESERVE_MAX_BYTES: u64 = 64 << 20;
const SEALS_MAX: usize = 100_000;
/// Reads served from the chunk cache on the runtime thread at most this
/// long (a copy of about 0.4 ms); longer ones copy on the blocking pool.
const CACHED_READ_INLINE_MAX_BYTES: u32 = 4 << 20;

/// How long a purge of freed chunks keeps asking servers it cannot reach.
const PURGE_RETRY_FOR: Duration = Duration::from_secs(600);

pub(crate) fn err(code: ErrorCode, msg: impl Into<String>) -> WireError {
    WireError::new(code, msg)
}

pub(crate) fn kv_err(e: madfs_kv::KvError) -> WireError {
    let code = if e.is_no_space() {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    err(code, format!("metadata store: {e}"))
}

fn io_err(e: std::io::Error) -> WireError {
    WireError::new(ErrorCode::from_io(&e), format!("chunk store: {e}"))
}

pub(crate) fn rpc_err(e: RpcError) -> WireError {
    match e {
        RpcError::Remote(w) => w,
        other => err(other.code(), other.to_string()),
    }
}

#[derive(Clone, Copy, Debug)]
enum SealState {
    Sealed(Instant),
    Removed,
}

pub struct Server {
    pub(crate) id: ServerId,
    pub(crate) servers: usize,
    pub(crate) chunk_size: u64,
    /// Free space of the data directory's file system.
    space: SpaceGauge,
    pub(crate) kv: Arc<dyn KvStore>,
    /// The same store, typed: find reads its in-memory copies.
    indexed: Arc<IndexedKv>,
    chunks: Arc<ChunkStore>,
    sync: SyncCoalescer,
    pub(crate) peers: Pool,
    pub(crate) locks: Locks,
    inode_counter: Counter,
    inode_count: AtomicU64,
    /// Attributes of directories owned by other servers, for permission
    /// checks; invalidated by the owner when they change.
    dir_cache: Mutex<HashMap<InodeId, Owner>>,
    seals: Mutex<HashMap<InodeId, SealState>>,
    seal_changed: Notify,
    pub(crate) tx_counter: Counter,
    /// Directory times and link counts sent to other servers (touch.rs).
    pub(crate) touches: crate::touch::Touches,
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
        let data_dir = entry.data_dir.clone();
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| ServerError::Storage(format!("{}: {e}", data_dir.display())))?;
        let kv: Arc<dyn KvStore> = Arc::new(
            RocksStore::open(&data_dir.join("meta"))
                .map_err(|e| ServerError::Storage(e.to_string()))?,
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
        // Every write from here on goes through the index's wrapper.
        let indexed = Arc::new(IndexedKv::new(kv, opts.find_index_bytes));
        let kv: Arc<dyn KvStore> = indexed.clone();
        let storage = |e: madfs_kv::KvError| ServerError::Storage(e.to_string());
        match kv.get(keys::META_FORMAT).map_err(storage)? {
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
        let held = free_held_inodes(kv.as_ref()).map_err(storage)?;
        if held > 0 {
            log_info!("server {id}: freed {held} unlinked inodes held open before the restart");
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
            chunk_size: cfg.chunk_size,
            space: SpaceGauge::new(data_dir),
            kv: kv.clone(),
            indexed,
            sync: SyncCoalescer::start(chunks.clone(), kv.clone()),
            chunks,
            peers,
            locks: Locks::default(),
            inode_counter,
            inode_count: AtomicU64::new(inodes),
            dir_cache: Mutex::new(HashMap::new()),
            seals: Mutex::new(HashMap::new()),
            seal_changed: Notify::new(),
            tx_counter,
            touches,
        };
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

    /// Background work: finish renames and chunk purges a crash interrupted.
    pub fn start_background(self: Arc<Self>) {
        tokio::spawn(async move {
            crate::rename::recover(&self).await;
            self.recover_orphans().await;
        });
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.sync.sync().await {
            log_warn!("final sync failed: {e}");
        }
        let sync = self.sync.clone();
        let _ = tokio::task::spawn_blocking(move || sync.stop()).await;
    }

    // ---- local records ----------------------------------------------------

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

    fn alloc_ino(&self) -> Result<InodeId, WireError> {
        let n = self.inode_counter.next(self.kv.as_ref()).map_err(kv_err)?;
        if n > (1u64 << 48) - 2 {
            return Err(err(
                ErrorCode::NoSpace,
                "inode numbers exhausted on this server",
            ));
        }
        Ok(InodeId::new(self.id, n))
    }

    /// Put the records that drop one link of `inode` into `b`; returns the
    /// new link count (0: freed; the caller then runs `after_free`).
    pub(crate) fn unlink_inode(&self, b: &mut WriteBatch, inode: &mut Inode, delta: i32) -> u32 {
        self.unlink_inode_holding(b, inode, delta, false).0
    }

    /// `unlink_inode`, for a removal whose client holds the inode open
    /// (`hold`): a regular file losing its last link is kept, link count
    /// 0, with a HELD record, until that client's `Op::Release` (or this
    /// server's next start). Returns the new link count and whether it was
    /// held (then the caller does not run `after_free`).
    pub(crate) fn unlink_inode_holding(
        &self,
        b: &mut WriteBatch,
        inode: &mut Inode,
        delta: i32,
        hold: bool,
    ) -> (u32, bool) {
        let ino = inode.attr.ino;
        let last = (inode.attr.kind == FileKind::Dir && delta < 0)
            || inode.attr.nlink as i64 + delta as i64 <= 0;
        if hold && last && inode.attr.kind == FileKind::File && inode.attr.nlink > 0 {
            inode.attr.nlink = 0;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            b.put(&keys::held(ino), &now.to_le_bytes());
            return (0, true);
        }
        let nlink = if inode.attr.kind == FileKind::Dir && delta < 0 {
            0 // a directory has exactly one name
        } else {
            (inode.attr.nlink as i64 + delta as i64).max(0) as u32
        };
        if nlink == 0 {
            if inode.attr.kind == FileKind::Dir {
                self.forget_touches(b, ino);
            }
            b.delete(&keys::inode(ino));
            b.delete(&keys::inline_data(ino));
            if inode.may_have_chunk_files(self.chunk_size) {
                b.put(&keys::orphan(ino), &[]);
            }
        } else {
            inode.attr.nlink = nlink;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
        }
        (nlink, false)
    }

    /// `Op::Release`: the client that held `ino` at its last unlink closed
    /// it. Free it and purge its chunks everywhere (unconditionally: the
    /// size the owner knows may not cover every chunk a writer left).
    /// Anything else (not held, gone, linked again) is left alone.
    async fn release_held(self: &Arc<Self>, ino: InodeId) -> Result<Reply, WireError> {
        if ino.owner() != self.id {
            return Err(err(
                ErrorCode::Stale,
                format!("inode {ino} is not held by server {}", self.id),
            ));
        }
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await;
        if self.kv.get(&keys::held(ino)).map_err(kv_err)?.is_none() {
            return Ok(Reply::Empty);
        }
        let mut b = WriteBatch::new();
        b.delete(&keys::held(ino));
        let freed = match self.load_inode(ino)? {
            Some(mut inode) if inode.attr.nlink == 0 => {
                self.unlink_inode(&mut b, &mut inode, -1);
                inode.chunk0_in_file = true; // purge whatever was written
                b.put(&keys::orphan(ino), &[]);
                Some(inode)
            }
            _ => None,
        };
        self.kv.write(b, false).map_err(kv_err)?;
        if let Some(inode) = &freed {
            self.after_free(inode);
        }
        Ok(Reply::Empty)
    }

    /// After a freed inode's records are written: count it, and purge its
    /// chunks on every server in the background.
    pub(crate) fn after_free(self: &Arc<Self>, inode: &Inode) {
        self.inode_count.fetch_sub(1, Ordering::Relaxed);
        if inode.may_have_chunk_files(self.chunk_size) {
            let me = self.clone();
            let ino = inode.attr.ino;
            tokio::spawn(async move { me.purge_everywhere(vec![ino]).await });
        }
    }

    /// Drop the chunk files of freed inodes on every server, then their
    /// ORPH records. A server that cannot be reached (restarting, say) is
    /// asked again with backoff for `PURGE_RETRY_FOR`; what is still left
    /// then keeps its ORPH record and is purged at this server's next start.
    async fn purge_everywhere(&self, inos: Vec<InodeId>) {
        let all: Vec<ServerId> = self.peers.servers().collect();
        let mut pending: Vec<(InodeId, Vec<ServerId>)> =
            inos.into_iter().map(|ino| (ino, all.clone())).collect();
        let deadline = Instant::now() + PURGE_RETRY_FOR;
        let mut delay = Duration::from_millis(100);
        let mut round = 0u32;
        loop {
            let mut left = Vec::new();
            for (ino, servers) in pending {
                let mut failed = Vec::new();
                for s in servers {
                    if let Err(e) = self.call_peer(s, Op::PurgeChunks { ino }).await {
                        if round == 0 {
                            log_warn!("purging chunks of {ino} on server {s}: {e} (retrying)");
                        }
                        failed.push(s);
                    }
                }
                if failed.is_empty() {
                    let mut b = WriteBatch::new();
                    b.delete(&keys::orphan(ino));
                    if let Err(e) = self.kv.write(b, false) {
                        log_warn!("clearing orphan {ino}: {e}");
                    }
                } else {
                    left.push((ino, failed));
                }
            }
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                log_warn!(
                    "{} freed inodes keep chunk files on unreachable servers; \
                     purged at this server's next start",
                    left.len()
                );
                return;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            round += 1;
            pending = left;
        }
    }

    async fn recover_orphans(&self) {
        let Ok(list) = self.kv.scan(keys::ORPHAN, keys::ORPHAN, 100_000) else {
            return;
        };
        let inos = list
            .iter()
            .filter_map(|(k, _)| keys::ino_from_key(k))
            .collect();
        self.purge_everywhere(inos).await;
    }

    // ---- peers ------------------------------------------------------------

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
            let req = Request {
                creds: Credentials::root(),
                op,
            };
            self.peers
                .call(server, &req, &[])
                .await
                .map(|r| r.reply)
                .map_err(rpc_err)
        })
    }

    /// Peer operations this server can run for itself without the network.
    async fn local_peer_op(&self, op: Op) -> OpResult {
        match op {
            Op::Seal { dir, action } => self.seal(dir, action).await,
            Op::PurgeChunks { ino } => self.purge_local(ino).await,
            Op::InvalidateDir { dir } => {
                self.dir_cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&dir);
                Ok((Reply::Empty, Vec::new()))
            }
            Op::GetAttr { ino } => Ok((Reply::Attr(self.must_inode(ino)?.attr), Vec::new())),
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
        match self.call_peer(ino.owner(), Op::GetAttr { ino }).await? {
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
            let a = self.must_inode(dir)?.attr;
            Owner {
                kind: a.kind,
                perm: a.perm,
                uid: a.uid,
                gid: a.gid,
            }
        } else {
            let cached = self
                .dir_cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&dir)
                .copied();
            match cached {
                Some(o) => o,
                None => {
                    let a = self.attr_of(dir).await?;
                    let o = Owner {
                        kind: a.kind,
                        perm: a.perm,
                        uid: a.uid,
                        gid: a.gid,
                    };
                    if a.kind == FileKind::Dir {
                        let mut c = self.dir_cache.lock().unwrap_or_else(|e| e.into_inner());
                        if c.len() >= DIR_CACHE_MAX {
                            c.clear();
                        }
                        c.insert(dir, o);
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

    async fn broadcast(&self, op: Op) -> Vec<(ServerId, Result<Reply, WireError>)> {
        let futs = self.peers.servers().map(|s| {
            let op = op.clone();
            async move { (s, self.call_peer(s, op).await) }
        });
        join_all(futs).await
    }

    // ---- seals (rmdir) ----------------------------------------------------

    fn seal_state(&self, dir: InodeId) -> Option<SealState> {
        let seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
        match seals.get(&dir) {
            Some(SealState::Sealed(until)) if *until <= Instant::now() => None,
            other => other.copied(),
        }
    }

    /// Wait while an rmdir of `dir` is deciding; ENOENT once it is removed.
    pub(crate) async fn wait_unsealed(&self, dir: InodeId) -> Result<(), WireError> {
        loop {
            let notified = self.seal_changed.notified();
            match self.seal_state(dir) {
                None => return Ok(()),
                Some(SealState::Removed) => {
                    return Err(err(
                        ErrorCode::NotFound,
                        format!("directory {dir} was removed"),
                    ))
                }
                Some(SealState::Sealed(until)) => {
                    let left = until.saturating_duration_since(Instant::now());
                    let _ = tokio::time::timeout(left, notified).await;
                }
            }
        }
    }

    async fn seal(&self, dir: InodeId, action: SealAction) -> OpResult {
        match action {
            SealAction::Seal => {
                // Exclusive gate: no create into `dir` is between its check
                // and its write while we look.
                let _gate = self.locks.gate(dir).write().await;
                self.seals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(dir, SealState::Sealed(Instant::now() + SEAL_LEASE));
                let prefix = keys::dentry_prefix(dir);
                let empty = self
                    .kv
                    .scan(&prefix, &prefix, 1)
                    .map_err(kv_err)?
                    .is_empty();
                if empty {
                    // The removals that emptied it must outlive a power
                    // cut before the directory goes, or they come back
                    // into a directory that does not exist.
                    let kv = self.kv.clone();
                    blocking(move || kv.sync_wal().map_err(std::io::Error::other))
                        .await
                        .map_err(io_err)?;
                }
                Ok((Reply::Sealed { empty }, Vec::new()))
            }
            SealAction::Unseal => {
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(seals.get(&dir), Some(SealState::Sealed(_))) {
                    seals.remove(&dir);
                }
                drop(seals);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
            SealAction::Removed => {
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if seals.len() >= SEALS_MAX {
                    // The owner's records answer for forgotten tombstones.
                    seals.retain(|_, s| matches!(s, SealState::Sealed(_)));
                }
                seals.insert(dir, SealState::Removed);
                drop(seals);
                self.dir_cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&dir);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
        }
    }

    /// Seal `dir` on every server; Ok if it is empty everywhere, else the
    /// seals are lifted again and the error says why.
    pub(crate) async fn seal_empty_dir(&self, dir: InodeId) -> Result<(), WireError> {
        let results = self
            .broadcast(Op::Seal {
                dir,
                action: SealAction::Seal,
            })
            .await;
        let mut failure = None;
        for (s, r) in results {
            match r {
                Ok(Reply::Sealed { empty: true }) => {}
                Ok(_) => {
                    failure.get_or_insert(err(ErrorCode::NotEmpty, ""));
                }
                Err(e) => {
                    failure.get_or_insert(err(
                        e.code,
                        format!("sealing on server {s}: {}", e.message),
                    ));
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => {
                self.unseal(dir).await;
                Err(e)
            }
        }
    }

    pub(crate) async fn unseal(&self, dir: InodeId) {
        self.broadcast(Op::Seal {
            dir,
            action: SealAction::Unseal,
        })
        .await;
    }

    pub(crate) async fn announce_removed(&self, dir: InodeId) {
        for (s, r) in self
            .broadcast(Op::Seal {
                dir,
                action: SealAction::Removed,
            })
            .await
        {
            if let Err(e) = r {
                log_warn!("telling server {s} that directory {dir} is gone: {e}");
            }
        }
    }

    // ---- operations -------------------------------------------------------

    pub(crate) async fn dispatch(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> OpResult {
        let c = &req.creds;
        let ok = |r: Reply| Ok((r, Vec::new()));
        match req.op {
            Op::Lookup { parent, name } => ok(self.lookup(c, parent, &name).await?),
            Op::Open {
                parent,
                name,
                data_max,
            } => self.open_lookup(c, parent, &name, data_max).await,
            Op::GetAttr { ino } => ok(Reply::Attr(self.must_inode(ino)?.attr)),
            Op::SetAttr { ino, changes } => ok(Reply::Attr(self.setattr(c, ino, changes).await?)),
            Op::Create {
                parent,
                name,
                kind,
                perm,
                exclusive,
                symlink_target,
            } => {
                if kind.is_special() {
                    return Err(err(
                        ErrorCode::InvalidArgument,
                        "special files come by Mknod",
                    ));
                }
                ok(self
                    .create(
                        c,
                        parent,
                        &name,
                        kind,
                        perm,
                        exclusive,
                        symlink_target,
                        data,
                        0,
                    )
                    .await?)
            }
            Op::Mknod {
                parent,
                name,
                kind,
                perm,
                rdev,
            } => ok(self.mknod(c, parent, &name, kind, perm, rdev).await?),
            Op::Remove {
                parent,
                name,
                dir,
                hold,
            } => ok(retry_races(|| self.remove(c, parent, &name, dir, &hold)).await?),
            Op::Release { ino } => ok(self.release_held(ino).await?),
            Op::Access { ino, mask } => {
                let inode = self.must_inode(ino)?;
                perm::check(&owner_of(&inode.attr), c, mask)?;
                ok(Reply::Attr(inode.attr))
            }
            Op::Read {
                ino,
                chunk,
                offset,
                len,
            } => self.read(ino, chunk, offset, len).await,
            Op::Write {
                ino,
                chunk,
                offset,
                file_size,
            } => ok(self.write(ino, chunk, offset, file_size, data).await?),
            Op::UpdateSize { ino, size, mtime } => {
                ok(Reply::Attr(self.update_size(ino, size, mtime).await?))
            }
            Op::Fsync => {
                self.sync.sync().await.map_err(|e| err(ErrorCode::Io, e))?;
                ok(Reply::Empty)
            }
            Op::ReadDir {
                dir,
                after,
                max_entries,
            } => ok(self.readdir(c, dir, after, max_entries).await?),
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                flags,
                hold,
            } => {
                let held = retry_races(|| {
                    crate::rename::rename(
                        self, c, src_parent, &src_name, dst_parent, &dst_name, flags, &hold,
                    )
                })
                .await?;
                // A replaced target held for the client: it must release it.
                ok(match held {
                    Some((ino, kind)) => Reply::Removed {
                        ino,
                        kind,
                        held: true,
                    },
                    None => Reply::Empty,
                })
            }
            Op::Link { ino, parent, name } => ok(self.link(c, ino, parent, &name).await?),
            Op::ReadLink { ino } => {
                let inode = self.must_inode(ino)?;
                if inode.attr.kind != FileKind::Symlink {
                    return Err(err(ErrorCode::InvalidArgument, "not a symlink"));
                }
                ok(Reply::Target(inode.target))
            }
            Op::TruncateChunks { ino, size } => {
                let (chunks, cs) = (self.chunks.clone(), self.chunk_size);
                blocking(move || chunks.truncate(ino, size, cs))
                    .await
                    .map_err(io_err)?;
                ok(Reply::Empty)
            }
            Op::StatFs => ok(Reply::FsStats(self.statfs()?)),
            Op::Find {
                query,
                after,
                max_entries,
            } => {
                let (kv, id) = (self.indexed.clone(), self.id);
                let page = tokio::task::spawn_blocking(move || {
                    crate::find::find_page(kv, id, &query, after, max_entries)
                })
                .await
                .map_err(|e| err(ErrorCode::Io, format!("find task failed: {e}")))??;
                ok(page)
            }
            Op::AdjustLinks { ino, delta, hold } => ok(self.adjust_links(ino, delta, hold).await?),
            Op::RenameInstall {
                tx,
                coordinator,
                dst_parent,
                dst_name,
                ino,
                kind,
                noreplace,
                hold,
            } => {
                let (replaced, held) = crate::rename::install(
                    self,
                    tx,
                    coordinator,
                    dst_parent,
                    &dst_name,
                    ino,
                    kind,
                    noreplace,
                    &hold,
                )
                .await?;
                ok(Reply::Installed { replaced, held })
            }
            Op::RenameResolve {
                tx,
                coordinator,
                forget,
            } => ok(Reply::Resolved {
                installed: crate::rename::resolve(self, tx, coordinator, forget)?,
            }),
            Op::TouchDir {
                dir,
                sender,
                seq,
                time,
                nlink_delta,
            } => {
                debug_assert_eq!(ctx.role, Role::Peer);
                ok(self
                    .apply_touch(dir, sender, seq, time, nlink_delta)
                    .await?)
            }
            op @ (Op::Seal { .. } | Op::PurgeChunks { .. } | Op::InvalidateDir { .. }) => {
                debug_assert_eq!(ctx.role, Role::Peer);
                self.local_peer_op(op).await
            }
        }
    }

    async fn lookup(
        &self,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Reply, WireError> {
        let dir = self.dir_owner(parent).await?;
        perm::check(&dir, c, perm::EXEC)?;
        let (kind, ino) = self
            .load_dentry(parent, name)?
            .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
        let attr = if ino.owner() == self.id {
            self.load_inode(ino)?.map(|i| i.attr)
        } else {
            None
        };
        Ok(Reply::Entry(Entry { ino, kind, attr }))
    }

    /// `lookup`, with the bytes of a small inline file along (see
    /// `Op::Open`): exactly its size in bytes, or none.
    async fn open_lookup(
        &self,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        data_max: u32,
    ) -> OpResult {
        let reply = self.lookup(c, parent, name).await?;
        let Reply::Entry(Entry {
            attr: Some(attr), ..
        }) = &reply
        else {
            return Ok((reply, Vec::new()));
        };
        let limit = (data_max as u64)
            .min(limits::INLINE_DATA_MAX_BYTES)
            .min(self.chunk_size);
        if attr.kind != FileKind::File || attr.size == 0 || attr.size > limit {
            return Ok((reply, Vec::new()));
        }
        let ino = attr.ino;
        let mut data = self
            .kv
            .get(&keys::inline_data(ino))
            .map_err(kv_err)?
            .unwrap_or_default();
        // The attributes and the bytes must describe one version of the
        // file. A write to chunk 0 changes both (size or mtime, and the
        // bytes) in one batch, and a later read sees every batch an earlier
        // one saw: if the record read after the bytes still matches the
        // one the lookup read before them, no write came between.
        match self.load_inode(ino)? {
            Some(now) if !now.chunk0_in_file && now.attr == *attr => {}
            _ => return Ok((reply, Vec::new())),
        }
        // Bytes past the stored ones (a truncate that extended) are zeros.
        data.resize(attr.size as usize, 0);
        Ok((reply, data))
    }

    /// mknod(2): a FIFO, socket, device node or regular file that must
    /// not exist yet.
    async fn mknod(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm_bits: u32,
        rdev: u32,
    ) -> Result<Reply, WireError> {
        if !kind.is_special() && kind != FileKind::File {
            return Err(err(
                ErrorCode::InvalidArgument,
                "mknod makes FIFOs, sockets, devices and regular files",
            ));
        }
        if kind.is_device() && c.uid != 0 {
            // Linux asks CAP_MKNOD; root is the only one here.
            return Err(err(
                ErrorCode::NotPermitted,
                "only root may make device nodes",
            ));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        self.create(
            c,
            parent,
            name,
            kind,
            perm_bits,
            true,
            Vec::new(),
            Vec::new(),
            rdev,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm_bits: u32,
        exclusive: bool,
        target: Vec<u8>,
        data: Vec<u8>,
        rdev: u32,
    ) -> Result<Reply, WireError> {
        if !data.is_empty() {
            if kind != FileKind::File || !exclusive {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    "only an exclusive create of a regular file carries data",
                ));
            }
            if data.len() as u64 > limits::INLINE_DATA_MAX_BYTES {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    "data with a create is at most the inline limit (64 KiB)",
                ));
            }
        }
        if kind == FileKind::Symlink
            && (target.is_empty() || target.len() > limits::SYMLINK_MAX_BYTES)
        {
            return Err(err(
                ErrorCode::InvalidArgument,
                "symlink target must be 1 to 4095 bytes",
            ));
        }
        self.wait_unsealed(parent).await?;
        let gate = self.locks.gate(parent).read().await;
        self.wait_unsealed(parent).await?;
        let dir = self.dir_owner(parent).await?;
        let changes = DirChanges::one(parent, i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(parent, name)];
        lock_keys.extend(changes.local_keys(self.id));
        let g = self.locks.lock(&lock_keys).await;
        if let Some((ekind, eino)) = self.load_dentry(parent, name)? {
            perm::check(&dir, c, perm::EXEC)?;
            if exclusive || kind != FileKind::File {
                return Err(err(ErrorCode::Exists, ""));
            }
            if ekind == FileKind::Dir {
                return Err(err(ErrorCode::IsDir, ""));
            }
            let attr = if eino.owner() == self.id {
                self.load_inode(eino)?.map(|i| i.attr)
            } else {
                None
            };
            return Ok(Reply::Created {
                entry: Entry {
                    ino: eino,
                    kind: ekind,
                    attr,
                },
                created: false,
            });
        }
        perm::check_dir_write(&dir, c)?;
        self.check_space(data.len() as u64)?;
        let ino = self.alloc_ino()?;
        // setgid directories pass their group (and, to subdirectories, the bit) on.
        let (gid, mut bits) = if dir.perm & 0o2000 != 0 {
            (
                dir.gid,
                if kind == FileKind::Dir {
                    perm_bits | 0o2000
                } else {
                    perm_bits
                },
            )
        } else {
            (c.gid, perm_bits)
        };
        if kind == FileKind::Symlink {
            bits = 0o777;
        }
        let mut inode = Inode::new(ino, kind, bits, c.uid, gid, target);
        inode.attr.rdev = rdev;
        let mut b = WriteBatch::new();
        if !data.is_empty() {
            // The inode is ours (we allocated it), so chunk 0 is too.
            inode.attr.size = data.len() as u64;
            b.put(&keys::inline_data(ino), &data);
        }
        b.put(&keys::inode(ino), &inode.encode());
        Self::put_dentry(&mut b, parent, name, kind, ino);
        let now = inode.attr.ctime;
        self.touch_local(&mut b, &changes, now)?;
        // Other servers may put entries into a new directory at once: it
        // must outlive a power cut first, or they outlive it.
        self.kv.write(b, kind == FileKind::Dir).map_err(kv_err)?;
        drop(g);
        drop(gate);
        self.inode_count.fetch_add(1, Ordering::Relaxed);
        self.touch_remote(&changes, now).await;
        Ok(Reply::Created {
            entry: Entry {
                ino,
                kind,
                attr: Some(inode.attr),
            },
            created: true,
        })
    }

    async fn remove(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        want_dir: bool,
        hold: &Hold,
    ) -> Result<Reply, WireError> {
        let dir = self.dir_owner(parent).await?;
        perm::check_dir_write(&dir, c)?;
        let (kind, ino) = self
            .load_dentry(parent, name)?
            .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
        if want_dir && kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, ""));
        }
        if !want_dir && kind == FileKind::Dir {
            return Err(err(ErrorCode::IsDir, ""));
        }
        if dir.perm & 0o1000 != 0 {
            let victim = self.attr_of(ino).await?;
            perm::check_sticky(&dir, victim.uid, c)?;
        }
        if want_dir {
            // Seal first, with no lock held: sealing takes the directory's
            // gate, which creators take before their dentry locks.
            self.seal_empty_dir(ino).await?;
        }
        let changes = DirChanges::one(parent, -i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(parent, name), LockKey::Inode(ino)];
        lock_keys.extend(changes.local_keys(self.id));
        let guard = self.locks.lock(&lock_keys).await;
        let now = self.load_dentry(parent, name)?;
        if now != Some((kind, ino)) {
            drop(guard);
            if want_dir {
                self.unseal(ino).await;
            }
            // Gone: a racing unlink won. Replaced: look again from the top.
            return Err(match now {
                None => err(ErrorCode::NotFound, ""),
                Some(_) => err(ErrorCode::TryAgain, "the entry changed during removal"),
            });
        }
        let mut b = WriteBatch::new();
        b.delete(&keys::dentry(parent, name));
        let mut freed = None;
        let hold = !want_dir && hold.covers(ino);
        let mut held = false;
        if ino.owner() == self.id {
            if let Some(mut inode) = self.load_inode(ino)? {
                let nlink;
                (nlink, held) = self.unlink_inode_holding(&mut b, &mut inode, -1, hold);
                if nlink == 0 && !held {
                    freed = Some(inode);
                }
            }
        }
        let time = Timestamp::now();
        self.touch_local(&mut b, &changes, time)?;
        // Other servers act on the removal next (the owner drops the link,
        // every server forgets the directory): it must outlive a power cut
        // first, or the name comes back without its inode or directory.
        let remote = want_dir || ino.owner() != self.id;
        self.kv.write(b, remote).map_err(kv_err)?;
        drop(guard);
        self.touch_remote(&changes, time).await;
        if let Some(inode) = &freed {
            self.after_free(inode);
        } else if ino.owner() != self.id {
            // The name is gone; a failure here only leaks the inode.
            match self
                .call_peer(
                    ino.owner(),
                    Op::AdjustLinks {
                        ino,
                        delta: -1,
                        hold,
                    },
                )
                .await
            {
                // The owner holds a regular file it was asked to at 0.
                Ok(Reply::Links { nlink: 0 }) => held = hold && kind == FileKind::File,
                Ok(_) => {}
                Err(e) => log_warn!("dropping a link of {ino} on its owner: {e}"),
            }
        }
        if want_dir {
            self.announce_removed(ino).await;
        }
        Ok(Reply::Removed { ino, kind, held })
    }

    pub(crate) async fn adjust_links(
        self: &Arc<Self>,
        ino: InodeId,
        delta: i32,
        hold: bool,
    ) -> Result<Reply, WireError> {
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await;
        let mut inode = self.must_inode(ino)?;
        let mut b = WriteBatch::new();
        if delta == 0 {
            // No link changes: a rename moved one of its names (POSIX lets
            // rename(2) update the inode's ctime; ext4 does). An inode held
            // open after its last unlink has no name to move.
            if inode.attr.nlink > 0 {
                inode.attr.ctime = Timestamp::now();
                b.put(&keys::inode(ino), &inode.encode());
                self.kv.write(b, false).map_err(kv_err)?;
            }
            return Ok(Reply::Links {
                nlink: inode.attr.nlink,
            });
        }
        let mut held = false;
        let nlink = if delta > 0 {
            if inode.attr.nlink == 0 {
                // Held open after its last unlink: no new names (as
                // linkat of an unlinked file without O_TMPFILE).
                return Err(err(
                    ErrorCode::NotFound,
                    format!("inode {ino} has no links"),
                ));
            }
            if inode.attr.kind == FileKind::Dir {
                return Err(err(
                    ErrorCode::NotPermitted,
                    "hard links to directories are not allowed",
                ));
            }
            if inode.attr.nlink >= u32::MAX / 2 {
                return Err(err(ErrorCode::TooManyLinks, ""));
            }
            inode.attr.nlink += delta as u32;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
            inode.attr.nlink
        } else {
            let nlink;
            (nlink, held) = self.unlink_inode_holding(&mut b, &mut inode, delta, hold);
            nlink
        };
        // A new link is counted before its name is written elsewhere: the
        // count must outlive a power cut first, or the name outlives it.
        self.kv.write(b, delta > 0).map_err(kv_err)?;
        if nlink == 0 && !held {
            self.after_free(&inode);
        }
        Ok(Reply::Links { nlink })
    }

    async fn link(
        self: &Arc<Self>,
        c: &Credentials,
        ino: InodeId,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Reply, WireError> {
        self.wait_unsealed(parent).await?;
        let gate = self.locks.gate(parent).read().await;
        let dir = self.dir_owner(parent).await?;
        perm::check_dir_write(&dir, c)?;
        let attr = self.attr_of(ino).await?;
        if attr.kind == FileKind::Dir {
            return Err(err(
                ErrorCode::NotPermitted,
                "hard links to directories are not allowed",
            ));
        }
        let local = ino.owner() == self.id;
        let changes = DirChanges::one(parent, 0);
        let mut lock_keys = vec![LockKey::Dentry(parent, name), LockKey::Inode(ino)];
        lock_keys.extend(changes.local_keys(self.id));
        let g = self.locks.lock(&lock_keys).await;
        if self.load_dentry(parent, name)?.is_some() {
            return Err(err(ErrorCode::Exists, ""));
        }
        let mut b = WriteBatch::new();
        let time = Timestamp::now();
        self.touch_local(&mut b, &changes, time)?;
        let mut attr_out = None;
        if local {
            let mut inode = self.must_inode(ino)?;
            if inode.attr.nlink == 0 {
                return Err(err(
                    ErrorCode::NotFound,
                    format!("inode {ino} has no links"),
                ));
            }
            inode.attr.nlink += 1;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
            attr_out = Some(inode.attr);
        } else {
            // Count the link first: a crash before the name is written leaks
            // a link count, never leaves a name without an inode.
            self.call_peer(
                ino.owner(),
                Op::AdjustLinks {
                    ino,
                    delta: 1,
                    hold: false,
                },
            )
            .await?;
        }
        Self::put_dentry(&mut b, parent, name, attr.kind, ino);
        if let Err(e) = self.kv.write(b, false) {
            if !local {
                let _ = self
                    .call_peer(
                        ino.owner(),
                        Op::AdjustLinks {
                            ino,
                            delta: -1,
                            hold: false,
                        },
                    )
                    .await;
            }
            return Err(kv_err(e));
        }
        drop(g);
        drop(gate);
        self.touch_remote(&changes, time).await;
        Ok(Reply::Entry(Entry {
            ino,
            kind: attr.kind,
            attr: attr_out,
        }))
    }

    async fn setattr(
        &self,
        c: &Credentials,
        ino: InodeId,
        ch: SetAttrs,
    ) -> Result<Attr, WireError> {
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await;
        let mut inode = self.must_inode(ino)?;
        let a = &mut inode.attr;
        let owner = owner_of(a);
        let is_owner = c.uid == 0 || c.uid == a.uid;
        let now = Timestamp::now();
        if let Some(size) = ch.size {
            match a.kind {
                FileKind::Dir => return Err(err(ErrorCode::IsDir, "")),
                FileKind::File => {}
                // truncate(2) of anything else but a regular file: EINVAL.
                _ => return Err(err(ErrorCode::InvalidArgument, "")),
            }
            if size > limits::FILE_SIZE_MAX_BYTES {
                return Err(err(ErrorCode::FileTooBig, ""));
            }
            // ftruncate through a handle opened for writing was granted at
            // open (see `SetAttrs::via_writable_handle`).
            if !ch.via_writable_handle {
                perm::check(&owner, c, perm::WRITE)?;
            }
        }
        if let Some(uid) = ch.uid {
            if c.uid != 0 && uid != a.uid {
                return Err(err(
                    ErrorCode::NotPermitted,
                    "only root may change the owner",
                ));
            }
        }
        if let Some(gid) = ch.gid {
            if c.uid != 0 && (c.uid != a.uid || (!c.in_group(gid) && gid != a.gid)) {
                return Err(err(ErrorCode::NotPermitted, "not a member of that group"));
            }
        }
        if ch.perm.is_some() && !is_owner {
            return Err(err(
                ErrorCode::NotPermitted,
                "only the owner may change the mode",
            ));
        }
        for t in [ch.atime, ch.mtime] {
            match t {
                TimeSet::Omit => {}
                TimeSet::Now => {
                    if !is_owner && !perm::allowed(&owner, c, perm::WRITE) {
                        return Err(err(ErrorCode::AccessDenied, ""));
                    }
                }
                TimeSet::At(_) => {
                    if !is_owner {
                        return Err(err(ErrorCode::NotPermitted, "only the owner may set times"));
                    }
                }
            }
        }
        // Checks passed: apply.
        let mut owner_changed = false;
        if let Some(mut p) = ch.perm {
            p &= 0o7777;
            if c.uid != 0 && a.kind != FileKind::Dir && !c.in_group(a.gid) {
                p &= !0o2000; // POSIX: non-members cannot set setgid
            }
            owner_changed |= p != a.perm;
            a.perm = p;
        }
        let chown = ch.uid.is_some_and(|u| u != a.uid) || ch.gid.is_some_and(|g| g != a.gid);
        if let Some(uid) = ch.uid {
            a.uid = uid;
        }
        if let Some(gid) = ch.gid {
            a.gid = gid;
        }
        if chown || (ch.uid.is_some() || ch.gid.is_some()) && c.uid != 0 {
            owner_changed = true;
            if a.kind == FileKind::File {
                // Like Linux: a change of owner drops setuid, and setgid
                // where it means "run as group" (group exec set).
                a.perm &= !0o4000;
                if a.perm & 0o010 != 0 {
                    a.perm &= !0o2000;
                }
            }
        }
        let mut b = WriteBatch::new();
        let mut truncate_file = None;
        if let Some(size) = ch.size {
            if size < a.size {
                if inode.chunk0_in_file {
                    truncate_file = Some(size);
                } else if let Some(mut data) =
                    self.kv.get(&keys::inline_data(ino)).map_err(kv_err)?
                {
                    if (data.len() as u64) > size {
                        data.truncate(size as usize);
                        b.put(&keys::inline_data(ino), &data);
                    }
                }
            }
            let a = &mut inode.attr;
            a.size = size;
            a.mtime = now;
        }
        let a = &mut inode.attr;
        match ch.atime {
            TimeSet::Omit => {}
            TimeSet::Now => a.atime = now,
            TimeSet::At(t) => a.atime = t,
        }
        match ch.mtime {
            TimeSet::Omit => {}
            TimeSet::Now => a.mtime = now,
            TimeSet::At(t) => a.mtime = t,
        }
        a.ctime = now;
        if let Some(size) = truncate_file {
            // Chunk 0 is this server's business; the client trims the other
            // chunks on every server (TruncateChunks) before the new size.
            let (chunks, cs) = (self.chunks.clone(), self.chunk_size);
            blocking(move || chunks.truncate(ino, size, cs))
                .await
                .map_err(io_err)?;
        }
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        if owner_changed && inode.attr.kind == FileKind::Dir {
            self.broadcast(Op::InvalidateDir { dir: ino }).await;
        }
        Ok(inode.attr)
    }

    async fn read(&self, ino: InodeId, chunk: ChunkIndex, offset: u32, len: u32) -> OpResult {
        if offset as u64 + len as u64 > self.chunk_size {
            return Err(err(
                ErrorCode::InvalidArgument,
                "read crosses the chunk end",
            ));
        }
        if chunk.0 == 0 {
            let inode = self.must_inode(ino)?;
            if inode.attr.kind == FileKind::Dir {
                return Err(err(ErrorCode::IsDir, ""));
            }
            if !inode.chunk0_in_file {
                let data = self
                    .kv
                    .get(&keys::inline_data(ino))
                    .map_err(kv_err)?
                    .unwrap_or_default();
                let start = (offset as usize).min(data.len());
                let end = (offset as usize + len as usize).min(data.len());
                return Ok((Reply::Data, data[start..end].to_vec()));
            }
        }
        // From the chunk cache, when it holds all of it: a copy in memory,
        // short enough for this thread, which spares the blocking pool's
        // two thread hand-offs.
        if len <= CACHED_READ_INLINE_MAX_BYTES {
            if let Some(data) = self
                .chunks
                .read_cached(ino, chunk, offset as u64, len as usize)
            {
                return Ok((Reply::Data, data));
            }
        }
        let chunks = self.chunks.clone();
        let data = blocking(move || chunks.read(ino, chunk, offset as u64, len as usize))
            .await
            .map_err(io_err)?;
        Ok((Reply::Data, data))
    }

    async fn write(
        &self,
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        file_size: u64,
        data: Vec<u8>,
    ) -> Result<Reply, WireError> {
        let end = offset as u64 + data.len() as u64;
        if end > self.chunk_size {
            return Err(err(
                ErrorCode::InvalidArgument,
                "write crosses the chunk end",
            ));
        }
        if file_size > limits::FILE_SIZE_MAX_BYTES {
            return Err(err(ErrorCode::FileTooBig, ""));
        }
        self.check_space(data.len() as u64)?;
        let cs = self.chunk_size;
        if chunk.0 != 0 {
            let chunks = self.chunks.clone();
            blocking(move || chunks.write(ino, chunk, offset as u64, &data, cs))
                .await
                .map_err(io_err)?;
            return Ok(Reply::Empty);
        }
        // Chunk 0 lives with the inode: data and size change in one step.
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await;
        let mut inode = self.must_inode(ino)?;
        if inode.attr.kind != FileKind::File {
            return Err(err(ErrorCode::IsDir, "not a regular file"));
        }
        let mut b = WriteBatch::new();
        if !inode.chunk0_in_file {
            let mut inline = self
                .kv
                .get(&keys::inline_data(ino))
                .map_err(kv_err)?
                .unwrap_or_default();
            if end <= limits::INLINE_DATA_MAX_BYTES {
                if inline.len() < end as usize {
                    inline.resize(end as usize, 0);
                }
                inline[offset as usize..end as usize].copy_from_slice(&data);
                b.put(&keys::inline_data(ino), &inline);
            } else {
                // Outgrown: move chunk 0 to a file, then write there.
                let chunks = self.chunks.clone();
                blocking(move || {
                    chunks.write(ino, ChunkIndex(0), 0, &inline, cs)?;
                    chunks.write(ino, ChunkIndex(0), offset as u64, &data, cs)
                })
                .await
                .map_err(io_err)?;
                inode.chunk0_in_file = true;
                b.delete(&keys::inline_data(ino));
            }
        } else {
            let chunks = self.chunks.clone();
            blocking(move || chunks.write(ino, ChunkIndex(0), offset as u64, &data, cs))
                .await
                .map_err(io_err)?;
        }
        let now = Timestamp::now();
        inode.attr.size = inode.attr.size.max(file_size);
        inode.attr.mtime = now;
        inode.attr.ctime = now;
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        Ok(Reply::Empty)
    }

    async fn update_size(
        &self,
        ino: InodeId,
        size: u64,
        mtime: Timestamp,
    ) -> Result<Attr, WireError> {
        if size > limits::FILE_SIZE_MAX_BYTES {
            return Err(err(ErrorCode::FileTooBig, ""));
        }
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await;
        let mut inode = self.must_inode(ino)?;
        inode.attr.size = inode.attr.size.max(size);
        inode.attr.mtime = inode.attr.mtime.max(mtime);
        inode.attr.ctime = Timestamp::now();
        let mut b = WriteBatch::new();
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        Ok(inode.attr)
    }

    async fn readdir(
        &self,
        c: &Credentials,
        dir: InodeId,
        after: Option<FileName>,
        max: u32,
    ) -> Result<Reply, WireError> {
        let owner = self.dir_owner(dir).await?;
        perm::check(&owner, c, perm::READ)?;
        let max = max.clamp(1, limits::READDIR_PAGE_ENTRIES_MAX) as usize;
        let prefix = keys::dentry_prefix(dir);
        let start = match &after {
            None => prefix.clone(),
            Some(n) => {
                let mut k = keys::dentry(dir, n);
                k.push(0); // the first key after `n`
                k
            }
        };
        let rows = self.kv.scan(&prefix, &start, max + 1).map_err(kv_err)?;
        let more = rows.len() > max;
        let mut entries = Vec::with_capacity(rows.len().min(max));
        for (k, v) in rows.into_iter().take(max) {
            let name = FileName::new(&k[prefix.len()..])
                .map_err(|_| err(ErrorCode::Io, "corrupt dentry key"))?;
            let (kind, ino) =
                decode_dentry(&v).ok_or_else(|| err(ErrorCode::Io, "corrupt dentry"))?;
            entries.push(DirEntry { name, ino, kind });
        }
        Ok(Reply::DirPage { entries, more })
    }

    /// Refuse growth (ENOSPC) once free space would drop into the reserve:
    /// the smaller of 64 MiB and an eighth of the disk.
    fn check_space(&self, growth: u64) -> Result<(), WireError> {
        let granted = self
            .space
            .grant(growth, |total| SPACE_RESERVE_MAX_BYTES.min(total / 8))
            .map_err(io_err)?;
        granted.map_err(|reserve| {
            err(
                ErrorCode::NoSpace,
                format!("server {} keeps its last {reserve} bytes free", self.id),
            )
        })
    }

    fn statfs(&self) -> Result<FsStats, WireError> {
        let (total, free, avail) = self.space.measure().map_err(io_err)?;
        Ok(FsStats {
            bytes_total: total,
            bytes_free: free,
            bytes_avail: avail,
            inodes: self.inode_count.load(Ordering::Relaxed),
            data_bytes: self.chunks.bytes_used(),
        })
    }

    async fn purge_local(&self, ino: InodeId) -> OpResult {
        let chunks = self.chunks.clone();
        blocking(move || chunks.purge(ino)).await.map_err(io_err)?;
        Ok((Reply::Empty, Vec::new()))
    }

    /// Is `name` in `parent` held by this server?
    pub(crate) fn holds_dentry(&self, parent: InodeId, name: &FileName) -> bool {
        dentry_server(parent, name, self.servers) == self.id
    }
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

/// Times an operation that found its entries changed under it (TryAgain)
/// starts over before the caller sees EAGAIN, which rename(2) and unlink(2)
/// never return: racing renames onto one name must all succeed.
const RACE_RETRIES_MAX: usize = 32;

async fn retry_races<T, F, Fut>(mut op: F) -> Result<T, WireError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, WireError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.code == ErrorCode::TryAgain && attempt < RACE_RETRIES_MAX => {
                attempt += 1;
                tokio::task::yield_now().await;
            }
            other => return other,
        }
    }
}

pub(crate) fn owner_of(a: &Attr) -> Owner {
    Owner {
        kind: a.kind,
        perm: a.perm,
        uid: a.uid,
        gid: a.gid,
    }
}

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

pub(crate) async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.into_iter().collect();
    let mut out = Vec::with_capacity(handles.len());
    // Poll all concurrently.
    let mut pinned: Vec<Pin<Box<F>>> = handles.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if results[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => results[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    for r in results {
        out.extend(r);
    }
    out
}

impl Handler for Server {
    fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> impl Future<Output = OpResult> + Send {
        self.dispatch(ctx, req, data)
    }
}
