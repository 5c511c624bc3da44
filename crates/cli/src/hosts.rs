//! `madfs up --hosts`, and `down` of such a cluster: servers on many hosts,
//! reached through a command template (`ssh -o BatchMode=yes {host}` by
//! default, `ip netns exec {host}` in the tests, `srun --overlap -N1 -n1 -w
//! {host}` with `--slurm`).
//!
//! Every host gets one POSIX shell script on the standard input of
//! `<template> sh -s`, so nothing needs quoting through ssh and the key never
//! appears on a command line: the script writes DATA/cluster.toml and
//! DATA/cluster.key (umask 077, mode 0600) on that host (the same path: a
//! shared DATA is simply written once per host, atomically by rename), then
//! starts its servers detached (`setsid`, log DATA/server-N.log, pid file
//! DATA/server-N.pid) unless they already run. Under srun a step's
//! processes die with it, so there the script waits for its servers and the
//! launcher leaves the srun command running in the background.
//!
//! DATA/hosts.toml, beside the cluster file on the launcher's host, records
//! how the hosts were reached, for `madfs down` and for `madfs up --data
//! DATA`, which restarts whatever servers are down.

use madfs_rpc::cluster::{generate_key, write_key_file};
use madfs_rpc::{ClusterConfig, ServerEntry};
use madfs_types::ServerId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

pub const HOSTS_FILE: &str = "hosts.toml";
const CLUSTER_FILE: &str = "cluster.toml";
const KEY_FILE: &str = "cluster.key";
pub const SSH_EXEC: &str = "ssh -o BatchMode=yes -o ConnectTimeout=10 {host}";
pub const SLURM_EXEC: &str = "srun --overlap -N1 -n1 -w {host}";
pub const BASE_PORT: u16 = 7100;
/// How long one command on a host may take (starting or stopping its servers).
const EXEC_TIMEOUT: Duration = Duration::from_secs(90);
/// How long every server has to answer after its host started it.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A host as the user named it, with its address if given.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSpec {
    pub name: String,
    pub addr: Option<IpAddr>,
}

/// What `down` and a restarting `up` need to reach the hosts again
/// (DATA/hosts.toml); the hosts and their servers are in the cluster file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Launcher {
    /// The command template; `{host}` is replaced by the host's name.
    pub exec: String,
    /// Keep the exec command running as long as the host's servers (srun).
    pub foreground: bool,
    /// The madfs binary on the hosts.
    pub madfs: PathBuf,
    /// Each server's chunk cache in MiB (default: a quarter of the host's
    /// memory divided among its servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mib: Option<usize>,
    /// Where `--mount` mounted the cluster on every host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<PathBuf>,
    /// Hosts that get the cluster file and key (and the mount) but run no
    /// server: the job's compute nodes when the servers run elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<String>,
    /// Servers listen on every interface, not only on their address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listen_all: bool,
    /// Servers that replacements took over on other hosts (`up --replace`):
    /// where they run now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<Moved>,
}

/// Where a replaced server runs now.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Moved {
    pub id: u16,
    pub host: String,
    pub address: std::net::SocketAddr,
}

impl Launcher {
    /// Where replaced server `id` runs now, if it was replaced.
    fn moved(&self, id: u16) -> Option<&Moved> {
        self.moved.iter().find(|m| m.id == id)
    }
}

/// `madfs up` options for a cluster across hosts.
pub struct UpOptions {
    /// `--hosts FILE|LIST` (None: restart the cluster in DATA, or --slurm).
    pub hosts: Option<String>,
    pub slurm: bool,
    pub exec: Option<String>,
    pub servers_per_host: u16,
    pub base_port: Option<u16>,
    pub chunk_size: u64,
    pub cache_mib: Option<usize>,
    pub madfs: Option<PathBuf>,
    pub key_stdin: bool,
    pub mount: Option<PathBuf>,
    /// `--client-hosts FILE|LIST`: hosts without servers.
    pub client_hosts: Option<String>,
    pub listen_all: bool,
    /// Copies of every record and chunk (the cluster file's `replicas`).
    pub replicas: u8,
}

fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// Hosts from a file (one per line, `#` comments) or a comma-separated list;
/// each `NAME`, `NAME=ADDR` or `NAME@ADDR`.
pub fn parse_hosts(arg: &str) -> Result<Vec<HostSpec>, String> {
    let text;
    let items: Vec<&str> = if Path::new(arg).is_file() {
        text = std::fs::read_to_string(arg).map_err(|e| format!("{arg}: {e}"))?;
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .collect()
    } else {
        arg.split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect()
    };
    let mut hosts: Vec<HostSpec> = Vec::new();
    for item in items {
        let (name, addr) = match item.split_once(['=', '@']) {
            Some((n, a)) => {
                let addr = a
                    .trim()
                    .parse::<IpAddr>()
                    .map_err(|_| format!("host '{n}': '{a}' is not an IP address"))?;
                (n.trim(), Some(addr))
            }
            None => (item, None),
        };
        if !valid_host_name(name) {
            return Err(format!(
                "'{name}' is not a host name (letters, digits, '.', '-', '_')"
            ));
        }
        if hosts.iter().any(|h| h.name == name) {
            return Err(format!("host '{name}' is listed twice"));
        }
        hosts.push(HostSpec {
            name: name.to_string(),
            addr,
        });
    }
    if hosts.is_empty() {
        return Err(format!("--hosts '{arg}' names no host"));
    }
    Ok(hosts)
}

