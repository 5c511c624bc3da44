//! File commands over the client library, no mount needed: ls, stat, mkdir,
//! put, get, cat, rm, mv, ln. Errors print like coreutils: the command, the
//! path, and what went wrong; times print as ls(1) and stat(1) print them,
//! in the local time zone.

use crate::Command;
use chrono::{Local, TimeZone};
use madfs_client::{Attr, Client, ClientError, ErrorCode, FileKind, OpenOptions, Timestamp};
use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

/// Bytes moved per request by put/get: a few chunks in flight at once.
const COPY_BLOCK_BYTES: usize = 8 * 1024 * 1024;

pub fn run(cluster: Option<&Path>, cmd: Command) -> Result<ExitCode, String> {
    let client = Client::connect(cluster).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run_async(&client, cmd))
}

/// What a command says of `e`: the error's name, as coreutils would say
/// it; for a server out of reach also which one and why (which set has no
/// copy left, and since when), as the name alone does not tell.
pub(crate) fn shown(e: &ClientError) -> String {
    match e.code {
        ErrorCode::Unavailable | ErrorCode::TimedOut if !e.message.is_empty() => {
            // The command names the path already: the client's own
            // "cannot stat '/x': " before the cause is left out.
            let cause = match e.message.starts_with("cannot ") {
                true => e.message.split_once("': ").map_or(&*e.message, |(_, c)| c),
                false => &e.message,
            };
            format!("{} ({cause})", e.code.describe())
        }
        code => code.describe().to_string(),
    }
}

fn fail(cmd: &str, path: &str, e: ClientError) -> String {
    format!("{cmd}: cannot access '{path}': {}", shown(&e))
}

