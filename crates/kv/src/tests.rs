//! Tests for the kv crate: one behavioural suite run against both stores,
//! RocksStore-specific durability and open-error tests, and a model-based
//! test comparing RocksStore to MemStore under random operations.

use std::sync::Arc;

use crate::{KvError, KvStore, MemStore, RocksStore, WriteBatch};

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn put(store: &dyn KvStore, k: &[u8], v: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(k, v);
    store.write(b, false).unwrap();
}

fn del(store: &dyn KvStore, k: &[u8]) {
    let mut b = WriteBatch::new();
    b.delete(k);
    store.write(b, false).unwrap();
}

fn pairs(items: &[(&[u8], &[u8])]) -> Pairs {
    items
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

fn rocks() -> (tempfile::TempDir, RocksStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(&dir.path().join("db")).unwrap();
    (dir, store)
}

/// Behaviour every KvStore must have. Expects an empty store.
fn suite(store: &dyn KvStore) {
    // put / get / delete
    assert_eq!(store.get(b"a").unwrap(), None);
    put(store, b"a", b"1");
    assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
    del(store, b"a");
    assert_eq!(store.get(b"a").unwrap(), None);
    del(store, b"never-existed"); // deleting an absent key is fine

    // overwrite
    put(store, b"k", b"old");
    put(store, b"k", b"new");
    assert_eq!(store.get(b"k").unwrap(), Some(b"new".to_vec()));
    del(store, b"k");

    // empty batch is a no-op
    let empty = WriteBatch::new();
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
    store.write(empty, true).unwrap();

    // atomic batch, later ops win
    let mut b = WriteBatch::new();
    b.put(b"x1", b"a");
    b.put(b"x2", b"b");
    b.put(b"x3", b"c");
    b.delete(b"x2");
    b.put(b"x1", b"A");
    assert_eq!(b.len(), 5);
    assert!(!b.is_empty());
    store.write(b, true).unwrap();
    assert_eq!(store.get(b"x1").unwrap(), Some(b"A".to_vec()));
    assert_eq!(store.get(b"x2").unwrap(), None);
    assert_eq!(store.get(b"x3").unwrap(), Some(b"c".to_vec()));
    let mut b = WriteBatch::new();
    b.delete(b"x1");
    b.delete(b"x3");
    store.write(b, false).unwrap();

    // empty value is distinct from absent
    put(store, b"empty", b"");
    assert_eq!(store.get(b"empty").unwrap(), Some(Vec::new()));
    del(store, b"empty");
    assert_eq!(store.get(b"empty").unwrap(), None);

    // empty key is allowed
    put(store, b"", b"root");
    assert_eq!(store.get(b"").unwrap(), Some(b"root".to_vec()));
    assert_eq!(store.scan(b"", b"", 1).unwrap(), pairs(&[(b"", b"root")]));
    del(store, b"");
    assert_eq!(store.get(b"").unwrap(), None);

    // binary keys and values with 0x00 / 0xff bytes
    let bin: &[&[u8]] = &[
        b"\x00",
        b"\x00\x00",
        b"\x00\xff",
        b"\x01",
        b"\xff",
        b"\xff\x00",
        b"\xff\xff",
    ];
    for (i, k) in bin.iter().enumerate() {
        put(store, k, &[0, 0xff, i as u8, 0]);
    }
    for (i, k) in bin.iter().enumerate() {
        assert_eq!(store.get(k).unwrap(), Some(vec![0, 0xff, i as u8, 0]));
    }
    let all = store.scan(b"", b"", 100).unwrap();
    let keys: Vec<&[u8]> = all.iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(keys, bin, "bytewise key order");
    let ff = store.scan(b"\xff", b"", 100).unwrap();
    assert_eq!(ff.len(), 3);
    let zero = store.scan(b"\x00", b"\x00\x00", 100).unwrap();
    assert_eq!(zero.len(), 2);
    let mut b = WriteBatch::new();
    for k in bin {
        b.delete(k);
    }
    store.write(b, false).unwrap();
    assert_eq!(store.scan(b"", b"", 100).unwrap(), Vec::new());

    // scan with prefix and start bounds
    let mut b = WriteBatch::new();
    for k in [&b"a"[..], b"p", b"p/1", b"p/2", b"p/3", b"p/4", b"p0", b"q"] {
        b.put(k, &[k[k.len() - 1]]);
    }
    store.write(b, false).unwrap();
    let p = |ks: &[&[u8]]| -> Pairs {
        ks.iter()
            .map(|k| (k.to_vec(), vec![k[k.len() - 1]]))
            .collect()
    };
    // start before prefix: starts at the prefix
    assert_eq!(
        store.scan(b"p/", b"", 100).unwrap(),
        p(&[b"p/1", b"p/2", b"p/3", b"p/4"])
    );
    assert_eq!(
        store.scan(b"p/", b"a", 100).unwrap(),
        p(&[b"p/1", b"p/2", b"p/3", b"p/4"])
    );
    // start inside the prefix range (existing and non-existing key)
    assert_eq!(
        store.scan(b"p/", b"p/2", 100).unwrap(),
        p(&[b"p/2", b"p/3", b"p/4"])
    );
    assert_eq!(
        store.scan(b"p/", b"p/25", 100).unwrap(),
        p(&[b"p/3", b"p/4"])
    );
    // start after the prefix range
    assert_eq!(store.scan(b"p/", b"p0", 100).unwrap(), Vec::new());
    assert_eq!(store.scan(b"p/", b"z", 100).unwrap(), Vec::new());
    // limit
    assert_eq!(store.scan(b"p/", b"", 2).unwrap(), p(&[b"p/1", b"p/2"]));
    assert_eq!(store.scan(b"p/", b"p/2", 1).unwrap(), p(&[b"p/2"]));
    assert_eq!(store.scan(b"p/", b"", 0).unwrap(), Vec::new());
    // prefix equal to a key includes it
    assert_eq!(
        store.scan(b"p", b"", 100).unwrap(),
        p(&[b"p", b"p/1", b"p/2", b"p/3", b"p/4", b"p0"])
    );
    // no match
    assert_eq!(store.scan(b"nope", b"", 100).unwrap(), Vec::new());
    // empty prefix = whole key space from start
    assert_eq!(store.scan(b"", b"p0", 100).unwrap(), p(&[b"p0", b"q"]));

    // sync writes and explicit WAL sync
    let mut b = WriteBatch::new();
    b.put(b"durable", b"yes");
    store.write(b, true).unwrap();
    store.sync_wal().unwrap();
    assert_eq!(store.get(b"durable").unwrap(), Some(b"yes".to_vec()));

    // large value
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    put(store, b"big", &big);
    assert_eq!(store.get(b"big").unwrap(), Some(big));
}

#[test]
fn suite_mem() {
    suite(&MemStore::new());
}

#[test]
fn suite_rocks() {
    let (_dir, store) = rocks();
    suite(&store);
}

#[test]
fn rocks_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = RocksStore::open(&path).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"synced", b"1");
        b.put(b"", b"empty-key");
        b.put(b"gone", b"x");
        store.write(b, true).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"unsynced", b"2");
        b.delete(b"gone");
        store.write(b, false).unwrap();
        store.sync_wal().unwrap();
    }
    let store = RocksStore::open(&path).unwrap();
    assert_eq!(store.get(b"synced").unwrap(), Some(b"1".to_vec()));
    assert_eq!(store.get(b"unsynced").unwrap(), Some(b"2".to_vec()));
    assert_eq!(store.get(b"").unwrap(), Some(b"empty-key".to_vec()));
    assert_eq!(store.get(b"gone").unwrap(), None);
    assert_eq!(store.scan(b"", b"", 10).unwrap().len(), 3);
}

