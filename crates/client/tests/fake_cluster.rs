//! The client against a fake cluster: real sockets and the real transport
//! (madfs-rpc's `serve`), but servers that keep one shared in-memory file
//! system and refuse any request sent to the wrong server. This checks the
//! client's placement, striping, size bookkeeping, path resolution and error
//! messages without the real server; tests against real servers live elsewhere.

use madfs_client::*;
use madfs_proto::{Op, Opcode, Reply, Request, WireError};
use madfs_rpc::serve::{serve, CallContext, Handler};
use madfs_rpc::ServerEntry;
use madfs_types::{chunk_server, dentry_server};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::result::Result;
use std::sync::{Arc, Mutex};

const CS: u64 = 64 * 1024;
/// The fake store never loses what it took.
const VERIFIER: madfs_proto::message::WriteVerifier = madfs_proto::message::WriteVerifier(1);

#[derive(Default)]
struct Fs {
    inodes: HashMap<InodeId, (Attr, Vec<u8>)>,
    dentries: BTreeMap<(InodeId, FileName), (FileKind, InodeId)>,
    chunks: HashMap<(InodeId, u32), Vec<u8>>,
    counters: HashMap<u16, u64>,
    log: Vec<(u16, Opcode)>,
}

struct FakeServer {
    id: ServerId,
    n: usize,
    fs: Arc<Mutex<Fs>>,
}

fn err(code: ErrorCode, m: &str) -> WireError {
    WireError::new(code, m)
}

fn new_attr(ino: InodeId, kind: FileKind, perm: u32) -> Attr {
    let now = Timestamp::now();
    Attr {
        ino,
        kind,
        perm,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        rdev: 0,
    }
}

impl FakeServer {
    fn route(&self, want: ServerId) -> Result<(), WireError> {
        if want == self.id {
            Ok(())
        } else {
            Err(err(ErrorCode::Protocol, "misrouted"))
        }
    }

    fn attr_if_owned(&self, fs: &Fs, ino: InodeId) -> Option<Attr> {
        (ino.owner() == self.id).then(|| fs.inodes[&ino].0.clone())
    }

