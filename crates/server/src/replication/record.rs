//! A replication stream's records (replication.rs): what each change to a
//! server's store looks like as shipped to its replicas, and the codec of
//! a ReplicaApply's heads and payloads.

use super::RECORDS_PER_CALL_MAX;
use crate::errors::err;
use madfs_proto::codec::Encoder;
use madfs_proto::{ErrorCode, WireError};
use madfs_rpc::SharedData;
use madfs_types::{ChunkIndex, InodeId};
use std::sync::Arc;

/// Bytes shared without a copy: a range of a buffer others may hold too.
/// A chunk write's record keeps the write request's own data (a copy of
/// every byte written was 6% of a server's CPU with replicas), the
/// shipper sends it from there, and a replica's records are ranges of the
/// data its ReplicaApply arrived with.
#[derive(Clone)]
pub struct SharedBytes {
    buf: Arc<Vec<u8>>,
    range: std::ops::Range<usize>,
}

impl SharedBytes {
    pub fn new(buf: Vec<u8>) -> SharedBytes {
        let range = 0..buf.len();
        SharedBytes {
            buf: Arc::new(buf),
            range,
        }
    }

    /// Bytes `range` of `buf`; None if `buf` is shorter.
    fn slice(buf: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Option<SharedBytes> {
        buf.get(range.clone())?;
        Some(SharedBytes {
            buf: buf.clone(),
            range,
        })
    }

    /// The same bytes, for a frame to send from where they are.
    fn to_send(&self) -> SharedData {
        SharedData::Shared(self.buf.clone(), self.range.clone())
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &SharedBytes) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// One change to a server's store, as shipped to its replicas.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Record {
    /// A metadata write batch (`WriteBatch::encode`), synced or not.
    Kv {
        batch: SharedBytes,
        sync: bool,
    },
    ChunkWrite {
        ino: InodeId,
        index: ChunkIndex,
        offset: u64,
        chunk_size: u64,
        data: SharedBytes,
    },
    Truncate {
        ino: InodeId,
        size: u64,
        chunk_size: u64,
    },
    Purge {
        ino: InodeId,
    },
    /// Everything before is durable on the primary: make it so here.
    Sync,
    /// Start a resync: follow `stream` from record `applied + 1` (sent
    /// in a load call, before the copy's contents). The copy's keys and
    /// chunk files stay for the load to compare (`Op::ReplicaKeyRange`,
    /// `Op::ReplicaDigests`); the load's end drops the chunk files not
    /// asked about. Every call of one load (this one's included) names
    /// that load, not the stream, in its `stream` field: a call of an
    /// earlier load of the same stream that arrives late (it outlived its
    /// timeout, and the primary started over) is refused, where it would
    /// have put back keys or dropped ranges the new load had settled.
    Reset {
        applied: u64,
        stream: u64,
    },
    /// A resync's load: remove one chunk file of the copy (it differs from
    /// the primary's, which follows).
    ChunkDrop {
        ino: InodeId,
        index: ChunkIndex,
    },
}

mod kind {
    pub const KV: u8 = 1;
    pub const CHUNK_WRITE: u8 = 2;
    pub const TRUNCATE: u8 = 3;
    pub const PURGE: u8 = 4;
    pub const SYNC: u8 = 5;
    pub const RESET: u8 = 6;
    pub const CHUNK_DROP: u8 = 7;
}

impl Record {
    pub(super) fn payload(&self) -> &[u8] {
        self.shared_payload().map_or(&[], |p| p)
    }

    fn shared_payload(&self) -> Option<&SharedBytes> {
        match self {
            Record::Kv { batch, .. } => Some(batch),
            Record::ChunkWrite { data, .. } => Some(data),
            _ => None,
        }
    }