/// Expand a Slurm host list such as `node[01-03,07],gpu[1-2]-ib` (as
/// `scontrol show hostnames` does).
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, String> {
    // Split at the commas outside brackets.
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("bad host list '{list}': unbalanced brackets"));
        }
    }
    if depth != 0 {
        return Err(format!("bad host list '{list}': unbalanced brackets"));
    }
    items.push(&list[start..]);
    let mut out = Vec::new();
    for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
        expand_one(item, &mut out).map_err(|e| format!("bad host list '{list}': {e}"))?;
    }
    Ok(out)
}

fn expand_one(item: &str, out: &mut Vec<String>) -> Result<(), String> {
    let Some(open) = item.find('[') else {
        out.push(item.to_string());
        return Ok(());
    };
    let close = open + item[open..].find(']').ok_or("unbalanced brackets")?;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    for range in ranges.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let width = lo.len();
        let a: u64 = lo
            .parse()
            .map_err(|_| format!("'{range}' is not a range"))?;
        let b: u64 = hi
            .parse()
            .map_err(|_| format!("'{range}' is not a range"))?;
        if a > b || b - a > 100_000 {
            return Err(format!("'{range}' is not a range"));
        }
        for n in a..=b {
            expand_one(&format!("{prefix}{n:0width$}{rest}"), out)?;
        }
    }
    Ok(())
}

/// Split a command template into words (single and double quotes group
/// words, as in the shell) and put `host` in place of `{host}`.
pub fn exec_argv(template: &str, host: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in template.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("--exec '{template}': unbalanced quotes"));
    }
    if in_word {
        words.push(word);
    }
    if !words.iter().any(|w| w.contains("{host}")) {
        return Err(format!("--exec '{template}' must contain {{host}}"));
    }
    if words.is_empty() {
        return Err("--exec is empty".into());
    }
    Ok(words
        .into_iter()
        .map(|w| w.replace("{host}", host))
        .chain(["sh".to_string(), "-s".to_string()])
        .collect())
}

/// Quote for a POSIX shell.
fn sq(s: impl AsRef<str>) -> String {
    format!("'{}'", s.as_ref().replace('\'', r"'\''"))
}

fn sqp(p: &Path) -> String {
    sq(p.to_string_lossy())
}

/// Where a host keeps its copy of the cluster file and key, its servers'
/// data, logs and pid files: DATA/HOST (so a DATA shared by the hosts
/// holds each host's files apart, and wiping one host leaves the others').
fn host_dir(data: &Path, host: &str) -> PathBuf {
    data.join(host)
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir().map_err(|e| e.to_string())?.join(p))
    }
}

/// The hosts of a cluster in order, each with its servers.
pub fn hosts_of(cfg: &ClusterConfig) -> Vec<(String, Vec<&ServerEntry>)> {
    let mut out: Vec<(String, Vec<&ServerEntry>)> = Vec::new();
    for s in &cfg.servers {
        let h = s.host.clone().unwrap_or_else(|| "localhost".into());
        match out.iter_mut().find(|(n, _)| *n == h) {
            Some((_, v)) => v.push(s),
            None => out.push((h, vec![s])),
        }
    }
    out
}

/// Every host the launcher reaches: the server hosts (with their servers;
/// a replaced server on the host that took it over, and a host whose
/// servers were all replaced left out) and then the client hosts (with
/// none).
fn all_hosts<'a>(cfg: &'a ClusterConfig, l: &Launcher) -> Vec<(String, Vec<&'a ServerEntry>)> {
    let mut hosts = hosts_of(cfg);
    for (host, servers) in hosts.iter_mut() {
        servers.retain(|s| l.moved(s.id).is_none_or(|m| m.host == *host));
    }
    for m in &l.moved {
        let id = m.id;
        let Some(entry) = cfg.server(ServerId(id)) else {
            continue;
        };
        match hosts.iter_mut().find(|(h, _)| *h == m.host) {
            Some((_, v)) => {
                if !v.iter().any(|s| s.id == id) {
                    v.push(entry)
                }
            }
            None => hosts.push((m.host.clone(), vec![entry])),
        }
    }
    hosts.retain(|(_, servers)| !servers.is_empty());
    for c in &l.clients {
        if !hosts.iter().any(|(h, _)| h == c) {
            hosts.push((c.clone(), Vec::new()));
        }
    }
    hosts
}

fn resolve(h: &HostSpec, many: bool) -> Result<IpAddr, String> {
    if let Some(a) = h.addr {
        return Ok(a);
    }
    let addrs: Vec<IpAddr> = (h.name.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| format!("host '{}': cannot resolve its address: {e}", h.name))?
        .map(|a| a.ip())
        .collect();
    let pick = addrs
        .iter()
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .or_else(|| addrs.iter().find(|a| !a.is_loopback()))
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("host '{}' has no address", h.name))?;
    if many && pick.is_loopback() {
        return Err(format!(
            "host '{}' resolves to {pick}, a loopback address other hosts cannot reach; \
             give its address as {}=ADDR",
            h.name, h.name
        ));
    }
    Ok(pick)
}

/// What a command on a host printed, or why it failed.
struct Ran {
    stdout: String,
}

/// Run `script` on `host` through the template and wait for it.
fn run_on(exec: &str, host: &str, script: &str) -> Result<Ran, String> {
    let argv = exec_argv(exec, host)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Own process group: a Ctrl-C meant for the launcher must not cut a
    // host's start or stop short; the launcher cleans up itself.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run '{}': {e}", argv[0]))?;
    let mut stdin = child.stdin.take().expect("piped");
    let script = script.to_string();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(script.as_bytes());
    });
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + EXEC_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "'{}' took more than {EXEC_TIMEOUT:?}",
                    argv.join(" ")
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(e.to_string()),
        }
    };
    let _ = writer.join();
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let status = status?;
    if !status.success() {
        let why = stderr.trim();
        return Err(format!(
            "'{}' failed ({status}){}{why}",
            argv.join(" "),
            if why.is_empty() { "" } else { ": " }
        ));
    }
    Ok(Ran { stdout })
}

