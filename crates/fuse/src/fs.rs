//! The FUSE file system: fuser's `Filesystem` callbacks mapped onto the
//! async `madfs_client::Client`. A synchronous request (lookup, getattr,
//! create, unlink, open, ...: its caller waits for it) is answered by the
//! thread that read it from /dev/fuse, over client connections of that
//! thread (`MadFs::here`), which saves two cross-thread wakeups per
//! request; so are writes, flushes and releases that need not wait.
//! Reads, listings and whatever waits for writes in flight run as tasks
//! on a tokio multi-thread runtime and reply from there (fuser's `Reply*`
//! objects are `Send`), so the kernel can keep many of them in flight.
//! Each request acts with the caller's uid, gid and groups; the servers
//! check permissions against them, and the kernel checks its cached
//! attributes too (`default_permissions`; dirattrs.rs answers its
//! GETATTRs of directories the servers described within the TTL).
//!
//! FUSE inode numbers are MadFS inode numbers (root is 1 on both sides),
//! so there is no inode table and `forget` has nothing to drop.

use crate::convert::{self, file_attr};
use crate::creds::GroupCache;
use crate::dirattrs::DirAttrs;
use crate::handles::{
    is_head_piece, AfterLastDrop, DirHandle, DirState, DirTable, FileTable, HeldWrite, OpenFile,
    QueuedWrite, WriteMode, WriteRange, DIRS_MAX, FILES_MAX,
};
use crate::stats::{FuseOp, Stats};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use madfs_client::writebehind::Ticket;
use madfs_client::{
    Attr, Client, ClientError, ClusterConfig, ClusterKey, Credentials, DirEntry, ErrorCode, File,
    FileKind, InodeId, OpenOptions, SetAttrs, TimeSet, ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE,
    RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// Largest FUSE read and write (the kernel's default cap, fs.fuse.max_pages_limit
/// of 256 pages, is also 1 MiB): one request per `dd bs=1M` block.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Readahead the mount asks for (the kernel may grant less).
pub const MAX_READAHEAD_BYTES: u32 = 1 << 20;
/// Asynchronous requests (readahead, ...) the kernel keeps in flight to us;
/// its default of 12 would cap streaming reads below what the cluster serves.
const MAX_BACKGROUND: u16 = 64;
/// Times getattr asks the owner again while truncates through this mount
/// keep running (`fresh_attr`).
const FRESH_ATTR_TRIES_MAX: u32 = 8;
/// How long a head piece of a split write waits for the rest
/// (handles.rs, `HeldWrite`). The kernel sends the rest as soon as the
/// piece is answered, so it comes within microseconds unless the writer
/// lost its processor; a piece that was a whole write(2) goes alone after
/// this, or at once when something waits for the handle's writes.
const HOLD_MAX: Duration = Duration::from_millis(1);
/// Entries asked of each server per readdir page.
const READDIR_PAGE_PER_SERVER: u32 = 1024;
/// Attributes fetched at once for one readdirplus reply.
const READDIRPLUS_BATCH: usize = 32;

/// How long the kernel may trust attributes and names without asking again.
/// One second bounds how stale another client's changes look (as NFS's
/// default actimeo does), while an `ls -l` or a build does not ask the
/// servers twice for the same inode.
pub const DEFAULT_TTL: Duration = Duration::from_secs(1);

/// A failed operation: the errno for the kernel. Client errors get it from
/// the one mapping in `convert::errno`.
struct Fail(Errno);

impl From<ClientError> for Fail {
    fn from(e: ClientError) -> Fail {
        Fail(convert::errno(&e))
    }
}

type R<T> = Result<T, Fail>;

/// Who sent a request, copied out of it (the request itself stays with the
/// reader thread).
#[derive(Clone, Copy)]
struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Caller {
    fn of(req: &Request) -> Caller {
        Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }
}

/// State shared by every request task.
pub(crate) struct Inner {
    /// The client whose connections the runtime's workers serve: open
    /// files, their reads and write-behind writes use it.
    client: Client,
    /// Where the reader threads' own clients connect (see `MadFs::here`);
    /// None: every request runs as a task on the runtime.
    own_connections: Option<(ClusterConfig, ClusterKey)>,
    files: FileTable,
    dirs: DirTable,
    dir_attrs: DirAttrs,
    groups: GroupCache,
    stats: Stats,
    ttl: Duration,
    /// For telling the kernel its cached attributes are stale; set once the
    /// session exists (it is created after the file system).
    notifier: Arc<OnceLock<Notifier>>,
}

/// The file system given to fuser.
pub struct MadFs {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
}

/// What a thread reading requests from the kernel answers the synchronous
/// ones with (see `MadFs::here`): a runtime without worker threads and a
/// client with connections of its own, which that runtime serves.
struct Local {
    rt: tokio::runtime::Runtime,
    client: Client,
}

thread_local! {
    /// This thread's `Local`, made at its first request (None where it
    /// cannot be: then its requests run as tasks).
    static LOCAL: std::cell::OnceCell<Option<Local>> = const { std::cell::OnceCell::new() };
}

impl MadFs {
    /// A file system over `client`, running its requests on `rt`. With
    /// `own_connections` (the cluster of `client` and its key), the threads
    /// reading the kernel's requests answer the synchronous ones (lookup,
    /// getattr, create, unlink, open, ...) themselves over connections of
    /// their own (`Client::with_own_connections`) instead of handing each
    /// to a task on `rt`.
    pub fn new(
        client: Client,
        rt: tokio::runtime::Handle,
        own_connections: Option<(ClusterConfig, ClusterKey)>,
    ) -> MadFs {
        // The last handle of a file unlinked while open queues its
        // release as it drops; it is sent from the mount's runtime, which
        // always runs, whichever thread dropped it (see `AfterDrop`).
        let releaser = client.clone();
        let on = rt.clone();
        let after_last_drop: AfterLastDrop = Arc::new(move || {
            if releaser.has_unlinked_to_release() {
                let c = releaser.clone();
                on.spawn(async move {
                    if let Err(e) = c.release_unlinked().await {
                        tracing::warn!("madfs fuse: freeing unlinked files: {e}");
                    }
                });
            }
        });
        MadFs {
            inner: Arc::new(Inner {
                client,
                own_connections,
                files: FileTable::new(FILES_MAX, after_last_drop),
                dirs: DirTable::new(DIRS_MAX),
                dir_attrs: DirAttrs::new(DEFAULT_TTL),
                groups: GroupCache::default(),
                stats: Stats::new(),
                ttl: DEFAULT_TTL,
                notifier: Arc::new(OnceLock::new()),
            }),
            rt,
        }
    }

    /// Where to put the session's notifier once the session exists.
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.inner.notifier.clone()
    }

    /// A handle for printing the mount's request counts (`MADFS_STATS`).
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.inner.clone())
    }

    /// Run `op` as a task with the caller's credentials, over the shared
    /// client. For requests that must not hold up the thread that read
    /// them: reads and write-behind (the kernel keeps many in flight),
    /// listings, and whatever waits for writes in flight.
    fn spawn<F, Fut>(&self, req: &Request, op: F)
    where
        F: FnOnce(Arc<Inner>, Client) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let inner = self.inner.clone();
        let who = Caller::of(req);
        self.rt.spawn(async move {
            let c = inner.client_for(who);
            op(inner, c).await
        });
    }

    /// Run `op` to its end on this thread (the one that read the request),
    /// over this thread's own client, with the caller's credentials.
    ///
    /// For the synchronous requests (the caller waits for each, one at a
    /// time). Handed to a task, each cost two more thread switches than
    /// needed: the reader woke a worker, and the server's reply woke a
    /// worker that then answered. Here the thread that read the request
    /// sends it, waits for the reply on its own sockets, and answers: on
    /// this 2-core VM a switch costs about 100 us of CPU (docs/
    /// PERFORMANCE.md). `op` must use only the client it is given for
    /// requests: the shared client's connections are served by the
    /// runtime's workers, and one opened from here would be served by this
    /// thread only while it runs a request. (Open files are made over the
    /// shared client, `Inner::shared`, which sends nothing then.)
    ///
    /// While a reader thread runs a request the others keep reading; none
    /// waits here for anything but servers and writes in flight, never for
    /// another FUSE request, so they cannot deadlock.
    fn here<F, Fut>(&self, req: &Request, op: F)
    where
        F: FnOnce(Arc<Inner>, Client) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let inner = self.inner.clone();
        let who = Caller::of(req);
        // Not on a runtime's thread (block_on would panic there).
        let op = if tokio::runtime::Handle::try_current().is_err() {
            LOCAL.with(|cell| match cell.get_or_init(|| inner.new_local()) {
                Some(local) => {
                    let c = local
                        .client
                        .with_credentials(inner.groups.credentials(who.uid, who.gid, who.pid));
                    local.rt.block_on(op(inner.clone(), c));
                    None
                }
                None => Some(op),
            })
        } else {
            Some(op)
        };
        if let Some(op) = op {
            self.spawn(req, op);
        }
    }
}

