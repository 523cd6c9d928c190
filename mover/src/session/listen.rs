//! The receiver's accept loop: TLS and Hello under the handshake deadline (at most 64 at once),
//! streams grouped by session id, each complete session run to its end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::Summary;
use super::receiver::{
    Accepted, ReceiveError, ReceiverConfig, accept_stream, failure_message, receive_session,
};
use crate::kind::peer_alert;
use crate::net::{Identity, Role, TransportError, accept_tls};
use crate::progress::Progress;

const MAX_HANDSHAKES: usize = 64;

type TlsAccepted = Accepted<TlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("failed to accept a connection")]
    Accept(#[source] std::io::Error),
    #[error(transparent)]
    Session(#[from] ReceiveError),
}

/// Serves sessions until one completes (`once`) or forever; returns the summaries.
/// `on_session` sees each session's result (the CLI prints summaries as they finish).
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cfg: ReceiverConfig,
    once: bool,
    progress: Arc<Progress>,
    mut on_session: impl FnMut(&Result<Summary, ReceiveError>),
) -> Result<(), ListenError> {
    let (tx, mut rx) = mpsc::channel::<Accepted<TlsStream<TcpStream>>>(MAX_HANDSHAKES);
    let limit = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let cfg = Arc::new(cfg);
    let wire = progress.wire_bytes.clone();
    let c = cfg.clone();
    let acceptor_task = tokio::spawn(async move {
        loop {
            let (tcp, addr) = listener.accept().await.map_err(ListenError::Accept)?;
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return Ok::<(), ListenError>(());
            };
            let (tx, acceptor, cfg, wire) = (tx.clone(), acceptor.clone(), c.clone(), wire.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let r = async {
                    let tls = match accept_tls(tcp, addr, &acceptor, cfg.timeouts.handshake).await {
                        Ok(tls) => tls,
                        Err(e) => return Err(refusal(&e, cfg.identity.as_ref())),
                    };
                    accept_stream(tls, &cfg, wire, 0)
                        .await
                        .map_err(|e| anyhow_chain(&e))
                }
                .await;
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
        }
    });

    let mut pending: HashMap<Vec<u8>, (Instant, Vec<TlsAccepted>)> = HashMap::new();
    let result = loop {
        let Some(acc) = rx.recv().await else {
            break Ok(());
        };
        // Drop half-assembled sessions whose other streams never came.
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
        let r = receive_session(&cfg, streams, progress.clone()).await;
        if let Err(e) = &r {
            tracing::warn!(
                "session failed ({}): {}",
                e.kind(),
                failure_message(e, &cfg.transfer_id)
            );
        }
        on_session(&r);
        if once {
            break r.map(|_| ()).map_err(ListenError::from);
        }
    };
    acceptor_task.abort();
    result
}

/// Why a TLS handshake failed, for the log (empty for a TCP probe that sent nothing). When the
/// peer refused our certificate it only sends an alert, so the log names the identity this
/// receiver presented and the one it expects; the sender's own error names both sides'.
fn refusal(e: &TransportError, own: Option<&Identity>) -> String {
    if e.is_probe() {
        return String::new();
    }
    let chain = anyhow_chain(e);
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

/// "outer: cause: root cause" for logs.
pub fn anyhow_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
