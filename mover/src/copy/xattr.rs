//! `--xattrs`: copying `user.*` extended attributes between open files.
//!
//! Only the `user.` namespace: `trusted.`/`security.` need privileges and describe the source
//! system, and `system.` (ACLs) is out of scope.

use std::os::fd::BorrowedFd;

use rustix::fs::{XattrFlags, fgetxattr, flistxattr, fsetxattr};
use rustix::io::Errno;

/// Upper bound for one attribute value (the Linux VFS limit).
const XATTR_SIZE_MAX: usize = 64 * 1024;
/// Upper bound for the whole name list (the Linux VFS limit).
const XATTR_LIST_MAX: usize = 64 * 1024;

/// Copies every `user.*` attribute of `src` onto `dst`.
pub fn copy_user_xattrs(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<(), Errno> {
    let mut names = vec![0u8; XATTR_LIST_MAX];
    let len = match flistxattr(src, &mut names[..]) {
        Ok(n) => n,
        // The source filesystem has no xattrs: nothing to copy.
        Err(Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut value = vec![0u8; XATTR_SIZE_MAX];
    for name in names[..len].split(|&b| b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let n = match fgetxattr(src, name, &mut value[..]) {
            Ok(n) => n,
            Err(Errno::NODATA) => continue, // removed meanwhile
            Err(e) => return Err(e),
        };
        fsetxattr(dst, name, &value[..n], XattrFlags::empty())?;
    }
    Ok(())
}
