//! A count of the Transfers in the cache, once a second: how many run (which sets the progress
//! budget per Transfer) and how many wait for a slot (the queue depth metric). Counted apart
//! from reconcile so that no reconcile walks every Transfer for it.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::Store;

use crate::api::{Phase, Transfer};
use crate::limits;
use crate::metrics::Metrics;
use crate::status::PatchLimiter;

const EVERY: Duration = Duration::from_secs(1);

/// Running and queued Transfers among `transfers`.
pub fn count(transfers: &[Arc<Transfer>]) -> (usize, usize) {
    let mut running = 0;
    let mut queued = 0;
    for t in transfers {
        let Some(s) = &t.status else { continue };
        if s.phase == Phase::Running {
            running += 1;
        } else if limits::queued(s) {
            queued += 1;
        }
    }
    (running, queued)
}

pub fn spawn(transfers: Store<Transfer>, limiter: Arc<PatchLimiter>, metrics: Arc<Metrics>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (running, queued) = count(&transfers.state());
            limiter.set_running(running);
            metrics.set_queue_depth(queued);
        }
    });
}
