//! One authenticated TCP connection from a client (or a peer server) to a
//! server, carrying many requests in flight: each request has an id, a reader
//! task routes responses back to the waiting caller by that id. Callers never
//! write to the socket themselves: they queue whole encoded frames for one
//! writer task, so a caller dropped mid-call (read-ahead aborts its tasks)
//! cannot leave half a frame behind for every other caller to trip over.

use crate::error::RpcError;
use madfs_proto::auth::{self, Challenge, ClusterKey, Hello, Role};
use madfs_proto::frame::{FrameHeader, BODY_MAX_BYTES, DATA_MAX_BYTES, FRAME_HEADER_BYTES};
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
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

/// Requests one connection may have outstanding; callers beyond it wait.
pub const IN_FLIGHT_MAX: usize = 512;
/// Frames queued for a connection's writer task; callers beyond it wait.
pub const QUEUE_FRAMES_MAX: usize = 256;
/// Bytes of frames queued for a connection's writer task: lent data is
/// copied into its frame, so this bounds the copies (a larger frame waits
/// for the whole budget and then goes alone).
pub const QUEUE_BYTES_MAX: usize = 32 << 20;
/// Frames the writer sends with one vectored write (two parts each).
const WRITE_BATCH_FRAMES: usize = 64;
/// Parts given to one vectored write, below every system's IOV_MAX.
const IOV_MAX_PARTS: usize = 512;
/// Data sent on a connection and not acknowledged by the peer's kernel for
/// this long breaks the connection (TCP_USER_TIMEOUT). A peer's kernel
/// acknowledges what arrives however busy the process is, so only a
/// network cut or a dead host trips it. Without it a connection that lived
/// through a partition stayed open, its data waiting for TCP's doubling
/// retransmission timer: after a 10 s cut healed, the membership group's
/// messages on it went unanswered for 12 s more, and no failover could be
/// decided meanwhile. Broken instead, it is replaced by a new connection,
/// which gets through as soon as the network does.
pub const UNACKNOWLEDGED_MAX: Duration = Duration::from_secs(4);
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

/// Set up a connected socket, either side: no Nagle delay (requests and
/// replies are whole frames), and `UNACKNOWLEDGED_MAX`. Failures are
/// ignored: both are tuning, and a socket without them still works.
pub(crate) fn tune_socket(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let _ = stream.set_nodelay(true);
    let ms = libc::c_uint::try_from(UNACKNOWLEDGED_MAX.as_millis()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: the descriptor is the open socket `stream` owns for the
    // whole call; the option value is a c_uint on the stack, and its size
    // is passed with it.
    let _ = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
}

/// Write a frame: header and body in one buffer, bulk data straight from the
/// caller's slice (vectored, never copied through the serializer). Not
/// cancel-safe, as no partial write is: only for a stream one task owns
/// (the handshake, the server's responses under its writer lock).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: FrameHeader,
    body: &[u8],
    data: &[u8],
) -> std::io::Result<()> {
    let head = encode_head(header, body, data.len());
    write_all_vectored(w, &mut [&head, body, data]).await
}

/// Encode a frame header, asserting (in release builds too: a frame the
/// peer refuses closes the connection for every request on it, so a bug
/// must stop here, at its source) that the lengths are within the protocol
/// limits and that the header announces exactly the bytes that follow it.
fn encode_head(header: FrameHeader, body: &[u8], data_len: usize) -> [u8; FRAME_HEADER_BYTES] {
    assert!(
        body.len() <= BODY_MAX_BYTES as usize && data_len <= DATA_MAX_BYTES as usize,
        "frame of {} body and {data_len} data bytes exceeds the protocol limits",
        body.len()
    );
    let head = header.encode(body);
    assert_eq!(
        announced_len(&head),
        FRAME_HEADER_BYTES + body.len() + data_len,
        "frame header announces other lengths than the frame has"
    );
    head
}

/// The whole frame length an encoded header announces.
fn announced_len(head: &[u8; FRAME_HEADER_BYTES]) -> usize {
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    FRAME_HEADER_BYTES + word(16) as usize + word(20) as usize
}