    fn op(&self, req: Request, data: Vec<u8>) -> Result<(Reply, Vec<u8>), WireError> {
        let mut guard = self.fs.lock().unwrap();
        let fs = &mut *guard;
        fs.log.push((self.id.0, req.op.opcode()));
        let n = self.n;
        let not_found = || err(ErrorCode::NotFound, "");
        let empty = Ok((Reply::Empty, vec![]));
        match req.op {
            // Open: a lookup that never brings the file's bytes (allowed:
            // the client then reads them).
            Op::Lookup { parent, name } | Op::Open { parent, name, .. } => {
                self.route(dentry_server(parent, &name, n))?;
                let &(kind, ino) = fs.dentries.get(&(parent, name)).ok_or_else(not_found)?;
                let attr = self.attr_if_owned(fs, ino);
                Ok((
                    Reply::Entry(madfs_proto::message::Entry { ino, kind, attr }),
                    vec![],
                ))
            }
            Op::GetAttr { ino, .. } | Op::Access { ino, .. } => {
                self.route(ino.owner())?;
                let a = fs.inodes.get(&ino).ok_or_else(not_found)?.0.clone();
                Ok((Reply::Attr(a), vec![]))
            }
            Op::SetAttr { ino, changes } => {
                self.route(ino.owner())?;
                let a = &mut fs.inodes.get_mut(&ino).ok_or_else(not_found)?.0;
                if let Some(p) = changes.perm {
                    a.perm = p;
                }
                if let Some(size) = changes.size {
                    if a.kind == FileKind::Dir {
                        return Err(err(ErrorCode::IsDir, ""));
                    }
                    a.size = size;
                    if let Some(c0) = fs.chunks.get_mut(&(ino, 0)) {
                        c0.truncate(size.min(CS) as usize);
                    }
                }
                Ok((Reply::Attr(a.clone()), vec![]))
            }
            Op::Create {
                parent,
                name,
                kind,
                perm,
                exclusive,
                symlink_target,
            } => {
                self.route(dentry_server(parent, &name, n))?;
                if let Some(&(ekind, eino)) = fs.dentries.get(&(parent, name.clone())) {
                    if exclusive || kind != FileKind::File {
                        return Err(err(ErrorCode::Exists, ""));
                    }
                    if ekind == FileKind::Dir {
                        return Err(err(ErrorCode::IsDir, ""));
                    }
                    let entry = madfs_proto::message::Entry {
                        ino: eino,
                        kind: ekind,
                        attr: self.attr_if_owned(fs, eino),
                    };
                    return Ok((
                        Reply::Created {
                            entry,
                            created: false,
                            touched: vec![],
                            verifier: VERIFIER,
                        },
                        vec![],
                    ));
                }
                let c = fs.counters.entry(self.id.0).or_insert(100);
                *c += 1;
                let ino = InodeId::new(self.id, *c);
                let mut attr = new_attr(ino, kind, perm);
                attr.size = symlink_target.len() as u64;
                fs.inodes.insert(ino, (attr.clone(), symlink_target));
                fs.dentries.insert((parent, name), (kind, ino));
                let entry = madfs_proto::message::Entry {
                    ino,
                    kind,
                    attr: Some(attr),
                };
                Ok((
                    Reply::Created {
                        entry,
                        created: true,
                        touched: vec![],
                        verifier: VERIFIER,
                    },
                    vec![],
                ))
            }
            Op::Remove {
                parent, name, dir, ..
            } => {
                self.route(dentry_server(parent, &name, n))?;
                let (kind, ino) = *fs
                    .dentries
                    .get(&(parent, name.clone()))
                    .ok_or_else(not_found)?;
                match (dir, kind == FileKind::Dir) {
                    (true, false) => return Err(err(ErrorCode::NotDir, "")),
                    (false, true) => return Err(err(ErrorCode::IsDir, "")),
                    _ => {}
                }
                if dir && fs.dentries.keys().any(|(p, _)| *p == ino) {
                    return Err(err(ErrorCode::NotEmpty, ""));
                }
                fs.dentries.remove(&(parent, name));
                let a = &mut fs.inodes.get_mut(&ino).unwrap().0;
                a.nlink -= 1;
                if a.nlink == 0 || dir {
                    fs.inodes.remove(&ino);
                    fs.chunks.retain(|(i, _), _| *i != ino);
                }
                Ok((
                    Reply::Removed {
                        ino,
                        kind,
                        held: false,
                        touched: vec![],
                        verifier: VERIFIER,
                    },
                    vec![],
                ))
            }
            Op::Read {
                ino,
                chunk,
                offset,
                len,
            } => {
                self.route(chunk_server(ino, chunk, n))?;
                assert!(offset as u64 + len as u64 <= CS, "read crosses a chunk");
                let c = fs.chunks.get(&(ino, chunk.0)).cloned().unwrap_or_default();
                let start = (offset as usize).min(c.len());
                let end = (offset as usize + len as usize).min(c.len());
                Ok((Reply::Data, c[start..end].to_vec()))
            }
            Op::Write {
                ino,
                chunk,
                offset,
                file_size,
            } => {
                self.route(chunk_server(ino, chunk, n))?;
                let end = offset as usize + data.len();
                assert!(end as u64 <= CS, "write crosses a chunk");
                let c = fs.chunks.entry((ino, chunk.0)).or_default();
                if c.len() < end {
                    c.resize(end, 0);
                }
                c[offset as usize..end].copy_from_slice(&data);
                if chunk.0 == 0 {
                    let a = &mut fs.inodes.get_mut(&ino).ok_or_else(not_found)?.0;
                    a.size = a.size.max(file_size);
                }
                Ok((Reply::Written { verifier: VERIFIER }, vec![]))
            }
            Op::UpdateSize { ino, size, mtime } => {
                self.route(ino.owner())?;
                let a = &mut fs.inodes.get_mut(&ino).ok_or_else(not_found)?.0;
                a.size = a.size.max(size);
                a.mtime = a.mtime.max(mtime);
                Ok((
                    Reply::SizeUpdated {
                        attr: a.clone(),
                        verifier: VERIFIER,
                    },
                    vec![],
                ))
            }
            Op::Fsync => Ok((Reply::Synced { verifier: VERIFIER }, vec![])),
            Op::ReadDir {
                dir,
                after,
                max_entries,
            } => {
                let mine: Vec<DirEntry> = fs
                    .dentries
                    .iter()
                    .filter(|((p, name), _)| {
                        *p == dir
                            && dentry_server(dir, name, n) == self.id
                            && !matches!(&after, Some(a) if name <= a)
                    })
                    .map(|((_, name), &(kind, ino))| DirEntry {
                        name: name.clone(),
                        ino,
                        kind,
                    })
                    .collect();
                let more = mine.len() > max_entries as usize;
                let entries = mine.into_iter().take(max_entries as usize).collect();
                Ok((Reply::DirPage { entries, more }, vec![]))
            }
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                flags,
                ..
            } => {
                self.route(dentry_server(src_parent, &src_name, n))?;
                let src = *fs
                    .dentries
                    .get(&(src_parent, src_name.clone()))
                    .ok_or_else(not_found)?;
                if let Some(&(dkind, dino)) = fs.dentries.get(&(dst_parent, dst_name.clone())) {
                    if flags & RENAME_NOREPLACE != 0 {
                        return Err(err(ErrorCode::Exists, ""));
                    }
                    if dkind == FileKind::Dir && fs.dentries.keys().any(|(p, _)| *p == dino) {
                        return Err(err(ErrorCode::NotEmpty, ""));
                    }
                }
                fs.dentries.remove(&(src_parent, src_name));
                fs.dentries.insert((dst_parent, dst_name), src);
                Ok((
                    Reply::Renamed {
                        touched: vec![],
                        verifier: VERIFIER,
                    },
                    vec![],
                ))
            }
            Op::Link { ino, parent, name } => {
                self.route(dentry_server(parent, &name, n))?;
                if fs.dentries.contains_key(&(parent, name.clone())) {
                    return Err(err(ErrorCode::Exists, ""));
                }
                let a = &mut fs.inodes.get_mut(&ino).ok_or_else(not_found)?.0;
                a.nlink += 1;
                let kind = a.kind;
                fs.dentries.insert((parent, name), (kind, ino));
                let attr = self.attr_if_owned(fs, ino);
                Ok((
                    Reply::Linked {
                        entry: madfs_proto::message::Entry { ino, kind, attr },
                        touched: vec![],
                        verifier: VERIFIER,
                    },
                    vec![],
                ))
            }
            Op::ReadLink { ino } => {
                self.route(ino.owner())?;
                let (a, t) = fs.inodes.get(&ino).ok_or_else(not_found)?;
                if a.kind != FileKind::Symlink {
                    return Err(err(ErrorCode::InvalidArgument, "not a symlink"));
                }
                Ok((Reply::Target(t.clone()), vec![]))
            }
            Op::TruncateChunks { ino, size } => {
                let id = self.id;
                fs.chunks.retain(|&(i, c), _| {
                    i != ino || chunk_server(i, ChunkIndex(c), n) != id || (c as u64) * CS < size
                });
                for (&(i, c), data) in fs.chunks.iter_mut() {
                    if i == ino && chunk_server(i, ChunkIndex(c), n) == id {
                        let keep = size - c as u64 * CS;
                        data.truncate(keep.min(CS) as usize);
                    }
                }
                empty
            }
            Op::StatFs => Ok((
                Reply::FsStats(FsStats {
                    bytes_total: 1000,
                    bytes_free: 500,
                    bytes_avail: 400,
                    inodes: 1,
                    data_bytes: 7,
                    failure: None,
                    rebuilds: Vec::new(),
                    disk: 0,
                    bytes_reserved: 0,
                    copies: 1,
                }),
                vec![],
            )),
            other => Err(err(ErrorCode::NotSupported, &format!("{other:?}"))),
        }
    }
}

