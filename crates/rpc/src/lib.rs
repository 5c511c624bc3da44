//! MadFS transport layer: the cluster file, authenticated TCP connections
//! that carry many requests in flight, the server's accept loop, and a pool
//! that opens connections on demand. Used by servers (to reach peers) and by
//! the client library alike, so both speak exactly the same protocol.

pub mod cluster;
pub mod conn;
pub mod error;
pub mod join;
pub mod pool;
pub mod serve;

pub use cluster::{ClusterConfig, ServerEntry};
pub use conn::{Connection, Response, SharedData};
pub use error::RpcError;
pub use pool::Pool;
pub use serve::{CallContext, Handler};
