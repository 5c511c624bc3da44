//! Guards concurrent use: several client processes creating files in one
//! directory lose nothing and duplicate nothing; racing exclusive creates
//! (and mkdirs, and unlinks) of one name have exactly one winner; racing
//! renames onto one name all succeed and leave exactly one entry; concurrent
//! writes to disjoint ranges of one file all land; a close racing with a
//! truncate through another handle, or a close after another client's
//! truncate, never grows the file back.

mod common;

use common::{names, pattern, TestCluster};
use madfs_client::{Client, ErrorCode, OpenOptions};
use std::collections::BTreeSet;
use std::process::Command;

const SERVERS: usize = 4;

#[test]
fn four_client_processes_fill_one_directory() {
    let tc = TestCluster::start(SERVERS);
    tc.madfs_ok(["mkdir", "/shared"]);
    let local = tc.root().join("local");
    std::fs::create_dir(&local).unwrap();
    for w in 0..4 {
        for i in 0..50 {
            std::fs::write(
                local.join(format!("w{w}-{i}")),
                format!("worker {w} file {i}"),
            )
            .unwrap();
        }
    }
    // Four workers, each a stream of `madfs put` processes, all at once.
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let (tc, local) = (&tc, &local);
                s.spawn(move || {
                    for i in 0..50 {
                        let name = format!("w{w}-{i}");
                        let out = Command::new(common::MADFS)
                            .arg("put")
                            .arg(local.join(&name))
                            .arg(format!("/shared/{name}"))
                            .env("MADFS_CLUSTER", tc.cluster_file())
                            .output()
                            .unwrap();
                        assert!(
                            out.status.success(),
                            "put {name}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    let listing = names(&rt.block_on(c.read_dir("/shared")).unwrap());
    let unique: BTreeSet<&String> = listing.iter().collect();
    assert_eq!(listing.len(), 200, "listing: {listing:?}");
    assert_eq!(unique.len(), 200, "duplicates in listing");
    let mut want: Vec<String> = (0..4)
        .flat_map(|w| (0..50).map(move |i| format!("w{w}-{i}")))
        .collect();
    want.sort();
    assert_eq!(listing, want);
    for w in 0..4 {
        for i in 0..50 {
            let got = rt
                .block_on(c.read_file(format!("/shared/w{w}-{i}")))
                .unwrap();
            assert_eq!(got, format!("worker {w} file {i}").as_bytes());
        }
    }
    // `madfs ls` agrees.
    let ls = tc.madfs_ok(["ls", "/shared"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), want);
}

/// Run `tasks` racers, each with its own connection pool, and count the
/// outcomes of `op` by error code (None for success).
async fn race<F, Fut>(
    clients: &[Client],
    tasks: usize,
    op: F,
) -> std::collections::HashMap<Option<ErrorCode>, usize>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = Result<(), madfs_client::ClientError>> + Send + 'static,
{
    let handles: Vec<_> = (0..tasks)
        .map(|t| tokio::spawn(op(clients[t % clients.len()].clone())))
        .collect();
    let mut outcomes = std::collections::HashMap::new();
    for h in handles {
        let key = h.await.unwrap().err().map(|e| e.code);
        *outcomes.entry(key).or_insert(0) += 1;
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_exclusive_creates_have_one_winner() {
    let tc = TestCluster::start(SERVERS);
    // Separate clients: separate connections, so requests truly interleave.
    let clients: Vec<Client> = (0..4).map(|_| tc.client()).collect();
    let c = &clients[0];
    c.mkdir("/race", 0o755).await.unwrap();
    let racers = 12;
    for n in 0..16 {
        let path = format!("/race/excl-{n}");
        let p = path.clone();
        let outcomes = race(&clients, racers, move |c| {
            let p = p.clone();
            async move {
                let f = c
                    .open(p.as_str(), OpenOptions::new().write(true).create_new(true))
                    .await?;
                f.close().await
            }
        })
        .await;
        let want = [(None, 1), (Some(ErrorCode::Exists), racers - 1)]
            .into_iter()
            .collect();
        assert_eq!(outcomes, want, "exclusive create of {path}");
        assert_eq!(c.stat(path.as_str()).await.unwrap().nlink, 1);

        let dir = format!("/race/dir-{n}");
        let d = dir.clone();
        let outcomes = race(&clients, racers, move |c| {
            let d = d.clone();
            async move { c.mkdir(d.as_str(), 0o755).await.map(|_| ()) }
        })
        .await;
        let want = [(None, 1), (Some(ErrorCode::Exists), racers - 1)]
            .into_iter()
            .collect();
        assert_eq!(outcomes, want, "mkdir of {dir}");
    }
    let listing = c.read_dir("/race").await.unwrap();
    assert_eq!(listing.len(), 32, "{:?}", names(&listing));

    // Non-exclusive creates of one name all succeed and share one inode.
    let outcomes = race(&clients, racers, |c| async move {
        let f = c
            .open("/race/shared", OpenOptions::new().write(true).create(true))
            .await?;
        f.close().await
    })
    .await;
    assert_eq!(outcomes, [(None, racers)].into_iter().collect());
    let listing = c.read_dir("/race").await.unwrap();
    assert_eq!(listing.len(), 33);
}

/// POSIX rename never fails because another rename got there first:
/// renames of distinct sources onto one name all succeed, each replacing
/// the previous winner, and exactly one entry is left. (This is the "write
/// a temp file, rename it over the real one" idiom run by several writers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_renames_onto_one_name_all_succeed() {
    let tc = TestCluster::start(SERVERS);
    let clients: Vec<Client> = (0..4).map(|_| tc.client()).collect();
    let c = &clients[0];
    c.mkdir("/ren", 0o755).await.unwrap();
    let n = 16;
    for round in 0..3 {
        for i in 0..n {
            c.write_file(
                format!("/ren/src-{i}"),
                format!("round {round} source {i}").as_bytes(),
            )
            .await
            .unwrap();
        }
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let c = clients[i % clients.len()].clone();
                tokio::spawn(async move {
                    c.rename(format!("/ren/src-{i}"), "/ren/target")
                        .await
                        .map_err(|e| format!("rename src-{i}: {e} ({:?})", e.code))
                })
            })
            .collect();
        let mut failures = Vec::new();
        for h in handles {
            if let Err(e) = h.await.unwrap() {
                failures.push(e);
            }
        }
        assert!(
            failures.is_empty(),
            "round {round}: {} of {n} racing renames failed: {failures:#?}",
            failures.len()
        );
        assert_eq!(names(&c.read_dir("/ren").await.unwrap()), vec!["target"]);
        let content = String::from_utf8(c.read_file("/ren/target").await.unwrap()).unwrap();
        assert!(
            content.starts_with(&format!("round {round} source ")),
            "{content}"
        );
        assert_eq!(c.stat("/ren/target").await.unwrap().nlink, 1);
    }
    // Replaced inodes were freed: only root, /ren and the target remain.
    let stats = c.statfs().await.unwrap();
    assert_eq!(stats.inodes, 3, "leaked inodes after racing renames");
}

/// Racing unlinks of one name: exactly one succeeds, the others see ENOENT
/// (never EAGAIN, which unlink(2) cannot return). In a plain directory and
/// in a sticky one like /tmp (where the server checks the victim's owner
/// before locking, which widens the race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_unlinks_of_one_name_have_one_winner() {
    let tc = TestCluster::start(SERVERS);
    let clients: Vec<Client> = (0..4).map(|_| tc.client()).collect();
    let c = &clients[0];
    c.mkdir("/plain", 0o755).await.unwrap();
    c.mkdir("/sticky", 0o1777).await.unwrap();
    let racers = 16;
    let mut wrong = Vec::new();
    for dir in ["/plain", "/sticky"] {
        for n in 0..200 {
            let path = format!("{dir}/f{n}");
            c.write_file(path.as_str(), b"x").await.unwrap();
            let p = path.clone();
            let outcomes = race(&clients, racers, move |c| {
                let p = p.clone();
                async move { c.remove_file(p.as_str()).await }
            })
            .await;
            let want = [(None, 1), (Some(ErrorCode::NotFound), racers - 1)]
                .into_iter()
                .collect();
            if outcomes != want {
                wrong.push(format!("{path}: {outcomes:?}"));
            }
        }
        assert!(c.read_dir(dir).await.unwrap().is_empty());
    }
    assert!(
        wrong.is_empty(),
        "racing unlinks must give one success and ENOENT for the rest; {} of 400 did not:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_writes_to_disjoint_ranges_all_land() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    // Disjoint ranges of one file written concurrently through one handle.
    let f = std::sync::Arc::new(
        c.open(
            "/parallel",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .await
        .unwrap(),
    );
    let piece = 300_000usize;
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let f = f.clone();
            tokio::spawn(async move {
                f.write_at((i * piece) as u64, &pattern(i as u64, piece))
                    .await
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    f.close().await.unwrap();
    let all = c.read_file("/parallel").await.unwrap();
    assert_eq!(all.len(), 16 * piece);
    for i in 0..16 {
        assert!(
            all[i * piece..(i + 1) * piece] == pattern(i as u64, piece)[..],
            "piece {i} differs"
        );
    }
}

/// A handle that wrote past chunk 0 publishes its size at close; a
/// truncate through another handle of the same client at the same moment
/// must win whichever goes first: the close's size is from before the
/// truncate (published before it, the truncate cuts it; read before it and
/// published after, the owner, merging sizes as a maximum, would grow the
/// file back to it). Every round ends at the truncated size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_racing_with_a_truncate_never_grows_the_file_back() {
    let tc = TestCluster::start(SERVERS);
    let c = tc.client();
    let chunk = common::CHUNK;
    let (long, short) = (2 * chunk + 4096, chunk / 2);
    let mut grown = Vec::new();
    for round in 0..160u64 {
        let path = format!("/race-{round}");
        let rw = OpenOptions::new().read(true).write(true).create(true);
        let writer = c.open(path.as_str(), rw).await.unwrap();
        let cutter = c.open(path.as_str(), rw).await.unwrap();
        // Past chunk 0: its size is published only at close.
        writer.write_at(long - 4096, &[7u8; 4096]).await.unwrap();
        // The close starts a little later each round (0 to 4 ms), so some
        // rounds read the size while the truncate's requests are out.
        let late = std::time::Duration::from_micros(50 * (round % 80));
        let close_late = async {
            let until = std::time::Instant::now() + late;
            while std::time::Instant::now() < until {
                tokio::task::yield_now().await;
            }
            writer.close().await
        };
        let (closed, cut) = tokio::join!(close_late, cutter.set_len(short));
        closed.unwrap();
        cut.unwrap();
        cutter.close().await.unwrap();
        let size = c.stat(path.as_str()).await.unwrap().size;
        if size != short {
            grown.push(format!("round {round}: {size}"));
        }
    }
    assert!(
        grown.is_empty(),
        "the file grew back past the truncate to {short}: {grown:?}"
    );
}

/// The same across clients (another node): a handle writes past chunk 0,
/// another client truncates the file, then the handle closes. Its size is
/// from before the truncate and its bytes past the cut are gone, so the
/// file keeps the truncated size instead of growing back over zeros. What
/// the handle writes after the truncate still grows the file, to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_after_another_clients_truncate_keeps_the_truncated_size() {
    let tc = TestCluster::start(SERVERS);
    let (a, b) = (tc.client(), tc.client());
    let chunk = common::CHUNK;
    let (long, short) = (3 * chunk + 4096, chunk / 2);
    assert!(short > 100);
    let rw = OpenOptions::new().read(true).write(true).create(true);

    // Written, cut elsewhere, closed: the cut stands.
    let writer = a.open("/cut", rw).await.unwrap();
    writer.write_at(0, &pattern(1, 100)).await.unwrap();
    writer.write_at(long - 4096, &[7u8; 4096]).await.unwrap();
    b.truncate("/cut", short).await.unwrap();
    writer.close().await.unwrap();
    // Asked through a new client each time: a client's cache may hold a
    // size it set or read itself.
    assert_eq!(tc.client().stat("/cut").await.unwrap().size, short);

    // Written, cut elsewhere (an extension from `short` cuts what lies
    // past it), written again lower than the first end, then closed: the
    // size is the end of the second write.
    let writer = a.open("/cut", rw).await.unwrap();
    writer.write_at(long - 4096, &[7u8; 4096]).await.unwrap();
    b.truncate("/cut", chunk + 5000).await.unwrap();
    let again = chunk + 6000;
    writer.write_at(again, &pattern(2, 100)).await.unwrap();
    writer.close().await.unwrap();
    let all = tc.client().read_file("/cut").await.unwrap();
    assert_eq!(all.len() as u64, again + 100);
    assert_eq!(&all[..100], &pattern(1, 100)[..]);
    assert!(all[short as usize..again as usize].iter().all(|&x| x == 0));
    assert_eq!(&all[again as usize..], &pattern(2, 100)[..]);

    // Nothing cut: a close publishes its end as before.
    let writer = a.open("/cut", rw).await.unwrap();
    writer.write_at(long - 4096, &[9u8; 4096]).await.unwrap();
    writer.close().await.unwrap();
    assert_eq!(tc.client().stat("/cut").await.unwrap().size, long);
}

/// Count every inode reachable from the root (no hard links here).
async fn reachable(c: &Client) -> u64 {
    let mut count = 1; // the root
    let mut dirs = vec!["/".to_string()];
    while let Some(d) = dirs.pop() {
        for e in c.read_dir(d.as_str()).await.unwrap() {
            count += 1;
            if e.kind == madfs_client::FileKind::Dir {
                dirs.push(format!("{}/{}", d.trim_end_matches('/'), e.name));
            }
        }
    }
    count
}

/// rmdir racing with creates in the directory: either a create lands
/// first (rmdir then fails with ENOTEMPTY and the file is listed) or rmdir
/// does (the creates fail with ENOENT); never both, and no file is ever
/// left behind in a removed directory (an inode not reachable from the root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmdir_racing_creates_leaves_no_orphans() {
    let tc = TestCluster::start(SERVERS);
    let clients: Vec<Client> = (0..4).map(|_| tc.client()).collect();
    let c = clients[0].clone();
    let (mut rmdir_won, mut create_won) = (0, 0);
    // At least 40 rounds, more (bounded) until each side won once: rmdir
    // wins only a few in 40 here, so 40 alone sometimes saw none.
    for round in 0..400 {
        if round >= 40 && rmdir_won > 0 && create_won > 0 {
            break;
        }
        let dir = format!("/victim{round}");
        c.mkdir(dir.as_str(), 0o755).await.unwrap();
        let creators: Vec<_> = (0..4)
            .map(|t| {
                let (c, p) = (clients[t].clone(), format!("{dir}/f{t}"));
                tokio::spawn(async move { c.write_file(p.as_str(), b"x").await })
            })
            .collect();
        let remover = {
            let (c, dir) = (clients[(round % 4) as usize].clone(), dir.clone());
            tokio::spawn(async move { c.remove_dir(dir.as_str()).await })
        };
        let removed = remover.await.unwrap();
        let mut made = Vec::new();
        for (t, h) in creators.into_iter().enumerate() {
            match h.await.unwrap() {
                Ok(()) => made.push(format!("f{t}")),
                Err(e) => assert_eq!(
                    e.code,
                    ErrorCode::NotFound,
                    "round {round}: create f{t}: {e}"
                ),
            }
        }
        match removed {
            Ok(()) => {
                rmdir_won += 1;
                // Asked of the remover's client: another client may have
                // the directory in its metadata cache for up to its TTL.
                let remover = &clients[(round % 4) as usize];
                assert_eq!(
                    remover.stat(dir.as_str()).await.unwrap_err().code,
                    ErrorCode::NotFound
                );
                assert!(
                    made.is_empty(),
                    "round {round}: rmdir succeeded but {made:?} were created in it"
                );
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::NotEmpty, "round {round}: rmdir: {e}");
                create_won += 1;
                assert!(
                    !made.is_empty(),
                    "round {round}: ENOTEMPTY, yet nothing was created"
                );
                let listed = names(&c.read_dir(dir.as_str()).await.unwrap());
                assert_eq!(listed, made, "round {round}");
            }
        }
        let stats = c.statfs().await.unwrap();
        let live = reachable(&c).await;
        assert_eq!(
            stats.inodes, live,
            "round {round}: {} inodes exist but {live} are reachable (orphans in a removed directory)",
            stats.inodes
        );
    }
    eprintln!("rmdir won {rmdir_won} races, a create won {create_won}");
    // Both sides of the race were exercised (typically 1 to 6 rmdirs in 40).
    assert!(rmdir_won > 0 && create_won > 0);
}
