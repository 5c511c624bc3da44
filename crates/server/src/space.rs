//! The free-space check that every growing request (create, write) makes
//! before it is accepted, without a statfs(2) per request: a sample of the
//! file system's free space is reused for a short while, minus what was
//! granted since. Only a fresh sample refuses anything, so ENOSPC comes
//! exactly where the reserve begins; a stale one can only let a request
//! through that a fresh one would also have let through, up to the bytes
//! others (other processes on the disk) took within `SAMPLE_MAX_AGE`,
//! which the reserve absorbs.

use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long one statfs sample answers for.
const SAMPLE_MAX_AGE: Duration = Duration::from_millis(20);

/// (total, free, available to unprivileged users) bytes of a file system.
pub type Space = (u64, u64, u64);

/// Free space kept back from operations that grow the store: RocksDB needs
/// room to roll its log and flush memtables (up to its 64 MiB memtable
/// budget), and removals must keep working on a full disk. Without it,
/// RocksDB itself hits ENOSPC and refuses every later write until restart.
const SPACE_RESERVE_MAX_BYTES: u64 = 64 << 20;

/// The reserve of a file system of `total` bytes: the smaller of 64 MiB
/// and an eighth of it. A server's own set grows up to it; the copies it
/// keeps of other sets too, and a resync's load only up to twice it
/// (replica.rs `room_for`).
pub(crate) fn reserve(total: u64) -> u64 {
    SPACE_RESERVE_MAX_BYTES.min(total / 8)
}

struct Sample {
    taken: Instant,
    total: u64,
    avail: u64,
    /// Bytes granted since the sample was taken.
    granted: u64,
}

pub struct SpaceGauge {
    path: PathBuf,
    sample: Mutex<Option<Sample>>,
}

impl SpaceGauge {
    pub fn new(path: PathBuf) -> SpaceGauge {
        SpaceGauge {
            path,
            sample: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Sample>> {
        self.sample.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file system's space now (statfs).
    pub fn measure(&self) -> io::Result<Space> {
        fs_space(&self.path)
    }

    /// Grant `growth` bytes if they leave at least the reserve free, the
    /// reserve being `reserve_of(total bytes)`. `Ok(Err(reserve))` refuses.
    pub fn grant(
        &self,
        growth: u64,
        reserve_of: impl Fn(u64) -> u64,
    ) -> io::Result<Result<(), u64>> {
        let mut guard = self.lock();
        if let Some(s) = guard.as_mut() {
            if s.taken.elapsed() < SAMPLE_MAX_AGE {
                let need = reserve_of(s.total).saturating_add(growth);
                if s.avail.saturating_sub(s.granted) >= need {
                    s.granted = s.granted.saturating_add(growth);
                    return Ok(Ok(()));
                }
            }
        }
        // Stale, or close to the reserve: ask the file system.
        let (total, _, avail) = self.measure()?;
        let reserve = reserve_of(total);
        let granted = avail >= reserve.saturating_add(growth);
        *guard = Some(Sample {
            taken: Instant::now(),
            total,
            avail,
            granted: if granted { growth } else { 0 },
        });
        Ok(if granted { Ok(()) } else { Err(reserve) })
    }
}

/// Which file system `path` is on, on this host: the kernel's boot id and
/// the file system's id (`statvfs` f_fsid), hashed. Servers of one host on
/// one disk give the same; 0 where the file system cannot be asked.
pub fn disk_id(path: &std::path::Path, boot: Option<&[u8]>) -> u64 {
    let Ok(st) = statvfs(path) else {
        return 0;
    };
    let h =
        xxhash_rust::xxh3::xxh3_64(&[boot.unwrap_or_default(), &st.f_fsid.to_le_bytes()].concat());
    h.max(1)
}

fn statvfs(path: &std::path::Path) -> io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized
    // out-parameter that statvfs fills on success.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fs_space(path: &std::path::Path) -> io::Result<Space> {
    let st = statvfs(path)?;
    let f = st.f_frsize;
    Ok((st.f_blocks * f, st.f_bfree * f, st.f_bavail * f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_within_a_sample_and_refuses_only_after_measuring() {
        let dir = std::env::temp_dir();
        let gauge = SpaceGauge::new(dir);
        let (total, _, avail) = gauge.measure().unwrap();
        assert!(total > 0 && avail > 0);
        // No reserve: small grants pass, from the sample after the first.
        for _ in 0..100 {
            assert_eq!(gauge.grant(1, |_| 0).unwrap(), Ok(()));
        }
        // More than the disk holds is refused, with the reserve named.
        assert_eq!(gauge.grant(total.saturating_mul(2), |_| 7).unwrap(), Err(7));
        // A reserve above the free space refuses even an empty request.
        assert_eq!(gauge.grant(0, |t| t).unwrap(), Err(total));
        // And the gauge recovers when the reserve is back to normal.
        assert_eq!(gauge.grant(1, |_| 0).unwrap(), Ok(()));
    }

    #[test]
    fn a_sample_does_not_grant_past_what_it_saw() {
        let gauge = SpaceGauge::new(std::env::temp_dir());
        let (_, _, avail) = gauge.measure().unwrap();
        // Grant most of the free space in two steps from one sample: the
        // second step must not fit in what the sample has left.
        let half = avail / 2 + 1;
        assert_eq!(gauge.grant(half, |_| 0).unwrap(), Ok(()));
        // The sample now has avail - half < half left: a fresh statfs is
        // taken, which (nothing was really written) grants it again.
        assert_eq!(gauge.grant(half, |_| 0).unwrap(), Ok(()));
        let s = gauge.lock();
        let s = s.as_ref().unwrap();
        assert_eq!(
            s.granted, half,
            "a fresh sample starts from this grant alone"
        );
    }
}
