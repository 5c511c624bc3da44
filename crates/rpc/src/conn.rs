//! One authenticated TCP connection from a client (or a peer server) to a
//! server, carrying many requests in flight: each request has an id, a reader
//! task routes responses back to the waiting caller by that id.

use crate::error::RpcError;
use madfs_proto::auth::{self, Challenge, ClusterKey, Hello, Role};
use madfs_proto::frame::{FrameHeader, FRAME_HEADER_BYTES};
use madfs_proto::message::{decode_error_message, Op};
use madfs_proto::{ErrorCode, Opcode, ProtoError, Reply, Request, WireError};
use madfs_types::{RequestId, ServerId};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};

/// Requests one connection may have outstanding; callers beyond it wait.
pub const IN_FLIGHT_MAX: usize = 512;
/// Read buffer of a connection's reader (larger reads bypass it).
pub(crate) const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A decoded frame: header, body bytes, bulk data.
pub struct Frame {
    pub header: FrameHeader,
    pub body: Vec<u8>,
    pub data: Vec<u8>,
}

/// Read one frame, checking every length before allocating and the checksum
/// before returning. `data_allowed` says whether bulk data may follow for a
/// given opcode: anything else with data is refused before it is read.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    data_allowed: impl Fn(&FrameHeader) -> bool,
) -> Result<Option<Frame>, RpcError> {
    let Some((header, body)) = read_head(r, data_allowed).await? else {
        return Ok(None);
    };
    let data = read_data(r, &header).await?;
    Ok(Some(Frame { header, body, data }))
}

/// The first part of `read_frame`: header and checked body, so a server can
/// reserve memory for the bulk data (or wait for it) before reading it.
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    data_allowed: impl Fn(&FrameHeader) -> bool,
) -> Result<Option<(FrameHeader, Vec<u8>)>, RpcError> {
    let mut raw = [0u8; FRAME_HEADER_BYTES];
    match r.read_exact(&mut raw).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(RpcError::Io(e.to_string())),
    }
    let header = FrameHeader::decode(&raw)?;
    if header.data_len > 0 && !data_allowed(&header) {
        return Err(ProtoError::UnexpectedData(header.opcode).into());
    }
    let mut body = vec![0u8; header.body_len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(|e| RpcError::Io(format!("reading body: {e}")))?;
    header.verify_body(&raw, &body)?;
    Ok(Some((header, body)))
}

/// The rest of `read_frame`: the bulk data announced by `header`.
pub async fn read_data<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &FrameHeader,
) -> Result<Vec<u8>, RpcError> {
    // Read into spare capacity: zeroing a megabyte first would cost as
    // much as a copy of it.
    let len = header.data_len as usize;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        // Bounded: the capacity may exceed `len`, and the bytes after it
        // belong to the next frame.
        let n = (&mut *r)
            .take((len - data.len()) as u64)
            .read_buf(&mut data)
            .await
            .map_err(|e| RpcError::Io(format!("reading data: {e}")))?;
        if n == 0 {
            return Err(RpcError::Io(format!(
                "reading data: connection closed after {} of {len} bytes",
                data.len()
            )));
        }
    }
    Ok(data)
}

/// Write a frame: header and body in one buffer, bulk data straight from the
/// caller's slice (vectored, never copied through the serializer).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: FrameHeader,
    body: &[u8],
    data: &[u8],
) -> std::io::Result<()> {
    let head = header.encode(body);
    let mut parts: [&[u8]; 3] = [&head, body, data];
    let mut first = 0;
    while first < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[first..].iter().map(|p| IoSlice::new(p)).collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < parts.len() && n >= parts[first].len() {
            n -= parts[first].len();
            first += 1;
        }
        if first < parts.len() {
            parts[first] = &parts[first][n..];
        }
        while first < parts.len() && parts[first].is_empty() {
            first += 1;
        }
    }
    Ok(())
}

pub(crate) fn header(
    opcode: u16,
    id: RequestId,
    response: bool,
    status: u16,
    data_len: usize,
) -> FrameHeader {
    FrameHeader {
        is_response: response,
        opcode,
        request_id: id,
        body_len: 0, // filled from the body by encode()
        data_len: data_len as u32,
        status,
        checksum: 0,
    }
}

/// A successful response.
#[derive(Debug)]
pub struct Response {
    pub reply: Reply,
    /// Bulk data (Read replies).
    pub data: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<Response, RpcError>>;

struct Shared {
    server: ServerId,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    in_flight: Semaphore,
    call_timeout: Duration,
}

impl Shared {
    fn fail_all(&self, err: RpcError) {
        self.closed.store(true, Ordering::SeqCst);
        let waiters: Vec<Waiter> = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(err.clone()));
        }
    }
}

/// A cheap-to-clone handle on one connection.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

