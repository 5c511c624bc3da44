//! MadFS cluster membership by consensus.
//!
//! Which servers serve which replica set, who is primary, and the epoch of
//! that map are kept by a Raft group ([openraft]) among a few servers, the
//! voters. Every change is a compare-and-set on the epoch, so two proposers
//! racing cannot both win, and every voter applies the same changes in the
//! same order. Servers and clients that are not voters ask the voters for
//! the map ([`fetch_map`]); nothing is broadcast to clients.
//!
//! Failure detection is the Raft leader's job ([`Detector`]): it pings every
//! server each heartbeat; an answered ping renews the server's lease
//! ([`LeaseHolder`]), and a server silent for `down_after` is failed over or
//! removed. A server without a lease refuses writes, and no server is
//! promoted before the lease of the primary it replaces has surely run out:
//! no split brain. See docs/ARCHITECTURE.md, "Membership".
//!
//! A voter whose Raft state is lost is replaced by a new Raft node under
//! the same server id, a fresh incarnation ([`Membership::join`]), through
//! openraft's membership change; servers that moved host are recorded in
//! the map ([`Change::MoveServer`]).
//!
//! The crate owns no sockets: the caller's [`Transport`] carries encoded
//! messages, and [`Membership::handle`] answers them on the receiving side.
//! [`local::LocalNet`] is an in-process transport with injectable partitions
//! and losses, for tests.

mod detector;
mod join;
mod lease;
pub mod local;
mod network;
mod node;
mod runtime;
mod state;
mod store;
mod wire;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use madfs_types::ServerId;

pub use detector::{Detector, PingFn, PromoteFn, Promotion};
pub use lease::{LeaseHolder, LostSet, Ping};
pub use node::{fetch_map, Membership};
pub use runtime::seed_thread_rng;
pub use state::{Change, ClusterMap, Rejection, SetState};

/// Carries membership messages between servers: the caller's RPC layer in
/// production, [`local::LocalNet`] in tests.
pub trait Transport: Send + Sync + 'static {
    /// Send an encoded membership message to server `to` and return its
    /// encoded reply: what `to`'s [`Membership::handle`] answered. `Err`
    /// when the message or its reply could not be delivered. The crate
    /// bounds every call with its own timeout.
    fn call(&self, to: ServerId, msg: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>, String>>;
}

/// The clocks of the protocol. All durations; the defaults suit a LAN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Raft heartbeats from the leader to the voters, and the detector's
    /// round of pings to every server.
    pub heartbeat: Duration,
    /// A follower that hears no leader for between this and twice this
    /// starts an election.
    pub election_timeout: Duration,
    /// One message and its reply (Raft RPCs, pings, forwarded requests).
    pub rpc_timeout: Duration,
    /// A whole `propose` or `read_map`, retries and redirects included.
    pub propose_timeout: Duration,
    /// How long an answered ping lets a server serve writes.
    pub lease: Duration,
    /// Subtracted from the lease on the holder's side: covers the holder's
    /// and the leader's monotonic clocks running at different rates.
    pub lease_margin: Duration,
    /// A server that answered no ping for this long is declared down.
    /// At least `lease + lease_margin`, so its lease ran out first.
    pub down_after: Duration,
    /// A whole [`Membership::become_voter`]: catching up as a learner,
    /// then the two-step voter change, retries included.
    pub join_timeout: Duration,
    /// A voter that answered no ping for this long is lost for good: the
    /// leader's detector puts a live server in its place (where the caller
    /// gave it a way to, `Detector::start_promoting`), so the group keeps
    /// a majority through the next loss. At least `down_after`.
    pub voter_lost_after: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(500),
            rpc_timeout: Duration::from_millis(500),
            propose_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(1),
            lease_margin: Duration::from_millis(100),
            down_after: Duration::from_secs(2),
            join_timeout: Duration::from_secs(30),
            voter_lost_after: Duration::from_secs(30),
        }
    }
}

