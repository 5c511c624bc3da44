//! Directory streams (DIR*) and getdents64 over MadFS directory
//! descriptors. A stream is a box of ours holding the descriptor and the
//! dirent it returns; the position is the descriptor's offset (an index into
//! ".", "..", then the entries), so readdir, telldir, seekdir and
//! getdents64 on the same descriptor agree.

use crate::fdtable::{self, Kind};
use crate::forklock::ForkMutex;
use crate::ops;
use crate::real;
use crate::shim::{Errno, R};
use madfs_client::FileKind;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct OurDir {
    fd: i32,
    ent: libc::dirent64,
}

static DIRS: ForkMutex<BTreeSet<usize>> = ForkMutex::new(BTreeSet::new());
static NDIRS: AtomicUsize = AtomicUsize::new(0);

pub fn is_ours(dir: *mut libc::DIR) -> bool {
    if NDIRS.load(Ordering::Relaxed) == 0 || dir.is_null() {
        return false;
    }
    DIRS.lock().contains(&(dir as usize))
}

/// A stream over our directory descriptor `fd` (which it then owns).
pub fn open_stream(fd: i32) -> R<*mut libc::DIR> {
    let desc = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
    if desc.kind != Kind::Dir {
        return Err(Errno(libc::ENOTDIR));
    }
    // SAFETY: dirent64 is plain data.
    let ent: libc::dirent64 = unsafe { std::mem::zeroed() };
    let p = Box::into_raw(Box::new(OurDir { fd, ent }));
    DIRS.lock().insert(p as usize);
    NDIRS.fetch_add(1, Ordering::Relaxed);
    Ok(p.cast())
}

fn stream<'a>(dir: *mut libc::DIR) -> &'a mut OurDir {
    // SAFETY: callers checked `is_ours`: a box we made and have not freed.
    unsafe { &mut *dir.cast::<OurDir>() }
}

pub fn dirfd(dir: *mut libc::DIR) -> i32 {
    stream(dir).fd
}

fn d_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
        FileKind::CharDev => libc::DT_CHR,
        FileKind::BlockDev => libc::DT_BLK,
    }
}

/// The entry at the descriptor's position, advancing it; None at the end.
/// (name, inode, d_type, position after it)
type Entry = (Vec<u8>, u64, u8, u64);

fn next_entry(fd: i32) -> R<Option<Entry>> {
    ops::not_in_vfork_child()?;
    let desc = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
    let _io = desc.lock_io();
    // SAFETY: lseek on our descriptor.
    let pos = unsafe { real::seek(fd, 0, libc::SEEK_CUR) };
    if pos < 0 {
        return Err(Errno(libc::EBADF));
    }
    let mut listing = desc.lock_listing();
    match desc.entry_at(&mut listing, pos as u64)? {
        None => Ok(None),
        Some((name, ino, kind)) => {
            // SAFETY: lseek on our descriptor.
            unsafe { real::seek(fd, pos + 1, libc::SEEK_SET) };
            Ok(Some((name, ino, d_type(kind), pos as u64 + 1)))
        }
    }
}

fn fill(ent: &mut libc::dirent64, name: &[u8], ino: u64, ty: u8, next: u64) {
    ent.d_ino = ino;
    ent.d_off = next as i64;
    ent.d_type = ty;
    let n = name.len().min(255);
    for (d, s) in ent.d_name.iter_mut().zip(&name[..n]) {
        *d = *s as libc::c_char;
    }
    ent.d_name[n] = 0;
    let base = std::mem::offset_of!(libc::dirent64, d_name);
    ent.d_reclen = ((base + n + 1).div_ceil(8) * 8) as u16;
}

pub fn readdir(dir: *mut libc::DIR) -> R<*mut libc::dirent64> {
    let s = stream(dir);
    match next_entry(s.fd)? {
        None => Ok(std::ptr::null_mut()),
        Some((name, ino, ty, next)) => {
            fill(&mut s.ent, &name, ino, ty, next);
            Ok(&mut s.ent)
        }
    }
}

/// readdir_r: 0 and the entry (or NULL at the end), or an errno.
///
/// # Safety
/// `entry` and `result` are valid for writing.
pub unsafe fn readdir_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> i32 {
    if entry.is_null() || result.is_null() {
        return libc::EFAULT;
    }
    match next_entry(stream(dir).fd) {
        Err(Errno(e)) => e,
        Ok(None) => {
            // SAFETY: the caller's contract.
            unsafe { *result = std::ptr::null_mut() };
            0
        }
        Ok(Some((name, ino, ty, next))) => {
            // SAFETY: the caller's contract.
            unsafe {
                fill(&mut *entry, &name, ino, ty, next);
                *result = entry;
            }
            0
        }
    }
}

pub fn closedir(dir: *mut libc::DIR) -> R<i32> {
    DIRS.lock().remove(&(dir as usize));
    NDIRS.fetch_sub(1, Ordering::Relaxed);
    // SAFETY: a box we made; no longer registered, so freed once.
    let b = unsafe { Box::from_raw(dir.cast::<OurDir>()) };
    match fdtable::get(b.fd) {
        Some(d) => ops::close(b.fd, d),
        // SAFETY: plain close.
        None => Ok(unsafe { real::close(b.fd) }),
    }
}

