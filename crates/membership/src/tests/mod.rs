//! Tests of the whole crate: voters of one group in one process over
//! `LocalNet`, on tokio's paused clock (elections, timeouts and leases take
//! no wall time). The harness is here; the scenarios are in group.rs,
//! detector.rs, replace.rs and random.rs.

mod detector;
mod group;
mod random;
mod replace;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use madfs_kv::MemStore;
use madfs_types::ServerId;
use tokio::time::Instant;

use crate::local::LocalNet;
use crate::wire::NodeId;
use crate::{Change, ClusterMap, Membership, MembershipConfig, MembershipError, Timing};

/// Where a voter keeps its state across restarts.
enum Disk {
    /// Survives `kill`: what a crash keeps, since every write the protocol
    /// needs is synced.
    Mem(Arc<MemStore>),
    /// A RocksDB directory, reopened on restart.
    Dir(PathBuf),
}

/// A membership group in one process.
pub(crate) struct Group {
    pub net: Arc<LocalNet>,
    pub voters: Vec<ServerId>,
    pub initial: ClusterMap,
    pub timing: Timing,
    pub snapshot_every_entries: u64,
    pub nodes: BTreeMap<ServerId, Membership>,
    disks: BTreeMap<ServerId, Disk>,
    _tmp: Option<tempfile::TempDir>,
}

impl Group {
    /// `voters` voters (servers 0..voters) over `servers` sets of
    /// `replicas`, on in-memory stores, all started.
    pub async fn start(voters: u16, servers: u16, replicas: u16, seed: u64) -> Group {
        let mut group = Group::new(voters, servers, replicas, seed, false);
        group.start_all().await;
        group
    }

    /// As `start`, but each voter in a RocksDB directory, and not started.
    pub fn on_disk(voters: u16, servers: u16, replicas: u16) -> Group {
        Group::new(voters, servers, replicas, 1, true)
    }

    fn new(voters: u16, servers: u16, replicas: u16, seed: u64, on_disk: bool) -> Group {
        let tmp = on_disk.then(|| tempfile::tempdir().expect("temporary directory"));
        let voters: Vec<ServerId> = (0..voters).map(ServerId).collect();
        let disks = voters
            .iter()
            .map(|v| {
                let disk = match &tmp {
                    Some(dir) => Disk::Dir(dir.path().join(format!("voter-{v}"))),
                    None => Disk::Mem(Arc::new(MemStore::new())),
                };
                (*v, disk)
            })
            .collect();
        Group {
            net: LocalNet::new(seed),
            voters,
            initial: ClusterMap::initial(servers, replicas),
            timing: Timing::default(),
            snapshot_every_entries: 1024,
            nodes: BTreeMap::new(),
            disks,
            _tmp: tmp,
        }
    }

    pub async fn start_all(&mut self) {
        for voter in self.voters.clone() {
            self.start_node(voter).await;
        }
    }

    /// Start (or restart) `voter` from its disk.
    pub async fn start_node(&mut self, voter: ServerId) {
        assert!(!self.nodes.contains_key(&voter), "voter {voter} is running");
        let mut cfg = MembershipConfig::new(
            voter,
            self.voters.clone(),
            PathBuf::new(),
            self.initial.clone(),
        );
        cfg.timing = self.timing.clone();
        cfg.snapshot_every_entries = self.snapshot_every_entries;
        let net = self.net.transport(voter);
        let node = match &self.disks[&voter] {
            Disk::Mem(store) => Membership::start_with_store(cfg, store.clone(), net).await,
            Disk::Dir(dir) => {
                cfg.dir = dir.clone();
                Membership::start(cfg, net).await
            }
        }
        .expect("voter starts");
        self.net.attach(node.clone());
        self.nodes.insert(voter, node);
    }

    /// Start a node for `server` with `Membership::join` on its disk (a
    /// fresh one if it has none) and attach it; it is not a voter yet.
    pub async fn join_node(&mut self, server: ServerId) -> Membership {
        self.join_node_replacing(server, None).await
    }

    /// `join_node`, the node to take the place of voter `replaces`.
    pub async fn join_node_replacing(
        &mut self,
        server: ServerId,
        replaces: Option<ServerId>,
    ) -> Membership {
        assert!(!self.nodes.contains_key(&server), "{server} is running");
        let disk = self
            .disks
            .entry(server)
            .or_insert_with(|| Disk::Mem(Arc::new(MemStore::new())));
        let Disk::Mem(store) = disk else {
            panic!("join_node runs on in-memory stores")
        };
        let mut cfg = MembershipConfig::new(
            server,
            self.voters.clone(),
            PathBuf::new(),
            self.initial.clone(),
        );
        cfg.timing = self.timing.clone();
        cfg.snapshot_every_entries = self.snapshot_every_entries;
        cfg.replaces = replaces;
        let node = Membership::join_with_store(cfg, store.clone(), self.net.transport(server))
            .await
            .expect("the joining node starts");
        self.net.attach(node.clone());
        self.nodes.insert(server, node.clone());
        node
    }

    /// Lose `server`'s store (its host died): its next start finds it empty.
    pub fn wipe(&mut self, server: ServerId) {
        assert!(!self.nodes.contains_key(&server), "{server} is running");
        self.disks
            .insert(server, Disk::Mem(Arc::new(MemStore::new())));
    }

