//! When a completed chunk should start its writeback at once. Starting it
//! early lets the disk work while the network does, so a later fsync (IOR's
//! at close, a checkpoint's) finds little left: measured, 2 GiB written and
//! fsynced by 2 ranks went from 0.75x to 1.05x of a local directory. But
//! once the kernel's own background writeback runs (dirty pages above its
//! background threshold, as when a job writes more than memory holds),
//! extra writeback requests only compete with it: 16 GiB ran 20% slower
//! with them. So chunks start early only while the system's dirty and
//! under-writeback memory is below the kernel's background threshold, that
//! is while the kernel itself is not writing back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one reading of /proc/meminfo answers for.
const SAMPLE_MAX_AGE: Duration = Duration::from_millis(100);

pub struct EarlyWriteback {
    /// dirty_background_bytes, or 0 to use the ratio.
    background_bytes: u64,
    /// dirty_background_ratio (percent of dirtyable memory).
    background_ratio: u64,
    last: Mutex<Option<(Instant, bool)>>,
}

impl Default for EarlyWriteback {
    fn default() -> Self {
        EarlyWriteback::new()
    }
}

impl EarlyWriteback {
    pub fn new() -> EarlyWriteback {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        EarlyWriteback {
            background_bytes: read("dirty_background_bytes").unwrap_or(0),
            background_ratio: read("dirty_background_ratio").unwrap_or(10),
            last: Mutex::new(None),
        }
    }

    /// Whether to start the writeback of a completed chunk now.
    pub fn allowed(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, ok)) = *last {
            if at.elapsed() < SAMPLE_MAX_AGE {
                return ok;
            }
        }
        let ok = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| below_background(&m, self.background_bytes, self.background_ratio))
            // Without /proc, leave writeback to the kernel.
            .unwrap_or(false);
        *last = Some((Instant::now(), ok));
        ok
    }
}

/// From /proc/meminfo's text: is Dirty + Writeback below the background
/// threshold? The kernel's threshold is a share of "dirtyable" memory,
/// which is about free plus file-backed pages.
fn below_background(meminfo: &str, background_bytes: u64, ratio: u64) -> Option<bool> {
    let kb = |field: &str| crate::memory::meminfo_kb(meminfo, field);
    let pending = (kb("Dirty")? + kb("Writeback")?) * 1024;
    let threshold = if background_bytes > 0 {
        background_bytes
    } else {
        let dirtyable = (kb("MemFree")? + kb("Active(file)")? + kb("Inactive(file)")?) * 1024;
        dirtyable / 100 * ratio
    };
    Some(pending < threshold)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24000000 kB\n\
        MemFree:        10000000 kB\n\
        Active(file):    4000000 kB\n\
        Inactive(file):  6000000 kB\n\
        Dirty:            900000 kB\n\
        Writeback:        100000 kB\n\
        WritebackTmp:          0 kB\n";

    #[test]
    fn threshold_follows_the_kernel_settings() {
        // Dirtyable 20,000,000 kB; 5% is 1,000,000 kB, exactly what is
        // pending (Dirty + Writeback): not below.
        assert_eq!(below_background(MEMINFO, 0, 5), Some(false));
        // 10%: 2,000,000 kB.
        assert_eq!(below_background(MEMINFO, 0, 10), Some(true));
        // dirty_background_bytes wins over the ratio when set.
        assert_eq!(below_background(MEMINFO, 2 << 30, 1), Some(true));
        assert_eq!(below_background(MEMINFO, 512 << 20, 50), Some(false));
        // WritebackTmp is not Writeback; a missing field gives no answer.
        assert_eq!(below_background("Dirty: 1 kB\n", 0, 10), None);
    }

    #[test]
    fn reads_this_machine() {
        // Whatever the answer, it is computed (Linux has /proc/meminfo) and
        // then reused within the sample's age.
        let e = EarlyWriteback::new();
        let first = e.allowed();
        assert!(e.last.lock().unwrap().is_some());
        assert_eq!(e.allowed(), first);
    }
}
