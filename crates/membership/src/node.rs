//! One voter of the membership group ([`Membership`]): starting (bootstrap
//! or recovery), answering other nodes' messages (refusing those meant for
//! another incarnation of this server), proposing changes and reading the
//! map through whichever node leads, and stopping; plus [`fetch_map`] for
//! servers and clients that are not voters. Joining as a replacement is in
//! join.rs.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madfs_kv::{KvStore, RocksStore};
use madfs_types::ServerId;
use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{Raft, ServerState, Snapshot, SnapshotPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::network::{call, PeerFactory};
use crate::state::{Change, ClusterMap, Command, ProposalId, Rejection};
use crate::store;
use crate::wire::{
    decode_message, encode_message, node_id, server_of, Envelope, NodeId, Reply, Request,
    TypeConfig,
};
use crate::{MembershipConfig, MembershipError, Timing, Transport};

/// Most voters a group may have: every write waits for a majority, and the
/// leader sends every voter a heartbeat each interval.
pub(crate) const VOTERS_MAX: usize = 9;

/// How long `shutdown` waits for openraft's tasks to let go of the store.
const STORE_RELEASE_WAIT: Duration = Duration::from_secs(5);

/// A running voter. Cheap to clone; every clone is the same node.
#[derive(Clone)]
pub struct Membership {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) me: ServerId,
    /// This node's Raft id: `me` and its incarnation.
    pub(crate) node: NodeId,
    pub(crate) timing: Timing,
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) net: Arc<dyn Transport>,
    /// The servers a joining node asks (`cfg.voters`).
    pub(crate) ask: Vec<ServerId>,
    /// The voter a joined node takes the place of (stored with its
    /// incarnation; `None` for the original voters).
    pub(crate) replaces: Option<ServerId>,
    /// One join served at a time on the leader: each computes its voter
    /// set from the membership the previous one left.
    pub(crate) join_lock: tokio::sync::Mutex<()>,
    map: watch::Receiver<ClusterMap>,
    /// Set once by `shutdown`; our own tasks (bootstrap, detector) watch it.
    pub(crate) stopped: watch::Sender<bool>,
    /// Proposal ids: a random start per process, then +1 per proposal.
    next_nonce: AtomicU64,
    /// The store, released last by `shutdown` so a restart can reopen it.
    /// The store, as openraft's tasks hold it (`store::Held`).
    kv: Mutex<Option<Arc<store::Held>>>,
    bootstrap_task: Mutex<Option<JoinHandle<()>>>,
}

/// What one attempt at a leader operation came to.
enum Attempt {
    /// Final: the map, or an error not worth retrying.
    Done(Result<ClusterMap, MembershipError>),
    /// Not the leader; try the one named, if any.
    Redirect(Option<ServerId>),
    /// Failed in a way another attempt may not (lost message, no quorum).
    Retry,
}

/// An operation only the leader performs.
#[derive(Clone)]
enum LeaderOp {
    Propose(Command),
    Read,
}

impl Membership {
    /// Start this voter with its store in `cfg.dir` (RocksDB, created if
    /// missing): bootstraps the group on its first start, recovers the
    /// log, vote and snapshot from the directory on a restart.
    pub async fn start(
        cfg: MembershipConfig,
        net: Arc<dyn Transport>,
    ) -> Result<Membership, MembershipError> {
        let kv = open_dir(&cfg.dir)?;
        Membership::start_with_store(cfg, kv, net).await
    }

    /// [`Membership::start`] over a store the caller opened (`cfg.dir` is
    /// not used): a `MemStore` in tests, a simulated disk in madfs-sim.
    ///
    /// A store a replacement made ([`Membership::join`]) comes back as that
    /// node, its incarnation kept.
    pub async fn start_with_store(
        cfg: MembershipConfig,
        kv: Arc<dyn KvStore>,
        net: Arc<dyn Transport>,
    ) -> Result<Membership, MembershipError> {
        let incarnation = store::read_incarnation(&*kv)?.unwrap_or(0);
        // A replacement may have joined as a voter the cluster file does
        // not list.
        check_config(&cfg, incarnation == 0)?;
        let replaces = store::read_replaces(&*kv)?.map(ServerId);
        Membership::launch(cfg, kv, net, incarnation, replaces).await
    }

