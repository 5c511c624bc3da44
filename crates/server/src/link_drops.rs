//! Links dropped on another server, made to happen (`LDRP` records).
//!
//! An unlink, or a rename over a file, whose inode another server owns
//! removes the name here and then asks the owner to drop a link
//! (`AdjustLinks -1`). That second step used to be a bare call: if the
//! owner was down or cut off, or this server died between its write and
//! the call, the link count stayed one too high for good, and a file with
//! no name left was never freed (nor its chunks). Now the drop is a record
//! written in the same batch as the name's removal, holding the id the
//! call runs under (`OpId`, once.rs); the record goes once the owner has
//! answered. A call that fails is sent again by one task per server
//! (`resend`), with backoff, and every record left is sent again when the
//! store is served (at a start, or a copy's promotion): always with the
//! same id, marked resent, so an owner that already dropped the link
//! answers from its stored reply instead of dropping a second one.
//!
//! Owners keep a reply for `once::KEPT_FOR` after the id was made. A drop
//! older than `SEND_WITHIN` is not sent again: it may have run, and
//! running it twice would take a link from a name that still has it. It
//! is logged and forgotten (the leak this was built against, but only
//! after the owner was unreachable for nine minutes).

use crate::keys;
use crate::service::Server;
use madfs_kv::WriteBatch;
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, RunOnce, WireError};
use madfs_types::{InodeId, OpId, ServerId};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// First wait before sending failed drops again, doubled per failed pass...
const RETRY_FIRST: Duration = Duration::from_millis(200);
/// ...up to this.
const RETRY_MAX: Duration = Duration::from_secs(10);
/// How long after its id was made a drop may still be sent again: the
/// owner's stored reply must still be there to answer a repeat.
const SEND_WITHIN: Duration = Duration::from_secs(crate::once::KEPT_FOR.as_secs() - 60);
/// Records one pass of the resender reads at most.
const PASS_MAX: usize = 1024;
/// Value format of an `LDRP` record.
const RECORD_VERSION: u8 = 1;
/// Test faults (`call_peer_lossy`): every link drop is lost, or fails
/// (and is sent again, failing again).
pub const LOSE_LINK_DROPS_ENV: &str = "MADFS_FAULT_LOSE_LINK_DROPS";
pub const FAIL_LINK_DROPS_ENV: &str = "MADFS_FAULT_FAIL_LINK_DROPS";

/// One link to drop on the inode's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkDrop {
    /// The id the `AdjustLinks` call runs under, every time it is sent.
    pub id: OpId,
    pub ino: InodeId,
    /// Keep the inode for the client that has it open, at its last link.
    pub hold: bool,
}

impl LinkDrop {
    pub(crate) fn new(ino: InodeId, hold: bool) -> LinkDrop {
        LinkDrop {
            id: madfs_types::next_op_id(),
            ino,
            hold,
        }
    }

    /// Put the record into `b`, the batch that removes the name.
    pub(crate) fn put(&self, b: &mut WriteBatch) {
        let mut v = Vec::with_capacity(10);
        v.push(RECORD_VERSION);
        v.extend_from_slice(&self.ino.0.to_le_bytes());
        v.push(u8::from(self.hold));
        b.put(&keys::link_drop(self.id), &v);
    }

    fn decode(key: &[u8], value: &[u8]) -> Option<LinkDrop> {
        let id = keys::op_id_from_key(keys::LINK_DROP, key)?;
        match value {
            [RECORD_VERSION, ino @ .., hold] if ino.len() == 8 => Some(LinkDrop {
                id,
                ino: InodeId(u64::from_le_bytes(ino.try_into().ok()?)),
                hold: *hold != 0,
            }),
            _ => None,
        }
    }

    fn op(&self) -> Op {
        Op::AdjustLinks {
            ino: self.ino,
            delta: -1,
            hold: self.hold,
        }
    }
}

/// A server's drops in flight, and the wake-up of its resender.
pub(crate) struct LinkDrops {
    /// Ids being sent now: a resend of one must wait for that send's end
    /// (the owner does not serialize two runs of one id that overlap).
    sending: Mutex<HashSet<OpId>>,
    failed: Notify,
    /// For the metrics: sends that failed, drops given up after
    /// `SEND_WITHIN` (each a link count left one too high), and the
    /// records the resender's last pass left unanswered.
    pub(crate) failed_sends: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) waiting: AtomicU64,
    /// Test faults, read once at start: every drop lost
    /// (`LOSE_LINK_DROPS_ENV`), or failing (`FAIL_LINK_DROPS_ENV`).
    lose: bool,
    fail: bool,
}

