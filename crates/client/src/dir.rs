//! Directory listing state. A directory's entries are spread over every
//! server (by name hash), each server lists its share in name order, so a
//! listing is a per-server cursor ("last name seen", "finished") and a page is
//! the union of one page from each unfinished server. The merge is a pure
//! function so ordering and resumption are tested without servers.

use crate::error::{ClientError, Result};
use madfs_proto::message::DirEntry;
use madfs_proto::ErrorCode;
use madfs_types::{FileName, ServerId};

/// Where a directory listing stands on each server. `DirCursor::default()`
/// is the start of a listing; clone it to resume from the same point later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirCursor {
    /// Empty until the first page; then one state per server.
    servers: Vec<ServerState>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ServerState {
    after: Option<FileName>,
    done: bool,
}

/// One server's answer to a ReadDir request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Page {
    pub server: ServerId,
    pub entries: Vec<DirEntry>,
    pub more: bool,
}

impl DirCursor {
    /// The start of a listing.
    pub fn new() -> DirCursor {
        DirCursor::default()
    }

    /// True once every server has returned its last page.
    pub fn is_done(&self) -> bool {
        !self.servers.is_empty() && self.servers.iter().all(|s| s.done)
    }

    /// The per-server states, created on first use for `servers` servers.
    fn states(&self, servers: usize) -> Result<Vec<ServerState>> {
        if self.servers.is_empty() {
            return Ok(vec![ServerState::default(); servers]);
        }
        if self.servers.len() != servers {
            return Err(ClientError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "directory cursor is for {} servers, the cluster has {servers}",
                    self.servers.len()
                ),
            ));
        }
        Ok(self.servers.clone())
    }

    /// The servers to ask for the next page, with the name to list after.
    pub(crate) fn requests(&self, servers: usize) -> Result<Vec<(ServerId, Option<FileName>)>> {
        Ok(self
            .states(servers)?
            .into_iter()
            .enumerate()
            .filter(|(_, s)| !s.done)
            .map(|(i, s)| (ServerId(i as u16), s.after))
            .collect())
    }
}

