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

pub(crate) fn rpc_err(e: RpcError) -> WireError {
    match e {
        RpcError::Remote(w) => w,
        other => err(other.code(), other.to_string()),
    }
}
