//! Prometheus metrics in the text exposition format, and the readiness flag, served with the
//! health endpoints by `serve` (plain HTTP on the metrics address).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kube::ResourceExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

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
    queued: AtomicU64,
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
    pub fn reconcile_error(&self, category: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry(category).or_default() += 1;
        }
    }
    pub fn set_queue_depth(&self, queued: usize) {
        self.queued.store(queued as u64, Ordering::Relaxed);
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    /// Folds one reconcile's outcome in: phase gauges, finished and retry counters, bytes and
    /// files of Transfers that succeeded, current throughput.
    pub fn observe(&self, t: &Transfer, new: &TransferStatus) {
        let uid = t.uid().unwrap_or_default();
        let old = t.status.clone().unwrap_or_default();
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

    /// A deleted Transfer leaves the gauges.
    pub fn forget(&self, uid: &str) {
        if let Ok(mut phases) = self.phases.lock() {
            phases.remove(uid);
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line("# TYPE ferry_reconciles_total counter".into());
        line(format!(
            "ferry_reconciles_total {}",
            self.reconciles.load(Ordering::Relaxed)
        ));
        line("# TYPE ferry_status_patches_total counter".into());
        line(format!(
            "ferry_status_patches_total{{kind=\"lifecycle\"}} {}",
            self.status_patches.load(Ordering::Relaxed)
        ));
        line(format!(
            "ferry_status_patches_total{{kind=\"progress\"}} {}",
            self.progress_patches.load(Ordering::Relaxed)
        ));
        line("# TYPE ferry_reconcile_errors_total counter".into());
        if let Ok(e) = self.errors.lock() {
            for (cat, n) in e.iter() {
                line(format!(
                    "ferry_reconcile_errors_total{{category=\"{cat}\"}} {n}"
                ));
            }
        }
        line("# TYPE ferry_transfers_finished_total counter".into());
        if let Ok(f) = self.finished.lock() {
            for (outcome, n) in f.iter() {
                line(format!(
                    "ferry_transfers_finished_total{{outcome=\"{outcome}\"}} {n}"
                ));
            }
        }
        line("# TYPE ferry_transfers_active gauge".into());
        let (active, rate) = self
            .phases
            .lock()
            .map(|p| {
                let active = p.values().filter(|(p, _)| !p.is_finished()).count();
                (active, p.values().map(|(_, r)| r).sum::<u64>())
            })
            .unwrap_or((0, 0));
        line(format!("ferry_transfers_active {active}"));
        line("# TYPE ferry_throughput_bytes_per_second gauge".into());
        line(format!("ferry_throughput_bytes_per_second {rate}"));
        line("# TYPE ferry_retries_total counter".into());
        line(format!(
            "ferry_retries_total {}",
            self.retries.load(Ordering::Relaxed)
        ));
        line("# TYPE ferry_bytes_moved_total counter".into());
        line(format!(
            "ferry_bytes_moved_total {}",
            self.bytes_moved.load(Ordering::Relaxed)
        ));
        line("# TYPE ferry_files_moved_total counter".into());
        line(format!(
            "ferry_files_moved_total {}",
            self.files_moved.load(Ordering::Relaxed)
        ));
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (one short request per connection).
pub async fn serve(listener: TcpListener, metrics: std::sync::Arc<Metrics>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf)).await;
            let Ok(Ok(n)) = read else { return };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let (code, body) = match path {
                "/metrics" => ("200 OK", metrics.render()),
                "/healthz" => ("200 OK", "ok\n".to_owned()),
                "/readyz" if metrics.is_ready() => ("200 OK", "ok\n".to_owned()),
                "/readyz" => ("503 Service Unavailable", "starting\n".to_owned()),
                _ => ("404 Not Found", "not found\n".to_owned()),
            };
            let response = format!(
                "HTTP/1.1 {code}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(response.as_bytes()).await;
        });
    }
}

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
}
