//! Durable Raft state in a `KvStore` (RocksDB in production): the log, the
//! vote, the commit index and the latest snapshot, and the state machine
//! (the cluster map) rebuilt from them.
//!
//! What must survive a crash, and how: the vote and every appended or
//! truncated entry are written with `sync = true` before openraft is told
//! they are done, so a restarted voter never votes twice in a term and never
//! forgets an entry it acknowledged (which a leader may have counted toward
//! a commit). A snapshot is written synced before openraft may purge the
//! entries it covers. The commit index and purges are written unsynced:
//! losing them leaves a smaller commit index (learned again from the
//! leader) or entries the snapshot already covers, both harmless. The map
//! itself is never stored apart from snapshots: on start it is the latest
//! snapshot's, and openraft applies the committed entries after it again.
//!
//! Keys (4-byte prefixes, as the server's tables): `VOTE`, `COMM` (commit
//! index), `PURG` (last purged log id), `SNAP` (snapshot meta and data),
//! `LOGE` + big-endian index (one entry each), `INCA` (the node's
//! incarnation, written once, synced, before Raft starts, by a node that
//! joined as a replacement; absent for the original voters, incarnation 0)
//! and `REPL` (the voter such a node takes the place of, if another server:
//! written in the same synced batch).

// openraft's storage traits return its `StorageError` (over 200 bytes);
// the helpers here return the same type so the trait methods can use `?`.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use madfs_kv::{KvError, KvStore, WriteBatch};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state::{Applied, ClusterMap, Machine};
use crate::wire::{decode, encode, NodeId, TypeConfig};
use crate::MembershipError;

const KEY_VOTE: &[u8] = b"VOTE";
const KEY_COMMITTED: &[u8] = b"COMM";
const KEY_PURGED: &[u8] = b"PURG";
const KEY_SNAPSHOT: &[u8] = b"SNAP";
const PREFIX_LOG: &[u8] = b"LOGE";
const KEY_INCARNATION: &[u8] = b"INCA";
const KEY_REPLACES: &[u8] = b"REPL";

type StoreResult<T> = Result<T, StorageError<NodeId>>;

fn log_key(index: u64) -> Vec<u8> {
    let mut key = PREFIX_LOG.to_vec();
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn read_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::read(&io::Error::other(e.to_string())).into()
}

fn write_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write(&io::Error::other(e.to_string())).into()
}

/// Read and decode the record at `key`, if any.
fn get_record<T: serde::de::DeserializeOwned>(
    kv: &dyn KvStore,
    key: &[u8],
) -> StoreResult<Option<T>> {
    match kv.get(key).map_err(read_err)? {
        None => Ok(None),
        Some(bytes) => decode(&bytes).map(Some).map_err(read_err),
    }
}

fn put_record<T: Serialize>(
    kv: &dyn KvStore,
    key: &[u8],
    value: &T,
    sync: bool,
) -> StoreResult<()> {
    let mut batch = WriteBatch::new();
    batch.put(key, &encode(value));
    kv.write(batch, sync).map_err(write_err)
}

/// The entries with index in `[start, end)`, in order.
fn read_entries(kv: &dyn KvStore, start: u64, end: u64) -> StoreResult<Vec<Entry<TypeConfig>>> {
    let mut entries = Vec::new();
    let mut failure = None;
    kv.scan_visit(PREFIX_LOG, &log_key(start), &mut |key, value| {
        let index = match key[PREFIX_LOG.len()..].try_into() {
            Ok(bytes) => u64::from_be_bytes(bytes),
            Err(_) => {
                failure = Some(format!("log key of {} bytes", key.len()));
                return false;
            }
        };
        if index >= end {
            return false;
        }
        match decode::<Entry<TypeConfig>>(value) {
            Ok(entry) => {
                assert_eq!(
                    entry.log_id.index, index,
                    "log entry stored under another index"
                );
                entries.push(entry);
                true
            }
            Err(e) => {
                failure = Some(format!("log entry {index}: {e}"));
                false
            }
        }
    })
    .map_err(read_err)?;
    match failure {
        Some(why) => Err(read_err(why)),
        None => Ok(entries),
    }
}

