//! Prometheus metrics of one server, served over HTTP at `GET /metrics` on
//! the address `madfs server --metrics ADDR` (or the cluster file's
//! `metrics` of this server) gives, in the OpenMetrics text format that
//! `prometheus-client` encodes.
//!
//! Names follow Prometheus's conventions: base units (seconds, bytes),
//! counters end in `_total`, and labels come from bounded sets only (the
//! opcode, the wire error code, the kind of space), never a path or a user.
//! The list is in docs/ARCHITECTURE.md, "Metrics".
//!
//! The request path costs a lookup in an array indexed by opcode (every
//! per-operation counter and histogram is created up front), one counter
//! increment and one histogram observation; errors add a lookup in the
//! error family. Gauges of state (space, inodes, the find index, the
//! hardening counters of the rpc layer) are read at scrape time.

use crate::errors::OpResult;
use crate::service::Server;
use madfs_proto::{ErrorCode, Opcode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Content type of the exposition `prometheus_client::encoding::text` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Bytes of an HTTP request (line and headers) the endpoint reads at most.
const HTTP_REQUEST_MAX_BYTES: usize = 8192;
/// How long one scrape connection may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrape connections served at once.
const HTTP_CONNECTIONS_MAX: usize = 16;
/// Opcodes and error codes are u16 on the wire but small: the tables cover
/// this many values.
const CODE_TABLE_LEN: usize = 256;

/// Buckets of the latency histograms: 10 us doubling to about 10.5 s.
pub(crate) fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(10e-6, 2.0, 21)
}

/// The name of every opcode (its `Opcode` variant), indexed by its number.
fn op_names() -> &'static [Option<&'static str>] {
    static NAMES: OnceLock<Vec<Option<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| {
        (0..CODE_TABLE_LEN)
            .map(|v| {
                Opcode::from_u16(v as u16).map(|op| &*Box::leak(format!("{op:?}").into_boxed_str()))
            })
            .collect()
    })
}

/// The name of an error code (its `ErrorCode` variant).
fn code_name(code: ErrorCode) -> &'static str {
    static NAMES: OnceLock<Vec<Option<&'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..CODE_TABLE_LEN)
            .map(|v| {
                ErrorCode::from_u16(v as u16)
                    .map(|c| &*Box::leak(format!("{c:?}").into_boxed_str()))
            })
            .collect()
    });
    names
        .get(code as u16 as usize)
        .copied()
        .flatten()
        .unwrap_or("Other")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    op: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpaceLabels {
    kind: &'static str,
}

/// One operation's handles, resolved once.
struct OpMetrics {
    name: &'static str,
    requests: Counter,
    duration: Histogram,
}

/// Every metric of one server and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    ops: Vec<Option<OpMetrics>>,
    errors: Family<ErrorLabels, Counter>,
    read_bytes: Counter,
    written_bytes: Counter,
    // Read at scrape time.
    connections: Gauge,
    space: Family<SpaceLabels, Gauge>,
    inodes: Gauge,
    data_bytes: Gauge,
    find_index_bytes: Gauge,
    chunk_store_poisoned: Gauge,
    link_drops_failed: Counter<u64, AtomicU64>,
    link_drops_abandoned: Counter<u64, AtomicU64>,
    link_drops_waiting: Gauge,
    handler_panics: Counter<u64, AtomicU64>,
    protocol_errors: Counter<u64, AtomicU64>,
    invalidations_lost: Counter<u64, AtomicU64>,
}

