//! `madfs fsx DIR`: the file exerciser of crates/fsx on any directory (a
//! MadFS mount, `/madfs/...` under `madfs run`, a local directory). Prints
//! a one-line summary on success; on the first difference the failure
//! report (seed, operation, expected against actual, the last operations,
//! the replay command) on stderr, and exits non-zero.

use madfs_fsx::Config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct FsxArgs {
    /// Directory to make the files in (it must exist).
    dir: PathBuf,
    /// Seed of the operation stream: the same seed and settings replay the
    /// same operations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operations to run.
    #[arg(long, default_value_t = madfs_fsx::DEFAULT_OPS)]
    ops: u64,
    /// Largest file size, in bytes.
    #[arg(long, default_value_t = madfs_fsx::DEFAULT_MAX_LEN)]
    max_len: u64,
    /// Largest single read or write, in bytes.
    #[arg(long, default_value_t = madfs_fsx::DEFAULT_MAX_OP_LEN)]
    max_op_len: u64,
    /// No mmap at all.
    #[arg(long)]
    no_mmap: bool,
    /// No shared writable mappings (`madfs run` refuses them: ENOTSUP).
    #[arg(long)]
    no_mmap_write: bool,
    /// No mmap reads (mmap writes stay, unless turned off too).
    #[arg(long)]
    no_mmap_read: bool,
    /// Files exercised at once.
    #[arg(long, default_value_t = 1)]
    file_count: usize,
    /// Write every operation to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Read every file back whole every N operations (0: only at the end).
    #[arg(long, default_value_t = madfs_fsx::DEFAULT_CHECK_EVERY)]
    check_every: u64,
}

pub fn run(args: FsxArgs) -> Result<ExitCode, String> {
    let mut cfg = Config::new(&args.dir);
    cfg.seed = args.seed;
    cfg.ops = args.ops;
    cfg.max_len = args.max_len;
    cfg.max_op_len = args.max_op_len;
    cfg.mmap_read = !args.no_mmap && !args.no_mmap_read;
    cfg.mmap_write = !args.no_mmap && !args.no_mmap_write;
    cfg.file_count = args.file_count;
    cfg.log = args.log;
    cfg.check_every = args.check_every;
    match madfs_fsx::run(&cfg) {
        Ok(summary) => {
            println!("{summary}");
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            eprint!("{failure}");
            Ok(ExitCode::FAILURE)
        }
    }
}
