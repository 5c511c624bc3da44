//! Write-behind for one open file: a write returns as soon as its data is
//! copied and handed to a task, so the writer prepares the next block while
//! this one travels to its server. Used by the FUSE mount for every write,
//! and by `File` when opened with `OpenOptions::write_behind`. Without it
//! a sequential writer (dd, cp, an IOR rank) has exactly one 1 MiB request
//! in flight and reaches about half of what the servers take.
//!
//! What keeps this correct:
//! - writes whose byte ranges overlap never run at once (a later write
//!   waits for the earlier one), so the last write to a byte wins;
//! - everything that must see the data waits for the writes in flight
//!   first (`drain`): close, fsync, a read or truncate through the handle
//!   (and on the mount, a read or setattr of the inode through any handle);
//! - a failed write is remembered and returned by the next write, flush or
//!   fsync of the handle (so close(2) reports it), as NFS and the page
//!   cache of local file systems do;
//! - at most `PER_FILE_MAX` writes per handle and `BUDGET_BYTES` over the
//!   whole client (or mount) are in flight: a fast writer is slowed to what the servers
//!   take instead of buffering without bound.

use crate::error::ClientError;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Writes in flight per open file: enough to keep a 1 MiB-per-request
/// stream busy across the round trip to its servers.
pub const PER_FILE_MAX: usize = 8;
/// Bytes in flight over the whole mount (memory bound), in units of
/// `UNIT` so that small writes do not each take a large permit.
pub const BUDGET_BYTES: usize = 64 << 20;
const UNIT: usize = 4096;

/// The byte budget shared by every open file of a mount or client.
#[derive(Clone)]
pub struct Budget {
    units: Arc<Semaphore>,
    total_units: usize,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let total_units = bytes.div_ceil(UNIT).clamp(1, u32::MAX as usize);
        Budget {
            units: Arc::new(Semaphore::new(total_units)),
            total_units,
        }
    }

    fn units(&self, len: usize) -> u32 {
        // A write larger than the whole budget takes all of it (and so
        // runs alone) instead of waiting forever.
        let units = len.div_ceil(UNIT).clamp(1, self.total_units);
        assert!(units <= self.total_units && units <= u32::MAX as usize);
        units as u32
    }
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// (id, start, end) of each write in flight.
    in_flight: Vec<(u64, u64, u64)>,
    /// The first failure not yet reported.
    error: Option<ClientError>,
}

pub struct WriteBehind {
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    changed: Notify,
}

/// A write admitted to run: holds its slot and budget until dropped.
pub struct Ticket {
    id: u64,
    _slot: OwnedSemaphorePermit,
    _budget: OwnedSemaphorePermit,
}

impl Default for WriteBehind {
    fn default() -> Self {
        WriteBehind::new()
    }
}

