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
use madfs_proto::message::WriteVerifier;

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

/// Whether `kv` was last served in a boot other than `boot` and not
/// stopped cleanly (`clean_stop`), so that a power loss (or a kernel
/// crash) may have taken writes that were never synced. A process that
/// died in the same boot lost nothing the kernel had taken. A store never
/// noted before (new, or from before this record) counts as not. Without
/// a boot id (no /proc), never. Otherwise `boot` is noted as the store's
/// (`note_boot`); a store after a power loss is noted only once it is
/// served after all, so that a kill before its hand-over, restarted in the
/// same boot, finds it held again.
///
/// A primary's copies acknowledged what it wrote before syncing it, so a
/// primary back from a power loss before any failover must not serve its
/// set from its own store: it hands the set to an in-sync copy first
/// (failover.rs `Router::new`, members.rs `hand_over_home`), and is
/// rebuilt from there like any returning server.
pub(crate) fn opened_after_power_loss(
    kv: &dyn KvStore,
    boot: Option<crate::replica::BootId>,
    clean_stop: bool,
) -> madfs_kv::Result<bool> {
    let Some(boot) = boot else {
        return Ok(false);
    };
    let last = kv.get(keys::META_SERVED_IN_BOOT)?;
    if last.as_deref() == Some(&boot[..]) {
        return Ok(false);
    }
    let lost = last.is_some() && !clean_stop;
    if !lost {
        note_boot(kv, boot)?;
    }
    Ok(lost)
}

/// The write verifier `kv` answers writes and fsyncs with
/// (`META_WRITE_VERIFIER`): the one it keeps, or a new one for a store
/// without (new, or from before the verifier).
///
/// Why: a store opened after a power loss serves again (with one copy,
/// there is nothing better), and without a verifier an fsync that reached
/// it would succeed although the writes it was to make durable were lost
/// with the page cache: a client holding a file open across the restart
/// would be told its data are safe. With one, the client sees that its
/// writes were answered by another incarnation of the store than its
/// fsync and fails the fsync (EIO) instead.
pub(crate) fn load_write_verifier(kv: &dyn KvStore) -> madfs_kv::Result<WriteVerifier> {
    match kv.get(keys::META_WRITE_VERIFIER)? {
        Some(v) if v.len() == 8 => Ok(WriteVerifier(u64::from_le_bytes(
            v[..].try_into().expect("8 bytes"),
        ))),
        _ => renew_write_verifier(kv),
    }
}

/// A new write verifier for `kv` (synced before anything is answered with
/// it): for a store that may have lost acknowledged writes it had not
/// synced (`opened_after_power_loss`), before it is served.
pub(crate) fn renew_write_verifier(kv: &dyn KvStore) -> madfs_kv::Result<WriteVerifier> {
    let old = kv.get(keys::META_WRITE_VERIFIER)?;
    let mut v = WriteVerifier(crate::replication::random_stream_id());
    while old.as_deref() == Some(&v.0.to_le_bytes()[..]) {
        v = WriteVerifier(crate::replication::random_stream_id());
    }
    let mut b = WriteBatch::new();
    b.put(keys::META_WRITE_VERIFIER, &v.0.to_le_bytes());
    kv.write(b, true)?;
    Ok(v)
}

/// Note `boot` as the one `kv` is served in (synced).
pub(crate) fn note_boot(kv: &dyn KvStore, boot: crate::replica::BootId) -> madfs_kv::Result<()> {
    let mut b = WriteBatch::new();
    b.put(keys::META_SERVED_IN_BOOT, &boot);
    kv.write(b, true)
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

    #[test]
    fn only_a_store_served_in_another_boot_and_not_stopped_cleanly_is_after_a_power_loss() {
        let kv = MemStore::new();
        let (a, b) = (Some([1u8; 16]), Some([2u8; 16]));
        assert!(
            !opened_after_power_loss(&kv, a, false).unwrap(),
            "new store"
        );
        assert!(
            !opened_after_power_loss(&kv, a, false).unwrap(),
            "same boot"
        );
        assert!(
            opened_after_power_loss(&kv, b, false).unwrap(),
            "another boot"
        );
        // Not noted until served: a kill before the hand-over, restarted
        // in the same boot, finds it held again.
        assert!(opened_after_power_loss(&kv, b, false).unwrap());
        note_boot(&kv, [2; 16]).unwrap();
        assert!(!opened_after_power_loss(&kv, b, false).unwrap());
        assert!(
            !opened_after_power_loss(&kv, a, true).unwrap(),
            "clean stop"
        );
        assert!(
            !opened_after_power_loss(&kv, a, false).unwrap(),
            "noted at the clean start"
        );
        assert!(
            !opened_after_power_loss(&kv, None, false).unwrap(),
            "no boot id"
        );
    }

    #[test]
    fn a_store_keeps_its_write_verifier_until_it_is_renewed() {
        let kv = MemStore::new();
        let first = load_write_verifier(&kv).unwrap();
        assert_eq!(load_write_verifier(&kv).unwrap(), first, "kept");
        let renewed = renew_write_verifier(&kv).unwrap();
        assert_ne!(renewed, first);
        assert_eq!(
            load_write_verifier(&kv).unwrap(),
            renewed,
            "the new one kept"
        );
        // A value that does not decode is replaced, not trusted.
        let mut b = WriteBatch::new();
        b.put(keys::META_WRITE_VERIFIER, b"bad");
        kv.write(b, false).unwrap();
        let replaced = load_write_verifier(&kv).unwrap();
        assert_ne!(replaced, renewed);
        assert_eq!(load_write_verifier(&kv).unwrap(), replaced);
    }
}
