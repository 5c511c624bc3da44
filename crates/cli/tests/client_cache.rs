//! The client library's metadata cache against real servers: what a client
//! changes itself it sees at once; what other clients change it sees within
//! the TTL (and at once with the cache off); open revalidates the name it
//! opens (close-to-open); a cached walk still checks search permission;
//! and a randomized run of path operations checked against a model after
//! every step never sees its own changes late.
//!
//! Guards against the cache hiding a client's own create, unlink, rename,
//! chmod or write, and against stale answers outliving the TTL.

mod common;

use common::TestCluster;
use madfs_client::{BlockingClient, CacheConfig, Credentials, ErrorCode, FileKind, OpenOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng as StdRng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn client_with_ttl(tc: &TestCluster, ttl: Duration) -> BlockingClient {
    BlockingClient::from_client(tc.client().with_cache(CacheConfig::with_ttl(ttl))).unwrap()
}

/// Long enough never to expire while a test runs.
const FOREVER: Duration = Duration::from_secs(600);

fn code<T: std::fmt::Debug>(r: madfs_client::Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

#[test]
fn own_changes_are_seen_at_once() {
    let tc = TestCluster::start(3);
    let c = client_with_ttl(&tc, FOREVER);
    c.mkdir_all("/d/e", 0o755).unwrap();
    // A name known to be missing, then created by this client.
    assert_eq!(code(c.stat("/d/e/f")), ErrorCode::NotFound);
    c.write_file("/d/e/f", b"abc").unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().size, 3);
    // Writes (in chunk 0 and far beyond it) show in stat before close.
    let f = c.open("/d/e/f", OpenOptions::new().write(true)).unwrap();
    f.write_at(0, b"abcdef").unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().size, 6);
    let far = 3 * c.chunk_size() + 5;
    f.write_at(far, b"z").unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().size, far + 1);
    f.set_len(2).unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().size, 2);
    f.close().unwrap();
    // chmod, truncate by path, rename, unlink, rmdir.
    c.set_permissions("/d/e/f", 0o600).unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().perm, 0o600);
    c.truncate("/d/e/f", 100).unwrap();
    assert_eq!(c.stat("/d/e/f").unwrap().size, 100);
    c.rename("/d/e/f", "/d/g").unwrap();
    assert_eq!(code(c.stat("/d/e/f")), ErrorCode::NotFound);
    assert_eq!(c.stat("/d/g").unwrap().size, 100);
    c.hard_link("/d/g", "/d/e/h").unwrap();
    assert_eq!(c.stat("/d/g").unwrap().nlink, 2);
    c.remove_file("/d/g").unwrap();
    assert_eq!(code(c.stat("/d/g")), ErrorCode::NotFound);
    assert_eq!(c.stat("/d/e/h").unwrap().nlink, 1);
    c.remove_file("/d/e/h").unwrap();
    c.remove_dir("/d/e").unwrap();
    assert_eq!(code(c.stat("/d/e")), ErrorCode::NotFound);
    c.mkdir("/d/e", 0o700).unwrap();
    assert_eq!(c.stat("/d/e").unwrap().perm, 0o700);
    // A directory replaced by a file of the same name.
    c.remove_dir("/d/e").unwrap();
    c.write_file("/d/e", b"now a file").unwrap();
    assert_eq!(c.stat("/d/e").unwrap().kind, FileKind::File);
    assert_eq!(code(c.stat("/d/e/x")), ErrorCode::NotDir);
}

#[test]
fn other_clients_changes_are_seen_within_the_ttl() {
    let tc = TestCluster::start(2);
    let other = client_with_ttl(&tc, Duration::ZERO);
    other.mkdir_all("/w", 0o755).unwrap();
    let cached = client_with_ttl(&tc, FOREVER);
    let short = client_with_ttl(&tc, Duration::from_millis(300));
    let off = client_with_ttl(&tc, Duration::ZERO);
    for c in [&cached, &short, &off] {
        assert_eq!(code(c.stat("/w/new")), ErrorCode::NotFound);
    }
    other.write_file("/w/new", b"12345").unwrap();
    // Without a cache: at once. With a long TTL: the stale answer stays.
    assert_eq!(off.stat("/w/new").unwrap().size, 5);
    assert_eq!(code(cached.stat("/w/new")), ErrorCode::NotFound);
    // With a short TTL: within it (and some slack for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match short.stat("/w/new") {
            Ok(a) => {
                assert_eq!(a.size, 5);
                break;
            }
            Err(e) => assert_eq!(e.code, ErrorCode::NotFound),
        }
        assert!(Instant::now() < deadline, "the short TTL never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    // open() never trusts a cached name: the long-TTL client opens it.
    let f = cached
        .open("/w/new", OpenOptions::new().read(true))
        .unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"12345");
}

