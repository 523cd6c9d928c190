//! The operator end to end on the local cluster: Transfers applied through the API, movers run
//! as pods on the real nodes, data checked on the nodes' disks.
//!
//! One `ferry-operator` process serves every test of this file (as one operator serves a
//! cluster); it runs on the host with the cluster's kubeconfig and dies with the test process.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::operator::kubectl;
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, NODE_C, NODE_E, NODE_X, SharedOperator, assert_same_tree, make_tree,
    transfer, wait_phase,
};
use ferry_cluster_tests::{TestNamespace, node_root, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// Host roots the test operator grants (to every namespace).
const HOST_ROOT: &str = "/data/ferry-e2e";

/// The operator every test of this file shares.
static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-e2e", HOST_ROOT);

async fn ensure_operator() -> anyhow::Result<()> {
    OPERATOR.ensure().await
}

fn node_dir(node: &str, ns: &str, name: &str) -> anyhow::Result<(String, PathBuf)> {
    transfers::node_dir(HOST_ROOT, node, ns, name)
}

async fn mover_pods(ns: &TestNamespace) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = ns.api();
    Ok(pods
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator"))
        .await?
        .items)
}

#[tokio::test]
async fn host_path_to_host_path_on_two_nodes_succeeds_with_status_and_events() -> anyhow::Result<()>
{
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-basic").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 600, 24, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "basic",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({"streams": 2}),
        )?,
    )
    .await?;
    // What a user runs: kubectl wait on the condition.
    kubectl(&[
        "wait",
        "-n",
        &ns.name,
        "--for=condition=Succeeded",
        "transfer/basic",
        "--timeout=120s",
    ])
    .context("kubectl wait for Succeeded")?;
    let t = api.get("basic").await?;
    let st = t.status.clone().context("status")?;
    assert_eq!(st.phase, Phase::Succeeded);
    assert_eq!(st.attempts, 1);
    let p = st.progress.clone().context("progress")?;
    assert_eq!(p.percent, 100, "{p:?}");
    assert_eq!(p.files_done, 601, "{p:?}");
    assert!(p.bytes_done >= 24 << 20, "{p:?}");
    assert!(
        st.throughput
            .as_ref()
            .is_some_and(|t| t.average_bytes_per_second > 0),
        "{st:?}"
    );
    assert!(st.wire.as_ref().is_some_and(|w| w.bytes > 0), "{st:?}");
    assert!(st.completion_time.is_some() && st.start_time.is_some());
    assert_eq!(
        st.receiver.as_ref().and_then(|r| r.node.as_deref()),
        Some(NODE_B)
    );
    assert_eq!(
        st.sender.as_ref().and_then(|r| r.node.as_deref()),
        Some(NODE_A)
    );
    let digest = st.digest.clone().context("no digest in status")?;
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{digest}"
    );
    assert_eq!(assert_same_tree(&src_host, &dst_host)?, 601);
    assert!(
        !dst_host.join(".ferry-staging").exists(),
        "staging removed after success"
    );
    let table = kubectl(&["get", "xfer", "-n", &ns.name])?;
    assert!(
        table.contains("Succeeded") && table.contains("100%"),
        "{table}"
    );
    let events: Api<Event> = ns.api();
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("basic"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.iter().any(|r| r == "Succeeded"), "{reasons:?}");
    // The certificates are gone once the Transfer finished.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns.api();
    let left = secrets
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator"))
        .await?;
    assert!(left.items.is_empty(), "secrets left: {}", left.items.len());
    ns.delete().await
}

#[tokio::test]
async fn bandwidth_limited_transfer_shows_live_progress() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-live").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 10, 24, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "live",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false}),
        )?,
    )
    .await?;
    let mut seen: Vec<u64> = Vec::new();
    let mut rate_seen = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let t = api.get("live").await?;
        let st = t.status.unwrap_or_default();
        if let Some(p) = &st.progress
            && seen.last() != Some(&p.bytes_done)
            && !st.phase.is_finished()
        {
            seen.push(p.bytes_done);
        }
        if st
            .throughput
            .as_ref()
            .is_some_and(|t| t.current_bytes_per_second > 0)
        {
            rate_seen = true;
        }
        match st.phase {
            Phase::Succeeded => break,
            Phase::Failed => bail!("failed: {:?}", st.last_error),
            _ if tokio::time::Instant::now() >= deadline => bail!("timed out: {st:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(
        seen.len() >= 3,
        "progress values seen while running: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "not increasing: {seen:?}"
    );
    assert!(rate_seen, "no current throughput was reported");
    ns.delete().await
}

#[tokio::test]
async fn a_killed_sender_is_retried_and_the_retry_resumes() -> anyhow::Result<()> {
    killed_mover_is_retried_and_resumes("xfer-retry-send", "-send").await
}

#[tokio::test]
async fn a_killed_receiver_is_retried_and_the_retry_resumes() -> anyhow::Result<()> {
    killed_mover_is_retried_and_resumes("xfer-retry-recv", "-recv").await
}

