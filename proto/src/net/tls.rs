//! rustls configurations for ferry endpoints: TLS 1.3 only, AES-128-GCM preferred, client
//! certificates mandatory, and verifiers that add the ferry identity check to chain validation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::{CryptoProvider, aws_lc_rs};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::identity::{Identity, Role};
use super::verifier::{PinnedVerifier, Pinning, TrustAnchor};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to read {what} from {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("CA certificate in {path} is not usable as a trust anchor")]
    BadCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("own certificate {path} is not a ferry certificate")]
    OwnIdentity {
        path: PathBuf,
        #[source]
        source: super::IdentityError,
    },
    #[error(
        "own certificate {path} is for {found}, but this endpoint runs as {expected}; pass the \
         certificate issued for this transfer and role"
    )]
    WrongOwnIdentity {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("--peer-ca needs an operator-issued certificate (one naming its cluster)")]
    PeerNeedsScope,
    #[error(
        "--peer-cluster {0} is this endpoint's own cluster; a peer cluster's CA never vouches for it"
    )]
    PeerIsLocal(String),
    #[error(
        "--peer-cluster {cluster}: own certificate {found} is not for a session with that cluster \
         (an operator names the peer cluster in the certificates of cross-cluster movers)"
    )]
    PeerNotNamed { cluster: String, found: String },
    #[error("failed to build the TLS configuration")]
    Config(#[source] rustls::Error),
}

/// The CA, own certificate chain and key an endpoint was given, plus its identity.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub roots: Arc<RootCertStore>,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Arc<PrivateKeyDer<'static>>,
    /// The identity this endpoint acts as.
    pub identity: Identity,
    /// Further identities the own certificate speaks for: a sender serving several Transfers
    /// at once acts as each of them towards its receiver ([`TlsFiles::acting_as`]).
    pub also: Vec<Identity>,
    /// Another cluster's CA, trusted only for that cluster's movers of this transfer.
    pub peer: Option<PeerTrust>,
}

/// The CA of the cluster at the other end of a cross-cluster transfer. It vouches only for
/// identities naming that cluster, and only for movers: never for this cluster's identities, and
/// never for an operator (so it cannot read progress either).
#[derive(Debug, Clone)]
pub struct PeerTrust {
    pub cluster: String,
    pub roots: Arc<RootCertStore>,
}

impl TlsFiles {
    /// The same files acting as the own certificate's identity for `transfer_id` (None when the
    /// certificate does not speak for it).
    pub fn acting_as(&self, transfer_id: &str) -> Option<TlsFiles> {
        let mut all = std::iter::once(&self.identity).chain(&self.also).cloned();
        let identity = all.clone().find(|i| i.transfer_id == transfer_id)?;
        let also = all.by_ref().filter(|i| *i != identity).collect();
        Some(TlsFiles {
            identity,
            also,
            ..self.clone()
        })
    }

    /// Every transfer id the own certificate speaks for, the acting one first.
    pub fn transfer_ids(&self) -> Vec<&str> {
        std::iter::once(&self.identity)
            .chain(&self.also)
            .map(|i| i.transfer_id.as_str())
            .collect()
    }

    /// The same files without the peer cluster's CA (for the progress port, which only this
    /// cluster's operator reads).
    pub fn local_only(&self) -> TlsFiles {
        TlsFiles {
            peer: None,
            ..self.clone()
        }
    }
}

/// Reads a CA bundle (one or more PEM certificates: during a rotation the old and the new CA).
fn read_roots(ca: &Path, what: &'static str) -> Result<RootCertStore, TlsError> {
    let read_err = |source| TlsError::Read {
        what,
        path: ca.to_owned(),
        source,
    };
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(read_err)? {
        roots
            .add(c.map_err(read_err)?)
            .map_err(|source| TlsError::BadCa {
                path: ca.to_owned(),
                source,
            })?;
    }
    if roots.is_empty() {
        return Err(TlsError::Empty {
            what: "CA certificate",
            path: ca.to_owned(),
        });
    }
    Ok(roots)
}

/// Adds `--peer-ca`/`--peer-cluster` to loaded files: the peer's CA bundle, trusted for movers
/// of `cluster` only. Only operator-issued (cluster-scoped) certificates can use it.
pub fn with_peer(files: TlsFiles, ca: &Path, cluster: &str) -> Result<TlsFiles, TlsError> {
    match &files.identity.scope {
        None => return Err(TlsError::PeerNeedsScope),
        Some(own) if own.cluster == cluster => {
            return Err(TlsError::PeerIsLocal(own.cluster.clone()));
        }
        Some(own) if own.peer.as_deref() != Some(cluster) => {
            return Err(TlsError::PeerNotNamed {
                cluster: cluster.to_owned(),
                found: files.identity.uri(),
            });
        }
        Some(_) => {}
    }
    let roots = read_roots(ca, "the peer cluster's CA certificates")?;
    Ok(TlsFiles {
        peer: Some(PeerTrust {
            cluster: cluster.to_owned(),
            roots: Arc::new(roots),
        }),
        ..files
    })
}

