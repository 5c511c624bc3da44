//! Transport errors, and how each maps to a wire error code (and so errno).

use madfs_proto::{ErrorCode, ProtoError, WireError};
use std::fmt;

#[derive(Debug, Clone)]
pub enum RpcError {
    /// The server answered with an error.
    Remote(WireError),
    /// Could not connect, or the connection broke.
    Io(String),
    /// The peer sent bytes that are not valid MadFS frames.
    Protocol(ProtoError),
    /// The handshake failed: wrong cluster key or not a MadFS server.
    Auth(String),
    /// No answer in time.
    Timeout(String),
    /// The cluster file or key is unusable.
    Config(String),
    /// The server reached does not serve the replica set asked for (it
    /// moved to another server in a failover, or not yet back).
    Moved(String),
}

impl RpcError {
    /// The wire code standing for this error (for errno mapping).
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Remote(e) => e.code,
            RpcError::Io(_) => ErrorCode::Unavailable,
            RpcError::Protocol(_) => ErrorCode::Protocol,
            RpcError::Auth(_) => ErrorCode::AuthFailed,
            RpcError::Timeout(_) => ErrorCode::TimedOut,
            RpcError::Config(_) => ErrorCode::InvalidArgument,
            RpcError::Moved(_) => ErrorCode::Unavailable,
        }
    }

    pub fn remote(code: ErrorCode, message: impl Into<String>) -> RpcError {
        RpcError::Remote(WireError::new(code, message))
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Remote(e) => write!(f, "{e}"),
            RpcError::Io(m) => write!(f, "connection failed: {m}"),
            RpcError::Protocol(e) => write!(f, "protocol error: {e}"),
            RpcError::Auth(m) => write!(f, "authentication failed: {m}"),
            RpcError::Timeout(m) => write!(f, "timed out: {m}"),
            RpcError::Config(m) => write!(f, "bad cluster configuration: {m}"),
            RpcError::Moved(m) => write!(f, "not served there: {m}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<ProtoError> for RpcError {
    fn from(e: ProtoError) -> Self {
        RpcError::Protocol(e)
    }
}
