//! The simulation driver: builds a cluster of real servers over simulated
//! disks and network, drives random namespace operations through real
//! clients, injects faults, and checks the model after every step.

use crate::disk::SimDisk;
use crate::model::{observe, Action, Entry, Model, Observed};
use crate::net::{Caller, Faults, SimNet};
use crate::replicated::Replicated;
use madfs_client::{CacheConfig, Client, ClientError, ErrorCode, OpenOptions};
use madfs_proto::auth::Role;
use madfs_rpc::{ClusterConfig, Pool, ServerEntry};
use madfs_server::{RunOptions, Server};
use madfs_types::{Credentials, FileKind, InodeId, ServerId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

#[path = "run_replicated.rs"]
mod run_replicated;

/// Virtual time given to background recovery (rename settling, purges,
/// touches) after each step before the stores are checked.
const SETTLE: Duration = Duration::from_secs(120);
const CHUNK_SIZE: u64 = 64 * 1024;
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// What one run simulates.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub steps: usize,
    pub servers: usize,
    pub clients: usize,
    /// Print every step.
    pub verbose: bool,
    /// Which renames may run at the same time (known bugs lie there).
    /// Default from `MADFS_SIM_RENAME_RACES`.
    pub rename_races: RenameRaces,
    /// Replicas of each set (cluster file `replicas`): 1, or 2 for the
    /// cluster with the membership group and failovers (replicated.rs).
    pub replicas: usize,
    /// With replicas: half the kills are power cuts (the server's disks
    /// lose a random part of what was not synced). Off replays the
    /// trajectories of seeds from before power cuts existed.
    pub power_cuts: bool,
    /// With power cuts: a quarter of them end with the server back at
    /// once, before the group fails its sets over, with a store that may
    /// lack what its copies acknowledged. Off replays the trajectories of
    /// seeds from before these existed.
    pub quick_restarts: bool,
    /// With quick restarts between steps: half of them also kill (a
    /// process kill) the set's in-sync copy before the server is back,
    /// and start it again only once the group took it out of the set: a
    /// second fault inside the hand-over (server members.rs `hand_back`).
    /// On by default (`MADFS_SIM_DOUBLE_FAULTS=0` turns it off, to replay
    /// seeds from before it; it was off until the primary kept the copies
    /// it waits for, which seed 17018 with 4 servers needed).
    pub double_faults: bool,
}

/// Renames the simulation runs at the same time as another rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameRaces {
    /// None (`MADFS_SIM_RENAME_RACES=none`).
    None,
    /// Any two but two directory moves (`=files`; the default until
    /// directory moves were ordered, and what the seeds found before were
    /// found with). Two renames whose sources and targets cross used to
    /// wait on each other until the call timeout (seeds 4009 and 35;
    /// fixed: stripes are taken all or nothing, an install waits 250 ms
    /// for its locks, retries pause for a varying time).
    Files,
    /// Any two (the default, or `=all`): two directory moves made a ring
    /// no name reaches (seed 300, 60 steps; fixed: server dir_moves.rs).
    All,
}

impl SimConfig {
    pub fn new(seed: u64, steps: usize) -> SimConfig {
        SimConfig {
            seed,
            steps,
            servers: 3,
            clients: 2,
            verbose: false,
            rename_races: match std::env::var("MADFS_SIM_RENAME_RACES").as_deref() {
                Ok("files") => RenameRaces::Files,
                Ok("none") => RenameRaces::None,
                _ => RenameRaces::All,
            },
            replicas: 1,
            power_cuts: true,
            quick_restarts: true,
            double_faults: std::env::var("MADFS_SIM_DOUBLE_FAULTS").map_or(true, |v| v != "0"),
        }
    }

    /// A run of the cluster that keeps two replicas of each set, with
    /// failovers decided by the membership group.
    pub fn replicated(seed: u64, steps: usize) -> SimConfig {
        SimConfig {
            replicas: 2,
            ..SimConfig::new(seed, steps)
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub steps: usize,
    pub ops_ok: usize,
    pub ops_failed: usize,
    pub crashes: usize,
    pub lost_batches: usize,
    pub dropped: u64,
    pub delivered: u64,
    /// Inodes leaked after a crash or a lost message (which the design
    /// admits).
    pub leaks: usize,
    /// Writes past the end whose hole showed bytes a crash or a lost
    /// message had cut off (a known gap).
    pub stale_holes: usize,
    /// Calls that waited the whole call timeout with nothing lost: servers
    /// waiting on each other.
    pub stalls: u64,
    /// A digest of every step's action, result and observed state: two
    /// runs of one seed must give the same.
    pub trace: u64,
    /// With replicas: sets that moved to another server, partitions, and
    /// servers restarted after being down.
    pub failovers: usize,
    pub partitions: usize,
    pub restarts: usize,
    /// With replicas: voters whose place moved to another server (a voter
    /// down past `voter_lost_after`).
    pub voter_moves: usize,
    /// With replicas: kills that were power cuts (unsynced writes lost).
    pub power_cuts: usize,
    /// Power cuts whose server came back at once (`quick_restarts`).
    pub quick_restarts: usize,
    /// Of those, the ones whose set's copy was killed too (`double_faults`).
    pub double_faults: usize,
    /// Directory link counts a loss left wrong, set right by the repair of
    /// `madfs fsck` (client fsck.rs).
    pub links_repaired: usize,
    /// Leaks (counts above the names, inodes no name reaches) set right or
    /// freed by `madfs fsck --repair`'s inode check.
    pub leaks_repaired: usize,
    /// Of those, leaked files holding data that the repair gave names in
    /// /lost+found (read back and removed by the run).
    pub leaks_adopted: usize,
}

/// A broken invariant, with what is needed to replay it.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub steps: usize,
    pub step: usize,
    pub message: String,
    pub log: Vec<String>,
    /// Replicas of each set and servers (the replay command names them).
    pub replicas: usize,
    pub servers: usize,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "simulation seed {} failed at step {}:",
            self.seed, self.step
        )?;
        writeln!(f, "  {}", self.message.replace('\n', "\n  "))?;
        writeln!(f, "last steps:")?;
        for l in self.log.iter().rev().take(25).rev() {
            writeln!(f, "  {l}")?;
        }
        if self.replicas > 1 {
            return write!(
                f,
                "replay: MADFS_SIM_REPLICAS={} MADFS_SIM_SERVERS={} MADFS_SIM_SEED={} MADFS_SIM_STEPS={} cargo test -p madfs-sim --test sim replicated -- --nocapture",
                self.replicas, self.servers, self.seed, self.steps
            );
        }
        write!(
            f,
            "replay: MADFS_SIM_SEED={} MADFS_SIM_STEPS={} cargo test -p madfs-sim --test sim -- --nocapture",
            self.seed, self.steps
        )
    }
}

