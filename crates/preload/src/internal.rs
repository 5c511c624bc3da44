//! Our own descriptors (the runtime's epoll instance and eventfd, the
//! sockets to the servers) live in the program's descriptor table. Programs
//! pick numbers of their own: shells dup2 onto 3..9 (`exec 3>file`), daemons
//! close everything from 3 up. So every descriptor our code creates through
//! socket/epoll_create/eventfd is moved high (F_DUPFD_CLOEXEC at
//! `base()`, out of the way of lowest-free allocation and of small fixed
//! numbers), remembered, and protected: a close from the program is
//! answered with success without closing, a dup2 onto one fails with EBUSY.
//! A forked child keeps its copies open, unused: among them is tokio's
//! process-wide signal socket pair, which the child's new runtime reuses.

use crate::real;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const TRACKED: usize = 1 << 16;
static BITS: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];

/// The lowest number we move our descriptors to: half the soft limit,
/// capped so the kernel's descriptor table stays small.
fn base() -> i64 {
    static BASE: OnceLock<i64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-parameter.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            r.rlim_cur
        } else {
            1024
        };
        (soft / 2).clamp(64, 4096) as i64
    })
}

pub fn is_internal(fd: i32) -> bool {
    let f = fd as usize;
    fd >= 0 && f < TRACKED && BITS[f / 64].load(Ordering::Acquire) & (1 << (f % 64)) != 0
}

fn mark(fd: i32, on: bool) {
    let f = fd as usize;
    if fd >= 0 && f < TRACKED {
        if on {
            BITS[f / 64].fetch_or(1 << (f % 64), Ordering::Release);
        } else {
            BITS[f / 64].fetch_and(!(1 << (f % 64)), Ordering::Release);
        }
    }
}

/// A descriptor our code just created: move it high and remember it.
pub fn adopt(fd: i32) -> i32 {
    if fd < 0 {
        return fd;
    }
    // SAFETY: plain descriptor calls on a descriptor we own.
    let moved = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, base() as libc::c_long) };
    let fd = if moved >= 0 {
        // SAFETY: as above.
        unsafe { real::close(fd) };
        moved
    } else {
        fd
    };
    mark(fd, true);
    fd
}

/// The program closes a number: forget it if it was ours and the close is
/// ours to make (from our own code).
pub fn forget(fd: i32) {
    mark(fd, false);
}

/// Ranges [first, last] without our descriptors in them.
pub fn ranges_without_internal(first: u32, last: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut start = first;
    let top = last.min(TRACKED as u32 - 1);
    let mut fd = first;
    while fd <= top {
        if is_internal(fd as i32) {
            if fd > start {
                out.push((start, fd - 1));
            }
            start = fd + 1;
        }
        fd += 1;
    }
    if start <= last {
        out.push((start, last));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_skip_our_descriptors() {
        mark(5000, true);
        mark(5002, true);
        assert_eq!(
            ranges_without_internal(4990, 5010),
            vec![(4990, 4999), (5001, 5001), (5003, 5010)]
        );
        assert_eq!(ranges_without_internal(5000, 5000), vec![]);
        assert_eq!(ranges_without_internal(3, 10), vec![(3, 10)]);
        mark(5000, false);
        mark(5002, false);
        assert!(!is_internal(5000));
    }
}
