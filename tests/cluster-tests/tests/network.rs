//! The local clusters' network as a real cluster's: pod namespaces, Services through kube-proxy,
//! cluster DNS, two clusters side by side, a node that loses power, and no route out of the machine.
//! Needs both clusters up (`make cluster-up` and `FERRY_CLUSTER=peer make cluster-up`; `make test`
//! starts both). The node-failure test uses node-x, which only tolerating pods land on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::*;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(60);

/// A probe pod answering "hello from <name>" on its pod IP, port 8080.
fn server(name: &str, node: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "main", "image": probe_image(), "args": ["serve", "--port", "8080"],
                "env": downward_env(),
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }],
        }
    })
}

/// A Service of `type_` on port 80 in front of the pods labelled `app: <name>`, port 8080.
fn service(name: &str, type_: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "type": type_, "selector": {"app": name},
            "ports": [{"port": 80, "targetPort": 8080}],
        }
    })
}

async fn node_ip(client: &Client, node: &str) -> anyhow::Result<String> {
    let node = Api::<Node>::all(client.clone()).get(node).await?;
    node.status
        .and_then(|s| s.addresses)
        .and_then(|a| a.into_iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address)
        .context("node has no InternalIP")
}

/// The addresses of the service's EndpointSlices, with their readiness.
async fn endpoints(ns: &TestNamespace, service: &str) -> anyhow::Result<Vec<(String, bool)>> {
    let slices = ns
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await?;
    Ok(slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            e.addresses.iter().map(move |a| (a.clone(), ready))
        })
        .collect())
}

#[tokio::test]
async fn a_pods_loopback_is_its_own() -> anyhow::Result<()> {
    let ns = TestNamespace::create("loopback").await?;
    let pods = ns.api::<Pod>();
    // Listens on the pod's 127.0.0.1 only; the exec readiness probe, run inside the pod, proves the
    // listener is there.
    create(
        &pods,
        json!({
            "metadata": {"name": "hidden"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": shell_image(),
                    "command": ["socat", "TCP-LISTEN:7000,bind=127.0.0.1,reuseaddr,fork", "SYSTEM:echo secret"],
                    "readinessProbe": {
                        "exec": {"command": ["sh", "-c", "socat -T2 - TCP:127.0.0.1:7000 </dev/null | grep -q secret"]},
                        "periodSeconds": 1,
                    },
                }],
            }
        }),
    )
    .await?;
    let hidden = wait_for_pod(&pods, "hidden", POD_TIMEOUT, "Ready", is_ready).await?;
    let ip = pod_ip(&hidden);
    // A pod on the same node: neither its own loopback nor the other pod's address reaches it.
    let log = run_script(
        &ns,
        "neighbour",
        "node-a",
        &format!(
            "if socat -T2 - TCP:127.0.0.1:7000 </dev/null 2>/dev/null | grep -q secret; then echo own-loopback-reached; exit 1; fi
             if socat -T2 - TCP:{ip}:7000 </dev/null 2>/dev/null | grep -q secret; then echo pod-ip-reached; exit 1; fi
             echo isolated"
        ),
    )
    .await?;
    assert!(log.contains("isolated"), "{log}");
    // Nor does the host.
    let from_host = tokio::net::TcpStream::connect((ip.as_str(), 7000)).await;
    assert!(
        from_host.is_err(),
        "the host reached {ip}:7000, a listener on the pod's loopback"
    );
    ns.delete().await
}

