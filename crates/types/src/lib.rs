//! Ids, limits and plain data types shared by every MadFS layer.
//!
//! Everything here is pure data: no I/O, no async. Ids are newtypes so that an
//! inode number can never be passed where a chunk index or server id belongs.

use std::fmt;

/// Limits on every length the system accepts. Checked before allocating.
pub mod limits {
    /// Longest file name component, as on Linux (NAME_MAX).
    pub const NAME_MAX_BYTES: usize = 255;
    /// Longest path, as on Linux (PATH_MAX, including the trailing NUL there).
    pub const PATH_MAX_BYTES: usize = 4096;
    /// Longest symlink target.
    pub const SYMLINK_MAX_BYTES: usize = 4095;
    /// Most servers in one cluster: the server id lives in the top 16 bits of
    /// an inode number.
    pub const SERVERS_MAX: usize = 4096;
    /// Supplementary groups carried with a request (like NFS AUTH_SYS).
    pub const GROUPS_MAX: usize = 32;
    /// Smallest and largest chunk size a cluster may configure.
    pub const CHUNK_SIZE_MIN_BYTES: u64 = 64 * 1024;
    pub const CHUNK_SIZE_MAX_BYTES: u64 = 64 * 1024 * 1024;
    /// Default chunk size: large enough that a 1 MiB write touches at most two
    /// servers, small enough that a 100 MiB file stripes over every server.
    pub const CHUNK_SIZE_DEFAULT_BYTES: u64 = 4 * 1024 * 1024;
    /// Chunk 0 of a file stays inline in the inode record (in RocksDB) while
    /// it is at most this long: mdtest-hard's 3,901-byte files never touch a
    /// chunk file.
    pub const INLINE_DATA_MAX_BYTES: u64 = 64 * 1024;
    /// Largest file size (the chunk index must fit in u32 at the smallest
    /// chunk size, and offsets in i64).
    pub const FILE_SIZE_MAX_BYTES: u64 = 1 << 46;
    /// Entries returned by one server in one readdir page.
    pub const READDIR_PAGE_ENTRIES_MAX: u32 = 4096;
    /// Inodes in one `madfs fsck` page (`Op::ListInodes`).
    pub const INODE_PAGE_MAX: u32 = 4096;
}

/// An inode number. The top 16 bits name the server that allocated it and
/// holds its record; the low 48 bits are that server's counter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct InodeId(pub u64);

impl InodeId {
    /// The root directory, owned by server 0.
    pub const ROOT: InodeId = InodeId(1);
    const SERVER_SHIFT: u32 = 48;
    const COUNTER_MASK: u64 = (1 << 48) - 1;

    pub fn new(owner: ServerId, counter: u64) -> InodeId {
        InodeId(((owner.0 as u64) << Self::SERVER_SHIFT) | (counter & Self::COUNTER_MASK))
    }

    /// The server that holds this inode's record.
    pub fn owner(self) -> ServerId {
        ServerId((self.0 >> Self::SERVER_SHIFT) as u16)
    }

    pub fn counter(self) -> u64 {
        self.0 & Self::COUNTER_MASK
    }
}

impl fmt::Display for InodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A server's id: its index in the cluster file.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ServerId(pub u16);

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Index of a chunk within a file: byte offset / chunk size.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ChunkIndex(pub u32);

/// Id of one request on one connection, chosen by the sender.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RequestId(pub u64);

/// Names one mutating request across the times it is sent (a retry after
/// a failover, or after a reply lost with its server), so that the
/// servers run it once and answer the retries with its result (server
/// once.rs). `time` is the sender's clock, in seconds, when it made the
/// id: the servers keep their record of it for a while from then.
/// `origin` is random per sender (a client or a server process), `seq`
/// counts its ids.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct OpId {
    pub time: u32,
    pub origin: u64,
    pub seq: u32,
}

/// Makes the `OpId`s of one sender.
#[derive(Debug)]
pub struct OpIds {
    origin: u64,
    seq: std::sync::atomic::AtomicU32,
}

