//! Request and reply messages: what each operation sends and gets back.
//!
//! A request body is the caller's credentials followed by the fields of one
//! `Op`; the opcode sits in the frame header. A successful reply body starts
//! with a one-byte reply tag, so replies decode without knowing the request.
//! Bulk data (Write requests, Read replies) never passes through here: it
//! travels as the frame's raw data section.

use crate::codec::{Decoder, Encoder};
use crate::error::ProtoError;
use crate::find::{self, FindDir, FindMatch, FindQuery};
use crate::frame::BODY_MAX_BYTES;
use madfs_types::{
    limits, Attr, ChunkIndex, Credentials, FileKind, FileName, InodeId, OpId, SealId, ServerId,
    TimeSet, Timestamp, TxId,
};

/// `renameat2` flags we support (same values as Linux).
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// Access bits for `Op::Access` (same values as access(2)).
pub const ACCESS_READ: u8 = madfs_types::access::READ;
pub const ACCESS_WRITE: u8 = madfs_types::access::WRITE;
pub const ACCESS_EXEC: u8 = madfs_types::access::EXEC;

/// Touch tokens a reply carries: one per remote parent directory (rename
/// changes two).
pub const TOUCH_TOKENS_PER_REPLY_MAX: usize = 2;
/// Touches one GetAttr may wait for: one per server that changed the
/// directory for this client (a client with more sends the first these).
pub const GETATTR_WAITS_MAX: usize = 1024;

/// A change to a directory's times or link count that its owner applies
/// after the operation replied (see touch.rs in the server): the dentry
/// server `sender` sends it as its touch number `seq` of `dir`. A client
/// that made the change passes (`sender`, `seq`) with its next GetAttr of
/// `dir`, and the owner answers once it applied that touch, so the client
/// sees its own change.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct TouchToken {
    pub dir: InodeId,
    pub sender: ServerId,
    pub seq: u64,
}

/// One touch a GetAttr waits for: (sender, seq) of a `TouchToken` of the
/// inode asked for.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct TouchWait {
    pub sender: ServerId,
    pub seq: u64,
}

/// Operation numbers on the wire. Never renumber; add at the end of a group.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u16)]
pub enum Opcode {
    // Handshake (see `auth`).
    Challenge = 1,
    Hello = 2,
    // Namespace and data, from clients.
    Lookup = 10,
    GetAttr = 11,
    SetAttr = 12,
    Create = 13,
    Remove = 14,
    Access = 15,
    Read = 16,
    Write = 17,
    UpdateSize = 18,
    Fsync = 19,
    ReadDir = 20,
    Rename = 21,
    Link = 22,
    ReadLink = 23,
    TruncateChunks = 24,
    StatFs = 25,
    Find = 26,
    Open = 27,
    Mknod = 28,
    Release = 29,
    GetRoutes = 30,
    FixDirLinks = 31,
    ListInodes = 32,
    FixFileLinks = 33,
    Adopt = 34,
    DropName = 35,
    RemakeDir = 36,
    // Between servers only (a client connection may not send these).
    Seal = 40,
    AdjustLinks = 41,
    RenameInstall = 42,
    RenameResolve = 43,
    PurgeChunks = 44,
    InvalidateDir = 45,
    TouchDir = 46,
    ReplicaApply = 47,
    Membership = 48,
    ChunkExtent = 49,
    ReplicaDigests = 50,
    ReportSeals = 51,
    ReplicaKeyRange = 52,
    DirMoveLock = 53,
    DirParent = 54,
    DirMoveSettled = 55,
}

impl Opcode {
    pub fn from_u16(v: u16) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            1 => Challenge,
            2 => Hello,
            10 => Lookup,
            11 => GetAttr,
            12 => SetAttr,
            13 => Create,
            14 => Remove,
            15 => Access,
            16 => Read,
            17 => Write,
            18 => UpdateSize,
            19 => Fsync,
            20 => ReadDir,
            21 => Rename,
            22 => Link,
            23 => ReadLink,
            24 => TruncateChunks,
            25 => StatFs,
            26 => Find,
            27 => Open,
            28 => Mknod,
            29 => Release,
            30 => GetRoutes,
            31 => FixDirLinks,
            32 => ListInodes,
            33 => FixFileLinks,
            34 => Adopt,
            35 => DropName,
            36 => RemakeDir,
            40 => Seal,
            41 => AdjustLinks,
            42 => RenameInstall,
            43 => RenameResolve,
            44 => PurgeChunks,
            45 => InvalidateDir,
            46 => TouchDir,
            47 => ReplicaApply,
            48 => Membership,
            49 => ChunkExtent,
            50 => ReplicaDigests,
            51 => ReportSeals,
            52 => ReplicaKeyRange,
            53 => DirMoveLock,
            54 => DirParent,
            55 => DirMoveSettled,
            _ => return None,
        })
    }

    /// Only servers may send these (checked against the connection's role).
    pub fn is_peer_only(self) -> bool {
        self as u16 >= 40
    }
}

/// What a setattr changes; `None`/`Omit` fields are left alone.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SetAttrs {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: TimeSet,
    pub mtime: TimeSet,
    /// The caller changes the size through a handle it opened for writing
    /// (ftruncate): the write permission was granted at open, so the
    /// owner does not check the mode again (a file created with mode 0
    /// stays writable through the descriptor that created it, as POSIX
    /// and Linux have it). The client asserts this; the servers already
    /// trust the credentials a client presents (AUTH_SYS-style), and an
    /// authenticated client could as well write the chunks (which are not
    /// checked), so this grants nothing new. Truncate by path sends false.
    pub via_writable_handle: bool,
}

impl Default for SetAttrs {
    fn default() -> Self {
        SetAttrs {
            perm: None,
            uid: None,
            gid: None,
            size: None,
            atime: TimeSet::Omit,
            mtime: TimeSet::Omit,
            via_writable_handle: false,
        }
    }
}

/// Inodes a request's sender holds open, sent with every removal of a
/// name (`Op::Remove`, the target of `Op::Rename`): when a removal takes
/// the last link of a regular file it covers, the owner keeps the inode
/// (link count 0, readable and writable by inode) until the client sends
/// `Op::Release`, as a local file system keeps an unlinked file open
/// until its last close. Only the client knows what it has open; the
/// servers keep no per-client state.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub enum Hold {
    /// The sender has no file open: nothing is held.
    #[default]
    Nothing,
    /// Exactly these (at most `HOLD_INODES_MAX`).
    Inodes(Vec<InodeId>),
    /// Any inode (the sender has more open than a list would carry).
    Any,
}

/// Longest list a `Hold` carries (8 bytes each); a client with more
/// inodes open sends `Hold::Any` and releases at once what it turns out
/// not to have open.
pub const HOLD_INODES_MAX: usize = 256;

impl Hold {
    /// Whether the last link of `ino` is to be held.
    pub fn covers(&self, ino: InodeId) -> bool {
        match self {
            Hold::Nothing => false,
            Hold::Inodes(list) => list.contains(&ino),
            Hold::Any => true,
        }
    }

    fn encode(&self, e: &mut Encoder) {
        match self {
            Hold::Nothing => e.u8(0),
            Hold::Inodes(list) => {
                e.u8(1);
                e.u16(list.len() as u16);
                for &ino in list {
                    e.ino(ino);
                }
            }
            Hold::Any => e.u8(2),
        }
    }

    fn decode(d: &mut Decoder<'_>) -> Result<Hold, ProtoError> {
        Ok(match d.u8()? {
            0 => Hold::Nothing,
            1 => {
                let n = d.u16()? as usize;
                let n = d.list_len(n, HOLD_INODES_MAX, 8, "hold list length")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push(d.ino()?);
                }
                Hold::Inodes(list)
            }
            2 => Hold::Any,
            _ => return Err(ProtoError::BadValue("hold")),
        })
    }
}

/// What a seal request does to a directory on one server (see rmdir in
/// docs/ARCHITECTURE.md).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum SealAction {
    /// Block new entries in the directory and report whether this server
    /// holds any.
    Seal = 1,
    /// The removal was abandoned: accept entries again.
    Unseal = 2,
    /// The directory is gone: refuse entries in it from now on.
    Removed = 3,
    /// Asked of the removed name's server by a server whose seal expired
    /// before it heard the outcome: did the removal happen? Answered with
    /// `RemovalSettled` once the set's replicas agree.
    Settle = 4,
}

/// Rmdir attempts that may hold one directory's seal at once.
pub const SEAL_HOLDERS_MAX: usize = 16;

/// ReplicaDigests: chunk files asked about in one request, at most.
pub const REPLICA_DIGESTS_MAX: usize = 4096;
/// Longest reason a rebuild's last attempt failed (`Rebuild::failure`);
/// longer ones are cut.
pub const REBUILD_FAILURE_MAX_BYTES: usize = 1024;

/// ReplicaKeyRange: the longest key a range may start after or end at
/// (store keys are a prefix, ids and at most a 255-byte name).
pub const REPLICA_KEY_MAX_BYTES: usize = 1024;

/// A chunk file as a copy holds it: its length and a 128-bit hash of its
/// bytes (the server's replication module picks the hash).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ChunkDigest {
    pub len: u64,
    pub hash: [u8; 16],
}

/// A store's write verifier: changes whenever the store may have lost
/// writes it acknowledged but had not synced (opened after a power loss,
/// or a new store in a replaced server's place). A client compares the
/// one its writes were answered with against the one its fsync is
/// answered with, as NFS's COMMIT verifier: another one means the writes
/// may be gone and the fsync fails (EIO) instead of promising them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct WriteVerifier(pub u64);

/// One rmdir attempt's seal, and how long its lease has left.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SealHolder {
    pub seal: SealId,
    pub left_ms: u32,
}

