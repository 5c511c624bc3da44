//! The replicated state: the cluster map (which servers serve which replica
//! set, who is primary, at which epoch) and the changes the Raft group
//! applies to it. Pure and deterministic: every voter applies the same
//! commands in the same order and must reach the same map and the same
//! rejections, so nothing here reads a clock, a random number or the disk.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;

use madfs_types::ServerId;
use serde::{Deserialize, Serialize};

/// The membership of the whole cluster at one epoch.
///
/// Replica set `s` is named after its home server `s` (`ServerId(s)`), so
/// `sets.len()` is the number of servers and every server id in the map is
/// below it. Epoch 0 with no sets means "not bootstrapped yet".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterMap {
    /// +1 on every applied change; 1 for the bootstrap map.
    pub epoch: u64,
    /// Index = set id = home server id.
    pub sets: Vec<SetState>,
    /// Server id -> "ip:port" where that server now runs, for servers moved
    /// off the host the cluster file names (`Change::MoveServer`); a server
    /// not listed is where the cluster file says. Defaulted so maps stored
    /// before this field existed still load.
    #[serde(default)]
    pub addresses: BTreeMap<u16, String>,
}

/// One replica set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetState {
    /// The server process serving this set now; always `members[0]`.
    #[serde(with = "server_id")]
    pub primary: ServerId,
    /// In-sync replicas, primary first, in chain order. Never empty.
    #[serde(with = "server_ids")]
    pub members: Vec<ServerId>,
    /// Replicas catching up: they get live updates but are not counted.
    #[serde(with = "server_ids")]
    pub syncing: Vec<ServerId>,
}

/// A change to one replica set. Proposed with the epoch the proposer saw
/// (`expected_epoch`); applied only if the map is still at that epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Make `new_primary` (an in-sync member) the primary; the old primary
    /// leaves `members`.
    Failover {
        set: u16,
        #[serde(with = "server_id")]
        new_primary: ServerId,
    },
    /// Take `server` out of `members` (it missed an update or is down), or
    /// out of `syncing` (it died while catching up). Never the primary: that
    /// is a `Failover`, so a set never loses its last member.
    RemoveMember {
        set: u16,
        #[serde(with = "server_id")]
        server: ServerId,
    },
    /// `server` starts catching up on `set`.
    AddSyncing {
        set: u16,
        #[serde(with = "server_id")]
        server: ServerId,
    },
    /// `server` has caught up: from `syncing` to the end of `members`.
    MarkInSync {
        set: u16,
        #[serde(with = "server_id")]
        server: ServerId,
    },
    /// Make `server`, catching up on `set`, its primary and only member.
    /// For a primary whose store came back from a power loss (it may lack
    /// writes it acknowledged) and whose in-sync copies were all taken out
    /// while down: proposed by that primary once such a copy is back and
    /// found whole (the server's members.rs `hand_over`). Only while the
    /// primary is the set's one member (with another, `Failover`).
    HandBack {
        set: u16,
        #[serde(with = "server_id")]
        server: ServerId,
    },
    /// `server` now runs at `address` ("ip:port"), replacing a dead process
    /// under the same id. Only for a server in no set (the detector removed
    /// it first), so nobody can take over a live server's id.
    MoveServer {
        #[serde(with = "server_id")]
        server: ServerId,
        address: String,
    },
}

