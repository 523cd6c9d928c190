//! Keeps each node's block store on the same PersistentVolume when its node-service pod is
//! replaced (a DaemonSet upgrade, an eviction, a node restarted after its pods were deleted).
//!
//! With the chart's `nodeService.persistentVolume.perNode`, every node-service pod gets a claim
//! of its own (a generic ephemeral volume, deleted with the pod) that selects the volumes labelled
//! `ferry.dev/node-store=true`: PersistentVolumes the admin provides, one per node (a local
//! volume, `persistentVolumeReclaimPolicy: Retain`). The first pod on a node binds a free one as
//! any claim would. When that pod goes, its claim goes and the volume is `Released` with its data;
//! nothing would ever bind it again, and the node's next pod would wait for a volume for ever.
//! The keeper pre-binds the volume to that next pod's claim (`spec.claimRef` names it, without a
//! uid) and the PV controller binds the two: the new pod starts on the store the old one filled.
//!
//! What it may change is narrow on purpose, since a volume bound to the wrong claim hands its data
//! to that claim's owner:
//! - only labelled volumes, and the label only offers a volume: which node a volume is for comes
//!   from its own `spec.nodeAffinity.required` (one term naming one node, `kubernetes.io/hostname
//!   In [node]` as a `local` volume has, or `metadata.name In [node]`), the rule the scheduler
//!   enforces, never from a label anyone could put on it. A volume whose affinity names no single
//!   node is a store for no node;
//! - only when free (`Available` naming no claim) or left by a claim that no longer exists of the
//!   operator's own namespace, and only to a claim of that same namespace: the blocks a claim of
//!   one namespace left are never handed to a claim of another;
//! - only to the claim of a node-service pod on the volume's node, of the same StorageClass and
//!   no larger than the volume.
//!
//! A pre-bound volume cannot be taken by any other claim, so a tenant's claim of the same class
//! never gets a store.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::names::NODE_SERVICE_COMPONENT;
use crate::plan::parse_quantity;

/// The label that offers a PersistentVolume to the node services' claims.
pub const STORE_VOLUME_LABEL: &str = "ferry.dev/node-store";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// A pass also runs this often without a change seen, in case a watch missed one.
const RESYNC: Duration = Duration::from_secs(60);
/// How long changes are gathered into one pass (a pod deleted, its claim deleted, the volume
/// released, the new pod and claim created come within a few seconds).
const SETTLE: Duration = Duration::from_millis(500);

/// Which node a volume can be used on, as its node affinity says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeNode {
    /// `metadata.name In [name]` (a match field).
    Name(String),
    /// `kubernetes.io/hostname In [value]` (the usual form of a local volume).
    Hostname(String),
}

/// A labelled PersistentVolume, as the plan needs it.
#[derive(Clone, Debug)]
pub struct StoreVolume {
    pub name: String,
    /// `None`: its affinity names no single node; such a volume is never pre-bound.
    pub node: Option<VolumeNode>,
    pub class: Option<String>,
    /// Bytes of `spec.capacity.storage`, when readable.
    pub capacity: Option<u64>,
    pub phase: Option<String>,
    /// `(namespace, name)` of the claim its `claimRef` names.
    pub claim: Option<(String, String)>,
    pub resource_version: Option<String>,
}

/// A node-service pod's claim that no volume is bound to yet.
#[derive(Clone, Debug)]
pub struct WaitingClaim {
    pub namespace: String,
    pub name: String,
    pub class: Option<String>,
    /// Bytes the claim requests, when readable.
    pub request: Option<u64>,
    pub node: String,
    /// The node's `kubernetes.io/hostname` label.
    pub hostname: Option<String>,
}

/// Name `claim` in `volume`'s `claimRef` (only if its resourceVersion is still this one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreBind {
    pub volume: String,
    pub claim: String,
    pub resource_version: Option<String>,
}

