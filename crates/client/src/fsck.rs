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

use crate::client::{Client, FANOUT_MAX};
use crate::error::{ClientError, Result};
use crate::path::AsFsPath;
use madfs_proto::find::{FindDir, FindQuery};
use madfs_proto::{ErrorCode, Op, Reply};
use madfs_rpc::join::try_join_bounded;
use madfs_types::{FileKind, FileName, InodeId};
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

/// An inode whose link count is not the number of names that reach it
/// (anything but a directory), found the same in two passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrongInode {
    pub ino: InodeId,
    pub kind: FileKind,
    /// Its link count when checked.
    pub nlink: u32,
    /// The names found for it (0: a leaked inode, which no name reaches).
    pub names: u32,
    /// Some of those names, as paths (at most `PATHS_SHOWN`).
    pub paths: Vec<Vec<u8>>,
    /// One with links and no name: its size, when it has data (a repair
    /// then gives it a name in /lost+found, as e2fsck does; an empty one
    /// is freed, as one without links).
    pub size: Option<u64>,
    /// With `repair`: what became of it.
    pub repair: Option<Repair>,
    /// Once repaired, if it had data: its path in the lost+found.
    pub adopted_as: Option<Vec<u8>>,
}

impl WrongInode {
    /// A repair gives it a name in /lost+found rather than setting its
    /// count (and freeing it): no name reaches it, and it holds data.
    pub fn adopts(&self) -> bool {
        self.names == 0 && self.nlink > 0 && self.size.is_some_and(|s| s > 0)
    }
}

/// Paths shown per inode at most.
const PATHS_SHOWN: usize = 4;

/// What a check of every inode found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeCheck {
    /// Inodes with links, on every server.
    pub inodes: u64,
    /// Names (directory entries), every directory's included.
    pub names: u64,
    /// Link counts other than the names found (leaked inodes among them),
    /// sorted by inode.
    pub wrong: Vec<WrongInode>,
    /// Directories no name reaches, sorted by inode; a repair gives each
    /// a name in /lost+found (what is below it comes along).
    pub unreached_dirs: Vec<UnreachedDir>,
    /// Names whose inode does not exist, sorted by path; a repair
    /// removes them. (A name is never written before its inode, nor its
    /// inode freed before it, so only a lost write leaves one.) The name
    /// of a directory that names are in is not among them: it is kept,
    /// and the directory made again (`missing_dirs`).
    pub dangling: Vec<DanglingName>,
    /// Directories names are in whose inode does not exist, sorted by
    /// inode; a repair makes each again (under its own name if that
    /// survived, else in /lost+found), and what is in it is reached again.
    pub missing_dirs: Vec<MissingDir>,
    /// Link drops, renames, directory removals and directory moves the
    /// servers had still to finish: while any are, nothing is repaired
    /// (one landing after a repair would make a count wrong, and a
    /// directory being removed has no name for a while).
    pub pending: u64,
}

/// A directory no name reaches, found so in two passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreachedDir {
    pub ino: InodeId,
    /// Its link count when checked.
    pub nlink: u32,
    /// No entry in it on any server, in either pass: an rmdir's leftover
    /// (the name went, and a power cut undid the owner's drop), which a
    /// repair frees. One with entries is given a name in /lost+found.
    pub empty: bool,
    /// With `repair`: what became of it.
    pub repair: Option<Repair>,
    /// Once repaired, if it had entries: its path in the lost+found.
    pub adopted_as: Option<Vec<u8>>,
}

/// A name whose inode does not exist, found so in two passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DanglingName {
    pub path: Vec<u8>,
    pub parent: InodeId,
    pub name: FileName,
    /// The inode it names.
    pub ino: InodeId,
    /// With `repair`: what became of it (Done: removed).
    pub repair: Option<Repair>,
}

