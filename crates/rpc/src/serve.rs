//! The server side of the transport: accept connections, authenticate them,
//! read requests and run each in its own task (so one connection carries
//! many in flight), and write responses back as they finish. A handler that
//! panics costs its own request an error reply, not the caller's whole call
//! timeout and not the connection.

use crate::conn::{
    header, random_nonce, read_data, read_frame, read_head, write_frame, READ_BUFFER_BYTES,
};
use crate::error::RpcError;
use madfs_proto::auth::{self, Challenge, ClusterKey, Hello, Role};
use madfs_proto::frame::{BODY_MAX_BYTES, DATA_MAX_BYTES};
use madfs_proto::message::{encode_error_message, Op};
use madfs_proto::{ErrorCode, Opcode, Reply, Request, WireError};
use madfs_types::{RequestId, ServerId};
use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
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
/// Longest delay `MADFS_NET_DELAY_US` may add each way.
const NET_DELAY_MAX: Duration = Duration::from_millis(100);

static HANDLER_PANICS: AtomicU64 = AtomicU64::new(0);
static PROTOCOL_ERRORS: AtomicU64 = AtomicU64::new(0);
static CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// The one-way delay this server adds to every request before handling it
/// and to every response before sending it, from `MADFS_NET_DELAY_US`
/// (at most 100 ms; unset or 0: none). A test seam: this machine's kernel
/// has no netem, so the namespace tests give every link, server-to-server
/// ones included, the round trip of a real network this way. Each frame is
/// delayed in its own task, so frames keep their spacing (a delay line, not
/// a rate limit).
pub fn net_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let us = madfs_types::env_number("MADFS_NET_DELAY_US")?;
        let d = Duration::from_micros(us).min(NET_DELAY_MAX);
        (!d.is_zero()).then_some(d)
    })
}

/// Request handlers that panicked in this process since it started (each
/// was answered with an Io error); for a server's status report.
pub fn handler_panics() -> u64 {
    HANDLER_PANICS.load(Ordering::Relaxed)
}

/// Connections this process's servers closed because the peer sent bytes
/// that are not valid frames (bad magic, checksum, lengths, encodings).
pub fn protocol_errors() -> u64 {
    PROTOCOL_ERRORS.load(Ordering::Relaxed)
}

/// Connections this process's servers have open now (accepted and not yet
/// closed, handshake included).
pub fn connections() -> u64 {
    CONNECTIONS.load(Ordering::Relaxed)
}

/// One open connection in `CONNECTIONS`, until dropped.
struct OpenConnection;

