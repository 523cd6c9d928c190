//! Running `ferry-operator` against the local cluster as a user would: CRD and RBAC applied from
//! the repository, the operator started as a process under its own service account (a token
//! kubeconfig, so a permission missing from `deploy/rbac.yaml` fails the tests), its identity
//! checked through the apiserver.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::{Cluster, cluster_dir, wait_until};

/// The operator's service account, as `deploy/rbac.yaml` creates it.
pub const OPERATOR_USER: &str = "system:serviceaccount:ferry-system:ferry-operator";

/// A binary of the workspace build (`make build`).
pub fn workspace_bin(name: &str) -> anyhow::Result<PathBuf> {
    // target/<profile>/deps/<test binary> -> target/<profile>/<name>
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("test binary has no target directory")?;
    let bin = dir.join(name);
    if !bin.exists() {
        bail!("{} is missing: run `make build` first", bin.display());
    }
    Ok(bin)
}

/// A tool built by `make k8s-bin` (kubectl, helm).
pub fn k8s_tool(name: &str) -> anyhow::Result<PathBuf> {
    let cache = cluster_dir()
        .parent()
        .map(Path::to_path_buf)
        .context("no cache dir")?;
    for entry in std::fs::read_dir(&cache)? {
        let p = entry?.path().join("bin").join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "{name} not found under {}/k8s-*/bin: run `make k8s-bin`",
        cache.display()
    )
}

/// Runs kubectl as the cluster admin; fails with its output unless it succeeds.
pub fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    kubectl_in(Cluster::Main, args)
}

/// Runs kubectl as `cluster`'s admin.
pub fn kubectl_in(cluster: Cluster, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(k8s_tool("kubectl")?)
        .args(args)
        .env("KUBECONFIG", cluster.dir().join("kubeconfig"))
        .output()
        .context("failed to run kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn repo_file(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Applies the CRDs and the RBAC from the repository and waits until the CRDs are served.
pub fn install_crd_and_rbac() -> anyhow::Result<()> {
    install_crd_and_rbac_in(Cluster::Main)
}

pub fn install_crd_and_rbac_in(cluster: Cluster) -> anyhow::Result<()> {
    for file in [
        "crds/ferry.dev_transfers.yaml",
        "crds/ferry.dev_peers.yaml",
        "deploy/rbac.yaml",
        "deploy/rbac-node-store.yaml",
    ] {
        kubectl_in(cluster, &["apply", "--server-side", "-f", &repo_file(file)])?;
    }
    install_node_service_in(cluster)?;
    kubectl_in(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "crd/transfers.ferry.dev",
            "crd/peers.ferry.dev",
            "--timeout=60s",
        ],
    )?;
    Ok(())
}

/// The node service as the chart renders it (the `ferry-node` DaemonSet and its node-local
/// Service) with the cluster's mover image. Its certificate Secret comes from the operator, so
/// its pods start once an operator ran; [`wait_node_service_in`] waits for them.
fn install_node_service_in(cluster: Cluster) -> anyhow::Result<()> {
    let image = crate::mover_image();
    let (repo, tag) = image
        .rsplit_once(':')
        .context("the mover image has no tag")?;
    let registry = repo
        .strip_suffix("/ferry-mover")
        .context("the mover image is not <registry>/ferry-mover")?;
    let out = Command::new(k8s_tool("helm")?)
        .args(["template", "ferry", &repo_file("charts/ferry")])
        .args(["--namespace", "ferry-system"])
        .args(["--show-only", "templates/node-service.yaml"])
        // The node services admit receivers and the operator only; the tests' operator runs
        // on the host, outside the cluster.
        .args(["--show-only", "templates/networkpolicy.yaml"])
        .args(["--set-json", &format!(r#"networkPolicy.extraFrom=["{HOST_CIDR}"]"#)])
        .args(["--set-string", &format!("imageRegistry={registry}")])
        .args(["--set-string", &format!("moverImage.tag={tag}")])
        .args(["--set-string", &format!("image.tag={tag}")])
        .args(["--set", "nodeService.capacity=4Gi"])
        // Each store on its node's own PersistentVolume, kept when the pod is replaced, so the
        // tests cover the claim path; the chart's default (hostPath) runs in the install test.
        .args(["--set", "nodeService.persistentVolume.enabled=true"])
        .args(["--set", "nodeService.persistentVolume.perNode=true"])
        .args([
            "--set",
            &format!("nodeService.persistentVolume.storageClassName={STORE_CLASS}"),
        ])
        // On node-x too, so a fan-out can lose a destination node and its service.
        .args([
            "--set-json",
            r#"nodeService.tolerations=[{"key":"ferry.dev/disruptive","operator":"Exists","effect":"NoSchedule"}]"#,
        ])
        .output()
        .context("failed to run helm template")?;
    if !out.status.success() {
        bail!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    offer_store_volumes(cluster)?;
    apply_file(cluster, "node-service.yaml", &out.stdout)
}

/// The address the host (where the tests' operators run) has towards the local clusters'
/// nodes and pods (tests/cluster/net.sh).
pub const HOST_CIDR: &str = "10.99.0.1/32";

/// The StorageClass of the node stores' volumes in the local clusters.
pub const STORE_CLASS: &str = "ferry-node-store";
/// Where each node's store volume is, on that node's own disk.
pub const STORE_VOLUME_PATH: &str = "/mnt/disks/ferry-store";

/// One local PersistentVolume per node of `cluster` offered to the node stores (labelled
/// `ferry.dev/node-store`, kept when released), as an admin provides them.
fn offer_store_volumes(cluster: Cluster) -> anyhow::Result<()> {
    let nodes = kubectl_in(
        cluster,
        &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
    )?;
    let mut docs = vec![serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    })];
    for node in nodes.split_whitespace() {
        std::fs::create_dir_all(
            cluster
                .node_root(node)
                .join(STORE_VOLUME_PATH.trim_start_matches('/')),
        )?;
        docs.push(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("{STORE_CLASS}-{node}"), "labels": {"ferry.dev/node-store": "true"}},
            "spec": {
                "capacity": {"storage": "4Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORE_CLASS,
                "local": {"path": STORE_VOLUME_PATH},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                ]}]}},
            },
        }));
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    apply_file(
        cluster,
        "node-store-volumes.json",
        &serde_json::to_vec(&list)?,
    )
}

