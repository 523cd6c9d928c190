//! The Argo CD health check of Transfers (`deploy/argocd/transfer-health.lua`), run by Lua 5.4
//! as Argo CD runs it: on fixtures for each of its rules, on real Transfers of the local cluster
//! in each state, and kept the same as its copy in `docs/operator.md`.
//!
//! The fixtures and the copy need no cluster; the test on real Transfers starts an operator of
//! its own, as the other operator tests do.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::argocd::{
    HEALTH_SCRIPT, argocd_health, argocd_health_json, run_health_script, workspace_root,
};
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, SharedOperator, make_tree, transfer, wait_phase,
};
use ferry_cluster_tests::{TestNamespace, wait_until};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A Transfer as the API server returns it, with `spec` fields added to a minimal spec and
/// `status` as given (`None`: a Transfer the operator has not seen yet).
fn fixture(spec: Value, status: Option<Value>) -> Value {
    let mut full = json!({
        "source": {"hostPath": {"node": "node-a", "path": "/data/src"}},
        "destination": {"pvc": {"claimName": "target"}},
        "suspend": false,
    });
    if let (Some(s), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    let mut obj = json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "Transfer",
        "metadata": {"name": "t", "namespace": "ns", "generation": 1},
        "spec": full,
    });
    if let Some(status) = status {
        obj["status"] = status;
    }
    obj
}

