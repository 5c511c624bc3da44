//! Every server's Prometheus endpoint, scraped over HTTP and parsed by a
//! real text-format parser (`prometheus-parse`): the counters move by at
//! least what a client did (requests by operation, bytes written and read,
//! errors by code, sync rounds), each histogram counts what its counter
//! does, and the names follow Prometheus's conventions.

mod common;

use common::{pattern, Options, TestCluster};
use madfs_client::{BlockingClient, OpenOptions};
use prometheus_parse::{Scrape, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// (status line, headers, body) of `GET path` on `addr`.
fn http_get(addr: SocketAddr, path: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// One scrape: the text and what the parser made of it.
struct Scraped {
    text: String,
    parsed: Scrape,
}

fn scrape(addr: SocketAddr) -> Scraped {
    let (status, headers, text) = http_get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}\n{text}");
    assert!(
        headers.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{headers}"
    );
    let parsed = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
    Scraped { text, parsed }
}

/// The sum of `metric`'s samples whose labels include `labels` (for a
/// histogram: its count, the +Inf bucket).
fn sum(s: &Scraped, metric: &str, labels: &[(&str, &str)]) -> f64 {
    s.parsed
        .samples
        .iter()
        .filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(h) => {
                h.iter()
                    .find(|b| b.less_than.is_infinite())
                    .expect("a +Inf bucket")
                    .count
            }
            Value::Summary(_) => panic!("no summaries expected"),
        })
        .sum()
}

fn sum_all(s: &[Scraped], metric: &str, labels: &[(&str, &str)]) -> f64 {
    s.iter().map(|x| sum(x, metric, labels)).sum()
}

/// Every metric is madfs_*, counters end in _total, histograms in _seconds,
/// metrics with a unit end in it; only the bounded labels appear.
fn check_conventions(s: &Scraped) {
    let mut types = std::collections::HashMap::new();
    for line in s.text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name.starts_with("madfs_"), "{line}");
            types.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# UNIT ") {
            let (name, unit) = rest.split_once(' ').unwrap();
            assert!(
                ["seconds", "bytes"].contains(&unit),
                "base units only: {line}"
            );
            assert!(name.ends_with(&format!("_{unit}")), "{line}");
        }
    }
    for (name, kind) in &types {
        match kind.as_str() {
            "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
            "counter" => assert!(!name.ends_with("_total"), "{name}"),
            "gauge" => {}
            other => panic!("unexpected type {other} of {name}"),
        }
    }
    for x in &s.parsed.samples {
        let base = x
            .metric
            .strip_suffix("_total")
            .or_else(|| x.metric.strip_suffix("_count"))
            .or_else(|| x.metric.strip_suffix("_sum"))
            .filter(|b| types.contains_key(*b))
            .unwrap_or(&x.metric);
        let kind = types
            .get(base)
            .unwrap_or_else(|| panic!("{} has no TYPE", x.metric));
        if kind == "counter" {
            assert!(x.metric.ends_with("_total"), "{}", x.metric);
        }
        for (k, _) in x.labels.iter() {
            assert!(
                ["op", "code", "kind"].contains(&k.as_str()),
                "{k} on {}",
                x.metric
            );
        }
    }
    for m in [
        "madfs_requests_total",
        "madfs_request_duration_seconds",
        "madfs_read_bytes_total",
        "madfs_written_bytes_total",
        "madfs_sync_rounds_total",
        "madfs_sync_duration_seconds",
        "madfs_connections",
        "madfs_space_bytes",
        "madfs_inodes",
        "madfs_find_index_bytes",
        "madfs_chunk_store_poisoned",
        "madfs_handler_panics_total",
        "madfs_protocol_errors_total",
        "madfs_dir_invalidations_lost_total",
    ] {
        assert!(
            s.parsed.samples.iter().any(|x| x.metric == m),
            "no {m} in\n{}",
            s.text
        );
    }
}

