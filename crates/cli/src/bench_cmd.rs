//! `madfs bench`: the IO500 benchmark (`io500`), its charts (`plot`), and
//! the hidden `rank` subcommand that each rank process of a run executes.
//! `--client run|mount` makes the ranks go through a user-facing client:
//! the interception library preloaded into each rank, or a FUSE mount this
//! command makes (and removes, also on Ctrl-C) or is given.

use crate::{locate, run_cmd};
use clap::{Args, Subcommand};
use madfs_bench::report::{self, Report};
use madfs_bench::{coord, plot, rank, ClientKind, Config, Target, Verify};
use madfs_client::ClusterConfig;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Run the IO500 phases (ior-easy, ior-hard, mdtest-easy, mdtest-hard,
    /// find) with IO500's parameters, scaled in time and file counts;
    /// print [RESULT] lines and the score.
    Io500(Io500Args),
    /// Draw one or more results files as a grouped bar chart (SVG).
    Plot {
        /// Results files written by `madfs bench io500 --out`.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, default_value = "io500.svg")]
        out: PathBuf,
    },
    /// One rank of a run, driven by its parent over stdin/stdout.
    #[command(hide = true)]
    Rank,
}

#[derive(Args)]
pub struct Io500Args {
    /// Rank processes.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Seconds after which each rank stops a write phase (default: the
    /// scale's: tiny 1, small 10, medium 60, official 300).
    #[arg(long)]
    stonewall: Option<f64>,
    /// `madfs` (the cluster of --cluster / $MADFS_CLUSTER) or a local
    /// directory to run against through the kernel.
    #[arg(long, default_value = "madfs")]
    target: String,
    /// How the ranks reach MadFS: `library` (the client library, by inode
    /// under directories resolved once: the fastest, what a tuned
    /// application could do), `run` (std::fs on /madfs/... with the
    /// interception library preloaded into each rank, as `madfs run`), or
    /// `mount` (std::fs through a FUSE mount: --mount DIR, else one made
    /// on a temporary directory for the run). find is the server-side find
    /// for all three.
    #[arg(long, default_value = "library")]
    client: String,
    /// With `--client mount`: an existing MadFS mount (its root) to use
    /// instead of mounting the cluster.
    #[arg(long)]
    mount: Option<PathBuf>,
    /// Also run against this local directory and print both side by side
    /// with ratios (target / baseline).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Write the results (every run) to this JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Per-rank file counts and sizes: tiny, small, medium, official.
    #[arg(long, default_value = "small")]
    scale: String,
    /// ior-easy transfer size in bytes (a multiple of 8).
    #[arg(long, default_value_t = 1 << 20)]
    transfer: u64,
    /// Check read data against the written pattern: none, sample, all.
    #[arg(long, default_value = "sample")]
    verify: String,
    /// Keep the run's files instead of removing them at the end.
    #[arg(long)]
    keep: bool,
    /// Name of the run in the comparison, the JSON and charts (default:
    /// target and ranks).
    #[arg(long)]
    label: Option<String>,
}

