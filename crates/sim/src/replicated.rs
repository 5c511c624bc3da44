//! The simulated cluster with replicas (cluster file `replicas = 2`): each
//! server process is assembled as a real one is (`Server`, `Router`, the
//! membership group over openraft, following its map: see
//! madfs_server::injected), over simulated disks (its home store, its Raft
//! store, one store per copy of another set) and the in-process network.
//! A crashed process may stay down for a while: the group fails its set
//! over to the replica, and the process, restarted, is resynced.

use crate::disk::{SimDisk, SimKv};
use crate::net::{Caller, SimNet, Target};
use madfs_kv::KvStore;
use madfs_proto::auth::Role;
use madfs_rpc::{ClusterConfig, Pool};
use madfs_server::injected::{ReplicatedProcess, Stores};
use madfs_server::RunOptions;
use madfs_types::ServerId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Name of the real (empty) directory that says a copy's store exists:
/// a resync removes the copy's directory, and with it this marker.
const MARKER: &str = "sim-meta";

/// Every simulated disk of the replicated cluster, surviving crashes.
#[derive(Default)]
pub struct Disks {
    /// The copy of set `.1` kept by process `.0`.
    copies: Mutex<BTreeMap<(u16, u16), Arc<SimDisk>>>,
}

impl Disks {
    pub fn copy(&self, process: ServerId, set: ServerId) -> Option<Arc<SimDisk>> {
        self.lock().get(&(process.0, set.0)).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u16, u16), Arc<SimDisk>>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every copy disk of `process` (to crash them with it).
    pub fn copies_of(&self, process: ServerId) -> Vec<Arc<SimDisk>> {
        self.lock()
            .iter()
            .filter(|((p, _), _)| *p == process.0)
            .map(|(_, d)| d.clone())
            .collect()
    }
}

/// The stores and pools of one process incarnation.
struct ProcessStores {
    net: Arc<SimNet>,
    me: ServerId,
    incarnation: u64,
    servers: usize,
    disks: Arc<Disks>,
    boot: madfs_server::replica::BootId,
}

/// The boot id of server `id`'s host after `cuts` power cuts.
pub(crate) fn boot_id(id: ServerId, cuts: u64) -> madfs_server::replica::BootId {
    let mut b = [0u8; 16];
    b[..2].copy_from_slice(&id.0.to_le_bytes());
    b[8..].copy_from_slice(&cuts.to_le_bytes());
    b
}

/// The set a copy directory (DATA/replica-of-S) keeps.
fn set_of(dir: &Path) -> std::io::Result<ServerId> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("replica-of-"))
        .and_then(|n| n.parse().ok())
        .map(ServerId)
        .ok_or_else(|| std::io::Error::other(format!("not a copy: {}", dir.display())))
}

impl Stores for ProcessStores {
    fn open_meta(&self, dir: &Path) -> std::io::Result<Arc<dyn KvStore>> {
        let set = set_of(dir)?;
        let marker = dir.join(MARKER);
        let mut copies = self.disks.lock();
        let disk = match copies.get(&(self.me.0, set.0)) {
            Some(d) if marker.exists() => d.clone(),
            // Never made, or wiped by a resync: an empty disk.
            _ => {
                let d = Arc::new(SimDisk::default());
                copies.insert((self.me.0, set.0), d.clone());
                d
            }
        };
        std::fs::create_dir_all(&marker)?;
        Ok(Arc::new(disk.open()))
    }

    fn boot(&self) -> Option<madfs_server::replica::BootId> {
        Some(self.boot)
    }

    fn peers(&self) -> Pool {
        Pool::in_process_failover(
            self.net.endpoint(Caller::Server(self.me, self.incarnation)),
            self.servers,
            Role::Peer,
        )
    }
}

/// The processes of the replicated cluster and their extra disks.
pub struct Replicated {
    pub disks: Arc<Disks>,
    /// Each server's Raft store (all three servers are voters).
    pub raft: Vec<Arc<SimDisk>>,
    pub procs: Vec<Option<ReplicatedProcess>>,
    /// Each server's power cuts: its host's boot (`Stores::boot`), so a
    /// copy written before a power cut is not taken for whole after it.
    boots: Vec<u64>,
}

impl Replicated {
    pub fn new(servers: usize) -> Replicated {
        Replicated {
            disks: Arc::new(Disks::default()),
            raft: (0..servers).map(|_| Arc::new(SimDisk::default())).collect(),
            procs: (0..servers).map(|_| None).collect(),
            boots: vec![0; servers],
        }
    }

    /// Start process `id` over what its disks hold: open it, make it
    /// reachable, then join the group (voters must reach each other).
    pub async fn start(
        &mut self,
        cfg: &ClusterConfig,
        net: &Arc<SimNet>,
        home: &Arc<SimDisk>,
        id: ServerId,
        opts: &RunOptions,
    ) -> Result<(), String> {
        let inc = net.next_incarnation(id);
        let kv: Arc<SimKv> = Arc::new(home.open());
        let data_dir: PathBuf = cfg.servers[id.0 as usize].data_dir.clone();
        let stores: Arc<dyn Stores> = Arc::new(ProcessStores {
            net: net.clone(),
            me: id,
            incarnation: inc,
            servers: cfg.servers.len(),
            disks: self.disks.clone(),
            boot: boot_id(id, self.boots[id.0 as usize]),
        });
        let mut p =
            ReplicatedProcess::open(cfg, id, kv.clone(), data_dir.clone(), opts, stores.clone())
                .map_err(|e| format!("server {id} does not start: {e}"))?;
        net.install_target(id, inc, Target::Routed(p.router.clone()), kv);
        let raft: Arc<dyn KvStore> = Arc::new(self.raft[id.0 as usize].open());
        p.join_group(cfg, &data_dir, &stores, raft)
            .await
            .map_err(|e| format!("server {id} does not join the group: {e}"))?;
        self.procs[id.0 as usize] = Some(p);
        Ok(())
    }

