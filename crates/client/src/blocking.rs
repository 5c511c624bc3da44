//! `BlockingClient` and `BlockingFile`: the client API for callers on plain
//! threads that have no tokio runtime. Each method drives the same-named
//! async method of `Client` or `File` to completion on a runtime the
//! blocking client owns: two worker threads (`connect`, `from_config`,
//! `from_client`), or none (`connect_single_threaded`: the calling thread
//! drives the sockets itself while it waits).
//!
//! Used by the benchmark's ranks (crates/bench, engine.rs) and by tests.
//! The FUSE mount, the interception library and the CLI call the async
//! `Client` on runtimes of their own (the mount's reader threads and task
//! pool, the interception library's current-thread runtime, one per CLI
//! command).
//!
//! Must not be called from inside a tokio runtime (block_on would panic
//! there); and the last clone must be dropped outside one too, since that
//! shuts the runtime down.

use crate::client::{Client, WriteOutcome};
use crate::dir::DirCursor;
use crate::error::{ClientError, Result};
use crate::file::{File, OpenOptions};
use crate::path::AsFsPath;
use madfs_proto::auth::ClusterKey;
use madfs_proto::message::{DirEntry, FsStats, SetAttrs};
use madfs_proto::ErrorCode;
use madfs_rpc::ClusterConfig;
use madfs_types::{Attr, Credentials, FileName, InodeId, ServerId, TimeSet, Timestamp};
use std::path::Path;
use std::sync::Arc;
use tokio::runtime::Runtime;

/// Worker threads of the private runtime: the work is waiting on sockets,
/// so two keep the reader tasks responsive without costing a thread per core
/// in every process the preload library is loaded into.
const RUNTIME_WORKERS: usize = 2;