/// Deletes the mover pod whose name ends in `role_suffix` once a sixth of the data is written:
/// the next attempt resumes from the receiver's staging and succeeds. At 4 MiB/s the rest takes
/// 10 s, time the kubelet needs to stop a force-deleted pod's container under load (at 8 MiB/s
/// after a third, the sender once finished first and attempt 1 succeeded).
async fn killed_mover_is_retried_and_resumes(
    prefix: &str,
    role_suffix: &str,
) -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create(prefix).await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 20, 48, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "retry",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false}),
        )?,
    )
    .await?;
    // Kill the mover once a sixth of the data is in.
    wait_until(
        Duration::from_secs(90),
        "a sixth of the data written",
        || {
            let api = api.clone();
            async move {
                let t = api.get("retry").await?;
                Ok(t.status
                    .and_then(|s| s.progress)
                    .is_some_and(|p| p.bytes_done > 8 << 20))
            }
        },
    )
    .await?;
    let pods: Api<Pod> = ns.api();
    let victim = mover_pods(&ns)
        .await?
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.ends_with(role_suffix))
        })
        .context("no such mover pod")?;
    pods.delete(
        victim.metadata.name.as_deref().unwrap_or_default(),
        &DeleteParams::default().grace_period(0),
    )
    .await?;
    let t = wait_phase(&api, "retry", Duration::from_secs(180), Phase::Succeeded).await?;
    let st = t.status.context("status")?;
    assert_eq!(st.attempts, 2, "{st:?}");
    assert_eq!(st.failures, 1, "{st:?}");
    let wire = st.wire.context("wire")?;
    assert!(wire.resumed_bytes > 0, "the retry kept nothing: {wire:?}");
    let total = st.progress.context("progress")?.bytes_total;
    assert!(
        wire.bytes < total,
        "attempt 2 sent {} of {total} bytes",
        wire.bytes
    );
    assert_same_tree(&src_host, &dst_host)?;
    ns.delete().await
}

#[tokio::test]
async fn invalid_specs_get_a_reason_and_no_pods() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-invalid").await?;
    let api: Api<Transfer> = ns.api();
    let cases = [
        (
            "outside-root",
            (NODE_A, "/etc"),
            (NODE_B, "/data/ferry-e2e/x"),
            "HostPathNotAllowed",
        ),
        (
            "no-node",
            ("node-zz", "/data/ferry-e2e/a"),
            (NODE_B, "/data/ferry-e2e/x"),
            "NodeNotFound",
        ),
    ];
    for (name, src, dst, _) in &cases {
        api.create(
            &PostParams::default(),
            &transfer(name, *src, *dst, serde_json::json!({}))?,
        )
        .await?;
    }
    for (name, _, _, reason) in &cases {
        wait_until(
            Duration::from_secs(60),
            &format!("{name} to report {reason}"),
            || {
                let api = api.clone();
                async move {
                    let t = api.get(name).await?;
                    Ok(t.status.is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == "Ready" && c.status == "False" && c.reason == *reason
                        })
                    }))
                }
            },
        )
        .await?;
    }
    // The apiserver itself refuses what the schema forbids.
    let both = ferry_cluster_tests::from_json::<Transfer>(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "both"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": "/data/ferry-e2e/a"}, "pvc": {"claimName": "c"}},
            "destination": {"hostPath": {"node": NODE_B, "path": "/data/ferry-e2e/b"}},
            "streams": 0,
        }
    }))?;
    let err = api
        .create(&PostParams::default(), &both)
        .await
        .err()
        .context("a spec with two source kinds and 0 streams was accepted")?;
    let text = err.to_string();
    assert!(
        text.contains("exactly one of") || text.contains("streams"),
        "{text}"
    );
    assert!(
        mover_pods(&ns).await?.is_empty(),
        "pods were created for invalid specs"
    );
    ns.delete().await
}

#[tokio::test]
async fn deleting_a_running_transfer_removes_its_pods_secrets_and_staging() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-delete").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 5, 32, &ns.name)?;
    // Something the Transfer must never touch, next to and inside the destination.
    let outside = dst_host.parent().context("parent")?.join("keep.txt");
    std::fs::write(&outside, b"keep")?;
    std::fs::write(dst_host.join("mine.txt"), b"user data")?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "doomed",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false}),
        )?,
    )
    .await?;
    wait_until(Duration::from_secs(60), "some data written", || {
        let api = api.clone();
        async move {
            let t = api.get("doomed").await?;
            Ok(t.status
                .and_then(|s| s.progress)
                .is_some_and(|p| p.bytes_done > 4 << 20))
        }
    })
    .await?;
    assert!(
        dst_host.join(".ferry-staging").exists(),
        "no staging while running"
    );
    api.delete("doomed", &DeleteParams::default()).await?;
    wait_until(Duration::from_secs(60), "the Transfer to be gone", || {
        let api = api.clone();
        async move { Ok(api.get_opt("doomed").await?.is_none()) }
    })
    .await?;
    let pods: Api<Pod> = ns.api();
    wait_until(Duration::from_secs(30), "its pods to be gone", || {
        let pods = pods.clone();
        async move { Ok(pods.list(&ListParams::default()).await?.items.is_empty()) }
    })
    .await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns.api();
    wait_until(Duration::from_secs(30), "its secrets to be gone", || {
        let secrets = secrets.clone();
        async move {
            let left = secrets
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator"))
                .await?;
            Ok(left.items.is_empty())
        }
    })
    .await?;
    assert!(
        !dst_host.join(".ferry-staging").exists(),
        "staging data left behind"
    );
    assert_eq!(std::fs::read(&outside)?, b"keep");
    assert_eq!(std::fs::read(dst_host.join("mine.txt"))?, b"user data");
    ns.delete().await
}

