//! Guards directory times and link counts through the client library on a
//! 4-server cluster: every operation that makes, removes or renames an
//! entry moves its parent directory's (both parents' for rename) mtime and
//! ctime on, whether the directory's inode lives on the entry's server
//! (updated in the entry's own batch) or on another one (a touch sent
//! server to server), as seen at once by the client that did it (its
//! metadata cache must not answer with the directory's older times) and by
//! another client; a directory's link count is 2 plus its subdirectories,
//! also under concurrent mkdirs (coalesced touches), and a touch the owner
//! sees twice (a retry) counts once. Before, directory times never moved
//! and link counts stayed 2. `madfs fsck` finds the counts lost touches
//! left wrong and sets them right.

mod common;

use common::{ask_raw, assert_err, Options, TestCluster};
use madfs_client::{
    Attr, CacheConfig, Client, Credentials, ErrorCode, FileKind, FileName, OpenOptions, TimeSet,
    Timestamp,
};
use madfs_proto::message::Op;
use madfs_types::{dentry_server, InodeId};

const SERVERS: usize = 4;
const PAST: Timestamp = Timestamp {
    secs: 1_000_000,
    nanos: 0,
};

/// Names `prefix<i>` in directory `dir` whose entry lives on the
/// directory's own server (`local`) or on another one.
fn names_on(c_dir: &Attr, prefix: &str, local: bool, count: usize) -> Vec<String> {
    let owner = c_dir.ino.owner();
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .filter(|n| {
            let home = dentry_server(c_dir.ino, &FileName::new(n.as_bytes()).unwrap(), SERVERS);
            (home == owner) == local
        })
        .take(count)
        .collect()
}

/// Set `dir`'s times to the past; returns its ctime (now).
async fn age(c: &Client, dir: &str) -> Timestamp {
    let a = c
        .set_times(dir, TimeSet::At(PAST), TimeSet::At(PAST))
        .await
        .unwrap();
    assert_eq!(a.mtime, PAST);
    // The operations below must get a strictly later time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while Timestamp::now() <= a.ctime {
        assert!(std::time::Instant::now() < deadline, "clock stands still");
        std::thread::yield_now();
    }
    a.ctime
}

