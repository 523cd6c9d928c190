//! Concurrency limits (pure): how many Transfers may have movers at once, in the cluster, per
//! node and per namespace. A Transfer over a limit waits (queued) until another one finishes,
//! and free slots go to the waiting Transfers in a fair order across namespaces.

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

/// Which limit holds a Transfer back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Cluster,
    Namespace,
    Node,
}

impl Limit {
    /// For the `Ready` message of a queued Transfer.
    pub fn describe(self) -> &'static str {
        match self {
            Limit::Cluster => "the operator's limit of concurrently running Transfers is reached",
            Limit::Namespace => {
                "the limit of running Transfers per namespace is reached in this namespace"
            }
            Limit::Node => {
                "the limit of running Transfers per node is reached on a node of this Transfer"
            }
        }
    }
}

/// Whether a Transfer of `namespace` whose movers go to `mine` may start next to `others`.
pub fn admits(limits: Limits, namespace: &str, mine: &BTreeSet<String>, others: &[Active]) -> bool {
    limit_reached(limits, namespace, mine, others).is_none()
}

/// The limit a Transfer of `namespace` whose movers go to `mine` would exceed next to `others`.
pub fn limit_reached(
    limits: Limits,
    namespace: &str,
    mine: &BTreeSet<String>,
    others: &[Active],
) -> Option<Limit> {
    let Limits {
        total: max_total,
        per_node: max_per_node,
        per_namespace,
    } = limits;
    if max_total > 0 && others.len() >= max_total {
        return Some(Limit::Cluster);
    }
    if per_namespace > 0
        && others.iter().filter(|o| o.namespace == namespace).count() >= per_namespace
    {
        return Some(Limit::Namespace);
    }
    let node_full = max_per_node > 0
        && !mine
            .iter()
            .all(|node| others.iter().filter(|o| o.nodes.contains(node)).count() < max_per_node);
    node_full.then_some(Limit::Node)
}

/// A Transfer that waits for a slot, as the fair order sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub uid: String,
    pub namespace: String,
    /// Waits to run again after a failed attempt (goes after those waiting for a first start
    /// of its namespace, so a Transfer that keeps failing cannot take the slot back each time).
    pub retry: bool,
    /// Creation time and name: first come, first served within a namespace.
    pub order: (i64, String),
    /// The nodes its movers must run on (for the per-node limit).
    pub nodes: BTreeSet<String>,
}

impl Waiting {
    /// `t` as it waits, its movers bound for `nodes`.
    pub fn of(t: &crate::api::Transfer, nodes: BTreeSet<String>) -> Waiting {
        use kube::ResourceExt;
        Waiting {
            uid: t.uid().unwrap_or_default(),
            namespace: t.namespace().unwrap_or_default(),
            retry: t.status.as_ref().is_some_and(|s| s.failures > 0),
            order: (
                t.metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |c| c.0.as_second()),
                t.name_any(),
            ),
            nodes,
        }
    }
}

/// The order in which waiting Transfers get free slots: round-robin across namespaces, a
/// namespace with fewer running Transfers first, each namespace's own first come, first
/// served. So one namespace's 500 queued Transfers do not starve another's one: that one goes
/// next, whatever was queued before it.
pub fn fair_order(active: &[Active], waiting: &[Waiting]) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut running: BTreeMap<&str, usize> = BTreeMap::new();
    for a in active {
        *running.entry(a.namespace.as_str()).or_default() += 1;
    }
    let mut by_namespace: BTreeMap<&str, Vec<&Waiting>> = BTreeMap::new();
    for w in waiting {
        by_namespace
            .entry(w.namespace.as_str())
            .or_default()
            .push(w);
    }
    let mut keyed: Vec<((usize, bool, i64), &Waiting)> = Vec::with_capacity(waiting.len());
    for (ns, mut list) in by_namespace {
        list.sort_by(|a, b| (a.retry, &a.order).cmp(&(b.retry, &b.order)));
        let base = running.get(ns).copied().unwrap_or(0);
        for (k, w) in list.into_iter().enumerate() {
            keyed.push(((base + k, w.retry, w.order.0), w));
        }
    }
    keyed.sort_by(|a, b| {
        (a.0, &a.1.order.1, &a.1.namespace).cmp(&(b.0, &b.1.order.1, &b.1.namespace))
    });
    keyed.into_iter().map(|(_, w)| w.uid.clone()).collect()
}

