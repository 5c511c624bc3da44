//! Hand-written `extern "C"` declarations for the small subset of RocksDB's
//! C API (`/usr/include/rocksdb/c.h`, RocksDB 7.8) that `RocksStore` uses.
//!
//! All handle types are opaque: Rust only ever holds pointers to them.
//! Conventions of the C API relied upon by callers:
//! - `errptr` must point to a NULL `char*`; on failure RocksDB stores a
//!   `malloc`ed NUL-terminated message there, to be released with
//!   [`rocksdb_free`].
//! - `*_create` functions never return NULL (they `new` and abort on OOM).

use libc::{c_char, c_double, c_int, c_uchar, c_void, size_t};

macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            pub struct $name {
                _data: [u8; 0],
                // Not Send/Sync/Unpin by default; thread-safety is asserted
                // explicitly where RocksDB documents it.
                _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
            }
        )*
    };
}

opaque!(
    rocksdb_t,
    rocksdb_options_t,
    rocksdb_readoptions_t,
    rocksdb_writeoptions_t,
    rocksdb_writebatch_t,
    rocksdb_iterator_t,
    rocksdb_pinnableslice_t,
    rocksdb_block_based_table_options_t,
    rocksdb_filterpolicy_t,
);

extern "C" {
    // --- database ---------------------------------------------------------
    pub fn rocksdb_open(
        options: *const rocksdb_options_t,
        name: *const c_char,
        errptr: *mut *mut c_char,
    ) -> *mut rocksdb_t;
    pub fn rocksdb_close(db: *mut rocksdb_t);
    pub fn rocksdb_write(
        db: *mut rocksdb_t,
        options: *const rocksdb_writeoptions_t,
        batch: *mut rocksdb_writebatch_t,
        errptr: *mut *mut c_char,
    );
    pub fn rocksdb_get_pinned(
        db: *mut rocksdb_t,
        options: *const rocksdb_readoptions_t,
        key: *const c_char,
        keylen: size_t,
        errptr: *mut *mut c_char,
    ) -> *mut rocksdb_pinnableslice_t;
    pub fn rocksdb_flush_wal(db: *mut rocksdb_t, sync: c_uchar, errptr: *mut *mut c_char);
    pub fn rocksdb_create_iterator(
        db: *mut rocksdb_t,
        options: *const rocksdb_readoptions_t,
    ) -> *mut rocksdb_iterator_t;
    pub fn rocksdb_free(ptr: *mut c_void);

    // --- pinnable slice (result of get) -----------------------------------
    pub fn rocksdb_pinnableslice_destroy(v: *mut rocksdb_pinnableslice_t);
    pub fn rocksdb_pinnableslice_value(
        t: *const rocksdb_pinnableslice_t,
        vlen: *mut size_t,
    ) -> *const c_char;

    // --- iterator ---------------------------------------------------------
    pub fn rocksdb_iter_destroy(it: *mut rocksdb_iterator_t);
    pub fn rocksdb_iter_valid(it: *const rocksdb_iterator_t) -> c_uchar;
    pub fn rocksdb_iter_seek(it: *mut rocksdb_iterator_t, k: *const c_char, klen: size_t);
    pub fn rocksdb_iter_next(it: *mut rocksdb_iterator_t);
    pub fn rocksdb_iter_key(it: *const rocksdb_iterator_t, klen: *mut size_t) -> *const c_char;
    pub fn rocksdb_iter_value(it: *const rocksdb_iterator_t, vlen: *mut size_t) -> *const c_char;
    pub fn rocksdb_iter_get_error(it: *const rocksdb_iterator_t, errptr: *mut *mut c_char);

    // --- write batch ------------------------------------------------------
    pub fn rocksdb_writebatch_create() -> *mut rocksdb_writebatch_t;
    pub fn rocksdb_writebatch_destroy(b: *mut rocksdb_writebatch_t);
    pub fn rocksdb_writebatch_put(
        b: *mut rocksdb_writebatch_t,
        key: *const c_char,
        klen: size_t,
        val: *const c_char,
        vlen: size_t,
    );
    pub fn rocksdb_writebatch_delete(
        b: *mut rocksdb_writebatch_t,
        key: *const c_char,
        klen: size_t,
    );

    // --- options ----------------------------------------------------------
    pub fn rocksdb_options_create() -> *mut rocksdb_options_t;
    pub fn rocksdb_options_destroy(opt: *mut rocksdb_options_t);
    pub fn rocksdb_options_set_create_if_missing(opt: *mut rocksdb_options_t, v: c_uchar);
    pub fn rocksdb_options_increase_parallelism(opt: *mut rocksdb_options_t, total_threads: c_int);
    pub fn rocksdb_options_set_info_log_level(opt: *mut rocksdb_options_t, level: c_int);
    pub fn rocksdb_options_set_keep_log_file_num(opt: *mut rocksdb_options_t, n: usize);
    pub fn rocksdb_options_optimize_level_style_compaction(
        opt: *mut rocksdb_options_t,
        memtable_memory_budget: u64,
    );
    /// Copies `table_options` into a new table factory; the caller still owns
    /// (and must destroy) `table_options`.
    pub fn rocksdb_options_set_block_based_table_factory(
        opt: *mut rocksdb_options_t,
        table_options: *mut rocksdb_block_based_table_options_t,
    );

    pub fn rocksdb_block_based_options_create() -> *mut rocksdb_block_based_table_options_t;
    pub fn rocksdb_block_based_options_destroy(options: *mut rocksdb_block_based_table_options_t);
    /// Takes ownership of `filter_policy` (stored in a `shared_ptr`).
    pub fn rocksdb_block_based_options_set_filter_policy(
        options: *mut rocksdb_block_based_table_options_t,
        filter_policy: *mut rocksdb_filterpolicy_t,
    );
    pub fn rocksdb_filterpolicy_create_bloom(bits_per_key: c_double)
        -> *mut rocksdb_filterpolicy_t;

    pub fn rocksdb_readoptions_create() -> *mut rocksdb_readoptions_t;
    pub fn rocksdb_readoptions_destroy(opt: *mut rocksdb_readoptions_t);

    pub fn rocksdb_writeoptions_create() -> *mut rocksdb_writeoptions_t;
    pub fn rocksdb_writeoptions_destroy(opt: *mut rocksdb_writeoptions_t);
    pub fn rocksdb_writeoptions_set_sync(opt: *mut rocksdb_writeoptions_t, v: c_uchar);
}
