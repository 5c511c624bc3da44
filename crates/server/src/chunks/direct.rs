//! Direct I/O for chunk files (chunks.rs): the page-aligned buffers an
//! O_DIRECT write or read needs, O_DIRECT switched per descriptor, the
//! kernel's page cache asked what it holds (cachestat(2)), and early
//! writeback of buffered writes.

use super::*;

/// Writes of at least this many bytes, at an offset and of a length that
/// are multiples of `DIRECT_ALIGN`, bypass the page cache.
pub(super) const DIRECT_WRITE_MIN_BYTES: usize = 256 * 1024;
/// Alignment of memory, offset and length for O_DIRECT: 4096 covers disks
/// of 512-byte and of 4 KiB sectors.
pub(super) const DIRECT_ALIGN: usize = 4096;

/// One page of a page-aligned buffer.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub(super) struct AlignedPage([u8; DIRECT_ALIGN]);

/// `data` (a multiple of `DIRECT_ALIGN` long) copied into page-aligned
/// memory. The chunk cache keeps these copies, so the next one is often
/// memory the process never touched: its pages are faulted in with one
/// madvise(MADV_POPULATE_WRITE) call instead of a fault per page (a
/// quarter less CPU per GB on the test VM, docs/PERFORMANCE.md).
pub(super) fn aligned_copy(data: &[u8]) -> Vec<AlignedPage> {
    assert!(data.len().is_multiple_of(DIRECT_ALIGN), "whole pages only");
    let pages = data.len() / DIRECT_ALIGN;
    let mut out: Vec<AlignedPage> = Vec::with_capacity(pages);
    if pages > 0 {
        // SAFETY: the range is this Vec's own allocation, page-aligned
        // (AlignedPage's alignment) and `pages` pages long; the call only
        // faults pages in (an old kernel answers EINVAL: no harm).
        unsafe {
            libc::madvise(
                out.as_mut_ptr().cast::<libc::c_void>(),
                pages * DIRECT_ALIGN,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }
    // SAFETY: the capacity holds `data.len()` bytes; AlignedPage is plain
    // bytes, so once copied every page is initialized.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), out.as_mut_ptr().cast::<u8>(), data.len());
        out.set_len(pages);
    }
    out
}

pub(super) fn page_bytes_mut(pages: &mut [AlignedPage]) -> &mut [u8] {
    // SAFETY: as for `page_bytes`; the borrow is exclusive.
    unsafe {
        std::slice::from_raw_parts_mut(
            pages.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(pages),
        )
    }
}

/// Page-aligned bytes: the first `len` bytes of `pages`. What a direct
/// write wrote or a direct read read, handed to the chunk cache as is.
pub(super) struct PageBuf {
    pub(super) pages: Vec<AlignedPage>,
    pub(super) len: usize,
}

impl CacheBytes for PageBuf {
    fn bytes(&self) -> &[u8] {
        &page_bytes(&self.pages)[..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut page_bytes_mut(&mut self.pages)[..self.len]
    }
    fn footprint(&self) -> usize {
        self.pages.capacity() * DIRECT_ALIGN
    }
}

pub(super) fn page_bytes(pages: &[AlignedPage]) -> &[u8] {
    // SAFETY: AlignedPage is repr(C) around a byte array whose size equals
    // its alignment, so the pages are contiguous bytes with no padding,
    // borrowed for as long as `pages`.
    unsafe { std::slice::from_raw_parts(pages.as_ptr().cast::<u8>(), std::mem::size_of_val(pages)) }
}

/// Turn O_DIRECT on or off for the descriptor `f` (its own open file
/// description: each call opens the chunk file afresh). The same
/// descriptor, not a second open of the path, so a chunk file removed and
/// made again by racing requests is never mixed up with the one this
/// request opened. Direct writes still need the fsync every write gets
/// (size and block map); their data does not wait in the page cache.
pub(super) fn set_direct(f: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor this File owns; F_GETFL/F_SETFL only
    // read and set its status flags.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let want = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if want != flags && unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, want) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the page cache holds every page of `len` bytes at `offset` of
/// `f` (false where the kernel cannot say).
pub(super) fn fully_cached(f: &File, offset: u64, len: usize) -> bool {
    let pages = offset.saturating_add(len as u64).div_ceil(4096) - offset / 4096;
    cached_pages(f, offset, len).is_some_and(|n| n >= pages)
}

/// How many pages of `len` bytes at `offset` of `f` the page cache holds,
/// by cachestat(2) (Linux 6.5), which unlike a probing read starts no
/// readahead; None where the kernel lacks it.
pub(super) fn cached_pages(f: &File, offset: u64, len: usize) -> Option<u64> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451; // one number on every architecture
    let range = Range {
        off: offset,
        len: len as u64,
    };
    let mut stat = CacheStat::default();
    // SAFETY: both structs are the kernel's layout and outlive the call;
    // the descriptor is open; the flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut CacheStat,
            0u32,
        )
    };
    (rc == 0).then_some(stat.nr_cache)
}

/// Read into `buf` at `offset` (page-aligned) of `f` with O_DIRECT,
/// through a page-aligned buffer; how many bytes (fewer at the end of the
/// file), and that buffer. `f` is left direct.
pub(super) fn read_direct(
    f: &File,
    buf: &mut [u8],
    offset: u64,
) -> io::Result<(usize, Vec<AlignedPage>)> {
    set_direct(f, true)?;
    let mut pages = vec![AlignedPage([0; DIRECT_ALIGN]); buf.len().div_ceil(DIRECT_ALIGN)];
    let bytes = page_bytes_mut(&mut pages);
    let mut done = 0;
    while done < bytes.len() {
        match f.read_at(&mut bytes[done..], offset + done as u64)? {
            0 => break,
            k => done += k,
        }
    }
    let k = done.min(buf.len());
    buf[..k].copy_from_slice(&bytes[..k]);
    Ok((k, pages))
}

/// Ask the kernel to start writing `f`'s dirty pages without waiting
/// (a hint: errors surface in the fsync that follows).
pub(super) fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only schedules I/O.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}
