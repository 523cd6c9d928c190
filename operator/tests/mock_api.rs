//! Reconcile against a fake apiserver (an in-process HTTP service): which requests one reconcile
//! makes for a Transfer in a given state. In addition to the end-to-end tests on the real local
//! cluster, these pin the apply/status/events traffic without a cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ferry_operator::api::Transfer;
use ferry_operator::config::{Config, HostRootGrant};
use ferry_operator::metrics::Metrics;
use ferry_operator::pki::Authority;
use ferry_operator::progress::Watchers;
use ferry_operator::reconcile::{Context, reconcile};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

/// One request the operator made.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn transfer(finalized: bool) -> Value {
    json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {
            "name": "t", "namespace": "ml", "uid": UID, "generation": 1, "resourceVersion": "7",
            "finalizers": if finalized { json!(["ferry.dev/cleanup"]) } else { json!([]) },
        },
        "spec": {
            "source": {"hostPath": {"node": "node-a", "path": "/data/src"}},
            "destination": {"hostPath": {"node": "node-b", "path": "/data/dst"}},
        }
    })
}

fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// What the fake apiserver holds besides its fixed nodes and namespace.
#[derive(Clone, Default)]
struct Held {
    /// The Transfer `ml/t` as a read returns it now (None: not found).
    transfer: Option<Value>,
    /// Status patches fail with 409 Conflict, as when the Transfer changed after it was read.
    status_conflict: bool,
}

fn conflict() -> (StatusCode, Value) {
    (
        StatusCode::CONFLICT,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
    )
}

/// The fake apiserver's answers: the objects this test's cluster holds.
fn route(method: &str, path: &str, body: &Value, held: &Held) -> (StatusCode, Value) {
    let list = |kind: &str| json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": []});
    match (method, path) {
        ("GET", "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t") => match &held.transfer {
            Some(t) => (StatusCode::OK, t.clone()),
            None => not_found(),
        },
        ("PATCH", "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t/status")
            if held.status_conflict =>
        {
            conflict()
        }
        ("GET", "/api/v1/namespaces/ml/pods") => (StatusCode::OK, list("PodList")),
        ("GET", p) if p.starts_with("/api/v1/namespaces/ml/secrets/") => not_found(),
        ("GET", "/api/v1/nodes/node-a" | "/api/v1/nodes/node-b") => {
            let name = path.rsplit('/').next().unwrap();
            (
                StatusCode::OK,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
            )
        }
        ("GET", "/api/v1/namespaces/ml") => (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
        ),
        // Patches and creates echo the object back, as the apiserver returns what it stored.
        ("PATCH" | "POST", _) => {
            let mut obj = body.clone();
            if path.contains("/transfers/") {
                obj = transfer(true);
            }
            (StatusCode::OK, obj)
        }
        _ => not_found(),
    }
}

fn fake_client(log: Log, held: Held) -> kube::Client {
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let log = log.clone();
        let held = held.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_owned());
            let (status, answer) = route(&method, &path, &body, &held);
            log.lock().unwrap().push(Seen {
                method,
                path,
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body,
            });
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(answer.to_string())))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

fn context(client: kube::Client, config: Config) -> Arc<Context> {
    let (wake, _) = tokio::sync::mpsc::channel(8);
    let authority = Arc::new(Authority::ephemeral("test").unwrap());
    // The node service's pods: ready on node-a and node-b.
    let service_pod = |node: &str, ip: &str| {
        serde_json::from_value(json!({
            "metadata": {"name": format!("ferry-node-{node}"), "namespace": "ferry-system"},
            "spec": {"nodeName": node, "containers": []},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    };
    let caches = ferry_operator::cache::preloaded_with(
        &["node-a", "node-b"],
        &["ml"],
        Vec::new(),
        vec![
            service_pod("node-b", "10.0.0.2"),
            service_pod("node-a", "10.0.0.1"),
        ],
    );
    let limiter = Arc::new(ferry_operator::status::PatchLimiter::default());
    Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "ferry-operator".into(),
                instance: None,
            },
        ),
        client,
        config,
        peer_client: ferry_operator::peering::client::PeerClient::new(authority.clone()),
        authority,
        peers: caches.peers.clone(),
        registry: Default::default(),
        watchers: Watchers::new(wake.clone(), 10, limiter.clone()),
        metrics: Arc::new(Metrics::default()),
        store: caches.transfers.clone(),
        limiter,
        caches,
        secrets: Default::default(),
        own_writes: Default::default(),
        acting_since: k8s_openapi::jiff::Timestamp::now(),
        failing: Default::default(),
    })
}