/// Why the state machine refused a command. Deterministic: every voter
/// computes the same rejection for the same command at the same log index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// The map moved on since the proposer read it (compare-and-set lost).
    StaleEpoch {
        expected: u64,
        current: u64,
    },
    /// No map was bootstrapped yet.
    NotBootstrapped,
    /// A bootstrap came after another one was applied.
    AlreadyBootstrapped {
        epoch: u64,
    },
    /// The bootstrap map breaks an invariant.
    InvalidMap(String),
    UnknownSet {
        set: u16,
    },
    UnknownServer {
        server: u16,
    },
    NotAMember {
        set: u16,
        server: u16,
    },
    AlreadyPrimary {
        set: u16,
        server: u16,
    },
    IsPrimary {
        set: u16,
        server: u16,
    },
    AlreadyInSet {
        set: u16,
        server: u16,
    },
    NotSyncing {
        set: u16,
        server: u16,
    },
    /// `HandBack` while the primary has other in-sync members.
    NotAlone {
        set: u16,
    },
    /// `MoveServer` to an address that is not "ip:port".
    BadAddress {
        server: u16,
        address: String,
    },
    /// `MoveServer` of a server still in a set: it must be failed over or
    /// removed first.
    StillInSet {
        set: u16,
        server: u16,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::StaleEpoch { expected, current } => write!(
                f,
                "stale epoch: proposed against epoch {expected}, the map is at {current}"
            ),
            Rejection::NotBootstrapped => write!(f, "the cluster map is not bootstrapped yet"),
            Rejection::AlreadyBootstrapped { epoch } => {
                write!(f, "the cluster map is already bootstrapped (epoch {epoch})")
            }
            Rejection::InvalidMap(why) => write!(f, "invalid bootstrap map: {why}"),
            Rejection::UnknownSet { set } => write!(f, "no replica set {set}"),
            Rejection::UnknownServer { server } => write!(f, "no server {server}"),
            Rejection::NotAMember { set, server } => {
                write!(f, "server {server} is not a member of set {set}")
            }
            Rejection::AlreadyPrimary { set, server } => {
                write!(f, "server {server} is already set {set}'s primary")
            }
            Rejection::IsPrimary { set, server } => write!(
                f,
                "server {server} is set {set}'s primary: fail over instead of removing it"
            ),
            Rejection::AlreadyInSet { set, server } => {
                write!(f, "server {server} is already in set {set}")
            }
            Rejection::NotSyncing { set, server } => {
                write!(f, "server {server} is not catching up on set {set}")
            }
            Rejection::NotAlone { set } => write!(
                f,
                "set {set}'s primary has in-sync members: fail over to one of them instead"
            ),
            Rejection::BadAddress { server, address } => write!(
                f,
                "server {server} cannot move to {address:?}: not an ip:port address"
            ),
            Rejection::StillInSet { set, server } => write!(
                f,
                "server {server} is still in set {set}: remove it from every set before moving it"
            ),
        }
    }
}

impl ClusterMap {
    /// The usual bootstrap map: `servers` sets, set `s` served by server `s`
    /// with the next `replicas - 1` servers (mod `servers`) as its chain.
    pub fn initial(servers: u16, replicas: u16) -> ClusterMap {
        assert!(servers > 0, "a cluster has at least one server");
        assert!(
            (1..=servers).contains(&replicas),
            "replicas must be in 1..={servers}"
        );
        let sets = (0..servers)
            .map(|s| SetState {
                primary: ServerId(s),
                members: (0..replicas)
                    .map(|i| ServerId(((s as u32 + i as u32) % servers as u32) as u16))
                    .collect(),
                syncing: Vec::new(),
            })
            .collect();
        ClusterMap {
            epoch: 1,
            sets,
            addresses: BTreeMap::new(),
        }
    }

    /// Where `server` runs if it was moved off the cluster file's address;
    /// `None` for a server at its cluster-file address (or an address that
    /// does not parse, which `check` keeps out of applied maps).
    pub fn address_of(&self, server: ServerId) -> Option<SocketAddr> {
        self.addresses.get(&server.0)?.parse().ok()
    }

    /// Whether a bootstrap map has been applied.
    pub fn is_bootstrapped(&self) -> bool {
        self.epoch > 0
    }

