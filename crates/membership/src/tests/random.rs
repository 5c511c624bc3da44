//! Seeded random schedules of partitions, heals, crashes and restarts,
//! lossy links and proposals (some racing), checking after every step that
//! no two different maps were ever seen at the same epoch (on any voter, in
//! any proposal's answer), and at the end that every voter converges on one
//! map that holds every acknowledged change.
//!
//! `MADFS_MEMBERSHIP_SEEDS` (default 6), `MADFS_MEMBERSHIP_FIRST_SEED`
//! (default 0) and `MADFS_MEMBERSHIP_STEPS` (default 40) scale it; a
//! failure names its seed and step (run with --nocapture to see the seed
//! of a hang).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madfs_types::ServerId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::task::JoinHandle;

use super::{some_change, some_move, Group};
use crate::{ClusterMap, MembershipError};

/// Every map seen, by epoch, and the first conflict found.
#[derive(Default)]
struct History {
    by_epoch: BTreeMap<u64, ClusterMap>,
    conflict: Option<String>,
}

impl History {
    fn record(&mut self, map: &ClusterMap, seen_by: &str) {
        if !map.is_bootstrapped() {
            return;
        }
        match self.by_epoch.get(&map.epoch) {
            None => {
                self.by_epoch.insert(map.epoch, map.clone());
            }
            Some(known) if known == map => {}
            Some(known) => {
                self.conflict.get_or_insert(format!(
                    "two maps at epoch {}: {known:?} and, seen by {seen_by}, {map:?}",
                    map.epoch
                ));
            }
        }
    }
}

