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
    /// Comma-separated names of the nodes this agent simulates.
    #[arg(long, default_value = "node-a,node-b", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Address pods use to reach the apiserver (KUBERNETES_SERVICE_HOST).
    #[arg(long, default_value = "127.0.0.1")]
    apiserver_host: String,
    /// Port pods use to reach the apiserver (KUBERNETES_SERVICE_PORT).
    #[arg(long, default_value_t = 6443)]
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
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
        nodes: args.nodes,
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
