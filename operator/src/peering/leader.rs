//! Only the leader serves the cross-cluster API (it holds what source halves reported), so only
//! the leader's pod carries the label the chart's peering Service selects. A replica clears it
//! from its own pod when it starts (an earlier container of the same pod may have led) and sets
//! it once it leads.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};

/// The label the peering Service selects.
pub const LABEL: &str = "ferry.dev/peering-leader";

/// Sets or clears the label on this replica's own pod (`POD_NAME` in `namespace`). Outside a
/// pod (tests, a process on a host) there is nothing to label.
pub async fn mark_own_pod(client: &kube::Client, namespace: &str, leading: bool) {
    if let Ok(pod) = std::env::var("POD_NAME") {
        mark_pod(client, namespace, &pod, leading).await;
    }
}

/// Sets or clears the label on pod `namespace/pod`; a pod that does not exist is no error.
pub async fn mark_pod(client: &kube::Client, namespace: &str, pod: &str, leading: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let value = if leading {
        serde_json::Value::from("true")
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"labels": {LABEL: value}}});
    match api
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => tracing::info!(%pod, leading, "peering-leader label updated"),
        // Not a pod of this namespace (an operator run as a process): nothing to do.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => tracing::warn!(%pod, "could not update the peering-leader label: {e}"),
    }
}