/// Prints what the mount was asked and what it asked the servers since the
/// last print (see stats.rs).
#[derive(Clone)]
pub struct StatsHandle(Arc<Inner>);

impl StatsHandle {
    pub fn report(&self) -> String {
        self.0.stats.report(self.0.client.request_counts())
    }
}

fn ino(i: INodeNo) -> InodeId {
    InodeId(i.0)
}

/// Write `data` at `offset` through `f`, then release the writes it
/// carries (one, or a held head piece and its rest): their slots, budget
/// and ranges, with the outcome for the handle's next write, flush or
/// fsync to report.
async fn land(f: Arc<OpenFile>, offset: u64, data: Vec<u8>, claims: Vec<(Ticket, WriteRange)>) {
    let r = f.file.write_at(offset, &data).await.map(|_| ());
    for (ticket, range) in claims {
        f.wb.finish(ticket, r.clone());
        drop(range);
    }
}

/// Send a held head piece alone, on `rt`.
fn send_held(rt: &tokio::runtime::Handle, f: &Arc<OpenFile>, h: HeldWrite) {
    rt.spawn(land(f.clone(), h.offset, h.data, vec![(h.ticket, h.range)]));
}

impl Inner {
    fn client_for(&self, who: Caller) -> Client {
        self.client
            .with_credentials(self.groups.credentials(who.uid, who.gid, who.pid))
    }

    /// The shared client acting as `c` does (for open files: see `here`).
    fn shared(&self, c: &Client) -> Client {
        self.client.with_credentials(c.credentials().clone())
    }

