//! `ferry-mover node serve|prepare`: the node service of the `ferry-node` DaemonSet.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::node::{self, NodeServiceConfig};

#[derive(clap::Subcommand, Debug)]
pub enum NodeCommand {
    /// Serve this node's block store to the receivers on it (mutual TLS; clients must hold a
    /// receiver certificate of this cluster).
    Serve(ServeArgs),
    /// Create the store directory and give it to the service's uid and gid (run as root, once,
    /// before `serve`).
    Prepare {
        dir: PathBuf,
        #[arg(long, default_value_t = 65532)]
        uid: u32,
        #[arg(long, default_value_t = 65532)]
        gid: u32,
    },
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The store directory.
    #[arg(long)]
    pub store: PathBuf,
    /// The store never grows past this many bytes (least recently used unpinned blocks go).
    #[arg(long, value_parser = parse_cap)]
    pub cap: u64,
    #[arg(long, default_value = "0.0.0.0:7443")]
    pub listen: SocketAddr,
    /// Prometheus metrics and /healthz (plain HTTP).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// The operator's CA (clients must chain to it).
    #[arg(long)]
    pub ca: PathBuf,
    /// This service's certificate (role `node`) and key, read again every minute.
    #[arg(long)]
    pub cert: PathBuf,
    #[arg(long)]
    pub key: PathBuf,
    /// Seconds between scheduled garbage collections (evict to the cap, remove dead writers'
    /// temps and leases).
    #[arg(long, default_value_t = 600)]
    pub gc_interval: u64,
    /// This node's name (metrics, `kubectl ferry nodes`).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub node: String,
    /// fsync each block before publishing it.
    #[arg(long)]
    pub sync: bool,
    /// One store for the whole cluster (`cluster`: the most hits) or one per namespace
    /// (`namespace`: tenants learn nothing of each other's data), on the same volume; each
    /// namespace's store is capped at `--cap`.
    #[arg(long, value_enum, default_value = "cluster")]
    pub dedup_domain: crate::node::DedupDomain,
}

/// The service allocates and frees 4 MiB block buffers on many threads. glibc's malloc raises
/// its mmap threshold past such a buffer after the first is freed and from then on keeps them in
/// per-thread arenas it seldom returns, so the process's memory would grow with the number of
/// threads that ever held a block, past the pod's limit. A fixed threshold keeps every buffer of
/// 1 MiB or more mapped on its own and unmapped when freed.
fn return_block_buffers_to_the_system() {
    const THRESHOLD: libc::c_int = 1 << 20;
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread starts.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
    if ok != 1 {
        tracing::warn!(
            "could not set the allocator's mmap threshold; memory may grow with threads"
        );
    }
}

/// Binds, prints the bound address as the first line on stdout (as `receive` does, so a
/// harness can listen on port 0), and serves until SIGTERM or SIGINT.
async fn serve(cfg: NodeServiceConfig) -> anyhow::Result<()> {
    use std::io::Write as _;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("failed to listen on {}", cfg.listen))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", listener.local_addr()?)?;
        out.flush()?;
    }
    node::serve(cfg, listener, crate::session::Shutdown::on_signals()?).await
}

/// A cap as a Kubernetes quantity (`20Gi`) or plain bytes.
fn parse_cap(s: &str) -> Result<u64, String> {
    crate::quantity::parse_quantity(s)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is not a positive byte quantity (for example 20Gi)"))
}

pub fn run(cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Prepare { dir, uid, gid } => {
            let changed = node::prepare::prepare(&dir, uid, gid)?;
            if changed.is_empty() {
                tracing::info!(dir = %dir.display(), "block store directory already prepared");
            }
            for c in changed {
                tracing::info!(dir = %dir.display(), "{c}");
            }
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Serve(a) => {
            let cfg = NodeServiceConfig {
                store: a.store,
                cap_bytes: a.cap,
                listen: a.listen,
                metrics_listen: a.metrics_listen,
                ca: a.ca,
                cert: a.cert,
                key: a.key,
                gc_every: Duration::from_secs(a.gc_interval.max(1)),
                node: a.node,
                fsync: a.sync,
                dedup_domain: a.dedup_domain,
            };
            return_block_buffers_to_the_system();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("failed to start the async runtime")?
                .block_on(serve(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