/// Write every byte of `parts`, in order, with as few system calls as the
/// socket allows (one vectored write per call, at most `IOV_MAX_PARTS`).
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    parts: &mut [&[u8]],
) -> std::io::Result<()> {
    let mut first = 0;
    while let Some(slices) = unsent(parts, &mut first) {
        let n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        sent(parts, &mut first, n);
    }
    Ok(())
}

/// The parts from `first` on that are not yet sent, past empty ones, as
/// at most `IOV_MAX_PARTS` slices for one vectored write; None once all
/// are sent.
fn unsent<'a>(parts: &[&'a [u8]], first: &mut usize) -> Option<Vec<IoSlice<'a>>> {
    while *first < parts.len() && parts[*first].is_empty() {
        *first += 1;
    }
    (*first < parts.len()).then(|| {
        parts[*first..]
            .iter()
            .take(IOV_MAX_PARTS)
            .map(|p| IoSlice::new(p))
            .collect()
    })
}

/// `n` more bytes of `parts` went out: skip the parts sent whole and cut
/// the one sent in part.
fn sent(parts: &mut [&[u8]], first: &mut usize, mut n: usize) {
    while *first < parts.len() && n >= parts[*first].len() {
        n -= parts[*first].len();
        *first += 1;
    }
    if *first < parts.len() {
        parts[*first] = &parts[*first][n..];
    }
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

/// A request frame encoded and owned, queued for the connection's writer
/// task: the caller can be dropped the moment it is queued, the writer
/// still sends it whole.
struct OutFrame {
    /// Header and body; also the data when the caller only lent it.
    head: Vec<u8>,
    /// Data the caller handed over or shares, sent from where it is (no
    /// copy).
    data: SharedData,
    /// Its share of the queue's byte budget, given back once written.
    _bytes: OwnedSemaphorePermit,
}

/// Bytes a frame sends without copying them: a buffer it owns, or a range
/// of one it shares with the caller (the pieces of one write, each to its
/// server, share the write's buffer), or several of those one after the
/// other (the payloads of many replication records, each kept where its
/// record keeps it: gathering them into one buffer was a copy of every
/// byte replicated).
pub enum SharedData {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>, std::ops::Range<usize>),
    Pieces(Vec<SharedData>),
}

impl SharedData {
    pub fn len(&self) -> usize {
        match self {
            SharedData::Owned(v) => v.len(),
            SharedData::Shared(_, r) => r.len(),
            SharedData::Pieces(p) => p.iter().map(SharedData::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, in order, as slices onto `out`.
    pub fn slices<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        match self {
            SharedData::Owned(v) => out.push(v),
            SharedData::Shared(v, r) => out.push(&v[r.clone()]),
            SharedData::Pieces(p) => p.iter().for_each(|d| d.slices(out)),
        }
    }

    /// The bytes copied into one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut parts = Vec::new();
        self.slices(&mut parts);
        parts.concat()
    }
}

/// A request's bulk data as the caller gives it.
enum Payload<'a> {
    Lent(&'a [u8]),
    Given(SharedData),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Lent(d) => d.len(),
            Payload::Given(d) => d.len(),
        }
    }
}

impl OutFrame {
    fn new(
        header: FrameHeader,
        body: &[u8],
        data: Payload<'_>,
        bytes: OwnedSemaphorePermit,
    ) -> OutFrame {
        let data_len = data.len();
        let head = encode_head(header, body, data_len);
        let frame = match data {
            Payload::Lent(d) => {
                // The one copy a lent payload costs: the frame must own its
                // bytes to outlive a caller that is dropped.
                let mut buf = Vec::with_capacity(FRAME_HEADER_BYTES + body.len() + d.len());
                buf.extend_from_slice(&head);
                buf.extend_from_slice(body);
                buf.extend_from_slice(d);
                OutFrame {
                    head: buf,
                    data: SharedData::Owned(Vec::new()),
                    _bytes: bytes,
                }
            }
            Payload::Given(d) => {
                let mut buf = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
                buf.extend_from_slice(&head);
                buf.extend_from_slice(body);
                OutFrame {
                    head: buf,
                    data: d,
                    _bytes: bytes,
                }
            }
        };
        // In release builds too: a torn frame would break the connection.
        assert_eq!(
            frame.head.len() + frame.data.len(),
            announced_len(&head),
            "encoded frame length differs from what its header announces"
        );
        frame
    }
}

