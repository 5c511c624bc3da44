//! Guards the POSIX namespace and data semantics of a 4-server cluster seen
//! through the client library: reads and writes at offsets (across chunk
//! boundaries), sparse files, truncation that never resurrects old data,
//! unlink/mkdir/rmdir/readdir, every kind of rename (same server and cross
//! server: enough names are used that dentries and inodes land on every
//! server), hard links, symlinks, attribute changes, statfs and fsync.

mod common;

use common::{assert_err, names, pattern, TestCluster, CHUNK};
use madfs_client::{
    Client, ErrorCode, FileKind, FileName, InodeId, OpenOptions, TimeSet, Timestamp,
    RENAME_NOREPLACE,
};
use madfs_types::dentry_server;
use std::collections::BTreeSet;

const SERVERS: usize = 4;

fn rw_create() -> OpenOptions {
    OpenOptions::new().read(true).write(true).create(true)
}

/// The server holding the dentry `name` in the directory at `dir`.
async fn dentry_home(c: &Client, dir: &str, name: &str) -> u16 {
    let parent = c.stat(dir).await.unwrap().ino;
    dentry_server(parent, &FileName::new(name.as_bytes()).unwrap(), SERVERS).0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_at_offsets_sparse_files_and_truncation() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();

    // Writes at offsets, with a hole between them.
    let f = c.open("/f", rw_create()).await.unwrap();
    assert_eq!(f.write_at(0, b"hello").await.unwrap(), 5);
    assert_eq!(f.write_at(100, b"world").await.unwrap(), 5);
    let mut want = b"hello".to_vec();
    want.resize(100, 0);
    want.extend_from_slice(b"world");
    assert_eq!(f.read_at(0, 1000).await.unwrap(), want);
    assert_eq!(f.read_at(3, 4).await.unwrap(), b"lo\0\0");
    assert!(f.read_at(105, 10).await.unwrap().is_empty(), "read at EOF");
    // Overwrite in the middle.
    f.write_at(2, b"XY").await.unwrap();
    want[2..4].copy_from_slice(b"XY");
    f.close().await.unwrap();
    assert_eq!(c.read_file("/f").await.unwrap(), want);
    assert_eq!(c.stat("/f").await.unwrap().size, 105);

    // A write spanning chunk boundaries (three chunks), then a partial
    // overwrite straddling one boundary.
    let mut big = pattern(1, 3 * CHUNK as usize);
    let start = CHUNK - 1000;
    let f = c.open("/span", rw_create()).await.unwrap();
    f.write_at(start, &big).await.unwrap();
    let patch = pattern(2, 5000);
    f.write_at(2 * CHUNK - 2500, &patch).await.unwrap();
    let off = (2 * CHUNK - 2500 - start) as usize;
    big[off..off + 5000].copy_from_slice(&patch);
    f.close().await.unwrap();
    let attr = c.stat("/span").await.unwrap();
    assert_eq!(attr.size, start + big.len() as u64);
    let all = c.read_file("/span").await.unwrap();
    assert!(all[..start as usize].iter().all(|&b| b == 0));
    assert!(all[start as usize..] == big[..], "span contents differ");
    // Unaligned read across two boundaries.
    let f = c
        .open("/span", OpenOptions::new().read(true))
        .await
        .unwrap();
    let got = f.read_at(CHUNK - 10, CHUNK as usize + 20).await.unwrap();
    assert!(got[..] == all[(CHUNK - 10) as usize..(2 * CHUNK + 10) as usize]);
    f.close().await.unwrap();

    // Sparse: one write at 5 MiB into an empty file.
    let f = c.open("/sparse", rw_create()).await.unwrap();
    f.write_at(5 << 20, b"tail data").await.unwrap();
    f.close().await.unwrap();
    assert_eq!(c.stat("/sparse").await.unwrap().size, (5 << 20) + 9);
    let data = c.read_file("/sparse").await.unwrap();
    assert_eq!(data.len(), (5 << 20) + 9);
    assert!(
        data[..5 << 20].iter().all(|&b| b == 0),
        "hole must read as zeros"
    );
    assert_eq!(&data[5 << 20..], b"tail data");

    // Truncate shrink then extend: the extension reads zeros, not old data.
    let old = pattern(3, 3 << 20);
    c.write_file("/t", &old).await.unwrap();
    assert_eq!(c.stat("/t").await.unwrap().size, 3 << 20);
    assert_eq!(c.truncate("/t", 10).await.unwrap().size, 10);
    assert_eq!(c.stat("/t").await.unwrap().size, 10);
    assert_eq!(c.read_file("/t").await.unwrap(), &old[..10]);
    assert_eq!(c.truncate("/t", 3 << 20).await.unwrap().size, 3 << 20);
    let data = c.read_file("/t").await.unwrap();
    assert_eq!(data.len(), 3 << 20);
    assert_eq!(&data[..10], &old[..10]);
    let stale = data[10..].iter().position(|&b| b != 0);
    assert_eq!(stale, None, "old data came back after shrink + extend");

    // The same within chunk 0 only (small file).
    c.write_file("/small", &pattern(4, 1000)).await.unwrap();
    c.truncate("/small", 10).await.unwrap();
    c.truncate("/small", 1000).await.unwrap();
    let data = c.read_file("/small").await.unwrap();
    assert_eq!(&data[..10], &pattern(4, 10)[..]);
    assert!(data[10..].iter().all(|&b| b == 0), "small file: stale data");

    // ftruncate through an open handle that wrote beyond chunk 0 but has
    // not published its size yet: the shrink must drop that data too.
    let f = c.open("/ft", rw_create()).await.unwrap();
    f.write_at(0, &pattern(5, 2 << 20)).await.unwrap();
    assert_eq!(f.set_len(100).await.unwrap().size, 100);
    assert_eq!(f.set_len(2 << 20).await.unwrap().size, 2 << 20);
    let data = f.read_at(0, 2 << 20).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(&data[..100], &pattern(5, 100)[..]);
    assert!(data[100..].iter().all(|&b| b == 0), "set_len: stale data");

    // O_TRUNC empties an existing file; append writes at the end.
    let f = c
        .open("/t", OpenOptions::new().write(true).truncate(true))
        .await
        .unwrap();
    f.close().await.unwrap();
    assert_eq!(c.stat("/t").await.unwrap().size, 0);
    let f = c.open("/t", OpenOptions::new().append(true)).await.unwrap();
    f.write_at(0, b"abc").await.unwrap();
    f.write_at(0, b"def").await.unwrap();
    f.close().await.unwrap();
    assert_eq!(c.read_file("/t").await.unwrap(), b"abcdef");
    // Replacing with write_file drops the old, longer contents.
    c.write_file("/span", b"short").await.unwrap();
    assert_eq!(c.read_file("/span").await.unwrap(), b"short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_mkdir_rmdir_and_readdir_across_servers() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/d", 0o755).await.unwrap();
    let want: Vec<String> = (0..200).map(|i| format!("file-{i:03}")).collect();
    let mut homes = BTreeSet::new();
    let mut owners = BTreeSet::new();
    for (i, n) in want.iter().enumerate() {
        c.write_file(format!("/d/{n}"), format!("content {i}").as_bytes())
            .await
            .unwrap();
        homes.insert(dentry_home(&c, "/d", n).await);
        owners.insert(c.stat(format!("/d/{n}")).await.unwrap().ino.owner().0);
    }
    assert_eq!(homes.len(), SERVERS, "dentries must land on every server");
    assert_eq!(
        owners.len(),
        SERVERS,
        "inodes must be owned by every server"
    );

    let listing = c.read_dir("/d").await.unwrap();
    assert_eq!(names(&listing), want, "exact names, sorted");
    assert!(listing.iter().all(|e| e.kind == FileKind::File));
    for e in &listing {
        assert_eq!(c.stat(format!("/d/{}", e.name)).await.unwrap().ino, e.ino);
    }
    assert_eq!(c.stat("/d").await.unwrap().kind, FileKind::Dir);

    // Unlink every other file.
    for n in want.iter().step_by(2) {
        c.remove_file(format!("/d/{n}")).await.unwrap();
    }
    let left: Vec<String> = want.iter().skip(1).step_by(2).cloned().collect();
    assert_eq!(names(&c.read_dir("/d").await.unwrap()), left);
    for n in want.iter().step_by(2) {
        assert_err(
            c.stat(format!("/d/{n}")).await,
            ErrorCode::NotFound,
            libc::ENOENT,
        );
    }
    for (i, n) in want.iter().enumerate().skip(1).step_by(2) {
        let got = c.read_file(format!("/d/{n}")).await.unwrap();
        assert_eq!(got, format!("content {i}").as_bytes());
    }
    // A removed name can be created again.
    c.write_file("/d/file-000", b"again").await.unwrap();
    assert_eq!(c.read_file("/d/file-000").await.unwrap(), b"again");

    // mkdir / rmdir, on names spread over the servers.
    for i in 0..20 {
        c.mkdir(format!("/d/sub{i}"), 0o750).await.unwrap();
        let a = c.stat(format!("/d/sub{i}")).await.unwrap();
        assert_eq!((a.kind, a.perm), (FileKind::Dir, 0o750));
        assert!(c.read_dir(format!("/d/sub{i}")).await.unwrap().is_empty());
    }
    for i in 0..20 {
        c.remove_dir(format!("/d/sub{i}")).await.unwrap();
        assert_err(
            c.stat(format!("/d/sub{i}")).await,
            ErrorCode::NotFound,
            libc::ENOENT,
        );
    }
    // mkdir_all and remove_dir_all.
    c.mkdir_all("/deep/a/b/c", 0o755).await.unwrap();
    c.write_file("/deep/a/b/c/f", b"x").await.unwrap();
    c.mkdir_all("/deep/a/b/c", 0o755).await.unwrap(); // existing: fine
    c.remove_dir_all("/deep").await.unwrap();
    assert_err(c.stat("/deep").await, ErrorCode::NotFound, libc::ENOENT);
    let root: Vec<String> = names(&c.read_dir("/").await.unwrap());
    assert_eq!(root, vec!["d".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_of_every_kind() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/src", 0o755).await.unwrap();
    c.mkdir("/dst", 0o755).await.unwrap();

    // Same directory.
    c.write_file("/src/a", b"AAA").await.unwrap();
    let ino = c.stat("/src/a").await.unwrap().ino;
    c.rename("/src/a", "/src/b").await.unwrap();
    assert_err(c.stat("/src/a").await, ErrorCode::NotFound, libc::ENOENT);
    assert_eq!(
        c.stat("/src/b").await.unwrap().ino,
        ino,
        "inode never moves"
    );
    assert_eq!(c.read_file("/src/b").await.unwrap(), b"AAA");
    c.remove_file("/src/b").await.unwrap();

    // 200 files across directories: many renames change dentry server.
    let n = 200;
    for i in 0..n {
        c.write_file(format!("/src/f{i}"), &pattern(i, 100 + i as usize))
            .await
            .unwrap();
    }
    let mut cross = 0;
    for i in 0..n {
        let (from, to) = (format!("f{i}"), format!("moved-{i}"));
        if dentry_home(&c, "/src", &from).await != dentry_home(&c, "/dst", &to).await {
            cross += 1;
        }
        c.rename(format!("/src/{from}"), format!("/dst/{to}"))
            .await
            .unwrap();
    }
    assert!(cross > n / 2, "only {cross} cross-server renames");
    assert!(c.read_dir("/src").await.unwrap().is_empty());
    let mut want: Vec<String> = (0..n).map(|i| format!("moved-{i}")).collect();
    want.sort();
    assert_eq!(names(&c.read_dir("/dst").await.unwrap()), want);
    for i in 0..n {
        let got = c.read_file(format!("/dst/moved-{i}")).await.unwrap();
        assert!(got == pattern(i, 100 + i as usize), "moved-{i} differs");
        assert_err(
            c.stat(format!("/src/f{i}")).await,
            ErrorCode::NotFound,
            libc::ENOENT,
        );
    }

    // Over an existing file: the target's contents are replaced and its
    // old inode is gone (20 pairs, so both same- and cross-server cases).
    c.mkdir("/over", 0o755).await.unwrap();
    for i in 0..20u64 {
        let (x, y) = (format!("/over/x{i}"), format!("/over/y{i}"));
        c.write_file(&x, &pattern(100 + i, 3000)).await.unwrap();
        c.write_file(&y, &pattern(200 + i, (2 * CHUNK) as usize))
            .await
            .unwrap();
        let x_ino = c.stat(&x).await.unwrap().ino;
        let y_ino = c.stat(&y).await.unwrap().ino;
        c.rename(&x, &y).await.unwrap();
        assert_err(c.stat(&x).await, ErrorCode::NotFound, libc::ENOENT);
        let a = c.stat(&y).await.unwrap();
        assert_eq!((a.ino, a.size, a.nlink), (x_ino, 3000, 1));
        assert_eq!(c.read_file(&y).await.unwrap(), pattern(100 + i, 3000));
        let gone = c.getattr(y_ino).await;
        assert!(
            matches!(&gone, Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale)),
            "replaced inode {y_ino:?} still exists: {gone:?}"
        );
    }
    assert_eq!(c.read_dir("/over").await.unwrap().len(), 20);

    // A non-empty directory tree moves with its contents (several names,
    // so some moves cross servers).
    for i in 0..8 {
        let t = format!("/tree{i}");
        c.mkdir_all(format!("{t}/a/b"), 0o755).await.unwrap();
        c.write_file(format!("{t}/a/b/leaf"), &pattern(i, 5000))
            .await
            .unwrap();
        c.write_file(format!("{t}/top"), b"top").await.unwrap();
        c.rename(&t, format!("/dst/tree-moved-{i}")).await.unwrap();
        assert_err(c.stat(&t).await, ErrorCode::NotFound, libc::ENOENT);
        let m = format!("/dst/tree-moved-{i}");
        assert_eq!(
            c.read_file(format!("{m}/a/b/leaf")).await.unwrap(),
            pattern(i, 5000)
        );
        assert_eq!(c.read_file(format!("{m}/top")).await.unwrap(), b"top");
        assert_eq!(names(&c.read_dir(&m).await.unwrap()), vec!["a", "top"]);
        // The moved directory is fully usable: create and list in it.
        c.write_file(format!("{m}/a/new"), b"n").await.unwrap();
        assert_eq!(
            names(&c.read_dir(format!("{m}/a")).await.unwrap()),
            vec!["b", "new"]
        );
    }

    // A directory over an empty directory; not over a non-empty one.
    for i in 0..6 {
        let (e1, e2) = (format!("/e1-{i}"), format!("/e2-{i}"));
        c.mkdir(&e1, 0o755).await.unwrap();
        c.write_file(format!("{e1}/inside"), b"in").await.unwrap();
        c.mkdir(&e2, 0o700).await.unwrap();
        let e1_ino = c.stat(&e1).await.unwrap().ino;
        c.rename(&e1, &e2).await.unwrap();
        assert_err(c.stat(&e1).await, ErrorCode::NotFound, libc::ENOENT);
        assert_eq!(c.stat(&e2).await.unwrap().ino, e1_ino);
        assert_eq!(c.read_file(format!("{e2}/inside")).await.unwrap(), b"in");
        c.mkdir(&e1, 0o755).await.unwrap();
        assert_err(
            c.rename(&e1, &e2).await,
            ErrorCode::NotEmpty,
            libc::ENOTEMPTY,
        );
        // Kind mismatches.
        c.write_file(format!("/file-{i}"), b"f").await.unwrap();
        assert_err(
            c.rename(format!("/file-{i}"), &e1).await,
            ErrorCode::IsDir,
            libc::EISDIR,
        );
        assert_err(
            c.rename(&e1, format!("/file-{i}")).await,
            ErrorCode::NotDir,
            libc::ENOTDIR,
        );
    }

    // RENAME_NOREPLACE: refused onto an existing name, both left intact.
    for i in 0..10 {
        let (p, q) = (format!("/p{i}"), format!("/q{i}"));
        c.write_file(&p, b"P").await.unwrap();
        c.write_file(&q, b"Q").await.unwrap();
        assert_err(
            c.rename_with_flags(&p, &q, RENAME_NOREPLACE).await,
            ErrorCode::Exists,
            libc::EEXIST,
        );
        assert_eq!(c.read_file(&p).await.unwrap(), b"P");
        assert_eq!(c.read_file(&q).await.unwrap(), b"Q");
        let r = format!("/r{i}");
        c.rename_with_flags(&p, &r, RENAME_NOREPLACE).await.unwrap();
        assert_eq!(c.read_file(&r).await.unwrap(), b"P");
        assert_err(c.stat(&p).await, ErrorCode::NotFound, libc::ENOENT);
    }
    // Renaming a name onto itself is a no-op.
    c.rename("/r0", "/r0").await.unwrap();
    assert_eq!(c.read_file("/r0").await.unwrap(), b"P");
}

/// A directory never moves below itself, also when the request names its
/// directories by inode (as the mount and other clients do): no path is
/// there to check, so the server walks up from the destination by the
/// parents the directories' owners keep, including the parents of
/// directories moved before (their owners learn the new parent from the
/// server of the moved name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_never_moves_below_itself_by_inode() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let name = |s: &str| FileName::new(s.as_bytes()).unwrap();
    let ino = |p: String| {
        let c = c.clone();
        async move { c.stat(&p).await.unwrap().ino }
    };
    // Moving `/TOP` below each directory of `below` is refused.
    let refused = |top: String, below: Vec<String>| {
        let c = c.clone();
        async move {
            for p in below {
                let into = c.stat(&p).await.unwrap().ino;
                assert_err(
                    c.rename_at(InodeId::ROOT, &name(&top), into, &name("loop"), 0)
                        .await,
                    ErrorCode::InvalidArgument,
                    libc::EINVAL,
                );
            }
        }
    };
    let mut crossed = 0;
    for i in 0..8 {
        let (up, side) = (format!("/up{i}"), format!("/side{i}"));
        c.mkdir_all(format!("{up}/a/b/c"), 0o755).await.unwrap();
        c.mkdir(&side, 0o755).await.unwrap();
        c.write_file(format!("{up}/a/b/c/leaf"), b"leaf")
            .await
            .unwrap();
        let root = InodeId::ROOT;
        let below = ["a", "a/b", "a/b/c"].map(|b| format!("{up}/{b}"));
        refused(format!("up{i}"), below.to_vec()).await;
        assert_eq!(
            c.read_file(format!("{up}/a/b/c/leaf")).await.unwrap(),
            b"leaf"
        );
        // Moves that change parents, then checks that walk through them:
        // b goes to side (side/b/c), up goes below c (side/b/c/up/a), and
        // side may then go below neither up nor a.
        let (a, s) = (ino(format!("{up}/a")).await, ino(side.clone()).await);
        if dentry_server(s, &name("b"), SERVERS) != dentry_server(a, &name("b"), SERVERS) {
            crossed += 1;
        }
        c.rename_at(a, &name("b"), s, &name("b"), 0).await.unwrap();
        let c_dir = ino(format!("{side}/b/c")).await;
        c.rename_at(root, &name(&format!("up{i}")), c_dir, &name("up"), 0)
            .await
            .unwrap();
        let below = ["b/c/up", "b/c/up/a", "b"].map(|b| format!("{side}/{b}"));
        refused(format!("side{i}"), below.to_vec()).await;
        assert_eq!(
            c.read_file(format!("{side}/b/c/leaf")).await.unwrap(),
            b"leaf"
        );
        assert_eq!(
            names(&c.read_dir(format!("{side}/b/c/up")).await.unwrap()),
            vec!["a"]
        );
        // Back out again: allowed, and the parents follow.
        c.rename(format!("{side}/b/c/up"), &up).await.unwrap();
        c.rename(&side, format!("{up}/a/side")).await.unwrap();
        refused(format!("up{i}"), vec![format!("{up}/a/side/b/c")]).await;
    }
    assert!(crossed > 0, "no move crossed servers");
}

