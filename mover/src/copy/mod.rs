//! The local parallel copy engine behind `ferry-mover copy SRC DST` (semantics: `docs/engine.md`).
//!
//! Shape, tuned for few cores and many small files:
//! - one *scan* thread walks the source ([`Scanner`]), creates each destination directory before
//!   its children, and hands files and symlinks to workers in batches over a bounded channel;
//!   when the channel is full it copies the batch itself instead of waiting, so no core idles;
//! - `jobs` *worker* threads copy files, each write going to a `.ferry-tmp.*` name renamed into
//!   place on completion ([`crate::tree::StagedFile`]);
//! - every directory counts its unfinished children ([`dirs::DirState`]); whoever finishes the
//!   last one applies the directory's mode and mtime, so directory mtimes survive their children;
//! - hard links are made after all files are in place (their first name must exist first).
//!
//! Memory: the channel holds at most `2 * jobs` batches, the scanner one open directory per level
//! of depth, and the hard-link map only files with several links.

mod checksum;
mod dirs;
mod dry_run;
mod worker;
mod xattr;

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::report::changes::{self, Change};
use crate::report::{CopySummary, Progress};
use crate::tree::dest::{
    DirFd, ensure_dir_at, excluded_listing_entry, list_dir, lookup_at, remove_at,
};
use crate::tree::{
    CopyCaps, DestError, DestOptions, DestRoot, Entry, Filter, Kind, Placed, RelPath, Replace,
    Resolve, ScanError, ScanEvent, Scanner, is_temp_name, split_source,
};

use dirs::DirState;
pub use dry_run::plan_tree;
use worker::{Batch, Job, Worker};

/// What a copy does beyond the defaults.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Worker threads copying file data (at least 1).
    pub jobs: usize,
    /// fsync every file and directory before reporting success.
    pub sync: bool,
    /// Decide "unchanged" by comparing BLAKE3 of the contents instead of size + mtime.
    pub checksum: bool,
    /// Remove destination entries that are not in the source.
    pub delete: bool,
    /// Copy `user.*` extended attributes.
    pub xattrs: bool,
    /// Destination directory resolution (tests force the fallback walk).
    pub resolve: Resolve,
    /// Never try copy_file_range (tests use it to cover the read/write path).
    pub no_copy_file_range: bool,
    /// Bytes per second all workers together may write; None for no limit.
    pub bandwidth_limit: Option<u64>,
    /// `--exclude` / `--include`: what is left out of the copy (and, with `--delete`, kept).
    pub filter: Arc<Filter>,
}

impl Default for CopyOptions {
    fn default() -> CopyOptions {
        CopyOptions {
            jobs: default_jobs(),
            sync: false,
            checksum: false,
            delete: false,
            xattrs: false,
            resolve: Resolve::Auto,
            no_copy_file_range: false,
            bandwidth_limit: None,
            filter: Arc::default(),
        }
    }
}

/// Twice the CPUs (at most [`MAX_DEFAULT_JOBS`]). Copying from a warm cache is CPU-bound, yet more
/// runnable copiers than cores measured faster wherever other processes also want the cores:
/// 3 000 x 100 KiB on 2 shared cores took 0.111-0.129 s median with 4 workers against
/// 0.129-0.141 s with 2, at the same CPU time (engine-quick-bench.sh, 7-21 interleaved rounds).
/// From a cold cache or a network filesystem the extra workers also overlap open/close latency.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get().saturating_mul(2))
        .min(MAX_DEFAULT_JOBS)
}

/// Upper bound of [`default_jobs`]: beyond it more threads only add scheduling and memory.
pub const MAX_DEFAULT_JOBS: usize = 64;