/// Run one seed in a fresh single-threaded runtime on a paused clock.
pub fn run(cfg: &SimConfig) -> Result<Outcome, Failure> {
    madfs_server::run_disk_io_inline(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("building the simulation runtime");
    // A seed that never finishes (a task spinning without yielding stops
    // the simulated clock) is reported like a failure, then the process
    // ends: nothing else can stop the runtime's thread.
    let step = Arc::new(AtomicUsize::new(0));
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let (seed, steps, seen) = (cfg.seed, cfg.steps, step.clone());
    let hang = Duration::from_secs(
        std::env::var("MADFS_SIM_HANG_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    );
    let watchdog = std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(hang) {
            eprintln!(
                "simulation seed {seed} hung at step {} (no progress in {hang:?} of real time)\n\
                 replay: MADFS_SIM_SEED={seed} MADFS_SIM_STEPS={steps} cargo test -p madfs-sim --test sim -- --nocapture",
                seen.load(Ordering::Relaxed)
            );
            std::process::exit(101);
        }
    });
    let cfg2 = cfg.clone();
    let result = rt.block_on(async move {
        // openraft's election timeouts, drawn on this thread: from the seed.
        madfs_membership::seed_thread_rng(cfg2.seed);
        let mut sim = Sim::new(&cfg2, step).map_err(|m| Failure {
            seed: cfg2.seed,
            steps: cfg2.steps,
            step: 0,
            message: m,
            log: Vec::new(),
            replicas: cfg2.replicas,
            servers: cfg2.servers,
        })?;
        if let Err(m) = sim.start_replicated().await {
            return Err(sim.fail(m));
        }
        let r = sim.run().await;
        sim.shutdown();
        r
    });
    // Tasks of crashed servers may still hold their stores: drop them now.
    rt.shutdown_background();
    drop(done);
    let _ = watchdog.join();
    result
}

struct Cluster {
    cfg: ClusterConfig,
    net: Arc<SimNet>,
    disks: Vec<Arc<SimDisk>>,
    /// With replicas: the processes, their Raft stores and copies.
    replicated: Option<Replicated>,
    _dir: tempfile::TempDir,
}

fn run_options() -> RunOptions {
    RunOptions {
        threads: Some(1),
        find_index_bytes: 0,
        direct_io: false,
        cache_bytes: 0,
        ..RunOptions::default()
    }
}

impl Cluster {
    /// Start process `id` of the cluster with replicas.
    async fn start_replicated(&mut self, id: ServerId) -> Result<(), String> {
        let rep = self.replicated.as_mut().expect("a cluster with replicas");
        rep.start(
            &self.cfg,
            &self.net,
            &self.disks[id.0 as usize],
            id,
            &run_options(),
        )
        .await
    }

    fn start(&self, id: ServerId) -> Result<(), String> {
        let inc = self.net.next_incarnation(id);
        let kv = Arc::new(self.disks[id.0 as usize].open());
        let stores = Arc::new(PlainStores {
            net: self.net.clone(),
            me: id,
            incarnation: inc,
            servers: self.disks.len(),
        });
        let peers = madfs_server::injected::Stores::peers(stores.as_ref());
        let opts = run_options();
        let data_dir = self.cfg.servers[id.0 as usize].data_dir.clone();
        let server = Server::with_parts(
            &self.cfg,
            id,
            kv.clone(),
            data_dir,
            &opts,
            peers,
            Some(stores),
        )
        .map_err(|e| format!("server {id} does not start: {e}"))?;
        let server = Arc::new(server);
        self.net.install(id, inc, server.clone(), kv);
        server.start_background();
        Ok(())
    }
}

/// Where a write with its fsync stops for the step's crash: the write is
/// done (first), the fsync may go (second).
type Between = (
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
);

/// What a server of the cluster without replicas gets from its process:
/// its peers, and a boot of its own per start. Every crash here is a power
/// cut (a disk loses unsynced batches), so each start is a new boot: a
/// store comes back from one as a real server's does (its write verifier
/// renewed, restart.rs).
struct PlainStores {
    net: Arc<SimNet>,
    me: ServerId,
    incarnation: u64,
    servers: usize,
}

impl madfs_server::injected::Stores for PlainStores {
    fn open_meta(&self, dir: &std::path::Path) -> std::io::Result<Arc<dyn madfs_kv::KvStore>> {
        Err(std::io::Error::other(format!(
            "no copies without replicas: {}",
            dir.display()
        )))
    }

    fn peers(&self) -> Pool {
        Pool::in_process(
            self.net.endpoint(Caller::Server(self.me, self.incarnation)),
            self.servers,
            Role::Peer,
        )
    }

    fn boot(&self) -> Option<madfs_server::replica::BootId> {
        Some(crate::replicated::boot_id(self.me, self.incarnation))
    }
}

struct Sim {
    seed: u64,
    steps: usize,
    verbose: bool,
    rng: ChaCha8Rng,
    cluster: Cluster,
    clients: Vec<Client>,
    model: Model,
    /// The model at the last successful sync of every server, and what was
    /// touched since (paths, and files by inode).
    synced: Model,
    dirty_paths: BTreeSet<String>,
    /// Paths below which anything may have changed (renames).
    dirty_trees: BTreeSet<String>,
    dirty_files: BTreeSet<InodeId>,
    /// Files whose fsync was acknowledged, with their bytes then (cleared
    /// when they change again).
    fsynced: HashMap<InodeId, Vec<u8>>,
    /// Writes whose fsync was acknowledged in a step with a crash: their
    /// bytes at their offset (what the file held before may have been
    /// lost, unsynced, by that crash), until the file changes again.
    fsynced_writes: HashMap<InodeId, (usize, Vec<u8>)>,
    log: Vec<String>,
    /// Inodes seen leaked at the last check.
    leaked: BTreeSet<InodeId>,
    out: Outcome,
    step: usize,
    /// The step, for the watchdog.
    progress: Arc<AtomicUsize>,
    rename_races: RenameRaces,
    power_cuts: bool,
    quick_restarts: bool,
    double_faults: bool,
    /// Files that may hold chunk bytes past their size (a crash or a
    /// failed write since they were made).
    ghosts: BTreeSet<InodeId>,
    /// Files that existed when a server crashed: the next fsync of one
    /// through a client that wrote it may report a loss (EIO, the write
    /// verifier), whatever its own write did.
    lost_unreported: BTreeSet<InodeId>,
    /// With replicas: the server down and the step it restarts at, and the
    /// server cut off from the others and the step the partition heals.
    down: Option<(ServerId, usize)>,
    isolated: Option<(ServerId, usize)>,
    /// (power cuts, lost batches) when every directory's link count was
    /// last seen right: a count wrong with no loss since is a bug.
    links_right_at: (usize, usize),
}

/// What an operation returned (Ok(true): its fsync was acknowledged).
type OpResult = Result<bool, ClientError>;

fn is_uncertain(e: &ClientError) -> bool {
    matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut)
}

