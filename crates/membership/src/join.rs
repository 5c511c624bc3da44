//! Replacing a voter whose Raft state is lost, and adding a voter, through
//! openraft's membership change (see docs/ARCHITECTURE.md, "Membership").
//!
//! A process that restarts a voter's server id with an empty Raft store
//! must not rejoin as the same Raft node: it has forgotten the votes its
//! predecessor cast and could grant a second one in the same term. So it
//! becomes a new node: the same server id with a fresh incarnation
//! ([`Membership::join`]), stored before Raft starts. It asks the voters
//! ([`Membership::become_voter`]) until the leader has added it as a
//! learner, let it catch up, and replaced the other incarnation of its
//! server (if any) by it in the voter set; a new server id grows the group.
//! Messages for the old incarnation are refused by the new process
//! (node.rs, `handle`), so the old node is as good as dead to the leader.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::SystemTime;

use madfs_kv::KvStore;
use madfs_types::ServerId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, EmptyNode, Membership as RaftMembership};
use tokio::time::Instant;

use crate::network::call;
use crate::node::{check_config, VOTERS_MAX};
use crate::store;
use crate::wire::{incarnation_of, server_of, NodeId, Reply, Request, INCARNATION_MAX};
use crate::{Membership, MembershipConfig, MembershipError, Transport};

/// A fresh incarnation: random, never 0 (the original voters'). Two
/// replacements of one server drawing the same one among 2^48 is not a
/// case we guard against.
fn fresh_incarnation() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(now);
    (hasher.finish() % INCARNATION_MAX) + 1
}

/// Whether `node` votes in `membership` and no voter change is under way.
fn is_settled_voter(membership: &RaftMembership<NodeId, EmptyNode>, node: NodeId) -> bool {
    membership.get_joint_config().len() == 1 && membership.voter_ids().any(|v| v == node)
}

impl Membership {
    /// Start a node for a server whose Raft directory `cfg.dir` is empty
    /// (its voter's host died, or a new voter): under a fresh incarnation,
    /// stored first, without bootstrapping anything. Returns once it runs:
    /// attach it to the transport (it must answer the leader while it
    /// catches up), then call [`Membership::become_voter`]. A directory
    /// this call made before comes back as the same incarnation; one an
    /// original voter holds is refused (`Config`): start it instead.
    pub async fn join(
        cfg: MembershipConfig,
        net: Arc<dyn Transport>,
    ) -> Result<Membership, MembershipError> {
        let kv = crate::node::open_dir(&cfg.dir)?;
        Membership::join_with_store(cfg, kv, net).await
    }

    /// [`Membership::join`] over a store the caller opened.
    pub async fn join_with_store(
        cfg: MembershipConfig,
        kv: Arc<dyn KvStore>,
        net: Arc<dyn Transport>,
    ) -> Result<Membership, MembershipError> {
        check_config(&cfg, false)?;
        let replaces = cfg.replaces.filter(|r| *r != cfg.me);
        let incarnation = match store::read_incarnation(&*kv)? {
            Some(incarnation) => incarnation,
            None if store::holds_raft_state(&*kv)? => {
                return Err(MembershipError::Config(format!(
                    "server {} has the Raft state of its original node: start it instead \
                     (join only with an empty membership directory)",
                    cfg.me
                )))
            }
            None => {
                // Stored before Raft runs: a restart of this process must
                // be this node again, never incarnation 0.
                let incarnation = fresh_incarnation();
                store::write_identity(&*kv, incarnation, replaces.map(|r| r.0))?;
                incarnation
            }
        };
        // A directory this call made before keeps the change it was made
        // for.
        let replaces = store::read_replaces(&*kv)?.map(ServerId);
        let place = replaces.map_or(String::new(), |lost| format!(" in place of voter {lost}"));
        tracing::info!(
            "membership: server {} joins as incarnation {incarnation}{place}",
            cfg.me
        );
        Membership::launch(cfg, kv, net, incarnation, replaces).await
    }

