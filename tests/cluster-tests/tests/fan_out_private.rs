//! A fan-out with `dedup: false` on the real nodes: the tenant wants none of its blocks in a
//! shared store, and still gets one copy from the source, not one per destination. Its
//! destinations pass blocks to each other through a store of their run alone at each node
//! service, which no other Transfer sees.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::TestNamespace;
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, NODE_C, SharedOperator, assert_same_tree, make_tree, wait_phase,
};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, PostParams};

const HOST_ROOT: &str = "/data/ferry-fanp";

static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-fanp", HOST_ROOT);

#[tokio::test]
async fn a_fan_out_without_dedup_sends_one_copy_and_shares_its_blocks_with_no_one_else()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_A, NODE_B, NODE_C],
    )
    .await?;
    let ns = TestNamespace::create("fanp").await?;
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    // 48 MiB of fresh content (12 full blocks) and 20 small files.
    make_tree(&src_host, 20, 48, &ns.name)?;
    let (dst, _) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "dst")?;
    let dsts: Vec<_> = [NODE_B, NODE_C]
        .iter()
        .map(|n| transfers::node_dir(HOST_ROOT, n, &ns.name, "dst").map(|(_, h)| h))
        .collect::<Result<_, _>>()?;
    let api: Api<Transfer> = ns.api();
    let fan: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fan"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"nodes": [NODE_B, NODE_C], "path": dst}},
            "dedup": false,
        }
    }))?;
    api.create(&PostParams::default(), &fan).await?;
    let t = wait_phase(&api, "fan", Duration::from_secs(240), Phase::Succeeded).await?;
    for d in &dsts {
        assert_eq!(assert_same_tree(&src_host, d)?, 21);
    }
    let st = t.status.context("status")?;
    let mut wire = 0;
    let mut shared = 0;
    for d in &st.destinations {
        let cs = api.get(&d.transfer).await?.status.context("child status")?;
        assert_eq!(cs.digest, st.digest, "{}: the source's digest", d.node);
        wire += cs.wire.context("wire")?.bytes;
        shared += d.dedup_bytes;
    }
    eprintln!(
        "dedup: false fan-out to 2 nodes: {wire} bytes from the source, {shared} between destinations"
    );
    // About one copy from the source (two before: each destination got the whole tree).
    assert!(
        wire < (48 << 20) * 13 / 10,
        "the source sent {wire} bytes for two destinations of 48 MiB"
    );
    assert!(shared >= 16 << 20, "the destinations shared {shared} bytes");

    // Nothing of the run joined a shared store: a Transfer with dedup of the same tree to a
    // node that holds it (in the run's store) takes nothing from the node's store.
    let (again, again_host) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "again")?;
    let copy: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "again"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"node": NODE_B, "path": again}},
        }
    }))?;
    api.create(&PostParams::default(), &copy).await?;
    let t = wait_phase(&api, "again", Duration::from_secs(180), Phase::Succeeded).await?;
    assert_eq!(assert_same_tree(&src_host, &again_host)?, 21);
    let w = t.status.context("status")?.wire.context("wire")?;
    assert_eq!(
        w.dedup_bytes, 0,
        "a Transfer with dedup found the private run's blocks: {w:?}"
    );
    Ok(())
}
