//! One reconcile of a fan-out Transfer: observe its nodes and children, plan
//! (`crate::plan::fan_out`), apply the children and the run's senders, write the status.

use kube::runtime::controller::Action as Requeue;

use crate::api::Transfer;
use crate::apply::fan_out::apply;
use crate::context::{Context, Error};
use crate::observe::fan_out::{observe, sender_secrets};
use crate::plan::fan_out as plan;

pub async fn reconcile(t: &Transfer, ctx: &Context) -> Result<Requeue, Error> {
    let mut obs = observe(t, ctx)?;
    obs.sender.secrets = sender_secrets(t, ctx, obs.sender.per_sender).await?;
    let plan = plan::plan(t, &obs);
    apply(t, ctx, &obs.source, &plan.actions).await?;
    super::tail::conclude(t, ctx, &plan.status, &plan.notes, plan.requeue).await
}
