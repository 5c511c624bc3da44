//! Compact little-endian binary encoding of message fields. The decoder
//! checks every length against what is left (and against its limit) before
//! it allocates, so a hostile length prefix cannot make it reserve memory.

use crate::error::ProtoError;
use madfs_types::{limits, Attr, Credentials, FileKind, FileName, InodeId, TimeSet, Timestamp};

#[derive(Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder {
            buf: Vec::with_capacity(128),
        }
    }

    pub fn with_buffer(buf: Vec<u8>) -> Encoder {
        Encoder { buf }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn raw(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// Bytes with a u16 length prefix. Callers keep them under 64 KiB.
    pub fn bytes16(&mut self, v: &[u8]) {
        debug_assert!(v.len() <= u16::MAX as usize);
        self.u16(v.len() as u16);
        self.raw(v);
    }
    pub fn str16(&mut self, v: &str) {
        let mut end = v.len().min(u16::MAX as usize);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes16(&v.as_bytes()[..end]);
    }
    pub fn ino(&mut self, v: InodeId) {
        self.u64(v.0);
    }
    pub fn name(&mut self, v: &FileName) {
        self.u8(v.as_bytes().len() as u8);
        self.raw(v.as_bytes());
    }
    pub fn kind(&mut self, v: FileKind) {
        self.u8(v as u8);
    }
    pub fn ts(&mut self, v: Timestamp) {
        self.i64(v.secs);
        self.u32(v.nanos);
    }
    pub fn time_set(&mut self, v: TimeSet) {
        match v {
            TimeSet::Omit => self.u8(0),
            TimeSet::Now => self.u8(1),
            TimeSet::At(t) => {
                self.u8(2);
                self.ts(t);
            }
        }
    }
    pub fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u32(x);
            }
        }
    }
    pub fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
    pub fn creds(&mut self, v: &Credentials) {
        self.u32(v.uid);
        self.u32(v.gid);
        let n = v.groups.len().min(limits::GROUPS_MAX);
        self.u8(n as u8);
        for g in &v.groups[..n] {
            self.u32(*g);
        }
    }
    /// Attributes on the wire (and in the inode record, version 2).
    pub fn attr(&mut self, a: &Attr) {
        self.attr_without_rdev(a);
        self.u32(a.rdev);
    }

    /// Attributes as version 1 of the inode record stored them, before
    /// device numbers (kept so that tests can write such records).
    pub fn attr_without_rdev(&mut self, a: &Attr) {
        self.ino(a.ino);
        self.kind(a.kind);
        self.u32(a.perm);
        self.u32(a.nlink);
        self.u32(a.uid);
        self.u32(a.gid);
        self.u64(a.size);
        self.ts(a.atime);
        self.ts(a.mtime);
        self.ts(a.ctime);
        self.ts(a.btime);
    }
}

pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A list's entry count `n` (already read), refused when over `max`
    /// (`what` names the list) or when the rest of the body cannot hold
    /// that many entries of at least `min_bytes` each: checked before any
    /// memory is reserved for them.
    pub fn list_len(
        &self,
        n: usize,
        max: usize,
        min_bytes: usize,
        what: &'static str,
    ) -> Result<usize, ProtoError> {
        if n > max {
            return Err(ProtoError::BadValue(what));
        }
        if n.saturating_mul(min_bytes) > self.remaining() {
            return Err(ProtoError::Truncated);
        }
        Ok(n)
    }

    /// Succeeds only if every byte was consumed.
    pub fn finish(&self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(ProtoError::TrailingBytes(n)),
        }
    }

    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.remaining() < n {
            return Err(ProtoError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.raw(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.raw(1)?[0])
    }
    pub fn bool(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::BadValue("bool")),
        }
    }
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn i32(&mut self) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    pub fn fixed32(&mut self) -> Result<[u8; 32], ProtoError> {
        self.array()
    }
    /// u16-prefixed bytes, refused if longer than `max`.
    pub fn bytes16(&mut self, max: usize, what: &'static str) -> Result<Vec<u8>, ProtoError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtoError::BadValue(what));
        }
        Ok(self.raw(n)?.to_vec())
    }
    pub fn str16(&mut self, max: usize, what: &'static str) -> Result<String, ProtoError> {
        let b = self.bytes16(max, what)?;
        String::from_utf8(b).map_err(|_| ProtoError::BadValue(what))
    }
    pub fn ino(&mut self) -> Result<InodeId, ProtoError> {
        Ok(InodeId(self.u64()?))
    }
    pub fn name(&mut self) -> Result<FileName, ProtoError> {
        let n = self.u8()? as usize;
        FileName::new(self.raw(n)?).map_err(|_| ProtoError::BadValue("file name"))
    }
    pub fn kind(&mut self) -> Result<FileKind, ProtoError> {
        FileKind::from_u8(self.u8()?).ok_or(ProtoError::BadValue("file kind"))
    }
    pub fn ts(&mut self) -> Result<Timestamp, ProtoError> {
        let secs = self.i64()?;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(ProtoError::BadValue("timestamp nanoseconds"));
        }
        Ok(Timestamp { secs, nanos })
    }
    pub fn time_set(&mut self) -> Result<TimeSet, ProtoError> {
        match self.u8()? {
            0 => Ok(TimeSet::Omit),
            1 => Ok(TimeSet::Now),
            2 => Ok(TimeSet::At(self.ts()?)),
            _ => Err(ProtoError::BadValue("time set")),
        }
    }
    pub fn opt_u32(&mut self) -> Result<Option<u32>, ProtoError> {
        Ok(if self.bool()? {
            Some(self.u32()?)
        } else {
            None
        })
    }
    pub fn opt_u64(&mut self) -> Result<Option<u64>, ProtoError> {
        Ok(if self.bool()? {
            Some(self.u64()?)
        } else {
            None
        })
    }
    pub fn creds(&mut self) -> Result<Credentials, ProtoError> {
        let uid = self.u32()?;
        let gid = self.u32()?;
        let n = self.u8()? as usize;
        if n > limits::GROUPS_MAX {
            return Err(ProtoError::BadValue("group count"));
        }
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            groups.push(self.u32()?);
        }
        Ok(Credentials { uid, gid, groups })
    }
    pub fn attr(&mut self) -> Result<Attr, ProtoError> {
        let mut a = self.attr_without_rdev()?;
        a.rdev = self.u32()?;
        Ok(a)
    }

    /// Attributes as version 1 of the inode record stored them: no device
    /// number (read as 0).
    pub fn attr_without_rdev(&mut self) -> Result<Attr, ProtoError> {
        Ok(Attr {
            ino: self.ino()?,
            kind: self.kind()?,
            perm: self.u32()? & 0o7777,
            nlink: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            size: self.u64()?,
            atime: self.ts()?,
            mtime: self.ts()?,
            ctime: self.ts()?,
            btime: self.ts()?,
            rdev: 0,
        })
    }
}
