//! What one reconcile reads: the Transfer's pods, claims, Secrets, nodes, namespace and
//! siblings, from the caches, into the plan's `Observed`. It writes nothing.

pub mod fan_out;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::api::{Reason, Side, Transfer, TransferStatus};
use crate::cache::Caches;
use crate::config::Config;
use crate::context::{Context, Error};
use crate::names::{self, ANNOTATION_SERVES, LABEL_FAN_OUT_OF, MoverRole};
use crate::peering::observe::observe_remote;
use crate::plan::fan_out::SiblingRole;
use crate::plan::fan_out::Swarm;
use crate::plan::limits;
use crate::plan::overlap;
use crate::plan::placement::{self, Blocked, SideFacts, SidePlacement};
use crate::plan::{self, Observed, PodPhase, PodView, Stuck};

/// The Pod Security admission label that decides whether hostPath volumes are allowed.
const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

pub(crate) fn pod_prefix(uid: &str) -> String {
    // Every child name starts with this (see names.rs).
    let name = names::pod_name(uid, 0, 0, MoverRole::Sender);
    name.trim_end_matches("-0-0-send").to_owned()
}

pub(crate) async fn observe(t: &Transfer, ctx: &Context) -> Result<Observed, Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let mut pods: Vec<PodView> = ctx
        .caches
        .pods_of(&ns, &uid)
        .iter()
        .map(|p| pod_view(p))
        .collect();
    mount_failures(&ctx.caches, &ns, &mut pods);
    // Secrets are looked up by their deterministic names (current and previous attempt), so
    // the operator needs no right to list or watch Secrets; after the first look, the
    // operator's own creates and deletes keep the book.
    let st = t.status.clone().unwrap_or_default();
    let candidates: Vec<String> = [st.attempts.saturating_sub(1), st.attempts, st.attempts + 1]
        .into_iter()
        .filter(|a| *a > 0)
        .map(|a| names::secret_name(&uid, st.run, a))
        .collect();
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets = ctx
        .secrets
        .existing(&secrets_api, &uid, &candidates)
        .await?
        .into_iter()
        .filter(|s| candidates.contains(s))
        .collect();

    let provision = observe_provision(t, ctx, &ns).await?;
    let source = side_facts(t, Side::Source, &ctx.caches, &ns);
    let mut destination = side_facts(t, Side::Destination, &ctx.caches, &ns);
    if matches!(
        provision,
        Some(crate::plan::provision::ProvisionStep::Create(_))
    ) {
        // The plan creates it before any mover that mounts it.
        destination.claim_exists = true;
    }
    let placement = placement::place_side(Side::Source, &t.spec.source, &ns, &ctx.config, &source)
        .and_then(|s| {
            placement::place_side(
                Side::Destination,
                &t.spec.destination,
                &ns,
                &ctx.config,
                &destination,
            )
            .map(|d| (s, d))
        })
        .and_then(|placed| match overlap::source_destination_overlap(t, &ns) {
            Some(message) => Err(Blocked {
                reason: Reason::SourceDestinationOverlap,
                message,
            }),
            None => Ok(placed),
        });
    // A destination another Transfer writes first: wait for it (checked only before this
    // Transfer's movers exist, so a running one is never stopped by a newcomer).
    let placement = if pods.iter().any(|p| !p.deleting) {
        placement
    } else {
        let others = ctx.store.state();
        let others: Vec<&Transfer> = others.iter().map(|o| o.as_ref()).collect();
        placement.and_then(|placed| match overlap::destination_taken_by(t, &ns, &others) {
            Some(other) => Err(Blocked {
                reason: Reason::DestinationInUse,
                message: format!(
                    "the destination is also written by Transfer {other}, which goes first; this Transfer starts once that one finishes"
                ),
            }),
            None => Ok(placed),
        })
    };

    // Progress of the current attempt's movers (a source half's carry the destination's id).
    let (run, attempt) = (st.run, st.attempts);
    let tid = st
        .remote
        .as_ref()
        .and_then(|r| r.transfer_id.clone())
        .unwrap_or_else(|| names::transfer_id(&uid, run));
    let fan_out_sender = fan_out_sender_of(t, &st, ctx, &ns, &uid);
    // A fan-out's sender serving this child: read as this child's operator, it shows this
    // destination's session; its watcher is this child's (a key under the child's prefix).
    let served_by = fan_out_sender
        .as_ref()
        .and_then(|f| f.serving.clone())
        .map(|p| (format!("{}-via-{}", pod_prefix(&uid), p.name), p));
    let progress = |role: MoverRole| {
        let (name, pod) = match (&served_by, role) {
            (Some((key, pod)), MoverRole::Sender) => (key.clone(), pod),
            _ => {
                let name = names::pod_name(&uid, run, attempt, role);
                let pod = pods.iter().find(|p| p.name == name)?;
                (name, pod)
            }
        };
        let ip: std::net::IpAddr = pod.ip.as_ref()?.parse().ok()?;
        let addr = SocketAddr::new(ip, ctx.config.progress_port);
        if pod.phase != PodPhase::Running {
            return ctx.watchers.latest(&name);
        }
        let tls = || {
            ctx.authority
                .progress_client(&tid, attempt)
                .map_err(|e| tracing::warn!("progress TLS for {tid}: {e}"))
                .ok()
        };
        ctx.watchers
            .latest_or_watch(&name, addr, tls, ObjectRef::from_obj(t))
    };
    let receiver_progress = progress(MoverRole::Receiver);
    let mut sender_progress = progress(MoverRole::Sender);
    let remote = observe_remote(t, ctx, &pods, &st, sender_progress.as_ref()).await?;
    if let Some(r) = remote.as_ref().and_then(|r| r.counterpart.as_ref())
        && let Some(report) = &r.report
        && (report.run, report.attempt) == (run, attempt)
    {
        // The other cluster's sender, as its operator reported it.
        sender_progress = report.progress.as_ref().map(Into::into);
    }
    let keep: Vec<String> = pods
        .iter()
        .map(|p| p.name.clone())
        .chain(served_by.map(|(key, _)| key))
        .collect();
    ctx.watchers.retain(&pod_prefix(&uid), &keep);

    let host_path_forbidden = ctx
        .caches
        .namespace_labels(&ns)
        .and_then(|l| l.get(PSA_ENFORCE).cloned())
        .is_some_and(|level| level == "baseline" || level == "restricted");

    let admission = admission(t, ctx);
    let swarm = swarm(t, ctx, &placement);
    Ok(Observed {
        now: Timestamp::now(),
        host_path_forbidden,
        root_movers_allowed: ctx.config.allow_root_movers,
        privileged_readers_allowed: ctx.config.allow_privileged_readers,
        priority_class_refused: t
            .spec
            .mover
            .as_ref()
            .and_then(|m| m.priority_class_name.clone())
            .filter(|c| !ctx.config.priority_class_allowed(c)),
        placement,
        may_start: admission.is_ok(),
        queue: admission.err(),
        acting_since: ctx.acting_since,
        peer_silence_grace: ctx.config.peer_silence_grace,
        pending_timeout: ctx.config.mover_pending_timeout,
        pods,
        secrets,
        receiver_progress,
        sender_progress,
        remote,
        provision,
        fan_out_sender,
        swarm,
    })
}

