//! The receiver's destination tree: every operation is relative to the root directory handle
//! and resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), so a
//! symlink planted by the peer (or anyone) is never followed and nothing lands outside the root.
//!
//! Stands in for the engine's `tree::DestRoot` until that lands; the receiver touches the
//! destination only through this type, so swapping the implementation is local.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::relpath::PeerPath;

#[derive(Debug, thiserror::Error)]
pub enum DestError {
    #[error("failed to open destination root {path}")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {op} {path} beneath the destination root")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a str) -> impl FnOnce(Errno) -> DestError + 'a {
    move |e| DestError::Io {
        op,
        path: path.to_owned(),
        source: e.into(),
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// What is at a path right now (never following a final symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    Missing,
    File { size: u64, mtime: (i64, u32) },
    Dir,
    Symlink,
    Other,
}

/// The destination root, held open for the whole session.
#[derive(Debug)]
pub struct DestRoot {
    root: OwnedFd,
    path: PathBuf,
}

impl DestRoot {
    /// Opens (creating if missing) the root directory; the root itself must not be a symlink.
    pub fn open(path: &Path) -> Result<Self, DestError> {
        let err = |source| DestError::OpenRoot {
            path: path.to_owned(),
            source,
        };
        match std::fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
        let root = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        Ok(Self {
            root,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.root
    }

    /// Opens a directory beneath the root ("" or None is the root itself).
    pub fn open_dir(&self, rel: Option<&str>) -> Result<OwnedFd, DestError> {
        let rel = rel.unwrap_or(".");
        rustix::fs::openat2(
            &self.root,
            rel,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(io_err("open directory", rel))
    }

    /// Creates every missing directory of `rel` (like mkdir -p), one component at a time,
    /// each resolved beneath the previous handle; returns the handle of the last one.
    pub fn create_dirs(&self, rel: &str) -> Result<OwnedFd, DestError> {
        let mut cur = self.open_dir(None)?;
        for comp in rel.split('/') {
            match rustix::fs::mkdirat(&cur, comp, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io_err("create directory", rel)(e)),
            }
            cur = rustix::fs::openat2(
                &cur,
                comp,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(io_err("open directory", rel))?;
        }
        Ok(cur)
    }

    /// Parent directory handle of a peer path, created if missing.
    pub fn parent_of(&self, path: &PeerPath) -> Result<OwnedFd, DestError> {
        match path.split_parent().0 {
            Some(p) => self.create_dirs(p),
            None => self.open_dir(None),
        }
    }

    pub fn existing(&self, parent: &OwnedFd, leaf: &str) -> Result<Existing, DestError> {
        match rustix::fs::statat(parent, leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => Existing::File {
                    size: st.st_size as u64,
                    mtime: (st.st_mtime, st.st_mtime_nsec as u32),
                },
                FileType::Directory => Existing::Dir,
                FileType::Symlink => Existing::Symlink,
                _ => Existing::Other,
            }),
            Err(Errno::NOENT) => Ok(Existing::Missing),
            Err(e) => Err(io_err("inspect", leaf)(e)),
        }
    }

    /// Opens an existing regular file beneath the root for reading (no symlinks followed).
    pub fn open_file(&self, rel: &str) -> Result<File, DestError> {
        let fd = rustix::fs::openat2(
            &self.root,
            rel,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(io_err("open", rel))?;
        Ok(File::from(fd))
    }

    /// Moves `tmp` (in `tmp_dir`) over `leaf` in `parent` atomically. An existing directory in
    /// the way is removed only if empty, so a type change never deletes a populated tree.
    pub fn publish(
        &self,
        tmp_dir: &OwnedFd,
        tmp: &str,
        parent: &OwnedFd,
        leaf: &str,
        shown: &str,
    ) -> Result<(), DestError> {
        if let Existing::Dir = self.existing(parent, leaf)? {
            rustix::fs::unlinkat(parent, leaf, AtFlags::REMOVEDIR)
                .map_err(io_err("replace directory", shown))?;
        }
        rustix::fs::renameat(tmp_dir, tmp, parent, leaf).map_err(io_err("rename into place", shown))
    }

    /// Creates an inert symlink at `path` (replacing a file or symlink there).
    pub fn symlink(
        &self,
        path: &PeerPath,
        target: &str,
        mtime: (i64, u32),
        tmp_dir: &OwnedFd,
        tmp: &str,
    ) -> Result<(), DestError> {
        let parent = self.parent_of(path)?;
        let (_, leaf) = path.split_parent();
        let _ = rustix::fs::unlinkat(tmp_dir, tmp, AtFlags::empty());
        rustix::fs::symlinkat(target, tmp_dir, tmp)
            .map_err(io_err("create symlink", path.as_str()))?;
        let ts = Timespec {
            tv_sec: mtime.0,
            tv_nsec: i64::from(mtime.1.min(999_999_999)),
        };
        let times = Timestamps {
            last_access: ts,
            last_modification: ts,
        };
        // The link itself, never its target.
        let _ = rustix::fs::utimensat(tmp_dir, tmp, &times, AtFlags::SYMLINK_NOFOLLOW);
        self.publish(tmp_dir, tmp, &parent, leaf, path.as_str())
    }

    /// Hard-links `path` to the regular file `target`, both beneath the root.
    pub fn hardlink(
        &self,
        path: &PeerPath,
        target: &PeerPath,
        tmp_dir: &OwnedFd,
        tmp: &str,
    ) -> Result<(), DestError> {
        let tparent = self.parent_of(target)?;
        let (_, tleaf) = target.split_parent();
        match self.existing(&tparent, tleaf)? {
            Existing::File { .. } => {}
            _ => {
                return Err(DestError::Io {
                    op: "hard-link to",
                    path: target.to_string(),
                    source: std::io::Error::other("link target is not a regular file of this tree"),
                });
            }
        }
        let parent = self.parent_of(path)?;
        let (_, leaf) = path.split_parent();
        if let Existing::File { .. } = self.existing(&parent, leaf)? {
            let a = rustix::fs::statat(&parent, leaf, AtFlags::SYMLINK_NOFOLLOW);
            let b = rustix::fs::statat(&tparent, tleaf, AtFlags::SYMLINK_NOFOLLOW);
            if let (Ok(a), Ok(b)) = (a, b)
                && a.st_ino == b.st_ino
                && a.st_dev == b.st_dev
            {
                return Ok(());
            }
        }
        let _ = rustix::fs::unlinkat(tmp_dir, tmp, AtFlags::empty());
        // Flags 0: a symlink target would be linked itself, never followed.
        rustix::fs::linkat(&tparent, tleaf, tmp_dir, tmp, AtFlags::empty())
            .map_err(io_err("create hard link", path.as_str()))?;
        self.publish(tmp_dir, tmp, &parent, leaf, path.as_str())
    }

    /// Applies mode and mtime to a directory (after its content is complete).
    pub fn set_dir_meta(
        &self,
        rel: &PeerPath,
        mode: u32,
        mtime: (i64, u32),
    ) -> Result<(), DestError> {
        let fd = self.create_dirs(rel.as_str())?;
        set_meta(&fd, mode, mtime).map_err(io_err("set metadata of", rel.as_str()))
    }

    /// Removes every entry of directory `rel` whose name is not in `keep` (recursively, never
    /// following symlinks). Returns how many entries were removed.
    pub fn delete_extraneous(
        &self,
        rel: Option<&str>,
        keep: &std::collections::HashSet<String>,
    ) -> Result<u64, DestError> {
        let shown = rel.unwrap_or(".");
        let dir = self.open_dir(rel)?;
        let names = list_dir(&dir).map_err(io_err("list", shown))?;
        let mut removed = 0;
        for (name, is_dir) in names {
            if keep.contains(&name) || (rel.is_none() && name == super::relpath::STAGING_DIR) {
                continue;
            }
            remove_tree(&dir, &name, is_dir).map_err(io_err("delete", shown))?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// Sets permission bits (setuid/setgid/sticky stripped) and mtime through an open handle.
pub fn set_meta(fd: &impl AsFd, mode: u32, mtime: (i64, u32)) -> Result<(), Errno> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o777))?;
    let ts = Timespec {
        tv_sec: mtime.0,
        tv_nsec: i64::from(mtime.1.min(999_999_999)),
    };
    rustix::fs::futimens(
        fd,
        &Timestamps {
            last_access: ts,
            last_modification: ts,
        },
    )
}

fn list_dir(dir: &OwnedFd) -> Result<Vec<(String, bool)>, Errno> {
    let mut out = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir)?;
    while let Some(ent) = d.read() {
        let ent = ent?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        out.push((name, ent.file_type() == FileType::Directory));
    }
    Ok(out)
}

fn remove_tree(parent: &OwnedFd, name: &str, is_dir: bool) -> Result<(), Errno> {
    if !is_dir {
        return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Err(Errno::ISDIR) => remove_tree(parent, name, true),
            r => r,
        };
    }
    let fd = rustix::fs::openat2(
        parent,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        RESOLVE,
    )?;
    for (child, child_dir) in list_dir(&fd)? {
        remove_tree(&fd, &child, child_dir)?;
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}
