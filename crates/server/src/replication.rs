//! Replication of a server's store to its replicas (cluster file
//! `replicas = R`, issue 16), the primary's side.
//!
//! Every change this server makes to its store is also a record in an
//! ordered stream: a metadata write batch (`ReplicatedKv` sees every batch,
//! below the find index and the poison guard), a chunk write, truncate or
//! purge (`ChunkStore` hands them over through `ChunkMirror`), and a sync
//! (the sync thread's `sync_wal` after the chunk files are synced). One
//! shipper task per replica sends the records in order, many per
//! `ReplicaApply`, one call in flight, and the replica applies them in order
//! to its copy (replica.rs). A request is answered only once every replica
//! in the set has acknowledged every record written up to the moment its
//! handler returned (`Replicator::wait_replicated`, in dispatch.rs): what a
//! client was told is done is on every live replica, and durable on all of
//! them when the client asked for durability (the sync record).
//!
//! The order of records is the order of the local writes where it matters:
//! a record is taken right after its local write, inside the same call, so
//! two writes ordered by a lock (every read-modify-write of a key is) are
//! recorded in that order. Unordered writes to the same bytes (two clients
//! writing one range at once) may reach a replica in either order; POSIX
//! gives no answer there either, but the replicas may then differ.
//!
//! A replica that fails (its call errors) leaves the set once the
//! membership group took it out: records are no longer waited for there.
//! It comes back through a resync (`catch_up`): the records from that
//! moment on are kept for it, its copy is loaded from this server's store
//! (every range of keys and every chunk file the copy does not hold as
//! they are here: a fuzzy copy, taken while writes go on), and then the
//! kept records are shipped in order on top, which brings every key and
//! byte the copy took mid-change to its final value (each record is
//! idempotent when replayed in order). Once it has them all, the group
//! counts it in sync again.

use crate::errors::OpResult;
use madfs_kv::{KvStore, WriteBatch};
use madfs_proto::message::{ChunkDigest, Op, Rebuild, RebuildPhase, Reply, REPLICA_DIGESTS_MAX};
use madfs_proto::Request;
use madfs_rpc::{Pool, SharedData};
use madfs_types::{ChunkIndex, Credentials, InodeId, ServerId};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

mod record;
mod resync;
mod ship;

pub use record::SharedBytes;
pub(crate) use record::{encode_all, Record};

/// Records kept for replicas out of the set (to replay when they come
/// back with their copies whole), at most this many...
const KEPT_RECORDS_MAX: usize = 1 << 18;
/// ...of at most this many payload bytes...
const KEPT_BYTES_MAX: usize = 256 << 20;
/// ...for at most this long after it left.
const KEPT_FOR: Duration = Duration::from_secs(120);
/// Records kept for a replica catching up (written during its load, sent
/// after it), at most this many...
const CATCH_UP_RECORDS_MAX: usize = 1 << 19;
/// ...of at most this many payload bytes: past them the attempt is given
/// up (the replica leaves until the next one, `catch_up`), so a load that
/// outlasts a storm of writes costs the primary bounded memory.
const CATCH_UP_BYTES_MAX: usize = 1 << 30;
/// How often an acknowledgement tries again to write the list of copies
/// it waits for, while the store refuses it (`note_waited`).
const NOTE_RETRY: Duration = Duration::from_millis(100);

/// Records one ReplicaApply carries at most.
pub(crate) const RECORDS_PER_CALL_MAX: usize = 4096;
/// Payload bytes one ReplicaApply carries at most (a single larger record,
/// a chunk write of up to the chunk size, still goes alone).
pub(crate) const PAYLOAD_PER_CALL_MAX: usize = 8 << 20;
/// Records (not yet on every replica) the stream may hold before a writer
/// is refused: requests wait for their records, so this is reached only
/// when replicas stall.
const PENDING_RECORDS_MAX: usize = 1 << 20;

/// What replication costs, for the server's metrics (metrics.rs): one set
/// for the whole process, whatever sets it serves (a failover may add some).
#[derive(Clone, Debug)]
pub struct ReplicationStats {
    /// How long answered requests waited for their replicas after their
    /// handler returned.
    pub wait: prometheus_client::metrics::histogram::Histogram,
    /// Round trip of one `ReplicaApply` from a primary to a replica.
    pub shipment: prometheus_client::metrics::histogram::Histogram,
    /// Records and payload bytes shipped to replicas.
    pub records: prometheus_client::metrics::counter::Counter,
    pub bytes: prometheus_client::metrics::counter::Counter,
}

/// The process's replication figures.
pub fn stats() -> &'static ReplicationStats {
    static STATS: std::sync::OnceLock<ReplicationStats> = std::sync::OnceLock::new();
    STATS.get_or_init(|| ReplicationStats {
        wait: prometheus_client::metrics::histogram::Histogram::new(
            crate::metrics::latency_buckets(),
        ),
        shipment: prometheus_client::metrics::histogram::Histogram::new(
            crate::metrics::latency_buckets(),
        ),
        records: Default::default(),
        bytes: Default::default(),
    })
}

/// Where a chunk store reports its changes (the primary's `Replicator`).
pub trait ChunkMirror: Send + Sync {
    /// Leave to change the chunks until the guard drops, taken before a
    /// change touches the disk and held until it is reported; refused
    /// once the set moved away from this store (`Replicator::retire`).
    fn admit(&self) -> std::io::Result<std::sync::RwLockReadGuard<'_, ()>>;
    fn wrote(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        data: SharedBytes,
        chunk_size: u64,
    );
    fn truncated(&self, ino: InodeId, size: u64, chunk_size: u64);
    fn purged(&self, ino: InodeId);
}