/// Fold one round of pages into the cursor: the entries of all pages sorted
/// by name, and the cursor to continue from. Refuses pages that would stall
/// the listing (a server saying "more" without moving forward), so a buggy
/// server gives an error rather than an endless loop.
pub(crate) fn merge_pages(
    cursor: &DirCursor,
    servers: usize,
    pages: Vec<Page>,
) -> Result<(Vec<DirEntry>, DirCursor)> {
    let mut states = cursor.states(servers)?;
    let mut entries = Vec::new();
    for page in pages {
        let state = states.get_mut(page.server.0 as usize).ok_or_else(|| {
            ClientError::protocol(format!("page from unknown server {}", page.server))
        })?;
        if let Some(last) = page.entries.last() {
            // (A `match`, not `is_none_or`: that needs Rust 1.82, the workspace says 1.80.)
            let forward = match &state.after {
                None => true,
                Some(a) => last.name > *a,
            };
            if !forward {
                return Err(ClientError::protocol(format!(
                    "server {} listed '{}' again",
                    page.server, last.name
                )));
            }
            state.after = Some(last.name.clone());
        } else if page.more {
            return Err(ClientError::protocol(format!(
                "server {} sent an empty directory page with more to come",
                page.server
            )));
        }
        state.done = !page.more;
        entries.extend(page.entries);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((entries, DirCursor { servers: states }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_types::{FileKind, InodeId};

    fn entry(name: &str) -> DirEntry {
        DirEntry {
            name: FileName::new(name.as_bytes()).unwrap(),
            ino: InodeId(name.len() as u64),
            kind: FileKind::File,
        }
    }

    /// A fake cluster: server i holds `dirs[i]`, sorted, and answers pages of
    /// at most `max` names after a given name, as a real server does.
    fn serve(dirs: &[Vec<&str>], req: &[(ServerId, Option<FileName>)], max: usize) -> Vec<Page> {
        req.iter()
            .map(|(server, after)| {
                let names = &dirs[server.0 as usize];
                let rest: Vec<&&str> = names
                    .iter()
                    .filter(|n| !matches!(after, Some(a) if n.as_bytes() <= a.as_bytes()))
                    .collect();
                Page {
                    server: *server,
                    entries: rest.iter().take(max).map(|n| entry(n)).collect(),
                    more: rest.len() > max,
                }
            })
            .collect()
    }

    fn names(entries: &[DirEntry]) -> Vec<String> {
        entries.iter().map(|e| e.name.to_string()).collect()
    }

    #[test]
    fn pages_are_sorted_unions_and_listing_is_complete() {
        let dirs = vec![
            vec!["a", "d", "g", "j"],
            vec![],
            vec!["b", "c", "e", "f", "h"],
        ];
        let mut cursor = DirCursor::new();
        assert!(!cursor.is_done());
        let mut all = Vec::new();
        let mut rounds = 0;
        while !cursor.is_done() {
            let req = cursor.requests(3).unwrap();
            let (page, next) = merge_pages(&cursor, 3, serve(&dirs, &req, 2)).unwrap();
            let got = names(&page);
            let mut sorted = got.clone();
            sorted.sort();
            assert_eq!(got, sorted);
            all.extend(got);
            cursor = next;
            rounds += 1;
        }
        assert_eq!(rounds, 3);
        all.sort();
        assert_eq!(all, vec!["a", "b", "c", "d", "e", "f", "g", "h", "j"]);
        // First round: two names from each non-empty server.
        let req = DirCursor::new().requests(3).unwrap();
        let (first, _) = merge_pages(&DirCursor::new(), 3, serve(&dirs, &req, 2)).unwrap();
        assert_eq!(names(&first), vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn cursor_resumes_and_skips_finished_servers() {
        let dirs = vec![vec!["a", "b", "c"], vec!["x"]];
        let start = DirCursor::new();
        let req = start.requests(2).unwrap();
        let (_, after_one) = merge_pages(&start, 2, serve(&dirs, &req, 1)).unwrap();
        // Server 1 is finished: only server 0 is asked again, after "a".
        let req = after_one.requests(2).unwrap();
        assert_eq!(req.len(), 1);
        assert_eq!(req[0].0, ServerId(0));
        assert_eq!(req[0].1.as_ref().unwrap().as_bytes(), b"a");
        // Resuming the same cursor twice yields the same page.
        let (p1, c1) = merge_pages(&after_one, 2, serve(&dirs, &req, 1)).unwrap();
        let (p2, c2) = merge_pages(&after_one, 2, serve(&dirs, &req, 1)).unwrap();
        assert_eq!((names(&p1), &c1), (names(&p2), &c2));
        assert_eq!(names(&p1), vec!["b"]);
    }

    #[test]
    fn stalling_or_mismatched_pages_are_refused() {
        let c = DirCursor::new();
        let stall = vec![Page {
            server: ServerId(0),
            entries: vec![],
            more: true,
        }];
        assert_eq!(
            merge_pages(&c, 1, stall).unwrap_err().code,
            ErrorCode::Protocol
        );
        let (_, c) = merge_pages(
            &c,
            1,
            vec![Page {
                server: ServerId(0),
                entries: vec![entry("m")],
                more: true,
            }],
        )
        .unwrap();
        let repeat = vec![Page {
            server: ServerId(0),
            entries: vec![entry("m")],
            more: true,
        }];
        assert_eq!(
            merge_pages(&c, 1, repeat).unwrap_err().code,
            ErrorCode::Protocol
        );
        assert_eq!(c.requests(2).unwrap_err().code, ErrorCode::InvalidArgument);
        // An empty directory: one round, done.
        let (e, c) = merge_pages(
            &DirCursor::new(),
            1,
            vec![Page {
                server: ServerId(0),
                entries: vec![],
                more: false,
            }],
        )
        .unwrap();
        assert!(e.is_empty() && c.is_done());
    }
}
