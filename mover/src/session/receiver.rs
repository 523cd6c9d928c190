//! The receiving end: validates every name and every block, writes beneath the destination root
//! only, publishes each file by one rename after all of its content verified, and keeps resume
//! state in the staging directory.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};

use super::compress::{self, CodecError};
use super::dest::{DestError, DestRoot, Existing, owned};
use super::framed::{FrameReader, FrameWriter, FramedError};
use super::handshake::{HandshakeError, accept_hello};
use super::relpath::{PeerPath, RelPathError};
use super::staging::{LargeStaging, Staging, StagingError, block_count, block_len};
use super::{
    Abort, DRAIN, MAX_OFFER_ENTRIES, MAX_STREAMS, OFFER_WINDOW, PEER_GRACE, Reason, SMALL_FILE_MAX,
    Summary, Timeouts, anyhow_chain, pending_peer_error, tell_peer,
};
use crate::cas::dedup::{AnnouncedBlock, DedupReceiver};
use crate::cas::pop::{Nonce, PopKey, Proof};
use crate::cas::{BlockHash, CasError, CasStore};
use crate::digest::{self, DirList, Hash, HashError, HashPool, LinkList, SortedTree};
use crate::kind::{ErrorKind, is_no_space};
use crate::progress::{Phase, Progress};
use crate::report::changes::{self, Change, Listing};
use crate::tree::{CommitError, Filter, Kind, Meta, NonEmptyDir, Placed, Replace};
use crate::wire::{BLOCK_SIZE, Bitmap, BlockSet, FrameType, Message, caps, codec};

/// Most files the receiver tracks as "offered, not yet complete" at once. It must exceed what an
/// honest sender can have outstanding: on each stream, the offers of its window plus the one
/// whose data is being written and the one being read, each up to a full offer. (A fixed 32 768
/// was below that for 4 streams: 50 000 small files over 4 streams failed.) About 25 MiB of
/// bookkeeping at the cap, so a hostile sender still cannot grow it without bound.
const MAX_IN_FLIGHT: usize = MAX_STREAMS as usize * (OFFER_WINDOW + 2) * MAX_OFFER_ENTRIES;
/// Most blocks one BlockAnnounce or ResumeCheck may list (256 GiB of a file; the sender splits
/// larger files).
pub const MAX_ANNOUNCE_BLOCKS: usize = 65536;
/// Most large files (cut into blocks) in flight per session. An honest sender ends each Offer
/// after its first large file, so it has at most one per Offer it may have outstanding: this
/// bounds the staging files (two descriptors each) a peer can make the receiver hold.
const MAX_LARGE_IN_FLIGHT: usize = MAX_STREAMS as usize * (OFFER_WINDOW + 2);
/// Largest file size accepted from a peer (a file offset is an `off_t`); the destination's
/// filesystem may allow less, and then refuses the file with its own error.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most ranges one large file's block bookkeeping may split into. Blocks of an honest sender
/// arrive nearly in order (a shared queue feeds every stream), so a few ranges suffice; this
/// bounds what a sender that scatters its blocks can make the receiver hold.
const MAX_FILE_RANGES: usize = 4096;
/// Failure messages the receiver keeps for its Summary (all are counted and logged).
pub const MAX_REPORTED_FAILURES: usize = 8;
/// Extended attribute bytes (names and values) one entry may carry; more is a protocol error.
pub const MAX_XATTR_BYTES: usize = super::scan::MAX_XATTR_BYTES;
/// Extended attribute bytes held for files in flight (only with `--xattrs`); more is a protocol
/// error (an honest sender's in-flight files stay far below it).
const MAX_XATTR_BYTES_IN_FLIGHT: u64 = 64 * 1024 * 1024;
/// Longest failure message carried in the Summary (a path alone may take 4 KiB).
const MAX_FAILURE_MESSAGE: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error(transparent)]
    Framed(#[from] FramedError),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Path(#[from] RelPathError),
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error("stream {stream}: {kind:?} frame not allowed {when}")]
    OutOfOrder {
        stream: u32,
        kind: FrameType,
        when: &'static str,
    },
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("block {index} of {path}: {source}")]
    Codec {
        path: String,
        index: u64,
        #[source]
        source: CodecError,
    },
    #[error("{path}: block {index} does not match its BLAKE3 hash; nothing was written")]
    HashMismatch { path: String, index: u64 },
    #[error("failed to publish {path}")]
    Commit {
        path: String,
        #[source]
        source: CommitError,
    },
    /// A large file could not be moved from the staging directory to its path.
    #[error("failed to publish {path}")]
    Publish {
        path: String,
        #[source]
        source: DestError,
    },
    #[error("failed to write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to create the dry run's scratch directory {path}")]
    Scratch {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The sender failed and said why (its Error frame).
    #[error("sender: {message}")]
    Remote { kind: ErrorKind, message: String },
    #[error("the sender finished but {count} file(s) are incomplete, e.g. {example}")]
    Incomplete { count: usize, example: String },
    #[error(
        "the sender made no progress for {secs} s (no data moved and no growing work counter; \
         keepalives and trickled bytes do not count)"
    )]
    NoProgress { secs: u64 },
    #[error("streams of one session disagree: {0}")]
    Streams(String),
    #[error("a blocking filesystem task failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("block store")]
    Cas(#[from] CasError),
    #[error("failed to compute the transfer digest (its sort files are kept in .ferry-staging/)")]
    Digest(#[source] std::io::Error),
    #[error(transparent)]
    ReadBack(#[from] HashError),
    #[error("internal error: a lock was poisoned by a panic")]
    Poisoned,
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// This stream stopped because another one failed (never the reported error when the real
    /// one is known).
    #[error("stopped: another stream of the session failed")]
    Aborted,
}

/// The message a receiver reports for `e` (logs, Error frame, progress): the whole chain, and
/// for a full destination where the resume state stays.
pub fn failure_message(e: &ReceiveError, transfer_id: &str) -> String {
    let mut msg = anyhow_chain(e);
    if is_no_space(e) {
        msg.push_str(&format!(
            "; the destination is out of space. The resume state of this transfer was kept in \
             .ferry-staging/{transfer_id}/ and may occupy space: a rerun resumes from it, \
             `ferry-mover clean-staging --transfer-prefix {transfer_id}` removes it"
        ));
    }
    msg
}

/// Which of two failures of one session to report: the sender's own reason first, then a
/// failure seen here, then a broken connection, and never "another stream failed".
fn more_telling(a: ReceiveError, b: ReceiveError) -> ReceiveError {
    let rank = |e: &ReceiveError| match e {
        ReceiveError::Remote { .. } => 0,
        ReceiveError::Aborted => 3,
        e if e.kind().is_transport() => 2,
        _ => 1,
    };
    if rank(&b) < rank(&a) { b } else { a }
}

/// Tells the sender on every stream why the session cannot run (before the streams run).
async fn tell_all<S>(streams: &mut [Accepted<S>], e: &ReceiveError, transfer_id: &str)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let message = failure_message(e, transfer_id);
    let tells = streams
        .iter_mut()
        .map(|s| tell_peer(&mut s.writer, e.kind(), &message));
    futures::future::join_all(tells).await;
}

fn proto(msg: impl Into<String>) -> ReceiveError {
    ReceiveError::Protocol(msg.into())
}

/// Receiver settings.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub root: PathBuf,
    pub transfer_id: String,
    pub timeouts: Timeouts,
    /// fsync each file before its rename (durable commits).
    pub sync: bool,
    /// The node's block store: with it the receiver offers dedup, materialises announced blocks
    /// it holds (after proof of possession) and adds verified full blocks from the wire.
    pub cas: Option<Arc<CasStore>>,
    /// This receiver's own identity (from its certificate), named in the log when a peer
    /// refuses the handshake.
    pub identity: Option<crate::net::Identity>,
    /// Metadata beyond permission bits and times that this receiver applies.
    pub keep: Keep,
}

