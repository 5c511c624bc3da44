//! The deterministic data the write phases write and the read phases check:
//! every byte is a function of a key (phase, rank, file) and its absolute
//! offset in the file, so data read from the wrong rank, file or offset
//! does not match.

/// SplitMix64 finaliser: a cheap, well-mixed 64-bit hash.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The key of a (phase tag, rank, file index) triple.
pub fn key(tag: u64, rank: u64, file: u64) -> u64 {
    mix(mix(mix(tag) ^ rank) ^ file)
}

/// The 8-byte word at word index `index`: cheap (one multiply), so filling
/// and checking buffers costs far less than moving them; distinct for every
/// index of a key, and keys are well mixed.
#[inline]
fn word(key: u64, index: u64) -> [u8; 8] {
    (key ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes()
}

/// The pattern of `key` at `offset`, `len` bytes long, in a new buffer
/// written once (not zeroed first, as `vec![0; len]` then `fill` would).
pub fn make(key: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    if offset.is_multiple_of(8) {
        let base = offset / 8;
        for i in 0..(len / 8) as u64 {
            v.extend_from_slice(&word(key, base + i));
        }
        let rest = len % 8;
        if rest > 0 {
            v.extend_from_slice(&word(key, base + (len / 8) as u64)[..rest]);
        }
        return v;
    }
    v.resize(len, 0);
    fill(&mut v, key, offset);
    v
}

/// Fill `buf` with the pattern of `key` as found at `offset` in the file.
pub fn fill(buf: &mut [u8], key: u64, offset: u64) {
    if offset.is_multiple_of(8) {
        let base = offset / 8;
        let full_words = (buf.len() / 8) as u64;
        let mut chunks = buf.chunks_exact_mut(8);
        for (i, c) in (&mut chunks).enumerate() {
            c.copy_from_slice(&word(key, base + i as u64));
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            let w = word(key, base + full_words);
            rest.copy_from_slice(&w[..n]);
        }
        return;
    }
    let mut pos = 0usize;
    while pos < buf.len() {
        let abs = offset + pos as u64;
        let w = word(key, abs / 8);
        let start = (abs % 8) as usize;
        let n = (8 - start).min(buf.len() - pos);
        buf[pos..pos + n].copy_from_slice(&w[start..start + n]);
        pos += n;
    }
}

/// The index of the first byte of `buf` that differs from the pattern of
/// `key` at `offset`, if any.
pub fn first_mismatch(buf: &[u8], key: u64, offset: u64) -> Option<usize> {
    if offset.is_multiple_of(8) {
        let base = offset / 8;
        let bad = buf
            .chunks(8)
            .enumerate()
            .position(|(i, c)| c != &word(key, base + i as u64)[..c.len()]);
        if let Some(w) = bad {
            let c = &buf[w * 8..(w * 8 + 8).min(buf.len())];
            let ref_w = word(key, base + w as u64);
            let i = (0..c.len()).find(|&i| c[i] != ref_w[i]).unwrap_or(0);
            return Some(w * 8 + i);
        }
        return None;
    }
    let mut pos = 0usize;
    while pos < buf.len() {
        let abs = offset + pos as u64;
        let w = word(key, abs / 8);
        let start = (abs % 8) as usize;
        let n = (8 - start).min(buf.len() - pos);
        if buf[pos..pos + n] != w[start..start + n] {
            let i = (0..n).find(|&i| buf[pos + i] != w[start + i]).unwrap_or(0);
            return Some(pos + i);
        }
        pos += n;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_offset_consistent() {
        let k = key(1, 2, 3);
        let whole = make(k, 0, 100);
        for off in 0..20u64 {
            let part = make(k, off, 37);
            assert_eq!(&whole[off as usize..off as usize + 37], &part[..]);
            assert_eq!(first_mismatch(&part, k, off), None);
        }
        // Built in one pass or filled in place: the same bytes.
        for (off, len) in [(0, 0), (0, 7), (8, 37), (16, 64), (3, 29)] {
            let mut v = vec![0; len];
            fill(&mut v, k, off);
            assert_eq!(make(k, off, len), v, "{off} {len}");
        }
        let mut bad = whole.clone();
        bad[41] ^= 1;
        assert_eq!(first_mismatch(&bad, k, 0), Some(41));
        assert!(first_mismatch(&whole, key(1, 3, 3), 0).is_some());
        assert!(first_mismatch(&whole[8..], k, 0).is_some());
    }
}
