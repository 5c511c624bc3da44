//! Directory times and link counts: what creating, removing or renaming an
//! entry does to its parent directory (mtime and ctime set to the
//! operation's time, the link count moved by subdirectories made or
//! removed), as ext4 does.
//!
//! The entry's dentry server does the operation, but the directory's inode
//! usually lives on another server. Where the directory is this server's,
//! the change goes into the operation's own RocksDB batch (`touch_local`):
//! atomic with the entry, exactly once. Otherwise the operation joins the
//! directory's next touch and writes an intent with its batch
//! (touch_send.rs), then lets the touch go (`touch_queued`) and replies at once with a token naming the touch that
//! will carry it: (this server, seq). The client's next GetAttr of the
//! directory carries its tokens and the owner answers once it applied them
//! (`wait_touches`, at most `TOUCH_WAIT`), so the client that made a change
//! sees it right after; other clients see it once the touch lands
//! (microseconds to milliseconds). The queue coalesces (group commit): at
//! most one `TouchDir` per directory is in flight from this server;
//! changes arriving meanwhile join the next one, which carries the latest
//! time and their summed link delta, and whose seq is taken when it forms
//! (so its token is known at once, and is above every earlier touch of
//! the directory: "applied up to seq" covers every change it names).
//! Concurrent creates in one shared directory (mdtest-hard) then cost one
//! peer request per round trip, not one each. A cross-server rename's
//! install (rename.rs, step 3) still waits for its touch (`touch_remote`):
//! its answer goes to the coordinator, not to the client.
//!
//! Exactly once across retries: each touch carries (sender, seq) with `seq`
//! from a persisted counter (counter.rs, never reused across restarts); the
//! owner records the last seq applied per sender in `DTCH dir sender`, in
//! the batch that applies it, and ignores a touch whose seq is not above
//! it. A sender retries a touch with its same seq while the owner is
//! unreachable, so a touch applied whose answer was lost is not applied
//! twice.
//!
//! No operation waits for a touch while it holds a lock or gate, and an
//! owner applies a touch under the directory's inode lock alone. The one
//! wait left is a cross-server rename's step 3 (rename.rs): the destination
//! server touches its directory before it answers while the coordinator
//! holds the locks of the source name and inode, never the directory's
//! (locks are per key, locks.rs; were it held, the install would reply
//! after `TOUCH_WAIT` and the touch land once the coordinator is done).
//! A GetAttr waiting for tokens holds nothing.
//!
//! What a crash leaves: a touch not yet applied stays in the sender's
//! store as the intents its operations wrote, and is sent again by the
//! server that next serves that store (touch_send.rs): a process crash, a
//! kill or a failover loses no change. Metadata writes are not synced
//! (docs/ARCHITECTURE.md), so a power cut may lose an applied touch on the
//! owner whose intents the sender already deleted, or the sender's intents
//! with their entries; a touch dropped after `TOUCH_RETRY_FOR` is lost
//! too. Nothing recounts a directory then (an fsck-like recount would have
//! to scan every server's dentries of it). A link count is never taken
//! below 2.
//! Times only move forward (max-merge): touches from several servers may
//! arrive in any order.

