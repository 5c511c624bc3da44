//! Connections to every server of a cluster, opened on first use (so a
//! client's memory and sockets grow with the servers it talks to, not with
//! the cluster size) and reopened after a failure.
//!
//! With replicas (cluster file `replicas` >= 2), a replica set may move to
//! another server when its primary is lost. Calls are made per set: the
//! pool connects to the server that serves the set now (`route`), naming
//! the set in the handshake. When that server stops answering, the pool
//! asks the other servers for the routes (`GetRoutes`, only then: no
//! periodic traffic) until the set has moved, and sends the call there, for
//! at most `FAILOVER_WAIT`. A call that was sent and not answered may
//! then run twice (as NFS over a lost reply).

use crate::cluster::ClusterConfig;
use crate::conn::{Connection, Response, SharedData};
use crate::error::RpcError;
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::Request;
use madfs_types::ServerId;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// The future an in-process network answers a call with.
pub type LocalCall = Pin<Box<dyn Future<Output = Result<Response, RpcError>> + Send>>;

/// An in-process network standing in for TCP (the deterministic simulation,
/// crates/sim): a pool made by `Pool::in_process` hands every call to it.
/// Each pool gets its own `LocalNet`, so the network knows who is calling.
pub trait LocalNet: Send + Sync + 'static {
    /// Deliver `req` (sent with `role`) to `server` and return its answer,
    /// or the transport error a lost or refused message would give.
    fn call(&self, server: ServerId, role: Role, req: Request, data: Vec<u8>) -> LocalCall;

    /// Deliver `req` for set `set` to server process `process` (the one
    /// the pool's routes say serves it now): only pools made by
    /// `Pool::in_process_failover` call this. By default, to `set` itself.
    fn call_via(
        &self,
        process: ServerId,
        set: ServerId,
        role: Role,
        req: Request,
        data: Vec<u8>,
    ) -> LocalCall {
        let _ = process;
        self.call(set, role, req, data)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub call: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        // A dead server must give a clear error, not a hang; a live one
        // under an fsync storm may take a while to answer.
        Timeouts {
            connect: Duration::from_secs(5),
            call: Duration::from_secs(120),
        }
    }
}

/// How long a call waits for its set to move to another server after the
/// one serving it stopped answering (with replicas).
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// Pause between two rounds of asking for the routes while waiting.
const ROUTES_POLL: Duration = Duration::from_millis(200);
/// A call unanswered this long starts watching for its set to move
/// (`watching_moves`): past a lease and a detector round (1 s and 2 s by
/// default), so only calls to a server already given up are affected.
const MOVE_CHECK_AFTER: Duration = Duration::from_secs(3);
/// A connection not made this long starts watching too: a connect to a
/// live server takes a round trip, and one whose SYN was lost waits 1 s
/// for its first retransmission, so this is a server out of reach (its
/// host cut off or gone). Without it, a client new to a failed-over set
/// waited the whole connect timeout (5 s) before it asked for the routes.
const CONNECT_MOVE_CHECK_AFTER: Duration = Duration::from_secs(1);
/// How often such a call asks for the routes.
const MOVE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Asking for the routes: another server is asked when none answered for
/// this long, the earlier asks still running...
const ROUTES_ASK_HEDGE: Duration = Duration::from_millis(250);
/// ...with at most this many asks in flight.
const ROUTES_ASKS_IN_FLIGHT_MAX: usize = 3;

