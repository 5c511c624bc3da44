//! Staging: `madfs cp` and `madfs sync`, parallel copies into and out of
//! MadFS (or between two places of one side), on this host or spread over
//! the job's hosts; and the stage-in and stage-out of `madfs up` and
//! `madfs down`. The files: fs.rs (the two sides), io.rs (their open
//! files), walk.rs (listing a tree), plan.rs (what to do), copy.rs (one
//! work item), run.rs (the coordinator and its pool), worker.rs (workers
//! on other hosts), progress.rs (what people see), updown.rs (stage-in and
//! stage-out).

mod copy;
mod fs;
mod io;
mod plan;
pub(crate) mod progress;
mod run;
mod updown;
mod walk;
mod worker;

use fs::{show, Fs, MadfsSide, Preserve};
use plan::{Plan, SyncRules};
use progress::{human_bytes, Progress};
use run::{Coordinator, Pool};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use worker::{Crew, Spread};

pub use updown::stage;

/// Work items in flight at once by default: on one host, tasks of this
/// process; spread, on each worker.
const JOBS_DEFAULT: usize = 32;
/// The prefix that marks a MadFS path on the command line.
const MADFS_PREFIX: &str = "madfs:";

/// Where the work runs: `--hosts`/`--slurm` as in `madfs up`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpreadArgs {
    /// Spread the copy over these hosts (a file or comma-separated list, as
    /// `madfs up --hosts`), each running a worker that copies a share.
    #[arg(long, value_name = "FILE|LIST")]
    pub hosts: Option<String>,
    /// Spread the copy over the nodes of SLURM_JOB_NODELIST (through srun).
    #[arg(long)]
    pub slurm: bool,
    /// How to run a command on a host, {host} replaced by its name (as
    /// `madfs up --exec`).
    #[arg(long, value_name = "TEMPLATE")]
    pub exec: Option<String>,
    /// The madfs binary on the hosts (default: this one's path).
    #[arg(long, value_name = "PATH")]
    pub madfs: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Copy directories and their contents.
    #[arg(short = 'r', short_alias = 'R', long)]
    pub recursive: bool,
    /// Archive: -r, and keep modes, owners (as root), times and hard links.
    #[arg(short = 'a', long)]
    pub archive: bool,
    /// Compare the checksums of every file copied with its source.
    #[arg(long)]
    pub verify: bool,
    /// Work items in flight at once (on each host when spread).
    #[arg(long, default_value_t = JOBS_DEFAULT)]
    pub jobs: usize,
    #[command(flatten)]
    pub spread: SpreadArgs,
    /// SRC... DST: local paths, or MadFS paths as madfs:/PATH.
    #[arg(required = true, num_args = 2..)]
    pub paths: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// Remove what DST holds and SRC does not.
    #[arg(long)]
    pub delete: bool,
    /// Print what would be done; change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Compare the contents (checksums) of files whose size and mtime match.
    #[arg(long)]
    pub checksum: bool,
    /// Compare the checksums of every file copied with its source.
    #[arg(long)]
    pub verify: bool,
    #[arg(long, default_value_t = JOBS_DEFAULT)]
    pub jobs: usize,
    #[command(flatten)]
    pub spread: SpreadArgs,
    /// Local path, or MadFS path as madfs:/PATH.
    pub src: OsString,
    /// DST becomes a copy of SRC's contents.
    pub dst: OsString,
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    pub connect: std::net::SocketAddr,
    #[arg(long)]
    pub run: String,
    #[arg(long)]
    pub host: String,
}

/// A path on one side.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    madfs: bool,
    path: Vec<u8>,
}

fn endpoint(arg: &OsString) -> Result<Endpoint, String> {
    let bytes = arg.as_bytes();
    if let Some(p) = bytes.strip_prefix(MADFS_PREFIX.as_bytes()) {
        let mut path = p.to_vec();
        if !path.starts_with(b"/") {
            path.insert(0, b'/');
        }
        return Ok(Endpoint { madfs: true, path });
    }
    if bytes.is_empty() {
        return Err("an empty path".into());
    }
    let p = Path::new(arg);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("no current directory: {e}"))?
            .join(p)
    };
    let mut path = abs.into_os_string().into_encoded_bytes();
    // Keep a trailing slash: it says "a directory" (cp's DST/).
    if bytes.ends_with(b"/") && !path.ends_with(b"/") {
        path.push(b'/');
    }
    Ok(Endpoint { madfs: false, path })
}

