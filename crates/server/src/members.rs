//! A server's part in the membership group (crates/membership) of a
//! cluster that keeps replicas: who serves which replica set is decided by
//! a Raft group among a few servers (the voters), never by one server or a
//! client alone.
//!
//! - Messages: every membership message travels as `Op::Membership` between
//!   servers, its first byte saying what it is: a Raft or map request for a
//!   voter's node, a lease ping from the leader's detector (carrying the
//!   map's epoch, so servers that are not voters learn that the map moved
//!   and fetch it), or a change proposed by a server that is not a voter
//!   (a voter proposes it for it).
//! - Leases: a server answers requests only while it holds a lease from the
//!   leader (`has_lease`); the detector fails a server over only after its
//!   lease has surely run out, so a partitioned old primary has stopped
//!   answering before another server serves its set.
//! - Following the map (`follow`): the routes go to the router and to
//!   every pool of server-to-server calls; a set whose primary is now this
//!   server is promoted from its copy; this server's own set, given to
//!   another, is deposed.
//! - Leaving a replica out (`may_leave`): a primary stops waiting for a
//!   replica only once the group has removed it from the set, so a
//!   primary cut off from the group cannot go on alone.
//! - A voter lost for good (`voter_lost_after` without an answer): the
//!   leader's detector asks a live server that is no voter to take its
//!   place (`tag::PROMOTE`); that server starts a Raft node of its own
//!   (DATA/membership, a fresh incarnation that remembers whom it
//!   replaces) and joins. Every ping carries the current voters, so the
//!   others ask the right servers for maps and proposals, and a restarted
//!   server that has such a node starts it again.

use crate::failover::{Router, Routes};
use crate::ServerError;
use futures::future::BoxFuture;
use madfs_membership::{
    fetch_map, Change, ClusterMap, Detector, LeaseHolder, Membership, MembershipConfig,
    MembershipError, Ping, PingFn, PromoteFn, Promotion, Rejection, SetState, Timing, Transport,
};
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::pool::Timeouts;
use madfs_rpc::{ClusterConfig, Pool};
use madfs_types::{Credentials, ServerId};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

mod follow;

use follow::SetsAtWork;

/// Proposals retried while the map moves under them.
const PROPOSE_ATTEMPTS: usize = 5;
/// Pause between two proposals of a hand-over after a power loss.
const HAND_OVER_RETRY: Duration = Duration::from_millis(500);
/// How long a server that is not a voter waits for the map or a proposal.
const REMOTE_WAIT: Duration = Duration::from_secs(5);
/// How long a restarted server asks the voters for the map before it
/// applies the one its own node restarted with (`follow`).
const START_MAP_WAIT: Duration = Duration::from_secs(3);

mod tag {
    /// For the voter's node (crates/membership's own protocol).
    pub const NODE: u8 = 1;
    /// A lease ping: the map's epoch (u64 LE), then the `Ping`.
    pub const PING: u8 = 2;
    /// A change from a server that is not a voter: JSON (change, epoch).
    pub const PROPOSE: u8 = 3;
    /// From the leader's detector: take the place of a voter lost for good
    /// (its server id, u16 LE).
    pub const PROMOTE: u8 = 4;
    /// From a primary holding a set after a power loss: whether this
    /// server's copy of the set (u16 LE) is whole. Answered [1] or [0].
    pub const COPY_WHOLE: u8 = 5;
}

/// A lease ping's voter list: at most this many (the group's own bound).
const PING_VOTERS_MAX: usize = 9;

/// The voters: the first server of each host, in id order, up to the
/// cluster file's `voters` (3 or 5); where hosts run out (or a local
/// cluster has none), the next servers by id.
pub fn voters(cfg: &ClusterConfig) -> Vec<ServerId> {
    let want = cfg.voters as usize;
    let mut chosen: Vec<ServerId> = Vec::new();
    let mut hosts: Vec<&Option<String>> = Vec::new();
    for s in &cfg.servers {
        if chosen.len() == want {
            break;
        }
        if s.host.is_some() && !hosts.contains(&&s.host) {
            hosts.push(&s.host);
            chosen.push(ServerId(s.id));
        }
    }
    for s in &cfg.servers {
        if chosen.len() == want {
            break;
        }
        if !chosen.contains(&ServerId(s.id)) {
            chosen.push(ServerId(s.id));
        }
    }
    chosen.sort();
    chosen
}

