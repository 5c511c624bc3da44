//! RocksDB's C API (`/usr/include/rocksdb/c.h`, RocksDB 7.8): the small
//! subset `RocksStore` uses, declared by hand, and loaded with dlopen the
//! first time a store is opened (Debian's library, or the one
//! `MADFS_ROCKSDB_LIB` names: `load`).
//!
//! Why loaded, not linked: only `madfs server` opens a store, but every
//! `madfs` process (each CLI command, `madfs run`'s launcher, the external
//! find io500 starts for every find phase, the mount daemon) paid about
//! 5 ms of CPU and 10 ms of wall time at start to bind RocksDB's C++ library
//! when it was linked (docs/PERFORMANCE.md). Now only a server pays it, once.
//!
//! All handle types are opaque: Rust only ever holds pointers to them.
//! Conventions of the C API relied upon by callers:
//! - `errptr` must point to a NULL `char*`; on failure RocksDB stores a
//!   `malloc`ed NUL-terminated message there, to be released with
//!   [`rocksdb_free`].
//! - `*_create` functions never return NULL (they `new` and abort on OOM).

use libc::{c_char, c_double, c_int, c_uchar, c_void, size_t};
use std::sync::OnceLock;

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
    rocksdb_flushoptions_t,
);

/// The library's file name: the one this crate was built against (its
/// soname, found by build.rs), then the unversioned development link.
const LIBRARY_NAMES: &[&str] = &[env!("MADFS_ROCKSDB_SONAME"), "librocksdb.so"];