#[test]
fn counters_move_by_what_the_clients_did() {
    let tc = TestCluster::start_with(
        2,
        Options {
            metrics: true,
            ..Default::default()
        },
    );
    let addrs: Vec<SocketAddr> = tc
        .config()
        .servers
        .iter()
        .map(|s| s.metrics.expect("a metrics address"))
        .collect();
    let before: Vec<Scraped> = addrs.iter().map(|&a| scrape(a)).collect();
    for s in &before {
        check_conventions(s);
    }

    let c = BlockingClient::from_client(tc.client()).unwrap();
    let counts0 = c.request_counts();
    c.mkdir("/m", 0o755).unwrap();
    const SMALL: usize = 10;
    for i in 0..SMALL {
        c.write_file(format!("/m/small{i}"), &pattern(i as u64, 100))
            .unwrap();
    }
    let big = pattern(99, 3 << 20);
    let f = c
        .open("/m/big", OpenOptions::new().write(true).create(true))
        .unwrap();
    f.write_at(0, &big).unwrap();
    f.fsync().unwrap();
    f.close().unwrap();
    assert!(c.stat("/m/missing").is_err());
    let counts = c.request_counts().since(&counts0);
    // A client with nothing cached reads everything from the servers.
    let reader = BlockingClient::from_client(tc.client()).unwrap();
    let counts1 = reader.request_counts();
    assert_eq!(reader.read_file("/m/big").unwrap(), big);
    let read_counts = reader.request_counts().since(&counts1);

    let after: Vec<Scraped> = addrs.iter().map(|&a| scrape(a)).collect();
    let moved = |metric: &str, labels: &[(&str, &str)]| {
        sum_all(&after, metric, labels) - sum_all(&before, metric, labels)
    };
    let mut sent = std::collections::BTreeMap::<String, u64>::new();
    for (op, n) in counts.nonzero().into_iter().chain(read_counts.nonzero()) {
        *sent.entry(format!("{op:?}")).or_default() += n;
    }
    assert!(
        sent.contains_key("Write") && sent.contains_key("Read"),
        "{sent:?}"
    );
    for (name, &n) in &sent {
        let served = moved("madfs_requests_total", &[("op", name)]);
        assert!(
            served >= n as f64,
            "{name}: the servers counted {served}, the clients sent {n}"
        );
    }
    for s in &after {
        check_conventions(s);
        // Each operation's histogram counts every request its counter does.
        for x in s
            .parsed
            .samples
            .iter()
            .filter(|x| x.metric == "madfs_requests_total")
        {
            let op = x.labels.get("op").unwrap();
            let n = sum(s, "madfs_requests_total", &[("op", op)]);
            assert_eq!(
                sum(s, "madfs_request_duration_seconds", &[("op", op)]),
                n,
                "{op}"
            );
            assert_eq!(
                sum(s, "madfs_request_duration_seconds_count", &[("op", op)]),
                n,
                "{op}"
            );
        }
        assert!(sum(s, "madfs_connections", &[]) >= 1.0);
        assert!(sum(s, "madfs_space_bytes", &[("kind", "total")]) > 0.0);
        assert_eq!(sum(s, "madfs_chunk_store_poisoned", &[]), 0.0);
        assert_eq!(sum(s, "madfs_handler_panics_total", &[]), 0.0);
    }
    let written = moved("madfs_written_bytes_total", &[]);
    assert!(
        written >= (big.len() + SMALL * 100) as f64,
        "written bytes moved by {written}"
    );
    let read = moved("madfs_read_bytes_total", &[]);
    assert!(read >= big.len() as f64, "read bytes moved by {read}");
    assert!(moved("madfs_request_errors_total", &[("code", "NotFound")]) >= 1.0);
    assert!(moved("madfs_requests_total", &[("op", "Fsync")]) >= 1.0);
    assert!(moved("madfs_sync_rounds_total", &[]) >= 1.0);
    assert!(moved("madfs_sync_duration_seconds", &[]) >= 1.0);
    // Servers 0 and 1 hold the root and the files between them.
    assert!(sum_all(&after, "madfs_inodes", &[]) >= (SMALL + 2) as f64);

    // Anything but GET /metrics is refused.
    let (status, _, _) = http_get(addrs[0], "/");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    // `madfs metrics` sums one server up.
    let out = tc.madfs_ok(["metrics", "--server", "1"]);
    assert!(out.contains("operations/s"), "{out}");
    assert!(
        out.contains(&format!("http://{}/metrics", addrs[1])),
        "{out}"
    );
}

#[test]
fn the_metrics_flag_overrides_the_cluster_file() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let tc = TestCluster::start_with(
        1,
        Options {
            server_args: vec!["--metrics".into(), addr.to_string()],
            ..Default::default()
        },
    );
    assert_eq!(tc.config().servers[0].metrics, None);
    let s = scrape(addr);
    check_conventions(&s);
    // The cluster file has no address for it: `madfs metrics` says so,
    // and takes one.
    let out = tc.madfs(["metrics"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no metrics address"),
        "{out:?}"
    );
    let out = tc.madfs_ok(["metrics", "--address", &addr.to_string()]);
    assert!(out.contains("requests"), "{out}");
}

/// A link dropped on a server that is down shows in the name's server's
/// metrics (a failed send, a drop waiting), and the wait ends once the
/// owner is back and has dropped the link (link_drops.rs).
#[test]
fn a_link_drop_waiting_for_its_owner_shows_until_it_is_answered() {
    use madfs_client::{FileName, InodeId};
    let mut tc = TestCluster::start_with(
        2,
        Options {
            metrics: true,
            ..Default::default()
        },
    );
    let c = BlockingClient::from_client(tc.client()).unwrap();
    // A file whose inode lives on the server that does not own the root,
    // and a second name for it on the other one.
    let owner = (0..)
        .map(|i| format!("/f{i}"))
        .find_map(|p| {
            c.write_file(&p, b"kept").unwrap();
            let ino = c.stat(&p).unwrap().ino;
            (ino.owner() != InodeId::ROOT.owner()).then_some((p, ino.owner()))
        })
        .unwrap();
    let (file, owner) = owner;
    let link = (0..)
        .map(|i| format!("l{i}"))
        .find(|n| {
            madfs_types::dentry_server(InodeId::ROOT, &FileName::new(n.as_bytes()).unwrap(), 2)
                != owner
        })
        .unwrap();
    let link = format!("/{link}");
    c.hard_link(&file, &link).unwrap();
    let names_server = 1 - owner.0 as usize;
    let addr = tc.config().servers[names_server]
        .metrics
        .expect("a metrics address");
    let value = |metric: &str| sum(&scrape(addr), metric, &[]);
    assert_eq!(value("madfs_link_drops_waiting"), 0.0);

    tc.kill9(owner.0 as usize);
    c.remove_file(&link).unwrap();
    assert!(value("madfs_link_drops_failed_total") >= 1.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while value("madfs_link_drops_waiting") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no drop shown waiting"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    tc.restart(owner.0 as usize);
    while value("madfs_link_drops_waiting") > 0.0 {
        assert!(std::time::Instant::now() < deadline, "the drop still waits");
        std::thread::sleep(Duration::from_millis(20));
    }
    let fresh = BlockingClient::from_client(tc.client()).unwrap();
    assert_eq!(fresh.stat(&file).unwrap().nlink, 1);
    assert_eq!(value("madfs_link_drops_abandoned_total"), 0.0);
}
