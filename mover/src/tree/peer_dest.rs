//! The receiver's view of its destination: a thin adapter over the engine's confined
//! [`crate::tree::DestRoot`], so network and local copies share one set of semantics (every
//! operation beneath the root handle, symlinks never followed, atomic publish, metadata through
//! file descriptors, setuid/setgid/sticky stripped for peer-described files unless the receiver
//! keeps them).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use super::dircache::{CachedDir, DirCache};
use super::peer_path::{PeerPath, STAGING_DIR};
use crate::tree::{self, DirFd, FileOpen, Kind, Meta, Placed, RelPath, Replace, StagedFile};

pub use crate::tree::DestError;

/// What is at a path right now (never following a final symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    Missing,
    /// `mode`: the permission bits (`& 0o777`).
    File {
        size: u64,
        mtime: (i64, u32),
        mode: u32,
    },
    Dir,
    Symlink,
    Other,
}

/// The destination root, held open for the whole session.
#[derive(Debug)]
pub struct PeerDest {
    tree: tree::DestRoot,
    dirs: DirCache,
    /// setuid/setgid/sticky are applied (the receiver asked for them).
    special_bits: bool,
}

impl PeerDest {
    /// Opens (creating if missing) the root directory; setuid/setgid/sticky applied only with
    /// `special_bits` (the receiver's choice, never the sender's). `replace` says whether a
    /// non-empty directory may give way to a non-directory (only when the sender asked for
    /// `--delete`).
    pub fn open(path: &Path, replace: Replace, special_bits: bool) -> Result<Self, DestError> {
        let tree = tree::DestRoot::open_with(
            path,
            tree::DestOptions {
                allow_special_bits: special_bits,
                replace,
                ..Default::default()
            },
        )?;
        Ok(Self {
            tree,
            dirs: DirCache::default(),
            special_bits,
        })
    }

    pub fn tree(&self) -> &tree::DestRoot {
        &self.tree
    }

    /// What a file, symlink or hard link may replace (pass it to [`StagedFile::commit`]).
    pub fn replace(&self) -> Replace {
        self.tree.replace()
    }

    /// Metadata for a peer-described entry, owned by whoever runs the receiver (see
    /// [`owned`]); setuid/setgid/sticky kept only when the receiver asked for them.
    pub fn meta(&self, kind: Kind, mode: u32, size: u64, mtime: (i64, u32)) -> Meta {
        let mask = if self.special_bits { 0o7777 } else { 0o777 };
        let mut m = Meta::new(kind, mode & mask, size, mtime.0, mtime.1);
        let p = self.tree.policy();
        m.uid = p.euid;
        m.gid = p.egid;
        m
    }

    /// Opens a directory beneath the root (None is the root itself).
    pub fn open_dir(&self, path: Option<&RelPath>) -> Result<DirFd, DestError> {
        self.tree.open_dir(path)
    }

    /// Creates every missing directory of `path` (a non-directory in the way is replaced) and
    /// remembers its handle for the files that follow.
    pub fn create_dirs(&self, path: &RelPath) -> Result<DirFd, DestError> {
        let (fd, created) = self.tree.ensure_dir_all(path, 0o755)?;
        self.dirs.insert(
            path.as_bytes(),
            CachedDir {
                fd: fd.clone(),
                fresh: created,
            },
        );
        Ok(fd)
    }

    /// Creates the parent directories of a peer path (once per directory while it stays cached).
    pub fn ensure_parent(&self, path: &PeerPath) -> Result<(), DestError> {
        if let Some(p) = path.split_parent().0
            && self.dirs.get(p).is_none()
            && let Some(parent) = path.rel().parent()
        {
            self.create_dirs(&parent)?;
        }
        Ok(())
    }

