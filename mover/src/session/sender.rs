//! The sending end: walks the tree while streams carry data, pipelines Offers, reads Wants, and
//! stripes the blocks of large files over all streams.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc};

use super::OFFER_WINDOW;
use super::compress::{CodecPolicy, Compress};
use super::framed::{FrameReader, FrameWriter, FramedError};
use super::handshake::{HandshakeError, send_hello};
use super::scan::{self, ScanError};
use super::{
    Abort, PEER_GRACE, Reason, SMALL_FILE_MAX, Summary, Timeouts, anyhow_chain, pending_peer_error,
    tell_peer,
};
use crate::cas::dedup::DedupSender;
use crate::digest::{self, BlockHashes, DirList, Hash, HashError, HashPool, LinkList, TreeBuilder};
use crate::kind::ErrorKind;
use crate::limiter::Limiter;
use crate::progress::{Phase, Progress};
use crate::report::changes;
use crate::tree::confine::open_dir_beneath;
use crate::tree::{DirFd, Filter, RelPath, Resolve, split_source};
use crate::wire::{
    BLOCK_SIZE, Bitmap, BlockSet, FrameType, Message, PROTOCOL_VERSION, block_len, caps, codec,
};

/// Keepalive after this much silence on a stream, well below any sane idle timeout.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// Bytes of small-file content per Batch frame.
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Blocks per BlockAnnounce (the receiver accepts up to 65 536). Small enough that the receiver
/// materialises one chunk while the sender hashes the next.
const ANNOUNCE_CHUNK: usize = 16;
/// Blocks per ResumeCheck (about 40 KiB of hashes; the receiver accepts up to 65 536).
const RESUME_CHUNK: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Framed(#[from] FramedError),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The receiver broke the protocol (seen here).
    #[error("receiver broke the protocol: {0}")]
    Peer(String),
    /// The receiver failed and said why (its Error frame).
    #[error("receiver: {message}")]
    Remote { kind: ErrorKind, message: String },
    /// This stream stopped because another one failed (never the reported error when the real
    /// one is known).
    #[error("stopped: another stream of the session failed")]
    Aborted,
    #[error("stream {stream}: unexpected {kind:?} frame from receiver (expected {expected})")]
    Unexpected {
        stream: u32,
        kind: FrameType,
        expected: &'static str,
    },
    #[error(
        "stream {stream}: the receiver made no progress for {secs} s (no answer and no growing \
         work counter)"
    )]
    NoProgress { stream: u32, secs: u64 },
    #[error("receiver answered offer {got}, expected {expected}")]
    WantMismatch { got: u64, expected: u64 },
    #[error("failed to read source file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("source file {0} changed size during the transfer")]
    Changed(PathBuf),
    #[error(transparent)]
    Digest(#[from] HashError),
    #[error(
        "transfer digests differ: sender {sender}, receiver {receiver}; the destination does not \
         hold what the source holds (a destination file changed without changing its size and \
         mtime, or the source changed during the transfer; rerun, with --checksum for the former)"
    )]
    DigestMismatch { sender: String, receiver: String },
    #[error(
        "the receiver sent no transfer digest (it is older than this sender), so the transfer cannot be verified"
    )]
    NoPeerDigest,
    #[error("the receiver sent a malformed transfer digest ({0} bytes)")]
    BadPeerDigest(usize),
    #[error("internal error: the transfer digest is incomplete")]
    DigestIncomplete,
    #[error(
        "the receiver does not support --exclude/--include with --delete (it would delete the \
         excluded entries); upgrade it or leave out --delete"
    )]
    FilterUnsupported,
    #[error("the receiver does not support --dry-run (it would write); upgrade it")]
    DryRunUnsupported,
    #[error("internal channel closed")]
    Channel,
    #[error("a blocking task failed")]
    Join(#[from] tokio::task::JoinError),
}

/// Sender settings.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub root: PathBuf,
    pub transfer_id: String,
    pub compress: Compress,
    pub delete: bool,
    pub checksum: bool,
    pub sync: bool,
    pub bandwidth_limit: Option<u64>,
    pub timeouts: Timeouts,
    /// `--exclude` / `--include`: left out of the walk, and (sent to the receiver) kept from
    /// `--delete`.
    pub filter: Arc<Filter>,
    /// Ask the receiver what it would write and delete; send no data, change nothing.
    pub dry_run: bool,
}

struct BlockJob {
    file_id: u64,
    /// The file, opened once beneath the source root: every block is read from this handle, so
    /// a directory swapped for a symlink during the transfer redirects nothing.
    file: Arc<std::fs::File>,
    /// For messages only.
    path: Arc<PathBuf>,
    index: u64,
    len: u64,
    /// The file's digest state (absent when the walk hashed the file already).
    digest: Option<Arc<FileDigest>>,
}

/// A large file's block hashes, collected for the digest from every block as it is read (sent,
/// announced, or read for the digest only because the receiver had it already).
struct FileDigest {
    entry: pb::Entry,
    blocks: std::sync::Mutex<BlockHashes>,
}

impl FileDigest {
    fn new(e: &pb::Entry) -> Arc<Self> {
        Arc::new(Self {
            entry: digest_entry(e),
            blocks: std::sync::Mutex::new(BlockHashes::new(e.size.div_ceil(BLOCK_SIZE as u64))),
        })
    }
}

/// What the digest needs of an offered entry (no checksum, no target).
fn digest_entry(e: &pb::Entry) -> pb::Entry {
    pb::Entry {
        path: e.path.clone(),
        kind: e.kind,
        mode: e.mode,
        mtime_sec: e.mtime_sec,
        mtime_nsec: e.mtime_nsec,
        size: e.size,
        ..Default::default()
    }
}

struct Ctx {
    root: PathBuf,
    /// The source root's handle; small files are opened beneath it.
    src: DirFd,
    policy: CodecPolicy,
    limiter: Option<Limiter>,
    progress: Arc<Progress>,
    work: Mutex<mpsc::Receiver<Vec<pb::Entry>>>,
    blocks: Mutex<mpsc::Receiver<BlockJob>>,
    next_offer: AtomicU64,
    /// The session's first failure: stops every stream.
    abort: Abort,
    /// The digest's Merkle tree, fed by the walk and by every file whose content was hashed.
    tree: Arc<std::sync::Mutex<TreeBuilder>>,
    /// Reads what the receiver did not need (unchanged files, resumed blocks) for the digest.
    pool: Arc<HashPool>,
    /// With `--checksum` the walk reads every file, so it computes the content hash too.
    content_in_scan: bool,
    /// The receiver resumes only blocks this sender confirms (ResumeCheck).
    resume_check: bool,
    /// Busy frames instead of keepalives (progress capability).
    busy: bool,
    /// How long the receiver may make no progress while this end waits for it.
    progress_timeout: Duration,
    /// Only ask what the receiver would do (no data, no digest).
    dry_run: bool,
}