/// A fan-out child's siblings as its receiver on a node with a block service would find them.
fn swarm(
    t: &Transfer,
    ctx: &Context,
    placement: &Result<(SidePlacement, SidePlacement), Blocked>,
) -> Option<Swarm> {
    let node = placement.as_ref().ok()?.1.node.as_ref()?;
    let service = ctx.config.block_service.as_ref()?;
    let roles = sibling_roles(t, &ctx.store.state(), limits_of(&ctx.config));
    crate::plan::fan_out::swarm_of(t, node, &ctx.caches, service, &roles)
}

/// A fan-out child's first attempt: the fan-out's senders of the run, and the one whose
/// certificate names this attempt.
fn fan_out_sender_of(
    t: &Transfer,
    st: &TransferStatus,
    ctx: &Context,
    ns: &str,
    uid: &str,
) -> Option<plan::FanOutSender> {
    if st.attempts != 1 || t.remote().is_some() {
        return None;
    }
    let parent = t.labels().get(LABEL_FAN_OUT_OF)?;
    let run = crate::plan::fan_out::run_of_trigger(t.spec.trigger.as_deref()?)?;
    let prefix = names::run_prefix(parent, run);
    let senders: Vec<Arc<Pod>> = ctx
        .caches
        .pods_of(ns, parent)
        .into_iter()
        .filter(|p| p.name_any().starts_with(&prefix))
        .collect();
    let me = names::transfer_id(uid, st.run);
    let serving = senders.iter().find(|p| {
        p.annotations()
            .get(ANNOTATION_SERVES)
            .is_some_and(|ids| ids.split(',').any(|id| id == me))
    });
    Some(plan::FanOutSender {
        serving: serving.map(|p| pod_view(p)),
        started: !senders.is_empty(),
    })
}

