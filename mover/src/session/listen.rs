//! The receiver's accept loop: TLS and Hello under one handshake deadline, streams grouped by
//! session id, each complete session run to its end.
//!
//! Nothing a peer does before it authenticates can starve an honest sender:
//! - at most [`MAX_HANDSHAKES`] handshakes run at once, and a new connection that finds them all
//!   taken ends the oldest one (an honest handshake takes milliseconds, so only connections that
//!   sit idle or trickle are ever the oldest; no per-address limit, since behind a NodePort every
//!   remote sender may share one source address);
//! - a failed `accept` (for example `EMFILE`) backs off and accepting goes on;
//! - half-assembled sessions are dropped after twice the handshake timeout, checked every
//!   second, not only when another stream arrives;
//! - complete sessions run concurrently in their own tasks (at most [`MAX_SESSIONS`], then at
//!   most [`MAX_QUEUED_SESSIONS`] wait), while handshakes and assembly go on; a running session
//!   that stops making progress is ended by its progress deadline (`Timeouts::progress`), so a
//!   stalling peer holds one slot for a bounded time and never the receiver. Sessions of one
//!   transfer share its staging directory safely: each large file's part file is locked by the
//!   session writing it, and cleanup keeps what another session uses.

use ferry_proto::error_chain;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::SessionSummary;
use super::receiver::{
    Accepted, ReceiveError, ReceiverConfig, accept_stream, failure_message, receive_session,
};
use crate::net::{Identity, Role, TransportError, accept_tls};
use crate::progress::Progress;
use ferry_proto::kind::{ErrorKind, Failure, peer_alert};

/// Handshakes (TLS + Hello) running at once.
pub const MAX_HANDSHAKES: usize = 64;
/// Sessions running at once.
pub const MAX_SESSIONS: usize = 4;
/// Complete sessions waiting while [`MAX_SESSIONS`] run.
pub const MAX_QUEUED_SESSIONS: usize = 4;
/// Longest pause between attempts when `accept` fails (out of descriptors, memory).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