impl Ctx {
    /// A file's content hash is known: its entry goes into the tree.
    fn file_digested(&self, e: &pb::Entry, content: &Hash) {
        let entry = digest::file_entry(e.size, e.mode, (e.mtime_sec, e.mtime_nsec), content);
        if let Ok(mut t) = self.tree.lock() {
            t.fulfil(&e.path, entry);
        }
    }

    fn block_digested(&self, fd: &FileDigest, index: u64, hash: Hash) {
        let done = fd.blocks.lock().ok().and_then(|mut b| b.set(index, hash));
        if let Some(content) = done {
            self.file_digested(&fd.entry, &content);
        }
    }
}

/// Stops the digest readers when the session ends early.
struct CancelOnDrop(Arc<HashPool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

type Reader<S> = FrameReader<ReadHalf<S>>;
type Writer<S> = FrameWriter<WriteHalf<S>>;

/// Runs a whole transfer over `streams` (already connected, e.g. TLS); stream i gets index i.
pub async fn send_session<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    progress: Arc<Progress>,
) -> Result<Summary, SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let r = run(cfg, streams, progress.clone()).await;
    match &r {
        Ok(summary) => summary.set_outcome(&progress),
        Err(e) => {
            progress.set_failure(e.kind(), &anyhow_chain(e));
            progress.set_phase(Phase::Failed);
        }
    }
    r
}

/// Which of two failures of one session to report: the receiver's own reason first, then a
/// failure seen here, then a broken connection, and never "another stream failed".
fn more_telling(a: SendError, b: SendError) -> SendError {
    let rank = |e: &SendError| match e {
        SendError::Remote { .. } => 0,
        SendError::Aborted => 3,
        e if e.kind().is_transport() || matches!(e, SendError::Channel) => 2,
        _ => 1,
    };
    if rank(&b) < rank(&a) { b } else { a }
}

/// Tells the receiver why the session fails, on every stream (best effort), unless the
/// receiver is the one that said it.
async fn tell_receiver<S>(ends: &mut [(Reader<S>, Writer<S>)], e: &SendError)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    if matches!(e, SendError::Remote { .. }) {
        return;
    }
    let message = anyhow_chain(e);
    let tells = ends
        .iter_mut()
        .map(|(_, w)| tell_peer(w, e.kind(), &message));
    futures::future::join_all(tells).await;
}

async fn run<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    progress: Arc<Progress>,
) -> Result<Summary, SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let n = streams.len() as u32;
    let session_id: [u8; 16] = rand::random();
    // Dedup is always requested: a receiver offers it only when it has a block store.
    // Dedup and xattrs are always requested: a receiver grants them only with a block store /
    // when it keeps xattrs.
    let mut want_caps = caps::ZSTD
        | caps::LZ4
        | caps::VERIFY
        | caps::DEDUP
        | caps::RESUME
        | caps::PROGRESS
        | caps::XATTRS;
    if cfg.delete {
        want_caps |= caps::DELETE;
    }
    if cfg.checksum {
        want_caps |= caps::CHECKSUM;
    }
    if cfg.sync {
        want_caps |= caps::SYNC;
    }
    if !cfg.filter.is_empty() {
        want_caps |= caps::FILTER;
    }
    if cfg.dry_run {
        want_caps |= caps::DRY_RUN;
    }
    let wire = progress.wire_bytes.clone();
    let mut halves = Vec::new();
    let mut negotiated = want_caps;
    for (i, s) in streams.into_iter().enumerate() {
        let (r, w) = tokio::io::split(s);
        let mut reader = FrameReader::new(r, i as u32, cfg.timeouts.handshake, Default::default());
        let mut writer = FrameWriter::new(w, i as u32, cfg.timeouts.handshake, wire.clone());
        let hello = pb::Hello {
            version: PROTOCOL_VERSION,
            capabilities: want_caps,
            transfer_id: cfg.transfer_id.clone(),
            session_id: session_id.to_vec(),
            stream_index: i as u32,
            stream_count: n,
            block_size: BLOCK_SIZE as u32,
            filter_rules: if i == 0 {
                cfg.filter.to_wire()
            } else {
                Vec::new()
            },
        };
        let fut = send_hello(&mut reader, &mut writer, hello);
        let (got, nonce) = tokio::time::timeout(cfg.timeouts.handshake, fut)
            .await
            .map_err(|_| FramedError::IdleTimeout {
                stream: i as u32,
                secs: cfg.timeouts.handshake.as_secs(),
            })??;
        negotiated &= got;
        reader.set_stream(i as u32, cfg.timeouts.idle);
        writer.set_stream(i as u32, cfg.timeouts.idle);
        // Proofs on a stream are keyed by that stream's nonce.
        let dedup = nonce.map(|n| Arc::new(DedupSender::new(&n)));
        halves.push((reader, writer, dedup));
    }
    // A receiver that does not know the rules would delete what they leave out.
    if cfg.delete && !cfg.filter.is_empty() && negotiated & caps::FILTER == 0 {
        return Err(SendError::FilterUnsupported);
    }
    // A receiver that does not know dry runs would write.
    if cfg.dry_run && negotiated & caps::DRY_RUN == 0 {
        return Err(SendError::DryRunUnsupported);
    }
    let started = Instant::now();
    progress.set_phase(Phase::Transferring);

    let (work_tx, work_rx) = mpsc::channel(2 * n as usize);
    let (block_tx, block_rx) = mpsc::channel(n as usize);
    // A single file is sent as its directory holding just that name.
    let (root_dir, only) = split_source(&cfg.root);
    let src = std::fs::File::open(&root_dir).map_err(|source| SendError::Read {
        path: root_dir.clone(),
        source,
    })?;
    let checksum = cfg.checksum && negotiated & caps::CHECKSUM != 0;
    let tree = Arc::new(std::sync::Mutex::new(TreeBuilder::new()));
    let pool = Arc::new(HashPool::per_core());
    let _cancel = CancelOnDrop(pool.clone());
    let ctx = Arc::new(Ctx {
        root: root_dir.clone(),
        src: Arc::new(src.into()),
        policy: CodecPolicy::new(cfg.compress, negotiated, cfg.bandwidth_limit),
        limiter: cfg.bandwidth_limit.map(Limiter::new),
        progress: progress.clone(),
        work: Mutex::new(work_rx),
        blocks: Mutex::new(block_rx),
        next_offer: AtomicU64::new(1),
        abort: Abort::default(),
        tree: tree.clone(),
        pool,
        content_in_scan: checksum,
        resume_check: negotiated & caps::RESUME != 0,
        busy: negotiated & caps::PROGRESS != 0,
        progress_timeout: cfg.timeouts.progress,
        dry_run: cfg.dry_run,
    });
    let p = progress.clone();
    let filter = cfg.filter.clone();
    let xattrs = negotiated & caps::XATTRS != 0;
    let scanner = tokio::task::spawn_blocking(move || {
        scan::scan(
            &root_dir,
            only.as_deref(),
            &filter,
            scan::Collect { checksum, xattrs },
            work_tx,
            p,
            &tree,
        )
    });

    let mut futs = Vec::new();
    for (reader, writer, dedup) in halves {
        futs.push(run_stream(
            ctx.clone(),
            reader,
            writer,
            block_tx.clone(),
            dedup,
        ));
    }
    drop(block_tx);
    // Every stream runs to its end: one that fails stops the others (each tells the receiver
    // why), and the most telling failure is reported.
    let mut ends = Vec::new();
    let mut failure: Option<SendError> = None;
    for r in futures::future::join_all(futs).await {
        match r {
            Ok(end) => ends.push(end),
            Err(e) => {
                failure = Some(match failure {
                    None => e,
                    Some(f) => more_telling(f, e),
                });
            }
        }
    }
    if let Some(e) = failure {
        // Streams that had finished their data hear it too.
        tell_receiver(&mut ends, &e).await;
        return Err(e);
    }
    let tail = async {
        // The walk must have succeeded before we tell the receiver the tree is complete.
        let hardlinks = scanner.await??;
        let (reader, writer) = ends.first_mut().ok_or(SendError::Channel)?;
        let (dirs, links) = finish(cfg, &ctx, reader, writer, hardlinks, negotiated).await?;
        let mut work = 0;
        let summary = match next_reply(reader, ctx.progress_timeout, &mut work).await {
            Ok(Message::Summary(s)) => s,
            Ok(Message::Error(e)) => {
                return Err(SendError::Remote {
                    kind: ErrorKind::from_pb(e.kind),
                    message: super::escape_text(&e.message),
                });
            }
            Ok(other) => {
                return Err(SendError::Unexpected {
                    stream: 0,
                    kind: other.frame_type(),
                    expected: "Summary",
                });
            }
            Err(e) => return Err(e),
        };
        Ok((summary, dirs, links))
    };
    let (summary, dirs, links) = match tail.await {
        Ok(t) => t,
        Err(e) => {
            tell_receiver(&mut ends, &e).await;
            return Err(e);
        }
    };
    for (_, w) in &mut ends {
        w.shutdown().await;
    }
    // A dry run moved nothing, so there is no transferred tree to agree on.
    let hex = if ctx.dry_run {
        String::new()
    } else {
        let ours = sender_digest(&ctx, &dirs, &links).await?;
        let hex = digest::hex(&ours);
        // Shown with a mismatch too: it is what the source held.
        progress.set_digest(&hex);
        // With entries left out the digests differ by construction; the failures say why.
        if summary.failed == 0 {
            check_peer_digest(&ours, &summary.digest)?;
        }
        hex
    };
    progress.files_done.store(summary.files, Ordering::Relaxed);
    progress.bytes_done.store(summary.bytes, Ordering::Relaxed);
    progress.skipped.store(summary.skipped, Ordering::Relaxed);
    progress
        .resumed_bytes
        .store(summary.resumed_bytes, Ordering::Relaxed);
    progress.failed.store(summary.failed, Ordering::Relaxed);
    Ok(Summary {
        dry_run: ctx.dry_run,
        files: summary.files,
        bytes: summary.bytes,
        wire_bytes: wire.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        streams: n,
        skipped: summary.skipped,
        resumed_bytes: summary.resumed_bytes,
        dedup_blocks: summary.dedup_blocks,
        dedup_bytes: summary.dedup_bytes,
        deleted: summary.deleted,
        failed: summary.failed,
        digest: hex,
        dropped_special_bits: summary.dropped_special_bits,
        dropped_xattrs: summary.dropped_xattrs,
        dropped_owners: summary.dropped_owners,
        // Shown to the user; a receiver is trusted with no more than a few lines of it.
        failures: summary
            .failures
            .iter()
            .take(super::MAX_REPORTED_FAILURES)
            .map(|f| super::escape_text(f))
            .collect(),
    })
}

