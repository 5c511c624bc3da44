//! Commands run with a time limit (a hung `madfs` fails its test instead
//! of hanging the suite), and their output for assertion messages. Shared
//! by the tests that run the `madfs` binary and shell tools directly.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run `cmd` (its stdout and stderr captured) with `input` on its standard
/// input (else none), killed after `limit`.
pub fn output_within(mut cmd: Command, limit: Duration, input: Option<&str>) -> Output {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    if let Some(input) = input {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(input.as_bytes()).expect("writing stdin");
    }
    let pid = child.id() as i32;
    let done = Arc::new(AtomicBool::new(false));
    let finished = done.clone();
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if finished.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: our own child, not yet reaped (the caller's thread waits
        // on it).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("wait");
    done.store(true, Ordering::SeqCst);
    let _ = watchdog.join();
    out
}

/// Exit status, stdout and stderr, for an assertion message.
pub fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The stdout of a command that must have succeeded.
pub fn must(out: Output) -> String {
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
