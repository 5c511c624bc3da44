//! The MadFS server: one process owning a shard of the metadata (RocksDB)
//! and a share of the file data (chunk files on its local disk), serving
//! clients and peer servers over the `rpc` transport.

pub mod chunk_cache;
pub mod chunks;
pub mod counter;
mod dentry_index;
mod dir_moves;
mod dispatch;
mod errors;
pub mod failover;
mod find;
mod find_copy;
pub mod injected;
pub mod inode;
mod inode_index;
pub mod keys;
mod link_drops;
pub mod locks;
mod members;
mod memory;
pub mod metrics;
mod once;
mod ops;
mod peers;
pub mod perm;
mod rename;
mod replace;
pub mod replica;
pub mod replication;
mod restart;
mod seals;
mod service;
mod space;
mod step_down;
pub mod sync;
#[cfg(test)]
mod test_kv;
mod touch;
mod touch_send;
mod write_order;
mod writeback;

pub use service::{run_disk_io_inline, Server};

use madfs_rpc::ClusterConfig;
use madfs_types::ServerId;
use std::fmt;
use std::sync::Arc;

#[derive(Debug)]
pub enum ServerError {
    Config(String),
    Storage(String),
    Bind(String),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Config(m) => write!(f, "configuration: {m}"),
            ServerError::Storage(m) => write!(f, "storage: {m}"),
            ServerError::Bind(m) => write!(f, "listening: {m}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// Default memory budget of the in-memory copies find reads (dentries and
/// inode attributes): about 8 million files with names of up to 22 bytes
/// (some 130 bytes each).
pub const FIND_INDEX_DEFAULT_BYTES: usize = 1 << 30;

/// A test knob: a duration in milliseconds from the environment variable
/// `name` (none if unset or not a number). Real servers run without them.
pub(crate) fn test_knob_ms(name: &str) -> Option<std::time::Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
}

/// A test fault: whether the environment variable `name` is `1`. Real
/// servers run without them.
pub(crate) fn test_fault(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// Share of this machine's memory that the chunk caches of the servers on
/// it take by default, in all (see `cache_default_bytes`).
const CACHE_HOST_SHARE_DIVISOR: u64 = 4;

/// Default chunk cache of one of `servers_on_host` servers on this machine:
/// together they take a quarter of its memory (docs/ARCHITECTURE.md, "Reads
/// of what was just written"). 0 where the memory size is unknown.
pub fn cache_default_bytes(servers_on_host: usize) -> usize {
    // SAFETY: sysconf only reads system parameters.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 0;
    }
    let total = (pages as u64).saturating_mul(page as u64);
    let share = total / CACHE_HOST_SHARE_DIVISOR / servers_on_host.max(1) as u64;
    usize::try_from(share).unwrap_or(usize::MAX)
}

/// How one server process runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Runtime workers serving requests (None: one per core); disk I/O runs
    /// on the blocking pool.
    pub threads: Option<usize>,
    /// Memory budget of find's in-memory copies (0: none; find then reads
    /// RocksDB).
    pub find_index_bytes: usize,
    /// Large aligned chunk writes and reads bypass the page cache (see
    /// chunks.rs).
    pub direct_io: bool,
    /// Memory for recently written and read chunk extents (chunk_cache.rs;
    /// 0: none).
    pub cache_bytes: usize,
    /// Where to serve Prometheus metrics (`GET /metrics`); None: the
    /// cluster file's `metrics` of this server, if any.
    pub metrics: Option<std::net::SocketAddr>,
    /// Listen on every interface at the cluster file's port, not only on
    /// the cluster file's address.
    pub listen_all: bool,
    /// Serve from this directory instead of the cluster file's data_dir
    /// (a replica's copy of this server's set, after its disk is lost).
    pub data_dir: Option<std::path::PathBuf>,
    /// The servers this one ships its records to; None: the rest of its
    /// replica set in the cluster file (a set served after a failover
    /// passes the members the cluster map has left).
    pub replicas: Option<Vec<ServerId>>,
    /// Take over this id from a lost server (replace.rs): start empty,
    /// wait until the cluster gave the old one up, move the id to
    /// `address`, and be rebuilt from the other replicas.
    pub replace: bool,
    /// Listen at this address instead of the cluster file's (and, with
    /// `replace`, move the id there).
    pub address: Option<std::net::SocketAddr>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: None,
            find_index_bytes: FIND_INDEX_DEFAULT_BYTES,
            direct_io: true,
            cache_bytes: 0,
            metrics: None,
            listen_all: false,
            data_dir: None,
            replicas: None,
            replace: false,
            address: None,
        }
    }
}

