//! One rank: a process that receives its configuration and then one phase
//! at a time from the parent, over a line protocol on stdin/stdout:
//!
//! ```text
//! parent: config <rank> <json>         rank: ready
//! parent: go <phase> <c0,c1,...>       (counts each rank wrote in the phase
//!                                       this one reads; "-" for writes)
//!   write phases, at the stonewall:    rank: sw <count>
//!   parent (largest count of all):     parent: to <count>
//! rank:   done <ops> <bytes> <t_start> <t_end> <errors> <matched>
//! parent: quit
//! ```
//!
//! A rank that cannot go on answers `fail <message>` instead of `done`.

use crate::engine::{DirRef, Engine, FindSpec, Result};
use crate::{
    ior_hard_offset, md_name, now_s, pattern, Config, Verify, FIND_NAME, IOR_HARD_XFER,
    MD_HARD_BYTES,
};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

/// Pattern tags (first part of the key) of the ior-easy, ior-hard and
/// mdtest-hard data: `pattern::key(TAG, rank, 0)` for the ior files,
/// `pattern::key(TAG_MD_HARD, rank, file index)` for mdtest-hard files.
pub const TAG_EASY: u64 = 1;
pub const TAG_HARD: u64 = 2;
pub const TAG_MD_HARD: u64 = 3;

/// Paths of a run, shared by the parent and the ranks.
pub struct Layout {
    pub workdir: String,
}

impl Layout {
    pub fn ior_easy_dir(&self) -> String {
        format!("{}/ior-easy", self.workdir)
    }
    pub fn ior_easy_file(&self, rank: usize) -> String {
        format!("{}/ior-easy/ior_file_easy.{rank}", self.workdir)
    }
    pub fn ior_hard_dir(&self) -> String {
        format!("{}/ior-hard", self.workdir)
    }
    pub fn ior_hard_file(&self) -> String {
        format!("{}/ior-hard/IOR_file", self.workdir)
    }
    pub fn md_easy_dir(&self, rank: usize) -> String {
        format!("{}/mdtest-easy/rank.{rank}", self.workdir)
    }
    pub fn md_hard_dir(&self) -> String {
        format!("{}/mdtest-hard", self.workdir)
    }
    pub fn timestamp(&self) -> String {
        format!("{}/timestampfile", self.workdir)
    }
}

struct Rank<'a, R, W> {
    cfg: Config,
    rank: usize,
    engine: Box<dyn Engine>,
    input: &'a mut R,
    output: &'a mut W,
    layout: Layout,
    /// Verification failures so far in this phase.
    errors: u64,
}

/// What a phase did in this rank.
struct Done {
    ops: u64,
    bytes: u64,
    t0: f64,
    t1: f64,
    matched: u64,
}

fn send<W: Write>(out: &mut W, line: &str) -> Result<()> {
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(|e| format!("cannot talk to the parent: {e}"))
}

fn recv<R: BufRead>(input: &mut R) -> Result<String> {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) => Err("the parent went away".into()),
        Ok(_) => Ok(line.trim_end().to_string()),
        Err(e) => Err(format!("cannot read from the parent: {e}")),
    }
}

/// Run a rank over `input`/`output` until the parent says quit.
pub fn rank_main<R: BufRead, W: Write>(input: &mut R, output: &mut W) -> Result<()> {
    let first = recv(input)?;
    let rest = first
        .strip_prefix("config ")
        .ok_or_else(|| format!("expected config, got '{first}'"))?;
    let (rank, json) = rest
        .split_once(' ')
        .ok_or_else(|| "bad config line".to_string())?;
    let rank: usize = rank.parse().map_err(|_| "bad rank".to_string())?;
    let cfg: Config = serde_json::from_str(json).map_err(|e| format!("bad config: {e}"))?;
    let engine = match cfg.target.connect() {
        Ok(e) => e,
        Err(e) => {
            send(output, &format!("fail {e}"))?;
            return Err(e);
        }
    };
    let layout = Layout {
        workdir: cfg.workdir.clone(),
    };
    let mut r = Rank {
        cfg,
        rank,
        engine,
        input,
        output,
        layout,
        errors: 0,
    };
    send(r.output, "ready")?;
    loop {
        let line = recv(r.input)?;
        if line == "quit" {
            return Ok(());
        }
        let mut parts = line.split(' ');
        let (Some("go"), Some(phase), Some(counts)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("unexpected '{line}'"));
        };
        let counts: Vec<u64> = if counts == "-" {
            Vec::new()
        } else {
            counts
                .split(',')
                .map(|c| c.parse().map_err(|_| format!("bad count in '{line}'")))
                .collect::<Result<_>>()?
        };
        r.errors = 0;
        match r.phase(phase, &counts) {
            Ok(d) => send(
                r.output,
                &format!(
                    "done {} {} {:.6} {:.6} {} {}",
                    d.ops, d.bytes, d.t0, d.t1, r.errors, d.matched
                ),
            )?,
            Err(e) => {
                let e = format!("rank {rank}, {phase}: {e}");
                send(r.output, &format!("fail {e}"))?;
                return Err(e);
            }
        }
    }
}

