//! Directory attributes the mount learned from the servers in the last TTL,
//! so that a GETATTR of a directory is answered without a round trip.
//!
//! The kernel drops its cached attributes of a directory whenever a name
//! is created or removed in it (a local file system changes the
//! directory's mtime, size and link count then), and the next path walk
//! through it must check search permission on fresh attributes
//! (`default_permissions`). An answer the servers gave within the TTL is
//! what they would give now unless the directory changed since: changes by
//! other clients (chmod, chown, utimes) are seen at most one TTL after the
//! servers answered, the bound the kernel's attribute cache already has,
//! and a GETATTR answered from here gets only what is left of the TTL, so
//! no answer is trusted longer.
//!
//! Changes through this mount must never be hidden, so every operation
//! that changes a directory calls `changed` (or `changed_all`) once the
//! servers have made the change: create, mknod, mkdir, symlink, link and
//! unlink for the parent, rmdir and rename for every directory (the one
//! removed, moved or replaced is not known by inode here), setattr for
//! the directory itself (which then keeps the servers' reply). That drops
//! what is kept and refuses every answer to a question asked before: a
//! GETATTR sent before the change and answered after it would bring back
//! the old attributes. The servers move a directory's mtime, ctime and
//! link count when names are made or removed in it, so a cached answer
//! from before a create would show the old ones; dropping keeps this cache
//! exact for this mount's own changes. Refreshing
//! instead of dropping would need the parent's new attributes in the
//! servers' replies.

