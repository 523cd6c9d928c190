//! Per-directory bookkeeping: a directory's metadata is applied when its last child is done.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::tree::relpath::display_opt;
use crate::tree::{DirFd, Entry, Meta, RelPath, Scanner};

use super::CopyContext;

/// One source directory being copied.
///
/// `pending` counts the scan of the directory itself plus every child (file, link, subdirectory)
/// not yet finished. The thread that brings it to zero applies the directory's mode, owner and
/// mtime (after which nothing is written into it any more) and then releases its parent.
pub(crate) struct DirState {
    pub rel: Option<RelPath>,
    pub meta: Meta,
    /// Source directory handle (files are opened relative to it).
    pub src: Option<DirFd>,
    /// Destination directory handle; `None` when it could not be created.
    pub dst: Option<DirFd>,
    /// Created by this run, so it is empty: no per-file lookups, no clean-up, no deletes needed.
    pub fresh: bool,
    /// Give the destination directory the source's mode and mtime when done (not for the root
    /// when a single file is copied into it: its source is only that file's parent).
    apply_meta: bool,
    pending: AtomicUsize,
    parent: Option<Arc<DirState>>,
}

impl DirState {
    pub fn root(
        shared: &CopyContext,
        scanner: &Scanner,
        fresh: bool,
        apply_meta: bool,
    ) -> Arc<DirState> {
        Arc::new(DirState {
            apply_meta,
            rel: None,
            meta: *scanner.root_meta(),
            src: Some(scanner.root().clone()),
            dst: Some(shared.dest.root().clone()),
            fresh,
            pending: AtomicUsize::new(1),
            parent: None,
        })
    }

    pub fn child(parent: &Arc<DirState>, entry: Entry, dst: DirFd, fresh: bool) -> Arc<DirState> {
        parent.hold();
        Arc::new(DirState {
            rel: Some(entry.rel),
            meta: entry.meta,
            src: entry.dir,
            dst: Some(dst),
            fresh,
            apply_meta: true,
            pending: AtomicUsize::new(1),
            parent: Some(parent.clone()),
        })
    }

    /// A directory whose destination could not be made: its children fail, nothing is written.
    pub fn broken(parent: &Arc<DirState>, entry: Entry) -> Arc<DirState> {
        parent.hold();
        Arc::new(DirState {
            rel: Some(entry.rel),
            meta: entry.meta,
            src: entry.dir,
            dst: None,
            fresh: true,
            apply_meta: true,
            pending: AtomicUsize::new(1),
            parent: Some(parent.clone()),
        })
    }

    pub fn rel_display(&self) -> String {
        display_opt(self.rel.as_ref())
    }

    /// One more unfinished child.
    pub fn hold(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// One child (or the scan) finished; finalizes this directory and, in turn, its ancestors.
    pub fn release(self: &Arc<Self>, shared: &CopyContext) {
        let mut current = Some(self.clone());
        while let Some(dir) = current.take() {
            if dir.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            dir.finish(shared);
            current = dir.parent.clone();
        }
    }

    fn finish(&self, shared: &CopyContext) {
        let Some(dst) = &self.dst else { return };
        if self.apply_meta
            && let Err(e) = shared.dest.policy().apply_fd(dst.as_fd(), &self.meta, None)
        {
            shared.fail(&EntryError::new(
                "set metadata of directory",
                &shared.dst_shown(&self.rel_display()),
                e,
            ));
        }
        if shared.opts.sync
            && let Err(e) = rustix::fs::fsync(dst)
        {
            shared.fail(&EntryError::new(
                "fsync directory",
                &shared.dst_shown(&self.rel_display()),
                e,
            ));
        }
    }
}

/// A failed operation on one entry.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} {path}")]
pub(crate) struct EntryError {
    op: &'static str,
    path: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl EntryError {
    pub fn new(
        op: &'static str,
        path: &(impl ToString + ?Sized),
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> EntryError {
        EntryError {
            op,
            path: path.to_string(),
            source: source.into(),
        }
    }
}

/// An entry not copied because its directory could not be created.
#[derive(Debug, thiserror::Error)]
#[error("failed to copy {0}: its destination directory could not be created")]
pub(crate) struct ParentMissing(pub String);

/// `dir/name` for messages.
pub(crate) fn join_display(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir == "." {
        name.into_owned()
    } else {
        format!("{dir}/{name}")
    }
}
