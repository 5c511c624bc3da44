//! What the mount was asked and what it asked the servers: FUSE requests
//! by operation, and how many of them were answered on the thread that
//! read them (no task, no server), next to the client's requests by
//! opcode. With `MADFS_STATS=1` in its environment the daemon prints them
//! on stderr (its log) at SIGUSR1, as the change since the last print, and
//! at unmount; `madfs run --stats` does the same for the interception
//! library. Counters only: the cost is one relaxed atomic add per request.

use madfs_client::RequestCounts;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The FUSE operations the mount implements (the rest get fuser's ENOSYS
/// and are not counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FuseOp {
    Lookup,
    Forget,
    GetAttr,
    SetAttr,
    ReadLink,
    MkNod,
    MkDir,
    Unlink,
    RmDir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    OpenDir,
    ReadDir,
    ReadDirPlus,
    ReleaseDir,
    FsyncDir,
    StatFs,
    Access,
    Create,
}

const OPS: [FuseOp; 26] = [
    FuseOp::Lookup,
    FuseOp::Forget,
    FuseOp::GetAttr,
    FuseOp::SetAttr,
    FuseOp::ReadLink,
    FuseOp::MkNod,
    FuseOp::MkDir,
    FuseOp::Unlink,
    FuseOp::RmDir,
    FuseOp::Symlink,
    FuseOp::Rename,
    FuseOp::Link,
    FuseOp::Open,
    FuseOp::Read,
    FuseOp::Write,
    FuseOp::Flush,
    FuseOp::Release,
    FuseOp::Fsync,
    FuseOp::OpenDir,
    FuseOp::ReadDir,
    FuseOp::ReadDirPlus,
    FuseOp::ReleaseDir,
    FuseOp::FsyncDir,
    FuseOp::StatFs,
    FuseOp::Access,
    FuseOp::Create,
];

/// A snapshot: requests per operation, and of those how many were answered
/// inline (on the reader thread, without a task).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct FuseCounts {
    requests: [u64; OPS.len()],
    inline: [u64; OPS.len()],
}

impl FuseCounts {
    pub(crate) fn get(&self, op: FuseOp) -> u64 {
        self.requests[op as usize]
    }

    pub(crate) fn inline(&self, op: FuseOp) -> u64 {
        self.inline[op as usize]
    }

    pub fn total(&self) -> u64 {
        self.requests.iter().sum()
    }

    pub fn since(&self, earlier: &FuseCounts) -> FuseCounts {
        FuseCounts {
            requests: std::array::from_fn(|i| self.requests[i].saturating_sub(earlier.requests[i])),
            inline: std::array::from_fn(|i| self.inline[i].saturating_sub(earlier.inline[i])),
        }
    }
}

/// "Lookup 3 (1 inline), Create 1" (or "none").
impl std::fmt::Display for FuseCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        for op in OPS {
            let n = self.get(op);
            if n == 0 {
                continue;
            }
            if !s.is_empty() {
                s.push_str(", ");
            }
            let _ = write!(s, "{op:?} {n}");
            let i = self.inline(op);
            if i > 0 {
                let _ = write!(s, " ({i} inline)");
            }
        }
        if s.is_empty() {
            s.push_str("none");
        }
        f.write_str(&s)
    }
}

pub(crate) struct Stats {
    requests: [AtomicU64; OPS.len()],
    inline: [AtomicU64; OPS.len()],
    /// What was printed last (for the change since).
    last: Mutex<(FuseCounts, Option<RequestCounts>)>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            inline: std::array::from_fn(|_| AtomicU64::new(0)),
            last: Mutex::new((FuseCounts::default(), None)),
        }
    }

    pub(crate) fn record(&self, op: FuseOp) {
        self.requests[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `op` was answered on the reader thread.
    pub(crate) fn record_inline(&self, op: FuseOp) {
        self.inline[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> FuseCounts {
        FuseCounts {
            requests: std::array::from_fn(|i| self.requests[i].load(Ordering::Relaxed)),
            inline: std::array::from_fn(|i| self.inline[i].load(Ordering::Relaxed)),
        }
    }

    /// Two lines: FUSE requests and server requests since the last report.
    pub(crate) fn report(&self, client: RequestCounts) -> String {
        let now = self.snapshot();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let fuse = now.since(&last.0);
        let sent = match &last.1 {
            Some(before) => client.since(before),
            None => client,
        };
        *last = (now, Some(client));
        format!(
            "madfs mount stats: {} FUSE requests: {fuse}\nmadfs mount stats: {} server requests: {sent}",
            fuse.total(),
            sent.total()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_its_slot() {
        for (i, op) in OPS.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?}");
        }
    }

    #[test]
    fn counts_print_and_subtract() {
        let s = Stats::new();
        s.record(FuseOp::Lookup);
        s.record(FuseOp::Flush);
        s.record_inline(FuseOp::Flush);
        let a = s.snapshot();
        assert_eq!(a.to_string(), "Lookup 1, Flush 1 (1 inline)");
        s.record(FuseOp::Lookup);
        let d = s.snapshot().since(&a);
        assert_eq!(d.to_string(), "Lookup 1");
        assert_eq!(d.total(), 1);
        assert_eq!(FuseCounts::default().to_string(), "none");
    }
}
