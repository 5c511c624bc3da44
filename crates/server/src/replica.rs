//! Replication, the replica's side: this server's copies of the replica
//! sets it helps keep (replication.rs is the primary's side).
//!
//! A copy of set S lives in DATA/replica-of-S/ with the layout of a
//! server's own data directory (meta/ for RocksDB, chunks/), so that it can
//! be served as server S after a failover. `ReplicaApply` brings records in
//! stream order; each is applied as the primary applied it. The stream id
//! and the last record applied are kept in the copy's metadata with every
//! metadata record (`META_REPLICA_POSITION`): a record shipped twice (a
//! retry after a lost acknowledgement) is skipped, and a gap is refused.
//!
//! A copy follows one stream. A new stream (the primary restarted after a
//! crash) is accepted only by a copy that has applied nothing yet; any
//! other copy may lack records the old stream never shipped, so it is
//! refused as stale and resynced. A primary that stopped cleanly continues
//! its stream instead (restart.rs), and a copy that has all of it goes on.
//! A resync's load marks the copy partial (`META_REPLICA_LOADING`) until
//! its closing sync: a copy cut off mid-load takes no numbered record.

use crate::chunks::ChunkStore;
use crate::errors::{err, OpResult};
use crate::keys;
use crate::replication::{ack, Record};
use madfs_kv::{KvStore, RocksStore, WriteBatch};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{ChunkIndex, InodeId, ServerId};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

mod load;
pub(crate) use load::{first_key_after, local_only_key, KeyRangeDigest};

/// One copy of another server's set.
pub(crate) struct ReplicaCopy {
    kv: Arc<dyn KvStore>,
    chunks: Arc<ChunkStore>,
    /// The primary's stream this copy follows (0: none yet).
    stream: u64,
    applied: u64,
    /// The contents may lack records up to `applied`: a resync's load is
    /// under way or was cut off, or the copy was reopened at a position no
    /// sync wrote (a power cut may have lost chunk writes before it, which
    /// a replay from there would not bring). No numbered record is applied
    /// on top: it needs a resync.
    partial: bool,
    /// A position that says "not synced" is on disk, synced, since the
    /// copy's last sync (or since it was opened). Records applied and
    /// acknowledged after a sync are not synced themselves, and a power
    /// cut may take them with the positions they wrote: the position left
    /// would then be the sync's, and the copy would be taken for whole
    /// without them (the replicated simulation with 4 servers, seed
    /// 17005: a failover then served it, without an acknowledged write).
    /// So the first call after a sync that leaves records unsynced writes
    /// that durable mark first: one synced write per sync.
    marked: bool,
    /// While a resync's load runs: the chunk files its primary asked
    /// about (`digests`), which the load's end keeps; the copy's other
    /// chunk files are dropped then. None: no load, or this process did
    /// not see its start (a load cut off by a restart fails and starts
    /// over).
    load_seen: Option<HashSet<(InodeId, ChunkIndex)>>,
    /// The id of that load (its calls' `stream` field, `Record::Reset`);
    /// 0: none. A call of another load is refused.
    load: u64,
}

/// The copies this server keeps, opened at their first record.
pub(crate) struct ReplicaCopies {
    me: ServerId,
    root: PathBuf,
    /// The sets this server is a replica of.
    sets: Vec<ServerId>,
    copies: Mutex<HashMap<ServerId, Arc<tokio::sync::Mutex<Option<ReplicaCopy>>>>>,
    /// Sets this server now serves from its copy (a failover): no more
    /// records are taken for them.
    promoted: Mutex<std::collections::HashSet<ServerId>>,
    /// Where copies' metadata stores come from when not RocksDB
    /// directories (crates/sim).
    stores: Option<Arc<dyn crate::injected::Stores>>,
    /// When the last ReplicaApply came (a stopping server waits for its
    /// primaries' last records: `quiet_for`).
    last_apply: Mutex<Option<std::time::Instant>>,
    /// Free space of the data directory's file system, which the copies
    /// share with the server's own set (`room_for`).
    space: crate::space::SpaceGauge,
    /// The kernel boot positions are written in (`Position::whole`).
    boot: Option<BootId>,
    /// This server's own store: once its set moved away (never served
    /// again), the copy of that set starts from its keys (load.rs).
    home: Option<Arc<dyn KvStore>>,
}

/// Where server `me` (data directory `root`) keeps its copy of `set`.
pub fn copy_dir(root: &std::path::Path, set: ServerId) -> PathBuf {
    root.join(format!("replica-of-{}", set.0))
}

impl ReplicaCopies {
    pub(crate) fn new(
        me: ServerId,
        root: PathBuf,
        sets: Vec<ServerId>,
        stores: Option<Arc<dyn crate::injected::Stores>>,
        home: Option<Arc<dyn KvStore>>,
    ) -> ReplicaCopies {
        ReplicaCopies {
            me,
            space: crate::space::SpaceGauge::new(root.clone()),
            root,
            sets,
            home,
            copies: Mutex::new(HashMap::new()),
            promoted: Mutex::new(Default::default()),
            boot: match &stores {
                Some(s) => s.boot(),
                None => kernel_boot_id(),
            },
            stores,
            last_apply: Mutex::new(None),
        }
    }

