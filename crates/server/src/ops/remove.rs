//! Unlink and rmdir, inodes held open past their last unlink (`Hold`,
//! `Op::Release`), and the purge of a freed inode's chunks on every server.

use crate::errors::{err, io_err, kv_err, OpResult};
use crate::inode::Inode;
use crate::keys;
use crate::link_drops::Sent;
use crate::locks::LockKey;
use crate::perm::{self};
use crate::seals::DirRemoval;
use crate::service::{blocking, Server};
use crate::touch::DirChanges;
use madfs_kv::WriteBatch;
use madfs_proto::message::{Hold, Op, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{Credentials, FileKind, FileName, InodeId, SealId, ServerId, Timestamp};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused and advances it.
use tokio::time::Instant;

/// How long a purge of freed chunks keeps asking servers it cannot reach.
const PURGE_RETRY_FOR: Duration = Duration::from_secs(600);
/// Finished removals whose records wait for the next removal's batch; at
/// this many they are deleted at once.
const REMOVALS_DONE_MAX: usize = 1024;
/// How long a request that removed a directory (rmdir, a rename over it)
/// waits for the removal's end on the other servers before it answers;
/// the rest goes on behind it. Every server hearing it at once is what
/// the wait buys (their seals end now, not at their lapse); a lost reply
/// made the request wait for a whole call timeout (the replicated
/// simulation, seed 149 with directory moves raced: a rename over an
/// empty directory unanswered for 120 s).
const REMOVAL_FINISH_WAIT: Duration = Duration::from_secs(5);

impl Server {
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
                b.delete(&keys::dir_parent(ino));
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
    pub(crate) async fn release_held(self: &Arc<Self>, ino: InodeId) -> Result<Reply, WireError> {
        if ino.owner() != self.id {
            return Err(err(
                ErrorCode::Stale,
                format!("inode {ino} is not held by server {}", self.id),
            ));
        }
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
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
    pub(crate) async fn purge_everywhere(&self, inos: Vec<InodeId>) {
        // Not before the free is on the set's copies: a failover to a copy
        // without it would serve the inode without its chunks. While it is
        // not, the ORPH records stay, for this store's next start or the
        // promotion of a copy that has them.
        let deadline = Instant::now() + PURGE_RETRY_FOR;
        while !self.replicated_now().await {
            if self.deposed() || Instant::now() >= deadline {
                tracing::warn!(
                    "not purging the chunks of {} freed inode(s): the free is not on every replica",
                    inos.len()
                );
                return;
            }
        }
        let all: Vec<ServerId> = self.peers.servers().collect();
        let mut pending: Vec<(InodeId, Vec<ServerId>)> =
            inos.into_iter().map(|ino| (ino, all.clone())).collect();
        let mut delay = Duration::from_millis(100);
        let mut round = 0u32;
        loop {
            let mut left = Vec::new();
            for (ino, servers) in pending {
                let mut failed = Vec::new();
                for s in servers {
                    if let Err(e) = self.call_peer(s, Op::PurgeChunks { ino }).await {
                        if round == 0 {
                            tracing::warn!("purging chunks of {ino} on server {s}: {e} (retrying)");
                        }
                        failed.push(s);
                    }
                }
                if failed.is_empty() {
                    let mut b = WriteBatch::new();
                    b.delete(&keys::orphan(ino));
                    if let Err(e) = self.kv.write(b, false) {
                        tracing::warn!("clearing orphan {ino}: {e}");
                    }
                } else {
                    left.push((ino, failed));
                }
            }
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    "{} freed inodes keep chunk files on unreachable servers; \
                     purged at this server's next start",
                    left.len()
                );
                return;
            }
            // Deposed: the ORPH records are on the set's copies, whose new
            // primary purges them.
            if !self.pause(delay).await {
                return;
            }
            delay = (delay * 2).min(Duration::from_secs(5));
            round += 1;
            pending = left;
        }
    }

    pub(crate) async fn recover_orphans(&self) {
        let Ok(list) = self.kv.scan(keys::ORPHAN, keys::ORPHAN, 100_000) else {
            return;
        };
        let inos = list
            .iter()
            .filter_map(|(k, _)| keys::ino_from_key(k))
            .collect();
        self.purge_everywhere(inos).await;
    }

    pub(crate) async fn remove(
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
        let removal = want_dir.then(|| DirRemoval {
            dir: ino,
            parent,
            name: name.clone(),
            seal: SealId::fresh(),
        });
        // Seal first, with no lock held: sealing takes the directory's gate,
        // which creators take before their dentry locks.
        let sealed = match &removal {
            Some(r) => Some(self.seal_empty_dir(r).await?),
            None => None,
        };
        let changes = DirChanges::one(parent, -i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(parent, name), LockKey::Inode(ino)];
        lock_keys.extend(changes.local_keys(self.id));
        let guard = self.locks.lock(&lock_keys).await?;
        let now = self.load_dentry(parent, name)?;
        // Gone: a racing unlink won. Replaced: look again from the top.
        // Late: a seal may lapse before the write (seals.rs); again.
        let refused = match now {
            None => Some(err(ErrorCode::NotFound, "")),
            Some(e) if e != (kind, ino) => {
                Some(err(ErrorCode::TryAgain, "the entry changed during removal"))
            }
            Some(_) => sealed.as_ref().and_then(|s| s.check_in_time().err()),
        };
        if let Some(e) = refused {
            drop(guard);
            if let Some(r) = &removal {
                self.unseal(r).await;
            }
            return Err(e);
        }
        let mut b = WriteBatch::new();
        b.delete(&keys::dentry(parent, name));
        if let Some(r) = &removal {
            b.put(&keys::dir_removal(ino), &r.encode());
            // The records of the removals finished before go with it.
            self.take_removals_done(&mut b);
        }
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
        // A file's link on another server goes after this write: recorded
        // with it, so that it goes even if this server or that one dies
        // first (link_drops.rs).
        let link_drop = (removal.is_none() && ino.owner() != self.id)
            .then(|| crate::link_drops::LinkDrop::new(ino, hold));
        if let Some(d) = &link_drop {
            d.put(&mut b);
        }
        let time = Timestamp::now();
        let tickets = self.touch_local(&mut b, &changes, time)?;
        crate::once::record(
            &mut b,
            &Reply::Removed {
                ino,
                kind,
                held,
                touched: Vec::new(),
                verifier: self.write_verifier(),
            },
        );
        // Other servers act on the removal next (the owner drops the link,
        // every server forgets the directory): it must outlive a power cut
        // first, or the name comes back without its inode or directory.
        let remote = want_dir || ino.owner() != self.id;
        self.kv.write(b, remote).map_err(kv_err)?;
        drop(guard);
        let touched = self.touch_queued(tickets);
        // ... and it must be on the set's copies: a failover would bring
        // the name back there.
        if let Some(r) = &removal {
            self.must_be_replicated_dir_removal(r).await?;
        } else if remote {
            if let Err(e) = self.must_be_replicated("the removal of the name").await {
                // The resender sends the drop once it is.
                self.wake_link_drop_resender();
                return Err(e);
            }
        }
        if let Some(inode) = &freed {
            self.after_free(inode);
        }
        if let Some(r) = &removal {
            self.finish_dir_removal_soon(r).await;
        } else if let Some(d) = &link_drop {
            // The owner holds a regular file it was asked to at 0. A drop
            // that failed is sent again later: this client is told the
            // file is not held (it keeps the inode until its owner's next
            // start, if it was the last link).
            if let Sent::Done(Reply::Links { nlink: 0 }) = self.send_link_drop(d, false).await {
                held = hold && kind == FileKind::File;
            }
        }
        Ok(Reply::Removed {
            ino,
            kind,
            held,
            touched,
            verifier: self.write_verifier(),
        })
    }

    /// The rest of an rmdir once its removal is on the set's replicas:
    /// the directory's owner drops it (again, after a crash: a directory
    /// has one name, so this is idempotent), every server hears it is
    /// gone, and then its DIR_REMOVAL record goes. What fails is left to
    /// this server's next start (`recover_dir_removals`); until then, a
    /// server that missed it settles its lapsed seal from the record.
    /// `finish_dir_removal`, waited for at most `REMOVAL_FINISH_WAIT`.
    pub(crate) async fn finish_dir_removal_soon(self: &Arc<Self>, r: &DirRemoval) {
        let (me, r) = (self.clone(), r.clone());
        let finishing = tokio::spawn(async move { me.finish_dir_removal(&r).await });
        // Past the wait the task goes on alone.
        let _ = tokio::time::timeout(REMOVAL_FINISH_WAIT, finishing).await;
    }

    pub(crate) async fn finish_dir_removal(&self, r: &DirRemoval) {
        if r.dir.owner() != self.id {
            let op = Op::AdjustLinks {
                ino: r.dir,
                delta: -1,
                hold: false,
            };
            match self.call_peer(r.dir.owner(), op).await {
                Ok(_) => {}
                // Dropped before a crash cut this short.
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => {
                    tracing::warn!("dropping directory {} on its owner: {e}", r.dir);
                    return;
                }
            }
        }
        if !self.announce_removed(r).await {
            return;
        }
        let full = {
            let mut done = self.removals_done.lock().unwrap_or_else(|e| e.into_inner());
            done.push(r.dir);
            done.len() >= REMOVALS_DONE_MAX
        };
        if full {
            self.clear_removal_records();
        }
    }

    /// Put the deletes of the DIR_REMOVAL records of finished removals into
    /// `b` (a crash before `b` is written leaves them: the next start
    /// finishes those removals again, which changes nothing).
    fn take_removals_done(&self, b: &mut WriteBatch) {
        let done =
            std::mem::take(&mut *self.removals_done.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in done {
            b.delete(&keys::dir_removal(dir));
        }
    }

    /// Delete the records of finished removals now (the periodic sweep,
    /// or too many waiting).
    pub(crate) fn clear_removal_records(&self) {
        let mut b = WriteBatch::new();
        self.take_removals_done(&mut b);
        if b.is_empty() {
            return;
        }
        if let Err(e) = self.kv.write(b, false) {
            tracing::warn!("clearing the records of finished directory removals: {e}");
        }
    }

    /// `must_be_replicated` for a write that removed directory `r.dir`: if
    /// it fails (TimedOut, outcome unknown), the seals are kept from
    /// lapsing and the removal finished in the background once it is.
    pub(crate) async fn must_be_replicated_dir_removal(
        self: &Arc<Self>,
        r: &DirRemoval,
    ) -> Result<(), WireError> {
        let e = match self.must_be_replicated("the removal of the name").await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let me = self.clone();
        let r = r.clone();
        tokio::spawn(async move { me.finish_unreplicated_dir_removal(r).await });
        Err(e)
    }

    /// An rmdir answered TimedOut: its removal is in this store but not
    /// yet on every replica. Keep its seals from lapsing while waiting;
    /// once replicated, finish it. A deposed store stops: the set's new
    /// primary answers lapsed seals from its own copy (found by the
    /// simulation with replicas, seed 5363: the seals lapsed and a create
    /// went into the directory the removal then took away).
    async fn finish_unreplicated_dir_removal(self: Arc<Self>, r: DirRemoval) {
        loop {
            if self.deposed() {
                return;
            }
            // Renew the seals first: each wait may take the longest one.
            self.renew_seals(&r).await;
            if self.replicated_now().await {
                break;
            }
        }
        self.finish_dir_removal(&r).await;
    }

    /// At start: finish the directory removals a crash or an unreachable
    /// server cut short.
    pub(crate) async fn recover_dir_removals(&self) {
        let Ok(list) = self.kv.scan(keys::DIR_REMOVAL, keys::DIR_REMOVAL, 100_000) else {
            return;
        };
        for (k, v) in list {
            match keys::ino_from_key(&k).and_then(|dir| DirRemoval::decode(dir, &v)) {
                Some(r) => self.finish_dir_removal(&r).await,
                None => tracing::warn!("an unreadable directory removal record: {k:?}"),
            }
        }
    }

    pub(crate) async fn purge_local(&self, ino: InodeId) -> OpResult {
        let chunks = self.chunks.clone();
        blocking(move || chunks.purge(ino)).await.map_err(io_err)?;
        Ok((Reply::Empty, Vec::new()))
    }
}