struct Shared {
    server: ServerId,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    in_flight: Semaphore,
    /// Bytes of encoded frames queued for (or being written by) the writer.
    queued_bytes: Arc<Semaphore>,
    call_timeout: Duration,
}

impl Shared {
    fn fail_all(&self, err: RpcError) {
        // Closed first, drained second: a caller registers its waiter and
        // then checks `closed`, so it either sees the flag or is drained.
        self.closed.store(true, Ordering::SeqCst);
        let waiters: Vec<Waiter> = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(err.clone()));
        }
    }

    fn closed_error(&self) -> RpcError {
        RpcError::Io(format!("connection to server {} is closed", self.server))
    }
}

/// A caller's entry in `pending`, removed when the caller is done or
/// dropped (a no-op when the reader already took it to answer).
struct Registered<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// A cheap-to-clone handle on one connection. When the last handle is
/// dropped the writer task ends and closes the socket's sending side, and
/// the server then closes the connection.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    queue: mpsc::Sender<OutFrame>,
}

impl Connection {
    /// Connect, authenticate with `key` (both ways), and start the reader
    /// and the writer.
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
            tune_socket(&stream);
            let (mut r, mut w) = stream.into_split();
            handshake(&mut r, &mut w, key, role, server).await?;
            Ok::<_, RpcError>((r, w))
        };
        let (r, w) = tokio::time::timeout(connect_timeout, fut)
            .await
            .map_err(|_| RpcError::Timeout(format!("connecting to server {server} at {addr}")))??;
        let shared = Arc::new(Shared {
            server,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            in_flight: Semaphore::new(IN_FLIGHT_MAX),
            queued_bytes: Arc::new(Semaphore::new(QUEUE_BYTES_MAX)),
            call_timeout,
        });
        let (queue, frames) = mpsc::channel(QUEUE_FRAMES_MAX);
        tokio::spawn(read_loop(r, shared.clone()));
        tokio::spawn(write_loop(w, frames, shared.clone()));
        Ok(Connection { shared, queue })
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    pub fn server(&self) -> ServerId {
        self.shared.server
    }

    /// Send one request and wait for its response. The data is copied into
    /// the queued frame; `call_owned` avoids that copy. Cancel-safe: the
    /// future may be dropped at any point without harm to the connection.
    pub async fn call(&self, req: &Request, data: &[u8]) -> Result<Response, RpcError> {
        self.send(req, Payload::Lent(data)).await
    }

    /// `call` for data the caller can give away: it is written from its own
    /// buffer, not copied.
    pub async fn call_owned(&self, req: &Request, data: Vec<u8>) -> Result<Response, RpcError> {
        self.send(req, Payload::Given(SharedData::Owned(data)))
            .await
    }

    /// `call` for data the caller shares (a range of a buffer it keeps an
    /// `Arc` of): written from that buffer, not copied.
    pub async fn call_shared(&self, req: &Request, data: SharedData) -> Result<Response, RpcError> {
        self.send(req, Payload::Given(data)).await
    }

    async fn send(&self, req: &Request, data: Payload<'_>) -> Result<Response, RpcError> {
        let s = &*self.shared;
        if self.is_closed() {
            return Err(s.closed_error());
        }
        let body = req.encode();
        let opcode = req.op.opcode();
        // What the server would refuse, and so close the connection over,
        // fails this call alone (and never reaches encode_head's asserts).
        if body.len() > BODY_MAX_BYTES as usize {
            return Err(ProtoError::BodyTooLong(saturating_u32(body.len())).into());
        }
        if data.len() > DATA_MAX_BYTES as usize {
            return Err(ProtoError::DataTooLong(saturating_u32(data.len())).into());
        }
        if data.len() > 0 && !Op::carries_data(opcode) {
            return Err(ProtoError::UnexpectedData(opcode as u16).into());
        }
        let _permit = s.in_flight.acquire().await.map_err(|_| s.closed_error())?;
        // One deadline for queueing and answering: a server that stops
        // reading must fail its callers in time, not strand them in the queue.
        let deadline = Instant::now() + s.call_timeout;
        let too_slow = || {
            RpcError::Timeout(format!(
                "server {} did not answer {opcode:?} within {:?}",
                s.server, s.call_timeout
            ))
        };
        let frame_len = FRAME_HEADER_BYTES + body.len() + data.len();
        let bytes = u32::try_from(frame_len.min(QUEUE_BYTES_MAX)).unwrap_or(u32::MAX);
        let bytes = timeout_at(deadline, s.queued_bytes.clone().acquire_many_owned(bytes))
            .await
            .map_err(|_| too_slow())?
            .map_err(|_| s.closed_error())?;
        let slot = timeout_at(deadline, self.queue.reserve())
            .await
            .map_err(|_| too_slow())?
            .map_err(|_| s.closed_error())?;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        s.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let _registered = Registered { shared: s, id };
        if self.is_closed() {
            return Err(s.closed_error());
        }
        let frame = OutFrame::new(
            header(opcode as u16, RequestId(id), false, 0, data.len()),
            &body,
            data,
            bytes,
        );
        // Synchronous from here to the queue: once queued the frame is the
        // writer's, and it goes out whole whatever becomes of this caller.
        slot.send(frame);
        match timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RpcError::Io(format!(
                "connection to server {} closed",
                s.server
            ))),
            Err(_) => Err(too_slow()),
        }
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `write_all_vectored` for a client's connection, with `MSG_NOSIGNAL`: a
/// server that died leaves a socket whose next send fails with EPIPE, and
/// a plain write then also raises SIGPIPE, whose default action kills the
/// process. Rust programs ignore it, but the interception library runs in
/// the user's program (a C program keeps the default) and drives its
/// sockets on the program's own thread: IOR through `madfs run` died of
/// it when two servers were killed (scripts/soak-failover-tools).
async fn send_all(w: &OwnedWriteHalf, parts: &mut [&[u8]]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let stream: &TcpStream = w.as_ref();
    let mut first = 0;
    while let Some(slices) = unsent(parts, &mut first) {
        stream.writable().await?;
        let result = stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix;
            // the message points at `slices`, which outlives the call, and
            // at no address or control data; the descriptor is the open
            // socket `stream` owns.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = slices.len() as _;
                libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        let n = match result {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        sent(parts, &mut first, n);
    }
    Ok(())
}

/// The one task that writes to a connection's socket, so a frame is only
/// ever written whole, whatever becomes of its caller. Sends what has
/// queued up in one vectored write; ends when every handle is dropped.
async fn write_loop(w: OwnedWriteHalf, mut frames: mpsc::Receiver<OutFrame>, s: Arc<Shared>) {
    let mut batch: Vec<OutFrame> = Vec::with_capacity(WRITE_BATCH_FRAMES);
    while frames.recv_many(&mut batch, WRITE_BATCH_FRAMES).await > 0 {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * batch.len());
        for f in &batch {
            parts.push(&f.head);
            f.data.slices(&mut parts);
        }
        if let Err(e) = send_all(&w, &mut parts).await {
            // No more frames in; then fail every caller waiting, including
            // those whose frames were queued and will never go out.
            frames.close();
            s.fail_all(RpcError::Io(format!("sending to server {}: {e}", s.server)));
            return;
        }
        // Frees the frames and gives their bytes back to the queue budget.
        batch.clear();
    }
    // Dropping `w` shuts down the sending side: the server sees the end.
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
    // The challenge names the server reached; after a failover it may
    // serve `server`'s set as well, which it says by accepting `want`.
    let challenge = Challenge::decode(&frame.body)?;
    let client_nonce = random_nonce();
    let hello = Hello {
        role,
        client_nonce,
        proof: key.client_proof(role, &challenge.server_nonce, &client_nonce),
        want: server,
    };
    let body = hello.encode();
    let head = encode_head(
        header(Opcode::Hello as u16, RequestId(0), false, 0, 0),
        &body,
        0,
    );
    send_all(w, &mut [&head, &body])
        .await
        .map_err(|e| RpcError::Io(e.to_string()))?;
    let frame = read_frame(r, |_| false).await?.ok_or_else(|| {
        RpcError::Auth("server closed the connection (wrong cluster key?)".into())
    })?;
    if frame.header.status == ErrorCode::Stale as u16 {
        let msg = decode_error_message(&frame.body).unwrap_or_default();
        return Err(RpcError::Moved(msg));
    }
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
