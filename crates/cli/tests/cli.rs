//! Guards the `madfs` command line as a user meets it: `up` starts a local
//! cluster that `status` reports, the file commands (put/cat/get/ls/stat/
//! mkdir/mv/ln/rm) round-trip data and names, `down` really stops the
//! servers, and `up` on the same data directory brings the data back.

mod common;

use common::MADFS;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs `madfs down --data DIR` when dropped, so a failed assertion never
/// leaves servers running.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(MADFS)
            .arg("down")
            .arg("--data")
            .arg(&self.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn run(cluster: &Path, args: &[&str]) -> Output {
    Command::new(MADFS)
        .args(args)
        .env("MADFS_CLUSTER", cluster)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn ok(cluster: &Path, args: &[&str]) -> String {
    let out = run(cluster, args);
    assert!(
        out.status.success(),
        "madfs {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn up(data: &Path) -> Output {
    Command::new(MADFS)
        .args(["up", "--servers", "2", "--data"])
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Alive and not a zombie.
fn process_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            state != Some("Z")
        }
        Err(_) => false,
    }
}

fn server_pids(data: &Path) -> Vec<i32> {
    (0..2)
        .map(|i| {
            std::fs::read_to_string(data.join(format!("server-{i}.pid")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn up_status_file_commands_down() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cluster = data.join("cluster.toml");
    let _down = Down(data.clone());

    let out = up(&data);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "up failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("MadFS cluster up: 2 servers"), "{stdout}");
    assert!(stdout.contains(&format!("export MADFS_CLUSTER={}", cluster.display())));
    assert!(cluster.exists() && data.join("cluster.key").exists());
    let pids = server_pids(&data);
    assert!(pids.iter().all(|&p| process_running(p)));

    let status = ok(&cluster, &["status"]);
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert!(
        rows.iter()
            .all(|r| r.split_whitespace().nth(2) == Some("up")),
        "{status}"
    );
    assert!(status.lines().next().unwrap().contains("STATE"));
    // Its reader gone first (`madfs status | head -0`): a quiet end by
    // SIGPIPE, as other tools, not a panic.
    let mut child = Command::new(MADFS)
        .arg("status")
        .env("MADFS_CLUSTER", &cluster)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{}: {stderr}",
            out.status
        );
    }

    // `up` again while running: nothing new is started.
    let out = up(&data);
    assert!(out.status.success());
    assert_eq!(server_pids(&data), pids, "a second up restarted servers");

    // put / cat / get
    let local = tmp.path().join("hello.txt");
    let content = b"hello, madfs\nsecond line\n".repeat(1000);
    std::fs::write(&local, &content).unwrap();
    ok(&cluster, &["put", local.to_str().unwrap(), "/hello.txt"]);
    let out = run(&cluster, &["cat", "/hello.txt"]);
    assert!(out.status.success());
    assert!(out.stdout == content, "cat differs");
    let back = tmp.path().join("back.txt");
    ok(&cluster, &["get", "/hello.txt", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == content);
    // put from stdin
    let mut child = Command::new(MADFS)
        .args(["put", "-", "/stdin.txt"])
        .env("MADFS_CLUSTER", &cluster)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(ok(&cluster, &["cat", "/stdin.txt"]), "from stdin");
    // cat of several files concatenates
    assert_eq!(
        ok(&cluster, &["cat", "/stdin.txt", "/stdin.txt"]),
        "from stdinfrom stdin"
    );

    // mkdir / ls / stat
    ok(&cluster, &["mkdir", "-p", "/a/b"]);
    ok(&cluster, &["mkdir", "-m", "700", "/private"]);
    assert_eq!(
        ok(&cluster, &["ls", "/"]).lines().collect::<Vec<_>>(),
        vec!["a", "hello.txt", "private", "stdin.txt"]
    );
    let long = ok(&cluster, &["ls", "-l", "/"]);
    let line = long.lines().find(|l| l.ends_with(" private")).unwrap();
    assert!(line.starts_with("drwx------"), "{long}");
    let line = long.lines().find(|l| l.ends_with(" hello.txt")).unwrap();
    assert!(line.starts_with("-rw-r--r--"), "{long}");
    assert!(line.contains(&content.len().to_string()), "{long}");
    let st = ok(&cluster, &["stat", "/hello.txt"]);
    assert!(st.contains("regular file"), "{st}");
    assert!(st.contains(&format!("Size: {}", content.len())), "{st}");
    assert!(st.contains("Links: 1"), "{st}");
    assert!(ok(&cluster, &["stat", "/a"]).contains("directory"));
    // Times as ls and stat print them: `Nov 23 20:50` (a recent file) and
    // `2026-11-23 20:50:07.123456789 +0000`.
    let cols: Vec<&str> = line.split_whitespace().collect();
    let months = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec";
    assert!(months.split(' ').any(|m| m == cols[5]), "{line}");
    assert!(
        cols[6].parse::<u32>().is_ok_and(|d| (1..=31).contains(&d)),
        "{line}"
    );
    assert!(is_shape(cols[7], "00:00"), "{line}");
    for field in ["Access: ", "Modify: ", "Change: ", " Birth: "] {
        let t = st
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(field))
            .unwrap();
        assert!(is_shape(t, "0000-00-00 00:00:00.000000000 +0000"), "{st}");
    }
    // put into a directory writes the file under its own name there, as cp.
    ok(&cluster, &["put", local.to_str().unwrap(), "/private"]);
    ok(&cluster, &["put", local.to_str().unwrap(), "/private/"]);
    assert_eq!(ok(&cluster, &["ls", "/private"]), "hello.txt\n");
    assert!(run(&cluster, &["cat", "/private/hello.txt"]).stdout == content);
    let out = run(&cluster, &["put", "-", "/private"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'/private' is a directory"),
        "{out:?}"
    );

    // mv: rename, and move into a directory
    ok(&cluster, &["mv", "/hello.txt", "/greeting.txt"]);
    ok(&cluster, &["mv", "/greeting.txt", "/a/b"]);
    assert_eq!(ok(&cluster, &["ls", "/a/b"]), "greeting.txt\n");
    assert!(!run(&cluster, &["stat", "/greeting.txt"]).status.success());
    assert!(run(&cluster, &["cat", "/a/b/greeting.txt"]).stdout == content);

    // ln -s and ln
    ok(&cluster, &["ln", "-s", "/a/b/greeting.txt", "/link"]);
    assert!(run(&cluster, &["cat", "/link"]).stdout == content);
    let long = ok(&cluster, &["ls", "-l", "/"]);
    let line = long.lines().find(|l| l.contains(" link")).unwrap();
    assert!(line.starts_with('l'), "{long}");
    assert!(line.ends_with("link -> /a/b/greeting.txt"), "{long}");
    assert!(ok(&cluster, &["stat", "/link"]).contains("symbolic link"));
    ok(&cluster, &["ln", "/a/b/greeting.txt", "/hard"]);
    assert!(ok(&cluster, &["stat", "/hard"]).contains("Links: 2"));
    assert!(!run(&cluster, &["ln", "/a", "/dirlink"]).status.success());

    // rm and rm -r
    ok(&cluster, &["rm", "/hard"]);
    assert!(ok(&cluster, &["stat", "/a/b/greeting.txt"]).contains("Links: 1"));
    ok(&cluster, &["rm", "-r", "/a"]);
    assert!(!run(&cluster, &["stat", "/a"]).status.success());
    ok(&cluster, &["rm", "/link"]); // now dangling; removing it still works
    assert_eq!(
        ok(&cluster, &["ls", "/"]).lines().collect::<Vec<_>>(),
        vec!["private", "stdin.txt"]
    );

    // down, told which cluster by $MADFS_CLUSTER alone (as every other
    // command is): the servers are gone and status says so.
    let out = run(&cluster, &["down"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopped 2 servers"), "{text}");
    for p in &pids {
        assert!(
            !process_running(*p),
            "server pid {p} still running after down"
        );
    }
    let out = run(&cluster, &["status"]);
    assert!(!out.status.success(), "status succeeded with no servers");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains(" down ")).count(),
        2,
        "{text}"
    );
    let out = run(&cluster, &["ls", "/"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server unavailable"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // up again on the same data: the files are back.
    let out = up(&data);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ok(&cluster, &["cat", "/stdin.txt"]), "from stdin");
    assert_eq!(
        ok(&cluster, &["ls", "/"]).lines().collect::<Vec<_>>(),
        vec!["private", "stdin.txt"]
    );
    // `_down` stops it.
}

/// Whether `s` has the shape of `pattern`: a digit where it has '0', the
/// same character elsewhere (a time zone's sign may be + or -).
fn is_shape(s: &str, pattern: &str) -> bool {
    s.len() == pattern.len()
        && s.chars().zip(pattern.chars()).all(|(c, p)| match p {
            '0' => c.is_ascii_digit(),
            '+' => c == '+' || c == '-',
            p => c == p,
        })
}
