//! Replicas (cluster file `replicas = 2`, issue 16): every change a server
//! makes reaches the copy its replica keeps, before the client is answered.
//!
//! - A workload of every kind of change (directories, inline and striped
//!   files, overwrites, truncates, renames across servers, hard links,
//!   unlinks that purge chunks, fsync) runs through the client library on
//!   4 servers; with the servers stopped, each server's metadata store and
//!   chunk files equal, key for key and byte for byte, its replica's copy
//!   (DATA/server-B/replica-of-S).
//! - Servers killed (kill -9) one after the other, a voter of the
//!   membership group among them, are failed over to their replicas, and
//!   every acknowledged file reads back as written; with 3 copies on 5
//!   servers (5 voters), two killed at once, both voters.

mod common;
#[path = "common/mount.rs"]
mod mount;

use common::placement::name_on;
use common::{pattern, Options, TestCluster};
use madfs_kv::{KvStore, RocksStore};
use mount::Mount;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const SERVERS: usize = 4;

/// Every key and value of the RocksDB under `dir`, but the copy's own
/// bookkeeping.
fn all_keys(dir: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let kv = RocksStore::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out = BTreeMap::new();
    kv.scan_visit(b"", b"", &mut |k, v| {
        // The copy's position, the primary's clean-stop marker, the boot
        // it was served in (restart.rs) and the copies it waits for
        // (replication.rs) are each store's own bookkeeping.
        if !matches!(
            k,
            b"METAreplica_position"
                | b"METAstream_stopped"
                | b"METAserved_in_boot"
                | b"METAwaited_copies"
        ) {
            out.insert(k.to_vec(), v.to_vec());
        }
        true
    })
    .unwrap();
    out
}

/// Every file under `dir` (relative path -> contents).
fn all_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// What the workload leaves: path -> contents.
type Expected = Vec<(String, Vec<u8>)>;

async fn workload(c: &madfs_client::Client) -> Expected {
    let chunk = common::CHUNK as usize;
    for d in ["/a", "/b", "/a/deep", "/a/deep/er"] {
        c.mkdir(d, 0o755).await.unwrap();
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..24u64 {
        let len = match i % 4 {
            0 => 100,              // inline
            1 => 70_000,           // past the inline limit, one chunk
            2 => 3 * chunk + 4321, // striped over several servers
            _ => 0,
        };
        let path = format!("/a/f{i}");
        let data = pattern(i, len);
        c.write_file(path.as_str(), &data).await.unwrap();
        files.push((path, data));
    }
    // Overwrite the middle of a striped file, truncate others.
    let (p, mut d) = files[2].clone();
    let f = c
        .open(p.as_str(), madfs_client::OpenOptions::new().write(true))
        .await
        .unwrap();
    let patch = pattern(99, chunk);
    f.write_at(chunk as u64 / 2, &patch).await.unwrap();
    f.fsync().await.unwrap();
    f.close().await.unwrap();
    d[chunk / 2..chunk / 2 + chunk].copy_from_slice(&patch);
    files[2].1 = d;
    for i in [6usize, 10] {
        let keep = chunk + 17;
        c.truncate(files[i].0.as_str(), keep as u64).await.unwrap();
        files[i].1.truncate(keep);
    }
    // Renames across directories (and servers), hard links, unlinks.
    for (i, f) in files.iter_mut().enumerate().take(8) {
        let to = format!("/b/g{i}");
        c.rename(f.0.as_str(), to.as_str()).await.unwrap();
        f.0 = to;
    }
    c.rename("/a/deep", "/b/deep").await.unwrap();
    c.hard_link(files[9].0.as_str(), "/b/deep/er/link9")
        .await
        .unwrap();
    files.push(("/b/deep/er/link9".into(), files[9].1.clone()));
    for i in [13usize, 14, 18] {
        c.remove_file(files[i].0.as_str()).await.unwrap();
    }
    let gone = [13usize, 14, 18];
    let files: Vec<_> = files
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(i))
        .map(|(_, f)| f)
        .collect();
    c.symlink("/b/g2", "/b/sym").await.unwrap();
    files
}

#[test]
fn every_change_reaches_the_replicas_copy_key_for_key_and_byte_for_byte() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    rt.block_on(workload(&c));
    drop(c);

    // Stopped cleanly, one after the other (each waits for its replica to
    // take its last records, so the replica must still run): the copies
    // equal the originals.
    for i in 0..SERVERS {
        assert!(tc.stop(i).success(), "server {i} exited badly");
    }
    assert_every_copy_equal(tc.config());
}

/// A cluster stopped cleanly, every server at once as `madfs down` does,
/// and started again continues each set's record stream: no copy is
/// loaded again (no copy logs a load's reset), the copies take the writes made after the
/// start, and each equals its primary key for key and byte for byte.
/// Before, every start opened a new stream and every copy was reloaded.
#[test]
fn a_clean_restart_keeps_every_copy_and_continues_the_streams() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/a", 0, 12, &mut files));
    drop(c);
    let holders: Vec<(usize, usize)> = (0..SERVERS)
        .map(|s| {
            let cfg = tc.config();
            let holder = cfg.replica_set(madfs_types::ServerId(s as u16))[1].0 as usize;
            let dir = cfg.servers[holder].data_dir.join(format!("replica-of-{s}"));
            assert!(
                dir.join("meta").is_dir(),
                "no copy of set {s} in {}",
                dir.display()
            );
            (holder, loads_into(&tc, holder, s as u16))
        })
        .collect();

    stop_all_cleanly(&mut tc);
    tc.start_all_again();
    let c = tc.client();
    let in_sync = || copies_in_sync(&rt, &c);
    rt.block_on(read_back(&c, &files));
    rt.block_on(write_round(&c, "/b", 100, 12, &mut files));
    wait_all_in_sync(&in_sync, 30, "after the restart");
    rt.block_on(read_back(&c, &files));
    drop(c);
    for (s, &(holder, loads)) in holders.iter().enumerate() {
        assert_eq!(
            loads_into(&tc, holder, s as u16),
            loads,
            "the copy of set {s} was loaded again after a clean restart"
        );
    }
    stop_all_cleanly(&mut tc);
    assert_every_copy_equal(tc.config());
}

