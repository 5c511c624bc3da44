//! Server-side find (`Op::Find`): the query every server evaluates against
//! its own shard of dentries and inodes, and what a page of answers holds.
//! Pure: the name glob and the predicates are here so that servers and
//! clients judge an entry the same way.

use crate::codec::{Decoder, Encoder};
use crate::error::ProtoError;
use madfs_types::{limits, Attr, FileKind, FileName, InodeId, Timestamp};

/// Longest `-name` pattern accepted on the wire.
pub const GLOB_MAX_BYTES: usize = limits::PATH_MAX_BYTES;
/// Most entries (directories, matches and unresolved together) in one page:
/// at most ~300 bytes each, so a page stays well under the 2 MiB body limit.
pub const FIND_PAGE_ENTRIES_MAX: u32 = 4096;

/// How `-size` compares the rounded size with N (`+N`, `-N`, `N`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum SizeCmp {
    Less = 1,
    Equal = 2,
    Greater = 3,
}

/// GNU find's `-size [+-]N[unit]`: the file size is rounded UP to whole
/// units and compared with N (so `-size -1M` only matches empty files).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SizeTest {
    pub cmp: SizeCmp,
    pub n: u64,
    /// Bytes per unit: 1 (c), 2 (w), 512 (b, the default), 1024 (k), ...
    pub unit: u64,
}

impl SizeTest {
    pub fn matches(&self, size: u64) -> bool {
        let unit = self.unit.max(1);
        let rounded = size / unit + u64::from(!size.is_multiple_of(unit));
        match self.cmp {
            SizeCmp::Less => rounded < self.n,
            SizeCmp::Equal => rounded == self.n,
            SizeCmp::Greater => rounded > self.n,
        }
    }
}

/// The predicates of one find, all of which must hold (an AND).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FindQuery {
    /// fnmatch-style glob over the whole name (bytes): `*`, `?`, `[...]`.
    pub name: Option<Vec<u8>>,
    /// mtime strictly after this (`-newer`).
    pub newer: Option<Timestamp>,
    pub size: Option<SizeTest>,
    pub kind: Option<FileKind>,
    pub uid: Option<u32>,
    /// Return size, mtime and uid with every match even when no predicate
    /// needs them (du).
    pub want_attrs: bool,
}

impl FindQuery {
    /// Whether deciding a match (or answering it) needs the inode record.
    pub fn needs_attrs(&self) -> bool {
        self.want_attrs || self.newer.is_some() || self.size.is_some() || self.uid.is_some()
    }

    /// The tests that need only the dentry: name and kind.
    pub fn matches_entry(&self, name: &[u8], kind: FileKind) -> bool {
        self.kind.is_none_or(|k| k == kind)
            && self.name.as_ref().is_none_or(|g| glob_match(g, name))
    }

    /// The tests on the inode record: size, mtime, uid.
    pub fn matches_attrs(&self, a: &FindAttrs) -> bool {
        self.newer.is_none_or(|t| a.mtime > t)
            && self.size.is_none_or(|s| s.matches(a.size))
            && self.uid.is_none_or(|u| u == a.uid)
    }

    pub fn matches(&self, name: &[u8], a: &Attr) -> bool {
        self.matches_entry(name, a.kind) && self.matches_attrs(&FindAttrs::of(a))
    }

    pub(crate) fn encode(&self, e: &mut Encoder) {
        match &self.name {
            None => e.u8(0),
            Some(g) => {
                e.u8(1);
                e.bytes16(g);
            }
        }
        match self.newer {
            None => e.u8(0),
            Some(t) => {
                e.u8(1);
                e.ts(t);
            }
        }
        match self.size {
            None => e.u8(0),
            Some(s) => {
                e.u8(1);
                e.u8(s.cmp as u8);
                e.u64(s.n);
                e.u64(s.unit);
            }
        }
        match self.kind {
            None => e.u8(0),
            Some(k) => {
                e.u8(1);
                e.kind(k);
            }
        }
        e.opt_u32(self.uid);
        e.bool(self.want_attrs);
    }