    /// Make this node, which the group no longer counts (its server's
    /// voter place moved to another server while it was away), a new node
    /// of its server, to take the place of voter `cfg.replaces`: stopped,
    /// then its store forgets the old node's Raft state and takes a fresh
    /// incarnation, in one synced batch (a crash leaves the old node, a
    /// member of nothing, or the new identity, which a restart starts
    /// again). Returns the new node running, as [`Membership::join`] does;
    /// then call [`Membership::become_voter`].
    ///
    /// The caller must know that the group does not count this node (the
    /// leader's voters leave its server out): it forgets its votes, so it
    /// is as good as dead to the group from here on. That is safe in any
    /// case (its node id never answers again: the new one refuses messages
    /// for it), but a group that still counted it would have lost a voter.
    pub async fn rejoin(
        self,
        cfg: MembershipConfig,
        net: Arc<dyn Transport>,
    ) -> Result<Membership, MembershipError> {
        check_config(&cfg, false)?;
        if cfg.me != self.inner.me {
            return Err(MembershipError::Config(format!(
                "node of server {} rejoining as server {}",
                self.inner.me, cfg.me
            )));
        }
        let old = self.inner.node;
        let kv = self.stop().await.ok_or(MembershipError::ShutDown)?;
        let replaces = cfg.replaces.filter(|r| *r != cfg.me);
        let incarnation = loop {
            let fresh = fresh_incarnation();
            if fresh != incarnation_of(old) {
                break fresh;
            }
        };
        store::take_new_identity(&*kv, incarnation, replaces.map(|r| r.0))?;
        let place = replaces.map_or(String::new(), |lost| format!(" in place of voter {lost}"));
        tracing::info!(
            "membership: server {} leaves node incarnation {} behind and joins as incarnation \
             {incarnation}{place}",
            cfg.me,
            incarnation_of(old)
        );
        Membership::launch(cfg, kv, net, incarnation, replaces).await
    }

    /// Whether `kv` holds the identity of a node that joined (a stored
    /// incarnation): a server made a voter after the group started, which
    /// starts that node again on a restart.
    pub fn joined_before(kv: &dyn KvStore) -> Result<bool, MembershipError> {
        Ok(store::read_incarnation(kv)?.is_some())
    }

    /// Let this node start elections (the default) or not: a node the
    /// group's leader no longer lists as a voter (its place moved while it
    /// was away) would otherwise campaign every few seconds, refused each
    /// time. Reversible: it campaigns again once listed.
    pub fn campaign(&self, on: bool) {
        self.inner.raft.runtime_config().elect(on);
    }

    /// This node's incarnation: 0 for the original voters, a fresh one
    /// for each replacement ([`Membership::join`]).
    pub fn incarnation(&self) -> u64 {
        incarnation_of(self.inner.node)
    }

    /// The servers whose nodes vote in the group now, as this node last
    /// learned (both sides of a change under way): differs from the
    /// cluster file's voters once a server joined as a new voter.
    pub fn voters(&self) -> Vec<ServerId> {
        let metrics = self.inner.raft.metrics();
        let membership = metrics.borrow().membership_config.clone();
        let servers: BTreeSet<ServerId> =
            membership.membership().voter_ids().map(server_of).collect();
        servers.into_iter().collect()
    }

