//! Test harness shared by every integration test: a real cluster of `madfs
//! server` processes on loopback ports, in a temporary directory, torn down
//! (SIGKILL, wait, remove) when the `TestCluster` is dropped, even when the
//! test panics. On a panic the tail of every server log goes to stderr first.
//!
//! Each test binary uses a different subset of this module.
#![allow(dead_code)]

pub mod command;
pub mod placement;

use madfs_client::{Client, ClientError, ClusterConfig, ErrorCode, Timeouts};
use madfs_proto::auth::{decode_welcome, Challenge, ClusterKey, Hello, Role};
use madfs_proto::frame::{FrameHeader, FRAME_HEADER_BYTES};
use madfs_proto::Opcode;
use madfs_rpc::cluster::{generate_key, write_key_file};
use madfs_rpc::ServerEntry;
use madfs_types::RequestId;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `madfs` binary under test.
pub const MADFS: &str = env!("CARGO_BIN_EXE_madfs");

/// Chunk size of test clusters: small, so moderate files span many chunks
/// and therefore many servers.
pub const CHUNK: u64 = 1 << 20;

const START_DEADLINE: Duration = Duration::from_secs(30);
const STOP_DEADLINE: Duration = Duration::from_secs(30);

pub struct TestCluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    cluster_file: PathBuf,
    cfg: ClusterConfig,
    children: Vec<Option<Child>>,
    opts: Options,
    /// Arguments a server gets besides the usual (a replacement's new
    /// address and data directory), by id.
    own_args: std::collections::HashMap<usize, Vec<String>>,
}

/// How `TestCluster::start_with` sets its servers up; `Default` is what
/// `TestCluster::start` does.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Give every server a data directory on a private tmpfs of this many
    /// bytes, to run it out of disk space. The tmpfs is mounted over the
    /// (empty) data directory inside a user+mount namespace of the server's
    /// own (see `tmpfs_wrapper`), so it needs no privileges, is seen by that
    /// server only, and vanishes with it: such a server cannot be restarted.
    pub tmpfs_bytes: Option<u64>,
    /// With `tmpfs_bytes`: only these servers get the tmpfs (empty: all).
    pub tmpfs_servers: Vec<usize>,
    /// More arguments for `madfs server` (e.g. `--find-index-mib 0`).
    pub server_args: Vec<String>,
    /// More environment variables for `madfs server` (test knobs such as
    /// `MADFS_TEST_TOUCH_DELAY_MS`, test faults).
    pub server_env: Vec<(String, String)>,
    /// Environment variables for one server only: (id, name, value).
    pub server_env_for: Vec<(usize, String, String)>,
    /// Give every server a metrics address (a free loopback port) in the
    /// cluster file.
    pub metrics: bool,
    /// The cluster file's `replicas` (0 means 1).
    pub replicas: u8,
    /// The cluster file's `voters` (None: what `madfs up` would write).
    pub voters: Option<u8>,
}

