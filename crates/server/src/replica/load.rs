//! A resync's load, the replica's side (replication/resync.rs `load` is the
//! primary's): the reset that starts it, the questions the primary
//! compares metadata ranges and chunk files by, and the load's records.
//! The copy's keys and chunk files survive the reset: the primary asks
//! whether each range of its keys hashes as the copy's (`key_range`; the
//! copy drops a range that differs, and the primary sends its own) and how
//! the copy holds each of its chunk files (`digests`; it sends only those
//! that differ), so a copy back after a power cut or a long absence is not
//! sent what it already holds. The load's end drops the copy's chunk files
//! the primary did not ask about (removed on the primary while the copy
//! was away).

use super::{ack, copy_dir, keys, open_copy, Position, ReplicaCopies, ReplicaCopy};
use crate::errors::{err, OpResult};
use crate::failover::HOME_SET_MOVED;
use crate::replication::Record;
use madfs_kv::{KvStore, WriteBatch};
use madfs_proto::message::Reply;
use madfs_proto::ErrorCode;
use madfs_types::{ChunkIndex, InodeId, ServerId};
use std::collections::HashSet;
use std::path::Path;

impl ReplicaCopies {
    /// A load call of a resync (first_seq 0; `stream` is the load's id): a
    /// `Reset` (the copy follows its stream from record `applied + 1`
    /// once loaded; this load is the one under way) or the copy's
    /// contents, applied as they come and not numbered, refused unless
    /// they are of the load under way.
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
        if let Some(&Record::Reset {
            applied,
            stream: follows,
        }) = records.first()
        {
            let load = stream;
            let stream = follows;
            let (dir, stores, boot) = (copy_dir(&self.root, set), self.stores.clone(), self.boot);
            let (root, me) = (self.root.clone(), self.me);
            let open = slot.take();
            let home = self.home.clone().filter(|_| set == me);
            let copy = crate::service::blocking(move || {
                let moved_home = home.filter(|_| root.join(HOME_SET_MOVED).exists());
                if moved_home.is_some() {
                    start_from_moved_home(&root, &dir)?;
                }
                // The copy's metadata stays, to be compared range by range
                // (`key_range`). One that does not open (damaged) goes,
                // with everything but the chunk files.
                let copy = match open {
                    Some(copy) => copy,
                    None => match open_copy(dir.clone(), stores.as_deref(), boot) {
                        Ok(copy) => copy,
                        Err(e) => {
                            tracing::warn!(
                                "server {me}: copy of set {set} does not open ({e}); its \
                                 metadata is dropped for the resync"
                            );
                            wipe_all_but_chunks(&dir)?;
                            open_copy(dir, stores.as_deref(), boot)?
                        }
                    },
                };
                if let Some(home) = moved_home {
                    keys_from_moved_home(home.as_ref(), copy.kv.as_ref())?;
                }
                let mut b = WriteBatch::new();
                // A copy once served (promoted, then the set moved on)
                // still holds a served store's own records; as a copy it
                // has none (a wipe dropped them before).
                for k in [
                    keys::META_SERVED_IN_BOOT,
                    keys::META_WAITED_COPIES,
                    keys::META_STREAM_STOPPED,
                ] {
                    b.delete(k);
                }
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
                load,
                ..copy
            });
            tracing::info!(
                "server {}: copy of set {set} reset for a resync's load (its keys and chunk \
                 files kept to compare), from record {}",
                self.me,
                applied + 1
            );
            return ack(applied);
        }
        let copy = slot.as_mut().expect("opened before");
        if copy.load == 0 || copy.load != stream {
            return Err(failed(
                "contents of a load other than the one under way (one before its reset, or \
                 an earlier one's arriving late)"
                    .into(),
            ));
        }
        self.make_room(set, super::growth(&records), copy).await?;
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
            let dropped = match keep {
                Some(keep) => drop_unasked(&chunks, &keep)?,
                None => 0,
            };
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
            copy.load = 0;
            tracing::info!(
                "server {}: copy of set {set} loaded; {dropped} chunk files its primary no \
                 longer has dropped",
                self.me
            );
        }
        ack(copy.applied)
    }

    /// Room for `growth` bytes of a load into `copy`, the copy of `set`
    /// (`room_for`). Short of it, the copy's chunk files the load has not
    /// asked about yet go first: the load's end would drop those its
    /// primary no longer has, and sends the others again. A copy that left
    /// its set while its server's disk filled up kept the files of
    /// everything removed since, and its load met a full disk before its
    /// end could drop them: the server's own set stayed full for good.
    async fn make_room(
        &self,
        set: ServerId,
        growth: u64,
        copy: &mut ReplicaCopy,
    ) -> Result<(), madfs_proto::WireError> {
        let Err(full) = self.room_for(set, growth, true) else {
            return Ok(());
        };
        let Some(seen) = copy.load_seen.take() else {
            return Err(full);
        };
        let chunks = copy.chunks.clone();
        let (seen, dropped) = crate::service::blocking(move || {
            let dropped = drop_unasked(&chunks, &seen)?;
            Ok((seen, dropped))
        })
        .await
        .map_err(|e| {
            err(
                ErrorCode::Io,
                format!(
                    "server {}'s copy of set {set}: making room for its load: {e}",
                    self.me
                ),
            )
        })?;
        copy.load_seen = Some(seen);
        if dropped > 0 {
            tracing::info!(
                "server {}: copy of set {set} short of room for its load: {dropped} chunk \
                 files not compared yet dropped",
                self.me
            );
        }
        self.room_for(set, growth, true)
    }

    /// A resync's question (`Op::ReplicaDigests`): how the copy of `set`,
    /// being loaded by load `stream` (refused for any other), holds each
    /// of `chunks`. Each file asked
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
        if copy.load == 0 || copy.load != stream {
            return Err(stale());
        }
        let Some(seen) = copy.load_seen.as_mut() else {
            return Err(stale());
        };
        seen.extend(chunks.iter().copied());
        let store = copy.chunks.clone();
        // Hashed outside the lock: the load's records for the files asked
        // about before (never these) apply meanwhile.
        drop(slot);
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

    /// A resync's question about the copy's metadata
    /// (`Op::ReplicaKeyRange`): whether its keys after `after` up to
    /// `upto` hash to the primary's `digest`; those that do not are
    /// dropped, and the load sends the primary's. Keys a store keeps for
    /// itself (`local_only_key`) are neither compared nor dropped.
    pub(crate) async fn key_range(
        &self,
        set: ServerId,
        stream: u64,
        after: Option<Vec<u8>>,
        upto: Option<Vec<u8>>,
        digest: [u8; 16],
    ) -> OpResult {
        self.keeps(set)?;
        let slot = self.slot(set);
        let slot = slot.lock_owned().await;
        self.not_promoted(set)?;
        let kv = match slot.as_ref() {
            Some(copy) if copy.load != 0 && copy.load == stream && copy.load_seen.is_some() => {
                copy.kv.clone()
            }
            _ => {
                return Err(err(
                    ErrorCode::Stale,
                    format!(
                        "server {}'s copy of set {set}: {}",
                        self.me,
                        not_started(self.me)
                    ),
                ))
            }
        };
        let same = crate::service::blocking(move || {
            let start = first_key_after(after);
            let io = |e: madfs_kv::KvError| std::io::Error::other(e.to_string());
            let visit = |f: &mut dyn FnMut(&[u8], &[u8])| {
                kv.scan_visit(b"", &start, &mut |k, v| {
                    if upto.as_deref().is_some_and(|u| k > u) {
                        return false;
                    }
                    if !local_only_key(k) {
                        f(k, v);
                    }
                    true
                })
                .map_err(io)
            };
            let mut mine = KeyRangeDigest::new();
            visit(&mut |k, v| mine.add(k, v))?;
            if mine.finish() == digest {
                return Ok(true);
            }
            let mut drops = Vec::new();
            visit(&mut |k, _| drops.push(k.to_vec()))?;
            for keys in drops.chunks(KEYS_PER_BATCH) {
                let mut b = WriteBatch::new();
                for k in keys {
                    b.delete(k);
                }
                kv.write(b, false).map_err(io)?;
            }
            Ok(false)
        })
        .await
        .map_err(|e| {
            err(
                ErrorCode::Io,
                format!("server {}'s copy of set {set}: key range: {e}", self.me),
            )
        })?;
        Ok((Reply::KeyRangeSame { same }, Vec::new()))
    }
}

