//! Runs the simulation over many seeds. Environment:
//! - `MADFS_SIM_SEED=n`: only seed n (a replay), printing every step;
//! - `MADFS_SIM_SEEDS=n`: how many seeds (default 200), from
//!   `MADFS_SIM_FIRST_SEED` (default 1);
//! - `MADFS_SIM_STEPS=n`: steps per seed (default 60).

use madfs_sim::{run, SimConfig};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn quiet() {
    if std::env::var_os("MADFS_LOG").is_none() {
        // Servers log every retry of a lost message: keep it quiet.
        std::env::set_var("MADFS_LOG", "error");
    }
}

#[test]
fn simulated_cluster_keeps_its_invariants() {
    quiet();
    let steps = env("MADFS_SIM_STEPS").unwrap_or(60) as usize;
    let seeds: Vec<u64> = match env("MADFS_SIM_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env("MADFS_SIM_FIRST_SEED").unwrap_or(1);
            (first..first + env("MADFS_SIM_SEEDS").unwrap_or(200)).collect()
        }
    };
    let replay = seeds.len() == 1;
    let started = std::time::Instant::now();
    let (mut ops, mut failed, mut crashes, mut dropped, mut lost, mut leaks, mut holes) =
        (0, 0, 0, 0, 0, 0, 0);
    let mut stalled = Vec::new();
    for &seed in &seeds {
        let mut cfg = SimConfig::new(seed, steps);
        cfg.verbose = replay;
        match run(&cfg) {
            Ok(o) => {
                ops += o.ops_ok;
                failed += o.ops_failed;
                crashes += o.crashes;
                dropped += o.dropped;
                lost += o.lost_batches;
                leaks += o.leaks;
                holes += o.stale_holes;
                if o.stalls > 0 {
                    stalled.push(seed);
                }
            }
            Err(f) => panic!("{f}"),
        }
    }
    eprintln!(
        "simulation: {} seeds x {steps} steps in {:.1?}: {ops} operations succeeded, {failed} failed, \
         {crashes} crashes ({lost} unsynced batches lost), {dropped} messages lost, \
         {leaks} inodes leaked by a crash or a lost message, {holes} holes showing cut-off bytes; seeds with calls stalled for the whole call timeout: {stalled:?}",
        seeds.len(),
        started.elapsed()
    );
}

#[test]
fn a_seed_replays_identically() {
    quiet();
    for seed in 1..=12 {
        let a = run(&SimConfig::new(seed, 40)).unwrap_or_else(|f| panic!("{f}"));
        let b = run(&SimConfig::new(seed, 40)).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(a.trace, b.trace, "seed {seed} ran differently twice");
    }
}
