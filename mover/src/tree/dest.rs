//! The destination tree: every write, mkdir, rename, chmod and remove happens beneath one root
//! directory handle, and no symlink inside the tree is ever followed.
//!
//! Operations take either a [`RelPath`] (resolved with [`open_dir_beneath`]) or, on the hot path of
//! the copy engine, an already-confined directory handle plus one entry name (`*_at` functions).
//! A handle is confined if it was opened from a confined handle with `O_NOFOLLOW | O_DIRECTORY`;
//! the last component is always acted on with a non-following `*at` call.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{
    AtFlags, Dir, FileType, Mode, OFlags, linkat, mkdirat, openat, renameat, statat, symlinkat,
    unlinkat,
};
use rustix::io::Errno;

use super::confine::{DIR_FLAGS, Resolve, open_dir_beneath};
use super::data::{self, CopyCaps, Method};
use super::meta::{Kind, Meta};
use super::policy::{MetaError, MetaPolicy};
use super::relpath::{PathError, RelPath, display_opt};

/// A shared directory handle; workers hold one per directory they write into.
pub type DirFd = Arc<OwnedFd>;

/// Every temporary name ferry creates starts with this; a later run removes leftovers.
pub const TEMP_PREFIX: &[u8] = b".ferry-tmp.";

/// True for names ferry uses for files still being written.
pub fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// A failed destination operation, naming the operation and the path (relative to the root).
#[derive(Debug, thiserror::Error)]
pub enum DestError {
    #[error("failed to {op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to apply metadata to {path}")]
    Meta {
        path: String,
        #[source]
        source: MetaError,
    },
    #[error("invalid destination path")]
    Path(#[from] PathError),
    #[error(transparent)]
    NonEmptyDir(#[from] NonEmptyDir),
}

impl DestError {
    pub(crate) fn io(
        op: &'static str,
        path: impl ToString,
        e: impl Into<std::io::Error>,
    ) -> DestError {
        DestError::Io {
            op,
            path: path.to_string(),
            source: e.into(),
        }
    }
    /// The OS error behind this failure, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            DestError::Io { source, .. } => source.raw_os_error(),
            DestError::Meta { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// What a file, symlink or hard link may displace when a directory stands at its name.
///
/// Replacing a directory by a non-directory is one for one only when the directory is empty;
/// a non-empty one holds entries the source does not replace, so removing it needs the user's
/// consent (`--delete`), like rsync and unlike a silent `rm -r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replace {
    /// An empty directory is replaced; a non-empty one is refused with [`NonEmptyDir`].
    #[default]
    EmptyDirOnly,
    /// Any directory is replaced, everything in it removed (`--delete`).
    AnyDir,
}

impl Replace {
    /// The policy for a run with or without `--delete`.
    pub fn with_delete(delete: bool) -> Replace {
        if delete {
            Replace::AnyDir
        } else {
            Replace::EmptyDirOnly
        }
    }
}

/// How an entry was put at its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// Created, or replaced a file, a link, a special file or an empty directory one for one.
    Plain,
    /// Replaced a non-empty directory and everything in it ([`Replace::AnyDir`]); callers count
    /// it as deleted.
    OverNonEmptyDir,
}

/// A non-directory was not put in place: a non-empty directory stands at its name and the policy
/// is [`Replace::EmptyDirOnly`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing to replace non-empty directory {path} with {with}; pass --delete to allow it")]
pub struct NonEmptyDir {
    /// The directory, relative to the destination root (only its name where the `*_at`
    /// functions report it; callers that know the whole path set it with [`NonEmptyDir::at`]).
    pub path: String,
    /// What the source has there ("a file", "a symlink", "a hard link").
    pub with: &'static str,
}

impl NonEmptyDir {
    fn named(name: &[u8], with: &'static str) -> NonEmptyDir {
        NonEmptyDir {
            path: String::from_utf8_lossy(name).into_owned(),
            with,
        }
    }
    /// The same refusal naming the whole path `path`.
    pub fn at(self, path: &(impl ToString + ?Sized)) -> NonEmptyDir {
        NonEmptyDir {
            path: path.to_string(),
            ..self
        }
    }
}

/// Destination policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DestOptions {
    /// Apply setuid/setgid/sticky bits from the source (local copies of one's own tree). Keep off
    /// for anything a network peer describes.
    pub allow_special_bits: bool,
    /// Directory resolution strategy (tests force the fallback walk).
    pub resolve: Resolve,
    /// What [`DestRoot::symlink`], [`DestRoot::hard_link`] and [`DestRoot::rename`] may replace.
    pub replace: Replace,
}

/// The destination root: a directory handle plus the metadata and replacement policies.
#[derive(Debug, Clone)]
pub struct DestRoot {
    root: DirFd,
    path: PathBuf,
    policy: MetaPolicy,
    resolve: Resolve,
    replace: Replace,
}

/// How [`DestRoot::open_file`] treats an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOpen {
    /// Create; fail if something exists (`O_EXCL`).
    CreateNew { perm: u32 },
    /// Open for writing, creating it if missing (resuming a staging file).
    OpenOrCreate { perm: u32 },
    /// Open an existing file for reading and writing.
    Existing,
    /// Open an existing file for reading only (works on a file without write permission).
    Read,
}

impl DestRoot {
    /// Opens (creating it and its parents if missing) the destination directory. The path given
    /// by the user is trusted as-is; everything beneath it is confined.
    pub fn open(path: &Path) -> Result<DestRoot, DestError> {
        DestRoot::open_with(path, DestOptions::default())
    }

    pub fn open_with(path: &Path, opts: DestOptions) -> Result<DestRoot, DestError> {
        let shown = path.display().to_string();
        std::fs::create_dir_all(path)
            .map_err(|e| DestError::io("create destination directory", &shown, e))?;
        let fd = openat(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| DestError::io("open destination directory", &shown, e))?;
        Ok(DestRoot {
            root: Arc::new(fd),
            path: path.to_path_buf(),
            policy: MetaPolicy::current(opts.allow_special_bits),
            resolve: opts.resolve,
            replace: opts.replace,
        })
    }

    /// The root directory handle.
    pub fn root(&self) -> &DirFd {
        &self.root
    }
    /// The path the root was opened from (for messages only; never used to reach files).
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn policy(&self) -> &MetaPolicy {
        &self.policy
    }
    /// What a non-directory may replace (pass it to [`StagedFile::commit`] too).
    pub fn replace(&self) -> Replace {
        self.replace
    }

