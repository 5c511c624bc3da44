//! Name lookups, open (a lookup that returns a small file's bytes), and
//! directory listings.

use crate::errors::{err, kv_err, OpResult};
use crate::inode::decode_dentry;
use crate::keys;
use crate::perm::{self};
use crate::service::Server;
use madfs_proto::message::{DirEntry, Entry, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Credentials, FileKind, FileName, InodeId};

impl Server {
    pub(crate) async fn lookup(
        &self,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Reply, WireError> {
        let dir = self.dir_owner(parent).await?;
        perm::check(&dir, c, perm::EXEC)?;
        let (kind, ino) = self
            .load_dentry(parent, name)?
            .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
        let attr = if ino.owner() == self.id {
            self.load_inode(ino)?.map(|i| i.attr)
        } else {
            None
        };
        Ok(Reply::Entry(Entry { ino, kind, attr }))
    }

    /// `lookup`, with the bytes of a small inline file along (see
    /// `Op::Open`): exactly its size in bytes, or none.
    pub(crate) async fn open_lookup(
        &self,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        data_max: u32,
    ) -> OpResult {
        let reply = self.lookup(c, parent, name).await?;
        let Reply::Entry(Entry {
            attr: Some(attr), ..
        }) = &reply
        else {
            return Ok((reply, Vec::new()));
        };
        let limit = (data_max as u64)
            .min(limits::INLINE_DATA_MAX_BYTES)
            .min(self.chunk_size);
        if attr.kind != FileKind::File || attr.size == 0 || attr.size > limit {
            return Ok((reply, Vec::new()));
        }
        let ino = attr.ino;
        let mut data = self
            .kv
            .get(&keys::inline_data(ino))
            .map_err(kv_err)?
            .unwrap_or_default();
        // The attributes and the bytes must describe one version of the
        // file. A write to chunk 0 changes both (size or mtime, and the
        // bytes) in one batch, and a later read sees every batch an earlier
        // one saw: if the record read after the bytes still matches the
        // one the lookup read before them, no write came between.
        match self.load_inode(ino)? {
            Some(now) if !now.chunk0_in_file && now.attr == *attr => {}
            _ => return Ok((reply, Vec::new())),
        }
        // Bytes past the stored ones (a truncate that extended) are zeros.
        data.resize(attr.size as usize, 0);
        Ok((reply, data))
    }

    pub(crate) async fn readdir(
        &self,
        c: &Credentials,
        dir: InodeId,
        after: Option<FileName>,
        max: u32,
    ) -> Result<Reply, WireError> {
        let owner = self.dir_owner(dir).await?;
        perm::check(&owner, c, perm::READ)?;
        let max = max.clamp(1, limits::READDIR_PAGE_ENTRIES_MAX) as usize;
        let prefix = keys::dentry_prefix(dir);
        let start = match &after {
            None => prefix.clone(),
            Some(n) => {
                let mut k = keys::dentry(dir, n);
                k.push(0); // the first key after `n`
                k
            }
        };
        let rows = self.kv.scan(&prefix, &start, max + 1).map_err(kv_err)?;
        let more = rows.len() > max;
        let mut entries = Vec::with_capacity(rows.len().min(max));
        for (k, v) in rows.into_iter().take(max) {
            let name = FileName::new(&k[prefix.len()..])
                .map_err(|_| err(ErrorCode::Io, "corrupt dentry key"))?;
            let (kind, ino) =
                decode_dentry(&v).ok_or_else(|| err(ErrorCode::Io, "corrupt dentry"))?;
            entries.push(DirEntry { name, ino, kind });
        }
        Ok(Reply::DirPage { entries, more })
    }
}