    /// A reader thread's runtime and client (see `MadFs::here`).
    fn new_local(&self) -> Option<Local> {
        let (cfg, key) = self.own_connections.as_ref()?;
        let client = match self.client.with_own_connections(cfg, key.clone()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("madfs fuse: a reader thread's client: {e}");
                return None;
            }
        };
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => Some(Local { rt, client }),
            Err(e) => {
                tracing::warn!("madfs fuse: a reader thread's runtime: {e}");
                None
            }
        }
    }

    /// Attributes as this mount should show them: a file open here for
    /// writing may be longer than its owner knows until close. `before` is
    /// `known_size` sampled before the servers were asked for `a`: a write
    /// that was in flight then may have landed, and left the handle table,
    /// after the servers answered without it. The kernel took that write as
    /// done when it was answered, so a size without it would take the file
    /// back to its earlier length (and the kernel would cut its own size,
    /// and its cached pages, to match).
    fn attr_out(&self, mut a: Attr, before: Option<u64>) -> FileAttr {
        if a.kind == FileKind::File {
            if let Some(size) = before.max(self.files.known_size(a.ino.0)) {
                a.size = a.size.max(size);
            }
        }
        file_attr(&a)
    }

    /// The attributes of `ino` asked of its owner now, with this mount's
    /// writes overlaid (what getattr answers).
    async fn fresh_attr(&self, c: &Client, ino: InodeId) -> R<(Attr, FileAttr)> {
        let mut tries = 0;
        loop {
            // A truncate through this mount while the owner is asked makes
            // the size sampled before stale: ask again (the kernel keeps
            // what it is answered until its TTL runs out).
            let truncations = self.client.truncations();
            let before = self.files.known_size(ino.0);
            let a = c.getattr(ino).await?;
            tries += 1;
            let before = if self.client.truncations() == truncations {
                before
            } else if tries < FRESH_ATTR_TRIES_MAX {
                continue;
            } else {
                None
            };
            let fa = self.attr_out(a.clone(), before);
            return Ok((a, fa));
        }
    }

    /// The attributes for an entry reply (lookup, link, ...), whose inode
    /// was not known before the servers answered, so no size could be
    /// sampled before: for a file open in this mount they are asked again
    /// (`fresh_attr`), which costs a round trip only for open files.
    async fn entry_attr(&self, c: &Client, a: Attr) -> FileAttr {
        if a.kind == FileKind::File && self.files.is_open(a.ino.0) {
            if let Ok((_, fresh)) = self.fresh_attr(c, a.ino).await {
                return fresh;
            }
            // The entry itself was found: answer with it as it came.
        }
        self.attr_out(a, None)
    }

    /// Answer an entry request (lookup, mkdir, link, ...) asked of the
    /// servers at `asked`.
    async fn reply_entry(&self, c: &Client, reply: ReplyEntry, r: R<Attr>, asked: Instant) {
        match r {
            Ok(a) => {
                self.dir_attrs.learned(&a, asked);
                reply.entry(&self.ttl, &self.entry_attr(c, a).await, Generation(0))
            }
            Err(Fail(e)) => reply.error(e),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, r: R<FileAttr>) {
        match r {
            Ok(a) => reply.attr(&self.ttl, &a),
            Err(Fail(e)) => reply.error(e),
        }
    }

    fn file(&self, fh: FileHandle) -> R<Arc<OpenFile>> {
        self.files.get(fh.0).ok_or(Fail(Errno::EBADF))
    }

    /// Wait for the writes in flight through any handle of `ino` (before
    /// reading it or changing its attributes).
    async fn drain_ino(&self, ino: u64) {
        let files = self.files.of_ino(ino);
        for f in &files {
            f.send_held_now();
        }
        for f in files {
            f.wb.drain().await;
        }
    }

    /// Wait for this handle's writes; the first failure among them, if any
    /// not yet reported.
    async fn settle(&self, f: &OpenFile) -> Result<(), ClientError> {
        f.send_held_now();
        f.wb.drain().await;
        match f.wb.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A write that could not be answered at once (`try_write_now`): it
    /// waits for overlapping writes of the inode and for room. `queued`
    /// keeps later writes of the inode from being answered before this one
    /// has claimed its range.
    async fn write(
        &self,
        f: Arc<OpenFile>,
        offset: u64,
        data: Vec<u8>,
        queued: QueuedWrite,
    ) -> R<u32> {
        let len = data.len();
        let end = offset.saturating_add(len as u64);
        // After any overlapping write through another handle of the inode
        // (a head piece held there goes now rather than after its wait).
        for other in self.files.of_ino(f.ino) {
            other.send_held_now();
        }
        let range = self.files.claim_write(f.ino, offset, end).await;
        drop(queued);
        match f.mode {
            WriteMode::Behind => {
                let ticket = f.wb.admit(self.client.write_budget(), offset, end).await;
                tokio::spawn(async move {
                    let r = f.file.write_at(offset, &data).await.map(|_| ());
                    f.wb.finish(ticket, r);
                    drop(range);
                });
            }
            WriteMode::Durable => {
                f.file.write_at(offset, &data).await?;
                drop(range);
                f.file.fsync().await?;
            }
        }
        Ok(len as u32)
    }

    /// Start a write-behind write on `rt` if nothing makes it wait: no
    /// overlapping write of the inode in flight or on its way, a free slot
    /// of the handle and room in the mount's budget. Then the write is
    /// answered by the thread that read it, without a task in between.
    /// The rest of a split write(2) goes out together with its head piece
    /// held back (`HeldWrite`); a head piece is held for its rest.
    fn try_write_now(
        &self,
        rt: &tokio::runtime::Handle,
        f: &Arc<OpenFile>,
        offset: u64,
        data: &[u8],
    ) -> bool {
        if f.mode != WriteMode::Behind {
            return false;
        }
        let held = match f.take_held() {
            Some(h) if h.end() == offset => Some(h),
            Some(h) => {
                send_held(rt, f, h);
                None
            }
            None => None,
        };
        let end = offset.saturating_add(data.len() as u64);
        let claimed = self
            .files
            .try_claim_write(f.ino, offset, end)
            .and_then(|range| {
                let ticket = f.wb.try_admit(self.client.write_budget(), offset, end)?;
                Some((ticket, range))
            });
        let Some(claim) = claimed else {
            if let Some(h) = held {
                send_held(rt, f, h);
            }
            return false;
        };
        if let Some(h) = held {
            let mut joined = Vec::with_capacity(h.data.len() + data.len());
            joined.extend_from_slice(&h.data);
            joined.extend_from_slice(data);
            rt.spawn(land(
                f.clone(),
                h.offset,
                joined,
                vec![(h.ticket, h.range), claim],
            ));
        } else if is_head_piece(offset, data.len()) {
            let (ticket, range) = claim;
            let (id, send_now, before) = f.hold(offset, data.to_vec(), ticket, range);
            if let Some(b) = before {
                send_held(rt, f, b);
            }
            let f = f.clone();
            rt.spawn(async move {
                // Told to go, taken by its rest (the sender dropped), or
                // no rest in time.
                let _ = tokio::time::timeout(HOLD_MAX, send_now).await;
                if let Some(h) = f.take_held_if(id) {
                    land(f.clone(), h.offset, h.data, vec![(h.ticket, h.range)]).await;
                }
            });
        } else {
            rt.spawn(land(f.clone(), offset, data.to_vec(), vec![claim]));
        }
        true
    }

    fn dir(&self, fh: FileHandle) -> R<Arc<DirHandle>> {
        self.dirs.get(fh.0).ok_or(Fail(Errno::EBADF))
    }

    async fn setattr(
        &self,
        c: &Client,
        ino: InodeId,
        changes: SetAttrs,
        fh: Option<FileHandle>,
    ) -> R<Attr> {
        // A write landing after a truncate would bring data back.
        self.drain_ino(ino.0).await;
        if changes.mtime != TimeSet::Omit {
            // Publish the size of this mount's writes first: publishing
            // sets mtime to "now", and must not undo a `touch -d` or the
            // utimensat of `cp -a` / `tar x` made before close.
            for f in self.files.of_ino(ino.0) {
                f.file.close().await?;
            }
        }
        let e = match self.setattr_as(c, ino, changes.clone(), fh).await {
            Ok(a) => return Ok(a),
            Err(e) => e,
        };
        let Some(new_perm) = changes.perm.filter(|_| e.code == ErrorCode::NotPermitted) else {
            return Err(e.into());
        };
        // A write or truncate by someone other than the owner makes the
        // kernel clear setuid/setgid through a chmod in the caller's name
        // (without FUSE_HANDLE_KILLPRIV), which the servers refuse to a
        // non-owner. Dropping those bits never grants anything, so the
        // mount does that part with its own authority; the rest of the
        // change still runs with the caller's credentials.
        let cur = c.getattr(ino).await?;
        if !only_drops_setid(cur.perm, new_perm) {
            return Err(e.into());
        }
        let mut rest = changes;
        rest.perm = None;
        if rest != SetAttrs::default() {
            self.setattr_as(c, ino, rest, fh).await?;
        }
        let root = self.client.with_credentials(Credentials::root());
        let kill = SetAttrs {
            perm: Some(new_perm),
            ..SetAttrs::default()
        };
        Ok(root.setattr(ino, kill).await?)
    }

    async fn setattr_as(
        &self,
        c: &Client,
        ino: InodeId,
        mut changes: SetAttrs,
        fh: Option<FileHandle>,
    ) -> Result<Attr, ClientError> {
        let mut last = None;
        if let (Some(size), Some(fh)) = (changes.size, fh) {
            // ftruncate: through the open file, so its own record of what it
            // wrote (and must publish at close) agrees with the new size.
            let f = self
                .files
                .get(fh.0)
                .ok_or_else(|| ClientError::new(ErrorCode::BadFileHandle, "unknown handle"))?;
            // Chunks written through other handles of this mount, past
            // what the owner knows, must go too.
            self.files.share_known_size(ino.0, &f.file);
            last = Some(f.file.set_len(size).await?);
            self.truncated(ino, size);
            changes.size = None;
        } else if let Some(size) = changes.size {
            // truncate by name: chunks written through handles of this mount
            // but not yet published must go too.
            let known = self.files.known_size(ino.0).unwrap_or(0);
            let a = c.setattr_known_size(ino, changes, known).await?;
            self.truncated(ino, size);
            return Ok(a);
        }
        let rest = changes.perm.is_some()
            || changes.uid.is_some()
            || changes.gid.is_some()
            || changes.atime != TimeSet::Omit
            || changes.mtime != TimeSet::Omit;
        if rest || last.is_none() {
            last = Some(c.setattr(ino, changes).await?);
        }
        Ok(last.expect("set above"))
    }

    /// O_APPEND is left to the kernel, which sends each append with the
    /// offset of the end of file as this mount knows it; the client's own
    /// append mode would use the size this one handle knows, and two
    /// handles appending in turn would overwrite each other.
    async fn open(&self, c: &Client, ino: InodeId, flags: i32) -> R<u64> {
        let opts = OpenOptions::from_flags(flags & !libc::O_APPEND, 0);
        let file = self.open_existing(c, ino, &opts).await?;
        // Close-to-open for attributes too: the kernel may hold a size and
        // mtime cached from before another client's close (up to the TTL);
        // it would read up to the old size and show the old mtime. Drop
        // them, so the next stat or read past them asks again (what NFS
        // does with a GETATTR at open). Attributes only (offset -1: no
        // page is touched, so this never waits for a page a read holds
        // locked): the page cache goes anyway, as the open does not keep it.
        if let Some(n) = self.notifier.get() {
            // ENOENT (inode not in the kernel's cache) is fine.
            let _ = n.inval_inode(INodeNo(ino.0), -1, 0);
        }
        self.register(file, flags)
    }

    /// Open an existing inode: check access (the owner's Access request,
    /// which also brings the attributes as they are now: close-to-open);
    /// with O_TRUNC, cut it to 0, and the handles of this mount already
    /// open on it learn the new size (see `truncated`), and chunks they
    /// wrote past what the owner knows go too. Requests go through `c`;
    /// the handle is made over the shared client (see `MadFs::here`).
    async fn open_existing(&self, c: &Client, ino: InodeId, opts: &OpenOptions) -> R<File> {
        let mut attr = c.access(ino, opts.access_mask()).await?;
        match attr.kind {
            FileKind::Dir if opts.writes() || opts.truncate => return Err(Fail(Errno::EISDIR)),
            FileKind::Symlink => return Err(Fail(Errno::ELOOP)),
            _ => {}
        }
        if opts.truncate && attr.kind == FileKind::File {
            // A write landing after the truncate would bring data back.
            self.drain_ino(ino.0).await;
            let known = attr.size.max(self.files.known_size(ino.0).unwrap_or(0));
            if known > 0 {
                let to_zero = SetAttrs {
                    size: Some(0),
                    ..SetAttrs::default()
                };
                attr = c.setattr_known_size(ino, to_zero, known).await?;
            }
            self.truncated(ino, 0);
        }
        Ok(File::new(&self.shared(c), attr, opts))
    }

    /// The inode was truncated to `size` in this mount: every handle of it
    /// here takes that as its size and drops its pending size update.
    /// Otherwise a handle that wrote past chunk 0 (its size not yet
    /// published) would publish its older, larger size at close or fsync,
    /// and the owner, merging sizes as a maximum, would grow the file
    /// again, over zeros; getattr would show that size meanwhile. Writes
    /// were drained before the truncate, and the kernel sends none during
    /// it, so what those handles wrote below `size` is on the servers.
    fn truncated(&self, ino: InodeId, size: u64) {
        self.files.truncated(ino.0, size);
    }

    fn register(&self, file: File, flags: i32) -> R<u64> {
        self.files
            .insert(file, WriteMode::from_flags(flags))
            .map_err(Fail)
    }

    async fn create(
        &self,
        c: &Client,
        parent: InodeId,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> R<(FileAttr, u64)> {
        let name = convert::name(name)?;
        // The kernel has applied the umask already unless it was asked not
        // to (FUSE_DONT_MASK, never requested here); masking again is a no-op
        // then and correct otherwise.
        let perm = mode & !umask & 0o7777;
        let opts = OpenOptions::from_flags(flags & !libc::O_APPEND, perm);
        let (attr, created) = c.create(parent, &name, perm, opts.exclusive).await?;
        let file = if created {
            // A new file: its creator may write it whatever its mode.
            File::new(&self.shared(c), attr, &opts)
        } else {
            // Someone made the name between the kernel's lookup and now:
            // open the existing file as open(2) without O_EXCL would.
            if attr.kind != FileKind::File {
                return Err(Fail(Errno::EEXIST));
            }
            self.open_existing(c, attr.ino, &opts).await?
        };
        let attr = if created {
            self.attr_out(file.attr(), None)
        } else {
            // Other handles of this mount may be writing it.
            self.entry_attr(c, file.attr()).await
        };
        let fh = self.register(file, flags)?;
        Ok((attr, fh))
    }

    /// Fill a readdir reply from `offset` on: 0 is ".", 1 is "..", n >= 2
    /// is entry n - 2 of the listing; each entry carries the offset of the
    /// one after it, as the kernel expects.
    async fn readdir(
        &self,
        c: &Client,
        d: &DirHandle,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> R<()> {
        let mut st = d.state.lock().await;
        rewind_if_restarted(&mut st, offset);
        let mut i = offset as usize;
        loop {
            while i < st.entries.len() + 2 {
                let (e_ino, kind, name): (u64, FileType, &[u8]) = match i {
                    0 => (d.ino.0, FileType::Directory, b"."),
                    1 => (dotdot(d.ino), FileType::Directory, b".."),
                    n => {
                        let e = &st.entries[n - 2];
                        (e.ino.0, convert::kind(e.kind), e.name.as_bytes())
                    }
                };
                if reply.add(
                    INodeNo(e_ino),
                    (i + 1) as u64,
                    kind,
                    OsStr::from_bytes(name),
                ) {
                    return Ok(()); // buffer full; the kernel asks again from i
                }
                i += 1;
            }
            if st.done() {
                return Ok(());
            }
            if let Err(e) = fetch_page(c, d.ino, &mut st).await {
                // What was added is still a valid partial answer.
                if i > offset as usize {
                    return Ok(());
                }
                return Err(e);
            }
        }
    }

    /// readdir with attributes, so `ls -l` needs no lookup per entry. The
    /// attributes of a batch of entries are fetched concurrently; entries
    /// removed in the meantime are skipped.
    async fn readdirplus(
        &self,
        c: &Client,
        d: &DirHandle,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> R<()> {
        let mut st = d.state.lock().await;
        rewind_if_restarted(&mut st, offset);
        let mut i = offset as usize;
        let mut added = false;
        if i < 2 {
            let me = file_attr(&c.getattr(d.ino).await?);
            while i < 2 {
                let name: &[u8] = if i == 0 { b"." } else { b".." };
                if reply.add(
                    INodeNo(me.ino.0),
                    (i + 1) as u64,
                    OsStr::from_bytes(name),
                    &self.ttl,
                    &me,
                    Generation(0),
                ) {
                    return Ok(());
                }
                i += 1;
                added = true;
            }
        }
        loop {
            while st.entries.len() + 2 <= i && !st.done() {
                if let Err(e) = fetch_page(c, d.ino, &mut st).await {
                    return if added { Ok(()) } else { Err(e) };
                }
            }
            if st.entries.len() + 2 <= i {
                return Ok(()); // end of directory
            }
            let batch: Vec<DirEntry> = st.entries[i - 2..]
                .iter()
                .take(READDIRPLUS_BATCH)
                .cloned()
                .collect();
            let before: Vec<Option<u64>> = batch
                .iter()
                .map(|e| self.files.known_size(e.ino.0))
                .collect();
            let attrs = getattr_all(c, &batch).await;
            for ((e, a), before) in batch.iter().zip(attrs).zip(before) {
                match a {
                    Ok(a) => {
                        let fa = self.attr_out(a, before);
                        if reply.add(
                            INodeNo(e.ino.0),
                            (i + 1) as u64,
                            OsStr::from_bytes(e.name.as_bytes()),
                            &self.ttl,
                            &fa,
                            Generation(0),
                        ) {
                            return Ok(());
                        }
                        added = true;
                    }
                    // Removed since the listing was read: not listed.
                    Err(err) if err.code == ErrorCode::NotFound => {}
                    Err(err) => {
                        return if added { Ok(()) } else { Err(err.into()) };
                    }
                }
                i += 1;
            }
        }
    }

    async fn statfs(&self, c: &Client) -> R<[u64; 5]> {
        let s = c.statfs().await?;
        let bsize = u64::from(STATFS_BLOCK);
        let blocks = s.bytes_total / bsize;
        let bfree = s.bytes_free / bsize;
        let bavail = s.bytes_avail / bsize;
        // There is no inode table to run out of: a file costs a RocksDB
        // record. Free inodes are reported as free blocks, so `df -i` shows
        // a sensible use fraction.
        let ffree = bavail;
        let files = s.inodes.saturating_add(ffree);
        Ok([blocks, bfree, bavail, files, ffree])
    }

    /// Close every open file, publishing sizes (at unmount).
    async fn close_all(&self) {
        for f in self.files.drain() {
            let settled = self.settle(&f).await;
            if let Err(e) = settled.and(f.file.close().await) {
                tracing::warn!("madfs fuse: closing inode {} at unmount: {e}", f.ino);
            }
        }
        // Files unlinked while open, now closed: free them before the
        // runtime goes (a task spawned by their drop might not run).
        if let Err(e) = self.client.release_unlinked().await {
            tracing::warn!("madfs fuse: freeing unlinked files at unmount: {e}");
        }
    }
}

/// Whether `new` is `old` with only setuid and/or setgid removed.
fn only_drops_setid(old: u32, new: u32) -> bool {
    const SETID: u32 = 0o6000;
    new & !SETID == old & !SETID && new & SETID & !old == 0 && new != old
}

/// Block size reported by statfs (the counts are in these units).
const STATFS_BLOCK: u32 = 4096;

/// The ".." entry's inode number. The parent of a directory is not
/// recorded anywhere the client can ask cheaply, so every directory but
/// the root names itself; the kernel never uses this number to find the
/// parent (it resolves ".." through its own dentry tree).
fn dotdot(dir: InodeId) -> u64 {
    dir.0
}

/// A readdir at offset 0 after entries were read is a rewinddir: start a
/// fresh listing so it shows what changed since.
fn rewind_if_restarted(st: &mut DirState, offset: u64) {
    if offset == 0 && st.started {
        *st = DirState::default();
    }
}

async fn fetch_page(c: &Client, dir: InodeId, st: &mut DirState) -> R<()> {
    let (page, next) = c
        .readdir_page(dir, &st.cursor, READDIR_PAGE_PER_SERVER)
        .await?;
    st.entries.extend(page);
    st.cursor = next;
    st.started = true;
    Ok(())
}

/// Attributes of every entry, fetched concurrently, in order.
async fn getattr_all(c: &Client, entries: &[DirEntry]) -> Vec<Result<Attr, ClientError>> {
    let tasks: Vec<_> = entries
        .iter()
        .map(|e| {
            let (c, ino) = (c.clone(), e.ino);
            tokio::spawn(async move { c.getattr(ino).await })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| {
            Err(ClientError::new(
                ErrorCode::Io,
                format!("getattr task failed: {e}"),
            ))
        }));
    }
    out
}

fn access_mask(mask: AccessFlags) -> u8 {
    let mut m = 0;
    if mask.contains(AccessFlags::R_OK) {
        m |= ACCESS_READ;
    }
    if mask.contains(AccessFlags::W_OK) {
        m |= ACCESS_WRITE;
    }
    if mask.contains(AccessFlags::X_OK) {
        m |= ACCESS_EXEC;
    }
    m
}

/// Ask the kernel for a capability it may not have; a missing one only
/// costs performance, so it is not an error.
fn want(config: &mut KernelConfig, flag: InitFlags) {
    let _ = config.add_capabilities(flag);
}

fn reply_empty(reply: ReplyEmpty, r: R<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(Fail(e)) => reply.error(e),
    }
}

impl Filesystem for MadFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_WRITE_BYTES) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD_BYTES) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        // open(O_TRUNC) in one request instead of setattr + open.
        want(config, InitFlags::FUSE_ATOMIC_O_TRUNC);
        // Lookups and creates in one directory run concurrently (the
        // servers serialise what must be serialised).
        want(config, InitFlags::FUSE_PARALLEL_DIROPS);
        // readdirplus when it pays (the kernel's heuristic: at the start of
        // a listing, and after lookups of its entries, i.e. `ls -l`).
        want(
            config,
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
        );
        // A symlink's target never changes: the kernel may cache it.
        want(config, InitFlags::FUSE_CACHE_SYMLINKS);
        // No FUSE_WRITEBACK_CACHE: with it the kernel keeps its own idea of
        // the size and mtime and writes back after close, which breaks the
        // close-to-open consistency other clients rely on (a reader on
        // another node would not see the data at its open).
        Ok(())
    }

    fn destroy(&mut self) {
        let inner = self.inner.clone();
        // Bounded: an unreachable cluster must not keep the daemon alive.
        let _ = self.rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(30), inner.close_all()).await
        });
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.inner.stats.record(FuseOp::Lookup);
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = async {
                let name = convert::name(&name)?;
                Ok(c.lookup(ino(parent), &name).await?)
            }
            .await;
            fs.reply_entry(&c, reply, r, asked).await
        });
    }

    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {
        self.inner.stats.record(FuseOp::Forget);
        self.inner.stats.record_inline(FuseOp::Forget);
        // Inode numbers are MadFS's own: nothing is kept per looked-up inode.
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.inner.stats.record(FuseOp::GetAttr);
        // A directory the servers described within the TTL (dirattrs.rs):
        // asked again after every create or unlink in it.
        if let Some((a, left)) = self.inner.dir_attrs.get(i.0) {
            self.inner.stats.record_inline(FuseOp::GetAttr);
            reply.attr(&left, &file_attr(&a));
            return;
        }
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = fs.fresh_attr(&c, ino(i)).await;
            if let Ok((a, _)) = &r {
                fs.dir_attrs.learned(a, asked);
            }
            fs.reply_attr(reply, r.map(|(_, fa)| fa))
        });
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.inner.stats.record(FuseOp::SetAttr);
        let changes = SetAttrs {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: convert::time_set(atime),
            mtime: convert::time_set(mtime),
            // ftruncate goes through the handle (`setattr_as`), which says so.
            via_writable_handle: false,
        };
        // A task: it may wait for writes in flight and publish sizes
        // through open files (the shared client).
        self.spawn(req, move |fs, c| async move {
            // No size to sample before: writes to the inode were drained,
            // and the kernel sends none during a setattr (inode lock).
            let asked = Instant::now();
            let r = fs.setattr(&c, ino(i), changes, fh).await;
            match &r {
                Ok(a) => fs.dir_attrs.replaced(a, asked),
                // It may have changed all the same (a reply lost).
                Err(_) => fs.dir_attrs.changed(i.0),
            }
            fs.reply_attr(reply, r.map(|a| fs.attr_out(a, None)))
        });
    }

    fn readlink(&self, req: &Request, i: INodeNo, reply: ReplyData) {
        self.inner.stats.record(FuseOp::ReadLink);
        self.here(req, move |_fs, c| async move {
            match c.readlink(ino(i)).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(convert::errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.inner.stats.record(FuseOp::MkNod);
        // FIFOs, sockets and devices are a name and attributes in MadFS
        // (with rdev for devices); the kernel serves their opens itself.
        let Some(kind) =
            FileKind::from_mode(mode).filter(|k| *k == FileKind::File || k.is_special())
        else {
            reply.error(Errno::EINVAL);
            return;
        };
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = async {
                let name = convert::name(&name)?;
                let perm = mode & !umask & 0o7777;
                if kind.is_special() {
                    return Ok(c.mknod_at(ino(parent), &name, kind, perm, rdev).await?);
                }
                Ok(c.create(ino(parent), &name, perm, true).await?.0)
            }
            .await;
            fs.dir_attrs.changed(parent.0);
            fs.reply_entry(&c, reply, r, asked).await
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.inner.stats.record(FuseOp::MkDir);
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = async {
                let name = convert::name(&name)?;
                Ok(c.mkdir_at(ino(parent), &name, mode & !umask & 0o7777)
                    .await?)
            }
            .await;
            fs.dir_attrs.changed(parent.0);
            fs.reply_entry(&c, reply, r, asked).await
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.inner.stats.record(FuseOp::Unlink);
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let r = async {
                let name = convert::name(&name)?;
                Ok(c.unlink(ino(parent), &name).await?)
            }
            .await;
            // Whatever the outcome (a lost reply may hide a change): before
            // the kernel can ask for the parent again (dirattrs.rs).
            fs.dir_attrs.changed(parent.0);
            reply_empty(reply, r)
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.inner.stats.record(FuseOp::RmDir);
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let r = async {
                let name = convert::name(&name)?;
                Ok(c.rmdir(ino(parent), &name).await?)
            }
            .await;
            // The parent, and the directory removed, whose inode is not
            // known here: every directory (dirattrs.rs).
            fs.dir_attrs.changed_all();
            reply_empty(reply, r)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.inner.stats.record(FuseOp::Symlink);
        let name = link_name.to_owned();
        let target = target.as_os_str().as_bytes().to_vec();
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = async {
                let name = convert::name(&name)?;
                Ok(c.symlink_at(ino(parent), &name, &target).await?)
            }
            .await;
            fs.dir_attrs.changed(parent.0);
            fs.reply_entry(&c, reply, r, asked).await
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::Rename);
        let mut wire = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            wire |= RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            wire |= RENAME_EXCHANGE;
        }
        // RENAME_WHITEOUT (overlayfs) and unknown bits: EINVAL, as Linux
        // answers for flags a file system does not support.
        if flags.bits() & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.here(req, move |fs, c| async move {
            let r = async {
                let from = convert::name(&name)?;
                let to = convert::name(&newname)?;
                Ok(c.rename_at(ino(parent), &from, ino(newparent), &to, wire)
                    .await?)
            }
            .await;
            // Both parents, and a directory moved (its ctime) or replaced
            // (gone), not known here by inode: every directory.
            fs.dir_attrs.changed_all();
            reply_empty(reply, r)
        });
    }

    fn link(
        &self,
        req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.inner.stats.record(FuseOp::Link);
        let newname = newname.to_owned();
        self.here(req, move |fs, c| async move {
            let asked = Instant::now();
            let r = async {
                let name = convert::name(&newname)?;
                Ok(c.link(ino(i), ino(newparent), &name).await?)
            }
            .await;
            fs.dir_attrs.changed(newparent.0);
            fs.reply_entry(&c, reply, r, asked).await
        });
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.inner.stats.record(FuseOp::Open);
        self.here(req, move |fs, c| async move {
            // No FOPEN_KEEP_CACHE: the kernel drops its cached pages at every
            // open, so an open sees what others closed before (close-to-open).
            match fs.open(&c, ino(i), flags.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.inner.stats.record(FuseOp::Read);
        // A task: the kernel keeps many reads in flight (readahead).
        self.spawn(req, move |fs, _c| async move {
            let r = async {
                let f = fs.file(fh)?;
                // Reads see every write this mount has answered, also
                // those through other handles past what the owner knows
                // (beyond chunk 0, not yet published): the read must not
                // stop at the owner's size (a short read would make the
                // kernel cut its size of the file there).
                fs.drain_ino(f.ino).await;
                fs.files.share_known_size(f.ino, &f.file);
                Ok(f.file.read_at(offset, size as usize).await?)
            }
            .await;
            match r {
                Ok(data) => reply.data(&data),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.inner.stats.record(FuseOp::Write);
        let Some(f) = self.inner.files.get(fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        if let Some(e) = f.wb.take_error() {
            reply.error(convert::errno(&e));
            return;
        }
        // Answered here when nothing makes it wait (the usual case: the
        // kernel sends the next write to the inode only once this one is
        // answered); the data is copied once, for the task that sends it.
        if self.inner.try_write_now(&self.rt, &f, offset, data) {
            self.inner.stats.record_inline(FuseOp::Write);
            reply.written(data.len() as u32);
            return;
        }
        // The request buffer is reused for the next request as soon as this
        // returns, so the data is copied once for the task.
        let data = data.to_vec();
        let queued = self.inner.files.queue_write(f.ino);
        self.spawn(req, move |fs, _c| async move {
            match fs.write(f, offset, data, queued).await {
                Ok(n) => reply.written(n),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::Flush);
        // Every close(2) flushes: publish the size now, so that once close
        // returns any other client's open sees the data (release comes
        // later, asynchronously).
        let Some(f) = self.inner.files.get(fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        // Nothing in flight and nothing to publish (a handle only read, or
        // whose writes all went to chunk 0, which the owner holds): answered
        // here, with the failure of an earlier write if there was one.
        if f.is_settled() {
            self.inner.stats.record_inline(FuseOp::Flush);
            match f.wb.take_error() {
                Some(e) => reply.error(convert::errno(&e)),
                None => reply.ok(),
            }
            return;
        }
        self.spawn(req, move |fs, _c| async move {
            let r = async {
                fs.settle(&f).await?;
                Ok(f.file.close().await?)
            }
            .await;
            reply_empty(reply, r)
        });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::Release);
        let Some(f) = self.inner.files.remove(fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        // Normally nothing is left: flush published everything already.
        if f.is_settled() {
            self.inner.stats.record_inline(FuseOp::Release);
            match f.wb.take_error() {
                Some(e) => reply.error(convert::errno(&e)),
                None => reply.ok(),
            }
            // The last handle of a file unlinked while open frees it (from
            // wherever its last reference drops: `AfterDrop`).
            return;
        }
        self.spawn(req, move |fs, _c| async move {
            let r = async {
                fs.settle(&f).await?;
                Ok(f.file.close().await?)
            }
            .await;
            reply_empty(reply, r);
        });
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::Fsync);
        self.spawn(req, move |fs, _c| async move {
            let r = async {
                let f = fs.file(fh)?;
                // fsync(2) is about the file: writes through the inode's
                // other handles (mmap writeback picks any) must land first.
                fs.drain_ino(f.ino).await;
                fs.settle(&f).await?;
                Ok(f.file.fsync().await?)
            }
            .await;
            reply_empty(reply, r)
        });
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.inner.stats.record(FuseOp::OpenDir);
        self.inner.stats.record_inline(FuseOp::OpenDir);
        // Nothing is asked of the servers yet: the first readdir fetches
        // the first page (and checks read permission there).
        match self.inner.dirs.insert(ino(i)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.inner.stats.record(FuseOp::ReadDir);
        self.spawn(req, move |fs, c| async move {
            let r = async {
                let d = fs.dir(fh)?;
                fs.readdir(&c, &d, offset, &mut reply).await
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.inner.stats.record(FuseOp::ReadDirPlus);
        self.spawn(req, move |fs, c| async move {
            let r = async {
                let d = fs.dir(fh)?;
                fs.readdirplus(&c, &d, offset, &mut reply).await
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::ReleaseDir);
        self.inner.stats.record_inline(FuseOp::ReleaseDir);
        self.inner.dirs.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.stats.record(FuseOp::FsyncDir);
        // A directory's entries live on every server (hashed by name), and
        // metadata reaches each server's log unsynced: sync them all (and
        // report names a power loss may have taken: `fsync_all`).
        self.spawn(req, move |_fs, c| async move {
            let r = c.fsync_all().await.map_err(Fail::from);
            reply_empty(reply, r)
        });
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.inner.stats.record(FuseOp::StatFs);
        self.here(req, move |fs, c| async move {
            match fs.statfs(&c).await {
                Ok([blocks, bfree, bavail, files, ffree]) => reply.statfs(
                    blocks,
                    bfree,
                    bavail,
                    files,
                    ffree,
                    STATFS_BLOCK,
                    madfs_client::limits::NAME_MAX_BYTES as u32,
                    STATFS_BLOCK,
                ),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }

    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.inner.stats.record(FuseOp::Access);
        // F_OK (no bits) asks only whether the inode exists.
        let m = access_mask(mask);
        self.here(req, move |_fs, c| async move {
            let r = c.access(ino(i), m).await.map(|_| ()).map_err(Fail::from);
            reply_empty(reply, r)
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.inner.stats.record(FuseOp::Create);
        let name = name.to_owned();
        self.here(req, move |fs, c| async move {
            let r = fs.create(&c, ino(parent), &name, mode, umask, flags).await;
            fs.dir_attrs.changed(parent.0);
            match r {
                Ok((attr, fh)) => reply.created(
                    &fs.ttl,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(Fail(e)) => reply.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_map_to_the_wire() {
        assert_eq!(access_mask(AccessFlags::F_OK), 0);
        assert_eq!(
            access_mask(AccessFlags::R_OK | AccessFlags::X_OK),
            ACCESS_READ | ACCESS_EXEC
        );
        assert_eq!(access_mask(AccessFlags::W_OK), ACCESS_WRITE);
    }

    #[test]
    fn only_setid_removal_counts_as_kill_priv() {
        assert!(only_drops_setid(0o6777, 0o0777));
        assert!(only_drops_setid(0o6755, 0o2755));
        assert!(!only_drops_setid(0o6755, 0o6755));
        assert!(!only_drops_setid(0o0755, 0o4755));
        assert!(!only_drops_setid(0o6755, 0o0700));
    }

    #[test]
    fn rewind_resets_only_a_started_listing() {
        let mut st = DirState::default();
        rewind_if_restarted(&mut st, 0);
        assert!(!st.started);
        st.started = true;
        st.entries.push(DirEntry {
            name: madfs_client::FileName::new(b"a").unwrap(),
            ino: InodeId(7),
            kind: FileKind::File,
        });
        rewind_if_restarted(&mut st, 3);
        assert_eq!(st.entries.len(), 1);
        rewind_if_restarted(&mut st, 0);
        assert!(st.entries.is_empty() && !st.started);
    }
}
