//! Writes a planned status (server-side apply of the status subresource, within the patch
//! budget) and records the plan's Events.

use std::time::Duration;

use kube::api::{Api, Patch};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use crate::api::Transfer;
use crate::apply::ssa;
use crate::context::{Context, Error};
use crate::plan;

/// What became of a planned status.
pub enum Written {
    /// Written (or already current).
    Now,
    /// Only progress changed, and the patch rate limit defers it this long.
    Later(Duration),
    /// The Transfer changed after it was read (its resourceVersion moved on): not written.
    Stale,
}

/// Server-side apply of the status subresource when it changed, on the version `t` was read
/// at; a change of progress alone waits for the limiter.
pub async fn write_status(
    t: &Transfer,
    ctx: &Context,
    status: &crate::api::TransferStatus,
) -> Result<Written, Error> {
    let old = t.status.clone().unwrap_or_default();
    if t.status.as_ref() == Some(status) {
        return Ok(Written::Now);
    }
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let now = std::time::Instant::now();
    let progress_only = crate::status::progress_only(&old, status);
    if let Some(wait) = ctx.limiter.defer(&uid, progress_only, now) {
        return Ok(Written::Later(wait));
    }
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": Transfer::api_version(&()),
        "kind": Transfer::kind(&()),
        // A precondition: the status was planned from this version of the Transfer, and must
        // not land on another (a concurrent edit, or a second operator during a handover).
        "metadata": {"resourceVersion": t.resource_version()},
        "status": status,
    });
    match api
        .patch_status(&t.name_any(), &ssa(), &Patch::Apply(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Written::Stale),
        Err(e) => return Err(e.into()),
    }
    ctx.limiter.patched(&uid, now);
    ctx.own_writes.wrote(&uid, t.resource_version());
    ctx.metrics.status_patch(progress_only);
    Ok(Written::Now)
}

pub async fn record(t: &Transfer, ctx: &Context, notes: &[plan::Note]) {
    for n in notes {
        let event = Event {
            type_: if n.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: n.reason.to_owned(),
            note: Some(n.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &t.object_ref(&())).await {
            tracing::debug!("failed to record an event: {e}");
        }
    }
}