type TlsAccepted = Accepted<TlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("failed to accept a connection")]
    Accept(#[source] std::io::Error),
    #[error(transparent)]
    Session(#[from] ReceiveError),
    #[error("stopped: the receiver is shutting down ({0})")]
    ShutDown(&'static str),
}

/// Serves sessions until one completes (`once`) or forever; returns the summaries.
/// `on_session` sees each session's result (the CLI prints summaries as they finish).
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cfg: ReceiverConfig,
    once: bool,
    progress: Arc<Progress>,
    mut on_session: impl FnMut(&Result<SessionSummary, ReceiveError>),
) -> Result<(), ListenError> {
    let (tx, mut rx) = mpsc::channel::<TlsAccepted>(MAX_HANDSHAKES);
    let cfg = Arc::new(cfg);
    let wire = progress.wire_bytes.clone();
    let acceptor_task = tokio::spawn(accept_loop(listener, acceptor, cfg.clone(), tx, wire));

    // Sessions run in their own tasks, beside handshakes and assembly.
    let (result_tx, mut result_rx) = mpsc::channel(MAX_SESSIONS);
    let mut running = tokio::task::JoinSet::new();
    let mut queued: VecDeque<Vec<TlsAccepted>> = VecDeque::new();
    let start = |running: &mut tokio::task::JoinSet<()>, mut streams: Vec<TlsAccepted>| {
        // A receiver serving many sessions gives each its own counters, so each summary is that
        // session's; with `once` the one session reports into the receiver's own.
        let own = (!once).then(|| Progress::for_session(&progress));
        if let Some(own) = &own {
            for s in &mut streams {
                s.reader.set_wire_counter(own.wire_bytes.clone());
            }
        }
        let p = own.clone().unwrap_or_else(|| progress.clone());
        let (c, tx) = (cfg.clone(), result_tx.clone());
        running.spawn(async move {
            let r = receive_session(&c, streams, p).await;
            if let Some(own) = own {
                own.close_session();
            }
            let _ = tx.send(r).await;
        });
    };

    let mut pending: HashMap<Vec<u8>, (Instant, Vec<TlsAccepted>)> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let result = loop {
        let acc = tokio::select! {
            acc = rx.recv() => match acc {
                Some(acc) => acc,
                None => break Ok(()),
            },
            r = result_rx.recv() => {
                let Some(r) = r else { break Ok(()) };
                if let Err(e) = &r {
                    tracing::warn!(
                        "session failed ({}): {}",
                        e.kind(),
                        super::escape_text(&failure_message(e, &cfg.transfer_id))
                    );
                }
                on_session(&r);
                if once {
                    break r.map(|_| ()).map_err(ListenError::from);
                }
                while running.try_join_next().is_some() {}
                if let Some(next) = queued.pop_front() {
                    start(&mut running, next);
                }
                continue;
            }
            why = cfg.shutdown.wait() => {
                // Running sessions stop on the same signal, each telling its sender why; give
                // them the time that takes, then report their results.
                acceptor_task.abort();
                let drained = tokio::time::timeout(super::PEER_GRACE * 2, async {
                    while running.join_next().await.is_some() {}
                });
                let _ = drained.await;
                while let Ok(r) = result_rx.try_recv() {
                    on_session(&r);
                    if once {
                        break;
                    }
                }
                break Err(ListenError::ShutDown(why));
            }
            _ = tick.tick() => {
                // Drop half-assembled sessions whose other streams never came.
                pending.retain(|_, (t, _)| t.elapsed() < cfg.timeouts.handshake * 2);
                continue;
            }
        };
        pending.retain(|_, (t, _)| t.elapsed() < cfg.timeouts.handshake * 2);
        let sid = acc.hello.session_id.clone();
        let count = acc.hello.stream_count as usize;
        let entry = pending
            .entry(sid.clone())
            .or_insert_with(|| (Instant::now(), Vec::new()));
        if entry
            .1
            .iter()
            .any(|a| a.hello.stream_index == acc.hello.stream_index)
        {
            tracing::warn!(
                "duplicate stream index {} in a session",
                acc.hello.stream_index
            );
            continue;
        }
        entry.1.push(acc);
        if entry.1.len() < count {
            continue;
        }
        let Some((_, streams)) = pending.remove(&sid) else {
            continue;
        };
        while running.try_join_next().is_some() {}
        if running.len() < MAX_SESSIONS {
            start(&mut running, streams);
        } else if queued.len() < MAX_QUEUED_SESSIONS {
            queued.push_back(streams);
        } else {
            let mut streams = streams;
            tracing::warn!(
                "refused a session: {MAX_SESSIONS} sessions run and {MAX_QUEUED_SESSIONS} wait"
            );
            tokio::spawn(async move {
                let busy = "the receiver is busy with other sessions of this transfer; retry later";
                for s in &mut streams {
                    super::tell_peer(&mut s.writer, Failure::new(ErrorKind::Network, false), busy)
                        .await;
                }
            });
        }
    };
    acceptor_task.abort();
    running.abort_all();
    result
}

/// Accepts connections forever: each gets one deadline for TLS and Hello; when every handshake
/// slot is taken the oldest handshake is ended; a failed accept backs off.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cfg: Arc<ReceiverConfig>,
    tx: mpsc::Sender<TlsAccepted>,
    wire: Arc<AtomicU64>,
) {
    let slots: Arc<Mutex<VecDeque<AbortHandle>>> = Arc::default();
    let mut backoff = Duration::from_millis(5);
    let mut last_warn: Option<Instant> = None;
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(c) => {
                backoff = Duration::from_millis(5);
                c
            }
            Err(e) => {
                // Out of descriptors or memory, or a connection reset before accept: none of
                // these is a reason to stop serving.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    tracing::warn!("accept failed, retrying in {backoff:?}: {e}");
                    last_warn = Some(Instant::now());
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        {
            let mut s = slots.lock().unwrap_or_else(|e| e.into_inner());
            s.retain(|h| !h.is_finished());
            if s.len() >= MAX_HANDSHAKES
                && let Some(oldest) = s.pop_front()
            {
                oldest.abort();
            }
        }
        let (tx, acceptor, cfg, wire) = (tx.clone(), acceptor.clone(), cfg.clone(), wire.clone());
        let task = tokio::spawn(async move {
            let deadline = cfg.timeouts.handshake;
            let r = tokio::time::timeout(deadline, async {
                let tls = match accept_tls(tcp, addr, &acceptor, deadline).await {
                    Ok(tls) => tls,
                    Err(e) => return Err(refusal(&e, cfg.identity.as_ref())),
                };
                accept_stream(tls, &cfg, wire, 0)
                    .await
                    .map_err(|e| error_chain(&e))
            })
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "TLS handshake and Hello not done within {} s",
                    deadline.as_secs()
                ))
            });
            match r {
                Ok(acc) => {
                    let _ = tx.send(acc).await;
                }
                Err(msg) if msg.is_empty() => {
                    tracing::debug!("connection from {addr} closed before the TLS handshake")
                }
                Err(msg) => tracing::warn!("refused connection from {addr}: {msg}"),
            }
        });
        let mut s = slots.lock().unwrap_or_else(|e| e.into_inner());
        s.push_back(task.abort_handle());
    }
}

/// Why a TLS handshake failed, for the log (empty for a TCP probe that sent nothing). When the
/// peer refused our certificate it only sends an alert, so the log names the identity this
/// receiver presented and the one it expects; the sender's own error names both sides'.
fn refusal(e: &TransportError, own: Option<&Identity>) -> String {
    if e.is_probe() {
        return String::new();
    }
    let chain = error_chain(e);
    match (peer_alert(e), own) {
        (Some(alert), Some(own)) => format!(
            "{chain}: the peer refused this receiver's certificate (TLS alert {alert:?}); this \
             receiver presented {} and accepts only {}: the peer holds a certificate of another \
             transfer, attempt or cluster, or of another CA (its own error names both \
             identities)",
            own.uri(),
            own.with_role(Role::Sender).uri()
        ),
        _ => chain,
    }
}
