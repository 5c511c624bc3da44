//! Failure detection, the leader side: while this node leads the membership
//! group, ping every server each heartbeat (granting leases, see lease.rs),
//! and when a server has answered nothing for `down_after`, propose its
//! removal: `Failover` of each set it is primary of to the next in-sync
//! member that is alive, `RemoveMember` from each set it only belongs to.
//! Servers ping nobody and clients ping nothing: only the leader sends.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::{join_all, BoxFuture};
use madfs_types::ServerId;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::lease::Ping;
use crate::state::{Change, ClusterMap};
use crate::{Membership, MembershipError, Rejection, Timing};

/// Sends `ping` to a server and resolves to whether it answered (the
/// server's `LeaseHolder::on_ping` ran and its reply came back). The
/// detector bounds each call by `rpc_timeout`.
pub type PingFn = Arc<dyn Fn(ServerId, Ping) -> BoxFuture<'static, bool> + Send + Sync>;

/// The leader's view of who answers: pure, so the decision is testable
/// without a network.
pub(crate) struct Tracker {
    /// When this node started leading: a server never heard from counts as
    /// heard then (see lease.rs on earlier leaders' grants).
    started: Instant,
    last_answer: HashMap<ServerId, Instant>,
    timing: Timing,
}

impl Tracker {
    pub(crate) fn new(timing: &Timing, started: Instant) -> Tracker {
        assert!(
            timing.down_after >= timing.lease + timing.lease_margin,
            "down_after must be at least lease + lease_margin, or a server could be failed over while it still holds its lease"
        );
        Tracker {
            started,
            last_answer: HashMap::new(),
            timing: timing.clone(),
        }
    }

    /// `server`'s answer arrived at `at`.
    pub(crate) fn answered(&mut self, server: ServerId, at: Instant) {
        let last = self.last_answer.entry(server).or_insert(at);
        if *last < at {
            *last = at;
        }
    }

    /// Whether `server` is silent for `down_after`: every lease it got has
    /// ended.
    pub(crate) fn is_down(&self, server: ServerId, now: Instant) -> bool {
        let heard = self
            .last_answer
            .get(&server)
            .copied()
            .unwrap_or(self.started);
        now >= heard.max(self.started) + self.timing.down_after
    }

    /// Whether `server` answered within a lease: fit to be promoted.
    fn is_alive(&self, server: ServerId, now: Instant) -> bool {
        self.last_answer
            .get(&server)
            .is_some_and(|heard| now < *heard + self.timing.lease)
    }

    /// The changes that take down servers out of `map`, in set order.
    pub(crate) fn plan(&self, map: &ClusterMap, now: Instant) -> Vec<Change> {
        let mut changes = Vec::new();
        for (set_id, set) in map.sets.iter().enumerate() {
            let set_id = set_id as u16;
            if self.is_down(set.primary, now) {
                let successor = set.members[1..].iter().find(|m| self.is_alive(**m, now));
                match successor {
                    Some(next) => changes.push(Change::Failover {
                        set: set_id,
                        new_primary: *next,
                    }),
                    None => tracing::warn!(
                        "membership: set {set_id}'s primary {} is down and no in-sync member is alive",
                        set.primary
                    ),
                }
            }
            for server in set.members[1..].iter().chain(&set.syncing) {
                if self.is_down(*server, now) {
                    changes.push(Change::RemoveMember {
                        set: set_id,
                        server: *server,
                    });
                }
            }
        }
        changes
    }
}

/// The running detector of one voter; acts only while that voter leads.
pub struct Detector {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Detector {
    /// Start detecting for `membership` (every voter starts one; it sleeps
    /// while its node does not lead, and starts afresh on each new term).
    pub fn start(membership: &Membership, ping: PingFn) -> Detector {
        let timing = membership.timing().clone();
        assert!(
            timing.down_after >= timing.lease + timing.lease_margin,
            "down_after must be at least lease + lease_margin"
        );
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(membership.clone(), ping, stop_rx));
        Detector { stop, task }
    }

    /// Stop detecting and wait for the task to end.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

async fn run(membership: Membership, ping: PingFn, mut stop: watch::Receiver<bool>) {
    let mut node_stopped = membership.stopped();
    let heartbeat = membership.timing().heartbeat;
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut leading: Option<Leading> = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return,
            _ = node_stopped.changed() => return,
        }
        if *stop.borrow() || *node_stopped.borrow() {
            return;
        }
        let term = membership.term();
        if !membership.is_leader() {
            leading = None;
            continue;
        }
        let round = leading.get_or_insert_with(|| Leading::new(&membership, term));
        if round.term != term {
            *round = Leading::new(&membership, term);
        }
        round.round(&membership, &ping).await;
    }
}

