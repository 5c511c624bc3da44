//! What a copy or a sync must do, decided from the listed trees before
//! anything is written: directories to make, files, symlinks and special
//! files to copy, hard links to make, entries to delete (sync --delete,
//! entries of the wrong kind, our own temporary files), and directories
//! whose attributes are set last. `sync` copies only what differs: a
//! different kind, size or mtime (or, with --checksum, contents).

use super::copy::is_temp_name;
use super::fs::{join, split_path};
use super::walk::{Node, Tree};
use madfs_client::FileKind;
use std::collections::{HashMap, HashSet};

/// A regular file to copy.
#[derive(Clone, Debug)]
pub struct FileTask {
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
    pub size: u64,
    /// Nothing is known at `dst` (sync saw nothing; cp does not look).
    pub fresh: bool,
}

/// A name to give to a file copied (or kept) under another name.
#[derive(Clone, Debug)]
pub struct LinkTask {
    pub primary_dst: Vec<u8>,
    pub dst: Vec<u8>,
    /// Something is at `dst` and must go first.
    pub replace: bool,
}

#[derive(Default)]
pub struct Plan {
    /// (path, is a directory), removed first.
    pub deletes: Vec<(Vec<u8>, bool)>,
    /// Directories to make, parents first, with their source.
    pub mkdirs: Vec<(Vec<u8>, Vec<u8>)>,
    pub files: Vec<FileTask>,
    /// sync --checksum: files whose size and mtime match, to compare.
    pub compares: Vec<FileTask>,
    /// (src, dst, replace)
    pub symlinks: Vec<(Vec<u8>, Vec<u8>, bool)>,
    pub specials: Vec<(Vec<u8>, Vec<u8>, bool)>,
    pub links: Vec<LinkTask>,
    /// Directories whose mode and times are set at the end: (src, dst),
    /// parents first (applied in reverse).
    pub dir_attrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Entries found already up to date.
    pub unchanged: u64,
}

/// How the destination is compared.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncRules {
    pub delete: bool,
    pub checksum: bool,
}

fn parent_rel(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => &rel[..i],
        None => b"",
    }
}