/// The command prefix that starts a program in a fresh mount namespace with
/// a tmpfs of `size=<bytes>` mounted over the directory given as the first
/// argument after the prefix (`<prefix...> DIR BYTES PROGRAM ARGS...`).
/// Prefers an unprivileged user+mount namespace (works for any user); as
/// root where user namespaces are unavailable, a plain mount namespace.
/// Probed once per test binary, by mounting a small tmpfs for real.
fn tmpfs_wrapper() -> &'static [&'static str] {
    const SCRIPT: &str = "mount -t tmpfs -o size=\"$1\" madfs-full \"$0\" && shift && exec \"$@\"";
    static WRAPPER: OnceLock<Vec<&'static str>> = OnceLock::new();
    WRAPPER.get_or_init(|| {
        let candidates: &[&[&'static str]] = &[
            &[
                "unshare",
                "--user",
                "--map-root-user",
                "--mount",
                "--",
                "sh",
                "-c",
                SCRIPT,
            ],
            &["unshare", "--mount", "--", "sh", "-c", SCRIPT],
        ];
        let probe_dir = tempfile::Builder::new()
            .prefix("madfs-tmpfs-probe-")
            .tempdir()
            .expect("tempdir");
        let mut failures = Vec::new();
        for c in candidates {
            let out = Command::new(c[0])
                .args(&c[1..])
                .arg(probe_dir.path())
                .arg("1m")
                .args(["sh", "-c", "grep -q madfs-full /proc/self/mounts"])
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => return c.to_vec(),
                Ok(o) => failures.push(format!(
                    "{c:?}: {} {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => failures.push(format!("{c:?}: {e}")),
            }
        }
        panic!(
            "cannot give a test server a private tmpfs (needs util-linux `unshare` and \
             either unprivileged user namespaces or root):\n{}",
            failures.join("\n")
        );
    })
}

/// Free loopback ports, all held until every one is chosen so a cluster
/// never gets the same port twice.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// The last `lines` lines of a file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl TestCluster {
    /// Start `n` servers and wait until every one answers.
    pub fn start(n: usize) -> TestCluster {
        TestCluster::start_with(n, Options::default())
    }

    /// Start `n` servers set up as `opts` says and wait until every one answers.
    pub fn start_with(n: usize, opts: Options) -> TestCluster {
        let dir = tempfile::Builder::new()
            .prefix("madfs-it-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().to_path_buf();
        let cluster_file = root.join("cluster.toml");
        write_key_file(&root.join("cluster.key"), &generate_key()).expect("write key");
        let mut tc = TestCluster {
            dir: Some(dir),
            root,
            cluster_file,
            cfg: ClusterConfig {
                cluster_id: String::new(),
                chunk_size: CHUNK,
                key_file: PathBuf::from("cluster.key"),
                replicas: 1,
                voters: 3,
                servers: Vec::new(),
            },
            children: Vec::new(),
            opts,
            own_args: Default::default(),
        };
        // A port picked here may be taken by someone else before the server
        // binds it (other tests run in parallel): then pick again.
        for attempt in 0.. {
            tc.write_config(n);
            for i in 0..n {
                let child = tc.spawn(i);
                tc.children.push(Some(child));
            }
            match tc.wait_ready(None) {
                Ok(()) => return tc,
                Err(msg) if attempt < 3 && msg.contains("in use") => {
                    tc.kill_all();
                    tc.children.clear();
                }
                Err(msg) => panic!("{msg}"),
            }
        }
        unreachable!()
    }

    fn write_config(&mut self, n: usize) {
        let ports = free_ports(if self.opts.metrics { 2 * n } else { n });
        let metrics = |i: usize| {
            self.opts
                .metrics
                .then(|| format!("127.0.0.1:{}", ports[n + i]).parse().unwrap())
        };
        self.cfg = ClusterConfig {
            cluster_id: format!("madfs-test-{}", std::process::id()),
            chunk_size: CHUNK,
            key_file: PathBuf::from("cluster.key"),
            replicas: self.opts.replicas.max(1),
            voters: self
                .opts
                .voters
                .unwrap_or_else(|| madfs_rpc::cluster::voters_for(n)),
            servers: ports[..n]
                .iter()
                .enumerate()
                .map(|(i, p)| ServerEntry {
                    id: i as u16,
                    address: format!("127.0.0.1:{p}").parse().unwrap(),
                    data_dir: self.root.join(format!("server-{i}")),
                    metrics: metrics(i),
                    host: None,
                })
                .collect(),
        };
        std::fs::write(&self.cluster_file, self.cfg.to_toml()).expect("write cluster file");
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    pub fn server_count(&self) -> usize {
        self.cfg.servers.len()
    }

    pub fn log_path(&self, i: usize) -> PathBuf {
        self.root.join(format!("server-{i}.log"))
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].as_ref().expect("server is running").id()
    }

    /// The size of server `i`'s private tmpfs, if it has one.
    fn tmpfs_of(&self, i: usize) -> Option<u64> {
        self.opts
            .tmpfs_bytes
            .filter(|_| self.opts.tmpfs_servers.is_empty() || self.opts.tmpfs_servers.contains(&i))
    }

    fn spawn(&self, i: usize) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("open server log");
        let mut cmd = match self.tmpfs_of(i) {
            None => Command::new(MADFS),
            Some(bytes) => {
                // The mount point must exist (and be empty: what is under
                // it is hidden from the server).
                let data_dir = &self.cfg.servers[i].data_dir;
                std::fs::create_dir_all(data_dir).expect("create data dir");
                let w = tmpfs_wrapper();
                let mut cmd = Command::new(w[0]);
                cmd.args(&w[1..])
                    .arg(data_dir)
                    .arg(bytes.to_string())
                    .arg(MADFS);
                cmd
            }
        };
        // Without --fork, `unshare` and `sh` exec: the child's pid is the
        // server's, so kill/wait below reach the server itself.
        cmd.arg("server")
            .arg("--cluster")
            .arg(&self.cluster_file)
            .arg("--id")
            .arg(i.to_string())
            .args(&self.opts.server_args)
            .args(self.own_args.get(&i).into_iter().flatten())
            // Start, stop and find-index lines: the tests read some.
            .env("MADFS_LOG", "info")
            .envs(self.opts.server_env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.opts
                    .server_env_for
                    .iter()
                    .filter(|(id, _, _)| *id == i)
                    .map(|(_, k, v)| (k, v)),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // Safety net when the test process itself is killed: the servers die
        // with the thread that started them (a test's own thread; Drop kills
        // them anyway in the normal case).
        // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd.spawn().expect("spawn madfs server")
    }

    /// A client whose connections give up quickly, for polling.
    fn probe_client(&self) -> Client {
        let key = ClusterConfig::load(&self.cluster_file)
            .unwrap()
            .load_key()
            .unwrap();
        Client::from_config_with_timeouts(
            &self.cfg,
            key,
            Timeouts {
                connect: Duration::from_secs(1),
                call: Duration::from_secs(5),
            },
        )
        .expect("probe client")
    }

    /// Wait until every server (or only `only`) answers a StatFs.
    fn wait_ready(&mut self, only: Option<usize>) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            // A fresh client each round: no cached broken connection.
            let probe = self.probe_client();
            let stats = block_on_thread(probe.server_stats());
            let down: Vec<usize> = stats
                .iter()
                .filter(|(id, r)| r.is_err() && only.is_none_or(|o| o == id.0 as usize))
                .map(|(id, _)| id.0 as usize)
                .collect();
            if down.is_empty() {
                return Ok(());
            }
            for &i in &down {
                if let Some(child) = self.children[i].as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        self.children[i] = None;
                        return Err(format!(
                            "server {i} exited ({status}) during start-up; log:\n{}",
                            tail(&self.log_path(i), 40)
                        ));
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "servers {down:?} did not answer within {START_DEADLINE:?}: {:?}",
                    stats
                        .iter()
                        .filter_map(|(_, r)| r.as_ref().err().map(|e| e.to_string()))
                        .collect::<Vec<_>>()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An async client of this cluster (through the cluster file, as a user would).
    pub fn client(&self) -> Client {
        Client::connect(Some(&self.cluster_file)).expect("client")
    }

    /// Whether server `i`'s process is still running.
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.children[i].as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL server `i` and reap it.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM server `i` (a clean shutdown) and wait for it to exit; its
    /// exit status (the caller decides whether a crash on the way out fails
    /// its test).
    pub fn stop(&mut self, i: usize) -> ExitStatus {
        let mut c = self.children[i].take().expect("server is running");
        // SAFETY: signalling a child we started and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_DEADLINE;
        loop {
            match c.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("server {i} did not stop within {STOP_DEADLINE:?} of SIGTERM");
                }
            }
        }
    }

    /// SIGTERM every running server at once (as `madfs down` does) and wait
    /// for each to exit; their exit statuses by server.
    pub fn stop_all(&mut self) -> Vec<(usize, ExitStatus)> {
        let running: Vec<usize> = (0..self.children.len())
            .filter(|&i| self.children[i].is_some())
            .collect();
        for &i in &running {
            let c = self.children[i].as_ref().expect("running");
            // SAFETY: signalling a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        // Each waits on its own; `stop` signals again, which is harmless.
        running.into_iter().map(|i| (i, self.stop(i))).collect()
    }

    /// Start every stopped server again, then wait until all answer.
    pub fn start_all_again(&mut self) {
        for i in 0..self.children.len() {
            if self.children[i].is_none() {
                self.start_again(i);
            }
        }
        if let Err(msg) = self.wait_ready(None) {
            panic!("starting the servers again: {msg}");
        }
    }

    /// Arguments for `madfs server` from the next (re)start on.
    pub fn set_server_args(&mut self, args: &[&str]) {
        self.opts.server_args = args.iter().map(|a| a.to_string()).collect();
    }

    /// Environment for `madfs server` from the next (re)start on.
    pub fn set_server_env(&mut self, env: &[(&str, &str)]) {
        self.opts.server_env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Start a replacement for lost server `i` (`madfs server --replace`,
    /// after kill9): an empty data directory and a new loopback port, as
    /// on another host. It serves nothing until rebuilt, so this does not
    /// wait for it. Restarts of `i` run the replacement again (without
    /// --replace). Its address and data directory.
    pub fn replace(&mut self, i: usize) -> (std::net::SocketAddr, PathBuf) {
        assert!(self.children[i].is_none(), "server {i} is still running");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_ports(1)[0]).parse().unwrap();
        let dir = self.root.join(format!("server-{i}-replacement"));
        let own = vec![
            "--address".to_string(),
            addr.to_string(),
            "--data-dir".to_string(),
            dir.display().to_string(),
        ];
        self.own_args
            .insert(i, [vec!["--replace".to_string()], own.clone()].concat());
        let child = self.spawn(i);
        self.children[i] = Some(child);
        self.own_args.insert(i, own);
        (addr, dir)
    }

    /// Start server `i` again (after kill9 or stop) without waiting for it
    /// (it may serve nothing for a while: a server rebuilt from replicas).
    pub fn start_again(&mut self, i: usize) {
        assert!(self.children[i].is_none(), "server {i} is still running");
        let child = self.spawn(i);
        self.children[i] = Some(child);
    }

    /// Start server `i` again (after kill9 or stop) and wait until it answers.
    pub fn restart(&mut self, i: usize) {
        assert!(self.children[i].is_none(), "server {i} is still running");
        assert!(
            self.tmpfs_of(i).is_none(),
            "server {i}'s data died with it (it was on a private tmpfs)"
        );
        let child = self.spawn(i);
        self.children[i] = Some(child);
        if let Err(msg) = self.wait_ready(Some(i)) {
            panic!("restarting server {i}: {msg}");
        }
    }

    /// Run the `madfs` binary with MADFS_CLUSTER pointing at this cluster.
    pub fn madfs<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Command::new(MADFS)
            .args(args)
            .env("MADFS_CLUSTER", &self.cluster_file)
            .stdin(Stdio::null())
            .output()
            .expect("run madfs")
    }

    /// Run `madfs` and insist it succeeds; its stdout.
    pub fn madfs_ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.madfs(&args);
        assert!(
            out.status.success(),
            "madfs {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn kill_all(&mut self) {
        for c in self.children.iter_mut() {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.cfg.servers.len() {
                eprintln!(
                    "---- server {i} log (tail) ----\n{}",
                    tail(&self.log_path(i), 30)
                );
            }
        }
        self.kill_all();
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}

/// Run a future to completion on a private runtime in a thread of its own,
/// so that sync harness code works both inside and outside a runtime.
pub fn block_on_thread<F>(f: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        })
        .join()
        .expect("harness thread panicked")
    })
}