async fn run_async(c: &Client, cmd: Command) -> Result<ExitCode, String> {
    let mut failed = false;
    match cmd {
        Command::Ls { long, paths } => {
            let many = paths.len() > 1;
            for p in &paths {
                match c.lstat(p.as_str()).await {
                    Err(e) => {
                        eprintln!("madfs ls: cannot access '{p}': {}", shown(&e));
                        failed = true;
                    }
                    Ok(a) if a.kind != FileKind::Dir => print_entry(c, p, p, &a, long).await,
                    Ok(_) => {
                        if many {
                            println!("{p}:");
                        }
                        let entries = c.read_dir(p.as_str()).await.map_err(|e| fail("ls", p, e))?;
                        for ent in entries {
                            let name = ent.name.to_string_lossy();
                            let full = format!("{}/{}", p.trim_end_matches('/'), name);
                            match c.lstat(full.as_str()).await {
                                Ok(a) => print_entry(c, &full, &name, &a, long).await,
                                // Removed between readdir and stat: skip.
                                Err(_) => continue,
                            }
                        }
                    }
                }
            }
        }
        Command::Stat { paths } => {
            for p in &paths {
                match c.lstat(p.as_str()).await {
                    Ok(a) => print_stat(p, &a),
                    Err(e) => {
                        eprintln!("madfs stat: cannot stat '{p}': {}", shown(&e));
                        failed = true;
                    }
                }
            }
        }
        Command::Mkdir {
            parents,
            mode,
            paths,
        } => {
            let perm = u32::from_str_radix(&mode, 8)
                .map_err(|_| format!("mkdir: invalid mode '{mode}'"))?;
            if perm > 0o7777 {
                return Err(format!("mkdir: invalid mode '{mode}'"));
            }
            for p in &paths {
                let r = if parents {
                    c.mkdir_all(p.as_str(), perm).await
                } else {
                    c.mkdir(p.as_str(), perm).await
                };
                if let Err(e) = r {
                    eprintln!("madfs mkdir: cannot create directory '{p}': {}", shown(&e));
                    failed = true;
                }
            }
        }
        Command::Mknod {
            mode,
            path,
            kind,
            major,
            minor,
        } => {
            let perm = u32::from_str_radix(&mode, 8)
                .ok()
                .filter(|p| *p <= 0o7777)
                .ok_or_else(|| format!("mknod: invalid mode '{mode}'"))?;
            let (kind, rdev) = mknod_args(&kind, major, minor)?;
            if let Err(e) = c.mknod(path.as_str(), kind, perm, rdev).await {
                eprintln!("madfs mknod: '{path}': {}", shown(&e));
                failed = true;
            }
        }
        Command::Put { local, remote } => put(c, &local, &remote).await?,
        Command::Get { remote, local } => get(c, &remote, &local).await?,
        Command::Cat { paths } => {
            let mut out = std::io::stdout().lock();
            for p in &paths {
                if let Err(e) = copy_out(c, p, &mut out).await {
                    eprintln!("madfs cat: {p}: {e}");
                    failed = true;
                }
            }
        }
        Command::Rm {
            recursive,
            force,
            paths,
        } => {
            for p in &paths {
                let r = match c.lstat(p.as_str()).await {
                    Ok(a) if a.kind == FileKind::Dir => {
                        if recursive {
                            c.remove_dir_all(p.as_str()).await
                        } else {
                            eprintln!("madfs rm: cannot remove '{p}': Is a directory (use -r)");
                            failed = true;
                            continue;
                        }
                    }
                    Ok(_) => c.remove_file(p.as_str()).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = r {
                    if !(force && e.code == madfs_client::ErrorCode::NotFound) {
                        eprintln!("madfs rm: cannot remove '{p}': {}", shown(&e));
                        failed = true;
                    }
                }
            }
        }
        Command::Mv { from, to } => {
            // Like mv: moving onto an existing directory moves into it.
            let target = match c.stat(to.as_str()).await {
                Ok(a) if a.kind == FileKind::Dir => {
                    let base = from
                        .trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or(&from)
                        .to_string();
                    format!("{}/{}", to.trim_end_matches('/'), base)
                }
                _ => to.clone(),
            };
            c.rename(from.as_str(), target.as_str())
                .await
                .map_err(|e| format!("mv: cannot move '{from}' to '{target}': {}", shown(&e)))?;
        }
        Command::Ln {
            symbolic,
            target,
            link,
        } => {
            let r = if symbolic {
                c.symlink(target.as_str(), link.as_str()).await
            } else {
                c.hard_link(target.as_str(), link.as_str()).await
            };
            r.map_err(|e| {
                format!(
                    "ln: failed to create link '{link}' -> '{target}': {}",
                    shown(&e)
                )
            })?;
        }
        Command::Server { .. }
        | Command::Up { .. }
        | Command::Down { .. }
        | Command::Status
        | Command::Metrics { .. }
        | Command::Mount { .. }
        | Command::Umount { .. }
        | Command::Find { .. }
        | Command::Du { .. }
        | Command::Fsck { .. }
        | Command::Run { .. }
        | Command::Fsx(_)
        | Command::Cp(_)
        | Command::Sync(_)
        | Command::StageWorker(_)
        | Command::Bench { .. } => {
            unreachable!("handled in main")
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Where `put LOCAL REMOTE` writes: REMOTE, or REMOTE/<LOCAL's name> when
/// REMOTE is a directory (or a symlink to one), as cp(1) does.
async fn put_target(c: &Client, local: &Path, remote: &str) -> Result<String, String> {
    match c.stat(remote).await {
        Ok(a) if a.kind == FileKind::Dir => {
            let name = if local == Path::new("-") {
                None
            } else {
                local.file_name()
            };
            let name = name.ok_or_else(|| {
                format!(
                    "put: '{remote}' is a directory; name the file to write in it \
                     (put {} {}/NAME)",
                    local.display(),
                    remote.trim_end_matches('/')
                )
            })?;
            let name = name.to_str().ok_or_else(|| {
                format!(
                    "put: the name of '{}' is not UTF-8; name the file to write in '{remote}'",
                    local.display()
                )
            })?;
            Ok(format!("{}/{name}", remote.trim_end_matches('/')))
        }
        _ => Ok(remote.to_string()),
    }
}

async fn put(c: &Client, local: &Path, remote: &str) -> Result<(), String> {
    let target = put_target(c, local, remote).await?;
    let remote = target.as_str();
    let mut input: Box<dyn Read> = if local == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(local)
                .map_err(|e| format!("put: cannot open '{}': {e}", local.display()))?,
        )
    };
    let opts = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .perm(0o644)
        // Read the next block while this one is sent; close reports a
        // failed write.
        .write_behind(true);
    let f = c
        .open(remote, opts)
        .await
        .map_err(|e| fail("put", remote, e))?;
    let mut offset = 0u64;
    loop {
        let mut buf = vec![0u8; COPY_BLOCK_BYTES];
        let mut filled = 0;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("put: reading '{}': {e}", local.display())),
            }
        }
        if filled == 0 {
            break;
        }
        buf.truncate(filled);
        f.write_owned(offset, buf)
            .await
            .map_err(|e| fail("put", remote, e))?;
        offset += filled as u64;
    }
    f.close().await.map_err(|e| fail("put", remote, e))
}

