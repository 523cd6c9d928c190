//! The node service's process: opens the store with its cap, serves it, picks up a renewed
//! certificate, and collects garbage on its own schedule.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use ferry_proto::blockstore::v1::block_store_server::BlockStoreServer;

use super::MAX_MESSAGE;
use super::counters::ServiceCounters;
use super::gate::GateLayer;
use super::metrics::ScanCache;
use super::service::BlockStoreService;
use super::shares::Shares;
use super::stores::{DedupDomain, RUN_STORE_IDLE, Stores};
use super::waiters::Waiters;
use crate::cas::{CasOptions, CasStore};
use crate::net::{self, AcceptLimits, NODE_SERVICE_ID, Role};

/// How often the certificate files are read again (a Secret volume is updated in place by the
/// kubelet within about a minute of the operator renewing it).
const RELOAD_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct NodeServiceConfig {
    pub store: PathBuf,
    pub cap_bytes: u64,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub gc_every: Duration,
    /// The node's name, in metrics and `Stats`.
    pub node: String,
    pub fsync: bool,
    /// How tenants' blocks are kept apart ([`DedupDomain`]).
    pub dedup_domain: DedupDomain,
}

fn server_tls(cfg: &NodeServiceConfig) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let files = net::load_files(&cfg.ca, &cfg.cert, &cfg.key, NODE_SERVICE_ID, Role::Node)?;
    Ok(Arc::new(net::node_server_config(&files)?))
}

/// Serves on `listener` until `shutdown` fires.
pub async fn serve(
    cfg: NodeServiceConfig,
    listener: tokio::net::TcpListener,
    shutdown: crate::session::Shutdown,
) -> anyhow::Result<()> {
    let opts = CasOptions {
        cap_bytes: Some(cfg.cap_bytes),
        fsync: cfg.fsync,
    };
    let store = {
        let (dir, opts) = (cfg.store.clone(), opts.clone());
        tokio::task::spawn_blocking(move || CasStore::open_with(&dir, opts))
            .await?
            .with_context(|| format!("failed to open the block store {}", cfg.store.display()))?
    };
    let store = Arc::new(store);
    let stores = Arc::new(Stores::new(
        store.clone(),
        cfg.store.clone(),
        opts,
        cfg.dedup_domain,
    ));
    let tls = Arc::new(RwLock::new(server_tls(&cfg)?));
    let counters = Arc::new(ServiceCounters::default());
    let scans = Arc::new(ScanCache::default());
    tracing::info!(
        node = %cfg.node, listen = %listener.local_addr()?, store = %cfg.store.display(),
        cap_bytes = cfg.cap_bytes, dedup_domain = ?cfg.dedup_domain,
        "node service serving its block store"
    );
    if let Some(addr) = cfg.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr} (metrics)"))?;
        let exposed = super::metrics::NodeExposition {
            node: cfg.node.clone(),
            store: store.clone(),
            counters: counters.clone(),
            scans: scans.clone(),
        };
        tokio::spawn(ferry_proto::exposition::serve(l, Arc::new(exposed)));
    }
    tokio::spawn(reload_tls(cfg.clone(), tls.clone()));
    tokio::spawn(collect_garbage(
        stores.clone(),
        counters.clone(),
        cfg.gc_every,
    ));

    let current = tls.clone();
    let incoming = net::tls_incoming(
        listener,
        move || current.read().unwrap_or_else(|e| e.into_inner()).clone(),
        "block store",
        AcceptLimits::default().within_fd_limit(),
    );
    let shares = Arc::new(Shares::default());
    let service = BlockStoreServer::new(BlockStoreService {
        stores,
        counters,
        scans,
        node: cfg.node.clone(),
        shares: shares.clone(),
        waiters: Arc::new(Waiters::default()),
    })
    .max_decoding_message_size(MAX_MESSAGE)
    .max_encoding_message_size(MAX_MESSAGE);
    tonic::transport::Server::builder()
        // What a client may send before the service reads it: the windows bound the memory a
        // connection's unread Puts take (a Put's body is read only once it has its turn).
        // Puts come from receivers on this node, so small windows cost no speed.
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        // One receiver's streams share a connection; this bounds what one connection keeps busy.
        .max_concurrent_streams(Some(STREAMS_PER_CONNECTION))
        .concurrency_limit_per_connection(STREAMS_PER_CONNECTION as usize)
        // A client that is gone (or answers no ping) loses its connection and what it held.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .layer(GateLayer(shares))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.wait().await;
        })
        .await
        .context("node service failed")
}

/// HTTP/2 receive windows of the service, per stream and per connection: one block and its
/// framing, so an honest Put needs no window update on its way (windows of 1 and 2 MiB made the
/// Put path 1.11x slower in an interleaved A/B), and what Puts waiting at the gate can park in
/// memory is one block per connection.
const STREAM_WINDOW: u32 = (4 << 20) + (64 << 10);
const CONNECTION_WINDOW: u32 = STREAM_WINDOW;
/// Requests open at once on one connection.
const STREAMS_PER_CONNECTION: u32 = 16;

async fn reload_tls(cfg: NodeServiceConfig, tls: Arc<RwLock<Arc<rustls::ServerConfig>>>) {
    loop {
        tokio::time::sleep(RELOAD_EVERY).await;
        match server_tls(&cfg) {
            Ok(fresh) => *tls.write().unwrap_or_else(|e| e.into_inner()) = fresh,
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "could not reload the node service's certificate; keeping the current one"
            ),
        }
    }
}

/// Every `every`: each open store down to its cap, and the stores of runs idle for an hour go.
async fn collect_garbage(stores: Arc<Stores>, counters: Arc<ServiceCounters>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let idle = stores.clone();
        match tokio::task::spawn_blocking(move || idle.remove_idle_runs(RUN_STORE_IDLE)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(runs = n, "removed the stores of runs idle for an hour"),
            Err(e) => tracing::warn!(error = %e, "removing idle run stores panicked"),
        }
        for s in stores.all() {
            collect_one(&s, &counters).await;
        }
    }
}

async fn collect_one(store: &Arc<CasStore>, counters: &ServiceCounters) {
    {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.gc(None)).await {
            Ok(Ok(report)) => {
                counters
                    .evicted
                    .fetch_add(report.blocks_evicted, Ordering::Relaxed);
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                counters.last_gc_unix.store(now, Ordering::Relaxed);
                tracing::info!(
                    evicted = report.blocks_evicted,
                    bytes_after = report.bytes_after,
                    temps = report.stale_temps_removed,
                    leases = report.expired_leases_removed,
                    "scheduled garbage collection"
                );
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "scheduled garbage collection failed"),
            Err(e) => tracing::warn!(error = %e, "scheduled garbage collection panicked"),
        }
    }
}