/// Define blocking methods that run the same-named async method of
/// `self.$field` on the runtime.
macro_rules! blocking_mirror {
    ($field:ident; $( $(#[$m:meta])* fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty; )*) => {
        $(
            $(#[$m])*
            pub fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.rt.block_on(self.$field.$name($($arg),*))
            }
        )*
    };
}

/// A blocking client. Cheap to clone; clones share the runtime and the
/// connections.
#[derive(Clone, Debug)]
pub struct BlockingClient {
    rt: Arc<Runtime>,
    client: Client,
}

impl BlockingClient {
    /// As `Client::connect`, with a private runtime.
    pub fn connect(cluster_file: Option<&Path>) -> Result<BlockingClient> {
        BlockingClient::from_client(Client::connect(cluster_file)?)
    }

    pub fn from_config(cfg: &ClusterConfig, key: ClusterKey) -> Result<BlockingClient> {
        BlockingClient::from_client(Client::from_config(cfg, key)?)
    }

    /// As `connect`, on a runtime without threads of its own: the calling
    /// thread waits on the sockets itself, so a reply wakes it directly
    /// instead of waking a runtime worker that then wakes it (one
    /// cross-core wakeup less per request). For single-threaded callers
    /// that call often (benchmark ranks). Background work (write-behind
    /// writes, a dropped file's size update) runs only during later calls,
    /// and a caller that computes for longer than the call timeout between
    /// calls may see a request that was answered in time reported as
    /// timed out.
    pub fn connect_single_threaded(cluster_file: Option<&Path>) -> Result<BlockingClient> {
        BlockingClient::wrap_client(Client::connect(cluster_file)?, false)
    }

    /// Wrap an async client in a new runtime (its connections must not have
    /// been opened on another runtime that may go away).
    pub fn from_client(client: Client) -> Result<BlockingClient> {
        BlockingClient::wrap_client(client, true)
    }

    fn wrap_client(client: Client, with_workers: bool) -> Result<BlockingClient> {
        let mut builder = if with_workers {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(RUNTIME_WORKERS);
            b
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let rt = builder
            .thread_name("madfs-client")
            .enable_all()
            .build()
            .map_err(|e| {
                ClientError::new(
                    ErrorCode::Io,
                    format!("cannot start the client runtime: {e}"),
                )
            })?;
        Ok(BlockingClient {
            rt: Arc::new(rt),
            client,
        })
    }

    /// Same connections and runtime, other credentials.
    pub fn with_credentials(&self, creds: Credentials) -> BlockingClient {
        BlockingClient {
            rt: self.rt.clone(),
            client: self.client.with_credentials(creds),
        }
    }

    /// The async client, for callers that want to run futures themselves.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    pub fn credentials(&self) -> &Credentials {
        self.client.credentials()
    }

    pub fn chunk_size(&self) -> u64 {
        self.client.chunk_size()
    }

    pub fn server_count(&self) -> usize {
        self.client.server_count()
    }

    pub fn request_counts(&self) -> crate::RequestCounts {
        self.client.request_counts()
    }

    fn wrap(&self, file: File) -> BlockingFile {
        BlockingFile {
            rt: self.rt.clone(),
            file,
        }
    }

    pub fn open(&self, path: impl AsFsPath, opts: OpenOptions) -> Result<BlockingFile> {
        let file = self.rt.block_on(self.client.open(path, opts))?;
        Ok(self.wrap(file))
    }

    pub fn open_inode(&self, ino: InodeId, opts: &OpenOptions) -> Result<BlockingFile> {
        let file = self.rt.block_on(self.client.open_inode(ino, opts))?;
        Ok(self.wrap(file))
    }

    /// A handle on an inode whose access check the caller has done.
    pub fn file(&self, attr: Attr, opts: &OpenOptions) -> BlockingFile {
        self.wrap(File::new(&self.client, attr, opts))
    }

    blocking_mirror! { client;
        // Inode level.
        fn lookup(&self, parent: InodeId, name: &FileName) -> Result<Attr>;
        fn getattr(&self, ino: InodeId) -> Result<Attr>;
        fn fstat(&self, ino: InodeId) -> Result<Attr>;
        fn setattr(&self, ino: InodeId, changes: SetAttrs) -> Result<Attr>;
        fn setattr_known_size(&self, ino: InodeId, changes: SetAttrs, known_size: u64) -> Result<Attr>;
        fn access(&self, ino: InodeId, mask: u8) -> Result<Attr>;
        fn create(&self, parent: InodeId, name: &FileName, perm: u32, exclusive: bool) -> Result<(Attr, bool)>;
        fn create_with_data(&self, parent: InodeId, name: &FileName, perm: u32, data: &[u8]) -> Result<Attr>;
        fn mkdir_at(&self, parent: InodeId, name: &FileName, perm: u32) -> Result<Attr>;
        fn symlink_at(&self, parent: InodeId, name: &FileName, target: &[u8]) -> Result<Attr>;
        fn unlink(&self, parent: InodeId, name: &FileName) -> Result<()>;
        fn rmdir(&self, parent: InodeId, name: &FileName) -> Result<()>;
        fn rename_at(&self, src_parent: InodeId, src_name: &FileName, dst_parent: InodeId, dst_name: &FileName, flags: u32) -> Result<()>;
        fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &FileName) -> Result<Attr>;
        fn readlink(&self, ino: InodeId) -> Result<Vec<u8>>;
        fn readdir_page(&self, dir: InodeId, cursor: &DirCursor, max_per_server: u32) -> Result<(Vec<DirEntry>, DirCursor)>;
        fn readdir(&self, dir: InodeId) -> Result<Vec<DirEntry>>;
        fn statfs(&self) -> Result<FsStats>;
        fn server_stats(&self) -> Vec<(ServerId, Result<FsStats>)>;
        fn read(&self, ino: InodeId, offset: u64, len: usize, file_size: u64) -> Result<Vec<u8>>;
        fn write(&self, ino: InodeId, offset: u64, data: &[u8]) -> Result<WriteOutcome>;
        fn update_size(&self, ino: InodeId, size: u64, mtime: Timestamp) -> Result<Attr>;
        fn fsync_servers(&self, servers: &[ServerId]) -> Result<()>;
        fn fsync_all(&self) -> Result<()>;
        // Path level.
        fn resolve(&self, path: impl AsFsPath, follow_last: bool) -> Result<Attr>;
        fn stat(&self, path: impl AsFsPath) -> Result<Attr>;
        fn lstat(&self, path: impl AsFsPath) -> Result<Attr>;
        fn exists(&self, path: impl AsFsPath) -> Result<bool>;
        fn resolve_parent(&self, path: impl AsFsPath) -> Result<(Attr, FileName)>;
        fn check_access(&self, path: impl AsFsPath, mask: u8) -> Result<Attr>;
        fn mkdir(&self, path: impl AsFsPath, perm: u32) -> Result<Attr>;
        fn mkdir_all(&self, path: impl AsFsPath, perm: u32) -> Result<Attr>;
        fn remove_file(&self, path: impl AsFsPath) -> Result<()>;
        fn remove_dir(&self, path: impl AsFsPath) -> Result<()>;
        fn remove_dir_all(&self, path: impl AsFsPath) -> Result<()>;
        fn rename(&self, from: impl AsFsPath, to: impl AsFsPath) -> Result<()>;
        fn rename_with_flags(&self, from: impl AsFsPath, to: impl AsFsPath, flags: u32) -> Result<()>;
        fn hard_link(&self, existing: impl AsFsPath, new: impl AsFsPath) -> Result<Attr>;
        fn symlink(&self, target: impl AsFsPath, link_path: impl AsFsPath) -> Result<Attr>;
        fn read_link(&self, path: impl AsFsPath) -> Result<Vec<u8>>;
        fn read_dir(&self, path: impl AsFsPath) -> Result<Vec<DirEntry>>;
        fn set_permissions(&self, path: impl AsFsPath, mode: u32) -> Result<Attr>;
        fn chown(&self, path: impl AsFsPath, uid: Option<u32>, gid: Option<u32>) -> Result<Attr>;
        fn set_times(&self, path: impl AsFsPath, atime: TimeSet, mtime: TimeSet) -> Result<Attr>;
        fn truncate(&self, path: impl AsFsPath, size: u64) -> Result<Attr>;
        fn write_file(&self, path: impl AsFsPath, data: &[u8]) -> Result<()>;
        fn read_file(&self, path: impl AsFsPath) -> Result<Vec<u8>>;
    }
}

/// A blocking open file. Dropping it publishes a pending size (as `close`
/// does) when dropped outside a runtime, so a forgotten close loses no data.
#[derive(Debug)]
pub struct BlockingFile {
    rt: Arc<Runtime>,
    file: File,
}

impl BlockingFile {
    pub fn ino(&self) -> InodeId {
        self.file.ino()
    }

    pub fn attr(&self) -> Attr {
        self.file.attr()
    }

    pub fn size(&self) -> u64 {
        self.file.size()
    }

    pub fn dirty_servers(&self) -> Vec<ServerId> {
        self.file.dirty_servers()
    }

    /// The async file, for callers that run futures themselves.
    pub fn file(&self) -> &File {
        &self.file
    }

    blocking_mirror! { file;
        fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>>;
        fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize>;
        fn write_owned(&self, offset: u64, data: Vec<u8>) -> Result<usize>;
        fn fsync(&self) -> Result<()>;
        fn set_len(&self, size: u64) -> Result<Attr>;
        fn close(&self) -> Result<()>;
    }
}

impl Drop for BlockingFile {
    fn drop(&mut self) {
        // With write-behind, writes may still be in flight (and, on a
        // current-thread runtime, not even sent): close waits for them.
        if tokio::runtime::Handle::try_current().is_err()
            && (self.file.needs_size_update() || self.file.writes_behind())
        {
            let _ = self.rt.block_on(self.file.close());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_types_are_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<BlockingClient>();
        assert_send_sync::<BlockingFile>();
    }
}