/// What runs a copy: the sides, the pool and its options.
struct Setup {
    client: Option<madfs_client::Client>,
    cluster: Option<PathBuf>,
}

impl Setup {
    fn new(cluster: Option<&Path>, needs_madfs: bool) -> Result<Setup, String> {
        let client = if needs_madfs {
            Some(madfs_client::Client::connect(cluster).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Setup {
            client,
            cluster: cluster.map(Path::to_path_buf),
        })
    }

    fn side(&self, madfs: bool) -> Fs {
        match (&self.client, madfs) {
            (Some(c), true) => Fs::Madfs(MadfsSide::new(c.clone())),
            _ => Fs::Local,
        }
    }
}

/// The hosts of `--hosts`/`--slurm`, or None to work here.
fn spread_of(args: &SpreadArgs) -> Result<Option<Spread>, String> {
    let hosts: Vec<String> = match (&args.hosts, args.slurm) {
        (Some(h), _) => crate::hosts::parse_hosts(h)?
            .into_iter()
            .map(|h| h.name)
            .collect(),
        (None, true) => {
            let list = std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                "--slurm: SLURM_JOB_NODELIST is not set (run inside an allocation)".to_string()
            })?;
            crate::hosts::expand_nodelist(&list)?
        }
        (None, false) => {
            if args.exec.is_some() || args.madfs.is_some() {
                return Err("--exec and --madfs need --hosts or --slurm".into());
            }
            return Ok(None);
        }
    };
    let exec = match (&args.exec, args.slurm) {
        (Some(e), _) => e.clone(),
        (None, true) => crate::hosts::SLURM_EXEC.to_string(),
        (None, false) => crate::hosts::SSH_EXEC.to_string(),
    };
    crate::hosts::exec_argv(&exec, "h")?;
    let madfs = match &args.madfs {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    Ok(Some(Spread { hosts, exec, madfs }))
}

/// One copy: pairs of roots (source, destination), compared first when
/// `sync`.
struct Job {
    command: &'static str,
    pairs: Vec<(Endpoint, Endpoint)>,
    sync: Option<SyncRules>,
    /// Copy directories (cp -r).
    recursive: bool,
    keep: Preserve,
    links: bool,
    verify: bool,
    dry_run: bool,
    jobs: usize,
    spread: Option<Spread>,
}

pub fn cp(cluster: Option<&Path>, args: CpArgs) -> Result<ExitCode, String> {
    let (dst_arg, srcs) = args.paths.split_last().ok_or("cp needs SRC... DST")?;
    let dst = endpoint(dst_arg)?;
    let srcs: Vec<Endpoint> = srcs.iter().map(endpoint).collect::<Result<_, _>>()?;
    let keep = Preserve {
        mode: args.archive,
        owner: args.archive,
        times: args.archive,
    };
    let job = Job {
        command: "cp",
        pairs: srcs.into_iter().map(|s| (s, dst.clone())).collect(),
        sync: None,
        recursive: args.recursive || args.archive,
        keep,
        links: args.archive,
        verify: args.verify,
        dry_run: false,
        jobs: args.jobs.max(1),
        spread: spread_of(&args.spread)?,
    };
    run_job(cluster, job)
}

pub fn sync(cluster: Option<&Path>, args: SyncArgs) -> Result<ExitCode, String> {
    let job = Job {
        command: "sync",
        pairs: vec![(endpoint(&args.src)?, endpoint(&args.dst)?)],
        sync: Some(SyncRules {
            delete: args.delete,
            checksum: args.checksum,
        }),
        recursive: true,
        keep: Preserve {
            mode: true,
            owner: true,
            times: true,
        },
        links: true,
        verify: args.verify,
        dry_run: args.dry_run,
        jobs: args.jobs.max(1),
        spread: spread_of(&args.spread)?,
    };
    run_job(cluster, job)
}

