//! MadFS FUSE adapter: mounts a MadFS cluster on a directory so unmodified
//! programs can use it, over the async client library (`madfs_client`).
//!
//! - fs.rs: the `fuser::Filesystem` callbacks, with the caller's
//!   credentials, answered on the reader threads or as tokio tasks;
//! - handles.rs: open files and directory listings by FUSE handle;
//! - dirattrs.rs: directory attributes learned within the TTL;
//! - stats.rs: request counts printed with `MADFS_STATS=1`;
//! - write-behind (madfs_client::writebehind): writes answered before they land, bounded and ordered;
//! - creds.rs: the caller's supplementary groups from /proc;
//! - convert.rs: attributes, times, names and the errno mapping;
//! - mountinfo.rs: finding and unmounting MadFS mounts.
//!
//! [`run`] mounts and serves in the calling thread until the file system is
//! unmounted or the process gets SIGTERM/SIGINT (then it unmounts itself).
//! The `madfs mount` command runs it in a detached background process.

mod convert;
mod creds;
mod dirattrs;
mod fs;
mod handles;
mod mountinfo;
mod stats;

pub use fs::{MadFs, StatsHandle, DEFAULT_TTL, MAX_READAHEAD_BYTES, MAX_WRITE_BYTES};
pub use mountinfo::{absolute, is_madfs_mount, mount_at, unmount, MountEntry, FS_NAME};

use fuser::{Config, MountOption, Session, SessionACL};
use madfs_client::{Client, ClusterConfig, InodeId, Timeouts};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Timeouts of the mount's client: a dead or hung server must turn into an
/// error for the application (EIO when it refuses connections, ETIMEDOUT
/// when it stops answering), never a process stuck in D state for ever.
pub const MOUNT_TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    call: Duration::from_secs(30),
};

/// The mount's client keeps no names or attributes: the kernel caches
/// them for the mount (entry and attribute TTLs), and a second layer would
/// only add staleness. The TTL still says how long a size learned from the
/// owner (at open) is trusted as the end of file by reads while this mount
/// changes nothing (`File::read_at`), as the kernel trusts its attributes:
/// reading a small file to its end then asks nothing more.
const MOUNT_CACHE: madfs_client::CacheConfig = madfs_client::CacheConfig {
    ttl: DEFAULT_TTL,
    entries_max: 0,
    bytes_max: 0,
};

/// Readahead for the mount, in KiB. FUSE can only ask for the kernel's
/// default of 128 KiB at init; with that a sequential reader has 128 KiB
/// requests in flight and reaches about half of what the client library
/// reads. 4 MiB (one default chunk) lets readahead span servers.
const READ_AHEAD_KB: u32 = 4096;

/// FUSE reader threads. Each answers the synchronous requests it reads
/// itself, waiting for the servers (fs.rs, `MadFs::here`), and hands the
/// rest (reads, writes that must wait, listings) to tasks: four let two
/// processes wait on the servers while two more threads keep reading.
const READER_THREADS: usize = 4;

/// What to mount where.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Cluster file (None: $MADFS_CLUSTER, else ./madfs-data/cluster.toml).
    pub cluster_file: Option<PathBuf>,
    pub mountpoint: PathBuf,
    /// Let every user use the mount (FUSE's allow_other). Only root may by
    /// default; other users need `user_allow_other` in /etc/fuse.conf.
    pub allow_other: bool,
    pub timeouts: Timeouts,
}

impl MountConfig {
    /// Defaults: allow_other when running as root (so other uids on the
    /// node, e.g. a job's users, can use a mount an admin made), the mount
    /// timeouts above.
    pub fn new(cluster_file: Option<&Path>, mountpoint: &Path) -> MountConfig {
        MountConfig {
            cluster_file: cluster_file.map(Path::to_path_buf),
            mountpoint: mountpoint.to_path_buf(),
            // SAFETY: geteuid has no preconditions.
            allow_other: unsafe { libc::geteuid() } == 0,
            timeouts: MOUNT_TIMEOUTS,
        }
    }
}

