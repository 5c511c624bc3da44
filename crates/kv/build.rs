//! Build script for madfs-kv: find the file name (soname) of the system
//! RocksDB library (Debian `librocksdb-dev`) that src/ffi.rs loads at run
//! time, so the binary asks for the version its declarations were written
//! against.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/librocksdb.so",
        "/usr/lib/aarch64-linux-gnu/librocksdb.so",
        "/usr/lib/librocksdb.so",
        "/usr/local/lib/librocksdb.so",
    ];
    // The development link points at the versioned library; its name up
    // to the minor version is the soname (librocksdb.so.7.8.3 -> .so.7.8).
    let soname = candidates
        .iter()
        .filter_map(|c| std::fs::canonicalize(c).ok())
        .filter_map(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.to_string())
        })
        .map(|name| {
            let parts: Vec<&str> = name.split('.').collect();
            // "librocksdb", "so", major, minor, patch
            if parts.len() >= 4 {
                parts[..4].join(".")
            } else {
                name
            }
        })
        .next()
        .unwrap_or_else(|| "librocksdb.so".to_string());
    for c in candidates {
        if Path::new(c).exists() {
            println!("cargo:rerun-if-changed={c}");
        }
    }
    println!("cargo:rustc-env=MADFS_ROCKSDB_SONAME={soname}");
}
