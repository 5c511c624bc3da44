//! `madfs up --hosts` across hosts, each host a network namespace joined to
//! the others by a bridge (`--exec 'ip netns exec {host}'`): a cluster of 4
//! hosts x 2 servers stripes a large file over every host, renames across
//! hosts, shows `status` by host, takes creates from two client hosts
//! (`--client-hosts`, mounts only) at once and passes close-to-open between
//! their mounts, survives losing every server of one host (clients get a
//! clear error, `madfs up` restarts them, data intact), and `down --wipe`
//! leaves nothing behind. There every link, server-to-server ones
//! included, carries 100 us each way, added by the servers' transport
//! (`MADFS_NET_DELAY_US`). A host that cannot be reached makes
//! `up` fail naming it, with no server left running on the others. The
//! Slurm way of launching (one long-running command per host) runs with
//! `ip netns exec` standing in for srun (with `--listen-all`), and a client
//! works through TCP relays that add 200 us each way (this kernel has no
//! netem).
//!
//! Only addresses inside the namespaces (10.213.0.0/16) are used; the bridge
//! has none, so the test's own network is untouched. Namespace, bridge and
//! veth names carry the test's pid, and a guard deletes them and kills
//! every process in them even when the test fails. Needs root (`ip netns`):
//! skipped, with a message, otherwise.

#[path = "common/command.rs"]
mod command;
#[path = "common/netns.rs"]
mod netns;
#[path = "common/placement.rs"]
mod placement;

use command::{must, output_within, text};
use netns::Netns;
use placement::name_on;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MADFS: &str = env!("CARGO_BIN_EXE_madfs");
const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// Run a command, killed after `CMD_TIMEOUT`.
fn run(argv: &[&str], env: &[(&str, &str)]) -> Output {
    run_with_input(argv, env, None)
}

/// Run a command with `input` on its standard input, killed after
/// `CMD_TIMEOUT`.
fn run_with_input(argv: &[&str], env: &[(&str, &str)], input: Option<&str>) -> Output {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().copied());
    output_within(cmd, CMD_TIMEOUT, input)
}

