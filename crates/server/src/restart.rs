//! A primary that stops cleanly continues its record stream at its next
//! start, so `madfs down` followed by `madfs up` does not rebuild every
//! copy (before, each start opened a new stream, which every copy refused
//! as stale, and each was wiped and loaded again).
//!
//! 1. At a clean stop, once the runtime is gone (no task can write any
//!    more), a store whose last record is a sync (`Replicator::
//!    continuable`: everything up to it durable here) gets the stream id
//!    and that record's number (`META_STREAM_STOPPED`), written below
//!    replication and synced. A crash before this leaves no marker: the
//!    next start opens a new stream, as after any crash.
//! 2. The next open of the store takes the marker away (synced) and
//!    continues the stream after that record (`Replicator::continuing`).
//!    A crash between leaves neither: a new stream.
//! 3. A copy that has the whole stream up to there goes on with the next
//!    record; one with less (it stopped first, or missed records) refuses
//!    it and is resynced as before. A resync first asks whether the copy
//!    already has everything before the first record kept for it
//!    (`Replicator::has_all_before`) and skips the load if so.
//!
//! A copy says what it has only when that is certain (replica.rs): its
//! position counts only if the record at it was a sync, and not while a
//! resync's load is unfinished. A store opened to serve (a home store, or
//! a copy promoted by a failover) drops its copy position here: it
//! changes on its own from then on, and must never take a continued stream
//! as though it had not.

use crate::keys;
use crate::Server;
use madfs_kv::{KvStore, WriteBatch};

/// Step 2: the stream a clean stop left in `kv` (id, last record), taken
/// away; and any copy position, dropped (see the file header).
pub(crate) fn take_stopped_stream(kv: &dyn KvStore) -> madfs_kv::Result<Option<(u64, u64)>> {
    let stopped = kv.get(keys::META_STREAM_STOPPED)?.and_then(|v| {
        (v.len() == 16).then(|| {
            (
                u64::from_le_bytes(v[..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(v[8..].try_into().expect("8 bytes")),
            )
        })
    });
    let mut b = WriteBatch::new();
    for k in [
        keys::META_STREAM_STOPPED,
        keys::META_REPLICA_POSITION,
        keys::META_REPLICA_LOADING,
    ] {
        if kv.get(k)?.is_some() {
            b.delete(k);
        }
    }
    if !b.is_empty() {
        kv.write(b, true)?;
    }
    Ok(stopped)
}

/// Step 1, for a server this process served until its clean stop, after
/// the runtime has shut down. Whether the stream may be continued.
pub(crate) fn note_clean_stop(server: &Server) -> bool {
    let Some(r) = &server.replication else {
        return false;
    };
    let Some((stream, last)) = r.continuable() else {
        return false;
    };
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&stream.to_le_bytes());
    v[8..].copy_from_slice(&last.to_le_bytes());
    let mut b = WriteBatch::new();
    b.put(keys::META_STREAM_STOPPED, &v);
    if let Err(e) = server.unreplicated.write(b, true) {
        tracing::warn!("server {}: noting the clean stop: {e}", server.id);
        return false;
    }
    // A disk task the runtime's shutdown left running may have added a
    // record since: then the stream ends in something the marker does not
    // cover.
    if r.continuable() != Some((stream, last)) {
        let mut b = WriteBatch::new();
        b.delete(keys::META_STREAM_STOPPED);
        let _ = server.unreplicated.write(b, true);
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::MemStore;

    #[test]
    fn the_marker_is_taken_once_and_copy_positions_go_with_it() {
        let kv = MemStore::new();
        assert_eq!(take_stopped_stream(&kv).unwrap(), None);
        let mut b = WriteBatch::new();
        let mut v = 7u64.to_le_bytes().to_vec();
        v.extend_from_slice(&42u64.to_le_bytes());
        b.put(keys::META_STREAM_STOPPED, &v);
        b.put(keys::META_REPLICA_POSITION, &[1; 17]);
        b.put(keys::META_REPLICA_LOADING, &[]);
        b.put(b"other", b"kept");
        kv.write(b, false).unwrap();
        assert_eq!(take_stopped_stream(&kv).unwrap(), Some((7, 42)));
        assert_eq!(take_stopped_stream(&kv).unwrap(), None, "taken once");
        assert_eq!(kv.get(keys::META_REPLICA_POSITION).unwrap(), None);
        assert_eq!(kv.get(keys::META_REPLICA_LOADING).unwrap(), None);
        assert_eq!(kv.get(b"other").unwrap(), Some(b"kept".to_vec()));
    }
}