/// The sender's digest once every file was hashed: the walk's tree, and the directory and hard
/// link lists as they were sent.
async fn sender_digest(ctx: &Arc<Ctx>, dirs: &Hash, links: &Hash) -> Result<Hash, SendError> {
    let pool = ctx.pool.clone();
    tokio::task::spawn_blocking(move || pool.finish()).await??;
    let root = ctx
        .tree
        .lock()
        .ok()
        .and_then(|t| t.root())
        .ok_or(SendError::DigestIncomplete)?;
    Ok(digest::transfer_digest(&root, dirs, links))
}

/// Compares the receiver's digest (from its Summary) with ours.
fn check_peer_digest(ours: &Hash, theirs: &[u8]) -> Result<(), SendError> {
    if theirs.is_empty() {
        return Err(SendError::NoPeerDigest);
    }
    let theirs: Hash = theirs
        .try_into()
        .map_err(|_| SendError::BadPeerDigest(theirs.len()))?;
    if &theirs != ours {
        return Err(SendError::DigestMismatch {
            sender: digest::hex(ours),
            receiver: digest::hex(&theirs),
        });
    }
    Ok(())
}

/// Final phase on stream 0: hard links (in path order), directory metadata (and delete
/// listings), Finish. Returns the digest's `dirs` and `links` parts as sent.
async fn finish<S>(
    cfg: &SenderConfig,
    ctx: &Ctx,
    reader: &mut Reader<S>,
    writer: &mut Writer<S>,
    mut hardlinks: Vec<pb::Entry>,
    negotiated: u64,
) -> Result<(Hash, Hash), SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    ctx.progress.set_phase(Phase::Finishing);
    hardlinks.sort_by(|a, b| digest::path_order(&a.path, &b.path));
    let mut links = LinkList::default();
    for h in &hardlinks {
        links.add(&h.path, &h.target, h.mode, (h.mtime_sec, h.mtime_nsec));
    }
    for chunk in hardlinks.chunks(super::MAX_OFFER_ENTRIES) {
        let offer_id = ctx.next_offer.fetch_add(1, Ordering::Relaxed);
        writer
            .send(&Message::Offer(pb::Offer {
                offer_id,
                entries: chunk.to_vec(),
            }))
            .await?;
        writer.flush().await?;
        read_want(reader, offer_id, ctx.progress_timeout).await?;
    }
    let (tx, mut rx) = mpsc::channel(16);
    let root = cfg.root.clone();
    let with_names = cfg.delete && negotiated & caps::DELETE != 0;
    let xattrs = negotiated & caps::XATTRS != 0;
    let filter = cfg.filter.clone();
    let walker = tokio::task::spawn_blocking(move || {
        // A single file has no directory of its own to finish (nor siblings to delete).
        if split_source(&root).1.is_some() {
            return Ok(());
        }
        scan::walk_dirs(&root, &filter, with_names, xattrs, tx)
    });
    let mut dirs = DirList::default();
    while let Some(d) = rx.recv().await {
        if let Some(dir) = &d.dir
            && !dir.path.is_empty()
        {
            dirs.add(&dir.path, dir.mode, (dir.mtime_sec, dir.mtime_nsec));
        }
        writer.send(&Message::DirDone(d)).await?;
    }
    walker.await??;
    writer.send(&Message::Finish).await?;
    writer.flush().await?;
    Ok((dirs.finish(), links.finish()))
}

