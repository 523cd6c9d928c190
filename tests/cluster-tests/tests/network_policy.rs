//! ferry's NetworkPolicies on a cluster that enforces them (kube-network-policies on every local
//! node): a tenant's pod is refused at the network by the node services' block port and by a
//! running Transfer's movers, while ferry's own traffic (sender to receiver, receiver to its node
//! service, the operator to both) still flows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, NODE_C, SharedOperator, assert_same_tree, make_tree, wait_phase,
};
use ferry_cluster_tests::*;
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use serde_json::json;

const HOST_ROOT: &str = "/data/ferry-netpol";

static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-netpol", HOST_ROOT);

/// Tries a TCP connection to each `(what, address)` from a plain pod of `ns` on `node` and returns
/// what it saw: `what open` or `what closed` per line.
async fn reach_from_tenant(
    ns: &TestNamespace,
    name: &str,
    node: &str,
    targets: &[(&str, String)],
) -> anyhow::Result<String> {
    // A dropped SYN gives up after 3 s; a connection that opens is closed after 1 s of quiet.
    let mut script = String::from(
        "try() { if socat -T1 /dev/null \"TCP:$2,connect-timeout=3\" 2>/dev/null; \
         then echo \"$1 open\"; else echo \"$1 closed\"; fi; }\n",
    );
    for (what, addr) in targets {
        script.push_str(&format!("try {what} {addr}\n"));
    }
    run_script(ns, name, node, &script).await
}

fn assert_saw(log: &str, what: &str, state: &str) {
    assert!(
        log.lines().any(|l| l == format!("{what} {state}")),
        "expected {what} {state}; the tenant's pod saw:\n{log}"
    );
}

#[tokio::test]
async fn a_tenant_pod_is_refused_at_the_network_and_ferrys_own_traffic_flows() -> anyhow::Result<()>
{
    OPERATOR.ensure().await?;
    operator::wait_node_service_in(Cluster::Main, &[NODE_A, NODE_B, NODE_C]).await?;
    let ns = TestNamespace::create("netpol").await?;

    // The node services: the block port is for receivers and the operator; the metrics port for
    // anyone (the chart's default), which shows the refusal is the policy's, not the network's.
    let service_b = pod_ip(
        &operator::node_service_pod(NODE_B)
            .await?
            .context("service")?,
    );
    let service_c = pod_ip(
        &operator::node_service_pod(NODE_C)
            .await?
            .context("service")?,
    );
    let log = reach_from_tenant(
        &ns,
        "tenant-services",
        NODE_C,
        &[
            ("other-node-blocks", format!("{service_b}:7443")),
            ("other-node-metrics", format!("{service_b}:9091")),
            ("own-node-blocks", format!("{service_c}:7443")),
            ("own-node-metrics", format!("{service_c}:9091")),
        ],
    )
    .await?;
    assert_saw(&log, "other-node-blocks", "closed");
    assert_saw(&log, "own-node-blocks", "closed");
    assert_saw(&log, "other-node-metrics", "open");
    assert_saw(&log, "own-node-metrics", "open");

    // A Transfer with dedup, slowed so that its movers are there to be tried.
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 10, 24, &ns.name)?;
    let (dst, dst_host) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();
    let copy = |name: &str, dst: &str, limit: Option<&str>| {
        let mut spec = json!({
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"node": NODE_B, "path": dst}},
            "dedup": true,
        });
        if let Some(l) = limit {
            spec["bandwidthLimit"] = json!(l);
        }
        json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
               "metadata": {"name": name}, "spec": spec})
    };
    let t = create(&api, copy("slow", &dst, Some("1Mi"))).await?;
    let uid = t.metadata.uid.clone().context("uid")?;
    let pods = ns.api::<Pod>();
    let receiver = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let listed = pods
                .list(&ListParams::default().labels("ferry.dev/role=receiver"))
                .await?;
            if let Some(p) = listed
                .items
                .into_iter()
                .find(|p| phase(p) == "Running" && !pod_ip(p).is_empty())
            {
                break p;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no running receiver after 120 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let policy = ns
        .api::<NetworkPolicy>()
        .get(&format!("ferry-movers-{uid}"))
        .await?;
    assert_eq!(
        policy.metadata.owner_references.context("owner")?[0].uid,
        uid,
        "the policy goes with its Transfer"
    );
    let ip = pod_ip(&receiver);
    let log = reach_from_tenant(
        &ns,
        "tenant-movers",
        NODE_C,
        &[
            ("receiver-data", format!("{ip}:7400")),
            ("receiver-progress", format!("{ip}:7401")),
        ],
    )
    .await?;
    assert_saw(&log, "receiver-data", "closed");
    assert_saw(&log, "receiver-progress", "closed");
    let done = wait_phase(&api, "slow", Duration::from_secs(240), Phase::Succeeded).await?;
    assert_eq!(assert_same_tree(&src_host, &dst_host)?, 11);
    assert!(
        done.status
            .as_ref()
            .and_then(|s| s.progress.as_ref())
            .is_some(),
        "the operator read the movers' progress through their policy"
    );

    // The receiver put its blocks into its node's store through the service's policy: a copy
    // of the same tree to the same node takes them from there.
    let (again, again_host) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "again")?;
    create(&api, copy("again", &again, None)).await?;
    let t = wait_phase(&api, "again", Duration::from_secs(240), Phase::Succeeded).await?;
    assert_eq!(assert_same_tree(&src_host, &again_host)?, 11);
    let wire = t.status.and_then(|s| s.wire).context("wire")?;
    assert!(
        wire.dedup_bytes >= 16 << 20,
        "the second copy took {} bytes from the node's store",
        wire.dedup_bytes
    );
    Ok(())
}