#[tokio::test]
async fn services_reach_ready_pods_only_by_cluster_ip_name_and_node_port() -> anyhow::Result<()> {
    let ns = TestNamespace::create("svc").await?;
    let pods = ns.api::<Pod>();
    create(&pods, server("steady", "node-a", json!({"app": "echo"}))).await?;
    // Ready while a file on node-b exists.
    let flag_dir = node_root("node-b").join("data").join(&ns.name);
    std::fs::create_dir_all(&flag_dir)?;
    std::fs::write(flag_dir.join("ready"), b"")?;
    let mut flappy = server("flappy", "node-b", json!({"app": "echo"}));
    flappy["spec"]["containers"][0]["readinessProbe"] = json!({
        "exec": {"command": ["/usr/local/bin/ferry-cluster-probe", "exists", "/flag/ready"]},
        "periodSeconds": 1,
    });
    flappy["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "flag", "mountPath": "/flag"}]);
    flappy["spec"]["volumes"] = json!([{
        "name": "flag", "hostPath": {"path": format!("/data/{}", ns.name), "type": "Directory"},
    }]);
    create(&pods, flappy).await?;
    let service = create(&ns.api::<Service>(), service("echo", "NodePort")).await?;
    let spec = service.spec.unwrap();
    let cluster_ip = spec.cluster_ip.unwrap();
    let node_port = spec.ports.unwrap()[0].node_port.unwrap();
    let steady_ip = pod_ip(&wait_for_pod(&pods, "steady", POD_TIMEOUT, "Ready", is_ready).await?);
    let flappy_ip = pod_ip(&wait_for_pod(&pods, "flappy", POD_TIMEOUT, "Ready", is_ready).await?);
    // The real EndpointSlice controller lists both, ready.
    wait_until(POD_TIMEOUT, "both endpoints ready", || async {
        let eps: BTreeSet<_> = endpoints(&ns, "echo").await?.into_iter().collect();
        Ok(eps == BTreeSet::from([(steady_ip.clone(), true), (flappy_ip.clone(), true)]))
    })
    .await?;

    // By name (cluster DNS, the search path) through kube-proxy: both pods answer (once every
    // node's kube-proxy has caught up with the slice).
    let request = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | socat -T3 - TCP:echo:80";
    let log = run_script(
        &ns,
        "both",
        "node-b",
        &format!(
            "getent hosts echo; seen=''
             for i in $(seq 1 300); do
               r=$({request} 2>&1 | tail -n1); seen=\"$seen $r\"
               case \"$seen\" in *steady*flappy*|*flappy*steady*) echo both-answered; exit 0;; esac
               sleep 0.1
             done; echo \"only: $seen\"; exit 1"
        ),
    )
    .await?;
    assert!(
        log.contains(&format!("{cluster_ip} ")),
        "echo resolves to {cluster_ip}: {log}"
    );
    assert!(log.contains("both-answered"), "{log}");

    // Unready: the slice marks flappy not ready, and after kube-proxy's resync no request reaches it.
    std::fs::remove_file(flag_dir.join("ready"))?;
    wait_until(POD_TIMEOUT, "flappy's endpoint not ready", || async {
        let eps = endpoints(&ns, "echo").await?;
        Ok(eps.contains(&(steady_ip.clone(), true)) && !eps.contains(&(flappy_ip.clone(), true)))
    })
    .await?;
    let log = run_script(
        &ns,
        "steady-only",
        "node-b",
        &format!(
            "streak=0
             for i in $(seq 1 300); do
               r=$({request} 2>&1 | tail -n1)
               case \"$r\" in *steady*) streak=$((streak + 1));; *) streak=0;; esac
               [ $streak -ge 5 ] && break
               sleep 0.2
             done
             for i in $(seq 1 20); do {request} 2>&1 | tail -n1; done"
        ),
    )
    .await?;
    let replies: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("hello from"))
        .collect();
    assert_eq!(replies.len(), 20, "{log}");
    assert!(
        replies.iter().all(|r| *r == "hello from steady"),
        "an unready pod got traffic: {log}"
    );

    // NodePort on every node's address, from the host.
    for node in ["node-a", "node-b"] {
        let ip = node_ip(&ns.client, node).await?;
        let reply = http_get(&ip, node_port as u16).await?;
        assert!(reply.ends_with("hello from steady\n"), "{node}: {reply:?}");
    }
    ns.delete().await?;
    let _ = std::fs::remove_dir_all(flag_dir);
    Ok(())
}

#[tokio::test]
async fn pods_resolve_the_apiserver_by_name_and_reach_it_through_its_service() -> anyhow::Result<()>
{
    let ns = TestNamespace::create("dns").await?;
    let log = run_script(
        &ns,
        "resolver",
        "node-b",
        "set -e
         cat /etc/resolv.conf
         getent hosts kubernetes.default
         curl -sS --max-time 10 --cacert /var/run/secrets/kubernetes.io/serviceaccount/ca.crt https://kubernetes.default.svc/healthz; echo
         if getent hosts no-such-service; then exit 1; fi; echo unknown-name-fails",
    )
    .await?;
    assert!(log.contains("nameserver 10.96.0.10"), "{log}");
    assert!(
        log.contains(&format!("search {}.svc.cluster.local", ns.name)),
        "{log}"
    );
    assert!(
        log.contains("10.96.0.1 "),
        "kubernetes.default -> 10.96.0.1: {log}"
    );
    assert!(log.lines().any(|l| l == "ok"), "{log}");
    assert!(log.contains("unknown-name-fails"), "{log}");
    ns.delete().await
}