/// The receiver's next reply on this stream, past Keepalive and Busy frames. Fails when the
/// receiver makes no progress for `limit`: no reply, and no Busy frame whose work counter grew
/// (keepalives and trickled bytes do not count).
async fn next_reply<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    limit: Duration,
    last_work: &mut u64,
) -> Result<Message, SendError> {
    let mut deadline = tokio::time::Instant::now() + limit;
    loop {
        let msg = tokio::time::timeout_at(deadline, reader.expect())
            .await
            .map_err(|_| SendError::NoProgress {
                stream: reader.stream(),
                secs: limit.as_secs(),
            })??;
        match msg {
            Message::Keepalive => {}
            Message::Busy(b) => {
                if b.work > *last_work {
                    *last_work = b.work;
                    deadline = tokio::time::Instant::now() + limit;
                }
            }
            m => return Ok(m),
        }
    }
}

async fn read_want<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    offer_id: u64,
    limit: Duration,
) -> Result<pb::Want, SendError> {
    let mut work = 0;
    let msg = next_reply(reader, limit, &mut work).await?;
    match msg {
        Message::Want(w) if w.offer_id == offer_id => Ok(w),
        Message::Want(w) => Err(SendError::WantMismatch {
            got: w.offer_id,
            expected: offer_id,
        }),
        Message::Error(e) => Err(SendError::Remote {
            kind: ErrorKind::from_pb(e.kind),
            message: super::escape_text(&e.message),
        }),
        other => Err(SendError::Unexpected {
            stream: reader.stream(),
            kind: other.frame_type(),
            expected: "Want",
        }),
    }
}

async fn run_stream<S>(
    ctx: Arc<Ctx>,
    mut reader: Reader<S>,
    mut writer: Writer<S>,
    block_tx: mpsc::Sender<BlockJob>,
    dedup: Option<Arc<DedupSender>>,
) -> Result<(Reader<S>, Writer<S>), SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let r = {
        let (out_tx, out_rx) = mpsc::channel::<Message>(1);
        let (pending_tx, pending_rx) = mpsc::channel(OFFER_WINDOW);
        let offers = offer_task(ctx.clone(), out_tx.clone(), pending_tx);
        let answers = answer_task(
            ctx.clone(),
            &mut reader,
            out_tx.clone(),
            pending_rx,
            block_tx,
            dedup,
        );
        let blocks = block_task(ctx.clone(), out_tx);
        let write = writer_task(ctx.clone(), &mut writer, out_rx);
        let work = async { tokio::try_join!(offers, answers, blocks, write).map(|_| ()) };
        tokio::select! {
            r = work => r,
            () = ctx.abort.wait() => Err(SendError::Aborted),
        }
    };
    match r {
        Ok(()) => Ok((reader, writer)),
        Err(e) => Err(fail_stream(&ctx, &mut reader, &mut writer, e).await),
    }
}

/// A stream failed with `e`. A broken connection may hide the receiver's reason: read its
/// pending Error frame for a moment. The first failure stops the other streams; the receiver
/// hears ours on this stream (not its own back).
async fn fail_stream<S>(
    ctx: &Ctx,
    reader: &mut Reader<S>,
    writer: &mut Writer<S>,
    e: SendError,
) -> SendError
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let e = if e.kind().is_transport() || matches!(e, SendError::Channel) {
        match pending_peer_error(reader, PEER_GRACE).await {
            Some((kind, message)) => SendError::Remote { kind, message },
            None => e,
        }
    } else {
        e
    };
    let reason = match &e {
        SendError::Aborted => ctx.abort.reason(),
        SendError::Remote { kind, message } => {
            ctx.abort.set(Reason {
                kind: *kind,
                message: message.clone(),
                from_peer: true,
            });
            None
        }
        e => {
            let reason = Reason {
                kind: e.kind(),
                message: anyhow_chain(e),
                from_peer: false,
            };
            ctx.abort.set(reason.clone());
            Some(reason)
        }
    };
    if let Some(r) = reason.filter(|r| !r.from_peer) {
        tell_peer(writer, r.kind, &r.message).await;
    }
    e
}

async fn offer_task(
    ctx: Arc<Ctx>,
    out: mpsc::Sender<Message>,
    pending: mpsc::Sender<(u64, Vec<pb::Entry>)>,
) -> Result<(), SendError> {
    loop {
        let group = { ctx.work.lock().await.recv().await };
        let Some(entries) = group else {
            return Ok(());
        };
        let offer_id = ctx.next_offer.fetch_add(1, Ordering::Relaxed);
        // The window: at most OFFER_WINDOW offers wait for their Want.
        pending
            .send((offer_id, entries.clone()))
            .await
            .map_err(|_| SendError::Channel)?;
        out.send(Message::Offer(pb::Offer { offer_id, entries }))
            .await
            .map_err(|_| SendError::Channel)?;
    }
}

/// Blocks of one file announced in one BlockAnnounce or ResumeCheck, waiting for the
/// receiver's NeedBlocks.
struct Announced {
    file_id: u64,
    file: Arc<std::fs::File>,
    path: Arc<PathBuf>,
    size: u64,
    indexes: Vec<u64>,
    digest: Option<Arc<FileDigest>>,
}

/// Reads this stream's replies in order: a Want for each Offer, a NeedBlocks for each
/// BlockAnnounce. Ends when every offer is answered and no announce is outstanding.
async fn answer_task<S>(
    ctx: Arc<Ctx>,
    reader: &mut Reader<S>,
    out: mpsc::Sender<Message>,
    mut pending: mpsc::Receiver<(u64, Vec<pb::Entry>)>,
    block_tx: mpsc::Sender<BlockJob>,
    dedup: Option<Arc<DedupSender>>,
) -> Result<(), SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let stream = reader.stream();
    let mut expected: VecDeque<(u64, Vec<pb::Entry>)> = VecDeque::new();
    let mut announced: VecDeque<Announced> = VecDeque::new();
    let mut offers_open = true;
    let mut last_work = 0;
    loop {
        if expected.is_empty() && announced.is_empty() {
            match pending.recv().await {
                Some(o) => expected.push_back(o),
                None => break,
            }
        }
        let msg = next_reply(reader, ctx.progress_timeout, &mut last_work).await?;
        match msg {
            Message::Want(want) => {
                if expected.is_empty() && offers_open {
                    // Offers are queued before they are written, so this one is there already.
                    match pending.recv().await {
                        Some(o) => expected.push_back(o),
                        None => offers_open = false,
                    }
                }
                let Some((offer_id, entries)) = expected.pop_front() else {
                    return Err(SendError::Unexpected {
                        stream,
                        kind: FrameType::Want,
                        expected: "NeedBlocks",
                    });
                };
                if want.offer_id != offer_id {
                    return Err(SendError::WantMismatch {
                        got: want.offer_id,
                        expected: offer_id,
                    });
                }
                handle_want(
                    &ctx,
                    &out,
                    &block_tx,
                    dedup.as_ref(),
                    offer_id,
                    entries,
                    want,
                    &mut announced,
                )
                .await?;
            }
            Message::NeedBlocks(nb) => {
                let Some(a) = announced.pop_front() else {
                    return Err(SendError::Unexpected {
                        stream,
                        kind: FrameType::NeedBlocks,
                        expected: "Want",
                    });
                };
                if nb.file_id != a.file_id {
                    return Err(SendError::Peer(format!(
                        "NeedBlocks for file id {}, expected {}",
                        nb.file_id, a.file_id
                    )));
                }
                for (i, &index) in a.indexes.iter().enumerate() {
                    let len = block_len(a.size, index);
                    if Bitmap::get(&nb.need_blocks, i as u64) {
                        let job = BlockJob {
                            file_id: a.file_id,
                            file: a.file.clone(),
                            path: a.path.clone(),
                            index,
                            len,
                            digest: a.digest.clone(),
                        };
                        block_tx.send(job).await.map_err(|_| SendError::Channel)?;
                    } else {
                        // Taken from the receiver's block store, or confirmed as resumed.
                        ctx.progress.add(&ctx.progress.bytes_done, len);
                    }
                }
            }
            Message::Error(e) => {
                return Err(SendError::Remote {
                    kind: ErrorKind::from_pb(e.kind),
                    message: super::escape_text(&e.message),
                });
            }
            other => {
                return Err(SendError::Unexpected {
                    stream,
                    kind: other.frame_type(),
                    expected: "Want or NeedBlocks",
                });
            }
        }
    }
    Ok(())
}

