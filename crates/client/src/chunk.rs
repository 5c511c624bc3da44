//! Striping arithmetic: how a byte range of a file splits into per-chunk
//! pieces, and how a (possibly short) chunk read fills its part of the
//! caller's buffer. Pure functions, so the edge cases are unit-tested here.

use madfs_types::ChunkIndex;

/// The part of a file byte range that falls inside one chunk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Piece {
    pub chunk: ChunkIndex,
    /// Offset of the piece within its chunk.
    pub offset_in_chunk: u32,
    pub len: u32,
    /// Offset of the piece within the caller's buffer.
    pub buf_offset: usize,
    /// Offset of the piece within the file.
    pub file_offset: u64,
}

impl Piece {
    /// The file offset just past this piece.
    pub fn file_end(&self) -> u64 {
        self.file_offset + self.len as u64
    }

    pub fn buf_range(&self) -> std::ops::Range<usize> {
        self.buf_offset..self.buf_offset + self.len as usize
    }
}

/// Split `len` bytes at `offset` into pieces that each lie within one chunk,
/// in file order, with no gap and no overlap. The caller has checked that the
/// range ends below `FILE_SIZE_MAX_BYTES`, so chunk indexes fit in u32.
pub fn split_range(offset: u64, len: u64, chunk_size: u64) -> Vec<Piece> {
    assert!(chunk_size > 0 && chunk_size <= u32::MAX as u64);
    let mut pieces = Vec::with_capacity((len / chunk_size + 2) as usize);
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let chunk = pos / chunk_size;
        let within = pos % chunk_size;
        let n = (chunk_size - within).min(end - pos);
        pieces.push(Piece {
            chunk: ChunkIndex(u32::try_from(chunk).expect("chunk index fits in u32")),
            offset_in_chunk: within as u32,
            len: n as u32,
            buf_offset: (pos - offset) as usize,
            file_offset: pos,
        });
        pos += n;
    }
    pieces
}

/// Copy a chunk read's reply into the piece's part of the buffer. A server
/// returns fewer bytes than asked where the chunk has a hole or its file ends
/// before the file size does: those bytes read as zeros. Returns false if the
/// reply is longer than asked (a server bug the caller reports).
pub(crate) fn fill_piece(dst: &mut [u8], reply: &[u8]) -> bool {
    if reply.len() > dst.len() {
        return false;
    }
    dst[..reply.len()].copy_from_slice(reply);
    dst[reply.len()..].fill(0);
    true
}

/// How many bytes a read of `len` at `offset` returns from a file of `size`.
pub(crate) fn clamp_read(offset: u64, len: u64, size: u64) -> u64 {
    if offset >= size {
        0
    } else {
        len.min(size - offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(offset: u64, len: u64, cs: u64) {
        let pieces = split_range(offset, len, cs);
        let mut expect_file = offset;
        let mut expect_buf = 0usize;
        let mut total = 0u64;
        for p in &pieces {
            assert_eq!(p.file_offset, expect_file, "gap or overlap at {p:?}");
            assert_eq!(p.buf_offset, expect_buf);
            assert!(p.len > 0);
            assert!(
                p.offset_in_chunk as u64 + p.len as u64 <= cs,
                "{p:?} crosses a chunk"
            );
            assert_eq!(
                p.chunk.0 as u64 * cs + p.offset_in_chunk as u64,
                p.file_offset
            );
            expect_file = p.file_end();
            expect_buf += p.len as usize;
            total += p.len as u64;
        }
        assert_eq!(total, len);
    }

    #[test]
    fn pieces_cover_the_range_exactly() {
        let cs = 64 * 1024;
        for &(off, len) in &[
            (0, 0),
            (0, 1),
            (0, cs),
            (0, cs + 1),
            (cs - 1, 2),
            (cs, cs),
            (cs + 5, 3 * cs),
            (7, 10 * cs - 14),
            (1 << 40, 3 * cs + 17),
        ] {
            check(off, len, cs);
        }
    }

    #[test]
    fn boundaries_split_where_expected() {
        let cs = 100;
        let p = split_range(250, 200, cs);
        let got: Vec<(u32, u32, u32)> = p
            .iter()
            .map(|p| (p.chunk.0, p.offset_in_chunk, p.len))
            .collect();
        assert_eq!(got, vec![(2, 50, 50), (3, 0, 100), (4, 0, 50)]);
        assert!(split_range(10, 0, cs).is_empty());
        assert_eq!(split_range(300, 100, cs).len(), 1);
    }

    #[test]
    fn short_reads_are_zero_filled() {
        let mut buf = [9u8; 6];
        assert!(fill_piece(&mut buf, b"ab"));
        assert_eq!(&buf, b"ab\0\0\0\0");
        let mut buf = [9u8; 3];
        assert!(fill_piece(&mut buf, b""));
        assert_eq!(buf, [0, 0, 0]);
        assert!(fill_piece(&mut buf, b"xyz"));
        assert_eq!(&buf, b"xyz");
        assert!(!fill_piece(&mut buf, b"long"));
    }

    #[test]
    fn reads_clamp_to_size() {
        assert_eq!(clamp_read(0, 10, 5), 5);
        assert_eq!(clamp_read(5, 10, 5), 0);
        assert_eq!(clamp_read(9, 10, 5), 0);
        assert_eq!(clamp_read(1, 2, 5), 2);
    }
}
