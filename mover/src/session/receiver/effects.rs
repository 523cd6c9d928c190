//! The receiver's effects: the blocking filesystem work each rule of [`super::state`] asks for
//! (stat, create, stage, verify, write, commit, delete), run on the session's blocking threads.
//! The rules decide; these functions only carry out and report what they did.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use ferry_proto::wire::v1 as pb;

use super::block_store::BlockDedup;
use super::state::{self, ClaimedSmall, ReceiverState, SenderViolation};
use super::{
    Keep, MAX_REPORTED_FAILURES, MAX_XATTR_BYTES, MAX_XATTR_BYTES_IN_FLIGHT, ReceiveError,
};
use crate::cas::BlockHash;
use crate::cas::dedup::AnnouncedBlock;
use crate::cas::pop::PopKey;
use crate::digest::{self, DirList, Hash, HashError, HashPool, LinkList, SortedTree};
use crate::progress::Progress;
use crate::report::changes::{self, Change, Listing};
use crate::session::compress;
use crate::session::staging::{LargeStaging, StagingDir};
use crate::session::{Abort, SMALL_FILE_MAX};
use crate::tree::peer_dest::{DestError, Existing, PeerDest, owned};
use crate::tree::peer_path::PeerPath;
use crate::tree::{CommitError, Filter, Kind, Meta, NonEmptyDir, Placed, Replace};
use crate::wire::{BLOCK_SIZE, Bitmap, Message, block_count, block_len, caps, codec};

/// Longest failure message carried in the Summary (a path alone may take 4 KiB).
const MAX_FAILURE_MESSAGE: usize = 1024;

/// What was sent but not applied because the receiver did not ask for it.
#[derive(Debug, Default)]
pub(super) struct Dropped {
    /// Entries whose setuid/setgid/sticky bits were masked.
    pub(super) special_bits: AtomicU64,
    /// Extended attributes not applied.
    pub(super) xattrs: AtomicU64,
    /// Entries whose owner or group differs from the receiver's and was not applied.
    pub(super) owners: AtomicU64,
}

/// The owner and extended attributes of one entry that this receiver applies (empty unless it
/// asked for them). Attribute bytes count against the session's in-flight bound until dropped.
#[derive(Debug, Default)]
struct Kept {
    owner: Option<(u32, u32)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    held: Option<(u64, Arc<AtomicU64>)>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some((bytes, counter)) = &self.held {
            counter.fetch_sub(*bytes, Ordering::Relaxed);
        }
    }
}

