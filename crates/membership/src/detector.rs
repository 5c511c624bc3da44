//! Failure detection, the leader side: while this node leads the membership
//! group, ping every server each heartbeat (granting leases, see lease.rs),
//! and when a server has answered nothing for `down_after`, propose its
//! removal: `Failover` of each set it is primary of to the next in-sync
//! member that is alive, `RemoveMember` from each set it only belongs to.
//! Servers ping nobody and clients ping nothing: only the leader sends.
//!
//! A voter silent for `voter_lost_after` is lost for good: with a
//! [`Promotion`], the leader asks a live server that is not a voter (on a
//! host without a voter, where there is one) to join in its place
//! (join.rs), one such move at a time, so the group keeps a majority
//! through the next loss instead of running on its last quorum.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::{join_all, BoxFuture};
use madfs_types::ServerId;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::lease::{LostSet, Ping};
use crate::state::{Change, ClusterMap};
use crate::{Membership, MembershipError, Rejection, Timing};

/// Sends `ping` to a server and resolves to whether it answered (the
/// server's `LeaseHolder::on_ping` ran and its reply came back). The
/// detector bounds each call by `rpc_timeout`.
pub type PingFn = Arc<dyn Fn(ServerId, Ping) -> BoxFuture<'static, bool> + Send + Sync>;

/// Asks server `candidate` to join the group in place of voter `lost`
/// (`Membership::join` with `replaces`, then `become_voter`) and resolves
/// to whether it took the request; the detector bounds the call by
/// `rpc_timeout` and then watches the voter set.
pub type PromoteFn = Arc<dyn Fn(ServerId, ServerId) -> BoxFuture<'static, bool> + Send + Sync>;

/// How the leader moves a lost voter's place to a live server.
pub struct Promotion {
    pub promote: PromoteFn,
    /// Each server's host (by server id; `None`: a host of its own), so
    /// that a voter goes to a host that has none.
    pub hosts: Vec<Option<String>>,
}

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

    /// Whether `server` answered nothing for `span` (a server never heard
    /// from counts as heard when this node started leading).
    fn silent_for(&self, server: ServerId, span: std::time::Duration, now: Instant) -> bool {
        let heard = self
            .last_answer
            .get(&server)
            .copied()
            .unwrap_or(self.started);
        now >= heard.max(self.started) + span
    }

    /// Whether `server` is silent for `down_after`: every lease it got has
    /// ended.
    pub(crate) fn is_down(&self, server: ServerId, now: Instant) -> bool {
        self.silent_for(server, self.timing.down_after, now)
    }

    /// Whether voter `server` is silent for `voter_lost_after`.
    fn is_lost(&self, server: ServerId, now: Instant) -> bool {
        self.silent_for(server, self.timing.voter_lost_after, now)
    }

    /// A voter lost for good and the live server (of `servers`, not a
    /// voter, not in `declined`) to take its place: one on a host with no
    /// live voter where there is one, else any (two voters on one host
    /// still survive more losses than a dead voter does); the lowest id
    /// among equals.
    pub(crate) fn voter_move(
        &self,
        voters: &[ServerId],
        servers: u16,
        hosts: &[Option<String>],
        declined: &HashSet<ServerId>,
        now: Instant,
    ) -> Option<(ServerId, ServerId)> {
        let lost = *voters.iter().find(|v| self.is_lost(**v, now))?;
        let host = |s: ServerId| hosts.get(s.0 as usize).cloned().flatten();
        let voter_hosts: Vec<String> = voters
            .iter()
            .filter(|v| !self.is_lost(**v, now))
            .filter_map(|v| host(*v))
            .collect();
        let mut candidates = (0..servers)
            .map(ServerId)
            .filter(|s| !voters.contains(s) && !declined.contains(s) && self.is_alive(*s, now));
        let on_free_host = candidates
            .clone()
            .find(|s| host(*s).map_or(true, |h| !voter_hosts.contains(&h)));
        on_free_host
            .or_else(|| candidates.next())
            .map(|c| (lost, c))
    }

    /// Whether `server` answered within a lease: fit to be promoted.
    fn is_alive(&self, server: ServerId, now: Instant) -> bool {
        self.last_answer
            .get(&server)
            .is_some_and(|heard| now < *heard + self.timing.lease)
    }

    /// The sets of `map` whose primary is down and no in-sync member
    /// alive, with how long none of them has answered: a call to such a
    /// set can only wait for one to come back (`plan` keeps them listed).
    pub(crate) fn lost_sets(&self, map: &ClusterMap, now: Instant) -> Vec<LostSet> {
        map.sets
            .iter()
            .enumerate()
            .filter(|(_, set)| {
                self.is_down(set.primary, now)
                    && !set.members[1..].iter().any(|m| self.is_alive(*m, now))
            })
            .map(|(id, set)| {
                let heard = set
                    .members
                    .iter()
                    .map(|m| self.last_answer.get(m).copied().unwrap_or(self.started))
                    .max()
                    .unwrap_or(self.started)
                    .max(self.started);
                LostSet {
                    set: id as u16,
                    silent_ms: now.saturating_duration_since(heard).as_millis() as u64,
                }
            })
            .collect()
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
                    None => {
                        tracing::warn!(
                            "membership: set {set_id}'s primary {} is down and no in-sync member is alive",
                            set.primary
                        );
                        // Its other members stay: one of them may be the
                        // only copy of what the primary acknowledged (a
                        // power cut loses the primary's unsynced writes),
                        // and the first back takes the set over. Taken
                        // out, the primary back from a power cut would be
                        // all the set had (the replicated simulation,
                        // seed 5197: a file lost on a lossy network).
                        continue;
                    }
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
        Detector::start_with(membership, ping, None)
    }

    /// [`Detector::start`], moving a lost voter's place to a live server
    /// through `promotion`.
    pub fn start_promoting(
        membership: &Membership,
        ping: PingFn,
        promotion: Promotion,
    ) -> Detector {
        Detector::start_with(membership, ping, Some(Arc::new(promotion)))
    }

    fn start_with(
        membership: &Membership,
        ping: PingFn,
        promotion: Option<Arc<Promotion>>,
    ) -> Detector {
        let timing = membership.timing().clone();
        assert!(
            timing.down_after >= timing.lease + timing.lease_margin,
            "down_after must be at least lease + lease_margin"
        );
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(membership.clone(), ping, promotion, stop_rx));
        Detector { stop, task }
    }

    /// Stop detecting and wait for the task to end.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

