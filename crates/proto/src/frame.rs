//! The fixed 32-byte frame header that precedes every message.
//!
//! Layout (little-endian):
//! ```text
//!  0..4   magic "MDFS"
//!  4      version
//!  5      flags (bit 0: response)
//!  6..8   opcode
//!  8..16  request id
//! 16..20  body length   (compact binary message, <= BODY_MAX_BYTES)
//! 20..24  data length   (raw bulk bytes after the body, <= DATA_MAX_BYTES)
//! 24..26  status        (0 = ok, else an ErrorCode; responses only)
//! 26..28  reserved, zero
//! 28..32  CRC32C of bytes 0..28 followed by the body
//! ```
//! Bulk data is not covered by the checksum: TCP already checksums it and
//! hashing every byte twice would cost more than the disk write. The header
//! and body are, since a corrupt length or inode number would do damage.

use crate::error::{ErrorCode, ProtoError};
use madfs_types::{limits, RequestId};

pub const FRAME_HEADER_BYTES: usize = 32;
pub const MAGIC: u32 = u32::from_le_bytes(*b"MDFS");
/// Bumped when an encoding changes, so that a client and a server of
/// different versions refuse each other with a clear reason instead of
/// misreading fields. 2: attributes carry `rdev`, SetAttr carries
/// `via_writable_handle` (and Mknod exists). 3: Remove, Rename,
/// AdjustLinks and RenameInstall carry what the client holds open, Removed
/// and Installed whether the inode was held (and Release exists). 4:
/// replies of namespace changes carry touch tokens, GetAttr carries the
/// touches to wait for, FsStats carries why a server failed (a store
/// poisoned by a failed fsync). 5: ReplicaApply between servers. 6: map
/// addresses (a replacement at a new address). 7: requests carry an
/// `OpId` for those that must run once. 8: Seal carries the removed name
/// (and settles lapsed seals), Routes carries the membership voters. 9:
/// FsStats carries its disk, reserve and copies, and a rebuild why its
/// last attempt failed. 10: Routes carries the sets with no live copy.
pub const PROTOCOL_VERSION: u8 = 10;
/// Largest message body: a full readdir page of long names fits.
pub const BODY_MAX_BYTES: u32 = 2 * 1024 * 1024;
/// Largest bulk payload: one whole chunk at the largest chunk size.
pub const DATA_MAX_BYTES: u32 = limits::CHUNK_SIZE_MAX_BYTES as u32;

const FLAG_RESPONSE: u8 = 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FrameHeader {
    pub is_response: bool,
    pub opcode: u16,
    pub request_id: RequestId,
    pub body_len: u32,
    pub data_len: u32,
    /// 0 for success, otherwise an `ErrorCode` (then the body is a message).
    pub status: u16,
    pub checksum: u32,
}

impl FrameHeader {
    /// Serialize the header, computing the checksum over it and `body`.
    pub fn encode(&self, body: &[u8]) -> [u8; FRAME_HEADER_BYTES] {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = PROTOCOL_VERSION;
        h[5] = if self.is_response { FLAG_RESPONSE } else { 0 };
        h[6..8].copy_from_slice(&self.opcode.to_le_bytes());
        h[8..16].copy_from_slice(&self.request_id.0.to_le_bytes());
        h[16..20].copy_from_slice(&(body.len() as u32).to_le_bytes());
        h[20..24].copy_from_slice(&self.data_len.to_le_bytes());
        h[24..26].copy_from_slice(&self.status.to_le_bytes());
        let crc = checksum(&h[0..28], body);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parse and bound-check a header. The checksum is verified later, by
    /// `verify_body`, once the body has been read.
    pub fn decode(h: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, ProtoError> {
        let word = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&h[r]);
            u32::from_le_bytes(a)
        };
        let magic = word(0..4);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        if h[4] != PROTOCOL_VERSION {
            return Err(ProtoError::BadVersion(h[4]));
        }
        if h[5] & !FLAG_RESPONSE != 0 || h[26] != 0 || h[27] != 0 {
            return Err(ProtoError::BadValue("frame flags"));
        }
        let body_len = word(16..20);
        if body_len > BODY_MAX_BYTES {
            return Err(ProtoError::BodyTooLong(body_len));
        }
        let data_len = word(20..24);
        if data_len > DATA_MAX_BYTES {
            return Err(ProtoError::DataTooLong(data_len));
        }
        let status = u16::from_le_bytes([h[24], h[25]]);
        if status != 0 && ErrorCode::from_u16(status).is_none() {
            return Err(ProtoError::UnknownErrorCode(status));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[8..16]);
        Ok(FrameHeader {
            is_response: h[5] & FLAG_RESPONSE != 0,
            opcode: u16::from_le_bytes([h[6], h[7]]),
            request_id: RequestId(u64::from_le_bytes(id)),
            body_len,
            data_len,
            status,
            checksum: word(28..32),
        })
    }

