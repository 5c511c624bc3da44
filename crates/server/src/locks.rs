//! Striped locks that serialize conflicting operations on one server: a
//! dentry stripe per (parent, name) and an inode stripe per inode. A request
//! takes all the stripes it needs at once, in index order, so two requests
//! can never wait on each other in a cycle.

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

    pub async fn lock(&self, keys: &[LockKey<'_>]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.iter().map(|k| Self::stripe(*k)).collect();
        idx.sort_unstable();
        idx.dedup();
        // The lock order that rules out deadlock: strictly ascending.
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "stripes out of order");
        let mut guards = Vec::with_capacity(idx.len());
        for i in idx {
            guards.push(self.stripes[i].lock().await);
        }
        guards
    }

    pub fn gate(&self, dir: InodeId) -> &RwLock<()> {
        &self.gates[(stable_hash(&[&dir.0.to_le_bytes()]) % GATES as u64) as usize]
    }
}