/// What one server holds for a directory (`Op::ReportSeals`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SealReport {
    Unsealed,
    /// Sealed by `holders`, the directory named `name` in `parent`.
    Sealed {
        parent: InodeId,
        name: FileName,
        holders: Vec<SealHolder>,
    },
    /// The server heard the directory is gone.
    Removed,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Op {
    /// Find `name` in `parent`. Sent to the name's dentry server.
    Lookup {
        parent: InodeId,
        name: FileName,
    },
    /// A lookup for open(2) of a file to read: `Lookup`, plus, when the
    /// dentry server owns the inode and it is a regular file of at most
    /// `data_max` bytes (capped at the inline limit) kept inline, all its
    /// bytes as bulk data, so that opening and reading a small file is one
    /// request. The reply is `Reply::Entry`; its data section holds exactly
    /// the file's size in bytes when they came along, nothing otherwise.
    Open {
        parent: InodeId,
        name: FileName,
        data_max: u32,
    },
    /// Sent to the inode's owner. With `after`, a directory's owner
    /// answers once it applied those touches (this client's own changes to
    /// the directory), or after at most 5 s.
    GetAttr {
        ino: InodeId,
        after: Vec<TouchWait>,
    },
    SetAttr {
        ino: InodeId,
        changes: SetAttrs,
    },
    /// Make a file, directory or symlink. Sent to the name's dentry server,
    /// which allocates the inode too. Non-exclusive create of an existing
    /// regular file returns that file (open with O_CREAT, no O_EXCL).
    /// An exclusive create of a regular file may carry its first bytes as
    /// bulk data (up to the inline limit): a small file then costs one
    /// request, as chunk 0 lives with the inode on the same server.
    Create {
        parent: InodeId,
        name: FileName,
        kind: FileKind,
        perm: u32,
        exclusive: bool,
        symlink_target: Vec<u8>,
    },
    /// mknod(2): make a FIFO, socket, character or block device node (or
    /// a regular file) that must not exist yet. Sent to the name's dentry
    /// server, which allocates the inode; replies `Reply::Created`.
    /// Devices only for root (Linux asks CAP_MKNOD); `rdev` is kept for
    /// devices only (see `Attr::rdev`).
    Mknod {
        parent: InodeId,
        name: FileName,
        kind: FileKind,
        perm: u32,
        rdev: u32,
    },
    /// unlink (`dir` false) or rmdir (`dir` true). Sent to the dentry server.
    /// The reply is `Reply::Removed`, whose `held` says the inode lost its
    /// last link but is kept for the sender (`hold`, see `Hold`).
    Remove {
        parent: InodeId,
        name: FileName,
        dir: bool,
        hold: Hold,
    },
    /// Check `mask` (ACCESS_* bits) against the inode; used by open and
    /// access(2). Sent to the owner; returns the attributes.
    Access {
        ino: InodeId,
        mask: u8,
    },
    /// Read up to `len` bytes of one chunk. Sent to the chunk's server.
    Read {
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        len: u32,
    },
    /// Write the frame's data into one chunk at `offset`. For chunk 0 (held
    /// by the owner) the file size grows to `file_size` in the same step.
    /// Replies `Reply::Written`.
    Write {
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        file_size: u64,
    },
    /// Grow the size to at least `size` and set mtime (close and fsync).
    /// Replies `Reply::SizeUpdated`.
    UpdateSize {
        ino: InodeId,
        size: u64,
        mtime: Timestamp,
    },
    /// Make everything this server acknowledged durable. Replies
    /// `Reply::Synced`.
    Fsync,
    /// One page of this server's entries of `dir`, names after `after`.
    ReadDir {
        dir: InodeId,
        after: Option<FileName>,
        max_entries: u32,
    },
    /// Sent to the dentry server of the source name, which coordinates.
    /// Replies `Reply::Empty`, or `Reply::Removed` with `held` when the
    /// replaced target lost its last link and is kept for the sender
    /// (`hold`, see `Hold`).
    Rename {
        src_parent: InodeId,
        src_name: FileName,
        dst_parent: InodeId,
        dst_name: FileName,
        flags: u32,
        hold: Hold,
    },
    /// A new name for an existing inode. Sent to the new name's server.
    Link {
        ino: InodeId,
        parent: InodeId,
        name: FileName,
    },
    ReadLink {
        ino: InodeId,
    },
    /// Drop chunk data at and beyond `size` that this server holds.
    TruncateChunks {
        ino: InodeId,
        size: u64,
    },
    StatFs,
    /// The sender's last handle of `ino`, an inode held for it at its last
    /// unlink (`Hold`), is closed: free it and its chunks. Sent to the
    /// owner; nothing happens to an inode that is not held (released
    /// already, freed by a restart of its owner, or linked).
    Release {
        ino: InodeId,
    },
    /// `madfs fsck --repair`: set directory `dir`'s link count to `want`
    /// if it is still `seen` (the count its check found wrong). Sent to
    /// the directory's owner; root only.
    FixDirLinks {
        dir: InodeId,
        seen: u32,
        want: u32,
    },
    /// `madfs fsck`: a page of the inodes this server owns that have
    /// links, in id order, after `after`. Root only.
    ListInodes {
        after: Option<InodeId>,
        max_entries: u32,
    },
    /// `madfs fsck --repair`: set the link count of `ino` (not a
    /// directory) to `want`, the names the check found, if it is still
    /// `seen`; `want` 0 frees it (a leaked inode, or an empty directory no
    /// name reaches). Sent to the owner; root only.
    FixFileLinks {
        ino: InodeId,
        seen: u32,
        want: u32,
    },
    /// `madfs fsck --repair`: give inode `ino`, which no name reaches,
    /// the name `name` in `into` (the lost+found). Anything but a
    /// directory must still have the link count `seen` the check saw, and
    /// then has 1. Sent to the owner of `ino`, which must hold that name
    /// too; root only.
    Adopt {
        ino: InodeId,
        into: InodeId,
        name: FileName,
        seen: u32,
    },
    /// `madfs fsck --repair`: remove `name` in `parent` if it still names
    /// `ino` and `ino` does not exist (a name whose inode a lost write
    /// took). Sent to the name's server; root only.
    DropName {
        parent: InodeId,
        name: FileName,
        ino: InodeId,
    },
    /// `madfs fsck --repair`: make directory `dir` again, empty of its
    /// own, with mode 0700, owner root and link count `nlink` (2 plus
    /// the subdirectories found in it), as a child of `parent` (ignored
    /// for the root): names are in it on some servers, and its inode is
    /// gone. Sent to the owner of `dir`; root only.
    RemakeDir {
        dir: InodeId,
        parent: InodeId,
        nlink: u32,
    },
    /// One page of this server's whole shard of dentries, in key order,
    /// after `after` (see find.rs): every directory, and every entry that
    /// passes `query` (or needs its remote inode checked).
    Find {
        query: FindQuery,
        after: Option<(InodeId, FileName)>,
        max_entries: u32,
    },
    /// `dir` is being removed as `name` in `parent` (the name's server
    /// settles a seal that expired: `SealAction::Settle`).
    /// `seal` names the rmdir's attempt (`SealId`).
    Seal {
        dir: InodeId,
        parent: InodeId,
        name: FileName,
        action: SealAction,
        seal: SealId,
    },
    /// `hold`: the removal's sender holds the inode open (`Hold`).
    AdjustLinks {
        ino: InodeId,
        delta: i32,
        hold: bool,
    },
    /// Phase 2 of a cross-server rename: write the new dentry.
    RenameInstall {
        tx: TxId,
        coordinator: ServerId,
        dst_parent: InodeId,
        dst_name: FileName,
        ino: InodeId,
        kind: FileKind,
        noreplace: bool,
        hold: Hold,
    },
    /// Ask whether `tx` was installed; `forget` drops its record.
    RenameResolve {
        tx: TxId,
        coordinator: ServerId,
        forget: bool,
    },
    /// The cluster's one lock on moves of directories between parents,
    /// kept by the server of set 0 (the server's dir_moves.rs): take it
    /// for `holder`'s move `token` (waiting a moment if another holds it;
    /// TryAgain after that), or with `release`, let it go. Answered with
    /// `Empty`.
    DirMoveLock {
        holder: ServerId,
        token: u64,
        release: bool,
    },
    /// Ask `ino`'s owner for the directory's parent; with `change =
    /// (from, to)`, first set it to `to` if it is `from` (or unknown).
    /// Answered with `DirParent`.
    DirParent {
        ino: InodeId,
        change: Option<(InodeId, InodeId)>,
    },
    /// From set 0's server to the server of the set whose move `token`
    /// held the directory-move lock past its lease: has that move left
    /// nothing to settle (no move under way with that token, no rename
    /// of a directory between parents still open, no parent change still
    /// to send)? `Empty` if so, TryAgain if not.
    DirMoveSettled {
        token: u64,
    },
    PurgeChunks {
        ino: InodeId,
    },
    InvalidateDir {
        dir: InodeId,
    },
    /// Entries of `dir` were created, removed or renamed by the dentry
    /// server `sender` (see touch.rs in the server): set its mtime and ctime
    /// to at least `time` and add `nlink_delta` (subdirectories made minus
    /// removed) to its link count. Sent to the directory's owner, which
    /// applies each (`sender`, `seq`) at most once, so a retry is harmless.
    TouchDir {
        dir: InodeId,
        sender: ServerId,
        seq: u64,
        time: Timestamp,
        nlink_delta: i32,
    },
    /// Which server serves each replica set now (after failovers), as
    /// far as the server asked knows.
    GetRoutes,
    /// A message of the membership group (Raft and leases, crates/
    /// membership), opaque here; answered with `Reply::Membership`.
    Membership {
        msg: Vec<u8>,
    },
    /// How far `ino`'s chunk data on the server reaches, over its chunks
    /// `first` to `last`: answered with `Reply::Extent`. The owner asks
    /// before it takes a size a handle publishes, as that size may be from
    /// before another client's truncate (server ops/data.rs).
    ChunkExtent {
        ino: InodeId,
        first: ChunkIndex,
        last: ChunkIndex,
    },
    /// Records `first_seq`, `first_seq + 1`, ... of the primary's stream
    /// `stream` for replica set `set`, to apply in order: `heads` describes
    /// each record (the server's replication module defines its layout),
    /// and the frame's data holds their payloads back to back.
    ReplicaApply {
        set: ServerId,
        stream: u64,
        first_seq: u64,
        heads: Vec<u8>,
    },
    /// A resync's question to a replica (see the server's replication
    /// module): how its copy of set `set`, following `stream`, holds each
    /// of these chunk files, so that the load sends only those that differ.
    ReplicaDigests {
        set: ServerId,
        stream: u64,
        chunks: Vec<(InodeId, ChunkIndex)>,
    },
    /// A resync's question to a replica about its copy's metadata: do its
    /// keys after `after` (from the first, if None) up to `upto`
    /// (inclusive; to the last, if None) hash to `digest`, the primary's
    /// for the same range? If not, the copy drops them (the load sends the
    /// primary's next). Answered with `KeyRangeSame`.
    ReplicaKeyRange {
        set: ServerId,
        stream: u64,
        after: Option<Vec<u8>>,
        upto: Option<Vec<u8>>,
        digest: [u8; 16],
    },
    /// Asked of every server by one that started (or took a set over)
    /// less than a seal's lease ago, the first time an entry goes into
    /// `dir`: which seals of it do you hold? (Seals live in memory; the
    /// others still hold those taken before this one started.) Answered
    /// with `SealReport`.
    ReportSeals {
        dir: InodeId,
    },
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Request {
    pub creds: Credentials,
    pub op: Op,
    /// For a request that must run once (`Op::runs_once`): its id, the
    /// same each time it is sent, so that a server that has its result
    /// answers a retry with it instead of running it again.
    pub once: Option<RunOnce>,
}

/// The id of a request that must run once, and whether this is a resend.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RunOnce {
    pub id: OpId,
    /// Sent again (by a pool, after a failover or a lost reply): only then
    /// may the server have run it, so only then does it look the id up
    /// (a lookup is a RocksDB get, 5% of a server's CPU in a create run).
    pub resent: bool,
}

impl RunOnce {
    /// A first send of request `id`.
    pub fn first(id: OpId) -> RunOnce {
        RunOnce { id, resent: false }
    }
}

impl Request {
    /// This request as a pool sends it again: marked as a resend if it
    /// has an id.
    pub fn resent(&self) -> Request {
        let mut again = self.clone();
        if let Some(o) = &mut again.once {
            o.resent = true;
        }
        again
    }

