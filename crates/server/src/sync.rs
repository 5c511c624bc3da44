//! The fsync coalescer: one thread per server makes writes durable. An fsync
//! request only queues a waiter; the thread takes every waiter queued so far,
//! syncs every dirty chunk file and the RocksDB WAL once, and answers them
//! all. Concurrent fsyncs cost one sync, not one each (MadFS's fix for the
//! fsync long tail in IO500).

use crate::chunks::ChunkStore;
use madfs_kv::KvStore;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
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
}

impl SyncCoalescer {
    pub fn start(chunks: Arc<ChunkStore>, kv: Arc<dyn KvStore>) -> SyncCoalescer {
        let (tx, rx) = mpsc::sync_channel::<Message>(QUEUE_MAX);
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
                    let result = chunks
                        .sync_dirty()
                        .map_err(|e| format!("syncing chunk files: {e}"))
                        .and_then(|()| {
                            kv.sync_wal()
                                .map_err(|e| format!("syncing metadata log: {e}"))
                        });
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
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::{MemStore, WriteBatch};
    use madfs_types::{ChunkIndex, InodeId};

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
