//! `madfs find --io500`, IO500's external find: on a small tree, run as
//! io500 runs it (`CMD DATADIR -newer TIMESTAMPFILE -size 3901c -name
//! "*01*"` through sh) with the data directory given in each form a
//! program sees MadFS by (under the `madfs run` prefix with the
//! interception library loaded, inside a FUSE mount, as a MadFS path) and
//! the timestamp file local or in MadFS; its last line `MATCHED x/y` must
//! agree with GNU find through the mount (matches, and every entry below
//! the directory plus its own).

mod common;
#[path = "preload/helpers.rs"]
mod helpers;
#[path = "common/mount.rs"]
mod mount;

use common::{TestCluster, MADFS};
use madfs_client::{BlockingClient, FileName};
use mount::Mount;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// IO500's find, after the data directory.
const IO500_TESTS: &str = "-size 3901c -name \"*01*\"";

/// Files of 3,901 bytes or not, named with "01" or not, in `dir`.
fn fill(bc: &BlockingClient, dir: &str, n: usize) {
    let d = bc.mkdir_all(dir, 0o755).unwrap();
    for i in 0..n {
        let len = if i % 3 == 0 { 100 } else { 3901 };
        let name = FileName::new(format!("x{i:03}").as_bytes()).unwrap();
        bc.create_with_data(d.ino, &name, 0o644, &vec![7u8; len])
            .unwrap();
    }
}

/// The tree: files written before the reference file /run/ref (never
/// newer), the reference, then files after it in two directories, one
/// nested, and a symlink whose name matches.
fn make_tree(bc: &BlockingClient) {
    fill(bc, "/run/old", 40);
    bc.write_file("/run/ref", b"").unwrap();
    fill(bc, "/run/new", 120);
    fill(bc, "/run/new/deeper", 30);
    bc.symlink("x01", "/run/new/link01").unwrap();
}