/// Gives a Transfer of `namespace` bound for `nodes` a slot next to `taken` (and adds it there),
/// or says which limit holds it back.
fn take_slot(
    limits: Limits,
    namespace: &str,
    nodes: &BTreeSet<String>,
    taken: &mut Vec<Active>,
) -> Option<Limit> {
    let limit = limit_reached(limits, namespace, nodes, taken);
    if limit.is_none() {
        taken.push(Active {
            namespace: namespace.to_owned(),
            nodes: nodes.clone(),
        });
    }
    limit
}

/// The waiting Transfers (by uid) that get a slot now next to `active`: the same hand-out in the
/// fair order as [`admission`], for all of them at once.
pub fn admitted(limits: Limits, active: &[Active], waiting: &[Waiting]) -> BTreeSet<String> {
    let by_uid: std::collections::BTreeMap<&str, &Waiting> =
        waiting.iter().map(|w| (w.uid.as_str(), w)).collect();
    let mut taken = active.to_vec();
    fair_order(active, waiting)
        .into_iter()
        .filter(|uid| {
            by_uid
                .get(uid.as_str())
                .is_some_and(|w| take_slot(limits, &w.namespace, &w.nodes, &mut taken).is_none())
        })
        .collect()
}

/// A Transfer held back: its 1-based place in the fair order among those waiting, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub place: usize,
    pub waiting: usize,
    pub limit: Limit,
}