/// One replica as the primary sees it.
struct Replica {
    server: ServerId,
    /// Every record up to this one is applied there.
    acked: u64,
    /// Why it left the set, if it did.
    out: Option<String>,
    /// Catching up: records are kept and shipped, but not waited for.
    syncing: bool,
    /// Caught up, and the group is being asked to count it in sync:
    /// acknowledgements wait for it already. The map counts it from the
    /// moment the change applies, before this primary hears so; a
    /// failover to it in between must find every acknowledged record.
    awaited: bool,
    /// +1 at each resync: a shipper or an acknowledgement of an earlier
    /// one is ignored.
    generation: u64,
    /// How far its resync has come, while one runs.
    rebuild: Option<Rebuild>,
    /// Out because the records kept for its catch-up outgrew their bound
    /// (`bound_kept`): its catch-up tries again (`pause_catch_up`).
    outgrown: bool,
    /// Out of the set, but the records after `acked` are still kept for
    /// it until then (it may come back with its copy whole: cut off, not
    /// crashed), within `KEPT_RECORDS_MAX` and `KEPT_BYTES_MAX`.
    kept_until: Option<tokio::time::Instant>,
}

struct Stream {
    /// The sequence number the next record gets (the first is 1).
    next_seq: u64,
    /// Records not yet on every replica still in the set, oldest first:
    /// the front one has sequence number `next_seq - pending.len()`.
    pending: VecDeque<Arc<Record>>,
    replicas: Vec<Replica>,
    /// Whether the last record is a sync (everything before it durable
    /// here): a stop then may be continued (restart.rs).
    last_is_sync: bool,
    /// Payload bytes of `pending`.
    pending_bytes: usize,
    /// The waited-for copies last written to the store (`note_waited`);
    /// None before the first write.
    noted: Option<Vec<ServerId>>,
}

/// The primary's record stream and what each replica has of it.
pub struct Replicator {
    set: ServerId,
    /// Tells a replica that records of an earlier start are not continued.
    stream_id: u64,
    state: Mutex<Stream>,
    /// New records (for shippers) and new acknowledgements (for waiters).
    changed: Notify,
    acked: Notify,
    /// Reaches replica processes whatever sets moved (`set_pool`).
    direct: std::sync::OnceLock<Arc<Pool>>,
    /// Asked before a failed replica leaves the set (members.rs): the
    /// membership group must take it out first. None: leave at once.
    group: std::sync::OnceLock<Arc<crate::members::Members>>,
    /// The set moved away from this store (`retire`): nothing is shipped
    /// from it any more, and no replica leaves on its word.
    retired: std::sync::atomic::AtomicBool,
    /// Wakes what waits for the retirement (`until_retired`).
    retiring: Notify,
    /// The store's own metadata (not shipped), where the copies that
    /// acknowledgements wait for are kept while it is served
    /// (`start_noting`).
    noting: std::sync::OnceLock<Arc<dyn KvStore>>,
    /// Held (read) by every write to the store, taken (write) by
    /// `retire`: no write is under way once the set moved away.
    writes: std::sync::RwLock<()>,
}

impl Replica {
    /// Whether the stream keeps records for it: in the set (in sync or
    /// catching up), or out with its records kept.
    fn wants_records(&self) -> bool {
        self.out.is_none() || self.kept_until.is_some()
    }

    /// Whether acknowledgements wait for it: in the set, and in sync or
    /// asked to be counted so (`awaited`).
    fn waited_for(&self) -> bool {
        self.out.is_none() && (!self.syncing || self.awaited)
    }
}

impl Replicator {
    pub fn new(set: ServerId, replicas: &[ServerId]) -> Replicator {
        Replicator::continuing(set, replicas, random_stream_id(), 0)
    }

    /// The stream `stream_id` of an earlier run of this store, whose last
    /// record was `last` (a clean stop: restart.rs).
    pub(crate) fn continuing(
        set: ServerId,
        replicas: &[ServerId],
        stream_id: u64,
        last: u64,
    ) -> Replicator {
        Replicator {
            set,
            stream_id,
            state: Mutex::new(Stream {
                next_seq: last + 1,
                last_is_sync: false,
                pending_bytes: 0,
                noted: None,
                pending: VecDeque::new(),
                replicas: replicas
                    .iter()
                    .map(|&server| Replica {
                        server,
                        acked: last,
                        out: None,
                        syncing: false,
                        awaited: false,
                        generation: 0,
                        rebuild: None,
                        kept_until: None,
                        outgrown: false,
                    })
                    .collect(),
            }),
            changed: Notify::new(),
            acked: Notify::new(),
            direct: std::sync::OnceLock::new(),
            group: std::sync::OnceLock::new(),
            retired: std::sync::atomic::AtomicBool::new(false),
            retiring: Notify::new(),
            noting: std::sync::OnceLock::new(),
            writes: std::sync::RwLock::new(()),
        }
    }

    /// The store is served from now on: keep the copies acknowledgements
    /// wait for in `kv` (`META_WAITED_COPIES`), synced, from now on. Not
    /// before: a store held after a power loss keeps the list its last
    /// run left until it is served (members.rs `hand_over` reads it).
    pub(crate) fn start_noting(&self, kv: Arc<dyn KvStore>) {
        if self.noting.set(kv).is_err() {
            return;
        }
        let mut s = self.lock();
        if let Err(e) = self.note_waited(&mut s, None) {
            tracing::error!("set {}: {e}", self.set);
        }
    }