/// A failure of the whole copy (per-file failures are counted in the [`Summary`] instead).
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("failed to open the source")]
    Source(#[source] ScanError),
    #[error("failed to open the destination")]
    Dest(#[source] DestError),
    #[error("failed to start a copy worker thread")]
    Spawn(#[source] std::io::Error),
    #[error("the destination {dst} is inside the source {src}: the copy would copy itself")]
    DestInsideSource { src: String, dst: String },
}

/// Counters that are not part of [`Progress`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub dirs: AtomicU64,
    pub symlinks: AtomicU64,
    pub hardlinks: AtomicU64,
    pub specials: AtomicU64,
    pub deleted: AtomicU64,
    pub temps_cleaned: AtomicU64,
}

/// Everything the threads share.
pub(crate) struct CopyContext {
    pub dest: DestRoot,
    /// The source directory (for messages).
    pub src_root: std::path::PathBuf,
    pub opts: CopyOptions,
    pub caps: CopyCaps,
    pub progress: Arc<Progress>,
    pub stats: Stats,
}

impl CopyContext {
    /// `rel` under the destination as given on the command line (messages name whole paths).
    pub fn dst_shown(&self, rel: &(impl std::fmt::Display + ?Sized)) -> String {
        shown_under(self.dest.path(), &rel.to_string())
    }

    /// `rel` under the source directory as given on the command line.
    pub fn src_shown(&self, rel: &(impl std::fmt::Display + ?Sized)) -> String {
        shown_under(&self.src_root, &rel.to_string())
    }

    /// Reports one failed entry on stderr (with the whole cause chain) and counts it.
    pub fn fail(&self, err: &dyn std::error::Error) {
        self.progress.add_failed(1);
        tracing::error!("{}", ferry_proto::error_chain(err));
    }

    /// A non-empty directory replaced (only with `--delete`) counts as deleted.
    pub fn count_placed(&self, placed: Placed) {
        if placed == Placed::OverNonEmptyDir {
            self.stats.deleted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Batches are cut at this many entries or this many bytes of file data, whichever comes first.
const BATCH_ENTRIES: usize = 64;
const BATCH_BYTES: u64 = 8 * 1024 * 1024;

/// Copies the tree `src` into `dst` (created if missing). Returns the summary; per-entry failures
/// are reported on stderr and counted in `failed`.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    opts: &CopyOptions,
    progress: Arc<Progress>,
) -> Result<CopySummary, CopyError> {
    let started = Instant::now();
    let (scanner, src_dir, single) = open_source(src, &opts.filter)?;
    let dst_existed = dst.symlink_metadata().is_ok();
    // A destination inside the source would be scanned while it is being filled.
    if let (Ok(s), Some(d)) = (src.canonicalize(), canonical_prefix(dst))
        && d.starts_with(&s)
    {
        return Err(CopyError::DestInsideSource {
            src: s.display().to_string(),
            dst: d.display().to_string(),
        });
    }
    let shared = context(dst, src_dir.clone(), opts, progress)?;

    let (tx, rx) = sync_channel::<Batch>(shared.opts.jobs * 2);
    let handles = spawn_workers(&shared, rx)?;

    let mut own = Worker::new(&shared);
    let mut batch = Batch::default();
    let send = |batch: Batch, own: &mut Worker<'_>| match tx.try_send(batch) {
        Ok(()) => {}
        // Workers are busy: do this batch here rather than block the scan.
        Err(TrySendError::Full(batch)) => own.run(batch),
        Err(TrySendError::Disconnected(batch)) => own.run(batch),
    };

    let root = DirState::root(&shared, &scanner, !dst_existed, single.is_none());
    if dst_existed {
        make_writable(&shared, shared.dest.root().as_fd());
        clean_temps(&shared, &root);
    }
    let mut stack: Vec<Arc<DirState>> = vec![root];
    let mut deferred_links = Vec::new();

    for event in scanner {
        let event = match event {
            Ok(ev) => ev,
            Err(e) => {
                shared.fail(&e);
                continue;
            }
        };
        match event {
            ScanEvent::DirDone { complete, .. } => {
                let Some(state) = stack.pop() else { continue };
                // A single file given as the source says nothing about its siblings.
                if shared.opts.delete && complete && !state.fresh && single.is_none() {
                    delete_extras(&shared, &state);
                }
                // Files still queued in this batch must not wait for the next directory.
                if !batch.is_empty() {
                    send(std::mem::take(&mut batch), &mut own);
                }
                state.release(&shared);
            }
            ScanEvent::Entry(entry) => {
                let Some(parent) = stack.last().cloned() else {
                    continue;
                };
                let Some(parent_dst) = parent.dst.clone() else {
                    // The directory could not be created: its contents are failures too.
                    shared.fail(&dirs::ParentMissing(shared.dst_shown(&entry.rel)));
                    if entry.meta.kind == Kind::Dir {
                        stack.push(DirState::broken(&parent, entry));
                    }
                    continue;
                };
                match entry.meta.kind {
                    Kind::Dir => stack.push(enter_dir(&shared, &parent, &parent_dst, entry)),
                    Kind::File if entry.hardlink_of.is_some() => {
                        parent.hold();
                        deferred_links.push((entry, parent));
                    }
                    Kind::File | Kind::Symlink => {
                        parent.hold();
                        let bytes = if entry.meta.kind == Kind::File {
                            entry.meta.size
                        } else {
                            0
                        };
                        if entry.meta.kind == Kind::File {
                            shared.progress.add_total(1, bytes);
                        }
                        batch.push(Job { entry, dir: parent }, bytes);
                        if batch.len() >= BATCH_ENTRIES || batch.bytes() >= BATCH_BYTES {
                            send(std::mem::take(&mut batch), &mut own);
                        }
                    }
                    Kind::Special => {
                        shared.stats.specials.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            "skipping {}: FIFOs, sockets and device nodes are not copied",
                            entry.rel
                        );
                    }
                }
            }
        }
    }
    if !batch.is_empty() {
        send(batch, &mut own);
    }
    shared.progress.set_totals_known();
    drop(tx);
    for h in handles {
        let _ = h.join();
    }
    for (entry, parent) in deferred_links {
        own.hard_link(&entry, &parent);
    }
    drop(own);
    drop(stack);

    Ok(summary(&shared, started))
}

/// What every worker of one copy shares: the opened destination, the source root, the options
/// and the copy's capabilities (copy_file_range, a bandwidth limit).
fn context(
    dst: &Path,
    src_root: std::path::PathBuf,
    opts: &CopyOptions,
    progress: Arc<Progress>,
) -> Result<Arc<CopyContext>, CopyError> {
    // Local copies are of the user's own tree: setuid/setgid/sticky are preserved like cp -p.
    let dest = DestRoot::open_with(
        dst,
        DestOptions {
            allow_special_bits: true,
            resolve: opts.resolve,
            // Without --delete a non-empty directory is never replaced by a non-directory.
            replace: Replace::with_delete(opts.delete),
        },
    )
    .map_err(CopyError::Dest)?;
    let caps = match opts.bandwidth_limit {
        Some(rate) => CopyCaps::with_limit(rate),
        None => CopyCaps::new(),
    };
    if opts.no_copy_file_range {
        caps.disable_copy_file_range();
    }
    if let Some(n) = std::env::var("FERRY_SMALL_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        caps.set_small_max(n);
    }
    Ok(Arc::new(CopyContext {
        dest,
        src_root,
        opts: CopyOptions {
            jobs: opts.jobs.max(1),
            ..opts.clone()
        },
        caps,
        progress,
        stats: Stats::default(),
    }))
}

/// The copy's worker threads (`jobs` of them; the scanning thread works too when they are
/// busy), each taking batches from `rx` until the scan ends.
fn spawn_workers(
    shared: &Arc<CopyContext>,
    rx: Receiver<Batch>,
) -> Result<Vec<std::thread::JoinHandle<()>>, CopyError> {
    let rx = Arc::new(Mutex::new(rx));
    let mut handles = Vec::with_capacity(shared.opts.jobs);
    for i in 0..shared.opts.jobs {
        let rx = rx.clone();
        let shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("copy-{i}"))
            .spawn(move || {
                let mut worker = Worker::new(&shared);
                loop {
                    // The lock is held only while waiting for the next batch.
                    let next = match rx.lock() {
                        Ok(guard) => guard.recv(),
                        Err(_) => break,
                    };
                    match next {
                        Ok(batch) => worker.run(batch),
                        Err(_) => break,
                    }
                }
            })
            .map_err(CopyError::Spawn)?;
        handles.push(handle);
    }
    Ok(handles)
}

