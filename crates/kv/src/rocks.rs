//! [`RocksStore`]: the production [`KvStore`], a thin safe wrapper over the
//! system RocksDB (C API declared in `ffi.rs`).
//!
//! Ownership: a `RocksStore` owns the `rocksdb_t` handle plus the options
//! objects created at open (DB options, one read options, a sync and a
//! non-sync write options); all are released in `Drop`, the DB first.
//! Every per-call object (write batch, iterator, pinned value) is owned by a
//! small RAII guard so it is released on every path.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use libc::{c_char, c_void, size_t};

use crate::ffi;
use crate::{scan_seek_key, KvError, KvStore, Op, Result, WriteBatch};

/// Memtable budget handed to `optimize_level_style_compaction`.
const MEMTABLE_BUDGET: u64 = 64 << 20;
/// Background threads for flushes and compactions.
const PARALLELISM: libc::c_int = 2;
/// RocksDB's InfoLogLevel::ERROR_LEVEL.
const INFO_LOG_LEVEL_ERROR: std::os::raw::c_int = 3;
/// Bloom filter density for block-based tables.
const BLOOM_BITS_PER_KEY: f64 = 10.0;
/// A write-mostly store flushes its memtable before a read once it holds
/// more entries than this: a read of a vector memtable still being written
/// copies and sorts it whole, so this bounds what one read sorts (about
/// 0.1 ms) while a copy's stream of writes flushes only at its size.
const UNSORTED_ENTRIES_MAX: u64 = 1024;

/// A RocksDB database opened at a path on local disk.
pub struct RocksStore {
    db: *mut ffi::rocksdb_t,
    opts: *mut ffi::rocksdb_options_t,
    read_opts: *mut ffi::rocksdb_readoptions_t,
    write_opts: *mut ffi::rocksdb_writeoptions_t,
    write_opts_sync: *mut ffi::rocksdb_writeoptions_t,
    /// Opened by `open_write_mostly`: a vector memtable, bounded before
    /// each read (`bound_unsorted`).
    write_mostly: bool,
}

// SAFETY: RocksDB documents that a `DB` (wrapped by `rocksdb_t`) may be used
// concurrently from multiple threads without external synchronization
// ("A database may only be opened by one process at a time... Within a single
// process, the same rocksdb::DB object may be safely shared by multiple
// concurrent threads", RocksDB wiki "Basic Operations", Concurrency). The
// options objects are only read after `open` returns (never mutated), and
// const reads of Options/ReadOptions/WriteOptions are thread-safe. All
// per-call objects (batches, iterators) are created and destroyed within one
// call on one thread.
unsafe impl Send for RocksStore {}
// SAFETY: see `Send` above; `&RocksStore` only permits the thread-safe
// operations listed there.
unsafe impl Sync for RocksStore {}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore").finish_non_exhaustive()
    }
}

/// Out-parameter for RocksDB's `char** errptr` convention.
struct ErrPtr(*mut c_char);

impl ErrPtr {
    fn new() -> Self {
        ErrPtr(ptr::null_mut())
    }

    fn as_mut_ptr(&mut self) -> *mut *mut c_char {
        &mut self.0
    }

    /// Take the message RocksDB stored, if any, freeing RocksDB's copy.
    fn take(&mut self) -> Option<String> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: a non-null errptr was set by RocksDB to a NUL-terminated
        // string allocated with malloc (strdup); it stays valid until freed
        // below, and we null the field so it is never freed twice.
        let msg = unsafe { CStr::from_ptr(self.0) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: the pointer came from RocksDB's allocator and is freed once.
        unsafe { ffi::rocksdb_free(self.0.cast::<c_void>()) };
        self.0 = ptr::null_mut();
        Some(msg)
    }

    /// `Err(make(msg))` if RocksDB reported an error.
    fn check(mut self, make: fn(String) -> KvError) -> Result<()> {
        match self.take() {
            Some(msg) => Err(make(msg)),
            None => Ok(()),
        }
    }
}

impl Drop for ErrPtr {
    fn drop(&mut self) {
        let _ = self.take();
    }
}

/// Copy `len` bytes at `data` (as returned by RocksDB) into a `Vec`.
///
/// # Safety
/// If `len > 0`, `data` must be valid for reads of `len` bytes.
unsafe fn copy_bytes(data: *const c_char, len: size_t) -> Vec<u8> {
    if data.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: guaranteed by the caller; non-null and len > 0 checked above.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
}

