//! The cross-cluster API server: mutual TLS (callers authenticated by their Peer's CA before any
//! request is read), a bounded number of connections, a request-rate limit per peer cluster,
//! small bodies, and handlers that only read Transfers and record what a source half reports.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;

use super::registry::{Counterpart, Registry};
use super::trust::{self, PEERING_ID};
use super::wire::{self, HalfRef, PairRequest, PairResponse, Refusal, Versions, WithdrawRequest};
use crate::api::{Peer, Transfer};
use crate::names;

/// Authenticated connections served at once (each peer cluster is rate-limited besides).
const MAX_CONNECTIONS: usize = 64;
/// TLS handshakes under way at once; a new connection beyond them ends the oldest.
const MAX_HANDSHAKES: usize = 64;
/// Handshake, then the whole exchange of one connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Request bodies are a few hundred bytes.
const MAX_BODY: usize = 64 * 1024;
/// Requests per second each peer cluster may make, and the burst it may save up: a source half
/// calls every 2 s, so this serves about 200 concurrent halves per peer cluster.
const RATE_PER_SECOND: f64 = 100.0;
const BURST: f64 = 200.0;

/// What the handlers need.
pub struct ApiState {
    /// The Transfers of this cluster (the controller's cache).
    pub transfers: Store<Transfer>,
    pub peers: Store<Peer>,
    pub registry: Arc<Registry>,
    pub wake: mpsc::Sender<ObjectRef<Transfer>>,
    pub local_cluster: String,
    limiter: RateLimiter,
}

impl ApiState {
    pub fn new(
        transfers: Store<Transfer>,
        peers: Store<Peer>,
        registry: Arc<Registry>,
        wake: mpsc::Sender<ObjectRef<Transfer>>,
        local_cluster: String,
    ) -> ApiState {
        ApiState {
            transfers,
            peers,
            registry,
            wake,
            local_cluster,
            limiter: RateLimiter::default(),
        }
    }
}

/// A token bucket per peer cluster.
#[derive(Default)]
struct RateLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    fn allow(&self, cluster: &str, now: Instant) -> bool {
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, last) = b.entry(cluster.to_owned()).or_insert((BURST, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * RATE_PER_SECOND).min(BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The server's certificate, issued again every hour (leaves live for `--cert-days`).
struct RotatingCert {
    authority: Arc<crate::pki::Authority>,
    current: Mutex<Option<(Instant, Arc<rustls::sign::CertifiedKey>)>>,
}

impl std::fmt::Debug for RotatingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingCert")
            .field("cluster", &self.authority.cluster())
            .finish_non_exhaustive()
    }
}

const REISSUE_AFTER: Duration = Duration::from_secs(3600);

impl rustls::server::ResolvesServerCert for RotatingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, key)) = cur.as_ref()
            && at.elapsed() < REISSUE_AFTER
        {
            return Some(key.clone());
        }
        let issued = self.authority.peering_cert().ok().and_then(|(chain, key)| {
            let signer = ferry_mover::net::provider()
                .key_provider
                .load_private_key(key)
                .ok()?;
            Some(Arc::new(rustls::sign::CertifiedKey::new(chain, signer)))
        });
        match issued {
            Some(k) => {
                *cur = Some((Instant::now(), k.clone()));
                Some(k)
            }
            None => {
                tracing::warn!("cross-cluster API: could not issue the server certificate");
                cur.as_ref().map(|(_, k)| k.clone())
            }
        }
    }
}

/// TLS settings of the API: TLS 1.3, callers verified against their Peer's CA bundle.
pub fn tls_config(
    authority: Arc<crate::pki::Authority>,
    peers: Store<Peer>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = ferry_mover::net::provider();
    let verifier = Arc::new(trust::CallerVerifier {
        peers,
        local_cluster: authority.cluster().to_owned(),
        provider: provider.clone(),
    });
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(RotatingCert {
            authority,
            current: Mutex::new(None),
        }));
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// Serves the cross-cluster API; each connection on its own task.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<ApiState>,
) -> std::io::Result<()> {
    accept_loop(listener, tls, move |tls, addr| {
        let state = state.clone();
        async move {
            // The verifier accepted only a peering identity of a cluster a Peer names.
            let cluster = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| ferry_mover::net::Identity::from_cert_der(c).ok())
                .filter(|id| id.transfer_id == PEERING_ID)
                .and_then(|id| id.scope)
                .map(|s| s.cluster);
            let Some(cluster) = cluster else { return };
            let service = hyper::service::service_fn(move |req| {
                let (state, cluster) = (state.clone(), cluster.clone());
                async move { Ok::<_, Infallible>(handle(req, &cluster, &state).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(tls), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                tracing::debug!(%addr, "cross-cluster API connection: {e}");
            }
        }
    })
    .await
}

/// Handshakes that have not finished yet, oldest first. A caller that never authenticates
/// (an idle or trickling TCP connection) must not keep honest peers out: when every slot is
/// taken, the oldest unfinished handshake is ended (an honest one takes milliseconds, so only
/// stalled ones grow old).
#[derive(Default)]
struct HandshakeSlots {
    pending: Mutex<VecDeque<(Arc<AtomicBool>, AbortHandle)>>,
}

impl HandshakeSlots {
    /// Makes room for one more handshake, ending the oldest unfinished one if need be.
    fn make_room(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|(handshaking, task)| handshaking.load(Ordering::Acquire) && !task.is_finished());
        if p.len() >= MAX_HANDSHAKES
            && let Some((_, oldest)) = p.pop_front()
        {
            oldest.abort();
        }
    }

    fn push(&self, handshaking: Arc<AtomicBool>, task: AbortHandle) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.push_back((handshaking, task));
    }
}