impl StoreVolume {
    fn is_on(&self, claim: &WaitingClaim) -> bool {
        match &self.node {
            Some(VolumeNode::Name(n)) => *n == claim.node,
            Some(VolumeNode::Hostname(h)) => claim.hostname.as_deref() == Some(h),
            None => false,
        }
    }

    /// Free to pre-bind to `claim`: naming no claim, or naming a claim of `namespace` (the
    /// operator's) that is gone (`claims` holds every claim that exists there), and only when
    /// `claim` is of `namespace` too. Blocks left by a claim of another namespace stay its
    /// owner's, and a claim of another namespace never gets a store, even one nobody used yet.
    fn is_free_for(
        &self,
        namespace: &str,
        claims: &BTreeSet<String>,
        claim: &WaitingClaim,
    ) -> bool {
        if claim.namespace != namespace {
            return false;
        }
        match (self.phase.as_deref(), &self.claim) {
            (Some("Available"), None) => true,
            (Some("Available" | "Released"), Some((ns, name))) => {
                ns == namespace
                    && *ns == claim.namespace
                    && !name.is_empty()
                    && !claims.contains(name)
            }
            _ => false,
        }
    }

    /// Whether it is large enough for `claim` (the PV controller refuses a smaller one, which
    /// would then stay reserved for a claim it never binds). Unknown sizes are left to it.
    fn fits(&self, claim: &WaitingClaim) -> bool {
        match (self.capacity, claim.request) {
            (Some(have), Some(want)) => have >= want,
            _ => true,
        }
    }

    /// Whether it held a store before (released by a node-service claim): preferred over a
    /// fresh volume, so a node gets its blocks back.
    fn held_a_store(&self) -> bool {
        self.phase.as_deref() == Some("Released")
    }
}

/// Which volume to pre-bind to which waiting claim. Pure: `volumes` are the labelled volumes,
/// `waiting` the node-service claims not bound yet, `claims` the names of every claim that exists
/// in `namespace` (the operator's). At most one volume per claim and one claim per volume; a
/// claim some volume is already pre-bound to gets nothing more.
pub fn plan(
    namespace: &str,
    volumes: &[StoreVolume],
    waiting: &[WaitingClaim],
    claims: &BTreeSet<String>,
) -> Vec<PreBind> {
    let mut waiting: Vec<&WaitingClaim> = waiting.iter().collect();
    waiting.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut candidates: Vec<&StoreVolume> = volumes.iter().collect();
    candidates.sort_by(|a, b| (!a.held_a_store(), &a.name).cmp(&(!b.held_a_store(), &b.name)));
    let mut taken = BTreeSet::new();
    let mut binds = Vec::new();
    for claim in waiting {
        let pre_bound = volumes.iter().any(|v| {
            v.claim
                .as_ref()
                .is_some_and(|(ns, n)| *ns == claim.namespace && *n == claim.name)
        });
        if pre_bound {
            continue;
        }
        let found = candidates.iter().find(|v| {
            !taken.contains(&v.name)
                && v.is_free_for(namespace, claims, claim)
                && v.is_on(claim)
                && v.class == claim.class
                && v.fits(claim)
        });
        if let Some(v) = found {
            taken.insert(v.name.clone());
            binds.push(PreBind {
                volume: v.name.clone(),
                claim: claim.name.clone(),
                resource_version: v.resource_version.clone(),
            });
        }
    }
    binds
}

/// The volume's node, read from its own required node affinity (the rule the scheduler holds
/// every pod using it to), never from its labels: exactly one term, with exactly one requirement
/// on which node it is, `kubernetes.io/hostname In [one]` (a `local` volume's form) or the match
/// field `metadata.name In [one]`. Requirements on other labels (a zone) only narrow further and
/// are left to the scheduler. Several terms (any of them would do), several values, other
/// operators or two requirements on the node's identity name no single node: `None`.
pub fn volume_node(pv: &PersistentVolume) -> Option<VolumeNode> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let [term] = terms.as_slice() else {
        return None;
    };
    let by_field = term
        .match_fields
        .iter()
        .flatten()
        .filter(|r| r.key == "metadata.name")
        .map(|r| (r, VolumeNode::Name as fn(String) -> VolumeNode));
    let by_label = term
        .match_expressions
        .iter()
        .flatten()
        .filter(|r| r.key == HOSTNAME_LABEL)
        .map(|r| (r, VolumeNode::Hostname as fn(String) -> VolumeNode));
    let mut naming = by_field.chain(by_label);
    let (Some((req, node)), None) = (naming.next(), naming.next()) else {
        return None;
    };
    match (req.operator.as_str(), req.values.as_deref()) {
        ("In", Some([v])) if !v.is_empty() => Some(node(v.clone())),
        _ => None,
    }
}

