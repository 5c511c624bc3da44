//! POSIX conformance of the FUSE mount (`madfs mount`), after what
//! pjdfstest covers: chmod, chown, link, mkdir, open, rename, rmdir,
//! symlink/readlink, truncate, unlink, utimensat, access, mknod, name and
//! path limits, and the permission checks for an unprivileged user. Every
//! case asserts the exact errno Linux gives on a local file system.
//!
//! Each area runs on its own 3-server cluster and mount. The unprivileged
//! user is nobody (65534), reached by a forked child that drops its
//! credentials (`posix::as_user`); the mount allows other users.
//!
//! `cargo test --test fuse_posix -- --ignored reference_run_on_local_fs`
//! runs every case on a directory of the local file system instead: the
//! check that the expectations themselves are Linux's.
//!
//! What the mount does not do by design is listed, with reasons, in
//! docs/CONFORMANCE-EXCLUSIONS.md and is not tested here.

mod common;
#[path = "common/mount.rs"]
mod mount;
#[path = "common/posix.rs"]
mod posix;

use common::{block_on_thread, TestCluster};
use madfs_client::FileName;
use madfs_types::dentry_server;
use mount::Mount;
use posix::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SERVERS: usize = 3;

/// Where one area's cases run: a fresh directory `dir` (root's, 0755) in
/// the file system under test, and the cluster behind it, if any.
struct Cx<'a> {
    root: PathBuf,
    dir: PathBuf,
    tc: Option<&'a TestCluster>,
}

impl Cx<'_> {
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// A directory `rel` with mode `mode` (set by chmod, past the umask).
    fn mkdir_mode(&self, rel: &str, mode: u32) -> PathBuf {
        let p = self.p(rel);
        expect(mkdir(&p, 0o700), 0, &format!("mkdir {rel}"));
        expect(chmod(&p, mode), 0, &format!("chmod {rel}"));
        p
    }

    /// The server holding the entry `name` of directory `dir` (None off a
    /// cluster).
    fn home(&self, dir: &Path, name: &str) -> Option<u16> {
        let tc = self.tc?;
        let rel = dir.strip_prefix(&self.root).expect("dir under the root");
        let path = format!("/{}", rel.display());
        let c = tc.client();
        let parent = block_on_thread(c.stat(path.as_str()))
            .expect("stat via client")
            .ino;
        Some(
            dentry_server(
                parent,
                &FileName::new(name.as_bytes()).unwrap(),
                tc.server_count(),
            )
            .0,
        )
    }

    /// Two names (from `prefix`) in `dir` whose entries are on the same
    /// server (`same`) or on different servers.
    fn name_pair(&self, dir: &Path, prefix: &str, same: bool) -> (String, String) {
        let first = format!("{prefix}0");
        let Some(h0) = self.home(dir, &first) else {
            return (first, format!("{prefix}1"));
        };
        for i in 1..1000 {
            let n = format!("{prefix}{i}");
            if (self.home(dir, &n) == Some(h0)) == same {
                return (first, n);
            }
        }
        panic!("no name pair found");
    }
}

/// The process umask (from /proc, without changing it).
fn umask() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
}

/// Wait (bounded) until the clock is `d` past `t` seconds.nanoseconds, so
/// that a later change gets a strictly later timestamp even on file systems
/// with coarse clocks.
fn wait_past(sec: i64, nsec: i64, d: Duration) {
    let t = UNIX_EPOCH + Duration::new(sec as u64, nsec as u32) + d;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while SystemTime::now() < t {
        assert!(
            std::time::Instant::now() < deadline,
            "clock does not advance"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn ctime_ns(p: &Path) -> i128 {
    let m = lstat(p);
    m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128
}

fn mtime_ns(p: &Path) -> i128 {
    let m = lstat(p);
    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

// ---- running ------------------------------------------------------------

/// Run `case` in a fresh directory on a new cluster's mount.
fn on_mount(area: &str, case: Case) {
    let tc = TestCluster::start(SERVERS);
    let m = Mount::new(&tc);
    let dir = m.join(area);
    expect(mkdir(&dir, 0o755), 0, "mkdir area");
    expect(chmod(&dir, 0o755), 0, "chmod area");
    case(&Cx {
        root: m.path().to_path_buf(),
        dir,
        tc: Some(&tc),
    });
    drop(m);
}

/// One area's cases.
type Case = fn(&Cx);

const AREAS: &[(&str, Case)] = &[
    ("chmod", chmod_cases),
    ("chown", chown_cases),
    ("link", link_cases),
    ("mkdir", mkdir_cases),
    ("open", open_cases),
    ("rename", rename_cases),
    ("rmdir", rmdir_cases),
    ("symlink", symlink_cases),
    ("truncate", truncate_cases),
    ("unlink", unlink_cases),
    ("utimensat", utimensat_cases),
    ("names", name_cases),
    ("access", access_cases),
    ("mknod", mknod_cases),
    ("readdir", readdir_cases),
    ("dirtimes", dir_times_cases),
];

/// Every case on a directory of the local file system: checks the
/// expectations of this suite against Linux itself.
#[test]
#[ignore = "checks the suite against the local file system; run by hand"]
fn reference_run_on_local_fs() {
    let base = tempfile::Builder::new()
        .prefix("madfs-posix-ref-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (area, case) in AREAS {
        let dir = base.path().join(area);
        expect(mkdir(&dir, 0o755), 0, "mkdir area");
        eprintln!("reference: {area}");
        case(&Cx {
            root: base.path().to_path_buf(),
            dir,
            tc: None,
        });
    }
}

macro_rules! area_tests {
    ($($name:ident => $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                on_mount(stringify!($name), $case);
            }
        )*
    };
}

area_tests! {
    chmod_conforms => chmod_cases,
    chown_conforms => chown_cases,
    link_conforms => link_cases,
    mkdir_conforms => mkdir_cases,
    open_conforms => open_cases,
    rename_conforms => rename_cases,
    rmdir_conforms => rmdir_cases,
    symlink_conforms => symlink_cases,
    truncate_conforms => truncate_cases,
    unlink_conforms => unlink_cases,
    utimensat_conforms => utimensat_cases,
    name_and_path_limits_conform => name_cases,
    access_conforms => access_cases,
    mknod_conforms => mknod_cases,
    readdir_conforms => readdir_cases,
    directory_times_and_link_counts_conform => dir_times_cases,
}

// ---- chmod --------------------------------------------------------------

fn chmod_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"x");
    for mode in [0o600, 0o644, 0o4755, 0o2755, 0o1777, 0o7777, 0] {
        expect(chmod(&f, mode), 0, "chmod file");
        assert_eq!(perm(&f), mode, "file mode after chmod {mode:o}");
    }
    assert!(lstat(&f).is_file(), "chmod keeps the file type");

    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    for mode in [0o700, 0o1777, 0o2755, 0o755] {
        expect(chmod(&d, mode), 0, "chmod dir");
        assert_eq!(perm(&d), mode, "dir mode after chmod {mode:o}");
    }
    assert!(lstat(&d).is_dir());

    // chmod follows symlinks: the target changes, the link does not.
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(chmod(&l, 0o640), 0, "chmod through symlink");
    assert_eq!(perm(&f), 0o640);
    assert!(lstat(&l).file_type().is_symlink());

    // chmod updates ctime.
    let c0 = lstat(&f);
    wait_past(c0.ctime(), c0.ctime_nsec(), Duration::from_millis(20));
    let before = ctime_ns(&f);
    expect(chmod(&f, 0o644), 0, "chmod");
    assert!(ctime_ns(&f) > before, "chmod updates ctime");

    expect(
        chmod(&cx.p("missing"), 0o644),
        libc::ENOENT,
        "chmod missing",
    );
    expect(
        chmod(&cx.p("f/x"), 0o644),
        libc::ENOTDIR,
        "chmod through a file",
    );

    // Only the owner (or root) may chmod.
    let rootf = cx.p("rootf");
    put(&rootf, b"x");
    expect(chmod(&rootf, 0o666), 0, "chmod");
    let crootf = c(&rootf);
    expect(
        as_nobody(|| u_chmod(&crootf, 0o777)),
        libc::EPERM,
        "non-owner chmod",
    );
    assert_eq!(perm(&rootf), 0o666, "a refused chmod changes nothing");

    let mine = cx.p("mine");
    put(&mine, b"x");
    expect(chown(&mine, NOBODY, NOGROUP), 0, "chown to nobody");
    let cmine = c(&mine);
    expect(as_nobody(|| u_chmod(&cmine, 0o600)), 0, "owner chmod");
    assert_eq!(perm(&mine), 0o600);
    expect(
        as_nobody(|| u_chmod(&cmine, 0o4700)),
        0,
        "owner sets setuid",
    );
    assert_eq!(perm(&mine), 0o4700);

    // An owner outside the file's group asking for setgid: chmod succeeds
    // and the setgid bit is silently cleared (Linux, POSIX XSI).
    let notmember = cx.p("notmember");
    put(&notmember, b"x");
    expect(chown(&notmember, NOBODY, 0), 0, "chown nobody:root");
    let cnm = c(&notmember);
    expect(
        as_nobody(|| u_chmod(&cnm, 0o2755)),
        0,
        "non-member owner chmod g+s",
    );
    assert_eq!(
        perm(&notmember),
        0o755,
        "setgid must be cleared when the owner is not in the file's group"
    );
    // In the group (primary or supplementary): setgid stays.
    expect(
        as_user(NOBODY, 0, &[], || u_chmod(&cnm, 0o2755)),
        0,
        "member owner chmod g+s",
    );
    assert_eq!(
        perm(&notmember),
        0o2755,
        "primary group member keeps setgid"
    );
    expect(
        as_user(NOBODY, NOGROUP, &[0], || u_chmod(&cnm, 0o2750)),
        0,
        "supplementary member owner chmod g+s",
    );
    assert_eq!(
        perm(&notmember),
        0o2750,
        "supplementary group member keeps setgid"
    );
    // Root keeps setgid whatever the group.
    expect(chmod(&notmember, 0o2711), 0, "root chmod g+s");
    assert_eq!(perm(&notmember), 0o2711);

    // A write by a non-root user clears setuid and setgid (g+x).
    let w = cx.p("suidw");
    put(&w, b"x");
    expect(chmod(&w, 0o6777), 0, "chmod 6777");
    let cw = c(&w);
    expect(
        as_nobody(|| u_write(&cw, libc::O_WRONLY | libc::O_APPEND, b"more")),
        0,
        "write by another user",
    );
    assert_eq!(
        perm(&w),
        0o777,
        "a write by a non-root user clears setuid/setgid"
    );
    assert_eq!(read(&w), b"xmore");
}

// ---- chown --------------------------------------------------------------

fn chown_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"x");
    expect(chown(&f, NOBODY, NOGROUP), 0, "root chown");
    let m = lstat(&f);
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOGROUP));
    expect(chown(&f, u32::MAX, 100), 0, "root chown gid only");
    let m = lstat(&f);
    assert_eq!((m.uid(), m.gid()), (NOBODY, 100), "-1 leaves the uid");
    expect(chown(&f, 0, u32::MAX), 0, "root chown uid only");
    let m = lstat(&f);
    assert_eq!((m.uid(), m.gid()), (0, 100), "-1 leaves the gid");

    // chown follows symlinks; lchown does not.
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(chown(&l, 1000, 1000), 0, "chown through symlink");
    assert_eq!(lstat(&f).uid(), 1000);
    assert_eq!(lstat(&l).uid(), 0, "chown must not change the link");
    expect(lchown(&l, 2000, 2000), 0, "lchown");
    let ml = lstat(&l);
    assert_eq!(
        (ml.uid(), ml.gid()),
        (2000, 2000),
        "lchown changes the link"
    );
    assert_eq!(lstat(&f).uid(), 1000, "lchown leaves the target");

    // chown updates ctime.
    let c0 = lstat(&f);
    wait_past(c0.ctime(), c0.ctime_nsec(), Duration::from_millis(20));
    let before = ctime_ns(&f);
    expect(chown(&f, 0, 0), 0, "chown");
    assert!(ctime_ns(&f) > before, "chown updates ctime");

    expect(chown(&cx.p("missing"), 0, 0), libc::ENOENT, "chown missing");

    // A non-root owner may not give the file away, may change its group to
    // one of its groups only, and may "change" the uid to itself.
    let o = cx.p("owned");
    put(&o, b"x");
    expect(chown(&o, NOBODY, NOGROUP), 0, "chown");
    let co = c(&o);
    expect(
        as_nobody(|| u_chown(&co, 0, u32::MAX)),
        libc::EPERM,
        "non-root gives away",
    );
    expect(
        as_nobody(|| u_chown(&co, u32::MAX, 0)),
        libc::EPERM,
        "owner chgrp to a group it is not in",
    );
    expect(
        as_nobody(|| u_chown(&co, NOBODY, NOGROUP)),
        0,
        "owner chown to itself",
    );
    expect(
        as_user(NOBODY, NOGROUP, &[100], || u_chown(&co, u32::MAX, 100)),
        0,
        "owner chgrp to a supplementary group",
    );
    assert_eq!(lstat(&o).gid(), 100);
    expect(
        as_user(NOBODY, 0, &[], || u_chown(&co, u32::MAX, 0)),
        0,
        "owner chgrp to its primary group",
    );
    assert_eq!(lstat(&o).gid(), 0);
    assert_eq!(lstat(&o).uid(), NOBODY);
    // Not the owner: no chgrp even to an own group.
    let r = cx.p("rootowned");
    put(&r, b"x");
    let cr = c(&r);
    expect(
        as_nobody(|| u_chown(&cr, u32::MAX, NOGROUP)),
        libc::EPERM,
        "non-owner chgrp",
    );
    let m = lstat(&r);
    assert_eq!(
        (m.uid(), m.gid()),
        (0, 0),
        "a refused chown changes nothing"
    );

    // chown of a regular file clears setuid, and setgid when group-exec
    // is set (also when root does it).
    let s = cx.p("suid");
    put(&s, b"x");
    expect(chmod(&s, 0o6755), 0, "chmod 6755");
    expect(chown(&s, NOBODY, NOGROUP), 0, "root chown");
    assert_eq!(perm(&s), 0o755, "root chown clears setuid and setgid");
    expect(chmod(&s, 0o6755), 0, "chmod 6755 again");
    let cs = c(&s);
    expect(
        as_user(NOBODY, NOGROUP, &[100], || u_chown(&cs, u32::MAX, 100)),
        0,
        "owner chgrp",
    );
    assert_eq!(perm(&s), 0o755, "owner chgrp clears setuid and setgid");
    // Setgid without group-exec (mandatory locking marker) survives.
    expect(chmod(&s, 0o2745), 0, "chmod 2745");
    expect(chown(&s, 0, 0), 0, "root chown");
    assert_eq!(perm(&s), 0o2745, "setgid without g+x is kept");
    // Directories keep their bits.
    let d = cx.mkdir_mode("sgiddir", 0o2755);
    expect(chown(&d, NOBODY, NOGROUP), 0, "chown dir");
    assert_eq!(perm(&d), 0o2755, "chown keeps a directory's setgid");
}

