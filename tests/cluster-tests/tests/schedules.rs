//! Scheduled Transfers on the real cluster: a cron schedule runs the Transfer again (an
//! unchanged tree then sends no file data), a time that comes while a run is going is skipped
//! (Forbid) or takes over (Replace), suspend pauses the schedule and resume catches up once,
//! and schedules the operator cannot honour are refused at apply or create nothing.
//!
//! Every schedule here fires each minute, so a test waits for a minute boundary at most a few
//! times; each wait is on the Transfer's status, never a fixed sleep.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::argocd::argocd_health;
use ferry_cluster_tests::operator::kubectl;
use ferry_cluster_tests::transfers::{
    NODE_A, NODE_B, SharedOperator, assert_same_tree, make_tree, minute_boundary, node_dir,
    transfer, wait_past, wait_phase, wait_status,
};
use ferry_cluster_tests::{TestNamespace, wait_until};
use ferry_operator::api::{Phase, RunCause, RunResult, Transfer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const HOST_ROOT: &str = "/data/ferry-schedules";
static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-schedules", HOST_ROOT);

/// A minute boundary and a run: the longest any one wait here takes.
const RUN_WAIT: Duration = Duration::from_secs(150);

fn every_minute(extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({"schedule": {"cron": "* * * * *"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    spec
}

async fn suspend(api: &Api<Transfer>, name: &str, on: bool) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": on}})),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_every_minute_schedule_runs_again_and_an_unchanged_tree_sends_no_file_data()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("sched-sync").await?;
    let (src, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 40, 8, "sched-sync")?;
    let api: Api<Transfer> = ns.api();
    let t = transfer(
        "nightly",
        (NODE_A, &src),
        (NODE_B, &dst),
        every_minute(json!({})),
    )?;
    api.create(&PostParams::default(), &t).await?;

    let st = wait_status(&api, "nightly", RUN_WAIT, "run 2 to finish", |s| {
        s.history.iter().any(|h| h.run == 2)
    })
    .await?;
    let files = assert_same_tree(&src_host, &dst_host)?;
    let first = st.history.iter().find(|h| h.run == 1).context("run 1")?;
    assert_eq!(first.cause, RunCause::Created, "{first:?}");
    assert_eq!(first.result, RunResult::Succeeded, "{first:?}");
    assert_eq!(first.files as usize, files, "{first:?}");
    assert!(first.bytes >= 8 << 20, "{first:?}");
    let second = st.history.iter().find(|h| h.run == 2).context("run 2")?;
    assert_eq!(second.cause, RunCause::Scheduled, "{second:?}");
    assert_eq!(second.result, RunResult::Succeeded, "{second:?}");
    let at = second.scheduled_time.as_ref().context("scheduled time")?.0;
    assert_eq!(
        at.as_second() % 60,
        0,
        "a schedule's time is a whole minute: {at}"
    );
    let started = second.start_time.as_ref().context("start")?.0;
    assert!(
        started >= at && started.as_second() - at.as_second() < 30,
        "run 2 for {at} started at {started}"
    );
    assert_eq!(
        second.files, 0,
        "an unchanged tree rewrote files: {second:?}"
    );
    assert!(
        second.wire_bytes < 1 << 20,
        "an unchanged tree moved {} bytes over the wire",
        second.wire_bytes
    );
    assert!(st.last_success_time.is_some(), "{st:?}");
    let next = st.next_run_time.as_ref().context("next run time")?.0;
    assert!(
        next > at && next.as_second() % 60 == 0,
        "next {next} after {at}"
    );

    // Argo CD sees a scheduled Transfer whose last run succeeded as Healthy, between runs and
    // during the next one.
    let (health, message) = argocd_health(&api.get("nightly").await?)?;
    assert_eq!(health, "Healthy", "{message}");

    // kubectl get shows when it last succeeded and when it runs next.
    let table = kubectl(&["get", "xfer", "nightly", "-n", &ns.name])?;
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("LAST SUCCESS") && header.contains("NEXT RUN"),
        "{table}"
    );
    assert!(
        table.contains(&format!("{}", next.strftime("%Y-%m-%dT%H:%M"))),
        "{table}"
    );
    Ok(())
}

/// 64 files of 1 MiB at 1 MiB/s: every run of it is going when a minute boundary comes.
fn slow_tree(host: &std::path::Path, seed: &str) -> anyhow::Result<()> {
    for i in 0..64u32 {
        let mut x =
            ((u64::from(i) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.len() as u64) | 1;
        let mut body = Vec::with_capacity(1 << 20);
        while body.len() < 1 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            body.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(host.join(format!("part-{i:02}.bin")), body)?;
    }
    ferry_cluster_tests::transfers::chown_tree(host)
}

#[tokio::test]
async fn a_time_that_comes_during_a_run_is_skipped_under_forbid_and_takes_over_under_replace()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("sched-overlap").await?;
    let api: Api<Transfer> = ns.api();
    for (name, policy) in [("forbid", "Forbid"), ("replace", "Replace")] {
        let (src, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, &format!("{name}-src"))?;
        let (dst, _) = node_dir(HOST_ROOT, NODE_B, &ns.name, &format!("{name}-dst"))?;
        slow_tree(&src_host, name)?;
        let spec = json!({
            "schedule": {"cron": "* * * * *", "concurrencyPolicy": policy},
            "bandwidthLimit": "1Mi", "compression": "none", "dedup": false,
        });
        let t = transfer(name, (NODE_A, &src), (NODE_B, &dst), spec)?;
        api.create(&PostParams::default(), &t).await?;
    }

    // Forbid: run 1 goes on through the boundary, the time is counted as skipped.
    let st = wait_status(&api, "forbid", RUN_WAIT, "a skipped scheduled time", |s| {
        s.skipped_runs >= 1
    })
    .await?;
    assert_eq!(st.run, 1, "{st:?}");
    assert!(!st.phase.is_finished(), "{st:?}");
    let st = wait_phase(&api, "forbid", RUN_WAIT, Phase::Succeeded).await?;
    let st = st.status.unwrap_or_default();
    assert_eq!(
        st.history.first().map(|h| (h.run, h.result)),
        Some((1, RunResult::Succeeded))
    );
    wait_until(Duration::from_secs(30), "the RunSkipped Event", || {
        let ns = ns.name.clone();
        async move {
            let notes = ferry_cluster_tests::events_of(&ns, "forbid", "RunSkipped").await?;
            Ok(notes.iter().any(|m| m.contains("run 1 was still going")))
        }
    })
    .await?;

    // Replace: run 1 gives way at the boundary, a run after it finishes the tree (resuming
    // from the files run 1 wrote).
    let st = wait_status(
        &api,
        "replace",
        RUN_WAIT,
        "a replaced run, then a success",
        |s| {
            s.history.iter().any(|h| h.result == RunResult::Replaced)
                && s.history
                    .first()
                    .is_some_and(|h| h.result == RunResult::Succeeded)
        },
    )
    .await?;
    let replaced = st
        .history
        .iter()
        .find(|h| h.run == 1)
        .context("run 1 in the history")?;
    assert_eq!(replaced.result, RunResult::Replaced, "{st:#?}");
    assert_eq!(st.skipped_runs, 0, "{st:#?}");
    let (_, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, "replace-src")?;
    let (_, dst_host) = node_dir(HOST_ROOT, NODE_B, &ns.name, "replace-dst")?;
    assert_eq!(assert_same_tree(&src_host, &dst_host)?, 64);
    Ok(())
}

#[tokio::test]
async fn suspend_pauses_the_schedule_and_resume_catches_up_once() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("sched-suspend").await?;
    let (src, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 10, 1, "sched-suspend")?;
    let api: Api<Transfer> = ns.api();
    let t = transfer(
        "paused",
        (NODE_A, &src),
        (NODE_B, &dst),
        every_minute(json!({})),
    )?;
    api.create(&PostParams::default(), &t).await?;
    wait_phase(&api, "paused", RUN_WAIT, Phase::Succeeded).await?;
    suspend(&api, "paused", true).await?;
    let st = wait_status(&api, "paused", RUN_WAIT, "the next run time to go", |s| {
        s.next_run_time.is_none()
    })
    .await?;
    let run = st.run;
    let (health, message) = argocd_health(&api.get("paused").await?)?;
    assert_eq!(health, "Suspended", "{message}");
    assert!(
        message.starts_with("the schedule is suspended"),
        "{message}"
    );
    // Past the next minute boundary, suspended: no run starts.
    let boundary = minute_boundary(1);
    wait_past(boundary, 5).await?;
    let st = api.get("paused").await?.status.unwrap_or_default();
    assert_eq!(st.run, run, "a suspended schedule started a run: {st:?}");
    assert_eq!(st.phase, Phase::Succeeded);

    let resumed = Timestamp::now();
    suspend(&api, "paused", false).await?;
    let st = wait_status(
        &api,
        "paused",
        RUN_WAIT,
        "the catch-up run to finish",
        |s| s.history.first().is_some_and(|h| h.run == run + 1),
    )
    .await?;
    let catch_up = &st.history[0];
    assert_eq!(catch_up.cause, RunCause::Scheduled, "{catch_up:?}");
    let at = catch_up
        .scheduled_time
        .as_ref()
        .context("scheduled time")?
        .0;
    assert!(
        at <= resumed && at.as_second() >= boundary,
        "caught up {at}, resumed {resumed}"
    );
    // One run for the missed times: no other run is for a time before the resume.
    let earlier = st
        .history
        .iter()
        .filter(|h| h.scheduled_time.as_ref().is_some_and(|s| s.0 <= resumed))
        .count();
    assert_eq!(earlier, 1, "{:#?}", st.history);
    Ok(())
}

#[tokio::test]
async fn schedules_the_operator_cannot_honour_are_refused_or_create_nothing() -> anyhow::Result<()>
{
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("sched-bad").await?;
    let (src, _) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();

    // Refused at apply by the CRD's own rules.
    for (name, spec, message) in [
        (
            "words",
            json!({"schedule": {"cron": "every night"}}),
            "schedule.cron takes five fields",
        ),
        (
            "zone-path",
            json!({"schedule": {"cron": "0 2 * * *", "timeZone": "../etc/passwd"}}),
            "schedule.timeZone is an IANA zone name",
        ),
        (
            "ttl",
            json!({"schedule": {"cron": "0 2 * * *"}, "ttlSecondsAfterFinished": 60}),
            "ttlSecondsAfterFinished would delete it",
        ),
    ] {
        let t = transfer(name, (NODE_A, &src), (NODE_B, &dst), spec)?;
        let err = api
            .create(&PostParams::default(), &t)
            .await
            .expect_err(&format!("{name} was accepted"));
        assert!(err.to_string().contains(message), "{name}: {err}");
    }

    // Well-formed but impossible: a condition that says why, and no mover pod.
    for (name, schedule, message) in [
        (
            "minute-61",
            json!({"cron": "61 * * * *"}),
            "spec.schedule.cron: minute: 61 is out of range 0-59",
        ),
        (
            "atlantis",
            json!({"cron": "0 2 * * *", "timeZone": "Europe/Atlantis"}),
            "spec.schedule.timeZone: \"Europe/Atlantis\" is not a time zone",
        ),
        (
            "february-30",
            json!({"cron": "0 0 30 2 *"}),
            "names a date that never comes",
        ),
    ] {
        let t = transfer(
            name,
            (NODE_A, &src),
            (NODE_B, &dst),
            json!({"schedule": schedule}),
        )?;
        api.create(&PostParams::default(), &t).await?;
        let st = wait_status(&api, name, RUN_WAIT, "the InvalidSpec condition", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
        })
        .await?;
        let ready = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .context("Ready")?;
        assert!(ready.message.contains(message), "{name}: {}", ready.message);
        assert_eq!(st.phase, Phase::Pending, "{name}");
        assert!(st.next_run_time.is_none(), "{name}: {st:?}");
    }
    let pods: Api<Pod> = ns.api();
    assert!(pods.list(&ListParams::default()).await?.items.is_empty());
    Ok(())
}

