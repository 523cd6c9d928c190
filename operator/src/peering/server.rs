//! The cross-cluster API server: mutual TLS (callers authenticated by their Peer's CA before any
//! request is read), handshakes bounded in all and per source address, serving slots bounded in
//! all and per peer cluster (`admission.rs` holds the rules), a request-rate limit per peer
//! cluster, small bodies, and handlers that only read Transfers and record what a source half
//! reports.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
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
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::admission::{Admission, HandshakeLimits, PendingHandshakes, ServingShares, Ticket};
use super::registry::{Counterpart, Registry};
use super::trust::{self, PEERING_ID};
use super::wire::{self, HalfRef, PairRequest, PairResponse, Refusal, Versions, WithdrawRequest};
use crate::api::{Peer, Transfer};
use crate::names;

/// Authenticated connections served at once; one peer cluster holds at most half of those the
/// others leave ([`super::admission::may_serve`]), and is rate-limited besides.
const MAX_CONNECTIONS: usize = 64;
/// TLS handshakes under way at once, and from one source address (an IPv6 /64). An honest peer
/// has a few in flight (one connection per call, each handshake done in a round trip; its
/// operator makes at most 16 calls at once), so 8 leaves it room on a slow link while one
/// flooding address holds an eighth of the places ([`PendingHandshakes`] has the whole rule).
const MAX_HANDSHAKES: usize = 64;
const MAX_HANDSHAKES_PER_SOURCE: usize = 8;
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
            let signer = ferry_proto::net::provider()
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
    let provider = ferry_proto::net::provider();
    let verifier = ferry_proto::net::PinnedVerifier::new(trust::CallerPinning {
        peers,
        local_cluster: authority.cluster().to_owned(),
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
    accept_loop(listener, tls, peer_cluster, move |tls, addr, cluster| {
        let state = state.clone();
        async move {
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

/// The peer cluster of an authenticated connection (the verifier accepted only a peering
/// identity of a cluster a Peer names).
fn peer_cluster(conn: &rustls::ServerConnection) -> Option<String> {
    conn.peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| ferry_proto::net::Identity::from_cert_der(c).ok())
        .filter(|id| id.transfer_id == PEERING_ID)
        .and_then(|id| id.scope)
        .map(|s| s.cluster)
}

/// The handshakes under way: [`PendingHandshakes`] decides, this ends the tasks it evicts.
#[derive(Debug)]
struct HandshakeSlots {
    inner: Mutex<(PendingHandshakes, HashMap<Ticket, AbortHandle>)>,
}

/// A handshake's place, given back when its task ends or drops it (done, failed, timed out,
/// evicted).
struct HandshakeTicket {
    slots: Arc<HandshakeSlots>,
    ticket: Ticket,
}

impl HandshakeSlots {
    fn new(limits: HandshakeLimits) -> Arc<HandshakeSlots> {
        Arc::new(HandshakeSlots {
            inner: Mutex::new((PendingHandshakes::new(limits), HashMap::new())),
        })
    }

    /// A place for a handshake from `addr`, ending another's if the rule says so; `None`: close
    /// the connection at once.
    fn admit(self: &Arc<Self>, addr: IpAddr) -> Option<HandshakeTicket> {
        let (ticket, evicted) = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match inner.0.admit(addr) {
                Admission::Admit(t) => (t, None),
                Admission::Evict { ticket, evicted } => (ticket, inner.1.remove(&evicted)),
                Admission::Refuse => return None,
            }
        };
        // Outside the lock: the ended task gives its (already freed) place back as it drops.
        if let Some(task) = evicted {
            task.abort();
        }
        Some(HandshakeTicket {
            slots: self.clone(),
            ticket,
        })
    }

    /// Remembers the task of `ticket`, so that it can be ended, unless its handshake is over.
    fn track(&self, ticket: Ticket, task: AbortHandle) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.0.contains(ticket) {
            inner.1.insert(ticket, task);
        }
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        let mut inner = self.slots.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.0.done(self.ticket);
        inner.1.remove(&self.ticket);
    }
}

/// Accepts connections: TLS under [`HANDSHAKE_TIMEOUT`] within the bounds of
/// [`PendingHandshakes`] ([`MAX_HANDSHAKES`], [`MAX_HANDSHAKES_PER_SOURCE`]), then each
/// authenticated connection of the peer `peer_of` names served by `serve_one` within its share of
/// the [`MAX_CONNECTIONS`] slots.
async fn accept_loop<P, F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    peer_of: P,
    serve_one: F,
) -> std::io::Result<()>
where
    P: Fn(&rustls::ServerConnection) -> Option<String> + Send + Sync + 'static,
    F: Fn(
            tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
            std::net::SocketAddr,
            String,
        ) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let serving = ServingShares::new(MAX_CONNECTIONS);
    let handshakes = HandshakeSlots::new(HandshakeLimits {
        total: MAX_HANDSHAKES,
        per_source: MAX_HANDSHAKES_PER_SOURCE,
    });
    let (peer_of, serve_one) = (Arc::new(peer_of), Arc::new(serve_one));
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
        let Some(place) = handshakes.admit(addr.ip()) else {
            // A flood comes this way at its own pace: not worth a line each.
            tracing::debug!(%addr, "cross-cluster API: too many handshakes from its address");
            drop(tcp);
            continue;
        };
        let ticket = place.ticket;
        let (acceptor, serving) = (acceptor.clone(), serving.clone());
        let (peer_of, serve_one) = (peer_of.clone(), serve_one.clone());
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
            drop(place);
            let Some(peer) = peer_of(tls.get_ref().1) else {
                return;
            };
            let Some(_slot) = serving.take(&peer) else {
                tracing::warn!(
                    %addr,
                    %peer,
                    "cross-cluster API: peer cluster holds its share of the connections; dropping one"
                );
                return;
            };
            serve_one(tls, addr, peer).await;
        });
        handshakes.track(ticket, task.abort_handle());
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
    use ferry_proto::net::{self, Role};
    use std::net::{Ipv4Addr, SocketAddr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// TLS settings of the test's two ends (the mover's own: any mutual-TLS pair will do here).
    fn tls_pair(dir: &std::path::Path) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
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
        let server = net::server_config(&load(Role::Receiver), &[Role::Sender]).expect("server");
        let client = net::client_config(&load(Role::Sender), &[Role::Receiver]).expect("client");
        (Arc::new(server), Arc::new(client))
    }

    /// A TCP connection to `server` from the loopback address `127.0.0.<local>`.
    async fn connect_from(local: u8, server: SocketAddr) -> std::io::Result<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind((Ipv4Addr::new(127, 0, 0, local), 0).into())?;
        socket.connect(server).await
    }

    /// TLS over `tcp`, with `name` as the server name the client sends.
    async fn shake_hands(
        client: &Arc<rustls::ClientConfig>,
        tcp: TcpStream,
        name: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        tokio_rustls::TlsConnector::from(client.clone())
            .connect(name, tcp)
            .await
    }

    /// Waits (up to `limit`) until the server has closed `n` of `streams`; returns how many it
    /// closed. The rest stay open until the returned set is dropped.
    async fn closed_by_server(
        streams: Vec<TcpStream>,
        n: usize,
        limit: Duration,
    ) -> (usize, tokio::task::JoinSet<()>) {
        let mut readers = tokio::task::JoinSet::new();
        for mut s in streams {
            // Nothing is ever sent to a caller that has not sent its hello: the first read
            // ends with the server's close (an end of stream, or a reset).
            readers.spawn(async move {
                let _ = s.read(&mut [0u8; 1]).await;
            });
        }
        let mut closed = 0;
        let deadline = tokio::time::Instant::now() + limit;
        while closed < n {
            match tokio::time::timeout_at(deadline, readers.join_next()).await {
                Ok(Some(_)) => closed += 1,
                Ok(None) | Err(_) => break,
            }
        }
        (closed, readers)
    }

    #[tokio::test]
    async fn idle_connections_from_many_addresses_cannot_keep_an_honest_caller_out() {
        let dir = tempfile::tempdir().expect("tmp");
        let (server, client) = tls_pair(dir.path());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (served_tx, mut served_rx) = mpsc::channel::<()>(4);
        let peer_of = |_: &rustls::ServerConnection| Some("west".to_owned());
        let server_task = tokio::spawn(accept_loop(listener, server, peer_of, move |_, _, _| {
            let tx = served_tx.clone();
            async move {
                let _ = tx.send(()).await;
            }
        }));
        // Twice as many idle connections as handshake places, each address at its own limit,
        // all opened before the caller: the table is full when it comes.
        let mut idle = Vec::new();
        let sources = (2 * MAX_HANDSHAKES).div_ceil(MAX_HANDSHAKES_PER_SOURCE);
        for s in 0..sources {
            for _ in 0..MAX_HANDSHAKES_PER_SOURCE {
                let local = u8::try_from(10 + s).expect("few addresses");
                idle.push(connect_from(local, addr).await.expect("connect"));
            }
        }
        let honest = connect_from(1, addr).await.expect("connect");
        let honest = shake_hands(&client, honest, "ferry.invalid").await;
        assert!(honest.is_ok(), "honest caller refused: {:?}", honest.err());
        let served = tokio::time::timeout(Duration::from_secs(5), served_rx.recv()).await;
        server_task.abort();
        assert_eq!(served, Ok(Some(())), "the honest connection was not served");
        drop(idle);
    }

    #[tokio::test]
    async fn a_connect_flood_from_one_address_cannot_end_an_honest_handshake() {
        let dir = tempfile::tempdir().expect("tmp");
        let (server, client) = tls_pair(dir.path());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let peer_of = |_: &rustls::ServerConnection| Some("west".to_owned());
        let server_task = tokio::spawn(accept_loop(
            listener,
            server,
            peer_of,
            move |mut tls, _, _| async move {
                let mut ping = [0u8; 4];
                if tls.read_exact(&mut ping).await.is_ok() && &ping == b"ping" {
                    let _ = tls.write_all(b"pong").await;
                    let _ = tls.shutdown().await;
                }
            },
        ));
        // The honest caller's connection is accepted first: the oldest handshake, the one an
        // "evict the oldest" rule ends first.
        let honest = connect_from(1, addr).await.expect("connect");
        // Then four times as many connections as there are handshake places, from another
        // address, that never send a byte.
        let flood_size = 4 * MAX_HANDSHAKES;
        let mut flood = Vec::new();
        for _ in 0..flood_size {
            flood.push(connect_from(2, addr).await.expect("connect"));
        }
        // The server has taken them all in once it has closed all but a table's worth.
        let (closed, still_open) =
            closed_by_server(flood, flood_size - MAX_HANDSHAKES, Duration::from_secs(5)).await;
        assert!(
            closed >= flood_size - MAX_HANDSHAKES,
            "only {closed} closed"
        );
        // And the flood goes on (bounded) while the honest caller shakes hands and calls.
        let flooding = tokio::spawn(async move {
            let mut open = std::collections::VecDeque::new();
            for _ in 0..2000 {
                match connect_from(2, addr).await {
                    Ok(s) => open.push_back(s),
                    Err(_) => tokio::task::yield_now().await,
                }
                if open.len() > 256 {
                    open.pop_front();
                }
            }
        });
        let call = async {
            let mut tls = shake_hands(&client, honest, "ferry.invalid").await?;
            tls.write_all(b"ping").await?;
            let mut pong = [0u8; 4];
            tls.read_exact(&mut pong).await?;
            std::io::Result::Ok(pong)
        };
        let answer = tokio::time::timeout(Duration::from_secs(5), call).await;
        flooding.abort();
        server_task.abort();
        drop(still_open);
        match answer {
            Ok(Ok(pong)) => assert_eq!(&pong, b"pong"),
            other => panic!("the honest caller was not served: {other:?}"),
        }
    }

    #[tokio::test]
    async fn one_peer_cluster_holding_its_share_leaves_slots_for_another() {
        let dir = tempfile::tempdir().expect("tmp");
        let (server, client) = tls_pair(dir.path());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // The test's certificates all name one identity: the name a client sends stands for
        // its peer cluster here.
        let peer_of = |c: &rustls::ServerConnection| c.server_name().map(str::to_owned);
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let server_task = tokio::spawn(accept_loop(
            listener,
            server,
            peer_of,
            move |mut tls, _, _| {
                let held = held.clone();
                async move {
                    // Served: say so, and hold the slot until the test lets go.
                    let _ = tls.write_all(b"s").await;
                    let _ = tls.flush().await;
                    held.notified().await;
                }
            },
        ));
        // Whether a connection of `peer` is served (a byte), or dropped after its handshake.
        let served = |peer: &'static str| {
            let client = client.clone();
            async move {
                let tcp = connect_from(1, addr).await?;
                let mut tls = shake_hands(&client, tcp, peer).await?;
                let mut b = [0u8; 1];
                // A dropped connection ends without a TLS close: an error, not a byte.
                let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut b))
                    .await
                    .map_err(|_| std::io::Error::other("no answer"))?
                    .unwrap_or(0);
                std::io::Result::Ok((n == 1 && b == *b"s", tls))
            }
        };
        let share = MAX_CONNECTIONS / 2;
        let mut west = Vec::new();
        for i in 0..share {
            let (ok, tls) = served("west.ferry.invalid").await.expect("west");
            assert!(ok, "west's connection {i} was not served");
            west.push(tls);
        }
        let (ok, _dropped) = served("west.ferry.invalid").await.expect("west");
        assert!(!ok, "west was served beyond its share");
        let (ok, _north) = served("north.ferry.invalid").await.expect("north");
        assert!(ok, "north was kept out by west");
        release.notify_waiters();
        server_task.abort();
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
