//! Hard links and link counts (`Op::AdjustLinks`, which also stamps ctime).

use crate::errors::{err, kv_err};
use crate::keys;
use crate::locks::LockKey;
use crate::perm::{self};
use crate::service::Server;
use crate::touch::DirChanges;
use madfs_kv::WriteBatch;
use madfs_proto::message::{Entry, Op, Reply};
use madfs_proto::{ErrorCode, Opcode, WireError};
use madfs_types::{Credentials, FileKind, FileName, InodeId, Timestamp};
use std::sync::Arc;

impl Server {
    pub(crate) async fn adjust_links(
        self: &Arc<Self>,
        ino: InodeId,
        delta: i32,
        hold: bool,
    ) -> Result<Reply, WireError> {
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
        // A drop sent again while its first send still waited for this
        // lock (the sender's call ran out meanwhile) passed the dispatch's
        // look for a stored reply before the first wrote one: look again,
        // under the lock, or the link goes twice (link_drops.rs).
        if let Some(id) = crate::once::running(Opcode::AdjustLinks) {
            if let Some(reply) = crate::once::answered(self.kv.as_ref(), id).map_err(kv_err)? {
                return Ok(reply);
            }
        }
        let mut inode = self.must_inode(ino)?;
        let mut b = WriteBatch::new();
        if delta == 0 {
            // No link changes: a rename moved one of its names (POSIX lets
            // rename(2) update the inode's ctime; ext4 does). An inode held
            // open after its last unlink has no name to move.
            if inode.attr.nlink > 0 {
                inode.attr.ctime = Timestamp::now();
                b.put(&keys::inode(ino), &inode.encode());
                self.kv.write(b, false).map_err(kv_err)?;
            }
            return Ok(Reply::Links {
                nlink: inode.attr.nlink,
            });
        }
        let mut held = false;
        let nlink = if delta > 0 {
            if inode.attr.nlink == 0 {
                // Held open after its last unlink: no new names (as
                // linkat of an unlinked file without O_TMPFILE).
                return Err(err(
                    ErrorCode::NotFound,
                    format!("inode {ino} has no links"),
                ));
            }
            if inode.attr.kind == FileKind::Dir {
                return Err(err(
                    ErrorCode::NotPermitted,
                    "hard links to directories are not allowed",
                ));
            }
            if inode.attr.nlink >= u32::MAX / 2 {
                return Err(err(ErrorCode::TooManyLinks, ""));
            }
            inode.attr.nlink += delta as u32;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
            inode.attr.nlink
        } else {
            let nlink;
            (nlink, held) = self.unlink_inode_holding(&mut b, &mut inode, delta, hold);
            nlink
        };
        crate::once::record(&mut b, &Reply::Links { nlink });
        // A new link is counted before its name is written elsewhere: the
        // count must outlive a power cut first, or the name outlives it.
        self.kv.write(b, delta > 0).map_err(kv_err)?;
        if nlink == 0 && !held {
            self.after_free(&inode);
        }
        Ok(Reply::Links { nlink })
    }

    pub(crate) async fn link(
        self: &Arc<Self>,
        c: &Credentials,
        ino: InodeId,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Reply, WireError> {
        self.wait_unsealed(parent).await?;
        let dir = self.dir_owner(parent).await?;
        perm::check_dir_write(&dir, c)?;
        let attr = self.attr_of(ino).await?;
        if attr.kind == FileKind::Dir {
            return Err(err(
                ErrorCode::NotPermitted,
                "hard links to directories are not allowed",
            ));
        }
        if self.load_dentry(parent, name)?.is_some() {
            return Err(err(ErrorCode::Exists, ""));
        }
        let local = ino.owner() == self.id;
        if !local {
            // Count the link first: a crash before the name is written
            // leaks a link count, never leaves a name without an inode.
            // And before the locks: a request never waits for another
            // server while it holds a directory's gate (locks.rs).
            self.call_peer(ino.owner(), adjust(ino, 1)).await?;
        }
        let linked = self.link_locked(ino, attr.kind, parent, name).await;
        if linked.is_err() && !local {
            // Undo the count, sent again until the owner answers.
            let undo = crate::link_drops::LinkDrop::new(ino, false);
            self.drop_link_durably(&undo).await;
        }
        linked
    }

    /// `link`'s name, written under the locks; a remote inode's count is
    /// already up.
    async fn link_locked(
        self: &Arc<Self>,
        ino: InodeId,
        kind: FileKind,
        parent: InodeId,
        name: &FileName,
    ) -> Result<Reply, WireError> {
        let local = ino.owner() == self.id;
        let changes = DirChanges::one(parent, 0);
        let mut lock_keys = vec![LockKey::Dentry(parent, name), LockKey::Inode(ino)];
        lock_keys.extend(changes.local_keys(self.id));
        let held = self.lock_unsealed(parent, &lock_keys).await?;
        if self.load_dentry(parent, name)?.is_some() {
            return Err(err(ErrorCode::Exists, ""));
        }
        let mut b = WriteBatch::new();
        let time = Timestamp::now();
        let tickets = self.touch_local(&mut b, &changes, time)?;
        let mut attr_out = None;
        if local {
            let mut inode = self.must_inode(ino)?;
            if inode.attr.nlink == 0 {
                return Err(err(
                    ErrorCode::NotFound,
                    format!("inode {ino} has no links"),
                ));
            }
            inode.attr.nlink += 1;
            inode.attr.ctime = Timestamp::now();
            b.put(&keys::inode(ino), &inode.encode());
            attr_out = Some(inode.attr);
        }
        Self::put_dentry(&mut b, parent, name, kind, ino);
        let entry = Entry {
            ino,
            kind,
            attr: attr_out,
        };
        crate::once::record(
            &mut b,
            &Reply::Linked {
                entry: entry.clone(),
                touched: Vec::new(),
                verifier: self.write_verifier(),
            },
        );
        self.kv.write(b, false).map_err(kv_err)?;
        drop(held);
        let touched = self.touch_queued(tickets);
        Ok(Reply::Linked {
            entry,
            touched,
            verifier: self.write_verifier(),
        })
    }
}

fn adjust(ino: InodeId, delta: i32) -> Op {
    Op::AdjustLinks {
        ino,
        delta,
        hold: false,
    }
}
