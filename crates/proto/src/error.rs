//! Error codes on the wire (numbered explicitly, never reordered) and the one
//! place where they map to errno; plus the decoder's own error type.

use std::fmt;

/// A failure reported by a server, as it travels in a response header.
/// The numbers are part of the protocol: add new ones at the end.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    NotFound = 1,
    Exists = 2,
    NotEmpty = 3,
    NotDir = 4,
    IsDir = 5,
    CrossDevice = 6,
    AccessDenied = 7,
    NotPermitted = 8,
    NameTooLong = 9,
    InvalidArgument = 10,
    NoSpace = 11,
    Io = 12,
    TooManyLinks = 13,
    FileTooBig = 14,
    NotSupported = 15,
    Busy = 16,
    TryAgain = 17,
    Stale = 18,
    Protocol = 19,
    AuthFailed = 20,
    Loop = 21,
    TimedOut = 22,
    Unavailable = 23,
    BadFileHandle = 24,
    /// Opening a FIFO, socket or device node where no kernel serves it
    /// (the interception library, the CLI): ENXIO, as opening a socket is.
    NoDevice = 25,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => NotFound,
            2 => Exists,
            3 => NotEmpty,
            4 => NotDir,
            5 => IsDir,
            6 => CrossDevice,
            7 => AccessDenied,
            8 => NotPermitted,
            9 => NameTooLong,
            10 => InvalidArgument,
            11 => NoSpace,
            12 => Io,
            13 => TooManyLinks,
            14 => FileTooBig,
            15 => NotSupported,
            16 => Busy,
            17 => TryAgain,
            18 => Stale,
            19 => Protocol,
            20 => AuthFailed,
            21 => Loop,
            22 => TimedOut,
            23 => Unavailable,
            24 => BadFileHandle,
            25 => NoDevice,
            _ => return None,
        })
    }

    /// The errno a POSIX caller sees for this code. The only place in MadFS
    /// that maps wire codes to errno; FUSE, preload and CLI all use it.
    pub fn errno(self) -> i32 {
        use ErrorCode::*;
        match self {
            NotFound => libc::ENOENT,
            Exists => libc::EEXIST,
            NotEmpty => libc::ENOTEMPTY,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            CrossDevice => libc::EXDEV,
            AccessDenied => libc::EACCES,
            NotPermitted => libc::EPERM,
            NameTooLong => libc::ENAMETOOLONG,
            InvalidArgument => libc::EINVAL,
            NoSpace => libc::ENOSPC,
            Io => libc::EIO,
            TooManyLinks => libc::EMLINK,
            FileTooBig => libc::EFBIG,
            NotSupported => libc::ENOTSUP,
            Busy => libc::EBUSY,
            TryAgain => libc::EAGAIN,
            Stale => libc::ESTALE,
            Protocol => libc::EPROTO,
            AuthFailed => libc::EACCES,
            Loop => libc::ELOOP,
            TimedOut => libc::ETIMEDOUT,
            Unavailable => libc::EIO,
            BadFileHandle => libc::EBADF,
            NoDevice => libc::ENXIO,
        }
    }

    /// A short human description, used by the CLI (like strerror).
    pub fn describe(self) -> &'static str {
        use ErrorCode::*;
        match self {
            NotFound => "no such file or directory",
            Exists => "file exists",
            NotEmpty => "directory not empty",
            NotDir => "not a directory",
            IsDir => "is a directory",
            CrossDevice => "invalid cross-device link",
            AccessDenied => "permission denied",
            NotPermitted => "operation not permitted",
            NameTooLong => "file name too long",
            InvalidArgument => "invalid argument",
            NoSpace => "no space left on device",
            Io => "input/output error",
            TooManyLinks => "too many links",
            FileTooBig => "file too large",
            NotSupported => "operation not supported",
            Busy => "device or resource busy",
            TryAgain => "resource temporarily unavailable",
            Stale => "stale file handle",
            Protocol => "protocol error",
            AuthFailed => "authentication failed (wrong cluster key?)",
            Loop => "too many levels of symbolic links",
            TimedOut => "timed out",
            Unavailable => "server unavailable",
            BadFileHandle => "bad file descriptor",
            NoDevice => "no such device or address",
        }
    }

    /// Map an OS error from a server's local disk to a wire code.
    pub fn from_io(err: &std::io::Error) -> ErrorCode {
        match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorCode::NoSpace,
            Some(libc::ENOENT) => ErrorCode::NotFound,
            Some(libc::EACCES) => ErrorCode::AccessDenied,
            Some(libc::EFBIG) => ErrorCode::FileTooBig,
            _ => ErrorCode::Io,
        }
    }
}

/// An error as carried in a response: the code plus a readable message.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.code.describe())
        } else {
            write!(f, "{}: {}", self.code.describe(), self.message)
        }
    }
}

impl std::error::Error for WireError {}

/// Why bytes could not be decoded. Any of these closes the connection.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ProtoError {
    /// The input ended before the value did.
    Truncated,
    /// A message had bytes left after its last field.
    TrailingBytes(usize),
    BadMagic(u32),
    BadVersion(u8),
    BadChecksum {
        expected: u32,
        actual: u32,
    },
    BodyTooLong(u32),
    DataTooLong(u32),
    UnknownOpcode(u16),
    UnknownErrorCode(u16),
    /// Bulk data attached to a message that never carries any.
    UnexpectedData(u16),
    /// A field held a value outside its domain.
    BadValue(&'static str),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Truncated => write!(f, "message truncated"),
            ProtoError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after message"),
            ProtoError::BadMagic(m) => write!(f, "bad frame magic {m:#010x} (not a MadFS peer?)"),
            ProtoError::BadVersion(v) => write!(f, "unsupported protocol version {v}"),
            ProtoError::BadChecksum { expected, actual } => {
                write!(f, "frame checksum mismatch: header says {expected:#010x}, computed {actual:#010x}")
            }
            ProtoError::BodyTooLong(n) => write!(f, "frame body of {n} bytes exceeds the limit"),
            ProtoError::DataTooLong(n) => write!(f, "frame data of {n} bytes exceeds the limit"),
            ProtoError::UnknownOpcode(op) => write!(f, "unknown opcode {op}"),
            ProtoError::UnknownErrorCode(c) => write!(f, "unknown error code {c}"),
            ProtoError::UnexpectedData(op) => write!(f, "opcode {op} carries no bulk data"),
            ProtoError::BadValue(what) => write!(f, "invalid value for {what}"),
        }
    }
}

impl std::error::Error for ProtoError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_maps_to_errno() {
        for v in 0..=u16::MAX {
            if let Some(code) = ErrorCode::from_u16(v) {
                assert_eq!(code as u16, v);
                assert!(code.errno() > 0);
                assert!(!code.describe().is_empty());
            }
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::NotEmpty.errno(), libc::ENOTEMPTY);
        assert_eq!(ErrorCode::CrossDevice.errno(), libc::EXDEV);
    }
}
