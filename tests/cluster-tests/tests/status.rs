//! Honest status on the real nodes: a mover pod that cannot start (its image cannot be pulled,
//! no node fits it, its volume cannot be mounted, admission refuses it) shows in the Transfer's
//! condition with the cluster's own words and an Event, never as Ready=True, and a pod that
//! stays pending fails its attempt after the pending timeout.
//!
//! The operator of this file names a mover image that does not exist: none of these movers
//! ever runs (the kubelet mounts volumes before it pulls images; an unschedulable or refused
//! pod never reaches a kubelet).

use std::time::Duration;

use ferry_cluster_tests::operator::kubectl;
use ferry_cluster_tests::transfers::{self, NODE_A, NODE_B, SharedOperator, transfer};
use ferry_cluster_tests::{TestNamespace, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};

const HOST_ROOT: &str = "/data/ferry-status";
/// Granted, but no node has it.
const MISSING_ROOT: &str = "/data/ferry-status-missing";
/// Long enough to see each reason first, short enough for a test. (Each test here has its own
/// namespace, so the operator's `--max-active-per-namespace 1` lets each start one Transfer.)
const PENDING_TIMEOUT: &str = "30";

static OPERATOR: SharedOperator = SharedOperator::with_flags(
    "ferry-operator-status",
    HOST_ROOT,
    &[
        "--mover-image",
        "10.99.0.2:5000/ferry/no-such-mover:0",
        "--host-root",
        "*=/data/ferry-status-missing",
        "--mover-pending-timeout",
        PENDING_TIMEOUT,
        "--max-active-per-namespace",
        "1",
    ],
);

fn node_dir(node: &str, ns: &str, name: &str) -> anyhow::Result<String> {
    Ok(transfers::node_dir(HOST_ROOT, node, ns, name)?.0)
}

/// Waits until the Ready condition has `reason`, asserting on the way that Ready is never True;
/// returns the condition's message.
async fn wait_reason(api: &Api<Transfer>, name: &str, reason: &str) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let st = api.get(name).await?.status.unwrap_or_default();
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready");
        anyhow::ensure!(
            ready.is_none_or(|c| c.status != "True"),
            "{name} showed Ready=True: {:?}",
            st.conditions
        );
        anyhow::ensure!(st.phase != Phase::Running, "{name} showed Running: {st:?}");
        if let Some(c) = ready.filter(|c| c.reason == reason) {
            return Ok(c.message.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} did not report {reason}: {:?}",
            st.conditions
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A Transfer node-a -> node-b in a new namespace `prefix`; `dst` replaces the default
/// destination under the granted root.
async fn start(
    prefix: &str,
    name: &str,
    dst: Option<&str>,
    extra: serde_json::Value,
) -> anyhow::Result<(TestNamespace, Api<Transfer>)> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create(prefix).await?;
    let src = node_dir(NODE_A, &ns.name, "src")?;
    let dst = match dst {
        Some(d) => d.replace("{ns}", &ns.name),
        None => node_dir(NODE_B, &ns.name, "dst")?,
    };
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(name, (NODE_A, &src), (NODE_B, &dst), extra)?,
    )
    .await?;
    Ok((ns, api))
}

/// Waits up to 30 s for a Warning Event about `name` with `reason`: the operator records it
/// just after the status that names the reason, so it may not be there yet when the status is.
async fn wait_for_warning(ns: &TestNamespace, name: &str, reason: &str) -> anyhow::Result<()> {
    let events: Api<Event> = ns.api();
    let what = format!("a Warning Event {reason} about {name}");
    wait_until(Duration::from_secs(30), &what, || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
            }))
    })
    .await
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_named_and_the_attempt_times_out() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("status-image").await?;
    let (src, dst) = (
        node_dir(NODE_A, &ns.name, "src")?,
        node_dir(NODE_B, &ns.name, "dst")?,
    );
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "pull",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let message = wait_reason(&api, "pull", "MoverImagePullFailed").await?;
    assert!(
        message.contains("-recv") && message.contains("no-such-mover"),
        "the message names neither the pod nor the image: {message}"
    );
    wait_for_warning(&ns, "pull", "MoverImagePullFailed").await?;
    // After the pending timeout the attempt fails and is retried with backoff.
    let message = wait_reason(&api, "pull", "Retrying").await?;
    assert!(
        message.contains(&format!("did not start within {PENDING_TIMEOUT} s")),
        "{message}"
    );
    ns.delete().await
}