pub struct Pool {
    /// Where each server listens: the cluster file's address, or where the
    /// cluster map says it moved (a replacement on another host).
    addrs: Vec<std::sync::RwLock<SocketAddr>>,
    /// Which server serves each set now (index: set).
    route: Vec<AtomicU16>,
    /// The map epoch `route` comes from.
    epoch: AtomicU64,
    /// Whether sets can move (the cluster keeps replicas).
    failover: bool,
    key: ClusterKey,
    role: Role,
    timeouts: Timeouts,
    /// Per set: its connection and the address it goes to. A connection
    /// is used only while that is still where the set's route leads, so a
    /// route changed by a caller that was cancelled before it cleared the
    /// slot (`set_routes` waits for the slot's lock) never keeps sending
    /// calls down a connection to a server that no longer serves the set.
    slots: Vec<Mutex<Option<(SocketAddr, Connection)>>>,
    /// Set by `in_process`: calls go there instead of over TCP.
    local: Option<Arc<dyn LocalNet>>,
    /// How long a call waits for its set to move (`FAILOVER_WAIT`).
    failover_wait: Duration,
    /// Per set: 0, or 1 + the map epoch at which a call to it waited the
    /// whole `failover_wait` in vain (no server of the set answered, not
    /// even with a refusal: every copy gone). Until
    /// the set answers again or the map changes, a call to it that fails
    /// asks for the routes once and gives up (`after_failover`): a process
    /// that stats a directory's files, a quarter of them on that set, is
    /// not held `failover_wait` per file.
    given_up: Vec<AtomicU64>,
}

