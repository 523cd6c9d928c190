//! Carries out what the plan decided: server-side apply of pods, Secrets, Services and claims,
//! deletions, and the calls to a peer cluster. It decides nothing.

pub mod fan_out;
pub mod movers;
pub mod network_policy;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;

use crate::api::Transfer;
use crate::context::{Context, Error};
use crate::names::{self, MANAGER, MoverRole};
use crate::plan::{self, Action, Observed};
use movers::{MoverPodInput, RemoteMover};

pub(crate) async fn apply(
    t: &Transfer,
    ctx: &Context,
    obs: &Observed,
    plan: &plan::Plan,
) -> Result<(), Error> {
    let actions = &plan.actions;
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let placed = obs.placement.as_ref().ok();
    // A half's movers meet the other cluster's: its name, the shared transfer id, its CA.
    let peer = match t.remote() {
        Some(r) => ctx.peers.get(&ObjectRef::new(&r.peer)),
        None => None,
    };
    let remote_ids = peer.as_ref().map(|p| RemoteIds {
        cluster: p.spec.cluster_name.clone(),
        transfer_id: plan
            .status
            .remote
            .as_ref()
            .and_then(|r| r.transfer_id.clone())
            .unwrap_or_default(),
    });
    let remote = remote_ids.as_ref();
    let peer_ca = peer.as_ref().map(|p| p.spec.ca_bundle.clone());
    let store = plan::tenancy::store_scope(t, plan.dedup);
    let use_block_store = store.is_some() && ctx.config.block_service.is_some();
    for action in actions {
        match action {
            Action::CreateSecret { run, attempt } => {
                let node = placed.and_then(|(_, dst)| dst.node.as_deref());
                let tenancy =
                    plan::tenancy::receiver_tenancy(t, *run, store, ctx.authority.cluster(), node)
                        .map_err(|_| {
                            Error::Malformed("namespace, uid, run or node a certificate can name")
                        })?;
                let files = match (remote, &peer_ca) {
                    (Some(r), Some(ca)) => {
                        let role = if t.is_source_half() {
                            ferry_proto::net::Role::Sender
                        } else {
                            ferry_proto::net::Role::Receiver
                        };
                        let mut files = ctx.authority.cross_cluster_files(
                            &r.transfer_id,
                            *attempt,
                            role,
                            &r.cluster,
                            &tenancy,
                        )?;
                        files.insert(movers::PEER_CA_KEY.to_owned(), ca.clone());
                        files
                    }
                    _ => ctx.authority.attempt_files(
                        &names::transfer_id(&uid, *run),
                        *attempt,
                        &tenancy,
                    )?,
                };
                let secret = movers::attempt_secret(t, *run, *attempt, &files);
                let name = names::secret_name(&uid, *run, *attempt);
                secrets.patch(&name, &ssa(), &Patch::Apply(&secret)).await?;
                ctx.secrets.created(&uid, &name);
                crate::apply::network_policy::keep(t, &ctx.client, &ctx.config).await?;
            }
            Action::CreateReceiver { run, attempt } => {
                let Some((_, dst)) = placed else { continue };
                let pod = movers::mover_pod(&MoverPodInput {
                    swarm: plan.swarm.as_ref(),
                    use_block_store,
                    remote: remote.map(|r| RemoteMover {
                        peer_cluster: &r.cluster,
                        transfer_id: &r.transfer_id,
                        connect: None,
                    }),
                    ..MoverPodInput::new(t, &ctx.config, MoverRole::Receiver, (*run, *attempt), dst)
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::CreateSender {
                run,
                attempt,
                receiver_ip,
            } => {
                let Some((src, _)) = placed else { continue };
                let pod = movers::mover_pod(&MoverPodInput {
                    receiver_ip: Some(receiver_ip),
                    ..MoverPodInput::new(t, &ctx.config, MoverRole::Sender, (*run, *attempt), src)
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::CreateRemoteSender {
                run,
                attempt,
                address,
            } => {
                let (Some((src, _)), Some(r)) = (placed, remote) else {
                    continue;
                };
                let pod = movers::mover_pod(&MoverPodInput {
                    remote: Some(RemoteMover {
                        peer_cluster: &r.cluster,
                        transfer_id: &r.transfer_id,
                        connect: Some(address),
                    }),
                    ..MoverPodInput::new(t, &ctx.config, MoverRole::Sender, (*run, *attempt), src)
                });
                pods.patch(&pod.name_any(), &ssa(), &Patch::Apply(&pod))
                    .await?;
            }
            Action::ApplyReceiverService { run, attempt } => {
                let svc = movers::receiver_service(t, &ctx.config, *run, *attempt);
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                api.patch(&svc.name_any(), &ssa(), &Patch::Apply(&svc))
                    .await?;
            }
            Action::CreateClaim(req) => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
                let claim = crate::plan::provision::claim_object(t, req);
                match api.create(&PostParams::default(), &claim).await {
                    Ok(_) => {}
                    // Created by a reconcile whose status write was lost, or by someone else:
                    // the next look sizes it up.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Action::DeleteService(name) => {
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
            }
            Action::DeletePod(name) => delete_if_present(&pods, name).await?,
            Action::DeleteSecret(name) => {
                delete_if_present(&secrets, name).await?;
                ctx.secrets.deleted(&uid, name);
            }
            Action::DeleteTransfer => {
                let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
                ignore_not_found(
                    api.delete(&t.name_any(), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )?;
            }
        }
    }
    Ok(())
}

/// The other cluster's name and the transfer id both clusters' movers carry.
struct RemoteIds {
    cluster: String,
    transfer_id: String,
}

pub fn ssa() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Deletes `name`; one that is gone already is no error.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ignore_not_found(api.delete(name, &DeleteParams::default()).await.map(|_| ()))
}

pub fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
