//! The cluster file (TOML): cluster id, chunk size, and the servers with
//! their addresses and data directories. The key lives in its own file beside
//! it (mode 0600), so the cluster file can be shared and printed freely.

use crate::error::RpcError;
use madfs_proto::auth::ClusterKey;
use madfs_types::{limits, ServerId};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Environment variable naming the cluster file.
pub const CLUSTER_ENV: &str = "MADFS_CLUSTER";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster_id: String,
    pub chunk_size: u64,
    /// Key file; relative paths are relative to the cluster file.
    pub key_file: PathBuf,
    /// Copies of every record and chunk (1, 2 or 3): replica set s is kept
    /// by server s and the R-1 servers `replica_set` names after it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replicas: u8,
    /// Voters of the membership group (with replicas): 3 or 5, or every
    /// server of a smaller cluster. The group decides while a majority of
    /// them is up, so 5 ride out two losses. Fixed when the group first
    /// starts: a file without it (written before it existed) keeps 3.
    #[serde(default = "three", skip_serializing_if = "is_three")]
    pub voters: u8,
    #[serde(rename = "server")]
    pub servers: Vec<ServerEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    pub id: u16,
    pub address: SocketAddr,
    pub data_dir: PathBuf,
    /// Where the server serves Prometheus metrics over HTTP (`GET
    /// /metrics`), unless `madfs server --metrics` says otherwise; absent:
    /// nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<SocketAddr>,
    /// The host this server runs on, as `madfs up --hosts` named it (how
    /// the launcher reaches it); none for a local cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

fn one() -> u8 {
    1
}

fn is_one(n: &u8) -> bool {
    *n == 1
}

fn three() -> u8 {
    3
}

fn is_three(n: &u8) -> bool {
    *n == 3
}

/// Most copies a cluster may keep of each record and chunk.
pub const REPLICAS_MAX: u8 = 3;

/// The voters a new cluster of `servers` servers gets: 5 once it has 5
/// servers (a group that survives two lost servers, as 3 copies do), else
/// 3. A group of 3 stops at its second lost voter, even where every set
/// still has a live copy.
pub fn voters_for(servers: usize) -> u8 {
    if servers >= 5 {
        5
    } else {
        3
    }
}

impl ClusterConfig {
    /// The servers that keep replica set `set` (the share of the namespace
    /// and of the chunks that hashes to server `set`), in chain order: the
    /// server itself, then the next servers by id on hosts not yet in the
    /// set (the host is the failure domain), then, where hosts run out, the
    /// next servers on any host.
    pub fn replica_set(&self, set: ServerId) -> Vec<ServerId> {
        let n = self.servers.len();
        let want = (self.replicas.max(1) as usize).min(n);
        let mut chosen = vec![set];
        let host = |id: ServerId| self.servers[id.0 as usize].host.clone();
        let next = (1..n).map(|i| ServerId(((set.0 as usize + i) % n) as u16));
        for id in next.clone() {
            if chosen.len() == want {
                break;
            }
            let h = host(id);
            if h.is_none() || chosen.iter().all(|&c| host(c) != h) {
                chosen.push(id);
            }
        }
        for id in next {
            if chosen.len() == want {
                break;
            }
            if !chosen.contains(&id) {
                chosen.push(id);
            }
        }
        chosen
    }