/// Both clients see `dir`'s times after `ctime` (and past `PAST`) and the
/// same link count; returns it.
async fn touched(cs: &[&Client], dir: &str, ctime: Timestamp, what: &str) -> u32 {
    let mut nlink = None;
    for (i, c) in cs.iter().enumerate() {
        let a = c.stat(dir).await.unwrap();
        assert!(a.mtime > PAST, "{what}: mtime of {dir} (client {i})");
        assert!(a.ctime > ctime, "{what}: ctime of {dir} (client {i})");
        assert!(a.mtime >= ctime, "{what}: mtime of {dir} (client {i})");
        assert_eq!(*nlink.get_or_insert(a.nlink), a.nlink, "{what}: nlink");
    }
    nlink.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_changes_move_parent_times_and_link_counts() {
    let tc = TestCluster::start(SERVERS);
    // The other client asks the servers every time (its cache would show
    // what it saw up to a TTL ago, as designed).
    let (c, other) = (tc.client(), tc.client().with_cache(CacheConfig::off()));
    let all = [&c, &other];
    let d = c.mkdir("/d", 0o755).await.unwrap();
    let e = c.mkdir("/e", 0o755).await.unwrap();
    assert_eq!(c.stat("/").await.unwrap().nlink, 4);
    for local in [true, false] {
        let tag = if local { "local" } else { "remote" };
        let n = names_on(&d, &format!("{tag}-"), local, 8);
        let p = |i: usize| format!("/d/{}", n[i]);
        let mut subdirs = c.stat("/d").await.unwrap().nlink;

        let t = age(&c, "/d").await;
        c.open(p(0), OpenOptions::new().write(true).create(true))
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        touched(&all, "/d", t, &format!("create ({tag})")).await;

        let t = age(&c, "/d").await;
        c.mkdir(p(1), 0o755).await.unwrap();
        subdirs += 1;
        assert_eq!(
            touched(&all, "/d", t, &format!("mkdir ({tag})")).await,
            subdirs
        );

        let t = age(&c, "/d").await;
        c.symlink("x", p(2)).await.unwrap();
        touched(&all, "/d", t, &format!("symlink ({tag})")).await;

        let t = age(&c, "/d").await;
        c.hard_link(p(0), p(3)).await.unwrap();
        touched(&all, "/d", t, &format!("link ({tag})")).await;

        let t = age(&c, "/d").await;
        c.remove_file(p(3)).await.unwrap();
        touched(&all, "/d", t, &format!("unlink ({tag})")).await;

        let t = age(&c, "/d").await;
        c.rename(p(0), p(4)).await.unwrap();
        touched(&all, "/d", t, &format!("rename in one directory ({tag})")).await;

        // A directory into another directory: both parents, link counts.
        let (td, te) = (age(&c, "/d").await, age(&c, "/e").await);
        let e_links = c.stat("/e").await.unwrap().nlink;
        let moved = format!("/e/{}", n[5]);
        c.rename(p(1), &moved).await.unwrap();
        subdirs -= 1;
        let what = format!("rename of a directory ({tag})");
        assert_eq!(touched(&all, "/d", td, &what).await, subdirs);
        assert_eq!(touched(&all, "/e", te, &what).await, e_links + 1);
        // ... and back, over an empty directory that goes.
        c.mkdir(p(6), 0o755).await.unwrap();
        c.rename(&moved, p(6)).await.unwrap();
        assert_eq!(c.stat("/e").await.unwrap().nlink, e_links);
        assert_eq!(other.stat("/d").await.unwrap().nlink, subdirs + 1);

        let t = age(&c, "/d").await;
        c.remove_dir(p(6)).await.unwrap();
        assert_eq!(
            touched(&all, "/d", t, &format!("rmdir ({tag})")).await,
            subdirs
        );
        for i in [2, 4] {
            c.remove_file(p(i)).await.unwrap();
        }
    }
    assert_eq!(other.stat("/d").await.unwrap().nlink, 2);
    assert_eq!(other.stat("/").await.unwrap().nlink, 4);
    let _ = e;
}

/// Many concurrent creates and mkdirs in one directory whose inode lives
/// elsewhere (coalesced touches): none of the link count changes is lost
/// or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_mkdirs_count_exactly() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    c.mkdir("/shared", 0o755).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let c = tc.client();
            tokio::spawn(async move {
                for i in 0..25 {
                    c.mkdir(format!("/shared/t{t}-d{i}"), 0o755).await.unwrap();
                    c.write_file(format!("/shared/t{t}-f{i}"), b"x")
                        .await
                        .unwrap();
                }
                for i in 0..10 {
                    c.remove_dir(format!("/shared/t{t}-d{i}")).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // A client that made none of the changes sees them once their touches
    // landed (the last ones may still be in flight as the tasks end).
    let fresh = tc.client().with_cache(CacheConfig::off());
    let nlink = poll(&fresh, "/shared", |a| a.nlink == 2 + 8 * 15)
        .await
        .nlink;
    assert_eq!(nlink, 2 + 8 * 15);
    // ... and no late touch moves it further.
    assert_eq!(fresh.stat("/shared").await.unwrap().nlink, 2 + 8 * 15);
}

/// Stat `path` through `c` until `done` holds (at most 10 s; touches land
/// within milliseconds, or `TOUCH_DELAY` late in the test that delays them).
async fn poll(c: &Client, path: &str, done: impl Fn(&Attr) -> bool) -> Attr {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a = c.stat(path).await.unwrap();
        if done(&a) {
            return a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} never showed the change: {a:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Every touch is sent this late in `a_slow_touch_holds_up_only_its_own_clients_stat`.
const TOUCH_DELAY: std::time::Duration = std::time::Duration::from_millis(700);

/// Operations reply before their parent's touch is applied (the reply
/// carries a token naming it): with every touch sent `TOUCH_DELAY` late,
/// a create, mkdir or unlink still replies at once; the client that made
/// the change sees it in the directory's attributes right after (its
/// GetAttr waits for its token), with its metadata cache on and off;
/// another client sees it once the touch lands, within a bounded wait.
/// Guards against stat answering before the client's own change landed
/// (the token lost or not waited for) and against the reply waiting for
/// the touch again (the cost this design removes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_touch_holds_up_only_its_own_clients_stat() {
    let tc = TestCluster::start_with(
        SERVERS,
        common::Options {
            server_env: vec![(
                "MADFS_TEST_TOUCH_DELAY_MS".to_string(),
                TOUCH_DELAY.as_millis().to_string(),
            )],
            ..Default::default()
        },
    );
    let other = tc.client().with_cache(CacheConfig::off());
    for cached in [true, false] {
        let c = if cached {
            tc.client()
        } else {
            tc.client().with_cache(CacheConfig::off())
        };
        let dir = format!("/slow-{cached}");
        let d = c.mkdir(&dir, 0o755).await.unwrap();
        let n = names_on(&d, "e", false, 3);
        let p = |i: usize| format!("{dir}/{}", n[i]);
        c.write_file(p(2), b"x").await.unwrap();
        c.stat(&dir).await.unwrap(); // that touch landed before `age`
        for (what, subdirs) in [("mkdir", 3), ("create", 3), ("unlink", 3)] {
            let t = age(&c, &dir).await;
            let started = std::time::Instant::now();
            match what {
                "mkdir" => {
                    c.mkdir(p(0), 0o755).await.unwrap();
                }
                "create" => c.write_file(p(1), b"x").await.unwrap(),
                _ => c.remove_file(p(2)).await.unwrap(),
            }
            let took = started.elapsed();
            assert!(took < TOUCH_DELAY, "{what} waited for its touch: {took:?}");
            // The touch is still on its way: a client without the token
            // sees the old times (only checked while that is certain).
            let seen = other.stat(&dir).await.unwrap();
            if started.elapsed() < TOUCH_DELAY / 2 {
                assert_eq!(seen.mtime, PAST, "{what}: the touch was not delayed");
            }
            // The client that made the change sees it at once.
            let a = c.stat(&dir).await.unwrap();
            let tag = format!("{what} (cache {cached})");
            assert!(a.mtime > PAST && a.ctime > t, "{tag}: {a:?}");
            assert_eq!(a.nlink, subdirs, "{tag}");
            // The other client sees it once the touch landed.
            let a = poll(&other, &dir, |a| a.mtime > PAST).await;
            assert!(a.ctime > t, "{tag}: {a:?}");
            assert_eq!(a.nlink, subdirs, "{tag}");
        }
    }
}

/// A touch still unsent when its sender is killed (kill -9) is sent when
/// that server starts again: the changes were acknowledged to the client
/// (mkdirs, a create), so the parent's link count and times must show
/// them. Every touch is held back (`MADFS_TEST_TOUCH_DELAY_MS`) until the
/// senders die; they start again without the delay. Before, the touches
/// lived in the sender's memory only and the link count stayed 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_touch_left_unsent_by_a_crash_is_sent_at_the_restart() {
    let mut tc = TestCluster::start_with(
        SERVERS,
        common::Options {
            server_env: vec![(
                "MADFS_TEST_TOUCH_DELAY_MS".to_string(),
                "600000".to_string(),
            )],
            ..Default::default()
        },
    );
    let c = tc.client();
    let other = tc.client().with_cache(CacheConfig::off());
    let d = c.mkdir("/crash", 0o755).await.unwrap();
    let names = names_on(&d, "sub", false, 3);
    let t = age(&c, "/crash").await;
    for n in &names {
        c.mkdir(format!("/crash/{n}"), 0o755).await.unwrap();
    }
    let file = names_on(&d, "f", false, 1).remove(0);
    c.write_file(format!("/crash/{file}"), b"x").await.unwrap();
    // Held back: nobody without the tokens sees the changes yet.
    let seen = other.stat("/crash").await.unwrap();
    assert_eq!(
        (seen.nlink, seen.mtime),
        (2, PAST),
        "the touches were not held back"
    );
    let mut senders: Vec<usize> = names
        .iter()
        .chain([&file])
        .map(|n| dentry_server(d.ino, &FileName::new(n.as_bytes()).unwrap(), SERVERS).0 as usize)
        .collect();
    senders.sort();
    senders.dedup();
    assert!(!senders.contains(&(d.ino.owner().0 as usize)));
    for &i in &senders {
        tc.kill9(i);
    }
    tc.set_server_env(&[]);
    for &i in &senders {
        tc.restart(i);
    }
    let a = poll(&other, "/crash", |a| a.nlink == 2 + names.len() as u32).await;
    assert!(a.mtime > PAST && a.ctime > t, "{a:?}");
    // Each change counted once, whatever was sent twice.
    let extra = names_on(&d, "more", true, 1).remove(0);
    c.mkdir(format!("/crash/{extra}"), 0o755).await.unwrap();
    assert_eq!(
        other.stat("/crash").await.unwrap().nlink,
        3 + names.len() as u32
    );
}

/// With replicas, a touch its sender had not sent when it was killed is
/// sent by the copy that takes the sender's set over: the intent came to
/// the copy with the operation's batch. Only the sender holds its touches
/// back; the copy's server sends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_touch_left_unsent_by_a_dead_primary_is_sent_by_its_copy() {
    // The sender: a server that owns neither the root nor the directory.
    let sender = 3usize;
    let mut tc = TestCluster::start_with(
        SERVERS,
        common::Options {
            replicas: 2,
            server_env_for: vec![(
                sender,
                "MADFS_TEST_TOUCH_DELAY_MS".to_string(),
                "600000".to_string(),
            )],
            ..Default::default()
        },
    );
    let c = tc.client();
    let other = tc.client().with_cache(CacheConfig::off());
    let dir = (0..100)
        .map(|i| format!("/failover{i}"))
        .find(|p| {
            let n = FileName::new(&p.as_bytes()[1..]).unwrap();
            dentry_server(madfs_types::InodeId::ROOT, &n, SERVERS).0 as usize != sender
        })
        .unwrap();
    let d = c.mkdir(&dir, 0o755).await.unwrap();
    assert_ne!(
        d.ino.owner().0 as usize,
        sender,
        "the directory lives with its entry"
    );
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("sub{i}"))
        .filter(|n| {
            dentry_server(d.ino, &FileName::new(n.as_bytes()).unwrap(), SERVERS).0 as usize
                == sender
        })
        .take(2)
        .collect();
    let t = age(&c, &dir).await;
    for n in &names {
        c.mkdir(format!("{dir}/{n}"), 0o755).await.unwrap();
    }
    let seen = other.stat(&dir).await.unwrap();
    assert_eq!(
        (seen.nlink, seen.mtime),
        (2, PAST),
        "the touches were not held back"
    );
    tc.kill9(sender);
    // A failover takes a few seconds; the copy then sends what it found.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let a = loop {
        match other.stat(&dir).await {
            Ok(a) if a.nlink == 2 + names.len() as u32 => break a,
            seen => assert!(
                std::time::Instant::now() < deadline,
                "{dir} never showed the mkdirs after the failover: {seen:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(a.mtime > PAST && a.ctime > t, "{a:?}");
}

/// A touch the owner already applied (its answer lost, so the sender sends
/// it again with the same seq) is not applied twice, nor is an older one;
/// a touch's time never moves the directory's times back.
#[test]
fn a_retried_touch_is_applied_once() {
    use common::{frame, key_of, Raw};
    use madfs_proto::auth::Role;
    use madfs_proto::message::{Op, Request};
    use madfs_proto::Opcode;
    use madfs_types::{Credentials, ServerId};

    let tc = TestCluster::start(SERVERS);
    let c = tc.client().with_cache(CacheConfig::off());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = rt.block_on(c.mkdir("/r", 0o755)).unwrap();
    let mut raw = Raw::connect(&tc, d.ino.owner().0 as usize);
    assert_eq!(raw.handshake_as(&key_of(&tc), Role::Peer), 0);
    let mut id = 0;
    let mut touch = |seq: u64, time: Timestamp, nlink_delta: i32| {
        id += 1;
        let body = Request {
            creds: Credentials::root(),
            op: Op::TouchDir {
                dir: d.ino,
                sender: ServerId(1),
                // Far above what server 1's counter hands out here.
                seq: (1 << 40) + seq,
                time,
                nlink_delta,
            },
            once: None,
        }
        .encode();
        raw.send(&frame(Opcode::TouchDir, id, &body, 0));
        raw.send(&body);
        let (h, _, _) = raw.read_frame().unwrap();
        assert_eq!(h.status, 0, "touch {seq}");
    };
    let later = Timestamp {
        secs: d.mtime.secs + 100,
        nanos: 0,
    };
    touch(5, later, 3);
    touch(5, later, 3); // the retry
    touch(4, later, 3); // older
    let a = rt.block_on(c.stat("/r")).unwrap();
    assert_eq!((a.nlink, a.mtime, a.ctime), (5, later, later));
    touch(6, PAST, -3);
    let a = rt.block_on(c.stat("/r")).unwrap();
    assert_eq!((a.nlink, a.mtime, a.ctime), (2, later, later));
    // The directory goes with its touch records.
    rt.block_on(c.remove_dir("/r")).unwrap();
}

/// rename(2) stamps the moved inode's ctime (ext4 does; pjdfstest
/// rename/22), whether the inode lives on the server of its new name or
/// not; before, only the parents' times moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_stamps_the_moved_inode_ctime() {
    let tc = TestCluster::start(SERVERS);
    let (c, other) = (tc.client(), tc.client().with_cache(CacheConfig::off()));
    let d = c.mkdir("/d", 0o755).await.unwrap();
    for local in [true, false] {
        let n = names_on(&d, if local { "l-" } else { "r-" }, local, 4);
        let (src, dst) = (format!("/d/{}", n[0]), format!("/d/{}", n[1]));
        c.open(&src, OpenOptions::new().write(true).create(true))
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        let (sdir, ddir) = (format!("/d/{}", n[2]), format!("/d/{}", n[3]));
        c.mkdir(&sdir, 0o755).await.unwrap();
        for (from, to) in [(&src, &dst), (&sdir, &ddir)] {
            let before = other.stat(from).await.unwrap().ctime;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while Timestamp::now() <= before {
                assert!(std::time::Instant::now() < deadline, "clock stands still");
                std::thread::yield_now();
            }
            c.rename(from, to).await.unwrap();
            let after = other.stat(to).await.unwrap().ctime;
            assert!(
                after > before,
                "{from} -> {to}: ctime {after:?} not after {before:?}"
            );
        }
    }
}

/// A directory's times set after filling it stay as set: cp -a, tar and
/// rsync create the entries, then set the directory's mtime. With every
/// touch sent `TOUCH_DELAY` late, the touches of the creates must land
/// before the setattr, not over it (before, the late touch moved the
/// mtime back to the creates' time, and `cp -a` through the mount copied
/// trees with wrong directory times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_set_after_filling_a_directory_stay_as_set() {
    let tc = TestCluster::start_with(
        SERVERS,
        common::Options {
            server_env: vec![(
                "MADFS_TEST_TOUCH_DELAY_MS".to_string(),
                TOUCH_DELAY.as_millis().to_string(),
            )],
            ..Default::default()
        },
    );
    let c = tc.client();
    let d = c.mkdir("/filled", 0o755).await.unwrap();
    for n in names_on(&d, "f", false, 4) {
        c.write_file(format!("/filled/{n}"), b"x").await.unwrap();
    }
    // By inode, as the mount does (the kernel has the directory's inode
    // cached; a path would make the client look the name up first).
    let set = madfs_client::SetAttrs {
        atime: TimeSet::At(PAST),
        mtime: TimeSet::At(PAST),
        ..Default::default()
    };
    let a = c.setattr(d.ino, set).await.unwrap();
    assert_eq!(a.mtime, PAST);
    // Past the delay every touch has landed; the times are still as set.
    tokio::time::sleep(TOUCH_DELAY * 2).await;
    let other = tc.client().with_cache(CacheConfig::off());
    let a = other.stat("/filled").await.unwrap();
    assert_eq!((a.mtime, a.atime), (PAST, PAST), "{a:?}");
}

/// Every directory at or below `dir` with its subdirectories, as listed.
async fn subdirs_below(c: &Client, dir: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut queue = vec![dir.to_string()];
    while let Some(d) = queue.pop() {
        let kids: Vec<String> = c
            .read_dir(d.as_str())
            .await
            .unwrap()
            .iter()
            .filter(|e| e.kind == FileKind::Dir)
            .map(|e| format!("{}/{}", d.trim_end_matches('/'), e.name.to_string_lossy()))
            .collect();
        out.push((d, kids.len() as u32));
        queue.extend(kids);
    }
    out
}

/// A lost touch leaves its directory's link count wrong for good (a power
/// cut that undid an applied touch; here the servers drop every touch's
/// link delta, `MADFS_FAULT_DROP_TOUCH_LINKS`): `madfs fsck` names each
/// such directory with its count and subdirectories and exits 1; `madfs
/// fsck --repair` sets them to 2 plus their subdirectories, as every
/// client then sees, and a check after finds nothing. Only root may check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_repairs_the_link_counts_lost_touches_left_wrong() {
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            server_env: vec![("MADFS_FAULT_DROP_TOUCH_LINKS".into(), "1".into())],
            ..Options::default()
        },
    );
    let c = tc.client();
    let d = c.mkdir("/d", 0o755).await.unwrap();
    let remote = names_on(&d, "r", false, 3);
    let local = names_on(&d, "l", true, 2);
    for n in remote.iter().chain(&local) {
        c.mkdir(format!("/d/{n}"), 0o755).await.unwrap();
    }
    c.mkdir(format!("/d/{}/x", remote[0]), 0o755).await.unwrap();
    // This client's stat waits for its touches: applied, without their
    // link deltas, so only the mkdirs whose entry lives with /d counted.
    assert_eq!(c.stat("/d").await.unwrap().nlink, 2 + 2);

    let truth = subdirs_below(&c, "/").await;
    let mut wrong = Vec::new();
    for (path, subdirs) in &truth {
        let nlink = c.stat(path.as_str()).await.unwrap().nlink;
        if nlink != 2 + subdirs {
            let want = 2 + subdirs;
            let line =
                format!("{path}: link count {nlink}, {subdirs} subdirectories (want {want})");
            wrong.push((path.clone(), line));
        }
    }
    // Sorted by path, as fsck reports them.
    wrong.sort();
    assert!(wrong
        .iter()
        .any(|(_, w)| w.starts_with("/d: link count 4, 5 subdirectories")));

    let check = c.check_dir_links("/", false).await.unwrap();
    assert_eq!(check.dirs, truth.len() as u64);
    let out = tc.madfs(["fsck", "/"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let reported: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(": link count"))
        .collect();
    let expected: Vec<&str> = wrong.iter().map(|(_, w)| w.as_str()).collect();
    assert_eq!(reported, expected, "{text}");
    assert!(text.contains(&format!(
        "{} directories checked, {} with a wrong link count, 0 repaired",
        truth.len(),
        wrong.len()
    )));

    let text = tc.madfs_ok(["fsck", "--repair"]);
    assert!(
        text.contains("/d: link count 4, 5 subdirectories (want 7): set to 7"),
        "{text}"
    );
    let fresh = tc.client().with_cache(CacheConfig::off());
    for (path, subdirs) in &truth {
        assert_eq!(
            fresh.stat(path.as_str()).await.unwrap().nlink,
            2 + subdirs,
            "{path}"
        );
    }
    let text = tc.madfs_ok(["fsck", "/d"]);
    let below_d = truth
        .iter()
        .filter(|(p, _)| p == "/d" || p.starts_with("/d/"))
        .count();
    assert!(
        text.contains(&format!(
            "{below_d} directories checked, 0 with a wrong link count"
        )),
        "{text}"
    );
    let again = c.check_dir_links("/", true).await.unwrap();
    assert!(again.wrong.is_empty(), "{again:?}");

    let user = c.with_credentials(Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    });
    assert_err(
        user.check_dir_links("/", true).await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );
}

