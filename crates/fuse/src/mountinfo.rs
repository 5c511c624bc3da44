//! Finding and removing MadFS mounts: /proc/self/mountinfo tells whether a
//! directory is a MadFS mount (fstype "fuse.madfs"), and unmounting goes
//! through fusermount3 (works for the user who mounted), else umount(2)
//! (root).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The source name and subtype a MadFS mount carries.
pub const FS_NAME: &str = "madfs";

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// "major:minor" of the mount's device (FUSE mounts get an anonymous one).
    pub dev: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    /// Mounted through fusermount3 the type is "fuse.madfs"; mounted
    /// directly by root with mount(2) it may be plain "fuse" with source
    /// "madfs".
    pub fn is_madfs(&self) -> bool {
        self.fstype == format!("fuse.{FS_NAME}")
            || (self.fstype.starts_with("fuse") && self.source == FS_NAME)
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Parse mountinfo text.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            let dev = fields.get(2)?;
            let mount_point = fields.get(4)?;
            let fstype = fields.get(sep + 1)?;
            let source = fields.get(sep + 2)?;
            Some(MountEntry {
                dev: dev.to_string(),
                mount_point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(mount_point))),
                fstype: String::from_utf8_lossy(&unescape(fstype)).into_owned(),
                source: String::from_utf8_lossy(&unescape(source)).into_owned(),
            })
        })
        .collect()
}

/// `path` made absolute without touching its last component: stat on a
/// FUSE mount whose daemon died fails (ENOTCONN), and that is exactly the
/// mount someone wants to unmount.
pub fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let name = match abs.file_name() {
        Some(n) if n != ".." => n.to_owned(),
        _ => return abs.canonicalize(),
    };
    let parent = abs.parent().unwrap_or(Path::new("/"));
    Ok(parent.canonicalize()?.join(name))
}

/// The mount at exactly `path` (the topmost one if several are stacked).
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    let want = absolute(path).ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == want)
}

/// Whether `path` is a MadFS mount point.
pub fn is_madfs_mount(path: &Path) -> bool {
    mount_at(path).is_some_and(|m| m.is_madfs())
}

/// Unmount the MadFS mount at `path`; `lazy` detaches it even while files
/// on it are open (they keep working until closed). fusermount3 first (the
/// mounting user may use it), then umount2(2) for root.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), String> {
    let abs = absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match mount_at(&abs) {
        Some(m) if m.is_madfs() => {}
        Some(m) => {
            return Err(format!(
                "{} is a {} mount, not MadFS",
                abs.display(),
                m.fstype
            ))
        }
        None => return Err(format!("{} is not mounted", abs.display())),
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let fusermount = match cmd.arg("--").arg(&abs).output() {
        Ok(out) if out.status.success() => return Ok(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("fusermount3: {e}"),
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = CString::new(abs.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid NUL-terminated path and plain flags.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::EBUSY) {
            " (files are open on it; -l detaches it now and finishes when they close)"
        } else {
            ""
        };
        return Err(format!("cannot unmount {}: {e}{hint}", abs.display()));
    }
    Err(format!("cannot unmount {}: {fusermount}", abs.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_parsed_and_unescaped() {
        let text = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
98 30 0:50 / /tmp/my\\040dir rw,nosuid,nodev,relatime shared:5 - fuse.madfs madfs rw,user_id=0
99 30 0:51 / /mnt/x rw - fuse madfs rw
";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert!(!m[0].is_madfs());
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/my dir"));
        assert_eq!(m[1].fstype, "fuse.madfs");
        assert_eq!(m[1].dev, "0:50");
        assert!(m[1].is_madfs());
        assert!(m[2].is_madfs());
    }

    #[test]
    fn absolute_keeps_the_last_component() {
        let d = std::env::temp_dir();
        let p = absolute(&d.join("no-such-madfs-dir")).unwrap();
        assert_eq!(p, d.canonicalize().unwrap().join("no-such-madfs-dir"));
    }

    #[test]
    fn unmounting_a_plain_directory_says_not_mounted() {
        let d = std::env::temp_dir().join(format!("madfs-umount-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let e = unmount(&d, false).unwrap_err();
        assert!(e.contains("not mounted"), "{e}");
        std::fs::remove_dir(&d).unwrap();
    }
}
