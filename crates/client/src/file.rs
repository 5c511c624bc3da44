//! An open file: the bookkeeping between open and close that gives
//! close-to-open consistency. Writes to chunk 0 grow the size on the owner as
//! they land; writes to other chunks only reach their chunk servers, so the
//! file remembers that the owner's size (and mtime) needs an `UpdateSize` at
//! close or fsync, and which servers hold unsynced data.

use crate::client::{write_end, Client};
use crate::error::{ClientError, Result};
use crate::writebehind::WriteBehind;
use madfs_proto::message::{SetAttrs, ACCESS_READ, ACCESS_WRITE};
use madfs_proto::ErrorCode;
use madfs_types::{Attr, FileKind, InodeId, ServerId, Timestamp};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// How to open a file, like `std::fs::OpenOptions` (builder by value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    /// Every write goes to the end of the file; implies `write`.
    pub append: bool,
    pub create: bool,
    /// With `create`: fail if the name exists (O_EXCL).
    pub exclusive: bool,
    pub truncate: bool,
    /// Permission bits for a created file. No umask is applied here: the
    /// caller (shell, preload library, FUSE request) knows the right one.
    pub perm: u32,
    /// Writes return once their data is copied and handed to a task
    /// (see `writebehind`); a failure is returned by a later write, fsync
    /// or close of this handle. Reads, truncates, fsync and close through
    /// this handle wait for its writes first; other handles do not (as
    /// across clients: close or fsync before another handle reads).
    pub write_behind: bool,
    /// For a handle open only for reading: while reads keep one length and
    /// one stride (each starting where the last ended, or a fixed distance
    /// after the last one's start), the next `READ_AHEAD_DEPTH` reads are
    /// sent before they are asked for, so
    /// the servers' disks and the network work while the caller uses the
    /// data. A prefetched read reflects the file when it was sent: data
    /// written since by others is seen after reopening (close-to-open),
    /// as through a kernel's read-ahead.
    pub read_ahead: bool,
}

/// Reads a read-ahead handle keeps in flight.
pub const READ_AHEAD_DEPTH: usize = 4;
/// Bytes a read-ahead handle keeps in flight at most.
const READ_AHEAD_MAX_BYTES: usize = 32 << 20;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// Nothing set; `perm` 0o644.
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            create: false,
            exclusive: false,
            truncate: false,
            perm: 0o644,
            write_behind: false,
            read_ahead: false,
        }
    }

    pub fn read(mut self, v: bool) -> Self {
        self.read = v;
        self
    }
    pub fn write(mut self, v: bool) -> Self {
        self.write = v;
        self
    }
    pub fn append(mut self, v: bool) -> Self {
        self.append = v;
        self
    }
    pub fn create(mut self, v: bool) -> Self {
        self.create = v;
        self
    }
    /// Create, failing if the name exists (like std's `create_new`).
    pub fn create_new(mut self, v: bool) -> Self {
        self.create = v;
        self.exclusive = v;
        self
    }
    pub fn exclusive(mut self, v: bool) -> Self {
        self.exclusive = v;
        self
    }
    pub fn truncate(mut self, v: bool) -> Self {
        self.truncate = v;
        self
    }

    pub fn write_behind(mut self, v: bool) -> Self {
        self.write_behind = v;
        self
    }

    pub fn read_ahead(mut self, v: bool) -> Self {
        self.read_ahead = v;
        self
    }

    pub fn perm(mut self, perm: u32) -> Self {
        self.perm = perm & 0o7777;
        self
    }

    /// From open(2) flags and mode (for the preload library and FUSE).
    pub fn from_flags(flags: i32, mode: u32) -> OpenOptions {
        let acc = flags & libc::O_ACCMODE;
        OpenOptions {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            create: flags & libc::O_CREAT != 0,
            exclusive: flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0,
            perm: mode & 0o7777,
            write_behind: false,
            read_ahead: false,
        }
    }

    pub fn writes(&self) -> bool {
        self.write || self.append
    }

    /// Neither read nor write asked: read, as O_RDONLY (which is 0) means.
    pub(crate) fn reads(&self) -> bool {
        self.read || !self.writes()
    }

    /// The access(2) bits this open needs.
    pub fn access_mask(&self) -> u8 {
        let mut mask = 0;
        if self.reads() {
            mask |= ACCESS_READ;
        }
        if self.writes() || self.truncate {
            mask |= ACCESS_WRITE;
        }
        mask
    }
}

