//! A count of the Transfers in the cache, once a second: how many have moving figures (which
//! sets each one's share of the status budget), how many wait for a slot (the queue depth
//! metric), and, when slots are free, a wake for the Transfers first in line, so a freed slot
//! is taken within a second rather than at the next resync. Done apart from reconcile so that
//! no reconcile walks every Transfer for it.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

use crate::api::{Phase, Transfer};
use crate::metrics::Metrics;
use crate::plan::limits::{self, Limits};
use crate::status::PatchLimiter;

const EVERY: Duration = Duration::from_secs(1);

/// What one look at the Transfers found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub running: usize,
    pub queued: usize,
    /// The waiting Transfers that get the free slots, first in line first.
    pub next: Vec<ObjectRef<Transfer>>,
}

/// Counts `transfers` under `limits` (pure).
pub fn count(transfers: &[Arc<Transfer>], limits: Limits) -> Census {
    let mut census = Census::default();
    let mut active = Vec::new();
    let mut waiting = Vec::new();
    let mut refs = std::collections::HashMap::new();
    for t in transfers {
        // A fan-out runs no movers itself; its children are counted.
        if t.metadata.deletion_timestamp.is_some() || t.is_fan_out() {
            continue;
        }
        let uid = t.uid().unwrap_or_default();
        match &t.status {
            Some(s) if s.phase == Phase::Running || limits::holds_a_slot(s) => {
                census.running += usize::from(s.phase == Phase::Running);
                active.push(limits::Active {
                    namespace: t.namespace().unwrap_or_default(),
                    nodes: Default::default(),
                });
            }
            Some(s) if limits::queued(s) => {
                census.queued += 1;
                waiting.push(limits::Waiting::of(t, Default::default()));
                refs.insert(uid, ObjectRef::from_obj(t.as_ref()));
            }
            _ => {}
        }
    }
    if limits.total > 0 {
        let free = limits.total.saturating_sub(active.len());
        census.next = limits::fair_order(&active, &waiting)
            .into_iter()
            .take(free)
            .filter_map(|uid| refs.remove(&uid))
            .collect();
    }
    census
}

pub fn spawn(
    transfers: Store<Transfer>,
    limits: Limits,
    limiter: Arc<PatchLimiter>,
    metrics: Arc<Metrics>,
    wake: mpsc::Sender<ObjectRef<Transfer>>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let c = count(&transfers.state(), limits);
            // Queued Transfers' places are moving figures too.
            limiter.set_running(c.running + c.queued);
            metrics.set_queue_depth(c.queued);
            for t in c.next {
                let _ = wake.try_send(t);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransferStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    fn transfer(ns: &str, name: &str, phase: Phase, queued: bool) -> Arc<Transfer> {
        let mut t: Transfer = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")},
            "spec": {
                "source": {"hostPath": {"node": "a", "path": "/data/src"}},
                "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
            },
        }))
        .expect("transfer");
        let message = if queued {
            limits::QUEUED
        } else {
            "moving data"
        };
        t.status = Some(TransferStatus {
            phase,
            conditions: vec![Condition {
                type_: "Ready".into(),
                reason: if queued { "Pending" } else { "Running" }.into(),
                status: "False".into(),
                message: message.into(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..TransferStatus::default()
        });
        Arc::new(t)
    }

    #[test]
    fn free_slots_wake_the_first_in_line() {
        let all = vec![
            transfer("bulk", "r1", Phase::Running, false),
            transfer("bulk", "q1", Phase::Pending, true),
            transfer("bulk", "q2", Phase::Pending, true),
            transfer("solo", "q3", Phase::Pending, true),
        ];
        let limits = Limits {
            total: 2,
            ..Limits::default()
        };
        let c = count(&all, limits);
        assert_eq!((c.running, c.queued), (1, 3));
        let next: Vec<String> = c.next.iter().map(|r| r.name.clone()).collect();
        assert_eq!(next, ["q3"], "one free slot, and solo has none running");
        assert!(
            count(&all, Limits::default()).next.is_empty(),
            "no limit, no queue"
        );
    }
}
