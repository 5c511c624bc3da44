//! Guards files that lose their last name while open (pjdfstest unlink/14,
//! Python's tempfile.TemporaryFile, SQLite's temporary files): the
//! descriptor keeps working (fstat with st_nlink 0, pread, pwrite,
//! ftruncate, fsync, fchmod) until its last close, which frees the inode
//! and purges its chunks on every server. Before, the owner freed the inode
//! at the unlink and every later call through the descriptor gave ENOENT.
//!
//! The same C program (tests/preload/unlinked.c) runs on the FUSE mount and
//! under `madfs run`; the client library is driven directly. Files span
//! several chunks (on several servers of a 4-server cluster), and the
//! basic case renames the file first so that its inode lives on another
//! server than its last name. A client killed while holding such a file
//! leaves nothing once the servers restart.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;
#[path = "common/mount.rs"]
mod mount;

use common::{block_on_thread, TestCluster, CHUNK, MADFS};
use madfs_client::{Client, ErrorCode, FileName, InodeId, OpenOptions, SetAttrs};
use madfs_proto::Opcode;
use madfs_types::dentry_server;
use mount::Mount;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SERVERS: usize = 4;
/// Three and a half chunks: data on several servers, and a last partial chunk.
const SIZE: u64 = 3 * CHUNK + CHUNK / 2;

fn inodes(tc: &TestCluster) -> u64 {
    let c = tc.client();
    block_on_thread(async move { c.statfs().await.unwrap().inodes })
}

/// The chunk directories of `ino` on every server's disk.
fn chunk_dirs(tc: &TestCluster, ino: u64) -> Vec<PathBuf> {
    let name = format!("{ino:016x}");
    let mut found = Vec::new();
    for s in &tc.config().servers {
        let Ok(spreads) = std::fs::read_dir(s.data_dir.join("chunks")) else {
            continue;
        };
        for spread in spreads.flatten() {
            let p = spread.path().join(&name);
            if p.exists() {
                found.push(p);
            }
        }
    }
    found
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After a holder's last close: the inode is gone from the count and its
/// chunks from every disk.
fn wait_freed(tc: &TestCluster, ino: u64, baseline: u64) {
    wait_for(&format!("inode {ino} to be freed"), || {
        inodes(tc) == baseline && chunk_dirs(tc, ino).is_empty()
    });
}

/// Two names in directory `dir` (inode `dir_ino`) held by different
/// servers: a file made as the first and renamed to the second keeps its
/// inode on the first one's server.
fn names_on_two_servers(dir_ino: InodeId, prefix: &str) -> (String, String) {
    let server = |n: &str| dentry_server(dir_ino, &FileName::new(n.as_bytes()).unwrap(), SERVERS);
    let made = format!("{prefix}-made");
    let name = (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|n| server(n) != server(&made))
        .unwrap();
    (made, name)
}

fn ino_of(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ino "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no inode printed:\n{stdout}"))
}