    /// Write the copies acknowledgements wait for now, with `joining`,
    /// synced, if they differ from the last written (once noting). Called
    /// with the stream locked, so that no acknowledgement goes out under
    /// a list the store does not have yet: after a power loss, a copy not
    /// on it has nothing this store acknowledged and lost, and one on it
    /// has every such write (the group may have taken it out meanwhile).
    fn note_waited(&self, s: &mut Stream, joining: Option<ServerId>) -> Result<(), String> {
        let Some(kv) = self.noting.get() else {
            return Ok(());
        };
        let mut list: Vec<ServerId> = s
            .replicas
            .iter()
            .filter(|r| r.waited_for())
            .map(|r| r.server)
            .chain(joining)
            .collect();
        list.sort();
        list.dedup();
        if s.noted.as_ref() == Some(&list) {
            return Ok(());
        }
        let mut b = WriteBatch::new();
        b.put(crate::keys::META_WAITED_COPIES, &encode_ids(&list));
        if let Err(e) = kv.write(b, true) {
            // Unknown now: acknowledgements wait until a write of the
            // list succeeds (`wait_replicated`).
            s.noted = None;
            return Err(format!(
                "noting the copies acknowledgements wait for (requests wait): {e}"
            ));
        }
        s.noted = Some(list);
        Ok(())
    }

    /// Let replicas leave only once `group` has taken them out of the set.
    pub(crate) fn set_group(&self, group: Arc<crate::members::Members>) {
        let _ = self.group.set(group);
    }

    /// The set moved away from this store: stop shipping, never ask the
    /// group to take a replica out (the set's new primary ships to the
    /// same replicas; a deposed primary's request would take one out of
    /// the new primary's set), and take no more writes (`ReplicatedKv`).
    /// Returns once no write is under way: a handler still running here
    /// would otherwise change a store that becomes this server's copy of
    /// the set again, after a resync's load compared it (the replicated
    /// simulation with 4 servers, seed 8093: a mkdir deposed mid-way left
    /// its name in the copy, and a later failover to that copy brought it
    /// back under a removed directory).
    pub(crate) fn retire(&self) {
        let _no_write_under_way = self.writes.write().unwrap_or_else(|e| e.into_inner());
        self.retired
            .store(true, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
        self.retiring.notify_waiters();
    }

    /// Returns once the set moved away from this store (`retire`).
    pub(crate) async fn until_retired(&self) {
        loop {
            let woken = self.retiring.notified();
            tokio::pin!(woken);
            // Registered before the check: a retirement in between wakes it.
            woken.as_mut().enable();
            if self.retired() {
                return;
            }
            woken.await;
        }
    }

    /// Leave to write to the store until the guard drops; refused once
    /// the set moved away (`retire`).
    fn writing(&self) -> madfs_kv::Result<std::sync::RwLockReadGuard<'_, ()>> {
        let guard = self.writes.read().unwrap_or_else(|e| e.into_inner());
        if self.retired() {
            return Err(madfs_kv::KvError::Refused(format!(
                "set {} moved to another server: this server's store of it takes no more writes",
                self.set
            )));
        }
        Ok(guard)
    }

