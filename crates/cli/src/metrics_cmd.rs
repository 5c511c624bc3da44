//! Reading the servers' Prometheus metrics (crates/server/src/metrics.rs):
//! fetch `GET /metrics` over plain HTTP, parse it with `prometheus-parse`,
//! and sum it up as operations per second and p99 latency for `madfs
//! status` (`summaries`) and `madfs metrics` (`show`).

use madfs_rpc::ClusterConfig;
use madfs_types::ServerId;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of a response read at most.
const RESPONSE_MAX_BYTES: u64 = 64 << 20;
/// The interval `madfs status` and `madfs metrics` measure rates over.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// The text of `http://addr/metrics`.
pub fn fetch(addr: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, FETCH_TIMEOUT).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(FETCH_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(FETCH_TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: application/openmetrics-text, text/plain\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{addr}: {e}"))?;
    let mut raw = Vec::new();
    s.take(RESPONSE_MAX_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| format!("{addr}: {e}"))?;
    let text = String::from_utf8(raw).map_err(|_| format!("{addr}: response is not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: malformed HTTP response"))?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{addr}: {status}"));
    }
    Ok(body.to_string())
}

/// The figures of one scrape that the summaries use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Requests served, all operations.
    pub requests: f64,
    /// Requests answered with an error.
    pub errors: f64,
    pub read_bytes: f64,
    pub written_bytes: f64,
    pub sync_rounds: f64,
    pub connections: f64,
    /// Request latency buckets of every operation together: (upper bound
    /// in seconds, cumulative count), ascending, ending at +Inf.
    pub latency: Vec<(f64, f64)>,
}

impl Figures {
    /// Parse an exposition (OpenMetrics or Prometheus text).
    pub fn parse(text: &str) -> Result<Figures, String> {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .map_err(|e| format!("parsing metrics: {e}"))?;
        let mut f = Figures::default();
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for s in &scrape.samples {
            use prometheus_parse::Value;
            let v = match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                Value::Histogram(h) => {
                    if s.metric == "madfs_request_duration_seconds" {
                        for b in h {
                            match buckets.iter_mut().find(|(le, _)| *le == b.less_than) {
                                Some((_, c)) => *c += b.count,
                                None => buckets.push((b.less_than, b.count)),
                            }
                        }
                    }
                    continue;
                }
                Value::Summary(_) => continue,
            };
            match s.metric.as_str() {
                "madfs_requests_total" => f.requests += v,
                "madfs_request_errors_total" => f.errors += v,
                "madfs_read_bytes_total" => f.read_bytes += v,
                "madfs_written_bytes_total" => f.written_bytes += v,
                "madfs_sync_rounds_total" => f.sync_rounds += v,
                "madfs_connections" => f.connections += v,
                _ => {}
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        f.latency = buckets;
        Ok(f)
    }
}

/// The latency below which `q` (0..1) of the requests in `buckets` fell,
/// interpolated within its bucket as Prometheus's `histogram_quantile`
/// does; None without requests. A quantile in the +Inf bucket is the
/// largest finite bound.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = count - below;
            let share = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * share);
        }
        (lower, below) = (le, count);
    }
    Some(lower)
}

/// What `madfs status` shows of one server's metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Requests per second over the interval.
    pub ops_per_sec: f64,
    /// 99th percentile of request latency over the interval, in seconds
    /// (None: no request in it).
    pub p99_seconds: Option<f64>,
    /// The same since the server started.
    pub p99_since_start_seconds: Option<f64>,
    /// Bytes per second read and written over the interval.
    pub read_bytes_per_sec: f64,
    pub written_bytes_per_sec: f64,
    /// Totals at the second scrape.
    pub last: Figures,
}

