//! Carries out a fan-out's plan: its children, and the run's senders (certificate, policy, pod).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch};

use crate::api::Transfer;
use crate::apply::movers::MoverPodInput;
use crate::apply::movers::{self, owner_ref};
use crate::apply::{delete_if_present, ignore_not_found, ssa};
use crate::context::{Context, Error};
use crate::names::{
    ANNOTATION_FAN_OUT_NODES, LABEL_FAN_OUT_OF, LABEL_MANAGED_BY, MANAGER, MoverRole,
};
use crate::plan::fan_out::FanOutAction;
use crate::plan::fan_out::sender::Served;
use crate::plan::placement::{Blocked, SidePlacement};

/// Starts one of the run's senders: its certificate (naming the first attempt of every child
/// it serves), then its pod on the source node. A source that cannot be placed starts nothing: the
/// children wait for it as long as they would have, then start their own (and report why).
async fn start_sender(
    t: &Transfer,
    ctx: &Context,
    source: &Result<SidePlacement, Blocked>,
    run: u32,
    batch: u32,
    serves: &[Served],
) -> Result<(), Error> {
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let source = match source {
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
    crate::apply::network_policy::keep(t, &ctx.client, &ctx.config).await?;
    let pod = movers::mover_pod(&MoverPodInput {
        serves,
        ..MoverPodInput::new(t, &ctx.config, MoverRole::Sender, (run, batch), source)
    });
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
        .await?;
    Ok(())
}

pub(crate) async fn apply(
    t: &Transfer,
    ctx: &Context,
    source: &Result<SidePlacement, Blocked>,
    actions: &[FanOutAction],
) -> Result<(), Error> {
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
                start_sender(t, ctx, source, *run, *batch, serves).await?;
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