fn show(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run the C program's case `args` (through `run`: directly on the mount,
/// or under `madfs run`); once it has exited, the file it held is freed.
fn run_case(
    tc: &TestCluster,
    baseline: u64,
    run: &dyn Fn(&[&std::ffi::OsStr]) -> Output,
    exe: &Path,
    args: &[&str],
) {
    let mut all: Vec<&std::ffi::OsStr> = vec![exe.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    let out = run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.ends_with("ok\n"),
        "{args:?}: {}",
        show(&out)
    );
    let ino = ino_of(&stdout);
    match args[0] {
        // One name is left: the inode stays, with its bytes.
        "link" => wait_for("the link case's inode count", || inodes(tc) == baseline + 1),
        _ => wait_freed(tc, ino, baseline),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_keeps_an_open_file_after_its_last_unlink() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let dir = c.mkdir("/d", 0o755).await.unwrap();
    let (made, name) = names_on_two_servers(dir.ino, "f");
    let (made_at, path) = (format!("/d/{made}"), format!("/d/{name}"));
    let baseline = c.statfs().await.unwrap().inodes;

    let rw = OpenOptions::new().read(true).write(true).create(true);
    let f = c.open(&made_at, rw.write_behind(true)).await.unwrap();
    let data = common::pattern(7, SIZE as usize);
    f.write_at(0, &data).await.unwrap();
    c.rename(&made_at, &path).await.unwrap();
    let ino = f.ino();
    assert_ne!(
        ino.owner(),
        dentry_server(dir.ino, &FileName::new(name.as_bytes()).unwrap(), SERVERS),
        "the inode lives on another server than its name"
    );
    c.remove_file(&path).await.unwrap();
    common::assert_err(c.stat(&path).await, ErrorCode::NotFound, libc::ENOENT);

    // Everything through the handle still works, and sees st_nlink 0.
    let a = c.fstat(ino).await.unwrap();
    assert_eq!((a.nlink, a.size), (0, SIZE));
    assert_eq!(f.read_at(0, SIZE as usize).await.unwrap(), data);
    f.write_at(SIZE, b"tail").await.unwrap();
    f.fsync().await.unwrap();
    assert_eq!(c.fstat(ino).await.unwrap().size, SIZE + 4);
    assert_eq!(
        f.read_at(SIZE - 2, 10).await.unwrap(),
        [&data[data.len() - 2..], b"tail"].concat()
    );
    f.set_len(SIZE / 2).await.unwrap();
    let chmod = SetAttrs {
        perm: Some(0o600),
        ..SetAttrs::default()
    };
    assert_eq!(c.setattr(ino, chmod).await.unwrap().perm, 0o600);
    assert_eq!(c.fstat(ino).await.unwrap().size, SIZE / 2);
    assert_eq!(
        c.statfs().await.unwrap().inodes,
        baseline + 1,
        "held, still counted"
    );
    let dirs = chunk_dirs(&tc, ino.0);
    assert!(dirs.len() >= 2, "chunks on several servers: {dirs:?}");

    // A second handle keeps it after the first closes.
    let reader = c
        .open_inode(ino, &OpenOptions::new().read(true))
        .await
        .unwrap();
    f.close().await.unwrap();
    drop(f);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(reader.read_at(0, 4).await.unwrap(), &data[..4]);
    drop(reader);
    c.release_unlinked().await.unwrap();
    wait_until_freed_async(&tc, ino.0, baseline).await;
    common::assert_err(c.getattr(ino).await, ErrorCode::NotFound, libc::ENOENT);

    // Renamed over while open: the old file stays for its handle.
    let f = c.open("/d/old", rw).await.unwrap();
    f.write_at(0, &data).await.unwrap();
    f.close().await.unwrap();
    c.write_file("/d/new", b"new").await.unwrap();
    let baseline = c.statfs().await.unwrap().inodes;
    c.rename("/d/new", "/d/old").await.unwrap();
    assert_eq!(c.fstat(f.ino()).await.unwrap().nlink, 0);
    assert_eq!(f.read_at(0, 100).await.unwrap(), &data[..100]);
    assert_eq!(c.read_file("/d/old").await.unwrap(), b"new");
    let old = f.ino();
    drop(f);
    c.release_unlinked().await.unwrap();
    wait_until_freed_async(&tc, old.0, baseline - 1).await;

    // A second name keeps it the ordinary way.
    let f = c.open("/d/two", rw).await.unwrap();
    f.write_at(0, b"both").await.unwrap();
    c.hard_link("/d/two", "/d/two-b").await.unwrap();
    c.remove_file("/d/two").await.unwrap();
    assert_eq!(c.fstat(f.ino()).await.unwrap().nlink, 1);
    drop(f);
    assert_eq!(c.read_file("/d/two-b").await.unwrap(), b"both");
}

async fn wait_until_freed_async(tc: &TestCluster, ino: u64, baseline: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let c = tc.client();
    loop {
        let n = c.statfs().await.unwrap().inodes;
        if n == baseline && chunk_dirs(tc, ino).is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "inode {ino} not freed: {n} inodes (want {baseline}), chunks {:?}",
            chunk_dirs(tc, ino)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An unlink of a file not open costs one request whatever else is open
/// (mdtest's delete phase), and holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlinking_a_file_not_open_stays_one_request() {
    let tc = TestCluster::start(SERVERS);
    let c: Client = tc.client();
    c.write_file("/a", b"a").await.unwrap();
    c.write_file("/b", b"b").await.unwrap();
    let baseline = c.statfs().await.unwrap().inodes;
    let open = c.open("/a", OpenOptions::new().read(true)).await.unwrap();
    let before = c.request_counts();
    c.remove_file("/b").await.unwrap();
    let after = c.request_counts();
    assert_eq!(after.get(Opcode::Remove) - before.get(Opcode::Remove), 1);
    assert_eq!(after.total() - before.total(), 1, "{after}");
    assert_eq!(
        c.statfs().await.unwrap().inodes,
        baseline - 1,
        "freed at once"
    );
    drop(open);
}

fn unlinked_exe(work: &Path) -> PathBuf {
    common::need("cc", "gcc");
    helpers::compile("unlinked.c", work)
}

#[test]
fn mount_keeps_an_open_file_after_its_last_unlink() {
    let tc = TestCluster::start(SERVERS);
    let work = tempfile::tempdir().unwrap();
    let exe = unlinked_exe(work.path());
    let m = Mount::new(&tc);
    std::fs::create_dir(m.join("d")).unwrap();
    let c = tc.client();
    let dir_ino = block_on_thread(async { c.stat("/d").await.unwrap().ino });
    let (made, name) = names_on_two_servers(dir_ino, "f");
    let baseline = inodes(&tc);
    let on_mount = |n: &str| m.join("d").join(n).to_string_lossy().into_owned();
    let direct = |args: &[&std::ffi::OsStr]| {
        Command::new(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let size = SIZE.to_string();
    run_case(
        &tc,
        baseline,
        &direct,
        &exe,
        &["basic", &on_mount(&name), &size, &on_mount(&made)],
    );
    run_case(
        &tc,
        baseline,
        &direct,
        &exe,
        &["basic", &on_mount("small"), "3000"],
    );
    run_case(
        &tc,
        baseline,
        &direct,
        &exe,
        &["rename", &on_mount("r"), &size],
    );
    run_case(
        &tc,
        baseline,
        &direct,
        &exe,
        &["link", &on_mount("l"), &size],
    );
    assert!(
        m.log().is_empty() || !m.log().contains("panicked"),
        "{}",
        m.log()
    );
}

#[test]
fn madfs_run_keeps_an_open_file_after_its_last_unlink() {
    let tc = TestCluster::start(SERVERS);
    let work = tempfile::tempdir().unwrap();
    let exe = unlinked_exe(work.path());
    let c = tc.client();
    let dir_ino = block_on_thread(async { c.mkdir("/d", 0o755).await.unwrap().ino });
    let (made, name) = names_on_two_servers(dir_ino, "f");
    let baseline = inodes(&tc);
    let under = |n: &str| format!("/madfs/d/{n}");
    let preloaded = |args: &[&std::ffi::OsStr]| helpers::run(&tc, args);
    let size = SIZE.to_string();
    run_case(
        &tc,
        baseline,
        &preloaded,
        &exe,
        &["basic", &under(&name), &size, &under(&made)],
    );
    run_case(
        &tc,
        baseline,
        &preloaded,
        &exe,
        &["basic", &under("small"), "3000"],
    );
    run_case(
        &tc,
        baseline,
        &preloaded,
        &exe,
        &["rename", &under("r"), &size],
    );
    run_case(
        &tc,
        baseline,
        &preloaded,
        &exe,
        &["link", &under("l"), &size],
    );

    // Python's anonymous temporary files are exactly this.
    if Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .is_ok_and(|s| s.success())
    {
        let baseline = inodes(&tc);
        let script = "import tempfile\n\
            with tempfile.TemporaryFile(dir='/madfs/d') as f:\n\
            \x20   f.write(b'x' * 3000000)\n\
            \x20   f.seek(0)\n\
            \x20   assert f.read() == b'x' * 3000000\n\
            \x20   import os; assert os.fstat(f.fileno()).st_nlink == 0\n\
            \x20   assert [n for n in os.listdir('/madfs/d') if n.startswith('tmp')] == []\n\
            print('ok')\n";
        let out = helpers::run(&tc, &["python3", "-c", script]);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout) == "ok\n",
            "{}",
            show(&out)
        );
        wait_for("python's temporary file to be freed", || {
            inodes(&tc) == baseline
        });
    }
}

/// A client killed while it holds an unlinked file leaves it held (its
/// owner cannot know the holder died); the owner's next start frees it.
#[test]
fn a_killed_holder_leaves_nothing_after_a_server_restart() {
    let mut tc = TestCluster::start(SERVERS);
    let work = tempfile::tempdir().unwrap();
    let exe = unlinked_exe(work.path());
    let c = tc.client();
    block_on_thread(async { c.mkdir("/d", 0o755).await.unwrap() });
    let baseline = inodes(&tc);
    helpers::preload_lib();
    let mut child = Command::new(MADFS)
        .args(["run", "--"])
        .arg(&exe)
        .args(["hold", "/madfs/d/held", &SIZE.to_string()])
        .env("MADFS_CLUSTER", tc.cluster_file())
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ino: u64 = lines
        .next()
        .unwrap()
        .unwrap()
        .strip_prefix("ino ")
        .expect("the inode first")
        .parse()
        .unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "held");
    child.kill().unwrap();
    child.wait().unwrap();
    // Still there: nobody released it.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(inodes(&tc), baseline + 1);
    assert!(!chunk_dirs(&tc, ino).is_empty());
    for i in 0..SERVERS {
        tc.stop(i);
        tc.restart(i);
    }
    wait_freed(&tc, ino, baseline);
    let c = tc.client();
    let gone = block_on_thread(async move { c.getattr(InodeId(ino)).await });
    common::assert_err(gone, ErrorCode::NotFound, libc::ENOENT);
}