/// The map a new cluster starts with: set s served by server s, its
/// members the cluster file's replica set (spread over hosts).
pub fn initial_map(cfg: &ClusterConfig) -> ClusterMap {
    let n = cfg.server_count() as u16;
    let mut map = ClusterMap::initial(n, cfg.replicas.max(1) as u16);
    for (s, set) in map.sets.iter_mut().enumerate() {
        set.members = cfg.replica_set(ServerId(s as u16));
        set.primary = set.members[0];
    }
    map
}

/// What starting a Raft node after the process started needs.
struct Later {
    cfg: ClusterConfig,
    data_dir: std::path::PathBuf,
    raft_store: Option<Arc<dyn madfs_kv::KvStore>>,
}

/// How this server's node runs: Raft state in DATA/membership, the
/// default timing but for two test seams: how long a silent server is
/// waited for before its sets fail over (`MADFS_TEST_DOWN_AFTER_MS`; 2 s
/// otherwise, never below the lease and its margin), and before another
/// server takes a silent voter's place (`MADFS_TEST_VOTER_LOST_AFTER_MS`;
/// 30 s otherwise, never below `down_after`).
fn membership_config(
    me: ServerId,
    voters: Vec<ServerId>,
    data_dir: &Path,
    cfg: &ClusterConfig,
) -> MembershipConfig {
    let mut mc = MembershipConfig::new(me, voters, data_dir.join("membership"), initial_map(cfg));
    let ms = crate::test_knob_ms;
    let t = &mut mc.timing;
    if let Some(d) = ms("MADFS_TEST_DOWN_AFTER_MS") {
        t.down_after = d.max(t.lease + t.lease_margin);
        t.voter_lost_after = t.voter_lost_after.max(t.down_after);
    }
    if let Some(d) = ms("MADFS_TEST_VOTER_LOST_AFTER_MS") {
        t.voter_lost_after = d.max(t.down_after);
    }
    mc
}

/// Carries membership messages over the servers' RPC, to server processes
/// (not sets: these routes never move).
struct PeerNet {
    pool: Arc<Pool>,
}