    /// The record's head (kind, fields, payload length) onto `e`.
    fn encode_head(&self, e: &mut Encoder) {
        match self {
            Record::Kv { sync, .. } => {
                e.u8(kind::KV);
                e.bool(*sync);
            }
            Record::ChunkWrite {
                ino,
                index,
                offset,
                chunk_size,
                ..
            } => {
                e.u8(kind::CHUNK_WRITE);
                e.ino(*ino);
                e.u32(index.0);
                e.u64(*offset);
                e.u64(*chunk_size);
            }
            Record::Truncate {
                ino,
                size,
                chunk_size,
            } => {
                e.u8(kind::TRUNCATE);
                e.ino(*ino);
                e.u64(*size);
                e.u64(*chunk_size);
            }
            Record::Purge { ino } => {
                e.u8(kind::PURGE);
                e.ino(*ino);
            }
            Record::Sync => e.u8(kind::SYNC),
            Record::Reset { applied, stream } => {
                e.u8(kind::RESET);
                e.u64(*applied);
                e.u64(*stream);
            }
            Record::ChunkDrop { ino, index } => {
                e.u8(kind::CHUNK_DROP);
                e.ino(*ino);
                e.u32(index.0);
            }
        }
        e.u32(self.payload().len() as u32);
    }

    /// The records `encode_all` made of `heads` and `payloads`; their
    /// payloads are ranges of `payloads`, not copies.
    pub(crate) fn decode_all(
        heads: &[u8],
        payloads: &Arc<Vec<u8>>,
    ) -> Result<Vec<Record>, WireError> {
        let bad = |what: &str| {
            err(
                ErrorCode::InvalidArgument,
                format!("replica records: {what}"),
            )
        };
        let mut d = madfs_proto::codec::Decoder::new(heads);
        let mut at = 0usize;
        let mut out = Vec::new();
        while d.remaining() > 0 {
            if out.len() >= RECORDS_PER_CALL_MAX {
                return Err(bad("too many"));
            }
            let p = |e| bad(&format!("{e}"));
            let k = d.u8().map_err(p)?;
            let head = match k {
                kind::KV => Record::Kv {
                    batch: SharedBytes::new(Vec::new()),
                    sync: d.bool().map_err(p)?,
                },
                kind::CHUNK_WRITE => Record::ChunkWrite {
                    ino: d.ino().map_err(p)?,
                    index: ChunkIndex(d.u32().map_err(p)?),
                    offset: d.u64().map_err(p)?,
                    chunk_size: d.u64().map_err(p)?,
                    data: SharedBytes::new(Vec::new()),
                },
                kind::TRUNCATE => Record::Truncate {
                    ino: d.ino().map_err(p)?,
                    size: d.u64().map_err(p)?,
                    chunk_size: d.u64().map_err(p)?,
                },
                kind::PURGE => Record::Purge {
                    ino: d.ino().map_err(p)?,
                },
                kind::SYNC => Record::Sync,
                kind::RESET => Record::Reset {
                    applied: d.u64().map_err(p)?,
                    stream: d.u64().map_err(p)?,
                },
                kind::CHUNK_DROP => Record::ChunkDrop {
                    ino: d.ino().map_err(p)?,
                    index: ChunkIndex(d.u32().map_err(p)?),
                },
                _ => return Err(bad("unknown kind")),
            };
            let len = d.u32().map_err(p)? as usize;
            let payload = SharedBytes::slice(payloads, at..at.saturating_add(len))
                .ok_or_else(|| bad("payload past the data"))?;
            at += len;
            out.push(match head {
                Record::Kv { sync, .. } => Record::Kv {
                    batch: payload,
                    sync,
                },
                Record::ChunkWrite {
                    ino,
                    index,
                    offset,
                    chunk_size,
                    ..
                } => Record::ChunkWrite {
                    ino,
                    index,
                    offset,
                    chunk_size,
                    data: payload,
                },
                other if len == 0 => other,
                _ => return Err(bad("payload on a record without one")),
            });
        }
        if at != payloads.len() {
            return Err(bad("data left over"));
        }
        Ok(out)
    }
}

/// Heads and payloads of `records`, as one ReplicaApply carries them: the
/// payloads one after the other, sent from where each record keeps its
/// own (not gathered into one buffer: that copied every byte replicated).
pub(crate) fn encode_all<'a>(records: impl Iterator<Item = &'a Record>) -> (Vec<u8>, SharedData) {
    let mut heads = Encoder::new();
    let mut payloads = Vec::new();
    for r in records {
        r.encode_head(&mut heads);
        if let Some(p) = r.shared_payload().filter(|p| !p.is_empty()) {
            payloads.push(p.to_send());
        }
    }
    (heads.into_bytes(), SharedData::Pieces(payloads))
}
