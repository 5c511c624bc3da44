//! Handle tables: FUSE file handles (`fh`) name open `madfs_client::File`s
//! and directory listings in progress. Ids come from a counter and are never
//! reused while the mount lives, so a stale fh can never reach another
//! file's handle. Both tables are bounded: a program leaking descriptors
//! gets ENFILE from open/opendir instead of growing the daemon without limit.
//! The file table also orders overlapping writes to one inode across its
//! handles (`InodeWrites`).

use fuser::Errno;
use madfs_client::writebehind::{Ticket, WriteBehind};
use madfs_client::{DirCursor, DirEntry, File, InodeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{oneshot, Notify};

/// Open files per mount. One kernel file description is one handle, so this
/// is the mount-wide limit on open files (the kernel's own default
/// fs.file-max is far larger, but a single user-space daemon is not a
/// kernel).
pub const FILES_MAX: usize = 1 << 16;
/// Directory listings in progress per mount.
pub const DIRS_MAX: usize = 1 << 14;

/// How a handle's writes are carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Answered once handed to a task (see writebehind.rs). Appends too:
    /// the kernel gives each O_APPEND write the offset of its own idea of
    /// the end of file (kept exact for this mount by the write replies,
    /// under the inode lock), so they need no ordering of their own.
    Behind,
    /// Answered when done and fsynced: O_SYNC / O_DSYNC.
    Durable,
}

impl WriteMode {
    pub fn from_flags(flags: i32) -> WriteMode {
        if flags & libc::O_DSYNC != 0 {
            // O_SYNC includes the O_DSYNC bit on Linux.
            WriteMode::Durable
        } else {
            WriteMode::Behind
        }
    }
}

/// The kernel's page cache splits a write(2) that starts inside a page it
/// does not hold: that first page goes alone, as a FUSE write of its own,
/// and the rest follows once it is answered (fs/fuse/file.c,
/// `fuse_fill_write_folios`, stops at a partly written folio that is not
/// up to date). IOR-hard's 47,008-byte writes thus reached the servers as
/// twice as many requests as through `madfs run`, each a record shipped to
/// every replica with `--replicas`. Such a head piece is answered at once
/// but held back here, briefly, and sent together with the rest when that
/// comes next through the same handle (`MadFs::write`).
pub struct HeldWrite {
    pub offset: u64,
    pub data: Vec<u8>,
    /// Its slot among the handle's writes in flight and its claim on the
    /// inode's range: everything that waits for writes waits for it too.
    pub ticket: Ticket,
    pub range: WriteRange,
    id: u64,
    /// Tells the task that sends it alone (after `HOLD_MAX`) to send it
    /// now; dropped when the rest took it along, which ends that task.
    send_now: Option<oneshot::Sender<()>>,
}

impl HeldWrite {
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// A write that looks like the head piece of a split write(2): from inside
/// a page to the end of that page (or of a large folio: up to 64 KiB).
pub fn is_head_piece(offset: u64, len: usize) -> bool {
    const PAGE: u64 = 4096;
    const FOLIO_MAX: usize = 64 << 10;
    let end = offset.saturating_add(len as u64);
    len > 0 && len < FOLIO_MAX && offset % PAGE != 0 && end % PAGE == 0
}

/// Run after the last reference to an open file is gone, wherever that
/// happens: see `AfterDrop`.
pub type AfterLastDrop = Arc<dyn Fn() + Send + Sync>;

/// Calls its hook when dropped. The last field of `OpenFile`, so it runs
/// after the `File` has dropped: the last handle of a file unlinked while
/// open then only queues its release (outside a runtime nobody sends it),
/// and any thread may hold that last reference: a FLUSH answered inline
/// drops its copy after the kernel, told the flush is done, has already
/// sent the RELEASE to another thread (the open_unlinked mount test lost
/// the release that way, one run in two).
struct AfterDrop(AfterLastDrop);

impl Drop for AfterDrop {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// An open file, the inode it belongs to, and its writes in flight.
pub struct OpenFile {
    pub file: File,
    pub ino: u64,
    pub mode: WriteMode,
    pub wb: WriteBehind,
    /// A head piece waiting for the rest of its write (see `HeldWrite`).
    held: Mutex<Option<HeldWrite>>,
    held_ids: AtomicU64,
    /// Last: fields drop in declaration order, and it must follow `file`.
    _after: AfterDrop,
}

impl OpenFile {
    fn new(file: File, mode: WriteMode, after: AfterLastDrop) -> OpenFile {
        OpenFile {
            ino: file.ino().0,
            file,
            mode,
            wb: WriteBehind::new(),
            held: Mutex::new(None),
            held_ids: AtomicU64::new(0),
            _after: AfterDrop(after),
        }
    }