/// Run server `id` of the cluster until SIGTERM or SIGINT, then make every
/// acknowledged write durable and return.
pub fn run(cfg: ClusterConfig, id: ServerId, opts: RunOptions) -> Result<(), ServerError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = opts.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = builder
        .enable_all()
        .thread_name("madfs-server")
        .build()
        .map_err(|e| ServerError::Config(format!("starting the runtime: {e}")))?;
    let result = rt.block_on(async move {
        let entry = cfg
            .server(id)
            .ok_or_else(|| ServerError::Config(format!("no server {id} in the cluster file")))?
            .clone();
        let key = cfg
            .load_key()
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| entry.data_dir.clone());
        // An empty data directory where a replica holds the set's data: the
        // disk was lost, and the server came back before the cluster
        // failed it over. It must not serve the empty store as its set.
        let mut opts = opts;
        if cfg.replicas > 1 && !opts.replace && replace::is_empty(&data_dir) {
            if let Some(holder) = replace::copy_elsewhere(&cfg, id, key.clone()).await {
                tracing::warn!(
                    "server {id}: starting as a replacement (as --replace): server {holder} \
                     holds its set's data and this data directory is empty"
                );
                opts.replace = true;
            }
        }
        if opts.replace {
            if cfg.replicas < 2 {
                return Err(ServerError::Config(
                    "--replace needs a cluster that keeps replicas (--replicas 2 or 3):                      without them a lost server's data exist nowhere else"
                        .into(),
                ));
            }
            replace::check_empty(&data_dir)?;
        }
        let server = Arc::new(Server::open(&cfg, id, key.clone(), &opts)?);
        let address = opts.address.unwrap_or(entry.address);
        let bind = if opts.listen_all {
            let any: std::net::IpAddr = if address.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            std::net::SocketAddr::new(any, address.port())
        } else {
            address
        };
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| ServerError::Bind(format!("{bind}: {e}")))?;
        tracing::info!(
            "server {id} listening on {}",
            listener.local_addr().unwrap_or(address)
        );
        if let Some(d) = madfs_rpc::serve::net_delay() {
            tracing::warn!(
                "MADFS_NET_DELAY_US (a test seam) is set: every request and response waits {d:?}"
            );
        }
        let metrics = Arc::new(metrics::Metrics::new(server.sync.stats()));
        // Moved (`--address`, a replacement on another host): the cluster
        // file's metrics port, on the new address.
        let listed_metrics = match (opts.address, entry.metrics) {
            (Some(a), Some(m)) => Some(std::net::SocketAddr::new(a.ip(), m.port())),
            (_, m) => m,
        };
        let metrics_http = match opts.metrics.or(listed_metrics) {
            None => None,
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| ServerError::Bind(format!("metrics on {addr}: {e}")))?;
                let at = l.local_addr().unwrap_or(addr);
                tracing::info!("server {id} serves metrics on http://{at}/metrics");
                Some(tokio::spawn(metrics::serve_http(
                    l,
                    server.clone(),
                    metrics.clone(),
                )))
            }
        };
        // The router starts the server's background work (not while its
        // set is held after a power loss).
        let router = Arc::new(failover::Router::new(
            server.clone(),
            cfg.clone(),
            key.clone(),
            opts.clone(),
            metrics,
        ));
        if opts.replace {
            // Never serve the home set from this empty store (replace.rs).
            router.depose(id);
        }
        let serving = tokio::spawn(madfs_rpc::serve::serve(
            listener,
            id,
            key.clone(),
            router.clone(),
        ));
        // With replicas, the membership group decides who serves what; the
        // listener is up first, since the voters must reach each other.
        let group = if cfg.replicas > 1 {
            let g =
                members::Members::start(&cfg, id, key.clone(), &data_dir, opts.replace).await?;
            router.join(g.clone());
            if opts.replace {
                replace::take_over(&g, address, entry.address).await?;
            }
            g.follow(router.clone());
            step_down::watch(g.clone(), router.clone());
            Some(g)
        } else {
            None
        };
        wait_for_shutdown().await;
        // The listener stays up until the end: the other servers may be
        // stopping too (`madfs down`), and the last records of the sets
        // whose copies live here, and this server's own to its copies
        // elsewhere, must still get through (restart.rs).
        router.stop_serving_clients();
        let stop_began = std::time::Instant::now();
        if let Some(h) = metrics_http {
            h.abort();
        }
        let mut servers = router.servers();
        if !servers.iter().any(|s| Arc::ptr_eq(s, &server)) {
            servers.push(server.clone());
        }
        for s in &servers {
            s.shutdown().await;
        }
        // The primaries whose copies live here stop now too (`madfs down`
        // stops every server at once): their last records, the final sync
        // among them, still come over the connections open to this
        // process. Without them a copy is refused when its primary
        // continues its stream at the next start, and is loaded again.
        if cfg.replicas > 1 {
            let deadline = stop_began + STOP_COPIES_WAIT_MAX;
            let quiet = || {
                let since_stop = stop_began.elapsed();
                server
                    .copies
                    .quiet_for()
                    .map_or(since_stop, |q| q.min(since_stop))
            };
            while quiet() < STOP_COPIES_QUIET && std::time::Instant::now() < deadline {
                tokio::time::sleep(STOP_COPIES_QUIET / 4).await;
            }
        }
        serving.abort();
        if let Some(g) = group {
            g.shutdown().await;
        }
        // The sets served here at the end (not the home set if it moved
        // away: its store is stale).
        let served = router.served();
        Ok(servers
            .into_iter()
            .filter(|s| served.contains(&s.id))
            .collect::<Vec<_>>())
    });
    // Drop every task now, on this thread, not during process exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    // No task can add a record any more: mark the streams that may be
    // continued (restart.rs), then drop the stores.
    let servers = result?;
    for s in &servers {
        if restart::note_clean_stop(s) {
            tracing::info!(
                "set {}: its record stream continues at the next start",
                s.id
            );
        }
    }
    drop(servers);
    tracing::info!("server {id} stopped");
    Ok(())
}

/// A stopping server waits until no record came for its copies for this
/// long, counted from the stop (their primaries stopping too)...
const STOP_COPIES_QUIET: std::time::Duration = std::time::Duration::from_millis(300);
/// ...but no longer than this.
const STOP_COPIES_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

async fn wait_for_shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
