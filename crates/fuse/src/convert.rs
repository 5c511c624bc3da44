//! Conversions between the client library's types and fuser's: attributes,
//! times, names, and the one place where a `ClientError` becomes an errno.

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use madfs_client::{Attr, ClientError, ErrorCode, FileKind, FileName, TimeSet, Timestamp};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// st_blksize reported for every inode: programs size their I/O buffers by
/// it (cp, stdio), and anything below the mount's max_write (1 MiB) would
/// split a transfer into more FUSE round trips than needed.
pub const BLKSIZE: u32 = 1 << 20;

/// The single mapping from client errors to what the kernel sees, through
/// proto's `ErrorCode::errno` (via `ClientError::errno`). Transport failures
/// are logged with their detail (which server, what happened), since the
/// application only ever sees EIO or ETIMEDOUT.
pub fn errno(e: &ClientError) -> Errno {
    if matches!(
        e.code,
        ErrorCode::Unavailable
            | ErrorCode::TimedOut
            | ErrorCode::Protocol
            | ErrorCode::AuthFailed
            | ErrorCode::Io
    ) {
        tracing::warn!("madfs fuse: {e}");
    }
    Errno::from_i32(e.errno())
}

/// A name from the kernel as a MadFS file name, refused as the syscall
/// would refuse it (through the same ErrorCode -> errno mapping).
pub fn name(raw: &OsStr) -> Result<FileName, ClientError> {
    FileName::new(raw.as_bytes()).map_err(|e| {
        let code = match e {
            madfs_types::NameError::Empty => ErrorCode::NotFound,
            madfs_types::NameError::TooLong => ErrorCode::NameTooLong,
            madfs_types::NameError::Invalid => ErrorCode::InvalidArgument,
        };
        ClientError::new(code, format!("bad name {:?}", raw))
    })
}

pub fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

pub fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
    }
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        },
        Err(before) => {
            // Before the epoch: floor to whole seconds, nanos counting up.
            let d = before.duration();
            let mut secs = -(d.as_secs() as i64);
            let mut nanos = 0;
            if d.subsec_nanos() > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - d.subsec_nanos();
            }
            Timestamp { secs, nanos }
        }
    }
}

/// utimensat's three cases: the kernel leaves the field out for UTIME_OMIT,
/// sends "now" for UTIME_NOW (so the server's clock is used), else a time.
pub fn time_set(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(st)) => TimeSet::At(timestamp(st)),
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks(),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.btime),
        kind: kind(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for t in [
            Timestamp { secs: 0, nanos: 0 },
            Timestamp {
                secs: 1_700_000_000,
                nanos: 123_456_789,
            },
            Timestamp {
                secs: -1,
                nanos: 500_000_000,
            },
            Timestamp {
                secs: -86_400,
                nanos: 0,
            },
        ] {
            assert_eq!(timestamp(system_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn names_are_refused_with_the_syscall_errno() {
        assert_eq!(name(OsStr::new("ok")).unwrap().as_bytes(), b"ok");
        let long = "x".repeat(256);
        assert_eq!(
            name(OsStr::new(&long)).unwrap_err().errno(),
            libc::ENAMETOOLONG
        );
        assert_eq!(name(OsStr::new("..")).unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn errors_map_through_proto() {
        let e = ClientError::new(ErrorCode::NotEmpty, "x");
        assert_eq!(errno(&e), Errno::from_i32(libc::ENOTEMPTY));
        let e = ClientError::new(ErrorCode::Unavailable, "server 1 down");
        assert_eq!(errno(&e), Errno::EIO);
    }
}