impl OpIds {
    /// A sender with a random origin (std's per-process random hash keys,
    /// over the time: two senders sharing one is not a case we guard).
    pub fn new() -> OpIds {
        use std::hash::BuildHasher;
        let origin =
            std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
        OpIds {
            origin,
            seq: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub fn next(&self) -> OpId {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        // The process id is mixed in at each call: a forked child (a
        // program under `madfs run` that forks) starts with its parent's
        // origin and counter, and its ids must still differ.
        let pid = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        OpId {
            time,
            origin: self.origin ^ pid,
            seq: self
                .seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .wrapping_add(1),
        }
    }
}

impl Default for OpIds {
    fn default() -> Self {
        OpIds::new()
    }
}

/// A new `OpId` of this process (one origin for all its senders).
pub fn next_op_id() -> OpId {
    static IDS: std::sync::OnceLock<OpIds> = std::sync::OnceLock::new();
    IDS.get_or_init(OpIds::new).next()
}

/// Names one attempt to seal a directory (an rmdir's, or a rename's onto
/// an empty directory): an Unseal lifts only its own attempt's seal, so a
/// late one cannot lift the seal of a later attempt (server seals.rs).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SealId(pub u64);

impl SealId {
    /// Unique within this process (its counter), and across processes but
    /// for the chance of two random origins meeting.
    pub fn fresh() -> SealId {
        let id = next_op_id();
        SealId(id.origin.wrapping_add(u64::from(id.seq)))
    }
}

/// Id of a cross-server rename, unique per coordinating server.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TxId(pub u64);

/// File type of an inode. The numbers are stored (dentries, inode
/// records) and sent: never renumber, add at the end.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// A named pipe (mkfifo). MadFS stores the name and attributes only:
    /// the kernel (through the FUSE mount) makes the pipe between the
    /// processes that open it; the interception library cannot.
    Fifo = 4,
    /// A Unix domain socket's name (bind); as for FIFOs, the kernel
    /// connects the processes.
    Socket = 5,
    /// Device nodes: attributes and `Attr::rdev` only.
    CharDev = 6,
    BlockDev = 7,
}

impl FileKind {
    pub fn from_u8(v: u8) -> Option<FileKind> {
        match v {
            1 => Some(FileKind::File),
            2 => Some(FileKind::Dir),
            3 => Some(FileKind::Symlink),
            4 => Some(FileKind::Fifo),
            5 => Some(FileKind::Socket),
            6 => Some(FileKind::CharDev),
            7 => Some(FileKind::BlockDev),
            _ => None,
        }
    }

    /// The S_IFMT bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => 0o100000,
            FileKind::Dir => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDev => 0o020000,
            FileKind::BlockDev => 0o060000,
        }
    }

    /// The kind whose S_IFMT bits `mode` carries (mknod's mode; 0 there
    /// means a regular file, as mknod(2) says).
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0 | 0o100000 => FileKind::File,
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Symlink,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            0o020000 => FileKind::CharDev,
            0o060000 => FileKind::BlockDev,
            _ => return None,
        })
    }

    /// FIFOs, sockets and devices: a name and attributes, no data that
    /// MadFS serves.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev
        )
    }

    /// Device nodes, which only root may make (Linux asks CAP_MKNOD).
    pub fn is_device(self) -> bool {
        matches!(self, FileKind::CharDev | FileKind::BlockDev)
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default, Hash)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
}

/// How a setattr sets a time: leave it, set it to the server's clock, or to a
/// given value (UTIME_OMIT, UTIME_NOW, explicit).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TimeSet {
    Omit,
    Now,
    At(Timestamp),
}

/// Attributes of an inode, as `stat` shows them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Attr {
    pub ino: InodeId,
    pub kind: FileKind,
    /// Permission bits only (0o7777); the kind gives S_IFMT.
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
    /// The device a character or block device node stands for, in the
    /// kernel's 32-bit encoding (`new_encode_dev`: minor's low 8 bits,
    /// then 12 bits of major, then minor's upper bits; for majors below
    /// 4096 and minors below 2^20 the same number as glibc's `makedev`).
    /// 0 for every other kind.
    pub rdev: u32,
}