fn c_ptr(bytes: &[u8]) -> *const c_char {
    bytes.as_ptr().cast::<c_char>()
}

/// Owns a `rocksdb_writebatch_t`.
struct Batch(*mut ffi::rocksdb_writebatch_t);

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: created by rocksdb_writebatch_create, destroyed only here.
        unsafe { ffi::rocksdb_writebatch_destroy(self.0) };
    }
}

/// Owns a `rocksdb_iterator_t`.
/// # Safety
/// `data` must be NULL or valid for `len` bytes for the chosen lifetime.
unsafe fn borrow_bytes<'a>(data: *const c_char, len: size_t) -> &'a [u8] {
    if data.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller; non-null and len > 0 checked above.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
}

struct Iter(*mut ffi::rocksdb_iterator_t);

impl Drop for Iter {
    fn drop(&mut self) {
        // SAFETY: created by rocksdb_create_iterator; the guard lives only
        // inside a `&self` method, so the DB is still open. Destroyed only here.
        unsafe { ffi::rocksdb_iter_destroy(self.0) };
    }
}

/// Owns a `rocksdb_pinnableslice_t`.
struct Pinned(*mut ffi::rocksdb_pinnableslice_t);

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: non-null result of rocksdb_get_pinned, destroyed only here.
        unsafe { ffi::rocksdb_pinnableslice_destroy(self.0) };
    }
}

impl RocksStore {
    /// Open (creating if missing) the RocksDB database in directory `path`.
    pub fn open(path: &Path) -> Result<RocksStore> {
        RocksStore::open_tuned(path, false)
    }

    /// Open a store that is written far more than read (a replica's copy,
    /// read only when opened and while a resync compares it). Its memtable
    /// is a vector, appended to and sorted once at flush, instead of a
    /// skip list sorted at every insert: on a replica that insert was most
    /// of the copy's CPU per create (docs/PERFORMANCE.md). A read first
    /// flushes a memtable past `UNSORTED_ENTRIES_MAX` entries. What is on
    /// disk is the same as `open`'s: either opens the other's files.
    pub fn open_write_mostly(path: &Path) -> Result<RocksStore> {
        RocksStore::open_tuned(path, true)
    }

    fn open_tuned(path: &Path, write_mostly: bool) -> Result<RocksStore> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| KvError::Open(format!("path contains a NUL byte: {}", path.display())))?;
        ffi::load().map_err(KvError::Open)?;

        // SAFETY: the *_create functions allocate fresh objects (never NULL;
        // they abort on OOM). They are stored in `store` immediately, whose
        // Drop destroys them on every exit path, including errors below.
        let mut store = unsafe {
            RocksStore {
                db: ptr::null_mut(),
                opts: ffi::rocksdb_options_create(),
                read_opts: ffi::rocksdb_readoptions_create(),
                write_opts: ffi::rocksdb_writeoptions_create(),
                write_opts_sync: ffi::rocksdb_writeoptions_create(),
                write_mostly,
            }
        };

        // SAFETY: all pointers are live objects owned by `store`, not yet
        // shared with any other thread. The filter policy's ownership passes
        // to the table options (held in a shared_ptr), and
        // set_block_based_table_factory copies the table options, so
        // destroying `table` afterwards is correct and leaks nothing.
        unsafe {
            ffi::rocksdb_options_set_create_if_missing(store.opts, 1);
            ffi::rocksdb_options_increase_parallelism(store.opts, PARALLELISM);
            // Only errors go to RocksDB's own LOG file, and few old ones are
            // kept: that file shares the data disk, and when the disk fills
            // a chatty LOG is what fails first.
            ffi::rocksdb_options_set_info_log_level(store.opts, INFO_LOG_LEVEL_ERROR);
            ffi::rocksdb_options_set_keep_log_file_num(store.opts, 2);
            ffi::rocksdb_options_optimize_level_style_compaction(store.opts, MEMTABLE_BUDGET);
            let table = ffi::rocksdb_block_based_options_create();
            let bloom = ffi::rocksdb_filterpolicy_create_bloom(BLOOM_BITS_PER_KEY);
            ffi::rocksdb_block_based_options_set_filter_policy(table, bloom);
            ffi::rocksdb_options_set_block_based_table_factory(store.opts, table);
            ffi::rocksdb_block_based_options_destroy(table);
            ffi::rocksdb_writeoptions_set_sync(store.write_opts, 0);
            ffi::rocksdb_writeoptions_set_sync(store.write_opts_sync, 1);
            if write_mostly {
                // A vector memtable takes one writer at a time.
                ffi::rocksdb_options_set_memtable_vector_rep(store.opts);
                ffi::rocksdb_options_set_allow_concurrent_memtable_write(store.opts, 0);
            }
        }

        let mut err = ErrPtr::new();
        // SAFETY: `opts` is a valid options object, `c_path` a NUL-terminated
        // string alive for the call, `err` a valid out-pointer holding NULL.
        let db = unsafe { ffi::rocksdb_open(store.opts, c_path.as_ptr(), err.as_mut_ptr()) };
        store.db = db;
        err.check(KvError::Open)?;
        if store.db.is_null() {
            return Err(KvError::Open(format!(
                "rocksdb_open returned no handle for {}",
                path.display()
            )));
        }
        Ok(store)
    }
}