fn stdout_of(out: &Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {text}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// (matched, scanned) from the last line, which must be `MATCHED x/y`.
fn matched(out: &str) -> (u64, u64) {
    let last = out.lines().last().unwrap_or_default();
    let (x, y) = last
        .strip_prefix("MATCHED ")
        .and_then(|r| r.split_once('/'))
        .unwrap_or_else(|| panic!("no MATCHED line at the end of:\n{out}"));
    (x.parse().unwrap(), y.parse().unwrap())
}

/// `sh -c "CMD"` as io500's popen does, without MADFS_CLUSTER, in `cwd`.
fn sh(cmd: &str, cwd: &Path) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .env_remove("MADFS_CLUSTER")
        .env_remove("MADFS_PREFIX")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn gnu_find(args: &str, cwd: &Path) -> Vec<String> {
    let out = sh(&format!("find {args}"), cwd);
    let mut lines: Vec<String> = stdout_of(&out, &format!("find {args}"))
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[test]
fn io500_find_agrees_with_gnu_find_through_every_path_form() {
    let tc = TestCluster::start(2);
    let bc = BlockingClient::connect(Some(tc.cluster_file())).unwrap();
    make_tree(&bc);
    helpers::preload_lib();
    let work = tempfile::tempdir().unwrap();
    let cwd = work.path();
    // IO500's timestamp file is local: give it the reference's time.
    let ts = cwd.join("timestampfile");
    let m = bc.lstat("/run/ref").unwrap().mtime;
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(m.secs as u64, m.nanos);
    std::fs::File::create(&ts).unwrap().set_modified(t).unwrap();
    let ts = ts.display().to_string();
    let cluster = tc.cluster_file().display().to_string();

    let mnt = Mount::new(&tc);
    let run_dir = mnt.join("run").display().to_string();
    let want = gnu_find(&format!("{run_dir} -newer {ts} {IO500_TESTS}"), cwd);
    let everything = gnu_find(&run_dir, cwd);
    assert!(want.len() > 10, "too few matches to tell: {want:?}");
    // Matches only among the files written after the reference.
    assert!(want.iter().all(|p| p.contains("/run/new/")), "{want:?}");
    // The servers count every entry of the cluster: the run directory's
    // entries and its own (GNU find prints the directory and its entries).
    let want_counts = (want.len() as u64, everything.len() as u64);

    let madfs_find = |args: &str| format!("{MADFS} find --io500 {args}");
    let cases = [
        // As io500 runs it under `madfs run`: LD_PRELOAD reaches the
        // command, which maps the prefix itself.
        (
            "prefix",
            format!(
                "{MADFS} --cluster {cluster} run -- sh -c '{}'",
                madfs_find(&format!("/madfs/run -newer {ts} {IO500_TESTS}"))
            ),
        ),
        (
            "prefix, MadFS reference",
            format!(
                "{MADFS} --cluster {cluster} run -- {}",
                madfs_find(&format!("/madfs/run/ -newer /madfs/run/ref {IO500_TESTS}"))
            ),
        ),
        (
            "custom prefix",
            format!(
                "{MADFS} --cluster {cluster} run --prefix /scratch/m -- {}",
                madfs_find(&format!("/scratch/m/run -newer {ts} {IO500_TESTS}"))
            ),
        ),
        // In the mount, with no cluster file given: the mount's daemon
        // knows it.
        (
            "mount",
            madfs_find(&format!("{run_dir} -newer {ts} {IO500_TESTS}")),
        ),
        (
            "mount, reference in the mount",
            madfs_find(&format!("{run_dir} -newer {run_dir}/ref {IO500_TESTS}")),
        ),
        (
            "MadFS path",
            format!("{MADFS} --cluster {cluster} find --io500 /run -newer {ts} {IO500_TESTS}"),
        ),
        (
            "MadFS path, MadFS reference",
            format!("{MADFS} --cluster {cluster} find --io500 /run -newer /run/ref {IO500_TESTS}"),
        ),
    ];
    for (what, cmd) in &cases {
        let out = stdout_of(&sh(cmd, cwd), cmd);
        assert_eq!(
            out.lines().count(),
            1,
            "{what}: only the MATCHED line\n{out}"
        );
        assert_eq!(matched(&out), want_counts, "{what}: {cmd}");
    }

    // -print: the paths first, in the form they were given.
    let out = stdout_of(
        &sh(
            &madfs_find(&format!("{run_dir} -newer {ts} {IO500_TESTS} -print")),
            cwd,
        ),
        "mount -print",
    );
    let mut paths: Vec<String> = out.lines().map(String::from).collect();
    let last = paths.pop().unwrap();
    assert_eq!(matched(&last), want_counts);
    assert_eq!(paths, want, "paths through the mount");
    let cmd = format!(
        "{MADFS} --cluster {cluster} run -- {}",
        madfs_find(&format!("/madfs/run -newer {ts} {IO500_TESTS} -print"))
    );
    let out = stdout_of(&sh(&cmd, cwd), &cmd);
    let prefixed: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("MATCHED"))
        .map(String::from)
        .collect();
    let from_mount: Vec<String> = want
        .iter()
        .map(|p| p.replacen(mnt.path().to_str().unwrap(), "/madfs", 1))
        .collect();
    assert_eq!(prefixed, from_mount, "paths under the prefix");

    // A mount of this cluster wins over a wrong --cluster; a missing data
    // directory fails (io500 marks the phase invalid on a non-zero exit).
    let wrong = cwd.join("wrong.toml");
    std::fs::write(&wrong, "not a cluster file").unwrap();
    let cmd = format!(
        "{MADFS} --cluster {} find --io500 {run_dir} -newer {ts} {IO500_TESTS}",
        wrong.display()
    );
    assert_eq!(matched(&stdout_of(&sh(&cmd, cwd), &cmd)), want_counts);
    let out = sh(
        &format!("{MADFS} --cluster {cluster} find --io500 /madfs/nope -name x"),
        cwd,
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/madfs/nope"),
        "{out:?}"
    );
    let out = sh(
        &format!(
            "{MADFS} --cluster {cluster} find --io500 /run -newer {}/none",
            cwd.display()
        ),
        cwd,
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("none"),
        "{out:?}"
    );
    mnt.unmount();
}
