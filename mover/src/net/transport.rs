//! TCP + TLS connection setup with deadlines: nothing is allocated for a peer beyond the TLS
//! handshake until its certificate passed the identity check.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("failed to connect to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr} failed")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr} did not finish within {secs} s")]
    Timeout { addr: SocketAddr, secs: u64 },
}

impl TransportError {
    /// The peer closed the connection before sending anything: a TCP probe (a kubelet
    /// readiness check, a port scan), not a client that failed to authenticate.
    pub fn is_probe(&self) -> bool {
        matches!(self, TransportError::Handshake { source, .. }
            if source.kind() == std::io::ErrorKind::UnexpectedEof)
    }
}

/// Connects and completes the TLS handshake within `timeout`.
pub async fn connect_tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<client::TlsStream<TcpStream>, TransportError> {
    let fut = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| TransportError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        // Identities are checked by URI SAN, not by DNS name; any syntactically valid name works.
        let name = ServerName::try_from("ferry.invalid")
            .map_err(|_| TransportError::Timeout { addr, secs: 0 })?;
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| TransportError::Handshake { addr, source })
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| TransportError::Timeout {
            addr,
            secs: timeout.as_secs(),
        })?
}

/// [`connect_tls`], trying again while the connection itself fails (refused, unreachable) for
/// up to `retry_for`: a receiver behind a Service may be ready a moment before the Service
/// forwards to it. Handshake failures are never retried.
pub async fn connect_tls_retrying(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
    retry_for: Duration,
) -> Result<client::TlsStream<TcpStream>, TransportError> {
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut pause = Duration::from_millis(100);
    loop {
        match connect_tls(addr, config.clone(), timeout).await {
            Err(e @ TransportError::Connect { .. })
                if tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::info!("{e}; retrying in {} ms", pause.as_millis());
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Completes the server side of the TLS handshake within `timeout`.
pub async fn accept_tls(
    tcp: TcpStream,
    addr: SocketAddr,
    acceptor: &TlsAcceptor,
    timeout: Duration,
) -> Result<server::TlsStream<TcpStream>, TransportError> {
    let _ = tcp.set_nodelay(true);
    tokio::time::timeout(timeout, acceptor.accept(tcp))
        .await
        .map_err(|_| TransportError::Timeout {
            addr,
            secs: timeout.as_secs(),
        })?
        .map_err(|source| TransportError::Handshake { addr, source })
}
