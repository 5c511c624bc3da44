//! `madfs fsck`: every directory's link count checked against the
//! namespace (2 plus its subdirectories, whose entries live on every
//! server's shard), and with `repair`, set right on its owner
//! (`Op::FixDirLinks`). The count is the one thing nothing else restores
//! after a power cut that lost unsynced metadata writes (an owner's applied
//! touch, or a sender's touch intents; docs/ARCHITECTURE.md, "Directory
//! times and link counts"); GNU find trusts it to skip leaf directories.
//!
//! The directories come from the same server-side scan as find (one pass
//! over every shard, in parallel), their counts from a GetAttr each. A
//! directory changing while it is checked may be reported wrong; before a
//! repair it is counted again from its own listing and its count asked
//! again, and the owner sets the new count only if it is still the one
//! seen. Meant for a quiet file system (after the power cut, before the
//! jobs), as e2fsck is.

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::path::AsFsPath;
use madfs_proto::find::{FindDir, FindQuery};
use madfs_proto::{ErrorCode, Op, Reply};
use madfs_types::{FileKind, InodeId};
use std::collections::{HashMap, HashSet};

/// A directory whose link count is not 2 plus its subdirectories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrongLinks {
    pub path: Vec<u8>,
    pub ino: InodeId,
    /// Its link count when checked.
    pub nlink: u32,
    /// Its subdirectories when checked.
    pub subdirs: u32,
    /// With `repair`: what became of it.
    pub repair: Option<Repair>,
}

impl WrongLinks {
    /// The count it should have.
    pub fn want(&self) -> u32 {
        self.subdirs.saturating_add(2)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repair {
    /// Set to 2 plus its subdirectories.
    Done,
    /// Left alone, and why (it changed while checked, or the call failed).
    Skipped(String),
}

/// What a check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkCheck {
    /// Directories checked: the starting point and every one below it.
    pub dirs: u64,
    /// Sorted by path.
    pub wrong: Vec<WrongLinks>,
}

impl LinkCheck {
    /// Wrong counts not repaired.
    pub fn left_wrong(&self) -> usize {
        self.wrong
            .iter()
            .filter(|w| w.repair != Some(Repair::Done))
            .count()
    }
}

impl Client {
    /// Check the link count of `root` and of every directory below it;
    /// with `repair`, set each wrong one right. Root only (it reads every
    /// directory, and only root may set a count).
    pub async fn check_dir_links(&self, root: impl AsFsPath, repair: bool) -> Result<LinkCheck> {
        if self.credentials().uid != 0 {
            return Err(ClientError::new(
                ErrorCode::NotPermitted,
                "fsck needs root: it reads every directory",
            ));
        }
        let root_path = root.fs_path_bytes().to_vec();
        let root_attr = self.lstat(&root_path[..]).await?;
        if root_attr.kind != FileKind::Dir {
            return Err(ClientError::new(
                ErrorCode::NotDir,
                String::from_utf8_lossy(&root_path).into_owned(),
            ));
        }
        // A glob no name matches (names are never empty): the pages then
        // carry the directories alone.
        let query = FindQuery {
            name: Some(Vec::new()),
            ..FindQuery::default()
        };
        let scan = self.find_scan(&query).await?;
        let mut children: HashMap<InodeId, Vec<&FindDir>> = HashMap::new();
        for d in scan.dirs.values() {
            children.entry(d.parent).or_default().push(d);
        }
        let base: Vec<u8> = {
            let mut t = &root_path[..];
            while t.ends_with(b"/") {
                t = &t[..t.len() - 1];
            }
            t.to_vec()
        };
        // (directory, path, subdirectories), from the root down; `reached`
        // stops at a directory met twice (a ring: no name reaches it).
        let mut dirs: Vec<(InodeId, Vec<u8>, u32)> = Vec::new();
        let mut reached = HashSet::from([root_attr.ino]);
        let mut queue = vec![(root_attr.ino, root_path.clone())];
        while let Some((ino, path)) = queue.pop() {
            let kids = children.get(&ino).map(Vec::as_slice).unwrap_or(&[]);
            for k in kids {
                if reached.insert(k.ino) {
                    let mut p = if ino == root_attr.ino {
                        base.clone()
                    } else {
                        path.clone()
                    };
                    p.push(b'/');
                    p.extend_from_slice(k.name.as_bytes());
                    queue.push((k.ino, p));
                }
            }
            dirs.push((ino, path, u32::try_from(kids.len()).unwrap_or(u32::MAX)));
        }
        let attrs = self.attrs_of(dirs.iter().map(|d| d.0).collect()).await?;
        let mut out = LinkCheck::default();
        for (ino, path, subdirs) in dirs {
            // Gone meanwhile: nothing to check.
            let Some(a) = attrs.get(&ino) else { continue };
            out.dirs += 1;
            if a.nlink != subdirs.saturating_add(2) {
                out.wrong.push(WrongLinks {
                    path,
                    ino,
                    nlink: a.nlink,
                    subdirs,
                    repair: None,
                });
            }
        }
        out.wrong.sort_by(|a, b| a.path.cmp(&b.path));
        if repair {
            for w in &mut out.wrong {
                w.repair = Some(self.repair_dir_links(w).await);
            }
        }
        Ok(out)
    }

    /// Set `w`'s count right if, counted again, it is still as checked.
    async fn repair_dir_links(&self, w: &WrongLinks) -> Repair {
        let subdirs = match self.readdir(w.ino).await {
            Ok(list) => list.iter().filter(|e| e.kind == FileKind::Dir).count(),
            Err(e) => return Repair::Skipped(format!("listing it: {e}")),
        };
        let nlink = match self.getattr(w.ino).await {
            Ok(a) => a.nlink,
            Err(e) => return Repair::Skipped(format!("asking its link count: {e}")),
        };
        if subdirs != w.subdirs as usize || nlink != w.nlink {
            return Repair::Skipped(format!(
                "it changed while checked (now {nlink} links, {subdirs} subdirectories)"
            ));
        }
        let op = Op::FixDirLinks {
            dir: w.ino,
            seen: nlink,
            want: w.want(),
        };
        match self.call(w.ino.owner(), op).await {
            Ok(Reply::Attr(a)) if a.nlink == w.want() => {
                self.cache.changed_attr(&a);
                Repair::Done
            }
            Ok(other) => Repair::Skipped(format!("unexpected answer {other:?}")),
            Err(e) => Repair::Skipped(e.to_string()),
        }
    }
}
