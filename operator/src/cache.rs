//! What reconcile observes, kept current by watches instead of read per reconcile: the
//! Transfers, ferry's own mover pods and receiver Services (by ferry's label only), Nodes,
//! Namespaces and claims (metadata), the kubelet's FailedMount Events, which node uses each
//! claim (an index of running pods that mount claims, not a copy of every pod), and where each
//! node's block service answers (the chart's node-service pods, in the operator's namespace).
//!
//! Every watch restarts with backoff, and a store keeps its last complete list while a watch
//! relists (kube's reflector swaps in a relist only once it is whole). The controller starts
//! only after every store has synced once, so an empty cache never plans a deletion.
//!
//! Secrets are not watched: listing or watching Secrets would let the operator read every
//! Secret of the cluster. What exists is tracked by [`SecretBook`] instead: looked up by name
//! once per Transfer after a start, then kept by the operator's own creates and deletes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Event as CoreEvent, Namespace, Node, NodeSpec, NodeStatus, PersistentVolumeClaim, Pod, PodSpec,
    PodStatus, Service,
};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::api::{Peer, Transfer};
use crate::names::{LABEL_MANAGED_BY, MANAGER, NODE_SERVICE_COMPONENT};

/// Every store reconcile reads.
#[derive(Clone)]
pub struct Caches {
    pub transfers: Store<Transfer>,
    /// ferry's mover and cleanup pods, every namespace.
    pub pods: Store<Pod>,
    /// ferry's receiver Services (cross-cluster destination halves).
    pub services: Store<Service>,
    /// Nodes, kept to their name and addresses.
    pub nodes: Store<Node>,
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    pub claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    /// The kubelet's FailedMount Events (the only place a mount failure is said).
    pub mount_failures: Store<CoreEvent>,
    pub peers: Store<Peer>,
    pub claim_users: Arc<ClaimUsers>,
    /// The chart's node-service pods, kept to their node, IP, readiness and deletion mark.
    pub node_services: Store<Pod>,
}

/// The streams that wake the controller (Transfers, and ferry's pods as their children).
pub struct Triggers<T, P> {
    pub transfers: T,
    pub pods: P,
}

fn ours() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGER}")
}

/// Server-side apply bookkeeping is the bulk of most objects and is never read here.
fn strip_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// Starts every watch; the returned triggers must be polled (by the controller) for the
/// Transfer and pod stores to fill.
#[allow(clippy::type_complexity)]
pub fn start(
    client: &Client,
    operator_namespace: &str,
) -> (
    Caches,
    Triggers<
        impl Stream<Item = Result<Transfer, watcher::Error>> + Send + 'static,
        impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static,
    >,
) {
    let (transfers, writer) = reflector::store();
    let transfer_stream = watcher(
        Api::<Transfer>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(strip_managed_fields)
    .reflect(writer)
    .touched_objects();
    let (pods, writer) = reflector::store();
    let pod_stream = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(&ours()),
    )
    .default_backoff()
    .modify(strip_managed_fields)
    .reflect(writer)
    .touched_objects();
    let caches = Caches {
        transfers,
        pods,
        services: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default().labels(&ours()),
            strip_managed_fields,
        ),
        nodes: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default(),
            |n: &mut Node| {
                // Images, conditions and capacity change often and are big; only the
                // addresses (the NodePort of a cross-cluster receiver), the labels and
                // whether it is cordoned (a fan-out's nodeSelector) are read.
                let addresses = n.status.as_ref().and_then(|s| s.addresses.clone());
                let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable);
                *n = Node {
                    metadata: kube::api::ObjectMeta {
                        name: n.metadata.name.take(),
                        resource_version: n.metadata.resource_version.take(),
                        uid: n.metadata.uid.take(),
                        labels: n.metadata.labels.take(),
                        ..Default::default()
                    },
                    spec: unschedulable.map(|u| NodeSpec {
                        unschedulable: Some(u),
                        ..NodeSpec::default()
                    }),
                    status: Some(NodeStatus {
                        addresses,
                        ..NodeStatus::default()
                    }),
                };
            },
        ),
        // Only metadata is read of these (a metadata-only watch).
        namespaces: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default(),
            strip_managed_fields,
        ),
        claims: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default(),
            strip_managed_fields,
        ),
        mount_failures: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default().fields("reason=FailedMount"),
            strip_managed_fields,
        ),
        peers: spawn_reflector(
            Api::all(client.clone()),
            watcher::Config::default(),
            strip_managed_fields,
        ),
        claim_users: ClaimUsers::spawn(client.clone()),
        node_services: spawn_reflector(
            Api::namespaced(client.clone(), operator_namespace),
            watcher::Config::default().labels(NODE_SERVICE_COMPONENT),
            keep_node_service_fields,
        ),
    };
    (
        caches,
        Triggers {
            transfers: transfer_stream,
            pods: pod_stream,
        },
    )
}