    /// The kernel boot this process runs in (None where unknown), looked
    /// up once for the whole server: positions, and the boot a served
    /// store notes (restart.rs).
    pub(crate) fn boot(&self) -> Option<BootId> {
        self.boot
    }

    /// How long since the last ReplicaApply came (None: none came).
    pub(crate) fn quiet_for(&self) -> Option<std::time::Duration> {
        let last = *self.last_apply.lock().unwrap_or_else(|e| e.into_inner());
        last.map(|t| t.elapsed())
    }

    /// The place of the copy of `set` (opened or not).
    fn slot(&self, set: ServerId) -> Arc<tokio::sync::Mutex<Option<ReplicaCopy>>> {
        self.copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(set)
            .or_default()
            .clone()
    }

    /// Close the copy of `set` for good, to serve it: its directory.
    pub(crate) async fn close_for_promotion(&self, set: ServerId) -> PathBuf {
        let slot = self.slot(set);
        let mut slot = slot.lock_owned().await;
        self.promoted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(set);
        // Dropped here: RocksDB's lock on the directory goes with it.
        *slot = None;
        copy_dir(&self.root, set)
    }

    /// `set` is no longer served from its copy here (the map gave it to
    /// another server): take records for it again. The copy stays closed
    /// until a record comes; the resync that follows loads it first.
    pub(crate) fn unpromote(&self, set: ServerId) {
        self.promoted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&set);
    }

    /// Whether the copy of `set` kept here may lack records it took: it
    /// was reopened after a power loss at a position no sync wrote, or a
    /// load was cut off (`ReplicaCopy::partial`). Opens the copy if no
    /// record opened it yet. False while a record is being applied (the
    /// apply refuses records to a partial copy, and its primary takes it
    /// out then), for a copy served here, and when it cannot be opened
    /// (the next record reports that).
    pub(crate) async fn lacks(&self, set: ServerId) -> bool {
        if !self.sets.contains(&set) || self.is_promoted(set) {
            return false;
        }
        let slot = self.slot(set);
        let Ok(mut slot) = slot.try_lock_owned() else {
            return false;
        };
        if let Err(e) = self.open_into(set, &mut slot).await {
            tracing::warn!("server {}: opening the copy of set {set}: {e}", self.me);
            return false;
        }
        slot.as_ref().is_some_and(|c| c.partial)
    }

    /// Open the copy of `set` into `slot` unless it is open already.
    async fn open_into(
        &self,
        set: ServerId,
        slot: &mut Option<ReplicaCopy>,
    ) -> std::io::Result<()> {
        if slot.is_none() {
            let (dir, stores, boot) = (copy_dir(&self.root, set), self.stores.clone(), self.boot);
            *slot = Some(
                crate::service::blocking(move || open_copy(dir, stores.as_deref(), boot)).await?,
            );
        }
        Ok(())
    }

    /// Whether the copy of `set` kept here has every record it took, so
    /// that it can serve the set: it took some (a stream), no load was cut
    /// off and no power loss reopened it at a position no sync wrote. Asked
    /// by a primary holding the set after a power loss, whose copies were
    /// taken out while down (members.rs `hand_over`). False for a copy
    /// served here, one that cannot be opened, and none at all (a disk
    /// lost, a replacement).
    pub(crate) async fn whole(&self, set: ServerId) -> bool {
        if !self.sets.contains(&set) || self.is_promoted(set) {
            return false;
        }
        if self.stores.is_none() && !copy_dir(&self.root, set).exists() {
            return false;
        }
        let slot = self.slot(set);
        let mut slot = slot.lock_owned().await;
        if let Err(e) = self.open_into(set, &mut slot).await {
            tracing::warn!("server {}: opening the copy of set {set}: {e}", self.me);
            return false;
        }
        slot.as_ref().is_some_and(|c| !c.partial && c.stream != 0)
    }

    /// Refuse a request about `set` unless this server keeps a copy of it.
    fn keeps(&self, set: ServerId) -> Result<(), WireError> {
        if self.sets.contains(&set) {
            return Ok(());
        }
        Err(err(
            ErrorCode::InvalidArgument,
            format!("server {} keeps no copy of set {set}", self.me),
        ))
    }

    /// Room for `growth` more bytes in the copy of `set`: refused
    /// (NoSpace) where they would take the disk into the reserve that the
    /// server's own set stops at (`space::reserve`), or for a resync's
    /// load (`loading`), into twice it: a rebuild never takes the room the
    /// server's own writers need. Before, a copy wrote until the disk was
    /// full, and the server's own set then met ENOSPC in RocksDB itself.
    fn room_for(&self, set: ServerId, growth: u64, loading: bool) -> Result<(), WireError> {
        if growth == 0 {
            return Ok(());
        }
        let factor = if loading { 2 } else { 1 };
        let granted = self
            .space
            .grant(growth, |total| factor * crate::space::reserve(total))
            .map_err(|e| {
                err(
                    ErrorCode::Io,
                    format!("server {}: measuring free space: {e}", self.me),
                )
            })?;
        granted.map_err(|reserve| {
            err(
                ErrorCode::NoSpace,
                format!(
                    "server {} keeps its last {reserve} bytes free: its copy of set {set} \
                     takes no more",
                    self.me
                ),
            )
        })
    }

    /// Refuse records (and a load's questions) for a copy served here.
    fn not_promoted(&self, set: ServerId) -> Result<(), WireError> {
        if !self.is_promoted(set) {
            return Ok(());
        }
        Err(err(
            ErrorCode::Stale,
            format!(
                "server {} serves set {set} from its copy now; it takes no records for it",
                self.me
            ),
        ))
    }

    fn is_promoted(&self, set: ServerId) -> bool {
        self.promoted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&set)
    }

    /// Apply records `first_seq..` of `stream` to the copy of `set`.
    pub(crate) async fn apply(
        &self,
        set: ServerId,
        stream: u64,
        first_seq: u64,
        heads: &[u8],
        payloads: Vec<u8>,
    ) -> OpResult {
        self.keeps(set)?;
        *self.last_apply.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now());
        // The records' payloads are ranges of this buffer, not copies.
        let records = Record::decode_all(heads, &Arc::new(payloads))?;
        let slot = self.slot(set);
        // One apply at a time per copy: records go in stream order.
        let mut slot = slot.lock_owned().await;
        self.not_promoted(set)?;
        self.open_into(set, &mut slot)
            .await
            .map_err(|e| err(ErrorCode::Io, format!("opening the copy of set {set}: {e}")))?;
        if first_seq == 0 {
            return self.load(set, stream, records, &mut slot).await;
        }
        let copy = slot.as_mut().expect("opened above");
        if copy.partial {
            return Err(err(
                ErrorCode::Stale,
                format!(
                    "server {}'s copy of set {set} may lack records (a resync's load did not \
                     finish, or it was reopened after a stop without a final sync); it needs a \
                     resync",
                    self.me
                ),
            ));
        }
        if copy.stream != stream {
            // A call without records asks only whether the copy is empty
            // (a server whose data directory is empty probes its replicas
            // before it serves, replace.rs `copy_elsewhere`): it is, and
            // nothing is taken.
            if copy.applied == 0 && first_seq == 1 && records.is_empty() {
                return ack(0);
            }
            // An empty copy may follow a new stream from its first record
            // only if that record made the store (a new store's first
            // batch puts its format): a primary that restarted after a
            // crash, or a promoted copy, starts a new stream over a store
            // that has everything before it, which an empty copy lacks.
            // Taking it on made such a copy count as in sync without the
            // keys written before (the write verifier among them: fsyncs
            // after its promotion failed, seen in failover_fsx when the
            // test harness restarted a cluster whose ports were taken).
            let starts_store = matches!(records.first(), Some(Record::Kv { batch, .. })
                if WriteBatch::decode(batch)
                    .is_some_and(|b| b.keys().any(|k| k == keys::META_FORMAT)));
            if copy.applied != 0 || first_seq != 1 || !starts_store {
                return Err(err(
                    ErrorCode::Stale,
                    format!(
                        "server {}'s copy of set {set} follows another stream (at record {}); \
                         it needs a resync",
                        self.me, copy.applied
                    ),
                ));
            }
            copy.stream = stream;
        }
        if first_seq > copy.applied + 1 {
            return Err(err(
                ErrorCode::Stale,
                format!(
                    "server {}'s copy of set {set} has records up to {}, got {first_seq} next",
                    self.me, copy.applied
                ),
            ));
        }
        let skip = (copy.applied + 1 - first_seq) as usize;
        let (kv, chunks) = (copy.kv.clone(), copy.chunks.clone());
        let (stream, start, boot) = (copy.stream, first_seq + skip as u64, self.boot);
        let todo: Vec<Record> = records.into_iter().skip(skip).collect();
        self.room_for(set, growth(&todo), false)?;
        // Records this call acknowledges without a sync after them.
        let leaves_unsynced = todo.last().is_some_and(|r| !matches!(r, Record::Sync));
        let mark = (leaves_unsynced && !copy.marked)
            .then(|| Position::new(stream, copy.applied, false, boot));
        // Metadata batches not synced are a memtable insert and a WAL
        // append, which the primary made inline too: a hop to a blocking
        // thread was most of a replicated create's added time (a
        // ReplicaApply took 144 us on average, the whole create 69 us at
        // R = 1). Short chunk writes are buffered copies into the page
        // cache, also inline on the primary (`SMALL_WRITE_INLINE_MAX_BYTES`);
        // longer ones, and syncs, go to a blocking thread.
        // (At most 4 such writes' worth in all: a call may carry many.)
        let inline_bytes = todo.iter().try_fold(0usize, |n, r| match r {
            Record::Kv { sync: false, .. } => Some(n),
            Record::ChunkWrite { data, .. } => Some(n + data.len()),
            _ => None,
        });
        let applied = if mark.is_none()
            && inline_bytes.is_some_and(|n| n <= 4 * crate::service::SMALL_WRITE_INLINE_MAX_BYTES)
        {
            apply_records(kv.as_ref(), &chunks, (stream, boot), start, todo)
        } else {
            crate::service::blocking(move || {
                if let Some(at) = mark {
                    let mut b = WriteBatch::new();
                    b.put(keys::META_REPLICA_POSITION, &at.encode());
                    if let Err(e) = kv.write(b, true) {
                        return Ok(Err((start - 1, format!("marking the copy unsynced: {e}"))));
                    }
                }
                Ok(apply_records(
                    kv.as_ref(),
                    &chunks,
                    (stream, boot),
                    start,
                    todo,
                ))
            })
            .await
            .map_err(|e| err(ErrorCode::Io, e.to_string()))?
        };
        match applied {
            Ok(last) => {
                copy.applied = copy.applied.max(last);
                copy.marked = leaves_unsynced;
                ack(copy.applied)
            }
            Err((last, e)) => {
                copy.applied = copy.applied.max(last);
                Err(err(
                    ErrorCode::Io,
                    format!(
                        "server {}'s copy of set {set}: applying record {}: {e}",
                        self.me,
                        last + 1
                    ),
                ))
            }
        }
    }
}

