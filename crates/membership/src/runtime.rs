//! openraft's async runtime for the membership group: tokio, as
//! `openraft::TokioRuntime` is, but with the random numbers openraft draws
//! (its election timeouts) taken from a generator the caller may seed per
//! thread (`seed_thread_rng`): the deterministic simulation (crates/sim)
//! runs the whole group on one thread and must replay a seed exactly.
//! Unseeded, each thread draws from the OS's entropy, as `thread_rng` does.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand08::{RngCore, SeedableRng};

thread_local! {
    static RNG: RefCell<Option<rand08::rngs::StdRng>> = const { RefCell::new(None) };
}

/// Draw openraft's random numbers on this thread from `seed` from now on.
pub fn seed_thread_rng(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(rand08::rngs::StdRng::seed_from_u64(seed)));
}

/// This thread's generator (see the module comment).
#[derive(Clone, Copy, Debug, Default)]
pub struct SeededRng;

impl SeededRng {
    fn with<T>(f: impl FnOnce(&mut rand08::rngs::StdRng) -> T) -> T {
        RNG.with(|r| {
            let mut r = r.borrow_mut();
            let rng = r.get_or_insert_with(rand08::rngs::StdRng::from_entropy);
            f(rng)
        })
    }
}

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        Self::with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        Self::with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        Self::with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        Self::with(|r| r.try_fill_bytes(dest))
    }
}

/// `openraft::TokioRuntime` with `SeededRng`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runtime;

impl AsyncRuntime for Runtime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = SeededRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SeededRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}