    /// Whether the set moved away from this store (`retire`).
    pub(crate) fn retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether replica `i` may leave the set now (after `why`).
    async fn may_leave(&self, i: usize, why: &str) -> bool {
        if self.retired() {
            return false;
        }
        let server = self.lock().replicas[i].server;
        match self.group.get() {
            None => true,
            Some(g) => {
                let ok = g.may_leave(self.set, server).await;
                if !ok {
                    tracing::warn!(
                        "replica {server} of set {} failed ({why}) but is still in the set: \
                         requests wait",
                        self.set
                    );
                }
                ok
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stream> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a record to the stream; its sequence number.
    pub(crate) fn record(&self, r: Record) -> u64 {
        let mut s = self.lock();
        assert!(
            s.pending.len() < PENDING_RECORDS_MAX,
            "replication stream of set {} holds {} records no replica took",
            self.set,
            s.pending.len()
        );
        let seq = s.next_seq;
        s.next_seq += 1;
        s.last_is_sync = matches!(r, Record::Sync);
        if s.replicas.iter().any(Replica::wants_records) {
            s.pending_bytes += r.payload().len();
            s.pending.push_back(Arc::new(r));
            self.bound_kept(&mut s);
        }
        drop(s);
        self.changed.notify_waiters();
        seq
    }

    /// The last record's sequence number (0: none yet).
    pub(crate) fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// The stream and its last record, if that record is a sync (all
    /// before it durable here): what a clean stop leaves to continue.
    pub(crate) fn continuable(&self) -> Option<(u64, u64)> {
        let s = self.lock();
        s.last_is_sync.then_some((self.stream_id, s.next_seq - 1))
    }

    /// The replicas and, for those out of the set, why.
    pub fn replicas(&self) -> Vec<(ServerId, u64, Option<String>)> {
        self.lock()
            .replicas
            .iter()
            .map(|r| (r.server, r.acked, r.out.clone()))
            .collect()
    }

    /// Wait until every replica in the set has applied the stream up to
    /// `seq`.
    pub(crate) async fn wait_replicated(&self, seq: u64) {
        loop {
            let acked = self.acked.notified();
            let listed = {
                let mut s = self.lock();
                if s.replicas.iter().all(|r| !r.waited_for() || r.acked >= seq) {
                    // Not without the list of copies in the store: a copy
                    // that left may still be on it (a failed write; not
                    // noting yet, `note_waited` writes nothing).
                    Some(s.noted.is_some() || self.note_waited(&mut s, None).is_ok())
                } else {
                    None
                }
            };
            match listed {
                Some(true) => return,
                Some(false) => tokio::time::sleep(NOTE_RETRY).await,
                None => acked.await,
            }
        }
    }

    /// Records for replica `i` after `acked`, up to the call limits.
    fn next_batch(&self, i: usize) -> Option<(u64, Vec<Arc<Record>>)> {
        let s = self.lock();
        let r = &s.replicas[i];
        if r.out.is_some() {
            return None;
        }
        let first_pending = s.next_seq - s.pending.len() as u64;
        assert!(
            r.acked + 1 >= first_pending,
            "replica {} of set {} needs record {} but the stream starts at {first_pending}",
            r.server,
            self.set,
            r.acked + 1
        );
        let skip = (r.acked + 1 - first_pending) as usize;
        let mut bytes = 0usize;
        let batch: Vec<Arc<Record>> = s
            .pending
            .iter()
            .skip(skip)
            .take(RECORDS_PER_CALL_MAX)
            .take_while(|rec| {
                let first = bytes == 0;
                bytes += rec.payload().len();
                first || bytes <= PAYLOAD_PER_CALL_MAX
            })
            .cloned()
            .collect();
        (!batch.is_empty()).then_some((r.acked + 1, batch))
    }

    /// Replica `i` (of `generation`) has applied up to `applied`: drop
    /// what every replica has.
    fn acknowledge(&self, i: usize, generation: u64, applied: u64) {
        let mut s = self.lock();
        let s = &mut *s;
        if s.replicas[i].generation != generation {
            return;
        }
        s.replicas[i].acked = s.replicas[i].acked.max(applied);
        self.trim(s);
        self.acked.notify_waiters();
    }

    fn trim(&self, s: &mut Stream) {
        let lowest = s
            .replicas
            .iter()
            .filter(|r| r.wants_records())
            .map(|r| r.acked)
            .min()
            .unwrap_or(s.next_seq - 1);
        let first_pending = s.next_seq - s.pending.len() as u64;
        let drop = (lowest.saturating_sub(first_pending - 1) as usize).min(s.pending.len());
        let freed: usize = s.pending.drain(..drop).map(|r| r.payload().len()).sum();
        s.pending_bytes -= freed;
    }

    /// Stop keeping records for replicas out of the set once they cost
    /// more than the limits, or were kept long enough; give up the
    /// attempt of a replica catching up (not yet waited for) once the
    /// records kept for it cost more than theirs.
    fn bound_kept(&self, s: &mut Stream) {
        let over = s.pending.len() > KEPT_RECORDS_MAX || s.pending_bytes > KEPT_BYTES_MAX;
        let now = tokio::time::Instant::now();
        let mut dropped = false;
        if s.pending.len() > CATCH_UP_RECORDS_MAX || s.pending_bytes > CATCH_UP_BYTES_MAX {
            let (records, bytes) = (s.pending.len(), s.pending_bytes);
            for r in s.replicas.iter_mut() {
                if r.out.is_none() && r.syncing && !r.awaited {
                    let why = format!(
                        "the changes made during its catch-up outgrew what is kept for it \
                         ({records} records, {bytes} bytes)"
                    );
                    tracing::error!("set {}: replica {}: {why}", self.set, r.server);
                    r.out = Some(why);
                    r.kept_until = None;
                    r.outgrown = true;
                    dropped = true;
                }
            }
        }
        for r in s.replicas.iter_mut().filter(|r| r.out.is_some()) {
            if r.kept_until.is_some_and(|until| over || now >= until) {
                r.kept_until = None;
                dropped = true;
                tracing::info!(
                    "set {}: records are no longer kept for replica {} (out of the set); \
                     it will be loaded whole",
                    self.set,
                    r.server
                );
            }
        }
        if dropped {
            self.trim(s);
        }
    }

    /// Replica `i` failed: out of the set until a resync. With `keep`
    /// (it did not answer, or the group took it out: it may come back
    /// with its copy whole), the records after its last acknowledgement
    /// are kept for a while, to replay instead of a whole load.
    fn leave(&self, i: usize, why: String, keep: bool) {
        self.leave_if(i, None, why, keep);
    }

    /// `leave`, if replica `i` is still in the set, and at `generation`
    /// where given (not taken up again by a newer catch-up). Whether it
    /// left.
    fn leave_if(&self, i: usize, generation: Option<u64>, why: String, keep: bool) -> bool {
        let mut s = self.lock();
        let s = &mut *s;
        let r = &mut s.replicas[i];
        if r.out.is_some() || generation.is_some_and(|g| g != r.generation) {
            return false;
        }
        tracing::error!(
            "replica {} of set {} leaves the set, not acknowledging anymore: {why}",
            r.server,
            self.set
        );
        // A replica in the middle of a load has a partial copy: it takes
        // nothing but a new load.
        r.kept_until = (keep && !r.syncing).then(|| tokio::time::Instant::now() + KEPT_FOR);
        r.out = Some(why);
        // Before any acknowledgement without it (the lock is held).
        if let Err(e) = self.note_waited(s, None) {
            tracing::error!("set {}: {e}", self.set);
        }
        self.trim(s);
        self.acked.notify_waiters();
        true
    }

    /// The map no longer counts `server` in the set: stop shipping to it.
    pub(crate) fn drop_replica(&self, server: ServerId) {
        let i = self.lock().replicas.iter().position(|r| r.server == server);
        if let Some(i) = i {
            self.leave(
                i,
                "taken out of the set by the membership group".into(),
                true,
            );
        }
    }

    /// Whether `server` counts as in sync here: records go to it and no
    /// catch-up of it runs.
    pub(crate) fn counts_in_sync(&self, server: ServerId) -> bool {
        self.lock()
            .replicas
            .iter()
            .any(|r| r.server == server && r.out.is_none() && !r.syncing)
    }

    /// Whether records are shipped to `server` now (in sync or catching up).
    pub(crate) fn ships_to(&self, server: ServerId) -> bool {
        self.lock()
            .replicas
            .iter()
            .any(|r| r.server == server && r.out.is_none())
    }

    /// `server` starts catching up: keep every record from now on for it
    /// (or from its last acknowledgement, where they were kept since it
    /// left). Its index, generation and the first record it will get;
    /// None if records already go to it.
    fn add_syncing(&self, server: ServerId) -> Option<(usize, u64, u64)> {
        self.add_syncing_if(server, None)
    }

    /// `add_syncing`, only if `server`'s catch-up is still at `generation`
    /// where given (a catch-up that paused after a failed attempt, and
    /// that nothing took over or ended meanwhile: `forget_catch_up`).
    fn add_syncing_if(
        &self,
        server: ServerId,
        generation: Option<u64>,
    ) -> Option<(usize, u64, u64)> {
        let mut s = self.lock();
        let from = s.next_seq;
        let first_pending = s.next_seq - s.pending.len() as u64;
        let i = match s.replicas.iter().position(|r| r.server == server) {
            Some(i) if s.replicas[i].out.is_none() => return None,
            Some(i) if generation.is_some_and(|g| g != s.replicas[i].generation) => return None,
            None if generation.is_some() => return None,
            Some(i) => i,
            None => {
                s.replicas.push(Replica {
                    server,
                    acked: 0,
                    out: None,
                    syncing: true,
                    awaited: false,
                    generation: 0,
                    rebuild: None,
                    kept_until: None,
                    outgrown: false,
                });
                s.replicas.len() - 1
            }
        };
        let r = &mut s.replicas[i];
        let kept = r.kept_until.take().is_some() && r.acked + 1 >= first_pending;
        let from = if kept { r.acked + 1 } else { from };
        r.out = None;
        r.syncing = true;
        r.awaited = false;
        r.outgrown = false;
        r.generation += 1;
        r.acked = from - 1;
        // What the last attempt failed with stays shown until one passes.
        let failure = r.rebuild.take().map(|b| b.failure).unwrap_or_default();
        r.rebuild = Some(Rebuild {
            replica: server,
            phase: RebuildPhase::Starting,
            keys: 0,
            keys_kept: 0,
            bytes_done: 0,
            bytes_total: 0,
            bytes_kept: 0,
            failure,
        });
        Some((i, r.generation, from))
    }

    /// Replica `i`'s catch-up of `generation` failed with `why` while the
    /// map still lists it as catching up: it leaves until the next attempt
    /// (no records are kept for it meanwhile: kept for a replica that
    /// took none, they grew without bound), and its rebuild shows as
    /// waiting. False if a newer catch-up took over, or it left already
    /// (the group took it out).
    fn pause_catch_up(&self, i: usize, generation: u64, why: &str) -> bool {
        let left = self.leave_if(
            i,
            Some(generation),
            format!("its catch-up failed ({why}); it is tried again later"),
            false,
        );
        let mut s = self.lock();
        let r = &mut s.replicas[i];
        if r.generation != generation || !(left || r.outgrown) {
            return false;
        }
        r.outgrown = false;
        if let Some(p) = r.rebuild.as_mut() {
            p.phase = RebuildPhase::Waiting;
            p.failure = why.to_string();
        }
        true
    }

    /// The map lists `server` neither in the set nor catching up: a
    /// catch-up of it waiting for its next attempt starts none.
    pub(crate) fn forget_catch_up(&self, server: ServerId) {
        let mut s = self.lock();
        if let Some(r) = s
            .replicas
            .iter_mut()
            .find(|r| r.server == server && r.out.is_some())
        {
            r.generation += 1;
            r.rebuild = None;
        }
    }

    /// The resyncs running now and how far each has come.
    pub(crate) fn rebuilds(&self) -> Vec<Rebuild> {
        self.lock()
            .replicas
            .iter()
            .filter_map(|r| r.rebuild.clone())
            .collect()
    }

    /// Note progress of replica `i`'s resync of `generation` (not of a
    /// newer one).
    fn progress(&self, i: usize, generation: u64, note: impl FnOnce(&mut Rebuild)) {
        let mut s = self.lock();
        let r = &mut s.replicas[i];
        if r.generation == generation {
            if let Some(p) = r.rebuild.as_mut() {
                note(p);
            }
        }
    }

    /// Whether acknowledgements wait for replica `i` while its resync of
    /// `generation` (not a newer one) asks to be counted in sync. False if
    /// they cannot (its name could not be kept in the store first).
    fn set_awaited(&self, i: usize, generation: u64, awaited: bool) -> bool {
        let mut s = self.lock();
        let server = s.replicas[i].server;
        if s.replicas[i].generation != generation {
            return true;
        }
        if awaited {
            if let Err(e) = self.note_waited(&mut s, Some(server)) {
                tracing::error!("set {}: {e}", self.set);
                return false;
            }
        }
        s.replicas[i].awaited = awaited;
        // Refused: off the list before an acknowledgement goes without it
        // (the lock is held; a failed write holds them, `wait_replicated`).
        if !awaited {
            if let Err(e) = self.note_waited(&mut s, None) {
                tracing::error!("set {}: {e}", self.set);
            }
        }
        true
    }

    /// `server` counts in the set again.
    pub(crate) fn mark_in_sync(&self, server: ServerId) {
        let mut s = self.lock();
        if let Err(e) = self.note_waited(&mut s, Some(server)) {
            tracing::error!("set {}: {e}", self.set);
        }
        if let Some(r) = s.replicas.iter_mut().find(|r| r.server == server) {
            r.syncing = false;
            r.awaited = false;
            r.rebuild = None;
        }
    }
}

/// Server ids as the store keeps them (u16 LE each).
fn encode_ids(ids: &[ServerId]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.0.to_le_bytes()).collect()
}

/// The copies a store's acknowledgements last waited for
/// (`META_WAITED_COPIES`), read at its open, before anything rewrites them;
/// none if it never kept a list (never served with copies).
pub(crate) fn waited_copies(kv: &dyn KvStore) -> madfs_kv::Result<Vec<ServerId>> {
    Ok(kv
        .get(crate::keys::META_WAITED_COPIES)?
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|b| ServerId(u16::from_le_bytes([b[0], b[1]])))
        .collect())
}

/// A stream id no earlier start of this server used (with overwhelming
/// odds): std's per-process random hash keys, over the time.
pub(crate) fn random_stream_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now()) | 1
}