impl Handler for FakeServer {
    fn handle(
        self: &Arc<Self>,
        _ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(Reply, Vec<u8>), WireError>> + Send {
        let r = self.op(req, data);
        async move { r }
    }
}

struct Cluster {
    cfg: ClusterConfig,
    key: ClusterKey,
    fs: Arc<Mutex<Fs>>,
}

/// `n` fake servers on their own thread and runtime (so both async and
/// blocking tests can use them); `dead` ones have an address nobody listens on.
fn start(n: usize, dead: &[u16]) -> Cluster {
    let key = ClusterKey([7; 32]);
    let mut fs = Fs::default();
    fs.inodes.insert(
        InodeId::ROOT,
        (new_attr(InodeId::ROOT, FileKind::Dir, 0o755), vec![]),
    );
    let fs = Arc::new(Mutex::new(fs));
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let servers = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| ServerEntry {
            id: i as u16,
            address: l.local_addr().unwrap(),
            data_dir: "/nonexistent".into(),
            metrics: None,
            host: None,
        })
        .collect();
    let cfg = ClusterConfig {
        cluster_id: "fake".into(),
        chunk_size: CS,
        key_file: "/nonexistent".into(),
        replicas: 1,
        voters: 3,
        servers,
    };
    let (fs2, key2, dead) = (fs.clone(), key.clone(), dead.to_vec());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            for (i, l) in listeners.into_iter().enumerate() {
                if dead.contains(&(i as u16)) {
                    drop(l); // connection refused from now on
                    continue;
                }
                l.set_nonblocking(true).unwrap();
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                let h = Arc::new(FakeServer {
                    id: ServerId(i as u16),
                    n,
                    fs: fs2.clone(),
                });
                tokio::spawn(serve(l, ServerId(i as u16), key2.clone(), h));
            }
            std::future::pending::<()>().await;
        });
    });
    Cluster { cfg, key, fs }
}

