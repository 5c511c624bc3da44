//! The client's metadata cache: directory entries (names found, and names
//! known to be missing), inode attributes and symlink targets, each trusted
//! for a time-to-live, as the kernel's dentry and attribute caches are
//! trusted for the mount's entry and attribute timeouts.
//!
//! Without it every path costs one lookup per component: a 6-component
//! `stat` through the preload library was 6 round trips where the mount
//! answers from the kernel's dentry cache. With it a path whose directories
//! were seen within the TTL costs one round trip for its last name (or none,
//! where the caller allows a cached answer for it too).
//!
//! Consistency (docs/ARCHITECTURE.md, "The client metadata cache"):
//! - what another client changed may be seen up to the TTL late (1 s by
//!   default, as the mount and NFS's actimeo); open revalidates the final
//!   name (close-to-open), so data and size at open are always fresh;
//! - what this client changes is seen at once: every operation that changes
//!   a name or attributes updates or drops its entries here;
//! - a lookup that was under way while this client changed anything does not
//!   store what it saw (the change may have overtaken it): every change
//!   bumps an epoch, and results are stored only if the epoch they started
//!   in is still current.
//!
//! Bounded in entries and in bytes; the oldest entries go first (with one
//! TTL for all, insertion order is also expiry order).

use madfs_types::{Attr, FileKind, FileName, InodeId};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How much the cache keeps, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// How long an entry is trusted; zero turns the cache off.
    pub ttl: Duration,
    /// Most entries kept (names, attributes and targets together).
    pub entries_max: usize,
    /// Most bytes kept (an estimate: names, attributes, targets, overhead).
    pub bytes_max: usize,
}

/// Bytes counted per entry beyond its name or target: the key, the value,
/// the hash table slot and the eviction queue's copy of the key.
const ENTRY_OVERHEAD_BYTES: usize = 192;

impl CacheConfig {
    /// As the mount's entry and attribute timeouts.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(1);
    pub const DEFAULT_ENTRIES_MAX: usize = 1 << 16;
    pub const DEFAULT_BYTES_MAX: usize = 32 << 20;
    /// Environment variable with the TTL in seconds (decimals allowed, 0
    /// turns the cache off); read by `Client::connect`.
    pub const TTL_ENV: &'static str = "MADFS_CACHE_TTL";

    pub fn off() -> CacheConfig {
        CacheConfig {
            ttl: Duration::ZERO,
            ..CacheConfig::default()
        }
    }

    pub fn with_ttl(ttl: Duration) -> CacheConfig {
        CacheConfig {
            ttl,
            ..CacheConfig::default()
        }
    }

    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.entries_max > 0 && self.bytes_max > 0
    }

    /// The default, with the TTL from `$MADFS_CACHE_TTL` if set.
    pub fn from_env() -> Result<CacheConfig, String> {
        match std::env::var(Self::TTL_ENV) {
            Ok(v) => Ok(CacheConfig::with_ttl(
                parse_ttl(&v).map_err(|e| format!("{}='{v}': {e}", Self::TTL_ENV))?,
            )),
            Err(std::env::VarError::NotPresent) => Ok(CacheConfig::default()),
            Err(e) => Err(format!("{}: {e}", Self::TTL_ENV)),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            ttl: Self::DEFAULT_TTL,
            entries_max: Self::DEFAULT_ENTRIES_MAX,
            bytes_max: Self::DEFAULT_BYTES_MAX,
        }
    }
}

/// A TTL in seconds: "1", "0.25", "0" (off). At most a day.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err("must be between 0 and 86400 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Key {
    Entry(InodeId, FileName),
    Attr(InodeId),
    Target(InodeId),
}

#[derive(Clone, Debug)]
enum Value {
    /// What a name in a directory is, or `None`: it does not exist.
    Entry(Option<(InodeId, FileKind)>),
    Attr(Attr),
    /// A directory's attributes whose times and link count this client
    /// changed since (an entry made or removed in it): still good for
    /// permission checks on a walk (mode and owner did not change), not for
    /// stat, which asks the owner.
    DirChanged(Attr),
    Target(Vec<u8>),
}

