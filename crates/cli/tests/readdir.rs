//! Guards directory listing at scale: 100,000 entries in one directory
//! (spread over every server by name hash) are listed exactly once each, in
//! byte order, by the full `read_dir` and by resumable small pages.

mod common;

use common::TestCluster;
use futures_free::for_each_bounded;
use madfs_client::{DirCursor, FileKind, FileName};
use std::collections::BTreeSet;
use std::time::Instant;

const SERVERS: usize = 4;
const ENTRIES: usize = 100_000;
const IN_FLIGHT: usize = 64;

/// Bounded concurrency without an extra dependency: `IN_FLIGHT` worker
/// tasks pulling indexes from a shared counter.
mod futures_free {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    pub async fn for_each_bounded<F, Fut>(n: usize, workers: usize, f: F)
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let next = Arc::new(AtomicUsize::new(0));
        let f = Arc::new(f);
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (next, f) = (next.clone(), f.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        f(i).await;
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("worker panicked");
        }
    }
}

/// Names of varying length, so byte order differs from creation order.
fn name(i: usize) -> String {
    format!("e{}-{}", i % 7, i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_entries_list_exactly_once_in_order() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let dir = c.mkdir("/big", 0o755).await.unwrap().ino;

    let t = Instant::now();
    let creator = c.clone();
    for_each_bounded(ENTRIES, IN_FLIGHT, move |i| {
        let c = creator.clone();
        async move {
            let n = FileName::new(name(i).as_bytes()).unwrap();
            let (_, created) = c.create(dir, &n, 0o644, true).await.unwrap();
            assert!(created);
        }
    })
    .await;
    let create_time = t.elapsed();

    let want: BTreeSet<String> = (0..ENTRIES).map(name).collect();
    let t = Instant::now();
    let listing = c.read_dir("/big").await.unwrap();
    let list_time = t.elapsed();
    assert_eq!(listing.len(), ENTRIES);
    let got: Vec<String> = listing.iter().map(|e| e.name.to_string()).collect();
    assert!(
        got.windows(2).all(|w| w[0].as_bytes() < w[1].as_bytes()),
        "names must be sorted and unique"
    );
    assert!(
        got.iter().cloned().eq(want.iter().cloned()),
        "listing differs from the names created"
    );
    assert!(listing.iter().all(|e| e.kind == FileKind::File));
    let inos: BTreeSet<u64> = listing.iter().map(|e| e.ino.0).collect();
    assert_eq!(inos.len(), ENTRIES, "every entry has its own inode");

    // Resumable paging with a small page: the same set, no repeats, and
    // every page sorted.
    let t = Instant::now();
    let mut cursor = DirCursor::new();
    let mut paged = Vec::with_capacity(ENTRIES);
    let mut pages = 0;
    while !cursor.is_done() {
        let (page, next) = c.readdir_page(dir, &cursor, 97).await.unwrap();
        assert!(page.len() <= 97 * SERVERS, "page of {}", page.len());
        assert!(page.windows(2).all(|w| w[0].name < w[1].name));
        paged.extend(page.into_iter().map(|e| e.name.to_string()));
        cursor = next;
        pages += 1;
    }
    let page_time = t.elapsed();
    assert!(pages > ENTRIES / (97 * SERVERS), "only {pages} pages");
    assert_eq!(paged.len(), ENTRIES, "paging lost or repeated entries");
    let paged_set: BTreeSet<String> = paged.into_iter().collect();
    assert_eq!(paged_set, want);

    // Resuming an old cursor twice gives the same page (cursors are values).
    let (p1, c1) = c.readdir_page(dir, &DirCursor::new(), 10).await.unwrap();
    let (a, _) = c.readdir_page(dir, &c1, 10).await.unwrap();
    let (b, _) = c.readdir_page(dir, &c1, 10).await.unwrap();
    assert_eq!(a, b);
    assert!(p1.iter().all(|e| !a.contains(e)));

    eprintln!(
        "readdir timings: create {ENTRIES} ({IN_FLIGHT} in flight) {create_time:?}, \
         read_dir {list_time:?}, paged ({pages} pages) {page_time:?}"
    );
}
