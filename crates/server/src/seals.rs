//! Seals of directories being removed: rmdir seals an empty directory on
//! every server so no entry appears in it while its owner removes it. A
//! seal its rmdir neither lifted nor turned into "removed" lapses after
//! `SEAL_LEASE`; the next entry into the directory then asks the removed
//! name's server how the removal ended (`SealAction::Settle`), which
//! answers from its DIR_REMOVAL record once its set's replicas have it.

use crate::errors::{err, io_err, kv_err, OpResult};
use crate::keys;
use crate::locks::{Gated, LockKey};
use crate::service::{blocking, Server};
// Past `SEAL_HOLDERS_MAX` holders of one directory's seal an rmdir is told
// to try again (a bound, not a case we expect).
use madfs_proto::message::{Op, Reply, SealAction, SealHolder, SealReport, SEAL_HOLDERS_MAX};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{FileName, InodeId, SealId};
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused and advances it.
use tokio::time::Instant;

/// A seal that its rmdir never lifted lapses (the rmdir's server died, or
/// its removal is not yet on its set's replicas and it could not renew).
pub(crate) const SEAL_LEASE: Duration = Duration::from_secs(30);
/// An rmdir writes its removal within this of sealing, or gives up: every
/// seal it took then outlives the write, so a server whose seal lapsed
/// settles it after the removal, if any, is in the name's store.
pub(crate) const SEAL_WRITE_WITHIN: Duration = Duration::from_secs(15);
pub(crate) const SEALS_MAX: usize = 100_000;
/// How long an rmdir waits for each server's seal (a third of
/// `SEAL_WRITE_WITHIN`; a healthy server answers in milliseconds).
const SEAL_ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How long a restarted server's first entry into a directory waits for
/// the others' seals of it (`recall_seals`; best effort, each of them
/// holds the same seals).
const SEAL_REPORT_WITHIN: Duration = Duration::from_secs(2);
/// Unseals a restarted server remembers during that time.
const SEALS_LIFTED_MAX: usize = 4096;

#[derive(Clone, Debug)]
pub(crate) enum SealState {
    /// Rmdirs of the directory, named `name` in `parent`, are deciding:
    /// each holder until its own time (renewed while it waits for its
    /// replicas). Two rmdirs of one directory (two `rm -r`, or an rmdir
    /// and a rename onto it) each hold their own seal, and an Unseal lifts
    /// only its sender's (a late one, of an attempt that gave up, cannot
    /// lift the seal of the attempt that followed it).
    Sealed {
        holders: Vec<(SealId, Instant)>,
        parent: InodeId,
        name: FileName,
    },
    Removed,
}

/// What a server started on an existing store keeps for one lease after
/// its start, while it may lack seals its predecessor held
/// (`Server::recall_seals`).
pub(crate) struct SealRecall {
    /// None for a new store, which never answered a seal.
    until: Option<Instant>,
    seen: std::sync::Mutex<Recalled>,
}

#[derive(Default)]
struct Recalled {
    /// Directories whose seals were asked of the others.
    asked: std::collections::HashSet<InodeId>,
    /// Seals lifted here, newest last (bounded): a report from a server
    /// that has not yet heard the same Unseal must not bring them back.
    lifted: std::collections::VecDeque<(InodeId, SealId)>,
}

impl SealRecall {
    pub(crate) fn after_start(new_store: bool) -> SealRecall {
        SealRecall {
            until: (!new_store).then(|| Instant::now() + SEAL_LEASE),
            seen: Default::default(),
        }
    }

    fn open(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() < t)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Recalled> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `dir`'s seals are still to be asked of the others.
    fn to_ask(&self, dir: InodeId) -> bool {
        self.open() && !self.seen().asked.contains(&dir)
    }

    fn asked(&self, dir: InodeId) {
        let mut seen = self.seen();
        if seen.asked.len() >= SEALS_MAX {
            seen.asked.clear();
        }
        seen.asked.insert(dir);
    }

    fn lifted_here(&self, dir: InodeId) -> Vec<SealId> {
        let seen = self.seen();
        seen.lifted
            .iter()
            .filter(|&&(d, _)| d == dir)
            .map(|&(_, id)| id)
            .collect()
    }

    fn note_lifted(&self, dir: InodeId, seal: SealId) {
        if !self.open() {
            return;
        }
        let mut seen = self.seen();
        if seen.lifted.len() >= SEALS_LIFTED_MAX {
            seen.lifted.pop_front();
        }
        seen.lifted.push_back((dir, seal));
    }
}