fn blocking(c: &Cluster) -> BlockingClient {
    BlockingClient::from_config(&c.cfg, c.key.clone()).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn striped_write_read_and_size_publication() {
    let c = start(4, &[]);
    let fs = blocking(&c);
    fs.mkdir_all("/a/b/c", 0o755).unwrap();
    let data = pattern((3 * CS + CS / 2) as usize, 1);
    fs.write_file("/a/b/c/f", &data).unwrap();
    assert_eq!(fs.stat("/a/b/c/f").unwrap().size, data.len() as u64);
    assert_eq!(fs.read_file("a//b/./c/f").unwrap(), data);

    let f = fs.open("/a/b/c/f", OpenOptions::new().read(true)).unwrap();
    for &(off, len) in &[
        (0u64, 10usize),
        (CS - 3, 7),
        (CS, CS as usize),
        (2 * CS + 5, 2 * CS as usize),
    ] {
        let got = f.read_at(off, len).unwrap();
        let end = (off as usize + len).min(data.len());
        assert_eq!(got, &data[off as usize..end], "read at {off}+{len}");
    }
    assert!(f.read_at(data.len() as u64, 10).unwrap().is_empty());
    assert_eq!(
        f.write_at(0, b"x").unwrap_err().code,
        ErrorCode::BadFileHandle
    );

    // A write beyond chunk 0 publishes its size only at close (or fsync):
    // another client sees it then; this one sees it at once (POSIX: a
    // stat after a write shows the new size).
    let other = blocking(&c);
    let w = fs
        .open("/a/b/c/g", OpenOptions::new().write(true).create(true))
        .unwrap();
    w.write_at(2 * CS + 10, b"tail").unwrap();
    assert!(w.file().needs_size_update());
    assert_eq!(other.stat("/a/b/c/g").unwrap().size, 0);
    assert_eq!(fs.stat("/a/b/c/g").unwrap().size, 2 * CS + 14);
    assert_eq!(fs.fstat(w.ino()).unwrap().size, 2 * CS + 14);
    w.close().unwrap();
    // (The other client cached the old size: it sees the new one once its
    // cache entry is refreshed, here by an open's revalidation.)
    let r = other
        .open("/a/b/c/g", OpenOptions::new().read(true))
        .unwrap();
    assert_eq!(r.size(), 2 * CS + 14);
    assert_eq!(fs.stat("/a/b/c/g").unwrap().size, 2 * CS + 14);
    // The hole reads as zeros.
    let all = fs.read_file("/a/b/c/g").unwrap();
    assert_eq!(all.len() as u64, 2 * CS + 14);
    assert!(all[..(2 * CS + 10) as usize].iter().all(|&b| b == 0));
    assert_eq!(&all[(2 * CS + 10) as usize..], b"tail");

    // fsync syncs the written servers, then the size, then the owner.
    let w = fs.open("/a/b/c/g", OpenOptions::new().write(true)).unwrap();
    w.write_at(3 * CS, b"more").unwrap();
    c.fs.lock().unwrap().log.clear();
    w.fsync().unwrap();
    let log = c.fs.lock().unwrap().log.clone();
    let owner = w.ino().owner().0;
    assert_eq!(log[log.len() - 2], (owner, Opcode::UpdateSize));
    assert_eq!(log[log.len() - 1], (owner, Opcode::Fsync));
    assert!(w.dirty_servers().is_empty() && !w.file().needs_size_update());
    drop(w);
    assert_eq!(fs.stat("/a/b/c/g").unwrap().size, 3 * CS + 4);
}

#[test]
fn appends_and_drop_without_close() {
    let c = start(3, &[]);
    let fs = blocking(&c);
    fs.write_file("/log", b"one\n").unwrap();
    let a = fs.open("/log", OpenOptions::new().append(true)).unwrap();
    a.write_at(0, b"two\n").unwrap();
    a.write_at(0, b"three\n").unwrap();
    a.close().unwrap();
    assert_eq!(fs.read_file("/log").unwrap(), b"one\ntwo\nthree\n");
    // A blocking file dropped without close still publishes its size.
    {
        let w = fs
            .open("/big", OpenOptions::new().write(true).create(true))
            .unwrap();
        w.write_at(CS * 5, b"z").unwrap();
    }
    assert_eq!(fs.stat("/big").unwrap().size, CS * 5 + 1);
}

#[test]
fn shrinking_truncate_clears_chunks_everywhere_first() {
    let c = start(3, &[]);
    let fs = blocking(&c);
    let data = pattern((4 * CS) as usize, 9);
    fs.write_file("/t", &data).unwrap();
    c.fs.lock().unwrap().log.clear();
    fs.truncate("/t", 100).unwrap();
    let log = c.fs.lock().unwrap().log.clone();
    let setattr = log
        .iter()
        .position(|&(_, op)| op == Opcode::SetAttr)
        .unwrap();
    let truncs: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, &(_, op))| op == Opcode::TruncateChunks)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(truncs.len(), 3, "every server is told: {log:?}");
    assert!(truncs.iter().all(|&i| i < setattr), "{log:?}");
    // Extending again exposes zeros, never the old data.
    fs.truncate("/t", 3 * CS).unwrap();
    let back = fs.read_file("/t").unwrap();
    assert_eq!(&back[..100], &data[..100]);
    assert!(back[100..].iter().all(|&b| b == 0));

    // Shrinking a one-chunk file needs no fan-out; open(O_TRUNC) empties.
    fs.write_file("/small", b"hello").unwrap();
    c.fs.lock().unwrap().log.clear();
    let f = fs
        .open("/small", OpenOptions::new().write(true).truncate(true))
        .unwrap();
    assert_eq!(f.attr().size, 0);
    let log = c.fs.lock().unwrap().log.clone();
    assert!(!log.iter().any(|&(_, op)| op == Opcode::TruncateChunks));
}

