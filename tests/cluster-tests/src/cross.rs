//! What the cross-cluster tests share: one operator process per cluster (`ferry` plays west,
//! the source; `peer` plays east, the destination), their cross-cluster APIs on loopback, a
//! Peer in each cluster naming the other with its CA certificate, and the two halves of a
//! Transfer.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, PostParams};

use crate::operator::{OperatorProcess, install_crd_and_rbac_in, prepare_nodes_in};
use crate::transfers::{MOVER_UID, make_tree};
use crate::{Cluster, TestNamespace, wait_until};

pub const HOST_ROOT: &str = "/data/ferry-xc";
pub const WEST: Cluster = Cluster::Main;
pub const EAST: Cluster = Cluster::Peer;
pub const WEST_NODE: &str = "node-a";
pub const EAST_NODE: &str = "peer-b";
pub const TIMEOUT: Duration = Duration::from_secs(180);

/// Both operators and both Peers.
pub struct Pair {
    pub west: OperatorProcess,
    pub east: OperatorProcess,
    pub west_name: String,
    pub east_name: String,
    pub west_endpoint: String,
    pub east_endpoint: String,
    pub west_ca: String,
    pub east_ca: String,
}

/// The address the operator `name` of this test process says its cross-cluster API listens on
/// (the log may hold earlier runs: only lines after this process took the lead count).
pub async fn api_address(op: &OperatorProcess, name: &str) -> anyhow::Result<String> {
    let mut found = None;
    let leading = format!("identity={name}-{}", std::process::id());
    wait_until(Duration::from_secs(60), "the cross-cluster API", || {
        let log = std::fs::read_to_string(&op.log).unwrap_or_default();
        found = log
            .lines()
            .skip_while(|l| !l.contains(&leading))
            .find(|l| l.contains("cross-cluster API listening"))
            .and_then(|l| l.split("addr=").nth(1))
            .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned());
        let ok = found.is_some();
        async move { Ok(ok) }
    })
    .await?;
    found.context("no address")
}

/// The CA certificate and the cluster name the operator of `cluster` stored in `ferry-ca`.
async fn ca_of(cluster: Cluster) -> anyhow::Result<(String, String)> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client().await?, "ferry-system");
    let mut out = None;
    wait_until(Duration::from_secs(30), "the operator's CA Secret", || {
        let secrets = secrets.clone();
        async move { Ok(secrets.get_opt("ferry-ca").await?.is_some()) }
    })
    .await?;
    if let Some(s) = secrets.get_opt("ferry-ca").await? {
        let cert = s
            .data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .context("tls.crt")?;
        let name = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("ferry.dev/cluster-name"))
            .cloned()
            .context("cluster name annotation")?;
        out = Some((cert, name));
    }
    out.context("no CA")
}

pub fn apply_peer(
    cluster: Cluster,
    name: &str,
    cluster_name: &str,
    ca: &str,
    endpoint: &str,
) -> anyhow::Result<()> {
    let manifest = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Peer",
        "metadata": {"name": name},
        "spec": {"clusterName": cluster_name, "caBundle": ca, "endpoint": endpoint},
    });
    crate::operator::apply_file(
        cluster,
        &format!("peer-{name}.json"),
        manifest.to_string().as_bytes(),
    )
}

/// Starts an operator in each cluster (`ferry-<tag>-west`, `ferry-<tag>-east`, each with a
/// Lease of that name; `east_flags` added to east's) and applies a Peer in each naming the
/// other.
pub async fn setup(tag: &str, east_flags: &[&str]) -> anyhow::Result<Pair> {
    for c in [WEST, EAST] {
        install_crd_and_rbac_in(c)?;
    }
    prepare_nodes_in(WEST, HOST_ROOT, MOVER_UID, &[WEST_NODE])?;
    prepare_nodes_in(EAST, HOST_ROOT, MOVER_UID, &[EAST_NODE])?;
    let flags = |name: &'static str| ["--cluster-name", name, "--peering-listen", "127.0.0.1:0"];
    let (west_op, east_op) = (format!("ferry-{tag}-west"), format!("ferry-{tag}-east"));
    let west =
        OperatorProcess::start_in(WEST, &west_op, HOST_ROOT, &west_op, &flags("west")).await?;
    let east_args: Vec<&str> = flags("east")
        .into_iter()
        .chain(east_flags.iter().copied())
        .collect();
    let east = OperatorProcess::start_in(EAST, &east_op, HOST_ROOT, &east_op, &east_args).await?;
    let (west_endpoint, east_endpoint) = (
        api_address(&west, &west_op).await?,
        api_address(&east, &east_op).await?,
    );
    // A CA stored earlier keeps the cluster name it was created with.
    let (west_ca, west_name) = ca_of(WEST).await?;
    let (east_ca, east_name) = ca_of(EAST).await?;
    apply_peer(WEST, "east", &east_name, &east_ca, &east_endpoint)?;
    apply_peer(EAST, "west", &west_name, &west_ca, &west_endpoint)?;
    Ok(Pair {
        west,
        east,
        west_name,
        east_name,
        west_endpoint,
        east_endpoint,
        west_ca,
        east_ca,
    })
}