impl Summary {
    /// The rates between two scrapes `elapsed` apart.
    pub fn between(first: &Figures, last: &Figures, elapsed: Duration) -> Summary {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = |a: f64, b: f64| (b - a).max(0.0) / secs;
        let delta: Vec<(f64, f64)> = last
            .latency
            .iter()
            .map(|&(le, c)| {
                let before = first
                    .latency
                    .iter()
                    .find(|(l, _)| *l == le)
                    .map_or(0.0, |b| b.1);
                (le, (c - before).max(0.0))
            })
            .collect();
        Summary {
            ops_per_sec: rate(first.requests, last.requests),
            p99_seconds: quantile(&delta, 0.99),
            p99_since_start_seconds: quantile(&last.latency, 0.99),
            read_bytes_per_sec: rate(first.read_bytes, last.read_bytes),
            written_bytes_per_sec: rate(first.written_bytes, last.written_bytes),
            last: last.clone(),
        }
    }

    /// "1234.5 ops/s, p99 1.23 ms" (the p99 since start in parentheses when
    /// the interval saw no request).
    pub fn short(&self) -> String {
        let p99 = match (self.p99_seconds, self.p99_since_start_seconds) {
            (Some(p), _) => format!("p99 {}", duration(p)),
            (None, Some(p)) => format!("p99 - ({} since start)", duration(p)),
            (None, None) => "p99 -".into(),
        };
        format!("{:.1} ops/s, {p99}", self.ops_per_sec)
    }
}

/// Seconds as "850 us", "1.23 ms" or "2.50 s".
pub fn duration(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.0} us", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

