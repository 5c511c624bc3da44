//! MadFS wire protocol: framing, messages, numbered error codes and the
//! authentication handshake. Pure code with no I/O, so it can be fuzzed and
//! unit-tested in isolation; the `rpc` crate moves these bytes over sockets.

pub mod auth;
pub mod codec;
pub mod error;
pub mod find;
pub mod frame;
pub mod message;

pub use error::{ErrorCode, ProtoError, WireError};
pub use frame::{FrameHeader, FRAME_HEADER_BYTES};
pub use message::{Op, Opcode, Reply, Request, RunOnce};
