//! The run itself: draws each operation, performs it through the libc
//! wrappers, updates the model, checks every size the file system reports
//! and every byte it returns, logs, and on the first difference builds the
//! report: seed, operation number, expected against actual, a guess at
//! where a bad byte came from, the last operations and the replay command.

use crate::model::{pattern, pattern_byte, Mismatch, Model};
use crate::ops::{draw, Handle, Op};
use crate::sys::{self, Fd};
use crate::{Config, Failure, Summary};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Operations kept in memory for failure reports and the search for the
/// operation that wrote a bad byte.
const RECENT_MAX: usize = 10_000;

/// One logged operation.
struct Entry {
    index: u64,
    file: usize,
    op: Op,
    size_before: u64,
    size_after: u64,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{:<7} f{} {}", self.index, self.file, self.op)?;
        if self.size_before != self.size_after {
            write!(
                f,
                "  size 0x{:x} -> 0x{:x}",
                self.size_before, self.size_after
            )?;
        }
        Ok(())
    }
}

/// One exercised file: its two descriptors and its model. A descriptor is
/// None only while it is being reopened.
struct TestFile {
    path: PathBuf,
    fds: [Option<Fd>; 2],
    model: Model,
}

impl TestFile {
    fn fd(&self, h: Handle) -> Result<&Fd, String> {
        self.fds[h.index()]
            .as_ref()
            .ok_or_else(|| format!("{}: {h} is not open", self.path.display()))
    }
}

/// A run in progress (see the crate documentation).
pub struct Exerciser {
    cfg: Config,
    rng: ChaCha8Rng,
    files: Vec<TestFile>,
    /// Operations done so far.
    done: u64,
    recent: VecDeque<Entry>,
    log: Option<std::io::BufWriter<std::fs::File>>,
    /// The first error writing the log.
    log_error: Option<String>,
    counts: BTreeMap<&'static str, u64>,
    started: Instant,
}

