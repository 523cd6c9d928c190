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

/// What [`open_file_in`] found where it was to read a regular file.
#[derive(Debug, thiserror::Error)]
#[error("not a regular file but a {0}: only regular files are read")]
pub struct NotRegular(pub &'static str);

/// Opens `name` in the directory `dir` for reading, never following a symlink at the leaf
/// (`ELOOP`), and only a regular file (else an error holding [`NotRegular`]). The open does not
/// block (`O_NONBLOCK`): a FIFO put where a file was, or named by a peer, would otherwise hold
/// the open until a writer came, for ever. Once the handle is known to be a regular file the
/// flag is cleared again.
pub fn open_file_in(dir: BorrowedFd<'_>, name: &[u8]) -> std::io::Result<std::fs::File> {
    use rustix::fs::FileType;
    let fd = openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let what = match FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) {
        FileType::RegularFile => {
            // F_SETFL with no flags: of the flags above, O_NONBLOCK is the only one it changes.
            rustix::fs::fcntl_setfl(&fd, OFlags::empty())?;
            return Ok(std::fs::File::from(fd));
        }
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        FileType::Directory => "directory",
        _ => "special file",
    };
    Err(std::io::Error::other(NotRegular(what)))
}

/// `file` opened again for reading, with an offset of its own, through `/proc/self/fd`: the
/// very file the handle holds, whatever its name has become since (a file held since it was
/// checked is read from it, never looked up by name again).
pub fn reopen(file: &std::fs::File) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", file.as_raw_fd()),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(std::fs::File::from(fd))
}

/// Whether `e` is [`open_file_in`]'s refusal of something that is not a regular file.
pub fn is_not_regular(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

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
