//! gRPC (tonic) over ferry's mutual TLS: the accept loop that hands verified connections to a
//! tonic server, and a channel that dials through our TLS client. The progress service and the
//! node service share them.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use super::identity::Identity;

/// A verified TLS connection as tonic sees it; its connect info is the client's identity.
pub struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

/// What a handler can read from `request.extensions()`: the identity the client's certificate
/// carries (already checked by the server's verifier).
#[derive(Clone, Debug)]
pub struct PeerIdentity(pub Option<Identity>);

impl Connected for TlsConn {
    type ConnectInfo = PeerIdentity;
    fn connect_info(&self) -> Self::ConnectInfo {
        let (_, conn) = self.0.get_ref();
        PeerIdentity(
            conn.peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| Identity::from_cert_der(c).ok()),
        )
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts on `listener` and yields each connection whose handshake succeeded (the config must
/// require client certificates). Handshakes that fail or stall are dropped after 10 s without
/// affecting other clients; `what` names the port in the log. The TLS config is read for each
/// connection, so a renewed certificate applies to the next one.
pub fn tls_incoming(
    listener: TcpListener,
    tls: impl Fn() -> Arc<rustls::ServerConfig> + Send + 'static,
    what: &'static str,
) -> impl Stream<Item = Result<TlsConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<TlsConn>(16);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, addr)) = listener.accept().await else {
                continue;
            };
            let (acceptor, tx) = (TlsAcceptor::from(tls()), tx.clone());
            tokio::spawn(async move {
                match super::accept_tls(tcp, addr, &acceptor, Duration::from_secs(10)).await {
                    Ok(tls) => {
                        let _ = tx.send(TlsConn(tls)).await;
                    }
                    Err(e) if e.is_probe() => tracing::debug!("{what} port probed by {addr}"),
                    Err(e) => tracing::warn!(
                        "{what} port refused {addr}: {}",
                        crate::session::anyhow_chain(&e)
                    ),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok::<_, std::io::Error>(c), rx))
    })
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
