//! Paths: parsing and validation (pure), resolution component by component
//! with symlinks, and the path-level API the CLI and the preload library use.
//!
//! MadFS paths are byte strings, absolute within the file system: "/a/b" and
//! "a/b" both start at the root. Resolution is physical, as in the kernel:
//! ".." goes back to the directory the walk came from (a stack, so it works
//! without parent pointers), and after a symlink to where the link led.

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::file::{File, OpenOptions};
use madfs_proto::message::{DirEntry, SetAttrs, ACCESS_EXEC};
use madfs_proto::ErrorCode;
use madfs_rpc::join::try_join_bounded;
use madfs_types::{limits, Attr, FileKind, FileName, InodeId, TimeSet};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

/// Symlinks one resolution may follow before giving up (Linux: 40).
pub const SYMLINK_FOLLOW_MAX: u32 = 40;

/// Unlinks `remove_dir_all` keeps in flight within one directory.
const REMOVE_IN_FLIGHT: usize = 16;

/// Anything that names a MadFS path: strings, byte strings, std paths.
pub trait AsFsPath {
    fn fs_path_bytes(&self) -> &[u8];
}

impl AsFsPath for str {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}
impl AsFsPath for String {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}
impl AsFsPath for [u8] {
    fn fs_path_bytes(&self) -> &[u8] {
        self
    }
}
impl<const N: usize> AsFsPath for [u8; N] {
    fn fs_path_bytes(&self) -> &[u8] {
        self
    }
}
impl AsFsPath for Vec<u8> {
    fn fs_path_bytes(&self) -> &[u8] {
        self
    }
}
impl AsFsPath for OsStr {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}
impl AsFsPath for OsString {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}
impl AsFsPath for Path {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_os_str().as_bytes()
    }
}
impl AsFsPath for PathBuf {
    fn fs_path_bytes(&self) -> &[u8] {
        self.as_os_str().as_bytes()
    }
}
impl<T: AsFsPath + ?Sized> AsFsPath for &T {
    fn fs_path_bytes(&self) -> &[u8] {
        (**self).fs_path_bytes()
    }
}

/// One step of a path.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PathComponent {
    Name(FileName),
    /// "..".
    Parent,
}

/// A validated path: its steps ("." and empty ones dropped) and whether it
/// must name a directory (it ends in '/', "." or "..").
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ParsedPath {
    pub components: Vec<PathComponent>,
    pub must_be_dir: bool,
    /// Starts with '/'. Top-level paths are rooted either way; this matters
    /// for symlink targets, where a relative one starts at the link's directory.
    pub absolute: bool,
}

impl ParsedPath {
    /// Check and split a path: NUL → InvalidArgument, empty → NotFound, over
    /// PATH_MAX_BYTES or a component over NAME_MAX_BYTES → NameTooLong.
    pub fn parse(path: &[u8]) -> Result<ParsedPath> {
        if path.len() > limits::PATH_MAX_BYTES {
            return Err(ClientError::new(
                ErrorCode::NameTooLong,
                format!(
                    "path of {} bytes (at most {})",
                    path.len(),
                    limits::PATH_MAX_BYTES
                ),
            ));
        }
        if path.contains(&0) {
            return Err(ClientError::new(
                ErrorCode::InvalidArgument,
                "path contains a NUL byte",
            ));
        }
        if path.is_empty() {
            return Err(ClientError::new(ErrorCode::NotFound, "empty path"));
        }
        let mut components = Vec::new();
        for part in path.split(|&b| b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => components.push(PathComponent::Parent),
                name => components.push(PathComponent::Name(
                    FileName::new(name).map_err(|e| ClientError::from_name(e, name))?,
                )),
            }
        }
        let last = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
        Ok(ParsedPath {
            components,
            must_be_dir: matches!(last, b"" | b"." | b".."),
            absolute: path[0] == b'/',
        })
    }

    /// The final name and the path of its directory; None when the path
    /// ends in ".." or names the root.
    pub fn split_last(&self) -> Option<(ParsedPath, FileName)> {
        match self.components.last() {
            Some(PathComponent::Name(n)) => Some((
                ParsedPath {
                    components: self.components[..self.components.len() - 1].to_vec(),
                    must_be_dir: true,
                    absolute: self.absolute,
                },
                n.clone(),
            )),
            _ => None,
        }
    }

    /// The path with ".." applied lexically (ignoring symlinks): the names
    /// from the root down.
    pub fn lexical(&self) -> Vec<FileName> {
        let mut out: Vec<FileName> = Vec::new();
        for c in &self.components {
            match c {
                PathComponent::Name(n) => out.push(n.clone()),
                PathComponent::Parent => {
                    out.pop();
                }
            }
        }
        out
    }
}

/// A path in canonical lexical form: "/" then names joined by '/', with
/// ".", "..", repeated and trailing slashes resolved (symlinks are not).
pub fn normalize(path: impl AsFsPath) -> Result<Vec<u8>> {
    let parsed = ParsedPath::parse(path.fs_path_bytes())?;
    Ok(join_names(&parsed.lexical()))
}

