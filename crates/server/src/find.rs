//! Server-side find (`Op::Find`): one page of a scan over this server's
//! whole shard of dentries, in key order, testing each entry against the
//! query with the inode record when this server holds it, and counting the
//! dentries examined (all of the shard's, wherever the find's root is: the
//! server does not know the tree). Paths are not
//! stored anywhere: the client builds them from the directory entries every
//! page carries.

use crate::dentry_index::IndexedKv;
use crate::errors::{err, kv_err};
use crate::inode::{decode_dentry, Inode};
use crate::inode_index::FindInode;
use crate::keys;
use madfs_kv::KvStore;
use madfs_proto::find::{FindDir, FindMatch, FindQuery, FIND_PAGE_ENTRIES_MAX};
use madfs_proto::{ErrorCode, Reply, WireError};
use madfs_types::{FileKind, FileName, InodeId, ServerId};
use std::sync::Arc;

/// Rows one page may scan before it answers: bounds the time one request
/// takes when few entries match.
const SCAN_ROWS_PER_PAGE: usize = 32 * 1024;

/// What find needs of `ino` when this server holds it: from the in-memory
/// copy, or from RocksDB when there is none.
fn local_inode(kv: &IndexedKv, id: ServerId, ino: InodeId) -> Result<Option<FindInode>, WireError> {
    if ino.owner() != id {
        return Ok(None);
    }
    if let Some(copied) = kv.copied_inode(ino) {
        return Ok(copied);
    }
    match kv.get(&keys::inode(ino)).map_err(kv_err)? {
        None => Ok(None),
        Some(v) => Inode::decode(&v)
            .map(|i| Some(FindInode::of(&i.attr)))
            .map_err(|e| err(ErrorCode::Io, format!("corrupt inode {ino}: {e}"))),
    }
}

/// One page of the find; runs on the blocking pool (a page may read up to
/// `SCAN_ROWS_PER_PAGE` dentries and as many inodes).
pub(crate) fn find_page(
    kv: Arc<IndexedKv>,
    id: ServerId,
    query: &FindQuery,
    after: Option<(InodeId, FileName)>,
    max_entries: u32,
) -> Result<Reply, WireError> {
    // Each row adds at most two items (its directory entry and a match).
    let max = max_entries.clamp(2, FIND_PAGE_ENTRIES_MAX) as usize;
    let needs_attrs = query.needs_attrs();
    let start = match &after {
        None => keys::DENTRY.to_vec(),
        Some((p, n)) => {
            let mut k = keys::dentry(*p, n);
            k.push(0); // the first key after it
            k
        }
    };
    let (mut dirs, mut matches, mut unresolved) = (Vec::new(), Vec::new(), Vec::new());
    let mut scanned = 0usize;
    let mut last_key: Option<Vec<u8>> = None;
    let mut stopped = false;
    let mut failure: Option<WireError> = None;
    let mut visit = |k: &[u8], v: &[u8]| -> Result<bool, WireError> {
        scanned += 1;
        let parent =
            keys::ino_from_key(k).ok_or_else(|| err(ErrorCode::Io, "corrupt dentry key"))?;
        let name = &k[12..];
        let (kind, ino) = decode_dentry(v).ok_or_else(|| err(ErrorCode::Io, "corrupt dentry"))?;
        let file_name =
            || FileName::new(name).map_err(|_| err(ErrorCode::Io, "corrupt dentry key"));
        let mut inode = None;
        if kind == FileKind::Dir {
            inode = local_inode(kv.as_ref(), id, ino)?;
            dirs.push(FindDir {
                parent,
                name: file_name()?,
                ino,
                access: inode.as_ref().map(FindInode::access),
            });
        }
        if query.matches_entry(name, kind) {
            if !needs_attrs {
                matches.push(FindMatch {
                    parent,
                    name: file_name()?,
                    ino,
                    kind,
                    attrs: None,
                });
            } else if ino.owner() != id {
                unresolved.push(FindMatch {
                    parent,
                    name: file_name()?,
                    ino,
                    kind,
                    attrs: None,
                });
            } else {
                if inode.is_none() {
                    inode = local_inode(kv.as_ref(), id, ino)?;
                }
                // No record: removed since the dentry was read; skip.
                if let Some(i) = inode {
                    let a = i.find_attrs();
                    if query.matches_attrs(&a) {
                        matches.push(FindMatch {
                            parent,
                            name: file_name()?,
                            ino,
                            kind,
                            attrs: Some(a),
                        });
                    }
                }
            }
        }
        // Full (the next row could add two items) or scanned enough: stop
        // after this row, the only key copied per page.
        if dirs.len() + matches.len() + unresolved.len() + 2 > max || scanned >= SCAN_ROWS_PER_PAGE
        {
            stopped = true;
            last_key = Some(k.to_vec());
            return Ok(false);
        }
        Ok(true)
    };
    kv.scan_visit(keys::DENTRY, &start, &mut |k, v| match visit(k, v) {
        Ok(go) => go,
        Err(e) => {
            failure = Some(e);
            false
        }
    })
    .map_err(kv_err)?;
    if let Some(e) = failure {
        return Err(e);
    }
    let resume = if stopped {
        match last_key {
            Some(k) => Some((
                keys::ino_from_key(&k).ok_or_else(|| err(ErrorCode::Io, "corrupt dentry key"))?,
                FileName::new(&k[12..]).map_err(|_| err(ErrorCode::Io, "corrupt dentry key"))?,
            )),
            None => after,
        }
    } else {
        None
    };
    Ok(Reply::FindPage {
        dirs,
        matches,
        unresolved,
        resume,
        scanned: scanned as u64,
    })
}
