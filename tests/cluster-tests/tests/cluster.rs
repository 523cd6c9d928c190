//! Tests against the running local cluster (`make cluster-up`; `make test` starts it). Each test has
//! its own namespace. If the cluster is not reachable every test fails with a message saying so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use ferry_cluster_tests::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn pod_with_host_path_secret_and_env_sees_its_files_and_env() -> anyhow::Result<()> {
    let ns = TestNamespace::create("files-env").await?;
    let data_dir = node_root("node-a").join("data").join(&ns.name);
    std::fs::create_dir_all(&data_dir)?;
    std::fs::write(data_dir.join("input.txt"), "bytes from node-a's disk\n")?;
    create(
        &ns.api::<Secret>(),
        json!({"metadata": {"name": "creds"}, "stringData": {"token": "s3cr3t-token", "user": "ferry"}}),
    )
    .await?;
    create(
        &ns.api::<ConfigMap>(),
        json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}}),
    )
    .await?;
    let script = "cat /data/input.txt; cat /etc/ferry-test/creds/token; echo; \
                  echo \"env: $GREETING $USER_FROM_SECRET $MODE $MY_IP $MY_NODE $MY_NS $MY_NAME\"; \
                  echo written-by-pod > /data/output.txt; pwd";
    let pods = ns.api::<Pod>();
    create(
        &pods,
        json!({
            "metadata": {"name": "reader"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": shell_image(), "command": ["sh", "-c", script],
                    "workingDir": "/data",
                    "env": [
                        {"name": "GREETING", "value": "hello"},
                        {"name": "USER_FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "creds", "mountPath": "/etc/ferry-test/creds", "readOnly": true},
                    ],
                }],
                "volumes": [
                    {"name": "data", "hostPath": {"path": format!("/data/{}", ns.name), "type": "Directory"}},
                    {"name": "creds", "secret": {"secretName": "creds"}},
                ],
            }
        }),
    )
    .await?;
    let pod = wait_succeeded(&pods, &ns.name, "reader", POD_TIMEOUT).await?;
    let ip = pod_ip(&pod);
    let log = container_log(&ns.name, "reader", "main").await;
    assert_eq!(
        log,
        format!(
            "bytes from node-a's disk\ns3cr3t-token\nenv: hello ferry fast {ip} node-a {} reader\n/data\n",
            ns.name
        )
    );
    assert!(
        ip.starts_with("10.100.129."),
        "node-a pods get 10.100.129.x, got {ip}"
    );
    assert_eq!(
        std::fs::read_to_string(data_dir.join("output.txt"))?,
        "written-by-pod\n"
    );
    assert!(
        !node_root("node-b")
            .join("data")
            .join(&ns.name)
            .join("output.txt")
            .exists()
    );
    let status = &pod.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(
        status
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        0
    );
    ns.delete().await
}