    /// Start the Raft node of `cfg.me` in `incarnation` over `kv`. Only
    /// the original voters (incarnation 0) initialize the group; a later
    /// incarnation waits to be added by the leader.
    pub(crate) async fn launch(
        cfg: MembershipConfig,
        kv: Arc<dyn KvStore>,
        net: Arc<dyn Transport>,
        incarnation: u64,
        replaces: Option<ServerId>,
    ) -> Result<Membership, MembershipError> {
        let timing = cfg.timing.clone();
        let node = node_id(cfg.me, incarnation);
        let (publish, map) = watch::channel(ClusterMap::default());
        // What openraft's tasks hold: counted apart from the caller's
        // handles on `kv`, so `stop` knows when they let go.
        let held = Arc::new(store::Held(kv));
        let (log, machine) = store::open(held.clone(), publish)?;
        let millis = |d: Duration| d.as_millis().max(1) as u64;
        let raft_config = openraft::Config {
            cluster_name: "madfs-membership".into(),
            heartbeat_interval: millis(timing.heartbeat),
            election_timeout_min: millis(timing.election_timeout),
            election_timeout_max: millis(timing.election_timeout * 2),
            install_snapshot_timeout: millis(timing.rpc_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every_entries.max(1)),
            max_in_snapshot_log_to_keep: cfg.snapshot_every_entries / 4,
            // Purge in batches, not entry by entry.
            purge_batch_size: (cfg.snapshot_every_entries / 4).max(1),
            ..Default::default()
        }
        .validate()
        .map_err(|e| MembershipError::Config(e.to_string()))?;
        let peers = PeerFactory {
            net: net.clone(),
            retry_after: timing.heartbeat,
        };
        let raft = Raft::new(node, Arc::new(raft_config), peers, log, machine)
            .await
            .map_err(|e| MembershipError::Raft(e.to_string()))?;
        // Every original voter initializes with the same voter set: openraft
        // writes the same first entry on each, so it does not matter who was
        // first. After the first start the store holds a vote or log and
        // this is refused, which is what we want.
        if incarnation == 0 {
            let voters: BTreeSet<NodeId> = cfg.voters.iter().map(|v| node_id(*v, 0)).collect();
            match raft.initialize(voters).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(MembershipError::Raft(e.to_string())),
            }
        }
        let seed = RandomState::new().build_hasher().finish();
        let membership = Membership {
            inner: Arc::new(Inner {
                me: cfg.me,
                node,
                timing,
                raft,
                net,
                ask: cfg.voters.clone(),
                replaces,
                join_lock: tokio::sync::Mutex::new(()),
                map,
                stopped: watch::channel(false).0,
                next_nonce: AtomicU64::new(seed),
                kv: Mutex::new(Some(held)),
                bootstrap_task: Mutex::new(None),
            }),
        };
        let task = tokio::spawn(membership.clone().bootstrap(cfg.initial));
        *lock(&membership.inner.bootstrap_task) = Some(task);
        Ok(membership)
    }

    /// Propose `initial` until some map is committed (by us or another voter).
    async fn bootstrap(self, initial: ClusterMap) {
        let mut stopped = self.inner.stopped.subscribe();
        while !self.map().is_bootstrapped() && !*stopped.borrow() {
            match self
                .leader_op(LeaderOp::Propose(Command::Bootstrap(initial.clone())))
                .await
            {
                Ok(_) | Err(MembershipError::Rejected(_)) | Err(MembershipError::ShutDown) => {
                    return
                }
                Err(e) => tracing::debug!("membership bootstrap: {e}; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.inner.timing.heartbeat) => {}
                _ = stopped.changed() => return,
            }
        }
    }

    /// This node's server id.
    pub fn me(&self) -> ServerId {
        self.inner.me
    }

    /// The timing this node runs with.
    pub fn timing(&self) -> &Timing {
        &self.inner.timing
    }

    /// The latest map applied on this node (epoch 0: none yet). May lag the
    /// group; [`Membership::read_map`] does not.
    pub fn map(&self) -> ClusterMap {
        self.inner.map.borrow().clone()
    }

    /// Every map this node applies, as it applies it (a slow receiver sees
    /// the latest only).
    pub fn subscribe(&self) -> watch::Receiver<ClusterMap> {
        self.inner.map.clone()
    }

    /// The leader this node knows of (itself included); may be stale.
    pub fn leader(&self) -> Option<ServerId> {
        self.inner
            .raft
            .metrics()
            .borrow()
            .current_leader
            .map(server_of)
    }

    /// Whether this node believes it leads (a partitioned old leader still
    /// does until it hears of a newer term; its proposals cannot commit).
    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().state == ServerState::Leader
    }

    /// This node's current Raft term.
    pub(crate) fn term(&self) -> u64 {
        self.inner.raft.metrics().borrow().current_term
    }

    /// A watch that turns true when the node is shut down.
    pub(crate) fn stopped(&self) -> watch::Receiver<bool> {
        self.inner.stopped.subscribe()
    }

    /// Confirm with a quorum of voters that this node still leads, by a
    /// round of heartbeats sent now.
    pub(crate) async fn confirm_leadership(&self) -> bool {
        let check = self.inner.raft.get_read_log_id();
        matches!(
            tokio::time::timeout(self.inner.timing.rpc_timeout, check).await,
            Ok(Ok(_))
        )
    }

    /// Apply `change` if the map is still at `expected_epoch`, through the
    /// leader (forwarded if this node does not lead). `Ok` holds the map
    /// with the change applied: the map it made, or a later one if the
    /// proposal had to be resent after a lost reply. `Rejected` means it
    /// was not applied; `Timeout` that it may still be.
    pub async fn propose(
        &self,
        change: Change,
        expected_epoch: u64,
    ) -> Result<ClusterMap, MembershipError> {
        let id = ProposalId {
            server: self.inner.me.0,
            nonce: self.inner.next_nonce.fetch_add(1, Ordering::Relaxed),
        };
        let command = Command::Change {
            change,
            expected_epoch,
            id,
        };
        self.leader_op(LeaderOp::Propose(command)).await
    }

    /// The map as of now, linearizable: the leader confirms it still leads
    /// with a quorum and answers once it has applied everything committed.
    pub async fn read_map(&self) -> Result<ClusterMap, MembershipError> {
        self.leader_op(LeaderOp::Read).await
    }

    /// Run `op` on the leader, following redirects, until it is done or
    /// `propose_timeout` has passed.
    async fn leader_op(&self, op: LeaderOp) -> Result<ClusterMap, MembershipError> {
        let timing = &self.inner.timing;
        let deadline = Instant::now() + timing.propose_timeout;
        let mut hint = None;
        loop {
            if *self.inner.stopped.borrow() {
                return Err(MembershipError::ShutDown);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let target = hint.take().or_else(|| self.leader());
            let attempt = match target {
                None => Attempt::Retry,
                Some(me) if me == self.inner.me => self.serve(op.clone(), remaining).await,
                // At most half the budget per forward, so a leader that
                // vanished mid-call leaves time to find the next one.
                Some(leader) => {
                    let budget = remaining.min(timing.propose_timeout / 2);
                    self.forward(leader, &op, budget).await
                }
            };
            match attempt {
                Attempt::Done(result) => return result,
                // A fresh hint is tried at once; the same one again would
                // bounce between two nodes that disagree, so wait first.
                Attempt::Redirect(Some(next)) if Some(next) != target => hint = Some(next),
                Attempt::Redirect(_) | Attempt::Retry => {
                    let pause = timing
                        .heartbeat
                        .min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
            }
            if Instant::now() >= deadline {
                return Err(MembershipError::Timeout {
                    waited: timing.propose_timeout,
                    leader: self.leader(),
                });
            }
        }
    }

    /// Run `op` here, as the leader, waiting at most `timeout`.
    async fn serve(&self, op: LeaderOp, timeout: Duration) -> Attempt {
        let raft = &self.inner.raft;
        let timed_out = Attempt::Done(Err(MembershipError::Timeout {
            waited: timeout,
            leader: self.leader(),
        }));
        match op {
            LeaderOp::Propose(command) => {
                match tokio::time::timeout(timeout, raft.client_write(command)).await {
                    Err(_) => timed_out,
                    Ok(Ok(written)) => {
                        Attempt::Done(written.data.map_err(MembershipError::Rejected))
                    }
                    Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                        Attempt::Redirect(f.leader_id.map(server_of))
                    }
                    Ok(Err(RaftError::APIError(e))) => {
                        Attempt::Done(Err(MembershipError::Raft(e.to_string())))
                    }
                    Ok(Err(RaftError::Fatal(_))) => Attempt::Done(Err(MembershipError::ShutDown)),
                }
            }
            LeaderOp::Read => match tokio::time::timeout(timeout, raft.ensure_linearizable()).await
            {
                Err(_) => timed_out,
                Ok(Ok(_)) => Attempt::Done(Ok(self.map())),
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                    Attempt::Redirect(f.leader_id.map(server_of))
                }
                Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                    Attempt::Retry
                }
                Ok(Err(RaftError::Fatal(_))) => Attempt::Done(Err(MembershipError::ShutDown)),
            },
        }
    }

    /// Send `op` to `leader` and wait at most `timeout` for its answer.
    async fn forward(&self, leader: ServerId, op: &LeaderOp, timeout: Duration) -> Attempt {
        let request = match op {
            LeaderOp::Propose(command) => Request::Propose(command.clone()),
            LeaderOp::Read => Request::ReadMap,
        };
        match call(&*self.inner.net, leader, None, request, timeout).await {
            Ok(Reply::Proposed(applied)) => {
                Attempt::Done(applied.map_err(MembershipError::Rejected))
            }
            Ok(Reply::Map(map)) => Attempt::Done(Ok(map)),
            Ok(Reply::NotLeader { hint }) => Attempt::Redirect(hint.map(ServerId)),
            Ok(other) => {
                tracing::debug!("membership: leader {leader} answered {other:?}");
                Attempt::Retry
            }
            Err(e) => {
                tracing::debug!("membership: forwarding to {leader}: {e}");
                Attempt::Retry
            }
        }
    }

    /// Answer a message another node sent through its [`Transport`]: the
    /// receiving side of `Transport::call`. `Err` only for a malformed
    /// message (the caller should drop it, as if lost).
    pub async fn handle(&self, msg: &[u8]) -> Result<Vec<u8>, MembershipError> {
        let raft = &self.inner.raft;
        let Envelope { to, request } = decode_message(msg)?;
        // A Raft message for another incarnation of this server is for a
        // node that no longer runs here: acting on it would let this node
        // vote or acknowledge entries in its predecessor's name.
        let mine = match to {
            Some(node) => node == self.inner.node,
            None => !request.is_raft(),
        };
        if !mine {
            return Ok(encode_message(&Reply::WrongNode {
                me: self.inner.node,
            }));
        }
        let reply = match request {
            Request::AppendEntries(rpc) => Reply::AppendEntries(raft.append_entries(rpc).await),
            Request::Vote(rpc) => Reply::Vote(raft.vote(rpc).await),
            Request::FullSnapshot { vote, meta, data } => {
                let snapshot = Snapshot {
                    meta,
                    snapshot: Box::new(data),
                };
                Reply::FullSnapshot(raft.install_full_snapshot(vote, snapshot).await)
            }
            Request::Propose(command) => self.answer(LeaderOp::Propose(command)).await,
            Request::ReadMap => self.answer(LeaderOp::Read).await,
            Request::Join { node, replaces } => self.serve_join(node, replaces.map(ServerId)).await,
        };
        Ok(encode_message(&reply))
    }

    /// Serve a forwarded leader operation; never forwards it again.
    async fn answer(&self, op: LeaderOp) -> Reply {
        let proposing = matches!(op, LeaderOp::Propose(_));
        match self.serve(op, self.inner.timing.propose_timeout).await {
            Attempt::Done(Ok(map)) if proposing => Reply::Proposed(Ok(map)),
            Attempt::Done(Ok(map)) => Reply::Map(map),
            Attempt::Done(Err(MembershipError::Rejected(why))) => Reply::Proposed(Err(why)),
            Attempt::Done(Err(e)) => Reply::Failed(e.to_string()),
            Attempt::Redirect(hint) => Reply::NotLeader {
                hint: hint.map(|s| s.0),
            },
            Attempt::Retry => Reply::NotLeader { hint: None },
        }
    }

    /// Stop this node: its Raft tasks, its bootstrap and detector tasks,
    /// and its store (released, so the same directory can be reopened).
    /// Later calls on any clone fail with `ShutDown`.
    pub async fn shutdown(&self) {
        self.stop().await;
    }

    /// `shutdown`, giving back the store once openraft's tasks let go of
    /// it (`None` if another call stopped the node first, or they still
    /// hold it after `STORE_RELEASE_WAIT`).
    pub(crate) async fn stop(&self) -> Option<Arc<dyn KvStore>> {
        self.inner.stopped.send_replace(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!("membership: raft task ended badly: {e}");
        }
        let task = lock(&self.inner.bootstrap_task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        // openraft's state-machine and replication tasks drop their handles
        // on the store shortly after its core stops; wait for them, so the
        // store (RocksDB's lock) is free when this returns.
        let held = lock(&self.inner.kv).take()?;
        let deadline = Instant::now() + STORE_RELEASE_WAIT;
        while Arc::strong_count(&held) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if Arc::strong_count(&held) > 1 {
            tracing::warn!("membership: the store is still in use after shutdown");
            return None;
        }
        Some(held.0.clone())
    }
}

