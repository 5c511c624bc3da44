//! Run many futures at once within one task, at most `limit` at a time, and
//! collect their outputs in input order. Clients use it for the pieces of
//! one read or write, servers for their broadcasts to every server.
//!
//! Why not `tokio::spawn`: the futures borrow the caller's buffers (a write's
//! data is sent straight from the caller's slice), so they are not 'static.
//! Why not the `futures` crate: this is the one combinator we need, and the
//! RPCs are I/O-bound, so polling them from one task costs nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Run `futures` concurrently, at most `limit` at a time, and return their
/// outputs in input order.
///
/// Takes a `Vec`, not an iterator: a `Map` iterator held across the await
/// makes the caller's future not provably `Send` (rustc's higher-ranked
/// closure limitation), so callers collect first.
pub async fn join_bounded<F: Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    let limit = limit.max(1);
    let mut pending = futures.into_iter();
    let mut active: Vec<(usize, Pin<Box<F>>)> = Vec::new();
    let mut out: Vec<Option<F::Output>> = Vec::new();
    std::future::poll_fn(|cx| loop {
        while active.len() < limit {
            match pending.next() {
                Some(f) => {
                    active.push((out.len(), Box::pin(f)));
                    out.push(None);
                }
                None => break,
            }
        }
        if active.is_empty() {
            return Poll::Ready(());
        }
        let mut progressed = false;
        let mut i = 0;
        while i < active.len() {
            if let Poll::Ready(v) = active[i].1.as_mut().poll(cx) {
                out[active[i].0] = Some(v);
                active.swap_remove(i);
                progressed = true;
            } else {
                i += 1;
            }
        }
        // Every remaining future has registered the waker; nothing finished,
        // so nothing can be refilled either.
        if !progressed {
            return Poll::Pending;
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future ran to completion"))
        .collect()
}

/// Like `join_bounded`, for fallible futures: waits for all of them (so no
/// request is abandoned half-sent) and returns the first error in input order.
pub async fn try_join_bounded<F, T, E>(futures: Vec<F>, limit: usize) -> Result<Vec<T>, E>
where
    F: Future<Output = Result<T, E>>,
{
    join_bounded(futures, limit).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn keeps_order_and_bounds_concurrency() {
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let futs = (0..50u64).map(|i| {
            let (running, peak) = (&running, &peak);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // Later inputs finish first, to check the output order.
                tokio::time::sleep(Duration::from_millis(50 - i)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                i * 2
            }
        });
        let futs: Vec<_> = futs.collect();
        let out = join_bounded(futs, 4).await;
        assert_eq!(out, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn first_error_in_input_order_wins() {
        let futs = (0..5).map(|i| async move {
            if i == 1 || i == 3 {
                Err(i)
            } else {
                Ok(i)
            }
        });
        let futs: Vec<_> = futs.collect();
        assert_eq!(try_join_bounded(futs, 2).await, Err(1));
        let none: Vec<std::future::Ready<Result<u8, ()>>> = Vec::new();
        assert_eq!(try_join_bounded(none, 2).await, Ok(vec![]));
    }
}