struct Item {
    value: Value,
    expires: Instant,
    /// Matches the queue's copy while this item is the key's current one.
    seq: u64,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Item>,
    /// Keys in insertion order (so also expiry order). An element whose
    /// `seq` no longer matches the map's item is a leftover of an update.
    order: VecDeque<(Key, u64)>,
    next_seq: u64,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, key: &Key) {
        if let Some(item) = self.map.remove(key) {
            self.bytes -= item.bytes;
        }
    }

    /// An entry of `dir` was made or removed: its times and link count are
    /// no longer known. Its expiry stays, so mode changes by others are
    /// still seen within the TTL.
    fn dir_changed(&mut self, dir: InodeId) {
        if let Some(item) = self.map.get_mut(&Key::Attr(dir)) {
            if let Value::Attr(a) = &item.value {
                item.value = Value::DirChanged(a.clone());
            }
        }
    }

    fn insert(&mut self, cfg: &CacheConfig, now: Instant, key: Key, value: Value) {
        let bytes = ENTRY_OVERHEAD_BYTES
            + match (&key, &value) {
                (Key::Entry(_, name), _) => 2 * name.as_bytes().len(),
                (_, Value::Target(t)) => t.len(),
                _ => 0,
            };
        self.remove(&key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((key.clone(), seq));
        self.map.insert(
            key,
            Item {
                value,
                expires: now + cfg.ttl,
                seq,
                bytes,
            },
        );
        self.bytes += bytes;
        self.evict(cfg, now);
    }

    /// Drop expired entries from the front of the queue, then the oldest
    /// ones while over a bound; rebuild the queue when leftovers of updates
    /// make up most of it.
    fn evict(&mut self, cfg: &CacheConfig, now: Instant) {
        while let Some((key, seq)) = self.order.front() {
            let current = self.map.get(key).filter(|i| i.seq == *seq);
            let drop_it = match current {
                None => true, // a leftover: the key was updated or removed
                Some(item) => {
                    item.expires <= now
                        || self.map.len() > cfg.entries_max
                        || self.bytes > cfg.bytes_max
                }
            };
            if !drop_it {
                break;
            }
            let (key, seq) = self.order.pop_front().expect("front exists");
            if self.map.get(&key).is_some_and(|i| i.seq == seq) {
                self.remove(&key);
            }
        }
        if self.order.len() > 2 * self.map.len() + 1024 {
            let mut live: Vec<(u64, Key)> =
                self.map.iter().map(|(k, i)| (i.seq, k.clone())).collect();
            live.sort_unstable_by_key(|(seq, _)| *seq);
            self.order = live.into_iter().map(|(s, k)| (k, s)).collect();
        }
        // The loop stops only at a live entry within both bounds, or at an
        // empty queue (then the map is empty too: every item has its queue
        // element), so the bounds hold whatever was inserted.
        assert!(
            self.map.len() <= cfg.entries_max && self.bytes <= cfg.bytes_max,
            "metadata cache over its bounds: {} entries, {} bytes",
            self.map.len(),
            self.bytes
        );
    }
}

/// Counts of the cache's answers, for `madfs run --stats` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache (names and attributes).
    pub hits: u64,
    /// Lookups that had to ask a server.
    pub misses: u64,
    /// Entries held now.
    pub entries: u64,
}