#[test]
fn open_revalidates_the_name_and_size() {
    let tc = TestCluster::start(3);
    let writer = client_with_ttl(&tc, Duration::ZERO);
    writer.write_file("/f", b"old").unwrap();
    let reader = client_with_ttl(&tc, FOREVER);
    let before = reader.stat("/f").unwrap();
    assert_eq!(before.size, 3);
    // Rewritten in place (same inode), longer.
    writer.write_file("/f", b"new and longer").unwrap();
    assert_eq!(reader.stat("/f").unwrap().size, 3, "a stat may be stale");
    let f = reader.open("/f", OpenOptions::new().read(true)).unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"new and longer");
    // Replaced by another inode under the same name.
    writer.remove_file("/f").unwrap();
    writer.write_file("/f", b"other inode").unwrap();
    let f = reader.open("/f", OpenOptions::new().read(true)).unwrap();
    assert_ne!(f.ino(), before.ino);
    assert_eq!(f.read_at(0, 100).unwrap(), b"other inode");
    // After the open the cache holds the fresh entry.
    assert_eq!(reader.stat("/f").unwrap().ino, f.ino());
}

#[test]
fn cached_walks_still_check_search_permission() {
    let tc = TestCluster::start(2);
    let root = client_with_ttl(&tc, Duration::ZERO);
    root.mkdir_all("/home/u", 0o755).unwrap();
    root.write_file("/home/u/f", b"x").unwrap();
    root.chown("/home/u", Some(1000), Some(1000)).unwrap();
    let user = BlockingClient::from_client(
        tc.client()
            .with_cache(CacheConfig::with_ttl(FOREVER))
            .with_credentials(Credentials {
                uid: 1000,
                gid: 1000,
                groups: vec![],
            }),
    )
    .unwrap();
    assert_eq!(user.stat("/home/u/f").unwrap().size, 1);
    // The owner takes its own search permission away; the entry for f is
    // still cached, but the walk through /home/u must now be refused.
    user.set_permissions("/home/u", 0o600).unwrap();
    assert_eq!(code(user.stat("/home/u/f")), ErrorCode::AccessDenied);
    user.set_permissions("/home/u", 0o700).unwrap();
    assert_eq!(user.stat("/home/u/f").unwrap().size, 1);
    // access(2) by path is decided on the attributes, as the server would.
    assert_eq!(
        code(user.check_access("/home/u/f", madfs_client::ACCESS_WRITE)),
        ErrorCode::AccessDenied
    );
    assert!(user
        .check_access("/home/u/f", madfs_client::ACCESS_READ)
        .is_ok());
}

/// What the model knows of a path.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir,
    File(u64),
}