impl Attr {
    /// st_mode: kind bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | (self.perm & 0o7777)
    }

    /// The device number of `major` and `minor` as `rdev` holds it; None
    /// past what 32 bits hold (major 4095, minor 2^20 - 1), where
    /// mknod(2) answers EINVAL.
    pub fn make_rdev(major: u32, minor: u32) -> Option<u32> {
        if major >= 1 << 12 || minor >= 1 << 20 {
            return None;
        }
        Some((minor & 0xff) | (major << 8) | ((minor & !0xff) << 12))
    }

    /// (major, minor) of `rdev`.
    pub fn rdev_parts(&self) -> (u32, u32) {
        (
            (self.rdev >> 8) & 0xfff,
            (self.rdev & 0xff) | ((self.rdev >> 12) & 0xfff00),
        )
    }

    /// st_blocks in 512-byte units (sparse-unaware: the size rounded up).
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// Access bits, with the values access(2) uses (R_OK, W_OK, X_OK).
pub mod access {
    pub const READ: u8 = 4;
    pub const WRITE: u8 = 2;
    pub const EXEC: u8 = 1;
}

/// May `creds` access an object of `kind`, with permission bits `perm`,
/// owned by `uid`/`gid`, for every bit of `mask` (`access::*`)? POSIX mode
/// rules: one class decides (owner, else group, else other); root passes
/// everything except executing a file with no x bit at all. The servers
/// decide with this, and a client checking against attributes it cached
/// decides the same way.
pub fn access_allowed(
    kind: FileKind,
    perm: u32,
    uid: u32,
    gid: u32,
    creds: &Credentials,
    mask: u8,
) -> bool {
    if creds.uid == 0 {
        return mask & access::EXEC == 0 || kind == FileKind::Dir || perm & 0o111 != 0;
    }
    let bits = if creds.uid == uid {
        (perm >> 6) & 7
    } else if creds.in_group(gid) {
        (perm >> 3) & 7
    } else {
        perm & 7
    };
    (bits as u8) & mask == mask
}

impl Attr {
    /// `access_allowed` for this inode.
    pub fn allows(&self, creds: &Credentials, mask: u8) -> bool {
        access_allowed(self.kind, self.perm, self.uid, self.gid, creds, mask)
    }
}

/// Who is asking: the credentials a client presents with every request
/// (AUTH_SYS style). The server checks mode bits against them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, at most `limits::GROUPS_MAX`.
    pub groups: Vec<u32>,
}