/// The destination claim to provision, as the API server has it (and the source claim, when
/// the size comes from it). Read directly: the claim cache holds names only.
async fn observe_provision(
    t: &Transfer,
    ctx: &Context,
    ns: &str,
) -> Result<Option<crate::plan::provision::ProvisionStep>, Error> {
    let Some(pvc) = &t.spec.destination.pvc else {
        return Ok(None);
    };
    let Some(spec) = &pvc.provision else {
        return Ok(None);
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let destination = api.get_opt(&pvc.claim_name).await?.map(|c| claim_view(&c));
    let from_source = spec.capacity == crate::api::ClaimProvision::FROM_SOURCE;
    let source = match &t.spec.source.pvc {
        // Read while the destination exists too: a source grown since is a claim too small.
        Some(src) if from_source => Some((
            src.claim_name.as_str(),
            api.get_opt(&src.claim_name).await?.map(|c| claim_view(&c)),
        )),
        _ => None,
    };
    let source = source.as_ref().map(|(n, c)| (*n, c.as_ref()));
    Ok(Some(crate::plan::provision::step(
        spec,
        &pvc.claim_name,
        destination.as_ref(),
        source,
    )))
}

/// A claim's size: its bound volume's, else its request.
fn claim_view(c: &PersistentVolumeClaim) -> crate::plan::provision::ClaimView {
    let bound = c
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|m| m.get("storage"));
    let requested = c
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get("storage"));
    crate::plan::provision::ClaimView {
        capacity: bound.or(requested).and_then(|q| plan::parse_quantity(&q.0)),
    }
}

/// The nodes a Transfer's movers run on, or must run on.
fn transfer_nodes(t: &Transfer) -> BTreeSet<String> {
    let mut nodes = BTreeSet::new();
    if let Some(s) = &t.status {
        nodes.extend(
            s.receiver
                .iter()
                .chain(&s.sender)
                .filter_map(|m| m.node.clone()),
        );
    }
    for ep in [&t.spec.source, &t.spec.destination] {
        if let Some(hp) = ep.host_path.as_ref().filter(|hp| !hp.node.is_empty()) {
            nodes.insert(hp.node.clone());
        }
    }
    nodes
}

pub(crate) fn limits_of(c: &Config) -> limits::Limits {
    limits::Limits {
        total: c.max_active,
        per_node: c.max_active_per_node,
        per_namespace: c.max_active_per_namespace,
    }
}

/// Whether the concurrency limits leave room for `t`'s movers now, or where it waits.
fn admission(t: &Transfer, ctx: &Context) -> Result<(), limits::Queued> {
    let limits = limits_of(&ctx.config);
    if limits == limits::Limits::default() {
        return Ok(());
    }
    let (active, mut waiting) = slots_besides(t, &ctx.store.state());
    waiting.insert(0, waiting_of(t));
    limits::admission(limits, &waiting[0], &transfer_nodes(t), &active, &waiting)
}

/// `t` as the limits' queue sees it. A retry (its last attempt failed or stalled) lets
/// Transfers queued for their first start go first, so a stuck Transfer cannot take its slot
/// back before them again and again.
fn waiting_of(t: &Transfer) -> limits::Waiting {
    limits::Waiting::of(t, transfer_nodes(t))
}

/// Every Transfer but `t` that holds a slot, and every one that waits for one (queued, or not
/// looked at yet).
fn slots_besides(
    t: &Transfer,
    all: &[Arc<Transfer>],
) -> (Vec<limits::Active>, Vec<limits::Waiting>) {
    let (mut active, mut waiting) = (Vec::new(), Vec::new());
    for o in all {
        // A fan-out runs no movers itself; its children are counted.
        if o.uid() == t.uid() || o.metadata.deletion_timestamp.is_some() || o.is_fan_out() {
            continue;
        }
        match &o.status {
            Some(s) if limits::holds_a_slot(s) => active.push(limits::Active {
                namespace: o.namespace().unwrap_or_default(),
                nodes: transfer_nodes(o),
            }),
            Some(s) if limits::queued(s) => waiting.push(waiting_of(o)),
            None => waiting.push(waiting_of(o)),
            Some(_) => {}
        }
    }
    (active, waiting)
}