/// Acts on one Want: small files go out in batches; wanted blocks of large files are queued for
/// the block tasks, except full blocks under dedup, which are announced first.
#[allow(clippy::too_many_arguments)]
async fn handle_want(
    ctx: &Arc<Ctx>,
    out: &mpsc::Sender<Message>,
    block_tx: &mpsc::Sender<BlockJob>,
    dedup: Option<&Arc<DedupSender>>,
    offer_id: u64,
    entries: Vec<pb::Entry>,
    want: pb::Want,
    announced: &mut VecDeque<Announced>,
) -> Result<(), SendError> {
    if want.entries.len() != entries.len() {
        return Err(SendError::Peer(format!(
            "answer to offer {offer_id} has {} entries, the offer had {}",
            want.entries.len(),
            entries.len()
        )));
    }
    let mut small = Vec::new();
    // Files the receiver did not ask for are still part of the digest: read them off the
    // critical path.
    let mut unchanged = UnchangedFiles::default();
    for (e, w) in entries.into_iter().zip(want.entries) {
        if e.kind != pb::EntryKind::File as i32 {
            continue;
        }
        if w.skip {
            if !ctx.content_in_scan && !ctx.dry_run {
                unchanged.push(ctx, e).await?;
            }
            continue;
        }
        if ctx.dry_run {
            return Err(SendError::Peer(format!(
                "the receiver asked for the data of {} in a dry run",
                scan::source_path(&ctx.root, &e.path).display()
            )));
        }
        changes::report_sent(&e.path);
        if e.size <= SMALL_FILE_MAX {
            small.push((w.file_id, e));
            continue;
        }
        let path = Arc::new(scan::source_path(&ctx.root, &e.path));
        let nblocks = e.size.div_ceil(BLOCK_SIZE as u64);
        let need = BlockSet::from_want(&w.need_blocks, &w.need_ranges, nblocks).map_err(|err| {
            SendError::Peer(format!(
                "answer to offer {offer_id} for {}: {err}",
                path.display()
            ))
        })?;
        let file = {
            let (c, rel) = (ctx.clone(), e.path.clone());
            let opened = tokio::task::spawn_blocking(move || open_beneath(&c.src, &rel)).await?;
            Arc::new(opened.map_err(|source| SendError::Read {
                path: path.to_path_buf(),
                source,
            })?)
        };
        let fd = (!ctx.content_in_scan).then(|| FileDigest::new(&e));
        let mut to_announce = Vec::new();
        for index in need.iter() {
            let len = block_len(e.size, index);
            if dedup.is_some() && len == BLOCK_SIZE as u64 {
                to_announce.push(index);
                continue;
            }
            let job = BlockJob {
                file_id: w.file_id,
                file: file.clone(),
                path: path.clone(),
                index,
                len,
                digest: fd.clone(),
            };
            block_tx.send(job).await.map_err(|_| SendError::Channel)?;
        }
        // Blocks the receiver holds from an earlier run.
        let resumed: Vec<u64> = need.complement(nblocks).iter().collect();
        if ctx.resume_check && !resumed.is_empty() {
            // It keeps them only if they match the source: send our hashes (they also feed
            // the digest). Those that differ come back in its NeedBlocks and are sent.
            for chunk in resumed.chunks(RESUME_CHUNK) {
                let (f, p, c) = (file.clone(), path.clone(), chunk.to_vec());
                let size = e.size;
                let hashes =
                    tokio::task::spawn_blocking(move || hash_blocks(&f, &p, size, &c)).await??;
                // Work the receiver sees in our Busy frames while we hash.
                let hashed: u64 = chunk.iter().map(|&i| block_len(e.size, i)).sum();
                ctx.progress.add(&ctx.progress.hashed_bytes, hashed);
                if let Some(fd) = &fd {
                    for (&index, hash) in chunk.iter().zip(&hashes) {
                        ctx.block_digested(fd, index, *hash);
                    }
                }
                announced.push_back(Announced {
                    file_id: w.file_id,
                    file: file.clone(),
                    path: path.clone(),
                    size: e.size,
                    indexes: chunk.to_vec(),
                    digest: fd.clone(),
                });
                let check = pb::ResumeCheck {
                    file_id: w.file_id,
                    indexes: chunk.to_vec(),
                    hashes: hashes.iter().map(|h| h.to_vec()).collect(),
                };
                out.send(Message::ResumeCheck(check))
                    .await
                    .map_err(|_| SendError::Channel)?;
            }
        } else if let Some(fd) = &fd
            && !resumed.is_empty()
        {
            let (c, fd, f, p) = (ctx.clone(), fd.clone(), file.clone(), path.clone());
            ctx.pool
                .submit(move || hash_source_blocks(&c, &fd, &f, &p, &resumed))
                .await?;
        }
        if let Some(dedup) = dedup {
            for chunk in to_announce.chunks(ANNOUNCE_CHUNK) {
                let (f, p, d, c) = (file.clone(), path.clone(), dedup.clone(), chunk.to_vec());
                let AnnounceChunk {
                    msg,
                    indexes,
                    zeros,
                    hashes,
                } = tokio::task::spawn_blocking(move || build_announce(&f, &p, &d, w.file_id, c))
                    .await??;
                if let Some(fd) = &fd {
                    for (index, hash) in hashes {
                        ctx.block_digested(fd, index, hash);
                    }
                }
                // All-zero blocks cost nothing on the wire: send them, do not announce them.
                for index in zeros {
                    let job = BlockJob {
                        file_id: w.file_id,
                        file: file.clone(),
                        path: path.clone(),
                        index,
                        len: BLOCK_SIZE as u64,
                        digest: fd.clone(),
                    };
                    block_tx.send(job).await.map_err(|_| SendError::Channel)?;
                }
                if let Some(msg) = msg {
                    announced.push_back(Announced {
                        file_id: w.file_id,
                        file: file.clone(),
                        path: path.clone(),
                        size: e.size,
                        indexes,
                        digest: fd.clone(),
                    });
                    out.send(msg).await.map_err(|_| SendError::Channel)?;
                }
            }
        }
    }
    unchanged.flush(ctx).await?;
    if !small.is_empty() {
        let c = ctx.clone();
        let batches = tokio::task::spawn_blocking(move || build_batches(&c, small)).await??;
        for b in batches {
            out.send(b).await.map_err(|_| SendError::Channel)?;
        }
    }
    Ok(())
}

