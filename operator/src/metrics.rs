//! The operator's figures and its readiness flag, served with the health endpoints by
//! [`ferry_proto::exposition`] (plain HTTP on the metrics address).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ferry_proto::exposition::{Exposition, counters, gauges};
use kube::ResourceExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::api::{Phase, Transfer, TransferStatus};

#[derive(Default)]
pub struct Metrics {
    reconciles: AtomicU64,
    status_patches: AtomicU64,
    progress_patches: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Last phase and current throughput seen per Transfer UID (for the gauges and the finished
    /// counters).
    phases: Mutex<BTreeMap<String, (Phase, u64)>>,
    retries: AtomicU64,
    bytes_moved: AtomicU64,
    files_moved: AtomicU64,
    finished: Mutex<BTreeMap<&'static str, u64>>,
    ready: AtomicBool,
    reconcile_durations: Mutex<Histogram>,
    queued: AtomicUsize,
    /// The figures of each Running Transfer, by (namespace, name): bounded by the Transfers
    /// running at once (an entry leaves when its Transfer leaves Running or is forgotten).
    running: Mutex<BTreeMap<(String, String), RunningTransfer>>,
    /// The schedule's figures of each scheduled Transfer, by (namespace, name): bounded by the
    /// Transfers that exist (an entry leaves with its Transfer).
    scheduled: Mutex<BTreeMap<(String, String), ScheduleFigures>>,
    /// Kubernetes API requests by (verb, resource, status code or `error`).
    api_requests: Mutex<BTreeMap<(&'static str, String, String), u64>>,
}

/// Upper bounds (seconds) of the reconcile duration histogram's buckets (`+Inf` is implied).
pub const RECONCILE_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Observations per bucket (not cumulative), the last for those above every bound.
    counts: [u64; RECONCILE_BUCKETS.len() + 1],
    sum: f64,
}

/// A scheduled Transfer's figures, for alerts such as "no success in 26 h".
#[derive(Debug, Clone)]
struct ScheduleFigures {
    uid: String,
    /// Unix seconds; absent until the first success / while suspended.
    last_success: Option<i64>,
    next_run: Option<i64>,
    /// Seconds the latest finished run took.
    last_duration: Option<i64>,
    skipped: u32,
}

/// One figure of a [`ScheduleFigures`], when it has a value.
type ScheduleFigure = fn(&ScheduleFigures) -> Option<i64>;

/// One figure of a [`RunningTransfer`] (a per-Transfer gauge's value).
type Figure = fn(&RunningTransfer) -> u64;

#[derive(Debug, Clone)]
struct RunningTransfer {
    uid: String,
    bytes_done: u64,
    bytes_total: u64,
    bytes_per_second: u64,
}

impl Metrics {
    pub fn reconcile(&self) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
    }
    /// One status patch; `progress_only` when nothing but the moving figures changed.
    pub fn status_patch(&self, progress_only: bool) {
        let counter = if progress_only {
            &self.progress_patches
        } else {
            &self.status_patches
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    /// How long one reconcile took (the `ferry_reconcile_duration_seconds` histogram).
    pub fn reconcile_duration(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = RECONCILE_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(RECONCILE_BUCKETS.len());
        if let Ok(mut h) = self.reconcile_durations.lock() {
            h.counts[bucket] += 1;
            h.sum += secs;
        }
    }
    /// Transfers waiting for a slot under the --max-active limits (`ferry_transfers_queued`).
    pub fn set_queue_depth(&self, queued: usize) {
        self.queued.store(queued, Ordering::Relaxed);
    }
    /// One Kubernetes API request (counted by [`crate::api_metrics::ApiMetricsLayer`]):
    /// `code` is the HTTP status code, or `error` when no response came.
    pub fn api_request(&self, verb: &'static str, resource: &str, code: &str) {
        if let Ok(mut a) = self.api_requests.lock() {
            *a.entry((verb, resource.to_owned(), code.to_owned()))
                .or_default() += 1;
        }
    }
    pub fn reconcile_error(&self, category: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry(category).or_default() += 1;
        }
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    /// Folds one reconcile's outcome in: phase gauges, finished and retry counters, bytes and
    /// files of Transfers that succeeded, current throughput, the per-Transfer figures of a
    /// Running one.
    pub fn observe(&self, t: &Transfer, new: &TransferStatus) {
        let uid = t.uid().unwrap_or_default();
        let old = t.status.clone().unwrap_or_default();
        self.observe_running(t, &uid, new);
        self.observe_schedule(t, &uid, new);
        if new.run == old.run && new.failures > old.failures {
            self.retries
                .fetch_add(u64::from(new.failures - old.failures), Ordering::Relaxed);
        }
        let rate = match new.phase {
            Phase::Running => new
                .throughput
                .as_ref()
                .map_or(0, |t| t.current_bytes_per_second),
            _ => 0,
        };
        let Ok(mut phases) = self.phases.lock() else {
            return;
        };
        let before = phases.insert(uid, (new.phase, rate)).map(|(p, _)| p);
        let newly_finished = new.phase.is_finished()
            && before.is_none_or(|b| !b.is_finished())
            && !old.phase.is_finished();
        if !newly_finished {
            return;
        }
        if new.phase == Phase::Succeeded
            && let Some(p) = &new.progress
        {
            self.bytes_moved.fetch_add(p.bytes_done, Ordering::Relaxed);
            self.files_moved.fetch_add(p.files_done, Ordering::Relaxed);
        }
        if let Ok(mut f) = self.finished.lock() {
            let outcome = if new.phase == Phase::Succeeded {
                "succeeded"
            } else {
                "failed"
            };
            *f.entry(outcome).or_default() += 1;
        }
    }

    fn observe_running(&self, t: &Transfer, uid: &str, new: &TransferStatus) {
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        let key = (t.namespace().unwrap_or_default(), t.name_any());
        if new.phase != Phase::Running {
            // Only this Transfer's entry: a newer one of the same name keeps its own.
            if running.get(&key).is_some_and(|r| r.uid == uid) {
                running.remove(&key);
            }
            return;
        }
        let progress = new.progress.as_ref();
        running.insert(
            key,
            RunningTransfer {
                uid: uid.to_owned(),
                bytes_done: progress.map_or(0, |p| p.bytes_done),
                bytes_total: progress.map_or(0, |p| p.bytes_total),
                bytes_per_second: new
                    .throughput
                    .as_ref()
                    .map_or(0, |t| t.current_bytes_per_second),
            },
        );
    }

    fn observe_schedule(&self, t: &Transfer, uid: &str, new: &TransferStatus) {
        let Ok(mut scheduled) = self.scheduled.lock() else {
            return;
        };
        let key = (t.namespace().unwrap_or_default(), t.name_any());
        if t.spec.schedule.is_none() {
            if scheduled.get(&key).is_some_and(|s| s.uid == uid) {
                scheduled.remove(&key);
            }
            return;
        }
        let last_duration = new.history.first().and_then(|h| {
            Some(h.completion_time.as_ref()?.0.as_second() - h.start_time.as_ref()?.0.as_second())
        });
        scheduled.insert(
            key,
            ScheduleFigures {
                uid: uid.to_owned(),
                last_success: new.last_success_time.as_ref().map(|t| t.0.as_second()),
                next_run: new.next_run_time.as_ref().map(|t| t.0.as_second()),
                last_duration,
                skipped: new.skipped_runs,
            },
        );
    }

    /// A deleted Transfer leaves the gauges.
    pub fn forget(&self, uid: &str) {
        if let Ok(mut phases) = self.phases.lock() {
            phases.remove(uid);
        }
        if let Ok(mut running) = self.running.lock() {
            running.retain(|_, r| r.uid != uid);
        }
        if let Ok(mut scheduled) = self.scheduled.lock() {
            scheduled.retain(|_, s| s.uid != uid);
        }
    }

    /// This moment's figures, for one scrape.
    pub fn snapshot(&self) -> Snapshot {
        let (active, rate, by_phase) = self
            .phases
            .lock()
            .map(|p| {
                let active = p.values().filter(|(p, _)| !p.is_finished()).count();
                let mut by_phase = [0usize; PHASES.len()];
                for (phase, _) in p.values() {
                    if let Some(i) = PHASES.iter().position(|(q, _)| q == phase) {
                        by_phase[i] += 1;
                    }
                }
                (active, p.values().map(|(_, r)| r).sum::<u64>(), by_phase)
            })
            .unwrap_or_default();
        let copy = |m: &Mutex<BTreeMap<&'static str, u64>>| {
            m.lock().map(|m| m.clone()).unwrap_or_default()
        };
        Snapshot {
            reconciles: self.reconciles.load(Ordering::Relaxed),
            status_patches: self.status_patches.load(Ordering::Relaxed),
            progress_patches: self.progress_patches.load(Ordering::Relaxed),
            errors: copy(&self.errors),
            finished: copy(&self.finished),
            active,
            by_phase,
            queued: self.queued.load(Ordering::Relaxed),
            rate,
            retries: self.retries.load(Ordering::Relaxed),
            bytes_moved: self.bytes_moved.load(Ordering::Relaxed),
            files_moved: self.files_moved.load(Ordering::Relaxed),
            durations: self
                .reconcile_durations
                .lock()
                .map(|h| h.clone())
                .unwrap_or_default(),
            running: self.running.lock().map(|r| r.clone()).unwrap_or_default(),
            scheduled: self.scheduled.lock().map(|s| s.clone()).unwrap_or_default(),
            api_requests: self
                .api_requests
                .lock()
                .map(|a| a.clone())
                .unwrap_or_default(),
        }
    }

    /// This moment's figures in Prometheus' text format.
    pub fn render(&self) -> String {
        ferry_proto::exposition::render(Box::new(self.snapshot())).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "failed to render the metrics");
            String::new()
        })
    }
}