#[tokio::test]
async fn security_context_user_and_fs_group_are_honoured() -> anyhow::Result<()> {
    let ns = TestNamespace::create("secctx").await?;
    let root_dir = node_root("node-a").join("data").join(&ns.name);
    std::fs::create_dir_all(&root_dir)?;
    let pods = ns.api::<Pod>();
    // Exits 3 with a termination message when anything is off, so the failure shows in the status.
    let script = "echo \"ids: $(id -u) $(id -g) $(id -G)\"; \
                  echo scratch > /scratch/f && ls -ln /scratch/f; \
                  if (echo x > /rootonly/denied) 2>/dev/null; then echo 'wrote root-owned dir' > /dev/termination-log; exit 3; fi; \
                  echo denied-as-expected";
    create(
        &pods,
        json!({
            "metadata": {"name": "nonroot"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "securityContext": {"runAsUser": 1234, "runAsGroup": 1235, "fsGroup": 4321},
                "containers": [{
                    "name": "main", "image": shell_image(), "command": ["sh", "-c", script],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "rootonly", "mountPath": "/rootonly"},
                    ],
                }],
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "rootonly", "hostPath": {"path": format!("/data/{}", ns.name)}},
                ],
            }
        }),
    )
    .await?;
    wait_succeeded(&pods, &ns.name, "nonroot", POD_TIMEOUT).await?;
    let log = container_log(&ns.name, "nonroot", "main").await;
    let mut lines = log.lines();
    assert_eq!(lines.next(), Some("ids: 1234 1235 1235 4321"), "{log}");
    let ls = lines.next().unwrap_or_default();
    assert!(
        ls.contains(" 1234 ") && ls.contains(" 4321 "),
        "emptyDir file owned by uid 1234, group fsGroup: {ls}"
    );
    assert_eq!(lines.next(), Some("denied-as-expected"), "{log}");
    assert!(!root_dir.join("denied").exists());

    // A failing container reports its exit code and termination message.
    create(
        &pods,
        json!({
            "metadata": {"name": "fails"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "echo 'disk on fire' > /dev/termination-log; exit 7"]}],
            }
        }),
    )
    .await?;
    let pod = wait_for_pod(&pods, "fails", POD_TIMEOUT, "Failed", |p| {
        phase(p) == "Failed"
    })
    .await?;
    let status = &pod.status.unwrap().container_statuses.unwrap()[0];
    let term = status.state.as_ref().unwrap().terminated.clone().unwrap();
    assert_eq!(term.exit_code, 7);
    assert_eq!(term.message.as_deref(), Some("disk on fire\n"));
    ns.delete().await
}

#[tokio::test]
async fn pods_on_different_nodes_reach_each_other_by_pod_ip() -> anyhow::Result<()> {
    let ns = TestNamespace::create("podnet").await?;
    let pods = ns.api::<Pod>();
    create(
        &pods,
        json!({
            "metadata": {"name": "server"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{
                    "name": "main", "image": probe_image(), "args": ["serve", "--port", "8080"],
                    "env": downward_env(),
                    "ports": [{"name": "hello", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"port": "hello", "path": "/"}, "periodSeconds": 1},
                }],
            }
        }),
    )
    .await?;
    let server = wait_for_pod(&pods, "server", POD_TIMEOUT, "Ready", is_ready).await?;
    let server_ip = pod_ip(&server);
    assert!(server_ip.starts_with("10.100.129."), "{server_ip}");
    create(
        &pods,
        json!({
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": "node-b"},
                "containers": [{
                    "name": "main", "image": probe_image(),
                    "args": ["connect", "--addr", format!("{server_ip}:8080"), "--expect", "hello from server"],
                }],
            }
        }),
    )
    .await?;
    let client = wait_succeeded(&pods, &ns.name, "client", POD_TIMEOUT).await?;
    let client_ip = pod_ip(&client);
    assert!(
        client_ip.starts_with("10.100.130."),
        "node-b pods get 10.100.130.x, got {client_ip}"
    );
    assert_eq!(client.spec.unwrap().node_name.as_deref(), Some("node-b"));
    // The host reaches the pod address too.
    let reply = http_get(&server_ip, 8080).await?;
    assert!(reply.ends_with("hello from server\n"), "{reply:?}");
    // The server saw both peers.
    let log = wait_for_log(&ns.name, "server", "main", "connection from", POD_TIMEOUT).await?;
    assert!(
        log.contains(&format!("listening on {server_ip}:8080")),
        "{log}"
    );
    ns.delete().await
}

