//! Resolving a [`RelPath`] beneath a directory handle without following any symlink.
//!
//! The fast path is one `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
//! Kernels without openat2 (ENOSYS, before 5.6, or filtered by seccomp) get a walk that opens one
//! component at a time with `O_NOFOLLOW | O_DIRECTORY`. Both refuse a symlink anywhere on the way,
//! and since a `RelPath` has no `..`, neither can climb above the starting handle.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags, openat, openat2};
use rustix::io::Errno;

use super::RelPath;

/// How directories are resolved beneath a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resolve {
    /// openat2 where the kernel has it, else the per-component walk.
    #[default]
    Auto,
    /// Always the per-component `O_NOFOLLOW` walk (the fallback; selectable so tests cover it).
    Walk,
}

/// Set once openat2 has returned ENOSYS, so later lookups go straight to the walk.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

pub(crate) const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `rel` beneath `root`, refusing symlinks in every component.
pub fn open_dir_beneath(
    root: BorrowedFd<'_>,
    rel: &RelPath,
    how: Resolve,
) -> Result<OwnedFd, Errno> {
    if how == Resolve::Auto && !OPENAT2_MISSING.load(Ordering::Relaxed) {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        loop {
            match openat2(root, rel.as_bytes(), DIR_FLAGS, Mode::empty(), resolve) {
                Err(Errno::NOSYS) => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    break;
                }
                // openat2 returns EAGAIN when a concurrent rename races the lookup; retry.
                Err(Errno::AGAIN | Errno::INTR) => continue,
                other => return other,
            }
        }
    }
    walk(root, rel)
}

fn walk(root: BorrowedFd<'_>, rel: &RelPath) -> Result<OwnedFd, Errno> {
    let mut current: Option<OwnedFd> = None;
    for name in rel.components() {
        let base = current.as_ref().map_or(root, |fd| fd.as_fd());
        current = Some(openat(base, name, DIR_FLAGS, Mode::empty())?);
    }
    // A RelPath always has at least one component.
    current.ok_or(Errno::INVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::parse(s.as_bytes()).expect("valid")
    }

    #[test]
    fn both_modes_refuse_symlinked_components() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("a/link")).expect("symlink");
        std::os::unix::fs::symlink("b", tmp.path().join("a/rel")).expect("symlink");
        let root = std::fs::File::open(tmp.path()).expect("open root");
        for how in [Resolve::Auto, Resolve::Walk] {
            assert!(open_dir_beneath(root.as_fd(), &rel("a/b"), how).is_ok());
            for bad in ["a/link", "a/rel", "a/link/x"] {
                let err = open_dir_beneath(root.as_fd(), &rel(bad), how).expect_err(bad);
                assert!(
                    matches!(err, Errno::LOOP | Errno::NOTDIR | Errno::XDEV),
                    "{bad} {how:?}: {err:?}"
                );
            }
        }
    }
}
