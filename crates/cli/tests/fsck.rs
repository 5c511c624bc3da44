//! `madfs fsck` on inodes, on a 4-server cluster: every inode's link count
//! against the names that reach it. A link drop lost on its way to the
//! inode's owner (the test fault `MADFS_FAULT_LOSE_LINK_DROPS`, as a drop
//! unanswered for 9 minutes is given up) leaves a count above the names,
//! or an inode no name reaches, holding its chunks for good. fsck must
//! name exactly those, `--repair` set the counts to the names, give a
//! leaked inode that holds data a name in /lost+found and free an empty
//! one, and leave every live file as it was. The owner's side (`Op::ListInodes`, `Op::FixFileLinks`) is driven
//! with raw requests: root only, a compare-and-set on the count.

mod common;

use common::{ask_raw, Options, TestCluster};
use madfs_client::{CacheConfig, Credentials, ErrorCode, FileName, Repair};
use madfs_proto::message::{InodeLinks, Op, Reply};
use madfs_types::{dentry_server, InodeId};
use std::path::Path;
use std::time::{Duration, Instant};

const SERVERS: usize = 4;

/// A name in directory `dir` (inode `dir_ino`) whose entry lives on a
/// server other than `owner`: a name that reaches a remote inode.
fn remote_name(dir_ino: InodeId, owner: madfs_types::ServerId, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| dentry_server(dir_ino, &FileName::new(n.as_bytes()).unwrap(), SERVERS) != owner)
        .expect("some name lives elsewhere")
}

/// Whether any server's data directory holds chunk files of `ino`.
fn has_chunk_dir(tc: &TestCluster, ino: InodeId) -> bool {
    let name = format!("{:016x}", ino.0);
    tc.config().servers.iter().any(|s| {
        let chunks = s.data_dir.join("chunks");
        std::fs::read_dir(&chunks)
            .into_iter()
            .flatten()
            .flatten()
            .any(|spread| Path::new(&spread.path()).join(&name).exists())
    })
}

/// A cluster whose servers all run with the test fault `name` set.
fn cluster_with_fault(name: &str) -> TestCluster {
    TestCluster::start_with(
        SERVERS,
        Options {
            server_env: vec![(name.into(), "1".into())],
            ..Options::default()
        },
    )
}

