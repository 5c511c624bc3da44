//! Resync of a replica that was out of the set (replication.rs,
//! ARCHITECTURE "Resync, step by step"): the records from the moment it
//! comes back are kept for it, its copy is loaded range by range from this
//! server's store (only what it does not hold as it is here), then the
//! kept records are shipped on top, and the group counts it in sync.

use super::*;

/// What a resync's load copied.
struct Loaded {
    /// Keys the primary held (at their page's read), and of those, keys in
    /// ranges the replica held as they were, and kept.
    keys: u64,
    keys_kept: u64,
    /// Chunk files the primary held at the load's start.
    files: u64,
    /// Chunk bytes sent, and bytes the replica held as they were (equal
    /// digests) and kept.
    bytes_sent: u64,
    bytes_kept: u64,
}

impl Replicator {
    /// Bring `replica` (which the map lists as catching up on this set) a
    /// full copy, then the records since, then ask the group to count it
    /// in sync. Runs in a task of its own; after a failed attempt the
    /// replica is out until the next, which starts after a pause, for as
    /// long as the map lists it as catching up.
    pub(crate) fn catch_up(self: &Arc<Self>, server: Arc<crate::Server>, replica: ServerId) {
        let Some((mut i, mut generation, mut from)) = self.add_syncing(replica) else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let most = resync_pause_max();
            let mut pause = RESYNC_PAUSE.min(most);
            loop {
                let why = match me.resync(&server, i, generation, from, replica).await {
                    Ok(()) => return,
                    Err(why) => why,
                };
                // Over when overtaken by a newer catch-up, and when it left
                // the set meanwhile (the group agreed): the records kept
                // for it from `from` are gone, so another attempt would
                // load the whole copy and fail at once; the group's next
                // map lists it as catching up again once it asks, and
                // that starts a new catch-up. Else, while the map lists
                // it as catching up, it is tried again, ever less often:
                // a failure may last (its disk full until files are
                // removed), and a catch-up once given up for good after
                // 10 tries left the set short of a copy until a restart,
                // and kept every record for it in memory meanwhile.
                if !me.pause_catch_up(i, generation, &why) {
                    return;
                }
                tracing::warn!(
                    "set {}: catching up server {replica} failed ({why}); next try in {pause:?}",
                    me.set
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(most);
                match me.add_syncing_if(replica, Some(generation)) {
                    Some(next) => (i, generation, from) = next,
                    None => return,
                }
            }
        });
    }

    /// One attempt at a resync (see `catch_up`): Ok if it is over (done,
    /// or overtaken by a newer one), else why it failed.
    async fn resync(
        self: &Arc<Self>,
        server: &Arc<crate::Server>,
        i: usize,
        generation: u64,
        from: u64,
        replica: ServerId,
    ) -> Result<(), String> {
        tracing::info!(
            "set {}: resync of server {replica} starts (records from {from} kept for it)",
            self.set
        );
        if self.has_all_before(server, replica, from).await {
            tracing::info!(
                "set {}: server {replica}'s copy has every record before {from}: no load, \
                 the records since follow",
                self.set
            );
        } else {
            match self.load(server, replica, from, (i, generation)).await {
                Ok(l) => tracing::info!(
                    "set {}: server {replica} has the copy ({} keys, {} it held already kept; \
                     {} chunk files: {} bytes sent, {} bytes it held already kept); now the \
                     records since",
                    self.set,
                    l.keys,
                    l.keys_kept,
                    l.files,
                    l.bytes_sent,
                    l.bytes_kept
                ),
                Err(e) => {
                    tracing::error!("set {}: resync of server {replica} failed: {e}", self.set);
                    return Err(e);
                }
            }
        }
        self.progress(i, generation, |p| p.phase = RebuildPhase::CatchingUp);
        self.start_shipper(i, server.clone());
        // In sync once it has every record written up to a moment
        // after the load (later ones keep flowing to it).
        let target = self.last_seq();
        loop {
            {
                let s = self.lock();
                let r = &s.replicas[i];
                if r.generation != generation {
                    return Ok(());
                }
                if let Some(why) = &r.out {
                    return Err(format!("it left the set: {why}"));
                }
                if r.acked >= target {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !self.set_awaited(i, generation, true) {
            return Err("its name could not be kept in the store".into());
        }
        let counted = match self.group.get() {
            Some(g) => g.mark_in_sync(self.set, replica).await,
            None => true,
        };
        if !counted {
            self.set_awaited(i, generation, false);
            self.acked.notify_waiters();
            return Err("the membership group did not count it in sync".into());
        }
        self.mark_in_sync(replica);
        tracing::info!("set {}: server {replica} is in sync again", self.set);
        Ok(())
    }

    /// Whether `replica`'s copy already has this stream up to record
    /// `from - 1`, so the records from `from` on bring it up to date (it
    /// was cut off while records were kept for it, or this primary stopped
    /// cleanly and continued its stream, restart.rs): an empty numbered
    /// ReplicaApply of record `from` is acknowledged at `from - 1` or
    /// later only by a whole copy on this stream with nothing missing. A
    /// copy of another stream with records, one with a gap, or one cut off
    /// mid-load refuses it; a new stream at its first record is never
    /// taken as proof (an empty copy would accept it).
    async fn has_all_before(&self, server: &crate::Server, replica: ServerId, from: u64) -> bool {
        if from <= 1 {
            return false;
        }
        let req = Request {
            creds: Credentials::root(),
            op: Op::ReplicaApply {
                set: self.set,
                stream: self.stream_id,
                first_seq: from,
                heads: Vec::new(),
            },
            once: None,
        };
        let answer = self
            .pool(server)
            .call_shared_once(replica, &req, SharedData::Pieces(Vec::new()))
            .await;
        // At `from - 1` or past it (acknowledgements lost on the way: the
        // replay skips what it has), never past this stream's end.
        let last = self.last_seq();
        matches!(answer, Ok(r) if matches!(r.reply,
            Reply::ReplicaAck { applied } if applied + 1 >= from && applied <= last))
    }

    /// The load of a resync: bring `replica`'s copy to this server's store,
    /// sending the ranges of keys and the chunk files it does not hold as
    /// they are here, noting progress for replica index and generation
    /// `of`.
    async fn load(
        &self,
        server: &crate::Server,
        replica: ServerId,
        from: u64,
        of: (usize, u64),
    ) -> Result<Loaded, String> {
        let progress = |note: &dyn Fn(&mut Rebuild)| self.progress(of.0, of.1, note);
        // This load's id: every call of it carries it (`Record::Reset`).
        let mut load = random_stream_id();
        while load == self.stream_id {
            load = random_stream_id();
        }
        let send = |records: Vec<Record>| async move {
            let (heads, payloads) = encode_all(records.iter());
            let req = Request {
                creds: Credentials::root(),
                op: Op::ReplicaApply {
                    set: self.set,
                    stream: load,
                    first_seq: 0,
                    heads,
                },
                once: None,
            };
            self.pool(server)
                .call_shared_once(replica, &req, payloads)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        send(vec![Record::Reset {
            applied: from - 1,
            stream: self.stream_id,
        }])
        .await?;
        // The chunk files are listed first, for the total the progress
        // counts against; files written later come with the records kept
        // since `from`.
        let chunks = server.chunks.clone();
        let files = crate::service::blocking(move || chunks.list_chunks())
            .await
            .map_err(|e| e.to_string())?;
        let total: u64 = files
            .iter()
            .filter_map(|(_, _, p)| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        progress(&|p| {
            p.phase = RebuildPhase::Keys;
            p.bytes_total = total;
        });
        // Pages of keys in order, each compared with the copy's keys over
        // the same range (after the last page's last key, up to this
        // page's; the final range runs to the end): a copy back after a
        // power cut or a long absence holds most ranges as they are here.
        let (mut keys, mut keys_kept) = (0u64, 0u64);
        let mut after: Option<Vec<u8>> = None;
        loop {
            let kv = server.kv.clone();
            let from_key = crate::replica::first_key_after(after.clone());
            let rows = crate::service::blocking(move || {
                kv.scan(b"", &from_key, load_keys_per_call())
                    .map_err(|e| std::io::Error::other(e.to_string()))
            })
            .await
            .map_err(|e| e.to_string())?;
            // A short page is the last: its range runs to the end.
            let upto = (rows.len() == load_keys_per_call())
                .then(|| rows.last().map(|(k, _)| k.clone()))
                .flatten();
            let rows: Vec<_> = rows
                .into_iter()
                .filter(|(k, _)| !crate::replica::local_only_key(k))
                .collect();
            let mut digest = crate::replica::KeyRangeDigest::new();
            for (k, v) in &rows {
                digest.add(k, v);
            }
            let same = self
                .same_key_range(
                    load,
                    server,
                    replica,
                    after.clone(),
                    upto.clone(),
                    digest.finish(),
                )
                .await?;
            keys += rows.len() as u64;
            if same {
                keys_kept += rows.len() as u64;
            } else if !rows.is_empty() {
                let mut b = WriteBatch::new();
                for (k, v) in &rows {
                    b.put(k, v);
                }
                send(vec![Record::Kv {
                    batch: SharedBytes::new(b.encode()),
                    sync: false,
                }])
                .await?;
            }
            progress(&|p| {
                p.keys = keys;
                p.keys_kept = keys_kept;
            });
            match upto {
                Some(last) => after = Some(last),
                None => break,
            }
        }
        progress(&|p| p.phase = RebuildPhase::Chunks);
        let (mut bytes_sent, mut bytes_kept) = (0u64, 0u64);
        // The copy hashes each next 4096 files while these are compared and
        // sent (it answers from outside the copy's lock).
        let mut batches = files.chunks(REPLICA_DIGESTS_MAX);
        let mut current = batches.next();
        let mut theirs = match current {
            Some(batch) => self.their_digests(load, server, replica, batch).await?,
            None => Vec::new(),
        };
        while let Some(batch) = current {
            let next = batches.next();
            let ask_next = async {
                match next {
                    Some(b) => self.their_digests(load, server, replica, b).await.map(Some),
                    None => Ok(None),
                }
            };
            let these = std::mem::take(&mut theirs);
            let (bytes_sent, bytes_kept) = (&mut bytes_sent, &mut bytes_kept);
            // How the copy holds these files: one that equals ours is kept
            // (a copy back after a power cut or a long absence holds most
            // of them), one that differs is dropped and sent whole.
            let this = async {
                for ((ino, index, path), theirs) in batch.iter().zip(these) {
                    let mut drop_first = None;
                    if let Some(theirs) = theirs {
                        let (chunks, i, x) = (server.chunks.clone(), *ino, *index);
                        let ours = crate::service::blocking(move || chunks.digest(i, x))
                            .await
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        if ours == Some(theirs) {
                            *bytes_kept += theirs.len;
                            progress(&|p| {
                                p.bytes_done += theirs.len;
                                p.bytes_kept += theirs.len;
                            });
                            continue;
                        }
                        drop_first = Some(Record::ChunkDrop {
                            ino: *ino,
                            index: *index,
                        });
                    }
                    let mut offset = 0u64;
                    loop {
                        let piece = read_piece(path, offset).await?;
                        let mut records: Vec<Record> = drop_first.take().into_iter().collect();
                        if piece.is_empty() {
                            if !records.is_empty() {
                                send(records).await?;
                            }
                            break;
                        }
                        let n = piece.len() as u64;
                        records.push(Record::ChunkWrite {
                            ino: *ino,
                            index: *index,
                            offset,
                            chunk_size: server.chunk_size,
                            data: SharedBytes::new(piece),
                        });
                        send(records).await?;
                        *bytes_sent += n;
                        offset += n;
                        progress(&|p| p.bytes_done += n);
                        if let Some(pause) = rebuild_piece_pause() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
                Ok::<(), String>(())
            };
            let (done, asked) = tokio::join!(this, ask_next);
            done?;
            theirs = asked?.unwrap_or_default();
            current = next;
        }
        // Durable there before the records resume.
        send(vec![Record::Sync]).await?;
        Ok(Loaded {
            keys,
            keys_kept,
            files: files.len() as u64,
            bytes_sent,
            bytes_kept,
        })
    }

    /// A load's question to `replica`: whether its copy's keys after
    /// `after` up to `upto` hash to `digest` (`Op::ReplicaKeyRange`; if
    /// not, it dropped them).
    async fn same_key_range(
        &self,
        load: u64,
        server: &crate::Server,
        replica: ServerId,
        after: Option<Vec<u8>>,
        upto: Option<Vec<u8>>,
        digest: [u8; 16],
    ) -> Result<bool, String> {
        let req = Request {
            creds: Credentials::root(),
            op: Op::ReplicaKeyRange {
                set: self.set,
                stream: load,
                after,
                upto,
                digest,
            },
            once: None,
        };
        match self.pool(server).call_once(replica, &req, &[]).await {
            Ok(r) => match r.reply {
                Reply::KeyRangeSame { same } => Ok(same),
                other => Err(format!(
                    "replica {replica} answered a key range question with {other:?}"
                )),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    /// A load's question to `replica`: how its copy holds each of `files`
    /// (`Op::ReplicaDigests`), in order.
    async fn their_digests(
        &self,
        load: u64,
        server: &crate::Server,
        replica: ServerId,
        files: &[(InodeId, ChunkIndex, std::path::PathBuf)],
    ) -> Result<Vec<Option<ChunkDigest>>, String> {
        let req = Request {
            creds: Credentials::root(),
            op: Op::ReplicaDigests {
                set: self.set,
                stream: load,
                chunks: files.iter().map(|(i, x, _)| (*i, *x)).collect(),
            },
            once: None,
        };
        match self.pool(server).call_once(replica, &req, &[]).await {
            Ok(r) => match r.reply {
                Reply::ChunkDigests { digests } if digests.len() == files.len() => Ok(digests),
                other => Err(format!(
                    "replica {replica} answered a digest question with {other:?}"
                )),
            },
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Test seam: `MADFS_FAULT_REBUILD_PIECE_PAUSE_MS` pauses a resync after
/// each piece of chunk data it copies, so a test sees a rebuild under way
/// (`madfs status`). At most a second.
fn rebuild_piece_pause() -> Option<Duration> {
    static PAUSE: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *PAUSE.get_or_init(|| {
        madfs_types::env_number("MADFS_FAULT_REBUILD_PIECE_PAUSE_MS")
            .map(|ms| Duration::from_millis(ms.min(1000)))
    })
}

/// Up to `LOAD_CHUNK_PIECE` bytes of chunk file `path` from `at`, for a
/// load (none: its end, or purged meanwhile, which the records say).
async fn read_piece(path: &std::path::Path, at: u64) -> Result<Vec<u8>, String> {
    let p = path.to_path_buf();
    crate::service::blocking(move || {
        use std::os::unix::fs::FileExt;
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut buf = vec![0u8; LOAD_CHUNK_PIECE];
        let n = f.read_at(&mut buf, at)?;
        buf.truncate(n);
        Ok(buf)
    })
    .await
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Keys per page of a load: `LOAD_KEYS_PER_CALL`, fewer where a test
/// asks (`MADFS_TEST_LOAD_KEYS_PER_CALL`), so that a small store spans
/// several ranges to compare.
fn load_keys_per_call() -> usize {
    static KEYS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| {
        madfs_types::env_number("MADFS_TEST_LOAD_KEYS_PER_CALL").map_or(LOAD_KEYS_PER_CALL, |n| {
            n.clamp(1, LOAD_KEYS_PER_CALL as u64) as usize
        })
    })
}

/// Pause after a catch-up's first failed attempt; doubled at each next
/// one up to `RESYNC_PAUSE_MAX`.
const RESYNC_PAUSE: Duration = Duration::from_secs(1);
const RESYNC_PAUSE_MAX: Duration = Duration::from_secs(60);

/// `RESYNC_PAUSE_MAX`, or `MADFS_RESYNC_PAUSE_MAX_MS` where set (tests
/// that wait for a catch-up once its cause of failure is gone).
fn resync_pause_max() -> Duration {
    static MAX: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        madfs_types::env_number("MADFS_RESYNC_PAUSE_MAX_MS")
            .map_or(RESYNC_PAUSE_MAX, Duration::from_millis)
    })
}
/// Keys per load call of a resync.
const LOAD_KEYS_PER_CALL: usize = 4096;
/// Bytes of a chunk file per load call of a resync.
const LOAD_CHUNK_PIECE: usize = 4 << 20;
