//! Copying across the job's nodes. The coordinator listens on its address
//! in the cluster's network and starts one worker per host through the
//! launcher template of `madfs up` (`ssh ... {host}`, `srun ... -w {host}`,
//! `ip netns exec {host}`): a POSIX script on the standard input of
//! `<template> sh -s`, which hands the cluster file and key to `madfs
//! stage-worker` on its standard input (never on a command line). The
//! worker connects back and both sides prove they hold the cluster key
//! (HMAC-SHA256 over fresh nonces from both and this run's id); then the
//! worker asks for nothing: the coordinator keeps `jobs` items in flight
//! on it, sending more as results come back (run.rs pulls them from the
//! shared queue). A worker that is lost gives its items back to the
//! others. Messages are postcard frames behind a 4-byte length.

use super::copy::{Executor, Item, Outcome};
use super::fs::{Fs, MadfsSide, Preserve, SideKind};
use super::run::Dispatch;
use hmac::{Hmac, Mac};
use madfs_client::{Client, ClusterConfig, ClusterKey};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The largest message either side accepts.
const FRAME_MAX_BYTES: u32 = 16 << 20;
/// How long the hosts have to start their workers and connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the authentication exchange may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Outcomes a worker holds before sending them.
const RESULTS_QUEUED_MAX: usize = 256;
const NONCE_BYTES: usize = 32;
/// Last words of a host's worker kept for its error message.
const STDERR_KEPT_BYTES: usize = 4096;

type Nonce = [u8; NONCE_BYTES];

#[derive(Serialize, Deserialize)]
struct Hello {
    run: String,
    host: String,
    nonce: Nonce,
    proof: [u8; 32],
}

#[derive(Serialize, Deserialize)]
enum ToWorker {
    Welcome {
        proof: [u8; 32],
        src: SideKind,
        dst: SideKind,
        keep: Preserve,
    },
    Items(Vec<Item>),
    Finish,
}

#[derive(Serialize, Deserialize)]
enum FromWorker {
    Results(Vec<Outcome>),
}

/// HMAC-SHA256 under the cluster key of a label, the run and both nonces
/// (a label per direction, so neither proof can be replayed as the other).
fn proof(key: &ClusterKey, label: &str, run: &str, coord: &Nonce, worker: &Nonce) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.0).expect("HMAC takes any key");
    for part in [label.as_bytes(), run.as_bytes(), coord, worker] {
        mac.update(&(part.len() as u32).to_le_bytes());
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

fn nonce() -> Nonce {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::getrandom(&mut n).expect("the OS random source");
    n
}

async fn send<T: Serialize>(w: &mut OwnedWriteHalf, msg: &T) -> std::io::Result<()> {
    let body = postcard::to_allocvec(msg).map_err(std::io::Error::other)?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    w.write_all(&frame).await
}

async fn recv<T: for<'de> Deserialize<'de>>(r: &mut OwnedReadHalf) -> std::io::Result<T> {
    let len = r.read_u32_le().await?;
    if len > FRAME_MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "a message of {len} bytes (at most {FRAME_MAX_BYTES})"
        )));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    postcard::from_bytes(&body).map_err(std::io::Error::other)
}

/// Work done by one host, for the summary.
#[derive(Clone, Debug, Default)]
pub struct HostShare {
    pub items: u64,
    pub bytes: u64,
}

/// One connected worker.
pub struct Conn {
    host: String,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
}

/// A host's command running its worker, and the last of what it said on
/// standard error.
struct Launched {
    host: String,
    child: Child,
    said: Arc<Mutex<Vec<u8>>>,
}

/// What the workers are told at the handshake: the sides and what to keep.
#[derive(Clone, Copy)]
pub struct Terms {
    pub sides: (SideKind, SideKind),
    pub keep: Preserve,
    /// Items in flight on each worker.
    pub jobs: usize,
}

/// The workers of a run, on the job's hosts.
pub struct Crew {
    conns: Vec<Conn>,
    window: usize,
    children: Vec<Launched>,
    shares: Arc<Mutex<HashMap<String, HostShare>>>,
}

/// How the hosts are reached (as `madfs up --hosts` reaches them).
pub struct Spread {
    pub hosts: Vec<String>,
    pub exec: String,
    pub madfs: PathBuf,
}

