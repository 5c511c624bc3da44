//! Guards crash durability: data written and fsynced, and metadata changes
//! (mkdir, create, rename, link, chmod) acknowledged before a `kill -9` of
//! servers are all there after the servers restart: the inode's owner and
//! every chunk server are killed (every server is, one after the other, and
//! then all at once). Also guards that SIGTERM stops a server cleanly (exit
//! status 0, nothing lost), that a client survives server restarts (it
//! reconnects), and that a dead server gives an error, not a hang.

mod common;

use common::{pattern, write_synced, TestCluster, CHUNK};
use madfs_client::{Client, ErrorCode, FileKind, FileName, InodeId, Timestamp, RENAME_NOREPLACE};
use madfs_types::dentry_server;
use std::time::{Duration, Instant};

const SERVERS: usize = 4;

/// Everything `populate` made, checked through `c`.
async fn check(c: &Client, big: &[u8]) {
    assert_eq!(c.stat("/keep").await.unwrap().kind, FileKind::Dir);
    assert_eq!(c.stat("/keep/sub").await.unwrap().kind, FileKind::Dir);
    let got = c.read_file("/keep/big-renamed").await.unwrap();
    assert_eq!(got.len(), big.len());
    assert!(
        got == big,
        "fsynced multi-chunk data changed across the crash"
    );
    assert_eq!(
        c.stat("/keep/big").await.unwrap_err().code,
        ErrorCode::NotFound,
        "the rename was undone"
    );
    assert_eq!(c.read_file("/keep/small").await.unwrap(), b"small file");
    assert_eq!(c.stat("/keep/small").await.unwrap().perm, 0o640);
    assert_eq!(c.stat("/keep/small").await.unwrap().nlink, 2);
    assert_eq!(
        c.read_file("/keep/sub/hardlink").await.unwrap(),
        b"small file"
    );
    assert_eq!(c.read_link("/keep/sym").await.unwrap(), b"/keep/small");
    for i in 0..40 {
        assert_eq!(
            c.read_file(format!("/keep/sub/moved-{i}")).await.unwrap(),
            format!("n{i}").as_bytes()
        );
    }
    assert_eq!(
        c.stat("/gone").await.unwrap_err().code,
        ErrorCode::NotFound,
        "a removed directory came back"
    );
    let listing = c.read_dir("/keep/sub").await.unwrap();
    assert_eq!(listing.len(), 41, "entries in /keep/sub");
}