// ---- link ---------------------------------------------------------------

fn link_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"hello");
    assert_eq!(lstat(&f).nlink(), 1);
    let g = cx.p("g");
    expect(link(&f, &g), 0, "link");
    let (mf, mg) = (lstat(&f), lstat(&g));
    assert_eq!(mf.ino(), mg.ino(), "a hard link is the same inode");
    assert_eq!((mf.nlink(), mg.nlink()), (2, 2), "nlink after link");
    // Another directory (another server, likely) too.
    let sub = cx.p("sub");
    expect(mkdir(&sub, 0o755), 0, "mkdir");
    let h = sub.join("h");
    expect(link(&g, &h), 0, "link into another directory");
    assert_eq!(lstat(&f).nlink(), 3);
    // Data written through one name is read through the others.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&h)
        .unwrap()
        .write_all_at_end(b" world");
    assert_eq!(read(&f), b"hello world");
    expect(unlink(&f), 0, "unlink");
    assert_eq!(lstat(&g).nlink(), 2, "nlink after unlinking one name");
    expect(unlink(&g), 0, "unlink");
    assert_eq!(lstat(&h).nlink(), 1);
    assert_eq!(read(&h), b"hello world", "the last name keeps the data");

    // link changes the inode's ctime.
    let c0 = lstat(&h);
    wait_past(c0.ctime(), c0.ctime_nsec(), Duration::from_millis(20));
    let before = ctime_ns(&h);
    expect(link(&h, &cx.p("h2")), 0, "link");
    assert!(ctime_ns(&h) > before, "link updates the inode's ctime");

    // Errors.
    put(&cx.p("other"), b"o");
    expect(link(&h, &cx.p("other")), libc::EEXIST, "link onto a file");
    expect(link(&h, &sub), libc::EEXIST, "link onto a directory");
    expect(symlink("nowhere", &cx.p("dangling")), 0, "symlink");
    expect(
        link(&h, &cx.p("dangling")),
        libc::EEXIST,
        "link onto a dangling symlink",
    );
    expect(
        link(&sub, &cx.p("dirlink")),
        libc::EPERM,
        "link to a directory",
    );
    expect(
        link(&cx.p("missing"), &cx.p("x")),
        libc::ENOENT,
        "link from a missing file",
    );
    expect(
        link(&h, &cx.p("nodir/x")),
        libc::ENOENT,
        "link into a missing directory",
    );
    expect(
        link(&cx.p("other/x"), &cx.p("y")),
        libc::ENOTDIR,
        "link from a path through a file",
    );
    expect(
        link(&h, &cx.p("other/y")),
        libc::ENOTDIR,
        "link to a path through a file",
    );
    assert!(!exists(&cx.p("x")) && !exists(&cx.p("y")));

    // link(2) does not follow a symlink: the new name is the symlink.
    let sl = cx.p("sl");
    expect(symlink("other", &sl), 0, "symlink");
    expect(link(&sl, &cx.p("sl2")), 0, "link a symlink");
    let m = lstat(&cx.p("sl2"));
    assert!(m.file_type().is_symlink(), "link of a symlink is a symlink");
    assert_eq!(m.ino(), lstat(&sl).ino());
    assert_eq!(std::fs::read_link(cx.p("sl2")).unwrap(), Path::new("other"));

    // A user without write permission on the directory may not link.
    // (Linux's protected_hardlinks refuses linking others' files: nobody
    // links its own.)
    let ro = cx.mkdir_mode("ro", 0o755);
    let own = cx.p("own");
    put(&own, b"o");
    expect(chown(&own, NOBODY, NOGROUP), 0, "chown");
    let (ch, cdst) = (c(&own), c(ro.join("x")));
    expect(
        as_nobody(|| u_link(&ch, &cdst)),
        libc::EACCES,
        "link into a directory without write permission",
    );
    // Nor link a file it cannot reach.
    let hidden = cx.mkdir_mode("hidden", 0o700);
    put(&hidden.join("f"), b"h");
    let pubd = cx.mkdir_mode("pub", 0o777);
    let (chid, cpub) = (c(hidden.join("f")), c(pubd.join("x")));
    expect(
        as_nobody(|| u_link(&chid, &cpub)),
        libc::EACCES,
        "link from a directory without search permission",
    );
}

trait WriteAllAtEnd {
    fn write_all_at_end(self, data: &[u8]);
}

impl WriteAllAtEnd for std::fs::File {
    fn write_all_at_end(mut self, data: &[u8]) {
        use std::io::Write;
        self.write_all(data).unwrap();
        self.sync_all().unwrap();
    }
}

// ---- mkdir --------------------------------------------------------------

fn mkdir_cases(cx: &Cx) {
    let um = umask();
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    let m = lstat(&d);
    assert!(m.is_dir());
    assert_eq!(m.mode() & 0o7777, 0o755 & !um, "mode under the umask");
    assert_eq!(m.nlink(), 2, "an empty directory has two links");
    assert_eq!((m.uid(), m.gid()), (0, 0), "owner is the caller");
    expect(mkdir(&cx.p("d2"), 0o711), 0, "mkdir 0711");
    assert_eq!(perm(&cx.p("d2")), 0o711 & !um);
    expect(mkdir(&cx.p("sticky"), 0o1777), 0, "mkdir 01777");
    assert_eq!(perm(&cx.p("sticky")), 0o1777 & !um, "sticky bit kept");
    expect(
        mkdir(&cx.p("trailing/"), 0o755),
        0,
        "mkdir with a trailing slash",
    );
    assert!(lstat(&cx.p("trailing")).is_dir());
    // Nested, and a listing shows it.
    expect(mkdir(&d.join("e"), 0o755), 0, "nested mkdir");
    assert_eq!(ls(&d), vec!["e"]);

    expect(mkdir(&d, 0o755), libc::EEXIST, "mkdir existing directory");
    put(&cx.p("f"), b"");
    expect(mkdir(&cx.p("f"), 0o755), libc::EEXIST, "mkdir onto a file");
    expect(symlink("nowhere", &cx.p("dl")), 0, "symlink");
    expect(
        mkdir(&cx.p("dl"), 0o755),
        libc::EEXIST,
        "mkdir onto a dangling symlink",
    );
    expect(
        mkdir(&cx.p("missing/x"), 0o755),
        libc::ENOENT,
        "mkdir in a missing directory",
    );
    expect(
        mkdir(&cx.p("f/x"), 0o755),
        libc::ENOTDIR,
        "mkdir under a file",
    );

    // Permissions: write and search on the parent are needed.
    let ro = cx.mkdir_mode("ro", 0o755);
    let cro = c(ro.join("x"));
    expect(
        as_nobody(|| u_mkdir(&cro, 0o755)),
        libc::EACCES,
        "mkdir without write permission",
    );
    let nox = cx.mkdir_mode("nox", 0o776);
    let cnox = c(nox.join("x"));
    expect(
        as_nobody(|| u_mkdir(&cnox, 0o755)),
        libc::EACCES,
        "mkdir without search permission",
    );
    let pubd = cx.mkdir_mode("pub", 0o777);
    let cpub = c(pubd.join("mine"));
    expect(as_nobody(|| u_mkdir(&cpub, 0o700)), 0, "mkdir by nobody");
    let m = lstat(&pubd.join("mine"));
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOGROUP), "owner is the caller");

    // A setgid directory passes its group and its setgid bit down.
    let sg = cx.mkdir_mode("sgid", 0o2777);
    expect(chown(&sg, 0, 100), 0, "chgrp");
    let csub = c(sg.join("sub"));
    let cfile = c(sg.join("file"));
    expect(
        as_nobody(|| u_mkdir(&csub, 0o755)),
        0,
        "mkdir in setgid dir",
    );
    expect(
        as_nobody(|| u_write(&cfile, libc::O_WRONLY | libc::O_CREAT, b"x")),
        0,
        "create in setgid dir",
    );
    let ms = lstat(&sg.join("sub"));
    assert_eq!(ms.gid(), 100, "new directory takes the setgid dir's group");
    assert_eq!(ms.mode() & 0o2000, 0o2000, "new directory inherits setgid");
    let mf = lstat(&sg.join("file"));
    assert_eq!(mf.gid(), 100, "new file takes the setgid dir's group");
    assert_eq!(mf.uid(), NOBODY);
}

// ---- open ---------------------------------------------------------------