fn ok(argv: &[&str]) -> String {
    let out = run(argv, &[]);
    assert!(
        out.status.success(),
        "{argv:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The hosts (crates/cli/tests/common/netns.rs) and the delay the
/// servers add on every link.
struct Net {
    hosts: Netns,
    /// One-way delay the servers add to every frame (MADFS_NET_DELAY_US).
    delay_us: u32,
}

impl std::ops::Deref for Net {
    type Target = Netns;
    fn deref(&self) -> &Netns {
        &self.hosts
    }
}

impl std::ops::DerefMut for Net {
    fn deref_mut(&mut self) -> &mut Netns {
        &mut self.hosts
    }
}

impl Net {
    /// None (after saying why) when network namespaces are unavailable.
    fn new(test: char, subnet: u8) -> Option<Net> {
        Some(Net {
            hosts: Netns::new('m', test, subnet)?,
            delay_us: 0,
        })
    }

    fn data(&self) -> PathBuf {
        self.path("data")
    }

    /// `madfs ARGS` run inside namespace `ns`, with the cluster file set.
    fn madfs_in(&self, ns: &str, args: &[&str]) -> Output {
        self.madfs_input(ns, args, None)
    }

    /// Server hosts h0, h1, ... at .11, .12, ...: each namespace and address.
    fn hosts(&mut self, count: u8) -> Vec<(String, String)> {
        (0..count)
            .map(|i| (self.add(&format!("h{i}"), 11 + i), self.addr(11 + i)))
            .collect()
    }

    /// `madfs up --hosts LIST --exec 'ip netns exec {host}' --data DATA
    /// MORE...` run in namespace `ns`, with `input` on standard input.
    fn up(&self, ns: &str, hosts: &[String], more: &[&str], input: Option<&str>) -> Output {
        let (list, data) = (hosts.join(","), self.data());
        let mut args = vec![
            "up",
            "--hosts",
            &list,
            "--exec",
            "ip netns exec {host}",
            "--data",
            data.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        self.madfs_input(ns, &args, input)
    }

    /// `madfs_in` with `input` on standard input.
    fn madfs_input(&self, ns: &str, args: &[&str], input: Option<&str>) -> Output {
        self.madfs_with(ns, args, input, &[])
    }

    /// `madfs_in` with more environment.
    fn madfs_env(&self, ns: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.madfs_with(ns, args, None, env)
    }

    /// `madfs ARGS` in namespace `ns` with the cluster file set, `env`
    /// added, and `input` on standard input.
    fn madfs_with(
        &self,
        ns: &str,
        args: &[&str],
        input: Option<&str>,
        env: &[(&str, &str)],
    ) -> Output {
        let cluster = self.data().join("cluster.toml");
        let mut argv = vec!["ip", "netns", "exec", ns, MADFS];
        argv.extend_from_slice(args);
        let mut all = vec![("MADFS_CLUSTER", cluster.to_str().unwrap())];
        // Inherited by the servers `up` starts (ip netns exec keeps the
        // environment).
        let delay = self.delay_us.to_string();
        if self.delay_us > 0 {
            all.push(("MADFS_NET_DELAY_US", &delay));
        }
        all.extend_from_slice(env);
        run_with_input(&argv, &all, input)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Show the servers' last words (the namespaces go after this).
            let dirs = std::fs::read_dir(self.data())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir());
            for dir in dirs.chain([self.data()]) {
                let Ok(rd) = std::fs::read_dir(dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let p = e.path();
                    if p.extension().is_some_and(|x| x == "log") {
                        let text = std::fs::read_to_string(&p).unwrap_or_default();
                        let lines: Vec<&str> = text.lines().collect();
                        eprintln!(
                            "--- {}:\n{}",
                            p.display(),
                            lines[lines.len().saturating_sub(10)..].join("\n")
                        );
                    }
                }
            }
        }
    }
}

/// Deterministic pseudo-random bytes.
/// The `--hosts` entries NAME=ADDR of `hosts`.
fn host_list(hosts: &[(String, String)]) -> Vec<String> {
    hosts.iter().map(|(n, a)| format!("{n}={a}")).collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Is anything listening on 0.0.0.0 (all interfaces) in `ns`?
fn listens_on_any(ns: &str) -> bool {
    let out = run(&["ip", "netns", "exec", ns, "cat", "/proc/net/tcp"], &[]);
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].starts_with("00000000:") && f[3] == "0A"
    })
}

/// Run `sh -c script` in the mount namespace of `host`'s mount daemon.
fn in_mount(data: &Path, host: &str, script: &str) -> String {
    let pid = std::fs::read_to_string(data.join(host).join("mount.pid"))
        .unwrap_or_else(|e| panic!("no mount daemon on {host}: {e}"));
    ok(&["nsenter", "-t", pid.trim(), "-m", "sh", "-c", script])
}

const HOSTS: u8 = 4;
const PER_HOST: usize = 2;
const BIG: usize = 40 << 20;

