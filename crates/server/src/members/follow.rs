//! Following the cluster map (members.rs): what a server does when the
//! group's map moves. The routes go to the router and the pools; a set
//! whose primary is now this server is promoted from its copy, its own set
//! given to another is deposed or handed over, and as a set's primary it
//! resyncs the servers the map lists as catching up.

use super::*;

/// How often a restarted server looks whether it may start its home
/// store's recoveries.
const RECOVERIES_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

impl Members {
    /// Apply every map this server learns to `router`, for as long as the
    /// process runs.
    pub fn follow(self: &Arc<Self>, router: Arc<Router>) {
        let _ = self.router.set(Arc::downgrade(&router));
        // The home store's recoveries wait until this server may serve (a
        // lease, and the map the leader announced applied) and that map
        // keeps the home set here (`Router::start_home_recoveries`).
        if router.home_recoveries_pending() {
            let (members, router) = (self.clone(), router.clone());
            tokio::spawn(async move {
                while router.home_recoveries_pending() {
                    let primary = members
                        .map()
                        .sets
                        .get(members.me.0 as usize)
                        .map(|s| s.primary);
                    if members.may_serve() && primary == Some(members.me) {
                        router.start_home_recoveries();
                        return;
                    }
                    tokio::time::sleep(RECOVERIES_CHECK_EVERY).await;
                }
            });
        }
        let (members, mut rx) = (self.clone(), self.subscribe());
        tokio::spawn(async move {
            // A server restarted (a map before any ping: its own node's,
            // from its log) into a cluster whose map moved on: that map may
            // be older than the voters' (the bootstrap one, even).
            // Applied, it may make this server serve a copy of a set that
            // moved on, and a copy served once is a copy no more (its
            // position is dropped): a held set waiting for it found it not
            // whole (the simulation with 4 servers, seed 17004). Ask the
            // voters first, for a while.
            if members.map().epoch > 0 {
                members.learn_voters_map().await;
            }
            loop {
                let map = rx.borrow_and_update().clone();
                if map.epoch > 0 {
                    members.apply(&map, &router).await;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    async fn apply(self: &Arc<Self>, map: &ClusterMap, router: &Arc<Router>) {
        let serving: Vec<ServerId> = map.sets.iter().map(|s| s.primary).collect();
        // Addresses first: a set routed to a moved server must connect to
        // where it is now.
        let moved = moved_addresses(map);
        self.net.pool.set_addresses(&moved).await;
        router.set_routes(Routes {
            epoch: map.epoch,
            serving: serving.clone(),
            in_sync: map
                .sets
                .iter()
                .map(|s| s.members.len().min(u8::MAX as usize) as u8)
                .collect(),
            addresses: moved.clone(),
        });
        for server in router.servers() {
            server.peers.set_addresses(&moved).await;
            server.peers.set_routes(map.epoch, &serving).await;
        }
        for (set, s) in map.sets.iter().enumerate() {
            let set = ServerId(set as u16);
            // Another's set, or its own once more after a resync (served
            // then from the copy, like any other). One held after a power
            // loss is handed over below.
            if s.primary == self.me && router.server_of(set).is_none() && !router.is_held(set) {
                let replicas: Vec<ServerId> = s.members[1..].to_vec();
                if let Err(e) = router.promote(set, replicas).await {
                    tracing::error!("server {}: cannot serve set {set}: {e}", self.me);
                }
            }
        }
        if map
            .sets
            .get(self.me.0 as usize)
            .is_some_and(|s| s.primary != self.me)
        {
            router.depose(self.me);
        }
        for set in router.held() {
            self.hand_over(set, map, router);
        }
        // A copy here that may lack records it acknowledged (reopened after
        // a power loss at a position no sync wrote) while the map counts it
        // in sync: a failover would serve it (crates/sim seed 12107). Its
        // primary only finds out at its next record, which may never come.
        for (set, s) in map.sets.iter().enumerate() {
            let set = ServerId(set as u16);
            if s.primary != self.me
                && s.members.contains(&self.me)
                && router.home_server().copies.lacks(set).await
            {
                self.leave_lacking(set);
            }
        }
        // A set served here from a copy after a failover, and given to
        // another server since, is no longer served here either: its copy
        // is stale from now on (a client with old routes would read it).
        for set in router.served() {
            if set != self.me
                && map
                    .sets
                    .get(set.0 as usize)
                    .is_some_and(|s| s.primary != self.me)
            {
                router.depose(set);
            }
        }
        self.applied.fetch_max(map.epoch, Ordering::AcqRel);
        // Primaries: resync the servers catching up, stop shipping to those
        // taken out.
        for (set, s) in map.sets.iter().enumerate() {
            self.follow_members(ServerId(set as u16), s, map.epoch, router);
        }
        // A server missing from a set the cluster file puts it in asks to
        // catch up on it (after a restart, or when it was taken out); not
        // with a disk that failed (step_down.rs), which would fail it.
        let unusable = router.home_server().chunks.failure().is_some();
        for &set in self.intended.iter().filter(|_| !unusable) {
            let Some(s) = map.sets.get(set.0 as usize) else {
                continue;
            };
            if s.primary != self.me
                && !s.members.contains(&self.me)
                && !s.syncing.contains(&self.me)
            {
                let (me, change) = (
                    self.clone(),
                    Change::AddSyncing {
                        set: set.0,
                        server: self.me,
                    },
                );
                tokio::spawn(async move {
                    if me.propose_latest(change).await {
                        tracing::info!("server {}: catching up on set {set}", me.me);
                    }
                });
            }
        }
    }
}

impl Members {
    /// As `set`'s primary here (if this server serves it): resync the
    /// servers `s` lists as catching up, stop shipping to those it no
    /// longer lists. `epoch` is the map's that lists them.
    fn follow_members(&self, set: ServerId, s: &SetState, epoch: u64, router: &Router) {
        let Some(server) = router.server_of(set) else {
            return;
        };
        let Some(rep) = server.replication.clone() else {
            return;
        };
        for &j in &s.syncing {
            if !rep.ships_to(j) {
                rep.catch_up(server.clone(), j);
            } else if rep.counts_in_sync(j) && self.map().epoch == epoch {
                // The group took it out and let it back in to catch
                // up in maps this server skipped (it applies the
                // newest only), so no catch-up started and nobody
                // would ever count it in sync again (crates/sim with
                // 4 servers, seed 6137). It has every record it
                // acknowledged: a catch-up from there, without a load.
                rep.drop_replica(j);
                rep.catch_up(server.clone(), j);
            }
        }
        for (j, _, out) in rep.replicas() {
            if !s.members.contains(&j) && !s.syncing.contains(&j) {
                match out {
                    None => rep.drop_replica(j),
                    // Its catch-up may be waiting to try again.
                    Some(_) => rep.forget_catch_up(j),
                }
            }
        }
    }

    /// Held `set` (its store here came back from a power loss while the
    /// map still names this server its primary; restart.rs
    /// `opened_after_power_loss`): the set's other in-sync members have
    /// every acknowledged change, and this store may not. Hand the set to
    /// the next of them (`Failover`, as a primary whose disk failed does,
    /// step_down.rs); the map then deposes this store, and the server
    /// catches up on the set like any returning server. Alone in the set
    /// because the group took those members out while down, it waits for
    /// one back with a whole copy and hands the set to it (`hand_back`);
    /// alone with none owed, it serves what it has.
    fn hand_over(self: &Arc<Self>, set: ServerId, map: &ClusterMap, router: &Arc<Router>) {
        if map
            .sets
            .get(set.0 as usize)
            .is_some_and(|s| s.primary != self.me)
        {
            router.depose(set);
            return;
        }
        let Some(claim) = self.handing_over.claim(set) else {
            return;
        };
        let (me, router) = (self.clone(), router.clone());
        tokio::spawn(async move {
            let _claim = claim;
            // The copies this store's acknowledgements waited for when
            // the power went (kept in it, `META_WAITED_COPIES`), and the
            // set's other in-sync members when first seen from here: each
            // has every change this store may have lost. Taken out of the
            // set while down (a second fault; the group may take them out
            // before this server's first look, seed 17018 with 4 servers,
            // or before a restart of this server while it waits), they are
            // waited for, the set unavailable meanwhile; the first back
            // with its copy whole gets the set (`HandBack`). Only once none
            // of them can come back whole is this store served.
            let waited = router.held_waited(set);
            let mut owed: Option<Vec<ServerId>> = None;
            // Until the map moves the set (then `apply` deposes this store)
            // or leaves it no other copy. Decided on the map as the voters
            // have it, never on the one this server's own node restarted
            // with, which may be older: a set shown with no other copy
            // then may have one now (the simulation, seed 12102).
            while router.is_held(set) {
                let map = match me.fresh_map().await {
                    Ok(m) => m,
                    Err(e) => {
                        router.note_held(set, format!("it waits for the membership map ({e})"));
                        tracing::info!("server {}: set {set} waits for the map: {e}", me.me);
                        tokio::time::sleep(HAND_OVER_RETRY).await;
                        continue;
                    }
                };
                let Some(s) = map.sets.get(set.0 as usize) else {
                    break;
                };
                if s.primary != me.me {
                    router.depose(set);
                    break;
                }
                let owed = owed.get_or_insert_with(|| {
                    let mut o = s.members[1..].to_vec();
                    for &w in &waited {
                        if w != me.me && !o.contains(&w) {
                            o.push(w);
                        }
                    }
                    o
                });
                if let Some(&next) = s.members.get(1) {
                    // Not to a server that is down: the set would wait for
                    // it. If it stays down, the group takes it out of the
                    // set, and it is waited for below.
                    if !me.net.answers(next).await {
                        router.note_held(
                            set,
                            format!(
                                "it goes to server {next}, whose copy has every acknowledged \
                                 change, once that server answers"
                            ),
                        );
                        tracing::info!(
                            "server {}: set {set} waits for server {next}, its copy, to answer",
                            me.me
                        );
                        tokio::time::sleep(HAND_OVER_RETRY).await;
                        continue;
                    }
                    router.note_held(
                        set,
                        format!("it is being handed to server {next}, whose copy is in sync"),
                    );
                    tracing::warn!(
                        "server {}: set {set} goes to server {next}, whose copy has every \
                         acknowledged change (this store came back from a power loss)",
                        me.me
                    );
                    let change = Change::Failover {
                        set: set.0,
                        new_primary: next,
                    };
                    if !me.propose_latest(change).await {
                        tokio::time::sleep(HAND_OVER_RETRY).await;
                    }
                    continue;
                }
                if me.hand_back(set, s, owed).await {
                    continue;
                }
                if owed.is_empty() {
                    router.release(set);
                    // Members that came back meanwhile are catching up:
                    // no new map may come to start their resyncs (the
                    // simulation with 4 servers, seed 17004).
                    me.follow_members(set, s, map.epoch, &router);
                    break;
                }
                let names: Vec<String> = owed.iter().map(|w| w.to_string()).collect();
                router.note_held(
                    set,
                    format!(
                        "it waits for the copy on server {} (out of the set since it went \
                         down) to come back whole",
                        names.join(" or ")
                    ),
                );
                tracing::info!(
                    "server {}: set {set} waits for a copy taken out while down ({owed:?}) \
                     to come back: this store may lack acknowledged writes",
                    me.me
                );
                tokio::time::sleep(HAND_OVER_RETRY).await;
            }
        });
    }

    /// Held `set`, left with this server alone: give it to a copy of
    /// `owed` back and catching up whose copy is whole (`HandBack`);
    /// whether a hand-back applied. A copy back but not whole (a disk
    /// lost, a power cut of its own) leaves `owed`.
    async fn hand_back(&self, set: ServerId, s: &SetState, owed: &mut Vec<ServerId>) -> bool {
        for w in owed.clone() {
            if !s.syncing.contains(&w) {
                continue;
            }
            let mut question = vec![tag::COPY_WHOLE];
            question.extend_from_slice(&set.0.to_le_bytes());
            let answer = tokio::time::timeout(REMOTE_WAIT, self.net.send(w, question)).await;
            match answer {
                Ok(Ok(b)) if b == [1] => {
                    tracing::warn!(
                        "server {}: set {set} goes to server {w}, back with a whole copy \
                         (this store came back from a power loss)",
                        self.me
                    );
                    let change = Change::HandBack {
                        set: set.0,
                        server: w,
                    };
                    if self.propose_latest(change).await {
                        return true;
                    }
                }
                Ok(Ok(_)) => {
                    tracing::warn!(
                        "server {}: server {w} is back without a whole copy of set {set}",
                        self.me
                    );
                    owed.retain(|x| *x != w);
                }
                // No answer: asked again at the next round.
                _ => {}
            }
        }
        false
    }
}

impl Members {
    /// Take this server out of `set`'s in-sync members, its copy lacking
    /// records (`apply`); it then asks to catch up like any returning
    /// server, with a load. Once per set at a time.
    fn leave_lacking(self: &Arc<Self>, set: ServerId) {
        let Some(claim) = self.leaving.claim(set) else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let _claim = claim;
            tracing::warn!(
                "server {}: the copy of set {set} may lack records (reopened after a power loss): \
                 leaving the set's in-sync members to catch up",
                me.me
            );
            let change = Change::RemoveMember {
                set: set.0,
                server: me.me,
            };
            if !me.propose_latest(change).await {
                tokio::time::sleep(HAND_OVER_RETRY).await;
            }
        });
    }
}

/// Sets a background task of this server works on, one task per set at a
/// time (a hand-over, a leave): each new map would otherwise start another.
#[derive(Default)]
pub(super) struct SetsAtWork(Arc<Mutex<std::collections::HashSet<ServerId>>>);

impl SetsAtWork {
    /// `set`, for the caller until the claim drops; None while another
    /// task has it.
    fn claim(&self, set: ServerId) -> Option<SetClaim> {
        let fresh = self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(set);
        fresh.then(|| SetClaim {
            sets: self.0.clone(),
            set,
        })
    }
}

struct SetClaim {
    sets: Arc<Mutex<std::collections::HashSet<ServerId>>>,
    set: ServerId,
}

impl Drop for SetClaim {
    fn drop(&mut self) {
        self.sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.set);
    }
}
