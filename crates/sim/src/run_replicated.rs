//! The simulation driver's part for a cluster with replicas: starting the
//! processes, the faults between operations (a server killed and kept
//! down for a few steps, a server cut off from the others), and settling:
//! waiting, on the simulated clock, until the membership group has
//! failed over what it must and every live process follows the same map.

use super::{Failure, Sim};
use madfs_types::ServerId;
use rand::Rng;
use std::time::Duration;

/// Simulated time first given to recovery after a step (renames settling,
/// failovers: a server is declared down 2 s after its last answered ping).
const SETTLE_FIRST: Duration = Duration::from_secs(20);
/// Then how long, at most, until every set is served by a live process
/// that every other (not cut off) agrees on, and every set is back in sync
/// once all servers are up; and the pause between two looks.
const SETTLE_MAX: Duration = Duration::from_secs(120);
const SETTLE_POLL: Duration = Duration::from_secs(1);

impl Sim {
    /// Start every process of the cluster with replicas (server 0 first:
    /// it makes the root) and wait until the group has a map.
    pub(super) async fn start_replicated(&mut self) -> Result<(), String> {
        if self.cluster.replicated.is_none() {
            return Ok(());
        }
        for i in 0..self.cluster.disks.len() {
            self.cluster.start_replicated(ServerId(i as u16)).await?;
        }
        self.settle_replicated().await;
        match self.settled() {
            Ok(true) => Ok(()),
            Ok(false) => Err("the cluster is not in sync after it started".into()),
            Err(m) => Err(format!("the cluster did not start: {m}")),
        }
    }

    /// Whether a crash or a partition may start now: nothing else is
    /// down or cut off, and every set has all its replicas in sync.
    pub(super) fn may_fault(&self) -> bool {
        let rep = self.cluster.replicated.as_ref().expect("replicas");
        self.down.is_none()
            && self.isolated.is_none()
            && rep.healthy(self.cluster.cfg.replicas as usize)
    }

    /// Whether the next kill is a power cut: half of them, never while a
    /// set is held after an earlier one (`Replicated::holding`).
    pub(super) fn power_cut_now(&mut self) -> bool {
        let holding = self
            .cluster
            .replicated
            .as_ref()
            .is_some_and(|r| r.holding());
        self.power_cuts && self.rng.random_bool(0.5) && !holding
    }

    /// Kill process `id`, to restart it a few steps later: a process kill
    /// (its disks keep everything), or with `power_cut` the loss of its
    /// host's power (its disks keep what was synced and a random prefix of
    /// the rest). Either way every acknowledged operation is on its set's
    /// other copies, and the checks after the step ask for all of them.
    /// Whether the server is to come back at once (a quick restart after
    /// a power cut, before any failover).
    pub(super) fn kill_replicated(&mut self, id: ServerId, power_cut: bool) -> bool {
        drop(self.cluster.net.kill(id));
        let home = self.cluster.disks[id.0 as usize].clone();
        let keep = if power_cut {
            self.rng.random_range(0..=2)
        } else {
            usize::MAX
        };
        let rep = self.cluster.replicated.as_mut().expect("replicas");
        let lost = rep.kill(id, &home, keep);
        self.out.crashes += 1;
        self.out.lost_batches += lost;
        let back = self.step + self.rng.random_range(1..=3);
        let quick = power_cut && self.quick_restarts && self.rng.random_bool(0.25);
        if quick {
            // Back at the first moment the run can start it (a crash in
            // the middle of an operation: at the next step).
            self.down = Some((id, self.step));
            self.out.power_cuts += 1;
            self.out.quick_restarts += 1;
            self.note(format!(
                "power cut of server {id}: {lost} unsynced batches lost; back at once"
            ));
            return true;
        }
        self.down = Some((id, back));
        if power_cut {
            self.out.power_cuts += 1;
            self.note(format!(
                "power cut of server {id}: {lost} unsynced batches lost (down until step {back})"
            ));
        } else {
            self.note(format!("kill server {id} (down until step {back})"));
        }
        false
    }

