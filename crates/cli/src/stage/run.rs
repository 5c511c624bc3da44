//! The coordinator: carries out a plan in phases (deletes, directories,
//! comparisons, files, hard links, directory attributes, verification),
//! handing the file work to a pool: tasks of this process, or workers on
//! the job's hosts (worker.rs). Work is pulled, not pushed: every worker
//! takes the next items from one shared queue whenever it has room, so a
//! fast worker takes more and a slow one is never left holding a long
//! queue; a large file is cut into parts that different workers copy.

use super::copy::{temp_path, Executor, Item, Outcome, Work};
use super::fs::{Fs, Preserve, Result};
use super::plan::{FileTask, Plan};
use super::progress::Progress;
use super::worker::Crew;
use madfs_rpc::join::join_bounded;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

/// Outcomes queued between the workers and the coordinator at most.
const OUTCOMES_QUEUED_MAX: usize = 1024;
/// Metadata operations the coordinator runs at once (mkdir, link, delete,
/// setting a directory's attributes).
const META_IN_FLIGHT: usize = 64;

/// The queue of one phase's items, shared by every worker.
pub struct Dispatch {
    queue: Mutex<VecDeque<Item>>,
    /// Items not yet reported done (or failed).
    outstanding: AtomicUsize,
    /// Rung when items come back to the queue (a lost worker's) and when
    /// the phase ends.
    pub wake: Notify,
}

impl Dispatch {
    fn new(items: Vec<Item>) -> Dispatch {
        Dispatch {
            outstanding: AtomicUsize::new(items.len()),
            queue: Mutex::new(items.into()),
            wake: Notify::new(),
        }
    }

    pub fn pop(&self) -> Option<Item> {
        self.queue.lock().expect("queue").pop_front()
    }

    /// Give back the items of a worker that was lost, for the others.
    pub fn requeue(&self, items: impl IntoIterator<Item = Item>) {
        self.queue.lock().expect("queue").extend(items);
        self.wake.notify_waiters();
    }

    pub fn has_work(&self) -> bool {
        !self.queue.lock().expect("queue").is_empty()
    }

    /// One item reported.
    pub fn reported(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.wake.notify_waiters();
        }
    }

    pub fn finished(&self) -> bool {
        self.outstanding.load(Ordering::Acquire) == 0
    }
}

/// Items reported so far by this process, for the test fault below.
static DONE: AtomicUsize = AtomicUsize::new(0);