#[test]
fn rocks_open_on_regular_file_fails() {
    let file = tempfile::NamedTempFile::new().unwrap();
    match RocksStore::open(file.path()) {
        Err(e @ KvError::Open(_)) => {
            let KvError::Open(msg) = &e else {
                unreachable!()
            };
            assert!(!msg.is_empty());
            eprintln!("open error: {e}");
            let shown = e.to_string();
            assert!(shown.contains(msg.as_str()), "{shown}");
        }
        Err(other) => panic!("expected KvError::Open, got {other:?}"),
        Ok(_) => panic!("opening a regular file must fail"),
    }
}

#[test]
fn rocks_open_path_with_nul_fails() {
    let err = RocksStore::open(std::path::Path::new("/tmp/a\0b")).unwrap_err();
    assert!(matches!(err, KvError::Open(_)), "{err:?}");
}

#[test]
fn rocks_second_open_of_same_db_fails() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RocksStore::open(dir.path()).unwrap();
    let err = RocksStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, KvError::Open(_)), "{err:?}");
}

#[test]
fn rocks_concurrent_writers() {
    let (_dir, store) = rocks();
    let store = Arc::new(store);
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let mut b = WriteBatch::new();
                    let key = [&[t][..], &i.to_be_bytes()].concat();
                    b.put(&key, &i.to_le_bytes());
                    store.write(b, i % 50 == 0).unwrap();
                    assert_eq!(store.get(&key).unwrap(), Some(i.to_le_bytes().to_vec()));
                }
                store.scan(&[t], b"", usize::MAX).unwrap().len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    assert_eq!(store.scan(b"", b"", usize::MAX).unwrap().len(), 800);
}