/// Record every map `voter`'s node applies, until it stops.
fn watch_maps(group: &Group, voter: ServerId, history: Arc<Mutex<History>>) -> JoinHandle<()> {
    let mut maps = group.node(voter).subscribe();
    tokio::spawn(async move {
        loop {
            let map = maps.borrow_and_update().clone();
            history
                .lock()
                .expect("no panic holding it")
                .record(&map, &format!("voter {voter}"));
            if maps.changed().await.is_err() {
                return;
            }
        }
    })
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_faults_never_commit_two_maps_at_one_epoch() {
    let first = env_number("MADFS_MEMBERSHIP_FIRST_SEED", 0);
    let seeds = env_number("MADFS_MEMBERSHIP_SEEDS", 6);
    let steps = env_number("MADFS_MEMBERSHIP_STEPS", 40);
    for seed in first..first + seeds {
        eprintln!("membership random schedule: seed {seed}, {steps} steps");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(run_seed(seed, steps));
    }
}

async fn run_seed(seed: u64, steps: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut group = Group::start(3, 5, 3, seed).await;
    group.net.set_delay(Duration::from_millis(5));
    let voters = group.voters.clone();
    let history = Arc::new(Mutex::new(History::default()));
    let mut watchers: Vec<JoinHandle<()>> = voters
        .iter()
        .map(|v| watch_maps(&group, *v, history.clone()))
        .collect();
    let mut down: Option<ServerId> = None;
    let mut acked_epoch_max = 0;
    for step in 0..steps {
        let what;
        match rng.random_range(0..100) {
            0..=39 => {
                // One proposal, or two racing, each from a running voter
                // against the map it has (perhaps stale).
                let racing = rng.random_bool(0.3);
                let proposers: Vec<ServerId> = (0..if racing { 2 } else { 1 })
                    .map(|_| {
                        *group
                            .nodes
                            .keys()
                            .nth(rng.random_range(0..group.nodes.len()))
                            .expect("a voter")
                    })
                    .collect();
                let picks: Vec<u64> = proposers.iter().map(|_| rng.random()).collect();
                // Now and then a server move (refused while the server is
                // in a set, which is most of the time).
                let moving = rng.random_bool(0.15);
                what = format!("propose from {proposers:?} (a move: {moving})");
                let proposals = proposers.iter().zip(&picks).map(|(p, pick)| {
                    let node = group.node(*p).clone();
                    let map = node.map();
                    async move {
                        if !map.is_bootstrapped() {
                            return Err(MembershipError::Rejected(
                                crate::Rejection::NotBootstrapped,
                            ));
                        }
                        let change = if moving {
                            some_move(&map, *pick)
                        } else {
                            some_change(&map, *pick)
                        };
                        node.propose(change, map.epoch).await
                    }
                });
                for (result, proposer) in futures::future::join_all(proposals)
                    .await
                    .into_iter()
                    .zip(&proposers)
                {
                    if let Ok(map) = result {
                        acked_epoch_max = acked_epoch_max.max(map.epoch);
                        history
                            .lock()
                            .expect("no panic")
                            .record(&map, &format!("a proposal of {proposer}"));
                    }
                }
            }
            40..=51 => {
                let side: Vec<ServerId> = voters
                    .iter()
                    .copied()
                    .filter(|_| rng.random_bool(0.4))
                    .collect();
                what = format!("partition {side:?} from the rest");
                group.net.partition(&side);
            }
            52..=65 => {
                what = "heal".into();
                group.net.heal();
            }
            66..=79 => match down.take() {
                Some(voter) => {
                    what = format!("restart {voter}");
                    group.start_node(voter).await;
                    watchers.push(watch_maps(&group, voter, history.clone()));
                }
                None => {
                    let voter = voters[rng.random_range(0..voters.len())];
                    what = format!("crash {voter}");
                    group.kill(voter).await;
                    down = Some(voter);
                }
            },
            80..=87 => {
                let loss = [0, 0, 50, 200][rng.random_range(0..4)];
                what = format!("lose {loss}/1000 messages");
                group.net.set_loss(loss);
            }
            _ => {
                let pause = Duration::from_millis(rng.random_range(0..3000));
                what = format!("wait {pause:?}");
                tokio::time::sleep(pause).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let history = history.lock().expect("no panic");
        if let Some(conflict) = &history.conflict {
            panic!("seed {seed}, step {step} ({what}): {conflict}");
        }
    }
    // Heal everything and restart the crashed voter: all must agree on one
    // map that holds every acknowledged change.
    group.net.heal();
    group.net.set_loss(0);
    if let Some(voter) = down {
        group.start_node(voter).await;
        watchers.push(watch_maps(&group, voter, history.clone()));
    }
    // A proposal whose proposer gave up may still be served by a leader
    // (forwarded copies run up to `propose_timeout` there) and commit after
    // the heal: let those end, then the final state is what a linearizable
    // read returns.
    tokio::time::sleep(group.timing.propose_timeout * 2).await;
    let read = group
        .node(voters[0])
        .read_map()
        .await
        .expect("a healed group serves reads");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(59);
    group
        .wait_until(
            "every voter applies the map read",
            Duration::from_secs(60),
            |g| {
                let behind: Vec<_> = g.nodes.values().filter(|n| n.map() != read).collect();
                if !behind.is_empty() && tokio::time::Instant::now() >= deadline {
                    for n in &behind {
                        let (epoch, leader) = (n.map().epoch, n.leader());
                        eprintln!(
                            "seed {seed}: voter {} at epoch {epoch}, leader {leader:?}",
                            n.me()
                        );
                    }
                }
                behind.is_empty()
            },
        )
        .await;
    let last = read;
    assert!(
        last.epoch >= acked_epoch_max,
        "seed {seed}: epoch {acked_epoch_max} acknowledged, {} converged",
        last.epoch
    );
    history
        .lock()
        .expect("no panic")
        .record(&last, "convergence");
    if let Some(conflict) = &history.lock().expect("no panic").conflict {
        panic!("seed {seed}, after healing: {conflict}");
    }
    for node in group.nodes.values() {
        node.shutdown().await;
    }
    for watcher in watchers {
        watcher.abort();
    }
}