/// *Test fault:* `MADFS_FAULT_STAGE_EXIT_AFTER=N` ends the process at
/// once (SIGKILL) after N items are done, to test that `sync`
/// resumes an interrupted copy. Never set it outside tests.
fn fault_exit_after() -> Option<usize> {
    std::env::var("MADFS_FAULT_STAGE_EXIT_AFTER")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Who does the file work.
pub enum Pool {
    Local { exec: Box<Executor>, jobs: usize },
    Remote(Crew),
}

impl Pool {
    /// Run `items` to the end, calling `done` with each outcome as it
    /// comes; items no worker could finish (every worker lost) fail.
    async fn run(&mut self, items: Vec<Item>, mut done: impl AsyncFnMut(Outcome)) {
        if items.is_empty() {
            return;
        }
        let mut pending: HashSet<u64> = items.iter().map(|i| i.id).collect();
        let dispatch = Arc::new(Dispatch::new(items));
        let (tx, mut rx) = mpsc::channel::<Outcome>(OUTCOMES_QUEUED_MAX);
        let mut crew_tasks = None;
        match self {
            Pool::Local { exec, jobs } => {
                for _ in 0..*jobs {
                    let (exec, dispatch, tx) = ((**exec).clone(), dispatch.clone(), tx.clone());
                    tokio::spawn(async move {
                        while let Some(item) = dispatch.pop() {
                            let outcome = exec.run(item).await;
                            dispatch.reported();
                            if tx.send(outcome).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
            Pool::Remote(crew) => crew_tasks = Some(crew.start_phase(&dispatch, &tx)),
        }
        drop(tx);
        let exit_after = fault_exit_after();
        while !pending.is_empty() {
            let Some(o) = rx.recv().await else { break };
            if pending.remove(&o.id) {
                done(o).await;
                if exit_after.is_some_and(|n| DONE.fetch_add(1, Ordering::Relaxed) + 1 >= n) {
                    // Killed: whatever is in flight stays half done.
                    // SAFETY: signals this process; nothing is read or written.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
            }
        }
        if let (Pool::Remote(crew), Some(tasks)) = (self, crew_tasks) {
            crew.end_phase(tasks).await;
        }
        let mut lost: Vec<u64> = pending.into_iter().collect();
        lost.sort_unstable();
        for id in lost {
            done(Outcome::failed(id, "no worker was left to copy it".into())).await;
        }
    }
}

/// What the whole run did, for the summary and the exit status.
#[derive(Default)]
pub struct Totals {
    pub failed: u64,
    pub dirs: u64,
    pub links: u64,
    pub deleted: u64,
    pub verified: u64,
}

/// Carries out a plan between two sides.
pub struct Coordinator {
    pub src: Fs,
    pub dst: Fs,
    pub keep: Preserve,
    pub verify: bool,
    /// Files larger than this are copied in parts of this size.
    pub part_bytes: u64,
    pub pool: Pool,
    pub progress: Progress,
    pub totals: Totals,
}

/// What a copy item stands for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FileTaskKind {
    /// A whole regular file.
    Whole,
    /// One part of a large file.
    Part,
    /// A symlink or special file.
    Other,
}

/// A large file being copied in parts: how many are left, and whether
/// one failed.
struct Parted {
    task: FileTask,
    left: usize,
    error: Option<String>,
}

impl Coordinator {
    fn fail(&mut self, msg: String) {
        self.totals.failed += 1;
        self.progress.error(&msg);
    }

    /// Run every phase of `plan`.
    pub async fn execute(&mut self, mut plan: Plan) {
        // 1. What is in the way, or not wanted at the destination.
        let deletes: Vec<_> = std::mem::take(&mut plan.deletes)
            .into_iter()
            .map(|(path, is_dir)| {
                let dst = self.dst.clone();
                async move {
                    let r = if is_dir {
                        dst.remove_tree(&path).await
                    } else {
                        dst.remove_file(&path).await
                    };
                    r.err()
                }
            })
            .collect();
        let n = deletes.len() as u64;
        for e in join_bounded(deletes, META_IN_FLIGHT)
            .await
            .into_iter()
            .flatten()
        {
            self.fail(e);
        }
        self.totals.deleted = n;

        // 2. Directories, a level at a time (parents exist before children).
        let mut by_depth: Vec<Vec<Vec<u8>>> = Vec::new();
        for (_, d) in std::mem::take(&mut plan.mkdirs) {
            let depth = d.iter().filter(|&&b| b == b'/').count();
            if by_depth.len() <= depth {
                by_depth.resize(depth + 1, Vec::new());
            }
            by_depth[depth].push(d);
        }
        let mut failed_dirs: Vec<Vec<u8>> = Vec::new();
        for level in by_depth {
            self.totals.dirs += level.len() as u64;
            let calls: Vec<_> = level
                .into_iter()
                .map(|d| {
                    let dst = self.dst.clone();
                    // Owner-writable until its attributes are set last.
                    async move { dst.mkdir(&d, 0o700).await.err().map(|e| (d, e)) }
                })
                .collect();
            for (d, e) in join_bounded(calls, META_IN_FLIGHT)
                .await
                .into_iter()
                .flatten()
            {
                failed_dirs.push(d);
                self.fail(e);
            }
        }
        // Nothing can go below a directory that could not be made; its
        // failure was reported once.
        let under_failed = |p: &[u8]| {
            failed_dirs
                .iter()
                .any(|d| p.starts_with(d) && p.get(d.len()) == Some(&b'/'))
        };
        plan.files.retain(|f| !under_failed(&f.dst));
        plan.compares.retain(|f| !under_failed(&f.dst));
        plan.symlinks.retain(|s| !under_failed(&s.1));
        plan.specials.retain(|s| !under_failed(&s.1));
        plan.links.retain(|l| !under_failed(&l.dst));

        // 3. sync --checksum: files whose size and mtime match are
        // compared; those that differ are copied.
        let compares = std::mem::take(&mut plan.compares);
        let items: Vec<Item> = compares
            .iter()
            .enumerate()
            .map(|(i, f)| Item {
                id: i as u64,
                work: Work::Compare {
                    src: f.src.clone(),
                    dst: f.dst.clone(),
                },
            })
            .collect();
        let mut differ = Vec::new();
        let mut compare_failures = Vec::new();
        self.pool
            .run(items, async |o: Outcome| match o.error {
                Some(e) => compare_failures.push(e),
                None if !o.same => differ.push(compares[o.id as usize].clone()),
                None => {}
            })
            .await;
        for e in compare_failures {
            self.fail(e);
        }
        let (files, bytes) = (differ.len() as u64, differ.iter().map(|f| f.size).sum());
        self.progress.grow(files, bytes);
        plan.files.extend(differ);

        // 4. Files, symlinks and special files.
        let failed_primaries = self.copy_files(&mut plan).await;

        // 5. Hard links, to the copies of their first names.
        let links: Vec<_> = std::mem::take(&mut plan.links)
            .into_iter()
            .filter(|l| !failed_primaries.contains(&l.primary_dst))
            .map(|l| {
                let dst = self.dst.clone();
                async move {
                    if l.replace {
                        dst.remove_file(&l.dst).await?;
                    }
                    dst.hard_link(&l.primary_dst, &l.dst).await
                }
            })
            .collect();
        self.totals.links = links.len() as u64;
        for e in join_bounded(links, META_IN_FLIGHT)
            .await
            .into_iter()
            .filter_map(|r| r.err())
        {
            self.fail(e);
        }

        // 6. Directory modes and times, deepest first: filling a directory
        // changed its times, and a read-only mode would have stopped it.
        let mut dirs = std::mem::take(&mut plan.dir_attrs);
        dirs.sort_by_key(|(_, d)| std::cmp::Reverse(d.iter().filter(|&&b| b == b'/').count()));
        let calls: Vec<_> = dirs
            .into_iter()
            .filter(|(_, d)| !failed_dirs.contains(d))
            .map(|(s, d)| {
                let (src, dst, keep) = (self.src.clone(), self.dst.clone(), self.keep);
                async move {
                    let mut meta = src.lstat(&s).await?;
                    if !keep.mode {
                        meta.perm &= 0o777 & !super::fs::umask();
                    }
                    let keep = Preserve { mode: true, ..keep };
                    dst.set_attrs(&d, &meta, keep).await
                }
            })
            .collect();
        for e in join_bounded(calls, META_IN_FLIGHT)
            .await
            .into_iter()
            .filter_map(|r| r.err())
        {
            self.fail(e);
        }
    }

    /// Copy every file, symlink and special file of the plan; the
    /// destinations of files that failed (their hard links are skipped).
    async fn copy_files(&mut self, plan: &mut Plan) -> HashSet<Vec<u8>> {
        let mut items = Vec::new();
        // What each item is for: its file's index, and the kind of item.
        let mut owner: Vec<(usize, FileTaskKind)> = Vec::new();
        let files = std::mem::take(&mut plan.files);
        let mut parted: HashMap<usize, Parted> = HashMap::new();
        let mut failed_primaries = HashSet::new();
        // Large files: the temporary file is made at its full size first,
        // then the parts are handed out.
        let big: Vec<usize> = (0..files.len())
            .filter(|&i| files[i].size > self.part_bytes)
            .collect();
        let made: Vec<_> = big
            .iter()
            .map(|&i| {
                let (dst, f) = (self.dst.clone(), &files[i]);
                async move {
                    let tmp = temp_path(&f.dst);
                    let w = dst.create(&tmp, 0o600).await?;
                    let sized = w.set_len(f.size, &tmp).await;
                    w.close(&tmp).await?;
                    sized
                }
            })
            .collect();
        let made = join_bounded(made, META_IN_FLIGHT).await;
        for (&i, r) in big.iter().zip(made) {
            if let Err(e) = r {
                failed_primaries.insert(files[i].dst.clone());
                self.fail(e);
                continue;
            }
            let f = &files[i];
            let tmp = temp_path(&f.dst);
            let mut offset = 0;
            let mut left = 0;
            while offset < f.size {
                let len = self.part_bytes.min(f.size - offset);
                items.push(Work::Part {
                    src: f.src.clone(),
                    tmp: tmp.clone(),
                    offset,
                    len,
                });
                owner.push((i, FileTaskKind::Part));
                offset += len;
                left += 1;
            }
            parted.insert(
                i,
                Parted {
                    task: f.clone(),
                    left,
                    error: None,
                },
            );
        }
        for (i, f) in files.iter().enumerate() {
            if f.size <= self.part_bytes {
                items.push(Work::File {
                    src: f.src.clone(),
                    dst: f.dst.clone(),
                    fresh: f.fresh,
                });
                owner.push((i, FileTaskKind::Whole));
            }
        }
        for (src, dst, replace) in std::mem::take(&mut plan.symlinks) {
            items.push(Work::Symlink { src, dst, replace });
            owner.push((usize::MAX, FileTaskKind::Other));
        }
        for (src, dst, replace) in std::mem::take(&mut plan.specials) {
            items.push(Work::Special { src, dst, replace });
            owner.push((usize::MAX, FileTaskKind::Other));
        }
        let items: Vec<Item> = items
            .into_iter()
            .enumerate()
            .map(|(id, work)| Item {
                id: id as u64,
                work,
            })
            .collect();
        let mut finished: Vec<FileTask> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let mut pool = std::mem::replace(
            &mut self.pool,
            Pool::Local {
                exec: Box::new(Executor::new(Fs::Local, Fs::Local, Preserve::default())),
                jobs: 0,
            },
        );
        let (src, dst, keep) = (self.src.clone(), self.dst.clone(), self.keep);
        let progress = &mut self.progress;
        pool.run(items, async |o: Outcome| {
            let (i, kind) = owner[o.id as usize];
            match kind {
                FileTaskKind::Part => {
                    let p = parted.get_mut(&i).expect("parted file");
                    progress.advance(0, o.bytes);
                    p.left -= 1;
                    if let Some(e) = o.error {
                        p.error.get_or_insert(e);
                    }
                    if p.left == 0 {
                        let p = parted.remove(&i).expect("parted file");
                        let r = match p.error {
                            Some(e) => Err(e),
                            None => finish_parted(&src, &dst, keep, &p.task).await,
                        };
                        match r {
                            Ok(()) => {
                                progress.advance(1, 0);
                                finished.push(p.task);
                            }
                            Err(e) => {
                                let _ = dst.remove_file(&temp_path(&p.task.dst)).await;
                                failed_primaries.insert(p.task.dst.clone());
                                failures.push(e);
                                progress.error(failures.last().expect("just pushed"));
                            }
                        }
                    }
                }
                FileTaskKind::Whole | FileTaskKind::Other => match o.error {
                    None => {
                        progress.advance(1, o.bytes);
                        if kind == FileTaskKind::Whole {
                            finished.push(files[i].clone());
                        }
                    }
                    Some(e) => {
                        if kind == FileTaskKind::Whole {
                            failed_primaries.insert(files[i].dst.clone());
                        }
                        progress.error(&e);
                        failures.push(e);
                    }
                },
            }
        })
        .await;
        self.totals.failed += failures.len() as u64;
        if self.verify {
            self.verify_files(&mut pool, finished).await;
        }
        self.pool = pool;
        failed_primaries
    }

    /// --verify: compare the checksums of every file copied.
    async fn verify_files(&mut self, pool: &mut Pool, files: Vec<FileTask>) {
        let items: Vec<Item> = files
            .iter()
            .enumerate()
            .map(|(i, f)| Item {
                id: i as u64,
                work: Work::Compare {
                    src: f.src.clone(),
                    dst: f.dst.clone(),
                },
            })
            .collect();
        let mut bad = Vec::new();
        let mut verified = 0;
        pool.run(items, async |o: Outcome| match o.error {
            Some(e) => bad.push(format!("verify: {e}")),
            None if !o.same => bad.push(format!(
                "verify: '{}' differs from '{}' after the copy",
                self.dst.display(&files[o.id as usize].dst),
                self.src.display(&files[o.id as usize].src)
            )),
            None => verified += 1,
        })
        .await;
        self.totals.verified = verified;
        for e in bad {
            self.fail(e);
        }
    }
}

/// The last part of a large file is in: give it its attributes and its
/// name.
async fn finish_parted(src: &Fs, dst: &Fs, keep: Preserve, f: &FileTask) -> Result<()> {
    let tmp = temp_path(&f.dst);
    let mut meta = src.lstat(&f.src).await?;
    if meta.size != f.size {
        return Err(format!(
            "'{}' changed while it was copied ({} bytes, {} expected)",
            src.display(&f.src),
            meta.size,
            f.size
        ));
    }
    if !keep.mode {
        meta.perm &= 0o777 & !super::fs::umask();
    }
    dst.set_attrs(&tmp, &meta, Preserve { mode: true, ..keep })
        .await?;
    dst.rename(&tmp, &f.dst).await
}