impl Credentials {
    pub fn root() -> Credentials {
        Credentials {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// The credentials of the calling process.
    pub fn current_process() -> Credentials {
        // SAFETY: these libc calls take no arguments and cannot fail.
        let (uid, gid) = unsafe { (libc_geteuid(), libc_getegid()) };
        Credentials {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
    #[link_name = "getegid"]
    fn libc_getegid() -> u32;
}

/// A file name component: 1..=255 bytes, no '/' and no NUL, not "." or "..".
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct FileName(Vec<u8>);

/// Why a name or path was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NameError {
    Empty,
    TooLong,
    /// Contains '/' or NUL, or is "." or "..".
    Invalid,
}

impl FileName {
    pub fn new(bytes: &[u8]) -> Result<FileName, NameError> {
        if bytes.is_empty() {
            return Err(NameError::Empty);
        }
        if bytes.len() > limits::NAME_MAX_BYTES {
            return Err(NameError::TooLong);
        }
        if bytes == b"." || bytes == b".." || bytes.iter().any(|&b| b == b'/' || b == 0) {
            return Err(NameError::Invalid);
        }
        Ok(FileName(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl fmt::Display for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// FNV-1a over the given parts: stable across processes, versions and
/// machines (std's hasher is randomly seeded and may change between releases,
/// which would move every dentry and chunk).
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separate parts so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Final avalanche (from splitmix64) so low bits are well mixed for `% n`.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Server holding the dentry `(parent, name)`.
/// The number environment variable `name` holds (surrounding blanks
/// allowed), for the knobs tests and operators set (`MADFS_..._MS`); None
/// where it is unset or not a number.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

pub fn dentry_server(parent: InodeId, name: &FileName, servers: usize) -> ServerId {
    let h = stable_hash(&[&parent.0.to_le_bytes(), name.as_bytes()]);
    ServerId((h % servers.max(1) as u64) as u16)
}

/// Server holding chunk `index` of inode `ino`. Chunk 0 lives with the inode
/// (inline while small), so a small file is served by one server.
pub fn chunk_server(ino: InodeId, index: ChunkIndex, servers: usize) -> ServerId {
    if index.0 == 0 {
        return ino.owner();
    }
    let h = stable_hash(&[&ino.0.to_le_bytes(), &index.0.to_le_bytes()]);
    ServerId((h % servers.max(1) as u64) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_numbers_are_read_with_blanks_and_refused_otherwise() {
        std::env::set_var("MADFS_TYPES_TEST_NUMBER_A", " 250\n");
        std::env::set_var("MADFS_TYPES_TEST_NUMBER_B", "250ms");
        assert_eq!(env_number("MADFS_TYPES_TEST_NUMBER_A"), Some(250));
        assert_eq!(env_number("MADFS_TYPES_TEST_NUMBER_B"), None);
        assert_eq!(env_number("MADFS_TYPES_TEST_NUMBER_UNSET"), None);
    }

    #[test]
    fn kinds_round_trip_through_numbers_and_mode_bits() {
        for v in 1..=7u8 {
            let k = FileKind::from_u8(v).unwrap();
            assert_eq!(k as u8, v);
            assert_eq!(FileKind::from_mode(k.mode_bits() | 0o644), Some(k));
        }
        assert_eq!(FileKind::from_u8(0), None);
        assert_eq!(FileKind::from_u8(8), None);
        assert_eq!(FileKind::from_mode(0o644), Some(FileKind::File));
        assert_eq!(FileKind::from_mode(0o170000), None);
        assert!(FileKind::Fifo.is_special() && !FileKind::Fifo.is_device());
        assert!(FileKind::BlockDev.is_device() && !FileKind::File.is_special());
    }

    #[test]
    fn device_numbers_encode_as_the_kernel_and_glibc_do() {
        // glibc's makedev(1, 2) and makedev(4095, 0xfffff) fit 32 bits.
        assert_eq!(Attr::make_rdev(1, 2), Some(0x102));
        assert_eq!(Attr::make_rdev(4095, 0xf_ffff), Some(0xffff_ffff));
        assert_eq!(Attr::make_rdev(4096, 0), None);
        assert_eq!(Attr::make_rdev(0, 1 << 20), None);
        for (major, minor) in [(0, 0), (8, 1), (136, 300), (4095, 0xf_ffff)] {
            let a = Attr {
                rdev: Attr::make_rdev(major, minor).unwrap(),
                ..test_attr()
            };
            assert_eq!(a.rdev_parts(), (major, minor));
        }
    }

    fn test_attr() -> Attr {
        Attr {
            ino: InodeId(5),
            kind: FileKind::CharDev,
            perm: 0o600,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            btime: Timestamp::default(),
            rdev: 0,
        }
    }

    #[test]
    fn inode_id_carries_owner() {
        let ino = InodeId::new(ServerId(7), 12345);
        assert_eq!(ino.owner(), ServerId(7));
        assert_eq!(ino.counter(), 12345);
        assert_eq!(InodeId::ROOT.owner(), ServerId(0));
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(FileName::new(b""), Err(NameError::Empty));
        assert_eq!(FileName::new(&[b'a'; 256]), Err(NameError::TooLong));
        assert!(FileName::new(&[b'a'; 255]).is_ok());
        assert_eq!(FileName::new(b"."), Err(NameError::Invalid));
        assert_eq!(FileName::new(b".."), Err(NameError::Invalid));
        assert_eq!(FileName::new(b"a/b"), Err(NameError::Invalid));
        assert_eq!(FileName::new(b"a\0b"), Err(NameError::Invalid));
        assert!(FileName::new(b"...").is_ok());
    }

    #[test]
    fn hash_separates_parts_and_is_stable() {
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        // Pinned value: placement must never change between releases, or
        // every existing dentry and chunk would be looked for on the wrong server.
        assert_eq!(stable_hash(&[b"madfs"]), 0x9963_d0ee_fa83_e154);
    }

    #[test]
    fn dentries_spread_over_servers() {
        let mut counts = [0usize; 4];
        for i in 0..10_000 {
            let name = FileName::new(format!("file.{i}").as_bytes()).unwrap();
            counts[dentry_server(InodeId::ROOT, &name, 4).0 as usize] += 1;
        }
        for c in counts {
            assert!((2_000..3_000).contains(&c), "uneven spread {counts:?}");
        }
    }

    #[test]
    fn chunk_zero_stays_with_owner() {
        let ino = InodeId::new(ServerId(3), 9);
        assert_eq!(chunk_server(ino, ChunkIndex(0), 8), ServerId(3));
        let mut seen = std::collections::HashSet::new();
        for i in 1..200 {
            seen.insert(chunk_server(ino, ChunkIndex(i), 8));
        }
        assert_eq!(seen.len(), 8);
    }
}