fn store_volume(pv: &PersistentVolume) -> StoreVolume {
    let spec = pv.spec.as_ref();
    StoreVolume {
        name: pv.name_any(),
        node: volume_node(pv),
        class: spec.and_then(|s| s.storage_class_name.clone()),
        capacity: spec
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| parse_quantity(&q.0)),
        phase: pv.status.as_ref().and_then(|s| s.phase.clone()),
        claim: spec.and_then(|s| s.claim_ref.as_ref()).map(|c| {
            (
                c.namespace.clone().unwrap_or_default(),
                c.name.clone().unwrap_or_default(),
            )
        }),
        resource_version: pv.resource_version(),
    }
}

/// The node a DaemonSet pod is for: its `nodeName` once scheduled, else the node its affinity
/// pins it to (the DaemonSet controller's `metadata.name` match field).
pub fn pod_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = &spec.node_name {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|r| {
            match (r.key.as_str(), r.operator.as_str(), r.values.as_deref()) {
                ("metadata.name", "In", Some([n])) => Some(n.clone()),
                _ => None,
            }
        })
    })
}

/// The claims a pod's generic ephemeral volumes get (`<pod>-<volume>`).
fn ephemeral_claims(pod: &Pod) -> Vec<String> {
    let name = pod.name_any();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.ephemeral.is_some())
        .map(|v| format!("{name}-{}", v.name))
        .collect()
}

/// Watches the labelled volumes and the node services' pods and claims, and pre-binds a volume
/// whenever a node-service claim waits for one. Runs until the process ends.
pub fn spawn_keeper(client: Client, namespace: String) {
    tokio::spawn(async move {
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
        let changes = stream::select_all([
            watcher(
                volumes,
                watcher::Config::default().labels(STORE_VOLUME_LABEL),
            )
            .default_backoff()
            .map(|_| ())
            .boxed(),
            watcher(
                pods,
                watcher::Config::default().labels(NODE_SERVICE_COMPONENT),
            )
            .default_backoff()
            .map(|_| ())
            .boxed(),
            watcher(claims, watcher::Config::default())
                .default_backoff()
                .map(|_| ())
                .boxed(),
        ]);
        tokio::pin!(changes);
        loop {
            if let Err(e) = keep(&client, &namespace).await {
                tracing::warn!(error = %e, "could not bind the node stores' volumes");
            }
            tokio::select! {
                _ = changes.next() => {}
                () = tokio::time::sleep(RESYNC) => {}
            }
            // Changes that come together make one pass.
            tokio::time::sleep(SETTLE).await;
            while futures::FutureExt::now_or_never(changes.next()).is_some() {}
        }
    });
}