fn range_to_indexes<RB: RangeBounds<u64>>(range: &RB) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i.saturating_add(1),
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

/// The incarnation stored by a node that joined as a replacement; `None`
/// for an original voter's store (incarnation 0) or an empty one.
pub(crate) fn read_incarnation(kv: &dyn KvStore) -> Result<Option<u64>, MembershipError> {
    get_record(kv, KEY_INCARNATION).map_err(|e| MembershipError::Storage(e.to_string()))
}

/// Record the incarnation and the voter it takes the place of, synced, in
/// one batch, before Raft runs: a restart must come back as the same node,
/// never as incarnation 0 (whose votes it does not have), and finish the
/// same change.
pub(crate) fn write_identity(
    kv: &dyn KvStore,
    incarnation: u64,
    replaces: Option<u16>,
) -> Result<(), MembershipError> {
    let mut batch = WriteBatch::new();
    put_identity(&mut batch, incarnation, replaces);
    kv.write(batch, true)
        .map_err(|e| MembershipError::Storage(e.to_string()))
}

/// The identity records (`INCA`, `REPL`) in `batch`.
fn put_identity(batch: &mut WriteBatch, incarnation: u64, replaces: Option<u16>) {
    batch.put(KEY_INCARNATION, &encode(&incarnation));
    batch.put(KEY_REPLACES, &encode(&replaces));
}

/// Forget the Raft state of the node `kv` held (its vote, log, snapshot,
/// commit index and identity) and record a new identity, in one synced
/// batch: a crash leaves either the old node whole or the new identity,
/// never an empty store, which a restart of an original voter would take
/// for incarnation 0 with none of its votes.
pub(crate) fn take_new_identity(
    kv: &dyn KvStore,
    incarnation: u64,
    replaces: Option<u16>,
) -> Result<(), MembershipError> {
    let mut batch = WriteBatch::new();
    for key in [KEY_VOTE, KEY_COMMITTED, KEY_PURGED, KEY_SNAPSHOT] {
        batch.delete(key);
    }
    kv.scan_visit(PREFIX_LOG, PREFIX_LOG, &mut |key, _| {
        batch.delete(key);
        true
    })?;
    put_identity(&mut batch, incarnation, replaces);
    kv.write(batch, true)
        .map_err(|e| MembershipError::Storage(e.to_string()))
}

/// The voter a joined node takes the place of (`None`: itself, or none).
pub(crate) fn read_replaces(kv: &dyn KvStore) -> Result<Option<u16>, MembershipError> {
    let stored: Option<Option<u16>> =
        get_record(kv, KEY_REPLACES).map_err(|e| MembershipError::Storage(e.to_string()))?;
    Ok(stored.flatten())
}

/// Whether the store holds any Raft state (a vote, log entries or a
/// snapshot): a node with state must not take a new identity.
pub(crate) fn holds_raft_state(kv: &dyn KvStore) -> Result<bool, MembershipError> {
    for key in [KEY_VOTE, KEY_SNAPSHOT, KEY_PURGED] {
        if kv.get(key)?.is_some() {
            return Ok(true);
        }
    }
    let mut any_entry = false;
    kv.scan_visit(PREFIX_LOG, PREFIX_LOG, &mut |_, _| {
        any_entry = true;
        false
    })?;
    Ok(any_entry)
}

/// The store as a node's Raft tasks hold it: its own count of handles,
/// whatever else holds the store (`Membership::stop` waits for it).
pub(crate) struct Held(pub(crate) Arc<dyn KvStore>);

impl KvStore for Held {
    fn get(&self, key: &[u8]) -> madfs_kv::Result<Option<Vec<u8>>> {
        self.0.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> madfs_kv::Result<()> {
        self.0.write(batch, sync)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start: &[u8],
        limit: usize,
    ) -> madfs_kv::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.scan(prefix, start, limit)
    }

    fn sync_wal(&self) -> madfs_kv::Result<()> {
        self.0.sync_wal()
    }

