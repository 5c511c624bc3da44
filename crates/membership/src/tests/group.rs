//! The Raft group's guarantees: election and replication, compare-and-set
//! on the epoch, no committed map lost when the leader dies, no commit by
//! a partitioned leader, recovery of log and vote from disk, and
//! `fetch_map` for servers that are not voters.

use std::time::Duration;

use madfs_types::ServerId;

use super::{some_change, Group};
use crate::{fetch_map, Change, MembershipError, Rejection};

const S0: ServerId = ServerId(0);
const S1: ServerId = ServerId(1);
const S2: ServerId = ServerId(2);
const ALL: [ServerId; 3] = [S0, S1, S2];

#[tokio::test(start_paused = true)]
async fn three_voters_elect_a_leader_and_replicate_proposals() {
    let group = Group::start(3, 4, 2, 1).await;
    let leader = group.wait_leader(&ALL).await;
    let start = group.wait_converged().await;
    assert_eq!(
        start, group.initial,
        "the bootstrap map is committed once, as given"
    );
    // One proposal made on the leader, one on a follower (forwarded).
    let follower = *ALL.iter().find(|v| **v != leader).expect("a follower");
    let first = group
        .node(leader)
        .propose(some_change(&start, 1), 1)
        .await
        .expect("applied");
    assert_eq!(first.epoch, 2);
    let second = group
        .node(follower)
        .propose(some_change(&first, 5), 2)
        .await
        .expect("applied through the leader");
    assert_eq!(second.epoch, 3);
    let converged = group.wait_converged().await;
    assert_eq!(converged, second);
    assert_eq!(group.node(follower).read_map().await, Ok(second));
}

#[tokio::test(start_paused = true)]
async fn a_change_against_a_stale_epoch_is_rejected() {
    let group = Group::start(3, 4, 2, 2).await;
    group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;
    let applied = group
        .node(S0)
        .propose(some_change(&map, 1), map.epoch)
        .await
        .expect("applied");
    let stale = group
        .node(S1)
        .propose(some_change(&map, 2), map.epoch)
        .await;
    assert_eq!(
        stale,
        Err(MembershipError::Rejected(Rejection::StaleEpoch {
            expected: map.epoch,
            current: applied.epoch
        }))
    );
    // Two proposers racing on one epoch: exactly one wins.
    let map = group.wait_converged().await;
    let (a, b) = tokio::join!(
        group.node(S1).propose(some_change(&map, 3), map.epoch),
        group.node(S2).propose(some_change(&map, 7), map.epoch),
    );
    assert!(
        a.is_ok() != b.is_ok(),
        "one of two racing proposals wins: {a:?} / {b:?}"
    );
    let loser = if a.is_ok() { b } else { a };
    assert!(matches!(
        loser,
        Err(MembershipError::Rejected(Rejection::StaleEpoch { .. }))
    ));
    // A change the state machine refuses is not applied either.
    let map = group.wait_converged().await;
    let primary = map.sets[0].primary;
    let refused = group
        .node(S0)
        .propose(
            Change::RemoveMember {
                set: 0,
                server: primary,
            },
            map.epoch,
        )
        .await;
    assert!(matches!(
        refused,
        Err(MembershipError::Rejected(Rejection::IsPrimary { .. }))
    ));
    assert_eq!(
        group.node(S0).read_map().await.map(|m| m.epoch),
        Ok(map.epoch)
    );
}

