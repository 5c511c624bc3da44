//! Requests a client sent, by operation. Every request goes through one
//! place (`Client::call_data`), which counts it here, so tests can assert
//! how many round trips an operation costs (counts, never timings) and
//! `madfs run --stats` can show users where their program's time goes.

use madfs_proto::Opcode;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Opcodes are below this (checked where they are counted).
const OPCODE_SLOTS: usize = 64;

/// The live counters, shared by every clone of a client.
pub(crate) struct Counters {
    by_opcode: [AtomicU64; OPCODE_SLOTS],
}

impl Counters {
    pub(crate) fn new() -> Counters {
        Counters {
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    pub(crate) fn record(&self, op: Opcode) {
        let slot = op as usize;
        assert!(slot < OPCODE_SLOTS, "opcode {slot} has no counter");
        self.by_opcode[slot].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            by_opcode: std::array::from_fn(|i| self.by_opcode[i].load(Ordering::Relaxed)),
        }
    }
}

/// How many requests of each operation a client has sent (to all servers:
/// a fan-out to four servers counts four).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestCounts {
    by_opcode: [u64; OPCODE_SLOTS],
}

impl RequestCounts {
    pub fn get(&self, op: Opcode) -> u64 {
        self.by_opcode[op as usize]
    }

    pub fn total(&self) -> u64 {
        self.by_opcode.iter().sum()
    }

    /// The requests sent since `earlier` (a snapshot of the same client).
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            by_opcode: std::array::from_fn(|i| {
                self.by_opcode[i].saturating_sub(earlier.by_opcode[i])
            }),
        }
    }

    /// (operation, count) for every operation sent at least once, in
    /// opcode order.
    pub fn nonzero(&self) -> Vec<(Opcode, u64)> {
        (0..OPCODE_SLOTS as u16)
            .filter_map(|v| Opcode::from_u16(v).map(|op| (op, self.get(op))))
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

/// "Lookup 3, Create 1" (or "none").
impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .nonzero()
            .into_iter()
            .map(|(op, n)| format!("{op:?} {n}"))
            .collect();
        if parts.is_empty() {
            write!(f, "none")
        } else {
            write!(f, "{}", parts.join(", "))
        }
    }
}

impl fmt::Debug for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestCounts({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_operation_and_differences() {
        let c = Counters::new();
        let before = c.snapshot();
        c.record(Opcode::Lookup);
        c.record(Opcode::Lookup);
        c.record(Opcode::Create);
        let d = c.snapshot().since(&before);
        assert_eq!(d.get(Opcode::Lookup), 2);
        assert_eq!(d.get(Opcode::Create), 1);
        assert_eq!(d.get(Opcode::Remove), 0);
        assert_eq!(d.total(), 3);
        assert_eq!(d.to_string(), "Lookup 2, Create 1");
        assert_eq!(before.to_string(), "none");
    }

    #[test]
    fn every_opcode_has_a_slot() {
        for v in 0..=u16::MAX {
            if let Some(op) = Opcode::from_u16(v) {
                assert!((op as usize) < OPCODE_SLOTS, "{op:?}");
            }
        }
    }
}
