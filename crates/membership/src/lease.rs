//! Leases, the server side: a server may serve writes only while it holds a
//! lease from the current membership leader ([`LeaseHolder::has_lease`]).
//! Leases are granted by the leader's pings ([`Ping`], sent by the
//! [`crate::Detector`]); a server that stops hearing from a leader that can
//! still reach a quorum loses its lease before that leader may fail it over.
//!
//! # Why a lease cannot outlive the leader's count (no synchronized clocks)
//!
//! Each side measures only durations on its own monotonic clock, and we
//! assume those clocks run at rates that differ by less than
//! `lease_margin / lease`; nothing compares two clocks' readings. What
//! remains is to anchor the two measurements on events whose real-time
//! order is certain, with the holder's anchor first:
//!
//! 1. The leader sends ping `n` to server S. S records the instant it
//!    receives it, `r_n` (S's clock). S answers.
//! 2. The answer reaches the leader at `a_n` (leader's clock). Causality:
//!    `r_n` happened before `a_n`. The leader counts S as heard at `a_n`.
//! 3. In its next round the leader first confirms with a quorum of voters
//!    that it still leads (heartbeats sent after `a_n`), then sends ping
//!    `n + 1` carrying `grant: Some(n)`.
//! 4. On receiving that ping, S extends its lease to `r_n + lease -
//!    lease_margin` on its own clock. In real time that ends before
//!    `r_n + lease`, so before `a_n + lease`.
//! 5. The leader declares S down only at `a_last + down_after` with
//!    `down_after >= lease + lease_margin` (asserted), so every lease S
//!    holds from this leader has ended before S is failed over.
//!
//! Anchoring the leader's count at the ping's *send* instant instead would
//! not be safe: S receives the ping later, by an unbounded network delay,
//! and an anchor taken at receipt would outlast a count started at the
//! send. Anchoring S at receipt and the leader at the answer's arrival is
//! the only order one round trip proves.
//!
//! Leases granted by an earlier leader: a grant (step 3) follows a quorum
//! confirmation sent after `r_n`. A new leader needs votes from a majority,
//! which shares a voter V with that quorum; V acknowledged the old term's
//! heartbeat before voting in the new term (after voting it rejects the old
//! term), so the new leader was elected after `r_n`. The new leader's
//! detector counts every server as heard at the instant it starts, after
//! its election, and waits `down_after` from there: past every lease the
//! old leader granted. A partitioned old leader cannot confirm a quorum, so
//! it grants nothing, and its servers' leases lapse.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::wire::{decode, encode};
use crate::{MembershipError, Timing};

/// Receipts a holder remembers, for grants that name an earlier ping. A
/// grant names the previous round's ping, so a few suffice.
const RECEIPTS_MAX: usize = 8;

/// A ping from the membership leader's detector to one server. Sent and
/// answered by the caller's RPC layer; [`Ping::encode`] and
/// [`Ping::decode`] give its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    /// The leader that sends it, and its Raft term.
    pub leader: u16,
    pub term: u64,
    /// +1 per round of this leader in this term.
    pub seq: u64,
    /// An earlier ping (`seq`) of this leader and term whose answer reached
    /// the leader before it last confirmed its leadership: the holder's
    /// lease runs from the instant it received that ping.
    pub grant: Option<u64>,
    /// The sets none of whose in-sync members answers the leader (every
    /// copy gone), as of this round: a server passes them on to clients
    /// asking for the routes ([`LeaseHolder::lost_sets`]), so a process
    /// new to such a set need not wait out its whole failover wait.
    #[serde(default)]
    pub lost: Vec<LostSet>,
}

/// A replica set with no live in-sync member, and for how long the leader
/// has heard from none of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostSet {
    pub set: u16,
    pub silent_ms: u64,
}

impl Ping {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Ping, MembershipError> {
        decode(bytes)
    }
}

/// The lease of one server (every server has one, voters or not).
pub struct LeaseHolder {
    /// `lease - lease_margin`: how long a grant lasts on this clock.
    lease_net: Duration,
    state: Mutex<HolderState>,
}

#[derive(Default)]
struct HolderState {
    /// The latest pings received: (leader, term, seq, when).
    receipts: VecDeque<(u16, u64, u64, Instant)>,
    /// The lease runs until this instant, if one was ever granted.
    until: Option<Instant>,
    /// The lost sets of the latest ping that extended the lease (from a
    /// leader that confirmed its leadership), and when it arrived.
    lost: Vec<LostSet>,
    lost_received: Option<Instant>,
}

impl LeaseHolder {
    pub fn new(timing: &Timing) -> LeaseHolder {
        assert!(
            timing.lease > timing.lease_margin,
            "the lease must be longer than its margin"
        );
        LeaseHolder {
            lease_net: timing.lease - timing.lease_margin,
            state: Mutex::new(HolderState::default()),
        }
    }

