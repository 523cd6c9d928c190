//! `kubectl ferry get`: one row per Transfer with its figures.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::format::{human_age, human_bytes, human_rate};
use super::table::Table;
use ferry_api::{Phase, Transfer, TransferStatus};

/// How `get` lays out its table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetLayout {
    /// A NAMESPACE column first (`--all-namespaces`).
    pub namespace: bool,
    /// Mover nodes and the digest too (`-o wide`).
    pub wide: bool,
}

/// The table of `transfers` as seen at `now`.
pub fn render_get(transfers: &[Transfer], layout: GetLayout, now: Timestamp) -> String {
    let mut headers = Vec::new();
    if layout.namespace {
        headers.push("NAMESPACE");
    }
    headers.extend([
        "NAME",
        "PHASE",
        "PROGRESS",
        "FILES",
        "THROUGHPUT",
        "AVG",
        "ETA",
        "ATTEMPTS",
        "AGE",
    ]);
    if layout.wide {
        headers.extend(["SENDER NODE", "RECEIVER NODE", "DIGEST", "NEXT RUN"]);
    }
    let mut table = Table::new(headers);
    for t in transfers {
        let empty = TransferStatus::default();
        let st = t.status.as_ref().unwrap_or(&empty);
        let mut row = Vec::new();
        if layout.namespace {
            row.push(t.namespace().unwrap_or_default());
        }
        row.extend([
            t.name_any(),
            phase_cell(st),
            progress_cell(st),
            files_cell(st),
            current_rate_cell(st),
            average_rate_cell(st),
            st.eta.clone().unwrap_or_else(|| "-".into()),
            attempts_cell(st),
            age_cell(t, now),
        ]);
        if layout.wide {
            let node = |m: &Option<ferry_api::MoverRef>| {
                m.as_ref()
                    .and_then(|m| m.node.clone())
                    .unwrap_or_else(|| "-".into())
            };
            row.extend([
                node(&st.sender),
                node(&st.receiver),
                st.digest.clone().unwrap_or_else(|| "-".into()),
                next_run_cell(t, st, now),
            ]);
        }
        table.push(row);
    }
    table.render("")
}

/// When a scheduled Transfer runs next ("in 3m"), "suspended", or "-" without a schedule.
fn next_run_cell(t: &Transfer, st: &TransferStatus, now: Timestamp) -> String {
    match (&t.spec.schedule, &st.next_run_time) {
        (None, _) => "-".into(),
        (Some(_), _) if t.spec.suspend => "suspended".into(),
        (Some(_), Some(next)) => format!(
            "in {}",
            super::format::human_age(next.0.as_second() - now.as_second())
        ),
        (Some(_), None) => "-".into(),
    }
}

/// Attempts of the current run; for a fan-out, how many of its nodes are done.
pub fn attempts_cell(st: &TransferStatus) -> String {
    if st.destinations.is_empty() {
        return st.attempts.to_string();
    }
    let done = st
        .destinations
        .iter()
        .filter(|d| d.phase == Phase::Succeeded)
        .count();
    format!("{done}/{} nodes", st.destinations.len())
}

/// The phase; `Pending` and `Retrying` add the `Ready` condition's reason when it says more.
pub fn phase_cell(st: &TransferStatus) -> String {
    let phase = phase_name(st.phase);
    let reason = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "False")
        .map(|c| c.reason.as_str())
        .filter(|r| !r.is_empty() && *r != phase);
    match (st.phase, reason) {
        (Phase::Pending | Phase::Retrying, Some(r)) => format!("{phase} ({r})"),
        _ => phase.to_owned(),
    }
}

pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Retrying => "Retrying",
        Phase::Suspended => "Suspended",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
    }
}

/// "42% (1.2 GiB/2.8 GiB)"; the total ends in "+" while the sender is still counting.
pub fn progress_cell(st: &TransferStatus) -> String {
    match &st.progress {
        None => "-".into(),
        Some(p) => format!(
            "{}% ({}/{}{})",
            p.percent,
            human_bytes(p.bytes_done),
            human_bytes(p.bytes_total),
            if p.totals_final { "" } else { "+" }
        ),
    }
}

fn files_cell(st: &TransferStatus) -> String {
    match &st.progress {
        None => "-".into(),
        Some(p) => format!(
            "{}/{}{}",
            p.files_done,
            p.files_total,
            if p.totals_final { "" } else { "+" }
        ),
    }
}

/// The current rate while movers run ("-" otherwise: it is 0 once they stopped).
fn current_rate_cell(st: &TransferStatus) -> String {
    match (&st.throughput, st.phase) {
        (Some(t), Phase::Running) => human_rate(t.current_bytes_per_second),
        _ => "-".into(),
    }
}

fn average_rate_cell(st: &TransferStatus) -> String {
    match &st.throughput {
        Some(t) if t.average_bytes_per_second > 0 => human_rate(t.average_bytes_per_second),
        _ => "-".into(),
    }
}

