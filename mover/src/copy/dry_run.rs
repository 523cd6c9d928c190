//! `copy --dry-run`: the same walk and the same decisions as a copy, with nothing written.
//!
//! The source is walked with the copy's scanner (filters, a single file); the destination is
//! only opened for reading, one directory handle per level, and each entry is compared the way
//! the copy's workers compare it. What would change is listed (`-v`, `-i`) and counted in the
//! summary; refusals a copy would make (a non-empty directory in the way without `--delete`)
//! are reported and counted as failures, so the exit status matches the real run's.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use rustix::fs::{Mode, openat, readlinkat};

use super::checksum::same_contents;
use super::{CopyError, CopyOptions, open_source};
use crate::report::CopySummary;
use crate::report::changes::{self, Change};
use crate::tree::confine::DIR_FLAGS;
use crate::tree::dest::{dir_is_empty_at, excluded_listing_entry, list_dir, lookup_at};
use crate::tree::{Entry, Kind, Meta, NonEmptyDir, RelPath, ScanEvent, is_temp_name};

/// Walks `src` against `dst` and reports what a copy with `opts` would do.
pub fn plan_tree(src: &Path, dst: &Path, opts: &CopyOptions) -> Result<CopySummary, CopyError> {
    let started = Instant::now();
    let (scanner, _, single) = open_source(src, &opts.filter)?;
    let root = openat(rustix::fs::CWD, dst, DIR_FLAGS, Mode::empty()).ok();
    let mut plan = Plan {
        opts,
        dst,
        summary: CopySummary::default(),
        buf: Vec::new(),
    };
    // The destination directory of each open source directory (None: it would be created).
    let mut stack: Vec<Option<OwnedFd>> = vec![root];
    for event in scanner {
        let event = match event {
            Ok(ev) => ev,
            Err(e) => {
                plan.fail(&e);
                continue;
            }
        };
        match event {
            ScanEvent::DirDone {
                rel, dir, complete, ..
            } => {
                let Some(dst) = stack.pop() else { continue };
                if let Some(dst) = dst
                    && opts.delete
                    && complete
                    && single.is_none()
                {
                    plan.deletions(rel.as_ref(), dir.as_fd(), dst.as_fd());
                }
            }
            ScanEvent::Entry(entry) => {
                let parent = stack.last().and_then(|d| d.as_ref().map(|d| d.as_fd()));
                if entry.meta.kind == Kind::Dir {
                    let here = plan.dir(&entry, parent);
                    stack.push(here);
                } else {
                    plan.leaf(&entry, parent);
                }
            }
        }
    }
    plan.summary.seconds = started.elapsed().as_secs_f64();
    Ok(plan.summary)
}

struct Plan<'a> {
    opts: &'a CopyOptions,
    /// The destination as given (messages name whole paths).
    dst: &'a Path,
    summary: CopySummary,
    buf: Vec<u8>,
}

