//! A fan-out under the operator's per-node limit on the real nodes. Every child's sender runs on
//! the source node, so `--max-active-per-node 1` runs the children one at a time: the first
//! must not wait for the share of a sibling that is queued behind it, and the next must take
//! the whole tree from the store of the one that finished instead of from the source.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::TestNamespace;
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, SharedOperator, assert_same_tree, make_tree, wait_phase,
};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, PostParams};

const HOST_ROOT: &str = "/data/ferry-fanq";

static OPERATOR: SharedOperator = SharedOperator::with_flags(
    "ferry-operator-fanq",
    HOST_ROOT,
    &["--max-active-per-node", "1"],
);

#[tokio::test]
async fn a_fan_out_run_one_node_at_a_time_sends_one_copy_from_the_source() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_A, NODE_B],
    )
    .await?;
    let ns = TestNamespace::create("fanq").await?;
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    // 50 MiB of fresh content (12 full blocks and a 2 MiB tail) and 20 small files.
    make_tree(&src_host, 20, 50, &ns.name)?;
    let (dst, dst_a) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "dst")?;
    let (_, dst_b) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();
    let fan: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fan"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"nodes": [NODE_A, NODE_B], "path": dst}},
        }
    }))?;
    api.create(&PostParams::default(), &fan).await?;
    let t = wait_phase(&api, "fan", Duration::from_secs(240), Phase::Succeeded).await?;
    for d in [&dst_a, &dst_b] {
        assert_eq!(assert_same_tree(&src_host, d)?, 21);
    }
    let st = t.status.context("status")?;
    let mut children = Vec::new();
    for d in &st.destinations {
        let cs = api.get(&d.transfer).await?.status.context("child status")?;
        assert_eq!(cs.digest, st.digest, "{}: the source's digest", d.node);
        let span = (
            cs.start_time.context("startTime")?.0,
            cs.completion_time.context("completionTime")?.0,
        );
        children.push((
            d.node.clone(),
            span,
            cs.wire.context("wire")?.bytes,
            d.dedup_bytes,
        ));
    }
    children.sort_by_key(|c| c.1.0);
    let [first, second] = &children[..] else {
        anyhow::bail!("two children expected: {children:?}");
    };
    eprintln!(
        "children (node, (start, done), bytes from the source, bytes from stores): {children:?}"
    );
    // The limit held: the second started once the first was done.
    assert!(
        second.1.0 >= first.1.1,
        "the children overlapped under --max-active-per-node 1: {children:?}"
    );
    // The first did not wait for the queued sibling's share (`--swarm-wait` is 120 s): it asked
    // the source for everything at once.
    let first_took = first.1.1.duration_since(first.1.0);
    assert!(
        first_took.as_secs() < 100,
        "the first destination took {first_took:?}"
    );
    // The second took every block of at least 1 MiB from the first one's store, so the source
    // sent one copy in all (two without the holder, one and a half before siblings in the
    // queue owned nothing).
    assert!(
        second.3 >= 50 << 20,
        "the second destination took {} bytes from stores",
        second.3
    );
    let wire = first.2 + second.2;
    assert!(
        wire < (50 << 20) * 11 / 10,
        "the source sent {wire} bytes for two destinations of 50 MiB"
    );
    Ok(())
}