/// A directory of the walk: created (or found) in its parent's destination, cleaned of a
/// previous run's temporaries, its extended attributes copied; a broken state (its contents
/// fail too) when it cannot be created.
fn enter_dir(
    shared: &CopyContext,
    parent: &Arc<DirState>,
    parent_dst: &DirFd,
    entry: Entry,
) -> Arc<DirState> {
    let created = ensure_dir_at(parent_dst.as_fd(), entry.rel.file_name(), entry.meta.mode);
    let state = match created {
        Ok((fd, created)) => {
            shared.stats.dirs.fetch_add(1, Ordering::Relaxed);
            if created {
                changes::report(&Change::Dir, entry.rel.as_bytes());
            }
            if !created {
                make_writable(shared, fd.as_fd());
            }
            DirState::child(parent, entry, Arc::new(fd), created)
        }
        Err(e) => {
            shared.fail(&DestError::io(
                "create directory",
                shared.dst_shown(&entry.rel),
                e,
            ));
            DirState::broken(parent, entry)
        }
    };
    if let Some(dst) = &state.dst {
        if !state.fresh {
            clean_temps(shared, &state);
        }
        if shared.opts.xattrs
            && let Some(src) = &state.src
            && let Err(e) = xattr::copy_user_xattrs(src.as_fd(), dst.as_fd())
        {
            shared.fail(&dirs::EntryError::new(
                "copy extended attributes of",
                &shared.src_shown(&state.rel_display()),
                e,
            ));
        }
    }
    state
}

