//! Calls to a peer cluster's cross-cluster API, each on a fresh mutual-TLS connection (a source
//! half calls every few seconds; nothing is worth keeping open). Failures come back as a
//! condition reason and a message a person can act on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::trust::{EndpointPinning, PeerEntry};
use super::wire::{self, PairRequest, PairResponse, Refusal, Versions, WithdrawRequest};
use crate::api::Reason;
use crate::pki::Authority;
use crate::plan::placement::Blocked;
use ferry_proto::net::PinnedVerifier;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_RESPONSE: usize = 1024 * 1024;

/// This operator's side of the API: its CA, the peering certificate it issued (again every
/// hour; leaves live `--cert-days`) and the version agreed with each endpoint.
pub struct PeerClient {
    authority: Arc<Authority>,
    cert: Mutex<Option<(Instant, Certificate)>>,
    versions: Mutex<HashMap<String, &'static str>>,
}

type Certificate = (Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>);

/// How long one issued peering certificate is used.
const REISSUE_AFTER: Duration = Duration::from_secs(3600);

fn blocked(reason: Reason, message: String) -> Blocked {
    Blocked { reason, message }
}

/// Whether an error chain holds a TLS alert the other side sent (it refused us) or a
/// certificate problem of ours (we refused it).
fn tls_error(e: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t.clone());
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(t) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(t.clone());
        }
        cur = err.source();
    }
    None
}

fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.dedup();
    parts.join(": ")
}

impl PeerClient {
    pub fn new(authority: Arc<Authority>) -> PeerClient {
        PeerClient {
            authority,
            cert: Mutex::new(None),
            versions: Mutex::new(HashMap::new()),
        }
    }