fn open_copy(
    dir: PathBuf,
    stores: Option<&dyn crate::injected::Stores>,
    boot: Option<BootId>,
) -> std::io::Result<ReplicaCopy> {
    // The store is looked up before the directory is made: a copy wiped
    // for a resync (its directory removed) must come back empty.
    let kv: Arc<dyn KvStore> = match stores {
        Some(s) => s.open_meta(&dir)?,
        None => {
            std::fs::create_dir_all(&dir)?;
            // Written per record, read only here and by a resync's load:
            // a vector memtable (madfs_kv `open_write_mostly`). A promoted
            // copy is reopened as a served store (`Server::open`).
            Arc::new(
                RocksStore::open_write_mostly(&dir.join("meta"))
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            )
        }
    };
    std::fs::create_dir_all(&dir)?;
    let chunks = Arc::new(ChunkStore::open(dir.join("chunks"))?);
    // No position: a copy that never took a record. One that does not
    // decode (another format) is treated as partial.
    let (at, unknown) = match kv
        .get(keys::META_REPLICA_POSITION)
        .map_err(|e| std::io::Error::other(e.to_string()))?
    {
        None => (Position::new(0, 0, true, None), false),
        Some(v) => match Position::decode(&v) {
            Some(p) => (p, false),
            None => (Position::new(0, 0, false, None), true),
        },
    };
    let loading = kv
        .get(keys::META_REPLICA_LOADING)
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .is_some();
    Ok(ReplicaCopy {
        kv,
        chunks,
        stream: at.stream,
        applied: at.seq,
        partial: loading || unknown || !at.whole(boot),
        marked: false,
        load_seen: None,
        load: 0,
    })
}