    /// Opens the directory `rel` (`None` = the root) without following symlinks.
    pub fn open_dir(&self, rel: Option<&RelPath>) -> Result<DirFd, DestError> {
        match rel {
            None => Ok(self.root.clone()),
            Some(rel) => open_dir_beneath(self.root.as_fd(), rel, self.resolve)
                .map(Arc::new)
                .map_err(|e| DestError::io("open directory", rel, e)),
        }
    }

    /// The confined handle of `rel`'s parent directory and `rel`'s last component.
    pub fn open_parent<'r>(&self, rel: &'r RelPath) -> Result<(DirFd, &'r [u8]), DestError> {
        let dir = self.open_dir(rel.parent().as_ref())?;
        Ok((dir, rel.file_name()))
    }

    /// Creates `rel` and any missing parents (each with `perm | 0o700` so children can be
    /// written; set the final mode with [`DestRoot::set_dir_meta`]). A non-directory in the way
    /// (a file or a symlink) is replaced. Returns the directory's handle.
    pub fn create_dir_all(&self, rel: &RelPath, perm: u32) -> Result<DirFd, DestError> {
        self.ensure_dir_all(rel, perm).map(|(dir, _)| dir)
    }

    /// [`DestRoot::create_dir_all`], also telling whether `rel` itself was created (then it is
    /// empty but for what the caller puts there).
    pub fn ensure_dir_all(&self, rel: &RelPath, perm: u32) -> Result<(DirFd, bool), DestError> {
        let mut current = self.root.clone();
        let mut created = false;
        for name in rel.components() {
            let (fd, made) = ensure_dir_at(current.as_fd(), name, perm)
                .map_err(|e| DestError::io("create directory", rel, e))?;
            current = Arc::new(fd);
            created = made;
        }
        Ok((current, created))
    }

    /// Starts writing the file `rel` under a temporary name in its directory.
    pub fn stage_file(&self, rel: &RelPath, perm: u32) -> Result<StagedFile, DestError> {
        let (dir, name) = self.open_parent(rel)?;
        StagedFile::create_in(&dir, name, perm, self.policy)
            .map_err(|e| DestError::io("create a temporary file for", rel, e))
    }

    /// Creates or replaces the symlink `rel` with `target` (stored verbatim, never followed); a
    /// directory there is replaced per [`DestOptions::replace`].
    pub fn symlink(&self, rel: &RelPath, target: &[u8], meta: &Meta) -> Result<Placed, DestError> {
        let (dir, name) = self.open_parent(rel)?;
        symlink_at(dir.as_fd(), name, target, meta, &self.policy, self.replace)
            .map_err(|e| e.at(rel))
    }

    /// Makes `new` a hard link to the existing file `existing`, replacing what `new` held (a
    /// directory per [`DestOptions::replace`]). `None` when both already were the same inode.
    pub fn hard_link(
        &self,
        existing: &RelPath,
        new: &RelPath,
    ) -> Result<Option<Placed>, DestError> {
        let (old_dir, old_name) = self.open_parent(existing)?;
        let (new_dir, new_name) = self.open_parent(new)?;
        hard_link_at(
            old_dir.as_fd(),
            old_name,
            new_dir.as_fd(),
            new_name,
            self.replace,
        )
        .map_err(|e| e.at(new))
    }

    /// Removes `rel`, whatever it is (a directory with everything in it).
    pub fn remove(&self, rel: &RelPath) -> Result<(), DestError> {
        let (dir, name) = self.open_parent(rel)?;
        remove_at(dir.as_fd(), name).map_err(|e| DestError::io("remove", rel, e))
    }

    /// `lstat` of `rel`; `None` if it does not exist.
    pub fn lookup(&self, rel: &RelPath) -> Result<Option<Meta>, DestError> {
        let (dir, name) = match self.open_parent(rel) {
            Ok(v) => v,
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        lookup_at(dir.as_fd(), name).map_err(|e| DestError::io("look up", rel, e))
    }

    /// Applies mode, owner and times to the directory `rel` (`None` = the root). Call it after the
    /// directory's children are written, or their creation moves its mtime again.
    pub fn set_dir_meta(&self, rel: Option<&RelPath>, meta: &Meta) -> Result<(), DestError> {
        let dir = self.open_dir(rel)?;
        self.policy
            .apply_fd(dir.as_fd(), meta, None)
            .map_err(|source| DestError::Meta {
                path: display_opt(rel),
                source,
            })
    }

    /// Opens a file at a caller-chosen confined path (for example a resumable staging file under
    /// `.ferry-staging/`); publish it with [`DestRoot::apply_meta`] + [`DestRoot::rename`].
    pub fn open_file(&self, rel: &RelPath, how: FileOpen) -> Result<std::fs::File, DestError> {
        let (dir, name) = self.open_parent(rel)?;
        let base = OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let (flags, perm) = match how {
            FileOpen::CreateNew { perm } => {
                (base | OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, perm)
            }
            FileOpen::OpenOrCreate { perm } => (base | OFlags::RDWR | OFlags::CREATE, perm),
            FileOpen::Existing => (base | OFlags::RDWR, 0),
            FileOpen::Read => (base | OFlags::RDONLY, 0),
        };
        let fd = openat(dir.as_fd(), name, flags, Mode::from_raw_mode(perm & 0o777))
            .map_err(|e| DestError::io("open file", rel, e))?;
        Ok(std::fs::File::from(fd))
    }

    /// Applies `meta` to an open file (mode per policy, owner when root, times).
    pub fn apply_meta(
        &self,
        fd: BorrowedFd<'_>,
        rel: &RelPath,
        meta: &Meta,
    ) -> Result<(), DestError> {
        self.policy
            .apply_fd(fd, meta, None)
            .map_err(|source| DestError::Meta {
                path: rel.to_string(),
                source,
            })
    }

    /// Renames the file `from` to `to` (both beneath the root), replacing what `to` held: a
    /// file or link, or a directory per [`DestOptions::replace`].
    pub fn rename(&self, from: &RelPath, to: &RelPath) -> Result<Placed, DestError> {
        let (from_dir, from_name) = self.open_parent(from)?;
        let (to_dir, to_name) = self.open_parent(to)?;
        rename_replacing(
            from_dir.as_fd(),
            from_name,
            to_dir.as_fd(),
            to_name,
            self.replace,
        )
        .map_err(|e| match e {
            PlaceError::NonEmptyDir => NonEmptyDir::named(to_name, "a file").at(to).into(),
            PlaceError::Io(e) => DestError::io("rename", from, e),
        })
    }

    /// Removes leftover temporary files (`.ferry-tmp.*`) directly inside `dir`; returns how many.
    pub fn clean_temps_in(dir: BorrowedFd<'_>) -> Result<u64, Errno> {
        let mut removed = 0;
        for entry in list_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if is_temp_name(name) && unlinkat(dir, name, AtFlags::empty()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Lists a directory through a fresh handle (the caller's handle keeps its own file position).
pub fn list_dir(dir: BorrowedFd<'_>) -> Result<Dir, Errno> {
    Dir::read_from(dir)
}

/// `lstat` of `name` in `dir`; `None` when it does not exist.
pub fn lookup_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<Meta>, Errno> {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Meta::from_stat(&st))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `filter` excludes the destination entry `name` (of type `file_type`, as listed) in
/// the directory `dir` at relative path `parent` (None: the root): `--delete` keeps such entries.
pub fn excluded_listing_entry(
    filter: &super::Filter,
    parent: Option<&[u8]>,
    name: &[u8],
    file_type: rustix::fs::FileType,
    dir: BorrowedFd<'_>,
) -> bool {
    if filter.is_empty() {
        return false;
    }
    let is_dir = match file_type {
        rustix::fs::FileType::Directory => true,
        rustix::fs::FileType::Unknown => {
            matches!(lookup_at(dir, name), Ok(Some(m)) if m.kind == Kind::Dir)
        }
        _ => false,
    };
    let rel = match parent {
        Some(p) => [p, b"/", name].concat(),
        None => name.to_vec(),
    };
    filter.excludes(&rel, is_dir)
}

/// Makes sure `name` in `parent` is a directory (creating it with `perm | 0o700`, or replacing a
/// non-directory there) and opens it without following a symlink. Returns the handle and whether
/// the directory was created now (so it is known to be empty).
pub fn ensure_dir_at(
    parent: BorrowedFd<'_>,
    name: &[u8],
    perm: u32,
) -> Result<(OwnedFd, bool), Errno> {
    let mode = Mode::from_raw_mode((perm & 0o777) | 0o700);
    let created = match mkdirat(parent, name, mode) {
        Ok(()) => true,
        Err(Errno::EXIST) => false,
        Err(e) => return Err(e),
    };
    match openat(parent, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok((fd, created)),
        // Something that is not a directory (a file, or a symlink we refuse to follow) is in the
        // way: the source says a directory belongs here, so replace it.
        Err(Errno::NOTDIR | Errno::LOOP) if !created => {
            unlinkat(parent, name, AtFlags::empty())?;
            mkdirat(parent, name, mode)?;
            Ok((openat(parent, name, DIR_FLAGS, Mode::empty())?, true))
        }
        Err(e) => Err(e),
    }
}

/// True when `name` in `parent` is a directory with no entries (never following a symlink).
pub fn dir_is_empty_at(parent: BorrowedFd<'_>, name: &[u8]) -> Result<bool, Errno> {
    let dir = openat(parent, name, DIR_FLAGS, Mode::empty())?;
    for entry in list_dir(dir.as_fd())? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes `name` in `dir`: a file or link with unlink, a directory with everything beneath it.
/// Never follows a symlink (a link to a directory is removed as a link). The walk is iterative
/// and holds at most [`OPEN_LEVELS`] directory handles, so a tree of any depth (a hostile
/// destination may be thousands of levels deep) costs neither stack nor descriptors.
pub fn remove_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    match unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => remove_tree(dir, name),
        Err(e) => Err(e),
    }
}

/// Directory handles [`remove_at`] keeps open while it descends; ancestors above them are
/// reopened by name (beneath the handle it started from, never following a symlink).
const OPEN_LEVELS: usize = 64;

/// One directory on the way down: its name in its parent, its handle (unless closed to bound
/// descriptors) and the subdirectories still to remove.
struct Level {
    name: Vec<u8>,
    fd: Option<OwnedFd>,
    subdirs: Vec<Vec<u8>>,
}

fn remove_tree(base: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    let fd = match openat(base, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    let subdirs = remove_files(fd.as_fd())?;
    let mut stack = vec![Level {
        name: name.to_vec(),
        fd: Some(fd),
        subdirs,
    }];
    loop {
        let Some(top) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(child) = top.subdirs.pop() {
            let here = reopen(base, &mut stack)?;
            let fd = match openat(here.as_fd(), &child, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => continue,
                // Replaced by a non-directory meanwhile: remove that.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    match unlinkat(here.as_fd(), &child, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            let subdirs = remove_files(fd.as_fd())?;
            stack.push(Level {
                name: child,
                fd: Some(fd),
                subdirs,
            });
            if stack.len() > OPEN_LEVELS {
                let far = stack.len() - 1 - OPEN_LEVELS;
                stack[far].fd = None;
            }
        } else {
            let done = stack.pop().ok_or(Errno::INVAL)?;
            drop(done.fd);
            let r = if stack.is_empty() {
                unlinkat(base, &done.name, AtFlags::REMOVEDIR)
            } else {
                let parent = reopen(base, &mut stack)?;
                unlinkat(parent.as_fd(), &done.name, AtFlags::REMOVEDIR)
            };
            match r {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A handle on the deepest directory of `stack`, reopening closed levels by name from the
/// deepest open ancestor (or `base`); the reopened handles of the last [`OPEN_LEVELS`] levels are
/// kept, so climbing out of a deep tree reopens each level about once per window.
fn reopen(base: BorrowedFd<'_>, stack: &mut [Level]) -> Result<OwnedFd, Errno> {
    let open_from = stack.iter().rposition(|l| l.fd.is_some());
    let mut cur: OwnedFd = match open_from {
        Some(i) => rustix::io::dup(stack[i].fd.as_ref().ok_or(Errno::BADF)?)?,
        None => rustix::io::dup(base)?,
    };
    let start = open_from.map_or(0, |i| i + 1);
    let keep_from = stack.len().saturating_sub(OPEN_LEVELS);
    for (i, level) in stack.iter_mut().enumerate().skip(start) {
        cur = openat(cur.as_fd(), &level.name, DIR_FLAGS, Mode::empty())?;
        if i >= keep_from {
            level.fd = Some(rustix::io::dup(&cur)?);
        }
    }
    Ok(cur)
}

/// Unlinks every non-directory in `dir`; returns the names of its subdirectories.
fn remove_files(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>, Errno> {
    let mut subdirs = Vec::new();
    for entry in list_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if entry.file_type() == FileType::Directory {
            subdirs.push(name.to_vec());
            continue;
        }
        match unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) => subdirs.push(name.to_vec()),
            Err(e) => return Err(e),
        }
    }
    Ok(subdirs)
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The process id, fetched once (it is part of every temporary name).
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// A fresh temporary name: prefix, pid, per-process sequence number.
fn temp_name() -> CString {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!(".ferry-tmp.{:x}.{seq:x}", pid());
    // The format has no NUL byte; fall back to a constant that cannot fail either.
    CString::new(name).unwrap_or_else(|_| c".ferry-tmp.x".to_owned())
}

/// Creates a new temp file in `dir`, retrying if a stale file from an earlier process took the name.
fn create_temp(dir: BorrowedFd<'_>, perm: u32, flags: OFlags) -> Result<(CString, OwnedFd), Errno> {
    loop {
        let name = temp_name();
        match openat(
            dir,
            name.as_c_str(),
            flags | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(perm & 0o777),
        ) {
            Ok(fd) => return Ok((name, fd)),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Why a non-directory could not be put at its name.
#[derive(Debug)]
enum PlaceError {
    /// A non-empty directory is there and [`Replace::EmptyDirOnly`] keeps it.
    NonEmptyDir,
    Io(Errno),
}

/// Renames the non-directory `from` over `to_name` in `to_dir`. A file, link or special file
/// there is replaced by the rename itself; a directory there (the source has a non-directory
/// there now) is removed first as `replace` allows.
fn rename_replacing(
    from_dir: BorrowedFd<'_>,
    from: impl rustix::path::Arg + Copy,
    to_dir: BorrowedFd<'_>,
    to_name: &[u8],
    replace: Replace,
) -> Result<Placed, PlaceError> {
    match renameat(from_dir, from, to_dir, to_name) {
        Ok(()) => Ok(Placed::Plain),
        // A non-directory cannot be renamed over a directory.
        Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
            let placed = clear_dir_in_the_way(to_dir, to_name, replace)?;
            renameat(from_dir, from, to_dir, to_name).map_err(PlaceError::Io)?;
            Ok(placed)
        }
        Err(e) => Err(PlaceError::Io(e)),
    }
}

/// Removes the directory `name` in `dir` where a non-directory goes: an empty one always (one
/// entry replaced by one), a non-empty one only with [`Replace::AnyDir`]. `rmdir` decides
/// atomically, so an entry created in it meanwhile is never lost.
fn clear_dir_in_the_way(
    dir: BorrowedFd<'_>,
    name: &[u8],
    replace: Replace,
) -> Result<Placed, PlaceError> {
    match unlinkat(dir, name, AtFlags::REMOVEDIR) {
        // Gone or no longer a directory: the retried rename replaces whatever is there.
        Ok(()) | Err(Errno::NOENT | Errno::NOTDIR) => Ok(Placed::Plain),
        Err(Errno::NOTEMPTY | Errno::EXIST) => match replace {
            Replace::EmptyDirOnly => Err(PlaceError::NonEmptyDir),
            Replace::AnyDir => {
                remove_at(dir, name).map_err(PlaceError::Io)?;
                Ok(Placed::OverNonEmptyDir)
            }
        },
        Err(e) => Err(PlaceError::Io(e)),
    }
}

/// Failure of a symlink or hard-link operation before the path is known to the caller.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("failed to {0}")]
    Io(&'static str, #[source] std::io::Error),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    NonEmptyDir(NonEmptyDir),
}

impl LinkError {
    /// The same failure naming the whole path `rel`.
    pub fn at(self, rel: &(impl ToString + ?Sized)) -> DestError {
        match self {
            LinkError::Io(op, source) => DestError::Io {
                op,
                path: rel.to_string(),
                source,
            },
            LinkError::Meta(source) => DestError::Meta {
                path: rel.to_string(),
                source,
            },
            LinkError::NonEmptyDir(e) => DestError::NonEmptyDir(e.at(rel)),
        }
    }
}

/// Creates the symlink `name` → `target` in `dir` atomically (temp name, then rename over
/// whatever was there; a directory as `replace` allows). The target is stored verbatim and never
/// followed.
pub fn symlink_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    target: &[u8],
    meta: &Meta,
    policy: &MetaPolicy,
    replace: Replace,
) -> Result<Placed, LinkError> {
    let temp = loop {
        let temp = temp_name();
        match symlinkat(target, dir, temp.as_c_str()) {
            Ok(()) => break temp,
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(LinkError::Io("create symlink", e.into())),
        }
    };
    let finish = policy
        .apply_link(dir, temp.as_bytes(), meta)
        .map_err(LinkError::Meta)
        .and_then(|()| {
            rename_replacing(dir, temp.as_c_str(), dir, name, replace).map_err(|e| match e {
                PlaceError::NonEmptyDir => {
                    LinkError::NonEmptyDir(NonEmptyDir::named(name, "a symlink"))
                }
                PlaceError::Io(e) => LinkError::Io("rename symlink into place", e.into()),
            })
        });
    if finish.is_err() {
        let _ = unlinkat(dir, temp.as_c_str(), AtFlags::empty());
    }
    finish
}

/// Makes `new_name` in `new_dir` a hard link to `old_name` in `old_dir` (atomically replacing
/// `new_name`; a directory as `replace` allows). Returns `None`, doing nothing, if both already
/// name the same inode.
pub fn hard_link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &[u8],
    new_dir: BorrowedFd<'_>,
    new_name: &[u8],
    replace: Replace,
) -> Result<Option<Placed>, LinkError> {
    let io = |e: Errno| LinkError::Io("hard-link", e.into());
    if let (Some(a), Some(b)) = (
        lookup_at(old_dir, old_name).map_err(io)?,
        lookup_at(new_dir, new_name).map_err(io)?,
    ) && a.dev == b.dev
        && a.ino == b.ino
    {
        return Ok(None);
    }
    loop {
        let temp = temp_name();
        // linkat without AT_SYMLINK_FOLLOW links a symlink itself, never its target.
        match linkat(
            old_dir,
            old_name,
            new_dir,
            temp.as_c_str(),
            AtFlags::empty(),
        ) {
            Ok(()) => {
                let r = rename_replacing(new_dir, temp.as_c_str(), new_dir, new_name, replace);
                if r.is_err() {
                    let _ = unlinkat(new_dir, temp.as_c_str(), AtFlags::empty());
                }
                return match r {
                    Ok(placed) => Ok(Some(placed)),
                    Err(PlaceError::NonEmptyDir) => Err(LinkError::NonEmptyDir(
                        NonEmptyDir::named(new_name, "a hard link"),
                    )),
                    Err(PlaceError::Io(e)) => Err(io(e)),
                };
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(io(e)),
        }
    }
}

/// How an anonymous (`O_TMPFILE`) file can be given a name in this process.
const LINK_UNKNOWN: u8 = 0;
/// `linkat(fd, "", AT_EMPTY_PATH)` works (needs CAP_DAC_READ_SEARCH, e.g. root).
const LINK_EMPTY_PATH: u8 = 1;
/// `linkat("/proc/self/fd/N", AT_SYMLINK_FOLLOW)` works (unprivileged, needs /proc).
const LINK_PROC: u8 = 2;
/// Neither: always use named temporary files.
const LINK_NONE: u8 = 3;
static LINK_MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(LINK_UNKNOWN);

/// Gives the anonymous file `fd` the name `name` in `dir` (fails with EEXIST if it exists).
fn link_anonymous(
    fd: BorrowedFd<'_>,
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    mode: u8,
) -> Result<(), Errno> {
    match mode {
        LINK_EMPTY_PATH => linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH),
        LINK_PROC => {
            let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            linkat(
                rustix::fs::CWD,
                proc_path.as_str(),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
        }
        _ => Err(Errno::NOTSUP),
    }
}

/// Finds out once per process which way of linking anonymous files works, using `fd` (a fresh,
/// still empty O_TMPFILE file in `dir`) and a throwaway name.
fn probe_link_mode(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>) -> u8 {
    let known = LINK_MODE.load(Ordering::Relaxed);
    if known != LINK_UNKNOWN {
        return known;
    }
    let mut found = LINK_NONE;
    for mode in [LINK_EMPTY_PATH, LINK_PROC] {
        let probe = temp_name();
        if link_anonymous(fd, dir, &probe, mode).is_ok() {
            let _ = unlinkat(dir, probe.as_c_str(), AtFlags::empty());
            found = mode;
            break;
        }
    }
    LINK_MODE.store(found, Ordering::Relaxed);
    found
}

/// Where the data of a [`StagedFile`] lives until commit.
#[derive(Debug)]
enum StagedAt {
    /// An `O_TMPFILE` inode with no name at all: linked at the final name on commit, and gone
    /// without a trace if the process dies first. One directory operation per file instead of
    /// create + rename, which matters for many small files.
    Anonymous { link_mode: u8 },
    /// A `.ferry-tmp.*` name in the destination directory, renamed over the final name.
    Named(CString),
}

/// A file being written where no reader of the final path can see it: an anonymous `O_TMPFILE`
/// inode where the filesystem and the process's privileges allow, else a temporary name
/// (`.ferry-tmp.*`) in the destination directory.
///
/// Nothing appears at the final name until [`StagedFile::commit`] links or renames it there, so
/// the final path never holds a torn file, even after `kill -9`. Dropping it uncommitted removes
/// the temp file; a crash leaves a named temp file for the next run's clean-up
/// ([`DestRoot::clean_temps_in`]) and an anonymous one nowhere.
#[derive(Debug)]
pub struct StagedFile {
    dir: DirFd,
    staging: StagedAt,
    name: Box<[u8]>,
    file: OwnedFd,
    perm: u32,
    policy: MetaPolicy,
    committed: bool,
}

impl StagedFile {
    /// Creates the staging file for final entry `name` in the confined directory `dir`, with
    /// permission bits `perm` (under the umask) for now.
    pub fn create_in(
        dir: &DirFd,
        name: &[u8],
        perm: u32,
        policy: MetaPolicy,
    ) -> Result<StagedFile, Errno> {
        let mut link_mode = LINK_MODE.load(Ordering::Relaxed);
        let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
        let mode = Mode::from_raw_mode(perm & 0o777);
        if link_mode == LINK_UNKNOWN {
            // The probe links and unlinks its file, after which that inode cannot be linked
            // again: probe with a throwaway file.
            match openat(dir.as_fd(), c".", flags, mode) {
                Ok(probe) => link_mode = probe_link_mode(probe.as_fd(), dir.as_fd()),
                Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
                Err(e) => return Err(e),
            }
        }
        if link_mode == LINK_EMPTY_PATH || link_mode == LINK_PROC {
            match openat(dir.as_fd(), c".", flags, mode) {
                Ok(file) => {
                    return Ok(StagedFile {
                        dir: dir.clone(),
                        staging: StagedAt::Anonymous { link_mode },
                        name: name.into(),
                        file,
                        perm,
                        policy,
                        committed: false,
                    });
                }
                // Filesystems without O_TMPFILE: use a named temporary file instead.
                Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
                Err(e) => return Err(e),
            }
        }
        Self::create_named_in(dir, name, perm, policy)
    }

    /// Like [`StagedFile::create_in`] but always with a visible `.ferry-tmp.*` name (for callers
    /// that want to see or keep the partial file).
    pub fn create_named_in(
        dir: &DirFd,
        name: &[u8],
        perm: u32,
        policy: MetaPolicy,
    ) -> Result<StagedFile, Errno> {
        let (temp, file) = create_temp(dir.as_fd(), perm, OFlags::WRONLY)?;
        Ok(StagedFile {
            dir: dir.clone(),
            staging: StagedAt::Named(temp),
            name: name.into(),
            file,
            perm,
            policy,
            committed: false,
        })
    }

    /// The open staging file (write-only).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
    /// The temporary name inside the destination directory, `None` for an anonymous file.
    pub fn temp_name(&self) -> Option<&[u8]> {
        match &self.staging {
            StagedAt::Named(n) => Some(n.as_bytes()),
            StagedAt::Anonymous { .. } => None,
        }
    }

    /// Writes all of `data` at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        data::write_all_at(self.file.as_fd(), data, offset)
    }

    /// Copies the whole of `src` (described by `meta`) into this empty file by the fastest path
    /// available (reflink, holes kept, copy_file_range, read/write through `buf`).
    pub fn copy_from(
        &self,
        src: BorrowedFd<'_>,
        meta: &Meta,
        buf: &mut [u8],
        caps: &CopyCaps,
    ) -> Result<(u64, Method), Errno> {
        data::copy_contents(src, self.file.as_fd(), meta, buf, caps)
    }

    /// Sets the length (extending with a hole, or truncating).
    pub fn set_len(&self, len: u64) -> Result<(), Errno> {
        rustix::fs::ftruncate(&self.file, len)
    }

    /// Turns `[offset, offset+len)` into a hole (for all-zero blocks written by a receiver).
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<(), Errno> {
        data::punch_hole(self.file.as_fd(), offset, len)
    }

    /// Applies `meta` (mode per policy, owner when root, times), optionally fsyncs, puts the file
    /// in place (replacing a file or link there, or a directory as `replace` allows) and, with
    /// `sync`, fsyncs the directory.
    pub fn commit(
        mut self,
        meta: &Meta,
        sync: bool,
        replace: Replace,
    ) -> Result<Placed, CommitError> {
        self.place(meta, sync, replace)
    }

    /// [`StagedFile::commit`], then `fstat` of the published file: its metadata as the
    /// filesystem recorded it (what a receiver's transfer digest describes).
    pub fn commit_and_stat(
        mut self,
        meta: &Meta,
        sync: bool,
        replace: Replace,
    ) -> Result<(Placed, Meta), CommitError> {
        let placed = self.place(meta, sync, replace)?;
        let st = rustix::fs::fstat(&self.file).map_err(|e| CommitError::Io("stat", e.into()))?;
        Ok((placed, Meta::from_stat(&st)))
    }

    fn place(&mut self, meta: &Meta, sync: bool, replace: Replace) -> Result<Placed, CommitError> {
        self.policy
            .apply_fd(self.file.as_fd(), meta, Some(self.perm))?;
        if sync {
            rustix::fs::fsync(&self.file).map_err(|e| CommitError::Io("fsync", e.into()))?;
        }
        let placed = match &self.staging {
            StagedAt::Named(temp) => {
                let dir = self.dir.as_fd();
                rename_replacing(dir, temp.as_c_str(), dir, &self.name, replace)
                    .map_err(|e| self.place_error(e))?
            }
            StagedAt::Anonymous { link_mode } => self.link_into_place(*link_mode, replace)?,
        };
        self.committed = true;
        if sync {
            rustix::fs::fsync(&*self.dir)
                .map_err(|e| CommitError::Io("fsync the directory of", e.into()))?;
        }
        Ok(placed)
    }

    /// Names the anonymous file: linked at its name if that is free, else under a temporary
    /// name renamed over what is there.
    fn link_into_place(&self, link_mode: u8, replace: Replace) -> Result<Placed, CommitError> {
        let dir = self.dir.as_fd();
        let fd = self.file.as_fd();
        let name = CString::new(&*self.name)
            .map_err(|_| CommitError::Io("link into place", Errno::INVAL.into()))?;
        match link_anonymous(fd, dir, &name, link_mode) {
            Ok(()) => return Ok(Placed::Plain),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(CommitError::Io("link into place", e.into())),
        }
        let temp = loop {
            let temp = temp_name();
            match link_anonymous(fd, dir, &temp, link_mode) {
                Ok(()) => break temp,
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(CommitError::Io("link into place", e.into())),
            }
        };
        rename_replacing(dir, temp.as_c_str(), dir, &self.name, replace).map_err(|e| {
            let _ = unlinkat(dir, temp.as_c_str(), AtFlags::empty());
            self.place_error(e)
        })
    }

    fn place_error(&self, e: PlaceError) -> CommitError {
        match e {
            PlaceError::NonEmptyDir => {
                CommitError::NonEmptyDir(NonEmptyDir::named(&self.name, "a file"))
            }
            PlaceError::Io(e) => CommitError::Io("rename into place", e.into()),
        }
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if !self.committed
            && let StagedAt::Named(temp) = &self.staging
        {
            let _ = unlinkat(self.dir.as_fd(), temp.as_c_str(), AtFlags::empty());
        }
    }
}

/// Failure of [`StagedFile::commit`]; the temp file is removed.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("failed to {0}")]
    Io(&'static str, #[source] std::io::Error),
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// Names only the file's last component; see [`NonEmptyDir::at`].
    #[error(transparent)]
    NonEmptyDir(NonEmptyDir),
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::parse(s.as_bytes()).expect("valid")
    }

    fn file_meta(mode: u32, size: u64) -> Meta {
        Meta::new(Kind::File, mode, size, 1_600_000_000, 123_456_789)
    }

    /// Lists everything under `dir` (to prove nothing appeared outside the destination).
    fn snapshot(dir: &Path) -> Vec<(String, u32, i64)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir") {
                let e = e.expect("entry");
                let md = std::fs::symlink_metadata(e.path()).expect("lstat");
                out.push((e.path().display().to_string(), md.mode(), md.mtime()));
                if md.is_dir() {
                    stack.push(e.path());
                }
            }
        }
        out.sort();
        out
    }

    /// A symlink planted in the destination pointing outside must not let any write, mkdir,
    /// rename, chmod or remove reach the outside directory.
    #[test]
    fn hostile_symlink_in_destination_cannot_be_escaped() {
        for resolve in [Resolve::Auto, Resolve::Walk] {
            let dst = tempfile::tempdir().expect("tempdir");
            let outside = tempfile::tempdir().expect("tempdir");
            std::fs::write(outside.path().join("victim"), b"keep").expect("write");
            std::fs::create_dir(outside.path().join("sub")).expect("mkdir");
            std::os::unix::fs::symlink(outside.path(), dst.path().join("evil")).expect("plant");
            let before = snapshot(outside.path());
            let root = DestRoot::open_with(
                dst.path(),
                DestOptions {
                    resolve,
                    ..Default::default()
                },
            )
            .expect("open root");
            let meta = file_meta(0o777, 1);

            assert!(
                root.stage_file(&rel("evil/new"), 0o644).is_err(),
                "write through link"
            );
            assert!(
                root.stage_file(&rel("evil/sub/new"), 0o644).is_err(),
                "deep write"
            );
            assert!(
                root.open_file(&rel("evil/victim"), FileOpen::Existing)
                    .is_err(),
                "open victim"
            );
            assert!(
                root.set_dir_meta(Some(&rel("evil/sub")), &meta).is_err(),
                "chmod through link"
            );
            assert!(
                root.remove(&rel("evil/victim")).is_err(),
                "remove through link"
            );
            assert!(root.remove(&rel("evil/sub")).is_err(), "rmdir through link");
            assert!(
                root.symlink(&rel("evil/l"), b"x", &meta).is_err(),
                "symlink through link"
            );
            assert!(
                root.rename(&rel("evil/victim"), &rel("stolen")).is_err(),
                "rename out"
            );
            assert!(
                root.hard_link(&rel("evil/victim"), &rel("stolen")).is_err(),
                "link out"
            );
            assert_eq!(
                root.lookup(&rel("evil/victim")).ok().flatten(),
                None,
                "lookup through link"
            );
            // Ops on the link itself act on the link, not on what it points to.
            let created = root
                .create_dir_all(&rel("evil/deeper"), 0o755)
                .expect("mkdir replaces link");
            drop(created);
            assert!(
                std::fs::symlink_metadata(dst.path().join("evil"))
                    .expect("lstat")
                    .is_dir()
            );
            assert_eq!(
                snapshot(outside.path()),
                before,
                "{resolve:?}: outside changed"
            );
            assert_eq!(
                std::fs::read(outside.path().join("victim")).expect("read"),
                b"keep"
            );
        }
    }

    #[test]
    fn a_tree_thousands_of_levels_deep_is_removed_without_recursion() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = std::fs::File::open(tmp.path()).expect("root");
        // 5000 levels, each with a file, built beneath handles (the path exceeds PATH_MAX).
        let mut cur: OwnedFd = rustix::io::dup(root.as_fd()).expect("dup");
        for i in 0..5000 {
            let name = if i == 0 { "top" } else { "d" };
            rustix::fs::mkdirat(cur.as_fd(), name, Mode::from_raw_mode(0o755)).expect("mkdir");
            let f = openat(
                cur.as_fd(),
                "f",
                OFlags::CREATE | OFlags::WRONLY,
                Mode::from_raw_mode(0o644),
            )
            .expect("file");
            drop(f);
            cur = openat(cur.as_fd(), name, DIR_FLAGS, Mode::empty()).expect("open");
        }
        drop(cur);
        // A small stack, as on a blocking worker thread: recursion would overflow it.
        let fd = root.as_fd().try_clone_to_owned().expect("dup");
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || remove_at(fd.as_fd(), b"top"))
            .expect("thread")
            .join()
            .expect("no stack overflow")
            .expect("removed");
        assert!(!tmp.path().join("top").exists());
        assert!(
            tmp.path().join("f").exists(),
            "nothing beside the tree touched"
        );
    }

    #[test]
    fn removing_a_link_to_a_directory_removes_only_the_link() {
        let dst = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("victim"), b"keep").expect("write");
        std::os::unix::fs::symlink(outside.path(), dst.path().join("evil")).expect("plant");
        let root = DestRoot::open(dst.path()).expect("open");
        root.remove(&rel("evil")).expect("remove link");
        assert!(!dst.path().join("evil").exists());
        assert!(outside.path().join("victim").exists());
    }

    #[test]
    fn staged_file_is_invisible_until_commit_and_removed_on_drop() {
        let dst = tempfile::tempdir().expect("tempdir");
        let root = DestRoot::open(dst.path()).expect("open");
        std::fs::write(dst.path().join("f"), b"old contents").expect("write");
        let dir = root.open_dir(None).expect("root");
        let staged = StagedFile::create_named_in(&dir, b"f", 0o600, *root.policy()).expect("stage");
        staged.write_at(0, b"new").expect("write");
        let temp = String::from_utf8(staged.temp_name().expect("named").to_vec()).expect("utf8");
        assert!(temp.starts_with(".ferry-tmp."));
        assert_eq!(
            std::fs::read(dst.path().join("f")).expect("read"),
            b"old contents"
        );
        assert!(dst.path().join(&temp).exists());
        drop(staged);
        assert!(!dst.path().join(&temp).exists(), "temp removed on drop");
        assert_eq!(
            std::fs::read(dst.path().join("f")).expect("read"),
            b"old contents"
        );

        let staged = root.stage_file(&rel("f"), 0o600).expect("stage");
        staged.write_at(0, b"new").expect("write");
        staged
            .commit(&file_meta(0o640, 3), false, Replace::EmptyDirOnly)
            .expect("commit");
        assert_eq!(std::fs::read(dst.path().join("f")).expect("read"), b"new");
        let md = std::fs::metadata(dst.path().join("f")).expect("stat");
        assert_eq!(md.permissions().mode() & 0o7777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
        let leftovers: Vec<_> = std::fs::read_dir(dst.path())
            .expect("read_dir")
            .filter_map(|e| e.ok())
            .filter(|e| is_temp_name(e.file_name().as_encoded_bytes()))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn anonymous_staged_file_leaves_no_name_until_commit() {
        let dst = tempfile::tempdir().expect("tempdir");
        let root = DestRoot::open(dst.path()).expect("open");
        let listing = || {
            let mut names: Vec<_> = std::fs::read_dir(dst.path())
                .expect("read_dir")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let staged = root.stage_file(&rel("g"), 0o644).expect("stage");
        staged.write_at(0, b"partial").expect("write");
        assert!(
            listing().is_empty(),
            "staging must not be visible: {:?}",
            listing()
        );
        drop(staged);
        assert!(listing().is_empty());
        let staged = root.stage_file(&rel("g"), 0o644).expect("stage");
        staged.write_at(0, b"whole").expect("write");
        staged
            .commit(&file_meta(0o644, 5), false, Replace::EmptyDirOnly)
            .expect("commit");
        assert_eq!(listing(), vec!["g".to_owned()]);
        assert_eq!(std::fs::read(dst.path().join("g")).expect("read"), b"whole");
    }

    #[test]
    fn special_bits_only_with_permission() {
        let dst = tempfile::tempdir().expect("tempdir");
        let strict = DestRoot::open(dst.path()).expect("open");
        let s = strict.stage_file(&rel("a"), 0o755).expect("stage");
        s.commit(&file_meta(0o4755, 0), false, Replace::EmptyDirOnly)
            .expect("commit");
        let mode = std::fs::metadata(dst.path().join("a"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "setuid from a peer must be dropped");
        let lax = DestRoot::open_with(
            dst.path(),
            DestOptions {
                allow_special_bits: true,
                ..Default::default()
            },
        )
        .expect("open");
        let s = lax.stage_file(&rel("b"), 0o755).expect("stage");
        s.commit(&file_meta(0o4755, 0), false, Replace::EmptyDirOnly)
            .expect("commit");
        let mode = std::fs::metadata(dst.path().join("b"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o4755);
    }

    #[test]
    fn symlink_hard_link_lookup_and_temp_cleanup() {
        let dst = tempfile::tempdir().expect("tempdir");
        let root = DestRoot::open(dst.path()).expect("open");
        root.create_dir_all(&rel("d/e"), 0o755).expect("mkdir");
        let meta = Meta::new(Kind::Symlink, 0o777, 0, 1_500_000_000, 7);
        root.symlink(&rel("d/l"), b"../../../etc/passwd", &meta)
            .expect("symlink");
        assert_eq!(
            std::fs::read_link(dst.path().join("d/l"))
                .expect("readlink")
                .as_os_str()
                .as_encoded_bytes(),
            b"../../../etc/passwd"
        );
        let got = root.lookup(&rel("d/l")).expect("lookup").expect("exists");
        assert_eq!(
            (got.kind, got.mtime_sec, got.mtime_nsec),
            (Kind::Symlink, 1_500_000_000, 7)
        );
        std::fs::write(dst.path().join("d/f"), b"data").expect("write");
        root.hard_link(&rel("d/f"), &rel("d/e/g")).expect("link");
        let a = std::fs::metadata(dst.path().join("d/f")).expect("stat");
        let b = std::fs::metadata(dst.path().join("d/e/g")).expect("stat");
        assert_eq!(a.ino(), b.ino());
        std::fs::write(dst.path().join("d/.ferry-tmp.dead.1"), b"partial").expect("write");
        let d = root.open_dir(Some(&rel("d"))).expect("open dir");
        assert_eq!(DestRoot::clean_temps_in(d.as_fd()).expect("clean"), 1);
        assert!(!dst.path().join("d/.ferry-tmp.dead.1").exists());
        assert!(root.lookup(&rel("d/missing/x")).expect("lookup").is_none());
    }

    /// What stands at the name before a non-directory is put there.
    #[derive(Debug, Clone, Copy)]
    enum InTheWay {
        EmptyDir,
        NonEmptyDir,
    }

    /// A commit names only the last component; callers name the whole path.
    fn commit_message(e: CommitError, rel_path: &RelPath) -> String {
        match e {
            CommitError::NonEmptyDir(refused) => refused.at(rel_path).to_string(),
            e => e.to_string(),
        }
    }

    /// Puts a non-directory at `rel` in one of the five ways the tree layer can; returns what
    /// `Placed` said or the error.
    fn place(
        root: &DestRoot,
        how: &str,
        rel_path: &RelPath,
        replace: Replace,
    ) -> Result<Placed, String> {
        let meta = file_meta(0o644, 1);
        let dir = root.open_dir(rel_path.parent().as_ref()).expect("parent");
        let name = rel_path.file_name();
        match how {
            "anonymous file" => {
                let staged =
                    StagedFile::create_in(&dir, name, 0o644, *root.policy()).expect("stage");
                staged.write_at(0, b"n").expect("write");
                staged
                    .commit(&meta, false, replace)
                    .map_err(|e| commit_message(e, rel_path))
            }
            "named file" => {
                let staged =
                    StagedFile::create_named_in(&dir, name, 0o644, *root.policy()).expect("stage");
                staged.write_at(0, b"n").expect("write");
                staged
                    .commit(&meta, false, replace)
                    .map_err(|e| commit_message(e, rel_path))
            }
            "symlink" => symlink_at(dir.as_fd(), name, b"t", &meta, root.policy(), replace)
                .map_err(|e| e.at(rel_path).to_string()),
            "hard link" => {
                std::fs::write(root.path().join("source-of-link"), b"n").expect("write");
                let source = rel("source-of-link");
                let (old_dir, old_name) = root.open_parent(&source).expect("parent");
                hard_link_at(old_dir.as_fd(), old_name, dir.as_fd(), name, replace)
                    .map(|p| p.expect("not the same inode"))
                    .map_err(|e| e.at(rel_path).to_string())
            }
            "rename" => {
                std::fs::write(root.path().join("staged"), b"n").expect("write");
                let opened = DestRoot::open_with(
                    root.path(),
                    DestOptions {
                        replace,
                        ..Default::default()
                    },
                )
                .expect("open");
                opened
                    .rename(&rel("staged"), rel_path)
                    .map_err(|e| e.to_string())
            }
            other => panic!("unknown way {other}"),
        }
    }

    /// A non-empty directory is never replaced by a non-directory unless the policy allows it
    /// (`--delete`); an empty one always is (one entry for one). Every way of putting a
    /// non-directory in place follows the rule.
    #[test]
    fn a_non_empty_directory_is_replaced_only_when_allowed() {
        let ways = [
            "anonymous file",
            "named file",
            "symlink",
            "hard link",
            "rename",
        ];
        let cases = [
            (InTheWay::NonEmptyDir, Replace::EmptyDirOnly, None),
            (
                InTheWay::EmptyDir,
                Replace::EmptyDirOnly,
                Some(Placed::Plain),
            ),
            (InTheWay::EmptyDir, Replace::AnyDir, Some(Placed::Plain)),
            (
                InTheWay::NonEmptyDir,
                Replace::AnyDir,
                Some(Placed::OverNonEmptyDir),
            ),
        ];
        for way in ways {
            for (in_the_way, replace, expected) in cases {
                let label = format!("{way} over {in_the_way:?} with {replace:?}");
                let dst = tempfile::tempdir().expect("tempdir");
                let root = DestRoot::open(dst.path()).expect("open");
                let target = dst.path().join("sub/f");
                std::fs::create_dir_all(&target).expect("mkdir");
                if let InTheWay::NonEmptyDir = in_the_way {
                    std::fs::create_dir(target.join("deeper")).expect("mkdir");
                    std::fs::write(target.join("deeper/inner"), b"z").expect("write");
                }
                let got = place(&root, way, &rel("sub/f"), replace);
                let md = std::fs::symlink_metadata(&target).expect("lstat");
                match expected {
                    None => {
                        let err = got.expect_err(&label);
                        assert!(
                            err.contains("refusing to replace non-empty directory sub/f")
                                && err.contains("--delete"),
                            "{label}: {err}"
                        );
                        assert!(md.is_dir(), "{label}: directory kept");
                        assert_eq!(
                            std::fs::read(target.join("deeper/inner")).expect("read"),
                            b"z",
                            "{label}: contents kept"
                        );
                    }
                    Some(placed) => {
                        assert_eq!(got, Ok(placed), "{label}");
                        assert!(!md.is_dir(), "{label}: replaced");
                    }
                }
                let temps: Vec<_> = std::fs::read_dir(dst.path().join("sub"))
                    .expect("read_dir")
                    .filter_map(|e| e.ok())
                    .filter(|e| is_temp_name(e.file_name().as_encoded_bytes()))
                    .collect();
                assert!(temps.is_empty(), "{label}: temporary left behind");
            }
        }
    }

    #[test]
    fn replacing_a_file_or_link_is_plain_and_emptiness_is_seen() {
        let dst = tempfile::tempdir().expect("tempdir");
        let root = DestRoot::open(dst.path()).expect("open");
        std::fs::write(dst.path().join("f"), b"old").expect("write");
        std::os::unix::fs::symlink("f", dst.path().join("l")).expect("symlink");
        for name in ["f", "l"] {
            let staged = root.stage_file(&rel(name), 0o644).expect("stage");
            let placed = staged
                .commit(&file_meta(0o644, 0), false, Replace::EmptyDirOnly)
                .expect("commit");
            assert_eq!(placed, Placed::Plain, "{name}");
        }
        std::fs::create_dir_all(dst.path().join("e")).expect("mkdir");
        std::fs::create_dir_all(dst.path().join("n/x")).expect("mkdir");
        let fd = root.root().as_fd();
        assert_eq!(dir_is_empty_at(fd, b"e"), Ok(true));
        assert_eq!(dir_is_empty_at(fd, b"n"), Ok(false));
        assert_eq!(dir_is_empty_at(fd, b"f"), Err(Errno::NOTDIR));
    }
}
