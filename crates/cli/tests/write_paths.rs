//! The fast write paths: a small file created with its data in one request
//! (`Client::create_with_data`, what mdtest-hard-write and `madfs bench`
//! use), and files opened with write-behind (`OpenOptions::write_behind`,
//! used by `madfs put` and the benchmark's ior phases). Both must give the
//! same files as the plain paths, and the server must refuse a create that
//! carries data it cannot take. Reads sent ahead (`OpenOptions::read_ahead`,
//! used by `madfs get` and the benchmark's read phases) must return what
//! plain reads return.

mod common;

use common::{frame, key_of, pattern, Raw, TestCluster, CHUNK};
use madfs_client::{ErrorCode, FileName, InodeId, OpenOptions};
use madfs_proto::message::Op;
use madfs_proto::{Opcode, Request};
use madfs_types::{limits, Credentials, FileKind};
use std::time::{Duration, Instant};

fn name(s: &str) -> FileName {
    FileName::new(s.as_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_with_data_makes_the_same_file_as_create_then_write() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    let dir = c.mkdir("/d", 0o755).await.unwrap().ino;
    let inline_max = limits::INLINE_DATA_MAX_BYTES as usize;
    // Empty, small, exactly the inline limit (one request each), one byte
    // more and several chunks (created, then written).
    for (i, len) in [0, 3_901, inline_max, inline_max + 1, 2 * CHUNK as usize + 5]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u64, len);
        let file = format!("f{i}");
        let attr = c
            .create_with_data(dir, &name(&file), 0o640, &data)
            .await
            .unwrap_or_else(|e| panic!("create {len} bytes: {e}"));
        assert_eq!(attr.size, len as u64, "size returned for {len} bytes");
        assert_eq!(attr.kind, FileKind::File);
        assert_eq!(attr.perm & 0o7777, 0o640);
        // Another client sees the whole file at once (no close needed).
        let other = tc.client();
        let path = format!("/d/{file}");
        assert_eq!(other.stat(&path).await.unwrap().size, len as u64);
        let back = other.read_file(&path).await.unwrap();
        assert!(back == data, "content of {len} bytes differs");
    }
    // Exclusive: an existing name is refused and keeps its content.
    let again = c
        .create_with_data(dir, &name("f1"), 0o644, b"other")
        .await
        .unwrap_err();
    assert_eq!(again.code, ErrorCode::Exists);
    assert!(c.read_file("/d/f1").await.unwrap() == pattern(1, 3_901));
    // A file made this way grows by ordinary writes like any other.
    let f = c
        .open("/d/f1", OpenOptions::new().write(true))
        .await
        .unwrap();
    f.write_at(3_901, b"tail").await.unwrap();
    f.close().await.unwrap();
    let mut want = pattern(1, 3_901);
    want.extend_from_slice(b"tail");
    assert!(c.read_file("/d/f1").await.unwrap() == want);
}

/// Send a Create carrying `data` on a raw connection; the reply's status.
fn raw_create(raw: &mut Raw, id: u64, kind: FileKind, exclusive: bool, data: &[u8]) -> u16 {
    let body = Request {
        creds: Credentials::root(),
        op: Op::Create {
            parent: InodeId::ROOT,
            name: name(&format!("raw{id}")),
            kind,
            perm: 0o644,
            exclusive,
            symlink_target: if kind == FileKind::Symlink {
                b"target".to_vec()
            } else {
                Vec::new()
            },
        },
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::Create, id, &body, data.len() as u32));
    raw.send(&body);
    raw.send(data);
    let (h, _, _) = raw.read_frame().expect("a reply to the create");
    assert!(h.is_response);
    assert_eq!(h.request_id.0, id);
    h.status
}