impl Plan<'_> {
    fn fail(&mut self, err: &dyn std::error::Error) {
        self.summary.failed += 1;
        tracing::error!("{}", ferry_proto::error_chain(err));
    }

    /// A source directory: its destination handle when it exists already.
    fn dir(&mut self, entry: &Entry, parent: Option<BorrowedFd<'_>>) -> Option<OwnedFd> {
        self.summary.dirs += 1;
        let name = entry.rel.file_name();
        let existing = parent.and_then(|p| lookup_at(p, name).ok().flatten());
        match (parent, existing) {
            (Some(p), Some(m)) if m.kind == Kind::Dir => {
                openat(p, name, DIR_FLAGS, Mode::empty()).ok()
            }
            (_, old) => {
                if old.is_some() {
                    // A copy replaces what stands there with the directory.
                    self.summary.deleted += 1;
                    changes::report(&Change::Deleted { dir: false }, entry.rel.as_bytes());
                }
                changes::report(&Change::Dir, entry.rel.as_bytes());
                None
            }
        }
    }

    /// A file, symlink, hard link or special file.
    fn leaf(&mut self, entry: &Entry, parent: Option<BorrowedFd<'_>>) {
        let meta = &entry.meta;
        let name = entry.rel.file_name();
        let old = parent.and_then(|p| lookup_at(p, name).ok().flatten());
        if meta.kind == Kind::Special {
            self.summary.specials_skipped += 1;
            return;
        }
        if let (Some(p), Some(o)) = (parent, &old)
            && o.kind == Kind::Dir
            && !self.opts.delete
            && !dir_is_empty_at(p, name).unwrap_or(false)
        {
            let what = if meta.kind == Kind::Symlink {
                "a symlink"
            } else {
                "a file"
            };
            self.fail(&NonEmptyDir {
                path: self.dst.join(entry.rel.to_string()).display().to_string(),
                with: what,
            });
            return;
        }
        if let Some(first) = &entry.hardlink_of {
            self.hard_link(entry, first, old);
            return;
        }
        if meta.kind == Kind::Symlink {
            let target = entry.link_target.as_deref().unwrap_or_default();
            let same = old.is_some_and(|o| o.kind == Kind::Symlink && o.same_size_and_mtime(meta))
                && parent.is_some_and(|p| {
                    readlinkat(p, name, Vec::new()).is_ok_and(|t| t.as_bytes() == target)
                });
            if same {
                self.summary.skipped += 1;
            } else {
                self.summary.symlinks += 1;
                let replaced = old.is_some_and(|o| o.kind == Kind::Symlink);
                changes::report(&Change::Symlink { target, replaced }, entry.rel.as_bytes());
            }
            return;
        }
        let old_file = old.filter(|o| o.kind == Kind::File);
        if let (Some(p), Some(o)) = (parent, &old_file)
            && self.unchanged(entry, p, o)
        {
            self.summary.skipped += 1;
            return;
        }
        self.summary.files += 1;
        self.summary.bytes += meta.size;
        let change = Change::File {
            old: old_file.as_ref(),
            new: meta,
        };
        changes::report(&change, entry.rel.as_bytes());
    }

    fn unchanged(&mut self, entry: &Entry, dst: BorrowedFd<'_>, old: &Meta) -> bool {
        if old.size != entry.meta.size {
            return false;
        }
        if !self.opts.checksum {
            return old.same_size_and_mtime(&entry.meta);
        }
        if self.buf.is_empty() {
            self.buf = vec![0; crate::tree::data::BUFFER_SIZE];
        }
        let name = entry.rel.file_name();
        match same_contents(entry.parent.as_fd(), dst, name, &mut self.buf) {
            Ok(same) => same,
            Err(e) => {
                self.fail(&std::io::Error::from(e));
                true
            }
        }
    }

    fn hard_link(&mut self, entry: &Entry, first: &RelPath, old: Option<Meta>) {
        // A file with several links and this content already there is taken as the link made by
        // an earlier run (a copy checks the inode; this walk does not resolve the first name).
        if old.is_some_and(|o| {
            o.kind == Kind::File && o.nlink > 1 && o.same_size_and_mtime(&entry.meta)
        }) {
            self.summary.skipped += 1;
            return;
        }
        self.summary.hardlinks += 1;
        let change = Change::HardLink {
            target: first.as_bytes(),
        };
        changes::report(&change, entry.rel.as_bytes());
    }

    /// `--delete`: what the destination directory holds and the source directory does not.
    fn deletions(&mut self, rel: Option<&RelPath>, src: BorrowedFd<'_>, dst: BorrowedFd<'_>) {
        let Ok(listing) = list_dir(dst) else { return };
        for item in listing.flatten() {
            let name = item.file_name().to_bytes();
            if name == b"." || name == b".." || is_temp_name(name) {
                continue;
            }
            let parent = rel.map(RelPath::as_bytes);
            if excluded_listing_entry(&self.opts.filter, parent, name, item.file_type(), dst) {
                continue;
            }
            if matches!(lookup_at(src, name), Ok(None)) {
                self.summary.deleted += 1;
                let path = match parent {
                    Some(p) => [p, b"/", name].concat(),
                    None => name.to_vec(),
                };
                let dir = item.file_type() == rustix::fs::FileType::Directory;
                changes::report(&Change::Deleted { dir }, &path);
            }
        }
    }
}