/// Drop every chunk file of a copy that its load has not asked about
/// (`asked`); how many went.
fn drop_unasked(
    chunks: &crate::chunks::ChunkStore,
    asked: &HashSet<(InodeId, ChunkIndex)>,
) -> std::io::Result<u64> {
    let mut dropped = 0u64;
    for (ino, index, path) in chunks.list_chunks()? {
        if !asked.contains(&(ino, index)) {
            chunks.drop_file(&path)?;
            dropped += 1;
        }
    }
    Ok(dropped)
}

/// Where a scan of the keys after `after` starts (from the first key, if
/// None): the smallest key above it is it with a zero byte appended.
pub(crate) fn first_key_after(after: Option<Vec<u8>>) -> Vec<u8> {
    let mut start = after.unwrap_or_default();
    if !start.is_empty() {
        start.push(0);
    }
    start
}

/// Keys dropped from (or copied into) a copy in one batch.
const KEYS_PER_BATCH: usize = 4096;

/// Keys a store keeps for itself, not part of its set's contents: a load
/// neither sends, compares nor drops them. (The boot a store was served in
/// is its host's, not the set's; the copies its acknowledgements waited
/// for are its own; a copy's position is the copy's.)
pub(crate) fn local_only_key(k: &[u8]) -> bool {
    [
        keys::META_SERVED_IN_BOOT,
        keys::META_WAITED_COPIES,
        keys::META_STREAM_STOPPED,
        keys::META_REPLICA_POSITION,
        keys::META_REPLICA_LOADING,
    ]
    .contains(&k)
}

