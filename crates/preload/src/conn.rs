//! The connection to the cluster: a client and the tokio runtime that drives
//! it, created on the first MadFS call (so programs that never touch MadFS
//! pay nothing) and created again in a forked child, whose copy of the
//! parent's runtime has no threads and whose sockets are shared with the
//! parent. The parent's objects are leaked in the child, never dropped:
//! dropping them would deregister the parent's sockets from the epoll
//! instance the two processes share.

use crate::shim::{Errno, R};
use madfs_client::Client;
use std::future::Future;
use std::sync::Mutex;
use tokio::runtime::Runtime;

pub struct Conn {
    pub rt: Runtime,
    pub client: Client,
}

impl Conn {
    /// Run `f` to completion. On a thread whose thread-locals are already
    /// destroyed (the main thread inside exit(): glibc runs thread-local
    /// destructors before atexit handlers) tokio cannot enter the runtime
    /// there, so a helper thread does it.
    pub fn block_on<F>(&self, f: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        match tokio::runtime::Handle::try_current() {
            Err(e) if e.is_thread_local_destroyed() => std::thread::scope(|s| {
                s.spawn(|| {
                    crate::guard::mark_library_thread();
                    self.rt.block_on(f)
                })
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
            }),
            _ => self.rt.block_on(f),
        }
    }
}

/// Leaked on purpose (see the module comment): `&'static` for free.
pub static CONN: Mutex<Option<&'static Conn>> = Mutex::new(None);

pub fn get() -> R<&'static Conn> {
    let mut slot = CONN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = *slot {
        return Ok(c);
    }
    let conn = connect()?;
    let leaked: &'static Conn = Box::leak(Box::new(conn));
    *slot = Some(leaked);
    crate::shim::debug!("connected to the cluster");
    Ok(leaked)
}

fn connect() -> R<Conn> {
    let cfg = crate::config::get();
    let client = Client::connect(cfg.cluster.as_deref()).map_err(|e| {
        crate::shim::warn_once("connect", format_args!("cannot use the MadFS cluster: {e}"));
        Errno(e.errno())
    })?;
    // A runtime without worker threads: the program's thread that makes a
    // call drives the sockets itself while it waits, so a reply wakes that
    // thread directly instead of a worker that then wakes it (one
    // cross-core wakeup less per request, about a fifth of a stat's cost on
    // a VM). Threads calling at once take turns driving; the others wait
    // for their own replies meanwhile. Nothing runs between calls, which
    // the library never needs: it keeps no write-behind and no read-ahead.
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .thread_name("madfs-preload")
        .enable_all()
        .on_thread_start(|| {
            crate::guard::mark_library_thread();
            block_signals();
        })
        .build()
        .map_err(|e| {
            crate::shim::warn_once(
                "runtime",
                format_args!("cannot start the MadFS client runtime: {e}"),
            );
            Errno(libc::EIO)
        })?;
    Ok(Conn { rt, client })
}

/// One line on stderr with the requests this process sent, by operation,
/// and how the metadata cache answered; nothing if it never used MadFS.
pub fn report_stats() {
    let Some(c) = *CONN.lock().unwrap_or_else(|e| e.into_inner()) else {
        return;
    };
    let counts = c.client.request_counts();
    let cache = c.client.cache_stats();
    crate::shim::log(format_args!(
        "stats: {} requests: {counts}; metadata cache: {} hits, {} misses",
        counts.total(),
        cache.hits,
        cache.misses,
    ));
}

/// At exit: free the files this process unlinked while it had them open
/// (its descriptors close with it; `Client::release_all_unlinked`). A
/// process killed before this leaves them to their owners' next start.
pub fn release_unlinked_at_exit() {
    let Some(c) = *CONN.lock().unwrap_or_else(|e| e.into_inner()) else {
        return;
    };
    let _ = c.block_on(c.client.release_all_unlinked());
}

/// Our threads take no signals: the program's handlers run on its own threads.
pub fn block_signals() {
    // SAFETY: a full set, applied to this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}