impl Metrics {
    /// The metrics of a server whose sync rounds `sync` counts.
    pub fn new(sync: &crate::sync::SyncStats) -> Metrics {
        let mut registry = Registry::with_prefix("madfs");
        let requests = Family::<OpLabels, Counter>::default();
        let durations = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(latency_buckets())
        });
        let ops = op_names()
            .iter()
            .enumerate()
            .map(|(v, name)| {
                let name = (*name)?;
                // The handshake is not a request a handler serves.
                if v == Opcode::Challenge as usize || v == Opcode::Hello as usize {
                    return None;
                }
                let l = OpLabels { op: name };
                Some(OpMetrics {
                    name,
                    requests: requests.get_or_create(&l).clone(),
                    duration: durations.get_or_create(&l).clone(),
                })
            })
            .collect();
        registry.register("requests", "Requests served, by operation", requests);
        registry.register_with_unit(
            "request_duration",
            "Time from a request's decoding to its reply, by operation",
            Unit::Seconds,
            durations,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "request_errors",
            "Requests answered with an error, by operation and wire error code",
            errors.clone(),
        );
        let read_bytes = Counter::default();
        registry.register_with_unit(
            "read",
            "File data bytes sent in replies (reads, inline data of opens)",
            Unit::Bytes,
            read_bytes.clone(),
        );
        let written_bytes = Counter::default();
        registry.register_with_unit(
            "written",
            "File data bytes accepted from requests (writes, inline data of creates)",
            Unit::Bytes,
            written_bytes.clone(),
        );
        registry.register(
            "sync_rounds",
            "Rounds of the fsync coalescer (each syncs every dirty chunk file and the metadata log once)",
            sync.rounds.clone(),
        );
        registry.register_with_unit(
            "sync_duration",
            "Time one sync round took",
            Unit::Seconds,
            sync.duration.clone(),
        );
        let replication = crate::replication::stats();
        registry.register_with_unit(
            "replication_wait",
            "With replicas: how long answered requests waited, after their handler, for every replica in the set to apply their changes",
            Unit::Seconds,
            replication.wait.clone(),
        );
        registry.register_with_unit(
            "replica_shipment",
            "With replicas: round trip of one shipment of records (ReplicaApply) from this primary to a replica",
            Unit::Seconds,
            replication.shipment.clone(),
        );
        registry.register(
            "replica_records_shipped",
            "With replicas: records (metadata batches, chunk writes, truncates, purges, syncs) shipped to replicas and acknowledged",
            replication.records.clone(),
        );
        registry.register_with_unit(
            "replica_shipped",
            "With replicas: payload bytes shipped to replicas and acknowledged",
            Unit::Bytes,
            replication.bytes.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "connections",
            "RPC connections open (clients and peer servers)",
            connections.clone(),
        );
        let space = Family::<SpaceLabels, Gauge>::default();
        registry.register_with_unit(
            "space",
            "The data directory's file system: total, free, and available to unprivileged users",
            Unit::Bytes,
            space.clone(),
        );
        let inodes = Gauge::default();
        registry.register("inodes", "Inodes this server holds", inodes.clone());
        let data_bytes = Gauge::default();
        registry.register_with_unit(
            "chunk_data",
            "Bytes of file data in this server's chunk files",
            Unit::Bytes,
            data_bytes.clone(),
        );
        let find_index_bytes = Gauge::default();
        registry.register_with_unit(
            "find_index",
            "Memory of the in-memory dentry and inode copies find reads",
            Unit::Bytes,
            find_index_bytes.clone(),
        );
        let chunk_store_poisoned = Gauge::default();
        registry.register(
            "chunk_store_poisoned",
            "1 once a failed sync poisoned the chunk store (writes refused until restart), else 0",
            chunk_store_poisoned.clone(),
        );
        let link_drops_failed = Counter::<u64, AtomicU64>::default();
        registry.register(
            "link_drops_failed",
            "Links to drop on another server (a remote unlink's) whose send failed; sent again",
            link_drops_failed.clone(),
        );
        let link_drops_abandoned = Counter::<u64, AtomicU64>::default();
        registry.register(
            "link_drops_abandoned",
            "Links to drop on another server given up after 9 minutes unanswered (each a leak)",
            link_drops_abandoned.clone(),
        );
        let link_drops_waiting = Gauge::default();
        registry.register(
            "link_drops_waiting",
            "Links to drop on another server still unanswered at the last resend",
            link_drops_waiting.clone(),
        );
        let handler_panics = Counter::<u64, AtomicU64>::default();
        registry.register(
            "handler_panics",
            "Request handlers that panicked (each answered with an Io error)",
            handler_panics.clone(),
        );
        let protocol_errors = Counter::<u64, AtomicU64>::default();
        registry.register(
            "protocol_errors",
            "Connections closed because the peer sent malformed frames",
            protocol_errors.clone(),
        );
        let invalidations_lost = Counter::<u64, AtomicU64>::default();
        registry.register(
            "dir_invalidations_lost",
            "Directory permission invalidations sent to peers that did not acknowledge them",
            invalidations_lost.clone(),
        );
        Metrics {
            registry,
            ops,
            errors,
            read_bytes,
            written_bytes,
            connections,
            space,
            inodes,
            data_bytes,
            find_index_bytes,
            chunk_store_poisoned,
            link_drops_failed,
            link_drops_abandoned,
            link_drops_waiting,
            handler_panics,
            protocol_errors,
            invalidations_lost,
        }
    }

    /// Count one finished request: `op`, how long it took, the request's
    /// data bytes and its result.
    pub(crate) fn record(&self, op: Opcode, elapsed: Duration, data_in: usize, result: &OpResult) {
        let Some(m) = self.ops.get(op as u16 as usize).and_then(Option::as_ref) else {
            return;
        };
        m.requests.inc();
        m.duration.observe(elapsed.as_secs_f64());
        match result {
            Ok((_, data_out)) => {
                if !data_out.is_empty() {
                    self.read_bytes.inc_by(data_out.len() as u64);
                }
                if data_in > 0 {
                    self.written_bytes.inc_by(data_in as u64);
                }
            }
            Err(e) => {
                self.errors
                    .get_or_create(&ErrorLabels {
                        op: m.name,
                        code: code_name(e.code),
                    })
                    .inc();
            }
        }
    }

    /// Read the state gauges of `server` (and of this process's rpc layer).
    fn refresh(&self, server: &Server) {
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        let store = |c: &Counter<u64, AtomicU64>, v: u64| c.inner().store(v, Ordering::Relaxed);
        gauge(&self.connections, madfs_rpc::serve::connections());
        match server.statfs() {
            Ok(s) => {
                for (kind, v) in [
                    ("total", s.bytes_total),
                    ("free", s.bytes_free),
                    ("avail", s.bytes_avail),
                ] {
                    gauge(&self.space.get_or_create(&SpaceLabels { kind }), v);
                }
                gauge(&self.inodes, s.inodes);
                gauge(&self.data_bytes, s.data_bytes);
                gauge(&self.chunk_store_poisoned, u64::from(s.failure.is_some()));
            }
            Err(e) => tracing::warn!("metrics: statfs failed: {}", e.message),
        }
        gauge(&self.find_index_bytes, server.indexed.index_bytes() as u64);
        let drops = &server.link_drops;
        store(
            &self.link_drops_failed,
            drops.failed_sends.load(Ordering::Relaxed),
        );
        store(
            &self.link_drops_abandoned,
            drops.abandoned.load(Ordering::Relaxed),
        );
        gauge(
            &self.link_drops_waiting,
            drops.waiting.load(Ordering::Relaxed),
        );
        store(&self.handler_panics, madfs_rpc::serve::handler_panics());
        store(&self.protocol_errors, madfs_rpc::serve::protocol_errors());
        store(
            &self.invalidations_lost,
            server.dir_cache.invalidations_lost.load(Ordering::Relaxed),
        );
    }

    /// The exposition of every metric as they stand.
    fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Refresh the gauges from `server`, then encode.
    pub fn scrape(&self, server: &Server) -> String {
        self.refresh(server);
        self.encode()
    }
}

