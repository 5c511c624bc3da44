//! The shippers (replication.rs): one task per replica sends the stream's
//! records in order, many per ReplicaApply, one call in flight, and takes
//! the replica out of the set (once the group agrees) when it refuses them
//! or stays unreachable.

use super::*;

/// Attempts at shipping one batch before a replica leaves the set.
const SHIP_ATTEMPTS: u32 = 3;
const SHIP_RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Replicator {
    /// Ship the stream to every replica, each in its own task, for as long
    /// as the process runs.
    pub(crate) fn start_shippers(self: &Arc<Self>, server: Arc<crate::Server>) {
        let n = self.lock().replicas.len();
        for i in 0..n {
            self.start_shipper(i, server.clone());
        }
    }

    pub(super) fn start_shipper(self: &Arc<Self>, i: usize, server: Arc<crate::Server>) {
        let me = self.clone();
        tokio::spawn(async move { me.ship(i, me.pool(&server)).await });
    }

    /// The pool records go through: one that reaches server processes,
    /// whatever sets moved (set by the process, `set_pool`), else the
    /// server's peers.
    pub(super) fn pool<'a>(&'a self, server: &'a crate::Server) -> &'a Pool {
        self.direct.get().map_or(&server.peers, |p| p.as_ref())
    }

    /// Reach replicas through `pool`, whose routes never move.
    pub(crate) fn set_pool(&self, pool: Arc<Pool>) {
        let _ = self.direct.set(pool);
    }

    async fn ship(&self, i: usize, peers: &Pool) {
        let (server, generation) = {
            let s = self.lock();
            (s.replicas[i].server, s.replicas[i].generation)
        };
        let mut failures = 0u32;
        loop {
            let changed = self.changed.notified();
            if self.lock().replicas[i].generation != generation || self.retired() {
                return;
            }
            let Some((first_seq, batch)) = self.next_batch(i) else {
                if self.lock().replicas[i].out.is_some() {
                    return;
                }
                changed.await;
                continue;
            };
            let (heads, payloads) = encode_all(batch.iter().map(|r| r.as_ref()));
            let shipped_bytes = payloads.len();
            let req = Request {
                creds: Credentials::root(),
                op: Op::ReplicaApply {
                    set: self.set,
                    stream: self.stream_id,
                    first_seq,
                    heads,
                },
                once: None,
            };
            let sent = std::time::Instant::now();
            match peers.call_shared_once(server, &req, payloads).await {
                Ok(resp) => match resp.reply {
                    Reply::ReplicaAck { applied } => {
                        let st = stats();
                        st.shipment.observe(sent.elapsed().as_secs_f64());
                        st.records.inc_by(batch.len() as u64);
                        st.bytes.inc_by(shipped_bytes as u64);
                        failures = 0;
                        self.acknowledge(i, generation, applied);
                    }
                    other => {
                        let why = format!("answered ReplicaApply with {other:?}");
                        if self.may_leave(i, &why).await {
                            self.leave_if(i, Some(generation), why, false);
                            return;
                        }
                        tokio::time::sleep(SHIP_RETRY_PAUSE * SHIP_ATTEMPTS).await;
                    }
                },
                // A refusal is final (a stale or foreign replica); a
                // transport error may be a moment's trouble: retry a few
                // times, then leave, once the membership group agrees.
                Err(madfs_rpc::RpcError::Remote(w)) => {
                    let why = format!("refused the records: {}", w.message);
                    if self.may_leave(i, &why).await {
                        self.leave_if(i, Some(generation), why, false);
                        return;
                    }
                    tokio::time::sleep(SHIP_RETRY_PAUSE * SHIP_ATTEMPTS).await;
                }
                Err(e) => {
                    failures += 1;
                    if failures >= SHIP_ATTEMPTS {
                        let why = format!("unreachable: {e}");
                        if self.may_leave(i, &why).await {
                            self.leave_if(i, Some(generation), why, true);
                            return;
                        }
                    }
                    tokio::time::sleep(SHIP_RETRY_PAUSE * failures.min(SHIP_ATTEMPTS)).await;
                }
            }
        }
    }
}