/// Where a copy is in its primary's stream (`META_REPLICA_POSITION`):
/// the stream, the last record applied, and whether that record was a
/// sync (everything up to it durable here, chunk files included).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Position {
    stream: u64,
    seq: u64,
    synced: bool,
    /// The kernel boot the position was written in (None: written by an
    /// older version, or where the boot is unknown).
    boot: Option<BootId>,
}

/// The kernel's id of the running boot (`/proc/sys/kernel/random/boot_id`,
/// a random UUID per boot; crates/sim gives each simulated power cut its
/// own).
pub type BootId = [u8; 16];

/// This boot's id; None where the kernel does not say. A test seam,
/// `MADFS_TEST_BOOT_ID` (any text), stands for another boot: a server
/// restarted with it is as after a power loss (crates/cli/tests).
pub fn kernel_boot_id() -> Option<BootId> {
    static BOOT: std::sync::OnceLock<Option<BootId>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        if let Ok(fake) = std::env::var("MADFS_TEST_BOOT_ID") {
            let h = madfs_types::stable_hash(&[fake.as_bytes()]);
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&h.to_le_bytes());
            id[8..].copy_from_slice(&(!h).to_le_bytes());
            return Some(id);
        }
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(id)
    })
}

impl Position {
    fn new(stream: u64, seq: u64, synced: bool, boot: Option<BootId>) -> Position {
        Position {
            stream,
            seq,
            synced,
            boot,
        }
    }