async fn run(
    membership: Membership,
    ping: PingFn,
    promotion: Option<Arc<Promotion>>,
    mut stop: watch::Receiver<bool>,
) {
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
        round.round(&membership, &ping, promotion.as_ref()).await;
    }
}

/// The detector's state for one term of leadership.
struct Leading {
    term: u64,
    seq: u64,
    tracker: Tracker,
    /// Per server, the latest ping it answered: granted in the next ping.
    grantable: HashMap<ServerId, u64>,
    /// The move of a lost voter's place under way: one at a time.
    promoting: Option<JoinHandle<()>>,
    /// Servers that did not take a lost voter's place when asked (one
    /// with a Raft node of its own already, a voter's that moved away):
    /// the next move asks another.
    declined: Arc<std::sync::Mutex<HashSet<ServerId>>>,
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
            promoting: None,
            declined: Arc::default(),
        }
    }

    /// Ask a live server to take the place of a voter lost for good,
    /// unless such a move is under way (it ends once the lost voter votes
    /// no more, or after `join_timeout` and `propose_timeout`).
    fn move_lost_voter(
        &mut self,
        membership: &Membership,
        promotion: &Arc<Promotion>,
        servers: u16,
    ) {
        if self.promoting.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let voters = membership.voters();
        let now = Instant::now();
        let declined = self
            .declined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some((lost, candidate)) =
            self.tracker
                .voter_move(&voters, servers, &promotion.hosts, &declined, now)
        else {
            return;
        };
        let timing = membership.timing().clone();
        tracing::warn!(
            "membership: voter {lost} answered nothing for {:?}: asking server {candidate} to take its place",
            timing.voter_lost_after
        );
        let (membership, promotion) = (membership.clone(), promotion.clone());
        let declined = self.declined.clone();
        self.promoting = Some(tokio::spawn(async move {
            let deadline = now + timing.join_timeout + timing.propose_timeout;
            let asked =
                tokio::time::timeout(timing.rpc_timeout, (promotion.promote)(candidate, lost))
                    .await;
            if !matches!(asked, Ok(true)) {
                tracing::warn!("membership: server {candidate} did not take voter {lost}'s place");
                declined
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(candidate);
                return;
            }
            let stopped = membership.stopped();
            while Instant::now() < deadline
                && membership.voters().contains(&lost)
                && !*stopped.borrow()
            {
                tokio::time::sleep(timing.heartbeat).await;
            }
        }));
    }

    /// One round: confirm leadership, ping everyone, act on the silent
    /// (and, with `promotion`, on a voter lost for good).
    async fn round(
        &mut self,
        membership: &Membership,
        ping: &PingFn,
        promotion: Option<&Arc<Promotion>>,
    ) {
        // Step 3 of lease.rs: every answer recorded so far arrived before
        // this confirmation started, so it may be granted after it.
        if !membership.confirm_leadership().await {
            return;
        }
        let map = membership.map();
        if !map.is_bootstrapped() {
            return;
        }
        let servers = map.sets.len() as u16;
        self.seq += 1;
        let timeout = membership.timing().rpc_timeout;
        let lost = self.tracker.lost_sets(&map, Instant::now());
        let pings = (0..servers).map(ServerId).map(|server| {
            let message = Ping {
                leader: membership.me().0,
                term: self.term,
                seq: self.seq,
                grant: self.grantable.get(&server).copied(),
                lost: lost.clone(),
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
        if let Some(promotion) = promotion {
            self.move_lost_voter(membership, promotion, servers);
        }
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

    #[tokio::test(start_paused = true)]
    async fn a_set_is_lost_once_its_primary_is_down_and_no_member_alive() {
        let timing = Timing::default();
        // 4 servers, 2 copies: set s is [s, s + 1].
        let map = ClusterMap::initial(4, 2);
        let start = Instant::now();
        let mut tracker = Tracker::new(&timing, start);
        // Servers 1 and 2 answer once, 1 s in, and never again.
        let heard = start + Duration::from_secs(1);
        for s in 0..4 {
            tracker.answered(ServerId(s), heard);
        }
        let mut now = heard;
        while now < heard + timing.down_after + Duration::from_secs(5) {
            for s in [0, 3] {
                tracker.answered(ServerId(s), now);
            }
            let lost = tracker.lost_sets(&map, now);
            if now < heard + timing.down_after {
                // Set 1 ([1, 2]) is not lost before its primary is down;
                // sets 0 and 2 have a live member.
                assert!(lost.is_empty(), "lost too soon: {lost:?}");
            } else {
                assert_eq!(
                    lost,
                    vec![LostSet {
                        set: 1,
                        silent_ms: (now - heard).as_millis() as u64
                    }]
                );
            }
            now += timing.heartbeat;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_voters_place_goes_to_a_live_server_on_a_host_without_a_voter() {
        let timing = Timing::default();
        let start = Instant::now();
        let mut tracker = Tracker::new(&timing, start);
        let voters = [ServerId(0), ServerId(2), ServerId(4)];
        let none = HashSet::new();
        // Hosts: a = {0, 1}, b = {2, 3}, c = {4, 5}, d = {6}.
        let hosts: Vec<Option<String>> = ["a", "a", "b", "b", "c", "c", "d"]
            .iter()
            .map(|h| Some(h.to_string()))
            .collect();
        let lost_at = start + timing.voter_lost_after;
        // Host c dies; every other server answers all along.
        let mut now = start;
        while now <= lost_at + timing.heartbeat {
            for s in [0, 1, 2, 3, 6] {
                tracker.answered(ServerId(s), now);
            }
            let moved = tracker.voter_move(&voters, 7, &hosts, &none, now);
            if now < lost_at {
                assert_eq!(moved, None, "moved before voter_lost_after");
            } else {
                // 1 and 3 share a host with a live voter; 6 does not.
                assert_eq!(moved, Some((ServerId(4), ServerId(6))));
            }
            now += timing.heartbeat;
        }
        // Without host d, a server beside a live voter still beats a
        // dead voter; a dead server never takes the place.
        assert_eq!(
            tracker.voter_move(&voters, 6, &hosts, &none, now),
            Some((ServerId(4), ServerId(1)))
        );
        assert_eq!(
            tracker
                .voter_move(&voters, 5, &hosts[..5], &none, now)
                .map(|m| m.0),
            Some(ServerId(4))
        );
        // A server that declined is passed over for the next.
        let declined: HashSet<ServerId> = [ServerId(6)].into();
        assert_eq!(
            tracker.voter_move(&voters, 7, &hosts, &declined, now),
            Some((ServerId(4), ServerId(1)))
        );
        let only_dead = [ServerId(0), ServerId(1), ServerId(4)];
        assert_eq!(
            tracker.voter_move(&only_dead, 2, &hosts, &none, now),
            None,
            "no live server that is not a voter"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_set_whose_primary_and_members_are_all_down_keeps_its_members() {
        let timing = Timing::default();
        let map = ClusterMap::initial(3, 2);
        let start = Instant::now();
        let tracker = Tracker::new(&timing, start);
        // Nobody answered: set 0 is [0, 1], both down. Taking 1 out would
        // leave the primary, maybe back from a power cut, the only copy.
        let plan = tracker.plan(&map, start + timing.down_after);
        assert!(
            !plan
                .iter()
                .any(|c| matches!(c, Change::RemoveMember { .. })),
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
