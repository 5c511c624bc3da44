//! Path operations on MadFS paths (stat, mkdir, unlink, rename, links,
//! permissions, times, statfs) and the C structures they fill.

use crate::config;
use crate::conn;
use crate::ops::not_in_vfork_child;
use crate::shim::{unsupported, Errno, R};
use madfs_client::{
    Attr, FileKind, FsStats, SetAttrs, ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE, RENAME_EXCHANGE,
    RENAME_NOREPLACE,
};

/// st_dev of every MadFS file: one file system, distinct from the kernel's.
pub const DEV_MAJOR: u32 = 0;
pub const DEV_MINOR: u32 = 0xadf5;
/// statfs f_type ("MADF").
pub const FS_MAGIC: i64 = 0x4d41_4446;

fn blksize() -> i64 {
    conn::get()
        .map(|c| c.client.chunk_size().min(4 << 20))
        .unwrap_or(1 << 20) as i64
}

pub fn fill_stat(st: &mut libc::stat64, a: &Attr) {
    // SAFETY: stat64 is plain data.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(DEV_MAJOR, DEV_MINOR);
    st.st_ino = a.ino.0;
    st.st_nlink = a.nlink as u64;
    st.st_mode = a.mode();
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = a.size as i64;
    st.st_blksize = blksize();
    st.st_blocks = a.blocks() as i64;
    st.st_atime = a.atime.secs;
    st.st_atime_nsec = a.atime.nanos as i64;
    st.st_mtime = a.mtime.secs;
    st.st_mtime_nsec = a.mtime.nanos as i64;
    st.st_ctime = a.ctime.secs;
    st.st_ctime_nsec = a.ctime.nanos as i64;
    let (major, minor) = a.rdev_parts();
    st.st_rdev = libc::makedev(major, minor);
}

pub fn fill_statx(stx: &mut libc::statx, a: &Attr) {
    // SAFETY: statx is plain data.
    *stx = unsafe { std::mem::zeroed() };
    let ts = |t: &madfs_client::Timestamp| {
        // SAFETY: plain data.
        let mut x: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        x.tv_sec = t.secs;
        x.tv_nsec = t.nanos;
        x
    };
    stx.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    stx.stx_blksize = blksize() as u32;
    stx.stx_nlink = a.nlink;
    stx.stx_uid = a.uid;
    stx.stx_gid = a.gid;
    stx.stx_mode = a.mode() as u16;
    stx.stx_ino = a.ino.0;
    stx.stx_size = a.size;
    stx.stx_blocks = a.blocks();
    stx.stx_atime = ts(&a.atime);
    stx.stx_btime = ts(&a.btime);
    stx.stx_ctime = ts(&a.ctime);
    stx.stx_mtime = ts(&a.mtime);
    stx.stx_dev_major = DEV_MAJOR;
    stx.stx_dev_minor = DEV_MINOR;
    (stx.stx_rdev_major, stx.stx_rdev_minor) = a.rdev_parts();
}

const FS_BSIZE: u64 = 4096;

pub fn fill_statfs(sf: &mut libc::statfs64, s: &FsStats) {
    // SAFETY: plain data.
    *sf = unsafe { std::mem::zeroed() };
    sf.f_type = FS_MAGIC;
    sf.f_bsize = FS_BSIZE as i64;
    sf.f_frsize = FS_BSIZE as i64;
    sf.f_blocks = s.bytes_total / FS_BSIZE;
    sf.f_bfree = s.bytes_free / FS_BSIZE;
    sf.f_bavail = s.bytes_avail / FS_BSIZE;
    sf.f_files = s.inodes.saturating_add(s.bytes_avail / FS_BSIZE);
    sf.f_ffree = s.bytes_avail / FS_BSIZE;
    sf.f_namelen = madfs_client::limits::NAME_MAX_BYTES as i64;
}

pub fn fill_statvfs(sv: &mut libc::statvfs64, s: &FsStats) {
    // SAFETY: plain data.
    *sv = unsafe { std::mem::zeroed() };
    sv.f_bsize = FS_BSIZE;
    sv.f_frsize = FS_BSIZE;
    sv.f_blocks = s.bytes_total / FS_BSIZE;
    sv.f_bfree = s.bytes_free / FS_BSIZE;
    sv.f_bavail = s.bytes_avail / FS_BSIZE;
    sv.f_files = s.inodes.saturating_add(s.bytes_avail / FS_BSIZE);
    sv.f_ffree = s.bytes_avail / FS_BSIZE;
    sv.f_favail = sv.f_ffree;
    sv.f_fsid = DEV_MINOR as u64;
    sv.f_namemax = madfs_client::limits::NAME_MAX_BYTES as u64;
}

pub fn stat(path: &[u8], follow: bool) -> R<Attr> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    Ok(c.block_on(c.client.resolve(path, follow))?)
}

pub fn statfs() -> R<FsStats> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    Ok(c.block_on(c.client.statfs())?)
}

/// access/faccessat: F_OK or R/W/X bits.
pub fn access(path: &[u8], mode: i32, flags: i32) -> R<()> {
    not_in_vfork_child()?;
    if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        return Err(Errno(libc::EINVAL));
    }
    let c = conn::get()?;
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    let attr = c.block_on(c.client.resolve(path, follow))?;
    let mut mask = 0u8;
    if mode & libc::R_OK != 0 {
        mask |= ACCESS_READ;
    }
    if mode & libc::W_OK != 0 {
        mask |= ACCESS_WRITE;
    }
    if mode & libc::X_OK != 0 {
        mask |= ACCESS_EXEC;
    }
    if mask != 0 {
        c.block_on(c.client.access(attr.ino, mask))?;
    }
    Ok(())
}

