//! The node agent: a kubelet stand-in that registers simulated Nodes and runs their pods as local
//! processes (see `tests/README.md`). One module per job:
//! - [`node`]: Node registration, Ready condition and Lease heartbeats;
//! - [`pods`]: watches the pods bound to a node and gives each one a [`runner`];
//! - [`runner`]: one pod's lifecycle (start, restart policy, probes, status, deletion);
//! - [`kubelet_api`]: the container log endpoint `kubectl logs` reaches through the apiserver;
//! - [`volumes`], [`env`], [`images`], [`process`], [`probes`], [`status`], [`podip`], [`podnet`],
//!   [`sandbox`]:
//!   the pieces a runner puts together.
//!
//! One agent simulates one node and runs inside that node's network namespace.

pub mod env;
pub mod images;
pub mod kubelet_api;
pub mod node;
pub mod podip;
pub mod podnet;
pub mod pods;
pub mod probes;
pub mod process;
pub mod runner;
pub mod sandbox;
pub mod status;
pub mod volumes;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

/// Everything the agent needs to know about its cluster.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub cluster_dir: PathBuf,
    pub node: String,
    /// The node's address, pod range and how its pods' networks are built.
    pub network: podnet::NodeNetwork,
    /// Where the kubelet API (container logs) listens on the node's address; 0 = not served.
    pub kubelet_port: u16,
    /// The kubelet API's serving certificate and key (PEM files).
    pub kubelet_tls: Option<(PathBuf, PathBuf)>,
    /// The containers running now, for the log endpoint's `follow`.
    pub running: kubelet_api::Running,
    pub apiserver_host: String,
    pub apiserver_port: u16,
    /// Image -> local binary (and the image's declared user).
    pub images: images::Catalog,
    /// The cluster CA, handed to pods as `ca.crt` of their service account token volume.
    pub ca_file: PathBuf,
}

impl AgentConfig {
    /// Node `node`'s host filesystem: hostPath `/x` on that node is `<this>/x`.
    pub fn node_root(&self, node: &str) -> PathBuf {
        self.cluster_dir.join("nodes").join(node)
    }

    /// Where a container's log goes: `logs/<namespace>_<pod>_<container>.log`.
    pub fn log_file(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        self.cluster_dir
            .join("logs")
            .join(format!("{namespace}_{pod}_{container}.log"))
    }

    /// Files naming the process group of each running container, so `down.sh` can kill leftovers.
    pub fn run_dir(&self) -> PathBuf {
        self.cluster_dir.join("run")
    }
}

/// Maps `path` (absolute, as a pod spec names it) under `root`, refusing `..` so nothing resolves
/// outside `root`.
pub fn path_under(root: &Path, path: &str) -> Option<PathBuf> {
    let mut out = root.to_path_buf();
    for part in Path::new(path).components() {
        match part {
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::RootDir | std::path::Component::CurDir => {}
            std::path::Component::ParentDir | std::path::Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Runs the agent until SIGTERM or SIGINT: registers the node, then runs its pods. On shutdown
/// every pod process is stopped.
pub async fn run_agent(client: kube::Client, config: AgentConfig) -> anyhow::Result<()> {
    for dir in [config.cluster_dir.join("logs"), config.run_dir()] {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let config = Arc::new(config);
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    // Pod namespaces of an earlier run of this node hold nothing this agent adopts.
    config.network.remove_stale().await;
    if config.kubelet_port != 0 {
        let (cert, key) = config
            .kubelet_tls
            .clone()
            .context("the kubelet API needs --kubelet-cert and --kubelet-key")?;
        let read =
            |p: &Path| std::fs::read(p).with_context(|| format!("failed to read {}", p.display()));
        let tls = kubelet_api::server_config(&read(&cert)?, &read(&key)?, &read(&config.ca_file)?)
            .context("invalid kubelet API certificates")?;
        let addr = std::net::SocketAddr::from((config.network.node_ip, config.kubelet_port));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr} for the kubelet API"))?;
        tokio::spawn(kubelet_api::serve(
            listener,
            Arc::new(tls),
            config.cluster_dir.join("logs"),
            config.running.clone(),
        ));
    }
    let name = &config.node;
    let node = Arc::new(node::NodeIdentity {
        name: name.clone(),
        ip: config.network.node_ip,
        pod_range: config.network.range,
        kubelet_port: config.kubelet_port,
    });
    node::register(&client, &node)
        .await
        .with_context(|| format!("failed to register node {name}"))?;
    tasks.spawn(node::heartbeat(
        client.clone(),
        node.clone(),
        shutdown_rx.clone(),
    ));
    tasks.spawn(pods::run_node_pods(
        client.clone(),
        config.clone(),
        node,
        shutdown_rx.clone(),
    ));
    tracing::info!(node = %name, "node registered");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("failed to install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping pods"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping pods"),
        Some(res) = tasks.join_next() => {
            tracing::error!(?res, "a node task ended unexpectedly; stopping");
        }
    }
    let _ = shutdown_tx.send(true);
    // Pod runners stop their processes when they see the shutdown; give them the time to.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(15), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_under_maps_absolute_paths_and_refuses_parent_components() {
        let root = Path::new("/c/nodes/node-a");
        assert_eq!(
            path_under(root, "/data/x").unwrap(),
            PathBuf::from("/c/nodes/node-a/data/x")
        );
        assert_eq!(path_under(root, "/").unwrap(), root.to_path_buf());
        assert!(path_under(root, "/data/../../etc").is_none());
    }
}