#[tokio::test]
async fn a_granted_root_missing_on_the_node_is_a_failed_mount() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("status-mount").await?;
    let src = node_dir(NODE_A, &ns.name, "src")?;
    let api: Api<Transfer> = ns.api();
    // The receiver comes first; its granted root is missing on node-b. (Its image cannot be
    // pulled either, but the kubelet mounts volumes first.)
    let dst = format!("{MISSING_ROOT}/{}/dst", ns.name);
    api.create(
        &PostParams::default(),
        &transfer(
            "mount",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let message = wait_reason(&api, "mount", "MoverVolumeMountFailed").await?;
    assert!(
        message.contains("FailedMount") && message.contains(MISSING_ROOT),
        "{message}"
    );
    wait_for_warning(&ns, "mount", "MoverVolumeMountFailed").await?;
    ns.delete().await
}

#[tokio::test]
async fn an_unschedulable_mover_is_named_with_the_schedulers_words() -> anyhow::Result<()> {
    let extra = serde_json::json!({"mover": {"resources": {"requests": {"cpu": "500"}}}});
    let (ns, api) = start("status-sched", "huge", None, extra).await?;
    let message = wait_reason(&api, "huge", "MoverUnschedulable").await?;
    assert!(message.contains("Insufficient cpu"), "{message}");
    ns.delete().await
}

#[tokio::test]
async fn a_pod_admission_refuses_is_a_condition_and_an_event() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("status-quota").await?;
    kubectl(&[
        "-n",
        &ns.name,
        "create",
        "quota",
        "no-pods",
        "--hard=pods=0",
    ])?;
    let (src, dst) = (
        node_dir(NODE_A, &ns.name, "src")?,
        node_dir(NODE_B, &ns.name, "dst")?,
    );
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "quota",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let message = wait_reason(&api, "quota", "MoverRejected").await?;
    assert!(
        message.contains("exceeded quota") && message.contains("-recv"),
        "{message}"
    );
    wait_for_warning(&ns, "quota", "MoverRejected").await?;
    ns.delete().await
}

/// The Ready condition's reason and message.
async fn ready(api: &Api<Transfer>, name: &str) -> anyhow::Result<(String, String)> {
    let st = api.get(name).await?.status.unwrap_or_default();
    Ok(st
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason, c.message))
        .unwrap_or_default())
}

#[tokio::test]
async fn one_namespace_gets_its_slot_and_a_stuck_transfer_gives_it_back() -> anyhow::Result<()> {
    // The first Transfer of the namespace takes its one slot and is stuck (its image cannot be
    // pulled); the second queues behind it until the first's pending timeout frees the slot.
    let (ns, api) = start("status-slots", "first", None, serde_json::json!({})).await?;
    wait_reason(&api, "first", "MoverImagePullFailed").await?;
    let src = node_dir(NODE_A, &ns.name, "src2")?;
    let dst = node_dir(NODE_B, &ns.name, "dst2")?;
    api.create(
        &PostParams::default(),
        &transfer(
            "second",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let (reason, message) = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let r = ready(&api, "second").await?;
            if r.1.contains("queued") || tokio::time::Instant::now() >= deadline {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    assert!(message.contains("queued"), "second: {reason}: {message}");
    // Still queued while the first holds the slot (its pods exist and may start).
    assert_eq!(ready(&api, "first").await?.0, "MoverImagePullFailed");
    // Past the pending timeout the first retries (no slot while it waits) and the second starts.
    let message = wait_reason(&api, "second", "MoverImagePullFailed").await?;
    assert!(message.contains("-recv"), "{message}");
    let first = api.get("first").await?.status.unwrap_or_default();
    assert!(first.failures >= 1, "{first:?}");
    ns.delete().await
}
