//! The credentials a FUSE request runs with: the caller's uid and gid from
//! the request header, and its supplementary groups, which FUSE does not
//! carry, read from /proc/<pid>/status. A process issues many requests in a
//! row (a `cp -r`, an `ls -l`), so the groups are cached per pid for a
//! short while rather than read for every request.

use madfs_client::{limits, Credentials};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a pid's groups are trusted: long enough to serve a burst of
/// requests from one process, short enough that a newgrp or a recycled pid
/// is noticed quickly.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Entries kept before the cache is swept (bounds memory under pid churn).
const CACHE_MAX: usize = 4096;

/// When the groups were read, for which uid, and the groups.
type Cached = (Instant, u32, Vec<u32>);

#[derive(Default)]
pub struct GroupCache {
    by_pid: Mutex<HashMap<u32, Cached>>,
}

impl GroupCache {
    /// Credentials for a request from `pid` running as `uid`/`gid`. Pid 0
    /// (requests the kernel issues on its own, such as a release after the
    /// process exited) gets no supplementary groups; so does a process that
    /// is already gone.
    pub fn credentials(&self, uid: u32, gid: u32, pid: u32) -> Credentials {
        let groups = if pid == 0 {
            Vec::new()
        } else {
            self.groups(uid, pid)
        };
        Credentials { uid, gid, groups }
    }

    fn groups(&self, uid: u32, pid: u32) -> Vec<u32> {
        let now = Instant::now();
        {
            let map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, cached_uid, g)) = map.get(&pid) {
                if *cached_uid == uid && now.duration_since(*at) < GROUPS_TTL {
                    return g.clone();
                }
            }
        }
        // Read outside the lock: procfs is fast, but not worth serialising.
        let groups = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| parse_groups(&s))
            .unwrap_or_default();
        let mut map = self.by_pid.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CACHE_MAX {
            map.retain(|_, (at, _, _)| now.duration_since(*at) < GROUPS_TTL);
            if map.len() >= CACHE_MAX {
                map.clear();
            }
        }
        map.insert(pid, (now, uid, groups.clone()));
        groups
    }
}

/// The "Groups:" line of /proc/<pid>/status. Requests carry at most
/// `limits::GROUPS_MAX` groups (as NFS AUTH_SYS does); beyond that the
/// first ones are kept, so a member of very many groups may be refused
/// access that the kernel would grant.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .take(limits::GROUPS_MAX)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line_is_parsed_and_bounded() {
        let s =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nVmPeak:\t1 kB\n";
        assert_eq!(parse_groups(s), vec![4, 24, 27, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name: x\n"), Vec::<u32>::new());
        let many: String = (0..100).map(|g| format!(" {g}")).collect();
        assert_eq!(
            parse_groups(&format!("Groups:{many}\n")).len(),
            limits::GROUPS_MAX
        );
    }

    #[test]
    fn own_process_groups_are_found() {
        let c = GroupCache::default();
        let me = std::process::id();
        let expected = parse_groups(&std::fs::read_to_string("/proc/self/status").unwrap());
        assert_eq!(c.credentials(5, 6, me).groups, expected);
        assert!(c.credentials(5, 6, 0).groups.is_empty());
    }
}
