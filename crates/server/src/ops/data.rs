//! Reads and writes of chunk data, and the sizes writes grow.

use crate::errors::{chunk_write_err, err, io_err, kv_err, OpResult};
use crate::keys;
use crate::locks::LockKey;
use crate::replication::SharedBytes;
use crate::service::{blocking, Server, SMALL_WRITE_INLINE_MAX_BYTES};
use madfs_kv::WriteBatch;
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Attr, ChunkIndex, FileKind, InodeId, Timestamp};

/// Reads served from the chunk cache on the runtime thread at most this
/// long (a copy of about 0.4 ms); longer ones copy on the blocking pool.
const CACHED_READ_INLINE_MAX_BYTES: u32 = 4 << 20;

/// Longest the owner waits for chunk servers to say how far a file's data
/// reaches before it takes a published size as sent (`size_reached`).
const EXTENT_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

impl Server {
    /// Write `data` at `offset` of chunk file `(ino, chunk)`: on this
    /// thread when short (`SMALL_WRITE_INLINE_MAX_BYTES`), else on the
    /// blocking pool.
    async fn write_chunk_file(
        &self,
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        data: SharedBytes,
    ) -> Result<(), WireError> {
        let (chunks, cs) = (self.chunks.clone(), self.chunk_size);
        if data.len() <= SMALL_WRITE_INLINE_MAX_BYTES {
            chunks.write_shared(ino, chunk, offset as u64, &data, cs)
        } else {
            blocking(move || chunks.write_shared(ino, chunk, offset as u64, &data, cs)).await
        }
        .map_err(chunk_write_err)
    }

    pub(crate) async fn read(
        &self,
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        len: u32,
    ) -> OpResult {
        if offset as u64 + len as u64 > self.chunk_size {
            return Err(err(
                ErrorCode::InvalidArgument,
                "read crosses the chunk end",
            ));
        }
        if chunk.0 == 0 {
            let inode = self.must_inode(ino)?;
            if inode.attr.kind == FileKind::Dir {
                return Err(err(ErrorCode::IsDir, ""));
            }
            if !inode.chunk0_in_file {
                let data = self
                    .kv
                    .get(&keys::inline_data(ino))
                    .map_err(kv_err)?
                    .unwrap_or_default();
                let start = (offset as usize).min(data.len());
                let end = (offset as usize + len as usize).min(data.len());
                return Ok((Reply::Data, data[start..end].to_vec()));
            }
        }
        // From the chunk cache, when it holds all of it: a copy in memory,
        // short enough for this thread, which spares the blocking pool's
        // two thread hand-offs.
        if len <= CACHED_READ_INLINE_MAX_BYTES {
            if let Some(data) = self
                .chunks
                .read_cached(ino, chunk, offset as u64, len as usize)
            {
                return Ok((Reply::Data, data));
            }
        }
        let chunks = self.chunks.clone();
        let data = blocking(move || chunks.read(ino, chunk, offset as u64, len as usize))
            .await
            .map_err(io_err)?;
        Ok((Reply::Data, data))
    }

    pub(crate) async fn write(
        &self,
        ino: InodeId,
        chunk: ChunkIndex,
        offset: u32,
        file_size: u64,
        data: Vec<u8>,
    ) -> Result<Reply, WireError> {
        let end = offset as u64 + data.len() as u64;
        if end > self.chunk_size {
            return Err(err(
                ErrorCode::InvalidArgument,
                "write crosses the chunk end",
            ));
        }
        if file_size > limits::FILE_SIZE_MAX_BYTES {
            return Err(err(ErrorCode::FileTooBig, ""));
        }
        self.check_space(data.len() as u64)?;
        let cs = self.chunk_size;
        assert!(
            end <= cs,
            "a write past its chunk would overlap the next one"
        );
        // Shared with the replication record of the write, not copied.
        let data = SharedBytes::new(data);
        if chunk.0 != 0 {
            self.write_chunk_file(ino, chunk, offset, data).await?;
            return Ok(Reply::Written {
                verifier: self.write_verifier(),
            });
        }
        // Chunk 0 lives with the inode: data and size change in one step.
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
        let mut inode = self.must_inode(ino)?;
        if inode.attr.kind != FileKind::File {
            return Err(err(ErrorCode::IsDir, "not a regular file"));
        }
        let mut b = WriteBatch::new();
        if !inode.chunk0_in_file {
            let mut inline = self
                .kv
                .get(&keys::inline_data(ino))
                .map_err(kv_err)?
                .unwrap_or_default();
            if end <= limits::INLINE_DATA_MAX_BYTES {
                if inline.len() < end as usize {
                    inline.resize(end as usize, 0);
                }
                inline[offset as usize..end as usize].copy_from_slice(&data);
                b.put(&keys::inline_data(ino), &inline);
            } else {
                // Outgrown: move chunk 0 to a file, then write there.
                let chunks = self.chunks.clone();
                blocking(move || {
                    chunks.write(ino, ChunkIndex(0), 0, &inline, cs)?;
                    chunks.write_shared(ino, ChunkIndex(0), offset as u64, &data, cs)
                })
                .await
                .map_err(io_err)?;
                inode.chunk0_in_file = true;
                b.delete(&keys::inline_data(ino));
            }
        } else {
            self.write_chunk_file(ino, ChunkIndex(0), offset, data)
                .await?;
        }
        let now = Timestamp::now();
        let before = inode.attr.size;
        inode.attr.size = inode.attr.size.max(file_size);
        // Sizes only merge upwards here (truncate is setattr's): a write
        // that shrank a file would lose data written past it.
        assert!(inode.attr.size >= before && inode.attr.size >= file_size);
        assert!(inode.attr.size <= limits::FILE_SIZE_MAX_BYTES);
        inode.attr.mtime = now;
        inode.attr.ctime = now;
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        Ok(Reply::Written {
            verifier: self.write_verifier(),
        })
    }

