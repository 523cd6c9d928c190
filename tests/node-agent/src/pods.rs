//! Watches the pods bound to one node and runs each in its own task ([`crate::runner`]). A runner gets
//! every update of its pod through a watch channel (latest state wins), and `None` once the pod is
//! gone from the API.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::AgentConfig;
use crate::node::NodeIdentity;
use crate::podip::PodIpAllocator;
use crate::runner::NodeContext;

/// Runs until shutdown: one watcher on `spec.nodeName=<node>`, one task per pod UID.
pub async fn run_node_pods(
    client: Client,
    config: Arc<AgentConfig>,
    node: Arc<NodeIdentity>,
    shutdown: watch::Receiver<bool>,
) {
    let ctx = Arc::new(NodeContext {
        client: client.clone(),
        config,
        ips: PodIpAllocator::new(node.name.clone(), node.pod_range),
        node: node.clone(),
    });
    let pods: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={}", node.name);
    let mut stream = watcher::watcher(pods, watcher::Config::default().fields(&selector)).boxed();
    // Senders of the running pods, by UID. Entries go when their task ends.
    let mut running: HashMap<String, watch::Sender<Option<Pod>>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut seen_in_relist: Option<std::collections::HashSet<String>> = None;
    let mut shutdown_rx = shutdown.clone();
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            Some(done) = tasks.join_next() => {
                if let Ok(uid) = done {
                    running.remove(&uid);
                }
                continue;
            }
            _ = shutdown_rx.changed() => break,
        };
        let Some(event) = event else { break };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(node = %node.name, error = %e, "pod watch error; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        match event {
            Event::Init => seen_in_relist = Some(Default::default()),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    continue;
                };
                if let Some(seen) = seen_in_relist.as_mut() {
                    seen.insert(uid.clone());
                }
                if let Some(tx) = running.get(&uid) {
                    tx.send_replace(Some(pod));
                    continue;
                }
                let (tx, rx) = watch::channel(Some(pod));
                running.insert(uid.clone(), tx);
                let ctx = ctx.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move {
                    Box::pin(ctx.run_pod(rx, shutdown)).await;
                    uid
                });
            }
            Event::Delete(pod) => {
                if let Some(tx) = pod.metadata.uid.as_ref().and_then(|u| running.get(u)) {
                    tx.send_replace(None);
                }
            }
            Event::InitDone => {
                // Pods that vanished while the watch was down are gone for good.
                if let Some(seen) = seen_in_relist.take() {
                    for (uid, tx) in &running {
                        if !seen.contains(uid) {
                            tx.send_replace(None);
                        }
                    }
                }
            }
        }
    }
    // Shutdown: runners see it too and stop their processes; wait for them.
    while tasks.join_next().await.is_some() {}
}