    pub(crate) fn decode(d: &mut Decoder<'_>) -> Result<FindQuery, ProtoError> {
        let name = if d.bool()? {
            Some(d.bytes16(GLOB_MAX_BYTES, "find name pattern")?)
        } else {
            None
        };
        let newer = if d.bool()? { Some(d.ts()?) } else { None };
        let size = if d.bool()? {
            let cmp = match d.u8()? {
                1 => SizeCmp::Less,
                2 => SizeCmp::Equal,
                3 => SizeCmp::Greater,
                _ => return Err(ProtoError::BadValue("find size comparison")),
            };
            let n = d.u64()?;
            let unit = d.u64()?;
            if unit == 0 {
                return Err(ProtoError::BadValue("find size unit"));
            }
            Some(SizeTest { cmp, n, unit })
        } else {
            None
        };
        let kind = if d.bool()? { Some(d.kind()?) } else { None };
        Ok(FindQuery {
            name,
            newer,
            size,
            kind,
            uid: d.opt_u32()?,
            want_attrs: d.bool()?,
        })
    }
}

/// The attributes a find tests and returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FindAttrs {
    pub size: u64,
    pub mtime: Timestamp,
    pub uid: u32,
}

impl FindAttrs {
    pub fn of(a: &Attr) -> FindAttrs {
        FindAttrs {
            size: a.size,
            mtime: a.mtime,
            uid: a.uid,
        }
    }
}

/// A directory's name, for building paths; `access` is (perm, uid, gid) when
/// the server holds the directory's inode (else the client asks its owner).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FindDir {
    pub parent: InodeId,
    pub name: FileName,
    pub ino: InodeId,
    pub access: Option<(u32, u32, u32)>,
}

/// An entry that passed the server's tests. `attrs` is None for an entry
/// whose inode lives on another server ("unresolved": the client checks it
/// with a GetAttr) or when the query needs no attributes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FindMatch {
    pub parent: InodeId,
    pub name: FileName,
    pub ino: InodeId,
    pub kind: FileKind,
    pub attrs: Option<FindAttrs>,
}

pub(crate) fn encode_page(
    e: &mut Encoder,
    dirs: &[FindDir],
    matches: &[FindMatch],
    unresolved: &[FindMatch],
    resume: &Option<(InodeId, FileName)>,
    scanned: u64,
) {
    e.u32(dirs.len() as u32);
    for d in dirs {
        e.ino(d.parent);
        e.name(&d.name);
        e.ino(d.ino);
        match d.access {
            None => e.u8(0),
            Some((perm, uid, gid)) => {
                e.u8(1);
                e.u32(perm);
                e.u32(uid);
                e.u32(gid);
            }
        }
    }
    for list in [matches, unresolved] {
        e.u32(list.len() as u32);
        for m in list {
            e.ino(m.parent);
            e.name(&m.name);
            e.ino(m.ino);
            e.kind(m.kind);
            match &m.attrs {
                None => e.u8(0),
                Some(a) => {
                    e.u8(1);
                    e.u64(a.size);
                    e.ts(a.mtime);
                    e.u32(a.uid);
                }
            }
        }
    }
    match resume {
        None => e.u8(0),
        Some((p, n)) => {
            e.u8(1);
            e.ino(*p);
            e.name(n);
        }
    }
    e.u64(scanned);
}

/// Entry count of one list, checked against the page limit and against
/// what the rest of the body can hold (each entry takes at least `min` bytes)
/// before any memory is reserved.
fn list_len(d: &mut Decoder<'_>, min: usize) -> Result<usize, ProtoError> {
    let n = d.u32()? as usize;
    d.list_len(n, FIND_PAGE_ENTRIES_MAX as usize, min, "find page length")
}

pub(crate) type Page = (
    Vec<FindDir>,
    Vec<FindMatch>,
    Vec<FindMatch>,
    Option<(InodeId, FileName)>,
    u64,
);