/// A status in `phase` whose Ready condition says `ready` (none when empty), with the other
/// conditions and figures a real one carries; `extra` adds fields.
fn status(phase: &str, ready: &str, extra: Value) -> Value {
    let mut conditions = vec![json!({
        "type": "Succeeded", "status": "False", "reason": "Running", "message": "not yet",
        "observedGeneration": 1, "lastTransitionTime": "2025-01-01T00:00:00Z",
    })];
    if !ready.is_empty() {
        conditions.insert(
            0,
            json!({
                "type": "Ready", "status": "False", "reason": "Whatever", "message": ready,
                "observedGeneration": 1, "lastTransitionTime": "2025-01-01T00:00:00Z",
            }),
        );
    }
    let mut st = json!({
        "phase": phase,
        "conditions": conditions,
        "observedGeneration": 1,
        "run": 5,
        "attempts": 1,
        "failures": 0,
        "progress": {"bytesDone": 10, "bytesTotal": 20, "filesDone": 1, "filesTotal": 2,
                     "percent": 50, "totalsFinal": true, "display": "50%"},
    });
    if let (Some(s), Some(e)) = (st.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    st
}

/// A Transfer with no schedule in `phase`, its Ready condition saying `ready`.
fn single(phase: &str, ready: &str) -> Value {
    fixture(json!({}), Some(status(phase, ready, json!({}))))
}

/// One finished run of a scheduled Transfer, as `status.history` lists it.
fn run(run: u32, result: &str, message: &str) -> Value {
    json!({
        "run": run, "cause": "Scheduled", "scheduledTime": "2025-01-01T01:00:00Z",
        "startTime": "2025-01-01T01:00:01Z", "completionTime": "2025-01-01T01:02:00Z",
        "result": result, "bytes": 1048576, "files": 12, "wireBytes": 524288,
        "dedupBytes": 0, "attempts": 1, "message": message,
    })
}

/// `spec` fields of a scheduled Transfer, with `extra`.
fn scheduled(extra: Value) -> Value {
    let mut spec = json!({"schedule": {"cron": "0 * * * *", "timeZone": "Europe/Berlin",
        "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 300}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    spec
}

/// What a case expects: the status, and the message exactly or what it must contain.
enum Message<'a> {
    Is(&'a str),
    Has(&'a [&'a str]),
}

/// A fixture's name, the Transfer, and the status and message it should get.
type Case = (&'static str, Value, &'static str, Message<'static>);

/// Runs every case and fails once, listing each case that did not give what it expects.
fn check_cases(cases: &[Case]) {
    let mut wrong = Vec::new();
    for (name, obj, want_status, want_message) in cases {
        match argocd_health_json(obj) {
            Err(e) => wrong.push(format!("{name}: {e:#}")),
            Ok((status, message)) => {
                let message_ok = match want_message {
                    Message::Is(m) => message == *m,
                    Message::Has(parts) => parts.iter().all(|p| message.contains(p)),
                };
                if status != *want_status || !message_ok {
                    wrong.push(format!(
                        "{name}: got ({status}, {message:?}), want {want_status} with {}",
                        match want_message {
                            Message::Is(m) => format!("message {m:?}"),
                            Message::Has(parts) => format!("a message containing {parts:?}"),
                        }
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_single_run_is_healthy_as_its_phase_says_with_the_ready_message() {
    check_cases(&[
        (
            "no status yet",
            fixture(json!({}), None),
            "Progressing",
            Message::Is(""),
        ),
        (
            "Pending",
            single("Pending", "waiting for claim target"),
            "Progressing",
            Message::Is("waiting for claim target"),
        ),
        (
            "Running",
            single("Running", "attempt 1: moving data"),
            "Progressing",
            Message::Is("attempt 1: moving data"),
        ),
        (
            "Retrying",
            single("Retrying", "attempt 1 failed; attempt 2 starts"),
            "Progressing",
            Message::Is("attempt 1 failed; attempt 2 starts"),
        ),
        (
            "Succeeded",
            single("Succeeded", "copied 12 files"),
            "Healthy",
            Message::Is("copied 12 files"),
        ),
        (
            "Failed",
            single("Failed", "attempt 1 failed"),
            "Degraded",
            Message::Is("attempt 1 failed"),
        ),
        (
            "Suspended",
            fixture(
                json!({"suspend": true}),
                Some(status("Suspended", "spec.suspend is set", json!({}))),
            ),
            "Suspended",
            Message::Is("spec.suspend is set"),
        ),
        (
            "Succeeded without a Ready condition",
            single("Succeeded", ""),
            "Healthy",
            Message::Is(""),
        ),
        (
            // Argo CD sees a JSON null as nil.
            "nulls where lists and times would be",
            fixture(
                json!({"trigger": null}),
                Some(json!({"phase": "Running", "conditions": null, "startTime": null})),
            ),
            "Progressing",
            Message::Is(""),
        ),
        (
            "a phase with no rule of its own",
            single("SomethingNew", "new"),
            "Progressing",
            Message::Is("new"),
        ),
        (
            // Only a scheduled Transfer has runs to look back on.
            "history without a schedule",
            fixture(
                json!({}),
                Some(status(
                    "Running",
                    "moving",
                    json!({"history": [run(1, "Failed", "x")]}),
                )),
            ),
            "Progressing",
            Message::Is("moving"),
        ),
    ]);
}

/// Scheduled Transfers in each state the rules tell apart.
fn scheduled_cases() -> Vec<Case> {
    let next = json!({"nextRunTime": "2030-01-01T02:00:00Z"});
    let older = run(3, "Succeeded", "run 3 copied 12 files");
    vec![
        (
            "suspended between runs",
            fixture(
                scheduled(json!({"suspend": true})),
                Some(status("Succeeded", "run 4 copied 12 files", next.clone())),
            ),
            "Suspended",
            Message::Is("the schedule is suspended; run 4 copied 12 files"),
        ),
        (
            "suspended mid-run",
            fixture(
                scheduled(json!({"suspend": true})),
                Some(status(
                    "Suspended",
                    "spec.suspend is set: movers stopped",
                    json!({"history": [run(4, "Failed", "run 4 failed")]}),
                )),
            ),
            "Suspended",
            Message::Has(&["the schedule is suspended", "spec.suspend is set"]),
        ),
        (
            "suspended before the first run",
            fixture(scheduled(json!({"suspend": true})), None),
            "Suspended",
            Message::Is("the schedule is suspended"),
        ),
        (
            "suspended while the phase still says Running",
            fixture(
                scheduled(json!({"suspend": true})),
                Some(status("Running", "attempt 1: moving data", json!({}))),
            ),
            "Suspended",
            Message::Has(&["the schedule is suspended"]),
        ),
        (
            "between runs after a success",
            fixture(
                scheduled(json!({})),
                Some(status("Succeeded", "run 4 copied 12 files", next.clone())),
            ),
            "Healthy",
            Message::Has(&["run 4 copied 12 files", "next run at 2030-01-01T02:00:00Z"]),
        ),
        (
            "between runs after a failure",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Failed",
                    "run 4: the source is missing",
                    next.clone(),
                )),
            ),
            "Degraded",
            Message::Has(&[
                "run 4: the source is missing",
                "next run at 2030-01-01T02:00:00Z",
            ]),
        ),
        (
            "between runs, no next run known",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Succeeded",
                    "run 4 copied 12 files",
                    json!({"nextRunTime": null}),
                )),
            ),
            "Healthy",
            Message::Is("run 4 copied 12 files"),
        ),
        (
            "running after a success",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Running",
                    "attempt 1: moving data",
                    json!({"history": [run(4, "Succeeded", "run 4 copied 12 files"), older.clone()]}),
                )),
            ),
            "Healthy",
            Message::Is("run 5 in progress; the last run succeeded"),
        ),
        (
            "retrying after a success",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Retrying",
                    "attempt 1 failed",
                    json!({"history": [run(4, "Succeeded", "ok")]}),
                )),
            ),
            "Healthy",
            Message::Is("run 5 in progress; the last run succeeded"),
        ),
        (
            "pending after a failure",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Pending",
                    "attempt 1: starting",
                    json!({"history": [run(4, "Failed", "run 4: the source is missing"), older.clone()]}),
                )),
            ),
            "Degraded",
            Message::Is("run 4: the source is missing"),
        ),
        (
            "running, no run finished yet",
            fixture(
                scheduled(json!({})),
                Some(status("Running", "attempt 1: moving data", json!({}))),
            ),
            "Progressing",
            Message::Is("attempt 1: moving data"),
        ),
        (
            "running, an empty history",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Running",
                    "attempt 1: moving data",
                    json!({"history": []}),
                )),
            ),
            "Progressing",
            Message::Is("attempt 1: moving data"),
        ),
        (
            // Only the newest entry counts: a replaced run says nothing of the data.
            "running after a replaced run",
            fixture(
                scheduled(json!({})),
                Some(status(
                    "Running",
                    "attempt 1: moving data",
                    json!({"history": [run(4, "Replaced", "replaced by run 5"), older]}),
                )),
            ),
            "Progressing",
            Message::Is("attempt 1: moving data"),
        ),
        (
            "scheduled, no status yet",
            fixture(scheduled(json!({})), None),
            "Progressing",
            Message::Is(""),
        ),
    ]
}

