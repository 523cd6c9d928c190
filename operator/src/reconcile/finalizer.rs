//! The finalizer: set before anything is written, so a deletion always cleans up; removed once
//! the Transfer's movers, Secrets and staging are gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;

use crate::api::Transfer;
use crate::apply::movers::{self, MoverPodInput};
use crate::apply::{ignore_not_found, ssa};
use crate::context::{Context, Error};
use crate::names::{self, FINALIZER, MoverRole};
use crate::observe::{observe, pod_prefix};
use crate::peering::observe::withdraw;
use crate::plan::cleanup::{self, CleanupAction};
use crate::status::record;

/// Adds or removes our finalizer (a merge patch with the resourceVersion, so a concurrent
/// change of the list is retried rather than overwritten).
///
/// Not kube-runtime's `finalizer` helper: it removes the finalizer as soon as its cleanup
/// callback returns, but ferry's cleanup takes several reconciles (stop the movers, run a
/// cleanup pod on the destination's node, wait for it, give up after 120 s), each requeued
/// while the previous step runs; with the helper every "not done yet" would have to be an
/// error, counted and logged as a failure.
pub(crate) async fn set_finalizer(t: &Transfer, ctx: &Context, present: bool) -> Result<(), Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    let mut list: Vec<String> = t
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_owned());
    }
    let patch = serde_json::json!({
        "metadata": {"finalizers": list, "resourceVersion": t.resource_version()}
    });
    api.patch(
        &t.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    if let Some(uid) = t.uid() {
        ctx.own_writes.wrote(&uid, t.resource_version());
    }
    Ok(())
}

/// A deleted Transfer: stop its movers, remove its staging data, then let it go.
pub(crate) async fn cleanup(t: &Transfer, ctx: &Context) -> Result<Requeue, Error> {
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    ctx.watchers.retain(&pod_prefix(&uid), &[]);
    if !t.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Requeue::await_change());
    }
    let obs = observe(t, ctx).await?;
    let cleaner = names::cleanup_pod_name(&uid);
    let deleting_for = t
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|d| Duration::try_from(Timestamp::now().duration_since(d.0)).ok())
        .unwrap_or_default();
    // Any run that started may have left staging data (an earlier run's, too).
    let ran = t
        .status
        .as_ref()
        .is_some_and(|s| s.start_time.is_some() || s.run > 1);
    // Staging lives where the receiver ran: not in this cluster for a source half.
    let dest = obs
        .placement
        .as_ref()
        .ok()
        .map(|(_, d)| d)
        .filter(|d| d.volume != crate::plan::placement::VolumeRef::Remote);
    if t.is_source_half() && deleting_for < Duration::from_secs(30) {
        withdraw(t, ctx).await;
    }
    let plan = cleanup::plan_cleanup(ran, dest.is_some(), &obs.pods, &cleaner, deleting_for);
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for action in &plan.actions {
        match action {
            CleanupAction::DeletePod(name) => {
                let dp = DeleteParams::default().grace_period(1);
                ignore_not_found(pods.delete(name, &dp).await.map(|_| ()))?;
            }
            CleanupAction::CreateCleanupPod => {
                let Some(dest) = dest else { continue };
                let pod = movers::cleanup_pod(&MoverPodInput::new(
                    t,
                    &ctx.config,
                    MoverRole::Receiver,
                    (0, 0),
                    dest,
                ));
                pods.patch(&cleaner, &ssa(), &Patch::Apply(&pod)).await?;
            }
        }
    }
    if let Some(note) = &plan.note {
        record(t, ctx, std::slice::from_ref(note)).await;
    }
    if plan.done {
        set_finalizer(t, ctx, false).await?;
        ctx.metrics.forget(&uid);
        ctx.limiter.forget(&uid);
        ctx.registry.forget(&uid);
        ctx.secrets.forget(&uid);
        ctx.own_writes.forget(&uid);
        ctx.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        return Ok(Requeue::await_change());
    }
    Ok(Requeue::requeue(Duration::from_secs(1)))
}