/// Accepts connections: TLS under [`HANDSHAKE_TIMEOUT`] with at most [`MAX_HANDSHAKES`] at once
/// (the oldest unfinished one gives way), then at most [`MAX_CONNECTIONS`] authenticated
/// connections served by `serve_one` at once.
async fn accept_loop<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    serve_one: F,
) -> std::io::Result<()>
where
    F: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::net::SocketAddr) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let serving = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let handshakes = Arc::new(HandshakeSlots::default());
    let serve_one = Arc::new(serve_one);
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before accept: keep serving.
                tracing::warn!("cross-cluster API: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        handshakes.make_room();
        let handshaking = Arc::new(AtomicBool::new(true));
        let (acceptor, serving, serve_one) = (acceptor.clone(), serving.clone(), serve_one.clone());
        let flag = handshaking.clone();
        let task = tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::info!(%addr, "cross-cluster API: handshake refused: {e}");
                    return;
                }
                Err(_) => {
                    tracing::info!(%addr, "cross-cluster API: handshake timed out");
                    return;
                }
            };
            flag.store(false, Ordering::Release);
            let Ok(_permit) = serving.try_acquire_owned() else {
                tracing::warn!(%addr, "cross-cluster API: too many connections; dropping one");
                return;
            };
            serve_one(tls, addr).await;
        });
        handshakes.push(handshaking, task.abort_handle());
    }
}

fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn refuse(status: StatusCode, reason: &str, message: String) -> Response<Full<Bytes>> {
    json(
        status,
        &Refusal {
            reason: reason.to_owned(),
            message,
        },
    )
}

async fn body<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Response<Full<Bytes>>> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "BadRequest", format!("body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "BadRequest", format!("body: {e}")))
}

async fn handle(req: Request<Incoming>, cluster: &str, st: &ApiState) -> Response<Full<Bytes>> {
    if !st.limiter.allow(cluster, Instant::now()) {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "RateLimited",
            format!("cluster {cluster} calls faster than {RATE_PER_SECOND} requests per second"),
        );
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let v1 = wire::VERSIONS[0];
    match (method, path.as_str()) {
        (Method::GET, wire::VERSIONS_PATH) => json(
            StatusCode::OK,
            &Versions {
                versions: wire::VERSIONS.iter().map(|v| v.to_string()).collect(),
            },
        ),
        (Method::POST, p) if p == wire::pair_path(v1) => match body::<PairRequest>(req).await {
            Ok(r) => pair(r, cluster, st).await,
            Err(resp) => resp,
        },
        (Method::POST, p) if p == wire::withdraw_path(v1) => {
            match body::<WithdrawRequest>(req).await {
                Ok(r) => withdraw(r, cluster, st).await,
                Err(resp) => resp,
            }
        }
        (_, p) => refuse(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "no such API path {p} (this operator speaks {:?})",
                wire::VERSIONS
            ),
        ),
    }
}

/// The destination Transfer `dest`, checked to take its source from `source` in `cluster`.
async fn counterpart_of(
    dest: &HalfRef,
    source: &HalfRef,
    cluster: &str,
    st: &ApiState,
) -> Result<(Transfer, String), Response<Full<Bytes>>> {
    let local = &st.local_cluster;
    // An operator that just started (or just took the lead) answers "not yet" until its cache
    // of Transfers is whole: a "no such Transfer" from an empty cache would be taken for a
    // refusal.
    if futures::FutureExt::now_or_never(st.transfers.wait_until_ready()).is_none() {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            format!("cluster {local} is starting; ask again"),
        ));
    }
    let t = match st
        .transfers
        .get(&ObjectRef::new(&dest.name).within(&dest.namespace))
    {
        Some(t) if t.metadata.deletion_timestamp.is_none() => t,
        _ => {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "CounterpartMissing",
                format!("cluster {local} has no Transfer {dest}"),
            ));
        }
    };
    let peers: Vec<String> = trust::peers_of_cluster(&st.peers, cluster)
        .iter()
        .map(|p| p.name_any())
        .collect();
    let remote = t.spec.source.remote.as_ref();
    let matches = remote.is_some_and(|r| {
        peers.contains(&r.peer) && r.namespace == source.namespace && r.name == source.name
    });
    if !matches {
        let declared = match remote {
            Some(r) => format!(
                "takes its source from Transfer {}/{} of Peer {}",
                r.namespace, r.name, r.peer
            ),
            None => "does not take its source from another cluster".to_owned(),
        };
        return Err(refuse(
            StatusCode::CONFLICT,
            "CounterpartMismatch",
            format!(
                "Transfer {dest} in cluster {local} {declared}, not from Transfer {source} of \
                 cluster {cluster}"
            ),
        ));
    }
    let peer = remote.map(|r| r.peer.clone()).unwrap_or_default();
    Ok((t.as_ref().clone(), peer))
}