/// A directory names are in (on some servers) whose inode does not
/// exist, found so in two passes: a directory's inode is written, synced,
/// before any name can go in it, so only a disk that lost keys leaves one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingDir {
    pub ino: InodeId,
    /// Names found in it.
    pub names: u64,
    /// Of them, directories.
    pub subdirs: u32,
    /// Its own name, if that survived (the path, and where it is).
    pub named: Option<(Vec<u8>, InodeId, FileName)>,
    /// With `repair`: what became of it.
    pub repair: Option<Repair>,
    /// Once made again: its path (its own name's, or in the lost+found).
    pub path: Option<Vec<u8>>,
}

/// Where a repair puts what no name reaches (as e2fsck does).
pub const LOST_FOUND: &str = "lost+found";

impl InodeCheck {
    /// Problems not repaired.
    pub fn left_wrong(&self) -> usize {
        self.wrong
            .iter()
            .filter(|w| w.repair != Some(Repair::Done))
            .count()
            + self
                .unreached_dirs
                .iter()
                .filter(|d| d.repair != Some(Repair::Done))
                .count()
            + self
                .dangling
                .iter()
                .filter(|d| d.repair != Some(Repair::Done))
                .count()
            + self
                .missing_dirs
                .iter()
                .filter(|d| d.repair != Some(Repair::Done))
                .count()
    }

    /// Repairs done, of every kind.
    pub fn repaired(&self) -> usize {
        self.wrong.len() + self.unreached_dirs.len() + self.dangling.len() + self.missing_dirs.len()
            - self.left_wrong()
    }

    /// Every problem's repair field, for marking them all skipped.
    fn repairs_mut(&mut self) -> impl Iterator<Item = &mut Option<Repair>> {
        (self.wrong.iter_mut().map(|w| &mut w.repair))
            .chain(self.unreached_dirs.iter_mut().map(|d| &mut d.repair))
            .chain(self.dangling.iter_mut().map(|d| &mut d.repair))
            .chain(self.missing_dirs.iter_mut().map(|d| &mut d.repair))
    }
}

/// One pass: every inode with links, and every name.
struct Pass {
    inodes: HashMap<InodeId, (FileKind, u32)>,
    /// Link drops, renames, directory removals and moves unfinished, on
    /// every server.
    pending: u64,
    /// Names of each inode that is not a directory.
    names: HashMap<InodeId, Vec<(InodeId, FileName)>>,
    /// Directories some name reaches, with their parent and name.
    dirs: HashMap<InodeId, FindDir>,
    /// Directories with at least one entry: how many names are in each,
    /// and how many of those are directories.
    children: HashMap<InodeId, (u64, u32)>,
    entries: u64,
}

