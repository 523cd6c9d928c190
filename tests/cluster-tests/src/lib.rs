//! Helpers for the tests that run against ferry's local cluster (`make cluster-up`): connecting,
//! one namespace per test, the images the cluster's registry holds, waiting for pods, and reading
//! container logs (through the API, as `kubectl logs`) and node disks.
//!
//! When the cluster is not reachable the helpers fail the test with a message saying how to start
//! it; they never skip.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, LogParams, PostParams};
use kube::{Api, Client};

pub mod argocd;
pub mod cross;
pub mod operator;
pub mod transfers;

/// The reference of image `name` (a stage of deploy/Dockerfile or tests/images/Dockerfile) as the
/// cluster's registry holds it: `tests/cluster/up.sh` writes them to `<state dir>/images.env`.
pub fn image(name: &str) -> String {
    let file = cluster_dir().join("images.env");
    let key = format!(
        "FERRY_IMAGE_{}=",
        name.to_ascii_uppercase().replace('-', "_")
    );
    let env = std::fs::read_to_string(&file).unwrap_or_default();
    match env.lines().find_map(|l| l.strip_prefix(&key)) {
        Some(reference) => reference.to_owned(),
        None => panic!(
            "no image {name} in {} (start the cluster with `make cluster-up`)",
            file.display()
        ),
    }
}

/// This crate's `ferry-cluster-probe` binary, FROM scratch (no shell).
pub fn probe_image() -> String {
    image("ferry-cluster-probe")
}

/// busybox's shell and utilities with socat, curl, openssl and getent, for tests that run a
/// script in a pod.
pub fn shell_image() -> String {
    image("ferry-test-tools")
}

/// The `ferry-mover` image the operator's pods run.
pub fn mover_image() -> String {
    image("ferry-mover")
}

/// One of the local clusters `tests/cluster/common.sh` defines: `ferry`, the default one most tests
/// use, or `peer`, the second one that runs beside it (`FERRY_CLUSTER=peer make cluster-up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    Main,
    Peer,
}

fn cache_dir() -> PathBuf {
    std::env::var_os("FERRY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/ferry")
        })
}

impl Cluster {
    /// Its FERRY_CLUSTER name.
    pub fn name(self) -> &'static str {
        match self {
            Cluster::Main => "ferry",
            Cluster::Peer => "peer",
        }
    }

    /// Its state directory.
    pub fn dir(self) -> PathBuf {
        match self {
            Cluster::Main => match std::env::var_os("FERRY_CLUSTER_DIR") {
                Some(dir) => PathBuf::from(dir),
                None => cache_dir().join("cluster"),
            },
            Cluster::Peer => cache_dir().join("cluster-peer"),
        }
    }

    /// Node `node`'s host filesystem.
    pub fn node_root(self, node: &str) -> PathBuf {
        self.dir().join("nodes").join(node)
    }

    /// A client for this cluster; fails with instructions when it is not up.
    pub async fn client(self) -> anyhow::Result<Client> {
        let up = match self {
            Cluster::Main => "make cluster-up".to_string(),
            Cluster::Peer => "FERRY_CLUSTER=peer make cluster-up".to_string(),
        };
        let path = self.dir().join("kubeconfig");
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).with_context(|| {
            format!(
                "the local cluster {} is not running: cannot read {} (start it with `{up}`)",
                self.name(),
                path.display()
            )
        })?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .context("failed to load the local cluster's kubeconfig")?;
        let client = Client::try_from(config).context("failed to build a client")?;
        client.apiserver_version().await.with_context(|| {
            format!(
                "the local cluster's apiserver does not answer (kubeconfig {}); start it with `{up}`",
                path.display()
            )
        })?;
        Ok(client)
    }

    /// A command running one of `tests/cluster/`'s scripts against this cluster.
    pub fn script(self, name: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../cluster")
                .join(name),
        );
        cmd.env("FERRY_CLUSTER", self.name());
        cmd
    }
}

/// The default cluster's state directory, as `tests/cluster/common.sh` defines it.
pub fn cluster_dir() -> PathBuf {
    Cluster::Main.dir()
}

/// Node `node`'s host filesystem in the default cluster.
pub fn node_root(node: &str) -> PathBuf {
    Cluster::Main.node_root(node)
}

/// A client for the default cluster; fails with instructions when it is not up.
pub async fn client() -> anyhow::Result<Client> {
    Cluster::Main.client().await
}

/// A namespace of its own for one test, with its default service account ready.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    pub async fn create(prefix: &str) -> anyhow::Result<Self> {
        Self::create_in(Cluster::Main, prefix).await
    }

    pub async fn create_in(cluster: Cluster, prefix: &str) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("{prefix}-{}-{:x}", std::process::id(), nanos & 0xffffff);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("failed to create namespace {name}"))?;
        // The service account admission plugin refuses pods until the controller made "default".
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_until(
            Duration::from_secs(30),
            "the default service account",
            || async { Ok(sas.get_opt("default").await?.is_some()) },
        )
        .await?;
        Ok(TestNamespace { client, name })
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace (its pods stop through their kubelets).
    pub async fn delete(self) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .delete(&self.name, &DeleteParams::default())
            .await
            .with_context(|| format!("failed to delete namespace {}", self.name))?;
        Ok(())
    }
}