/// Declare the C functions: a table of pointers filled by `load`, and a
/// function of the same name and signature for each, calling through it.
macro_rules! c_api {
    ($( $(#[$doc:meta])* pub fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*) => {
        #[allow(non_snake_case)]
        struct Api {
            $( $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
            /// Keeps the library mapped (it is never unloaded).
            _library: libloading::Library,
        }

        fn resolve(library: libloading::Library) -> Result<Api, String> {
            // SAFETY: each symbol is looked up by its C name and given the
            // signature c.h declares for it; the pointers stay valid while
            // `_library` is loaded, which is for the life of the process.
            unsafe {
                Ok(Api {
                    $( $name: *library
                        .get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                        .map_err(|e| format!("{}: {e}", stringify!($name)))?, )*
                    _library: library,
                })
            }
        }

        $(
            $(#[$doc])*
            /// # Safety
            /// As the C function of the same name; a store must have been
            /// opened (so the library is loaded).
            pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the caller's contract is the C function's.
                unsafe { (api().$name)($($arg),*) }
            }
        )*
    };
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// Environment variable naming the RocksDB library to load instead of the
/// system's: Debian's is built with assertions on (it imports
/// `__assert_fail` and runs RocksDB's test sync points), and the RocksDB
/// project's release build (scripts/fetch-rocksdb) took 10-35% less server
/// CPU per create (docs/PERFORMANCE.md). Any RocksDB from 7.8 on has the
/// functions declared here.
pub const LIBRARY_ENV: &str = "MADFS_ROCKSDB_LIB";

/// File name a library shipped beside the `madfs` executable has.
const BESIDE_EXECUTABLE: &str = "librocksdb.so";

/// The libraries to try, in order: the one `MADFS_ROCKSDB_LIB` names
/// (alone: a library asked for by name is never silently replaced by
/// another), else one beside the executable, then the system's.
fn candidates(
    named: Option<std::ffi::OsString>,
    executable: Option<std::path::PathBuf>,
) -> Vec<std::ffi::OsString> {
    if let Some(path) = named.filter(|p| !p.is_empty()) {
        return vec![path];
    }
    let beside = executable
        .and_then(|e| e.parent().map(|d| d.join(BESIDE_EXECUTABLE)))
        .filter(|p| p.is_file());
    beside
        .into_iter()
        .map(Into::into)
        .chain(LIBRARY_NAMES.iter().map(Into::into))
        .collect()
}

/// Load RocksDB (once per process): Ok when every function was found.
pub fn load() -> Result<(), String> {
    API.get_or_init(|| {
        let names = candidates(std::env::var_os(LIBRARY_ENV), std::env::current_exe().ok());
        let mut errors = Vec::new();
        for name in &names {
            // SAFETY: loading RocksDB runs its C++ static constructors, which
            // have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => {
                    LOADED_FROM.get_or_init(|| name.to_string_lossy().into_owned());
                    return resolve(library);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        let tried: Vec<_> = names.iter().map(|n| n.to_string_lossy()).collect();
        Err(format!(
            "cannot load RocksDB ({}; install Debian's librocksdb-dev, or librocksdb7.8, \
             or name a library in {LIBRARY_ENV}): {}",
            tried.join(" or "),
            errors.join("; ")
        ))
    })
    .as_ref()
    .map(|_| ())
    .map_err(Clone::clone)
}

static LOADED_FROM: OnceLock<String> = OnceLock::new();

/// The library `load` loaded (the name it was asked for by), if it did.
pub fn loaded_from() -> Option<&'static str> {
    LOADED_FROM.get().map(String::as_str)
}

fn api() -> &'static Api {
    match API.get() {
        Some(Ok(api)) => api,
        // Every caller holds a store, and a store is opened only after
        // `load` succeeded: reaching here is a bug, not an input error.
        _ => panic!("RocksDB called before it was loaded"),
    }
}

c_api! {
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
    pub fn rocksdb_flush(
        db: *mut rocksdb_t,
        options: *const rocksdb_flushoptions_t,
        errptr: *mut *mut c_char,
    );
    /// 0 and `*out_val` set when the property exists and is a number.
    pub fn rocksdb_property_int(
        db: *mut rocksdb_t,
        propname: *const c_char,
        out_val: *mut u64,
    ) -> c_int;
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
    /// The memtable becomes a vector: appended to, sorted when read or
    /// flushed. Needs `allow_concurrent_memtable_write` off.
    pub fn rocksdb_options_set_memtable_vector_rep(opt: *mut rocksdb_options_t);
    pub fn rocksdb_options_set_allow_concurrent_memtable_write(
        opt: *mut rocksdb_options_t,
        v: c_uchar,
    );
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

    pub fn rocksdb_flushoptions_create() -> *mut rocksdb_flushoptions_t;
    pub fn rocksdb_flushoptions_destroy(opt: *mut rocksdb_flushoptions_t);
    pub fn rocksdb_flushoptions_set_wait(opt: *mut rocksdb_flushoptions_t, v: c_uchar);

    pub fn rocksdb_writeoptions_create() -> *mut rocksdb_writeoptions_t;
    pub fn rocksdb_writeoptions_destroy(opt: *mut rocksdb_writeoptions_t);
    pub fn rocksdb_writeoptions_set_sync(opt: *mut rocksdb_writeoptions_t, v: c_uchar);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_library_is_the_only_one_tried_else_beside_the_executable_then_the_system() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("madfs");
        let system: Vec<std::ffi::OsString> = LIBRARY_NAMES.iter().map(Into::into).collect();
        assert_eq!(
            candidates(Some("/opt/r/librocksdb.so.10".into()), Some(exe.clone())),
            vec![std::ffi::OsString::from("/opt/r/librocksdb.so.10")]
        );
        // Empty counts as unset; nothing beside the executable yet.
        assert_eq!(candidates(Some("".into()), Some(exe.clone())), system);
        assert_eq!(candidates(None, None), system);
        std::fs::write(dir.path().join(BESIDE_EXECUTABLE), b"").unwrap();
        let mut beside = vec![dir.path().join(BESIDE_EXECUTABLE).into_os_string()];
        beside.extend(system);
        assert_eq!(candidates(None, Some(exe)), beside);
    }
}