impl<R: BufRead, W: Write> Rank<'_, R, W> {
    fn neighbor(&self) -> usize {
        (self.rank + 1) % self.cfg.ranks
    }

    fn mismatch(&mut self, what: &str) {
        if self.errors < 5 {
            eprintln!("madfs bench: rank {}: {what}", self.rank);
        }
        self.errors += 1;
    }

    /// Do `op(i)` for i = 0.. until `limit` or the stonewall, report the
    /// count, then go on to the count the parent sends back (the largest
    /// of all ranks). Returns that count.
    fn stonewalled(
        &mut self,
        limit: u64,
        mut op: impl FnMut(&mut Self, u64) -> Result<()>,
    ) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs_f64(self.cfg.stonewall_s.max(0.0));
        let mut i = 0;
        while i < limit && Instant::now() < deadline {
            op(self, i)?;
            i += 1;
        }
        send(self.output, &format!("sw {i}"))?;
        let line = recv(self.input)?;
        let target: u64 = line
            .strip_prefix("to ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("expected 'to N', got '{line}'"))?;
        while i < target {
            op(self, i)?;
            i += 1;
        }
        Ok(i)
    }

    fn check(&mut self, buf: &[u8], key: u64, offset: u64, full: bool, what: &str) {
        let part = if full { buf } else { &buf[..buf.len().min(64)] };
        if let Some(at) = pattern::first_mismatch(part, key, offset) {
            self.mismatch(&format!(
                "{what}: data differs at byte {} (file offset {})",
                at,
                offset + at as u64
            ));
        }
    }

    fn full_check(&self, i: u64) -> bool {
        match self.cfg.verify {
            Verify::All => true,
            Verify::Sample => i.is_multiple_of(16),
            Verify::None => false,
        }
    }

    fn phase(&mut self, phase: &str, counts: &[u64]) -> Result<Done> {
        let t0 = now_s();
        let (ops, bytes, matched) = match phase {
            "ior-easy-write" => self.ior_easy_write()?,
            "ior-easy-read" => self.ior_easy_read(counts)?,
            "ior-hard-write" => self.ior_hard_write()?,
            "ior-hard-read" => self.ior_hard_read(counts)?,
            "mdtest-easy-write" => self.md_write(false)?,
            "mdtest-hard-write" => self.md_write(true)?,
            "mdtest-easy-stat" => self.md_each(false, counts, MdOp::Stat)?,
            "mdtest-hard-stat" => self.md_each(true, counts, MdOp::Stat)?,
            "mdtest-hard-read" => self.md_each(true, counts, MdOp::Read)?,
            "mdtest-easy-delete" => self.md_each(false, counts, MdOp::Delete)?,
            "mdtest-hard-delete" => self.md_each(true, counts, MdOp::Delete)?,
            "find" => self.find()?,
            _ => return Err(format!("unknown phase '{phase}'")),
        };
        Ok(Done {
            ops,
            bytes,
            t0,
            t1: now_s(),
            matched,
        })
    }

    fn ior_easy_write(&mut self) -> Result<(u64, u64, u64)> {
        let xfer = self.cfg.transfer;
        let limit = self.cfg.limits.ior_easy_bytes / xfer;
        let mut f = self
            .engine
            .open(&self.layout.ior_easy_file(self.rank), true)?;
        let key = pattern::key(TAG_EASY, self.rank as u64, 0);
        let n = self.stonewalled(limit, |_, i| {
            // A fresh buffer per transfer, given to the engine, which may
            // still be sending it when the next one is filled.
            f.write_owned(i * xfer, pattern::make(key, i * xfer, xfer as usize))
        })?;
        let tw = std::time::Instant::now();
        f.finish(true)?;
        if std::env::var("MADFS_BENCH_TIMING").is_ok() {
            eprintln!("TIMING rank {} finish {:?}", self.rank, tw.elapsed());
        }
        Ok((n, n * xfer, 0))
    }

    fn ior_easy_read(&mut self, counts: &[u64]) -> Result<(u64, u64, u64)> {
        let xfer = self.cfg.transfer;
        let src = self.neighbor();
        let n = counts[src];
        let mut f = self.engine.open(&self.layout.ior_easy_file(src), false)?;
        let key = pattern::key(TAG_EASY, src as u64, 0);
        let mut buf = vec![0u8; xfer as usize];
        for i in 0..n {
            f.read_at(i * xfer, &mut buf)?;
            if self.cfg.verify != Verify::None {
                let full = self.full_check(i);
                self.check(&buf, key, i * xfer, full, &format!("ior-easy file {src}"));
            }
        }
        f.finish(false)?;
        Ok((n, n * xfer, 0))
    }

    fn ior_hard_write(&mut self) -> Result<(u64, u64, u64)> {
        let (rank, ranks) = (self.rank, self.cfg.ranks);
        let mut f = self.engine.open(&self.layout.ior_hard_file(), true)?;
        let key = pattern::key(TAG_HARD, rank as u64, 0);
        let n = self.stonewalled(self.cfg.limits.ior_hard_segments, |_, i| {
            let off = ior_hard_offset(i, rank, ranks);
            f.write_owned(off, pattern::make(key, off, IOR_HARD_XFER as usize))
        })?;
        f.finish(true)?;
        Ok((n, n * IOR_HARD_XFER, 0))
    }

    fn ior_hard_read(&mut self, counts: &[u64]) -> Result<(u64, u64, u64)> {
        let src = self.neighbor();
        let n = counts[src];
        let mut f = self.engine.open(&self.layout.ior_hard_file(), false)?;
        let key = pattern::key(TAG_HARD, src as u64, 0);
        let mut buf = vec![0u8; IOR_HARD_XFER as usize];
        for i in 0..n {
            let off = ior_hard_offset(i, src, self.cfg.ranks);
            f.read_at(off, &mut buf)?;
            if self.cfg.verify != Verify::None {
                let full = self.full_check(i);
                self.check(
                    &buf,
                    key,
                    off,
                    full,
                    &format!("ior-hard segment {i} of rank {src}"),
                );
            }
        }
        f.finish(false)?;
        Ok((n, n * IOR_HARD_XFER, 0))
    }

    fn md_dir(&self, hard: bool, rank: usize) -> Result<DirRef> {
        if hard {
            self.engine.dir(&self.layout.md_hard_dir())
        } else {
            self.engine.dir(&self.layout.md_easy_dir(rank))
        }
    }

    fn md_write(&mut self, hard: bool) -> Result<(u64, u64, u64)> {
        let dir = self.md_dir(hard, self.rank)?;
        let rank = self.rank;
        let (limit, size) = if hard {
            (self.cfg.limits.md_hard_files, MD_HARD_BYTES)
        } else {
            (self.cfg.limits.md_easy_files, 0)
        };
        let mut buf = vec![0u8; size as usize];
        let n = self.stonewalled(limit, |me, i| {
            if hard {
                pattern::fill(&mut buf, pattern::key(TAG_MD_HARD, rank as u64, i), 0);
            }
            me.engine.create(&dir, &md_name(rank, i), &buf)
        })?;
        Ok((n, n * size, 0))
    }

    fn md_each(&mut self, hard: bool, counts: &[u64], op: MdOp) -> Result<(u64, u64, u64)> {
        let src = self.neighbor();
        let n = counts[src];
        let dir = self.md_dir(hard, src)?;
        let size = if hard { MD_HARD_BYTES } else { 0 };
        for i in 0..n {
            let name = md_name(src, i);
            match op {
                MdOp::Stat => {
                    let got = self.engine.stat(&dir, &name)?;
                    if got != size {
                        self.mismatch(&format!("{name}: size {got}, expected {size}"));
                    }
                }
                MdOp::Read => {
                    let data = self.engine.read(&dir, &name, size as usize)?;
                    if data.len() as u64 != size {
                        self.mismatch(&format!(
                            "{name}: read {} bytes, expected {size}",
                            data.len()
                        ));
                    } else if self.cfg.verify != Verify::None {
                        let key = pattern::key(TAG_MD_HARD, src as u64, i);
                        self.check(&data, key, 0, true, &name);
                    }
                }
                MdOp::Delete => self.engine.unlink(&dir, &name)?,
            }
        }
        let bytes = if matches!(op, MdOp::Read) {
            n * size
        } else {
            0
        };
        Ok((n, bytes, 0))
    }

    /// Rank 0 searches the whole run directory; the others have nothing to
    /// do (the find engine brings its own parallelism).
    fn find(&mut self) -> Result<(u64, u64, u64)> {
        if self.rank != 0 {
            return Ok((0, 0, 0));
        }
        let spec = FindSpec {
            newer_than: self.engine.mtime(&self.layout.timestamp())?,
            size: MD_HARD_BYTES,
            name: FIND_NAME.to_string(),
        };
        let c = self.engine.find(&self.layout.workdir, &spec)?;
        Ok((c.scanned, 0, c.matched))
    }
}

