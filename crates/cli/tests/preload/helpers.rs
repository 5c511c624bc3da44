//! Shared by the preload_*.rs tests: the interception library, built on
//! demand, and `madfs run` against a test cluster.
#![allow(dead_code)]

use crate::common::{TestCluster, MADFS};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// crates/cli of the checkout under test. Taken from the environment
/// `cargo test` runs the test in, not from the build: cargo reuses a test
/// binary built in another clone that shares the target directory, and
/// the path compiled into it may no longer exist.
fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// libmadfs_preload.so next to the madfs binary under test. `cargo test`
/// does not build cdylibs of other packages, so it is built here once per
/// test binary (a no-op when it is up to date), with the same target
/// directory and profile as the binary.
pub fn preload_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = Path::new(MADFS);
        let profile_dir = exe.parent().expect("madfs has a directory");
        let target_dir = profile_dir.parent().expect("target dir");
        let profile = profile_dir.file_name().unwrap().to_str().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "madfs-preload", "--target-dir"])
            .arg(target_dir)
            .current_dir(manifest_dir());
        match profile {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let out = cmd.output().expect("run cargo build -p madfs-preload");
        assert!(
            out.status.success(),
            "cargo build -p madfs-preload failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lib = profile_dir.join("libmadfs_preload.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
    .clone()
}

/// `madfs run -- ARGS` against this cluster (prefix /madfs), stdin null.
pub fn run<S: AsRef<std::ffi::OsStr>>(tc: &TestCluster, args: &[S]) -> Output {
    preload_lib();
    Command::new(MADFS)
        .arg("run")
        .arg("--")
        .args(args)
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env_remove("MADFS_LOG")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .output()
        .expect("run madfs run")
}

fn show(args: &[String], out: &Output) -> String {
    format!(
        "{args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `run`, insisting on success; stdout.
pub fn run_ok<S: AsRef<std::ffi::OsStr>>(tc: &TestCluster, args: &[S]) -> String {
    let out = run(tc, args);
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    assert!(out.status.success(), "{}", show(&shown, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bash script under `madfs run`, insisting on success; stdout.
pub fn sh(tc: &TestCluster, script: &str) -> String {
    run_ok(tc, &["bash", "-c", script])
}

/// A file's contents through the CLI (not through the library).
pub fn cli_cat(tc: &TestCluster, path: &str) -> Vec<u8> {
    let out = tc.madfs(["cat", path]);
    assert!(
        out.status.success(),
        "madfs cat {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Names in a directory through the CLI, sorted.
pub fn cli_ls(tc: &TestCluster, path: &str) -> Vec<String> {
    let mut v: Vec<String> = tc
        .madfs_ok(["ls", path])
        .lines()
        .map(|l| l.to_string())
        .collect();
    v.sort();
    v
}

/// Compile one of the C programs of tests/preload into `dir`; its path.
pub fn compile(source: &str, dir: &Path) -> PathBuf {
    let src = manifest_dir().join("tests/preload").join(source);
    let exe = dir.join(source.trim_end_matches(".c"));
    let out = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Wno-nonnull",
            "-Wno-format-truncation",
            "-Wno-stringop-overflow",
            "-pthread",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
