//! Which servers hold writes of a file not yet synced, and which
//! incarnation of each server's store took them (the write verifier its
//! replies named, server ops/data.rs). An fsync that a store answers with
//! another verifier fails (EIO): the store may have lost those writes
//! with a power loss before it synced them, and an fsync that succeeded
//! there would promise data that are gone (as NFS's COMMIT verifier
//! tells a client to send its writes again; this client keeps no copy of
//! what it wrote, so it reports the loss).

use crate::error::{ClientError, Result};
use madfs_proto::message::WriteVerifier;
use madfs_proto::ErrorCode;
use madfs_types::ServerId;
use std::collections::BTreeMap;

/// What one server's replies to unsynced writes named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    One(WriteVerifier),
    /// Writes answered by two incarnations: the earlier ones may be lost
    /// whatever the fsync says.
    Several,
}

/// A file's (or a handle's) servers with unsynced writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unsynced(BTreeMap<ServerId, Seen>);

impl Unsynced {
    /// A write `server` acknowledged with `verifier`.
    pub fn note(&mut self, server: ServerId, verifier: WriteVerifier) {
        let seen = self.0.entry(server).or_insert(Seen::One(verifier));
        if *seen != Seen::One(verifier) {
            *seen = Seen::Several;
        }
    }

    /// Everything `other` notes, too.
    pub fn merge(&mut self, other: &Unsynced) {
        for (&server, &seen) in &other.0 {
            match seen {
                Seen::One(v) => self.note(server, v),
                Seen::Several => {
                    self.0.insert(server, Seen::Several);
                }
            }
        }
    }

    /// Every server the writes went to.
    pub fn servers(&self) -> Vec<ServerId> {
        self.0.keys().copied().collect()
    }

    pub fn contains(&self, server: ServerId) -> bool {
        self.0.contains_key(&server)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forget what an fsync made durable: the entries `synced` had, unless
    /// a write noted since changed them (it raced with the fsync).
    pub fn forget_synced(&mut self, synced: &Unsynced) {
        for (server, seen) in &synced.0 {
            if self.0.get(server) == Some(seen) {
                self.0.remove(server);
            }
        }
    }

    /// Whether `server`'s answer to an fsync, `verifier`, covers the writes
    /// noted for it: an error naming what may be lost if not.
    pub fn check(&self, server: ServerId, verifier: WriteVerifier) -> Result<()> {
        if self.covers(server, verifier) {
            return Ok(());
        }
        Err(ClientError::new(
            ErrorCode::Io,
            format!(
                "server {server}'s store restarted after a power loss (or was replaced) \
                 between writes of this file and their fsync: data written since the last \
                 successful fsync may be lost"
            ),
        ))
    }

    /// Whether `server`'s answer `verifier` covers the writes noted for it.
    fn covers(&self, server: ServerId, verifier: WriteVerifier) -> bool {
        match self.0.get(&server) {
            None => true,
            Some(seen) => *seen == Seen::One(verifier),
        }
    }

    /// `check` for every server an fsync went to, with its answer.
    pub fn check_answers(&self, servers: &[ServerId], answers: &[WriteVerifier]) -> Result<()> {
        debug_assert_eq!(servers.len(), answers.len());
        servers
            .iter()
            .zip(answers)
            .try_for_each(|(&s, &v)| self.check(s, v))
    }

    /// The first of `servers` whose answer does not cover what was noted
    /// for it.
    pub fn first_lost(&self, servers: &[ServerId], answers: &[WriteVerifier]) -> Option<ServerId> {
        debug_assert_eq!(servers.len(), answers.len());
        servers
            .iter()
            .zip(answers)
            .find(|(&s, &v)| !self.covers(s, v))
            .map(|(&s, _)| s)
    }

    /// What a sync of whole servers made durable: on each, the writes
    /// answered with the verifier it answered the sync with
    /// (`forget_synced` then keeps those answered by another, to report).
    pub fn answered(servers: &[ServerId], answers: &[WriteVerifier]) -> Unsynced {
        debug_assert_eq!(servers.len(), answers.len());
        Unsynced(
            servers
                .iter()
                .zip(answers)
                .map(|(&s, &v)| (s, Seen::One(v)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: WriteVerifier = WriteVerifier(11);
    const B: WriteVerifier = WriteVerifier(13);

    #[test]
    fn an_fsync_in_another_incarnation_fails_and_the_same_one_passes() {
        let mut u = Unsynced::default();
        u.note(ServerId(1), A);
        u.note(ServerId(1), A);
        assert!(u.check(ServerId(1), A).is_ok());
        assert_eq!(u.check(ServerId(1), B).unwrap_err().code, ErrorCode::Io);
        // A server not written to is not checked.
        assert!(u.check(ServerId(2), B).is_ok());
    }

    #[test]
    fn writes_answered_by_two_incarnations_fail_any_fsync() {
        let mut u = Unsynced::default();
        u.note(ServerId(0), A);
        u.note(ServerId(0), B);
        assert!(u.check(ServerId(0), A).is_err());
        assert!(u.check(ServerId(0), B).is_err());
        // Merging keeps the mark.
        let mut m = Unsynced::default();
        m.note(ServerId(0), B);
        m.merge(&u);
        assert!(m.check(ServerId(0), B).is_err());
    }

    #[test]
    fn the_first_lost_server_is_the_first_answer_that_differs() {
        let mut u = Unsynced::default();
        u.note(ServerId(1), A);
        u.note(ServerId(2), A);
        let servers = [ServerId(0), ServerId(1), ServerId(2)];
        assert_eq!(
            u.first_lost(&servers, &[B, A, A]),
            None,
            "0 was not changed"
        );
        assert_eq!(u.first_lost(&servers, &[A, A, B]), Some(ServerId(2)));
        assert_eq!(u.first_lost(&servers, &[A, B, B]), Some(ServerId(1)));
    }

    #[test]
    fn forgetting_keeps_writes_that_raced_with_the_fsync() {
        let mut u = Unsynced::default();
        u.note(ServerId(0), A);
        u.note(ServerId(1), A);
        let synced = u.clone();
        // A write answered by a new incarnation landed during the fsync.
        u.note(ServerId(1), B);
        u.forget_synced(&synced);
        assert_eq!(u.servers(), vec![ServerId(1)]);
        assert!(u.check(ServerId(1), B).is_err());
    }
}
