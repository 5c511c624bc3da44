//! The harvester: a thread that moves bytes written around us into a
//! standard stream's memfd (stdio on a redirected stdout) into MadFS.

use crate::config;
use crate::fdtable;
use crate::shim;

/// How often bytes written around us into a standard stream's memfd are
/// moved into MadFS (and the memory given back).
const HARVEST_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

static HARVESTER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Start (once per process) the thread that harvests descriptions with a
/// shadow descriptor: standard streams redirected to MadFS.
pub fn ensure_harvester() {
    use std::sync::atomic::Ordering;
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() } as u32;
    if config::foreign_child() || HARVESTER_PID.swap(me, Ordering::AcqRel) == me {
        return;
    }
    let started = std::thread::Builder::new()
        .name("madfs-harvest".into())
        .spawn(|| {
            crate::guard::mark_library_thread();
            crate::conn::block_signals();
            loop {
                std::thread::sleep(HARVEST_EVERY);
                for (fd, d) in fdtable::all() {
                    if !d.has_shadow() {
                        continue;
                    }
                    let Ok(_io) = d.io.try_lock() else {
                        continue; // a call on it is running: it harvests
                    };
                    if let Err(e) = d.sync_offset(fd) {
                        shim::warn_once(
                            "harvest",
                            format_args!("cannot save output into MadFS: errno {}", e.0),
                        );
                    }
                }
            }
        });
    if started.is_err() {
        HARVESTER_PID.store(0, Ordering::Release);
    }
}