    /// The handle of `path`'s parent (cached, or resolved beneath the root) and its last name.
    fn parent<'p>(&self, path: &'p PeerPath) -> Result<(CachedDir, &'p [u8]), DestError> {
        match path.split_parent() {
            (None, name) => Ok((
                CachedDir {
                    fd: self.tree.root().clone(),
                    fresh: false,
                },
                name,
            )),
            (Some(dir), name) => match self.dirs.get(dir) {
                Some(cached) => Ok((cached, name)),
                None => {
                    let fd = self.tree.open_dir(path.rel().parent().as_ref())?;
                    let cached = CachedDir { fd, fresh: false };
                    self.dirs.insert(dir, cached.clone());
                    Ok((cached, name))
                }
            },
        }
    }

    pub fn existing(&self, path: &PeerPath) -> Result<Existing, DestError> {
        Ok(existing_of(self.tree.lookup(path.rel())?))
    }

    /// What is at `path` before this session writes it. A directory this session created holds
    /// only what the session put there, so its names are not looked up (one `fstatat` per small
    /// file saved on a fresh destination).
    pub fn existing_before_write(&self, path: &PeerPath) -> Result<Existing, DestError> {
        let (dir, name) = match self.parent(path) {
            Ok(found) => found,
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(Existing::Missing),
            Err(e) => return Err(e),
        };
        if dir.fresh {
            return Ok(Existing::Missing);
        }
        let found =
            tree::dest::lookup_at(dir.fd.as_fd(), name).map_err(|source| DestError::Io {
                op: "look up",
                path: path.to_string(),
                source: source.into(),
            })?;
        Ok(existing_of(found))
    }

    /// True when the directory at `path` has no entries (checked before a non-directory is put
    /// there: only an empty directory is replaced without `--delete`).
    pub fn is_empty_dir(&self, path: &PeerPath) -> Result<bool, DestError> {
        let (dir, name) = self.parent(path)?;
        tree::dest::dir_is_empty_at(dir.fd.as_fd(), name).map_err(|source| DestError::Io {
            op: "look into directory",
            path: path.to_string(),
            source: source.into(),
        })
    }

    /// Drops cached handles of `path` and beneath it (a directory there was replaced).
    pub fn forget_under(&self, path: &PeerPath) {
        self.dirs.forget_under(path.as_bytes());
    }

    /// Opens an existing regular file beneath the root (no symlinks followed).
    pub fn open_file(&self, path: &RelPath) -> Result<File, DestError> {
        self.tree.open_file(path, FileOpen::Existing)
    }

    /// Opens an existing regular file beneath the root for reading only.
    pub fn open_read(&self, path: &RelPath) -> Result<File, DestError> {
        self.tree.open_file(path, FileOpen::Read)
    }

    /// `lstat` of `path` beneath the root; `None` if nothing is there.
    pub fn lookup(&self, path: &PeerPath) -> Result<Option<Meta>, DestError> {
        self.tree.lookup(path.rel())
    }

    /// The symlink at `path`: its `lstat` and its target bytes.
    pub fn read_symlink(&self, path: &PeerPath) -> Result<(Meta, Vec<u8>), DestError> {
        let (dir, name) = self.parent(path)?;
        let err = |e: rustix::io::Errno| DestError::Io {
            op: "read back symlink",
            path: path.to_string(),
            source: e.into(),
        };
        let st = rustix::fs::statat(dir.fd.as_fd(), name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map_err(err)?;
        let target = rustix::fs::readlinkat(dir.fd.as_fd(), name, Vec::new()).map_err(err)?;
        Ok((Meta::from_stat(&st), target.into_bytes()))
    }

    /// Applies mode and mtime to an open file at `path`.
    pub fn apply_meta(&self, f: &File, path: &RelPath, meta: &Meta) -> Result<(), DestError> {
        self.tree.apply_meta(f.as_fd(), path, meta)
    }

    /// A temporary file next to `path`, published by [`StagedFile::commit`]. The parent must
    /// exist (the receiver creates it when the file is offered). `mode` is applied at creation, so
    /// the commit needs no chmod when the umask allows it.
    pub fn stage(&self, path: &PeerPath, mode: u32) -> Result<StagedFile, DestError> {
        let (dir, name) = self.parent(path)?;
        StagedFile::create_in(&dir.fd, name, mode & 0o777, *self.tree.policy()).map_err(|source| {
            DestError::Io {
                op: "create a temporary file for",
                path: path.to_string(),
                source: source.into(),
            }
        })
    }

    /// Renames a file from our staging area over `path` (parents created first; a directory
    /// there replaced per [`PeerDest::replace`]).
    pub fn publish_from_staging(
        &self,
        staged: &RelPath,
        path: &PeerPath,
    ) -> Result<Placed, DestError> {
        self.ensure_parent(path)?;
        self.dirs.forget_under(path.as_bytes());
        self.tree.rename(staged, path.rel())
    }

    /// Creates an inert symlink at `path` (replacing what was there; a directory per
    /// [`PeerDest::replace`]).
    pub fn symlink(
        &self,
        path: &PeerPath,
        target: &[u8],
        mtime: (i64, u32),
        owner: Option<(u32, u32)>,
    ) -> Result<Placed, DestError> {
        self.ensure_parent(path)?;
        self.dirs.forget_under(path.as_bytes());
        let meta = owned(
            self.meta(Kind::Symlink, 0o777, target.len() as u64, mtime),
            owner,
        );
        self.tree.symlink(path.rel(), target, &meta)
    }

    /// Hard-links `path` to the regular file `target`, both beneath the root (a directory at
    /// `path` replaced per [`PeerDest::replace`]). `None` when both already are one inode.
    pub fn hardlink(
        &self,
        path: &PeerPath,
        target: &PeerPath,
    ) -> Result<Option<Placed>, DestError> {
        match self.existing(target)? {
            Existing::File { .. } => {}
            _ => {
                return Err(DestError::Io {
                    op: "hard-link to",
                    path: target.to_string(),
                    source: std::io::Error::other("link target is not a regular file of this tree"),
                });
            }
        }
        self.ensure_parent(path)?;
        self.dirs.forget_under(path.as_bytes());
        self.tree.hard_link(target.rel(), path.rel())
    }

    /// Applies mode and mtime to a directory (None = the root), after its content is complete.
    pub fn set_dir_meta(
        &self,
        path: Option<&PeerPath>,
        mode: u32,
        mtime: (i64, u32),
        owner: Option<(u32, u32)>,
    ) -> Result<(), DestError> {
        let meta = owned(self.meta(Kind::Dir, mode, 0, mtime), owner);
        match path {
            None => self.tree.set_dir_meta(None, &meta),
            Some(p) => {
                self.tree.create_dir_all(p.rel(), 0o755)?;
                self.tree.set_dir_meta(Some(p.rel()), &meta)
            }
        }
    }

    /// Removes every entry of directory `path` whose name is not in `keep` (recursively, never
    /// following symlinks; the staging directory in the root is kept). Returns what it removed
    /// (path below the root, whether a directory). With `dry_run` nothing is removed: what
    /// would be is returned (a missing directory holds nothing to remove).
    pub fn delete_extraneous(
        &self,
        path: Option<&PeerPath>,
        keep: &std::collections::HashSet<Vec<u8>>,
        protect: &tree::Filter,
        dry_run: bool,
    ) -> Result<Vec<(Vec<u8>, bool)>, DestError> {
        let shown = path.map_or_else(|| ".".to_owned(), PeerPath::to_string);
        let shown = shown.as_str();
        let dir = match self.open_dir(path.map(PeerPath::rel)) {
            Err(e) if dry_run && matches!(e.errno(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Ok(Vec::new());
            }
            r => r?,
        };
        let err = |op: &'static str| {
            move |e: rustix::io::Errno| DestError::Io {
                op,
                path: shown.to_owned(),
                source: e.into(),
            }
        };
        let mut doomed = Vec::new();
        for ent in tree::dest::list_dir(dir.as_fd()).map_err(err("list"))? {
            let ent = ent.map_err(err("list"))?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let keep_it = keep.contains(name) || (path.is_none() && name == STAGING_DIR.as_bytes());
            if !keep_it
                && !tree::dest::excluded_listing_entry(
                    protect,
                    path.map(PeerPath::as_bytes),
                    name,
                    ent.file_type(),
                    dir.as_fd(),
                )
            {
                let is_dir = ent.file_type() == rustix::fs::FileType::Directory;
                doomed.push((name.to_vec(), is_dir));
            }
        }
        // Handles of removed directories must not be reused.
        match path {
            _ if dry_run => {}
            Some(p) => self.dirs.forget_under(p.as_bytes()),
            None => self.dirs.clear(),
        }
        let mut removed = Vec::with_capacity(doomed.len());
        for (name, is_dir) in doomed {
            if !dry_run {
                tree::dest::remove_at(dir.as_fd(), &name).map_err(err("delete in"))?;
            }
            let rel = match path {
                Some(p) => [p.as_bytes(), b"/", &name].concat(),
                None => name,
            };
            removed.push((rel, is_dir));
        }
        Ok(removed)
    }
}

/// `meta` with the sender's owner, when the receiver keeps owners (applied only as root).
pub fn owned(mut meta: Meta, owner: Option<(u32, u32)>) -> Meta {
    if let Some((uid, gid)) = owner {
        (meta.uid, meta.gid) = (uid, gid);
    }
    meta
}

fn existing_of(found: Option<Meta>) -> Existing {
    match found {
        None => Existing::Missing,
        Some(m) => match m.kind {
            Kind::File => Existing::File {
                size: m.size,
                mtime: (m.mtime_sec, m.mtime_nsec),
                mode: m.mode & 0o777,
            },
            Kind::Dir => Existing::Dir,
            Kind::Symlink => Existing::Symlink,
            Kind::Special => Existing::Other,
        },
    }
}
