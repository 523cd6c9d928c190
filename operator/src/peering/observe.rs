//! What reconcile observes of the other cluster for a half of a cross-cluster Transfer (its
//! Peer; a destination half's source as it last called and its receiver's Service address; a
//! source half's call to the destination, which reports its sender), and the withdrawal of a
//! deleted source half.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::trust::{PeerEntry, peer_entry};
use super::wire::{
    HalfRef, PairRequest, SenderFigures, SenderReport, SenderState, WithdrawRequest,
};
use crate::api::{Reason, Transfer, TransferStatus};
use crate::context::{Context, Error};
use crate::names::{self, MoverRole};
use crate::plan::placement::Blocked;
use crate::plan::{PodPhase, PodView, RemoteObserved};

/// A deleted source half tells its destination half, which stops its receiver (best effort:
/// a destination that does not hear it stops once this half has been silent for a minute).
pub async fn withdraw(t: &Transfer, ctx: &Context) {
    let (Some(remote), Ok(Some(peer))) = (t.spec.destination.remote.as_ref(), peer_of(t, ctx))
    else {
        return;
    };
    let req = WithdrawRequest {
        destination: HalfRef {
            namespace: remote.namespace.clone(),
            name: remote.name.clone(),
        },
        source: HalfRef {
            namespace: t.namespace().unwrap_or_default(),
            name: t.name_any(),
        },
    };
    if let Err(b) = ctx.peer_client.withdraw(&peer, &req).await {
        tracing::info!(transfer = %t.name_any(), "withdrawing from the destination half: {}", b.message);
    }
}

/// The Peer a half names, parsed (`Ok(None)` for a Transfer that is not a half).
pub fn peer_of(t: &Transfer, ctx: &Context) -> Result<Option<PeerEntry>, Blocked> {
    let Some(remote) = t.remote() else {
        return Ok(None);
    };
    let Some(p) = ctx.peers.get(&ObjectRef::new(&remote.peer)) else {
        return Err(Blocked {
            reason: Reason::PeerNotFound,
            message: format!(
                "no Peer {} in this cluster: create it with the other cluster's name, CA bundle and endpoint (docs/cross-cluster.md)",
                remote.peer
            ),
        });
    };
    let entry = peer_entry(&p).map_err(|message| Blocked {
        reason: Reason::PeerInvalid,
        message,
    })?;
    if entry.cluster == ctx.authority.cluster() {
        return Err(Blocked {
            reason: Reason::PeerInvalid,
            message: format!(
                "Peer {} names this cluster ({}); a Peer names another cluster",
                entry.name, entry.cluster
            ),
        });
    }
    Ok(Some(entry))
}

/// The other cluster, for a half: its Peer; for a destination half what the source half
/// reported and the receiver Service's address; for a source half the destination's answer
/// to a call that reports this half's sender.
pub async fn observe_remote(
    t: &Transfer,
    ctx: &Context,
    pods: &[PodView],
    st: &TransferStatus,
    sender_progress: Option<&ferry_proto::progress::v1::ProgressUpdate>,
) -> Result<Option<RemoteObserved>, Error> {
    let Some(remote) = t.remote() else {
        return Ok(None);
    };
    let uid = t.uid().ok_or(Error::Malformed("uid"))?;
    let ns = t.namespace().ok_or(Error::Malformed("namespace"))?;
    let peer = match peer_of(t, ctx) {
        Ok(Some(p)) => Ok(p),
        Ok(None) => return Err(Error::Malformed("remote")),
        Err(b) => Err(b),
    };
    let mut out = RemoteObserved {
        peer: Some(
            peer.as_ref()
                .map(|p| p.cluster.clone())
                .map_err(Clone::clone),
        ),
        ..RemoteObserved::default()
    };
    if t.is_destination_half() {
        out.counterpart = ctx.registry.get(&uid);
        if let Some(svc) = ctx.caches.service(&ns, &names::service_name(&uid, st.run)) {
            out.service_exists = true;
            let recv = names::pod_name(&uid, st.run, st.attempts, MoverRole::Receiver);
            let node = pods
                .iter()
                .find(|p| p.name == recv)
                .and_then(|p| p.node.clone());
            out.receiver_address = service_address(ctx, &svc, node.as_deref());
        }
    } else if let Ok(peer) = &peer {
        let req = PairRequest {
            destination: HalfRef {
                namespace: remote.namespace.clone(),
                name: remote.name.clone(),
            },
            source: HalfRef {
                namespace: ns.clone(),
                name: t.name_any(),
            },
            sender: sender_report(&uid, pods, st, sender_progress),
        };
        out.answer = Some(ctx.peer_client.pair(peer, &req).await);
    }
    Ok(Some(out))
}

/// This source half's sender of its current attempt, for the destination half.
fn sender_report(
    uid: &str,
    pods: &[PodView],
    st: &TransferStatus,
    progress: Option<&ferry_proto::progress::v1::ProgressUpdate>,
) -> Option<SenderReport> {
    let (run, attempt) = (st.run, st.attempts);
    let name = names::pod_name(uid, run, attempt, MoverRole::Sender);
    let figures = progress.map(SenderFigures::from);
    match pods.iter().find(|p| p.name == name) {
        Some(p) => Some(SenderReport {
            run,
            attempt,
            pod: p.name.clone(),
            state: match p.phase {
                PodPhase::Pending => SenderState::Pending,
                PodPhase::Running => SenderState::Running,
                PodPhase::Succeeded => SenderState::Succeeded,
                PodPhase::Failed => SenderState::Failed,
            },
            exit_code: p.exit_code,
            message: p.message.clone(),
            progress: figures,
        }),
        // A sender this half started and that is gone (deleted, or its node lost it).
        None if st.sender.as_ref().is_some_and(|s| s.pod == name) => Some(SenderReport {
            run,
            attempt,
            pod: name.clone(),
            state: SenderState::Failed,
            exit_code: None,
            message: Some(format!("sender pod {name} disappeared")),
            progress: figures,
        }),
        None => None,
    }
}

/// Where the other cluster reaches a receiver's Service: a LoadBalancer's ingress address, or
/// the NodePort on the receiver's node.
fn service_address(ctx: &Context, svc: &Service, receiver_node: Option<&str>) -> Option<String> {
    let spec = svc.spec.clone().unwrap_or_default();
    let port = spec.ports.as_ref().and_then(|p| p.first());
    if spec.type_.as_deref() == Some("LoadBalancer") {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()));
        return ingress.zip(port).map(|(h, p)| host_port(&h, p.port));
    }
    let (Some(node), Some(node_port)) = (receiver_node, port.and_then(|p| p.node_port)) else {
        return None;
    };
    let ip = ctx.caches.node(node).and_then(|n| {
        let addrs = n.status.as_ref()?.addresses.as_ref()?;
        addrs
            .iter()
            .find(|a| a.type_ == "ExternalIP")
            .or_else(|| addrs.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone())
    });
    ip.map(|ip| host_port(&ip, node_port))
}

/// `host:port`, with an IPv6 address in brackets.
fn host_port(host: &str, port: i32) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn addresses_are_host_port_with_ipv6_in_brackets() {
        assert_eq!(super::host_port("10.1.2.3", 30001), "10.1.2.3:30001");
        assert_eq!(super::host_port("fd00::1", 30001), "[fd00::1]:30001");
        assert_eq!(
            super::host_port("lb.example.com", 7400),
            "lb.example.com:7400"
        );
    }
}
