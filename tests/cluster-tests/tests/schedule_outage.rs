//! A scheduled Transfer whose operator is down while its schedule fires twice: the operator
//! that comes back starts one catch-up run (for the latest missed time), not one per missed
//! time, as a CronJob does.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::operator::{OperatorProcess, install_crd_and_rbac, prepare_nodes};
use ferry_cluster_tests::transfers::{
    MOVER_UID, NODE_A, NODE_B, assert_same_tree, make_tree, minute_boundary, node_dir, transfer,
    wait_past, wait_phase, wait_status,
};
use ferry_cluster_tests::{TestNamespace, events_of};
use ferry_operator::api::{Phase, RunCause, Transfer};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

const HOST_ROOT: &str = "/data/ferry-schedule-outage";
const LEASE: &str = "ferry-operator-schedule-outage";

#[tokio::test]
async fn times_missed_while_the_operator_was_down_get_one_catch_up_run() -> anyhow::Result<()> {
    install_crd_and_rbac()?;
    prepare_nodes(HOST_ROOT, MOVER_UID, &[NODE_A, NODE_B])?;
    let first = OperatorProcess::start(LEASE, HOST_ROOT, LEASE).await?;
    let ns = TestNamespace::create("sched-outage").await?;
    let (src, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 10, 1, "sched-outage")?;
    let api: Api<Transfer> = ns.api();
    let spec = serde_json::json!({"schedule": {"cron": "* * * * *"}});
    let t = transfer("nightly", (NODE_A, &src), (NODE_B, &dst), spec)?;
    api.create(&PostParams::default(), &t).await?;
    wait_phase(&api, "nightly", Duration::from_secs(90), Phase::Succeeded).await?;

    // Down across two scheduled times.
    first.kill();
    let down = Timestamp::now();
    let second_boundary = minute_boundary(2);
    wait_past(second_boundary, 2).await?;
    let before = api.get("nightly").await?.status.unwrap_or_default();
    let back = Timestamp::now();
    let _second = OperatorProcess::start(LEASE, HOST_ROOT, LEASE).await?;

    let st = wait_status(
        &api,
        "nightly",
        Duration::from_secs(90),
        "the catch-up run to finish",
        |s| s.history.iter().any(|h| h.run == before.run + 1),
    )
    .await?;
    let catch_up = st
        .history
        .iter()
        .find(|h| h.run == before.run + 1)
        .context("catch-up")?;
    assert_eq!(catch_up.cause, RunCause::Scheduled, "{catch_up:?}");
    let at = catch_up
        .scheduled_time
        .as_ref()
        .context("scheduled time")?
        .0;
    assert!(
        at.as_second() >= second_boundary && at <= back,
        "the catch-up is for the latest missed time ({second_boundary}): {at}"
    );
    // Exactly one run for the times missed while it was down.
    let for_missed: Vec<u32> = st
        .history
        .iter()
        .filter(|h| {
            h.scheduled_time
                .as_ref()
                .is_some_and(|s| s.0 > down && s.0 <= back)
        })
        .map(|h| h.run)
        .collect();
    assert_eq!(for_missed, [before.run + 1], "{:#?}", st.history);
    let notes = events_of(&ns.name, "nightly", "Scheduled").await?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("run {} starts", before.run + 1))
                && n.contains("catches them up")),
        "{notes:?}"
    );
    assert_same_tree(&src_host, &dst_host)?;
    Ok(())
}