/// A scheduled Transfer whose run failed waits for its next time, and Argo CD shows it Degraded
/// with that time; the failure is in the history.
#[tokio::test]
async fn a_failed_scheduled_run_waits_for_the_next_time_and_is_degraded() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("sched-fail").await?;
    let (dst, _) = node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    let missing = format!("{HOST_ROOT}/{}/no-such-source", ns.name);
    let api: Api<Transfer> = ns.api();
    // Yearly: no second run comes within the test.
    let spec = json!({"schedule": {"cron": "@yearly"}, "backoffLimit": 0});
    let t = transfer("broken", (NODE_A, &missing), (NODE_B, &dst), spec)?;
    api.create(&PostParams::default(), &t).await?;
    let st = wait_status(&api, "broken", RUN_WAIT, "run 1 to fail", |s| {
        s.phase == Phase::Failed
    })
    .await?;
    let run = st.history.first().context("run 1 in the history")?;
    assert_eq!((run.run, run.result), (1, RunResult::Failed), "{run:?}");
    assert!(
        run.message
            .as_deref()
            .is_some_and(|m| m.starts_with("SourceUnreadable")),
        "{run:?}"
    );
    let next = st.next_run_time.as_ref().context("next run time")?.0;
    assert!(
        next > Timestamp::now() && next.as_second() % 3600 == 0,
        "{next}"
    );
    let (health, message) = argocd_health(&api.get("broken").await?)?;
    assert_eq!(health, "Degraded", "{message}");
    assert!(
        message.contains(&format!("next run at {next}")),
        "{message}"
    );
    Ok(())
}