/// Open (creating it if missing) the RocksDB directory of a node's store.
pub(crate) fn open_dir(dir: &Path) -> Result<Arc<dyn KvStore>, MembershipError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| MembershipError::Storage(format!("creating {}: {e}", dir.display())))?;
    Ok(Arc::new(RocksStore::open(dir)?))
}

/// Lock a mutex whose data a panic cannot leave half-changed.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Check `cfg`; `me_votes`: `cfg.me` must be among `cfg.voters` (an
/// original voter).
pub(crate) fn check_config(cfg: &MembershipConfig, me_votes: bool) -> Result<(), MembershipError> {
    cfg.timing.validate()?;
    let voters: BTreeSet<ServerId> = cfg.voters.iter().copied().collect();
    if voters.len() != cfg.voters.len() {
        return Err(MembershipError::Config(format!(
            "a voter is listed twice: {:?}",
            cfg.voters
        )));
    }
    if voters.is_empty() || voters.len() > VOTERS_MAX {
        return Err(MembershipError::Config(format!(
            "{} voters (1..={VOTERS_MAX} allowed)",
            voters.len()
        )));
    }
    if me_votes && !voters.contains(&cfg.me) {
        return Err(MembershipError::Config(format!(
            "server {} is not among the voters",
            cfg.me
        )));
    }
    cfg.initial
        .check()
        .map_err(|why| MembershipError::Config(format!("initial map: {why}")))
}

