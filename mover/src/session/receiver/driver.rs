//! The receiver's driver: the async loop over a session's streams. It reads frames, asks each
//! stream's [`StreamRules`] whether the frame may come now, hands the work to the effects on
//! blocking threads, and writes the answers; the first failure stops every stream and is told to
//! the sender.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

use super::block_store::BlockDedup;
use super::effects::{self, Dropped, Scratch, Session};
use super::state::{Route, SenderViolation, StreamRules};
use super::{Accepted, ReceiveError, ReceiverConfig, failure_message, more_telling};
use crate::cas::dedup::DedupReceiver;
use crate::cas::pop::PopKey;
use crate::digest::{self, DirList, HashPool, LinkList, SortedTree};
use crate::node::client::NodeDedup;
use crate::progress::{Phase, Progress};
use crate::session::blocking::BlockingPool;
use crate::session::framed::{FrameReader, FrameWriter};
use crate::session::staging::StagingDir;
use crate::session::{
    Abort, DRAIN, PEER_GRACE, SessionSummary, StreamFailure, pending_peer_error, tell_peer,
};
use crate::tree::peer_dest::PeerDest;
use crate::tree::{Filter, Replace};
use crate::wire::{Message, caps};

/// Tells the sender on every stream why the session cannot run (before the streams run).
async fn tell_all<S>(streams: &mut [Accepted<S>], e: &ReceiveError, transfer_id: &str)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let message = failure_message(e, transfer_id);
    let tells = streams
        .iter_mut()
        .map(|s| tell_peer(&mut s.writer, e.failure(), &message));
    futures::future::join_all(tells).await;
}

/// Runs one session over its accepted streams (all with the same session id). On failure the
/// sender has been told why on every stream (unless it is the one that failed).
pub async fn receive_session<S>(
    cfg: &ReceiverConfig,
    streams: Vec<Accepted<S>>,
    progress: Arc<Progress>,
) -> Result<SessionSummary, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let r = run_session(cfg, streams, progress.clone()).await;
    if let Err(e) = &r {
        progress.set_failure(e.failure(), &failure_message(e, &cfg.transfer_id));
        progress.set_phase(Phase::Failed);
    }
    r
}

async fn run_session<S>(
    cfg: &ReceiverConfig,
    mut streams: Vec<Accepted<S>>,
    progress: Arc<Progress>,
) -> Result<SessionSummary, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let started = Instant::now();
    streams.sort_by_key(|a| a.hello.stream_index);
    let n = streams.len() as u32;
    // Large payloads of every stream come from one pool, so a buffer one stream freed fills
    // another stream's next frame.
    let payloads = crate::session::framed::payload_pool(streams.len());
    for s in &mut streams {
        s.reader.share_payloads(payloads.clone());
    }
    let (caps, protect) = match agree(&streams) {
        Ok(v) => v,
        Err(e) => {
            tell_all(&mut streams, &e, &cfg.transfer_id).await;
            return Err(e);
        }
    };
    let dry_run = caps & caps::DRY_RUN != 0;
    let blocking = BlockingPool::for_streams(n);
    let (dest, staging, dedup, scratch) = match open_destination(cfg, caps, &blocking).await {
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
    let shared = Arc::new(Session {
        blocking,
        dest,
        staging,
        caps,
        sync: cfg.sync,
        state: Mutex::new(Default::default()),
        progress: progress.clone(),
        // Fan-out needs the node service (fetched blocks are proven with this session's keys).
        fetches: cfg
            .swarm
            .clone()
            .filter(|_| matches!(dedup, Some(BlockDedup::Node(_))))
            .map(|p| {
                Arc::new(crate::node::swarm::Fetches::new(
                    p,
                    caps & caps::REFETCH != 0,
                ))
            }),
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
        clock: crate::session::ProgressClock::new(),
        busy: caps & caps::PROGRESS != 0,
        protect,
        dry_run,
        _scratch: scratch,
        keep: cfg.keep,
        dropped: Dropped::default(),
        xattr_held: Arc::new(AtomicU64::new(0)),
    });
    progress.set_phase(Phase::Transferring);

    match run_streams(cfg, &shared, streams, n).await {
        None => conclude(&shared, &progress, started, n).await,
        Some(e) => {
            shared.pool.cancel();
            Err(e)
        }
    }
}