/// When the last of `holders` lapses.
fn lapses_at(holders: &[(SealId, Instant)]) -> Instant {
    let latest = holders.iter().map(|&(_, until)| until).max();
    latest.unwrap_or_else(Instant::now)
}

impl Server {
    /// The seal on `dir` here, lapsed or not.
    pub(crate) fn seal_state(&self, dir: InodeId) -> Option<SealState> {
        let seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
        seals.get(&dir).cloned()
    }

    /// Wait while an rmdir of `dir` is deciding; ENOENT once it is removed.
    /// A seal that lapsed is settled with the removed name's server first.
    pub(crate) async fn wait_unsealed(&self, dir: InodeId) -> Result<(), WireError> {
        self.recall_seals(dir).await;
        loop {
            let notified = self.seal_changed.notified();
            match self.seal_state(dir) {
                None => return Ok(()),
                Some(SealState::Removed) => return Err(removed(dir)),
                Some(SealState::Sealed {
                    holders,
                    parent,
                    name,
                }) => {
                    let left = lapses_at(&holders).saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return self.settle_lapsed_seal(dir, parent, name).await;
                    }
                    let _ = tokio::time::timeout(left, notified).await;
                }
            }
        }
    }

    /// `keys` and `dir`'s gate (`Locks::lock_gated`), taken once `dir` is
    /// not sealed: an entry written under them cannot land in a directory
    /// that an rmdir found empty. A seal is waited for with nothing held.
    pub(crate) async fn lock_unsealed(
        &self,
        dir: InodeId,
        keys: &[LockKey<'_>],
    ) -> Result<Gated<'_>, WireError> {
        loop {
            self.wait_unsealed(dir).await?;
            let held = self.locks.lock_gated(dir, keys).await?;
            // Sealed between the wait and the gate: wait again, unlocked.
            if self.seal_state(dir).is_none() {
                return Ok(held);
            }
        }
    }

    /// Seals live in memory: a server that started (or took a set over)
    /// less than a lease ago may have lost seals its predecessor took,
    /// while every other server still holds them (an rmdir seals them
    /// all). So the first entry into each directory in that time asks
    /// the others what they hold and takes it up (the plain simulation's
    /// seed 9134: a server restarted between an rmdir's seal and its
    /// removal let a create into the directory being removed). Seals
    /// taken since the start reach this server itself.
    async fn recall_seals(&self, dir: InodeId) {
        if !self.seal_recall.to_ask(dir) {
            return;
        }
        let op = Op::ReportSeals { dir };
        let answers = self.broadcast_within(op, SEAL_REPORT_WITHIN).await;
        let now = Instant::now();
        let lifted = self.seal_recall.lifted_here(dir);
        let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
        for (s, answer) in answers {
            match answer {
                Ok(Reply::SealReport(SealReport::Unsealed)) => {}
                Ok(Reply::SealReport(SealReport::Removed)) => {
                    seals.insert(dir, SealState::Removed);
                }
                Ok(Reply::SealReport(SealReport::Sealed {
                    parent,
                    name,
                    mut holders,
                })) => {
                    // One lifted here already: that server has not heard
                    // its Unseal yet. None left: nothing to take up (a
                    // seal with no holder would read as lapsed).
                    holders.retain(|h| !lifted.contains(&h.seal));
                    if holders.is_empty() {
                        continue;
                    }
                    let state = seals.entry(dir).or_insert_with(|| SealState::Sealed {
                        holders: Vec::new(),
                        parent,
                        name,
                    });
                    if let SealState::Sealed { holders: mine, .. } = state {
                        for SealHolder { seal, left_ms } in holders {
                            if mine.len() < SEAL_HOLDERS_MAX && !mine.iter().any(|h| h.0 == seal) {
                                let left = Duration::from_millis(u64::from(left_ms));
                                mine.push((seal, now + left.min(SEAL_LEASE)));
                            }
                        }
                    }
                }
                // Best effort: the other servers hold the same seals.
                Ok(other) => tracing::warn!("server {s} reported seals with {other:?}"),
                Err(e) => tracing::info!("asking server {s} for seals of directory {dir}: {e}"),
            }
        }
        drop(seals);
        self.seal_recall.asked(dir);
        self.seal_changed.notify_waiters();
    }

    /// The rmdir that sealed `dir` never said how it ended: ask the server
    /// of its name. Its answer counts only once its set's replicas have
    /// it, so a failover cannot undo it; until it can answer, entries into
    /// `dir` fail with its error rather than land in a directory that may
    /// be gone (found by the simulation with replicas, seed 5363).
    async fn settle_lapsed_seal(
        &self,
        dir: InodeId,
        parent: InodeId,
        name: FileName,
    ) -> Result<(), WireError> {
        tracing::info!("the seal of directory {dir} lapsed; asking how its removal ended");
        let server = madfs_types::dentry_server(parent, &name, self.servers);
        let op = Op::Seal {
            dir,
            parent,
            name,
            action: SealAction::Settle,
            seal: SealId(0),
        };
        let removed_there = match self.call_peer(server, op).await? {
            Reply::RemovalSettled { removed } => removed,
            other => {
                return Err(err(
                    ErrorCode::Protocol,
                    format!("a seal's settlement answered {other:?}"),
                ))
            }
        };
        let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
        if removed_there {
            seals.insert(dir, SealState::Removed);
        } else if matches!(seals.get(&dir), Some(SealState::Sealed { holders, .. }) if lapses_at(holders) <= Instant::now())
        {
            seals.remove(&dir);
        }
        drop(seals);
        self.seal_changed.notify_waiters();
        if removed_there {
            self.dir_cache.forget(dir);
            return Err(removed(dir));
        }
        Ok(())
    }

    /// What this server holds of `dir`'s seals (`Op::ReportSeals`).
    pub(crate) fn report_seals(&self, dir: InodeId) -> OpResult {
        let now = Instant::now();
        let report = match self.seal_state(dir) {
            None => SealReport::Unsealed,
            Some(SealState::Removed) => SealReport::Removed,
            Some(SealState::Sealed {
                holders,
                parent,
                name,
            }) => SealReport::Sealed {
                parent,
                name,
                holders: holders
                    .iter()
                    .map(|&(seal, until)| SealHolder {
                        seal,
                        left_ms: until
                            .saturating_duration_since(now)
                            .as_millis()
                            .try_into()
                            .unwrap_or(u32::MAX),
                    })
                    .collect(),
            },
        };
        Ok((Reply::SealReport(report), Vec::new()))
    }

    pub(crate) async fn seal(
        &self,
        dir: InodeId,
        parent: InodeId,
        name: FileName,
        action: SealAction,
        seal: SealId,
    ) -> OpResult {
        match action {
            SealAction::Seal => {
                // Exclusive gate: no create into `dir` is between its check
                // and its write while we look.
                let _gate = self.locks.gate(dir).write().await;
                {
                    let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    let state = seals.entry(dir).or_insert_with(|| SealState::Sealed {
                        holders: Vec::new(),
                        parent,
                        name: name.clone(),
                    });
                    let SealState::Sealed {
                        holders,
                        parent: sealed_parent,
                        name: sealed_name,
                    } = state
                    else {
                        // A renewal that came after the outcome.
                        return Ok((Reply::Sealed { empty: true }, Vec::new()));
                    };
                    // A renewal replaces its own entry. Lapsed holders
                    // stay: their rmdirs may have written the removal
                    // (not yet on their replicas), so the directory is
                    // settled with its name's server once all lapse.
                    holders.retain(|&(id, _)| id != seal);
                    if holders.len() >= SEAL_HOLDERS_MAX {
                        return Err(err(
                            ErrorCode::TryAgain,
                            format!("{} removals of directory {dir} at once", holders.len()),
                        ));
                    }
                    holders.push((seal, now + SEAL_LEASE));
                    // The latest attempt's name: a lapsed seal is settled
                    // with that name's server.
                    (*sealed_parent, *sealed_name) = (parent, name);
                }
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
                self.seal_recall.note_lifted(dir, seal);
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(SealState::Sealed { holders, .. }) = seals.get_mut(&dir) {
                    holders.retain(|&(id, _)| id != seal);
                    if holders.is_empty() {
                        seals.remove(&dir);
                    }
                }
                drop(seals);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
            SealAction::Removed => {
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if seals.len() >= SEALS_MAX {
                    // The owner's records answer for forgotten tombstones.
                    seals.retain(|_, s| matches!(s, SealState::Sealed { .. }));
                }
                seals.insert(dir, SealState::Removed);
                drop(seals);
                self.dir_cache.forget(dir);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
            SealAction::Settle => {
                // Asked of the name's server: its DIR_REMOVAL record is
                // written with the removal and kept until every server
                // heard the outcome. Not before the set's replicas have
                // what this store holds, or a failover could undo it.
                self.must_be_replicated("the directory's removal").await?;
                let removed = self
                    .kv
                    .get(&keys::dir_removal(dir))
                    .map_err(kv_err)?
                    .is_some();
                Ok((Reply::RemovalSettled { removed }, Vec::new()))
            }
        }
    }

    /// Seal `r.dir` on every server; Ok if it is empty everywhere, else the
    /// seals are lifted again and the error says why. Also renews seals
    /// (a seal on a server that heard the outcome is left alone).
    pub(crate) async fn seal_empty_dir(&self, r: &DirRemoval) -> Result<Sealed, WireError> {
        let at = Instant::now();
        // Bounded well inside `SEAL_WRITE_WITHIN`: seals that took longer
        // could not be written under, and the rmdir started over, each
        // time as slowly while a server was cut off (the replicated
        // simulation with 4 servers, seed 25357: an rmdir unanswered for
        // minutes).
        let results = self
            .broadcast_within(r.op(SealAction::Seal), SEAL_ANSWER_WITHIN)
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
            None => Ok(Sealed {
                removal: r.clone(),
                at,
            }),
            Some(e) => {
                self.unseal(r).await;
                Err(e)
            }
        }
    }

    /// Push the lapse of `r`'s seals back (best effort: a server that
    /// misses it settles its seal once it lapses).
    pub(crate) async fn renew_seals(&self, r: &DirRemoval) {
        for (s, res) in self.broadcast(r.op(SealAction::Seal)).await {
            if let Err(e) = res {
                tracing::debug!(
                    "renewing the seal of directory {} on server {s}: {e}",
                    r.dir
                );
            }
        }
    }

    pub(crate) async fn unseal(&self, r: &DirRemoval) {
        self.broadcast(r.op(SealAction::Unseal)).await;
    }

    /// Tell every server the directory is gone; true if all of them heard.
    pub(crate) async fn announce_removed(&self, r: &DirRemoval) -> bool {
        let mut all = true;
        for (s, res) in self.broadcast(r.op(SealAction::Removed)).await {
            if let Err(e) = res {
                tracing::warn!("telling server {s} that directory {} is gone: {e}", r.dir);
                all = false;
            }
        }
        all
    }
}