    /// A ping arrived: remember when, and extend the lease by its grant.
    /// The caller answers the ping after this returns.
    pub fn on_ping(&self, ping: &Ping) {
        let now = Instant::now();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(granted) = ping.grant {
            let receipt = state.receipts.iter().find(|(leader, term, seq, _)| {
                (*leader, *term, *seq) == (ping.leader, ping.term, granted)
            });
            if let Some(&(_, _, _, received_at)) = receipt {
                assert!(received_at <= now, "monotonic clock went backwards");
                let until = received_at + self.lease_net;
                if state.until.map_or(true, |old| old < until) {
                    state.until = Some(until);
                }
                state.lost.clone_from(&ping.lost);
                state.lost_received = Some(now);
            }
        }
        if state.receipts.len() == RECEIPTS_MAX {
            state.receipts.pop_front();
        }
        state
            .receipts
            .push_back((ping.leader, ping.term, ping.seq, now));
    }

    /// Whether this server may serve writes now.
    pub fn has_lease(&self) -> bool {
        self.lease_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// The sets with no live in-sync member, each with how long the leader
    /// has heard from none of them (counted on to now), as the latest
    /// granting ping said: empty without a lease (this server's view may
    /// be stale: cut off, or the leader changed).
    pub fn lost_sets(&self) -> Vec<(u16, Duration)> {
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        match (state.until, state.lost_received) {
            (Some(until), Some(received)) if now < until => {
                let since = now.saturating_duration_since(received);
                state
                    .lost
                    .iter()
                    .map(|l| (l.set, Duration::from_millis(l.silent_ms) + since))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// When the lease ends (it may have ended already), if one was granted.
    pub fn lease_until(&self) -> Option<Instant> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(seq: u64, grant: Option<u64>) -> Ping {
        Ping {
            leader: 0,
            term: 3,
            seq,
            grant,
            lost: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lost_sets_are_told_only_under_a_lease_and_age_from_their_receipt() {
        let timing = Timing::default();
        let holder = LeaseHolder::new(&timing);
        let lost = vec![LostSet {
            set: 2,
            silent_ms: 4_000,
        }];
        // Not granting: nothing taken (an old leader's ping).
        holder.on_ping(&Ping {
            lost: lost.clone(),
            ..ping(1, None)
        });
        assert!(holder.lost_sets().is_empty());
        tokio::time::advance(timing.heartbeat).await;
        holder.on_ping(&Ping {
            lost,
            ..ping(2, Some(1))
        });
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(holder.lost_sets(), vec![(2, Duration::from_millis(4_100))]);
        // A granting ping that names none clears them.
        holder.on_ping(&ping(3, Some(2)));
        assert!(holder.lost_sets().is_empty());
        holder.on_ping(&Ping {
            lost: vec![LostSet {
                set: 1,
                silent_ms: 0,
            }],
            ..ping(4, Some(3))
        });
        assert_eq!(holder.lost_sets().len(), 1);
        // Once the lease ends, this server's view may be stale: none told.
        tokio::time::advance(timing.lease).await;
        assert!(holder.lost_sets().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_runs_from_the_receipt_of_the_ping_it_names() {
        let timing = Timing::default();
        let holder = LeaseHolder::new(&timing);
        holder.on_ping(&ping(1, None));
        assert!(
            !holder.has_lease(),
            "an answered ping is no lease until granted"
        );
        let first_receipt = Instant::now();
        tokio::time::advance(timing.heartbeat).await;
        holder.on_ping(&ping(2, Some(1)));
        assert!(holder.has_lease());
        assert_eq!(
            holder.lease_until(),
            Some(first_receipt + timing.lease - timing.lease_margin)
        );
        tokio::time::advance(timing.lease - timing.lease_margin).await;
        assert!(
            !holder.has_lease(),
            "the lease ends lease - margin after the first receipt"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn grants_of_another_leader_or_term_are_ignored() {
        let holder = LeaseHolder::new(&Timing::default());
        holder.on_ping(&ping(1, None));
        let mut other_term = ping(2, Some(1));
        other_term.term = 4;
        holder.on_ping(&other_term);
        let mut other_leader = ping(2, Some(1));
        other_leader.leader = 1;
        holder.on_ping(&other_leader);
        assert!(!holder.has_lease());
    }

    #[test]
    fn pings_round_trip() {
        let p = Ping {
            lost: vec![LostSet {
                set: 3,
                silent_ms: 31_000,
            }],
            ..ping(7, Some(6))
        };
        assert_eq!(Ping::decode(&p.encode()), Ok(p));
        assert!(Ping::decode(b"\x02{}").is_err());
    }
}