/// `cp`'s rule for where SRC goes: into DST when DST is a directory (or
/// ends with `/`, or there are several sources), else DST itself.
async fn cp_target(
    dst_fs: &Fs,
    src: &Endpoint,
    dst: &Endpoint,
    many: bool,
) -> Result<Vec<u8>, String> {
    let dst_path = walk::trim_root(&dst.path).to_vec();
    let into = many
        || dst.path.ends_with(b"/")
        || match dst_fs {
            Fs::Local => Path::new(std::ffi::OsStr::from_bytes(&dst_path)).is_dir(),
            Fs::Madfs(m) => m
                .client
                .stat(dst_path.as_slice())
                .await
                .is_ok_and(|a| a.kind == madfs_client::FileKind::Dir),
        };
    if !into {
        return Ok(dst_path);
    }
    let (_, name) = fs::split_path(walk::trim_root(&src.path));
    if name.is_empty() {
        return Err(format!(
            "cannot copy '{}' into a directory: it has no name",
            show(&src.path)
        ));
    }
    Ok(fs::join(&dst_path, name))
}

fn run_job(cluster: Option<&Path>, job: Job) -> Result<ExitCode, String> {
    let _ = fs::umask(); // read before any thread creates files
    let needs_madfs = job.pairs.iter().any(|(s, d)| s.madfs || d.madfs);
    let setup = Setup::new(cluster, needs_madfs)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run_job_async(&setup, job))
}