fn granted() -> Config {
    Config {
        host_roots: vec![HostRootGrant::parse("ml=/data").unwrap()],
        ..Config::default()
    }
}

/// One reconcile of a Transfer the apiserver holds as it is in the controller's cache.
async fn run(t: Value, config: Config) -> Vec<Seen> {
    let held = Held {
        transfer: Some(t.clone()),
        ..Held::default()
    };
    run_against(t, held, config).await
}

/// One reconcile of `cached` (the controller's copy) against an apiserver holding `held`.
async fn run_against(cached: Value, held: Held, config: Config) -> Vec<Seen> {
    let log: Log = Arc::default();
    let ctx = context(fake_client(log.clone(), held), config);
    let t: Transfer = serde_json::from_value(cached).unwrap();
    reconcile(Arc::new(t), ctx).await.unwrap();
    log.lock().unwrap().clone()
}

/// `transfer(true)` at resourceVersion `rv` with `status` (and `spec` merged in).
fn transfer_at(rv: &str, spec: Value, status: Value) -> Value {
    let mut t = transfer(true);
    t["metadata"]["resourceVersion"] = json!(rv);
    for (k, v) in spec.as_object().unwrap() {
        t["spec"][k] = v.clone();
    }
    t["status"] = status;
    t
}

fn status_patches(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter()
        .filter(|s| s.method == "PATCH" && s.path.ends_with("/transfers/t/status"))
        .collect()
}

fn writes(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.method != "GET").collect()
}

#[tokio::test]
async fn a_new_transfer_first_gets_the_finalizer_and_nothing_else() {
    let seen = run(transfer(false), granted()).await;
    let w = writes(&seen);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(
        w[0].path,
        "/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t"
    );
    assert_eq!(
        w[0].body["metadata"]["finalizers"],
        json!(["ferry.dev/cleanup"])
    );
    assert_eq!(w[0].body["metadata"]["resourceVersion"], "7");
}

#[tokio::test]
async fn a_host_path_outside_the_grants_gets_a_reason_in_status_and_no_pods() {
    let seen = run(transfer(true), Config::default()).await;
    let w = writes(&seen);
    assert!(
        !w.iter()
            .any(|s| s.path.contains("/pods") || s.path.contains("/secrets")),
        "{w:#?}"
    );
    let status = w
        .iter()
        .find(|s| s.path.ends_with("/transfers/t/status"))
        .expect("a status patch");
    assert!(
        status.query.contains("fieldManager=ferry-operator"),
        "{}",
        status.query
    );
    let ready = status.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "HostPathNotAllowed");
    assert!(
        seen.iter()
            .any(|s| s.method == "POST" && s.path.contains("/events")),
        "an Event is recorded: {seen:#?}"
    );
}

#[tokio::test]
async fn an_admitted_transfer_applies_its_secret_then_its_receiver() {
    let seen = run(transfer(true), granted()).await;
    let w = writes(&seen);
    let secret = w
        .iter()
        .position(|s| s.path.starts_with("/api/v1/namespaces/ml/secrets/"))
        .expect("secret applied");
    let pod = w
        .iter()
        .position(|s| s.path.starts_with("/api/v1/namespaces/ml/pods/"))
        .expect("receiver applied");
    assert!(secret < pod, "certificates before the pod that mounts them");
    let pod = w[pod];
    assert!(pod.path.ends_with("-1-1-recv"), "{}", pod.path);
    assert!(pod.query.contains("fieldManager=ferry-operator") && pod.query.contains("force=true"));
    assert_eq!(
        pod.body["spec"]["nodeSelector"]["kubernetes.io/hostname"],
        "node-b"
    );
    assert_eq!(pod.body["metadata"]["ownerReferences"][0]["uid"], UID);
    let secret_body = &w[secret].body;
    let keys: Vec<&str> = secret_body["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "ca.crt",
            "receiver.crt",
            "receiver.key",
            "sender.crt",
            "sender.key"
        ]
    );
    assert!(
        !w.iter().any(|s| s.path.ends_with("-send")),
        "no sender before the receiver is ready"
    );
}