pub(crate) fn decode_page(d: &mut Decoder<'_>) -> Result<Page, ProtoError> {
    let n = list_len(d, 19)?;
    let mut dirs = Vec::with_capacity(n);
    for _ in 0..n {
        dirs.push(FindDir {
            parent: d.ino()?,
            name: d.name()?,
            ino: d.ino()?,
            access: if d.bool()? {
                Some((d.u32()?, d.u32()?, d.u32()?))
            } else {
                None
            },
        });
    }
    let mut lists = [Vec::new(), Vec::new()];
    for list in lists.iter_mut() {
        let n = list_len(d, 20)?;
        list.reserve(n);
        for _ in 0..n {
            list.push(FindMatch {
                parent: d.ino()?,
                name: d.name()?,
                ino: d.ino()?,
                kind: d.kind()?,
                attrs: if d.bool()? {
                    Some(FindAttrs {
                        size: d.u64()?,
                        mtime: d.ts()?,
                        uid: d.u32()?,
                    })
                } else {
                    None
                },
            });
        }
    }
    let resume = if d.bool()? {
        Some((d.ino()?, d.name()?))
    } else {
        None
    };
    let scanned = d.u64()?;
    let [matches, unresolved] = lists;
    Ok((dirs, matches, unresolved, resume, scanned))
}