impl Client {
    /// Check every inode's link count against the names that reach it, in
    /// the whole file system: a count above its names (a leak: the last
    /// unlink would not free it; with no name at all, nothing ever will),
    /// or below (an unlink could free it while a name still reaches it).
    /// With `repair`, set each to its names, freeing the leaked inodes;
    /// remove names whose inode does not exist; free the empty
    /// directories no name reaches and give the others a name in
    /// /lost+found. Nothing is repaired while a server reports something
    /// pending. Root only.
    ///
    /// Two passes, each listing every server's inodes (`Op::ListInodes`)
    /// and then every name (find's server-side scan); only what both
    /// found wrong the same way is reported. An operation in flight (a
    /// create's inode is made before its name, a link counted before its
    /// name is written) looks wrong to one pass, not to the next. The
    /// owner sets a count only if it is still the one seen (a link or
    /// unlink since makes it EBUSY).
    pub async fn check_inode_links(&self, repair: bool) -> Result<InodeCheck> {
        if self.credentials().uid != 0 {
            return Err(ClientError::new(
                ErrorCode::NotPermitted,
                "fsck needs root: it reads every inode",
            ));
        }
        let first = self.inode_pass().await?;
        let second = self.inode_pass().await?;
        let mut out = InodeCheck {
            inodes: second.inodes.len() as u64,
            names: second.entries,
            pending: first.pending.max(second.pending),
            ..InodeCheck::default()
        };
        for (&ino, &(kind, nlink)) in &second.inodes {
            if first.inodes.get(&ino) != Some(&(kind, nlink)) {
                continue;
            }
            if kind == FileKind::Dir {
                if ino != InodeId::ROOT
                    && !second.dirs.contains_key(&ino)
                    && !first.dirs.contains_key(&ino)
                {
                    let has_entries = |p: &Pass| p.children.contains_key(&ino);
                    out.unreached_dirs.push(UnreachedDir {
                        ino,
                        nlink,
                        empty: !has_entries(&first) && !has_entries(&second),
                        repair: None,
                        adopted_as: None,
                    });
                }
                continue;
            }
            let names = |p: &Pass| p.names.get(&ino).map_or(0, Vec::len);
            let n = names(&second);
            // No links and no name: a leak all the same (listed only when
            // not held open).
            if (n == nlink as usize && nlink > 0) || names(&first) != n {
                continue;
            }
            let paths = second
                .names
                .get(&ino)
                .into_iter()
                .flatten()
                .take(PATHS_SHOWN)
                .map(|(parent, name)| path_of(&second.dirs, *parent, name))
                .collect();
            out.wrong.push(WrongInode {
                ino,
                kind,
                nlink,
                names: u32::try_from(n).unwrap_or(u32::MAX),
                paths,
                size: None,
                repair: None,
                adopted_as: None,
            });
        }
        for (ino, names) in &second.names {
            if second.inodes.contains_key(ino) || first.inodes.contains_key(ino) {
                continue;
            }
            let in_first = first.names.get(ino).into_iter().flatten();
            for (parent, name) in names {
                if in_first.clone().any(|n| n == &(*parent, name.clone())) {
                    out.dangling.push(DanglingName {
                        path: path_of(&second.dirs, *parent, name),
                        parent: *parent,
                        name: name.clone(),
                        ino: *ino,
                        repair: None,
                    });
                }
            }
        }
        // Directories names are in whose inode does not exist.
        let exists =
            |ino: &InodeId| first.inodes.contains_key(ino) || second.inodes.contains_key(ino);
        for (ino, &(names, subdirs)) in &second.children {
            if exists(ino) || !first.children.contains_key(ino) {
                continue;
            }
            let named = second.dirs.get(ino).and_then(|d| {
                let same = first
                    .dirs
                    .get(ino)
                    .is_some_and(|f| f.parent == d.parent && f.name == d.name);
                same.then(|| {
                    let path = path_of(&second.dirs, d.parent, &d.name);
                    (path, d.parent, d.name.clone())
                })
            });
            out.missing_dirs.push(MissingDir {
                ino: *ino,
                names,
                subdirs,
                named,
                repair: None,
                path: None,
            });
        }
        // Directories' names whose directory does not exist (and nothing
        // is in it: one that names are in is made again).
        for (ino, d) in &second.dirs {
            let gone = !exists(ino) && !out.missing_dirs.iter().any(|m| m.ino == *ino);
            let same_before = first
                .dirs
                .get(ino)
                .is_some_and(|f| f.parent == d.parent && f.name == d.name);
            if gone && same_before {
                out.dangling.push(DanglingName {
                    path: path_of(&second.dirs, d.parent, &d.name),
                    parent: d.parent,
                    name: d.name.clone(),
                    ino: *ino,
                    repair: None,
                });
            }
        }
        out.wrong.sort_by_key(|w| w.ino);
        out.unreached_dirs.sort_by_key(|d| d.ino);
        out.dangling.sort_by(|a, b| a.path.cmp(&b.path));
        out.missing_dirs.sort_by_key(|d| d.ino);
        // What a leaked inode with links holds decides whether a repair
        // keeps it: asked of its owner (one gone meanwhile is freed).
        for w in out.wrong.iter_mut().filter(|w| w.names == 0 && w.nlink > 0) {
            w.size = self.getattr(w.ino).await.ok().map(|a| a.size);
        }
        let anything = out.repairs_mut().next().is_some();
        let mut unsynced = None;
        if repair && anything && out.pending == 0 {
            match self.pending_once_synced().await {
                Ok(pending) => out.pending = pending,
                Err(e) => unsynced = Some(e),
            }
        }
        if repair && (out.pending > 0 || unsynced.is_some()) {
            let why = Repair::Skipped(match unsynced {
                Some(e) => format!("syncing every server before the repair: {e}"),
                None => format!(
                    "{} link drops, renames or directory removals or moves are still being \
                     finished on the servers; run fsck again once they are done",
                    out.pending
                ),
            });
            for r in out.repairs_mut() {
                *r = Some(why.clone());
            }
        } else if repair {
            self.repair_namespace(&mut out).await;
        }
        Ok(out)
    }