#[tokio::test]
async fn the_leader_labels_its_pod_for_the_peering_service_and_a_new_replica_clears_it() {
    use ferry_operator::peering::leader::{LABEL, mark_pod};
    let log: Log = Arc::default();
    let client = fake_client(log.clone(), Held::default());
    mark_pod(&client, "ferry-system", "ferry-operator-0", true).await;
    mark_pod(&client, "ferry-system", "ferry-operator-0", false).await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.method, "PATCH");
        assert_eq!(
            s.path,
            "/api/v1/namespaces/ferry-system/pods/ferry-operator-0"
        );
    }
    assert_eq!(seen[0].body["metadata"]["labels"][LABEL], "true");
    assert!(seen[1].body["metadata"]["labels"][LABEL].is_null());
    assert!(
        seen[1].body["metadata"]["labels"].get(LABEL).is_some(),
        "null removes the label"
    );
}

/// The status of attempt 1 after its receiver was found failed for good (or, `running`, while
/// it still ran), its pods named as the operator names them.
fn attempt_one(phase: &str, failures: u32) -> Value {
    use ferry_operator::names::{MoverRole, pod_name};
    json!({
        "phase": phase, "run": 1, "attempts": 1, "failures": failures,
        "startTime": "2026-11-26T01:57:12Z",
        "receiver": {"pod": pod_name(UID, 1, 1, MoverRole::Receiver), "node": "node-b"},
        "sender": {"pod": pod_name(UID, 1, 1, MoverRole::Sender), "node": "node-a"},
    })
}

#[tokio::test]
async fn a_cache_behind_this_operators_own_write_plans_nothing() {
    // The operator wrote attempt 1's failure over version 7; the cache still shows version 7
    // (attempt 1 running) and the pods are gone. Planning from it would call them lost and
    // retry a second time.
    let cached = transfer_at("7", json!({}), attempt_one("Running", 0));
    let log: Log = Arc::default();
    let ctx = context(fake_client(log.clone(), Held::default()), granted());
    ctx.own_writes.wrote(UID, Some("7".into()));
    let t: Transfer = serde_json::from_value(cached).unwrap();
    let requeue = reconcile(Arc::new(t.clone()), ctx.clone()).await.unwrap();
    assert!(log.lock().unwrap().is_empty(), "{:#?}", log.lock().unwrap());
    assert_ne!(requeue, kube::runtime::controller::Action::await_change());
    // Once the cache moved on, the Transfer is planned again.
    let mut newer = t;
    newer.metadata.resource_version = Some("9".into());
    reconcile(Arc::new(newer), ctx).await.unwrap();
    assert!(!log.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_status_is_written_on_the_version_it_was_planned_from() {
    let cached = transfer_at("9", json!({"suspend": true}), json!(null));
    let seen = run_against(cached, Held::default(), granted()).await;
    let patches = status_patches(&seen);
    let last = patches.last().expect("a status patch");
    assert_eq!(last.body["status"]["phase"], "Suspended", "{last:#?}");
    assert_eq!(last.body["metadata"]["resourceVersion"], "9");
    assert!(
        !writes(&seen).iter().any(|s| s.path.contains("/pods/")),
        "a suspended Transfer gets no movers"
    );
}

#[tokio::test]
async fn a_status_that_conflicts_is_not_announced_and_is_planned_again() {
    let t = transfer(true);
    let held = Held {
        transfer: Some(t.clone()),
        status_conflict: true,
    };
    let log: Log = Arc::default();
    let ctx = context(fake_client(log.clone(), held), granted());
    let requeue = reconcile(Arc::new(serde_json::from_value(t).unwrap()), ctx)
        .await
        .unwrap();
    assert_eq!(
        requeue,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(2))
    );
    let seen = log.lock().unwrap().clone();
    assert_eq!(status_patches(&seen).len(), 1, "{seen:#?}");
    assert!(
        !seen.iter().any(|s| s.path.contains("/events")),
        "no Event for a status that did not land: {seen:#?}"
    );
}

#[tokio::test]
async fn reconcile_reads_nothing_but_a_new_transfers_secrets_from_the_api_server() {
    let log: Log = Arc::default();
    let ctx = context(fake_client(log.clone(), Held::default()), granted());
    let t: Transfer = serde_json::from_value(transfer(true)).unwrap();
    reconcile(Arc::new(t.clone()), ctx.clone()).await.unwrap();
    let reads = |log: &Log| -> Vec<String> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|s| s.method == "GET")
            .map(|s| s.path.clone())
            .collect()
    };
    let first = reads(&log);
    assert!(
        !first.is_empty() && first.iter().all(|p| p.contains("/secrets/")),
        "only the Secrets' names are looked up: {first:?}"
    );
    log.lock().unwrap().clear();
    let mut again = t;
    again.metadata.resource_version = Some("8".into());
    reconcile(Arc::new(again), ctx).await.unwrap();
    assert_eq!(
        reads(&log),
        Vec::<String>::new(),
        "the second reconcile reads nothing"
    );
}

