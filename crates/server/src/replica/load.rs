//! A resync's load, the replica's side (replication.rs `load` is the
//! primary's): the reset that wipes the copy's metadata, the digests the
//! primary compares chunk files by, and the load's records. Chunk files
//! survive the reset: the primary asks how the copy holds each of its own
//! (`digests`) and sends only those that differ, so a copy back after a
//! power cut or a long absence is not sent what it already holds. The
//! load's end drops the copy's chunk files the primary did not ask about
//! (removed on the primary while the copy was away).

use super::{ack, copy_dir, keys, open_copy, Position, ReplicaCopies, ReplicaCopy};
use crate::errors::{err, OpResult};
use crate::replication::Record;
use madfs_kv::WriteBatch;
use madfs_proto::message::Reply;
use madfs_proto::ErrorCode;
use madfs_types::{ChunkIndex, InodeId, ServerId};
use std::collections::HashSet;
use std::path::Path;

impl ReplicaCopies {
    /// A load call of a resync (first_seq 0): a `Reset` (wipe the copy's
    /// metadata, follow `stream` from its record `applied + 1`) or the
    /// copy's contents, applied as they come and not numbered.
    pub(super) async fn load(
        &self,
        set: ServerId,
        stream: u64,
        records: Vec<Record>,
        slot: &mut Option<ReplicaCopy>,
    ) -> OpResult {
        let failed = |e: String| {
            err(
                ErrorCode::Io,
                format!("server {}'s copy of set {set}: resync: {e}", self.me),
            )
        };
        if let Some(Record::Reset { applied }) = records.first() {
            let applied = *applied;
            // Dropped first: RocksDB's lock goes with it.
            *slot = None;
            let (dir, stores, boot) = (copy_dir(&self.root, set), self.stores.clone(), self.boot);
            let (root, me) = (self.root.clone(), self.me);
            let copy = crate::service::blocking(move || {
                // Everything but the chunk files goes (the metadata store,
                // or the simulation's marker of it).
                match std::fs::read_dir(&dir) {
                    Ok(entries) => {
                        for e in entries {
                            let e = e?;
                            if e.file_name() == "chunks" {
                                continue;
                            }
                            if e.file_type()?.is_dir() {
                                std::fs::remove_dir_all(e.path())?;
                            } else {
                                std::fs::remove_file(e.path())?;
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                if set == me {
                    start_from_moved_home(&root, &dir)?;
                }
                let copy = open_copy(dir, stores.as_deref(), boot)?;
                let mut b = WriteBatch::new();
                b.put(
                    keys::META_REPLICA_POSITION,
                    &Position::new(stream, applied, false, None).encode(),
                );
                b.put(keys::META_REPLICA_LOADING, &[]);
                copy.kv
                    .write(b, true)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                Ok(copy)
            })
            .await
            .map_err(|e| failed(e.to_string()))?;
            *slot = Some(ReplicaCopy {
                stream,
                applied,
                partial: true,
                load_seen: Some(HashSet::new()),
                ..copy
            });
            tracing::info!(
                "server {}: copy of set {set} wiped for a resync (its chunk files kept to \
                 compare), from record {}",
                self.me,
                applied + 1
            );
            return ack(applied);
        }
        let copy = slot.as_mut().expect("opened before");
        if copy.stream != stream {
            return Err(failed("contents before the reset".into()));
        }
        // The load ends with a sync: the copy is whole and durable from
        // then on, at the reset's position (the records after it, replayed
        // on top, bring what the load took mid-change to its final value).
        let ends = matches!(records.last(), Some(Record::Sync));
        let keep = match (ends, &mut copy.load_seen) {
            (false, _) => None,
            (true, Some(seen)) => Some(std::mem::take(seen)),
            (true, None) => return Err(failed(not_started(self.me))),
        };
        let (kv, chunks) = (copy.kv.clone(), copy.chunks.clone());
        let at = Position::new(copy.stream, copy.applied, true, None);
        let dropped = crate::service::blocking(move || {
            // Before the closing sync, which makes the removals durable.
            let mut dropped = 0u64;
            if let Some(keep) = keep {
                for (ino, index, path) in chunks.list_chunks()? {
                    if !keep.contains(&(ino, index)) {
                        chunks.drop_file(&path)?;
                        dropped += 1;
                    }
                }
            }
            for r in records {
                super::apply_one(kv.as_ref(), &chunks, r, None).map_err(std::io::Error::other)?;
            }
            if ends {
                let mut b = WriteBatch::new();
                b.delete(keys::META_REPLICA_LOADING);
                b.put(keys::META_REPLICA_POSITION, &at.encode());
                kv.write(b, true)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
            }
            Ok(dropped)
        })
        .await
        .map_err(|e| failed(e.to_string()))?;
        if ends {
            copy.partial = false;
            copy.load_seen = None;
            tracing::info!(
                "server {}: copy of set {set} loaded; {dropped} chunk files its primary no \
                 longer has dropped",
                self.me
            );
        }
        ack(copy.applied)
    }

    /// A resync's question (`Op::ReplicaDigests`): how the copy of `set`,
    /// being loaded from `stream`, holds each of `chunks`. Each file asked
    /// about is kept at the load's end unless a record drops it, and one
    /// held is synced by the load's closing sync.
    pub(crate) async fn digests(
        &self,
        set: ServerId,
        stream: u64,
        chunks: Vec<(InodeId, ChunkIndex)>,
    ) -> OpResult {
        self.keeps(set)?;
        let slot = self.slot(set);
        let mut slot = slot.lock_owned().await;
        self.not_promoted(set)?;
        let stale = || {
            err(
                ErrorCode::Stale,
                format!(
                    "server {}'s copy of set {set}: {}",
                    self.me,
                    not_started(self.me)
                ),
            )
        };
        let Some(copy) = slot.as_mut() else {
            return Err(stale());
        };
        if copy.stream != stream {
            return Err(stale());
        }
        let Some(seen) = copy.load_seen.as_mut() else {
            return Err(stale());
        };
        seen.extend(chunks.iter().copied());
        let store = copy.chunks.clone();
        let digests = crate::service::blocking(move || {
            chunks
                .into_iter()
                .map(|(ino, index)| {
                    let d = store.digest(ino, index)?;
                    if d.is_some() {
                        store.sync_later(ino, index);
                    }
                    Ok(d)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .await
        .map_err(|e| {
            err(
                ErrorCode::Io,
                format!("server {}'s copy of set {set}: digests: {e}", self.me),
            )
        })?;
        Ok((Reply::ChunkDigests { digests }, Vec::new()))
    }
}

/// A server catching up on its own set, which moved away: its old store's
/// chunk files (never served again, `HOME_SET_MOVED`) become the copy's
/// before the first load compares them, so the load sends only what
/// changed since, not the whole set. Only where the copy has no chunk
/// files yet; the old store keeps its metadata (unused).
fn start_from_moved_home(root: &Path, copy: &Path) -> std::io::Result<()> {
    let (home, into) = (root.join("chunks"), copy.join("chunks"));
    if !root.join(crate::failover::HOME_SET_MOVED).exists() || !home.exists() {
        return Ok(());
    }
    // An empty chunk directory (made when the copy was first opened, to
    // ask whether it was whole) is taken away; one with files is kept.
    match std::fs::read_dir(&into).map(|mut entries| entries.next().is_none()) {
        Ok(true) => std::fs::remove_dir(&into)?,
        Ok(false) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(copy)?;
    std::fs::rename(&home, &into)?;
    // Both directory entries durable: a crash after leaves the files in
    // one place or the other, never in neither.
    std::fs::File::open(root)?.sync_all()?;
    std::fs::File::open(copy)?.sync_all()?;
    tracing::info!(
        "the chunk files of the moved store in {} start the copy of its set in {}",
        home.display(),
        into.display()
    );
    Ok(())
}

fn not_started(me: ServerId) -> String {
    format!("no load of it started in this process of server {me} (restarted meanwhile?)")
}