/// Start `script` on `host` through the template and leave it running (its
/// output goes to `log`): for srun, whose step's processes die with it.
fn spawn_on(exec: &str, host: &str, script: &str, log: &Path) -> Result<Child, String> {
    let argv = exec_argv(exec, host)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run '{}': {e}", argv[0]))?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(script.as_bytes())
        .map_err(|e| format!("'{}': {e}", argv.join(" ")))?;
    drop(stdin);
    Ok(child)
}

/// The script that writes the cluster file and key on a host and starts
/// its servers (those not running); it prints `started ID` for each.
/// The `case` arms that give replaced servers among `ids` their address
/// and data directory on the host that took them over (and `--replace`
/// for `replacing`, at its first start).
fn moved_cases(l: &Launcher, data: &Path, ids: &[u16], replacing: Option<u16>) -> String {
    let mut arms = String::new();
    for id in ids {
        if let Some(m) = l.moved(*id) {
            let dir = host_dir(data, &m.host).join(format!("server-{id}"));
            let replace = if replacing == Some(*id) {
                " --replace"
            } else {
                ""
            };
            arms.push_str(&format!(
                "{id}) extra=\"--address {} --data-dir {}{replace}\" ;; ",
                m.address,
                sqp(&dir)
            ));
        }
    }
    arms
}

fn start_script(
    l: &Launcher,
    data: &Path,
    cfg_text: &str,
    key_hex: &str,
    host: &str,
    ids: &[u16],
) -> String {
    start_script_replacing(l, data, cfg_text, key_hex, host, ids, None)
}

/// `start_script`, with `replacing` started as a replacement (its first
/// start on the host that takes it over).
fn start_script_replacing(
    l: &Launcher,
    data: &Path,
    cfg_text: &str,
    key_hex: &str,
    host: &str,
    ids: &[u16],
    replacing: Option<u16>,
) -> String {
    let n = ids.len().max(1);
    let cache = match l.cache_mib {
        Some(c) => c.to_string(),
        // A quarter of the host's memory, shared by its servers.
        None => format!("$(( $(awk '/^MemTotal:/ {{print $2}}' /proc/meminfo) / 1024 / 4 / {n} ))"),
    };
    let ids_s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let mut s = format!(
        r#"set -e
umask 077
mkdir -p {hd}
cd {hd}
cat > .cluster.key.{host}.tmp <<'MADFS_KEY_END'
{key_hex}
MADFS_KEY_END
chmod 600 .cluster.key.{host}.tmp
mv -f .cluster.key.{host}.tmp {KEY_FILE}
cat > .cluster.toml.{host}.tmp <<'MADFS_CLUSTER_END'
{cfg_text}
MADFS_CLUSTER_END
chmod 644 .cluster.toml.{host}.tmp
mv -f .cluster.toml.{host}.tmp {CLUSTER_FILE}
if [ ! -x {madfs} ]; then echo "{host}: "{madfs}" is not an executable file there (see --madfs)" >&2; exit 1; fi
threads=$(( $(nproc 2>/dev/null || echo 1) / {n} ))
[ "$threads" -ge 1 ] || threads=1
cache={cache}
new=""
alive() {{ [ -f "$1" ] && p=$(cat "$1") && kill -0 "$p" 2>/dev/null && grep -q server "/proc/$p/cmdline" 2>/dev/null; }}
for id in {ids}; do
  if alive server-$id.pid; then echo "running $id"; continue; fi
  extra=""
  case $id in {moved}*) ;; esac
  setsid {madfs} --cluster {cfg} server --id $id --threads $threads --cache-mib $cache{listen} $extra </dev/null >>server-$id.log 2>&1 &
  echo $! > server-$id.pid
  echo "started $id"
  new="$new $id"
done
# A server that cannot start (address taken, bad data) usually exits at once.
[ -z "$new" ] || sleep 0.5
for id in $new; do
  if ! alive server-$id.pid; then
    echo "server $id exited at once; $(pwd)/server-$id.log says:" >&2
    tail -n 5 server-$id.log >&2
    exit 1
  fi
done
"#,
        hd = sqp(&host_dir(data, host)),
        madfs = sqp(&l.madfs),
        cfg = sqp(&host_dir(data, host).join(CLUSTER_FILE)),
        ids = ids_s.join(" "),
        listen = if l.listen_all { " --listen-all" } else { "" },
        moved = moved_cases(l, data, ids, replacing),
    );
    if l.foreground {
        s.push_str("wait\n");
    }
    s
}

