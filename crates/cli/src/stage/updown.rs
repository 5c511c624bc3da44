//! The stage-in of `madfs up --stage-in LOCAL:/PATH` and the stage-out of
//! `madfs down --stage-out /PATH:LOCAL`: each a `madfs sync` run before the
//! cluster is handed over or torn down, spread over the cluster's hosts
//! (servers' and clients') when `madfs up --hosts` started it.

use super::fs::Preserve;
use super::plan::SyncRules;
use super::worker::Spread;
use super::{endpoint, run_job, Job, JOBS_DEFAULT, MADFS_PREFIX};
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// A `--stage-in` or `--stage-out` argument: `LOCAL:MADFS` for stage-in,
/// `MADFS:LOCAL` for stage-out (the MadFS path is absolute; the split is
/// at the colon before it, or after it).
fn stage_pair(spec: &str, into_madfs: bool) -> Result<(String, String), String> {
    let split = if into_madfs {
        spec.rfind(":/").map(|i| (i, i + 1))
    } else {
        spec.find(':')
            .filter(|_| spec.starts_with('/'))
            .map(|i| (i, i + 1))
    };
    let (a, b) = match split {
        Some((end, start)) if end > 0 && start < spec.len() => (&spec[..end], &spec[start..]),
        _ => {
            return Err(if into_madfs {
                format!("--stage-in '{spec}': give LOCAL:/MADFS_PATH")
            } else {
                format!("--stage-out '{spec}': give /MADFS_PATH:LOCAL")
            })
        }
    };
    Ok((a.to_string(), b.to_string()))
}

/// Run the stage-in (`into_madfs`) or stage-out copies of `madfs up` or
/// `madfs down`: each a `madfs sync`, spread over the cluster's hosts when
/// it has several.
pub fn stage(data: &Path, specs: &[String], into_madfs: bool) -> Result<(), String> {
    let cluster = data.join("cluster.toml");
    let spread = if crate::hosts::is_multihost(data) {
        let text = std::fs::read_to_string(data.join(crate::hosts::HOSTS_FILE))
            .map_err(|e| format!("{}: {e}", data.display()))?;
        let l: crate::hosts::Launcher =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", data.display()))?;
        let cfg = madfs_client::ClusterConfig::load(&cluster).map_err(|e| e.to_string())?;
        let mut hosts: Vec<String> = crate::hosts::hosts_of(&cfg)
            .into_iter()
            .map(|h| h.0)
            .collect();
        hosts.extend(l.clients.iter().cloned());
        Some(Spread {
            hosts,
            exec: l.exec,
            madfs: l.madfs,
        })
    } else {
        None
    };
    for spec in specs {
        let (a, b) = stage_pair(spec, into_madfs)?;
        let (src, dst) = if into_madfs {
            (
                OsString::from(a),
                OsString::from(format!("{MADFS_PREFIX}{b}")),
            )
        } else {
            (
                OsString::from(format!("{MADFS_PREFIX}{a}")),
                OsString::from(b),
            )
        };
        let job = Job {
            command: if into_madfs { "stage-in" } else { "stage-out" },
            pairs: vec![(endpoint(&src)?, endpoint(&dst)?)],
            sync: Some(SyncRules::default()),
            recursive: true,
            keep: Preserve {
                mode: true,
                owner: true,
                times: true,
            },
            links: true,
            verify: false,
            dry_run: false,
            jobs: JOBS_DEFAULT,
            spread: spread.as_ref().map(|s| Spread {
                hosts: s.hosts.clone(),
                exec: s.exec.clone(),
                madfs: s.madfs.clone(),
            }),
        };
        if run_job(Some(&cluster), job)? != ExitCode::SUCCESS {
            return Err(format!("copying {spec} failed (see above)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_pairs_split_at_the_madfs_path() {
        assert_eq!(
            stage_pair("/scratch/a:b:/run1/in", true).unwrap(),
            ("/scratch/a:b".into(), "/run1/in".into())
        );
        assert_eq!(
            stage_pair("/run1/out:/scratch/res", false).unwrap(),
            ("/run1/out".into(), "/scratch/res".into())
        );
        assert!(stage_pair("/scratch/a", true).is_err());
        assert!(stage_pair("relative:/x", false).is_err());
    }
}