impl ChunkMirror for Replicator {
    fn admit(&self) -> std::io::Result<std::sync::RwLockReadGuard<'_, ()>> {
        self.writing().map_err(std::io::Error::other)
    }

    fn wrote(
        &self,
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        data: SharedBytes,
        chunk_size: u64,
    ) {
        self.record(Record::ChunkWrite {
            ino,
            index,
            offset,
            chunk_size,
            data,
        });
    }

    fn truncated(&self, ino: InodeId, size: u64, chunk_size: u64) {
        self.record(Record::Truncate {
            ino,
            size,
            chunk_size,
        });
    }

    fn purged(&self, ino: InodeId) {
        self.record(Record::Purge { ino });
    }
}

/// The metadata store with every write also recorded in the stream.
pub(crate) struct ReplicatedKv {
    inner: Arc<dyn KvStore>,
    stream: Arc<Replicator>,
}

impl ReplicatedKv {
    pub(crate) fn new(inner: Arc<dyn KvStore>, stream: Arc<Replicator>) -> ReplicatedKv {
        ReplicatedKv { inner, stream }
    }
}

impl KvStore for ReplicatedKv {
    fn get(&self, key: &[u8]) -> madfs_kv::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> madfs_kv::Result<()> {
        let _writing = self.stream.writing()?;
        let bytes = batch.encode();
        self.inner.write(batch, sync)?;
        self.stream.record(Record::Kv {
            batch: SharedBytes::new(bytes),
            sync,
        });
        Ok(())
    }