/// The script that stops servers `ids` on a host (SIGTERM, SIGKILL after
/// 30 s) and with `wipe` removes their data, logs and the cluster files.
fn stop_script(l: &Launcher, data: &Path, host: &str, ids: &[u16], wipe: bool) -> String {
    let ids_s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let mut s = format!("cd {} 2>/dev/null || exit 0\n", sqp(&host_dir(data, host)));
    if let Some(m) = &l.mount {
        // Unmount (the daemon then exits), else SIGTERM the daemon, which
        // unmounts too.
        s.push_str(&format!(
            r#"if [ -f mount.pid ]; then
  p=$(cat mount.pid)
  if kill -0 "$p" 2>/dev/null && grep -q mount "/proc/$p/cmdline" 2>/dev/null; then
    {madfs} umount {dir} >/dev/null 2>&1 || kill -TERM "$p"
    i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  fi
  rm -f mount.pid
fi
"#,
            madfs = sqp(&l.madfs),
            dir = sqp(m),
        ));
    }
    s.push_str(&format!(
        r#"
stopping=""
for id in {ids}; do
  f=server-$id.pid
  [ -f $f ] || continue
  p=$(cat $f)
  if kill -0 "$p" 2>/dev/null && grep -q server "/proc/$p/cmdline" 2>/dev/null; then
    kill -TERM "$p"; stopping="$stopping $id:$p"
  fi
done
i=0
for e in $stopping; do
  id=${{e%%:*}}; p=${{e#*:}}
  while kill -0 "$p" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  if kill -0 "$p" 2>/dev/null; then echo "server $id did not stop in 30 s; killing it" >&2; kill -KILL "$p"; fi
  echo "stopped $id"
done
for id in {ids}; do rm -f server-$id.pid; done
"#,
        ids = ids_s.join(" "),
    ));
    if wipe {
        s.push_str(&format!(
            r#"cd /
rm -rf {hd}
rmdir {data} 2>/dev/null || true
"#,
            hd = sqp(&host_dir(data, host)),
            data = sqp(data),
        ));
    }
    s
}

fn load_launcher(data: &Path) -> Result<Launcher, String> {
    let p = data.join(HOSTS_FILE);
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

fn save_launcher(data: &Path, l: &Launcher) -> Result<(), String> {
    let p = data.join(HOSTS_FILE);
    let text = toml::to_string_pretty(l).expect("launcher serializes");
    std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
}

/// A cluster across hosts lives in DATA?
pub fn is_multihost(data: &Path) -> bool {
    data.join(HOSTS_FILE).exists()
}

/// Hosts for a new cluster: --hosts, or the Slurm allocation's nodes.
fn host_specs(o: &UpOptions) -> Result<Vec<HostSpec>, String> {
    match (&o.hosts, o.slurm) {
        (Some(h), _) => parse_hosts(h),
        (None, true) => {
            let list = std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                "--slurm: SLURM_JOB_NODELIST is not set (run inside an allocation)".to_string()
            })?;
            expand_nodelist(&list)?
                .into_iter()
                .map(|name| {
                    if !valid_host_name(&name) {
                        return Err(format!("SLURM_JOB_NODELIST: bad host name '{name}'"));
                    }
                    Ok(HostSpec { name, addr: None })
                })
                .collect()
        }
        (None, false) => Err("give --hosts FILE|LIST or --slurm".into()),
    }
}

/// Build and write the cluster file, key and hosts.toml of a new cluster.
fn create(data: &Path, o: &UpOptions) -> Result<(ClusterConfig, Launcher), String> {
    let specs = host_specs(o)?;
    let per = o.servers_per_host;
    let total = specs.len() * per as usize;
    if per == 0 || total > madfs_types::limits::SERVERS_MAX {
        return Err(format!(
            "{} hosts x {per} servers: need 1 to {} servers in all",
            specs.len(),
            madfs_types::limits::SERVERS_MAX
        ));
    }
    let base = o.base_port.unwrap_or(BASE_PORT);
    // Each host: servers on base, base+1, ...; their metrics right after.
    if base as usize + 2 * per as usize > 65536 {
        return Err("--base-port too high".into());
    }
    let mut servers = Vec::new();
    for h in &specs {
        let ip = resolve(h, specs.len() > 1)?;
        for i in 0..per {
            let id = servers.len() as u16;
            servers.push(ServerEntry {
                id,
                address: SocketAddr::new(ip, base + i),
                data_dir: host_dir(data, &h.name).join(format!("server-{id}")),
                metrics: Some(SocketAddr::new(ip, base + per + i)),
                host: Some(h.name.clone()),
            });
        }
    }
    let cfg = ClusterConfig {
        cluster_id: format!(
            "madfs-{}-{}",
            specs[0].name,
            chrono::Utc::now().format("%Y%m%d%H%M%S")
        ),
        chunk_size: o.chunk_size,
        key_file: PathBuf::from(KEY_FILE),
        replicas: o.replicas,
        voters: madfs_rpc::cluster::voters_for(servers.len()),
        servers,
    };
    cfg.validate().map_err(|e| e.to_string())?;
    let key = if o.key_stdin {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| format!("--key-stdin: {e}"))?;
        madfs_proto::auth::ClusterKey::from_hex(&s)
            .ok_or("--key-stdin: standard input must hold the key as 64 hex digits")?
    } else {
        generate_key()
    };
    let madfs = match &o.madfs {
        Some(p) => absolute(p)?,
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let launcher = Launcher {
        exec: match (&o.exec, o.slurm) {
            (Some(e), _) => e.clone(),
            (None, true) => SLURM_EXEC.to_string(),
            (None, false) => SSH_EXEC.to_string(),
        },
        foreground: o.slurm,
        madfs,
        cache_mib: o.cache_mib,
        mount: None,
        clients: match &o.client_hosts {
            None => Vec::new(),
            Some(list) => {
                let mut names = Vec::new();
                for h in parse_hosts(list)? {
                    if specs.iter().any(|s| s.name == h.name) {
                        return Err(format!(
                            "host '{}' is in both --hosts and --client-hosts",
                            h.name
                        ));
                    }
                    names.push(h.name);
                }
                names
            }
        },
        listen_all: o.listen_all,
        moved: Vec::new(),
    };
    // Check the template before writing anything.
    exec_argv(&launcher.exec, "h")?;
    write_key_file(&data.join(KEY_FILE), &key).map_err(|e| format!("writing the key: {e}"))?;
    let cfg_path = data.join(CLUSTER_FILE);
    std::fs::write(&cfg_path, cfg.to_toml())
        .map_err(|e| format!("writing {}: {e}", cfg_path.display()))?;
    save_launcher(data, &launcher)?;
    Ok((cfg, launcher))
}

/// Stop servers `ids` of `host`: how many were running, or why it failed.
fn stop_host(
    l: &Launcher,
    data: &Path,
    host: &str,
    ids: &[u16],
    wipe: bool,
) -> Result<usize, String> {
    run_on(&l.exec, host, &stop_script(l, data, host, ids, wipe)).map(|r| {
        r.stdout
            .lines()
            .filter(|l| l.starts_with("stopped "))
            .count()
    })
}

/// Stop what this launch started, on every host, in parallel, and with
/// `wipe` (a new cluster) remove its files there. Stop errors of hosts in
/// `failed` (already reported) are not repeated.
fn roll_back(
    l: &Launcher,
    data: &Path,
    started: &BTreeMap<String, Vec<u16>>,
    failed: &[String],
    wipe: bool,
    children: &mut [(String, Child)],
) {
    std::thread::scope(|sc| {
        for (host, ids) in started {
            sc.spawn(move || {
                let r = stop_host(l, data, host, ids, wipe);
                if let (Err(e), false) = (r, failed.contains(host)) {
                    eprintln!("madfs: stopping the servers started on host '{host}': {e}");
                }
            });
        }
    });
    for (_, c) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A host's start: its name, its servers, those it started (or why it
/// failed), and the srun command left running with where its log began.
type HostStart = (
    String,
    Vec<u16>,
    Result<Vec<u16>, String>,
    Option<(Child, u64)>,
);

/// The servers a host's srun command says it started (`started ID` lines
/// in its log after `from`).
fn started_in_log(log: &Path, from: u64) -> Vec<u16> {
    let all = std::fs::read(log).unwrap_or_default();
    let new = String::from_utf8_lossy(all.get(from as usize..).unwrap_or_default()).into_owned();
    new.lines()
        .filter_map(|l| l.strip_prefix("started "))
        .filter_map(|id| id.trim().parse().ok())
        .collect()
}

pub fn up(data: &Path, o: &UpOptions) -> Result<ExitCode, String> {
    let data = absolute(data)?;
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    let cfg_path = data.join(CLUSTER_FILE);
    let fresh = !is_multihost(&data);
    let (cfg, mut launcher) = if fresh {
        if cfg_path.exists() {
            return Err(format!(
                "{} holds a local cluster; stop it and use another --data",
                data.display()
            ));
        }
        let (_, l) = create(&data, o)?;
        (
            ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?,
            l,
        )
    } else {
        let cfg = ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?;
        let l = load_launcher(&data)?;
        if let Some(h) = &o.hosts {
            let want: Vec<String> = parse_hosts(h)?.into_iter().map(|h| h.name).collect();
            let have: Vec<String> = hosts_of(&cfg).into_iter().map(|(h, _)| h).collect();
            if want != have {
                return Err(format!(
                    "{} already holds a cluster on hosts {}; restart it with `madfs up --data {}` \
                     or remove it with `madfs down --wipe --data {}`",
                    data.display(),
                    have.join(","),
                    data.display(),
                    data.display()
                ));
            }
        }
        (cfg, l)
    };
    let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|e| e.to_string())?;
    let key_hex = cfg.load_key().map_err(|e| e.to_string())?.to_hex();
    let server_hosts = hosts_of(&cfg).len();
    let hosts = all_hosts(&cfg, &launcher);

    // Start every host's servers, in parallel.
    let mut started: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut failed_hosts: Vec<String> = Vec::new();
    let results: Vec<HostStart> = std::thread::scope(|sc| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|(host, servers)| {
                let ids: Vec<u16> = servers.iter().map(|s| s.id).collect();
                let script = start_script(&launcher, &data, &cfg_text, &key_hex, host, &ids);
                let (l, data) = (&launcher, &data);
                sc.spawn(move || {
                    if l.foreground {
                        let log = data.join(format!("launch-{host}.log"));
                        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
                        match spawn_on(&l.exec, host, &script, &log) {
                            Ok(c) => (host.clone(), ids.clone(), Ok(ids), Some((c, from))),
                            Err(e) => (host.clone(), ids, Err(e), None),
                        }
                    } else {
                        let r = run_on(&l.exec, host, &script).map(|ran| {
                            ran.stdout
                                .lines()
                                .filter_map(|l| l.strip_prefix("started "))
                                .filter_map(|id| id.trim().parse().ok())
                                .collect()
                        });
                        (host.clone(), ids, r, None)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("host thread"))
            .collect()
    });
    let mut log_starts: Vec<(String, u64)> = Vec::new();
    for (host, ids, r, child) in results {
        match r {
            Ok(s) => {
                started.insert(host.clone(), s);
            }
            Err(e) => {
                // It may have started some before failing.
                started.insert(host.clone(), ids);
                failed_hosts.push(host.clone());
                failures.push(format!("host '{host}': {e}"));
            }
        }
        if let Some((c, from)) = child {
            log_starts.push((host.clone(), from));
            children.push((host, c));
        }
    }
    if !failures.is_empty() {
        roll_back(
            &launcher,
            &data,
            &started,
            &failed_hosts,
            fresh,
            &mut children,
        );
        if fresh {
            forget(&data);
        }
        return Err(format!(
            "could not start the servers; stopped those started on the other hosts:\n  {}",
            failures.join("\n  ")
        ));
    }

    // Wait until every server answers.
    if let Err(e) = wait_ready(&cfg_path, &cfg, &launcher, &data, &mut children) {
        // Under srun, only the servers a step says it started (not those
        // that were running already).
        for (host, from) in &log_starts {
            let log = data.join(format!("launch-{host}.log"));
            started.insert(host.clone(), started_in_log(&log, *from));
        }
        roll_back(&launcher, &data, &started, &[], fresh, &mut children);
        if fresh {
            forget(&data);
        }
        return Err(format!("{e}\n(stopped every server this command started)"));
    }
    // The srun steps keep running after this command exits.
    for (_, c) in children {
        std::mem::forget(c);
    }
    // Under srun the steps have said by now which servers they started.
    for (host, from) in &log_starts {
        let log = data.join(format!("launch-{host}.log"));
        started.insert(host.clone(), started_in_log(&log, *from));
    }
    let n_started: usize = started.values().map(Vec::len).sum();
    let clients = match launcher.clients.len() {
        0 => String::new(),
        n => format!(" and {n} client hosts"),
    };
    println!(
        "MadFS cluster up: {} servers on {server_hosts} hosts{clients} ({n_started} started now), \
         cluster file {}",
        cfg.server_count(),
        cfg_path.display()
    );
    // A restart mounts again where the cluster was mounted.
    if let Some(dir) = o.mount.clone().or(launcher.mount.clone()) {
        mount_all(&mut launcher, &data, &hosts, &dir)?;
        save_launcher(&data, &launcher)?;
        println!("Mounted on {} on every host", dir.display());
    }
    println!();
    println!("  export MADFS_CLUSTER={}", cfg_path.display());
    println!("  madfs status                          # every server, by host");
    println!(
        "  madfs down --data {}   # stop it (--wipe: and remove its data)",
        data.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The last lines of a local file.
fn tail_local(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// Remove the launcher's files of a cluster that never started.
fn forget(data: &Path) {
    for f in [CLUSTER_FILE, KEY_FILE, HOSTS_FILE] {
        let _ = std::fs::remove_file(data.join(f));
    }
    if let Ok(rd) = std::fs::read_dir(data) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("launch-") && name.ends_with(".log") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(data);
}

fn wait_ready(
    cfg_path: &Path,
    cfg: &ClusterConfig,
    l: &Launcher,
    data: &Path,
    children: &mut [(String, Child)],
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = madfs_client::Client::connect(Some(cfg_path)).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let stats = rt.block_on(client.server_stats());
        let down: Vec<(ServerId, String)> = stats
            .into_iter()
            .filter_map(|(id, r)| r.err().map(|e| (id, e.to_string())))
            .collect();
        if down.is_empty() {
            return Ok(());
        }
        for (host, c) in children.iter_mut() {
            // A step exits successfully at once when its servers ran already.
            if let Ok(Some(status)) = c.try_wait().map(|s| s.filter(|s| !s.success())) {
                let log = data.join(format!("launch-{host}.log"));
                return Err(format!(
                    "host '{host}': the command running its servers exited ({status}); \
                     {} says:\n{}",
                    log.display(),
                    tail_local(&log)
                ));
            }
        }
        if Instant::now() > deadline {
            let mut msg = Vec::new();
            for (id, e) in down {
                let Some(s) = cfg.server(id) else { continue };
                let host = s.host.as_deref().unwrap_or("?");
                let log = host_dir(data, host).join(format!("server-{}.log", id.0));
                let tail = run_on(&l.exec, host, &format!("tail -n 5 {} 2>&1", sqp(&log)))
                    .map(|r| r.stdout)
                    .unwrap_or_else(|e| e);
                msg.push(format!(
                    "host '{host}': server {} ({}) did not answer within {START_TIMEOUT:?} ({e}); \
                     {} says:\n{}",
                    id.0,
                    s.address,
                    log.display(),
                    tail.trim_end()
                ));
            }
            return Err(msg.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The script that mounts the cluster on `dir` on a host (unless its mount
/// daemon runs already): `madfs mount --foreground` started detached, with
/// its pid in DATA/mount-HOST.pid for `down`, and waited for until the
/// mount shows.
fn mount_script(l: &Launcher, data: &Path, host: &str, dir: &Path) -> String {
    let mut s = format!(
        r#"cd {hd}
mkdir -p {dir}
alive_m() {{ [ -f mount.pid ] && p=$(cat mount.pid) && kill -0 "$p" 2>/dev/null && grep -q mount "/proc/$p/cmdline" 2>/dev/null; }}
if ! alive_m; then
  setsid {madfs} --cluster {cfg} mount --foreground {dir} </dev/null >>mount.log 2>&1 &
  p=$!
  echo $p > mount.pid
  i=0
  until awk -v d={dir} '$2 == d && $3 ~ /^fuse/ {{ f = 1 }} END {{ exit !f }}' /proc/self/mounts; do
    # Still running (not exited, which leaves a zombie until this shell
    # exits)? Its command line may not say "mount" yet: it may not have
    # exec'd.
    st=$(sed -n 's/.*) \(.\).*/\1/p' /proc/$p/stat 2>/dev/null)
    if [ -z "$st" ] || [ "$st" = Z ] || [ $i -ge 300 ]; then
      echo "mounting {dir_text} failed; $(pwd)/mount.log says:" >&2
      tail -n 5 mount.log >&2
      kill "$p" 2>/dev/null
      exit 1
    fi
    sleep 0.1; i=$((i+1))
  done
  echo mounted
fi
"#,
        hd = sqp(&host_dir(data, host)),
        dir = sqp(dir),
        dir_text = dir.display(),
        madfs = sqp(&l.madfs),
        cfg = sqp(&host_dir(data, host).join(CLUSTER_FILE)),
    );
    if l.foreground {
        s.push_str("wait\n");
    }
    s
}

fn mount_all(
    l: &mut Launcher,
    data: &Path,
    hosts: &[(String, Vec<&ServerEntry>)],
    dir: &Path,
) -> Result<(), String> {
    let dir = absolute(dir)?;
    l.mount = Some(dir.clone());
    let errors: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = hosts
            .iter()
            .map(|(host, _)| {
                let (l, dir) = (&*l, &dir);
                sc.spawn(move || {
                    let script = mount_script(l, data, host, dir);
                    let r = if l.foreground {
                        // The step must outlive this command (srun kills
                        // a step's processes when it ends).
                        let log = data.join(format!("launch-mount-{host}.log"));
                        spawn_on(&l.exec, host, &script, &log).map(std::mem::forget)
                    } else {
                        run_on(&l.exec, host, &script).map(|_| ())
                    };
                    r.map_err(|e| format!("host '{host}': mount: {e}"))
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("mount thread").err())
            .collect()
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the servers run, but mounting failed:\n  {}",
            errors.join("\n  ")
        ))
    }
}

/// `madfs up --replace ID --on HOST`: start a replacement of lost server
/// `id` on `on` (`madfs server --replace` there, at the server's port on
/// that host's address) and remember it there for `down` and later `up`
/// runs. It answers once the cluster has given the old server up, and is
/// rebuilt in the background (`madfs status` shows it).
pub fn replace(data: &Path, id: u16, on: &str) -> Result<ExitCode, String> {
    let data = absolute(data)?;
    let cfg_path = data.join(CLUSTER_FILE);
    let cfg = ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?;
    let mut launcher = load_launcher(&data)?;
    if cfg.replicas < 2 {
        return Err(format!(
            "the cluster in {} keeps no replicas: a lost server's data exist nowhere else",
            data.display()
        ));
    }
    let entry = cfg
        .server(ServerId(id))
        .ok_or_else(|| format!("no server {id} in {}", cfg_path.display()))?;
    let spec = match parse_hosts(on)?.as_slice() {
        [one] => one.clone(),
        _ => return Err(format!("--on takes one host, not '{on}'")),
    };
    let address = std::net::SocketAddr::new(resolve(&spec, true)?, entry.address.port());
    let before = launcher.clone();
    launcher.moved.retain(|m| m.id != id);
    launcher.moved.push(Moved {
        id,
        host: spec.name.clone(),
        address,
    });
    // Kept first: `down` must find the replacement once it may run.
    save_launcher(&data, &launcher)?;
    let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|e| e.to_string())?;
    let key_hex = cfg.load_key().map_err(|e| e.to_string())?.to_hex();
    let script = start_script_replacing(
        &launcher,
        &data,
        &cfg_text,
        &key_hex,
        &spec.name,
        &[id],
        Some(id),
    );
    let started = if launcher.foreground {
        let log = data.join(format!("launch-{}.log", spec.name));
        // The step keeps running with the server, as `up` leaves its own.
        spawn_on(&launcher.exec, &spec.name, &script, &log).map(std::mem::forget)
    } else {
        run_on(&launcher.exec, &spec.name, &script).map(|_| ())
    };
    if let Err(e) = started {
        save_launcher(&data, &before)?;
        return Err(format!("host '{}': {e}", spec.name));
    }
    println!(
        "Replacing server {id} on {} at {address}: it takes over once the cluster has given the \
         old server up, then is rebuilt from the replicas; `madfs status` shows the progress",
        spec.name
    );
    Ok(ExitCode::SUCCESS)
}

pub fn down(data: &Path, wipe: bool) -> Result<ExitCode, String> {
    let data = absolute(data)?;
    let cfg_path = data.join(CLUSTER_FILE);
    let cfg = ClusterConfig::load(&cfg_path).map_err(|e| e.to_string())?;
    let l = load_launcher(&data)?;
    let server_hosts = hosts_of(&cfg).len();
    let hosts = all_hosts(&cfg, &l);
    let results: Vec<Result<usize, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = hosts
            .iter()
            .map(|(host, servers)| {
                let ids: Vec<u16> = servers.iter().map(|s| s.id).collect();
                let (l, data) = (&l, &data);
                sc.spawn(move || {
                    stop_host(l, data, host, &ids, wipe).map_err(|e| format!("host '{host}': {e}"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("host thread"))
            .collect()
    });
    let stopped: usize = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        return Err(format!(
            "could not stop every host (run `madfs down` again once they are reachable):\n  {}",
            errors.join("\n  ")
        ));
    }
    if wipe {
        for f in [CLUSTER_FILE, KEY_FILE, HOSTS_FILE] {
            let _ = std::fs::remove_file(data.join(f));
        }
        for (host, _) in &hosts {
            let _ = std::fs::remove_file(data.join(format!("launch-{host}.log")));
            let _ = std::fs::remove_file(data.join(format!("launch-mount-{host}.log")));
        }
        let _ = std::fs::remove_dir(&data);
    }
    println!(
        "MadFS cluster down: stopped {stopped} running servers of {} on {server_hosts} hosts{}{}",
        cfg.server_count(),
        match l.clients.len() {
            0 => String::new(),
            n => format!(" (and the mounts of {n} client hosts)"),
        },
        if wipe {
            ", their data removed"
        } else {
            " (data kept)"
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_node_lists_expand() {
        assert_eq!(
            expand_nodelist("node[01-03,07]").unwrap(),
            ["node01", "node02", "node03", "node07"]
        );
        assert_eq!(
            expand_nodelist("a1,b[8-10],c").unwrap(),
            ["a1", "b8", "b9", "b10", "c"]
        );
        assert_eq!(
            expand_nodelist("r[1-2]n[1,3]-ib").unwrap(),
            ["r1n1-ib", "r1n3-ib", "r2n1-ib", "r2n3-ib"]
        );
        assert_eq!(expand_nodelist("single").unwrap(), ["single"]);
        assert!(expand_nodelist("n[1-").is_err());
        assert!(expand_nodelist("n[3-1]").is_err());
        assert!(expand_nodelist("n[x]").is_err());
        assert!(expand_nodelist("n]1[").is_err());
    }

    #[test]
    fn exec_templates_become_argv() {
        assert_eq!(
            exec_argv(SLURM_EXEC, "node07").unwrap(),
            [
                "srun",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                "node07",
                "sh",
                "-s"
            ]
        );
        assert_eq!(
            exec_argv("ip netns exec {host}", "h1").unwrap(),
            ["ip", "netns", "exec", "h1", "sh", "-s"]
        );
        assert_eq!(
            exec_argv("ssh -o 'ProxyJump gw' {host}.ib", "n1").unwrap(),
            ["ssh", "-o", "ProxyJump gw", "n1.ib", "sh", "-s"]
        );
        assert!(exec_argv("ssh", "n1").unwrap_err().contains("{host}"));
        assert!(exec_argv("ssh '{host}", "n1").is_err());
    }

    #[test]
    fn host_lists_parse() {
        let h = parse_hosts("a=10.0.0.1, b@10.0.0.2,c").unwrap();
        assert_eq!(h[0].addr, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(h[1].name, "b");
        assert_eq!(h[2].addr, None);
        assert!(parse_hosts("a,a").unwrap_err().contains("twice"));
        assert!(parse_hosts("a=notanip").unwrap_err().contains("not an IP"));
        assert!(parse_hosts("a;rm -rf").is_err());
        assert!(parse_hosts("..").is_err());
        assert!(parse_hosts("-oProxyCommand=x").is_err());
        assert!(parse_hosts(" , ").is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("hosts");
        std::fs::write(&f, "# compute nodes\nn1 = 10.1.0.1  # first\n\nn2\n").unwrap();
        let h = parse_hosts(f.to_str().unwrap()).unwrap();
        assert_eq!(
            h,
            [
                HostSpec {
                    name: "n1".into(),
                    addr: Some("10.1.0.1".parse().unwrap())
                },
                HostSpec {
                    name: "n2".into(),
                    addr: None
                }
            ]
        );
    }

    #[test]
    fn scripts_quote_paths_and_keep_the_key_off_argv() {
        let l = Launcher {
            exec: SLURM_EXEC.into(),
            foreground: true,
            madfs: "/opt/it's/madfs".into(),
            cache_mib: Some(64),
            mount: None,
            clients: vec!["c1".into()],
            listen_all: true,
            moved: Vec::new(),
        };
        let s = start_script(&l, Path::new("/scratch/d"), "x = 1", "abcd", "n1", &[3, 4]);
        assert!(s.contains(r"'/opt/it'\''s/madfs' --cluster '/scratch/d/n1/cluster.toml' server"));
        assert!(s.contains("cd '/scratch/d/n1'\n"));
        assert!(s.contains("for id in 3 4;"));
        assert!(s.contains("--cache-mib $cache --listen-all $extra </dev/null"));
        assert!(s.contains("case $id in *) ;; esac"));
        assert!(s.contains("umask 077"));
        assert!(s.contains("\nabcd\n"));
        assert!(s.ends_with("wait\n"));
        let d = stop_script(&l, Path::new("/scratch/d"), "n1", &[3, 4], true);
        assert!(d.contains("rm -rf '/scratch/d/n1'\n"));
        assert!(d.contains("rmdir '/scratch/d'"));
        // A client host: the files, no server.
        let c = start_script(&l, Path::new("/scratch/d"), "x = 1", "abcd", "c1", &[]);
        assert!(c.contains("for id in ; do"));
        assert!(c.contains("\nabcd\n"));
    }

    #[test]
    fn a_replaced_server_runs_on_the_host_that_took_it_over() {
        let text = "cluster_id = \"t\"\nchunk_size = 1048576\nkey_file = \"cluster.key\"\nreplicas = 2\n\
                    [[server]]\nid = 0\naddress = \"10.0.0.1:7100\"\ndata_dir = \"/d/n0/server-0\"\nhost = \"n0\"\n\
                    [[server]]\nid = 1\naddress = \"10.0.0.2:7100\"\ndata_dir = \"/d/n1/server-1\"\nhost = \"n1\"\n";
        let cfg = ClusterConfig::from_toml(text).unwrap();
        let l = Launcher {
            exec: SSH_EXEC.into(),
            foreground: false,
            madfs: "/bin/madfs".into(),
            cache_mib: None,
            mount: None,
            clients: Vec::new(),
            listen_all: false,
            moved: vec![Moved {
                id: 0,
                host: "n9".into(),
                address: "10.0.0.9:7100".parse().unwrap(),
            }],
        };
        // It keeps in hosts.toml.
        let text = toml::to_string_pretty(&l).unwrap();
        assert_eq!(toml::from_str::<Launcher>(&text).unwrap(), l);
        let hosts: Vec<(String, Vec<u16>)> = all_hosts(&cfg, &l)
            .into_iter()
            .map(|(h, s)| (h, s.iter().map(|e| e.id).collect()))
            .collect();
        // n0 ran only server 0: left out (it may be gone for good).
        assert_eq!(hosts, vec![("n1".into(), vec![1]), ("n9".into(), vec![0])]);
        let d = Path::new("/d");
        let first = start_script_replacing(&l, d, "x", "k", "n9", &[0], Some(0));
        assert!(
            first.contains(
                "0) extra=\"--address 10.0.0.9:7100 --data-dir '/d/n9/server-0' --replace\" ;;"
            ),
            "{first}"
        );
        let again = start_script(&l, d, "x", "k", "n9", &[0]);
        assert!(
            again.contains("0) extra=\"--address 10.0.0.9:7100 --data-dir '/d/n9/server-0'\" ;;"),
            "{again}"
        );
    }
}