/// What every stream's Hello must agree on (one session, its stream count, each stream's
/// place), the capabilities granted, and the rules of what a delete must leave alone.
fn agree<S>(streams: &[Accepted<S>]) -> Result<(u64, Filter), ReceiveError> {
    let n = streams.len() as u32;
    let first = streams
        .first()
        .ok_or(ReceiveError::Internal("a session without streams"))?;
    let (sid, caps) = (first.hello.session_id.clone(), first.caps);
    let protect = if caps & caps::FILTER != 0 {
        Filter::from_wire(&first.hello.filter_rules)
            .map_err(|e| ReceiveError::from(SenderViolation::FilterRules(e.to_string())))
    } else {
        Ok(Filter::default())
    };
    let protect = protect?;
    for (i, s) in streams.iter().enumerate() {
        if s.hello.session_id != sid
            || s.hello.stream_count != n
            || s.hello.stream_index != i as u32
        {
            return Err(ReceiveError::from(SenderViolation::StreamsDisagree {
                position: i as u32,
                count: n,
                index: s.hello.stream_index,
                announced: s.hello.stream_count,
            }));
        }
    }
    Ok((caps, protect))
}

/// The destination and its staging directory opened (in a scratch directory for a dry run),
/// and the block store this session deduplicates against, if any.
async fn open_destination(
    cfg: &ReceiverConfig,
    caps: u64,
    blocking: &BlockingPool,
) -> Result<(PeerDest, StagingDir, Option<BlockDedup>, Option<Scratch>), ReceiveError> {
    let root = cfg.root.clone();
    let tid = cfg.transfer_id.clone();
    let store = cfg.cas.clone().filter(|_| caps & caps::DEDUP != 0);
    let service = cfg
        .block_service
        .clone()
        .filter(|_| caps & caps::DEDUP != 0);
    // Only a sender that asked for --delete may have non-empty directories replaced.
    let replace = Replace::with_delete(caps & caps::DELETE != 0);
    let keep = cfg.keep;
    let dry_run = caps & caps::DRY_RUN != 0;
    blocking
        .run(move || {
            if dry_run {
                // Nothing may be created in the destination, not even the staging directory: a
                // missing root is planned as an empty one, staging lives in a scratch directory.
                let scratch = Scratch::create()?;
                let plan_root = if root.is_dir() {
                    root
                } else {
                    scratch.empty.clone()
                };
                let dest = PeerDest::open(&plan_root, replace, keep.special_bits)?;
                let staging_root = PeerDest::open(&scratch.staging, replace, false)?;
                let staging = StagingDir::open(&staging_root, &tid)?;
                return Ok::<_, ReceiveError>((dest, staging, None, Some(scratch)));
            }
            let dest = PeerDest::open(&root, replace, keep.special_bits)?;
            let staging = StagingDir::open(&dest, &tid)?;
            let dedup = match (store, service) {
                (Some(s), _) => Some(BlockDedup::Local(DedupReceiver::new(s, &tid)?)),
                (None, Some(c)) => Some(BlockDedup::Node(NodeDedup::new(c))),
                (None, None) => None,
            };
            Ok::<_, ReceiveError>((dest, staging, dedup, None))
        })
        .await
        .map_err(ReceiveError::from)
        .and_then(|r| r)
}

/// Runs every stream to its end: one that fails stops the others (each tells the sender why),
/// and the most telling failure is returned. A session whose sender makes no progress for the
/// progress timeout is stopped the same way, and so is one the process is asked to end.
async fn run_streams<S>(
    cfg: &ReceiverConfig,
    shared: &Arc<Session>,
    streams: Vec<Accepted<S>>,
    n: u32,
) -> Option<ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let done = Arc::new(tokio::sync::Semaphore::new(0));
    let mut futs = Vec::new();
    for s in streams {
        futs.push(run_stream(shared.clone(), s, done.clone(), n));
    }
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
                shared.abort.set_local(e.failure(), e.to_string());
                return e;
            }
        }
    };
    let shutdown = async {
        let e = ReceiveError::ShutDown(cfg.shutdown.wait().await);
        shared.abort.set_local(e.failure(), e.to_string());
        e
    };
    let (results, stalled) = tokio::select! {
        r = &mut all => (r, None),
        e = watchdog => (all.await, Some(e)),
        e = shutdown => (all.await, Some(e)),
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
    failure
}

