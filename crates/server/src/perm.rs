//! Permission checks against the credentials a client presents (AUTH_SYS
//! style), as POSIX specifies them for mode bits.

use madfs_proto::message::{ACCESS_EXEC, ACCESS_READ, ACCESS_WRITE};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{Attr, Credentials, FileKind};

/// The bits of an inode that decide access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
}

/// May `creds` access an object with `owner` for every bit of `mask`?
/// (The rule itself is shared with clients: `madfs_types::access_allowed`.)
pub fn allowed(owner: &Owner, creds: &Credentials, mask: u8) -> bool {
    madfs_types::access_allowed(owner.kind, owner.perm, owner.uid, owner.gid, creds, mask)
}

pub fn check(owner: &Owner, creds: &Credentials, mask: u8) -> Result<(), WireError> {
    if allowed(owner, creds, mask) {
        Ok(())
    } else {
        Err(WireError::new(ErrorCode::AccessDenied, ""))
    }
}

/// Check that `creds` may add or remove entries in directory `dir`.
pub fn check_dir_write(dir: &Owner, creds: &Credentials) -> Result<(), WireError> {
    check(dir, creds, ACCESS_WRITE | ACCESS_EXEC)
}

/// The sticky bit: in a sticky directory only the owner of an entry, the
/// owner of the directory, or root may remove or rename it.
pub fn check_sticky(dir: &Owner, victim_uid: u32, creds: &Credentials) -> Result<(), WireError> {
    if dir.perm & 0o1000 != 0 && creds.uid != 0 && creds.uid != dir.uid && creds.uid != victim_uid {
        return Err(WireError::new(ErrorCode::NotPermitted, "sticky directory"));
    }
    Ok(())
}

pub const READ: u8 = ACCESS_READ;
pub const WRITE: u8 = ACCESS_WRITE;
pub const EXEC: u8 = ACCESS_EXEC;

/// The permission bits a check needs, from an inode's attributes.
pub fn owner_of(a: &Attr) -> Owner {
    Owner {
        kind: a.kind,
        perm: a.perm,
        uid: a.uid,
        gid: a.gid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, gid: u32) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: vec![50],
        }
    }

    #[test]
    fn owner_group_other_bits() {
        let o = Owner {
            kind: FileKind::File,
            perm: 0o640,
            uid: 10,
            gid: 20,
        };
        assert!(allowed(&o, &user(10, 1), READ | WRITE));
        assert!(!allowed(&o, &user(10, 1), EXEC));
        assert!(allowed(&o, &user(11, 20), READ));
        assert!(!allowed(&o, &user(11, 20), WRITE));
        assert!(!allowed(&o, &user(11, 21), READ));
        let g = Owner { gid: 50, ..o };
        assert!(
            allowed(&g, &user(11, 21), READ),
            "supplementary group counts"
        );
        // The owner class decides even when the group would allow more.
        let o2 = Owner { perm: 0o070, ..o };
        assert!(!allowed(&o2, &user(10, 20), READ));
    }

    #[test]
    fn root_needs_an_x_bit_to_execute_files() {
        let o = Owner {
            kind: FileKind::File,
            perm: 0o600,
            uid: 10,
            gid: 20,
        };
        assert!(allowed(&o, &Credentials::root(), READ | WRITE));
        assert!(!allowed(&o, &Credentials::root(), EXEC));
        let d = Owner {
            kind: FileKind::Dir,
            perm: 0,
            ..o
        };
        assert!(allowed(&d, &Credentials::root(), EXEC));
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let d = Owner {
            kind: FileKind::Dir,
            perm: 0o1777,
            uid: 0,
            gid: 0,
        };
        assert!(check_sticky(&d, 10, &user(10, 1)).is_ok());
        assert!(check_sticky(&d, 10, &user(11, 1)).is_err());
        assert!(check_sticky(&d, 10, &Credentials::root()).is_ok());
    }
}