/// What a receiver keeps of the metadata every sender sends beyond permission bits and times.
/// Each is off by default: the receiver decides, never the sender, so a hostile sender cannot
/// plant a setuid file, a foreign owner or attributes unless the receiver asked for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// Owner and group (applied only when the receiver runs as root).
    pub owner: bool,
    /// setuid, setgid and sticky bits.
    pub special_bits: bool,
    /// `user.*` extended attributes.
    pub xattrs: bool,
}

/// What was sent but not applied because the receiver did not ask for it.
#[derive(Debug, Default)]
struct Dropped {
    /// Entries whose setuid/setgid/sticky bits were masked.
    special_bits: AtomicU64,
    /// Extended attributes not applied.
    xattrs: AtomicU64,
    /// Entries whose owner or group differs from the receiver's and was not applied.
    owners: AtomicU64,
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
    /// Applies the extended attributes to the open file or directory `fd`.
    fn set_xattrs(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        path: &PeerPath,
    ) -> Result<(), ReceiveError> {
        for (name, value) in &self.xattrs {
            rustix::fs::fsetxattr(fd, name.as_slice(), value, rustix::fs::XattrFlags::empty())
                .map_err(|e| ReceiveError::Write {
                    path: format!(
                        "{path} (extended attribute {})",
                        String::from_utf8_lossy(name)
                    ),
                    source: e.into(),
                })?;
        }
        Ok(())
    }
}

/// One stream past Hello/Welcome.
pub struct Accepted<S> {
    pub reader: FrameReader<ReadHalf<S>>,
    pub writer: FrameWriter<WriteHalf<S>>,
    pub hello: pb::Hello,
    pub caps: u64,
    /// The proof-of-possession nonce sent in this stream's Welcome (dedup only).
    pub dedup_nonce: Option<Nonce>,
}

/// Reads Hello on a fresh stream (under the handshake timeout) and answers Welcome.
pub async fn accept_stream<S>(
    stream: S,
    cfg: &ReceiverConfig,
    wire_bytes: Arc<AtomicU64>,
    index_hint: u32,
) -> Result<Accepted<S>, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let mut reader = FrameReader::new(r, index_hint, cfg.timeouts.handshake, wire_bytes);
    let mut writer = FrameWriter::new(w, index_hint, cfg.timeouts.handshake, Default::default());
    let mut supported = caps::SUPPORTED | caps::MODES;
    if cfg.cas.is_some() {
        supported |= caps::DEDUP;
    }
    if cfg.keep.xattrs {
        supported |= caps::XATTRS;
    }
    let fut = accept_hello(
        &mut reader,
        &mut writer,
        &cfg.transfer_id,
        MAX_STREAMS,
        supported,
    );
    let (hello, caps, dedup_nonce) = match tokio::time::timeout(cfg.timeouts.handshake, fut).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(FramedError::IdleTimeout {
                stream: index_hint,
                secs: cfg.timeouts.handshake.as_secs(),
            }
            .into());
        }
    };
    let idx = hello.stream_index;
    reader.set_stream(idx, cfg.timeouts.idle);
    writer.set_stream(idx, cfg.timeouts.idle);
    Ok(Accepted {
        reader,
        writer,
        hello,
        caps,
        dedup_nonce,
    })
}

/// Where the bytes of a block come from: the wire. Blocks from the node's block store arrive
/// through BlockAnnounce instead (see `handle_announce`): they are verified, proven and written
/// in batches per announce, not one frame at a time.
pub enum BlockSource<'a> {
    Wire { codec: u32, data: &'a [u8] },
}

enum InFlight {
    Small(FileMeta),
    Large(Arc<LargeFile>),
}

#[derive(Clone)]
struct FileMeta {
    path: PeerPath,
    size: u64,
    mode: u32,
    mtime: (i64, u32),
    kept: Arc<Kept>,
    /// The file this one replaces, as found when offered (for `-v`/`-i`).
    before: Option<Meta>,
}

struct LargeFile {
    meta: FileMeta,
    nblocks: u64,
    /// The staging data file (streams write blocks at their offsets in parallel) and its
    /// manifest, which keeps each block's hash (so memory does not grow with the file).
    staging: LargeStaging,
    state: Mutex<LargeState>,
}

/// Which blocks of a large file are where. Memory is a few ranges, whatever the file's size.
struct LargeState {
    /// Blocks requested and not yet claimed by any stream.
    need: BlockSet,
    /// Blocks an earlier run left in the staging file, not yet confirmed by the sender's
    /// ResumeCheck (until then they are not part of the file).
    held: BlockSet,
    /// Blocks not yet verified and written (needed, held, or claimed and in progress).
    remaining: u64,
}

struct Shared {
    dest: DestRoot,
    staging: Staging,
    caps: u64,
    sync: bool,
    table: Mutex<Table>,
    next_id: AtomicU64,
    progress: Arc<Progress>,
    /// Block store side of dedup (with a store and the dedup capability).
    dedup: Option<DedupReceiver>,
    /// Root directory metadata, applied after the staging directory is gone (its removal
    /// would otherwise bump the root's mtime).
    root_meta: Mutex<Option<(u32, (i64, u32))>>,
    /// Threads that write the files of one large Batch (the machine's CPUs, at most 4).
    write_threads: usize,
    /// Entries removed: by `--delete` listings, and non-empty directories replaced by a
    /// non-directory (only with `--delete`).
    deleted: AtomicU64,
    /// The first [`MAX_REPORTED_FAILURES`] messages of entries left out (counted in
    /// `progress.failed`).
    failures: Mutex<Vec<String>>,
    /// The digest's `tree` part: what was committed, recorded in any order, sorted at the end
    /// (taken when the digest is computed).
    tree: Mutex<Option<SortedTree>>,
    /// The digest's `dirs` and `links` parts, in the order DirDone frames and hard links come.
    dirs: Mutex<DirList>,
    links: Mutex<LinkList>,
    /// Reads the destination files left unchanged, for the digest.
    pool: Arc<HashPool>,
    /// This session's digest once computed (at Finish).
    digest: Mutex<Option<Hash>>,
    /// The session's first failure: stops every stream.
    abort: Abort,
    transfer_id: String,
    /// When the sender last made progress (the session's progress deadline).
    clock: super::ProgressClock,
    /// The sender reads Busy frames (progress capability).
    busy: bool,
    /// The sender's exclude rules: `--delete` keeps the destination entries they match.
    protect: Filter,
    /// A dry run: offers are answered "skip", changes counted and listed, nothing written.
    dry_run: bool,
    /// With a dry run: the private scratch directory that holds the session's staging instead
    /// of the destination (removed when the session ends).
    _scratch: Option<Scratch>,
    keep: Keep,
    dropped: Dropped,
    /// Extended attribute bytes held by files in flight (see [`Kept`]).
    xattr_held: Arc<AtomicU64>,
}