    /// Check the checksum against the raw header bytes and the body.
    pub fn verify_body(
        &self,
        raw_header: &[u8; FRAME_HEADER_BYTES],
        body: &[u8],
    ) -> Result<(), ProtoError> {
        let actual = checksum(&raw_header[0..28], body);
        if actual != self.checksum {
            return Err(ProtoError::BadChecksum {
                expected: self.checksum,
                actual,
            });
        }
        Ok(())
    }
}

fn checksum(header: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), body)
}

/// Decode a whole frame held in memory (header, body, data): used by tests
/// and the fuzzer; the transport reads the three parts separately.
pub fn decode_frame(bytes: &[u8]) -> Result<(FrameHeader, &[u8], &[u8]), ProtoError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(ProtoError::Truncated);
    }
    let mut raw = [0u8; FRAME_HEADER_BYTES];
    raw.copy_from_slice(&bytes[..FRAME_HEADER_BYTES]);
    let header = FrameHeader::decode(&raw)?;
    let rest = &bytes[FRAME_HEADER_BYTES..];
    let body_len = header.body_len as usize;
    let need = body_len + header.data_len as usize;
    if rest.len() < need {
        return Err(ProtoError::Truncated);
    }
    if rest.len() > need {
        return Err(ProtoError::TrailingBytes(rest.len() - need));
    }
    let body = &rest[..body_len];
    header.verify_body(&raw, body)?;
    Ok((header, body, &rest[body_len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader {
            is_response: true,
            opcode: 7,
            request_id: RequestId(0xdead_beef),
            body_len: 3,
            data_len: 10,
            status: 0,
            checksum: 0,
        }
    }

    #[test]
    fn header_round_trips() {
        let body = [1u8, 2, 3];
        let raw = sample().encode(&body);
        let h = FrameHeader::decode(&raw).unwrap();
        assert!(h.is_response);
        assert_eq!(h.opcode, 7);
        assert_eq!(h.request_id, RequestId(0xdead_beef));
        assert_eq!((h.body_len, h.data_len), (3, 10));
        h.verify_body(&raw, &body).unwrap();
    }

    #[test]
    fn corruption_is_detected() {
        let body = [1u8, 2, 3];
        let mut raw = sample().encode(&body);
        raw[12] ^= 1; // flip a request id bit
        let h = FrameHeader::decode(&raw).unwrap();
        assert!(matches!(
            h.verify_body(&raw, &body),
            Err(ProtoError::BadChecksum { .. })
        ));
        let raw = sample().encode(&body);
        let h = FrameHeader::decode(&raw).unwrap();
        assert!(h.verify_body(&raw, &[1, 2, 4]).is_err());
    }

    #[test]
    fn bad_headers_are_refused() {
        let good = sample().encode(&[1, 2, 3]);
        let mut bad = good;
        bad[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&bad),
            Err(ProtoError::BadMagic(_))
        ));
        let mut bad = good;
        bad[4] = 99;
        assert_eq!(FrameHeader::decode(&bad), Err(ProtoError::BadVersion(99)));
        let mut bad = good;
        bad[16..20].copy_from_slice(&(BODY_MAX_BYTES + 1).to_le_bytes());
        assert_eq!(
            FrameHeader::decode(&bad),
            Err(ProtoError::BodyTooLong(BODY_MAX_BYTES + 1))
        );
        let mut bad = good;
        bad[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            FrameHeader::decode(&bad),
            Err(ProtoError::DataTooLong(u32::MAX))
        );
        let mut bad = good;
        bad[24] = 250;
        assert_eq!(
            FrameHeader::decode(&bad),
            Err(ProtoError::UnknownErrorCode(250))
        );
        assert_eq!(decode_frame(&good[..10]), Err(ProtoError::Truncated));
    }
}