    /// The invariants every applied map keeps; `Err` names the first broken.
    pub fn check(&self) -> Result<(), String> {
        if self.epoch == 0 {
            return Err("epoch 0 is reserved for 'not bootstrapped'".into());
        }
        if self.sets.is_empty() || self.sets.len() > madfs_types::limits::SERVERS_MAX {
            return Err(format!(
                "{} sets (1..={} allowed)",
                self.sets.len(),
                madfs_types::limits::SERVERS_MAX
            ));
        }
        let servers = self.sets.len();
        for (id, set) in self.sets.iter().enumerate() {
            if set.members.first() != Some(&set.primary) {
                return Err(format!("set {id}: the primary is not the first member"));
            }
            let mut seen = std::collections::HashSet::new();
            for server in set.members.iter().chain(&set.syncing) {
                if server.0 as usize >= servers {
                    return Err(format!("set {id}: server {server} is out of range"));
                }
                if !seen.insert(*server) {
                    return Err(format!("set {id}: server {server} appears twice"));
                }
            }
        }
        for (server, address) in &self.addresses {
            if *server as usize >= servers {
                return Err(format!("address of server {server}, which is out of range"));
            }
            if address.parse::<SocketAddr>().is_err() {
                return Err(format!("server {server}: {address:?} is not ip:port"));
            }
        }
        Ok(())
    }

    /// The map after `change`, at `epoch + 1`, if `change` is valid here.
    /// The caller has already checked the epoch.
    pub fn with_change(&self, change: &Change) -> Result<ClusterMap, Rejection> {
        if !self.is_bootstrapped() {
            return Err(Rejection::NotBootstrapped);
        }
        let (set_id, server) = match change {
            Change::Failover { set, new_primary } => (*set, *new_primary),
            Change::RemoveMember { set, server }
            | Change::AddSyncing { set, server }
            | Change::MarkInSync { set, server }
            | Change::HandBack { set, server } => (*set, *server),
            Change::MoveServer { server, address } => return self.with_move(*server, address),
        };
        if server.0 as usize >= self.sets.len() {
            return Err(Rejection::UnknownServer { server: server.0 });
        }
        let mut next = self.clone();
        let set = next
            .sets
            .get_mut(set_id as usize)
            .ok_or(Rejection::UnknownSet { set: set_id })?;
        let (s, v) = (set_id, server.0);
        match change {
            Change::Failover { .. } => {
                if set.primary == server {
                    return Err(Rejection::AlreadyPrimary { set: s, server: v });
                }
                if !set.members.contains(&server) {
                    return Err(Rejection::NotAMember { set: s, server: v });
                }
                // The old primary leaves; the others keep their chain order
                // behind the new primary.
                let old = set.primary;
                set.members.retain(|m| *m != old && *m != server);
                set.members.insert(0, server);
                set.primary = server;
            }
            Change::RemoveMember { .. } => {
                if set.primary == server {
                    return Err(Rejection::IsPrimary { set: s, server: v });
                }
                let before = set.members.len() + set.syncing.len();
                set.members.retain(|m| *m != server);
                set.syncing.retain(|m| *m != server);
                if set.members.len() + set.syncing.len() == before {
                    return Err(Rejection::NotAMember { set: s, server: v });
                }
            }
            Change::AddSyncing { .. } => {
                if set.members.contains(&server) || set.syncing.contains(&server) {
                    return Err(Rejection::AlreadyInSet { set: s, server: v });
                }
                set.syncing.push(server);
            }
            Change::MarkInSync { .. } => {
                let Some(at) = set.syncing.iter().position(|m| *m == server) else {
                    return Err(Rejection::NotSyncing { set: s, server: v });
                };
                set.syncing.remove(at);
                set.members.push(server);
            }
            Change::HandBack { .. } => {
                if set.members.len() > 1 {
                    return Err(Rejection::NotAlone { set: s });
                }
                let Some(at) = set.syncing.iter().position(|m| *m == server) else {
                    return Err(Rejection::NotSyncing { set: s, server: v });
                };
                set.syncing.remove(at);
                set.members = vec![server];
                set.primary = server;
            }
            Change::MoveServer { .. } => unreachable!("handled by with_move"),
        }
        next.epoch += 1;
        Ok(next)
    }