impl Pool {
    pub fn new(cfg: &ClusterConfig, key: ClusterKey, role: Role, timeouts: Timeouts) -> Pool {
        let addrs: Vec<_> = cfg
            .servers
            .iter()
            .map(|s| std::sync::RwLock::new(s.address))
            .collect();
        let slots = addrs.iter().map(|_| Mutex::new(None)).collect();
        Pool {
            route: (0..addrs.len() as u16).map(AtomicU16::new).collect(),
            epoch: AtomicU64::new(0),
            failover: cfg.replicas > 1,
            addrs,
            key,
            role,
            timeouts,
            slots,
            local: None,
            failover_wait: failover_wait(),
            given_up: (0..cfg.servers.len()).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A pool of `servers` servers reached through `net` instead of TCP,
    /// calling as `role`.
    pub fn in_process(net: Arc<dyn LocalNet>, servers: usize, role: Role) -> Pool {
        let unused = SocketAddr::from(([127, 0, 0, 1], 0));
        Pool {
            route: (0..servers as u16).map(AtomicU16::new).collect(),
            epoch: AtomicU64::new(0),
            failover: false,
            addrs: (0..servers)
                .map(|_| std::sync::RwLock::new(unused))
                .collect(),
            key: ClusterKey::from_hex(&"00".repeat(32)).expect("a valid key"),
            role,
            timeouts: Timeouts::default(),
            slots: (0..servers).map(|_| Mutex::new(None)).collect(),
            local: Some(net),
            failover_wait: failover_wait(),
            given_up: (0..servers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// How long a call waits for its set to move to another server
    /// (`FAILOVER_WAIT` unless told otherwise: a client that should give
    /// up sooner).
    pub fn set_failover_wait(&mut self, wait: Duration) {
        self.failover_wait = wait;
    }

    /// Whether calls to `set` give up at once for now: one waited the whole
    /// failover wait under the routes this pool still has.
    fn gave_up_on(&self, set: ServerId) -> bool {
        let mark = self.given_up[set.0 as usize].load(Ordering::Relaxed);
        mark != 0 && mark - 1 == self.epoch.load(Ordering::Relaxed)
    }

    /// `set` answered (whatever it said): calls to it wait for a failover
    /// again.
    fn answered(&self, set: ServerId) {
        if let Some(mark) = self.given_up.get(set.0 as usize) {
            if mark.load(Ordering::Relaxed) != 0 {
                mark.store(0, Ordering::Relaxed);
            }
        }
    }

    /// `in_process`, for a cluster that keeps replicas: sets follow the
    /// routes (`set_routes`), and a call whose server does not answer
    /// waits for a failover as over TCP (the simulation with replicas).
    pub fn in_process_failover(net: Arc<dyn LocalNet>, servers: usize, role: Role) -> Pool {
        Pool {
            failover: true,
            ..Pool::in_process(net, servers, role)
        }
    }

    /// Send through the in-process network: to `server` itself, or, in a
    /// pool that fails over, to the process its routes name.
    fn local_call(
        &self,
        net: &Arc<dyn LocalNet>,
        server: ServerId,
        req: &Request,
        data: Vec<u8>,
    ) -> LocalCall {
        if self.failover {
            net.call_via(self.route(server), server, self.role, req.clone(), data)
        } else {
            net.call(server, self.role, req.clone(), data)
        }
    }

    pub fn server_count(&self) -> usize {
        self.addrs.len()
    }

    /// Connections open now (a slot being connected counts as open).
    /// Connections are opened on first use, so this grows with the servers
    /// a process talked to, not with the cluster.
    pub fn open_connections(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| match slot.try_lock() {
                Ok(c) => c.as_ref().is_some_and(|(_, c)| !c.is_closed()),
                Err(_) => true,
            })
            .count()
    }

    pub fn servers(&self) -> impl Iterator<Item = ServerId> {
        (0..self.addrs.len() as u16).map(ServerId)
    }

    /// Whether sets can move to other servers (the cluster keeps replicas).
    pub fn fails_over(&self) -> bool {
        self.failover
    }

    /// The server that serves `set` now.
    pub fn route(&self, set: ServerId) -> ServerId {
        self.route
            .get(set.0 as usize)
            .map_or(set, |r| ServerId(r.load(Ordering::Relaxed)))
    }

    /// Where `server` listens, as this pool knows it.
    pub fn address(&self, server: ServerId) -> Option<SocketAddr> {
        self.addrs
            .get(server.0 as usize)
            .map(|a| *a.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Servers that moved to another address (a replacement on another
    /// host): the connections routed to them are dropped, and the next
    /// call connects to the new address.
    pub async fn set_addresses(&self, moved: &[(ServerId, SocketAddr)]) {
        for &(server, addr) in moved {
            let Some(slot) = self.addrs.get(server.0 as usize) else {
                continue;
            };
            let was =
                std::mem::replace(&mut *slot.write().unwrap_or_else(|e| e.into_inner()), addr);
            if was == addr {
                continue;
            }
            tracing::info!("server {server} moved from {was} to {addr}");
            for set in 0..self.route.len() {
                if self.route[set].load(Ordering::Relaxed) == server.0 {
                    self.drop_connection(set);
                }
            }
        }
    }

    /// Take the routes of map `epoch` (older ones are ignored); the sets
    /// that moved lose their connection.
    pub async fn set_routes(&self, epoch: u64, serving: &[ServerId]) {
        if serving.len() != self.route.len() || epoch < self.epoch.load(Ordering::Relaxed) {
            return;
        }
        self.epoch.store(epoch, Ordering::Relaxed);
        for (set, &to) in serving.iter().enumerate() {
            if to.0 as usize >= self.addrs.len() {
                continue;
            }
            let was = self.route[set].swap(to.0, Ordering::Relaxed);
            if was != to.0 {
                self.drop_connection(set);
            }
        }
    }

    /// Close set `set`'s connection, unless a caller is connecting it now:
    /// never waited for, as a connect to a server out of reach holds the
    /// slot for the whole connect timeout, and the caller watching that
    /// connect for a move learns the move here (`watching_moves`). The
    /// connection made meanwhile is tagged with the address it went to, so
    /// `connection` never uses it once the route leads elsewhere.
    fn drop_connection(&self, set: usize) {
        if let Ok(mut slot) = self.slots[set].try_lock() {
            *slot = None;
        }
    }

    /// A live connection for `set` (to the server that serves it now),
    /// connecting if needed.
    pub async fn connection(&self, server: ServerId) -> Result<Connection, RpcError> {
        let slot = self
            .slots
            .get(server.0 as usize)
            .ok_or_else(|| RpcError::Config(format!("no server {server} in the cluster")))?;
        let mut guard = slot.lock().await;
        let to = self.route(server);
        let addr = self
            .address(to)
            .expect("routes name servers of the cluster");
        if let Some((at, c)) = guard.as_ref() {
            if *at == addr && !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let c = self.connect(server, addr).await?;
        *guard = Some((addr, c.clone()));
        Ok(c)
    }

    /// A new connection to `server` at `addr`, with this pool's key, role
    /// and timeouts.
    async fn connect(&self, server: ServerId, addr: SocketAddr) -> Result<Connection, RpcError> {
        let to = self.route(server);
        Connection::connect(
            server,
            addr,
            &self.key,
            self.role,
            self.timeouts.connect,
            self.timeouts.call,
        )
        .await
        .map_err(|e| {
            // The connection names the set it is for; where the set moved,
            // the server that did not answer is another.
            let named = format!("server {server} at {addr}");
            let moved = format!("server {to} (serving set {server}) at {addr}");
            match e {
                RpcError::Io(m) if to != server => RpcError::Io(m.replacen(&named, &moved, 1)),
                RpcError::Timeout(m) if to != server => {
                    RpcError::Timeout(m.replacen(&named, &moved, 1))
                }
                e => e,
            }
        })
    }

    pub async fn call(
        &self,
        server: ServerId,
        req: &Request,
        data: &[u8],
    ) -> Result<Response, RpcError> {
        let tried_on = self.route(server);
        match self.call_watching_moves(server, req, data).await {
            Err(e) if self.failover && unreachable(&e) => {
                // Sent again from here on: a request that runs once is
                // looked up where it arrives (it may have run already).
                let req = &req.resent();
                self.after_failover(server, tried_on, e, || self.call_once(server, req, data))
                    .await
            }
            other => {
                self.answered(server);
                other
            }
        }
    }

    /// `call` to the server `server` is routed to now, with no wait for a
    /// failover: for calls meant for one server process (status, routes,
    /// membership messages).
    pub async fn call_once(
        &self,
        server: ServerId,
        req: &Request,
        data: &[u8],
    ) -> Result<Response, RpcError> {
        if let Some(net) = &self.local {
            if server.0 as usize >= self.addrs.len() {
                return Err(RpcError::Config(format!(
                    "no server {server} in the cluster"
                )));
            }
            return self.local_call(net, server, req, data.to_vec()).await;
        }
        self.connection(server).await?.call(req, data).await
    }

    /// `call` with data shared with the caller: sent without a copy.
    pub async fn call_shared(
        &self,
        server: ServerId,
        req: &Request,
        data: SharedData,
    ) -> Result<Response, RpcError> {
        if !self.failover {
            return self.call_shared_once(server, req, data).await;
        }
        // Kept for a retry elsewhere: shared, so keeping it copies nothing.
        let (buf, range) = match data {
            SharedData::Owned(v) => {
                let n = v.len();
                (Arc::new(v), 0..n)
            }
            SharedData::Shared(v, r) => (v, r),
            pieces @ SharedData::Pieces(_) => {
                let v = pieces.to_vec();
                let n = v.len();
                (Arc::new(v), 0..n)
            }
        };
        let share = || SharedData::Shared(buf.clone(), range.clone());
        let tried_on = self.route(server);
        match self.call_shared_watching_moves(server, req, share()).await {
            Err(e) if unreachable(&e) => {
                let req = &req.resent();
                self.after_failover(server, tried_on, e, || {
                    self.call_shared_once(server, req, share())
                })
                .await
            }
            other => {
                self.answered(server);
                other
            }
        }
    }

    /// `call_shared` to `server` as it is routed now, with no wait for a
    /// failover: for calls meant for one server process, such as records
    /// for its copy of a set.
    pub async fn call_shared_once(
        &self,
        server: ServerId,
        req: &Request,
        data: SharedData,
    ) -> Result<Response, RpcError> {
        if let Some(net) = &self.local {
            if server.0 as usize >= self.addrs.len() {
                return Err(RpcError::Config(format!(
                    "no server {server} in the cluster"
                )));
            }
            return self.local_call(net, server, req, data.to_vec()).await;
        }
        self.connection(server).await?.call_shared(req, data).await
    }
}

/// Errors after which a set may have moved: its server did not answer, or
/// said it does not serve it.
fn unreachable(e: &RpcError) -> bool {
    match e {
        RpcError::Io(_) | RpcError::Timeout(_) | RpcError::Moved(_) => true,
        // A server that lost its lease (or its set) refuses before running
        // anything.
        RpcError::Remote(w) => w.code == madfs_proto::ErrorCode::Unavailable,
        _ => false,
    }
}

impl Pool {
    /// `call_once`, given up (`watching_moves`) if the set moves while
    /// the call waits for its answer.
    async fn call_watching_moves(
        &self,
        set: ServerId,
        req: &Request,
        data: &[u8],
    ) -> Result<Response, RpcError> {
        if self.local.is_some() || !self.failover {
            return self.call_once(set, req, data).await;
        }
        let c = self
            .watching_moves(set, CONNECT_MOVE_CHECK_AFTER, self.connection(set))
            .await?;
        self.watching_moves(set, MOVE_CHECK_AFTER, c.call(req, data))
            .await
    }

    /// `call_shared_once`, given up (`watching_moves`) if the set moves
    /// while the call waits for its answer.
    async fn call_shared_watching_moves(
        &self,
        set: ServerId,
        req: &Request,
        data: SharedData,
    ) -> Result<Response, RpcError> {
        if self.local.is_some() || !self.failover {
            return self.call_shared_once(set, req, data).await;
        }
        let c = self
            .watching_moves(set, CONNECT_MOVE_CHECK_AFTER, self.connection(set))
            .await?;
        self.watching_moves(set, MOVE_CHECK_AFTER, c.call_shared(req, data))
            .await
    }

    /// A connect or a call for set `set`, given up as `Moved` if the set
    /// moves to another server while it waits: a server that hangs
    /// (stopped, cut off without a reset, its disk stuck) would hold the
    /// call for the whole call timeout, long after the group failed its
    /// sets over. Once it has waited `check_after`, the routes are asked
    /// again every `MOVE_CHECK_EVERY`. (The hung server cannot
    /// acknowledge a call any more: it lost its lease, and its replicas
    /// left it.)
    async fn watching_moves<F, T>(
        &self,
        set: ServerId,
        check_after: Duration,
        call: F,
    ) -> Result<T, RpcError>
    where
        F: std::future::Future<Output = Result<T, RpcError>>,
    {
        let was = self.route(set);
        let moved = async {
            tokio::time::sleep(check_after).await;
            loop {
                self.refresh_routes(set, tokio::time::Instant::now() + ROUTES_ASK_TIMEOUT)
                    .await;
                let now = self.route(set);
                if now != was {
                    return now;
                }
                tokio::time::sleep(MOVE_CHECK_EVERY).await;
            }
        };
        tokio::select! {
            r = call => r,
            now = moved => Err(RpcError::Moved(format!(
                "set {set} moved from server {was}, which did not answer, to server {now}"
            ))),
        }
    }

    /// After a call for `set`, sent to server `tried_on`, failed with
    /// `err`: for at most the failover wait, make the call again with
    /// `again` where the set is served now: at once if the routes already
    /// lead elsewhere (a call given up as `Moved`, or routes another call
    /// learned meanwhile), else after asking for the routes again (the
    /// same server, if it refused for want of a lease or came back;
    /// another after a failover), until it gets through or fails
    /// otherwise. A set given up before under the same routes
    /// (`gave_up_on`) gets one ask for the routes, not the whole wait; so
    /// does one the routes' answer says has had no live copy for the
    /// failover wait already (a process new to it), and one lost for less
    /// waits only the rest of it.
    async fn after_failover<F, Fut>(
        &self,
        set: ServerId,
        mut tried_on: ServerId,
        mut err: RpcError,
        again: F,
    ) -> Result<Response, RpcError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Response, RpcError>>,
    {
        // A server that answered (refusing for want of a lease: starting,
        // or cut off from the group) is alive: its set is not given up.
        let answered = matches!(err, RpcError::Remote(_));
        if answered {
            self.answered(set);
        }
        let mut quick = !answered && self.gave_up_on(set);
        let wait = match quick {
            true => ROUTES_ASK_TIMEOUT,
            false => self.failover_wait,
        };
        let mut deadline = tokio::time::Instant::now() + wait;
        // The routes are asked at once after the first failure (the set
        // may have moved long ago: a client new to it), then every
        // `ROUTES_POLL`.
        let mut pause = Duration::ZERO;
        // Since when the group has heard from no copy of the set, once a
        // routes' answer said so.
        let mut lost_since: Option<tokio::time::Instant> = None;
        loop {
            let lost_for = lost_since.map(|t| t.elapsed());
            // Waited for as if this call had started when the set's last
            // copy fell silent; but a server that refused is alive (it may
            // be starting): waited for as usual.
            let until = match (lost_since, &err) {
                (Some(since), RpcError::Io(_) | RpcError::Timeout(_) | RpcError::Moved(_)) => {
                    deadline.min(since + self.failover_wait)
                }
                _ => deadline,
            };
            if tokio::time::Instant::now() + pause >= until || (quick && pause > Duration::ZERO) {
                if !quick && !matches!(err, RpcError::Remote(_)) {
                    match lost_for {
                        Some(silent) => tracing::warn!(
                            "no copy of set {set} has answered the membership group for {} s \
                             (last tried: server {tried_on}): calls to it fail at once until \
                             it answers or moves",
                            silent.as_secs()
                        ),
                        None => tracing::warn!(
                            "no server answered for set {set} (last tried: server {tried_on}) \
                             in {:?}: calls to it fail at once until it answers or moves",
                            self.failover_wait
                        ),
                    }
                    self.given_up[set.0 as usize]
                        .store(self.epoch.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
                return Err(given_up(err, set, tried_on, lost_for));
            }
            if self.route(set) == tried_on {
                tokio::time::sleep(pause).await;
                pause = ROUTES_POLL;
                let silent = self
                    .refresh_routes(
                        set,
                        until.min(tokio::time::Instant::now() + ROUTES_ASK_TIMEOUT),
                    )
                    .await;
                if let Some(silent) = silent {
                    let now = tokio::time::Instant::now();
                    // The earliest said (servers learn it a ping apart).
                    let since = now.checked_sub(silent).unwrap_or(now);
                    let since = lost_since.map_or(since, |t| t.min(since));
                    lost_since = Some(since);
                    if !matches!(err, RpcError::Remote(_)) && now >= since + self.failover_wait {
                        continue;
                    }
                }
                // A call that timed out is not sent to the same server
                // again: it may be running there still.
                if self.route(set) == tried_on && matches!(err, RpcError::Timeout(_)) {
                    continue;
                }
            }
            if self.route(set) != tried_on {
                tracing::info!(
                    "set {set} moved from server {tried_on} to server {}",
                    self.route(set)
                );
            }
            tried_on = self.route(set);
            match again().await {
                Err(e) if unreachable(&e) => {
                    if matches!(e, RpcError::Remote(_)) && quick {
                        // Alive after all (a refusal for want of a lease):
                        // waited for as any set.
                        self.answered(set);
                        quick = false;
                        deadline = tokio::time::Instant::now() + self.failover_wait;
                    }
                    err = e;
                }
                other => {
                    self.answered(set);
                    return other;
                }
            }
        }
    }

    /// Ask the server processes (but the one `set` is routed to, which
    /// just failed) for the routes, until one knows newer ones than this
    /// pool, or routes `set` elsewhere, or `deadline` passes; take every
    /// answer on the way. One that knows no more is passed over: a server
    /// cut off from the others keeps answering with its stale map, and a
    /// client that asked it first, every time, never learned the failover
    /// (crates/sim with replicas, seeds 20 and 126 of the soak). Servers
    /// are asked one after the other, the next as soon as one answers
    /// with nothing new or `ROUTES_ASK_HEDGE` passes without an answer
    /// (at most `ROUTES_ASKS_IN_FLIGHT_MAX` at once): a server out of
    /// reach (its host cut off: each connect waits its timeout) costs a
    /// quarter of a second, not the whole ask. Usually the first answers,
    /// and one request is all a failover costs a client. An answer that
    /// says no copy of `set` answers the group ends the asking too: how
    /// long none has is returned.
    async fn refresh_routes(
        &self,
        set: ServerId,
        deadline: tokio::time::Instant,
    ) -> Option<Duration> {
        use futures::stream::StreamExt;
        let skip = self.route(set);
        let known = self.epoch.load(Ordering::Relaxed);
        let ask = Request {
            creds: madfs_types::Credentials::root(),
            op: madfs_proto::message::Op::GetRoutes,
            once: None,
        };
        let mut others = (0..self.addrs.len() as u16)
            .map(ServerId)
            .filter(|&s| s != skip);
        let mut asking = futures::stream::FuturesUnordered::new();
        loop {
            if asking.len() < ROUTES_ASKS_IN_FLIGHT_MAX {
                if let Some(other) = others.next() {
                    asking.push(self.call_process(other, &ask));
                }
            }
            if asking.is_empty() {
                return None;
            }
            let answer = tokio::select! {
                Some(answer) = asking.next() => answer,
                () = tokio::time::sleep(ROUTES_ASK_HEDGE) => continue,
                () = tokio::time::sleep_until(deadline) => return None,
            };
            if let Ok(Response {
                reply:
                    madfs_proto::Reply::Routes {
                        epoch,
                        serving,
                        addresses,
                        lost,
                        ..
                    },
                ..
            }) = answer
            {
                self.set_addresses(&addresses).await;
                self.set_routes(epoch, &serving).await;
                let silent = lost.iter().find(|(s, _)| *s == set).map(|(_, ms)| *ms);
                if let Some(ms) = silent {
                    if self.route(set) == skip {
                        return Some(Duration::from_millis(ms));
                    }
                }
                // Done once this pool learned something: an answer older
                // than what it knows changes nothing, even one that routes
                // the set elsewhere (a server cut off from the others, with
                // the map from before the set came back to the server just
                // tried: answering first every time, it kept the client
                // from asking the others; crates/sim with replicas, seed
                // 5187).
                if self.epoch.load(Ordering::Relaxed) > known || self.route(set) != skip {
                    return None;
                }
            }
        }
    }
}

impl Pool {
    /// `req` to server process `server` itself, not to whoever the routes
    /// say serves set `server`: every process answers for its own id (its
    /// routes, its membership messages) whatever sets moved. Asking for the
    /// routes through stale routes finds only servers that no longer serve
    /// those sets, which refuse (found by crates/sim with replicas, seed
    /// 105: a client whose every other route was stale never learned the
    /// failover).
    async fn call_process(&self, server: ServerId, req: &Request) -> Result<Response, RpcError> {
        if let Some(net) = &self.local {
            return net
                .call_via(server, server, self.role, req.clone(), Vec::new())
                .await;
        }
        let addr = self
            .address(server)
            .ok_or_else(|| RpcError::Config(format!("no server {server} in the cluster")))?;
        self.connect(server, addr).await?.call(req, &[]).await
    }
}

/// The error a call to `set`, last sent to server `tried_on`, stands with:
/// a transport error names the set's server as the connection knew it (the
/// set's id), so where the set had moved it says which server that was,
/// and how long no copy has answered the group where the routes said.
fn given_up(
    err: RpcError,
    set: ServerId,
    tried_on: ServerId,
    lost_for: Option<Duration>,
) -> RpcError {
    let context = |m: String| {
        let m = match set == tried_on {
            true => m,
            false => format!("{m} (no other copy of set {set} answered)"),
        };
        match lost_for {
            Some(d) => format!(
                "{m} (no copy of set {set} has answered the membership group for {} s)",
                d.as_secs()
            ),
            None => m,
        }
    };
    match err {
        RpcError::Io(m) => RpcError::Io(context(m)),
        RpcError::Timeout(m) => RpcError::Timeout(context(m)),
        RpcError::Moved(m) => RpcError::Moved(context(m)),
        other => other,
    }
}

/// `FAILOVER_WAIT`, or `MADFS_FAILOVER_WAIT_MS` where set (a client that
/// should give up sooner, as in tests of a partition).
fn failover_wait() -> Duration {
    static WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *WAIT.get_or_init(|| {
        madfs_types::env_number("MADFS_FAILOVER_WAIT_MS")
            .map_or(FAILOVER_WAIT, Duration::from_millis)
    })
}

/// How long one server may take to say the routes.
const ROUTES_ASK_TIMEOUT: Duration = Duration::from_secs(2);