/// What each of a fan-out child's siblings (by destination node) does while `t` receives: it
/// holds the whole tree when it succeeded in this run; it is idle when it failed or is
/// suspended, or when, under concurrency limits, it stays queued once `t` holds its slot (the
/// limits' hand-out in the fair order, run for all the siblings at once); otherwise it receives.
/// An idle sibling's share is asked of the source from the start instead of being waited for
/// (`--swarm-wait`) and then asked for anyway; a holder's is taken from its store.
pub(crate) fn sibling_roles(
    t: &Transfer,
    all: &[Arc<Transfer>],
    limits: limits::Limits,
) -> BTreeMap<String, SiblingRole> {
    let Some(parent) = t.labels().get(names::LABEL_FAN_OUT_OF) else {
        return BTreeMap::new();
    };
    let admitted = (limits != limits::Limits::default()).then(|| {
        let (mut active, waiting) = slots_besides(t, all);
        active.push(limits::Active {
            namespace: t.namespace().unwrap_or_default(),
            nodes: transfer_nodes(t),
        });
        limits::admitted(limits, &active, &waiting)
    });
    let siblings = all.iter().filter(|o| {
        o.uid() != t.uid()
            && o.namespace() == t.namespace()
            && o.labels().get(names::LABEL_FAN_OUT_OF) == Some(parent)
    });
    siblings
        .filter_map(|o| {
            let node = o.spec.destination.host_path.as_ref()?.node.clone();
            // A status of an earlier run (a new one is starting) says nothing of this one.
            let status = o.status.as_ref().filter(|s| {
                o.spec.trigger == t.spec.trigger && s.observed_trigger == o.spec.trigger
            });
            let queued = admitted.as_ref().is_some_and(|a| {
                status.is_none_or(|s| !limits::holds_a_slot(s))
                    && !a.contains(&o.uid().unwrap_or_default())
            });
            Some((node, crate::plan::fan_out::sibling_role(status, queued)))
        })
        .collect()
}

pub(crate) fn side_facts(t: &Transfer, side: Side, caches: &Caches, ns: &str) -> SideFacts {
    let ep = t.endpoint(side);
    let mut facts = SideFacts::default();
    if let Some(hp) = &ep.host_path {
        facts.node_exists = caches.node(&hp.node).is_some();
    }
    if let Some(pvc) = &ep.pvc {
        facts.claim_exists = caches.claim_exists(ns, &pvc.claim_name);
        if facts.claim_exists {
            facts.claim_in_use_on = caches.claim_users.node_of(ns, &pvc.claim_name);
        }
    }
    facts
}

/// How long a pod may be pending before a failed mount is looked for (most pods start within
/// this).
const MOUNT_CHECK_AFTER: Duration = Duration::from_secs(5);

/// Marks pending pods whose volume the kubelet cannot mount (a missing host root, a claim that
/// cannot attach): that is only said in an Event, never in the pod's status.
fn mount_failures(caches: &Caches, ns: &str, pods: &mut [PodView]) {
    let now = Timestamp::now();
    for p in pods.iter_mut().filter(|p| {
        p.phase == PodPhase::Pending
            && p.stuck.is_none()
            && !p.deleting
            && p.created.is_some_and(|at| {
                Duration::try_from(now.duration_since(at)).unwrap_or_default() >= MOUNT_CHECK_AFTER
            })
    }) {
        if let Some(message) = caches.mount_failure(ns, &p.name) {
            p.stuck = Some(Stuck {
                reason: Reason::MoverVolumeMountFailed,
                cause: "FailedMount".into(),
                message,
            });
        }
    }
}

