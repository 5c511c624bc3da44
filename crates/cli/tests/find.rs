//! Guards server-side find and du (Op::Find): `madfs find` gives the same
//! set of paths as GNU find run on an identical tree (names, sizes, mtimes,
//! owners) in a local directory, for every supported predicate, including
//! entries whose inode lives on another server than their name (a file and a
//! directory renamed across servers, a hard link); `madfs du` equals the sum
//! of the sizes; directories the caller may not read are skipped and
//! reported.

mod common;

use common::TestCluster;
use madfs_client::{Client, Credentials, FileKind, FileName, FindQuery, TimeSet, Timestamp};
use madfs_types::dentry_server;
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;

const SERVERS: usize = 4;
const T0: i64 = 1_600_000_000;
/// The reference file's mtime: entries with a larger mtime are "newer".
const REF_SECS: i64 = T0 + 55;
const OTHER_UID: u32 = 4242;

fn ts(secs: i64) -> Timestamp {
    Timestamp { secs, nanos: 0 }
}

/// A name in `dir` whose dentry lands on another server than `owner`, so the
/// entry's inode is remote to its dentry server.
async fn remote_name(c: &Client, dir: &str, stem: &str, owner: u16) -> String {
    let parent = c.stat(dir).await.unwrap().ino;
    (0..100)
        .map(|i| format!("{stem}{i}"))
        .find(|n| dentry_server(parent, &FileName::new(n.as_bytes()).unwrap(), SERVERS).0 != owner)
        .unwrap()
}

/// Builds the same tree in MadFS and under a local directory.
struct Twin<'a> {
    c: &'a Client,
    local: &'a Path,
    /// (path, mtime secs) to set at the end (after every child exists).
    times: Vec<(String, i64)>,
}