async fn copy_out(c: &Client, remote: &str, out: &mut dyn Write) -> Result<(), String> {
    let f = c
        .open(remote, OpenOptions::new().read(true).read_ahead(true))
        .await
        .map_err(|e| shown(&e))?;
    if f.attr().kind == FileKind::Dir {
        return Err("Is a directory".into());
    }
    let size = f.size();
    let mut offset = 0u64;
    while offset < size {
        let n = ((size - offset) as usize).min(COPY_BLOCK_BYTES);
        let data = f.read_at(offset, n).await.map_err(|e| e.to_string())?;
        if data.is_empty() {
            break;
        }
        out.write_all(&data)
            .map_err(|e| format!("writing output: {e}"))?;
        offset += data.len() as u64;
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    f.close().await.map_err(|e| e.to_string())
}

async fn get(c: &Client, remote: &str, local: &Path) -> Result<(), String> {
    if local == Path::new("-") {
        return copy_out(c, remote, &mut std::io::stdout().lock())
            .await
            .map_err(|e| format!("get: {remote}: {e}"));
    }
    let mut out = std::fs::File::create(local)
        .map_err(|e| format!("get: cannot create '{}': {e}", local.display()))?;
    copy_out(c, remote, &mut out)
        .await
        .map_err(|e| format!("get: {remote}: {e}"))
}

/// mknod(1)'s TYPE [MAJOR MINOR]: the kind and the device number.
fn mknod_args(
    kind: &str,
    major: Option<u32>,
    minor: Option<u32>,
) -> Result<(FileKind, u32), String> {
    let kind = match kind {
        "p" => FileKind::Fifo,
        "s" => FileKind::Socket,
        "c" | "u" => FileKind::CharDev,
        "b" => FileKind::BlockDev,
        _ => return Err(format!("mknod: invalid device type '{kind}'")),
    };
    match (kind.is_device(), major, minor) {
        (true, Some(major), Some(minor)) => Attr::make_rdev(major, minor)
            .map(|rdev| (kind, rdev))
            .ok_or_else(|| format!("mknod: invalid device {major} {minor}")),
        (true, _, _) => Err("mknod: special files require major and minor device numbers".into()),
        (false, None, None) => Ok((kind, 0)),
        (false, _, _) => Err("mknod: FIFOs and sockets take no device numbers".into()),
    }
}

fn mode_string(a: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(match a.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDev => 'c',
        FileKind::BlockDev => 'b',
    });
    let p = a.perm;
    for (shift, special, ch) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (p >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (p & special != 0, x) {
            (true, true) => ch,
            (true, false) => ch.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

async fn print_entry(c: &Client, full: &str, name: &str, a: &Attr, long: bool) {
    if !long {
        println!("{name}");
        return;
    }
    let link = if a.kind == FileKind::Symlink {
        match c.read_link(full).await {
            Ok(t) => format!(" -> {}", String::from_utf8_lossy(&t)),
            Err(_) => String::new(),
        }
    } else {
        String::new()
    };
    // Devices show "major, minor" where the size goes, as ls -l does.
    let size = if a.kind.is_device() {
        let (major, minor) = a.rdev_parts();
        format!("{major}, {minor}")
    } else {
        a.size.to_string()
    };
    println!(
        "{} {:>3} {:>6} {:>6} {:>12} {} {name}{link}",
        mode_string(a),
        a.nlink,
        a.uid,
        a.gid,
        size,
        ls_time(&Local, a.mtime, chrono::Utc::now().timestamp())
    );
}

/// Half of an average Gregorian year, in seconds: what GNU ls calls
/// "recent".
const SIX_MONTHS_S: i64 = 31_556_952 / 2;

/// ls -l's time column in `tz`, as GNU ls prints it in the C locale:
/// `Nov 23 20:50` for the last six months, `Nov 23  2025` for older times
/// and times in the future (`now` in seconds since the epoch).
fn ls_time<Tz: TimeZone>(tz: &Tz, t: Timestamp, now: i64) -> String
where
    Tz::Offset: std::fmt::Display,
{
    let Some(dt) = tz.timestamp_opt(t.secs, t.nanos).single() else {
        return format!("{:>12}", t.secs); // out of chrono's range
    };
    let recent = t.secs > now - SIX_MONTHS_S && t.secs <= now;
    let fmt = if recent { "%b %e %H:%M" } else { "%b %e  %Y" };
    dt.format(fmt).to_string()
}

/// A time as stat(1) prints it: `2026-11-23 20:50:07.123456789 +0000`.
fn stat_time<Tz: TimeZone>(tz: &Tz, t: Timestamp) -> String
where
    Tz::Offset: std::fmt::Display,
{
    match tz.timestamp_opt(t.secs, t.nanos).single() {
        Some(dt) => dt.format("%Y-%m-%d %H:%M:%S.%f %z").to_string(),
        None => format!("{}.{:09}", t.secs, t.nanos),
    }
}

fn print_stat(path: &str, a: &Attr) {
    let kind = match a.kind {
        FileKind::File => "regular file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "character special file",
        FileKind::BlockDev => "block special file",
    };
    println!("  File: {path}");
    println!("  Size: {:<12} Blocks: {:<10} {kind}", a.size, a.blocks());
    if a.kind.is_device() {
        let (major, minor) = a.rdev_parts();
        println!(
            "Inode: {:<13} Links: {:<5} Device type: {major},{minor}",
            a.ino, a.nlink
        );
    } else {
        println!("Inode: {:<13} Links: {}", a.ino, a.nlink);
    }
    println!(
        "Access: ({:04o}/{})  Uid: {}  Gid: {}",
        a.perm,
        mode_string(a),
        a.uid,
        a.gid
    );
    println!("Access: {}", stat_time(&Local, a.atime));
    println!("Modify: {}", stat_time(&Local, a.mtime));
    println!("Change: {}", stat_time(&Local, a.ctime));
    println!(" Birth: {}", stat_time(&Local, a.btime));
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::FixedOffset;

    fn ts(secs: i64, nanos: u32) -> Timestamp {
        Timestamp { secs, nanos }
    }

    #[test]
    fn errors_name_the_cause_only_for_a_server_out_of_reach() {
        let e = |code, m: &str| ClientError::new(code, m);
        assert_eq!(
            shown(&e(ErrorCode::NotFound, "cannot stat '/a'")),
            "no such file or directory"
        );
        assert_eq!(
            shown(&e(
                ErrorCode::Unavailable,
                "cannot stat '/f7': connection failed: server 2 at 127.0.0.1:9: refused \
                 (no copy of set 2 has answered the membership group for 38 s)"
            )),
            "server unavailable (connection failed: server 2 at 127.0.0.1:9: refused \
             (no copy of set 2 has answered the membership group for 38 s))"
        );
        assert_eq!(
            shown(&e(ErrorCode::TimedOut, "server 1 did not answer")),
            "timed out (server 1 did not answer)"
        );
        assert_eq!(shown(&e(ErrorCode::Unavailable, "")), "server unavailable");
    }

    #[test]
    fn times_print_as_ls_and_stat_print_them() {
        let utc = chrono::Utc;
        // 2026-11-23 20:50:07.123456789 UTC
        let t = ts(1_795_467_007, 123_456_789);
        let now = t.secs + 3600;
        assert_eq!(ls_time(&utc, t, now), "Nov 23 20:50");
        // Single-digit days are padded with a space, as ls does.
        assert_eq!(ls_time(&utc, ts(1_794_000_000, 0), now), "Nov  6 21:20");
        // Older than six months, or in the future: the year instead.
        let old = ts(t.secs - SIX_MONTHS_S - 1, 0);
        assert_eq!(ls_time(&utc, old, now), "May 25  2026");
        assert_eq!(ls_time(&utc, t, t.secs - 60), "Nov 23  2026");
        assert_eq!(stat_time(&utc, t), "2026-11-23 20:50:07.123456789 +0000");
        assert_eq!(
            stat_time(&utc, ts(0, 5)),
            "1970-01-01 00:00:00.000000005 +0000"
        );
        // Another zone: the local time and its offset.
        let cet = FixedOffset::east_opt(3600).unwrap();
        assert_eq!(stat_time(&cet, t), "2026-11-23 21:50:07.123456789 +0100");
        assert_eq!(ls_time(&cet, t, now), "Nov 23 21:50");
        // Out of range: the raw seconds rather than a panic.
        assert_eq!(
            stat_time(&utc, ts(i64::MAX, 0)),
            format!("{}.000000000", i64::MAX)
        );
    }
}