/// Scrape every address, wait `interval`, scrape them again, and sum up
/// each: the same order as `addrs`. Servers are scraped in parallel, so the
/// whole takes about `interval` however many there are.
pub fn summaries(addrs: &[SocketAddr], interval: Duration) -> Vec<Result<Summary, String>> {
    let scrape_all = || -> Vec<(Instant, Result<Figures, String>)> {
        std::thread::scope(|s| {
            let handles: Vec<_> = addrs
                .iter()
                .map(|&a| {
                    s.spawn(move || {
                        let r = fetch(a).and_then(|t| Figures::parse(&t));
                        (Instant::now(), r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (Instant::now(), Err("scrape panicked".into())))
                })
                .collect()
        })
    };
    let first = scrape_all();
    std::thread::sleep(interval);
    let last = scrape_all();
    first
        .into_iter()
        .zip(last)
        .map(|((t0, a), (t1, b))| Ok(Summary::between(&a?, &b?, t1 - t0)))
        .collect()
}

/// The metrics address of each server of `cfg` (None: not configured).
pub fn addresses(cfg: &ClusterConfig) -> Vec<(ServerId, Option<SocketAddr>)> {
    cfg.servers
        .iter()
        .map(|s| (ServerId(s.id), s.metrics))
        .collect()
}

/// `madfs metrics`: one server's summary, from the cluster file's
/// metrics address of `server` or from `address`.
pub fn show(
    cluster: Option<&Path>,
    server: u16,
    address: Option<SocketAddr>,
    interval: Duration,
) -> Result<ExitCode, String> {
    let addr = match address {
        Some(a) => a,
        None => {
            let path = ClusterConfig::locate(cluster);
            let cfg = ClusterConfig::load(&path).map_err(|e| e.to_string())?;
            let entry = cfg
                .server(ServerId(server))
                .ok_or_else(|| format!("no server {server} in {}", path.display()))?;
            entry.metrics.ok_or_else(|| {
                format!(
                    "server {server} has no metrics address in {} (give --address, \
                     the one its --metrics says)",
                    path.display()
                )
            })?
        }
    };
    let s = summaries(&[addr], interval)
        .pop()
        .expect("one address, one summary")?;
    let f = &s.last;
    let p99 = |p: Option<f64>| p.map_or("-".to_string(), duration);
    println!("metrics         http://{addr}/metrics");
    println!("operations/s    {:.1}", s.ops_per_sec);
    println!("p99 latency     {}", p99(s.p99_seconds));
    println!("p99 since start {}", p99(s.p99_since_start_seconds));
    println!("read bytes/s    {:.0}", s.read_bytes_per_sec);
    println!("written bytes/s {:.0}", s.written_bytes_per_sec);
    println!("requests        {}", f.requests);
    println!("errors          {}", f.errors);
    println!("read bytes      {}", f.read_bytes);
    println!("written bytes   {}", f.written_bytes);
    println!("sync rounds     {}", f.sync_rounds);
    println!("connections     {}", f.connections);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP madfs_requests Requests served, by operation.
# TYPE madfs_requests counter
madfs_requests_total{op=\"Lookup\"} 90
madfs_requests_total{op=\"Write\"} 10
# TYPE madfs_request_duration_seconds histogram
# UNIT madfs_request_duration_seconds seconds
madfs_request_duration_seconds_sum{op=\"Lookup\"} 0.01
madfs_request_duration_seconds_count{op=\"Lookup\"} 90
madfs_request_duration_seconds_bucket{le=\"0.001\",op=\"Lookup\"} 90
madfs_request_duration_seconds_bucket{le=\"0.002\",op=\"Lookup\"} 90
madfs_request_duration_seconds_bucket{le=\"+Inf\",op=\"Lookup\"} 90
madfs_request_duration_seconds_sum{op=\"Write\"} 0.01
madfs_request_duration_seconds_count{op=\"Write\"} 10
madfs_request_duration_seconds_bucket{le=\"0.001\",op=\"Write\"} 0
madfs_request_duration_seconds_bucket{le=\"0.002\",op=\"Write\"} 10
madfs_request_duration_seconds_bucket{le=\"+Inf\",op=\"Write\"} 10
# TYPE madfs_written_bytes counter
# UNIT madfs_written_bytes bytes
madfs_written_bytes_total 4096
# TYPE madfs_connections gauge
madfs_connections 3
# EOF
";

    #[test]
    fn an_exposition_is_summed_over_operations() {
        let f = Figures::parse(TEXT).unwrap();
        assert_eq!(f.requests, 100.0);
        assert_eq!(f.written_bytes, 4096.0);
        assert_eq!(f.connections, 3.0);
        assert_eq!(
            f.latency,
            vec![(0.001, 90.0), (0.002, 100.0), (f64::INFINITY, 100.0)]
        );
        // Rank 99 of 100: nine tenths into the (1 ms, 2 ms] bucket.
        let p99 = quantile(&f.latency, 0.99).unwrap();
        assert!((p99 - 0.0019).abs() < 1e-9, "{p99}");
        let p50 = quantile(&f.latency, 0.5).unwrap();
        assert!((p50 - 0.001 * 50.0 / 90.0).abs() < 1e-12, "{p50}");
        assert_eq!(quantile(&[(f64::INFINITY, 0.0)], 0.99), None);
        assert_eq!(
            quantile(&[(0.1, 1.0), (f64::INFINITY, 5.0)], 0.99),
            Some(0.1)
        );
    }

    #[test]
    fn rates_come_from_the_difference_of_two_scrapes() {
        let first = Figures::parse(TEXT).unwrap();
        let mut last = first.clone();
        last.requests += 50.0;
        last.written_bytes += 1000.0;
        for b in &mut last.latency {
            if b.0 >= 0.002 {
                b.1 += 50.0;
            }
        }
        let s = Summary::between(&first, &last, Duration::from_millis(500));
        assert_eq!(s.ops_per_sec, 100.0);
        assert_eq!(s.written_bytes_per_sec, 2000.0);
        // Every request of the interval was in (1 ms, 2 ms].
        assert!((s.p99_seconds.unwrap() - 0.00199).abs() < 1e-9);
        assert!(
            s.short().starts_with("100.0 ops/s, p99 1.99 ms"),
            "{}",
            s.short()
        );
        let idle = Summary::between(&first, &first, Duration::from_secs(1));
        assert_eq!(idle.p99_seconds, None);
        assert!(idle.short().contains("since start"));
    }
}
