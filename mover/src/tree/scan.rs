//! Streaming walk of a source tree.
//!
//! Depth first; a directory is reported before its children and a [`ScanEvent::DirDone`] after
//! them, so a caller can create directories first and set their mtimes last. Symlinks are never
//! followed. Memory is one open directory (handle + read buffer) per level of depth, plus a map of
//! files with more than one link so hard links can be reported as such; nothing else grows with
//! the number of files.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Dir, Mode, OFlags, openat, readlinkat, statat};
use rustix::io::Errno;

use super::confine::DIR_FLAGS;
use super::dest::DirFd;
use super::filter::Filter;
use super::meta::{Kind, Meta};
use super::relpath::{PathError, RelPath, display_opt};

/// One source entry.
#[derive(Debug)]
pub struct Entry {
    pub rel: RelPath,
    pub meta: Meta,
    /// For symlinks: the target bytes, verbatim.
    pub link_target: Option<Vec<u8>>,
    /// For a file with several links: the first path under which this inode was reported.
    pub hardlink_of: Option<RelPath>,
    /// Handle of the directory holding the entry (open `rel.file_name()` relative to it).
    pub parent: DirFd,
    /// For directories: the directory's own handle.
    pub dir: Option<DirFd>,
    /// The file itself, when the walk holds it open already (a single file given as the source:
    /// see [`Scanner::only_file_at_root`]): read from this handle, never by its name.
    pub file: Option<Arc<std::fs::File>>,
}

/// Splits a source as given on a command line: a directory (or a symlink to one) is walked as
/// it is; anything else, such as a single file, is walked as its parent directory holding just
/// that name (see [`Scanner::only_at_root`]), so it lands in the destination under its own name.
pub fn split_source(path: &Path) -> (PathBuf, Option<Vec<u8>>) {
    use std::os::unix::ffi::OsStrExt as _;
    let is_dir = std::fs::metadata(path).map_or(true, |m| m.is_dir());
    match (is_dir, path.file_name()) {
        (false, Some(name)) => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            };
            (parent, Some(name.as_bytes().to_vec()))
        }
        _ => (path.to_owned(), None),
    }
}

/// What the scanner reports.
#[derive(Debug)]
pub enum ScanEvent {
    Entry(Entry),
    /// Everything inside `rel` (`None` = the root) has been reported. `complete` is false when
    /// listing the directory failed part-way (the error was reported before): callers must not
    /// treat its listing as the whole truth (for example to delete extraneous entries).
    DirDone {
        rel: Option<RelPath>,
        meta: Meta,
        dir: DirFd,
        complete: bool,
    },
}

/// A failure to read part of the source; the walk continues with the next entry.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("failed to {op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("skipping an entry with an unusable name in {dir}")]
    Name {
        dir: String,
        #[source]
        source: PathError,
    },
}

impl ScanError {
    fn io(op: &'static str, path: String, e: Errno) -> ScanError {
        ScanError::Io {
            op,
            path,
            source: e.into(),
        }
    }
}

struct Level {
    entries: Dir,
    fd: DirFd,
    rel: Option<RelPath>,
    meta: Meta,
    failed: bool,
    /// Its listing is not read (the root of a walk of one held file: that file is all there is).
    unlisted: bool,
}

/// Streaming source walker (an iterator of `Result<ScanEvent, ScanError>`).
pub struct Scanner {
    stack: Vec<Level>,
    /// A name directly under the root that is not part of the tree (a receiver's staging
    /// directory when the source is itself a receiver's root).
    root_exclude: Option<Vec<u8>>,
    /// The only name directly under the root that is part of the tree (a single file given as
    /// the source is walked as its directory holding just that name).
    root_only: Option<Vec<u8>>,
    /// The single file under the root that is the whole tree, open already (see
    /// [`Scanner::only_file_at_root`]); taken once it was reported.
    held: Option<(Vec<u8>, Arc<std::fs::File>)>,
    /// `--exclude` / `--include`: entries it excludes are not reported (directories not walked).
    filter: Option<Arc<Filter>>,
    links: HashMap<(u64, u64), RelPath>,
    root_meta: Meta,
    root: DirFd,
}