use crate::errors::{err, kv_err};
use crate::keys;
use crate::locks::LockKey;
use crate::service::Server;
use crate::touch_send::{SendQueue, TouchTicket};
use madfs_kv::{KvStore, WriteBatch};
use madfs_proto::message::{Op, Reply, TouchToken, TouchWait};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{Attr, FileKind, InodeId, ServerId, Timestamp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused.
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A GetAttr waits this long at most for the touches its tokens name, and
/// a rename's install for its touch, before they answer anyway (the
/// sender or owner is unreachable; the touch is still retried). Below the
/// clients' 30 s call timeout.
const TOUCH_WAIT: Duration = Duration::from_secs(5);
/// A touch is retried while its owner is unreachable for this long, then
/// dropped (logged).
const TOUCH_RETRY_FOR: Duration = Duration::from_secs(300);
const TOUCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What one operation does to its parent directories: at most two (rename).
#[derive(Default, Debug, Clone)]
pub(crate) struct DirChanges {
    items: Vec<(InodeId, i64)>,
}

impl DirChanges {
    pub(crate) fn one(dir: InodeId, nlink_delta: i64) -> DirChanges {
        let mut c = DirChanges::default();
        c.add(dir, nlink_delta);
        c
    }

    /// `dir` changes, its link count by `nlink_delta`.
    pub(crate) fn add(&mut self, dir: InodeId, nlink_delta: i64) {
        match self.items.iter_mut().find(|(d, _)| *d == dir) {
            Some((_, n)) => *n += nlink_delta,
            None => self.items.push((dir, nlink_delta)),
        }
    }

    /// Inode locks of the directories this server holds: the caller
    /// takes them with its other locks, before `touch_local`.
    pub(crate) fn local_keys<'k>(&self, me: ServerId) -> Vec<LockKey<'k>> {
        self.items
            .iter()
            .filter(|(d, _)| d.owner() == me)
            .map(|(d, _)| LockKey::Inode(*d))
            .collect()
    }
}

/// The directory's new times and link count.
pub(crate) fn touch_attr(a: &mut Attr, time: Timestamp, nlink_delta: i64) {
    a.mtime = a.mtime.max(time);
    a.ctime = a.ctime.max(time);
    a.nlink = (a.nlink as i64 + nlink_delta).clamp(2, u32::MAX as i64) as u32;
}

/// GetAttrs waiting for touches of a directory from one sender: the seq
/// each waits for.
type Waiting = HashMap<(InodeId, ServerId), Vec<(u64, oneshot::Sender<()>)>>;

pub(crate) struct Touches {
    /// The sender's side: queued changes, their intents, recovery
    /// (touch_send.rs).
    pub(crate) send: SendQueue,
    /// On the owner: GetAttrs waiting until a touch is applied.
    waiting: Mutex<Waiting>,
    /// The server is stopping (`Server::shutdown`): its last records are
    /// synced and on its copies, so nothing of touches is written any more
    /// (none sent, applied or cleaned up); their intents are sent again at
    /// the next start.
    pub(crate) stopped: std::sync::atomic::AtomicBool,
    /// Test fault (`DROP_TOUCH_LINKS_ENV`): apply touches' times but not
    /// their link deltas, as a power cut that lost them would.
    drop_links: bool,
}

/// The environment variable that delays every touch a server sends (tests
/// only: a slow network or owner, on demand).
pub const TOUCH_DELAY_ENV: &str = "MADFS_TEST_TOUCH_DELAY_MS";

/// The environment variable (`1`) that makes a server drop the link deltas
/// of the touches it applies (tests only: the damage `madfs fsck` finds
/// and repairs, which otherwise takes a power cut).
pub const DROP_TOUCH_LINKS_ENV: &str = "MADFS_FAULT_DROP_TOUCH_LINKS";

impl Touches {
    pub(crate) fn load(kv: &dyn KvStore) -> Result<Touches, madfs_kv::KvError> {
        let delay = crate::test_knob_ms(TOUCH_DELAY_ENV).filter(|d| !d.is_zero());
        if let Some(d) = delay {
            tracing::warn!("{TOUCH_DELAY_ENV}: every directory touch is sent {d:?} late");
        }
        let drop_links = crate::test_fault(DROP_TOUCH_LINKS_ENV);
        if drop_links {
            tracing::warn!("{DROP_TOUCH_LINKS_ENV}: link counts in touches are dropped");
        }
        Ok(Touches {
            send: SendQueue::load(kv, delay)?,
            waiting: Mutex::new(HashMap::new()),
            stopped: Default::default(),
            drop_links,
        })
    }
}

impl Server {
    /// Put the new times and link counts of the directories of `changes`
    /// this server holds into `b` (their inode locks must be held; a
    /// directory already gone is skipped), and the intents of the others'
    /// changes (touch_send.rs): the tickets to commit once `b` is written
    /// (`touch_queued`, `touch_remote`), or to drop if it is not.
    pub(crate) fn touch_local(
        &self,
        b: &mut WriteBatch,
        changes: &DirChanges,
        time: Timestamp,
    ) -> Result<Vec<TouchTicket>, WireError> {
        let mut tickets = Vec::new();
        for &(dir, delta) in &changes.items {
            if dir.owner() != self.id {
                let joined = self
                    .touches
                    .send
                    .join(self.kv.as_ref(), b, dir, time, delta);
                tickets.push(joined.map_err(kv_err)?);
                continue;
            }
            if let Some(mut inode) = self.load_inode(dir)? {
                if inode.attr.kind == FileKind::Dir {
                    touch_attr(&mut inode.attr, time, delta);
                    b.put(&keys::inode(dir), &inode.encode());
                }
            }
        }
        if !tickets.is_empty() {
            self.touches.send.drain_applied(b);
        }
        Ok(tickets)
    }

    /// After the operation's batch (with the intents of `tickets`) is
    /// written: let the touches go to the directories' owners and return
    /// at once with the tokens that name them (the operation's reply
    /// carries them; the client's next GetAttr of a directory waits for
    /// its own).
    pub(crate) fn touch_queued(self: &Arc<Self>, tickets: Vec<TouchTicket>) -> Vec<TouchToken> {
        self.commit_touches(tickets, false).0
    }

    /// Like `touch_queued`, but wait until the owners applied the touches
    /// (at most `TOUCH_WAIT`): for a cross-server rename's install, whose
    /// answer goes to the coordinator, not to the client.
    pub(crate) async fn touch_remote(self: &Arc<Self>, tickets: Vec<TouchTicket>) {
        let (_, applied) = self.commit_touches(tickets, true);
        let deadline = Instant::now() + TOUCH_WAIT;
        for rx in applied {
            let _ = tokio::time::timeout_at(deadline, rx).await;
        }
    }

    /// For an operation whose batch is written and whose locks are
    /// released (it could not hold a directory's lock while it waited on
    /// a peer): apply `changes` to this server's directories, and write the
    /// intents of the others', in a batch of their own, then let the
    /// touches go (`touch_queued`).
    pub(crate) async fn touch_after(
        self: &Arc<Self>,
        changes: &DirChanges,
        time: Timestamp,
    ) -> Vec<TouchToken> {
        let local: Vec<_> = changes.local_keys(self.id);
        let written = match self.locks.lock(&local).await {
            Ok(_g) => {
                let mut b = WriteBatch::new();
                self.touch_local(&mut b, changes, time).and_then(|tickets| {
                    if !b.is_empty() {
                        self.kv.write(b, false).map_err(kv_err)?;
                    }
                    Ok(tickets)
                })
            }
            Err(e) => Err(e),
        };
        match written {
            Ok(tickets) => self.touch_queued(tickets),
            Err(e) => {
                tracing::warn!("touching a directory: {e}");
                Vec::new()
            }
        }
    }

    /// Send touch `seq` until its owner answers.
    pub(crate) async fn send_touch(
        &self,
        dir: InodeId,
        seq: u64,
        time: Timestamp,
        nlink_delta: i64,
    ) {
        if let Some(d) = self.touches.send.delay {
            tokio::time::sleep(d).await;
        }
        let op = Op::TouchDir {
            dir,
            sender: self.id,
            seq,
            time,
            nlink_delta: nlink_delta.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        };
        let give_up = Instant::now() + TOUCH_RETRY_FOR;
        let mut wait = Duration::from_millis(50);
        loop {
            match self.call_peer(dir.owner(), op.clone()).await {
                Ok(_) => return,
                // Removed meanwhile: nothing left to touch.
                Err(e) if e.code == ErrorCode::NotFound => return,
                // Unreachable, or its disk full for now: the change is
                // acknowledged, so it waits for the owner.
                Err(e)
                    if (crate::rename::is_uncertain(&e) || e.code == ErrorCode::NoSpace)
                        && Instant::now() < give_up =>
                {
                    tracing::warn!("touching directory {dir} on its owner (will retry): {e}");
                    // Deposed: the set's new primary sends the touches its
                    // copy holds (`resend_touches`).
                    if !self.pause(wait).await {
                        return;
                    }
                    wait = (wait * 2).min(TOUCH_BACKOFF_MAX);
                }
                Err(e) => {
                    tracing::warn!("touching directory {dir} on its owner, dropped: {e}");
                    return;
                }
            }
        }
    }

    /// `Op::TouchDir` on the directory's owner.
    pub(crate) async fn apply_touch(
        &self,
        dir: InodeId,
        sender: ServerId,
        seq: u64,
        time: Timestamp,
        nlink_delta: i32,
    ) -> Result<Reply, WireError> {
        if self
            .touches
            .stopped
            .load(std::sync::atomic::Ordering::Acquire)
        {
            // Its sender keeps the change and sends it again later.
            return Err(err(
                ErrorCode::Unavailable,
                format!("server {} is stopping", self.id),
            ));
        }
        {
            let _g = self.locks.lock(&[LockKey::Inode(dir)]).await?;
            let mut inode = self.must_inode(dir)?;
            if inode.attr.kind != FileKind::Dir {
                return Err(err(ErrorCode::NotDir, format!("inode {dir}")));
            }
            if seq > self.touch_applied(dir, sender)? {
                let delta = if self.touches.drop_links {
                    0
                } else {
                    nlink_delta
                };
                touch_attr(&mut inode.attr, time, delta as i64);
                let mut b = WriteBatch::new();
                b.put(&keys::inode(dir), &inode.encode());
                b.put(&keys::dir_touch(dir, sender), &seq.to_le_bytes());
                self.kv.write(b, false).map_err(kv_err)?;
            } // else a retry of one applied
        }
        self.touches_applied(dir, sender, seq);
        Ok(Reply::Empty)
    }

    /// The last seq of `sender`'s touches applied to `dir` (0: none).
    fn touch_applied(&self, dir: InodeId, sender: ServerId) -> Result<u64, WireError> {
        match self.kv.get(&keys::dir_touch(dir, sender)).map_err(kv_err)? {
            None => Ok(0),
            Some(v) => v
                .as_slice()
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| err(ErrorCode::Io, "corrupt directory touch record")),
        }
    }

    /// Wake the GetAttrs waiting for touches of `dir` from `sender` up to
    /// `seq`.
    fn touches_applied(&self, dir: InodeId, sender: ServerId, seq: u64) {
        let mut waiting = self
            .touches
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(list) = waiting.get_mut(&(dir, sender)) {
            let (wake, keep) = std::mem::take(list)
                .into_iter()
                .partition::<Vec<_>, _>(|(s, _)| *s <= seq);
            *list = keep;
            for (_, tx) in wake {
                let _ = tx.send(());
            }
            if list.is_empty() {
                waiting.remove(&(dir, sender));
            }
        }
    }

    /// A GetAttr of `dir` with `after` (a client's tokens of its own
    /// changes): return once this owner applied each of those touches, or
    /// `TOUCH_WAIT` after the start (a sender that crashed before sending
    /// never will), or at once if the directory is gone.
    pub(crate) async fn wait_touches(&self, dir: InodeId, after: &[TouchWait]) {
        let deadline = tokio::time::Instant::now() + TOUCH_WAIT;
        for w in after {
            if w.sender == self.id || usize::from(w.sender.0) >= self.servers {
                continue; // never sent: this server's own changes are in their batch
            }
            let rx = {
                let (tx, rx) = oneshot::channel();
                self.touches
                    .waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry((dir, w.sender))
                    .or_default()
                    .push((w.seq, tx));
                rx
            };
            // Registered before this look: a touch applied after it wakes rx.
            let done = match (self.touch_applied(dir, w.sender), self.load_inode(dir)) {
                (Ok(applied), Ok(Some(_))) => applied >= w.seq,
                _ => true,
            };
            let timed_out = if done {
                drop(rx);
                false
            } else {
                tokio::time::timeout_at(deadline, rx).await.is_err()
            };
            self.forget_waits(dir, w.sender);
            if timed_out {
                return;
            }
        }
    }

    /// Drop waits for `dir`'s touches from `sender` whose GetAttr left.
    fn forget_waits(&self, dir: InodeId, sender: ServerId) {
        let mut waiting = self
            .touches
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(list) = waiting.get_mut(&(dir, sender)) {
            list.retain(|(_, tx)| !tx.is_closed());
            if list.is_empty() {
                waiting.remove(&(dir, sender));
            }
        }
    }

    /// Records of a freed directory's touches, deleted with its inode.
    pub(crate) fn forget_touches(&self, b: &mut WriteBatch, dir: InodeId) {
        for s in 0..self.servers {
            b.delete(&keys::dir_touch(dir, ServerId(s as u16)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_only_move_forward_and_links_stay_at_least_two() {
        let mut a =
            crate::inode::Inode::new(InodeId(5), FileKind::Dir, 0o755, 0, 0, Vec::new()).attr;
        let t0 = a.mtime;
        let past = Timestamp { secs: 1, nanos: 0 };
        touch_attr(&mut a, past, 1);
        assert_eq!((a.mtime, a.ctime, a.nlink), (t0, t0, 3));
        let later = Timestamp {
            secs: t0.secs + 10,
            nanos: 0,
        };
        touch_attr(&mut a, later, -5);
        assert_eq!((a.mtime, a.ctime, a.nlink), (later, later, 2));
    }

    #[test]
    fn changes_to_one_directory_merge() {
        let mut c = DirChanges::one(InodeId(7), -1);
        c.add(InodeId(7), 1);
        c.add(InodeId(9), 1);
        assert_eq!(c.items, vec![(InodeId(7), 0), (InodeId(9), 1)]);
    }
}