/// A server as the rpc layer sees it when its requests are counted (the
/// `Handler` is in dispatch.rs).
pub struct Metered {
    pub(crate) server: Arc<Server>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Metered {
    pub fn new(server: Arc<Server>, metrics: Arc<Metrics>) -> Metered {
        Metered { server, metrics }
    }
}

/// Serve `GET /metrics` on `listener` forever: a minimal HTTP/1.1
/// responder, one request per connection.
pub async fn serve_http(listener: TcpListener, server: Arc<Server>, metrics: Arc<Metrics>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (server, metrics) = (server.clone(), metrics.clone());
        tokio::spawn(async move {
            let scrape = || metrics.scrape(&server);
            let _ = tokio::time::timeout(HTTP_TIMEOUT, http_exchange(stream, scrape)).await;
            drop(permit);
        });
    }
}

/// Read one request from `stream` and answer it.
async fn http_exchange(mut stream: TcpStream, scrape: impl FnOnce() -> String) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = find_head_end(&buf) {
            break Some(i);
        }
        if buf.len() >= HTTP_REQUEST_MAX_BYTES {
            break None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let (status, content_type, body) = match head_end {
        None => (
            "431 Request Header Fields Too Large",
            "text/plain",
            String::new(),
        ),
        Some(end) => respond(&buf[..end], scrape),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Where the request head ends (the blank line), if it came whole.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

/// Status, content type and body for a request head.
fn respond(head: &[u8], scrape: impl FnOnce() -> String) -> (&'static str, &'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, scrape()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::err;
    use madfs_proto::Reply;

    fn metrics() -> Metrics {
        Metrics::new(&crate::sync::SyncStats::new())
    }

    fn value_of(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn every_opcode_has_a_name_and_the_handshake_no_series() {
        let m = metrics();
        let text = m.encode();
        assert!(value_of(&text, "madfs_requests_total{op=\"Write\"}") == Some(0.0));
        assert!(value_of(&text, "madfs_requests_total{op=\"TouchDir\"}") == Some(0.0));
        assert!(!text.contains("op=\"Hello\""));
        assert!(!text.contains("op=\"Challenge\""));
        assert_eq!(code_name(ErrorCode::NotFound), "NotFound");
        assert_eq!(code_name(ErrorCode::NoDevice), "NoDevice");
    }

    #[test]
    fn requests_bytes_and_errors_are_counted() {
        let m = metrics();
        let ok: OpResult = Ok((Reply::Empty, Vec::new()));
        m.record(Opcode::Write, Duration::from_micros(30), 4096, &ok);
        m.record(Opcode::Write, Duration::from_millis(3), 100, &ok);
        let read: OpResult = Ok((Reply::Empty, vec![0; 777]));
        m.record(Opcode::Read, Duration::from_micros(5), 0, &read);
        let failed: OpResult = Err(err(ErrorCode::NotFound, "no such file"));
        m.record(Opcode::Lookup, Duration::from_micros(50), 0, &failed);
        // A failed write's data was not written.
        let failed: OpResult = Err(err(ErrorCode::NoSpace, "full"));
        m.record(Opcode::Write, Duration::from_micros(50), 1000, &failed);
        let text = m.encode();
        assert_eq!(
            value_of(&text, "madfs_requests_total{op=\"Write\"}"),
            Some(3.0)
        );
        assert_eq!(
            value_of(&text, "madfs_request_duration_seconds_count{op=\"Write\"}"),
            Some(3.0)
        );
        // 30 us falls in the 40 us bucket, 3 ms in a later one.
        let le = |b: &str| {
            value_of(
                &text,
                &format!("madfs_request_duration_seconds_bucket{{le=\"{b}\",op=\"Write\"}}"),
            )
        };
        assert_eq!(le("0.00004"), Some(1.0), "{text}");
        assert_eq!(le("+Inf"), Some(3.0));
        assert_eq!(value_of(&text, "madfs_written_bytes_total"), Some(4196.0));
        assert_eq!(value_of(&text, "madfs_read_bytes_total"), Some(777.0));
        assert_eq!(
            value_of(
                &text,
                "madfs_request_errors_total{op=\"Lookup\",code=\"NotFound\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value_of(
                &text,
                "madfs_request_errors_total{op=\"Write\",code=\"NoSpace\"}"
            ),
            Some(1.0)
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn names_follow_the_conventions() {
        let m = metrics();
        m.record(
            Opcode::Lookup,
            Duration::from_micros(1),
            0,
            &Err(err(ErrorCode::Io, "x")),
        );
        let text = m.encode();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut w = line.split_whitespace().skip(2);
            let (name, kind) = (w.next().unwrap(), w.next().unwrap());
            assert!(name.starts_with("madfs_"), "{line}");
            assert!(!name.ends_with("_total"), "the encoder adds it: {line}");
            if kind == "histogram" {
                assert!(name.ends_with("_seconds"), "{line}");
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let counter = text.contains(&format!(
                "# TYPE {} counter",
                name.trim_end_matches("_total")
            ));
            assert_eq!(counter, name.ends_with("_total"), "{line}");
        }
    }

    #[test]
    fn the_endpoint_answers_only_get_metrics() {
        let scrape = || "x 1\n".to_string();
        let (s, t, b) = respond(b"GET /metrics HTTP/1.1\r\nHost: a", scrape);
        assert_eq!((s, t, b.as_str()), ("200 OK", CONTENT_TYPE, "x 1\n"));
        assert_eq!(respond(b"GET /metrics?x=1 HTTP/1.1", scrape).0, "200 OK");
        assert_eq!(respond(b"GET / HTTP/1.1", scrape).0, "404 Not Found");
        assert_eq!(
            respond(b"POST /metrics HTTP/1.1", scrape).0,
            "405 Method Not Allowed"
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"), Some(20));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[tokio::test]
    async fn the_endpoint_serves_over_tcp_and_bounds_requests() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(http_exchange(s, || "madfs_x 1\n".to_string()));
            }
        });
        let ask = |req: Vec<u8>| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&req).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let out = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()).await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Content-Length: 10\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nmadfs_x 1\n"), "{out}");
        let out = ask(vec![b'a'; HTTP_REQUEST_MAX_BYTES]).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }
}
