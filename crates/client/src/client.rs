//! The async client and its inode-level API: each method is one operation of
//! the protocol (or a fan-out of one to several servers), sent to the server
//! the placement functions name. The FUSE adapter maps its callbacks onto
//! these one to one; the path-level API (path.rs) and open files (file.rs)
//! are built on them.

use crate::cache::{CacheConfig, CacheStats, MetaCache};
use crate::chunk::{clamp_read, fill_piece, split_range};
use crate::counts::{Counters, RequestCounts};
use crate::dir::{merge_pages, DirCursor, Page};
use crate::error::{ClientError, Result};
use crate::open_files::OpenFiles;
use crate::touched::Touched;
use crate::writebehind::{self, Budget};
use crate::Unsynced;
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{DirEntry, Entry, FsStats, Hold, SetAttrs, TouchToken, WriteVerifier};
use madfs_proto::{ErrorCode, Op, Reply, Request};
use madfs_rpc::join::{join_bounded, try_join_bounded};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::{ClusterConfig, Pool, Response, SharedData};
use madfs_types::{
    chunk_server, dentry_server, limits, Attr, Credentials, FileKind, FileName, InodeId, ServerId,
    Timestamp,
};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Concurrency of one read or write call: enough to keep every server of a
/// large stripe busy, few enough that one huge call cannot monopolise a
/// connection's in-flight slots.
const IN_FLIGHT_PER_CALL: usize = 16;

/// Times `fstat` asks again when truncates through this client keep
/// running while it asks.
const FSTAT_TRIES_MAX: u32 = 8;

/// Requests a fan-out to every server keeps in flight at once: all of a
/// typical cluster, without opening thousands of sockets at once on a huge one.
pub(crate) const FANOUT_MAX: usize = 128;

/// A handle on a cluster. Cheap to clone (the connection pool is shared);
/// `Send + Sync`, so one client serves every thread of a process.
#[derive(Clone)]
pub struct Client {
    pool: Arc<Pool>,
    creds: Arc<Credentials>,
    chunk_size: u64,
    timeouts: Timeouts,
    /// Bytes of write-behind data in flight over all files of this client.
    write_budget: Budget,
    /// Names and attributes seen within the TTL (cache.rs); shared by
    /// clones, also those with other credentials (entries do not depend
    /// on who asked: permissions are checked against them each time).
    pub(crate) cache: Arc<MetaCache>,
    /// Requests sent, by operation (counts.rs).
    counts: Arc<Counters>,
    /// Files open through this client, for the sizes their writes give
    /// before they publish them (open_files.rs).
    pub(crate) open_files: Arc<OpenFiles>,
    /// Bytes held by read-only handles whose open brought the file along
    /// (`open_at`); past `PRELOAD_BUDGET_BYTES` opens stop asking for them.
    pub(crate) preload_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Tokens of touches of this client's changes to directories not yet
    /// seen applied (touched.rs): a GetAttr of the directory waits for them.
    touched: Arc<Touched>,
    /// The servers this client changed names on (create, mkdir, unlink,
    /// rename, link...) since it last synced them whole, and the write
    /// verifiers they answered with: a whole-cluster sync that finds one
    /// changed reports the changes may be lost (`fsync_all`).
    names_unsynced: Arc<Mutex<Unsynced>>,
}

/// A request of this client: with an id if it must run once (the pool
/// sends the same id with each retry; server once.rs).
fn request(creds: Credentials, op: Op) -> Request {
    let once = op
        .runs_once()
        .then(|| madfs_proto::RunOnce::first(madfs_types::next_op_id()));
    Request { creds, op, once }
}

/// A name's server answered with an inode whose owner then said it is
/// gone: an unlink or a rename that replaced the name came between the two
/// requests. The name is asked for again, and names what it names now (a
/// rename's new inode, or nothing), as one lookup on one server would
/// answer. The same inode gone twice in a row is a name that outlived its
/// inode, and NotFound is the answer.
#[derive(Default)]
struct Vanished {
    last: Option<InodeId>,
    asked: u32,
}

impl Vanished {
    /// Asked again this many times at most.
    const ASK_AGAIN_MAX: u32 = 8;

    /// Whether to ask for the name again after `r`, the attributes of
    /// `ino` it named.
    fn ask_again<T>(&mut self, ino: InodeId, r: &Result<T>) -> bool {
        let gone = matches!(r, Err(e) if e.code == ErrorCode::NotFound);
        if !gone || self.last == Some(ino) || self.asked >= Self::ASK_AGAIN_MAX {
            return false;
        }
        self.last = Some(ino);
        self.asked += 1;
        true
    }
}

/// Bytes of small files that open handles of one client may hold (see
/// `Client::open_at`): 64 MiB, a thousand 64 KiB files open at once.
pub(crate) const PRELOAD_BUDGET_BYTES: u64 = 64 << 20;

/// The end of a write of `len` bytes at `offset`, or FileTooBig if it goes
/// past the largest file size.
pub(crate) fn write_end(offset: u64, len: usize) -> Result<u64> {
    offset
        .checked_add(len as u64)
        .filter(|&e| e <= limits::FILE_SIZE_MAX_BYTES)
        .ok_or_else(|| {
            ClientError::new(
                ErrorCode::FileTooBig,
                format!("write of {len} bytes at offset {offset} goes past the largest file size"),
            )
        })
}

/// What a `Client::write` did, for the open file's bookkeeping.
/// Who serves the cluster's replica sets now (`Client::cluster_routes`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRoutes {
    /// `serving[s]` serves set s.
    pub serving: Vec<ServerId>,
    /// How many servers keep each set in sync (empty: no replicas).
    pub in_sync: Vec<u8>,
    /// Servers that moved from their cluster-file address.
    pub addresses: Vec<(ServerId, std::net::SocketAddr)>,
    /// The membership group's voters (empty: no replicas).
    pub voters: Vec<ServerId>,
    /// The sets none of whose in-sync copies answers, with how long.
    pub lost: Vec<(ServerId, std::time::Duration)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Servers that acknowledged data and must be fsynced for durability,
    /// with the store incarnation each write went to.
    pub written: Unsynced,
    /// Whether any chunk past chunk 0 was written: only the owner (holding
    /// chunk 0) grows the size as it writes, so such a write needs an
    /// `UpdateSize` at close or fsync.
    pub touched_non_zero_chunk: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("servers", &self.server_count())
            .field("chunk_size", &self.chunk_size)
            .field("creds", &self.creds)
            .finish()
    }
}