fn age_cell(t: &Transfer, now: Timestamp) -> String {
    t.metadata
        .creation_timestamp
        .as_ref()
        .map(|c| human_age(now.as_second() - c.0.as_second()))
        .unwrap_or_else(|| "<unknown>".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ferry_api::{MoverRef, ProgressStatus, ThroughputStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    pub(crate) fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap_or_default())
    }

    pub(crate) fn transfer(name: &str, status: Option<TransferStatus>) -> Transfer {
        let mut t: Transfer = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name, "namespace": "ml", "uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
            "spec": {
                "source": {"hostPath": {"node": "node-a", "path": "/data/src"}},
                "destination": {"pvc": {"claimName": "scratch", "path": "/copy"}},
            }
        }))
        .unwrap_or_else(|e| panic!("test transfer: {e}"));
        t.metadata.creation_timestamp = Some(at(1_000));
        t.status = status;
        t
    }

    pub(crate) fn running() -> TransferStatus {
        TransferStatus {
            phase: Phase::Running,
            attempts: 2,
            failures: 1,
            progress: Some(ProgressStatus {
                bytes_done: 3 << 30,
                bytes_total: 8 << 30,
                files_done: 540,
                files_total: 1281,
                percent: 37,
                totals_final: true,
                ..Default::default()
            }),
            throughput: Some(ThroughputStatus {
                current_bytes_per_second: 48 << 20,
                average_bytes_per_second: 40 << 20,
                display: String::new(),
            }),
            eta: Some("2m8s".into()),
            sender: Some(MoverRef {
                pod: "ferry-0f1e2d3c4b5a-1-2-send".into(),
                node: Some("node-a".into()),
            }),
            receiver: Some(MoverRef {
                pod: "ferry-0f1e2d3c4b5a-1-2-recv".into(),
                node: Some("node-b".into()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_running_and_a_new_transfer() {
        let list = [transfer("stage", Some(running())), transfer("fresh", None)];
        let out = render_get(&list, GetLayout::default(), at(1_000 + 310).0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAME",
                "PHASE",
                "PROGRESS",
                "FILES",
                "THROUGHPUT",
                "AVG",
                "ETA",
                "ATTEMPTS",
                "AGE"
            ]
        );
        assert_eq!(
            lines[1],
            "stage   Running   37% (3.0 GiB/8.0 GiB)   540/1281   48.0 MiB/s   40.0 MiB/s   2m8s   2          5m10s"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["fresh", "Pending", "-", "-", "-", "-", "-", "0", "5m10s"]
        );
    }

    #[test]
    fn finished_transfers_show_no_current_rate_and_wide_adds_nodes_and_digest() {
        let mut st = running();
        st.phase = Phase::Succeeded;
        st.eta = None;
        st.digest = Some("ab".repeat(32));
        if let Some(p) = st.progress.as_mut() {
            p.bytes_done = p.bytes_total;
            p.files_done = p.files_total;
            p.percent = 100;
        }
        let out = render_get(
            &[transfer("done", Some(st))],
            GetLayout {
                namespace: true,
                wide: true,
            },
            at(1_000 + 86_400 * 3).0,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE   NAME"), "{out}");
        assert!(
            lines[0].contains("SENDER NODE   RECEIVER NODE   DIGEST")
                && lines[0].ends_with("NEXT RUN"),
            "{out}"
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells[..4], ["ml", "done", "Succeeded", "100%"], "{out}");
        assert_eq!(
            cells[4..],
            [
                "(8.0",
                "GiB/8.0",
                "GiB)",
                "1281/1281",
                "-",
                "40.0",
                "MiB/s",
                "-",
                "2",
                "3d",
                "node-a",
                "node-b",
                &"ab".repeat(32),
                "-",
            ],
            "{out}"
        );
    }

    #[test]
    fn wide_shows_when_a_scheduled_transfer_runs_next() {
        let mut st = running();
        st.phase = Phase::Succeeded;
        st.next_run_time = Some(at(1_000 + 600));
        let mut t = transfer("nightly", Some(st));
        t.spec.schedule = Some(ferry_api::ScheduleSpec {
            cron: "*/10 * * * *".into(),
            ..Default::default()
        });
        let wide = GetLayout {
            namespace: false,
            wide: true,
        };
        let out = render_get(std::slice::from_ref(&t), wide, at(1_000).0);
        assert!(out.lines().nth(1).unwrap().ends_with("in 10m"), "{out}");
        t.spec.suspend = true;
        let out = render_get(&[t], wide, at(1_000).0);
        assert!(out.lines().nth(1).unwrap().ends_with("suspended"), "{out}");
    }

    #[test]
    fn a_fan_out_counts_its_nodes_done_in_place_of_attempts() {
        let mut st = running();
        assert_eq!(attempts_cell(&st), st.attempts.to_string());
        for (node, phase) in [
            ("a", Phase::Succeeded),
            ("b", Phase::Running),
            ("c", Phase::Succeeded),
        ] {
            st.destinations.push(ferry_api::DestinationStatus {
                node: node.into(),
                phase,
                ..Default::default()
            });
        }
        assert_eq!(attempts_cell(&st), "2/3 nodes");
    }

    #[test]
    fn counting_totals_end_in_plus_and_a_blocked_transfer_shows_its_reason() {
        let mut st = running();
        if let Some(p) = st.progress.as_mut() {
            p.totals_final = false;
        }
        assert_eq!(progress_cell(&st), "37% (3.0 GiB/8.0 GiB+)");
        assert_eq!(files_cell(&st), "540/1281+");
        st.phase = Phase::Pending;
        st.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "HostPathNotAllowed".into(),
            message: "x".into(),
            observed_generation: None,
            last_transition_time: at(0),
        });
        assert_eq!(phase_cell(&st), "Pending (HostPathNotAllowed)");
        st.conditions[0].reason = "Pending".into();
        assert_eq!(phase_cell(&st), "Pending");
        st.phase = Phase::Running;
        st.conditions[0].reason = "HostPathNotAllowed".into();
        assert_eq!(phase_cell(&st), "Running");
    }
}
