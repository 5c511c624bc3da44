//! Parallel find and du over the servers' own shards (`Op::Find`): every
//! server scans its dentries in key order and tests its local inodes; the
//! client pages every server concurrently, builds paths from the directory
//! entries the pages carry (dir inode -> (parent, name)), keeps what lies
//! under the starting point and checks the few entries whose inode lives on
//! another server (renamed across servers, hard-linked) with a GetAttr.
//! Memory is O(directories + matches).

use crate::client::{Client, FANOUT_MAX};
use crate::error::{ClientError, Result};
use crate::path::AsFsPath;
use madfs_proto::find::{FindAttrs, FindDir, FindMatch, FindQuery, FIND_PAGE_ENTRIES_MAX};
use madfs_proto::message::{ACCESS_EXEC, ACCESS_READ};
use madfs_proto::{ErrorCode, Op, Reply};
use madfs_rpc::join::try_join_bounded;
use madfs_types::{Credentials, FileKind, FileName, InodeId, ServerId};
use std::collections::{HashMap, HashSet};

use madfs_proto::find::{SizeCmp, SizeTest};

/// GetAttrs in flight at once for entries and directories whose inode lives
/// on another server.
const GETATTR_IN_FLIGHT: usize = 64;
/// Deepest directory chain followed up to the starting point (a path of
/// PATH_MAX bytes has at most this many components).
const DEPTH_MAX: usize = 4096;

/// One entry a find reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The starting point as given, then `/name` per level below it.
    pub path: Vec<u8>,
    pub ino: InodeId,
    pub kind: FileKind,
    /// Present when the query needed attributes (size, mtime, uid tests or
    /// `want_attrs`).
    pub attrs: Option<FindAttrs>,
}

/// What a find returned: the matches, sorted by path, and the directories
/// under the starting point whose contents were skipped because the caller
/// may not read and search them (GNU find reports these as errors).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FindOutput {
    pub found: Vec<Found>,
    pub denied: Vec<Vec<u8>>,
    /// Directory entries examined, summed over every server and page (the
    /// rate IO500's find reports divides this by the time). The servers
    /// scan their whole shards, so this counts every entry of the file
    /// system, not only those below the starting point; 1 when the starting
    /// point is not a directory, or not searchable, and nothing is scanned.
    pub scanned: u64,
}

/// Totals of `du -s`: apparent bytes and inodes under a path, each inode
/// counted once however many names it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DuTotals {
    pub bytes: u64,
    pub inodes: u64,
}

/// What every server returned, merged. Matches stay in the pages they came
/// in: appending them to one vector would copy them again at every growth.
#[derive(Default)]
pub(crate) struct Scan {
    pub(crate) dirs: HashMap<InodeId, FindDir>,
    matches: Vec<Vec<FindMatch>>,
    unresolved: Vec<Vec<FindMatch>>,
    scanned: u64,
}

impl Scan {
    /// Every entry the scan returned, matched or left to check.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &FindMatch> {
        self.matches.iter().chain(&self.unresolved).flatten()
    }
}

/// A directory's place relative to the starting point.
#[derive(Clone)]
enum Place {
    /// Not below the starting point (or its chain is broken).
    Outside,
    /// Below it: path relative to it ("" for itself), and whether the
    /// caller may list it (it and every directory above it up to the root
    /// are readable and searchable).
    Inside { rel: Vec<u8>, listable: bool },
}

/// Whether `creds` may access a directory with these (perm, uid, gid) for
/// `mask`, by the servers' rule (root may read and search any directory).
fn allowed(access: (u32, u32, u32), creds: &Credentials, mask: u8) -> bool {
    let (perm, uid, gid) = access;
    madfs_types::access_allowed(madfs_types::FileKind::Dir, perm, uid, gid, creds, mask)
}

impl Client {
    async fn find_server(&self, server: ServerId, query: &FindQuery) -> Result<Scan> {
        let mut scan = Scan::default();
        let mut after = None;
        loop {
            let op = Op::Find {
                query: query.clone(),
                after: after.take(),
                max_entries: FIND_PAGE_ENTRIES_MAX,
            };
            match self.call(server, op).await? {
                Reply::FindPage {
                    dirs,
                    matches,
                    unresolved,
                    resume,
                    scanned,
                } => {
                    scan.scanned = scan.scanned.saturating_add(scanned);
                    scan.dirs.extend(dirs.into_iter().map(|d| (d.ino, d)));
                    scan.matches.push(matches);
                    scan.unresolved.push(unresolved);
                    match resume {
                        None => return Ok(scan),
                        Some(r) => after = Some(r),
                    }
                }
                other => return Err(ClientError::unexpected("find", &other)),
            }
        }
    }

