//! The servers' chunk cache (crates/server/src/chunk_cache.rs) through real
//! `madfs server` processes: whatever changed a file (large direct writes,
//! small buffered ones over them, truncates shorter and longer, chunk 0
//! moving out of its inline record, removal), reads see exactly the new
//! bytes, checked against a plain model after every step; and the cache did
//! serve reads (the servers' counters at shutdown say so).

mod common;

use common::{pattern, Options, TestCluster, CHUNK};
use madfs_client::{Client, OpenOptions};

/// A cache of a few chunks, so that evictions happen too.
fn cluster() -> TestCluster {
    TestCluster::start_with(
        2,
        Options {
            server_args: vec!["--cache-mib".into(), "3".into()],
            ..Options::default()
        },
    )
}

/// Stop every server and sum the cache hits their logs report.
fn cache_hits(mut tc: TestCluster) -> u64 {
    let mut hits = 0;
    for i in 0..tc.server_count() {
        assert!(tc.stop(i).success());
        let log = std::fs::read_to_string(tc.log_path(i)).unwrap();
        let line = log
            .lines()
            .find(|l| l.contains("chunk cache:"))
            .unwrap_or_else(|| panic!("server {i} logged no cache counters:\n{log}"));
        let n: u64 = line
            .split("chunk cache:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unreadable counters: {line}"));
        hits += n;
    }
    hits
}

fn rw() -> OpenOptions {
    OpenOptions::new().read(true).write(true)
}

async fn check(c: &Client, path: &str, want: &[u8], what: &str) {
    let got = c.read_file(path).await.unwrap();
    assert_eq!(got.len(), want.len(), "{what}: size of {path}");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: {path} differs first at byte {i}");
    }
}