/// Loads `--ca`, `--cert` and `--key` and checks the certificate names `transfer_id` and `role`.
pub fn load_files(
    ca: &Path,
    cert: &Path,
    key: &Path,
    transfer_id: &str,
    role: Role,
) -> Result<TlsFiles, TlsError> {
    let read_err = |what, path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Read { what, path, source }
    };
    let roots = read_roots(ca, "CA certificates")?;
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(read_err("certificates", cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err("certificates", cert))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::Empty {
            what: "certificate",
            path: cert.to_owned(),
        });
    };
    let mut all = Identity::all_from_cert_der(leaf).map_err(|source| TlsError::OwnIdentity {
        path: cert.to_owned(),
        source,
    })?;
    let Some(acting) = all
        .iter()
        .position(|i| i.transfer_id == transfer_id && i.role == role)
    else {
        return Err(TlsError::WrongOwnIdentity {
            path: cert.to_owned(),
            found: all.iter().map(Identity::uri).collect::<Vec<_>>().join(", "),
            expected: Identity {
                transfer_id: transfer_id.to_owned(),
                role,
                scope: all[0].scope.clone(),
            }
            .uri(),
        });
    };
    let identity = all.remove(acting);
    let key = PrivateKeyDer::from_pem_file(key).map_err(read_err("private key", key))?;
    Ok(TlsFiles {
        roots: Arc::new(roots),
        chain,
        key: Arc::new(key),
        identity,
        also: all,
        peer: None,
    })
}

/// The transfer id the certificate at `cert` was issued for (its leaf's URI SAN), for a mover
/// started without `--transfer`.
pub fn own_transfer_id(cert: &Path) -> Result<String, TlsError> {
    let read_err = |source| TlsError::Read {
        what: "certificates",
        path: cert.to_owned(),
        source,
    };
    let leaf = CertificateDer::pem_file_iter(cert)
        .map_err(read_err)?
        .next()
        .ok_or_else(|| TlsError::Empty {
            what: "certificate",
            path: cert.to_owned(),
        })?
        .map_err(read_err)?;
    let identity = Identity::from_cert_der(&leaf).map_err(|source| TlsError::OwnIdentity {
        path: cert.to_owned(),
        source,
    })?;
    Ok(identity.transfer_id)
}

/// aws-lc-rs with TLS 1.3 suites only, AES-128-GCM first (fastest with AES-NI/VAES); the
/// operator uses the same for its cross-cluster API.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = aws_lc_rs::default_provider();
    p.cipher_suites = vec![
        aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
        aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
        aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

/// Server side: requires a client certificate chaining to the CA whose identity is the same
/// transfer and one of `accepted` roles.
pub fn server_config(
    files: &TlsFiles,
    accepted: &[Role],
) -> Result<rustls::ServerConfig, TlsError> {
    let locals = std::iter::once(&files.identity)
        .chain(&files.also)
        .cloned()
        .collect();
    let verifier = PinnedVerifier::new(MoverPinning::new(files, locals, accepted)?);
    server_config_with(files, verifier, Vec::new())
}

/// TLS 1.3 with our certificate, every client checked by `verifier`, offering `alpn`.
pub(super) fn server_config_with(
    files: &TlsFiles,
    verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ServerConfig, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(files.chain.clone(), files.key.clone_key())
        .map_err(TlsError::Config)?;
    // Session tickets buy nothing for a handful of long-lived streams.
    cfg.send_tls13_tickets = 0;
    cfg.alpn_protocols = alpn;
    Ok(cfg)
}

/// Client side: presents our certificate and accepts only a server chaining to the CA whose
/// identity is the same transfer and one of `accepted` roles.
pub fn client_config(
    files: &TlsFiles,
    accepted: &[Role],
) -> Result<rustls::ClientConfig, TlsError> {
    // Only the identity this endpoint acts as: a sender serving several Transfers pins each
    // connection to the receiver of the one it was opened for.
    let locals = vec![files.identity.clone()];
    let verifier = PinnedVerifier::new(MoverPinning::new(files, locals, accepted)?);
    client_config_with(files, verifier, Vec::new())
}

/// TLS 1.3 presenting our certificate, the server checked by `verifier`, asking for `alpn`.
pub(super) fn client_config_with(
    files: &TlsFiles,
    verifier: Arc<dyn rustls::client::danger::ServerCertVerifier>,
    alpn: Vec<Vec<u8>>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(files.chain.clone(), files.key.clone_key())
        .map_err(TlsError::Config)?;
    cfg.alpn_protocols = alpn;
    Ok(cfg)
}

fn identity_error(e: super::IdentityError) -> rustls::Error {
    // rustls carries the text into the handshake error on this side; the peer gets an alert.
    rustls::Error::General(e.to_string())
}

/// Checks a verified certificate's identities against this endpoint's: it is accepted when one
/// pair passes `check` (a sender serving several Transfers names each, and every receiver
/// accepts it for its own), and refused with the first pair's mismatch otherwise.
fn check_any(
    end_entity: &CertificateDer<'_>,
    locals: &[Identity],
    check: impl Fn(&Identity, &Identity) -> Result<(), super::IdentityError>,
) -> Result<(), rustls::Error> {
    let mut refusal = None;
    for peer in Identity::all_from_cert_der(end_entity).map_err(identity_error)? {
        for local in locals {
            match check(local, &peer) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    refusal.get_or_insert(e);
                }
            }
        }
    }
    Err(identity_error(
        refusal.unwrap_or(super::IdentityError::NoIdentity),
    ))
}

