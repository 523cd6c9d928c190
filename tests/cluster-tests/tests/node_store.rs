//! A node's block store on that node's own PersistentVolume (the chart's
//! `nodeService.persistentVolume.perNode`) outlives its node-service pod: the pod's replacement
//! gets a new claim, which the operator binds to the same volume, and the store's blocks are
//! still there for the next Transfer to that node.
//!
//! Alone in its file: it replaces a node-service pod, which the tests of other files running at
//! the same time would see as a node without a store.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::operator::{
    STORE_CLASS, node_service_pod, store_claim_fields, wait_node_service_in,
};
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, SharedOperator, assert_same_tree, make_tree, transfer, wait_phase,
};
use ferry_cluster_tests::{Cluster, TestNamespace, wait_until};
use ferry_operator::api::{Phase, Transfer, WireStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};

const HOST_ROOT: &str = "/data/ferry-store-e2e";

static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-store", HOST_ROOT);

fn node_dir(node: &str, ns: &str, name: &str) -> anyhow::Result<(String, PathBuf)> {
    transfers::node_dir(HOST_ROOT, node, ns, name)
}

/// `node`'s node-service pod and the volume its store claim is bound to, if it is bound;
/// `None` while no pod is scheduled there.
async fn store_pod_and_volume(node: &str) -> anyhow::Result<Option<(Pod, Option<String>)>> {
    let Some(pod) = node_service_pod(node).await? else {
        return Ok(None);
    };
    let volume = store_claim_fields(&pod, "{.spec.volumeName}")?;
    Ok(Some((pod, Some(volume).filter(|v| !v.is_empty()))))
}

async fn transfer_to(
    api: &Api<Transfer>,
    name: &str,
    src: &str,
    dst: &str,
) -> anyhow::Result<WireStatus> {
    api.create(
        &PostParams::default(),
        &transfer(name, (NODE_A, src), (NODE_B, dst), serde_json::json!({}))?,
    )
    .await?;
    let t = wait_phase(api, name, Duration::from_secs(120), Phase::Succeeded).await?;
    t.status.and_then(|s| s.wire).context("no wire figures")
}

#[tokio::test]
async fn a_node_store_on_its_nodes_volume_outlives_the_node_service_pod() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    wait_node_service_in(Cluster::Main, &[NODE_B]).await?;
    let ns = TestNamespace::create("store-pv").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 3, 16, &ns.name)?;
    let api: Api<Transfer> = ns.api();

    let (first_dst, first_host) = node_dir(NODE_B, &ns.name, "first")?;
    transfer_to(&api, "first", &src, &first_dst).await?;
    assert_same_tree(&src_host, &first_host)?;
    let (old_pod, volume) = store_pod_and_volume(NODE_B)
        .await?
        .context("no node-service pod on node-b")?;
    let volume = volume.context("node-b's store claim is not bound")?;
    assert_eq!(
        volume,
        format!("{STORE_CLASS}-{NODE_B}"),
        "node-b's store is not on the volume offered for node-b"
    );

    // Replaced, as a DaemonSet upgrade or an eviction replaces it: its claim goes with it.
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), "ferry-system");
    let replaced = std::time::Instant::now();
    pods.delete(&old_pod.name_any(), &DeleteParams::default())
        .await?;
    let old_uid = old_pod.uid();
    wait_until(
        Duration::from_secs(120),
        "a new node-service pod on node-b with its claim bound",
        || {
            let old_uid = old_uid.clone();
            async move {
                // The new pod is scheduled once its claim is bound (the class binds on first use).
                Ok(store_pod_and_volume(NODE_B)
                    .await?
                    .is_some_and(|(pod, bound)| pod.uid() != old_uid && bound.is_some()))
            }
        },
    )
    .await?;
    wait_node_service_in(Cluster::Main, &[NODE_B]).await?;
    eprintln!(
        "node-b's node service ready again on its store volume {:.1} s after its pod was deleted",
        replaced.elapsed().as_secs_f64()
    );
    let (new_pod, again) = store_pod_and_volume(NODE_B)
        .await?
        .context("no node-service pod on node-b")?;
    assert_ne!(new_pod.uid(), old_uid);
    assert_eq!(
        again.as_deref(),
        Some(volume.as_str()),
        "the new pod's claim was bound to another volume"
    );

    // The same data again to node-b: every block comes from the store the old pod filled.
    let (second_dst, second_host) = node_dir(NODE_B, &ns.name, "second")?;
    let wire = transfer_to(&api, "second", &src, &second_dst).await?;
    assert_same_tree(&src_host, &second_host)?;
    assert_eq!(wire.dedup_blocks, 4, "16 MiB in 4 MiB blocks: {wire:?}");
    assert_eq!(wire.dedup_bytes, 16 << 20, "{wire:?}");
    ns.delete().await
}
