//! The sending side of directory touches (touch.rs): what an operation on
//! this server does to a directory another server owns, queued, written
//! down with the operation, sent, and sent again after a crash.
//!
//! An operation joins the directory's next touch (a `Group`) before its
//! batch is written and puts an intent into that batch: `TOUT dir seq
//! member` -> the change (time, link delta). The intent is atomic with the
//! entry: a crash (or kill -9, or a failover to the set's copy, which has
//! the batch) after the write leaves it in the store, and the server that
//! next serves the store sends it again at its start (`recovered`,
//! `Server::resend_touches`). A group is sent only once every operation
//! that joined it has written its batch or given up (`writing` at 0), so a
//! touch never carries a change that is not in the store; an operation
//! that gave up takes its link delta back out.
//!
//! Exactly once: a group's intents carry its seq, and a touch sent again
//! after a restart goes with that same seq, which the owner applies only
//! if above the last it applied from this server (touch.rs, `DTCH`). The
//! groups of one directory go one at a time, in seq order, and the groups
//! found at a start go before any new one. Once a touch is applied its
//! intents are deleted in later operations' batches (no write of their
//! own; `APPLIED_INTENTS_PER_BATCH`), or in a batch of their own should
//! `APPLIED_INTENTS_MAX` pile up. No timer writes them: a write in the
//! background after a workload ends would reach the store after copies
//! that stopped meanwhile. Intents of applied touches left in a quiet
//! store, or behind a crash, are sent again at the next start and ignored
//! by the owner.

use crate::counter::Counter;
use crate::keys;
use crate::service::Server;
use madfs_kv::{KvStore, WriteBatch};
use madfs_proto::message::TouchToken;
use madfs_types::{InodeId, Timestamp};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

/// Intents of applied touches deleted in one operation's batch at most.
const APPLIED_INTENTS_PER_BATCH: usize = 64;
/// Intents of applied touches waiting for deletion before a sender deletes
/// them in a batch of its own.
const APPLIED_INTENTS_MAX: usize = 4096;
/// Intents read at a start, at most (each names one operation's change;
/// more than this many unsent is a store that was cut off for long: the
/// rest are sent at the next start).
const RECOVERED_INTENTS_MAX: usize = 1 << 20;

/// One touch of a directory in the making: the changes of the operations
/// that joined it.
pub(crate) struct Group {
    /// Taken when the group formed: above the seq of every touch of the
    /// directory sent before it.
    seq: u64,
    state: Mutex<GroupState>,
    /// An operation that joined wrote its batch or gave up.
    written: Notify,
}

#[derive(Default)]
struct GroupState {
    time: Timestamp,
    nlink_delta: i64,
    /// Operations that joined and have neither written their batch nor
    /// given up.
    writing: usize,
    /// Member numbers handed out (each operation's intent key).
    next_member: u32,
    /// Members whose batch (with their intent) is written.
    members: Vec<u32>,
    /// Operations waiting until the owner applied the touch.
    waiters: Vec<oneshot::Sender<()>>,
}