/// The detector's state for one term of leadership.
struct Leading {
    term: u64,
    seq: u64,
    tracker: Tracker,
    /// Per server, the latest ping it answered: granted in the next ping.
    grantable: HashMap<ServerId, u64>,
}

impl Leading {
    fn new(membership: &Membership, term: u64) -> Leading {
        tracing::info!(
            "membership: server {} detects failures for term {term}",
            membership.me()
        );
        Leading {
            term,
            seq: 0,
            tracker: Tracker::new(membership.timing(), Instant::now()),
            grantable: HashMap::new(),
        }
    }

    /// One round: confirm leadership, ping everyone, act on the silent.
    async fn round(&mut self, membership: &Membership, ping: &PingFn) {
        // Step 3 of lease.rs: every answer recorded so far arrived before
        // this confirmation started, so it may be granted after it.
        if !membership.confirm_leadership().await {
            return;
        }
        let map = membership.map();
        if !map.is_bootstrapped() {
            return;
        }
        self.seq += 1;
        let timeout = membership.timing().rpc_timeout;
        let pings = (0..map.sets.len() as u16).map(ServerId).map(|server| {
            let message = Ping {
                leader: membership.me().0,
                term: self.term,
                seq: self.seq,
                grant: self.grantable.get(&server).copied(),
            };
            let sent = ping(server, message);
            async move {
                let answered = matches!(tokio::time::timeout(timeout, sent).await, Ok(true));
                (server, answered, Instant::now())
            }
        });
        for (server, answered, at) in join_all(pings).await {
            if answered {
                self.tracker.answered(server, at);
                self.grantable.insert(server, self.seq);
            }
        }
        self.act(membership, map).await;
    }

    /// Propose the changes that take down servers out of `map`.
    async fn act(&self, membership: &Membership, map: ClusterMap) {
        let mut epoch = map.epoch;
        for change in self.tracker.plan(&map, Instant::now()) {
            tracing::warn!("membership: proposing {change:?} at epoch {epoch}");
            match membership.propose(change, epoch).await {
                Ok(next) => epoch = next.epoch,
                // Someone else changed the map: plan again next round.
                Err(MembershipError::Rejected(Rejection::StaleEpoch { .. })) => return,
                Err(e) => {
                    tracing::warn!("membership: failure handling stopped: {e}");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn plan_fails_over_to_the_next_live_member_only_after_down_after() {
        let timing = Timing::default();
        let map = ClusterMap::initial(4, 3);
        let start = Instant::now();
        let mut tracker = Tracker::new(&timing, start);
        // Server 1 never answers; 2 and 3 and 0 answer all along.
        let mut now = start;
        while now < start + timing.down_after + Duration::from_secs(1) {
            for s in [0, 2, 3] {
                tracker.answered(ServerId(s), now);
            }
            let plan = tracker.plan(&map, now);
            if now < start + timing.down_after {
                assert!(plan.is_empty(), "acted before down_after: {plan:?}");
            } else {
                assert_eq!(
                    plan,
                    vec![
                        Change::RemoveMember {
                            set: 0,
                            server: ServerId(1)
                        },
                        // Set 1 is [1, 2, 3]: 2 is next in the chain and alive.
                        Change::Failover {
                            set: 1,
                            new_primary: ServerId(2)
                        },
                        Change::RemoveMember {
                            set: 3,
                            server: ServerId(1)
                        },
                    ]
                );
            }
            now += timing.heartbeat;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn plan_skips_dead_successors() {
        let timing = Timing::default();
        let map = ClusterMap::initial(4, 3);
        let start = Instant::now();
        let mut tracker = Tracker::new(&timing, start);
        let later = start + timing.down_after;
        tracker.answered(ServerId(0), later);
        tracker.answered(ServerId(3), later);
        let plan = tracker.plan(&map, later);
        assert!(
            plan.contains(&Change::Failover {
                set: 1,
                new_primary: ServerId(3)
            }),
            "{plan:?}"
        );
        // Set 2 is [2, 3, 0]: primary down, 3 alive.
        assert!(
            plan.contains(&Change::Failover {
                set: 2,
                new_primary: ServerId(3)
            }),
            "{plan:?}"
        );
    }

    #[test]
    #[should_panic(expected = "down_after must be at least lease + lease_margin")]
    fn down_after_shorter_than_the_lease_is_refused() {
        let timing = Timing {
            down_after: Duration::from_millis(500),
            ..Timing::default()
        };
        Tracker::new(&timing, Instant::now());
    }
}