    /// 17 bytes (stream, seq, synced), then the boot's 16 where known.
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(33);
        v.extend_from_slice(&self.stream.to_le_bytes());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.push(u8::from(self.synced));
        if let Some(b) = &self.boot {
            v.extend_from_slice(b);
        }
        v
    }

    /// None for anything `encode` did not make (a copy of an older
    /// format reads as at record 0, and is refused as stale).
    fn decode(v: &[u8]) -> Option<Position> {
        if v.len() != 17 && v.len() != 33 {
            return None;
        }
        Some(Position {
            stream: u64::from_le_bytes(v[..8].try_into().expect("8 bytes")),
            seq: u64::from_le_bytes(v[8..16].try_into().expect("8 bytes")),
            synced: v[16] == 1,
            boot: v.get(17..).and_then(|b| b.try_into().ok()),
        })
    }

    /// Whether the copy surely holds every record up to this one, and
    /// every record it acknowledged: its record was a sync (all before it
    /// durable; and records acknowledged after a sync first write a
    /// durable unsynced position, `ReplicaCopy::marked`, so a sync's
    /// position left by a power cut means none were), or it was written
    /// in this boot of the kernel. A process that dies loses nothing the
    /// kernel took (the WAL and chunk files are written to it as each
    /// record is applied); a power cut or a kernel crash may lose chunk
    /// writes before the position, which a replay from there would not
    /// bring back, and a new boot is the mark of those.
    fn whole(&self, boot: Option<BootId>) -> bool {
        self.synced || (boot.is_some() && self.boot == boot)
    }
}

/// Apply `records` (numbered from `first`) of stream `stream`, in order:
/// the last applied, or the last applied before the one that failed and
/// why. A run of metadata batches is written as one batch (one WAL
/// append), synced if any of them was, with the position of its last
/// record: atomic, so a crash leaves the copy before or after the whole
/// run. Chunk records write no position of their own; a call that ends
/// with them writes it once after them, so a copy restarted after a
/// process crash (positions carry `boot`) knows it has every record the
/// call brought, and its primary replays only what came after.
fn apply_records(
    kv: &dyn KvStore,
    chunks: &ChunkStore,
    (stream, boot): (u64, Option<BootId>),
    first: u64,
    records: Vec<Record>,
) -> Result<u64, (u64, String)> {
    let mut last = first - 1;
    let mut records = records.into_iter().peekable();
    let mut position_written = true;
    while let Some(r) = records.next() {
        let r = match r {
            Record::Kv { batch, sync } if matches!(records.peek(), Some(Record::Kv { .. })) => {
                let mut run = decode_batch(&batch).map_err(|e| (last, e))?;
                let mut sync_run = sync;
                let mut n = 1u64;
                while let Some(Record::Kv { batch, sync }) =
                    records.next_if(|r| matches!(r, Record::Kv { .. }))
                {
                    run.append(decode_batch(&batch).map_err(|e| (last, e))?);
                    sync_run |= sync;
                    n += 1;
                }
                run.put(
                    keys::META_REPLICA_POSITION,
                    &Position::new(stream, last + n, false, boot).encode(),
                );
                kv.write(run, sync_run).map_err(|e| (last, e.to_string()))?;
                last += n;
                position_written = true;
                continue;
            }
            r => r,
        };
        position_written = matches!(r, Record::Kv { .. } | Record::Sync);
        let at = Position::new(stream, last + 1, matches!(r, Record::Sync), boot);
        apply_one(kv, chunks, r, Some(at)).map_err(|e| (last, e))?;
        last += 1;
    }
    if !position_written {
        let mut b = WriteBatch::new();
        b.put(
            keys::META_REPLICA_POSITION,
            &Position::new(stream, last, false, boot).encode(),
        );
        kv.write(b, false).map_err(|e| (last, e.to_string()))?;
    }
    Ok(last)
}

/// Bytes `records` may add to a copy: their data, and the keys and values
/// their metadata batches put. Removals add none: they go through on a
/// full disk, as on the primary.
fn growth(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| match r {
            Record::ChunkWrite { data, .. } => data.len() as u64,
            Record::Kv { batch, .. } => {
                WriteBatch::encoded_put_bytes(batch).unwrap_or(batch.len() as u64)
            }
            _ => 0,
        })
        .sum()
}

fn decode_batch(batch: &[u8]) -> Result<WriteBatch, String> {
    WriteBatch::decode(batch).ok_or_else(|| "a metadata batch that does not decode".to_string())
}