impl RocksStore {
    /// Before a read of a write-mostly store: flush its memtable if it
    /// holds more than `UNSORTED_ENTRIES_MAX` entries, so that the read
    /// sorts at most that many.
    fn bound_unsorted(&self) -> Result<()> {
        if !self.write_mostly {
            return Ok(());
        }
        let mut entries: u64 = 0;
        // SAFETY: `db` is live for `&self`; the name is a NUL-terminated
        // static string; `entries` is a valid out-pointer.
        let known = unsafe {
            ffi::rocksdb_property_int(
                self.db,
                c"rocksdb.num-entries-active-mem-table".as_ptr(),
                &mut entries,
            )
        } == 0;
        if known && entries <= UNSORTED_ENTRIES_MAX {
            return Ok(());
        }
        // SAFETY: a fresh options object (never NULL), destroyed below
        // after the call that reads it.
        let opts = unsafe { ffi::rocksdb_flushoptions_create() };
        let mut err = ErrPtr::new();
        // SAFETY: `db` is live; `opts` is live until destroyed below; `err`
        // is a valid out-pointer holding NULL. The flush waits until done.
        unsafe {
            ffi::rocksdb_flushoptions_set_wait(opts, 1);
            ffi::rocksdb_flush(self.db, opts, err.as_mut_ptr());
            ffi::rocksdb_flushoptions_destroy(opts);
        }
        err.check(KvError::Io)
    }
}