use madfs_client::{Attr, FileKind};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Directories kept at most (then the expired go, and if that is not
/// enough, everything).
const ENTRIES_MAX: usize = 1 << 14;

/// What is known of one directory.
struct Slot {
    /// The servers' answer and when it was asked.
    attr: Option<(Attr, Instant)>,
    /// Answers to questions asked before this are refused: the directory
    /// changed through this mount then.
    since: Option<Instant>,
}

struct State {
    map: HashMap<u64, Slot>,
    /// As `Slot::since`, for every directory (`changed_all`, and a map
    /// emptied because it was full).
    since: Option<Instant>,
}

pub struct DirAttrs {
    ttl: Duration,
    state: Mutex<State>,
}

impl DirAttrs {
    pub fn new(ttl: Duration) -> DirAttrs {
        DirAttrs {
            ttl,
            state: Mutex::new(State {
                map: HashMap::new(),
                since: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain map updates: consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The servers answered `a` (asked at `asked`); kept if it is a
    /// directory and no change through this mount came after the question.
    /// The TTL runs from when the question left, so the answer is never
    /// trusted past one TTL after the servers could have given it.
    pub fn learned(&self, a: &Attr, asked: Instant) {
        if a.kind != FileKind::Dir || self.ttl.is_zero() {
            return;
        }
        let mut st = self.lock();
        if st.since.is_some_and(|s| asked <= s) {
            return;
        }
        self.make_room(&mut st, a.ino.0);
        let slot = st.map.entry(a.ino.0).or_insert(Slot {
            attr: None,
            since: None,
        });
        if slot.since.is_some_and(|s| asked <= s) {
            return;
        }
        // An older question's answer must not replace a newer one.
        if slot.attr.as_ref().is_some_and(|(_, at)| *at > asked) {
            return;
        }
        slot.attr = Some((a.clone(), asked));
    }

    /// Directory `a.ino` was changed through this mount (setattr) and `a`
    /// is the servers' reply, asked at `asked`: kept in place of anything
    /// known, and answers to earlier questions are refused from now on.
    pub fn replaced(&self, a: &Attr, asked: Instant) {
        let now = Instant::now();
        let mut st = self.lock();
        self.make_room(&mut st, a.ino.0);
        let attr = (a.kind == FileKind::Dir && !self.ttl.is_zero()).then(|| (a.clone(), asked));
        st.map.insert(
            a.ino.0,
            Slot {
                attr,
                since: Some(now),
            },
        );
    }

    /// Room for `ino` if it is not kept yet.
    fn make_room(&self, st: &mut State, ino: u64) {
        if st.map.len() < ENTRIES_MAX || st.map.contains_key(&ino) {
            return;
        }
        // Past the TTL neither answers nor refusals matter: an answer asked
        // that long ago would be expired when stored.
        let ttl = self.ttl;
        st.map.retain(|_, s| {
            s.attr.as_ref().is_some_and(|(_, at)| at.elapsed() < ttl)
                || s.since.is_some_and(|at| at.elapsed() < ttl)
        });
        if st.map.len() >= ENTRIES_MAX {
            st.map.clear();
            st.since = Some(Instant::now());
        }
    }

    /// The attributes of directory `ino` and how long they may still be
    /// trusted, if the servers gave them less than a TTL ago.
    pub fn get(&self, ino: u64) -> Option<(Attr, Duration)> {
        let st = self.lock();
        let (a, at) = st.map.get(&ino)?.attr.as_ref()?;
        let left = self.ttl.checked_sub(at.elapsed())?;
        (!left.is_zero()).then(|| (a.clone(), left))
    }

    /// Directory `ino` changed through this mount (the servers made the
    /// change): drop what is kept and refuse answers asked before now.
    pub fn changed(&self, ino: u64) {
        let now = Instant::now();
        let mut st = self.lock();
        self.make_room(&mut st, ino);
        st.map.insert(
            ino,
            Slot {
                attr: None,
                since: Some(now),
            },
        );
    }

    /// `changed` for every directory.
    pub fn changed_all(&self) {
        let mut st = self.lock();
        st.map.clear();
        st.since = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_client::{InodeId, Timestamp};

    fn attr(ino: u64, kind: FileKind, perm: u32) -> Attr {
        let t = Timestamp { secs: 1, nanos: 0 };
        Attr {
            ino: InodeId(ino),
            kind,
            perm,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            rdev: 0,
        }
    }

    #[test]
    fn only_directories_within_the_ttl() {
        let d = DirAttrs::new(Duration::from_secs(60));
        let now = Instant::now();
        d.learned(&attr(5, FileKind::File, 0o644), now);
        assert!(d.get(5).is_none());
        d.learned(&attr(7, FileKind::Dir, 0o755), now);
        let (a, left) = d.get(7).unwrap();
        assert_eq!(a.perm, 0o755);
        assert!(left <= Duration::from_secs(60));
        // A newer answer wins; an older one does not replace it.
        d.learned(&attr(7, FileKind::Dir, 0o700), Instant::now());
        d.learned(&attr(7, FileKind::Dir, 0o777), now);
        assert_eq!(d.get(7).unwrap().0.perm, 0o700);
    }

    #[test]
    fn a_change_drops_and_refuses_earlier_questions() {
        let d = DirAttrs::new(Duration::from_secs(60));
        let asked = Instant::now();
        d.learned(&attr(7, FileKind::Dir, 0o755), asked);
        d.learned(&attr(8, FileKind::Dir, 0o755), asked);
        // A create in 7: the GETATTR sent before it answers after it.
        let in_flight = Instant::now();
        d.changed(7);
        assert!(d.get(7).is_none());
        d.learned(&attr(7, FileKind::Dir, 0o755), in_flight);
        assert!(d.get(7).is_none());
        assert!(d.get(8).is_some());
        // Asked after the change: kept.
        let later = Instant::now() + Duration::from_millis(1);
        d.learned(&attr(7, FileKind::Dir, 0o750), later);
        assert_eq!(d.get(7).unwrap().0.perm, 0o750);
        // A setattr's reply replaces; older answers stay refused.
        let before = Instant::now();
        d.replaced(&attr(7, FileKind::Dir, 0o700), later);
        d.learned(&attr(7, FileKind::Dir, 0o750), before);
        assert_eq!(d.get(7).unwrap().0.perm, 0o700);
        // Every directory (rmdir, rename).
        let in_flight = Instant::now();
        d.changed_all();
        assert!(d.get(7).is_none() && d.get(8).is_none());
        d.learned(&attr(8, FileKind::Dir, 0o755), in_flight);
        assert!(d.get(8).is_none());
        d.learned(
            &attr(8, FileKind::Dir, 0o755),
            Instant::now() + Duration::from_millis(1),
        );
        assert!(d.get(8).is_some());
    }

    #[test]
    fn expired_answers_are_not_given() {
        let d = DirAttrs::new(Duration::from_millis(1));
        let long_ago = Instant::now() - Duration::from_millis(5);
        d.learned(&attr(7, FileKind::Dir, 0o755), long_ago);
        assert!(d.get(7).is_none());
        let off = DirAttrs::new(Duration::ZERO);
        off.learned(&attr(7, FileKind::Dir, 0o755), Instant::now());
        assert!(off.get(7).is_none());
    }
}
