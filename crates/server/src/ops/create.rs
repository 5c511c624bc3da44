//! Create, mknod and the inode numbers they take.

use crate::errors::{err, kv_err};
use crate::inode::Inode;
use crate::keys;
use crate::locks::LockKey;
use crate::perm::{self};
use crate::service::Server;
use crate::touch::DirChanges;
use madfs_kv::WriteBatch;
use madfs_proto::message::{Entry, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Credentials, FileKind, FileName, InodeId};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Server {
    pub(crate) fn alloc_ino(&self) -> Result<InodeId, WireError> {
        let n = self.inode_counter.next(self.kv.as_ref()).map_err(kv_err)?;
        if n > (1u64 << 48) - 2 {
            return Err(err(
                ErrorCode::NoSpace,
                "inode numbers exhausted on this server",
            ));
        }
        Ok(InodeId::new(self.id, n))
    }

    /// mknod(2): a FIFO, socket, device node or regular file that must
    /// not exist yet.
    pub(crate) async fn mknod(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm_bits: u32,
        rdev: u32,
    ) -> Result<Reply, WireError> {
        if !kind.is_special() && kind != FileKind::File {
            return Err(err(
                ErrorCode::InvalidArgument,
                "mknod makes FIFOs, sockets, devices and regular files",
            ));
        }
        if kind.is_device() && c.uid != 0 {
            // Linux asks CAP_MKNOD; root is the only one here.
            return Err(err(
                ErrorCode::NotPermitted,
                "only root may make device nodes",
            ));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        self.create(
            c,
            parent,
            name,
            kind,
            perm_bits,
            true,
            Vec::new(),
            Vec::new(),
            rdev,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        kind: FileKind,
        perm_bits: u32,
        exclusive: bool,
        target: Vec<u8>,
        data: Vec<u8>,
        rdev: u32,
    ) -> Result<Reply, WireError> {
        if !data.is_empty() {
            if kind != FileKind::File || !exclusive {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    "only an exclusive create of a regular file carries data",
                ));
            }
            if data.len() as u64 > limits::INLINE_DATA_MAX_BYTES {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    "data with a create is at most the inline limit (64 KiB)",
                ));
            }
        }
        if kind == FileKind::Symlink
            && (target.is_empty() || target.len() > limits::SYMLINK_MAX_BYTES)
        {
            return Err(err(
                ErrorCode::InvalidArgument,
                "symlink target must be 1 to 4095 bytes",
            ));
        }
        self.wait_unsealed(parent).await?;
        let dir = self.dir_owner(parent).await?;
        let changes = DirChanges::one(parent, i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(parent, name)];
        lock_keys.extend(changes.local_keys(self.id));
        let held = self.lock_unsealed(parent, &lock_keys).await?;
        if let Some((ekind, eino)) = self.load_dentry(parent, name)? {
            perm::check(&dir, c, perm::EXEC)?;
            if exclusive || kind != FileKind::File {
                return Err(err(ErrorCode::Exists, ""));
            }
            if ekind == FileKind::Dir {
                return Err(err(ErrorCode::IsDir, ""));
            }
            let attr = if eino.owner() == self.id {
                self.load_inode(eino)?.map(|i| i.attr)
            } else {
                None
            };
            return Ok(Reply::Created {
                entry: Entry {
                    ino: eino,
                    kind: ekind,
                    attr,
                },
                created: false,
                touched: Vec::new(),
                verifier: self.write_verifier(),
            });
        }
        perm::check_dir_write(&dir, c)?;
        self.check_space(data.len() as u64)?;
        let ino = self.alloc_ino()?;
        // setgid directories pass their group (and, to subdirectories, the bit) on.
        let (gid, mut bits) = if dir.perm & 0o2000 != 0 {
            (
                dir.gid,
                if kind == FileKind::Dir {
                    perm_bits | 0o2000
                } else {
                    perm_bits
                },
            )
        } else {
            (c.gid, perm_bits)
        };
        if kind == FileKind::Symlink {
            bits = 0o777;
        }
        let mut inode = Inode::new(ino, kind, bits, c.uid, gid, target);
        inode.attr.rdev = rdev;
        let mut b = WriteBatch::new();
        if !data.is_empty() {
            // The inode is ours (we allocated it), so chunk 0 is too.
            inode.attr.size = data.len() as u64;
            b.put(&keys::inline_data(ino), &data);
        }
        b.put(&keys::inode(ino), &inode.encode());
        if kind == FileKind::Dir {
            Self::put_dir_parent(&mut b, ino, parent);
        }
        Self::put_dentry(&mut b, parent, name, kind, ino);
        let now = inode.attr.ctime;
        let tickets = self.touch_local(&mut b, &changes, now)?;
        let entry = Entry {
            ino,
            kind,
            attr: Some(inode.attr.clone()),
        };
        crate::once::record(
            &mut b,
            &Reply::Created {
                entry: entry.clone(),
                created: true,
                touched: Vec::new(),
                verifier: self.write_verifier(),
            },
        );
        // Other servers may put entries into a new directory at once: it
        // must outlive a power cut first, or they outlive it.
        self.kv.write(b, kind == FileKind::Dir).map_err(kv_err)?;
        drop(held);
        self.inode_count.fetch_add(1, Ordering::Relaxed);
        let touched = self.touch_queued(tickets);
        Ok(Reply::Created {
            entry,
            created: true,
            touched,
            verifier: self.write_verifier(),
        })
    }
}
