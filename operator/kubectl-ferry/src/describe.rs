//! `kubectl ferry describe`: the Transfer's spec in short, its status, conditions, mover pods
//! and Events, as one text page.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::format::{human_age, human_bytes, human_rate};
use super::get::{phase_name, progress_cell};
use super::table::Table;
use ferry_api::names::{LABEL_ATTEMPT, LABEL_ROLE};
use ferry_api::{Endpoint, Transfer, TransferStatus};

/// Everything `describe` shows, as read from the API server.
#[derive(Debug, Clone)]
pub struct DescribeInput<'a> {
    pub transfer: &'a Transfer,
    /// The Transfer's pods (by label), in any order.
    pub pods: &'a [Pod],
    /// Events about the Transfer (by its UID), in any order.
    pub events: &'a [Event],
    pub now: Timestamp,
}

pub fn render_describe(input: &DescribeInput<'_>) -> String {
    let t = input.transfer;
    let now = input.now;
    let empty = TransferStatus::default();
    let st = t.status.as_ref().unwrap_or(&empty);
    let spec = &t.spec;
    let mut out = String::new();
    let mut field = |name: &str, value: String| {
        let _ = writeln!(out, "{:<15}{value}", format!("{name}:"));
    };
    field("Name", t.name_any());
    field("Namespace", t.namespace().unwrap_or_default());
    field(
        "Created",
        t.metadata
            .creation_timestamp
            .as_ref()
            .map(|c| {
                format!(
                    "{} ({} ago)",
                    c.0,
                    human_age(now.as_second() - c.0.as_second())
                )
            })
            .unwrap_or_else(|| "<unknown>".into()),
    );
    field("Source", endpoint(&spec.source));
    field("Destination", endpoint(&spec.destination));
    let mut options = vec![
        match spec.streams {
            Some(n) => format!("streams {n}"),
            None => "streams (operator default)".into(),
        },
        match spec.compression {
            Some(c) => format!("compression {}", c.flag()),
            None => "compression (operator default)".into(),
        },
        format!("dedup {}", on_off(spec.dedup)),
        format!("checksum {}", on_off(spec.checksum)),
        format!("deleteExtraneous {}", on_off(spec.delete_extraneous)),
        format!("sync {}", on_off(spec.sync)),
    ];
    if let Some(limit) = &spec.bandwidth_limit {
        options.push(format!("bandwidthLimit {}/s", limit.0));
    }
    field("Options", options.join(", "));
    let mut lifecycle = vec![format!("backoffLimit {}", spec.backoff_limit)];
    if let Some(d) = spec.active_deadline_seconds {
        lifecycle.push(format!("activeDeadlineSeconds {d}"));
    }
    if let Some(ttl) = spec.ttl_seconds_after_finished {
        lifecycle.push(format!("ttlSecondsAfterFinished {ttl}"));
    }
    if spec.suspend {
        lifecycle.push("suspended".into());
    }
    if let Some(trigger) = &spec.trigger {
        lifecycle.push(format!("trigger {trigger:?}"));
    }
    field("Lifecycle", lifecycle.join(", "));
    if let Some(sched) = &spec.schedule {
        field("Schedule", schedule_line(sched, st, spec.suspend, now));
    }
    field("Phase", phase_name(st.phase).to_owned());
    field(
        "Run",
        format!(
            "{}, attempts {}, failures {} (of {} allowed)",
            st.run, st.attempts, st.failures, spec.backoff_limit
        ),
    );
    if let Some(s) = &st.start_time {
        field("Started", at_and_age(&s.0, now));
    }
    if let Some(c) = &st.completion_time {
        field("Completed", at_and_age(&c.0, now));
    }
    if let Some(r) = &st.retry_after {
        field("Retry After", r.0.to_string());
    }
    if let Some(p) = &st.progress {
        let mut files = format!("files {}/{}", p.files_done, p.files_total);
        if p.files_skipped > 0 {
            files.push_str(&format!(" ({} unchanged)", p.files_skipped));
        }
        field("Progress", format!("{}, {files}", progress_cell(st)));
    }
    if let Some(tp) = &st.throughput {
        field(
            "Throughput",
            format!(
                "current {}, average {}",
                human_rate(tp.current_bytes_per_second),
                human_rate(tp.average_bytes_per_second)
            ),
        );
    }
    if let Some(eta) = &st.eta {
        field("ETA", eta.clone());
    }
    if let Some(w) = &st.wire {
        field(
            "Wire",
            format!(
                "{} received, ratio {}, dedup {} blocks ({}), resumed {}",
                human_bytes(w.bytes),
                w.compression_ratio,
                w.dedup_blocks,
                human_bytes(w.dedup_bytes),
                human_bytes(w.resumed_bytes)
            ),
        );
    }
    if let Some(d) = &st.digest {
        field("Digest", d.clone());
    }
    field(
        "Last Error",
        st.last_error
            .as_ref()
            .map(|e| format!("{}: {}", e.reason, e.message))
            .unwrap_or_else(|| "<none>".into()),
    );

    out.push_str("Conditions:\n");
    if st.conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut table = Table::new(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]);
        for c in &st.conditions {
            table.push([
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                human_age(now.as_second() - c.last_transition_time.0.as_second()),
                c.message.clone(),
            ]);
        }
        out.push_str(&table.render("  "));
    }

    if !st.destinations.is_empty() {
        out.push_str("Destinations:\n");
        out.push_str(&render_destinations(st));
    }

    if !st.history.is_empty() {
        out.push_str("Runs:\n");
        out.push_str(&render_history(st, now));
    }

    out.push_str("Mover Pods:\n");
    out.push_str(&render_pods(st, input.pods));

    out.push_str("Events:\n");
    out.push_str(&render_events(input.events, now));
    out
}

