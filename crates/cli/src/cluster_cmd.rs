//! `madfs server`, `up`, `down` and `status`: running servers and the
//! one-command local cluster. A cluster across hosts (`up --hosts`,
//! `--slurm`) is started and stopped by `hosts.rs`; `status` here shows
//! both, grouped by host.

use madfs_rpc::cluster::{generate_key, write_key_file};
use madfs_rpc::{ClusterConfig, ServerEntry};
use madfs_types::ServerId;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const CLUSTER_FILE: &str = "cluster.toml";
const KEY_FILE: &str = "cluster.key";
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// `madfs server`'s options, as given on its command line.
pub struct ServerArgs {
    pub id: u16,
    pub threads: Option<usize>,
    pub find_index_mib: usize,
    pub direct_io: bool,
    pub cache_mib: Option<usize>,
    pub metrics: Option<std::net::SocketAddr>,
    pub listen_all: bool,
    pub data_dir: Option<PathBuf>,
    pub replace: bool,
    pub address: Option<std::net::SocketAddr>,
}

pub fn server(cluster: Option<&Path>, a: ServerArgs) -> Result<ExitCode, String> {
    let ServerArgs {
        id,
        threads,
        find_index_mib,
        direct_io,
        cache_mib,
        metrics,
        listen_all,
        data_dir,
        replace,
        address,
    } = a;
    let path = ClusterConfig::locate(cluster);
    let cfg = ClusterConfig::load(&path).map_err(|e| e.to_string())?;
    if threads == Some(0) {
        return Err("--threads must be at least 1".into());
    }
    let find_index_bytes = find_index_mib
        .checked_mul(1 << 20)
        .ok_or("--find-index-mib is too large")?;
    let cache_bytes = match cache_mib {
        Some(m) => m.checked_mul(1 << 20).ok_or("--cache-mib is too large")?,
        None => madfs_server::cache_default_bytes(1),
    };
    let opts = madfs_server::RunOptions {
        threads,
        find_index_bytes,
        direct_io,
        cache_bytes,
        metrics,
        listen_all,
        data_dir,
        replicas: None,
        replace,
        address,
    };
    madfs_server::run(cfg, ServerId(id), opts).map_err(|e| format!("server {id}: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir().map_err(|e| e.to_string())?.join(p))
    }
}

fn pid_file(data: &Path, id: u16) -> PathBuf {
    data.join(format!("server-{id}.pid"))
}

fn log_file(data: &Path, id: u16) -> PathBuf {
    data.join(format!("server-{id}.log"))
}

/// A running madfs process with this pid? (Guards against recycled pids.)
fn madfs_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmd) => {
            let text = String::from_utf8_lossy(&cmd);
            text.contains("madfs") && text.contains("server")
        }
        Err(_) => false,
    }
}

