//! One server process serving more than its own replica set: the request
//! router every connection goes through, and taking over a set whose
//! primary was lost (issue 16).
//!
//! A process always starts serving its home set (its own data directory).
//! When the cluster map makes it the primary of another set (a failover:
//! the set's primary stopped answering and this server held an in-sync
//! copy), it closes its copy of that set and opens it as a `Server` of that
//! id (the copy has a server's own layout; opening it runs the same
//! recovery a restart runs, so records that were applied and never
//! acknowledged are as after a crash). Connections name the set they are
//! for (Hello.want), and the router hands each request to that set's
//! server. When the map gives this process's home set to another server,
//! it stops serving it: connections for it are refused as moved.

use crate::metrics::{Metered, Metrics};
use crate::{RunOptions, Server, ServerError};
use madfs_proto::auth::ClusterKey;
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::serve::{CallContext, Handler};
use madfs_rpc::ClusterConfig;
use madfs_types::ServerId;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Which server serves each set, as of which map epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routes {
    pub epoch: u64,
    pub serving: Vec<ServerId>,
    /// How many servers keep each set in sync (empty: not known).
    pub in_sync: Vec<u8>,
    /// Servers that moved from their cluster-file address.
    pub addresses: Vec<(ServerId, std::net::SocketAddr)>,
}

/// Every request this process takes, by the set its connection is for.
pub struct Router {
    home: ServerId,
    cfg: ClusterConfig,
    key: ClusterKey,
    opts: RunOptions,
    metrics: Arc<Metrics>,
    home_server: Arc<Server>,
    /// The home server as the rpc layer sees it: records for this
    /// process's copies reach it whatever sets it serves.
    home_metered: Arc<Metered>,
    sets: RwLock<HashMap<ServerId, Arc<Metered>>>,
    routes: RwLock<Routes>,
    /// One promotion at a time.
    promoting: tokio::sync::Mutex<()>,
    /// The membership group, with replicas (members.rs).
    group: std::sync::OnceLock<Arc<crate::members::Members>>,
    /// Stores and peer pools of promoted sets when not RocksDB and TCP
    /// (crates/sim, `set_stores`).
    stores: std::sync::OnceLock<Arc<dyn crate::injected::Stores>>,
    /// The process is stopping (`stop_serving_clients`).
    stopping: std::sync::atomic::AtomicBool,
    /// Sets whose store came back from a power loss (restart.rs
    /// `opened_after_power_loss`), opened but not served: each is handed
    /// to an in-sync copy, or released if it has none (members.rs
    /// `hand_over`).
    held: RwLock<HashMap<ServerId, Arc<Metered>>>,
    /// What each held set waits for, as its clients and `madfs status`
    /// are told (`note_held`).
    held_for: std::sync::Mutex<HashMap<ServerId, String>>,
    /// The home store's recoveries wait for the map to say it still
    /// serves its set (`start_home_recoveries`); cleared once started, or
    /// when the set is deposed (never started then).
    home_recoveries_pending: std::sync::atomic::AtomicBool,
}