impl Scanner {
    /// Opens the source root (a directory; a symlink given as the root itself is followed, as
    /// with `cp -r`).
    pub fn open(path: &Path) -> Result<Scanner, ScanError> {
        let shown = path.display().to_string();
        let fd = openat(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ScanError::io("open source directory", shown.clone(), e))?;
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| ScanError::io("stat source directory", shown.clone(), e))?;
        let fd: DirFd = Arc::new(fd);
        let entries = Dir::read_from(fd.as_fd())
            .map_err(|e| ScanError::io("read source directory", shown, e))?;
        let meta = Meta::from_stat(&st);
        Ok(Scanner {
            stack: vec![Level {
                entries,
                fd: fd.clone(),
                rel: None,
                meta,
                failed: false,
                unlisted: false,
            }],
            root_exclude: None,
            root_only: None,
            held: None,
            filter: None,
            links: HashMap::new(),
            root_meta: meta,
            root: fd,
        })
    }

    /// Leaves the entry `name` directly under the root (and everything in it) out of the walk.
    pub fn exclude_at_root(mut self, name: &[u8]) -> Scanner {
        self.root_exclude = Some(name.to_vec());
        self
    }

    /// Leaves everything directly under the root but `name` out of the walk.
    pub fn only_at_root(mut self, name: &[u8]) -> Scanner {
        self.root_only = Some(name.to_vec());
        self
    }

    /// The walk is of the single file `name` directly under the root, open already as `file`
    /// (checked to be a regular file): it is reported from that handle (its metadata, and
    /// [`Entry::file`]) without listing the root or looking the name up, so whatever is put
    /// under the name later (a symlink to a directory elsewhere) is never walked nor read.
    pub fn only_file_at_root(mut self, name: &[u8], file: Arc<std::fs::File>) -> Scanner {
        self.root_only = Some(name.to_vec());
        self.held = Some((name.to_vec(), file));
        if let Some(root) = self.stack.first_mut() {
            root.unlisted = true;
        }
        self
    }

    /// The entry of the held single file (see [`Scanner::only_file_at_root`]); None when the
    /// filter leaves it out.
    fn held_entry(
        &self,
        name: &[u8],
        file: Arc<std::fs::File>,
    ) -> Result<Option<ScanEvent>, ScanError> {
        let rel = RelPath::child_of(None, name).map_err(|source| ScanError::Name {
            dir: display_opt(None),
            source,
        })?;
        let st =
            rustix::fs::fstat(&*file).map_err(|e| ScanError::io("stat", rel.to_string(), e))?;
        let meta = Meta::from_stat(&st);
        if let Some(f) = &self.filter
            && f.excludes(rel.as_bytes(), false)
        {
            return Ok(None);
        }
        Ok(Some(ScanEvent::Entry(Entry {
            rel,
            meta,
            link_target: None,
            hardlink_of: None,
            parent: self.root.clone(),
            dir: None,
            file: Some(file),
        })))
    }

    /// Leaves out what `filter` excludes.
    pub fn with_filter(mut self, filter: Arc<Filter>) -> Scanner {
        self.filter = (!filter.is_empty()).then_some(filter);
        self
    }

    /// Metadata of the source root.
    pub fn root_meta(&self) -> &Meta {
        &self.root_meta
    }
    /// Handle of the source root.
    pub fn root(&self) -> &DirFd {
        &self.root
    }

    /// Describes `name` in the innermost directory; pushes a level if it is a directory.
    fn visit(&mut self, name: &[u8]) -> Result<Option<ScanEvent>, ScanError> {
        let Some(top) = self.stack.last() else {
            return Ok(None);
        };
        if top.rel.is_none()
            && (self.root_exclude.as_deref() == Some(name)
                || self.root_only.as_deref().is_some_and(|only| only != name))
        {
            return Ok(None);
        }
        let parent = top.fd.clone();
        let rel = RelPath::child_of(top.rel.as_ref(), name).map_err(|source| ScanError::Name {
            dir: display_opt(top.rel.as_ref()),
            source,
        })?;
        let st = match statat(parent.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Removed between listing and stat: nothing to copy.
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(ScanError::io("stat", rel.to_string(), e)),
        };
        let meta = Meta::from_stat(&st);
        if let Some(f) = &self.filter
            && f.excludes(rel.as_bytes(), meta.kind == Kind::Dir)
        {
            return Ok(None);
        }
        let mut entry = Entry {
            rel,
            meta,
            link_target: None,
            hardlink_of: None,
            parent,
            dir: None,
            file: None,
        };
        match meta.kind {
            Kind::Dir => {
                let fd = openat(entry.parent.as_fd(), name, DIR_FLAGS, Mode::empty())
                    .map_err(|e| ScanError::io("open directory", entry.rel.to_string(), e))?;
                let fd: DirFd = Arc::new(fd);
                let entries = Dir::read_from(fd.as_fd())
                    .map_err(|e| ScanError::io("read directory", entry.rel.to_string(), e))?;
                entry.dir = Some(fd.clone());
                self.stack.push(Level {
                    entries,
                    fd,
                    rel: Some(entry.rel.clone()),
                    meta,
                    failed: false,
                    unlisted: false,
                });
            }
            Kind::Symlink => {
                let target = readlinkat(entry.parent.as_fd(), name, Vec::new())
                    .map_err(|e| ScanError::io("read symlink", entry.rel.to_string(), e))?;
                entry.link_target = Some(target.into_bytes());
            }
            Kind::File if meta.nlink > 1 => {
                if let Some(first) = self.links.get(&(meta.dev, meta.ino)) {
                    entry.hardlink_of = Some(first.clone());
                } else {
                    self.links.insert((meta.dev, meta.ino), entry.rel.clone());
                }
            }
            Kind::File | Kind::Special => {}
        }
        Ok(Some(ScanEvent::Entry(entry)))
    }
}

