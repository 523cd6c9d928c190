//! The sender's driver: per stream an offer task, an answer task (the receiver's replies, checked
//! by [`Replies`]), block readers and a writer behind the bandwidth limiter; stream 0 then sends
//! hard links, directory metadata and Finish and reads the Summary.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc};

use crate::cas::dedup::DedupSender;
use crate::digest::{self, DirList, Hash, HashPool, LinkList, TreeBuilder};
use crate::limiter::Limiter;
use crate::progress::{Phase, Progress};
use crate::report::changes;
use crate::session::buffers::BufferPool;
use crate::session::compress::CodecPolicy;
use crate::session::framed::{FrameReader, FrameWriter, FramedError};
use crate::session::handshake::send_hello;
use crate::session::scan::{self};
use crate::session::{
    Abort, PEER_GRACE, SessionSummary, StreamFailure, error_chain, pending_peer_error, tell_peer,
};
use crate::session::{OFFER_WINDOW, SMALL_FILE_MAX};
use crate::wire::{BLOCK_SIZE, Message, PROTOCOL_VERSION, block_len, caps};

use super::effects::*;
use super::reply::next_reply;
use super::start_gate::Ticket;
use super::state::{Announced, ReceiverViolation, Replies, Wanted, plan_large};
use super::*;

type Reader<S> = FrameReader<ReadHalf<S>>;
type Writer<S> = FrameWriter<WriteHalf<S>>;

/// Runs a whole transfer over `streams` (already connected, e.g. TLS); stream i gets index i.
pub async fn send_session<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    progress: Arc<Progress>,
) -> Result<SessionSummary, SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    send_session_gated(cfg, streams, progress, None).await
}