pub(crate) fn pod_view(p: &Pod) -> PodView {
    let status = p.status.clone().unwrap_or_default();
    let phase = match status.phase.as_deref() {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        _ => PodPhase::Pending,
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.clone());
    let message = terminated.as_ref().and_then(|t| t.message.clone());
    let exit_code = terminated.as_ref().map(|t| t.exit_code);
    let finished_at = terminated.and_then(|t| t.finished_at).map(|t| t.0);
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.clone());
    let stuck = waiting
        .and_then(|w| {
            let cause = w.reason?;
            let reason = match cause.as_str() {
                "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
                    Reason::MoverImagePullFailed
                }
                "CreateContainerConfigError" | "CreateContainerError" => Reason::MoverConfigError,
                _ => return None,
            };
            Some(Stuck {
                reason,
                cause,
                message: w.message.unwrap_or_default(),
            })
        })
        .or_else(|| {
            status.conditions.iter().flatten().find_map(|c| {
                (c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable"))
                .then(|| Stuck {
                    reason: Reason::MoverUnschedulable,
                    cause: "Unschedulable".into(),
                    message: c.message.clone().unwrap_or_default(),
                })
            })
        });
    PodView {
        name: p.name_any(),
        phase,
        ready,
        ip: status.pod_ip.filter(|ip| !ip.is_empty()),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        message,
        exit_code,
        finished_at,
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        stuck,
        deleting: p.metadata.deletion_timestamp.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::{SiblingRole, limits, sibling_roles};
    use crate::api::{Phase, Transfer, TransferStatus};
    use crate::names::LABEL_FAN_OUT_OF;
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    /// Child `i` of fan-out "imagenet" from node "src" to node `d{i}`, created at second `i`.
    fn child(i: i64, phase: Option<Phase>) -> Arc<Transfer> {
        let mut t = crate::plan::tests::transfer();
        t.metadata.name = Some(format!("imagenet-d{i}"));
        t.metadata.uid = Some(format!("uid-{i}"));
        t.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + i).unwrap(),
        ));
        t.metadata.labels = Some(BTreeMap::from([(
            LABEL_FAN_OUT_OF.to_owned(),
            "imagenet".to_owned(),
        )]));
        let (src, dst) = (
            t.spec.source.host_path.as_mut().unwrap(),
            t.spec.destination.host_path.as_mut().unwrap(),
        );
        src.node = "src".into();
        dst.node = format!("d{i}");
        t.status = phase.map(|phase| TransferStatus {
            phase,
            ..TransferStatus::default()
        });
        Arc::new(t)
    }

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| (*n).to_owned()).collect()
    }

    /// The siblings of `roles` with `role`.
    fn with(roles: &BTreeMap<String, SiblingRole>, role: SiblingRole) -> BTreeSet<String> {
        roles
            .iter()
            .filter(|(_, r)| **r == role)
            .map(|(n, _)| n.clone())
            .collect()
    }

    #[test]
    fn siblings_the_limits_keep_queued_beside_a_starting_child_are_idle() {
        // d1 starts; the others have not been looked at yet (no status), as when a fan-out's
        // children are all created at once.
        let all: Vec<_> = (1..=5).map(|i| child(i, None)).collect();
        let per_node = |n| limits::Limits {
            per_node: n,
            ..limits::Limits::default()
        };
        let idle = |l| with(&sibling_roles(&all[0], &all, l), SiblingRole::Idle);
        // Every child's sender runs on "src": with one slot per node, none starts beside d1.
        assert_eq!(idle(per_node(1)), set(&["d2", "d3", "d4", "d5"]));
        // With three, the next two in line start beside it; the last two wait.
        assert_eq!(idle(per_node(3)), set(&["d4", "d5"]));
        // Without limits every sibling receives (or starts to).
        let free = sibling_roles(&all[0], &all, limits::Limits::default());
        assert_eq!(with(&free, SiblingRole::Receives).len(), 4);
    }

    #[test]
    fn a_succeeded_sibling_holds_the_tree_and_a_failed_one_never_will() {
        let all = vec![
            child(1, Some(Phase::Succeeded)),
            child(2, None),
            child(3, Some(Phase::Failed)),
            child(4, Some(Phase::Suspended)),
            child(5, Some(Phase::Running)),
        ];
        let one = limits::Limits {
            per_node: 1,
            ..limits::Limits::default()
        };
        for l in [limits::Limits::default(), one] {
            // d5 runs (it holds its slot, though the limit says one per node); d1 is done.
            let roles = sibling_roles(&all[1], &all, l);
            assert_eq!(with(&roles, SiblingRole::Idle), set(&["d3", "d4"]));
            assert_eq!(with(&roles, SiblingRole::Holds), set(&["d1"]));
            assert_eq!(with(&roles, SiblingRole::Receives), set(&["d5"]));
        }
        // A status of an earlier run counts for nothing: d1 (succeeded then) is looked at as
        // new, and waits behind the limit.
        let mut rerun: Vec<_> = all.iter().map(|c| (**c).clone()).collect();
        for c in &mut rerun {
            c.spec.trigger = Some("run-2".into());
        }
        let rerun: Vec<_> = rerun.into_iter().map(Arc::new).collect();
        let roles = sibling_roles(&rerun[1], &rerun, one);
        assert_eq!(with(&roles, SiblingRole::Holds), BTreeSet::new());
        assert_eq!(roles["d1"], SiblingRole::Idle);
        // Not a fan-out's child: no siblings.
        let lone = Arc::new(crate::plan::tests::transfer());
        assert!(sibling_roles(&lone, &all, one).is_empty());
    }
}
