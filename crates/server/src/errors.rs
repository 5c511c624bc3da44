//! Wire errors the server's operations answer with, made from the errors of
//! the layers below (metadata store, chunk files, peer calls).

use madfs_proto::{ErrorCode, Reply, WireError};
use madfs_rpc::RpcError;
use std::future::Future;
use std::pin::Pin;

pub(crate) type OpResult = Result<(Reply, Vec<u8>), WireError>;
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(crate) fn err(code: ErrorCode, msg: impl Into<String>) -> WireError {
    WireError::new(code, msg)
}

pub(crate) fn kv_err(e: madfs_kv::KvError) -> WireError {
    let code = if e.is_no_space() {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    err(code, format!("metadata store: {e}"))
}

pub(crate) fn io_err(e: std::io::Error) -> WireError {
    WireError::new(ErrorCode::from_io(&e), format!("chunk store: {e}"))
}

/// `io_err` for a write of chunk data, the first change its request makes:
/// refused by a store whose set moved away (`ChunkMirror::admit`), it ran
/// nothing, so it is `Unavailable`, which the caller's pool sends again
/// to the set's new primary once it learns the move.
pub(crate) fn chunk_write_err(e: std::io::Error) -> WireError {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<madfs_kv::KvError>())
        .is_some_and(madfs_kv::KvError::is_refused);
    match refused {
        true => WireError::new(ErrorCode::Unavailable, format!("chunk store: {e}")),
        false => io_err(e),
    }
}

pub(crate) fn rpc_err(e: RpcError) -> WireError {
    match e {
        RpcError::Remote(w) => w,
        other => err(other.code(), other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_write_refused_by_a_deposed_store_is_sent_again_elsewhere() {
        let refused = std::io::Error::other(madfs_kv::KvError::Refused("set 1 moved".into()));
        let e = chunk_write_err(refused);
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.message.contains("set 1 moved"), "{e}");
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(chunk_write_err(full).code, ErrorCode::NoSpace);
        let other = std::io::Error::other(madfs_kv::KvError::Io("disk".into()));
        assert_eq!(chunk_write_err(other).code, ErrorCode::Io);
    }
}
