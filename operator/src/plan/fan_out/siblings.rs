//! A fan-out child among its siblings: which fan-out it belongs to, which nodes a selector picks,
//! each sibling's role, and the swarm a child's receiver joins.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::{Phase, Reason, Transfer, TransferStatus};
use crate::cache::Caches;
use crate::names::{ANNOTATION_FAN_OUT_NODES, LABEL_FAN_OUT_OF};
use crate::plan::placement::Blocked;

/// The schedulable nodes a selector picks, by name.
pub fn select_nodes(
    selector: LabelSelector,
    nodes: &[std::sync::Arc<Node>],
) -> Result<Vec<String>, Blocked> {
    let selector = Selector::try_from(selector).map_err(|e| Blocked {
        reason: Reason::InvalidSpec,
        message: format!("spec.destination.hostPath.nodeSelector: {e}"),
    })?;
    let mut picked: Vec<String> = nodes
        .iter()
        .filter(|n| {
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            !cordoned && selector.matches(n.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
        })
        .map(|n| n.name_any())
        .collect();
    picked.sort();
    Ok(picked)
}

/// The fan-out Transfer a child belongs to, to wake when the child's status changed.
pub fn parent_of(child: &Transfer) -> Option<ObjectRef<Transfer>> {
    child.labels().get(LABEL_FAN_OUT_OF)?;
    let owner = child
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Transfer::kind(&()))?;
    Some(ObjectRef::new(&owner.name).within(&child.namespace()?))
}

/// Where a fan-out child's receiver finds its siblings: every destination node's block
/// service (`""` for a node whose service is not ready: it owns nothing), and its own place
/// among them. None for a Transfer that is not a fan-out's child, or whose node is not in its
/// list. Read from the cache of node-service pods, so a fan-out to N nodes costs no API call
/// per receiver.
///
/// `roles` say what the siblings do meanwhile ([`sibling_role`]; a node not in it receives).
/// An idle one is listed empty too, so the receiver asks for its share at once rather than
/// waiting for it to arrive there; the list keeps every destination in its place, so the blocks
/// of those that do receive have the same owner on every receiver. One that holds the whole
/// tree is listed as complete: its share, and the receiver's own, are taken from it.
pub fn swarm_of(
    t: &Transfer,
    node: &str,
    caches: &Caches,
    block_service: &str,
    roles: &BTreeMap<String, SiblingRole>,
) -> Option<Swarm> {
    let list = t.annotations().get(ANNOTATION_FAN_OUT_NODES)?;
    t.labels().get(LABEL_FAN_OUT_OF)?;
    let (_, port) = block_service.rsplit_once(':')?;
    let nodes: Vec<&str> = list.split(',').filter(|n| !n.is_empty()).collect();
    let me = nodes.iter().position(|n| *n == node)?;
    let ips = caches.node_service_ips();
    let role = |n: &str| roles.get(n).copied().unwrap_or(SiblingRole::Receives);
    let peers: Vec<String> = nodes
        .iter()
        .map(|n| {
            ips.get(*n)
                .filter(|_| role(n) != SiblingRole::Idle)
                .map(|ip| socket_address(ip, port))
                .unwrap_or_default()
        })
        .collect();
    let complete = (0..nodes.len())
        .filter(|&i| i != me && role(nodes[i]) == SiblingRole::Holds && !peers[i].is_empty())
        .collect();
    Some(Swarm {
        peers,
        me,
        complete,
    })
}

/// What a fan-out child's sibling does while the child receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiblingRole {
    /// It runs, or starts now: it receives its share from the source and passes it on.
    Receives,
    /// It succeeded in this run: its node's store holds the whole tree.
    Holds,
    /// It will not receive meanwhile: it failed, is suspended, or waits in the operator's queue.
    Idle,
}

/// The role of a sibling whose status (of the current run; `None` when it has none yet) is
/// `status`, and that the concurrency limits keep `queued` beside the child.
pub fn sibling_role(status: Option<&TransferStatus>, queued: bool) -> SiblingRole {
    match status.map(|s| &s.phase) {
        Some(Phase::Failed | Phase::Suspended) => SiblingRole::Idle,
        Some(Phase::Succeeded) => SiblingRole::Holds,
        _ if queued => SiblingRole::Idle,
        _ => SiblingRole::Receives,
    }
}

