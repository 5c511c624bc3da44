//! The reentrancy guard. Everything this library does (the client library,
//! tokio, Rust's standard library) calls libc too, and those calls land in
//! our own interposed symbols. A thread-local depth says "inside MadFS code":
//! then every interposed function goes straight to the real one. The
//! client's runtime threads are marked for good when they start, so their
//! socket and epoll calls never look at our tables.

use std::cell::Cell;

thread_local! {
    // `const` and without Drop: no destructor registration, usable until the
    // thread is gone.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside our code (or is one of our threads).
#[inline]
pub fn busy() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// Marks the current thread as inside our code until dropped.
pub struct Enter(());

impl Enter {
    #[inline]
    pub fn new() -> Enter {
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        Enter(())
    }
}

impl Drop for Enter {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// For the client runtime's threads: inside our code for their whole life.
pub fn mark_library_thread() {
    let _ = DEPTH.try_with(|d| d.set(1 << 20));
}

/// Run the program's own code (a callback we were handed) as the program:
/// its calls are intercepted again.
pub fn outside<T>(f: impl FnOnce() -> T) -> T {
    let saved = DEPTH.try_with(|d| d.replace(0)).unwrap_or(0);
    let r = f();
    let _ = DEPTH.try_with(|d| d.set(saved));
    r
}