#[tokio::test]
async fn twenty_small_transfers_at_once_all_succeed() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-many").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 30, 0, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    let mut dsts = Vec::new();
    for i in 0..20 {
        let (node, name) = if i % 2 == 0 {
            (NODE_B, "b")
        } else {
            (NODE_A, "a")
        };
        let (dst, dst_host) = node_dir(node, &ns.name, &format!("dst-{name}{i}"))?;
        api.create(
            &PostParams::default(),
            &transfer(
                &format!("t{i}"),
                (NODE_A, &src),
                (node, &dst),
                serde_json::json!({}),
            )?,
        )
        .await?;
        dsts.push(dst_host);
    }
    for i in 0..20 {
        wait_phase(
            &api,
            &format!("t{i}"),
            Duration::from_secs(180),
            Phase::Succeeded,
        )
        .await?;
    }
    for d in &dsts {
        assert_eq!(assert_same_tree(&src_host, d)?, 30);
    }
    ns.delete().await
}

#[tokio::test]
async fn the_same_dataset_again_to_the_same_node_comes_from_its_block_store() -> anyhow::Result<()>
{
    ensure_operator().await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_B],
    )
    .await?;
    let ns = TestNamespace::create("xfer-dedup").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 3, 32, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    let mut wires = Vec::new();
    for name in ["first", "second"] {
        let (dst, dst_host) = node_dir(NODE_B, &ns.name, name)?;
        api.create(
            &PostParams::default(),
            &transfer(name, (NODE_A, &src), (NODE_B, &dst), serde_json::json!({}))?,
        )
        .await?;
        let t = wait_phase(&api, name, Duration::from_secs(120), Phase::Succeeded).await?;
        assert_same_tree(&src_host, &dst_host)?;
        wires.push(t.status.and_then(|s| s.wire).context("wire")?);
    }
    let (first, second) = (&wires[0], &wires[1]);
    assert_eq!(first.dedup_blocks, 0, "{first:?}");
    assert_eq!(second.dedup_blocks, 8, "32 MiB in 4 MiB blocks: {second:?}");
    assert_eq!(second.dedup_bytes, 32 << 20, "{second:?}");
    assert!(
        second.bytes < first.bytes / 20,
        "second transfer still moved {} of {} bytes over the wire",
        second.bytes,
        first.bytes
    );
    // The blocks sit in node-b's store, which the tests keep on node-b's own PersistentVolume
    // (the chart's nodeService.persistentVolume.perNode), not in a host directory.
    let store = node_store_volume(NODE_B).await?;
    let large = std::fs::read(src_host.join("large.bin"))?;
    for block in large.chunks(4 << 20) {
        let hex = blake3::hash(block).to_hex();
        let path = store
            .join("blocks")
            .join(&hex[0..2])
            .join(&hex[2..4])
            .join(hex.as_str());
        assert!(
            path.is_file(),
            "block {hex} is not in node-b's store volume at {}",
            path.display()
        );
    }
    let meta = std::fs::metadata(&store)?;
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            meta.permissions().mode() & 0o777
        ),
        (65532, 0o700),
        "the store's root on its volume was not prepared for the service's uid"
    );
    ns.delete().await
}

/// Where `node`'s block store lives on the node's disk: its node-service pod's claim, bound to
/// the volume offered for that node's store.
async fn node_store_volume(node: &str) -> anyhow::Result<PathBuf> {
    let pod = ferry_cluster_tests::operator::node_service_pod(node)
        .await?
        .with_context(|| format!("no node-service pod on {node}"))?;
    let pv_name = ferry_cluster_tests::operator::store_claim_fields(
        &pod,
        "{.status.phase}/{.spec.storageClassName}/{.spec.volumeName}",
    )?;
    let Some(("Bound", rest)) = pv_name.split_once('/') else {
        bail!("the store claim on {node} is not Bound: {pv_name}");
    };
    let (class, pv) = rest.split_once('/').context("claim fields")?;
    assert_eq!(
        class,
        ferry_cluster_tests::operator::STORE_CLASS,
        "the store claim took another class"
    );
    let pv = kubectl(&[
        "get",
        "pv",
        pv,
        "-o",
        "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}/{.spec.hostPath.path}{.spec.local.path}",
    ])?;
    let (on, path) = pv.split_once('/').context("volume fields")?;
    assert_eq!(on, node, "the store's volume is on another node");
    Ok(node_root(node).join(path.trim_start_matches('/')))
}

