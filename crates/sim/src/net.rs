//! The in-process network: every pool of the simulation (each server's
//! peer pool, each client's) calls through an `Endpoint` of one `SimNet`,
//! which runs the request as a task of the target server (so a crash can
//! kill it mid-way) and, while faults are on, delays messages and drops
//! requests or replies as the seeded generator says. A lost message shows
//! up to the caller as TCP would show it: a timeout (or a reset connection
//! when the server died), never as a wrong answer.

use crate::disk::SimKv;
use madfs_kv::KvStore;
use madfs_proto::auth::Role;
use madfs_proto::{ErrorCode, Op, Request, WireError};
use madfs_rpc::pool::{LocalCall, LocalNet};
use madfs_rpc::serve::{CallContext, Handler};
use madfs_rpc::{Response, RpcError};
use madfs_server::failover::Router;
use madfs_server::Server;
use madfs_types::ServerId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::AbortHandle;

/// How long a caller waits for a message that was lost (virtual time).
pub const LOST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a call across a partition takes to fail (the pools' connect
/// timeout).
pub const PARTITION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for an answer at all (the pools' default).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Who is calling: a client, or one incarnation of a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    Client(u16),
    Server(ServerId, u64),
}

/// What answers a server process's requests: its `Server` alone, or (with
/// replicas) the router of every set it serves.
#[derive(Clone)]
pub enum Target {
    Plain(Arc<Server>),
    Routed(Arc<Router>),
}

struct Up {
    server: Target,
    kv: Arc<SimKv>,
    incarnation: u64,
    tasks: Vec<AbortHandle>,
}

/// Fault settings of the network.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// Chance of losing a request, and (separately) its reply, per mille.
    pub drop_permille: u32,
    /// Largest delay of a message, microseconds (uniform from 0).
    pub delay_max_us: u64,
}

struct Inner {
    rng: ChaCha8Rng,
    faults: Option<Faults>,
    servers: Vec<Option<Up>>,
    incarnations: Vec<u64>,
    dropped: u64,
    delivered: u64,
    stalls: u64,
    /// A server cut off from the other servers (not from clients).
    isolated: Option<ServerId>,
}

pub struct SimNet {
    inner: Mutex<Inner>,
}

struct Plan {
    request_delay: Duration,
    drop_request: bool,
    reply_delay: Duration,
    drop_reply: bool,
}

