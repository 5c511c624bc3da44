//! Files open through one client (and its clones), by inode: what their
//! writes make a file's size before they publish it. Writes beyond chunk 0
//! reach only their chunk servers until close or fsync sends the size to
//! the owner, and write-behind writes may still be travelling; POSIX wants a
//! stat after a write to show the new size all the same, so path and
//! descriptor stats add what this client's handles know (`Client::fstat`,
//! the path-level `stat`). A truncate through one handle, or by path, tells
//! every handle of the inode, so none publishes its older, larger size at
//! close (sizes are merged as a maximum on the owner).
//!
//! A size learned from the owner, or from the handles' table, while a
//! truncate of the inode runs may be from before it; stored or answered
//! after it, it would bring the old size back (and a later close would
//! publish it). `truncations` counts truncates through this client, once
//! as each starts and once as it ends: whoever learned a size while the
//! count moved asks again or drops it (`Client::fstat`, `File::read_at`).
//!
//! A close or fsync through one handle reads the size it publishes; a
//! truncate through another handle between that read and the owner's
//! taking the size would be undone by it. Publications and truncates of
//! an inode take turns (`publishing`, `truncating`).
//!
//! It also counts every open handle (readers too) per inode, for files
//! unlinked while open: a removal sends the inodes open here (`hold`), the
//! owner keeps such an inode when its last name goes (`Hold`), and the
//! last handle of a held inode to close queues it for `Op::Release`
//! (`Client::release_unlinked`).
//!
//! It keeps what closed handles wrote and no fsync synced since
//! (`closed_unsynced`): fsync(2) is about the file, so `write; close; open;
//! fsync` (coreutils' `sync FILE`, a database's checkpointer) must sync
//! the servers the closed handle wrote to, and check their write
//! verifiers. At most `CLOSED_UNSYNCED_MAX` inodes; past it, an fsync of
//! an inode not remembered syncs every server.
//!
//! And it remembers the inodes whose chunks a truncate through this client
//! cut and no fsync synced since (`cut`, `take_cut`): the cut happens on
//! every server holding chunks past the size, not only on those this
//! client wrote to, and an fsync must make it durable there too. Undone by
//! a crash, it would bring the old bytes back into a hole a later write
//! makes.

use crate::file::FileState;
use crate::writebehind::WriteBehind;
use madfs_proto::message::{Hold, HOLD_INODES_MAX};
use madfs_types::InodeId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Registrations between two sweeps of entries whose files are gone.
const SWEEP_EVERY: u64 = 1024;

struct Handle {
    state: Weak<Mutex<FileState>>,
    behind: Option<Weak<WriteBehind>>,
}

impl Handle {
    fn alive(&self) -> bool {
        self.state.strong_count() > 0
    }
}

/// A handle still open: its state, and its writes in flight if it has
/// write-behind.
type LiveHandle = (Arc<Mutex<FileState>>, Option<Arc<WriteBehind>>);

/// Handles of one inode open through this client.
#[derive(Default)]
struct Opens {
    handles: u32,
    /// Its owner keeps it for us after its last unlink: release it at the
    /// last close.
    held: bool,
}

#[derive(Default)]
struct Table {
    by_ino: HashMap<InodeId, Vec<Handle>>,
    registrations: u64,
    opens: HashMap<InodeId, Opens>,
    /// Held inodes whose last handle closed, to release.
    to_release: Vec<InodeId>,
    /// Inodes whose chunks a truncate cut since their last fsync.
    cut: HashSet<InodeId>,
    /// What closed handles of each inode wrote and no fsync synced since.
    closed_unsynced: HashMap<InodeId, crate::Unsynced>,
    /// A closed handle's writes found `closed_unsynced` full: an inode not
    /// in it may have unsynced writes anywhere.
    closed_overflowed: bool,
}

/// Inodes whose closed handles' unsynced writes are remembered.
const CLOSED_UNSYNCED_MAX: usize = 4096;

/// Inodes remembered as cut and not yet synced; past it a truncate syncs
/// its cut at once (`Client::truncate_chunks`).
const CUTS_MAX: usize = 4096;

/// Gates between size publications and truncates (`OpenFiles::gate`),
/// shared by inodes of the same hash.
const SIZE_GATES: usize = 64;

pub(crate) struct OpenFiles {
    table: Mutex<Table>,
    /// Moves when a truncate through this client starts and when it ends.
    truncations: AtomicU64,
    /// A close or fsync publishes the size its handle read under a shared
    /// hold; a truncate runs under an exclusive one. A size read before a
    /// truncate through another handle and published after it would grow
    /// the file back (the owner merges sizes as a maximum).
    size_gates: [tokio::sync::RwLock<()>; SIZE_GATES],
}

impl Default for OpenFiles {
    fn default() -> OpenFiles {
        OpenFiles {
            table: Mutex::default(),
            truncations: AtomicU64::new(0),
            size_gates: std::array::from_fn(|_| tokio::sync::RwLock::new(())),
        }
    }
}