/// Polls `check` every 200 ms until it returns true, failing after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until pod `name` satisfies `pred` and returns it; the error shows the last status seen.
pub async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pod = pods.get_opt(name).await?;
        if let Some(p) = &pod
            && pred(p)
        {
            return Ok(p.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            let status = pod
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
            bail!(
                "timed out after {timeout:?} waiting for pod {name} to be {what}; last status: {status:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// Waits for a pod to finish and fails (with its log) unless it Succeeded.
pub async fn wait_succeeded(
    pods: &Api<Pod>,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Pod> {
    let pod = wait_for_pod(pods, name, timeout, "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    if phase(&pod) != "Succeeded" {
        bail!(
            "pod {name} failed: status {:?}\nlog:\n{}",
            pod.status,
            container_log(ns, name, &first_container(&pod)).await
        );
    }
    Ok(pod)
}

fn first_container(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// A container's log from the kubelet through the API server, as `kubectl logs` reads it (empty
/// when there is none yet, or no longer).
pub async fn container_log(ns: &str, pod: &str, container: &str) -> String {
    let Ok(client) = client().await else {
        return String::new();
    };
    let params = LogParams {
        container: Some(container.to_owned()),
        ..LogParams::default()
    };
    Api::<Pod>::namespaced(client, ns)
        .logs(pod, &params)
        .await
        .unwrap_or_default()
}

/// The host pids of the processes (in any PID namespace) whose environment holds
/// `FERRY_TEST_POD=<marker>`: how a test finds its container's processes from the machine.
pub fn host_pids_with_marker(marker: &str) -> Vec<u32> {
    let wanted = format!("FERRY_TEST_POD={marker}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|entry| entry == wanted.as_bytes())
            })
        })
        .collect()
}

/// Waits until the container's log contains `needle`; returns the log.
pub async fn wait_for_log(
    ns: &str,
    pod: &str,
    container: &str,
    needle: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let log = container_log(ns, pod, container).await;
        if log.contains(needle) {
            return Ok(log);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "timed out after {timeout:?} waiting for {needle:?} in the log of {ns}/{pod}/{container}; log so far:\n{log}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates an object given as JSON in `api`.
pub async fn create<K>(api: &Api<K>, value: serde_json::Value) -> anyhow::Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = from_json(value)?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("failed to create {}", std::any::type_name::<K>()))
}

/// One `GET /` over HTTP/1.0 to `host:port` from the host; the whole reply.
pub async fn http_get(host: &str, port: u16) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .with_context(|| format!("failed to connect to {host}:{port}"))?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    Ok(reply)
}

/// Env entries the probe binary needs to know who and where it is.
pub fn downward_env() -> serde_json::Value {
    serde_json::json!([
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ])
}

/// Builds an object from JSON, naming the type that failed to parse.
pub fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> anyhow::Result<T> {
    serde_json::from_value(value).with_context(|| format!("invalid {}", std::any::type_name::<T>()))
}

/// Cuts the power of `node` of `cluster` (`tests/cluster/node.sh stop`); the node comes back
/// (`node.sh start`, returning once it is Ready) when the returned guard is dropped, also when
/// an assertion failed on the way.
pub fn power_off(cluster: Cluster, node: &'static str) -> anyhow::Result<impl Drop> {
    let stop = cluster.script("node.sh").args(["stop", node]).status()?;
    anyhow::ensure!(stop.success(), "node.sh stop {node} failed");
    Ok(on_drop(move || {
        let _ = cluster.script("node.sh").args(["start", node]).status();
    }))
}

/// Runs `f` when dropped, so a failed assertion still undoes what a test did to the cluster
/// (a stopped node is started, a capped link uncapped) for the next run.
pub fn on_drop(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// The notes of the Events (events.k8s.io) about object `name` in `ns` with `reason`.
pub async fn events_of(ns: &str, name: &str, reason: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client().await?, ns);
    Ok(events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect())
}

/// Runs `script` with sh in a pod on `node` and returns its log once it finished; fails unless it
/// exited 0.
pub async fn run_script(
    ns: &TestNamespace,
    name: &str,
    node: &str,
    script: &str,
) -> anyhow::Result<String> {
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    create(
        &pods,
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{
                    "name": "main", "image": shell_image(), "command": ["sh", "-c", script],
                }],
            }
        }),
    )
    .await?;
    wait_succeeded(&pods, &ns.name, name, std::time::Duration::from_secs(120)).await?;
    Ok(container_log(&ns.name, name, "main").await)
}