/// [`send_session`] as one of several sessions of this sender: once greeted, it waits at the
/// gate of `ticket` for the others before it sends anything.
pub async fn send_session_gated<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    progress: Arc<Progress>,
    ticket: Option<Ticket>,
) -> Result<SessionSummary, SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let r = run(cfg, streams, progress.clone(), ticket).await;
    if let Some(shared) = &cfg.shared {
        shared.leave();
    }
    match &r {
        Ok(summary) => summary.set_outcome(&progress),
        Err(e) => {
            progress.set_failure(e.failure(), &error_chain(e));
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
    let message = error_chain(e);
    let tells = ends
        .iter_mut()
        .map(|(_, w)| tell_peer(w, e.failure(), &message));
    futures::future::join_all(tells).await;
}

/// One stream after its Hello: its two halves and, with dedup, the proofs keyed by its nonce.
type StreamHalves<S> = (Reader<S>, Writer<S>, Option<Arc<DedupSender>>);

async fn run<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    progress: Arc<Progress>,
    ticket: Option<Ticket>,
) -> Result<SessionSummary, SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let n = streams.len() as u32;
    let (halves, negotiated) = greet(cfg, streams, progress.wire_bytes.clone()).await?;
    if let Some(ticket) = ticket {
        ticket.pass_and_wait().await;
    }
    let started = Instant::now();
    progress.set_phase(Phase::Transferring);

    let (work_tx, work_rx) = mpsc::channel(2 * n as usize);
    let (block_tx, block_rx) = mpsc::channel(n as usize);
    // A single file is sent as its directory holding just that name.
    let (root_dir, only) = cfg.source_parts();
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
        blocking: crate::session::blocking::BlockingPool::for_streams(n),
        src: Arc::new(src.into()),
        single: only.clone().zip(cfg.source_file.clone()),
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
        tails: negotiated & caps::TAILS != 0,
        packs: negotiated & caps::PACKS != 0,
        busy: negotiated & caps::PROGRESS != 0,
        progress_timeout: cfg.timeouts.progress,
        dry_run: cfg.dry_run,
        batch_buffers: BufferPool::new(BATCH_BUFFER, n as usize + 2),
        block_buffers: BufferPool::new(BLOCK_SIZE, 2 * n as usize + 2),
        shared: cfg.shared.clone(),
        announced_bytes: AtomicU64::new(0),
    });
    let p = progress.clone();
    let filter = cfg.filter.clone();
    let xattrs = negotiated & caps::XATTRS != 0;
    let on_unreadable = cfg.on_unreadable;
    let walk_ctx = ctx.clone();
    let held = cfg.source_file.clone();
    // The walk lives as long as the session: a thread of its own (see `session::blocking`).
    let mut scanner = tokio::task::spawn_blocking(move || {
        let only = only.as_deref().map(|name| scan::Only {
            name,
            file: held.as_ref(),
        });
        let r = scan::scan(
            &root_dir,
            only,
            &filter,
            scan::Collect {
                checksum,
                xattrs,
                unreadable: on_unreadable,
            },
            work_tx,
            p,
            &tree,
        );
        // A walk that fails stops the streams now (each tells the receiver why), not once
        // they sent everything offered so far. `Closed` is a stream's failure, recorded there.
        if let Err(e) = &r
            && !matches!(e, scan::ScanError::Closed)
        {
            walk_ctx.abort.set_local(
                ferry_proto::kind::Failure::new(e.kind(), e.permanent()),
                error_chain(e),
            );
        }
        r
    });

    let (mut ends, failure) = run_streams(cfg, &ctx, halves, block_tx).await;
    if let Some(mut e) = failure {
        // Every stream stopped because another end of the session failed: the walk did. So
        // did a stream that lost its connection while the session's first failure was a local
        // one no stream reported: the receiver, told why by another stream, closed them all.
        let walk_failed_first = ctx
            .abort
            .reason()
            .is_some_and(|r| !r.from_peer && !r.failure.kind.is_transport());
        if (matches!(e, SendError::Aborted) || (e.kind().is_transport() && walk_failed_first))
            && let Ok(Ok(Err(walk))) = tokio::time::timeout(PEER_GRACE, &mut scanner).await
        {
            e = walk.into();
        }
        // Streams that had finished their data hear it too.
        tell_receiver(&mut ends, &e).await;
        return Err(e);
    }
    let tail = async {
        // The walk must have succeeded before we tell the receiver the tree is complete.
        let hardlinks = scanner.await??;
        let (reader, writer) = ends.first_mut().ok_or(SendError::Channel)?;
        if negotiated & caps::REFETCH != 0 {
            super::refetch::serve(cfg, &ctx, reader, writer).await?;
        }
        let (dirs, links) = finish(cfg, &ctx, reader, writer, hardlinks, negotiated).await?;
        let mut work = 0;
        let summary = match next_reply(reader, &ctx, &mut work).await {
            Ok(Message::Summary(s)) => s,
            Ok(Message::Error(e)) => return Err(SendError::from_peer(e)),
            Ok(other) => {
                return Err(ReceiverViolation::Unexpected {
                    stream: 0,
                    kind: other.frame_type(),
                    expected: "Summary",
                }
                .into());
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
    Ok(session_summary(
        &progress,
        &summary,
        hex,
        ctx.dry_run,
        n,
        started,
    ))
}

/// The capabilities this sender asks for.
fn wanted_caps(cfg: &SenderConfig) -> u64 {
    // Dedup, xattrs, refetch, tails and packs are always requested: a receiver grants them only
    // with a block store / when it keeps xattrs / in a fan-out.
    let mut want_caps = caps::ZSTD
        | caps::LZ4
        | caps::VERIFY
        | caps::DEDUP
        | caps::RESUME
        | caps::PROGRESS
        | caps::XATTRS
        | caps::REFETCH
        | caps::TAILS
        | caps::PACKS;
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
    want_caps
}

/// Greets every stream at once and agrees on the capabilities both ends have; refuses what a
/// receiver without them would get wrong.
async fn greet<S>(
    cfg: &SenderConfig,
    streams: Vec<S>,
    wire: Arc<AtomicU64>,
) -> Result<(Vec<StreamHalves<S>>, u64), SendError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let n = streams.len() as u32;
    let session_id: [u8; 16] = rand::random();
    let want_caps = wanted_caps(cfg);
    // Every stream greets at once: a receiver gives each connection one deadline for its TLS
    // handshake and Hello, so a Hello must not wait for the other streams' round trips.
    let hellos = streams.into_iter().enumerate().map(|(i, s)| {
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
        let wire = wire.clone();
        async move {
            let (r, w) = tokio::io::split(s);
            let mut reader =
                FrameReader::new(r, i as u32, cfg.timeouts.handshake, Default::default());
            let mut writer = FrameWriter::new(w, i as u32, cfg.timeouts.handshake, wire);
            let fut = send_hello(&mut reader, &mut writer, hello);
            let (got, nonce) = tokio::time::timeout(cfg.timeouts.handshake, fut)
                .await
                .map_err(|_| FramedError::IdleTimeout {
                    stream: i as u32,
                    secs: cfg.timeouts.handshake.as_secs(),
                })??;
            reader.set_stream(i as u32, cfg.timeouts.idle);
            writer.set_stream(i as u32, cfg.timeouts.idle);
            // Proofs on a stream are keyed by that stream's nonce.
            let dedup = nonce.map(|n| Arc::new(DedupSender::new(&n)));
            Ok::<_, SendError>((reader, writer, dedup, got))
        }
    });
    let mut halves = Vec::new();
    let mut negotiated = want_caps;
    for (reader, writer, dedup, got) in futures::future::try_join_all(hellos).await? {
        negotiated &= got;
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
    Ok((halves, negotiated))
}

/// Runs every stream to its end: one that fails stops the others (each tells the receiver
/// why), and the most telling failure is reported; a shutdown stops every stream the same way,
/// and is the reason reported.
async fn run_streams<S>(
    cfg: &SenderConfig,
    ctx: &Arc<Ctx>,
    halves: Vec<StreamHalves<S>>,
    block_tx: mpsc::Sender<BlockJob>,
) -> (Vec<(Reader<S>, Writer<S>)>, Option<SendError>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
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
    let all = futures::future::join_all(futs);
    tokio::pin!(all);
    let shutdown = async {
        let e = SendError::ShutDown(cfg.shutdown.wait().await);
        ctx.abort.set_local(e.failure(), e.to_string());
        e
    };
    let (results, mut failure) = tokio::select! {
        r = &mut all => (r, None),
        e = shutdown => (all.await, Some(e)),
    };
    let mut ends = Vec::new();
    for r in results {
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
    (ends, failure)
}

/// What the session did, as the receiver's Summary reports it, into `progress` and the result.
fn session_summary(
    progress: &Progress,
    summary: &pb::Summary,
    digest: String,
    dry_run: bool,
    streams: u32,
    started: Instant,
) -> SessionSummary {
    progress.files_done.store(summary.files, Ordering::Relaxed);
    progress.bytes_done.store(summary.bytes, Ordering::Relaxed);
    progress.skipped.store(summary.skipped, Ordering::Relaxed);
    progress
        .resumed_bytes
        .store(summary.resumed_bytes, Ordering::Relaxed);
    progress.failed.store(summary.failed, Ordering::Relaxed);
    let unreadable = progress.unreadable();
    SessionSummary {
        unreadable: unreadable.count,
        unreadable_paths: unreadable.paths,
        dry_run,
        files: summary.files,
        bytes: summary.bytes,
        wire_bytes: progress.wire_bytes.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        streams,
        skipped: summary.skipped,
        resumed_bytes: summary.resumed_bytes,
        dedup_blocks: summary.dedup_blocks,
        dedup_bytes: summary.dedup_bytes,
        deleted: summary.deleted,
        failed: summary.failed,
        digest,
        dropped_special_bits: summary.dropped_special_bits,
        dropped_xattrs: summary.dropped_xattrs,
        dropped_owners: summary.dropped_owners,
        // Shown to the user; a receiver is trusted with no more than a few lines of it.
        failures: summary
            .failures
            .iter()
            .take(crate::session::MAX_REPORTED_FAILURES)
            .map(|f| crate::session::escape_text(f))
            .collect(),
    }
}
/// The sender's digest once every file was hashed: the walk's tree, and the directory and hard
/// link lists as they were sent.
async fn sender_digest(ctx: &Arc<Ctx>, dirs: &Hash, links: &Hash) -> Result<Hash, SendError> {
    let pool = ctx.pool.clone();
    ctx.blocking.run(move || pool.finish()).await??;
    let root = ctx
        .tree
        .lock()
        .ok()
        .and_then(|t| t.root())
        .ok_or(SendError::DigestIncomplete)?;
    Ok(digest::transfer_digest(&root, dirs, links))
}

/// Compares the receiver's digest (from its Summary) with ours.
pub(super) fn check_peer_digest(ours: &Hash, theirs: &[u8]) -> Result<(), SendError> {
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
    let mut replies = Replies::new(0, ctx.dry_run);
    for chunk in hardlinks.chunks(crate::session::MAX_OFFER_ENTRIES) {
        let offer_id = ctx.next_offer.fetch_add(1, Ordering::Relaxed);
        replies.offered(offer_id, chunk.to_vec());
        writer
            .send(&Message::Offer(pb::Offer {
                offer_id,
                entries: chunk.to_vec(),
            }))
            .await?;
        writer.flush().await?;
        read_want(reader, &mut replies, ctx).await?;
    }
    let (tx, mut rx) = mpsc::channel(16);
    let root = cfg.root.clone();
    let with_names = cfg.delete && negotiated & caps::DELETE != 0;
    let xattrs = negotiated & caps::XATTRS != 0;
    let filter = cfg.filter.clone();
    let on_unreadable = cfg.on_unreadable;
    let single = cfg.source_parts().1.is_some();
    // As long as the directories take: a thread of its own (see `session::blocking`).
    let walker = tokio::task::spawn_blocking(move || {
        // A single file has no directory of its own to finish (nor siblings to delete).
        if single {
            return Ok(());
        }
        scan::walk_dirs(&root, &filter, with_names, xattrs, on_unreadable, tx)
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

/// The Want `replies` owes for the offer just sent (hard links: nothing more to send).
async fn read_want<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    replies: &mut Replies<()>,
    ctx: &Ctx,
) -> Result<(), SendError> {
    let mut work = 0;
    match next_reply(reader, ctx, &mut work).await? {
        Message::Want(w) => {
            replies.on_want(w)?;
            Ok(())
        }
        Message::Error(e) => Err(SendError::from_peer(e)),
        other => Err(replies.unexpected(other.frame_type()).into()),
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
            Some((failure, message)) => SendError::Remote {
                kind: failure.kind,
                permanent: failure.permanent,
                message,
            },
            None => e,
        }
    } else {
        e
    };
    let reason = ctx.abort.stream_failed(match &e {
        SendError::Aborted => StreamFailure::Aborted,
        e @ SendError::Remote { message, .. } => StreamFailure::Peer {
            failure: e.failure(),
            message,
        },
        e => StreamFailure::Local {
            failure: e.failure(),
            message: error_chain(e),
        },
    });
    if let Some(r) = reason {
        tell_peer(writer, r.failure, &r.message).await;
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

/// Reads this stream's replies in order: a Want for each Offer, a NeedBlocks for each
/// BlockAnnounce or ResumeCheck. Ends when every offer is answered and no announce is
/// outstanding.
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
    let mut replies: Replies<Owed> = Replies::new(reader.stream(), ctx.dry_run);
    let mut offers_open = true;
    let mut last_work = 0;
    loop {
        if replies.settled() {
            match pending.recv().await {
                Some((id, entries)) => replies.offered(id, entries),
                None => break,
            }
        }
        let msg = next_reply(reader, &ctx, &mut last_work).await?;
        match msg {
            Message::Want(want) => {
                if !replies.owes_want() && offers_open {
                    // Offers are queued before they are written, so this one is there already.
                    match pending.recv().await {
                        Some((id, entries)) => replies.offered(id, entries),
                        None => offers_open = false,
                    }
                }
                let wanted = replies.on_want(want)?;
                handle_want(&ctx, &out, &block_tx, dedup.as_ref(), wanted, &mut replies).await?;
            }
            Message::NeedBlocks(nb) => {
                let needed = replies.on_need_blocks(&nb)?;
                let a = needed.announced;
                match &a.file {
                    Owed::File(src) => {
                        for index in needed.send {
                            let job = src.job(a.file_id, index, block_len(a.size, index));
                            block_tx.send(job).await.map_err(|_| SendError::Channel)?;
                        }
                    }
                    // The pack goes on this stream, read again (its owner among the
                    // destinations asks for it, the others take it from that one's store).
                    Owed::Pack(spec) if !needed.send.is_empty() => {
                        let (c, spec) = (ctx.clone(), spec.clone());
                        let msg = ctx
                            .blocking
                            .run(move || super::packs::build_pack(&c, &spec))
                            .await??;
                        out.send(msg).await.map_err(|_| SendError::Channel)?;
                    }
                    Owed::Pack(_) => {}
                }
                // Taken from the receiver's block store, or confirmed as resumed.
                ctx.progress
                    .add(&ctx.progress.bytes_done, needed.taken_bytes);
            }
            Message::Error(e) => return Err(SendError::from_peer(e)),
            other => return Err(replies.unexpected(other.frame_type()).into()),
        }
    }
    Ok(())
}

/// Acts on one Want: small files go out in batches; of each large file, the blocks
/// [`plan_large`] puts on the wire are queued for the block tasks, full blocks under dedup are
/// announced first, and blocks the receiver holds are confirmed (or read for the digest).
async fn handle_want(
    ctx: &Arc<Ctx>,
    out: &mpsc::Sender<Message>,
    block_tx: &mpsc::Sender<BlockJob>,
    dedup: Option<&Arc<DedupSender>>,
    wanted: Vec<Wanted>,
    replies: &mut Replies<Owed>,
) -> Result<(), SendError> {
    let mut small = Vec::new();
    // A pack needs every small file of the offer: see `packs::makes_pack`.
    let mut small_unchanged = false;
    // Files the receiver did not ask for are still part of the digest: read them off the
    // critical path.
    let mut unchanged = UnchangedFiles::default();
    for w in wanted {
        let (file_id, e, need) = match w {
            Wanted::Unchanged(e) => {
                small_unchanged |= e.size <= SMALL_FILE_MAX;
                if !ctx.content_in_scan && !ctx.dry_run {
                    unchanged.push(ctx, e).await?;
                }
                continue;
            }
            Wanted::Small { file_id, entry } => {
                changes::report_sent(&entry.path);
                small.push((file_id, entry));
                continue;
            }
            Wanted::Large {
                file_id,
                entry,
                need,
            } => (file_id, entry, need),
        };
        changes::report_sent(&e.path);
        let path = Arc::new(scan::source_path(&ctx.root, &e.path));
        let file = {
            let (c, rel) = (ctx.clone(), e.path.clone());
            let opened = ctx.blocking.run(move || open_beneath(&c, &rel)).await?;
            Arc::new(opened.map_err(|source| SendError::Read {
                path: path.to_path_buf(),
                source,
            })?)
        };
        let src = Opened {
            file,
            path,
            digest: (!ctx.content_in_scan).then(|| FileDigest::new(&e)),
        };
        let plan = plan_large(e.size, &need, dedup.is_some(), ctx.tails);
        for index in plan.send.iter() {
            let job = src.job(file_id, index, block_len(e.size, index));
            block_tx.send(job).await.map_err(|_| SendError::Channel)?;
        }
        let held: Vec<u64> = plan.held.iter().collect();
        if ctx.resume_check && !held.is_empty() {
            // The receiver keeps them only if they match the source: send our hashes (they
            // also feed the digest). Those that differ come back in its NeedBlocks and are sent.
            for chunk in held.chunks(RESUME_CHUNK) {
                let (f, p, c) = (src.file.clone(), src.path.clone(), chunk.to_vec());
                let size = e.size;
                let hashes = ctx
                    .blocking
                    .run(move || hash_blocks(&f, &p, size, &c))
                    .await??;
                // Work the receiver sees in our Busy frames while we hash.
                let hashed: u64 = chunk.iter().map(|&i| block_len(e.size, i)).sum();
                ctx.progress.add(&ctx.progress.hashed_bytes, hashed);
                if let Some(fd) = &src.digest {
                    for (&index, hash) in chunk.iter().zip(&hashes) {
                        ctx.block_digested(fd, index, *hash);
                    }
                }
                replies.announced(Announced {
                    file_id,
                    size: e.size,
                    indexes: chunk.to_vec(),
                    file: Owed::File(src.clone()),
                });
                let check = pb::ResumeCheck {
                    file_id,
                    indexes: chunk.to_vec(),
                    hashes: hashes.iter().map(|h| h.to_vec()).collect(),
                };
                out.send(Message::ResumeCheck(check))
                    .await
                    .map_err(|_| SendError::Channel)?;
            }
        } else if let Some(fd) = &src.digest
            && !held.is_empty()
        {
            let (c, fd, f, p) = (ctx.clone(), fd.clone(), src.file.clone(), src.path.clone());
            ctx.pool
                .submit(move || hash_source_blocks(&c, &fd, &f, &p, &held))
                .await?;
        }
        if let Some(dedup) = dedup {
            let to_announce: Vec<u64> = plan.announce.iter().collect();
            for chunk in to_announce.chunks(ANNOUNCE_CHUNK) {
                let (f, p, d, c) = (
                    src.file.clone(),
                    src.path.clone(),
                    dedup.clone(),
                    chunk.to_vec(),
                );
                let size = e.size;
                let shared = ctx.shared.clone();
                let AnnounceChunk {
                    msg,
                    indexes,
                    zeros,
                    hashes,
                } = ctx
                    .blocking
                    .run(move || build_announce(&f, &p, &d, shared.as_deref(), (file_id, size), c))
                    .await??;
                if let Some(fd) = &src.digest {
                    for (index, hash) in hashes {
                        ctx.block_digested(fd, index, hash);
                    }
                }
                // All-zero blocks cost nothing on the wire: send them, do not announce them.
                for index in zeros {
                    let job = src.job(file_id, index, block_len(e.size, index));
                    block_tx.send(job).await.map_err(|_| SendError::Channel)?;
                }
                if let Some(msg) = msg {
                    let bytes: u64 = indexes.iter().map(|&i| block_len(e.size, i)).sum();
                    ctx.announced_bytes.fetch_add(bytes, Ordering::Relaxed);
                    replies.announced(Announced {
                        file_id,
                        size: e.size,
                        indexes,
                        file: Owed::File(src.clone()),
                    });
                    out.send(msg).await.map_err(|_| SendError::Channel)?;
                }
            }
        }
    }
    unchanged.flush(ctx).await?;
    if let Some(dedup) = dedup
        && ctx.packs
        && super::packs::makes_pack(&small, !small_unchanged)
    {
        let (c, d) = (ctx.clone(), dedup.clone());
        let (msg, spec) = ctx
            .blocking
            .run(move || super::packs::build_pack_announce(&c, &d, c.shared.as_deref(), small))
            .await??;
        ctx.announced_bytes.fetch_add(spec.len, Ordering::Relaxed);
        replies.announced(Announced {
            file_id: spec.pack_id,
            size: spec.len,
            indexes: vec![0],
            file: Owed::Pack(spec),
        });
        out.send(msg).await.map_err(|_| SendError::Channel)?;
    } else if !small.is_empty() {
        let c = ctx.clone();
        let batches = ctx.blocking.run(move || build_batches(&c, small)).await??;
        for b in batches {
            out.send(b).await.map_err(|_| SendError::Channel)?;
        }
    }
    Ok(())
}

async fn block_task(ctx: Arc<Ctx>, out: mpsc::Sender<Message>) -> Result<(), SendError> {
    loop {
        let job = { ctx.blocks.lock().await.recv().await };
        let Some(job) = job else {
            return Ok(());
        };
        let c = ctx.clone();
        let msg = ctx.blocking.run(move || read_block(&c, job)).await??;
        out.send(msg).await.map_err(|_| SendError::Channel)?;
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
        Message::Pack { header, .. } => u64::from(header.raw_len),
        _ => 0,
    }
}

fn frame_len(m: &Message) -> usize {
    match m {
        Message::Block { data, .. } | Message::Batch { data, .. } | Message::Pack { data, .. } => {
            data.len() + 128
        }
        _ => 64,
    }
}
