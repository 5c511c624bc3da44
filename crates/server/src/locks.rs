//! Striped locks that serialize conflicting operations on one server: a
//! dentry stripe per (parent, name) and an inode stripe per inode. A request
//! takes all the stripes it needs at once, and never waits while it holds
//! some of them (`Locks::lock`), so no cycle of waits can pass through
//! this server's stripes, even one that runs through other servers.
//!
//! A name can also be held past its request: the source of a cross-server
//! rename whose outcome is not known yet (rename.rs, "unsettled"). Requests
//! that lock such a name wait until the rename is settled, so none of them
//! takes the name for a link of its own (an rmdir of it would free an inode
//! that the rename's new name then points at).

use crate::errors::err;
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{stable_hash, FileName, InodeId, ServerId, TxId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard, Notify, RwLock};

const STRIPES: usize = 1024;
const GATES: usize = 256;
const MARKER_STRIPES: usize = 64;
/// How long a request waits for an unsettled rename of a name it locks
/// before it answers EIO. Longer than a failover (under 10 s), after which
/// the rename's destination server answers again and the rename settles.
pub(crate) const UNSETTLED_WAIT: Duration = Duration::from_secs(20);

pub struct Locks {
    stripes: Vec<Mutex<()>>,
    /// Per-directory gates: entry writers hold one shared, a seal (rmdir)
    /// holds it exclusive while it checks emptiness, so no create can slip
    /// in between the check and the seal.
    gates: Vec<RwLock<()>>,
    /// Source names of cross-server renames not settled yet, with how many
    /// renames hold each (one, but a count never goes wrong).
    unsettled: std::sync::Mutex<HashMap<(InodeId, FileName), usize>>,
    /// `unsettled`'s size, so that the common case reads no mutex.
    unsettled_count: AtomicUsize,
    settled: Notify,
    /// A cross-server rename's marker on its destination's server (rename.rs,
    /// RNDN): an install's last look and its write, and a resolve's look
    /// and its write, one at a time. Held for no await, so a plain mutex.
    markers: Vec<std::sync::Mutex<()>>,
}

/// What a request needs locked.
#[derive(Clone, Copy)]
pub enum LockKey<'a> {
    Dentry(InodeId, &'a FileName),
    Inode(InodeId),
}

impl Default for Locks {
    fn default() -> Self {
        Locks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            gates: (0..GATES).map(|_| RwLock::new(())).collect(),
            unsettled: std::sync::Mutex::new(HashMap::new()),
            unsettled_count: AtomicUsize::new(0),
            settled: Notify::new(),
            markers: (0..MARKER_STRIPES)
                .map(|_| std::sync::Mutex::new(()))
                .collect(),
        }
    }
}