/// One chunk of a file's full blocks, read and hashed for announcing.
struct AnnounceChunk {
    /// None if every block was all zeros.
    msg: Option<Message>,
    indexes: Vec<u64>,
    /// All-zero blocks: sent as (free) Block frames instead of announced.
    zeros: Vec<u64>,
    /// (index, BLAKE3) of the announced blocks, for the digest.
    hashes: Vec<(u64, Hash)>,
}

/// Reads the given full blocks and builds their BlockAnnounce (hash and proof of possession
/// each).
fn build_announce(
    f: &std::fs::File,
    path: &Path,
    dedup: &DedupSender,
    file_id: u64,
    indexes: Vec<u64>,
) -> Result<AnnounceChunk, SendError> {
    let rerr = |source| SendError::Read {
        path: path.to_owned(),
        source,
    };
    // Read, hash and prove on every core: None marks an all-zero block.
    let parts = crate::cas::dedup::par_chunks(&indexes, |part| {
        let mut buf = vec![0u8; BLOCK_SIZE];
        let mut out = Vec::with_capacity(part.len());
        for &index in part {
            if digest::is_hole(f, index * BLOCK_SIZE as u64, BLOCK_SIZE as u64) {
                out.push((index, None));
                continue;
            }
            f.read_exact_at(&mut buf, index * BLOCK_SIZE as u64)
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        SendError::Changed(path.to_owned())
                    } else {
                        rerr(e)
                    }
                })?;
            out.push((
                index,
                (!crate::tree::data::is_zero(&buf)).then(|| dedup.announce(index, &buf)),
            ));
        }
        Ok::<_, SendError>(out)
    });
    let mut msg = pb::BlockAnnounce {
        file_id,
        ..Default::default()
    };
    let mut zeros = Vec::new();
    let mut hashes = Vec::new();
    for part in parts {
        for (index, a) in part? {
            match a {
                None => zeros.push(index),
                Some(a) => {
                    hashes.push((index, *a.hash.as_bytes()));
                    msg.indexes.push(index);
                    msg.hashes.push(a.hash.as_bytes().to_vec());
                    msg.proofs.push(a.proof.0.to_vec());
                }
            }
        }
    }
    if msg.indexes.is_empty() {
        return Ok(AnnounceChunk {
            msg: None,
            indexes: Vec::new(),
            zeros,
            hashes,
        });
    }
    Ok(AnnounceChunk {
        indexes: msg.indexes.clone(),
        msg: Some(Message::BlockAnnounce(msg)),
        zeros,
        hashes,
    })
}

/// Source files the receiver skipped, queued for the digest readers: small ones in groups, each
/// large one on its own (so several are read at once).
#[derive(Default)]
struct UnchangedFiles {
    small: Vec<pb::Entry>,
    small_bytes: u64,
}

impl UnchangedFiles {
    async fn push(&mut self, ctx: &Arc<Ctx>, e: pb::Entry) -> Result<(), SendError> {
        if e.size > SMALL_FILE_MAX {
            let fd = FileDigest::new(&e);
            let path = scan::source_path(&ctx.root, &e.path);
            let all: Vec<u64> = (0..e.size.div_ceil(BLOCK_SIZE as u64)).collect();
            let c = ctx.clone();
            ctx.pool
                .submit(move || {
                    let f = open_beneath(&c.src, &fd.entry.path)
                        .map_err(|err| HashError::new(path.display().to_string(), err))?;
                    hash_source_blocks(&c, &fd, &f, &path, &all)
                })
                .await?;
            return Ok(());
        }
        self.small_bytes += e.size;
        self.small.push(digest_entry(&e));
        if self.small.len() >= 1024 || self.small_bytes >= BATCH_BYTES as u64 {
            self.flush(ctx).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, ctx: &Arc<Ctx>) -> Result<(), SendError> {
        if self.small.is_empty() {
            return Ok(());
        }
        let files = std::mem::take(&mut self.small);
        self.small_bytes = 0;
        let c = ctx.clone();
        ctx.pool
            .submit(move || hash_small_sources(&c, files))
            .await?;
        Ok(())
    }
}

fn changed_size() -> std::io::Error {
    std::io::Error::other("it changed size during the transfer")
}

/// Reads and hashes blocks of a source file for the digest only (the receiver had them).
fn hash_source_blocks(
    ctx: &Ctx,
    fd: &FileDigest,
    f: &std::fs::File,
    path: &Path,
    indexes: &[u64],
) -> Result<(), HashError> {
    let shown = || path.display().to_string();
    let mut buf = Vec::new();
    for &index in indexes {
        let hash = digest::hash_block_at(f, fd.entry.size, index, &mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                HashError::new(shown(), changed_size())
            } else {
                HashError::new(shown(), e)
            }
        })?;
        ctx.block_digested(fd, index, hash);
        ctx.progress
            .add(&ctx.progress.hashed_bytes, block_len(fd.entry.size, index));
    }
    Ok(())
}

/// Reads and hashes small source files for the digest only (the receiver had them).
fn hash_small_sources(ctx: &Ctx, files: Vec<pb::Entry>) -> Result<(), HashError> {
    let mut dirs = SourceDirs::new(&ctx.src);
    let mut data = Vec::with_capacity(SMALL_FILE_MAX as usize + 1);
    for e in files {
        let shown = || scan::source_path(&ctx.root, &e.path).display().to_string();
        let f = dirs
            .open(&e.path)
            .map_err(|err| HashError::new(shown(), err))?;
        data.clear();
        if !read_small_into(&f, e.size, &mut data).map_err(|err| HashError::new(shown(), err))? {
            return Err(HashError::new(shown(), changed_size()));
        }
        let hash = blake3::hash(&data);
        ctx.progress.add(&ctx.progress.hashed_bytes, e.size);
        ctx.file_digested(&e, &digest::content_hash_single(e.size, hash.as_bytes()));
    }
    Ok(())
}

/// Opens a source file beneath the root handle: no symlink is followed on the way (a directory
/// swapped for a symlink after the walk fails the open), and only a regular file is read.
fn open_beneath(src: &DirFd, rel: &[u8]) -> std::io::Result<std::fs::File> {
    let f = SourceDirs::new(src).open(rel)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file any more"));
    }
    Ok(f)
}