/// Two clients moving two directories into each other at once: one move
/// wins, the other fails (EINVAL, or ENOENT if its source was gone from
/// its path by then), and both directories stay reachable from the root;
/// before moves were ordered, both could succeed and leave a ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_directories_moved_into_each_other_at_once_keep_a_tree() {
    let tc = TestCluster::start(SERVERS);
    let (c1, c2) = (tc.client(), tc.client());
    for i in 0..24 {
        let (x, y) = (format!("/x{i}"), format!("/y{i}"));
        c1.mkdir(&x, 0o755).await.unwrap();
        c1.mkdir(&y, 0o755).await.unwrap();
        // Both clients know both paths before they race.
        c2.stat(&x).await.unwrap();
        c2.stat(&y).await.unwrap();
        let (a, b) = tokio::join!(
            c1.rename(&x, format!("{y}/x")),
            c2.rename(&y, format!("{x}/y"))
        );
        let a_won = a.is_ok();
        assert!(
            a_won != b.is_ok(),
            "round {i}: exactly one move must win: {a:?}, {b:?}"
        );
        let loser = if a_won {
            b.unwrap_err()
        } else {
            a.unwrap_err()
        };
        assert!(
            matches!(loser.code, ErrorCode::InvalidArgument | ErrorCode::NotFound),
            "round {i}: {loser}"
        );
        // The winner's move, seen by a client that cached nothing.
        let fresh = tc.client();
        let (top, moved, inside) = if a_won {
            (&y, &x, format!("{y}/x"))
        } else {
            (&x, &y, format!("{x}/y"))
        };
        assert_eq!(fresh.stat(top).await.unwrap().kind, FileKind::Dir);
        assert_eq!(fresh.stat(&inside).await.unwrap().kind, FileKind::Dir);
        assert_err(fresh.stat(moved).await, ErrorCode::NotFound, libc::ENOENT);
        assert_eq!(names(&fresh.read_dir(top).await.unwrap()).len(), 1);
    }
}

