//! Listing a whole tree before copying it: every entry with its kind,
//! size, mtime and inode identity, relative to the root. A local tree is
//! read with readdir and lstat; a MadFS tree with one server-side scan
//! (`Client::find_detailed`: every server scans its own shard at once), so
//! listing 100,000 MadFS files costs a few requests, not 100,000. An entry
//! that cannot be read is reported by name and the rest is listed.

use super::fs::{local_meta, show, Fs, Result};
use madfs_client::{FileKind, FindQuery, Timestamp};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One entry of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Path below the root ("" for the root itself), `/`-separated.
    pub rel: Vec<u8>,
    pub kind: FileKind,
    pub size: u64,
    pub mtime: Timestamp,
    /// The inode's identity on its side (names sharing it are hard links).
    pub ino_key: u64,
    /// Set for a regular file that other names in the tree may share.
    pub linked: bool,
}

/// A listed tree: its entries, parents before children, and what could
/// not be listed.
#[derive(Default)]
pub struct Tree {
    pub nodes: Vec<Node>,
    pub errors: Vec<String>,
}

impl Tree {
    /// Entries by relative path.
    pub fn index(&self) -> HashMap<&[u8], &Node> {
        self.nodes.iter().map(|n| (n.rel.as_slice(), n)).collect()
    }
}

/// `root` without trailing slashes (but `/` stays `/`).
pub fn trim_root(root: &[u8]) -> &[u8] {
    let mut r = root;
    while r.len() > 1 && r.ends_with(b"/") {
        r = &r[..r.len() - 1];
    }
    r
}

/// List the tree at `root` (not following symlinks). None when `root`
/// itself does not exist.
pub async fn walk(fs: &Fs, root: &[u8]) -> Result<Option<Tree>> {
    let root = trim_root(root).to_vec();
    match fs {
        Fs::Local => {
            let root2 = root.clone();
            tokio::task::spawn_blocking(move || walk_local(&root2))
                .await
                .map_err(|e| format!("listing '{}' failed: {e}", show(&root)))?
        }
        Fs::Madfs(m) => {
            if fs.lstat_opt(&root).await?.is_none() {
                return Ok(None);
            }
            let query = FindQuery {
                want_attrs: true,
                ..FindQuery::default()
            };
            let out = m
                .client
                .find_detailed(root.as_slice(), &query)
                .await
                .map_err(|e| format!("cannot list 'madfs:{}': {e}", show(&root)))?;
            let mut tree = Tree::default();
            for d in out.denied {
                tree.errors.push(format!(
                    "cannot read directory 'madfs:{}': permission denied",
                    show(&d)
                ));
            }
            let mut links: HashMap<u64, usize> = HashMap::new();
            for f in &out.found {
                if f.kind == FileKind::File {
                    *links.entry(f.ino.0).or_default() += 1;
                }
            }
            for f in out.found {
                let rel = match f.path.strip_prefix(root.as_slice()) {
                    Some(r) => r.strip_prefix(b"/").unwrap_or(r).to_vec(),
                    None => continue,
                };
                let attrs = f.attrs.unwrap_or(madfs_client::FindAttrs {
                    size: 0,
                    mtime: Timestamp::default(),
                    uid: 0,
                });
                tree.nodes.push(Node {
                    rel,
                    kind: f.kind,
                    size: attrs.size,
                    mtime: attrs.mtime,
                    ino_key: f.ino.0,
                    linked: f.kind == FileKind::File && links.get(&f.ino.0) > Some(&1),
                });
            }
            // Sorted by path: a parent comes before its children, as "a"
            // sorts before "a/b" (and '/' before every other name byte
            // that could follow it, but ' ' to '.', which do not matter
            // here: only parent-first order does).
            tree.nodes.sort_by(|a, b| a.rel.cmp(&b.rel));
            Ok(Some(tree))
        }
    }
}

fn walk_local(root: &[u8]) -> Result<Option<Tree>> {
    let path = Path::new(OsStr::from_bytes(root));
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => local_meta(&m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot stat '{}': {e}", show(root))),
    };
    let mut tree = Tree::default();
    let node = |rel: Vec<u8>, m: &super::fs::Meta| Node {
        rel,
        kind: m.kind,
        size: m.size,
        mtime: m.mtime,
        ino_key: m.link_key,
        linked: m.kind == FileKind::File && m.nlink > 1,
    };
    tree.nodes.push(node(Vec::new(), &meta));
    if meta.kind != FileKind::Dir {
        return Ok(Some(tree));
    }
    // Depth first with an explicit stack (no recursion limit on depth);
    // each directory's names sorted, so runs list the same order.
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let dir = super::fs::join(root, &rel);
        let rd = match std::fs::read_dir(Path::new(OsStr::from_bytes(&dir))) {
            Ok(rd) => rd,
            Err(e) => {
                tree.errors
                    .push(format!("cannot read directory '{}': {e}", show(&dir)));
                continue;
            }
        };
        let mut entries = Vec::new();
        for ent in rd {
            match ent.and_then(|e| Ok((e.file_name(), e.metadata()?))) {
                Ok((name, m)) => entries.push((name.as_bytes().to_vec(), local_meta(&m))),
                Err(e) => tree
                    .errors
                    .push(format!("cannot read directory '{}': {e}", show(&dir))),
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut subdirs = Vec::new();
        for (name, m) in entries {
            let child = if rel.is_empty() {
                name
            } else {
                super::fs::join(&rel, &name)
            };
            if m.kind == FileKind::Dir {
                subdirs.push(child.clone());
            }
            tree.nodes.push(node(child, &m));
        }
        // Pushed in reverse so they are visited in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(Some(tree))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_trees_list_parents_first_with_links() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), b"x").unwrap();
        std::fs::hard_link(root.join("a/b/f"), root.join("g")).unwrap();
        std::os::unix::fs::symlink("a", root.join("s")).unwrap();
        let tree = walk_local(root.as_os_str().as_bytes()).unwrap().unwrap();
        let rels: Vec<String> = tree.nodes.iter().map(|n| show(&n.rel)).collect();
        assert_eq!(rels, ["", "a", "g", "s", "a/b", "a/b/f"]);
        let idx = tree.index();
        assert!(idx[&b"g"[..]].linked && idx[&b"a/b/f"[..]].linked);
        assert_eq!(idx[&b"g"[..]].ino_key, idx[&b"a/b/f"[..]].ino_key);
        assert_eq!(idx[&b"s"[..]].kind, FileKind::Symlink);
        assert!(walk_local(b"/nonexistent/madfs-walk").unwrap().is_none());
        assert_eq!(trim_root(b"/x//"), b"/x");
        assert_eq!(trim_root(b"/"), b"/");
    }
}