/// Apply one record as the primary applied it. With `at` (a numbered
/// record), metadata batches and syncs also record the copy's position, so
/// a copy restarted after them knows it has everything up to there; a
/// resync's load applies its records without one.
fn apply_one(
    kv: &dyn KvStore,
    chunks: &ChunkStore,
    record: Record,
    at: Option<Position>,
) -> Result<(), String> {
    let with_position = |mut b: WriteBatch| {
        if let Some(p) = at {
            b.put(keys::META_REPLICA_POSITION, &p.encode());
        }
        b
    };
    match record {
        Record::Kv { batch, sync } => kv
            .write(with_position(decode_batch(&batch)?), sync)
            .map_err(|e| e.to_string()),
        Record::ChunkWrite {
            ino,
            index,
            offset,
            chunk_size,
            data,
        } => chunks
            .write(ino, index, offset, &data, chunk_size)
            .map_err(|e| e.to_string()),
        Record::Truncate {
            ino,
            size,
            chunk_size,
        } => chunks
            .truncate(ino, size, chunk_size)
            .map_err(|e| e.to_string()),
        Record::Purge { ino } => chunks.purge(ino).map_err(|e| e.to_string()),
        Record::Reset { .. } => Err("a reset where none belongs".to_string()),
        Record::ChunkDrop { ino, index } => {
            chunks.drop_chunk(ino, index).map_err(|e| e.to_string())
        }
        Record::Sync => chunks
            .sync_dirty()
            .map_err(|e| e.to_string())
            .and_then(|()| match at {
                Some(_) => kv
                    .write(with_position(WriteBatch::new()), true)
                    .map_err(|e| e.to_string()),
                None => kv.sync_wal().map_err(|e| e.to_string()),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::SharedBytes;
    use madfs_kv::MemStore;

    fn kv(key: &[u8], value: &[u8], sync: bool) -> Record {
        let mut b = WriteBatch::new();
        b.put(key, value);
        Record::Kv {
            batch: SharedBytes::new(b.encode()),
            sync,
        }
    }

    /// The first record of a new store's stream: its format.
    fn store_made() -> Record {
        kv(
            keys::META_FORMAT,
            &keys::FORMAT_VERSION.to_le_bytes(),
            false,
        )
    }

    /// The metadata store of the copy of set 0 (opened).
    async fn store_of_set_0(copies: &ReplicaCopies) -> Arc<dyn KvStore> {
        let slot = copies.slot(ServerId(0));
        let copy = slot.lock().await;
        copy.as_ref().expect("opened").kv.clone()
    }

    fn at(kv: &dyn KvStore) -> (u64, u64) {
        let v = kv.get(keys::META_REPLICA_POSITION).unwrap().unwrap();
        let p = Position::decode(&v).unwrap();
        (p.stream, p.seq)
    }

    /// Send `records` numbered from `first` of `stream` to the copy of
    /// set 0; the position acknowledged, or the refusal's code.
    async fn send(
        copies: &ReplicaCopies,
        stream: u64,
        first: u64,
        records: &[Record],
    ) -> Result<u64, ErrorCode> {
        let (heads, _) = crate::replication::encode_all(records.iter());
        let mut payloads = Vec::new();
        for r in records {
            if let Record::Kv { batch, .. } = r {
                payloads.extend_from_slice(batch);
            }
        }
        match copies
            .apply(ServerId(0), stream, first, &heads, payloads)
            .await
        {
            Ok((madfs_proto::message::Reply::ReplicaAck { applied }, _)) => Ok(applied),
            Ok((other, _)) => panic!("{other:?}"),
            Err(e) => Err(e.code),
        }
    }

    fn copies_in(root: &std::path::Path) -> ReplicaCopies {
        ReplicaCopies::new(
            ServerId(1),
            root.to_path_buf(),
            vec![ServerId(0)],
            None,
            None,
        )
    }

    /// `copies_in`, in kernel boot `boot`.
    fn copies_booted(root: &std::path::Path, boot: u8) -> ReplicaCopies {
        let mut copies = copies_in(root);
        copies.boot = Some([boot; 16]);
        copies
    }

    /// What a stream continued after a clean stop (restart.rs) or a
    /// process crash may count on: a copy reopened takes the next record
    /// only where a sync wrote its position, or in the boot that wrote it;
    /// reopened after a reboot at a position no sync wrote, or cut off in
    /// a load, it refuses even the record right after its position.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reopened_copy_continues_only_from_a_whole_position() {
        let root = tempfile::tempdir().unwrap();
        let copies = copies_booted(root.path(), 1);
        let x = 77;
        assert_eq!(send(&copies, x, 1, &[store_made()]).await, Ok(1));
        assert_eq!(send(&copies, x, 2, &[Record::Sync]).await, Ok(2));
        drop(copies);
        // Synced at 2, reopened after a reboot: record 3 goes on; a gap
        // does not.
        let copies = copies_booted(root.path(), 2);
        assert_eq!(
            send(&copies, x, 5, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
        assert_eq!(send(&copies, x, 3, &[kv(b"b", b"1", false)]).await, Ok(3));
        drop(copies);
        // Reopened at 3, which no sync wrote, in the boot that wrote it
        // (its process died; the kernel kept all it was given): record 4
        // goes on.
        let copies = copies_booted(root.path(), 2);
        assert_eq!(send(&copies, x, 4, &[kv(b"c", b"1", false)]).await, Ok(4));
        drop(copies);
        // Reopened at 4, which no sync wrote, after a reboot: the chunk
        // writes before it may be lost, so not even record 5 is taken.
        let copies = copies_booted(root.path(), 3);
        assert_eq!(
            send(&copies, x, 5, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
        // A resync's load: reset, contents, cut off before its sync.
        let reset = [Record::Reset {
            applied: 9,
            stream: x,
        }];
        assert_eq!(send(&copies, x, 0, &reset).await, Ok(9));
        assert_eq!(send(&copies, x, 0, &[kv(b"c", b"1", false)]).await, Ok(9));
        assert_eq!(
            send(&copies, x, 10, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
        drop(copies);
        let copies = copies_in(root.path());
        assert_eq!(
            send(&copies, x, 10, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
        // A load that ends (its sync) is whole at the reset's position,
        // also reopened.
        assert_eq!(send(&copies, x, 0, &reset).await, Ok(9));
        assert_eq!(send(&copies, x, 0, &[kv(b"c", b"1", false)]).await, Ok(9));
        assert_eq!(send(&copies, x, 0, &[Record::Sync]).await, Ok(9));
        drop(copies);
        let copies = copies_in(root.path());
        assert_eq!(send(&copies, x, 10, &[kv(b"d", b"1", false)]).await, Ok(10));
        // Another stream with records is stale too.
        assert_eq!(
            send(&copies, x + 1, 11, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
    }

    #[test]
    fn a_run_of_metadata_batches_lands_whole_with_its_last_position() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let store = MemStore::new();
        let records = vec![
            kv(b"a", b"1", false),
            kv(b"a", b"2", false),
            kv(b"b", b"1", true),
            Record::Purge {
                ino: madfs_types::InodeId(7),
            },
            kv(b"c", b"1", false),
        ];
        assert_eq!(
            apply_records(&store, &chunks, (9, None), 11, records),
            Ok(15)
        );
        assert_eq!(store.get(b"a").unwrap(), Some(b"2".to_vec()));
        assert_eq!(store.get(b"b").unwrap(), Some(b"1".to_vec()));
        assert_eq!(store.get(b"c").unwrap(), Some(b"1".to_vec()));
        assert_eq!(at(&store), (9, 15));

        // A batch that does not decode inside a run: none of the run is
        // applied, and the copy stays at the record before it.
        let records = vec![
            kv(b"d", b"1", false),
            Record::Kv {
                batch: SharedBytes::new(vec![9, 9]),
                sync: false,
            },
            kv(b"e", b"1", false),
        ];
        let (last, why) = apply_records(&store, &chunks, (9, None), 16, records).unwrap_err();
        assert_eq!(last, 15, "{why}");
        assert!(why.contains("does not decode"), "{why}");
        assert_eq!(store.get(b"d").unwrap(), None);
        assert_eq!(at(&store), (9, 15));
    }

    /// A call that ends with chunk records still leaves its last position
    /// (in this boot): a copy restarted after its process died knows it
    /// has them, and is replayed from there instead of loaded whole.
    #[test]
    fn a_call_ending_with_chunk_writes_leaves_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = ChunkStore::open(dir.path().join("chunks")).unwrap();
        let store = MemStore::new();
        let boot = Some([7u8; 16]);
        let write = Record::ChunkWrite {
            ino: madfs_types::InodeId(7),
            index: madfs_types::ChunkIndex(1),
            offset: 0,
            chunk_size: 1 << 20,
            data: SharedBytes::new(vec![5; 100]),
        };
        let records = vec![kv(b"a", b"1", false), write.clone(), write];
        assert_eq!(
            apply_records(&store, &chunks, (9, boot), 11, records),
            Ok(13)
        );
        assert_eq!(at(&store), (9, 13));
        let p =
            Position::decode(&store.get(keys::META_REPLICA_POSITION).unwrap().unwrap()).unwrap();
        assert!(p.whole(boot), "written in this boot");
        assert!(!p.whole(Some([8u8; 16])), "after a power cut");
        assert!(!p.whole(None), "where the boot is unknown");
    }

    /// A resync's load compares the copy's metadata range by range, over
    /// the copy it had: a range that hashes as the primary's stays, one
    /// that differs is dropped (only it), the copy's own keys (its
    /// position) are in no range, and a copy whose load this process did
    /// not see answers no question.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_keeps_the_key_ranges_that_hash_as_the_primarys_and_drops_the_others() {
        let root = tempfile::tempdir().unwrap();
        let copies = copies_in(root.path());
        let held: [(&[u8], &[u8]); 4] = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")];
        let records: Vec<Record> = std::iter::once(store_made())
            .chain(held.iter().map(|(k, v)| kv(k, v, false)))
            .collect();
        assert_eq!(send(&copies, 5, 1, &records).await, Ok(5));
        let format = keys::FORMAT_VERSION.to_le_bytes();
        // Load 60 of stream 6.
        let (load, follows) = (60, 6);
        let reset = Record::Reset {
            applied: 0,
            stream: follows,
        };
        assert_eq!(send(&copies, load, 0, &[reset]).await, Ok(0));
        let digest = |pairs: &[(&[u8], &[u8])]| {
            let mut d = KeyRangeDigest::new();
            for (k, v) in pairs {
                d.add(k, v);
            }
            d.finish()
        };
        async fn ask(
            copies: &ReplicaCopies,
            load: u64,
            after: Option<&[u8]>,
            upto: Option<&[u8]>,
            digest: [u8; 16],
        ) -> Result<bool, ErrorCode> {
            let (after, upto) = (after.map(<[u8]>::to_vec), upto.map(<[u8]>::to_vec));
            match copies
                .key_range(ServerId(0), load, after, upto, digest)
                .await
            {
                Ok((madfs_proto::message::Reply::KeyRangeSame { same }, _)) => Ok(same),
                Ok((other, _)) => panic!("{other:?}"),
                Err(e) => Err(e.code),
            }
        }
        // Up to "b" as the primary holds it: kept.
        let up_to_b = [(keys::META_FORMAT, &format[..]), held[0], held[1]];
        assert_eq!(
            ask(&copies, load, None, Some(b"b"), digest(&up_to_b)).await,
            Ok(true)
        );
        // After "b" the primary holds c = 3 and e = 5 (d gone, e new).
        let theirs: [(&[u8], &[u8]); 2] = [(b"c", b"3"), (b"e", b"5")];
        assert_eq!(
            ask(&copies, load, Some(b"b"), None, digest(&theirs)).await,
            Ok(false)
        );
        let kv = store_of_set_0(&copies).await;
        for (k, v) in &held[..2] {
            assert_eq!(kv.get(k).unwrap().as_deref(), Some(*v));
        }
        for (k, _) in &held[2..] {
            assert_eq!(kv.get(k).unwrap(), None, "{k:?} outlived its range");
        }
        assert_eq!(
            at(kv.as_ref()),
            (follows, 0),
            "the copy's position went with a range"
        );
        // The same range again, now empty there: it hashes as nothing.
        assert_eq!(
            ask(&copies, load, Some(b"b"), None, digest(&[])).await,
            Ok(true)
        );
        drop(kv);
        drop(copies);
        // Reopened (a restart mid-load): it did not see the reset.
        let copies = copies_in(root.path());
        assert_eq!(
            ask(&copies, load, None, None, digest(&[])).await,
            Err(ErrorCode::Stale)
        );
    }

    /// An empty copy follows a new stream from record 1 only if that
    /// record made the primary's store: a stream a primary opened over a
    /// store it already had (restarted after a crash, or a promoted copy)
    /// holds none of the keys written before, so the copy must be loaded
    /// (refused as stale, the primary takes it out and resyncs it). It
    /// took such a stream before, counted as in sync without the store's
    /// write verifier, and answered fsyncs with another once promoted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_copy_takes_a_new_stream_only_from_the_stores_start() {
        let root = tempfile::tempdir().unwrap();
        let copies = copies_in(root.path());
        assert_eq!(
            send(&copies, 41, 1, &[kv(b"a", b"1", false)]).await,
            Err(ErrorCode::Stale),
            "a stream begun over a store that had keys"
        );
        assert_eq!(
            send(&copies, 41, 1, &[Record::Sync]).await,
            Err(ErrorCode::Stale)
        );
        // A call without records only asks whether it is empty: it is.
        assert_eq!(send(&copies, 41, 1, &[]).await, Ok(0));
        assert_eq!(
            send(&copies, 42, 1, &[store_made(), kv(b"a", b"1", false)]).await,
            Ok(2),
            "a new store's stream"
        );
    }

    /// A call of a resync's load that arrives after the primary started
    /// another load (it outlived its timeout: the copy was slow) is
    /// refused, contents and questions alike: it would put back keys as
    /// they were before the new load compared them, or drop a range it
    /// had settled. The new load goes on and ends whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_call_of_an_earlier_load_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let copies = copies_in(root.path());
        let reset = |applied| Record::Reset { applied, stream: 5 };
        let (first, second) = (71, 72);
        assert_eq!(send(&copies, first, 0, &[reset(3)]).await, Ok(3));
        assert_eq!(send(&copies, second, 0, &[reset(4)]).await, Ok(4));
        assert_eq!(
            send(&copies, second, 0, &[kv(b"k", b"new", false)]).await,
            Ok(4)
        );
        // The first load's, late.
        assert_eq!(
            send(&copies, first, 0, &[kv(b"k", b"old", false)]).await,
            Err(ErrorCode::Io)
        );
        let question = copies
            .key_range(ServerId(0), first, None, None, [0; 16])
            .await;
        assert_eq!(question.unwrap_err().code, ErrorCode::Stale);
        let digests = copies
            .digests(ServerId(0), first, vec![(InodeId(9), ChunkIndex(0))])
            .await;
        assert_eq!(digests.unwrap_err().code, ErrorCode::Stale);
        assert_eq!(send(&copies, second, 0, &[Record::Sync]).await, Ok(4));
        // Ended: no load's call is taken any more, not even its own.
        assert_eq!(
            send(&copies, second, 0, &[kv(b"k", b"late", false)]).await,
            Err(ErrorCode::Io)
        );
        let store = store_of_set_0(&copies).await;
        assert_eq!(store.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(at(store.as_ref()), (5, 4));
        drop(store);
        // And it follows stream 5 from record 5.
        assert_eq!(send(&copies, 5, 5, &[kv(b"n", b"1", false)]).await, Ok(5));
    }

    /// Positions of the format before boots (17 bytes) still read, and
    /// are whole only at a sync.
    #[test]
    fn positions_without_a_boot_still_read() {
        let old = Position::new(3, 40, false, None).encode();
        assert_eq!(old.len(), 17);
        let p = Position::decode(&old).unwrap();
        assert_eq!((p.stream, p.seq, p.boot), (3, 40, None));
        assert!(!p.whole(kernel_boot_id()));
        let synced = Position::decode(&Position::new(3, 40, true, None).encode()).unwrap();
        assert!(synced.whole(None));
        assert!(Position::decode(&[0u8; 20]).is_none());
    }
}
