//! Locks that serialize conflicting operations on one server: one per
//! (parent, name) and one per inode, exactly (a table of the keys in use,
//! not stripes). A request takes all the locks it needs at once, and never
//! waits while it holds some of them (`Locks::lock`), so no cycle of waits
//! can pass through this server's locks, even one that runs through other
//! servers. They were stripes once: two keys that shared a stripe closed
//! such a cycle (the plain simulation, seed 57744: a rename held its
//! source's stripe while the destination's server dropped a link of the
//! replaced file here, whose inode had the same stripe).
//!
//! A directory's gate is taken with the locks, all or nothing
//! (`Locks::lock_gated`): a seal waits for the gate while the request that
//! sealed may hold locks on another server, so a gate holder that waited
//! for a lock closed a cycle (the plain simulation, seed 49866: a mkdir in
//! a directory whose gate shared a stripe with the rename's target, waiting
//! for the source the rename held).
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
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, RwLock, RwLockReadGuard};

const GATES: usize = 256;
const MARKER_STRIPES: usize = 64;
/// How long a request waits for an unsettled rename of a name it locks
/// before it answers EIO. Longer than a failover (under 10 s), after which
/// the rename's destination server answers again and the rename settles.
pub(crate) const UNSETTLED_WAIT: Duration = Duration::from_secs(20);

pub struct Locks {
    /// The keys some request holds or waits for; an entry goes when the
    /// last of them lets go (`Slot`), so the table is as large as the
    /// requests in flight.
    table: std::sync::Mutex<HashMap<Key, Arc<Mutex<()>>>>,
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

/// A directory's gate, shared, and a request's locks (`Locks::lock_gated`).
pub type Gated<'a> = (RwLockReadGuard<'a, ()>, Held<'a>);

/// The locks a request holds; dropping it lets go of them.
pub struct Held<'a> {
    taken: Vec<Taken<'a>>,
}

impl std::fmt::Debug for Held<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} locks held", self.taken.len())
    }
}

/// One held lock. Fields drop in order: the lock first, then the slot,
/// which may remove the key from the table.
struct Taken<'a> {
    _guard: OwnedMutexGuard<()>,
    _slot: Slot<'a>,
}

/// A key's lock, referenced by a request that holds it or waits for it.
struct Slot<'a> {
    locks: &'a Locks,
    key: Key,
    mutex: Option<Arc<Mutex<()>>>,
}

impl Slot<'_> {
    fn mutex(&self) -> Arc<Mutex<()>> {
        self.mutex
            .clone()
            .expect("a slot's lock is there until it drops")
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut table = self.locks.table();
        // Under the table's lock, as every new reference is taken: a count
        // of one is the table's own, and nobody holds or waits for the key.
        drop(self.mutex.take());
        if table
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            table.remove(&self.key);
        }
    }
}

/// A lock's key, owned (the table's).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Dentry(InodeId, FileName),
    Inode(InodeId),
}

