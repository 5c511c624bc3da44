//! Seals of directories being removed: rmdir seals an empty directory on
//! every server so no entry appears in it while its owner removes it; a seal
//! its rmdir never lifted expires after `SEAL_LEASE`.

use crate::errors::{err, io_err, kv_err, OpResult};
use crate::keys;
use crate::service::{blocking, Server};
use madfs_proto::message::{Op, Reply, SealAction};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::InodeId;
use std::time::Duration;
// tokio's clock: the simulation (crates/sim) runs it paused and advances it.
use tokio::time::Instant;

/// A seal that its rmdir never lifted expires (the rmdir's server died).
pub(crate) const SEAL_LEASE: Duration = Duration::from_secs(30);
pub(crate) const SEALS_MAX: usize = 100_000;

#[derive(Clone, Copy, Debug)]
pub(crate) enum SealState {
    Sealed(Instant),
    Removed,
}

impl Server {
    pub(crate) fn seal_state(&self, dir: InodeId) -> Option<SealState> {
        let seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
        match seals.get(&dir) {
            Some(SealState::Sealed(until)) if *until <= Instant::now() => None,
            other => other.copied(),
        }
    }

    /// Wait while an rmdir of `dir` is deciding; ENOENT once it is removed.
    pub(crate) async fn wait_unsealed(&self, dir: InodeId) -> Result<(), WireError> {
        loop {
            let notified = self.seal_changed.notified();
            match self.seal_state(dir) {
                None => return Ok(()),
                Some(SealState::Removed) => {
                    return Err(err(
                        ErrorCode::NotFound,
                        format!("directory {dir} was removed"),
                    ))
                }
                Some(SealState::Sealed(until)) => {
                    let left = until.saturating_duration_since(Instant::now());
                    let _ = tokio::time::timeout(left, notified).await;
                }
            }
        }
    }

    pub(crate) async fn seal(&self, dir: InodeId, action: SealAction) -> OpResult {
        match action {
            SealAction::Seal => {
                // Exclusive gate: no create into `dir` is between its check
                // and its write while we look.
                let _gate = self.locks.gate(dir).write().await;
                self.seals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(dir, SealState::Sealed(Instant::now() + SEAL_LEASE));
                let prefix = keys::dentry_prefix(dir);
                let empty = self
                    .kv
                    .scan(&prefix, &prefix, 1)
                    .map_err(kv_err)?
                    .is_empty();
                if empty {
                    // The removals that emptied it must outlive a power
                    // cut before the directory goes, or they come back
                    // into a directory that does not exist.
                    let kv = self.kv.clone();
                    blocking(move || kv.sync_wal().map_err(std::io::Error::other))
                        .await
                        .map_err(io_err)?;
                }
                Ok((Reply::Sealed { empty }, Vec::new()))
            }
            SealAction::Unseal => {
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(seals.get(&dir), Some(SealState::Sealed(_))) {
                    seals.remove(&dir);
                }
                drop(seals);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
            SealAction::Removed => {
                let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
                if seals.len() >= SEALS_MAX {
                    // The owner's records answer for forgotten tombstones.
                    seals.retain(|_, s| matches!(s, SealState::Sealed(_)));
                }
                seals.insert(dir, SealState::Removed);
                drop(seals);
                self.dir_cache.forget(dir);
                self.seal_changed.notify_waiters();
                Ok((Reply::Sealed { empty: true }, Vec::new()))
            }
        }
    }

    /// Seal `dir` on every server; Ok if it is empty everywhere, else the
    /// seals are lifted again and the error says why.
    pub(crate) async fn seal_empty_dir(&self, dir: InodeId) -> Result<(), WireError> {
        let results = self
            .broadcast(Op::Seal {
                dir,
                action: SealAction::Seal,
            })
            .await;
        let mut failure = None;
        for (s, r) in results {
            match r {
                Ok(Reply::Sealed { empty: true }) => {}
                Ok(_) => {
                    failure.get_or_insert(err(ErrorCode::NotEmpty, ""));
                }
                Err(e) => {
                    failure.get_or_insert(err(
                        e.code,
                        format!("sealing on server {s}: {}", e.message),
                    ));
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => {
                self.unseal(dir).await;
                Err(e)
            }
        }
    }

    pub(crate) async fn unseal(&self, dir: InodeId) {
        self.broadcast(Op::Seal {
            dir,
            action: SealAction::Unseal,
        })
        .await;
    }

    pub(crate) async fn announce_removed(&self, dir: InodeId) {
        for (s, r) in self
            .broadcast(Op::Seal {
                dir,
                action: SealAction::Removed,
            })
            .await
        {
            if let Err(e) = r {
                tracing::warn!("telling server {s} that directory {dir} is gone: {e}");
            }
        }
    }
}