impl SimNet {
    pub fn new(seed: u64, servers: usize) -> Arc<SimNet> {
        Arc::new(SimNet {
            inner: Mutex::new(Inner {
                rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6e65_7477_6f72_6b00),
                faults: None,
                servers: (0..servers).map(|_| None).collect(),
                incarnations: vec![0; servers],
                dropped: 0,
                delivered: 0,
                stalls: 0,
                isolated: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_faults(&self, faults: Option<Faults>) {
        self.lock().faults = faults;
    }

    /// Cut `id` off from the other servers (None: heal). Its clients still
    /// reach it: a primary cut off from the group must stop answering.
    pub fn isolate(&self, id: Option<ServerId>) {
        self.lock().isolated = id;
    }

    /// Messages lost so far.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Calls that got no answer within `CALL_TIMEOUT` although nothing
    /// was lost: servers waiting on each other.
    pub fn stalls(&self) -> u64 {
        self.lock().stalls
    }

    /// Requests handed to a server so far.
    pub fn delivered(&self) -> u64 {
        self.lock().delivered
    }

    /// The endpoint `caller` sends through.
    pub fn endpoint(self: &Arc<Self>, caller: Caller) -> Arc<dyn LocalNet> {
        Arc::new(Endpoint {
            net: self.clone(),
            caller,
        })
    }

    /// The incarnation number the next start of `id` gets.
    pub fn next_incarnation(&self, id: ServerId) -> u64 {
        let mut s = self.lock();
        s.incarnations[id.0 as usize] += 1;
        s.incarnations[id.0 as usize]
    }

    /// Server `id` (incarnation `incarnation`) is up and serving.
    pub fn install(&self, id: ServerId, incarnation: u64, server: Arc<Server>, kv: Arc<SimKv>) {
        self.install_target(id, incarnation, Target::Plain(server), kv);
    }

    /// Server process `id` (incarnation `incarnation`) is up and serving
    /// through `target`.
    pub fn install_target(&self, id: ServerId, incarnation: u64, target: Target, kv: Arc<SimKv>) {
        self.lock().servers[id.0 as usize] = Some(Up {
            server: target,
            kv,
            incarnation,
            tasks: Vec::new(),
        });
    }

    /// Server `id` dies: it stops answering and every request it was
    /// running is killed where it stands. Returns the dead server, for the
    /// caller to drop (its own background tasks are fenced by the store).
    pub fn kill(&self, id: ServerId) -> Option<Target> {
        let up = self.lock().servers[id.0 as usize].take()?;
        for t in &up.tasks {
            t.abort();
        }
        Some(up.server)
    }

    pub fn is_up(&self, id: ServerId) -> bool {
        self.lock().servers[id.0 as usize].is_some()
    }

    fn caller_alive(&self, caller: Caller) -> bool {
        match caller {
            Caller::Client(_) => true,
            Caller::Server(id, inc) => self.lock().servers[id.0 as usize]
                .as_ref()
                .is_some_and(|u| u.incarnation == inc),
        }
    }

    fn plan(&self) -> Plan {
        let mut s = self.lock();
        let Some(f) = s.faults else {
            return Plan {
                request_delay: Duration::ZERO,
                drop_request: false,
                reply_delay: Duration::ZERO,
                drop_reply: false,
            };
        };
        let delay = |rng: &mut ChaCha8Rng| {
            Duration::from_micros(if f.delay_max_us == 0 {
                0
            } else {
                rng.random_range(0..=f.delay_max_us)
            })
        };
        let request_delay = delay(&mut s.rng);
        let reply_delay = delay(&mut s.rng);
        let drop_request = s.rng.random_range(0..1000) < f.drop_permille;
        let drop_reply = s.rng.random_range(0..1000) < f.drop_permille;
        s.dropped += drop_request as u64 + (drop_reply && !drop_request) as u64;
        Plan {
            request_delay,
            drop_request,
            reply_delay,
            drop_reply,
        }
    }

    async fn deliver(
        self: Arc<Self>,
        caller: Caller,
        to: ServerId,
        set: ServerId,
        role: Role,
        req: Request,
        data: Vec<u8>,
    ) -> Result<Response, RpcError> {
        if !self.caller_alive(caller) {
            return Err(RpcError::Io("the calling server crashed".into()));
        }
        let cut = {
            let isolated = self.lock().isolated;
            match (isolated, caller) {
                (Some(i), Caller::Server(from, _)) => (from == i) != (to == i),
                _ => false,
            }
        };
        if cut {
            // As TCP shows a partition: the connection attempt times out.
            tokio::time::sleep(PARTITION_TIMEOUT).await;
            return Err(RpcError::Timeout(format!(
                "server {to} unreachable (partition)"
            )));
        }
        let plan = self.plan();
        if !plan.request_delay.is_zero() {
            tokio::time::sleep(plan.request_delay).await;
        }
        let target = {
            let s = self.lock();
            s.servers[to.0 as usize]
                .as_ref()
                .map(|u| (u.server.clone(), u.kv.clone(), u.incarnation))
        };
        let Some((server, kv, incarnation)) = target else {
            return Err(RpcError::Io(format!("server {to}: connection refused")));
        };
        if plan.drop_request {
            tokio::time::sleep(LOST_MESSAGE_TIMEOUT).await;
            return Err(RpcError::Timeout(format!("request to server {to} lost")));
        }
        if req.op.opcode().is_peer_only() && role != Role::Peer {
            return Err(RpcError::Remote(WireError::new(
                ErrorCode::NotPermitted,
                "peer operation from a client",
            )));
        }
        let peer = SocketAddr::from((
            [127, 0, 0, 1],
            match caller {
                Caller::Client(n) => 10_000 + n,
                Caller::Server(id, _) => 20_000 + id.0,
            },
        ));
        let ctx = CallContext { role, peer, set };
        if let Target::Routed(r) = &server {
            // As the rpc layer's Hello does for a set not served there.
            if !madfs_rpc::serve::Handler::serves(r.as_ref(), set, to) {
                return Err(RpcError::Moved(format!(
                    "server {to} does not serve set {set}"
                )));
            }
        }
        let task = if let (Op::Fsync, Target::Routed(r)) = (&req.op, &server) {
            // The server's own fsync, on this task (see Server::sync_inline).
            let server = r.server_of(set);
            tokio::spawn(async move {
                match server {
                    None => Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!("server {to} no longer serves set {set}"),
                    )),
                    Some(s) => s
                        .sync_inline()
                        .await
                        .map(|()| (s.synced_reply(), Vec::new())),
                }
            })
        } else if let (Op::Fsync, Target::Plain(s)) = (&req.op, &server) {
            // The server's fsync coalescer waits on a thread of its own,
            // outside the simulated clock: sync the store here instead
            // (chunk files are not lost by a simulated crash anyway).
            let s = s.clone();
            tokio::spawn(async move {
                kv.sync_wal()
                    .map(|()| (s.synced_reply(), Vec::new()))
                    .map_err(|e| WireError::new(ErrorCode::Io, e.to_string()))
            })
        } else {
            tokio::spawn(async move {
                match server {
                    Target::Plain(s) => s.handle(ctx, req, data).await,
                    Target::Routed(r) => r.handle(ctx, req, data).await,
                }
            })
        };
        {
            let mut s = self.lock();
            s.delivered += 1;
            match s.servers[to.0 as usize].as_mut() {
                Some(up) if up.incarnation == incarnation => {
                    up.tasks.retain(|t| !t.is_finished());
                    up.tasks.push(task.abort_handle());
                }
                _ => task.abort(),
            }
        }
        // As a TCP connection does (`Timeouts::call`): a request that
        // waits forever (a deadlock between servers) fails the caller.
        let result = match tokio::time::timeout(CALL_TIMEOUT, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => {
                return Err(RpcError::Io(format!(
                    "server {to} crashed while handling the request"
                )))
            }
            Err(_) => {
                self.lock().stalls += 1;
                return Err(RpcError::Timeout(format!(
                    "server {to} did not answer within {CALL_TIMEOUT:?}"
                )));
            }
        };
        if !plan.reply_delay.is_zero() {
            tokio::time::sleep(plan.reply_delay).await;
        }
        let same = self.lock().servers[to.0 as usize]
            .as_ref()
            .is_some_and(|u| u.incarnation == incarnation);
        if !same {
            return Err(RpcError::Io(format!(
                "server {to} crashed: connection reset"
            )));
        }
        if plan.drop_reply {
            tokio::time::sleep(LOST_MESSAGE_TIMEOUT).await;
            return Err(RpcError::Timeout(format!("reply from server {to} lost")));
        }
        result
            .map(|(reply, data)| Response { reply, data })
            .map_err(RpcError::Remote)
    }
}

struct Endpoint {
    net: Arc<SimNet>,
    caller: Caller,
}

impl LocalNet for Endpoint {
    fn call(&self, server: ServerId, role: Role, req: Request, data: Vec<u8>) -> LocalCall {
        Box::pin(
            self.net
                .clone()
                .deliver(self.caller, server, server, role, req, data),
        )
    }

    fn call_via(
        &self,
        process: ServerId,
        set: ServerId,
        role: Role,
        req: Request,
        data: Vec<u8>,
    ) -> LocalCall {
        Box::pin(
            self.net
                .clone()
                .deliver(self.caller, process, set, role, req, data),
        )
    }
}