/// fnmatch(3) without flags, over bytes, as GNU find's `-name` uses it:
/// `*` any run (a leading dot included), `?` one byte, `[...]` a set with
/// ranges, `!` or `^` negation, `]` first taken literally and the POSIX
/// classes `[:alpha:]` etc.; `\` quotes the next byte. The whole name must
/// match. A malformed `[` (no closing `]`) matches itself literally.
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    if !pat.iter().any(|c| matches!(c, b'?' | b'[' | b'\\')) {
        return star_match(pat, name);
    }
    // Iterative matcher with one backtrack point for the last `*`: linear
    // in practice, never exponential.
    let (mut p, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    while p < pat.len() && pat[p] == b'*' {
                        p += 1;
                    }
                    star = Some((p, n));
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((ok, next)) = bracket(pat, p, name[n]) {
                        if ok {
                            p = next;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == b'[' {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pat.len() => {
                    if pat[p + 1] == name[n] {
                        p += 2;
                        n += 1;
                        continue;
                    }
                }
                c => {
                    if c == name[n] {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
            }
        }
        // Mismatch: let the last star take one more byte, or fail.
        match star {
            Some((sp, sn)) => {
                p = sp;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// The common case, a pattern whose only metacharacter is `*` (`*01*`):
/// literal segments found left to right, the first anchored at the start and
/// the last at the end.
fn star_match(pat: &[u8], name: &[u8]) -> bool {
    // No allocation: this runs once per entry of a server-side find.
    let (Some(first_star), Some(last_star)) = (
        pat.iter().position(|&c| c == b'*'),
        pat.iter().rposition(|&c| c == b'*'),
    ) else {
        return pat == name;
    };
    let (first, last) = (&pat[..first_star], &pat[last_star + 1..]);
    // Byte loops, not slice equality: that calls memcmp even for the empty
    // affixes of `*x*`, and this runs once per entry.
    let same = |a: &[u8], b: &[u8]| a.iter().zip(b).all(|(x, y)| x == y);
    if name.len() < first.len() + last.len()
        || !same(first, &name[..first.len()])
        || !same(last, &name[name.len() - last.len()..])
    {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    if first_star == last_star {
        return true;
    }
    for seg in pat[first_star + 1..last_star].split(|&c| c == b'*') {
        if seg.is_empty() {
            continue;
        }
        match find_bytes(rest, seg) {
            Some(i) => rest = &rest[i + seg.len()..],
            None => return false,
        }
    }
    true
}

/// Where `needle` (not empty) first occurs in `hay`: a scan for its first
/// byte, then a byte-wise compare, so a short needle costs no call to
/// memcmp per position.
fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, tail) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let at = from + hay[from..=last_start].iter().position(|&b| b == first)?;
        if hay[at + 1..at + needle.len()]
            .iter()
            .zip(tail)
            .all(|(a, b)| a == b)
        {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Match byte `c` against the bracket expression starting at `pat[start]`
/// (a `[`): Some((matched, index after the `]`)), or None if it never closes.
fn bracket(pat: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(pat.get(i), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let b = *pat.get(i)?;
        if b == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if b == b'[' && pat.get(i + 1) == Some(&b':') {
            if let Some(end) = pat[i + 2..].windows(2).position(|w| w == b":]") {
                let class = &pat[i + 2..i + 2 + end];
                matched |= class_match(class, c);
                i += 2 + end + 2;
                continue;
            }
        }
        let lo = if b == b'\\' && i + 1 < pat.len() {
            i += 1;
            pat[i]
        } else {
            b
        };
        i += 1;
        if pat.get(i) == Some(&b'-') && pat.get(i + 1).is_some_and(|&x| x != b']') {
            let mut hi = pat[i + 1];
            i += 2;
            if hi == b'\\' && i < pat.len() {
                hi = pat[i];
                i += 1;
            }
            matched |= lo <= c && c <= hi;
        } else {
            matched |= lo == c;
        }
    }
}

fn class_match(class: &[u8], c: u8) -> bool {
    match class {
        b"alpha" => c.is_ascii_alphabetic(),
        b"digit" => c.is_ascii_digit(),
        b"alnum" => c.is_ascii_alphanumeric(),
        b"upper" => c.is_ascii_uppercase(),
        b"lower" => c.is_ascii_lowercase(),
        b"space" => c.is_ascii_whitespace() || c == 0x0b,
        b"blank" => c == b' ' || c == b'\t',
        b"punct" => c.is_ascii_punctuation(),
        b"xdigit" => c.is_ascii_hexdigit(),
        b"cntrl" => c.is_ascii_control(),
        b"print" => (0x20..0x7f).contains(&c),
        b"graph" => (0x21..0x7f).contains(&c),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_fnmatch() {
        let yes: &[(&str, &str)] = &[
            ("*01*", "file01"),
            ("*01*", "01"),
            ("*01*", "a01b"),
            ("*", ".hidden"),
            ("?", "a"),
            ("a?c", "abc"),
            ("*.txt", "x.txt"),
            ("[abc]x", "bx"),
            ("[a-c]x", "cx"),
            ("[!a-c]x", "dx"),
            ("[^a-c]x", "dx"),
            ("[]]", "]"),
            ("[!]]", "a"),
            ("[[:digit:]]*", "7up"),
            ("\\*", "*"),
            ("a\\?", "a?"),
            ("[", "["),
            ("a[", "a["),
            ("**a**", "bab"),
            ("*a*b*c*", "xaybzc"),
            ("[a-]", "-"),
        ];
        for (p, n) in yes {
            assert!(glob_match(p.as_bytes(), n.as_bytes()), "{p} ~ {n}");
        }
        let no: &[(&str, &str)] = &[
            ("*01*", "file10"),
            ("?", "ab"),
            ("?", ""),
            ("a?c", "ac"),
            ("*.txt", "x.txt.gz"),
            ("[abc]x", "dx"),
            ("[!a-c]x", "ax"),
            ("[[:digit:]]*", "up7"),
            ("\\*", "a"),
            ("abc", "abcd"),
            ("*a*b*c*", "xaybz"),
            ("file", "File"),
        ];
        for (p, n) in no {
            assert!(!glob_match(p.as_bytes(), n.as_bytes()), "{p} !~ {n}");
        }
        // The star-only fast path agrees with the general matcher.
        for p in [
            "*01*", "a*", "*a", "a*b", "*", "**", "ab", "a*a", "*aa*a*", "",
        ] {
            for n in [
                "", "a", "aa", "aaa", "ab", "ba", "a01b", "01", "0", "aab", "abab",
            ] {
                let general = glob_match(format!("{p}?").as_bytes(), format!("{n}x").as_bytes());
                assert_eq!(star_match(p.as_bytes(), n.as_bytes()), general, "{p} ~ {n}");
            }
        }
        // The substring search agrees with a naive one.
        for hay in ["", "a", "0101", "x01", "aab0101", "10", "001"] {
            for needle in ["0", "01", "10", "101", "aab0101", "aab01010"] {
                let naive = hay
                    .as_bytes()
                    .windows(needle.len())
                    .position(|w| w == needle.as_bytes());
                assert_eq!(
                    find_bytes(hay.as_bytes(), needle.as_bytes()),
                    naive,
                    "{needle} in {hay}"
                );
            }
        }
        // Pathological pattern stays fast.
        let name = vec![b'a'; 255];
        assert!(!glob_match(b"*a*a*a*a*a*a*a*a*b", &name));
    }

    #[test]
    fn oversized_or_truncated_pages_are_refused() {
        use crate::Reply;
        // A page claiming 4096 directories in a few bytes.
        let mut e = Encoder::new();
        e.u8(13);
        e.u32(4096);
        e.u32(0);
        e.u32(0);
        e.u8(0);
        e.u64(0);
        assert!(Reply::decode(&e.into_bytes()).is_err());
        // An empty page decodes only with its scanned count, and nothing after it.
        let page = |scanned: Option<u64>, extra: bool| {
            let mut e = Encoder::new();
            e.u8(13);
            e.u32(0);
            e.u32(0);
            e.u32(0);
            e.u8(0);
            if let Some(n) = scanned {
                e.u64(n);
            }
            if extra {
                e.u8(0);
            }
            Reply::decode(&e.into_bytes())
        };
        assert!(page(None, false).is_err());
        assert!(page(Some(7), true).is_err());
        assert!(matches!(
            page(Some(7), false),
            Ok(Reply::FindPage { scanned: 7, .. })
        ));
        // Over the page limit.
        let mut e = Encoder::new();
        e.u8(13);
        e.u32(FIND_PAGE_ENTRIES_MAX + 1);
        assert!(Reply::decode(&e.into_bytes()).is_err());
        // A zero size unit is refused.
        let mut e = Encoder::new();
        e.creds(&madfs_types::Credentials::root());
        for v in [0u8, 0, 1, 2] {
            e.u8(v);
        }
        e.u64(1);
        e.u64(0);
        e.u8(0);
        e.u8(0);
        e.u8(0);
        e.u8(0);
        e.u32(10);
        assert!(crate::Request::decode(crate::Opcode::Find as u16, &e.into_bytes()).is_err());
    }

    #[test]
    fn a_full_page_of_longest_entries_fits_the_body_limit() {
        use crate::Reply;
        let long = FileName::new(&[b'n'; 255]).unwrap();
        let m = FindMatch {
            parent: InodeId(1),
            name: long.clone(),
            ino: InodeId(2),
            kind: FileKind::File,
            attrs: Some(FindAttrs {
                size: 1,
                mtime: Timestamp::default(),
                uid: 0,
            }),
        };
        let n = FIND_PAGE_ENTRIES_MAX as usize;
        let body = Reply::FindPage {
            dirs: vec![],
            matches: vec![m; n],
            unresolved: vec![],
            resume: Some((InodeId(1), long)),
            scanned: u64::MAX,
        }
        .encode();
        assert!(body.len() < 2 << 20, "{}", body.len());
        assert_eq!(Reply::decode(&body).unwrap().encode(), body);
    }

    #[test]
    fn size_rounds_up_to_units_as_gnu_find_does() {
        let t = |cmp, n, unit| SizeTest { cmp, n, unit };
        use SizeCmp::*;
        assert!(t(Equal, 3901, 1).matches(3901));
        assert!(!t(Equal, 3901, 1).matches(3902));
        // 4k means ceil(size / 1024) == 4: 3073..=4096.
        assert!(t(Equal, 4, 1024).matches(3901));
        assert!(t(Equal, 4, 1024).matches(4096));
        assert!(t(Equal, 4, 1024).matches(3073));
        assert!(!t(Equal, 4, 1024).matches(3072));
        assert!(!t(Equal, 4, 1024).matches(4097));
        // -1M: only empty files (rounded < 1).
        assert!(t(Less, 1, 1 << 20).matches(0));
        assert!(!t(Less, 1, 1 << 20).matches(1));
        // +0 means non-empty; 0 means empty.
        assert!(t(Greater, 0, 512).matches(1));
        assert!(!t(Greater, 0, 512).matches(0));
        assert!(t(Equal, 0, 1).matches(0));
        // Default unit: 512-byte blocks.
        assert!(t(Equal, 8, 512).matches(3901));
        assert!(t(Greater, 3900, 1).matches(3901));
        assert!(t(Less, 3902, 1).matches(3901));
    }
}
