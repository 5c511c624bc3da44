//! `madfs find` and `madfs du`: the servers scan their own shards in
//! parallel (Op::Find); no per-entry round trips. Options follow GNU find's
//! single-dash syntax for the supported subset.

use madfs_client::{parse_size, parse_type, Client, FindQuery};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// A parsed `find` command line: starting points and the query.
#[derive(Debug, PartialEq, Eq)]
pub struct FindArgs {
    pub roots: Vec<String>,
    pub query: FindQuery,
    /// `-newer FILE`: the MadFS path whose mtime is the reference.
    pub newer: Option<String>,
}

/// Parse `PATH... [-name GLOB] [-newer FILE] [-size N[c|w|b|k|M|G]]
/// [-type f|d|l] [-uid N] [-print]` (all tests ANDed, as GNU find does
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
    while i < args.len() {
        let opt = args[i].as_str();
        let mut value = || -> Result<&str, String> {
            i += 1;
            args.get(i)
                .map(|s| s.as_str())
                .ok_or_else(|| format!("missing argument to `{opt}'"))
        };
        match opt {
            "-print" => {}
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
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

const FIND_USAGE: &str = "Usage: madfs find [PATH...] [-name GLOB] [-newer FILE] \
[-size [+-]N[c|w|b|k|M|G]] [-type f|d|l] [-uid N] [-print]
Tests are ANDed and follow GNU find's rules; FILE is a MadFS path; symlinks
are not followed. Every server scans its own shard in parallel.";

pub fn find(cluster: Option<&Path>, args: &[String]) -> Result<ExitCode, String> {
    if args
        .iter()
        .any(|a| a == "--help" || a == "-help" || a == "-h")
    {
        println!("{FIND_USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut parsed = parse_find_args(args).map_err(|e| format!("find: {e}"))?;
    let client = Client::connect(cluster).map_err(|e| e.to_string())?;
    runtime()?.block_on(async {
        if let Some(reference) = &parsed.newer {
            let a = client
                .lstat(reference.as_str())
                .await
                .map_err(|e| format!("find: '{reference}': {}", e.code.describe()))?;
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
                    eprintln!("madfs find: '{root}': {}", e.code.describe());
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
                    eprintln!("madfs du: cannot access '{root}': {}", e.code.describe());
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
