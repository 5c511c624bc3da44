//! Connections to every server of a cluster, opened on first use (so a
//! client's memory and sockets grow with the servers it talks to, not with
//! the cluster size) and reopened after a failure.

use crate::cluster::ClusterConfig;
use crate::conn::{Connection, Response, SharedData};
use crate::error::RpcError;
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::Request;
use madfs_types::ServerId;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
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

pub struct Pool {
    addrs: Vec<SocketAddr>,
    key: ClusterKey,
    role: Role,
    timeouts: Timeouts,
    slots: Vec<Mutex<Option<Connection>>>,
    /// Set by `in_process`: calls go there instead of over TCP.
    local: Option<Arc<dyn LocalNet>>,
}

impl Pool {
    pub fn new(cfg: &ClusterConfig, key: ClusterKey, role: Role, timeouts: Timeouts) -> Pool {
        let addrs: Vec<SocketAddr> = cfg.servers.iter().map(|s| s.address).collect();
        let slots = addrs.iter().map(|_| Mutex::new(None)).collect();
        Pool {
            addrs,
            key,
            role,
            timeouts,
            slots,
            local: None,
        }
    }

    /// A pool of `servers` servers reached through `net` instead of TCP,
    /// calling as `role`.
    pub fn in_process(net: Arc<dyn LocalNet>, servers: usize, role: Role) -> Pool {
        let unused = SocketAddr::from(([127, 0, 0, 1], 0));
        Pool {
            addrs: vec![unused; servers],
            key: ClusterKey::from_hex(&"00".repeat(32)).expect("a valid key"),
            role,
            timeouts: Timeouts::default(),
            slots: (0..servers).map(|_| Mutex::new(None)).collect(),
            local: Some(net),
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
                Ok(c) => c.as_ref().is_some_and(|c| !c.is_closed()),
                Err(_) => true,
            })
            .count()
    }

    pub fn servers(&self) -> impl Iterator<Item = ServerId> {
        (0..self.addrs.len() as u16).map(ServerId)
    }

    /// A live connection to `server`, connecting if needed.
    pub async fn connection(&self, server: ServerId) -> Result<Connection, RpcError> {
        let slot = self
            .slots
            .get(server.0 as usize)
            .ok_or_else(|| RpcError::Config(format!("no server {server} in the cluster")))?;
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let c = Connection::connect(
            server,
            self.addrs[server.0 as usize],
            &self.key,
            self.role,
            self.timeouts.connect,
            self.timeouts.call,
        )
        .await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    pub async fn call(
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
            return net
                .call(server, self.role, req.clone(), data.to_vec())
                .await;
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
        if let Some(net) = &self.local {
            if server.0 as usize >= self.addrs.len() {
                return Err(RpcError::Config(format!(
                    "no server {server} in the cluster"
                )));
            }
            return net
                .call(server, self.role, req.clone(), data.as_slice().to_vec())
                .await;
        }
        self.connection(server).await?.call_shared(req, data).await
    }
}