    fn scan(
        &self,
        prefix: &[u8],
        start: &[u8],
        limit: usize,
    ) -> madfs_kv::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(prefix, start, limit)
    }

    fn sync_wal(&self) -> madfs_kv::Result<()> {
        let _writing = self.stream.writing()?;
        self.inner.sync_wal()?;
        self.stream.record(Record::Sync);
        Ok(())
    }

    fn scan_visit(
        &self,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> madfs_kv::Result<()> {
        self.inner.scan_visit(prefix, start, f)
    }
}

/// What a ReplicaApply answers.
pub(crate) fn ack(applied: u64) -> OpResult {
    Ok((Reply::ReplicaAck { applied }, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let records = vec![
            Record::Kv {
                batch: SharedBytes::new(vec![1, 2, 3]),
                sync: true,
            },
            Record::ChunkWrite {
                ino: InodeId(9),
                index: ChunkIndex(2),
                offset: 4096,
                chunk_size: 1 << 20,
                data: SharedBytes::new(vec![7; 5000]),
            },
            Record::Truncate {
                ino: InodeId(9),
                size: 10,
                chunk_size: 1 << 20,
            },
            Record::Purge { ino: InodeId(4) },
            Record::Sync,
        ];
        let (heads, payloads) = encode_all(records.iter());
        // Sent as they are, not gathered: one piece per record with data.
        assert!(matches!(&payloads, SharedData::Pieces(p) if p.len() == 2));
        let payloads = payloads.to_vec();
        assert_eq!(payloads.len(), 3 + 5000);
        let decode =
            |heads: &[u8], payloads: &[u8]| Record::decode_all(heads, &Arc::new(payloads.to_vec()));
        assert_eq!(decode(&heads, &payloads).unwrap(), records);
        assert!(decode(&heads, &payloads[1..]).is_err());
        assert!(decode(&heads[..heads.len() - 1], &payloads).is_err());
        let mut extra = payloads.clone();
        extra.push(0);
        assert!(decode(&heads, &extra).is_err());
        assert!(decode(&[99, 0, 0, 0, 0], &[]).is_err());
    }

    #[test]
    fn the_stream_keeps_records_until_every_replica_has_them() {
        let r = Replicator::new(ServerId(0), &[ServerId(1), ServerId(2)]);
        for _ in 0..5 {
            r.record(Record::Sync);
        }
        assert_eq!(r.last_seq(), 5);
        let (first, batch) = r.next_batch(0).unwrap();
        assert_eq!((first, batch.len()), (1, 5));
        r.acknowledge(0, 0, 3);
        assert_eq!(r.lock().pending.len(), 5, "replica 1 has none yet");
        r.acknowledge(1, 0, 4);
        assert_eq!(r.lock().pending.len(), 2);
        let (first, batch) = r.next_batch(0).unwrap();
        assert_eq!((first, batch.len()), (4, 2));
        r.leave(1, "test".into(), false);
        r.acknowledge(0, 0, 5);
        assert!(r.lock().pending.is_empty());
        assert!(r.next_batch(0).is_none());
        assert!(r.next_batch(1).is_none());
    }

    /// A replica that left unreachable keeps its records (bounded) for a
    /// replay from its last acknowledgement; one that refused, or that
    /// stayed away past the bound, is loaded whole.
    #[test]
    fn records_are_kept_for_a_replica_out_for_a_while_within_bounds() {
        let r = Replicator::new(ServerId(0), &[ServerId(1), ServerId(2)]);
        for _ in 0..6 {
            r.record(Record::Sync);
        }
        r.acknowledge(0, 0, 6);
        r.acknowledge(1, 0, 2);
        r.leave(1, "cut off".into(), true);
        for _ in 0..4 {
            r.record(Record::Sync);
        }
        r.acknowledge(0, 0, 10);
        assert_eq!(
            r.lock().pending.len(),
            8,
            "records 3..=10 kept for replica 2"
        );
        assert!(r.next_batch(1).is_none(), "nothing shipped while out");
        // Back: the records after its last acknowledgement come first.
        let (i, generation, from) = r.add_syncing(ServerId(2)).unwrap();
        assert_eq!((i, generation, from), (1, 1, 3));
        let (first, batch) = r.next_batch(1).unwrap();
        assert_eq!((first, batch.len()), (3, 8));
        r.acknowledge(1, generation, 10);
        assert!(r.lock().pending.is_empty());

        // Refused: nothing kept, a load from the next record.
        r.leave(1, "refused".into(), false);
        r.record(Record::Sync);
        r.acknowledge(0, 0, 11);
        assert!(r.lock().pending.is_empty());
        assert_eq!(r.add_syncing(ServerId(2)).unwrap().2, 12);

        // Past the bound on records kept: dropped, and loaded whole.
        let generation = r.lock().replicas[1].generation;
        r.acknowledge(1, generation, 11);
        r.mark_in_sync(ServerId(2));
        r.leave(1, "cut off".into(), true);
        for _ in 0..=KEPT_RECORDS_MAX {
            r.record(Record::Sync);
        }
        let last = r.last_seq();
        r.acknowledge(0, 0, last);
        assert!(r.lock().pending.is_empty(), "no longer kept");
        assert_eq!(r.add_syncing(ServerId(2)).unwrap().2, last + 1);
    }

    /// A catch-up whose attempt failed while the map still lists its
    /// replica as catching up keeps no records for it until the next
    /// attempt, which starts from the stream's next record; one the map
    /// no longer lists starts none.
    #[test]
    fn a_catch_up_waiting_to_try_again_keeps_no_records_for_its_replica() {
        let r = Replicator::new(ServerId(0), &[]);
        let (i, generation, from) = r.add_syncing(ServerId(1)).unwrap();
        assert_eq!(from, 1);
        for _ in 0..10 {
            r.record(Record::Sync);
        }
        assert_eq!(r.lock().pending.len(), 10, "kept for the catch-up");
        assert!(r.pause_catch_up(i, generation, "no space left on device"));
        assert!(r.lock().pending.is_empty(), "kept while it waits");
        r.record(Record::Sync);
        assert!(r.lock().pending.is_empty(), "kept while it waits");
        let shown = r.rebuilds();
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].phase, RebuildPhase::Waiting);
        assert_eq!(shown[0].failure, "no space left on device");
        // An older attempt cannot pause the catch-up again.
        assert!(!r.pause_catch_up(i, generation, "late"));

        let (i, next, from) = r.add_syncing_if(ServerId(1), Some(generation)).unwrap();
        assert_eq!((next, from), (generation + 1, 12));
        assert!(
            r.add_syncing_if(ServerId(1), Some(next)).is_none(),
            "records go to it already"
        );
        let shown = r.rebuilds();
        assert_eq!(shown[0].phase, RebuildPhase::Starting);
        assert_eq!(
            shown[0].failure, "no space left on device",
            "until one passes"
        );

        assert!(r.pause_catch_up(i, next, "refused"));
        r.forget_catch_up(ServerId(1));
        assert!(r.add_syncing_if(ServerId(1), Some(next)).is_none());
        assert!(r.rebuilds().is_empty());
        assert!(r.lock().pending.is_empty());
    }

    /// The records kept for a replica catching up (written while it is
    /// loaded) are bounded: past the bound its attempt is given up, and
    /// they go. Before, a catch-up given up after its tries left its
    /// replica listed, and the primary kept every later record for it.
    #[test]
    fn records_kept_for_a_catch_up_are_bounded() {
        let r = Replicator::new(ServerId(0), &[]);
        r.add_syncing(ServerId(1)).unwrap();
        for _ in 0..=CATCH_UP_RECORDS_MAX {
            r.record(Record::Sync);
        }
        assert!(r.lock().pending.is_empty(), "still kept");
        let (_, _, out) = r.replicas().pop().unwrap();
        assert!(out.is_some_and(|why| why.contains("outgrew")));
        // Its catch-up, finding it out, waits and tries again (one the
        // group took out would end).
        let generation = r.lock().replicas[0].generation;
        assert!(r.pause_catch_up(0, generation, "it left the set"));
        assert_eq!(r.rebuilds()[0].phase, RebuildPhase::Waiting);
        assert!(r.add_syncing_if(ServerId(1), Some(generation)).is_some());
        r.drop_replica(ServerId(1));
        let generation = r.lock().replicas[0].generation;
        assert!(!r.pause_catch_up(0, generation, "it left the set"));
    }

    /// A caught-up replica is waited for before the group is asked to
    /// count it (the map may count it, and a failover serve it, before
    /// this primary hears the answer); a refusal stops the wait.
    #[tokio::test]
    async fn a_replica_asked_to_be_counted_is_waited_for() {
        let r = Replicator::new(ServerId(0), &[ServerId(1)]);
        let (i, generation, _) = r.add_syncing(ServerId(2)).unwrap();
        let seq = r.record(Record::Sync);
        r.acknowledge(0, 0, seq);
        let wait = |r: &Replicator| {
            futures::FutureExt::now_or_never(Box::pin(r.wait_replicated(seq))).is_some()
        };
        assert!(wait(&r), "catching up: not waited for");
        r.set_awaited(i, generation, true);
        assert!(!wait(&r), "asked to be counted: waited for");
        r.set_awaited(i, generation + 1, false);
        assert!(!wait(&r), "a newer resync's refusal does not apply");
        r.acknowledge(i, generation, seq);
        assert!(wait(&r));
        r.set_awaited(i, generation, false);
        let next = r.record(Record::Sync);
        r.acknowledge(0, 0, next);
        assert!(
            futures::FutureExt::now_or_never(Box::pin(r.wait_replicated(next))).is_some(),
            "refused: not waited for"
        );
    }

    /// The store keeps the copies acknowledgements wait for, once served:
    /// a copy about to be waited for is on the list first, and one that
    /// leaves is off it before an acknowledgement goes without it. Held
    /// (not yet noting), the list the last run left stays.
    #[test]
    fn the_copies_waited_for_are_kept_in_the_store_while_served() {
        let kv: Arc<dyn KvStore> = Arc::new(madfs_kv::MemStore::new());
        let listed = || waited_copies(kv.as_ref()).unwrap();
        let mut b = WriteBatch::new();
        b.put(crate::keys::META_WAITED_COPIES, &encode_ids(&[ServerId(3)]));
        kv.write(b, true).unwrap();
        let r = Replicator::new(ServerId(0), &[ServerId(1)]);
        let (i, generation, _) = r.add_syncing(ServerId(2)).unwrap();
        r.leave(0, "cut off".into(), true);
        assert_eq!(listed(), [ServerId(3)], "not noting yet: left as it was");
        r.start_noting(kv.clone());
        assert_eq!(listed(), [] as [ServerId; 0], "only replica 1, out");
        assert!(r.set_awaited(i, generation, true));
        assert_eq!(listed(), [ServerId(2)], "awaited: listed");
        assert!(r.set_awaited(i, generation, false));
        assert_eq!(listed(), [] as [ServerId; 0], "refused: off the list");
        assert!(r.set_awaited(i, generation, true));
        r.mark_in_sync(ServerId(2));
        r.add_syncing(ServerId(1)).unwrap();
        assert_eq!(listed(), [ServerId(2)], "catching up: not waited for");
        r.drop_replica(ServerId(2));
        assert_eq!(listed(), [] as [ServerId; 0], "taken out: off the list");
    }

    /// A copy that leaves while the store refuses the new list stays on
    /// the old one: no acknowledgement goes without it until the list is
    /// written.
    #[tokio::test]
    async fn no_acknowledgement_goes_without_a_copy_still_on_the_stored_list() {
        let kv = Arc::new(crate::test_kv::FaultyKv::default());
        let r = Replicator::new(ServerId(0), &[ServerId(1)]);
        r.start_noting(kv.clone());
        assert_eq!(waited_copies(kv.as_ref()).unwrap(), [ServerId(1)]);
        let seq = r.record(Record::Sync);
        kv.set_full(true);
        r.leave(0, "cut off".into(), true);
        assert_eq!(waited_copies(kv.as_ref()).unwrap(), [ServerId(1)]);
        let wait = tokio::time::timeout(Duration::from_millis(300), r.wait_replicated(seq));
        assert!(
            wait.await.is_err(),
            "acknowledged with server 1 still listed"
        );
        kv.set_full(false);
        tokio::time::timeout(Duration::from_secs(10), r.wait_replicated(seq))
            .await
            .expect("acknowledged once the list is written");
        assert_eq!(waited_copies(kv.as_ref()).unwrap(), [] as [ServerId; 0]);
    }
}