impl Twin<'_> {
    fn l(&self, p: &str) -> std::path::PathBuf {
        self.local.join(p.trim_start_matches('/'))
    }
    async fn mkdir(&mut self, p: &str, secs: i64) {
        self.c.mkdir(p, 0o755).await.unwrap();
        std::fs::create_dir(self.l(p)).unwrap();
        self.times.push((p.to_string(), secs));
    }
    async fn file(&mut self, p: &str, size: usize, secs: i64) {
        let data = vec![b'x'; size];
        self.c.write_file(p, &data).await.unwrap();
        std::fs::write(self.l(p), &data).unwrap();
        self.times.push((p.to_string(), secs));
    }
    async fn chown(&self, p: &str, uid: u32) {
        self.c.chown(p, Some(uid), None).await.unwrap();
        std::os::unix::fs::lchown(self.l(p), Some(uid), None).unwrap();
    }
    async fn finish(&self) {
        for (p, secs) in &self.times {
            self.c
                .set_times(p.as_str(), TimeSet::At(ts(*secs)), TimeSet::At(ts(*secs)))
                .await
                .unwrap();
            let st = Command::new("touch")
                .arg("-h")
                .arg("-d")
                .arg(format!("@{secs}"))
                .arg(self.l(p))
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
}

fn lines(s: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(s)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

fn madfs_find(tc: &TestCluster, args: &[&str]) -> BTreeSet<String> {
    let mut all = vec!["find"];
    all.extend_from_slice(args);
    let out = tc.madfs(&all);
    assert!(
        out.status.success(),
        "madfs {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = lines(&out.stdout);
    // Deterministic: sorted, no duplicates.
    let raw: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(raw.len(), got.len(), "duplicates in {raw:?}");
    assert!(raw.windows(2).all(|w| w[0] < w[1]), "unsorted {raw:?}");
    got
}

fn gnu_find(local: &Path, root: &str, args: &[&str]) -> BTreeSet<String> {
    let out = Command::new("find")
        .arg(local.join(root.trim_start_matches('/')))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = local.to_string_lossy().to_string();
    lines(&out.stdout)
        .into_iter()
        .map(|l| l.strip_prefix(&prefix).unwrap().to_string())
        .collect()
}

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_matches_gnu_find_on_the_same_tree() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path();
    let mut t = Twin {
        c: &c,
        local,
        times: Vec::new(),
    };
    t.mkdir("/t", T0).await;
    t.mkdir("/t/a", T0 + 100).await;
    t.mkdir("/t/a/sub01", T0 + 10).await;
    t.mkdir("/t/b", T0 + 20).await;
    t.mkdir("/t/c", T0 + 30).await;
    t.mkdir("/t/c/d", T0 + 40).await;
    t.mkdir("/t/c/d/e", T0 + 60).await;
    t.mkdir("/outside", T0).await;
    t.file("/outside/x01", 3901, T0 + 99).await;
    t.file("/t/f01", 3901, T0 + 1).await;
    t.file("/t/ref", 7, REF_SECS).await;
    t.file("/t/a/x", 0, T0 + 70).await;
    t.file("/t/a/file01.txt", 1024, T0 + 2).await;
    t.file("/t/a/sub01/big", 8193, T0 + 80).await;
    t.file("/t/a/sub01/k", 3073, T0 + 3).await;
    t.file("/t/b/y", 3901, T0 + 90).await;
    t.file("/t/b/z", 3072, T0 + 4).await;
    t.file("/t/c/d/e/leaf01", 70_000, T0 + 5).await;
    t.file("/t/c/d/e/.hidden01", 1, T0 + 56).await;
    for i in 0..40 {
        t.file(&format!("/t/c/many{i:02}"), i * 100, T0 + i as i64)
            .await;
    }

    // A file renamed across directories: its inode stays on the server that
    // made it while the new name lands on another one.
    c.write_file("/t/a/tomove", &[b'm'; 500]).await.unwrap();
    let owner = c.stat("/t/a/tomove").await.unwrap().ino.owner().0;
    let moved = remote_name(&c, "/t/b", "moved01_", owner).await;
    c.rename("/t/a/tomove", format!("/t/b/{moved}").as_str())
        .await
        .unwrap();
    std::fs::write(local.join(format!("t/b/{moved}")), [b'm'; 500]).unwrap();
    t.times.push((format!("/t/b/{moved}"), T0 + 95));

    // A directory renamed across servers, with contents: paths below it go
    // through a directory whose inode is remote to its dentry.
    c.mkdir("/t/a/dirmv", 0o755).await.unwrap();
    c.write_file("/t/a/dirmv/in01", &[1; 3901]).await.unwrap();
    let downer = c.stat("/t/a/dirmv").await.unwrap().ino.owner().0;
    let dmoved = remote_name(&c, "/t/c", "dir01_", downer).await;
    c.rename("/t/a/dirmv", format!("/t/c/{dmoved}").as_str())
        .await
        .unwrap();
    std::fs::create_dir(local.join(format!("t/c/{dmoved}"))).unwrap();
    std::fs::write(local.join(format!("t/c/{dmoved}/in01")), [1; 3901]).unwrap();
    t.times.push((format!("/t/c/{dmoved}/in01"), T0 + 57));
    t.times.push((format!("/t/c/{dmoved}"), T0 + 58));

    // A hard link (a second name, likely on another server) and symlinks.
    let yowner = c.stat("/t/b/y").await.unwrap().ino.owner().0;
    let hard = remote_name(&c, "/t/c", "hard01_", yowner).await;
    c.hard_link("/t/b/y", format!("/t/c/{hard}").as_str())
        .await
        .unwrap();
    std::fs::hard_link(local.join("t/b/y"), local.join(format!("t/c/{hard}"))).unwrap();
    c.symlink("../f01", "/t/c/link01").await.unwrap();
    std::os::unix::fs::symlink("../f01", local.join("t/c/link01")).unwrap();
    c.symlink("/nowhere", "/t/a/dangling").await.unwrap();
    std::os::unix::fs::symlink("/nowhere", local.join("t/a/dangling")).unwrap();

    t.chown("/t/a/x", OTHER_UID).await;
    t.chown("/t/c/d/e", OTHER_UID).await;
    t.chown(&format!("/t/b/{moved}"), OTHER_UID).await;
    t.finish().await;

    // Hand-written expectations.
    let m = |p: &str| p.to_string();
    let mut expect01 = set(&[
        "/t/f01",
        "/t/a/file01.txt",
        "/t/a/sub01",
        "/t/c/d/e/leaf01",
        "/t/c/d/e/.hidden01",
        "/t/c/link01",
        "/t/c/many01",
    ]);
    expect01.insert(m(&format!("/t/b/{moved}")));
    expect01.insert(m(&format!("/t/c/{dmoved}")));
    expect01.insert(m(&format!("/t/c/{dmoved}/in01")));
    expect01.insert(m(&format!("/t/c/{hard}")));
    assert_eq!(madfs_find(&tc, &["/t", "-name", "*01*"]), expect01);
    let mut expect3901 = set(&["/t/f01", "/t/b/y"]);
    expect3901.insert(m(&format!("/t/c/{hard}")));
    expect3901.insert(m(&format!("/t/c/{dmoved}/in01")));
    assert_eq!(madfs_find(&tc, &["/t", "-size", "3901c"]), expect3901);
    let mut expect_uid = set(&["/t/a/x", "/t/c/d/e"]);
    expect_uid.insert(m(&format!("/t/b/{moved}")));
    assert_eq!(
        madfs_find(&tc, &["/t", "-uid", &OTHER_UID.to_string()]),
        expect_uid
    );
    // The starting point is tested too, under its own name.
    assert_eq!(
        madfs_find(&tc, &["/t/a/sub01", "-name", "sub01"]),
        set(&["/t/a/sub01"])
    );
    assert_eq!(madfs_find(&tc, &["/t/f01"]), set(&["/t/f01"]));

    // The same sets as GNU find on the twin tree. Directory sizes differ
    // between file systems, so size tests are restricted to non-directories.
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["-name", "*01*"],
        vec!["-name", "many?[0-3]"],
        vec!["-name", "[!m]*"],
        vec!["-name", ".*"],
        vec!["-type", "f", "-size", "3901c"],
        vec!["-type", "f", "-size", "4k"],
        vec!["-type", "f", "-size", "-4k"],
        vec!["-type", "f", "-size", "+3k"],
        vec!["-type", "f", "-size", "-1M"],
        vec!["-type", "f", "-size", "8"],
        vec!["-type", "f", "-size", "+0"],
        vec!["-type", "l", "-size", "-7c"],
        vec!["-newer", "REF"],
        vec!["-type", "d"],
        vec!["-type", "f"],
        vec!["-type", "l"],
        vec!["-uid", "4242"],
        vec!["-name", "*01*", "-type", "f", "-newer", "REF"],
        vec!["-type", "d", "-newer", "REF", "-uid", "0"],
    ];
    let local_ref = local.join("t/ref").to_string_lossy().to_string();
    for case in &cases {
        for root in ["/t", "/t/c", "/t/b/"] {
            let mine: Vec<&str> = std::iter::once(root)
                .chain(case.iter().map(|a| if *a == "REF" { "/t/ref" } else { a }))
                .collect();
            let theirs: Vec<&str> = case
                .iter()
                .map(|a| if *a == "REF" { local_ref.as_str() } else { a })
                .collect();
            let got = madfs_find(&tc, &mine);
            let want = gnu_find(local, root, &theirs);
            assert_eq!(got, want, "find {mine:?}");
        }
    }
    // From the root of the file system: everything, /outside included.
    let all = madfs_find(&tc, &["/", "-name", "*01"]);
    assert!(
        all.contains("/outside/x01") && all.contains("/t/f01"),
        "{all:?}"
    );
    assert!(all.contains("/t/a/sub01"));

    // du: apparent sizes of every inode once (walked by hand here).
    let mut seen = HashSet::new();
    let mut bytes = 0u64;
    let mut stack = vec!["/t".to_string()];
    while let Some(p) = stack.pop() {
        let a = c.lstat(p.as_str()).await.unwrap();
        if seen.insert(a.ino) {
            bytes += a.size;
        }
        if a.kind == FileKind::Dir {
            for e in c.read_dir(p.as_str()).await.unwrap() {
                stack.push(format!("{p}/{}", e.name));
            }
        }
    }
    let out = tc.madfs_ok(["du", "/t"]);
    assert_eq!(out, format!("{bytes}\t/t\n"));
    let out = tc.madfs_ok(["du", "--inodes", "/t"]);
    assert_eq!(out, format!("{}\t/t\n", seen.len()));
    let (totals, denied) = c.du("/t").await.unwrap();
    assert_eq!((totals.bytes, totals.inodes), (bytes, seen.len() as u64));
    assert!(denied.is_empty());

    // `scanned`: every directory entry the servers examined, each once.
    // The servers scan whole shards, so it is the file system's entry count
    // (walked by hand; `/` has no entry of its own) wherever the root is.
    let mut entries = 0u64;
    let mut stack = vec![String::new()];
    while let Some(p) = stack.pop() {
        for e in c
            .read_dir(if p.is_empty() { "/" } else { p.as_str() })
            .await
            .unwrap()
        {
            entries += 1;
            if e.kind == FileKind::Dir {
                stack.push(format!("{p}/{}", e.name));
            }
        }
    }
    let all = c.find_detailed("/", &FindQuery::default()).await.unwrap();
    assert_eq!(all.found.len() as u64, entries + 1, "every entry and /");
    assert_eq!(all.scanned, entries);
    let q01 = FindQuery {
        name: Some(b"*01*".to_vec()),
        ..FindQuery::default()
    };
    let out = c.find_detailed("/t", &q01).await.unwrap();
    assert_eq!(out.found.len(), expect01.len());
    assert_eq!(out.scanned, entries);
    // The counting variant: same matches and count, no paths.
    let counted = c.find_count("/t", &q01).await.unwrap();
    assert_eq!(counted.scanned, entries);
    assert_eq!(counted.found.len(), expect01.len());
    assert!(counted.found.iter().all(|f| f.path.is_empty()));
    // A start that is not a directory: only itself was examined.
    let out = c.find_detailed("/t/f01", &q01).await.unwrap();
    assert_eq!((out.found.len(), out.scanned), (1, 1));

    // Errors: a missing start, a bad predicate.
    let out = tc.madfs(["find", "/nope", "-name", "x"]);
    assert!(!out.status.success());
    let out = tc.madfs(["find", "/t", "-size", "4q"]);
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_skips_directories_the_caller_cannot_read() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/p", 0o755).await.unwrap();
    c.mkdir("/p/open", 0o755).await.unwrap();
    c.mkdir("/p/secret", 0o700).await.unwrap();
    c.mkdir("/p/secret/inner", 0o755).await.unwrap();
    c.write_file("/p/open/a01", b"a").await.unwrap();
    c.write_file("/p/secret/s01", b"s").await.unwrap();
    c.write_file("/p/secret/inner/t01", b"t").await.unwrap();
    let user = c.with_credentials(Credentials {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    });
    let q = FindQuery {
        name: Some(b"*".to_vec()),
        ..FindQuery::default()
    };
    let out = user.find_detailed("/p", &q).await.unwrap();
    let paths: Vec<String> = out
        .found
        .iter()
        .map(|f| String::from_utf8_lossy(&f.path).to_string())
        .collect();
    assert_eq!(paths, ["/p", "/p/open", "/p/open/a01", "/p/secret"]);
    assert_eq!(out.denied, vec![b"/p/secret".to_vec()]);
    // Root sees everything.
    let all = c.find("/p", &q).await.unwrap();
    assert_eq!(all.len(), 7);
    // A start the caller cannot search fails.
    assert!(user.find("/p/secret/inner", &q).await.is_err());
}

/// Enough entries that every server answers in several pages (4096 items
/// each): every entry exactly once, and the matches of a glob exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_pages_through_large_shards() {
    const FILES: usize = 24_000;
    const DIRS: usize = 200;
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let top = c.mkdir("/m", 0o755).await.unwrap().ino;
    let mut tasks = Vec::new();
    for w in 0..32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..FILES).step_by(32) {
                let n = FileName::new(format!("f{i}").as_bytes()).unwrap();
                c.create(top, &n, 0o644, true).await.unwrap();
            }
            for i in (w..DIRS).step_by(32) {
                c.mkdir(format!("/m/d{i}").as_str(), 0o755).await.unwrap();
                c.write_file(format!("/m/d{i}/in{i}").as_str(), b"x")
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = c.find("/m", &FindQuery::default()).await.unwrap();
    let paths: BTreeSet<&[u8]> = all.iter().map(|f| f.path.as_slice()).collect();
    assert_eq!(all.len(), 1 + FILES + 2 * DIRS);
    assert_eq!(paths.len(), all.len(), "duplicates");
    assert!(paths.contains(&b"/m/d7/in7"[..]));
    let q = FindQuery {
        name: Some(b"*01*".to_vec()),
        ..FindQuery::default()
    };
    let got: BTreeSet<String> = c
        .find("/m", &q)
        .await
        .unwrap()
        .into_iter()
        .map(|f| String::from_utf8(f.path).unwrap())
        .collect();
    let mut want: BTreeSet<String> = (0..FILES)
        .map(|i| format!("f{i}"))
        .filter(|n| n.contains("01"))
        .map(|n| format!("/m/{n}"))
        .collect();
    for i in 0..DIRS {
        if format!("d{i}").contains("01") {
            want.insert(format!("/m/d{i}"));
        }
        if format!("in{i}").contains("01") {
            want.insert(format!("/m/d{i}/in{i}"));
        }
    }
    assert_eq!(got, want);
    let (totals, _) = c.du("/m").await.unwrap();
    assert_eq!(totals.inodes as usize, all.len());
    // Every entry counted exactly once across servers and pages: the
    // cluster holds /m (its own entry in /) and what is below it.
    let out = c.find_detailed("/m", &q).await.unwrap();
    assert_eq!(out.scanned as usize, all.len());
    assert!(out.scanned as usize >= out.found.len());
}