impl KvStore for RocksStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.bound_unsorted()?;
        let mut err = ErrPtr::new();
        // SAFETY: `db` and `read_opts` are live for `&self`; `key` is valid for
        // `key.len()` bytes (a dangling-but-aligned pointer is fine for len 0);
        // `err` is a valid out-pointer holding NULL.
        let raw = unsafe {
            ffi::rocksdb_get_pinned(
                self.db,
                self.read_opts,
                c_ptr(key),
                key.len(),
                err.as_mut_ptr(),
            )
        };
        // Own the result before checking the error so it is always freed.
        let pinned = (!raw.is_null()).then_some(Pinned(raw));
        err.check(KvError::Io)?;
        let Some(pinned) = pinned else {
            return Ok(None); // NotFound
        };
        let mut len: size_t = 0;
        // SAFETY: `pinned.0` is a live pinnable slice; the returned pointer is
        // valid for `len` bytes until the slice is destroyed, which happens
        // after the copy (when `pinned` drops).
        let value = unsafe {
            let data = ffi::rocksdb_pinnableslice_value(pinned.0, &mut len);
            copy_bytes(data, len)
        };
        Ok(Some(value))
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<()> {
        // SAFETY: allocates a fresh batch (never NULL), owned by the guard.
        let wb = Batch(unsafe { ffi::rocksdb_writebatch_create() });
        for op in batch.ops() {
            match op {
                // SAFETY: `wb.0` is live; key/value slices are valid for their
                // lengths and RocksDB copies them into the batch.
                Op::Put(k, v) => unsafe {
                    ffi::rocksdb_writebatch_put(wb.0, c_ptr(k), k.len(), c_ptr(v), v.len())
                },
                // SAFETY: as above.
                Op::Delete(k) => unsafe { ffi::rocksdb_writebatch_delete(wb.0, c_ptr(k), k.len()) },
            }
        }
        let opts = if sync {
            self.write_opts_sync
        } else {
            self.write_opts
        };
        let mut err = ErrPtr::new();
        // SAFETY: `db`, `opts` and `wb.0` are live; `err` is a valid
        // out-pointer holding NULL. rocksdb_write does not retain the batch.
        unsafe { ffi::rocksdb_write(self.db, opts, wb.0, err.as_mut_ptr()) };
        err.check(KvError::Io)
    }

    fn scan(&self, prefix: &[u8], start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.bound_unsorted()?;
        // SAFETY: `db` and `read_opts` are live for `&self`; the iterator
        // (never NULL) is owned by the guard and destroyed before returning.
        let it = Iter(unsafe { ffi::rocksdb_create_iterator(self.db, self.read_opts) });
        let seek = scan_seek_key(prefix, start);
        // SAFETY: `it.0` is live; `seek` is valid for `seek.len()` bytes and is
        // copied by RocksDB.
        unsafe { ffi::rocksdb_iter_seek(it.0, c_ptr(seek), seek.len()) };
        while out.len() < limit {
            // SAFETY: `it.0` is live.
            if unsafe { ffi::rocksdb_iter_valid(it.0) } == 0 {
                break;
            }
            let (mut klen, mut vlen): (size_t, size_t) = (0, 0);
            // SAFETY: the iterator is valid (checked above), so key() and
            // value() return pointers valid for klen/vlen bytes until the next
            // iterator movement; both are copied before `iter_next`.
            let (key, value) = unsafe {
                let k = ffi::rocksdb_iter_key(it.0, &mut klen);
                let key = copy_bytes(k, klen);
                if !key.starts_with(prefix) {
                    break;
                }
                let v = ffi::rocksdb_iter_value(it.0, &mut vlen);
                (key, copy_bytes(v, vlen))
            };
            out.push((key, value));
            // SAFETY: `it.0` is live and valid.
            unsafe { ffi::rocksdb_iter_next(it.0) };
        }
        let mut err = ErrPtr::new();
        // SAFETY: `it.0` is live; `err` is a valid out-pointer holding NULL.
        unsafe { ffi::rocksdb_iter_get_error(it.0, err.as_mut_ptr()) };
        err.check(KvError::Io)?;
        Ok(out)
    }

    fn scan_visit(
        &self,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.bound_unsorted()?;
        // SAFETY: as in `scan`.
        let it = Iter(unsafe { ffi::rocksdb_create_iterator(self.db, self.read_opts) });
        let seek = scan_seek_key(prefix, start);
        // SAFETY: `it.0` is live; `seek` is copied by RocksDB.
        unsafe { ffi::rocksdb_iter_seek(it.0, c_ptr(seek), seek.len()) };
        loop {
            // SAFETY: `it.0` is live.
            if unsafe { ffi::rocksdb_iter_valid(it.0) } == 0 {
                break;
            }
            let (mut klen, mut vlen): (size_t, size_t) = (0, 0);
            // SAFETY: the iterator is valid (checked above), so key() and
            // value() return pointers valid for klen/vlen bytes until the next
            // iterator movement; the slices are used only by `f`, before
            // `iter_next`, and `f` cannot keep them (their lifetime ends with
            // the call).
            let go = unsafe {
                let k = ffi::rocksdb_iter_key(it.0, &mut klen);
                let key = borrow_bytes(k, klen);
                if !key.starts_with(prefix) {
                    break;
                }
                let v = ffi::rocksdb_iter_value(it.0, &mut vlen);
                f(key, borrow_bytes(v, vlen))
            };
            if !go {
                break;
            }
            // SAFETY: `it.0` is live and valid.
            unsafe { ffi::rocksdb_iter_next(it.0) };
        }
        let mut err = ErrPtr::new();
        // SAFETY: `it.0` is live; `err` is a valid out-pointer holding NULL.
        unsafe { ffi::rocksdb_iter_get_error(it.0, err.as_mut_ptr()) };
        err.check(KvError::Io)
    }

    fn sync_wal(&self) -> Result<()> {
        let mut err = ErrPtr::new();
        // SAFETY: `db` is live for `&self`; `err` is a valid out-pointer
        // holding NULL.
        unsafe { ffi::rocksdb_flush_wal(self.db, 1, err.as_mut_ptr()) };
        err.check(KvError::Io)
    }
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        // SAFETY: we own every handle exclusively (`&mut self`), each was
        // created once in `open` and is destroyed exactly once here. The DB
        // is closed first since it may still reference its options.
        unsafe {
            if !self.db.is_null() {
                ffi::rocksdb_close(self.db);
            }
            ffi::rocksdb_options_destroy(self.opts);
            ffi::rocksdb_readoptions_destroy(self.read_opts);
            ffi::rocksdb_writeoptions_destroy(self.write_opts);
            ffi::rocksdb_writeoptions_destroy(self.write_opts_sync);
        }
    }
}
