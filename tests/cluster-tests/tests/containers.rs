//! Containers on the local cluster behave as under a real kubelet and runtime: grpc, HTTPS,
//! liveness and startup probes, a read-only root file system, dropped capabilities and the
//! runAsNonRoot refusal. Probe results are driven by files the test creates on the node's disk
//! (mounted through hostPath), never by timing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory on node-a's disk, mounted at /flag in the pods below.
fn flag_dir(ns: &TestNamespace) -> PathBuf {
    let dir = node_root("node-a").join("data").join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn flag_volume(ns: &TestNamespace) -> serde_json::Value {
    json!([{"name": "flag", "hostPath": {"path": format!("/data/{}", ns.name), "type": "Directory"}}])
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

#[tokio::test]
async fn grpc_and_https_probes_decide_readiness() -> anyhow::Result<()> {
    let ns = TestNamespace::create("probes").await?;
    let flags = flag_dir(&ns);
    create(
        &ns.api::<Pod>(),
        json!({
            "metadata": {"name": "grpc"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": probe_image(),
                    "args": ["grpc-health", "--port", "9000", "--serving-while-file", "/flag/serving"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "volumeMounts": [{"name": "flag", "mountPath": "/flag"}],
                    "readinessProbe": {"grpc": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 1},
                }],
                "volumes": flag_volume(&ns),
            }
        }),
    )
    .await?;
    // A real TLS server (openssl s_server with a fresh self-signed certificate) behind an HTTPS
    // httpGet probe: the kubelet connects with TLS and reads the status without verifying.
    create(
        &ns.api::<Pod>(),
        json!({
            "metadata": {"name": "https"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "cd /tmp && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=pod -keyout k.pem -out c.pem -days 1 2>/dev/null && exec openssl s_server -accept 8443 -www -cert c.pem -key k.pem -quiet"],
                    "readinessProbe": {"httpGet": {"port": 8443, "scheme": "HTTPS", "path": "/"}, "periodSeconds": 1},
                }],
            }
        }),
    )
    .await?;
    let pods = ns.api::<Pod>();
    wait_for_pod(&pods, "https", POD_TIMEOUT, "Ready through HTTPS", is_ready).await?;

    let grpc = wait_for_pod(&pods, "grpc", POD_TIMEOUT, "Running", |p| {
        phase(p) == "Running"
    })
    .await?;
    assert!(!is_ready(&grpc), "NOT_SERVING must not be Ready");
    std::fs::write(flags.join("serving"), b"")?;
    wait_for_pod(&pods, "grpc", POD_TIMEOUT, "Ready once SERVING", is_ready).await?;
    std::fs::remove_file(flags.join("serving"))?;
    wait_for_pod(
        &pods,
        "grpc",
        POD_TIMEOUT,
        "not Ready once NOT_SERVING",
        |p| !is_ready(p),
    )
    .await?;
    ns.delete().await?;
    let _ = std::fs::remove_dir_all(flags);
    Ok(())
}