/// The error code of a result that must be an error.
#[track_caller]
pub fn code_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.code,
    }
}

/// Assert that `r` failed with `code` (and so with `errno`).
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(r: Result<T, ClientError>, code: ErrorCode, errno: i32) {
    match r {
        Ok(v) => panic!("expected {code:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.code, code, "wrong error: {e}");
            assert_eq!(e.errno(), errno, "wrong errno for {e}");
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), different per seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Names of a directory listing, as strings.
pub fn names(entries: &[madfs_client::DirEntry]) -> Vec<String> {
    entries.iter().map(|e| e.name.to_string()).collect()
}

// ---- raw protocol access, for tests of the wire boundary ---------------

pub fn frame(opcode: Opcode, id: u64, body: &[u8], data_len: u32) -> [u8; FRAME_HEADER_BYTES] {
    FrameHeader {
        is_response: false,
        opcode: opcode as u16,
        request_id: RequestId(id),
        body_len: 0, // encode() takes it from the body
        data_len,
        status: 0,
        checksum: 0,
    }
    .encode(body)
}

pub struct Raw {
    pub s: TcpStream,
}

impl Raw {
    pub fn connect(tc: &TestCluster, server: usize) -> Raw {
        let s = TcpStream::connect(tc.config().servers[server].address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw { s }
    }

    pub fn read_frame(&mut self) -> std::io::Result<(FrameHeader, Vec<u8>, Vec<u8>)> {
        let mut raw = [0u8; FRAME_HEADER_BYTES];
        self.s.read_exact(&mut raw)?;
        let h = FrameHeader::decode(&raw).expect("server sent a bad header");
        let mut body = vec![0u8; h.body_len as usize];
        self.s.read_exact(&mut body)?;
        h.verify_body(&raw, &body)
            .expect("server sent a bad checksum");
        let mut data = vec![0u8; h.data_len as usize];
        self.s.read_exact(&mut data)?;
        Ok((h, body, data))
    }

    /// Read the server's opening challenge.
    pub fn challenge(&mut self) -> Challenge {
        let (h, body, _) = self.read_frame().unwrap();
        assert_eq!(h.opcode, Opcode::Challenge as u16);
        Challenge::decode(&body).unwrap()
    }

    /// Authenticate as a client with `key`; the welcome's status.
    pub fn handshake(&mut self, key: &ClusterKey) -> u16 {
        self.handshake_as(key, Role::Client)
    }

    /// Authenticate in `role` with `key`; the welcome's status.
    pub fn handshake_as(&mut self, key: &ClusterKey, role: Role) -> u16 {
        let ch = self.challenge();
        let client_nonce = [7u8; 32];
        let hello = Hello {
            role,
            client_nonce,
            proof: key.client_proof(role, &ch.server_nonce, &client_nonce),
            want: ch.server_id,
        };
        let body = hello.encode();
        self.send(&frame(Opcode::Hello, 0, &body, 0));
        self.send(&body);
        let (h, body, _) = self.read_frame().unwrap();
        if h.status == 0 {
            let proof = decode_welcome(&body).unwrap();
            assert_eq!(proof, key.server_proof(&ch.server_nonce, &client_nonce));
        }
        h.status
    }

    pub fn send(&mut self, bytes: &[u8]) {
        // The server may already have hung up: that is fine here.
        let _ = self.s.write_all(bytes);
        let _ = self.s.flush();
    }

    /// Assert that the server closes the connection (EOF or reset) by
    /// itself, without being sent anything more.
    #[track_caller]
    pub fn expect_closed(&mut self, what: &str) {
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue, // e.g. an error frame before closing
                Err(e)
                    if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) =>
                {
                    return
                }
                Err(e) => panic!(
                    "{what}: server kept the connection open ({e} after {:?})",
                    t.elapsed()
                ),
            }
        }
    }
}