impl Plan {
    /// Add the copy of tree `src` (at `src_root`) to `dst_root`. With
    /// `dst` (sync), what is there already is compared and kept when equal;
    /// without it (cp), everything is copied.
    pub fn add(
        &mut self,
        src_root: &[u8],
        src: &Tree,
        dst_root: &[u8],
        dst: Option<&Tree>,
        rules: SyncRules,
    ) {
        let at = |root: &[u8], rel: &[u8]| -> Vec<u8> {
            if rel.is_empty() {
                root.to_vec()
            } else {
                join(root, rel)
            }
        };
        let dst_index: HashMap<&[u8], &Node> = dst.map(Tree::index).unwrap_or_default();
        let sync = dst.is_some();
        // Hard links: the first name of each inode is copied, the others
        // become links to its copy.
        let mut primaries: HashMap<u64, &Node> = HashMap::new();
        // Directories to delete first: nothing below them needs a look.
        let mut deleted_dirs: Vec<Vec<u8>> = Vec::new();
        // Directories something is written into (their times change).
        let mut touched: HashSet<Vec<u8>> = HashSet::new();
        let mut recopied: HashSet<&[u8]> = HashSet::new();

        if let Some(dst) = dst {
            let src_index = src.index();
            for d in &dst.nodes {
                let name = split_path(&d.rel).1;
                if deleted_dirs
                    .iter()
                    .any(|p| d.rel.starts_with(p) && d.rel.get(p.len()) == Some(&b'/'))
                {
                    continue;
                }
                let stray = is_temp_name(name) && !d.rel.is_empty();
                let wrong_kind = src_index
                    .get(d.rel.as_slice())
                    .is_some_and(|s| (s.kind == FileKind::Dir) != (d.kind == FileKind::Dir));
                let extra = rules.delete && !src_index.contains_key(d.rel.as_slice());
                if stray || wrong_kind || extra {
                    let is_dir = d.kind == FileKind::Dir;
                    self.deletes.push((at(dst_root, &d.rel), is_dir));
                    touched.insert(parent_rel(&d.rel).to_vec());
                    if is_dir {
                        deleted_dirs.push(d.rel.clone());
                    }
                }
            }
        }
        let gone = |rel: &[u8]| {
            deleted_dirs.iter().any(|p| {
                rel == p.as_slice() || (rel.starts_with(p) && rel.get(p.len()) == Some(&b'/'))
            })
        };
        let existing = |rel: &[u8]| -> Option<&Node> {
            if gone(rel) {
                return None;
            }
            dst_index.get(rel).copied()
        };

        for n in &src.nodes {
            let s = at(src_root, &n.rel);
            let d = at(dst_root, &n.rel);
            let old = existing(&n.rel);
            // A non-directory where the source has a directory (or the
            // reverse) was deleted above; treat it as absent.
            let old = old.filter(|o| (o.kind == FileKind::Dir) == (n.kind == FileKind::Dir));
            let same_meta = |o: &Node| o.kind == n.kind && o.size == n.size && o.mtime == n.mtime;
            match n.kind {
                FileKind::Dir => {
                    if old.is_none() {
                        self.mkdirs.push((s.clone(), d.clone()));
                        touched.insert(parent_rel(&n.rel).to_vec());
                    }
                    if !sync || old.is_none_or(|o| o.mtime != n.mtime) {
                        touched.insert(n.rel.clone());
                    }
                    self.dir_attrs.push((s, d));
                }
                FileKind::File => {
                    if n.linked {
                        if let Some(p) = primaries.get(&n.ino_key) {
                            let primary_dst = at(dst_root, &p.rel);
                            let intact = !recopied.contains(p.rel.as_slice())
                                && old.is_some_and(|o| {
                                    existing(&p.rel).is_some_and(|po| po.ino_key == o.ino_key)
                                });
                            if intact && sync {
                                self.unchanged += 1;
                            } else {
                                self.links.push(LinkTask {
                                    primary_dst,
                                    dst: d,
                                    replace: old.is_some() || !sync,
                                });
                                touched.insert(parent_rel(&n.rel).to_vec());
                            }
                            continue;
                        }
                        primaries.insert(n.ino_key, n);
                    }
                    let task = FileTask {
                        src: s,
                        dst: d,
                        size: n.size,
                        fresh: old.is_none(),
                    };
                    match old {
                        Some(o) if sync && same_meta(o) && rules.checksum => {
                            // It may turn out to differ and be replaced.
                            touched.insert(parent_rel(&n.rel).to_vec());
                            self.compares.push(task)
                        }
                        Some(o) if sync && same_meta(o) => self.unchanged += 1,
                        _ => {
                            recopied.insert(&n.rel);
                            touched.insert(parent_rel(&n.rel).to_vec());
                            self.files.push(task);
                        }
                    }
                }
                FileKind::Symlink => match old {
                    Some(o) if sync && same_meta(o) => self.unchanged += 1,
                    _ => {
                        touched.insert(parent_rel(&n.rel).to_vec());
                        self.symlinks.push((s, d, old.is_some() || !sync));
                    }
                },
                _ => match old {
                    Some(o) if sync && o.kind == n.kind && o.mtime == n.mtime => {
                        self.unchanged += 1
                    }
                    _ => {
                        touched.insert(parent_rel(&n.rel).to_vec());
                        self.specials.push((s, d, old.is_some() || !sync));
                    }
                },
            }
        }
        // Only directories whose times may have changed get them back
        // (an unchanged tree costs no request per directory).
        self.dir_attrs.retain(|(_, d)| {
            let rel = d.strip_prefix(dst_root).unwrap_or(d);
            let rel = rel.strip_prefix(b"/").unwrap_or(rel);
            touched.contains(rel)
        });
    }