#[test]
fn directory_listing_pages_and_merges() {
    let c = start(3, &[]);
    let fs = blocking(&c);
    fs.mkdir("/d", 0o755).unwrap();
    let mut names: Vec<String> = (0..300).map(|i| format!("f{i:04}")).collect();
    for n in &names {
        fs.write_file(format!("/d/{n}"), b"").unwrap();
    }
    fs.mkdir("/d/sub", 0o700).unwrap();
    names.push("sub".into());
    names.sort();
    let dir = fs.stat("/d").unwrap().ino;
    let mut cursor = DirCursor::new();
    let mut seen = Vec::new();
    let mut pages = 0;
    while !cursor.is_done() {
        let (page, next) = fs.readdir_page(dir, &cursor, 16).unwrap();
        assert!(page.len() <= 16 * 3);
        assert!(page.windows(2).all(|w| w[0].name < w[1].name));
        seen.extend(page.into_iter().map(|e| e.name.to_string()));
        cursor = next;
        pages += 1;
    }
    assert!(pages > 5);
    seen.sort();
    assert_eq!(seen, names);
    let listed: Vec<String> = fs
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string())
        .collect();
    assert_eq!(listed, names);
    assert_eq!(fs.read_dir("/d/f0001").unwrap_err().code, ErrorCode::NotDir);
}