impl FileState {
    pub(crate) fn unsynced(&self) -> &crate::Unsynced {
        &self.dirty
    }
}

pub(crate) struct FileState {
    /// The largest size this handle knows of: the size at open, raised by
    /// writes and by fresh attributes.
    pub(crate) size_hint: u64,
    /// Servers that acknowledged writes not yet fsynced, and the store
    /// incarnations that took them.
    dirty: crate::Unsynced,
    /// This handle wrote (its fsync then syncs what it wrote; one that
    /// never did syncs the servers holding the file's chunks).
    wrote: bool,
    /// Writes beyond chunk 0 happened since the last UpdateSize.
    pub(crate) needs_size_update: bool,
    /// When the size was last learned from the owner (at open, or by a
    /// read past it), and the client's epoch then: within the metadata
    /// cache's TTL, and while this client changed nothing, a read past it
    /// is answered as end of file without asking again.
    size_checked: Instant,
    size_epoch: crate::cache::Epoch,
}

/// An open file. Methods take `&self` (state is behind a lock), so one handle
/// may be shared by several threads, as a file descriptor is.
pub struct File {
    client: Client,
    attr: Attr,
    read: bool,
    write: bool,
    append: bool,
    state: Arc<Mutex<FileState>>,
    /// Writes in flight, with `OpenOptions::write_behind`.
    behind: Option<Arc<WriteBehind>>,
    /// Serialises appends through this handle, so two appends never pick
    /// the same end offset.
    append_lock: tokio::sync::Mutex<()>,
    /// Reads sent ahead, with `OpenOptions::read_ahead` on a read-only
    /// handle.
    ahead: Option<Mutex<ReadAhead>>,
    /// The whole file, when its open brought it along (a small file opened
    /// to read: see `Client::open_at`). Served while this client changes
    /// nothing (the cache's epoch): what this or another handle of this
    /// process writes is never hidden by it.
    preloaded: Mutex<Option<Preloaded>>,
}

/// Bytes that came with an open, counted against the client's budget
/// until dropped.
pub(crate) struct Preloaded {
    pub(crate) epoch: crate::cache::Epoch,
    pub(crate) data: Vec<u8>,
    budget: Arc<std::sync::atomic::AtomicU64>,
}

impl Preloaded {
    /// Take `data` into the budget's account.
    pub(crate) fn new(
        epoch: crate::cache::Epoch,
        data: Vec<u8>,
        budget: &Arc<std::sync::atomic::AtomicU64>,
    ) -> Preloaded {
        budget.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Preloaded {
            epoch,
            data,
            budget: budget.clone(),
        }
    }
}

impl Drop for Preloaded {
    fn drop(&mut self) {
        let before = self
            .budget
            .fetch_sub(self.data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        assert!(before >= self.data.len() as u64, "preload budget underflow");
    }
}

/// One read sent ahead: its range, the task doing it, and the client's
/// epoch when it was sent (a change by this client since makes it stale).
struct Prefetch {
    offset: u64,
    len: usize,
    task: tokio::task::JoinHandle<Result<Vec<u8>>>,
    epoch: crate::cache::Epoch,
}

/// The reads a sequential or strided reader will want next, oldest first.
#[derive(Default)]
struct ReadAhead {
    queue: std::collections::VecDeque<Prefetch>,
    /// Where the last read started.
    last: Option<u64>,
}

impl ReadAhead {
    fn clear(&mut self) {
        for p in self.queue.drain(..) {
            p.task.abort();
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.clear();
    }
}

impl Client {
    /// Open an inode (FUSE open): check access for `opts`, truncate if asked.
    /// `opts.create` and `opts.exclusive` are ignored here: creation happens
    /// by name (`create`, or the path-level `open`).
    pub async fn open_inode(&self, ino: InodeId, opts: &OpenOptions) -> Result<File> {
        let attr = self.access(ino, opts.access_mask()).await?;
        self.open_checked(attr, opts, false).await
    }