fn read_pid(data: &Path, id: u16) -> Option<i32> {
    std::fs::read_to_string(pid_file(data, id))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A port free now, and its listener: kept until every port of the
/// cluster is picked, or the kernel may hand the same port out twice (it
/// did: `address ... is used twice`).
fn free_port(held: &mut Vec<std::net::TcpListener>) -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("finding a free port: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    held.push(l);
    Ok(port)
}

pub fn up(
    servers: u16,
    data: &Path,
    chunk_size: u64,
    base_port: Option<u16>,
    cache_mib: Option<usize>,
    replicas: u8,
) -> Result<ExitCode, String> {
    let data = absolute(data)?;
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    let cfg_path = data.join(CLUSTER_FILE);
    let cfg = if cfg_path.exists() {
        // Restart an existing cluster with its data, ports and key.
        ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?
    } else {
        if servers == 0 || servers as usize > madfs_types::limits::SERVERS_MAX {
            return Err(format!(
                "--servers must be between 1 and {}",
                madfs_types::limits::SERVERS_MAX
            ));
        }
        let mut entries = Vec::new();
        let mut held = Vec::new();
        for id in 0..servers {
            // Servers on base, base+1, ...; their metrics after the last.
            let (port, metrics_port) = match base_port {
                Some(b) => (
                    b.checked_add(id).ok_or("--base-port too high")?,
                    b.checked_add(servers)
                        .and_then(|m| m.checked_add(id))
                        .ok_or("--base-port too high")?,
                ),
                None => (free_port(&mut held)?, free_port(&mut held)?),
            };
            entries.push(ServerEntry {
                id,
                address: format!("127.0.0.1:{port}").parse().expect("valid address"),
                data_dir: data.join(format!("server-{id}")),
                metrics: Some(
                    format!("127.0.0.1:{metrics_port}")
                        .parse()
                        .expect("valid address"),
                ),
                host: None,
            });
        }
        let cfg = ClusterConfig {
            cluster_id: format!("madfs-local-{}", std::process::id()),
            chunk_size,
            key_file: PathBuf::from(KEY_FILE),
            replicas,
            voters: madfs_rpc::cluster::voters_for(entries.len()),
            servers: entries,
        };
        drop(held);
        cfg.validate().map_err(|e| e.to_string())?;
        write_key_file(&data.join(KEY_FILE), &generate_key())
            .map_err(|e| format!("writing the key: {e}"))?;
        std::fs::write(&cfg_path, cfg.to_toml())
            .map_err(|e| format!("writing {}: {e}", cfg_path.display()))?;
        ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // Every server of a local cluster shares this host's cores: more
    // runtime threads than cores only adds cross-core wakeups, which cost
    // tens of microseconds each on a virtual machine.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / cfg.servers.len().max(1)).max(1);
    // Their chunk caches share this host's memory too.
    let cache_mib = cache_mib.unwrap_or(madfs_server::cache_default_bytes(cfg.servers.len()) >> 20);
    let mut started = Vec::new();
    for s in &cfg.servers {
        if read_pid(&data, s.id).is_some_and(madfs_alive) {
            continue;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_file(&data, s.id))
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&exe);
        cmd.arg("server")
            .arg("--cluster")
            .arg(&cfg_path)
            .arg("--id")
            .arg(s.id.to_string())
            .arg("--threads")
            .arg(threads.to_string())
            .arg("--cache-mib")
            .arg(cache_mib.to_string());
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        // Own process group: a Ctrl-C in this terminal must not kill the cluster.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting server {}: {e}", s.id))?;
        std::fs::write(pid_file(&data, s.id), child.id().to_string()).map_err(|e| e.to_string())?;
        started.push((s.id, child));
    }
    // Wait until every server answers a request.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = madfs_client::Client::connect(Some(&cfg_path)).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let stats = rt.block_on(client.server_stats());
        let down: Vec<ServerId> = stats
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(id, _)| *id)
            .collect();
        if down.is_empty() {
            break;
        }
        for (id, child) in started.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "server {id} exited ({status}) during start-up; its log says:\n{}",
                    tail(&log_file(&data, *id))
                ));
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "servers {down:?} did not answer within {START_TIMEOUT:?}; see their logs in {}",
                data.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "MadFS cluster up: {} servers, data in {}",
        cfg.server_count(),
        data.display()
    );
    println!();
    println!("  export MADFS_CLUSTER={}", cfg_path.display());
    println!("  madfs status                   # servers, inodes, bytes");
    println!("  madfs put ./file /file         # copy in;  madfs get /file ./copy to copy out");
    println!("  madfs ls -l /                  # also: stat, cat, mkdir, rm, mv, ln");
    println!("  madfs down --data {}   # stop it", data.display());
    Ok(ExitCode::SUCCESS)
}

fn tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