    /// Files to copy, counted as the progress display counts them.
    pub fn totals(&self) -> (u64, u64) {
        let files = self.files.len() + self.symlinks.len() + self.specials.len();
        let bytes = self.files.iter().map(|f| f.size).sum();
        (files as u64, bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty()
            && self.mkdirs.is_empty()
            && self.files.is_empty()
            && self.compares.is_empty()
            && self.symlinks.is_empty()
            && self.specials.is_empty()
            && self.links.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_client::Timestamp;

    fn node(rel: &str, kind: FileKind, size: u64, mtime: i64, ino: u64) -> Node {
        Node {
            rel: rel.as_bytes().to_vec(),
            kind,
            size,
            mtime: Timestamp {
                secs: mtime,
                nanos: 0,
            },
            ino_key: ino,
            linked: false,
        }
    }

    fn names(v: &[FileTask]) -> Vec<String> {
        v.iter().map(|f| super::super::fs::show(&f.dst)).collect()
    }

    #[test]
    fn sync_copies_only_what_differs_and_deletes_strays() {
        use FileKind::*;
        let mut a = node("same", File, 3, 10, 2);
        a.linked = false;
        let src = Tree {
            nodes: vec![
                node("", Dir, 0, 1, 1),
                a,
                node("newer", File, 3, 11, 3),
                node("new", File, 3, 10, 4),
                node("d", Dir, 0, 1, 5),
            ],
            errors: vec![],
        };
        let dst = Tree {
            nodes: vec![
                node("", Dir, 0, 1, 91),
                node("same", File, 3, 10, 92),
                node("newer", File, 3, 10, 93),
                node("d", File, 0, 1, 94),
                node("extra", File, 1, 1, 95),
                node(".madfs-stage-0123456789abcdef.tmp", File, 1, 1, 96),
            ],
            errors: vec![],
        };
        let mut p = Plan::default();
        p.add(b"/s", &src, b"/t", Some(&dst), SyncRules::default());
        assert_eq!(names(&p.files), ["/t/newer", "/t/new"]);
        assert!(!p.files[0].fresh && p.files[1].fresh);
        assert_eq!(p.unchanged, 1);
        let dels: Vec<String> = p
            .deletes
            .iter()
            .map(|d| super::super::fs::show(&d.0))
            .collect();
        // The file in the way of directory d, and our leftover temp file;
        // "extra" stays without --delete.
        assert_eq!(dels, ["/t/d", "/t/.madfs-stage-0123456789abcdef.tmp"]);
        assert_eq!(p.mkdirs.len(), 1);
        let mut p = Plan::default();
        let rules = SyncRules {
            delete: true,
            checksum: true,
        };
        p.add(b"/s", &src, b"/t", Some(&dst), rules);
        assert_eq!(p.deletes.len(), 3);
        assert_eq!(names(&p.compares), ["/t/same"]);
        assert_eq!(p.unchanged, 0);
    }

    #[test]
    fn hard_links_copy_once_and_link_the_rest() {
        use FileKind::*;
        let mut f = node("a", File, 5, 1, 7);
        f.linked = true;
        let mut g = node("b", File, 5, 1, 7);
        g.linked = true;
        let src = Tree {
            nodes: vec![node("", Dir, 0, 1, 1), f, g],
            errors: vec![],
        };
        let mut p = Plan::default();
        p.add(b"/s", &src, b"/t", None, SyncRules::default());
        assert_eq!(names(&p.files), ["/t/a"]);
        assert_eq!(p.links.len(), 1);
        assert_eq!(p.links[0].primary_dst, b"/t/a");
        // Synced again with the same structure at the destination: nothing.
        let mut a2 = node("a", File, 5, 1, 70);
        a2.linked = true;
        let mut b2 = node("b", File, 5, 1, 70);
        b2.linked = true;
        let dst = Tree {
            nodes: vec![node("", Dir, 0, 1, 1), a2, b2],
            errors: vec![],
        };
        let mut p = Plan::default();
        p.add(b"/s", &src, b"/t", Some(&dst), SyncRules::default());
        assert!(p.is_empty(), "{:?} {:?}", names(&p.files), p.links);
        assert_eq!(p.unchanged, 2);
    }
}
