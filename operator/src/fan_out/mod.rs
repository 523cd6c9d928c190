//! Fan-out Transfers (a destination naming many nodes): observe the nodes and the child
//! Transfers, plan (`plan`, pure), apply the children, write the status. Also what a child's
//! receiver needs to join its siblings (`swarm_of`).

pub mod plan;
pub mod sender;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::{Phase, Reason, Side, Transfer, TransferStatus};
use crate::cache::Caches;
use crate::controller::{
    Context, Error, Written, delete_if_present, ignore_not_found, record, ssa, write_status,
};
use crate::movers::{self, owner_ref};
use crate::movers::{MoverPodInput, Served};
use crate::names::{
    self, ANNOTATION_FAN_OUT_NODES, LABEL_FAN_OUT_OF, LABEL_MANAGED_BY, LABEL_ROLE, MANAGER,
    MoverRole,
};
use crate::placement::{self, Blocked};
use k8s_openapi::api::core::v1::{Pod, Secret};
use plan::{ChildView, FanOutAction, FanOutObserved, SenderObserved};
use sender::Candidate;

pub async fn reconcile(t: &Transfer, ctx: &Context) -> Result<Requeue, Error> {
    let mut obs = observe(t, ctx)?;
    obs.sender.secrets = sender_secrets(t, ctx, obs.sender.per_sender).await?;
    let plan = plan::plan(t, &obs);
    apply(t, ctx, &plan.actions).await?;
    let deferred = match write_status(t, ctx, &plan.status).await? {
        Written::Now => None,
        Written::Later(wait) => Some(wait),
        Written::Stale => return Ok(Requeue::requeue(Duration::from_secs(1))),
    };
    record(t, ctx, &plan.notes).await;
    ctx.metrics.observe(t, &plan.status);
    Ok(match plan.requeue.into_iter().chain(deferred).min() {
        Some(d) => Requeue::requeue(d.max(Duration::from_millis(200))),
        None => Requeue::await_change(),
    })
}