impl Exposition for Metrics {
    async fn collect(&self) -> Result<Box<dyn Collector>, String> {
        Ok(Box::new(self.snapshot()))
    }
    fn ready(&self) -> bool {
        self.is_ready()
    }
}

/// The figures of one scrape, copied out of [`Metrics`] so that the encoding holds no lock.
#[derive(Debug)]
pub struct Snapshot {
    reconciles: u64,
    status_patches: u64,
    progress_patches: u64,
    errors: BTreeMap<&'static str, u64>,
    finished: BTreeMap<&'static str, u64>,
    active: usize,
    by_phase: [usize; PHASES.len()],
    queued: usize,
    rate: u64,
    retries: u64,
    bytes_moved: u64,
    files_moved: u64,
    durations: Histogram,
    running: BTreeMap<(String, String), RunningTransfer>,
    scheduled: BTreeMap<(String, String), ScheduleFigures>,
    api_requests: BTreeMap<(&'static str, String, String), u64>,
}

impl Collector for Snapshot {
    fn encode(&self, mut out: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let none: [(&str, &str); 0] = [];
        counters(
            &mut out,
            "ferry_reconciles",
            "Reconciles run.",
            [(none, self.reconciles)],
        )?;
        counters(
            &mut out,
            "ferry_status_patches",
            "Status patches written: lifecycle changes, or the moving figures only.",
            [
                ([("kind", "lifecycle")], self.status_patches),
                ([("kind", "progress")], self.progress_patches),
            ],
        )?;
        counters(
            &mut out,
            "ferry_reconcile_errors",
            "Reconciles that failed, by error category.",
            self.errors.iter().map(|(c, n)| ([("category", *c)], *n)),
        )?;
        counters(
            &mut out,
            "ferry_transfers_finished",
            "Transfers that finished, by outcome.",
            self.finished.iter().map(|(o, n)| ([("outcome", *o)], *n)),
        )?;
        gauges(
            &mut out,
            "ferry_transfers_active",
            "Transfers not finished.",
            [(none, self.active)],
        )?;
        gauges(
            &mut out,
            "ferry_transfers",
            "Transfers by phase.",
            PHASES
                .iter()
                .zip(self.by_phase)
                .map(|((_, name), n)| ([("phase", *name)], n)),
        )?;
        gauges(
            &mut out,
            "ferry_transfers_queued",
            "Transfers waiting for a slot under the --max-active limits.",
            [(none, self.queued)],
        )?;
        gauges(
            &mut out,
            "ferry_throughput_bytes_per_second",
            "The current throughput of every running Transfer together.",
            [(none, self.rate)],
        )?;
        counters(
            &mut out,
            "ferry_retries",
            "Attempts that failed and were retried.",
            [(none, self.retries)],
        )?;
        counters(
            &mut out,
            "ferry_bytes_moved",
            "Bytes of the Transfers that succeeded.",
            [(none, self.bytes_moved)],
        )?;
        counters(
            &mut out,
            "ferry_files_moved",
            "Files of the Transfers that succeeded.",
            [(none, self.files_moved)],
        )?;
        let h = &self.durations;
        let buckets: Vec<(f64, u64)> = RECONCILE_BUCKETS.iter().copied().zip(h.counts).collect();
        let mut histogram = out.encode_descriptor(
            "ferry_reconcile_duration_seconds",
            "How long one reconcile took.",
            None,
            MetricType::Histogram,
        )?;
        histogram.encode_histogram::<NoLabelSet>(h.sum, h.counts.iter().sum(), &buckets, None)?;

        let per_transfer: [(&str, &str, Figure); 3] = [
            (
                "ferry_transfer_bytes_done",
                "Bytes a running Transfer has moved.",
                |r| r.bytes_done,
            ),
            (
                "ferry_transfer_bytes_total",
                "Bytes a running Transfer moves.",
                |r| r.bytes_total,
            ),
            (
                "ferry_transfer_throughput_bytes_per_second",
                "A running Transfer's current throughput.",
                |r| r.bytes_per_second,
            ),
        ];
        for (name, help, value) in per_transfer {
            gauges(
                &mut out,
                name,
                help,
                self.running
                    .iter()
                    .map(|((ns, n), r)| (object(ns, n), value(r))),
            )?;
        }
        let schedule_gauges: [(&str, &str, ScheduleFigure); 3] = [
            (
                "ferry_schedule_last_success_timestamp_seconds",
                "Unix time of a scheduled Transfer's last successful run.",
                |s| s.last_success,
            ),
            (
                "ferry_schedule_next_run_timestamp_seconds",
                "Unix time of a scheduled Transfer's next run.",
                |s| s.next_run,
            ),
            (
                "ferry_schedule_last_run_duration_seconds",
                "Seconds a scheduled Transfer's latest finished run took.",
                |s| s.last_duration,
            ),
        ];
        for (name, help, value) in schedule_gauges {
            gauges(
                &mut out,
                name,
                help,
                self.scheduled
                    .iter()
                    .filter_map(|((ns, n), s)| Some((object(ns, n), value(s)?))),
            )?;
        }
        counters(
            &mut out,
            "ferry_schedule_skipped_runs",
            "Runs a scheduled Transfer skipped (the previous one still running, or missed).",
            self.scheduled
                .iter()
                .map(|((ns, n), s)| (object(ns, n), u64::from(s.skipped))),
        )?;
        counters(
            &mut out,
            "ferry_api_requests",
            "Kubernetes API requests by verb, resource and status code (`error`: no response).",
            self.api_requests.iter().map(|((verb, resource, code), n)| {
                (
                    [
                        ("verb", *verb),
                        ("resource", resource.as_str()),
                        ("code", code.as_str()),
                    ],
                    *n,
                )
            }),
        )?;
        Ok(())
    }
}

/// The labels of a per-Transfer series.
fn object<'a>(namespace: &'a str, name: &'a str) -> [(&'static str, &'a str); 2] {
    [("namespace", namespace), ("name", name)]
}

