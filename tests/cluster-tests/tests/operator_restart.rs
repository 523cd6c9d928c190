//! The operator killed (SIGKILL) in the middle of a Transfer and started again: the movers keep
//! going, the new operator takes the Lease over, finds the movers by their names, and the status
//! converges; no second set of movers is ever created.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::operator::{OperatorProcess, install_crd_and_rbac, prepare_nodes};
use ferry_cluster_tests::{TestNamespace, node_root, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

const HOST_ROOT: &str = "/data/ferry-e2e-restart";
const MOVER_UID: u32 = 65532;

#[tokio::test]
async fn a_killed_operator_is_replaced_and_the_transfer_completes_once() -> anyhow::Result<()> {
    install_crd_and_rbac()?;
    prepare_nodes(HOST_ROOT, MOVER_UID, &["node-a", "node-b"])?;
    let lease = "ferry-operator-restart";
    let first = OperatorProcess::start("ferry-operator-restart", HOST_ROOT, lease).await?;
    let ns = TestNamespace::create("xfer-restart").await?;
    let src_host = node_root("node-a").join(format!("{}/{}/src", &HOST_ROOT[1..], ns.name));
    let dst = format!("{HOST_ROOT}/{}/dst", ns.name);
    let dst_host = node_root("node-b").join(&dst[1..]);
    std::fs::create_dir_all(&src_host)?;
    std::fs::create_dir_all(&dst_host)?;
    for d in [src_host.parent().context("parent")?, &dst_host] {
        std::os::unix::fs::chown(d, Some(MOVER_UID), Some(MOVER_UID))?;
    }
    let body: Vec<u8> = (0..(64u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(src_host.join("data.bin"), &body)?;
    let api: Api<Transfer> = ns.api();
    let t: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "survivor"},
        "spec": {
            "source": {"hostPath": {"node": "node-a", "path": format!("{HOST_ROOT}/{}/src", ns.name)}},
            "destination": {"hostPath": {"node": "node-b", "path": dst}},
            "bandwidthLimit": "4Mi", "compression": "none", "dedup": false,
        }
    }))?;
    api.create(&PostParams::default(), &t).await?;
    wait_until(Duration::from_secs(60), "data flowing", || {
        let api = api.clone();
        async move {
            let t = api.get("survivor").await?;
            Ok(t.status
                .and_then(|s| s.progress)
                .is_some_and(|p| p.bytes_done > 4 << 20))
        }
    })
    .await?;
    first.kill();
    let _second = OperatorProcess::start("ferry-operator-restart", HOST_ROOT, lease).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let st = loop {
        let st = api.get("survivor").await?.status.unwrap_or_default();
        match st.phase {
            Phase::Succeeded => break st,
            Phase::Failed => bail!("failed: {st:?}"),
            _ if tokio::time::Instant::now() >= deadline => bail!("timed out: {st:?}"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(st.attempts, 1, "the movers were replaced: {st:?}");
    let p = st.progress.context("progress")?;
    assert_eq!((p.percent, p.bytes_done), (100, 64 << 20), "{p:?}");
    let pods: Api<Pod> = ns.api();
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(
        names.len(),
        2,
        "exactly one receiver and one sender: {names:?}"
    );
    let copy = dst_host.join("data.bin");
    assert_eq!(std::fs::metadata(&copy)?.size(), 64 << 20);
    assert!(std::fs::read(&copy)? == body, "content differs");
    ns.delete().await
}