/// Mount and serve until unmounted (by `madfs umount`, fusermount3 -u, or
/// SIGTERM/SIGINT to this process, which unmounts and returns; a second
/// signal exits at once). Errors before the mount is up are returned.
pub fn run(cfg: &MountConfig) -> Result<(), String> {
    let cluster_path = ClusterConfig::locate(cfg.cluster_file.as_deref());
    let cluster = ClusterConfig::load(&cluster_path).map_err(|e| e.to_string())?;
    let key = cluster.load_key().map_err(|e| e.to_string())?;
    // The kernel caches names and attributes for the mount (entry and
    // attribute TTLs): the client's own metadata cache would only add a
    // second layer of staleness, so it is off.
    let client = Client::from_config_with_timeouts(&cluster, key.clone(), cfg.timeouts)
        .map_err(|e| e.to_string())?
        .with_cache(MOUNT_CACHE);
    let mountpoint = absolute(&cfg.mountpoint)
        .map_err(|e| format!("mount point {}: {e}", cfg.mountpoint.display()))?;
    if is_madfs_mount(&mountpoint) {
        return Err(format!("{} is already a MadFS mount", mountpoint.display()));
    }
    if !mountpoint.is_dir() {
        return Err(format!("{} is not a directory", mountpoint.display()));
    }

    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("madfs-fuse")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;

    // Signals are taken over before mounting, so a SIGTERM right after the
    // mount still unmounts cleanly instead of killing the daemon.
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _in_runtime = rt.enter();
        (
            signal(SignalKind::terminate()).map_err(|e| e.to_string())?,
            signal(SignalKind::interrupt()).map_err(|e| e.to_string())?,
        )
    };

    // Fail now, with a message, rather than mount a file system whose every
    // operation fails.
    rt.block_on(client.getattr(InodeId::ROOT)).map_err(|e| {
        format!(
            "cannot reach the cluster of {}: {e}",
            cluster_path.display()
        )
    })?;

    let mut options = vec![
        MountOption::FSName(FS_NAME.into()),
        MountOption::Subtype(FS_NAME.into()),
        // The kernel checks mode bits against its cached attributes before
        // asking us; the servers check again with the caller's credentials.
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    let mut config = Config::default();
    if cfg.allow_other {
        config.acl = SessionACL::All;
        // fusermount3 unmounts by itself if this process dies (kill -9):
        // no mount left answering ENOTCONN. It needs allow_other.
        options.push(MountOption::AutoUnmount);
    }
    config.mount_options = options;
    config.n_threads = Some(READER_THREADS);

    let fs = MadFs::new(client, rt.handle().clone(), Some((cluster.clone(), key)));
    let notifier_slot = fs.notifier_slot();
    let stats = stats_wanted().then(|| fs.stats_handle());
    if let Some(stats) = &stats {
        report_on_sigusr1(&rt, stats.clone())?;
    }
    let session = Session::new(fs, &mountpoint, &config).map_err(|e| {
        let hint = if cfg.allow_other {
            ""
        } else {
            " (as a non-root user this needs fusermount3 from the fuse3 package and access to /dev/fuse)"
        };
        format!("cannot mount on {}: {e}{hint}", mountpoint.display())
    })?;
    let _ = notifier_slot.set(session.notifier());
    tune_readahead(&mountpoint);
    eprintln!(
        "madfs: {} mounted on {} ({} servers)",
        cluster_path.display(),
        mountpoint.display(),
        cluster.server_count()
    );

    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let serving = std::thread::Builder::new()
        .name("madfs-fuse-session".into())
        .spawn(move || {
            let r = session.run();
            let _ = done_tx.send(());
            r
        })
        .map_err(|e| e.to_string())?;

    rt.block_on(async {
        tokio::select! {
            _ = &mut done_rx => return Ok::<(), String>(()),
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!(
            "madfs: signal received, unmounting {}",
            mountpoint.display()
        );
        // A plain unmount fails while files are open; then detach it: those
        // files keep working until closed, and the session ends after.
        // (Not fuser's unmounter: with auto_unmount it only hands the job to
        // fusermount3, which unmounts a file system only once it is dead.)
        if let Err(e) = unmount(&mountpoint, false) {
            eprintln!("madfs: {e}; detaching instead");
            if let Err(e) = unmount(&mountpoint, true) {
                eprintln!("madfs: {e}");
            }
        }
        tokio::select! {
            _ = &mut done_rx => {}
            _ = term.recv() => std::process::exit(1),
            _ = int.recv() => std::process::exit(1),
        }
        Ok(())
    })?;
    let result = serving
        .join()
        .map_err(|_| "the FUSE session thread panicked".to_string())?;
    rt.shutdown_timeout(Duration::from_secs(5));
    reap_fusermount();
    if let Some(stats) = &stats {
        eprintln!("{}", stats.report());
    }
    match result {
        Ok(()) => {
            eprintln!("madfs: {} unmounted", mountpoint.display());
            Ok(())
        }
        Err(e) => Err(format!("FUSE session ended: {e}")),
    }
}

/// `MADFS_STATS` set and not "0" (as for `madfs run --stats`).
fn stats_wanted() -> bool {
    std::env::var_os("MADFS_STATS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Print the request counts since the last print at every SIGUSR1.
fn report_on_sigusr1(rt: &tokio::runtime::Runtime, stats: StatsHandle) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let _in_runtime = rt.enter();
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(|e| e.to_string())?;
    rt.spawn(async move {
        while usr1.recv().await.is_some() {
            eprintln!("{}", stats.report());
        }
    });
    Ok(())
}

/// Collect the fusermount3 helper that auto_unmount leaves running as our
/// child (fuser never waits for it): it exits once the session's socket
/// closes, and unreaped it would stay a zombie after us wherever pid 1 does
/// not reap (containers). Only children named fusermount3 are waited for,
/// for at most two seconds.
fn reap_fusermount() {
    let me = std::process::id().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let helpers: Vec<i32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "pid (comm) state ppid ...": comm may hold spaces, so split
            // after the closing parenthesis.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            head.ends_with("(fusermount3") && rest.split_whitespace().nth(1) == Some(me.as_str())
        })
        .collect();
    for pid in helpers {
        loop {
            let mut status = 0;
            // SAFETY: waiting for our own child, without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r != 0 || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Raise the mount's readahead through sysfs (writable by root only; for
/// other users the kernel's 128 KiB stays, which is correct, only slower).
fn tune_readahead(mountpoint: &Path) {
    let Some(m) = mount_at(mountpoint) else {
        return;
    };
    let knob = format!("/sys/class/bdi/{}/read_ahead_kb", m.dev);
    if let Err(e) = std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
        tracing::info!("madfs: readahead stays at the kernel's default ({knob}: {e})");
    }
}
