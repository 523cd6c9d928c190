//! The progress service (`ferry.progress.v1`): its generated messages, and the client the
//! operator (and a test) opens to a mover's progress port.

use std::net::SocketAddr;
use std::sync::Arc;

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ferry.progress.v1");
}

use v1::progress_client::ProgressClient;

/// The progress port could not be reached, or its TLS handshake failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to connect to the progress service at {addr}")]
pub struct ConnectError {
    pub addr: SocketAddr,
    #[source]
    pub source: tonic::transport::Error,
}

/// Connects to a mover's progress service with mutual TLS (`tls` from
/// `net::client_config(files, &[Role::Sender, Role::Receiver])` with an operator certificate).
pub async fn connect_progress(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<ProgressClient<tonic::transport::Channel>, ConnectError> {
    let channel = crate::net::tls_channel(addr, tls, |e| e)
        .await
        .map_err(|source| ConnectError { addr, source })?;
    Ok(ProgressClient::new(channel))
}
