//! Hosts for tests, as network namespaces joined by a bridge: each gets a
//! veth pair with an address 10.213.SUBNET.LAST inside the namespace (the
//! bridge has none, so the test's own network is untouched). Names carry
//! the test's pid and a letter per test; dropping the `Netns` kills every
//! process in its namespaces and deletes them and the bridge, also when
//! the test fails. Shared by multihost.rs and stage_multihost.rs (which
//! include command.rs beside it).

// Each test uses a part of it.
#![allow(dead_code)]

use super::command::{must, output_within};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How long one `ip` command may take.
const IP_TIMEOUT: Duration = Duration::from_secs(60);

/// Run `argv` with `env`, killed after `limit`.
pub fn run_for(
    argv: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
    input: Option<&str>,
) -> Output {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().copied());
    output_within(cmd, limit, input)
}

fn ip(argv: &[&str]) -> Output {
    run_for(argv, &[], IP_TIMEOUT, None)
}

fn ip_ok(argv: &[&str]) {
    must(ip(argv));
}

/// A bridge and namespaces on it, and a scratch directory.
pub struct Netns {
    /// Two letters of the test (namespace and link names), with the pid.
    prefix: char,
    tag: String,
    subnet: u8,
    bridge: String,
    namespaces: Vec<String>,
    dir: tempfile::TempDir,
}

impl Netns {
    /// A bridge for the test `prefix`+`test` (letters, unique per test)
    /// with addresses in 10.213.`subnet`.0/24; None (after saying why) when
    /// network namespaces are unavailable (not root, no iproute2).
    pub fn new(prefix: char, test: char, subnet: u8) -> Option<Netns> {
        let tag = format!("{}{test}", std::process::id() % 1_000_000);
        let probe = format!("{prefix}probe{tag}");
        let out = match Command::new("ip").args(["netns", "add", &probe]).output() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED: cannot run `ip` (iproute2): {e}");
                return None;
            }
        };
        if !out.status.success() {
            eprintln!(
                "SKIPPED: cannot create network namespaces ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        ip(&["ip", "netns", "del", &probe]);
        let net = Netns {
            bridge: format!("{prefix}b{tag}"),
            prefix,
            tag,
            subnet,
            namespaces: Vec::new(),
            dir: tempfile::Builder::new()
                .prefix(&format!("madfs-netns-{prefix}-"))
                .tempdir()
                .expect("tempdir"),
        };
        ip_ok(&["ip", "link", "add", &net.bridge, "type", "bridge"]);
        ip_ok(&["ip", "link", "set", &net.bridge, "up"]);
        Some(net)
    }

    /// Add namespace `name` (unique to this run) with address .`last`.
    pub fn add(&mut self, name: &str, last: u8) -> String {
        let ns = self.ns(name);
        let i = self.namespaces.len();
        ip_ok(&["ip", "netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        let (outer, inner) = (self.veth(i, 'o'), self.veth(i, 'i'));
        ip_ok(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        ip_ok(&[
            "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
        ]);
        ip_ok(&["ip", "link", "set", &outer, "master", &self.bridge, "up"]);
        let addr = self.addr(last);
        ip_ok(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &inner,
        ]);
        ip_ok(&["ip", "-n", &ns, "link", "set", &inner, "up"]);
        ns
    }

    fn veth(&self, i: usize, end: char) -> String {
        format!("{}v{}{end}{i}", self.prefix, self.tag)
    }

    /// The namespace named `name` in this run.
    pub fn ns(&self, name: &str) -> String {
        format!("{}h{}{name}", self.prefix, self.tag)
    }

    pub fn addr(&self, last: u8) -> String {
        format!("10.213.{}.{last}", self.subnet)
    }

    /// The test's scratch directory.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Take namespace `ns`'s link to the bridge down (`up`: back up).
    pub fn link(&self, ns: &str, up: bool) {
        let i = self
            .namespaces
            .iter()
            .position(|n| n == ns)
            .expect("a namespace of this test");
        ip_ok(&[
            "ip",
            "link",
            "set",
            &self.veth(i, 'o'),
            if up { "up" } else { "down" },
        ]);
    }

    /// Processes running in namespace `ns`.
    pub fn pids(&self, ns: &str) -> Vec<i32> {
        let out = ip(&["ip", "netns", "pids", ns]);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Kill every process in namespace `ns` and wait (10 s at most) until
    /// none is left.
    pub fn kill_all(&self, ns: &str) {
        for pid in self.pids(ns) {
            // SAFETY: only processes inside this test's namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pids(ns).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            self.kill_all(ns);
        }
        for ns in &self.namespaces {
            ip(&["ip", "netns", "del", ns]);
        }
        ip(&["ip", "link", "del", &self.bridge]);
    }
}
