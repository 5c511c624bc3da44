//! How much memory this machine has and has available, for the chunk
//! cache (chunk_cache.rs): unlike the page cache, memory the server holds
//! cannot be reclaimed by the kernel, so the cache grows only while the
//! machine keeps a reserve available and gives memory back when it does
//! not. Read from /proc/meminfo at most every `SAMPLE_MAX_AGE`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one reading of /proc/meminfo answers for.
const SAMPLE_MAX_AGE: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// MemTotal, bytes.
    pub total: u64,
    /// MemAvailable (free plus what the kernel can reclaim), bytes.
    pub available: u64,
}

impl MemInfo {
    /// How far a holder of `held` bytes may grow (or must shrink to)
    /// while `1 / reserve_divisor` of the memory stays available.
    pub fn limit_for(&self, held: u64, reserve_divisor: u64) -> u64 {
        let reserve = self.total / reserve_divisor.max(1);
        if self.available >= reserve {
            held.saturating_add(self.available - reserve)
        } else {
            held.saturating_sub(reserve - self.available)
        }
    }
}

/// One field of /proc/meminfo's text, in KiB as the file gives it.
pub(crate) fn meminfo_kb(meminfo: &str, field: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
}

/// From /proc/meminfo's text; None if a field is missing.
pub fn parse(meminfo: &str) -> Option<MemInfo> {
    let kb = |field: &str| meminfo_kb(meminfo, field);
    Some(MemInfo {
        total: kb("MemTotal")?.checked_mul(1024)?,
        available: kb("MemAvailable")?.checked_mul(1024)?,
    })
}

#[derive(Default)]
pub struct MemoryGauge {
    last: Mutex<Option<(Instant, Option<MemInfo>)>>,
}

impl MemoryGauge {
    /// This machine's memory now (a sample at most `SAMPLE_MAX_AGE` old);
    /// None without /proc.
    pub fn sample(&self) -> Option<MemInfo> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, info)) = *last {
            if at.elapsed() < SAMPLE_MAX_AGE {
                return info;
            }
        }
        let info = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| parse(&m));
        *last = Some((Instant::now(), info));
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_limits() {
        let m = parse(
            "MemTotal:       16000000 kB\nMemFree:  1 kB\nMemAvailable:    3000000 kB\n\
             MemAvailableX: 5 kB\n",
        )
        .unwrap();
        assert_eq!(m.total, 16_000_000 * 1024);
        assert_eq!(m.available, 3_000_000 * 1024);
        // Reserve an eighth (2,000,000 kB): 1,000,000 kB more may be held.
        assert_eq!(m.limit_for(0, 8), 1_000_000 * 1024);
        assert_eq!(m.limit_for(5, 8), 1_000_000 * 1024 + 5);
        // Reserve a quarter (4,000,000 kB): 1,000,000 kB must be given back.
        assert_eq!(m.limit_for(1_500_000 * 1024, 4), 500_000 * 1024);
        assert_eq!(m.limit_for(1, 4), 0);
        assert_eq!(parse("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn reads_this_machine() {
        let g = MemoryGauge::default();
        let m = g.sample().expect("Linux has /proc/meminfo");
        assert!(m.total > 0 && m.available <= m.total);
        assert_eq!(g.sample(), Some(m), "reused within the sample's age");
    }
}
