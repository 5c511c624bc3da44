//! `madfs`: the one binary. Runs a server, starts and stops a local cluster,
//! offers file commands over the client library (no mount needed), and
//! mounts a cluster with FUSE (mount, umount).

mod bench_cmd;
mod cluster_cmd;
mod files;
mod find_cmd;
mod fsx_cmd;
mod hosts;
mod locate;
mod metrics_cmd;
mod mount_cmd;
mod run_cmd;
mod stage;

use clap::{Parser, Subcommand};
use madfs_rpc::ClusterConfig;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn parse_cache_ttl(s: &str) -> Result<std::time::Duration, String> {
    madfs_client::parse_ttl(s)
}

#[derive(Parser)]
#[command(
    name = "madfs",
    version,
    about = "MadFS: a user-space distributed parallel file system"
)]
struct Cli {
    /// Cluster file (default: $MADFS_CLUSTER, else ./madfs-data/cluster.toml)
    #[arg(long, global = true)]
    cluster: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one server of a cluster (in the foreground).
    Server {
        /// This server's id in the cluster file.
        #[arg(long)]
        id: u16,
        /// Threads serving requests (default: one per core). `madfs up`
        /// divides the cores among the servers it starts on this host.
        #[arg(long)]
        threads: Option<usize>,
        /// Memory for the in-memory copy of dentries and inode attributes
        /// that `madfs find` and `madfs du` read, in MiB (0: none; they then
        /// read RocksDB, several times slower). A file takes about 130 bytes
        /// (more for names over 22 bytes); a copy that outgrows the budget
        /// is dropped until the server restarts, the inode attributes
        /// before the dentries.
        #[arg(long, default_value_t = madfs_server::FIND_INDEX_DEFAULT_BYTES >> 20)]
        find_index_mib: usize,
        /// Write and read every chunk through the page cache, even large
        /// aligned transfers (which by default bypass it with O_DIRECT).
        #[arg(long)]
        no_direct_io: bool,
        /// Memory for recently written (and read) chunk data, in MiB, so
        /// reads of what was just written skip the disk (0: none). Default:
        /// a quarter of this machine's memory; `madfs up` divides that
        /// among the servers it starts here.
        #[arg(long)]
        cache_mib: Option<usize>,
        /// Serve Prometheus metrics over HTTP (`GET /metrics`) on this
        /// address, e.g. 127.0.0.1:9100 (default: the server's `metrics` in
        /// the cluster file; absent there too: none).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Listen on every interface (0.0.0.0 or ::, at the port the
        /// cluster file gives), not only on the cluster file's address.
        #[arg(long)]
        listen_all: bool,
        /// Serve from this directory instead of the cluster file's
        /// data_dir: e.g. another server's copy of this server's set
        /// (DATA/server-N/replica-of-ID) after this server's disk is lost.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Take over server ID of a cluster with replicas whose server is
        /// lost (host dead, disk gone): start from an empty data directory,
        /// wait until the cluster has failed the old server over, move the
        /// id to --address, and rebuild every copy it holds from the
        /// surviving replicas in the background (`madfs status` shows the
        /// progress).
        #[arg(long)]
        replace: bool,
        /// Listen (and, with --replace, be reached) at this address instead
        /// of the cluster file's, e.g. a replacement on another host.
        #[arg(long, value_name = "HOST:PORT")]
        address: Option<std::net::SocketAddr>,
    },
    /// Start a cluster and wait until every server answers: on 127.0.0.1,
    /// or with --hosts / --slurm on many hosts. Run again on the same
    /// --data to restart whatever servers are down.
    Up {
        /// Number of servers (for a new local cluster).
        #[arg(long, default_value_t = 4)]
        servers: u16,
        /// Where data, logs, the cluster file and the key go. With --hosts
        /// the same path on every host, shared or not: each host keeps its
        /// servers' data, logs and a copy of the cluster file and key (sent
        /// on the standard input of --exec, mode 0600) in DATA/HOST.
        #[arg(long, default_value = "madfs-data")]
        data: PathBuf,
        /// Chunk size in bytes (for a new cluster).
        #[arg(long, default_value_t = madfs_types::limits::CHUNK_SIZE_DEFAULT_BYTES)]
        chunk_size: u64,
        /// First TCP port (default: free ports chosen by the OS; with
        /// --hosts 7100): a host's servers use P, P+1, ...
        #[arg(long)]
        base_port: Option<u16>,
        /// Also mount the cluster on this directory (as `madfs mount`; with
        /// --hosts on every host).
        #[arg(long)]
        mount: Option<PathBuf>,
        /// Chunk cache of each server in MiB (as `madfs server
        /// --cache-mib`; default: a quarter of the host's memory divided
        /// among its servers).
        #[arg(long)]
        cache_mib: Option<usize>,
        /// Start the servers on these hosts: a file (one host per line, `#`
        /// comments) or a comma-separated list; each NAME, NAME=ADDR or
        /// NAME@ADDR. Servers listen on ADDR (default: NAME resolved here).
        #[arg(long, value_name = "FILE|LIST")]
        hosts: Option<String>,
        /// Servers on each host (with --hosts or --slurm).
        #[arg(long, default_value_t = 1)]
        servers_per_host: u16,
        /// How to run a command on a host; {host} is replaced by its name.
        /// Default `ssh -o BatchMode=yes -o ConnectTimeout=10 {host}`;
        /// with --slurm `srun --overlap -N1 -n1 -w {host}`.
        #[arg(long, value_name = "TEMPLATE")]
        exec: Option<String>,
        /// Inside a Slurm allocation: the hosts are SLURM_JOB_NODELIST's
        /// nodes (unless --hosts), reached with srun, one step per host that
        /// runs as long as its servers.
        #[arg(long)]
        slurm: bool,
        /// The madfs binary on the hosts (default: this one's path).
        #[arg(long, value_name = "PATH")]
        madfs: Option<PathBuf>,
        /// Read the cluster key (64 hex digits) from standard input instead
        /// of generating one (with --hosts or --slurm).
        #[arg(long)]
        key_stdin: bool,
        /// Hosts that run no server but get the cluster file and key (and
        /// with --mount, the mount): a file or comma-separated list, as
        /// --hosts, reached through the same --exec.
        #[arg(long, value_name = "FILE|LIST")]
        client_hosts: Option<String>,
        /// Servers listen on every interface (0.0.0.0 or ::), not only on
        /// the address the cluster file gives them.
        #[arg(long)]
        listen_all: bool,
        /// Keep every record and chunk on this many servers (1 to 3; on
        /// different hosts where there are enough): with 2 or more, what
        /// was acknowledged survives the loss of a server's disk.
        #[arg(long, default_value_t = 1)]
        replicas: u8,
        /// Once the servers answer, copy LOCAL into MadFS (`madfs sync
        /// LOCAL madfs:/PATH`, over every host of the cluster); repeatable.
        #[arg(long, value_name = "LOCAL:/PATH")]
        stage_in: Vec<String>,
        /// For a cluster across hosts with replicas: start a replacement of
        /// lost server ID on host --on (`madfs server --replace` there, at
        /// the server's port on that host's address); `down` and later
        /// `up` runs reach it there.
        #[arg(long, value_name = "ID", requires = "on")]
        replace: Option<u16>,
        /// The host (NAME or NAME=ADDR) that takes over --replace's server.
        #[arg(long, value_name = "HOST", requires = "replace")]
        on: Option<String>,
    },
    /// Stop the cluster started by `madfs up` (on every host).
    Down {
        /// The directory `madfs up --data` made (default: the one that
        /// holds the cluster file, --cluster or $MADFS_CLUSTER, else
        /// madfs-data).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Also remove every server's data, logs, the cluster file and key
        /// (on every host).
        #[arg(long)]
        wipe: bool,
        /// First copy /PATH out of MadFS to LOCAL (`madfs sync madfs:/PATH
        /// LOCAL`); if that fails the cluster and its data are kept.
        #[arg(long, value_name = "/PATH:LOCAL")]
        stage_out: Vec<String>,
    },
    /// Copy files and trees into, out of or within MadFS (MadFS paths as
    /// madfs:/PATH), many files and parts of large files at once; spread
    /// over the job's hosts with --hosts or --slurm.
    Cp(stage::CpArgs),
    /// Make DST a copy of SRC's contents, copying only what differs (size
    /// and mtime, or --checksum); resumable after an interruption.
    Sync(stage::SyncArgs),
    /// A worker of a spread `cp` or `sync` (started by them on each host).
    #[command(hide = true)]
    StageWorker(stage::WorkerArgs),
    /// Show every server (grouped by host): address, up/down, inodes, bytes used.
    Status,
    /// Show one server's operations per second, p99 latency and totals,
    /// from two scrapes of its Prometheus metrics a second apart.
    Metrics {
        /// The server, by id (its metrics address comes from the cluster
        /// file).
        #[arg(long, default_value_t = 0)]
        server: u16,
        /// Scrape this address instead (host:port of `madfs server
        /// --metrics`).
        #[arg(long, value_name = "ADDR")]
        address: Option<std::net::SocketAddr>,
    },
    /// Mount the cluster on a directory (FUSE); returns once it is mounted.
    Mount {
        dir: PathBuf,
        /// Serve in this process until unmounted or SIGTERM/SIGINT, instead
        /// of in a background daemon.
        #[arg(long)]
        foreground: bool,
    },
    /// Run a program with MadFS paths under PREFIX served by the
    /// interception library (LD_PRELOAD); every other path goes to the kernel.
    Run {
        /// Where MadFS appears to the program.
        #[arg(long, default_value = "/madfs")]
        prefix: String,
        /// How long names and attributes looked up stay trusted, in seconds
        /// (decimals allowed; 0 turns the metadata cache off). Changes made
        /// by other processes and hosts may be seen this much later; the
        /// program's own are seen at once; open always revalidates the file
        /// it opens (close-to-open). Default 1, as the mount's TTLs.
        #[arg(long, value_parser = parse_cache_ttl)]
        cache_ttl: Option<std::time::Duration>,
        /// At exit, each process prints on stderr the requests it sent, by
        /// operation, and how its metadata cache answered.
        #[arg(long)]
        stats: bool,
        /// The program and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Find entries below PATH, scanned by every server in parallel:
    /// `find PATH [-name GLOB] [-newer FILE] [-size [+-]N[c|w|b|k|M|G]]
    /// [-type f|d|l] [-uid N]` (GNU find's syntax and rules).
    #[command(disable_help_flag = true)]
    Find {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Total apparent size in bytes of everything below PATH (du -s -b).
    Du {
        /// Count inodes instead of bytes (du -s --inodes).
        #[arg(long)]
        inodes: bool,
        paths: Vec<String>,
    },
    /// Check every directory's link count below PATH (default /) against
    /// its subdirectories, scanned by every server in parallel, and for
    /// the whole file system (PATH /) every inode's count against the
    /// names that reach it (leaked inodes, which no name reaches); with
    /// --repair, set wrong ones right and free leaked inodes (root only;
    /// for a quiet file system, after a power cut). Exits 1 while a
    /// problem is left.
    Fsck {
        /// Set each wrong count to what was found (a directory's to 2 plus
        /// its subdirectories, another inode's to its names), freeing an
        /// inode no name reaches.
        #[arg(long)]
        repair: bool,
        path: Option<String>,
    },
    /// Benchmarks: IO500 against MadFS or a local directory, and charts.
    Bench {
        #[command(subcommand)]
        cmd: bench_cmd::BenchCommand,
    },
    /// Exercise files in DIR with random operations checked against a
    /// model (as xfstests' fsx); any directory, not only MadFS.
    Fsx(fsx_cmd::FsxArgs),
    /// Unmount a MadFS mount.
    Umount {
        dir: PathBuf,
        /// Lazy: detach now even if files are open; finish when they close.
        #[arg(short = 'l', long)]
        lazy: bool,
    },
    /// List directory contents.
    Ls {
        /// Long format: mode, links, owner, size, mtime.
        #[arg(short = 'l')]
        long: bool,
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Show a file's attributes.
    Stat { paths: Vec<String> },
    /// Make directories.
    Mkdir {
        /// Make parents as needed; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
        /// Permission bits, octal.
        #[arg(short = 'm', default_value = "755")]
        mode: String,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Copy a local file into MadFS ("-" reads stdin).
    Put { local: PathBuf, remote: String },
    /// Copy a MadFS file to a local file ("-" writes stdout).
    Get { remote: String, local: PathBuf },
    /// Print files to stdout.
    Cat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files (and with -r, directories and their contents).
    Rm {
        #[arg(short = 'r')]
        recursive: bool,
        /// Ignore missing files.
        #[arg(short = 'f')]
        force: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename or move a file or directory.
    Mv { from: String, to: String },
    /// Make a FIFO (p), socket (s), or character (c) or block (b) device
    /// node, as mknod(1); devices need MAJOR and MINOR, and root.
    Mknod {
        /// Permission bits, octal.
        #[arg(short = 'm', default_value = "644")]
        mode: String,
        path: String,
        /// p, s, c (or u) or b.
        #[arg(value_name = "TYPE")]
        kind: String,
        major: Option<u32>,
        minor: Option<u32>,
    },
    /// Make a hard link (or with -s, a symbolic link).
    Ln {
        #[arg(short = 's')]
        symbolic: bool,
        target: String,
        link: String,
    },
}

/// Keep freed large buffers (1 MiB transfers, write payloads) in the
/// process for the next one. With glibc's defaults a buffer this large may
/// be a fresh mapping each time, whose pages the kernel faults in and
/// zeroes on first touch and unmaps on free: with this, ior-easy-write at
/// 2 servers x 4 ranks went from 0.80 to 0.94 GiB/s (docs/PERFORMANCE.md).
fn keep_large_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; no thread runs yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Logs go to stderr at the level MADFS_LOG names (error, warn, info, debug,
/// trace; default warn): servers log rarely, on unusual events, and the
/// tests read some of their lines.
fn init_logging() {
    use tracing_subscriber::filter::LevelFilter;
    let level = match std::env::var("MADFS_LOG").as_deref() {
        Ok("error") => LevelFilter::ERROR,
        Ok("info") => LevelFilter::INFO,
        Ok("debug") => LevelFilter::DEBUG,
        Ok("trace") => LevelFilter::TRACE,
        Ok("off") => LevelFilter::OFF,
        _ => LevelFilter::WARN,
    };
    // SAFETY: isatty only reads the descriptor's state.
    let terminal = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(terminal)
        .with_target(false)
        .try_init();
}

fn main() -> ExitCode {
    // Every command: servers, benchmark ranks, the mount, put and get move
    // large buffers; `run` execs the program, which starts afresh.
    keep_large_buffers();
    init_logging();
    let cli = Cli::parse();
    // Commands that print a listing end quietly when their reader does
    // (`madfs status | head`), as other Unix tools do, instead of panicking
    // on the broken pipe. Not the long-running ones (servers, the mount,
    // workers), which must never die of a peer's closed pipe.
    if matches!(
        cli.command,
        Command::Status
            | Command::Metrics { .. }
            | Command::Find { .. }
            | Command::Du { .. }
            | Command::Ls { .. }
            | Command::Stat { .. }
            | Command::Cat { .. }
    ) {
        // SAFETY: setting a signal's disposition to its default, before
        // any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Server {
            id,
            threads,
            find_index_mib,
            no_direct_io,
            cache_mib,
            metrics,
            listen_all,
            data_dir,
            replace,
            address,
        } => cluster_cmd::server(
            cli.cluster.as_deref(),
            cluster_cmd::ServerArgs {
                id,
                threads,
                find_index_mib,
                direct_io: !no_direct_io,
                cache_mib,
                metrics,
                listen_all,
                data_dir,
                replace,
                address,
            },
        ),
        Command::Up {
            servers,
            data,
            chunk_size,
            base_port,
            mount,
            cache_mib,
            hosts,
            servers_per_host,
            exec,
            slurm,
            madfs,
            key_stdin,
            client_hosts,
            listen_all,
            replicas,
            stage_in,
            replace,
            on,
        } => {
            let multihost = hosts.is_some() || slurm || hosts::is_multihost(&data);
            let stray = [
                (exec.is_some(), "--exec"),
                (madfs.is_some(), "--madfs"),
                (key_stdin, "--key-stdin"),
                (servers_per_host != 1, "--servers-per-host"),
                (client_hosts.is_some(), "--client-hosts"),
                (listen_all, "--listen-all"),
            ];
            if let (false, Some((_, flag))) = (multihost, stray.iter().find(|(set, _)| *set)) {
                Err(format!("{flag} needs --hosts or --slurm"))
            } else if let (Some(id), Some(on)) = (replace, on) {
                if multihost {
                    hosts::replace(&data, id, &on)
                } else {
                    Err(format!(
                        "--replace needs a cluster across hosts in {} (for a local one, run \
                         `madfs server --replace --id {id}`)",
                        data.display()
                    ))
                }
            } else if multihost {
                hosts::up(
                    &data,
                    &hosts::UpOptions {
                        hosts,
                        slurm,
                        exec,
                        servers_per_host,
                        base_port,
                        chunk_size,
                        cache_mib,
                        madfs,
                        key_stdin,
                        mount,
                        client_hosts,
                        listen_all,
                        replicas,
                    },
                )
            } else {
                cluster_cmd::up(servers, &data, chunk_size, base_port, cache_mib, replicas)
                    .and_then(|code| match mount {
                        Some(dir) => {
                            mount_cmd::mount(Some(&data.join("cluster.toml")), &dir, false)
                        }
                        None => Ok(code),
                    })
            }
            .and_then(|code| match stage_in.is_empty() {
                true => Ok(code),
                false => stage::stage(&data, &stage_in, true)
                    .map(|()| code)
                    .map_err(|e| format!("the cluster is up, but the stage-in failed: {e}")),
            })
        }
        Command::Down {
            data,
            wipe,
            stage_out,
        } => {
            // `up` writes the cluster file into its data directory: a
            // user who exported MADFS_CLUSTER stops that cluster.
            let data = data.unwrap_or_else(|| {
                ClusterConfig::locate(cli.cluster.as_deref())
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            });
            if let Err(e) = stage::stage(&data, &stage_out, false) {
                return fail(format!(
                    "the stage-out failed, so the cluster is still up with its data \
                     (fix it and run `madfs down` again): {e}"
                ));
            }
            if hosts::is_multihost(&data) {
                hosts::down(&data, wipe)
            } else {
                cluster_cmd::down(&data, wipe)
            }
        }
        Command::Status => cluster_cmd::status(cli.cluster.as_deref()),
        Command::Metrics { server, address } => metrics_cmd::show(
            cli.cluster.as_deref(),
            server,
            address,
            metrics_cmd::DEFAULT_INTERVAL,
        ),
        Command::Mount { dir, foreground } => {
            mount_cmd::mount(cli.cluster.as_deref(), &dir, foreground)
        }
        Command::Umount { dir, lazy } => mount_cmd::umount(&dir, lazy),
        Command::Bench { cmd } => bench_cmd::run(cli.cluster.as_deref(), cmd),
        Command::Find { args } => find_cmd::find(cli.cluster.as_deref(), &args),
        Command::Du { paths, inodes } => find_cmd::du(cli.cluster.as_deref(), &paths, inodes),
        Command::Fsck { repair, path } => find_cmd::fsck(
            cli.cluster.as_deref(),
            path.as_deref().unwrap_or("/"),
            repair,
        ),
        Command::Run {
            prefix,
            cache_ttl,
            stats,
            cmd,
        } => run_cmd::run(
            cli.cluster.as_deref(),
            &run_cmd::RunOptions {
                prefix,
                cache_ttl,
                stats,
            },
            &cmd,
        ),
        Command::Fsx(args) => fsx_cmd::run(args),
        Command::Cp(args) => stage::cp(cli.cluster.as_deref(), args),
        Command::Sync(args) => stage::sync(cli.cluster.as_deref(), args),
        Command::StageWorker(args) => stage::worker(args),
        other => files::run(cli.cluster.as_deref(), other),
    };
    match result {
        Ok(code) => code,
        Err(msg) => fail(msg),
    }
}

fn fail(msg: String) -> ExitCode {
    eprintln!("madfs: {msg}");
    ExitCode::FAILURE
}