/// A server that dies in the middle of moving a directory between parents
/// (after its commit, before the directory's owner learned the new parent)
/// holds the cluster's directory-move lock past its lease until its set
/// settled the move: checked against the owner's stale parent, a second
/// move would have closed a ring (`x` into `a`, with `a` already in `x`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_server_died_is_settled_before_the_next_is_checked() {
    mover_dies_in_the_middle_of_a_move(2, 1).await;
}

/// The same where the mover is set 0's server, which keeps the lock: the
/// lock, past its lease after the restart, is handed on once the server
/// itself has settled the move (it once asked itself by a call it could
/// not answer locally, and refused every later move: the replicated
/// simulation, seed 30346).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_of_the_lock_server_that_died_is_settled_after_its_restart() {
    mover_dies_in_the_middle_of_a_move(0, 1).await;
}

/// With replicas the mover's set fails over to its copy, which sends the
/// parent the move owed (its store holds the pending change), and the
/// lock is handed on once the copy answers that the move is settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_server_died_is_settled_by_its_set_after_a_failover() {
    mover_dies_in_the_middle_of_a_move(2, 2).await;
}

/// Moves `a` into `x` through server `mover`, which is killed between its
/// commit and step 4; then moving `x` into `a` must be refused (EINVAL),
/// after EBUSY while the move is not known to be settled.
async fn mover_dies_in_the_middle_of_a_move(mover: usize, replicas: u8) {
    use std::time::{Duration, Instant};
    const LOCK_SERVER: usize = 0;
    let opts = common::Options {
        server_env: vec![("MADFS_TEST_DIR_MOVE_LEASE_MS".into(), "1000".into())],
        server_env_for: vec![(
            mover,
            "MADFS_TEST_DIR_MOVE_FINISH_DELAY_MS".into(),
            "120000".into(),
        )],
        replicas,
        ..Default::default()
    };
    let mut tc = TestCluster::start_with(SERVERS, opts);
    let c = tc.client();
    let name = |s: &str| FileName::new(s.as_bytes()).unwrap();
    let home = |parent: InodeId, n: &str| dentry_server(parent, &name(n), SERVERS).0 as usize;
    let root = InodeId::ROOT;
    // `a`: its name held by mover, its inode owned by another server (made
    // under another name, then renamed), so its parent is sent to it.
    let a_name = (0..)
        .map(|i| format!("ma{i}"))
        .find(|n| home(root, n) == mover)
        .unwrap();
    let made = (0..)
        .map(|i| format!("mb{i}"))
        .find(|n| home(root, n) != mover)
        .unwrap();
    c.mkdir(format!("/{made}"), 0o755).await.unwrap();
    c.rename(format!("/{made}"), format!("/{a_name}"))
        .await
        .unwrap();
    let a = c.stat(format!("/{a_name}")).await.unwrap().ino;
    assert_ne!(a.owner().0 as usize, mover);
    // `x`: its name, and the one it would take in `a`, held by live servers.
    let x_name = (0..)
        .map(|i| format!("mx{i}"))
        .find(|n| home(root, n) != mover && home(a, n) != mover)
        .unwrap();
    c.mkdir(format!("/{x_name}"), 0o755).await.unwrap();

    // Move 1, `a` into `x`: mover commits it, then stops before step 4.
    let first = {
        let (c1, a_name, x_name) = (tc.client(), a_name.clone(), x_name.clone());
        tokio::spawn(async move {
            c1.rename(format!("/{a_name}"), format!("/{x_name}/{a_name}"))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while tc.client().stat(format!("/{a_name}")).await.is_ok() {
        assert!(Instant::now() < deadline, "move 1 was not committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Move 2, `x` into `a` by inode (no path for the client to check).
    let x_file_name = name(&x_name);
    let second = || c.rename_at(root, &x_file_name, a, &x_file_name, 0);
    // Past the lease, while mover is alive and its move under way...
    assert_err(second().await, ErrorCode::Busy, libc::EBUSY);
    // ... and while it is dead.
    tc.kill9(mover);
    first.abort();
    // Without replicas nothing takes its set over until it restarts (and
    // the lock's own server, dead, answers nothing).
    if mover != LOCK_SERVER && replicas == 1 {
        assert_err(second().await, ErrorCode::Busy, libc::EBUSY);
    }
    // Restarted, or failed over to its copy, its set sends the parent the
    // move owed; then move 2 is checked against it and refused.
    if replicas == 1 {
        tc.restart(mover);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match second().await {
            Err(e) if e.code == ErrorCode::Busy && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            r => {
                assert_err(r, ErrorCode::InvalidArgument, libc::EINVAL);
                break;
            }
        }
    }
    let fresh = tc.client();
    let inside = format!("/{x_name}/{a_name}");
    assert_eq!(fresh.stat(&inside).await.unwrap().ino, a);
    assert!(fresh.read_dir(&inside).await.unwrap().is_empty());
    assert_err(
        fresh.stat(format!("/{a_name}")).await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_and_symlinks() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/h", 0o755).await.unwrap();
    c.write_file("/h/orig", b"shared content").await.unwrap();
    let orig = c.stat("/h/orig").await.unwrap();
    assert_eq!(orig.nlink, 1);

    let a = c.hard_link("/h/orig", "/h/link").await.unwrap();
    assert_eq!((a.ino, a.nlink), (orig.ino, 2));
    assert_eq!(c.stat("/h/orig").await.unwrap().nlink, 2);
    assert_eq!(c.stat("/h/link").await.unwrap().nlink, 2);
    assert_eq!(c.stat("/h/link").await.unwrap().ino, orig.ino);
    // Content is shared: a write through one name shows through the other.
    let f = c
        .open("/h/link", OpenOptions::new().write(true))
        .await
        .unwrap();
    f.write_at(0, b"SHARED").await.unwrap();
    f.close().await.unwrap();
    assert_eq!(c.read_file("/h/orig").await.unwrap(), b"SHARED content");
    // Links in other directories and names (spread over servers).
    c.mkdir("/h2", 0o755).await.unwrap();
    for i in 0..10 {
        c.hard_link("/h/orig", format!("/h2/l{i}")).await.unwrap();
    }
    assert_eq!(c.stat("/h/orig").await.unwrap().nlink, 12);
    for i in 0..10 {
        c.remove_file(format!("/h2/l{i}")).await.unwrap();
    }
    assert_eq!(c.stat("/h/orig").await.unwrap().nlink, 2);
    // Unlinking one name keeps the other.
    c.remove_file("/h/orig").await.unwrap();
    let l = c.stat("/h/link").await.unwrap();
    assert_eq!((l.ino, l.nlink), (orig.ino, 1));
    assert_eq!(c.read_file("/h/link").await.unwrap(), b"SHARED content");
    assert_err(c.stat("/h/orig").await, ErrorCode::NotFound, libc::ENOENT);
    // A hard link to a directory is refused; onto an existing name too.
    assert_err(
        c.hard_link("/h", "/hdir").await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );
    c.write_file("/h/other", b"o").await.unwrap();
    assert_err(
        c.hard_link("/h/link", "/h/other").await,
        ErrorCode::Exists,
        libc::EEXIST,
    );

    // Symlinks: absolute and relative targets.
    c.symlink("/h/link", "/h/sym").await.unwrap();
    c.symlink("link", "/h/rel").await.unwrap();
    assert_eq!(c.read_link("/h/sym").await.unwrap(), b"/h/link");
    assert_eq!(c.read_link("/h/rel").await.unwrap(), b"link");
    for s in ["/h/sym", "/h/rel"] {
        let st = c.stat(s).await.unwrap();
        assert_eq!((st.kind, st.ino), (FileKind::File, orig.ino), "{s}");
        let ls = c.lstat(s).await.unwrap();
        assert_eq!(ls.kind, FileKind::Symlink, "{s}");
        assert_ne!(ls.ino, orig.ino);
        assert_eq!(c.read_file(s).await.unwrap(), b"SHARED content");
    }
    assert_eq!(
        c.lstat("/h/sym").await.unwrap().size,
        b"/h/link".len() as u64
    );
    // A symlink to a directory is followed in the middle of a path.
    c.symlink("/h", "/hs").await.unwrap();
    assert_eq!(c.read_file("/hs/link").await.unwrap(), b"SHARED content");
    assert_eq!(
        names(&c.read_dir("/hs").await.unwrap()),
        vec!["link", "other", "rel", "sym"]
    );
    // read_link of a non-symlink is EINVAL.
    assert_err(
        c.read_link("/h/link").await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );
    // Dangling: stat fails, lstat works.
    c.symlink("/nowhere", "/h/dangling").await.unwrap();
    assert_err(
        c.stat("/h/dangling").await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_eq!(
        c.lstat("/h/dangling").await.unwrap().kind,
        FileKind::Symlink
    );
    // Loops: ELOOP, for a pair and for a self-loop.
    c.symlink("/h/loop2", "/h/loop1").await.unwrap();
    c.symlink("/h/loop1", "/h/loop2").await.unwrap();
    c.symlink("self", "/h/self").await.unwrap();
    assert_err(c.stat("/h/loop1").await, ErrorCode::Loop, libc::ELOOP);
    assert_err(c.stat("/h/self").await, ErrorCode::Loop, libc::ELOOP);
    assert_err(
        c.open("/h/loop1/x", OpenOptions::new().read(true)).await,
        ErrorCode::Loop,
        libc::ELOOP,
    );
    assert_eq!(c.lstat("/h/loop1").await.unwrap().kind, FileKind::Symlink);
    // Removing a symlink removes the link, not its target.
    c.remove_file("/h/sym").await.unwrap();
    assert_eq!(c.read_file("/h/link").await.unwrap(), b"SHARED content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_statfs_and_fsync() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.write_file("/a", b"attrs").await.unwrap();
    c.mkdir("/dir", 0o755).await.unwrap();

    // chmod
    assert_eq!(c.set_permissions("/a", 0o600).await.unwrap().perm, 0o600);
    assert_eq!(c.stat("/a").await.unwrap().perm, 0o600);
    assert_eq!(c.stat("/a").await.unwrap().mode(), 0o100600);
    c.set_permissions("/dir", 0o1777).await.unwrap();
    assert_eq!(c.stat("/dir").await.unwrap().mode(), 0o041777);

    // chown, both ids and one at a time
    let a = c.chown("/a", Some(1234), Some(5678)).await.unwrap();
    assert_eq!((a.uid, a.gid), (1234, 5678));
    c.chown("/a", None, Some(42)).await.unwrap();
    let a = c.stat("/a").await.unwrap();
    assert_eq!((a.uid, a.gid), (1234, 42));

    // utimens with exact values; ctime moves on every change
    let t1 = Timestamp {
        secs: 1_000_000_000,
        nanos: 123_456_789,
    };
    let t2 = Timestamp {
        secs: 1_500_000_000,
        nanos: 987_654_321,
    };
    c.set_times("/a", TimeSet::At(t1), TimeSet::At(t2))
        .await
        .unwrap();
    let a = c.stat("/a").await.unwrap();
    assert_eq!((a.atime, a.mtime), (t1, t2));
    // Omit leaves a time alone; Now sets it to about now.
    let before = Timestamp::now();
    c.set_times("/a", TimeSet::Omit, TimeSet::Now)
        .await
        .unwrap();
    let a = c.stat("/a").await.unwrap();
    assert_eq!(a.atime, t1);
    assert!(
        a.mtime.secs >= before.secs - 5 && a.mtime.secs <= Timestamp::now().secs + 5,
        "mtime {:?} is not about now",
        a.mtime
    );
    assert!(a.ctime.secs >= before.secs - 5);
    // Through a symlink, the target's times change.
    c.symlink("/a", "/s").await.unwrap();
    c.set_times("/s", TimeSet::At(t2), TimeSet::At(t1))
        .await
        .unwrap();
    let a = c.stat("/a").await.unwrap();
    assert_eq!((a.atime, a.mtime), (t2, t1));
    // A write moves mtime forward.
    c.write_file("/a", b"new").await.unwrap();
    assert!(c.stat("/a").await.unwrap().mtime > t1);

    // statfs: inodes and data summed over the servers, space as writes
    // can use it.
    for i in 0..20 {
        c.write_file(format!("/dir/f{i}"), &pattern(i, 300_000))
            .await
            .unwrap();
    }
    let total = c.statfs().await.unwrap();
    let per: Vec<_> = c
        .server_stats()
        .await
        .into_iter()
        .map(|(id, r)| r.unwrap_or_else(|e| panic!("server {id}: {e}")))
        .collect();
    assert_eq!(per.len(), SERVERS);
    let sum = |f: fn(&madfs_client::FsStats) -> u64| per.iter().map(f).sum::<u64>();
    // The servers share one disk: it counts once (before, statfs said the
    // file system had four times the disk).
    assert!(per[0].disk != 0 && per.iter().all(|s| s.disk == per[0].disk));
    assert_eq!(total.bytes_total, per[0].bytes_total);
    assert!(total.bytes_avail <= per[0].bytes_avail - per[0].bytes_reserved);
    assert_eq!(total.inodes, sum(|s| s.inodes));
    assert_eq!(total.data_bytes, sum(|s| s.data_bytes));
    assert!(total.bytes_total > 0 && total.bytes_avail <= total.bytes_total);
    assert!(total.bytes_free <= total.bytes_total);
    // root, /a, /dir, /s, 20 files
    assert!(total.inodes >= 24, "inodes {}", total.inodes);
    assert!(
        total.data_bytes >= 20 * 300_000,
        "data_bytes {}",
        total.data_bytes
    );

    // fsync after writes in several chunks; then the data is all there.
    let f = c
        .open(
            "/synced",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .await
        .unwrap();
    let data = pattern(77, (3 * CHUNK + 17) as usize);
    f.write_at(0, &data).await.unwrap();
    f.fsync().await.unwrap();
    assert!(f.dirty_servers().is_empty());
    assert!(!f.needs_size_update());
    assert_eq!(c.stat("/synced").await.unwrap().size, data.len() as u64);
    f.fsync().await.unwrap(); // nothing to do: still fine
    f.close().await.unwrap();
    assert!(c.read_file("/synced").await.unwrap() == data);
    // Directories and the root have sensible attributes.
    let root = c.stat("/").await.unwrap();
    assert_eq!((root.ino, root.kind), (InodeId::ROOT, FileKind::Dir));
    assert!(root.nlink >= 2);
}

/// Extending a file by writing past a shrunken end must expose zeros, not
/// the bytes the shrink cut off (inline chunk 0 and chunk files alike), and
/// files move between inline and chunk-file storage without losing bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_after_shrink_and_inline_transitions() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    for (name, len) in [
        ("/inline", 1000usize),
        ("/edge", 64 * 1024),
        ("/chunked", (3 * CHUNK) as usize),
    ] {
        let old = pattern(len as u64, len);
        c.write_file(name, &old).await.unwrap();
        c.truncate(name, 10).await.unwrap();
        let f = c.open(name, OpenOptions::new().write(true)).await.unwrap();
        f.write_at(len as u64 - 1, b"Z").await.unwrap();
        f.close().await.unwrap();
        let data = c.read_file(name).await.unwrap();
        assert_eq!(data.len(), len, "{name}");
        assert_eq!(&data[..10], &old[..10], "{name}");
        assert_eq!(data[len - 1], b'Z', "{name}");
        let stale = data[10..len - 1].iter().position(|&b| b != 0);
        assert_eq!(stale, None, "{name}: cut-off bytes came back at 10+offset");
    }

    // Inline grows into a chunk file through writes at and past the limit.
    let f = c.open("/grow", rw_create()).await.unwrap();
    let mut want = pattern(9, 60_000);
    f.write_at(0, &want).await.unwrap();
    let more = pattern(10, 10_000);
    f.write_at(60_000, &more).await.unwrap();
    want.extend_from_slice(&more);
    f.write_at(200_000, b"far").await.unwrap();
    want.resize(200_000, 0);
    want.extend_from_slice(b"far");
    f.close().await.unwrap();
    assert!(c.read_file("/grow").await.unwrap() == want);
    // And back down below the inline limit, then up again.
    c.truncate("/grow", 100).await.unwrap();
    c.truncate("/grow", 70_000).await.unwrap();
    let data = c.read_file("/grow").await.unwrap();
    assert_eq!(&data[..100], &want[..100]);
    assert!(data[100..].iter().all(|&b| b == 0), "stale after regrow");

    // O_TRUNC, then a write far out: the old chunks must be gone.
    c.write_file("/otrunc", &pattern(11, (3 * CHUNK) as usize))
        .await
        .unwrap();
    let f = c
        .open("/otrunc", OpenOptions::new().write(true).truncate(true))
        .await
        .unwrap();
    f.write_at(2 * CHUNK + CHUNK / 2, b"end").await.unwrap();
    f.close().await.unwrap();
    let data = c.read_file("/otrunc").await.unwrap();
    assert_eq!(data.len() as u64, 2 * CHUNK + CHUNK / 2 + 3);
    let stale = data[..data.len() - 3].iter().position(|&b| b != 0);
    assert_eq!(stale, None, "O_TRUNC left old data behind");
}

/// Freed files give their space back on every server: unlink, rename over,
/// truncate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn space_is_reclaimed() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let used = || async {
        c.server_stats()
            .await
            .into_iter()
            .map(|(_, r)| r.unwrap().data_bytes)
            .sum::<u64>()
    };
    let base = used().await;
    let size = (4 * CHUNK) as usize;
    for i in 0..4 {
        c.write_file(format!("/big{i}"), &pattern(i, size))
            .await
            .unwrap();
    }
    // A hard-linked file, whose second name keeps it alive.
    c.hard_link("/big3", "/big3-link").await.unwrap();
    let full = used().await;
    assert!(full >= base + 4 * size as u64, "{base} -> {full}");

    c.remove_file("/big0").await.unwrap();
    c.write_file("/small", b"small").await.unwrap();
    c.rename("/small", "/big1").await.unwrap();
    c.truncate("/big2", 0).await.unwrap();
    c.remove_file("/big3").await.unwrap();
    // Only /big3-link (4 chunks) and 5 bytes are still stored.
    let want = base + size as u64 + 5;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = used().await;
        if now <= want + 4096 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "space not reclaimed: {now} bytes stored, want about {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(c.read_file("/big3-link").await.unwrap() == pattern(3, size));
}

/// Renaming one hard link onto another of the same inode does nothing
/// (both names stay, as POSIX says); RENAME_EXCHANGE swaps two names held by
/// one server; symlink chains resolve up to 40 links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_between_links_exchange_and_symlink_chains() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/l", 0o755).await.unwrap();
    for i in 0..8 {
        let (a, b) = (format!("/l/a{i}"), format!("/l/b{i}"));
        c.write_file(&a, b"same").await.unwrap();
        c.hard_link(&a, &b).await.unwrap();
        c.rename(&a, &b).await.unwrap();
        assert_eq!(c.stat(&a).await.unwrap().nlink, 2, "{a} must remain");
        assert_eq!(c.stat(&b).await.unwrap().nlink, 2);
        assert_eq!(c.read_dir("/l").await.unwrap().len(), 2 * (i + 1));
    }

    // Two names in one directory on the same server, and two on different.
    let dir = c.stat("/l").await.unwrap().ino;
    let home = |n: &str| dentry_server(dir, &FileName::new(n.as_bytes()).unwrap(), SERVERS);
    let names: Vec<String> = (0..64).map(|i| format!("x{i}")).collect();
    let first = &names[0];
    let same = names[1..].iter().find(|n| home(n) == home(first)).unwrap();
    let other = names[1..].iter().find(|n| home(n) != home(first)).unwrap();
    for n in [first, same, other] {
        c.write_file(format!("/l/{n}"), n.as_bytes()).await.unwrap();
    }
    c.rename_with_flags(
        format!("/l/{first}"),
        format!("/l/{same}"),
        madfs_client::RENAME_EXCHANGE,
    )
    .await
    .unwrap();
    assert_eq!(
        c.read_file(format!("/l/{first}")).await.unwrap(),
        same.as_bytes()
    );
    assert_eq!(
        c.read_file(format!("/l/{same}")).await.unwrap(),
        first.as_bytes()
    );
    // Documented gap: across two servers it is ENOTSUP, and nothing moves.
    assert_err(
        c.rename_with_flags(
            format!("/l/{first}"),
            format!("/l/{other}"),
            madfs_client::RENAME_EXCHANGE,
        )
        .await,
        ErrorCode::NotSupported,
        libc::ENOTSUP,
    );
    assert_eq!(
        c.read_file(format!("/l/{other}")).await.unwrap(),
        other.as_bytes()
    );

    // A chain of 40 symlinks resolves; 41 is ELOOP.
    c.write_file("/l/end", b"end of chain").await.unwrap();
    c.symlink("/l/end", "/l/s0").await.unwrap();
    for i in 1..=40 {
        c.symlink(format!("/l/s{}", i - 1), format!("/l/s{i}"))
            .await
            .unwrap();
    }
    assert_eq!(c.read_file("/l/s39").await.unwrap(), b"end of chain");
    assert_err(c.stat("/l/s40").await, ErrorCode::Loop, libc::ELOOP);
    // Symlink target length limits.
    let long_target = "t".repeat(4095);
    c.symlink(long_target.as_str(), "/l/longest").await.unwrap();
    assert_eq!(
        c.read_link("/l/longest").await.unwrap(),
        long_target.as_bytes()
    );
    assert_err(
        c.symlink("t".repeat(4096).as_str(), "/l/too-long").await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );
}

/// FIFOs, sockets and device nodes through the library: made by mknod
/// with their type (and a device's number), listed with their type, found
/// by `madfs find -type`, never opened (ENXIO: no kernel to connect their
/// users), refused as devices to anyone but root (EPERM, the servers'
/// check: Linux asks CAP_MKNOD), and renamed, linked, changed and removed
/// as any file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_keep_their_type_and_device_number() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/s", 0o777).await.unwrap();
    let chr = madfs_types::Attr::make_rdev(136, 300).unwrap();
    let cases = [
        ("/s/fifo", FileKind::Fifo, 0),
        ("/s/sock", FileKind::Socket, 0),
        ("/s/chr", FileKind::CharDev, chr),
        ("/s/blk", FileKind::BlockDev, 0x801),
    ];
    for (path, kind, rdev) in cases {
        let a = c.mknod(path, kind, 0o640, rdev).await.unwrap();
        assert_eq!((a.kind, a.perm, a.rdev, a.size), (kind, 0o640, rdev, 0));
        let a = c.lstat(path).await.unwrap();
        assert_eq!((a.kind, a.rdev), (kind, rdev), "{path}");
        assert_eq!(a.mode() & 0o170000, kind.mode_bits());
        assert_err(
            c.mknod(path, kind, 0o640, rdev).await,
            ErrorCode::Exists,
            libc::EEXIST,
        );
        assert_err(
            c.open(path, OpenOptions::new().read(true)).await,
            ErrorCode::NoDevice,
            libc::ENXIO,
        );
    }
    // FIFOs and sockets have no device number, whatever the caller sent.
    let a = c
        .mknod("/s/fifo2", FileKind::Fifo, 0o600, 77)
        .await
        .unwrap();
    assert_eq!(a.rdev, 0);
    // Directories and symlinks are not made this way.
    assert_err(
        c.mknod("/s/dir", FileKind::Dir, 0o755, 0).await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );
    // Listing and find report the types.
    let mut listed: Vec<(String, FileKind)> = c
        .read_dir("/s")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name.to_string_lossy(), e.kind))
        .collect();
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        listed,
        vec![
            ("blk".to_string(), FileKind::BlockDev),
            ("chr".to_string(), FileKind::CharDev),
            ("fifo".to_string(), FileKind::Fifo),
            ("fifo2".to_string(), FileKind::Fifo),
            ("sock".to_string(), FileKind::Socket),
        ]
    );
    for (t, want) in [
        ("p", "/s/fifo\n/s/fifo2\n"),
        ("s", "/s/sock\n"),
        ("c", "/s/chr\n"),
        ("b", "/s/blk\n"),
    ] {
        assert_eq!(tc.madfs_ok(["find", "/s", "-type", t]), want, "-type {t}");
    }
    // The CLI makes and shows them too.
    tc.madfs_ok(["mknod", "-m", "600", "/s/cli-chr", "c", "4", "64"]);
    let stat = tc.madfs_ok(["stat", "/s/cli-chr"]);
    assert!(stat.contains("character special file"), "{stat}");
    assert!(stat.contains("Device type: 4,64"), "{stat}");
    assert!(tc.madfs_ok(["ls", "-l", "/s"]).contains("crw------- "));
    tc.madfs_ok(["mknod", "/s/cli-fifo", "p"]);
    assert_eq!(c.lstat("/s/cli-fifo").await.unwrap().kind, FileKind::Fifo);

    // Devices are root's to make; FIFOs and sockets anyone's.
    let user = c.with_credentials(madfs_types::Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    });
    for kind in [FileKind::CharDev, FileKind::BlockDev] {
        assert_err(
            user.mknod("/s/user-dev", kind, 0o600, chr).await,
            ErrorCode::NotPermitted,
            libc::EPERM,
        );
    }
    assert!(!c.exists("/s/user-dev").await.unwrap());
    let a = user
        .mknod("/s/user-fifo", FileKind::Fifo, 0o600, 0)
        .await
        .unwrap();
    assert_eq!((a.uid, a.kind), (1000, FileKind::Fifo));
    // Truncating one is EINVAL, as truncate(2) of anything but a file.
    assert_err(
        c.truncate("/s/fifo", 0).await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );

    // Rename (on one server and across), link, chmod, chown, utimens and
    // unlink work as on any file and keep type and number.
    for i in 0..8 {
        let to = format!("/s/chr-moved-{i}");
        let from = if i == 0 {
            "/s/chr".to_string()
        } else {
            format!("/s/chr-moved-{}", i - 1)
        };
        c.rename(from.as_str(), to.as_str()).await.unwrap();
    }
    let a = c.lstat("/s/chr-moved-7").await.unwrap();
    assert_eq!((a.kind, a.rdev), (FileKind::CharDev, chr));
    c.hard_link("/s/fifo", "/s/fifo-link").await.unwrap();
    assert_eq!(c.lstat("/s/fifo").await.unwrap().nlink, 2);
    c.set_permissions("/s/sock", 0o604).await.unwrap();
    c.chown("/s/sock", Some(65534), Some(65534)).await.unwrap();
    let t = Timestamp {
        secs: 1_200_000_000,
        nanos: 5,
    };
    c.set_times("/s/sock", TimeSet::At(t), TimeSet::At(t))
        .await
        .unwrap();
    let a = c.lstat("/s/sock").await.unwrap();
    assert_eq!(
        (a.kind, a.perm, a.uid, a.mtime),
        (FileKind::Socket, 0o604, 65534, t)
    );
    for p in [
        "/s/fifo",
        "/s/fifo-link",
        "/s/fifo2",
        "/s/sock",
        "/s/chr-moved-7",
        "/s/blk",
        "/s/cli-chr",
        "/s/cli-fifo",
        "/s/user-fifo",
    ] {
        c.remove_file(p).await.unwrap();
    }
    assert!(c.read_dir("/s").await.unwrap().is_empty());
}