/// A fan-out's nodes: each one's Transfer, phase, attempts, progress and what stops it.
fn render_destinations(st: &TransferStatus) -> String {
    let mut table = Table::new([
        "NODE",
        "TRANSFER",
        "PHASE",
        "ATTEMPTS",
        "PROGRESS",
        "RATE",
        "FROM STORES",
        "MESSAGE",
    ]);
    for d in &st.destinations {
        table.push([
            d.node.clone(),
            d.transfer.clone(),
            phase_name(d.phase).to_owned(),
            d.attempts.to_string(),
            format!(
                "{} {}/{}",
                if d.progress.is_empty() {
                    "-"
                } else {
                    &d.progress
                },
                human_bytes(d.bytes_done),
                human_bytes(d.bytes_total)
            ),
            human_rate(d.bytes_per_second),
            human_bytes(d.dedup_bytes),
            d.message.clone().unwrap_or_default(),
        ]);
    }
    table.render("  ")
}

/// "0 2 * * * (Europe/Berlin), Forbid; next 2026-11-28T01:00:00Z (in 2h), last success ...".
fn schedule_line(
    sched: &ferry_api::ScheduleSpec,
    st: &TransferStatus,
    suspended: bool,
    now: Timestamp,
) -> String {
    let mut line = format!(
        "{} ({}), {:?}",
        sched.cron,
        sched.time_zone.as_deref().unwrap_or("UTC"),
        sched.concurrency_policy
    );
    if let Some(d) = sched.starting_deadline_seconds {
        line.push_str(&format!(", startingDeadlineSeconds {d}"));
    }
    match &st.next_run_time {
        _ if suspended => line.push_str("; suspended"),
        Some(next) => line.push_str(&format!(
            "; next {} (in {})",
            next.0,
            human_age(next.0.as_second() - now.as_second())
        )),
        None => {}
    }
    if let Some(ok) = &st.last_success_time {
        line.push_str(&format!(
            "; last success {} ago",
            human_age(now.as_second() - ok.0.as_second())
        ));
    }
    if st.skipped_runs > 0 {
        line.push_str(&format!("; {} scheduled times skipped", st.skipped_runs));
    }
    line
}