fn open_cases(cx: &Cx) {
    let um = umask();
    let f = cx.p("f");
    // O_CREAT makes a file with the mode under the umask, owned by the caller.
    let fd = open(&f, libc::O_CREAT | libc::O_WRONLY, 0o640).expect("create");
    expect(write_fd(fd, b"abc"), 0, "write");
    close(fd);
    let m = lstat(&f);
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o640 & !um);
    assert_eq!(m.len(), 3);
    // O_CREAT without O_EXCL opens the existing file and keeps its data.
    expect(
        open_rc(&f, libc::O_CREAT | libc::O_RDWR, 0o600),
        0,
        "O_CREAT on existing",
    );
    assert_eq!(read(&f), b"abc");
    assert_eq!(perm(&f), 0o640 & !um, "mode of an existing file is kept");

    expect(
        open_rc(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        libc::EEXIST,
        "O_EXCL on an existing file",
    );
    expect(symlink("nowhere", &cx.p("dl")), 0, "symlink");
    expect(
        open_rc(
            &cx.p("dl"),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        ),
        libc::EEXIST,
        "O_EXCL on a dangling symlink",
    );
    assert!(!exists(&cx.p("nowhere")), "O_EXCL must not follow the link");
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    expect(
        open_rc(&d, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        libc::EEXIST,
        "O_EXCL on a directory",
    );
    expect(
        open_rc(&d, libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EISDIR,
        "O_CREAT on a directory",
    );
    expect(
        open_rc(&d, libc::O_WRONLY, 0),
        libc::EISDIR,
        "O_WRONLY on a directory",
    );
    expect(
        open_rc(&d, libc::O_RDWR, 0),
        libc::EISDIR,
        "O_RDWR on a directory",
    );
    expect(open_rc(&d, libc::O_RDONLY, 0), 0, "O_RDONLY on a directory");
    expect(
        open_rc(&d, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        0,
        "O_DIRECTORY on a directory",
    );
    expect(
        open_rc(&f, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        libc::ENOTDIR,
        "O_DIRECTORY on a file",
    );
    expect(
        open_rc(&cx.p("missing"), libc::O_RDONLY, 0),
        libc::ENOENT,
        "open missing",
    );
    expect(
        open_rc(&cx.p("missing/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENOENT,
        "O_CREAT in a missing directory",
    );
    expect(
        open_rc(&cx.p("f/x"), libc::O_RDONLY, 0),
        libc::ENOTDIR,
        "open through a file",
    );
    expect(
        open_rc(&cx.p("f/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENOTDIR,
        "O_CREAT through a file",
    );
    expect(
        open_rc(&cx.p("f/"), libc::O_RDONLY, 0),
        libc::ENOTDIR,
        "a file with a trailing slash",
    );
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(
        open_rc(&l, libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        libc::ELOOP,
        "O_NOFOLLOW on a symlink",
    );
    expect(open_rc(&l, libc::O_RDONLY, 0), 0, "open through a symlink");

    // O_TRUNC.
    expect(open_rc(&f, libc::O_WRONLY | libc::O_TRUNC, 0), 0, "O_TRUNC");
    assert_eq!(lstat(&f).len(), 0, "O_TRUNC empties the file");
    put(&f, b"0123456789");
    expect(
        open_rc(&f, libc::O_RDWR | libc::O_TRUNC | libc::O_CREAT, 0o644),
        0,
        "O_CREAT|O_TRUNC on existing",
    );
    assert_eq!(lstat(&f).len(), 0);

    // O_APPEND writes at the end whatever the offset.
    put(&f, b"abc");
    let a = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    assert_eq!(lseek(a, 0, libc::SEEK_SET), 0);
    expect(write_fd(a, b"def"), 0, "append");
    close(a);
    assert_eq!(read(&f), b"abcdef", "O_APPEND appends");
    // Also with two descriptors appending in turn: each write lands at the
    // end the other one left.
    put(&f, b"abc");
    let a = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    let b = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).expect("open append");
    assert_eq!(lseek(a, 0, libc::SEEK_SET), 0);
    expect(write_fd(a, b"def"), 0, "append");
    expect(write_fd(b, b"ghi"), 0, "append");
    expect(write_fd(a, b"jkl"), 0, "append");
    close(a);
    close(b);
    assert_eq!(
        read(&f),
        b"abcdefghijkl",
        "two O_APPEND descriptors interleaved"
    );
    // Without O_APPEND a write at offset 0 overwrites.
    let w = open(&f, libc::O_WRONLY, 0).expect("open");
    expect(write_fd(w, b"XY"), 0, "write");
    close(w);
    assert_eq!(read(&f), b"XYcdefghijkl");

    // Access mode of the descriptor.
    let r = open(&f, libc::O_RDONLY, 0).expect("open");
    expect(write_fd(r, b"x"), libc::EBADF, "write on O_RDONLY");
    close(r);
    let w = open(&f, libc::O_WRONLY, 0).expect("open");
    assert_eq!(read_fd(w, 4), Err(libc::EBADF), "read on O_WRONLY");
    // fsync and fdatasync work.
    // SAFETY: our descriptor.
    expect(rc(unsafe { libc::fsync(w) }), 0, "fsync");
    // SAFETY: our descriptor.
    expect(rc(unsafe { libc::fdatasync(w) }), 0, "fdatasync");
    close(w);
    let dfd = open(&d, libc::O_RDONLY | libc::O_DIRECTORY, 0).expect("open dir");
    // SAFETY: our descriptor.
    expect(rc(unsafe { libc::fsync(dfd) }), 0, "fsync on a directory");
    close(dfd);

    // Permission checks for another user.
    let secret = cx.p("secret");
    put(&secret, b"s");
    expect(chmod(&secret, 0o600), 0, "chmod");
    let readable = cx.p("readable");
    put(&readable, b"r");
    expect(chmod(&readable, 0o644), 0, "chmod");
    let (cs, cr) = (c(&secret), c(&readable));
    expect(
        as_nobody(|| u_open(&cs, libc::O_RDONLY, 0)),
        libc::EACCES,
        "read 0600",
    );
    expect(as_nobody(|| u_open(&cr, libc::O_RDONLY, 0)), 0, "read 0644");
    expect(
        as_nobody(|| u_open(&cr, libc::O_WRONLY, 0)),
        libc::EACCES,
        "write 0644",
    );
    expect(
        as_nobody(|| u_open(&cr, libc::O_RDWR, 0)),
        libc::EACCES,
        "rdwr 0644",
    );
    expect(
        as_nobody(|| u_open(&cr, libc::O_RDONLY | libc::O_TRUNC, 0)),
        libc::EACCES,
        "O_TRUNC needs write permission",
    );
    assert_eq!(read(&readable), b"r");
    // Group class: nobody in the file's group gets the group bits.
    expect(chmod(&secret, 0o640), 0, "chmod");
    expect(
        as_user(NOBODY, 0, &[], || u_open(&cs, libc::O_RDONLY, 0)),
        0,
        "group read",
    );
    expect(
        as_user(NOBODY, NOGROUP, &[0], || u_open(&cs, libc::O_RDONLY, 0)),
        0,
        "supplementary group read",
    );
    expect(
        as_user(NOBODY, 0, &[], || u_open(&cs, libc::O_WRONLY, 0)),
        libc::EACCES,
        "group write on 0640",
    );
    // The owner class decides even when others would get more.
    let own = cx.p("own");
    put(&own, b"o");
    expect(chown(&own, NOBODY, NOGROUP), 0, "chown");
    expect(chmod(&own, 0o066), 0, "chmod 066");
    let co = c(&own);
    expect(
        as_nobody(|| u_open(&co, libc::O_RDONLY, 0)),
        libc::EACCES,
        "owner without owner bits",
    );
    // Root reads and writes whatever the mode.
    expect(chmod(&secret, 0), 0, "chmod 0");
    expect(open_rc(&secret, libc::O_RDWR, 0), 0, "root opens mode 0");
    // Creating needs write+search on the directory; searching needs x.
    let cnew = c(cx.p("new"));
    expect(
        as_nobody(|| u_open(&cnew, libc::O_CREAT | libc::O_WRONLY, 0o644)),
        libc::EACCES,
        "create in a 0755 root directory",
    );
    let priv_ = cx.mkdir_mode("priv", 0o700);
    put(&priv_.join("f"), b"p");
    expect(chmod(&priv_.join("f"), 0o644), 0, "chmod");
    let cpf = c(priv_.join("f"));
    expect(
        as_nobody(|| u_open(&cpf, libc::O_RDONLY, 0)),
        libc::EACCES,
        "open in a directory without search permission",
    );
    let pubd = cx.mkdir_mode("pub", 0o777);
    let cpn = c(pubd.join("n"));
    expect(
        as_nobody(|| u_write(&cpn, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, b"n")),
        0,
        "create by nobody",
    );
    let m = lstat(&pubd.join("n"));
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOGROUP), "owner of a new file");
    assert_eq!(read(&pubd.join("n")), b"n");
}

// ---- rename -------------------------------------------------------------

fn rename_cases(cx: &Cx) {
    for same in [true, false] {
        let tag = if same { "same server" } else { "cross server" };
        let sub = cx.p(if same { "same" } else { "cross" });
        expect(mkdir(&sub, 0o755), 0, "mkdir");
        let (a, b) = cx.name_pair(&sub, "n", same);
        let (pa, pb) = (sub.join(&a), sub.join(&b));

        // A file to a new name.
        put(&pa, b"content");
        let ino = lstat(&pa).ino();
        expect(rename(&pa, &pb), 0, &format!("rename file ({tag})"));
        assert!(!exists(&pa), "old name gone ({tag})");
        assert_eq!(read(&pb), b"content");
        assert_eq!(lstat(&pb).ino(), ino, "rename keeps the inode ({tag})");
        assert_eq!(ls(&sub), vec![b.clone()]);

        // A file over an existing file: the target is replaced, and its
        // inode loses a link.
        put(&pa, b"new");
        let keep = cx.p(&format!("keep-{same}"));
        expect(link(&pb, &keep), 0, "link");
        assert_eq!(lstat(&keep).nlink(), 2);
        expect(rename(&pa, &pb), 0, &format!("rename over a file ({tag})"));
        assert_eq!(read(&pb), b"new");
        assert!(!exists(&pa));
        assert_eq!(
            lstat(&keep).nlink(),
            1,
            "replaced target loses a link ({tag})"
        );
        assert_eq!(read(&keep), b"content");
        expect(unlink(&pb), 0, "unlink");

        // A directory with contents to a new name; `..` follows.
        expect(mkdir(&pa, 0o755), 0, "mkdir");
        expect(mkdir(&pa.join("inner"), 0o755), 0, "mkdir");
        put(&pa.join("inner/file"), b"deep");
        expect(rename(&pa, &pb), 0, &format!("rename dir ({tag})"));
        assert_eq!(read(&pb.join("inner/file")), b"deep");
        assert_eq!(
            lstat(&pb.join("inner/..")).ino(),
            lstat(&pb).ino(),
            "`..` of a child of a renamed directory"
        );
        assert!(!exists(&pa));
        // A directory over an empty directory.
        expect(mkdir(&pa, 0o755), 0, "mkdir");
        expect(
            rename(&pb, &pa),
            0,
            &format!("rename dir over empty dir ({tag})"),
        );
        assert_eq!(read(&pa.join("inner/file")), b"deep");
        assert!(!exists(&pb));
        // A directory over a non-empty directory.
        expect(mkdir(&pb, 0o755), 0, "mkdir");
        put(&pb.join("x"), b"x");
        let r = rename(&pa, &pb);
        assert!(
            r == libc::ENOTEMPTY || r == libc::EEXIST,
            "dir over non-empty dir ({tag}): expected ENOTEMPTY or EEXIST, got {}",
            errno_name(r)
        );
        assert_eq!(read(&pa.join("inner/file")), b"deep", "source untouched");
        assert_eq!(read(&pb.join("x")), b"x", "target untouched");
        expect(unlink(&pb.join("x")), 0, "unlink");
        expect(rmdir(&pb), 0, "rmdir");
        // A directory over a file, a file over a directory.
        put(&pb, b"file");
        expect(
            rename(&pa, &pb),
            libc::ENOTDIR,
            &format!("dir over file ({tag})"),
        );
        expect(
            rename(&pb, &pa),
            libc::EISDIR,
            &format!("file over dir ({tag})"),
        );
        assert_eq!(read(&pb), b"file");
        assert!(lstat(&pa).is_dir());
        // RENAME_NOREPLACE.
        expect(
            renameat2(&pb, &pa, libc::RENAME_NOREPLACE),
            libc::EEXIST,
            &format!("RENAME_NOREPLACE onto a dir ({tag})"),
        );
        let pc = sub.join("fresh");
        put(&pc, b"c");
        expect(
            renameat2(&pc, &pb, libc::RENAME_NOREPLACE),
            libc::EEXIST,
            &format!("RENAME_NOREPLACE onto a file ({tag})"),
        );
        assert_eq!(read(&pb), b"file");
        assert_eq!(read(&pc), b"c");
        expect(unlink(&pb), 0, "unlink");
        expect(
            renameat2(&pc, &pb, libc::RENAME_NOREPLACE),
            0,
            &format!("RENAME_NOREPLACE to a free name ({tag})"),
        );
        assert_eq!(read(&pb), b"c");
        assert!(!exists(&pc));
        // A file over a symlink replaces the link, not its target.
        put(&pc, b"target");
        let sl = sub.join("sl");
        expect(symlink("fresh", &sl), 0, "symlink");
        expect(rename(&pb, &sl), 0, &format!("file over a symlink ({tag})"));
        assert!(lstat(&sl).is_file());
        assert_eq!(read(&sl), b"c");
        assert_eq!(read(&pc), b"target");
    }

    // Across directories, both ways.
    let d1 = cx.p("d1");
    let d2 = cx.p("d2");
    expect(mkdir(&d1, 0o755), 0, "mkdir");
    expect(mkdir(&d2, 0o755), 0, "mkdir");
    for i in 0..8 {
        put(&d1.join(format!("f{i}")), format!("{i}").as_bytes());
        expect(
            rename(&d1.join(format!("f{i}")), &d2.join(format!("g{i}"))),
            0,
            "rename across directories",
        );
    }
    assert!(ls(&d1).is_empty());
    assert_eq!(ls(&d2).len(), 8);
    assert_eq!(read(&d2.join("g5")), b"5");
    expect(mkdir(&d1.join("sub"), 0o755), 0, "mkdir");
    expect(rename(&d1.join("sub"), &d2.join("sub")), 0, "move a dir");
    assert_eq!(
        lstat(&d2.join("sub/..")).ino(),
        lstat(&d2).ino(),
        "`..` of a moved directory"
    );

    // Into its own subtree.
    let top = cx.p("top");
    expect(mkdir(&top, 0o755), 0, "mkdir");
    expect(mkdir(&top.join("mid"), 0o755), 0, "mkdir");
    expect(
        rename(&top, &top.join("mid/top")),
        libc::EINVAL,
        "dir into its own subtree",
    );
    expect(
        rename(&top, &top.join("x")),
        libc::EINVAL,
        "dir into itself",
    );
    assert!(lstat(&top.join("mid")).is_dir());

    // Same file: a no-op that succeeds.
    let s1 = cx.p("s1");
    put(&s1, b"s");
    expect(rename(&s1, &s1), 0, "rename onto itself");
    let s2 = cx.p("s2");
    expect(link(&s1, &s2), 0, "link");
    expect(rename(&s1, &s2), 0, "rename onto another link of itself");
    assert!(exists(&s1) && exists(&s2), "both links stay");
    assert_eq!(lstat(&s1).nlink(), 2);

    // Errors.
    expect(
        rename(&cx.p("missing"), &cx.p("x")),
        libc::ENOENT,
        "missing source",
    );
    expect(
        rename(&s1, &cx.p("nodir/x")),
        libc::ENOENT,
        "missing target directory",
    );
    expect(
        rename(&cx.p("s1/x"), &cx.p("x")),
        libc::ENOTDIR,
        "source through a file",
    );
    expect(
        rename(&s1, &cx.p("s2/x")),
        libc::ENOTDIR,
        "target through a file",
    );
    assert!(exists(&s1));

    // RENAME_EXCHANGE of two entries on one server (across servers it is a
    // documented gap: docs/CONFORMANCE-EXCLUSIONS.md).
    let ex = cx.p("ex");
    expect(mkdir(&ex, 0o755), 0, "mkdir");
    let (a, b) = cx.name_pair(&ex, "x", true);
    let (pa, pb) = (ex.join(&a), ex.join(&b));
    put(&pa, b"A");
    expect(mkdir(&pb, 0o755), 0, "mkdir");
    expect(
        renameat2(&pa, &pb, libc::RENAME_EXCHANGE),
        0,
        "RENAME_EXCHANGE on one server",
    );
    assert!(lstat(&pa).is_dir());
    assert_eq!(read(&pb), b"A");
    expect(
        renameat2(&pa, &ex.join("absent"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "RENAME_EXCHANGE with a missing target",
    );

    // Permissions: write on both directories; the sticky bit.
    let ro = cx.mkdir_mode("ro", 0o755);
    put(&ro.join("f"), b"f");
    let pubd = cx.mkdir_mode("pub", 0o777);
    let (crf, cpx) = (c(ro.join("f")), c(pubd.join("x")));
    expect(
        as_nobody(|| u_rename(&crf, &cpx)),
        libc::EACCES,
        "rename out of a directory without write permission",
    );
    put(&pubd.join("mine"), b"m");
    expect(chown(&pubd.join("mine"), NOBODY, NOGROUP), 0, "chown");
    let (cmine, cro) = (c(pubd.join("mine")), c(ro.join("mine")));
    expect(
        as_nobody(|| u_rename(&cmine, &cro)),
        libc::EACCES,
        "rename into a directory without write permission",
    );
    let sticky = cx.mkdir_mode("sticky", 0o1777);
    put(&sticky.join("roots"), b"r");
    put(&sticky.join("nobodys"), b"n");
    expect(chown(&sticky.join("nobodys"), NOBODY, NOGROUP), 0, "chown");
    let (croot, cmv, cnb, cnb2) = (
        c(sticky.join("roots")),
        c(sticky.join("moved")),
        c(sticky.join("nobodys")),
        c(sticky.join("nobodys2")),
    );
    expect(
        as_nobody(|| u_rename(&croot, &cmv)),
        libc::EPERM,
        "rename another user's file in a sticky directory",
    );
    expect(
        as_nobody(|| u_rename(&cnb, &croot)),
        libc::EPERM,
        "rename over another user's file in a sticky directory",
    );
    expect(
        as_nobody(|| u_rename(&cnb, &cnb2)),
        0,
        "rename an own file in a sticky directory",
    );
    // Moving a directory to another parent needs write permission on it
    // (its `..` changes).
    let owned_dir = pubd.join("rootdir");
    expect(mkdir(&owned_dir, 0o755), 0, "mkdir");
    let dst = cx.mkdir_mode("pub2", 0o777);
    let (cod, cdst) = (c(&owned_dir), c(dst.join("rootdir")));
    expect(
        as_nobody(|| u_rename(&cod, &cdst)),
        libc::EACCES,
        "move another user's directory without write permission on it",
    );
}

// ---- rmdir --------------------------------------------------------------

fn rmdir_cases(cx: &Cx) {
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    expect(rmdir(&d), 0, "rmdir");
    assert!(!exists(&d));
    assert!(ls(&cx.dir).is_empty());

    expect(mkdir(&d, 0o755), 0, "mkdir");
    put(&d.join("f"), b"");
    expect(rmdir(&d), libc::ENOTEMPTY, "rmdir with a file");
    expect(unlink(&d.join("f")), 0, "unlink");
    expect(mkdir(&d.join("sub"), 0o755), 0, "mkdir");
    expect(rmdir(&d), libc::ENOTEMPTY, "rmdir with a subdirectory");
    expect(rmdir(&d.join("sub")), 0, "rmdir");
    expect(symlink("x", &d.join("l")), 0, "symlink");
    expect(rmdir(&d), libc::ENOTEMPTY, "rmdir with a symlink");
    expect(unlink(&d.join("l")), 0, "unlink");
    // Many entries (over every server), then empty again.
    for i in 0..40 {
        put(&d.join(format!("e{i}")), b"");
    }
    expect(rmdir(&d), libc::ENOTEMPTY, "rmdir with many entries");
    for i in 0..39 {
        expect(unlink(&d.join(format!("e{i}"))), 0, "unlink");
        expect(rmdir(&d), libc::ENOTEMPTY, "rmdir with entries left");
    }
    expect(unlink(&d.join("e39")), 0, "unlink");
    expect(rmdir(&d), 0, "rmdir when emptied");
    // The name is free for anything.
    put(&d, b"now a file");

    expect(rmdir(&d), libc::ENOTDIR, "rmdir a file");
    expect(rmdir(&cx.p("d/x")), libc::ENOTDIR, "rmdir through a file");
    expect(rmdir(&cx.p("missing")), libc::ENOENT, "rmdir missing");
    expect(
        rmdir(&cx.p("missing/x")),
        libc::ENOENT,
        "rmdir in a missing dir",
    );
    let e = cx.p("e");
    expect(mkdir(&e, 0o755), 0, "mkdir");
    expect(symlink("e", &cx.p("le")), 0, "symlink");
    expect(
        rmdir(&cx.p("le")),
        libc::ENOTDIR,
        "rmdir a symlink to a dir",
    );
    expect(rmdir(&e.join(".")), libc::EINVAL, "rmdir dir/.");
    let r = rmdir(&e.join(".."));
    assert!(
        r == libc::ENOTEMPTY || r == libc::EBUSY,
        "rmdir dir/..: expected ENOTEMPTY, got {}",
        errno_name(r)
    );
    assert!(lstat(&e).is_dir());

    // Permissions and the sticky bit.
    let ro = cx.mkdir_mode("ro", 0o755);
    expect(mkdir(&ro.join("x"), 0o777), 0, "mkdir");
    let cx_ = c(ro.join("x"));
    expect(
        as_nobody(|| u_rmdir(&cx_)),
        libc::EACCES,
        "rmdir without write permission on the parent",
    );
    let sticky = cx.mkdir_mode("sticky", 0o1777);
    expect(mkdir(&sticky.join("roots"), 0o777), 0, "mkdir");
    let cr = c(sticky.join("roots"));
    expect(
        as_nobody(|| u_rmdir(&cr)),
        libc::EPERM,
        "rmdir another user's dir in a sticky dir",
    );
    let cm = c(sticky.join("mine"));
    expect(as_nobody(|| u_mkdir(&cm, 0o755)), 0, "mkdir by nobody");
    expect(
        as_nobody(|| u_rmdir(&cm)),
        0,
        "rmdir own dir in a sticky dir",
    );
    assert!(!exists(&sticky.join("mine")));
}

// ---- symlink / readlink -------------------------------------------------

fn symlink_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"data");
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    let m = lstat(&l);
    assert!(m.file_type().is_symlink());
    assert_eq!(m.len(), 1, "size of a symlink is its target's length");
    assert_eq!(m.mode() & 0o777, 0o777, "symlinks are 0777");
    assert_eq!(std::fs::read_link(&l).unwrap(), Path::new("f"));
    assert_eq!(read(&l), b"data", "open follows the link");
    assert!(stat(&l).is_file());

    // Absolute and relative targets, through directories.
    let sub = cx.p("sub");
    expect(mkdir(&sub, 0o755), 0, "mkdir");
    expect(symlink("../f", &sub.join("up")), 0, "symlink");
    assert_eq!(read(&sub.join("up")), b"data");
    expect(symlink(&f, &cx.p("abs")), 0, "absolute symlink");
    assert_eq!(read(&cx.p("abs")), b"data");
    assert_eq!(std::fs::read_link(cx.p("abs")).unwrap(), f);
    expect(symlink("sub", &cx.p("dl")), 0, "symlink to a dir");
    put(&cx.p("dl/through"), b"t");
    assert_eq!(
        read(&sub.join("through")),
        b"t",
        "a path through a dir link"
    );
    // Odd bytes are kept exactly.
    let odd = "a b\t\u{e9}/../\u{1F600}//x";
    expect(symlink(odd, &cx.p("odd")), 0, "symlink with odd bytes");
    assert_eq!(std::fs::read_link(cx.p("odd")).unwrap(), Path::new(odd));
    // The longest target (PATH_MAX - 1 bytes), and one byte more.
    let long = "x".repeat(4095);
    expect(symlink(&long, &cx.p("long")), 0, "4095-byte target");
    assert_eq!(
        std::fs::read_link(cx.p("long")).unwrap(),
        Path::new(&long),
        "readlink of a 4095-byte target"
    );
    assert_eq!(lstat(&cx.p("long")).len(), 4095);
    expect(
        symlink("x".repeat(4096), &cx.p("toolong")),
        libc::ENAMETOOLONG,
        "4096-byte target",
    );

    // Dangling.
    let dang = cx.p("dang");
    expect(symlink("nothing-here", &dang), 0, "dangling symlink");
    expect(stat_rc(&dang), libc::ENOENT, "stat of a dangling link");
    expect(lstat_rc(&dang), 0, "lstat of a dangling link");
    expect(
        open_rc(&dang, libc::O_RDONLY, 0),
        libc::ENOENT,
        "open a dangling link",
    );
    // Creating through a dangling link creates its target.
    expect(
        open_rc(&dang, libc::O_CREAT | libc::O_WRONLY, 0o644),
        0,
        "O_CREAT through a dangling link",
    );
    assert!(lstat(&cx.p("nothing-here")).is_file());

    // Loops.
    expect(symlink("loop2", &cx.p("loop1")), 0, "symlink");
    expect(symlink("loop1", &cx.p("loop2")), 0, "symlink");
    expect(symlink("self", &cx.p("self")), 0, "symlink");
    expect(stat_rc(&cx.p("loop1")), libc::ELOOP, "stat a loop");
    expect(
        open_rc(&cx.p("loop1"), libc::O_RDONLY, 0),
        libc::ELOOP,
        "open a loop",
    );
    expect(stat_rc(&cx.p("self")), libc::ELOOP, "stat a self loop");
    expect(
        stat_rc(&cx.p("loop1/x")),
        libc::ELOOP,
        "a loop in the middle of a path",
    );
    expect(lstat_rc(&cx.p("loop1")), 0, "lstat a loop");
    // A chain of 40 links resolves (the kernel's limit); 41 does not.
    put(&cx.p("c0"), b"end");
    for i in 1..=41 {
        expect(
            symlink(format!("c{}", i - 1), &cx.p(&format!("c{i}"))),
            0,
            "chain",
        );
    }
    assert_eq!(read(&cx.p("c40")), b"end", "40 links are followed");
    expect(stat_rc(&cx.p("c41")), libc::ELOOP, "41 links are too many");

    // Errors.
    expect(symlink("x", &f), libc::EEXIST, "symlink onto a file");
    expect(symlink("x", &sub), libc::EEXIST, "symlink onto a dir");
    expect(symlink("x", &l), libc::EEXIST, "symlink onto a symlink");
    expect(
        symlink("x", &dang),
        libc::EEXIST,
        "symlink onto a dangling symlink",
    );
    expect(
        symlink("x", &cx.p("missing/l")),
        libc::ENOENT,
        "symlink in a missing dir",
    );
    expect(
        symlink("x", &cx.p("f/l")),
        libc::ENOTDIR,
        "symlink through a file",
    );
    expect(symlink("", &cx.p("empty")), libc::ENOENT, "empty target");
    expect_err(std::fs::read_link(&f), libc::EINVAL, "readlink a file");
    expect_err(std::fs::read_link(&sub), libc::EINVAL, "readlink a dir");
    expect_err(
        std::fs::read_link(cx.p("missing")),
        libc::ENOENT,
        "readlink missing",
    );
    let ro = cx.mkdir_mode("ro", 0o755);
    let (ct, cl) = (c("t"), c(ro.join("l")));
    expect(
        as_nobody(|| u_symlink(&ct, &cl)),
        libc::EACCES,
        "symlink without write permission",
    );
    let pubd = cx.mkdir_mode("pub", 0o777);
    let cpl = c(pubd.join("l"));
    expect(as_nobody(|| u_symlink(&ct, &cpl)), 0, "symlink by nobody");
    let m = lstat(&pubd.join("l"));
    assert_eq!(
        (m.uid(), m.gid()),
        (NOBODY, NOGROUP),
        "owner of a new symlink"
    );
}

// ---- truncate -----------------------------------------------------------

fn truncate_cases(cx: &Cx) {
    // A descriptor keeps the access it was opened with: a user who creates
    // a file with mode 0 and O_RDWR writes and ftruncates through it
    // (pjdfstest ftruncate/00 test 24), while truncate by path, which
    // asks the mode, is refused.
    let pubd = cx.mkdir_mode("pub", 0o777);
    let zero = c(pubd.join("mode0"));
    expect(
        as_nobody(|| create_write_ftruncate(&zero)),
        0,
        "open(O_CREAT|O_RDWR, 0) + write + ftruncate as the creator",
    );
    let m = lstat(&pubd.join("mode0"));
    assert_eq!((m.mode() & 0o7777, m.len(), m.uid()), (0, 3, NOBODY));
    assert_eq!(read(&pubd.join("mode0")), b"abc");
    expect(
        as_nobody(|| u_truncate(&zero, 1)),
        libc::EACCES,
        "truncate by path of a mode-0 file",
    );
    // Everyone else still meets the mode: opening it to read is refused.
    expect(
        as_nobody(|| {
            // SAFETY: a valid C string; our descriptor.
            unsafe {
                let fd = libc::open(zero.as_ptr(), libc::O_RDONLY);
                if fd >= 0 {
                    libc::close(fd);
                    return 0;
                }
                errno()
            }
        }),
        libc::EACCES,
        "open to read a mode-0 file",
    );

    let f = cx.p("f");
    put(&f, b"0123456789");
    expect(truncate(&f, 4), 0, "shrink");
    assert_eq!(read(&f), b"0123");
    expect(truncate(&f, 8), 0, "grow");
    assert_eq!(read(&f), b"0123\0\0\0\0", "grown part reads zeros");
    expect(truncate(&f, 0), 0, "to zero");
    assert_eq!(lstat(&f).len(), 0);
    expect(truncate(&f, 0), 0, "to zero again");

    // Across chunk boundaries (test clusters use 1 MiB chunks): data past
    // a shrink never comes back.
    let big: Vec<u8> = (0..3 * 1024 * 1024 + 100)
        .map(|i| (i % 251) as u8)
        .collect();
    let g = cx.p("g");
    put(&g, &big);
    let cut = 1024 * 1024 + 512 * 1024;
    expect(truncate(&g, cut as i64), 0, "shrink over chunks");
    assert_eq!(lstat(&g).len(), cut as u64);
    expect(truncate(&g, big.len() as i64), 0, "grow over chunks");
    let back = read(&g);
    assert_eq!(back.len(), big.len());
    assert_eq!(&back[..cut], &big[..cut], "kept part");
    assert!(
        back[cut..].iter().all(|b| *b == 0),
        "no stale data after shrink+grow"
    );

    // A large sparse size.
    let sparse = cx.p("sparse");
    put(&sparse, b"s");
    let size: i64 = 5 << 30;
    expect(truncate(&sparse, size), 0, "grow to 5 GiB");
    assert_eq!(lstat(&sparse).len(), size as u64);
    let fd = open(&sparse, libc::O_RDONLY, 0).unwrap();
    assert_eq!(lseek(fd, size - 10, libc::SEEK_SET), size - 10);
    assert_eq!(
        read_fd(fd, 100).unwrap(),
        vec![0u8; 10],
        "tail of a sparse file"
    );
    close(fd);

    // ftruncate.
    let fd = open(&f, libc::O_RDWR, 0).unwrap();
    expect(write_fd(fd, b"abcdef"), 0, "write");
    expect(ftruncate(fd, 3), 0, "ftruncate shrink");
    expect(ftruncate(fd, 5), 0, "ftruncate grow");
    expect(ftruncate(fd, -1), libc::EINVAL, "ftruncate negative");
    close(fd);
    assert_eq!(read(&f), b"abc\0\0");
    let fd = open(&f, libc::O_RDONLY, 0).unwrap();
    expect(
        ftruncate(fd, 1),
        libc::EINVAL,
        "ftruncate a read-only descriptor",
    );
    close(fd);
    assert_eq!(lstat(&f).len(), 5);

    // truncate updates mtime and ctime.
    let m0 = lstat(&f);
    wait_past(m0.mtime(), m0.mtime_nsec(), Duration::from_millis(20));
    let (mt, ct) = (mtime_ns(&f), ctime_ns(&f));
    expect(truncate(&f, 2), 0, "truncate");
    assert!(mtime_ns(&f) > mt, "truncate updates mtime");
    assert!(ctime_ns(&f) > ct, "truncate updates ctime");

    // Errors.
    expect(truncate(&f, -1), libc::EINVAL, "negative length");
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    expect(truncate(&d, 0), libc::EISDIR, "truncate a directory");
    expect(
        truncate(&cx.p("missing"), 0),
        libc::ENOENT,
        "truncate missing",
    );
    expect(
        truncate(&cx.p("f/x"), 0),
        libc::ENOTDIR,
        "truncate through a file",
    );
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(truncate(&l, 1), 0, "truncate follows symlinks");
    assert_eq!(lstat(&f).len(), 1);
    let r = cx.p("r");
    put(&r, b"rrrr");
    expect(chmod(&r, 0o644), 0, "chmod");
    let cr = c(&r);
    expect(
        as_nobody(|| u_truncate(&cr, 1)),
        libc::EACCES,
        "truncate without write permission",
    );
    expect(chmod(&r, 0o666), 0, "chmod");
    expect(
        as_nobody(|| u_truncate(&cr, 1)),
        0,
        "truncate with write permission",
    );
    assert_eq!(read(&r), b"r");
}

// ---- unlink -------------------------------------------------------------

fn unlink_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"x");
    expect(unlink(&f), 0, "unlink");
    assert!(!exists(&f));
    expect(unlink(&f), libc::ENOENT, "unlink twice");
    expect(
        unlink(&cx.p("missing/x")),
        libc::ENOENT,
        "unlink in a missing dir",
    );
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    expect(
        unlink(&d),
        libc::EISDIR,
        "unlink a directory (Linux: EISDIR)",
    );
    assert!(lstat(&d).is_dir());
    put(&f, b"x");
    expect(unlink(&cx.p("f/x")), libc::ENOTDIR, "unlink through a file");

    // A symlink goes, not its target.
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(unlink(&l), 0, "unlink a symlink");
    assert!(!exists(&l));
    assert_eq!(read(&f), b"x");
    expect(symlink("d", &l), 0, "symlink to a dir");
    expect(unlink(&l), 0, "unlink a symlink to a dir");
    assert!(lstat(&d).is_dir());

    // A large file (chunks on every server) goes, and its name is reusable.
    let big = cx.p("big");
    put(&big, &vec![7u8; 5 * 1024 * 1024]);
    expect(unlink(&big), 0, "unlink a large file");
    put(&big, b"small");
    assert_eq!(read(&big), b"small", "a new file under an old name");
    assert_eq!(lstat(&big).len(), 5);

    // Unlink updates the inode's ctime when links remain.
    let h = cx.p("h");
    expect(link(&f, &h), 0, "link");
    let c0 = lstat(&f);
    wait_past(c0.ctime(), c0.ctime_nsec(), Duration::from_millis(20));
    let before = ctime_ns(&f);
    expect(unlink(&h), 0, "unlink");
    assert!(ctime_ns(&f) > before, "unlink updates the inode's ctime");

    // Permissions and the sticky bit.
    let ro = cx.mkdir_mode("ro", 0o755);
    put(&ro.join("f"), b"f");
    expect(chmod(&ro.join("f"), 0o777), 0, "chmod");
    let crf = c(ro.join("f"));
    expect(
        as_nobody(|| u_unlink(&crf)),
        libc::EACCES,
        "unlink without write permission on the directory",
    );
    let pubd = cx.mkdir_mode("pub", 0o777);
    put(&pubd.join("roots"), b"r");
    expect(chmod(&pubd.join("roots"), 0o400), 0, "chmod");
    let cpr = c(pubd.join("roots"));
    expect(
        as_nobody(|| u_unlink(&cpr)),
        0,
        "unlink another user's read-only file in a writable (non-sticky) dir",
    );
    let sticky = cx.mkdir_mode("sticky", 0o1777);
    put(&sticky.join("roots"), b"r");
    let csr = c(sticky.join("roots"));
    expect(
        as_nobody(|| u_unlink(&csr)),
        libc::EPERM,
        "unlink another user's file in a sticky dir",
    );
    let cmine = c(sticky.join("mine"));
    expect(
        as_nobody(|| u_write(&cmine, libc::O_CREAT | libc::O_WRONLY, b"m")),
        0,
        "create",
    );
    expect(
        as_nobody(|| u_unlink(&cmine)),
        0,
        "unlink own file in a sticky dir",
    );
    // The owner of a sticky directory may remove anything in it.
    let owned_sticky = cx.mkdir_mode("osticky", 0o1777);
    expect(chown(&owned_sticky, NOBODY, NOGROUP), 0, "chown");
    put(&owned_sticky.join("roots"), b"r");
    let cos = c(owned_sticky.join("roots"));
    expect(
        as_nobody(|| u_unlink(&cos)),
        0,
        "sticky dir's owner removes another user's file",
    );
}

// ---- utimensat ----------------------------------------------------------

fn utimensat_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"x");
    let atime = ts(1_000_000_000, 123_456_789);
    let mtime = ts(1_100_000_000, 987_654_321);
    expect(
        utimensat(&f, Some([atime, mtime]), 0),
        0,
        "utimensat explicit",
    );
    let m = lstat(&f);
    assert_eq!(
        (m.atime(), m.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "atime"
    );
    assert_eq!(
        (m.mtime(), m.mtime_nsec()),
        (1_100_000_000, 987_654_321),
        "mtime"
    );

    // UTIME_OMIT leaves a time; UTIME_NOW sets it to the current time.
    let before = now_ns();
    expect(
        utimensat(
            &f,
            Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)]),
            0,
        ),
        0,
        "UTIME_OMIT atime, UTIME_NOW mtime",
    );
    let after = now_ns();
    let m = lstat(&f);
    assert_eq!(
        (m.atime(), m.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "UTIME_OMIT leaves atime"
    );
    let mt = mtime_ns(&f);
    // Allow a coarse clock (up to 10 ms behind) on the file system side.
    assert!(
        mt >= before - 10_000_000 && mt <= after + 10_000_000,
        "UTIME_NOW sets mtime to now: {mt} not in [{before}, {after}]"
    );
    expect(
        utimensat(&f, Some([ts(5, 0), ts(0, libc::UTIME_OMIT)]), 0),
        0,
        "explicit atime, UTIME_OMIT mtime",
    );
    let m = lstat(&f);
    assert_eq!((m.atime(), m.atime_nsec()), (5, 0));
    assert_eq!(mtime_ns(&f), mt, "UTIME_OMIT leaves mtime");
    let ct = ctime_ns(&f);
    expect(
        utimensat(
            &f,
            Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_OMIT)]),
            0,
        ),
        0,
        "both UTIME_OMIT",
    );
    assert_eq!(mtime_ns(&f), mt, "both omitted: mtime unchanged");
    assert_eq!(ctime_ns(&f), ct, "both omitted: ctime unchanged");
    // NULL: both now.
    let before = now_ns();
    expect(utimensat(&f, None, 0), 0, "utimensat NULL");
    let after = now_ns();
    let m = lstat(&f);
    let at = m.atime() as i128 * 1_000_000_000 + m.atime_nsec() as i128;
    assert!(
        at >= before - 10_000_000 && at <= after + 10_000_000,
        "NULL sets atime to now"
    );
    let mt = mtime_ns(&f);
    assert!(
        mt >= before - 10_000_000 && mt <= after + 10_000_000,
        "NULL sets mtime to now"
    );
    // Times before 1970 and far in the future.
    expect(
        utimensat(&f, Some([ts(-1000, 0), ts(4_000_000_000, 1)]), 0),
        0,
        "pre-epoch and post-2038 times",
    );
    let m = lstat(&f);
    assert_eq!(m.atime(), -1000, "pre-epoch atime");
    assert_eq!(
        (m.mtime(), m.mtime_nsec()),
        (4_000_000_000, 1),
        "post-2038 mtime"
    );
    // Directories too.
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    expect(utimensat(&d, Some([atime, mtime]), 0), 0, "utimensat a dir");
    assert_eq!(lstat(&d).mtime(), 1_100_000_000);
    // A symlink itself, with AT_SYMLINK_NOFOLLOW; without, its target.
    let l = cx.p("l");
    expect(symlink("f", &l), 0, "symlink");
    expect(
        utimensat(
            &l,
            Some([atime, ts(1_200_000_000, 0)]),
            libc::AT_SYMLINK_NOFOLLOW,
        ),
        0,
        "utimensat AT_SYMLINK_NOFOLLOW",
    );
    assert_eq!(lstat(&l).mtime(), 1_200_000_000, "the link's own mtime");
    assert_eq!(lstat(&f).mtime(), 4_000_000_000, "the target is untouched");
    expect(
        utimensat(&l, Some([atime, mtime]), 0),
        0,
        "utimensat through a link",
    );
    assert_eq!(lstat(&f).mtime(), 1_100_000_000);

    // A write updates mtime and ctime.
    expect(utimensat(&f, Some([atime, mtime]), 0), 0, "reset");
    let ct = ctime_ns(&f);
    let c0 = lstat(&f);
    wait_past(c0.ctime(), c0.ctime_nsec(), Duration::from_millis(20));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all_at_end(b"more");
    assert!(lstat(&f).mtime() > 1_100_000_000, "a write updates mtime");
    assert!(ctime_ns(&f) > ct, "a write updates ctime");

    expect(
        utimensat(&cx.p("missing"), None, 0),
        libc::ENOENT,
        "utimensat missing",
    );
    expect(
        utimensat(&f, Some([ts(0, 1_000_000_000), ts(0, 0)]), 0),
        libc::EINVAL,
        "nanoseconds out of range",
    );

    // Permissions: explicit times need ownership; "now" needs ownership or
    // write permission.
    let r = cx.p("r");
    put(&r, b"r");
    expect(chmod(&r, 0o644), 0, "chmod");
    let cr = c(&r);
    let explicit = [atime, mtime];
    let now_both = [ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_NOW)];
    let omit_both = [ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_OMIT)];
    expect(
        as_nobody(|| u_utimensat(&cr, Some(&explicit))),
        libc::EPERM,
        "explicit times by a non-owner",
    );
    expect(
        as_nobody(|| u_utimensat(&cr, None)),
        libc::EACCES,
        "now by a non-owner without write permission",
    );
    expect(
        as_nobody(|| u_utimensat(&cr, Some(&now_both))),
        libc::EACCES,
        "UTIME_NOW by a non-owner without write permission",
    );
    expect(
        as_nobody(|| u_utimensat(&cr, Some(&omit_both))),
        0,
        "both UTIME_OMIT needs no permission",
    );
    expect(chmod(&r, 0o666), 0, "chmod");
    expect(
        as_nobody(|| u_utimensat(&cr, None)),
        0,
        "now by a non-owner with write permission",
    );
    expect(
        as_nobody(|| u_utimensat(&cr, Some(&explicit))),
        libc::EPERM,
        "explicit times by a non-owner with write permission",
    );
    expect(chown(&r, NOBODY, NOGROUP), 0, "chown");
    expect(chmod(&r, 0o444), 0, "chmod");
    expect(
        as_nobody(|| u_utimensat(&cr, Some(&explicit))),
        0,
        "explicit times by the owner",
    );
    assert_eq!(lstat(&r).mtime(), 1_100_000_000);
}