/// A handle keeps the access granted at its open: a user who creates a
/// file with mode 0 writes and truncates it through that handle (the
/// owner skips the mode check for a size change through a writable
/// handle), while truncate by path still meets the mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_handle_truncates_whatever_the_mode() {
    let tc = TestCluster::start(SERVERS);
    let root = tc.client();
    root.mkdir("/pub", 0o777).await.unwrap();
    let user = root.with_credentials(madfs_types::Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    });
    let f = user
        .open("/pub/mode0", rw_create().exclusive(true).perm(0))
        .await
        .unwrap();
    f.write_at(0, b"abcdef").await.unwrap();
    f.set_len(3).await.unwrap();
    f.close().await.unwrap();
    let a = root.stat("/pub/mode0").await.unwrap();
    assert_eq!((a.perm, a.size, a.uid), (0, 3, 1000));
    assert_err(
        user.truncate("/pub/mode0", 1).await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_err(
        user.open("/pub/mode0", OpenOptions::new().write(true))
            .await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_eq!(root.read_file("/pub/mode0").await.unwrap(), b"abc");
}

/// A request that must run once (create, mkdir, unlink, rmdir, rename,
/// link) sent again with the same id, as the pools send it after a
/// failover or a lost reply, gets the reply of its first run and is not
/// run again: not even once another client removed what it made (run
/// again, a mkdir would make the directory a second time, and a
/// concurrent rmdir that answered ok would seem undone: the replicated
/// simulation's seed 2391). Only a send marked as a resend is looked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_again_with_its_id_runs_once() {
    use madfs_proto::message::{Op, Reply};
    use madfs_proto::{Request, RunOnce};
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let cfg = tc.config().clone();
    let pool = madfs_rpc::Pool::new(
        &cfg,
        common::key_of(&tc),
        madfs_proto::auth::Role::Client,
        madfs_rpc::pool::Timeouts::default(),
    );
    let name = FileName::new(b"once").unwrap();
    let home = dentry_server(InodeId::ROOT, &name, SERVERS);
    let mkdir = Request {
        creds: madfs_types::Credentials::root(),
        op: Op::Create {
            parent: InodeId::ROOT,
            name: name.clone(),
            kind: FileKind::Dir,
            perm: 0o755,
            exclusive: true,
            symlink_target: Vec::new(),
        },
        once: Some(RunOnce::first(madfs_types::next_op_id())),
    };
    let first = pool.call(home, &mkdir, &[]).await.unwrap().reply;
    let Reply::Created { entry, .. } = &first else {
        panic!("mkdir answered {first:?}");
    };
    // A first send is not looked up (only a resend may have run before):
    // the same id not marked as sent again runs, and finds the directory.
    match pool.call(home, &mkdir, &[]).await {
        Err(madfs_rpc::RpcError::Remote(e)) if e.code == ErrorCode::Exists => {}
        other => panic!("a first send with a known id answered {other:?}"),
    }
    // Sent again: the same directory, not EEXIST.
    let mkdir = mkdir.resent();
    match pool.call(home, &mkdir, &[]).await.unwrap().reply {
        Reply::Created { entry: again, .. } => assert_eq!(again.ino, entry.ino),
        other => panic!("the retry answered {other:?}"),
    }
    // Another client removes it; the retry still does not make it again.
    c.remove_dir("/once").await.unwrap();
    match pool.call(home, &mkdir, &[]).await.unwrap().reply {
        Reply::Created { entry: again, .. } => assert_eq!(again.ino, entry.ino),
        other => panic!("the retry after the rmdir answered {other:?}"),
    }
    assert_err(c.stat("/once").await, ErrorCode::NotFound, libc::ENOENT);
    // A new request (a new id) does make it.
    let fresh = Request {
        once: Some(RunOnce::first(madfs_types::next_op_id())),
        ..mkdir.clone()
    };
    assert!(matches!(
        pool.call(home, &fresh, &[]).await.unwrap().reply,
        Reply::Created { .. }
    ));
    // (A new client: `c` remembers for a second that /once was removed.)
    assert_eq!(tc.client().stat("/once").await.unwrap().kind, FileKind::Dir);

    // An unlink sent again answers as the first time, not ENOENT.
    c.write_file("/gone", b"x").await.unwrap();
    let gone = FileName::new(b"gone").unwrap();
    let unlink = Request {
        creds: madfs_types::Credentials::root(),
        op: Op::Remove {
            parent: InodeId::ROOT,
            name: gone.clone(),
            dir: false,
            hold: Default::default(),
        },
        once: Some(RunOnce::first(madfs_types::next_op_id())),
    };
    let at = dentry_server(InodeId::ROOT, &gone, SERVERS);
    let first = pool.call(at, &unlink, &[]).await.unwrap().reply;
    assert!(matches!(first, Reply::Removed { .. }), "{first:?}");
    let again = pool.call(at, &unlink.resent(), &[]).await.unwrap().reply;
    assert!(matches!(again, Reply::Removed { .. }), "{again:?}");
}