/// Every phase with its label value, in the order of the `ferry_transfers` series.
const PHASES: [(Phase, &str); 6] = [
    (Phase::Pending, "Pending"),
    (Phase::Running, "Running"),
    (Phase::Retrying, "Retrying"),
    (Phase::Suspended, "Suspended"),
    (Phase::Succeeded, "Succeeded"),
    (Phase::Failed, "Failed"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ProgressStatus, ThroughputStatus};

    #[test]
    fn retries_outcomes_bytes_and_throughput_are_counted_once() {
        let m = Metrics::default();
        let mut t = crate::plan::tests::transfer();
        let running = TransferStatus {
            phase: Phase::Running,
            run: 1,
            throughput: Some(ThroughputStatus {
                current_bytes_per_second: 500,
                ..ThroughputStatus::default()
            }),
            ..TransferStatus::default()
        };
        m.observe(&t, &running);
        assert!(m.render().contains("ferry_throughput_bytes_per_second 500"));
        t.status = Some(running.clone());
        let retrying = TransferStatus {
            phase: Phase::Retrying,
            failures: 1,
            ..running.clone()
        };
        m.observe(&t, &retrying);
        t.status = Some(retrying.clone());
        let done = TransferStatus {
            phase: Phase::Succeeded,
            progress: Some(ProgressStatus {
                bytes_done: 42,
                files_done: 3,
                ..ProgressStatus::default()
            }),
            ..retrying
        };
        m.observe(&t, &done);
        t.status = Some(done.clone());
        m.observe(&t, &done);
        let text = m.render();
        for want in [
            "ferry_retries_total 1",
            "ferry_bytes_moved_total 42",
            "ferry_files_moved_total 3",
            "ferry_transfers_finished_total{outcome=\"succeeded\"} 1",
            "ferry_transfers_active 0",
            "ferry_throughput_bytes_per_second 0",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }

    /// A Transfer of its own (not the plan's fixture), with the name and UID a test needs.
    fn named(namespace: &str, name: &str, uid: &str) -> Transfer {
        let mut t: Transfer = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "Transfer",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "spec": {
                "source": {"hostPath": {"node": "a", "path": "/data/src"}},
                "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
            },
        }))
        .expect("a Transfer");
        t.status = None;
        t
    }

    fn running(bytes_done: u64, bytes_total: u64, rate: u64) -> TransferStatus {
        TransferStatus {
            phase: Phase::Running,
            run: 1,
            progress: Some(ProgressStatus {
                bytes_done,
                bytes_total,
                ..ProgressStatus::default()
            }),
            throughput: Some(ThroughputStatus {
                current_bytes_per_second: rate,
                ..ThroughputStatus::default()
            }),
            ..TransferStatus::default()
        }
    }

    /// The sample lines of `metric` (its name followed by `{` or a space), in order.
    fn samples(text: &str, metric: &str) -> Vec<String> {
        text.lines()
            .filter(|l| {
                l.strip_prefix(metric)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn reconcile_durations_form_a_cumulative_histogram() {
        let m = Metrics::default();
        let empty = m.render();
        assert!(empty.contains("# TYPE ferry_reconcile_duration_seconds histogram\n"));
        assert!(empty.contains("ferry_reconcile_duration_seconds_bucket{le=\"+Inf\"} 0\n"));
        assert!(empty.contains("ferry_reconcile_duration_seconds_count 0\n"));
        for ms in [3, 5, 30, 30, 1000, 20_000] {
            m.reconcile_duration(Duration::from_millis(ms));
        }
        let text = m.render();
        assert_eq!(
            samples(&text, "ferry_reconcile_duration_seconds_bucket"),
            [
                "{le=\"0.005\"} 2",
                "{le=\"0.01\"} 2",
                "{le=\"0.025\"} 2",
                "{le=\"0.05\"} 4",
                "{le=\"0.1\"} 4",
                "{le=\"0.25\"} 4",
                "{le=\"0.5\"} 4",
                "{le=\"1\"} 5",
                "{le=\"2.5\"} 5",
                "{le=\"5\"} 5",
                "{le=\"10\"} 5",
                "{le=\"+Inf\"} 6",
            ]
            .map(|s| format!("ferry_reconcile_duration_seconds_bucket{s}"))
        );
        assert_eq!(
            samples(&text, "ferry_reconcile_duration_seconds_count"),
            ["ferry_reconcile_duration_seconds_count 6"]
        );
        let sum = samples(&text, "ferry_reconcile_duration_seconds_sum");
        let sum: f64 = sum[0]
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number");
        assert!((sum - 21.068).abs() < 1e-9, "sum {sum}");
    }

    #[test]
    fn queue_depth_and_phases_are_gauges() {
        let m = Metrics::default();
        assert!(m.render().contains("\nferry_transfers_queued 0\n"));
        m.set_queue_depth(7);
        m.observe(&named("ml", "a", "u1"), &running(1, 2, 3));
        m.observe(
            &named("ml", "b", "u2"),
            &TransferStatus {
                phase: Phase::Pending,
                ..TransferStatus::default()
            },
        );
        m.set_queue_depth(3);
        let text = m.render();
        assert!(text.contains("# TYPE ferry_transfers_queued gauge\nferry_transfers_queued 3\n"));
        assert_eq!(
            samples(&text, "ferry_transfers"),
            [
                "Pending\"} 1",
                "Running\"} 1",
                "Retrying\"} 0",
                "Suspended\"} 0",
                "Succeeded\"} 0",
                "Failed\"} 0"
            ]
            .map(|s| format!("ferry_transfers{{phase=\"{s}"))
        );
    }

    #[test]
    fn per_transfer_gauges_exist_while_running_only() {
        let m = Metrics::default();
        let a = named("ml", "a", "u1");
        let odd = named("x\"y", "b\\c\nd", "u2");
        m.observe(&a, &running(10, 100, 5));
        m.observe(&odd, &running(1, 2, 3));
        let text = m.render();
        assert_eq!(
            samples(&text, "ferry_transfer_bytes_done"),
            [
                "ferry_transfer_bytes_done{namespace=\"ml\",name=\"a\"} 10",
                "ferry_transfer_bytes_done{namespace=\"x\\\"y\",name=\"b\\\\c\\nd\"} 1",
            ]
        );
        assert!(text.contains("ferry_transfer_bytes_total{namespace=\"ml\",name=\"a\"} 100\n"));
        assert!(text.contains(
            "ferry_transfer_throughput_bytes_per_second{namespace=\"ml\",name=\"a\"} 5\n"
        ));
        // Every sample is one line: the escaped newline did not break one.
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.starts_with("ferry_"))
        );

        // Progress moves; then a leaves Running, the odd one is deleted.
        m.observe(&a, &running(60, 100, 7));
        assert!(
            m.render()
                .contains("ferry_transfer_bytes_done{namespace=\"ml\",name=\"a\"} 60\n")
        );
        let mut a_running = a.clone();
        a_running.status = Some(running(60, 100, 7));
        m.observe(
            &a_running,
            &TransferStatus {
                phase: Phase::Retrying,
                ..running(60, 100, 0)
            },
        );
        m.forget("u2");
        let text = m.render();
        for metric in [
            "ferry_transfer_bytes_done",
            "ferry_transfer_bytes_total",
            "ferry_transfer_throughput_bytes_per_second",
        ] {
            assert!(text.contains(&format!("# TYPE {metric} gauge\n")));
            assert_eq!(samples(&text, metric), Vec::<String>::new(), "{text}");
        }
    }

    #[test]
    fn a_scheduled_transfer_reports_its_last_success_next_run_duration_and_skips() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let time = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let m = Metrics::default();
        let mut nightly = named("ml", "nightly", "u1");
        nightly.spec.schedule = Some(crate::api::ScheduleSpec {
            cron: "0 2 * * *".into(),
            ..Default::default()
        });
        let plain = named("ml", "once", "u2");
        let st = TransferStatus {
            phase: Phase::Succeeded,
            last_success_time: Some(time(5_000)),
            next_run_time: Some(time(90_000)),
            skipped_runs: 3,
            history: vec![crate::api::RunRecord {
                start_time: Some(time(4_000)),
                completion_time: Some(time(5_000)),
                ..Default::default()
            }],
            ..TransferStatus::default()
        };
        m.observe(&nightly, &st);
        m.observe(&plain, &st);
        let text = m.render();
        for (metric, value) in [
            ("ferry_schedule_last_success_timestamp_seconds", 5_000),
            ("ferry_schedule_next_run_timestamp_seconds", 90_000),
            ("ferry_schedule_last_run_duration_seconds", 1_000),
            ("ferry_schedule_skipped_runs_total", 3),
        ] {
            assert_eq!(
                samples(&text, metric),
                [format!(
                    "{metric}{{namespace=\"ml\",name=\"nightly\"}} {value}"
                )],
                "{text}"
            );
        }
        m.forget("u1");
        assert!(samples(&m.render(), "ferry_schedule_next_run_timestamp_seconds").is_empty());
    }

    #[test]
    fn a_recreated_transfer_keeps_its_series_when_the_old_one_goes() {
        let m = Metrics::default();
        m.observe(&named("ml", "a", "old"), &running(1, 2, 3));
        m.observe(&named("ml", "a", "new"), &running(4, 5, 6));
        m.observe(
            &named("ml", "a", "old"),
            &TransferStatus {
                phase: Phase::Failed,
                ..TransferStatus::default()
            },
        );
        m.forget("old");
        assert_eq!(
            samples(&m.render(), "ferry_transfer_bytes_done"),
            ["ferry_transfer_bytes_done{namespace=\"ml\",name=\"a\"} 4"]
        );
    }

    #[test]
    fn api_requests_are_counted_by_verb_resource_and_code() {
        let m = Metrics::default();
        m.api_request("patch", "transfers/status", "200");
        m.api_request("patch", "transfers/status", "200");
        m.api_request("get", "pods", "404");
        m.api_request("list", "we\"ird", "error");
        let text = m.render();
        assert_eq!(
            samples(&text, "ferry_api_requests_total"),
            [
                "ferry_api_requests_total{verb=\"get\",resource=\"pods\",code=\"404\"} 1",
                "ferry_api_requests_total{verb=\"list\",resource=\"we\\\"ird\",code=\"error\"} 1",
                "ferry_api_requests_total{verb=\"patch\",resource=\"transfers/status\",code=\"200\"} 2",
            ]
        );
        assert!(text.contains("# TYPE ferry_api_requests_total counter\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.api_request("get", "plain-name.1", "200");
        m.api_request("get", "a\\b\"c\nd", "200");
        let text = m.render();
        assert!(text.contains("resource=\"plain-name.1\""), "{text}");
        assert!(text.contains("resource=\"a\\\\b\\\"c\\nd\""), "{text}");
    }
}
