//! What a fan-out's reconcile reads: its nodes, its children and the run's sender Secrets.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::{Phase, Reason, Side, Transfer};
use crate::context::{Context, Error};
use crate::names::{self, ANNOTATION_FAN_OUT_NODES, LABEL_ROLE, MoverRole};
use crate::plan::fan_out::sender::{self, Candidate};
use crate::plan::fan_out::{self as plan, ChildView, FanOutObserved, SenderObserved};
use crate::plan::placement::{self, Blocked};

pub(crate) fn observe(t: &Transfer, ctx: &Context) -> Result<FanOutObserved, Error> {
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
        crate::plan::fan_out::select_nodes(selector.unwrap_or_default(), &all_nodes)
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
    let facts = crate::observe::side_facts(t, Side::Source, &ctx.caches, &ns);
    let source = placement::place_side(Side::Source, &t.spec.source, &ns, &ctx.config, &facts);
    Ok(FanOutObserved {
        now,
        nodes,
        children,
        source,
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
        .map(|p| crate::observe::pod_view(p))
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
pub(crate) async fn sender_secrets(
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