    /// Process `id` died (its requests were killed by the network): stop
    /// what it left running, and crash every disk it had, keeping `keep`
    /// of each one's unsynced batches (usize::MAX: all, a process kill).
    /// Unsynced batches lost.
    pub fn kill(&mut self, id: ServerId, home: &Arc<SimDisk>, keep: usize) -> usize {
        if let Some(p) = self.procs[id.0 as usize].take() {
            // Its Raft node and detector would otherwise tick on.
            tokio::spawn(async move { p.stop_group().await });
        }
        if keep != usize::MAX {
            self.boots[id.0 as usize] += 1;
        }
        let mut lost = home.crash(keep);
        lost += self.raft[id.0 as usize].crash(keep);
        for d in self.disks.copies_of(id) {
            lost += d.crash(keep);
        }
        lost
    }

    pub fn is_up(&self, id: ServerId) -> bool {
        self.procs[id.0 as usize].is_some()
    }

    /// The newest routes a live process applied: (epoch, serving).
    pub fn routes(&self) -> Option<(u64, Vec<ServerId>)> {
        self.procs
            .iter()
            .flatten()
            .map(|p| p.routes())
            .max_by_key(|(e, _)| *e)
    }

    /// The voters as the live process with the newest map heard them.
    pub fn voters(&self) -> Vec<ServerId> {
        self.procs
            .iter()
            .flatten()
            .max_by_key(|p| p.routes().0)
            .map_or(Vec::new(), |p| p.voters())
    }

    /// The members of each set (in sync, catching up) by the newest map
    /// a live process knows.
    pub fn newest_sets(&self) -> Vec<(Vec<ServerId>, Vec<ServerId>)> {
        self.procs
            .iter()
            .flatten()
            .max_by_key(|p| p.routes().0)
            .map_or(Vec::new(), |p| p.sets())
    }

    /// Whether a server back from a power cut still holds a set it may
    /// have lost writes of (server failover.rs `held`) until it hands it
    /// to a copy. A process kill of the copy then is waited out (members.rs
    /// `hand_back`), but a power cut of it too would lose the writes both
    /// lost (two faults at R = 2): the run makes none then.
    pub fn holding(&self) -> bool {
        self.procs
            .iter()
            .flatten()
            .any(|p| !p.router.held().is_empty())
    }

    /// Whether every set has all its replicas in sync (by the newest map a
    /// live process knows): a crash now leaves every set a live copy. Not
    /// while a server back from a power cut still holds a set it may have
    /// lost writes of (`holding`): the map counts that copy in sync until
    /// the hand-over, so a second fault then is a double fault, made only
    /// on purpose (`SimConfig::double_faults`; seed 17005 with 4 servers
    /// killed the set's other copy in that window).
    pub fn healthy(&self, replicas: usize) -> bool {
        if self.holding() {
            return false;
        }
        let Some(p) = self.procs.iter().flatten().max_by_key(|p| p.routes().0) else {
            return false;
        };
        let sets = p.sets();
        !sets.is_empty()
            && sets
                .iter()
                .all(|(members, syncing)| members.len() == replicas && syncing.is_empty())
    }

    /// The disk each set is served from now, by the newest routes, or why
    /// a set is not served.
    pub fn serving_disks(&self, homes: &[Arc<SimDisk>]) -> Result<Vec<Arc<SimDisk>>, String> {
        let (epoch, serving) = self.routes().ok_or("no server process is up")?;
        let mut out = Vec::new();
        for (set, &p) in serving.iter().enumerate() {
            let set = ServerId(set as u16);
            let proc_ = self.procs[p.0 as usize].as_ref().ok_or_else(|| {
                format!("set {set} is served by server {p}, which is down (map epoch {epoch})")
            })?;
            let server = proc_.router.server_of(set).ok_or_else(|| {
                format!("the map (epoch {epoch}) gives set {set} to server {p}, which does not serve it")
            })?;
            if Arc::ptr_eq(&server, proc_.router.home_server()) {
                out.push(homes[p.0 as usize].clone());
            } else {
                out.push(self.disks.copy(p, set).ok_or_else(|| {
                    format!("server {p} serves set {set} from a copy the simulation never made")
                })?);
            }
        }
        Ok(out)
    }

    /// What each live process follows and serves (for failure reports).
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        for (i, p) in self.procs.iter().enumerate() {
            match p {
                None => out.push(format!("server {i}: down")),
                Some(p) => {
                    let (epoch, serving) = p.routes();
                    let sets: Vec<String> = p
                        .sets()
                        .iter()
                        .map(|(m, s)| format!("{m:?}+{s:?}"))
                        .collect();
                    out.push(format!(
                        "server {i}: map epoch {epoch}, primaries {serving:?}, members {}, serves {:?}",
                        sets.join(" "),
                        p.router.served()
                    ))
                }
            }
        }
        out.join("\n")
    }

    /// Every live process (but `cut`, cut off from the others) has
    /// applied the same routes.
    pub fn routes_agree(&self, cut: Option<ServerId>) -> bool {
        let all: Vec<(u64, Vec<ServerId>)> = self
            .procs
            .iter()
            .flatten()
            .filter(|p| Some(p.id()) != cut)
            .map(|p| p.routes())
            .collect();
        all.windows(2).all(|w| w[0] == w[1])
    }
}
