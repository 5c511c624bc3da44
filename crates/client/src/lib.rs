//! MadFS client library: everything a program needs to use a MadFS cluster
//! without mounting it.
//!
//! Three levels, each built on the one below:
//! - [`Client`]: inode-level operations, one or a few RPCs each, placed on the
//!   right server by the shared placement functions (what the FUSE adapter
//!   calls);
//! - [`File`] and the path-level methods on [`Client`] (`stat`, `open`,
//!   `mkdir_all`, ...): path resolution and open-file bookkeeping (what the
//!   CLI and the preload library call);
//! - [`BlockingClient`] / [`BlockingFile`]: the same API for plain threads,
//!   driving a private tokio runtime.
//!
//! Naming: inode-level methods are named after the syscalls they serve
//! (`lookup`, `unlink`, `readdir`, ...); where a path-level method wants the
//! same name, the inode-level one takes the `*at` syscall's name, since it
//! too works on (directory, name): `mkdir_at`, `symlink_at`, `rename_at`.
//! Path-level methods follow `std::fs` where it has a name (`remove_file`,
//! `read_dir`, `hard_link`, ...).

mod blocking;
mod cache;
mod chunk;
mod client;
mod counts;
mod dir;
mod error;
mod file;
mod find;
mod fsck;
mod open_files;
mod path;
mod touched;
mod unsynced;
pub mod writebehind;

pub use blocking::{BlockingClient, BlockingFile};
pub use cache::{parse_ttl, CacheConfig, CacheStats};
pub use chunk::{split_range, Piece};
pub use client::{Client, ClusterRoutes, WriteOutcome};
pub use counts::RequestCounts;
pub use dir::DirCursor;
pub use error::{ClientError, Result};
pub use file::{File, OpenOptions};
pub use find::{parse_size, parse_type, DuTotals, FindOutput, Found};
pub use fsck::{
    DanglingName, InodeCheck, LinkCheck, MissingDir, Repair, UnreachedDir, WrongInode, WrongLinks,
    LOST_FOUND,
};
pub use madfs_proto::find::{glob_match, FindAttrs, FindQuery, SizeCmp, SizeTest};
pub use path::{normalize, AsFsPath, ParsedPath, PathComponent, SYMLINK_FOLLOW_MAX};
pub use unsynced::Unsynced;

// Re-exported so users need not depend on the lower crates for the types
// that appear in this crate's signatures.
pub use madfs_proto::auth::ClusterKey;
pub use madfs_proto::message::{
    DirEntry, FsStats, Rebuild, RebuildPhase, SetAttrs, ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE,
    RENAME_EXCHANGE, RENAME_NOREPLACE,
};
pub use madfs_proto::{ErrorCode, Opcode};
pub use madfs_rpc::pool::Timeouts;
pub use madfs_rpc::ClusterConfig;
pub use madfs_types::{
    limits, Attr, ChunkIndex, Credentials, FileKind, FileName, InodeId, ServerId, TimeSet,
    Timestamp,
};
