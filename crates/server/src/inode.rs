//! The inode record as stored in RocksDB, and the dentry value. Records
//! start with a version byte so a later format can read (and migrate) older
//! ones.

use madfs_proto::codec::{Decoder, Encoder};
use madfs_proto::ProtoError;
use madfs_types::{limits, Attr, FileKind, InodeId, Timestamp};

/// Version 2 added the device number (`Attr::rdev`) after the attributes;
/// version 1 records (written before FIFOs and devices existed) are read
/// with rdev 0, and rewritten as version 2 at their next change.
const RECORD_VERSION: u8 = 2;
const RECORD_VERSION_NO_RDEV: u8 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    /// Chunk 0 lives in a chunk file instead of inline in DATA (it outgrew
    /// INLINE_DATA_MAX_BYTES once).
    pub chunk0_in_file: bool,
    /// Symlink target (empty for other kinds).
    pub target: Vec<u8>,
}

impl Inode {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u8(RECORD_VERSION);
        e.attr(&self.attr);
        e.bool(self.chunk0_in_file);
        e.bytes16(&self.target);
        e.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Inode, ProtoError> {
        let mut d = Decoder::new(bytes);
        let attr = match d.u8()? {
            RECORD_VERSION => d.attr()?,
            RECORD_VERSION_NO_RDEV => d.attr_without_rdev()?,
            _ => return Err(ProtoError::BadValue("inode record version")),
        };
        let inode = Inode {
            attr,
            chunk0_in_file: d.bool()?,
            target: d.bytes16(limits::SYMLINK_MAX_BYTES, "symlink target")?,
        };
        d.finish()?;
        Ok(inode)
    }

    pub fn new(
        ino: InodeId,
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        target: Vec<u8>,
    ) -> Inode {
        let now = Timestamp::now();
        Inode {
            attr: Attr {
                ino,
                kind,
                perm: perm & 0o7777,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                uid,
                gid,
                size: if kind == FileKind::Symlink {
                    target.len() as u64
                } else {
                    0
                },
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                rdev: 0,
            },
            chunk0_in_file: false,
            target,
        }
    }

    /// Whether chunk files may exist for this inode anywhere in the cluster.
    pub fn may_have_chunk_files(&self, chunk_size: u64) -> bool {
        self.chunk0_in_file || self.attr.size > chunk_size
    }
}

/// The value of a dentry: what the name points to.
pub fn encode_dentry(kind: FileKind, ino: InodeId) -> Vec<u8> {
    let mut v = Vec::with_capacity(9);
    v.push(kind as u8);
    v.extend_from_slice(&ino.0.to_le_bytes());
    v
}

pub fn decode_dentry(v: &[u8]) -> Option<(FileKind, InodeId)> {
    if v.len() != 9 {
        return None;
    }
    let kind = FileKind::from_u8(v[0])?;
    let ino = u64::from_le_bytes(v[1..9].try_into().ok()?);
    Some((kind, InodeId(ino)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let mut i = Inode::new(InodeId(9), FileKind::Symlink, 0o777, 1, 2, b"/t".to_vec());
        i.chunk0_in_file = true;
        assert_eq!(Inode::decode(&i.encode()).unwrap(), i);
        assert_eq!(i.attr.size, 2);
        assert!(Inode::decode(&i.encode()[1..]).is_err());
        assert_eq!(
            decode_dentry(&encode_dentry(FileKind::Dir, InodeId(3))),
            Some((FileKind::Dir, InodeId(3)))
        );
        assert_eq!(decode_dentry(&[9; 9]), None);
        let mut dev = Inode::new(InodeId(10), FileKind::CharDev, 0o620, 0, 5, Vec::new());
        dev.attr.rdev = (136 << 8) | 3;
        assert_eq!(Inode::decode(&dev.encode()).unwrap(), dev);
    }

    /// Records written before device numbers (version 1) still read, as
    /// rdev 0: a server upgraded in place keeps every inode.
    #[test]
    fn version_1_records_still_read() {
        let i = Inode::new(InodeId(9), FileKind::File, 0o644, 1, 2, Vec::new());
        let mut e = Encoder::new();
        e.u8(RECORD_VERSION_NO_RDEV);
        e.attr_without_rdev(&i.attr);
        e.bool(false);
        e.bytes16(b"");
        assert_eq!(Inode::decode(&e.into_bytes()).unwrap(), i);
    }
}