async fn pair(r: PairRequest, cluster: &str, st: &ApiState) -> Response<Full<Bytes>> {
    let (t, peer) = match counterpart_of(&r.destination, &r.source, cluster, st).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let uid = t.uid().unwrap_or_default();
    let changed = st.registry.record(
        &uid,
        Counterpart {
            peer,
            source: r.source,
            report: r.sender,
            last_call: Timestamp::now(),
            withdrawn: false,
        },
    );
    if changed {
        let _ = st.wake.try_send(ObjectRef::from_obj(&t));
    }
    let status = t.status.clone().unwrap_or_default();
    let receiver = if status.phase.is_finished() {
        None
    } else {
        status
            .remote
            .as_ref()
            .and_then(|r| r.receiver_address.clone())
    };
    json(
        StatusCode::OK,
        &PairResponse {
            transfer_id: names::transfer_id(&uid, status.run),
            run: status.run,
            attempt: status.attempts,
            receiver,
            status,
        },
    )
}

async fn withdraw(r: WithdrawRequest, cluster: &str, st: &ApiState) -> Response<Full<Bytes>> {
    match counterpart_of(&r.destination, &r.source, cluster, st).await {
        Ok((t, peer)) => {
            let gone = Counterpart {
                peer,
                source: r.source,
                report: None,
                last_call: Timestamp::now(),
                withdrawn: true,
            };
            if st.registry.withdraw(&t.uid().unwrap_or_default(), gone) {
                let _ = st.wake.try_send(ObjectRef::from_obj(&t));
            }
            json(StatusCode::OK, &serde_json::json!({}))
        }
        // Nothing here pairs with the caller: nothing to stop.
        Err(_) => json(StatusCode::OK, &serde_json::json!({})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_mover::net::{self, Role};

    /// TLS files of the test's two ends (the mover's own: any mutual-TLS pair will do here).
    fn tls_pair(dir: &std::path::Path) -> (net::TlsFiles, net::TlsFiles) {
        let certs = net::generate_certs("peering-test", 1).expect("certs");
        net::write_certs(dir, &certs).expect("write");
        let load = |role: Role| {
            net::load_files(
                &dir.join("ca.crt"),
                &dir.join(format!("{role}.crt")),
                &dir.join(format!("{role}.key")),
                "peering-test",
                role,
            )
            .expect("load")
        };
        (load(Role::Receiver), load(Role::Sender))
    }

    #[tokio::test]
    async fn idle_connections_cannot_keep_an_honest_caller_out() {
        let dir = tempfile::tempdir().expect("tmp");
        let (server, client) = tls_pair(dir.path());
        let server = Arc::new(net::server_config(&server, &[Role::Sender]).expect("server"));
        let client = Arc::new(net::client_config(&client, &[Role::Receiver]).expect("client"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (served_tx, mut served_rx) = mpsc::channel::<()>(4);
        tokio::spawn(accept_loop(listener, server, move |_tls, _addr| {
            let tx = served_tx.clone();
            async move {
                let _ = tx.send(()).await;
            }
        }));
        // Twice as many idle connections as handshake slots, all opened before the caller.
        let mut idle = Vec::new();
        for _ in 0..2 * MAX_HANDSHAKES {
            idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let honest = net::connect_tls(addr, client, Duration::from_secs(5)).await;
        assert!(honest.is_ok(), "honest caller refused: {:?}", honest.err());
        let served = tokio::time::timeout(Duration::from_secs(5), served_rx.recv()).await;
        assert_eq!(served, Ok(Some(())), "the honest connection was not served");
        drop(idle);
    }

    #[test]
    fn each_peer_cluster_has_its_own_budget() {
        let l = RateLimiter::default();
        let t0 = Instant::now();
        let allowed = (0..1000).filter(|_| l.allow("west", t0)).count();
        assert_eq!(allowed, BURST as usize);
        assert!(l.allow("north", t0), "another cluster is not throttled");
        assert!(!l.allow("west", t0));
        assert!(l.allow("west", t0 + Duration::from_millis(100)), "refills");
    }
}