    fn held(&self) -> MutexGuard<'_, Option<HeldWrite>> {
        // A plain slot: consistent even if a holder panicked.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep a head piece whose ticket and range are taken; the receiver
    /// fires when it must go at once (`send_held_now`) or closes when the
    /// rest took it (`take_held`). Returns its id for `take_held_if`. A
    /// piece held before is handed back to be sent (there is none: the
    /// caller took it first).
    pub fn hold(
        &self,
        offset: u64,
        data: Vec<u8>,
        ticket: Ticket,
        range: WriteRange,
    ) -> (u64, oneshot::Receiver<()>, Option<HeldWrite>) {
        let id = self.held_ids.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let before = self.held().replace(HeldWrite {
            offset,
            data,
            ticket,
            range,
            id,
            send_now: Some(tx),
        });
        (id, rx, before)
    }

    /// The held piece, if any, taken out (to be merged or sent).
    pub fn take_held(&self) -> Option<HeldWrite> {
        self.held().take()
    }

    /// The held piece if it is still the one numbered `id`.
    pub fn take_held_if(&self, id: u64) -> Option<HeldWrite> {
        let mut held = self.held();
        if held.as_ref().is_some_and(|h| h.id == id) {
            held.take()
        } else {
            None
        }
    }

    /// Have a held piece sent now instead of at the end of its wait: for
    /// whatever is about to wait for this handle's writes.
    pub fn send_held_now(&self) {
        if let Some(tx) = self.held().as_mut().and_then(|h| h.send_now.take()) {
            let _ = tx.send(());
        }
    }

    /// Nothing of this handle is in flight or left to publish: its flush
    /// or release has nothing to send. (In flight is looked at first: a
    /// write records what it leaves to publish before it leaves the
    /// flight.)
    pub fn is_settled(&self) -> bool {
        self.wb.is_idle() && !self.file.needs_size_update()
    }
}

#[derive(Default)]
struct FileIndex {
    by_fh: HashMap<u64, Arc<OpenFile>>,
    /// Open handles per inode: getattr overlays their sizes (see `known_size`).
    by_ino: HashMap<u64, Vec<u64>>,
}

pub struct FileTable {
    next: AtomicU64,
    max: usize,
    inner: Mutex<FileIndex>,
    writes: Arc<InodeWrites>,
    /// Given to every open file (`AfterDrop`).
    after_last_drop: AfterLastDrop,
}

/// The byte ranges of the writes in flight to each inode, through any of
/// its handles. Each handle's write-behind orders only its own writes, and
/// the kernel answers a write before it lands: a write through one
/// descriptor and then an overlapping one through another (or a mapped
/// page written back through whichever handle the kernel picks) would
/// otherwise run at once and could land in the wrong order, the older data
/// winning (`madfs fsx` found it after 46,000 operations). A write waits
/// here until no overlapping write to the inode is in flight; the kernel
/// sends writes to one inode one at a time, each only after the last was
/// answered (admitted), so they land in the order it sent them.
#[derive(Default)]
struct InodeWrites {
    state: Mutex<InodeWritesState>,
    changed: Notify,
}

#[derive(Default)]
struct InodeWritesState {
    next_id: u64,
    /// (id, start, end) of each write in flight, per inode.
    by_ino: HashMap<u64, Vec<(u64, u64, u64)>>,
    /// Writes to each inode handed to a task that has not claimed its
    /// range yet (`queue_write`): a later write must not overtake them.
    queued: HashMap<u64, usize>,
}

impl InodeWritesState {
    fn busy(&self, ino: u64, start: u64, end: u64) -> bool {
        self.by_ino
            .get(&ino)
            .is_some_and(|r| r.iter().any(|&(_, s, e)| s < end && start < e))
    }

    fn claim(&mut self, writes: &Arc<InodeWrites>, ino: u64, start: u64, end: u64) -> WriteRange {
        let id = self.next_id;
        self.next_id += 1;
        self.by_ino.entry(ino).or_default().push((id, start, end));
        WriteRange {
            writes: writes.clone(),
            ino,
            id,
        }
    }
}

/// A write of an inode on its way to `claim_write` (see `queue_write`).
pub struct QueuedWrite {
    writes: Arc<InodeWrites>,
    ino: u64,
}

impl Drop for QueuedWrite {
    fn drop(&mut self) {
        let mut st = self.writes.lock();
        if let Some(n) = st.queued.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                st.queued.remove(&self.ino);
            }
        }
    }
}