    /// The repairs of a check that found no work pending, in an order
    /// that lets each find what it needs: the root first if it is gone
    /// (the lost+found is made in it), names without inodes dropped, lost
    /// directories made again, and then what no name reaches adopted or
    /// freed, and link counts set.
    async fn repair_namespace(&self, out: &mut InodeCheck) {
        let mut lf = None;
        out.missing_dirs.sort_by_key(|d| d.ino != InodeId::ROOT);
        for d in &mut out.dangling {
            d.repair = Some(self.drop_dangling(d).await);
        }
        // In rounds: a lost directory whose surviving name is in another
        // lost directory is made once that one is.
        loop {
            let mut made = 0;
            for d in out.missing_dirs.iter_mut() {
                if d.repair == Some(Repair::Done) {
                    continue;
                }
                (d.repair, d.path) = match self.remake_dir(d, &mut lf).await {
                    Ok(path) => (Some(Repair::Done), Some(path)),
                    Err(why) => (Some(why), None),
                };
                made += usize::from(d.repair == Some(Repair::Done));
            }
            // Done when a round makes nothing (every one made, or the
            // rest cannot be).
            if made == 0 {
                break;
            }
        }
        out.missing_dirs.sort_by_key(|d| d.ino);
        for d in out.unreached_dirs.iter_mut() {
            (d.repair, d.adopted_as) = if d.empty {
                (Some(self.fix_links(d.ino, d.nlink, 0).await), None)
            } else {
                match self.adopt(d.ino, 0, &mut lf).await {
                    Ok(path) => (Some(Repair::Done), Some(path)),
                    Err(why) => (Some(why), None),
                }
            };
        }
        for w in &mut out.wrong {
            (w.repair, w.adopted_as) = if w.adopts() {
                match self.adopt(w.ino, w.nlink, &mut lf).await {
                    Ok(path) => (Some(Repair::Done), Some(path)),
                    Err(why) => (Some(why), None),
                }
            } else {
                (Some(self.fix_links(w.ino, w.nlink, w.names).await), None)
            };
        }
    }

    /// Make lost directory `d` again: under its own name if that
    /// survived, else in the lost+found (made again with it as its
    /// parent, then named there). Its path, or why not.
    async fn remake_dir(
        &self,
        d: &MissingDir,
        lf: &mut Option<std::result::Result<InodeId, String>>,
    ) -> std::result::Result<Vec<u8>, Repair> {
        let parent = match &d.named {
            Some((_, parent, _)) => *parent,
            None if d.ino == InodeId::ROOT => InodeId::ROOT,
            None => self.lost_found_once(lf).await?,
        };
        let op = Op::RemakeDir {
            dir: d.ino,
            parent,
            nlink: d.subdirs.saturating_add(2),
        };
        match self.call(d.ino.owner(), op).await {
            Ok(Reply::Attr(_)) => self.cache.forget_attr(d.ino),
            Ok(other) => return Err(Repair::Skipped(format!("unexpected answer {other:?}"))),
            Err(e) => return Err(Repair::Skipped(e.to_string())),
        }
        match &d.named {
            Some((path, _, _)) => Ok(path.clone()),
            None if d.ino == InodeId::ROOT => Ok(b"/".to_vec()),
            None => self.adopt(d.ino, 0, lf).await,
        }
    }

    /// The lost+found, made on first need and then remembered (or why
    /// it could not be).
    async fn lost_found_once(
        &self,
        lf: &mut Option<std::result::Result<InodeId, String>>,
    ) -> std::result::Result<InodeId, Repair> {
        if lf.is_none() {
            *lf = Some(self.lost_found().await.map_err(|e| e.to_string()));
        }
        match lf.as_ref().expect("set above") {
            Ok(ino) => Ok(*ino),
            Err(e) => Err(Repair::Skipped(format!("/{LOST_FOUND}: {e}"))),
        }
    }