#[tokio::test]
async fn failing_liveness_and_startup_probes_restart_the_container() -> anyhow::Result<()> {
    let ns = TestNamespace::create("liveness").await?;
    let flags = flag_dir(&ns);
    std::fs::write(flags.join("alive"), b"")?;
    // The kubelet kills a container that fails its probe with SIGTERM, then SIGKILL after the
    // probe's grace period; busybox's sleep as PID 1 ignores SIGTERM, so it ends with 137.
    let probe = |file: &str, failures: i32| {
        json!({"exec": {"command": ["test", "-e", format!("/flag/{file}")]},
               "periodSeconds": 1, "failureThreshold": failures,
               "terminationGracePeriodSeconds": 1})
    };
    for (name, kind, file) in [
        ("live", "livenessProbe", "alive"),
        ("start", "startupProbe", "started"),
    ] {
        let mut container = json!({
            "name": "main", "image": shell_image(), "command": ["sleep", "3600"],
            "volumeMounts": [{"name": "flag", "mountPath": "/flag"}],
        });
        container[kind] = probe(file, 2);
        create(
            &ns.api::<Pod>(),
            json!({
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                    "containers": [container],
                    "volumes": flag_volume(&ns),
                }
            }),
        )
        .await?;
    }
    let pods = ns.api::<Pod>();
    // Alive while the file exists: Ready (no readiness probe) and not restarted.
    let live = wait_for_pod(&pods, "live", POD_TIMEOUT, "Ready", is_ready).await?;
    assert_eq!(restarts(&live), 0);
    std::fs::remove_file(flags.join("alive"))?;
    let live = wait_for_pod(
        &pods,
        "live",
        POD_TIMEOUT,
        "restarted by its liveness probe",
        |p| restarts(p) >= 1,
    )
    .await?;
    let last = live.status.unwrap().container_statuses.unwrap()[0]
        .last_state
        .clone()
        .and_then(|s| s.terminated)
        .context("no last terminated state")?;
    assert_eq!(last.exit_code, 137, "killed: {last:?}");

    // The startup probe never passes: not Ready, and restarted after its threshold.
    let start = wait_for_pod(
        &pods,
        "start",
        POD_TIMEOUT,
        "restarted by its startup probe",
        |p| restarts(p) >= 1,
    )
    .await?;
    assert!(!is_ready(&start));
    // Once it passes, the container is Ready.
    std::fs::write(flags.join("started"), b"")?;
    wait_for_pod(&pods, "start", POD_TIMEOUT, "Ready once started", is_ready).await?;
    ns.delete().await?;
    let _ = std::fs::remove_dir_all(flags);
    Ok(())
}

#[tokio::test]
async fn a_read_only_root_and_dropped_capabilities_hold_inside_the_container() -> anyhow::Result<()>
{
    let ns = TestNamespace::create("sandbox").await?;
    create(
        &ns.api::<Pod>(),
        json!({
            "metadata": {"name": "confined"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "
                        touch /var/tmp/ferry-sandbox-probe 2>&1 || echo root-read-only
                        touch /tmp/x 2>&1 || echo tmp-read-only
                        touch /scratch/x && echo volume-writable
                        grep CapEff /proc/self/status
                        id -u"],
                    "securityContext": {
                        "readOnlyRootFilesystem": true, "runAsUser": 0,
                        "capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": false,
                    },
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            }
        }),
    )
    .await?;
    let pods = ns.api::<Pod>();
    wait_succeeded(&pods, &ns.name, "confined", POD_TIMEOUT).await?;
    let log = container_log(&ns.name, "confined", "main").await;
    assert!(log.contains("Read-only file system"), "{log}");
    assert!(log.contains("root-read-only"), "{log}");
    assert!(log.contains("tmp-read-only"), "{log}");
    assert!(log.contains("volume-writable"), "{log}");
    assert!(log.contains("CapEff:\t0000000000000000"), "{log}");
    assert!(
        !std::path::Path::new("/var/tmp/ferry-sandbox-probe").exists(),
        "the write reached the host"
    );
    ns.delete().await
}

#[tokio::test]
async fn run_as_non_root_refuses_a_root_container_with_the_kubelets_reason() -> anyhow::Result<()> {
    let ns = TestNamespace::create("nonroot").await?;
    create(
        &ns.api::<Pod>(),
        json!({
            "metadata": {"name": "rooty"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "securityContext": {"runAsNonRoot": true},
                // The tools image names no user, so it runs as root.
                "containers": [{
                    "name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "echo started; sleep 3600"],
                }],
            }
        }),
    )
    .await?;
    let pods = ns.api::<Pod>();
    let pod = wait_for_pod(&pods, "rooty", POD_TIMEOUT, "refused", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
    })
    .await?;
    let waiting = pod.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    let message = waiting.message.unwrap_or_default();
    assert!(
        message.starts_with("container has runAsNonRoot and image will run as root"),
        "{message}"
    );
    assert_eq!(
        container_log(&ns.name, "rooty", "main").await,
        "",
        "nothing ran"
    );
    ns.delete().await
}
