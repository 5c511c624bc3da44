//! Replacing a voter whose store is lost, and growing the group, guards
//! against a replacement that answers in its predecessor's name (a second
//! vote in a term the dead node voted in), against a replaced node still
//! counting in a quorum, and against an abandoned join leaving the group
//! stuck in between.

use std::collections::BTreeSet;
use std::time::Duration;

use madfs_types::ServerId;
use openraft::raft::VoteRequest;
use openraft::{EmptyNode, Vote};

use super::{some_change, Group};
use crate::network::call;
use crate::wire::{Reply, Request};
use crate::MembershipError;

const ALL: [ServerId; 3] = [ServerId(0), ServerId(1), ServerId(2)];
const WAIT: Duration = Duration::from_secs(30);

fn others(of: &[ServerId], except: &[ServerId]) -> Vec<ServerId> {
    of.iter().copied().filter(|s| !except.contains(s)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_replacement_voter_counts_in_the_quorum_and_its_predecessor_never_again() {
    let mut group = Group::start(3, 4, 2, 11).await;
    let leader = group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;
    let victim = others(&ALL, &[leader])[0];
    let old_node = group.node(victim).node_id();
    assert_eq!(
        old_node, victim.0 as u64,
        "original voters are incarnation 0"
    );

    // The victim's host dies with its store; a new process starts under
    // the same server id on an empty one.
    group.kill(victim).await;
    group.wipe(victim);
    let replacement = group.join_node(victim).await;
    assert_ne!(replacement.incarnation(), 0);
    assert_ne!(replacement.node_id(), old_node);
    // Two asks at once (a retry racing the first) both end well.
    let (first, second) = tokio::join!(replacement.become_voter(), replacement.become_voter());
    first.expect("the replacement becomes a voter");
    second.expect("asking again is harmless");
    assert_eq!(
        replacement.voters(),
        ALL.to_vec(),
        "the group keeps its size"
    );
    let new_node = replacement.node_id();
    group
        .wait_until("every node sees the new voter set", WAIT, |g| {
            g.nodes.values().all(|n| {
                let nodes = n.member_nodes();
                n.voter_nodes().contains(&new_node) && !nodes.contains(&old_node)
            })
        })
        .await;

    // The group commits, and the replacement holds the same map.
    let next = group
        .node(leader)
        .propose(some_change(&map, 1), map.epoch)
        .await
        .expect("applied");
    assert_eq!(group.wait_converged().await, next);

    // A message for the old incarnation is refused, not acted on: the
    // replacement's vote stays as it was.
    let vote = replacement.vote();
    let stale = VoteRequest::new(Vote::new(vote.leader_id().term + 10, leader.0 as u64), None);
    let net = group.net.transport(leader);
    let reply = call(
        &*net,
        victim,
        Some(old_node),
        Request::Vote(stale.clone()),
        Duration::from_secs(1),
    )
    .await;
    assert!(
        matches!(reply, Ok(Reply::WrongNode { me }) if me == new_node),
        "{reply:?}"
    );
    // A Raft message that names no node is refused too.
    let reply = call(
        &*net,
        victim,
        None,
        Request::Vote(stale),
        Duration::from_secs(1),
    )
    .await;
    assert!(matches!(reply, Ok(Reply::WrongNode { .. })), "{reply:?}");
    assert_eq!(replacement.vote(), vote, "the refused vote changed nothing");

    // Kill the leader too: the replacement and the last original voter
    // must elect a leader and commit, so the replacement counts.
    group.kill(leader).await;
    let rest = others(&ALL, &[leader]);
    group.wait_leader(&rest).await;
    let after = group
        .node(victim)
        .propose(some_change(&next, 2), next.epoch)
        .await
        .expect("two of three commit, the replacement among them");

    // A restart of the replacement from its store is the same node.
    group.start_node(leader).await;
    let incarnation = replacement.incarnation();
    group.kill(victim).await;
    group.start_node(victim).await;
    assert_eq!(group.node(victim).incarnation(), incarnation);
    assert_eq!(group.node(victim).node_id(), new_node);
    let last = group
        .node(victim)
        .propose(some_change(&after, 3), after.epoch)
        .await
        .expect("applied");
    assert_eq!(group.wait_converged().await, last);
    // Its store is now the replacement's: `join` on it keeps it too.
    group.kill(victim).await;
    let rejoined = group.join_node(victim).await;
    assert_eq!(rejoined.node_id(), new_node);
    rejoined.become_voter().await.expect("already a voter");
}

/// How the first of two replacements dies.
#[derive(Clone, Copy, Debug)]
enum FirstDies {
    /// After the leader made it a learner and before any voter change
    /// (step 1 of a join, done here directly so the timing is certain).
    AsALearner,
    /// While its own `become_voter` runs, once the leader lists it: as a
    /// learner or already a voter, whichever the race gives.
    WhileJoining,
}

#[tokio::test(start_paused = true)]
async fn a_second_replacement_while_the_first_joins_leaves_one_voter_per_server() {
    for (seed, dies) in [(12, FirstDies::AsALearner), (13, FirstDies::WhileJoining)] {
        second_replacement(seed, dies).await;
    }
}

async fn second_replacement(seed: u64, dies: FirstDies) {
    let mut group = Group::start(3, 4, 2, seed).await;
    let leader = group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;
    let victim = others(&ALL, &[leader])[0];
    let old_node = group.node(victim).node_id();
    group.kill(victim).await;
    group.wipe(victim);

    let first = group.join_node(victim).await;
    let first_node = first.node_id();
    let joining = match dies {
        FirstDies::AsALearner => {
            let raft = &group.node(leader).inner.raft;
            raft.add_learner(first_node, EmptyNode::new(), false)
                .await
                .expect("the leader adds a learner");
            None
        }
        FirstDies::WhileJoining => Some(tokio::spawn({
            let first = first.clone();
            async move { first.become_voter().await }
        })),
    };
    group
        .wait_until("the leader adds the first replacement", WAIT, |g| {
            g.node(leader).member_nodes().contains(&first_node)
        })
        .await;
    group.kill(victim).await;
    if let Some(joining) = joining {
        let ended = joining.await.expect("the join task ends");
        assert!(
            matches!(ended, Ok(()) | Err(MembershipError::ShutDown)),
            "{dies:?}: {ended:?}"
        );
    }

    // A second replacement, on a fresh store again.
    group.wipe(victim);
    let second = group.join_node(victim).await;
    let second_node = second.node_id();
    assert_ne!(second_node, first_node);
    second
        .become_voter()
        .await
        .expect("the second replacement becomes a voter");
    let mut expected: BTreeSet<u64> = others(&ALL, &[victim]).iter().map(|s| s.0 as u64).collect();
    expected.insert(second_node);
    assert!(!expected.contains(&old_node));
    group
        .wait_until(
            "every node sees one node per server, no stale one",
            WAIT,
            |g| {
                g.nodes
                    .values()
                    .all(|n| n.voter_nodes() == expected && n.member_nodes() == expected)
            },
        )
        .await;
    let next = group
        .node(victim)
        .propose(some_change(&map, 4), map.epoch)
        .await
        .expect("applied");
    assert_eq!(group.wait_converged().await, next, "{dies:?}");
    for node in group.nodes.values() {
        node.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_server_joins_as_a_fourth_voter_and_a_stateful_store_cannot_join() {
    let mut group = Group::start(3, 5, 2, 13).await;
    let leader = group.wait_leader(&ALL).await;
    let map = group.wait_converged().await;

    // An original voter's store holds Raft state: it must not take a new
    // identity (it would drop its votes for nothing).
    let stateful = others(&ALL, &[leader])[0];
    group.kill(stateful).await;
    assert!(matches!(
        group.join_refused(stateful).await,
        MembershipError::Config(_)
    ));
    group.start_node(stateful).await;

    let newcomer = ServerId(3);
    let node = group.join_node(newcomer).await;
    node.become_voter().await.expect("server 3 becomes a voter");
    let four = vec![ServerId(0), ServerId(1), ServerId(2), newcomer];
    group
        .wait_until("every node sees four voters", WAIT, |g| {
            g.nodes.values().all(|n| n.voters() == four)
        })
        .await;
    let next = group
        .node(newcomer)
        .propose(some_change(&map, 5), map.epoch)
        .await
        .expect("applied");
    assert_eq!(group.wait_converged().await, next);
    // With four voters, two down leave no quorum; one down still commits.
    group.kill(leader).await;
    let rest = others(&four, &[leader]);
    group.wait_leader(&rest).await;
    group
        .node(newcomer)
        .propose(some_change(&next, 6), next.epoch)
        .await
        .expect("three of four commit");
}

/// A server takes the place of a voter lost for good (another server id):
/// the group keeps three voters; a second server sent to take the same
/// place later is refused rather than growing the group to four.
#[tokio::test(start_paused = true)]
async fn a_lost_voters_place_is_taken_once_and_a_second_taker_is_refused() {
    let mut group = Group::start(3, 5, 2, 15).await;
    let leader = group.wait_leader(&ALL).await;
    group.wait_converged().await;
    let lost = others(&ALL, &[leader])[0];
    group.kill(lost).await;

    let first = group.join_node_replacing(ServerId(3), Some(lost)).await;
    first
        .become_voter()
        .await
        .expect("server 3 takes the place");
    let mut three = others(&ALL, &[lost]);
    three.push(ServerId(3));
    group
        .wait_until("every node sees the lost voter replaced", WAIT, |g| {
            g.nodes.values().all(|n| n.voters() == three)
        })
        .await;

    let second = group.join_node_replacing(ServerId(4), Some(lost)).await;
    let refused = second.become_voter().await;
    assert!(
        matches!(refused, Err(MembershipError::Timeout { .. })),
        "{refused:?}"
    );
    assert_eq!(group.node(leader).voters(), three, "the group did not grow");
}

/// A voter whose place moved while it was away comes back with its old
/// node, which the group no longer counts. Sent to take the place of a
/// second voter lost for good, it leaves that node behind for a new
/// incarnation (`rejoin`): the group keeps three voters and commits with
/// it, and its restart comes back as the new node, never as the old one.
#[tokio::test(start_paused = true)]
async fn a_voter_whose_place_moved_takes_another_lost_voters_place_as_a_new_node() {
    let mut group = Group::start(3, 5, 2, 17).await;
    let leader = group.wait_leader(&ALL).await;
    group.wait_converged().await;
    let [away, second] = others(&ALL, &[leader])[..] else {
        unreachable!("three voters")
    };
    group.kill(away).await;
    group
        .join_node_replacing(ServerId(3), Some(away))
        .await
        .become_voter()
        .await
        .expect("server 3 takes the place of the voter away");
    group.start_node(away).await;
    let old_node = group.node(away).node_id();
    let voters = BTreeSet::from([leader, second, ServerId(3)]);
    group
        .wait_until("the leader counts server 3, not the one away", WAIT, |g| {
            g.node(leader).voters().into_iter().collect::<BTreeSet<_>>() == voters
                && !g.node(leader).member_nodes().contains(&old_node)
        })
        .await;

    group.kill(second).await;
    let node = group.nodes.remove(&away).expect("running");
    group.net.detach(away);
    let mut cfg = crate::MembershipConfig::new(
        away,
        group.voters.clone(),
        std::path::PathBuf::new(),
        group.initial.clone(),
    );
    cfg.timing = group.timing.clone();
    cfg.replaces = Some(second);
    let renewed = node
        .rejoin(cfg, group.net.transport(away))
        .await
        .expect("the old node is left behind");
    group.net.attach(renewed.clone());
    group.nodes.insert(away, renewed.clone());
    let new_node = renewed.node_id();
    assert_ne!(new_node, old_node);
    assert_ne!(renewed.incarnation(), 0);
    renewed
        .become_voter()
        .await
        .expect("it takes the second lost voter's place");
    let voters = BTreeSet::from([leader, away, ServerId(3)]);
    assert_eq!(
        group
            .node(leader)
            .voters()
            .into_iter()
            .collect::<BTreeSet<_>>(),
        voters,
        "three voters again"
    );

    // With server 3 gone too, the leader and the new node are a quorum.
    group.kill(ServerId(3)).await;
    let map = group.node(leader).map();
    group
        .node(leader)
        .propose(some_change(&map, 3), map.epoch)
        .await
        .expect("committed by the leader and the new node");

    // A restart comes back as the new node, with its votes.
    group.kill(away).await;
    group.start_node(away).await;
    assert_eq!(group.node(away).node_id(), new_node);
}