/// The cluster key of a test cluster.
pub fn key_of(tc: &TestCluster) -> ClusterKey {
    ClusterConfig::load(tc.cluster_file())
        .unwrap()
        .load_key()
        .unwrap()
}

/// One request `op` to server `server` as `creds`, on a connection of its
/// own: the reply's status and the reply (or the error's message).
pub fn ask_raw(
    tc: &TestCluster,
    server: usize,
    creds: madfs_types::Credentials,
    op: madfs_proto::message::Op,
) -> (u16, Result<madfs_proto::Reply, String>) {
    let mut raw = Raw::connect(tc, server);
    assert_eq!(raw.handshake(&key_of(tc)), 0);
    let opcode = op.opcode();
    let body = madfs_proto::Request {
        creds,
        op,
        once: None,
    }
    .encode();
    raw.send(&frame(opcode, 1, &body, 0));
    raw.send(&body);
    let (h, msg, _) = raw.read_frame().unwrap();
    let reply = if h.status == 0 {
        Ok(madfs_proto::Reply::decode(&msg).unwrap())
    } else {
        Err(madfs_proto::message::decode_error_message(&msg).unwrap_or_default())
    };
    (h.status, reply)
}

/// Create (or truncate) `path`, write `data`, fsync and close: when this
/// returns, the data is acknowledged as durable.
pub async fn write_synced(c: &madfs_client::Client, path: &str, data: &[u8]) {
    let f = c
        .open(
            path,
            madfs_client::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true),
        )
        .await
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    f.write_at(0, data)
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
    f.fsync()
        .await
        .unwrap_or_else(|e| panic!("fsync {path}: {e}"));
    f.close()
        .await
        .unwrap_or_else(|e| panic!("close {path}: {e}"));
}

/// Insist that `program` is on PATH: a missing tool fails the test with the
/// Debian package to install (scripts/setup installs them), never skips it.
pub fn need(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{program}` is not installed: install the Debian package `{package}` \
         (scripts/setup should)"
    );
}