    /// With `double_faults`, half the time: kill (a process kill) the
    /// in-sync copy of a set server `id` is the primary of, while `id` is
    /// down from a power cut and about to come back at once: the set is
    /// then held with its copy down (server members.rs `hand_over`). The
    /// set and the copy killed.
    fn kill_copy_too(&mut self, id: ServerId) -> Option<(usize, ServerId)> {
        if !self.double_faults || !self.rng.random_bool(0.5) {
            return None;
        }
        let rep = self.cluster.replicated.as_ref().expect("replicas");
        let (_, serving) = rep.routes()?;
        let sets = rep.newest_sets();
        let set = serving.iter().position(|&p| p == id)?;
        let copy = *sets.get(set)?.0.get(1)?;
        drop(self.cluster.net.kill(copy));
        let home = self.cluster.disks[copy.0 as usize].clone();
        let rep = self.cluster.replicated.as_mut().expect("replicas");
        rep.kill(copy, &home, usize::MAX);
        self.out.crashes += 1;
        self.out.double_faults += 1;
        self.note(format!(
            "kill server {copy}, set {set}'s copy, before server {id} is back"
        ));
        Some((set, copy))
    }

    /// Start `copy` again once the group took it out of `set` (or after
    /// `OUT_WAIT`): the held set waits for it and goes to it.
    async fn restart_once_out(&mut self, set: usize, copy: ServerId) -> Result<(), Failure> {
        const OUT_WAIT: Duration = Duration::from_secs(20);
        let deadline = tokio::time::Instant::now() + OUT_WAIT;
        while tokio::time::Instant::now() < deadline {
            let rep = self.cluster.replicated.as_ref().expect("replicas");
            let sets = rep.newest_sets();
            if sets.get(set).is_some_and(|(m, _)| !m.contains(&copy)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.out.restarts += 1;
        self.note(format!("restart server {copy}"));
        self.cluster
            .start_replicated(copy)
            .await
            .map_err(|m| self.fail(m))
    }

    /// A fault or a recovery between operations; whether it took the step.
    pub(super) async fn replicated_event(&mut self) -> Result<bool, Failure> {
        if let Some((id, at)) = self.down {
            if self.step >= at {
                self.down = None;
                self.out.restarts += 1;
                self.note(format!("restart server {id}"));
                self.cluster
                    .start_replicated(id)
                    .await
                    .map_err(|m| self.fail(m))?;
                self.settle_and_check().await?;
                return Ok(true);
            }
        }
        if let Some((id, at)) = self.isolated {
            if self.step >= at {
                self.isolated = None;
                self.cluster.net.isolate(None);
                self.note(format!("heal the partition of server {id}"));
                self.settle_and_check().await?;
                return Ok(true);
            }
        }
        let roll = self.rng.random_range(0..100);
        if roll >= 7 || !self.may_fault() {
            return Ok(false);
        }
        let id = ServerId(self.rng.random_range(0..self.cluster.disks.len() as u16));
        if roll < 4 {
            let power_cut = self.power_cut_now();
            if self.kill_replicated(id, power_cut) {
                let copy = self.kill_copy_too(id);
                self.down = None;
                self.out.restarts += 1;
                self.cluster
                    .start_replicated(id)
                    .await
                    .map_err(|m| self.fail(m))?;
                if let Some((set, copy)) = copy {
                    self.restart_once_out(set, copy).await?;
                }
            }
        } else {
            let heal = self.step + self.rng.random_range(1..=3);
            self.isolated = Some((id, heal));
            self.cluster.net.isolate(Some(id));
            self.out.partitions += 1;
            self.note(format!(
                "cut server {id} off from the others (until step {heal})"
            ));
        }
        self.settle_and_check().await?;
        Ok(true)
    }

    async fn settle_and_check(&mut self) -> Result<(), Failure> {
        self.settle().await;
        match self.settled() {
            Err(m) => return Err(self.fail(format!("after recovery: {m}"))),
            Ok(false) if self.down.is_none() && self.isolated.is_none() => {
                let sets = self
                    .cluster
                    .replicated
                    .as_ref()
                    .map(|r| r.newest_sets())
                    .unwrap_or_default();
                return Err(self.fail(format!(
                    "every server is up and reachable, and some set is still not in sync \
                     after {:?}; (in sync, catching up) by set: {sets:?}",
                    SETTLE_FIRST + SETTLE_MAX
                )));
            }
            Ok(_) => {}
        }
        self.check(None, false).await
    }

    /// Whether recovery is over: every set served by a live process that
    /// the others agree on and no rename left settling (Err: not yet, and
    /// why), and (Ok(true)) every
    /// set in sync; only expected once every server is up and reachable.
    fn settled(&self) -> Result<bool, String> {
        let rep = self.cluster.replicated.as_ref().expect("replicas");
        let cut = self.isolated.map(|(id, _)| id);
        let disks = rep.serving_disks(&self.cluster.disks)?;
        // A cross-server rename that met a fault settles in the background
        // (rename.rs), its retries backing off up to 10 s and each waiting
        // out a failover: give it the time (the checker requires none left).
        for (set, d) in disks.iter().enumerate() {
            if !d.scan_live(madfs_server::keys::RENAME_INTENT).is_empty() {
                return Err(format!("set {set} has a rename still settling"));
            }
        }
        if !rep.routes_agree(cut) {
            return Err("the live servers follow different maps".into());
        }
        Ok(rep.healthy(self.cluster.cfg.replicas as usize))
    }

    /// A set whose primary is down with no other in-sync member (the
    /// group took its replica out, wrongly, on a lossy network, just
    /// before the kill) cannot fail over: its operations fail, as they
    /// must. Restart its primary now, so the set comes back with every
    /// acknowledged change (a kill keeps them) and the step can be checked.
    async fn restart_stranded(&mut self) {
        let Some((id, _)) = self.down else { return };
        let rep = self.cluster.replicated.as_ref().expect("replicas");
        let stranded: Vec<usize> = match (rep.routes(), rep.newest_sets()) {
            (Some((_, serving)), sets) => serving
                .iter()
                .enumerate()
                .filter(|(set, p)| {
                    **p == id
                        && sets
                            .get(*set)
                            .is_some_and(|(members, _)| members.iter().all(|m| !rep.is_up(*m)))
                })
                .map(|(set, _)| set)
                .collect(),
            (None, _) => Vec::new(),
        };
        if stranded.is_empty() {
            return;
        }
        self.down = None;
        self.out.restarts += 1;
        self.note(format!(
            "sets {stranded:?} have no live copy in sync: restart server {id} now"
        ));
        if let Err(m) = self.cluster.start_replicated(id).await {
            // Reported by the check that follows (the set is not served).
            self.note(m);
        }
        tokio::time::sleep(SETTLE_FIRST).await;
    }

    /// Let recovery run on the simulated clock until it is over (see
    /// `settled`), at most `SETTLE_FIRST + SETTLE_MAX`.
    pub(super) async fn settle_replicated(&mut self) {
        let before = self
            .cluster
            .replicated
            .as_ref()
            .and_then(|r| r.routes())
            .map(|(_, s)| s);
        let voters_before = self.voters();
        tokio::time::sleep(SETTLE_FIRST).await;
        self.restart_stranded().await;
        let all_up = self.down.is_none() && self.isolated.is_none();
        let mut waited = Duration::ZERO;
        while waited < SETTLE_MAX {
            match self.settled() {
                Ok(true) => break,
                Ok(false) if !all_up => break,
                _ => {}
            }
            tokio::time::sleep(SETTLE_POLL).await;
            waited += SETTLE_POLL;
        }
        // Directory touches still on their way (a peer call lost on the
        // lossy network is sent again after its timeout).
        let mut waited = Duration::ZERO;
        while waited < SETTLE_MAX && self.touches_pending() {
            tokio::time::sleep(SETTLE_POLL).await;
            waited += SETTLE_POLL;
        }
        let after = self
            .cluster
            .replicated
            .as_ref()
            .and_then(|r| r.routes())
            .map(|(_, s)| s);
        if let (Some(b), Some(a)) = (before, after) {
            let moved: Vec<String> = b
                .iter()
                .zip(&a)
                .enumerate()
                .filter(|(_, (x, y))| x != y)
                .map(|(set, (x, y))| format!("set {set}: server {x} -> {y}"))
                .collect();
            if !moved.is_empty() {
                self.out.failovers += moved.len();
                self.note(format!("failover: {}", moved.join(", ")));
            }
        }
        let voters = self.voters();
        if !voters_before.is_empty() && !voters.is_empty() && voters != voters_before {
            self.out.voter_moves += 1;
            self.note(format!("voters: {voters_before:?} -> {voters:?}"));
        }
    }

    /// Whether the stores that serve the sets hold directory touch intents
    /// their owners have not applied.
    fn touches_pending(&self) -> bool {
        let Some(r) = &self.cluster.replicated else {
            return false;
        };
        r.serving_disks(&self.cluster.disks)
            .is_ok_and(|disks| crate::model::unapplied_touch_intents(&disks) > 0)
    }

    fn voters(&self) -> Vec<ServerId> {
        self.cluster
            .replicated
            .as_ref()
            .map_or(Vec::new(), |r| r.voters())
    }
}