async fn populate(c: &Client) -> Vec<u8> {
    c.mkdir("/keep", 0o755).await.unwrap();
    c.mkdir("/keep/sub", 0o755).await.unwrap();
    c.mkdir("/gone", 0o755).await.unwrap();
    let big = pattern(42, (6 * CHUNK + 12345) as usize);
    write_synced(c, "/keep/big", &big).await;
    c.rename("/keep/big", "/keep/big-renamed").await.unwrap();
    write_synced(c, "/keep/small", b"small file").await;
    c.set_permissions("/keep/small", 0o640).await.unwrap();
    c.hard_link("/keep/small", "/keep/sub/hardlink")
        .await
        .unwrap();
    c.symlink("/keep/small", "/keep/sym").await.unwrap();
    // Many renames: some cross servers, whose two-phase protocol must have
    // finished (or be finished by recovery) with exactly one name.
    for i in 0..40 {
        c.write_file(format!("/keep/n{i}"), format!("n{i}").as_bytes())
            .await
            .unwrap();
        c.rename_with_flags(
            format!("/keep/n{i}"),
            format!("/keep/sub/moved-{i}"),
            RENAME_NOREPLACE,
        )
        .await
        .unwrap();
    }
    c.remove_dir("/gone").await.unwrap();
    big
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsynced_data_and_metadata_survive_kill9_of_every_server() {
    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let big = populate(&c).await;
    check(&c, &big).await;
    let owner = c.stat("/keep/big-renamed").await.unwrap().ino.owner().0 as usize;

    // The owner first, then every other server (each holds chunks: six
    // chunks over four servers, and the other files), one at a time.
    let mut order = vec![owner];
    order.extend((0..SERVERS).filter(|&i| i != owner));
    for &i in &order {
        tc.kill9(i);
        tc.restart(i);
        // A fresh client and the old one (which must reconnect) agree.
        check(&tc.client(), &big).await;
    }
    check(&c, &big).await;

    // All at once.
    for i in 0..SERVERS {
        tc.kill9(i);
    }
    for i in 0..SERVERS {
        tc.restart(i);
    }
    check(&c, &big).await;
    let l = tc.root().join("after-crash");
    tc.madfs_ok(["get".as_ref(), "/keep/big-renamed".as_ref(), l.as_os_str()]);
    assert!(std::fs::read(&l).unwrap() == big);

    // The cluster still takes writes after all that.
    write_synced(&c, "/keep/after", b"after the crash").await;
    assert_eq!(
        c.read_file("/keep/after").await.unwrap(),
        b"after the crash"
    );
}

/// SIGTERM is the documented way to stop a server ("make every acknowledged
/// write durable and return"): it must exit with status 0, not crash on the
/// way out, and keep everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_keeps_everything() {
    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let big = populate(&c).await;
    let mut bad = Vec::new();
    for round in 0..3 {
        for i in 0..SERVERS {
            let status = tc.stop(i);
            if !status.success() {
                bad.push(format!(
                    "round {round}, server {i}: {status}; log: {}",
                    common::tail(&tc.log_path(i), 5)
                ));
            }
            tc.restart(i);
        }
        check(&c, &big).await;
    }
    assert!(
        bad.is_empty(),
        "{} of {} clean stops did not exit 0:\n{}",
        bad.len(),
        3 * SERVERS,
        bad.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_gives_an_error_not_a_hang() {
    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    // Server 0 owns the root, so it stays up. Find a file whose inode
    // lives on the victim, and one that touches no part of it.
    let victim = 1;
    let (mut on_victim, mut elsewhere) = (None, None);
    for i in 0..200 {
        let p = format!("/f{i}");
        c.write_file(&p, p.as_bytes()).await.unwrap();
        let owner = c.stat(&p).await.unwrap().ino.owner().0 as usize;
        let name = FileName::new(&p.as_bytes()[1..]).unwrap();
        let home = dentry_server(InodeId::ROOT, &name, SERVERS).0 as usize;
        if owner == victim && on_victim.is_none() {
            on_victim = Some(p);
        } else if owner != victim && home != victim && elsewhere.is_none() {
            elsewhere = Some(p);
        }
        if on_victim.is_some() && elsewhere.is_some() {
            break;
        }
    }
    let (path, other) = (on_victim.unwrap(), elsewhere.unwrap());
    tc.kill9(victim);
    let t = Instant::now();
    let r = c.read_file(&path).await;
    assert!(r.is_err(), "read from a killed server succeeded");
    let e = r.unwrap_err();
    assert!(
        matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut),
        "unexpected error {e}"
    );
    assert!(matches!(e.errno(), libc::EIO | libc::ETIMEDOUT), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "error took {:?}",
        t.elapsed()
    );
    // Files on other servers still work meanwhile.
    assert_eq!(c.read_file(&other).await.unwrap(), other.as_bytes());
    // `madfs status` shows it down and exits non-zero.
    let out = tc.madfs(["status"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let down: Vec<&str> = text.lines().filter(|l| l.contains("down")).collect();
    assert_eq!(down.len(), 1, "status:\n{text}");
    assert!(down[0].starts_with(&victim.to_string()), "status:\n{text}");

    tc.restart(victim);
    assert_eq!(c.read_file(&path).await.unwrap(), path.as_bytes());
    tc.madfs_ok(["status"]);
}

/// A cross-server rename whose last step (the coordinator telling the
/// destination server to forget its "installed" marker) was lost to a crash
/// leaves that marker behind; that is documented as harmless. It stays
/// harmless only if the coordinator never reuses the transaction id. This
/// test restarts the coordinator, leaves the marker a lost step 5 would
/// leave for the first id the restarted coordinator hands out (sent by hand,
/// as the peer that crashed would have), then renames a file through that
/// coordinator: the file must exist under one of its two names afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_after_a_quick_restart_never_loses_the_file() {
    use madfs_proto::auth::Role;
    use madfs_proto::message::{Op, Request};
    use madfs_proto::Opcode;
    use madfs_types::{Credentials, ServerId, TxId};

    let mut tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let key = common::key_of(&tc);
    let (a, b) = (1usize, 2usize); // coordinator (source name), destination
    let s = c.mkdir("/s", 0o755).await.unwrap().ino;
    let d = c.mkdir("/d", 0o755).await.unwrap().ino;
    let on = |dir: InodeId, server: usize, prefix: &str| {
        (0..1000)
            .map(|i| format!("{prefix}{i}"))
            .find(|n| {
                dentry_server(dir, &FileName::new(n.as_bytes()).unwrap(), SERVERS).0 as usize
                    == server
            })
            .unwrap()
    };
    let victim = on(s, a, "victim");
    let target = on(d, b, "target");
    let decoy = on(d, b, "decoy");
    c.write_file(format!("/s/{victim}"), b"must not be lost")
        .await
        .unwrap();
    c.write_file("/s/old", b"an earlier rename").await.unwrap();
    let old_ino = c.stat("/s/old").await.unwrap().ino;

    // Restart the coordinator within one wall-clock second, so we know the
    // second it started in.
    let now = || Timestamp::now().secs as u64;
    let started = loop {
        let before = now();
        tc.kill9(a);
        tc.restart(a);
        if now() == before {
            break before;
        }
    };
    // What a lost step 5 leaves on B: the installed marker of a rename that
    // coordinator `a` ran with the id it now hands out first.
    // Plant it for the first id a fresh counter hands out (1) and for the
    // id an earlier, clock-seeded scheme would have reused.
    let mut raw = common::Raw::connect(&tc, b);
    assert_eq!(raw.handshake_as(&key, Role::Peer), 0);
    for (request_id, tx) in [(1, 1), (2, started * 1_000_000)] {
        let body = Request {
            creds: Credentials::root(),
            op: Op::RenameInstall {
                tx: TxId(tx),
                coordinator: ServerId(a as u16),
                dst_parent: d,
                dst_name: FileName::new(decoy.as_bytes()).unwrap(),
                ino: old_ino,
                kind: FileKind::File,
                noreplace: false,
                hold: Default::default(),
            },
            once: None,
        }
        .encode();
        raw.send(&common::frame(Opcode::RenameInstall, request_id, &body, 0));
        raw.send(&body);
        let (h, _, _) = raw.read_frame().unwrap();
        assert_eq!(h.status, 0, "setting up the stale marker");
    }
    drop(raw);

    // A rename coordinated by the restarted server, to a name on B.
    let (from, to) = (format!("/s/{victim}"), format!("/d/{target}"));
    let r = c.rename(from.as_str(), to.as_str()).await;
    let at_from = c.read_file(from.as_str()).await;
    let at_to = c.read_file(to.as_str()).await;
    let intact = |r: &Result<Vec<u8>, madfs_client::ClientError>| matches!(r, Ok(v) if v == b"must not be lost");
    match &r {
        Ok(()) => assert!(
            intact(&at_to),
            "rename {from} -> {to} succeeded but the file is not at {to} ({at_to:?}; \
             at {from}: {at_from:?}): the restarted coordinator reused transaction id \
             {} and the destination took it for an already installed rename",
            started * 1_000_000
        ),
        Err(e) => assert!(
            intact(&at_from),
            "rename failed ({e}) and the file is not at its old name either ({at_from:?})"
        ),
    }
}

/// A truncate cuts chunk files on every server holding chunks past the new
/// size, not only on those this client wrote to: an fsync after it syncs
/// every server, once, so that a power cut cannot bring the cut bytes back
/// into a hole a later write makes (through a handle and by path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_after_a_truncate_syncs_every_server() {
    use madfs_client::{Opcode, OpenOptions};
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let data = pattern(7, (SERVERS as u64 * CHUNK) as usize);
    let f = c
        .open("/cut", OpenOptions::new().write(true).create(true))
        .await
        .unwrap();
    f.write_at(0, &data).await.unwrap();
    f.fsync().await.unwrap();
    let fsyncs =
        |since: &madfs_client::RequestCounts| c.request_counts().since(since).get(Opcode::Fsync);

    let before = c.request_counts();
    f.set_len(100).await.unwrap();
    f.fsync().await.unwrap();
    assert_eq!(
        fsyncs(&before),
        SERVERS as u64,
        "the cut through the handle"
    );
    let before = c.request_counts();
    f.fsync().await.unwrap();
    assert_eq!(fsyncs(&before), 0, "nothing written or cut since");

    f.write_at(3 * CHUNK, b"far").await.unwrap();
    f.fsync().await.unwrap();
    let before = c.request_counts();
    c.truncate("/cut", 10).await.unwrap();
    let g = c
        .open("/cut", OpenOptions::new().write(true))
        .await
        .unwrap();
    g.fsync().await.unwrap();
    assert_eq!(fsyncs(&before), SERVERS as u64, "the cut by path");
    f.close().await.unwrap();
    g.close().await.unwrap();
}

/// A server back from a power loss may have lost writes it acknowledged
/// and had not synced. An fsync of them that reaches it afterwards fails
/// (EIO) instead of promising the data (the store answers with a new write
/// verifier), through the handle that wrote them or through another
/// opened after that one closed. After a kill -9 in the same boot (the kernel kept every
/// write) the same fsync succeeds and the data are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_after_a_power_loss_of_a_written_server_fails() {
    use madfs_client::{ChunkIndex, OpenOptions};
    let mut tc = TestCluster::start(2);
    let c = tc.client();
    // Chunks 0 and 1: the owner and the other server both hold data.
    let data = pattern(9, (2 * CHUNK) as usize);
    let open = |path: &'static str| {
        let c = c.clone();
        async move {
            c.open(path, OpenOptions::new().write(true).create(true))
                .await
                .unwrap()
        }
    };
    let server_of_chunk_1 = |ino| madfs_types::chunk_server(ino, ChunkIndex(1), 2).0 as usize;

    // A process crash: nothing lost, nothing to report.
    let kept = open("/kept").await;
    kept.write_at(0, &data).await.unwrap();
    let s = server_of_chunk_1(kept.attr().ino);
    tc.kill9(s);
    tc.restart(s);
    kept.fsync().await.unwrap();
    kept.close().await.unwrap();
    assert!(c.read_file("/kept").await.unwrap() == data);

    // A power loss (a new kernel boot id, no clean stop) between the
    // writes and their fsync.
    let lost = open("/lost").await;
    lost.write_at(0, &data).await.unwrap();
    let s = server_of_chunk_1(lost.attr().ino);
    tc.set_server_env(&[("MADFS_TEST_BOOT_ID", "after a power loss")]);
    tc.kill9(s);
    tc.restart(s);
    let e = lost.fsync().await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    assert!(e.message.contains("power loss"), "{e}");
    // Reported once, as a kernel reports a writeback error.
    lost.fsync().await.unwrap();
    lost.close().await.unwrap();
    drop(lost);
    assert!(
        common::tail(&tc.log_path(s), 50).contains("may have lost writes it had not synced"),
        "the restarted server says why"
    );

    // Writes made after the restart are synced as usual, through a new
    // handle and through another that wrote only since.
    let again = open("/lost").await;
    again.write_at(0, &data).await.unwrap();
    again.fsync().await.unwrap();
    again.close().await.unwrap();
    drop(again);
    assert!(c.read_file("/lost").await.unwrap() == data);

    // Written through a handle since closed, fsynced through another
    // (coreutils' `sync FILE`): the same check.
    let closed = open("/closed").await;
    closed.write_at(0, &data).await.unwrap();
    closed.close().await.unwrap();
    let s = server_of_chunk_1(closed.attr().ino);
    drop(closed);
    tc.set_server_env(&[("MADFS_TEST_BOOT_ID", "after a second power loss")]);
    tc.kill9(s);
    tc.restart(s);
    let reader = c
        .open("/closed", OpenOptions::new().read(true))
        .await
        .unwrap();
    assert_eq!(reader.fsync().await.unwrap_err().code, ErrorCode::Io);
    reader.fsync().await.unwrap();
}