    /// The current peering certificate, issued when there is none or it is an hour old.
    fn certificate(&self) -> Result<Certificate, Blocked> {
        let mut cur = self.cert.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, c)) = cur.as_ref()
            && at.elapsed() < REISSUE_AFTER
        {
            return Ok(c.clone());
        }
        let (chain, key) = self.authority.peering_cert().map_err(|e| {
            blocked(
                Reason::PeerUnreachable,
                format!("no peering certificate: {e}"),
            )
        })?;
        let c = (chain, Arc::new(key));
        *cur = Some((Instant::now(), c.clone()));
        Ok(c)
    }

    fn failure(&self, peer: &PeerEntry, e: &(dyn std::error::Error + 'static)) -> Blocked {
        let (name, endpoint, text) = (&peer.name, &peer.endpoint, chain_text(e));
        match tls_error(e) {
            Some(rustls::Error::AlertReceived(_)) => blocked(
                Reason::PeerRefused,
                format!(
                    "the endpoint {endpoint} of Peer {name} refused this cluster's certificate \
                     ({text}); the other cluster needs a Peer naming this cluster with this \
                     operator's CA in its caBundle"
                ),
            ),
            Some(_) => blocked(
                Reason::PeerUntrusted,
                format!(
                    "the endpoint {endpoint} of Peer {name} is not the operator of cluster {} \
                     that the Peer's caBundle vouches for ({text})",
                    peer.cluster
                ),
            ),
            None => blocked(
                Reason::PeerUnreachable,
                format!("cannot reach the endpoint {endpoint} of Peer {name}: {text}"),
            ),
        }
    }

    /// One request on a fresh connection: the status and the body.
    async fn call(
        &self,
        peer: &PeerEntry,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), Blocked> {
        let verifier = PinnedVerifier::new(EndpointPinning { peer: peer.clone() });
        let (chain, key) = self.certificate()?;
        let cfg = rustls::ClientConfig::builder_with_provider(ferry_proto::net::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(verifier)
                    .with_client_auth_cert(chain, key.clone_key())
            })
            .map_err(|e| blocked(Reason::PeerUnreachable, format!("TLS settings: {e}")))?;
        let exchange = async {
            let tcp = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect(peer.endpoint.as_str()),
            )
            .await
            .map_err(|_| {
                blocked(
                    Reason::PeerUnreachable,
                    format!(
                        "cannot reach the endpoint {} of Peer {}: no answer within {} s",
                        peer.endpoint,
                        peer.name,
                        CONNECT_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|e| self.failure(peer, &e))?;
            // Names are not checked (identities are): any valid name will do.
            let name = ServerName::try_from("ferry-peer").map_err(|e| self.failure(peer, &e))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                .connect(name, tcp)
                .await
                .map_err(|e| self.failure(peer, &e))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| self.failure(peer, &e))?;
            let driver = tokio::spawn(conn);
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(http::header::HOST, "ferry-peer")
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| self.failure(peer, &e))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| self.failure(peer, &e))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| {
                    blocked(
                        Reason::PeerUnreachable,
                        format!("reading the answer of Peer {}: {e}", peer.name),
                    )
                })?
                .to_bytes();
            driver.abort();
            Ok((status, bytes))
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                blocked(
                    Reason::PeerUnreachable,
                    format!(
                        "the endpoint {} of Peer {} did not answer within {} s",
                        peer.endpoint,
                        peer.name,
                        CALL_TIMEOUT.as_secs()
                    ),
                )
            })?
    }

    /// The API version agreed with `peer` (asked once per endpoint).
    async fn version(&self, peer: &PeerEntry) -> Result<&'static str, Blocked> {
        let key = format!("{}|{}", peer.cluster, peer.endpoint);
        if let Some(v) = self
            .versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(v);
        }
        let (status, body) = self
            .call(peer, Method::GET, wire::VERSIONS_PATH, None)
            .await?;
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            // Busy or starting: a passing state, not an answer about versions.
            return Err(self.refusal(peer, status, &body));
        }
        let theirs: Versions = serde_json::from_slice(&body)
            .ok()
            .filter(|_| status.is_success())
            .ok_or_else(|| {
                blocked(
                    Reason::PeerVersionUnsupported,
                    format!(
                        "Peer {} answered {status} without a list of API versions: it is not a \
                         ferry operator this version understands",
                        peer.name
                    ),
                )
            })?;
        let v = wire::negotiate(&theirs.versions).ok_or_else(|| {
            blocked(
                Reason::PeerVersionUnsupported,
                format!(
                    "Peer {} speaks cross-cluster API versions {:?}, this operator {:?}: \
                     upgrade the older of the two operators",
                    peer.name,
                    theirs.versions,
                    wire::VERSIONS
                ),
            )
        })?;
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, v);
        Ok(v)
    }

    fn forget_version(&self, peer: &PeerEntry) {
        let key = format!("{}|{}", peer.cluster, peer.endpoint);
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    fn refusal(&self, peer: &PeerEntry, status: StatusCode, body: &[u8]) -> Blocked {
        let r: Refusal = serde_json::from_slice(body).unwrap_or(Refusal {
            reason: String::new(),
            message: String::from_utf8_lossy(body).chars().take(500).collect(),
        });
        let reason = match r.reason.as_str() {
            "CounterpartMissing" => Reason::CounterpartMissing,
            "CounterpartMismatch" => Reason::CounterpartMismatch,
            _ => Reason::PeerUnreachable,
        };
        if status == StatusCode::NOT_FOUND && r.reason == "NotFound" {
            // The peer changed versions since we asked: ask again next time.
            self.forget_version(peer);
        }
        blocked(
            reason,
            format!("Peer {} answered {status}: {}", peer.name, r.message),
        )
    }

    /// Asks the destination half how things stand, reporting our sender.
    pub async fn pair(&self, peer: &PeerEntry, req: &PairRequest) -> Result<PairResponse, Blocked> {
        let v = self.version(peer).await?;
        let body = serde_json::to_vec(req).unwrap_or_default();
        let (status, bytes) = self
            .call(peer, Method::POST, &wire::pair_path(v), Some(body))
            .await?;
        if !status.is_success() {
            return Err(self.refusal(peer, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            blocked(
                Reason::PeerVersionUnsupported,
                format!(
                    "Peer {} sent an answer this operator cannot read: {e}",
                    peer.name
                ),
            )
        })
    }

    /// Tells the destination half that the source half is gone.
    pub async fn withdraw(&self, peer: &PeerEntry, req: &WithdrawRequest) -> Result<(), Blocked> {
        let v = self.version(peer).await?;
        let body = serde_json::to_vec(req).unwrap_or_default();
        let (status, bytes) = self
            .call(peer, Method::POST, &wire::withdraw_path(v), Some(body))
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(self.refusal(peer, status, &bytes))
        }
    }
}
