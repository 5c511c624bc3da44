//! MadFS key-value layer.
//!
//! Defines the [`KvStore`] trait the metadata server is written against, the
//! [`WriteBatch`] of atomic operations, and two implementations:
//! [`RocksStore`] (production: a minimal, hand-written safe binding to the
//! system RocksDB through its C API) and [`MemStore`] (an in-memory
//! `BTreeMap`, for unit tests of the layers above).

mod ffi;
mod mem;
mod rocks;
#[cfg(test)]
mod tests;

use std::fmt;

pub use ffi::loaded_from as rocksdb_library;
pub use mem::MemStore;
pub use rocks::RocksStore;

/// Errors reported by a [`KvStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The store could not be opened (bad path, lock held, corruption...).
    Open(String),
    /// A read or write on an open store failed.
    Io(String),
    /// A layer above the store refused a write before anything reached
    /// the disk (a server's store of a set that moved away): nothing was
    /// lost, so nothing is poisoned for it.
    Refused(String),
}

impl KvError {
    /// Whether the store failed because its disk is full (so callers can
    /// answer ENOSPC instead of EIO).
    pub fn is_no_space(&self) -> bool {
        let (KvError::Open(m) | KvError::Io(m) | KvError::Refused(m)) = self;
        m.contains("No space left on device")
    }

    /// Whether the write was refused before it reached the store.
    pub fn is_refused(&self) -> bool {
        matches!(self, KvError::Refused(_))
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Open(msg) => write!(f, "kv store open failed: {msg}"),
            KvError::Io(msg) => write!(f, "kv store I/O error: {msg}"),
            KvError::Refused(msg) => write!(f, "kv store write refused: {msg}"),
        }
    }
}

impl std::error::Error for KvError {}

/// Result type of every [`KvStore`] operation.
pub type Result<T> = std::result::Result<T, KvError>;

/// A key-value store: RocksDB in production, MemStore in tests.
///
/// Keys and values are arbitrary byte strings (the empty string included);
/// keys are ordered bytewise.
pub trait KvStore: Send + Sync + 'static {
    /// The value stored under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Apply all operations atomically. `sync` = fsync the WAL before returning.
    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()>;
    /// Up to `limit` pairs with key >= start and key starting with `prefix`, in key order.
    fn scan(&self, prefix: &[u8], start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Make every write so far durable (fsync the WAL).
    fn sync_wal(&self) -> Result<()>;
    /// Call `f` on each pair with key >= start and key starting with
    /// `prefix`, in key order, until it returns false: a long scan without
    /// copying every pair (server-side find). The slices are valid only
    /// during the call.
    fn scan_visit(
        &self,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        const BATCH: usize = 1024;
        let mut from = start.to_vec();
        loop {
            let rows = self.scan(prefix, &from, BATCH)?;
            for (k, v) in &rows {
                if !f(k, v) {
                    return Ok(());
                }
            }
            match rows.last() {
                Some((k, _)) if rows.len() == BATCH => {
                    from = k.clone();
                    from.push(0); // the first key after it
                }
                _ => return Ok(()),
            }
        }
    }
}

/// One operation of a [`WriteBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// An ordered list of puts and deletes, applied atomically by
/// [`KvStore::write`]. Later operations on the same key win.
#[derive(Default, Clone, Debug)]
pub struct WriteBatch {
    ops: Vec<Op>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set `key` to `value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.ops.push(Op::Put(key.to_vec(), value.to_vec()));
    }

    /// Remove `key` (a no-op if it is absent).
    pub fn delete(&mut self, key: &[u8]) {
        self.ops.push(Op::Delete(key.to_vec()));
    }

    /// Add `other`'s operations after this batch's own: one batch that
    /// applies as the two would one after the other, atomically.
    pub fn append(&mut self, mut other: WriteBatch) {
        self.ops.append(&mut other.ops);
    }

    /// Number of operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The keys the batch puts or deletes, in order (a key may repeat): lets
    /// a layer above mirror some keys after the batch is applied.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.ops.iter().map(|op| match op {
            Op::Put(k, _) | Op::Delete(k) => k.as_slice(),
        })
    }

    pub(crate) fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The batch as bytes another process can `decode` and apply the same
    /// way (replication ships batches to a server's replicas): per
    /// operation a tag (1 put, 2 delete), the key's length and bytes, and
    /// for a put the value's length and bytes; lengths are u32 LE.
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self
            .ops
            .iter()
            .map(|op| match op {
                Op::Put(k, v) => 9 + k.len() + v.len(),
                Op::Delete(k) => 5 + k.len(),
            })
            .sum();
        let mut out = Vec::with_capacity(size);
        let field = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        for op in &self.ops {
            match op {
                Op::Put(k, v) => {
                    out.push(1);
                    field(&mut out, k);
                    field(&mut out, v);
                }
                Op::Delete(k) => {
                    out.push(2);
                    field(&mut out, k);
                }
            }
        }
        out
    }

    /// A batch `encode` made; None if `bytes` is not one.
    /// Bytes the puts of an encoded batch (`encode`) bring (their keys
    /// and values; deletes bring none), read without decoding it. None if
    /// it does not decode.
    pub fn encoded_put_bytes(mut bytes: &[u8]) -> Option<u64> {
        let skip = |b: &mut &[u8]| -> Option<u64> {
            let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
            *b = b.get(4 + len..)?;
            Some(len as u64)
        };
        let mut total = 0u64;
        while let Some((&tag, rest)) = bytes.split_first() {
            bytes = rest;
            match tag {
                1 => total += skip(&mut bytes)? + skip(&mut bytes)?,
                2 => {
                    skip(&mut bytes)?;
                }
                _ => return None,
            }
        }
        Some(total)
    }

    pub fn decode(mut bytes: &[u8]) -> Option<WriteBatch> {
        fn field<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
            let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
            let v = b.get(4..4 + len)?;
            *b = &b[4 + len..];
            Some(v)
        }
        let mut batch = WriteBatch::new();
        while let Some((&tag, rest)) = bytes.split_first() {
            bytes = rest;
            match tag {
                1 => {
                    let k = field(&mut bytes)?;
                    let v = field(&mut bytes)?;
                    batch.put(k, v);
                }
                2 => batch.delete(field(&mut bytes)?),
                _ => return None,
            }
        }
        Some(batch)
    }
}

/// Where a scan for `prefix` starting at `start` should begin:
/// the larger of the two, since no key below `prefix` can start with it.
pub(crate) fn scan_seek_key<'a>(prefix: &'a [u8], start: &'a [u8]) -> &'a [u8] {
    if start < prefix {
        prefix
    } else {
        start
    }
}