/// BLAKE3 of the given blocks of a source file, read from its handle (on every core).
fn hash_blocks(
    f: &std::fs::File,
    path: &Path,
    size: u64,
    indexes: &[u64],
) -> Result<Vec<Hash>, SendError> {
    let parts = crate::cas::dedup::par_chunks(indexes, |part| {
        let mut buf = Vec::new();
        part.iter()
            .map(|&index| {
                digest::hash_block_at(f, size, index, &mut buf).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        SendError::Changed(path.to_owned())
                    } else {
                        SendError::Read {
                            path: path.to_owned(),
                            source: e,
                        }
                    }
                })
            })
            .collect::<Result<Vec<Hash>, SendError>>()
    });
    let mut out = Vec::with_capacity(indexes.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Reads wanted small files and packs them into Batch frames of about 4 MiB.
fn build_batches(ctx: &Ctx, files: Vec<(u64, pb::Entry)>) -> Result<Vec<Message>, SendError> {
    let mut out = Vec::new();
    let mut header = pb::BatchHeader::default();
    // Files are read straight into the frame's buffer, sized once for a whole batch (no copy per
    // file, no regrowth).
    let batch_buffer = || Vec::with_capacity(BATCH_BYTES + SMALL_FILE_MAX as usize + 1);
    let mut data = batch_buffer();
    let mut dirs = SourceDirs::new(&ctx.src);
    for (file_id, e) in files {
        let rerr = |source| SendError::Read {
            path: scan::source_path(&ctx.root, &e.path),
            source,
        };
        let f = dirs.open(&e.path).map_err(rerr)?;
        let start = data.len();
        if !read_small_into(&f, e.size, &mut data).map_err(rerr)? {
            return Err(SendError::Changed(scan::source_path(&ctx.root, &e.path)));
        }
        let hash = blake3::hash(&data[start..]);
        if !ctx.content_in_scan {
            ctx.file_digested(&e, &digest::content_hash_single(e.size, hash.as_bytes()));
        }
        let codec_id = match ctx.policy.compress(&data[start..]) {
            Some((codec_id, packed)) => {
                data.truncate(start);
                data.extend_from_slice(&packed);
                codec_id
            }
            None => codec::RAW,
        };
        header.files.push(pb::BatchFile {
            file_id,
            raw_len: e.size as u32,
            stored_len: (data.len() - start) as u32,
            codec: codec_id,
            hash: hash.as_bytes().to_vec(),
        });
        if data.len() >= BATCH_BYTES || header.files.len() >= 4096 {
            out.push(Message::Batch {
                header: std::mem::take(&mut header),
                data: Bytes::from(std::mem::replace(&mut data, batch_buffer())),
            });
        }
    }
    if !header.files.is_empty() {
        out.push(Message::Batch {
            header,
            data: Bytes::from(data),
        });
    }
    Ok(out)
}

/// Opens source files relative to their directory's handle; the files of a batch share a few
/// directories, so each is resolved beneath the source root once, not once per file.
struct SourceDirs<'a> {
    root: &'a DirFd,
    last: Option<(Vec<u8>, DirFd)>,
}

impl<'a> SourceDirs<'a> {
    fn new(root: &'a DirFd) -> Self {
        Self { root, last: None }
    }

    fn open(&mut self, path: &[u8]) -> std::io::Result<std::fs::File> {
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(cut) => (Some(&path[..cut]), &path[cut + 1..]),
            None => (None, path),
        };
        let Some(parent) = parent else {
            return scan::open_in(self.root, name);
        };
        let dir = match &self.last {
            Some((p, dir)) if p.as_slice() == parent => dir.clone(),
            _ => {
                let rel = RelPath::parse(parent)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                // The walk never follows symlinks; neither does this (RESOLVE_NO_SYMLINKS).
                let dir: DirFd =
                    Arc::new(open_dir_beneath(self.root.as_fd(), &rel, Resolve::Auto)?);
                self.last = Some((parent.to_vec(), dir.clone()));
                dir
            }
        };
        scan::open_in(&dir, name)
    }
}

/// Appends a small file the walk saw with `size` bytes to `data`, in one `read` when it still has
/// that size (reading into spare capacity: no zeroing); false, with `data` unchanged, when its
/// size changed.
fn read_small_into(f: &std::fs::File, size: u64, data: &mut Vec<u8>) -> std::io::Result<bool> {
    let size = size as usize;
    let start = data.len();
    // At least one spare byte shows growth without a second, probing read.
    data.reserve(size + 1);
    // At least one read, so an empty file that grew is noticed too.
    loop {
        match rustix::io::read(f, rustix::buffer::spare_capacity(data)) {
            Ok(0) => break,
            Ok(_) if data.len() - start >= size => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                data.truncate(start);
                return Err(e.into());
            }
        }
    }
    if data.len() - start != size {
        data.truncate(start);
        return Ok(false);
    }
    Ok(true)
}

async fn block_task(ctx: Arc<Ctx>, out: mpsc::Sender<Message>) -> Result<(), SendError> {
    loop {
        let job = { ctx.blocks.lock().await.recv().await };
        let Some(job) = job else {
            return Ok(());
        };
        let c = ctx.clone();
        let msg = tokio::task::spawn_blocking(move || read_block(&c, job)).await??;
        out.send(msg).await.map_err(|_| SendError::Channel)?;
    }
}

fn read_block(ctx: &Ctx, job: BlockJob) -> Result<Message, SendError> {
    let path: &Path = &job.path;
    let rerr = |source| SendError::Read {
        path: path.to_owned(),
        source,
    };
    let len = job.len as usize;
    let off = job.index * BLOCK_SIZE as u64;
    // A hole of a sparse file: zeros, neither read nor hashed.
    if len == BLOCK_SIZE && digest::is_hole(&job.file, off, job.len) {
        let hash = crate::wire::zero_block_hash();
        if let Some(fd) = &job.digest {
            ctx.block_digested(fd, job.index, hash);
        }
        return Ok(Message::Block {
            header: pb::BlockHeader {
                file_id: job.file_id,
                index: job.index,
                raw_len: job.len as u32,
                codec: codec::ZERO,
                hash: hash.to_vec(),
            },
            data: Bytes::new(),
        });
    }
    // A block that is partly a hole: only its data ranges are read, the rest stays zeros.
    if let Some(ranges) = partial_data_ranges(&job.file, off, job.len) {
        let mut buf = vec![0u8; len];
        for (start, end) in ranges {
            let at = (start - off) as usize..(end - off) as usize;
            job.file
                .read_exact_at(&mut buf[at], start)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => SendError::Changed(path.to_owned()),
                    _ => rerr(e),
                })?;
        }
        // A file cut short since the walk would read as a zero tail here, not as a short read.
        if job.file.metadata().map_err(rerr)?.len() < off + job.len {
            return Err(SendError::Changed(path.to_owned()));
        }
        return Ok(block_message(ctx, &job, buf));
    }
    // pread into spare capacity: no zeroing of a fresh 4 MiB buffer per block, no reopen.
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let at = off + buf.len() as u64;
        match rustix::io::pread(&*job.file, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(rerr(e.into())),
        }
    }
    // Capacity may exceed the block: bytes past it belong to the next block.
    buf.truncate(len);
    if buf.len() != len {
        return Err(SendError::Changed(path.to_owned()));
    }
    Ok(block_message(ctx, &job, buf))
}