impl Kept {
    /// Applies the extended attributes to the open file or directory `fd`. One the destination
    /// file system refuses (a name it does not support, no room for more attributes on this
    /// inode) is left out and counted in `dropped`, with a warning naming it: it says nothing
    /// about the file's data, and must not read as a destination fault or a full disk.
    fn set_xattrs(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        path: &PeerPath,
        dropped: &AtomicU64,
    ) -> Result<(), ReceiveError> {
        use rustix::io::Errno;
        for (name, value) in &self.xattrs {
            match rustix::fs::fsetxattr(fd, name.as_slice(), value, rustix::fs::XattrFlags::empty())
            {
                Ok(()) => {}
                Err(
                    e @ (Errno::NOSPC
                    | Errno::TOOBIG
                    | Errno::RANGE
                    | Errno::INVAL
                    | Errno::NOTSUP
                    | Errno::PERM
                    | Errno::DQUOT),
                ) => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "{path}: extended attribute {} left out: the destination refused it ({e})",
                        String::from_utf8_lossy(name)
                    );
                }
                Err(e) => {
                    return Err(ReceiveError::Write {
                        path: format!(
                            "{path} (extended attribute {})",
                            String::from_utf8_lossy(name)
                        ),
                        source: e.into(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// What the receiver applies to a file it asked for.
#[derive(Clone)]
pub(super) struct FileMeta {
    pub(super) path: PeerPath,
    size: u64,
    mode: u32,
    mtime: (i64, u32),
    kept: Arc<Kept>,
    /// The file this one replaces, as found when offered (for `-v`/`-i`).
    before: Option<Meta>,
}

/// A large file in flight: where its blocks land. Which blocks are where is the state's.
pub(super) struct LargeFile {
    meta: FileMeta,
    nblocks: u64,
    /// The staging data file (streams write blocks at their offsets in parallel) and its
    /// manifest, which keeps each block's hash (so memory does not grow with the file).
    staging: LargeStaging,
}

/// The session's rules over what the effects attach to each file.
pub(super) type State = ReceiverState<FileMeta, Arc<LargeFile>>;

pub(super) struct Session {
    pub(super) dest: PeerDest,
    pub(super) staging: StagingDir,
    pub(super) caps: u64,
    pub(super) sync: bool,
    /// The protocol rules: what is in flight, which blocks are claimed. Held only to ask and
    /// record, never across I/O.
    pub(super) state: Mutex<State>,
    /// The session's blocking calls (see `session::blocking`).
    pub(super) blocking: crate::session::blocking::BlockingPool,
    pub(super) progress: Arc<Progress>,
    /// Block store side of dedup (with a store and the dedup capability).
    pub(super) dedup: Option<BlockDedup>,
    /// Fan-out: blocks fellow destinations own, taken from their node services.
    pub(super) fetches: Option<Arc<crate::node::swarm::Fetches>>,
    /// Root directory metadata, applied after the staging directory is gone (its removal
    /// would otherwise bump the root's mtime).
    pub(super) root_meta: Mutex<Option<(u32, (i64, u32))>>,
    /// Threads that write the files of one large Batch (the machine's CPUs, at most 4).
    pub(super) write_threads: usize,
    /// Entries removed: by `--delete` listings, and non-empty directories replaced by a
    /// non-directory (only with `--delete`).
    pub(super) deleted: AtomicU64,
    /// The first [`MAX_REPORTED_FAILURES`] messages of entries left out (counted in
    /// `progress.failed`).
    pub(super) failures: Mutex<Vec<String>>,
    /// The digest's `tree` part: what was committed, recorded in any order, sorted at the end
    /// (taken when the digest is computed).
    pub(super) tree: Mutex<Option<SortedTree>>,
    /// The digest's `dirs` and `links` parts, in the order DirDone frames and hard links come.
    pub(super) dirs: Mutex<DirList>,
    pub(super) links: Mutex<LinkList>,
    /// Reads the destination files left unchanged, for the digest.
    pub(super) pool: Arc<HashPool>,
    /// This session's digest once computed (at Finish).
    pub(super) digest: Mutex<Option<Hash>>,
    /// The session's first failure: stops every stream.
    pub(super) abort: Abort,
    pub(super) transfer_id: String,
    /// When the sender last made progress (the session's progress deadline).
    pub(super) clock: crate::session::ProgressClock,
    /// The sender reads Busy frames (progress capability).
    pub(super) busy: bool,
    /// The sender's exclude rules: `--delete` keeps the destination entries they match.
    pub(super) protect: Filter,
    /// A dry run: offers are answered "skip", changes counted and listed, nothing written.
    pub(super) dry_run: bool,
    /// With a dry run: the private scratch directory that holds the session's staging instead
    /// of the destination (removed when the session ends).
    pub(super) _scratch: Option<Scratch>,
    pub(super) keep: Keep,
    pub(super) dropped: Dropped,
    /// Extended attribute bytes held by files in flight (see [`Kept`]).
    pub(super) xattr_held: Arc<AtomicU64>,
}

impl Session {
    /// The protocol state, to ask or record (never held across I/O).
    pub(super) fn state(&self) -> Result<MutexGuard<'_, State>, ReceiveError> {
        self.state.lock().map_err(|_| ReceiveError::Poisoned)
    }

    /// Blocks and bytes taken from a block store instead of the wire.
    pub(super) fn store_counters(&self) -> crate::cas::dedup::DedupCounters {
        let mut d = self
            .dedup
            .as_ref()
            .map(|d| d.counters())
            .unwrap_or_default();
        // Blocks from a fan-out peer's store count as taken from a store too.
        if let Some(f) = &self.fetches {
            d.dedup_blocks += f.blocks.load(Ordering::Relaxed);
            d.dedup_bytes += f.bytes.load(Ordering::Relaxed);
        }
        d
    }

    /// This end's work counter for Busy frames. Called while this end is busy itself, so it
    /// also holds the sender's progress deadline off: waiting on our own disk is not a stall of
    /// the sender's.
    pub(super) fn work(&self) -> u64 {
        self.clock.mark();
        self.progress.work()
    }
}

impl Session {
    /// A frame from the sender: progress unless it only says it is alive. A Busy frame proves
    /// nothing (any sender can count up, with or without the progress capability), so it never
    /// holds off the receiver's progress deadline: four senders sending only growing Busy
    /// counters held every session slot. Only frames that move the session forward do.
    pub(super) fn saw(&self, msg: &Message) {
        match msg {
            Message::Keepalive | Message::Busy(_) => {}
            _ => self.clock.mark(),
        }
    }

    /// Records one entry left out while the session goes on: logged, counted in `failed`, and
    /// among the first few messages kept for the Summary that the sender reports too.
    fn fail_entry(&self, err: &dyn std::error::Error) {
        // Messages name peer paths, which may hold newlines or escape sequences.
        let msg = crate::session::escape_text(&crate::session::error_chain(err));
        tracing::error!("{msg}");
        self.progress.add_failed(1);
        if let Ok(mut kept) = self.failures.lock()
            && kept.len() < MAX_REPORTED_FAILURES
        {
            kept.push(truncate_message(msg));
        }
    }

    /// A non-empty directory replaced by a non-directory (only with `--delete`) counts as
    /// deleted, and handles cached beneath it are stale.
    fn count_placed(&self, path: &PeerPath, placed: Placed) {
        if placed == Placed::OverNonEmptyDir {
            self.deleted.fetch_add(1, Ordering::Relaxed);
            self.dest.forget_under(path);
        }
    }

    pub(super) fn failures(&self) -> Vec<String> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    fn record_leaf(&self, path: &PeerPath, entry: &Hash) -> Result<(), ReceiveError> {
        let mut t = self.tree.lock().map_err(|_| ReceiveError::Poisoned)?;
        match t.as_mut() {
            Some(t) => t
                .add_leaf(path.as_bytes(), entry)
                .map_err(ReceiveError::Digest),
            None => Err(ReceiveError::Internal(
                "entry after the digest was computed",
            )),
        }
    }

    /// A file as committed (`meta` read back from the filesystem) with its content hash.
    fn record_file(
        &self,
        path: &PeerPath,
        meta: &Meta,
        content: &Hash,
    ) -> Result<(), ReceiveError> {
        let entry = digest::file_entry(
            meta.size,
            meta.mode,
            (meta.mtime_sec, meta.mtime_nsec),
            content,
        );
        self.record_leaf(path, &entry)
    }

    fn record_dir(&self, path: &PeerPath) -> Result<(), ReceiveError> {
        let mut t = self.tree.lock().map_err(|_| ReceiveError::Poisoned)?;
        match t.as_mut() {
            Some(t) => t.add_dir(path.as_bytes()).map_err(ReceiveError::Digest),
            None => Err(ReceiveError::Internal(
                "entry after the digest was computed",
            )),
        }
    }

    /// Waits for the readers of unchanged files, sorts the tree records and combines the three
    /// parts (blocking: reads the spill files).
    pub(super) fn compute_digest(&self) -> Result<Hash, ReceiveError> {
        self.pool.finish()?;
        let tree = self
            .tree
            .lock()
            .map_err(|_| ReceiveError::Poisoned)?
            .take()
            .ok_or(ReceiveError::Internal("digest computed twice"))?;
        let root = tree.finish().map_err(ReceiveError::Digest)?;
        let dirs = self
            .dirs
            .lock()
            .map_err(|_| ReceiveError::Poisoned)?
            .finish();
        let links = self
            .links
            .lock()
            .map_err(|_| ReceiveError::Poisoned)?
            .finish();
        let d = digest::transfer_digest(&root, &dirs, &links);
        if let Ok(mut slot) = self.digest.lock() {
            *slot = Some(d);
        }
        Ok(d)
    }
}

/// A destination file the receiver left unchanged: its metadata and content as they are at
/// the destination go into the digest. `content` is known when `--checksum` already read it;
/// otherwise the file is read by the digest pool, off the Want path.
fn record_unchanged(
    sh: &Arc<Session>,
    path: &PeerPath,
    content: Option<Hash>,
) -> Result<(), ReceiveError> {
    if let Some(content) = content {
        let f = sh.dest.open_read(path.rel())?;
        let meta = fstat_meta(&f).map_err(|e| HashError::new(path.to_string(), e))?;
        return sh.record_file(path, &meta, &content);
    }
    let (s, p) = (sh.clone(), path.clone());
    sh.pool.blocking_submit(move || {
        let shown = || p.to_string();
        let mut f = s.dest.open_read(p.rel()).map_err(|e| {
            HashError::new(
                shown(),
                std::io::Error::other(crate::session::error_chain(&e)),
            )
        })?;
        let meta = fstat_meta(&f).map_err(|e| HashError::new(shown(), e))?;
        let mut counted = digest::CountingReader {
            inner: &mut f,
            count: &s.progress.hashed_bytes,
        };
        let read = READ_BUF
            .with_borrow_mut(|buf| digest::hash_reader(&mut counted, buf, false))
            .map_err(|e| HashError::new(shown(), e))?;
        if read.len != meta.size {
            return Err(HashError::new(
                shown(),
                std::io::Error::other("it changed size while it was read"),
            ));
        }
        s.record_file(&p, &meta, &read.content).map_err(|e| {
            HashError::new(
                shown(),
                std::io::Error::other(crate::session::error_chain(&e)),
            )
        })
    })?;
    Ok(())
}

thread_local! {
    /// Read buffer of each digest pool thread.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn fstat_meta(f: &std::fs::File) -> std::io::Result<Meta> {
    Ok(Meta::from_stat(&rustix::fs::fstat(f)?))
}

/// `msg` cut to [`MAX_FAILURE_MESSAGE`] bytes at a character boundary.
fn truncate_message(mut msg: String) -> String {
    if msg.len() > MAX_FAILURE_MESSAGE {
        let mut end = MAX_FAILURE_MESSAGE;
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        msg.truncate(end);
        msg.push_str("...");
    }
    msg
}

/// A hard link whose target is not a regular file at the destination (for example because
/// that file was refused): the link is left out.
#[derive(Debug, thiserror::Error)]
#[error("not hard-linking {path} to {target}: {target} is not a regular file at the destination")]
struct LinkTargetNotFile {
    path: String,
    target: String,
}

/// A private directory under the system's temp directory for a dry run: `empty` stands in for
/// a destination root that does not exist, `staging` holds the session's staging. Removed on
/// drop.
pub(super) struct Scratch {
    base: PathBuf,
    pub(super) empty: PathBuf,
    pub(super) staging: PathBuf,
}

impl Scratch {
    pub(super) fn create() -> Result<Scratch, ReceiveError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nonce: u64 = rand::random();
        let base =
            std::env::temp_dir().join(format!("ferry-dry-run-{}-{nonce:016x}", std::process::id()));
        let (empty, staging) = (base.join("empty"), base.join("staging"));
        for d in [&base, &empty, &staging] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(d)
                .map_err(|source| ReceiveError::Scratch {
                    path: d.display().to_string(),
                    source,
                })?;
        }
        Ok(Scratch {
            base,
            empty,
            staging,
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn mtime_of(e: &pb::Entry) -> (i64, u32) {
    (e.mtime_sec, e.mtime_nsec.min(999_999_999))
}

/// One Offer: decides per entry, against the destination, what to ask for.
pub(super) fn handle_offer(sh: &Arc<Session>, offer: pb::Offer) -> Result<pb::Want, ReceiveError> {
    State::check_offer(offer.entries.len())?;
    let mut wants = Vec::with_capacity(offer.entries.len());
    // Entries of one directory arrive together: create each parent once per offer.
    let mut last_parent: Option<Vec<u8>> = None;
    for e in offer.entries {
        wants.push(handle_entry(sh, e, &mut last_parent)?);
    }
    Ok(pb::Want {
        offer_id: offer.offer_id,
        entries: wants,
    })
}

fn skip() -> pb::EntryWant {
    pb::EntryWant {
        skip: true,
        need_blocks: Vec::new(),
        file_id: 0,
        need_ranges: Vec::new(),
    }
}

fn handle_entry(
    sh: &Arc<Session>,
    e: pb::Entry,
    last_parent: &mut Option<Vec<u8>>,
) -> Result<pb::EntryWant, ReceiveError> {
    let path = PeerPath::parse(&e.path)?;
    let kind = pb::EntryKind::try_from(e.kind).unwrap_or(pb::EntryKind::Unspecified);
    match kind {
        pb::EntryKind::Dir if sh.dry_run => {
            if !matches!(sh.dest.existing_before_write(&path)?, Existing::Dir) {
                changes::report(&Change::Dir, path.as_bytes());
            }
            Ok(skip())
        }
        pb::EntryKind::Dir => {
            let listed = changes::listing() != Listing::Off
                && !matches!(sh.dest.existing(&path)?, Existing::Dir);
            sh.dest.create_dirs(path.rel())?;
            if listed {
                changes::report(&Change::Dir, path.as_bytes());
            }
            sh.record_dir(&path)?;
            Ok(skip())
        }
        pb::EntryKind::Symlink => {
            state::check_link_target(&path, &e.target)?;
            let existing = sh.dest.existing_before_write(&path)?;
            if refuse_over_dir(sh, &path, existing, "a symlink")? {
                return Ok(skip());
            }
            let kept = kept_attrs(sh, &e, &path)?;
            if sh.dry_run {
                let same = existing == Existing::Symlink
                    && sh.dest.read_symlink(&path).is_ok_and(|(m, t)| {
                        t == e.target && (m.mtime_sec, m.mtime_nsec) == mtime_of(&e)
                    });
                if !same {
                    let change = Change::Symlink {
                        target: &e.target,
                        replaced: existing == Existing::Symlink,
                    };
                    changes::report(&change, path.as_bytes());
                }
                return Ok(skip());
            }
            let made = sh.dest.symlink(&path, &e.target, mtime_of(&e), kept.owner);
            if let Some(placed) = tolerate_refusal(sh, made)? {
                sh.count_placed(&path, placed);
                let change = Change::Symlink {
                    target: &e.target,
                    replaced: existing == Existing::Symlink,
                };
                changes::report(&change, path.as_bytes());
                // The digest describes the link as it is now, read back.
                let (m, target) = sh.dest.read_symlink(&path)?;
                let entry = digest::symlink_entry(m.mode, (m.mtime_sec, m.mtime_nsec), &target);
                sh.record_leaf(&path, &entry)?;
            }
            Ok(skip())
        }
        pb::EntryKind::Hardlink if sh.dry_run => {
            let target = PeerPath::parse(&e.target)?;
            let change = Change::HardLink {
                target: target.as_bytes(),
            };
            changes::report(&change, path.as_bytes());
            Ok(skip())
        }
        pb::EntryKind::Hardlink => {
            let target = PeerPath::parse(&e.target)?;
            hard_link(sh, &path, &target)?;
            Ok(skip())
        }
        pb::EntryKind::File if sh.dry_run => offer_file(sh, path, &e),
        pb::EntryKind::File => {
            let parent = path.split_parent().0;
            if parent != last_parent.as_deref() {
                sh.dest.ensure_parent(&path)?;
                *last_parent = parent.map(<[u8]>::to_vec);
            }
            offer_file(sh, path, &e)
        }
        pb::EntryKind::Unspecified => Err(SenderViolation::NoKind(path.to_string()).into()),
    }
}

/// Makes the hard link `path` to `target`, or leaves it out as a failed entry when a non-empty
/// directory is in its way (no `--delete`) or its target is not a regular file here.
fn hard_link(sh: &Session, path: &PeerPath, target: &PeerPath) -> Result<(), ReceiveError> {
    if !matches!(sh.dest.existing(target)?, Existing::File { .. }) {
        sh.fail_entry(&LinkTargetNotFile {
            path: path.to_string(),
            target: target.to_string(),
        });
        return Ok(());
    }
    let existing = sh.dest.existing_before_write(path)?;
    if refuse_over_dir(sh, path, existing, "a hard link")? {
        return Ok(());
    }
    let linked = sh.dest.hardlink(path, target);
    let Some(placed) = tolerate_refusal(sh, linked)? else {
        return Ok(());
    };
    if let Some(placed) = placed {
        sh.count_placed(path, placed);
        let change = Change::HardLink {
            target: target.as_bytes(),
        };
        changes::report(&change, path.as_bytes());
    }
    // The digest describes the link as it is now: one inode with its target, and that inode's
    // metadata (an empty target if they are not one inode).
    let at_path = sh.dest.lookup(path)?;
    let at_target = sh.dest.lookup(target)?;
    let (mode, mtime, joined) = match (at_path, at_target) {
        (Some(a), Some(b)) => (
            a.mode,
            (a.mtime_sec, a.mtime_nsec),
            a.dev == b.dev && a.ino == b.ino,
        ),
        (Some(a), None) => (a.mode, (a.mtime_sec, a.mtime_nsec), false),
        _ => (0, (0, 0), false),
    };
    let shown_target: &[u8] = if joined { target.as_bytes() } else { b"" };
    sh.links.lock().map_err(|_| ReceiveError::Poisoned)?.add(
        path.as_bytes(),
        shown_target,
        mode,
        mtime,
    );
    Ok(())
}

/// Whether the non-directory offered at `path` must be left out: a non-empty directory stands
/// there and the sender did not ask for `--delete`, so replacing it would lose entries the
/// source does not replace one for one. A refusal is recorded as a failed entry.
fn refuse_over_dir(
    sh: &Session,
    path: &PeerPath,
    existing: Existing,
    with: &'static str,
) -> Result<bool, ReceiveError> {
    if existing != Existing::Dir
        || sh.dest.replace() == Replace::AnyDir
        || sh.dest.is_empty_dir(path)?
    {
        return Ok(false);
    }
    sh.fail_entry(&NonEmptyDir {
        path: path.to_string(),
        with,
    });
    Ok(true)
}

/// The tree layer's own refusal (a directory filled after the offer was answered) leaves the
/// entry out like [`refuse_over_dir`]; any other error ends the session.
fn tolerate_refusal<T>(sh: &Session, r: Result<T, DestError>) -> Result<Option<T>, ReceiveError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(DestError::NonEmptyDir(refused)) => {
            sh.fail_entry(&refused);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks the owner and extended attributes the sender sent for `e` and returns what this
/// receiver applies; what it does not apply is counted as dropped.
fn kept_attrs(sh: &Session, e: &pb::Entry, path: &PeerPath) -> Result<Kept, ReceiveError> {
    // Without --xattrs they are ignored, whatever they are (docs/protocol.md); only attributes
    // this receiver would apply are held to its rules.
    let total = if sh.keep.xattrs {
        state::check_xattrs(path, &e.xattrs, MAX_XATTR_BYTES)?
    } else {
        0
    };
    if e.mode & 0o7000 != 0 && !sh.keep.special_bits {
        sh.dropped.special_bits.fetch_add(1, Ordering::Relaxed);
    }
    let owner = e.uid.zip(e.gid);
    let policy = sh.dest.tree().policy();
    if !sh.keep.owner && owner.is_some_and(|o| o != (policy.euid, policy.egid)) {
        sh.dropped.owners.fetch_add(1, Ordering::Relaxed);
    }
    let mut kept = Kept {
        owner: owner.filter(|_| sh.keep.owner),
        xattrs: Vec::new(),
        held: None,
    };
    if !sh.keep.xattrs {
        sh.dropped
            .xattrs
            .fetch_add(e.xattrs.len() as u64, Ordering::Relaxed);
    } else if total > 0 {
        let held = sh.xattr_held.fetch_add(total, Ordering::Relaxed) + total;
        kept.held = Some((total, sh.xattr_held.clone()));
        if held > MAX_XATTR_BYTES_IN_FLIGHT {
            return Err(SenderViolation::XattrsInFlight(MAX_XATTR_BYTES_IN_FLIGHT).into());
        }
        kept.xattrs = e
            .xattrs
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect();
    }
    Ok(kept)
}

fn offer_file(
    sh: &Arc<Session>,
    path: PeerPath,
    e: &pb::Entry,
) -> Result<pb::EntryWant, ReceiveError> {
    let mut meta = FileMeta {
        path: path.clone(),
        size: e.size,
        mode: e.mode,
        mtime: mtime_of(e),
        kept: Arc::new(kept_attrs(sh, e, &path)?),
        before: None,
    };
    // Bounds and duplicates first: the destination is looked at only for an admissible entry.
    sh.state()?.check_file(&path, e.size)?;
    let existing = sh.dest.existing_before_write(&path)?;
    if refuse_over_dir(sh, &path, existing, "a file")? {
        return Ok(skip());
    }
    if let Existing::File { size, mtime, mode } = existing {
        meta.before = Some(Meta::new(Kind::File, mode, size, mtime.0, mtime.1));
    }
    if let Existing::File { size, mtime, mode } = existing
        && size == e.size
    {
        let (same, content) = if sh.caps & caps::CHECKSUM != 0 && e.checksum.len() == 32 {
            let read = hash_existing(sh, &path)?;
            let same = read
                .whole
                .is_some_and(|w| w.as_slice() == e.checksum.as_slice());
            (same, Some(read.content))
        } else {
            (mtime == meta.mtime, None)
        };
        if same && sh.dry_run {
            sh.progress.add(&sh.progress.skipped, 1);
            return Ok(skip());
        }
        if same {
            // Unchanged content; metadata that differs (a touched or chmod-ed source) is
            // applied, so the destination matches what the digest describes.
            if mtime != meta.mtime || mode != meta.mode & 0o777 {
                // Read-only is enough for fchmod/futimens, and works on a read-only file.
                let f = sh.dest.open_read(path.rel())?;
                let m = owned(
                    sh.dest.meta(Kind::File, meta.mode, meta.size, meta.mtime),
                    meta.kept.owner,
                );
                sh.dest.apply_meta(&f, path.rel(), &m)?;
            }
            sh.progress.add(&sh.progress.skipped, 1);
            record_unchanged(sh, &path, content)?;
            return Ok(skip());
        }
    }
    if sh.dry_run {
        sh.progress.add(&sh.progress.files_done, 1);
        sh.progress.add(&sh.progress.bytes_done, e.size);
        let new = sh.dest.meta(Kind::File, meta.mode, meta.size, meta.mtime);
        report_file(&meta, &new);
        return Ok(skip());
    }
    if e.size <= SMALL_FILE_MAX {
        let id = sh.state()?.want_small(path, e.size, meta)?;
        return Ok(pb::EntryWant {
            skip: false,
            need_blocks: Vec::new(),
            file_id: id,
            need_ranges: Vec::new(),
        });
    }
    // Resume only with a sender that confirms every held block (ResumeCheck); otherwise
    // whatever staging holds is overwritten.
    let resume = sh.caps & caps::RESUME != 0;
    let opened = sh.staging.open_large(&path, e.size, meta.mtime, resume)?;
    let nblocks = block_count(e.size);
    let lf = Arc::new(LargeFile {
        meta,
        nblocks,
        staging: opened.staging,
    });
    let (id, need) = sh.state()?.want_large(path, e.size, opened.held, lf)?;
    let (need_blocks, need_ranges) = need.to_want(nblocks);
    Ok(pb::EntryWant {
        skip: false,
        need_blocks,
        file_id: id,
        need_ranges,
    })
}

/// Reads a destination file once for `--checksum`: its whole-file BLAKE3 and its digest
/// content hash.
fn hash_existing(sh: &Session, path: &PeerPath) -> Result<digest::ReadHashes, ReceiveError> {
    let mut f = sh.dest.open_read(path.rel())?;
    let mut counted = digest::CountingReader {
        inner: &mut f,
        count: &sh.progress.hashed_bytes,
    };
    Ok(READ_BUF
        .with_borrow_mut(|buf| digest::hash_reader(&mut counted, buf, true))
        .map_err(|e| HashError::new(path.to_string(), e))?)
}

/// Files in one Batch below which splitting the writes over threads does not pay.
const PARALLEL_BATCH_MIN: usize = 64;

/// A Batch frame: claims its files (the whole frame is checked first, so a malformed one
/// writes nothing), then verifies and writes each.
pub(super) fn handle_batch(
    sh: &Session,
    header: pb::BatchHeader,
    data: &[u8],
) -> Result<(), ReceiveError> {
    let files = sh.state()?.claim_batch(header.files, data.len())?;
    write_small_files(sh, &files, |part| write_batch_files(sh, part, data))
}

/// Writes the small files of one frame (a Batch, a pack) with `write`, on several threads when
/// there are many: creating small files is the receiver's bottleneck (about five syscalls each,
/// most of the CPU).
pub(super) fn write_small_files<T: Sync>(
    sh: &Session,
    files: &[T],
    write: impl Fn(&[T]) -> Result<(), ReceiveError> + Sync,
) -> Result<(), ReceiveError> {
    let threads = sh
        .write_threads
        .min(files.len() / PARALLEL_BATCH_MIN)
        .max(1);
    if threads == 1 {
        return write(files);
    }
    let per_thread = files.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(per_thread)
            .map(|part| scope.spawn(|| write(part)))
            .collect();
        let mut result = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(ReceiveError::Internal("a small-file writer panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

/// Decodes, verifies and writes the claimed files of a batch.
fn write_batch_files(
    sh: &Session,
    files: &[ClaimedSmall<FileMeta>],
    data: &[u8],
) -> Result<(), ReceiveError> {
    let mut buf = Vec::new();
    for ClaimedSmall {
        file: meta,
        range,
        entry: bf,
        ..
    } in files
    {
        let chunk = &data[range.clone()];
        // Raw content (the common case on fast links) is verified and written from the frame.
        let content: &[u8] = if bf.codec == codec::RAW && chunk.len() == bf.raw_len as usize {
            chunk
        } else {
            compress::decode(bf.codec, chunk, bf.raw_len as usize, sh.caps, &mut buf).map_err(
                |source| ReceiveError::Codec {
                    path: meta.path.to_string(),
                    index: 0,
                    source,
                },
            )?;
            &buf
        };
        let hash = blake3::hash(content);
        if hash.as_bytes().as_slice() != bf.hash.as_slice() {
            return Err(ReceiveError::HashMismatch {
                path: meta.path.to_string(),
                index: 0,
            });
        }
        write_small(sh, meta, content, hash.as_bytes())?;
    }
    Ok(())
}

pub(super) fn write_small(
    sh: &Session,
    meta: &FileMeta,
    content: &[u8],
    hash: &Hash,
) -> Result<(), ReceiveError> {
    let staged = sh.dest.stage(&meta.path, meta.mode)?;
    staged
        .write_at(0, content)
        .map_err(|e| ReceiveError::Write {
            path: meta.path.to_string(),
            source: e.into(),
        })?;
    meta.kept
        .set_xattrs(staged.fd(), &meta.path, &sh.dropped.xattrs)?;
    let m = owned(
        sh.dest.meta(Kind::File, meta.mode, meta.size, meta.mtime),
        meta.kept.owner,
    );
    // Dropping an uncommitted StagedFile removes its temporary file.
    let (placed, committed) = match staged.commit_and_stat(&m, sh.sync, sh.dest.replace()) {
        Ok(placed) => placed,
        // Checked when offered; the directory was filled since. Leave the file out.
        Err(CommitError::NonEmptyDir(refused)) => {
            sh.fail_entry(&refused.at(&meta.path));
            return Ok(());
        }
        Err(source) => {
            return Err(ReceiveError::Commit {
                path: meta.path.to_string(),
                source,
            });
        }
    };
    sh.count_placed(&meta.path, placed);
    report_file(meta, &m);
    // Content as hashed on its way to disk, metadata as the filesystem recorded it.
    sh.record_file(
        &meta.path,
        &committed,
        &digest::content_hash_single(meta.size, hash),
    )?;
    sh.progress.add(&sh.progress.files_done, 1);
    sh.progress.add(&sh.progress.bytes_done, meta.size);
    Ok(())
}

/// A Block frame from the wire: claims the block, decodes and verifies it, adds it to the block
/// store, writes it at its offset, and commits the file when it was the last.
pub(super) fn handle_block(
    sh: &Session,
    h: &pb::BlockHeader,
    data: &Bytes,
) -> Result<(), ReceiveError> {
    let claimed = sh.state()?.claim_block(h)?;
    let (lf, expected) = (claimed.file, claimed.len);
    let codec = h.codec;
    // A full zero block (a hole of a sparse file) hashes to a constant: no 4 MiB of zeros is
    // decoded and hashed for it.
    let full_zero = codec == codec::ZERO && data.is_empty() && expected == BLOCK_SIZE as u64;
    // Raw blocks are hashed, stored and written straight from the frame: no copy.
    let buf: Bytes = if codec == codec::RAW && data.len() as u64 == expected {
        data.clone()
    } else if full_zero {
        Bytes::new()
    } else {
        let mut decoded = Vec::with_capacity(expected as usize);
        compress::decode(codec, data, expected as usize, sh.caps, &mut decoded).map_err(
            |source| ReceiveError::Codec {
                path: claimed.path.to_string(),
                index: h.index,
                source,
            },
        )?;
        decoded.into()
    };
    let hash = if full_zero {
        blake3::Hash::from_bytes(crate::wire::zero_block_hash())
    } else {
        blake3::hash(&buf)
    };
    if hash.as_bytes().as_slice() != h.hash.as_slice() {
        return Err(ReceiveError::HashMismatch {
            path: claimed.path.to_string(),
            index: h.index,
        });
    }
    // Stored: every full block, and in a fan-out a long tail (its siblings take it from here).
    let stored = buf.len() == BLOCK_SIZE || sh.caps & caps::TAILS != 0;
    if let Some(d) = &sh.dedup
        && codec != codec::ZERO
        && stored
        && let Err(e) = d.insert_received(&BlockHash::from(hash), buf.clone())
    {
        // The store is a cache: failing to add to it never fails the transfer.
        tracing::warn!(error = %e, "could not add a received block to the block store");
    }
    let off = h.index * BLOCK_SIZE as u64;
    let werr = |source| ReceiveError::Write {
        path: lf.meta.path.to_string(),
        source,
    };
    // What is written is what was hashed: an all-zero block, and each all-zero page of a block,
    // is a hole, punched out of a staging file an earlier run left (whose bytes there are
    // unknown).
    if codec == codec::ZERO {
        lf.staging.write_zeros(off, expected).map_err(werr)?;
    } else {
        lf.staging.write_block(off, &buf).map_err(werr)?;
    }
    lf.staging.record(h.index, hash.as_bytes()).map_err(werr)?;
    sh.progress.add(&sh.progress.bytes_done, expected);
    blocks_written(sh, h.file_id, 1)
}

/// `n` more blocks of a large file are verified and written; the last commits it.
fn blocks_written(sh: &Session, file_id: u64, n: u64) -> Result<(), ReceiveError> {
    let complete = sh.state()?.blocks_written(file_id, n)?;
    if let Some(lf) = complete
        && commit_large(sh, &lf)?
    {
        sh.progress.add(&sh.progress.files_done, 1);
    }
    Ok(())
}

/// One BlockAnnounce: claim the announced blocks, take from the store every one it holds whose
/// proof of possession matches, and answer which of them must still come over the wire. In a
/// fan-out, blocks another destination owns are answered "not needed" too and taken from that
/// destination's node service in the background.
pub(super) fn handle_announce(
    sh: &Arc<Session>,
    key: &PopKey,
    a: pb::BlockAnnounce,
) -> Result<pb::NeedBlocks, ReceiveError> {
    let Some(dedup) = &sh.dedup else {
        return Err(SenderViolation::NotNegotiated(crate::wire::FrameType::BlockAnnounce).into());
    };
    if let Some(msg) = sh.fetches.as_ref().and_then(|f| f.failure()) {
        return Err(ReceiveError::PeerBlocks(msg));
    }
    let tails = sh.caps & caps::TAILS != 0;
    let (claimed, announced) = sh.state()?.claim_announce(&a, tails)?;
    let (lf, size) = (claimed.file, claimed.size);
    // Reads, verifies and writes without holding the state's lock.
    let needed = dedup.materialize_announced(key, &lf.staging, &announced)?;
    for (b, _) in announced.iter().zip(&needed).filter(|(_, need)| !**need) {
        // The store verified the bytes it wrote against this hash.
        lf.staging
            .record(b.index, b.hash.as_bytes())
            .map_err(|source| ReceiveError::Write {
                path: lf.meta.path.to_string(),
                source,
            })?;
    }
    let taken_blocks = needed.iter().filter(|n| !**n).count() as u64;
    let taken: u64 = announced
        .iter()
        .zip(&needed)
        .filter(|(_, need)| !**need)
        .map(|(b, _)| block_len(size, b.index))
        .sum();
    // Of the blocks still needed, those a fellow destination owns come from it.
    let mut from_wire = needed;
    let mut from_peers = Vec::new();
    if let Some(f) = &sh.fetches {
        let path = lf.meta.path.as_bytes();
        let owed: Vec<(usize, usize)> = (0..announced.len())
            .filter(|&i| from_wire[i])
            .filter_map(|i| Some((i, f.owner(path, announced[i].index)?)))
            .collect();
        // Beyond what peers may owe, blocks come from the source.
        for &(i, owner) in owed.iter().take(f.admit(owed.len())) {
            from_wire[i] = false;
            from_peers.push((owner, announced[i]));
        }
    }
    let indexes: Vec<u64> = announced.iter().map(|b| b.index).collect();
    let (answer, _) = answer_needed(sh, a.file_id, &indexes, &from_wire)?;
    sh.progress.add(&sh.progress.bytes_done, taken);
    // Reported live, so the operator can show block-store hits while the transfer runs.
    sh.progress.add(&sh.progress.dedup_blocks, taken_blocks);
    sh.progress.add(&sh.progress.dedup_bytes, taken);
    if taken_blocks > 0 {
        blocks_written(sh, a.file_id, taken_blocks)?;
    }
    if let Some(f) = &sh.fetches
        && !from_peers.is_empty()
    {
        let sink = Arc::new(PeerBlockSink {
            sh: sh.clone(),
            file: lf.clone(),
            file_id: a.file_id,
        });
        f.start(key, from_peers, sink);
    }
    Ok(answer)
}

/// Where blocks taken from a fan-out peer go: the large file they were announced for.
struct PeerBlockSink {
    sh: Arc<Session>,
    file: Arc<LargeFile>,
    file_id: u64,
}

impl crate::node::swarm::FetchSink for PeerBlockSink {
    fn deliver(&self, b: &AnnouncedBlock, block: Bytes) -> Result<(), String> {
        let (sh, lf) = (&self.sh, &self.file);
        let fail = |e: &dyn std::error::Error| {
            format!("{}: {}", lf.meta.path, crate::session::error_chain(e))
        };
        lf.staging
            .write_block(b.index * BLOCK_SIZE as u64, &block)
            .and_then(|()| lf.staging.record(b.index, b.hash.as_bytes()))
            .map_err(|e| fail(&e))?;
        let len = block.len() as u64;
        if let Some(d) = &sh.dedup
            && let Err(e) = d.insert_received(&b.hash, block)
        {
            tracing::warn!(error = %e, "could not add a fan-out block to the block store");
        }
        sh.progress.add(&sh.progress.bytes_done, len);
        sh.progress.add(&sh.progress.dedup_blocks, 1);
        sh.progress.add(&sh.progress.dedup_bytes, len);
        blocks_written(sh, self.file_id, 1).map_err(|e| fail(&e))
    }

    fn file_id(&self) -> u64 {
        self.file_id
    }

    fn path(&self) -> &[u8] {
        self.file.meta.path.as_bytes()
    }
}

/// The NeedBlocks answer to an announce or a resume check of `indexes`, where `needed[i]` says
/// block `indexes[i]` must still come over the wire: those are requested again. Returns the
/// answer and the blocks that need not come.
fn answer_needed(
    sh: &Session,
    file_id: u64,
    indexes: &[u64],
    needed: &[bool],
) -> Result<(pb::NeedBlocks, Vec<u64>), ReceiveError> {
    let mut bitmap = Bitmap::with_len(indexes.len());
    let mut again = Vec::new();
    let mut taken = Vec::new();
    for (i, (&index, &need)) in indexes.iter().zip(needed).enumerate() {
        if need {
            bitmap.set(i);
            again.push(index);
        } else {
            taken.push(index);
        }
    }
    sh.state()?.need_again(file_id, again)?;
    let answer = pb::NeedBlocks {
        file_id,
        need_blocks: bitmap.into_bytes(),
    };
    Ok((answer, taken))
}

/// One ResumeCheck: the sender's hashes of blocks this receiver holds from an earlier run. Each
/// held block is re-read and kept only if its hash equals the sender's; the answer names the
/// ones that must come over the wire (and they are requested again).
pub(super) fn handle_resume_check(
    sh: &Session,
    c: pb::ResumeCheck,
) -> Result<pb::NeedBlocks, ReceiveError> {
    let claimed = sh.state()?.claim_resume(&c)?;
    let lf = claimed.file;
    let needed = lf
        .staging
        .verify_held(claimed.size, &c.indexes, &claimed.hashes);
    let checked: u64 = c.indexes.iter().map(|&i| block_len(claimed.size, i)).sum();
    sh.progress.add(&sh.progress.hashed_bytes, checked);
    let (answer, kept) = answer_needed(sh, c.file_id, &c.indexes, &needed)?;
    let kept_bytes = kept.iter().map(|&i| block_len(claimed.size, i)).sum();
    sh.progress.add(&sh.progress.resumed_bytes, kept_bytes);
    if !kept.is_empty() {
        blocks_written(sh, c.file_id, kept.len() as u64)?;
    }
    Ok(answer)
}

/// Publishes a verified large file; false when it was left out (a non-empty directory filled
/// its path after the offer was answered).
fn commit_large(sh: &Session, lf: &LargeFile) -> Result<bool, ReceiveError> {
    let st = &lf.staging;
    let path = lf.meta.path.to_string();
    let path = path.as_str();
    let staged = sh
        .staging
        .rel
        .join(st.part_name.as_bytes())
        .map_err(DestError::from)?;
    let m = owned(
        sh.dest
            .meta(Kind::File, lf.meta.mode, lf.meta.size, lf.meta.mtime),
        lf.meta.kept.owner,
    );
    lf.meta.kept.set_xattrs(
        std::os::fd::AsFd::as_fd(&st.data),
        &lf.meta.path,
        &sh.dropped.xattrs,
    )?;
    // Errors name the file's path, then the staging file they happened on.
    let publish = |source| ReceiveError::Publish {
        path: path.to_owned(),
        source,
    };
    // Blocks extend the part file as they land; its size is set here (a tail of zero blocks
    // stays a hole).
    st.data
        .set_len(lf.meta.size)
        .map_err(|source| ReceiveError::Write {
            path: path.to_owned(),
            source,
        })?;
    sh.dest.apply_meta(&st.data, &staged, &m).map_err(publish)?;
    if sh.sync {
        st.data.sync_all().map_err(|source| ReceiveError::Write {
            path: path.to_owned(),
            source,
        })?;
    }
    let published = match sh.dest.publish_from_staging(&staged, &lf.meta.path) {
        Err(e) if !matches!(e, DestError::NonEmptyDir(_)) => return Err(publish(e)),
        r => r,
    };
    let Some(placed) = tolerate_refusal(sh, published)? else {
        // Its staging files go with the staging directory at the end of the session.
        return Ok(false);
    };
    sh.count_placed(&lf.meta.path, placed);
    let m = sh
        .dest
        .meta(Kind::File, lf.meta.mode, lf.meta.size, lf.meta.mtime);
    report_file(&lf.meta, &m);
    let committed = fstat_meta(&st.data).map_err(|source| ReceiveError::Write {
        path: path.to_owned(),
        source,
    })?;
    // Content as recorded block by block on its way to disk (or re-read when resumed).
    let content = st.content_hash(lf.nblocks, path)?;
    sh.record_file(&lf.meta.path, &committed, &content)?;
    sh.staging.finish_large(st);
    Ok(true)
}

/// `-v`/`-i`: a file put in place with metadata `new`.
fn report_file(meta: &FileMeta, new: &Meta) {
    let change = Change::File {
        old: meta.before.as_ref(),
        new,
    };
    changes::report(&change, meta.path.as_bytes());
}

/// A directory's metadata (and with `--delete` its complete listing), after all of its
/// entries.
pub(super) fn handle_dir_done(sh: &Session, d: pb::DirDone) -> Result<(), ReceiveError> {
    let Some(dir) = d.dir else {
        return Err(SenderViolation::DirDoneWithoutDir.into());
    };
    let rel = if dir.path.is_empty() {
        None
    } else {
        Some(PeerPath::parse(&dir.path)?)
    };
    if sh.caps & caps::DELETE != 0 && d.complete_listing {
        let keep = state::check_listing(d.names)?;
        let removed = sh
            .dest
            .delete_extraneous(rel.as_ref(), &keep, &sh.protect, sh.dry_run)?;
        for (path, dir) in &removed {
            changes::report(&Change::Deleted { dir: *dir }, path);
        }
        sh.deleted
            .fetch_add(removed.len() as u64, Ordering::Relaxed);
    }
    if sh.dry_run {
        return Ok(());
    }
    let mtime = mtime_of(&dir);
    match rel {
        Some(p) => {
            let kept = kept_attrs(sh, &dir, &p)?;
            sh.dest
                .set_dir_meta(Some(&p), dir.mode, mtime, kept.owner)?;
            if !kept.xattrs.is_empty() {
                let fd = sh.dest.open_dir(Some(p.rel()))?;
                kept.set_xattrs(std::os::fd::AsFd::as_fd(&*fd), &p, &sh.dropped.xattrs)?;
            }
            // The digest's `dirs` list, read back, in the order DirDone frames come.
            let (mode, mtime) = match sh.dest.lookup(&p)? {
                Some(m) => (m.mode, (m.mtime_sec, m.mtime_nsec)),
                None => (0, (0, 0)),
            };
            sh.dirs
                .lock()
                .map_err(|_| ReceiveError::Poisoned)?
                .add(p.as_bytes(), mode, mtime);
        }
        None => {
            if let Ok(mut m) = sh.root_meta.lock() {
                *m = Some((dir.mode, mtime));
            }
        }
    }
    Ok(())
}
