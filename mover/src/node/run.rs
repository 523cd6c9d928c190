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
use super::metrics::ScanCache;
use super::service::{BlockStoreService, ServiceCounters};
use crate::cas::{CasOptions, CasStore};
use crate::net::{self, NODE_SERVICE_ID, Role};

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
    let store = {
        let (dir, opts) = (
            cfg.store.clone(),
            CasOptions {
                cap_bytes: Some(cfg.cap_bytes),
                fsync: cfg.fsync,
            },
        );
        tokio::task::spawn_blocking(move || CasStore::open_with(&dir, opts))
            .await?
            .with_context(|| format!("failed to open the block store {}", cfg.store.display()))?
    };
    let store = Arc::new(store);
    let tls = Arc::new(RwLock::new(server_tls(&cfg)?));
    let counters = Arc::new(ServiceCounters::default());
    let scans = Arc::new(ScanCache::default());
    tracing::info!(
        node = %cfg.node, listen = %listener.local_addr()?, store = %cfg.store.display(),
        cap_bytes = cfg.cap_bytes, "node service serving its block store"
    );
    if let Some(addr) = cfg.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr} (metrics)"))?;
        tokio::spawn(super::metrics::serve(
            l,
            cfg.node.clone(),
            store.clone(),
            counters.clone(),
            scans.clone(),
        ));
    }
    tokio::spawn(reload_tls(cfg.clone(), tls.clone()));
    tokio::spawn(collect_garbage(
        store.clone(),
        counters.clone(),
        cfg.gc_every,
    ));

    let current = tls.clone();
    let incoming = net::tls_incoming(
        listener,
        move || current.read().unwrap_or_else(|e| e.into_inner()).clone(),
        "block store",
    );
    let service = BlockStoreServer::new(BlockStoreService {
        store,
        counters,
        scans,
        node: cfg.node.clone(),
        readers: Arc::new(tokio::sync::Semaphore::new(
            super::service::MAX_CONCURRENT_TAKES,
        )),
        waiters: Arc::new(tokio::sync::Semaphore::new(
            super::service::MAX_WAITING_TAKES,
        )),
        outgoing: Arc::new(tokio::sync::Semaphore::new(
            super::service::MAX_OUTGOING_BLOCKS,
        )),
    })
    .max_decoding_message_size(MAX_MESSAGE)
    .max_encoding_message_size(MAX_MESSAGE);
    tonic::transport::Server::builder()
        // A block is 4 MiB: HTTP/2's default 64 KiB window would stall it on every round trip.
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        // One receiver's streams share a connection; this bounds what one client keeps busy.
        .concurrency_limit_per_connection(16)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.wait().await;
        })
        .await
        .context("node service failed")
}

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

async fn collect_garbage(store: Arc<CasStore>, counters: Arc<ServiceCounters>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
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