/// A session whose streams all ended well: the block store's session finished, staging
/// removed, the root's own metadata applied, and the summary.
async fn conclude(
    shared: &Arc<Session>,
    progress: &Progress,
    started: Instant,
    n: u32,
) -> Result<SessionSummary, ReceiveError> {
    let sh = shared.clone();
    shared
        .blocking
        .run(move || {
            if let Some(d) = &sh.dedup {
                d.finish();
            }
            if sh.dry_run {
                return Ok(());
            }
            sh.staging.cleanup(&sh.dest);
            let meta = sh.root_meta.lock().ok().and_then(|m| *m);
            if let Some((mode, mtime)) = meta {
                match sh.dest.set_dir_meta(None, mode, mtime, None) {
                    // The destination directory itself often belongs to someone else
                    // (a volume's root is root's, a provisioner made it): its content
                    // is the copy, its own mode and mtime stay as the owner set them.
                    Err(e) if e.errno() == Some(libc::EPERM) => tracing::warn!(
                        "the destination directory is not the receiver's: its mode and mtime were left as they are ({e})"
                    ),
                    r => r?,
                }
            }
            Ok::<(), ReceiveError>(())
        })
        .await??;
    let p = progress.snapshot();
    let d = shared.store_counters();
    let summary = SessionSummary {
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
        // The sender's walk decides what it may not read; this end never hears of it.
        unreadable: 0,
        unreadable_paths: Vec::new(),
    };
    summary.set_outcome(progress);
    Ok(summary)
}

async fn run_stream<S>(
    shared: Arc<Session>,
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
    shared: &Session,
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
            Some((failure, message)) => ReceiveError::Remote {
                kind: failure.kind,
                message,
            },
            None => e,
        }
    } else {
        e
    };
    let reason = shared.abort.stream_failed(match &e {
        ReceiveError::Aborted => StreamFailure::Aborted,
        e @ ReceiveError::Remote { message, .. } => StreamFailure::Peer {
            failure: e.failure(),
            message,
        },
        e => StreamFailure::Local {
            failure: e.failure(),
            message: failure_message(e, &shared.transfer_id),
        },
    });
    if let Some(r) = reason {
        tell_peer(writer, r.failure, &r.message).await;
        // Read what the sender still had in flight, so closing does not reset the connection
        // under the Error frame.
        let _ = pending_peer_error(reader, DRAIN).await;
    }
    e
}