impl Router {
    pub fn new(
        home_server: Arc<Server>,
        cfg: ClusterConfig,
        key: ClusterKey,
        opts: RunOptions,
        metrics: Arc<Metrics>,
    ) -> Router {
        let home = home_server.id;
        let serving = (0..cfg.server_count() as u16).map(ServerId).collect();
        let mut sets = HashMap::new();
        let home_metered = Arc::new(Metered::new(home_server.clone(), metrics.clone()));
        // A set that moved away once is never served from this store
        // again (a later failover back serves it from this server's copy).
        // A store back from a power loss waits for the map: it hands the
        // set to an in-sync copy, or serves it if it is the only one
        // (members.rs `apply`). Its background work (recoveries that act
        // on other servers) waits with it.
        let mut held = HashMap::new();
        let mut home_recoveries_pending = false;
        if moved_marker(&cfg, &opts, home).exists() {
            // Never served again: no recoveries act from it on the other
            // servers (its renames, orphans and removals are the new
            // primary's to finish, from what the copies acknowledged).
        } else if home_server.after_power_loss {
            warn_held(home, home);
            held.insert(home, home_metered.clone());
        } else if cfg.replicas > 1 {
            // Its records are shipped from the start; what a crash left
            // to do on other servers waits for the map
            // (`start_home_recoveries`).
            home_server.start_replication();
            home_recoveries_pending = true;
            sets.insert(home, home_metered.clone());
        } else {
            home_server.clone().start_background();
            sets.insert(home, home_metered.clone());
        }
        Router {
            home,
            cfg,
            key,
            opts,
            metrics,
            home_server,
            home_metered,
            sets: RwLock::new(sets),
            routes: RwLock::new(Routes {
                epoch: 0,
                serving,
                in_sync: Vec::new(),
                addresses: Vec::new(),
            }),
            promoting: tokio::sync::Mutex::new(()),
            group: std::sync::OnceLock::new(),
            stores: std::sync::OnceLock::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            held: RwLock::new(held),
            held_for: std::sync::Mutex::new(HashMap::new()),
            home_recoveries_pending: std::sync::atomic::AtomicBool::new(home_recoveries_pending),
        }
    }

    /// The sets held after a power loss (see `held`).
    pub fn held(&self) -> Vec<ServerId> {
        sorted_sets(&self.held)
    }