/// Writes `manifest` to `name` in the cluster's directory and applies it server-side (taking
/// over fields another manager set).
pub fn apply_file(cluster: Cluster, name: &str, manifest: &[u8]) -> anyhow::Result<()> {
    let file = cluster.dir().join(name);
    std::fs::write(&file, manifest)?;
    kubectl_in(
        cluster,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.display().to_string(),
        ],
    )?;
    Ok(())
}

/// Waits until the node service is ready, with the current mover image, on each of `nodes` of
/// `cluster` (its certificate Secret exists once an operator of the cluster ran).
pub async fn wait_node_service_in(cluster: Cluster, nodes: &[&str]) -> anyhow::Result<()> {
    let image = crate::mover_image();
    let nodes: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
    crate::wait_until(
        Duration::from_secs(180),
        "the node service to be ready on the nodes",
        || {
            let (image, nodes) = (image.clone(), nodes.clone());
            async move {
                let out = kubectl_in(
                    cluster,
                    &[
                        "-n",
                        "ferry-system",
                        "get",
                        "pods",
                        "-l",
                        "app.kubernetes.io/component=node-service",
                        "-o",
                        "json",
                    ],
                )?;
                let pods: serde_json::Value = serde_json::from_str(&out)?;
                let ready_on = |node: &str| {
                    pods["items"].as_array().into_iter().flatten().any(|p| {
                        p["spec"]["nodeName"] == node
                            && p["metadata"]["deletionTimestamp"].is_null()
                            && p["spec"]["containers"][0]["image"] == image.as_str()
                            && p["status"]["conditions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                };
                Ok(nodes.iter().all(|n| ready_on(n)))
            }
        },
    )
    .await
}

/// The node-service pod scheduled on `node` of the main cluster and not going away, if any.
pub async fn node_service_pod(node: &str) -> anyhow::Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(crate::client().await?, "ferry-system");
    Ok(pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=node-service"))
        .await?
        .items
        .into_iter()
        .find(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
        }))
}

/// The fields `jsonpath` selects of the claim that holds `pod`'s block store (a node-service
/// pod's `store` ephemeral volume, named after the pod).
pub fn store_claim_fields(pod: &Pod, jsonpath: &str) -> anyhow::Result<String> {
    let claim = format!("{}-store", kube::ResourceExt::name_any(pod));
    kubectl(&[
        "-n",
        "ferry-system",
        "get",
        "pvc",
        &claim,
        "-o",
        &format!("jsonpath={jsonpath}"),
    ])
}

/// A kubeconfig that authenticates as the operator's service account (a bound token), written by
/// the script the benchmarks use too.
fn operator_kubeconfig(cluster: Cluster, path: &Path) -> anyhow::Result<()> {
    let out = Command::new(repo_file("tests/cluster/sa-kubeconfig.sh"))
        .args(["ferry-system", "ferry-operator"])
        .arg(path)
        .args(["4h"])
        .env("FERRY_CLUSTER_DIR", cluster.dir())
        .output()
        .context("failed to run tests/cluster/sa-kubeconfig.sh")?;
    if !out.status.success() {
        bail!(
            "tests/cluster/sa-kubeconfig.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Host directories the operator's movers write: under `host_root` on every node, owned by
/// the movers' uid (as an admin prepares them on a real node).
pub fn prepare_nodes(host_root: &str, uid: u32, nodes: &[&str]) -> anyhow::Result<()> {
    prepare_nodes_in(Cluster::Main, host_root, uid, nodes)
}

pub fn prepare_nodes_in(
    cluster: Cluster,
    host_root: &str,
    uid: u32,
    nodes: &[&str],
) -> anyhow::Result<()> {
    for node in nodes {
        for dir in ["", "cas"] {
            let p = cluster
                .node_root(node)
                .join(host_root.trim_start_matches('/'))
                .join(dir);
            std::fs::create_dir_all(&p)?;
            std::os::unix::fs::chown(&p, Some(uid), Some(uid))?;
        }
    }
    Ok(())
}

/// A running operator process; it dies with the test process.
pub struct OperatorProcess {
    pub pid: u32,
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts the operator under its service account, granting `host_root` to every namespace,
    /// with leader-election Lease `lease`; returns once it authenticated as that account.
    pub async fn start(name: &str, host_root: &str, lease: &str) -> anyhow::Result<Self> {
        Self::start_in(Cluster::Main, name, host_root, lease, &[]).await
    }

    /// Starts it against `cluster`, with `extra` flags.
    pub async fn start_in(
        cluster: Cluster,
        name: &str,
        host_root: &str,
        lease: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let kubeconfig = cluster.dir().join(format!("{name}.kubeconfig"));
        operator_kubeconfig(cluster, &kubeconfig)?;
        let log = cluster.dir().join("logs").join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut cmd = Command::new(workspace_bin("ferry-operator")?);
        // A test may name its own mover image (one that does not exist, say).
        if !extra.contains(&"--mover-image") {
            cmd.args(["--mover-image", &crate::mover_image()]);
        }
        cmd.args([
            "--node-store-volumes",
            "--network-policies",
            "--network-policy-peer",
            HOST_CIDR,
            "--namespace",
            "ferry-system",
            "--host-root",
            &format!("*={host_root}"),
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election-id",
            lease,
        ])
        .args(extra)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info,ferry_operator=debug")
        .env("POD_NAME", format!("{name}-{}", std::process::id()))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
        // SAFETY: prctl in the child before exec only sets the parent-death signal.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        // The parent-death signal fires when the spawning *thread* ends, so a thread that lives
        // as long as the operator spawns it and waits on it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id()));
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
        let pid = rx.recv()?.context("failed to start ferry-operator")?;
        let op = OperatorProcess { pid, log };
        let expected = format!("user={OPERATOR_USER}");
        wait_until(
            Duration::from_secs(30),
            "the operator to authenticate",
            || {
                let found = std::fs::read_to_string(&op.log)
                    .unwrap_or_default()
                    .contains(&expected);
                async move { Ok(found) }
            },
        )
        .await
        .with_context(|| {
            format!(
                "operator log:\n{}",
                std::fs::read_to_string(&op.log).unwrap_or_default()
            )
        })?;
        Ok(op)
    }

    /// SIGKILL, as a node failure or an OOM kill would end it.
    pub fn kill(&self) {
        // SAFETY: kill(2) with a pid this test started.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
    }
}