async fn run_job_async(setup: &Setup, job: Job) -> Result<ExitCode, String> {
    let (src_madfs, dst_madfs) = (job.pairs[0].0.madfs, job.pairs[0].1.madfs);
    if job
        .pairs
        .iter()
        .any(|(s, d)| s.madfs != src_madfs || d.madfs != dst_madfs)
    {
        return Err("every SRC must be on the same side (all local or all madfs:)".into());
    }
    let (src_fs, dst_fs) = (setup.side(src_madfs), setup.side(dst_madfs));
    let mut plan = Plan::default();
    let mut early_failures: Vec<String> = Vec::new();
    // Where each copy goes: their parents are made first (`cp -r in
    // madfs:/run1/` makes /run1).
    let mut targets: Vec<Vec<u8>> = Vec::new();
    let many = job.pairs.len() > 1;
    for (src, dst) in &job.pairs {
        let src_root = walk::trim_root(&src.path).to_vec();
        let Some(mut tree) = walk::walk(&src_fs, &src_root).await? else {
            early_failures.push(format!(
                "cannot stat '{}': no such file or directory",
                src_fs.display(&src_root)
            ));
            continue;
        };
        early_failures.append(&mut tree.errors);
        if !job.links {
            tree.nodes.iter_mut().for_each(|n| n.linked = false);
        }
        let root_is_dir = tree.nodes[0].kind == madfs_client::FileKind::Dir;
        if root_is_dir && !job.recursive {
            early_failures.push(format!(
                "-r not specified; omitting directory '{}'",
                src_fs.display(&src_root)
            ));
            continue;
        }
        match job.sync {
            Some(rules) => {
                let dst_root = walk::trim_root(&dst.path).to_vec();
                let mut old = walk::walk(&dst_fs, &dst_root).await?;
                if let Some(t) = &mut old {
                    early_failures.append(&mut t.errors);
                }
                plan.add(&src_root, &tree, &dst_root, old.as_ref(), rules);
                targets.push(dst_root);
            }
            None => {
                let target = cp_target(&dst_fs, src, dst, many).await?;
                plan.add(&src_root, &tree, &target, None, SyncRules::default());
                targets.push(target);
            }
        }
    }
    if job.dry_run {
        print_dry_run(&dst_fs, &src_fs, &plan);
        return Ok(exit_code(early_failures.is_empty()));
    }
    for t in &targets {
        let (parent, _) = fs::split_path(t);
        dst_fs.mkdir_all(parent).await?;
    }
    let (files, bytes) = plan.totals();
    let progress = Progress::new(job.command, files, bytes, true);
    for e in &early_failures {
        progress.error(e);
    }
    let keep = job.keep;
    let pool = match &job.spread {
        // Nothing to copy (an unchanged tree): no worker to start.
        None | Some(_) if plan.is_empty() => Pool::Local {
            exec: Box::new(copy::Executor::new(src_fs.clone(), dst_fs.clone(), keep)),
            jobs: job.jobs,
        },
        None => Pool::Local {
            exec: Box::new(copy::Executor::new(src_fs.clone(), dst_fs.clone(), keep)),
            jobs: job.jobs,
        },
        Some(spread) => {
            let path = madfs_client::ClusterConfig::locate(setup.cluster.as_deref());
            let cfg_text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let cfg = madfs_client::ClusterConfig::from_toml(&cfg_text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let key = madfs_client::ClusterConfig::load(&path)
                .and_then(|c| c.load_key())
                .map_err(|e| e.to_string())?;
            let report = |m: &str| progress.error(m);
            let crew = Crew::start(
                spread,
                &cfg,
                &cfg_text,
                &key,
                worker::Terms {
                    sides: (src_fs.side(), dst_fs.side()),
                    keep,
                    jobs: job.jobs,
                },
                &report,
            )
            .await?;
            Pool::Remote(crew)
        }
    };
    if let Pool::Local { exec, .. } = &pool {
        progress.follow(exec.moved());
    }
    let unchanged = plan.unchanged;
    let mut coord = Coordinator {
        src: src_fs,
        dst: dst_fs,
        keep,
        verify: job.verify,
        part_bytes: copy::part_bytes(matches!(pool, Pool::Remote(_))),
        pool,
        progress,
        totals: run::Totals::default(),
    };
    coord.totals.failed += early_failures.len() as u64;
    coord.execute(plan).await;
    let mut shares = Vec::new();
    if let Pool::Remote(crew) = &mut coord.pool {
        crew.stop().await;
        shares = crew.shares();
    }
    let p = &coord.progress;
    p.clear();
    let t = &coord.totals;
    let secs = p.elapsed().as_secs_f64().max(1e-3);
    let mut line = format!(
        "madfs {}: {} files ({}) in {:.1} s, {}/s",
        job.command,
        p.files_done(),
        human_bytes(p.bytes_done()),
        secs,
        human_bytes((p.bytes_done() as f64 / secs) as u64),
    );
    for (n, what) in [
        (t.dirs, "directories made"),
        (t.links, "hard links"),
        (unchanged, "up to date"),
        (t.deleted, "deleted"),
        (t.verified, "verified"),
    ] {
        if n > 0 {
            line.push_str(&format!(", {n} {what}"));
        }
    }
    if t.failed > 0 {
        line.push_str(&format!(", {} FAILED", t.failed));
    }
    println!("{line}");
    if !shares.is_empty() {
        let by_host: Vec<String> = shares
            .iter()
            .map(|(h, s)| format!("{h} {} items {}", s.items, human_bytes(s.bytes)))
            .collect();
        println!("  by host: {}", by_host.join(", "));
    }
    Ok(exit_code(t.failed == 0))
}

fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_dry_run(dst: &Fs, src: &Fs, plan: &Plan) {
    for (p, _) in &plan.deletes {
        println!("delete {}", dst.display(p));
    }
    for (_, d) in &plan.mkdirs {
        println!("mkdir {}", dst.display(d));
    }
    for f in &plan.files {
        println!("copy {} -> {}", src.display(&f.src), dst.display(&f.dst));
    }
    for f in &plan.compares {
        println!("compare {} -> {}", src.display(&f.src), dst.display(&f.dst));
    }
    for (s, d, _) in plan.symlinks.iter().chain(&plan.specials) {
        println!("copy {} -> {}", src.display(s), dst.display(d));
    }
    for l in &plan.links {
        println!(
            "link {} -> {}",
            dst.display(&l.dst),
            dst.display(&l.primary_dst)
        );
    }
    let (files, bytes) = plan.totals();
    println!(
        "would copy {files} files ({}), {} up to date, delete {}",
        human_bytes(bytes),
        plan.unchanged,
        plan.deletes.len()
    );
}

pub fn worker(args: WorkerArgs) -> Result<ExitCode, String> {
    worker::worker_main(args.connect, &args.run, &args.host).map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_stage_pairs_parse() {
        let e = endpoint(&OsString::from("madfs:/run1/")).unwrap();
        assert!(e.madfs && e.path == b"/run1/");
        assert_eq!(endpoint(&OsString::from("madfs:x")).unwrap().path, b"/x");
        let l = endpoint(&OsString::from("/scratch/in")).unwrap();
        assert!(!l.madfs && l.path == b"/scratch/in");
        assert!(endpoint(&OsString::from("rel"))
            .unwrap()
            .path
            .starts_with(b"/"));
    }
}