#[test]
fn cluster_across_four_hosts_survives_losing_one() {
    let t0 = Instant::now();
    let Some(mut net) = Net::new('a', 1) else {
        return;
    };
    // Every link, client-server and server-server, gets 100 us each way
    // in the servers' transport: round trips of about 200 us more.
    net.delay_us = 100;
    let client = net.add("c", 2);
    let client2 = net.add("d", 3);
    let hosts = net.hosts(HOSTS);
    let list = host_list(&hosts);
    let data = net.data();
    let data_s = data.to_str().unwrap().to_string();
    let mnt = net.root().join("mnt").to_str().unwrap().to_string();
    let more = [
        "--servers-per-host",
        "2",
        "--chunk-size",
        "1048576",
        "--cache-mib",
        "16",
        "--mount",
        &mnt,
        "--key-stdin",
        "--client-hosts",
        &format!("{client},{client2}"),
    ];
    let key = "0123456789abcdef".repeat(4);
    let out = must(net.up(&client, &list, &more, Some(&key)));
    assert!(
        out.contains("8 servers on 4 hosts and 2 client hosts"),
        "{out}"
    );
    assert!(out.contains("Mounted on"), "{out}");
    for (i, (ns, _)) in hosts.iter().enumerate() {
        let log = data.join(ns).join(format!("server-{}.log", PER_HOST * i));
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            log.contains("MADFS_NET_DELAY_US"),
            "{ns}: its servers do not delay:\n{log}"
        );
    }

    // The files every host reads; the key private.
    let cfg = std::fs::read_to_string(data.join("cluster.toml")).unwrap();
    for (ns, addr) in &hosts {
        assert!(cfg.contains(&format!("host = \"{ns}\"")), "{cfg}");
        assert!(cfg.contains(&format!("{addr}:7100")), "{cfg}");
        assert!(cfg.contains(&format!("{addr}:7101")), "{cfg}");
        assert!(!listens_on_any(ns), "a server of {ns} listens on 0.0.0.0");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.join("cluster.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let written = std::fs::read_to_string(data.join("cluster.key")).unwrap();
    assert_eq!(written.trim(), key);

    // A large file, striped over every host, comes back identical.
    let big = pattern(7, BIG);
    let local = net.root().join("big");
    std::fs::write(&local, &big).unwrap();
    must(net.madfs_in(&client, &["put", local.to_str().unwrap(), "/big"]));
    let copy = net.root().join("big.copy");
    must(net.madfs_in(&client, &["get", "/big", copy.to_str().unwrap()]));
    assert!(std::fs::read(&copy).unwrap() == big, "/big differs");

    // Status, by host: every server up and holding part of /big.
    let status = must(net.madfs_in(&client, &["status"]));
    for (ns, _) in &hosts {
        assert!(
            status.contains(&format!("HOST {ns}: 2/2 servers answer")),
            "{status}"
        );
    }
    let rows: Vec<Vec<&str>> = status
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 6 && f[2] == "up")
        .collect();
    assert_eq!(rows.len(), HOSTS as usize * PER_HOST, "{status}");
    for r in &rows {
        let bytes: u64 = r[4].parse().unwrap();
        assert!(bytes > 0, "server {} holds none of /big:\n{status}", r[0]);
    }

    // Renames across hosts: entries and directories live on different
    // servers, so some of these move an entry from one host to another.
    must(net.madfs_in(&client, &["mkdir", "/a", "/b", "/c"]));
    let small = net.root().join("small");
    for i in 0..8 {
        std::fs::write(&small, format!("file {i}\n")).unwrap();
        must(net.madfs_in(
            &client,
            &["put", small.to_str().unwrap(), &format!("/a/f{i}")],
        ));
    }
    for i in 0..8 {
        must(net.madfs_in(&client, &["mv", &format!("/a/f{i}"), &format!("/b/g{i}")]));
    }
    must(net.madfs_in(&client, &["mv", "/b", "/c/b2"]));
    let ls = must(net.madfs_in(&client, &["ls", "/c/b2"]));
    for i in 0..8 {
        assert!(ls.contains(&format!("g{i}")), "{ls}");
    }
    assert!(must(net.madfs_in(&client, &["ls", "/a"])).trim().is_empty());
    assert_eq!(
        must(net.madfs_in(&client, &["cat", "/c/b2/g5"])),
        "file 5\n"
    );

    // Every host mounted the cluster (in the mount namespace `ip netns
    // exec` gave its daemon): what one host writes there, all read.
    let (h0, _) = &hosts[0];
    in_mount(&data, h0, &format!("echo through fuse > {mnt}/fromfuse"));
    for (ns, _) in &hosts {
        let got = in_mount(&data, ns, &format!("cat {mnt}/fromfuse {mnt}/c/b2/g5"));
        assert_eq!(got, "through fuse\nfile 5\n", "through the mount on {ns}");
    }

    // Both client hosts create in one directory at once, through their
    // mounts: every name lands exactly once, with its content.
    in_mount(&data, &client, &format!("mkdir {mnt}/storm"));
    std::thread::scope(|sc| {
        for ns in [&client, &client2] {
            let (data, mnt) = (&data, &mnt);
            sc.spawn(move || {
                in_mount(
                    data,
                    ns,
                    &format!("for i in $(seq 150); do echo {ns} $i > {mnt}/storm/{ns}-$i || exit 1; done"),
                )
            });
        }
    });
    for ns in [&client, &client2] {
        let names = in_mount(&data, ns, &format!("ls {mnt}/storm"));
        let names: Vec<&str> = names.lines().collect();
        assert_eq!(names.len(), 300, "{ns} lists {} names", names.len());
        for other in [&client, &client2] {
            for i in [1, 77, 150] {
                let got = in_mount(&data, ns, &format!("cat {mnt}/storm/{other}-{i}"));
                assert_eq!(got, format!("{other} {i}\n"), "{ns} reads {other}-{i}");
            }
        }
    }

    // Close-to-open between the two client hosts: what one closed, the
    // other's next open reads, both ways, on a file both had read before.
    let f = format!("{mnt}/shared");
    in_mount(&data, &client, &format!("echo one > {f}"));
    assert_eq!(in_mount(&data, &client2, &format!("cat {f}")), "one\n");
    in_mount(&data, &client2, &format!("echo two >> {f}"));
    assert_eq!(in_mount(&data, &client, &format!("cat {f}")), "one\ntwo\n");
    in_mount(&data, &client, &format!("echo three > {f}"));
    assert_eq!(in_mount(&data, &client2, &format!("cat {f}")), "three\n");
    assert_eq!(in_mount(&data, &client2, &format!("stat -c %s {f}")), "6\n");

    // Every process of one host dies at once.
    let (lost, _) = &hosts[2];
    net.kill_all(lost);
    let t = Instant::now();
    let out = net.madfs_in(&client, &["get", "/big", copy.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "get with a host down: {}",
        text(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("madfs:") && err.len() > 20, "{}", text(&out));
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    eprintln!("with host {lost} down, get says: {}", err.trim());
    let out = net.madfs_in(&client, &["status"]);
    assert!(!out.status.success());
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains(&format!("HOST {lost}: 0/2 servers answer")),
        "{status}"
    );

    // `madfs up` on the same data restarts what is down; the data is intact.
    let out = must(net.madfs_in(&client, &["up", "--data", &data_s]));
    assert!(out.contains("(2 started now)"), "{out}");
    must(net.madfs_in(&client, &["get", "/big", copy.to_str().unwrap()]));
    assert!(
        std::fs::read(&copy).unwrap() == big,
        "/big differs after restart"
    );
    assert_eq!(
        must(net.madfs_in(&client, &["cat", "/c/b2/g7"])),
        "file 7\n"
    );
    must(net.madfs_in(&client, &["status"]));
    // ... and mounted again there.
    assert_eq!(
        in_mount(&data, lost, &format!("cat {mnt}/c/b2/g7")),
        "file 7\n"
    );

    // Down and wipe: no server left, no data left, no mount left.
    let out = must(net.madfs_in(&client, &["down", "--data", &data_s, "--wipe"]));
    assert!(out.contains("the mounts of 2 client hosts"), "{out}");
    for ns in hosts.iter().map(|(n, _)| n).chain([&client2]) {
        assert!(
            net.pids(ns).is_empty(),
            "{ns} still runs {:?}",
            net.pids(ns)
        );
    }
    assert!(!data.exists(), "{} still exists", data.display());
    eprintln!("multihost test took {:?}", t0.elapsed());
}

#[test]
fn a_bad_host_fails_up_by_name_and_leaves_nothing_running() {
    let Some(mut net) = Net::new('b', 2) else {
        return;
    };
    let client = net.add("c", 2);
    let good = net.hosts(3);
    // A namespace that does not exist: `ip netns exec` fails for it.
    let bad = net.ns("nosuch");
    let mut list = host_list(&good);
    list.insert(1, format!("{bad}={}", net.addr(99)));
    let data_s = net.data().to_str().unwrap().to_string();
    let more = ["--servers-per-host", "2", "--cache-mib", "16"];
    let out = net.up(&client, &list, &more, None);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("host '{bad}'")), "{}", text(&out));
    eprintln!("up with a bad host says: {}", err.trim());
    for (ns, _) in &good {
        assert!(
            net.pids(ns).is_empty(),
            "{ns} still runs {:?}",
            net.pids(ns)
        );
    }
    // Nor any file: a new cluster that failed to start is wiped.
    assert!(!Path::new(&data_s).exists(), "{data_s} is left behind");

    // No madfs binary on the hosts: the error says so, per host.
    let list = host_list(&good);
    let out = net.up(&client, &list, &["--madfs", "/nonexistent/madfs"], None);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for (ns, _) in &good {
        assert!(err.contains(&format!("host '{ns}'")), "{}", text(&out));
        assert!(
            net.pids(ns).is_empty(),
            "{ns} still runs {:?}",
            net.pids(ns)
        );
    }
    assert!(err.contains("not an executable"), "{}", text(&out));
    assert!(!Path::new(&data_s).exists(), "{data_s} is left behind");
}