/// Equal sets, or a failure that names a few differences (not thousands).
fn same(got: BTreeSet<String>, want: &BTreeSet<String>, what: &str) {
    let extra: Vec<&String> = got.difference(want).take(5).collect();
    let missing: Vec<&String> = want.difference(&got).take(5).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what}: extra {extra:?}, missing {missing:?} (of {} found, {} wanted)",
        got.len(),
        want.len()
    );
}

/// How many times the servers' logs say they built the find index, after
/// checking that none ever dropped it (its answers would then come from
/// RocksDB, and a test of the index would prove nothing).
fn index_builds(tc: &TestCluster) -> usize {
    (0..tc.server_count())
        .map(|i| {
            let log = std::fs::read_to_string(tc.log_path(i)).unwrap_or_default();
            assert!(
                !log.contains("find runs without its in-memory index")
                    && !log.contains("find reads inodes from RocksDB"),
                "server {i}: {log}"
            );
            log.matches("find index: ").count()
        })
        .sum()
}

/// The servers keep an in-memory copy of their dentries and inode
/// attributes for find. It must follow creates, writes, removals and renames
/// (within a directory, across directories, onto other servers), be rebuilt
/// from RocksDB at restart, and give the same answers as a server without
/// one (`--find-index-mib 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_answers_the_same_with_and_without_the_in_memory_index() {
    const FILES: usize = 3_000;
    let mut tc = TestCluster::start(SERVERS);
    assert_eq!(index_builds(&tc), SERVERS);
    let c = tc.client();
    c.mkdir("/i", 0o755).await.unwrap();
    c.mkdir("/i/a", 0o755).await.unwrap();
    c.mkdir("/i/b", 0o755).await.unwrap();
    let a = c.lstat("/i/a").await.unwrap().ino;
    let mut tasks = Vec::new();
    for w in 0..16 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..FILES).step_by(16) {
                let n = FileName::new(format!("f{i}").as_bytes()).unwrap();
                match i % 4 {
                    // Ten bytes at creation.
                    1 => drop(
                        c.create_with_data(a, &n, 0o644, b"0123456789")
                            .await
                            .unwrap(),
                    ),
                    // Ten bytes written after it: the size changes later.
                    2 => {
                        let ino = c.create(a, &n, 0o644, true).await.unwrap().0.ino;
                        c.write(ino, 0, b"abcdefghij").await.unwrap();
                    }
                    _ => drop(c.create(a, &n, 0o644, true).await.unwrap()),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Every path left, with whether its file holds ten bytes.
    let mut want = BTreeSet::new();
    let mut ten_bytes = BTreeSet::new();
    for i in 0..FILES {
        let from = format!("/i/a/f{i}");
        let to = if i % 3 == 0 {
            c.unlink(a, &FileName::new(format!("f{i}").as_bytes()).unwrap())
                .await
                .unwrap();
            continue;
        } else if i % 5 == 0 {
            format!("/i/b/g{i}") // another directory, likely another server
        } else if i % 7 == 0 {
            format!("/i/a/h{i}") // the same directory, a new name
        } else {
            from.clone()
        };
        if to != from {
            c.rename(from.as_str(), to.as_str()).await.unwrap();
        }
        if i % 4 == 1 || i % 4 == 2 {
            ten_bytes.insert(to.clone());
        }
        want.insert(to);
    }
    let by_name = FindQuery {
        name: Some(b"*1*".to_vec()),
        ..FindQuery::default()
    };
    // The same names, of files of ten bytes: the servers test inodes.
    let by_size = FindQuery {
        size: Some(madfs_client::parse_size("10c").unwrap()),
        ..by_name.clone()
    };
    let want: BTreeSet<String> = want
        .into_iter()
        .filter(|p| p.rsplit('/').next().unwrap().contains('1'))
        .collect();
    let want_sized: BTreeSet<String> = want.intersection(&ten_bytes).cloned().collect();
    assert!(
        want.len() > 500 && want_sized.len() > 200,
        "a test of {} names, {} of them sized, proves little",
        want.len(),
        want_sized.len()
    );
    // Both queries, by name and by size, against what is expected.
    let check = |c: Client, when: &'static str| {
        let queries = [
            (by_name.clone(), want.clone()),
            (by_size.clone(), want_sized.clone()),
        ];
        async move {
            for (q, expected) in queries {
                let paths: Vec<String> = c
                    .find("/i", &q)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|f| String::from_utf8(f.path).unwrap())
                    .collect();
                let set: BTreeSet<String> = paths.iter().cloned().collect();
                assert_eq!(set.len(), paths.len(), "a path found twice");
                let what = if q.size.is_some() {
                    "by size"
                } else {
                    "by name"
                };
                same(set, &expected, &format!("{what}, {when}"));
            }
        }
    };
    check(c.clone(), "kept in step with the writes").await;
    assert_eq!(index_builds(&tc), SERVERS, "the index is still in use");

    for i in 0..SERVERS {
        tc.stop(i);
        tc.restart(i);
    }
    assert_eq!(index_builds(&tc), 2 * SERVERS);
    check(tc.client(), "rebuilt at restart").await;

    tc.set_server_args(&["--find-index-mib", "0"]);
    for i in 0..SERVERS {
        tc.stop(i);
        tc.restart(i);
    }
    assert_eq!(index_builds(&tc), 2 * SERVERS, "no index was asked for");
    check(tc.client(), "read from RocksDB").await;
}
