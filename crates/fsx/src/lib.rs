//! A model-based file exerciser in the style of xfstests' fsx: a seeded
//! stream of random operations on a few files (writes anywhere, extending
//! writes that leave holes, truncates up and down through a descriptor or
//! by path, reads, shared mmap reads and writes, close and reopen, a second
//! descriptor on the same file, dropping the kernel's cached pages so that
//! reads reach the file system, fsync), each checked against an in-memory
//! model of what the file must hold: after every operation fstat on both
//! descriptors, lseek(SEEK_END) and stat by path must give the model's
//! size, every read must return the model's bytes, and every `check_every`
//! operations each file is read back whole.
//!
//! It works on any directory through plain libc calls, so one run checks a
//! FUSE mount, a local file system, or `madfs run` (LD_PRELOAD). A seed
//! replays exactly: operations depend only on the seed, the settings and
//! the model, never on what the file system answered.
//!
//! - [`model`]: the expected contents, the write pattern, the comparisons;
//! - [`ops`]: the operations, how they are drawn, how they are logged;
//! - `exerciser`: runs them and builds the failure report;
//! - `sys`: the libc calls, with errors that name call, path and reason.

mod exerciser;
pub mod model;
pub mod ops;
mod sys;

pub use exerciser::Exerciser;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What to exercise and how.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory the files are made in (it must exist).
    pub dir: PathBuf,
    pub seed: u64,
    /// Operations to run (over all files).
    pub ops: u64,
    /// Largest file size the operations make.
    pub max_len: u64,
    /// Largest single read or write.
    pub max_op_len: u64,
    /// Shared read-only mappings.
    pub mmap_read: bool,
    /// Shared writable mappings (`madfs run` refuses them with ENOTSUP).
    pub mmap_write: bool,
    /// Files worked on at once (each operation picks one).
    pub file_count: usize,
    /// Write every operation to this file as it runs.
    pub log: Option<PathBuf>,
    /// Read every file back whole every this many operations (0: only at
    /// the end).
    pub check_every: u64,
    /// Operations shown in a failure report.
    pub show_last: usize,
}

/// fsx's default file length.
pub const DEFAULT_MAX_LEN: u64 = 256 * 1024;
/// fsx's default largest operation.
pub const DEFAULT_MAX_OP_LEN: u64 = 64 * 1024;
pub const DEFAULT_OPS: u64 = 10_000;
pub const DEFAULT_CHECK_EVERY: u64 = 100;
pub const DEFAULT_SHOW_LAST: usize = 32;

impl Config {
    /// Defaults: seed 1, 10,000 operations, one file of at most 256 KiB,
    /// operations of at most 64 KiB, mmap reads and writes on.
    pub fn new(dir: impl AsRef<Path>) -> Config {
        Config {
            dir: dir.as_ref().to_path_buf(),
            seed: 1,
            ops: DEFAULT_OPS,
            max_len: DEFAULT_MAX_LEN,
            max_op_len: DEFAULT_MAX_OP_LEN,
            mmap_read: true,
            mmap_write: true,
            file_count: 1,
            log: None,
            check_every: DEFAULT_CHECK_EVERY,
            show_last: DEFAULT_SHOW_LAST,
        }
    }

    /// The `madfs fsx` command that replays the first `ops` operations of
    /// this run.
    pub fn replay_command(&self, ops: u64) -> String {
        let mut s = format!(
            "madfs fsx {} --seed {} --ops {ops} --max-len {} --max-op-len {} --file-count {} --check-every {}",
            self.dir.display(),
            self.seed,
            self.max_len,
            self.max_op_len,
            self.file_count,
            self.check_every
        );
        if !self.mmap_read && !self.mmap_write {
            s.push_str(" --no-mmap");
        } else if !self.mmap_write {
            s.push_str(" --no-mmap-write");
        } else if !self.mmap_read {
            s.push_str(" --no-mmap-read");
        }
        s
    }

    fn validate(&self) -> Result<(), String> {
        if self.file_count == 0 {
            return Err("--file-count must be at least 1".into());
        }
        if self.max_len == 0 || self.max_op_len == 0 {
            return Err("--max-len and --max-op-len must be at least 1".into());
        }
        // The model holds every file in memory.
        if self.max_len > 1 << 30 {
            return Err(format!(
                "--max-len {} is over the limit of 1 GiB (the model keeps each file in memory)",
                self.max_len
            ));
        }
        Ok(())
    }
}

/// A run that passed.
#[derive(Clone, Debug)]
pub struct Summary {
    pub seed: u64,
    pub ops: u64,
    pub files: usize,
    pub elapsed: Duration,
    /// Operations performed, by name.
    pub counts: BTreeMap<&'static str, u64>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fsx: seed {}: {} ops on {} file(s) passed in {:.1} s (",
            self.seed,
            self.ops,
            self.files,
            self.elapsed.as_secs_f64()
        )?;
        let mut sep = "";
        for (name, n) in &self.counts {
            write!(f, "{sep}{name} {n}")?;
            sep = ", ";
        }
        write!(f, ")")
    }
}

/// A run that found a difference (or could not proceed).
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    /// The operation after (or during) which the check failed, counted
    /// from 1; 0 before the first operation.
    pub op: u64,
    /// The file it concerns, if one.
    pub file: Option<PathBuf>,
    /// What differed (expected and actual) or which call failed and why.
    pub message: String,
    /// The last operations, oldest first, as logged.
    pub recent: Vec<String>,
    /// The full log, if one was written.
    pub log: Option<PathBuf>,
    /// The command that replays the run up to the failing operation.
    pub replay: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op == 0 && self.file.is_none() {
            // Settings or directory: nothing was exercised, nothing to replay.
            return writeln!(f, "fsx: cannot start: {}", self.message);
        }
        write!(f, "fsx: FAILED at op #{} (seed {})", self.op, self.seed)?;
        if let Some(p) = &self.file {
            write!(f, " on {}", p.display())?;
        }
        writeln!(f, ": {}", self.message)?;
        writeln!(f, "replay: {}", self.replay)?;
        if !self.recent.is_empty() {
            writeln!(f, "last {} operation(s):", self.recent.len())?;
            for line in &self.recent {
                writeln!(f, "  {line}")?;
            }
        }
        if let Some(p) = &self.log {
            writeln!(f, "every operation: {}", p.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// Run `cfg.ops` operations and the final checks.
pub fn run(cfg: &Config) -> Result<Summary, Box<Failure>> {
    let mut ex = Exerciser::new(cfg.clone())?;
    for _ in 0..cfg.ops {
        ex.step()?;
    }
    ex.finish()
}