    /// `op` with `creds`, and no id.
    pub fn new(creds: Credentials, op: Op) -> Request {
        Request {
            creds,
            op,
            once: None,
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    pub ino: InodeId,
    pub kind: FileKind,
    /// Present when the dentry server also owns the inode.
    pub attr: Option<Attr>,
}

/// An inode's id, kind and link count (`Reply::InodePage`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InodeLinks {
    pub ino: InodeId,
    pub kind: FileKind,
    pub nlink: u32,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DirEntry {
    pub name: FileName,
    pub ino: InodeId,
    pub kind: FileKind,
}

#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FsStats {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub bytes_avail: u64,
    /// Inodes whose records this server holds.
    pub inodes: u64,
    /// Bytes of file data this server stores (chunk files and inline).
    pub data_bytes: u64,
    /// Why this server refuses writes and syncs until it is restarted
    /// (its store was poisoned by a failed fsync); None while it is well.
    pub failure: Option<String>,
    /// The copies of this set being rebuilt on other servers (with
    /// replicas: a returning or replacement server catching up).
    pub rebuilds: Vec<Rebuild>,
    /// Which file system the byte counts are of (its host's boot and the
    /// file system's id, hashed; 0: not known): servers on one disk give
    /// the same, and it is counted once (`FsStats::usable`).
    pub disk: u64,
    /// Of `bytes_avail`, what the server keeps back from growth (its
    /// reserve: removals and RocksDB's own writes).
    pub bytes_reserved: u64,
    /// How many copies the cluster keeps of every byte (its `replicas`).
    pub copies: u8,
}

impl FsStats {
    /// What the file system holds and has room for, from each set's
    /// statistics (`per_set`, in set order), as `statfs(2)` should say it:
    /// a disk that several servers share counts once, every byte written
    /// takes `copies` bytes, and writes spread evenly over the sets fill
    /// the disk that takes the largest share of them first. So the room
    /// is each disk's room above its reserve, over the share of the data
    /// it takes (its sets' placements: each set's own data and its
    /// copies, `copies` per set), at the most crowded disk.
    pub fn usable(per_set: &[FsStats]) -> FsStats {
        let n = per_set.len() as u64;
        let copies = per_set.iter().map(|s| s.copies).max().unwrap_or(1).max(1) as u64;
        // Disks (0: one of its own per set), and the sets on each.
        let mut disks: Vec<(u64, u64, &FsStats)> = Vec::new();
        for (i, s) in per_set.iter().enumerate() {
            let id = if s.disk == 0 {
                u64::MAX - i as u64
            } else {
                s.disk
            };
            match disks.iter_mut().find(|(d, _, _)| *d == id) {
                Some((_, k, _)) => *k += 1,
                None => disks.push((id, 1, s)),
            }
        }
        let room = |of: fn(&FsStats) -> u64| {
            disks
                .iter()
                .map(|&(_, k, s)| (of(s) as u128 * n as u128 / (k * copies) as u128) as u64)
                .min()
                .unwrap_or(0)
        };
        let total = disks.iter().map(|(_, _, s)| s.bytes_total).sum::<u64>() / copies;
        FsStats {
            bytes_total: total,
            bytes_free: room(|s| s.bytes_free).min(total),
            bytes_avail: room(|s| s.bytes_avail.saturating_sub(s.bytes_reserved)).min(total),
            inodes: per_set.iter().map(|s| s.inodes).sum(),
            data_bytes: per_set.iter().map(|s| s.data_bytes).sum(),
            failure: per_set.iter().find_map(|s| s.failure.clone()),
            rebuilds: Vec::new(),
            disk: 0,
            bytes_reserved: 0,
            copies: copies as u8,
        }
    }
}

/// A copy of one replica set being rebuilt on `replica`, as its primary
/// sees it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rebuild {
    pub replica: ServerId,
    /// Which step the rebuild is at (see `RebuildPhase`).
    pub phase: RebuildPhase,
    /// Metadata records compared so far, and of those, records in ranges
    /// the replica already held as they are (compared by digest), not sent.
    pub keys: u64,
    pub keys_kept: u64,
    /// Chunk bytes copied so far, and in all (as listed at the start).
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Of `bytes_done`, the bytes the replica already held as they are
    /// (compared by digest) and that were not sent.
    pub bytes_kept: u64,
    /// Why the last attempt failed (empty: none failed), shown while the
    /// rebuild waits to try again (`RebuildPhase::Waiting`).
    pub failure: String,
}

/// The steps of a rebuild, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum RebuildPhase {
    /// Resetting the replica's copy (kept, to compare).
    #[default]
    Starting = 0,
    /// Comparing the metadata, range by range, sending what differs.
    Keys = 1,
    /// Comparing the chunk files, sending those that differ.
    Chunks = 2,
    /// Shipping the records written since the rebuild started.
    CatchingUp = 3,
    /// An attempt failed (a full disk on the replica, a refusal, a
    /// connection lost); the next starts after a pause.
    Waiting = 4,
}

