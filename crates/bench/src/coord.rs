//! The parent of a run: makes the run directory, starts the rank processes,
//! runs each phase behind a barrier (every rank is idle and told "go" at
//! once), times it from the first rank's start to the last rank's end,
//! checks what it can (find's match count), and cleans up.

use crate::engine::Result;
use crate::rank::Layout;
use crate::report::{PhaseResult, RunResult};
use crate::{md_name, now_s, Config, Target, PHASES};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

struct RankProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// The rank processes; killed (each by its own handle) if the run fails.
struct Ranks(Vec<RankProc>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for p in &mut self.0 {
            if let Ok(None) = p.child.try_wait() {
                let _ = p.child.kill();
            }
            let _ = p.child.wait();
        }
    }
}

impl Ranks {
    fn send(&mut self, r: usize, line: &str) -> Result<()> {
        let p = &mut self.0[r];
        writeln!(p.stdin, "{line}")
            .and_then(|_| p.stdin.flush())
            .map_err(|e| format!("rank {r} went away ({e})"))
    }

    fn send_all(&mut self, line: &str) -> Result<()> {
        (0..self.0.len()).try_for_each(|r| self.send(r, line))
    }

    /// The next line of rank `r`, which must start with `want`; its rest.
    fn expect(&mut self, r: usize, want: &str) -> Result<String> {
        let mut line = String::new();
        let n = self.0[r]
            .stdout
            .read_line(&mut line)
            .map_err(|e| format!("rank {r}: {e}"))?;
        if n == 0 {
            return Err(format!("rank {r} exited unexpectedly"));
        }
        let line = line.trim_end();
        if let Some(msg) = line.strip_prefix("fail ") {
            return Err(msg.to_string());
        }
        match line.strip_prefix(want) {
            Some(rest) => Ok(rest.trim_start().to_string()),
            None => Err(format!("rank {r}: expected '{want}', got '{line}'")),
        }
    }
}

/// A rank's `done` line.
struct Done {
    ops: u64,
    bytes: u64,
    t0: f64,
    t1: f64,
    errors: u64,
    matched: u64,
}

fn parse_done(r: usize, s: &str) -> Result<Done> {
    let f: Vec<&str> = s.split(' ').collect();
    let bad = || format!("rank {r}: bad done line '{s}'");
    if f.len() != 6 {
        return Err(bad());
    }
    let u = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
    let t = |i: usize| f[i].parse::<f64>().map_err(|_| bad());
    Ok(Done {
        ops: u(0)?,
        bytes: u(1)?,
        t0: t(2)?,
        t1: t(3)?,
        errors: u(4)?,
        matched: u(5)?,
    })
}

/// The write phase whose per-rank counts a phase needs.
fn source_of(phase: &str) -> Option<&'static str> {
    Some(match phase {
        "ior-easy-read" => "ior-easy-write",
        "ior-hard-read" => "ior-hard-write",
        "mdtest-easy-stat" | "mdtest-easy-delete" => "mdtest-easy-write",
        "mdtest-hard-stat" | "mdtest-hard-read" | "mdtest-hard-delete" => "mdtest-hard-write",
        _ => return None,
    })
}

/// How many mdtest-hard files find must match, from their names (every one
/// is newer than the timestamp and of the right size; nothing else is).
pub fn expected_find_matches(md_hard_counts: &[u64]) -> u64 {
    md_hard_counts
        .iter()
        .enumerate()
        .map(|(r, &n)| (0..n).filter(|&i| md_name(r, i).contains("01")).count() as u64)
        .sum()
}

/// Run every phase. `spawn` makes the command of a rank process (one that
/// runs [`crate::rank::rank_main`] on its stdin/stdout); stderr is shared.
pub fn run(cfg: &Config, label: &str, spawn: &dyn Fn() -> Command) -> Result<RunResult> {
    let mut cfg = cfg.clone();
    if cfg.ranks == 0 {
        return Err("need at least one rank".into());
    }
    if cfg.transfer == 0 || !cfg.transfer.is_multiple_of(8) {
        return Err("the transfer size must be a positive multiple of 8".into());
    }
    // The parent's engine (setup, cleanup) sees the ranks' paths through
    // `setup_path`: a user-facing client's prefix or mount is the
    // library's `/`.
    let engine = cfg.target.setup_engine()?;
    if cfg.workdir.is_empty() {
        let name = format!("io500.{}.{}", std::process::id(), now_s() as u64);
        cfg.workdir = match &cfg.target {
            Target::Madfs { .. } => format!("/{name}"),
            Target::Client { root, .. } => format!("{}/{name}", root.display()),
            Target::Local { dir } => {
                let dir = std::fs::canonicalize(dir)
                    .map_err(|e| format!("target {}: {e}", dir.display()))?;
                format!("{}/{name}", dir.display())
            }
        };
    }
    let layout = Layout {
        workdir: cfg.target.setup_path(&cfg.workdir),
    };
    for d in [
        layout.ior_easy_dir(),
        layout.ior_hard_dir(),
        layout.md_hard_dir(),
    ] {
        engine.mkdir_all(&d)?;
    }
    for r in 0..cfg.ranks {
        engine.mkdir_all(&layout.md_easy_dir(r))?;
    }
    // As IO500: a timestamp file older than everything the phases make.
    let top = engine.dir(&layout.workdir)?;
    engine.create(&top, "timestampfile", b"")?;

    let result = run_phases(&cfg, label, spawn);
    if !cfg.keep {
        if let Err(e) = engine.remove_all(&layout.workdir) {
            eprintln!("madfs bench: cleaning up {}: {e}", layout.workdir);
        }
    }
    result
}

