use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use ferry_operator::config::{Config, HostRootGrant};
use ferry_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};

/// ferry's Kubernetes operator: reconciles Transfers (ferry.dev/v1alpha1) into mover pods.
#[derive(Parser, Debug)]
#[command(name = "ferry-operator", version, about)]
struct Cli {
    /// Name of this cluster (written into every certificate the operator issues).
    #[arg(long, env = "FERRY_CLUSTER_NAME", default_value = "local")]
    cluster_name: String,
    /// The operator's own namespace (its CA Secret lives there).
    #[arg(long, env = "POD_NAMESPACE", default_value = "ferry-system")]
    namespace: String,
    /// Image of the mover pods (the default names no registry: set the one you pushed to).
    #[arg(
        long,
        env = "FERRY_MOVER_IMAGE",
        default_value = ferry_operator::config::DEFAULT_MOVER_IMAGE
    )]
    mover_image: String,
    /// Image pull Secret of the mover pods (repeatable). Pods can only use Secrets of their own
    /// namespace: each Transfer's namespace must hold one of this name.
    #[arg(long = "mover-image-pull-secret")]
    mover_image_pull_secrets: Vec<String>,
    /// uid, gid and fsGroup of the mover pods.
    #[arg(long, default_value_t = 65532)]
    mover_uid: i64,
    /// Let Transfers with preserveOwnership run root movers.
    #[arg(long)]
    allow_root_movers: bool,
    /// Let Transfers with readAllFiles run a sender with CAP_DAC_READ_SEARCH (reads any file,
    /// writes nothing).
    #[arg(long)]
    allow_privileged_readers: bool,
    /// NAMESPACE=/ROOT[:ro]: namespace (or `*`) may use host paths under ROOT (`{namespace}` in
    /// ROOT is the Transfer's namespace; `:ro` for sources only). Repeatable.
    #[arg(long = "host-root", value_parser = HostRootGrant::parse)]
    host_roots: Vec<HostRootGrant>,
    /// HOST:PORT of the node block store services (the chart's `ferry-node` DaemonSet and its
    /// node-local Service); default `ferry-node.<--namespace>.svc:7443`; empty turns dedup off.
    #[arg(long)]
    block_service: Option<String>,
    /// Pre-bind each node-service pod's store claim to its node's PersistentVolume labelled
    /// ferry.dev/node-store (the chart's nodeService.persistentVolume.perNode), so a node keeps
    /// its store when its pod is replaced. Needs the ferry-operator-node-store ClusterRole.
    #[arg(long)]
    node_store_volumes: bool,
    /// Most Transfers with running movers at once (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_active: usize,
    /// Most Transfers with running movers on one node at once (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_active_per_node: usize,
    /// Most Transfers of one namespace with running movers at once (0: no limit), so that one
    /// namespace cannot take every slot of --max-active.
    #[arg(long, default_value_t = 0)]
    max_active_per_namespace: usize,
    /// Progress status patches per second for the whole operator; each running Transfer's
    /// progress is written less often as more run (changes of state are never held back).
    #[arg(long, default_value_t = ferry_operator::status::DEFAULT_PATCH_QPS)]
    status_patch_qps: f64,
    /// Most mover progress streams read at once (beyond it, outcomes come from the pods).
    #[arg(long, default_value_t = 1000)]
    max_progress_watchers: usize,
    /// Seconds the other half of a cross-cluster Transfer may stay silent (unreachable, 429,
    /// 503) before this half stops its mover; counted from this operator's start at the
    /// earliest.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..))]
    peer_silence_grace: u64,
    /// Seconds a mover pod may stay pending (unschedulable, image not pulled, volume not
    /// mounted) before its attempt fails and is retried with backoff.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..))]
    mover_pending_timeout: u64,
    /// Tolerations of every mover pod unless its Transfer sets its own (JSON list, as in a pod
    /// spec; GPU nodes are usually tainted).
    #[arg(long, value_parser = parse_json::<Vec<Toleration>>)]
    mover_tolerations: Option<Vec<Toleration>>,
    /// Resources of every mover container unless its Transfer sets its own (JSON, as in a
    /// container spec).
    #[arg(long, value_parser = parse_json::<ResourceRequirements>)]
    mover_resources: Option<ResourceRequirements>,
    /// Priority class of mover pods unless the Transfer sets one.
    #[arg(long)]
    mover_priority_class: Option<String>,
    /// Priority classes a Transfer may choose in spec.mover.priorityClassName besides the
    /// default (repeatable); any other is refused (PriorityClassNotAllowed).
    #[arg(long = "allowed-priority-class")]
    allowed_priority_classes: Vec<String>,
    /// Extra label of every mover pod (KEY=VALUE, repeatable).
    #[arg(long = "mover-label", value_parser = parse_label)]
    mover_labels: Vec<(String, String)>,
    /// Streams of Transfers that set none (1-16).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    default_streams: u32,
    /// Compression of Transfers that set none: auto, zstd, lz4 or none.
    #[arg(long, default_value = "auto", value_parser = parse_compression)]
    default_compression: ferry_operator::api::Compression,
    /// Days a mover certificate stays valid.
    #[arg(long, default_value_t = 2)]
    cert_days: u32,
    /// Ports of the movers' data and progress listeners.
    #[arg(long, default_value_t = 7400)]
    data_port: u16,
    #[arg(long, default_value_t = 7401)]
    progress_port: u16,
    /// Keep a NetworkPolicy beside each Transfer that admits only ferry's own traffic to its
    /// movers (needs RBAC on networkpolicies).
    #[arg(long)]
    network_policies: bool,
    /// An address block (CIDR) the movers' NetworkPolicy admits to their progress port besides
    /// the operator's namespace, for an operator running outside the cluster (repeatable).
    #[arg(long = "network-policy-peer", value_parser = parse_cidr)]
    network_policy_peers: Vec<String>,
    /// Address of the cross-cluster API (mutual TLS, callers authenticated by the CA bundles
    /// of this cluster's Peers); unset: no other cluster can pair with this one's Transfers.
    #[arg(long, env = "FERRY_PEERING_LISTEN")]
    peering_listen: Option<SocketAddr>,
    /// Service type in front of a cross-cluster destination's receiver.
    #[arg(long, default_value = "NodePort", value_parser = ["NodePort", "LoadBalancer"])]
    peering_service_type: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Name of the leader-election Lease in the operator's namespace.
    #[arg(long, default_value = "ferry-operator")]
    leader_election_id: String,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// The Helm pre-delete hook: fails while Transfers exist (their finalizer needs a running
    /// operator), or with --delete-transfers deletes them all and waits until they are gone.
    PreUninstall {
        /// Delete every Transfer instead of refusing.
        #[arg(long)]
        delete_transfers: bool,
        /// How long to wait for the operator to clean up the deleted Transfers.
        #[arg(long, default_value_t = 300)]
        timeout_seconds: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
    if let Some(Command::PreUninstall {
        delete_transfers,
        timeout_seconds,
    }) = cli.command
    {
        return pre_uninstall(delete_transfers, timeout_seconds);
    }
    let block_service = match cli.block_service {
        None => Some(format!("ferry-node.{}.svc:7443", cli.namespace)),
        Some(a) if a.is_empty() => None,
        Some(a) => Some(a),
    };
    let config = Config {
        cluster_name: cli.cluster_name,
        namespace: cli.namespace,
        mover_image: cli.mover_image,
        mover_image_pull_secrets: cli.mover_image_pull_secrets,
        mover_uid: cli.mover_uid,
        allow_root_movers: cli.allow_root_movers,
        host_roots: cli.host_roots,
        allow_privileged_readers: cli.allow_privileged_readers,
        block_service,
        node_store_volumes: cli.node_store_volumes,
        max_active: cli.max_active,
        max_active_per_node: cli.max_active_per_node,
        max_active_per_namespace: cli.max_active_per_namespace,
        allowed_priority_classes: cli.allowed_priority_classes,
        mover_pending_timeout: std::time::Duration::from_secs(cli.mover_pending_timeout),
        default_tolerations: cli.mover_tolerations.unwrap_or_default(),
        default_resources: cli.mover_resources,
        default_priority_class: cli.mover_priority_class,
        extra_labels: cli.mover_labels.into_iter().collect(),
        cert_days: cli.cert_days,
        data_port: cli.data_port,
        progress_port: cli.progress_port,
        network_policies: cli.network_policies,
        network_policy_peers: cli.network_policy_peers,
        default_streams: cli.default_streams,
        default_compression: cli.default_compression,
        peering_listen: cli.peering_listen,
        peering_service_type: cli.peering_service_type,
        status_patch_qps: cli.status_patch_qps,
        max_progress_watchers: cli.max_progress_watchers,
        peer_silence_grace: std::time::Duration::from_secs(cli.peer_silence_grace),
    };
    let rt = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::default());
        let listener = tokio::net::TcpListener::bind(cli.metrics_addr)
            .await
            .with_context(|| format!("failed to bind the metrics address {}", cli.metrics_addr))?;
        tracing::info!("metrics and health on {}", listener.local_addr()?);
        tokio::spawn(ferry_proto::exposition::serve(listener, metrics.clone()));
        // Every API request of this process is counted in ferry_api_requests_total.
        let client = ferry_operator::api_metrics::client(metrics.clone())
            .await
            .context("failed to configure the Kubernetes client (in-cluster or KUBECONFIG)")?;
        // Say who this process is to the apiserver: a stray kubeconfig must not pass for the
        // operator's own, least-privilege identity.
        let who = ferry_operator::whoami(&client).await?;
        tracing::info!(user = %who, "authenticated");
        // Ready means able to serve: a standby replica is ready to take over the Lease.
        metrics.set_ready(true);
        let identity = std::env::var("POD_NAME")
            .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
        let elector = ferry_operator::leader::Elector::new(
            client.clone(),
            &config.namespace,
            &cli.leader_election_id,
            &identity,
        );
        if config.peering_listen.is_some() {
            ferry_operator::peering::leader::mark_own_pod(&client, &config.namespace, false).await;
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let acquired = tokio::select! {
            at = elector.acquire() => at,
            _ = stopped(stop_rx.clone()) => return Ok(()),
        };
        let shutdown = stopped(stop_rx.clone());
        let result = tokio::select! {
            r = ferry_operator::reconcile::run(client, config, metrics, shutdown) => r,
            _ = elector.hold(acquired) => Err(anyhow::anyhow!("lost the leader-election Lease")),
        };
        elector.release().await;
        result
    })
}

