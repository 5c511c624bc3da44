//! The in-memory model of one exercised file: the bytes and size it must
//! have after every operation, the data pattern writes use, and the
//! comparisons that turn a difference from the real file into a report
//! (size error, or the first bad byte and what it looks like).

use std::fmt;

/// The byte that operation `op` writes at file offset `offset`. Never 0, so
/// a zero read back is a hole or truncated-off data, never written data;
/// and it depends on both arguments, so a stale byte can be traced to the
/// operation that wrote it (see `Exerciser`'s reports).
pub fn pattern_byte(op: u64, offset: u64) -> u8 {
    // splitmix64's finalizer over a mix of both: neighbouring offsets and
    // neighbouring operations give unrelated bytes.
    let mut x = op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ offset.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    1 + (x % 255) as u8
}

/// The bytes operation `op` writes at `offset..offset + len`.
pub fn pattern(op: u64, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| pattern_byte(op, o))
        .collect()
}

/// What a file must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    data: Vec<u8>,
}

/// Where read-back data differs from the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Bytes expected and bytes returned (they differ for a short or long
    /// read).
    pub expected_len: u64,
    pub actual_len: u64,
    /// The first differing byte within the common length: its file offset,
    /// the expected byte and the byte read.
    pub first_bad: Option<(u64, u8, u8)>,
    /// File offset of the last differing byte, and how many differ.
    pub last_bad: u64,
    pub bad_bytes: u64,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if self.expected_len != self.actual_len {
            write!(
                f,
                "read returned 0x{:x} bytes, expected 0x{:x}",
                self.actual_len, self.expected_len
            )?;
            sep = "; ";
        }
        if let Some((at, want, got)) = self.first_bad {
            write!(
                f,
                "{sep}bad data at 0x{at:x}: expected 0x{want:02x}, got 0x{got:02x} \
                 (0x{:x} bytes differ, the last at 0x{:x})",
                self.bad_bytes, self.last_bad
            )?;
        }
        Ok(())
    }
}

impl Model {
    pub fn new() -> Model {
        Model::default()
    }

    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A write of `bytes` at `offset`: the gap from the old end of file to
    /// `offset`, if any, becomes a hole (zeros).
    pub fn write(&mut self, offset: u64, bytes: &[u8]) {
        let start = offset as usize;
        let end = start + bytes.len();
        if end > self.data.len() {
            self.data.resize(end, 0);
        }
        self.data[start..end].copy_from_slice(bytes);
    }

    /// A truncate to `size`, down (data dropped) or up (zeros added).
    pub fn truncate(&mut self, size: u64) {
        self.data.resize(size as usize, 0);
    }

    /// What a read of `len` bytes at `offset` must return: shorter at the
    /// end of file, empty past it.
    pub fn expected(&self, offset: u64, len: u64) -> &[u8] {
        let size = self.len();
        let start = offset.min(size) as usize;
        let end = offset.saturating_add(len).min(size) as usize;
        &self.data[start..end]
    }

    /// The byte at `offset` (0 past the end of file).
    pub fn byte(&self, offset: u64) -> u8 {
        self.data.get(offset as usize).copied().unwrap_or(0)
    }

    /// Compare a size seen through `what` (fstat, lseek, ...) with the model.
    pub fn check_size(&self, what: &str, actual: u64) -> Result<(), String> {
        if actual == self.len() {
            Ok(())
        } else {
            Err(format!(
                "size error: expected 0x{:x}, {what} 0x{actual:x}",
                self.len()
            ))
        }
    }

    /// Compare what a read of `len` bytes at `offset` returned with the
    /// model.
    pub fn check_read(&self, offset: u64, len: u64, actual: &[u8]) -> Result<(), Mismatch> {
        let expected = self.expected(offset, len);
        let mut first_bad = None;
        let mut last_bad = 0;
        let mut bad_bytes = 0;
        for (i, (&want, &got)) in expected.iter().zip(actual).enumerate() {
            if want != got {
                let at = offset + i as u64;
                first_bad.get_or_insert((at, want, got));
                last_bad = at;
                bad_bytes += 1;
            }
        }
        if first_bad.is_none() && expected.len() == actual.len() {
            return Ok(());
        }
        Err(Mismatch {
            expected_len: expected.len() as u64,
            actual_len: actual.len() as u64,
            first_bad,
            last_bad,
            bad_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_never_zero_and_differs_by_op_and_offset() {
        let a = pattern(1, 0, 4096);
        let b = pattern(2, 0, 4096);
        assert!(a.iter().chain(&b).all(|&x| x != 0));
        assert_ne!(a, b);
        assert_ne!(pattern(1, 1, 4095), a[..4095]);
        assert_eq!(pattern(1, 100, 10), a[100..110]);
    }

    #[test]
    fn writes_past_the_end_leave_holes_and_truncates_go_both_ways() {
        let mut m = Model::new();
        m.write(10, &[1, 2, 3]);
        assert_eq!(m.len(), 13);
        assert_eq!(m.expected(0, 100), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
        m.truncate(11);
        assert_eq!(m.expected(9, 10), [0, 1]);
        m.truncate(14);
        assert_eq!(m.expected(9, 10), [0, 1, 0, 0, 0]);
        assert!(m.expected(20, 5).is_empty());
    }

    #[test]
    fn the_checker_catches_a_wrong_size() {
        let mut m = Model::new();
        m.write(0x31000, &pattern(7, 0x31000, 0x19e9));
        assert_eq!(m.len(), 0x329e9);
        assert!(m.check_size("fstat(fd1)", 0x329e9).is_ok());
        let e = m.check_size("fstat(fd1)", 0x31daa).unwrap_err();
        assert_eq!(e, "size error: expected 0x329e9, fstat(fd1) 0x31daa");
        assert!(m.check_size("lseek(SEEK_END)", 0x329ea).is_err());
        assert!(m.check_size("lseek(SEEK_END)", 0).is_err());
    }

    #[test]
    fn the_checker_catches_corrupt_short_and_long_reads() {
        let mut m = Model::new();
        let data = pattern(3, 100, 1000);
        m.write(100, &data);
        // A correct read, and a correct short read at the end of file.
        assert!(m.check_read(100, 1000, &data).is_ok());
        assert!(m.check_read(1000, 500, &data[900..]).is_ok());
        assert!(m.check_read(5000, 10, &[]).is_ok());
        // One byte flipped.
        let mut bad = data.clone();
        bad[500] ^= 0xff;
        let e = m.check_read(100, 1000, &bad).unwrap_err();
        assert_eq!(e.first_bad, Some((600, data[500], data[500] ^ 0xff)));
        assert_eq!((e.bad_bytes, e.last_bad), (1, 600));
        assert!(e.to_string().contains("bad data at 0x258"), "{e}");
        // Stale zeros (as a lost write would leave) in the hole's place.
        let mut hole = data.clone();
        hole[10..20].fill(0);
        let e = m.check_read(100, 1000, &hole).unwrap_err();
        assert_eq!((e.first_bad.unwrap().0, e.bad_bytes), (110, 10));
        // Short of the end of file, and past it.
        let e = m.check_read(100, 1000, &data[..999]).unwrap_err();
        assert_eq!(
            (e.expected_len, e.actual_len, e.first_bad),
            (1000, 999, None)
        );
        let mut long = data.clone();
        long.push(0);
        let e = m.check_read(100, 1001, &long).unwrap_err();
        assert_eq!((e.expected_len, e.actual_len), (1000, 1001));
        assert!(e
            .to_string()
            .contains("read returned 0x3e9 bytes, expected 0x3e8"));
    }
}