fn join_names(names: &[FileName]) -> Vec<u8> {
    if names.is_empty() {
        return b"/".to_vec();
    }
    let mut out = Vec::new();
    for n in names {
        out.push(b'/');
        out.extend_from_slice(n.as_bytes());
    }
    out
}

/// Whether `inner` lies strictly below `outer` (both lexical name lists).
fn is_strictly_inside(inner: &[FileName], outer: &[FileName]) -> bool {
    inner.len() > outer.len() && inner[..outer.len()] == *outer
}

fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// A directory on the walk's stack, or the walk's result on top of it.
#[derive(Clone, Debug)]
struct Node {
    ino: InodeId,
    kind: FileKind,
    /// Known when the node came from a lookup; the root's is fetched lazily.
    attr: Option<Attr>,
}

impl Node {
    fn root() -> Node {
        Node {
            ino: InodeId::ROOT,
            kind: FileKind::Dir,
            attr: None,
        }
    }

    fn from_attr(attr: Attr) -> Node {
        Node {
            ino: attr.ino,
            kind: attr.kind,
            attr: Some(attr),
        }
    }
}

/// Where a resolution stands: the directories walked through, and how many
/// symlinks it has followed (the limit is per resolution, not per link).
struct Walk {
    stack: Vec<Node>,
    links: u32,
}

impl Walk {
    fn at_root() -> Walk {
        Walk {
            stack: vec![Node::root()],
            links: 0,
        }
    }

    fn top(&self) -> &Node {
        self.stack.last().expect("the root is never popped")
    }
}

/// Refuse `mask` (ACCESS_* bits) to a caller the attributes do not allow,
/// as the owner's Access operation would.
fn check_access(client: &Client, attr: &Attr, mask: u8) -> Result<()> {
    if mask == 0 || attr.allows(client.credentials(), mask) {
        Ok(())
    } else {
        Err(ClientError::new(ErrorCode::AccessDenied, ""))
    }
}

