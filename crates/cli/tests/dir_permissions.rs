//! Guards the servers' cache of directory permissions (crates/server/src/
//! peers.rs): a server that creates an entry in a directory another server
//! owns checks the directory's permissions from its own copy, which the
//! owner invalidates at chmod. When those invalidations are lost (the test
//! fault `MADFS_FAULT_DROP_INVALIDATIONS=1` makes every server ignore them),
//! the copy's lease must still end the old permission within the lease on
//! every server. Before the lease, a server kept a copy until a restart and
//! allowed creates a chmod had forbidden forever.

mod common;

use common::{assert_err, Options, TestCluster};
use madfs_client::{Attr, Client, ErrorCode, FileName};
use madfs_types::{dentry_server, Credentials, ServerId};
use std::time::{Duration, Instant};

const SERVERS: usize = 3;
const LEASE: Duration = Duration::from_millis(1500);

fn user_of(root: &Client) -> Client {
    root.with_credentials(Credentials {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    })
}

/// A name not used before in `dir` whose entry lives on server `on`.
fn fresh_name(dir: &Attr, on: ServerId, next: &mut u64) -> FileName {
    loop {
        *next += 1;
        let n = FileName::new(format!("n{next}").as_bytes()).unwrap();
        if dentry_server(dir.ino, &n, SERVERS) == on {
            return n;
        }
    }
}

/// The servers that do not own `dir`'s inode: they check its permissions
/// from their cached copy.
fn others(dir: &Attr) -> Vec<ServerId> {
    (0..SERVERS as u16)
        .map(ServerId)
        .filter(|s| *s != dir.ino.owner())
        .collect()
}

/// Fill every other server's copy of `/d`'s permissions (mode 0777) with a
/// create by the user, then chmod it to 0555 as root.
async fn warm_then_revoke(root: &Client, user: &Client, next: &mut u64) -> (Attr, Instant) {
    let d = root.mkdir("/d", 0o777).await.unwrap();
    for s in others(&d) {
        let n = fresh_name(&d, s, next);
        user.mkdir_at(d.ino, &n, 0o755).await.unwrap();
    }
    root.set_permissions("/d", 0o555).await.unwrap();
    (d, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chmod_is_enforced_within_the_lease_when_invalidations_are_lost() {
    let lease_ms = LEASE.as_millis().to_string();
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            server_env: vec![
                ("MADFS_DIR_LEASE_MS".into(), lease_ms),
                ("MADFS_FAULT_DROP_INVALIDATIONS".into(), "1".into()),
            ],
            ..Options::default()
        },
    );
    let root = tc.client();
    let user = user_of(&root);
    let mut next = 0;
    let (d, revoked) = warm_then_revoke(&root, &user, &mut next).await;
    let mut allowed_after_chmod = 0;
    for s in others(&d) {
        loop {
            let n = fresh_name(&d, s, &mut next);
            match user.mkdir_at(d.ino, &n, 0o755).await {
                Ok(_) => {
                    allowed_after_chmod += 1;
                    assert!(
                        revoked.elapsed() < LEASE + Duration::from_secs(2),
                        "server {s} still allowed a create {:?} after the chmod \
                         (lease {LEASE:?})",
                        revoked.elapsed()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::AccessDenied, "{e}");
                    break;
                }
            }
        }
    }
    // The fault really dropped the invalidation: the copy answered until
    // its lease ran out (else this test would not test the lease).
    assert!(
        allowed_after_chmod > 0,
        "no server used its stale copy: was the invalidation really lost?"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chmod_is_enforced_at_once_when_invalidations_arrive() {
    let tc = TestCluster::start_with(
        SERVERS,
        Options {
            // A lease far longer than the test: only the invalidation can
            // make the servers see the chmod in time.
            server_env: vec![("MADFS_DIR_LEASE_MS".into(), "600000".into())],
            ..Options::default()
        },
    );
    let root = tc.client();
    let user = user_of(&root);
    let mut next = 0;
    let (d, _) = warm_then_revoke(&root, &user, &mut next).await;
    for s in others(&d) {
        let n = fresh_name(&d, s, &mut next);
        assert_err(
            user.mkdir_at(d.ino, &n, 0o755).await,
            ErrorCode::AccessDenied,
            libc::EACCES,
        );
    }
}
