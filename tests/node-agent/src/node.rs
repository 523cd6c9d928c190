//! Node registration and heartbeats: the Node object with capacity and a Ready condition (so the real
//! scheduler binds pods to it) and the Lease in `kube-node-lease` the node lifecycle controller watches.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// How often the node renews its Lease and Ready condition (the kubelet default is 10 s).
const HEARTBEAT: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("failed to create Node {node}")]
    Create {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to update the status of Node {node}")]
    Status {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to renew the Lease of Node {node}")]
    Lease {
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// One simulated node: its name, its address on the cluster's node network and its pod range.
#[derive(Debug)]
pub struct NodeIdentity {
    pub name: String,
    pub ip: Ipv4Addr,
    pub pod_range: crate::podip::PodRange,
    /// The port of the kubelet API (container logs) on the node's address; 0 when not served.
    pub kubelet_port: u16,
}

fn resources() -> std::collections::BTreeMap<String, Quantity> {
    [
        ("cpu", "8"),
        ("memory", "16Gi"),
        ("pods", "110"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect()
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

fn node_status(node: &NodeIdentity) -> NodeStatus {
    let now = Time(Timestamp::now());
    NodeStatus {
        capacity: Some(resources()),
        allocatable: Some(resources()),
        conditions: Some(vec![
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "ferry node agent is posting ready status",
                &now,
            ),
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "ok",
                &now,
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "ok",
                &now,
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "ok",
                &now,
            ),
        ]),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: node.ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: node.name.clone(),
            },
        ]),
        daemon_endpoints: (node.kubelet_port != 0).then(|| NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(node.kubelet_port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
            boot_id: format!("ferry-{}", node.name),
            container_runtime_version: "ferry-node-agent://0.1.0".into(),
            kernel_version: String::new(),
            kube_proxy_version: String::new(),
            kubelet_version: "v1.35.4".into(),
            machine_id: format!("ferry-{}", node.name),
            operating_system: "linux".into(),
            os_image: "ferry simulated node".into(),
            system_uuid: format!("ferry-{}", node.name),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates the Node (or takes over an existing one of the same name) and posts a Ready status.
pub async fn register(client: &Client, node: &NodeIdentity) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let labels = [
        ("kubernetes.io/hostname", node.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("ferry.dev/simulated-node", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cidr = node.pod_range.to_string();
    let object = Node {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        // The pod range is fixed per node (the harness routes it), as with a CNI's static ranges.
        spec: Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            ..Default::default()
        }),
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(source) => {
            return Err(NodeError::Create {
                node: node.name.clone(),
                source,
            });
        }
    }
    post_status(client, node).await?;
    renew_lease(client, node).await
}

async fn post_status(client: &Client, node: &NodeIdentity) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "status": node_status(node) });
    nodes
        .patch_status(
            &node.name,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .map_err(|source| NodeError::Status {
            node: node.name.clone(),
            source,
        })?;
    Ok(())
}

async fn renew_lease(client: &Client, node: &NodeIdentity) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let err = |source| NodeError::Lease {
        node: node.name.clone(),
        source,
    };
    // The Lease is owned by its Node, like the kubelet's, so it goes away with the Node.
    let owner = nodes.get(&node.name).await.map_err(err)?;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            namespace: Some("kube-node-lease".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.name.clone(),
                uid: owner.metadata.uid.unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.name.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let params = PatchParams::apply("ferry-node-agent").force();
    leases
        .patch(&node.name, &params, &Patch::Apply(&lease))
        .await
        .map_err(err)?;
    Ok(())
}

/// Renews the node's Lease and Ready condition every [`HEARTBEAT`] until shutdown. A failed round is
/// logged and retried at the next tick: a short apiserver hiccup must not take the node down.
pub async fn heartbeat(
    client: Client,
    node: std::sync::Arc<NodeIdentity>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = post_status(&client, &node).await {
            tracing::warn!(node = %node.name, error = %anyhow::Error::from(e), "heartbeat failed");
        }
        if let Err(e) = renew_lease(&client, &node).await {
            tracing::warn!(node = %node.name, error = %anyhow::Error::from(e), "lease renewal failed");
        }
    }
}