/// The local address this host reaches server 0 from: where workers on
/// the cluster's hosts can reach the coordinator.
fn local_address_towards(cfg: &ClusterConfig) -> Result<IpAddr, String> {
    let target = cfg
        .servers
        .first()
        .ok_or("the cluster file names no server")?
        .address;
    let any: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("address")
    } else {
        "[::]:0".parse().expect("address")
    };
    let s = std::net::UdpSocket::bind(any).map_err(|e| format!("no local address: {e}"))?;
    s.connect(target)
        .map_err(|e| format!("no route to server 0 ({target}): {e}"))?;
    s.local_addr()
        .map(|a| a.ip())
        .map_err(|e| format!("no local address: {e}"))
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script a host runs: the worker, with the cluster file and key on
/// its standard input.
fn worker_script(
    madfs: &str,
    addr: SocketAddr,
    run: &str,
    host: &str,
    cfg: &str,
    key: &str,
) -> String {
    format!(
        "exec {madfs} stage-worker --connect {addr} --run {run} --host {host} <<'MADFS_STAGE_END'\n\
         {key}\n{cfg}\nMADFS_STAGE_END\n",
        madfs = quote(madfs),
        addr = quote(&addr.to_string()),
        run = quote(run),
        host = quote(host),
    )
}

impl Crew {
    /// Start a worker on every host and wait until they have connected
    /// and proven the key. Hosts whose worker does not come are reported;
    /// the run goes on with the others (none: an error).
    pub async fn start(
        spread: &Spread,
        cfg: &ClusterConfig,
        cfg_text: &str,
        key: &ClusterKey,
        terms: Terms,
        report: &dyn Fn(&str),
    ) -> Result<Crew, String> {
        let Terms { sides, keep, jobs } = terms;
        let ip = local_address_towards(cfg)?;
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| format!("cannot listen on {ip}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let run = format!(
            "{:016x}",
            u64::from_le_bytes(nonce()[..8].try_into().expect("8 bytes"))
        );
        let madfs = spread.madfs.to_string_lossy().into_owned();
        let mut children = Vec::new();
        for host in &spread.hosts {
            let argv = crate::hosts::exec_argv(&spread.exec, host)?;
            let script = worker_script(&madfs, addr, &run, host, cfg_text, &key.to_hex());
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    report(&format!("host '{host}': cannot run '{}': {e}", argv[0]));
                    continue;
                }
            };
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(script.as_bytes());
            }
            let said = Arc::new(Mutex::new(Vec::new()));
            if let Some(mut err) = child.stderr.take() {
                let said = said.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = err.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let mut s = said.lock().expect("stderr");
                        s.extend_from_slice(&buf[..n]);
                        let excess = s.len().saturating_sub(STDERR_KEPT_BYTES);
                        s.drain(..excess);
                    }
                });
            }
            children.push(Launched {
                host: host.clone(),
                child,
                said,
            });
        }
        let mut crew = Crew {
            conns: Vec::new(),
            window: jobs.max(1),
            children,
            shares: Arc::new(Mutex::new(HashMap::new())),
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let mut waiting: Vec<String> = crew.children.iter().map(|c| c.host.clone()).collect();
        while !waiting.is_empty() && Instant::now() < deadline {
            // A host whose command exited before its worker connected
            // will not come.
            for Launched { host, child, said } in crew.children.iter_mut() {
                if !waiting.contains(host) {
                    continue;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    let said = String::from_utf8_lossy(&said.lock().expect("stderr")).into_owned();
                    report(&format!(
                        "host '{host}': the worker did not start ({status}): {}",
                        said.trim()
                    ));
                    waiting.retain(|h| h != host);
                }
            }
            let accepted =
                tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
            let Ok(Ok((stream, _))) = accepted else {
                continue;
            };
            let handshake = handshake(stream, key, &run, sides, keep);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(conn)) if waiting.contains(&conn.host) => {
                    waiting.retain(|h| *h != conn.host);
                    crew.conns.push(conn);
                }
                Ok(Ok(conn)) => report(&format!("host '{}' connected twice", conn.host)),
                Ok(Err(e)) => report(&format!("a worker was refused: {e}")),
                Err(_) => report("a worker did not finish the handshake in time"),
            }
        }
        for host in &waiting {
            report(&format!(
                "host '{host}': its worker did not connect within {CONNECT_TIMEOUT:?}"
            ));
        }
        if crew.conns.is_empty() {
            crew.stop().await;
            return Err("no worker started on any host".into());
        }
        Ok(crew)
    }

    /// Serve the phase's queue to every worker; the tasks give the
    /// connections back at the end (`end_phase`).
    pub fn start_phase(
        &mut self,
        dispatch: &Arc<Dispatch>,
        tx: &mpsc::Sender<Outcome>,
    ) -> Vec<JoinHandle<Option<Conn>>> {
        std::mem::take(&mut self.conns)
            .into_iter()
            .map(|conn| {
                let (dispatch, tx) = (dispatch.clone(), tx.clone());
                let (window, shares) = (self.window, self.shares.clone());
                tokio::spawn(serve(conn, dispatch, tx, window, shares))
            })
            .collect()
    }

    pub async fn end_phase(&mut self, tasks: Vec<JoinHandle<Option<Conn>>>) {
        for t in tasks {
            if let Ok(Some(conn)) = t.await {
                self.conns.push(conn);
            }
        }
    }

    /// Each host's share of the work so far, by host name.
    pub fn shares(&self) -> Vec<(String, HostShare)> {
        let mut v: Vec<_> = self
            .shares
            .lock()
            .expect("shares")
            .iter()
            .map(|(h, s)| (h.clone(), s.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Tell every worker to finish and wait for the hosts' commands.
    pub async fn stop(&mut self) {
        for mut c in std::mem::take(&mut self.conns) {
            let _ = send(&mut c.wr, &ToWorker::Finish).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for Launched { child, .. } in self.children.iter_mut() {
            loop {
                match child.try_wait() {
                    Ok(None) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    _ => break,
                }
            }
        }
    }
}

async fn handshake(
    stream: TcpStream,
    key: &ClusterKey,
    run: &str,
    sides: (SideKind, SideKind),
    keep: Preserve,
) -> Result<Conn, String> {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let ours = nonce();
    wr.write_all(&ours).await.map_err(|e| e.to_string())?;
    let hello: Hello = recv(&mut rd).await.map_err(|e| e.to_string())?;
    let want = proof(key, "madfs-stage worker", run, &ours, &hello.nonce);
    if hello.run != run || !madfs_proto::auth::proofs_equal(&want, &hello.proof) {
        return Err(format!(
            "host '{}' does not hold the cluster key",
            hello.host
        ));
    }
    let welcome = ToWorker::Welcome {
        proof: proof(key, "madfs-stage coordinator", run, &ours, &hello.nonce),
        src: sides.0,
        dst: sides.1,
        keep,
    };
    send(&mut wr, &welcome).await.map_err(|e| e.to_string())?;
    Ok(Conn {
        host: hello.host,
        rd,
        wr,
    })
}

/// Keep `window` items in flight on one worker until the phase ends.
async fn serve(
    mut conn: Conn,
    dispatch: Arc<Dispatch>,
    tx: mpsc::Sender<Outcome>,
    window: usize,
    shares: Arc<Mutex<HashMap<String, HostShare>>>,
) -> Option<Conn> {
    let mut in_flight: HashMap<u64, Item> = HashMap::new();
    loop {
        let mut batch = Vec::new();
        while in_flight.len() + batch.len() < window {
            match dispatch.pop() {
                Some(item) => batch.push(item),
                None => break,
            }
        }
        if !batch.is_empty() {
            in_flight.extend(batch.iter().map(|i| (i.id, i.clone())));
            if let Err(e) = send(&mut conn.wr, &ToWorker::Items(batch)).await {
                return lost(conn, &dispatch, in_flight, &e.to_string());
            }
        }
        if in_flight.is_empty() {
            // Wait for items a lost worker gave back, or the phase's end.
            let woken = dispatch.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if dispatch.finished() {
                return Some(conn);
            }
            if !dispatch.has_work() {
                woken.await;
            }
            continue;
        }
        match recv::<FromWorker>(&mut conn.rd).await {
            Ok(FromWorker::Results(results)) => {
                for o in results {
                    if in_flight.remove(&o.id).is_none() {
                        continue;
                    }
                    {
                        let mut s = shares.lock().expect("shares");
                        let share = s.entry(conn.host.clone()).or_default();
                        share.items += 1;
                        share.bytes += o.bytes;
                    }
                    dispatch.reported();
                    if tx.send(o).await.is_err() {
                        return None;
                    }
                }
            }
            Err(e) => return lost(conn, &dispatch, in_flight, &e.to_string()),
        }
    }
}

fn lost(conn: Conn, dispatch: &Dispatch, in_flight: HashMap<u64, Item>, why: &str) -> Option<Conn> {
    eprintln!(
        "madfs: lost the worker on host '{}' ({why}); its {} items go to the others",
        conn.host,
        in_flight.len()
    );
    dispatch.requeue(in_flight.into_values());
    None
}

/// `madfs stage-worker`: read the cluster file and key from standard
/// input, connect to the coordinator, prove the key, and copy what it
/// hands out until it says finish (or goes away).
pub fn worker_main(connect: SocketAddr, run: &str, host: &str) -> Result<(), String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("reading the cluster file: {e}"))?;
    let (key_line, cfg_text) = input.split_once('\n').ok_or("no cluster key on stdin")?;
    let key = ClusterKey::from_hex(key_line.trim()).ok_or("a bad cluster key on stdin")?;
    let cfg: ClusterConfig =
        ClusterConfig::from_toml(cfg_text).map_err(|e| format!("the cluster file: {e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let stream = TcpStream::connect(connect)
            .await
            .map_err(|e| format!("cannot reach the coordinator at {connect}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let mut theirs = [0u8; NONCE_BYTES];
        rd.read_exact(&mut theirs)
            .await
            .map_err(|e| e.to_string())?;
        let ours = nonce();
        let hello = Hello {
            run: run.to_string(),
            host: host.to_string(),
            nonce: ours,
            proof: proof(&key, "madfs-stage worker", run, &theirs, &ours),
        };
        send(&mut wr, &hello).await.map_err(|e| e.to_string())?;
        let ToWorker::Welcome {
            proof: p,
            src,
            dst,
            keep,
        } = recv(&mut rd).await.map_err(|e| e.to_string())?
        else {
            return Err("the coordinator did not welcome this worker".into());
        };
        let want = proof(&key, "madfs-stage coordinator", run, &theirs, &ours);
        if !madfs_proto::auth::proofs_equal(&want, &p) {
            return Err("the coordinator does not hold the cluster key".into());
        }
        let client = Client::from_config(&cfg, key).map_err(|e| e.to_string())?;
        let side = |k: SideKind| match k {
            SideKind::Local => Fs::Local,
            SideKind::Madfs => Fs::Madfs(MadfsSide::new(client.clone())),
        };
        let exec = Executor::new(side(src), side(dst), keep);
        work(rd, wr, exec).await
    })
}

/// Run what arrives, send what finishes.
async fn work(rd: OwnedReadHalf, mut wr: OwnedWriteHalf, exec: Executor) -> Result<(), String> {
    // A reader task of its own: a frame read is never cut in the middle.
    let (items_tx, mut items_rx) = mpsc::channel::<ToWorker>(4);
    tokio::spawn(async move {
        let mut rd = rd;
        while let Ok(msg) = recv::<ToWorker>(&mut rd).await {
            if items_tx.send(msg).await.is_err() {
                break;
            }
        }
    });
    let (done_tx, mut done_rx) = mpsc::channel::<Outcome>(RESULTS_QUEUED_MAX);
    loop {
        tokio::select! {
            msg = items_rx.recv() => match msg {
                Some(ToWorker::Items(items)) => {
                    for item in items {
                        let (exec, done_tx) = (exec.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            let _ = done_tx.send(exec.run(item).await).await;
                        });
                    }
                }
                // Finished, or the coordinator is gone.
                Some(ToWorker::Finish) | None => return Ok(()),
                Some(ToWorker::Welcome { .. }) => return Err("a second welcome".into()),
            },
            Some(first) = done_rx.recv() => {
                let mut results = vec![first];
                while let Ok(more) = done_rx.try_recv() {
                    results.push(more);
                }
                send(&mut wr, &FromWorker::Results(results))
                    .await
                    .map_err(|e| format!("the coordinator went away: {e}"))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_key_label_run_and_nonces() {
        let k = ClusterKey([7; 32]);
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let p = proof(&k, "madfs-stage worker", "r1", &a, &b);
        assert_eq!(p, proof(&k, "madfs-stage worker", "r1", &a, &b));
        assert_ne!(p, proof(&k, "madfs-stage coordinator", "r1", &a, &b));
        assert_ne!(p, proof(&k, "madfs-stage worker", "r2", &a, &b));
        assert_ne!(p, proof(&k, "madfs-stage worker", "r1", &b, &a));
        assert_ne!(
            p,
            proof(&ClusterKey([8; 32]), "madfs-stage worker", "r1", &a, &b)
        );
    }

    #[test]
    fn the_script_keeps_the_key_off_the_command_line() {
        let s = worker_script(
            "/opt/it's/madfs",
            "10.0.0.1:5000".parse().unwrap(),
            "ab",
            "n1",
            "x = 1",
            "cafe",
        );
        let first = s.lines().next().unwrap();
        assert!(first.contains(r"'/opt/it'\''s/madfs' stage-worker --connect '10.0.0.1:5000'"));
        assert!(!first.contains("cafe"));
        assert!(s.contains("\ncafe\nx = 1\nMADFS_STAGE_END\n"));
    }
}