pub fn down(data: &Path, wipe: bool) -> Result<ExitCode, String> {
    let data = absolute(data)?;
    let cfg_path = data.join(CLUSTER_FILE);
    let cfg = ClusterConfig::load(&cfg_path)
        .map_err(|e| format!("no local cluster in {}: {e}", data.display()))?;
    let mut pids = Vec::new();
    for s in &cfg.servers {
        if let Some(pid) = read_pid(&data, s.id) {
            if madfs_alive(pid) {
                // SAFETY: sending SIGTERM to a process we started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                pids.push((s.id, pid));
            }
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for (id, pid) in &pids {
        while madfs_alive(*pid) && Instant::now() < deadline {
            reap(*pid);
            std::thread::sleep(Duration::from_millis(50));
        }
        if madfs_alive(*pid) {
            eprintln!("server {id} (pid {pid}) did not stop in {STOP_TIMEOUT:?}; killing it");
            // SAFETY: as above.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
    for s in &cfg.servers {
        let _ = std::fs::remove_file(pid_file(&data, s.id));
        if wipe {
            let _ = std::fs::remove_dir_all(&s.data_dir);
            let _ = std::fs::remove_file(log_file(&data, s.id));
        }
    }
    if wipe {
        let _ = std::fs::remove_file(&cfg_path);
        let _ = std::fs::remove_file(&cfg.key_file);
        // Only if nothing else is left in it.
        let _ = std::fs::remove_dir(&data);
        println!(
            "MadFS cluster down: stopped {} servers, removed their data from {}",
            pids.len(),
            data.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "MadFS cluster down: stopped {} servers (data kept in {})",
        pids.len(),
        data.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Collect the exit status if the server is our child (it is not when
/// `up` ran in another process); a zombie would look alive.
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: WNOHANG never blocks; ECHILD for non-children is fine.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

pub fn status(cluster: Option<&Path>) -> Result<ExitCode, String> {
    let path = ClusterConfig::locate(cluster);
    let cfg = ClusterConfig::load(&path).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = madfs_client::Client::connect(Some(&path)).map_err(|e| e.to_string())?;
    let stats = rt.block_on(client.server_stats());
    // With replicas, which server serves each set after failovers.
    let routes = if cfg.replicas > 1 {
        rt.block_on(client.cluster_routes()).ok()
    } else {
        None
    };
    let moved_to: std::collections::HashMap<u16, std::net::SocketAddr> = routes
        .iter()
        .flat_map(|r| r.addresses.iter().map(|&(id, a)| (id.0, a)))
        .collect();
    let in_sync: Vec<u8> = routes
        .as_ref()
        .map(|r| r.in_sync.clone())
        .unwrap_or_default();
    let mut voters: Vec<u16> = routes
        .as_ref()
        .map(|r| r.voters.iter().map(|v| v.0).collect())
        .unwrap_or_default();
    voters.sort_unstable();
    let voters: Vec<String> = voters.iter().map(|v| v.to_string()).collect();
    let lost: std::collections::HashMap<u16, std::time::Duration> = routes
        .iter()
        .flat_map(|r| r.lost.iter().map(|&(set, d)| (set.0, d)))
        .collect();
    let routes = routes.map(|r| r.serving);
    if cfg.replicas > 1 {
        println!(
            "{} copies of every record and chunk{}",
            cfg.replicas,
            match &routes {
                Some(_) => String::new(),
                None => " (no server said which serves what)".into(),
            }
        );
        if !voters.is_empty() {
            // Who decides failovers: losing a majority of these stops them.
            println!("membership voters: servers {}", voters.join(", "));
        }
    }
    let moved = |id: u16| -> String {
        let mut note = match routes.as_ref().and_then(|r| r.get(id as usize)) {
            Some(to) if to.0 != id => format!("  (served by server {to} since a failover)"),
            _ => String::new(),
        };
        // A set short of copies: one more loss of it loses data.
        if let Some(&n) = in_sync.get(id as usize) {
            if n < cfg.replicas {
                note.push_str(&format!("  ({n} of {} copies in sync)", cfg.replicas));
            }
        }
        // Every copy gone: its files fail with EIO until one comes back.
        if let Some(d) = lost.get(&id) {
            note.push_str(&format!(
                "  (set {id}: no copy has answered for {} s)",
                d.as_secs()
            ));
        }
        note
    };
    let multihost = cfg.servers.iter().any(|s| s.host.is_some());
    // Operations per second and p99 latency over one second, from the
    // servers' metrics, where the cluster file says where they are.
    let metrics: Vec<_> = crate::metrics_cmd::addresses(&cfg)
        .into_iter()
        .filter_map(|(id, a)| a.map(|a| (id.0, a)))
        .collect();
    let addrs: Vec<_> = metrics.iter().map(|&(_, a)| a).collect();
    let mut load: std::collections::BTreeMap<u16, String> = metrics
        .iter()
        .map(|&(id, _)| id)
        .zip(crate::metrics_cmd::summaries(
            &addrs,
            crate::metrics_cmd::DEFAULT_INTERVAL,
        ))
        .map(|(id, r)| (id, r.map(|s| s.short()).unwrap_or_else(|_| "-".into())))
        .collect();
    let mut stats: std::collections::BTreeMap<u16, _> =
        stats.into_iter().map(|(id, r)| (id.0, r)).collect();
    let mut all_up = true;
    for (host, servers) in crate::hosts::hosts_of(&cfg) {
        if multihost {
            let up = servers
                .iter()
                .filter(|s| matches!(stats.get(&s.id), Some(Ok(_))))
                .count();
            println!("HOST {host}: {up}/{} servers answer", servers.len());
        }
        println!(
            "{:<4} {:<22} {:<6} {:>10} {:>14} {:>14}{}",
            "ID",
            "ADDRESS",
            "STATE",
            "INODES",
            "DATA BYTES",
            "DISK FREE",
            if metrics.is_empty() {
                ""
            } else {
                "  LOAD (last second)"
            }
        );
        for s in servers {
            let id = s.id;
            // A replacement on another host answers at its new address.
            let addr = moved_to.get(&id).copied().unwrap_or(s.address).to_string();
            match stats.remove(&id) {
                Some(Ok(s)) => {
                    // A failed server answers but refuses writes until restarted.
                    let (state, why) = match &s.failure {
                        None => ("up", String::new()),
                        Some(f) => {
                            all_up = false;
                            ("failed", format!("  ({f})"))
                        }
                    };
                    let load = load
                        .remove(&id)
                        .map(|l| format!("  {l}"))
                        .unwrap_or_default();
                    println!(
                        "{:<4} {:<22} {:<6} {:>10} {:>14} {:>14}{load}{why}{}",
                        id,
                        addr,
                        state,
                        s.inodes,
                        s.data_bytes,
                        s.bytes_avail,
                        moved(id)
                    );
                    for r in &s.rebuilds {
                        println!("     {}", describe_rebuild(id, r));
                    }
                }
                Some(Err(e)) => {
                    all_up = false;
                    println!(
                        "{:<4} {:<22} {:<6} {:>10} {:>14} {:>14}  ({e}){}",
                        id,
                        addr,
                        "down",
                        "-",
                        "-",
                        "-",
                        moved(id)
                    );
                }
                None => {
                    all_up = false;
                    println!("{id:<4} {addr:<22} no answer");
                }
            }
        }
        if multihost {
            println!();
        }
    }
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line on a copy of `set` being rebuilt on another server.
fn describe_rebuild(set: u16, r: &madfs_client::Rebuild) -> String {
    use crate::stage::progress::human_bytes;
    let percent = if r.bytes_total == 0 {
        100.0
    } else {
        100.0 * r.bytes_done as f64 / r.bytes_total as f64
    };
    let phase = match r.failure.is_empty() {
        true => r.phase.describe().to_string(),
        false => format!(
            "{} (the last attempt failed: {})",
            r.phase.describe(),
            r.failure
        ),
    };
    format!(
        "rebuilding set {set} on server {}: {phase}; {} metadata records ({} of them already there), {} of {} of chunk data ({percent:.0}%, {} of it already there)",
        r.replica,
        r.keys,
        r.keys_kept,
        human_bytes(r.bytes_done),
        human_bytes(r.bytes_total),
        human_bytes(r.bytes_kept),
    )
}