#[test]
fn stores_are_object_safe_and_shareable() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<RocksStore>();
    assert_send_sync::<MemStore>();
    let stores: Vec<Arc<dyn KvStore>> = vec![Arc::new(MemStore::new())];
    assert_eq!(stores[0].get(b"x").unwrap(), None);
}

/// Tiny xorshift64 PRNG (deterministic, no external crate).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Short byte strings over a tiny alphabet so keys collide and share
    /// prefixes often; includes the empty string and 0x00 / 0xff.
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        const ALPHABET: [u8; 4] = [0x00, b'a', b'b', 0xff];
        let len = self.below(max_len + 1);
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len() as u64) as usize])
            .collect()
    }
}

type Opener = fn(&std::path::Path) -> crate::Result<RocksStore>;

#[test]
fn model_rocks_matches_mem() {
    model_matches_mem(
        RocksStore::open,
        RocksStore::open,
        2_000,
        0x9E37_79B9_7F4A_7C15,
    );
}

/// A write-mostly store (vector memtable) reads as a sorted one: across
/// several of its read-time flushes (`UNSORTED_ENTRIES_MAX`), and when its
/// files are reopened by `open` halfway (a copy promoted to be served).
#[test]
fn model_write_mostly_rocks_matches_mem() {
    model_matches_mem(
        RocksStore::open_write_mostly,
        RocksStore::open,
        8_000,
        0x2545_F491_4F6C_DD1D,
    );
    model_matches_mem(
        RocksStore::open,
        RocksStore::open_write_mostly,
        8_000,
        0x5851_F42D_4C95_7F2D,
    );
}

/// Random batches, gets, scans and syncs on a RocksStore opened with
/// `first` (reopened with `then` halfway), checked against a MemStore
/// after every step.
fn model_matches_mem(first: Opener, then: Opener, steps: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rocks = first(&path).unwrap();
    let model = MemStore::new();
    let mut rng = XorShift(seed);
    for step in 0..steps {
        if step == steps / 2 {
            // Halfway: close and reopen, state must be unchanged.
            drop(rocks);
            rocks = then(&path).unwrap();
        }
        match rng.below(10) {
            0..=3 => {
                let mut b = WriteBatch::new();
                for _ in 0..=rng.below(4) {
                    if rng.below(3) == 0 {
                        b.delete(&rng.bytes(4));
                    } else {
                        let (k, v) = (rng.bytes(4), rng.bytes(3));
                        b.put(&k, &v);
                    }
                }
                let sync = rng.below(8) == 0;
                rocks.write(b.clone(), sync).unwrap();
                model.write(b, sync).unwrap();
            }
            4..=6 => {
                let k = rng.bytes(4);
                assert_eq!(
                    rocks.get(&k).unwrap(),
                    model.get(&k).unwrap(),
                    "step {step}: get {k:?}"
                );
            }
            7..=8 => {
                let (prefix, start) = (rng.bytes(2), rng.bytes(4));
                let limit = rng.below(12) as usize;
                assert_eq!(
                    rocks.scan(&prefix, &start, limit).unwrap(),
                    model.scan(&prefix, &start, limit).unwrap(),
                    "step {step}: scan prefix={prefix:?} start={start:?} limit={limit}"
                );
            }
            _ => {
                rocks.sync_wal().unwrap();
                model.sync_wal().unwrap();
            }
        }
    }
    assert_eq!(
        rocks.scan(b"", b"", usize::MAX).unwrap(),
        model.scan(b"", b"", usize::MAX).unwrap()
    );
}