fn put(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_every_kind_of_change_see_the_new_bytes() {
    let tc = cluster();
    let c = tc.client();
    let cs = CHUNK as usize;
    let f = c
        .open("/f", rw().create(true).truncate(true))
        .await
        .unwrap();
    let mut model = Vec::new();

    // Large aligned writes go direct and are kept; read back twice (the
    // second time from the cache).
    let big = pattern(1, 3 * cs);
    f.write_at(0, &big).await.unwrap();
    put(&mut model, 0, &big);
    f.close().await.unwrap();
    check(&c, "/f", &model, "written direct").await;
    check(&c, "/f", &model, "read again").await;

    // Small unaligned writes over cached extents (buffered) are seen.
    for (i, off) in [5usize, cs - 3, cs + 4096, 2 * cs + 100_000]
        .into_iter()
        .enumerate()
    {
        let small = pattern(10 + i as u64, 3_000);
        f.write_at(off as u64, &small).await.unwrap();
        put(&mut model, off, &small);
    }
    check(&c, "/f", &model, "small writes over cached data").await;

    // A large aligned overwrite across a chunk boundary.
    let over = pattern(2, cs);
    f.write_at(cs as u64 / 2, &over).await.unwrap();
    put(&mut model, cs / 2, &over);
    check(&c, "/f", &model, "large overwrite").await;

    // Truncate into chunk 1, then extend far beyond by a write: what
    // lies between must read as zeros, not as the cached old bytes.
    f.set_len(cs as u64 + 12_345).await.unwrap();
    model.truncate(cs + 12_345);
    check(&c, "/f", &model, "truncated").await;
    let tail = pattern(3, 256 << 10);
    f.write_at(2 * cs as u64 + (512 << 10), &tail)
        .await
        .unwrap();
    put(&mut model, 2 * cs + (512 << 10), &tail);
    f.close().await.unwrap();
    check(&c, "/f", &model, "extended after truncate").await;
    // And longer by set_len alone.
    f.set_len(4 * cs as u64).await.unwrap();
    model.resize(4 * cs, 0);
    check(&c, "/f", &model, "extended by set_len").await;
    f.set_len(0).await.unwrap();
    model.clear();
    check(&c, "/f", &model, "emptied").await;

    // Chunk 0 inline, then moved out to a file by a large aligned write.
    let g = c
        .open("/g", rw().create(true).truncate(true))
        .await
        .unwrap();
    let mut gm = Vec::new();
    let head = pattern(4, 1000);
    g.write_at(0, &head).await.unwrap();
    put(&mut gm, 0, &head);
    check(&c, "/g", &gm, "inline").await;
    let big = pattern(5, 512 << 10);
    g.write_at(256 << 10, &big).await.unwrap();
    put(&mut gm, 256 << 10, &big);
    g.close().await.unwrap();
    check(&c, "/g", &gm, "moved out of the inline record").await;
    check(&c, "/g", &gm, "again").await;

    // Removed, and a new file under the same name.
    c.remove_file("/g").await.unwrap();
    let h = c
        .open("/g", rw().create(true).truncate(true))
        .await
        .unwrap();
    let other = pattern(6, 512 << 10);
    h.write_at(256 << 10, &other[..256 << 10]).await.unwrap();
    h.close().await.unwrap();
    let mut hm = vec![0u8; 256 << 10];
    hm.extend_from_slice(&other[..256 << 10]);
    check(&c, "/g", &hm, "a new file under a removed name").await;
    drop(c);
    assert!(
        cache_hits(tc) > 0,
        "no read came from the cache (short of memory? it leaves an eighth available)"
    );
}

/// A small deterministic generator (xorshift64*): a seed replays a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Model-based, through the client: random large aligned and small
/// unaligned writes, truncates (shorter and longer), removals and reads of
/// three files, compared with a plain model after every step. Seeded:
/// `MADFS_CACHE_SEED=N` replays one seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_changes_through_the_client_read_back_as_a_model_says() {
    let seeds: Vec<u64> = match std::env::var("MADFS_CACHE_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => vec![1, 2],
    };
    let tc = cluster();
    let c = tc.client();
    let cs = CHUNK;
    let page = 4096u64;
    for seed in seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let paths: Vec<String> = (0..3).map(|i| format!("/s{seed}-{i}")).collect();
        let mut models: Vec<Vec<u8>> = vec![Vec::new(); paths.len()];
        for p in &paths {
            c.write_file(p.as_str(), b"").await.unwrap();
        }
        for step in 0..120 {
            let ctx = format!("seed {seed} step {step} (MADFS_CACHE_SEED={seed} replays it)");
            let i = rng.below(paths.len() as u64) as usize;
            let (path, model) = (&paths[i], &mut models[i]);
            match rng.below(100) {
                0..=34 => {
                    // Large and aligned: direct on the servers.
                    let len = page * (64 + rng.below(320));
                    let off = page * rng.below(4 * cs / page);
                    let data = pattern(rng.next(), len as usize);
                    let f = c.open(path.as_str(), rw()).await.unwrap();
                    f.write_at(off, &data).await.unwrap();
                    f.close().await.unwrap();
                    put(model, off as usize, &data);
                }
                35..=59 => {
                    let len = 1 + rng.below(20_000);
                    let off = rng.below(4 * cs);
                    let data = pattern(rng.next(), len as usize);
                    let f = c.open(path.as_str(), rw()).await.unwrap();
                    f.write_at(off, &data).await.unwrap();
                    f.close().await.unwrap();
                    put(model, off as usize, &data);
                }
                60..=71 => {
                    let size = rng.below(5 * cs);
                    let f = c.open(path.as_str(), rw()).await.unwrap();
                    f.set_len(size).await.unwrap();
                    f.close().await.unwrap();
                    model.resize(size as usize, 0);
                }
                72..=76 => {
                    c.remove_file(path.as_str()).await.unwrap();
                    c.write_file(path.as_str(), b"").await.unwrap();
                    model.clear();
                }
                _ => {
                    let f = c
                        .open(path.as_str(), OpenOptions::new().read(true))
                        .await
                        .unwrap();
                    let off = if rng.below(2) == 0 {
                        page * rng.below(4 * cs / page)
                    } else {
                        rng.below(4 * cs)
                    };
                    let len = 1 + rng.below(2 * cs) as usize;
                    let got = f.read_at(off, len).await.unwrap();
                    let start = (off as usize).min(model.len());
                    let end = (off as usize + len).min(model.len());
                    assert!(got == model[start..end], "{ctx}: read of {len} at {off}");
                }
            }
            if step % 10 == 9 {
                check(&c, path, model, &ctx).await;
            }
        }
        for (p, m) in paths.iter().zip(&models) {
            check(&c, p, m, &format!("seed {seed} at the end")).await;
        }
    }
    drop(c);
    assert!(
        cache_hits(tc) > 0,
        "no read came from the cache (short of memory? it leaves an eighth available)"
    );
}
