//! Guards that what a client holds grows with what it uses, not with the
//! cluster (the FEFS lesson, issue 15): on a cluster of 64 servers, a
//! client that stats one file holds at most 2 connections (the file name's
//! server and the inode's owner), and a FUSE mount that stats one file and
//! then sits idle holds a handful of sockets, far fewer than the servers,
//! and about the memory a mount of 2 servers holds.
//! A client that connected to every server at start, or a periodic
//! exchange with all of them, fails both.

mod common;
#[path = "common/mount.rs"]
mod mount;

use common::{Options, TestCluster};
use mount::Mount;
use std::path::Path;
use std::time::{Duration, Instant};

const SERVERS: usize = 64;

/// Sockets among process `pid`'s descriptors.
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// The mount process's pid: from its "(pid N, log ...)" line once `madfs
/// mount` has printed it (it may come a moment after the mount appears),
/// else the process whose command line names the mount point.
fn mount_pid(m: &Mount<'_>) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = m.log();
        let from_log = log
            .split("(pid ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
        // The process serving the mount holds /dev/fuse (the `madfs
        // mount` that started it may still be exiting).
        if let Some(pid) = from_log
            .or_else(|| pid_naming(m.path()))
            .filter(|&p| holds_fuse(p))
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no mount process found:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `madfs mount` process whose arguments name `dir`.
fn pid_naming(dir: &Path) -> Option<u32> {
    let want = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args.iter().any(|a| a == "mount") && args.contains(&want) && holds_fuse(pid))
            .then_some(pid)
    })
}

/// Whether process `pid` has /dev/fuse open.
fn holds_fuse(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|dir| {
        dir.flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
    })
}

#[test]
fn a_client_and_a_mount_hold_connections_to_the_servers_they_use_only() {
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            // 64 servers on one test machine: small caches, one thread each.
            server_args: vec![
                "--cache-mib".into(),
                "8".into(),
                "--threads".into(),
                "1".into(),
                "--find-index-mib".into(),
                "16".into(),
            ],
            ..Options::default()
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let writer = tc.client();
        writer.write_file("/one", b"hello").await.unwrap();
        // A fresh client: its own connections, nothing cached.
        let c = madfs_client::Client::connect(Some(tc.cluster_file())).unwrap();
        assert_eq!(c.open_connections(), 0, "connections before any use");
        let a = c.stat("/one").await.unwrap();
        assert_eq!(a.size, 5);
        let held = c.open_connections();
        eprintln!("a stat of one file on {SERVERS} servers: {held} connections");
        assert!(
            (1..=2).contains(&held),
            "a stat of one file holds {held} connections on {SERVERS} servers"
        );
    });

    let m = Mount::new(&tc);
    let pid = mount_pid(&m);
    let before = sockets_of(pid);
    let a = std::fs::metadata(m.join("one")).unwrap();
    assert_eq!(a.len(), 5);
    // Idle: nothing should reach out to the other servers meanwhile.
    let idle_until = Instant::now() + Duration::from_secs(2);
    let mut most = sockets_of(pid);
    while Instant::now() < idle_until {
        most = most.max(sockets_of(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the mount: {before} sockets at start, at most {most} after a stat and 2 s idle");
    assert!(
        most >= 1,
        "the mount process {pid} holds no socket: not the mount?"
    );
    // The FUSE device, the mount's pipes, and at most 2 servers for each of
    // its clients (the main one and the reader threads' own).
    assert!(
        most < before + 2 * 5 && most < SERVERS / 2,
        "the mount holds {most} sockets after a stat on {SERVERS} servers \
         ({before} before it)"
    );
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let rss_many = rss_kib(pid);
    drop(m);

    // The same mount of a cluster of 2 servers, used the same way: its
    // idle memory is what the 64-server mount's is, give or take.
    let few = TestCluster::start_with(2, Options::default());
    rt.block_on(async { few.client().write_file("/one", b"hello").await.unwrap() });
    let m = Mount::new(&few);
    let pid = mount_pid(&m);
    assert_eq!(std::fs::metadata(m.join("one")).unwrap().len(), 5);
    std::thread::sleep(Duration::from_secs(2));
    let rss_few = rss_kib(pid);
    eprintln!("idle mount memory: {rss_many} KiB on {SERVERS} servers, {rss_few} KiB on 2 servers");
    // Anything held per server (a connection, a buffer, a cache) of even
    // 256 KiB would add 16 MiB over 64 servers.
    assert!(
        rss_many < rss_few + 16 * 1024,
        "an idle mount takes {rss_many} KiB on {SERVERS} servers, {rss_few} KiB on 2"
    );
}

/// Resident memory of process `pid` in KiB (VmRSS).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for {pid}:\n{status}"))
}