/// A fan-out to two nodes: one child Transfer per node, each verified by its own digest, and
/// every full block, and every pack of small files, crosses from the source once: the other
/// destination takes it from the owner's node service.
#[tokio::test]
async fn a_fan_out_to_two_nodes_sends_each_block_from_the_source_once() -> anyhow::Result<()> {
    ensure_operator().await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_A, NODE_B],
    )
    .await?;
    let ns = TestNamespace::create("xfer-fanout").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    // 50 MiB of fresh content: 12 full blocks and a 2 MiB tail, none in any node's store yet;
    // and 16 MiB of 64 KiB images, which travel as packs of about 4 MiB.
    make_tree(&src_host, 20, 50, &ns.name)?;
    ferry_cluster_tests::transfers::add_small_files(
        &src_host.join("images"),
        IMAGES,
        64 << 10,
        &ns.name,
    )?;
    const IMAGES: usize = 256;
    const DATASET: u64 = (50 << 20) + (IMAGES as u64) * (64 << 10);
    let (dst, dst_a) = node_dir(NODE_A, &ns.name, "dst")?;
    let (_, dst_b) = node_dir(NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();
    let fan: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fan"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"nodes": [NODE_A, NODE_B], "minAvailable": 2, "path": dst}},
        }
    }))?;
    // The API server refuses what a fan-out cannot be, with the CRD's messages.
    for (bad, message) in [
        (
            serde_json::json!({"source": {"hostPath": {"nodes": [NODE_A], "path": src}},
                               "destination": {"hostPath": {"node": NODE_B, "path": dst}}}),
            "a source is one node",
        ),
        (
            serde_json::json!({"source": {"hostPath": {"node": NODE_A, "path": src}},
                               "destination": {"hostPath": {"node": NODE_B, "nodes": [NODE_A], "path": dst}}}),
            "set exactly one of node, nodes or nodeSelector",
        ),
        (
            serde_json::json!({"source": {"hostPath": {"node": NODE_A, "path": src}},
                               "destination": {"hostPath": {"nodes": [NODE_A, NODE_A], "path": dst}}}),
            "nodes must not repeat",
        ),
        (
            serde_json::json!({"source": {"hostPath": {"node": NODE_A, "path": src}},
                               "destination": {"hostPath": {"node": NODE_B, "minAvailable": 1, "path": dst}}}),
            "minAvailable is for a fan-out",
        ),
        (
            serde_json::json!({"source": {"hostPath": {"node": NODE_A, "path": src}},
                               "destination": {"hostPath": {"nodes": [NODE_A, NODE_B], "minAvailable": 3, "path": dst}}}),
            "minAvailable must not exceed the number of nodes",
        ),
    ] {
        let t: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "bad"}, "spec": bad,
        }))?;
        let refused = api.create(&PostParams::default(), &t).await;
        let err = format!(
            "{:?}",
            refused.err().context("an invalid fan-out was accepted")?
        );
        assert!(err.contains(message), "{message:?} not in {err}");
    }
    api.create(&PostParams::default(), &fan).await?;
    let t = wait_phase(&api, "fan", Duration::from_secs(180), Phase::Succeeded).await?;
    for d in [&dst_a, &dst_b] {
        assert_eq!(assert_same_tree(&src_host, d)?, 21 + IMAGES);
    }
    let st = t.status.context("status")?;
    let rows: Vec<(&str, Phase)> = st
        .destinations
        .iter()
        .map(|d| (d.node.as_str(), d.phase))
        .collect();
    assert_eq!(
        rows,
        [(NODE_A, Phase::Succeeded), (NODE_B, Phase::Succeeded)]
    );
    let mut wire = 0;
    let mut last_child_done = None;
    // One sender for the run: the fan-out's, on the source node, serving both children (it
    // read the source once for both); no child ran one of its own.
    let sender = st.sender.clone().context("the fan-out's sender")?;
    assert_eq!(sender.node.as_deref(), Some(NODE_A));
    let pods: Api<Pod> = ns.api();
    let senders: Vec<String> = pods
        .list(&ListParams::default().labels("ferry.dev/role=sender"))
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        senders,
        std::slice::from_ref(&sender.pod),
        "one sender pod for both destinations"
    );
    // Each block of the source was read once: the other session took it from that read. (At
    // least the 12 full blocks; the line comes when the pod ends, after both children read
    // their outcome.)
    const COUNT: &str = "blocks read from the source";
    let sender_log = || ferry_cluster_tests::container_log(&ns.name, &sender.pod, "mover");
    wait_until(
        Duration::from_secs(60),
        "the sender's count of its reads",
        || async { Ok(sender_log().await.contains(COUNT)) },
    )
    .await?;
    let log = sender_log().await;
    let counted = log.lines().find(|l| l.contains(COUNT)).unwrap_or_default();
    let numbers: Vec<u64> = counted
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [.., reads, destinations, shared] = numbers[..] else {
        bail!("no counts in {counted:?}");
    };
    assert!(
        destinations == 2 && reads >= 12 && shared == reads,
        "each block read once for both destinations: {counted:?}"
    );
    eprintln!("the fan-out's sender: {}", counted.trim());
    for d in &st.destinations {
        let child = api.get(&d.transfer).await?;
        assert_eq!(
            child.owner_references()[0].uid,
            t.metadata.uid.clone().unwrap_or_default()
        );
        let cs = child.status.context("child status")?;
        assert_eq!(
            cs.sender.as_ref().map(|s| s.pod.as_str()),
            Some(sender.pod.as_str()),
            "{}: sent to by the fan-out's sender",
            d.node
        );
        assert_eq!(cs.attempts, 1, "{}", d.node);
        assert_eq!(
            cs.digest, st.digest,
            "{}: every destination has the source's digest",
            d.node
        );
        wire += cs.wire.context("wire")?.bytes;
        last_child_done = last_child_done.max(cs.completion_time.map(|t| t.0));
    }
    assert!(st.digest.is_some());
    // The fan-out reports its last child's success when the cache holds it, not at its
    // periodic look 15 s later.
    let lag = st
        .completion_time
        .context("the fan-out's completionTime")?
        .0
        .duration_since(last_child_done.context("a child's completionTime")?);
    assert!(
        lag.as_secs() <= 8,
        "the fan-out succeeded {lag:?} after its last child"
    );
    let available = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")
        .context("a fan-out has an Available condition")?;
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("True", "MinimumDestinationsAvailable")
    );
    let from_peers: u64 = st.destinations.iter().map(|d| d.dedup_bytes).sum();
    // A group of the walk cut short (by the large file, or the last images) may hold less
    // than a pack's 1 MiB: those files travel to each node, as without packs.
    assert!(
        from_peers >= DATASET - (2 << 20),
        "every full block, the long tail and the packs of images taken once from the other \
         node: {from_peers} of {DATASET} bytes"
    );
    assert!(
        wire < DATASET * 21 / 20,
        "the source sent {wire} bytes to two destinations of {DATASET}: more than one copy"
    );
    // The same tree again, to the nodes a selector picks: both stores hold every full block,
    // the tail and every pack, so only the few tiny files cross from the source.
    let (again_dst, again_a) = node_dir(NODE_A, &ns.name, "again")?;
    let (_, again_b) = node_dir(NODE_B, &ns.name, "again")?;
    let again: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "again"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"path": again_dst, "nodeSelector": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_B, NODE_A]}
            ]}}},
        }
    }))?;
    api.create(&PostParams::default(), &again).await?;
    let t2 = wait_phase(&api, "again", Duration::from_secs(180), Phase::Succeeded).await?;
    for d in [&again_a, &again_b] {
        assert_eq!(assert_same_tree(&src_host, d)?, 21 + IMAGES);
    }
    let st2 = t2.status.context("status")?;
    let nodes: Vec<&str> = st2.destinations.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(nodes, [NODE_A, NODE_B], "a selector's nodes, by name");
    let wire2 = st2.wire.context("wire")?.bytes;
    eprintln!(
        "fan-out to 2 nodes: {wire} bytes from the source ({:.2} copies of the {DATASET}), \
         {from_peers} from the sibling's node service, Succeeded {lag:?} after its last child; \
         the repeat: {wire2} bytes",
        wire as f64 / DATASET as f64
    );
    assert!(
        wire2 < 1 << 20,
        "a repeat moved {wire2} bytes from the source"
    );

    // The children belong to the fan-out: deleting it deletes them.
    api.delete("fan", &DeleteParams::default()).await?;
    let children: Vec<String> = st.destinations.iter().map(|d| d.transfer.clone()).collect();
    wait_until(
        Duration::from_secs(90),
        "children deleted with the fan-out",
        || {
            let api = api.clone();
            let children = children.clone();
            async move {
                for c in &children {
                    if api.get_opt(c).await?.is_some() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        },
    )
    .await?;
    ns.delete().await
}

/// How one destination of fan-out `name` stands (its row in the status), if it has one yet.
async fn destination_row(
    api: &Api<Transfer>,
    name: &str,
    node: &str,
) -> anyhow::Result<Option<ferry_operator::api::DestinationStatus>> {
    let t = api.get(name).await?;
    Ok(t.status
        .and_then(|s| s.destinations.into_iter().find(|d| d.node == node)))
}

/// `minAvailable`: a fan-out to two nodes that needs one. The second node's directory is not
/// writable by the movers (a permanent destination fault), so its destination fails; the run
/// still succeeds, with `Available` True, and says which node failed, in its message and in a
/// Warning Event.
#[tokio::test]
async fn a_fan_out_with_min_available_succeeds_when_enough_nodes_do() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-minavail").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    // Small files only: no full block waits for the node that fails.
    make_tree(&src_host, 30, 0, &ns.name)?;
    let (dst, dst_a) = node_dir(NODE_A, &ns.name, "dst")?;
    let (_, dst_b) = node_dir(NODE_B, &ns.name, "dst")?;
    std::os::unix::fs::chown(&dst_b, Some(0), Some(0))?;
    std::fs::set_permissions(&dst_b, std::fs::Permissions::from_mode(0o755))?;
    let api: Api<Transfer> = ns.api();
    let fan: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "most"},
        "spec": {
            "source": {"hostPath": {"node": NODE_A, "path": src}},
            "destination": {"hostPath": {"nodes": [NODE_A, NODE_B], "minAvailable": 1, "path": dst}},
        }
    }))?;
    api.create(&PostParams::default(), &fan).await?;
    let t = wait_phase(&api, "most", Duration::from_secs(180), Phase::Succeeded).await?;
    assert_eq!(assert_same_tree(&src_host, &dst_a)?, 30);
    let st = t.status.context("status")?;
    let rows: Vec<(&str, Phase)> = st
        .destinations
        .iter()
        .map(|d| (d.node.as_str(), d.phase))
        .collect();
    assert_eq!(rows, [(NODE_A, Phase::Succeeded), (NODE_B, Phase::Failed)]);
    let condition = |kind: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == kind)
            .with_context(|| format!("no {kind} condition"))
    };
    let available = condition("Available")?;
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("True", "MinimumDestinationsAvailable")
    );
    let succeeded = condition("Succeeded")?;
    assert!(
        succeeded.message.starts_with(&format!(
            "1 of 2 destinations succeeded (minAvailable 1); failed: {NODE_B}: "
        )),
        "{}",
        succeeded.message
    );
    assert!(
        st.digest.is_some(),
        "the digest of the destination that succeeded"
    );
    // The Event is recorded just after the status that announces the outcome.
    let ns_name = ns.name.clone();
    wait_until(
        Duration::from_secs(30),
        "a DestinationFailed Event naming the failed node",
        || {
            let ns_name = ns_name.clone();
            async move {
                let warned =
                    ferry_cluster_tests::events_of(&ns_name, "most", "DestinationFailed").await?;
                Ok(warned.iter().any(|m| m.contains(NODE_B)))
            }
        },
    )
    .await?;
    Ok(())
}

