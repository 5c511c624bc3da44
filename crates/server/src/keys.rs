//! Every RocksDB key this server writes, in one place. Each record type has
//! a four-byte prefix (as in 3FS); ids are big-endian so that a prefix scan
//! walks them in numeric order and a directory's entries sit together.
//!
//! ```text
//! INOD ino                      -> inode record (see inode.rs)
//! DATA ino                      -> inline bytes of chunk 0 (small files)
//! DENT parent name              -> dentry: kind u8, ino u64
//! ORPH ino                      -> freed inode whose chunk files still need purging
//! HELD ino                      -> unlinked inode kept for a client that has it open
//! RMDR dir                      -> directory removed here, not yet known gone everywhere
//! RNTX tx                       -> rename intent, on the coordinating server
//! RNDN coordinator tx           -> rename installed, on the destination server
//! DTCH dir sender               -> u64 last directory touch applied from that server
//! TOUT dir seq member           -> a change to another server's directory, not yet applied there
//! DONE time origin seq          -> the reply of a request that must run once (once.rs)
//! LDRP time origin seq          -> a link to drop on another server, not yet answered (link_drops.rs)
//! DPAR dir                      -> the directory's parent, on the directory's owner (dir_moves.rs)
//! DPPN dir                      -> a moved directory's parent to change on its owner: from, to
//! META "dir_move_lock"          -> who holds the cluster's directory-move lock (set 0 only)
//! META "next_inode"             -> u64 inode counter (a high-water mark)
//! META "next_tx"                -> u64 rename transaction counter (likewise)
//! META "next_touch"             -> u64 directory touch counter (likewise)
//! META "format"                 -> u32 on-disk format version
//! ```

use madfs_types::{FileName, InodeId, OpId, ServerId, TxId};