/// A name removed here while the server that owns its inode is down (an
/// unlink of a second name, and a rename over one) still takes its link
/// from the inode once that server is back: the drop is recorded with the
/// removal and sent again until the owner answers. Before, the call
/// failed, the name was gone and the link count stayed one too high for
/// good (a file whose names are all gone was never freed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_dropped_while_its_owner_is_down_goes_when_it_is_back() {
    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let root_owner = InodeId::ROOT.owner();
    // Two files whose inodes live on one server other than the root's.
    let mut owned = Vec::new();
    for i in 0..64 {
        let path = format!("/ld-f{i}");
        c.write_file(&path, b"kept").await.unwrap();
        let ino = c.stat(&path).await.unwrap().ino;
        owned.push((path, ino));
    }
    let owner = owned
        .iter()
        .map(|(_, ino)| ino.owner())
        .find(|o| *o != root_owner && owned.iter().filter(|(_, i)| i.owner() == *o).count() >= 2)
        .expect("two files owned by a server other than the root's");
    let mut mine = owned.iter().filter(|(_, i)| i.owner() == owner);
    let (unlinked, renamed) = (mine.next().unwrap(), mine.next().unwrap());
    // Names held by a live server: a second name of each file, and a file
    // to rename over the second one.
    let elsewhere = |n: &str| {
        dentry_server(
            InodeId::ROOT,
            &FileName::new(n.as_bytes()).unwrap(),
            SERVERS,
        ) != owner
    };
    let mut names = (0..).map(|j| format!("ld-n{j}")).filter(|n| elsewhere(n));
    let (link_a, link_b, src) = (
        format!("/{}", names.next().unwrap()),
        format!("/{}", names.next().unwrap()),
        format!("/{}", names.next().unwrap()),
    );
    c.hard_link(&unlinked.0, &link_a).await.unwrap();
    c.hard_link(&renamed.0, &link_b).await.unwrap();
    c.write_file(&src, b"moved").await.unwrap();
    assert_eq!(c.stat(&unlinked.0).await.unwrap().nlink, 2);

    tc.kill9(owner.0 as usize);
    c.remove_file(&link_a).await.unwrap();
    c.rename(&src, &link_b).await.unwrap();
    tc.restart(owner.0 as usize);

    // The owner's counts come down once it answers the drops again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let fresh = tc.client();
        let a = fresh.stat(&unlinked.0).await.unwrap().nlink;
        let b = fresh.stat(&renamed.0).await.unwrap().nlink;
        if (a, b) == (1, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "link counts {a} and {b} after the owner came back, 1 and 1 expected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let fresh = tc.client();
    assert_eq!(fresh.read_file(&unlinked.0).await.unwrap(), b"kept");
    assert_eq!(fresh.read_file(&renamed.0).await.unwrap(), b"kept");
    assert_eq!(fresh.read_file(&link_b).await.unwrap(), b"moved");
    assert_err(fresh.stat(&link_a).await, ErrorCode::NotFound, libc::ENOENT);
    assert_err(fresh.stat(&src).await, ErrorCode::NotFound, libc::ENOENT);
}