/// A fan-out to four nodes loses one destination node mid-run (a power cut: its link goes down,
/// every process of the node dies). The three others finish while it is down (a sibling waiting
/// on blocks the lost node owned fails over to the source within half a minute); when the node
/// is back its destination resumes, and all four trees match the source's digest.
#[tokio::test]
async fn a_fan_out_to_four_nodes_finishes_the_others_while_one_is_down_and_it_resumes()
-> anyhow::Result<()> {
    use ferry_cluster_tests::Cluster;
    ensure_operator().await?;
    let targets = [NODE_A, NODE_B, NODE_C, NODE_X];
    ferry_cluster_tests::operator::wait_node_service_in(Cluster::Main, &targets).await?;
    let ns = TestNamespace::create("xfer-fanstop").await?;
    let (src, src_host) = node_dir(NODE_E, &ns.name, "src")?;
    // 96 MiB of fresh content (24 full blocks, a quarter owned by each destination) and 40
    // small files.
    make_tree(&src_host, 40, 96, &ns.name)?;
    let mut dst = String::new();
    let mut dst_hosts = Vec::new();
    for node in targets {
        let (d, host) = node_dir(node, &ns.name, "dst")?;
        dst = d;
        dst_hosts.push(host);
    }
    // node-x's link is slow, so that it is still receiving when it loses power.
    let shape = |rate: &str| {
        Cluster::Main
            .script("shape.sh")
            .args([NODE_X, rate])
            .status()
    };
    assert!(shape("32mbit")?.success());
    let uncap = ferry_cluster_tests::on_drop(move || {
        let _ = shape("off");
    });
    let api: Api<Transfer> = ns.api();
    let fan: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fan4"},
        "spec": {
            "source": {"hostPath": {"node": NODE_E, "path": src}},
            "destination": {"hostPath": {"nodes": targets, "path": dst}},
            "mover": {"tolerations": [
                {"key": "ferry.dev/disruptive", "operator": "Exists", "effect": "NoSchedule"},
            ]},
        }
    }))?;
    api.create(&PostParams::default(), &fan).await?;
    wait_until(
        Duration::from_secs(240),
        "node-x's destination to be under way",
        || async {
            Ok(destination_row(&api, "fan4", NODE_X)
                .await?
                .is_some_and(|d| d.bytes_done >= 8 << 20))
        },
    )
    .await?;

    let restart = ferry_cluster_tests::power_off(Cluster::Main, NODE_X)?;
    let stopped = std::time::Instant::now();
    // Without the kernel's probes a sibling would wait 130 s (--swarm-wait and its margin) for
    // blocks the dead node owned before it asked the source for them instead.
    wait_until(
        Duration::from_secs(130),
        "the three other destinations to succeed while node-x is down",
        || async {
            let t = api.get("fan4").await?;
            let st = t.status.unwrap_or_default();
            Ok(st
                .destinations
                .iter()
                .filter(|d| d.node != NODE_X)
                .all(|d| d.phase == Phase::Succeeded))
        },
    )
    .await?;
    let others_done = stopped.elapsed();
    let down = api.get("fan4").await?;
    let st = down.status.context("status")?;
    assert_ne!(st.phase, Phase::Succeeded, "succeeded without node-x");
    let x = st
        .destinations
        .iter()
        .find(|d| d.node == NODE_X)
        .context("node-x's row")?;
    assert_ne!(x.phase, Phase::Succeeded, "node-x finished while down");

    // Power back: node-x's destination resumes and the fan-out succeeds.
    drop(restart);
    drop(uncap);
    let t = wait_phase(&api, "fan4", Duration::from_secs(480), Phase::Succeeded).await?;
    for host in &dst_hosts {
        assert_eq!(assert_same_tree(&src_host, host)?, 41);
    }
    let st = t.status.context("status")?;
    assert!(st.digest.is_some());
    let mut figures = Vec::new();
    for d in &st.destinations {
        let child = api.get(&d.transfer).await?;
        let cs = child.status.context("child status")?;
        assert_eq!(cs.digest, st.digest, "{}: the source's digest", d.node);
        let wire = cs.wire.context("wire")?;
        figures.push(format!(
            "{} attempts {} resumed {} from stores {}",
            d.node, cs.attempts, wire.resumed_bytes, wire.dedup_bytes
        ));
        if d.node == NODE_X {
            assert!(cs.attempts >= 2, "node-x's destination was retried");
            assert!(
                wire.resumed_bytes > 0,
                "node-x's retry kept what it had before the power cut: {wire:?}"
            );
        } else {
            // The blocks node-x owned and never passed on came from the source at the end of
            // the same attempt (Refetch): its failure cost the others no retry.
            assert_eq!(cs.attempts, 1, "{}: retried after node-x failed", d.node);
            // Their session of the fan-out's sender finished though node-x's hung.
            assert_eq!(
                cs.sender.map(|s| s.pod),
                st.sender.as_ref().map(|s| s.pod.clone()),
                "{}: sent to by the fan-out's sender",
                d.node
            );
        }
    }
    eprintln!(
        "fan-out to 4 nodes, node-x stopped: the others done {:.0} s after the stop; {}",
        others_done.as_secs_f64(),
        figures.join("; ")
    );
    ns.delete().await
}

