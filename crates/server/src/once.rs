//! Requests that run once, whatever retries a failover makes of them.
//!
//! A create, mkdir, unlink, rmdir, rename, link or link-count change
//! (`Op::runs_once`) comes with an `OpId`, the same each time its sender
//! sends it. When its primary dies after the change reached the set's
//! copy but before the reply reached the sender, the sender sends it again
//! to the new primary. Run again, it could answer EEXIST or ENOENT for
//! what was done, or, with another client's operation between the two
//! runs, leave a result no order of the two explains (the replicated
//! simulation, seed 2391: a mkdir ran, a concurrent rmdir removed its
//! directory, the retried mkdir made it again, and both answered ok).
//!
//! So the handler puts the reply in the batch of its change (`record`,
//! key `DONE time origin seq`), which reaches the copies with the change,
//! atomically; `Server::dispatch` answers a request whose reply is stored
//! with that reply, without running it. A reply not yet known when the
//! change is written carries what is known: the touch tokens (a client's
//! own view of its directory's times) come back empty, and an unlink's
//! "held" (the owner keeps an inode the client has open) false.
//!
//! Records are swept `KEPT_FOR` after their sender made the id (its
//! clock; a retry comes within a failover's wait, 30 s by default).

use crate::keys;
use madfs_kv::{KvStore, WriteBatch};
use madfs_proto::{Opcode, Reply};
use madfs_types::OpId;
use std::time::Duration;

tokio::task_local! {
    /// The id and opcode of the request this task runs, if it must run
    /// once.
    static RUNNING: (OpId, Opcode);
}

/// How long a reply is kept for a retry.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(600);
/// How often a server sweeps older replies.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Replies deleted per batch of a sweep.
const SWEEP_BATCH_MAX: usize = 4096;

/// Value format of a `DONE` record.
const RECORD_VERSION: u8 = 1;

/// Run `f` as request `id` of opcode `op` (its handler's `record`s
/// store the reply).
pub(crate) async fn run<F: std::future::Future>(id: Option<OpId>, op: Opcode, f: F) -> F::Output {
    match id {
        Some(id) => RUNNING.scope((id, op), f).await,
        None => f.await,
    }
}

/// The id of the request this task runs, if it must run once and is an
/// `op`.
pub(crate) fn running(op: Opcode) -> Option<OpId> {
    RUNNING
        .try_with(|r| *r)
        .ok()
        .filter(|(_, o)| *o == op)
        .map(|(id, _)| id)
}

/// Put `reply` into `b` as the result of the request this task runs, if
/// it must run once: the batch that makes its change. Only a reply of the
/// request's own kind counts: a handler's helpers that other requests use
/// too (a link count adjusted while a rename runs) record nothing for it.
pub(crate) fn record(b: &mut WriteBatch, reply: &Reply) {
    let Ok((id, op)) = RUNNING.try_with(|r| *r) else {
        return;
    };
    let fits = match op {
        Opcode::Create | Opcode::Mknod => matches!(reply, Reply::Created { .. }),
        Opcode::Remove => matches!(reply, Reply::Removed { .. }),
        Opcode::Rename => matches!(reply, Reply::Renamed { .. } | Reply::Removed { .. }),
        Opcode::Link => matches!(reply, Reply::Linked { .. }),
        Opcode::AdjustLinks => matches!(reply, Reply::Links { .. }),
        _ => false,
    };
    if fits {
        let mut v = vec![RECORD_VERSION];
        v.extend_from_slice(&reply.encode());
        b.put(&keys::done(id), &v);
    }
}

/// The stored reply of request `id`, if it ran here (or on the primary
/// whose copy this store was). A record that does not decode is taken as
/// absent: the request then runs, as it would have without one.
pub(crate) fn answered(kv: &dyn KvStore, id: OpId) -> madfs_kv::Result<Option<Reply>> {
    let Some(v) = kv.get(&keys::done(id))? else {
        return Ok(None);
    };
    let reply = match v.split_first() {
        Some((&RECORD_VERSION, body)) => Reply::decode(body).ok(),
        _ => None,
    };
    if reply.is_none() {
        tracing::warn!("a stored reply of request {id:?} does not decode; running it");
    }
    Ok(reply)
}