/// `ip route get ADDR` on the host (or in namespace `netns`): the route's text, or the error.
fn route_get(netns: Option<&str>, addr: &str) -> String {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["route", "get", addr]).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn no_packet_for_the_cluster_ranges_leaves_the_machine() -> anyhow::Result<()> {
    // On the host: node, pod and Service addresses of both clusters, and unused ones in the
    // clusters' supernet, go into the router or nowhere.
    for addr in [
        "10.100.0.11",
        "10.100.129.9",
        "10.96.0.10",
        "10.101.0.11",
        "10.101.129.9",
        "10.97.0.1",
        "10.107.3.3",
        "10.127.255.254",
    ] {
        let route = route_get(None, addr);
        assert!(
            route.contains("dev ferry-net") || route.contains("No route to host"),
            "host route for {addr}: {route}"
        );
    }
    // The router has no way out: anything not a cluster's is unreachable there.
    let default_gw = std::process::Command::new("ip")
        .args(["-4", "route", "show", "default"])
        .output()?;
    let default_gw = String::from_utf8_lossy(&default_gw.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .unwrap_or("192.0.2.1")
        .to_string();
    for addr in [default_gw.as_str(), "198.51.100.7", "10.200.0.1"] {
        let route = route_get(Some("ferry-net"), addr);
        assert!(
            route.contains("Network is unreachable") || route.contains("No route to host"),
            "router route for {addr}: {route}"
        );
    }
    // And a pod trying to reach the host's gateway gets nowhere.
    let ns = TestNamespace::create("egress").await?;
    let log = run_script(
        &ns,
        "egress",
        "node-a",
        &format!(
            "ip route; if ping -c1 -W2 {default_gw}; then echo left-the-cluster; exit 1; fi; echo stayed"
        ),
    )
    .await?;
    assert!(log.contains("default via 10.100.129.1"), "{log}");
    assert!(log.contains("stayed"), "{log}");
    ns.delete().await
}

#[tokio::test]
async fn a_node_port_is_reached_across_clusters_and_a_pod_ip_is_not() -> anyhow::Result<()> {
    let peer = TestNamespace::create_in(Cluster::Peer, "across").await?;
    create(
        &peer.api::<Pod>(),
        server("far", "peer-a", json!({"app": "far"})),
    )
    .await?;
    let service = create(&peer.api::<Service>(), service("far", "NodePort")).await?;
    let node_port = service.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
    let far = wait_for_pod(&peer.api::<Pod>(), "far", POD_TIMEOUT, "Ready", is_ready).await?;
    let far_ip = pod_ip(&far);
    assert!(
        far_ip.starts_with("10.101."),
        "peer pods are in 10.101/16: {far_ip}"
    );
    // Through peer-b, which does not run the pod: kube-proxy forwards it inside the peer cluster.
    let peer_node = node_ip(&peer.client, "peer-b").await?;
    let ns = TestNamespace::create("across").await?;
    let request = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | socat -T3 -";
    let log = run_script(
        &ns,
        "caller",
        "node-a",
        &format!(
            "for i in $(seq 1 100); do
               {request} TCP:{peer_node}:{node_port} 2>/dev/null | grep -q 'hello from far' && break; sleep 0.2
             done
             {request} TCP:{peer_node}:{node_port} | tail -n1
             if {request} TCP:{far_ip}:8080 2>&1 | grep -q 'hello from'; then echo pod-ip-reached; exit 1; fi
             echo pod-ip-unreachable"
        ),
    )
    .await?;
    assert!(log.contains("hello from far"), "{log}");
    assert!(log.contains("pod-ip-unreachable"), "{log}");
    ns.delete().await?;
    peer.delete().await
}

#[tokio::test]
async fn a_load_balancer_address_is_announced_and_reached_from_the_host_and_the_other_cluster()
-> anyhow::Result<()> {
    let ns = TestNamespace::create("lb").await?;
    create(
        &ns.api::<Pod>(),
        server("backend", "node-b", json!({"app": "front"})),
    )
    .await?;
    create(&ns.api::<Service>(), service("front", "LoadBalancer")).await?;
    wait_for_pod(&ns.api::<Pod>(), "backend", POD_TIMEOUT, "Ready", is_ready).await?;
    // MetalLB's controller assigns an address from the pool at the top of the node network.
    let services = ns.api::<Service>();
    let lb_ip = {
        let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
        loop {
            let svc = services.get("front").await?;
            let ip = svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .and_then(|i| i.into_iter().next())
                .and_then(|i| i.ip);
            if let Some(ip) = ip {
                break ip;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no LoadBalancer address after {POD_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let last: u8 = lb_ip
        .strip_prefix("10.100.0.")
        .and_then(|l| l.parse().ok())
        .with_context(|| format!("{lb_ip} is not on the node network"))?;
    assert!((200..=250).contains(&last), "{lb_ip} outside the pool");
    // From the host: the router resolves the address by ARP to a speaker's node (L2 mode).
    let reply = tokio::time::timeout(POD_TIMEOUT, async {
        loop {
            match http_get(&lb_ip, 80).await {
                Ok(reply) if reply.contains("hello from backend") => return reply,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .context("the LoadBalancer address never answered from the host")?;
    assert!(reply.ends_with("hello from backend\n"), "{reply:?}");
    // From a pod of the other cluster, as from another cluster on the same network.
    let peer = TestNamespace::create_in(Cluster::Peer, "lb").await?;
    let pods = peer.api::<Pod>();
    create(
        &pods,
        json!({
            "metadata": {"name": "visitor"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "peer-a"},
                "containers": [{
                    "name": "main", "image": probe_image(),
                    "args": ["connect", "--addr", format!("{lb_ip}:80"), "--expect", "hello from backend"],
                }],
            }
        }),
    )
    .await?;
    let done = wait_for_pod(&pods, "visitor", POD_TIMEOUT, "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:?}", done.status);
    peer.delete().await?;
    ns.delete().await
}

#[tokio::test]
async fn a_node_that_loses_power_goes_not_ready_and_its_pods_are_evicted() -> anyhow::Result<()> {
    let ns = TestNamespace::create("nodefail").await?;
    let pods = ns.api::<Pod>();
    let tolerate = |key: &str, effect: &str, seconds: Option<i64>| {
        let mut t = json!({"key": key, "operator": "Exists", "effect": effect});
        if let Some(s) = seconds {
            t["tolerationSeconds"] = json!(s);
        }
        t
    };
    create(
        &pods,
        json!({
            "metadata": {"name": "victim"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-x"},
                "tolerations": [
                    tolerate("ferry.dev/disruptive", "NoSchedule", None),
                    tolerate("node.kubernetes.io/unreachable", "NoExecute", Some(2)),
                    tolerate("node.kubernetes.io/not-ready", "NoExecute", Some(2)),
                ],
                "containers": [{"name": "main", "image": probe_image(), "args": ["sleep"],
                    "env": [{"name": "FERRY_TEST_POD", "value": format!("{}/victim", ns.name)}]}],
            }
        }),
    )
    .await?;
    wait_for_pod(&pods, "victim", POD_TIMEOUT, "Running", |p| {
        phase(p) == "Running"
    })
    .await?;
    wait_for_log(&ns.name, "victim", "main", "pid ", POD_TIMEOUT).await?;
    let found = host_pids_with_marker(&format!("{}/victim", ns.name));
    let [pid] = found[..] else {
        bail!("the victim's process on the machine: {found:?}");
    };

    let restart = ferry_cluster_tests::power_off(Cluster::Main, "node-x")?;
    // Power loss: the process was killed (it may linger a moment as a zombie until reaped).
    wait_until(
        Duration::from_secs(10),
        "the pod's process dead",
        || async {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            Ok(matches!(state, None | Some("Z" | "X")))
        },
    )
    .await?;

    // The real node lifecycle controller: NotReady (Unknown) after its grace period, the
    // unreachable taint, then eviction of the pod whose toleration ran out.
    let nodes = Api::<Node>::all(ns.client.clone());
    wait_until(Duration::from_secs(150), "node-x not Ready", || async {
        let node = nodes.get("node-x").await?;
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status);
        let tainted = node
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable"));
        Ok(ready.as_deref() != Some("True") && tainted)
    })
    .await?;
    wait_for_pod(&pods, "victim", Duration::from_secs(60), "evicted", |p| {
        p.metadata.deletion_timestamp.is_some()
    })
    .await?;

    // Power back: the node is Ready again and finishes the eviction it missed, starting nothing.
    drop(restart);
    wait_until(Duration::from_secs(60), "the evicted pod gone", || async {
        Ok(pods.get_opt("victim").await?.is_none())
    })
    .await?;
    let node = nodes.get("node-x").await?;
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status);
    assert_eq!(ready.as_deref(), Some("True"));
    ns.delete().await
}
