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
    connect_tls_with(addr, config, timeout, false).await
}

/// [`connect_tls`] for a long-lived request/response connection (gRPC) that may wait a long
/// time for answers: the kernel probes the peer when nothing arrives (see [`probe_dead_peer`]).
pub async fn connect_tls_probed(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<client::TlsStream<TcpStream>, TransportError> {
    connect_tls_with(addr, config, timeout, true).await
}

/// TCP keepalive: after this long without a segment from the peer, probe it ...
const PROBE_IDLE_SECS: libc::c_int = 5;
/// ... every this many seconds ...
const PROBE_INTERVAL_SECS: libc::c_int = 3;
/// ... and give up after this many unanswered probes.
const PROBE_COUNT: libc::c_int = 3;
/// Data sent but not acknowledged for this long also ends the connection.
const UNACKED_LIMIT_MS: libc::c_int = 30_000;

/// Makes the kernel notice a peer that is gone without a reset (its node lost power, its link
/// went down): probes answered by the peer's kernel, never by its application, so a peer that is
/// only slow or congested is never taken for dead (HTTP/2 pings were: their answer can wait
/// behind megabytes of queued data). A dead peer fails the connection after about 15 s idle,
/// or 30 s with a request unacknowledged.
fn probe_dead_peer(tcp: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = tcp.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket owned by `tcp` for the whole call; the option value is
        // a c_int on the stack, passed with its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, PROBE_IDLE_SECS)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, PROBE_INTERVAL_SECS)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBE_COUNT)?;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, UNACKED_LIMIT_MS)
}

async fn connect_tls_with(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
    probed: bool,
) -> Result<client::TlsStream<TcpStream>, TransportError> {
    // A connection that no SYN-ACK answers within the deadline failed to connect (retryable):
    // the peer's network may not admit this pod yet (a NetworkPolicy agent learns a new pod's
    // address from the API server a moment after the pod starts).
    let started = tokio::time::Instant::now();
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| TransportError::Connect {
            addr,
            source: std::io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| TransportError::Connect { addr, source })?;
    let fut = async {
        let _ = tcp.set_nodelay(true);
        if probed {
            probe_dead_peer(&tcp).map_err(|source| TransportError::Connect { addr, source })?;
        }
        // Identities are checked by URI SAN, not by DNS name; any syntactically valid name works.
        let name = ServerName::try_from("ferry.invalid")
            .map_err(|_| TransportError::Timeout { addr, secs: 0 })?;
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| TransportError::Handshake { addr, source })
    };
    tokio::time::timeout_at(started + timeout, fut)
        .await
        .map_err(|_| TransportError::Timeout {
            addr,
            secs: timeout.as_secs(),
        })?
}

/// [`connect_tls`], trying again while the connection itself fails (refused, unreachable, or
/// unanswered) for up to `retry_for`: a receiver behind a Service may be ready a moment before
/// the Service forwards to it, and a new pod before the network admits it. Handshake failures
/// are never retried.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn option(tcp: &TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: an open socket; `value` and `len` live on the stack for the call.
        let rc = unsafe {
            libc::getsockopt(
                tcp.as_raw_fd(),
                level,
                name,
                std::ptr::from_mut(&mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        value
    }

    #[tokio::test]
    async fn a_probed_socket_probes_a_quiet_peer_and_limits_unacked_data() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        assert_eq!(option(&tcp, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        probe_dead_peer(&tcp).unwrap();
        assert_eq!(option(&tcp, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(option(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 5);
        assert_eq!(option(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 3);
        assert_eq!(option(&tcp, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 3);
        assert_eq!(
            option(&tcp, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
            30_000
        );
    }
}
