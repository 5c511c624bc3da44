//! A copy spread over the job's hosts, each host a network namespace on a
//! bridge (as in multihost.rs; `--exec 'ip netns exec {host}'`): `madfs up
//! --stage-in` fills the new cluster through workers on every host, `madfs
//! cp --hosts` copies it out the same way with every host doing a share,
//! a failing `down --stage-out` keeps the cluster and says so, and a good
//! one copies out and then stops everything. The workers reach the
//! coordinator over the namespaces' network and prove the cluster key.
//!
//! Addresses are 10.213.9.0/24 inside the namespaces only; names carry the
//! test's pid, and a guard deletes them and kills what runs in them even
//! when the test fails. Needs root (`ip netns`): skipped, with a message,
//! otherwise.

#[path = "common/command.rs"]
mod command;
#[path = "common/netns.rs"]
mod netns;

use command::{must, output_within, text};
use netns::Netns;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MADFS: &str = env!("CARGO_BIN_EXE_madfs");
const CMD_TIMEOUT: Duration = Duration::from_secs(90);

/// Run a command with `env`, killed after CMD_TIMEOUT.
fn run(argv: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().copied());
    output_within(cmd, CMD_TIMEOUT, None)
}

/// The hosts (crates/cli/tests/common/netns.rs), and `madfs` run in them.
struct Net(Netns);

impl std::ops::Deref for Net {
    type Target = Netns;
    fn deref(&self) -> &Netns {
        &self.0
    }
}

impl Net {
    /// None (after saying why) when network namespaces are unavailable.
    fn new() -> Option<Net> {
        Netns::new('s', 's', 9).map(Net)
    }

    /// Namespace `name` (unique to this run) at 10.213.9.`last`.
    fn add(&mut self, name: &str, last: u8) -> (String, String) {
        (self.0.add(name, last), self.0.addr(last))
    }

    /// `madfs ARGS` inside namespace `ns`.
    fn madfs_in(&self, ns: &str, args: &[&str]) -> Output {
        let mut argv = vec!["ip", "netns", "exec", ns, MADFS];
        argv.extend_from_slice(args);
        let cluster = self.path("data").join("cluster.toml");
        let env = [
            ("MADFS_CLUSTER", cluster.to_str().unwrap()),
            // Parts of 1 MiB: the large file spreads over the hosts.
            ("MADFS_STAGE_PART_BYTES", "1048576"),
        ];
        run(&argv, &env)
    }
}

fn make_tree(root: &Path) {
    for d in 0..6 {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..25 {
            std::fs::write(
                dir.join(format!("f{f}")),
                format!("dir {d} file {f}\n").repeat(f + 1),
            )
            .unwrap();
        }
    }
    let big: Vec<u8> = (0..6 * 1024 * 1024 + 777)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("big"), big).unwrap();
    std::fs::hard_link(root.join("d0/f0"), root.join("hard")).unwrap();
    std::os::unix::fs::symlink("d1/f1", root.join("sym")).unwrap();
}

fn diff(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .args([
            "-r",
            "--no-dereference",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ])
        .output()
        .expect("diff");
    assert!(out.status.success(), "diff -r: {}", text(&out));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert_eq!(
        ino(&b.join("hard")),
        ino(&b.join("d0/f0")),
        "hard link lost"
    );
}

/// The hosts that did a share, from a summary's `by host:` line.
fn hosts_that_worked(out: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("by host:"))
        .unwrap_or_else(|| panic!("no `by host` line in:\n{out}"));
    line.trim_start()["by host:".len()..]
        .split(',')
        .filter_map(|part| {
            let f: Vec<&str> = part.split_whitespace().collect();
            (f.len() >= 2 && f[1].parse::<u64>().is_ok_and(|n| n > 0)).then(|| f[0].to_string())
        })
        .collect()
}

#[test]
fn copies_spread_over_every_host_in_and_out() {
    let t0 = Instant::now();
    let Some(mut net) = Net::new() else {
        return;
    };
    let (client, _) = net.add("c", 2);
    let hosts: Vec<(String, String)> = (0..3).map(|i| net.add(&format!("h{i}"), 11 + i)).collect();
    let names: Vec<String> = hosts.iter().map(|(n, _)| n.clone()).collect();
    let list: Vec<String> = hosts.iter().map(|(n, a)| format!("{n}={a}")).collect();
    let list = list.join(",");
    let src = net.path("src");
    make_tree(&src);
    let data = net.path("data");
    let data_s = data.to_str().unwrap().to_string();

    // Up, then the stage-in through a worker on every host.
    let stage_in = format!("{}:/in", src.display());
    let out = must(net.madfs_in(
        &client,
        &[
            "up",
            "--hosts",
            &list,
            "--exec",
            "ip netns exec {host}",
            "--data",
            &data_s,
            "--chunk-size",
            "1048576",
            "--cache-mib",
            "16",
            "--stage-in",
            &stage_in,
        ],
    ));
    assert!(out.contains("madfs stage-in: 152 files"), "{out}");
    let mut worked = hosts_that_worked(&out);
    worked.sort();
    assert_eq!(worked, names, "{out}");

    // Out with cp, spread the same way, a few items in flight per host.
    let out1 = net.path("out1");
    let out = must(net.madfs_in(
        &client,
        &[
            "cp",
            "-a",
            "--jobs",
            "4",
            "--hosts",
            &names.join(","),
            "--exec",
            "ip netns exec {host}",
            "madfs:/in",
            out1.to_str().unwrap(),
        ],
    ));
    let mut worked = hosts_that_worked(&out);
    worked.sort();
    assert_eq!(worked, names, "{out}");
    diff(&src, &out1);

    // A stage-out that fails keeps the cluster, and says so.
    let out = net.madfs_in(
        &client,
        &[
            "down",
            "--data",
            &data_s,
            "--stage-out",
            "/nonexistent:/tmp/x",
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("still up with its data"), "{err}");
    assert!(err.contains("madfs:/nonexistent"), "{err}");
    must(net.madfs_in(&client, &["status"]));

    // A good one copies out, then everything stops and goes.
    let out2 = net.path("out2");
    let spec = format!("/in:{}", out2.display());
    let out = must(net.madfs_in(
        &client,
        &["down", "--data", &data_s, "--stage-out", &spec, "--wipe"],
    ));
    assert!(out.contains("madfs stage-out: 152 files"), "{out}");
    diff(&src, &out2);
    for ns in &names {
        let deadline = Instant::now() + Duration::from_secs(10);
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
    eprintln!("spread staging test took {:?}", t0.elapsed());
}
