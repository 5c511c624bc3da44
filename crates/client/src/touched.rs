//! Touch tokens of this client's own changes to directories.
//!
//! A create, removal, link or rename whose parent directory lives on
//! another server than the entry replies before the directory's owner has
//! applied the new times and link count: the reply names the touch that
//! will carry them (`TouchToken`: directory, sending server, seq). This
//! table keeps, per (directory, sender), the latest such token for a few
//! seconds; the next GetAttr of the directory sends them along and the
//! owner answers once it applied them, so this client sees its own change
//! (other clients see it once the touch lands, microseconds to
//! milliseconds later; docs/ARCHITECTURE.md). Bounded: at most
//! `TOKENS_MAX` entries, each dropped once a GetAttr carried it or after
//! `TOKEN_TTL` (longer than the owner ever waits, 5 s).

use madfs_proto::message::{TouchToken, TouchWait, GETATTR_WAITS_MAX};
use madfs_types::{InodeId, ServerId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
// The runtime's clock: the simulation's paused clock where it runs there
// (crates/sim), so a token's age does not depend on the machine's load.
use tokio::time::Instant;

/// Entries kept at most; past it the oldest go (a GetAttr of their
/// directory then no longer waits for them: it may see the change a few
/// milliseconds late, as another client would).
const TOKENS_MAX: usize = 4096;
/// A token older than this is dropped: its touch has long been applied
/// (or its sender died and the owner would not wait longer anyway).
const TOKEN_TTL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Touched {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_dir: HashMap<InodeId, Vec<Pending>>,
    /// Entries over all directories.
    count: usize,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    sender: ServerId,
    seq: u64,
    at: Instant,
}

impl Touched {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reply of this client's change carried `tokens`.
    pub(crate) fn record(&self, tokens: &[TouchToken]) {
        if tokens.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        for t in tokens {
            let list = inner.by_dir.entry(t.dir).or_default();
            match list.iter_mut().find(|p| p.sender == t.sender) {
                Some(p) => {
                    p.seq = p.seq.max(t.seq);
                    p.at = now;
                }
                None => {
                    list.push(Pending {
                        sender: t.sender,
                        seq: t.seq,
                        at: now,
                    });
                    inner.count += 1;
                }
            }
        }
        if inner.count > TOKENS_MAX {
            evict(&mut inner.by_dir, now);
            inner.count = inner.by_dir.values().map(Vec::len).sum();
        }
    }

    /// Whether a GetAttr of `dir` would wait for something.
    pub(crate) fn pending(&self, dir: InodeId) -> bool {
        let inner = self.lock();
        inner
            .by_dir
            .get(&dir)
            .is_some_and(|l| l.iter().any(|p| p.at.elapsed() < TOKEN_TTL))
    }

    /// The touches a GetAttr of `dir` waits for.
    pub(crate) fn waits(&self, dir: InodeId) -> Vec<TouchWait> {
        let inner = self.lock();
        let Some(list) = inner.by_dir.get(&dir) else {
            return Vec::new();
        };
        list.iter()
            .filter(|p| p.at.elapsed() < TOKEN_TTL)
            .take(GETATTR_WAITS_MAX)
            .map(|p| TouchWait {
                sender: p.sender,
                seq: p.seq,
            })
            .collect()
    }

    /// A GetAttr of `dir` that carried `sent` was answered: those touches
    /// are applied (or never will be), forget them unless a later change
    /// replaced them meanwhile.
    pub(crate) fn waited(&self, dir: InodeId, sent: &[TouchWait]) {
        if sent.is_empty() {
            return;
        }
        let mut inner = self.lock();
        if let Some(list) = inner.by_dir.get_mut(&dir) {
            let before = list.len();
            list.retain(|p| !sent.iter().any(|w| w.sender == p.sender && w.seq >= p.seq));
            let gone = before - list.len();
            if list.is_empty() {
                inner.by_dir.remove(&dir);
            }
            inner.count -= gone;
        }
    }
}

/// Drop expired entries, then the oldest, until at most `TOKENS_MAX` stay.
fn evict(map: &mut HashMap<InodeId, Vec<Pending>>, now: Instant) {
    map.retain(|_, l| {
        l.retain(|p| now.duration_since(p.at) < TOKEN_TTL);
        !l.is_empty()
    });
    let mut all: Vec<(Instant, InodeId, ServerId)> = map
        .iter()
        .flat_map(|(d, l)| l.iter().map(|p| (p.at, *d, p.sender)))
        .collect();
    if all.len() <= TOKENS_MAX {
        return;
    }
    all.sort_unstable_by_key(|&(at, _, _)| at);
    // Down to three quarters, so the next overflow is a while off.
    for &(_, d, s) in &all[..all.len() - TOKENS_MAX * 3 / 4] {
        if let Some(l) = map.get_mut(&d) {
            l.retain(|p| p.sender != s);
            if l.is_empty() {
                map.remove(&d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(dir: u64, sender: u16, seq: u64) -> TouchToken {
        TouchToken {
            dir: InodeId(dir),
            sender: ServerId(sender),
            seq,
        }
    }

    #[test]
    fn latest_per_sender_is_kept_and_forgotten_once_waited_for() {
        let t = Touched::default();
        t.record(&[token(5, 1, 10), token(5, 2, 3)]);
        t.record(&[token(5, 1, 12), token(6, 1, 11)]);
        let mut w = t.waits(InodeId(5));
        w.sort_by_key(|w| w.sender.0);
        assert_eq!(
            w,
            vec![
                TouchWait {
                    sender: ServerId(1),
                    seq: 12
                },
                TouchWait {
                    sender: ServerId(2),
                    seq: 3
                }
            ]
        );
        // A change made while the GetAttr was out stays.
        t.record(&[token(5, 2, 4)]);
        t.waited(InodeId(5), &w);
        assert_eq!(
            t.waits(InodeId(5)),
            vec![TouchWait {
                sender: ServerId(2),
                seq: 4
            }]
        );
        assert!(t.pending(InodeId(6)));
        assert!(!t.pending(InodeId(7)));
    }

    #[test]
    fn the_table_stays_bounded() {
        let t = Touched::default();
        for i in 0..(TOKENS_MAX as u64 * 3) {
            t.record(&[token(i, 0, i)]);
        }
        let n: usize = t.lock().by_dir.values().map(Vec::len).sum();
        assert!(n <= TOKENS_MAX, "{n} entries");
        assert_eq!(n, t.lock().count);
        // The newest survive.
        assert!(t.pending(InodeId(TOKENS_MAX as u64 * 3 - 1)));
    }
}
