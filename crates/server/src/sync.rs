//! The fsync coalescer: one thread per server makes writes durable. An fsync
//! request only queues a waiter; the thread takes every waiter queued so far,
//! syncs every dirty chunk file and the RocksDB WAL once, and answers them
//! all. Concurrent fsyncs cost one sync, not one each (MadFS's fix for the
//! fsync long tail in IO500).
//!
//! A failed sync is never retried: it poisons the chunk store (chunks.rs,
//! `ChunkStore::poison`), which then refuses writes and syncs, and
//! `PoisonGuard` makes the metadata store refuse writes too, until the
//! server restarts.

use crate::chunks::ChunkStore;
use madfs_kv::{KvError, KvStore, WriteBatch};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::oneshot;

/// Waiters queued at once; beyond it fsync callers wait to enqueue.
const QUEUE_MAX: usize = 65_536;

type Waiter = oneshot::Sender<Result<(), String>>;

enum Message {
    Sync(Waiter),
    /// Finish queued syncs, then end the thread (server shutdown).
    Stop,
}

#[derive(Clone)]
pub struct SyncCoalescer {
    tx: mpsc::SyncSender<Message>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    stats: SyncStats,
}

/// Sync rounds and their durations, for the server's metrics (metrics.rs).
#[derive(Clone, Debug)]
pub struct SyncStats {
    pub rounds: prometheus_client::metrics::counter::Counter,
    pub duration: prometheus_client::metrics::histogram::Histogram,
}

impl SyncStats {
    pub fn new() -> SyncStats {
        SyncStats {
            rounds: Default::default(),
            duration: prometheus_client::metrics::histogram::Histogram::new(
                crate::metrics::latency_buckets(),
            ),
        }
    }
}

impl Default for SyncStats {
    fn default() -> Self {
        SyncStats::new()
    }
}

