//! Build script for madfs-kv: link the system RocksDB shared library
//! (Debian `librocksdb-dev`), whose C API `src/ffi.rs` declares by hand.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-lib=dylib=rocksdb");
}