/// `spec.exclude` reaches the sender: excluded entries stay behind, and with deleteExtraneous
/// the destination's own entries that a rule excludes are kept while other extras go.
#[tokio::test]
async fn excluded_paths_stay_behind_and_are_kept_from_delete() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-exclude").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 40, 0, &ns.name)?;
    for rel in ["scratch.tmp", "d03/partial.tmp", "cache/index"] {
        let p = src_host.join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(&p, rel)?;
    }
    for rel in ["old.tmp", "stale", "cache/keep"] {
        let p = dst_host.join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(&p, b"in the destination")?;
    }
    transfers::chown_tree(&src_host)?;
    transfers::chown_tree(&dst_host)?;
    let api: Api<Transfer> = ns.api();
    let spec = serde_json::json!({"exclude": ["*.tmp", "/cache/"], "deleteExtraneous": true});
    api.create(
        &PostParams::default(),
        &transfer("exclude", (NODE_A, &src), (NODE_B, &dst), spec)?,
    )
    .await?;
    let t = wait_phase(&api, "exclude", Duration::from_secs(120), Phase::Succeeded).await?;
    let p = t.status.and_then(|s| s.progress).context("progress")?;
    assert_eq!(p.files_done, 40, "{p:?}");
    for rel in ["scratch.tmp", "d03/partial.tmp", "cache/index", "stale"] {
        assert!(!dst_host.join(rel).exists(), "{rel} in the destination");
    }
    for rel in ["old.tmp", "cache/keep"] {
        assert_eq!(
            std::fs::read(dst_host.join(rel))?,
            b"in the destination",
            "{rel}"
        );
    }
    for i in [0, 17, 39] {
        let rel = format!("d{:02}/f{i}.bin", i % 17);
        assert_eq!(
            std::fs::read(dst_host.join(&rel))?,
            std::fs::read(src_host.join(&rel))?
        );
    }
    ns.delete().await
}