fn run_phases(cfg: &Config, label: &str, spawn: &dyn Fn() -> Command) -> Result<RunResult> {
    let json = serde_json::to_string(cfg).map_err(|e| e.to_string())?;
    let mut ranks = Ranks(Vec::new());
    for _ in 0..cfg.ranks {
        let mut child = spawn()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a rank: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        ranks.0.push(RankProc {
            child,
            stdin,
            stdout,
        });
    }
    for r in 0..cfg.ranks {
        ranks.send(r, &format!("config {r} {json}"))?;
    }
    for r in 0..cfg.ranks {
        ranks.expect(r, "ready")?;
    }

    let started = now_s();
    let mut phases: Vec<PhaseResult> = Vec::new();
    for (name, kind) in PHASES {
        let counts = match source_of(name) {
            Some(src) => {
                let p = phases
                    .iter()
                    .find(|p| p.name == src)
                    .expect("writes come first");
                p.per_rank
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            }
            None => "-".into(),
        };
        ranks.send_all(&format!("go {name} {counts}"))?;
        if name.ends_with("-write") {
            let mut most = 0u64;
            for r in 0..cfg.ranks {
                let n = ranks.expect(r, "sw")?;
                most = most.max(
                    n.parse()
                        .map_err(|_| format!("rank {r}: bad count '{n}'"))?,
                );
            }
            ranks.send_all(&format!("to {most}"))?;
        }
        let mut done = Vec::new();
        for r in 0..cfg.ranks {
            let rest = ranks.expect(r, "done")?;
            done.push(parse_done(r, &rest)?);
        }
        let timed: &[Done] = if name == "find" { &done[..1] } else { &done };
        let t0 = timed.iter().map(|d| d.t0).fold(f64::INFINITY, f64::min);
        let t1 = timed.iter().map(|d| d.t1).fold(0.0, f64::max);
        let per_rank: Vec<u64> = done.iter().map(|d| d.ops).collect();
        let bytes = done.iter().map(|d| d.bytes).sum();
        let mut p = PhaseResult::new(name, kind, t1 - t0, per_rank, bytes);
        p.errors = done.iter().map(|d| d.errors).sum();
        if name == "find" {
            let matched: u64 = done.iter().map(|d| d.matched).sum();
            let hard = phases
                .iter()
                .find(|p| p.name == "mdtest-hard-write")
                .map(|p| p.per_rank.clone())
                .unwrap_or_default();
            let want = expected_find_matches(&hard);
            if matched != want {
                eprintln!("madfs bench: find matched {matched} files, expected {want}");
                p.errors += 1;
            }
            p.matched = Some(matched);
        }
        eprintln!(
            "madfs bench: {:<20} {:>12.4} {:<5} {:8.3} s  {} ops{}",
            name,
            p.value,
            p.unit,
            p.time_s,
            p.ops,
            if p.errors > 0 {
                format!("  {} ERRORS", p.errors)
            } else {
                String::new()
            }
        );
        debug_assert_eq!(p.kind, kind);
        phases.push(p);
    }
    ranks.send_all("quit")?;
    for (r, p) in ranks.0.iter_mut().enumerate() {
        let st = p.child.wait().map_err(|e| format!("rank {r}: {e}"))?;
        if !st.success() {
            return Err(format!("rank {r} ended with {st}"));
        }
    }
    let mut run = RunResult {
        label: label.to_string(),
        target: cfg.target.describe(),
        client: cfg.target.client().to_string(),
        find_via: match cfg.target {
            Target::Local { .. } => "walk through std::fs".into(),
            _ => "server-side find".into(),
        },
        ranks: cfg.ranks,
        stonewall_s: cfg.stonewall_s,
        scale: cfg.scale.clone(),
        transfer: cfg.transfer,
        verify: format!("{:?}", cfg.verify).to_lowercase(),
        started_unix_s: started,
        phases,
        bw_gib_s: 0.0,
        md_kiops: 0.0,
        score: 0.0,
        errors: 0,
    };
    run.finish();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_expectation_counts_names_with_01() {
        // Against a brute-force count of the names.
        let brute = |r: usize, n: u64| {
            (0..n)
                .filter(|&i| format!("file.mdtest.{r}.{i}").contains("01"))
                .count() as u64
        };
        assert_eq!(
            expected_find_matches(&[200, 150]),
            brute(0, 200) + brute(1, 150)
        );
        assert_eq!(expected_find_matches(&[0]), 0);
        // i = 101 always matches; i = 10 only through its rank.
        assert_eq!(
            expected_find_matches(&[102]) - expected_find_matches(&[101]),
            1
        );
    }
}
