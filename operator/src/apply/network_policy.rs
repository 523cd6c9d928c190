//! The NetworkPolicy beside each Transfer (`--network-policies`): its mover pods admit only
//! ferry's own traffic. The chart's policy does the same for the node services.
//!
//! - The data port: the movers of the Transfer's namespace (a sender and its receiver, a fan-out's
//!   sender and its children's receivers; a Transfer's two sides are always in one namespace).
//!   A half of a cross-cluster Transfer also admits anyone, since the other cluster's mover comes
//!   from outside this one (mutual TLS pinned to that cluster's identity is what admits it).
//! - The progress port: the operator's namespace (and the address blocks of
//!   `--network-policy-peer`, for an operator running outside the cluster).
//!
//! A tenant can put the movers' labels on a pod of its own namespace, so this keeps other
//! namespaces' pods (and anything a tenant's compromised workload could reach) off the movers; the
//! certificates remain what tells a mover from an impostor.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch};
use kube::{Client, ResourceExt};

use crate::api::Transfer;
use crate::apply::movers::owner_ref;
use crate::config::Config;
use crate::names::{self, LABEL_MANAGED_BY, LABEL_TRANSFER_UID, MANAGER};

/// The label Kubernetes puts on every namespace, its name.
const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// The name of the policy of the Transfer with uid `uid`.
pub fn policy_name(uid: &str) -> String {
    format!("ferry-movers-{uid}")
}

fn selector(labels: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

fn tcp(port: u16) -> Option<Vec<NetworkPolicyPort>> {
    Some(vec![NetworkPolicyPort {
        port: Some(IntOrString::Int(port.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }])
}

/// The policy of `t`'s mover pods.
pub fn mover_policy(t: &Transfer, cfg: &Config) -> NetworkPolicy {
    let uid = t.uid().unwrap_or_default();
    let movers = NetworkPolicyPeer {
        pod_selector: Some(selector(&[(LABEL_MANAGED_BY, MANAGER)])),
        ..Default::default()
    };
    let data_from = if t.remote().is_some() {
        None
    } else {
        Some(vec![movers])
    };
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(selector(&[(NAMESPACE_NAME, &cfg.namespace)])),
        ..Default::default()
    };
    let outside = cfg
        .network_policy_peers
        .iter()
        .map(|cidr| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr.clone(),
                except: None,
            }),
            ..Default::default()
        });
    let progress_from = std::iter::once(operator).chain(outside).collect();
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(&uid)),
            namespace: t.namespace(),
            labels: Some(names::labels(&t.name_any(), &uid)),
            owner_references: owner_ref(t).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(&[
                (LABEL_TRANSFER_UID, &uid),
                (LABEL_MANAGED_BY, MANAGER),
            ])),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: data_from,
                    ports: tcp(cfg.data_port),
                },
                NetworkPolicyIngressRule {
                    from: Some(progress_from),
                    ports: tcp(cfg.progress_port),
                },
            ]),
            ..Default::default()
        }),
    }
}

/// Applies `t`'s policy when the operator keeps them (server-side apply: the same every time).
pub async fn keep(t: &Transfer, client: &Client, cfg: &Config) -> Result<(), kube::Error> {
    if !cfg.network_policies {
        return Ok(());
    }
    let policy = mover_policy(t, cfg);
    let api: Api<NetworkPolicy> =
        Api::namespaced(client.clone(), &t.namespace().unwrap_or_default());
    api.patch(
        &policy.name_any(),
        &crate::apply::ssa(),
        &Patch::Apply(&policy),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransferSpec;

    fn transfer(spec: serde_json::Value) -> Transfer {
        let spec: TransferSpec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
        let mut t = Transfer::new("copy", spec);
        t.metadata.namespace = Some("ml".into());
        t.metadata.uid = Some("u-1".into());
        t
    }

    #[test]
    fn movers_admit_their_namespaces_movers_and_the_operator() {
        let t = transfer(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/x"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/y"}},
        }));
        let p = mover_policy(&t, &Config::default());
        assert_eq!(p.metadata.name.as_deref(), Some("ferry-movers-u-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ml"));
        let v = serde_json::to_value(p.spec.unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            v["podSelector"]["matchLabels"],
            serde_json::json!({"ferry.dev/transfer-uid": "u-1", "app.kubernetes.io/managed-by": "ferry-operator"})
        );
        assert_eq!(v["policyTypes"], serde_json::json!(["Ingress"]));
        assert_eq!(
            v["ingress"][0],
            serde_json::json!({
                "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "ferry-operator"}}}],
                "ports": [{"port": 7400, "protocol": "TCP"}],
            })
        );
        assert_eq!(
            v["ingress"][1],
            serde_json::json!({
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ferry-system"}}}],
                "ports": [{"port": 7401, "protocol": "TCP"}],
            })
        );
    }

    #[test]
    fn a_cross_cluster_half_admits_its_peer_from_outside() {
        let t = transfer(serde_json::json!({
            "source": {"remote": {"peer": "east", "namespace": "ml", "name": "copy"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/y"}},
        }));
        let cfg = Config {
            network_policy_peers: vec!["10.99.0.1/32".into()],
            ..Config::default()
        };
        let v = serde_json::to_value(mover_policy(&t, &cfg).spec).unwrap_or_default();
        assert_eq!(
            v["ingress"][0],
            serde_json::json!({"ports": [{"port": 7400, "protocol": "TCP"}]})
        );
        // An operator outside the cluster reads progress from its address.
        assert_eq!(
            v["ingress"][1]["from"][1],
            serde_json::json!({"ipBlock": {"cidr": "10.99.0.1/32"}})
        );
    }
}