/// A directory's fsync (the mount's fsyncdir, `madfs run`'s fsync of a
/// directory, syncfs: `Client::fsync_all`) after a power loss of a server
/// this client made or removed names on fails once with EIO: the names
/// may be gone (metadata is written unsynced). After a kill -9 in the
/// same boot it succeeds. Before, it always succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_fsync_after_a_power_loss_of_a_changed_server_fails() {
    let mut tc = TestCluster::start(2);
    let c = tc.client();
    c.mkdir("/d", 0o755).await.unwrap();
    c.fsync_all().await.unwrap();
    // A name on each server.
    let mut names = Vec::new();
    let parent = c.stat("/d").await.unwrap().ino;
    for i in 0.. {
        let name = format!("n{i}");
        let home = madfs_types::dentry_server(
            parent,
            &madfs_client::FileName::new(name.as_bytes()).unwrap(),
            2,
        );
        if names.iter().all(|(_, h)| *h != home) {
            names.push((name, home));
            if names.len() == 2 {
                break;
            }
        }
    }
    for (name, _) in &names {
        c.write_file(&format!("/d/{name}"), b"x").await.unwrap();
    }
    let s = names[0].1 .0 as usize;

    // A process crash: nothing lost, nothing to report.
    tc.kill9(s);
    tc.restart(s);
    c.fsync_all().await.unwrap();

    // A power loss of the server of one name, after a rename there.
    let again = (0..)
        .map(|i| format!("/d/r{i}"))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap();
            madfs_types::dentry_server(
                parent,
                &madfs_client::FileName::new(name.as_bytes()).unwrap(),
                2,
            )
            .0 as usize
                == s
        })
        .unwrap();
    c.rename(&format!("/d/{}", names[0].0), &again)
        .await
        .unwrap();
    tc.set_server_env(&[("MADFS_TEST_BOOT_ID", "after a power loss")]);
    tc.kill9(s);
    tc.restart(s);
    let e = c.fsync_all().await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    assert!(e.message.contains("names"), "{e}");
    // Reported once.
    c.fsync_all().await.unwrap();
}