/// A write's claim on its byte range of an inode: held until it has
/// landed, released when dropped.
pub struct WriteRange {
    writes: Arc<InodeWrites>,
    ino: u64,
    id: u64,
}

impl InodeWrites {
    fn lock(&self) -> MutexGuard<'_, InodeWritesState> {
        // Plain map updates: consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for WriteRange {
    fn drop(&mut self) {
        {
            let mut st = self.writes.lock();
            if let Some(ranges) = st.by_ino.get_mut(&self.ino) {
                ranges.retain(|&(id, _, _)| id != self.id);
                if ranges.is_empty() {
                    st.by_ino.remove(&self.ino);
                }
            }
        }
        self.writes.changed.notify_waiters();
    }
}

impl FileTable {
    /// At most `max` handles open; `after_last_drop` runs when the last
    /// reference to one of them is gone.
    pub fn new(max: usize, after_last_drop: AfterLastDrop) -> FileTable {
        FileTable {
            // fh 0 is left unused: some callers treat it as "no handle".
            next: AtomicU64::new(1),
            max,
            inner: Mutex::new(FileIndex::default()),
            writes: Arc::new(InodeWrites::default()),
            after_last_drop,
        }
    }

    /// Wait until no write to `ino` overlapping [start, end) is in flight
    /// through any handle, then claim the range (see `InodeWrites`).
    pub async fn claim_write(&self, ino: u64, start: u64, end: u64) -> WriteRange {
        let writes = &self.writes;
        loop {
            let notified = writes.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = writes.lock();
                if !st.busy(ino, start, end) {
                    return st.claim(writes, ino, start, end);
                }
            }
            notified.await;
        }
    }

    /// `claim_write` if it would not wait, and no write to the inode
    /// handed to a task is still on its way to its claim (`queue_write`):
    /// a write answered on the thread that read it must not overtake one
    /// the kernel sent before.
    pub fn try_claim_write(&self, ino: u64, start: u64, end: u64) -> Option<WriteRange> {
        let mut st = self.writes.lock();
        if st.queued.contains_key(&ino) || st.busy(ino, start, end) {
            return None;
        }
        Some(st.claim(&self.writes, ino, start, end))
    }

    /// A write of `ino` is handed to a task that will `claim_write`: until
    /// the returned guard is dropped (after that claim), `try_claim_write`
    /// of the inode fails.
    pub fn queue_write(&self, ino: u64) -> QueuedWrite {
        *self.writes.lock().queued.entry(ino).or_default() += 1;
        QueuedWrite {
            writes: self.writes.clone(),
            ino,
        }
    }

    fn lock(&self) -> MutexGuard<'_, FileIndex> {
        // Plain map updates: consistent even if a holder panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register an open file; ENFILE when the table is full (the mount-wide
    /// table, not the process's descriptor table: EMFILE would send the user
    /// to `ulimit -n`, which does not help).
    pub fn insert(&self, file: File, mode: WriteMode) -> Result<u64, Errno> {
        let mut t = self.lock();
        if t.by_fh.len() >= self.max {
            // Nothing written through it yet: dropping it sends nothing.
            return Err(Errno::ENFILE);
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let f = OpenFile::new(file, mode, self.after_last_drop.clone());
        t.by_ino.entry(f.ino).or_default().push(fh);
        t.by_fh.insert(fh, Arc::new(f));
        Ok(fh)
    }

    pub fn get(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.lock().by_fh.get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let mut t = self.lock();
        let f = t.by_fh.remove(&fh)?;
        if let Some(list) = t.by_ino.get_mut(&f.ino) {
            list.retain(|&h| h != fh);
            if list.is_empty() {
                t.by_ino.remove(&f.ino);
            }
        }
        Some(f)
    }

    /// The size that writes through handles of this mount give `ino` but
    /// its owner does not know yet: writes in flight, and writes beyond
    /// chunk 0 not yet published (that happens at close or fsync:
    /// close-to-open). Without this a `stat` while writing (and the
    /// kernel's own attribute refreshes) would see the file shrink back.
    /// Handles without such writes do not count: the size they saw at
    /// open may be stale.
    pub fn known_size(&self, ino: u64) -> Option<u64> {
        Self::known_size_in(&self.lock(), ino)
    }

    fn known_size_in(t: &FileIndex, ino: u64) -> Option<u64> {
        let fhs = t.by_ino.get(&ino)?;
        fhs.iter()
            .filter_map(|fh| t.by_fh.get(fh))
            .map(|f| {
                let unpublished = if f.file.needs_size_update() {
                    f.file.size()
                } else {
                    0
                };
                unpublished.max(f.wb.in_flight_end())
            })
            .max()
    }

    /// Tell `target` (a handle of `ino`) the size the other handles of this
    /// mount gave the inode (`known_size`). Under the table's lock, as
    /// `truncated` is: a size sampled before a truncate and handed over
    /// after it would bring the old size back.
    pub fn share_known_size(&self, ino: u64, target: &File) {
        let t = self.lock();
        if let Some(known) = Self::known_size_in(&t, ino) {
            target.know_size(known);
        }
    }

    /// `ino` was truncated to `size`: every handle of it forgets sizes
    /// above it (see `share_known_size`).
    pub fn truncated(&self, ino: u64, size: u64) {
        let t = self.lock();
        for f in t
            .by_ino
            .get(&ino)
            .into_iter()
            .flatten()
            .filter_map(|fh| t.by_fh.get(fh))
        {
            f.file.truncated(size);
        }
    }

    /// Whether any handle of `ino` is open.
    pub fn is_open(&self, ino: u64) -> bool {
        self.lock().by_ino.contains_key(&ino)
    }

    /// Every open handle of `ino`.
    pub fn of_ino(&self, ino: u64) -> Vec<Arc<OpenFile>> {
        let t = self.lock();
        t.by_ino
            .get(&ino)
            .map(|fhs| {
                fhs.iter()
                    .filter_map(|fh| t.by_fh.get(fh))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every open handle, removed (at unmount).
    pub fn drain(&self) -> Vec<Arc<OpenFile>> {
        let mut t = self.lock();
        t.by_ino.clear();
        t.by_fh.drain().map(|(_, f)| f).collect()
    }
}

/// A directory listing in progress. Entries are fetched a page at a time as
/// the kernel asks for them and kept, so an offset is simply an index into
/// what was fetched: stable across calls, cheap to resume, and a listing of
/// 100k entries never asks the servers for more than one page at a time.
pub struct DirHandle {
    pub ino: InodeId,
    pub state: tokio::sync::Mutex<DirState>,
}

#[derive(Default)]
pub struct DirState {
    pub entries: Vec<DirEntry>,
    pub cursor: DirCursor,
    /// Whether any page was fetched (a readdir at offset 0 after that is a
    /// rewinddir and starts a fresh listing).
    pub started: bool,
}

impl DirState {
    pub fn done(&self) -> bool {
        self.cursor.is_done()
    }
}

pub struct DirTable {
    next: AtomicU64,
    max: usize,
    inner: Mutex<HashMap<u64, Arc<DirHandle>>>,
}

impl DirTable {
    pub fn new(max: usize) -> DirTable {
        DirTable {
            next: AtomicU64::new(1),
            max,
            inner: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<DirHandle>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, ino: InodeId) -> Result<u64, Errno> {
        let mut t = self.lock();
        if t.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        t.insert(
            fh,
            Arc::new(DirHandle {
                ino,
                state: tokio::sync::Mutex::new(DirState::default()),
            }),
        );
        Ok(fh)
    }

    pub fn get(&self, fh: u64) -> Option<Arc<DirHandle>> {
        self.lock().get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<DirHandle>> {
        self.lock().remove(&fh)
    }
}

#[cfg(test)]
mod tests {
    use super::is_head_piece;

    #[test]
    fn head_pieces_are_the_split_part_of_a_page() {
        // IOR-hard's 47,008-byte write at 47,008: the kernel sends
        // [47008, 49152) alone, then the rest.
        assert!(is_head_piece(47008, 49152 - 47008));
        assert!(is_head_piece(4095, 1));
        // From a page boundary, or not ending on one: whole writes.
        assert!(!is_head_piece(0, 4096));
        assert!(!is_head_piece(8192, 100));
        assert!(!is_head_piece(100, 200));
        assert!(!is_head_piece(100, 0));
        // Longer than any folio: not a head piece.
        assert!(!is_head_piece(4000, (1 << 20) - 4000 + 4096 * 16));
    }
}