pub fn telldir(dir: *mut libc::DIR) -> i64 {
    // SAFETY: lseek on our descriptor.
    unsafe { real::seek(stream(dir).fd, 0, libc::SEEK_CUR) }
}

pub fn seekdir(dir: *mut libc::DIR, pos: i64) {
    let fd = stream(dir).fd;
    if let Some(d) = fdtable::get(fd) {
        let _ = ops::lseek(fd, &d, pos, libc::SEEK_SET);
    }
}

pub fn rewinddir(dir: *mut libc::DIR) {
    seekdir(dir, 0);
}

/// getdents64 on our directory descriptor.
pub fn getdents64(fd: i32, buf: &mut [u8]) -> R<usize> {
    ops::not_in_vfork_child()?;
    let desc = fdtable::get(fd).ok_or(Errno(libc::EBADF))?;
    if desc.kind != Kind::Dir {
        return Err(Errno(libc::ENOTDIR));
    }
    let _io = desc.lock_io();
    // SAFETY: lseek on our descriptor.
    let mut pos = unsafe { real::seek(fd, 0, libc::SEEK_CUR) } as u64;
    let mut listing = desc.lock_listing();
    let base = std::mem::offset_of!(libc::dirent64, d_name);
    let mut used = 0usize;
    while let Some((name, ino, kind)) = desc.entry_at(&mut listing, pos)? {
        let reclen = (base + name.len() + 1).div_ceil(8) * 8;
        if used + reclen > buf.len() {
            if used == 0 {
                return Err(Errno(libc::EINVAL));
            }
            break;
        }
        let rec = &mut buf[used..used + reclen];
        rec.fill(0);
        rec[0..8].copy_from_slice(&ino.to_ne_bytes());
        rec[8..16].copy_from_slice(&((pos + 1) as i64).to_ne_bytes());
        rec[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        rec[18] = d_type(kind);
        rec[base..base + name.len()].copy_from_slice(&name);
        used += reclen;
        pos += 1;
    }
    // SAFETY: lseek on our descriptor.
    unsafe { real::seek(fd, pos as i64, libc::SEEK_SET) };
    Ok(used)
}

type Filter = Option<unsafe extern "C" fn(*const libc::dirent64) -> libc::c_int>;
type Compar = Option<
    unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> libc::c_int,
>;

/// scandir over a MadFS directory: entries malloc'd one by one, as the C
/// library does (the caller frees them with free).
///
/// # Safety
/// `list` is valid for writing; `filter`/`compar` are valid functions.
pub unsafe fn scandir(
    path: &[u8],
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> R<i32> {
    if list.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    let fd = ops::open(
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )?;
    let mut out: Vec<*mut libc::dirent64> = Vec::new();
    let result = (|| -> R<()> {
        // SAFETY: dirent64 is plain data.
        let mut ent: libc::dirent64 = unsafe { std::mem::zeroed() };
        while let Some((name, ino, ty, next)) = next_entry(fd)? {
            fill(&mut ent, &name, ino, ty, next);
            if let Some(f) = filter {
                // SAFETY: the caller's filter on a valid entry.
                if crate::guard::outside(|| unsafe { f(&ent) }) == 0 {
                    continue;
                }
            }
            let size = std::mem::size_of::<libc::dirent64>();
            // SAFETY: malloc of a dirent, filled by copy.
            unsafe {
                let p = libc::malloc(size).cast::<libc::dirent64>();
                if p.is_null() {
                    return Err(Errno(libc::ENOMEM));
                }
                std::ptr::copy_nonoverlapping(&ent, p, 1);
                out.push(p);
            }
        }
        Ok(())
    })();
    if let Some(d) = fdtable::get(fd) {
        let _ = ops::close(fd, d);
    }
    if let Err(e) = result {
        for p in out {
            // SAFETY: our own allocations.
            unsafe { libc::free(p.cast()) };
        }
        return Err(e);
    }
    // SAFETY: an array of the entries, malloc'd as the caller will free it.
    unsafe {
        let arr = libc::malloc(out.len().max(1) * std::mem::size_of::<*mut libc::dirent64>())
            .cast::<*mut libc::dirent64>();
        if arr.is_null() {
            for p in out {
                libc::free(p.cast());
            }
            return Err(Errno(libc::ENOMEM));
        }
        std::ptr::copy_nonoverlapping(out.as_ptr(), arr, out.len());
        if let Some(c) = compar {
            let cmp: unsafe extern "C" fn(*const libc::c_void, *const libc::c_void) -> libc::c_int =
                std::mem::transmute(c);
            crate::guard::outside(|| {
                libc::qsort(
                    arr.cast(),
                    out.len(),
                    std::mem::size_of::<*mut libc::dirent64>(),
                    Some(cmp),
                )
            });
        }
        *list = arr;
    }
    Ok(out.len() as i32)
}
