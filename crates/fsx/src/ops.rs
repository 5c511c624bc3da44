//! The operations the exerciser performs, how they are drawn from the
//! seeded generator (weights and parameters depend only on the generator
//! and the model, never on what the file system answered, so a seed replays
//! exactly), and how each is written in the operation log.

use crate::Config;
use rand::Rng;
use std::fmt;

/// Which of a file's two open descriptors an operation goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle {
    First,
    Second,
}

impl Handle {
    pub fn index(self) -> usize {
        match self {
            Handle::First => 0,
            Handle::Second => 1,
        }
    }

    fn pick(rng: &mut impl Rng) -> Handle {
        if rng.random_bool(0.5) {
            Handle::First
        } else {
            Handle::Second
        }
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Handle::First => "fd1",
            Handle::Second => "fd2",
        })
    }
}

/// One operation on one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// pwrite; `extend` marks one drawn to start at or past the end of file
    /// (an append, or a write leaving a hole).
    Write {
        h: Handle,
        offset: u64,
        len: u64,
        extend: bool,
    },
    /// pread and compare (may reach past the end of file: a short read).
    Read {
        h: Handle,
        offset: u64,
        len: u64,
    },
    /// Shared read-only mapping, compare (within the file).
    MapRead {
        h: Handle,
        offset: u64,
        len: u64,
    },
    /// ftruncate up to `offset + len` first if the file is shorter (a
    /// mapping cannot extend a file), then a shared writable mapping,
    /// memcpy, msync(MS_SYNC), munmap.
    MapWrite {
        h: Handle,
        offset: u64,
        len: u64,
    },
    /// ftruncate through a descriptor.
    Truncate {
        h: Handle,
        size: u64,
    },
    /// truncate(2) by path.
    TruncatePath {
        size: u64,
    },
    /// close one descriptor and open the file again.
    Reopen {
        h: Handle,
    },
    /// posix_fadvise(DONTNEED) of the whole file: the kernel drops its
    /// cached pages, so the next reads come from the file system itself
    /// (a FUSE mount's cached pages hold the newest bytes whatever its
    /// servers did, and would hide writes they applied out of order).
    DropCache {
        h: Handle,
    },
    Fsync {
        h: Handle,
    },
}

impl Op {
    /// The operation's name in logs and counts.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Write { extend: false, .. } => "write",
            Op::Write { extend: true, .. } => "extend",
            Op::Read { .. } => "read",
            Op::MapRead { .. } => "mapread",
            Op::MapWrite { .. } => "mapwrite",
            Op::Truncate { .. } => "truncate",
            Op::TruncatePath { .. } => "truncate-path",
            Op::Reopen { .. } => "reopen",
            Op::DropCache { .. } => "dropcache",
            Op::Fsync { .. } => "fsync",
        }
    }

    /// The byte range the operation writes, if it writes.
    pub fn written(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Write { offset, len, .. } | Op::MapWrite { offset, len, .. } => {
                Some((offset, offset + len))
            }
            _ => None,
        }
    }

    /// The size the file must have after the operation, from `size` before.
    pub fn size_after(&self, size: u64) -> u64 {
        match *self {
            Op::Write { offset, len, .. } | Op::MapWrite { offset, len, .. } => {
                size.max(offset + len)
            }
            Op::Truncate { size: s, .. } | Op::TruncatePath { size: s } => s,
            Op::Read { .. }
            | Op::MapRead { .. }
            | Op::Reopen { .. }
            | Op::DropCache { .. }
            | Op::Fsync { .. } => size,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match *self {
            Op::Write { h, offset, len, .. }
            | Op::Read { h, offset, len }
            | Op::MapRead { h, offset, len }
            | Op::MapWrite { h, offset, len } => write!(
                f,
                "{name:<13} {h} 0x{offset:x} .. 0x{:x} (0x{len:x} bytes)",
                offset + len
            ),
            Op::Truncate { h, size } => write!(f, "{name:<13} {h} to 0x{size:x}"),
            Op::TruncatePath { size } => write!(f, "{name:<13} to 0x{size:x}"),
            Op::Reopen { h } | Op::DropCache { h } | Op::Fsync { h } => {
                write!(f, "{name:<13} {h}")
            }
        }
    }
}

/// Kinds of operation and their relative weights: reads and writes
/// dominate, as in fsx; size changes are frequent enough that most writes
/// meet a size some truncate left.
#[derive(Clone, Copy)]
enum Kind {
    Write,
    Extend,
    Read,
    MapRead,
    MapWrite,
    Truncate,
    TruncatePath,
    Reopen,
    DropCache,
    Fsync,
}

const WEIGHTS: [(Kind, u32); 10] = [
    (Kind::Write, 20),
    (Kind::Extend, 10),
    (Kind::Read, 18),
    (Kind::MapRead, 8),
    (Kind::MapWrite, 8),
    (Kind::Truncate, 8),
    (Kind::TruncatePath, 4),
    (Kind::Reopen, 3),
    (Kind::DropCache, 4),
    (Kind::Fsync, 3),
];