impl Caches {
    /// Waits until every store has listed once (the Transfer and pod stores fill only while
    /// the controller polls their triggers).
    pub async fn synced(&self) {
        let _ = self.services.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
        let _ = self.claims.wait_until_ready().await;
        let _ = self.mount_failures.wait_until_ready().await;
        let _ = self.peers.wait_until_ready().await;
        let _ = self.node_services.wait_until_ready().await;
        self.claim_users.ready().await;
    }

    /// Whether the pod store has listed once (it fills only while the controller polls its
    /// trigger).
    pub fn pods_synced(&self) -> bool {
        futures::FutureExt::now_or_never(self.pods.wait_until_ready()).is_some()
    }

    /// ferry's pods of one Transfer.
    pub fn pods_of(&self, namespace: &str, uid: &str) -> Vec<Arc<Pod>> {
        self.pods.state_filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.labels()
                    .get(crate::names::LABEL_TRANSFER_UID)
                    .map(String::as_str)
                    == Some(uid)
        })
    }

    /// Each node's block service pod IP, for the services that are ready and not being deleted.
    pub fn node_service_ips(&self) -> HashMap<String, String> {
        self.node_services
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                let node = p.spec.as_ref()?.node_name.clone()?;
                let st = p.status.as_ref()?;
                let ready = st
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Some((node, st.pod_ip.clone().filter(|_| ready)?))
            })
            .collect()
    }

    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    pub fn namespace_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let ns = self.namespaces.get(&ObjectRef::new(name))?;
        Some(ns.metadata.labels.clone().unwrap_or_default())
    }

    pub fn claim_exists(&self, namespace: &str, name: &str) -> bool {
        self.claims
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    /// The kubelet's latest FailedMount message for `pod`.
    pub fn mount_failure(&self, namespace: &str, pod: &str) -> Option<String> {
        self.mount_failures
            .state_filter(|e| {
                e.involved_object.namespace.as_deref() == Some(namespace)
                    && e.involved_object.name.as_deref() == Some(pod)
            })
            .into_iter()
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0))
            .map(|e| e.message.clone().unwrap_or_default())
    }
}

/// Synced caches holding only `nodes`, `namespaces` and `transfers`, with no watch behind them
/// (reconcile tests against a fake apiserver).
#[doc(hidden)]
pub fn preloaded(nodes: &[&str], namespaces: &[&str], transfers: Vec<Transfer>) -> Caches {
    preloaded_with(nodes, namespaces, transfers, Vec::new())
}

/// [`preloaded`], with the node-service pods given.
#[doc(hidden)]
pub fn preloaded_with(
    nodes: &[&str],
    namespaces: &[&str],
    transfers: Vec<Transfer>,
    node_services: Vec<Pod>,
) -> Caches {
    fn filled<K>(objects: Vec<K>) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        store
    }
    let named = |name: &str| kube::api::ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    let claim_users = Arc::new(ClaimUsers::default());
    claim_users.apply(watcher::Event::Init);
    claim_users.apply(watcher::Event::InitDone);
    Caches {
        transfers: filled(transfers),
        pods: filled(Vec::new()),
        services: filled(Vec::new()),
        nodes: filled(
            nodes
                .iter()
                .map(|n| Node {
                    metadata: named(n),
                    ..Node::default()
                })
                .collect(),
        ),
        namespaces: filled(
            namespaces
                .iter()
                .map(|n| PartialObjectMeta {
                    types: None,
                    metadata: named(n),
                    _phantom: Default::default(),
                })
                .collect(),
        ),
        claims: filled(Vec::new()),
        mount_failures: filled(Vec::new()),
        peers: filled(Vec::new()),
        claim_users,
        node_services: filled(node_services),
    }
}

/// A node-service pod as the cache keeps it: which node, its IP, whether it is ready and
/// whether it is going away (a DaemonSet's pods are few but their specs and statuses are big).
pub(crate) fn keep_node_service_fields(p: &mut Pod) {
    let node_name = p.spec.as_ref().and_then(|s| s.node_name.clone());
    let status = p.status.take().map(|st| PodStatus {
        pod_ip: st.pod_ip,
        conditions: st.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "Ready")
                .collect::<Vec<_>>()
        }),
        ..PodStatus::default()
    });
    *p = Pod {
        metadata: kube::api::ObjectMeta {
            name: p.metadata.name.take(),
            namespace: p.metadata.namespace.take(),
            resource_version: p.metadata.resource_version.take(),
            uid: p.metadata.uid.take(),
            deletion_timestamp: p.metadata.deletion_timestamp.take(),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name,
            ..PodSpec::default()
        }),
        status,
    };
}

