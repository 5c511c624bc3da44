//! `madfs run` with unmodified programs: coreutils, bash, tar, python.
//! Every result is checked through the CLI (client library), not through the
//! interception library itself.

mod common;
#[path = "preload/helpers.rs"]
mod helpers;

use common::{pattern, TestCluster};
use helpers::{cli_cat, cli_ls, run, run_ok, sh};

/// A local directory with files of several sizes (some span chunks: the
/// test cluster's chunk is 1 MiB), a subdirectory and a symlink.
fn local_tree() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("small.txt"), b"hello madfs\n").unwrap();
    std::fs::write(root.join("sub/mid.bin"), pattern(1, 200_000)).unwrap();
    std::fs::write(
        root.join("sub/deeper/big.bin"),
        pattern(2, 3 * 1024 * 1024 + 17),
    )
    .unwrap();
    std::os::unix::fs::symlink("small.txt", root.join("link")).unwrap();
    d
}

#[test]
fn coreutils() {
    let tc = TestCluster::start(3);
    let local = local_tree();
    let l = local.path().display().to_string();

    sh(&tc, "mkdir -p /madfs/a/b/c && mkdir /madfs/a/e");
    assert_eq!(cli_ls(&tc, "/a"), ["b", "e"]);
    assert_eq!(cli_ls(&tc, "/a/b"), ["c"]);

    // cp in, cat out, cmp.
    sh(&tc, &format!("cp {l}/sub/deeper/big.bin /madfs/a/big"));
    assert_eq!(cli_cat(&tc, "/a/big"), pattern(2, 3 * 1024 * 1024 + 17));
    let out_file = local.path().join("back.bin");
    sh(&tc, &format!("cat /madfs/a/big > {}", out_file.display()));
    assert_eq!(
        std::fs::read(&out_file).unwrap(),
        pattern(2, 3 * 1024 * 1024 + 17)
    );
    sh(&tc, &format!("cmp {l}/sub/deeper/big.bin /madfs/a/big"));

    // dd with fsync, in blocks that do not divide the chunk size.
    sh(
        &tc,
        &format!("dd if={l}/sub/mid.bin of=/madfs/a/dd bs=7000 conv=fsync status=none"),
    );
    assert_eq!(cli_cat(&tc, "/a/dd"), pattern(1, 200_000));

    // stat and ls -l show MadFS's attributes.
    let st = sh(&tc, "stat -c '%s %F %a' /madfs/a/big /madfs/a/b");
    assert_eq!(
        st,
        format!(
            "{} regular file 644\n0 directory 755\n",
            3 * 1024 * 1024 + 17
        )
    );
    let ls = sh(&tc, "ls -l /madfs/a");
    let big_line = ls
        .lines()
        .find(|l| l.ends_with(" big"))
        .expect("big listed");
    assert!(big_line.starts_with("-rw-r--r--"), "{ls}");
    assert!(
        big_line.contains(&(3 * 1024 * 1024 + 17).to_string()),
        "{ls}"
    );
    assert!(
        ls.lines().any(|l| l.starts_with('d') && l.ends_with(" b")),
        "{ls}"
    );

    // mv within MadFS is a rename; mv out of it copies (EXDEV).
    sh(&tc, "mv /madfs/a/big /madfs/a/b/moved");
    assert_eq!(cli_ls(&tc, "/a"), ["b", "dd", "e"]);
    assert_eq!(cli_ls(&tc, "/a/b"), ["c", "moved"]);
    sh(&tc, &format!("mv /madfs/a/dd {l}/dd-out"));
    assert_eq!(
        std::fs::read(local.path().join("dd-out")).unwrap(),
        pattern(1, 200_000)
    );
    assert_eq!(cli_ls(&tc, "/a"), ["b", "e"]);

    // find and du walk the tree.
    let found = sh(&tc, "find /madfs/a | sort");
    assert_eq!(
        found,
        "/madfs/a\n/madfs/a/b\n/madfs/a/b/c\n/madfs/a/b/moved\n/madfs/a/e\n"
    );
    let found = sh(&tc, "find /madfs/a -type f -size +1M");
    assert_eq!(found, "/madfs/a/b/moved\n");
    let du = sh(&tc, "du -sb /madfs/a");
    let bytes: u64 = du.split_whitespace().next().unwrap().parse().unwrap();
    assert!(bytes >= 3 * 1024 * 1024 + 17, "{du}");

    // cp -r a whole tree in (symlink kept as a symlink with -a), and back out.
    sh(&tc, &format!("cp -a {l} /madfs/tree"));
    assert_eq!(
        cli_cat(&tc, "/tree/sub/deeper/big.bin"),
        pattern(2, 3 * 1024 * 1024 + 17)
    );
    assert_eq!(cli_cat(&tc, "/tree/link"), b"hello madfs\n");
    let back = tempfile::tempdir().unwrap();
    sh(
        &tc,
        &format!(
            "cp -r /madfs/tree {}/t && diff -r {l} {}/t",
            back.path().display(),
            back.path().display()
        ),
    );

    // rm -r removes everything.
    sh(&tc, "rm -r /madfs/a /madfs/tree");
    assert!(cli_ls(&tc, "/").is_empty());

    // Errors are the kernel's: missing file, not a directory, exists.
    let out = run(&tc, &["cat", "/madfs/nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    let out = run(&tc, &["mkdir", "/madfs"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("File exists"),
        "{out:?}"
    );
}

#[test]
fn bash_redirection_and_working_directory() {
    let tc = TestCluster::start(2);
    // The brief's case: stdout of bash itself stays on the terminal (here:
    // the pipe the test reads), the redirected echo lands in MadFS.
    let out = run(&tc, &["bash", "-c", "echo x > /madfs/f; echo y"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"y\n");
    assert_eq!(cli_cat(&tc, "/f"), b"x\n");

    // Appends, external commands writing a redirected stdout (through
    // stdio: printf, ls), a group of both, stdin from MadFS, pipes.
    let got = sh(
        &tc,
        "echo one >> /madfs/f; echo two >> /madfs/f; \
         /usr/bin/printf '%s\\n' ext > /madfs/ext; \
         { echo a; ls /madfs; echo b; } > /madfs/group; \
         sort -r < /madfs/group | head -1; \
         wc -l < /madfs/f; cat /madfs/f | tr a-z A-Z",
    );
    assert_eq!(got, "group\n3\nX\nONE\nTWO\n");
    assert_eq!(cli_cat(&tc, "/f"), b"x\none\ntwo\n");
    assert_eq!(cli_cat(&tc, "/ext"), b"ext\n");
    assert_eq!(cli_cat(&tc, "/group"), b"a\next\nf\ngroup\nb\n");

    // cd into MadFS: relative paths, pwd, $PWD for children, cd back out.
    let got = sh(
        &tc,
        "mkdir -p /madfs/w/x && cd /madfs/w && pwd && echo rel > x/r && cat x/r && \
         ls && /bin/pwd && cd x && cat ../x/r && cd .. && cd .. && pwd && cd /tmp && pwd",
    );
    assert_eq!(got, "/madfs/w\nrel\nx\n/madfs/w\nrel\n/madfs\n/tmp\n");
    assert_eq!(cli_cat(&tc, "/w/x/r"), b"rel\n");
}

#[test]
fn tar_round_trip() {
    common::need("tar", "tar");
    let tc = TestCluster::start(3);
    let local = local_tree();
    let l = local.path().display().to_string();
    sh(
        &tc,
        &format!(
            "tar -C {l} -cf /madfs/t.tar . && mkdir /madfs/x && tar -C /madfs/x -xf /madfs/t.tar"
        ),
    );
    assert_eq!(
        cli_cat(&tc, "/x/sub/deeper/big.bin"),
        pattern(2, 3 * 1024 * 1024 + 17)
    );
    assert_eq!(cli_cat(&tc, "/x/small.txt"), b"hello madfs\n");
    assert!(tc
        .madfs_ok(["ls", "-l", "/x"])
        .contains("link -> small.txt"));
    // Out again with tar reading MadFS (and writing to a pipe), compared
    // with the original.
    let back = tempfile::tempdir().unwrap();
    let b = back.path().display().to_string();
    sh(
        &tc,
        &format!("tar -C /madfs/x -cf - . | tar -C {b} -xf - && diff -r {l} {b}"),
    );
    // Compressed, with the compressor as a child writing into MadFS.
    common::need("gzip", "gzip");
    sh(
        &tc,
        &format!("tar -C {l} -czf /madfs/t.tgz . && tar -tzf /madfs/t.tgz | sort > {b}/list"),
    );
    let list = std::fs::read_to_string(back.path().join("list")).unwrap();
    assert!(list.contains("./sub/deeper/big.bin"), "{list}");
}

#[test]
fn python_script() {
    common::need("python3", "python3");
    let tc = TestCluster::start(3);
    let script = r#"
import os, shutil, errno
os.makedirs("/madfs/py/sub", exist_ok=True)
with open("/madfs/py/a.txt", "w") as f:
    for i in range(1000):
        f.write(f"line {i}\n")
with open("/madfs/py/a.txt") as f:
    lines = f.readlines()
assert len(lines) == 1000 and lines[999] == "line 999\n", lines[-1]
with open("/madfs/py/b.bin", "wb") as f:
    f.write(bytes(range(256)) * 8192)          # 2 MiB: two chunks
with open("/madfs/py/b.bin", "r+b") as f:
    f.seek(1_500_000); f.write(b"XYZ"); f.seek(0, 2); end = f.tell()
assert end == 2 * 1024 * 1024, end
os.rename("/madfs/py/a.txt", "/madfs/py/sub/renamed.txt")
shutil.copy("/madfs/py/b.bin", "/madfs/py/sub/copy.bin")
shutil.copytree("/madfs/py/sub", "/madfs/py/tree")
st = os.stat("/madfs/py/tree/copy.bin")
assert st.st_size == 2 * 1024 * 1024
print(sorted(os.listdir("/madfs/py")))
print(sorted(os.listdir("/madfs/py/tree")))
print(sorted(e.name for e in os.scandir("/madfs/py/sub")))
walked = sorted(os.path.join(d, f) for d, _, fs in os.walk("/madfs/py") for f in fs)
print(len(walked))
try:
    open("/madfs/py/missing")
except FileNotFoundError as e:
    print("missing", e.errno == errno.ENOENT)
try:
    os.rmdir("/madfs/py")
except OSError as e:
    print("notempty", e.errno == errno.ENOTEMPTY)
shutil.rmtree("/madfs/py/tree")
os.unlink("/madfs/py/sub/copy.bin")
print(os.path.exists("/madfs/py/tree"), os.path.isdir("/madfs/py/sub"))
os.chdir("/madfs/py")
print(os.getcwd(), sorted(os.listdir(".")))
"#;
    let out = run_ok(&tc, &["python3", "-c", script]);
    assert_eq!(
        out,
        "['b.bin', 'sub', 'tree']\n['copy.bin', 'renamed.txt']\n['copy.bin', 'renamed.txt']\n5\n\
         missing True\nnotempty True\nFalse True\n/madfs/py ['b.bin', 'sub']\n"
    );
    let mut want = Vec::new();
    for i in 0..1000 {
        want.extend_from_slice(format!("line {i}\n").as_bytes());
    }
    assert_eq!(cli_cat(&tc, "/py/sub/renamed.txt"), want);
    let mut b: Vec<u8> = (0..=255u8).collect::<Vec<u8>>().repeat(8192);
    b[1_500_000..1_500_003].copy_from_slice(b"XYZ");
    assert_eq!(cli_cat(&tc, "/py/b.bin"), b);
    assert_eq!(cli_ls(&tc, "/py/sub"), ["renamed.txt"]);
}

#[test]
fn unsupported_calls_say_so_once() {
    common::need("python3", "python3");
    let tc = TestCluster::start(1);
    let script = r#"
import fcntl, errno
f = open("/madfs/locked", "w")
for _ in range(3):
    try:
        fcntl.flock(f, fcntl.LOCK_EX)
        print("locked?!")
    except OSError as e:
        print(e.errno == errno.ENOTSUP)
"#;
    let out = run(&tc, &["python3", "-c", script]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "True\nTrue\nTrue\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("flock is not supported").count(), 1, "{err}");
}