/// The data ranges (`SEEK_DATA`/`SEEK_HOLE`) of `[off, off+len)` when the range is partly a
/// hole; `None` when it is all data or the filesystem cannot tell (then the whole is read).
fn partial_data_ranges(f: &std::fs::File, off: u64, len: u64) -> Option<Vec<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    // A file with as many bytes allocated as its size has no holes. Asked anyway, SEEK_HOLE
    // walks to the end of the data (on tmpfs page by page): per block of a dense 1 GiB file
    // that made sending 1.7x slower.
    let st = rustix::fs::fstat(f).ok()?;
    if (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64 {
        return None;
    }
    let end = off + len;
    let mut ranges = Vec::new();
    let mut pos = off;
    while pos < end {
        let data = match seek(f, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data past `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(_) => return None,
        };
        if data >= end {
            break;
        }
        let hole = seek(f, SeekFrom::Hole(data)).ok()?.min(end);
        if hole <= data {
            return None;
        }
        ranges.push((data, hole));
        pos = hole;
    }
    if ranges.as_slice() == [(off, end)] {
        return None;
    }
    Some(ranges)
}

/// The Block frame of a block read in full into `buf`.
fn block_message(ctx: &Ctx, job: &BlockJob, buf: Vec<u8>) -> Message {
    let hash = blake3::hash(&buf);
    if let Some(fd) = &job.digest {
        ctx.block_digested(fd, job.index, *hash.as_bytes());
    }
    let (codec_id, data) = if crate::tree::data::is_zero(&buf) {
        (codec::ZERO, Bytes::new())
    } else {
        match ctx.policy.compress(&buf) {
            Some((c, enc)) => (c, Bytes::from(enc)),
            None => (codec::RAW, Bytes::from(buf)),
        }
    };
    Message::Block {
        header: pb::BlockHeader {
            file_id: job.file_id,
            index: job.index,
            raw_len: job.len as u32,
            codec: codec_id,
            hash: hash.as_bytes().to_vec(),
        },
        data,
    }
}

async fn writer_task<S>(
    ctx: Arc<Ctx>,
    writer: &mut Writer<S>,
    mut rx: mpsc::Receiver<Message>,
) -> Result<(), SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    loop {
        let msg = match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(_) => {
                // Nothing to send: say we are alive and, with the progress capability, how much
                // work (reading, hashing, listing) we did, so a sender busy hashing is not taken
                // for a stalled one.
                let alive = if ctx.busy {
                    Message::Busy(pb::Busy {
                        work: ctx.progress.work(),
                    })
                } else {
                    Message::Keepalive
                };
                writer.send(&alive).await?;
                writer.flush().await?;
                continue;
            }
        };
        let len = frame_len(&msg);
        let t = Instant::now();
        if let Some(l) = &ctx.limiter {
            l.take(len).await;
        }
        writer.send(&msg).await?;
        // Counted once handed to the socket, behind the bandwidth limiter: the bar follows what
        // left, not what was read ahead into the queue.
        ctx.progress.add(&ctx.progress.bytes_done, raw_len(&msg));
        if rx.is_empty() {
            writer.flush().await?;
        }
        ctx.policy
            .note_write(len as u64, t.elapsed().as_nanos() as u64);
    }
    writer.send(&Message::Done(pb::Done::default())).await?;
    writer.flush().await?;
    Ok(())
}

/// The file bytes a data frame stands for (before compression).
fn raw_len(m: &Message) -> u64 {
    match m {
        Message::Block { header, .. } => u64::from(header.raw_len),
        Message::Batch { header, .. } => header.files.iter().map(|f| u64::from(f.raw_len)).sum(),
        _ => 0,
    }
}

fn frame_len(m: &Message) -> usize {
    match m {
        Message::Block { data, .. } | Message::Batch { data, .. } => data.len() + 128,
        _ => 64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receivers_digest_must_match_ours() {
        let ours = [1u8; 32];
        assert!(check_peer_digest(&ours, &ours).is_ok());
        let err = check_peer_digest(&ours, &[2u8; 32]).expect_err("mismatch");
        assert!(matches!(err, SendError::DigestMismatch { .. }));
        let msg = err.to_string();
        assert!(msg.contains(&digest::hex(&ours)), "{msg}");
        assert!(msg.contains(&digest::hex(&[2u8; 32])), "{msg}");
        assert!(matches!(
            check_peer_digest(&ours, &[]),
            Err(SendError::NoPeerDigest)
        ));
        assert!(matches!(
            check_peer_digest(&ours, &[1u8; 31]),
            Err(SendError::BadPeerDigest(31))
        ));
    }

    #[test]
    fn small_reads_notice_a_size_change_either_way() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("f");
        std::fs::write(&path, b"0123456789").expect("write");
        let open = || std::fs::File::open(&path).expect("open");
        let mut data = b"head".to_vec();
        assert!(read_small_into(&open(), 10, &mut data).expect("read"));
        assert_eq!(data, b"head0123456789");
        for (size, why) in [
            (9, "file grew"),
            (11, "file shrank"),
            (0, "empty file grew"),
        ] {
            let mut data = b"head".to_vec();
            assert!(
                !read_small_into(&open(), size, &mut data).expect("read"),
                "{why}"
            );
            assert_eq!(data, b"head", "{why}: partial content kept");
        }
    }

    #[test]
    fn source_files_open_beneath_the_root_without_following_symlinks() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"s").expect("write");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        std::fs::write(tmp.path().join("a/b/f"), b"x").expect("write");
        std::fs::write(tmp.path().join("top"), b"t").expect("write");
        // A directory swapped for a symlink after the walk must not redirect the read.
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("a/link")).expect("symlink");
        std::os::unix::fs::symlink("b/f", tmp.path().join("a/leaf")).expect("symlink");
        let root: DirFd = Arc::new(std::fs::File::open(tmp.path()).expect("root").into());
        let mut dirs = SourceDirs::new(&root);
        let read = |f: std::fs::File| {
            let mut data = Vec::new();
            assert!(read_small_into(&f, 1, &mut data).expect("read"));
            data
        };
        assert_eq!(read(dirs.open(b"a/b/f").expect("open")), b"x");
        assert_eq!(read(dirs.open(b"top").expect("open")), b"t");
        assert_eq!(read(dirs.open(b"a/b/f").expect("open again")), b"x");
        assert!(
            dirs.open(b"a/link/secret").is_err(),
            "followed a symlinked directory"
        );
        assert!(
            dirs.open(b"a/leaf").is_err(),
            "followed a symlink at the leaf"
        );
        assert!(dirs.open(b"../x").is_err(), "left the root");
    }
}