/// A reflector kept current by a background task (watch errors are logged and retried with
/// backoff).
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    modify: impl FnMut(&mut K) + Send + 'static,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(modify)
        .reflect(writer)
        .touched_objects();
    drive(stream, K::kind(&()).into_owned());
    store
}

fn drive<T: Send + 'static>(
    stream: impl Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    kind: String,
) {
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(r) = stream.next().await {
            if let Err(e) = r {
                tracing::warn!(%kind, "watch: {e}");
            }
        }
    });
}

/// Which node runs a pod (not one of ferry's) that mounts a claim: the node a
/// ReadWriteOnce claim is attached to, where ferry's mover must go too. Fed by a watch of
/// running pods; only pods that mount a claim are kept, as (claims, node).
#[derive(Default)]
pub struct ClaimUsers {
    index: RwLock<ClaimIndex>,
    ready: tokio::sync::Notify,
    synced: std::sync::atomic::AtomicBool,
}

/// (namespace, pod) -> (the claims it mounts, its node)
type ClaimUses = HashMap<(String, String), (BTreeSet<String>, String)>;

#[derive(Default)]
struct ClaimIndex {
    pods: ClaimUses,
    /// Filled during a relist, swapped in when it is complete.
    relisting: Option<ClaimUses>,
}

/// The claims a running pod mounts and its node, unless it is one of ferry's or mounts none.
#[allow(clippy::type_complexity)]
fn claim_use(p: &Pod) -> Option<((String, String), (BTreeSet<String>, String))> {
    if p.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGER) {
        return None;
    }
    let spec = p.spec.as_ref()?;
    let claims: BTreeSet<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    if claims.is_empty() {
        return None;
    }
    let node = spec.node_name.clone()?;
    Some(((p.namespace()?, p.name_any()), (claims, node)))
}