/// A replica cut off for a while (SIGSTOP: no crash, its copy stays
/// whole in memory) leaves its set, and when it answers again the records
/// it missed are replayed from where it stopped: its copy is not loaded
/// again (it logs no load's reset), and it ends equal
/// to its primary key for key and byte for byte. Before, the primary kept
/// nothing for a replica out of the set, and every return was a whole load.
/// Calls waiting on the hung server (it is also set 3's primary) follow
/// the failover instead of waiting out the call timeout.
#[test]
fn a_replica_cut_off_for_a_while_gets_the_records_it_missed_not_a_load() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/a", 0, 12, &mut files));
    // Server 3 (not a voter) keeps the copy of set 2.
    let copy = {
        let cfg = tc.config();
        assert_eq!(cfg.replica_set(madfs_types::ServerId(2))[1].0, 3);
        cfg.servers[3].data_dir.join("replica-of-2")
    };
    assert!(copy.join("meta").is_dir());
    let loads = loads_into(&tc, 3, 2);
    let in_sync = || copies_in_sync(&rt, &c);

    let pid = tc.pid(3) as i32;
    // SAFETY: signalling a child we started and have not reaped.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let cut = std::time::Instant::now();
    // Writes go on once the group took it out (sets 2 and 3 with one
    // copy), and calls that were waiting on the hung server follow set 3
    // to server 0 rather than wait out their timeout (120 s).
    rt.block_on(write_round(&c, "/b", 100, 12, &mut files));
    let waited = cut.elapsed();
    eprintln!("writes went on {waited:?} after server 3 stopped answering");
    assert!(
        waited < std::time::Duration::from_secs(60),
        "writes waited {waited:?}: for the call timeout, not the failover"
    );
    while in_sync().get(2) != Some(&1) {
        assert!(
            cut.elapsed() < std::time::Duration::from_secs(30),
            "server 3 not taken out of set 2: {:?}",
            in_sync()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    rt.block_on(write_round(&c, "/c", 200, 12, &mut files));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let resumed = std::time::Instant::now();
    wait_all_in_sync(&in_sync, 60, "after server 3 answered again");
    eprintln!(
        "server 3 was in sync again {:?} after it answered again",
        resumed.elapsed()
    );
    rt.block_on(read_back(&c, &files));
    drop(c);
    assert_eq!(
        loads_into(&tc, 3, 2),
        loads,
        "server 3's copy of set 2 was loaded again"
    );
    // All at once (as `madfs down`): none is failed over meanwhile.
    stop_all_cleanly(&mut tc);
    assert_same_store(2, &tc.config().servers[2].data_dir, &copy);
}

/// A server that serves another server's set from its copy (after a
/// failover) and is then cut off for a while (SIGSTOP) loses the set; when
/// it answers again, its copy of that set takes records again and comes
/// back in sync. Before, the deposed set's `Server` kept its store, and
/// RocksDB's lock on the copy's directory, for its background loops'
/// pauses (up to a minute): the copy could not be opened ("lock hold by
/// current process"), the resync gave up after its 10 tries, and the set
/// stayed at one copy until the process restarted.
#[test]
fn a_server_deposed_from_a_set_it_served_from_its_copy_gets_the_copy_back_in_sync() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/a", 0, 8, &mut files));
    assert_eq!(tc.config().replica_set(madfs_types::ServerId(1))[1].0, 2);
    let serving = |set: usize| {
        rt.block_on(c.cluster_routes())
            .ok()
            .map(|r| r.serving[set].0)
    };
    let wait_serving = |set: usize, what: &str, ok: &dyn Fn(u16) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !serving(set).is_some_and(ok) {
            assert!(
                std::time::Instant::now() < deadline,
                "set {set} not {what}: {:?}",
                serving(set)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let in_sync = || copies_in_sync(&rt, &c);

    tc.kill9(1);
    rt.block_on(write_round(&c, "/b", 100, 8, &mut files));
    wait_serving(1, "served by server 2", &|s| s == 2);
    tc.restart(1);
    wait_all_in_sync(&in_sync, 60, "after server 1 came back");

    let pid = tc.pid(2) as i32;
    // SAFETY: signalling a child we started and have not reaped.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    rt.block_on(write_round(&c, "/c", 200, 8, &mut files));
    wait_serving(1, "moved away from server 2", &|s| s != 2);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_all_in_sync(&in_sync, 60, "after server 2 answered again");
    rt.block_on(write_round(&c, "/d", 300, 8, &mut files));
    rt.block_on(read_back(&c, &files));
    // Set 1 is served from server 1's copy of it now (its own store was
    // deposed at its restart), and server 2's copy equals it.
    assert_eq!(serving(1), Some(1));
    drop(c);
    stop_all_cleanly(&mut tc);
    let copy = |s: usize| tc.config().servers[s].data_dir.join("replica-of-1");
    assert_same_store(1, &copy(1), &copy(2));
}

/// How many copies of each set are in sync, as the servers say (none
/// where no server answers).
fn copies_in_sync(rt: &tokio::runtime::Runtime, c: &madfs_client::Client) -> Vec<u8> {
    rt.block_on(c.replica_sets())
        .map(|(_, n)| n)
        .unwrap_or_default()
}

/// Wait (at most `secs`) until `in_sync` says every set has its 2 copies.
fn wait_all_in_sync(in_sync: &dyn Fn() -> Vec<u8>, secs: u64, when: &str) {
    wait_in_sync(in_sync, &[2u8; SERVERS], secs, when)
}

/// Wait (at most `secs`) until `in_sync` says each set has the copies
/// `want` gives it.
fn wait_in_sync(in_sync: &dyn Fn() -> Vec<u8>, want: &[u8], secs: u64, when: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while in_sync() != want {
        assert!(
            std::time::Instant::now() < deadline,
            "copies not in sync {when}: {:?}",
            in_sync()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Stop every server at once (as `madfs down`); each must exit cleanly.
fn stop_all_cleanly(tc: &mut TestCluster) {
    for (i, status) in tc.stop_all() {
        assert!(status.success(), "server {i} exited badly: {status}");
    }
}

/// With the servers stopped, every set's store equals its replica's copy.
fn assert_every_copy_equal(cfg: &madfs_client::ClusterConfig) {
    for s in 0..SERVERS {
        let replicas = cfg.replica_set(madfs_types::ServerId(s as u16));
        assert_eq!(replicas.len(), 2);
        assert_same_store(
            s,
            &cfg.servers[s].data_dir,
            &cfg.servers[replicas[1].0 as usize]
                .data_dir
                .join(format!("replica-of-{s}")),
        );
    }
}

/// 4 servers keeping 2 copies of everything, and a runtime for clients.
fn replicated_cluster() -> (TestCluster, tokio::runtime::Runtime) {
    replicated_cluster_with(&[])
}

/// `replicated_cluster` with `env` set for the servers (test seams).
fn replicated_cluster_with(env: &[(&str, &str)]) -> (TestCluster, tokio::runtime::Runtime) {
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            replicas: 2,
            server_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Options::default()
        },
    );
    let rt = client_runtime();
    (tc, rt)
}

/// A runtime for the tests' clients.
fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Write `n` files into directory `dir` (made if missing): small, past
/// the inline limit, and striped over several servers, in turn; each one
/// acknowledged is added to `files`.
async fn write_round(c: &madfs_client::Client, dir: &str, seed: u64, n: u64, files: &mut Expected) {
    c.mkdir_all(dir, 0o755).await.unwrap();
    for i in 0..n {
        let len = [50, 9_000, 2 * common::CHUNK as usize + 77][(i % 3) as usize];
        let p = format!("{dir}/f{i}");
        let data = pattern(seed + i, len);
        c.write_file(p.as_str(), &data)
            .await
            .unwrap_or_else(|e| panic!("writing {p}: {e}"));
        files.push((p, data));
    }
}

/// Every file of `files` reads back as written.
async fn read_back(c: &madfs_client::Client, files: &[(String, Vec<u8>)]) {
    for (p, data) in files {
        let got = c
            .read_file(p.as_str())
            .await
            .unwrap_or_else(|e| panic!("reading {p}: {e}"));
        assert!(
            got == *data,
            "{p}: {} bytes, wanted {}",
            got.len(),
            data.len()
        );
    }
}

/// With replicas, servers dying (kill -9) one after the other, a voter of
/// the membership group among them, cost a pause, not data: the group
/// fails each set over to its replica, the client follows, and every file
/// acknowledged before, during and after reads back as written.
#[test]
fn killed_servers_fail_over_to_their_replicas_and_lose_nothing_acknowledged() {
    let (tc, rt) = replicated_cluster();
    let c = tc.client();
    let chunk = common::CHUNK as usize;
    let mut files: Expected = Vec::new();
    let write = |files: &mut Expected, round: u64, n: u64| {
        rt.block_on(write_round(
            &c,
            &format!("/r{round}"),
            round * 1000,
            n,
            files,
        ))
    };
    let check = |files: &[(String, Vec<u8>)]| rt.block_on(read_back(&c, files));
    write(&mut files, 0, 24);
    let m = Mount::new(&tc);
    // The mount and `madfs run` follow the failovers too.
    let check_clients = |files: &[(String, Vec<u8>)]| {
        for (p, data) in files.iter().step_by(5) {
            let got = std::fs::read(m.join(&p[1..])).unwrap_or_else(|e| panic!("mount {p}: {e}"));
            assert!(got == *data, "{p} through the mount");
            let out = tc.madfs(["run", "--", "cat", &format!("/madfs{p}")]);
            assert!(out.status.success(), "madfs run cat {p}: {out:?}");
            assert!(out.stdout == *data, "{p} through madfs run");
        }
    };
    let kill9 = |i: usize| {
        // SAFETY: a server process this test started (reaped when the
        // cluster is dropped).
        unsafe { libc::kill(tc.pid(i) as i32, libc::SIGKILL) };
    };

    // A storm of creates, striped writes and renames runs while server 3
    // (not a voter) dies; its set moves to its replica, server 0. What the
    // storm was told is done must all be there after.
    let acked: Arc<Mutex<Expected>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let storm = {
        let (acked, stop, sc) = (acked.clone(), stop.clone(), tc.client());
        rt.spawn(async move {
            sc.mkdir("/storm", 0o755).await.unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let len = [100, 2 * chunk + 5, 9_000][(i % 3) as usize];
                let (p, data) = (format!("/storm/f{i}"), pattern(5000 + i, len));
                if sc.write_file(p.as_str(), &data).await.is_ok() {
                    let to = format!("/storm/moved{i}");
                    if i.is_multiple_of(2) {
                        // A failed rename leaves either name, unknown
                        // which: not checked.
                        if let Ok(()) = sc.rename(p.as_str(), to.as_str()).await {
                            acked.lock().unwrap().push((to, data));
                        }
                    } else {
                        acked.lock().unwrap().push((p, data));
                    }
                }
                i += 1;
            }
        })
    };
    let acked_now = || acked.lock().unwrap().len();
    let wait_for = |n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while acked_now() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "the storm stalled at {} files",
                acked_now()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    wait_for(6);
    kill9(3);
    let killed_at = acked_now();
    wait_for(killed_at + 12);
    stop.store(true, Ordering::Relaxed);
    rt.block_on(storm).unwrap();
    files.extend(acked.lock().unwrap().drain(..));
    let t = std::time::Instant::now();
    check(&files);
    eprintln!(
        "after kill -9 of server 3, every file read back in {:?}",
        t.elapsed()
    );
    check_clients(&files);
    write(&mut files, 1, 24);
    check(&files);

    // Server 1 (a voter; 2 of 3 remain) dies; its set moves to server 2.
    kill9(1);
    let t = std::time::Instant::now();
    check(&files);
    eprintln!(
        "after kill -9 of server 1, every file read back in {:?}",
        t.elapsed()
    );
    write(&mut files, 2, 24);
    check(&files);
    check_clients(&files);
    rt.block_on(async {
        let routes = c.routes().await.unwrap();
        assert_eq!(routes[3], madfs_types::ServerId(0), "{routes:?}");
        assert_eq!(routes[1], madfs_types::ServerId(2), "{routes:?}");
    });
}

/// Three copies on five servers, whose membership group has five voters:
/// two servers killed at once (kill -9), both voters and both holding set
/// 0, cost a pause and no data. Every set still has a copy and the group
/// a majority (3 of 5), so sets 0 and 1 fail over to server 2, and every
/// file reads back and takes writes. (With 3 voters, two of them lost
/// stop the whole cluster.) Both come back, catch up, and every set's
/// three copies are then equal key for key and byte for byte.
#[test]
fn three_copies_ride_out_two_lost_servers_voters_among_them() {
    const FIVE: usize = 5;
    let mut tc = TestCluster::start_with(
        FIVE,
        Options {
            replicas: 3,
            ..Options::default()
        },
    );
    let rt = client_runtime();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    let write = |files: &mut Expected, round: u64| {
        rt.block_on(write_round(
            &c,
            &format!("/t{round}"),
            round * 100,
            15,
            files,
        ))
    };
    write(&mut files, 0);
    let mut voters = rt.block_on(c.cluster_routes()).unwrap().voters;
    voters.sort();
    let all: Vec<_> = (0..FIVE as u16).map(madfs_types::ServerId).collect();
    assert_eq!(voters, all, "a cluster of five servers has five voters");

    tc.kill9(0);
    tc.kill9(1);
    let t = std::time::Instant::now();
    rt.block_on(read_back(&c, &files));
    eprintln!(
        "after kill -9 of servers 0 and 1, every file read back in {:?}",
        t.elapsed()
    );
    write(&mut files, 1);
    rt.block_on(read_back(&c, &files));
    let routes = rt.block_on(c.routes()).unwrap();
    assert_eq!(routes[0], madfs_types::ServerId(2), "{routes:?}");
    assert_eq!(routes[1], madfs_types::ServerId(2), "{routes:?}");
    let in_sync = || copies_in_sync(&rt, &c);
    assert_eq!(in_sync()[0], 1, "set 0 runs on its last copy");

    tc.restart(0);
    tc.restart(1);
    write(&mut files, 2);
    let t = std::time::Instant::now();
    wait_in_sync(&in_sync, &[3u8; FIVE], 90, "after the restarts");
    eprintln!(
        "servers 0 and 1 were in sync again {:?} after their restarts",
        t.elapsed()
    );
    let serving = rt.block_on(c.routes()).unwrap();
    stop_all_cleanly(&mut tc);
    let cfg = tc.config().clone();
    for set in 0..FIVE {
        let id = madfs_types::ServerId(set as u16);
        let store = |s: madfs_types::ServerId| {
            let dir = &cfg.servers[s.0 as usize].data_dir;
            if s == id {
                dir.clone()
            } else {
                dir.join(format!("replica-of-{set}"))
            }
        };
        let members = cfg.replica_set(id);
        assert_eq!(members.len(), 3);
        assert!(members.contains(&serving[set]), "{serving:?}");
        for m in members.into_iter().filter(|&m| m != serving[set]) {
            // A server's own store, once its set moved away, is not a
            // copy: the copy it got back is DATA/replica-of-S.
            let copy = cfg.servers[m.0 as usize]
                .data_dir
                .join(format!("replica-of-{set}"));
            assert_same_store(set, &store(serving[set]), &copy);
        }
    }
    tc.start_all_again();
    write(&mut files, 3);
    rt.block_on(read_back(&c, &files));
}

/// A server killed and started again catches up (a resync: a fuzzy copy
/// of the set's store, then the records written meanwhile), is counted in
/// sync again, and can then take its set over when the server that served
/// it in the meantime dies in turn: nothing written before, during or
/// after is lost.
#[test]
fn a_restarted_server_resyncs_and_takes_over_again() {
    // Pages of 2 keys: set 3 takes new keys in most ranges of 8 while
    // server 3 is away.
    let (mut tc, rt) = replicated_cluster_with(&[("MADFS_TEST_LOAD_KEYS_PER_CALL", "2")]);
    let c = tc.client();
    let mut files: Expected = Vec::new();
    let write = |files: &mut Expected, round: u64| {
        rt.block_on(write_round(
            &c,
            &format!("/s{round}"),
            round * 100,
            16,
            files,
        ))
    };
    let check = |files: &Expected| rt.block_on(read_back(&c, files));
    let in_sync = || copies_in_sync(&rt, &c);
    write(&mut files, 0);
    // Server 3 keeps the copy of set 2.
    let copy = tc.config().servers[3].data_dir.join("replica-of-2");
    assert!(copy.join("meta").is_dir());
    let loads = loads_into(&tc, 3, 2);

    // Server 3 dies; set 3 moves to server 0, and sets 2 and 3 are left
    // with one copy each.
    tc.kill9(3);
    check(&files);
    write(&mut files, 1);
    let n = in_sync();
    assert_eq!((n[2], n[3]), (1, 1), "{n:?}");

    // It comes back and catches up on both, while writes go on: its own
    // store is not served again, so set 3 is loaded into a copy, which
    // starts from that store's chunk files and keys (only what changed is
    // sent); its copy of set 2 lost nothing the kernel had (a process
    // died, not the machine), so only the records it missed are replayed.
    tc.restart(3);
    write(&mut files, 2);
    let t = std::time::Instant::now();
    wait_all_in_sync(&in_sync, 60, "after server 3's restart");
    eprintln!(
        "server 3 was in sync again {:?} after its restart",
        t.elapsed()
    );
    assert_eq!(
        loads_into(&tc, 3, 2),
        loads,
        "server 3's copy of set 2 was loaded again after a kill -9"
    );
    assert!(
        bytes_kept_by_load(&tc, 0, 3, 3) > 0,
        "set 3 was sent whole to server 3, which held most of it"
    );
    let (keys, kept) = keys_kept_by_load(&tc, 0, 3, 3);
    assert!(
        kept > 0,
        "every one of set 3's {keys} keys was sent to server 3, whose old store held them"
    );
    stop_all_cleanly(&mut tc);
    let servers = tc.config().servers.clone();
    assert_same_store(2, &servers[2].data_dir, &copy);
    assert_same_store(
        3,
        &servers[0].data_dir.join("replica-of-3"),
        &servers[3].data_dir.join("replica-of-3"),
    );
    tc.start_all_again();
    write(&mut files, 3);

    // Server 0, which served set 3 meanwhile, dies: set 3 goes back to
    // server 3, whose copy must hold everything.
    tc.kill9(0);
    check(&files);
    let routes = rt.block_on(c.routes()).unwrap();
    assert_eq!(routes[3], madfs_types::ServerId(3), "{routes:?}");
    write(&mut files, 4);
    check(&files);
}

/// The keys the last load of set `set` into `replica`'s copy held, and
/// how many of them were in ranges the replica held as they were (kept),
/// from the log of `primary`.
fn keys_kept_by_load(tc: &TestCluster, primary: usize, set: u16, replica: u16) -> (u64, u64) {
    let log = common::tail(&tc.log_path(primary), 4000);
    let loaded = log
        .lines()
        .rev()
        .find(|l| l.contains(&format!("set {set}: server {replica} has the copy")))
        .unwrap_or_else(|| panic!("no load of set {set} on server {replica}:\n{log}"));
    let number = |after: &str| -> u64 {
        loaded
            .split(after)
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count after {after:?} in: {loaded}"))
    };
    (number("has the copy ("), number(" keys, "))
}

/// How many resync loads into server `holder`'s copy of set `set` have
/// started (each begins with a reset the copy logs).
fn loads_into(tc: &TestCluster, holder: usize, set: u16) -> usize {
    let log = std::fs::read_to_string(tc.log_path(holder)).unwrap_or_default();
    let reset = format!("copy of set {set} reset for a resync's load");
    log.lines().filter(|l| l.contains(&reset)).count()
}

/// The chunk bytes the last load of set `set` into `replica`'s copy kept
/// (the replica held them as they were), from the log of `primary`.
fn bytes_kept_by_load(tc: &TestCluster, primary: usize, set: u16, replica: u16) -> u64 {
    let log = common::tail(&tc.log_path(primary), 4000);
    let loaded = log
        .lines()
        .rev()
        .find(|l| l.contains(&format!("set {set}: server {replica} has the copy")))
        .unwrap_or_else(|| {
            panic!("no load of set {set} on server {replica} in server {primary}'s log:\n{log}")
        });
    loaded
        .split("bytes sent, ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no kept bytes in: {loaded}"))
}

/// Every key and chunk file of set `set`'s store under `a` equals the
/// copy under `b` (each a server's layout: meta/ and chunks/).
fn assert_same_store(set: usize, a: &Path, b: &Path) {
    let (mine, theirs) = (all_keys(&a.join("meta")), all_keys(&b.join("meta")));
    assert!(!mine.is_empty(), "set {set}: {} is empty", a.display());
    let differ: Vec<_> = mine
        .iter()
        .filter(|(k, v)| theirs.get(*k) != Some(v))
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .chain(
            theirs
                .keys()
                .filter(|k| !mine.contains_key(*k))
                .map(|k| format!("(only in {}) {}", b.display(), String::from_utf8_lossy(k))),
        )
        .collect();
    assert!(
        differ.is_empty(),
        "set {set}: {} of {} keys differ between {} and {}: {:?}",
        differ.len(),
        mine.len(),
        a.display(),
        b.display(),
        &differ[..differ.len().min(10)]
    );
    let (mine, theirs) = (all_files(&a.join("chunks")), all_files(&b.join("chunks")));
    assert_eq!(
        mine.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "set {set}: chunk files"
    );
    for (p, bytes) in &mine {
        assert!(
            &theirs[p] == bytes,
            "set {set}: chunk {} differs",
            p.display()
        );
    }
}

/// Wait (at most 90 s) until every set has its 2 copies in sync again,
/// writing two more rounds into /p{round}.. meanwhile; the last line of
/// `madfs status` that showed a rebuild under way.
fn wait_rebuilt(
    tc: &TestCluster,
    rt: &tokio::runtime::Runtime,
    c: &madfs_client::Client,
    files: &mut Expected,
    mut round: u64,
) -> String {
    let in_sync = || copies_in_sync(rt, c);
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let last_round = round + 2;
    while in_sync() != vec![2u8; SERVERS] {
        assert!(
            std::time::Instant::now() < deadline,
            "the replacement was not rebuilt: {:?}",
            in_sync(),
        );
        if round < last_round {
            rt.block_on(write_round(
                c,
                &format!("/p{round}"),
                round * 100,
                16,
                files,
            ));
            round += 1;
        }
        let status = String::from_utf8_lossy(&tc.madfs(["status"]).stdout).into_owned();
        if let Some(line) = status.lines().find(|l| l.contains("rebuilding set")) {
            seen = line.trim().to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    seen
}

/// A lost server (killed, its disk gone) is replaced by a new process at
/// another address with an empty data directory (`madfs server
/// --replace`): it waits until the cluster gave the old one up, moves the
/// id, and is rebuilt from the surviving copies while writes go on, with
/// the progress in `madfs status`. Rebuilt, its copies equal the
/// originals key for key and byte for byte, and when the server that
/// served its set dies in turn, it serves the set, reached at its new
/// address by a client that only has the old cluster file.
#[test]
fn a_replacement_takes_over_a_lost_servers_id_and_is_rebuilt_byte_for_byte() {
    // Slow enough that `madfs status` sees the rebuild under way.
    let (mut tc, rt) = replicated_cluster_with(&[("MADFS_FAULT_REBUILD_PIECE_PAUSE_MS", "150")]);
    let c = tc.client();
    let mut files: Expected = Vec::new();
    let write = |files: &mut Expected, round: u64| {
        rt.block_on(write_round(
            &c,
            &format!("/p{round}"),
            round * 100,
            16,
            files,
        ))
    };
    write(&mut files, 0);
    write(&mut files, 1);

    // Server 3 (not a voter) is lost with its disk; set 3 moves to its
    // replica, server 0.
    tc.kill9(3);
    let old_dir = tc.config().servers[3].data_dir.clone();
    std::fs::remove_dir_all(&old_dir).unwrap();
    write(&mut files, 2);

    // A replacement on a data directory that holds files is refused.
    let used = tc.root().join("used");
    std::fs::create_dir_all(used.join("meta")).unwrap();
    let out = tc.madfs([
        "server",
        "--id",
        "3",
        "--replace",
        "--data-dir",
        used.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("empty data directory"), "{err}");

    let t = std::time::Instant::now();
    let (addr, new_dir) = tc.replace(3);
    // Writes go on during the rebuild; `madfs status` shows it under way.
    let seen_rebuild = wait_rebuilt(&tc, &rt, &c, &mut files, 3);
    eprintln!(
        "the replacement was in sync {:?} after it started; status said: {seen_rebuild}",
        t.elapsed()
    );
    assert!(
        seen_rebuild.contains("on server 3") && seen_rebuild.contains("of chunk data"),
        "madfs status never showed the rebuild: {seen_rebuild:?}"
    );
    let status = String::from_utf8_lossy(&tc.madfs(["status"]).stdout).into_owned();
    let row = status
        .lines()
        .find(|l| l.starts_with("3 "))
        .unwrap_or_else(|| panic!("no row for server 3:\n{status}"));
    assert!(row.contains(&addr.to_string()), "{status}");
    rt.block_on(read_back(&c, &files));

    // Server 0, which served set 3 since the loss, dies: set 3 goes to the
    // replacement. A new client, from the cluster file that still names
    // the old address, finds it.
    tc.kill9(0);
    let fresh = tc.client();
    rt.block_on(read_back(&fresh, &files));
    let routes = rt.block_on(fresh.cluster_routes()).unwrap();
    assert_eq!(routes.serving[3], madfs_types::ServerId(3), "{routes:?}");
    assert!(
        routes.addresses.contains(&(madfs_types::ServerId(3), addr)),
        "{routes:?}"
    );

    // Byte for byte: set 2 (served by server 2) and its copy on the
    // replacement, and set 3 as server 0 left it and as the replacement
    // serves it now (nothing was written to it since).
    drop((c, fresh));
    for i in [1, 2, 3] {
        assert!(tc.stop(i).success(), "server {i} exited badly");
    }
    let cfg = tc.config().clone();
    assert_same_store(2, &cfg.servers[2].data_dir, &new_dir.join("replica-of-2"));
    assert_same_store(
        3,
        &cfg.servers[0].data_dir.join("replica-of-3"),
        &new_dir.join("replica-of-3"),
    );
}

/// A lost voter of the membership group is replaced too: its replacement
/// joins the group as a new node in place of the old one (never as the
/// old node, whose votes it does not know), so the group keeps a
/// majority when a second original voter dies afterwards, and still fails
/// that server's set over.
#[test]
fn a_lost_voter_is_replaced_and_the_group_survives_the_next_loss() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/v0", 0, 16, &mut files));

    // Voter 1 is lost with its disk, and replaced at a new address.
    tc.kill9(1);
    std::fs::remove_dir_all(&tc.config().servers[1].data_dir).unwrap();
    rt.block_on(write_round(&c, "/v1", 100, 16, &mut files));
    let (addr, _) = tc.replace(1);
    wait_rebuilt(&tc, &rt, &c, &mut files, 2);
    let log = common::tail(&tc.log_path(1), 200);
    assert!(
        log.contains("a voter of the membership group again"),
        "the replacement did not become a voter:\n{log}"
    );

    // Voter 2, an original, dies: voters 0 and the replacement of 1 are
    // the majority that fails set 2 over to its replica (server 3).
    tc.kill9(2);
    rt.block_on(read_back(&c, &files));
    rt.block_on(write_round(&c, "/v9", 900, 16, &mut files));
    rt.block_on(read_back(&c, &files));
    let routes = rt.block_on(c.cluster_routes()).unwrap();
    assert_eq!(routes.serving[2], madfs_types::ServerId(3), "{routes:?}");
    assert!(
        routes.addresses.contains(&(madfs_types::ServerId(1), addr)),
        "{routes:?}"
    );
}

/// A voter lost for good and never replaced: after `voter_lost_after`
/// (3 s here) the leader asks a live server that is no voter to take its
/// place, so the group keeps a majority when a second original voter
/// dies (without the move, one voter of three is left and no set of the
/// second one would ever fail over). The new voter, restarted, starts its
/// node again from its own directory and counts in the quorum.
#[test]
fn a_voter_lost_for_good_moves_to_a_live_server_and_the_group_survives_the_next_loss() {
    // 6 servers: sets are [s, s+1], voters 0, 1 and 2; losing 0 and 2
    // leaves every set a copy (set 1 is [1, 2]; set 5 is [5, 0]).
    let mut tc = voter_moving_cluster(6);
    let rt = client_runtime();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/m0", 0, 16, &mut files));

    tc.kill9(0);
    rt.block_on(write_round(&c, "/m1", 100, 16, &mut files));
    let moved = "a voter of the membership group in place of server 0";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let promoted = loop {
        if let Some(s) = (3..6).find(|&s| common::tail(&tc.log_path(s), 400).contains(moved)) {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no server took voter 0's place in 90 s; server 3's log:\n{}",
            common::tail(&tc.log_path(3), 60)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(promoted, 3, "the lowest live server that is no voter");
    // The servers say so, and `madfs status` shows it (pings bring the
    // voters to every server: wait for the one that answers).
    voters_become(&tc, &rt, &c, [1, 2, 3]);
    let status = String::from_utf8_lossy(&tc.madfs(["status"]).stdout).into_owned();
    assert!(status.contains("membership voters: servers "), "{status}");

    // Voter 2 dies: voters 1 and 3 fail set 2 over to server 3.
    tc.kill9(2);
    rt.block_on(read_back(&c, &files));
    rt.block_on(write_round(&c, "/m2", 200, 16, &mut files));
    let routes = rt.block_on(c.cluster_routes()).unwrap();
    assert_eq!(routes.serving[2], madfs_types::ServerId(3), "{routes:?}");

    // The new voter restarts: its node comes back from its directory (the
    // cluster file does not list it as a voter), and with it a majority.
    assert!(tc.stop(3).success(), "server 3 exited badly");
    tc.restart(3);
    rt.block_on(write_round(&c, "/m3", 300, 16, &mut files));
    let again = "a voter of the membership group again after a restart";
    let log = common::tail(&tc.log_path(3), 400);
    assert!(log.contains(again), "{log}");
    rt.block_on(read_back(&c, &files));
}

/// A voter whose place moved while it was away comes back with a Raft node
/// the group no longer counts. When the next voter is lost for good and it
/// is the only server that is no voter, it leaves that node behind and
/// takes the place as a new one (it declined before, and the group stayed
/// at two voters, one loss from stopping every failover).
#[test]
fn a_voter_whose_place_moved_takes_the_next_lost_voters_place() {
    // 4 servers: voters 0, 1 and 2; server 3 the only other.
    let mut tc = voter_moving_cluster(4);
    let rt = client_runtime();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/v0", 0, 8, &mut files));
    tc.kill9(0);
    voters_become(&tc, &rt, &c, [1, 2, 3]);
    // Server 0 comes back with its old node, which counts for nothing.
    tc.restart(0);
    rt.block_on(write_round(&c, "/v1", 100, 8, &mut files));

    tc.kill9(2);
    voters_become(&tc, &rt, &c, [0, 1, 3]);
    let log = common::tail(&tc.log_path(0), 400);
    assert!(log.contains("leaving node incarnation 0 behind"), "{log}");
    assert!(
        log.contains("a voter of the membership group in place of server 2"),
        "{log}"
    );
    rt.block_on(write_round(&c, "/v2", 200, 8, &mut files));
    rt.block_on(read_back(&c, &files));

    // Restarted, server 0 is the new node again, a voter.
    assert!(tc.stop(0).success(), "server 0 exited badly");
    tc.restart(0);
    rt.block_on(write_round(&c, "/v3", 300, 8, &mut files));
    voters_become(&tc, &rt, &c, [0, 1, 3]);
    let log = common::tail(&tc.log_path(0), 400);
    assert!(
        log.contains("a voter of the membership group again after a restart"),
        "{log}"
    );
    rt.block_on(read_back(&c, &files));
}

/// `servers` servers keeping 2 copies, whose leader moves a voter silent
/// for 3 s to a live server (voters 0, 1 and 2, also with 5 servers or
/// more).
fn voter_moving_cluster(servers: usize) -> TestCluster {
    TestCluster::start_with(
        servers,
        Options {
            replicas: 2,
            voters: Some(3),
            server_env: vec![("MADFS_TEST_VOTER_LOST_AFTER_MS".into(), "3000".into())],
            ..Options::default()
        },
    )
}

/// Wait (90 s at most) until the servers name `wanted` as the voters.
fn voters_become(
    tc: &TestCluster,
    rt: &tokio::runtime::Runtime,
    c: &madfs_client::Client,
    wanted: [u16; 3],
) {
    let wanted = wanted.map(madfs_types::ServerId).to_vec();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let mut v = rt
            .block_on(c.cluster_routes())
            .map(|r| r.voters)
            .unwrap_or_default();
        v.sort();
        if v == wanted {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "voters {v:?}, not {wanted:?}; server 0's log:\n{}",
            common::tail(&tc.log_path(0), 60)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Writes racing over the same bytes reach the replica in the order they
/// reached the primary's disk: after many clients overwrite one range at
/// once, the replica's copy equals the primary's byte for byte (it would
/// otherwise keep another writer's bytes than the primary served).
#[test]
fn racing_writes_to_the_same_bytes_leave_the_copy_equal_to_the_primary() {
    // A wider window between a write's disk and its record.
    let (mut tc, rt) = replicated_cluster_with(&[("MADFS_FAULT_MIRROR_PAUSE_US", "10000")]);
    let c = tc.client();
    let chunk = common::CHUNK as usize;
    rt.block_on(c.write_file("/race", &pattern(1, 3 * chunk)))
        .unwrap();
    // Round by round, 8 writers overwrite one region (4 per chunk) at the
    // same moment, each with its own bytes: the region keeps whichever
    // the disk applied last, and so must the copy.
    const WRITERS: usize = 8;
    let start = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let writers: Vec<_> = (0..WRITERS as u64)
        .map(|w| {
            let (c, start) = (tc.client(), start.clone());
            rt.spawn(async move {
                let f = c
                    .open("/race", madfs_client::OpenOptions::new().write(true))
                    .await
                    .unwrap();
                for region in 0..12u64 {
                    let at = (region / 4) * chunk as u64 + (region % 4) * 128 * 1024;
                    start.wait().await;
                    f.write_at(at, &pattern(w * 1000 + region, 64 * 1024))
                        .await
                        .unwrap();
                }
                f.close().await.unwrap();
            })
        })
        .collect();
    for w in writers {
        rt.block_on(w).unwrap();
    }
    drop(c);
    for i in 0..SERVERS {
        assert!(tc.stop(i).success(), "server {i} exited badly");
    }
    assert_every_copy_equal(tc.config());
}

/// A server whose disk fails hands its set to its replica instead of
/// answering EIO from then on: server 3 alone gets the test fault that
/// fails its fifth sync pass (which poisons its store, as a real failed
/// fsync does). Writes and syncs go on until set 3 has moved, and none of
/// them fails: the ones the failed store refused wait for the set to move
/// and are done by the replica, which holds every acknowledged change.
/// Every file reads back, and set 3 takes writes again.
#[test]
fn a_server_whose_disk_fails_hands_its_set_to_its_replica() {
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            replicas: 2,
            server_env_for: vec![(3, "MADFS_FAULT_FSYNC_FAIL_AFTER".into(), "4".into())],
            ..Options::default()
        },
    );
    let rt = client_runtime();
    let c = tc.client();
    let set3 = madfs_types::ServerId(3);
    let mut files: Expected = Vec::new();
    rt.block_on(c.mkdir("/disk", 0o755)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut i = 0u64;
    while rt.block_on(c.routes()).unwrap()[3] == set3 {
        assert!(
            std::time::Instant::now() < deadline,
            "set 3 never moved; server 3's log:\n{}",
            common::tail(&tc.log_path(3), 20)
        );
        let (p, data) = (
            format!("/disk/f{i}"),
            pattern(7000 + i, 3 * 1024 + i as usize),
        );
        rt.block_on(c.write_file(p.as_str(), &data))
            .unwrap_or_else(|e| panic!("writing {p}: {e}"));
        files.push((p, data));
        rt.block_on(c.fsync_servers(&[set3]))
            .unwrap_or_else(|e| panic!("fsync after {i} writes: {e}"));
        i += 1;
    }
    eprintln!("set 3 moved after {i} writes and syncs");
    let log = common::tail(&tc.log_path(3), 200);
    assert!(log.contains("this store is unusable"), "{log}");
    rt.block_on(read_back(&c, &files));
    rt.block_on(write_round(&c, "/after", 9000, 16, &mut files));
    rt.block_on(c.fsync_servers(&[set3])).unwrap();
    rt.block_on(read_back(&c, &files));
}

/// A server whose disk was lost and that comes back at once, before the
/// cluster failed it over, finds a replica holding its set's data and
/// starts as a replacement (as `--replace`): it never serves its empty
/// store as the set, so no acknowledged file goes missing, and it is
/// rebuilt from the copies.
#[test]
fn a_server_back_at_once_on_an_empty_disk_is_rebuilt_not_served_empty() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/e0", 0, 16, &mut files));
    tc.kill9(3);
    std::fs::remove_dir_all(&tc.config().servers[3].data_dir).unwrap();
    tc.start_again(3);
    rt.block_on(read_back(&c, &files));
    rt.block_on(write_round(&c, "/e1", 100, 16, &mut files));
    wait_rebuilt(&tc, &rt, &c, &mut files, 2);
    rt.block_on(read_back(&c, &files));
    let log = common::tail(&tc.log_path(3), 200);
    assert!(log.contains("starting as a replacement"), "{log}");
}

/// A primary back at once from a power loss, before its set failed over,
/// may lack writes its copy acknowledged (unsynced pages the loss took):
/// it hands its set to the copy and is rebuilt from there, never serving
/// what it lost. The loss is made by hand: after kill -9 every chunk file
/// of server 3's own store is emptied, and it comes back in "another boot"
/// (`MADFS_TEST_BOOT_ID`) well before its set would fail over (a 20 s
/// `down_after`). Served from its own store, the files read back as zeros.
#[test]
fn a_primary_back_at_once_from_a_power_loss_hands_its_set_to_its_copy() {
    let slow_failover = ("MADFS_TEST_DOWN_AFTER_MS", "20000");
    let (mut tc, rt) = replicated_cluster_with(&[slow_failover]);
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/p0", 0, 24, &mut files));
    tc.kill9(3);
    let emptied = empty_files_under(&tc.config().servers[3].data_dir.join("chunks"));
    assert!(emptied > 0, "server 3 kept no chunk file of its own");
    tc.set_server_env(&[slow_failover, ("MADFS_TEST_BOOT_ID", "after a power loss")]);
    let back = std::time::Instant::now();
    tc.start_again(3);
    rt.block_on(read_back(&c, &files));
    eprintln!(
        "every file read back {:?} after server 3 came back ({emptied} chunk files emptied)",
        back.elapsed()
    );
    let routes = rt.block_on(c.routes()).unwrap();
    assert_eq!(routes[3], madfs_types::ServerId(0), "{routes:?}");
    let log = common::tail(&tc.log_path(3), 200);
    assert!(log.contains("came back from a power loss"), "{log}");
    // It catches up on its set from the copy, and every file stays.
    rt.block_on(write_round(&c, "/p1", 100, 16, &mut files));
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 60, "after server 3's return");
    rt.block_on(read_back(&c, &files));
}

/// Two faults inside a hand-over: server 3 is back at once from a power
/// loss (its chunk files emptied by hand, "another boot"), and server 0,
/// the copy of its set that has every acknowledged write, is killed before
/// it can take the set. The group takes server 0 out of set 3 (a short
/// `down_after`, longer than server 3's restart); server 3, alone in the
/// set, keeps it unavailable rather than serve what it lost (before:
/// the files read back as zeros). Server 3 is then killed and started
/// again while it waits: its first look now shows it alone in the set, and
/// only the list of copies its store kept (`META_WAITED_COPIES`) says
/// server 0 is owed (before that list, the set was served and the file
/// read back as zeros; the replicated simulation with 4 servers, seed
/// 17018, where the group took the copy out before the first look). Once
/// server 0 is back with its copy whole, server 3 hands the set to it
/// (`HandBack`), and every file reads back as written.
#[test]
fn a_held_set_waits_for_its_copy_taken_out_while_down_and_goes_to_it() {
    let failover = ("MADFS_TEST_DOWN_AFTER_MS", "8000");
    let (mut tc, rt) = replicated_cluster_with(&[failover]);
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/held", 0, 12, &mut files));
    let on_3 = format!("/{}", name_on(3, SERVERS, "h"));
    let data = pattern(77, 300_000);
    rt.block_on(c.write_file(on_3.as_str(), &data)).unwrap();
    files.push((on_3.clone(), data.clone()));
    tc.kill9(3);
    tc.kill9(0);
    let emptied = empty_files_under(&tc.config().servers[3].data_dir.join("chunks"));
    assert!(emptied > 0, "server 3 kept no chunk file of its own");
    tc.set_server_env(&[failover, ("MADFS_TEST_BOOT_ID", "after a power loss")]);
    let waits = "set 3 waits for a copy taken out while down ([ServerId(0)])";
    let log_3 = tc.log_path(3);
    let waited = || std::fs::read_to_string(&log_3).map_or(0, |l| l.matches(waits).count());
    for run in ["back", "restarted while it waits"] {
        let before = waited();
        tc.start_again(3);
        if run == "back" {
            // Server 0 is taken out of set 3 (and set 0 fails over to
            // server 1).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while copies_in_sync(&rt, &c).get(3) != Some(&1) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "server 0 never left set 3: {:?}",
                    copies_in_sync(&rt, &c)
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while waited() == before {
            assert!(
                std::time::Instant::now() < deadline,
                "server 3 ({run}) does not wait for server 0:\n{}",
                common::tail(&tc.log_path(3), 200)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let out = std::process::Command::new(common::MADFS)
            .args(["cat", on_3.as_str()])
            .env("MADFS_CLUSTER", tc.cluster_file())
            .env("MADFS_FAILOVER_WAIT_MS", "3000")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run madfs");
        assert!(
            !out.status.success(),
            "set 3 was served ({run}) from the store that lost its chunk files \
             ({} bytes read, {} zero)",
            out.stdout.len(),
            out.stdout.iter().filter(|&&b| b == 0).count()
        );
        // The operator sees which copy the set waits for.
        let status = std::process::Command::new(common::MADFS)
            .arg("status")
            .env("MADFS_CLUSTER", tc.cluster_file())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run madfs status");
        let shown = String::from_utf8_lossy(&status.stdout);
        assert!(
            shown.contains("server 3 holds set 3")
                && shown.contains("waits for the copy on server 0"),
            "madfs status ({run}) does not say what set 3 waits for:\n{shown}"
        );
        if run == "back" {
            tc.kill9(3);
        }
    }
    tc.set_server_env(&[failover]);
    tc.start_again(0);
    rt.block_on(read_back(&c, &files));
    let routes = rt.block_on(c.routes()).unwrap();
    assert_eq!(routes[3], madfs_types::ServerId(0), "{routes:?}");
    // Server 3 catches up from there, and every file stays.
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 90, "after the hand-back");
    rt.block_on(read_back(&c, &files));
}

/// A copy back at once from a power loss, at a position no sync wrote,
/// may lack records it acknowledged: it must not stay counted in sync,
/// where the next failover of its set would serve it (crates/sim seed
/// 12107). Server 1 keeps the copy of set 0; a power loss takes what some
/// of its chunk files held, changes a byte of another, and leaves a chunk
/// file set 0 never had. It leaves set 0's in-sync members at its start and
/// is loaded again, so once every set is in sync, its copy equals server
/// 0's store byte for byte. (Before the fix it stayed in sync with its
/// emptied chunk files until a record of set 0 came, and none comes here
/// before the stop.) The load compares chunk files by digest: those the
/// power loss left alone are kept, not sent again (before, every chunk
/// file was wiped and sent).
#[test]
fn a_copy_back_at_once_from_a_power_loss_leaves_the_set_and_is_loaded_again() {
    let slow_failover = ("MADFS_TEST_DOWN_AFTER_MS", "20000");
    // Pages of 8 keys: the store spans ranges enough to keep some.
    let small_pages = ("MADFS_TEST_LOAD_KEYS_PER_CALL", "8");
    let (mut tc, rt) = replicated_cluster_with(&[slow_failover, small_pages]);
    assert_eq!(
        tc.config().replica_set(madfs_types::ServerId(0)),
        vec![madfs_types::ServerId(0), madfs_types::ServerId(1)]
    );
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/p0", 0, 24, &mut files));
    tc.kill9(1);
    let copy = tc.config().servers[1].data_dir.join("replica-of-0");
    let held = all_files(&copy.join("chunks"));
    assert!(
        held.len() >= 4,
        "server 1 kept {} chunk files of set 0",
        held.len()
    );
    // Every other file emptied, one byte of another changed.
    let mut emptied = 0;
    let mut kept_bytes = 0u64;
    for (n, (p, bytes)) in held.iter().enumerate() {
        let path = copy.join("chunks").join(p);
        if n % 2 == 0 {
            std::fs::write(&path, b"").unwrap();
            emptied += 1;
        } else if n == 1 {
            let mut changed = bytes.clone();
            changed[0] ^= 0xff;
            std::fs::write(&path, changed).unwrap();
        } else {
            kept_bytes += bytes.len() as u64;
        }
    }
    // Its metadata too: a key set 0 never had, a value changed, a key
    // gone.
    let (changed, gone) = {
        let kv = RocksStore::open(&copy.join("meta")).unwrap();
        let mut inodes = Vec::new();
        kv.scan_visit(b"INOD", b"", &mut |k, _| {
            inodes.push(k.to_vec());
            true
        })
        .unwrap();
        assert!(inodes.len() >= 4, "{} inodes in the copy", inodes.len());
        let (changed, gone) = (inodes[1].clone(), inodes[inodes.len() - 2].clone());
        let mut b = madfs_kv::WriteBatch::new();
        b.put(b"INOD-never-set-0s", b"stray");
        b.put(&changed, b"not the inode");
        b.delete(&gone);
        kv.write(b, true).unwrap();
        (changed, gone)
    };
    let stray = copy.join("chunks/00/00000000000fffff/3");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"never set 0's").unwrap();
    tc.set_server_env(&[slow_failover, ("MADFS_TEST_BOOT_ID", "after a power loss")]);
    tc.start_again(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let log = common::tail(&tc.log_path(1), 400);
        if log.contains("the copy of set 0 may lack records") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server 1 stayed in set 0 with a copy that lost {emptied} chunk files:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 60, "after server 1's return");
    let kept = bytes_kept_by_load(&tc, 0, 0, 1);
    assert_eq!(
        kept, kept_bytes,
        "the load kept other bytes than those of the untouched files"
    );
    // Only the ranges of keys the power loss changed were sent again.
    let (keys, keys_kept) = keys_kept_by_load(&tc, 0, 0, 1);
    eprintln!("the load kept {keys_kept} of {keys} keys and {kept} chunk bytes");
    assert!(
        keys_kept > 0 && keys_kept + 3 * 8 >= keys,
        "the load kept {keys_kept} of {keys} keys, where 3 ranges of 8 changed"
    );
    // Counted in sync again: its chunk files are set 0's, while the
    // servers run (no write comes, so neither side changes). At a stop,
    // set 0's last records would have it loaded anyway.
    let cfg = tc.config().clone();
    let (primary, copied) = (
        all_files(&cfg.servers[0].data_dir.join("chunks")),
        all_files(&copy.join("chunks")),
    );
    assert_eq!(
        primary.keys().collect::<Vec<_>>(),
        copied.keys().collect::<Vec<_>>()
    );
    for (p, bytes) in &primary {
        assert!(
            &copied[p] == bytes,
            "server 1 counted in sync on set 0 with chunk {} of {} bytes (server 0: {})",
            p.display(),
            copied[p].len(),
            bytes.len()
        );
    }
    rt.block_on(read_back(&c, &files));
    drop(c);
    stop_all_cleanly(&mut tc);
    assert_same_store(0, &cfg.servers[0].data_dir, &copy);
    let kv = RocksStore::open(&copy.join("meta")).unwrap();
    assert_eq!(kv.get(b"INOD-never-set-0s").unwrap(), None);
    assert_ne!(
        kv.get(&changed).unwrap().as_deref(),
        Some(&b"not the inode"[..])
    );
    assert!(
        kv.get(&gone).unwrap().is_some(),
        "a removed key not sent again"
    );
}

/// A primary restarted after a crash opens a new record stream over the
/// store it kept. A copy that is empty meanwhile (its server lost the copy
/// directory) must be loaded before it counts as in sync, not take that
/// stream from its first record as a new store's. It took it before:
/// counted in sync at once, it lacked every key and chunk written before
/// the restart (the store's write verifier among them), and once promoted
/// served the set without them. (failover_fsx failed once on this: the
/// test harness restarted a cluster whose ports were taken, and a promoted
/// copy answered an fsync with another write verifier.)
#[test]
fn an_empty_copy_of_a_primary_restarted_after_a_crash_is_loaded_before_it_counts() {
    let (mut tc, rt) = replicated_cluster();
    assert_eq!(
        tc.config().replica_set(madfs_types::ServerId(0)),
        vec![madfs_types::ServerId(0), madfs_types::ServerId(1)]
    );
    let c = tc.client();
    let mut files: Expected = Vec::new();
    rt.block_on(write_round(&c, "/e", 0, 12, &mut files));
    let on_set_0 = files
        .iter()
        .filter(|(p, _)| rt.block_on(c.stat(p.as_str())).unwrap().ino.owner().0 == 0)
        .count();
    assert!(on_set_0 > 0, "no file of the 12 is on set 0");
    drop(c);
    // A crash of every server: each opens a new stream at its restart.
    for i in 0..SERVERS {
        tc.kill9(i);
    }
    let copy = tc.config().servers[1].data_dir.join("replica-of-0");
    std::fs::remove_dir_all(&copy).unwrap();
    tc.start_all_again();
    let c = tc.client();
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 60, "after the restart");
    // Written after the restart, and durable, on set 0's copy too.
    let mut after: Expected = Vec::new();
    rt.block_on(write_round(&c, "/e2", 100, 6, &mut after));
    rt.block_on(c.fsync_all()).unwrap();
    tc.kill9(0);
    // Set 0 is served from server 1's copy: everything is there.
    rt.block_on(read_back(&c, &files));
    rt.block_on(read_back(&c, &after));
    drop(c);
    stop_all_cleanly(&mut tc);
}

/// Truncate every file under `dir` to nothing; how many there were.
fn empty_files_under(dir: &Path) -> usize {
    let mut n = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            n += empty_files_under(&path);
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(0))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    n
}

/// With every copy of a set gone (servers 3 and 0 keep set 3), its files
/// fail with a clear error (EIO, once the client's wait for a failover
/// runs out), never with other bytes, while the other sets keep serving;
/// once one copy is back, the set serves again with everything it had.
#[test]
fn a_set_with_every_copy_gone_fails_with_eio_and_comes_back() {
    let (mut tc, rt) = replicated_cluster();
    let c = tc.client();
    assert_eq!(
        tc.config().replica_set(madfs_types::ServerId(3)),
        vec![madfs_types::ServerId(3), madfs_types::ServerId(0)]
    );
    let (gone, alive) = (
        format!("/{}", name_on(3, SERVERS, "g")),
        format!("/{}", name_on(2, SERVERS, "a")),
    );
    let (gone_data, alive_data) = (pattern(301, 5_000), pattern(302, 5_000));
    rt.block_on(async {
        c.write_file(gone.as_str(), &gone_data).await.unwrap();
        c.write_file(alive.as_str(), &alive_data).await.unwrap();
    });
    drop(c);
    tc.kill9(3);
    tc.kill9(0);
    // Each command is a client of its own, giving up on a failover after 4 s.
    let cluster = tc.cluster_file().to_path_buf();
    let madfs = |args: &[&str]| {
        std::process::Command::new(common::MADFS)
            .args(args)
            .env("MADFS_CLUSTER", &cluster)
            .env("MADFS_FAILOVER_WAIT_MS", "4000")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run madfs")
    };
    // Set 2 (servers 2 and 3) goes on with server 2 once the group took
    // server 3 out; set 3 has no copy left.
    // Read `path` until it succeeds (at most 60 s); it must hold `data`.
    let read_when_served = |path: &str, data: &[u8], when: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let out = madfs(&["cat", path]);
            if out.status.success() {
                assert!(out.stdout == data, "{path} read back other bytes {when}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path} unreadable {when}: {out:?}"
            );
        }
    };
    read_when_served(&alive, &alive_data, "with set 2's server alive");
    // The CLI says the server is unavailable; through `madfs run` a
    // program sees EIO.
    let in_run = format!("/madfs{gone}");
    for (args, error) in [
        (vec!["cat", gone.as_str()], "unavailable"),
        (vec!["stat", gone.as_str()], "unavailable"),
        (
            vec!["run", "--", "cat", in_run.as_str()],
            "Input/output error",
        ),
    ] {
        let out = madfs(&args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} with set 3 gone: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?} printed: {out:?}");
        assert!(said.contains(error), "{args:?}: {said}");
    }
    // The servers pass on what the group's leader sees: no copy of set 3
    // answers. `madfs status` says so, and a new process's call to set 3
    // fails at once once the set has been silent its whole failover wait,
    // saying why (before, each new process waited the whole wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = madfs(&["status"]);
        let said = String::from_utf8_lossy(&out.stdout);
        if said.contains("(set 3: no copy has answered for") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "status never said set 3 is lost: {said}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    loop {
        let out = madfs(&["stat", gone.as_str()]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "stat with set 3 lost: {out:?}");
        if said.contains("no copy of set 3 has answered the membership group for") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stat never said set 3 is lost: {said}"
        );
    }
    let local = tc.root().join("new");
    std::fs::write(&local, b"x").unwrap();
    let refused = format!("/{}", name_on(3, SERVERS, "w"));
    let out = madfs(&["put", local.to_str().unwrap(), &refused]);
    assert!(
        !out.status.success(),
        "a write to set 3 was acknowledged: {out:?}"
    );

    // Server 3 is back: set 3 serves again, with what it had.
    tc.restart(3);
    read_when_served(&gone, &gone_data, "after server 3 came back");
    tc.restart(0);
    let c = tc.client();
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 60, "after both came back");
    rt.block_on(read_back(
        &c,
        &[(gone.clone(), gone_data), (alive.clone(), alive_data)],
    ));
}

