//! What `madfs fsck` asks of an owner (client fsck.rs): the inodes it
//! owns with their link counts (`Op::ListInodes`), and the repairs of a
//! count the check found wrong (`Op::FixDirLinks` for a directory,
//! `Op::FixFileLinks` for anything else, which frees an inode no name
//! reaches). Root only. A repair is a compare-and-set on the count under
//! the inode's lock: the count must still be the one the check saw, so a
//! link or unlink since (each changes the count on the owner, under the
//! same lock) makes it answer EBUSY and change nothing.

use crate::errors::{err, kv_err};
use crate::keys;
use crate::locks::LockKey;
use crate::service::Server;
use madfs_kv::WriteBatch;
use madfs_proto::message::{InodeLinks, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Credentials, FileKind, InodeId};
use std::sync::Arc;

fn root_only(c: &Credentials, what: &str) -> Result<(), WireError> {
    if c.uid != 0 {
        return Err(err(
            ErrorCode::NotPermitted,
            format!("only root may {what}"),
        ));
    }
    Ok(())
}

/// A repair's compare-and-set: the count `nlink` must still be the one
/// the check saw (`seen`), or already `want` (a retry of one done); else
/// EBUSY, a link or unlink came meanwhile.
fn as_checked(what: &str, nlink: u32, seen: u32, want: u32) -> Result<(), WireError> {
    if nlink == seen || nlink == want {
        return Ok(());
    }
    Err(err(
        ErrorCode::Busy,
        format!("the link count of {what} changed meanwhile ({seen} when checked, {nlink} now)"),
    ))
}

