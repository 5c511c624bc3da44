//! A primary whose disk failed hands its sets over (issue 16: a server
//! whose "data directory is made unusable" must not leave its sets
//! unwritable). A failed fsync poisons a store (sync.rs, chunks.rs): it
//! refuses writes and syncs with EIO until a restart, since the kernel may
//! have dropped the pages it could not write. With replicas, every
//! acknowledged change is also on the set's other in-sync members, so the
//! poisoned primary proposes `Failover` of each set it serves to the next
//! in-sync member; the map then moves the set away (it stops serving it,
//! clients follow), and once restarted the server's store is never served
//! again: it is rebuilt from the new primary like a returning server.
//!
//! A set with no other in-sync member stays where it is, answering EIO for
//! writes: nothing could take it over without losing acknowledged data.

use crate::failover::Router;
use crate::members::Members;
use madfs_membership::Change;
use std::sync::Arc;
use std::time::Duration;

/// How often the served sets' stores are looked at.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// Watch the stores of the sets this process serves, for as long as it runs.
pub fn watch(members: Arc<Members>, router: Arc<Router>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            for set in router.served() {
                let Some(server) = router.server_of(set) else {
                    continue;
                };
                let Some(why) = server.chunks.failure() else {
                    continue;
                };
                let map = members.map();
                let Some(s) = map.sets.get(set.0 as usize) else {
                    continue;
                };
                if s.primary != members.me() {
                    continue;
                }
                let Some(&next) = s.members.get(1) else {
                    continue;
                };
                tracing::error!(
                    "server {}: set {set} goes to server {next}: this store is unusable ({why})",
                    members.me()
                );
                members
                    .propose_latest(Change::Failover {
                        set: set.0,
                        new_primary: next,
                    })
                    .await;
            }
        }
    });
}