/// A removal racing with another one is not an error.
fn ignore_gone(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.code == ErrorCode::NotFound => Ok(()),
        other => other,
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Client {
    /// Walk `components` from where `walk` stands, following symlinks in
    /// every component but the last, and in the last if `follow_last` or
    /// `must_be_dir` (a trailing slash follows, as in the kernel). On success
    /// the top of the stack is the result. Names come from the metadata
    /// cache where it has them, except the last one with `fresh_last`
    /// (open's close-to-open revalidation).
    async fn walk(
        &self,
        walk: &mut Walk,
        components: Vec<PathComponent>,
        follow_last: bool,
        must_be_dir: bool,
        fresh_last: bool,
    ) -> Result<()> {
        let mut queue: VecDeque<PathComponent> = components.into();
        let mut must_be_dir = must_be_dir;
        while let Some(comp) = queue.pop_front() {
            let last = queue.is_empty();
            if walk.top().kind != FileKind::Dir {
                return Err(ClientError::new(
                    ErrorCode::NotDir,
                    "a path component is not a directory",
                ));
            }
            match comp {
                PathComponent::Parent => {
                    if walk.stack.len() > 1 {
                        walk.stack.pop();
                    }
                }
                PathComponent::Name(name) => {
                    let dir = walk.top().clone();
                    let attr = self.step(&dir, &name, last && fresh_last).await?;
                    let follow = !last || follow_last || must_be_dir;
                    if attr.kind == FileKind::Symlink && follow {
                        walk.links += 1;
                        if walk.links > SYMLINK_FOLLOW_MAX {
                            return Err(ClientError::new(ErrorCode::Loop, "too many symlinks"));
                        }
                        let target = self.link_target(attr.ino).await?;
                        let parsed = ParsedPath::parse(&target)?;
                        if parsed.absolute {
                            walk.stack.truncate(1);
                        }
                        if last {
                            must_be_dir |= parsed.must_be_dir;
                        }
                        for c in parsed.components.into_iter().rev() {
                            queue.push_front(c);
                        }
                    } else {
                        walk.stack.push(Node::from_attr(attr));
                    }
                }
            }
        }
        if must_be_dir && walk.top().kind != FileKind::Dir {
            return Err(ClientError::new(ErrorCode::NotDir, "not a directory"));
        }
        Ok(())
    }

    /// What `name` in directory `dir` is: from the metadata cache unless
    /// `fresh` (then, or on a miss, one lookup). A cached answer is only
    /// given to a caller who may search `dir`, checked against its
    /// attributes as the server would check them. A directory's cached
    /// attributes whose times this client changed are good enough to walk
    /// on (`resolve_walk` asks again before it returns them).
    async fn step(&self, dir: &Node, name: &FileName, fresh: bool) -> Result<Attr> {
        if !fresh {
            if let Some(hit) = self.cache.entry(dir.ino, name) {
                let dir_attr = self.node_attr(dir).await?;
                if !dir_attr.allows(self.credentials(), ACCESS_EXEC) {
                    return Err(ClientError::new(ErrorCode::AccessDenied, ""));
                }
                match hit {
                    None => return Err(ClientError::new(ErrorCode::NotFound, "")),
                    Some((ino, _)) => {
                        if let Some(a) = self.cache.attr_for_access(ino) {
                            return Ok(a);
                        }
                    }
                }
            }
        }
        self.lookup(dir.ino, name).await
    }

    /// A symlink's target, from the metadata cache if it has it.
    async fn link_target(&self, ino: InodeId) -> Result<Vec<u8>> {
        match self.cache.target(ino) {
            Some(t) => Ok(t),
            None => self.readlink(ino).await,
        }
    }

    /// A node's attributes: those it was found with, else cached ones,
    /// else the owner's (the root, which no lookup returns).
    async fn node_attr(&self, node: &Node) -> Result<Attr> {
        match &node.attr {
            Some(a) => Ok(a.clone()),
            None => match self.cache.attr_for_access(node.ino) {
                Some(a) => Ok(a),
                None => self.getattr(node.ino).await,
            },
        }
    }

    async fn resolve_parsed(&self, parsed: &ParsedPath, follow_last: bool) -> Result<Attr> {
        self.resolve_walk(parsed, follow_last, false).await
    }

    /// With `fresh_last`, the last name is looked up even if cached, and
    /// the root's attributes are fetched (open: close-to-open).
    async fn resolve_walk(
        &self,
        parsed: &ParsedPath,
        follow_last: bool,
        fresh_last: bool,
    ) -> Result<Attr> {
        let mut walk = Walk::at_root();
        self.walk(
            &mut walk,
            parsed.components.clone(),
            follow_last,
            parsed.must_be_dir,
            fresh_last,
        )
        .await?;
        let top = walk.top();
        if self.open_files.writes_behind(top.ino) {
            // A write of this process may have landed between the owner's
            // answer in the walk and now, and left the table of writes in
            // flight: the walk's size would be older than the write.
            return self.fstat(top.ino).await;
        }
        if self.cache.dir_times_changed(top.ino) {
            // A directory this client made or removed entries in since the
            // walk's attributes were fetched (or reached by ".."): its
            // times and link count are the owner's to tell.
            return self.getattr(top.ino).await;
        }
        let attr = match (&top.attr, fresh_last) {
            (Some(a), _) => a.clone(),
            (None, true) => self.getattr(top.ino).await?,
            (None, false) => self.node_attr(top).await?,
        };
        Ok(self.with_open_writes(attr))
    }

    /// The directory holding the path's last name, and that name; the
    /// third value says the path ended in '/' (the name must be a
    /// directory). A path with no last name ("/", "a/..") fails with
    /// `no_name`, which differs by operation as on Linux (mkdir: EEXIST,
    /// rmdir: EBUSY, unlink: EISDIR).
    async fn parent_of(
        &self,
        path: &[u8],
        no_name: ErrorCode,
    ) -> Result<(InodeId, FileName, bool)> {
        let (dir, name, must_be_dir, _) = self.parent_with_ancestors(path, no_name).await?;
        Ok((dir, name, must_be_dir))
    }

    /// Like `parent_of`, plus every directory from the root down to the
    /// parent as the walk really passed through them (symlinks followed).
    async fn parent_with_ancestors(
        &self,
        path: &[u8],
        no_name: ErrorCode,
    ) -> Result<(InodeId, FileName, bool, Vec<InodeId>)> {
        let parsed = ParsedPath::parse(path)?;
        let (dir, name) = parsed
            .split_last()
            .ok_or_else(|| ClientError::new(no_name, "path does not end in a name"))?;
        let mut walk = Walk::at_root();
        self.walk(&mut walk, dir.components, true, true, false)
            .await?;
        let ancestors = walk.stack.iter().map(|n| n.ino).collect();
        Ok((walk.top().ino, name, parsed.must_be_dir, ancestors))
    }

    async fn resolve_bytes(&self, path: &[u8], follow_last: bool) -> Result<Attr> {
        self.resolve_parsed(&ParsedPath::parse(path)?, follow_last)
            .await
    }

    /// The attributes of what `path` names, following a final symlink if
    /// `follow_last`.
    pub async fn resolve(&self, path: impl AsFsPath, follow_last: bool) -> Result<Attr> {
        let path = path.fs_path_bytes();
        self.resolve_bytes(path, follow_last)
            .await
            .map_err(|e| e.context(format!("cannot access '{}'", show(path))))
    }

    /// Like stat(2): follows a final symlink.
    pub async fn stat(&self, path: impl AsFsPath) -> Result<Attr> {
        let path = path.fs_path_bytes();
        self.resolve_bytes(path, true)
            .await
            .map_err(|e| e.context(format!("cannot stat '{}'", show(path))))
    }

    /// Like lstat(2): a final symlink is described, not followed.
    pub async fn lstat(&self, path: impl AsFsPath) -> Result<Attr> {
        let path = path.fs_path_bytes();
        self.resolve_bytes(path, false)
            .await
            .map_err(|e| e.context(format!("cannot stat '{}'", show(path))))
    }

    /// Whether `path` names something (following symlinks); errors other
    /// than "not found" are returned.
    pub async fn exists(&self, path: impl AsFsPath) -> Result<bool> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(e) if e.code == ErrorCode::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The directory holding the path's last name (its attributes), and the name.
    pub async fn resolve_parent(&self, path: impl AsFsPath) -> Result<(Attr, FileName)> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, _) = self.parent_of(path, ErrorCode::InvalidArgument).await?;
            Ok((self.getattr(dir).await?, name))
        }
        .await
        .map_err(|e: ClientError| e.context(format!("cannot access '{}'", show(path))))
    }

    /// access(2) by path: check `mask` (ACCESS_* bits, 0 for existence).
    pub async fn check_access(&self, path: impl AsFsPath, mask: u8) -> Result<Attr> {
        let path = path.fs_path_bytes();
        async {
            let attr = self.resolve_bytes(path, true).await?;
            check_access(self, &attr, mask)?;
            Ok(attr)
        }
        .await
        .map_err(|e: ClientError| e.context(format!("cannot access '{}'", show(path))))
    }

    /// Open (and with `opts.create`, create) a file by path.
    pub async fn open(&self, path: impl AsFsPath, opts: OpenOptions) -> Result<File> {
        let path = path.fs_path_bytes();
        self.open_inner(path, &opts)
            .await
            .map_err(|e| e.context(format!("cannot open '{}'", show(path))))
    }

    async fn open_inner(&self, path: &[u8], opts: &OpenOptions) -> Result<File> {
        let parsed = ParsedPath::parse(path)?;
        if !opts.create {
            if let Some(file) = self.open_to_read(&parsed, opts).await? {
                return Ok(file);
            }
            // One lookup of the last name (close-to-open); the access check
            // is made here against the attributes it returned, as the
            // owner's Access would make it.
            let attr = self.resolve_walk(&parsed, true, true).await?;
            check_access(self, &attr, opts.access_mask())?;
            return self.open_checked(attr, opts, false).await;
        }
        // open("x/", O_CREAT), "/" or "x/..": an existing directory or
        // nothing creatable; EISDIR on Linux.
        let Some((dir, name)) = parsed.split_last().filter(|_| !parsed.must_be_dir) else {
            return Err(ClientError::new(ErrorCode::IsDir, ""));
        };
        let mut walk = Walk::at_root();
        self.walk(&mut walk, dir.components, true, true, false)
            .await?;
        match self
            .create(walk.top().ino, &name, opts.perm, opts.exclusive)
            .await?
        {
            // A new file: its creator may write it whatever its mode.
            (attr, true) => self.open_checked(attr, opts, true).await,
            (attr, false) if attr.kind != FileKind::Symlink => {
                check_access(self, &attr, opts.access_mask())?;
                self.open_checked(attr, opts, false).await
            }
            // An existing symlink: open what it leads to, resolving from the
            // parent already found. A dangling one is not created through
            // (Linux would create its target): it reads as not found.
            (_, false) => {
                self.walk(
                    &mut walk,
                    vec![PathComponent::Name(name)],
                    true,
                    false,
                    true,
                )
                .await?;
                let attr = self.node_attr(walk.top()).await?;
                check_access(self, &attr, opts.access_mask())?;
                self.open_checked(attr, opts, false).await
            }
        }
    }

    /// Open an existing file (not to truncate it) with one `Open` request
    /// for its last name, which brings a small file's bytes along for its
    /// reads. None when the path does not suit (it ends in a symlink, or
    /// names a directory explicitly): the caller resolves it the general
    /// way. (mdtest opens the files it reads O_RDWR.)
    async fn open_to_read(&self, parsed: &ParsedPath, opts: &OpenOptions) -> Result<Option<File>> {
        if !opts.reads() || opts.truncate || parsed.must_be_dir {
            return Ok(None);
        }
        let Some((dir, name)) = parsed.split_last() else {
            return Ok(None);
        };
        let mut walk = Walk::at_root();
        self.walk(&mut walk, dir.components, true, true, false)
            .await?;
        let budget_left = self
            .preload_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            < crate::client::PRELOAD_BUDGET_BYTES;
        let data_max = if budget_left {
            limits::INLINE_DATA_MAX_BYTES as u32
        } else {
            0
        };
        let epoch = self.cache.epoch();
        let (attr, data) = self.open_at(walk.top().ino, &name, data_max).await?;
        if attr.kind == FileKind::Symlink {
            return Ok(None);
        }
        check_access(self, &attr, opts.access_mask())?;
        let file = self.open_checked(attr, opts, false).await?;
        if let Some(data) = data {
            file.set_preloaded(crate::file::Preloaded::new(
                epoch,
                data,
                &self.preload_bytes,
            ));
        }
        Ok(Some(file))
    }

    pub async fn mkdir(&self, path: impl AsFsPath, perm: u32) -> Result<Attr> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, _) = self.parent_of(path, ErrorCode::Exists).await?;
            self.mkdir_at(dir, &name, perm).await
        }
        .await
        .map_err(|e| e.context(format!("cannot create directory '{}'", show(path))))
    }

    /// mknod(2) by path: a FIFO, socket, device node or empty regular
    /// file (see `Client::mknod_at`). An existing name, even a dangling
    /// symlink, is EEXIST.
    pub async fn mknod(
        &self,
        path: impl AsFsPath,
        kind: FileKind,
        perm: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, _) = self.parent_of(path, ErrorCode::Exists).await?;
            self.mknod_at(dir, &name, kind, perm, rdev).await
        }
        .await
        .map_err(|e| e.context(format!("cannot create node '{}'", show(path))))
    }

    /// Create `path` and any missing directories above it; an existing
    /// directory anywhere (including `path`) is fine.
    pub async fn mkdir_all(&self, path: impl AsFsPath, perm: u32) -> Result<Attr> {
        let path = path.fs_path_bytes();
        self.mkdir_all_inner(path, perm)
            .await
            .map_err(|e| e.context(format!("cannot create directory '{}'", show(path))))
    }

    async fn mkdir_all_inner(&self, path: &[u8], perm: u32) -> Result<Attr> {
        let parsed = ParsedPath::parse(path)?;
        let mut walk = Walk::at_root();
        for comp in parsed.components {
            let PathComponent::Name(name) = &comp else {
                self.walk(&mut walk, vec![comp], true, true, false).await?;
                continue;
            };
            let (saved, links) = (walk.stack.clone(), walk.links);
            match self
                .walk(&mut walk, vec![comp.clone()], true, true, false)
                .await
            {
                Ok(()) => continue,
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => return Err(e),
            }
            // The failed step may have left the walk inside a symlink's
            // target: go back to where it started. (A dangling symlink is
            // not created through; mkdir on its name reports Exists.)
            walk.stack = saved;
            walk.links = links;
            match self.mkdir_at(walk.top().ino, name, perm).await {
                Ok(attr) => walk.stack.push(Node::from_attr(attr)),
                // Made by someone else meanwhile: use theirs.
                Err(e) if e.code == ErrorCode::Exists => {
                    self.walk(&mut walk, vec![comp], true, true, true).await?
                }
                Err(e) => return Err(e),
            }
        }
        self.node_attr(walk.top()).await
    }

    pub async fn remove_file(&self, path: impl AsFsPath) -> Result<()> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, must_be_dir) = self.parent_of(path, ErrorCode::IsDir).await?;
            if must_be_dir {
                // unlink("x/"): EISDIR for a directory, else ENOTDIR.
                let attr = self.lookup(dir, &name).await?;
                let code = if attr.kind == FileKind::Dir {
                    ErrorCode::IsDir
                } else {
                    ErrorCode::NotDir
                };
                return Err(ClientError::new(code, ""));
            }
            self.unlink(dir, &name).await
        }
        .await
        .map_err(|e| e.context(format!("cannot remove '{}'", show(path))))
    }

    pub async fn remove_dir(&self, path: impl AsFsPath) -> Result<()> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, _) = self.parent_of(path, ErrorCode::Busy).await?;
            self.rmdir(dir, &name).await
        }
        .await
        .map_err(|e| e.context(format!("cannot remove '{}'", show(path))))
    }

    /// Remove `path` and, if it is a directory, everything below it
    /// (depth-first, like `rm -r`; a final symlink is removed, not followed).
    /// Entries that vanish meanwhile are not errors. Refuses the root.
    pub async fn remove_dir_all(&self, path: impl AsFsPath) -> Result<()> {
        let path = path.fs_path_bytes();
        async {
            let (dir, name, _) = self.parent_of(path, ErrorCode::Busy).await?;
            let attr = self.lookup(dir, &name).await?;
            self.remove_tree(dir, name, attr.ino, attr.kind).await
        }
        .await
        .map_err(|e| e.context(format!("cannot remove '{}'", show(path))))
    }

    fn remove_tree(
        &self,
        parent: InodeId,
        name: FileName,
        ino: InodeId,
        kind: FileKind,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if kind != FileKind::Dir {
                return ignore_gone(self.unlink(parent, &name).await);
            }
            let entries = match self.readdir(ino).await {
                Err(e) if e.code == ErrorCode::NotFound => return Ok(()),
                other => other?,
            };
            let (dirs, others): (Vec<DirEntry>, Vec<DirEntry>) =
                entries.into_iter().partition(|e| e.kind == FileKind::Dir);
            // Owned names: futures borrowing from an iterator item would not
            // be `Send` for every lifetime, which the boxed future needs.
            let unlinks: Vec<_> = others
                .into_iter()
                .map(|e| self.unlink_quietly(ino, e.name))
                .collect();
            try_join_bounded(unlinks, REMOVE_IN_FLIGHT).await?;
            for d in dirs {
                self.remove_tree(ino, d.name, d.ino, d.kind).await?;
            }
            ignore_gone(self.rmdir(parent, &name).await)
        })
    }

    async fn unlink_quietly(&self, dir: InodeId, name: FileName) -> Result<()> {
        ignore_gone(self.unlink(dir, &name).await)
    }

    /// Rename `from` to `to`, replacing `to` if it exists (as rename(2)).
    pub async fn rename(&self, from: impl AsFsPath, to: impl AsFsPath) -> Result<()> {
        self.rename_with_flags(from, to, 0).await
    }

    /// rename with `renameat2` flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
    /// A directory cannot move below itself: no server sees both paths, so
    /// that is checked here, on the lexically normalized paths (EINVAL).
    pub async fn rename_with_flags(
        &self,
        from: impl AsFsPath,
        to: impl AsFsPath,
        flags: u32,
    ) -> Result<()> {
        let (from, to) = (from.fs_path_bytes(), to.fs_path_bytes());
        let context = || format!("cannot move '{}' to '{}'", show(from), show(to));
        let (pf, pt) = (ParsedPath::parse(from), ParsedPath::parse(to));
        let (pf, pt) = match (pf, pt) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return Err(e.context(context())),
        };
        if is_strictly_inside(&pt.lexical(), &pf.lexical()) {
            let kind = self
                .resolve_parsed(&pf, false)
                .await
                .map_err(|e| e.context(context()))?
                .kind;
            if kind == FileKind::Dir {
                return Err(ClientError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "cannot move '{}' to a subdirectory of itself, '{}'",
                        show(from),
                        show(to)
                    ),
                ));
            }
        }
        async {
            let (src_dir, src_name, _) = self.parent_of(from, ErrorCode::Busy).await?;
            let (dst_dir, dst_name, _, ancestors) =
                self.parent_with_ancestors(to, ErrorCode::Busy).await?;
            // The lexical check above misses symlinks on the way to the
            // target: compare the directories actually walked through.
            let src = self.lookup(src_dir, &src_name).await?;
            // (Fresh: the server checks it again, but a stale kind here
            // would let a directory move below itself.)
            if src.kind == FileKind::Dir && ancestors.contains(&src.ino) {
                return Err(ClientError::new(
                    ErrorCode::InvalidArgument,
                    "cannot move a directory to a subdirectory of itself",
                ));
            }
            self.rename_at(src_dir, &src_name, dst_dir, &dst_name, flags)
                .await
        }
        .await
        .map_err(|e| e.context(context()))
    }

    /// A new name `new` for what `existing` names (a final symlink is
    /// linked itself, as link(2) does on Linux).
    pub async fn hard_link(&self, existing: impl AsFsPath, new: impl AsFsPath) -> Result<Attr> {
        self.hard_link_following(existing, new, false).await
    }

    /// `hard_link`; with `follow`, a final symlink of `existing` is
    /// followed (linkat's AT_SYMLINK_FOLLOW).
    pub async fn hard_link_following(
        &self,
        existing: impl AsFsPath,
        new: impl AsFsPath,
        follow: bool,
    ) -> Result<Attr> {
        let (existing, new) = (existing.fs_path_bytes(), new.fs_path_bytes());
        async {
            let attr = self.resolve_bytes(existing, follow).await?;
            if attr.kind == FileKind::Dir {
                return Err(ClientError::new(ErrorCode::NotPermitted, ""));
            }
            let (dir, name, _) = self.parent_of(new, ErrorCode::Exists).await?;
            // The same name twice: it existed when resolved, so the new
            // name did (EEXIST, as Linux answers). Sent on, an unlink of it
            // meanwhile would let the link make it again, an outcome no
            // order of the two gives (the replicated simulation, seed
            // 18040 with 4 servers).
            let (src_dir, src_name, _) = self.parent_of(existing, ErrorCode::Exists).await?;
            if (src_dir, &src_name) == (dir, &name) {
                return Err(ClientError::new(ErrorCode::Exists, ""));
            }
            self.link(attr.ino, dir, &name).await
        }
        .await
        .map_err(|e| {
            e.context(format!(
                "cannot link '{}' to '{}'",
                show(new),
                show(existing)
            ))
        })
    }

    /// Make `link_path` a symlink to `target` (stored as given).
    pub async fn symlink(&self, target: impl AsFsPath, link_path: impl AsFsPath) -> Result<Attr> {
        let (target, link_path) = (target.fs_path_bytes(), link_path.fs_path_bytes());
        async {
            let (dir, name, _) = self.parent_of(link_path, ErrorCode::Exists).await?;
            self.symlink_at(dir, &name, target).await
        }
        .await
        .map_err(|e| e.context(format!("cannot create symbolic link '{}'", show(link_path))))
    }

    pub async fn read_link(&self, path: impl AsFsPath) -> Result<Vec<u8>> {
        let path = path.fs_path_bytes();
        async {
            let attr = self.resolve_bytes(path, false).await?;
            if attr.kind != FileKind::Symlink {
                return Err(ClientError::new(ErrorCode::InvalidArgument, ""));
            }
            self.readlink(attr.ino).await
        }
        .await
        .map_err(|e| e.context(format!("cannot read symbolic link '{}'", show(path))))
    }

    /// Every entry of a directory, sorted by name ("." and ".." excluded).
    pub async fn read_dir(&self, path: impl AsFsPath) -> Result<Vec<DirEntry>> {
        let path = path.fs_path_bytes();
        async {
            let attr = self.resolve_bytes(path, true).await?;
            if attr.kind != FileKind::Dir {
                return Err(ClientError::new(ErrorCode::NotDir, ""));
            }
            self.readdir(attr.ino).await
        }
        .await
        .map_err(|e| e.context(format!("cannot open directory '{}'", show(path))))
    }

    async fn setattr_path(&self, path: &[u8], changes: SetAttrs, what: &str) -> Result<Attr> {
        async {
            let attr = self.resolve_bytes(path, true).await?;
            if changes.size.is_some() && attr.kind == FileKind::Dir {
                return Err(ClientError::new(ErrorCode::IsDir, ""));
            }
            self.setattr_known_size(attr.ino, changes, attr.size).await
        }
        .await
        .map_err(|e| e.context(format!("cannot {what} '{}'", show(path))))
    }

    /// chmod: set the permission bits (mode & 0o7777).
    pub async fn set_permissions(&self, path: impl AsFsPath, mode: u32) -> Result<Attr> {
        let changes = SetAttrs {
            perm: Some(mode & 0o7777),
            ..SetAttrs::default()
        };
        self.setattr_path(path.fs_path_bytes(), changes, "change permissions of")
            .await
    }

    /// chown: `None` leaves that id alone.
    pub async fn chown(
        &self,
        path: impl AsFsPath,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<Attr> {
        let changes = SetAttrs {
            uid,
            gid,
            ..SetAttrs::default()
        };
        self.setattr_path(path.fs_path_bytes(), changes, "change ownership of")
            .await
    }

    /// utimensat: each time is left, set to now, or set to a value.
    pub async fn set_times(
        &self,
        path: impl AsFsPath,
        atime: TimeSet,
        mtime: TimeSet,
    ) -> Result<Attr> {
        let changes = SetAttrs {
            atime,
            mtime,
            ..SetAttrs::default()
        };
        self.setattr_path(path.fs_path_bytes(), changes, "set times of")
            .await
    }

    /// truncate(2): set the size of a regular file.
    pub async fn truncate(&self, path: impl AsFsPath, size: u64) -> Result<Attr> {
        let changes = SetAttrs {
            size: Some(size),
            ..SetAttrs::default()
        };
        self.setattr_path(path.fs_path_bytes(), changes, "truncate")
            .await
    }

    /// Create or replace the contents of a file (mode 0o644 if created),
    /// and publish its size before returning (no fsync).
    pub async fn write_file(&self, path: impl AsFsPath, data: &[u8]) -> Result<()> {
        let path = path.fs_path_bytes();
        let opts = OpenOptions::new().write(true).create(true).truncate(true);
        let file = self.open(path, opts).await?;
        async {
            file.write_at(0, data).await?;
            file.close().await
        }
        .await
        .map_err(|e| e.context(format!("cannot write '{}'", show(path))))
    }

    /// The whole contents of a file.
    pub async fn read_file(&self, path: impl AsFsPath) -> Result<Vec<u8>> {
        let path = path.fs_path_bytes();
        let file = self.open(path, OpenOptions::new().read(true)).await?;
        async {
            let mut out = file.read_at(0, file.size() as usize).await?;
            // The file may have grown since it was opened: read to the end.
            loop {
                let more = file.read_at(out.len() as u64, 1 << 20).await?;
                if more.is_empty() {
                    break;
                }
                out.extend_from_slice(&more);
            }
            file.close().await?;
            Ok(out)
        }
        .await
        .map_err(|e: ClientError| e.context(format!("cannot read '{}'", show(path))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(p: &ParsedPath) -> Vec<String> {
        p.components
            .iter()
            .map(|c| match c {
                PathComponent::Name(n) => n.to_string(),
                PathComponent::Parent => "..".into(),
            })
            .collect()
    }

    fn parse(s: &str) -> ParsedPath {
        ParsedPath::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn paths_split_into_components() {
        let p = parse("//a///b/./c");
        assert_eq!(comps(&p), ["a", "b", "c"]);
        assert!(!p.must_be_dir && p.absolute);
        let p = parse("a/b/");
        assert_eq!(comps(&p), ["a", "b"]);
        assert!(p.must_be_dir && !p.absolute);
        assert_eq!(comps(&parse("/a/../b")), ["a", "..", "b"]);
        assert!(parse("/a/..").must_be_dir);
        assert!(parse("/a/.").must_be_dir);
        assert!(parse("/").components.is_empty());
        assert!(parse(".").components.is_empty());
        assert!(parse("...").components.len() == 1);
    }

    #[test]
    fn bad_paths_are_refused_with_the_right_code() {
        let code = |p: &[u8]| ParsedPath::parse(p).unwrap_err().code;
        assert_eq!(code(b""), ErrorCode::NotFound);
        assert_eq!(code(b"/a\0b"), ErrorCode::InvalidArgument);
        let long_name = [b'x'; limits::NAME_MAX_BYTES + 1];
        assert_eq!(code(&long_name), ErrorCode::NameTooLong);
        assert!(ParsedPath::parse(&[b'x'; limits::NAME_MAX_BYTES]).is_ok());
        // A path just over PATH_MAX of short components.
        let long_path: Vec<u8> = b"/a".repeat(limits::PATH_MAX_BYTES / 2 + 1);
        assert_eq!(code(&long_path), ErrorCode::NameTooLong);
        let ok_path: Vec<u8> = b"/a".repeat(limits::PATH_MAX_BYTES / 2);
        assert!(ParsedPath::parse(&ok_path).is_ok());
    }

    #[test]
    fn normalization_is_lexical() {
        let n = |s: &str| String::from_utf8(normalize(s).unwrap()).unwrap();
        assert_eq!(n("/a/b/../c/./"), "/a/c");
        assert_eq!(n("a//b"), "/a/b");
        assert_eq!(n("/../.."), "/");
        assert_eq!(n("/a/../../b"), "/b");
        assert_eq!(n("/"), "/");
        assert!(normalize(b"/a\0").is_err());
        assert!(normalize(std::path::Path::new("/x")).is_ok());
    }

    #[test]
    fn split_last_names_the_parent() {
        let (dir, name) = parse("/a/b/c/").split_last().unwrap();
        assert_eq!(comps(&dir), ["a", "b"]);
        assert_eq!(name.as_bytes(), b"c");
        assert!(dir.must_be_dir);
        assert!(parse("/").split_last().is_none());
        assert!(parse("/a/..").split_last().is_none());
        let (dir, name) = parse("x").split_last().unwrap();
        assert!(dir.components.is_empty());
        assert_eq!(name.as_bytes(), b"x");
    }

    #[test]
    fn inside_check_is_strict_and_per_component() {
        let l = |s: &str| parse(s).lexical();
        assert!(is_strictly_inside(&l("/a/b/c"), &l("/a/b")));
        assert!(is_strictly_inside(&l("/a/b/../b/c"), &l("/a/./b")));
        assert!(!is_strictly_inside(&l("/a/b"), &l("/a/b")));
        assert!(!is_strictly_inside(&l("/a/bc"), &l("/a/b")));
        assert!(!is_strictly_inside(&l("/a"), &l("/a/b")));
        assert!(is_strictly_inside(&l("/x"), &l("/")));
    }

    /// Compiles only if the futures can move between threads (FUSE
    /// adapters spawn them on a multi-thread runtime).
    #[allow(dead_code)]
    fn futures_are_send(c: &Client, f: &File, name: &FileName) {
        fn send<T: Send>(_: T) {}
        send(c.stat("/a"));
        send(c.open(PathBuf::from("/a"), OpenOptions::new()));
        send(c.mkdir_all(b"/a/b", 0o755));
        send(c.remove_dir_all("/a"));
        send(c.rename("/a", String::from("/b")));
        send(c.read_file("/a"));
        send(c.write_file("/a", b"x"));
        send(c.lookup(InodeId::ROOT, name));
        send(c.read(InodeId::ROOT, 0, 1, 1));
        send(c.write(InodeId::ROOT, 0, b"x"));
        send(c.readdir(InodeId::ROOT));
        send(c.server_stats());
        send(f.write_at(0, b"x"));
        send(f.read_at(0, 1));
        send(f.fsync());
        send(f.close());
    }

    #[test]
    fn path_arguments_accept_common_types() {
        fn bytes(p: impl AsFsPath) -> Vec<u8> {
            p.fs_path_bytes().to_vec()
        }
        assert_eq!(bytes("/a"), b"/a");
        assert_eq!(bytes(String::from("/a")), b"/a");
        assert_eq!(bytes(b"/a"), b"/a");
        assert_eq!(bytes(&b"/a"[..]), b"/a");
        assert_eq!(bytes(PathBuf::from("/a")), b"/a");
        assert_eq!(bytes(Path::new("/a")), b"/a");
        assert_eq!(bytes(OsStr::new("/a")), b"/a");
    }
}
