//! `--checksum`: "unchanged" means same BLAKE3 of the contents, not same size and mtime.

use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{Mode, OFlags, openat};
use rustix::io::{Errno, read};

fn hash_file(dir: BorrowedFd<'_>, name: &[u8], buf: &mut [u8]) -> Result<blake3::Hash, Errno> {
    let fd = openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut hasher = blake3::Hasher::new();
    loop {
        let n = match read(fd.as_fd(), &mut *buf) {
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buf[..n]);
    }
}

/// True when `name` has the same contents in both directories.
pub fn same_contents(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    name: &[u8],
    buf: &mut [u8],
) -> Result<bool, Errno> {
    Ok(hash_file(src, name, buf)? == hash_file(dst, name, buf)?)
}