    pub fn is_held(&self, set: ServerId) -> bool {
        self.held
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&set)
    }

    /// The copies held `set`'s store waited for when it was last served
    /// (`Server::waited_before`); none if it is not held.
    pub fn held_waited(&self, set: ServerId) -> Vec<ServerId> {
        self.held
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&set)
            .map(|m| m.server.waited_before.clone())
            .unwrap_or_default()
    }

    /// What held `set` waits for now (members.rs `hand_over`): requests
    /// for it are answered Unavailable with this, so an operator sees
    /// which copy a set back from a power loss waits for.
    pub fn note_held(&self, set: ServerId, waits_for: String) {
        self.held_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(set, waits_for);
    }

    fn forget_held_reason(&self, set: ServerId) {
        self.held_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&set);
    }

    /// Why `set` is not served here, if it is held.
    fn held_reason(&self, set: ServerId) -> Option<String> {
        if !self.is_held(set) {
            return None;
        }
        let why = self
            .held_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&set)
            .cloned()
            .unwrap_or_else(|| "it waits for the membership map".into());
        Some(format!(
            "server {} holds set {set}: its store came back from a power loss and may lack \
             acknowledged writes; {why}",
            self.home
        ))
    }

    /// Serve held `set` from its store after all (no other member of the
    /// set has a copy in sync), noting this boot in it.
    pub fn release(&self, set: ServerId) {
        let Some(m) = self
            .held
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&set)
        else {
            return;
        };
        self.forget_held_reason(set);
        tracing::warn!(
            "server {}: no other copy of set {set} is in sync: serving it from this store",
            self.home
        );
        if let Some(boot) = self.home_server.copies.boot() {
            if let Err(e) = crate::restart::note_boot(m.server.unreplicated.as_ref(), boot) {
                tracing::warn!(
                    "server {}: noting the boot set {set} is served in: {e}",
                    self.home
                );
            }
        }
        // It may lack writes it acknowledged: fsyncs of them must fail.
        // (Not kept in the store if it refuses it: this run answers with
        // the new one all the same.)
        let verifier = crate::restart::renew_write_verifier(m.server.unreplicated.as_ref())
            .unwrap_or_else(|e| {
                tracing::warn!(
                    "server {}: keeping a new write verifier for set {set}: {e}",
                    self.home
                );
                madfs_proto::message::WriteVerifier(crate::replication::random_stream_id())
            });
        m.server.set_write_verifier(verifier);
        m.server.clone().start_background();
        self.sets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(set, m);
    }

    /// The process is stopping: clients' requests are answered
    /// `Unavailable` from now on (with replicas, they wait for the set to
    /// move and go there), while records for this process's copies and
    /// membership messages are still served: the other servers may be
    /// stopping too, and their last records must reach their copies here.
    pub fn stop_serving_clients(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Open promoted sets through `stores` (crates/sim), not RocksDB and TCP.
    pub fn set_stores(&self, stores: Arc<dyn crate::injected::Stores>) {
        let _ = self.stores.set(stores);
    }

    /// Take part in `group`: leases gate every request, and replicas leave
    /// a set only through it.
    pub fn join(&self, group: Arc<crate::members::Members>) {
        if let Some(r) = &self.home_server.replication {
            r.set_group(group.clone());
            r.set_pool(group.direct_pool());
        }
        let _ = self.group.set(group);
    }

    /// The server of this process's own set.
    pub fn home_server(&self) -> &Arc<Server> {
        &self.home_server
    }

    /// The sets this process serves now.
    pub fn served(&self) -> Vec<ServerId> {
        sorted_sets(&self.sets)
    }

    pub fn routes(&self) -> Routes {
        self.routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Take the routes of a newer map.
    pub fn set_routes(&self, routes: Routes) {
        let mut r = self.routes.write().unwrap_or_else(|e| e.into_inner());
        if routes.epoch >= r.epoch {
            *r = routes;
        }
    }

    /// Serve `set` from this server's copy of it, shipping its records to
    /// `replicas` (the set's members the map has left, but this server).
    pub async fn promote(&self, set: ServerId, replicas: Vec<ServerId>) -> Result<(), ServerError> {
        let _one = self.promoting.lock().await;
        if self
            .sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&set)
            || self.is_held(set)
        {
            return Ok(());
        }
        // A copy reopened after a power loss at a position no sync wrote
        // may lack what it acknowledged; until its `leave_lacking` commits
        // the map still counts it in sync, and a failover may pick it
        // (the replicated simulation with 4 servers, seed 17005).
        let lacking = self.home_server.copies.lacks(set).await;
        let dir = self.home_server.copies.close_for_promotion(set).await;
        let mut opts = self.opts.clone();
        opts.data_dir = Some(dir.clone());
        opts.replicas = Some(replicas);
        let (cfg, key) = (self.cfg.clone(), self.key.clone());
        let server = match self.stores.get() {
            Some(stores) => crate::injected::open_promoted(&cfg, set, &dir, &opts, stores)?,
            None => tokio::task::spawn_blocking(move || Server::open(&cfg, set, key, &opts))
                .await
                .map_err(|e| ServerError::Storage(format!("opening set {set}: {e}")))??,
        };
        let server = Arc::new(server);
        if let (Some(r), Some(g)) = (&server.replication, self.group.get()) {
            r.set_group(g.clone());
            r.set_pool(g.direct_pool());
        }
        if server.after_power_loss || lacking {
            // Served here before a power loss: its copies may have what
            // it lost (members.rs `hand_over`). Held even where `replicas`
            // is empty: that may be the map this server's node restarted
            // with, older than the voters' (the replicated simulation,
            // seed 16118: a copy marked in sync in a later map was not
            // waited for, and the set was served without an acknowledged
            // create). `hand_over` decides on the voters' map, and
            // serves the store if it is the set's only copy after all.
            warn_held(self.home, set);
            self.held
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(set, Arc::new(Metered::new(server, self.metrics.clone())));
            return Ok(());
        }
        server.clone().start_background();
        tracing::warn!(
            "server {} now serves set {set} from its copy {}",
            self.home,
            dir.display()
        );
        self.sets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(set, Arc::new(Metered::new(server, self.metrics.clone())));
        Ok(())
    }

    /// Whether the home store's recoveries still wait for the map.
    pub fn home_recoveries_pending(&self) -> bool {
        self.home_recoveries_pending
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The map (current: this server holds a lease and applied the map the
    /// leader announced) says the home set is still served here: start
    /// the recoveries of its store, once. A restarted server whose set
    /// moved while it was down never starts them: its store may hold a
    /// change no copy got (a mkdir's batch written as the process died),
    /// whose touch of a directory elsewhere would then count a
    /// subdirectory the set does not have (the simulation with replicas,
    /// seed 40094: the root's link count one too high).
    pub fn start_home_recoveries(&self) {
        if self
            .home_recoveries_pending
            .swap(false, std::sync::atomic::Ordering::AcqRel)
            && self.server_of(self.home).is_some()
        {
            self.home_server.clone().start_recoveries();
        }
    }

    /// Stop serving `set` (the map gave it to another server).
    pub fn depose(&self, set: ServerId) {
        if set == self.home {
            self.home_recoveries_pending
                .store(false, std::sync::atomic::Ordering::Release);
        }
        // Held after a power loss: never served, dropped here (a copy's
        // store is closed before `unpromote` below opens it again).
        self.held
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&set);
        self.forget_held_reason(set);
        if set == self.home {
            let marker = moved_marker(&self.cfg, &self.opts, set);
            if !marker.exists() {
                if let Err(e) = write_synced(&marker) {
                    tracing::error!("{}: {e}", marker.display());
                }
            }
        }
        let removed = self
            .sets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&set);
        if let Some(m) = removed {
            if let Some(r) = &m.server.replication {
                r.retire();
            }
            tracing::warn!("server {} no longer serves set {set}", self.home);
        }
        // If it was served from this server's copy (another's set, or its
        // own after it moved away once), the copy takes records again, so
        // that a resync can rebuild it (its load sends what the stale copy
        // does not hold as the primary does).
        self.home_server.copies.unpromote(set);
    }

    /// The server of `set`, if this process serves it.
    pub fn server_of(&self, set: ServerId) -> Option<Arc<Server>> {
        self.sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&set)
            .map(|m| m.server.clone())
    }

    /// Every set's server, for a clean stop.
    pub fn servers(&self) -> Vec<Arc<Server>> {
        self.sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|m| m.server.clone())
            .collect()
    }

    /// Why an operation on `set` that ran to its end on `m` may not be
    /// acknowledged: the set moved away from `m` meanwhile (`depose`). The
    /// new primary's copy has every record its replicas acknowledged, but
    /// `m`'s later answers are not the set's any more: an unknown outcome
    /// (`TimedOut`), never "done". (Found by the simulation, seed 470: a
    /// set moved away and back to one process, from its copy; the first
    /// server, still running, took the new primary's replica out of the
    /// set and answered a mkdir alone. `Replicator::retire` closes that;
    /// this keeps any answer of a deposed server from counting.)
    fn moved_while_running(&self, set: ServerId, m: &Arc<Metered>) -> Option<WireError> {
        self.group.get()?;
        let still = self
            .sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&set)
            .is_some_and(|now| Arc::ptr_eq(now, m));
        (!still).then(|| {
            WireError::new(
                ErrorCode::TimedOut,
                format!(
                    "set {set} moved away from server {} while the operation ran; it may or \
                     may not have been done",
                    self.home
                ),
            )
        })
    }
}