impl Client {
    /// Read the cluster file (`cluster_file`, else $MADFS_CLUSTER, else
    /// ./madfs-data/cluster.toml) and its key. No server is contacted yet:
    /// connections open on first use, so an unreachable server shows up as an
    /// error of the first operation that needs it.
    /// The metadata cache's TTL comes from `$MADFS_CACHE_TTL` (seconds; 0
    /// turns it off), else 1 s.
    pub fn connect(cluster_file: Option<&Path>) -> Result<Client> {
        let path = ClusterConfig::locate(cluster_file);
        let cfg = ClusterConfig::load(&path)?;
        let key = cfg.load_key()?;
        let cache =
            CacheConfig::from_env().map_err(|e| ClientError::new(ErrorCode::InvalidArgument, e))?;
        Ok(Client::from_config(&cfg, key)?.with_cache(cache))
    }

    pub fn from_config(cfg: &ClusterConfig, key: ClusterKey) -> Result<Client> {
        Client::from_config_with_timeouts(cfg, key, Timeouts::default())
    }

    pub fn from_config_with_timeouts(
        cfg: &ClusterConfig,
        key: ClusterKey,
        timeouts: Timeouts,
    ) -> Result<Client> {
        cfg.validate()?;
        let pool = Pool::new(cfg, key, Role::Client, timeouts);
        Ok(Client::with_pool(cfg, pool, timeouts))
    }

    /// A client of the cluster `cfg` describes whose calls go through
    /// `pool` (the simulation's in-process network, crates/sim).
    pub fn from_pool(cfg: &ClusterConfig, pool: Pool) -> Result<Client> {
        cfg.validate()?;
        Ok(Client::with_pool(cfg, pool, Timeouts::default()))
    }

    fn with_pool(cfg: &ClusterConfig, pool: Pool, timeouts: Timeouts) -> Client {
        Client {
            pool: Arc::new(pool),
            creds: Arc::new(Credentials::current_process()),
            chunk_size: cfg.chunk_size,
            timeouts,
            write_budget: Budget::new(writebehind::BUDGET_BYTES),
            cache: Arc::new(MetaCache::new(CacheConfig::default())),
            counts: Arc::new(Counters::new()),
            open_files: Arc::new(OpenFiles::default()),
            preload_bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            touched: Arc::new(Touched::default()),
            names_unsynced: Arc::default(),
        }
    }

    /// This client (sharing its connections and counters) with a new,
    /// empty metadata cache configured by `cfg` (`CacheConfig::off()` for
    /// callers with a cache of their own, such as the FUSE mount, whose
    /// kernel caches names and attributes).
    pub fn with_cache(&self, cfg: CacheConfig) -> Client {
        Client {
            cache: Arc::new(MetaCache::new(cfg)),
            ..self.clone()
        }
    }

    /// This client (sharing its counters, open files, write budget and
    /// metadata cache) over connections of its own to the servers of
    /// `cfg`, opened on first use by the runtime that first uses them and
    /// served by it. The FUSE mount gives each thread that reads requests
    /// from the kernel one, on a runtime of that thread, so a request and
    /// its reply never wait for another thread to wake.
    pub fn with_own_connections(&self, cfg: &ClusterConfig, key: ClusterKey) -> Result<Client> {
        cfg.validate()?;
        if cfg.servers.len() != self.server_count() || cfg.chunk_size != self.chunk_size {
            return Err(ClientError::new(
                ErrorCode::InvalidArgument,
                "another cluster than this client's",
            ));
        }
        Ok(Client {
            pool: Arc::new(Pool::new(cfg, key, Role::Client, self.timeouts)),
            ..self.clone()
        })
    }

    /// Connections this client (and its clones sharing them) holds open:
    /// one per server it talked to, never one per server of the cluster.
    pub fn open_connections(&self) -> usize {
        self.pool.open_connections()
    }

    pub fn cache_config(&self) -> CacheConfig {
        self.cache.config()
    }

    /// How the metadata cache has answered so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Requests sent so far by this client and its clones, by operation.
    pub fn request_counts(&self) -> RequestCounts {
        self.counts.snapshot()
    }

