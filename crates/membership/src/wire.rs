//! The membership protocol's types and messages: openraft's type
//! configuration, the requests one voter (or a non-voter's `fetch_map`)
//! sends another through the `Transport`, their replies, and the one
//! encoding of everything sent or stored (a version byte, then JSON).

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
    /// openraft's types for the membership group: node ids are `ServerId`
    /// numbers widened to u64; voters need no address (the `Transport`
    /// resolves server ids); snapshots are the encoded map, sent whole.
    pub(crate) TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = EmptyNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Vec<u8>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Node id as openraft sees it.
pub(crate) type NodeId = u64;

/// Version of everything this crate sends or stores. A reader refuses any
/// other, so a mixed-version cluster fails loudly instead of misreading.
const FORMAT_VERSION: u8 = 1;

/// Largest message or stored record accepted, checked before decoding. A
/// map of 4096 sets of a few replicas is about 200 KiB in JSON.
pub(crate) const MESSAGE_MAX_BYTES: usize = 16 << 20;

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
}

/// Encode a message or record: the version byte, then JSON.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![FORMAT_VERSION];
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

/// Decode what [`encode`] made, checking the length and version first.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, MembershipError> {
    if bytes.len() > MESSAGE_MAX_BYTES {
        return Err(MembershipError::Decode(format!(
            "{} bytes, more than the {MESSAGE_MAX_BYTES} allowed",
            bytes.len()
        )));
    }
    match bytes.split_first() {
        None => Err(MembershipError::Decode("empty message".into())),
        Some((&FORMAT_VERSION, body)) => {
            serde_json::from_slice(body).map_err(|e| MembershipError::Decode(e.to_string()))
        }
        Some((version, _)) => Err(MembershipError::Decode(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ))),
    }
}
