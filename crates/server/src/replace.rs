//! Taking over a lost server's id (`madfs server --replace`): a new
//! process, usually on another host, with an empty data directory, becomes
//! server N of a cluster that keeps replicas, and is rebuilt from the
//! surviving copies.
//!
//! The steps, and what a crash at each leaves (docs/ARCHITECTURE.md,
//! "Replacing a lost server"):
//! 1. Refuse a data directory that holds anything: a replacement starts
//!    empty, so it can never serve stale data as if it were current.
//! 2. Mark the home set as moved before listening: this process never
//!    serves set N from its own (empty) store, only from a rebuilt copy
//!    after a failover back.
//! 3. Listen, but answer no lease ping, and wait until the map counts
//!    server N in no set (the detector failed the old server over and
//!    took it out, which it does only once its lease ran out). A live old
//!    server keeps its sets, so the wait times out and nothing changed.
//! 4. Propose `MoveServer` (compare-and-set on the epoch, refused while
//!    N is in a set) when the address differs: from then on every server
//!    and client that learns the map connects to the new address.
//! 5. A voter's replacement joins the membership group as a new node
//!    (a new incarnation of its id) in place of the old one, through
//!    openraft's membership change (crates/membership, join.rs).
//! 6. Answer pings, and follow the map like any server: missing from the
//!    sets the cluster file puts it in, it asks to catch up on each, and
//!    each primary wipes and loads its copy, then counts it in sync.
//!
//! A crash before 4 leaves the map as it was; after 4 the id points at
//! the new address, and a restart of the replacement (without --replace,
//! from its now non-empty directory) goes on from step 5.

use crate::members::Members;
use crate::ServerError;
use madfs_membership::Change;
use madfs_proto::auth::{ClusterKey, Role};
use madfs_proto::message::Op;
use madfs_proto::Request;
use madfs_rpc::pool::Timeouts;
use madfs_rpc::{ClusterConfig, Pool, RpcError};
use madfs_types::{Credentials, ServerId};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// How long a replacement waits for the cluster to give the old server up.
const TAKE_OVER_WAIT: Duration = Duration::from_secs(60);
/// Pause between two readings of the map while waiting.
const TAKE_OVER_POLL: Duration = Duration::from_millis(200);

/// Step 1: the data directory must be empty or absent.
pub fn check_empty(dir: &Path) -> Result<(), ServerError> {
    match holds_nothing(dir) {
        Err(e) => Err(ServerError::Storage(format!("{}: {e}", dir.display()))),
        Ok(true) => Ok(()),
        Ok(false) => Err(ServerError::Config(format!(
            "--replace starts from an empty data directory, and {} holds files \
             (move them away, or restart the server there without --replace)",
            dir.display()
        ))),
    }
}

/// Whether `dir` is absent or holds nothing; false where it cannot be
/// read (opening the store then says why).
pub fn is_empty(dir: &Path) -> bool {
    matches!(holds_nothing(dir), Ok(true))
}

fn holds_nothing(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
        Ok(mut entries) => Ok(entries.next().is_none()),
    }
}

/// How long the probe of `copy_elsewhere` waits for one replica.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// For a server starting on an empty data directory in a cluster with
/// replicas: a server of its replica set that refuses an empty record
/// stream for its set, because it holds a copy with records of an earlier
/// stream (or serves the set now). The set then has data this empty
/// store lacks (its disk was lost and it came back before the cluster
/// failed it over): the server must start as a replacement, never serve
/// the empty store. None when every replica that answers has an empty
/// copy (a new cluster) or none answers.
pub async fn copy_elsewhere(
    cfg: &ClusterConfig,
    id: ServerId,
    key: ClusterKey,
) -> Option<ServerId> {
    let pool = Pool::new(
        cfg,
        key,
        Role::Peer,
        Timeouts {
            connect: PROBE_WAIT,
            call: PROBE_WAIT,
        },
    );
    let probe = Request {
        creds: Credentials::root(),
        op: Op::ReplicaApply {
            set: id,
            stream: crate::replication::random_stream_id(),
            first_seq: 1,
            heads: Vec::new(),
        },
        once: None,
    };
    for &r in &cfg.replica_set(id)[1..] {
        let answer = tokio::time::timeout(PROBE_WAIT, pool.call_once(r, &probe, &[])).await;
        if let Ok(Err(RpcError::Remote(w))) = answer {
            tracing::warn!(
                "server {id}: server {r} holds set {id}'s data ({}), and this data directory \
                 is empty",
                w.message
            );
            return Some(r);
        }
    }
    None
}

/// Steps 3 and 4: wait until the map has given up the server this process
/// replaces, then move its id to `address` (`listed`: where the cluster
/// file says it is).
pub async fn take_over(
    members: &Members,
    address: SocketAddr,
    listed: SocketAddr,
) -> Result<(), ServerError> {
    let me = members.me();
    let deadline = tokio::time::Instant::now() + TAKE_OVER_WAIT;
    loop {
        let last = match members.fresh_map().await {
            Ok(map) => {
                let holding: Vec<u16> = map
                    .sets
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.members.contains(&me) || s.syncing.contains(&me))
                    .map(|(set, _)| set as u16)
                    .collect();
                if holding.is_empty() {
                    let now = map.address_of(me).unwrap_or(listed);
                    if now == address
                        || members
                            .propose_latest(Change::MoveServer {
                                server: me,
                                address: address.to_string(),
                            })
                            .await
                    {
                        members.take_over_done().await?;
                        tracing::info!("server {me}: taken over at {address}; rebuilding");
                        return Ok(());
                    }
                    format!("the move of server {me} to {address} was not accepted")
                } else {
                    format!(
                        "the cluster still counts server {me} in sets {holding:?} \
                         (is the old server {me} still running?)"
                    )
                }
            }
            Err(e) => format!("no voter said the cluster map: {e}"),
        };
        if tokio::time::Instant::now() + TAKE_OVER_POLL > deadline {
            return Err(ServerError::Config(format!(
                "server {me} not taken over within {TAKE_OVER_WAIT:?}: {last}"
            )));
        }
        tokio::time::sleep(TAKE_OVER_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_or_absent_directory_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_empty(&dir.path().join("absent")).is_ok());
        assert!(check_empty(dir.path()).is_ok());
        std::fs::write(dir.path().join("CURRENT"), b"x").unwrap();
        let e = check_empty(dir.path()).unwrap_err().to_string();
        assert!(e.contains("empty data directory"), "{e}");
    }
}