impl Connection {
    /// Connect, authenticate with `key` (both ways), and start the reader.
    pub async fn connect(
        server: ServerId,
        addr: SocketAddr,
        key: &ClusterKey,
        role: Role,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> Result<Connection, RpcError> {
        let fut = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| RpcError::Io(format!("server {server} at {addr}: {e}")))?;
            let _ = stream.set_nodelay(true);
            let (mut r, mut w) = stream.into_split();
            handshake(&mut r, &mut w, key, role, server).await?;
            Ok::<_, RpcError>((r, w))
        };
        let (r, w) = tokio::time::timeout(connect_timeout, fut)
            .await
            .map_err(|_| RpcError::Timeout(format!("connecting to server {server} at {addr}")))??;
        let shared = Arc::new(Shared {
            server,
            writer: tokio::sync::Mutex::new(w),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            in_flight: Semaphore::new(IN_FLIGHT_MAX),
            call_timeout,
        });
        tokio::spawn(read_loop(r, shared.clone()));
        Ok(Connection { shared })
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    pub fn server(&self) -> ServerId {
        self.shared.server
    }

    /// Send one request and wait for its response.
    pub async fn call(&self, req: &Request, data: &[u8]) -> Result<Response, RpcError> {
        let s = &self.shared;
        if self.is_closed() {
            return Err(RpcError::Io(format!(
                "connection to server {} is closed",
                s.server
            )));
        }
        let _permit = s
            .in_flight
            .acquire()
            .await
            .map_err(|_| RpcError::Io("closed".into()))?;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        s.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let body = req.encode();
        let opcode = req.op.opcode() as u16;
        debug_assert!(data.is_empty() || Op::carries_data(req.op.opcode()));
        let written = {
            let mut w = s.writer.lock().await;
            write_frame(
                &mut *w,
                header(opcode, RequestId(id), false, 0, data.len()),
                &body,
                data,
            )
            .await
        };
        if let Err(e) = written {
            let err = RpcError::Io(format!("sending to server {}: {e}", s.server));
            s.fail_all(err.clone());
            return Err(err);
        }
        match tokio::time::timeout(s.call_timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RpcError::Io(format!(
                "connection to server {} closed",
                s.server
            ))),
            Err(_) => {
                s.pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                Err(RpcError::Timeout(format!(
                    "server {} did not answer {:?} within {:?}",
                    s.server,
                    req.op.opcode(),
                    s.call_timeout
                )))
            }
        }
    }
}

async fn handshake(
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    key: &ClusterKey,
    role: Role,
    server: ServerId,
) -> Result<(), RpcError> {
    let frame = read_frame(r, |_| false)
        .await?
        .ok_or_else(|| RpcError::Io("server closed the connection before the challenge".into()))?;
    if frame.header.opcode != Opcode::Challenge as u16 {
        return Err(RpcError::Auth("server did not send a challenge".into()));
    }
    let challenge = Challenge::decode(&frame.body)?;
    if challenge.server_id != server {
        return Err(RpcError::Config(format!(
            "expected server {server} but reached server {}",
            challenge.server_id
        )));
    }
    let client_nonce = random_nonce();
    let hello = Hello {
        role,
        client_nonce,
        proof: key.client_proof(role, &challenge.server_nonce, &client_nonce),
    };
    write_frame(
        w,
        header(Opcode::Hello as u16, RequestId(0), false, 0, 0),
        &hello.encode(),
        &[],
    )
    .await
    .map_err(|e| RpcError::Io(e.to_string()))?;
    let frame = read_frame(r, |_| false).await?.ok_or_else(|| {
        RpcError::Auth("server closed the connection (wrong cluster key?)".into())
    })?;
    if frame.header.status != 0 {
        let msg = decode_error_message(&frame.body).unwrap_or_default();
        return Err(RpcError::Auth(msg));
    }
    let proof = auth::decode_welcome(&frame.body)?;
    if !auth::proofs_equal(
        &proof,
        &key.server_proof(&challenge.server_nonce, &client_nonce),
    ) {
        return Err(RpcError::Auth(
            "server could not prove it holds the cluster key".into(),
        ));
    }
    Ok(())
}

pub(crate) fn random_nonce() -> auth::Nonce {
    let mut n = [0u8; auth::NONCE_BYTES];
    getrandom::getrandom(&mut n).expect("the OS random source is available");
    n
}

async fn read_loop(r: OwnedReadHalf, s: Arc<Shared>) {
    // Buffered: a header and its body usually arrive in one read call.
    let mut r = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let err = loop {
        // Responses carry data only for reads and opens; the opcode says which.
        let frame = match read_frame(&mut r, |h| {
            Opcode::from_u16(h.opcode).is_some_and(Op::replies_with_data)
        })
        .await
        {
            Ok(Some(f)) => f,
            Ok(None) => break RpcError::Io(format!("server {} closed the connection", s.server)),
            Err(e) => break e,
        };
        let waiter = s
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&frame.header.request_id.0);
        let Some(waiter) = waiter else { continue }; // the caller timed out
        let result = if frame.header.status != 0 {
            let code = ErrorCode::from_u16(frame.header.status).unwrap_or(ErrorCode::Io);
            match decode_error_message(&frame.body) {
                Ok(message) => Err(RpcError::Remote(WireError { code, message })),
                Err(e) => Err(RpcError::Protocol(e)),
            }
        } else {
            Reply::decode(&frame.body)
                .map(|reply| Response {
                    reply,
                    data: frame.data,
                })
                .map_err(RpcError::Protocol)
        };
        let _ = waiter.send(result);
    };
    s.fail_all(err);
}
