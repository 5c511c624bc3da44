//! The model the simulation checks against: the namespace as POSIX says it
//! must be after each operation (paths to kinds and inode numbers, file
//! contents by inode), and what the real stores hold (`Observed`), read
//! straight from every server's metadata disk.

use crate::disk::SimDisk;
use madfs_server::inode::{decode_dentry, Inode};
use madfs_server::keys;
use madfs_types::{FileKind, InodeId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// One name in the model. `ino` is None for an entry the model created
/// and has not seen yet (the server picks the number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: FileKind,
    pub ino: Option<InodeId>,
}

/// An operation of the simulated workload.
#[derive(Clone, Debug)]
pub enum Action {
    Mkdir(String),
    Create(String, Vec<u8>),
    Write {
        path: String,
        offset: u64,
        data: Vec<u8>,
        fsync: bool,
    },
    Truncate(String, u64),
    Rename(String, String),
    Link(String, String),
    Unlink(String),
    Rmdir(String),
    /// fsync on every server (sync(2) of the whole cluster).
    SyncAll,
}

impl Action {
    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            Action::Mkdir(p) => format!("mkdir {p}"),
            Action::Create(p, d) => format!("create {p} ({} bytes)", d.len()),
            Action::Write {
                path,
                offset,
                data,
                fsync,
            } => format!(
                "write {path} @{offset} +{}{}",
                data.len(),
                if *fsync { " fsync" } else { "" }
            ),
            Action::Truncate(p, s) => format!("truncate {p} {s}"),
            Action::Rename(a, b) => format!("rename {a} -> {b}"),
            Action::Link(a, b) => format!("link {a} -> {b}"),
            Action::Unlink(p) => format!("unlink {p}"),
            Action::Rmdir(p) => format!("rmdir {p}"),
            Action::SyncAll => "sync all servers".into(),
        }
    }

    /// The paths whose entries this action may change (with every path
    /// below them for a directory moved or removed).
    pub fn touched_paths(&self, m: &Model) -> Vec<String> {
        let below = |p: &str| -> Vec<String> {
            let mut v = vec![p.to_string()];
            let prefix = format!("{p}/");
            v.extend(
                m.names
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, _)| k.clone()),
            );
            v
        };
        match self {
            Action::Mkdir(p) | Action::Create(p, _) | Action::Unlink(p) | Action::Rmdir(p) => {
                vec![p.clone()]
            }
            Action::Rename(a, b) => {
                let mut v = below(a);
                for x in below(a) {
                    v.push(format!("{b}{}", &x[a.len()..]));
                }
                v.extend(below(b));
                v
            }
            Action::Link(_, b) => vec![b.clone()],
            Action::Write { .. } | Action::Truncate(..) | Action::SyncAll => Vec::new(),
        }
    }

    /// This action with each path's parent directory resolved in
    /// `before` (as a client does, to an inode, before the server acts)
    /// and named as it is in `now`; Err if such a directory is gone.
    pub fn rebased(&self, before: &Model, now: &Model) -> Result<Action, String> {
        self.rebased_in(before, now, true)
    }

    /// A rename with only its source's parent resolved in `before`: a
    /// client resolves the source's directory, then the target's (client
    /// path.rs `rename_with_flags`), and another operation may move things
    /// in between, as with rename(2) on Linux (plain simulation, seed
    /// 41337: `rename /b -> /a` ran between them, and `rename /b/c/e ->
    /// /a/a` moved the file from the directory once named /b/c into the
    /// one now named /a). None for other actions.
    pub fn rebased_source(&self, before: &Model, now: &Model) -> Option<Result<Action, String>> {
        match self {
            Action::Rename(..) => Some(self.rebased_in(before, now, false)),
            _ => None,
        }
    }

    /// `rebased`; with `target_too` false a rename's target path is left
    /// as named in `now`.
    fn rebased_in(&self, before: &Model, now: &Model, target_too: bool) -> Result<Action, String> {
        let re = |p: &String| -> Result<String, String> {
            let parent = parent_of(p);
            if parent.is_empty() {
                return Ok(p.clone());
            }
            let ino = before
                .names
                .get(parent)
                .filter(|e| e.kind == FileKind::Dir)
                .and_then(|e| e.ino)
                .ok_or("ENOENT (parent)")?;
            let at = now
                .names
                .iter()
                .find(|(_, e)| e.kind == FileKind::Dir && e.ino == Some(ino))
                .map(|(q, _)| q.clone())
                .ok_or("ENOENT (parent removed)")?;
            Ok(format!("{at}{}", &p[parent.len()..]))
        };
        Ok(match self {
            Action::Mkdir(p) => Action::Mkdir(re(p)?),
            Action::Create(p, d) => Action::Create(re(p)?, d.clone()),
            Action::Write {
                path,
                offset,
                data,
                fsync,
            } => Action::Write {
                path: re(path)?,
                offset: *offset,
                data: data.clone(),
                fsync: *fsync,
            },
            Action::Truncate(p, n) => Action::Truncate(re(p)?, *n),
            Action::Rename(a, b) if !target_too => Action::Rename(re(a)?, b.clone()),
            Action::Rename(a, b) => Action::Rename(re(a)?, re(b)?),
            Action::Link(a, b) => Action::Link(re(a)?, re(b)?),
            Action::Unlink(p) => Action::Unlink(re(p)?),
            Action::Rmdir(p) => Action::Rmdir(re(p)?),
            Action::SyncAll => Action::SyncAll,
        })
    }

    /// Every path the action names.
    pub fn paths(&self) -> Vec<&String> {
        match self {
            Action::Mkdir(p)
            | Action::Create(p, _)
            | Action::Truncate(p, _)
            | Action::Unlink(p)
            | Action::Rmdir(p)
            | Action::Write { path: p, .. } => vec![p],
            Action::Rename(a, b) | Action::Link(a, b) => vec![a, b],
            Action::SyncAll => Vec::new(),
        }
    }

    /// The file whose bytes this action may change.
    pub fn touched_file(&self) -> Option<&str> {
        match self {
            Action::Write { path, .. } | Action::Truncate(path, _) => Some(path),
            _ => None,
        }
    }
}