// ---- names and path lengths ---------------------------------------------

fn name_cases(cx: &Cx) {
    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    let f = cx.p(&n255);
    put(&f, b"255");
    assert_eq!(read(&f), b"255");
    assert!(ls(&cx.dir).contains(&n255), "a 255-byte name is listed");
    let d255 = cx.p(&"d".repeat(255));
    expect(mkdir(&d255, 0o755), 0, "mkdir with a 255-byte name");
    expect(
        symlink(&n255, &cx.p(&"s".repeat(255))),
        0,
        "symlink with a 255-byte name",
    );
    assert_eq!(read(&cx.p(&"s".repeat(255))), b"255");
    expect(
        rename(&f, &cx.p(&"r".repeat(255))),
        0,
        "rename to a 255-byte name",
    );
    expect(
        link(&cx.p(&"r".repeat(255)), &f),
        0,
        "link to a 255-byte name",
    );

    let p256 = cx.p(&n256);
    expect(
        open_rc(&p256, libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENAMETOOLONG,
        "create a 256-byte name",
    );
    expect(
        mkdir(&p256, 0o755),
        libc::ENAMETOOLONG,
        "mkdir a 256-byte name",
    );
    expect(stat_rc(&p256), libc::ENAMETOOLONG, "stat a 256-byte name");
    expect(
        symlink("x", &p256),
        libc::ENAMETOOLONG,
        "symlink a 256-byte name",
    );
    expect(
        rename(&f, &p256),
        libc::ENAMETOOLONG,
        "rename to a 256-byte name",
    );
    expect(
        link(&f, &p256),
        libc::ENAMETOOLONG,
        "link to a 256-byte name",
    );
    expect(unlink(&p256), libc::ENAMETOOLONG, "unlink a 256-byte name");
    assert!(exists(&f));

    // Odd but legal bytes in names are kept exactly.
    for name in [
        "with space",
        "new\nline",
        "t\u{e9}st-\u{1F600}",
        "-dash",
        ".hidden",
        "...",
    ] {
        put(&cx.p(name), name.as_bytes());
        assert_eq!(read(&cx.p(name)), name.as_bytes());
        assert!(
            ls(&cx.dir).contains(&name.to_string()),
            "{name:?} is listed"
        );
    }
    {
        use std::os::unix::ffi::OsStrExt;
        let raw = std::ffi::OsStr::from_bytes(b"bad-utf8-\xff\xfe");
        let p = cx.dir.join(raw);
        put(&p, b"raw");
        let found = std::fs::read_dir(&cx.dir)
            .unwrap()
            .any(|e| e.unwrap().file_name().as_bytes() == raw.as_bytes());
        assert!(found, "a non-UTF-8 name is listed byte for byte");
    }

    // Paths: a deep tree whose full path stays under PATH_MAX works; a path
    // of PATH_MAX bytes or more is refused by the kernel.
    let comp = "c".repeat(200);
    let mut p = cx.dir.clone();
    while p.as_os_str().len() + 201 + 20 < 4096 {
        p.push(&comp);
        expect(mkdir(&p, 0o755), 0, "mkdir deep");
    }
    let deep = p.join("leaf");
    put(&deep, b"deep");
    assert_eq!(read(&deep), b"deep", "a path just under PATH_MAX");
    let too_long = p.join("x".repeat(4096 - p.as_os_str().len()));
    assert!(too_long.as_os_str().len() >= 4096);
    expect(
        stat_rc(&too_long),
        libc::ENAMETOOLONG,
        "a path over PATH_MAX",
    );
    expect(
        open_rc(&too_long, libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENAMETOOLONG,
        "create with a path over PATH_MAX",
    );
    let many = cx.dir.join("./".repeat(2100));
    expect(
        stat_rc(&many),
        libc::ENAMETOOLONG,
        "a path of many components over PATH_MAX",
    );
    // Many components within PATH_MAX.
    let mut q = cx.p("deepdirs");
    expect(mkdir(&q, 0o755), 0, "mkdir");
    for _ in 0..100 {
        q.push("d");
        expect(mkdir(&q, 0o755), 0, "mkdir 100 levels");
    }
    put(&q.join("f"), b"100");
    assert_eq!(read(&q.join("f")), b"100");

    // statvfs reports the name limit.
    let cd = c(&cx.dir);
    // SAFETY: a valid C string and a statvfs buffer.
    let sv = unsafe {
        let mut sv: libc::statvfs = std::mem::zeroed();
        expect(rc(libc::statvfs(cd.as_ptr(), &mut sv)), 0, "statvfs");
        sv
    };
    assert_eq!(sv.f_namemax, 255, "statvfs f_namemax");
    assert!(sv.f_bsize > 0 && sv.f_blocks > 0, "statvfs sizes");
}

// ---- access -------------------------------------------------------------

fn access_cases(cx: &Cx) {
    let f = cx.p("f");
    put(&f, b"x");
    expect(chmod(&f, 0o640), 0, "chmod");
    expect(access(&f, libc::F_OK), 0, "F_OK");
    expect(access(&f, libc::R_OK | libc::W_OK), 0, "root R_OK|W_OK");
    expect(
        access(&f, libc::X_OK),
        libc::EACCES,
        "root X_OK without any x bit",
    );
    expect(chmod(&f, 0o001), 0, "chmod");
    expect(access(&f, libc::X_OK), 0, "root X_OK with an x bit");
    expect(chmod(&f, 0), 0, "chmod");
    expect(
        access(&f, libc::R_OK | libc::W_OK),
        0,
        "root ignores r/w bits",
    );
    expect(
        access(&cx.p("missing"), libc::F_OK),
        libc::ENOENT,
        "F_OK missing",
    );
    expect(
        access(&cx.p("f/x"), libc::F_OK),
        libc::ENOTDIR,
        "through a file",
    );

    expect(chmod(&f, 0o754), 0, "chmod");
    let cf = c(&f);
    let as_other = |m| as_nobody(|| u_access(&cf, m));
    expect(as_other(libc::R_OK), 0, "other R_OK on 0754");
    expect(as_other(libc::W_OK), libc::EACCES, "other W_OK on 0754");
    expect(as_other(libc::X_OK), libc::EACCES, "other X_OK on 0754");
    let as_group = |m| as_user(NOBODY, 0, &[], || u_access(&cf, m));
    expect(
        as_group(libc::R_OK | libc::X_OK),
        0,
        "group R_OK|X_OK on 0754",
    );
    expect(as_group(libc::W_OK), libc::EACCES, "group W_OK on 0754");
    expect(chown(&f, NOBODY, 0), 0, "chown");
    expect(
        as_other(libc::R_OK | libc::W_OK | libc::X_OK),
        0,
        "owner rwx on 0754",
    );
    expect(chmod(&f, 0o074), 0, "chmod");
    expect(as_group(libc::R_OK), libc::EACCES, "owner class decides");

    // Search permission on every directory of the path.
    let d = cx.mkdir_mode("d", 0o700);
    put(&d.join("g"), b"g");
    expect(chmod(&d.join("g"), 0o644), 0, "chmod");
    let cg = c(d.join("g"));
    expect(
        as_nobody(|| u_access(&cg, libc::F_OK)),
        libc::EACCES,
        "no search permission on the directory",
    );
    expect(
        as_nobody(|| u_stat(&cg)),
        libc::EACCES,
        "stat without search permission",
    );
    expect(chmod(&d, 0o711), 0, "chmod");
    expect(
        as_nobody(|| u_access(&cg, libc::R_OK)),
        0,
        "search-only directory",
    );
    let cd = c(&d);
    expect(
        as_nobody(|| u_readdir(&cd)),
        libc::EACCES,
        "readdir without read permission",
    );
    expect(chmod(&d, 0o755), 0, "chmod");
    expect(
        as_nobody(|| u_readdir(&cd)),
        0,
        "readdir with read permission",
    );
}

/// Create `p` with O_CREAT|O_EXCL|O_RDWR and mode 0, write "abcdef",
/// ftruncate to 3 and check fstat says 3 (allocation-free, for `as_user`).
fn create_write_ftruncate(p: &std::ffi::CString) -> i32 {
    // SAFETY: a valid C string; our descriptor and buffers.
    unsafe {
        let fd = libc::open(p.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0);
        if fd < 0 {
            return errno();
        }
        let mut st: libc::stat = std::mem::zeroed();
        let mut e = 0;
        if libc::write(fd, b"abcdef".as_ptr().cast(), 6) != 6
            || libc::ftruncate(fd, 3) != 0
            || libc::fstat(fd, &mut st) != 0
        {
            e = errno();
        } else if st.st_size != 3 {
            e = libc::EBADE;
        }
        if libc::close(fd) != 0 && e == 0 {
            e = errno();
        }
        e
    }
}

// ---- mknod --------------------------------------------------------------

fn mknod_cases(cx: &Cx) {
    let um = umask();
    let f = cx.p("reg");
    expect(mknod(&f, libc::S_IFREG | 0o640, 0), 0, "mknod S_IFREG");
    let m = lstat(&f);
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o640 & !um);
    assert_eq!(m.len(), 0);
    expect(
        mknod(&f, libc::S_IFREG | 0o640, 0),
        libc::EEXIST,
        "mknod existing",
    );
    expect(
        mknod(&cx.p("missing/x"), libc::S_IFREG | 0o640, 0),
        libc::ENOENT,
        "mknod in a missing dir",
    );
    // Only root may make device nodes (the kernel checks this before the
    // file system is asked).
    let pubd = cx.mkdir_mode("pub", 0o777);
    let cpdev = c(pubd.join("dev"));
    expect(
        as_nobody(|| {
            // SAFETY: a valid C string.
            rc(unsafe { libc::mknod(cpdev.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) })
        }),
        libc::EPERM,
        "mknod of a device by a non-root user",
    );
    special_node_cases(cx, um);
}

/// FIFOs, sockets and device nodes: MadFS stores the type (and a device's
/// number), the kernel serves what opening them means.
fn special_node_cases(cx: &Cx, um: u32) {
    // A FIFO: the kernel connects a writer and a reader through it.
    let fifo = cx.p("fifo");
    let cfifo = c(&fifo);
    // SAFETY: a valid C string.
    expect(
        rc(unsafe { libc::mkfifo(cfifo.as_ptr(), 0o640) }),
        0,
        "mkfifo",
    );
    let m = lstat(&fifo);
    assert!(m.file_type().is_fifo(), "mkfifo makes a FIFO");
    assert_eq!(m.mode() & 0o7777, 0o640 & !um);
    assert_eq!(m.rdev(), 0);
    // SAFETY: a valid C string.
    expect(
        rc(unsafe { libc::mkfifo(cfifo.as_ptr(), 0o640) }),
        libc::EEXIST,
        "mkfifo existing",
    );
    pipe_through(&fifo, b"through the FIFO\n");

    // A Unix socket bound in the directory: the name is a socket, and a
    // client connects to the listener through it.
    let sock = cx.p("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind a unix socket");
    assert!(lstat(&sock).file_type().is_socket(), "bind makes a socket");
    let mut client = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
    let (mut server, _) = listener.accept().expect("accept");
    use std::io::{Read, Write};
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    drop((client, server, listener));
    expect(
        mknod(&cx.p("sock2"), libc::S_IFSOCK | 0o600, 0),
        0,
        "mknod S_IFSOCK",
    );
    assert!(lstat(&cx.p("sock2")).file_type().is_socket());

    // Device nodes (root only): type and device number as given.
    for (name, mode, dev) in [
        ("chr", libc::S_IFCHR, libc::makedev(1, 3)),
        ("blk", libc::S_IFBLK, libc::makedev(7, 0)),
        ("chr-big", libc::S_IFCHR, libc::makedev(4095, 0xf_ffff)),
    ] {
        let p = cx.p(name);
        expect(mknod(&p, mode | 0o600, dev), 0, &format!("mknod {name}"));
        let m = lstat(&p);
        assert_eq!(m.mode() & libc::S_IFMT, mode, "{name}: type");
        assert_eq!(m.rdev(), dev, "{name}: st_rdev");
        assert_eq!(m.len(), 0);
        expect(
            mknod(&p, mode | 0o600, dev),
            libc::EEXIST,
            "mknod existing device",
        );
    }

    // The attribute calls work on them as on any file, and keep the type.
    expect(chmod(&fifo, 0o604), 0, "chmod FIFO");
    assert_eq!(perm(&fifo), 0o604);
    expect(chown(&fifo, NOBODY, NOGROUP), 0, "chown FIFO");
    assert_eq!((lstat(&fifo).uid(), lstat(&fifo).gid()), (NOBODY, NOGROUP));
    expect(
        utimensat(&fifo, Some([ts(1_000_000_000, 5), ts(1_200_000_000, 7)]), 0),
        0,
        "utimensat FIFO",
    );
    let m = lstat(&fifo);
    assert_eq!(
        (m.atime(), m.mtime(), m.mtime_nsec()),
        (1_000_000_000, 1_200_000_000, 7)
    );
    expect(truncate(&fifo, 0), libc::EINVAL, "truncate of a FIFO");
    let fifo2 = cx.p("fifo2");
    expect(rename(&fifo, &fifo2), 0, "rename FIFO");
    assert!(!exists(&fifo));
    assert!(lstat(&fifo2).file_type().is_fifo());
    let chr2 = cx.p("chr2");
    expect(rename(&cx.p("chr"), &chr2), 0, "rename device");
    assert_eq!(lstat(&chr2).rdev(), libc::makedev(1, 3));
    expect(link(&fifo2, &cx.p("fifo-link")), 0, "link FIFO");
    assert_eq!(lstat(&fifo2).nlink(), 2);
    for name in [
        "fifo2",
        "fifo-link",
        "sock",
        "sock2",
        "chr2",
        "blk",
        "chr-big",
    ] {
        expect(unlink(&cx.p(name)), 0, &format!("unlink {name}"));
        assert!(!exists(&cx.p(name)));
    }
}

/// Write `data` into the FIFO `p` from a second thread while this one
/// reads it: both ends open, the bytes arrive, and the reader sees the
/// end when the writer closes. Bounded: the reader opens without blocking
/// and polls with a timeout, so a broken FIFO fails instead of hanging.
fn pipe_through(p: &Path, data: &'static [u8]) {
    let cp = c(p);
    // SAFETY: a valid C string.
    let rfd = unsafe { libc::open(cp.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK) };
    assert!(rfd >= 0, "open FIFO to read: {}", errno_name(errno()));
    let writer = {
        let cp = cp.clone();
        std::thread::spawn(move || {
            // A reader is there: this open does not wait.
            // SAFETY: a valid C string.
            let wfd = unsafe { libc::open(cp.as_ptr(), libc::O_WRONLY) };
            assert!(wfd >= 0, "open FIFO to write: {}", errno_name(errno()));
            assert_eq!(write_fd(wfd, data), 0, "write into the FIFO");
            close(wfd);
        })
    };
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "FIFO: timed out with {got:?}");
        let mut pfd = libc::pollfd {
            fd: rfd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        let mut buf = [0u8; 64];
        // SAFETY: our descriptor and buffer.
        let n = unsafe { libc::read(rfd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            got.extend_from_slice(&buf[..n as usize]);
        } else if n == 0 && got.len() == data.len() {
            break; // the writer closed
        } else if n < 0 {
            assert_eq!(errno(), libc::EAGAIN, "read from the FIFO");
        }
    }
    close(rfd);
    writer.join().expect("FIFO writer");
    assert_eq!(got, data);
}

// ---- readdir ------------------------------------------------------------

fn readdir_cases(cx: &Cx) {
    use std::collections::BTreeMap;
    let d = cx.p("d");
    expect(mkdir(&d, 0o755), 0, "mkdir");
    assert!(ls(&d).is_empty(), "a new directory is empty");
    let mut want = BTreeMap::new();
    for i in 0..300 {
        let name = format!("file-{i:04}");
        put(&d.join(&name), b"");
        want.insert(name, "file");
    }
    for i in 0..20 {
        let name = format!("dir-{i}");
        expect(mkdir(&d.join(&name), 0o755), 0, "mkdir");
        want.insert(name, "dir");
    }
    for i in 0..20 {
        let name = format!("link-{i}");
        expect(symlink("file-0000", &d.join(&name)), 0, "symlink");
        want.insert(name, "symlink");
    }
    for (name, mode, dev, kind) in [
        ("fifo", libc::S_IFIFO, 0, "fifo"),
        ("sock", libc::S_IFSOCK, 0, "socket"),
        ("chr", libc::S_IFCHR, libc::makedev(1, 3), "chr"),
        ("blk", libc::S_IFBLK, libc::makedev(7, 1), "blk"),
    ] {
        expect(mknod(&d.join(name), mode | 0o600, dev), 0, "mknod");
        want.insert(name.to_string(), kind);
    }
    // Through readdir(3): "." and "..", then every entry exactly once with
    // its type and inode number.
    let cd = c(&d);
    let mut got = BTreeMap::new();
    let mut dots = 0;
    // SAFETY: a valid C string; entries are read before the next readdir;
    // the stream is closed.
    unsafe {
        let dirp = libc::opendir(cd.as_ptr());
        assert!(!dirp.is_null(), "opendir");
        loop {
            let e = libc::readdir(dirp);
            if e.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            if name == "." || name == ".." {
                dots += 1;
                continue;
            }
            let kind = match (*e).d_type {
                libc::DT_REG => "file",
                libc::DT_DIR => "dir",
                libc::DT_LNK => "symlink",
                libc::DT_FIFO => "fifo",
                libc::DT_SOCK => "socket",
                libc::DT_CHR => "chr",
                libc::DT_BLK => "blk",
                libc::DT_UNKNOWN => "unknown",
                _ => "other",
            };
            let ino = (*e).d_ino;
            let full = d.join(&name);
            if kind != "unknown" {
                assert_eq!(lstat(&full).ino(), ino, "d_ino of {name} is its st_ino");
            }
            assert!(
                got.insert(name.clone(), kind).is_none(),
                "{name} listed twice"
            );
        }
        libc::closedir(dirp);
    }
    assert_eq!(dots, 2, "`.` and `..` are listed");
    let got_names: Vec<_> = got.keys().cloned().collect();
    let want_names: Vec<_> = want.keys().cloned().collect();
    assert_eq!(got_names, want_names, "every entry exactly once");
    for (name, kind) in &got {
        assert!(
            *kind == "unknown" || *kind == want[name],
            "d_type of {name}: {kind}, expected {}",
            want[name]
        );
    }
    // The mount knows every entry's type from its dentry: FIFOs, sockets
    // and devices say what they are.
    for name in ["fifo", "sock", "chr", "blk"] {
        assert_eq!(got[name], want[name], "d_type of {name}");
    }
    // Changes show in the next listing.
    for i in 0..300 {
        if i % 3 == 0 {
            expect(unlink(&d.join(format!("file-{i:04}"))), 0, "unlink");
        }
    }
    assert_eq!(ls(&d).len(), 344 - 100);
    // A directory's own kind in a listing of its parent.
    let top = ls(&cx.dir);
    assert_eq!(top, vec!["d"]);
    let ft = std::fs::read_dir(&cx.dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_type()
        .unwrap();
    assert!(ft.is_dir() && !ft.is_fifo());
}

// ---- directory times and link counts ------------------------------------

/// A time well in the past (seconds): directories are set to it before an
/// operation, so that any time the operation sets is later.
const PAST_SECS: i64 = 1_000_000;

/// Set `dir`'s atime and mtime to the past; its ctime (now) in ns.
fn age(dir: &Path) -> i128 {
    expect(
        utimensat(dir, Some([ts(PAST_SECS, 0), ts(PAST_SECS, 0)]), 0),
        0,
        "utimensat to the past",
    );
    assert_eq!(lstat(dir).mtime(), PAST_SECS);
    let ctime = ctime_ns(dir);
    // The operation's time must be strictly later than this ctime, also on
    // a file system with a coarse clock.
    wait_past(
        (ctime / 1_000_000_000) as i64,
        (ctime % 1_000_000_000) as i64,
        Duration::from_millis(5),
    );
    ctime
}

/// `dir`'s mtime and ctime moved on from `age`'s, seen through the file
/// system under test and by another client asking the servers.
fn assert_touched(cx: &Cx, dir: &Path, ctime_before: i128, what: &str) {
    let m = lstat(dir);
    assert!(m.mtime() > PAST_SECS, "{what}: mtime of {}", dir.display());
    assert!(
        ctime_ns(dir) > ctime_before,
        "{what}: ctime of {} not after {ctime_before}",
        dir.display()
    );
    if let Some(tc) = cx.tc {
        let rel = dir.strip_prefix(&cx.root).unwrap();
        let a = block_on_thread(tc.client().stat(format!("/{}", rel.display()).as_str()))
            .expect("stat via client");
        assert!(a.mtime.secs > PAST_SECS, "{what}: mtime via another client");
        let ctime = a.ctime.secs as i128 * 1_000_000_000 + a.ctime.nanos as i128;
        assert!(ctime > ctime_before, "{what}: ctime via another client");
        assert_eq!(
            a.nlink as u64,
            m.nlink(),
            "{what}: nlink via another client"
        );
    }
}

fn dir_times_cases(cx: &Cx) {
    let d = cx.p("d");
    let e = cx.p("e");
    expect(mkdir(&d, 0o755), 0, "mkdir d");
    expect(mkdir(&e, 0o755), 0, "mkdir e");
    // Enough names that entries land on every server, the directory's own
    // among them.
    for i in 0..4 {
        let t = age(&d);
        put(&d.join(format!("f{i}")), b"x");
        assert_touched(cx, &d, t, "create");
        let t = age(&d);
        expect(mkdir(&d.join(format!("s{i}")), 0o755), 0, "mkdir");
        assert_touched(cx, &d, t, "mkdir");
        assert_eq!(lstat(&d).nlink(), 2 + i + 1, "nlink after mkdir {i}");
        let t = age(&d);
        expect(symlink("f0", &d.join(format!("l{i}"))), 0, "symlink");
        assert_touched(cx, &d, t, "symlink");
        let t = age(&d);
        expect(
            mknod(&d.join(format!("n{i}")), libc::S_IFREG | 0o644, 0),
            0,
            "mknod",
        );
        assert_touched(cx, &d, t, "mknod");
        let t = age(&d);
        expect(link(&d.join("f0"), &d.join(format!("h{i}"))), 0, "link");
        assert_touched(cx, &d, t, "link");
    }
    for i in 0..4 {
        let t = age(&d);
        expect(unlink(&d.join(format!("h{i}"))), 0, "unlink");
        assert_touched(cx, &d, t, "unlink");
        let t = age(&d);
        expect(
            rename(&d.join(format!("f{i}")), &d.join(format!("g{i}"))),
            0,
            "rename in one directory",
        );
        assert_touched(cx, &d, t, "rename in one directory");
    }
    // rename of a file between directories: both parents.
    let (td, te) = (age(&d), age(&e));
    expect(rename(&d.join("g1"), &e.join("g1")), 0, "rename to e");
    assert_touched(cx, &d, td, "rename: source directory");
    assert_touched(cx, &e, te, "rename: destination directory");
    // rename of a directory between directories moves a link count.
    assert_eq!((lstat(&d).nlink(), lstat(&e).nlink()), (6, 2));
    let (td, te) = (age(&d), age(&e));
    expect(rename(&d.join("s0"), &e.join("s0")), 0, "rename dir to e");
    assert_touched(cx, &d, td, "rename dir: source directory");
    assert_touched(cx, &e, te, "rename dir: destination directory");
    assert_eq!((lstat(&d).nlink(), lstat(&e).nlink()), (5, 3));
    // ... also over an empty directory (which goes).
    expect(
        rename(&d.join("s1"), &e.join("s0")),
        0,
        "rename dir over dir",
    );
    assert_eq!((lstat(&d).nlink(), lstat(&e).nlink()), (4, 3));
    // ... and within one directory changes nothing.
    expect(rename(&d.join("s2"), &d.join("t2")), 0, "rename dir in d");
    assert_eq!(lstat(&d).nlink(), 4);
    for (i, name) in ["t2", "s3"].iter().enumerate() {
        let t = age(&d);
        expect(rmdir(&d.join(name)), 0, "rmdir");
        assert_touched(cx, &d, t, "rmdir");
        assert_eq!(lstat(&d).nlink(), 3 - i as u64, "nlink after rmdir");
    }
    expect(rmdir(&e.join("s0")), 0, "rmdir e/s0");
    assert_eq!(lstat(&e).nlink(), 2);
    // The area directory counts its subdirectories too.
    assert_eq!(lstat(&cx.dir).nlink(), 4);

    // GNU find (which may skip stat calls in a directory whose link count
    // says it has no subdirectories left) and du see every file.
    let tree = cx.p("tree");
    let mut files = 0;
    for a in 0..3 {
        for b in 0..3 {
            let sub = tree.join(format!("a{a}")).join(format!("b{b}"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..=b {
                put(&sub.join(format!("file{f}")), b"data");
                files += 1;
            }
            put(&tree.join(format!("a{a}")).join(format!("top{b}")), b"x");
            files += 1;
        }
    }
    assert_eq!(lstat(&tree).nlink(), 5);
    let out = std::process::Command::new("find")
        .arg(&tree)
        .args(["-type", "f"])
        .output()
        .unwrap();
    assert!(out.status.success(), "find failed");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), files);
    let out = std::process::Command::new("find")
        .arg(&tree)
        .args(["-mindepth", "2", "-type", "d"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 9);
    let out = std::process::Command::new("du")
        .args(["-a", "--apparent-size", "-b"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success(), "du failed");
    // Every file and directory once, the tree itself last.
    let lines = String::from_utf8_lossy(&out.stdout);
    assert_eq!(lines.lines().count(), files + 3 + 9 + 1, "{lines}");
}