    /// Ask the voters (`cfg.voters`, following leader hints) until the
    /// leader has made this node a voter, in place of any other
    /// incarnation of its server and of the voter it was made to replace
    /// (`cfg.replaces` at `join`), and this node has learned it. At most
    /// `timing.join_timeout` (`Timeout`); calling it again after a timeout,
    /// or on a node that already votes, is harmless.
    pub async fn become_voter(&self) -> Result<(), MembershipError> {
        let inner = &self.inner;
        let timing = &inner.timing;
        let deadline = Instant::now() + timing.join_timeout;
        let ask: Vec<ServerId> = inner
            .ask
            .iter()
            .copied()
            .filter(|s| *s != inner.me)
            .collect();
        // The leader serves one join for up to `propose_timeout`.
        let call_timeout = timing.propose_timeout + timing.rpc_timeout;
        let mut next = 0;
        let mut hint: Option<ServerId> = None;
        let mut joined = false;
        let mut metrics = inner.raft.metrics();
        loop {
            if *inner.stopped.borrow() {
                return Err(MembershipError::ShutDown);
            }
            if is_settled_voter(metrics.borrow().membership_config.membership(), inner.node) {
                return Ok(());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(MembershipError::Timeout {
                    waited: timing.join_timeout,
                    leader: self.leader(),
                });
            }
            if joined {
                // The leader committed the change; this node learns it with
                // the leader's next message.
                let _ = tokio::time::timeout(remaining, metrics.changed()).await;
                continue;
            }
            let target = match hint.take() {
                Some(leader) => leader,
                None if ask.is_empty() => {
                    return Err(MembershipError::Config(
                        "no other voter to ask to join".into(),
                    ))
                }
                None => {
                    next += 1;
                    ask[(next - 1) % ask.len()]
                }
            };
            let request = Request::Join {
                node: inner.node,
                replaces: inner.replaces.map(|r| r.0),
            };
            match call(
                &*inner.net,
                target,
                None,
                request,
                call_timeout.min(remaining),
            )
            .await
            {
                Ok(Reply::Joined) => joined = true,
                Ok(Reply::NotLeader { hint: Some(leader) })
                    if leader != target.0 && leader != inner.me.0 =>
                {
                    hint = Some(ServerId(leader));
                }
                other => {
                    tracing::debug!("membership: join through server {target}: {other:?}");
                    let pause = timing.heartbeat.min(remaining);
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// The leader's side of `Request::Join`.
    pub(crate) async fn serve_join(&self, node: NodeId, replaces: Option<ServerId>) -> Reply {
        let budget = self.inner.timing.propose_timeout;
        // In a task of its own, so a caller that gives up does not cancel
        // it between the two steps of a voter change (which would leave
        // the group in the joint configuration until the next change).
        let this = self.clone();
        let task = tokio::spawn(async move { this.make_voter(node, replaces).await });
        match tokio::time::timeout(budget, task).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => Reply::Failed(format!("making node {node} a voter failed: {e}")),
            Err(_) => Reply::Failed(format!(
                "making node {node} a voter takes more than {budget:?}; ask again"
            )),
        }
    }

    /// Make `node` a voter: learner, caught up, then the voter set with
    /// `node` in place of the other incarnations of its server and of
    /// every incarnation of `replaces`.
    async fn make_voter(&self, node: NodeId, replaces: Option<ServerId>) -> Reply {
        // Each join computes its voter set from the membership the one
        // before it left.
        let _serial = self.inner.join_lock.lock().await;
        let raft = &self.inner.raft;
        if !self.is_leader() {
            return Reply::NotLeader {
                hint: self.leader().map(|s| s.0),
            };
        }
        let current = raft.metrics().borrow().membership_config.clone();
        if is_settled_voter(current.membership(), node) {
            self.drop_stale_learners(node, current.membership()).await;
            return Reply::Joined;
        }
        if let Some(lost) = replaces {
            // Taking the place of a voter that is no voter any more (the
            // change was made already, by another node) would grow the
            // group instead.
            if lost == server_of(node)
                || !current
                    .membership()
                    .voter_ids()
                    .any(|v| server_of(v) == lost)
            {
                return Reply::Failed(format!(
                    "node {node} was to take the place of voter {lost}, which votes no more"
                ));
            }
        }
        if incarnation_of(node) == 0 {
            // Incarnation 0 is the original voters': a node under it with
            // lost state must not come back (see the file header).
            return Reply::Failed(format!(
                "node {node} is an original voter's incarnation: a joining node needs a fresh one"
            ));
        }
        let timeout = self.inner.timing.propose_timeout;
        let added =
            match tokio::time::timeout(timeout, raft.add_learner(node, EmptyNode::new(), true))
                .await
            {
                Err(_) => {
                    return Reply::Failed(format!(
                        "learner {node} did not catch up within {timeout:?}"
                    ))
                }
                Ok(Err(e)) => return self.refused(e),
                Ok(Ok(added)) => added,
            };
        let Some(with_learner) = added.membership else {
            return Reply::Failed("adding a learner wrote no membership".into());
        };
        let server = server_of(node);
        let mut voters: BTreeSet<NodeId> = with_learner
            .voter_ids()
            .filter(|v| server_of(*v) != server && Some(server_of(*v)) != replaces)
            .collect();
        voters.insert(node);
        if voters.len() > VOTERS_MAX {
            return Reply::Failed(format!(
                "{} voters would be more than the {VOTERS_MAX} allowed",
                voters.len()
            ));
        }
        tracing::info!("membership: voters become {voters:?}");
        // Joint configuration, then the new one; `retain: false` drops the
        // replaced incarnation from the membership altogether.
        let changed = match raft.change_membership(voters, false).await {
            Err(e) => return self.refused(e),
            Ok(changed) => changed,
        };
        if let Some(membership) = &changed.membership {
            self.drop_stale_learners(node, membership).await;
        }
        Reply::Joined
    }

    /// Remove learners of `node`'s server other than `node`: joins that
    /// were abandoned (the joining process died) after step 1.
    async fn drop_stale_learners(
        &self,
        node: NodeId,
        membership: &RaftMembership<NodeId, EmptyNode>,
    ) {
        let server = server_of(node);
        let stale: BTreeSet<NodeId> = membership
            .learner_ids()
            .filter(|l| server_of(*l) == server && *l != node)
            .collect();
        if stale.is_empty() {
            return;
        }
        // Harmless if it fails: a stale learner only costs the leader
        // failed messages, and the next join removes it again.
        let removal = ChangeMembers::RemoveNodes(stale.clone());
        let timeout = self.inner.timing.propose_timeout;
        match tokio::time::timeout(timeout, self.inner.raft.change_membership(removal, false)).await
        {
            Ok(Ok(_)) => tracing::info!("membership: removed stale learners {stale:?}"),
            Ok(Err(e)) => tracing::debug!("membership: removing stale learners {stale:?}: {e}"),
            Err(_) => tracing::debug!("membership: removing stale learners {stale:?} timed out"),
        }
    }

    /// A membership change openraft refused, as a reply.
    fn refused(&self, e: RaftError<NodeId, ClientWriteError<NodeId, EmptyNode>>) -> Reply {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => Reply::NotLeader {
                hint: f.leader_id.map(|l| server_of(l).0),
            },
            other => Reply::Failed(other.to_string()),
        }
    }
}