/// The finished runs, newest first: why each started, how long it took, what it moved.
fn render_history(st: &TransferStatus, now: Timestamp) -> String {
    let mut table = Table::new([
        "RUN", "CAUSE", "STARTED", "DURATION", "RESULT", "FILES", "BYTES", "WIRE", "DEDUP",
        "ATTEMPTS", "MESSAGE",
    ]);
    for h in &st.history {
        let duration = match (&h.start_time, &h.completion_time) {
            (Some(s), Some(c)) => human_age(c.0.as_second() - s.0.as_second()),
            _ => "-".into(),
        };
        table.push([
            h.run.to_string(),
            format!("{:?}", h.cause),
            h.start_time
                .as_ref()
                .map(|s| format!("{} ago", human_age(now.as_second() - s.0.as_second())))
                .unwrap_or_else(|| "-".into()),
            duration,
            format!("{:?}", h.result),
            h.files.to_string(),
            human_bytes(h.bytes),
            human_bytes(h.wire_bytes),
            human_bytes(h.dedup_bytes),
            h.attempts.to_string(),
            h.message.clone().unwrap_or_default(),
        ]);
    }
    table.render("  ")
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn at_and_age(t: &Timestamp, now: Timestamp) -> String {
    format!("{t} ({} ago)", human_age(now.as_second() - t.as_second()))
}

/// "hostPath node-a:/data/src", "pvc scratch:/copy", "remote peer/ns/name".
pub fn endpoint(e: &Endpoint) -> String {
    if let Some(h) = &e.host_path {
        let place = host_path_place(h);
        match h.min_available {
            Some(m) => format!("{place} (minAvailable {m})"),
            None => place,
        }
    } else if let Some(p) = &e.pvc {
        let path = if p.path.is_empty() { "/" } else { &p.path };
        format!("pvc {}:{path}", p.claim_name)
    } else if let Some(r) = &e.remote {
        format!("remote {}/{}/{}", r.peer, r.namespace, r.name)
    } else {
        "<none>".into()
    }
}

/// Where a hostPath endpoint is: one node, a list of nodes, or the nodes labels select.
fn host_path_place(h: &ferry_api::HostPathEndpoint) -> String {
    if !h.nodes.is_empty() {
        let nodes: Vec<&str> = h.nodes.iter().map(|n| n.0.as_str()).collect();
        format!("hostPath {{{}}}:{}", nodes.join(","), h.path)
    } else if let Some(sel) = &h.node_selector {
        let labels: Vec<String> = sel
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={}", v.0))
            .collect();
        format!("hostPath nodes labelled {}:{}", labels.join(","), h.path)
    } else {
        format!("hostPath {}:{}", h.node, h.path)
    }
}

/// The pods the status names and those found by label, each with its state and, once its
/// container ended, the exit code and the termination message (the mover's last log lines on
/// error), indented below.
fn render_pods(st: &TransferStatus, pods: &[Pod]) -> String {
    let mut pods: Vec<&Pod> = pods.iter().collect();
    pods.sort_by_key(|p| (label(p, LABEL_ATTEMPT), label(p, LABEL_ROLE), p.name_any()));
    let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let mut missing = Vec::new();
    for (role, m) in [("sender", &st.sender), ("receiver", &st.receiver)] {
        if let Some(m) = m
            && !names.contains(&m.pod)
        {
            names.push(m.pod.clone());
            missing.push((role, m));
        }
    }
    if pods.is_empty() && missing.is_empty() {
        return "  <none>\n".into();
    }
    let mut table = Table::new(["NAME", "ROLE", "ATTEMPT", "NODE", "PHASE", "EXIT CODE"]);
    let mut messages = Vec::new();
    for p in &pods {
        let terminated = terminated(p);
        table.push([
            p.name_any(),
            label(p, LABEL_ROLE),
            label(p, LABEL_ATTEMPT),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "-".into()),
            p.status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Unknown".into()),
            terminated
                .map(|t| t.exit_code.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
        if let Some(msg) = terminated
            .and_then(|t| t.message.as_deref())
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            messages.push((p.name_any(), msg.to_owned()));
        }
    }
    for (role, m) in missing {
        table.push([
            m.pod.clone(),
            role.to_owned(),
            "-".into(),
            m.node.clone().unwrap_or_else(|| "-".into()),
            "(deleted)".into(),
            "-".into(),
        ]);
    }
    let mut out = table.render("  ");
    for (name, msg) in messages {
        let _ = writeln!(out, "  Termination message of {name}:");
        for line in msg.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

fn label(p: &Pod, key: &str) -> String {
    p.labels().get(key).cloned().unwrap_or_else(|| "-".into())
}

/// The first container's current termination, else its last one.
fn terminated(p: &Pod) -> Option<&ContainerStateTerminated> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    cs.state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
}

/// When an Event was last seen, whichever API wrote it.
fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn render_events(events: &[Event], now: Timestamp) -> String {
    if events.is_empty() {
        return "  <none>\n".into();
    }
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| event_time(e));
    let mut table = Table::new(["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]);
    for e in events {
        let count = e
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(e.count)
            .filter(|c| *c > 1);
        let age = event_time(e)
            .map(|t| human_age(now.as_second() - t.as_second()))
            .unwrap_or_else(|| "<unknown>".into());
        table.push([
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            match count {
                Some(c) => format!("{age} (x{c})"),
                None => age,
            },
            e.reporting_component
                .clone()
                .filter(|c| !c.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_default(),
            e.message.clone().unwrap_or_default(),
        ]);
    }
    table.render("  ")
}

#[cfg(test)]
mod tests {
    use super::super::get::tests::{at, running, transfer};
    use super::*;
    use ferry_api::{Phase, TransferStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn pod(name: &str, role: &str, value: serde_json::Value) -> Pod {
        let mut p: Pod = serde_json::from_value(value).unwrap_or_else(|e| panic!("pod: {e}"));
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(
            [
                (LABEL_ROLE.to_owned(), role.to_owned()),
                (LABEL_ATTEMPT.to_owned(), "1-2".to_owned()),
            ]
            .into(),
        );
        p
    }

    fn event(reason: &str, kind: &str, secs: i64, message: &str) -> Event {
        let mut e: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": reason}, "involvedObject": {},
            "reason": reason, "type": kind, "message": message,
            "reportingComponent": "ferry-operator",
        }))
        .unwrap_or_else(|e| panic!("event: {e}"));
        e.event_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            at(secs).0,
        ));
        e
    }

    #[test]
    fn a_failed_transfer_shows_spec_conditions_pods_with_exit_codes_and_events() {
        let mut st: TransferStatus = running();
        st.phase = Phase::Failed;
        st.run = 1;
        st.conditions.push(Condition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: "SourceUnreadable".into(),
            message: "cannot read private".into(),
            observed_generation: Some(1),
            last_transition_time: at(1_000 + 50),
        });
        st.last_error = Some(ferry_api::LastError {
            reason: "SourceUnreadable".into(),
            message: "cannot read private".into(),
        });
        let mut t = transfer("stage", Some(st));
        t.spec.bandwidth_limit = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "50M".into(),
        ));
        let pods = [pod(
            "ferry-0f1e2d3c4b5a-1-2-send",
            "sender",
            serde_json::json!({
                "spec": {"nodeName": "node-a", "containers": []},
                "status": {"phase": "Failed", "containerStatuses": [{
                    "name": "mover", "image": "m", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 3, "message": "error: permission denied\nat private\n"}}
                }]}
            }),
        )];
        let events = [
            event("Failed", "Warning", 1_000 + 50, "source unreadable"),
            event("Started", "Normal", 1_000 + 1, "attempt 1 started"),
        ];
        let out = render_describe(&DescribeInput {
            transfer: &t,
            pods: &pods,
            events: &events,
            now: at(1_000 + 110).0,
        });
        for want in [
            "Name:          stage\n",
            "Namespace:     ml\n",
            "Source:        hostPath node-a:/data/src\n",
            "Destination:   pvc scratch:/copy\n",
            "bandwidthLimit 50M/s",
            "Phase:         Failed\n",
            "Run:           1, attempts 2, failures 1 (of 3 allowed)\n",
            "Progress:      37% (3.0 GiB/8.0 GiB), files 540/1281\n",
            "Last Error:    SourceUnreadable: cannot read private\n",
            "  TYPE     STATUS   REASON             AGE   MESSAGE\n",
            "  Failed   True     SourceUnreadable   60s   cannot read private\n",
            "  ferry-0f1e2d3c4b5a-1-2-send   sender     1-2       node-a   Failed      3\n",
            "  ferry-0f1e2d3c4b5a-1-2-recv   receiver   -         node-b   (deleted)   -\n",
            "  Termination message of ferry-0f1e2d3c4b5a-1-2-send:\n    error: permission denied\n    at private\n",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        let started = out.find("Normal    Started").unwrap_or(usize::MAX);
        let failed = out.find("Warning   Failed").unwrap_or(0);
        assert!(started < failed, "events not in time order:\n{out}");
        assert!(
            out.contains("109s   ferry-operator   attempt 1 started"),
            "{out}"
        );
    }

    #[test]
    fn a_scheduled_transfer_shows_its_schedule_and_its_runs() {
        use ferry_api::{RunCause, RunRecord, RunResult, ScheduleSpec};
        let mut st = running();
        st.phase = Phase::Succeeded;
        st.next_run_time = Some(at(1_000 + 3_600));
        st.last_success_time = Some(at(1_000 - 60));
        st.skipped_runs = 2;
        st.history = vec![
            RunRecord {
                run: 3,
                cause: RunCause::Scheduled,
                start_time: Some(at(1_000 - 120)),
                completion_time: Some(at(1_000 - 60)),
                result: RunResult::Succeeded,
                files: 4,
                bytes: 4 << 20,
                wire_bytes: 5 << 20,
                attempts: 1,
                ..Default::default()
            },
            RunRecord {
                run: 2,
                cause: RunCause::Triggered,
                result: RunResult::Failed,
                attempts: 4,
                message: Some("MoverFailed: disk full".into()),
                ..Default::default()
            },
        ];
        let mut t = transfer("nightly", Some(st));
        t.spec.schedule = Some(ScheduleSpec {
            cron: "0 * * * *".into(),
            time_zone: Some("Europe/Berlin".into()),
            ..Default::default()
        });
        let out = render_describe(&DescribeInput {
            transfer: &t,
            pods: &[],
            events: &[],
            now: at(1_000).0,
        });
        for want in [
            "Schedule:      0 * * * * (Europe/Berlin), Forbid; next 1970-01-01T01:16:40Z (in 60m); last success 60s ago; 2 scheduled times skipped\n",
            "Runs:\n  RUN   CAUSE       STARTED   DURATION   RESULT      FILES   BYTES     WIRE      DEDUP   ATTEMPTS   MESSAGE\n",
            "  3     Scheduled   2m ago    60s        Succeeded   4       4.0 MiB   5.0 MiB   0 B     1",
            "  2     Triggered   -         -          Failed      0       0 B       0 B       0 B     4          MoverFailed: disk full\n",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }

    #[test]
    fn a_new_transfer_has_nothing_yet() {
        let t = transfer("fresh", None);
        let out = render_describe(&DescribeInput {
            transfer: &t,
            pods: &[],
            events: &[],
            now: at(1_000).0,
        });
        assert!(out.contains("Phase:         Pending\n"), "{out}");
        assert!(
            out.contains("Conditions:\n  <none>\nMover Pods:\n  <none>\nEvents:\n  <none>\n"),
            "{out}"
        );
        assert!(out.contains("Last Error:    <none>\n"), "{out}");
    }

    #[test]
    fn a_fan_out_lists_its_destinations() {
        let mut st = running();
        st.destinations = vec![
            ferry_api::DestinationStatus {
                node: "gpu-1".into(),
                transfer: "stage-gpu-1".into(),
                phase: Phase::Succeeded,
                attempts: 1,
                bytes_done: 1 << 30,
                bytes_total: 1 << 30,
                progress: "100%".into(),
                dedup_bytes: 768 << 20,
                ..Default::default()
            },
            ferry_api::DestinationStatus {
                node: "gpu-2".into(),
                transfer: "stage-gpu-2".into(),
                phase: Phase::Retrying,
                attempts: 2,
                message: Some("MoverFailed: connection reset".into()),
                ..Default::default()
            },
        ];
        let mut t = transfer("stage", Some(st));
        let hp = ferry_api::HostPathEndpoint {
            nodes: vec![
                ferry_api::NodeName("gpu-1".into()),
                ferry_api::NodeName("gpu-2".into()),
            ],
            path: "/scratch/in".into(),
            min_available: Some(1),
            ..Default::default()
        };
        t.spec.destination = Endpoint {
            host_path: Some(hp),
            ..Endpoint::default()
        };
        let out = render_describe(&DescribeInput {
            transfer: &t,
            pods: &[],
            events: &[],
            now: at(1_000).0,
        });
        for want in [
            "Destination:   hostPath {gpu-1,gpu-2}:/scratch/in (minAvailable 1)\n",
            "Destinations:\n  NODE    TRANSFER      PHASE",
            "gpu-1   stage-gpu-1   Succeeded   1          100% 1.0 GiB/1.0 GiB",
            "768.0 MiB",
            "gpu-2   stage-gpu-2   Retrying    2",
            "MoverFailed: connection reset",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }
}
