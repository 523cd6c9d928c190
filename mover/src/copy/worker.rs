//! Copying one file or symlink (run by worker threads, and by the scan thread when they are busy).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rustix::fs::{Mode, OFlags, openat, readlinkat};
use rustix::io::Errno;

use crate::tree::data::BUFFER_SIZE;
use crate::tree::dest::{LinkError, dir_is_empty_at, hard_link_at, lookup_at, symlink_at};
use crate::tree::{
    CommitError, Entry, Kind, Meta, NonEmptyDir, Placed, RelPath, Replace, StagedFile,
};

use super::CopyContext;
use super::checksum::same_contents;
use super::dirs::{DirState, EntryError};
use super::xattr::copy_user_xattrs;
use crate::report::changes::{self, Change};

/// One file or symlink to copy, with the directory state it belongs to.
pub(crate) struct Job {
    pub entry: Entry,
    pub dir: Arc<DirState>,
}

/// Several jobs handed over at once, to keep channel traffic small next to the per-file work.
#[derive(Default)]
pub(crate) struct Batch {
    jobs: Vec<Job>,
    bytes: u64,
}

impl Batch {
    pub fn push(&mut self, job: Job, bytes: u64) {
        self.jobs.push(job);
        self.bytes += bytes;
    }
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Per-thread state: a reusable buffer and whether O_NOATIME is allowed.
pub(crate) struct Worker<'a> {
    shared: &'a CopyContext,
    buf: Vec<u8>,
    noatime: bool,
}

/// Outcome of one entry.
enum Done {
    /// Written: its bytes, what it replaced, and the entry that was there before (if any).
    Copied(u64, Placed, Option<Meta>),
    Unchanged,
}

/// Why one file or symlink was not copied.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Entry(#[from] EntryError),
    /// A non-empty destination directory kept (no `--delete`).
    #[error(transparent)]
    Refused(#[from] NonEmptyDir),
}