    /// Before a repair: make durable on every server what the two passes
    /// saw finished, then count again what is pending there. A link
    /// drop's record is removed unsynced once its owner applied it, and
    /// the owner's decrement is unsynced too: a power cut on the owner
    /// undoes the decrement (the leak a repair then sets right), and one
    /// on the sender afterwards would bring the record back, whose drop,
    /// sent again, would take the repaired count one below the names and
    /// free an inode a name still reaches (the simulation, seed 22871).
    async fn pending_once_synced(&self) -> Result<u64> {
        let all = self.all_servers();
        self.fsync_answers(&all).await?;
        let mut pending = 0u64;
        for server in all {
            let op = Op::ListInodes {
                after: None,
                max_entries: 1,
            };
            match self.call(server, op).await? {
                Reply::InodePage { pending: p, .. } => pending = pending.saturating_add(p),
                other => return Err(ClientError::unexpected("ListInodes", &other)),
            }
        }
        Ok(pending)
    }

    /// Set the link count of `ino` to `want` on its owner if it is still
    /// `seen` (0 frees it).
    async fn fix_links(&self, ino: InodeId, seen: u32, want: u32) -> Repair {
        let op = Op::FixFileLinks { ino, seen, want };
        match self.call(ino.owner(), op).await {
            Ok(Reply::Links { nlink }) if nlink == want => {
                self.cache.forget_attr(ino);
                Repair::Done
            }
            Ok(other) => Repair::Skipped(format!("unexpected answer {other:?}")),
            Err(e) => Repair::Skipped(e.to_string()),
        }
    }

    /// Remove dangling name `d` on its server, which checks again that it
    /// still names the inode and that the inode does not exist.
    async fn drop_dangling(&self, d: &DanglingName) -> Repair {
        let op = Op::DropName {
            parent: d.parent,
            name: d.name.clone(),
            ino: d.ino,
        };
        match self.call(self.dentry_server(d.parent, &d.name), op).await {
            Ok(Reply::Removed { .. }) => {
                self.cache.removed(d.parent, &d.name, Some(d.ino));
                Repair::Done
            }
            Ok(other) => Repair::Skipped(format!("unexpected answer {other:?}")),
            Err(e) => {
                self.cache.forget_entry(d.parent, &d.name);
                Repair::Skipped(e.to_string())
            }
        }
    }

    /// The root's lost+found, made (mode 0700, as e2fsck's) if missing.
    async fn lost_found(&self) -> Result<InodeId> {
        let path = format!("/{LOST_FOUND}");
        match self.mkdir(path.as_str(), 0o700).await {
            Ok(a) => Ok(a.ino),
            Err(e) if e.code == ErrorCode::Exists => {
                let a = self.lstat(path.as_str()).await?;
                if a.kind != FileKind::Dir {
                    return Err(ClientError::new(ErrorCode::NotDir, "not a directory"));
                }
                Ok(a.ino)
            }
            Err(e) => Err(e),
        }
    }

    /// Give inode `ino`, whose link count was `seen` (a directory's is
    /// not checked), a name in the lost+found: `#` and its inode number,
    /// with a suffix that puts the name on the inode's own server (the
    /// adoption is then one batch there). Its path, or why not.
    async fn adopt(
        &self,
        ino: InodeId,
        seen: u32,
        lf: &mut Option<std::result::Result<InodeId, String>>,
    ) -> std::result::Result<Vec<u8>, Repair> {
        let lf = self.lost_found_once(lf).await?;
        let name = (0..)
            .map(|k| {
                let n = if k == 0 {
                    format!("#{}", ino.0)
                } else {
                    format!("#{}.{k}", ino.0)
                };
                FileName::new(n.as_bytes()).expect("a short name without a slash")
            })
            .find(|n| self.dentry_server(lf, n) == ino.owner())
            .expect("some suffix lands on every server");
        let op = Op::Adopt {
            ino,
            into: lf,
            name: name.clone(),
            seen,
        };
        match self.call(ino.owner(), op).await {
            Ok(Reply::Created { .. }) => {
                self.cache.forget_entry(lf, &name);
                self.cache.forget_attr(lf);
                self.cache.forget_attr(ino);
                let mut path = format!("/{LOST_FOUND}/").into_bytes();
                path.extend_from_slice(name.as_bytes());
                Ok(path)
            }
            Ok(other) => Err(Repair::Skipped(format!("unexpected answer {other:?}"))),
            Err(e) => Err(Repair::Skipped(e.to_string())),
        }
    }