impl Default for LinkDrops {
    fn default() -> LinkDrops {
        let (lose, fail) = (
            crate::test_fault(LOSE_LINK_DROPS_ENV),
            crate::test_fault(FAIL_LINK_DROPS_ENV),
        );
        if lose {
            tracing::warn!("{LOSE_LINK_DROPS_ENV}: every link drop is lost");
        }
        if fail {
            tracing::warn!("{FAIL_LINK_DROPS_ENV}: every link drop fails");
        }
        LinkDrops {
            sending: Default::default(),
            failed: Default::default(),
            failed_sends: Default::default(),
            abandoned: Default::default(),
            waiting: Default::default(),
            lose,
            fail,
        }
    }
}

impl LinkDrops {
    fn claim(&self, id: OpId) -> bool {
        self.sending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id)
    }

    fn release(&self, id: OpId) {
        self.sending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// How one send of a drop ended.
#[derive(Debug, PartialEq)]
pub(crate) enum Sent {
    /// The owner dropped the link (now or before): its answer.
    Done(Reply),
    /// The owner has no such inode (dropped by a crash's recovery, or
    /// never there): nothing to drop.
    Gone,
    /// Not known to have happened; the record stays and is sent again.
    Failed,
}

impl Server {
    /// Send `drop` to its inode's owner (`resent`: it may have been sent
    /// before). Its record goes when the owner answered; on failure the
    /// resender is woken.
    pub(crate) async fn send_link_drop(&self, drop: &LinkDrop, resent: bool) -> Sent {
        if !self.link_drops.claim(drop.id) {
            // A send of it is under way; that one reports.
            return Sent::Failed;
        }
        let once = RunOnce {
            id: drop.id,
            resent,
        };
        let sent = match self.call_peer_lossy(drop, once).await {
            Ok(reply) => Sent::Done(reply),
            Err(e) if e.code == ErrorCode::NotFound => Sent::Gone,
            Err(e) => {
                tracing::warn!(
                    "dropping a link of {} on server {}: {e}; sending it again later",
                    drop.ino,
                    drop.ino.owner()
                );
                Sent::Failed
            }
        };
        if sent == Sent::Failed {
            self.link_drops.failed_sends.fetch_add(1, Ordering::Relaxed);
            self.wake_link_drop_resender();
        } else {
            self.forget_link_drop(drop.id);
        }
        self.link_drops.release(drop.id);
        sent
    }

    /// Send `drop` to its inode's owner. Under the test fault
    /// `MADFS_FAULT_LOSE_LINK_DROPS`, lose it on the way and take it for
    /// done (NotFound: nothing to drop), leaking the link as a drop left
    /// unanswered for 9 minutes does (`madfs fsck` finds it); under
    /// `MADFS_FAULT_FAIL_LINK_DROPS`, fail it (its record stays).
    async fn call_peer_lossy(&self, drop: &LinkDrop, once: RunOnce) -> Result<Reply, WireError> {
        if self.link_drops.lose {
            return Err(crate::errors::err(ErrorCode::NotFound, "lost (test fault)"));
        }
        if self.link_drops.fail {
            return Err(crate::errors::err(ErrorCode::Io, "failed (test fault)"));
        }
        self.call_peer_once(drop.ino.owner(), drop.op(), once).await
    }

    /// A drop's record stays unanswered: have the resender look at the
    /// records (after its backoff).
    pub(crate) fn wake_link_drop_resender(&self) {
        self.link_drops.failed.notify_one();
    }

    /// Write a drop's record alone (for a drop with no batch of its own
    /// to ride in), then send it. False if the record could not be
    /// written (the drop is then not made: the leak it was before).
    pub(crate) async fn drop_link_durably(&self, drop: &LinkDrop) -> Sent {
        let mut b = WriteBatch::new();
        drop.put(&mut b);
        if let Err(e) = self.kv.write(b, false) {
            tracing::warn!("recording a link drop of {}: {e}", drop.ino);
            return Sent::Failed;
        }
        self.send_link_drop(drop, false).await
    }

    /// The owner answered: the record goes (unsynced: if a power cut
    /// brings it back, the repeat is answered from the owner's stored
    /// reply).
    fn forget_link_drop(&self, id: OpId) {
        let mut b = WriteBatch::new();
        b.delete(&keys::link_drop(id));
        if let Err(e) = self.kv.write(b, false) {
            tracing::warn!("deleting a link drop record: {e}");
        }
    }

    /// The resender: one pass over the records when the store is served,
    /// then a pass after each failed send, backing off while sends fail.
    /// Ends when the store is deposed (its copy's new primary has the
    /// records and sends them).
    pub(crate) async fn resend_link_drops(self: Arc<Self>) {
        let mut wait = RETRY_FIRST;
        loop {
            if self.deposed() {
                return;
            }
            let (failed, more) = self.resend_pass().await;
            if failed == 0 && !more {
                wait = RETRY_FIRST;
                // Woken by a failed send, or the store deposed.
                tokio::select! {
                    () = self.link_drops.failed.notified() => {}
                    _ = self.pause(crate::once::SWEEP_EVERY) => {}
                }
            } else if failed > 0 {
                if !self.pause(wait).await {
                    return;
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }

    /// Send every drop recorded (up to `PASS_MAX`) again. Returns how many
    /// failed, and whether there may be more records than were read.
    async fn resend_pass(&self) -> (usize, bool) {
        let page = match self.kv.scan(keys::LINK_DROP, keys::LINK_DROP, PASS_MAX) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("reading the link drop records: {e}");
                return (1, false);
            }
        };
        if page.is_empty() {
            self.link_drops.waiting.store(0, Ordering::Relaxed);
            return (0, false);
        }
        // Other servers act on these drops: the names' removals must be on
        // the set's copies first (as at the first send).
        if !self.replicated_now().await {
            self.link_drops
                .waiting
                .store(page.len() as u64, Ordering::Relaxed);
            return (page.len(), false);
        }
        let now = crate::rename::now_secs();
        let mut failed = 0;
        let mut unreachable: HashSet<ServerId> = HashSet::new();
        let full = page.len() == PASS_MAX;
        for (k, v) in page {
            let Some(drop) = LinkDrop::decode(&k, &v) else {
                tracing::warn!("an unreadable link drop record {k:?}; deleted");
                let mut b = WriteBatch::new();
                b.delete(&k);
                let _ = self.kv.write(b, false);
                continue;
            };
            if now > u64::from(drop.id.time) + SEND_WITHIN.as_secs() {
                tracing::warn!(
                    "a link drop of {} was not answered within {} s; not sent again (it may \
                     have run): the inode may keep a link count above its names",
                    drop.ino,
                    SEND_WITHIN.as_secs()
                );
                self.link_drops.abandoned.fetch_add(1, Ordering::Relaxed);
                self.forget_link_drop(drop.id);
                continue;
            }
            // One failed send per owner and pass: the rest would wait on
            // the same dead server.
            if unreachable.contains(&drop.ino.owner()) {
                failed += 1;
                continue;
            }
            if self.send_link_drop(&drop, true).await == Sent::Failed {
                unreachable.insert(drop.ino.owner());
                failed += 1;
            }
        }
        self.link_drops
            .waiting
            .store(failed as u64, Ordering::Relaxed);
        // A pass that read a full page and sent it all goes on at once.
        (failed, full && failed == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_put() {
        let drop = LinkDrop {
            id: OpId {
                time: 1_700_000_000,
                origin: 0xdead_beef,
                seq: 42,
            },
            ino: InodeId(0x0003_0000_0000_0011),
            hold: true,
        };
        let mut b = WriteBatch::new();
        drop.put(&mut b);
        let kv = madfs_kv::MemStore::new();
        madfs_kv::KvStore::write(&kv, b, false).unwrap();
        let page = madfs_kv::KvStore::scan(&kv, keys::LINK_DROP, keys::LINK_DROP, 10).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(LinkDrop::decode(&page[0].0, &page[0].1), Some(drop));
        // Another format, or a key of another prefix, is not a drop.
        assert_eq!(LinkDrop::decode(&page[0].0, &[2, 0, 0]), None);
        assert_eq!(
            LinkDrop::decode(&keys::done(drop.id), &page[0].1),
            None,
            "a DONE key is not a link drop"
        );
    }
}
