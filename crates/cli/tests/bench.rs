//! `madfs bench io500` end to end: a tiny run (2 ranks, 1 s stonewall)
//! against a real 2-server cluster and against a local directory: every
//! phase reports a positive value, verification finds no error, find
//! matches what mdtest-hard wrote, the files left with --keep hold exactly
//! the pattern each rank wrote at each offset, and `bench plot` draws both.
//! Then the same through the user-facing clients (`--client run`, `--client
//! mount`), and the mount the run made is gone afterwards.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::{TestCluster, MADFS};
use madfs_bench::report::{from_json, RunResult};
use madfs_bench::{ior_hard_offset, pattern, rank, IOR_HARD_XFER, PHASES};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn tiny_args(out: &Path) -> Vec<String> {
    [
        "bench",
        "io500",
        "--ranks",
        "2",
        "--stonewall",
        "1",
        "--scale",
        "tiny",
        "--verify",
        "all",
        "--keep",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

#[track_caller]
fn check_ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every phase is there, positive, error-free; the score is positive.
fn check_run(stdout: &str, json: &Path) -> RunResult {
    let rep = from_json(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(rep.runs.len(), 1);
    let run = rep.runs[0].clone();
    assert_eq!(run.phases.len(), PHASES.len());
    for (p, (name, kind)) in run.phases.iter().zip(PHASES) {
        assert_eq!(p.name, name);
        assert_eq!(p.kind, kind);
        assert!(p.value > 0.0 && p.time_s > 0.0, "{name}: {p:?}");
        assert_eq!(p.errors, 0, "{name}: {p:?}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("[RESULT]") && l.contains(name)),
            "no [RESULT] line for {name}:\n{stdout}"
        );
        if name != "find" {
            assert!(p.per_rank.iter().all(|&n| n > 0), "{name}: {p:?}");
        }
    }
    // Wear-out: every rank wrote as much as the busiest one.
    for p in run.phases.iter().filter(|p| p.name.ends_with("-write")) {
        assert_eq!(p.per_rank[0], p.per_rank[1], "{p:?}");
    }
    let find = run.phase("find").unwrap();
    assert!(find.matched.unwrap() > 0, "{find:?}");
    assert!(run.score > 0.0 && run.bw_gib_s > 0.0 && run.md_kiops > 0.0);
    assert_eq!(run.errors, 0);
    assert!(stdout.contains("[SCORE ]"), "{stdout}");
    run
}

/// The ior files left by --keep hold the pattern of the rank that wrote
/// each transfer, at its offset, with no gap: read through `read(path,
/// offset, len)`.
fn check_ior_files(run: &RunResult, read: &dyn Fn(&str, u64, usize) -> Vec<u8>, ior_dir: &str) {
    let easy = run.phase("ior-easy-write").unwrap();
    for (r, &n) in easy.per_rank.iter().enumerate() {
        let len = (n * run.transfer) as usize;
        let data = read(&format!("{ior_dir}/ior-easy/ior_file_easy.{r}"), 0, len);
        assert_eq!(data.len(), len);
        let key = pattern::key(rank::TAG_EASY, r as u64, 0);
        assert_eq!(
            pattern::first_mismatch(&data, key, 0),
            None,
            "ior-easy rank {r}"
        );
    }
    let hard = run.phase("ior-hard-write").unwrap();
    let path = format!("{ior_dir}/ior-hard/IOR_file");
    for (r, &n) in hard.per_rank.iter().enumerate() {
        let key = pattern::key(rank::TAG_HARD, r as u64, 0);
        for s in 0..n {
            let off = ior_hard_offset(s, r, run.ranks);
            let data = read(&path, off, IOR_HARD_XFER as usize);
            assert_eq!(
                pattern::first_mismatch(&data, key, off),
                None,
                "ior-hard segment {s} of rank {r}"
            );
        }
    }
    let total: u64 = hard.per_rank.iter().sum();
    let whole = read(&path, 0, (total * IOR_HARD_XFER + 1) as usize);
    assert_eq!(
        whole.len() as u64,
        total * IOR_HARD_XFER,
        "shared file size"
    );
}

#[test]
fn tiny_io500_on_madfs_and_on_a_local_directory() {
    let tc = TestCluster::start(2);
    let tmp = tempfile::tempdir().unwrap();

    // MadFS.
    let json_m = tmp.path().join("madfs.json");
    let stdout = check_ok(&tc.madfs(tiny_args(&json_m)));
    let run_m = check_run(&stdout, &json_m);
    assert_eq!(run_m.target, "madfs");
    let bc = madfs_client::BlockingClient::connect(Some(tc.cluster_file())).unwrap();
    let top = bc.read_dir("/").unwrap();
    assert_eq!(top.len(), 1, "one run directory");
    let workdir = format!("/{}", top[0].name.to_string_lossy());
    let read = |p: &str, off: u64, len: usize| {
        let f = bc
            .open(p, madfs_client::OpenOptions::new().read(true))
            .unwrap();
        let mut out = Vec::new();
        while out.len() < len {
            let got = f.read_at(off + out.len() as u64, len - out.len()).unwrap();
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
        }
        out
    };
    check_ior_files(&run_m, &read, &workdir);
    // The delete phases removed every mdtest file.
    assert!(bc
        .read_dir(format!("{workdir}/mdtest-hard"))
        .unwrap()
        .is_empty());
    assert!(bc
        .read_dir(format!("{workdir}/mdtest-easy/rank.0"))
        .unwrap()
        .is_empty());

    // The same phases through the kernel on a local directory.
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let json_l = tmp.path().join("local.json");
    let mut args = tiny_args(&json_l);
    args.extend(["--target".into(), local.display().to_string()]);
    let stdout = check_ok(&tc.madfs(&args));
    let run_l = check_run(&stdout, &json_l);
    assert!(run_l.target.starts_with("local:"), "{}", run_l.target);
    let dirs: Vec<_> = std::fs::read_dir(&local).unwrap().collect();
    assert_eq!(dirs.len(), 1);
    let workdir = dirs[0].as_ref().unwrap().path().display().to_string();
    let read = |p: &str, off: u64, len: usize| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(p).unwrap();
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        buf
    };
    check_ior_files(&run_l, &read, &workdir);
    // Same tiny counts, same find matches on both.
    assert_eq!(
        run_m.phase("find").unwrap().matched,
        run_l.phase("find").unwrap().matched
    );

    // Both runs in one chart.
    let svg = tmp.path().join("chart.svg");
    let out = Command::new(MADFS)
        .args(["bench", "plot"])
        .arg(&json_m)
        .arg(&json_l)
        .arg("--out")
        .arg(&svg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    check_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    for (name, _) in PHASES {
        assert!(text.contains(name), "chart lacks {name}");
    }
    assert!(text.contains("madfs-2r") && text.contains("local-2r"));
}

/// The run directories at MadFS's root.
fn run_dirs(bc: &madfs_client::BlockingClient) -> Vec<String> {
    let mut v: Vec<String> = bc
        .read_dir("/")
        .unwrap()
        .iter()
        .map(|e| format!("/{}", e.name.to_string_lossy()))
        .collect();
    v.sort();
    v
}

/// The mounts of `madfs bench` (temporary directories named so).
fn bench_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains("madfs-bench-mnt-"))
        .map(String::from)
        .collect()
}

#[test]
fn tiny_io500_through_madfs_run_and_the_mount() {
    let tc = TestCluster::start(2);
    helpers::preload_lib();
    let tmp = tempfile::tempdir().unwrap();
    let bc = madfs_client::BlockingClient::connect(Some(tc.cluster_file())).unwrap();
    let read = |p: &str, off: u64, len: usize| {
        let f = bc
            .open(p, madfs_client::OpenOptions::new().read(true))
            .unwrap();
        let mut out = Vec::new();
        while out.len() < len {
            let got = f.read_at(off + out.len() as u64, len - out.len()).unwrap();
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
        }
        out
    };
    let mounts_before = bench_mounts();
    let mut finds = Vec::new();
    for client in ["run", "mount"] {
        let before = run_dirs(&bc);
        let json = tmp.path().join(format!("{client}.json"));
        let mut args = tiny_args(&json);
        args.extend(["--client".into(), client.into()]);
        let stdout = check_ok(&tc.madfs(&args));
        let run = check_run(&stdout, &json);
        assert_eq!(run.target, "madfs");
        assert_eq!(run.client, client);
        assert_eq!(run.label, format!("madfs-{client}-2r"));
        assert_eq!(run.find_via, "server-side find");
        assert!(
            stdout.contains(&format!("client {client}")) && stdout.contains("server-side find"),
            "{stdout}"
        );
        // What the ranks wrote through the client is in the cluster.
        let new: Vec<String> = run_dirs(&bc)
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect();
        assert_eq!(new.len(), 1, "one run directory: {new:?}");
        check_ior_files(&run, &read, &new[0]);
        assert!(bc
            .read_dir(format!("{}/mdtest-hard", new[0]))
            .unwrap()
            .is_empty());
        finds.push(run.phase("find").unwrap().matched);
    }
    assert_eq!(finds[0], finds[1], "same counts, same find matches");
    // The mount made for the run is gone, and so is its directory.
    assert_eq!(bench_mounts(), mounts_before);
    assert!(
        !std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("madfs-bench-mnt-")
                && !mounts_before
                    .iter()
                    .any(|m| m.contains(&*e.file_name().to_string_lossy()))),
        "a temporary mount point was left behind"
    );
    // --mount must name a MadFS mount of this cluster.
    let out = tc.madfs(["bench", "io500", "--client", "mount", "--mount", "/tmp"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not the root of a MadFS mount"),
        "{out:?}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        vec!["bench", "io500", "--scale", "huge"],
        vec!["bench", "io500", "--verify", "most"],
        vec!["bench", "io500", "--ranks", "0", "--target", "/tmp"],
        vec!["bench", "io500", "--transfer", "1001", "--target", "/tmp"],
        vec!["bench", "io500", "--client", "run", "--target", "/tmp"],
        vec!["bench", "io500", "--client", "fuse"],
        vec!["bench", "io500", "--mount", "/tmp"],
    ] {
        let out = Command::new(MADFS)
            .args(&args)
            .current_dir(tmp.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty());
    }
    let out = Command::new(MADFS)
        .args(["bench", "plot", "/nonexistent.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
