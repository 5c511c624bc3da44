//! The membership protocol's types and messages: openraft's type
//! configuration and node ids (server id plus incarnation), the requests
//! one node (or a non-voter's `fetch_map`) sends another through the
//! `Transport`, their replies, and the encoding of everything sent or
//! stored (a version byte, then JSON).

use madfs_types::ServerId;
use openraft::error::{Fatal, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::state::{Applied, ClusterMap, Command};
use crate::MembershipError;

openraft::declare_raft_types!(
    /// openraft's types for the membership group: node ids are server ids
    /// with an incarnation (see [`node_id`]); voters need no address (the
    /// `Transport` resolves server ids); snapshots are the encoded map,
    /// sent whole.
    pub(crate) TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = EmptyNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Vec<u8>,
        AsyncRuntime = crate::runtime::Runtime,
);

/// Node id as openraft sees it: `(incarnation << 16) | server id`.
pub(crate) type NodeId = u64;

/// Incarnations fit in the 48 bits above the server id.
pub(crate) const INCARNATION_MAX: u64 = (1 << 48) - 1;

/// The Raft node of `server` in its `incarnation`. The original voters are
/// incarnation 0, so their node id is their server id; a process that
/// replaces one after losing its Raft state is a new node (a fresh
/// incarnation) that never speaks for its predecessor's votes.
pub(crate) fn node_id(server: ServerId, incarnation: u64) -> NodeId {
    debug_assert!(incarnation <= INCARNATION_MAX);
    (incarnation << 16) | server.0 as NodeId
}

/// The server a node runs as: where the `Transport` sends its messages.
pub(crate) fn server_of(node: NodeId) -> ServerId {
    ServerId(node as u16)
}

pub(crate) fn incarnation_of(node: NodeId) -> u64 {
    node >> 16
}

/// Version of what this crate stores (log entries, vote, snapshots, the
/// incarnation) and of lease pings: unchanged since the first release, so
/// existing stores keep loading. A reader refuses any other.
const RECORD_VERSION: u8 = 1;

/// Version of node-to-node messages ([`Envelope`], [`Reply`]). 2: every
/// request names the node it is for. A reader refuses any other, so a
/// mixed-version cluster fails loudly instead of misreading.
const MESSAGE_VERSION: u8 = 2;

/// Largest message or stored record accepted, checked before decoding. A
/// map of 4096 sets of a few replicas is about 200 KiB in JSON.
pub(crate) const MESSAGE_MAX_BYTES: usize = 16 << 20;

/// A request and the node it is for.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct Envelope {
    /// Raft RPCs always name their target node: the receiving process
    /// refuses one meant for another incarnation of its server, so a
    /// replaced voter's successor never answers for it. `None` for
    /// requests to whichever node runs the server (proposals, reads and
    /// joins, which only a leader holding a quorum serves).
    pub to: Option<NodeId>,
    pub request: Request,
}

/// A request from one node to another.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    /// A whole snapshot: the encoded map at `meta.last_log_id`.
    FullSnapshot {
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, EmptyNode>,
        data: Vec<u8>,
    },
    /// A proposal forwarded to the node believed to lead. It does not
    /// forward again: the sender follows the hint in `NotLeader`.
    Propose(Command),
    /// A linearizable read of the map, answered by the leader only.
    ReadMap,
    /// Make `node` (a fresh incarnation) a voter, in place of any other
    /// incarnation of its server and of the voter `replaces` (a server lost
    /// for good); answered by the leader only.
    Join {
        node: NodeId,
        #[serde(default)]
        replaces: Option<u16>,
    },
}

impl Request {
    /// Whether this is a Raft RPC, which must name its target node.
    pub(crate) fn is_raft(&self) -> bool {
        matches!(
            self,
            Request::AppendEntries(_) | Request::Vote(_) | Request::FullSnapshot { .. }
        )
    }
}

/// A reply to a [`Request`], in the same variant.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum Reply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    FullSnapshot(Result<SnapshotResponse<NodeId>, Fatal<NodeId>>),
    /// The proposal was applied (or refused by the state machine).
    Proposed(Applied),
    /// The map, read after confirming leadership with a quorum.
    Map(ClusterMap),
    /// This node does not lead; `hint` is the leader it knows of.
    NotLeader {
        hint: Option<u16>,
    },
    /// The node could not serve the request (shutting down, timed out).
    Failed(String),
    /// `Join`: the node is a voter now (the change is committed).
    Joined,
    /// The message was for another node (another incarnation of this
    /// server, or no node named for a Raft RPC): not acted on. `me` is
    /// the node that runs here.
    WrongNode {
        me: NodeId,
    },
}

/// Encode a stored record or a ping: the version byte, then JSON.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_as(RECORD_VERSION, value)
}

/// Decode what [`encode`] made, checking the length and version first.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, MembershipError> {
    decode_as(RECORD_VERSION, bytes)
}

/// Encode a node-to-node message ([`Envelope`] or [`Reply`]).
pub(crate) fn encode_message<T: Serialize>(value: &T) -> Vec<u8> {
    encode_as(MESSAGE_VERSION, value)
}

/// Decode what [`encode_message`] made.
pub(crate) fn decode_message<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, MembershipError> {
    decode_as(MESSAGE_VERSION, bytes)
}

fn encode_as<T: Serialize>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
    // Serializing our own types to a Vec cannot fail: every map key is a
    // string or integer and no Serialize impl here returns an error.
    serde_json::to_writer(&mut out, value).expect("membership types always encode");
    assert!(
        out.len() <= MESSAGE_MAX_BYTES,
        "encoded membership message of {} bytes",
        out.len()
    );
    out
}

fn decode_as<T: DeserializeOwned>(version: u8, bytes: &[u8]) -> Result<T, MembershipError> {
    if bytes.len() > MESSAGE_MAX_BYTES {
        return Err(MembershipError::Decode(format!(
            "{} bytes, more than the {MESSAGE_MAX_BYTES} allowed",
            bytes.len()
        )));
    }
    match bytes.split_first() {
        None => Err(MembershipError::Decode("empty message".into())),
        Some((&v, body)) if v == version => {
            serde_json::from_slice(body).map_err(|e| MembershipError::Decode(e.to_string()))
        }
        Some((v, _)) => Err(MembershipError::Decode(format!(
            "format version {v}, this build reads {version}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_split_into_server_and_incarnation() {
        assert_eq!(node_id(ServerId(7), 0), 7, "original voters keep their ids");
        let node = node_id(ServerId(u16::MAX), INCARNATION_MAX);
        assert_eq!(server_of(node), ServerId(u16::MAX));
        assert_eq!(incarnation_of(node), INCARNATION_MAX);
    }

    #[test]
    fn messages_and_records_refuse_each_others_versions() {
        let envelope = Envelope {
            to: Some(node_id(ServerId(1), 3)),
            request: Request::ReadMap,
        };
        let bytes = encode_message(&envelope);
        let back: Envelope = decode_message(&bytes).expect("decodes");
        assert_eq!(back.to, envelope.to);
        assert!(decode::<Envelope>(&bytes).is_err());
        assert!(decode_message::<u64>(&encode(&5u64)).is_err());
        assert!(decode_message::<Envelope>(&[]).is_err());
    }
}