pub const INODE: &[u8; 4] = b"INOD";
pub const INLINE_DATA: &[u8; 4] = b"DATA";
pub const DENTRY: &[u8; 4] = b"DENT";
pub const ORPHAN: &[u8; 4] = b"ORPH";
/// An inode whose last link went while a client held it open (value: the
/// time it was held, seconds since the epoch, u64 LE); freed by that
/// client's Release, or at the owner's next start.
pub const HELD: &[u8; 4] = b"HELD";
/// A directory whose name this server removed, until every server heard
/// it is gone and its owner dropped it (`Server::finish_dir_removal`):
/// written with the removal, so a seal that lapsed is settled from it
/// (seals.rs), and what a crash cut short is finished at the next start.
pub const DIR_REMOVAL: &[u8; 4] = b"RMDR";
pub const RENAME_INTENT: &[u8; 4] = b"RNTX";
pub const RENAME_DONE: &[u8; 4] = b"RNDN";
pub const DIR_TOUCH: &[u8; 4] = b"DTCH";
/// On the sender: one operation's change to a directory another server
/// owns (time, link delta), written with the operation, deleted once the
/// touch that carries it (`seq`) is applied (touch_send.rs).
pub const TOUCH_INTENT: &[u8; 4] = b"TOUT";
/// A request that runs once (`OpId`, its sender's time first so that old
/// ones sort first and are swept by a scan from the start): its reply.
pub const DONE: &[u8; 4] = b"DONE";
/// A link this server asked another to drop (`AdjustLinks -1` of a name
/// removed here), keyed by the id the call runs under, until the owner
/// answered (link_drops.rs): written with the name's removal.
pub const LINK_DROP: &[u8; 4] = b"LDRP";
/// A directory's parent (ino, u64 BE), kept by the directory's owner so
/// that a move between parents can check it does not go below itself
/// (dir_moves.rs). Written with a mkdir, changed by every such move,
/// deleted with the directory; absent for directories made before.
pub const DIR_PARENT: &[u8; 4] = b"DPAR";
/// On the server that moved a directory it does not own: the parent
/// change its owner still has to make (from, to), written with the move.
pub const DIR_PARENT_PENDING: &[u8; 4] = b"DPPN";
/// On set 0's server: the holder of the cluster's directory-move lock
/// (server u16 LE, token u64 LE), while held.
pub const META_DIR_MOVE_LOCK: &[u8] = b"METAdir_move_lock";
pub const META_NEXT_INODE: &[u8] = b"METAnext_inode";
pub const META_NEXT_TX: &[u8] = b"METAnext_tx";
pub const META_NEXT_TOUCH: &[u8] = b"METAnext_touch";
pub const META_FORMAT: &[u8] = b"METAformat";
/// In a replica's copy of another server's set: the primary's stream id and
/// the last record applied (replica.rs), written with each metadata record.
pub const META_REPLICA_POSITION: &[u8] = b"METAreplica_position";
/// In a replica's copy: a resync's load began and has not ended (its
/// contents are partial until the load's closing sync); no numbered
/// record is taken then (replica.rs).
pub const META_REPLICA_LOADING: &[u8] = b"METAreplica_loading";
/// In a primary's store after a clean stop: its stream id and last record
/// (u64 LE each), continued at the next start (restart.rs).
pub const META_STREAM_STOPPED: &[u8] = b"METAstream_stopped";
/// In a store opened to serve: the kernel boot it was last served in
/// (16 bytes), to tell a start after a power loss, which may have lost
/// unsynced writes, from one after a process crash (restart.rs).
pub const META_SERVED_IN_BOOT: &[u8] = b"METAserved_in_boot";
/// In a primary's store while served: the copies its acknowledgements wait
/// for (u16 LE ids), rewritten synced before that list grows and before an
/// acknowledgement goes without a copy that left it. After a power loss,
/// the copies the held store may owe its lost writes to (members.rs
/// `hand_over`), even if the group took them out meanwhile.
pub const META_WAITED_COPIES: &[u8] = b"METAwaited_copies";
/// The store's write verifier (u64 LE; restart.rs `load_write_verifier`):
/// answered with every write and fsync, and new whenever the store may
/// have lost acknowledged writes it had not synced. Part of the set: a
/// resync's load copies it, so a copy that takes the set over answers
/// with the same one.
pub const META_WRITE_VERIFIER: &[u8] = b"METAwrite_verifier";
/// Bumped when a record layout changes; a server refuses a newer format.
pub const FORMAT_VERSION: u32 = 1;

fn with_ino(prefix: &[u8; 4], ino: InodeId) -> Vec<u8> {
    let mut k = Vec::with_capacity(12);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&ino.0.to_be_bytes());
    k
}

pub fn inode(ino: InodeId) -> Vec<u8> {
    with_ino(INODE, ino)
}

pub fn inline_data(ino: InodeId) -> Vec<u8> {
    with_ino(INLINE_DATA, ino)
}

pub fn orphan(ino: InodeId) -> Vec<u8> {
    with_ino(ORPHAN, ino)
}

pub fn held(ino: InodeId) -> Vec<u8> {
    with_ino(HELD, ino)
}

pub fn dir_removal(dir: InodeId) -> Vec<u8> {
    with_ino(DIR_REMOVAL, dir)
}

pub fn dir_parent(dir: InodeId) -> Vec<u8> {
    with_ino(DIR_PARENT, dir)
}

pub fn dir_parent_pending(dir: InodeId) -> Vec<u8> {
    with_ino(DIR_PARENT_PENDING, dir)
}

fn with_op_id(prefix: &[u8; 4], id: OpId) -> Vec<u8> {
    let mut k = Vec::with_capacity(20);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&id.time.to_be_bytes());
    k.extend_from_slice(&id.origin.to_be_bytes());
    k.extend_from_slice(&id.seq.to_be_bytes());
    k
}

pub fn done(id: OpId) -> Vec<u8> {
    with_op_id(DONE, id)
}

pub fn link_drop(id: OpId) -> Vec<u8> {
    with_op_id(LINK_DROP, id)
}