/// One pass: observe, plan, pre-bind.
async fn keep(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let volume_api: Api<PersistentVolume> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let service_pods = pods
        .list(&ListParams::default().labels(NODE_SERVICE_COMPONENT))
        .await?
        .items;
    let existing = claim_api.list(&ListParams::default()).await?.items;
    let mut waiting = Vec::new();
    for pod in service_pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let Some(node) = pod_node(pod) else { continue };
        for name in ephemeral_claims(pod) {
            let Some(claim) = existing.iter().find(|c| c.name_any() == name) else {
                continue;
            };
            let spec = claim.spec.as_ref();
            if spec
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty())
            {
                continue;
            }
            let hostname = nodes
                .get_opt(&node)
                .await?
                .and_then(|n| n.labels().get(HOSTNAME_LABEL).cloned());
            waiting.push(WaitingClaim {
                namespace: claim.namespace().unwrap_or_default(),
                name,
                class: spec.and_then(|s| s.storage_class_name.clone()),
                request: spec
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get("storage"))
                    .and_then(|q| parse_quantity(&q.0)),
                node: node.clone(),
                hostname,
            });
        }
    }
    if waiting.is_empty() {
        return Ok(());
    }
    let volumes: Vec<StoreVolume> = volume_api
        .list(&ListParams::default().labels(STORE_VOLUME_LABEL))
        .await?
        .items
        .iter()
        .map(store_volume)
        .collect();
    let names: BTreeSet<String> = existing.iter().map(|c| c.name_any()).collect();
    for bind in plan(namespace, &volumes, &waiting, &names) {
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": bind.resource_version},
            "spec": {"claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": bind.claim,
                "uid": null,
                "resourceVersion": null,
                "fieldPath": null,
            }},
        });
        volume_api
            .patch(&bind.volume, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(
            volume = %bind.volume,
            claim = %bind.claim,
            "bound a node store's volume to its node service's new claim"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "ferry-system";

    fn volume(name: &str, node: &str, phase: &str, claim: Option<(&str, &str)>) -> StoreVolume {
        StoreVolume {
            name: name.into(),
            node: Some(VolumeNode::Hostname(node.into())),
            class: Some("local".into()),
            capacity: Some(4 << 30),
            phase: Some(phase.into()),
            claim: claim.map(|(ns, n)| (ns.into(), n.into())),
            resource_version: Some(format!("rv-{name}")),
        }
    }

    fn waiting(name: &str, node: &str) -> WaitingClaim {
        WaitingClaim {
            namespace: NS.into(),
            name: name.into(),
            class: Some("local".into()),
            request: Some(4 << 30),
            node: node.into(),
            hostname: Some(node.into()),
        }
    }

    fn existing(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_new_pod_gets_the_volume_its_nodes_old_pod_released() {
        let volumes = [
            volume(
                "pv-a",
                "node-a",
                "Released",
                Some((NS, "ferry-node-old-store")),
            ),
            volume("pv-b", "node-b", "Bound", Some((NS, "ferry-node-b-store"))),
        ];
        let binds = plan(
            NS,
            &volumes,
            &[waiting("ferry-node-new-store", "node-a")],
            &existing(&["ferry-node-new-store", "ferry-node-b-store"]),
        );
        assert_eq!(
            binds,
            [PreBind {
                volume: "pv-a".into(),
                claim: "ferry-node-new-store".into(),
                resource_version: Some("rv-pv-a".into()),
            }]
        );
    }

    #[test]
    fn a_released_store_is_preferred_to_a_fresh_volume_and_each_goes_once() {
        let volumes = [
            volume("pv-a1", "node-a", "Available", None),
            volume("pv-a2", "node-a", "Released", Some((NS, "gone-store"))),
        ];
        let claims = [waiting("c1-store", "node-a"), waiting("c2-store", "node-a")];
        let binds = plan(NS, &volumes, &claims, &existing(&["c1-store", "c2-store"]));
        let pairs: Vec<_> = binds
            .iter()
            .map(|b| (b.claim.as_str(), b.volume.as_str()))
            .collect();
        assert_eq!(pairs, [("c1-store", "pv-a2"), ("c2-store", "pv-a1")]);
    }

    #[test]
    fn volumes_of_others_are_never_touched() {
        let volumes = [
            // released by a tenant's claim: its data is the tenant's
            volume("tenant", "node-a", "Released", Some(("ml", "data"))),
            // bound, or pre-bound to a claim of ours that still exists
            volume("bound", "node-a", "Bound", Some((NS, "other-store"))),
            volume("reserved", "node-a", "Available", Some((NS, "other-store"))),
            // on another node, or on no single node
            volume("elsewhere", "node-b", "Available", None),
            StoreVolume {
                node: None,
                ..volume("anywhere", "node-a", "Available", None)
            },
            // of another class
            StoreVolume {
                class: Some("fast".into()),
                ..volume("fast", "node-a", "Available", None)
            },
            // too small for the claim
            StoreVolume {
                capacity: Some(1 << 30),
                ..volume("small", "node-a", "Available", None)
            },
            // failed or pending
            volume("failed", "node-a", "Failed", Some((NS, "gone"))),
            // a claimRef of our namespace that names no claim
            volume("nameless", "node-a", "Released", Some((NS, ""))),
        ];
        let binds = plan(
            NS,
            &volumes,
            &[waiting("new-store", "node-a")],
            &existing(&["new-store", "other-store"]),
        );
        assert!(binds.is_empty(), "{binds:?}");
    }

    #[test]
    fn blocks_left_by_a_claim_of_another_namespace_go_to_no_claim_of_ours() {
        // Released by a tenant's claim that has the very name our new claim has: the name is
        // the same, the namespace is not, and the tenant's blocks stay where they are.
        let volumes = [
            volume(
                "pv-same-name",
                "node-a",
                "Released",
                Some(("ml", "new-store")),
            ),
            volume("pv-other", "node-a", "Released", Some(("ml", "data"))),
            volume("pv-pending", "node-a", "Available", Some(("ml", "gone"))),
        ];
        let binds = plan(
            NS,
            &volumes,
            &[waiting("new-store", "node-a")],
            &existing(&["new-store"]),
        );
        assert!(binds.is_empty(), "{binds:?}");
    }

    #[test]
    fn a_claim_of_another_namespace_gets_no_store() {
        // Even a volume left by a claim of its own namespace, or one nobody used yet: the keeper
        // binds only node-service claims, which live in the operator's namespace.
        let tenant = WaitingClaim {
            namespace: "ml".into(),
            ..waiting("data-store", "node-a")
        };
        let volumes = [
            volume("pv-theirs", "node-a", "Released", Some(("ml", "gone"))),
            volume("pv-ours", "node-a", "Released", Some((NS, "gone"))),
            volume("pv-fresh", "node-a", "Available", None),
        ];
        let binds = plan(NS, &volumes, &[tenant], &existing(&[]));
        assert!(binds.is_empty(), "{binds:?}");
    }

    #[test]
    fn a_volume_labelled_for_one_node_serves_the_node_its_affinity_names() {
        // Labels anyone who may label volumes can set; the affinity is what the scheduler holds
        // the pod to, so only it says where the volume is.
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-mislabelled", "resourceVersion": "7", "labels": {
                "ferry.dev/node-store": "true",
                "kubernetes.io/hostname": "node-a",
                "ferry.dev/node": "node-a",
            }},
            "spec": {
                "capacity": {"storage": "4Gi"},
                "storageClassName": "local",
                "local": {"path": "/mnt/disks/ferry"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}
                ]}]}},
            },
            "status": {"phase": "Available"},
        }))
        .unwrap();
        let volumes = [store_volume(&pv)];
        let claims = existing(&["a-store", "b-store"]);
        let on_a = plan(NS, &volumes, &[waiting("a-store", "node-a")], &claims);
        assert!(
            on_a.is_empty(),
            "handed to the node its label names: {on_a:?}"
        );
        let on_b = plan(NS, &volumes, &[waiting("b-store", "node-b")], &claims);
        assert_eq!(
            on_b,
            [PreBind {
                volume: "pv-mislabelled".into(),
                claim: "b-store".into(),
                resource_version: Some("7".into()),
            }]
        );
    }

    #[test]
    fn a_claim_already_named_by_a_volume_waits_for_the_pv_controller() {
        let volumes = [
            volume("pv-a", "node-a", "Available", Some((NS, "new-store"))),
            volume("pv-a2", "node-a", "Available", None),
        ];
        let binds = plan(
            NS,
            &volumes,
            &[waiting("new-store", "node-a")],
            &existing(&["new-store"]),
        );
        assert!(binds.is_empty(), "{binds:?}");
    }

    #[test]
    fn a_volume_pre_bound_to_a_claim_that_went_is_free_again() {
        // The pod went before the PV controller bound its claim.
        let volumes = [volume(
            "pv-a",
            "node-a",
            "Available",
            Some((NS, "gone-store")),
        )];
        let binds = plan(
            NS,
            &volumes,
            &[waiting("new-store", "node-a")],
            &existing(&["new-store"]),
        );
        assert_eq!(binds.len(), 1);
        assert_eq!(binds[0].volume, "pv-a");
    }

    #[test]
    fn the_node_is_matched_by_name_or_by_hostname_label() {
        let by_name = StoreVolume {
            node: Some(VolumeNode::Name("node-a".into())),
            ..volume("by-name", "x", "Available", None)
        };
        let claim = WaitingClaim {
            hostname: Some("host-a".into()),
            ..waiting("c-store", "node-a")
        };
        assert!(by_name.is_on(&claim));
        assert!(volume("by-host", "host-a", "Available", None).is_on(&claim));
        assert!(!volume("other", "node-a", "Available", None).is_on(&claim));
    }

    fn with_affinity(required: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"nodeAffinity": {"required": required}},
        }))
        .unwrap()
    }

    #[test]
    fn the_volume_node_is_read_from_a_single_affinity_value() {
        let host = |op: &str, values: serde_json::Value| serde_json::json!({"key": "kubernetes.io/hostname", "operator": op, "values": values});
        let zone = serde_json::json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]});
        let name =
            serde_json::json!({"key": "metadata.name", "operator": "In", "values": ["node-d"]});
        let local = with_affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [host("In", serde_json::json!(["node-c"])), zone]}
        ]}));
        assert_eq!(
            volume_node(&local),
            Some(VolumeNode::Hostname("node-c".into()))
        );
        let by_name = with_affinity(serde_json::json!({"nodeSelectorTerms": [
            {"matchFields": [name.clone()]}
        ]}));
        assert_eq!(
            volume_node(&by_name),
            Some(VolumeNode::Name("node-d".into()))
        );
        let no_single_node = [
            // two nodes, or any node but one, or any node with the label
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("In", serde_json::json!(["a", "b"]))]}
            ]}),
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("NotIn", serde_json::json!(["a"]))]}
            ]}),
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("Exists", serde_json::json!(null))]}
            ]}),
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("In", serde_json::json!([""]))]}
            ]}),
            // either of two terms
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("In", serde_json::json!(["a"]))]},
                {"matchExpressions": [host("In", serde_json::json!(["b"]))]}
            ]}),
            // the node named twice, which of the two checks to trust is a guess
            serde_json::json!({"nodeSelectorTerms": [
                {"matchExpressions": [host("In", serde_json::json!(["a"]))], "matchFields": [name]}
            ]}),
            serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [
                host("In", serde_json::json!(["a"])),
                host("In", serde_json::json!(["b"]))
            ]}]}),
            // only a zone
            serde_json::json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
            ]}]}),
        ];
        for required in no_single_node {
            assert_eq!(
                volume_node(&with_affinity(required.clone())),
                None,
                "{required}"
            );
        }
        let unpinned: PersistentVolume =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv"}, "spec": {}}))
                .unwrap();
        assert_eq!(volume_node(&unpinned), None);
    }

    #[test]
    fn a_daemonset_pod_names_its_node_and_its_ephemeral_claims() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ferry-node-x7k2p"},
            "spec": {
                "containers": [],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["node-d"]}
                    ]}]}}},
                "volumes": [
                    {"name": "store", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "tls", "secret": {"secretName": "ferry-node-tls"}}
                ]
            }
        }))
        .unwrap();
        assert_eq!(pod_node(&pod).as_deref(), Some("node-d"));
        assert_eq!(ephemeral_claims(&pod), ["ferry-node-x7k2p-store"]);
    }
}