/// `scan_visit` sees what `scan` returns, in order, stops when told, and
/// crosses the default implementation's batch boundary.
fn visit_suite(store: &dyn KvStore) {
    for i in 0..2500u32 {
        put(store, format!("v{i:05}").as_bytes(), &i.to_le_bytes());
    }
    put(store, b"w0", b"other prefix");
    let want = store.scan(b"v", b"v00100", usize::MAX).unwrap();
    assert_eq!(want.len(), 2400);
    let mut got: Pairs = Vec::new();
    store
        .scan_visit(b"v", b"v00100", &mut |k, v| {
            got.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
    assert_eq!(got, want);
    let mut n = 0;
    store
        .scan_visit(b"v", b"", &mut |_, _| {
            n += 1;
            n < 1500
        })
        .unwrap();
    assert_eq!(n, 1500);
}

#[test]
fn scan_visit_mem() {
    visit_suite(&MemStore::new());
}

#[test]
fn suite_write_mostly_rocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open_write_mostly(&dir.path().join("db")).unwrap();
    suite(&store);
    visit_suite(&store);
}

#[test]
fn scan_visit_rocks() {
    let (_dir, store) = rocks();
    visit_suite(&store);
}

#[test]
fn batches_round_trip_through_bytes() {
    let mut b = WriteBatch::new();
    b.put(b"", b"");
    b.put(b"k1", &[7u8; 300]);
    b.delete(b"k2");
    b.put(b"k1", b"again");
    let bytes = b.encode();
    let back = WriteBatch::decode(&bytes).expect("decodes");
    assert_eq!(back.ops(), b.ops());
    assert!(WriteBatch::decode(&[]).unwrap().is_empty());
    // Cut anywhere inside, or a bad tag: refused, never a panic.
    for cut in 1..bytes.len() {
        let partial = WriteBatch::decode(&bytes[..cut]);
        assert!(partial.is_none() || partial.unwrap().len() < b.len());
    }
    assert!(WriteBatch::decode(&[9, 0, 0, 0, 0]).is_none());
    // The bytes its puts bring: keys and values, not the deletes.
    assert_eq!(WriteBatch::encoded_put_bytes(&bytes), Some(2 + 300 + 2 + 5));
    assert_eq!(WriteBatch::encoded_put_bytes(&[]), Some(0));
    for cut in 1..bytes.len() {
        let whole = WriteBatch::decode(&bytes[..cut]).is_some();
        assert_eq!(
            WriteBatch::encoded_put_bytes(&bytes[..cut]).is_some(),
            whole
        );
    }
    assert!(WriteBatch::encoded_put_bytes(&[9, 0, 0, 0, 0]).is_none());
}

#[test]
fn an_appended_batch_applies_as_the_two_in_order() {
    let store = MemStore::new();
    let mut first = WriteBatch::new();
    first.put(b"a", b"1");
    first.put(b"b", b"1");
    let mut second = WriteBatch::new();
    second.delete(b"a");
    second.put(b"b", b"2");
    second.put(b"c", b"2");
    first.append(second);
    assert_eq!(first.len(), 5);
    store.write(first, false).unwrap();
    assert_eq!(store.get(b"a").unwrap(), None);
    assert_eq!(store.get(b"b").unwrap(), Some(b"2".to_vec()));
    assert_eq!(store.get(b"c").unwrap(), Some(b"2".to_vec()));
}