fn pre_uninstall(delete_transfers: bool, timeout_seconds: u64) -> anyhow::Result<()> {
    use ferry_operator::uninstall::{Policy, run};
    let policy = if delete_transfers {
        Policy::DeleteAll
    } else {
        Policy::Refuse
    };
    let rt = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    let outcome = rt.block_on(async move {
        // The hook serves no /metrics: its counts go nowhere, but it talks to the API server
        // through the same client stack as the operator.
        let client = ferry_operator::api_metrics::client(Arc::new(Metrics::default()))
            .await
            .context("failed to configure the Kubernetes client (in-cluster or KUBECONFIG)")?;
        run(
            client,
            policy,
            std::time::Duration::from_secs(timeout_seconds),
        )
        .await
    })?;
    println!("{outcome}");
    Ok(())
}

fn parse_json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_str(s).map_err(|e| format!("invalid JSON: {e}"))
}

fn parse_compression(s: &str) -> Result<ferry_operator::api::Compression, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("{s:?}: expected auto, zstd, lz4 or none"))
}

/// A CIDR as a NetworkPolicy's ipBlock takes it (an address, `/`, a prefix length).
fn parse_cidr(s: &str) -> Result<String, String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a CIDR (ADDRESS/PREFIX)"))?;
    let addr: std::net::IpAddr = addr
        .parse()
        .map_err(|e| format!("{s:?} is not a CIDR: {e}"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    match len.parse::<u8>() {
        Ok(n) if n <= max => Ok(s.to_owned()),
        _ => Err(format!(
            "{s:?} is not a CIDR: prefix length must be 0 to {max}"
        )),
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    if k.is_empty() || k.starts_with("ferry.dev/") {
        return Err(format!("{s:?}: the key must be set and not in ferry.dev/"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "ferry-operator".into())
}
