//! `ferry-node-agent`: a kubelet stand-in for ferry's local test cluster. It registers simulated Nodes
//! and runs the pods the real scheduler binds to them as local processes.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use ferry_node_agent::{AgentConfig, run_agent};

/// Registers simulated Nodes and runs their pods as local processes.
#[derive(Debug, Parser)]
#[command(name = "ferry-node-agent", version)]
struct Args {
    /// Kubeconfig with rights to nodes, leases, pods, pods/status and the objects pods reference.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// The cluster's state directory: node N's host filesystem is `<dir>/nodes/N`, logs in `<dir>/logs`.
    #[arg(long, env = "FERRY_CLUSTER_DIR")]
    cluster_dir: PathBuf,
    /// The name of the node this agent simulates.
    #[arg(long)]
    node: String,
    /// The node's network namespace (a file under /run/netns): the agent joins it before anything
    /// else, so its probes and API calls travel the node's network.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// The node's address on the cluster's node network (its InternalIP).
    #[arg(long)]
    node_ip: std::net::Ipv4Addr,
    /// The node's pod range, a /24; `.1` is the pods' gateway.
    #[arg(long)]
    pod_cidr: String,
    /// Pod network namespaces are named `<prefix>-<uid>`; leftovers with the prefix are removed at start.
    #[arg(long)]
    pod_netns_prefix: String,
    /// The cluster DNS Service's address for pods' resolv.conf (dnsPolicy ClusterFirst).
    #[arg(long)]
    cluster_dns: Option<std::net::Ipv4Addr>,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The kubelet API port (container logs for `kubectl logs`) on the node's address; 0 = off.
    #[arg(long, default_value_t = 0)]
    kubelet_port: u16,
    /// The kubelet API's serving certificate (PEM), signed by the cluster CA for the node's IP.
    #[arg(long)]
    kubelet_cert: Option<PathBuf>,
    #[arg(long)]
    kubelet_key: Option<PathBuf>,
    /// Address pods use to reach the apiserver (KUBERNETES_SERVICE_HOST): the kubernetes Service.
    #[arg(long)]
    apiserver_host: String,
    /// Port pods use to reach the apiserver (KUBERNETES_SERVICE_PORT).
    #[arg(long, default_value_t = 443)]
    apiserver_port: u16,
    /// Directory holding locally built binaries: an image whose repository's last component is NAME
    /// runs `<bin-dir>/NAME` when that file exists. Defaults to this agent's own directory.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Extra image mappings `REPOSITORY_SUFFIX=PATH`, checked before --bin-dir.
    #[arg(long = "image", value_parser = parse_image_mapping)]
    images: Vec<(String, PathBuf)>,
    /// A Dockerfile whose stages (`FROM ... AS NAME`) declare the images NAME: their pods run the
    /// stage's ENTRYPOINT binary as its USER, as a container runtime would.
    #[arg(long)]
    dockerfile: Option<PathBuf>,
}

fn parse_image_mapping(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("image mapping {s:?} is not REPOSITORY_SUFFIX=PATH"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Joins the network namespace at `path`. Called before the runtime starts: setns changes only the
/// calling thread, and every thread the runtime creates later inherits it.
fn join_netns(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(path)
        .with_context(|| format!("failed to open network namespace {}", path.display()))?;
    // SAFETY: setns(2) on a namespace file descriptor we hold open; no memory is involved.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("failed to join network namespace {}", path.display()));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.netns {
        join_netns(path)?;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let bin_dir = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .context("failed to locate the agent's own executable")?
            .parent()
            .context("the agent's executable has no parent directory")?
            .to_path_buf(),
    };
    let declared = match &args.dockerfile {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("failed to read {}", path.display()))?;
            ferry_node_agent::images::parse_dockerfile(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Default::default(),
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("failed to read kubeconfig {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("failed to load the kubeconfig")?;
    let client = kube::Client::try_from(config).context("failed to build the Kubernetes client")?;
    let cluster_dir = std::path::absolute(&args.cluster_dir).with_context(|| {
        format!(
            "failed to resolve cluster dir {}",
            args.cluster_dir.display()
        )
    })?;
    let agent = AgentConfig {
        ca_file: cluster_dir.join("pki/ca.crt"),
        cluster_dir,
        node: args.node,
        network: ferry_node_agent::podnet::NodeNetwork {
            node_ip: args.node_ip,
            range: ferry_node_agent::podip::PodRange::parse(&args.pod_cidr)
                .map_err(anyhow::Error::msg)?,
            netns_prefix: args.pod_netns_prefix,
            dns: args.cluster_dns,
            cluster_domain: args.cluster_domain,
        },
        kubelet_port: args.kubelet_port,
        kubelet_tls: args.kubelet_cert.zip(args.kubelet_key),
        running: Default::default(),
        apiserver_host: args.apiserver_host,
        apiserver_port: args.apiserver_port,
        images: ferry_node_agent::images::Catalog {
            overrides: args.images,
            bin_dir,
            declared,
        },
    };
    run_agent(client, agent).await
}