#[test]
fn a_scheduled_transfer_is_healthy_as_its_last_run_ended() {
    check_cases(&scheduled_cases());
}

/// The script reads the fields as the operator's types name them: each scheduled fixture,
/// read into a `Transfer` and written back, gets the same answer.
#[test]
fn the_scheduled_fixtures_are_transfers_as_the_operator_writes_them() -> anyhow::Result<()> {
    for (name, obj, ..) in scheduled_cases() {
        let typed: Transfer = ferry_cluster_tests::from_json(obj.clone()).context(name)?;
        assert_eq!(
            argocd_health(&typed)?,
            argocd_health_json(&obj)?,
            "{name}: the typed Transfer got another answer"
        );
    }
    Ok(())
}

/// A health script of the test's own, in a file of its own.
fn script(name: &str, body: &str) -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("ferry-argocd-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, body)?;
    Ok(path.display().to_string())
}

#[test]
fn the_runner_sees_the_object_as_argo_cd_does_and_fails_clearly() -> anyhow::Result<()> {
    // JSON null is nil; a whole number prints as one.
    let echo = script(
        "echo.lua",
        r#"return {status = obj.status == nil and "Healthy" or "Degraded",
                   message = tostring(obj.spec.n) .. " " .. tostring(obj.spec.gone)}"#,
    )?;
    let seen = run_health_script(
        &echo,
        &json!({"status": null, "spec": {"n": 3, "gone": null}}),
    )?;
    assert_eq!(seen, ("Healthy".to_owned(), "3 nil".to_owned()));

    let failing = script("failing.lua", r#"error("no such field")"#)?;
    let err = format!("{:#}", run_health_script(&failing, &json!({})).unwrap_err());
    assert!(
        err.contains("failed") && err.contains("no such field"),
        "{err}"
    );

    let silent = script("silent.lua", "return {message = \"hm\"}")?;
    let err = format!("{:#}", run_health_script(&silent, &json!({})).unwrap_err());
    assert!(err.contains("returned no status Argo CD knows"), "{err}");

    let unknown = script("unknown.lua", "return {status = \"Fine\"}")?;
    let err = format!("{:#}", run_health_script(&unknown, &json!({})).unwrap_err());
    assert!(err.contains("got Fine"), "{err}");
    std::fs::remove_dir_all(std::path::Path::new(&echo).parent().context("no dir")?)?;
    Ok(())
}