/// `--slurm` keeps each host's launch command running for as long as its
/// servers (srun kills a step's processes when the step ends): here with
/// `ip netns exec` standing in for srun.
#[test]
fn slurm_style_launch_keeps_one_command_per_host() {
    let Some(mut net) = Net::new('c', 3) else {
        return;
    };
    let client = net.add("c", 2);
    let hosts = net.hosts(2);
    let list = host_list(&hosts);
    let data = net.data();
    let data_s = data.to_str().unwrap().to_string();
    let more = ["--slurm", "--cache-mib", "16", "--listen-all"];
    let out = must(net.up(&client, &list, &more, None));
    assert!(out.contains("2 servers on 2 hosts"), "{out}");
    // Asked to, the servers listen on every interface.
    for (ns, _) in &hosts {
        assert!(listens_on_any(ns), "no server of {ns} listens on 0.0.0.0");
    }
    // Each host runs its server and the launch command waiting for it.
    for (ns, _) in &hosts {
        assert!(net.pids(ns).len() >= 2, "{ns}: {:?}", net.pids(ns));
    }
    let local = net.root().join("f");
    std::fs::write(&local, pattern(3, 3 << 20)).unwrap();
    must(net.madfs_in(&client, &["put", local.to_str().unwrap(), "/f"]));
    let status = must(net.madfs_in(&client, &["status"]));
    assert!(status.contains("1/1 servers answer"), "{status}");
    // One server dies; `up` again starts it (alone) in a new step.
    let (h1, _) = &hosts[1];
    let pid: i32 = std::fs::read_to_string(data.join(h1).join("server-1.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: the server this test's cluster runs in its namespace.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !net.pids(h1).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(net.pids(h1).is_empty(), "the step outlived its server");
    let out = must(net.madfs_in(&client, &["up", "--data", &data_s]));
    assert!(out.contains("(1 started now)"), "{out}");
    let status = must(net.madfs_in(&client, &["status"]));
    assert_eq!(status.matches("1/1 servers answer").count(), 2, "{status}");
    must(net.madfs_in(&client, &["down", "--data", &data_s, "--wipe"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    for (ns, _) in &hosts {
        while !net.pids(ns).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            net.pids(ns).is_empty(),
            "{ns} still runs {:?}",
            net.pids(ns)
        );
    }
    assert!(!data.exists());
}

/// A TCP relay that delays everything it forwards by `delay` each way
/// (a delay line, not a rate limit: bytes keep their spacing), standing in
/// for a link with latency where the kernel has no netem. It listens on
/// loopback inside namespace `ns` and forwards to `target` from there.
struct Relay {
    addr: std::net::SocketAddr,
    /// Bytes forwarded, both ways.
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Enter network namespace `ns` (this thread, and the threads it starts).
fn enter_netns(ns: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("open netns");
    // SAFETY: setns on a valid namespace fd changes only this thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

impl Relay {
    fn start(ns: &str, target: std::net::SocketAddr, delay: Duration) -> Relay {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = ns.to_string();
        let stop2 = stop.clone();
        let bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (c1, c2) = (bytes.clone(), bytes.clone());
        let thread = std::thread::spawn(move || {
            enter_netns(&ns);
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
            l.set_nonblocking(true).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            while !stop2.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((a, _)) => {
                        a.set_nonblocking(false).unwrap();
                        let Ok(b) = std::net::TcpStream::connect(target) else {
                            continue;
                        };
                        for s in [&a, &b] {
                            s.set_nodelay(true).unwrap();
                        }
                        let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
                        let (c1, c2) = (c1.clone(), c2.clone());
                        std::thread::spawn(move || pump(a, b, delay, &c1));
                        std::thread::spawn(move || pump(b2, a2, delay, &c2));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        let addr = rx.recv().expect("relay address");
        Relay {
            addr,
            bytes,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copy `from` to `to`, each piece `delay` after it arrived.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    delay: Duration,
    count: &std::sync::atomic::AtomicU64,
) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = {
        let from = from.try_clone().unwrap();
        std::thread::spawn(move || {
            for (at, buf) in rx {
                let due = at + delay;
                // Sleep most of the way, spin the rest: sleeps overshoot.
                while let Some(left) = due.checked_duration_since(Instant::now()) {
                    if left > Duration::from_micros(100) {
                        std::thread::sleep(left - Duration::from_micros(80));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                if to.write_all(&buf).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Both);
            let _ = from.shutdown(std::net::Shutdown::Both);
        })
    };
    let mut buf = vec![0u8; 256 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}

/// A client whose every link to the servers has 200 us of latency each way
/// (through `Relay`s: server-to-server traffic is not delayed) still reads
/// back what it wrote and renames, over every link.
#[test]
fn clients_work_over_links_with_200us_latency() {
    let Some(mut net) = Net::new('d', 4) else {
        return;
    };
    let client = net.add("c", 2);
    let hosts = net.hosts(2);
    let list = host_list(&hosts);
    let data = net.data();
    let data_s = data.to_str().unwrap().to_string();
    let more = [
        "--servers-per-host",
        "2",
        "--chunk-size",
        "1048576",
        "--cache-mib",
        "16",
    ];
    must(net.up(&client, &list, &more, None));
    // The client's cluster file names the relays instead of the servers.
    let text = std::fs::read_to_string(data.join("cluster.toml")).unwrap();
    let mut relays = Vec::new();
    let mut relayed = text.clone();
    for (_, addr) in &hosts {
        for port in [7100, 7101] {
            let target: std::net::SocketAddr = format!("{addr}:{port}").parse().unwrap();
            let r = Relay::start(&client, target, Duration::from_micros(200));
            relayed = relayed.replace(&format!("\"{target}\""), &format!("\"{}\"", r.addr));
            relays.push(r);
        }
    }
    assert_ne!(relayed, text);
    let relay_file = data.join("relayed.toml");
    std::fs::write(&relay_file, &relayed).unwrap();
    let via = |args: &[&str]| {
        let mut argv = vec!["ip", "netns", "exec", &client, MADFS, "--cluster"];
        argv.push(relay_file.to_str().unwrap());
        argv.extend_from_slice(args);
        run(&argv, &[])
    };

    let big = pattern(11, 12 << 20);
    let local = net.root().join("big");
    std::fs::write(&local, &big).unwrap();
    let t = Instant::now();
    must(via(&["put", local.to_str().unwrap(), "/big"]));
    let put_time = t.elapsed();
    let copy = net.root().join("big.copy");
    must(via(&["get", "/big", copy.to_str().unwrap()]));
    assert!(std::fs::read(&copy).unwrap() == big, "/big differs");
    must(via(&["mkdir", "-p", "/d/e/f"]));
    must(via(&["mv", "/big", "/d/e/f/moved"]));
    let t = Instant::now();
    let stat = must(via(&["stat", "/d/e/f/moved"]));
    let stat_time = t.elapsed();
    assert!(stat.contains(&(12u64 << 20).to_string()), "{stat}");
    eprintln!("over 200 us links: put of 12 MiB {put_time:?}, stat of a 4-deep path {stat_time:?}");
    for r in &relays {
        let n = r.bytes.load(std::sync::atomic::Ordering::Relaxed);
        assert!(n > 0, "nothing went through the relay to one server");
    }
    drop(relays);
    must(net.madfs_in(&client, &["down", "--data", &data_s, "--wipe"]));
}

/// Replicas across hosts (issue 16), 4 hosts x 2 servers, `--replicas 2`
/// (each set's copy on another host; 5 voters: the first server of each
/// host, and the second of h0):
/// - h2 cut off the network: a client on h2 cannot get a write
///   acknowledged by h2's own server (its lease runs out, and its replica
///   is out of reach), while the rest of the cluster fails h2's sets over
///   and takes writes to them; healed, h2's client sees the cluster's
///   files and its refused write is nowhere;
/// - every process of h0 killed in the middle of a `madfs cp -r` of 800
///   files into MadFS (creates, striped writes, renames of each file from
///   its temporary name): its sets fail over, every file reads back, and
///   after `madfs sync` of the same tree every copied name is there
///   exactly once with its bytes.
#[test]
fn replicas_survive_a_partition_and_a_dead_host() {
    let Some(mut net) = Net::new('d', 4) else {
        return;
    };
    let client = net.add("c", 2);
    let hosts = net.hosts(HOSTS);
    let list = host_list(&hosts);
    let data = net.data();
    let data_s = data.to_str().unwrap().to_string();
    let more = [
        "--servers-per-host",
        "2",
        "--replicas",
        "2",
        "--chunk-size",
        "1048576",
        "--cache-mib",
        "16",
    ];
    let out = must(net.up(&client, &list, &more, None));
    assert!(out.contains("8 servers on 4 hosts"), "{out}");
    let servers = HOSTS as usize * PER_HOST;

    // Files everywhere, small and striped.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let local = net.root().join("f");
    let put = |net: &Net, files: &mut Vec<(String, Vec<u8>)>, ns: &str, path: &str, len: usize| {
        let bytes = pattern(files.len() as u64 + 11, len);
        std::fs::write(&local, &bytes).unwrap();
        must(net.madfs_in(ns, &["put", local.to_str().unwrap(), path]));
        files.push((path.to_string(), bytes));
    };
    for set in 0..servers as u16 {
        let len = if set % 2 == 0 { 300 } else { 3 << 20 };
        put(
            &net,
            &mut files,
            &client,
            &format!("/{}", name_on(set, servers, "a")),
            len,
        );
    }
    let copy = net.root().join("copy");
    let check = |net: &Net, ns: &str, files: &[(String, Vec<u8>)]| {
        for (p, bytes) in files {
            let out = net.madfs_in(ns, &["get", p, copy.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "reading {p} from {ns} ({} files): {}",
                files.len(),
                text(&out)
            );
            assert!(
                std::fs::read(&copy).unwrap() == *bytes,
                "{p} differs read from {ns}"
            );
        }
    };

    // h2 (servers 4 and 5) is cut off. Right then, a client on h2 writes
    // to h2's own server, and the client outside writes to h2's two sets.
    let (h2, _) = &hosts[2];
    let refused = format!("/{}", name_on(4, servers, "x"));
    let outside: Vec<(String, Vec<u8>)> = [(4u16, 500usize), (5, 2 << 20)]
        .iter()
        .map(|&(set, len)| {
            let path = format!("/{}", name_on(set, servers, "y"));
            (path, pattern(u64::from(set) + 101, len))
        })
        .collect();
    let refused_local = net.root().join("refused");
    std::fs::write(&refused_local, b"never acknowledged").unwrap();
    net.link(h2, false);
    let cut = Instant::now();
    std::thread::scope(|scope| {
        let inside = scope.spawn(|| {
            let out = net.madfs_env(
                h2,
                &["put", refused_local.to_str().unwrap(), &refused],
                &[("MADFS_FAILOVER_WAIT_MS", "3000")],
            );
            assert!(
                !out.status.success(),
                "a write on the cut-off host was acknowledged: {}",
                text(&out)
            );
            eprintln!(
                "on the cut-off host, put failed {:?} after the cut: {}",
                cut.elapsed(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        });
        // The others take writes to h2's sets once failed over.
        for (i, (path, bytes)) in outside.iter().enumerate() {
            let from = net.root().join(format!("outside{i}"));
            std::fs::write(&from, bytes).unwrap();
            must(net.madfs_in(&client, &["put", from.to_str().unwrap(), path]));
            eprintln!(
                "a write to the cut-off host's set {} went through {:?} after the cut",
                4 + i,
                cut.elapsed()
            );
        }
        inside.join().unwrap();
    });
    files.extend(outside);
    check(&net, &client, &files);

    // Healed: h2's client follows the cluster; the refused write is nowhere.
    net.link(h2, true);
    check(&net, h2, &files);
    for ns in [h2.as_str(), client.as_str()] {
        let out = net.madfs_in(ns, &["stat", &refused]);
        assert!(
            !out.status.success(),
            "{refused} exists for {ns}: {}",
            text(&out)
        );
    }
    put(
        &net,
        &mut files,
        h2,
        &format!("/{}", name_on(4, servers, "z")),
        700,
    );

    // Every process of h0 (servers 0 and 1, two of the five voters) dies
    // in the middle of a copy into MadFS: a storm of creates, each file
    // written under a temporary name and renamed (across servers) once
    // complete, and striped files (3 MiB, 1 MiB chunks) among them.
    let tree = net.root().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let storm: Vec<(String, Vec<u8>)> = (0..240u64)
        .map(|i| {
            let len = if i % 60 == 7 {
                3 << 20
            } else {
                200 + i as usize * 13
            };
            (format!("s{i}"), pattern(1000 + i, len))
        })
        .collect();
    for (name, bytes) in &storm {
        std::fs::write(tree.join(name), bytes).unwrap();
    }
    let cluster = data.join("cluster.toml");
    let cp = std::process::Command::new("ip")
        .args(["netns", "exec", &client, MADFS, "cp", "-r", "--jobs", "4"])
        .arg(&tree)
        .arg("madfs:/storm")
        .env("MADFS_CLUSTER", &cluster)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let landed = || {
        let out = net.madfs_in(&client, &["ls", "/storm"]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while landed() < 10 {
        assert!(Instant::now() < deadline, "the copy made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (h0, _) = &hosts[0];
    net.kill_all(h0);
    let t = Instant::now();
    let out = cp.wait_with_output().unwrap();
    eprintln!(
        "cp across h0's death ended {:?} after it ({}): {}",
        t.elapsed(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    check(&net, &client, &files);
    eprintln!("with h0 dead, every file read back in {:?}", t.elapsed());
    // Run again, the copy finishes what the kill interrupted and removes
    // the temporary files it left: every name exactly once, with its bytes.
    must(net.madfs_in(&client, &["sync", tree.to_str().unwrap(), "madfs:/storm"]));
    let listed = net.madfs_in(&client, &["ls", "/storm"]);
    let mut names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    names.sort();
    let mut want: Vec<String> = storm.iter().map(|(n, _)| n.clone()).collect();
    want.sort();
    assert_eq!(
        names, want,
        "the names in /storm after the kill and the rerun"
    );
    let storm: Vec<(String, Vec<u8>)> = storm
        .into_iter()
        .map(|(n, b)| (format!("/storm/{n}"), b))
        .collect();
    check(&net, &client, &storm);

    // h0 is gone for good: a new host takes over both its servers
    // (`madfs up --replace ID --on HOST`, which runs `madfs server
    // --replace` there at its own address, on empty disks), voter 0 among
    // them, and is rebuilt from the copies while writes go on.
    let r = net.add("r", 21);
    let on = format!("{r}={}", net.addr(21));
    let t = Instant::now();
    for id in ["0", "1"] {
        let out = must(net.madfs_in(
            &client,
            &["up", "--data", &data_s, "--replace", id, "--on", &on],
        ));
        assert!(
            out.contains(&format!("Replacing server {id} on {r}")),
            "{out}"
        );
    }
    put(
        &net,
        &mut files,
        &client,
        &format!("/{}", name_on(0, servers, "r")),
        2 << 20,
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = text(&net.madfs_in(&client, &["status"]));
        let rows_moved = ["0 ", "1 "].iter().all(|row| {
            status
                .lines()
                .any(|l| l.starts_with(row) && l.contains(&net.addr(21)) && l.contains(" up "))
        });
        if rows_moved && !status.contains("copies in sync") && !status.contains("rebuilding") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "h0's replacements were not rebuilt:\n{status}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "the new host's two servers were rebuilt {:?} after they started",
        t.elapsed()
    );
    // h1 (servers 2 and 3, voter 2) dies too: only the copies on the new
    // host hold some sets now, and only voter 0's replacement makes a
    // majority with voter 4.
    let (h1, _) = &hosts[1];
    net.kill_all(h1);
    check(&net, &client, &files);
    put(
        &net,
        &mut files,
        &client,
        &format!("/{}", name_on(2, servers, "after")),
        700,
    );
    check(&net, &client, &files);

    // `down` stops the replacements where they run now.
    must(net.madfs_in(&client, &["down", "--data", &data_s, "--wipe"]));
    assert!(
        net.pids(&r).is_empty(),
        "processes left on the new host after down: {:?}",
        net.pids(&r)
    );
}