#[tokio::test]
async fn deleting_a_pod_ends_its_process() -> anyhow::Result<()> {
    let ns = TestNamespace::create("delete").await?;
    let pods = ns.api::<Pod>();
    // What each container says also goes to a file on node-a's disk, which outlives the pod.
    let record_dir = node_root("node-a").join("data").join(&ns.name);
    std::fs::create_dir_all(&record_dir)?;
    std::fs::set_permissions(&record_dir, std::fs::Permissions::from_mode(0o777))?;
    for (name, ignore_term) in [("polite", false), ("stubborn", true)] {
        let mut args = vec![
            "sleep".to_owned(),
            "--record".to_owned(),
            format!("/record/{name}"),
        ];
        if ignore_term {
            args.push("--ignore-term".into());
        }
        create(
            &pods,
            json!({
                "metadata": {"name": name},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                    "containers": [{
                        "name": "main", "image": probe_image(), "args": args,
                        "env": [{"name": "FERRY_TEST_POD", "value": format!("{}/{name}", ns.name)}],
                        "volumeMounts": [{"name": "record", "mountPath": "/record"}],
                    }],
                    "volumes": [{"name": "record", "hostPath": {"path": format!("/data/{}", ns.name)}}],
                }
            }),
        )
        .await?;
    }
    let mut pids = Vec::new();
    for name in ["polite", "stubborn"] {
        wait_for_pod(&pods, name, POD_TIMEOUT, "Running", |p| {
            phase(p) == "Running"
        })
        .await?;
        wait_for_log(&ns.name, name, "main", "pid ", POD_TIMEOUT).await?;
        let found = host_pids_with_marker(&format!("{}/{name}", ns.name));
        assert_eq!(
            found.len(),
            1,
            "{name}: one process on the machine, not {found:?}"
        );
        pids.push((name, found[0]));
    }
    let started = std::time::Instant::now();
    for (name, _) in &pids {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    for (name, pid) in &pids {
        wait_until(
            Duration::from_secs(30),
            &format!("pod {name} to be removed"),
            || async { Ok(pods.get_opt(name).await?.is_none()) },
        )
        .await?;
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process of {name} still alive"
        );
    }
    // The polite one got SIGTERM and exited; the stubborn one got it too and was killed after grace.
    for name in ["polite", "stubborn"] {
        let said = std::fs::read_to_string(record_dir.join(name))?;
        assert!(said.contains("received SIGTERM"), "{name}: {said}");
    }
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the stubborn pod got its grace period"
    );
    ns.delete().await
}

#[tokio::test]
async fn secret_owned_by_a_deleted_object_is_garbage_collected() -> anyhow::Result<()> {
    let ns = TestNamespace::create("gc").await?;
    let owner = create(
        &ns.api::<ConfigMap>(),
        json!({"metadata": {"name": "owner"}, "data": {"k": "v"}}),
    )
    .await?;
    let uid = owner.metadata.uid.clone().unwrap();
    let secrets = ns.api::<Secret>();
    create(
        &secrets,
        json!({
            "metadata": {"name": "owned", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
            ]},
            "stringData": {"x": "y"},
        }),
    )
    .await?;
    create(
        &secrets,
        json!({"metadata": {"name": "unowned"}, "stringData": {"x": "y"}}),
    )
    .await?;
    ns.api::<ConfigMap>()
        .delete("owner", &DeleteParams::background())
        .await?;
    wait_until(
        Duration::from_secs(60),
        "the garbage collector to delete the owned secret",
        || async { Ok(secrets.get_opt("owned").await?.is_none()) },
    )
    .await?;
    assert!(
        secrets.get_opt("unowned").await?.is_some(),
        "GC must leave unowned objects alone"
    );
    ns.delete().await
}

