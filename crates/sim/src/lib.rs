//! Deterministic simulation of a MadFS cluster, in the manner of
//! TigerBeetle's VOPR and FoundationDB's simulator: the real server code
//! (several `Server`s) and real clients run in one process, on one thread,
//! over an in-process network with a seeded scheduler and faults (lost and
//! delayed messages, server crashes and restarts at any moment, full
//! disks), driven by random namespace operations and checked after every
//! step against a model. See docs/ARCHITECTURE.md, "Deterministic
//! simulation", for what is real, what is simulated, and how to replay.

pub mod disk;
pub mod model;
pub mod net;
pub mod replicated;
pub mod run;

pub use run::{run, Failure, Outcome, RenameRaces, SimConfig};