impl Exerciser {
    /// Create (or empty) the files `fsx.SEED.I` in `cfg.dir` and open each
    /// twice.
    pub fn new(cfg: Config) -> Result<Exerciser, Box<Failure>> {
        let setup_failure = |cfg: &Config, message: String| {
            Box::new(Failure {
                seed: cfg.seed,
                op: 0,
                file: None,
                message,
                recent: Vec::new(),
                log: cfg.log.clone(),
                replay: cfg.replay_command(0),
            })
        };
        cfg.validate().map_err(|m| setup_failure(&cfg, m))?;
        match std::fs::metadata(&cfg.dir) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                let m = format!("{}: not a directory", cfg.dir.display());
                return Err(setup_failure(&cfg, m));
            }
            Err(e) => {
                let m = format!("{}: {e}", cfg.dir.display());
                return Err(setup_failure(&cfg, m));
            }
        }
        let log = match &cfg.log {
            None => None,
            Some(p) => match std::fs::File::create(p) {
                Ok(f) => Some(std::io::BufWriter::new(f)),
                Err(e) => {
                    let m = format!("log file {}: {e}", p.display());
                    return Err(setup_failure(&cfg, m));
                }
            },
        };
        let mut files = Vec::with_capacity(cfg.file_count);
        for i in 0..cfg.file_count {
            let path = cfg.dir.join(format!("fsx.{}.{i}", cfg.seed));
            let first = Fd::open(&path, true).map_err(|m| setup_failure(&cfg, m))?;
            let second = Fd::open(&path, false).map_err(|m| setup_failure(&cfg, m))?;
            files.push(TestFile {
                path,
                fds: [Some(first), Some(second)],
                model: Model::new(),
            });
        }
        if cfg.mmap_read || cfg.mmap_write {
            sys::install_sigbus_report();
        }
        let mut ex = Exerciser {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            files,
            done: 0,
            recent: VecDeque::new(),
            log,
            log_error: None,
            counts: BTreeMap::new(),
            started: Instant::now(),
        };
        for fi in 0..ex.files.len() {
            ex.check_sizes(fi).map_err(|m| ex.failure(0, Some(fi), m))?;
        }
        Ok(ex)
    }

    /// Operations done so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The files being exercised.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// Draw, perform and check the next operation.
    pub fn step(&mut self) -> Result<(), Box<Failure>> {
        let index = self.done + 1;
        let fi = if self.files.len() > 1 {
            self.rng.random_range(0..self.files.len())
        } else {
            0
        };
        let size_before = self.files[fi].model.len();
        let op = draw(&mut self.rng, &self.cfg, size_before);
        let entry = Entry {
            index,
            file: fi,
            size_before,
            size_after: op.size_after(size_before),
            op: op.clone(),
        };
        if let Some(log) = &mut self.log {
            // A log that cannot be written fails the run at its end (the
            // operations themselves are still worth checking).
            if let Err(e) = writeln!(log, "{entry}") {
                self.log_error.get_or_insert(e.to_string());
            }
        }
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(entry);
        *self.counts.entry(op.name()).or_default() += 1;
        sys::set_current_op(self.cfg.seed, index);

        self.apply(fi, index, &op)
            .and_then(|()| self.check_sizes(fi))
            .map_err(|m| self.failure(index, Some(fi), m))?;
        // With check_every 0 never: no index is a multiple of 0.
        if index.is_multiple_of(self.cfg.check_every) {
            for f in 0..self.files.len() {
                self.check_whole(f, Handle::First)
                    .map_err(|m| self.failure(index, Some(f), m))?;
            }
        }
        self.done = index;
        Ok(())
    }

    /// Check every file now: its sizes, and its contents read back whole.
    pub fn verify(&mut self) -> Result<(), Box<Failure>> {
        let at = self.done;
        for fi in 0..self.files.len() {
            self.check_sizes(fi)
                .and_then(|()| self.check_whole(fi, Handle::First))
                .map_err(|m| self.failure(at, Some(fi), m))?;
        }
        Ok(())
    }

    /// Check every file whole, close every descriptor, check each file
    /// once more through a fresh read-only open (close-to-open), and remove
    /// the files. On failure they are left for inspection.
    pub fn finish(mut self) -> Result<Summary, Box<Failure>> {
        let at = self.done;
        for fi in 0..self.files.len() {
            self.check_whole(fi, Handle::First)
                .and_then(|()| self.check_whole(fi, Handle::Second))
                .map_err(|m| self.failure(at, Some(fi), m))?;
        }
        for fi in 0..self.files.len() {
            for h in [Handle::First, Handle::Second] {
                if let Some(fd) = self.files[fi].fds[h.index()].take() {
                    fd.close().map_err(|m| self.failure(at, Some(fi), m))?;
                }
            }
            self.check_reopened(fi)
                .map_err(|m| self.failure(at, Some(fi), m))?;
        }
        if let Some(log) = &mut self.log {
            if let Err(e) = log.flush() {
                self.log_error.get_or_insert(e.to_string());
            }
        }
        if let Some(e) = self.log_error.take() {
            let path = self.cfg.log.clone().unwrap_or_default();
            return Err(self.failure(at, None, format!("log {}: {e}", path.display())));
        }
        for fi in 0..self.files.len() {
            sys::unlink(&self.files[fi].path).map_err(|m| self.failure(at, Some(fi), m))?;
        }
        Ok(Summary {
            seed: self.cfg.seed,
            ops: self.done,
            files: self.files.len(),
            elapsed: self.started.elapsed(),
            counts: std::mem::take(&mut self.counts),
        })
    }

    /// File `fi` through a fresh read-only descriptor: size and contents.
    fn check_reopened(&self, fi: usize) -> Result<(), String> {
        let f = &self.files[fi];
        let fresh = Fd::open_read_only(&f.path)?;
        f.model
            .check_size("fstat after reopen", fresh.fstat_size()?)?;
        let len = f.model.len() + 1;
        let data = fresh.pread_full(0, len)?;
        f.model
            .check_read(0, len, &data)
            .map_err(|m| self.describe(fi, "pread after reopen", 0, &m))?;
        fresh.close()
    }

    fn apply(&mut self, fi: usize, index: u64, op: &Op) -> Result<(), String> {
        match *op {
            Op::Write { h, offset, len, .. } => {
                let data = pattern(index, offset, len);
                let f = &mut self.files[fi];
                f.fd(h)?.pwrite_all(offset, &data)?;
                f.model.write(offset, &data);
            }
            Op::Read { h, offset, len } => {
                let f = &self.files[fi];
                let data = f.fd(h)?.pread_full(offset, len)?;
                f.model
                    .check_read(offset, len, &data)
                    .map_err(|m| self.describe(fi, &format!("pread({h})"), offset, &m))?;
            }
            Op::MapRead { h, offset, len } => {
                let f = &self.files[fi];
                let size = f.model.len();
                let to_end = offset + len == size;
                let data = f.fd(h)?.map_read(offset, len, to_end.then_some(size))?;
                let (inside, past_end) = data.split_at((len as usize).min(data.len()));
                f.model
                    .check_read(offset, len, inside)
                    .map_err(|m| self.describe(fi, &format!("mmap read({h})"), offset, &m))?;
                if let Some(i) = past_end.iter().position(|&b| b != 0) {
                    return Err(format!(
                        "mmap read({h}): byte 0x{:x} past the end of file 0x{size:x} reads 0x{:02x}, \
                         not 0 (data left beyond the size?)",
                        size + i as u64,
                        past_end[i]
                    ));
                }
            }
            Op::MapWrite { h, offset, len } => {
                let end = offset + len;
                let data = pattern(index, offset, len);
                let f = &mut self.files[fi];
                if end > f.model.len() {
                    // A mapping cannot extend a file: make room first, and
                    // check the size before touching pages that need it.
                    f.fd(h)?.ftruncate(end)?;
                    f.model.truncate(end);
                    let s = f.fd(h)?.fstat_size()?;
                    f.model
                        .check_size(&format!("fstat({h}) after ftruncate for mmap"), s)?;
                }
                f.fd(h)?.map_write(offset, &data)?;
                f.model.write(offset, &data);
            }
            Op::Truncate { h, size } => {
                let f = &mut self.files[fi];
                f.fd(h)?.ftruncate(size)?;
                f.model.truncate(size);
            }
            Op::TruncatePath { size } => {
                let f = &mut self.files[fi];
                sys::truncate_path(&f.path, size)?;
                f.model.truncate(size);
            }
            Op::Reopen { h } => {
                let f = &mut self.files[fi];
                if let Some(fd) = f.fds[h.index()].take() {
                    fd.close()?;
                }
                f.fds[h.index()] = Some(Fd::open(&f.path, false)?);
            }
            Op::DropCache { h } => self.files[fi].fd(h)?.drop_cache()?,
            Op::Fsync { h } => self.files[fi].fd(h)?.fsync()?,
        }
        Ok(())
    }

    /// Every size the file system reports for file `fi` against the model:
    /// fstat and lseek(SEEK_END) on both descriptors, stat by path.
    fn check_sizes(&self, fi: usize) -> Result<(), String> {
        let f = &self.files[fi];
        for h in [Handle::First, Handle::Second] {
            let fd = f.fd(h)?;
            f.model
                .check_size(&format!("fstat({h})"), fd.fstat_size()?)?;
            f.model
                .check_size(&format!("lseek({h}, SEEK_END)"), fd.seek_end()?)?;
        }
        f.model.check_size("stat(path)", sys::stat_size(&f.path)?)
    }

    /// Read file `fi` whole through `h` (one byte more, to catch data past
    /// the end) and compare.
    fn check_whole(&self, fi: usize, h: Handle) -> Result<(), String> {
        let f = &self.files[fi];
        let len = f.model.len() + 1;
        let data = f.fd(h)?.pread_full(0, len)?;
        f.model
            .check_read(0, len, &data)
            .map_err(|m| self.describe(fi, &format!("full read-back({h})"), 0, &m))
    }

    /// A data mismatch in words, with a guess at where the bad byte came
    /// from.
    fn describe(&self, fi: usize, how: &str, offset: u64, m: &Mismatch) -> String {
        let mut s = format!("READ BAD DATA: {how} at 0x{offset:x}: {m}");
        if m.actual_len < m.expected_len {
            s.push_str(&format!(
                "; the read ended at 0x{:x}, as if the file were that long",
                offset + m.actual_len
            ));
        }
        if let Some((at, _want, got)) = m.first_bad {
            match self.last_writer(fi, at) {
                Some(e) => s.push_str(&format!("; expected byte written by #{}", e.index)),
                None => s.push_str("; expected 0 (a hole, or cut by a truncate)"),
            }
            if got == 0 {
                s.push_str("; the byte read is 0: a hole, or the write was lost");
            } else if let Some(e) = self.recent.iter().rev().find(|e| {
                e.file == fi
                    && e.op.written().is_some_and(|(s, e)| s <= at && at < e)
                    && pattern_byte(e.index, at) == got
            }) {
                s.push_str(&format!(
                    "; the byte read was written by #{} ({}), since overwritten or cut",
                    e.index, e.op
                ));
            } else {
                s.push_str("; the byte read matches no recent write");
            }
        }
        s
    }

    /// The recent operation whose byte the model holds at `at` of file
    /// `fi`: the last write over it, unless a later operation left the
    /// file no longer than `at` (the byte was cut; it reads 0 now).
    fn last_writer(&self, fi: usize, at: u64) -> Option<&Entry> {
        for e in self.recent.iter().rev().filter(|e| e.file == fi) {
            if e.op.written().is_some_and(|(s, e)| s <= at && at < e) {
                return Some(e);
            }
            if e.size_after <= at {
                return None;
            }
        }
        None
    }

    fn failure(&mut self, op: u64, fi: Option<usize>, message: String) -> Box<Failure> {
        if let Some(log) = &mut self.log {
            let _ = writeln!(log, "FAILED at op #{op}: {message}");
            let _ = log.flush();
        }
        let skip = self.recent.len().saturating_sub(self.cfg.show_last);
        Box::new(Failure {
            seed: self.cfg.seed,
            op,
            file: fi.map(|i| self.files[i].path.clone()),
            message,
            recent: self
                .recent
                .iter()
                .skip(skip)
                .map(|e| e.to_string())
                .collect(),
            log: self.cfg.log.clone(),
            replay: self.cfg.replay_command(op),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, seed: u64) -> Config {
        let mut cfg = Config::new(dir);
        cfg.seed = seed;
        cfg.max_len = 64 * 1024;
        cfg.max_op_len = 8 * 1024;
        cfg.file_count = 2;
        cfg
    }

    #[test]
    fn a_local_directory_passes_and_the_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), 3);
        cfg.ops = 2000;
        cfg.log = Some(dir.path().join("ops.log"));
        let summary = crate::run(&cfg).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(summary.ops, 2000);
        assert_eq!(summary.counts.values().sum::<u64>(), 2000);
        for name in ["write", "extend", "read", "mapread", "mapwrite", "truncate"] {
            assert!(
                summary.counts.get(name).is_some_and(|&n| n > 0),
                "{summary}"
            );
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["ops.log"]);
        let log = std::fs::read_to_string(dir.path().join("ops.log")).unwrap();
        assert_eq!(log.lines().count(), 2000);
    }

    /// Runs some operations, then changes a file behind the exerciser's
    /// back with `corrupt`, and returns the failure the next check reports.
    fn failure_after(corrupt: impl FnOnce(&std::path::Path, u64)) -> Box<Failure> {
        let dir = tempfile::tempdir().unwrap();
        let mut ex = Exerciser::new(config(dir.path(), 11)).unwrap();
        while ex.files[0].model.len() < 1000 {
            ex.step().unwrap_or_else(|f| panic!("{f}"));
        }
        let path = ex.paths()[0].clone();
        corrupt(&path, ex.files[0].model.len());
        let f = ex.verify().expect_err("the corruption went unnoticed");
        assert_eq!(f.file.as_deref(), Some(path.as_path()));
        assert_eq!(f.op, ex.done());
        assert!(f.replay.contains("--seed 11"), "{f}");
        f
    }

    #[test]
    fn a_size_changed_behind_its_back_is_reported() {
        let f = failure_after(|path, size| {
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(size - 1).unwrap();
        });
        assert!(f.message.starts_with("size error: expected 0x"), "{f}");
        assert!(!f.recent.is_empty(), "{f}");
    }

    #[test]
    fn data_changed_behind_its_back_is_reported() {
        let f = failure_after(|path, size| {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            // A byte no write pattern produces at that offset... or any
            // other: the model holds the exact byte.
            let at = size / 2;
            let mut old = [0u8];
            std::fs::File::open(path)
                .unwrap()
                .read_exact_at(&mut old, at)
                .unwrap();
            file.write_all_at(&[old[0] ^ 0x5a], at).unwrap();
        });
        assert!(f.message.starts_with("READ BAD DATA"), "{f}");
        assert!(f.message.contains("bad data at 0x"), "{f}");
    }
}