fn summary(shared: &CopyContext, started: Instant) -> CopySummary {
    let p = shared.progress.snapshot();
    let s = &shared.stats;
    CopySummary {
        files: p.files_done,
        bytes: p.bytes_done,
        skipped: p.skipped,
        failed: p.failed,
        seconds: started.elapsed().as_secs_f64(),
        dirs: s.dirs.load(Ordering::Relaxed),
        symlinks: s.symlinks.load(Ordering::Relaxed),
        hardlinks: s.hardlinks.load(Ordering::Relaxed),
        specials_skipped: s.specials.load(Ordering::Relaxed),
        deleted: s.deleted.load(Ordering::Relaxed),
        temps_cleaned: s.temps_cleaned.load(Ordering::Relaxed),
    }
}

/// Opens the source for a walk through `filter`: a directory as it is, a single file as its
/// directory holding just that name (returned, so callers leave its siblings and its parent
/// alone).
pub(crate) fn open_source(
    src: &Path,
    filter: &Arc<Filter>,
) -> Result<(Scanner, std::path::PathBuf, Option<Vec<u8>>), CopyError> {
    let (dir, single) = split_source(src);
    let mut scanner = Scanner::open(&dir)
        .map_err(CopyError::Source)?
        .with_filter(filter.clone());
    if let Some(name) = &single {
        scanner = scanner.only_at_root(name);
    }
    Ok((scanner, dir, single))
}

/// `root/rel` for messages (`root` alone for the root itself, shown as ".").
fn shown_under(root: &Path, rel: &str) -> String {
    if rel == "." || rel.is_empty() {
        root.display().to_string()
    } else {
        root.join(rel).display().to_string()
    }
}

