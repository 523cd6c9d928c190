//! Concurrency limits (pure): how many Transfers may have movers at once, in the cluster and per
//! node. A Transfer over a limit waits (queued) until another one finishes.

use std::collections::BTreeSet;

use crate::api::{Phase, TransferStatus};

/// `Ready` reasons of a Transfer whose mover pods exist and may start any moment (bounded by the
/// pending timeout): it keeps its slot. Any other reason while `Pending` is a wait (a block by the
/// spec or the cluster, an admission refusal) that gives the slot back.
const STARTING: [&str; 7] = [
    "Pending",
    "Running",
    "MoverFailed",
    "MoverUnschedulable",
    "MoverVolumeMountFailed",
    "MoverImagePullFailed",
    "MoverConfigError",
];

/// Whether a Transfer waits in the queue for its first start.
pub fn queued_first(s: &TransferStatus) -> bool {
    s.phase == Phase::Pending
        && s.start_time.is_none()
        && s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "Pending" && c.message.starts_with(QUEUED))
}

/// Whether a Transfer waits in the queue (for its first start or a retry).
pub fn queued(s: &TransferStatus) -> bool {
    s.phase == Phase::Pending
        && s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "Pending" && c.message.starts_with(QUEUED))
}

/// The start of the `Ready` message of a Transfer the limits hold back.
pub const QUEUED: &str = "queued:";

/// Whether a Transfer takes one of the limited slots: its movers run or are starting.
pub fn holds_a_slot(s: &TransferStatus) -> bool {
    // A queued Transfer has no movers: counting it would let queued Transfers block each other.
    let starting = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .is_none_or(|c| STARTING.contains(&c.reason.as_str()) && !c.message.starts_with(QUEUED));
    match s.phase {
        Phase::Running => true,
        Phase::Pending => s.start_time.is_some() && starting,
        _ => false,
    }
}

/// An active Transfer as the limits see it: its namespace and the nodes its movers run on (or
/// must run on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Active {
    pub namespace: String,
    pub nodes: BTreeSet<String>,
}

/// The limits (0 = no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_node: usize,
    /// So that one namespace cannot take every slot.
    pub per_namespace: usize,
}

/// Whether a Transfer of `namespace` whose movers go to `mine` may start next to `others`.
pub fn admits(limits: Limits, namespace: &str, mine: &BTreeSet<String>, others: &[Active]) -> bool {
    let Limits {
        total: max_total,
        per_node: max_per_node,
        per_namespace,
    } = limits;
    if max_total > 0 && others.len() >= max_total {
        return false;
    }
    if per_namespace > 0
        && others.iter().filter(|o| o.namespace == namespace).count() >= per_namespace
    {
        return false;
    }
    if max_per_node == 0 {
        return true;
    }
    mine.iter()
        .all(|node| others.iter().filter(|o| o.nodes.contains(node)).count() < max_per_node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_transfers_whose_movers_run_or_start_hold_a_slot() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let status = |phase, started: bool, reason: &str| TransferStatus {
            phase,
            start_time: started.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            conditions: vec![Condition {
                type_: "Ready".into(),
                reason: reason.into(),
                status: "False".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..TransferStatus::default()
        };
        assert!(holds_a_slot(&status(Phase::Running, true, "Running")));
        assert!(holds_a_slot(&status(Phase::Pending, true, "Pending")));
        assert!(holds_a_slot(&status(
            Phase::Pending,
            true,
            "MoverImagePullFailed"
        )));
        for waits in ["DestinationInUse", "MoverRejected", "HostPathNotAllowed"] {
            assert!(
                !holds_a_slot(&status(Phase::Pending, true, waits)),
                "{waits}"
            );
        }
        assert!(
            !holds_a_slot(&status(Phase::Pending, false, "Pending")),
            "never started"
        );
        assert!(!holds_a_slot(&status(Phase::Retrying, true, "Retrying")));
        let mut queued = status(Phase::Pending, false, "Pending");
        queued.conditions[0].message = format!("{QUEUED} the operator's limit ...");
        assert!(queued_first(&queued) && !holds_a_slot(&queued));
        assert!(!queued_first(&status(Phase::Pending, true, "Pending")));
        // A queued retry holds no slot either.
        let mut queued_retry = status(Phase::Pending, true, "Pending");
        queued_retry.conditions[0].message = queued.conditions[0].message.clone();
        assert!(!holds_a_slot(&queued_retry));
    }

    #[test]
    fn cluster_and_node_limits() {
        let others = vec![
            Active {
                namespace: "ml".into(),
                nodes: nodes(&["a", "b"]),
            },
            Active {
                namespace: "ml".into(),
                nodes: nodes(&["b", "c"]),
            },
        ];
        let l = |total, per_node, per_namespace| Limits {
            total,
            per_node,
            per_namespace,
        };
        assert!(admits(l(0, 0, 0), "ml", &nodes(&["b"]), &others));
        assert!(!admits(l(2, 0, 0), "ml", &nodes(&["x"]), &others));
        assert!(admits(l(3, 0, 0), "ml", &nodes(&["x"]), &others));
        assert!(
            !admits(l(0, 2, 0), "ml", &nodes(&["b", "d"]), &others),
            "b has two already"
        );
        assert!(admits(l(0, 2, 0), "ml", &nodes(&["a", "d"]), &others));
        // A claim side without a known node counts only against the cluster limit.
        assert!(admits(l(0, 1, 0), "ml", &nodes(&[]), &others));
        // One namespace cannot take every slot.
        assert!(!admits(l(10, 0, 2), "ml", &nodes(&["x"]), &others));
        assert!(admits(l(10, 0, 2), "web", &nodes(&["x"]), &others));
    }
}