impl SyncCoalescer {
    pub fn start(chunks: Arc<ChunkStore>, kv: Arc<dyn KvStore>) -> SyncCoalescer {
        let (tx, rx) = mpsc::sync_channel::<Message>(QUEUE_MAX);
        let stats = SyncStats::new();
        let counted = stats.clone();
        let thread = std::thread::Builder::new()
            .name("madfs-sync".into())
            .spawn(move || {
                let mut stop = false;
                while !stop {
                    let Ok(first) = rx.recv() else { break };
                    let mut waiters = Vec::new();
                    for m in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok()))
                    {
                        match m {
                            Message::Sync(w) => waiters.push(w),
                            Message::Stop => stop = true,
                        }
                    }
                    if waiters.is_empty() {
                        continue;
                    }
                    let started = Instant::now();
                    let result = chunks
                        .sync_dirty()
                        .map_err(|e| format!("syncing chunk files: {e}"))
                        .and_then(|()| {
                            kv.sync_wal().map_err(|e| {
                                poison_after_log_sync(&chunks, &e);
                                format!("syncing metadata log: {e}")
                            })
                        });
                    counted.rounds.inc();
                    counted.duration.observe(started.elapsed().as_secs_f64());
                    for w in waiters {
                        let _ = w.send(result.clone());
                    }
                }
                // The store is dropped here, on this thread, before the
                // server returns: never during process exit.
            })
            .expect("spawning the sync thread");
        SyncCoalescer {
            tx,
            thread: Arc::new(Mutex::new(Some(thread))),
            stats,
        }
    }

    /// Rounds run so far and their durations.
    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    /// Wait until everything written before this call is durable.
    pub async fn sync(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        let sender = self.tx.clone();
        // The queue is bounded; enqueue off the async threads in case it is full.
        tokio::task::spawn_blocking(move || sender.send(Message::Sync(tx)))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| "sync thread stopped".to_string())?;
        rx.await.map_err(|_| "sync thread stopped".to_string())?
    }

    /// Serve the syncs already queued, then end the thread and wait for it.
    pub fn stop(&self) {
        let _ = self.tx.send(Message::Stop);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// The server's metadata store, refusing writes and syncs (EIO) once the
/// chunk store is poisoned, and poisoning it when a synced write or a sync
/// of RocksDB's log fails. RocksDB already refuses writes after a failed
/// log write or sync (its background error, until reopened), so this
/// mainly makes the server's state one: `madfs status` reports it, and
/// chunk data and metadata stop together.
pub struct PoisonGuard {
    inner: Arc<dyn KvStore>,
    chunks: Arc<ChunkStore>,
}

impl PoisonGuard {
    pub fn new(inner: Arc<dyn KvStore>, chunks: Arc<ChunkStore>) -> PoisonGuard {
        PoisonGuard { inner, chunks }
    }

    fn check(&self) -> madfs_kv::Result<()> {
        match self.chunks.poisoned() {
            None => Ok(()),
            Some(r) => Err(KvError::Io(format!(
                "refused: the server's chunk store is {r}"
            ))),
        }
    }
}

/// Poison `chunks` after the metadata log's sync failed with `e`, unless
/// the sync was refused before it reached the store (a server's store of
/// a set that moved away): then nothing was lost.
fn poison_after_log_sync(chunks: &ChunkStore, e: &KvError) {
    if !e.is_refused() {
        chunks.poison(&format!("syncing the metadata log failed: {e}"));
    }
}

impl KvStore for PoisonGuard {
    fn get(&self, key: &[u8]) -> madfs_kv::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> madfs_kv::Result<()> {
        self.check()?;
        let r = self.inner.write(batch, sync);
        if let Err(e) = &r {
            // A full disk is not a lost write: RocksDB recovers from it;
            // nor is a write refused before it reached the store. Any
            // other failure, synced or not, is the disk's: RocksDB takes
            // no write after it until reopened, so the store is unusable
            // and, with replicas, its set moves to a copy (step_down.rs)
            // while the request that met it is sent there again (its
            // error becomes `Unavailable`, failover.rs). Only synced
            // failures poisoned it before: a file system shut down under
            // a server (`xfs_io -x -c shutdown`) failed creates with EIO
            // for as long as no synced write came.
            if !e.is_no_space() && !e.is_refused() {
                let what = if sync { "a synced write" } else { "a write" };
                self.chunks
                    .poison(&format!("{what} to the metadata store failed: {e}"));
            }
        }
        r
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
        self.check()?;
        self.inner
            .sync_wal()
            .inspect_err(|e| poison_after_log_sync(&self.chunks, e))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_kv::FaultyKv;
    use madfs_kv::MemStore;
    use madfs_types::{ChunkIndex, InodeId};

    fn put(kv: &dyn KvStore, sync: bool) -> madfs_kv::Result<()> {
        let mut b = WriteBatch::new();
        b.put(b"k", b"v");
        kv.write(b, sync)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_chunk_fsync_fails_every_later_sync_and_metadata_write() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let kv: Arc<dyn KvStore> =
            Arc::new(PoisonGuard::new(Arc::new(MemStore::new()), chunks.clone()));
        let s = SyncCoalescer::start(chunks.clone(), kv.clone());
        chunks
            .write(InodeId(1), ChunkIndex(1), 0, b"x", 1 << 20)
            .unwrap();
        s.sync().await.unwrap();
        chunks.inject_fsync_failure(0, libc::EIO);
        chunks
            .write(InodeId(1), ChunkIndex(1), 0, b"y", 1 << 20)
            .unwrap();
        for i in 0..3 {
            let e = s.sync().await.expect_err("a sync after the failure");
            assert!(e.contains("poisoned since"), "sync {i}: {e}");
        }
        let e = put(kv.as_ref(), false).expect_err("a metadata write");
        assert!(e.to_string().contains("poisoned since"), "{e}");
        assert!(kv.get(b"k").unwrap().is_none());
        s.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_metadata_log_sync_poisons_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let kv: Arc<dyn KvStore> = Arc::new(PoisonGuard::new(
            Arc::new(FaultyKv::failing_fsync()),
            chunks.clone(),
        ));
        // A full disk is no lost write: it does not poison.
        let full = PoisonGuard::new(Arc::new(FaultyKv::full()), chunks.clone());
        put(&full, true).expect_err("a write to a full disk");
        assert!(chunks.poisoned().is_none());
        put(kv.as_ref(), false).unwrap();
        let s = SyncCoalescer::start(chunks.clone(), kv.clone());
        let e = s.sync().await.expect_err("the log sync fails");
        assert!(e.contains("metadata log"), "{e}");
        let why = chunks.poisoned().expect("poisoned");
        assert!(why.contains("syncing the metadata log failed"), "{why}");
        let e = s.sync().await.expect_err("and so does the next");
        assert!(e.contains("poisoned since"), "{e}");
        put(kv.as_ref(), false).expect_err("metadata writes are refused");
        chunks
            .write(InodeId(1), ChunkIndex(1), 0, b"x", 1 << 20)
            .expect_err("chunk writes are refused");
        s.stop();
    }

    #[test]
    fn a_failed_synced_metadata_write_poisons_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let kv = PoisonGuard::new(Arc::new(FaultyKv::failing_fsync()), chunks.clone());
        put(&kv, false).unwrap();
        put(&kv, true).expect_err("the synced write");
        let why = chunks.poisoned().expect("poisoned");
        assert!(
            why.contains("synced write to the metadata store failed"),
            "{why}"
        );
        put(&kv, false).expect_err("later writes are refused");
    }

    /// A dead disk fails an unsynced write as well: the store is unusable
    /// from then on, so it is poisoned at once (and its set moves).
    #[test]
    fn a_failed_unsynced_metadata_write_poisons_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let disk = Arc::new(FaultyKv::default());
        let kv = PoisonGuard::new(disk.clone(), chunks.clone());
        put(&kv, false).unwrap();
        disk.set_dead(true);
        put(&kv, false).expect_err("the write on the dead disk");
        let why = chunks.poisoned().expect("poisoned");
        assert!(
            why.contains("a write to the metadata store failed"),
            "{why}"
        );
        disk.set_dead(false);
        put(&kv, false).expect_err("later writes are refused");
        // A full disk is no lost write: not poisoned.
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let kv = PoisonGuard::new(Arc::new(FaultyKv::full()), chunks.clone());
        put(&kv, false).expect_err("full");
        assert!(chunks.poisoned().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_syncs_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = Arc::new(ChunkStore::open(dir.path().to_path_buf()).unwrap());
        let kv: Arc<dyn KvStore> = Arc::new(MemStore::new());
        let mut b = WriteBatch::new();
        b.put(b"k", b"v");
        kv.write(b, false).unwrap();
        chunks
            .write(InodeId(1), ChunkIndex(1), 0, b"x", 1 << 20)
            .unwrap();
        let s = SyncCoalescer::start(chunks, kv);
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move { s.sync().await }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        s.stop();
        assert!(
            s.sync().await.is_err(),
            "a stopped coalescer must refuse syncs"
        );
    }
}
