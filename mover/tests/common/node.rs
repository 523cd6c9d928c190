//! The node service on 127.0.0.1 with real TLS and a real store, and raw clients of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ferry_mover::net::{self, Identity, Role};
use ferry_mover::node::client::NodeStoreClient;
use ferry_mover::node::{self, NodeServiceConfig};
use ferry_mover::session::Shutdown;
use ferry_proto::blockstore::v1 as pb;
use ferry_proto::blockstore::v1::block_store_client::BlockStoreClient;

use super::Pki;

pub const CLUSTER: &str = "test";

pub struct NodeService {
    pub addr: SocketAddr,
    pub store: PathBuf,
    _dir: tempfile::TempDir,
    _stop: ferry_mover::session::ShutdownTrigger,
}

/// Writes `ca.crt`, and a node service's `node.crt` and `node.key` issued by `ca`, into `dir`.
pub fn write_node_certs(ca: &net::Ca, dir: &std::path::Path) {
    let (cert, key) = ca
        .issue_for(&Identity::node_service(CLUSTER).unwrap())
        .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.cert_pem()).unwrap();
    std::fs::write(dir.join("node.crt"), cert).unwrap();
    std::fs::write(dir.join("node.key"), key).unwrap();
}

/// The node service as its own process (`ferry-mover node serve`, so its memory is its own),
/// on a fresh store, with certificates from `ca`.
pub struct ServiceProcess {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl ServiceProcess {
    pub fn start(ca: &net::Ca) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_node_certs(ca, dir.path());
        let p = |n: &str| dir.path().join(n);
        let mut child = std::process::Command::new(super::BIN)
            .args(["node", "serve", "--listen", "127.0.0.1:0", "--cap", "1Gi"])
            .arg("--store")
            .arg(p("cas"))
            .arg("--ca")
            .arg(p("ca.crt"))
            .arg("--cert")
            .arg(p("node.crt"))
            .arg("--key")
            .arg(p("node.key"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (addr, _) = super::bound_addr(&mut child);
        Self {
            child,
            addr: addr.parse().unwrap_or_else(|_| panic!("{addr:?}")),
            _dir: dir,
        }
    }

    /// Peak resident memory so far, in MiB.
    pub fn peak_mib(&self) -> u64 {
        super::proc_status_kib(self.child.id(), "VmHWM").unwrap() / 1024
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node service with certificates from `ca`, its store capped at `cap` bytes.
pub async fn start_node_service(ca: &net::Ca, cap: u64) -> NodeService {
    start_node_service_in(ca, cap, node::DedupDomain::Cluster).await
}

/// As [`start_node_service`], keeping tenants' blocks apart by `domain`.
pub async fn start_node_service_in(
    ca: &net::Ca,
    cap: u64,
    domain: node::DedupDomain,
) -> NodeService {
    let dir = tempfile::tempdir().unwrap();
    write_node_certs(ca, dir.path());
    let store = dir.path().join("cas");
    let cfg = NodeServiceConfig {
        store: store.clone(),
        cap_bytes: cap,
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        ca: dir.path().join("ca.crt"),
        cert: dir.path().join("node.crt"),
        key: dir.path().join("node.key"),
        gc_every: Duration::from_secs(3600),
        node: "node-a".into(),
        fsync: false,
        dedup_domain: domain,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, shutdown) = Shutdown::new();
    tokio::spawn(async move { node::serve(cfg, listener, shutdown).await.unwrap() });
    NodeService {
        addr,
        store,
        _dir: dir,
        _stop: stop,
    }
}

pub async fn client_for(pki: &Pki, svc: &NodeService) -> NodeStoreClient {
    NodeStoreClient::connect(&svc.addr.to_string(), &pki.files(Role::Receiver))
        .await
        .unwrap()
}

/// A raw gRPC client presenting `role`'s certificate of `pki` (the node service's rules apply).
pub async fn raw_client(
    pki: &Pki,
    role: Role,
    svc: &NodeService,
) -> Result<BlockStoreClient<tonic::transport::Channel>, String> {
    let files = pki.files(role);
    let tls = std::sync::Arc::new(net::node_client_config(&files).unwrap());
    let channel = net::tls_channel(svc.addr, tls, |e| e)
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(BlockStoreClient::new(channel)
        .max_decoding_message_size(node::MAX_MESSAGE)
        .max_encoding_message_size(node::MAX_MESSAGE))
}

/// The store's figures, as the operator reads them (receivers are not served them).
pub async fn operator_stats(pki: &Pki, svc: &NodeService) -> pb::StoreStats {
    let mut c = raw_client(pki, Role::Operator, svc).await.unwrap();
    c.stats(pb::StatsRequest {}).await.unwrap().into_inner()
}

/// Whether `c` is served (an empty Take: every client the service admits may make one).
pub async fn served(
    c: &mut BlockStoreClient<tonic::transport::Channel>,
) -> Result<(), tonic::Status> {
    let mut s = c
        .take(pb::TakeRequest {
            pop_key: vec![0; 32],
            blocks: Vec::new(),
            wait_ms: 0,
            pieces: true,
        })
        .await?
        .into_inner();
    while s.message().await?.is_some() {}
    Ok(())
}