fn fnv(h: &mut u64, s: &str) {
    for b in s.bytes() {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

impl Sim {
    fn new(cfg: &SimConfig, progress: Arc<AtomicUsize>) -> Result<Sim, String> {
        let dir = tempfile::Builder::new()
            .prefix("madfs-sim-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let servers = (0..cfg.servers)
            .map(|i| ServerEntry {
                id: i as u16,
                address: std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)),
                data_dir: dir.path().join(format!("server{i}")),
                metrics: None,
                host: None,
            })
            .collect();
        let ccfg = ClusterConfig {
            cluster_id: "sim".into(),
            chunk_size: CHUNK_SIZE,
            key_file: dir.path().join("key"),
            replicas: cfg.replicas as u8,
            voters: madfs_rpc::cluster::voters_for(cfg.servers),
            servers,
        };
        let net = SimNet::new(cfg.seed, cfg.servers);
        let cluster = Cluster {
            cfg: ccfg,
            net: net.clone(),
            disks: (0..cfg.servers)
                .map(|_| Arc::new(SimDisk::default()))
                .collect(),
            replicated: (cfg.replicas > 1).then(|| Replicated::new(cfg.servers)),
            _dir: dir,
        };
        // Server 0 first: it makes the root. (With replicas, the processes
        // start in `start_replicated`, on the runtime.)
        if cluster.replicated.is_none() {
            for i in 0..cfg.servers {
                cluster.start(ServerId(i as u16))?;
            }
        }
        let clients = (0..cfg.clients)
            .map(|i| {
                let endpoint = net.endpoint(Caller::Client(i as u16));
                let pool = if cfg.replicas > 1 {
                    Pool::in_process_failover(endpoint, cfg.servers, Role::Client)
                } else {
                    Pool::in_process(endpoint, cfg.servers, Role::Client)
                };
                Client::from_pool(&cluster.cfg, pool)
                    .map(|c| c.with_cache(CacheConfig::off()))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sim {
            seed: cfg.seed,
            steps: cfg.steps,
            verbose: cfg.verbose,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cluster,
            clients,
            model: Model::default(),
            synced: Model::default(),
            dirty_paths: BTreeSet::new(),
            dirty_trees: BTreeSet::new(),
            dirty_files: BTreeSet::new(),
            fsynced: HashMap::new(),
            fsynced_writes: HashMap::new(),
            log: Vec::new(),
            leaked: BTreeSet::new(),
            out: Outcome {
                trace: 0xcbf2_9ce4_8422_2325,
                ..Outcome::default()
            },
            step: 0,
            progress,
            rename_races: cfg.rename_races,
            power_cuts: cfg.power_cuts,
            quick_restarts: cfg.quick_restarts,
            double_faults: cfg.double_faults,
            ghosts: BTreeSet::new(),
            lost_unreported: BTreeSet::new(),
            down: None,
            isolated: None,
            links_right_at: (0, 0),
        })
    }

    fn shutdown(&mut self) {
        for i in 0..self.cluster.disks.len() {
            drop(self.cluster.net.kill(ServerId(i as u16)));
        }
        if let Some(r) = &mut self.cluster.replicated {
            r.procs.iter_mut().for_each(|p| drop(p.take()));
        }
    }

    fn note(&mut self, line: String) {
        fnv(&mut self.out.trace, &line);
        if self.verbose {
            eprintln!("[seed {} step {}] {line}", self.seed, self.step);
        }
        self.log.push(format!("{}: {line}", self.step));
    }

    fn fail(&self, message: String) -> Failure {
        Failure {
            seed: self.seed,
            steps: self.steps,
            step: self.step,
            message,
            log: self.log.clone(),
            replicas: self.cluster.cfg.replicas as usize,
            servers: self.cluster.disks.len(),
        }
    }

    // ---- choosing -------------------------------------------------------

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.rng.random_range(0..v.len())])
        }
    }

    fn some_dir(&mut self) -> String {
        let mut dirs = vec![String::new()];
        dirs.extend(
            self.model
                .names
                .iter()
                .filter(|(p, e)| e.kind == FileKind::Dir && p.matches('/').count() < 3)
                .map(|(p, _)| p.clone()),
        );
        self.pick(&dirs).cloned().unwrap_or_default()
    }

    fn some_path(&mut self) -> String {
        let dir = self.some_dir();
        let name = NAMES[self.rng.random_range(0..NAMES.len())];
        format!("{dir}/{name}")
    }

    fn existing(&mut self, kind: Option<FileKind>) -> String {
        let v: Vec<String> = self
            .model
            .names
            .iter()
            .filter(|(_, e)| kind.is_none_or(|k| e.kind == k))
            .map(|(p, _)| p.clone())
            .collect();
        match self.pick(&v) {
            Some(p) if self.rng.random_range(0..10) > 0 => p.clone(),
            _ => self.some_path(),
        }
    }

    fn data(&mut self, max: usize) -> Vec<u8> {
        let len = self.rng.random_range(1..=max);
        let b = self.rng.random::<u8>();
        (0..len).map(|i| b.wrapping_add(i as u8)).collect()
    }

    fn choose(&mut self) -> Action {
        match self.rng.random_range(0..100) {
            0..=14 => Action::Mkdir(self.some_path()),
            15..=29 => {
                let p = self.some_path();
                let d = self.data(3000);
                Action::Create(p, d)
            }
            30..=41 => {
                let path = self.existing(Some(FileKind::File));
                // Mostly chunk 0 (inline); sometimes past it, into chunk files.
                let offset = if self.rng.random_bool(0.25) {
                    self.rng.random_range(0..3 * CHUNK_SIZE)
                } else {
                    self.rng.random_range(0..8192)
                };
                let max = if self.rng.random_bool(0.1) {
                    70_000
                } else {
                    2000
                };
                let data = self.data(max);
                let fsync = self.rng.random_bool(0.5);
                Action::Write {
                    path,
                    offset,
                    data,
                    fsync,
                }
            }
            42..=47 => {
                let p = self.existing(Some(FileKind::File));
                let size = if self.rng.random_bool(0.2) {
                    self.rng.random_range(0..2 * CHUNK_SIZE)
                } else {
                    self.rng.random_range(0..4000)
                };
                Action::Truncate(p, size)
            }
            48..=67 => {
                let a = self.existing(None);
                let b = if self.rng.random_bool(0.3) {
                    self.existing(None)
                } else {
                    self.some_path()
                };
                Action::Rename(a, b)
            }
            68..=74 => {
                let a = self.existing(Some(FileKind::File));
                let b = self.some_path();
                Action::Link(a, b)
            }
            75..=84 => Action::Unlink(self.existing(Some(FileKind::File))),
            85..=93 => Action::Rmdir(self.existing(Some(FileKind::Dir))),
            _ => Action::SyncAll,
        }
    }

    // ---- running --------------------------------------------------------

    /// `between`: for a write with its fsync, told once the write is done,
    /// and waited on before the fsync goes (the step crashes a server
    /// there).
    async fn perform(
        client: &Client,
        a: &Action,
        between: Option<Between>,
    ) -> Result<bool, ClientError> {
        match a {
            Action::Mkdir(p) => client.mkdir(p.as_str(), 0o755).await.map(|_| false),
            Action::Create(p, data) => {
                let f = client
                    .open(
                        p.as_str(),
                        OpenOptions::new().write(true).create_new(true).perm(0o644),
                    )
                    .await?;
                let w = f.write_at(0, data).await;
                let c = f.close().await;
                w?;
                c.map(|_| false)
            }
            Action::Write {
                path,
                offset,
                data,
                fsync,
            } => {
                let f = client
                    .open(path.as_str(), OpenOptions::new().write(true))
                    .await?;
                let mut synced = false;
                let mut r = f.write_at(*offset, data).await.map(|_| ());
                if r.is_ok() && *fsync {
                    if let Some((written, go)) = between {
                        let _ = written.send(());
                        let _ = go.await;
                    }
                    r = f.fsync().await;
                    synced = r.is_ok();
                }
                let c = f.close().await;
                r?;
                c.map(|_| synced)
            }
            Action::Truncate(p, size) => client.truncate(p.as_str(), *size).await.map(|_| false),
            Action::Rename(a, b) => client.rename(a.as_str(), b.as_str()).await.map(|_| false),
            Action::Link(a, b) => client
                .hard_link(a.as_str(), b.as_str())
                .await
                .map(|_| false),
            Action::Unlink(p) => client.remove_file(p.as_str()).await.map(|_| false),
            Action::Rmdir(p) => client.remove_dir(p.as_str()).await.map(|_| false),
            Action::SyncAll => client.fsync_all().await.map(|_| false),
        }
    }

    /// Crash server `id` and bring it back over what its disk kept.
    fn crash(&mut self, id: ServerId) -> Result<(), Failure> {
        // Any file: a client that wrote one and did not fsync it itself
        // reports the loss even when another client's sync of the whole
        // server made its writes durable before the crash.
        self.lost_unreported
            .extend(self.model.content.keys().copied());
        if self.cluster.replicated.is_some() {
            // It stays down a while: its set fails over (run_replicated.rs).
            let power_cut = self.power_cut_now();
            self.kill_replicated(id, power_cut);
            // A quick restart comes at the next step's start.
            return Ok(());
        }
        let disk = self.cluster.disks[id.0 as usize].clone();
        let pending = disk.pending();
        let keep = if pending == 0 || self.rng.random_bool(0.3) {
            pending
        } else {
            self.rng.random_range(0..=pending)
        };
        drop(self.cluster.net.kill(id));
        let lost = disk.crash(keep);
        disk.set_full(false);
        self.out.crashes += 1;
        self.out.lost_batches += lost;
        self.note(format!(
            "crash server {id}: {lost} of {pending} unsynced batches lost"
        ));
        self.cluster.start(id).map_err(|m| self.fail(m))
    }

    async fn run(&mut self) -> Result<Outcome, Failure> {
        for step in 1..=self.steps {
            self.step = step;
            self.progress.store(step, Ordering::Relaxed);
            self.one_step().await?;
        }
        self.out.steps = self.steps;
        self.out.dropped = self.cluster.net.dropped();
        self.out.delivered = self.cluster.net.delivered();
        self.out.stalls = self.cluster.net.stalls();
        Ok(self.out.clone())
    }

    async fn one_step(&mut self) -> Result<(), Failure> {
        let servers = self.cluster.disks.len();
        let replicated = self.cluster.replicated.is_some();
        if replicated && self.replicated_event().await? {
            return Ok(());
        }
        // A crash between operations.
        if !replicated && self.rng.random_range(0..100) < 4 {
            let id = ServerId(self.rng.random_range(0..servers as u16));
            self.crash(id)?;
            self.settle().await;
            return self.check(None, true).await;
        }
        let mut actions = vec![self.choose()];
        if self.rng.random_range(0..100) < 30 {
            // A second client at the same time, on names only (two writers
            // of one file are not atomic with respect to each other).
            let dir_move = |m: &Model, a: &Action| match a {
                Action::Rename(src, _) => m.is_dir(src),
                _ => false,
            };
            let is_rename = |a: &Action| matches!(a, Action::Rename(..));
            loop {
                let a = self.choose();
                // Two renames at once hit known bugs: left out unless asked.
                let skip = match self.rename_races {
                    RenameRaces::None => is_rename(&actions[0]) && is_rename(&a),
                    RenameRaces::Files => {
                        dir_move(&self.model, &actions[0]) && dir_move(&self.model, &a)
                    }
                    RenameRaces::All => false,
                };
                if skip {
                    continue;
                }
                if matches!(
                    a,
                    Action::Mkdir(_)
                        | Action::Rename(..)
                        | Action::Link(..)
                        | Action::Unlink(_)
                        | Action::Rmdir(_)
                ) {
                    actions.push(a);
                    break;
                }
            }
        }
        let first = self.rng.random_range(0..self.clients.len());
        let clients: Vec<Client> = (0..actions.len())
            .map(|k| self.clients[(first + k) % self.clients.len()].clone())
            .collect();
        let faulty = self.rng.random_range(0..100) < 30;
        if faulty {
            let drop_permille = self.rng.random_range(5..80);
            self.cluster.net.set_faults(Some(Faults {
                drop_permille,
                delay_max_us: 3000,
            }));
        }
        let full = if self.rng.random_range(0..100) < 5 {
            let id = self.rng.random_range(0..servers);
            self.cluster.disks[id].set_full(true);
            Some(id)
        } else {
            None
        };
        // A crash in the middle of the operations.
        let mut crash_at = if self.rng.random_range(0..100) < 8 {
            Some((
                ServerId(self.rng.random_range(0..servers as u16)),
                Duration::from_micros(self.rng.random_range(0..4000)),
            ))
        } else {
            None
        };
        if replicated && !self.may_fault() {
            // One server down or cut off at a time, and only while every
            // set has a copy in sync elsewhere.
            crash_at = None;
        }
        // A write with its fsync, alone, and a crash: half the time the
        // crash hits the file's owner (which holds what the write changed
        // in its store, unsynced) between the write and the fsync, where a
        // lost write must fail the fsync (the write verifier).
        let mut crash_between = None;
        if let (
            Some((_, at)),
            [Action::Write {
                path, fsync: true, ..
            }],
        ) = (crash_at, &actions[..])
        {
            let owner = self
                .model
                .names
                .get(path)
                .and_then(|e| e.ino)
                .map(|i| i.owner());
            if let (Some(owner), true) = (owner, at.as_micros() % 2 == 0) {
                crash_between = Some(owner);
                crash_at = None;
            }
        }
        if self.verbose {
            for a in &actions {
                eprintln!(
                    "[seed {} step {}] starting {}{}{}{}",
                    self.seed,
                    self.step,
                    a.describe(),
                    if faulty { " [lossy net]" } else { "" },
                    full.map_or(String::new(), |i| format!(" [server {i} disk full]")),
                    crash_at.map_or(String::new(), |(id, at)| format!(
                        " [server {id} crashes after {at:?}]"
                    )),
                );
            }
        }
        let dropped_before = self.cluster.net.dropped();
        let mut crashed = false;
        let results: Vec<Result<bool, ClientError>> = {
            let (written_tx, written_rx) = tokio::sync::oneshot::channel();
            let (go_tx, go_rx) = tokio::sync::oneshot::channel();
            let between = crash_between.map(|_| (written_tx, go_rx));
            let ops = async {
                if actions.len() == 1 {
                    vec![Self::perform(&clients[0], &actions[0], between).await]
                } else {
                    let (a, b) = tokio::join!(
                        Self::perform(&clients[0], &actions[0], None),
                        Self::perform(&clients[1], &actions[1], None)
                    );
                    vec![a, b]
                }
            };
            match (crash_at, crash_between) {
                (_, Some(id)) => {
                    tokio::pin!(ops);
                    tokio::select! {
                        biased;
                        r = &mut ops => r,
                        written = written_rx => {
                            if written.is_ok() {
                                self.crash(id)?;
                                crashed = true;
                            }
                            let _ = go_tx.send(());
                            ops.await
                        }
                    }
                }
                (None, None) => ops.await,
                (Some((id, at)), None) => {
                    tokio::pin!(ops);
                    tokio::select! {
                        biased;
                        r = &mut ops => r,
                        _ = tokio::time::sleep(at) => {
                            self.crash(id)?;
                            crashed = true;
                            ops.await
                        }
                    }
                }
            }
        };
        self.cluster.net.set_faults(None);
        if let Some(id) = full {
            self.cluster.disks[id].set_full(false);
        }
        // A server down or cut off (with replicas) may fail an operation
        // too: a set failing over, a replica the group has not yet taken
        // out.
        let disturbed = crashed
            || full.is_some()
            || self.cluster.net.dropped() != dropped_before
            || self.down.is_some()
            || self.isolated.is_some();
        // With replicas a crash is a process kill (nothing unsynced lost):
        // every acknowledged operation must survive it and the failover,
        // so the step is checked as one that met a fault, not as a crash.
        let crashed = crashed && !replicated;
        for (action, result) in actions.iter().zip(&results) {
            let desc = format!(
                "{}{}{}{} -> {}",
                if actions.len() > 1 { "|| " } else { "" },
                action.describe(),
                if faulty { " [lossy net]" } else { "" },
                full.map_or(String::new(), |i| format!(" [server {i} disk full]")),
                match result {
                    Ok(true) => "ok (fsynced)".to_string(),
                    Ok(false) => "ok".to_string(),
                    Err(e) => format!("{:?} {}", e.code, e.message),
                }
            );
            self.note(desc);
            match result {
                Ok(_) => self.out.ops_ok += 1,
                Err(_) => self.out.ops_failed += 1,
            }
            // On a healthy cluster no move waits out the directory-move
            // lock: one held past its lease was settled by the recovery
            // before this step (seed 30346 had every later move refused).
            if let Err(e) = result {
                if e.code == ErrorCode::Busy && !disturbed {
                    return Err(self.fail(format!(
                        "{} failed with EBUSY on a healthy cluster: {}",
                        action.describe(),
                        e.message
                    )));
                }
            }
        }
        self.settle().await;
        self.check(Some((&actions, &results, disturbed)), crashed)
            .await
    }

    /// Let background recovery finish with the network healthy.
    async fn settle(&mut self) {
        self.cluster.net.set_faults(None);
        if self.cluster.replicated.is_some() {
            return self.settle_replicated().await;
        }
        tokio::time::sleep(SETTLE).await;
    }

    /// Read every file the servers hold (by any one name).
    async fn read_all(&self, obs: &Observed) -> Result<HashMap<InodeId, Vec<u8>>, String> {
        let client = &self.clients[0];
        let mut out = HashMap::new();
        for (p, (kind, ino)) in &obs.names {
            if *kind != FileKind::File || out.contains_key(ino) {
                continue;
            }
            let bytes = client
                .read_file(p.as_str())
                .await
                .map_err(|e| format!("reading {p} after recovery: {e}"))?;
            out.insert(*ino, bytes);
        }
        Ok(out)
    }

    /// `madfs fsck --repair` after a loss left directory link counts
    /// (`wrong`) off: every one must then be right. The stores as observed
    /// after it.
    async fn repair_links(
        &mut self,
        disks: &[Arc<SimDisk>],
        wrong: &[String],
    ) -> Result<Observed, Failure> {
        let fsck = self.clients[0].with_credentials(Credentials::root());
        let check = fsck
            .check_dir_links("/", true)
            .await
            .map_err(|e| self.fail(format!("fsck --repair after recovery: {e}")))?;
        let repaired = check.wrong.len() - check.left_wrong();
        self.log.push(format!(
            "fsck --repair: {repaired} of {} wrong link counts set right ({})",
            check.wrong.len(),
            wrong.join("; ")
        ));
        self.out.links_repaired += repaired;
        let obs = observe(disks);
        if !obs.dir_links.is_empty() || check.left_wrong() > 0 {
            return Err(self.fail(format!(
                "fsck --repair left directory link counts off:\n{}\nit reported: {:?}",
                obs.dir_links.join("\n"),
                check.wrong
            )));
        }
        Ok(obs)
    }

    /// `madfs fsck --repair`'s inode check while the stores show leaks:
    /// each must be repaired (an empty directory no name reaches freed),
    /// unless the servers report link drops, renames, or directory
    /// removals or moves still unfinished. The stores as observed after it.
    async fn repair_leaks(
        &mut self,
        disks: &[Arc<SimDisk>],
        before: &Observed,
    ) -> Result<Observed, Failure> {
        let fsck = self.clients[0].with_credentials(Credentials::root());
        let check = fsck
            .check_inode_links(true)
            .await
            .map_err(|e| self.fail(format!("fsck --repair of inodes: {e}")))?;
        let repaired = check
            .wrong
            .iter()
            .filter(|w| w.repair == Some(madfs_client::Repair::Done))
            .count();
        self.log.push(format!(
            "fsck --repair: {repaired} of {} inode link counts set right or freed, {} pending \
             ({:?})",
            check.wrong.len(),
            check.pending,
            before.leaked.values().collect::<Vec<_>>()
        ));
        self.out.leaks_repaired += repaired;
        // Leaked files that hold data are given names in /lost+found,
        // which the model does not know: the operator reads and removes
        // them, as after e2fsck. Each must read as its size says.
        let adopted: Vec<(InodeId, Vec<u8>, u64)> = check
            .wrong
            .iter()
            .filter_map(|w| Some((w.ino, w.adopted_as.clone()?, w.size?)))
            .collect();
        for (ino, path, size) in &adopted {
            let p = String::from_utf8_lossy(path).into_owned();
            let read = fsck.read_file(p.as_str()).await;
            let data = match read {
                Ok(d) if d.len() as u64 == *size => d,
                other => {
                    return Err(self.fail(format!(
                        "{p}, adopted by fsck --repair with {size} bytes, reads {:?}",
                        other.map(|d| d.len())
                    )))
                }
            };
            // A file fsynced whose name a crash then lost (its name was
            // not synced: fsync(2) of a file promises its data and
            // inode, not the directory entry; seed 60247): what the
            // fsync promised is what /lost+found holds. Removed by the
            // operator below, it promises nothing more.
            if let Some(want) = self.fsynced.remove(ino) {
                if data != want {
                    return Err(self.fail(format!(
                        "{p}: inode {ino} was fsynced with {} ({} bytes), adopted with {} \
                         ({} bytes)",
                        digest(&want),
                        want.len(),
                        digest(&data),
                        data.len()
                    )));
                }
            }
            if let Some((offset, want)) = self.fsynced_writes.remove(ino) {
                if data.get(offset..offset + want.len()) != Some(&want[..]) {
                    return Err(self.fail(format!(
                        "{p}: inode {ino}'s fsynced write of {} bytes at {offset} is not \
                         there once adopted",
                        want.len()
                    )));
                }
            }
            fsck.remove_file(p.as_str())
                .await
                .map_err(|e| self.fail(format!("removing {p}: {e}")))?;
        }
        self.out.leaks_adopted += adopted.len();
        if !adopted.is_empty() {
            fsck.remove_dir("/lost+found")
                .await
                .map_err(|e| self.fail(format!("removing /lost+found: {e}")))?;
            self.log.push(format!(
                "fsck --repair: {} leaked files with data moved to /lost+found, read and removed",
                adopted.len()
            ));
        }
        let obs = observe(disks);
        // Empty directories no name reaches (an rmdir's leftover) are
        // freed too; none with entries is left by any crash here (it
        // would be moved to /lost+found, which the model does not know).
        let left: Vec<&String> = obs.leaked.values().collect();
        if check.pending == 0 && !left.is_empty() {
            return Err(self.fail(format!(
                "fsck --repair left leaks with nothing pending:\n{}\nit reported: {:?}",
                left.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                check.wrong
            )));
        }
        if !obs.broken.is_empty() {
            return Err(self.fail(format!(
                "broken invariants after fsck --repair of inodes:\n{}",
                obs.broken.join("\n")
            )));
        }
        Ok(obs)
    }

    /// Compare the servers with the model after a step.
    async fn check(
        &mut self,
        op: Option<(&[Action], &[OpResult], bool)>,
        crashed: bool,
    ) -> Result<(), Failure> {
        let disks = match &self.cluster.replicated {
            None => self.cluster.disks.clone(),
            Some(r) => r
                .serving_disks(&self.cluster.disks)
                .map_err(|m| self.fail(format!("after recovery: {m}")))?,
        };
        let mut obs = observe(&disks);
        fnv(&mut self.out.trace, &format!("{:?}", obs.names));
        if !obs.broken.is_empty() {
            return Err(self.fail(format!(
                "broken invariants after recovery:\n{}",
                obs.broken.join("\n")
            )));
        }
        // Directory link counts survive any crash but one that loses
        // unsynced writes (a power cut may undo an owner's applied touch
        // whose intent the sender already deleted, or the sender's intent);
        // what such a loss left wrong, `madfs fsck --repair` sets right.
        // Checked once every touch is applied and its intents gone (one
        // may still wait for a lost peer call's timeout; settle gives
        // them a bounded time).
        let losses = (self.out.power_cuts, self.out.lost_batches);
        if obs.touch_intents == 0 {
            if !obs.dir_links.is_empty() && losses == self.links_right_at {
                return Err(self.fail(format!(
                    "directory link counts off after recovery, with no loss since they \
                     were last right:\n{}",
                    obs.dir_links.join("\n")
                )));
            }
            if !obs.dir_links.is_empty() {
                obs = self.repair_links(&disks, &obs.dir_links).await?;
            }
            self.links_right_at = losses;
        }
        // A leak (an inode no name reaches, a link count above the names)
        // is admitted after a crash or a lost message (ARCHITECTURE.md,
        // "Other multi-server operations and what a crash leaves"), never
        // from a step that ran without faults.
        let undisturbed = match op {
            Some((_, _, disturbed)) => !disturbed && !crashed,
            None => false,
        };
        let new_leaks: Vec<&String> = obs
            .leaked
            .iter()
            .filter(|(i, _)| !self.leaked.contains(*i))
            .map(|(_, m)| m)
            .collect();
        if undisturbed && !new_leaks.is_empty() {
            let list: Vec<&str> = new_leaks.iter().map(|s| s.as_str()).collect();
            return Err(self.fail(format!(
                "inodes leaked by a step without faults:\n{}",
                list.join("\n")
            )));
        }
        self.out.leaks += new_leaks.len();
        // What fsck repairs it must repair, unless link drops, renames, or
        // directory removals or moves are still being finished; what it
        // frees no name may reach (the model's reads below).
        if obs.touch_intents == 0 && !obs.leaked.is_empty() {
            obs = self.repair_leaks(&disks, &obs).await?;
        }
        self.leaked = obs.leaked.keys().copied().collect();
        let bytes = match self.read_all(&obs).await {
            Ok(b) => b,
            Err(m) => {
                let state = self
                    .cluster
                    .replicated
                    .as_ref()
                    .map_or(String::new(), |r| format!("\n{}", r.describe()));
                return Err(self.fail(format!("{m}{state}")));
            }
        };
        let old = self.model.clone();
        // The model this step should have led to, and which files' bytes
        // are uncertain.
        let mut expect: Option<Model> = None;
        let mut uncertain_files: BTreeSet<InodeId> = BTreeSet::new();
        // Holes writes made past the end of a file: [old end, offset).
        let mut holes: HashMap<InodeId, (usize, usize)> = HashMap::new();
        if let Some((actions, results, disturbed)) = op {
            let concurrent = actions.len() > 1;
            for action in actions {
                let touched_ino = action
                    .touched_file()
                    .and_then(|p| old.names.get(p))
                    .and_then(|e| e.ino);
                for p in action.touched_paths(&old) {
                    self.dirty_paths.insert(p);
                }
                if let Action::Rename(a, b) = action {
                    // Whatever a crash undoes below either name (an earlier
                    // move into the subtree, say) shows up under both.
                    self.dirty_trees.insert(a.clone());
                    self.dirty_trees.insert(b.clone());
                }
                if let Some(i) = touched_ino {
                    self.dirty_files.insert(i);
                    self.fsynced.remove(&i);
                    self.fsynced_writes.remove(&i);
                }
                // A file losing a name may be freed: its fsync promises nothing.
                let unnamed = match action {
                    Action::Unlink(p) | Action::Rename(_, p) => {
                        old.names.get(p).and_then(|e| e.ino)
                    }
                    _ => None,
                };
                if let Some(i) = unnamed {
                    self.fsynced.remove(&i);
                    self.fsynced_writes.remove(&i);
                }
                // Between concurrent renames onto one name, the source of
                // one may itself be replaced by the other's (seed 42435:
                // `rename /b -> /a` and `rename /d -> /a`, /b fsynced before
                // and freed as /d's rename landed last).
                if let (true, Action::Rename(a, _)) = (concurrent, action) {
                    if let Some(i) = old.names.get(a).and_then(|e| e.ino) {
                        self.fsynced.remove(&i);
                        self.fsynced_writes.remove(&i);
                    }
                }
            }
            for action in actions {
                if let Action::Write { path, offset, .. } = action {
                    if let Some(Entry { ino: Some(i), .. }) = old.names.get(path) {
                        if let Some(Some(b)) = old.content.get(i) {
                            if (*offset as usize) > b.len() {
                                holes.insert(*i, (b.len(), *offset as usize));
                            }
                        }
                    }
                }
            }
            for (action, result) in actions.iter().zip(results) {
                if result.is_err() {
                    if let Some(i) = action
                        .touched_file()
                        .and_then(|p| old.names.get(p))
                        .and_then(|e| e.ino)
                    {
                        uncertain_files.insert(i);
                    }
                    if let Action::Create(..) = action {
                        // Created, then the write failed: any bytes, under
                        // whatever name (a concurrent rename may have
                        // moved it).
                        for (kind, i) in obs.names.values() {
                            if *kind == FileKind::File && !old.content.contains_key(i) {
                                uncertain_files.insert(*i);
                            }
                        }
                    }
                }
            }
            // Every state some order of the operations, each with its
            // result, leads to.
            let mut candidates: Vec<Model> = Vec::new();
            let orders: Vec<Vec<usize>> = if concurrent {
                vec![vec![0, 1], vec![1, 0]]
            } else {
                vec![vec![0]]
            };
            for order in &orders {
                let mut states = vec![old.clone()];
                for &k in order {
                    let (action, result) = (&actions[k], &results[k]);
                    // Errors of operations made of several calls (open,
                    // write, close) between concurrent ones are not
                    // explained by an order: another client's unlink frees
                    // an open file, say (docs: "Files unlinked while open").
                    let reports_loss = |e: &ClientError| {
                        let file = matches!(action, Action::Write { fsync: true, .. })
                            && action
                                .touched_file()
                                .and_then(|p| old.names.get(p))
                                .and_then(|e| e.ino)
                                .is_some_and(|i| self.lost_unreported.contains(&i));
                        // A whole sync reports names changed before a
                        // power cut (any crash here is one) once.
                        let names = matches!(action, Action::SyncAll) && self.out.crashes > 0;
                        e.code == ErrorCode::Io && (file || names)
                    };
                    let loose = match result {
                        Ok(_) => false,
                        Err(e) => {
                            disturbed
                                || is_uncertain(e)
                                || reports_loss(e)
                                || (concurrent
                                    && matches!(
                                        action,
                                        Action::Create(..)
                                            | Action::Write { .. }
                                            | Action::Truncate(..)
                                    ))
                        }
                    };
                    // A move that did not get the cluster's directory-move
                    // lock in time (EBUSY: its holder's set had not settled
                    // a move a crash interrupted) did nothing.
                    let refused = match (result, action) {
                        (Err(e), Action::Rename(a, b)) if e.code == ErrorCode::Busy => {
                            crate::model::parent_of(a) != crate::model::parent_of(b)
                                && old.names.get(a).is_some_and(|e| e.kind == FileKind::Dir)
                        }
                        _ => false,
                    };
                    // A link's source resolved before the other operation
                    // ran (a file pending creation has no inode yet).
                    let early_source = match action {
                        Action::Link(a, b) if concurrent => old
                            .names
                            .get(a)
                            .filter(|e| e.ino.is_some())
                            .map(|e| (e.clone(), b.clone())),
                        _ => None,
                    };
                    let mut next = Vec::new();
                    for m in states {
                        let mut outcomes = vec![m.apply(action)];
                        if let Some((src, b)) = &early_source {
                            outcomes.push(m.link_entry(src.clone(), b));
                        }
                        if concurrent {
                            // Its directories resolved before the other
                            // operation moved them.
                            outcomes.push(action.rebased(&old, &m).and_then(|a| m.apply(&a)));
                            if let Some(a) = action.rebased_source(&old, &m) {
                                outcomes.push(a.and_then(|a| m.apply(&a)));
                            }
                        }
                        let mut kept_unchanged = false;
                        for applied in outcomes {
                            match (result, applied) {
                                (Ok(_), Ok(a)) => next.push(a),
                                (Ok(_), Err(_)) => {}
                                (Err(_), Ok(a)) => {
                                    if loose {
                                        next.push(a);
                                    }
                                    if (loose || refused) && !kept_unchanged {
                                        next.push(m.clone());
                                        kept_unchanged = true;
                                    }
                                }
                                (Err(_), Err(_)) => {
                                    if !kept_unchanged {
                                        next.push(m.clone());
                                        kept_unchanged = true;
                                    }
                                }
                            }
                        }
                    }
                    states = next;
                }
                candidates.extend(states);
            }
            let what: Vec<String> = actions
                .iter()
                .zip(results)
                .map(|(a, r)| {
                    format!(
                        "{} -> {}",
                        a.describe(),
                        match r {
                            Ok(_) => "ok".to_string(),
                            Err(e) => format!("{:?}", e.code),
                        }
                    )
                })
                .collect();
            if !crashed {
                if candidates.is_empty() {
                    let mut known = Vec::new();
                    for a in actions {
                        for p in a.paths() {
                            known.push(format!("{p}: {:?}", old.names.get(p)));
                        }
                    }
                    return Err(self.fail(format!(
                        "the model explains no order of [{}] with these results \
                         (before: {})",
                        what.join("; "),
                        known.join(", ")
                    )));
                }
                // Orders that leave the same names may leave different
                // bytes (a truncate by a name a concurrent rename moved to
                // another inode, seed 47327): the one the files agree with.
                let named: Vec<&Model> = candidates.iter().filter(|m| m.matches(&obs)).collect();
                let agrees = |m: &&&Model| {
                    obs.names.iter().all(|(p, (kind, ino))| {
                        *kind != FileKind::File
                            || match (m.expected_bytes(p, *ino), bytes.get(ino)) {
                                (Some(want), Some(got)) => want == got,
                                _ => true,
                            }
                    })
                };
                match named.iter().find(agrees).or(named.first()) {
                    Some(m) => expect = Some((*m).clone()),
                    None => {
                        let refs: Vec<&Model> = candidates.iter().collect();
                        return Err(self.fail(format!(
                            "after [{}], the servers hold none of the states the model allows:\n{}",
                            what.join("; "),
                            diff(&refs, &obs)
                        )));
                    }
                }
            }
            // The bytes an acknowledged fsync promised. When a server
            // crashed during the step, those of the write alone: a crash
            // before the write may have taken earlier unsynced bytes, and
            // one between the write and its fsync fails the fsync (the
            // write verifier: seed 163 before it).
            if let (false, true, Action::Write { offset, data, .. }, Ok(true)) =
                (concurrent, crashed, &actions[0], &results[0])
            {
                let ino = actions[0]
                    .touched_file()
                    .and_then(|p| old.names.get(p))
                    .and_then(|e| e.ino);
                if let Some(i) = ino {
                    self.fsynced.remove(&i);
                    self.fsynced_writes
                        .insert(i, (*offset as usize, data.clone()));
                }
            }
            if let (false, false, Some(m)) = (concurrent, crashed, &expect) {
                let touched_ino = actions[0]
                    .touched_file()
                    .and_then(|p| old.names.get(p))
                    .and_then(|e| e.ino);
                if let (Ok(true), Some(i)) = (&results[0], touched_ino) {
                    if let Some(Some(b)) = m.content.get(&i) {
                        self.fsynced.insert(i, b.clone());
                    }
                }
            }
            if let (false, false, Action::SyncAll, Ok(_)) =
                (concurrent, crashed, &actions[0], &results[0])
            {
                // Everything before the sync is durable from here on.
                let mut now = old.clone();
                now.resolve(&obs, &bytes);
                self.synced = now;
                self.dirty_paths.clear();
                self.dirty_trees.clear();
                self.dirty_files.clear();
            }
        }
        if op.is_none() && self.cluster.replicated.is_some() {
            // A crash, restart, partition or heal between operations, with
            // replicas: nothing acknowledged may be lost, nothing may
            // appear.
            if !old.matches(&obs) {
                return Err(self.fail(format!(
                    "the servers no longer hold the state every acknowledged operation made:\n{}",
                    diff(&[&old], &obs)
                )));
            }
            expect = Some(old.clone());
        }
        // File bytes, where the model is sure of them.
        if let Some(m) = &expect {
            for (p, (kind, ino)) in &obs.names {
                if *kind != FileKind::File || uncertain_files.contains(ino) {
                    continue;
                }
                if let Some(want) = m.expected_bytes(p, *ino) {
                    let got = &bytes[ino];
                    // Chunk bytes past a size that a crash or a lost
                    // message undid are not dropped when a later write
                    // makes a hole over them (a known gap): they show in
                    // the hole.
                    let in_hole_only = |(lo, hi): (usize, usize)| {
                        got.len() == want.len()
                            && got
                                .iter()
                                .zip(want.iter())
                                .enumerate()
                                .all(|(k, (a, b))| a == b || (lo..hi).contains(&k))
                    };
                    if got != want
                        && self.ghosts.contains(ino)
                        && holes.get(ino).is_some_and(|h| in_hole_only(*h))
                    {
                        self.out.stale_holes += 1;
                        // What an fsync in this step promised is what the
                        // file holds, stale hole and all (seed 44051).
                        if let Some(f) = self.fsynced.get_mut(ino) {
                            *f = got.clone();
                        }
                        continue;
                    }
                    if got != want {
                        let at = got.iter().zip(want.iter()).position(|(a, b)| a != b);
                        let end = at.map(|a| {
                            a + got[a..]
                                .iter()
                                .zip(want[a..].iter())
                                .position(|(x, y)| x == y)
                                .unwrap_or(got.len().min(want.len()) - a)
                        });
                        return Err(self.fail(format!(
                            "{p} (inode {ino}) holds {} bytes {}, the model {} bytes {}; \
                             they differ from offset {at:?} to {end:?}",
                            got.len(),
                            digest(got),
                            want.len(),
                            digest(want)
                        )));
                    }
                }
            }
        }
        if crashed {
            self.check_durable(&obs, &bytes)?;
            // Any file may have lost a size update.
            self.ghosts.extend(obs.names.values().map(|(_, i)| *i));
            // And any file there now (one a lost unlink brought back too)
            // may have its loss reported by its next fsync.
            self.lost_unreported
                .extend(obs.names.values().map(|(_, i)| *i));
        }
        self.ghosts.extend(uncertain_files.iter().copied());
        self.model.resolve(&obs, &bytes);
        Ok(())
    }

    /// After a crash: everything the last full sync made durable and no
    /// later step touched is still there, unchanged; nothing appeared that
    /// no step made; every acknowledged fsync kept its bytes.
    fn check_durable(
        &mut self,
        obs: &Observed,
        bytes: &HashMap<InodeId, Vec<u8>>,
    ) -> Result<(), Failure> {
        let mut problems = Vec::new();
        let dirty = |p: &str| {
            self.dirty_paths.contains(p)
                || self
                    .dirty_trees
                    .iter()
                    .any(|t| p == t || p.starts_with(&format!("{t}/")))
        };
        for (p, e) in &self.synced.names {
            if dirty(p) {
                continue;
            }
            match obs.names.get(p) {
                None => problems.push(format!("{p} was synced and is gone")),
                Some((k, i)) if *k != e.kind || e.ino.is_some_and(|x| x != *i) => {
                    problems.push(format!("{p} was synced as {e:?}, now {k:?} {i}"))
                }
                Some((_, i)) => {
                    if let (false, Some(Some(want))) =
                        (self.dirty_files.contains(i), self.synced.content.get(i))
                    {
                        if bytes.get(i) != Some(want) {
                            problems.push(format!(
                                "{p}: synced bytes {} changed to {}",
                                digest(want),
                                bytes.get(i).map_or("none".into(), |b| digest(b))
                            ));
                        }
                    }
                }
            }
        }
        for p in obs.names.keys() {
            if !dirty(p) && !self.synced.names.contains_key(p) {
                problems.push(format!(
                    "{p} appeared, though no step since the last sync made it"
                ));
            }
        }
        for (ino, want) in &self.fsynced {
            if !obs.inodes.contains(ino) {
                problems.push(format!("inode {ino} was fsynced and is gone"));
            } else if let Some(got) = bytes.get(ino) {
                if got != want {
                    let first = want.iter().zip(got.iter()).position(|(a, b)| a != b);
                    problems.push(format!(
                        "inode {ino}: fsynced bytes {} ({} bytes) are now {} ({} bytes), \
                         first different at {first:?}",
                        digest(want),
                        want.len(),
                        digest(got),
                        got.len()
                    ));
                }
            }
        }
        for (ino, (offset, want)) in &self.fsynced_writes {
            if !obs.inodes.contains(ino) {
                problems.push(format!("inode {ino}'s write was fsynced and it is gone"));
            } else if let Some(got) = bytes.get(ino) {
                if got.get(*offset..offset + want.len()) != Some(&want[..]) {
                    problems.push(format!(
                        "inode {ino}: fsynced write of {} bytes at {offset} ({}) is not \
                         there (the file holds {} bytes)",
                        want.len(),
                        digest(want),
                        got.len()
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(self.fail(format!(
                "a crash lost durable state:\n{}",
                problems.join("\n")
            )))
        }
    }
}

fn digest(b: &[u8]) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("#{:08x}", h as u32)
}

fn diff(candidates: &[&Model], obs: &Observed) -> String {
    let mut out = String::new();
    let seen: BTreeMap<&String, String> = obs
        .names
        .iter()
        .map(|(p, (k, i))| (p, format!("{k:?} {i}")))
        .collect();
    for (n, m) in candidates.iter().enumerate() {
        out.push_str(&format!("candidate {n}:\n"));
        for (p, e) in &m.names {
            match seen.get(p) {
                None => out.push_str(&format!("  missing {p} ({:?} {:?})\n", e.kind, e.ino)),
                Some(s) => {
                    if !e.ino.is_none_or(|i| s.ends_with(&format!(" {i}"))) {
                        out.push_str(&format!("  {p}: model {e:?}, servers {s}\n"));
                    }
                }
            }
        }
        for (p, s) in &seen {
            if !m.names.contains_key(*p) {
                out.push_str(&format!("  extra {p} ({s})\n"));
            }
        }
    }
    out
}