impl Shared {
    /// This end's work counter for Busy frames. Called while this end is busy itself, so it
    /// also holds the sender's progress deadline off: waiting on our own disk is not a stall of
    /// the sender's.
    fn work(&self) -> u64 {
        self.clock.mark();
        self.progress.work()
    }
}

impl Shared {
    /// A frame from the sender: progress unless it only says it is alive.
    fn saw(&self, msg: &Message) {
        match msg {
            Message::Keepalive => {}
            Message::Busy(b) => self.clock.busy(b.work),
            _ => self.clock.mark(),
        }
    }

    /// Records one entry left out while the session goes on: logged, counted in `failed`, and
    /// among the first few messages kept for the Summary that the sender reports too.
    fn fail_entry(&self, err: &dyn std::error::Error) {
        // Messages name peer paths, which may hold newlines or escape sequences.
        let msg = super::escape_text(&super::anyhow_chain(err));
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

    fn failures(&self) -> Vec<String> {
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
    fn compute_digest(&self) -> Result<Hash, ReceiveError> {
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
    sh: &Arc<Shared>,
    path: &PeerPath,
    content: Option<Hash>,
) -> Result<(), ReceiveError> {
    if let Some(content) = content {
        let f = sh.dest.open_read(path.as_bytes())?;
        let meta = fstat_meta(&f).map_err(|e| HashError::new(path.to_string(), e))?;
        return sh.record_file(path, &meta, &content);
    }
    let (s, p) = (sh.clone(), path.clone());
    sh.pool.blocking_submit(move || {
        let shown = || p.to_string();
        let mut f = s
            .dest
            .open_read(p.as_bytes())
            .map_err(|e| HashError::new(shown(), std::io::Error::other(super::anyhow_chain(&e))))?;
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
        s.record_file(&p, &meta, &read.content)
            .map_err(|e| HashError::new(shown(), std::io::Error::other(super::anyhow_chain(&e))))
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

#[derive(Default)]
struct Table {
    files: HashMap<u64, InFlight>,
    paths: HashSet<PeerPath>,
    /// Large files among `files`.
    large: usize,
}

/// Runs one session over its accepted streams (all with the same session id). On failure the
/// sender has been told why on every stream (unless it is the one that failed).
pub async fn receive_session<S>(
    cfg: &ReceiverConfig,
    streams: Vec<Accepted<S>>,
    progress: Arc<Progress>,
) -> Result<Summary, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let r = run_session(cfg, streams, progress.clone()).await;
    if let Err(e) = &r {
        progress.set_failure(e.kind(), &failure_message(e, &cfg.transfer_id));
        progress.set_phase(Phase::Failed);
    }
    r
}

async fn run_session<S>(
    cfg: &ReceiverConfig,
    mut streams: Vec<Accepted<S>>,
    progress: Arc<Progress>,
) -> Result<Summary, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let started = Instant::now();
    streams.sort_by_key(|a| a.hello.stream_index);
    let n = streams.len() as u32;
    let first = streams
        .first()
        .ok_or_else(|| ReceiveError::Streams("no streams".into()))?;
    let (sid, caps) = (first.hello.session_id.clone(), first.caps);
    let protect = if caps & caps::FILTER != 0 {
        Filter::from_wire(&first.hello.filter_rules)
            .map_err(|e| proto(format!("filter rules: {e}")))
    } else {
        Ok(Filter::default())
    };
    let protect = match protect {
        Ok(f) => f,
        Err(e) => {
            tell_all(&mut streams, &e, &cfg.transfer_id).await;
            return Err(e);
        }
    };
    for (i, s) in streams.iter().enumerate() {
        if s.hello.session_id != sid
            || s.hello.stream_count != n
            || s.hello.stream_index != i as u32
        {
            let e = ReceiveError::Streams(format!(
                "stream {} of {} announced index {} of {}",
                i, n, s.hello.stream_index, s.hello.stream_count
            ));
            tell_all(&mut streams, &e, &cfg.transfer_id).await;
            return Err(e);
        }
    }
    let root = cfg.root.clone();
    let tid = cfg.transfer_id.clone();
    let store = cfg.cas.clone().filter(|_| caps & caps::DEDUP != 0);
    // Only a sender that asked for --delete may have non-empty directories replaced.
    let replace = Replace::with_delete(caps & caps::DELETE != 0);
    let keep = cfg.keep;
    let dry_run = caps & caps::DRY_RUN != 0;
    let setup = tokio::task::spawn_blocking(move || {
        if dry_run {
            // Nothing may be created in the destination, not even the staging directory: a
            // missing root is planned as an empty one, staging lives in a scratch directory.
            let scratch = Scratch::create()?;
            let plan_root = if root.is_dir() {
                root
            } else {
                scratch.empty.clone()
            };
            let dest = DestRoot::open(&plan_root, replace, keep.special_bits)?;
            let staging_root = DestRoot::open(&scratch.staging, replace, false)?;
            let staging = Staging::open(&staging_root, &tid)?;
            return Ok::<_, ReceiveError>((dest, staging, None, Some(scratch)));
        }
        let dest = DestRoot::open(&root, replace, keep.special_bits)?;
        let staging = Staging::open(&dest, &tid)?;
        let dedup = store.map(|s| DedupReceiver::new(s, &tid)).transpose()?;
        Ok::<_, ReceiveError>((dest, staging, dedup, None))
    })
    .await
    .map_err(ReceiveError::from)
    .and_then(|r| r);
    let (dest, staging, dedup, scratch) = match setup {
        Ok(v) => v,
        Err(e) => {
            tell_all(&mut streams, &e, &cfg.transfer_id).await;
            return Err(e);
        }
    };
    // The digest's sort runs go to anonymous files in the staging directory (on the destination
    // volume, removed with their last handle).
    let spill_dir = staging.dir().clone();
    let spill: digest::SpillFn =
        Box::new(move || digest::anonymous_file_in(std::os::fd::AsFd::as_fd(&*spill_dir)));
    let shared = Arc::new(Shared {
        dest,
        staging,
        caps,
        sync: cfg.sync,
        table: Mutex::new(Table::default()),
        next_id: AtomicU64::new(1),
        progress: progress.clone(),
        dedup,
        root_meta: Mutex::new(None),
        write_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
        deleted: AtomicU64::new(0),
        failures: Mutex::new(Vec::new()),
        tree: Mutex::new(Some(SortedTree::new(spill))),
        dirs: Mutex::new(DirList::default()),
        links: Mutex::new(LinkList::default()),
        pool: Arc::new(HashPool::per_core()),
        digest: Mutex::new(None),
        abort: Abort::default(),
        transfer_id: cfg.transfer_id.clone(),
        clock: super::ProgressClock::new(),
        busy: caps & caps::PROGRESS != 0,
        protect,
        dry_run,
        _scratch: scratch,
        keep,
        dropped: Dropped::default(),
        xattr_held: Arc::new(AtomicU64::new(0)),
    });
    progress.set_phase(Phase::Transferring);

    let done = Arc::new(tokio::sync::Semaphore::new(0));
    let mut futs = Vec::new();
    for s in streams {
        futs.push(run_stream(shared.clone(), s, done.clone(), n));
    }
    // Every stream runs to its end: one that fails stops the others (each tells the sender why),
    // and the most telling failure is reported. A session whose sender makes no progress for
    // the progress timeout is stopped the same way.
    let all = futures::future::join_all(futs);
    tokio::pin!(all);
    let limit = cfg.timeouts.progress;
    let watchdog = async {
        loop {
            tokio::time::sleep_until(shared.clock.deadline(limit)).await;
            if tokio::time::Instant::now() >= shared.clock.deadline(limit) {
                let e = ReceiveError::NoProgress {
                    secs: limit.as_secs(),
                };
                shared.abort.set(Reason {
                    kind: e.kind(),
                    message: e.to_string(),
                    from_peer: false,
                });
                return e;
            }
        }
    };
    let (results, stalled) = tokio::select! {
        r = &mut all => (r, None),
        e = watchdog => (all.await, Some(e)),
    };
    let mut failure: Option<ReceiveError> = stalled;
    for r in results {
        if let Err(e) = r {
            failure = Some(match failure {
                None => e,
                Some(f) => more_telling(f, e),
            });
        }
    }
    match failure {
        None => {
            let sh = shared.clone();
            tokio::task::spawn_blocking(move || {
                if sh.dry_run {
                    return Ok(());
                }
                sh.staging.cleanup(&sh.dest);
                let meta = sh.root_meta.lock().ok().and_then(|m| *m);
                if let Some((mode, mtime)) = meta {
                    sh.dest.set_dir_meta(None, mode, mtime, None)?;
                }
                Ok::<(), ReceiveError>(())
            })
            .await??;
            let p = progress.snapshot();
            let d = shared
                .dedup
                .as_ref()
                .map(|d| d.counters())
                .unwrap_or_default();
            let summary = Summary {
                dry_run: shared.dry_run,
                files: p.files_done,
                bytes: p.bytes_done,
                wire_bytes: p.wire_bytes,
                seconds: started.elapsed().as_secs_f64(),
                streams: n,
                skipped: p.skipped,
                resumed_bytes: p.resumed_bytes,
                dedup_blocks: d.dedup_blocks,
                dedup_bytes: d.dedup_bytes,
                deleted: shared.deleted.load(Ordering::Relaxed),
                failed: p.failed,
                failures: shared.failures(),
                dropped_special_bits: shared.dropped.special_bits.load(Ordering::Relaxed),
                dropped_xattrs: shared.dropped.xattrs.load(Ordering::Relaxed),
                dropped_owners: shared.dropped.owners.load(Ordering::Relaxed),
                digest: shared
                    .digest
                    .lock()
                    .ok()
                    .and_then(|d| d.map(|d| digest::hex(&d)))
                    .unwrap_or_default(),
            };
            summary.set_outcome(&progress);
            Ok(summary)
        }
        Some(e) => {
            shared.pool.cancel();
            Err(e)
        }
    }
}

async fn run_stream<S>(
    shared: Arc<Shared>,
    acc: Accepted<S>,
    done: Arc<tokio::sync::Semaphore>,
    n: u32,
) -> Result<(), ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let Accepted {
        mut reader,
        mut writer,
        dedup_nonce,
        ..
    } = acc;
    let stream = reader.stream();
    let key = dedup_nonce.as_ref().map(PopKey::derive);
    let r = tokio::select! {
        r = stream_loop(&shared, &mut reader, &mut writer, &done, n, key) => r,
        () = shared.abort.wait() => Err(ReceiveError::Aborted),
    };
    let r = match r {
        Ok(()) => Ok(()),
        Err(e) => Err(fail_stream(&shared, &mut reader, &mut writer, e).await),
    };
    tracing::debug!(stream, ok = r.is_ok(), "receiver stream ended");
    r
}

/// A stream failed with `e`. A broken connection may hide the sender's reason: read its pending
/// Error frame for a moment. The first failure stops the other streams; the sender hears ours
/// on this stream (with its kind, naming the path), then the stream is closed cleanly.
async fn fail_stream<R, W>(
    shared: &Shared,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    e: ReceiveError,
) -> ReceiveError
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let e = if e.kind().is_transport() {
        match pending_peer_error(reader, PEER_GRACE).await {
            Some((kind, message)) => ReceiveError::Remote { kind, message },
            None => e,
        }
    } else {
        e
    };
    let reason = match &e {
        ReceiveError::Aborted => shared.abort.reason(),
        ReceiveError::Remote { kind, message } => {
            shared.abort.set(Reason {
                kind: *kind,
                message: message.clone(),
                from_peer: true,
            });
            None
        }
        e => {
            let reason = Reason {
                kind: e.kind(),
                message: failure_message(e, &shared.transfer_id),
                from_peer: false,
            };
            shared.abort.set(reason.clone());
            Some(reason)
        }
    };
    if let Some(r) = reason.filter(|r| !r.from_peer) {
        tell_peer(writer, r.kind, &r.message).await;
        // Read what the sender still had in flight, so closing does not reset the connection
        // under the Error frame.
        let _ = pending_peer_error(reader, DRAIN).await;
    }
    e
}

async fn stream_loop<R, W>(
    shared: &Arc<Shared>,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    done: &tokio::sync::Semaphore,
    n: u32,
    key: Option<PopKey>,
) -> Result<(), ReceiveError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let stream = reader.stream();
    // Main phase. Data frames go to a per-stream blocking worker through a 2-slot channel, so
    // decrypting the next frame overlaps with hashing and writing this one (memory: 3 frames).
    let (work_tx, mut work_rx) = tokio::sync::mpsc::channel::<Message>(2);
    let sh = shared.clone();
    let worker = tokio::task::spawn_blocking(move || {
        while let Some(m) = work_rx.blocking_recv() {
            match m {
                Message::Batch { header, data } => handle_batch(&sh, header, &data)?,
                Message::Block { header, data } => {
                    let source = BlockSource::Wire {
                        codec: header.codec,
                        data: &data,
                    };
                    handle_block(&sh, &header, source)?;
                }
                _ => {}
            }
        }
        Ok::<(), ReceiveError>(())
    });
    let main = async {
        loop {
            let msg = reader.expect().await?;
            shared.saw(&msg);
            let (busy, sh) = (shared.busy, shared.clone());
            let work = move || sh.work();
            match msg {
                Message::Offer(o) => {
                    let sh = shared.clone();
                    let task = tokio::task::spawn_blocking(move || handle_offer(&sh, o));
                    let want = super::while_busy(writer, busy, work, task).await???;
                    writer.send(&Message::Want(want)).await?;
                    writer.flush().await?;
                }
                m @ (Message::Batch { .. } | Message::Block { .. }) => {
                    // Our writer is behind: tell the sender we are busy, not stalled.
                    if super::while_busy(writer, busy, work, work_tx.send(m))
                        .await?
                        .is_err()
                    {
                        // The worker failed; its error is reported below.
                        return Ok(());
                    }
                }
                Message::BlockAnnounce(a) => {
                    let Some(key) = key.clone() else {
                        return Err(proto("BlockAnnounce without the dedup capability"));
                    };
                    let sh = shared.clone();
                    let task = tokio::task::spawn_blocking(move || handle_announce(&sh, &key, a));
                    let need = super::while_busy(writer, busy, work, task).await???;
                    writer.send(&Message::NeedBlocks(need)).await?;
                    writer.flush().await?;
                }
                Message::ResumeCheck(c) => {
                    if shared.caps & caps::RESUME == 0 {
                        return Err(proto("ResumeCheck without the resume capability"));
                    }
                    let sh = shared.clone();
                    let task = tokio::task::spawn_blocking(move || handle_resume_check(&sh, c));
                    let need = super::while_busy(writer, busy, work, task).await???;
                    writer.send(&Message::NeedBlocks(need)).await?;
                    writer.flush().await?;
                }
                Message::Keepalive | Message::Busy(_) => {}
                Message::Done(_) => return Ok(()),
                Message::Error(e) => {
                    return Err(ReceiveError::Remote {
                        kind: ErrorKind::from_pb(e.kind),
                        message: super::escape_text(&e.message),
                    });
                }
                other => {
                    return Err(ReceiveError::OutOfOrder {
                        stream,
                        kind: other.frame_type(),
                        when: "while data flows",
                    });
                }
            }
        }
    };
    let r: Result<(), ReceiveError> = main.await;
    drop(work_tx);
    // The worker's error (e.g. a hash mismatch) explains more than what the reader saw after it.
    worker.await??;
    r?;
    if stream != 0 {
        done.add_permits(1);
        return Ok(());
    }
    // Stream 0 waits for every other stream's Done: all data is in before directory metadata.
    if n > 1 {
        let _permits = done
            .acquire_many(n - 1)
            .await
            .map_err(|_| ReceiveError::Internal("session closed"))?;
    }
    shared.progress.set_phase(Phase::Finishing);
    let (busy, sh) = (shared.busy, shared.clone());
    let work = move || sh.work();
    loop {
        let msg = reader.expect().await?;
        shared.saw(&msg);
        match msg {
            Message::Offer(o) => {
                let sh = shared.clone();
                let task = tokio::task::spawn_blocking(move || handle_offer(&sh, o));
                let want = super::while_busy(writer, busy, &work, task).await???;
                writer.send(&Message::Want(want)).await?;
                writer.flush().await?;
            }
            Message::DirDone(d) => {
                let sh = shared.clone();
                let task = tokio::task::spawn_blocking(move || handle_dir_done(&sh, d));
                super::while_busy(writer, busy, &work, task).await???;
            }
            Message::Keepalive | Message::Busy(_) => {}
            Message::Finish => break,
            Message::Error(e) => {
                return Err(ReceiveError::Remote {
                    kind: ErrorKind::from_pb(e.kind),
                    message: super::escape_text(&e.message),
                });
            }
            other => {
                return Err(ReceiveError::OutOfOrder {
                    stream,
                    kind: other.frame_type(),
                    when: "after Done",
                });
            }
        }
    }
    {
        let table = shared.table.lock().map_err(|_| ReceiveError::Poisoned)?;
        if let Some(example) = table.paths.iter().next() {
            return Err(ReceiveError::Incomplete {
                count: table.paths.len(),
                example: example.to_string(),
            });
        }
    }
    let sh = shared.clone();
    // A dry run wrote nothing: there is no transferred tree to describe.
    let digest = if shared.dry_run {
        Vec::new()
    } else {
        let task = tokio::task::spawn_blocking(move || sh.compute_digest());
        super::while_busy(writer, busy, &work, task)
            .await???
            .to_vec()
    };
    let p = shared.progress.snapshot();
    let d = shared
        .dedup
        .as_ref()
        .map(|d| d.counters())
        .unwrap_or_default();
    writer
        .send(&Message::Summary(pb::Summary {
            files: p.files_done,
            bytes: p.bytes_done,
            skipped: p.skipped,
            resumed_bytes: p.resumed_bytes,
            wire_bytes: p.wire_bytes,
            dedup_blocks: d.dedup_blocks,
            dedup_bytes: d.dedup_bytes,
            deleted: shared.deleted.load(Ordering::Relaxed),
            failed: p.failed,
            failures: shared.failures(),
            digest,
            dropped_special_bits: shared.dropped.special_bits.load(Ordering::Relaxed),
            dropped_xattrs: shared.dropped.xattrs.load(Ordering::Relaxed),
            dropped_owners: shared.dropped.owners.load(Ordering::Relaxed),
        }))
        .await?;
    writer.flush().await?;
    Ok(())
}

/// A private directory under the system's temp directory for a dry run: `empty` stands in for
/// a destination root that does not exist, `staging` holds the session's staging. Removed on
/// drop.
struct Scratch {
    base: PathBuf,
    empty: PathBuf,
    staging: PathBuf,
}

impl Scratch {
    fn create() -> Result<Scratch, ReceiveError> {
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

fn handle_offer(sh: &Arc<Shared>, offer: pb::Offer) -> Result<pb::Want, ReceiveError> {
    if offer.entries.len() > MAX_OFFER_ENTRIES {
        return Err(proto(format!(
            "offer with {} entries (max {MAX_OFFER_ENTRIES})",
            offer.entries.len()
        )));
    }
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
    sh: &Arc<Shared>,
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
            sh.dest.create_dirs(path.as_bytes())?;
            if listed {
                changes::report(&Change::Dir, path.as_bytes());
            }
            sh.record_dir(&path)?;
            Ok(skip())
        }
        pb::EntryKind::Symlink => {
            if e.target.is_empty() || e.target.len() > 4096 || e.target.contains(&0) {
                return Err(proto(format!("invalid symlink target for {path}")));
            }
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
        pb::EntryKind::Unspecified => Err(proto(format!("entry {path} has no kind"))),
    }
}

/// Makes the hard link `path` to `target`, or leaves it out as a failed entry when a non-empty
/// directory is in its way (no `--delete`) or its target is not a regular file here.
fn hard_link(sh: &Shared, path: &PeerPath, target: &PeerPath) -> Result<(), ReceiveError> {
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
    sh: &Shared,
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
fn tolerate_refusal<T>(sh: &Shared, r: Result<T, DestError>) -> Result<Option<T>, ReceiveError> {
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
fn kept_attrs(sh: &Shared, e: &pb::Entry, path: &PeerPath) -> Result<Kept, ReceiveError> {
    let mut total = 0u64;
    for x in &e.xattrs {
        if !x.name.starts_with(b"user.") || x.name.len() > 255 || x.name.contains(&0) {
            return Err(proto(format!(
                "{path}: extended attribute name {:?} is not a user.* name",
                String::from_utf8_lossy(&x.name)
            )));
        }
        total += (x.name.len() + x.value.len()) as u64;
    }
    if total > MAX_XATTR_BYTES as u64 {
        return Err(proto(format!(
            "{path}: {total} bytes of extended attributes (at most {MAX_XATTR_BYTES})"
        )));
    }
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
            return Err(proto(format!(
                "more than {MAX_XATTR_BYTES_IN_FLIGHT} bytes of extended attributes in flight"
            )));
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
    sh: &Arc<Shared>,
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
    if e.size > MAX_FILE_SIZE {
        return Err(proto(format!(
            "{path}: declared size {} exceeds the largest file offset {MAX_FILE_SIZE}",
            e.size
        )));
    }
    {
        let t = sh.table.lock().map_err(|_| ReceiveError::Poisoned)?;
        if t.paths.contains(&path) {
            return Err(proto(format!("duplicate entry {path} in one session")));
        }
        if t.files.len() >= MAX_IN_FLIGHT {
            return Err(proto("too many files in flight"));
        }
        if e.size > SMALL_FILE_MAX && t.large >= MAX_LARGE_IN_FLIGHT {
            return Err(proto(format!(
                "too many large files in flight (at most {MAX_LARGE_IN_FLIGHT} per session)"
            )));
        }
    }
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
                let f = sh.dest.open_read(path.as_bytes())?;
                let m = owned(
                    sh.dest.meta(Kind::File, meta.mode, meta.size, meta.mtime),
                    meta.kept.owner,
                );
                sh.dest.apply_meta(&f, path.as_bytes(), &m)?;
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
    let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
    if e.size <= SMALL_FILE_MAX {
        register(sh, id, InFlight::Small(meta))?;
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
    let need = opened.held.complement(nblocks);
    let (need_blocks, need_ranges) = need.to_want(nblocks);
    let lf = Arc::new(LargeFile {
        meta,
        nblocks,
        staging: opened.staging,
        state: Mutex::new(LargeState {
            need,
            held: opened.held,
            remaining: nblocks,
        }),
    });
    register(sh, id, InFlight::Large(lf))?;
    Ok(pb::EntryWant {
        skip: false,
        need_blocks,
        file_id: id,
        need_ranges,
    })
}

fn register(sh: &Shared, id: u64, f: InFlight) -> Result<(), ReceiveError> {
    let mut t = sh.table.lock().map_err(|_| ReceiveError::Poisoned)?;
    let path = match &f {
        InFlight::Small(m) => m.path.clone(),
        InFlight::Large(l) => l.meta.path.clone(),
    };
    if !t.paths.insert(path.clone()) {
        return Err(proto(format!("duplicate entry {path} in one session")));
    }
    if matches!(f, InFlight::Large(_)) {
        t.large += 1;
    }
    t.files.insert(id, f);
    Ok(())
}

/// Reads a destination file once for `--checksum`: its whole-file BLAKE3 and its digest
/// content hash.
fn hash_existing(sh: &Shared, path: &PeerPath) -> Result<digest::ReadHashes, ReceiveError> {
    let mut f = sh.dest.open_read(path.as_bytes())?;
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

fn handle_batch(sh: &Shared, header: pb::BatchHeader, data: &[u8]) -> Result<(), ReceiveError> {
    // First the whole frame is checked and its files claimed, then the files are verified and
    // written: a malformed frame writes nothing.
    let mut files = Vec::with_capacity(header.files.len());
    let mut off = 0usize;
    {
        let mut t = sh.table.lock().map_err(|_| ReceiveError::Poisoned)?;
        for bf in header.files {
            let end = off
                .checked_add(bf.stored_len as usize)
                .filter(|e| *e <= data.len())
                .ok_or_else(|| proto("batch entry runs past the end of its frame"))?;
            let chunk = &data[off..end];
            off = end;
            let meta = match t.files.remove(&bf.file_id) {
                Some(InFlight::Small(m)) => {
                    t.paths.remove(&m.path);
                    m
                }
                Some(other) => {
                    t.files.insert(bf.file_id, other);
                    return Err(proto(format!("batch names large file id {}", bf.file_id)));
                }
                None => return Err(proto(format!("batch names unknown file id {}", bf.file_id))),
            };
            if u64::from(bf.raw_len) != meta.size {
                return Err(proto(format!(
                    "{}: batch carries {} bytes, the offer said {}",
                    meta.path, bf.raw_len, meta.size
                )));
            }
            files.push((bf, meta, chunk));
        }
    }
    if off != data.len() {
        return Err(proto("batch frame has trailing bytes"));
    }
    // Creating small files is the receiver's bottleneck (about five syscalls each, most of the
    // CPU), so the files of a large batch are written by several threads.
    let threads = sh
        .write_threads
        .min(files.len() / PARALLEL_BATCH_MIN)
        .max(1);
    if threads == 1 {
        return write_batch_files(sh, &files);
    }
    let per_thread = files.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(per_thread)
            .map(|part| scope.spawn(|| write_batch_files(sh, part)))
            .collect();
        let mut result = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(ReceiveError::Internal("a batch writer thread panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

/// Decodes, verifies and writes the claimed files of a batch.
fn write_batch_files(
    sh: &Shared,
    files: &[(pb::BatchFile, FileMeta, &[u8])],
) -> Result<(), ReceiveError> {
    let mut buf = Vec::new();
    for (bf, meta, chunk) in files {
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

fn write_small(
    sh: &Shared,
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
    meta.kept.set_xattrs(staged.fd(), &meta.path)?;
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

/// The large file in flight under `file_id`, for a `frame` that may only name one.
fn large_in_flight(sh: &Shared, file_id: u64, frame: &str) -> Result<Arc<LargeFile>, ReceiveError> {
    let t = sh.table.lock().map_err(|_| ReceiveError::Poisoned)?;
    match t.files.get(&file_id) {
        Some(InFlight::Large(l)) => Ok(l.clone()),
        Some(InFlight::Small(_)) => Err(proto(format!("{frame} for small file id {file_id}"))),
        None => Err(proto(format!("{frame} for unknown file id {file_id}"))),
    }
}

fn handle_block(
    sh: &Shared,
    h: &pb::BlockHeader,
    source: BlockSource<'_>,
) -> Result<(), ReceiveError> {
    let lf = large_in_flight(sh, h.file_id, "block")?;
    let path = lf.meta.path.to_string();
    if h.index >= lf.nblocks {
        return Err(proto(format!(
            "{path}: block index {} past the last block {}",
            h.index,
            lf.nblocks - 1
        )));
    }
    let expected = block_len(lf.meta.size, h.index);
    if u64::from(h.raw_len) != expected {
        return Err(proto(format!(
            "{path}: block {} is {} bytes, expected {expected}",
            h.index, h.raw_len
        )));
    }
    // Claim the block so a duplicate on another stream is refused.
    lf.claim(&[h.index])?;
    let BlockSource::Wire { codec, data } = source;
    let mut decoded = Vec::new();
    // A full zero block (a hole of a sparse file) hashes to a constant: no 4 MiB of zeros is
    // decoded and hashed for it.
    let full_zero =
        codec == compress::CODEC_ZERO && data.is_empty() && expected == BLOCK_SIZE as u64;
    // Raw blocks are hashed and written straight from the frame: no copy.
    let buf: &[u8] = if codec == crate::wire::codec::RAW && data.len() as u64 == expected {
        data
    } else if full_zero {
        &[]
    } else {
        decoded.reserve_exact(expected as usize);
        compress::decode(codec, data, expected as usize, sh.caps, &mut decoded).map_err(
            |source| ReceiveError::Codec {
                path: path.clone(),
                index: h.index,
                source,
            },
        )?;
        &decoded
    };
    let hash = if full_zero {
        blake3::Hash::from_bytes(crate::wire::zero_block_hash())
    } else {
        blake3::hash(buf)
    };
    if hash.as_bytes().as_slice() != h.hash.as_slice() {
        return Err(ReceiveError::HashMismatch {
            path,
            index: h.index,
        });
    }
    if let Some(d) = &sh.dedup
        && codec != compress::CODEC_ZERO
        && let Err(e) = d.insert_received(&BlockHash::from(hash), buf)
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
    if codec == compress::CODEC_ZERO {
        lf.staging.write_zeros(off, expected).map_err(werr)?;
    } else {
        lf.staging.write_block(off, buf).map_err(werr)?;
    }
    lf.staging.record(h.index, hash.as_bytes()).map_err(werr)?;
    let finished = lf.written(1)?;
    sh.progress.add(&sh.progress.bytes_done, expected);
    if finished {
        complete_large(sh, h.file_id, &lf)?;
    }
    Ok(())
}

impl LargeFile {
    /// Claims requested blocks for one stream (a Block frame or an announce): a block not
    /// requested, or claimed already, is a protocol violation.
    fn claim(&self, indexes: &[u64]) -> Result<(), ReceiveError> {
        let mut st = self.state.lock().map_err(|_| ReceiveError::Poisoned)?;
        for &index in indexes {
            if !st.need.remove(index) {
                return Err(proto(format!(
                    "{}: block {index} was not requested or was sent twice",
                    self.meta.path
                )));
            }
        }
        self.check_scatter(&st)
    }

    /// The block sets stay small: a sender that scatters its blocks (or its resume checks) is
    /// refused rather than let grow them.
    fn check_scatter(&self, st: &LargeState) -> Result<(), ReceiveError> {
        if st.need.range_count() + st.held.range_count() > MAX_FILE_RANGES {
            return Err(proto(format!(
                "{}: blocks arrive too scattered (more than {MAX_FILE_RANGES} gaps)",
                self.meta.path
            )));
        }
        Ok(())
    }

    /// `n` more blocks are verified and written; true when that was the last.
    fn written(&self, n: u64) -> Result<bool, ReceiveError> {
        let mut st = self.state.lock().map_err(|_| ReceiveError::Poisoned)?;
        st.remaining = st.remaining.checked_sub(n).ok_or(ReceiveError::Internal(
            "more blocks written than the file has",
        ))?;
        Ok(st.remaining == 0)
    }
}

/// The last block of a large file is in (from the wire or the store): forget it and publish it.
fn complete_large(sh: &Shared, file_id: u64, lf: &LargeFile) -> Result<(), ReceiveError> {
    {
        let mut t = sh.table.lock().map_err(|_| ReceiveError::Poisoned)?;
        if t.files.remove(&file_id).is_some() {
            t.large = t.large.saturating_sub(1);
        }
        t.paths.remove(&lf.meta.path);
    }
    if commit_large(sh, lf)? {
        sh.progress.add(&sh.progress.files_done, 1);
    }
    Ok(())
}

/// One BlockAnnounce: claim the announced blocks, take from the store every one it holds whose
/// proof of possession matches, and answer which of them must still come over the wire.
fn handle_announce(
    sh: &Shared,
    key: &PopKey,
    a: pb::BlockAnnounce,
) -> Result<pb::NeedBlocks, ReceiveError> {
    let Some(dedup) = &sh.dedup else {
        return Err(proto("BlockAnnounce without a block store"));
    };
    let n = a.indexes.len();
    if a.hashes.len() != n || a.proofs.len() != n {
        return Err(proto("BlockAnnounce lists differ in length"));
    }
    if n > MAX_ANNOUNCE_BLOCKS {
        return Err(proto(format!(
            "BlockAnnounce lists {n} blocks (max {MAX_ANNOUNCE_BLOCKS})"
        )));
    }
    let lf = large_in_flight(sh, a.file_id, "BlockAnnounce")?;
    let path = lf.meta.path.to_string();
    let announced = {
        let mut announced = Vec::with_capacity(n);
        for i in 0..n {
            let index = a.indexes[i];
            if index >= lf.nblocks || block_len(lf.meta.size, index) != BLOCK_SIZE as u64 {
                return Err(proto(format!(
                    "{path}: announced block {index} is not a full block of the file"
                )));
            }
            let (Ok(hash), Ok(proof)) = (
                <[u8; 32]>::try_from(a.hashes[i].as_slice()),
                <[u8; 32]>::try_from(a.proofs[i].as_slice()),
            ) else {
                return Err(proto(format!(
                    "{path}: announced block {index} has a malformed hash or proof"
                )));
            };
            announced.push(AnnouncedBlock {
                index,
                hash: BlockHash::from_bytes(hash),
                proof: Proof(proof),
            });
        }
        announced
    };
    // Claim them, exactly as Block frames would: no block is announced twice or sent too.
    lf.claim(&a.indexes)?;
    // Reads, verifies and writes without holding the file's lock.
    let needed = dedup.materialize_announced(key, &lf.staging, &announced)?;
    let mut bitmap = Bitmap::with_len(n);
    let mut taken = 0u64;
    let mut taken_blocks = 0u64;
    for (i, (b, need)) in announced.iter().zip(&needed).enumerate() {
        if *need {
            bitmap.set(i);
        } else {
            // The store verified the bytes it wrote against this hash.
            lf.staging
                .record(b.index, b.hash.as_bytes())
                .map_err(|source| ReceiveError::Write {
                    path: path.clone(),
                    source,
                })?;
            taken += block_len(lf.meta.size, b.index);
            taken_blocks += 1;
        }
    }
    {
        // Blocks the store could not give are requested again (they come as Block frames).
        let mut st = lf.state.lock().map_err(|_| ReceiveError::Poisoned)?;
        for (b, need) in announced.iter().zip(&needed) {
            if *need {
                st.need.insert(b.index);
            }
        }
        lf.check_scatter(&st)?;
    }
    let finished = taken_blocks > 0 && lf.written(taken_blocks)?;
    sh.progress.add(&sh.progress.bytes_done, taken);
    // Reported live, so the operator can show block-store hits while the transfer runs.
    sh.progress.add(&sh.progress.dedup_blocks, taken_blocks);
    sh.progress.add(&sh.progress.dedup_bytes, taken);
    if finished {
        complete_large(sh, a.file_id, &lf)?;
    }
    Ok(pb::NeedBlocks {
        file_id: a.file_id,
        need_blocks: bitmap.into_bytes(),
    })
}

/// One ResumeCheck: the sender's hashes of blocks this receiver holds from an earlier run. Each
/// held block is re-read and kept only if its hash equals the sender's; the answer names the
/// ones that must come over the wire (and they are requested again).
fn handle_resume_check(sh: &Shared, c: pb::ResumeCheck) -> Result<pb::NeedBlocks, ReceiveError> {
    let n = c.indexes.len();
    if c.hashes.len() != n {
        return Err(proto("ResumeCheck lists differ in length"));
    }
    if n > MAX_ANNOUNCE_BLOCKS {
        return Err(proto(format!(
            "ResumeCheck lists {n} blocks (max {MAX_ANNOUNCE_BLOCKS})"
        )));
    }
    let lf = large_in_flight(sh, c.file_id, "ResumeCheck")?;
    let mut hashes = Vec::with_capacity(n);
    for h in &c.hashes {
        hashes.push(
            <[u8; 32]>::try_from(h.as_slice())
                .map_err(|_| proto(format!("{}: malformed hash in ResumeCheck", lf.meta.path)))?,
        );
    }
    {
        // Claim: each block is checked once, and only blocks held from an earlier run.
        let mut st = lf.state.lock().map_err(|_| ReceiveError::Poisoned)?;
        for &index in &c.indexes {
            if !st.held.remove(index) {
                return Err(proto(format!(
                    "{}: ResumeCheck names block {index}, which is not held or was checked",
                    lf.meta.path
                )));
            }
        }
        lf.check_scatter(&st)?;
    }
    let needed = lf.staging.verify_held(lf.meta.size, &c.indexes, &hashes);
    let checked: u64 = c.indexes.iter().map(|&i| block_len(lf.meta.size, i)).sum();
    sh.progress.add(&sh.progress.hashed_bytes, checked);
    let mut bitmap = Bitmap::with_len(n);
    let mut kept = 0u64;
    let mut kept_bytes = 0u64;
    {
        let mut st = lf.state.lock().map_err(|_| ReceiveError::Poisoned)?;
        for (i, (&index, need)) in c.indexes.iter().zip(&needed).enumerate() {
            if *need {
                bitmap.set(i);
                st.need.insert(index);
            } else {
                kept += 1;
                kept_bytes += block_len(lf.meta.size, index);
            }
        }
        lf.check_scatter(&st)?;
    }
    sh.progress.add(&sh.progress.resumed_bytes, kept_bytes);
    if kept > 0 && lf.written(kept)? {
        complete_large(sh, c.file_id, &lf)?;
    }
    Ok(pb::NeedBlocks {
        file_id: c.file_id,
        need_blocks: bitmap.into_bytes(),
    })
}

/// Publishes a verified large file; false when it was left out (a non-empty directory filled
/// its path after the offer was answered).
fn commit_large(sh: &Shared, lf: &LargeFile) -> Result<bool, ReceiveError> {
    let st = &lf.staging;
    let path = lf.meta.path.to_string();
    let path = path.as_str();
    let staged = format!("{}/{}", sh.staging.rel, st.part_name);
    let m = owned(
        sh.dest
            .meta(Kind::File, lf.meta.mode, lf.meta.size, lf.meta.mtime),
        lf.meta.kept.owner,
    );
    lf.meta
        .kept
        .set_xattrs(std::os::fd::AsFd::as_fd(&st.data), &lf.meta.path)?;
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
    sh.dest
        .apply_meta(&st.data, staged.as_bytes(), &m)
        .map_err(publish)?;
    if sh.sync {
        st.data.sync_all().map_err(|source| ReceiveError::Write {
            path: path.to_owned(),
            source,
        })?;
    }
    let published = match sh
        .dest
        .publish_from_staging(staged.as_bytes(), &lf.meta.path)
    {
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

fn handle_dir_done(sh: &Shared, d: pb::DirDone) -> Result<(), ReceiveError> {
    let Some(dir) = d.dir else {
        return Err(proto("DirDone without a directory"));
    };
    let rel = if dir.path.is_empty() {
        None
    } else {
        Some(PeerPath::parse(&dir.path)?)
    };
    if sh.caps & caps::DELETE != 0 && d.complete_listing {
        if d.names.len() > 10_000_000 {
            return Err(proto("directory listing too long"));
        }
        let mut keep = HashSet::with_capacity(d.names.len());
        for name in d.names {
            if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
                return Err(proto(format!(
                    "invalid name {:?} in a directory listing",
                    String::from_utf8_lossy(&name)
                )));
            }
            keep.insert(name);
        }
        let removed = sh
            .dest
            .delete_extraneous(rel.as_ref(), &keep, &sh.protect, sh.dry_run)?;
        sh.deleted.fetch_add(removed, Ordering::Relaxed);
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
                let fd = sh.dest.open_dir(Some(p.as_bytes()))?;
                kept.set_xattrs(std::os::fd::AsFd::as_fd(&*fd), &p)?;
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