async fn stream_loop<R, W>(
    shared: &Arc<Session>,
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
    let mut rules = StreamRules::new(stream, key.is_some(), shared.caps & caps::RESUME != 0)
        .with_packs(shared.caps & caps::PACKS != 0);
    // Data frames go to a per-stream blocking worker through a 2-slot channel, so decrypting the
    // next frame overlaps with hashing and writing this one (memory: 3 frames).
    let (work_tx, mut work_rx) = tokio::sync::mpsc::channel::<Message>(2);
    // Lives as long as the stream, so it has a thread of its own (see `session::blocking`).
    let sh = shared.clone();
    let worker = tokio::task::spawn_blocking(move || {
        while let Some(m) = work_rx.blocking_recv() {
            match m {
                Message::Batch { header, data } => effects::handle_batch(&sh, header, &data)?,
                Message::Block { header, data } => effects::handle_block(&sh, &header, &data)?,
                Message::Pack { header, data } => super::packs::handle_pack(&sh, &header, &data)?,
                _ => {}
            }
        }
        Ok::<(), ReceiveError>(())
    });
    let (mut work_tx, mut worker) = (Some(work_tx), Some(worker));
    let (busy, sh) = (shared.busy, shared.clone());
    let work = move || sh.work();
    let r: Result<(), ReceiveError> = async {
        loop {
            let msg = tokio::select! {
                m = reader.expect() => m?,
                // The worker stops before Done only when a data frame failed validation or its
                // write: answer now, not when the sender's next frame (or the idle timeout)
                // comes. The stream ends here, so the cancelled read loses nothing.
                r = worker_stopped(&mut worker) => {
                    worker = None;
                    r??;
                    return Err(ReceiveError::Internal("the data worker stopped before Done"));
                }
            };
            shared.saw(&msg);
            match (rules.route(msg.frame_type())?, msg) {
                (Route::Offer, Message::Offer(o)) => {
                    let sh = shared.clone();
                    let task = shared.blocking.run(move || effects::handle_offer(&sh, o));
                    let want = super::super::while_busy(writer, busy, &work, task).await???;
                    writer.send(&Message::Want(want)).await?;
                    writer.flush().await?;
                }
                (Route::Data, m) => {
                    let Some(tx) = &work_tx else {
                        return Err(ReceiveError::Internal("data after the worker stopped"));
                    };
                    // Our writer is behind: tell the sender we are busy, not stalled.
                    if super::super::while_busy(writer, busy, &work, tx.send(m))
                        .await?
                        .is_err()
                    {
                        // The worker failed; its error is reported below.
                        return Ok(());
                    }
                }
                (Route::Announce | Route::PackAnnounce, m) => {
                    let Some(key) = key.clone() else {
                        return Err(ReceiveError::Internal("an announce routed without a key"));
                    };
                    let sh = shared.clone();
                    let task = shared.blocking.run(move || match m {
                        Message::BlockAnnounce(a) => effects::handle_announce(&sh, &key, a),
                        Message::PackAnnounce(a) => {
                            super::packs::handle_pack_announce(&sh, &key, a)
                        }
                        _ => Err(ReceiveError::Internal("a route for another frame type")),
                    });
                    let need = super::super::while_busy(writer, busy, &work, task).await???;
                    writer.send(&Message::NeedBlocks(need)).await?;
                    writer.flush().await?;
                }
                (Route::ResumeCheck, Message::ResumeCheck(c)) => {
                    let sh = shared.clone();
                    let task = shared
                        .blocking
                        .run(move || effects::handle_resume_check(&sh, c));
                    let need = super::super::while_busy(writer, busy, &work, task).await???;
                    writer.send(&Message::NeedBlocks(need)).await?;
                    writer.flush().await?;
                }
                (Route::Done, _) => {
                    // All of this stream's data is in once its worker has written it.
                    drop(work_tx.take());
                    if let Some(w) = worker.take() {
                        w.await??;
                    }
                    if stream != 0 {
                        return Ok(());
                    }
                    // Stream 0 waits for every other stream's Done: all data is in before
                    // directory metadata.
                    if n > 1 {
                        let _permits = done
                            .acquire_many(n - 1)
                            .await
                            .map_err(|_| ReceiveError::Internal("session closed"))?;
                    }
                    // And for the blocks fan-out peers are still handing over; those a
                    // failed peer did not deliver come from the sender now.
                    let orphans = match shared.fetches.clone() {
                        Some(f) => {
                            let task = shared.blocking.run(move || f.wait_idle());
                            super::super::while_busy(writer, busy, &work, task)
                                .await??
                                .map_err(ReceiveError::PeerBlocks)?
                        }
                        None => Vec::new(),
                    };
                    if shared.caps & caps::REFETCH != 0 {
                        super::refetch::ask_sender(shared, reader, writer, orphans).await?;
                    }
                    shared.progress.set_phase(Phase::Finishing);
                }
                (Route::DirDone, Message::DirDone(d)) => {
                    let sh = shared.clone();
                    let task = shared
                        .blocking
                        .run(move || effects::handle_dir_done(&sh, d));
                    super::super::while_busy(writer, busy, &work, task).await???;
                }
                (Route::Finish, _) => return finish(shared, writer, busy, &work).await,
                (Route::Alive, _) => {}
                (Route::PeerError, Message::Error(e)) => return Err(ReceiveError::from_peer(e)),
                _ => return Err(ReceiveError::Internal("a route for another frame type")),
            }
        }
    }
    .await;
    drop(work_tx);
    // The worker's error (e.g. a hash mismatch) explains more than what the reader saw after it.
    if let Some(w) = worker {
        w.await??;
    }
    r?;
    if stream != 0 {
        done.add_permits(1);
    }
    Ok(())
}

/// Resolves when the stream's data worker ended (never once it was taken for Done).
async fn worker_stopped<T>(
    worker: &mut Option<tokio::task::JoinHandle<T>>,
) -> Result<T, tokio::task::JoinError> {
    match worker.as_mut() {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// Finish on stream 0: every file asked for is complete; the digest is computed and the
/// Summary sent.
async fn finish<W, F>(
    shared: &Arc<Session>,
    writer: &mut FrameWriter<W>,
    busy: bool,
    work: &F,
) -> Result<(), ReceiveError>
where
    W: AsyncWrite + Unpin,
    F: Fn() -> u64,
{
    shared.state()?.check_finished()?;
    let sh = shared.clone();
    // A dry run wrote nothing: there is no transferred tree to describe.
    let digest = if shared.dry_run {
        Vec::new()
    } else {
        let task = shared.blocking.run(move || sh.compute_digest());
        super::super::while_busy(writer, busy, work, task)
            .await???
            .to_vec()
    };
    let p = shared.progress.snapshot();
    let d = shared.store_counters();
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
