//! TLS settings between a receiver and its node's block store service. Neither end compares
//! transfer ids: the service accepts any receiver its cluster's operator issued a certificate to,
//! and the receiver accepts only the certificate of its cluster's node services. Both trust only
//! their own cluster's CA, never a peer cluster's: a cross-cluster receiver uses the store of the
//! node it runs on, in its own cluster.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use super::identity::{Identity, IdentityError};
use super::tls::{TlsError, TlsFiles, provider};

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
    let provider = provider();
    let inner = WebPkiClientVerifier::builder_with_provider(files.roots.clone(), provider.clone())
        .build()
        .map_err(TlsError::Verifier)?;
    let verifier = Arc::new(ReceiverOfCluster {
        inner,
        cluster: own_cluster(files)?,
    });
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(files.chain.clone(), files.key.clone_key())
        .map_err(TlsError::Config)?;
    cfg.send_tls13_tickets = 0;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// A receiver's side: its own certificate; the server must be its cluster's node service.
pub fn node_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let expected = Identity::node_service(&own_cluster(files)?).map_err(|e| {
        TlsError::Config(rustls::Error::General(format!(
            "no node service identity for this cluster: {e}"
        )))
    })?;
    let verifier = Arc::new(NodeServiceOf {
        roots: files.roots.clone(),
        provider: provider.clone(),
        expected,
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(files.chain.clone(), files.key.clone_key())
        .map_err(TlsError::Config)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

#[derive(Debug)]
struct ReceiverOfCluster {
    inner: Arc<dyn ClientCertVerifier>,
    cluster: String,
}

impl ClientCertVerifier for ReceiverOfCluster {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Chain first: an identity read from an untrusted certificate means nothing.
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let peer = Identity::from_cert_der(end_entity).map_err(identity_error)?;
        Identity::check_node_client_of(&peer, &self.cluster).map_err(identity_error)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[derive(Debug)]
struct NodeServiceOf {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    expected: Identity,
}

impl ServerCertVerifier for NodeServiceOf {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let peer = Identity::from_cert_der(end_entity).map_err(identity_error)?;
        if peer != self.expected {
            return Err(rustls::Error::General(format!(
                "the block store service presented {peer}; only {} is accepted",
                self.expected
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not allowed".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
