//! The detector and leases together: a server that stops answering is
//! failed over only after `down_after`, and only once its lease is over;
//! the same when the server that dies is the membership leader itself.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madfs_types::ServerId;
use tokio::time::Instant;

use super::Group;
use crate::{ClusterMap, Detector, LeaseHolder, PingFn, PromoteFn, Promotion};

/// Every server's lease holder, and the servers whose process is "dead"
/// (they receive no pings).
struct Servers {
    holders: Vec<Arc<LeaseHolder>>,
    dead: Arc<Mutex<HashSet<ServerId>>>,
}

impl Servers {
    fn new(group: &Group, count: u16) -> Servers {
        Servers {
            holders: (0..count)
                .map(|_| Arc::new(LeaseHolder::new(&group.timing)))
                .collect(),
            dead: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// The pings of `group`'s detectors, over its network's partitions.
    fn ping(&self, group: &Group) -> PingFn {
        let net = group.net.clone();
        let holders = self.holders.clone();
        let dead = self.dead.clone();
        Arc::new(move |to: ServerId, ping| {
            let net = net.clone();
            let holders = holders.clone();
            let dead = dead.clone();
            Box::pin(async move {
                let is_dead = dead.lock().expect("no panic holding it").contains(&to);
                if is_dead || !net.delivers(ServerId(ping.leader), to) {
                    return false;
                }
                holders[to.0 as usize].on_ping(&ping);
                true
            })
        })
    }

    fn kill(&self, server: ServerId) {
        self.dead
            .lock()
            .expect("no panic holding it")
            .insert(server);
    }

    fn all_leased(&self, except: ServerId) -> bool {
        self.holders
            .iter()
            .enumerate()
            .all(|(s, h)| s == except.0 as usize || h.has_lease())
    }
}

/// Wait on `group`'s node `watcher` until `set` has another primary than
/// `old`; return the map and when it was applied there.
async fn wait_failover(
    group: &Group,
    watcher: ServerId,
    set: usize,
    old: ServerId,
) -> (ClusterMap, Instant) {
    let mut maps = group.node(watcher).subscribe();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        {
            let map = maps.borrow_and_update();
            if map.is_bootstrapped() && map.sets[set].primary != old {
                return (map.clone(), Instant::now());
            }
        }
        let changed = tokio::time::timeout_at(deadline, maps.changed()).await;
        assert!(
            matches!(changed, Ok(Ok(()))),
            "no failover of set {set} within 30 s"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_primary_is_failed_over_after_down_after_and_after_its_lease() {
    let group = Group::start(3, 4, 2, 11).await;
    let all: Vec<ServerId> = group.voters.clone();
    let servers = Servers::new(&group, 4);
    let detectors: Vec<Detector> = group
        .nodes
        .values()
        .map(|n| Detector::start(n, servers.ping(&group)))
        .collect();
    let leader = group.wait_leader(&all).await;
    group.wait_converged().await;
    group
        .wait_until(
            "every server holds a lease",
            Duration::from_secs(10),
            |_| servers.all_leased(ServerId(99)),
        )
        .await;
    // Server 3 (not a voter) is primary of set 3 = [3, 0] and member of
    // set 2 = [2, 3]. Its process dies.
    let victim = ServerId(3);
    let died_at = Instant::now();
    servers.kill(victim);
    let (map, promoted_at) = wait_failover(&group, leader, 3, victim).await;
    let timing = &group.timing;
    assert_eq!(map.sets[3].members, vec![ServerId(0)]);
    let lease_end = servers.holders[3].lease_until().expect("it held a lease");
    assert!(
        lease_end <= promoted_at,
        "the old primary's lease ran until {:?} after its death, past the promotion at {:?}",
        lease_end - died_at,
        promoted_at - died_at
    );
    assert!(!servers.holders[3].has_lease());
    // Its last answer was at most a round before it died.
    assert!(
        promoted_at >= died_at + timing.down_after - 2 * timing.heartbeat,
        "promoted {:?} after the death, before down_after",
        promoted_at - died_at
    );
    assert!(promoted_at <= died_at + timing.down_after + Duration::from_secs(1));
    // Set 2 drops it as a member too, and nobody else lost anything.
    let map = group.wait_converged().await;
    assert_eq!(map.sets[2].members, vec![ServerId(2)]);
    assert!(
        servers.all_leased(victim),
        "healthy servers keep their leases"
    );
    for detector in detectors {
        detector.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn when_the_leader_dies_the_next_leader_fails_it_over_only_after_its_lease() {
    let mut group = Group::start(3, 4, 2, 12).await;
    let all: Vec<ServerId> = group.voters.clone();
    let servers = Servers::new(&group, 4);
    let mut detectors = Vec::new();
    for node in group.nodes.values() {
        detectors.push(Detector::start(node, servers.ping(&group)));
    }
    let leader = group.wait_leader(&all).await;
    group.wait_converged().await;
    group
        .wait_until(
            "every server holds a lease",
            Duration::from_secs(10),
            |_| servers.all_leased(ServerId(99)),
        )
        .await;
    let died_at = Instant::now();
    servers.kill(leader);
    group.kill(leader).await;
    let rest: Vec<ServerId> = all.iter().copied().filter(|v| *v != leader).collect();
    let (map, promoted_at) = wait_failover(&group, rest[0], leader.0 as usize, leader).await;
    let lease_end = servers.holders[leader.0 as usize]
        .lease_until()
        .expect("it held a lease");
    assert!(
        lease_end <= promoted_at,
        "promoted while the dead leader's lease ran"
    );
    assert!(
        promoted_at >= died_at + group.timing.down_after,
        "a new leader waits down_after from its start"
    );
    assert_eq!(map.sets[leader.0 as usize].members.len(), 1);
    for detector in detectors {
        detector.stop().await;
    }
}

/// A voter lost for good (its process dies and never comes back) is
/// replaced by a live server that was no voter, asked by the leader's
/// detector only after `voter_lost_after`, once; the group then survives
/// the loss of a second original voter, which would otherwise have left
/// it without a majority.
#[tokio::test(start_paused = true)]
async fn a_voter_lost_for_good_moves_to_a_live_server_and_the_group_survives_the_next_loss() {
    let mut group = Group::start(3, 5, 2, 14).await;
    let all: Vec<ServerId> = group.voters.clone();
    let servers = Servers::new(&group, 5);
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let promote: PromoteFn = Arc::new(move |candidate, lost| {
        let tx = asked_tx.clone();
        Box::pin(async move { tx.send((candidate, lost, Instant::now())).is_ok() })
    });
    let mut detectors: Vec<Detector> = group
        .nodes
        .values()
        .map(|n| {
            let promotion = Promotion {
                promote: promote.clone(),
                hosts: Vec::new(),
            };
            Detector::start_promoting(n, servers.ping(&group), promotion)
        })
        .collect();
    let leader = group.wait_leader(&all).await;
    let map = group.wait_converged().await;
    let lost = *all.iter().find(|v| **v != leader).expect("a follower");
    let died_at = Instant::now();
    servers.kill(lost);
    group.kill(lost).await;

    let timing = group.timing.clone();
    let (candidate, named, asked_at) =
        tokio::time::timeout(timing.voter_lost_after * 2, asked.recv())
            .await
            .expect("the leader asks a server to take the lost voter's place")
            .expect("the detectors run");
    assert_eq!(named, lost);
    assert!(!all.contains(&candidate), "asked voter {candidate}");
    assert!(
        asked_at >= died_at + timing.voter_lost_after - 2 * timing.heartbeat,
        "asked {:?} after the death, before voter_lost_after",
        asked_at - died_at
    );
    // Failover of the lost server's sets went first, after down_after.
    let moved = group.wait_converged().await;
    assert_ne!(moved.sets[lost.0 as usize].primary, lost);

    let node = group.join_node_replacing(candidate, Some(lost)).await;
    node.become_voter()
        .await
        .expect("the candidate becomes a voter");
    let mut three: Vec<ServerId> = all.iter().copied().filter(|v| *v != lost).collect();
    three.push(candidate);
    three.sort();
    group
        .wait_until(
            "every node sees the lost voter replaced",
            Duration::from_secs(30),
            |g| g.nodes.values().all(|n| n.voters() == three),
        )
        .await;
    detectors.push(Detector::start_promoting(
        &node,
        servers.ping(&group),
        Promotion {
            promote: promote.clone(),
            hosts: Vec::new(),
        },
    ));
    // One move per lost voter: nobody is asked again.
    let again = tokio::time::timeout(timing.voter_lost_after * 2, asked.recv()).await;
    assert!(again.is_err(), "asked again: {again:?}");

    // The leader, an original voter, dies too: the last original voter
    // and the new one are the majority that commits.
    servers.kill(leader);
    group.kill(leader).await;
    let rest: Vec<ServerId> = three.iter().copied().filter(|v| *v != leader).collect();
    group.wait_leader(&rest).await;
    let now = group.wait_converged().await;
    let next = group
        .node(candidate)
        .propose(super::some_change(&now, 3), now.epoch)
        .await
        .expect("two of three commit, the new voter among them");
    assert!(next.epoch > map.epoch);
    for detector in detectors {
        detector.stop().await;
    }
}