impl From<LockKey<'_>> for Key {
    fn from(k: LockKey<'_>) -> Key {
        match k {
            LockKey::Dentry(p, n) => Key::Dentry(p, n.clone()),
            LockKey::Inode(i) => Key::Inode(i),
        }
    }
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
            table: std::sync::Mutex::new(HashMap::new()),
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

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Mutex<()>>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keys in use: held or waited for.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.table().len()
    }

    fn slot(&self, key: &Key) -> Slot<'_> {
        let mutex = self.table().entry(key.clone()).or_default().clone();
        Slot {
            locks: self,
            key: key.clone(),
            mutex: Some(mutex),
        }
    }

    /// Take every lock `keys` need (`take`), once no name among them is
    /// the source of an unsettled rename: until then the request waits,
    /// holding nothing, at most `UNSETTLED_WAIT`, and then answers EIO.
    pub async fn lock(&self, keys: &[LockKey<'_>]) -> Result<Held<'_>, WireError> {
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

    /// `lock`, and `dir`'s gate shared, all or nothing: the request never
    /// waits for a lock while it holds the gate, nor for the gate while
    /// it holds locks. A seal waiting for the gate then waits only for
    /// holders that wait for nothing (their write), whatever the seal's
    /// own request holds elsewhere.
    pub async fn lock_gated(
        &self,
        dir: InodeId,
        keys: &[LockKey<'_>],
    ) -> Result<Gated<'_>, WireError> {
        let gate = self.gate(dir);
        loop {
            let guards = self.lock(keys).await?;
            // Fails while a seal holds the gate or waits for it (tokio's
            // RwLock serves waiters in order).
            if let Ok(g) = gate.try_read() {
                return Ok((g, guards));
            }
            drop(guards);
            drop(gate.read().await);
        }
    }

    /// The rename that holds a name takes its locks with this: it does
    /// not wait for itself.
    pub async fn lock_settling(&self, keys: &[LockKey<'_>]) -> Held<'_> {
        self.take(keys).await
    }

    /// Hold `(parent, name)` past the caller's locks until `settle`.
    pub fn unsettle(&self, parent: InodeId, name: &FileName) {
        let mut m = self.unsettled.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((parent, name.clone())).or_insert(0) += 1;
        self.unsettled_count.store(m.len(), Ordering::Release);
    }

    /// The rename that held `(parent, name)` is settled (call it with the
    /// name's lock held, so waiters see the outcome once they take it).
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

    /// Take every lock `keys` need, all or nothing: the request waits for
    /// one lock while holding none, then takes the others only if they
    /// are free, and otherwise lets go of all and waits for the busy one.
    /// Taking them in order while holding the earlier ones would be enough
    /// on one server, but a request that holds locks may wait on another
    /// server (a cross-server rename holds its source while the install
    /// runs), and that server's work may need a lock here (the install
    /// drops a link of an inode this server owns): a waiter holding part of
    /// its set closes a cycle across servers (found by the simulation,
    /// seed 4009 with MADFS_SIM_RENAME_RACES=files).
    async fn take(&self, keys: &[LockKey<'_>]) -> Held<'_> {
        let mut keys: Vec<Key> = keys.iter().map(|&k| Key::from(k)).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut wait_for = 0;
        'retry: loop {
            let mut taken = Vec::with_capacity(keys.len());
            if let Some(k) = keys.get(wait_for) {
                let slot = self.slot(k);
                let guard = slot.mutex().lock_owned().await;
                taken.push(Taken {
                    _guard: guard,
                    _slot: slot,
                });
            }
            for (i, k) in keys.iter().enumerate() {
                if i == wait_for {
                    continue;
                }
                let slot = self.slot(k);
                match slot.mutex().try_lock_owned() {
                    Ok(guard) => taken.push(Taken {
                        _guard: guard,
                        _slot: slot,
                    }),
                    Err(_) => {
                        // Let go of everything (`taken` drops here).
                        wait_for = i;
                        continue 'retry;
                    }
                }
            }
            assert_eq!(taken.len(), keys.len(), "every lock is held");
            return Held { taken };
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

    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_for_a_lock_leaves_the_gate_to_a_seal() {
        let locks = Arc::new(Locks::default());
        let (dir, ino) = (InodeId::new(ServerId(0), 17), InodeId::new(ServerId(0), 18));
        let held = locks.lock(&[LockKey::Inode(ino)]).await.unwrap();
        let waiter = gated(&locks, dir, Key::Inode(ino));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "the lock is held");
        // A seal gets the gate although the waiter wants it shared: the
        // waiter holds nothing while it waits for the lock.
        let seal = tokio::time::timeout(Duration::from_secs(1), locks.gate(dir).write())
            .await
            .expect("the seal waited for a request that waits for a lock");
        drop(held);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "it went in under the seal");
        drop(seal);
        finishes(waiter).await;
    }

    /// A request that takes `dir`'s gate and `key`'s lock, then lets go.
    fn gated(locks: &Arc<Locks>, dir: InodeId, key: Key) -> tokio::task::JoinHandle<()> {
        let locks = locks.clone();
        tokio::spawn(async move {
            let k = match &key {
                Key::Dentry(p, n) => LockKey::Dentry(*p, n),
                Key::Inode(i) => LockKey::Inode(*i),
            };
            let _held = locks.lock_gated(dir, &[k]).await.unwrap();
        })
    }

    async fn finishes(waiter: tokio::task::JoinHandle<()>) {
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("the waiter got both once they were free")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_for_the_gate_holds_no_lock() {
        let locks = Arc::new(Locks::default());
        let dir = InodeId::new(ServerId(2), 5);
        let b = name("b");
        let seal = locks.gate(dir).write().await;
        let waiter = gated(&locks, dir, Key::Dentry(dir, b.clone()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "the gate is held");
        let other = tokio::time::timeout(
            Duration::from_secs(1),
            locks.lock(&[LockKey::Dentry(dir, &b)]),
        )
        .await
        .expect("a request waiting for the gate held its lock");
        drop(other);
        drop(seal);
        finishes(waiter).await;
    }

    #[tokio::test(start_paused = true)]
    async fn distinct_keys_never_wait_for_each_other() {
        // With 1,024 stripes, some two of 3,000 keys shared one, and the
        // second waited for the first (the plain simulation, seed 57744).
        let locks = Locks::default();
        let dir = InodeId::new(ServerId(2), 1);
        let names: Vec<FileName> = (0..1500).map(|i| name(&format!("f{i}"))).collect();
        let mut held = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let keys = [
                LockKey::Dentry(dir, n),
                LockKey::Inode(InodeId::new(ServerId(2), i as u64 + 2)),
            ];
            let h = tokio::time::timeout(Duration::from_secs(1), locks.lock(&keys))
                .await
                .unwrap_or_else(|_| panic!("key {i} waited for another key"))
                .unwrap();
            held.push(h);
        }
        assert_eq!(locks.in_use(), 3000);
        drop(held);
        assert_eq!(locks.in_use(), 0, "keys nobody holds are forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_given_up_leaves_no_key_behind() {
        let locks = Arc::new(Locks::default());
        let ino = InodeId::new(ServerId(0), 3);
        let held = locks.lock(&[LockKey::Inode(ino)]).await.unwrap();
        // A request cancelled while it waits (its client went away).
        let waited = tokio::time::timeout(
            Duration::from_millis(10),
            locks.lock(&[LockKey::Inode(ino)]),
        )
        .await;
        assert!(waited.is_err(), "the lock is held");
        assert_eq!(locks.in_use(), 1);
        drop(held);
        assert_eq!(locks.in_use(), 0);
        let again = locks
            .lock(&[LockKey::Inode(ino), LockKey::Inode(ino)])
            .await;
        assert!(again.is_ok(), "a key named twice is taken once");
    }
}