#[test]
fn server_refuses_data_on_creates_that_cannot_take_it() {
    let tc = TestCluster::start(1);
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key_of(&tc)), 0);
    let bad = ErrorCode::InvalidArgument as u16;
    let too_big = vec![7u8; limits::INLINE_DATA_MAX_BYTES as usize + 1];
    assert_eq!(raw_create(&mut raw, 1, FileKind::Dir, true, b"x"), bad);
    assert_eq!(raw_create(&mut raw, 2, FileKind::Symlink, true, b"x"), bad);
    assert_eq!(raw_create(&mut raw, 3, FileKind::File, false, b"x"), bad);
    assert_eq!(raw_create(&mut raw, 4, FileKind::File, true, &too_big), bad);
    // The connection is still good, and a valid one works on it.
    assert_eq!(raw_create(&mut raw, 5, FileKind::File, true, b"hello"), 0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    for id in 1..=4 {
        let r = rt.block_on(c.stat(&format!("/raw{id}")));
        assert_eq!(r.unwrap_err().code, ErrorCode::NotFound, "raw{id} exists");
    }
    assert_eq!(rt.block_on(c.read_file("/raw5")).unwrap(), b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_behind_file_reads_back_and_publishes_its_size() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    let block = 300_000usize; // not a divisor of the chunk size
    let blocks = 20;
    let want: Vec<u8> = pattern(9, block * blocks);
    let f = c
        .open(
            "/wb",
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .write_behind(true),
        )
        .await
        .unwrap();
    for (i, piece) in want.chunks(block).enumerate() {
        if i % 2 == 0 {
            f.write_owned((i * block) as u64, piece.to_vec())
                .await
                .unwrap();
        } else {
            assert_eq!(f.write_at((i * block) as u64, piece).await.unwrap(), block);
        }
    }
    // Overlapping rewrites land in order: the last one wins.
    f.write_at(10, b"first").await.unwrap();
    f.write_at(10, b"SECOND").await.unwrap();
    let mut want = want;
    want[10..16].copy_from_slice(b"SECOND");
    assert_eq!(f.size(), want.len() as u64);
    // A read through the handle waits for the writes in flight.
    assert!(f.read_at(0, want.len()).await.unwrap() == want);
    f.close().await.unwrap();
    let other = tc.client();
    assert_eq!(other.stat("/wb").await.unwrap().size, want.len() as u64);
    assert!(other.read_file("/wb").await.unwrap() == want);

    // Dropped without close: the size still reaches the owner once the
    // writes land (in the background, so wait for it).
    let f = c
        .open(
            "/dropped",
            OpenOptions::new()
                .write(true)
                .create(true)
                .write_behind(true),
        )
        .await
        .unwrap();
    let tail = pattern(3, CHUNK as usize + 100);
    f.write_at(0, &tail).await.unwrap();
    drop(f);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let size = other.stat("/dropped").await.unwrap().size;
        if size == tail.len() as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "size of a dropped write-behind file stuck at {size}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(other.read_file("/dropped").await.unwrap() == tail);
}

/// A read-ahead handle returns the bytes a plain read returns, whatever the
/// order of the reads (front to back, by a stride, backwards), with large
/// aligned chunks that the servers write and read past their page cache;
/// and a read sent ahead that met the end of the file does not hide data
/// appended since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_returns_what_plain_reads_return() {
    let tc = TestCluster::start(2);
    let c = tc.client();
    let piece = 256 * 1024;
    let data = pattern(11, 10 * piece + 123);
    c.write_file("/ra", &data).await.unwrap();
    let want =
        |off: usize, len: usize| data[off.min(data.len())..(off + len).min(data.len())].to_vec();
    let ra = OpenOptions::new().read(true).read_ahead(true);
    let f = c.open("/ra", ra).await.unwrap();
    let mut order: Vec<usize> = (0..=10).collect(); // front to back
    order.extend((0..=10).step_by(3)); // a stride of three pieces
    order.extend((0..=10).rev()); // backwards
    order.extend([4, 5, 6, 2, 3, 9, 10, 0]); // runs and jumps
    for i in order {
        let got = f.read_at((i * piece) as u64, piece).await.unwrap();
        assert!(got == want(i * piece, piece), "piece {i}");
    }
    // Piece 9 sends piece 10 ahead, which meets the end (123 bytes)...
    let g = c.open("/ra", ra).await.unwrap();
    assert!(g.read_at((9 * piece) as u64, piece).await.unwrap() == want(9 * piece, piece));
    // ...then another handle writes the rest of piece 10 and closes.
    let more = pattern(12, piece);
    let w = c.open("/ra", OpenOptions::new().write(true)).await.unwrap();
    w.write_at((10 * piece) as u64, &more).await.unwrap();
    w.close().await.unwrap();
    let got = g.read_at((10 * piece) as u64, piece).await.unwrap();
    assert_eq!(got.len(), piece, "the short read sent ahead was not used");
    assert!(got == more);
}