    /// Every server's inodes with links, then every name.
    async fn inode_pass(&self) -> Result<Pass> {
        let lists: Vec<_> = self
            .all_servers()
            .into_iter()
            .map(|s| self.list_inodes(s))
            .collect();
        let mut inodes = HashMap::new();
        let mut pending = 0u64;
        for (list, p) in try_join_bounded(lists, FANOUT_MAX).await? {
            inodes.extend(list);
            pending = pending.saturating_add(p);
        }
        let scan = self.find_scan(&FindQuery::default()).await?;
        let mut names: HashMap<InodeId, Vec<(InodeId, FileName)>> = HashMap::new();
        let mut entries = 0u64;
        let mut children: HashMap<InodeId, (u64, u32)> = HashMap::new();
        for m in scan.entries() {
            entries += 1;
            if m.kind != FileKind::Dir {
                children.entry(m.parent).or_default().0 += 1;
                names
                    .entry(m.ino)
                    .or_default()
                    .push((m.parent, m.name.clone()));
            }
        }
        // Subdirectories counted from the directories the scan found
        // (every one, whatever the query matched).
        for d in scan.dirs.values() {
            let c = children.entry(d.parent).or_default();
            c.0 += 1;
            c.1 = c.1.saturating_add(1);
        }
        Ok(Pass {
            inodes,
            pending,
            names,
            dirs: scan.dirs,
            children,
            entries,
        })
    }

    /// Every inode with links on `server`, page by page, and the link
    /// drops and renames it has still to finish.
    async fn list_inodes(
        &self,
        server: madfs_types::ServerId,
    ) -> Result<(Vec<(InodeId, (FileKind, u32))>, u64)> {
        let mut out = Vec::new();
        let mut after = None;
        let mut unfinished = 0;
        loop {
            let op = Op::ListInodes {
                after,
                max_entries: madfs_types::limits::INODE_PAGE_MAX,
            };
            let first = after.is_none();
            let Reply::InodePage {
                inodes,
                more,
                pending,
            } = self.call(server, op).await?
            else {
                return Err(ClientError::new(
                    ErrorCode::Io,
                    format!("server {server} answered ListInodes with something else"),
                ));
            };
            if first {
                unfinished = pending;
            }
            after = inodes.last().map(|i| i.ino);
            out.extend(inodes.iter().map(|i| (i.ino, (i.kind, i.nlink))));
            if !more || after.is_none() {
                return Ok((out, unfinished));
            }
        }
    }
}

/// The path of `name` in `parent`, from the scanned directories (a
/// directory whose chain does not reach the root is shown by its id).
fn path_of(dirs: &HashMap<InodeId, FindDir>, parent: InodeId, name: &FileName) -> Vec<u8> {
    let mut parts = vec![name.as_bytes().to_vec()];
    let mut at = parent;
    let mut seen = HashSet::new();
    while at != InodeId::ROOT {
        let Some(d) = dirs.get(&at).filter(|_| seen.insert(at)) else {
            parts.push(format!("<dir {at}>").into_bytes());
            break;
        };
        parts.push(d.name.as_bytes().to_vec());
        at = d.parent;
    }
    let mut path = Vec::new();
    for p in parts.iter().rev() {
        if !p.starts_with(b"<") {
            path.push(b'/');
        }
        path.extend_from_slice(p);
    }
    path
}