/// Delete the replies of requests made more than `KEPT_FOR` before `now`
/// (seconds since the epoch); how many.
pub(crate) fn sweep(kv: &dyn KvStore, now: u64) -> madfs_kv::Result<usize> {
    let cutoff = u32::try_from(now.saturating_sub(KEPT_FOR.as_secs())).unwrap_or(u32::MAX);
    let end = keys::done_before(cutoff);
    let mut swept = 0;
    loop {
        let old: Vec<Vec<u8>> = kv
            .scan(keys::DONE, keys::DONE, SWEEP_BATCH_MAX)?
            .into_iter()
            .map(|(k, _)| k)
            .take_while(|k| k.as_slice() < end.as_slice())
            .collect();
        if old.is_empty() {
            return Ok(swept);
        }
        let mut b = WriteBatch::new();
        for k in &old {
            b.delete(k);
        }
        kv.write(b, false)?;
        swept += old.len();
        if old.len() < SWEEP_BATCH_MAX {
            return Ok(swept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::MemStore;
    use madfs_types::InodeId;

    fn id(time: u32, seq: u32) -> OpId {
        OpId {
            time,
            origin: 77,
            seq,
        }
    }

    #[tokio::test]
    async fn a_reply_is_recorded_only_for_a_request_that_runs_once() {
        let kv = MemStore::new();
        let reply = Reply::Links { nlink: 3 };
        let mut b = WriteBatch::new();
        record(&mut b, &reply);
        kv.write(b, false).unwrap();
        assert_eq!(answered(&kv, id(100, 1)).unwrap(), None, "no id: nothing");
        run(Some(id(100, 1)), Opcode::AdjustLinks, async {
            let mut b = WriteBatch::new();
            b.put(&keys::inode(InodeId(5)), b"x");
            record(&mut b, &reply);
            kv.write(b, false).unwrap();
        })
        .await;
        assert_eq!(answered(&kv, id(100, 1)).unwrap(), Some(reply.clone()));
        assert_eq!(answered(&kv, id(100, 2)).unwrap(), None);
        // A helper's reply of another kind, inside a rename: not its result.
        run(Some(id(100, 2)), Opcode::Rename, async {
            let mut b = WriteBatch::new();
            record(&mut b, &reply);
            kv.write(b, false).unwrap();
        })
        .await;
        assert_eq!(answered(&kv, id(100, 2)).unwrap(), None);
    }

    #[tokio::test]
    async fn old_replies_are_swept_and_new_ones_kept() {
        let kv = MemStore::new();
        let now = 10_000u64;
        for (t, seq) in [(100u32, 1u32), (9_000, 2), (9_500, 3), (9_999, 4)] {
            run(Some(id(t, seq)), Opcode::AdjustLinks, async {
                let mut b = WriteBatch::new();
                record(&mut b, &Reply::Links { nlink: 1 });
                kv.write(b, false).unwrap();
            })
            .await;
        }
        let mut b = WriteBatch::new();
        b.put(&keys::inode(InodeId(5)), b"x");
        kv.write(b, false).unwrap();
        // Kept 600 s: 100 and 9,000 (< 9,400) go, 9,500 and 9,999 stay.
        assert_eq!(sweep(&kv, now).unwrap(), 2);
        assert_eq!(answered(&kv, id(100, 1)).unwrap(), None);
        assert_eq!(answered(&kv, id(9_000, 2)).unwrap(), None);
        assert!(answered(&kv, id(9_500, 3)).unwrap().is_some());
        assert!(answered(&kv, id(9_999, 4)).unwrap().is_some());
        assert_eq!(
            kv.get(&keys::inode(InodeId(5))).unwrap(),
            Some(b"x".to_vec())
        );
        assert_eq!(sweep(&kv, now).unwrap(), 0);
    }
}