    /// Finish an open whose access check is done (or not needed, for a file
    /// this open just created).
    pub(crate) async fn open_checked(
        &self,
        attr: Attr,
        opts: &OpenOptions,
        created: bool,
    ) -> Result<File> {
        let mut attr = attr;
        match attr.kind {
            FileKind::Dir if opts.writes() || opts.truncate => {
                return Err(ClientError::new(
                    ErrorCode::IsDir,
                    "cannot open a directory for writing",
                ))
            }
            FileKind::Symlink => {
                return Err(ClientError::new(
                    ErrorCode::Loop,
                    "cannot open a symbolic link",
                ))
            }
            // A FIFO, socket or device needs a kernel to connect its users
            // (the FUSE mount's kernel does it, and never asks us):
            // ENXIO, as opening a socket gives.
            k if k.is_special() => {
                return Err(ClientError::new(
                    ErrorCode::NoDevice,
                    "FIFOs, sockets and devices open only through a mount",
                ))
            }
            _ => {}
        }
        if opts.truncate && !created && attr.kind == FileKind::File && attr.size > 0 {
            let changes = SetAttrs {
                size: Some(0),
                ..SetAttrs::default()
            };
            attr = self
                .setattr_known_size(attr.ino, changes, attr.size)
                .await?;
        }
        Ok(File::new(self, attr, opts))
    }
}

impl File {
    /// A handle on an inode whose access check the caller has done (or does
    /// not need); no request is sent.
    pub fn new(client: &Client, attr: Attr, opts: &OpenOptions) -> File {
        let state = Arc::new(Mutex::new(FileState {
            size_hint: attr.size,
            dirty: crate::Unsynced::default(),
            wrote: false,
            needs_size_update: false,
            size_checked: Instant::now(),
            size_epoch: client.cache.epoch(),
        }));
        let behind = (opts.write_behind && opts.writes()).then(|| Arc::new(WriteBehind::new()));
        // Every handle counts for keeping the file after an unlink.
        client.open_files.opened(attr.ino);
        if opts.writes() {
            // Only writers can know a size their owner does not.
            client
                .open_files
                .register(attr.ino, &state, behind.as_ref());
        }
        File {
            client: client.clone(),
            read: opts.reads(),
            write: opts.writes(),
            append: opts.append,
            state,
            behind,
            ahead: (opts.read_ahead && !opts.writes()).then(|| Mutex::new(ReadAhead::default())),
            attr,
            append_lock: tokio::sync::Mutex::new(()),
            preloaded: Mutex::new(None),
        }
    }

    /// Keep the bytes that came with this handle's open. (A write through
    /// it, as any change by this client, makes them stale: see
    /// `read_preloaded`.)
    pub(crate) fn set_preloaded(&self, p: Preloaded) {
        *self.preloaded.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// Whether the size this handle knows may be taken as the end of file:
    /// learned within the metadata cache's TTL, and this client changed
    /// nothing since (its own writes through other handles must be seen).
    fn size_is_recent(&self) -> bool {
        let st = self.state();
        st.size_epoch == self.client.cache.epoch()
            && st.size_checked.elapsed() < self.client.cache_config().ttl
    }

    /// A read answered from the bytes that came with the open, if they
    /// are still good for it: this client changed nothing since, and the
    /// read ends within them or their size is recent enough to call the
    /// rest end of file (as `read_at` would). Otherwise they are dropped.
    fn read_preloaded(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut slot = self.preloaded.lock().unwrap_or_else(|e| e.into_inner());
        let p = slot.as_ref()?;
        let size = p.data.len() as u64;
        let end = offset.saturating_add(len as u64);
        let usable = self.client.cache.epoch() == p.epoch && (end <= size || self.size_is_recent());
        if !usable {
            *slot = None;
            return None;
        }
        let data = p.data[offset.min(size) as usize..end.min(size) as usize].to_vec();
        if end >= size {
            // Read to its end: a sequential reader is done with it.
            *slot = None;
        }
        Some(data)
    }

    /// The read of exactly `(offset, len)` if it was sent ahead (any other
    /// reads sent ahead are dropped: the reader went elsewhere), and the
    /// stride to predict the next ones by: the distance from the last
    /// read's start, or `len` for a first or backward read.
    fn take_prefetch(&self, offset: u64, len: usize) -> (Option<Prefetch>, u64) {
        let Some(ahead) = &self.ahead else {
            return (None, len as u64);
        };
        let mut ra = ahead.lock().unwrap_or_else(|e| e.into_inner());
        let stride = match ra.last {
            Some(last) if offset > last => offset - last,
            _ => len as u64,
        };
        ra.last = Some(offset);
        let epoch = self.client.cache.epoch();
        let hit = match ra.queue.front() {
            Some(p) if p.offset == offset && p.len == len && p.epoch == epoch => {
                ra.queue.pop_front()
            }
            Some(_) => {
                ra.clear();
                None
            }
            None => None,
        };
        (hit, stride)
    }

    /// Send the reads `stride` apart after the one at `offset` (each `len`
    /// long, starting below `size`) that are not yet in flight.
    fn read_ahead_from(&self, offset: u64, len: usize, stride: u64, size: u64) {
        let Some(ahead) = &self.ahead else { return };
        if len == 0 || stride == 0 {
            return;
        }
        let depth = READ_AHEAD_DEPTH.min((READ_AHEAD_MAX_BYTES / len).max(1));
        let mut ra = ahead.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = ra
            .queue
            .back()
            .map_or(offset, |p| p.offset)
            .saturating_add(stride);
        while ra.queue.len() < depth && next < size {
            let (client, ino, at) = (self.client.clone(), self.attr.ino, next);
            let task = tokio::spawn(async move { client.read(ino, at, len, size).await });
            ra.queue.push_back(Prefetch {
                offset: at,
                len,
                task,
                epoch: self.client.cache.epoch(),
            });
            next = next.saturating_add(stride);
        }
    }

    fn state(&self) -> MutexGuard<'_, FileState> {
        lock_state(&self.state)
    }