impl Group {
    fn new(seq: u64) -> Group {
        Group {
            seq,
            state: Mutex::new(GroupState::default()),
            written: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A directory's queue on this server.
struct DirQueue {
    /// A task is sending this directory's touches (it takes `next` when
    /// its current one is applied).
    sending: bool,
    /// The group operations join now.
    next: Option<Arc<Group>>,
}

/// An operation's place in a directory's next touch, from before its batch
/// is written until after (`commit`); dropped uncommitted, its change is
/// taken back out (the operation failed, nothing of it is in the store).
#[must_use = "commit the ticket once the batch with its intent is written"]
pub(crate) struct TouchTicket {
    dir: InodeId,
    queues: Arc<Queues>,
    group: Arc<Group>,
    member: u32,
    nlink_delta: i64,
    committed: bool,
}

impl Drop for TouchTicket {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Locks in the order `join` takes them: queues, then the group.
        let mut queues = lock_queues(&self.queues);
        let mut st = self.group.state();
        st.writing -= 1;
        st.nlink_delta -= self.nlink_delta;
        let empty = st.writing == 0 && st.members.is_empty() && st.waiters.is_empty();
        drop(st);
        // A group left with nothing to carry and no task to send it: drop
        // the directory's queue (a task that took it skips it).
        if empty {
            if let Some(q) = queues.get(&self.dir) {
                let ours = q.next.as_ref().is_some_and(|g| Arc::ptr_eq(g, &self.group));
                if ours && !q.sending {
                    queues.remove(&self.dir);
                }
            }
        }
        drop(queues);
        self.group.written.notify_one();
    }
}

/// Every directory's queue on this server.
type Queues = Mutex<HashMap<InodeId, DirQueue>>;

fn lock_queues(q: &Queues) -> MutexGuard<'_, HashMap<InodeId, DirQueue>> {
    q.lock().unwrap_or_else(|e| e.into_inner())
}

/// The sender's side of `Touches` (touch.rs).
pub(crate) struct SendQueue {
    queues: Arc<Queues>,
    seq: Counter,
    /// Intent keys of applied touches, not yet deleted.
    applied: Mutex<Vec<Vec<u8>>>,
    /// Groups found in the store at the start, per directory in seq order,
    /// until `Server::resend_touches` sends them.
    recovered: Mutex<Vec<(InodeId, Vec<Arc<Group>>)>>,
    /// Test knob (touch.rs, `TOUCH_DELAY_ENV`).
    pub(crate) delay: Option<Duration>,
}

/// An intent's value: the change's time (secs i64, nanos u32) and link
/// delta (i64), little-endian.
fn encode_intent(time: Timestamp, nlink_delta: i64) -> [u8; 20] {
    let mut v = [0u8; 20];
    v[..8].copy_from_slice(&time.secs.to_le_bytes());
    v[8..12].copy_from_slice(&time.nanos.to_le_bytes());
    v[12..].copy_from_slice(&nlink_delta.to_le_bytes());
    v
}

fn decode_intent(v: &[u8]) -> Option<(Timestamp, i64)> {
    let v: &[u8; 20] = v.try_into().ok()?;
    let secs = i64::from_le_bytes(v[..8].try_into().ok()?);
    let nanos = u32::from_le_bytes(v[8..12].try_into().ok()?);
    let delta = i64::from_le_bytes(v[12..].try_into().ok()?);
    Some((Timestamp { secs, nanos }, delta))
}

impl SendQueue {
    /// The queue of a store: its touch counter, and the intents a crash or
    /// a failover left unsent, queued ahead of anything new.
    pub(crate) fn load(
        kv: &dyn KvStore,
        delay: Option<Duration>,
    ) -> Result<SendQueue, madfs_kv::KvError> {
        let mut found: BTreeMap<(InodeId, u64), Group> = BTreeMap::new();
        let mut start = keys::TOUCH_INTENT.to_vec();
        let mut read = 0usize;
        loop {
            let page = kv.scan(keys::TOUCH_INTENT, &start, 10_000)?;
            for (k, v) in &page {
                let (Some((dir, seq, member)), Some((time, delta))) =
                    (keys::touch_intent_parts(k), decode_intent(v))
                else {
                    tracing::warn!("skipping a malformed directory touch intent {k:?}");
                    continue;
                };
                let g = found.entry((dir, seq)).or_insert_with(|| Group::new(seq));
                let st = g.state.get_mut().unwrap_or_else(|e| e.into_inner());
                st.time = st.time.max(time);
                st.nlink_delta += delta;
                st.members.push(member);
            }
            read += page.len();
            match page.last() {
                Some((k, _)) if page.len() == 10_000 && read < RECOVERED_INTENTS_MAX => {
                    start = k.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        let mut queues = HashMap::new();
        let mut recovered: Vec<(InodeId, Vec<Arc<Group>>)> = Vec::new();
        for ((dir, _), g) in found {
            match recovered.last_mut() {
                Some((d, list)) if *d == dir => list.push(Arc::new(g)),
                _ => recovered.push((dir, vec![Arc::new(g)])),
            }
            // Sent by `resend_touches`: new groups wait behind them.
            queues.insert(
                dir,
                DirQueue {
                    sending: true,
                    next: None,
                },
            );
        }
        if !recovered.is_empty() {
            tracing::info!(
                "{} directory touches of {} directories left unsent by the last run: sending them",
                recovered.iter().map(|(_, l)| l.len()).sum::<usize>(),
                recovered.len()
            );
        }
        Ok(SendQueue {
            queues: Arc::new(Mutex::new(queues)),
            seq: Counter::load(kv, keys::META_NEXT_TOUCH, 1)?,
            applied: Mutex::new(Vec::new()),
            recovered: Mutex::new(recovered),
            delay,
        })
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<InodeId, DirQueue>> {
        lock_queues(&self.queues)
    }

    fn applied(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join `dir`'s next touch with a change, and put its intent into `b`
    /// (the operation's batch). An error when no touch id could be had
    /// (the store refused the counter's mark): the operation fails with
    /// it, before its batch.
    pub(crate) fn join(
        &self,
        kv: &dyn KvStore,
        b: &mut WriteBatch,
        dir: InodeId,
        time: Timestamp,
        nlink_delta: i64,
    ) -> Result<TouchTicket, madfs_kv::KvError> {
        let mut queues = self.queues();
        // Seqs are taken under the lock: a group of a directory formed
        // after another always has a higher seq, so "applied up to seq" on
        // the owner means every change that seq names.
        let q = queues.entry(dir).or_insert(DirQueue {
            sending: false,
            next: None,
        });
        let group = match &q.next {
            Some(g) => g.clone(),
            None => match self.seq.next(kv) {
                Ok(seq) => q.next.insert(Arc::new(Group::new(seq))).clone(),
                Err(e) => {
                    if !q.sending {
                        queues.remove(&dir);
                    }
                    return Err(e);
                }
            },
        };
        // Joined under the queues' lock: an operation that gives up
        // meanwhile must not find the group empty and drop the queue.
        let mut st = group.state();
        st.time = st.time.max(time);
        st.nlink_delta += nlink_delta;
        st.writing += 1;
        let member = st.next_member;
        st.next_member += 1;
        drop(st);
        drop(queues);
        b.put(
            &keys::touch_intent(dir, group.seq, member),
            &encode_intent(time, nlink_delta),
        );
        Ok(TouchTicket {
            dir,
            queues: self.queues.clone(),
            group,
            member,
            nlink_delta,
            committed: false,
        })
    }

    /// Move up to `APPLIED_INTENTS_PER_BATCH` deletions of applied
    /// touches' intents into `b`. Lost if `b` is never written: the owner
    /// ignores those touches when they are sent again at the next start.
    pub(crate) fn drain_applied(&self, b: &mut WriteBatch) {
        let mut applied = self.applied();
        let from = applied.len().saturating_sub(APPLIED_INTENTS_PER_BATCH);
        for k in applied.drain(from..) {
            b.delete(&k);
        }
    }
}

impl Server {
    /// The operation's batch with the intents of `tickets` is written: let
    /// their touches go (starting a directory's sending task where none
    /// runs), and return the tokens that name them. With `wait`, also a
    /// receiver per touch that fires once its owner applied it.
    pub(crate) fn commit_touches(
        self: &Arc<Self>,
        tickets: Vec<TouchTicket>,
        wait: bool,
    ) -> (Vec<TouchToken>, Vec<oneshot::Receiver<()>>) {
        let mut tokens = Vec::with_capacity(tickets.len());
        let mut applied = Vec::new();
        for mut t in tickets {
            let mut st = t.group.state();
            st.writing -= 1;
            st.members.push(t.member);
            if wait {
                let (tx, rx) = oneshot::channel();
                st.waiters.push(tx);
                applied.push(rx);
            }
            drop(st);
            t.committed = true;
            t.group.written.notify_one();
            tokens.push(TouchToken {
                dir: t.dir,
                sender: self.id,
                seq: t.group.seq,
            });
            // No sending task for the directory: start one. (None at all:
            // a task took this group, sent it once this commit let it, and
            // ended.)
            let start = match self.touches.send.queues().get_mut(&t.dir) {
                Some(q) if !q.sending => {
                    q.sending = true;
                    true
                }
                _ => false,
            };
            if start {
                let me = self.clone();
                let dir = t.dir;
                tokio::spawn(async move { me.send_touches(dir, Vec::new()).await });
            }
        }
        (tokens, applied)
    }

    /// At the start (dispatch.rs, `start_background`): send the touches a
    /// crash or failover left in this store, then whatever queued behind
    /// them.
    pub(crate) fn resend_touches(self: &Arc<Self>) {
        let recovered = std::mem::take(
            &mut *self
                .touches
                .send
                .recovered
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (dir, groups) in recovered {
            let me = self.clone();
            tokio::spawn(async move { me.send_touches(dir, groups).await });
        }
    }

    /// The sending task of one directory: `first` (groups found at the
    /// start), then the groups that form, one touch at a time, until no
    /// change waits.
    async fn send_touches(self: Arc<Self>, dir: InodeId, first: Vec<Arc<Group>>) {
        let send = &self.touches.send;
        let mut first = VecDeque::from(first);
        loop {
            let group = match first.pop_front() {
                Some(g) => g,
                None => {
                    let mut queues = send.queues();
                    match queues.get_mut(&dir).and_then(|q| q.next.take()) {
                        Some(g) => g,
                        None => {
                            queues.remove(&dir);
                            return;
                        }
                    }
                }
            };
            // Every operation that joined has written its batch or given
            // up (a notification that came before this wait is kept).
            loop {
                if group.state().writing == 0 {
                    break;
                }
                group.written.notified().await;
            }
            let (time, nlink_delta, members, waiters) = {
                let mut st = group.state();
                (
                    st.time,
                    st.nlink_delta,
                    std::mem::take(&mut st.members),
                    std::mem::take(&mut st.waiters),
                )
            };
            if !members.is_empty() {
                if self.touches.stopped.load(Ordering::Acquire) {
                    return; // sent at the next start
                }
                if !self.on_every_copy().await {
                    // Deposed: the copy that serves the set now has the
                    // intents that count and sends them.
                    return;
                }
                self.send_touch(dir, group.seq, time, nlink_delta).await;
                let waiting = {
                    let mut applied = send.applied();
                    applied.extend(
                        members
                            .iter()
                            .map(|&m| keys::touch_intent(dir, group.seq, m)),
                    );
                    applied.len()
                };
                if waiting >= APPLIED_INTENTS_MAX {
                    self.delete_applied_intents();
                }
            }
            for w in waiters {
                let _ = w.send(());
            }
        }
    }

    /// With replicas: wait until every copy of the set has what this server
    /// wrote so far (the batches of a touch's changes among it), so that
    /// an owner never applies a change a failover then takes away (the
    /// operation was not acknowledged, and the copy that takes over sends
    /// the same seq without it: ignored, as applied). False once this
    /// store is deposed.
    async fn on_every_copy(&self) -> bool {
        loop {
            if self.deposed() {
                return false;
            }
            if self.replicated_now().await {
                return true;
            }
        }
    }

    /// Delete the applied touches' intents waiting for an operation's
    /// batch, in a batch of their own.
    fn delete_applied_intents(&self) {
        if self.touches.stopped.load(Ordering::Acquire) {
            return; // sent again at the next start, and ignored
        }
        let keys = std::mem::take(&mut *self.touches.send.applied());
        if keys.is_empty() {
            return;
        }
        let mut b = WriteBatch::new();
        for k in &keys {
            b.delete(k);
        }
        if let Err(e) = self.kv.write(b, false) {
            // Sent again at the next start, and ignored by their owners.
            tracing::warn!(
                "deleting {} applied directory touch intents: {e}",
                keys.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::MemStore;

    #[test]
    fn intents_round_trip_and_malformed_ones_are_refused() {
        let t = Timestamp {
            secs: -5,
            nanos: 999_999_999,
        };
        assert_eq!(decode_intent(&encode_intent(t, -3)), Some((t, -3)));
        assert_eq!(decode_intent(&[0u8; 19]), None);
    }

    /// A start finds what the last run left unsent: one group per (dir,
    /// seq), its changes summed, groups of a directory in seq order, and
    /// the directory held for them (new changes queue behind).
    #[test]
    fn a_start_takes_up_unsent_intents_in_order() {
        let kv = MemStore::new();
        let (d1, d2) = (InodeId(0x10), InodeId(0x20));
        let t = |s| Timestamp { secs: s, nanos: 0 };
        let mut b = WriteBatch::new();
        b.put(&keys::touch_intent(d1, 7, 0), &encode_intent(t(5), 1));
        b.put(&keys::touch_intent(d1, 7, 1), &encode_intent(t(9), 1));
        b.put(&keys::touch_intent(d1, 3, 0), &encode_intent(t(4), -1));
        b.put(&keys::touch_intent(d2, 8, 2), &encode_intent(t(1), 0));
        kv.write(b, false).unwrap();
        let q = SendQueue::load(&kv, None).unwrap();
        let rec = q.recovered.lock().unwrap();
        // Per directory: (seq, time, link delta, members) of each group.
        type Seen = Vec<(InodeId, Vec<(u64, i64, i64, usize)>)>;
        let seen: Seen = rec
            .iter()
            .map(|(d, gs)| {
                let gs = gs
                    .iter()
                    .map(|g| {
                        let st = g.state();
                        (g.seq, st.time.secs, st.nlink_delta, st.members.len())
                    })
                    .collect();
                (*d, gs)
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (d1, vec![(3, 4, -1, 1), (7, 9, 2, 2)]),
                (d2, vec![(8, 1, 0, 1)])
            ]
        );
        let queues = q.queues();
        assert!(queues[&d1].sending && queues[&d2].sending);
    }

    /// A change joins the next touch with its intent in the batch; one
    /// whose operation gave up is taken back out, and the group waits for
    /// no one after it.
    #[test]
    fn a_ticket_dropped_uncommitted_takes_its_change_back() {
        let kv = MemStore::new();
        let q = SendQueue::load(&kv, None).unwrap();
        let dir = InodeId(0x30);
        let t = Timestamp { secs: 3, nanos: 0 };
        let mut b = WriteBatch::new();
        let a = q.join(&kv, &mut b, dir, t, 1).unwrap();
        let c = q.join(&kv, &mut b, dir, t, 1).unwrap();
        assert_eq!(a.group.seq, c.group.seq);
        assert_eq!((a.member, c.member), (0, 1));
        kv.write(b, false).unwrap();
        assert_eq!(kv.scan(keys::TOUCH_INTENT, b"", 10).unwrap().len(), 2);
        let group = a.group.clone();
        let seen = |g: &Group| {
            let st = g.state();
            (st.writing, st.nlink_delta)
        };
        drop(c);
        assert_eq!(seen(&group), (1, 1));
        assert!(q.queues().contains_key(&dir));
        drop(a);
        assert_eq!(seen(&group), (0, 0));
        // Nothing left to send and no task to send it: the queue goes.
        assert!(!q.queues().contains_key(&dir));
    }
}