pub fn parent_of(path: &str) -> &str {
    &path[..path.rfind('/').unwrap_or(0)]
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub names: BTreeMap<String, Entry>,
    /// Bytes of each file; None: not known (an operation on it had an
    /// unknown outcome), taken from what the servers hold.
    pub content: HashMap<InodeId, Option<Vec<u8>>>,
    /// Bytes of files created by the action being checked, by path (their
    /// inode numbers are not known yet).
    pub pending: BTreeMap<String, Vec<u8>>,
}

impl Model {
    pub fn is_dir(&self, path: &str) -> bool {
        path.is_empty()
            || self
                .names
                .get(path)
                .is_some_and(|e| e.kind == FileKind::Dir)
    }

    fn has_children(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.names
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    fn bytes_mut(&mut self, path: &str) -> Result<Option<&mut Vec<u8>>, String> {
        match self.names.get(path) {
            Some(Entry {
                kind: FileKind::File,
                ino: Some(ino),
            }) => {
                let ino = *ino;
                Ok(self.content.get_mut(&ino).and_then(|c| c.as_mut()))
            }
            Some(Entry {
                kind: FileKind::File,
                ino: None,
            }) => Ok(self.pending.get_mut(path)),
            Some(_) => Err("EISDIR".into()),
            None => Err("ENOENT".into()),
        }
    }

    /// The model after `a` succeeds, or why POSIX says it must fail.
    pub fn apply(&self, a: &Action) -> Result<Model, String> {
        let mut m = self.clone();
        let new_name = |m: &Model, p: &str| -> Result<(), String> {
            if !m.is_dir(parent_of(p)) {
                return Err(if m.names.contains_key(parent_of(p)) {
                    "ENOTDIR".into()
                } else {
                    "ENOENT (parent)".into()
                });
            }
            if m.names.contains_key(p) {
                return Err("EEXIST".into());
            }
            Ok(())
        };
        match a {
            Action::Mkdir(p) => {
                new_name(&m, p)?;
                m.names.insert(
                    p.clone(),
                    Entry {
                        kind: FileKind::Dir,
                        ino: None,
                    },
                );
            }
            Action::Create(p, data) => {
                new_name(&m, p)?;
                m.names.insert(
                    p.clone(),
                    Entry {
                        kind: FileKind::File,
                        ino: None,
                    },
                );
                m.pending.insert(p.clone(), data.clone());
            }
            Action::Write {
                path, offset, data, ..
            } => {
                if let Some(bytes) = m.bytes_mut(path)? {
                    let end = *offset as usize + data.len();
                    if bytes.len() < end {
                        bytes.resize(end, 0);
                    }
                    bytes[*offset as usize..end].copy_from_slice(data);
                }
            }
            Action::Truncate(path, size) => {
                if let Some(bytes) = m.bytes_mut(path)? {
                    bytes.resize(*size as usize, 0);
                }
            }
            Action::Rename(a, b) => {
                let src = m.names.get(a).cloned().ok_or("ENOENT")?;
                if !m.is_dir(parent_of(b)) {
                    return Err("ENOENT/ENOTDIR (destination parent)".into());
                }
                if a == b {
                    return Ok(m);
                }
                if b.starts_with(&format!("{a}/")) {
                    return Err("EINVAL (into itself)".into());
                }
                if let Some(dst) = m.names.get(b).cloned() {
                    if src.ino.is_some() && dst.ino == src.ino {
                        return Ok(m); // two links of one file: nothing to do
                    }
                    match (src.kind, dst.kind) {
                        (FileKind::Dir, FileKind::Dir) if m.has_children(b) => {
                            return Err("ENOTEMPTY".into());
                        }
                        (FileKind::Dir, FileKind::Dir) => {}
                        (FileKind::Dir, _) => return Err("ENOTDIR".into()),
                        (_, FileKind::Dir) => return Err("EISDIR".into()),
                        _ => {}
                    }
                    m.names.remove(b);
                    m.pending.remove(b);
                }
                let prefix = format!("{a}/");
                let moved: Vec<(String, Entry)> = m
                    .names
                    .iter()
                    .filter(|(k, _)| *k == a || k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for (k, v) in moved {
                    m.names.remove(&k);
                    let nk = format!("{b}{}", &k[a.len()..]);
                    if let Some(p) = m.pending.remove(&k) {
                        m.pending.insert(nk.clone(), p);
                    }
                    m.names.insert(nk, v);
                }
            }
            Action::Link(a, b) => {
                let src = m.names.get(a).cloned().ok_or("ENOENT")?;
                return self.link_entry(src, b);
            }
            Action::Unlink(p) => match m.names.get(p) {
                None => return Err("ENOENT".into()),
                Some(e) if e.kind == FileKind::Dir => return Err("EISDIR".into()),
                Some(_) => {
                    m.names.remove(p);
                    m.pending.remove(p);
                }
            },
            Action::Rmdir(p) => match m.names.get(p) {
                None => return Err("ENOENT".into()),
                Some(e) if e.kind != FileKind::Dir => return Err("ENOTDIR".into()),
                Some(_) if m.has_children(p) => return Err("ENOTEMPTY".into()),
                Some(_) => {
                    m.names.remove(p);
                }
            },
            Action::SyncAll => {}
        }
        Ok(m)
    }

    /// `Link` of the file `src` (a client resolves the source path to its
    /// inode first: a concurrent rename of that path does not stop it).
    pub fn link_entry(&self, src: Entry, b: &str) -> Result<Model, String> {
        if src.kind == FileKind::Dir {
            return Err("EPERM (link of a directory)".into());
        }
        if src.ino.is_some() && !self.names.values().any(|e| e.ino == src.ino) {
            // Its last name went: the inode is freed (Linux refuses to
            // link an inode with no links too).
            return Err("ENOENT (inode freed)".into());
        }
        if !self.is_dir(parent_of(b)) {
            return Err("ENOENT/ENOTDIR (parent)".into());
        }
        if self.names.contains_key(b) {
            return Err("EEXIST".into());
        }
        let mut m = self.clone();
        m.names.insert(b.to_string(), src);
        Ok(m)
    }

    /// Does the namespace of the model match what the servers hold (kinds,
    /// and inode numbers where the model knows them)?
    pub fn matches(&self, obs: &Observed) -> bool {
        // A new entry has a new inode: none the model knew.
        let known: BTreeSet<InodeId> = self
            .names
            .values()
            .filter_map(|e| e.ino)
            .chain(self.content.keys().copied())
            .collect();
        self.names.len() == obs.names.len()
            && self
                .names
                .iter()
                .zip(obs.names.iter())
                .all(|((p, e), (q, (kind, ino)))| {
                    p == q
                        && e.kind == *kind
                        && match e.ino {
                            Some(i) => i == *ino,
                            None => !known.contains(ino),
                        }
                })
    }

    /// Take the namespace the servers hold, with the bytes read from them.
    pub fn resolve(&mut self, obs: &Observed, bytes: &HashMap<InodeId, Vec<u8>>) {
        self.names = obs
            .names
            .iter()
            .map(|(p, (kind, ino))| {
                (
                    p.clone(),
                    Entry {
                        kind: *kind,
                        ino: Some(*ino),
                    },
                )
            })
            .collect();
        self.pending.clear();
        self.content = bytes.iter().map(|(i, b)| (*i, Some(b.clone()))).collect();
    }

    /// The bytes the model expects of `ino`, seen under `path`.
    pub fn expected_bytes(&self, path: &str, ino: InodeId) -> Option<&Vec<u8>> {
        if let Some(p) = self.pending.get(path) {
            return Some(p);
        }
        self.content.get(&ino).and_then(|c| c.as_ref())
    }
}

/// What the servers' metadata stores hold, and what is wrong with it.
#[derive(Debug, Default)]
pub struct Observed {
    /// Every path reachable from the root.
    pub names: BTreeMap<String, (FileKind, InodeId)>,
    /// Inconsistencies that no crash may leave (after recovery).
    pub broken: Vec<String>,
    /// Inodes with fewer names than their link count and no HELD record:
    /// leaks, which the design admits after some crashes.
    pub leaked: BTreeMap<InodeId, String>,
    pub inodes: BTreeSet<InodeId>,
    /// Reachable directories whose link count is not 2 plus their
    /// subdirectories (touch.rs; exact after any crash but a power cut).
    pub dir_links: Vec<String>,
    /// Directory touch intents in the stores whose touch the directory's
    /// owner has not applied (touch_send.rs; applied ones may stay until a
    /// later operation deletes them).
    pub touch_intents: usize,
}

/// Touch intents (disk `s` holds set `s`) whose directory still exists and
/// whose owner has applied no touch of that sender up to their seq.
pub fn unapplied_touch_intents(disks: &[Arc<SimDisk>]) -> usize {
    let mut n = 0;
    for (s, disk) in disks.iter().enumerate() {
        for (k, _) in disk.scan_live(keys::TOUCH_INTENT) {
            let Some((dir, seq, _)) = keys::touch_intent_parts(&k) else {
                continue;
            };
            let Some(owner) = disks.get(dir.owner().0 as usize) else {
                continue;
            };
            if owner.scan_live(&keys::inode(dir)).is_empty() {
                continue;
            }
            let applied = owner
                .scan_live(&keys::dir_touch(dir, madfs_types::ServerId(s as u16)))
                .first()
                .and_then(|(_, v)| v.as_slice().try_into().ok().map(u64::from_le_bytes))
                .unwrap_or(0);
            if applied < seq {
                n += 1;
            }
        }
    }
    n
}

/// Read every server's store and check its structure.
pub fn observe(disks: &[Arc<SimDisk>]) -> Observed {
    let mut obs = Observed::default();
    let mut inodes: BTreeMap<InodeId, Inode> = BTreeMap::new();
    let mut held = BTreeSet::new();
    // parent -> (name, kind, ino)
    let mut children: BTreeMap<InodeId, Vec<(String, FileKind, InodeId)>> = BTreeMap::new();
    for (s, disk) in disks.iter().enumerate() {
        for (k, v) in disk.scan_live(keys::INODE) {
            let Some(ino) = keys::ino_from_key(&k) else {
                obs.broken.push(format!("server {s}: bad inode key {k:?}"));
                continue;
            };
            match Inode::decode(&v) {
                Ok(i) => {
                    if ino.owner().0 as usize != s {
                        obs.broken
                            .push(format!("server {s} holds inode {ino} of another server"));
                    }
                    inodes.insert(ino, i);
                }
                Err(e) => obs.broken.push(format!("server {s}: inode {ino}: {e}")),
            }
        }
        for (k, _) in disk.scan_live(keys::HELD) {
            held.extend(keys::ino_from_key(&k));
        }
        for (k, v) in disk.scan_live(keys::DENTRY) {
            let Some(parent) = keys::ino_from_key(&k) else {
                obs.broken.push(format!("server {s}: bad dentry key {k:?}"));
                continue;
            };
            let name = String::from_utf8_lossy(&k[12..]).into_owned();
            match decode_dentry(&v) {
                Some((kind, ino)) => children.entry(parent).or_default().push((name, kind, ino)),
                None => obs.broken.push(format!("server {s}: bad dentry {name}")),
            }
        }
        let intents = disk.scan_live(keys::RENAME_INTENT);
        if !intents.is_empty() {
            obs.broken.push(format!(
                "server {s}: {} rename intents left after recovery",
                intents.len()
            ));
        }
    }
    obs.touch_intents = unapplied_touch_intents(disks);
    obs.inodes = inodes.keys().copied().collect();
    // Walk from the root.
    let mut names_of: HashMap<InodeId, Vec<String>> = HashMap::new();
    let mut reached_dirs = BTreeSet::new();
    let mut queue = vec![(InodeId::ROOT, String::new())];
    reached_dirs.insert(InodeId::ROOT);
    while let Some((dir, path)) = queue.pop() {
        let mut list = children.get(&dir).cloned().unwrap_or_default();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind, ino) in list {
            let p = format!("{path}/{name}");
            match inodes.get(&ino) {
                None => obs
                    .broken
                    .push(format!("{p} names inode {ino}, which does not exist")),
                Some(i) if i.attr.kind != kind => obs.broken.push(format!(
                    "{p}: entry says {kind:?}, inode {ino} is {:?}",
                    i.attr.kind
                )),
                Some(_) => {}
            }
            names_of.entry(ino).or_default().push(p.clone());
            obs.names.insert(p.clone(), (kind, ino));
            if kind == FileKind::Dir {
                if reached_dirs.insert(ino) {
                    queue.push((ino, p));
                } else {
                    obs.broken
                        .push(format!("directory {ino} has a second name {p}"));
                }
            }
        }
    }
    for dir in &reached_dirs {
        let Some(inode) = inodes.get(dir) else {
            continue;
        };
        let subdirs = children.get(dir).map_or(0, |l| {
            l.iter().filter(|(_, k, _)| *k == FileKind::Dir).count()
        });
        if inode.attr.nlink as usize != 2 + subdirs {
            obs.dir_links.push(format!(
                "directory {dir} ({}) has link count {} and {subdirs} subdirectories",
                names_of
                    .get(dir)
                    .and_then(|n| n.first())
                    .map_or("/", |n| n.as_str()),
                inode.attr.nlink
            ));
        }
    }
    // Entries of directories that do not exist or cannot be reached.
    for (parent, list) in &children {
        if reached_dirs.contains(parent) {
            continue;
        }
        let what = match inodes.get(parent) {
            None => "a removed (or never created) directory",
            Some(i) if i.attr.kind != FileKind::Dir => "a non-directory",
            Some(_) => "a directory no name reaches",
        };
        let names: Vec<&str> = list.iter().map(|(n, _, _)| n.as_str()).collect();
        obs.broken
            .push(format!("entries {names:?} live in {parent}, {what}"));
    }
    for (ino, inode) in &inodes {
        let names = names_of.get(ino).map_or(0, |v| v.len());
        if *ino == InodeId::ROOT {
            continue;
        }
        match inode.attr.kind {
            FileKind::Dir => {
                if names == 0 {
                    obs.leaked
                        .insert(*ino, format!("directory {ino} has no name"));
                }
            }
            _ => {
                let nlink = inode.attr.nlink as usize;
                if names > nlink {
                    obs.broken.push(format!(
                        "inode {ino} has {names} names {:?} but link count {nlink}",
                        names_of[ino]
                    ));
                } else if names < nlink || (names == 0 && !held.contains(ino)) {
                    obs.leaked.insert(
                        *ino,
                        format!(
                            "inode {ino}: link count {nlink}, {names} names{}",
                            if held.contains(ino) { " (held)" } else { "" }
                        ),
                    );
                }
            }
        }
    }
    obs
}