#[test]
fn the_doc_shows_the_script_verbatim() -> anyhow::Result<()> {
    let root = workspace_root();
    let script = std::fs::read_to_string(root.join(HEALTH_SCRIPT))?;
    let doc = std::fs::read_to_string(root.join("docs/operator.md"))?;
    // The ConfigMap's block scalar: every line of the script, in order, indented 4 spaces.
    let indented: String = script
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_owned()
            } else {
                format!("    {l}\n")
            }
        })
        .collect();
    let missing: Vec<&str> = script
        .lines()
        .filter(|l| !l.is_empty() && !doc.contains(&format!("    {l}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operator.md lacks these lines of {HEALTH_SCRIPT}:\n{}",
        missing.join("\n")
    );
    let block = format!("  resource.customizations.health.ferry.dev_Transfer: |\n{indented}```\n");
    assert!(
        doc.contains(&block),
        "docs/operator.md's argocd-cm does not hold {HEALTH_SCRIPT} verbatim (4 spaces in), \
         whole and alone"
    );
    Ok(())
}

// On the local cluster.

const HOST_ROOT: &str = "/data/ferry-argocd";

static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-argocd", HOST_ROOT);

/// The Ready condition's message (empty when there is none).
fn ready_message(t: &Transfer) -> String {
    t.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Asserts the health of `t` (as read from the API) is `want`, with the Ready condition's
/// message, which is not empty.
fn assert_health(t: &Transfer, want: &str) -> anyhow::Result<()> {
    let (status, message) = argocd_health(t)?;
    let ready = ready_message(t);
    let name = t.metadata.name.as_deref().unwrap_or_default();
    anyhow::ensure!(
        !ready.is_empty(),
        "{name} has no Ready message: {:?}",
        t.status
    );
    anyhow::ensure!(
        (status.as_str(), message.as_str()) == (want, ready.as_str()),
        "{name}: got ({status}, {message:?}), want ({want}, {ready:?}); status {:?}",
        t.status
    );
    Ok(())
}

async fn set_suspend(api: &Api<Transfer>, name: &str, suspend: bool) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": suspend}})),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_health_check_reads_real_transfers_in_each_state() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("argocd-health").await?;
    let api: Api<Transfer> = ns.api();
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "dst")?;
    // 40 MiB at 4 MiB/s: running for about 10 s, long enough to be seen and suspended mid-run.
    make_tree(&src_host, 10, 40, &ns.name)?;
    let limited = json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false});
    let moving = transfer("moving", (NODE_A, &src), (NODE_B, &dst), limited)?;
    // A destination claim that does not exist: Pending for as long as it is missing.
    let mut waiting = transfer("waiting", (NODE_A, &src), (NODE_B, &dst), json!({}))?;
    waiting.spec.destination =
        ferry_cluster_tests::from_json(json!({"pvc": {"claimName": "missing"}}))?;
    // A source directory that does not exist, no retries.
    let nowhere = format!("{HOST_ROOT}/{}/nowhere", ns.name);
    let (dst2, _) = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, "dst2")?;
    let broken = transfer(
        "broken",
        (NODE_A, &nowhere),
        (NODE_B, &dst2),
        json!({"backoffLimit": 0}),
    )?;
    for t in [&moving, &waiting, &broken] {
        api.create(&PostParams::default(), t).await?;
    }

    // Running, then Suspended mid-run, then Succeeded once resumed.
    let t = wait_phase(&api, "moving", Duration::from_secs(120), Phase::Running).await?;
    assert_health(&t, "Progressing")?;
    set_suspend(&api, "moving", true).await?;
    let t = wait_phase(&api, "moving", Duration::from_secs(60), Phase::Suspended).await?;
    assert_health(&t, "Suspended")?;
    set_suspend(&api, "moving", false).await?;
    let t = wait_phase(&api, "moving", Duration::from_secs(180), Phase::Succeeded).await?;
    assert_health(&t, "Healthy")?;
    transfers::assert_same_tree(&src_host, &dst_host)?;

    // Pending, with the reason it waits for.
    wait_until(
        Duration::from_secs(60),
        "waiting to report DestinationClaimNotFound",
        || {
            let api = api.clone();
            async move {
                let t = api.get("waiting").await?;
                Ok(t.status.is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "DestinationClaimNotFound")
                }))
            }
        },
    )
    .await?;
    let t = api.get("waiting").await?;
    let phase = t.status.as_ref().map(|s| s.phase);
    anyhow::ensure!(phase == Some(Phase::Pending), "waiting is {phase:?}");
    assert_health(&t, "Progressing")?;

    // Failed: the sender reports the missing source as a source fault no retry fixes
    // (SourceUnreadable), at once, whatever the backoffLimit.
    let t = wait_phase(&api, "broken", Duration::from_secs(120), Phase::Failed).await?;
    assert_health(&t, "Degraded")?;

    // Gone while this operator runs (its finalizer's cleanup), so no namespace stays behind.
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_until(
        Duration::from_secs(150),
        "the Transfers to be deleted",
        || {
            let api = api.clone();
            async move { Ok(api.list(&ListParams::default()).await?.items.is_empty()) }
        },
    )
    .await?;
    ns.delete().await
}