/// One client, cache on with a long TTL, random path operations; after
/// each, every path the model knows and a few it does not are stat()ed
/// and compared. Replay a failure with MADFS_CACHE_SEED.
#[test]
fn random_operations_always_see_their_own_changes() {
    let tc = TestCluster::start(3);
    let c = client_with_ttl(&tc, FOREVER);
    let seed: u64 = std::env::var("MADFS_CACHE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cace);
    let mut rng = StdRng::seed_from_u64(seed);
    let names = ["a", "b", "c"];
    let mut model: BTreeMap<String, Node> = BTreeMap::new();
    model.insert(String::new(), Node::Dir);
    let random_path = |rng: &mut StdRng| -> String {
        let depth = rng.random_range(1..=3);
        (0..depth)
            .map(|_| format!("/{}", names[rng.random_range(0..names.len())]))
            .collect()
    };
    let parent = |p: &str| p[..p.rfind('/').unwrap()].to_string();
    let mut log = Vec::new();
    let mut to_paths: Vec<String> = Vec::new();
    for step in 0..400 {
        let p = random_path(&mut rng);
        let op = rng.random_range(0..7);
        let parent_is_dir = model.get(&parent(&p)) == Some(&Node::Dir);
        let exists = model.get(&p).cloned();
        let has_children = model.keys().any(|k| k.starts_with(&format!("{p}/")));
        log.push(format!("{step}: op {op} on {p}"));
        if op == 4 {
            // Drawn here so the log is complete before any check reads it.
            let to = random_path(&mut rng);
            log.push(format!("   to {to}"));
            to_paths.push(to);
        }
        let ctx = || format!("seed {seed}, log:\n{}", log.join("\n"));
        match op {
            0 => {
                let r = c.mkdir(&p, 0o755);
                if parent_is_dir && exists.is_none() {
                    r.unwrap_or_else(|e| panic!("mkdir {p}: {e}\n{}", ctx()));
                    model.insert(p.clone(), Node::Dir);
                } else {
                    assert!(r.is_err(), "mkdir {p} succeeded\n{}", ctx());
                }
            }
            1 => {
                let len = rng.random_range(0..5000u64);
                let r = c.write_file(&p, &vec![1u8; len as usize]);
                if parent_is_dir && exists != Some(Node::Dir) {
                    r.unwrap_or_else(|e| panic!("write {p}: {e}\n{}", ctx()));
                    model.insert(p.clone(), Node::File(len));
                } else {
                    assert!(r.is_err(), "write {p} succeeded\n{}", ctx());
                }
            }
            2 => {
                let r = c.remove_file(&p);
                if matches!(exists, Some(Node::File(_))) {
                    r.unwrap_or_else(|e| panic!("unlink {p}: {e}\n{}", ctx()));
                    model.remove(&p);
                } else {
                    assert!(r.is_err(), "unlink {p} succeeded\n{}", ctx());
                }
            }
            3 => {
                let r = c.remove_dir(&p);
                if exists == Some(Node::Dir) && !has_children {
                    r.unwrap_or_else(|e| panic!("rmdir {p}: {e}\n{}", ctx()));
                    model.remove(&p);
                } else {
                    assert!(r.is_err(), "rmdir {p} succeeded\n{}", ctx());
                }
            }
            4 => {
                // Rename a file onto a free name or another file.
                let to = to_paths.pop().expect("drawn above");
                let to_ok = model.get(&parent(&to)) == Some(&Node::Dir)
                    && !matches!(model.get(&to), Some(Node::Dir));
                if let (Some(Node::File(len)), true) = (exists.clone(), to_ok) {
                    c.rename(&p, &to)
                        .unwrap_or_else(|e| panic!("rename {p} {to}: {e}\n{}", ctx()));
                    model.remove(&p);
                    model.insert(to, Node::File(len));
                }
            }
            5 => {
                if let Some(Node::File(_)) = exists {
                    let len = rng.random_range(0..300_000u64);
                    c.truncate(&p, len).unwrap();
                    model.insert(p.clone(), Node::File(len));
                }
            }
            _ => {
                if let Some(Node::File(old)) = exists {
                    let at = rng.random_range(0..(2 * c.chunk_size()));
                    let f = c.open(&p, OpenOptions::new().write(true)).unwrap();
                    f.write_at(at, b"xyz").unwrap();
                    // Seen before close too.
                    let want = old.max(at + 3);
                    assert_eq!(c.stat(&p).unwrap().size, want, "{}", ctx());
                    f.close().unwrap();
                    model.insert(p.clone(), Node::File(want));
                }
            }
        }
        // Compare every known path, and a few unknown ones.
        let mut probe: Vec<String> = model.keys().filter(|k| !k.is_empty()).cloned().collect();
        for _ in 0..3 {
            probe.push(random_path(&mut rng));
        }
        for q in probe {
            let got = c.stat(&q);
            match model.get(&q) {
                Some(Node::Dir) => assert_eq!(
                    got.as_ref().map(|a| a.kind).ok(),
                    Some(FileKind::Dir),
                    "{q}: {got:?}\n{}",
                    ctx()
                ),
                Some(Node::File(len)) => assert_eq!(
                    got.as_ref().map(|a| (a.kind, a.size)).ok(),
                    Some((FileKind::File, *len)),
                    "{q}: {got:?}\n{}",
                    ctx()
                ),
                None => assert!(
                    matches!(
                        got.as_ref().map_err(|e| e.code),
                        Err(ErrorCode::NotFound) | Err(ErrorCode::NotDir)
                    ),
                    "{q} should not exist: {got:?}\n{}",
                    ctx()
                ),
            }
        }
    }
}

/// The bytes a small file's open brings along (`Op::Open`) are the file's:
/// holes and a truncated-up tail read as zeros, files whose first chunk
/// left the inode or whose inode lives on another server are read the
/// ordinary way, and a write by this client through another handle is
/// never hidden by them.
#[test]
fn bytes_brought_by_open_are_the_files() {
    let tc = TestCluster::start(4);
    let c = client_with_ttl(&tc, FOREVER);
    let read_all = |p: &str| {
        let f = c.open(p, OpenOptions::new().read(true)).unwrap();
        f.read_at(0, 1 << 20).unwrap()
    };
    c.write_file("/small", b"hello").unwrap();
    assert_eq!(read_all("/small"), b"hello");
    // Extended by a truncate: the tail is zeros.
    c.truncate("/small", 9).unwrap();
    assert_eq!(read_all("/small"), b"hello\0\0\0\0");
    // Empty.
    c.write_file("/empty", b"").unwrap();
    assert!(read_all("/empty").is_empty());
    // Chunk 0 moved to a chunk file (it outgrew the inline limit once),
    // then cut back small: read from the chunk file.
    c.write_file("/moved", &vec![5u8; 100_000]).unwrap();
    c.truncate("/moved", 10).unwrap();
    assert_eq!(read_all("/moved"), vec![5u8; 10]);
    // Hard links from every directory server: some names live on servers
    // that do not own the inode.
    c.mkdir("/links", 0o755).unwrap();
    for i in 0..12 {
        c.hard_link("/small", format!("/links/l{i}")).unwrap();
        assert_eq!(read_all(&format!("/links/l{i}")), b"hello\0\0\0\0");
    }
    // A reader opened before this client writes through another handle:
    // the write is seen, not the bytes that came with the open.
    let reader = c.open("/small", OpenOptions::new().read(true)).unwrap();
    let writer = c.open("/small", OpenOptions::new().write(true)).unwrap();
    writer.write_at(0, b"J").unwrap();
    assert_eq!(reader.read_at(0, 100).unwrap(), b"Jello\0\0\0\0");
    writer.close().unwrap();
    // Another client's change after the open is seen at the next open
    // (close-to-open).
    let other = client_with_ttl(&tc, Duration::ZERO);
    let before = c.open("/small", OpenOptions::new().read(true)).unwrap();
    other.write_file("/small", b"other").unwrap();
    let after = c.open("/small", OpenOptions::new().read(true)).unwrap();
    assert_eq!(after.read_at(0, 100).unwrap(), b"other");
    assert_eq!(before.ino(), after.ino());
}

/// A handle open to read and write whose open brought the file's bytes:
/// its own writes (and truncates) are read back, not the bytes of the open.
#[test]
fn a_read_write_handle_reads_its_own_writes() {
    let tc = TestCluster::start(2);
    let c = client_with_ttl(&tc, FOREVER);
    c.write_file("/rw", b"0123456789").unwrap();
    let f = c
        .open("/rw", OpenOptions::new().read(true).write(true))
        .unwrap();
    f.write_at(2, b"ab").unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"01ab456789");
    let f = c
        .open("/rw", OpenOptions::new().read(true).write(true))
        .unwrap();
    f.set_len(3).unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"01a");
    let f = c
        .open("/rw", OpenOptions::new().read(true).append(true))
        .unwrap();
    f.write_at(0, b"Z").unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"01aZ");
}