/// `path` with its longest existing prefix canonicalized (the rest may not exist yet).
fn canonical_prefix(path: &Path) -> Option<std::path::PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            return Some(
                rest.iter()
                    .rev()
                    .fold(c, |acc: std::path::PathBuf, part| acc.join(part)),
            );
        }
        rest.push(existing.file_name()?);
        existing = existing.parent()?;
        if existing.as_os_str().is_empty() {
            existing = Path::new(".");
        }
    }
}

/// An existing destination directory that its owner cannot write to (a read-only directory
/// copied by an earlier run) gets u+wx until its metadata is applied again at the end; root
/// needs no such help.
fn make_writable(shared: &CopyContext, dir: std::os::fd::BorrowedFd<'_>) {
    if shared.dest.policy().euid == 0 {
        return;
    }
    if let Ok(st) = rustix::fs::fstat(dir)
        && st.st_mode & 0o300 != 0o300
    {
        let mode = rustix::fs::Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700);
        let _ = rustix::fs::fchmod(dir, mode);
    }
}

/// Removes temp files an interrupted earlier run left in a directory that already existed.
fn clean_temps(shared: &CopyContext, state: &DirState) {
    let Some(dst) = &state.dst else { return };
    match DestRoot::clean_temps_in(dst.as_fd()) {
        Ok(n) => {
            shared.stats.temps_cleaned.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => shared.fail(&dirs::EntryError::new(
            "clean temporary files in",
            &shared.dst_shown(&state.rel_display()),
            e,
        )),
    }
}

/// `--delete`: removes what the destination directory holds and the source directory does not.
/// Decided per name against the source directory handle, so nothing is remembered per file.
fn delete_extras(shared: &CopyContext, state: &DirState) {
    let (Some(src), Some(dst)) = (&state.src, &state.dst) else {
        return;
    };
    let listing = match list_dir(dst.as_fd()) {
        Ok(l) => l,
        Err(e) => {
            shared.fail(&dirs::EntryError::new(
                "list for --delete",
                &shared.dst_shown(&state.rel_display()),
                e,
            ));
            return;
        }
    };
    for item in listing {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                shared.fail(&dirs::EntryError::new(
                    "list for --delete",
                    &shared.dst_shown(&state.rel_display()),
                    e,
                ));
                return;
            }
        };
        let name = item.file_name().to_bytes();
        if name == b"." || name == b".." || is_temp_name(name) {
            continue;
        }
        let parent = state.rel.as_ref().map(RelPath::as_bytes);
        if excluded_listing_entry(
            &shared.opts.filter,
            parent,
            name,
            item.file_type(),
            dst.as_fd(),
        ) {
            continue;
        }
        match lookup_at(src.as_fd(), name) {
            Ok(Some(_)) => {}
            Ok(None) => match remove_at(dst.as_fd(), name) {
                Ok(()) => {
                    shared.stats.deleted.fetch_add(1, Ordering::Relaxed);
                    let rel = match &state.rel {
                        Some(r) => [r.as_bytes(), b"/", name].concat(),
                        None => name.to_vec(),
                    };
                    let dir = item.file_type() == rustix::fs::FileType::Directory;
                    changes::report(&Change::Deleted { dir }, &rel);
                }
                Err(e) => shared.fail(&dirs::EntryError::new(
                    "delete",
                    &shared.dst_shown(&dirs::join_display(&state.rel_display(), name)),
                    e,
                )),
            },
            Err(e) => shared.fail(&dirs::EntryError::new(
                "check the source for",
                &shared.src_shown(&dirs::join_display(&state.rel_display(), name)),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_jobs_is_twice_the_cpus_within_bounds() {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let jobs = default_jobs();
        assert_eq!(jobs, (2 * cpus).min(MAX_DEFAULT_JOBS));
        assert!((2..=MAX_DEFAULT_JOBS).contains(&jobs), "{jobs}");
        assert_eq!(CopyOptions::default().jobs, jobs);
    }
}