impl PeerNet {
    async fn send(&self, to: ServerId, msg: Vec<u8>) -> Result<Vec<u8>, String> {
        let req = Request {
            creds: Credentials::root(),
            op: Op::Membership { msg },
            once: None,
        };
        match self.pool.call_once(to, &req, &[]).await {
            Ok(r) => match r.reply {
                Reply::Membership { msg } => Ok(msg),
                other => Err(format!("server {to} answered {other:?}")),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether server process `to` answers at all (a routes request, which
    /// needs no lease), within `HAND_OVER_RETRY`.
    async fn answers(&self, to: ServerId) -> bool {
        let req = Request {
            creds: Credentials::root(),
            op: Op::GetRoutes,
            once: None,
        };
        matches!(
            tokio::time::timeout(HAND_OVER_RETRY, self.pool.call_once(to, &req, &[])).await,
            Ok(Ok(_))
        )
    }
}

/// `PeerNet` as the membership crate's transport, for its node's messages.
struct NodeNet(Arc<PeerNet>);

impl Transport for NodeNet {
    fn call(&self, to: ServerId, msg: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>, String>> {
        let net = self.0.clone();
        Box::pin(async move {
            let mut m = Vec::with_capacity(msg.len() + 1);
            m.push(tag::NODE);
            m.extend_from_slice(&msg);
            net.send(to, m).await
        })
    }
}

/// This server's membership: its node if it is a voter, its lease, and
/// the latest map it knows.
pub struct Members {
    me: ServerId,
    /// The sets the cluster file puts this server in (its own among them).
    intended: Vec<ServerId>,
    /// The voters as the leader's latest ping listed them (the cluster
    /// file's until then): where maps and proposals are asked for.
    voters: Mutex<Vec<ServerId>>,
    /// This server's Raft node: started with the process if it is a voter
    /// (or was made one before), or later when the leader asks it to take
    /// a lost voter's place; then replaced by a new node if it had one
    /// the group no longer counts (`promote`).
    node: std::sync::RwLock<Option<Membership>>,
    /// What starting a node later needs: the cluster file and where the
    /// node keeps its state (DATA/membership, or the Raft store injected
    /// by the simulation).
    later: Later,
    promoting: AtomicBool,
    /// Whether this server's node may start elections (`Membership::campaign`).
    campaigns: AtomicBool,
    detector: Mutex<Option<Detector>>,
    lease: LeaseHolder,
    net: Arc<PeerNet>,
    map: watch::Sender<ClusterMap>,
    /// The newest epoch a ping announced.
    announced: AtomicU64,
    /// A replacement waiting for the cluster to give up the server it
    /// replaces: it answers no ping (replace.rs).
    replacing: AtomicBool,
    /// The epoch of the last map applied to the router (`apply`).
    applied: AtomicU64,
    fetching: AtomicBool,
    /// Sets whose hand-over after a power loss is being proposed
    /// (`hand_over`).
    handing_over: SetsAtWork,
    /// Sets whose copy here lacks records while the map counts it in
    /// sync: taking it out is being proposed (`leave_lacking`).
    leaving: SetsAtWork,
    /// The router `follow` applies maps to: its copies answer `COPY_WHOLE`.
    router: std::sync::OnceLock<std::sync::Weak<Router>>,
}

impl Members {
    /// Join the group: start the node if this server is a voter (its Raft
    /// state under DATA/membership), and the detector that acts while it
    /// leads.
    pub async fn start(
        cfg: &ClusterConfig,
        me: ServerId,
        key: ClusterKey,
        data_dir: &Path,
        replace: bool,
    ) -> Result<Arc<Members>, ServerError> {
        let pool = Arc::new(Pool::new(cfg, key, Role::Peer, Timeouts::default()));
        Self::start_with(cfg, me, pool, None, data_dir, replace).await
    }

    /// `start`, messages going through `pool` and, where `raft_store` is
    /// given, the node's Raft state kept there instead of DATA/membership
    /// (crates/sim: the in-process network, a simulated disk).
    pub(crate) async fn start_with(
        cfg: &ClusterConfig,
        me: ServerId,
        pool: Arc<Pool>,
        raft_store: Option<Arc<dyn madfs_kv::KvStore>>,
        data_dir: &Path,
        replace: bool,
    ) -> Result<Arc<Members>, ServerError> {
        let timing = Timing::default();
        let voters = voters(cfg);
        let net = Arc::new(PeerNet { pool });
        let intended = cfg
            .servers
            .iter()
            .map(|s| ServerId(s.id))
            .filter(|&set| cfg.replica_set(set).contains(&me))
            .collect();
        // A server made a voter in a lost one's place keeps its node in
        // DATA/membership: it starts it again, whatever the cluster file
        // lists.
        let was_made_voter = !replace
            && match &raft_store {
                None => data_dir.join("membership").exists(),
                Some(kv) => Membership::joined_before(kv.as_ref())
                    .map_err(|e| ServerError::Storage(format!("membership: {e}")))?,
            };
        let later = Later {
            cfg: cfg.clone(),
            data_dir: data_dir.to_path_buf(),
            raft_store: raft_store.clone(),
        };
        let node = if voters.contains(&me) || was_made_voter {
            let mc = membership_config(me, voters.clone(), data_dir, cfg);
            let net: Arc<dyn Transport> = Arc::new(NodeNet(net.clone()));
            // A replacement's Raft directory is empty: it joins as a new
            // incarnation of its server (crates/membership, join.rs), never
            // as the node it replaces, which may have voted already.
            let node = match (replace, raft_store) {
                (true, None) => Membership::join(mc, net).await,
                (false, None) => Membership::start(mc, net).await,
                (false, Some(kv)) => Membership::start_with_store(mc, kv, net).await,
                (true, Some(_)) => {
                    return Err(ServerError::Config(
                        "a replacement over an injected Raft store is not supported".into(),
                    ))
                }
            };
            let node = node.map_err(|e| ServerError::Storage(format!("membership: {e}")))?;
            if !replace && node.incarnation() != 0 {
                // A replacement restarted: if it stopped before it became a
                // voter, it finishes now (at once if it did).
                let n = node.clone();
                tokio::spawn(async move {
                    match n.become_voter().await {
                        Ok(()) => tracing::info!(
                            "server {me}: a voter of the membership group again after a restart, as node incarnation {}",
                            n.incarnation()
                        ),
                        Err(e) => tracing::error!("server {me}: joining the membership group: {e}"),
                    }
                });
            }
            Some(node)
        } else {
            None
        };
        let (map, _) = watch::channel(ClusterMap::default());
        let members = Arc::new(Members {
            me,
            intended,
            voters: Mutex::new(voters),
            node: std::sync::RwLock::new(None),
            later,
            promoting: AtomicBool::new(false),
            campaigns: AtomicBool::new(true),
            detector: Mutex::new(None),
            lease: LeaseHolder::new(&timing),
            net,
            map,
            announced: AtomicU64::new(0),
            replacing: AtomicBool::new(replace),
            applied: AtomicU64::new(0),
            fetching: AtomicBool::new(false),
            handing_over: SetsAtWork::default(),
            leaving: SetsAtWork::default(),
            router: std::sync::OnceLock::new(),
        });
        match node {
            Some(node) => members.attach(node),
            None => members.clone().refresh(),
        }
        Ok(members)
    }

    /// Run `node` as this server's: the detector that acts while it leads
    /// (pinging every server with the epoch and the voters), and the maps
    /// it applies.
    fn attach(self: &Arc<Self>, node: Membership) {
        *self.node.write().unwrap_or_else(|e| e.into_inner()) = Some(node.clone());
        self.campaigns.store(true, Ordering::Release);
        let node = &node;
        let net = self.net.clone();
        let source = node.clone();
        let ping: PingFn = Arc::new(move |to, ping: Ping| {
            let (net, epoch) = (net.clone(), source.map().epoch);
            let voters = source.voters();
            Box::pin(async move {
                let mut m = vec![tag::PING];
                m.extend_from_slice(&epoch.to_le_bytes());
                let listed = voters.len().min(PING_VOTERS_MAX);
                m.push(listed as u8);
                for v in &voters[..listed] {
                    m.extend_from_slice(&v.0.to_le_bytes());
                }
                m.extend_from_slice(&ping.encode());
                net.send(to, m).await.is_ok()
            })
        });
        let net = self.net.clone();
        let promote: PromoteFn = Arc::new(move |to: ServerId, lost: ServerId| {
            let net = net.clone();
            Box::pin(async move {
                let mut m = vec![tag::PROMOTE];
                m.extend_from_slice(&lost.0.to_le_bytes());
                net.send(to, m).await.is_ok()
            })
        });
        let hosts = self
            .later
            .cfg
            .servers
            .iter()
            .map(|s| s.host.clone())
            .collect();
        let detector = Detector::start_promoting(node, ping, Promotion { promote, hosts });
        *self.detector.lock().unwrap_or_else(|e| e.into_inner()) = Some(detector);
        // The node's maps, as it applies them.
        let (mut rx, tx) = (node.subscribe(), self.clone());
        tokio::spawn(async move {
            loop {
                let m = rx.borrow_and_update().clone();
                tx.map.send_if_modified(|cur| newer(cur, m));
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// This server's Raft node, if it has one (`node`).
    fn node(&self) -> Option<Membership> {
        self.node.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Take the place of voter `lost` (asked by the leader's detector):
    /// start a node under a fresh incarnation in DATA/membership, then
    /// join the group. Once at a time; refused by a voter. A server with
    /// a node the leader no longer lists as a voter's (its place moved
    /// while it was away) leaves that node behind for a new one
    /// (`Membership::rejoin`): otherwise a cluster whose only server that
    /// is no voter is such a one would stay at two voters after a second
    /// voter is lost for good.
    fn promote(self: &Arc<Self>, lost: ServerId) -> Result<(), String> {
        if self.node().is_some() && self.voters().contains(&self.me) {
            return Err(format!("server {} is a voter already", self.me));
        }
        if self.promoting.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (me, members) = (self.me, self.clone());
        tokio::spawn(async move {
            let later = &members.later;
            let mut mc = membership_config(me, members.voters(), &later.data_dir, &later.cfg);
            mc.replaces = Some(lost);
            let net: Arc<dyn Transport> = Arc::new(NodeNet(members.net.clone()));
            let joined = match (members.node(), &later.raft_store) {
                (Some(old), _) => {
                    members.stop_detector().await;
                    tracing::warn!(
                        "server {me}: leaving node incarnation {} behind (no voter any more) \
                         to take the place of voter {lost}",
                        old.incarnation()
                    );
                    old.rejoin(mc, net).await
                }
                (None, None) => Membership::join(mc, net).await,
                (None, Some(kv)) => Membership::join_with_store(mc, kv.clone(), net).await,
            };
            match joined {
                Ok(node) => {
                    tracing::warn!(
                        "server {me}: taking the place of voter {lost}, lost for good, as node incarnation {}",
                        node.incarnation()
                    );
                    members.attach(node.clone());
                    match node.become_voter().await {
                        Ok(()) => tracing::info!(
                            "server {me}: a voter of the membership group in place of server {lost}"
                        ),
                        Err(e) => tracing::error!(
                            "server {me}: joining the membership group in place of server {lost}: {e}"
                        ),
                    }
                }
                Err(e) => tracing::error!("server {me}: starting a Raft node: {e}"),
            }
            members.promoting.store(false, Ordering::Release);
        });
        Ok(())
    }

    /// The sets with no live in-sync copy, with how long (ms) the leader
    /// has heard from none of them, as the last granting ping said; none
    /// without a lease (`LeaseHolder::lost_sets`).
    pub fn lost_sets(&self) -> Vec<(ServerId, u64)> {
        self.lease
            .lost_sets()
            .into_iter()
            .map(|(set, silent)| (ServerId(set), silent.as_millis() as u64))
            .collect()
    }

    /// The voters as last listed by the leader (the cluster file's until
    /// a ping came).
    pub fn voters(&self) -> Vec<ServerId> {
        self.voters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this server may answer requests now: it holds a lease, and
    /// it has applied a map at least as new as the leader last announced
    /// (a server healed from a partition gets a lease with its first ping,
    /// before it learns that its sets moved meanwhile: it must not serve
    /// them from its stale store in between).
    pub fn may_serve(&self) -> bool {
        self.lease.has_lease()
            && self.applied.load(Ordering::Acquire) >= self.announced.load(Ordering::Acquire)
    }

    /// The latest map this server knows (epoch 0: none yet).
    pub fn map(&self) -> ClusterMap {
        self.map.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<ClusterMap> {
        self.map.subscribe()
    }

    /// Fetch the map from the voters (once at a time), for a server that
    /// is not one.
    fn refresh(self: Arc<Self>) {
        if self.voting_node().is_some() || self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            loop {
                let want = self.announced.load(Ordering::Acquire);
                match fetch_map(
                    &self.other_voters(),
                    &NodeNet(self.net.clone()),
                    REMOTE_WAIT,
                )
                .await
                {
                    Ok(m) => {
                        self.map.send_if_modified(|cur| newer(cur, m.clone()));
                        if m.epoch >= want && m.epoch > 0 {
                            break;
                        }
                    }
                    Err(e) => tracing::debug!("server {}: fetching the map: {e}", self.me),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.fetching.store(false, Ordering::Release);
            // A ping may have announced a newer map meanwhile.
            if self.announced.load(Ordering::Acquire) > self.map.borrow().epoch {
                self.refresh();
            }
        });
    }

    /// Answer a membership message from another server.
    pub async fn handle(self: &Arc<Self>, msg: &[u8]) -> Result<Vec<u8>, WireError> {
        let bad = |why: String| WireError::new(ErrorCode::InvalidArgument, why);
        let Some((&t, rest)) = msg.split_first() else {
            return Err(bad("empty membership message".into()));
        };
        match t {
            tag::NODE => match self.node() {
                Some(node) => node
                    .handle(rest)
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Io, e.to_string())),
                None => Err(bad(format!("server {} is not a voter", self.me))),
            },
            tag::PING => {
                if self.replacing.load(Ordering::Acquire) {
                    // Answering would keep the lost server's lease alive.
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!("server {} is a replacement, not taken over yet", self.me),
                    ));
                }
                let (epoch, rest) = rest
                    .split_first_chunk::<8>()
                    .ok_or_else(|| bad("short ping".into()))?;
                let (&listed, rest) = rest.split_first().ok_or_else(|| bad("short ping".into()))?;
                let listed = listed as usize;
                if listed > PING_VOTERS_MAX || rest.len() < 2 * listed {
                    return Err(bad(format!("a ping listing {listed} voters")));
                }
                let (ids, ping) = rest.split_at(2 * listed);
                let ping = Ping::decode(ping).map_err(|e| bad(e.to_string()))?;
                if listed > 0 {
                    let voters: Vec<ServerId> = ids
                        .chunks_exact(2)
                        .map(|b| ServerId(u16::from_le_bytes([b[0], b[1]])))
                        .collect();
                    if let Some(node) = self.node() {
                        // A node whose place moved while it was away stops
                        // campaigning (and starts again if listed again).
                        let votes = voters.contains(&self.me);
                        if self.campaigns.swap(votes, Ordering::AcqRel) != votes {
                            node.campaign(votes);
                        }
                    }
                    *self.voters.lock().unwrap_or_else(|e| e.into_inner()) = voters;
                }
                self.lease.on_ping(&ping);
                let epoch = u64::from_le_bytes(*epoch);
                self.announced.fetch_max(epoch, Ordering::AcqRel);
                if epoch > self.map.borrow().epoch {
                    self.clone().refresh();
                }
                Ok(Vec::new())
            }
            tag::PROPOSE => {
                let node = self
                    .node()
                    .ok_or_else(|| bad(format!("server {} is not a voter", self.me)))?;
                let (change, epoch): (Change, u64) =
                    serde_json::from_slice(rest).map_err(|e| bad(e.to_string()))?;
                let answer: Result<ClusterMap, String> = match node.propose(change, epoch).await {
                    Ok(m) => Ok(m),
                    Err(MembershipError::Rejected(r)) => {
                        Err(format!("rejected: {}", reject_code(&r)))
                    }
                    Err(e) => Err(e.to_string()),
                };
                Ok(serde_json::to_vec(&answer).expect("maps and strings encode"))
            }
            tag::COPY_WHOLE => {
                let set = id_in(rest).ok_or_else(|| bad("short copy question".into()))?;
                // Not following a map yet: no answer (asked again), never
                // "not whole", which would give up on a copy that may be.
                let router = self
                    .router
                    .get()
                    .and_then(std::sync::Weak::upgrade)
                    .ok_or_else(|| {
                        WireError::new(
                            ErrorCode::Unavailable,
                            format!("server {} is starting", self.me),
                        )
                    })?;
                Ok(vec![router.home_server().copies.whole(set).await as u8])
            }
            tag::PROMOTE => {
                let lost = id_in(rest).ok_or_else(|| bad("short promotion".into()))?;
                self.promote(lost)
                    .map(|()| Vec::new())
                    .map_err(|why| WireError::new(ErrorCode::InvalidArgument, why))
            }
            other => Err(bad(format!("unknown membership message {other}"))),
        }
    }

    /// Propose `change` against the map at `epoch`, through this server's
    /// node or a voter's.
    async fn propose(&self, change: Change, epoch: u64) -> Result<ClusterMap, String> {
        if let Some(node) = self.voting_node() {
            return node.propose(change, epoch).await.map_err(|e| match e {
                MembershipError::Rejected(r) => format!("rejected: {}", reject_code(&r)),
                other => other.to_string(),
            });
        }
        let body = serde_json::to_vec(&(change, epoch)).expect("changes encode");
        let mut last = String::from("no voter answered");
        for v in self.other_voters() {
            let mut m = vec![tag::PROPOSE];
            m.extend_from_slice(&body);
            match tokio::time::timeout(REMOTE_WAIT, self.net.send(v, m)).await {
                Ok(Ok(bytes)) => {
                    return serde_json::from_slice::<Result<ClusterMap, String>>(&bytes)
                        .map_err(|e| e.to_string())?
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("voter {v} did not answer in {REMOTE_WAIT:?}"),
            }
        }
        Err(last)
    }

    /// Whether the primary of `set` may stop waiting for `replica`: only
    /// once the map no longer counts it in the set (removed now, or
    /// before).
    pub async fn may_leave(&self, set: ServerId, replica: ServerId) -> bool {
        let map = self.map();
        let Some(s) = map.sets.get(set.0 as usize) else {
            return false;
        };
        if s.primary != self.me || self.replacing.load(Ordering::Acquire) {
            // A deposed server's leftover stream (its set moved away while
            // it was cut off or down) decides nothing about the set; nor
            // does a replacement's, whose store is empty while the map
            // still names the lost server primary: taking the replica out
            // would leave the set with no copy of its data.
            return false;
        }
        if !s.members.contains(&replica) && !s.syncing.contains(&replica) {
            return true;
        }
        let change = Change::RemoveMember {
            set: set.0,
            server: replica,
        };
        match self.propose(change, map.epoch).await {
            Ok(m) => {
                self.map.send_if_modified(|cur| newer(cur, m));
                true
            }
            Err(e) if e.starts_with("rejected: not-a-member") => true,
            Err(e) => {
                tracing::warn!("set {set}: cannot take replica {replica} out of the set yet: {e}");
                false
            }
        }
    }

    /// A pool that reaches server processes, whatever sets moved (for
    /// records to replicas).
    pub fn direct_pool(&self) -> Arc<Pool> {
        self.net.pool.clone()
    }

    /// This server's node, if it is a voter of the group now (a
    /// replacement's node is not, until it took over).
    fn voting_node(&self) -> Option<Membership> {
        self.node()
            .filter(|_| !self.replacing.load(Ordering::Acquire) && self.voters().contains(&self.me))
    }

    /// The voters but this server, to ask for the map or a change.
    fn other_voters(&self) -> Vec<ServerId> {
        self.voters()
            .into_iter()
            .filter(|&v| v != self.me)
            .collect()
    }

    /// The map as the voters have it now (not as this server last heard).
    pub async fn fresh_map(&self) -> Result<ClusterMap, String> {
        let m = match self.voting_node() {
            Some(node) => node.read_map().await.map_err(|e| e.to_string())?,
            None => fetch_map(
                &self.other_voters(),
                &NodeNet(self.net.clone()),
                REMOTE_WAIT,
            )
            .await
            .map_err(|e| e.to_string())?,
        };
        self.map.send_if_modified(|cur| newer(cur, m.clone()));
        Ok(m)
    }

    /// The replacement took over (its id moved to its address): a voter's
    /// node becomes a voter in place of the node it replaces, and the
    /// server answers pings from now on.
    pub async fn take_over_done(&self) -> Result<(), ServerError> {
        if let Some(node) = self.node() {
            node.become_voter()
                .await
                .map_err(|e| ServerError::Config(format!("joining the membership group: {e}")))?;
            tracing::info!(
                "server {}: a voter of the membership group again, as node incarnation {}",
                self.me,
                node.incarnation()
            );
        }
        self.replacing.store(false, Ordering::Release);
        Ok(())
    }

    pub fn me(&self) -> ServerId {
        self.me
    }

    /// Learn the voters' map, within `START_MAP_WAIT`: through this
    /// server's node, or, where that finds no leader (a node whose voter
    /// place moved while it was away hears from none), from the others.
    async fn learn_voters_map(&self) {
        let deadline = tokio::time::Instant::now() + START_MAP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            let through_node = left.min(Duration::from_secs(1));
            if let Ok(Ok(_)) = tokio::time::timeout(through_node, self.fresh_map()).await {
                return;
            }
            let (others, net) = (self.other_voters(), NodeNet(self.net.clone()));
            if let Ok(Ok(m)) = tokio::time::timeout(left, fetch_map(&others, &net, left)).await {
                self.map.send_if_modified(|cur| newer(cur, m));
                return;
            }
            tokio::time::sleep(HAND_OVER_RETRY.min(left)).await;
        }
    }

    /// Propose `change` against the newest map known, again while the
    /// epoch moved under it; whether it applied (or was applied before).
    pub(crate) async fn propose_latest(&self, change: Change) -> bool {
        for _ in 0..PROPOSE_ATTEMPTS {
            let epoch = self.map().epoch;
            match self.propose(change.clone(), epoch).await {
                Ok(m) => {
                    self.map.send_if_modified(|cur| newer(cur, m));
                    return true;
                }
                Err(e) if e.starts_with("rejected: stale-epoch") => {
                    // Learn the newer map, then try again.
                    let _ = self.fresh_map().await;
                }
                Err(e) => {
                    tracing::warn!("server {}: {change:?}: {e}", self.me);
                    return false;
                }
            }
        }
        false
    }

    /// Count `server` in sync on `set` again (its resync is done); whether
    /// the map counts it now.
    pub async fn mark_in_sync(&self, set: ServerId, server: ServerId) -> bool {
        if self
            .propose_latest(Change::MarkInSync { set: set.0, server })
            .await
        {
            return true;
        }
        // A proposal whose reply was lost may have applied: sent again (to
        // the next voter, or at the newer epoch) it is refused, the server
        // no longer catching up. Taken as a failure, the resync would start
        // over and wipe a copy the map counts in sync, which a failover
        // would then serve (crates/sim with 4 servers, seed 17305).
        for _ in 0..PROPOSE_ATTEMPTS {
            match self.fresh_map().await {
                Ok(m) => {
                    return m
                        .sets
                        .get(set.0 as usize)
                        .is_some_and(|s| s.members.contains(&server))
                }
                Err(_) => tokio::time::sleep(HAND_OVER_RETRY).await,
            }
        }
        false
    }

    /// Stop the detector of this server's node, if it runs one.
    async fn stop_detector(&self) {
        let detector = self
            .detector
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(d) = detector {
            d.stop().await;
        }
    }

    pub async fn shutdown(&self) {
        self.stop_detector().await;
        if let Some(node) = self.node() {
            node.shutdown().await;
        }
    }
}

/// The servers `map` says moved from their cluster-file address (a
/// replacement on another host), with where they are now.
pub fn moved_addresses(map: &ClusterMap) -> Vec<(ServerId, std::net::SocketAddr)> {
    map.addresses
        .keys()
        .filter_map(|&id| map.address_of(ServerId(id)).map(|a| (ServerId(id), a)))
        .collect()
}

/// A short, stable name of a rejection, to recognise it across the wire.
fn reject_code(r: &Rejection) -> String {
    match r {
        Rejection::NotAMember { .. } => "not-a-member".into(),
        Rejection::StaleEpoch { .. } => format!("stale-epoch: {r}"),
        other => format!("other: {other}"),
    }
}

/// The server (or set) id a membership message carries first (u16 LE).
fn id_in(rest: &[u8]) -> Option<ServerId> {
    rest.first_chunk::<2>()
        .map(|b| ServerId(u16::from_le_bytes(*b)))
}

/// Replace `cur` by `m` if `m` is newer; whether it did.
fn newer(cur: &mut ClusterMap, m: ClusterMap) -> bool {
    if m.epoch > cur.epoch {
        *cur = m;
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_rpc::ServerEntry;

    fn cluster(servers: u16, hosts: Option<u16>, voters: u8) -> ClusterConfig {
        ClusterConfig {
            cluster_id: "t".into(),
            chunk_size: 1 << 20,
            key_file: "k".into(),
            replicas: 2,
            voters,
            servers: (0..servers)
                .map(|id| ServerEntry {
                    id,
                    address: std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + id)),
                    data_dir: format!("/d{id}").into(),
                    metrics: None,
                    host: hosts.map(|h| format!("h{}", id / h)),
                })
                .collect(),
        }
    }

    fn ids(v: &[u16]) -> Vec<ServerId> {
        v.iter().map(|&i| ServerId(i)).collect()
    }

    #[test]
    fn voters_are_the_files_count_first_one_per_host() {
        // Local clusters: the first servers by id; fewer servers, all.
        assert_eq!(voters(&cluster(4, None, 3)), ids(&[0, 1, 2]));
        assert_eq!(voters(&cluster(2, None, 3)), ids(&[0, 1]));
        assert_eq!(voters(&cluster(6, None, 5)), ids(&[0, 1, 2, 3, 4]));
        // 8 servers, 2 per host: the first of each host, then by id.
        assert_eq!(voters(&cluster(8, Some(2), 3)), ids(&[0, 2, 4]));
        assert_eq!(voters(&cluster(8, Some(2), 5)), ids(&[0, 1, 2, 4, 6]));
        // 10 servers on 5 hosts: one voter per host.
        assert_eq!(voters(&cluster(10, Some(2), 5)), ids(&[0, 2, 4, 6, 8]));
    }
}