pub fn run(cluster: Option<&Path>, cmd: BenchCommand) -> Result<ExitCode, String> {
    match cmd {
        BenchCommand::Io500(args) => io500(cluster, args),
        BenchCommand::Plot { files, out } => plot_cmd(&files, &out),
        BenchCommand::Rank => {
            let stdin = std::io::stdin();
            let stdout = std::io::stdout();
            rank::rank_main(&mut stdin.lock(), &mut stdout.lock())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn rank_command() -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("madfs"));
    let mut c = Command::new(exe);
    c.args(["bench", "rank"]);
    c
}

/// A rank with the interception library preloaded, as `madfs run` starts
/// a program: LD_PRELOAD, MADFS_CLUSTER and MADFS_PREFIX.
fn preloaded_rank_command(lib: &Path, cluster: &Path, prefix: &str) -> Command {
    let mut c = rank_command();
    let preload = run_cmd::ld_preload(lib, std::env::var_os("LD_PRELOAD").as_deref());
    c.env("LD_PRELOAD", preload)
        .env("MADFS_CLUSTER", cluster)
        .env("MADFS_PREFIX", prefix)
        .env_remove("MADFS_CWD");
    c
}

/// A mount made for a run, removed (unmounted, its directory deleted) when
/// dropped or, through [`on_signal_unmount`], on SIGINT/SIGTERM/SIGHUP.
#[derive(Clone)]
struct RunMount(Arc<Mutex<Option<tempfile::TempDir>>>);

impl RunMount {
    /// Mount `cluster` on a fresh temporary directory (`madfs mount`, its
    /// messages on stderr).
    fn new(cluster: &Path) -> Result<(RunMount, PathBuf), String> {
        let holder = tempfile::Builder::new()
            .prefix("madfs-bench-mnt-")
            .tempdir()
            .map_err(|e| format!("bench: temporary mount point: {e}"))?;
        let dir = holder.path().to_path_buf();
        let exe = std::env::current_exe().map_err(|e| format!("bench: {e}"))?;
        let out = Command::new(exe)
            .arg("--cluster")
            .arg(cluster)
            .arg("mount")
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("bench: cannot run madfs mount: {e}"))?;
        if !out.status.success() || !madfs_fuse::is_madfs_mount(&dir) {
            return Err(format!(
                "bench: mounting the cluster on {} failed ({}): {}{}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!("madfs bench: cluster mounted on {}", dir.display());
        Ok((RunMount(Arc::new(Mutex::new(Some(holder)))), dir))
    }

    /// Unmount (lazily if files are still open) and remove the directory;
    /// once, whoever calls first.
    fn remove(&self) {
        let holder = match self.0.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let Some(holder) = holder else { return };
        let dir = holder.path().to_path_buf();
        if let Err(e) = madfs_fuse::unmount(&dir, false) {
            if let Err(e2) = madfs_fuse::unmount(&dir, true) {
                eprintln!("madfs bench: cannot unmount {}: {e}; {e2}", dir.display());
                std::mem::forget(holder); // never remove a live mount's files
                return;
            }
        }
        if let Err(e) = holder.close() {
            eprintln!("madfs bench: removing {}: {e}", dir.display());
        }
    }
}

impl Drop for RunMount {
    fn drop(&mut self) {
        // Every handle removes the mount when dropped; remove() acts once,
        // so the first drop does it and the handle the signal thread keeps
        // until the process ends changes nothing.
        self.remove();
    }
}

/// On SIGINT, SIGTERM or SIGHUP: unmount `mount` and exit (128 + signal).
/// Ctrl-C reaches the ranks too (one process group); they die, and this
/// process would otherwise die with the mount still there.
fn on_signal_unmount(mount: RunMount) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("bench: {e}"))?;
    let listen = |kind| {
        let _in_runtime = rt.enter();
        signal(kind).map_err(|e| format!("bench: {e}"))
    };
    let mut int = listen(SignalKind::interrupt())?;
    let mut term = listen(SignalKind::terminate())?;
    let mut hup = listen(SignalKind::hangup())?;
    std::thread::Builder::new()
        .name("madfs-bench-signals".into())
        .spawn(move || {
            let n = rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => libc::SIGINT,
                    _ = term.recv() => libc::SIGTERM,
                    _ = hup.recv() => libc::SIGHUP,
                }
            });
            eprintln!("madfs bench: signal {n}: unmounting and stopping");
            mount.remove();
            std::process::exit(128 + n);
        })
        .map_err(|e| format!("bench: {e}"))?;
    Ok(())
}