#[derive(Clone, Copy)]
enum MdOp {
    Stat,
    Read,
    Delete,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Target};
    use std::io::Cursor;

    fn session(cfg: &Config, script: &[&str]) -> Vec<String> {
        let json = serde_json::to_string(cfg).unwrap();
        let mut input = format!("config 0 {json}\n");
        for l in script {
            input.push_str(l);
            input.push('\n');
        }
        let mut out = Vec::new();
        rank_main(&mut Cursor::new(input.into_bytes()), &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn errors_of(done: &str) -> u64 {
        done.split(' ').nth(5).unwrap().parse().unwrap()
    }

    /// Protocol and verification of one rank on a local directory: the
    /// write phases stop at their limit, wait for the wear-out target, and
    /// the read phases find every corrupted byte.
    #[test]
    fn a_rank_writes_reads_and_detects_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("run").display().to_string();
        let layout = Layout {
            workdir: workdir.clone(),
        };
        std::fs::create_dir_all(layout.ior_easy_dir()).unwrap();
        std::fs::create_dir_all(layout.ior_hard_dir()).unwrap();
        let cfg = Config {
            target: Target::Local {
                dir: tmp.path().into(),
            },
            workdir,
            ranks: 1,
            stonewall_s: 30.0,
            scale: "test".into(),
            limits: Limits {
                ior_easy_bytes: 4 * 4096,
                ior_hard_segments: 10,
                md_easy_files: 0,
                md_hard_files: 0,
            },
            transfer: 4096,
            verify: Verify::All,
            keep: true,
        };
        let out = session(
            &cfg,
            &[
                "go ior-easy-write -",
                "to 5",
                "go ior-hard-write -",
                "to 10",
                "quit",
            ],
        );
        assert_eq!(out[0], "ready");
        assert_eq!(out[1], "sw 4", "stops at its limit");
        // Wear-out to the parent's target, past the limit.
        assert!(out[2].starts_with("done 5 20480 "), "{}", out[2]);
        assert_eq!(out[3], "sw 10");
        assert!(out[4].starts_with("done 10 470080 "), "{}", out[4]);
        let read = ["go ior-easy-read 5", "go ior-hard-read 10", "quit"];
        let clean = session(&cfg, &read);
        assert_eq!(errors_of(&clean[1]), 0, "{clean:?}");
        assert_eq!(errors_of(&clean[2]), 0, "{clean:?}");

        let flip = |path: &str, at: usize| {
            let mut d = std::fs::read(path).unwrap();
            d[at] ^= 0x40;
            std::fs::write(path, d).unwrap();
        };
        flip(&layout.ior_easy_file(0), 5000);
        flip(&layout.ior_hard_file(), 2 * 47_008 + 10);
        let bad = session(&cfg, &read);
        assert!(bad[1].starts_with("done 5 20480 "), "{bad:?}");
        assert_eq!(errors_of(&bad[1]), 1, "{bad:?}");
        assert_eq!(errors_of(&bad[2]), 1, "{bad:?}");
    }
}