impl ClaimUsers {
    fn spawn(client: Client) -> Arc<ClaimUsers> {
        let users = Arc::new(ClaimUsers::default());
        let me = users.clone();
        // A pod that stops running leaves the selector, which the watch reports as a deletion.
        let api: Api<Pod> = Api::all(client);
        let stream = watcher(
            api,
            watcher::Config::default().fields("status.phase=Running"),
        )
        .default_backoff();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => me.apply(ev),
                    Err(e) => tracing::warn!("watch of running pods: {e}"),
                }
            }
        });
        users
    }

    fn apply(&self, ev: watcher::Event<Pod>) {
        let mut ix = self.index.write().unwrap_or_else(|p| p.into_inner());
        match ev {
            watcher::Event::Init => ix.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(p) => {
                if let (Some(list), Some((k, v))) = (ix.relisting.as_mut(), claim_use(&p)) {
                    list.insert(k, v);
                }
            }
            watcher::Event::InitDone => {
                if let Some(list) = ix.relisting.take() {
                    ix.pods = list;
                }
                self.synced
                    .store(true, std::sync::atomic::Ordering::Release);
                self.ready.notify_waiters();
            }
            watcher::Event::Apply(p) => match claim_use(&p) {
                Some((k, v)) => {
                    ix.pods.insert(k, v);
                }
                None => {
                    ix.pods
                        .remove(&(p.namespace().unwrap_or_default(), p.name_any()));
                }
            },
            watcher::Event::Delete(p) => {
                ix.pods
                    .remove(&(p.namespace().unwrap_or_default(), p.name_any()));
            }
        }
    }

    async fn ready(&self) {
        loop {
            let notified = self.ready.notified();
            if self.synced.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// The node of a running pod (not ferry's) that mounts `claim` in `namespace`.
    pub fn node_of(&self, namespace: &str, claim: &str) -> Option<String> {
        let ix = self.index.read().unwrap_or_else(|p| p.into_inner());
        ix.pods
            .iter()
            .filter(|((ns, _), (claims, _))| ns == namespace && claims.contains(claim))
            .map(|(_, (_, node))| node.clone())
            .min()
    }

    /// How many pods that mount claims are known (metrics and tests).
    pub fn len(&self) -> usize {
        self.index.read().map(|ix| ix.pods.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The per-attempt Secrets known to exist, per Transfer UID.
#[derive(Default)]
pub struct SecretBook {
    known: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl SecretBook {
    /// The Secrets of `uid` among `candidates`, looking up by name only the first time this
    /// operator sees the Transfer.
    pub async fn existing(
        &self,
        api: &Api<k8s_openapi::api::core::v1::Secret>,
        uid: &str,
        candidates: &[String],
    ) -> Result<Vec<String>, kube::Error> {
        let known = self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned();
        let known = match known {
            Some(k) => k,
            None => {
                let mut found = BTreeSet::new();
                for name in candidates {
                    if api.get_metadata_opt(name).await?.is_some() {
                        found.insert(name.clone());
                    }
                }
                self.known
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uid.to_owned(), found.clone());
                found
            }
        };
        Ok(known.into_iter().collect())
    }

    pub fn created(&self, uid: &str, name: &str) {
        let mut m = self.known.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(uid.to_owned()).or_default().insert(name.to_owned());
    }

    pub fn deleted(&self, uid: &str, name: &str) {
        let mut m = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get_mut(uid) {
            s.remove(name);
        }
    }

    pub fn forget(&self, uid: &str) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }
}

/// The resourceVersion each of this operator's own writes to a Transfer replaced. The
/// controller's cache can lag behind such a write for a moment (its watch event not arrived
/// when, say, the deletion of the pods that write retired wakes the next reconcile); a plan
/// from that older version would take its decision a second time. A cached Transfer still at
/// the replaced version is therefore not planned from: the write's own watch event wakes the
/// reconcile that sees it.
#[derive(Default)]
pub struct OwnWrites {
    replaced: Mutex<HashMap<String, String>>,
}

impl OwnWrites {
    pub fn wrote(&self, uid: &str, replaced_version: Option<String>) {
        if let Some(v) = replaced_version {
            let mut m = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
            m.insert(uid.to_owned(), v);
        }
    }

    /// Whether `t` (from the cache) predates a write of this operator.
    pub fn is_stale(&self, t: &Transfer) -> bool {
        let Some(uid) = t.metadata.uid.as_deref() else {
            return false;
        };
        let mut m = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(uid) {
            Some(v) if t.metadata.resource_version.as_deref() == Some(v.as_str()) => true,
            // The cache moved past the write: nothing to remember.
            Some(_) => {
                m.remove(uid);
                false
            }
            None => false,
        }
    }

    pub fn forget(&self, uid: &str) {
        self.replaced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume};

    fn pod(ns: &str, name: &str, node: &str, claims: &[&str], ours: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        if ours {
            p.metadata.labels = Some([(LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned())].into());
        }
        p.spec = Some(PodSpec {
            node_name: Some(node.into()),
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: c.to_string(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: c.to_string(),
                            read_only: None,
                        }),
                        ..Volume::default()
                    })
                    .collect(),
            ),
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn claim_users_index_follows_the_watch_and_ignores_ferrys_pods() {
        let u = ClaimUsers::default();
        u.apply(watcher::Event::Init);
        u.apply(watcher::Event::InitApply(pod(
            "a",
            "web",
            "n1",
            &["data"],
            false,
        )));
        u.apply(watcher::Event::InitApply(pod(
            "a",
            "mover",
            "n2",
            &["data"],
            true,
        )));
        u.apply(watcher::Event::InitApply(pod(
            "a",
            "plain",
            "n3",
            &[],
            false,
        )));
        assert_eq!(
            u.node_of("a", "data"),
            None,
            "not visible before the list is whole"
        );
        u.apply(watcher::Event::InitDone);
        assert_eq!(u.node_of("a", "data").as_deref(), Some("n1"));
        assert_eq!(u.node_of("b", "data"), None, "another namespace's claim");
        assert_eq!(u.len(), 1, "only pods that mount claims, not ferry's");
        u.apply(watcher::Event::Delete(pod(
            "a",
            "web",
            "n1",
            &["data"],
            false,
        )));
        assert_eq!(u.node_of("a", "data"), None);
        u.apply(watcher::Event::Apply(pod(
            "a",
            "web2",
            "n4",
            &["data", "x"],
            false,
        )));
        assert_eq!(u.node_of("a", "x").as_deref(), Some("n4"));
        // A relist replaces everything at once.
        u.apply(watcher::Event::Init);
        u.apply(watcher::Event::InitDone);
        assert!(u.is_empty());
    }

    #[test]
    fn a_cached_transfer_at_a_version_this_operator_replaced_is_stale() {
        let w = OwnWrites::default();
        let mut t: Transfer = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "t", "uid": "u"},
            "spec": {
                "source": {"hostPath": {"node": "a", "path": "/data/src"}},
                "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
            },
        }))
        .expect("transfer");
        t.metadata.resource_version = Some("10".into());
        assert!(!w.is_stale(&t));
        w.wrote("u", Some("10".into()));
        assert!(w.is_stale(&t), "the cache has not seen the write yet");
        t.metadata.resource_version = Some("11".into());
        assert!(!w.is_stale(&t));
        t.metadata.resource_version = Some("10".into());
        assert!(!w.is_stale(&t), "forgotten once the cache moved past it");
    }
}