/// Whether a waiting Transfer may start now (`Ok`), or where it stands in the queue: the
/// free slots of every limit go to the waiting Transfers in the fair order, each taking one if
/// its limits allow, so one behind in line never takes a slot one ahead of it would get.
pub fn admission(
    limits: Limits,
    me: &Waiting,
    mine: &BTreeSet<String>,
    active: &[Active],
    waiting: &[Waiting],
) -> Result<(), Queued> {
    let order = fair_order(active, waiting);
    let place = order
        .iter()
        .position(|u| *u == me.uid)
        .map_or(order.len() + 1, |p| p + 1);
    let mut taken = active.to_vec();
    for uid in &order {
        let (namespace, nodes) = if *uid == me.uid {
            (&me.namespace, mine)
        } else {
            match waiting.iter().find(|w| w.uid == *uid) {
                Some(w) => (&w.namespace, &w.nodes),
                None => continue,
            }
        };
        let held = take_slot(limits, namespace, nodes, &mut taken);
        if *uid == me.uid {
            return match held {
                Some(limit) => Err(Queued {
                    place,
                    waiting: order.len(),
                    limit,
                }),
                None => Ok(()),
            };
        }
    }
    // Not in the order (it was not among the waiting): its own limits decide.
    match limit_reached(limits, &me.namespace, mine, active) {
        Some(limit) => Err(Queued {
            place,
            waiting: order.len(),
            limit,
        }),
        None => Ok(()),
    }
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

    fn waiting(uid: &str, ns: &str, created: i64) -> Waiting {
        Waiting {
            uid: uid.into(),
            namespace: ns.into(),
            retry: false,
            order: (created, uid.into()),
            nodes: BTreeSet::new(),
        }
    }

    #[test]
    fn a_retry_does_not_take_the_namespace_slot_of_a_first_start_waiting_before_it() {
        let mut retry = waiting("r", "ml", 1);
        retry.retry = true;
        let first = waiting("f", "ml", 2);
        let q = vec![retry.clone(), first.clone()];
        let l = Limits {
            per_namespace: 1,
            ..Limits::default()
        };
        let none = BTreeSet::new();
        assert_eq!(admission(l, &first, &none, &[], &q), Ok(()));
        assert_eq!(
            admission(l, &retry, &none, &[], &q).map_err(|e| (e.place, e.limit)),
            Err((2, Limit::Namespace))
        );
    }

    #[test]
    fn the_slots_a_fan_out_child_leaves_go_to_its_siblings_in_order_and_no_further() {
        // Four children of one fan-out from node "src" to "d1".."d4", at most 2 per node: the
        // one that starts holds a slot on "src", so one sibling may start beside it, the first
        // in line, whatever each one's own status says.
        let child = |i: i64| Waiting {
            nodes: nodes(&["src", &format!("d{i}")]),
            ..waiting(&format!("c{i}"), "ml", i)
        };
        let starting = Active {
            namespace: "ml".into(),
            nodes: child(1).nodes,
        };
        let siblings = [child(2), child(3), child(4)];
        let l = Limits {
            per_node: 2,
            ..Limits::default()
        };
        let active = std::slice::from_ref(&starting);
        assert_eq!(admitted(l, active, &siblings), nodes(&["c2"]));
        // The same answer each one gets from `admission` on its own.
        for w in &siblings {
            let own = admission(l, w, &w.nodes, active, &siblings);
            assert_eq!(own.is_ok(), w.uid == "c2", "{}", w.uid);
        }
        // Without a per-node limit all start; with one slot each, none beside the first.
        assert_eq!(admitted(Limits { total: 9, ..l }, &[], &siblings).len(), 2);
        assert_eq!(
            admitted(
                Limits {
                    per_node: 0,
                    total: 9,
                    per_namespace: 0
                },
                active,
                &siblings
            )
            .len(),
            3
        );
        assert!(admitted(Limits { per_node: 1, ..l }, active, &siblings).is_empty());
    }

    #[test]
    fn one_namespaces_queue_does_not_starve_anothers_one() {
        let active: Vec<Active> = (0..2)
            .map(|_| Active {
                namespace: "bulk".into(),
                nodes: BTreeSet::new(),
            })
            .collect();
        let mut queue: Vec<Waiting> = (0..50)
            .map(|i| waiting(&format!("b{i:02}"), "bulk", i))
            .collect();
        // Created last, in another namespace.
        queue.push(waiting("solo", "web", 100));
        let order = fair_order(&active, &queue);
        assert_eq!(order[0], "solo", "{order:?}");
        assert_eq!(order[1], "b00");
        let l = Limits {
            total: 3,
            ..Limits::default()
        };
        let solo = &queue[50];
        assert_eq!(
            admission(l, solo, &BTreeSet::new(), &active, &queue),
            Ok(())
        );
        assert_eq!(
            admission(l, &queue[1], &BTreeSet::new(), &active, &queue).map_err(|q| q.place),
            Err(3),
            "b01 is third in line for one free slot"
        );
    }

    #[test]
    fn namespaces_take_turns_and_retries_go_after_first_starts() {
        let mut q = vec![
            waiting("a1", "a", 1),
            waiting("a2", "a", 2),
            waiting("b1", "b", 3),
            waiting("b2", "b", 4),
        ];
        q[0].retry = true;
        assert_eq!(fair_order(&[], &q), ["a2", "b1", "b2", "a1"]);
        let full = Limits {
            total: 1,
            ..Limits::default()
        };
        let one = [Active {
            namespace: "c".into(),
            nodes: BTreeSet::new(),
        }];
        assert_eq!(
            admission(full, &q[1], &BTreeSet::new(), &one, &q),
            Err(Queued {
                place: 1,
                waiting: 4,
                limit: Limit::Cluster
            })
        );
    }
}