#[tokio::test(start_paused = true)]
async fn killing_the_leader_elects_another_and_loses_nothing_committed() {
    let mut group = Group::start(3, 4, 3, 3).await;
    let old_leader = group.wait_leader(&ALL).await;
    let mut map = group.wait_converged().await;
    for pick in 0..5 {
        map = group
            .node(old_leader)
            .propose(some_change(&map, pick), map.epoch)
            .await
            .expect("applied");
    }
    let acked = map.clone();
    group.kill(old_leader).await;
    let rest: Vec<ServerId> = ALL.iter().copied().filter(|v| *v != old_leader).collect();
    let new_leader = group.wait_leader(&rest).await;
    assert_ne!(new_leader, old_leader);
    let read = group
        .node(rest[0])
        .read_map()
        .await
        .expect("the survivors serve reads");
    assert_eq!(read, acked, "every acknowledged change survived the leader");
    let next = group
        .node(rest[1])
        .propose(some_change(&read, 9), read.epoch)
        .await
        .expect("applied");
    // The old leader comes back and catches up.
    group.start_node(old_leader).await;
    assert_eq!(group.wait_converged().await, next);
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_cannot_commit_and_converges_after_healing() {
    let group = Group::start(3, 4, 2, 4).await;
    let old_leader = group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;
    group.net.isolate(old_leader);
    let rest: Vec<ServerId> = ALL.iter().copied().filter(|v| *v != old_leader).collect();
    let (lost, won) = tokio::join!(
        group
            .node(old_leader)
            .propose(some_change(&map, 1), map.epoch),
        async {
            let new_leader = group.wait_leader(&rest).await;
            group
                .node(new_leader)
                .propose(some_change(&map, 2), map.epoch)
                .await
        }
    );
    assert!(
        matches!(lost, Err(MembershipError::Timeout { .. })),
        "a leader cut off from the quorum commits nothing: {lost:?}"
    );
    let won = won.expect("the majority commits");
    assert_eq!(won.epoch, map.epoch + 1);
    group.net.heal();
    assert_eq!(
        group.wait_converged().await,
        won,
        "the old leader's entry was overwritten"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_voter_keeps_its_log_vote_and_snapshot() {
    let mut group = Group::on_disk(3, 4, 3);
    group.snapshot_every_entries = 8;
    group.start_all().await;
    let leader = group.wait_leader(&ALL).await;
    let mut map = group.wait_converged().await;
    for pick in 0..20 {
        map = group
            .node(leader)
            .propose(some_change(&map, pick), map.epoch)
            .await
            .expect("applied");
    }
    group.wait_converged().await;
    let voter = *ALL.iter().find(|v| **v != leader).expect("a follower");
    group
        .wait_until(
            "the follower compacts its log",
            Duration::from_secs(10),
            |g| {
                let (snapshot, purged) = g.node(voter).snapshot_and_purged();
                snapshot.is_some() && purged.is_some()
            },
        )
        .await;
    let vote = group.node(voter).vote();
    let last_log = group.node(voter).last_log_index();
    group.kill(voter).await;
    // Restart cut off from the others: what it has is what its disk kept.
    group.net.isolate(voter);
    group.start_node(voter).await;
    let restarted = group.node(voter);
    assert_eq!(restarted.vote(), vote, "the vote survived the restart");
    assert!(
        restarted.last_log_index() >= last_log,
        "the log survived the restart"
    );
    group
        .wait_until(
            "the restarted voter reapplies its committed log",
            Duration::from_secs(10),
            |g| g.node(voter).map() == map,
        )
        .await;
    // While it is away, the others move on past what their logs keep, so
    // it catches up from a snapshot when it returns.
    for pick in 20..40 {
        map = group
            .node(leader)
            .propose(some_change(&map, pick), map.epoch)
            .await
            .expect("applied");
    }
    group.net.heal();
    assert_eq!(group.wait_converged().await, map);
}

#[tokio::test(start_paused = true)]
async fn fetch_map_follows_leader_changes() {
    let mut group = Group::start(3, 5, 2, 5).await;
    let outsider = group.net.transport(ServerId(4));
    let leader = group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;
    let timeout = Duration::from_secs(10);
    assert_eq!(fetch_map(&ALL, &*outsider, timeout).await, Ok(map.clone()));
    let next = group
        .node(leader)
        .propose(some_change(&map, 3), map.epoch)
        .await
        .expect("applied");
    assert_eq!(fetch_map(&ALL, &*outsider, timeout).await, Ok(next.clone()));
    group.kill(leader).await;
    let rest: Vec<ServerId> = ALL.iter().copied().filter(|v| *v != leader).collect();
    let new_leader = group.wait_leader(&rest).await;
    let last = group
        .node(new_leader)
        .propose(some_change(&next, 4), next.epoch)
        .await
        .expect("applied");
    // The dead leader is listed first: fetch_map must move past it.
    let mut voters = vec![leader];
    voters.extend(&rest);
    assert_eq!(fetch_map(&voters, &*outsider, timeout).await, Ok(last));
}