/// A copy whose server's disk fills up leaves its set before it takes the
/// room that server's own set needs, and comes back once room is made.
/// Found with server 1's data directory on a small file system: its copy
/// of set 0 wrote until the disk was full (the reserve a server keeps for
/// its own set's writers did not hold for copies), left the set, and its
/// catch-up was given up after 10 failed tries; once files were removed
/// the set stayed one copy short until a restart, its stale copy kept the
/// removed files' room, and set 0's primary kept every record for the
/// replica in memory meanwhile (its RSS grew with every write to set 0).
#[test]
fn a_copy_on_a_full_disk_leaves_its_set_and_comes_back_once_room_is_made() {
    use madfs_types::{FileName, InodeId, ServerId};
    // Server 1 keeps set 0's copy, on a private tmpfs: its three RocksDB
    // stores (its own, the membership group's, the copy's) preallocate
    // about 66 MiB of it.
    const DISK: u64 = 160 << 20;
    let mut tc = TestCluster::start_with(
        SERVERS,
        Options {
            replicas: 2,
            tmpfs_bytes: Some(DISK),
            tmpfs_servers: vec![1],
            server_env: vec![("MADFS_RESYNC_PAUSE_MAX_MS".into(), "200".into())],
            ..Options::default()
        },
    );
    assert_eq!(
        tc.config().replica_set(ServerId(0)),
        vec![ServerId(0), ServerId(1)]
    );
    let rt = client_runtime();
    let c = tc.client();
    let stats_of = |server: u16| {
        rt.block_on(c.server_stats())
            .into_iter()
            .find(|(s, _)| *s == ServerId(server))
            .and_then(|(_, r)| r.ok())
            .unwrap_or_else(|| panic!("no statistics from server {server}"))
    };
    // Files of one chunk on set 0 (their names, inodes and chunks there).
    let on_set_0 = (0u64..)
        .map(|k| (k, format!("z{k}")))
        .filter(|(_, n)| {
            let name = FileName::new(n.as_bytes()).unwrap();
            madfs_types::dentry_server(InodeId::ROOT, &name, SERVERS) == ServerId(0)
        })
        .map(|(k, n)| (format!("/{n}"), pattern(k, common::CHUNK as usize)));
    let mut written = Vec::new();
    for (path, data) in on_set_0 {
        rt.block_on(c.write_file(path.as_str(), &data))
            .unwrap_or_else(|e| panic!("writing {path} on set 0: {e}"));
        written.push((path, data));
        if copies_in_sync(&rt, &c).first() == Some(&1) {
            break;
        }
        assert!(
            written.len() < 400,
            "server 1's copy of set 0 never left the set with {} MiB written: {:?}",
            written.len(),
            stats_of(1)
        );
    }
    let owner = rt
        .block_on(c.stat(written[0].0.as_str()))
        .unwrap()
        .ino
        .owner();
    assert_eq!(owner, ServerId(0), "the files were meant for set 0");
    // Server 1 keeps its reserve (the smaller of 64 MiB and an eighth of
    // its disk) for its own set: the copy stopped short of it.
    let one = stats_of(1);
    let reserve = (64u64 << 20).min(one.bytes_total / 8);
    assert!(
        one.bytes_avail >= reserve / 2,
        "server 1's copy of set 0 took its disk down to {} bytes free (reserve {reserve})",
        one.bytes_avail
    );
    // Set 0's primary shows the catch-up waiting, and why.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let rebuilds = stats_of(0).rebuilds;
        if rebuilds.iter().any(|r| {
            r.replica == ServerId(1)
                && r.phase == madfs_client::RebuildPhase::Waiting
                && r.failure.contains("keeps its last")
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no catch-up of server 1 waiting for room: {rebuilds:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Room is made on set 0; the copy catches up, without a restart.
    let kept = written.split_off(written.len() - 4);
    for (path, _) in &written {
        rt.block_on(c.remove_file(path.as_str())).unwrap();
    }
    wait_all_in_sync(&|| copies_in_sync(&rt, &c), 60, "after room was made");
    // Server 1 serves set 0 from that copy once server 0 is gone.
    tc.kill9(0);
    rt.block_on(read_back(&c, &kept));
    let routes = rt.block_on(c.routes()).unwrap();
    assert_eq!(routes[0], ServerId(1), "{routes:?}");
}