impl Handler for Router {
    async fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> Result<(Reply, Vec<u8>), WireError> {
        if let Op::Membership { msg } = &req.op {
            let Some(g) = self.group.get() else {
                // The listener is up before the group starts (the voters
                // must reach each other to start).
                return Err(match self.cfg.replicas > 1 {
                    true => WireError::new(
                        ErrorCode::Unavailable,
                        format!("server {}'s membership node is starting", self.home),
                    ),
                    false => WireError::new(
                        ErrorCode::InvalidArgument,
                        "this cluster keeps no replicas and has no membership group",
                    ),
                });
            };
            return Ok((
                Reply::Membership {
                    msg: g.handle(msg).await?,
                },
                Vec::new(),
            ));
        }
        if let Op::GetRoutes = req.op {
            let r = self.routes();
            return Ok((
                Reply::Routes {
                    epoch: r.epoch,
                    serving: r.serving,
                    in_sync: r.in_sync,
                    addresses: r.addresses,
                    voters: self.group.get().map(|g| g.voters()).unwrap_or_default(),
                    lost: self.group.get().map(|g| g.lost_sets()).unwrap_or_default(),
                },
                Vec::new(),
            ));
        }
        // Records for this process's copies, whatever set the connection
        // named (a resync reaches a server whose own set moved away).
        if req.op.for_a_copy() {
            return self.home_metered.handle(ctx, req, data).await;
        }
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("server {} is stopping", self.home),
            ));
        }
        // Without a lease a partitioned primary may have been replaced:
        // it answers nothing (records for its copies excepted: those come
        // from a primary that holds one).
        if let Some(g) = self.group.get() {
            if !g.may_serve() && !req.op.for_a_copy() {
                return Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "server {} holds no lease from the membership leader (starting, or cut off)",
                        self.home
                    ),
                ));
            }
        }
        let target = self
            .sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ctx.set)
            .cloned();
        match target {
            Some(m) => {
                // With replicas, a set whose store failed moves to a replica
                // that holds every acknowledged change (step_down.rs): the
                // caller waits for that and goes there, instead of getting
                // EIO, or reads of pages the kernel may have dropped.
                // Status still answers (it says why the store failed).
                let status = matches!(req.op, Op::StatFs);
                let unusable = |m: &Metered| {
                    if status {
                        return None;
                    }
                    self.group.get()?;
                    let why = m.server.chunks.failure()?;
                    Some(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "server {}'s store of set {} is unusable ({why}); the set moves to \
                             its replica",
                            self.home, ctx.set
                        ),
                    ))
                };
                if let Some(e) = unusable(&m) {
                    return Err(e);
                }
                let set = ctx.set;
                match m.handle(ctx, req, data).await {
                    Err(e) => Err(unusable(&m).unwrap_or(e)),
                    Ok(done) => match self.moved_while_running(set, &m) {
                        Some(e) => Err(e),
                        None => Ok(done),
                    },
                }
            }
            None => Err(WireError::new(
                ErrorCode::Unavailable,
                self.held_reason(ctx.set).unwrap_or_else(|| {
                    format!("server {} no longer serves set {}", self.home, ctx.set)
                }),
            )),
        }
    }

    fn serves(&self, set: ServerId, home: ServerId) -> bool {
        // Its own id always (membership messages reach the process so),
        // though its set may have moved: requests for it are refused then.
        set == home
            || self
                .sets
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&set)
    }
}

/// The sets `map` holds, in order.
fn sorted_sets<V>(map: &RwLock<HashMap<ServerId, V>>) -> Vec<ServerId> {
    let mut v: Vec<ServerId> = map
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .copied()
        .collect();
    v.sort();
    v
}

fn warn_held(home: ServerId, set: ServerId) {
    tracing::warn!(
        "server {home}: the store of set {set} was served in another boot and not stopped \
         cleanly (a power loss?): it may lack writes its copies acknowledged, so it is not \
         served before the map says who has them"
    );
}

/// The file that says a server's own set moved away from its store.
fn moved_marker(cfg: &ClusterConfig, opts: &RunOptions, home: ServerId) -> std::path::PathBuf {
    let dir = opts
        .data_dir
        .clone()
        .or_else(|| cfg.server(home).map(|e| e.data_dir.clone()))
        .unwrap_or_default();
    dir.join(HOME_SET_MOVED)
}

/// In a server's data directory: its own set moved away, and its store is
/// never served again.
pub(crate) const HOME_SET_MOVED: &str = "home-set-moved";

/// Create `path`, durably (the file and its directory entry).
fn write_synced(path: &std::path::Path) -> std::io::Result<()> {
    let f = std::fs::File::create(path)?;
    f.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