/// A fan-out of `t`'s tree to node-a and node-b.
fn fan_out() -> Value {
    let mut t = transfer(true);
    t["spec"]["destination"] =
        json!({"hostPath": {"nodes": ["node-a", "node-b"], "path": "/data/dst"}});
    t
}

#[tokio::test]
async fn a_fan_out_applies_one_child_transfer_per_node_and_no_pods() {
    let seen = run(fan_out(), granted()).await;
    let w = writes(&seen);
    assert!(
        !w.iter()
            .any(|s| s.path.contains("/pods") || s.path.contains("/secrets")),
        "{w:#?}"
    );
    for (node, i) in [("node-a", 0), ("node-b", 1)] {
        let child = w
            .iter()
            .find(|s| {
                s.path == format!("/apis/ferry.dev/v1alpha1/namespaces/ml/transfers/t-{node}")
            })
            .unwrap_or_else(|| panic!("child for {node}: {w:#?}"));
        let b = &child.body;
        assert_eq!(b["spec"]["destination"]["hostPath"]["node"], node);
        assert_eq!(b["spec"]["destination"]["hostPath"].get("nodes"), None);
        assert_eq!(b["spec"]["trigger"], "fan-out-run-1");
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], UID);
        assert_eq!(b["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(b["metadata"]["labels"]["ferry.dev/fan-out-of"], UID);
        assert_eq!(
            b["metadata"]["annotations"]["ferry.dev/fan-out-nodes"],
            "node-a,node-b"
        );
        let status = status_patches(&seen)[0];
        assert_eq!(status.body["status"]["destinations"][i]["node"], node);
        assert_eq!(
            status.body["status"]["destinations"][i]["transfer"],
            format!("t-{node}")
        );
    }
}

#[tokio::test]
async fn a_fan_out_childs_first_receiver_joins_its_siblings_node_services() {
    let mut child = transfer(true);
    child["metadata"]["labels"] = json!({"ferry.dev/fan-out-of": "parent-uid"});
    child["metadata"]["annotations"] = json!({"ferry.dev/fan-out-nodes": "node-a,node-b,node-c"});
    let seen = run(child, granted()).await;
    let pod = writes(&seen)
        .into_iter()
        .find(|s| s.path.ends_with("-1-1-recv"))
        .expect("receiver applied")
        .clone();
    let args: Vec<String> =
        serde_json::from_value(pod.body["spec"]["containers"][0]["args"].clone()).unwrap();
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag} in {args:?}"));
        args[i + 1].clone()
    };
    // node-c has no node service running: it stays in the list (every sibling shares the
    // order) and owns nothing.
    assert_eq!(after("--swarm-peers"), "10.0.0.1:7443,10.0.0.2:7443,");
    assert_eq!(
        after("--swarm-self"),
        "1",
        "the receiver's node, node-b, is second"
    );
    assert_eq!(after("--block-service"), "ferry-node.ferry-system.svc:7443");
    assert!(
        !seen
            .iter()
            .any(|r| r.path.contains("/namespaces/ferry-system/pods")),
        "the siblings come from the cache, not a list per receiver"
    );
}