/// The hash a load compares a range of keys by, on both sides: xxh3-128
/// over each pair in key order, lengths first (so that no two different
/// lists of pairs feed it the same bytes).
pub(crate) struct KeyRangeDigest(xxhash_rust::xxh3::Xxh3);

impl KeyRangeDigest {
    pub(crate) fn new() -> KeyRangeDigest {
        KeyRangeDigest(xxhash_rust::xxh3::Xxh3::new())
    }

    pub(crate) fn add(&mut self, key: &[u8], value: &[u8]) {
        self.0.update(&(key.len() as u64).to_le_bytes());
        self.0.update(key);
        self.0.update(&(value.len() as u64).to_le_bytes());
        self.0.update(value);
    }

    pub(crate) fn finish(&self) -> [u8; 16] {
        self.0.digest128().to_le_bytes()
    }
}

/// Everything in a copy's directory but its chunk files (a metadata store
/// that does not open).
fn wipe_all_but_chunks(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
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
    Ok(())
}

/// A server catching up on its own set, which moved away: its old store's
/// chunk files (never served again, `HOME_SET_MOVED`) become the copy's
/// before the first load compares them, so the load sends only what
/// changed since, not the whole set. Only where the copy has no chunk
/// files yet (its keys: `keys_from_moved_home`).
fn start_from_moved_home(root: &Path, copy: &Path) -> std::io::Result<()> {
    let (home, into) = (root.join("chunks"), copy.join("chunks"));
    if !home.exists() {
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

/// The same for the moved store's keys: where the copy holds none of the
/// set's yet, they are copied in (the home store stays open, unused), so
/// that the load finds most ranges as the primary holds them.
fn keys_from_moved_home(home: &dyn KvStore, copy: &dyn KvStore) -> std::io::Result<()> {
    let io = |e: madfs_kv::KvError| std::io::Error::other(e.to_string());
    let mut any = false;
    copy.scan_visit(b"", b"", &mut |k, _| {
        any = !local_only_key(k);
        !any
    })
    .map_err(io)?;
    if any {
        return Ok(());
    }
    let (mut b, mut n) = (WriteBatch::new(), 0u64);
    let mut failed = None;
    home.scan_visit(b"", b"", &mut |k, v| {
        if !local_only_key(k) {
            b.put(k, v);
            n += 1;
        }
        if b.len() >= KEYS_PER_BATCH {
            if let Err(e) = copy.write(std::mem::take(&mut b), false) {
                failed = Some(e);
                return false;
            }
        }
        true
    })
    .map_err(io)?;
    if let Some(e) = failed {
        return Err(io(e));
    }
    copy.write(b, false).map_err(io)?;
    tracing::info!("the keys of the moved store ({n}) start the copy of its set");
    Ok(())
}

fn not_started(me: ServerId) -> String {
    format!("no load of it started in this process of server {me} (restarted meanwhile?)")
}