/// fsync(2) is about the file: writes through a handle since closed are
/// made durable by an fsync through another handle opened later, even a
/// read-only one (coreutils' `sync FILE`, a database's checkpointer), on
/// every server they went to; and so are another client's (another
/// process's under `madfs run`): a handle that wrote nothing syncs the
/// servers holding the file's chunks. A handle that wrote syncs what it
/// wrote, and nothing when it wrote nothing since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_syncs_what_a_closed_handle_wrote() {
    use madfs_client::{Opcode, OpenOptions};
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let fsyncs =
        |since: &madfs_client::RequestCounts| c.request_counts().since(since).get(Opcode::Fsync);
    // A chunk on each of several servers.
    let data = pattern(11, (SERVERS as u64 * CHUNK) as usize);
    let w = c
        .open("/later", OpenOptions::new().write(true).create(true))
        .await
        .unwrap();
    w.write_at(0, &data).await.unwrap();
    w.close().await.unwrap();
    drop(w);
    let r = c
        .open("/later", OpenOptions::new().read(true))
        .await
        .unwrap();
    let written: std::collections::BTreeSet<_> = (0..SERVERS as u32)
        .map(|k| madfs_types::chunk_server(r.attr().ino, madfs_client::ChunkIndex(k), SERVERS))
        .collect();
    let before = c.request_counts();
    r.fsync().await.unwrap();
    assert_eq!(
        fsyncs(&before),
        written.len() as u64,
        "every server written to"
    );
    // Another client, which wrote nothing of it: the file's servers.
    let other = tc.client();
    let r2 = other
        .open("/later", OpenOptions::new().read(true))
        .await
        .unwrap();
    let before = other.request_counts();
    r2.fsync().await.unwrap();
    assert_eq!(
        other.request_counts().since(&before).get(Opcode::Fsync),
        written.len() as u64,
        "another client's fsync: every server holding the file's chunks"
    );
    // A writer syncs what it wrote since its last fsync.
    let w = c
        .open("/later", OpenOptions::new().write(true))
        .await
        .unwrap();
    w.write_at(0, b"x").await.unwrap();
    let before = c.request_counts();
    w.fsync().await.unwrap();
    assert_eq!(fsyncs(&before), 1, "the one server written to");
    let before = c.request_counts();
    w.fsync().await.unwrap();
    assert_eq!(fsyncs(&before), 0, "nothing written since");
    w.close().await.unwrap();
    let mut expected = data;
    expected[0] = b'x';
    assert!(c.read_file("/later").await.unwrap() == expected);
}