fn enabled(kind: Kind, cfg: &Config) -> bool {
    match kind {
        Kind::MapRead => cfg.mmap_read,
        Kind::MapWrite => cfg.mmap_write,
        _ => true,
    }
}

/// A length in 1..=max, small ones as likely as large ones on a log scale
/// (sub-page, page-sized and 64 KiB writes all happen often).
fn length(rng: &mut impl Rng, max: u64) -> u64 {
    let max = max.max(1);
    let bits = 64 - max.leading_zeros();
    let top = rng.random_range(1..=bits);
    let cap = if top >= 64 {
        max
    } else {
        (1u64 << top).min(max)
    };
    rng.random_range(1..=cap)
}

/// Draw the next operation on a file whose size is now `size`.
pub fn draw(rng: &mut impl Rng, cfg: &Config, size: u64) -> Op {
    let total: u32 = WEIGHTS
        .iter()
        .filter(|(k, _)| enabled(*k, cfg))
        .map(|(_, w)| w)
        .sum();
    let mut pick = rng.random_range(0..total);
    let mut kind = Kind::Write;
    for &(k, w) in WEIGHTS.iter().filter(|(k, _)| enabled(*k, cfg)) {
        if pick < w {
            kind = k;
            break;
        }
        pick -= w;
    }
    let max_len = cfg.max_len.max(1);
    let max_op = cfg.max_op_len.max(1);
    let h = Handle::pick(rng);
    match kind {
        Kind::Write => {
            let offset = rng.random_range(0..max_len);
            let len = length(rng, max_op).min(max_len - offset);
            Op::Write {
                h,
                offset,
                len,
                extend: false,
            }
        }
        Kind::Extend => {
            // Half appends exactly at the end of file, half leave a hole.
            let gap = if rng.random_bool(0.5) {
                0
            } else {
                length(rng, max_op)
            };
            let mut offset = size.saturating_add(gap);
            if offset >= max_len {
                offset = rng.random_range(0..max_len);
            }
            let len = length(rng, max_op).min(max_len - offset);
            Op::Write {
                h,
                offset,
                len,
                extend: offset >= size,
            }
        }
        Kind::Read => {
            // Sometimes starting past the end of file.
            let offset = rng.random_range(0..size.saturating_add(max_op / 4).max(1));
            Op::Read {
                h,
                offset,
                len: length(rng, max_op),
            }
        }
        Kind::MapRead if size > 0 => {
            let offset = rng.random_range(0..size);
            let len = length(rng, max_op).min(size - offset);
            Op::MapRead { h, offset, len }
        }
        // Nothing to map in an empty file: read instead.
        Kind::MapRead => Op::Read {
            h,
            offset: 0,
            len: length(rng, max_op),
        },
        Kind::MapWrite => {
            let offset = rng.random_range(0..max_len);
            let len = length(rng, max_op).min(max_len - offset);
            Op::MapWrite { h, offset, len }
        }
        Kind::Truncate => Op::Truncate {
            h,
            size: truncate_size(rng, size, max_len, max_op),
        },
        Kind::TruncatePath => Op::TruncatePath {
            size: truncate_size(rng, size, max_len, max_op),
        },
        Kind::Reopen => Op::Reopen { h },
        Kind::DropCache => Op::DropCache { h },
        Kind::Fsync => Op::Fsync { h },
    }
}

/// A new size: anywhere up to `max_len`, or (half the time) near the
/// current size, up or down, as small trims and extensions are where
/// partial pages and stale sizes show.
fn truncate_size(rng: &mut impl Rng, size: u64, max_len: u64, max_op: u64) -> u64 {
    if rng.random_bool(0.5) {
        rng.random_range(0..=max_len)
    } else {
        let delta = length(rng, max_op);
        if rng.random_bool(0.5) {
            size.saturating_sub(delta)
        } else {
            size.saturating_add(delta).min(max_len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn draws_stay_within_bounds_and_respect_disabled_kinds() {
        let mut cfg = Config::new("/nowhere");
        cfg.max_len = 100_000;
        cfg.max_op_len = 10_000;
        cfg.mmap_write = false;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut size = 0;
        for _ in 0..20_000 {
            let op = draw(&mut rng, &cfg, size);
            assert!(!matches!(op, Op::MapWrite { .. }), "{op}");
            if let Some((s, e)) = op.written() {
                assert!(s < e && e <= cfg.max_len, "{op}");
            }
            if let Op::MapRead { offset, len, .. } = op {
                assert!(len > 0 && offset + len <= size, "{op} at size {size}");
            }
            size = op.size_after(size);
            assert!(size <= cfg.max_len);
        }
    }

    #[test]
    fn a_seed_replays_the_same_operations() {
        let cfg = Config::new("/nowhere");
        let run = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut size = 0;
            (0..500)
                .map(|_| {
                    let op = draw(&mut rng, &cfg, size);
                    size = op.size_after(size);
                    op
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