fn removed(dir: InodeId) -> WireError {
    err(ErrorCode::NotFound, format!("directory {dir} was removed"))
}

/// Seals an rmdir (or a rename onto an empty directory) took, and when.
pub(crate) struct Sealed {
    pub(crate) removal: DirRemoval,
    at: Instant,
}

impl Sealed {
    /// The removal may still be written: every seal outlives the write
    /// (`SEAL_WRITE_WITHIN`). Else the caller lifts them and starts over.
    pub(crate) fn check_in_time(&self) -> Result<(), WireError> {
        if self.at.elapsed() > SEAL_WRITE_WITHIN {
            return Err(err(
                ErrorCode::TryAgain,
                "the directory's seals are too old to remove it under",
            ));
        }
        Ok(())
    }
}

/// A directory being removed: `dir`, named `name` in `parent`, by the
/// attempt `seal` (a new one for each attempt; none for a removal read
/// back from its record, which only announces the outcome).
#[derive(Clone, Debug)]
pub(crate) struct DirRemoval {
    pub(crate) dir: InodeId,
    pub(crate) parent: InodeId,
    pub(crate) name: FileName,
    pub(crate) seal: SealId,
}

impl DirRemoval {
    /// The DIR_REMOVAL record's value: parent (u64 BE), then the name.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + self.name.as_bytes().len());
        v.extend_from_slice(&self.parent.0.to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    pub(crate) fn decode(dir: InodeId, v: &[u8]) -> Option<DirRemoval> {
        let (parent, name) = v.split_at_checked(8)?;
        Some(DirRemoval {
            dir,
            parent: InodeId(u64::from_be_bytes(parent.try_into().ok()?)),
            name: FileName::new(name).ok()?,
            seal: SealId(0),
        })
    }

    fn op(&self, action: SealAction) -> Op {
        Op::Seal {
            dir: self.dir,
            parent: self.parent,
            name: self.name.clone(),
            action,
            seal: self.seal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_record_decodes_to_what_was_encoded_and_a_short_one_to_nothing() {
        let r = DirRemoval {
            dir: InodeId(77),
            parent: InodeId(1 << 48 | 5),
            name: FileName::new(b"some dir").unwrap(),
            seal: SealId::fresh(),
        };
        let back = DirRemoval::decode(r.dir, &r.encode()).unwrap();
        assert_eq!(
            (back.dir, back.parent, back.name),
            (r.dir, r.parent, r.name)
        );
        assert!(DirRemoval::decode(InodeId(77), &[0; 7]).is_none());
        assert!(
            DirRemoval::decode(InodeId(77), &[0; 8]).is_none(),
            "no name"
        );
    }
}
