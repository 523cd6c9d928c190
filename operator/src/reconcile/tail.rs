//! The end every reconcile shares, a single Transfer's and a fan-out's alike: the planned
//! status written (or deferred by the patch budget), its Events recorded, the metrics told, and
//! when to look again.

use std::time::Duration;

use kube::runtime::controller::Action as Requeue;

use crate::api::{Transfer, TransferStatus};
use crate::context::{Context, Error};
use crate::plan::Note;
use crate::status::{Written, record, write_status};

/// How soon a reconcile that found the cache behind this operator's own write looks again.
pub(super) const STALE_RETRY: Duration = Duration::from_secs(2);

/// The shortest requeue: a plan that wants to look again at once still lets the watch events
/// of its own writes arrive first.
const MIN_REQUEUE: Duration = Duration::from_millis(200);

/// Writes `status`, records `notes`, and requeues after `requeue` or the patch budget's wait,
/// whichever comes first (on a change only, when neither is set).
pub(super) async fn conclude(
    t: &Transfer,
    ctx: &Context,
    status: &TransferStatus,
    notes: &[Note],
    requeue: Option<Duration>,
) -> Result<Requeue, Error> {
    let deferred = match write_status(t, ctx, status).await? {
        Written::Now => None,
        Written::Later(wait) => Some(wait),
        // Planned from a version that changed meanwhile: plan again once the cache has the
        // new one (its watch event wakes the reconcile), and announce nothing of a status
        // that did not land.
        Written::Stale => return Ok(Requeue::requeue(STALE_RETRY)),
    };
    record(t, ctx, notes).await;
    ctx.metrics.observe(t, status);
    Ok(match requeue.into_iter().chain(deferred).min() {
        Some(d) => Requeue::requeue(d.max(MIN_REQUEUE)),
        None => Requeue::await_change(),
    })
}
