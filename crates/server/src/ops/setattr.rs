//! chmod, chown, utimens and truncate of one inode.

use crate::errors::{err, io_err, kv_err};
use crate::keys;
use crate::locks::LockKey;
use crate::perm::owner_of;
use crate::perm::{self};
use crate::service::{blocking, Server};
use madfs_kv::WriteBatch;
use madfs_proto::message::SetAttrs;
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Attr, Credentials, FileKind, InodeId, TimeSet, Timestamp};

impl Server {
    pub(crate) async fn setattr(
        &self,
        c: &Credentials,
        ino: InodeId,
        ch: SetAttrs,
    ) -> Result<Attr, WireError> {
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
        let mut inode = self.must_inode(ino)?;
        let a = &mut inode.attr;
        let owner = owner_of(a);
        let is_owner = c.uid == 0 || c.uid == a.uid;
        let now = Timestamp::now();
        if let Some(size) = ch.size {
            match a.kind {
                FileKind::Dir => return Err(err(ErrorCode::IsDir, "")),
                FileKind::File => {}
                // truncate(2) of anything else but a regular file: EINVAL.
                _ => return Err(err(ErrorCode::InvalidArgument, "")),
            }
            if size > limits::FILE_SIZE_MAX_BYTES {
                return Err(err(ErrorCode::FileTooBig, ""));
            }
            // ftruncate through a handle opened for writing was granted at
            // open (see `SetAttrs::via_writable_handle`).
            if !ch.via_writable_handle {
                perm::check(&owner, c, perm::WRITE)?;
            }
        }
        if let Some(uid) = ch.uid {
            if c.uid != 0 && uid != a.uid {
                return Err(err(
                    ErrorCode::NotPermitted,
                    "only root may change the owner",
                ));
            }
        }
        if let Some(gid) = ch.gid {
            if c.uid != 0 && (c.uid != a.uid || (!c.in_group(gid) && gid != a.gid)) {
                return Err(err(ErrorCode::NotPermitted, "not a member of that group"));
            }
        }
        if ch.perm.is_some() && !is_owner {
            return Err(err(
                ErrorCode::NotPermitted,
                "only the owner may change the mode",
            ));
        }
        for t in [ch.atime, ch.mtime] {
            match t {
                TimeSet::Omit => {}
                TimeSet::Now => {
                    if !is_owner && !perm::allowed(&owner, c, perm::WRITE) {
                        return Err(err(ErrorCode::AccessDenied, ""));
                    }
                }
                TimeSet::At(_) => {
                    if !is_owner {
                        return Err(err(ErrorCode::NotPermitted, "only the owner may set times"));
                    }
                }
            }
        }
        // Checks passed: apply.
        let mut owner_changed = false;
        if let Some(mut p) = ch.perm {
            p &= 0o7777;
            if c.uid != 0 && a.kind != FileKind::Dir && !c.in_group(a.gid) {
                p &= !0o2000; // POSIX: non-members cannot set setgid
            }
            owner_changed |= p != a.perm;
            a.perm = p;
        }
        let chown = ch.uid.is_some_and(|u| u != a.uid) || ch.gid.is_some_and(|g| g != a.gid);
        if let Some(uid) = ch.uid {
            a.uid = uid;
        }
        if let Some(gid) = ch.gid {
            a.gid = gid;
        }
        if chown || (ch.uid.is_some() || ch.gid.is_some()) && c.uid != 0 {
            owner_changed = true;
            if a.kind == FileKind::File {
                // Like Linux: a change of owner drops setuid, and setgid
                // where it means "run as group" (group exec set).
                a.perm &= !0o4000;
                if a.perm & 0o010 != 0 {
                    a.perm &= !0o2000;
                }
            }
        }
        let mut b = WriteBatch::new();
        let mut truncate_file = None;
        if let Some(size) = ch.size {
            if size < a.size {
                if inode.chunk0_in_file {
                    truncate_file = Some(size);
                } else if let Some(mut data) =
                    self.kv.get(&keys::inline_data(ino)).map_err(kv_err)?
                {
                    if (data.len() as u64) > size {
                        data.truncate(size as usize);
                        b.put(&keys::inline_data(ino), &data);
                    }
                }
            }
            let a = &mut inode.attr;
            a.size = size;
            a.mtime = now;
        }
        let a = &mut inode.attr;
        match ch.atime {
            TimeSet::Omit => {}
            TimeSet::Now => a.atime = now,
            TimeSet::At(t) => a.atime = t,
        }
        match ch.mtime {
            TimeSet::Omit => {}
            TimeSet::Now => a.mtime = now,
            TimeSet::At(t) => a.mtime = t,
        }
        a.ctime = now;
        if let Some(size) = truncate_file {
            // Chunk 0 is this server's business; the client trims the other
            // chunks on every server (TruncateChunks) before the new size.
            let (chunks, cs) = (self.chunks.clone(), self.chunk_size);
            blocking(move || chunks.truncate(ino, size, cs))
                .await
                .map_err(io_err)?;
        }
        b.put(&keys::inode(ino), &inode.encode());
        self.kv.write(b, false).map_err(kv_err)?;
        if owner_changed && inode.attr.kind == FileKind::Dir {
            self.invalidate_dir_everywhere(ino).await;
        }
        Ok(inode.attr)
    }
}