#[test]
fn symlinks_dotdot_and_errors() {
    let c = start(2, &[]);
    let fs = blocking(&c);
    fs.mkdir_all("/x/y/z", 0o755).unwrap();
    fs.write_file("/x/y/z/file", b"data").unwrap();
    fs.symlink("y/z", "/x/rel").unwrap();
    fs.symlink("/x/y", "/abs").unwrap();
    fs.symlink("nowhere", "/dangling").unwrap();
    fs.symlink("/loop2", "/loop1").unwrap();
    fs.symlink("/loop1", "/loop2").unwrap();
    assert_eq!(fs.read_file("/x/rel/file").unwrap(), b"data");
    assert_eq!(fs.read_file("/abs/z/file").unwrap(), b"data");
    // ".." after a symlink goes back from where the link led.
    assert_eq!(fs.read_file("/abs/z/../z/file").unwrap(), b"data");
    assert_eq!(
        fs.stat("/x/rel/..").unwrap().ino,
        fs.stat("/x/y").unwrap().ino
    );
    assert_eq!(fs.stat("/..").unwrap().ino, InodeId::ROOT);
    assert_eq!(fs.lstat("/abs").unwrap().kind, FileKind::Symlink);
    assert_eq!(fs.stat("/abs").unwrap().kind, FileKind::Dir);
    assert_eq!(fs.stat("/abs/").unwrap().kind, FileKind::Dir);
    assert_eq!(fs.read_link("/abs").unwrap(), b"/x/y");
    assert_eq!(fs.stat("/loop1").unwrap_err().code, ErrorCode::Loop);
    assert_eq!(fs.lstat("/loop1").unwrap().kind, FileKind::Symlink);
    assert_eq!(fs.stat("/dangling").unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(
        fs.stat("/x/y/z/file/more").unwrap_err().code,
        ErrorCode::NotDir
    );
    assert_eq!(fs.stat("/x/y/z/file/").unwrap_err().code, ErrorCode::NotDir);
    let e = fs.stat("/x/nope/q").unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT);
    assert_eq!(
        e.to_string(),
        "cannot stat '/x/nope/q': no such file or directory"
    );
    let e = fs.remove_dir("/x").unwrap_err();
    assert_eq!(e.to_string(), "cannot remove '/x': directory not empty");
    assert_eq!(fs.mkdir("/x", 0o755).unwrap_err().code, ErrorCode::Exists);
    assert_eq!(fs.mkdir("/", 0o755).unwrap_err().code, ErrorCode::Exists);
    assert_eq!(fs.mkdir_all("/x/y", 0o755).unwrap().kind, FileKind::Dir);
    assert_eq!(
        fs.mkdir_all("/x/y/z/file/w", 0o755).unwrap_err().code,
        ErrorCode::NotDir
    );
    // mkdir_all does not create through a dangling symlink, and handles "..".
    fs.symlink("/nowhere/deep", "/x/dl").unwrap();
    assert!(fs.mkdir_all("/x/dl/q", 0o755).is_err());
    assert!(!fs.exists("/nowhere").unwrap());
    fs.mkdir_all("/x/./y/../y/w/", 0o755).unwrap();
    assert_eq!(fs.stat("/x/y/w").unwrap().kind, FileKind::Dir);
    assert_eq!(fs.remove_file("/").unwrap_err().code, ErrorCode::IsDir);
    assert_eq!(fs.remove_dir("/x/..").unwrap_err().code, ErrorCode::Busy);
    // mkdir_all through a symlinked directory.
    fs.mkdir_all("/abs/new/deeper", 0o755).unwrap();
    assert_eq!(fs.stat("/x/y/new/deeper").unwrap().kind, FileKind::Dir);
    assert_eq!(
        fs.stat(&[b'/', 0][..]).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let long = format!("/{}", "n".repeat(256));
    assert_eq!(fs.stat(&long).unwrap_err().code, ErrorCode::NameTooLong);
}

#[test]
fn open_create_rename_link_and_remove_tree() {
    let c = start(3, &[]);
    let fs = blocking(&c);
    let create = OpenOptions::new().write(true).create(true);
    let f = fs.open("/f", create).unwrap();
    f.write_at(0, b"abc").unwrap();
    f.close().unwrap();
    // O_CREAT on an existing file opens it; O_EXCL refuses.
    assert_eq!(fs.open("/f", create).unwrap().attr().size, 3);
    assert_eq!(
        fs.open("/f", create.exclusive(true)).unwrap_err().code,
        ErrorCode::Exists
    );
    // O_CREAT through a symlink opens its target.
    fs.symlink("/f", "/lf").unwrap();
    assert_eq!(
        fs.open("/lf", create).unwrap().ino(),
        fs.stat("/f").unwrap().ino
    );
    fs.mkdir("/dir", 0o755).unwrap();
    assert_eq!(
        fs.open("/dir", OpenOptions::new().write(true))
            .unwrap_err()
            .code,
        ErrorCode::IsDir
    );
    assert_eq!(fs.open("/dir/", create).unwrap_err().code, ErrorCode::IsDir);
    assert_eq!(
        fs.open("/missing", OpenOptions::new().read(true))
            .unwrap_err()
            .code,
        ErrorCode::NotFound
    );

    fs.mkdir_all("/dir/sub/deep", 0o755).unwrap();
    let e = fs.rename("/dir", "/dir/sub/deep/x").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.to_string().contains("subdirectory of itself"), "{e}");
    // A file may move to a lexically "inside" name: only directories can't.
    fs.rename("/f", "/f2").unwrap();
    assert!(!fs.exists("/f").unwrap());
    assert_eq!(fs.read_file("/f2").unwrap(), b"abc");
    fs.rename("/f2", "/dir/sub/f3").unwrap();
    let a = fs.hard_link("/dir/sub/f3", "/hl").unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(
        fs.hard_link("/dir", "/dl").unwrap_err().code,
        ErrorCode::NotPermitted
    );
    fs.remove_file("/hl").unwrap();
    assert_eq!(fs.remove_file("/dir").unwrap_err().code, ErrorCode::IsDir);
    assert_eq!(
        fs.remove_file("/dir/sub/f3/").unwrap_err().code,
        ErrorCode::NotDir
    );

    for i in 0..40 {
        fs.write_file(format!("/dir/sub/deep/f{i}"), b"x").unwrap();
    }
    fs.symlink("/dir", "/dir/sub/back").unwrap();
    fs.remove_dir_all("/dir").unwrap();
    assert!(!fs.exists("/dir").unwrap());
    // The symlink out of the tree was removed, not followed.
    assert_eq!(fs.read_dir("/").unwrap().len(), 1); // "lf", now dangling
    assert_eq!(fs.remove_dir_all("/").unwrap_err().code, ErrorCode::Busy);
}

