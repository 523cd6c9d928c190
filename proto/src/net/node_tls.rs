//! TLS settings between a receiver and its node's block store service. Neither end compares
//! transfer ids: the service accepts any receiver its cluster's operator issued a certificate to,
//! and the receiver accepts only the certificate of its cluster's node services. Both trust only
//! their own cluster's CA, never a peer cluster's: a cross-cluster receiver uses the store of the
//! node it runs on, in its own cluster.

use rustls::pki_types::CertificateDer;

use super::identity::{Identity, IdentityError};
use super::tls::{TlsError, TlsFiles, client_config_with, server_config_with};
use super::verifier::{PinnedVerifier, Pinning, TrustAnchor};

/// The cluster an endpoint's own certificate was issued by (only operator-issued certificates
/// name one; a node service needs it).
fn own_cluster(files: &TlsFiles) -> Result<String, TlsError> {
    files
        .identity
        .scope
        .as_ref()
        .map(|s| s.cluster.clone())
        .ok_or_else(|| {
            TlsError::Config(rustls::Error::General(format!(
                "certificate {} names no cluster: the node service needs operator-issued \
                 certificates",
                files.identity
            )))
        })
}

fn identity_error(e: IdentityError) -> rustls::Error {
    rustls::Error::General(e.to_string())
}

/// The node service's side: its `node` certificate; clients must be receivers of its cluster.
pub fn node_server_config(files: &TlsFiles) -> Result<rustls::ServerConfig, TlsError> {
    let verifier = PinnedVerifier::new(ReceiverOfCluster {
        own: TrustAnchor::own(files.roots.clone()).map_err(TlsError::Config)?,
        cluster: own_cluster(files)?,
    });
    server_config_with(files, verifier, vec![b"h2".to_vec()])
}

/// A receiver's side: its own certificate; the server must be its cluster's node service.
pub fn node_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    let expected = Identity::node_service(&own_cluster(files)?).map_err(|e| {
        TlsError::Config(rustls::Error::General(format!(
            "no node service identity for this cluster: {e}"
        )))
    })?;
    let verifier = PinnedVerifier::new(NodeServiceOf {
        own: TrustAnchor::own(files.roots.clone()).map_err(TlsError::Config)?,
        expected,
    });
    client_config_with(files, verifier, vec![b"h2".to_vec()])
}

/// The node service's rule: any receiver its cluster's operator issued a certificate to.
#[derive(Debug)]
struct ReceiverOfCluster {
    own: TrustAnchor,
    cluster: String,
}

impl Pinning for ReceiverOfCluster {
    fn anchors(&self, _: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error> {
        Ok(vec![self.own.clone()])
    }

    fn check(&self, end_entity: &CertificateDer<'_>, _: &TrustAnchor) -> Result<(), rustls::Error> {
        let peer = Identity::from_cert_der(end_entity).map_err(identity_error)?;
        Identity::check_node_client_of(&peer, &self.cluster).map_err(identity_error)
    }
}

/// A receiver's rule: exactly its cluster's node service identity.
#[derive(Debug)]
struct NodeServiceOf {
    own: TrustAnchor,
    expected: Identity,
}

impl Pinning for NodeServiceOf {
    fn anchors(&self, _: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error> {
        Ok(vec![self.own.clone()])
    }

    fn check(&self, end_entity: &CertificateDer<'_>, _: &TrustAnchor) -> Result<(), rustls::Error> {
        let peer = Identity::from_cert_der(end_entity).map_err(identity_error)?;
        if peer != self.expected {
            return Err(rustls::Error::General(format!(
                "the block store service presented {peer}; only {} is accepted",
                self.expected
            )));
        }
        Ok(())
    }
}
