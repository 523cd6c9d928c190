//! The one certificate verifier of every ferry endpoint, generic over its pinning rule.
//!
//! Each endpoint (a mover's data and progress ports, the node service and its clients, the
//! operators' cross-cluster API) trusts a peer in two steps, always in this order: its chain
//! must reach a CA the endpoint trusts, then its identity must satisfy the endpoint's
//! [`Pinning`]. What a certificate claims picks among the CAs only; nothing it claims is
//! believed before its chain holds. TLS 1.3 only: 1.2 signatures are refused.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// A CA an endpoint trusts, ready to check chains in either direction.
#[derive(Clone)]
pub struct TrustAnchor {
    roots: Arc<RootCertStore>,
    /// Chains of client certificates (with the client-auth usage) to `roots`.
    clients: Arc<dyn ClientCertVerifier>,
    /// The peer cluster this CA speaks for; `None` for the endpoint's own cluster.
    pub peer_cluster: Option<String>,
}

impl fmt::Debug for TrustAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustAnchor")
            .field("roots", &self.roots.len())
            .field("peer_cluster", &self.peer_cluster)
            .finish()
    }
}

impl TrustAnchor {
    /// The own cluster's CA (`roots`).
    pub fn own(roots: Arc<RootCertStore>) -> Result<TrustAnchor, rustls::Error> {
        TrustAnchor::new(roots, None)
    }

    /// Another cluster's CA, trusted only for what that cluster vouches for.
    pub fn of_peer(roots: Arc<RootCertStore>, cluster: &str) -> Result<TrustAnchor, rustls::Error> {
        TrustAnchor::new(roots, Some(cluster.to_owned()))
    }

    fn new(
        roots: Arc<RootCertStore>,
        peer_cluster: Option<String>,
    ) -> Result<TrustAnchor, rustls::Error> {
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), super::provider())
            .build()
            .map_err(|e| rustls::Error::General(format!("client certificate verifier: {e}")))?;
        Ok(TrustAnchor {
            roots,
            clients,
            peer_cluster,
        })
    }
}

/// One endpoint's rule: which CAs may vouch for a peer, and what the peer's identity must say
/// once one did.
pub trait Pinning: fmt::Debug + Send + Sync {
    /// The CAs that may vouch for `end_entity`, in the order to try them. An error refuses the
    /// certificate before any chain is checked (it claims something no CA here vouches for).
    fn anchors(&self, end_entity: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error>;

    /// The identity check, once `anchor` vouched for the chain of `end_entity`.
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        anchor: &TrustAnchor,
    ) -> Result<(), rustls::Error>;

    /// Told when no CA vouched for the chain of `end_entity` (a hook for a warning).
    fn chain_refused(&self, _end_entity: &CertificateDer<'_>) {}
}

/// Chain first, then the pinning rule; usable as a client or a server certificate verifier.
#[derive(Debug)]
pub struct PinnedVerifier<P> {
    pinning: P,
    provider: Arc<CryptoProvider>,
}

impl<P: Pinning> PinnedVerifier<P> {
    pub fn new(pinning: P) -> Arc<PinnedVerifier<P>> {
        Arc::new(PinnedVerifier {
            pinning,
            provider: super::provider(),
        })
    }

    /// The first anchor whose chain check `chain_holds` passes, then the pinning check; the
    /// last chain error when none does.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        chain_holds: impl Fn(&TrustAnchor) -> Result<(), rustls::Error>,
    ) -> Result<(), rustls::Error> {
        let mut refusal = None;
        for anchor in self.pinning.anchors(end_entity)? {
            match chain_holds(&anchor) {
                Ok(()) => return self.pinning.check(end_entity, &anchor),
                Err(e) => refusal = Some(e),
            }
        }
        self.pinning.chain_refused(end_entity);
        Err(refusal.unwrap_or_else(|| rustls::Error::General("no CA to check against".into())))
    }

    fn tls13_signature(
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

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn no_tls12() -> rustls::Error {
    rustls::Error::General("TLS 1.2 is not allowed".into())
}

impl<P: Pinning> ClientCertVerifier for PinnedVerifier<P> {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Every ferry client has exactly one certificate: hints would choose nothing.
        &[]
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
        self.verify(end_entity, |anchor| {
            anchor
                .clients
                .verify_client_cert(end_entity, intermediates, now)
                .map(|_| ())
        })?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

impl<P: Pinning> ServerCertVerifier for PinnedVerifier<P> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        // The DNS name means nothing between pods; the pinned identity replaces it.
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        self.verify(end_entity, |anchor| {
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &parsed,
                &anchor.roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )
        })?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}