impl OpenConnection {
    fn new() -> OpenConnection {
        CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        CONNECTIONS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct CallContext {
    pub role: Role,
    pub peer: SocketAddr,
    /// The replica set the connection is for (its Hello's `want`).
    pub set: ServerId,
}

/// What a server does with requests.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(Reply, Vec<u8>), WireError>> + Send;

    /// Whether this server takes connections for replica set `set`; by
    /// default only its own (`home`, the id the server listens as).
    fn serves(&self, set: ServerId, home: ServerId) -> bool {
        set == home
    }
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
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        crate::conn::tune_socket(&stream);
        let (key, handler, budget) = (key.clone(), handler.clone(), budget.clone());
        let open = OpenConnection::new();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, server_id, &key, handler, budget).await {
                if matches!(e, RpcError::Protocol(_)) {
                    PROTOCOL_ERRORS.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!("connection from {peer} closed: {e}");
            }
            drop(permit);
            drop(open);
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
    let serves = |set| handler.serves(set, server_id);
    let (role, set) = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        accept_handshake(&mut r, &mut w, server_id, key, &serves),
    )
    .await
    .map_err(|_| RpcError::Timeout("handshake".into()))??;
    tracing::debug!("{peer} authenticated as {role:?} for set {set}");
    let ctx = CallContext { role, peer, set };
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
        let delay = net_delay();
        tokio::spawn(async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            let opcode = req.op.opcode();
            // Everything that runs the handler or encodes what it returned
            // is caught: a panic there must still answer the caller (who
            // would otherwise wait out its whole call timeout) and must not
            // take the connection's other requests down with it.
            // Boxed: the handler's future is large (14 KB in a test build:
            // every operation's state machine), and tokio moves a task's
            // whole future several times (into its cell, through each
            // stage); a move of a box is a pointer.
            let work = Box::pin(async {
                let result = if opcode.is_peer_only() && ctx.role != Role::Peer {
                    Err(WireError::new(
                        ErrorCode::NotPermitted,
                        "peer operation from a client",
                    ))
                } else {
                    handler.handle(ctx, req, data).await
                };
                response(opcode, result)
            });
            let (status, body, data) = match CatchUnwind(work).await {
                Ok(response) => response,
                Err(payload) => {
                    let total = HANDLER_PANICS.fetch_add(1, Ordering::Relaxed) + 1;
                    let what = panic_message(payload.as_ref());
                    tracing::warn!(
                        "request handler panicked on {opcode:?} from {} ({total} so far): {what}",
                        ctx.peer
                    );
                    error_response(&WireError::new(
                        ErrorCode::Io,
                        format!("server bug: request handler panicked: {what}"),
                    ))
                }
            };
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            let mut w = writer.lock().await;
            if let Err(e) = write_frame(
                &mut *w,
                header(h.opcode, h.request_id, true, status, data.len()),
                &body,
                &data,
            )
            .await
            {
                tracing::debug!("writing response to {}: {e}", ctx.peer);
            }
            drop(w);
            // Released on every path, the panicking one included.
            drop(permit);
            drop(bytes_permit);
        });
    }
}

/// Status, body and data of the response to a request with `opcode`. A
/// reply the client would refuse (too long for a frame, or with data the
/// opcode does not carry) would close the connection for every request on
/// it, so it becomes an error for this request alone.
fn response(
    opcode: Opcode,
    result: Result<(Reply, Vec<u8>), WireError>,
) -> (u16, Vec<u8>, Vec<u8>) {
    let (reply, data) = match result {
        Ok(ok) => ok,
        Err(e) => return error_response(&e),
    };
    let body = reply.encode();
    let fault = if body.len() > BODY_MAX_BYTES as usize || data.len() > DATA_MAX_BYTES as usize {
        Some(format!(
            "reply of {} body and {} data bytes exceeds the frame limits",
            body.len(),
            data.len()
        ))
    } else if !data.is_empty() && !Op::replies_with_data(opcode) {
        Some(format!(
            "{} data bytes in a reply that carries none",
            data.len()
        ))
    } else {
        None
    };
    match fault {
        None => (0, body, data),
        Some(fault) => {
            tracing::warn!("server bug: {opcode:?}: {fault}");
            error_response(&WireError::new(
                ErrorCode::Io,
                format!("server bug: {fault}"),
            ))
        }
    }
}

fn error_response(e: &WireError) -> (u16, Vec<u8>, Vec<u8>) {
    (e.code as u16, encode_error_message(&e.message), Vec::new())
}

/// Polls a future, turning a panic inside it into `Err(payload)`. What
/// `futures::FutureExt::catch_unwind` does, without the dependency; the
/// future is `Unpin` (pinned by the caller), so no unsafe projection.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        // Unwind safety: after a panic the future is only dropped, never
        // polled again, and what it shared with other tasks is the handler,
        // which must cope with panics anyway (a panicking task without
        // this wrapper unwinds just the same).
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// The text of a panic payload (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
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
    serves: &(dyn Fn(ServerId) -> bool + Sync),
) -> Result<(Role, ServerId), RpcError> {
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
    if !serves(hello.want) {
        let why = format!("server {server_id} does not serve set {}", hello.want);
        let _ = write_frame(
            w,
            header(
                Opcode::Hello as u16,
                RequestId(0),
                true,
                ErrorCode::Stale as u16,
                0,
            ),
            &encode_error_message(&why),
            &[],
        )
        .await;
        return Err(RpcError::Remote(WireError::new(ErrorCode::Stale, why)));
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
    Ok((hello.role, hello.want))
}