fn io500(cluster: Option<&Path>, a: Io500Args) -> Result<ExitCode, String> {
    let (limits, default_sw) = madfs_bench::scale(&a.scale).ok_or_else(|| {
        format!(
            "unknown scale '{}' (one of {})",
            a.scale,
            madfs_bench::SCALES.join(", ")
        )
    })?;
    let verify = match a.verify.as_str() {
        "none" => Verify::None,
        "sample" => Verify::Sample,
        "all" => Verify::All,
        v => return Err(format!("unknown --verify '{v}' (none, sample, all)")),
    };
    if a.target != "madfs" && a.client != "library" {
        return Err(format!(
            "bench: --client {} needs --target madfs (a local directory is always \
             reached through the kernel)",
            a.client
        ));
    }
    if a.mount.is_some() && a.client != "mount" {
        return Err("bench: --mount DIR goes with --client mount".into());
    }
    // Kept until the end of the run: dropping it unmounts.
    let mut _made_mount = None;
    let mut spawn: Box<dyn Fn() -> Command> = Box::new(rank_command);
    let target = match (a.target.as_str(), a.client.as_str()) {
        ("madfs", "library") => Target::Madfs {
            cluster: cluster.map(Path::to_path_buf),
        },
        ("madfs", "run") => {
            let lib = run_cmd::find_library().map_err(|e| format!("bench: --client {e}"))?;
            let cluster = cluster_file(cluster)?;
            let prefix = locate::DEFAULT_PREFIX;
            let c = cluster.clone();
            spawn = Box::new(move || preloaded_rank_command(&lib, &c, prefix));
            Target::Client {
                client: ClientKind::Run,
                root: PathBuf::from(prefix),
                cluster,
            }
        }
        ("madfs", "mount") => {
            let cluster = cluster_file(cluster)?;
            let root = match &a.mount {
                Some(dir) => given_mount(dir, &cluster)?,
                None => {
                    let (m, dir) = RunMount::new(&cluster)?;
                    on_signal_unmount(m.clone())?;
                    _made_mount = Some(m);
                    dir
                }
            };
            Target::Client {
                client: ClientKind::Mount,
                root,
                cluster,
            }
        }
        ("madfs", other) => {
            return Err(format!(
                "bench: unknown --client '{other}' (library, run, mount)"
            ))
        }
        (dir, _) => Target::Local {
            dir: PathBuf::from(dir),
        },
    };
    let cfg = Config {
        target,
        workdir: String::new(),
        ranks: a.ranks,
        stonewall_s: a.stonewall.unwrap_or(default_sw),
        scale: a.scale.clone(),
        limits,
        transfer: a.transfer,
        verify,
        keep: a.keep,
    };
    let label = a
        .label
        .clone()
        .unwrap_or_else(|| format!("{}-{}r", short(&cfg.target), a.ranks));
    let mut runs = vec![coord::run(&cfg, &label, &*spawn)?];
    print!("{}", report::summary(&runs[0]));
    if let Some(dir) = &a.baseline {
        let base = Config {
            target: Target::Local { dir: dir.clone() },
            ..cfg.clone()
        };
        let blabel = format!("local-{}r", a.ranks);
        let b = coord::run(&base, &blabel, &rank_command)?;
        print!("{}", report::summary(&b));
        runs.push(b);
        println!("\n{}", report::compare(&runs[0], &runs[1]));
    }
    let errors: u64 = runs.iter().map(|r| r.errors).sum();
    if let Some(out) = &a.out {
        let text = report::to_json(&Report { runs });
        std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        eprintln!("madfs bench: results in {}", out.display());
    }
    if errors > 0 {
        return Err(format!("{errors} verification errors (see above)"));
    }
    Ok(ExitCode::SUCCESS)
}

fn short(t: &Target) -> String {
    match t {
        Target::Madfs { .. } => "madfs".into(),
        Target::Client { client, .. } => format!("madfs-{}", client.name()),
        Target::Local { .. } => "local".into(),
    }
}

/// The cluster file, absolute (the ranks and the mount daemon get it).
fn cluster_file(cluster: Option<&Path>) -> Result<PathBuf, String> {
    let file = ClusterConfig::locate(cluster);
    ClusterConfig::load(&file).map_err(|e| format!("bench: {e}"))?;
    std::path::absolute(&file).map_err(|e| format!("bench: '{}': {e}", file.display()))
}

/// `--mount DIR`, checked: the root of a MadFS mount of `cluster`.
fn given_mount(dir: &Path, cluster: &Path) -> Result<PathBuf, String> {
    let abs = madfs_fuse::absolute(dir).map_err(|e| format!("bench: {}: {e}", dir.display()))?;
    if !madfs_fuse::is_madfs_mount(&abs) {
        return Err(format!(
            "bench: --mount {}: not the root of a MadFS mount",
            abs.display()
        ));
    }
    let client = madfs_client::Client::connect(Some(cluster)).map_err(|e| format!("bench: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("bench: {e}"))?;
    rt.block_on(locate::same_fs(&client, "/", &abs))
        .map_err(|e| {
            format!(
                "bench: --mount {} is not {}: {e}",
                abs.display(),
                cluster.display()
            )
        })?;
    Ok(abs)
}

fn plot_cmd(files: &[PathBuf], out: &Path) -> Result<ExitCode, String> {
    let mut runs = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        let rep = report::from_json(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        runs.extend(rep.runs);
    }
    std::fs::write(out, plot::svg(&runs))
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    eprintln!(
        "madfs bench: {} runs drawn in {}",
        runs.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
