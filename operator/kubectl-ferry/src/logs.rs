//! `kubectl ferry logs`: which pods to read, and what to say when the cluster cannot serve
//! their logs.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use ferry_api::names::{LABEL_ATTEMPT, LABEL_ROLE, MoverRole};

/// The mover pods of the newest attempt among `pods`, with `role` only when given, senders
/// first. Pods of other roles (the cleanup pod) are left out.
pub fn pods_to_read(pods: &[Pod], role: Option<MoverRole>) -> Vec<&Pod> {
    let roles: &[MoverRole] = match role {
        Some(MoverRole::Sender) => &[MoverRole::Sender],
        Some(MoverRole::Receiver) => &[MoverRole::Receiver],
        None => &[MoverRole::Sender, MoverRole::Receiver],
    };
    let movers: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.labels()
                .get(LABEL_ROLE)
                .is_some_and(|r| roles.iter().any(|m| m.as_str() == r))
        })
        .collect();
    let newest = movers.iter().filter_map(|p| attempt(p)).max();
    let mut chosen: Vec<&Pod> = movers
        .into_iter()
        .filter(|p| newest.is_none() || attempt(p) == newest)
        .collect();
    chosen.sort_by_key(|p| {
        let sender = p.labels().get(LABEL_ROLE).map(String::as_str) == Some("sender");
        (!sender, p.name_any())
    });
    chosen
}

/// (run, attempt) from the `ferry.dev/attempt` label ("1-2").
fn attempt(p: &Pod) -> Option<(u32, u32)> {
    let (run, attempt) = p.labels().get(LABEL_ATTEMPT)?.split_once('-')?;
    Some((run.parse().ok()?, attempt.parse().ok()?))
}

/// "ferry-...-send (sender on node-a)".
pub fn pod_title(p: &Pod) -> String {
    let role = p.labels().get(LABEL_ROLE).cloned().unwrap_or_default();
    match p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(node) => format!("{} ({role} on {node})", p.name_any()),
        None => format!("{} ({role}, not scheduled)", p.name_any()),
    }
}

/// The message when some logs could not be read: each pod with its error, why that happens,
/// and where the movers' last lines are kept instead.
pub fn failure_text(namespace: &str, transfer: &str, failures: &[(String, String)]) -> String {
    let mut out = format!(
        "error: the cluster did not serve the logs of {} mover pod{} of transfer {namespace}/{transfer}:\n",
        failures.len(),
        if failures.len() == 1 { "" } else { "s" }
    );
    for (title, error) in failures {
        out.push_str(&format!("  {title}: {error}\n"));
    }
    out.push_str(
        "The API server fetches pod logs from the kubelet of each pod's node; on a node that runs no \
         kubelet API, or once the pod is gone, there are none to fetch.\n",
    );
    out.push_str(&format!(
        "A mover that failed leaves its last log lines in its termination message: kubectl ferry describe {transfer} -n {namespace}\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, role: &str, attempt: &str) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {LABEL_ROLE: role, LABEL_ATTEMPT: attempt}},
            "spec": {"nodeName": "node-a", "containers": []},
        }))
        .unwrap_or_else(|e| panic!("pod: {e}"));
        if attempt.is_empty() {
            p.labels_mut().remove(LABEL_ATTEMPT);
        }
        p
    }

    fn names(pods: Vec<&Pod>) -> Vec<String> {
        pods.into_iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn the_newest_attempt_sender_first_and_no_cleanup_pod() {
        let pods = [
            pod("x-1-1-recv", "receiver", "1-1"),
            pod("x-1-10-recv", "receiver", "1-10"),
            pod("x-1-10-send", "sender", "1-10"),
            pod("x-1-9-send", "sender", "1-9"),
            pod("x-cleanup", "cleanup", ""),
        ];
        assert_eq!(
            names(pods_to_read(&pods, None)),
            ["x-1-10-send", "x-1-10-recv"]
        );
        assert_eq!(
            names(pods_to_read(&pods, Some(MoverRole::Receiver))),
            ["x-1-10-recv"]
        );
        assert_eq!(
            names(pods_to_read(&pods[..1], Some(MoverRole::Sender))),
            Vec::<String>::new()
        );
        assert_eq!(pod_title(&pods[0]), "x-1-1-recv (receiver on node-a)");
    }

    #[test]
    fn the_failure_names_every_pod_and_where_to_look_instead() {
        let text = failure_text(
            "ml",
            "stage",
            &[
                (
                    "a-send (sender on node-a)".into(),
                    "connection refused".into(),
                ),
                ("a-recv (receiver on node-b)".into(), "no route".into()),
            ],
        );
        assert!(text.starts_with(
            "error: the cluster did not serve the logs of 2 mover pods of transfer ml/stage:\n"
        ));
        assert!(text.contains("  a-send (sender on node-a): connection refused\n"));
        assert!(text.contains("  a-recv (receiver on node-b): no route\n"));
        assert!(text.contains("kubectl ferry describe stage -n ml"));
    }
}
