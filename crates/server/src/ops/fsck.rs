//! What `madfs fsck` asks of an owner (client fsck.rs): the inodes it
//! owns with their link counts (`Op::ListInodes`), and the repairs of a
//! count the check found wrong (`Op::FixDirLinks` for a directory,
//! `Op::FixFileLinks` for anything else, which frees an inode no name
//! reaches). Root only. A repair is a compare-and-set on the count under
//! the inode's lock: the count must still be the one the check saw, so a
//! link or unlink since (each changes the count on the owner, under the
//! same lock) makes it answer EBUSY and change nothing.
//!
//! The three repairs of the namespace itself, each one batch on one
//! server: an inode no name reaches gets one in the lost+found
//! (`Op::Adopt`), a name whose inode does not exist goes (`Op::DropName`),
//! and a directory that names are in but whose inode is gone is made
//! again (`Op::RemakeDir`).

use crate::errors::{err, kv_err};
use crate::keys;
use crate::locks::LockKey;
use crate::service::Server;
use crate::touch::DirChanges;
use madfs_kv::WriteBatch;
use madfs_proto::message::{Entry, InodeLinks, Reply};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{limits, Credentials, FileKind, FileName, InodeId, Timestamp};
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
    /// The first page also counts the link drops, renames, directory
    /// removals and directory moves this server has still to finish
    /// (LDRP, RNTX, RMDR, DPPN records): until they are done, a count may
    /// differ from the names for a while (and a directory may have no
    /// name), and a repair would make it wrong when they land.
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
        if after.is_none() {
            // What is left of finished removals: only unfinished ones count.
            self.clear_removal_records();
        }
        let kv = self.kv.clone();
        let scanned = crate::service::blocking(move || {
            let mut pending = 0u64;
            if after.is_none() {
                for prefix in [
                    &keys::LINK_DROP[..],
                    &keys::RENAME_INTENT[..],
                    &keys::DIR_REMOVAL[..],
                    &keys::DIR_PARENT_PENDING[..],
                ] {
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
    /// multi-server operations and what a crash leaves"); so it frees an
    /// empty directory no name reaches too. Synced; ctime is left alone.
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
        // An empty directory no name reaches (an rmdir whose last step a
        // power cut undid on this owner) is freed the same way; the client
        // found it empty on every server.
        if inode.attr.kind == FileKind::Dir && want != 0 {
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

    /// `Op::Adopt`: give inode `ino` (owned here), which the check found
    /// no name reaching in two passes, the name `name` in `into` (the
    /// lost+found), which must be held here too: the name, a directory's
    /// parent record or a file's link count (then 1), and (when `into` is
    /// also here) the lost+found's count are one batch, synced; a
    /// lost+found elsewhere has its count and times changed by a touch,
    /// as after a mkdir. Anything but a directory must still have the
    /// count `seen` exactly (a link since is EBUSY, and so is an
    /// adoption of one that has a name now). A name already naming `ino`
    /// (a retry) is answered as done. The client adopts only while no
    /// server has a removal, move or rename unfinished (`list_inodes`'
    /// pending count): an rmdir removes the name first and the directory
    /// after, so a directory with a removal under way has no name for a
    /// while.
    pub(crate) async fn adopt(
        self: &Arc<Self>,
        c: &Credentials,
        ino: InodeId,
        into: InodeId,
        name: &FileName,
        seen: u32,
    ) -> Result<Reply, WireError> {
        root_only(c, "give an inode a new name")?;
        if !self.holds_dentry(into, name) || ino.owner() != self.id {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!(
                    "server {}: adopting inode {ino} as {name} in {into} needs both here",
                    self.id
                ),
            ));
        }
        if ino == into || ino == InodeId::ROOT {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!("inode {ino} cannot be adopted into {into}"),
            ));
        }
        self.wait_unsealed(into).await?;
        let lost_found = self.dir_owner(into).await?;
        if lost_found.kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, format!("inode {into}")));
        }
        let kind = self.must_inode(ino)?.attr.kind;
        let changes = DirChanges::one(into, i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(into, name), LockKey::Inode(ino)];
        lock_keys.extend(changes.local_keys(self.id));
        let held = self.lock_unsealed(into, &lock_keys).await?;
        // (An inode's kind never changes: `changes` holds.)
        let mut inode = self.must_inode(ino)?;
        match self.load_dentry(into, name)? {
            Some(named) if named == (kind, ino) => {
                return Ok(Reply::Created {
                    entry: Entry {
                        ino,
                        kind,
                        attr: Some(inode.attr.clone()),
                    },
                    created: false,
                    touched: Vec::new(),
                    verifier: self.write_verifier(),
                })
            }
            Some(_) => return Err(err(ErrorCode::Exists, format!("{name} in {into}"))),
            None => {}
        }
        let mut b = WriteBatch::new();
        if kind == FileKind::Dir {
            Self::put_dir_parent(&mut b, ino, into);
        } else {
            // One without links is freed, not adopted (nothing counts it
            // as a name's any more: an unlink's last step was lost).
            if seen == 0 {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    format!("inode {ino} has no links: it is freed, not adopted"),
                ));
            }
            // Exactly the count seen (`want` = `seen`): one already 1 may
            // have a name since (a retry of this adoption is answered
            // above, by its name).
            as_checked(&format!("inode {ino}"), inode.attr.nlink, seen, seen)?;
            inode.attr.nlink = 1;
            b.put(&keys::inode(ino), &inode.encode());
        }
        Self::put_dentry(&mut b, into, name, kind, ino);
        let tickets = self.touch_local(&mut b, &changes, Timestamp::now())?;
        self.kv.write(b, true).map_err(kv_err)?;
        drop(held);
        let touched = self.touch_queued(tickets);
        Ok(Reply::Created {
            entry: Entry {
                ino,
                kind,
                attr: Some(inode.attr),
            },
            created: true,
            touched,
            verifier: self.write_verifier(),
        })
    }

    /// `Op::RemakeDir`: make directory `dir` (owned here) again, whose
    /// inode is gone while names are in it on some servers (a lost write,
    /// or a disk that lost keys): mode 0700, owner root, link count
    /// `nlink`, times now, and `parent` as its parent (for a directory
    /// whose own name survived, that name's directory; else the
    /// lost+found, where `Op::Adopt` gives it a name next). Synced. Its
    /// id must be one this server handed out (so no create can get it
    /// again), and `parent` a directory; one made already (a retry) is
    /// answered as done.
    pub(crate) async fn remake_dir(
        self: &Arc<Self>,
        c: &Credentials,
        dir: InodeId,
        parent: InodeId,
        nlink: u32,
    ) -> Result<Reply, WireError> {
        root_only(c, "make a lost directory again")?;
        if dir.owner() != self.id
            || !(dir == InodeId::ROOT || self.inode_counter.issued(dir.counter()))
            || nlink < 2
            || (dir == parent && dir != InodeId::ROOT)
        {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!(
                    "server {}: directory {dir} with {nlink} links in {parent} cannot be made \
                     again here",
                    self.id
                ),
            ));
        }
        // The parent must be a directory that exists (its name's
        // directory, or the lost+found): nothing else may be recorded as
        // a directory's parent, which renames walk.
        if dir != InodeId::ROOT && self.dir_owner(parent).await?.kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, format!("inode {parent}")));
        }
        let _g = self.locks.lock(&[LockKey::Inode(dir)]).await?;
        if let Some(inode) = self.load_inode(dir)? {
            if inode.attr.kind != FileKind::Dir {
                return Err(err(
                    ErrorCode::Exists,
                    format!("inode {dir} exists and is not a directory"),
                ));
            }
            return Ok(Reply::Attr(inode.attr));
        }
        let mut inode = crate::inode::Inode::new(dir, FileKind::Dir, 0o700, 0, 0, Vec::new());
        inode.attr.nlink = nlink;
        let mut b = WriteBatch::new();
        b.put(&keys::inode(dir), &inode.encode());
        if dir != InodeId::ROOT {
            Self::put_dir_parent(&mut b, dir, parent);
        }
        self.kv.write(b, true).map_err(kv_err)?;
        self.inode_count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Reply::Attr(inode.attr))
    }

    /// `Op::DropName`: remove `name` in `parent` (held here) if it still
    /// names `ino` and `ino` does not exist on its owner (asked under the
    /// name's lock: a create writes its inode before its name, and an
    /// unlink its name's removal before the inode's, so an inode that is
    /// missing while its name is there was lost). The parent's times, and
    /// its count for a directory's name, change as after an unlink.
    /// Synced. A name gone already is answered ENOENT.
    pub(crate) async fn drop_name(
        self: &Arc<Self>,
        c: &Credentials,
        parent: InodeId,
        name: &FileName,
        ino: InodeId,
    ) -> Result<Reply, WireError> {
        root_only(c, "remove a name whose inode is missing")?;
        if !self.holds_dentry(parent, name) {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!("server {}: {name} in {parent} is not held here", self.id),
            ));
        }
        let (kind, _) = self
            .load_dentry(parent, name)?
            .ok_or_else(|| err(ErrorCode::NotFound, format!("{name} in {parent}")))?;
        let changes = DirChanges::one(parent, -i64::from(kind == FileKind::Dir));
        let mut lock_keys = vec![LockKey::Dentry(parent, name)];
        lock_keys.extend(changes.local_keys(self.id));
        let guard = self.locks.lock(&lock_keys).await?;
        match self.load_dentry(parent, name)? {
            None => return Err(err(ErrorCode::NotFound, format!("{name} in {parent}"))),
            Some(now) if now != (kind, ino) => {
                return Err(err(
                    ErrorCode::Busy,
                    format!("{name} in {parent} names another inode now"),
                ))
            }
            Some(_) => {}
        }
        match self.attr_of(ino).await {
            Err(e) if e.code == ErrorCode::NotFound => {}
            Ok(_) => {
                return Err(err(
                    ErrorCode::Busy,
                    format!("inode {ino} of {name} in {parent} exists"),
                ))
            }
            Err(e) => return Err(e),
        }
        let mut b = WriteBatch::new();
        b.delete(&keys::dentry(parent, name));
        let tickets = self.touch_local(&mut b, &changes, Timestamp::now())?;
        self.kv.write(b, true).map_err(kv_err)?;
        drop(guard);
        let touched = self.touch_queued(tickets);
        Ok(Reply::Removed {
            ino,
            kind,
            held: false,
            touched,
            verifier: self.write_verifier(),
        })
    }
}