fn socket_address(ip: &str, port: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// A fan-out child's receiver's place among its siblings (`--swarm-peers`, `--swarm-self`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swarm {
    pub peers: Vec<String>,
    pub me: usize,
    /// Positions of the destinations that hold the whole tree (`--swarm-complete`).
    pub complete: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;

    fn node(name: &str, pool: &str, cordoned: bool) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("pool".to_owned(), pool.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: cordoned.then(|| NodeSpec {
                unschedulable: Some(true),
                ..NodeSpec::default()
            }),
            ..Node::default()
        })
    }

    #[test]
    fn a_selector_picks_matching_schedulable_nodes_by_name() {
        let nodes = [
            node("gpu-2", "gpu", false),
            node("cpu-1", "cpu", false),
            node("gpu-1", "gpu", false),
            node("gpu-3", "gpu", true),
        ];
        let sel = LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".to_owned(), "gpu".to_owned())])),
            ..LabelSelector::default()
        };
        assert_eq!(select_nodes(sel, &nodes).unwrap(), ["gpu-1", "gpu-2"]);
        let bad = LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "pool".into(),
                    operator: "Near".into(),
                    values: None,
                },
            ]),
            ..LabelSelector::default()
        };
        assert_eq!(
            select_nodes(bad, &nodes).unwrap_err().reason,
            Reason::InvalidSpec
        );
    }

    fn service_pod(name: &str, node: &str, ip: &str, ready: bool, deleting: bool) -> Pod {
        use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ferry-system".into()),
                deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn child(nodes: &str) -> Transfer {
        let mut t = crate::plan::tests::transfer();
        t.metadata.labels = Some(BTreeMap::from([(
            LABEL_FAN_OUT_OF.to_owned(),
            "imagenet".to_owned(),
        )]));
        t.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_FAN_OUT_NODES.to_owned(),
            nodes.to_owned(),
        )]));
        t
    }

    #[test]
    fn a_child_finds_its_siblings_ready_services_in_the_cache() {
        let caches = crate::cache::preloaded_with(
            &["node-a", "node-b", "node-c", "node-d"],
            &["ml"],
            Vec::new(),
            vec![
                service_pod("ferry-node-a", "node-a", "10.0.0.1", true, false),
                service_pod("ferry-node-b", "node-b", "10.0.0.2", true, false),
                // Not ready yet: owns nothing, its blocks come from the source.
                service_pod("ferry-node-c", "node-c", "10.0.0.3", false, false),
                // Being replaced: the old pod is ignored, the new one is used.
                service_pod("ferry-node-d-old", "node-d", "10.0.0.4", true, true),
                service_pod("ferry-node-d", "node-d", "fd00::5", true, false),
            ],
        );
        let t = child("node-a,node-b,node-c,node-d,node-e");
        let none = BTreeMap::new();
        let swarm = swarm_of(&t, "node-b", &caches, "0.0.0.0:7443", &none).unwrap();
        assert_eq!(swarm.me, 1);
        assert_eq!(
            swarm.peers,
            ["10.0.0.1:7443", "10.0.0.2:7443", "", "[fd00::5]:7443", ""]
        );
        assert_eq!(swarm_of(&t, "node-z", &caches, "0.0.0.0:7443", &none), None);
        assert_eq!(swarm_of(&t, "node-b", &caches, "no-port", &none), None);
        let mut lone = t.clone();
        lone.metadata.labels = None;
        assert_eq!(
            swarm_of(&lone, "node-b", &caches, "0.0.0.0:7443", &none),
            None
        );

        // A sibling that will not receive alongside is left out in its place; the others keep
        // theirs, so every receiver still agrees on who owns what. One that finished is
        // listed as holding the tree, unless its service is not ready.
        let roles = BTreeMap::from([
            ("node-a".to_owned(), SiblingRole::Idle),
            ("node-c".to_owned(), SiblingRole::Holds),
            ("node-d".to_owned(), SiblingRole::Holds),
        ]);
        let swarm = swarm_of(&t, "node-b", &caches, "0.0.0.0:7443", &roles).unwrap();
        assert_eq!(swarm.me, 1);
        assert_eq!(swarm.peers, ["", "10.0.0.2:7443", "", "[fd00::5]:7443", ""]);
        assert_eq!(swarm.complete, [3]);
    }

    #[test]
    fn a_siblings_role_follows_its_phase_and_the_queue() {
        let status = |phase: Phase| TransferStatus {
            phase,
            ..TransferStatus::default()
        };
        for phase in [Phase::Failed, Phase::Suspended] {
            assert_eq!(sibling_role(Some(&status(phase)), false), SiblingRole::Idle);
        }
        // Its store holds the tree, queued or not.
        assert_eq!(
            sibling_role(Some(&status(Phase::Succeeded)), true),
            SiblingRole::Holds
        );
        for phase in [Phase::Pending, Phase::Running, Phase::Retrying] {
            let role = |queued| sibling_role(Some(&status(phase)), queued);
            assert_eq!(role(false), SiblingRole::Receives, "{phase:?}");
            assert_eq!(role(true), SiblingRole::Idle, "{phase:?}");
        }
        // Not looked at yet: the limits' hand-out decides.
        assert_eq!(sibling_role(None, false), SiblingRole::Receives);
        assert_eq!(sibling_role(None, true), SiblingRole::Idle);
    }

    #[test]
    fn the_cache_keeps_only_what_the_swarm_reads_of_a_service_pod() {
        let mut p = service_pod("ferry-node-a", "node-a", "10.0.0.1", true, false);
        p.metadata.labels = Some(BTreeMap::from([("big".to_owned(), "x".repeat(4096))]));
        p.spec.as_mut().unwrap().service_account_name = Some("ferry-node".into());
        crate::cache::keep_node_service_fields(&mut p);
        assert_eq!(p.metadata.labels, None);
        assert_eq!(p.spec.as_ref().unwrap().service_account_name, None);
        let caches =
            crate::cache::preloaded_with(&["node-a"], &["ml"], Vec::new(), vec![p.clone()]);
        let ips = caches.node_service_ips();
        assert_eq!(ips.get("node-a").map(String::as_str), Some("10.0.0.1"));
        assert_eq!(ips.len(), 1);
    }

    #[test]
    fn ipv6_pod_addresses_get_brackets() {
        assert_eq!(socket_address("10.0.0.1", "7443"), "10.0.0.1:7443");
        assert_eq!(socket_address("fd00::1", "7443"), "[fd00::1]:7443");
    }
}
