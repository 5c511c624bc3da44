//! openraft's network over the caller's [`Transport`]: each Raft RPC is one
//! encoded [`Request`], addressed to its target node, sent with
//! `Transport::call` to that node's server, bounded by a timeout, and its
//! [`Reply`] decoded. Transport failures, and a server now running another
//! incarnation, become openraft's `Unreachable` (it backs off and
//! retries); a malformed reply becomes a network error.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use madfs_types::ServerId;
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, OptionalSend, Snapshot, Vote};

use crate::wire::{
    decode_message, encode_message, server_of, Envelope, NodeId, Reply, Request, TypeConfig,
};
use crate::{MembershipError, Transport};

/// Send `request` to server `to` (for its node `node`, or for whichever
/// node runs there if `None`) and wait at most `timeout` for its reply.
pub(crate) async fn call(
    net: &dyn Transport,
    to: ServerId,
    node: Option<NodeId>,
    request: Request,
    timeout: Duration,
) -> Result<Reply, MembershipError> {
    let sent = net.call(to, encode_message(&Envelope { to: node, request }));
    match tokio::time::timeout(timeout, sent).await {
        Err(_) => Err(MembershipError::Unreachable {
            server: to,
            why: format!("no reply within {timeout:?}"),
        }),
        Ok(Err(why)) => Err(MembershipError::Unreachable { server: to, why }),
        Ok(Ok(bytes)) => decode_message(&bytes),
    }
}

/// Makes one [`Peer`] per voter for openraft.
pub(crate) struct PeerFactory {
    pub(crate) net: Arc<dyn Transport>,
    /// How long openraft waits after an unreachable peer before retrying.
    pub(crate) retry_after: Duration,
}

impl RaftNetworkFactory<TypeConfig> for PeerFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> Peer {
        Peer {
            net: self.net.clone(),
            target,
            retry_after: self.retry_after,
        }
    }
}

/// The link to one voter.
pub(crate) struct Peer {
    net: Arc<dyn Transport>,
    target: NodeId,
    retry_after: Duration,
}

/// A transport failure as openraft's error type.
fn unreachable(e: MembershipError) -> Unreachable {
    Unreachable::new(&io::Error::other(e.to_string()))
}

fn unexpected(reply: &Reply) -> NetworkError {
    NetworkError::new(&io::Error::other(format!("unexpected reply {reply:?}")))
}

impl Peer {
    /// Send `request` to the target node. A server that runs another
    /// incarnation now answers `WrongNode`: the target is gone, as if its
    /// server were down.
    async fn send(&self, request: Request, timeout: Duration) -> Result<Reply, MembershipError> {
        let to = server_of(self.target);
        match call(&*self.net, to, Some(self.target), request, timeout).await? {
            Reply::WrongNode { me } => Err(MembershipError::Unreachable {
                server: to,
                why: format!("node {} is gone: node {me} runs there now", self.target),
            }),
            reply => Ok(reply),
        }
    }

    fn remote(&self, e: RaftError<NodeId>) -> RPCError<NodeId, EmptyNode, RaftError<NodeId>> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let reply = self
            .send(Request::AppendEntries(rpc), option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(unreachable(e)))?;
        match reply {
            Reply::AppendEntries(Ok(response)) => Ok(response),
            Reply::AppendEntries(Err(e)) => Err(self.remote(e)),
            other => Err(RPCError::Network(unexpected(&other))),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let reply = self
            .send(Request::Vote(rpc), option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(unreachable(e)))?;
        match reply {
            Reply::Vote(Ok(response)) => Ok(response),
            Reply::Vote(Err(e)) => Err(self.remote(e)),
            other => Err(RPCError::Network(unexpected(&other))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let request = Request::FullSnapshot {
            vote,
            meta: snapshot.meta,
            data: *snapshot.snapshot,
        };
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = self.send(request, option.hard_ttl()) => reply,
        };
        match reply.map_err(|e| StreamingError::Unreachable(unreachable(e)))? {
            Reply::FullSnapshot(Ok(response)) => Ok(response),
            Reply::FullSnapshot(Err(fatal)) => Err(StreamingError::RemoteError(RemoteError::new(
                self.target,
                fatal,
            ))),
            other => Err(StreamingError::Network(unexpected(&other))),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.retry_after))
    }
}