#[tokio::test]
async fn pvc_bound_to_a_local_pv_on_node_b_is_written_there() -> anyhow::Result<()> {
    let ns = TestNamespace::create("localpv").await?;
    let client = ns.client.clone();
    let class = format!("local-{}", ns.name);
    let pv_name = format!("pv-{}", ns.name);
    let storage_classes: Api<StorageClass> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    create(
        &storage_classes,
        json!({"metadata": {"name": class}, "provisioner": "kubernetes.io/no-provisioner",
               "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await?;
    let disk_path = format!("/mnt/disks/{}", ns.name);
    // A local PV names a directory the admin made on that node; the kubelet does not create it.
    std::fs::create_dir_all(node_root("node-b").join(disk_path.trim_start_matches('/')))?;
    create(
        &pvs,
        json!({
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                "local": {"path": disk_path},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}
                ]}]}},
            }
        }),
    )
    .await?;
    create(
        &ns.api::<PersistentVolumeClaim>(),
        json!({"metadata": {"name": "claim"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
               "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await?;
    let pods = ns.api::<Pod>();
    // No node selector: the PV's node affinity alone must bring the pod to node-b.
    create(
        &pods,
        json!({
            "metadata": {"name": "writer"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": shell_image(),
                    "command": ["sh", "-c", "printf 'ferry bytes %s' \"$(hostname)\" > /out/file.txt && sync"],
                    "volumeMounts": [{"name": "vol", "mountPath": "/out"}]}],
                "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": "claim"}}],
            }
        }),
    )
    .await?;
    let pod = wait_succeeded(&pods, &ns.name, "writer", POD_TIMEOUT).await?;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("node-b"));
    let claim = ns.api::<PersistentVolumeClaim>().get("claim").await?;
    assert_eq!(
        claim.spec.unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    assert_eq!(claim.status.unwrap().phase.as_deref(), Some("Bound"));
    let on_b = node_root("node-b")
        .join(disk_path.trim_start_matches('/'))
        .join("file.txt");
    assert_eq!(std::fs::read_to_string(&on_b)?, "ferry bytes writer");
    assert!(
        !node_root("node-a")
            .join(disk_path.trim_start_matches('/'))
            .join("file.txt")
            .exists()
    );
    ns.delete().await?;
    pvs.delete(&pv_name, &DeleteParams::default()).await?;
    storage_classes
        .delete(&class, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn deployment_lists_pods_through_its_service_account_within_rbac_only() -> anyhow::Result<()>
{
    let ns = TestNamespace::create("rbac").await?;
    create(
        &ns.api::<ServiceAccount>(),
        json!({"metadata": {"name": "lister"}}),
    )
    .await?;
    create(
        &ns.api::<Role>(),
        json!({"metadata": {"name": "pod-reader"},
               "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}),
    )
    .await?;
    create(
        &ns.api::<RoleBinding>(),
        json!({"metadata": {"name": "lister-reads-pods"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": ns.name}]}),
    )
    .await?;
    create(
        &ns.api::<Deployment>(),
        json!({
            "metadata": {"name": "lister"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "lister"}},
                "template": {
                    "metadata": {"labels": {"app": "lister"}},
                    "spec": {
                        "serviceAccountName": "lister",
                        "containers": [{"name": "main", "image": probe_image(), "args": ["rbac"]}],
                    }
                }
            }
        }),
    )
    .await?;
    let pods = ns.api::<Pod>();
    let deadline = tokio::time::Instant::now() + POD_TIMEOUT;
    let pod_name = loop {
        let list = pods
            .list(&ListParams::default().labels("app=lister"))
            .await?;
        if let Some(p) = list.items.iter().find(|p| phase(p) == "Running") {
            break p.metadata.name.clone().unwrap_or_default();
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the deployment's pod did not run: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = wait_for_log(&ns.name, &pod_name, "main", "rbac {", POD_TIMEOUT).await?;
    let line = log.lines().find_map(|l| l.strip_prefix("rbac ")).unwrap();
    let report: serde_json::Value = serde_json::from_str(line)?;
    assert_eq!(report["namespace"], ns.name.as_str());
    let own = report["own_namespace_pods"].as_str().unwrap();
    assert!(
        own.starts_with("allowed 1 ") && own.contains(&pod_name),
        "{report}"
    );
    assert_eq!(report["kube_system_pods"], "forbidden 403", "{report}");
    assert_eq!(report["own_namespace_secrets"], "forbidden 403", "{report}");
    ns.delete().await
}