impl Server {
    /// `Op::FixDirLinks` (`madfs fsck --repair`, client fsck.rs): set
    /// directory `dir`'s link count to `want` if it is still `seen`, the
    /// count the check found wrong; a count changed meanwhile (a mkdir or
    /// rmdir since) is left alone and answered with EBUSY; one already
    /// `want` (a retry) is answered as done. Root only; synced, as a
    /// repair should outlast the next power cut. ctime is left alone
    /// (e2fsck's repairs do not stamp it either).
    pub(crate) async fn fix_dir_links(
        self: &Arc<Self>,
        c: &Credentials,
        dir: InodeId,
        seen: u32,
        want: u32,
    ) -> Result<Reply, WireError> {
        root_only(c, "set a directory's link count")?;
        if want < 2 {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!("a directory has at least 2 links, not {want}"),
            ));
        }
        let _g = self.locks.lock(&[LockKey::Inode(dir)]).await?;
        let mut inode = self.must_inode(dir)?;
        if inode.attr.kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, format!("inode {dir}")));
        }
        // Already `want`: a retry of one that was done.
        as_checked(&format!("directory {dir}"), inode.attr.nlink, seen, want)?;
        if inode.attr.nlink != want {
            inode.attr.nlink = want;
            let mut b = WriteBatch::new();
            b.put(&keys::inode(dir), &inode.encode());
            self.kv.write(b, true).map_err(kv_err)?;
        }
        Ok(Reply::Attr(inode.attr))
    }

    /// `Op::ListInodes`: up to `max_entries` (at most `INODE_PAGE_MAX`) of
    /// this server's inodes after `after`, in id order, each with its kind
    /// and link count. Inodes held open after their last unlink (no links,
    /// a HELD record) are left out; one without links and not held is a
    /// leak and listed.
    /// The first page also counts the link drops and renames this server
    /// has still to finish (LDRP, RNTX records): until they are done, a
    /// count may differ from the names for a while, and a repair would
    /// make it wrong when they land.
    pub(crate) async fn list_inodes(
        self: &Arc<Self>,
        c: &Credentials,
        after: Option<InodeId>,
        max_entries: u32,
    ) -> Result<Reply, WireError> {
        root_only(c, "list every inode")?;
        let max = max_entries.clamp(1, limits::INODE_PAGE_MAX) as usize;
        let start = match after {
            Some(a) => {
                let mut k = keys::inode(a);
                k.push(0);
                k
            }
            None => keys::INODE.to_vec(),
        };
        let kv = self.kv.clone();
        let scanned = crate::service::blocking(move || {
            let mut pending = 0u64;
            if after.is_none() {
                for prefix in [&keys::LINK_DROP[..], &keys::RENAME_INTENT[..]] {
                    kv.scan_visit(prefix, prefix, &mut |_, _| {
                        pending += 1;
                        true
                    })
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                }
            }
            let mut inodes = Vec::new();
            let mut more = false;
            let mut bad = None;
            // Without links and not held: nothing will ever free it.
            let is_held = |ino| kv.get(&keys::held(ino)).map_or(true, |h| h.is_some());
            kv.scan_visit(keys::INODE, &start, &mut |k, v| {
                if inodes.len() == max {
                    more = true;
                    return false;
                }
                let Some(ino) = keys::ino_from_key(k) else {
                    return true;
                };
                match crate::inode::Inode::decode(v) {
                    Ok(inode) if inode.attr.nlink > 0 || !is_held(ino) => inodes.push(InodeLinks {
                        ino,
                        kind: inode.attr.kind,
                        nlink: inode.attr.nlink,
                    }),
                    Ok(_) => {}
                    Err(e) => {
                        bad = Some(format!("inode {ino} does not decode: {e}"));
                        return false;
                    }
                }
                true
            })
            .map_err(|e| std::io::Error::other(e.to_string()))?;
            Ok((inodes, more, pending, bad))
        })
        .await
        .map_err(|e| err(ErrorCode::Io, format!("listing inodes: {e}")))?;
        let (inodes, more, pending, bad) = scanned;
        if let Some(bad) = bad {
            return Err(err(ErrorCode::Io, bad));
        }
        Ok(Reply::InodePage {
            inodes,
            more,
            pending,
        })
    }

    /// `Op::FixFileLinks`: set the link count of `ino` (any kind but a
    /// directory) to `want`, the names the check counted, if it is still
    /// `seen`; one already `want` (a retry) is answered as done. `want` 0
    /// frees the inode and its chunks, as a last unlink does: no name
    /// reaches it (a leak a crash left, docs/ARCHITECTURE.md "Other
    /// multi-server operations and what a crash leaves"). Synced; ctime is
    /// left alone.
    pub(crate) async fn fix_file_links(
        self: &Arc<Self>,
        c: &Credentials,
        ino: InodeId,
        seen: u32,
        want: u32,
    ) -> Result<Reply, WireError> {
        root_only(c, "set a file's link count")?;
        let _g = self.locks.lock(&[LockKey::Inode(ino)]).await?;
        let mut inode = match self.must_inode(ino) {
            // Freed already: a retry of one that was done.
            Err(e) if e.code == ErrorCode::NotFound && want == 0 => {
                return Ok(Reply::Links { nlink: 0 })
            }
            found => found?,
        };
        if inode.attr.kind == FileKind::Dir {
            return Err(err(
                ErrorCode::IsDir,
                format!("inode {ino}: a directory's count is fixed with FixDirLinks"),
            ));
        }
        as_checked(&format!("inode {ino}"), inode.attr.nlink, seen, want)?;
        if inode.attr.nlink == want && want > 0 {
            return Ok(Reply::Links { nlink: want });
        }
        if inode.attr.nlink == 0 && self.kv.get(&keys::held(ino)).map_err(kv_err)?.is_some() {
            return Err(err(
                ErrorCode::Busy,
                format!("inode {ino} is held open by a client since its last unlink"),
            ));
        }
        let mut b = WriteBatch::new();
        if want == 0 {
            // `seen` is the inode's count (checked above), which a link
            // never takes past u32::MAX / 2.
            let drop = i32::try_from(seen).map_err(|_| {
                err(
                    ErrorCode::InvalidArgument,
                    format!("link count {seen} out of range"),
                )
            })?;
            let (nlink, held) = self.unlink_inode_holding(&mut b, &mut inode, -drop, false);
            assert!(nlink == 0 && !held, "a leaked inode was not freed");
            self.kv.write(b, true).map_err(kv_err)?;
            self.after_free(&inode);
        } else {
            inode.attr.nlink = want;
            b.put(&keys::inode(ino), &inode.encode());
            self.kv.write(b, true).map_err(kv_err)?;
        }
        Ok(Reply::Links { nlink: want })
    }
}
