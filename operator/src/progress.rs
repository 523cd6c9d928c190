//! Progress watchers: one task per running mover reads its gRPC progress stream (mutual TLS,
//! the operator's certificate for that run) and keeps the latest update (one message: memory
//! does not grow with the stream). An update wakes reconcile for its Transfer at most once per
//! progress interval of the status budget (a wake that cannot lead to a patch is not sent),
//! and at most `--max-progress-watchers` watchers run: beyond that, a mover's progress is not
//! read and its outcome comes from its pod.
//!
//! Watchers are keyed by pod name (unique per run, attempt and role) and stop when their stream
//! ends, when the pod is gone from the plan, or when the operator shuts down. A restarted operator
//! simply starts new watchers; a mover with a final outcome lingers long enough to be read.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::progress::v1::{ProgressRequest, ProgressUpdate};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::api::Transfer;
use crate::status::PatchLimiter;

/// Interval the operator asks the movers for.
const UPDATE_INTERVAL_MS: u32 = 500;
/// Pause between connection attempts (the mover may still be starting).
const RETRY: Duration = Duration::from_millis(500);

struct Watch {
    latest: Arc<Mutex<Option<ProgressUpdate>>>,
    _task: AbortOnDrop,
}

/// Every running watcher.
#[derive(Clone)]
pub struct Watchers {
    inner: Arc<Mutex<HashMap<String, Watch>>>,
    wake: mpsc::Sender<ObjectRef<Transfer>>,
    max: usize,
    budget: Arc<PatchLimiter>,
}

impl Watchers {
    /// Watchers that send the Transfer to reconcile into `wake`, at most `max` at once.
    pub fn new(
        wake: mpsc::Sender<ObjectRef<Transfer>>,
        max: usize,
        budget: Arc<PatchLimiter>,
    ) -> Watchers {
        Watchers {
            inner: Arc::default(),
            wake,
            max,
            budget,
        }
    }

    /// The latest update of `pod`, starting a watcher on `addr` if none runs.
    pub fn latest_or_watch(
        &self,
        pod: &str,
        addr: SocketAddr,
        tls: impl FnOnce() -> Option<Arc<rustls::ClientConfig>>,
        owner: ObjectRef<Transfer>,
    ) -> Option<ProgressUpdate> {
        let Ok(mut map) = self.inner.lock() else {
            return None;
        };
        if let Some(w) = map.get(pod) {
            return w.latest.lock().ok().and_then(|l| l.clone());
        }
        if map.len() >= self.max {
            tracing::debug!(%pod, max = self.max, "progress watchers at their limit: not watching");
            return None;
        }
        let tls = tls()?;
        let latest = Arc::new(Mutex::new(None));
        let task = tokio::spawn(watch(
            addr,
            tls,
            latest.clone(),
            self.wake.clone(),
            owner,
            self.budget.clone(),
        ));
        map.insert(
            pod.to_owned(),
            Watch {
                latest,
                _task: AbortOnDrop(task),
            },
        );
        None
    }

    /// The latest update of `pod` without starting anything.
    pub fn latest(&self, pod: &str) -> Option<ProgressUpdate> {
        let map = self.inner.lock().ok()?;
        map.get(pod)?.latest.lock().ok()?.clone()
    }

    /// Stops the watchers of pods not in `keep` whose names start with `prefix` (one Transfer's).
    pub fn retain(&self, prefix: &str, keep: &[String]) {
        if let Ok(mut map) = self.inner.lock() {
            map.retain(|pod, _| !pod.starts_with(prefix) || keep.contains(pod));
        }
    }

    /// How many watchers run (metrics and tests).
    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

async fn watch(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    latest: Arc<Mutex<Option<ProgressUpdate>>>,
    wake: mpsc::Sender<ObjectRef<Transfer>>,
    owner: ObjectRef<Transfer>,
    budget: Arc<PatchLimiter>,
) {
    let mut last_wake: Option<Instant> = None;
    loop {
        let mut client = match ferry_proto::progress::connect_progress(addr, tls.clone()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%addr, "progress not reachable yet: {e}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let req = ProgressRequest {
            interval_ms: UPDATE_INTERVAL_MS,
        };
        let mut stream = match client.watch(req).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                tracing::debug!(%addr, "progress watch refused: {e}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        while let Ok(Some(update)) = stream.message().await {
            let last = is_final(&update);
            if let Ok(mut l) = latest.lock() {
                *l = Some(update);
            }
            // The final update always wakes reconcile; others as often as progress is written.
            if last {
                let _ = wake.send(owner.clone()).await;
                return;
            }
            if last_wake.is_none_or(|at| at.elapsed() >= budget.progress_interval()) {
                last_wake = Some(Instant::now());
                let _ = wake.try_send(owner.clone());
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

fn is_final(u: &ProgressUpdate) -> bool {
    use ferry_proto::progress::v1::Phase;
    matches!(
        Phase::try_from(u.phase),
        Ok(Phase::Succeeded | Phase::Failed)
    )
}

/// Aborts a watcher's task when its entry is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