impl Timing {
    /// Check the relations the protocol's safety and liveness rest on.
    pub fn validate(&self) -> Result<(), MembershipError> {
        let fail = |why: &str| Err(MembershipError::Config(format!("timing: {why}: {self:?}")));
        if self.heartbeat.is_zero() || self.rpc_timeout.is_zero() {
            return fail("heartbeat and rpc_timeout must be positive");
        }
        if self.election_timeout < 2 * self.heartbeat {
            return fail("election_timeout must be at least two heartbeats");
        }
        if self.lease_margin >= self.lease {
            return fail("lease_margin must be shorter than the lease");
        }
        // A grant reaches the holder about two heartbeats after the ping it
        // is anchored on (see lease.rs): the lease must outlast that gap or
        // a healthy server would flap.
        if self.lease < 3 * self.heartbeat + self.lease_margin {
            return fail("lease must be at least three heartbeats plus the margin");
        }
        if self.down_after < self.lease + self.lease_margin {
            return fail("down_after must be at least lease + lease_margin");
        }
        // The leader gives one join request up to `propose_timeout`.
        if self.join_timeout < self.propose_timeout {
            return fail("join_timeout must be at least propose_timeout");
        }
        if self.voter_lost_after < self.down_after {
            return fail("voter_lost_after must be at least down_after");
        }
        Ok(())
    }
}

/// How to start one voter.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// This server.
    pub me: ServerId,
    /// Every voter of the group at bootstrap, `me` included; the same list
    /// on every voter. A few (3 or 5): each write waits for a majority of
    /// them. For [`Membership::join`], the servers to ask (any voters;
    /// `me` need not be among them). The group's current voters may differ
    /// after joins: [`Membership::voters`].
    pub voters: Vec<ServerId>,
    /// Where the Raft log, vote and snapshot live (a RocksDB directory of
    /// its own, not the server's metadata store).
    pub dir: PathBuf,
    /// The map to bootstrap with on the group's first start; ignored once
    /// a map was committed.
    pub initial: ClusterMap,
    pub timing: Timing,
    /// Snapshot after this many log entries and keep a quarter as many
    /// behind it: bounds the log on disk.
    pub snapshot_every_entries: u64,
    /// For [`Membership::join`]: the voter (lost for good) whose place
    /// this node takes, kept with its incarnation so that a restart
    /// finishes the same change; `None` for a replacement of `me` itself
    /// or a voter that grows the group.
    pub replaces: Option<ServerId>,
}

impl MembershipConfig {
    /// A configuration with the default timing and log bound.
    pub fn new(me: ServerId, voters: Vec<ServerId>, dir: PathBuf, initial: ClusterMap) -> Self {
        MembershipConfig {
            me,
            voters,
            dir,
            initial,
            timing: Timing::default(),
            snapshot_every_entries: 1024,
            replaces: None,
        }
    }
}

/// Everything this crate reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// The configuration cannot work (said why).
    Config(String),
    /// The durable store failed (log, vote or snapshot).
    Storage(String),
    /// A message or stored record is malformed or of another version.
    Decode(String),
    /// A message to `server` or its reply was lost or timed out.
    Unreachable { server: ServerId, why: String },
    /// The state machine refused the change; nothing was applied.
    Rejected(Rejection),
    /// No leader committed the proposal (or answered the read) in time.
    /// A proposal may still be applied later: read the map to know.
    Timeout {
        waited: Duration,
        leader: Option<ServerId>,
    },
    /// openraft failed in a way this crate does not expect.
    Raft(String),
    /// This node was shut down.
    ShutDown,
}

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MembershipError::Config(why) => write!(f, "membership configuration: {why}"),
            MembershipError::Storage(why) => write!(f, "membership store: {why}"),
            MembershipError::Decode(why) => {
                write!(f, "malformed membership message or record: {why}")
            }
            MembershipError::Unreachable { server, why } => {
                write!(f, "membership message to server {server} failed: {why}")
            }
            MembershipError::Rejected(why) => write!(f, "membership change refused: {why}"),
            MembershipError::Timeout { waited, leader } => {
                let leader = leader.map_or("none".to_string(), |l| l.to_string());
                write!(
                    f,
                    "no membership leader answered within {waited:?} (last known leader: {leader}); \
                     a proposal may still apply"
                )
            }
            MembershipError::Raft(why) => write!(f, "raft: {why}"),
            MembershipError::ShutDown => write!(f, "membership node is shut down"),
        }
    }
}

impl std::error::Error for MembershipError {}