    fn scan_visit(
        &self,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> madfs_kv::Result<()> {
        self.0.scan_visit(prefix, start, f)
    }
}

/// Open the store's Raft state: the log store and the state machine, which
/// publishes every applied map on `publish`.
pub(crate) fn open(
    kv: Arc<dyn KvStore>,
    publish: watch::Sender<ClusterMap>,
) -> Result<(LogStore, StateMachine), MembershipError> {
    let storage = |e: StorageError<NodeId>| MembershipError::Storage(e.to_string());
    let last_purged: Option<LogId<NodeId>> = get_record(&*kv, KEY_PURGED).map_err(storage)?;
    // The log is bounded by the snapshot policy (a few thousand entries at
    // most), so finding its end by a scan at start is cheap.
    let mut last_key = None;
    kv.scan_visit(PREFIX_LOG, PREFIX_LOG, &mut |key, _| {
        last_key = Some(key.to_vec());
        true
    })
    .map_err(|e| MembershipError::Storage(e.to_string()))?;
    let last_log = match last_key {
        None => None,
        Some(key) => get_record::<Entry<TypeConfig>>(&*kv, &key)
            .map_err(storage)?
            .map(|entry| entry.log_id),
    };
    let log = LogStore {
        kv: kv.clone(),
        last_purged,
        last_log,
    };
    let snapshot: Option<StoredSnapshot> = get_record(&*kv, KEY_SNAPSHOT).map_err(storage)?;
    let mut machine = StateMachine {
        kv,
        machine: Machine::default(),
        last_applied: None,
        last_membership: StoredMembership::default(),
        snapshot_lock: Arc::new(Mutex::new(())),
        publish,
    };
    if let Some(snapshot) = snapshot {
        machine.machine = decode(&snapshot.data)?;
        machine.last_applied = snapshot.meta.last_log_id;
        machine.last_membership = snapshot.meta.last_membership;
    }
    machine.publish.send_replace(machine.machine.map.clone());
    Ok((log, machine))
}

/// The Raft log and vote.
pub(crate) struct LogStore {
    kv: Arc<dyn KvStore>,
    last_purged: Option<LogId<NodeId>>,
    /// The last entry present, `None` when the log is empty.
    last_log: Option<LogId<NodeId>>,
}

/// A reader of the log for openraft's replication tasks.
#[derive(Clone)]
pub(crate) struct LogReader {
    kv: Arc<dyn KvStore>,
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = range_to_indexes(&range);
        read_entries(&*self.kv, start, end)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = range_to_indexes(&range);
        read_entries(&*self.kv, start, end)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        Ok(LogState {
            last_purged_log_id: self.last_purged,
            last_log_id: self.last_log.or(self.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            kv: self.kv.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        // Synced: a vote forgotten in a crash could be cast again in the
        // same term for another candidate (two leaders in one term).
        put_record(&*self.kv, KEY_VOTE, vote, true)
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        get_record(&*self.kv, KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        // Unsynced: a stale commit index after a crash is only smaller.
        put_record(&*self.kv, KEY_COMMITTED, &committed, false)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(get_record::<Option<LogId<NodeId>>>(&*self.kv, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::new();
        let mut last = None;
        for entry in entries {
            if let Some(prev) = last.or(self.last_log) {
                let prev: LogId<NodeId> = prev;
                assert_eq!(
                    entry.log_id.index,
                    prev.index + 1,
                    "log entries appended out of order"
                );
            }
            batch.put(&log_key(entry.log_id.index), &encode(&entry));
            last = Some(entry.log_id);
        }
        // Synced before the callback: openraft acknowledges appended entries
        // to the leader once the callback ran.
        let result = self.kv.write(batch, true);
        match result {
            Ok(()) => {
                if last.is_some() {
                    self.last_log = last;
                }
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(write_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // Remove `log_id` and everything after it (entries a new leader
        // overrides). Synced, so a restart does not bring them back as the
        // tail of the log after newer entries were appended over them.
        let doomed = read_entries(&*self.kv, log_id.index, u64::MAX)?;
        let mut batch = WriteBatch::new();
        for entry in &doomed {
            batch.delete(&log_key(entry.log_id.index));
        }
        self.kv.write(batch, true).map_err(write_err)?;
        self.last_log = match log_id.index.checked_sub(1) {
            None => None,
            Some(prev) => read_entries(&*self.kv, prev, log_id.index)?
                .pop()
                .map(|entry| entry.log_id),
        };
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // Entries up to `log_id` are in a durable snapshot already.
        let start = self.last_purged.map_or(0, |purged| purged.index + 1);
        let mut batch = WriteBatch::new();
        for index in start..=log_id.index {
            batch.delete(&log_key(index));
        }
        batch.put(KEY_PURGED, &encode(&log_id));
        self.kv.write(batch, false).map_err(write_err)?;
        self.last_purged = Some(log_id);
        if self.last_log.map_or(true, |last| last.index < log_id.index) {
            self.last_log = Some(log_id);
        }
        Ok(())
    }
}

/// A snapshot as stored under `SNAP`.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::EmptyNode>,
    data: Vec<u8>,
}

/// Store `snapshot` unless a newer one is stored already: a snapshot built
/// here and one installed from the leader may race.
fn store_snapshot(
    kv: &dyn KvStore,
    lock: &Mutex<()>,
    snapshot: &StoredSnapshot,
) -> StoreResult<()> {
    let _guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let stored: Option<StoredSnapshot> = get_record(kv, KEY_SNAPSHOT)?;
    if stored.is_some_and(|s| s.meta.last_log_id > snapshot.meta.last_log_id) {
        return Ok(());
    }
    // Synced: openraft purges the entries a snapshot covers once it has it.
    put_record(kv, KEY_SNAPSHOT, snapshot, true)
}

/// The state machine: the cluster map and how far the log was applied.
pub(crate) struct StateMachine {
    kv: Arc<dyn KvStore>,
    machine: Machine,
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, openraft::EmptyNode>,
    snapshot_lock: Arc<Mutex<()>>,
    publish: watch::Sender<ClusterMap>,
}

/// Builds a snapshot of the machine as it was when the builder was made.
pub(crate) struct SnapshotBuilder {
    kv: Arc<dyn KvStore>,
    machine: Machine,
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, openraft::EmptyNode>,
    snapshot_lock: Arc<Mutex<()>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let data = encode(&self.machine);
        let index = self.last_applied.map_or(0, |id| id.index);
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshot_id: format!("{index}-{}", self.machine.map.epoch),
        };
        let stored = StoredSnapshot { meta, data };
        store_snapshot(&*self.kv, &self.snapshot_lock, &stored)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(stored.data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StoreResult<(
        Option<LogId<NodeId>>,
        StoredMembership<NodeId, openraft::EmptyNode>,
    )> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            assert!(
                self.last_applied
                    .map_or(true, |last| entry.log_id.index > last.index),
                "entry {} applied twice",
                entry.log_id.index
            );
            self.last_applied = Some(entry.log_id);
            let reply = match &entry.payload {
                EntryPayload::Blank => Ok(self.machine.map.clone()),
                EntryPayload::Normal(command) => self.machine.apply(command),
                EntryPayload::Membership(membership) => {
                    self.last_membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                    Ok(self.machine.map.clone())
                }
            };
            replies.push(reply);
        }
        if self.publish.borrow().epoch != self.machine.map.epoch {
            self.publish.send_replace(self.machine.map.clone());
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            kv: self.kv.clone(),
            machine: self.machine.clone(),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshot_lock: self.snapshot_lock.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Vec<u8>>> {
        Ok(Box::default())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::EmptyNode>,
        snapshot: Box<Vec<u8>>,
    ) -> StoreResult<()> {
        let machine: Machine = decode(&snapshot).map_err(read_err)?;
        if machine.map.is_bootstrapped() {
            let check = machine.map.check();
            assert!(check.is_ok(), "snapshot map breaks an invariant: {check:?}");
        }
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: *snapshot,
        };
        store_snapshot(&*self.kv, &self.snapshot_lock, &stored)?;
        self.machine = machine;
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        self.publish.send_replace(self.machine.map.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        let stored: Option<StoredSnapshot> = get_record(&*self.kv, KEY_SNAPSHOT)?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(s.data),
        }))
    }
}

impl From<KvError> for MembershipError {
    fn from(e: KvError) -> Self {
        MembershipError::Storage(e.to_string())
    }
}