    /// Scan every server concurrently and merge.
    pub(crate) async fn find_scan(&self, query: &FindQuery) -> Result<Scan> {
        let servers: Vec<ServerId> = (0..self.server_count() as u16).map(ServerId).collect();
        let calls: Vec<_> = servers
            .into_iter()
            .map(|s| self.find_server(s, query))
            .collect();
        let mut all = Scan::default();
        for s in try_join_bounded(calls, FANOUT_MAX).await? {
            all.dirs.extend(s.dirs);
            all.matches.extend(s.matches);
            all.unresolved.extend(s.unresolved);
            all.scanned = all.scanned.saturating_add(s.scanned);
        }
        Ok(all)
    }

    /// Attributes of `inos`, each asked of its owner (`GETATTR_IN_FLIGHT` at
    /// once); none for those gone since.
    pub(crate) async fn attrs_of(
        &self,
        inos: Vec<InodeId>,
    ) -> Result<HashMap<InodeId, madfs_types::Attr>> {
        let calls: Vec<_> = inos
            .into_iter()
            .map(|ino| async move {
                match self.getattr(ino).await {
                    Ok(a) => Ok(Some((ino, a))),
                    Err(e) if e.code == ErrorCode::NotFound || e.code == ErrorCode::Stale => {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .collect();
        Ok(try_join_bounded(calls, GETATTR_IN_FLIGHT)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// Every entry at or below `root` (not following symlinks, as GNU find
    /// without -L) that passes `query`, sorted by path. `root` itself is
    /// tested too, under the last component of its path. Directories below
    /// `root` that the caller may not read and search are listed in
    /// `denied` and their contents skipped; `root` itself must be
    /// searchable (else EACCES).
    pub async fn find_detailed(
        &self,
        root: impl AsFsPath,
        query: &FindQuery,
    ) -> Result<FindOutput> {
        self.find_inner(root.fs_path_bytes(), query, true).await
    }

    /// `find_detailed` for counting: the same matches, `denied` and
    /// `scanned`, but every `Found` has an empty path and they are not
    /// sorted (no path is built, however many entries match).
    pub async fn find_count(&self, root: impl AsFsPath, query: &FindQuery) -> Result<FindOutput> {
        self.find_inner(root.fs_path_bytes(), query, false).await
    }

    /// `find_detailed`; without `paths` the matches carry empty paths and
    /// are not sorted (du needs only which entries are below the root).
    async fn find_inner(&self, root: &[u8], query: &FindQuery, paths: bool) -> Result<FindOutput> {
        let root_path = root.to_vec();
        let root_attr = self.lstat(&root_path[..]).await?;
        // The root itself was examined even if nothing is scanned.
        let mut out = FindOutput {
            scanned: 1,
            ..FindOutput::default()
        };
        let root_name: Vec<u8> = {
            let trimmed: &[u8] = {
                let mut t = &root_path[..];
                while t.len() > 1 && t.ends_with(b"/") {
                    t = &t[..t.len() - 1];
                }
                t
            };
            match trimmed.iter().rposition(|&b| b == b'/') {
                Some(i) if trimmed.len() > 1 => trimmed[i + 1..].to_vec(),
                _ => trimmed.to_vec(),
            }
        };
        if query.matches(&root_name, &root_attr) {
            out.found.push(Found {
                path: root_path.clone(),
                ino: root_attr.ino,
                kind: root_attr.kind,
                attrs: query.needs_attrs().then(|| FindAttrs::of(&root_attr)),
            });
        }
        if root_attr.kind != FileKind::Dir {
            return Ok(out);
        }
        let root_ok = allowed(
            (root_attr.perm, root_attr.uid, root_attr.gid),
            self.credentials(),
            ACCESS_READ | ACCESS_EXEC,
        );
        if !root_ok {
            out.denied.push(root_path);
            return Ok(out);
        }
        let scan = self.find_scan(query).await?;
        // The scan includes the root's own dentry (unless the root is `/`,
        // which has none).
        out.scanned = scan.scanned.max(1);

        // Directories whose inode lives elsewhere: ask their owners.
        let remote: Vec<InodeId> = scan
            .dirs
            .values()
            .filter(|d| d.access.is_none())
            .map(|d| d.ino)
            .collect();
        let remote_attrs = self.attrs_of(remote).await?;
        let access_of = |d: &FindDir| -> Option<(u32, u32, u32)> {
            d.access
                .or_else(|| remote_attrs.get(&d.ino).map(|a| (a.perm, a.uid, a.gid)))
        };

        let creds = self.credentials().clone();
        let mut places: HashMap<InodeId, Place> = HashMap::new();
        places.insert(
            root_attr.ino,
            Place::Inside {
                rel: Vec::new(),
                listable: true,
            },
        );
        // Where directory `dir` sits, memoized; iterative so a deep tree
        // cannot overflow the stack.
        let place_of = |dir: InodeId, places: &mut HashMap<InodeId, Place>| -> Place {
            let mut chain = Vec::new();
            let mut cur = dir;
            let base = loop {
                if let Some(p) = places.get(&cur) {
                    break p.clone();
                }
                match scan.dirs.get(&cur) {
                    Some(d) if chain.len() < DEPTH_MAX && !chain.contains(&cur) => {
                        chain.push(cur);
                        cur = d.parent;
                    }
                    _ => break Place::Outside,
                }
            };
            let mut p = base;
            for &ino in chain.iter().rev() {
                p = match p {
                    Place::Outside => Place::Outside,
                    Place::Inside { rel, listable } => {
                        let d = &scan.dirs[&ino];
                        let mut r = rel;
                        if !r.is_empty() {
                            r.push(b'/');
                        }
                        r.extend_from_slice(d.name.as_bytes());
                        let ok = listable
                            && access_of(d)
                                .is_some_and(|a| allowed(a, &creds, ACCESS_READ | ACCESS_EXEC));
                        Place::Inside {
                            rel: r,
                            listable: ok,
                        }
                    }
                };
                places.insert(ino, p.clone());
            }
            p
        };

        let prefix: Vec<u8> = {
            let mut t = &root_path[..];
            while t.ends_with(b"/") {
                t = &t[..t.len() - 1];
            }
            t.to_vec()
        };
        let full = |rel: &[u8], name: &FileName| -> Vec<u8> {
            if !paths {
                return Vec::new();
            }
            let mut p = Vec::with_capacity(prefix.len() + rel.len() + name.as_bytes().len() + 2);
            p.extend_from_slice(&prefix);
            p.push(b'/');
            if !rel.is_empty() {
                p.extend_from_slice(rel);
                p.push(b'/');
            }
            p.extend_from_slice(name.as_bytes());
            p
        };
        // Denied directories under the root, reported once each.
        let dir_inos: Vec<InodeId> = scan.dirs.keys().copied().collect();
        for ino in dir_inos {
            if let Place::Inside {
                rel,
                listable: false,
            } = place_of(ino, &mut places)
            {
                let parent_listable = match place_of(scan.dirs[&ino].parent, &mut places) {
                    Place::Inside { listable, .. } => listable,
                    Place::Outside => false,
                };
                if parent_listable {
                    let mut p = prefix.clone();
                    p.push(b'/');
                    p.extend_from_slice(&rel);
                    out.denied.push(p);
                }
            }
        }

        let keep = |m: &FindMatch, places: &mut HashMap<InodeId, Place>| -> Option<Vec<u8>> {
            match place_of(m.parent, places) {
                Place::Inside {
                    rel,
                    listable: true,
                } => Some(full(&rel, &m.name)),
                _ => None,
            }
        };
        out.found.reserve(scan.matches.iter().map(Vec::len).sum());
        for m in scan.matches.iter().flatten() {
            if m.ino == root_attr.ino && m.kind == FileKind::Dir {
                continue; // the root itself, tested above
            }
            if let Some(path) = keep(m, &mut places) {
                out.found.push(Found {
                    path,
                    ino: m.ino,
                    kind: m.kind,
                    attrs: m.attrs,
                });
            }
        }
        let mut pending = Vec::new();
        for m in scan.unresolved.iter().flatten() {
            if let Some(path) = keep(m, &mut places) {
                pending.push((path, m));
            }
        }
        if !pending.is_empty() {
            let mut inos: Vec<InodeId> = pending.iter().map(|(_, m)| m.ino).collect();
            inos.sort();
            inos.dedup();
            let attrs = self.attrs_of(inos).await?;
            for (path, m) in pending {
                let Some(a) = attrs.get(&m.ino) else { continue };
                let fa = FindAttrs::of(a);
                if query.matches_attrs(&fa) {
                    out.found.push(Found {
                        path,
                        ino: m.ino,
                        kind: m.kind,
                        attrs: Some(fa),
                    });
                }
            }
        }
        if paths {
            // Equal paths (a directory renamed during the find) are rare and
            // interchangeable: no need for a stable sort.
            out.found.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        }
        out.denied.sort();
        Ok(out)
    }

    /// `find_detailed` without the denied directories: (path, entry).
    pub async fn find(&self, root: impl AsFsPath, query: &FindQuery) -> Result<Vec<Found>> {
        Ok(self.find_detailed(root, query).await?.found)
    }

    /// `du -s -b` and `du -s --inodes` of `root`: the apparent sizes of every
    /// inode at or below it (directories and symlinks included, hard links
    /// once), by the same server-side scan as find.
    pub async fn du(&self, root: impl AsFsPath) -> Result<(DuTotals, Vec<Vec<u8>>)> {
        let query = FindQuery {
            want_attrs: true,
            ..FindQuery::default()
        };
        let out = self.find_inner(root.fs_path_bytes(), &query, false).await?;
        let mut seen = HashSet::new();
        let mut t = DuTotals::default();
        for f in &out.found {
            if seen.insert(f.ino) {
                t.inodes += 1;
                t.bytes = t.bytes.saturating_add(f.attrs.map(|a| a.size).unwrap_or(0));
            }
        }
        Ok((t, out.denied))
    }
}

/// Parse GNU find's `-size` argument: `[+-]N[bcwkMG]` (default unit: 512-byte
/// blocks).
pub fn parse_size(arg: &str) -> std::result::Result<SizeTest, String> {
    let bad = || format!("invalid argument '{arg}' to -size");
    let (cmp, rest) = match arg.as_bytes().first() {
        Some(b'+') => (SizeCmp::Greater, &arg[1..]),
        Some(b'-') => (SizeCmp::Less, &arg[1..]),
        _ => (SizeCmp::Equal, arg),
    };
    let (digits, unit) = match rest.as_bytes().last() {
        Some(c) if c.is_ascii_digit() => (rest, 512),
        Some(c) => {
            let unit = match c {
                b'b' => 512,
                b'c' => 1,
                b'w' => 2,
                b'k' => 1 << 10,
                b'M' => 1 << 20,
                b'G' => 1 << 30,
                _ => return Err(bad()),
            };
            (&rest[..rest.len() - 1], unit)
        }
        None => return Err(bad()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n = digits.parse::<u64>().map_err(|_| bad())?;
    Ok(SizeTest { cmp, n, unit })
}

/// Parse `-type` (one of f, d, l, p, s, c, b).
pub fn parse_type(arg: &str) -> std::result::Result<FileKind, String> {
    match arg {
        "f" => Ok(FileKind::File),
        "d" => Ok(FileKind::Dir),
        "l" => Ok(FileKind::Symlink),
        "p" => Ok(FileKind::Fifo),
        "s" => Ok(FileKind::Socket),
        "c" => Ok(FileKind::CharDev),
        "b" => Ok(FileKind::BlockDev),
        "D" => Err(format!(
            "-type {arg}: MadFS has no such files (doors are Solaris's)"
        )),
        _ => Err(format!("Unknown argument to -type: {arg}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arguments_parse_like_gnu_find() {
        let s = |a| parse_size(a).unwrap();
        assert_eq!(
            s("3901c"),
            SizeTest {
                cmp: SizeCmp::Equal,
                n: 3901,
                unit: 1
            }
        );
        assert_eq!(
            s("+4k"),
            SizeTest {
                cmp: SizeCmp::Greater,
                n: 4,
                unit: 1024
            }
        );
        assert_eq!(
            s("-1M"),
            SizeTest {
                cmp: SizeCmp::Less,
                n: 1,
                unit: 1 << 20
            }
        );
        assert_eq!(s("8").unit, 512);
        assert_eq!(s("2G").unit, 1 << 30);
        assert_eq!(s("3w").unit, 2);
        assert_eq!(s("3b").unit, 512);
        for bad in [
            "",
            "+",
            "k",
            "4x",
            "-k",
            "1.5k",
            "--3",
            "+-3",
            "99999999999999999999",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        // Semantics after parsing: 3901 bytes is 4k, 8 blocks, not -4k.
        assert!(s("4k").matches(3901));
        assert!(s("8").matches(3901));
        assert!(!s("-4k").matches(3901));
        assert!(s("-4k").matches(3072));
        assert!(s("+3k").matches(3901));
        assert!(s("-1M").matches(0) && !s("-1M").matches(1));
    }

    #[test]
    fn types_parse() {
        assert_eq!(parse_type("f"), Ok(FileKind::File));
        assert_eq!(parse_type("d"), Ok(FileKind::Dir));
        assert_eq!(parse_type("l"), Ok(FileKind::Symlink));
        assert_eq!(parse_type("p"), Ok(FileKind::Fifo));
        assert_eq!(parse_type("s"), Ok(FileKind::Socket));
        assert_eq!(parse_type("c"), Ok(FileKind::CharDev));
        assert_eq!(parse_type("b"), Ok(FileKind::BlockDev));
        assert!(parse_type("x").is_err());
        assert!(parse_type("D").is_err());
    }

    #[test]
    fn permission_bits_decide_listing() {
        let user = Credentials {
            uid: 1000,
            gid: 100,
            groups: vec![7],
        };
        let rx = ACCESS_READ | ACCESS_EXEC;
        assert!(allowed((0o700, 1000, 0), &user, rx));
        assert!(!allowed((0o300, 1000, 0), &user, rx));
        assert!(allowed((0o050, 0, 7), &user, rx));
        assert!(!allowed((0o705, 0, 7), &user, rx));
        assert!(allowed((0o005, 0, 0), &user, rx));
        assert!(allowed((0o000, 5, 5), &Credentials::root(), rx));
    }
}