impl Iterator for Scanner {
    type Item = Result<ScanEvent, ScanError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some((name, file)) = self.held.take() {
            match self.held_entry(&name, file) {
                Ok(Some(event)) => return Some(Ok(event)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        loop {
            let top = self.stack.last_mut()?;
            let next = if top.failed || top.unlisted {
                None
            } else {
                top.entries.read()
            };
            match next {
                None => {
                    let level = self.stack.pop()?;
                    return Some(Ok(ScanEvent::DirDone {
                        rel: level.rel,
                        meta: level.meta,
                        dir: level.fd,
                        complete: !level.failed,
                    }));
                }
                Some(Err(e)) => {
                    // Reported once; the next call closes the directory as incomplete.
                    top.failed = true;
                    let path = display_opt(top.rel.as_ref());
                    return Some(Err(ScanError::io("read directory", path, e)));
                }
                Some(Ok(dirent)) => {
                    let name = dirent.file_name().to_bytes();
                    if name == b"." || name == b".." {
                        continue;
                    }
                    match self.visit(name) {
                        Ok(Some(event)) => return Some(Ok(event)),
                        Ok(None) => continue,
                        Err(e) => return Some(Err(e)),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_come_before_children_and_done_after() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
        std::fs::write(root.join("a/b/f"), b"x").expect("write");
        std::fs::write(root.join("top"), b"y").expect("write");
        std::fs::hard_link(root.join("top"), root.join("a/top2")).expect("link");
        std::os::unix::fs::symlink("../top", root.join("a/l")).expect("symlink");
        let mut order = Vec::new();
        let mut hard = None;
        let mut target = None;
        for ev in Scanner::open(root).expect("open") {
            match ev.expect("event") {
                ScanEvent::Entry(e) => {
                    if e.hardlink_of.is_some() {
                        hard = Some((
                            e.rel.to_string(),
                            e.hardlink_of.as_ref().map(ToString::to_string),
                        ));
                    }
                    if let Some(t) = &e.link_target {
                        target = Some(t.clone());
                    }
                    order.push(format!("+{}", e.rel));
                }
                ScanEvent::DirDone { rel, .. } => {
                    order.push(format!("-{}", display_opt(rel.as_ref())))
                }
            }
        }
        let pos = |s: &str| {
            order
                .iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("{s} missing in {order:?}"))
        };
        assert!(
            pos("+a") < pos("+a/b") && pos("+a/b") < pos("+a/b/f") && pos("+a/b/f") < pos("-a/b")
        );
        assert!(pos("-a/b") < pos("-a") && pos("-a") < pos("-."));
        assert_eq!(order.last().map(String::as_str), Some("-."));
        assert_eq!(target.as_deref(), Some(&b"../top"[..]));
        let (second, first) = hard.expect("hard link reported");
        assert!(["top", "a/top2"].contains(&second.as_str()));
        assert_ne!(Some(second), first);
    }
}
