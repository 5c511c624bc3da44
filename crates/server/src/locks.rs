//! Striped locks that serialize conflicting operations on one server: a
//! dentry stripe per (parent, name) and an inode stripe per inode. A request
//! takes all the stripes it needs at once, and never waits while it holds
//! some of them (`Locks::lock`), so no cycle of waits can pass through
//! this server's stripes, even one that runs through other servers.

use madfs_types::{stable_hash, FileName, InodeId};
use tokio::sync::{Mutex, MutexGuard, RwLock};

const STRIPES: usize = 1024;
const GATES: usize = 256;

pub struct Locks {
    stripes: Vec<Mutex<()>>,
    /// Per-directory gates: entry writers hold one shared, a seal (rmdir)
    /// holds it exclusive while it checks emptiness, so no create can slip
    /// in between the check and the seal.
    gates: Vec<RwLock<()>>,
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
        }
    }
}

impl Locks {
    fn stripe(key: LockKey<'_>) -> usize {
        let h = match key {
            LockKey::Dentry(p, n) => stable_hash(&[b"d", &p.0.to_le_bytes(), n.as_bytes()]),
            LockKey::Inode(i) => stable_hash(&[b"i", &i.0.to_le_bytes()]),
        };
        (h % STRIPES as u64) as usize
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
    pub async fn lock(&self, keys: &[LockKey<'_>]) -> Vec<MutexGuard<'_, ()>> {
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