impl WriteBehind {
    pub fn new() -> WriteBehind {
        WriteBehind {
            slots: Arc::new(Semaphore::new(PER_FILE_MAX)),
            state: Mutex::new(State::default()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The failure of an earlier write, once (then it is cleared).
    pub fn take_error(&self) -> Option<ClientError> {
        self.lock().error.take()
    }

    /// Wait for a slot and for every overlapping write to finish, then
    /// register [start, end) as in flight.
    pub async fn admit(&self, budget: &Budget, start: u64, end: u64) -> Ticket {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("write slots are never closed");
        let budget = budget
            .units
            .clone()
            .acquire_many_owned(budget.units((end - start) as usize))
            .await
            .expect("the write budget is never closed");
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                let overlaps = st.in_flight.iter().any(|&(_, s, e)| s < end && start < e);
                if !overlaps {
                    let id = st.next_id;
                    st.next_id += 1;
                    st.in_flight.push((id, start, end));
                    return Ticket {
                        id,
                        _slot: slot,
                        _budget: budget,
                    };
                }
            }
            notified.await;
        }
    }

    /// `admit` if it would not wait: a slot and the budget are free and no
    /// write in flight overlaps [start, end). None otherwise (nothing is
    /// taken); the caller then waits in `admit`.
    pub fn try_admit(&self, budget: &Budget, start: u64, end: u64) -> Option<Ticket> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        let budget = budget
            .units
            .clone()
            .try_acquire_many_owned(budget.units((end - start) as usize))
            .ok()?;
        let mut st = self.lock();
        if st.in_flight.iter().any(|&(_, s, e)| s < end && start < e) {
            return None;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.in_flight.push((id, start, end));
        Some(Ticket {
            id,
            _slot: slot,
            _budget: budget,
        })
    }

    /// Whether no write is in flight (what `drain` waits for).
    pub fn is_idle(&self) -> bool {
        self.lock().in_flight.is_empty()
    }

    /// A write finished: record its failure, free its range and slot.
    pub fn finish(&self, ticket: Ticket, result: Result<(), ClientError>) {
        {
            let mut st = self.lock();
            let before = st.in_flight.len();
            st.in_flight.retain(|&(id, _, _)| id != ticket.id);
            // Each ticket is in flight exactly once: a range left behind
            // would block overlapping writes (and drain) forever.
            assert_eq!(
                st.in_flight.len() + 1,
                before,
                "write {} was not in flight",
                ticket.id
            );
            if let Err(e) = result {
                st.error.get_or_insert(e);
            }
        }
        drop(ticket);
        self.changed.notify_waiters();
    }

    /// The end of the furthest write in flight (0 if none): the size the
    /// file will have once they land, for getattr meanwhile.
    pub fn in_flight_end(&self) -> u64 {
        self.lock()
            .in_flight
            .iter()
            .map(|&(_, _, e)| e)
            .max()
            .unwrap_or(0)
    }

    /// Wait until no write is in flight.
    pub async fn drain(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().in_flight.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_proto::ErrorCode;
    use std::time::Duration;

    #[tokio::test]
    async fn overlapping_writes_wait_and_errors_are_reported_once() {
        let wb = Arc::new(WriteBehind::new());
        let budget = Budget::new(BUDGET_BYTES);
        let a = wb.admit(&budget, 0, 100).await;
        // Disjoint: admitted at once.
        let b = wb.admit(&budget, 100, 200).await;
        assert_eq!(wb.in_flight_end(), 200);
        // Overlapping a: waits until a finishes.
        let wb2 = wb.clone();
        let waiter = tokio::spawn(async move {
            let budget = Budget::new(BUDGET_BYTES);
            let t = wb2.admit(&budget, 50, 60).await;
            wb2.finish(t, Ok(()));
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        wb.finish(a, Err(ClientError::new(ErrorCode::NoSpace, "full")));
        waiter.await.unwrap();
        wb.finish(b, Ok(()));
        wb.drain().await;
        assert_eq!(wb.in_flight_end(), 0);
        assert_eq!(wb.take_error().unwrap().code, ErrorCode::NoSpace);
        assert!(wb.take_error().is_none());
    }

    #[tokio::test]
    async fn a_write_larger_than_a_small_budget_still_runs() {
        let wb = WriteBehind::new();
        let budget = Budget::new(8192);
        let t = tokio::time::timeout(Duration::from_secs(5), wb.admit(&budget, 0, 1 << 20))
            .await
            .expect("a write larger than the budget is admitted alone");
        wb.finish(t, Ok(()));
        wb.drain().await;
    }

    #[tokio::test]
    async fn slots_bound_writes_in_flight() {
        let wb = Arc::new(WriteBehind::new());
        let budget = Budget::new(BUDGET_BYTES);
        let mut tickets = Vec::new();
        for i in 0..PER_FILE_MAX as u64 {
            tickets.push(wb.admit(&budget, i * 10, i * 10 + 10).await);
        }
        let wb2 = wb.clone();
        let extra = tokio::spawn(async move {
            let budget = Budget::new(BUDGET_BYTES);
            let t = wb2.admit(&budget, 1000, 1010).await;
            wb2.finish(t, Ok(()));
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!extra.is_finished());
        wb.finish(tickets.pop().unwrap(), Ok(()));
        extra.await.unwrap();
        for t in tickets {
            wb.finish(t, Ok(()));
        }
        wb.drain().await;
    }
}