fn lock_state(state: &Mutex<FileState>) -> MutexGuard<'_, FileState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl OpenFiles {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Plain map updates: consistent even if a holder panicked.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(
        &self,
        ino: InodeId,
        state: &Arc<Mutex<FileState>>,
        behind: Option<&Arc<WriteBehind>>,
    ) {
        let mut t = self.lock();
        t.registrations += 1;
        if t.registrations.is_multiple_of(SWEEP_EVERY) {
            t.by_ino.retain(|_, hs| {
                hs.retain(Handle::alive);
                !hs.is_empty()
            });
        }
        t.by_ino.entry(ino).or_default().push(Handle {
            state: Arc::downgrade(state),
            behind: behind.map(Arc::downgrade),
        });
    }

    /// The file of `ino` with this state is done (dropped, and what it had
    /// to publish published): forget it, and any handles already gone.
    pub(crate) fn release(&self, ino: InodeId, state: &Arc<Mutex<FileState>>) {
        let unsynced = lock_state(state).unsynced().clone();
        let mut t = self.lock();
        if !unsynced.is_empty() {
            let t = &mut *t;
            if t.closed_unsynced.len() < CLOSED_UNSYNCED_MAX || t.closed_unsynced.contains_key(&ino)
            {
                t.closed_unsynced.entry(ino).or_default().merge(&unsynced);
            } else {
                t.closed_overflowed = true;
            }
        }
        if let Some(hs) = t.by_ino.get_mut(&ino) {
            hs.retain(|h| h.alive() && !std::ptr::eq(h.state.as_ptr(), Arc::as_ptr(state)));
            if hs.is_empty() {
                t.by_ino.remove(&ino);
            }
        }
    }

    /// A handle of `ino` (any access mode) was opened.
    pub(crate) fn opened(&self, ino: InodeId) {
        self.lock().opens.entry(ino).or_default().handles += 1;
    }

    /// A handle of `ino` is gone; returns true when it was the last one of
    /// a held inode, which is then queued for release.
    pub(crate) fn closed(&self, ino: InodeId) -> bool {
        let mut t = self.lock();
        let Some(o) = t.opens.get_mut(&ino) else {
            return false;
        };
        o.handles = o.handles.saturating_sub(1);
        if o.handles > 0 {
            return false;
        }
        let held = o.held;
        t.opens.remove(&ino);
        if held {
            t.to_release.push(ino);
        }
        held
    }

    /// What a removal sent now should ask the owner to hold: the inodes
    /// open here (nothing when none is).
    pub(crate) fn hold(&self) -> Hold {
        let t = self.lock();
        match t.opens.len() {
            0 => Hold::Nothing,
            n if n <= HOLD_INODES_MAX => Hold::Inodes(t.opens.keys().copied().collect()),
            _ => Hold::Any,
        }
    }

    /// The owner held `ino` for this client: mark it, to be released at
    /// its last close. False if no handle of it is open (any more, or
    /// ever: `Hold::Any`): the caller releases it now.
    pub(crate) fn mark_held(&self, ino: InodeId) -> bool {
        match self.lock().opens.get_mut(&ino) {
            Some(o) => {
                o.held = true;
                true
            }
            None => false,
        }
    }

    /// Held inodes whose last handle closed, now the caller's to release.
    pub(crate) fn take_releases(&self) -> Vec<InodeId> {
        std::mem::take(&mut self.lock().to_release)
    }

    pub(crate) fn has_releases(&self) -> bool {
        !self.lock().to_release.is_empty()
    }

    /// Every held inode, open or not, forgotten: the process is ending
    /// and its handles with it (`Client::release_all_unlinked`).
    pub(crate) fn take_all_held(&self) -> Vec<InodeId> {
        let mut t = self.lock();
        let mut all = std::mem::take(&mut t.to_release);
        for (ino, o) in t.opens.iter_mut() {
            if std::mem::take(&mut o.held) {
                all.push(*ino);
            }
        }
        all
    }

    fn live(&self, ino: InodeId) -> Vec<LiveHandle> {
        let t = self.lock();
        t.by_ino
            .get(&ino)
            .map(|hs| {
                hs.iter()
                    .filter_map(|h| {
                        let state = h.state.upgrade()?;
                        Some((state, h.behind.as_ref().and_then(Weak::upgrade)))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The size this client's handles of `ino` give it beyond what they
    /// published: writes in flight, and writes past chunk 0 not yet sent
    /// to the owner. None when no handle has such writes.
    pub(crate) fn unpublished_size(&self, ino: InodeId) -> Option<u64> {
        self.live(ino)
            .iter()
            .map(|(state, behind)| {
                let st = lock_state(state);
                let unpublished = if st.needs_size_update {
                    st.size_hint
                } else {
                    0
                };
                unpublished.max(behind.as_ref().map_or(0, |wb| wb.in_flight_end()))
            })
            .filter(|&size| size > 0)
            .max()
    }

    /// Whether a handle of `ino` writes behind: its writes may land on
    /// the servers after any answer about the file was given, so a stat
    /// must ask the owner with those writes accounted for (`Client::fstat`).
    pub(crate) fn writes_behind(&self, ino: InodeId) -> bool {
        self.live(ino).iter().any(|(_, behind)| behind.is_some())
    }

    /// Wait until no handle of `ino` has writes in flight (write-behind):
    /// a read, truncate or fsync through any handle must see them, as POSIX
    /// asks of a read after a write in one process.
    pub(crate) async fn drain_writes(&self, ino: InodeId) {
        for (_, behind) in self.live(ino) {
            if let Some(wb) = behind {
                wb.drain().await;
            }
        }
    }

    /// The servers holding unsynced writes of any handle of `ino` (with the
    /// store incarnations that took them): an
    /// fsync through one descriptor makes the file's data durable, whoever
    /// wrote it (fsync(2) is about the file, not the descriptor).
    /// And whether writes of `ino` may be unsynced on servers not named
    /// (closed handles' writes that found no room).
    pub(crate) fn unsynced(&self, ino: InodeId) -> (crate::Unsynced, bool) {
        let (mut all, unknown) = {
            let t = self.lock();
            match t.closed_unsynced.get(&ino) {
                Some(u) => (u.clone(), false),
                None => (crate::Unsynced::default(), t.closed_overflowed),
            }
        };
        for (state, _) in self.live(ino) {
            all.merge(lock_state(&state).unsynced());
        }
        (all, unknown)
    }

    /// `servers` were synced whole (`Client::fsync_servers`) and answered
    /// with `answers`: closed handles' writes they hold are durable, and
    /// once every server was, none is unknown any more.
    pub(crate) fn servers_synced(
        &self,
        servers: &[madfs_types::ServerId],
        answers: &[madfs_proto::message::WriteVerifier],
        all: bool,
    ) {
        let durable = crate::Unsynced::answered(servers, answers);
        let mut t = self.lock();
        t.closed_unsynced.retain(|_, u| {
            u.forget_synced(&durable);
            !u.is_empty()
        });
        if all {
            t.closed_overflowed = false;
        }
    }

    /// An fsync of `ino` made `synced` durable: closed handles' writes it
    /// covered are forgotten.
    pub(crate) fn synced(&self, ino: InodeId, synced: &crate::Unsynced) {
        let mut t = self.lock();
        if let Some(u) = t.closed_unsynced.get_mut(&ino) {
            u.forget_synced(synced);
            if u.is_empty() {
                t.closed_unsynced.remove(&ino);
            }
        }
    }

    /// `ino` was truncated (or extended) to `size` on its owner.
    pub(crate) fn truncated(&self, ino: InodeId, size: u64) {
        for (state, _) in self.live(ino) {
            let mut st = lock_state(&state);
            st.size_hint = size;
            st.needs_size_update = false;
        }
    }

    /// A truncate cut `ino`'s chunks on the servers: its next fsync syncs
    /// them all. False if too many inodes are remembered already (the
    /// caller then syncs the cut itself).
    pub(crate) fn cut(&self, ino: InodeId) -> bool {
        let mut t = self.lock();
        if t.cut.len() >= CUTS_MAX && !t.cut.contains(&ino) {
            return false;
        }
        t.cut.insert(ino);
        true
    }

    /// Whether a truncate cut `ino`'s chunks since its last fsync; forgets
    /// it (an fsync that then fails remembers it again with `cut`).
    pub(crate) fn take_cut(&self, ino: InodeId) -> bool {
        self.lock().cut.remove(&ino)
    }

    /// Held while a handle of `ino` reads the size it publishes and
    /// publishes it (close, fsync).
    pub(crate) async fn publishing(&self, ino: InodeId) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate(ino).read().await
    }

    /// Held while `ino` is truncated through this client, up to every
    /// handle's taking the new size (`truncated`): publications of `ino`
    /// wait for it, and the count of truncations moves as it starts and
    /// as it ends.
    pub(crate) async fn truncating(&self, ino: InodeId) -> Truncation<'_> {
        let turn = self.gate(ino).write().await;
        self.truncation_moved();
        Truncation {
            files: self,
            _turn: turn,
        }
    }

    fn gate(&self, ino: InodeId) -> &tokio::sync::RwLock<()> {
        let at = (ino.0 ^ (ino.0 >> 32)) as usize % SIZE_GATES;
        &self.size_gates[at]
    }

    /// The count of truncate starts and ends (see the file's header). Read
    /// it before learning a size and again before using it.
    pub(crate) fn truncations(&self) -> u64 {
        self.truncations.load(Ordering::SeqCst)
    }

    /// A truncate starts or ends (its end after `truncated`).
    fn truncation_moved(&self) {
        self.truncations.fetch_add(1, Ordering::SeqCst);
    }
}

/// A truncate in progress (`OpenFiles::truncating`): its turn on the
/// inode, and the count moved again when dropped (on every path out,
/// failures too), before the turn is given back.
pub(crate) struct Truncation<'a> {
    files: &'a OpenFiles,
    _turn: tokio::sync::RwLockWriteGuard<'a, ()>,
}

impl Drop for Truncation<'_> {
    fn drop(&mut self) {
        self.files.truncation_moved();
    }
}