/// A local PersistentVolume on `node` with its StorageClass, named after the namespace.
async fn local_pv(
    ns: &TestNamespace,
    which: &str,
    node: &str,
) -> anyhow::Result<(String, PathBuf)> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::api::storage::v1::StorageClass;
    let class = format!("local-{}-{which}", ns.name);
    let disk = format!("/mnt/disks/{}-{which}", ns.name);
    let classes: Api<StorageClass> = Api::all(ns.client.clone());
    classes
        .create(
            &PostParams::default(),
            &ferry_cluster_tests::from_json(serde_json::json!({
                "metadata": {"name": class}, "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer"
            }))?,
        )
        .await?;
    let pvs: Api<PersistentVolume> = Api::all(ns.client.clone());
    pvs.create(
        &PostParams::default(),
        &ferry_cluster_tests::from_json(serde_json::json!({
            "metadata": {"name": format!("pv-{}-{which}", ns.name)},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                "local": {"path": disk},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                ]}]}},
            }
        }))?,
    )
    .await?;
    let on_host = node_root(node).join(disk.trim_start_matches('/'));
    std::fs::create_dir_all(&on_host)?;
    Ok((class, on_host))
}

async fn claim(ns: &TestNamespace, name: &str, class: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    ns.api::<PersistentVolumeClaim>()
        .create(
            &PostParams::default(),
            &ferry_cluster_tests::from_json(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                         "resources": {"requests": {"storage": "1Gi"}}}
            }))?,
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn claim_to_claim_on_two_nodes_waits_for_a_missing_claim_then_succeeds() -> anyhow::Result<()>
{
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-pvc").await?;
    // The strictest Pod Security level: the movers must comply, and the receiver (no hostPath
    // allowed) still takes blocks from its node's store, through the node service.
    kubectl(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    let (src_class, src_disk) = local_pv(&ns, "src", NODE_A).await?;
    let (dst_class, dst_disk) = local_pv(&ns, "dst", NODE_B).await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_B],
    )
    .await?;
    let src_host = src_disk.join("sets/a");
    std::fs::create_dir_all(&src_host)?;
    make_tree(&src_host, 200, 8, &ns.name)?;
    claim(&ns, "source", &src_class).await?;
    // An application pod already uses the (ReadWriteOnce) source claim.
    let pods: Api<Pod> = ns.api();
    pods.create(
        &PostParams::default(),
        &ferry_cluster_tests::from_json(serde_json::json!({
            "metadata": {"name": "app"},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "main", "image": ferry_cluster_tests::shell_image(),
                    "command": ["sh", "-c", "sleep 3600"],
                    "securityContext": {"allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "source"}}],
            }
        }))?,
    )
    .await?;
    ferry_cluster_tests::wait_for_pod(&pods, "app", Duration::from_secs(60), "running", |p| {
        ferry_cluster_tests::phase(p) == "Running"
    })
    .await?;
    let api: Api<Transfer> = ns.api();
    let t: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "claims"},
        "spec": {
            "source": {"pvc": {"claimName": "source", "path": "/sets/a"}},
            "destination": {"pvc": {"claimName": "target", "path": "copy"}},
        }
    }))?;
    api.create(&PostParams::default(), &t).await?;
    // The destination claim does not exist yet: a reason, and no movers.
    wait_until(Duration::from_secs(60), "DestinationClaimNotFound", || {
        let api = api.clone();
        async move {
            let t = api.get("claims").await?;
            Ok(t.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "DestinationClaimNotFound")
            }))
        }
    })
    .await?;
    assert!(
        mover_pods(&ns).await?.is_empty(),
        "movers started without a destination claim"
    );
    claim(&ns, "target", &dst_class).await?;
    let t = wait_phase(&api, "claims", Duration::from_secs(120), Phase::Succeeded).await?;
    let st = t.status.context("status")?;
    assert_eq!(st.sender.and_then(|s| s.node).as_deref(), Some(NODE_A));
    assert_eq!(st.receiver.and_then(|s| s.node).as_deref(), Some(NODE_B));
    assert!(
        st.conditions.iter().all(|c| c.type_ != "Dedup"),
        "{:?}",
        st.conditions
    );
    assert_eq!(assert_same_tree(&src_host, &dst_disk.join("copy"))?, 201);
    // The same tree again into another directory of the claim: its two full blocks come from
    // the node's store (the receiver mounts no store: the node service hands them out).
    let again: Transfer = ferry_cluster_tests::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "again"},
        "spec": {
            "source": {"pvc": {"claimName": "source", "path": "/sets/a"}},
            "destination": {"pvc": {"claimName": "target", "path": "copy2"}},
        }
    }))?;
    api.create(&PostParams::default(), &again).await?;
    let t = wait_phase(&api, "again", Duration::from_secs(120), Phase::Succeeded).await?;
    let wire = t.status.and_then(|s| s.wire).context("wire")?;
    assert_eq!(wire.dedup_blocks, 2, "8 MiB of large.bin: {wire:?}");
    assert_eq!(assert_same_tree(&src_host, &dst_disk.join("copy2"))?, 201);
    let name = ns.name.clone();
    let client = ns.client.clone();
    ns.delete().await?;
    // The cluster-scoped volumes and classes of this test.
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client);
    for which in ["src", "dst"] {
        pvs.delete(&format!("pv-{name}-{which}"), &DeleteParams::default())
            .await?;
        classes
            .delete(&format!("local-{name}-{which}"), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

#[tokio::test]
async fn an_unreadable_source_fails_at_once_with_its_reason() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("xfer-unreadable").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 5, 0, &ns.name)?;
    transfers::add_unreadable_dir(&src_host)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "unreadable",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let t = wait_phase(&api, "unreadable", Duration::from_secs(90), Phase::Failed).await?;
    let st = t.status.context("status")?;
    assert_eq!(st.attempts, 1, "retried a fault no retry fixes: {st:?}");
    let failed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .context("no Failed condition")?;
    assert_eq!(failed.reason, "SourceUnreadable", "{failed:?}");
    assert!(failed.message.contains("private"), "{}", failed.message);
    ns.delete().await
}