    pub(crate) async fn update_size(
        &self,
        ino: InodeId,
        size: u64,
        mtime: Timestamp,
    ) -> Result<Attr, WireError> {
        if size > limits::FILE_SIZE_MAX_BYTES {
            return Err(err(ErrorCode::FileTooBig, ""));
        }
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
        let mut inode = self.must_inode(ino)?;
        let before = inode.attr.size;
        // Under the inode's lock: a truncate's new size (set after its
        // chunks were cut) cannot come between the check and the update.
        let size = if size > before {
            self.size_reached(ino, before, size).await
        } else {
            size
        };
        inode.attr.size = inode.attr.size.max(size);
        assert!(inode.attr.size >= before && inode.attr.size >= size);
        inode.attr.mtime = inode.attr.mtime.max(mtime);
        inode.attr.ctime = Timestamp::now();
        let mut b = WriteBatch::new();
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        Ok(inode.attr)
    }

    /// How much of `claimed`, a size a handle publishes (the end of its
    /// writes), its data still reaches: another client may have truncated
    /// the file after those writes and before this publication, and a
    /// size merged as a maximum would then grow the file back over zeros
    /// (the handle's bytes past the cut are gone). Chunk data is the
    /// proof: the server of the chunk `claimed` ends in is asked first
    /// (one call when nothing was cut); when its data stops short, every
    /// server is asked how far the file's chunks above `known` (the
    /// owner's size) reach. A server that cannot answer leaves `claimed`
    /// as it is, as before this check. Chunk 0 lives here and its writes
    /// set the size themselves: a size within it is taken as it is.
    async fn size_reached(&self, ino: InodeId, known: u64, claimed: u64) -> u64 {
        let cs = self.chunk_size;
        let last = ChunkIndex(((claimed - 1) / cs).min(u32::MAX as u64) as u32);
        if last.0 == 0 {
            return claimed;
        }
        let server = madfs_types::chunk_server(ino, last, self.servers);
        let one = Op::ChunkExtent {
            ino,
            first: last,
            last,
        };
        let end = match tokio::time::timeout(EXTENT_WAIT_MAX, self.call_peer(server, one)).await {
            Ok(Ok(Reply::Extent { end })) if end >= claimed => return claimed,
            Ok(Ok(Reply::Extent { end })) => end,
            other => {
                tracing::debug!(
                    "extent of {ino} on server {server}: {other:?}; size taken as sent"
                );
                return claimed;
            }
        };
        let first = ChunkIndex((known / cs).min(u32::MAX as u64) as u32);
        if first.0 >= last.0 {
            // The owner's size ends in that very chunk: its server has
            // answered for the whole range already.
            return known.max(end).min(claimed);
        }
        let every = Op::ChunkExtent { ino, first, last };
        let answers = match tokio::time::timeout(EXTENT_WAIT_MAX, self.broadcast(every)).await {
            Ok(a) => a,
            Err(_) => return claimed,
        };
        let mut reached = known;
        for (server, answer) in answers {
            match answer {
                Ok(Reply::Extent { end }) => reached = reached.max(end),
                other => {
                    tracing::debug!(
                        "extent of {ino} on server {server}: {other:?}; size taken as sent"
                    );
                    return claimed;
                }
            }
        }
        if reached < claimed {
            tracing::debug!(
                "size {claimed} published for {ino}, but its chunks reach {reached}: \
                 truncated after those writes"
            );
        }
        reached.min(claimed)
    }

    /// Answer a `ChunkExtent` from this server's chunk store.
    pub(crate) async fn chunk_extent_local(
        &self,
        ino: InodeId,
        first: ChunkIndex,
        last: ChunkIndex,
    ) -> OpResult {
        let chunks = self.chunks.clone();
        let cs = self.chunk_size;
        let end = blocking(move || chunks.extent(ino, first, last, cs))
            .await
            .map_err(io_err)?;
        Ok((Reply::Extent { end }, Vec::new()))
    }
}