pub(crate) struct MetaCache {
    cfg: CacheConfig,
    inner: Mutex<Inner>,
    /// Bumped by every change this client makes (see the module comment).
    epoch: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The epoch a lookup started in; pass it back with what it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Epoch(u64);

impl MetaCache {
    pub(crate) fn new(cfg: CacheConfig) -> MetaCache {
        MetaCache {
            cfg,
            inner: Mutex::new(Inner::default()),
            epoch: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> CacheConfig {
        self.cfg
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain map updates: consistent even if a holder panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &Key) -> Option<Value> {
        if !self.cfg.enabled() {
            return None;
        }
        let now = Instant::now();
        let found = {
            let inner = self.lock();
            inner
                .map
                .get(key)
                .filter(|i| i.expires > now)
                .map(|i| i.value.clone())
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// What `name` in `parent` is: `Some(None)` if it is known not to
    /// exist, `None` if the cache does not know.
    pub(crate) fn entry(
        &self,
        parent: InodeId,
        name: &FileName,
    ) -> Option<Option<(InodeId, FileKind)>> {
        match self.get(&Key::Entry(parent, name.clone()))? {
            Value::Entry(e) => Some(e),
            _ => None,
        }
    }

    /// An inode's attributes, all current as far as this client knows.
    #[cfg(test)]
    fn attr(&self, ino: InodeId) -> Option<Attr> {
        match self.get(&Key::Attr(ino))? {
            Value::Attr(a) => Some(a),
            _ => None,
        }
    }

    /// An inode's attributes for a permission check on a walk: also a
    /// directory's whose times this client changed (`Value::DirChanged`;
    /// see `dir_times_changed`).
    pub(crate) fn attr_for_access(&self, ino: InodeId) -> Option<Attr> {
        match self.get(&Key::Attr(ino))? {
            Value::Attr(a) | Value::DirChanged(a) => Some(a),
            _ => None,
        }
    }

    /// Whether this client changed `dir`'s entries since its cached
    /// attributes were fetched (a stat must ask the owner).
    pub(crate) fn dir_times_changed(&self, dir: InodeId) -> bool {
        self.cfg.enabled()
            && matches!(
                self.lock().map.get(&Key::Attr(dir)).map(|i| &i.value),
                Some(Value::DirChanged(_))
            )
    }

    pub(crate) fn target(&self, ino: InodeId) -> Option<Vec<u8>> {
        match self.get(&Key::Target(ino))? {
            Value::Target(t) => Some(t),
            _ => None,
        }
    }

    /// Call before asking a server something to cache.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch(self.epoch.load(Ordering::Acquire))
    }

    /// Store answers from a server, unless this client changed anything
    /// since `since` (then they may be older than the change).
    fn learn(&self, since: Epoch, items: impl IntoIterator<Item = (Key, Value)>) {
        if !self.cfg.enabled() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        // Checked under the lock: a change bumps the epoch before it takes
        // the lock to write, so it either saw our insert (and overwrites
        // it) or we see its bump.
        if self.epoch.load(Ordering::Acquire) != since.0 {
            return;
        }
        for (k, v) in items {
            inner.insert(&self.cfg, now, k, v);
        }
    }

    pub(crate) fn learned_entry(
        &self,
        since: Epoch,
        parent: InodeId,
        name: &FileName,
        found: Option<&Attr>,
    ) {
        let entry = (
            Key::Entry(parent, name.clone()),
            Value::Entry(found.map(|a| (a.ino, a.kind))),
        );
        match found {
            Some(a) => self.learn(since, [entry, (Key::Attr(a.ino), Value::Attr(a.clone()))]),
            None => self.learn(since, [entry]),
        }
    }

    pub(crate) fn learned_attr(&self, since: Epoch, attr: &Attr) {
        self.learn(since, [(Key::Attr(attr.ino), Value::Attr(attr.clone()))]);
    }

    pub(crate) fn learned_target(&self, since: Epoch, ino: InodeId, target: &[u8]) {
        self.learn(since, [(Key::Target(ino), Value::Target(target.to_vec()))]);
    }

    /// This client changed something: make every lookup under way forget
    /// what it saw, then apply `f` to the entries.
    fn change(&self, f: impl FnOnce(&mut Inner, &CacheConfig, Instant)) {
        // The epoch moves even with the cache off: bytes that came with an
        // open and reads sent ahead are checked against it too.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if !self.cfg.enabled() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        f(&mut inner, &self.cfg, now);
    }

    /// This client made `name` in `parent` name `attr` (create, mkdir,
    /// symlink, link, rename's target).
    pub(crate) fn made(&self, parent: InodeId, name: &FileName, attr: &Attr) {
        self.change(|inner, cfg, now| {
            inner.dir_changed(parent);
            inner.insert(
                cfg,
                now,
                Key::Entry(parent, name.clone()),
                Value::Entry(Some((attr.ino, attr.kind))),
            );
            inner.insert(cfg, now, Key::Attr(attr.ino), Value::Attr(attr.clone()));
        });
    }

    /// This client removed `name` from `parent` (unlink, rmdir, rename's
    /// source): it is known to be missing now; the inode's attributes
    /// (link count, ctime) changed too.
    pub(crate) fn removed(&self, parent: InodeId, name: &FileName, ino: Option<InodeId>) {
        self.change(|inner, cfg, now| {
            inner.dir_changed(parent);
            inner.insert(
                cfg,
                now,
                Key::Entry(parent, name.clone()),
                Value::Entry(None),
            );
            if let Some(ino) = ino {
                inner.remove(&Key::Attr(ino));
            }
        });
    }

    /// Forget what `name` in `parent` is (an operation on it failed or
    /// left it unknown, so `parent` may have changed too).
    pub(crate) fn forget_entry(&self, parent: InodeId, name: &FileName) {
        self.change(|inner, _, _| {
            inner.dir_changed(parent);
            inner.remove(&Key::Entry(parent, name.clone()))
        });
    }

    /// This client changed an inode's attributes and knows the result.
    pub(crate) fn changed_attr(&self, attr: &Attr) {
        self.change(|inner, cfg, now| {
            inner.insert(cfg, now, Key::Attr(attr.ino), Value::Attr(attr.clone()))
        });
    }

    /// This client changed an inode (a write: size, mtime) without
    /// knowing the result.
    pub(crate) fn forget_attr(&self, ino: InodeId) {
        self.change(|inner, _, _| inner.remove(&Key::Attr(ino)));
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.lock().map.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_types::Timestamp;

    fn attr(ino: u64, size: u64) -> Attr {
        let t = Timestamp { secs: 1, nanos: 0 };
        Attr {
            ino: InodeId(ino),
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            rdev: 0,
        }
    }

    fn name(s: &str) -> FileName {
        FileName::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn entries_attributes_and_negatives_are_kept_until_the_ttl() {
        let c = MetaCache::new(CacheConfig::with_ttl(Duration::from_millis(200)));
        let e = c.epoch();
        c.learned_entry(e, InodeId(1), &name("a"), Some(&attr(7, 3)));
        c.learned_entry(e, InodeId(1), &name("gone"), None);
        assert_eq!(
            c.entry(InodeId(1), &name("a")),
            Some(Some((InodeId(7), FileKind::File)))
        );
        assert_eq!(c.attr(InodeId(7)).map(|a| a.size), Some(3));
        assert_eq!(c.entry(InodeId(1), &name("gone")), Some(None));
        assert_eq!(c.entry(InodeId(1), &name("other")), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.entry(InodeId(1), &name("a")).is_some() {
            assert!(Instant::now() < deadline, "entry never expired");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.attr(InodeId(7)), None);
    }

    #[test]
    fn a_lookup_overtaken_by_a_change_is_not_stored() {
        let c = MetaCache::new(CacheConfig::default());
        let before = c.epoch();
        // This client removes the name while a lookup of it is under way...
        c.removed(InodeId(1), &name("a"), Some(InodeId(7)));
        // ...and the lookup's older answer arrives afterwards.
        c.learned_entry(before, InodeId(1), &name("a"), Some(&attr(7, 3)));
        assert_eq!(c.entry(InodeId(1), &name("a")), Some(None));
        assert_eq!(c.attr(InodeId(7)), None);
        // A lookup started after the change is stored.
        let after = c.epoch();
        c.learned_attr(after, &attr(9, 1));
        assert!(c.attr(InodeId(9)).is_some());
    }

    #[test]
    fn own_changes_replace_entries() {
        let c = MetaCache::new(CacheConfig::default());
        let e = c.epoch();
        c.learned_entry(e, InodeId(1), &name("a"), None);
        c.made(InodeId(1), &name("a"), &attr(8, 0));
        assert_eq!(
            c.entry(InodeId(1), &name("a")),
            Some(Some((InodeId(8), FileKind::File)))
        );
        c.changed_attr(&attr(8, 100));
        assert_eq!(c.attr(InodeId(8)).unwrap().size, 100);
        c.forget_attr(InodeId(8));
        assert_eq!(c.attr(InodeId(8)), None);
        c.forget_entry(InodeId(1), &name("a"));
        assert_eq!(c.entry(InodeId(1), &name("a")), None);
    }

    #[test]
    fn bounds_evict_the_oldest_entries() {
        let cfg = CacheConfig {
            ttl: Duration::from_secs(60),
            entries_max: 100,
            bytes_max: 1 << 20,
        };
        let c = MetaCache::new(cfg);
        for i in 0..1000u64 {
            c.learned_attr(c.epoch(), &attr(i, i));
        }
        assert_eq!(c.stats().entries, 100);
        assert!(c.attr(InodeId(0)).is_none());
        assert_eq!(c.attr(InodeId(999)).unwrap().size, 999);
        // Updating one key many times does not grow the queue without bound.
        for i in 0..10_000u64 {
            c.changed_attr(&attr(5, i));
        }
        assert!(c.lock().order.len() <= 2 * 100 + 1024);
        let byte_bound = CacheConfig {
            ttl: Duration::from_secs(60),
            entries_max: 1 << 20,
            bytes_max: 10 * ENTRY_OVERHEAD_BYTES,
        };
        let c = MetaCache::new(byte_bound);
        for i in 0..100u64 {
            c.learned_target(c.epoch(), InodeId(i), b"target");
        }
        let inner = c.lock();
        assert!(inner.bytes <= byte_bound.bytes_max, "{} bytes", inner.bytes);
        assert!(inner.map.len() < 10);
    }

    #[test]
    fn a_cache_turned_off_keeps_nothing() {
        let c = MetaCache::new(CacheConfig::off());
        c.learned_attr(c.epoch(), &attr(1, 1));
        c.made(InodeId(1), &name("a"), &attr(2, 0));
        assert_eq!(c.attr(InodeId(1)), None);
        assert_eq!(c.entry(InodeId(1), &name("a")), None);
        assert_eq!(c.stats().entries, 0);
    }

    #[test]
    fn own_changes_in_a_directory_keep_its_attributes_for_walks_only() {
        let c = MetaCache::new(CacheConfig::default());
        let mut dir = attr(5, 0);
        dir.kind = FileKind::Dir;
        c.learned_attr(c.epoch(), &dir);
        assert!(!c.dir_times_changed(InodeId(5)));
        c.made(InodeId(5), &name("f"), &attr(6, 0));
        assert!(c.dir_times_changed(InodeId(5)));
        assert_eq!(c.attr(InodeId(5)), None, "not for stat");
        assert_eq!(c.attr_for_access(InodeId(5)), Some(dir.clone()));
        // Fresh attributes from the owner replace the mark.
        c.learned_attr(c.epoch(), &dir);
        assert!(!c.dir_times_changed(InodeId(5)));
        c.removed(InodeId(5), &name("f"), Some(InodeId(6)));
        assert!(c.dir_times_changed(InodeId(5)));
        c.learned_attr(c.epoch(), &dir);
        c.forget_entry(InodeId(5), &name("g"));
        assert!(c.dir_times_changed(InodeId(5)));
    }

    #[test]
    fn ttl_parsing() {
        assert_eq!(parse_ttl("1").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_ttl("0.25").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_ttl("0").unwrap(), Duration::ZERO);
        assert!(parse_ttl("-1").is_err());
        assert!(parse_ttl("soon").is_err());
        assert!(parse_ttl("1e9").is_err());
    }
}
