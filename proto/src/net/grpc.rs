//! gRPC (tonic) over ferry's mutual TLS: the accept loop that hands verified connections to a
//! tonic server, and a channel that dials through our TLS client. The progress service and the
//! node service share them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use super::admission::{
    AcceptLimits, Admission, ConnActivity, ConnectionSlot, ConnectionSlots, PendingHandshakes,
};
use super::identity::Identity;
use super::tenancy::Tenancy;

/// A verified TLS connection as tonic sees it; its connect info is the client's identity. It
/// holds its slot among the port's connections and is closed (reads end) once no request was
/// open on it for the port's idle limit.
pub struct TlsConn {
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    activity: Arc<ConnActivity>,
    idle: Duration,
    _slot: Option<ConnectionSlot>,
}

/// What a handler can read from `request.extensions()`: the identity the client's certificate
/// carries (already checked by the server's verifier), and the connection's activity (a
/// handler marks its request open with [`ConnActivity::begin`] so the connection is not closed
/// as idle under it).
#[derive(Clone, Debug)]
pub struct PeerIdentity {
    pub identity: Option<Identity>,
    /// What the certificate states of the client's place at a node service, if anything.
    pub tenancy: Option<Tenancy>,
    pub activity: Arc<ConnActivity>,
}

fn identity_of(tls: &tokio_rustls::server::TlsStream<TcpStream>) -> Option<Identity> {
    let (_, conn) = tls.get_ref();
    conn.peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| Identity::from_cert_der(c).ok())
}

impl Connected for TlsConn {
    type ConnectInfo = PeerIdentity;
    fn connect_info(&self) -> Self::ConnectInfo {
        let (_, conn) = self.tls.get_ref();
        PeerIdentity {
            identity: identity_of(&self.tls),
            tenancy: conn
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| Tenancy::from_cert_der(c)),
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Checked whenever the connection is read, which HTTP/2 keepalive pings make happen
        // every few seconds: an idle connection ends as if the client had closed it.
        if self.activity.idle_for(self.idle) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// How long the accept loop pauses after an accept error (out of file descriptors, most
/// likely): retrying at once would spin a core while nothing can be accepted.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Accepts on `listener` and yields each connection whose handshake succeeded (the config must
/// require client certificates), within `limits` ([`AcceptLimits`]): handshakes that fail or
/// stall are dropped after the handshake timeout, a flood of connects evicts its own pending
/// handshakes, not others', and a verified connection beyond the port's or its client's share
/// is closed at once. `what` names the port in the log. The TLS config is read for each
/// connection, so a renewed certificate applies to the next one.
pub fn tls_incoming(
    listener: TcpListener,
    tls: impl Fn() -> Arc<rustls::ServerConfig> + Send + 'static,
    what: &'static str,
    limits: AcceptLimits,
) -> impl Stream<Item = Result<TlsConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<TlsConn>(16);
    let slots = ConnectionSlots::new(limits);
    tokio::spawn(async move {
        let pending = Arc::new(Mutex::new(PendingHandshakes::default()));
        let mut handshakes: HashMap<u64, tokio::task::AbortHandle> = HashMap::new();
        let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let mut refused = RateLimitedLog::default();
        loop {
            let (tcp, addr) = tokio::select! {
                biased;
                Some(t) = ended.recv() => {
                    handshakes.remove(&t);
                    continue;
                }
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        refused.warn(what, &format!("accept failed: {e}"));
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                },
            };
            let (ticket, admission) = pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .admit(addr.ip(), &limits);
            if let Admission::Evict(old) = admission
                && let Some(h) = handshakes.remove(&old)
            {
                h.abort();
            }
            let (acceptor, tx, slots) = (TlsAcceptor::from(tls()), tx.clone(), slots.clone());
            let (pending, ended_tx) = (pending.clone(), ended_tx.clone());
            let task = tokio::spawn(async move {
                let accepted =
                    super::accept_tls(tcp, addr, &acceptor, limits.handshake_timeout).await;
                pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .done(ticket);
                let _ = ended_tx.send(ticket);
                match accepted {
                    Ok(tls) => {
                        let client = identity_of(&tls).map_or_else(String::new, |i| i.transfer_id);
                        let Some(slot) = slots.take(&client) else {
                            tracing::debug!(
                                "{what} port: {addr} ({client}) over its share of connections; closed"
                            );
                            return;
                        };
                        let _ = tx
                            .send(TlsConn {
                                tls,
                                activity: Arc::new(ConnActivity::default()),
                                idle: limits.idle,
                                _slot: Some(slot),
                            })
                            .await;
                    }
                    Err(e) if e.is_probe() => tracing::debug!("{what} port probed by {addr}"),
                    Err(e) => {
                        tracing::warn!("{what} port refused {addr}: {}", crate::error_chain(&e))
                    }
                }
            });
            handshakes.insert(ticket, task.abort_handle());
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok::<_, std::io::Error>(c), rx))
    })
}

/// A warning at most every few seconds, with how many were left out.
#[derive(Default)]
struct RateLimitedLog {
    last: Option<std::time::Instant>,
    skipped: u64,
}

impl RateLimitedLog {
    fn warn(&mut self, what: &str, message: &str) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            self.skipped += 1;
            return;
        }
        tracing::warn!("{what} port: {message} ({} more not logged)", self.skipped);
        self.last = Some(std::time::Instant::now());
        self.skipped = 0;
    }
}

/// A tonic endpoint that reaches `addr` through our TLS client (the identity checks are the
/// config's), over a socket the kernel probes when the peer goes quiet (a call may wait long for
/// its answer; a peer that is gone must still end it); `tune` may set window sizes and timeouts
/// before it connects.
pub async fn tls_channel(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    tune: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let tls = tls.clone();
        async move {
            super::connect_tls_probed(addr, tls, Duration::from_secs(10))
                .await
                .map(hyper_util::rt::TokioIo::new)
                .map_err(std::io::Error::other)
        }
    });
    tune(tonic::transport::Endpoint::from_static(
        "http://ferry.invalid",
    ))
    .connect_with_connector(connector)
    .await
}