/// Roles a peer cluster's CA may vouch for: the movers, never an operator.
const PEER_ROLES: [Role; 2] = [Role::Sender, Role::Receiver];

/// The cluster a certificate claims to come from, read before its chain is checked only to pick
/// the CA that must have signed it.
fn claimed_cluster(end_entity: &CertificateDer<'_>) -> Option<String> {
    Identity::from_cert_der(end_entity)
        .ok()
        .and_then(|i| i.scope)
        .map(|s| s.cluster)
}

/// The roles of `accepted` a peer cluster's certificate may have.
fn peer_roles(accepted: &[Role]) -> Vec<Role> {
    accepted
        .iter()
        .copied()
        .filter(|r| PEER_ROLES.contains(r))
        .collect()
}

/// The roles of `accepted` this cluster's certificates may have: with a peer cluster, the
/// opposite mover is the peer cluster's, never a local one.
fn local_roles(accepted: &[Role], has_peer: bool) -> Vec<Role> {
    accepted
        .iter()
        .copied()
        .filter(|r| !(has_peer && PEER_ROLES.contains(r)))
        .collect()
}

/// A mover endpoint's rule: the same transfer, one of the accepted roles; a certificate that
/// claims the peer cluster must chain to that cluster's CA and be one of its movers.
#[derive(Debug)]
struct MoverPinning {
    own: TrustAnchor,
    peer: Option<TrustAnchor>,
    /// The identities this endpoint speaks for (any one may match).
    locals: Vec<Identity>,
    accepted: Vec<Role>,
}

impl MoverPinning {
    fn new(files: &TlsFiles, locals: Vec<Identity>, accepted: &[Role]) -> Result<Self, TlsError> {
        let peer = match &files.peer {
            Some(p) => {
                Some(TrustAnchor::of_peer(p.roots.clone(), &p.cluster).map_err(TlsError::Config)?)
            }
            None => None,
        };
        Ok(MoverPinning {
            own: TrustAnchor::own(files.roots.clone()).map_err(TlsError::Config)?,
            peer,
            locals,
            accepted: accepted.to_vec(),
        })
    }
}

impl Pinning for MoverPinning {
    fn anchors(&self, end_entity: &CertificateDer<'_>) -> Result<Vec<TrustAnchor>, rustls::Error> {
        let claimed = claimed_cluster(end_entity);
        Ok(vec![match &self.peer {
            Some(p) if claimed.is_some() && p.peer_cluster == claimed => p.clone(),
            _ => self.own.clone(),
        }])
    }

    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        anchor: &TrustAnchor,
    ) -> Result<(), rustls::Error> {
        match &anchor.peer_cluster {
            Some(cluster) => {
                let roles = peer_roles(&self.accepted);
                check_any(end_entity, &self.locals, |local, peer| {
                    local.check_peer_from(peer, &roles, cluster)
                })
            }
            None => {
                let roles = local_roles(&self.accepted, self.peer.is_some());
                check_any(end_entity, &self.locals, |local, peer| {
                    local.check_peer(peer, &roles)
                })
            }
        }
    }
}
