//! The server side of the transport: accept connections, authenticate them,
//! read requests and run each in its own task (so one connection carries
//! many in flight), and write responses back as they finish.

use crate::conn::{
    header, random_nonce, read_data, read_frame, read_head, write_frame, READ_BUFFER_BYTES,
};
use crate::error::RpcError;
use crate::{log_debug, log_warn};
use madfs_proto::auth::{self, Challenge, ClusterKey, Hello, Role};
use madfs_proto::message::{encode_error_message, Op};
use madfs_proto::{ErrorCode, Opcode, Reply, Request, WireError};
use madfs_types::{RequestId, ServerId};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};

/// Requests one connection may have running at once; beyond it the server
/// stops reading from that connection (backpressure, bounded memory).
pub const SERVER_IN_FLIGHT_MAX: usize = 256;
/// Connections one server accepts at once.
pub const CONNECTIONS_MAX: usize = 4096;
/// Bulk bytes (request data plus the data Read requests will return) one
/// server holds at once over all connections: beyond it the server stops
/// reading requests that carry or ask for data until earlier ones finish,
/// so memory is bounded in bytes and not only in request counts.
pub const BULK_BYTES_BUDGET: usize = 1 << 30;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct CallContext {
    pub role: Role,
    pub peer: SocketAddr,
}

/// What a server does with requests.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(Reply, Vec<u8>), WireError>> + Send;
}

/// Accept connections forever.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    server_id: ServerId,
    key: ClusterKey,
    handler: Arc<H>,
) {
    serve_with_budget(listener, server_id, key, handler, BULK_BYTES_BUDGET).await
}

/// `serve` with another bulk-bytes budget (tests use a small one).
pub async fn serve_with_budget<H: Handler>(
    listener: TcpListener,
    server_id: ServerId,
    key: ClusterKey,
    handler: Arc<H>,
    budget_bytes: usize,
) {
    let budget = Arc::new(Budget {
        bytes: Arc::new(Semaphore::new(budget_bytes)),
        total: budget_bytes,
    });
    let key = Arc::new(key);
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let permit = match slots.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => return,
        };
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                log_warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (key, handler, budget) = (key.clone(), handler.clone(), budget.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, server_id, &key, handler, budget).await {
                log_warn!("connection from {peer} closed: {e}");
            }
            drop(permit);
        });
    }
}

/// The server-wide budget of bulk bytes.
struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    /// Wait until `n` bytes fit (a request larger than the whole budget
    /// waits for all of it, so it still runs, alone).
    async fn reserve(
        &self,
        n: usize,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, RpcError> {
        let n = n.min(self.total);
        if n == 0 {
            return Ok(None);
        }
        let n = u32::try_from(n).map_err(|_| RpcError::Io("bulk budget above 4 GiB".into()))?;
        self.bytes
            .clone()
            .acquire_many_owned(n)
            .await
            .map(Some)
            .map_err(|_| RpcError::Io("server shutting down".into()))
    }
}

async fn connection<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    server_id: ServerId,
    key: &ClusterKey,
    handler: Arc<H>,
    budget: Arc<Budget>,
) -> Result<(), RpcError> {
    let (mut r, mut w) = stream.into_split();
    let role = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        accept_handshake(&mut r, &mut w, server_id, key),
    )
    .await
    .map_err(|_| RpcError::Timeout("handshake".into()))??;
    log_debug!("{peer} authenticated as {role:?}");
    let ctx = CallContext { role, peer };
    // Buffered: a header and its body usually arrive in one read call.
    let mut r = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let writer = Arc::new(Mutex::new(w));
    let in_flight = Arc::new(Semaphore::new(SERVER_IN_FLIGHT_MAX));
    loop {
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| RpcError::Io("closed".into()))?;
        let head = read_head(&mut r, |h| {
            Opcode::from_u16(h.opcode).is_some_and(Op::carries_data)
        })
        .await?;
        let Some((h, body)) = head else {
            return Ok(());
        };
        if h.is_response {
            return Err(ProtoErrorMsg("client sent a response frame").into());
        }
        // A malformed request closes the connection: after a decode error
        // we cannot trust where the next frame starts.
        let req = Request::decode(h.opcode, &body)?;
        let bulk = h.data_len as usize
            + match req.op {
                Op::Read { len, .. } => len as usize,
                Op::Open { data_max, .. } => {
                    (data_max as u64).min(madfs_types::limits::INLINE_DATA_MAX_BYTES) as usize
                }
                _ => 0,
            };
        let bytes_permit = budget.reserve(bulk).await?;
        let data = read_data(&mut r, &h).await?;
        let (handler, writer) = (handler.clone(), writer.clone());
        tokio::spawn(async move {
            let result = if req.op.opcode().is_peer_only() && ctx.role != Role::Peer {
                Err(WireError::new(
                    ErrorCode::NotPermitted,
                    "peer operation from a client",
                ))
            } else {
                handler.handle(ctx, req, data).await
            };
            let (status, body, data) = match result {
                Ok((reply, data)) => (0, reply.encode(), data),
                Err(e) => (e.code as u16, encode_error_message(&e.message), Vec::new()),
            };
            let mut w = writer.lock().await;
            if let Err(e) = write_frame(
                &mut *w,
                header(h.opcode, h.request_id, true, status, data.len()),
                &body,
                &data,
            )
            .await
            {
                log_debug!("writing response to {}: {e}", ctx.peer);
            }
            drop(permit);
            drop(bytes_permit);
        });
    }
}

struct ProtoErrorMsg(&'static str);
impl From<ProtoErrorMsg> for RpcError {
    fn from(m: ProtoErrorMsg) -> Self {
        RpcError::Protocol(madfs_proto::ProtoError::BadValue(m.0))
    }
}

async fn accept_handshake(
    r: &mut tokio::net::tcp::OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    server_id: ServerId,
    key: &ClusterKey,
) -> Result<Role, RpcError> {
    let server_nonce = random_nonce();
    let challenge = Challenge {
        server_id,
        server_nonce,
    };
    write_frame(
        w,
        header(Opcode::Challenge as u16, RequestId(0), true, 0, 0),
        &challenge.encode(),
        &[],
    )
    .await
    .map_err(|e| RpcError::Io(e.to_string()))?;
    let frame = read_frame(r, |_| false)
        .await?
        .ok_or_else(|| RpcError::Io("closed during handshake".into()))?;
    if frame.header.opcode != Opcode::Hello as u16 {
        return Err(RpcError::Auth(format!(
            "expected Hello, got opcode {}",
            frame.header.opcode
        )));
    }
    let hello = Hello::decode(&frame.body)?;
    let expected = key.client_proof(hello.role, &server_nonce, &hello.client_nonce);
    if !auth::proofs_equal(&expected, &hello.proof) {
        let msg = encode_error_message("wrong cluster key");
        let _ = write_frame(
            w,
            header(
                Opcode::Hello as u16,
                RequestId(0),
                true,
                ErrorCode::AuthFailed as u16,
                0,
            ),
            &msg,
            &[],
        )
        .await;
        return Err(RpcError::Auth(
            "client presented a wrong cluster key".into(),
        ));
    }
    let welcome = auth::encode_welcome(&key.server_proof(&server_nonce, &hello.client_nonce));
    write_frame(
        w,
        header(Opcode::Hello as u16, RequestId(0), true, 0, 0),
        &welcome,
        &[],
    )
    .await
    .map_err(|e| RpcError::Io(e.to_string()))?;
    Ok(hello.role)
}
