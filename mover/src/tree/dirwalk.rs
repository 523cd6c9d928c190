//! A walk of a tree's directories only: each directory with its metadata and the names in it,
//! in path order (a directory, then its subdirectories by name). Every directory is opened
//! beneath its parent's handle without following symlinks, so a directory swapped for a symlink
//! while the tree is in use is left out, never followed outside the tree. Entries are told apart
//! by the directory listing's type (`d_type`), so nothing but directories is stat-ed: the
//! network sender walks its directories once more after the data to send their final metadata,
//! and that walk costs one `fstat` per directory, not one per file as the full [`super::Scanner`].
//!
//! Memory: one open handle per level with subdirectories still to visit, the names of the
//! directories waiting on each level, and the listing of the directory being reported.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, openat, statat};
use rustix::io::Errno;

use super::confine::DIR_FLAGS;
use super::dest::DirFd;
use super::filter::Filter;
use super::meta::Meta;
use super::relpath::{RelPath, display_opt};
use super::scan::ScanError;

/// One directory of the walk.
#[derive(Debug)]
pub struct DirVisit {
    /// `None` is the root.
    pub rel: Option<RelPath>,
    pub meta: Meta,
    /// Its parent's handle and its name (for calls that take a name beneath a handle); `None`
    /// for the root.
    pub parent: Option<(DirFd, Vec<u8>)>,
    /// The names in it that the filter keeps, while they fit the listing limit.
    pub names: Vec<Vec<u8>>,
    /// Whether `names` is the whole listing (false when it exceeded the limit).
    pub complete: bool,
}

/// A directory to visit: `name` beneath `parent`.
struct Pending {
    parent: DirFd,
    rel: RelPath,
    name: Vec<u8>,
}

/// Iterator of [`DirVisit`]s (see the module documentation).
pub struct DirWalk {
    root: Option<DirFd>,
    stack: Vec<Pending>,
    filter: Arc<Filter>,
    root_exclude: Option<Vec<u8>>,
    /// Listing bytes (names plus 4 each) kept per directory; `None`: no names at all.
    listing_limit: Option<usize>,
}

impl DirWalk {
    /// Opens the root (a symlink given as the root itself is followed, as by the scanner).
    /// `listing_limit`: keep each directory's names up to that many bytes (for `--delete`).
    pub fn open(
        root: &Path,
        filter: Arc<Filter>,
        listing_limit: Option<usize>,
    ) -> Result<DirWalk, ScanError> {
        let fd = openat(
            rustix::fs::CWD,
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("open source directory", root.display().to_string(), e))?;
        Ok(DirWalk {
            root: Some(Arc::new(fd)),
            stack: Vec::new(),
            filter,
            root_exclude: None,
            listing_limit,
        })
    }

    /// Leaves `name` directly under the root out (a receiver's staging directory).
    pub fn exclude_at_root(mut self, name: &[u8]) -> DirWalk {
        self.root_exclude = Some(name.to_vec());
        self
    }