impl Locks {
    /// The lock of the marker of rename `tx` of coordinator `coordinator`
    /// (see `markers`). Its holder never panics while it holds it; a
    /// poisoned lock is taken anyway.
    pub fn marker(&self, coordinator: ServerId, tx: TxId) -> std::sync::MutexGuard<'_, ()> {
        let h = stable_hash(&[b"m", &coordinator.0.to_le_bytes(), &tx.0.to_le_bytes()]);
        self.markers[(h % MARKER_STRIPES as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn stripe(key: LockKey<'_>) -> usize {
        let h = match key {
            LockKey::Dentry(p, n) => stable_hash(&[b"d", &p.0.to_le_bytes(), n.as_bytes()]),
            LockKey::Inode(i) => stable_hash(&[b"i", &i.0.to_le_bytes()]),
        };
        (h % STRIPES as u64) as usize
    }

    /// Take every stripe `keys` need (`take`), once no name among them is
    /// the source of an unsettled rename: until then the request waits,
    /// holding nothing, at most `UNSETTLED_WAIT`, and then answers EIO.
    pub async fn lock(&self, keys: &[LockKey<'_>]) -> Result<Vec<MutexGuard<'_, ()>>, WireError> {
        let deadline = tokio::time::Instant::now() + UNSETTLED_WAIT;
        loop {
            let guards = self.take(keys).await;
            let Some(name) = self.first_unsettled(keys) else {
                return Ok(guards);
            };
            drop(guards);
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before the second look, so a settle in between
            // is not missed.
            settled.as_mut().enable();
            if self.first_unsettled(keys).is_none() {
                continue;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return Err(err(
                    ErrorCode::Io,
                    format!(
                        "'{name}' is the source of a rename to another server whose outcome \
                         is not known yet (that server has not answered for {}s)",
                        UNSETTLED_WAIT.as_secs()
                    ),
                ));
            }
        }
    }

    /// The rename that holds a name takes its stripes with this: it does
    /// not wait for itself.
    pub async fn lock_settling(&self, keys: &[LockKey<'_>]) -> Vec<MutexGuard<'_, ()>> {
        self.take(keys).await
    }

    /// Hold `(parent, name)` past the caller's locks until `settle`.
    pub fn unsettle(&self, parent: InodeId, name: &FileName) {
        let mut m = self.unsettled.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((parent, name.clone())).or_insert(0) += 1;
        self.unsettled_count.store(m.len(), Ordering::Release);
    }

    /// The rename that held `(parent, name)` is settled (call it with the
    /// name's stripe held, so waiters see the outcome once they take it).
    pub fn settle(&self, parent: InodeId, name: &FileName) {
        {
            let mut m = self.unsettled.lock().unwrap_or_else(|p| p.into_inner());
            let key = (parent, name.clone());
            match m.get_mut(&key) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    m.remove(&key);
                }
                None => panic!("settling a name that was not held: {name}"),
            }
            self.unsettled_count.store(m.len(), Ordering::Release);
        }
        self.settled.notify_waiters();
    }

    fn first_unsettled(&self, keys: &[LockKey<'_>]) -> Option<FileName> {
        if self.unsettled_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let m = self.unsettled.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter().find_map(|k| match *k {
            LockKey::Dentry(p, n) if m.contains_key(&(p, n.clone())) => Some(n.clone()),
            _ => None,
        })
    }

    /// Take every stripe `keys` need, all or nothing: the request waits for
    /// one stripe while holding none, then takes the others only if they
    /// are free, and otherwise lets go of all and waits for the busy one.
    /// Taking them in order while holding the earlier ones would be enough
    /// on one server, but a request that holds stripes may wait on another
    /// server (a cross-server rename holds its source while the install
    /// runs), and that server's work may need a stripe here (the install
    /// drops a link of an inode this server owns): a waiter holding part of
    /// its set closes a cycle across servers (found by the simulation,
    /// seed 4009 with MADFS_SIM_RENAME_RACES=files).
    async fn take(&self, keys: &[LockKey<'_>]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.iter().map(|k| Self::stripe(*k)).collect();
        idx.sort_unstable();
        idx.dedup();
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "stripes out of order");
        let mut wait_for = 0;
        'retry: loop {
            let mut guards = Vec::with_capacity(idx.len());
            if let Some(&i) = idx.get(wait_for) {
                guards.push(self.stripes[i].lock().await);
            }
            for (k, &i) in idx.iter().enumerate() {
                if k == wait_for {
                    continue;
                }
                match self.stripes[i].try_lock() {
                    Ok(g) => guards.push(g),
                    Err(_) => {
                        // Let go of everything (the guards drop here).
                        wait_for = k;
                        continue 'retry;
                    }
                }
            }
            assert_eq!(guards.len(), idx.len(), "every stripe is held");
            return guards;
        }
    }

    pub fn gate(&self, dir: InodeId) -> &RwLock<()> {
        &self.gates[(stable_hash(&[&dir.0.to_le_bytes()]) % GATES as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_types::ServerId;
    use std::sync::Arc;

    fn name(n: &str) -> FileName {
        FileName::new(n.as_bytes()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_on_an_unsettled_name_waits_for_the_settle() {
        let locks = Arc::new(Locks::default());
        let dir = InodeId::new(ServerId(0), 7);
        let (b, other) = (name("b"), name("c"));
        locks.unsettle(dir, &b);
        // Other names and inodes are not held.
        drop(locks.lock(&[LockKey::Dentry(dir, &other)]).await.unwrap());
        drop(locks.lock(&[LockKey::Inode(dir)]).await.unwrap());
        let waiter = {
            let locks = locks.clone();
            let b = b.clone();
            tokio::spawn(async move {
                let got = locks.lock(&[LockKey::Dentry(dir, &b)]).await.is_ok();
                (got, tokio::time::Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished(), "the name was taken while unsettled");
        let settled_at = {
            let _g = locks.lock_settling(&[LockKey::Dentry(dir, &b)]).await;
            locks.settle(dir, &b);
            tokio::time::Instant::now()
        };
        let (got, at) = waiter.await.unwrap();
        assert!(got);
        assert!(at >= settled_at);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsettled_name_answers_eio_after_the_wait() {
        let locks = Locks::default();
        let dir = InodeId::new(ServerId(1), 9);
        let b = name("b");
        locks.unsettle(dir, &b);
        locks.unsettle(dir, &b);
        let start = tokio::time::Instant::now();
        let e = locks
            .lock(&[LockKey::Inode(dir), LockKey::Dentry(dir, &b)])
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Io);
        assert!(e.message.contains("'b'"), "{}", e.message);
        assert!(start.elapsed() >= UNSETTLED_WAIT);
        // Held twice: one settle leaves it held.
        locks.settle(dir, &b);
        assert!(locks.first_unsettled(&[LockKey::Dentry(dir, &b)]).is_some());
        locks.settle(dir, &b);
        assert!(locks.lock(&[LockKey::Dentry(dir, &b)]).await.is_ok());
    }
}
