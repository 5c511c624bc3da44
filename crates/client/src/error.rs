//! The one error type of the client library: a wire error code (so every
//! caller maps it to the same errno through `ErrorCode::errno`) plus a message
//! that reads well when the CLI prints it.

use madfs_proto::ErrorCode;
use madfs_rpc::RpcError;
use madfs_types::NameError;
use std::fmt;

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClientError {
    pub code: ErrorCode,
    /// What was being done, e.g. "cannot remove '/a'"; may be empty.
    pub message: String,
}

pub type Result<T> = std::result::Result<T, ClientError>;

impl ClientError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ClientError {
        ClientError {
            code,
            message: message.into(),
        }
    }

    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        self.code.errno()
    }

    /// Whether this code says something about the transport rather than the
    /// file system: its message then holds the useful detail (which server,
    /// which address) and must survive when context is added.
    fn is_transport(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::Unavailable
                | ErrorCode::TimedOut
                | ErrorCode::AuthFailed
                | ErrorCode::Protocol
                | ErrorCode::Io
        )
    }

    /// Say what was being done. A file-system error's message is replaced
    /// (`cannot remove '/a': directory not empty` reads better than a server's
    /// internal detail); a transport error keeps its detail after the context.
    pub fn context(mut self, what: impl Into<String>) -> ClientError {
        let what = what.into();
        self.message = if self.is_transport() && !self.message.is_empty() {
            format!("{what}: {}", self.message)
        } else {
            what
        };
        self
    }

    pub(crate) fn protocol(what: impl Into<String>) -> ClientError {
        ClientError::new(ErrorCode::Protocol, what)
    }

    /// A server answered with a reply of the wrong kind.
    pub(crate) fn unexpected(op: &str, reply: &madfs_proto::Reply) -> ClientError {
        ClientError::protocol(format!("unexpected reply to {op}: {reply:?}"))
    }

    pub(crate) fn from_name(err: NameError, name: &[u8]) -> ClientError {
        let shown = String::from_utf8_lossy(name);
        match err {
            NameError::Empty => ClientError::new(ErrorCode::NotFound, "empty name"),
            NameError::TooLong => ClientError::new(
                ErrorCode::NameTooLong,
                format!("name '{shown}' is longer than 255 bytes"),
            ),
            NameError::Invalid => ClientError::new(
                ErrorCode::InvalidArgument,
                format!("invalid name '{shown}'"),
            ),
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.code.describe())
        } else {
            write!(f, "{}: {}", self.message, self.code.describe())
        }
    }
}

impl std::error::Error for ClientError {}

impl From<RpcError> for ClientError {
    fn from(e: RpcError) -> Self {
        let message = match &e {
            // The code is shown by Display; keep only the server's detail.
            RpcError::Remote(w) => w.message.clone(),
            other => other.to_string(),
        };
        ClientError {
            code: e.code(),
            message,
        }
    }
}

impl From<ClientError> for std::io::Error {
    fn from(e: ClientError) -> Self {
        std::io::Error::new(
            std::io::Error::from_raw_os_error(e.errno()).kind(),
            e.to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_reads_like_a_shell_message() {
        let e =
            ClientError::new(ErrorCode::NotEmpty, "server detail").context("cannot remove '/a'");
        assert_eq!(e.to_string(), "cannot remove '/a': directory not empty");
        assert_eq!(e.errno(), libc::ENOTEMPTY);
        assert_eq!(
            ClientError::new(ErrorCode::NotFound, "").to_string(),
            "no such file or directory"
        );
    }

    #[test]
    fn transport_detail_survives_context() {
        let e: ClientError = RpcError::Io("server 2 at 10.0.0.1:7000: refused".into()).into();
        assert_eq!(e.code, ErrorCode::Unavailable);
        let e = e.context("cannot stat '/x'");
        assert!(e
            .message
            .starts_with("cannot stat '/x': connection failed: server 2"));
    }

    #[test]
    fn remote_error_keeps_code() {
        let e: ClientError = RpcError::remote(ErrorCode::Exists, "x").into();
        assert_eq!(e.code, ErrorCode::Exists);
        assert_eq!(e.errno(), libc::EEXIST);
    }
}