    /// Wait for this handle's writes in flight and return the first
    /// failure among them not yet reported.
    async fn drain(&self) -> Result<()> {
        if let Some(wb) = &self.behind {
            wb.drain().await;
            if let Some(e) = wb.take_error() {
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn ino(&self) -> InodeId {
        self.attr.ino
    }

    /// The attributes at open.
    pub fn attr(&self) -> Attr {
        self.attr.clone()
    }

    /// The largest size this handle knows of (size at open, or its writes,
    /// including write-behind writes still in flight).
    pub fn size(&self) -> u64 {
        let landed = self.state().size_hint;
        match &self.behind {
            Some(wb) => landed.max(wb.in_flight_end()),
            None => landed,
        }
    }

    /// Whether writes of this handle may still be in flight (write-behind),
    /// so that `close` is needed before the handle goes away.
    pub fn writes_behind(&self) -> bool {
        self.behind.is_some()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether writes beyond chunk 0 still wait for `close` or `fsync` to
    /// publish the size.
    pub fn needs_size_update(&self) -> bool {
        self.state().needs_size_update
    }

    /// The file was truncated to `size` through another handle of this
    /// client, or by path, after this handle's writes landed: that is its
    /// size now, and the owner holds it, so nothing of this handle's is
    /// left to publish (its close would otherwise merge its older, larger
    /// size back, as sizes merge as a maximum). What it wrote below `size`
    /// stays; its servers still need the next fsync.
    pub fn truncated(&self, size: u64) {
        let mut st = self.state();
        st.size_hint = size;
        st.needs_size_update = false;
    }

    /// Writes through other handles of this client reached `size`, which
    /// the owner may not know yet (beyond chunk 0, not yet published):
    /// reads through this handle must not stop short of it, and a truncate
    /// through it must drop their chunks too.
    pub fn know_size(&self, size: u64) {
        let mut st = self.state();
        st.size_hint = st.size_hint.max(size);
    }

    /// Servers holding writes of this handle not yet fsynced.
    pub fn dirty_servers(&self) -> Vec<ServerId> {
        self.state().dirty.servers()
    }

    /// Read up to `len` bytes at `offset`; shorter only at the end of file.
    /// A read reaching past the size this handle knows asks the owner for
    /// the current size first, so data appended by others (and closed) is
    /// seen, as with `tail -f`; unless that size was learned within the
    /// metadata cache's TTL (as NFS trusts its attribute cache), so that
    /// reading a small file to its end costs no extra request.
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        if !self.read {
            return Err(ClientError::new(
                ErrorCode::BadFileHandle,
                "file not open for reading",
            ));
        }
        if self.attr.kind == FileKind::Dir {
            return Err(ClientError::new(
                ErrorCode::IsDir,
                "cannot read a directory",
            ));
        }
        // Wait for this handle's writes, and those of other handles of the
        // file in this client (their failure is for the next write, fsync or
        // close of their handle to report).
        if let Some(wb) = &self.behind {
            wb.drain().await;
        }
        self.client.open_files.drain_writes(self.attr.ino).await;
        if let Some(data) = self.read_preloaded(offset, len) {
            return Ok(data);
        }
        let (hit, stride) = self.take_prefetch(offset, len);
        if let Some(p) = hit {
            let data = p
                .task
                .await
                .map_err(|e| ClientError::new(ErrorCode::Io, format!("read task failed: {e}")))??;
            // A short prefetch met the end of the file as it was then:
            // read again below, with a fresh size.
            if data.len() == len {
                self.read_ahead_from(offset, len, stride, self.size());
                return Ok(data);
            }
        }
        let mut size = self.size();
        if offset.saturating_add(len as u64) > size && !self.size_is_recent() {
            let epoch = self.client.cache.epoch();
            let truncations = self.client.truncations();
            // With what other handles of this client wrote and not yet
            // published (a read after a write in one process sees it).
            let fresh = self.client.fstat(self.attr.ino).await?;
            let mut st = self.state();
            // Unless a truncate through this client ran meanwhile: the size
            // may be from before it, and kept here it would come back (at
            // this handle's next close, once it writes past chunk 0).
            if self.client.truncations() == truncations {
                st.size_hint = st.size_hint.max(fresh.size);
                st.size_checked = Instant::now();
                st.size_epoch = epoch;
            }
            size = st.size_hint;
        }
        let data = self.client.read(self.attr.ino, offset, len, size).await?;
        if data.len() == len {
            self.read_ahead_from(offset, len, stride, size);
        }
        Ok(data)
    }

    /// Write all of `data` at `offset` (at the end of the file in append
    /// mode) and return its length.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        if !self.write {
            return Err(ClientError::new(
                ErrorCode::BadFileHandle,
                "file not open for writing",
            ));
        }
        if self.append {
            let _serial = self.append_lock.lock().await;
            let end = self.size();
            self.write_inner(end, data).await
        } else {
            self.write_inner(offset, data).await
        }
    }

    /// `write_at` of a buffer the caller gives away: with write-behind the
    /// data is sent from it as it is, without the copy `write_at` makes.
    pub async fn write_owned(&self, offset: u64, data: Vec<u8>) -> Result<usize> {
        match &self.behind {
            Some(wb) if !self.append && self.write && !data.is_empty() => {
                self.write_behind(wb, offset, std::borrow::Cow::Owned(data))
                    .await
            }
            _ => self.write_at(offset, &data).await,
        }
    }

    async fn write_inner(&self, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if let Some(wb) = &self.behind {
            return self
                .write_behind(wb, offset, std::borrow::Cow::Borrowed(data))
                .await;
        }
        let outcome = self.client.write(self.attr.ino, offset, data).await?;
        let mut st = self.state();
        st.size_hint = st.size_hint.max(offset + data.len() as u64);
        st.dirty.merge(&outcome.written);
        st.wrote = true;
        st.needs_size_update |= outcome.touched_non_zero_chunk;
        Ok(data.len())
    }

    /// Start sending `data` (copied unless owned) and return: see
    /// `writebehind`.
    async fn write_behind(
        &self,
        wb: &Arc<WriteBehind>,
        offset: u64,
        data: std::borrow::Cow<'_, [u8]>,
    ) -> Result<usize> {
        if let Some(e) = wb.take_error() {
            return Err(e);
        }
        let end = write_end(offset, data.len())?;
        // From admission on, `size()` (and so an append) counts this
        // write; `size_hint` grows only once it has landed, so a failed
        // write never publishes a size covering bytes nobody wrote.
        let ticket = wb.admit(self.client.write_budget(), offset, end).await;
        let (client, ino, state, wb) = (
            self.client.clone(),
            self.attr.ino,
            self.state.clone(),
            wb.clone(),
        );
        let len = data.len();
        let data = Arc::new(data.into_owned());
        tokio::spawn(async move {
            let result = client.write_shared(ino, offset, data).await.map(|outcome| {
                // Recorded before the ticket is released, so a drain that
                // returns sees what fsync and close must publish.
                let mut st = lock_state(&state);
                st.size_hint = st.size_hint.max(end);
                st.dirty.merge(&outcome.written);
                st.wrote = true;
                st.needs_size_update |= outcome.touched_non_zero_chunk;
            });
            wb.finish(ticket, result);
        });
        Ok(len)
    }

    /// Make this handle's writes durable: data on every server written to,
    /// then the size on the owner, then the owner's log. Data is durable
    /// before the size that exposes it.
    pub async fn fsync(&self) -> Result<()> {
        self.drain().await?;
        // fsync(2) is about the file: what other handles of this client
        // wrote must be durable too.
        self.client.open_files.drain_writes(self.attr.ino).await;
        let (others, unknown) = self.client.open_files.unsynced(self.attr.ino);
        // From reading the size to the owner's taking it, no truncate.
        let _turn = self.client.open_files.publishing(self.attr.ino).await;
        // A truncate's cut reaches every server with chunks past the size.
        let cut = self.client.open_files.take_cut(self.attr.ino);
        let (dirty, size, update, wrote) = {
            let st = self.state();
            let mut dirty = st.dirty.clone();
            dirty.merge(&others);
            (dirty, st.size_hint, st.needs_size_update, st.wrote)
        };
        let mut servers: BTreeSet<ServerId> = dirty.servers().into_iter().collect();
        if cut || unknown {
            servers.extend(self.client.all_servers());
        }
        // fsync(2) makes the file durable whoever wrote it, as a local file
        // system's does: through a handle that wrote nothing (`sync FILE`,
        // a reader's fsync, a file made whole by `create_with_data` or by
        // another process), the servers holding its chunks up to the size
        // it knows are synced (the owner alone for a small file). A handle
        // that wrote syncs what this client wrote: a log appended to and
        // fsynced after each append syncs one server, not every holder.
        // Only this client's writes are checked against verifiers.
        if !wrote {
            servers.extend(self.client.chunk_holders(self.attr.ino, size));
        }
        let owner = self.attr.ino.owner();
        // Outer: the fsync could not be done (nothing forgotten, it is
        // tried again); inner: it was, and found writes a power loss may
        // have taken (reported once, as a kernel reports a writeback error
        // once: forgotten like the writes it synced).
        let synced: Result<Result<()>> = async {
            if update {
                // The owner is synced once, after the size: that covers its data too.
                let others: Vec<ServerId> =
                    servers.iter().copied().filter(|&s| s != owner).collect();
                let answers = self.client.fsync_answers(&others).await?;
                let lost = dirty.check_answers(&others, &answers);
                let (_, verifier) = self
                    .client
                    .update_size_verified(self.attr.ino, size, Timestamp::now())
                    .await?;
                // The size is unsynced metadata too: a power loss between
                // it and the owner's fsync must fail the fsync.
                let mut with_size = dirty.clone();
                with_size.note(owner, verifier);
                let answers = self.client.fsync_answers(&[owner]).await?;
                Ok(lost.and(with_size.check_answers(&[owner], &answers)))
            } else {
                let all: Vec<ServerId> = servers.iter().copied().collect();
                let answers = self.client.fsync_answers(&all).await?;
                Ok(dirty.check_answers(&all, &answers))
            }
        }
        .await;
        let lost = match synced {
            Ok(lost) => lost,
            Err(e) => {
                if cut {
                    self.client.open_files.cut(self.attr.ino);
                }
                return Err(e);
            }
        };
        self.client.open_files.synced(self.attr.ino, &dirty);
        let mut st = self.state();
        // Writes that raced with this fsync stay pending.
        st.dirty.forget_synced(&dirty);
        if update && st.size_hint == size {
            st.needs_size_update = false;
        }
        lost
    }

    /// Set the file size (ftruncate). Chunks this handle wrote beyond the
    /// owner's size are dropped too.
    pub async fn set_len(&self, size: u64) -> Result<Attr> {
        if !self.write {
            return Err(ClientError::new(
                ErrorCode::InvalidArgument,
                "file not open for writing",
            ));
        }
        self.drain().await?;
        let known = self.size();
        // This handle was opened for writing: the owner does not check the
        // mode again (a file made with mode 0 stays writable through the
        // descriptor that made it; see `SetAttrs::via_writable_handle`).
        let changes = SetAttrs {
            size: Some(size),
            via_writable_handle: true,
            ..SetAttrs::default()
        };
        let attr = self
            .client
            .setattr_known_size(self.attr.ino, changes, known)
            .await?;
        let mut st = self.state();
        // The owner now holds the size (and a new mtime): nothing to update.
        st.size_hint = size;
        st.needs_size_update = false;
        Ok(attr)
    }

    /// Publish the size of writes beyond chunk 0 to the owner, so that any
    /// later open sees this handle's data and size. Does not fsync. Call it
    /// before dropping the handle (dropping cannot send requests).
    pub async fn close(&self) -> Result<()> {
        self.drain().await?;
        // From reading the size to the owner's taking it, no truncate.
        let _turn = self.client.open_files.publishing(self.attr.ino).await;
        let (size, update) = {
            let st = self.state();
            (st.size_hint, st.needs_size_update)
        };
        if update {
            self.client
                .update_size(self.attr.ino, size, Timestamp::now())
                .await?;
            let mut st = self.state();
            if st.size_hint == size {
                st.needs_size_update = false;
            }
        }
        Ok(())
    }
}

fn lock_state(state: &Mutex<FileState>) -> MutexGuard<'_, FileState> {
    // The state stays consistent across a panic (plain field updates).
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("File")
            .field("ino", &self.attr.ino)
            .field("read", &self.read)
            .field("write", &self.write)
            .field("append", &self.append)
            .field("size_hint", &st.size_hint)
            .field("dirty", &st.dirty)
            .field("needs_size_update", &st.needs_size_update)
            .finish()
    }
}

impl Drop for File {
    /// A handle dropped without `close` inside a runtime still publishes
    /// its size, in the background and best effort: nobody is left to
    /// report an error to. It leaves the client's table of open files once
    /// nothing of it is left to publish; if it was the last handle of a
    /// file unlinked while open, the file is released then (in the
    /// background inside a runtime; otherwise by the caller's
    /// `Client::release_unlinked`).
    fn drop(&mut self) {
        let ino = self.attr.ino;
        // With write-behind, writes may still be in flight: the size is
        // known only once they land.
        let publish = self.behind.is_some() || lock_state(&self.state).needs_size_update;
        let rt = tokio::runtime::Handle::try_current();
        let (true, Ok(rt)) = (publish, rt) else {
            if self.write {
                self.client.open_files.release(ino, &self.state);
            }
            if self.client.open_files.closed(ino) {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let client = self.client.clone();
                    rt.spawn(async move { client.release_unlinked().await });
                }
            }
            return;
        };
        let (client, state, wb) = (self.client.clone(), self.state.clone(), self.behind.clone());
        rt.spawn(async move {
            if let Some(wb) = wb {
                wb.drain().await;
            }
            {
                let _turn = client.open_files.publishing(ino).await;
                let (update, size) = {
                    let st = lock_state(&state);
                    (st.needs_size_update, st.size_hint)
                };
                if update {
                    let _ = client.update_size(ino, size, Timestamp::now()).await;
                }
            }
            client.open_files.release(ino, &state);
            if client.open_files.closed(ino) {
                let _ = client.release_unlinked().await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_map_to_options_and_masks() {
        let o = OpenOptions::from_flags(libc::O_RDONLY, 0);
        assert!(o.reads() && !o.writes());
        assert_eq!(o.access_mask(), ACCESS_READ);
        let o = OpenOptions::from_flags(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o100640);
        assert!(!o.reads() && o.writes() && o.create && o.exclusive);
        assert_eq!(o.perm, 0o640);
        assert_eq!(o.access_mask(), ACCESS_WRITE);
        let o = OpenOptions::from_flags(libc::O_RDWR | libc::O_APPEND, 0);
        assert!(o.reads() && o.writes() && o.append);
        assert_eq!(o.access_mask(), ACCESS_READ | ACCESS_WRITE);
        // O_EXCL without O_CREAT means nothing for regular files.
        assert!(!OpenOptions::from_flags(libc::O_EXCL, 0).exclusive);
        // No mode at all reads, as O_RDONLY does; append alone writes.
        assert!(OpenOptions::new().reads());
        assert!(OpenOptions::new().append(true).writes());
        assert_eq!(
            OpenOptions::new().read(true).truncate(true).access_mask(),
            ACCESS_READ | ACCESS_WRITE
        );
    }

    #[test]
    fn file_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<File>();
    }
}