#[test]
fn stats_sum_and_a_dead_server_is_reported_promptly() {
    let c = start(3, &[1]);
    let fs = blocking(&c);
    let t = std::time::Instant::now();
    let per = fs.server_stats();
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(per.len(), 3);
    assert!(per[0].1.is_ok() && per[2].1.is_ok());
    let e = per[1].1.as_ref().unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(fs.statfs().is_err());
    // An operation needing the dead server says which one, after the path.
    let name = (0..)
        .map(|i| format!("n{i}"))
        .find(|n| {
            dentry_server(InodeId::ROOT, &FileName::new(n.as_bytes()).unwrap(), 3) == ServerId(1)
        })
        .unwrap();
    let e = fs.stat(format!("/{name}")).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(
        e.to_string().starts_with(&format!(
            "cannot stat '/{name}': connection failed: server 1"
        )),
        "{e}"
    );
    let c = start(2, &[]);
    let s = blocking(&c).statfs().unwrap();
    assert_eq!((s.bytes_total, s.inodes, s.data_bytes), (2000, 2, 14));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_client_and_credentials() {
    let c = start(2, &[]);
    let client = Client::from_config(&c.cfg, c.key.clone()).unwrap();
    let root = client.with_credentials(Credentials::root());
    assert_eq!(root.credentials().uid, 0);
    let name = FileName::new(b"n").unwrap();
    let (attr, created) = root
        .create(InodeId::ROOT, &name, 0o600, true)
        .await
        .unwrap();
    assert!(created);
    let out = root.write(attr.ino, CS - 2, b"abcd").await.unwrap();
    assert!(out.touched_non_zero_chunk);
    assert!(out.written.contains(attr.ino.owner()));
    // Reads are clamped to the size the caller passes.
    assert_eq!(
        root.read(attr.ino, CS - 2, 10, CS + 1).await.unwrap(),
        b"abc"
    );
    assert_eq!(root.read(attr.ino, CS + 5, 10, CS + 1).await.unwrap(), b"");
    let too_far = root
        .write(attr.ino, limits::FILE_SIZE_MAX_BYTES, b"x")
        .await
        .unwrap_err();
    assert_eq!(too_far.code, ErrorCode::FileTooBig);
    assert_eq!(
        root.lookup(InodeId::ROOT, &name).await.unwrap().ino,
        attr.ino
    );
}