/// The id in a DONE or LDRP key of prefix `prefix`.
pub fn op_id_from_key(prefix: &[u8; 4], key: &[u8]) -> Option<OpId> {
    if key.len() != 20 || !key.starts_with(prefix) {
        return None;
    }
    Some(OpId {
        time: u32::from_be_bytes(key[4..8].try_into().ok()?),
        origin: u64::from_be_bytes(key[8..16].try_into().ok()?),
        seq: u32::from_be_bytes(key[16..20].try_into().ok()?),
    })
}

/// The first key of the requests made before `time` (seconds): the end
/// of what a sweep of older ones scans.
pub fn done_before(time: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(8);
    k.extend_from_slice(DONE);
    k.extend_from_slice(&time.to_be_bytes());
    k
}

/// Prefix of all dentries of one directory.
pub fn dentry_prefix(parent: InodeId) -> Vec<u8> {
    with_ino(DENTRY, parent)
}

pub fn dentry(parent: InodeId, name: &FileName) -> Vec<u8> {
    let mut k = dentry_prefix(parent);
    k.extend_from_slice(name.as_bytes());
    k
}

pub fn rename_intent(tx: TxId) -> Vec<u8> {
    let mut k = RENAME_INTENT.to_vec();
    k.extend_from_slice(&tx.0.to_be_bytes());
    k
}

pub fn rename_done(coordinator: ServerId, tx: TxId) -> Vec<u8> {
    let mut k = RENAME_DONE.to_vec();
    k.extend_from_slice(&coordinator.0.to_be_bytes());
    k.extend_from_slice(&tx.0.to_be_bytes());
    k
}

/// The last touch of directory `dir` applied from server `sender`
/// (touch.rs): a retried touch is applied once.
pub fn dir_touch(dir: InodeId, sender: ServerId) -> Vec<u8> {
    let mut k = with_ino(DIR_TOUCH, dir);
    k.extend_from_slice(&sender.0.to_be_bytes());
    k
}

/// The intent of member `member` of touch `seq` of directory `dir`
/// (touch_send.rs); a directory's intents sort by seq.
pub fn touch_intent(dir: InodeId, seq: u64, member: u32) -> Vec<u8> {
    let mut k = with_ino(TOUCH_INTENT, dir);
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&member.to_be_bytes());
    k
}

/// (dir, seq, member) from a TOUT key.
pub fn touch_intent_parts(key: &[u8]) -> Option<(InodeId, u64, u32)> {
    if key.len() != 24 || !key.starts_with(TOUCH_INTENT) {
        return None;
    }
    let dir = ino_from_key(key)?;
    let seq = u64::from_be_bytes(key[12..20].try_into().ok()?);
    let member = u32::from_be_bytes(key[20..24].try_into().ok()?);
    Some((dir, seq, member))
}

/// Inode id from an INOD/ORPH/HELD key.
pub fn ino_from_key(key: &[u8]) -> Option<InodeId> {
    let b: [u8; 8] = key.get(4..12)?.try_into().ok()?;
    Some(InodeId(u64::from_be_bytes(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dentries_of_a_directory_share_a_prefix_and_sort_by_name() {
        let p = InodeId(5);
        let a = dentry(p, &FileName::new(b"a").unwrap());
        let b = dentry(p, &FileName::new(b"b").unwrap());
        assert!(a.starts_with(&dentry_prefix(p)) && b.starts_with(&dentry_prefix(p)));
        assert!(a < b);
        // Another directory's entries never share the prefix.
        assert!(!dentry(InodeId(6), &FileName::new(b"a").unwrap()).starts_with(&dentry_prefix(p)));
        assert_eq!(ino_from_key(&inode(InodeId(77))), Some(InodeId(77)));
        let t = touch_intent(InodeId(9), 300, 2);
        assert_eq!(touch_intent_parts(&t), Some((InodeId(9), 300, 2)));
        assert!(touch_intent(InodeId(9), 2, 7) < t);
        assert_eq!(touch_intent_parts(&inode(InodeId(9))), None);
    }
}
