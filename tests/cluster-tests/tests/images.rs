//! The images ferry ships, as the local cluster's real kubelets and containerd run them from its
//! registry: non-root (uid 65532) with a read-only root, no shell inside, labelled with their
//! source; a missing image shows the kubelet's pull errors; each node has a disk of its own; and
//! `kubectl logs` / `kubectl exec` reach containers through the kubelets.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::operator::kubectl;
use ferry_cluster_tests::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(90);

/// `registry/path:tag` split into the registry's host and the repository path and tag.
fn split_reference(reference: &str) -> anyhow::Result<(String, String, String)> {
    let (host, rest) = reference
        .split_once('/')
        .with_context(|| format!("{reference} names no registry"))?;
    let (path, tag) = rest
        .rsplit_once(':')
        .with_context(|| format!("{reference} has no tag"))?;
    Ok((host.to_owned(), path.to_owned(), tag.to_owned()))
}

/// GET from the registry's HTTP API; the body.
fn registry_get(host: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("curl")
        .args(["-fsSL", "--max-time", "30", "-H"])
        .arg("Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
        .arg(format!("http://{host}/v2/{path}"))
        .output()
        .context("failed to run curl")?;
    if !out.status.success() {
        bail!(
            "GET {path} from {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// The image's config (as the registry serves it) and every path in its layers.
fn image_config_and_files(reference: &str) -> anyhow::Result<(serde_json::Value, Vec<String>)> {
    let (host, path, tag) = split_reference(reference)?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry_get(&host, &format!("{path}/manifests/{tag}"))?)?;
    let digest = manifest["config"]["digest"]
        .as_str()
        .context("manifest without config")?;
    let config: serde_json::Value =
        serde_json::from_slice(&registry_get(&host, &format!("{path}/blobs/{digest}"))?)?;
    let mut files = Vec::new();
    for layer in manifest["layers"].as_array().context("no layers")? {
        let digest = layer["digest"].as_str().context("layer without digest")?;
        let blob = registry_get(&host, &format!("{path}/blobs/{digest}"))?;
        let dir = std::env::temp_dir().join(format!("ferry-layer-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join(digest.replace(':', "-"));
        std::fs::write(&file, blob)?;
        // tar detects the compression itself.
        let out = Command::new("tar").arg("-tf").arg(&file).output()?;
        std::fs::remove_file(&file)?;
        if !out.status.success() {
            bail!("layer {digest}: {}", String::from_utf8_lossy(&out.stderr));
        }
        files.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_owned()),
        );
    }
    Ok((config, files))
}

#[test]
fn the_shipped_images_are_non_root_labelled_and_hold_one_binary_and_its_libraries()
-> anyhow::Result<()> {
    for name in ["ferry-mover", "ferry-operator"] {
        let (config, files) = image_config_and_files(&image(name))?;
        assert_eq!(config["config"]["User"], "65532:65532", "{name}: {config}");
        assert_eq!(
            config["config"]["Entrypoint"],
            json!([format!("/usr/local/bin/{name}")]),
            "{name}"
        );
        let labels = &config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.title"], name, "{labels}");
        for key in [
            "org.opencontainers.image.source",
            "org.opencontainers.image.revision",
            "org.opencontainers.image.version",
        ] {
            assert!(
                labels[key].as_str().is_some_and(|v| !v.is_empty()),
                "{name}: label {key} missing: {labels}"
            );
        }
        // One program, the libraries it links and the users; nothing to run a command with.
        let programs: Vec<&String> = files
            .iter()
            .filter(|f| f.contains("bin/"))
            .filter(|f| !f.ends_with("/bin") && !f.ends_with("bin"))
            .collect();
        assert_eq!(
            programs,
            vec![&format!("usr/local/bin/{name}")],
            "{name}: {files:?}"
        );
        for shell in ["bin/sh", "bin/bash", "bin/busybox", "usr/bin/env"] {
            assert!(!files.iter().any(|f| f == shell), "{name} holds {shell}");
        }
        assert!(files.iter().any(|f| f == "etc/passwd"), "{name}: {files:?}");
        assert!(
            files.iter().any(|f| f.contains("libc.so")),
            "{name} lacks libc: {files:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_ferry_images_run_as_65532_with_a_read_only_root_and_no_shell() -> anyhow::Result<()> {
    let ns = TestNamespace::create("images").await?;
    let pods = ns.api::<Pod>();
    let locked_down = json!({
        "runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
    });
    for (pod, name) in [("mover", "ferry-mover"), ("operator", "ferry-operator")] {
        // runAsNonRoot without runAsUser: the kubelet takes the user from the image and refuses
        // to start it unless it is numeric and not 0.
        create(
            &pods,
            json!({
                "metadata": {"name": pod},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                    "containers": [{"name": "main", "image": image(name), "args": ["--version"],
                        "securityContext": locked_down}],
                }
            }),
        )
        .await?;
        let done = wait_succeeded(&pods, &ns.name, pod, POD_TIMEOUT).await?;
        let log = container_log(&ns.name, pod, "main").await;
        assert!(log.contains(name), "{pod}: {log}");
        let status = done.status.unwrap().container_statuses.unwrap();
        assert!(
            status[0].image_id.contains("sha256:"),
            "pulled by digest: {status:?}"
        );
    }
    // A shell is not there to be started.
    create(
        &pods,
        json!({
            "metadata": {"name": "shell"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{"name": "main", "image": mover_image(),
                    "command": ["/bin/sh", "-c", "echo shell"], "securityContext": locked_down}],
            }
        }),
    )
    .await?;
    let pod = wait_for_pod(&pods, "shell", POD_TIMEOUT, "failed to start", |p| {
        container_state(p).is_some_and(|(reason, _)| {
            matches!(
                reason.as_str(),
                "StartError" | "RunContainerError" | "CreateContainerError"
            )
        })
    })
    .await?;
    let (_, message) = container_state(&pod).unwrap_or_default();
    assert!(
        message.contains("/bin/sh") && message.contains("no such file"),
        "{message}"
    );
    ns.delete().await
}

/// The reason and message of the first container's waiting or terminated state.
fn container_state(pod: &Pod) -> Option<(String, String)> {
    let state = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?;
    if let Some(w) = &state.waiting {
        return Some((
            w.reason.clone().unwrap_or_default(),
            w.message.clone().unwrap_or_default(),
        ));
    }
    let t = state.terminated.as_ref()?;
    Some((
        t.reason.clone().unwrap_or_default(),
        t.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test]
async fn an_image_the_registry_lacks_shows_the_kubelets_pull_errors() -> anyhow::Result<()> {
    let ns = TestNamespace::create("pull").await?;
    let pods = ns.api::<Pod>();
    let (host, path, _) = split_reference(&mover_image())?;
    let missing = format!(
        "{host}/{}/not-built:never",
        path.rsplit_once('/').map_or("ferry", |(prefix, _)| prefix)
    );
    create(
        &pods,
        json!({
            "metadata": {"name": "missing"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-b"},
                "containers": [{"name": "main", "image": missing}],
            }
        }),
    )
    .await?;
    let pod = wait_for_pod(&pods, "missing", POD_TIMEOUT, "ImagePullBackOff", |p| {
        container_state(p).is_some_and(|(reason, _)| reason == "ImagePullBackOff")
    })
    .await?;
    assert_eq!(phase(&pod), "Pending");
    // The kubelet's events name the failed pull and the image.
    let events = kubectl(&[
        "get",
        "events",
        "-n",
        &ns.name,
        "--field-selector",
        "involvedObject.name=missing",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ])?;
    assert!(
        events.contains("Failed: ") && events.contains("not-built:never"),
        "{events}"
    );
    assert!(events.contains("ErrImagePull"), "{events}");
    ns.delete().await
}

#[tokio::test]
async fn each_node_has_a_data_disk_of_its_own() -> anyhow::Result<()> {
    let ns = TestNamespace::create("disks").await?;
    let pods = ns.api::<Pod>();
    for node in ["node-a", "node-b"] {
        create(
            &pods,
            json!({
                "metadata": {"name": format!("writer-{node}")},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": shell_image(),
                        "command": ["sh", "-c", format!("mkdir -p /data/{0} && echo {node} > /data/{0}/who && ls /data/{0}", ns.name)],
                        "securityContext": {"runAsUser": 0},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "hostPath": {"path": "/data"}}],
                }
            }),
        )
        .await?;
    }
    for node in ["node-a", "node-b"] {
        wait_succeeded(&pods, &ns.name, &format!("writer-{node}"), POD_TIMEOUT).await?;
        let who = std::fs::read_to_string(node_root(node).join("data").join(&ns.name).join("who"))?;
        assert_eq!(who.trim(), node, "node {node}'s /data is its own directory");
        // Each pod saw its own node's file only.
        let log = container_log(&ns.name, &format!("writer-{node}"), "main").await;
        assert_eq!(log.trim(), "who", "{node}: {log}");
    }
    assert!(
        !std::path::Path::new("/data").join(&ns.name).exists(),
        "a node wrote into the machine's /data"
    );
    for node in ["node-a", "node-b"] {
        let _ = std::fs::remove_dir_all(node_root(node).join("data").join(&ns.name));
    }
    ns.delete().await
}

#[tokio::test]
async fn kubectl_logs_and_exec_reach_a_container_through_its_kubelet() -> anyhow::Result<()> {
    let ns = TestNamespace::create("exec").await?;
    let pods = ns.api::<Pod>();
    create(
        &pods,
        json!({
            "metadata": {"name": "shell"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-b"},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "echo hello from the log; exec sleep 3600"]}],
            }
        }),
    )
    .await?;
    wait_for_pod(&pods, "shell", POD_TIMEOUT, "Running", |p| {
        phase(p) == "Running"
    })
    .await?;
    wait_for_log(&ns.name, "shell", "main", "hello from the log", POD_TIMEOUT).await?;
    let logs = kubectl(&["logs", "-n", &ns.name, "shell"])?;
    assert_eq!(logs.trim(), "hello from the log");
    let out = kubectl(&[
        "exec",
        "-n",
        &ns.name,
        "shell",
        "--",
        "sh",
        "-c",
        "echo $((6 * 7)) $(hostname)",
    ])?;
    assert_eq!(out.trim(), "42 shell");
    ns.delete().await
}