    /// The map after `server` moved to `address`.
    fn with_move(&self, server: ServerId, address: &str) -> Result<ClusterMap, Rejection> {
        if server.0 as usize >= self.sets.len() {
            return Err(Rejection::UnknownServer { server: server.0 });
        }
        if address.parse::<SocketAddr>().is_err() {
            return Err(Rejection::BadAddress {
                server: server.0,
                address: address.to_string(),
            });
        }
        // A server still in a set may be alive: moving its id elsewhere
        // would hand its sets to whoever runs at the new address.
        for (set, state) in self.sets.iter().enumerate() {
            if state.members.contains(&server) || state.syncing.contains(&server) {
                return Err(Rejection::StillInSet {
                    set: set as u16,
                    server: server.0,
                });
            }
        }
        let mut next = self.clone();
        next.addresses.insert(server.0, address.to_string());
        next.epoch += 1;
        Ok(next)
    }
}

/// Who proposed a change, unique per proposal: a retried proposal (its
/// reply was lost, or its leader stepped down after appending it) is
/// recognized instead of being refused as stale after it already applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct ProposalId {
    pub server: u16,
    pub nonce: u64,
}

/// A command in the Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Command {
    /// Install the first map. Every voter proposes its configured initial
    /// map until one is applied: the first committed wins, so voters started
    /// with different initial maps still agree.
    Bootstrap(ClusterMap),
    /// Apply `change` if the map is at `expected_epoch`.
    Change {
        change: Change,
        expected_epoch: u64,
        id: ProposalId,
    },
}

/// What applying one log entry answered.
pub(crate) type Applied = Result<ClusterMap, Rejection>;

/// How many applied proposals the machine remembers for retries: far more
/// than can be in flight (proposers retry for seconds, not thousands of
/// changes).
const RECENT_PROPOSALS_MAX: usize = 1024;

/// The state machine's whole state, as snapshots store it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub map: ClusterMap,
    /// The latest applied proposals, oldest first, with the epoch each made.
    recent: VecDeque<(ProposalId, u64)>,
}

impl Machine {
    /// Apply `command` (compare-and-set on the epoch) and answer the new map
    /// or the deterministic reason it was refused. A proposal applied before
    /// answers the current map, which includes it.
    pub(crate) fn apply(&mut self, command: &Command) -> Applied {
        let map = &mut self.map;
        match command {
            Command::Bootstrap(initial) => {
                if map.is_bootstrapped() {
                    return Err(Rejection::AlreadyBootstrapped { epoch: map.epoch });
                }
                initial.check().map_err(Rejection::InvalidMap)?;
                *map = initial.clone();
            }
            Command::Change {
                change,
                expected_epoch,
                id,
            } => {
                if !map.is_bootstrapped() {
                    return Err(Rejection::NotBootstrapped);
                }
                if self.recent.iter().any(|(seen, _)| seen == id) {
                    return Ok(map.clone());
                }
                if *expected_epoch != map.epoch {
                    return Err(Rejection::StaleEpoch {
                        expected: *expected_epoch,
                        current: map.epoch,
                    });
                }
                *map = map.with_change(change)?;
                if self.recent.len() == RECENT_PROPOSALS_MAX {
                    self.recent.pop_front();
                }
                self.recent.push_back((*id, map.epoch));
            }
        }
        // Checked on every voter after every applied command, in release
        // too: a map that breaks an invariant must stop the node, not spread.
        assert!(
            map.check().is_ok(),
            "applied map breaks an invariant: {:?}",
            map.check()
        );
        Ok(map.clone())
    }
}

/// serde for a `ServerId` (madfs-types has no serde): its number.
mod server_id {
    use madfs_types::ServerId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &ServerId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(id.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServerId, D::Error> {
        u16::deserialize(d).map(ServerId)
    }
}

/// serde for a list of `ServerId`s: a list of numbers.
mod server_ids {
    use madfs_types::ServerId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ids: &[ServerId], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(ids.iter().map(|id| id.0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ServerId>, D::Error> {
        Vec::<u16>::deserialize(d).map(|v| v.into_iter().map(ServerId).collect())
    }
}

#[cfg(test)]
mod tests;