    pub fn from_toml(text: &str) -> Result<ClusterConfig, RpcError> {
        let cfg: ClusterConfig =
            toml::from_str(text).map_err(|e| RpcError::Config(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Load and check a cluster file; a relative key path is made absolute.
    pub fn load(path: &Path) -> Result<ClusterConfig, RpcError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RpcError::Config(format!("cannot read {}: {e}", path.display())))?;
        let mut cfg = Self::from_toml(&text)
            .map_err(|e| RpcError::Config(format!("{}: {e}", path.display())))?;
        if cfg.key_file.is_relative() {
            let dir = path.parent().unwrap_or(Path::new("."));
            cfg.key_file = dir.join(&cfg.key_file);
        }
        Ok(cfg)
    }

    /// The cluster file named by `explicit`, else $MADFS_CLUSTER, else
    /// ./madfs-data/cluster.toml (where `madfs up` puts it).
    pub fn locate(explicit: Option<&Path>) -> PathBuf {
        if let Some(p) = explicit {
            return p.to_path_buf();
        }
        if let Some(p) = std::env::var_os(CLUSTER_ENV) {
            return PathBuf::from(p);
        }
        PathBuf::from("madfs-data/cluster.toml")
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("cluster config always serializes")
    }

    pub fn validate(&self) -> Result<(), RpcError> {
        let bad = |m: String| Err(RpcError::Config(m));
        if self.servers.is_empty() {
            return bad("no [[server]] entries".into());
        }
        if self.servers.len() > limits::SERVERS_MAX {
            return bad(format!(
                "{} servers, at most {}",
                self.servers.len(),
                limits::SERVERS_MAX
            ));
        }
        for (i, s) in self.servers.iter().enumerate() {
            if s.id as usize != i {
                return bad(format!(
                    "server ids must be 0,1,2,... in order; entry {i} has id {}",
                    s.id
                ));
            }
            if self.servers[..i].iter().any(|o| o.address == s.address) {
                return bad(format!("address {} is used twice", s.address));
            }
        }
        if !(1..=REPLICAS_MAX).contains(&self.replicas) {
            return bad(format!(
                "replicas {} must be 1 to {REPLICAS_MAX}",
                self.replicas
            ));
        }
        if self.replicas as usize > self.servers.len() {
            return bad(format!(
                "replicas {} needs at least as many servers ({} here)",
                self.replicas,
                self.servers.len()
            ));
        }
        if self.voters != 3 && self.voters != 5 {
            return bad(format!("voters {} must be 3 or 5", self.voters));
        }
        if !(limits::CHUNK_SIZE_MIN_BYTES..=limits::CHUNK_SIZE_MAX_BYTES).contains(&self.chunk_size)
            || !self.chunk_size.is_multiple_of(4096)
        {
            return bad(format!(
                "chunk_size {} must be a multiple of 4096 between {} and {}",
                self.chunk_size,
                limits::CHUNK_SIZE_MIN_BYTES,
                limits::CHUNK_SIZE_MAX_BYTES
            ));
        }
        Ok(())
    }

    pub fn server(&self, id: ServerId) -> Option<&ServerEntry> {
        self.servers.get(id.0 as usize)
    }

    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    pub fn load_key(&self) -> Result<ClusterKey, RpcError> {
        let text = std::fs::read_to_string(&self.key_file).map_err(|e| {
            RpcError::Config(format!(
                "cannot read key file {}: {e}",
                self.key_file.display()
            ))
        })?;
        ClusterKey::from_hex(&text).ok_or_else(|| {
            RpcError::Config(format!(
                "key file {} must hold 64 hex digits",
                self.key_file.display()
            ))
        })
    }
}

/// A fresh random cluster key.
pub fn generate_key() -> ClusterKey {
    let mut k = [0u8; 32];
    getrandom::getrandom(&mut k).expect("the OS random source is available");
    ClusterKey(k)
}

/// Write `key` to `path` readable by the owner only.
pub fn write_key_file(path: &Path, key: &ClusterKey) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{}", key.to_hex())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClusterConfig {
        ClusterConfig {
            cluster_id: "t".into(),
            chunk_size: 1 << 20,
            key_file: "cluster.key".into(),
            replicas: 1,
            voters: 3,
            servers: (0..3)
                .map(|i| ServerEntry {
                    id: i,
                    address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                    data_dir: format!("/tmp/s{i}").into(),
                    metrics: None,
                    host: (i > 0).then(|| format!("h{i}")),
                })
                .collect(),
        }
    }

    #[test]
    fn replica_sets_spread_over_hosts() {
        // 6 servers on 3 hosts, 2 each.
        let mut c = sample();
        c.servers = (0..6)
            .map(|i| ServerEntry {
                id: i,
                address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                data_dir: format!("/tmp/s{i}").into(),
                metrics: None,
                host: Some(format!("h{}", i / 2)),
            })
            .collect();
        assert_eq!(c.replica_set(ServerId(0)), vec![ServerId(0)]);
        c.replicas = 2;
        // Server 1 shares host h0 with server 0: skipped for server 2.
        assert_eq!(c.replica_set(ServerId(0)), vec![ServerId(0), ServerId(2)]);
        assert_eq!(c.replica_set(ServerId(5)), vec![ServerId(5), ServerId(0)]);
        c.replicas = 3;
        assert_eq!(
            c.replica_set(ServerId(1)),
            vec![ServerId(1), ServerId(2), ServerId(4)]
        );
        // More replicas than hosts: the rest on any host.
        c.servers.truncate(4);
        assert_eq!(
            c.replica_set(ServerId(0)),
            vec![ServerId(0), ServerId(2), ServerId(1)]
        );
        assert!(ClusterConfig::from_toml(&c.to_toml()).unwrap().replicas == 3);
        c.replicas = 4;
        assert!(c.validate().is_err());
        c.replicas = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn voters_default_to_three_and_only_three_or_five_are_taken() {
        let mut c = sample();
        // A file without the line (as before it existed) has 3.
        assert!(!c.to_toml().contains("voters"));
        assert_eq!(ClusterConfig::from_toml(&c.to_toml()).unwrap().voters, 3);
        c.voters = 5;
        let text = c.to_toml();
        assert!(text.contains("voters = 5"), "{text}");
        assert_eq!(ClusterConfig::from_toml(&text).unwrap(), c);
        for bad in [0, 1, 4, 7] {
            c.voters = bad;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("must be 3 or 5"), "{e}");
        }
        assert_eq!(voters_for(1), 3);
        assert_eq!(voters_for(4), 3);
        assert_eq!(voters_for(5), 5);
        assert_eq!(voters_for(64), 5);
    }

    #[test]
    fn toml_round_trips() {
        let c = sample();
        assert_eq!(ClusterConfig::from_toml(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn metrics_addresses_are_optional_and_round_trip() {
        let mut c = sample();
        assert!(!c.to_toml().contains("metrics"));
        c.servers[1].metrics = Some("127.0.0.1:9100".parse().unwrap());
        let text = c.to_toml();
        assert!(text.contains("metrics = \"127.0.0.1:9100\""), "{text}");
        assert_eq!(ClusterConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn bad_configs_are_refused_with_reasons() {
        let mut c = sample();
        c.servers[1].id = 5;
        assert!(c.validate().unwrap_err().to_string().contains("in order"));
        let mut c = sample();
        c.servers[2].address = c.servers[0].address;
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        let mut c = sample();
        c.chunk_size = 1000;
        assert!(c.validate().unwrap_err().to_string().contains("chunk_size"));
        let mut c = sample();
        c.servers.clear();
        assert!(c.validate().is_err());
        assert!(ClusterConfig::from_toml("cluster_id = 3").is_err());
        assert!(ClusterConfig::from_toml(&(sample().to_toml() + "\nbogus = 1\n")).is_err());
    }

    #[test]
    fn files_without_hosts_still_load() {
        let old = "cluster_id = \"t\"\nchunk_size = 1048576\nkey_file = \"k\"\n\
                   [[server]]\nid = 0\naddress = \"127.0.0.1:7000\"\ndata_dir = \"/d\"\n";
        let c = ClusterConfig::from_toml(old).unwrap();
        assert_eq!(c.servers[0].host, None);
        assert!(!c.to_toml().contains("host"));
    }

    #[test]
    fn key_file_round_trips_with_private_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cfg_path = dir.path().join("cluster.toml");
        std::fs::write(&cfg_path, sample().to_toml()).unwrap();
        let cfg = ClusterConfig::load(&cfg_path).unwrap();
        assert_eq!(cfg.key_file, dir.path().join("cluster.key"));
        assert!(cfg
            .load_key()
            .unwrap_err()
            .to_string()
            .contains("cannot read key file"));
        let key = generate_key();
        write_key_file(&cfg.key_file, &key).unwrap();
        assert_eq!(cfg.load_key().unwrap(), key);
        let mode = std::fs::metadata(&cfg.key_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