impl RebuildPhase {
    fn from_u8(v: u8) -> Option<RebuildPhase> {
        Some(match v {
            0 => RebuildPhase::Starting,
            1 => RebuildPhase::Keys,
            2 => RebuildPhase::Chunks,
            3 => RebuildPhase::CatchingUp,
            4 => RebuildPhase::Waiting,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            RebuildPhase::Starting => "starting",
            RebuildPhase::Keys => "comparing and copying metadata",
            RebuildPhase::Chunks => "comparing and copying chunk data",
            RebuildPhase::CatchingUp => "applying the changes since",
            RebuildPhase::Waiting => "waiting to try again",
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Reply {
    Empty,
    Entry(Entry),
    Created {
        entry: Entry,
        created: bool,
        /// The parent's touch, when it lives on another server.
        touched: Vec<TouchToken>,
        /// The answering store's write verifier: a whole-server fsync
        /// answered with another one means the change may be lost.
        verifier: WriteVerifier,
    },
    Attr(Attr),
    Removed {
        ino: InodeId,
        kind: FileKind,
        /// The inode lost its last link and is kept until the sender's
        /// `Op::Release` (see `Hold`).
        held: bool,
        touched: Vec<TouchToken>,
        verifier: WriteVerifier,
    },
    DirPage {
        entries: Vec<DirEntry>,
        more: bool,
    },
    /// Read: the bytes are the frame's data section.
    Data,
    Target(Vec<u8>),
    FsStats(FsStats),
    Sealed {
        empty: bool,
    },
    /// SealAction::Settle: whether the directory's removal happened.
    RemovalSettled {
        removed: bool,
    },
    /// ReportSeals.
    SealReport(SealReport),
    Links {
        nlink: u32,
    },
    /// ReplicaApply: the replica has applied its stream up to `applied`.
    ReplicaAck {
        applied: u64,
    },
    /// ReplicaKeyRange: whether the copy held the range as the primary
    /// does (if not, it dropped it).
    KeyRangeSame {
        same: bool,
    },
    /// ListInodes: inodes with links, in id order; `more`: the page was
    /// cut at its length. `pending` (first page only): link drops and
    /// renames the server has still to finish, which change link counts
    /// when done.
    InodePage {
        inodes: Vec<InodeLinks>,
        more: bool,
        pending: u64,
    },
    /// DirParent: the directory's parent as its owner records it (None:
    /// not recorded, a directory made before parents were kept, or gone).
    DirParent {
        parent: Option<InodeId>,
    },
    /// ReplicaDigests: for each chunk file asked about, in order, how the
    /// copy holds it (None: it holds no such file).
    ChunkDigests {
        digests: Vec<Option<ChunkDigest>>,
    },
    /// Membership: the group's answer, opaque here.
    Membership {
        msg: Vec<u8>,
    },
    /// Write: done, in the store `verifier` names.
    Written {
        verifier: WriteVerifier,
    },
    /// Fsync: everything acknowledged before is durable, in the store
    /// `verifier` names.
    Synced {
        verifier: WriteVerifier,
    },
    /// UpdateSize: the attributes after it, in the store `verifier` names.
    SizeUpdated {
        attr: Attr,
        verifier: WriteVerifier,
    },
    /// ChunkExtent: the file offset just past the last byte of chunk data
    /// the server holds (0: none).
    Extent {
        end: u64,
    },
    /// GetRoutes: `serving[s]` serves replica set s, as of map `epoch`,
    /// and `in_sync[s]` servers keep it in sync (empty: not known);
    /// `addresses` are where servers moved (replacements on other hosts),
    /// overriding the cluster file; `voters` are the membership group's
    /// voters as the answering server knows them (empty: no group);
    /// `lost` are the sets none of whose in-sync copies answers the
    /// group's leader, each with how long in milliseconds (told only by a
    /// server holding a lease: its view is current).
    Routes {
        epoch: u64,
        serving: Vec<ServerId>,
        in_sync: Vec<u8>,
        addresses: Vec<(ServerId, std::net::SocketAddr)>,
        voters: Vec<ServerId>,
        lost: Vec<(ServerId, u64)>,
    },
    Installed {
        replaced: Option<(InodeId, FileKind)>,
        /// The replaced inode lost its last link and is held (`Hold`).
        held: bool,
    },
    Resolved {
        installed: bool,
    },
    /// Link: the new name's entry and the parent's touch.
    Linked {
        entry: Entry,
        touched: Vec<TouchToken>,
        verifier: WriteVerifier,
    },
    /// Rename: the touches of the parents on other servers.
    Renamed {
        touched: Vec<TouchToken>,
        verifier: WriteVerifier,
    },
    FindPage {
        dirs: Vec<FindDir>,
        matches: Vec<FindMatch>,
        /// Passed the name and kind tests; the inode lives elsewhere.
        unresolved: Vec<FindMatch>,
        /// Where the next page starts (after this key); None when done.
        resume: Option<(InodeId, FileName)>,
        /// Dentries this page examined (the whole shard's, in key order,
        /// not only those below the find's root).
        scanned: u64,
    },
}

impl Op {
    /// Sent by a set's primary to a server holding a copy of it (a
    /// resync's records and questions): handled by the process whatever
    /// set its connection named, and never waited on for replicas.
    pub fn for_a_copy(&self) -> bool {
        matches!(
            self,
            Op::ReplicaApply { .. } | Op::ReplicaDigests { .. } | Op::ReplicaKeyRange { .. }
        )
    }

    /// Whether running it twice may do what running it once does not: a
    /// create or mkdir after another client removed the first's result,
    /// an unlink, rmdir or rename after the name changed meanwhile, a
    /// link, a link count adjusted twice. Sent with an `OpId`, these run
    /// once whatever retries a failover makes (server once.rs).
    pub fn runs_once(&self) -> bool {
        match self {
            Op::Create { .. }
            | Op::Mknod { .. }
            | Op::Remove { .. }
            | Op::Rename { .. }
            | Op::Link { .. } => true,
            Op::AdjustLinks { delta, .. } => *delta != 0,
            _ => false,
        }
    }

    pub fn opcode(&self) -> Opcode {
        match self {
            Op::Lookup { .. } => Opcode::Lookup,
            Op::Open { .. } => Opcode::Open,
            Op::GetAttr { .. } => Opcode::GetAttr,
            Op::SetAttr { .. } => Opcode::SetAttr,
            Op::Create { .. } => Opcode::Create,
            Op::Mknod { .. } => Opcode::Mknod,
            Op::Remove { .. } => Opcode::Remove,
            Op::Access { .. } => Opcode::Access,
            Op::Read { .. } => Opcode::Read,
            Op::Write { .. } => Opcode::Write,
            Op::UpdateSize { .. } => Opcode::UpdateSize,
            Op::Fsync => Opcode::Fsync,
            Op::ReadDir { .. } => Opcode::ReadDir,
            Op::Rename { .. } => Opcode::Rename,
            Op::Link { .. } => Opcode::Link,
            Op::ReadLink { .. } => Opcode::ReadLink,
            Op::TruncateChunks { .. } => Opcode::TruncateChunks,
            Op::StatFs => Opcode::StatFs,
            Op::Release { .. } => Opcode::Release,
            Op::FixDirLinks { .. } => Opcode::FixDirLinks,
            Op::ListInodes { .. } => Opcode::ListInodes,
            Op::FixFileLinks { .. } => Opcode::FixFileLinks,
            Op::Adopt { .. } => Opcode::Adopt,
            Op::DropName { .. } => Opcode::DropName,
            Op::RemakeDir { .. } => Opcode::RemakeDir,
            Op::Find { .. } => Opcode::Find,
            Op::Seal { .. } => Opcode::Seal,
            Op::AdjustLinks { .. } => Opcode::AdjustLinks,
            Op::RenameInstall { .. } => Opcode::RenameInstall,
            Op::RenameResolve { .. } => Opcode::RenameResolve,
            Op::DirMoveLock { .. } => Opcode::DirMoveLock,
            Op::DirParent { .. } => Opcode::DirParent,
            Op::DirMoveSettled { .. } => Opcode::DirMoveSettled,
            Op::PurgeChunks { .. } => Opcode::PurgeChunks,
            Op::InvalidateDir { .. } => Opcode::InvalidateDir,
            Op::TouchDir { .. } => Opcode::TouchDir,
            Op::ReplicaApply { .. } => Opcode::ReplicaApply,
            Op::GetRoutes => Opcode::GetRoutes,
            Op::Membership { .. } => Opcode::Membership,
            Op::ChunkExtent { .. } => Opcode::ChunkExtent,
            Op::ReplicaDigests { .. } => Opcode::ReplicaDigests,
            Op::ReportSeals { .. } => Opcode::ReportSeals,
            Op::ReplicaKeyRange { .. } => Opcode::ReplicaKeyRange,
        }
    }

    /// Whether a request with this opcode may carry bulk data.
    pub fn carries_data(opcode: Opcode) -> bool {
        opcode == Opcode::Write || opcode == Opcode::Create || opcode == Opcode::ReplicaApply
    }

    /// Whether a reply to this opcode may carry bulk data.
    pub fn replies_with_data(opcode: Opcode) -> bool {
        opcode == Opcode::Read || opcode == Opcode::Open
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.creds(&self.creds);
        match &self.once {
            None => e.u8(0),
            Some(RunOnce { id, resent }) => {
                e.u8(if *resent { 2 } else { 1 });
                e.u32(id.time);
                e.u64(id.origin);
                e.u32(id.seq);
            }
        }
        match &self.op {
            Op::Lookup { parent, name } => {
                e.ino(*parent);
                e.name(name);
            }
            Op::Open {
                parent,
                name,
                data_max,
            } => {
                e.ino(*parent);
                e.name(name);
                e.u32(*data_max);
            }
            Op::GetAttr { ino, after } => {
                e.ino(*ino);
                e.u16(after.len() as u16);
                for w in after {
                    e.u16(w.sender.0);
                    e.u64(w.seq);
                }
            }
            Op::ReadLink { ino } | Op::PurgeChunks { ino } | Op::Release { ino } => e.ino(*ino),
            Op::InvalidateDir { dir } => e.ino(*dir),
            Op::SetAttr { ino, changes } => {
                e.ino(*ino);
                e.opt_u32(changes.perm);
                e.opt_u32(changes.uid);
                e.opt_u32(changes.gid);
                e.opt_u64(changes.size);
                e.time_set(changes.atime);
                e.time_set(changes.mtime);
                e.bool(changes.via_writable_handle);
            }
            Op::Create {
                parent,
                name,
                kind,
                perm,
                exclusive,
                symlink_target,
            } => {
                e.ino(*parent);
                e.name(name);
                e.kind(*kind);
                e.u32(*perm);
                e.bool(*exclusive);
                e.bytes16(symlink_target);
            }
            Op::Mknod {
                parent,
                name,
                kind,
                perm,
                rdev,
            } => {
                e.ino(*parent);
                e.name(name);
                e.kind(*kind);
                e.u32(*perm);
                e.u32(*rdev);
            }
            Op::Remove {
                parent,
                name,
                dir,
                hold,
            } => {
                e.ino(*parent);
                e.name(name);
                e.bool(*dir);
                hold.encode(&mut e);
            }
            Op::Access { ino, mask } => {
                e.ino(*ino);
                e.u8(*mask);
            }
            Op::Read {
                ino,
                chunk,
                offset,
                len,
            } => {
                e.ino(*ino);
                e.u32(chunk.0);
                e.u32(*offset);
                e.u32(*len);
            }
            Op::Write {
                ino,
                chunk,
                offset,
                file_size,
            } => {
                e.ino(*ino);
                e.u32(chunk.0);
                e.u32(*offset);
                e.u64(*file_size);
            }
            Op::UpdateSize { ino, size, mtime } => {
                e.ino(*ino);
                e.u64(*size);
                e.ts(*mtime);
            }
            Op::Fsync | Op::StatFs | Op::GetRoutes => {}
            Op::ReadDir {
                dir,
                after,
                max_entries,
            } => {
                e.ino(*dir);
                match after {
                    None => e.u8(0),
                    Some(n) => e.name(n),
                }
                e.u32(*max_entries);
            }
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                flags,
                hold,
            } => {
                e.ino(*src_parent);
                e.name(src_name);
                e.ino(*dst_parent);
                e.name(dst_name);
                e.u32(*flags);
                hold.encode(&mut e);
            }
            Op::Link { ino, parent, name } => {
                e.ino(*ino);
                e.ino(*parent);
                e.name(name);
            }
            Op::TruncateChunks { ino, size } => {
                e.ino(*ino);
                e.u64(*size);
            }
            Op::Seal {
                dir,
                parent,
                name,
                action,
                seal,
            } => {
                e.ino(*dir);
                e.ino(*parent);
                e.name(name);
                e.u8(*action as u8);
                e.u64(seal.0);
            }
            Op::AdjustLinks { ino, delta, hold } => {
                e.ino(*ino);
                e.i32(*delta);
                e.bool(*hold);
            }
            Op::TouchDir {
                dir,
                sender,
                seq,
                time,
                nlink_delta,
            } => {
                e.ino(*dir);
                e.u16(sender.0);
                e.u64(*seq);
                e.ts(*time);
                e.i32(*nlink_delta);
            }
            Op::Membership { msg } => {
                e.u32(msg.len() as u32);
                e.raw(msg);
            }
            Op::ChunkExtent { ino, first, last } => {
                e.ino(*ino);
                e.u32(first.0);
                e.u32(last.0);
            }
            Op::ReplicaApply {
                set,
                stream,
                first_seq,
                heads,
            } => {
                e.u16(set.0);
                e.u64(*stream);
                e.u64(*first_seq);
                e.u32(heads.len() as u32);
                e.raw(heads);
            }
            Op::ReplicaDigests {
                set,
                stream,
                chunks,
            } => {
                debug_assert!(chunks.len() <= REPLICA_DIGESTS_MAX);
                e.u16(set.0);
                e.u64(*stream);
                e.u16(chunks.len() as u16);
                for (ino, index) in chunks {
                    e.ino(*ino);
                    e.u32(index.0);
                }
            }
            Op::ReplicaKeyRange {
                set,
                stream,
                after,
                upto,
                digest,
            } => {
                e.u16(set.0);
                e.u64(*stream);
                for k in [after, upto] {
                    debug_assert!(k.as_ref().is_none_or(|k| k.len() <= REPLICA_KEY_MAX_BYTES));
                    e.bool(k.is_some());
                    e.bytes16(k.as_deref().unwrap_or_default());
                }
                e.raw(digest);
            }
            Op::ReportSeals { dir } => {
                e.ino(*dir);
            }
            Op::RenameInstall {
                tx,
                coordinator,
                dst_parent,
                dst_name,
                ino,
                kind,
                noreplace,
                hold,
            } => {
                e.u64(tx.0);
                e.u16(coordinator.0);
                e.ino(*dst_parent);
                e.name(dst_name);
                e.ino(*ino);
                e.kind(*kind);
                e.bool(*noreplace);
                hold.encode(&mut e);
            }
            Op::RenameResolve {
                tx,
                coordinator,
                forget,
            } => {
                e.u64(tx.0);
                e.u16(coordinator.0);
                e.bool(*forget);
            }
            Op::DirMoveLock {
                holder,
                token,
                release,
            } => {
                e.u16(holder.0);
                e.u64(*token);
                e.bool(*release);
            }
            Op::DirParent { ino, change } => {
                e.ino(*ino);
                e.bool(change.is_some());
                if let Some((from, to)) = change {
                    e.ino(*from);
                    e.ino(*to);
                }
            }
            Op::DirMoveSettled { token } => e.u64(*token),
            Op::FixDirLinks { dir, seen, want } => {
                e.ino(*dir);
                e.u32(*seen);
                e.u32(*want);
            }
            Op::ListInodes { after, max_entries } => {
                e.bool(after.is_some());
                if let Some(a) = after {
                    e.ino(*a);
                }
                e.u32(*max_entries);
            }
            Op::FixFileLinks { ino, seen, want } => {
                e.ino(*ino);
                e.u32(*seen);
                e.u32(*want);
            }
            Op::Adopt {
                ino,
                into,
                name,
                seen,
            } => {
                e.ino(*ino);
                e.ino(*into);
                e.name(name);
                e.u32(*seen);
            }
            Op::DropName { parent, name, ino } => {
                e.ino(*parent);
                e.name(name);
                e.ino(*ino);
            }
            Op::RemakeDir { dir, parent, nlink } => {
                e.ino(*dir);
                e.ino(*parent);
                e.u32(*nlink);
            }
            Op::Find {
                query,
                after,
                max_entries,
            } => {
                query.encode(&mut e);
                match after {
                    None => e.u8(0),
                    Some((p, n)) => {
                        e.u8(1);
                        e.ino(*p);
                        e.name(n);
                    }
                }
                e.u32(*max_entries);
            }
        }
        e.into_bytes()
    }

    pub fn decode(opcode: u16, body: &[u8]) -> Result<Request, ProtoError> {
        let code = Opcode::from_u16(opcode).ok_or(ProtoError::UnknownOpcode(opcode))?;
        let mut d = Decoder::new(body);
        let creds = d.creds()?;
        let once = match d.u8()? {
            0 => None,
            flag @ (1 | 2) => Some(RunOnce {
                id: OpId {
                    time: d.u32()?,
                    origin: d.u64()?,
                    seq: d.u32()?,
                },
                resent: flag == 2,
            }),
            _ => return Err(ProtoError::BadValue("request id flag")),
        };
        let op = match code {
            Opcode::Challenge | Opcode::Hello => return Err(ProtoError::UnknownOpcode(opcode)),
            Opcode::Lookup => Op::Lookup {
                parent: d.ino()?,
                name: d.name()?,
            },
            Opcode::Open => Op::Open {
                parent: d.ino()?,
                name: d.name()?,
                data_max: d.u32()?,
            },
            Opcode::GetAttr => {
                let ino = d.ino()?;
                let n = d.u16()? as usize;
                let n = d.list_len(n, GETATTR_WAITS_MAX, 10, "touches to wait for")?;
                let mut after = Vec::with_capacity(n);
                for _ in 0..n {
                    after.push(TouchWait {
                        sender: ServerId(d.u16()?),
                        seq: d.u64()?,
                    });
                }
                Op::GetAttr { ino, after }
            }
            Opcode::ReadLink => Op::ReadLink { ino: d.ino()? },
            Opcode::PurgeChunks => Op::PurgeChunks { ino: d.ino()? },
            Opcode::Release => Op::Release { ino: d.ino()? },
            Opcode::InvalidateDir => Op::InvalidateDir { dir: d.ino()? },
            Opcode::SetAttr => Op::SetAttr {
                ino: d.ino()?,
                changes: SetAttrs {
                    perm: d.opt_u32()?,
                    uid: d.opt_u32()?,
                    gid: d.opt_u32()?,
                    size: d.opt_u64()?,
                    atime: d.time_set()?,
                    mtime: d.time_set()?,
                    via_writable_handle: d.bool()?,
                },
            },
            Opcode::Create => Op::Create {
                parent: d.ino()?,
                name: d.name()?,
                kind: d.kind()?,
                perm: d.u32()? & 0o7777,
                exclusive: d.bool()?,
                symlink_target: d.bytes16(limits::SYMLINK_MAX_BYTES, "symlink target")?,
            },
            Opcode::Mknod => Op::Mknod {
                parent: d.ino()?,
                name: d.name()?,
                kind: d.kind()?,
                perm: d.u32()? & 0o7777,
                rdev: d.u32()?,
            },
            Opcode::Remove => Op::Remove {
                parent: d.ino()?,
                name: d.name()?,
                dir: d.bool()?,
                hold: Hold::decode(&mut d)?,
            },
            Opcode::Access => Op::Access {
                ino: d.ino()?,
                mask: d.u8()?,
            },
            Opcode::Read => Op::Read {
                ino: d.ino()?,
                chunk: ChunkIndex(d.u32()?),
                offset: d.u32()?,
                len: d.u32()?,
            },
            Opcode::Write => Op::Write {
                ino: d.ino()?,
                chunk: ChunkIndex(d.u32()?),
                offset: d.u32()?,
                file_size: d.u64()?,
            },
            Opcode::UpdateSize => Op::UpdateSize {
                ino: d.ino()?,
                size: d.u64()?,
                mtime: d.ts()?,
            },
            Opcode::Fsync => Op::Fsync,
            Opcode::StatFs => Op::StatFs,
            Opcode::GetRoutes => Op::GetRoutes,
            Opcode::ReadDir => {
                let dir = d.ino()?;
                let after = match d.u8()? {
                    0 => None,
                    n => Some(
                        FileName::new(d.raw(n as usize)?)
                            .map_err(|_| ProtoError::BadValue("file name"))?,
                    ),
                };
                Op::ReadDir {
                    dir,
                    after,
                    max_entries: d.u32()?,
                }
            }
            Opcode::Rename => Op::Rename {
                src_parent: d.ino()?,
                src_name: d.name()?,
                dst_parent: d.ino()?,
                dst_name: d.name()?,
                flags: d.u32()?,
                hold: Hold::decode(&mut d)?,
            },
            Opcode::Link => Op::Link {
                ino: d.ino()?,
                parent: d.ino()?,
                name: d.name()?,
            },
            Opcode::TruncateChunks => Op::TruncateChunks {
                ino: d.ino()?,
                size: d.u64()?,
            },
            Opcode::Seal => Op::Seal {
                dir: d.ino()?,
                parent: d.ino()?,
                name: d.name()?,
                action: match d.u8()? {
                    1 => SealAction::Seal,
                    2 => SealAction::Unseal,
                    3 => SealAction::Removed,
                    4 => SealAction::Settle,
                    _ => return Err(ProtoError::BadValue("seal action")),
                },
                seal: SealId(d.u64()?),
            },
            Opcode::AdjustLinks => Op::AdjustLinks {
                ino: d.ino()?,
                delta: d.i32()?,
                hold: d.bool()?,
            },
            Opcode::TouchDir => Op::TouchDir {
                dir: d.ino()?,
                sender: ServerId(d.u16()?),
                seq: d.u64()?,
                time: d.ts()?,
                nlink_delta: d.i32()?,
            },
            Opcode::Membership => Op::Membership {
                msg: decode_bytes32(&mut d, "membership message")?,
            },
            Opcode::ChunkExtent => Op::ChunkExtent {
                ino: d.ino()?,
                first: ChunkIndex(d.u32()?),
                last: ChunkIndex(d.u32()?),
            },
            Opcode::ReplicaApply => Op::ReplicaApply {
                set: ServerId(d.u16()?),
                stream: d.u64()?,
                first_seq: d.u64()?,
                heads: decode_bytes32(&mut d, "replica record heads")?,
            },
            Opcode::ReplicaDigests => {
                let set = ServerId(d.u16()?);
                let stream = d.u64()?;
                let n = d.u16()? as usize;
                let n = d.list_len(n, REPLICA_DIGESTS_MAX, 12, "chunk files to digest")?;
                let mut chunks = Vec::with_capacity(n);
                for _ in 0..n {
                    chunks.push((d.ino()?, ChunkIndex(d.u32()?)));
                }
                Op::ReplicaDigests {
                    set,
                    stream,
                    chunks,
                }
            }
            Opcode::ReportSeals => Op::ReportSeals { dir: d.ino()? },
            Opcode::ReplicaKeyRange => {
                let set = ServerId(d.u16()?);
                let stream = d.u64()?;
                let mut key = |what| -> Result<Option<Vec<u8>>, ProtoError> {
                    let some = d.bool()?;
                    let k = d.bytes16(REPLICA_KEY_MAX_BYTES, what)?;
                    Ok(some.then_some(k))
                };
                let after = key("range start key")?;
                let upto = key("range end key")?;
                Op::ReplicaKeyRange {
                    set,
                    stream,
                    after,
                    upto,
                    digest: d.raw(16)?.try_into().expect("16 bytes taken"),
                }
            }
            Opcode::RenameInstall => Op::RenameInstall {
                tx: TxId(d.u64()?),
                coordinator: ServerId(d.u16()?),
                dst_parent: d.ino()?,
                dst_name: d.name()?,
                ino: d.ino()?,
                kind: d.kind()?,
                noreplace: d.bool()?,
                hold: Hold::decode(&mut d)?,
            },
            Opcode::RenameResolve => Op::RenameResolve {
                tx: TxId(d.u64()?),
                coordinator: ServerId(d.u16()?),
                forget: d.bool()?,
            },
            Opcode::DirMoveLock => Op::DirMoveLock {
                holder: ServerId(d.u16()?),
                token: d.u64()?,
                release: d.bool()?,
            },
            Opcode::DirParent => Op::DirParent {
                ino: d.ino()?,
                change: if d.bool()? {
                    Some((d.ino()?, d.ino()?))
                } else {
                    None
                },
            },
            Opcode::DirMoveSettled => Op::DirMoveSettled { token: d.u64()? },
            Opcode::FixDirLinks => Op::FixDirLinks {
                dir: d.ino()?,
                seen: d.u32()?,
                want: d.u32()?,
            },
            Opcode::ListInodes => Op::ListInodes {
                after: if d.bool()? { Some(d.ino()?) } else { None },
                max_entries: d.u32()?,
            },
            Opcode::FixFileLinks => Op::FixFileLinks {
                ino: d.ino()?,
                seen: d.u32()?,
                want: d.u32()?,
            },
            Opcode::Adopt => Op::Adopt {
                ino: d.ino()?,
                into: d.ino()?,
                name: d.name()?,
                seen: d.u32()?,
            },
            Opcode::DropName => Op::DropName {
                parent: d.ino()?,
                name: d.name()?,
                ino: d.ino()?,
            },
            Opcode::RemakeDir => Op::RemakeDir {
                dir: d.ino()?,
                parent: d.ino()?,
                nlink: d.u32()?,
            },
            Opcode::Find => Op::Find {
                query: FindQuery::decode(&mut d)?,
                after: if d.bool()? {
                    Some((d.ino()?, d.name()?))
                } else {
                    None
                },
                max_entries: d.u32()?,
            },
        };
        d.finish()?;
        Ok(Request { creds, op, once })
    }
}

mod tag {
    pub const EMPTY: u8 = 0;
    pub const ENTRY: u8 = 1;
    pub const CREATED: u8 = 2;
    pub const ATTR: u8 = 3;
    pub const REMOVED: u8 = 4;
    pub const DIR_PAGE: u8 = 5;
    pub const DATA: u8 = 6;
    pub const TARGET: u8 = 7;
    pub const FS_STATS: u8 = 8;
    pub const SEALED: u8 = 9;
    pub const LINKS: u8 = 10;
    pub const INSTALLED: u8 = 11;
    pub const RESOLVED: u8 = 12;
    pub const FIND_PAGE: u8 = 13;
    pub const LINKED: u8 = 14;
    pub const RENAMED: u8 = 15;
    pub const REPLICA_ACK: u8 = 16;
    pub const ROUTES: u8 = 17;
    pub const MEMBERSHIP: u8 = 18;
    pub const REMOVAL_SETTLED: u8 = 19;
    pub const EXTENT: u8 = 20;
    pub const SEAL_REPORT: u8 = 21;
    pub const CHUNK_DIGESTS: u8 = 22;
    pub const WRITTEN: u8 = 23;
    pub const SYNCED: u8 = 24;
    pub const SIZE_UPDATED: u8 = 25;
    pub const KEY_RANGE_SAME: u8 = 26;
    pub const DIR_PARENT: u8 = 27;
    pub const INODE_PAGE: u8 = 28;
}

/// u32-prefixed bytes within a body.
fn decode_bytes32(d: &mut Decoder<'_>, what: &'static str) -> Result<Vec<u8>, ProtoError> {
    let n = d.u32()? as usize;
    if n > BODY_MAX_BYTES as usize {
        return Err(ProtoError::BadValue(what));
    }
    Ok(d.raw(n)?.to_vec())
}

fn encode_touched(e: &mut Encoder, touched: &[TouchToken]) {
    debug_assert!(touched.len() <= TOUCH_TOKENS_PER_REPLY_MAX);
    e.u8(touched.len() as u8);
    for t in touched {
        e.ino(t.dir);
        e.u16(t.sender.0);
        e.u64(t.seq);
    }
}

fn decode_touched(d: &mut Decoder<'_>) -> Result<Vec<TouchToken>, ProtoError> {
    let n = d.u8()? as usize;
    if n > TOUCH_TOKENS_PER_REPLY_MAX {
        return Err(ProtoError::BadValue("touch token count"));
    }
    let mut touched = Vec::with_capacity(n);
    for _ in 0..n {
        touched.push(TouchToken {
            dir: d.ino()?,
            sender: ServerId(d.u16()?),
            seq: d.u64()?,
        });
    }
    Ok(touched)
}

fn encode_entry(e: &mut Encoder, entry: &Entry) {
    e.ino(entry.ino);
    e.kind(entry.kind);
    match &entry.attr {
        None => e.u8(0),
        Some(a) => {
            e.u8(1);
            e.attr(a);
        }
    }
}

fn decode_entry(d: &mut Decoder<'_>) -> Result<Entry, ProtoError> {
    let ino = d.ino()?;
    let kind = d.kind()?;
    let attr = if d.bool()? { Some(d.attr()?) } else { None };
    Ok(Entry { ino, kind, attr })
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        match self {
            Reply::Empty => e.u8(tag::EMPTY),
            Reply::Entry(entry) => {
                e.u8(tag::ENTRY);
                encode_entry(&mut e, entry);
            }
            Reply::Created {
                entry,
                created,
                touched,
                verifier,
            } => {
                e.u8(tag::CREATED);
                encode_entry(&mut e, entry);
                e.bool(*created);
                encode_touched(&mut e, touched);
                e.u64(verifier.0);
            }
            Reply::Attr(a) => {
                e.u8(tag::ATTR);
                e.attr(a);
            }
            Reply::Removed {
                ino,
                kind,
                held,
                touched,
                verifier,
            } => {
                e.u8(tag::REMOVED);
                e.ino(*ino);
                e.kind(*kind);
                e.bool(*held);
                encode_touched(&mut e, touched);
                e.u64(verifier.0);
            }
            Reply::Linked {
                entry,
                touched,
                verifier,
            } => {
                e.u8(tag::LINKED);
                encode_entry(&mut e, entry);
                encode_touched(&mut e, touched);
                e.u64(verifier.0);
            }
            Reply::Renamed { touched, verifier } => {
                e.u8(tag::RENAMED);
                encode_touched(&mut e, touched);
                e.u64(verifier.0);
            }
            Reply::InodePage {
                inodes,
                more,
                pending,
            } => {
                e.u8(tag::INODE_PAGE);
                e.u32(inodes.len() as u32);
                for i in inodes {
                    e.ino(i.ino);
                    e.kind(i.kind);
                    e.u32(i.nlink);
                }
                e.bool(*more);
                e.u64(*pending);
            }
            Reply::DirPage { entries, more } => {
                e.u8(tag::DIR_PAGE);
                e.u32(entries.len() as u32);
                for ent in entries {
                    e.name(&ent.name);
                    e.ino(ent.ino);
                    e.kind(ent.kind);
                }
                e.bool(*more);
            }
            Reply::Data => e.u8(tag::DATA),
            Reply::Target(t) => {
                e.u8(tag::TARGET);
                e.bytes16(t);
            }
            Reply::FsStats(s) => {
                e.u8(tag::FS_STATS);
                e.u64(s.bytes_total);
                e.u64(s.bytes_free);
                e.u64(s.bytes_avail);
                e.u64(s.inodes);
                e.u64(s.data_bytes);
                match &s.failure {
                    None => e.u8(0),
                    Some(m) => {
                        e.u8(1);
                        e.str16(m);
                    }
                }
                e.u16(s.rebuilds.len() as u16);
                for r in &s.rebuilds {
                    e.u16(r.replica.0);
                    e.u8(r.phase as u8);
                    e.u64(r.keys);
                    e.u64(r.keys_kept);
                    e.u64(r.bytes_done);
                    e.u64(r.bytes_total);
                    e.u64(r.bytes_kept);
                    let mut end = r.failure.len().min(REBUILD_FAILURE_MAX_BYTES);
                    while !r.failure.is_char_boundary(end) {
                        end -= 1;
                    }
                    e.str16(&r.failure[..end]);
                }
                e.u64(s.disk);
                e.u64(s.bytes_reserved);
                e.u8(s.copies);
            }
            Reply::Sealed { empty } => {
                e.u8(tag::SEALED);
                e.bool(*empty);
            }
            Reply::RemovalSettled { removed } => {
                e.u8(tag::REMOVAL_SETTLED);
                e.bool(*removed);
            }
            Reply::SealReport(report) => {
                e.u8(tag::SEAL_REPORT);
                match report {
                    SealReport::Unsealed => e.u8(0),
                    SealReport::Sealed {
                        parent,
                        name,
                        holders,
                    } => {
                        e.u8(1);
                        e.ino(*parent);
                        e.name(name);
                        let n = holders.len().min(SEAL_HOLDERS_MAX);
                        e.u8(n as u8);
                        for h in &holders[..n] {
                            e.u64(h.seal.0);
                            e.u32(h.left_ms);
                        }
                    }
                    SealReport::Removed => e.u8(2),
                }
            }
            Reply::Links { nlink } => {
                e.u8(tag::LINKS);
                e.u32(*nlink);
            }
            Reply::ReplicaAck { applied } => {
                e.u8(tag::REPLICA_ACK);
                e.u64(*applied);
            }
            Reply::KeyRangeSame { same } => {
                e.u8(tag::KEY_RANGE_SAME);
                e.bool(*same);
            }
            Reply::ChunkDigests { digests } => {
                debug_assert!(digests.len() <= REPLICA_DIGESTS_MAX);
                e.u8(tag::CHUNK_DIGESTS);
                e.u16(digests.len() as u16);
                for d in digests {
                    match d {
                        None => e.u8(0),
                        Some(d) => {
                            e.u8(1);
                            e.u64(d.len);
                            e.raw(&d.hash);
                        }
                    }
                }
            }
            Reply::Membership { msg } => {
                e.u8(tag::MEMBERSHIP);
                e.u32(msg.len() as u32);
                e.raw(msg);
            }
            Reply::Extent { end } => {
                e.u8(tag::EXTENT);
                e.u64(*end);
            }
            Reply::Written { verifier } => {
                e.u8(tag::WRITTEN);
                e.u64(verifier.0);
            }
            Reply::Synced { verifier } => {
                e.u8(tag::SYNCED);
                e.u64(verifier.0);
            }
            Reply::SizeUpdated { attr, verifier } => {
                e.u8(tag::SIZE_UPDATED);
                e.attr(attr);
                e.u64(verifier.0);
            }
            Reply::Routes {
                epoch,
                serving,
                in_sync,
                addresses,
                voters,
                lost,
            } => {
                e.u8(tag::ROUTES);
                e.u64(*epoch);
                e.u16(serving.len() as u16);
                for s in serving {
                    e.u16(s.0);
                }
                e.u16(in_sync.len() as u16);
                e.raw(in_sync);
                e.u16(addresses.len() as u16);
                for (server, addr) in addresses {
                    e.u16(server.0);
                    e.str16(&addr.to_string());
                }
                e.u16(voters.len() as u16);
                for v in voters {
                    e.u16(v.0);
                }
                e.u16(lost.len() as u16);
                for (set, silent_ms) in lost {
                    e.u16(set.0);
                    e.u64(*silent_ms);
                }
            }
            Reply::Installed { replaced, held } => {
                e.u8(tag::INSTALLED);
                match replaced {
                    None => e.u8(0),
                    Some((ino, kind)) => {
                        e.u8(1);
                        e.ino(*ino);
                        e.kind(*kind);
                    }
                }
                e.bool(*held);
            }
            Reply::Resolved { installed } => {
                e.u8(tag::RESOLVED);
                e.bool(*installed);
            }
            Reply::DirParent { parent } => {
                e.u8(tag::DIR_PARENT);
                e.bool(parent.is_some());
                if let Some(p) = parent {
                    e.ino(*p);
                }
            }
            Reply::FindPage {
                dirs,
                matches,
                unresolved,
                resume,
                scanned,
            } => {
                e.u8(tag::FIND_PAGE);
                find::encode_page(&mut e, dirs, matches, unresolved, resume, *scanned);
            }
        }
        e.into_bytes()
    }

    pub fn decode(body: &[u8]) -> Result<Reply, ProtoError> {
        let mut d = Decoder::new(body);
        let reply = match d.u8()? {
            tag::EMPTY => Reply::Empty,
            tag::ENTRY => Reply::Entry(decode_entry(&mut d)?),
            tag::CREATED => Reply::Created {
                entry: decode_entry(&mut d)?,
                created: d.bool()?,
                touched: decode_touched(&mut d)?,
                verifier: WriteVerifier(d.u64()?),
            },
            tag::ATTR => Reply::Attr(d.attr()?),
            tag::REMOVED => Reply::Removed {
                ino: d.ino()?,
                kind: d.kind()?,
                held: d.bool()?,
                touched: decode_touched(&mut d)?,
                verifier: WriteVerifier(d.u64()?),
            },
            tag::LINKED => Reply::Linked {
                entry: decode_entry(&mut d)?,
                touched: decode_touched(&mut d)?,
                verifier: WriteVerifier(d.u64()?),
            },
            tag::RENAMED => Reply::Renamed {
                touched: decode_touched(&mut d)?,
                verifier: WriteVerifier(d.u64()?),
            },
            tag::INODE_PAGE => {
                // Each takes 13 bytes.
                let n = d.u32()? as usize;
                let n = d.list_len(n, limits::INODE_PAGE_MAX as usize, 13, "inode page length")?;
                let mut inodes = Vec::with_capacity(n);
                for _ in 0..n {
                    inodes.push(InodeLinks {
                        ino: d.ino()?,
                        kind: d.kind()?,
                        nlink: d.u32()?,
                    });
                }
                Reply::InodePage {
                    inodes,
                    more: d.bool()?,
                    pending: d.u64()?,
                }
            }
            tag::DIR_PAGE => {
                // Each entry takes at least 11 bytes.
                let n = d.u32()? as usize;
                let n = d.list_len(
                    n,
                    limits::READDIR_PAGE_ENTRIES_MAX as usize,
                    11,
                    "readdir page length",
                )?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(DirEntry {
                        name: d.name()?,
                        ino: d.ino()?,
                        kind: d.kind()?,
                    });
                }
                Reply::DirPage {
                    entries,
                    more: d.bool()?,
                }
            }
            tag::DATA => Reply::Data,
            tag::TARGET => Reply::Target(d.bytes16(limits::SYMLINK_MAX_BYTES, "symlink target")?),
            tag::FS_STATS => Reply::FsStats(FsStats {
                bytes_total: d.u64()?,
                bytes_free: d.u64()?,
                bytes_avail: d.u64()?,
                inodes: d.u64()?,
                data_bytes: d.u64()?,
                failure: if d.bool()? {
                    Some(d.str16(u16::MAX as usize, "server failure")?)
                } else {
                    None
                },
                rebuilds: {
                    let n = d.u16()? as usize;
                    let n = d.list_len(n, limits::SERVERS_MAX, 43, "rebuild count")?;
                    let mut all = Vec::with_capacity(n);
                    for _ in 0..n {
                        all.push(Rebuild {
                            replica: ServerId(d.u16()?),
                            phase: RebuildPhase::from_u8(d.u8()?)
                                .ok_or(ProtoError::BadValue("rebuild phase"))?,
                            keys: d.u64()?,
                            keys_kept: d.u64()?,
                            bytes_done: d.u64()?,
                            bytes_total: d.u64()?,
                            bytes_kept: d.u64()?,
                            failure: d.str16(REBUILD_FAILURE_MAX_BYTES, "rebuild failure")?,
                        });
                    }
                    all
                },
                disk: d.u64()?,
                bytes_reserved: d.u64()?,
                copies: d.u8()?,
            }),
            tag::SEALED => Reply::Sealed { empty: d.bool()? },
            tag::REMOVAL_SETTLED => Reply::RemovalSettled { removed: d.bool()? },
            tag::SEAL_REPORT => Reply::SealReport(match d.u8()? {
                0 => SealReport::Unsealed,
                1 => {
                    let parent = d.ino()?;
                    let name = d.name()?;
                    let n = d.u8()? as usize;
                    if n > SEAL_HOLDERS_MAX {
                        return Err(ProtoError::BadValue("seal holder count"));
                    }
                    let mut holders = Vec::with_capacity(n);
                    for _ in 0..n {
                        holders.push(SealHolder {
                            seal: SealId(d.u64()?),
                            left_ms: d.u32()?,
                        });
                    }
                    SealReport::Sealed {
                        parent,
                        name,
                        holders,
                    }
                }
                2 => SealReport::Removed,
                _ => return Err(ProtoError::BadValue("seal report")),
            }),
            tag::LINKS => Reply::Links { nlink: d.u32()? },
            tag::REPLICA_ACK => Reply::ReplicaAck { applied: d.u64()? },
            tag::CHUNK_DIGESTS => {
                let n = d.u16()? as usize;
                let n = d.list_len(n, REPLICA_DIGESTS_MAX, 1, "chunk digests")?;
                let mut digests = Vec::with_capacity(n);
                for _ in 0..n {
                    digests.push(match d.u8()? {
                        0 => None,
                        1 => Some(ChunkDigest {
                            len: d.u64()?,
                            hash: d.raw(16)?.try_into().expect("16 bytes taken"),
                        }),
                        _ => return Err(ProtoError::BadValue("chunk digest")),
                    });
                }
                Reply::ChunkDigests { digests }
            }
            tag::EXTENT => Reply::Extent { end: d.u64()? },
            tag::KEY_RANGE_SAME => Reply::KeyRangeSame { same: d.bool()? },
            tag::WRITTEN => Reply::Written {
                verifier: WriteVerifier(d.u64()?),
            },
            tag::SYNCED => Reply::Synced {
                verifier: WriteVerifier(d.u64()?),
            },
            tag::SIZE_UPDATED => Reply::SizeUpdated {
                attr: d.attr()?,
                verifier: WriteVerifier(d.u64()?),
            },
            tag::MEMBERSHIP => Reply::Membership {
                msg: decode_bytes32(&mut d, "membership message")?,
            },
            tag::ROUTES => {
                let epoch = d.u64()?;
                let n = d.u16()? as usize;
                let n = d.list_len(n, limits::SERVERS_MAX, 2, "route count")?;
                let mut serving = Vec::with_capacity(n);
                for _ in 0..n {
                    serving.push(ServerId(d.u16()?));
                }
                let n = d.u16()? as usize;
                let n = d.list_len(n, limits::SERVERS_MAX, 1, "in-sync count")?;
                let in_sync = d.raw(n)?.to_vec();
                let n = d.u16()? as usize;
                let n = d.list_len(n, limits::SERVERS_MAX, 4, "address count")?;
                let mut addresses = Vec::with_capacity(n);
                for _ in 0..n {
                    let server = ServerId(d.u16()?);
                    let addr = d.str16(64, "server address")?;
                    let addr = addr
                        .parse()
                        .map_err(|_| ProtoError::BadValue("server address"))?;
                    addresses.push((server, addr));
                }
                let n = d.u16()? as usize;
                let n = d.list_len(n, limits::SERVERS_MAX, 2, "voter count")?;
                let mut voters = Vec::with_capacity(n);
                for _ in 0..n {
                    voters.push(ServerId(d.u16()?));
                }
                let n = d.u16()? as usize;
                let n = d.list_len(n, limits::SERVERS_MAX, 10, "lost set count")?;
                let mut lost = Vec::with_capacity(n);
                for _ in 0..n {
                    lost.push((ServerId(d.u16()?), d.u64()?));
                }
                Reply::Routes {
                    epoch,
                    serving,
                    in_sync,
                    addresses,
                    voters,
                    lost,
                }
            }
            tag::INSTALLED => Reply::Installed {
                replaced: if d.bool()? {
                    Some((d.ino()?, d.kind()?))
                } else {
                    None
                },
                held: d.bool()?,
            },
            tag::RESOLVED => Reply::Resolved {
                installed: d.bool()?,
            },
            tag::DIR_PARENT => Reply::DirParent {
                parent: if d.bool()? { Some(d.ino()?) } else { None },
            },
            tag::FIND_PAGE => {
                let (dirs, matches, unresolved, resume, scanned) = find::decode_page(&mut d)?;
                Reply::FindPage {
                    dirs,
                    matches,
                    unresolved,
                    resume,
                    scanned,
                }
            }
            _ => return Err(ProtoError::BadValue("reply tag")),
        };
        d.finish()?;
        Ok(reply)
    }
}

/// Encode an error reply body: the readable message (the code is in the
/// frame header's status field).
pub fn encode_error_message(message: &str) -> Vec<u8> {
    let mut e = Encoder::new();
    e.str16(message);
    e.into_bytes()
}

pub fn decode_error_message(body: &[u8]) -> Result<String, ProtoError> {
    let mut d = Decoder::new(body);
    let s = d.str16(u16::MAX as usize, "error message")?;
    d.finish()?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> FileName {
        FileName::new(s.as_bytes()).unwrap()
    }

    fn attr() -> Attr {
        Attr {
            ino: InodeId(77),
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 3901,
            atime: Timestamp { secs: 1, nanos: 2 },
            mtime: Timestamp { secs: -3, nanos: 4 },
            ctime: Timestamp {
                secs: 5,
                nanos: 999_999_999,
            },
            btime: Timestamp::default(),
            rdev: 0,
        }
    }

    fn token() -> TouchToken {
        TouchToken {
            dir: InodeId(1 << 48 | 7),
            sender: ServerId(2),
            seq: 1 << 40,
        }
    }

    fn all_ops() -> Vec<Op> {
        let ino = InodeId(42);
        vec![
            Op::Lookup {
                parent: InodeId::ROOT,
                name: name("a"),
            },
            Op::Open {
                parent: InodeId::ROOT,
                name: name("a"),
                data_max: 65536,
            },
            Op::GetAttr { ino, after: vec![] },
            Op::GetAttr {
                ino,
                after: vec![
                    TouchWait {
                        sender: ServerId(1),
                        seq: 9,
                    },
                    TouchWait {
                        sender: ServerId(300),
                        seq: u64::MAX,
                    },
                ],
            },
            Op::SetAttr {
                ino,
                changes: SetAttrs {
                    perm: Some(0o755),
                    uid: None,
                    gid: Some(5),
                    size: Some(1 << 40),
                    atime: TimeSet::Now,
                    mtime: TimeSet::At(Timestamp { secs: 9, nanos: 8 }),
                    via_writable_handle: true,
                },
            },
            Op::Create {
                parent: ino,
                name: name("link"),
                kind: FileKind::Symlink,
                perm: 0o777,
                exclusive: true,
                symlink_target: b"/some/where".to_vec(),
            },
            Op::Mknod {
                parent: ino,
                name: name("fifo"),
                kind: FileKind::Fifo,
                perm: 0o600,
                rdev: 0,
            },
            Op::Mknod {
                parent: ino,
                name: name("tty"),
                kind: FileKind::CharDev,
                perm: 0o620,
                rdev: (136 << 8) | 5,
            },
            Op::Remove {
                parent: ino,
                name: name("x"),
                dir: true,
                hold: Hold::Nothing,
            },
            Op::Remove {
                parent: ino,
                name: name("y"),
                dir: false,
                hold: Hold::Inodes(vec![InodeId(7), ino]),
            },
            Op::Release { ino },
            Op::Access {
                ino,
                mask: ACCESS_READ | ACCESS_WRITE,
            },
            Op::Read {
                ino,
                chunk: ChunkIndex(3),
                offset: 4096,
                len: 1 << 20,
            },
            Op::Write {
                ino,
                chunk: ChunkIndex(0),
                offset: 0,
                file_size: 3901,
            },
            Op::UpdateSize {
                ino,
                size: 100,
                mtime: Timestamp { secs: 7, nanos: 0 },
            },
            Op::Fsync,
            Op::ReadDir {
                dir: ino,
                after: None,
                max_entries: 100,
            },
            Op::ReadDir {
                dir: ino,
                after: Some(name("m")),
                max_entries: 1,
            },
            Op::Rename {
                src_parent: ino,
                src_name: name("a"),
                dst_parent: InodeId::ROOT,
                dst_name: name("b"),
                flags: RENAME_NOREPLACE,
                hold: Hold::Any,
            },
            Op::Link {
                ino,
                parent: InodeId::ROOT,
                name: name("hard"),
            },
            Op::ReadLink { ino },
            Op::TruncateChunks { ino, size: 5 },
            Op::StatFs,
            Op::GetRoutes,
            Op::Membership { msg: vec![9; 40] },
            Op::ChunkExtent {
                ino,
                first: ChunkIndex(3),
                last: ChunkIndex(9),
            },
            Op::Seal {
                dir: ino,
                parent: InodeId::ROOT,
                name: name("gone"),
                action: SealAction::Removed,
                seal: SealId(u64::MAX - 3),
            },
            Op::Seal {
                dir: ino,
                parent: ino,
                name: name("d"),
                action: SealAction::Settle,
                seal: SealId(0),
            },
            Op::AdjustLinks {
                ino,
                delta: -1,
                hold: true,
            },
            Op::TouchDir {
                dir: ino,
                sender: ServerId(3),
                seq: 77,
                time: Timestamp { secs: 5, nanos: 6 },
                nlink_delta: -2,
            },
            Op::RenameInstall {
                tx: TxId(9),
                coordinator: ServerId(2),
                dst_parent: ino,
                dst_name: name("n"),
                ino: InodeId(5),
                kind: FileKind::Dir,
                noreplace: false,
                hold: Hold::Inodes(vec![InodeId(5)]),
            },
            Op::RenameResolve {
                tx: TxId(9),
                coordinator: ServerId(2),
                forget: true,
            },
            Op::DirMoveLock {
                holder: ServerId(3),
                token: u64::MAX,
                release: true,
            },
            Op::DirParent { ino, change: None },
            Op::DirParent {
                ino,
                change: Some((InodeId::ROOT, InodeId(1 << 48 | 7))),
            },
            Op::DirMoveSettled { token: 0x5eed },
            Op::FixDirLinks {
                dir: ino,
                seen: 2,
                want: u32::MAX,
            },
            Op::ListInodes {
                after: None,
                max_entries: 0,
            },
            Op::ListInodes {
                after: Some(ino),
                max_entries: u32::MAX,
            },
            Op::FixFileLinks {
                ino,
                seen: 3,
                want: 0,
            },
            Op::Adopt {
                ino,
                into: InodeId::ROOT,
                name: name("#7.0"),
                seen: 2,
            },
            Op::DropName {
                parent: InodeId::ROOT,
                name: name("gone"),
                ino,
            },
            Op::RemakeDir {
                dir: ino,
                parent: InodeId::ROOT,
                nlink: 3,
            },
            Op::PurgeChunks { ino },
            Op::InvalidateDir { dir: ino },
            Op::ReplicaApply {
                set: ServerId(4),
                stream: 0xfeed,
                first_seq: 17,
                heads: vec![1, 2, 3, 4, 5],
            },
            Op::ReplicaDigests {
                set: ServerId(2),
                stream: 0xbeef,
                chunks: vec![
                    (InodeId(1 << 48 | 9), ChunkIndex(3)),
                    (InodeId(5), ChunkIndex(0)),
                ],
            },
            Op::ReportSeals { dir: InodeId(77) },
            Op::ReplicaKeyRange {
                set: ServerId(1),
                stream: 0xcafe,
                after: None,
                upto: Some(b"DENTzz".to_vec()),
                digest: [3; 16],
            },
            Op::ReplicaKeyRange {
                set: ServerId(0),
                stream: 1,
                after: Some(Vec::new()),
                upto: None,
                digest: [0; 16],
            },
            Op::Find {
                query: FindQuery::default(),
                after: None,
                max_entries: 4096,
            },
            Op::Find {
                query: FindQuery {
                    name: Some(b"*01*".to_vec()),
                    newer: Some(Timestamp { secs: -5, nanos: 7 }),
                    size: Some(crate::find::SizeTest {
                        cmp: crate::find::SizeCmp::Greater,
                        n: 3901,
                        unit: 1024,
                    }),
                    kind: Some(FileKind::Symlink),
                    uid: Some(1000),
                    want_attrs: true,
                },
                after: Some((ino, name("last"))),
                max_entries: 1,
            },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        let creds = Credentials {
            uid: 1000,
            gid: 100,
            groups: vec![4, 27],
        };
        for (i, op) in all_ops().into_iter().enumerate() {
            // Half of them with an id, as a request that runs once has,
            // half of those sent again.
            let once = (i % 2 == 1).then_some(RunOnce {
                id: OpId {
                    time: 1_800_000_000,
                    origin: 0x0123_4567_89ab_cdef,
                    seq: i as u32,
                },
                resent: i % 4 == 3,
            });
            let req = Request {
                creds: creds.clone(),
                op,
                once,
            };
            let body = req.encode();
            let back = Request::decode(req.op.opcode() as u16, &body).unwrap();
            assert_eq!(back, req);
            // Every strict prefix must be refused, never accepted or panic.
            for cut in 0..body.len() {
                assert!(Request::decode(req.op.opcode() as u16, &body[..cut]).is_err());
            }
            let mut longer = body.clone();
            longer.push(0);
            assert!(Request::decode(req.op.opcode() as u16, &longer).is_err());
        }
    }

    #[test]
    fn every_reply_round_trips() {
        let entry = Entry {
            ino: InodeId(3),
            kind: FileKind::Dir,
            attr: Some(attr()),
        };
        let replies = vec![
            Reply::Empty,
            Reply::Entry(entry.clone()),
            Reply::Entry(Entry {
                attr: None,
                ..entry.clone()
            }),
            Reply::Created {
                entry: entry.clone(),
                created: true,
                touched: vec![],
                verifier: WriteVerifier(1),
            },
            Reply::Created {
                entry: entry.clone(),
                created: true,
                touched: vec![token()],
                verifier: WriteVerifier(u64::MAX),
            },
            Reply::Linked {
                entry,
                touched: vec![token()],
                verifier: WriteVerifier(7),
            },
            Reply::Renamed {
                touched: vec![],
                verifier: WriteVerifier(0),
            },
            Reply::Renamed {
                touched: vec![
                    token(),
                    TouchToken {
                        dir: InodeId::ROOT,
                        ..token()
                    },
                ],
                verifier: WriteVerifier(9),
            },
            Reply::Attr(attr()),
            Reply::Attr(Attr {
                kind: FileKind::BlockDev,
                rdev: (8 << 8) | 1 | (0x123 << 20),
                ..attr()
            }),
            Reply::Removed {
                ino: InodeId(1),
                kind: FileKind::File,
                held: true,
                touched: vec![token()],
                verifier: WriteVerifier(3),
            },
            Reply::InodePage {
                inodes: vec![InodeLinks {
                    ino: InodeId(1 << 48 | 5),
                    kind: FileKind::Symlink,
                    nlink: 7,
                }],
                more: true,
                pending: 0,
            },
            Reply::InodePage {
                inodes: Vec::new(),
                more: false,
                pending: u64::MAX,
            },
            Reply::DirPage {
                entries: vec![DirEntry {
                    name: name("f"),
                    ino: InodeId(9),
                    kind: FileKind::File,
                }],
                more: true,
            },
            Reply::Data,
            Reply::Target(b"../x".to_vec()),
            Reply::FsStats(FsStats {
                bytes_total: 1,
                bytes_free: 2,
                bytes_avail: 3,
                inodes: 4,
                data_bytes: 5,
                failure: None,
                rebuilds: Vec::new(),
                disk: 0,
                bytes_reserved: 0,
                copies: 1,
            }),
            Reply::FsStats(FsStats {
                bytes_total: 1,
                bytes_free: 2,
                bytes_avail: 3,
                inodes: 4,
                data_bytes: 5,
                failure: Some("chunk store poisoned since ...".into()),
                rebuilds: vec![Rebuild {
                    replica: ServerId(3),
                    phase: RebuildPhase::Chunks,
                    keys: 4096,
                    keys_kept: 4000,
                    bytes_done: 1 << 20,
                    bytes_total: 3 << 20,
                    bytes_kept: 1 << 19,
                    failure: "no space left on device".into(),
                }],
                disk: 0x1234_5678_9abc_def0,
                bytes_reserved: 1 << 26,
                copies: 2,
            }),
            Reply::Sealed { empty: false },
            Reply::RemovalSettled { removed: true },
            Reply::SealReport(SealReport::Unsealed),
            Reply::SealReport(SealReport::Removed),
            Reply::SealReport(SealReport::Sealed {
                parent: InodeId(1 << 48 | 7),
                name: name("going"),
                holders: vec![
                    SealHolder {
                        seal: SealId(u64::MAX),
                        left_ms: 29_999,
                    },
                    SealHolder {
                        seal: SealId(4),
                        left_ms: 0,
                    },
                ],
            }),
            Reply::Links { nlink: 3 },
            Reply::ReplicaAck { applied: 99 },
            Reply::KeyRangeSame { same: true },
            Reply::KeyRangeSame { same: false },
            Reply::ChunkDigests {
                digests: vec![
                    None,
                    Some(ChunkDigest {
                        len: 1 << 20,
                        hash: [7; 16],
                    }),
                ],
            },
            Reply::Membership { msg: vec![1, 2, 3] },
            Reply::Extent { end: 5 << 20 },
            Reply::Written {
                verifier: WriteVerifier(0x1234_5678_9abc_def1),
            },
            Reply::Synced {
                verifier: WriteVerifier(3),
            },
            Reply::SizeUpdated {
                attr: attr(),
                verifier: WriteVerifier(u64::MAX),
            },
            Reply::Routes {
                epoch: 7,
                serving: vec![ServerId(0), ServerId(0), ServerId(2)],
                in_sync: vec![2, 1, 2],
                addresses: vec![(ServerId(1), "10.0.0.9:7001".parse().unwrap())],
                voters: vec![ServerId(0), ServerId(2), ServerId(3)],
                lost: vec![(ServerId(1), 31_250)],
            },
            Reply::Installed {
                replaced: Some((InodeId(8), FileKind::File)),
                held: true,
            },
            Reply::Installed {
                replaced: None,
                held: false,
            },
            Reply::Resolved { installed: true },
            Reply::DirParent { parent: None },
            Reply::DirParent {
                parent: Some(InodeId(1 << 48 | 2)),
            },
            Reply::FindPage {
                dirs: vec![],
                matches: vec![],
                unresolved: vec![],
                resume: None,
                scanned: 0,
            },
            Reply::FindPage {
                dirs: vec![
                    crate::find::FindDir {
                        parent: InodeId::ROOT,
                        name: name("d"),
                        ino: InodeId(9),
                        access: Some((0o755, 1000, 100)),
                    },
                    crate::find::FindDir {
                        parent: InodeId(9),
                        name: name("e"),
                        ino: InodeId(10),
                        access: None,
                    },
                ],
                matches: vec![FindMatch {
                    parent: InodeId(9),
                    name: name("f01"),
                    ino: InodeId(11),
                    kind: FileKind::File,
                    attrs: Some(crate::find::FindAttrs {
                        size: 3901,
                        mtime: Timestamp { secs: 3, nanos: 4 },
                        uid: 1000,
                    }),
                }],
                unresolved: vec![FindMatch {
                    parent: InodeId(10),
                    name: name("moved"),
                    ino: InodeId(12),
                    kind: FileKind::File,
                    attrs: None,
                }],
                resume: Some((InodeId(10), name("moved"))),
                scanned: 40_000,
            },
        ];
        for r in replies {
            let body = r.encode();
            assert_eq!(Reply::decode(&body).unwrap(), r);
            for cut in 0..body.len() {
                assert!(Reply::decode(&body[..cut]).is_err());
            }
        }
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let creds = Credentials::root();
        let mut e = Encoder::new();
        e.creds(&creds);
        e.u8(0); // no OpId
        e.ino(InodeId::ROOT);
        e.u8(2);
        e.raw(b"..");
        assert_eq!(
            Request::decode(Opcode::Lookup as u16, &e.into_bytes()),
            Err(ProtoError::BadValue("file name"))
        );
        // An OpId flag other than 0, 1 or 2.
        let mut e = Encoder::new();
        e.creds(&creds);
        e.u8(3);
        assert_eq!(
            Request::decode(Opcode::StatFs as u16, &e.into_bytes()),
            Err(ProtoError::BadValue("request id flag"))
        );
        assert_eq!(
            Request::decode(999, &[]),
            Err(ProtoError::UnknownOpcode(999))
        );
        // A readdir page claiming 4096 entries in a 6-byte body.
        let mut e = Encoder::new();
        e.u8(5);
        e.u32(4096);
        e.bool(false);
        assert!(Reply::decode(&e.into_bytes()).is_err());
        // 33 groups is over the limit.
        let mut e = Encoder::new();
        e.u32(0);
        e.u32(0);
        e.u8(33);
        assert_eq!(
            Request::decode(Opcode::StatFs as u16, &e.into_bytes()),
            Err(ProtoError::BadValue("group count"))
        );
        // A rename reply with three touch tokens; a GetAttr waiting for
        // more touches than allowed, and for more than its body holds.
        assert_eq!(
            Reply::decode(&[tag::RENAMED, 3]),
            Err(ProtoError::BadValue("touch token count"))
        );
        for (n, refused) in [
            (
                GETATTR_WAITS_MAX as u16 + 1,
                ProtoError::BadValue("touches to wait for"),
            ),
            (5, ProtoError::Truncated),
        ] {
            let mut e = Encoder::new();
            e.creds(&creds);
            e.u8(0); // no OpId
            e.ino(InodeId::ROOT);
            e.u16(n);
            e.u16(1);
            e.u64(1);
            assert_eq!(
                Request::decode(Opcode::GetAttr as u16, &e.into_bytes()),
                Err(refused)
            );
        }
    }

    /// What statfs says of the whole file system: a disk counted once
    /// however many servers share it, every byte taken `copies` times,
    /// room as writes spread over the sets can use it (the most crowded
    /// disk fills first), above each disk's reserve.
    #[test]
    fn usable_space_counts_each_disk_once_over_the_copies_kept() {
        let set = |disk: u64, total: u64, avail: u64, reserved: u64, copies: u8| FsStats {
            bytes_total: total,
            bytes_free: avail + 10,
            bytes_avail: avail,
            inodes: 3,
            data_bytes: 5,
            disk,
            bytes_reserved: reserved,
            copies,
            ..FsStats::default()
        };
        // Four servers on one disk, two copies: half of it, once.
        let one_disk = FsStats::usable(&vec![set(7, 1000, 600, 100, 2); 4]);
        assert_eq!(
            (
                one_disk.bytes_total,
                one_disk.bytes_avail,
                one_disk.bytes_free
            ),
            (500, 250, 305)
        );
        assert_eq!((one_disk.inodes, one_disk.data_bytes), (12, 20));
        // Four disks, one copy: the sum while they are alike...
        let four: Vec<_> = (1..=4).map(|d| set(d, 1000, 600, 100, 1)).collect();
        assert_eq!(FsStats::usable(&four).bytes_avail, 2000);
        assert_eq!(FsStats::usable(&four).bytes_total, 4000);
        // ...and the fullest one's pace when one fills: a quarter of the
        // files go there.
        let mut one_full = four.clone();
        one_full[2].bytes_avail = 150;
        assert_eq!(FsStats::usable(&one_full).bytes_avail, 200);
        one_full[2].bytes_avail = 90;
        assert_eq!(FsStats::usable(&one_full).bytes_avail, 0, "at its reserve");
        // After a failover one server serves two sets: its disk takes
        // twice the share, and is counted once.
        let moved = [
            set(1, 1000, 500, 0, 2),
            set(1, 1000, 500, 0, 2),
            set(3, 1000, 500, 0, 2),
            set(4, 1000, 500, 0, 2),
        ];
        let after = FsStats::usable(&moved);
        assert_eq!((after.bytes_total, after.bytes_avail), (1500, 500));
        // Servers that cannot say which disk they are on count apart.
        let unknown = FsStats::usable(&[set(0, 1000, 600, 0, 1), set(0, 1000, 600, 0, 1)]);
        assert_eq!((unknown.bytes_total, unknown.bytes_avail), (2000, 1200));
        assert_eq!(FsStats::usable(&[]).bytes_total, 0);
    }

    #[test]
    fn hold_lists_are_bounded() {
        let list = Hold::Inodes((0..=HOLD_INODES_MAX as u64).map(InodeId).collect());
        let req = Request {
            creds: Credentials::root(),
            op: Op::Remove {
                parent: InodeId::ROOT,
                name: name("f"),
                dir: false,
                hold: list,
            },
            once: None,
        };
        assert_eq!(
            Request::decode(Opcode::Remove as u16, &req.encode()),
            Err(ProtoError::BadValue("hold list length"))
        );
        assert!(Hold::Any.covers(InodeId(3)));
        assert!(!Hold::Nothing.covers(InodeId(3)));
        assert!(Hold::Inodes(vec![InodeId(3)]).covers(InodeId(3)));
        assert!(!Hold::Inodes(vec![InodeId(4)]).covers(InodeId(3)));
    }

    #[test]
    fn opcodes_round_trip() {
        for v in 0..=200u16 {
            if let Some(op) = Opcode::from_u16(v) {
                assert_eq!(op as u16, v);
            }
        }
        assert!(Opcode::Seal.is_peer_only());
        assert!(Opcode::ChunkExtent.is_peer_only());
        assert!(Opcode::ReportSeals.is_peer_only());
        assert!(!Opcode::StatFs.is_peer_only());
    }
}