impl<'a> Worker<'a> {
    pub fn new(shared: &'a CopyContext) -> Worker<'a> {
        Worker {
            shared,
            buf: Vec::new(),
            noatime: true,
        }
    }

    pub fn run(&mut self, batch: Batch) {
        for job in batch.jobs {
            self.one(&job);
            job.dir.release(self.shared);
        }
    }

    fn one(&mut self, job: &Job) {
        let Some(dst) = job.dir.dst.clone() else {
            return;
        };
        let result = match job.entry.meta.kind {
            Kind::Symlink => self.symlink(job, dst.as_fd()),
            _ => self.file(job, dst.as_fd()),
        };
        let progress = &self.shared.progress;
        match result {
            Ok(Done::Copied(bytes, placed, old)) => {
                let entry = &job.entry;
                if entry.meta.kind == Kind::File {
                    progress.add_done(1, bytes);
                    let old = old.filter(|m| m.kind == Kind::File);
                    let change = Change::File {
                        old: old.as_ref(),
                        new: &entry.meta,
                    };
                    changes::report(&change, entry.rel.as_bytes());
                } else {
                    self.shared.stats.symlinks.fetch_add(1, Ordering::Relaxed);
                    let change = Change::Symlink {
                        target: entry.link_target.as_deref().unwrap_or_default(),
                        replaced: old.is_some_and(|m| m.kind == Kind::Symlink),
                    };
                    changes::report(&change, entry.rel.as_bytes());
                }
                self.shared.count_placed(placed);
            }
            Ok(Done::Unchanged) => progress.add_skipped(1),
            Err(e) => self.shared.fail(&e),
        }
    }

    fn buffer(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0; BUFFER_SIZE];
        }
        &mut self.buf
    }

    fn open_source(&mut self, dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, Errno> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if self.noatime {
            // O_NOATIME saves an inode update per read, but only the owner (or root) may ask.
            match openat(dir, name, flags | OFlags::NOATIME, Mode::empty()) {
                Err(Errno::PERM) => self.noatime = false,
                other => return other,
            }
        }
        openat(dir, name, flags, Mode::empty())
    }

    fn file(&mut self, job: &Job, dst: BorrowedFd<'_>) -> Result<Done, Failure> {
        let shared = self.shared;
        let entry = &job.entry;
        let meta = &entry.meta;
        let name = entry.rel.file_name();
        let path = &entry.rel;
        let mut before = None;
        if !job.dir.fresh {
            let existing = lookup_at(dst, name)
                .map_err(|e| EntryError::new("look up destination", &shared.dst_shown(path), e))?;
            before = existing;
            // Refused before any data is copied; the commit would refuse it too.
            if existing.is_some_and(|m| m.kind == Kind::Dir) {
                self.check_dir_in_the_way(dst, name, path)?;
            }
            if let Some(old) = existing.filter(|m| m.kind == Kind::File && m.size == meta.size) {
                let unchanged = if shared.opts.checksum {
                    let buf = self.buffer();
                    same_contents(entry.parent.as_fd(), dst, name, buf)
                        .map_err(|e| EntryError::new("checksum", &shared.src_shown(path), e))?
                } else {
                    old.same_size_and_mtime(meta)
                };
                if unchanged {
                    self.refresh_meta(dst, name, &old, meta).map_err(|e| {
                        EntryError::new("update metadata of", &shared.dst_shown(path), e)
                    })?;
                    return Ok(Done::Unchanged);
                }
            }
        }
        let src = self
            .open_source(entry.parent.as_fd(), name)
            .map_err(|e| EntryError::new("open source file", &shared.src_shown(path), e))?;
        let dir = job.dir.dst.as_ref().ok_or_else(|| {
            EntryError::new("copy", &shared.dst_shown(path), "no destination directory")
        })?;
        let staged = StagedFile::create_in(dir, name, meta.mode & 0o777, *shared.dest.policy())
            .map_err(|e| {
                EntryError::new("create temporary file for", &shared.dst_shown(path), e)
            })?;
        let caps = &shared.caps;
        let (bytes, _method) = staged
            .copy_from(src.as_fd(), meta, self.buffer(), caps)
            .map_err(|e| EntryError::new("copy data of", &shared.src_shown(path), e))?;
        if shared.opts.xattrs {
            copy_user_xattrs(src.as_fd(), staged.fd()).map_err(|e| {
                EntryError::new("copy extended attributes of", &shared.src_shown(path), e)
            })?;
        }
        let placed = staged
            .commit(meta, shared.opts.sync, shared.dest.replace())
            .map_err(|e| match e {
                CommitError::NonEmptyDir(refused) => {
                    Failure::Refused(refused.at(&shared.dst_shown(path)))
                }
                e => EntryError::new("commit", &shared.dst_shown(path), e).into(),
            })?;
        Ok(Done::Copied(bytes, placed, before))
    }

    /// The destination has a directory where the source has the file `path`: without
    /// `--delete`, only an empty one may go.
    fn check_dir_in_the_way(
        &self,
        dst: BorrowedFd<'_>,
        name: &[u8],
        path: &RelPath,
    ) -> Result<(), Failure> {
        if self.shared.dest.replace() == Replace::AnyDir {
            return Ok(());
        }
        let empty = dir_is_empty_at(dst, name).map_err(|e| {
            EntryError::new(
                "look into destination directory",
                &self.shared.dst_shown(path),
                e,
            )
        })?;
        if empty {
            return Ok(());
        }
        Err(NonEmptyDir {
            path: self.shared.dst_shown(path),
            with: "a file",
        }
        .into())
    }

    /// An unchanged file whose mode, owner or times differ gets them updated in place.
    fn refresh_meta(
        &self,
        dst: BorrowedFd<'_>,
        name: &[u8],
        old: &Meta,
        meta: &Meta,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let policy = self.shared.dest.policy();
        let owner_differs = policy.preserve_owner && (old.uid != meta.uid || old.gid != meta.gid);
        if old.mode == policy.wanted_mode(meta) && old.same_size_and_mtime(meta) && !owner_differs {
            return Ok(());
        }
        // O_NONBLOCK: never hang on something swapped in meanwhile; O_NOFOLLOW: never a link.
        let fd = openat(
            dst,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        policy.apply_fd(fd.as_fd(), meta, None)?;
        Ok(())
    }

    fn symlink(&mut self, job: &Job, dst: BorrowedFd<'_>) -> Result<Done, Failure> {
        let entry = &job.entry;
        let path = &entry.rel;
        let name = entry.rel.file_name();
        let target = entry.link_target.as_deref().unwrap_or_default();
        let before = if job.dir.fresh {
            None
        } else {
            lookup_at(dst, name).ok().flatten()
        };
        if let Some(old) = before
            && old.kind == Kind::Symlink
            && old.same_size_and_mtime(&entry.meta)
            && readlinkat(dst, name, Vec::new()).is_ok_and(|t| t.as_bytes() == target)
        {
            return Ok(Done::Unchanged);
        }
        let shared = self.shared;
        let placed = symlink_at(
            dst,
            name,
            target,
            &entry.meta,
            shared.dest.policy(),
            shared.dest.replace(),
        )
        .map_err(|e| link_failure(e, &shared.dst_shown(path), "create symlink"))?;
        Ok(Done::Copied(0, placed, before))
    }

    /// Makes `entry` a hard link to the first path of its inode (called after all files exist).
    pub fn hard_link(&mut self, entry: &Entry, dir: &Arc<DirState>) {
        let shared = self.shared;
        let path = &entry.rel;
        let result = (|| {
            let fail = |e: Box<dyn std::error::Error + Send + Sync>| {
                EntryError::new("hard-link", &shared.dst_shown(path), e)
            };
            let first = entry
                .hardlink_of
                .as_ref()
                .ok_or_else(|| fail("not a hard link".into()))?;
            let dst = dir
                .dst
                .as_ref()
                .ok_or_else(|| fail("no destination directory".into()))?;
            let (first_dir, first_name) =
                shared.dest.open_parent(first).map_err(|e| fail(e.into()))?;
            hard_link_at(
                first_dir.as_fd(),
                first_name,
                dst.as_fd(),
                path.file_name(),
                shared.dest.replace(),
            )
            .map_err(|e| link_failure(e, &shared.dst_shown(path), "hard-link"))
        })();
        match result {
            Ok(Some(placed)) => {
                shared.stats.hardlinks.fetch_add(1, Ordering::Relaxed);
                if let Some(first) = &entry.hardlink_of {
                    let change = Change::HardLink {
                        target: first.as_bytes(),
                    };
                    changes::report(&change, path.as_bytes());
                }
                shared.count_placed(placed);
            }
            Ok(None) => shared.progress.add_skipped(1),
            Err(e) => shared.fail(&e),
        }
        dir.release(shared);
    }
}

/// A refusal names the whole path; any other failure says what was being done.
fn link_failure(e: LinkError, shown: &str, op: &'static str) -> Failure {
    match e {
        LinkError::NonEmptyDir(refused) => Failure::Refused(refused.at(shown)),
        e => EntryError::new(op, shown, e).into(),
    }
}