fn contents(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_frees_the_inodes_lost_link_drops_leaked_and_sets_counts_to_the_names() {
    let tc = cluster_with_fault("MADFS_FAULT_LOSE_LINK_DROPS");
    let c = tc.client();
    c.mkdir("/a", 0o755).await.unwrap();
    let b = c.mkdir("/b", 0o755).await.unwrap();
    // Past the inline size: chunk files to purge.
    let big = 100 << 10;
    let mut files = Vec::new();
    for (i, name) in ["high", "leaked", "linked", "plain", "void"]
        .iter()
        .enumerate()
    {
        let path = format!("/a/{name}");
        let data = if *name == "void" {
            Vec::new()
        } else {
            contents(i as u8, big)
        };
        c.write_file(path.as_str(), &data).await.unwrap();
        let attr = c.stat(path.as_str()).await.unwrap();
        files.push((path, attr.ino, data));
    }
    let (high, leaked, linked, void) = (files[0].1, files[1].1, files[2].1, files[4].1);
    // A second name elsewhere, removed: its drop is lost, the count stays 2.
    let extra = format!("/b/{}", remote_name(b.ino, high.owner(), "h"));
    c.hard_link("/a/high", extra.as_str()).await.unwrap();
    c.remove_file(extra.as_str()).await.unwrap();
    // Moved to a name elsewhere, then removed: no name reaches it.
    let moved = format!("/b/{}", remote_name(b.ino, leaked.owner(), "l"));
    c.rename("/a/leaked", moved.as_str()).await.unwrap();
    c.remove_file(moved.as_str()).await.unwrap();
    // The same, empty: nothing to keep.
    let moved_void = format!("/b/{}", remote_name(b.ino, void.owner(), "v"));
    c.rename("/a/void", moved_void.as_str()).await.unwrap();
    c.remove_file(moved_void.as_str()).await.unwrap();
    // A healthy second name elsewhere: nothing to report.
    let second = format!("/b/{}", remote_name(b.ino, linked.owner(), "k"));
    c.hard_link("/a/linked", second.as_str()).await.unwrap();

    let fresh = || tc.client().with_cache(CacheConfig::off());
    assert_eq!(fresh().getattr(high).await.unwrap().nlink, 2);
    assert_eq!(fresh().getattr(leaked).await.unwrap().nlink, 1);
    assert!(has_chunk_dir(&tc, leaked));

    let check = c.check_inode_links(false).await.unwrap();
    let found: Vec<(InodeId, u32, u32)> = check
        .wrong
        .iter()
        .map(|w| (w.ino, w.nlink, w.names))
        .collect();
    let mut want = vec![(high, 2, 1), (leaked, 1, 0), (void, 1, 0)];
    want.sort();
    assert_eq!(found, want, "{check:?}");
    assert!(check.unreached_dirs.is_empty() && check.dangling.is_empty());
    assert!(check.missing_dirs.is_empty(), "{check:?}");
    // Root, /a, /b and the five files.
    assert_eq!(check.inodes, 8, "{check:?}");

    let out = tc.madfs(["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "inode {high} (File): link count 2, 1 name (/a/high)\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "inode {leaked} (File): link count 1, no name reaches it (leaked, {big} bytes)\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "inode {void} (File): link count 1, no name reaches it (leaked)\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "3 with a wrong link count, 0 directories no name reaches, 0 names without their \
             inode, 0 directories gone with names in them; 0 repaired"
        ),
        "{text}"
    );

    let text = tc.madfs_ok(["fsck", "--repair"]);
    assert!(
        text.contains(&format!(
            "inode {high} (File): link count 2, 1 name (/a/high): set to 1"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "inode {void} (File): link count 1, no name reaches it (leaked): freed"
        )),
        "{text}"
    );
    // `#INO`, with a suffix that puts the name on the inode's server.
    let moved_to = format!(
        "inode {leaked} (File): link count 1, no name reaches it (leaked, {big} bytes): moved to "
    );
    let adopted = text
        .lines()
        .find_map(|l| l.strip_prefix(moved_to.as_str()))
        .unwrap_or_else(|| panic!("{leaked} not moved:\n{text}"))
        .to_string();
    assert!(
        adopted.starts_with(&format!("/lost+found/#{}", leaked.0)),
        "{adopted}"
    );
    assert_eq!(fresh().getattr(high).await.unwrap().nlink, 1);
    assert_eq!(
        fresh().getattr(void).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while has_chunk_dir(&tc, void) {
        assert!(Instant::now() < deadline, "the freed inode's chunks stay");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kept = fresh().stat(adopted.as_str()).await.unwrap();
    assert_eq!((kept.ino, kept.nlink, kept.size), (leaked, 1, big as u64));
    assert_eq!(
        &fresh().read_file(adopted.as_str()).await.unwrap(),
        &files[1].2
    );
    // Every live file as it was.
    for (path, ino, data) in &files {
        if *ino == leaked || *ino == void {
            continue;
        }
        assert_eq!(
            &fresh().read_file(path.as_str()).await.unwrap(),
            data,
            "{path}"
        );
    }
    assert_eq!(
        &fresh().read_file(second.as_str()).await.unwrap(),
        &files[2].2
    );
    assert_eq!(fresh().getattr(linked).await.unwrap().nlink, 2);
    let text = tc.madfs_ok(["fsck"]);
    assert!(text.contains("0 with a wrong link count"), "{text}");
    let again = c.check_inode_links(true).await.unwrap();
    assert!(again.wrong.is_empty(), "{again:?}");
    assert!(!again.wrong.iter().any(|w| w.repair != Some(Repair::Done)));

    let user = c.with_credentials(Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    });
    assert_eq!(
        user.check_inode_links(false).await.unwrap_err().code,
        ErrorCode::NotPermitted
    );
}

/// Delete `key` from the metadata store of stopped server `i` (a write a
/// power cut took).
fn lose_key(tc: &TestCluster, i: usize, key: &[u8]) {
    let dir = tc.config().servers[i].data_dir.join("meta");
    let kv = madfs_kv::RocksStore::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    use madfs_kv::KvStore;
    assert!(kv.get(key).unwrap().is_some(), "server {i} has no {key:?}");
    let mut b = madfs_kv::WriteBatch::new();
    b.delete(key);
    kv.write(b, true).unwrap();
}

/// What only a lost write leaves (without replicas, a power cut that took
/// a write of one store and not of another, or a disk that lost keys): a
/// directory whose name is gone, with what is below it; names whose
/// inodes are gone, a file's and a directory's; a file whose name is
/// gone; and directories whose inode is gone while names are in them, one
/// with its own name and one without. fsck names them; `--repair` gives
/// the directory and the file names in /lost+found, where everything
/// reads as written, removes the names, and makes the lost directories
/// again, under their own name or in /lost+found, with what is in them;
/// the counts of the root and of the lost+found come out right, and a
/// second check is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_moves_directories_no_name_reaches_to_lost_found_and_removes_names_without_inodes() {
    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let lost = c.mkdir("/lost", 0o750).await.unwrap().ino;
    c.mkdir("/lost/sub", 0o755).await.unwrap();
    let inside = contents(7, 100 << 10);
    c.write_file("/lost/f", &inside).await.unwrap();
    c.write_file("/lost/sub/g", b"below").await.unwrap();
    c.write_file("/x", b"x's data").await.unwrap();
    let x = c.stat("/x").await.unwrap().ino;
    let y = c.mkdir("/y", 0o755).await.unwrap().ino;
    // Empty: what an rmdir leaves if a power cut undoes its owner's drop.
    let empty = c.mkdir("/empty", 0o755).await.unwrap().ino;
    c.write_file("/kept", b"kept").await.unwrap();
    // A directory on a server other than 0, and one in it whose inode
    // sorts before its own (a lower server): the repair meets the inner
    // one first, whose name is in a directory not made yet.
    let top = (0..)
        .map(|k| format!("gone{k}"))
        .find(|n| {
            dentry_server(
                InodeId::ROOT,
                &FileName::new(n.as_bytes()).unwrap(),
                SERVERS,
            )
            .0 > 0
        })
        .unwrap();
    let gone = c
        .mkdir(format!("/{top}").as_str(), 0o755)
        .await
        .unwrap()
        .ino;
    let inner = (0..)
        .map(|k| format!("in{k}"))
        .find(|n| {
            dentry_server(gone, &FileName::new(n.as_bytes()).unwrap(), SERVERS) < gone.owner()
        })
        .unwrap();
    let (top_path, in_path) = (format!("/{top}"), format!("/{top}/{inner}"));
    let gone_in = c.mkdir(in_path.as_str(), 0o755).await.unwrap().ino;
    assert!(gone_in < gone);
    c.write_file(format!("{in_path}/h").as_str(), b"deep")
        .await
        .unwrap();
    c.write_file(format!("{top_path}/f").as_str(), &inside)
        .await
        .unwrap();
    let orphan = c.mkdir("/orphan", 0o755).await.unwrap().ino;
    c.write_file("/orphan/o", b"orphan's").await.unwrap();
    let z_data = contents(9, 3000);
    c.write_file("/z", &z_data).await.unwrap();
    let z = c.stat("/z").await.unwrap().ino;
    drop(c);
    for (i, status) in tc.stop_all() {
        assert!(status.success(), "server {i}: {status}");
    }
    let root = InodeId::ROOT;
    let name = |n: &str| FileName::new(n.as_bytes()).unwrap();
    let holder = |n: &str| dentry_server(root, &name(n), SERVERS).0 as usize;
    use madfs_server::keys;
    lose_key(&tc, holder("lost"), &keys::dentry(root, &name("lost")));
    lose_key(&tc, holder("empty"), &keys::dentry(root, &name("empty")));
    lose_key(&tc, x.owner().0 as usize, &keys::inode(x));
    lose_key(&tc, y.owner().0 as usize, &keys::inode(y));
    lose_key(&tc, gone.owner().0 as usize, &keys::inode(gone));
    // One inside it too: made again only once /gone is.
    lose_key(&tc, gone_in.owner().0 as usize, &keys::inode(gone_in));
    lose_key(&tc, orphan.owner().0 as usize, &keys::inode(orphan));
    lose_key(&tc, holder("orphan"), &keys::dentry(root, &name("orphan")));
    lose_key(&tc, holder("z"), &keys::dentry(root, &name("z")));
    tc.start_all_again();
    let c = tc.client();

    let out = tc.madfs(["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in [
        format!("inode {lost} (directory): no name reaches it: left alone\n"),
        format!("inode {empty} (directory): no name reaches it, empty: left alone\n"),
        format!("/x: names inode {x}, which does not exist: left alone\n"),
        format!("/y: names inode {y}, which does not exist: left alone\n"),
        format!("inode {z} (File): link count 1, no name reaches it (leaked, 3000 bytes)\n"),
        format!(
            "inode {gone} (directory): does not exist, 2 names are in it (1 directories), \
             named {top_path}: left alone\n"
        ),
        format!(
            "inode {orphan} (directory): does not exist, 1 names are in it (0 directories), \
             no name left: left alone\n"
        ),
        format!(
            "inode {gone_in} (directory): does not exist, 1 names are in it (0 directories), \
             named {in_path}: left alone\n"
        ),
    ] {
        assert!(text.contains(&line), "no {line:?} in:\n{text}");
    }
    assert!(
        text.contains(
            "1 with a wrong link count, 2 directories no name reaches, 2 names without their \
             inode, 3 directories gone with names in them; 0 repaired"
        ),
        "{text}"
    );

    let out = tc.madfs(["fsck", "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    // `#INO`, with a suffix that puts the name on the directory's server.
    let moved_to = format!("inode {lost} (directory): no name reaches it: moved to ");
    let adopted = text
        .lines()
        .find_map(|l| l.strip_prefix(moved_to.as_str()))
        .unwrap_or_else(|| panic!("{lost} not moved:\n{text}"))
        .to_string();
    let hash = format!("/lost+found/#{}", lost.0);
    assert!(
        adopted == hash || adopted.starts_with(&format!("{hash}.")),
        "{adopted}"
    );
    let in_lost_found = |prefix: String, ino: InodeId| {
        let path = text
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"))
            .to_string();
        let hash = format!("/lost+found/#{}", ino.0);
        assert!(
            path == hash || path.starts_with(&format!("{hash}.")),
            "{path}"
        );
        path
    };
    let orphan_at = in_lost_found(
        format!(
            "inode {orphan} (directory): does not exist, 1 names are in it (0 directories), no \
             name left: made again as "
        ),
        orphan,
    );
    let z_at = in_lost_found(
        format!(
            "inode {z} (File): link count 1, no name reaches it (leaked, 3000 bytes): moved to "
        ),
        z,
    );
    for line in [
        format!("inode {empty} (directory): no name reaches it, empty: freed\n"),
        format!("/x: names inode {x}, which does not exist: removed\n"),
        format!("/y: names inode {y}, which does not exist: removed\n"),
        format!(
            "inode {gone} (directory): does not exist, 2 names are in it (1 directories), \
             named {top_path}: made again as {top_path}\n"
        ),
        format!(
            "inode {gone_in} (directory): does not exist, 1 names are in it (0 directories), \
             named {in_path}: made again as {in_path}\n"
        ),
    ] {
        assert!(text.contains(&line), "no {line:?} in:\n{text}");
    }
    // The root's count was off (a subdirectory's name lost): set right by
    // the directory check before.
    assert_eq!(out.status.code(), Some(0), "{text}");

    let fresh = tc.client().with_cache(CacheConfig::off());
    let mut names: Vec<_> = fresh
        .read_dir("/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, [top.as_str(), "kept", "lost+found"]);
    // Two directories adopted, one file.
    let lf = fresh.stat("/lost+found").await.unwrap();
    assert_eq!((lf.perm & 0o7777, lf.nlink), (0o700, 4));
    assert_eq!(fresh.stat("/").await.unwrap().nlink, 4);
    // The lost directories, made again, hold what they held.
    let remade = fresh.stat(top_path.as_str()).await.unwrap();
    assert_eq!(
        (remade.ino, remade.perm & 0o7777, remade.uid, remade.nlink),
        (gone, 0o700, 0, 3)
    );
    let read = |p: String| {
        let fresh = fresh.clone();
        async move { fresh.read_file(p.as_str()).await.unwrap() }
    };
    assert_eq!(read(format!("{top_path}/f")).await, inside);
    assert_eq!(read(format!("{in_path}/h")).await, b"deep");
    let remade = fresh.stat(in_path.as_str()).await.unwrap();
    assert_eq!(
        (remade.ino, remade.perm & 0o7777, remade.nlink),
        (gone_in, 0o700, 2)
    );
    let remade = fresh.stat(orphan_at.as_str()).await.unwrap();
    assert_eq!((remade.ino, remade.nlink), (orphan, 2));
    assert_eq!(
        fresh
            .read_file(format!("{orphan_at}/o").as_str())
            .await
            .unwrap(),
        b"orphan's"
    );
    let kept_z = fresh.stat(z_at.as_str()).await.unwrap();
    assert_eq!((kept_z.ino, kept_z.nlink), (z, 1));
    assert_eq!(fresh.read_file(z_at.as_str()).await.unwrap(), z_data);
    let moved = fresh.stat(adopted.as_str()).await.unwrap();
    assert_eq!(
        (moved.ino, moved.perm & 0o7777, moved.nlink),
        (lost, 0o750, 3)
    );
    assert_eq!(
        fresh
            .read_file(format!("{adopted}/f").as_str())
            .await
            .unwrap(),
        inside
    );
    assert_eq!(
        fresh
            .read_file(format!("{adopted}/sub/g").as_str())
            .await
            .unwrap(),
        b"below"
    );
    assert_eq!(fresh.read_file("/kept").await.unwrap(), b"kept");
    assert_eq!(
        fresh.getattr(empty).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    // "..": the adopted directory's parent is the lost+found now.
    fresh
        .rename(format!("{adopted}/sub").as_str(), "/sub-back")
        .await
        .unwrap();
    assert_eq!(fresh.read_file("/sub-back/g").await.unwrap(), b"below");

    let text = tc.madfs_ok(["fsck"]);
    assert!(
        text.contains(
            "0 with a wrong link count, 0 directories no name reaches, 0 names without their \
             inode"
        ),
        "{text}"
    );
    // The owners' side refuses anyone but root, and names that land on
    // another server.
    let creds = Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    };
    let adopt = |name: &str| Op::Adopt {
        ino: lost,
        into: lf.ino,
        name: FileName::new(name.as_bytes()).unwrap(),
        seen: 3,
    };
    let wrong_server = (0..)
        .map(|k| format!("elsewhere{k}"))
        .find(|n| dentry_server(lf.ino, &name(n), SERVERS) != lost.owner())
        .unwrap();
    let owner = lost.owner().0 as usize;
    assert_eq!(
        ask_raw(&tc, owner, creds.clone(), adopt(&format!("#{}", lost.0))).0,
        ErrorCode::NotPermitted as u16
    );
    assert_eq!(
        ask_raw(&tc, owner, Credentials::root(), adopt(&wrong_server)).0,
        ErrorCode::InvalidArgument as u16
    );
    // A file adopted with a count other than the one seen: EBUSY.
    let z_name = (0..)
        .map(|k| format!("again{k}"))
        .find(|n| dentry_server(lf.ino, &name(n), SERVERS) == z.owner())
        .unwrap();
    let adopt_z = Op::Adopt {
        ino: z,
        into: lf.ino,
        name: name(&z_name),
        seen: 5,
    };
    let z_owner = z.owner().0 as usize;
    assert_eq!(
        ask_raw(&tc, z_owner, Credentials::root(), adopt_z).0,
        ErrorCode::Busy as u16
    );
    // Making a directory again: root only; an id its owner never handed
    // out is EINVAL, a file's EEXIST, and one that exists is left as it is.
    let remake = |dir| Op::RemakeDir {
        dir,
        parent: root,
        nlink: 2,
    };
    let unissued = InodeId::new(lost.owner(), 1 << 40);
    assert_eq!(
        ask_raw(&tc, owner, Credentials::root(), remake(unissued)).0,
        ErrorCode::InvalidArgument as u16
    );
    assert_eq!(
        ask_raw(&tc, z_owner, Credentials::root(), remake(z)).0,
        ErrorCode::Exists as u16
    );
    assert_eq!(
        ask_raw(&tc, owner, creds.clone(), remake(lost)).0,
        ErrorCode::NotPermitted as u16
    );
    match ask_raw(&tc, owner, Credentials::root(), remake(lost)) {
        // (Its subdirectory moved out above.)
        (0, Ok(Reply::Attr(a))) => assert_eq!((a.ino, a.nlink), (lost, 2)),
        other => panic!("remaking a directory that exists: {other:?}"),
    }
    // Dropping a name whose inode exists, or that names another: EBUSY.
    let kept = fresh.stat("/kept").await.unwrap().ino;
    let drop_name = |ino| Op::DropName {
        parent: root,
        name: name("kept"),
        ino,
    };
    assert_eq!(
        ask_raw(&tc, holder("kept"), Credentials::root(), drop_name(kept)).0,
        ErrorCode::Busy as u16
    );
    assert_eq!(
        ask_raw(&tc, holder("kept"), Credentials::root(), drop_name(x)).0,
        ErrorCode::Busy as u16
    );
    assert_eq!(
        ask_raw(&tc, holder("kept"), creds, drop_name(kept)).0,
        ErrorCode::NotPermitted as u16
    );
    assert_eq!(fresh.read_file("/kept").await.unwrap(), b"kept");
    drop(c);
}

/// A link drop that keeps failing is still to be finished: fsck reports
/// the count it leaves above the names but does not set it (the drop,
/// landing later, would take the count below them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_leaves_a_count_alone_while_a_link_drop_is_unfinished() {
    let tc = cluster_with_fault("MADFS_FAULT_FAIL_LINK_DROPS");
    let c = tc.client();
    let b = c.mkdir("/b", 0o755).await.unwrap();
    c.write_file("/f", b"data").await.unwrap();
    let f = c.stat("/f").await.unwrap().ino;
    let extra = format!("/b/{}", remote_name(b.ino, f.owner(), "x"));
    c.hard_link("/f", extra.as_str()).await.unwrap();
    c.remove_file(extra.as_str()).await.unwrap();
    let out = tc.madfs(["fsck", "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "inode {f} (File): link count 2, 1 name (/f): left alone, 1 link drops, renames or \
             directory removals or moves are still being finished"
        )),
        "{text}"
    );
    let fresh = tc.client().with_cache(CacheConfig::off());
    assert_eq!(fresh.getattr(f).await.unwrap().nlink, 2);
    assert_eq!(fresh.read_file("/f").await.unwrap(), b"data");
}

/// The owner's side: ListInodes pages through exactly the inodes it owns
/// that have links; FixFileLinks refuses a caller other than root, a
/// directory and a count other than the one seen (EBUSY), each changing
/// nothing, sets a count asked for twice once, and frees an inode set to
/// 0 (asked again: done).
#[test]
fn the_owner_lists_its_inodes_and_sets_a_file_count_only_as_fsck_asks() {
    let tc = TestCluster::start(SERVERS);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    let (dir, files) = rt.block_on(async {
        let dir = c.mkdir("/d", 0o755).await.unwrap();
        let mut files = Vec::new();
        for i in 0..12 {
            let p = format!("/d/f{i}");
            c.write_file(p.as_str(), b"x").await.unwrap();
            files.push(c.stat(p.as_str()).await.unwrap().ino);
        }
        (dir, files)
    });
    let user = Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    };
    let list = |creds: Credentials, after, max_entries| {
        ask_raw(&tc, 0, creds, Op::ListInodes { after, max_entries })
    };
    assert_eq!(
        list(user.clone(), None, 10).0,
        ErrorCode::NotPermitted as u16
    );
    // Server 0's inodes, one per page.
    let mut mine: Vec<InodeId> = [InodeId::ROOT, dir.ino]
        .into_iter()
        .chain(files.iter().copied())
        .filter(|i| i.owner().0 == 0)
        .collect();
    mine.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (status, reply) = list(Credentials::root(), after, 1);
        assert_eq!(status, 0, "{reply:?}");
        let Ok(Reply::InodePage {
            inodes,
            more,
            pending,
        }) = reply
        else {
            panic!("{reply:?}")
        };
        assert_eq!(pending, 0);
        assert!(inodes.len() <= 1);
        seen.extend(inodes.iter().map(|i: &InodeLinks| i.ino));
        after = inodes.last().map(|i| i.ino);
        if !more {
            break;
        }
    }
    assert_eq!(seen, mine);

    let f = *files
        .iter()
        .find(|i| i.owner().0 == 1)
        .expect("a file on server 1");
    let fix = |creds: Credentials, ino: InodeId, seen: u32, want: u32| {
        ask_raw(
            &tc,
            ino.owner().0 as usize,
            creds,
            Op::FixFileLinks { ino, seen, want },
        )
    };
    let nlink = |ino| {
        let fresh = tc.client().with_cache(CacheConfig::off());
        rt.block_on(fresh.getattr(ino)).map(|a| a.nlink)
    };
    let cases = [
        (user, f, 1, 3, ErrorCode::NotPermitted),
        (Credentials::root(), dir.ino, 2, 3, ErrorCode::IsDir),
        (Credentials::root(), f, 2, 3, ErrorCode::Busy),
    ];
    for (creds, ino, seen, want, code) in cases {
        let (status, reply) = fix(creds, ino, seen, want);
        assert_eq!(status, code as u16, "seen {seen} want {want}: {reply:?}");
        assert_eq!(nlink(f).unwrap(), 1, "after {code:?}");
    }
    assert!(format!("{:?}", fix(Credentials::root(), f, 2, 3).1)
        .contains("changed meanwhile (2 when checked, 1 now)"));
    for _ in 0..2 {
        let (status, reply) = fix(Credentials::root(), f, 1, 3);
        assert_eq!((status, reply), (0, Ok(Reply::Links { nlink: 3 })));
        assert_eq!(nlink(f).unwrap(), 3);
    }
    for _ in 0..2 {
        let (status, reply) = fix(Credentials::root(), f, 3, 0);
        assert_eq!((status, reply), (0, Ok(Reply::Links { nlink: 0 })));
        assert_eq!(nlink(f).unwrap_err().code, ErrorCode::NotFound);
    }
    // The other files are untouched.
    for &g in files.iter().filter(|&&g| g != f) {
        assert_eq!(nlink(g).unwrap(), 1);
    }
}