/// Writes that went behind (as `madfs run` writes) are seen by every other
/// handle and by stat in the same client at once, and a truncate by path
/// is not undone by them.
#[test]
fn writes_behind_are_seen_by_every_handle_of_the_client() {
    let tc = TestCluster::start(3);
    let c = client_with_ttl(&tc, FOREVER);
    c.write_file("/wb", b"").unwrap();
    let reader = c.open("/wb", OpenOptions::new().read(true)).unwrap();
    let w = c
        .open("/wb", OpenOptions::new().write(true).write_behind(true))
        .unwrap();
    let far = 2 * c.chunk_size() + 7;
    for i in 0..20u64 {
        w.write_at(i * 1000, &[i as u8 + 1; 1000]).unwrap();
    }
    w.write_at(far, b"end").unwrap();
    // Another handle reads what went behind, and stat sees the size.
    assert_eq!(c.stat("/wb").unwrap().size, far + 3);
    assert_eq!(reader.read_at(5000, 10).unwrap(), vec![6u8; 10]);
    assert_eq!(reader.read_at(far, 100).unwrap(), b"end");
    // A truncate by path waits for the writes still in flight.
    for i in 0..20u64 {
        w.write_at(i * 1000, &[9u8; 1000]).unwrap();
    }
    c.truncate("/wb", 10).unwrap();
    assert_eq!(c.stat("/wb").unwrap().size, 10);
    w.close().unwrap();
    let other = client_with_ttl(&tc, Duration::ZERO);
    assert_eq!(other.read_file("/wb").unwrap(), vec![9u8; 10]);
}