    /// Start `server` with `Membership::join` on its existing disk, which
    /// is expected to be refused.
    pub async fn join_refused(&self, server: ServerId) -> MembershipError {
        let Disk::Mem(store) = &self.disks[&server] else {
            panic!("join_refused runs on in-memory stores")
        };
        let cfg = MembershipConfig::new(
            server,
            self.voters.clone(),
            PathBuf::new(),
            self.initial.clone(),
        );
        match Membership::join_with_store(cfg, store.clone(), self.net.transport(server)).await {
            Ok(_) => panic!("join on {server}'s store was accepted"),
            Err(e) => e,
        }
    }

    /// Stop `voter` as a crash would: cut from the network first, so it
    /// sends and answers nothing more, then stopped.
    pub async fn kill(&mut self, voter: ServerId) {
        let node = self.nodes.remove(&voter).expect("voter is running");
        self.net.detach(voter);
        self.net.isolate(voter);
        node.shutdown().await;
        // A restarted voter comes back on the main side of the network.
        self.net.rejoin(voter);
    }

    pub fn node(&self, voter: ServerId) -> &Membership {
        &self.nodes[&voter]
    }

    /// Wait (simulated time) until `done`, or fail naming `what`.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Group) -> bool,
    ) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until every node of `among` names the same leader, one of them,
    /// which believes it leads; return it.
    pub async fn wait_leader(&self, among: &[ServerId]) -> ServerId {
        let agreed = |group: &Group| {
            let first = group.node(among[0]).leader()?;
            let all_agree = among.iter().all(|v| group.node(*v).leader() == Some(first));
            (all_agree && among.contains(&first) && group.node(first).is_leader()).then_some(first)
        };
        self.wait_until("a leader is agreed", Duration::from_secs(30), |g| {
            agreed(g).is_some()
        })
        .await;
        agreed(self).expect("agreed just now")
    }

    /// Wait until every running node has applied the same bootstrapped map.
    pub async fn wait_converged(&self) -> ClusterMap {
        self.wait_until(
            "all running voters hold the same map",
            Duration::from_secs(60),
            |g| {
                let mut maps = g.nodes.values().map(|n| n.map());
                let first = maps.next().expect("a running voter");
                first.is_bootstrapped() && maps.all(|m| m == first)
            },
        )
        .await;
        self.nodes.values().next().expect("a running voter").map()
    }
}

/// A valid change of `map` chosen by `pick` (any number): cycles servers
/// through syncing, in-sync and removed, and fails over primaries.
pub(crate) fn some_change(map: &ClusterMap, pick: u64) -> Change {
    let servers = map.sets.len() as u64;
    let set_id = (pick % servers) as u16;
    let server = ServerId(((pick / servers) % servers) as u16);
    let set = &map.sets[set_id as usize];
    if set.syncing.contains(&server) {
        Change::MarkInSync {
            set: set_id,
            server,
        }
    } else if !set.members.contains(&server) {
        Change::AddSyncing {
            set: set_id,
            server,
        }
    } else if set.primary != server {
        Change::RemoveMember {
            set: set_id,
            server,
        }
    } else if set.members.len() > 1 {
        Change::Failover {
            set: set_id,
            new_primary: set.members[1],
        }
    } else if let Some(catching_up) = set.syncing.first() {
        Change::MarkInSync {
            set: set_id,
            server: *catching_up,
        }
    } else {
        // A lone primary and nobody catching up: someone else is outside.
        let outside = (0..servers as u16)
            .map(ServerId)
            .find(|s| !set.members.contains(s))
            .expect("a set of one member leaves servers outside it");
        Change::AddSyncing {
            set: set_id,
            server: outside,
        }
    }
}

/// A `MoveServer` of `map` chosen by `pick`: of a server in no set if there
/// is one (valid), else of one still in a set (refused).
pub(crate) fn some_move(map: &ClusterMap, pick: u64) -> Change {
    let servers = map.sets.len() as u16;
    let in_a_set = |s: ServerId| {
        map.sets
            .iter()
            .any(|set| set.members.contains(&s) || set.syncing.contains(&s))
    };
    let server = (0..servers)
        .map(ServerId)
        .find(|s| !in_a_set(*s))
        .unwrap_or(ServerId((pick % servers as u64) as u16));
    Change::MoveServer {
        server,
        address: format!("10.0.{}.{}:7000", (pick >> 8) % 256, pick % 256),
    }
}

/// What the tests read of a node's Raft state.
impl Membership {
    /// This node's Raft id.
    pub(crate) fn node_id(&self) -> NodeId {
        self.inner.node
    }

    /// The Raft ids of the voters, as this node last learned.
    pub(crate) fn voter_nodes(&self) -> BTreeSet<NodeId> {
        let metrics = self.inner.raft.metrics().borrow().clone();
        metrics.membership_config.membership().voter_ids().collect()
    }

    /// The Raft ids of every voter and learner, as this node last learned.
    pub(crate) fn member_nodes(&self) -> BTreeSet<NodeId> {
        let metrics = self.inner.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        membership.nodes().map(|(id, _)| *id).collect()
    }

    /// The vote this node has persisted (term, candidate, committed).
    pub(crate) fn vote(&self) -> openraft::Vote<NodeId> {
        self.inner.raft.metrics().borrow().vote
    }

    /// The index of the last entry in this node's log.
    pub(crate) fn last_log_index(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow().last_log_index
    }

    /// The last log id in this node's snapshot and the last purged.
    pub(crate) fn snapshot_and_purged(&self) -> (Option<u64>, Option<u64>) {
        let metrics = self.inner.raft.metrics().borrow().clone();
        (
            metrics.snapshot.map(|id| id.index),
            metrics.purged.map(|id| id.index),
        )
    }
}