pub fn mkdir(path: &[u8], mode: u32) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.mkdir(path, mode & 0o7777 & !config::umask()))?;
    Ok(())
}

/// mknod(2) of a FIFO, socket or device node (`kind`, from the mode's
/// S_IFMT bits) under the prefix: made in MadFS; opening it later answers
/// ENXIO (the library cannot connect a pipe's or socket's users), while
/// stat, unlink, rename, chmod, chown and utimens work as on any file.
/// `dev` is glibc's dev_t; EINVAL for a device number past 32 bits, as
/// glibc's mknod answers.
pub fn mknod(path: &[u8], kind: FileKind, mode: u32, dev: libc::dev_t) -> R<()> {
    not_in_vfork_child()?;
    let rdev = if kind.is_device() {
        Attr::make_rdev(libc::major(dev), libc::minor(dev))
            .filter(|_| libc::makedev(libc::major(dev), libc::minor(dev)) == dev)
            .ok_or(Errno(libc::EINVAL))?
    } else {
        0
    };
    let c = conn::get()?;
    let perm = mode & 0o7777 & !config::umask();
    c.block_on(c.client.mknod(path, kind, perm, rdev))?;
    Ok(())
}

pub fn unlink(path: &[u8]) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.remove_file(path))?;
    Ok(())
}

pub fn rmdir(path: &[u8]) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.remove_dir(path))?;
    Ok(())
}

pub fn rename(from: &[u8], to: &[u8], flags: u32) -> R<()> {
    not_in_vfork_child()?;
    let mut f = 0;
    if flags & libc::RENAME_NOREPLACE != 0 {
        f |= RENAME_NOREPLACE;
    }
    if flags & libc::RENAME_EXCHANGE != 0 {
        f |= RENAME_EXCHANGE;
    }
    if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
        return Err(Errno(libc::EINVAL));
    }
    let c = conn::get()?;
    c.block_on(c.client.rename_with_flags(from, to, f))?;
    Ok(())
}

pub fn link(existing: &[u8], new: &[u8], follow: bool) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    // With `follow` (linkat's AT_SYMLINK_FOLLOW), what a final symlink
    // points to is linked.
    c.block_on(c.client.hard_link_following(existing, new, follow))?;
    Ok(())
}

pub fn symlink(target: &[u8], link: &[u8]) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    c.block_on(c.client.symlink(target, link))?;
    Ok(())
}

pub fn readlink(path: &[u8]) -> R<Vec<u8>> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    Ok(c.block_on(c.client.read_link(path))?)
}

/// Change attributes of what `path` names (following a final symlink if
/// `follow`).
pub fn setattr(path: &[u8], changes: SetAttrs, follow: bool) -> R<()> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    let attr = c.block_on(c.client.resolve(path, follow))?;
    if !follow && attr.kind == FileKind::Symlink && changes.perm.is_some() {
        // As Linux: symlink permissions cannot be changed.
        return Err(unsupported("lchmod", "permissions of a symbolic link"));
    }
    c.block_on(c.client.setattr(attr.ino, changes))?;
    Ok(())
}

pub fn chmod_changes(mode: u32) -> SetAttrs {
    SetAttrs {
        perm: Some(mode & 0o7777),
        ..SetAttrs::default()
    }
}

pub fn chown_changes(uid: u32, gid: u32) -> SetAttrs {
    SetAttrs {
        uid: (uid != u32::MAX).then_some(uid),
        gid: (gid != u32::MAX).then_some(gid),
        ..SetAttrs::default()
    }
}

pub fn truncate(path: &[u8], len: i64) -> R<()> {
    not_in_vfork_child()?;
    if len < 0 {
        return Err(Errno(libc::EINVAL));
    }
    let c = conn::get()?;
    c.block_on(c.client.truncate(path, len as u64))?;
    Ok(())
}

/// realpath of a MadFS path: symlinks resolved component by component
/// (absolute targets are MadFS paths, as the client resolves them), every
/// component must exist.
pub fn realpath(path: &[u8]) -> R<Vec<u8>> {
    not_in_vfork_child()?;
    let c = conn::get()?;
    let mut done: Vec<Vec<u8>> = Vec::new();
    let mut todo: std::collections::VecDeque<Vec<u8>> = path
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .map(|p| p.to_vec())
        .collect();
    let mut links = 0;
    while let Some(comp) = todo.pop_front() {
        match &comp[..] {
            b"." => continue,
            b".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        let mut cur = Vec::new();
        for d in &done {
            cur.push(b'/');
            cur.extend_from_slice(d);
        }
        cur.push(b'/');
        cur.extend_from_slice(&comp);
        let attr = c.block_on(c.client.resolve(&cur, false))?;
        if attr.kind == FileKind::Symlink {
            links += 1;
            if links > 40 {
                return Err(Errno(libc::ELOOP));
            }
            let target = c.block_on(c.client.readlink(attr.ino))?;
            if target.first() == Some(&b'/') {
                done.clear();
            }
            for p in target.split(|&b| b == b'/').filter(|p| !p.is_empty()).rev() {
                todo.push_front(p.to_vec());
            }
        } else {
            if !todo.is_empty() && attr.kind != FileKind::Dir {
                return Err(Errno(libc::ENOTDIR));
            }
            done.push(comp);
        }
    }
    let mut out = Vec::new();
    for d in &done {
        out.push(b'/');
        out.extend_from_slice(d);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}