    /// A client sharing this one's connections but acting as `creds` (the
    /// FUSE adapter makes one per request, with the caller's uid and gids).
    pub fn with_credentials(&self, creds: Credentials) -> Client {
        Client {
            creds: Arc::new(creds),
            ..self.clone()
        }
    }

    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    pub fn server_count(&self) -> usize {
        self.pool.server_count()
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The write-behind byte budget shared by every file of this client
    /// (and by a mount over it).
    pub fn write_budget(&self) -> &Budget {
        &self.write_budget
    }

    async fn call_data(&self, server: ServerId, op: Op, data: &[u8]) -> Result<Response> {
        self.counts.record(op.opcode());
        let req = request((*self.creds).clone(), op);
        Ok(self.pool.call(server, &req, data).await?)
    }

    /// `call_data` with a range of a buffer this client shares with the
    /// connection's writer: no copy (the pieces of a write behind).
    async fn call_shared(
        &self,
        server: ServerId,
        op: Op,
        data: Arc<Vec<u8>>,
        range: std::ops::Range<usize>,
    ) -> Result<Response> {
        self.counts.record(op.opcode());
        let req = request((*self.creds).clone(), op);
        let data = SharedData::Shared(data, range);
        Ok(self.pool.call_shared(server, &req, data).await?)
    }

    pub(crate) async fn call(&self, server: ServerId, op: Op) -> Result<Reply> {
        Ok(self.call_data(server, op, &[]).await?.reply)
    }

    /// The attributes in a reply that should carry them; `Empty` is taken
    /// as "done, ask the owner" so a server may answer either way.
    async fn attr_reply(&self, what: &str, ino: InodeId, reply: Reply) -> Result<Attr> {
        match reply {
            Reply::Attr(a) => Ok(a),
            Reply::Empty => self.getattr(ino).await,
            other => Err(ClientError::unexpected(what, &other)),
        }
    }

    /// An entry's attributes: included when the dentry server owns the
    /// inode, otherwise fetched from the owner (see `Vanished` for when
    /// that inode is gone).
    async fn entry_attr(&self, entry: Entry) -> Result<Attr> {
        match entry.attr {
            Some(a) => Ok(a),
            None => self.getattr(entry.ino).await,
        }
    }

    pub(crate) fn dentry_server(&self, parent: InodeId, name: &FileName) -> ServerId {
        dentry_server(parent, name, self.server_count())
    }

    /// Find `name` in `parent` (always asks its server; the answer, found
    /// or not, goes into the metadata cache).
    pub async fn lookup(&self, parent: InodeId, name: &FileName) -> Result<Attr> {
        let since = self.cache.epoch();
        let mut vanished = Vanished::default();
        let r = loop {
            let op = Op::Lookup {
                parent,
                name: name.clone(),
            };
            let entry = match self.call(self.dentry_server(parent, name), op).await {
                Ok(Reply::Entry(e)) => e,
                Ok(other) => break Err(ClientError::unexpected("lookup", &other)),
                Err(e) => break Err(e),
            };
            let ino = entry.ino;
            let r = match entry {
                // A directory this client changed, whose touch may not have
                // landed yet: its owner tells once it did.
                e if e.kind == FileKind::Dir && self.touched.pending(e.ino) => {
                    self.getattr(e.ino).await
                }
                e => self.entry_attr(e).await,
            };
            if !vanished.ask_again(ino, &r) {
                break r;
            }
        };
        match &r {
            Ok(a) => self.cache.learned_entry(since, parent, name, Some(a)),
            Err(e) if e.code == ErrorCode::NotFound => {
                self.cache.learned_entry(since, parent, name, None)
            }
            Err(_) => {}
        }
        r
    }

    /// `lookup` for an open to read: with the file's bytes when it is a
    /// regular file of at most `data_max` bytes kept inline with its inode
    /// on the name's server (an mdtest-hard file: open and read in one
    /// request). `Some(bytes)` holds exactly the file's size in bytes.
    pub async fn open_at(
        &self,
        parent: InodeId,
        name: &FileName,
        data_max: u32,
    ) -> Result<(Attr, Option<Vec<u8>>)> {
        let since = self.cache.epoch();
        let mut vanished = Vanished::default();
        let r = loop {
            let op = Op::Open {
                parent,
                name: name.clone(),
                data_max,
            };
            let (e, data) = match self
                .call_data(self.dentry_server(parent, name), op, &[])
                .await
            {
                Ok(Response {
                    reply: Reply::Entry(e),
                    data,
                }) => (e, data),
                Ok(other) => break Err(ClientError::unexpected("open", &other.reply)),
                Err(e) => break Err(e),
            };
            let inline = e.attr.as_ref().is_some_and(|a| {
                a.kind == FileKind::File && a.size > 0 && data.len() as u64 == a.size
            });
            let ino = e.ino;
            let r = self.entry_attr(e).await;
            if !vanished.ask_again(ino, &r) {
                break r.map(|a| (a, inline.then_some(data)));
            }
        };
        match &r {
            Ok((a, _)) => self.cache.learned_entry(since, parent, name, Some(a)),
            Err(e) if e.code == ErrorCode::NotFound => {
                self.cache.learned_entry(since, parent, name, None)
            }
            Err(_) => {}
        }
        r
    }

    /// An inode's attributes from its owner (always asks; the answer goes
    /// into the metadata cache). For a directory this client changed, the
    /// owner answers once those changes' touches are applied (touched.rs).
    pub async fn getattr(&self, ino: InodeId) -> Result<Attr> {
        let since = self.cache.epoch();
        let after = self.touched.waits(ino);
        let op = Op::GetAttr {
            ino,
            after: after.clone(),
        };
        match self.call(ino.owner(), op).await? {
            Reply::Attr(a) => {
                self.touched.waited(ino, &after);
                self.cache.learned_attr(since, &a);
                Ok(a)
            }
            other => Err(ClientError::unexpected("getattr", &other)),
        }
    }

    /// The attributes of an inode as this client sees them: the owner's,
    /// with the size grown by this client's writes not yet published
    /// (fstat, and the path-level stat, of a file this process writes).
    pub async fn fstat(&self, ino: InodeId) -> Result<Attr> {
        let mut tries = 0;
        loop {
            // Looked at before and after: a write in flight at the first
            // look may have landed (and left the table) before the owner
            // answered. A truncate meanwhile makes the first look stale:
            // then ask again (a truncate through this client is rare; after
            // a few tries the owner's answer with the table as it is now).
            let truncations = self.open_files.truncations();
            let before = self.open_files.unpublished_size(ino);
            let a = self.getattr(ino).await?;
            let mut a = self.with_open_writes(a);
            tries += 1;
            if self.open_files.truncations() == truncations {
                a.size = a.size.max(before.unwrap_or(0));
                return Ok(a);
            }
            if tries >= FSTAT_TRIES_MAX {
                return Ok(a);
            }
        }
    }

    /// The count of truncates through this client started and ended, for a
    /// caller that overlays sizes of its own (the mount): a size it learned
    /// while the count moved may be from before a truncate.
    pub fn truncations(&self) -> u64 {
        self.open_files.truncations()
    }

    /// `attr` with the size grown by this client's unpublished writes.
    pub(crate) fn with_open_writes(&self, mut attr: Attr) -> Attr {
        if attr.kind == FileKind::File {
            if let Some(size) = self.open_files.unpublished_size(attr.ino) {
                attr.size = attr.size.max(size);
            }
        }
        attr
    }

    /// Change attributes. Shrinking a file that has chunks beyond chunk 0
    /// first drops those chunks on every server, then sets the size on the
    /// owner (which trims chunk 0 itself): a crash in between leaves zeros
    /// below the old size, never stale data that a later extension would
    /// expose again.
    pub async fn setattr(&self, ino: InodeId, changes: SetAttrs) -> Result<Attr> {
        self.setattr_known_size(ino, changes, 0).await
    }

    /// `setattr` for a caller that knows the file may be at least
    /// `known_size` long (an open file with writes whose size is not yet on
    /// the owner), so their chunks are dropped too; also saves the getattr
    /// when `known_size` alone proves a shrink past chunk 0.
    pub async fn setattr_known_size(
        &self,
        ino: InodeId,
        changes: SetAttrs,
        known_size: u64,
    ) -> Result<Attr> {
        if self.touched.pending(ino) {
            // This client's own changes in the directory are still on their
            // way to its owner: they happened first, so their times must
            // not land over the times set here (cp -a, tar and rsync set a
            // directory's mtime after filling it). The GetAttr waits for
            // them (touched.rs).
            self.getattr(ino).await?;
        }
        // No handle publishes a size read before this truncate after it, and
        // sizes learned while it runs may be from before it (open_files.rs).
        let _turn = match changes.size {
            Some(_) => Some(self.open_files.truncating(ino).await),
            None => None,
        };
        if changes.size.is_some() {
            // A write of another handle landing after the truncate would
            // bring data back.
            self.open_files.drain_writes(ino).await;
        }
        let known_size = known_size.max(self.open_files.unpublished_size(ino).unwrap_or(0));
        if let Some(new_size) = changes.size {
            if new_size > limits::FILE_SIZE_MAX_BYTES {
                return Err(ClientError::new(
                    ErrorCode::FileTooBig,
                    format!("size {new_size} is over the limit"),
                ));
            }
            // Skip the getattr when what we know already proves the shrink.
            let old_size = if known_size > self.chunk_size && new_size < known_size {
                known_size
            } else {
                let a = self.getattr(ino).await?;
                if a.kind != FileKind::File {
                    0 // the owner refuses the size change with the right error
                } else {
                    a.size.max(known_size)
                }
            };
            if new_size < old_size && old_size > self.chunk_size {
                self.truncate_chunks(ino, new_size).await?;
            } else if new_size > old_size && new_size > limits::INLINE_DATA_MAX_BYTES {
                // Chunk files may hold bytes past the size (a write whose
                // size update a crash or a lost message undid): the
                // extension must read as zeros, not bring them back.
                self.truncate_chunks(ino, old_size).await?;
            }
        }
        let new_size = changes.size;
        let r = match self.call(ino.owner(), Op::SetAttr { ino, changes }).await {
            Ok(reply) => self.attr_reply("setattr", ino, reply).await,
            Err(e) => Err(e),
        };
        match &r {
            Ok(a) => {
                self.cache.changed_attr(a);
                if let Some(size) = new_size {
                    // Every handle of this client now knows the new size:
                    // none may publish its older, larger one at close.
                    self.open_files.truncated(ino, size);
                }
            }
            Err(_) => self.cache.forget_attr(ino),
        }
        r
    }

    /// The servers holding chunks of `ino` below `size` (chunk 0, the
    /// owner, always): every server once the chunks cover them all.
    pub(crate) fn chunk_holders(
        &self,
        ino: InodeId,
        size: u64,
    ) -> std::collections::BTreeSet<ServerId> {
        let n = self.server_count();
        let chunks = size.div_ceil(self.chunk_size()).max(1);
        let mut holders = std::collections::BTreeSet::new();
        // Chunks are placed by a hash: past a few rounds of the servers
        // the answer is every server (but for unlikely misses, taken too).
        if chunks > 8 * n as u64 {
            holders.extend(self.all_servers());
            return holders;
        }
        for k in 0..chunks {
            holders.insert(chunk_server(ino, madfs_types::ChunkIndex(k as u32), n));
            if holders.len() == n {
                break;
            }
        }
        holders
    }

    /// Every server of the cluster.
    pub(crate) fn all_servers(&self) -> Vec<ServerId> {
        self.pool.servers().collect()
    }

    /// Drop chunk data at and beyond `size` on every server. The next
    /// fsync of `ino` syncs every server (open_files.rs `cut`).
    async fn truncate_chunks(&self, ino: InodeId, size: u64) -> Result<()> {
        let calls: Vec<_> = self
            .pool
            .servers()
            .map(|s| self.call(s, Op::TruncateChunks { ino, size }))
            .collect();
        try_join_bounded(calls, FANOUT_MAX).await?;
        if !self.open_files.cut(ino) {
            self.fsync_servers(&self.all_servers()).await?;
        }
        Ok(())
    }

    /// Check `mask` (ACCESS_* bits) for this client's credentials.
    pub async fn access(&self, ino: InodeId, mask: u8) -> Result<Attr> {
        let since = self.cache.epoch();
        let reply = self.call(ino.owner(), Op::Access { ino, mask }).await?;
        let a = self.attr_reply("access", ino, reply).await?;
        self.cache.learned_attr(since, &a);
        Ok(a)
    }

    async fn create_entry(
        &self,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm: u32,
        exclusive: bool,
        symlink_target: Vec<u8>,
    ) -> Result<(Attr, bool)> {
        self.create_entry_with_data(parent, name, kind, perm, exclusive, symlink_target, &[])
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_entry_with_data(
        &self,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm: u32,
        exclusive: bool,
        symlink_target: Vec<u8>,
        data: &[u8],
    ) -> Result<(Attr, bool)> {
        let op = Op::Create {
            parent,
            name: name.clone(),
            kind,
            perm: perm & 0o7777,
            exclusive,
            symlink_target,
        };
        let r = async {
            let home = self.dentry_server(parent, name);
            let resp = self.call_data(home, op, data).await?;
            match resp.reply {
                Reply::Created {
                    entry,
                    created,
                    touched,
                    verifier,
                } => {
                    self.names_changed(home, &touched, verifier);
                    Ok((self.entry_attr(entry).await?, created))
                }
                other => Err(ClientError::unexpected("create", &other)),
            }
        }
        .await;
        match &r {
            Ok((attr, _)) => self.cache.made(parent, name, attr),
            Err(_) => self.cache.forget_entry(parent, name),
        }
        r
    }

    /// Create a new regular file (it must not exist) holding `data`, and
    /// return its attributes. Up to the inline limit (64 KiB) this is one
    /// request; larger contents are written after the create. Not synced:
    /// open the file and fsync it for durability.
    pub async fn create_with_data(
        &self,
        parent: InodeId,
        name: &FileName,
        perm: u32,
        data: &[u8],
    ) -> Result<Attr> {
        if data.len() as u64 <= limits::INLINE_DATA_MAX_BYTES {
            let (attr, _) = self
                .create_entry_with_data(parent, name, FileKind::File, perm, true, Vec::new(), data)
                .await?;
            return Ok(attr);
        }
        let (attr, _) = self.create(parent, name, perm, true).await?;
        let outcome = self.write(attr.ino, 0, data).await?;
        if outcome.touched_non_zero_chunk {
            return self
                .update_size(attr.ino, data.len() as u64, Timestamp::now())
                .await;
        }
        self.getattr(attr.ino).await
    }

    /// Create a regular file; without `exclusive`, an existing regular file
    /// is returned instead (`created` false), as open(O_CREAT) does.
    pub async fn create(
        &self,
        parent: InodeId,
        name: &FileName,
        perm: u32,
        exclusive: bool,
    ) -> Result<(Attr, bool)> {
        self.create_entry(parent, name, FileKind::File, perm, exclusive, Vec::new())
            .await
    }

    /// mknod(2): make a FIFO, socket, character or block device node (or
    /// an empty regular file) named `name`, which must not exist. `rdev`
    /// (kernel encoding, see `Attr::rdev`) is kept for devices only, which
    /// only root may make (EPERM otherwise).
    pub async fn mknod_at(
        &self,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let op = Op::Mknod {
            parent,
            name: name.clone(),
            kind,
            perm: perm & 0o7777,
            rdev,
        };
        let r = async {
            let home = self.dentry_server(parent, name);
            match self.call(home, op).await? {
                Reply::Created {
                    entry,
                    touched,
                    verifier,
                    ..
                } => {
                    self.names_changed(home, &touched, verifier);
                    self.entry_attr(entry).await
                }
                other => Err(ClientError::unexpected("mknod", &other)),
            }
        }
        .await;
        match &r {
            Ok(attr) => self.cache.made(parent, name, attr),
            Err(_) => self.cache.forget_entry(parent, name),
        }
        r
    }

    pub async fn mkdir_at(&self, parent: InodeId, name: &FileName, perm: u32) -> Result<Attr> {
        let (attr, _) = self
            .create_entry(parent, name, FileKind::Dir, perm, true, Vec::new())
            .await?;
        Ok(attr)
    }

    pub async fn symlink_at(
        &self,
        parent: InodeId,
        name: &FileName,
        target: &[u8],
    ) -> Result<Attr> {
        if target.len() > limits::SYMLINK_MAX_BYTES {
            return Err(ClientError::new(
                ErrorCode::NameTooLong,
                format!(
                    "symlink target of {} bytes (at most {})",
                    target.len(),
                    limits::SYMLINK_MAX_BYTES
                ),
            ));
        }
        if target.is_empty() {
            // As on Linux: an empty target names nothing.
            return Err(ClientError::new(
                ErrorCode::NotFound,
                "empty symlink target",
            ));
        }
        if target.contains(&0) {
            return Err(ClientError::new(
                ErrorCode::InvalidArgument,
                "symlink target contains a NUL byte",
            ));
        }
        let (attr, _) = self
            .create_entry(
                parent,
                name,
                FileKind::Symlink,
                0o777,
                true,
                target.to_vec(),
            )
            .await?;
        Ok(attr)
    }

    async fn remove(&self, parent: InodeId, name: &FileName, dir: bool) -> Result<()> {
        let op = Op::Remove {
            parent,
            name: name.clone(),
            dir,
            // The inodes open here: the last name of one of them goes, but
            // the file stays until its last close (`Hold`).
            hold: if dir {
                Hold::Nothing
            } else {
                self.open_files.hold()
            },
        };
        let home = self.dentry_server(parent, name);
        match self.call(home, op).await {
            Ok(reply) => {
                let ino = match reply {
                    Reply::Removed {
                        ino,
                        held,
                        touched,
                        verifier,
                        ..
                    } => {
                        self.names_changed(home, &touched, verifier);
                        if held {
                            self.held(ino).await;
                        }
                        Some(ino)
                    }
                    _ => None,
                };
                self.cache.removed(parent, name, ino);
                Ok(())
            }
            Err(e) => {
                if e.code == ErrorCode::NotFound {
                    self.cache.removed(parent, name, None);
                } else {
                    self.cache.forget_entry(parent, name);
                }
                Err(e)
            }
        }
    }

    /// The owner keeps `ino` for this client (it lost its last name while
    /// open here): release it at the last close of its handles, or now if
    /// none is open (any more: it closed while the removal was under way).
    async fn held(&self, ino: InodeId) {
        self.cache.forget_attr(ino);
        if !self.open_files.mark_held(ino) {
            let _ = self.release(ino).await;
        }
    }

    async fn release(&self, ino: InodeId) -> Result<()> {
        self.cache.forget_attr(ino);
        match self.call(ino.owner(), Op::Release { ino }).await? {
            Reply::Empty => Ok(()),
            other => Err(ClientError::unexpected("release", &other)),
        }
    }

    /// Free the files unlinked while open here whose last handle has
    /// closed (`Op::Release`; their chunks are purged by their owners). A
    /// handle dropped inside a runtime does this itself in the background;
    /// callers that drop handles outside one (or must know it is done
    /// before they go on, as the interception library at close) call it.
    /// Returns the first failure; an inode not released stays until its
    /// owner's next start.
    pub async fn release_unlinked(&self) -> Result<()> {
        let mut first = Ok(());
        for ino in self.open_files.take_releases() {
            if let Err(e) = self.release(ino).await {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Whether files unlinked while open wait for `release_unlinked`.
    pub fn has_unlinked_to_release(&self) -> bool {
        self.open_files.has_releases()
    }

    /// Release every file unlinked while open here, closed or not: the
    /// process is ending and its handles with it (the interception library
    /// at exit). Handles still open of them read ENOENT after this.
    pub async fn release_all_unlinked(&self) -> Result<()> {
        let mut first = Ok(());
        for ino in self.open_files.take_all_held() {
            if let Err(e) = self.release(ino).await {
                first = first.and(Err(e));
            }
        }
        first
    }

    pub async fn unlink(&self, parent: InodeId, name: &FileName) -> Result<()> {
        self.remove(parent, name, false).await
    }

    pub async fn rmdir(&self, parent: InodeId, name: &FileName) -> Result<()> {
        self.remove(parent, name, true).await
    }

    /// `flags`: 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
    pub async fn rename_at(
        &self,
        src_parent: InodeId,
        src_name: &FileName,
        dst_parent: InodeId,
        dst_name: &FileName,
        flags: u32,
    ) -> Result<()> {
        let op = Op::Rename {
            src_parent,
            src_name: src_name.clone(),
            dst_parent,
            dst_name: dst_name.clone(),
            flags,
            // A replaced target open here stays until its last close.
            hold: self.open_files.hold(),
        };
        // The inodes involved change too (ctime; a replaced target loses a
        // link): forget what is known of them.
        let moved = [
            self.cache.entry(src_parent, src_name),
            self.cache.entry(dst_parent, dst_name),
        ];
        let home = self.dentry_server(src_parent, src_name);
        let r = self.call(home, op).await;
        for (ino, _) in moved.into_iter().flatten().flatten() {
            self.cache.forget_attr(ino);
        }
        // Both names are forgotten rather than set: the source name may
        // still exist afterwards (renaming one hard link onto another of
        // the same inode does nothing, as POSIX says; RENAME_EXCHANGE).
        self.cache.forget_entry(dst_parent, dst_name);
        self.cache.forget_entry(src_parent, src_name);
        match &r {
            Ok(Reply::Renamed { touched, verifier }) => {
                self.names_changed(home, touched, *verifier);
            }
            Ok(Reply::Removed {
                ino,
                held: true,
                touched,
                verifier,
                ..
            }) => {
                self.names_changed(home, touched, *verifier);
                self.held(*ino).await;
            }
            _ => {}
        }
        r.map(|_| ())
    }

    pub async fn link(
        &self,
        ino: InodeId,
        new_parent: InodeId,
        new_name: &FileName,
    ) -> Result<Attr> {
        let op = Op::Link {
            ino,
            parent: new_parent,
            name: new_name.clone(),
        };
        let r = async {
            let home = self.dentry_server(new_parent, new_name);
            match self.call(home, op).await? {
                Reply::Linked {
                    entry,
                    touched,
                    verifier,
                } => {
                    self.names_changed(home, &touched, verifier);
                    self.entry_attr(entry).await
                }
                other => Err(ClientError::unexpected("link", &other)),
            }
        }
        .await;
        match &r {
            Ok(a) => self.cache.made(new_parent, new_name, a),
            Err(_) => {
                self.cache.forget_entry(new_parent, new_name);
                self.cache.forget_attr(ino);
            }
        }
        r
    }

    pub async fn readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        let since = self.cache.epoch();
        match self.call(ino.owner(), Op::ReadLink { ino }).await? {
            Reply::Target(t) => {
                self.cache.learned_target(since, ino, &t);
                Ok(t)
            }
            other => Err(ClientError::unexpected("readlink", &other)),
        }
    }

    /// One page of a directory listing: up to `max_per_server` entries from
    /// each server not yet finished, asked concurrently, sorted by name, and
    /// the cursor to continue from. Entries come in name order per server,
    /// not across pages.
    pub async fn readdir_page(
        &self,
        dir: InodeId,
        cursor: &DirCursor,
        max_per_server: u32,
    ) -> Result<(Vec<DirEntry>, DirCursor)> {
        let n = self.server_count();
        let max_entries = max_per_server.clamp(1, limits::READDIR_PAGE_ENTRIES_MAX);
        let calls: Vec<_> = cursor
            .requests(n)?
            .into_iter()
            .map(|(server, after)| async move {
                let op = Op::ReadDir {
                    dir,
                    after,
                    max_entries,
                };
                match self.call(server, op).await? {
                    Reply::DirPage { entries, more } => Ok(Page {
                        server,
                        entries,
                        more,
                    }),
                    other => Err(ClientError::unexpected("readdir", &other)),
                }
            })
            .collect();
        let pages = try_join_bounded(calls, FANOUT_MAX).await?;
        merge_pages(cursor, n, pages)
    }

    /// Every entry of a directory, sorted by name ("." and ".." excluded).
    pub async fn readdir(&self, dir: InodeId) -> Result<Vec<DirEntry>> {
        let mut cursor = DirCursor::new();
        let mut all = Vec::new();
        while !cursor.is_done() {
            let (page, next) = self
                .readdir_page(dir, &cursor, limits::READDIR_PAGE_ENTRIES_MAX)
                .await?;
            all.extend(page);
            cursor = next;
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    async fn statfs_one(&self, server: ServerId) -> Result<FsStats> {
        match self.call(server, Op::StatFs).await? {
            Reply::FsStats(s) => Ok(s),
            other => Err(ClientError::unexpected("statfs", &other)),
        }
    }

    /// Which server serves each replica set now (index: set), as the first
    /// server that answers says; with replicas, sets move in failovers.
    pub async fn routes(&self) -> Result<Vec<ServerId>> {
        Ok(self.replica_sets().await?.0)
    }

    /// `routes`, and how many servers keep each set in sync (empty when
    /// the cluster keeps no replicas).
    pub async fn replica_sets(&self) -> Result<(Vec<ServerId>, Vec<u8>)> {
        let r = self.cluster_routes().await?;
        Ok((r.serving, r.in_sync))
    }

    /// Which server serves each set, how many keep it in sync, and which
    /// servers moved to another address, as the first server that answers
    /// says.
    pub async fn cluster_routes(&self) -> Result<ClusterRoutes> {
        let req = Request {
            creds: (*self.creds).clone(),
            op: Op::GetRoutes,
            once: None,
        };
        let mut last = None;
        for set in self.pool.servers() {
            match self.pool.call_once(set, &req, &[]).await {
                Ok(r) => match r.reply {
                    Reply::Routes {
                        epoch,
                        serving,
                        in_sync,
                        addresses,
                        voters,
                        lost,
                    } => {
                        self.pool.set_addresses(&addresses).await;
                        self.pool.set_routes(epoch, &serving).await;
                        return Ok(ClusterRoutes {
                            serving,
                            in_sync,
                            addresses,
                            voters,
                            lost: lost
                                .into_iter()
                                .map(|(set, ms)| (set, std::time::Duration::from_millis(ms)))
                                .collect(),
                        });
                    }
                    other => return Err(ClientError::unexpected("routes", &other)),
                },
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(
            || ClientError::new(ErrorCode::Unavailable, "no server answered"),
            ClientError::from,
        ))
    }

    /// `statfs_one` of the server that serves `set` now, with no wait for
    /// a failover: a status report shows a down server at once.
    async fn statfs_direct(&self, set: ServerId) -> Result<FsStats> {
        self.counts.record(Op::StatFs.opcode());
        let req = Request {
            creds: (*self.creds).clone(),
            op: Op::StatFs,
            once: None,
        };
        match self.pool.call_once(set, &req, &[]).await?.reply {
            Reply::FsStats(s) => Ok(s),
            other => Err(ClientError::unexpected("statfs", &other)),
        }
    }

    /// Space and inode counts of the whole file system: inodes and data
    /// summed over every set, space as writes can use it (`FsStats::usable`:
    /// a disk servers share counted once, over the copies kept, at the
    /// fullest disk's pace).
    pub async fn statfs(&self) -> Result<FsStats> {
        let all = try_join_bounded(
            self.pool.servers().map(|s| self.statfs_one(s)).collect(),
            FANOUT_MAX,
        )
        .await?;
        Ok(FsStats::usable(&all))
    }

    /// Each server's statistics or why it could not answer. Bounded by the
    /// connect timeout, so a hung server shows as an error, not a hang.
    pub async fn server_stats(&self) -> Vec<(ServerId, Result<FsStats>)> {
        let limit = self.timeouts.connect;
        // Each set where it is served now, after failovers.
        if self.pool.fails_over() {
            let _ = tokio::time::timeout(limit, self.replica_sets()).await;
        }
        let calls = self.pool.servers().map(|s| async move {
            let r = match tokio::time::timeout(limit, self.statfs_direct(s)).await {
                Ok(r) => r,
                Err(_) => Err(ClientError::new(
                    ErrorCode::TimedOut,
                    format!("server {s} did not answer within {limit:?}"),
                )),
            };
            (s, r)
        });
        let calls: Vec<_> = calls.collect();
        join_bounded(calls, usize::MAX).await
    }

    /// Read `len` bytes at `offset` of a file whose size is `file_size`:
    /// exactly `min(len, file_size - offset)` bytes (none at or past the
    /// end). Chunks are read concurrently; holes and short chunks read as
    /// zeros.
    pub async fn read(
        &self,
        ino: InodeId,
        offset: u64,
        len: usize,
        file_size: u64,
    ) -> Result<Vec<u8>> {
        let n = clamp_read(offset, len as u64, file_size);
        let mut buf = vec![0u8; n as usize];
        let pieces = split_range(offset, n, self.chunk_size);
        // Each piece fills its own disjoint part of the buffer as it arrives.
        let mut rest: &mut [u8] = &mut buf;
        let mut parts = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(p.len as usize);
            parts.push(part);
            rest = tail;
        }
        let servers = self.server_count();
        let calls = pieces.iter().zip(parts).map(|(p, dst)| async move {
            let op = Op::Read {
                ino,
                chunk: p.chunk,
                offset: p.offset_in_chunk,
                len: p.len,
            };
            let server = chunk_server(ino, p.chunk, servers);
            let resp = self.call_data(server, op, &[]).await?;
            if !matches!(resp.reply, Reply::Data) {
                return Err(ClientError::unexpected("read", &resp.reply));
            }
            if !fill_piece(dst, &resp.data) {
                return Err(ClientError::protocol(format!(
                    "server {server} returned {} bytes for a read of {}",
                    resp.data.len(),
                    p.len
                )));
            }
            Ok(())
        });
        let calls: Vec<_> = calls.collect();
        try_join_bounded(calls, IN_FLIGHT_PER_CALL).await?;
        Ok(buf)
    }

    /// Write `data` at `offset`, each chunk's piece to its server,
    /// concurrently. The owner grows the size for a write to chunk 0; writes
    /// to other chunks leave the size to `update_size` (see `WriteOutcome`).
    pub async fn write(&self, ino: InodeId, offset: u64, data: &[u8]) -> Result<WriteOutcome> {
        self.write_from(ino, offset, WriteData::Lent(data)).await
    }

    /// `write` of a buffer shared with the caller: each piece is sent from
    /// it as it is (a lent buffer is copied into each request's frame, as
    /// the frame must outlive a caller that is dropped).
    pub async fn write_shared(
        &self,
        ino: InodeId,
        offset: u64,
        data: Arc<Vec<u8>>,
    ) -> Result<WriteOutcome> {
        self.write_from(ino, offset, WriteData::Shared(data)).await
    }

    async fn write_from(
        &self,
        ino: InodeId,
        offset: u64,
        data: WriteData<'_>,
    ) -> Result<WriteOutcome> {
        let bytes = data.as_slice();
        write_end(offset, bytes.len())?;
        // Size and mtime change: a cached stat must not hide that (before
        // and after, so that a getattr racing with the write is not kept).
        self.cache.forget_attr(ino);
        let pieces = split_range(offset, bytes.len() as u64, self.chunk_size);
        let servers = self.server_count();
        let placed: Vec<_> = pieces
            .iter()
            .map(|p| (p, chunk_server(ino, p.chunk, servers)))
            .collect();
        let data = &data;
        let calls = placed.iter().map(|&(p, server)| async move {
            let op = Op::Write {
                ino,
                chunk: p.chunk,
                offset: p.offset_in_chunk,
                file_size: p.file_end(),
            };
            match data {
                WriteData::Lent(d) => self.call_data(server, op, &d[p.buf_range()]).await,
                WriteData::Shared(d) => {
                    self.call_shared(server, op, d.clone(), p.buf_range()).await
                }
            }
        });
        let calls: Vec<_> = calls.collect();
        let sent = try_join_bounded(calls, IN_FLIGHT_PER_CALL).await;
        self.cache.forget_attr(ino);
        let mut written = Unsynced::default();
        for (reply, &(_, server)) in sent?.into_iter().zip(&placed) {
            match reply.reply {
                Reply::Written { verifier } => written.note(server, verifier),
                other => return Err(ClientError::unexpected("write", &other)),
            }
        }
        Ok(WriteOutcome {
            written,
            touched_non_zero_chunk: pieces.iter().any(|p| p.chunk.0 != 0),
        })
    }

    /// Grow the size to at least `size` and set mtime, on the owner.
    pub async fn update_size(&self, ino: InodeId, size: u64, mtime: Timestamp) -> Result<Attr> {
        self.update_size_verified(ino, size, mtime)
            .await
            .map(|(attr, _)| attr)
    }

    /// `update_size`, and the write verifier of the owner's store that
    /// took it (an fsync after it checks it, `Unsynced::check_answers`).
    pub async fn update_size_verified(
        &self,
        ino: InodeId,
        size: u64,
        mtime: Timestamp,
    ) -> Result<(Attr, WriteVerifier)> {
        let r = match self
            .call(ino.owner(), Op::UpdateSize { ino, size, mtime })
            .await
        {
            Ok(Reply::SizeUpdated { attr, verifier }) => Ok((attr, verifier)),
            Ok(other) => Err(ClientError::unexpected("update_size", &other)),
            Err(e) => Err(e),
        };
        match &r {
            Ok((a, _)) => self.cache.changed_attr(a),
            Err(_) => self.cache.forget_attr(ino),
        }
        r
    }

    /// Make everything every server acknowledged durable (syncfs(2), a
    /// directory's fsync). Fails with EIO, once, if a server that this
    /// client changed names on since its last such sync answers with
    /// another write verifier than the changes were: it lost power
    /// meanwhile, and those changes may be gone (the names made may be
    /// missing, the names removed back), as `File::fsync` reports lost
    /// writes.
    pub async fn fsync_all(&self) -> Result<()> {
        let all = self.all_servers();
        let changed = self.names_unsynced().clone();
        let answers = self.fsync_answers(&all).await?;
        self.open_files.servers_synced(&all, &answers, true);
        self.names_unsynced().forget_synced(&changed);
        match changed.first_lost(&all, &answers) {
            None => Ok(()),
            Some(s) => Err(ClientError::new(
                ErrorCode::Io,
                format!(
                    "server {s}'s store restarted after a power loss (or was replaced) since \
                     names were made, removed or renamed on it: those since the last sync of \
                     every server may be lost"
                ),
            )),
        }
    }

    /// A change of names answered by `server` with the tokens of the
    /// directory touches it queued and its store's `verifier`.
    fn names_changed(&self, server: ServerId, touched: &[TouchToken], verifier: WriteVerifier) {
        self.touched.record(touched);
        self.names_unsynced().note(server, verifier);
    }

    fn names_unsynced(&self) -> std::sync::MutexGuard<'_, Unsynced> {
        self.names_unsynced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Make everything these servers acknowledged durable.
    pub async fn fsync_servers(&self, servers: &[ServerId]) -> Result<()> {
        let answers = self.fsync_answers(servers).await?;
        let distinct: std::collections::BTreeSet<ServerId> = servers.iter().copied().collect();
        let all = distinct.len() == self.server_count();
        self.open_files.servers_synced(servers, &answers, all);
        Ok(())
    }

    /// `fsync_servers`, and the write verifier each server answered with,
    /// in order (`Unsynced::check_answers` compares them with the writes').
    pub async fn fsync_answers(&self, servers: &[ServerId]) -> Result<Vec<WriteVerifier>> {
        let replies = try_join_bounded(
            servers.iter().map(|&s| self.call(s, Op::Fsync)).collect(),
            FANOUT_MAX,
        )
        .await?;
        replies
            .into_iter()
            .map(|reply| match reply {
                Reply::Synced { verifier } => Ok(verifier),
                other => Err(ClientError::unexpected("fsync", &other)),
            })
            .collect()
    }
}

/// The bytes of a write: lent by the caller, or shared with it.
enum WriteData<'a> {
    Lent(&'a [u8]),
    Shared(Arc<Vec<u8>>),
}

impl WriteData<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            WriteData::Lent(d) => d,
            WriteData::Shared(d) => d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_send_sync_and_cheap_to_clone() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<Client>();
    }
}