/// `FixDirLinks` sent straight to `ino`'s owner as `creds`: the status
/// (0 or an `ErrorCode`) and, on an error, its message.
fn fix_dir_links(
    tc: &TestCluster,
    creds: Credentials,
    ino: InodeId,
    seen: u32,
    want: u32,
) -> (u16, String) {
    let op = Op::FixDirLinks {
        dir: ino,
        seen,
        want,
    };
    let (status, reply) = ask_raw(tc, ino.owner().0 as usize, creds, op);
    (status, reply.err().unwrap_or_default())
}

/// The owner's side of `fsck --repair` refuses what it must and leaves the
/// count alone then: a caller other than root (EPERM), fewer than 2 links
/// (EINVAL), an inode that is no directory (ENOTDIR), a count other than
/// the one the check saw (EBUSY: a mkdir or rmdir came meanwhile). A
/// repair sent twice (a retry) is done once and answered as done.
#[test]
fn the_owner_sets_a_directory_count_only_as_fsck_asks() {
    let tc = TestCluster::start(SERVERS);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    let (d, f) = rt.block_on(async {
        let d = c.mkdir("/d", 0o755).await.unwrap();
        c.write_file("/f", b"x").await.unwrap();
        (d, c.stat("/f").await.unwrap())
    });
    let nlink = |path: &str| {
        let fresh = tc.client().with_cache(CacheConfig::off());
        rt.block_on(fresh.stat(path)).unwrap().nlink
    };
    assert_eq!(nlink("/d"), 2);
    let user = Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    };
    let cases = [
        (user, d.ino, 2, 5, ErrorCode::NotPermitted),
        (Credentials::root(), d.ino, 2, 1, ErrorCode::InvalidArgument),
        (Credentials::root(), f.ino, 1, 3, ErrorCode::NotDir),
        (Credentials::root(), d.ino, 3, 5, ErrorCode::Busy),
    ];
    for (creds, ino, seen, want, code) in cases {
        let (status, msg) = fix_dir_links(&tc, creds, ino, seen, want);
        assert_eq!(status, code as u16, "seen {seen} want {want}: {msg}");
        assert_eq!(nlink("/d"), 2, "after {code:?}");
    }
    assert!(fix_dir_links(&tc, Credentials::root(), d.ino, 3, 5)
        .1
        .contains("changed meanwhile (3 when checked, 2 now)"));
    for _ in 0..2 {
        assert_eq!(fix_dir_links(&tc, Credentials::root(), d.ino, 2, 5).0, 0);
        assert_eq!(nlink("/d"), 5);
    }
    assert_eq!(nlink("/f"), 1);
}
