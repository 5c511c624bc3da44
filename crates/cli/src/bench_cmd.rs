//! `madfs bench`: the IO500 benchmark (`io500`), its charts (`plot`), and
//! the hidden `rank` subcommand that each rank process of a run executes.

use clap::{Args, Subcommand};
use madfs_bench::report::{self, Report};
use madfs_bench::{coord, plot, rank, Config, Target, Verify};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

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
    let target = if a.target == "madfs" {
        Target::Madfs {
            cluster: cluster.map(Path::to_path_buf),
        }
    } else {
        Target::Local {
            dir: PathBuf::from(&a.target),
        }
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
    let mut runs = vec![coord::run(&cfg, &label, &rank_command)?];
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
        Target::Local { .. } => "local".into(),
    }
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
