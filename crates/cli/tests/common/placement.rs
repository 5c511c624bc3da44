//! Where names land: file names chosen for the replica set that keeps
//! them, so a test can kill exactly the servers of one set. Shared by the
//! tests on loopback (through common/mod.rs) and multihost.rs.
#![allow(dead_code)]

/// A name in the root directory whose entry (and, for a small file, data)
/// the replica set `set` of a cluster of `servers` keeps: `tag` and the
/// first number that hashes there.
pub fn name_on(set: u16, servers: usize, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}{i}"))
        .find(|n| {
            let name = madfs_types::FileName::new(n.as_bytes()).unwrap();
            madfs_types::dentry_server(madfs_types::InodeId::ROOT, &name, servers)
                == madfs_types::ServerId(set)
        })
        .unwrap()
}
