//! Guards error reporting: every failure comes back with the right
//! `ErrorCode` and errno (ENOENT, EEXIST, ENOTEMPTY, ENOTDIR, EISDIR, EINVAL,
//! ENAMETOOLONG, EACCES, EPERM), permission checks for non-root credentials,
//! and the `madfs` command line printing readable messages and exiting
//! non-zero on failure.

mod common;

use common::{assert_err, TestCluster};
use madfs_client::{Credentials, ErrorCode, OpenOptions};

fn user(uid: u32) -> Credentials {
    Credentials {
        uid,
        gid: uid,
        groups: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_carry_the_right_code() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    c.mkdir("/dir", 0o755).await.unwrap();
    c.write_file("/dir/file", b"x").await.unwrap();
    c.write_file("/file", b"y").await.unwrap();

    // ENOENT
    assert_err(c.stat("/missing").await, ErrorCode::NotFound, libc::ENOENT);
    assert_err(
        c.stat("/missing/deeper").await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.open("/missing", OpenOptions::new().read(true)).await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.open("/missing", OpenOptions::new().write(true)).await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.open("/nodir/f", OpenOptions::new().write(true).create(true))
            .await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.remove_file("/missing").await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.remove_dir("/missing").await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.rename("/missing", "/x").await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );
    assert_err(
        c.mkdir("/no/such", 0o755).await,
        ErrorCode::NotFound,
        libc::ENOENT,
    );

    // EEXIST
    assert_err(
        c.mkdir("/dir", 0o755).await,
        ErrorCode::Exists,
        libc::EEXIST,
    );
    assert_err(
        c.mkdir("/file", 0o755).await,
        ErrorCode::Exists,
        libc::EEXIST,
    );
    assert_err(
        c.open("/file", OpenOptions::new().write(true).create_new(true))
            .await,
        ErrorCode::Exists,
        libc::EEXIST,
    );
    assert_err(
        c.open("/dir", OpenOptions::new().write(true).create_new(true))
            .await,
        ErrorCode::Exists,
        libc::EEXIST,
    );
    assert_err(
        c.symlink("/x", "/file").await,
        ErrorCode::Exists,
        libc::EEXIST,
    );
    // Exclusive create really did not touch the file.
    assert_eq!(c.read_file("/file").await.unwrap(), b"y");

    // ENOTEMPTY
    assert_err(
        c.remove_dir("/dir").await,
        ErrorCode::NotEmpty,
        libc::ENOTEMPTY,
    );
    assert_eq!(c.read_file("/dir/file").await.unwrap(), b"x");

    // ENOTDIR
    assert_err(
        c.stat("/file/below").await,
        ErrorCode::NotDir,
        libc::ENOTDIR,
    );
    assert_err(
        c.open("/file/below", OpenOptions::new().write(true).create(true))
            .await,
        ErrorCode::NotDir,
        libc::ENOTDIR,
    );
    assert_err(c.stat("/file/").await, ErrorCode::NotDir, libc::ENOTDIR);
    assert_err(
        c.remove_dir("/file").await,
        ErrorCode::NotDir,
        libc::ENOTDIR,
    );
    assert_err(c.read_dir("/file").await, ErrorCode::NotDir, libc::ENOTDIR);
    assert_err(
        c.mkdir("/file/sub", 0o755).await,
        ErrorCode::NotDir,
        libc::ENOTDIR,
    );

    // EISDIR
    assert_err(c.remove_file("/dir").await, ErrorCode::IsDir, libc::EISDIR);
    assert_err(
        c.open("/dir", OpenOptions::new().write(true)).await,
        ErrorCode::IsDir,
        libc::EISDIR,
    );
    assert_err(
        c.open("/dir", OpenOptions::new().write(true).create(true))
            .await,
        ErrorCode::IsDir,
        libc::EISDIR,
    );
    assert_err(c.truncate("/dir", 0).await, ErrorCode::IsDir, libc::EISDIR);
    assert_err(c.read_file("/dir").await, ErrorCode::IsDir, libc::EISDIR);

    // EINVAL: a directory into its own subdirectory.
    c.mkdir_all("/dir/sub/subsub", 0o755).await.unwrap();
    assert_err(
        c.rename("/dir", "/dir/sub/moved").await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );
    assert_err(
        c.rename("/dir", "/dir/sub/subsub/moved").await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );
    assert!(c.stat("/dir/sub/subsub").await.is_ok(), "tree left intact");

    // ENAMETOOLONG: a 256-byte name, a path over 4096 bytes.
    let long = format!("/{}", "n".repeat(256));
    assert_err(
        c.mkdir(long.as_str(), 0o755).await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );
    assert_err(
        c.write_file(long.as_str(), b"x").await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );
    assert_err(
        c.stat(long.as_str()).await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );
    // 255 bytes is fine.
    let ok = format!("/{}", "n".repeat(255));
    c.write_file(ok.as_str(), b"ok").await.unwrap();
    assert_eq!(c.read_file(ok.as_str()).await.unwrap(), b"ok");
    let deep = "/d".repeat(2049); // 4098 bytes
    assert_err(
        c.stat(deep.as_str()).await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );
    assert_err(
        c.mkdir_all(deep.as_str(), 0o755).await,
        ErrorCode::NameTooLong,
        libc::ENAMETOOLONG,
    );

    // Open-handle misuse: EBADF.
    let f = c
        .open("/file", OpenOptions::new().read(true))
        .await
        .unwrap();
    assert_err(
        f.write_at(0, b"z").await,
        ErrorCode::BadFileHandle,
        libc::EBADF,
    );
    let f = c
        .open("/file", OpenOptions::new().write(true))
        .await
        .unwrap();
    assert_err(f.read_at(0, 1).await, ErrorCode::BadFileHandle, libc::EBADF);
}

/// rename(2) refuses to move a directory below itself (EINVAL) however
/// the destination is spelled: through "..", and through a symlink that
/// leads into the directory. Otherwise the subtree becomes a cycle cut off
/// from the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_cannot_move_into_its_own_subtree_via_a_symlink() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    c.mkdir_all("/top/sub/deeper", 0o755).await.unwrap();
    c.write_file("/top/sub/deeper/data", b"precious")
        .await
        .unwrap();
    // Through "..": caught on the lexical path.
    assert_err(
        c.rename("/top", "/top/sub/../sub/moved").await,
        ErrorCode::InvalidArgument,
        libc::EINVAL,
    );
    // Through symlinks (absolute and relative) that lead inside /top.
    c.symlink("/top/sub", "/abs-link").await.unwrap();
    c.mkdir("/other", 0o755).await.unwrap();
    c.symlink("../top/sub/deeper", "/other/rel-link")
        .await
        .unwrap();
    for dst in [
        "/abs-link/moved",
        "/abs-link/deeper/moved",
        "/other/rel-link/moved",
    ] {
        let r = c.rename("/top", dst).await;
        // Whatever happened, the tree must still hang off the root.
        let still_there = c.stat("/top/sub/deeper/data").await;
        assert_eq!(
            r.as_ref().map_err(|e| e.code),
            Err(ErrorCode::InvalidArgument),
            "rename /top -> {dst} (through a symlink into /top itself)"
        );
        assert!(
            still_there.is_ok(),
            "after rename /top -> {dst}, /top/sub/deeper/data is unreachable: {still_there:?}"
        );
    }
    assert_eq!(
        c.read_file("/top/sub/deeper/data").await.unwrap(),
        b"precious"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_are_enforced_for_non_root() {
    let tc = TestCluster::start(3);
    let root = tc.client().with_credentials(Credentials::root());
    let alice = root.with_credentials(user(1000));
    let bob = root.with_credentials(user(1001));

    root.mkdir("/locked", 0o755).await.unwrap();
    root.write_file("/locked/existing", b"x").await.unwrap();
    root.write_file("/secret", b"top secret").await.unwrap();
    root.set_permissions("/secret", 0o600).await.unwrap();
    root.write_file("/public", b"hello").await.unwrap();
    root.set_permissions("/public", 0o644).await.unwrap();

    // Creating in a root-owned 0755 directory (several names, so several
    // dentry servers check it).
    for i in 0..8 {
        assert_err(
            alice.write_file(format!("/locked/f{i}"), b"x").await,
            ErrorCode::AccessDenied,
            libc::EACCES,
        );
        assert_err(
            alice.mkdir(format!("/locked/d{i}"), 0o755).await,
            ErrorCode::AccessDenied,
            libc::EACCES,
        );
    }
    assert_err(
        alice.remove_file("/locked/existing").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_err(
        alice.rename("/locked/existing", "/locked/renamed").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_eq!(
        root.read_dir("/locked").await.unwrap().len(),
        1,
        "nothing was created or removed"
    );
    // Reading a 0600 root file; writing a 0644 one.
    assert_err(
        alice.read_file("/secret").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_err(
        alice.open("/public", OpenOptions::new().write(true)).await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_eq!(alice.read_file("/public").await.unwrap(), b"hello");
    // Only the owner (or root) may chmod; only root may chown.
    assert_err(
        alice.set_permissions("/public", 0o666).await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );
    assert_err(
        alice.chown("/public", Some(1000), None).await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );

    // A directory alice owns: she may create, chmod, but not give away.
    root.mkdir("/home", 0o755).await.unwrap();
    root.mkdir("/home/alice", 0o755).await.unwrap();
    root.chown("/home/alice", Some(1000), Some(1000))
        .await
        .unwrap();
    alice
        .write_file("/home/alice/notes", b"mine")
        .await
        .unwrap();
    let a = alice.stat("/home/alice/notes").await.unwrap();
    assert_eq!(
        (a.uid, a.gid),
        (1000, 1000),
        "files belong to their creator"
    );
    alice
        .set_permissions("/home/alice/notes", 0o600)
        .await
        .unwrap();
    assert_err(
        alice.chown("/home/alice/notes", Some(1001), None).await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );
    assert_err(
        bob.read_file("/home/alice/notes").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    assert_err(
        bob.write_file("/home/alice/bobs", b"x").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    // A directory without x for others cannot be traversed.
    alice.set_permissions("/home/alice", 0o700).await.unwrap();
    assert_err(
        bob.stat("/home/alice/notes").await,
        ErrorCode::AccessDenied,
        libc::EACCES,
    );
    // Root still reads everything.
    assert_eq!(root.read_file("/home/alice/notes").await.unwrap(), b"mine");

    // Sticky directory: bob may not remove alice's file.
    root.mkdir("/tmp", 0o1777).await.unwrap();
    alice.write_file("/tmp/a", b"a").await.unwrap();
    assert_err(
        bob.remove_file("/tmp/a").await,
        ErrorCode::NotPermitted,
        libc::EPERM,
    );
    assert_eq!(root.read_file("/tmp/a").await.unwrap(), b"a");
    alice.remove_file("/tmp/a").await.unwrap();
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn cli_failures_exit_non_zero_with_readable_messages() {
    let tc = TestCluster::start(2);
    tc.madfs_ok(["mkdir", "/dir"]);
    let tmp = tc.root().join("local.txt");
    std::fs::write(&tmp, b"content").unwrap();
    tc.madfs_ok(["put".as_ref(), tmp.as_os_str(), "/dir/f".as_ref()]);

    let out = tc.madfs(["stat", "/missing"]);
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("cannot stat '/missing': no such file or directory"),
        "stderr: {err}"
    );

    let out = tc.madfs(["rm", "/dir"]);
    assert!(!out.status.success(), "rm of a directory without -r");
    let err = stderr_of(&out);
    assert!(err.contains("Is a directory"), "stderr: {err}");
    tc.madfs_ok(["stat", "/dir/f"]); // still there

    let out = tc.madfs(["mkdir", "/a/b"]);
    assert!(!out.status.success(), "mkdir without -p");
    let err = stderr_of(&out);
    assert!(
        err.contains("cannot create directory '/a/b': no such file or directory"),
        "stderr: {err}"
    );
    tc.madfs_ok(["mkdir", "-p", "/a/b"]);
    tc.madfs_ok(["stat", "/a/b"]);

    let out = tc.madfs(["mkdir", "/dir"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("file exists"),
        "{}",
        stderr_of(&out)
    );

    let out = tc.madfs(["cat", "/missing"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("no such file or directory"),
        "{}",
        stderr_of(&out)
    );

    let out = tc.madfs(["rm", "/missing"]);
    assert!(!out.status.success());
    tc.madfs_ok(["rm", "-f", "/missing"]);

    let out = tc.madfs(["mv", "/missing", "/x"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("no such file or directory"),
        "{}",
        stderr_of(&out)
    );

    let out = tc.madfs(["mkdir", "-m", "99", "/bad"]);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("invalid mode"),
        "{}",
        stderr_of(&out)
    );

    // No cluster at all: a clear error, not a panic.
    let out = std::process::Command::new(common::MADFS)
        .args(["ls", "/"])
        .env("MADFS_CLUSTER", tc.root().join("nope.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(err.contains("nope.toml"), "stderr: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
}

/// A RocksDB library named in MADFS_ROCKSDB_LIB is the one loaded: one
/// that cannot be loaded stops the server with a message naming it (no
/// silent fallback to the system's); unset, the server's log (at info)
/// says which library it loaded.
#[test]
fn a_rocksdb_library_that_cannot_load_stops_the_server_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = |lib: Option<&str>| {
        let mut cmd = std::process::Command::new(common::MADFS);
        cmd.args(["up", "--servers", "1", "--data"])
            .arg(&data)
            .env("MADFS_LOG", "info");
        match lib {
            Some(l) => cmd.env("MADFS_ROCKSDB_LIB", l),
            None => cmd.env_remove("MADFS_ROCKSDB_LIB"),
        };
        cmd.output().unwrap()
    };
    let down = || {
        std::process::Command::new(common::MADFS)
            .args(["down", "--data"])
            .arg(&data)
            .output()
            .unwrap()
    };
    let missing = dir.path().join("no-such-librocksdb.so");
    let out = up(Some(missing.to_str().unwrap()));
    let log = std::fs::read_to_string(data.join("server-0.log")).unwrap_or_default();
    down();
    assert!(
        !out.status.success(),
        "up with an unloadable RocksDB succeeded"
    );
    let said = format!("{}{log}", stderr_of(&out));
    assert!(
        said.contains("no-such-librocksdb.so") && said.contains("MADFS_ROCKSDB_LIB"),
        "up's stderr and the server's log: {said}"
    );
    assert!(!said.contains("panicked"), "{said}");

    std::fs::remove_dir_all(&data).unwrap();
    let out = up(None);
    let log = std::fs::read_to_string(data.join("server-0.log")).unwrap_or_default();
    down();
    assert!(out.status.success(), "up: {}", stderr_of(&out));
    assert!(
        log.contains("RocksDB from librocksdb.so"),
        "server log: {log}"
    );
}