fn observe(t: &Transfer, ctx: &Context) -> Result<FanOutObserved, Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let hp = t
        .spec
        .destination
        .host_path
        .as_ref()
        .ok_or(Error::Malformed("fan-out destination"))?;
    let all_nodes = ctx.caches.nodes.state();
    let nodes = if hp.nodes.is_empty() {
        let selector = hp.node_selector.as_ref().map(|s| s.to_label_selector());
        select_nodes(selector.unwrap_or_default(), &all_nodes)
    } else {
        let missing: Vec<&str> = hp
            .nodes
            .iter()
            .map(|n| n.0.as_str())
            .filter(|n| ctx.caches.node(n).is_none())
            .collect();
        if missing.is_empty() {
            Ok(hp.nodes.iter().map(|n| n.0.clone()).collect())
        } else {
            Err(Blocked {
                reason: Reason::NodeNotFound,
                message: format!(
                    "spec.destination.hostPath.nodes: {} not a node of this cluster; the Transfer starts once all are",
                    missing.join(", ")
                ),
            })
        }
    };
    let parent = t.name_any();
    let children = ctx
        .store
        .state()
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .filter_map(|c| {
            let owned = c
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid);
            let named = c.name_any().starts_with(&format!("{parent}-"));
            (owned || named).then(|| ChildView {
                name: c.name_any(),
                owned,
                spec: c.spec.clone(),
                nodes_annotation: c.annotations().get(ANNOTATION_FAN_OUT_NODES).cloned(),
                status: c.status.clone(),
            })
        })
        .collect();
    let now = Timestamp::now();
    let candidates = ctx
        .store
        .state()
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .filter(|c| {
            c.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .filter_map(|c| candidate(c, ctx, &ns, now))
        .collect();
    let pods = ctx
        .caches
        .pods_of(&ns, &uid)
        .iter()
        .filter(|p| p.labels().get(LABEL_ROLE).map(String::as_str) == Some("sender"))
        .map(|p| {
            (
                p.name_any(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
            )
        })
        .collect();
    Ok(FanOutObserved {
        now,
        nodes,
        children,
        sender: SenderObserved {
            pods,
            secrets: Vec::new(),
            candidates,
            per_sender: sender::served_per_sender(mover_memory_limit(t, ctx)),
        },
    })
}

/// The memory limit of the fan-out's movers (its own `mover.resources`, else the operator's
/// default), in bytes.
fn mover_memory_limit(t: &Transfer, ctx: &Context) -> Option<u64> {
    let resources = t
        .spec
        .mover
        .as_ref()
        .and_then(|m| m.resources.as_ref())
        .or(ctx.config.default_resources.as_ref())?;
    let limit = resources.limits.as_ref()?.get("memory")?;
    crate::plan::parse_quantity(&limit.0)
}

/// A child as a candidate for the run's sender: waiting while its first attempt has no sender,
/// is not stopped and is not queued, with its receiver once that is ready.
fn candidate(
    c: &Transfer,
    ctx: &Context,
    ns: &str,
    now: Timestamp,
) -> Option<(Option<u32>, Candidate)> {
    let st = c.status.as_ref()?;
    let uid = c.uid()?;
    let run = st
        .observed_trigger
        .as_deref()
        .and_then(plan::run_of_trigger);
    // A child the limits keep queued starts later with a sender of its own: not waited for.
    let waiting =
        st.attempts == 1 && st.sender.is_none() && st.phase == Phase::Pending && st.queue.is_none();
    let receiver_name = names::pod_name(&uid, st.run, st.attempts, MoverRole::Receiver);
    let receiver = ctx
        .caches
        .pods_of(ns, &uid)
        .iter()
        .find(|p| p.name_any() == receiver_name)
        .map(|p| crate::controller::pod_view(p))
        .filter(|v| v.ready && !v.deleting)
        .and_then(|v| Some((v.ip?, v.created.unwrap_or(now))));
    Some((
        run,
        Candidate {
            transfer_id: names::transfer_id(&uid, st.run),
            waiting,
            receiver,
        },
    ))
}

/// The fan-out's sender Secrets of this run and the one before that exist.
async fn sender_secrets(
    t: &Transfer,
    ctx: &Context,
    per_sender: usize,
) -> Result<Vec<String>, Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let st = t.status.clone().unwrap_or_default();
    let batches = st.destinations.len().div_ceil(per_sender.max(1)).max(1);
    let batches = u32::try_from(batches).unwrap_or(u32::MAX);
    let candidates: Vec<String> = [st.run.saturating_sub(1), st.run]
        .into_iter()
        .filter(|r| *r > 0)
        .flat_map(|r| (1..=batches).map(move |b| (r, b)))
        .map(|(r, b)| names::secret_name(&uid, r, b))
        .collect();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(ctx
        .secrets
        .existing(&api, &uid, &candidates)
        .await?
        .into_iter()
        .filter(|s| candidates.contains(s))
        .collect())
}

/// Starts one of the run's senders: its certificate (naming the first attempt of every child
/// it serves), then its pod on the source node. A source that cannot be placed starts nothing: the
/// children wait for it as long as they would have, then start their own (and report why).
async fn start_sender(
    t: &Transfer,
    ctx: &Context,
    run: u32,
    batch: u32,
    serves: &[Served],
) -> Result<(), Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let facts = crate::controller::side_facts(t, Side::Source, &ctx.caches, &ns);
    let source = match placement::place_side(Side::Source, &t.spec.source, &ns, &ctx.config, &facts)
    {
        Ok(s) => s,
        Err(b) => {
            tracing::info!(transfer = %t.name_any(), "no fan-out sender: {}", b.message);
            return Ok(());
        }
    };
    let ids: Vec<&str> = serves.iter().map(|s| s.transfer_id.as_str()).collect();
    let files = ctx.authority.fan_out_sender_files(&ids)?;
    // Each sender is the run's attempt `batch` of the fan-out (which has no attempts of its
    // own).
    let secret = movers::attempt_secret(t, run, batch, &files);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    secrets
        .patch(&secret.name_any(), &ssa(), &Patch::Apply(&secret))
        .await?;
    ctx.secrets.created(&uid, &secret.name_any());
    crate::network_policy::keep(t, &ctx.client, &ctx.config).await?;
    let pod = movers::mover_pod(&MoverPodInput {
        transfer: t,
        config: &ctx.config,
        role: MoverRole::Sender,
        run,
        attempt: batch,
        placement: &source,
        receiver_ip: None,
        serves,
        use_block_store: false,
        remote: None,
        swarm: None,
    });
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
        .await?;
    Ok(())
}

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

async fn apply(t: &Transfer, ctx: &Context, actions: &[FanOutAction]) -> Result<(), Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    for action in actions {
        match action {
            FanOutAction::ApplyChild {
                name,
                spec,
                nodes_annotation,
            } => {
                let mut child = Transfer::new(name, (**spec).clone());
                child.metadata = ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(BTreeMap::from([
                        (LABEL_FAN_OUT_OF.to_owned(), uid.clone()),
                        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
                    ])),
                    annotations: Some(BTreeMap::from([(
                        ANNOTATION_FAN_OUT_NODES.to_owned(),
                        nodes_annotation.clone(),
                    )])),
                    owner_references: owner_ref(t).map(|o| vec![o]),
                    ..ObjectMeta::default()
                };
                api.patch(name, &ssa(), &Patch::Apply(&child)).await?;
            }
            FanOutAction::DeleteChild(name) => {
                ignore_not_found(api.delete(name, &DeleteParams::default()).await)?;
            }
            FanOutAction::DeleteSelf => {
                ignore_not_found(api.delete(&t.name_any(), &DeleteParams::default()).await)?;
            }
            FanOutAction::StartSender { run, batch, serves } => {
                start_sender(t, ctx, *run, *batch, serves).await?;
            }
            FanOutAction::DeletePod(name) => {
                let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
                delete_if_present(&pods, name).await?;
            }
            FanOutAction::DeleteSecret(name) => {
                let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
                delete_if_present(&secrets, name).await?;
                ctx.secrets.deleted(&uid, name);
            }
        }
    }
    Ok(())
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