/// A directory under the host root on `node` of `cluster`, owned by the movers' uid.
pub fn node_dir(
    cluster: Cluster,
    node: &str,
    ns: &str,
    name: &str,
) -> anyhow::Result<(String, PathBuf)> {
    let rel = format!("{HOST_ROOT}/{ns}/{name}");
    let on_host = cluster.node_root(node).join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(&on_host)?;
    for p in [on_host.parent().context("parent")?, &on_host] {
        std::os::unix::fs::chown(p, Some(MOVER_UID), Some(MOVER_UID))?;
    }
    Ok((rel, on_host))
}

/// The source half in west and the destination half in east, named alike.
pub fn halves(
    name: &str,
    west_ns: &str,
    east_ns: &str,
    src: &str,
    dst: serde_json::Value,
    source_extra: serde_json::Value,
) -> anyhow::Result<(Transfer, Transfer)> {
    let mut source_spec = serde_json::json!({
        "source": {"hostPath": {"node": WEST_NODE, "path": src}},
        "destination": {"remote": {"peer": "east", "namespace": east_ns, "name": name}},
    });
    if let (Some(s), Some(e)) = (source_spec.as_object_mut(), source_extra.as_object()) {
        s.extend(e.clone());
    }
    let source = crate::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name}, "spec": source_spec,
    }))?;
    let destination = crate::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name},
        "spec": {
            "source": {"remote": {"peer": "west", "namespace": west_ns, "name": name}},
            "destination": dst,
        },
    }))?;
    Ok((source, destination))
}

/// Creates both halves of `name`, the destination first: west's host directory `src` into
/// east's `dst`, with `source_extra` merged into the source half's spec.
pub async fn create_halves(
    west: &TestNamespace,
    east: &TestNamespace,
    name: &str,
    src: &str,
    dst: &str,
    source_extra: serde_json::Value,
) -> anyhow::Result<()> {
    let (source, destination) = halves(
        name,
        &west.name,
        &east.name,
        src,
        serde_json::json!({"hostPath": {"node": EAST_NODE, "path": dst}}),
        source_extra,
    )?;
    east.api::<Transfer>()
        .create(&PostParams::default(), &destination)
        .await?;
    west.api::<Transfer>()
        .create(&PostParams::default(), &source)
        .await?;
    Ok(())
}

/// A running cross-cluster Transfer of a generated tree: its namespaces and the source and
/// destination directories as seen from the host.
pub struct Crossing {
    pub west: TestNamespace,
    pub east: TestNamespace,
    pub src_host: PathBuf,
    pub dst_host: PathBuf,
}

/// Namespaces `prefix-*` in both clusters, `small` files and `large_mib` MiB under west's node,
/// and Transfer `name` of them into east's node (see [`create_halves`]).
pub async fn start_crossing(
    prefix: &str,
    name: &str,
    small: usize,
    large_mib: usize,
    source_extra: serde_json::Value,
) -> anyhow::Result<Crossing> {
    let west = TestNamespace::create_in(WEST, prefix).await?;
    let east = TestNamespace::create_in(EAST, prefix).await?;
    let (src, src_host) = node_dir(WEST, WEST_NODE, &west.name, "src")?;
    let (dst, dst_host) = node_dir(EAST, EAST_NODE, &east.name, "dst")?;
    make_tree(&src_host, small, large_mib, &west.name)?;
    create_halves(&west, &east, name, &src, &dst, source_extra).await?;
    Ok(Crossing {
        west,
        east,
        src_host,
        dst_host,
    })
}

/// Waits until Transfer `name` is `want`; fails early when it failed.
pub async fn wait_phase(api: &Api<Transfer>, name: &str, want: Phase) -> anyhow::Result<Transfer> {
    crate::transfers::wait_phase(api, name, TIMEOUT, want).await
}

pub async fn ferry_pods(api: &Api<Pod>) -> anyhow::Result<Vec<Pod>> {
    Ok(api
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator"))
        .await?
        .items)
}

/// The Ready condition's reason and message.
pub fn ready(t: &Transfer) -> (String, String) {
    t.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

pub async fn wait_reason(
    api: &Api<Transfer>,
    name: &str,
    reason: &str,
) -> anyhow::Result<Transfer> {
    let mut last = None;
    let r = wait_until(
        Duration::from_secs(60),
        &format!("{name}: reason {reason}"),
        || {
            let api = api.clone();
            let name = name.to_owned();
            async move {
                let t = api.get(&name).await?;
                Ok(ready(&t).0 == reason)
            }
        },
    )
    .await;
    if r.is_err() {
        last = api.get_opt(name).await?;
    }
    r.with_context(|| format!("last status: {:?}", last.and_then(|t| t.status)))?;
    Ok(api.get(name).await?)
}

/// The address a sender pod was told to connect to (its `--connect` argument).
pub fn connect_arg(sender: &Pod) -> String {
    let args = sender
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    args.iter()
        .skip_while(|a| *a != "--connect")
        .nth(1)
        .cloned()
        .unwrap_or_default()
}
