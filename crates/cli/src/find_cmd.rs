//! `madfs find`, `madfs du` and `madfs fsck`: the servers scan their own shards in
//! parallel (Op::Find); no per-entry round trips. Options follow GNU find's
//! single-dash syntax for the supported subset. `madfs find --io500` is
//! IO500's external find: paths as programs see them (locate.rs) and a last
//! line `MATCHED <matches>/<entries scanned>`.

use crate::locate::{self, Located, Via};
use madfs_client::{parse_size, parse_type, Client, FindQuery, Repair, Timestamp};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A parsed `find` command line: starting points and the query.
#[derive(Debug, PartialEq, Eq)]
pub struct FindArgs {
    pub roots: Vec<String>,
    pub query: FindQuery,
    /// `-newer FILE`: the MadFS path whose mtime is the reference.
    pub newer: Option<String>,
    /// `-print` was given (`--io500` prints paths only then).
    pub print: bool,
}

/// Parse `PATH... [-name GLOB] [-newer FILE] [-size N[c|w|b|k|M|G]]
/// [-type f|d|l|p|s|c|b] [-uid N] [-print]` (all tests ANDed, as GNU find does
/// without operators). Starting points default to "/".
pub fn parse_find_args(args: &[String]) -> Result<FindArgs, String> {
    let mut roots = Vec::new();
    let mut i = 0;
    while i < args.len() && !(args[i].starts_with('-') && args[i].len() > 1) {
        roots.push(args[i].clone());
        i += 1;
    }
    if roots.is_empty() {
        roots.push("/".to_string());
    }
    let mut query = FindQuery::default();
    let mut newer = None;
    let mut print = false;
    while i < args.len() {
        let opt = args[i].as_str();
        let mut value = || -> Result<&str, String> {
            i += 1;
            args.get(i)
                .map(|s| s.as_str())
                .ok_or_else(|| format!("missing argument to `{opt}'"))
        };
        match opt {
            "-print" => print = true,
            "-name" => query.name = Some(value()?.as_bytes().to_vec()),
            "-newer" => newer = Some(value()?.to_string()),
            "-size" => query.size = Some(parse_size(value()?)?),
            "-type" => query.kind = Some(parse_type(value()?)?),
            "-uid" => {
                let v = value()?;
                query.uid = Some(
                    v.parse::<u32>()
                        .map_err(|_| format!("invalid argument '{v}' to -uid"))?,
                );
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown predicate `{other}'"));
            }
            other => {
                return Err(format!("paths must precede expression: `{other}'"));
            }
        }
        i += 1;
    }
    Ok(FindArgs {
        roots,
        query,
        newer,
        print,
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

const FIND_USAGE: &str = "Usage: madfs find [--io500] [PATH...] [-name GLOB] [-newer FILE] \
[-size [+-]N[c|w|b|k|M|G]] [-type f|d|l|p|s|c|b] [-uid N] [-print]
Tests are ANDed and follow GNU find's rules; FILE is a MadFS path; symlinks
are not followed. Every server scans its own shard in parallel.

--io500: IO500's external find (in io500's ini: `[find]` `external-script =
/path/to/madfs`, `external-extra-args = find --io500`). A PATH may be under
the `madfs run` prefix ($MADFS_PREFIX, default /madfs), inside a MadFS FUSE
mount (its cluster is the mount daemon's), or a MadFS path; -newer FILE may
also be a local file. Prints only `MATCHED <matches>/<entries scanned>` (the
paths first, as given, with -print); entries scanned counts every entry of
the cluster.";

pub fn find(cluster: Option<&Path>, args: &[String]) -> Result<ExitCode, String> {
    if args
        .iter()
        .any(|a| a == "--help" || a == "-help" || a == "-h")
    {
        println!("{FIND_USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(rest) = args.strip_prefix(&["--io500".to_string()]) {
        return io500_find(cluster, rest);
    }
    let mut parsed = parse_find_args(args).map_err(|e| format!("find: {e}"))?;
    let client = Client::connect(cluster).map_err(|e| e.to_string())?;
    runtime()?.block_on(async {
        if let Some(reference) = &parsed.newer {
            let a = client
                .lstat(reference.as_str())
                .await
                .map_err(|e| format!("find: '{reference}': {}", crate::files::shown(&e)))?;
            parsed.query.newer = Some(a.mtime);
        }
        let mut failed = false;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
        for root in &parsed.roots {
            match client.find_detailed(root.as_str(), &parsed.query).await {
                Ok(res) => {
                    for f in &res.found {
                        out.write_all(&f.path)
                            .and_then(|_| out.write_all(b"\n"))
                            .map_err(|e| format!("find: write error: {e}"))?;
                    }
                    for d in &res.denied {
                        failed = true;
                        eprintln!(
                            "madfs find: '{}': Permission denied",
                            String::from_utf8_lossy(d)
                        );
                    }
                }
                Err(e) => {
                    failed = true;
                    eprintln!("madfs find: '{root}': {}", crate::files::shown(&e));
                }
            }
        }
        out.flush().map_err(|e| format!("find: write error: {e}"))?;
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// `madfs find --io500`: see FIND_USAGE.
fn io500_find(cluster: Option<&Path>, args: &[String]) -> Result<ExitCode, String> {
    let mut parsed = parse_find_args(args).map_err(|e| format!("find: {e}"))?;
    let prefix = locate::prefix();
    let roots = parsed
        .roots
        .iter()
        .map(|r| locate::locate(r, &prefix))
        .collect::<Result<Vec<Located>, String>>()
        .map_err(|e| format!("find: {e}"))?;
    runtime()?.block_on(async {
        // Paths in a mount use the mount's cluster; the others (and all of
        // them, when none is in a mount) --cluster / $MADFS_CLUSTER, which
        // `madfs run` sets.
        let mut chosen: Option<(PathBuf, Client)> = None;
        for r in &roots {
            if let Via::Mount(mnt) = &r.via {
                let (file, c) = locate::mount_client(mnt, Path::new(&r.given), &r.fs_path, cluster)
                    .await
                    .map_err(|e| format!("find: {e}"))?;
                match &chosen {
                    Some((f, _)) if *f != file => {
                        return Err(format!(
                            "find: '{}' is in the cluster of {}, an earlier path in that of {}",
                            r.given,
                            file.display(),
                            f.display()
                        ))
                    }
                    Some(_) => {}
                    None => chosen = Some((file, c)),
                }
            }
        }
        let client = match chosen {
            Some((_, c)) => c,
            None => Client::connect(cluster).map_err(|e| e.to_string())?,
        };
        if let Some(reference) = &parsed.newer {
            parsed.query.newer = Some(newer_reference(&client, reference, &prefix).await?);
        }
        let (mut matched, mut scanned, mut failed) = (0u64, 0u64, false);
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
        let werr = |e: std::io::Error| format!("find: write error: {e}");
        for r in &roots {
            let res = if parsed.print {
                client
                    .find_detailed(r.fs_path.as_str(), &parsed.query)
                    .await
            } else {
                client.find_count(r.fs_path.as_str(), &parsed.query).await
            };
            match res {
                Ok(res) => {
                    matched += res.found.len() as u64;
                    scanned += res.scanned;
                    if parsed.print {
                        for f in &res.found {
                            out.write_all(&as_given(r, &f.path))
                                .and_then(|_| out.write_all(b"\n"))
                                .map_err(werr)?;
                        }
                    }
                    for d in &res.denied {
                        failed = true;
                        eprintln!(
                            "madfs find: '{}': Permission denied",
                            String::from_utf8_lossy(&as_given(r, d))
                        );
                    }
                }
                Err(e) => {
                    failed = true;
                    eprintln!("madfs find: '{}': {}", r.given, crate::files::shown(&e));
                }
            }
        }
        writeln!(out, "MATCHED {matched}/{scanned}").map_err(werr)?;
        out.flush().map_err(werr)?;
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// A path the find reported (starting with the root's MadFS path) with the
/// root as the user gave it.
fn as_given(root: &Located, path: &[u8]) -> Vec<u8> {
    let trim = |s: &str| s.trim_end_matches('/').as_bytes().to_vec();
    let fs = trim(&root.fs_path);
    match path.strip_prefix(&fs[..]) {
        Some(rest) if rest.is_empty() || rest.starts_with(b"/") => {
            let mut p = trim(&root.given);
            p.extend_from_slice(rest);
            p
        }
        _ => path.to_vec(),
    }
}

/// The mtime of -newer's FILE: through MadFS when it is under the prefix,
/// through the kernel when the kernel has it (a local file, IO500's
/// timestamp file, or one in a mount), else as a MadFS path. Like GNU find
/// without -H/-L, a symlink's own time.
async fn newer_reference(client: &Client, file: &str, prefix: &str) -> Result<Timestamp, String> {
    let from_madfs = |path: String| async move {
        client
            .lstat(path.as_str())
            .await
            .map(|a| a.mtime)
            .map_err(|e| format!("find: '{file}': {}", crate::files::shown(&e)))
    };
    if let Some(fs_path) = locate::under_prefix(file, prefix) {
        return from_madfs(fs_path).await;
    }
    match std::fs::symlink_metadata(file) {
        Ok(m) => Ok(Timestamp {
            secs: m.mtime(),
            nanos: m.mtime_nsec() as u32,
        }),
        Err(_) if file.starts_with('/') => from_madfs(file.to_string()).await,
        Err(e) => Err(format!("find: '{file}': {e}")),
    }
}

pub fn du(cluster: Option<&Path>, paths: &[String], inodes: bool) -> Result<ExitCode, String> {
    let client = Client::connect(cluster).map_err(|e| e.to_string())?;
    runtime()?.block_on(async {
        let mut failed = false;
        let roots = if paths.is_empty() {
            vec!["/".to_string()]
        } else {
            paths.to_vec()
        };
        for root in &roots {
            match client.du(root.as_str()).await {
                Ok((totals, denied)) => {
                    for d in &denied {
                        failed = true;
                        eprintln!(
                            "madfs du: cannot read directory '{}': Permission denied",
                            String::from_utf8_lossy(d)
                        );
                    }
                    let n = if inodes { totals.inodes } else { totals.bytes };
                    println!("{n}\t{root}");
                }
                Err(e) => {
                    failed = true;
                    eprintln!(
                        "madfs du: cannot access '{root}': {}",
                        crate::files::shown(&e)
                    );
                }
            }
        }
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// `madfs fsck [--repair] PATH`: one line per directory whose link count
/// is wrong (and with `--repair`, what became of it), then a summary.
pub fn fsck(cluster: Option<&Path>, root: &str, repair: bool) -> Result<ExitCode, String> {
    let client = Client::connect(cluster).map_err(|e| e.to_string())?;
    runtime()?.block_on(async {
        let check = client
            .check_dir_links(root, repair)
            .await
            .map_err(|e| format!("checking '{root}': {e}"))?;
        for w in &check.wrong {
            let what = match &w.repair {
                None => String::new(),
                Some(Repair::Done) => format!(": set to {}", w.want()),
                Some(Repair::Skipped(why)) => format!(": left alone, {why}"),
            };
            println!(
                "{}: link count {}, {} subdirectories (want {}){what}",
                String::from_utf8_lossy(&w.path),
                w.nlink,
                w.subdirs,
                w.want()
            );
        }
        let mut left = check.left_wrong();
        let repaired = check.wrong.len() - left;
        println!(
            "{} directories checked, {} with a wrong link count, {repaired} repaired",
            check.dirs,
            check.wrong.len()
        );
        // Names anywhere may reach any inode: only a check of the whole
        // file system can count them.
        if root.trim_end_matches('/').is_empty() {
            let inodes = client
                .check_inode_links(repair)
                .await
                .map_err(|e| format!("checking the inodes: {e}"))?;
            print_inode_check(&inodes);
            left += inodes.left_wrong();
        }
        Ok(if left > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}

fn print_inode_check(check: &madfs_client::InodeCheck) {
    for w in &check.wrong {
        let what = match (&w.repair, &w.adopted_as) {
            (None, _) => String::new(),
            (Some(Repair::Done), Some(p)) => format!(": moved to {}", String::from_utf8_lossy(p)),
            (Some(Repair::Done), None) if w.names == 0 => ": freed".to_string(),
            (Some(Repair::Done), None) => format!(": set to {}", w.names),
            (Some(Repair::Skipped(why)), _) => format!(": left alone, {why}"),
        };
        let paths: Vec<_> = w
            .paths
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let reached = if w.names == 0 {
            match w.size {
                Some(n) if w.adopts() => format!("no name reaches it (leaked, {n} bytes)"),
                _ => "no name reaches it (leaked)".to_string(),
            }
        } else {
            let noun = if w.names == 1 { "name" } else { "names" };
            format!("{} {noun} ({})", w.names, paths.join(", "))
        };
        println!(
            "inode {} ({:?}): link count {}, {reached}{what}",
            w.ino, w.kind, w.nlink
        );
    }
    for d in &check.unreached_dirs {
        let what = match (&d.repair, &d.adopted_as) {
            (Some(Repair::Done), Some(p)) => format!("moved to {}", String::from_utf8_lossy(p)),
            (Some(Repair::Done), None) => "freed".to_string(),
            (Some(Repair::Skipped(why)), _) => format!("left alone, {why}"),
            (None, _) => "left alone".to_string(),
        };
        let empty = if d.empty { ", empty" } else { "" };
        println!(
            "inode {} (directory): no name reaches it{empty}: {what}",
            d.ino
        );
    }
    for d in &check.dangling {
        let what = match &d.repair {
            Some(Repair::Done) => "removed".to_string(),
            Some(Repair::Skipped(why)) => format!("left alone, {why}"),
            None => "left alone".to_string(),
        };
        println!(
            "{}: names inode {}, which does not exist: {what}",
            String::from_utf8_lossy(&d.path),
            d.ino
        );
    }
    for d in &check.missing_dirs {
        let what = match (&d.repair, &d.path) {
            (Some(Repair::Done), Some(p)) => {
                format!("made again as {}", String::from_utf8_lossy(p))
            }
            (Some(Repair::Skipped(why)), _) => format!("left alone, {why}"),
            _ => "left alone".to_string(),
        };
        let named = match &d.named {
            Some((path, _, _)) => format!("named {}", String::from_utf8_lossy(path)),
            None => "no name left".to_string(),
        };
        println!(
            "inode {} (directory): does not exist, {} names are in it ({} directories), {named}: \
             {what}",
            d.ino, d.names, d.subdirs
        );
    }
    if check.pending > 0 {
        println!(
            "{} link drops, renames, or directory removals or moves are still being finished on \
             the servers: what is wrong is reported, not repaired",
            check.pending
        );
    }
    println!(
        "{} inodes and {} names checked: {} with a wrong link count, {} directories no name \
         reaches, {} names without their inode, {} directories gone with names in them; {} \
         repaired",
        check.inodes,
        check.names,
        check.wrong.len(),
        check.unreached_dirs.len(),
        check.dangling.len(),
        check.missing_dirs.len(),
        check.repaired()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_client::{FileKind, SizeCmp, SizeTest};

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_lines_parse_like_gnu_find() {
        let a = parse_find_args(&args(
            "/d -name *01* -size -4k -type f -uid 1000 -newer /ref",
        ))
        .unwrap();
        assert_eq!(a.roots, vec!["/d"]);
        assert_eq!(a.query.name.as_deref(), Some(&b"*01*"[..]));
        assert_eq!(
            a.query.size,
            Some(SizeTest {
                cmp: SizeCmp::Less,
                n: 4,
                unit: 1024
            })
        );
        assert_eq!(a.query.kind, Some(FileKind::File));
        assert_eq!(a.query.uid, Some(1000));
        assert_eq!(a.newer.as_deref(), Some("/ref"));
        let a = parse_find_args(&args("/a /b -print")).unwrap();
        assert_eq!(a.roots, vec!["/a", "/b"]);
        assert_eq!(a.query, FindQuery::default());
        assert_eq!(parse_find_args(&[]).unwrap().roots, vec!["/"]);
        assert!(parse_find_args(&args("/d -name")).is_err());
        assert!(parse_find_args(&args("/d -bogus 1")).is_err());
        assert!(parse_find_args(&args("/d -type x")).is_err());
        assert!(parse_find_args(&args("/d -uid x")).is_err());
        assert!(parse_find_args(&args("/d -name a /e")).is_err());
        assert!(parse_find_args(&args("/d -size 4q")).is_err());
    }
}