    /// Lists `fd` (the directory `rel`), queues its subdirectories in name order and returns
    /// its visit.
    fn visit(
        &mut self,
        fd: DirFd,
        rel: Option<RelPath>,
        parent: Option<(DirFd, Vec<u8>)>,
    ) -> Result<DirVisit, ScanError> {
        let shown = || display_opt(rel.as_ref());
        let st = rustix::fs::fstat(&fd).map_err(|e| io("stat directory", shown(), e))?;
        let mut names = Vec::new();
        let mut listing = 0usize;
        let mut complete = self.listing_limit.is_some();
        let mut subdirs = Vec::new();
        let dir = Dir::read_from(fd.as_fd()).map_err(|e| io("read directory", shown(), e))?;
        for ent in dir {
            let ent = ent.map_err(|e| io("read directory", shown(), e))?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if rel.is_none() && self.root_exclude.as_deref() == Some(name) {
                continue;
            }
            let is_dir = match ent.file_type() {
                FileType::Directory => true,
                FileType::Unknown => statat(fd.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
                    .unwrap_or(false),
                _ => false,
            };
            let child = RelPath::child_of(rel.as_ref(), name).ok();
            if !self.filter.is_empty()
                && let Some(c) = &child
                && self.filter.excludes(c.as_bytes(), is_dir)
            {
                continue;
            }
            if is_dir && let Some(c) = child {
                subdirs.push((c, name.to_vec()));
            }
            if let Some(limit) = self.listing_limit
                && complete
            {
                listing += name.len() + 4;
                if listing > limit {
                    complete = false;
                    names = Vec::new();
                } else {
                    names.push(name.to_vec());
                }
            }
        }
        // Popped last first: pushed in reverse name order, visited in name order.
        subdirs.sort_by(|a, b| b.1.cmp(&a.1));
        self.stack
            .extend(subdirs.into_iter().map(|(rel, name)| Pending {
                parent: fd.clone(),
                rel,
                name,
            }));
        Ok(DirVisit {
            rel,
            meta: Meta::from_stat(&st),
            parent,
            names,
            complete,
        })
    }
}

impl Iterator for DirWalk {
    type Item = Result<DirVisit, ScanError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(root) = self.root.take() {
            return Some(self.visit(root, None, None));
        }
        loop {
            let p = self.stack.pop()?;
            match openat(
                p.parent.as_fd(),
                p.name.as_slice(),
                DIR_FLAGS,
                Mode::empty(),
            ) {
                Ok(fd) => {
                    let parent = Some((p.parent, p.name));
                    return Some(self.visit(Arc::new(fd), Some(p.rel), parent));
                }
                // Gone, or no longer a directory (a symlink now stands there): not part of the
                // tree any more.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                Err(e) => return Some(Err(io("open directory", p.rel.to_string(), e))),
            }
        }
    }
}

fn io(op: &'static str, path: String, e: Errno) -> ScanError {
    ScanError::Io {
        op,
        path,
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(root: &Path, limit: Option<usize>) -> Vec<(String, Vec<String>, bool)> {
        DirWalk::open(root, Arc::new(Filter::default()), limit)
            .unwrap()
            .exclude_at_root(b".ferry-staging")
            .map(|v| {
                let v = v.unwrap();
                let mut names: Vec<String> = v
                    .names
                    .iter()
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                names.sort();
                (display_opt(v.rel.as_ref()), names, v.complete)
            })
            .collect()
    }

    #[test]
    fn directories_come_in_path_order_with_their_names() {
        let t = tempfile::tempdir().unwrap();
        for d in ["b/y", "a/x/deep", "a/w", ".ferry-staging/t"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        std::fs::write(t.path().join("a/file"), b"1").unwrap();
        let got = walk(t.path(), Some(1 << 20));
        let order: Vec<&str> = got.iter().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(order, [".", "a", "a/w", "a/x", "a/x/deep", "b", "b/y"]);
        assert_eq!(got[0].1, ["a", "b"]);
        assert_eq!(got[1].1, ["file", "w", "x"]);
        assert!(got.iter().all(|(_, _, complete)| *complete));
    }

    #[test]
    fn a_symlink_to_a_directory_is_a_name_not_a_directory_to_walk() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("secret")).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("d/link")).unwrap();
        let got = walk(t.path(), Some(1 << 20));
        let order: Vec<&str> = got.iter().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(order, [".", "d"]);
        assert_eq!(got[1].1, ["link"]);
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_after_listing_is_left_out() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("d/sub")).unwrap();
        let mut w = DirWalk::open(t.path(), Arc::new(Filter::default()), None).unwrap();
        // The root is listed: `d` is queued as a directory. Then it becomes a symlink out.
        assert!(w.next().unwrap().unwrap().rel.is_none());
        std::fs::rename(t.path().join("d"), t.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("d")).unwrap();
        assert!(w.next().is_none(), "followed a symlink out of the tree");
    }

    #[test]
    fn a_listing_over_the_limit_is_marked_incomplete_and_dropped() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(t.path().join(format!("file{i}")), b"").unwrap();
        }
        let got = walk(t.path(), Some(40));
        assert_eq!((got[0].1.len(), got[0].2), (0, false));
        let got = walk(t.path(), None);
        assert_eq!((got[0].1.len(), got[0].2), (0, false));
    }
}