/// For servers and clients that are not voters: the current map, read
/// linearizably from the leader, found by asking the voters in turn and
/// following their hints. Gives up after `timeout`.
pub async fn fetch_map(
    voters: &[ServerId],
    net: &dyn Transport,
    timeout: Duration,
) -> Result<ClusterMap, MembershipError> {
    if voters.is_empty() {
        return Err(MembershipError::Config("no voters to ask".into()));
    }
    // One call is bounded apart from the whole, so a voter that does not
    // answer leaves time to ask the others.
    let call_timeout = (timeout / 4).max(Duration::from_millis(1));
    let deadline = Instant::now() + timeout;
    let mut next_voter = 0;
    let mut hint: Option<ServerId> = None;
    let mut last_leader = None;
    while Instant::now() < deadline {
        let target = match hint.take() {
            Some(leader) => leader,
            None => {
                next_voter += 1;
                voters[(next_voter - 1) % voters.len()]
            }
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        match call(
            net,
            target,
            None,
            Request::ReadMap,
            call_timeout.min(remaining),
        )
        .await
        {
            Ok(Reply::Map(map)) => return Ok(map),
            // Any hint, not only a listed voter: a server that joined
            // later (`Membership::join`) may lead.
            Ok(Reply::NotLeader { hint: Some(leader) }) => {
                if leader == target.0 {
                    // It names itself but cannot serve yet (no quorum).
                    tokio::time::sleep(call_timeout.min(remaining)).await;
                } else {
                    hint = Some(ServerId(leader));
                    last_leader = hint;
                }
            }
            Ok(_) | Err(_) => {
                // After a full round of voters without an answer, pause
                // before asking again: an election may be under way.
                if next_voter % voters.len() == 0 {
                    tokio::time::sleep(call_timeout.min(remaining)).await;
                }
            }
        }
    }
    Err(MembershipError::Timeout {
        waited: timeout,
        leader: last_leader,
    })
}

impl From<Rejection> for MembershipError {
    fn from(why: Rejection) -> Self {
        MembershipError::Rejected(why)
    }
}
