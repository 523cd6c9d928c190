//! The install path on the local cluster, as a user takes it: the chart's manifests and the
//! example Transfers pass the apiserver's own validation; `make demo`'s script runs end to end
//! (the chart installs the operator as a pod under its own service account, a Transfer moves a
//! dataset between nodes); `helm upgrade` with a changed value rolls the operator, and a second
//! demo run finds its blocks in the block store; `helm uninstall` refuses while Transfers exist
//! (the release recovers with `helm rollback`), deletes them when told to, and leaves nothing of
//! the release but the CRD.
//!
//! One test, in steps: each stands on the one before, and no other operator may serve the cluster
//! while the chart's does.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::operator::{k8s_tool, kubectl};
use ferry_cluster_tests::{cluster_dir, container_log, wait_until};

const RELEASE_NS: &str = "ferry-system";

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Runs a program with the cluster's kubeconfig and the Kubernetes tools on PATH; returns its
/// success and its combined output.
fn run(program: &str, args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<(bool, String)> {
    let tools = k8s_tool("helm")?.parent().context("bin dir")?.to_path_buf();
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .env("KUBECONFIG", cluster_dir().join("kubeconfig"))
        .env("PATH", path)
        .output()
        .with_context(|| format!("failed to run {program}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

fn must(program: &str, args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<String> {
    let (ok, out) = run(program, args, envs)?;
    if !ok {
        bail!("{program} {args:?} failed:\n{out}");
    }
    Ok(out)
}

fn helm(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let helm = k8s_tool("helm")?;
    run(helm.to_str().context("helm path")?, args, &[])
}

fn script(rel: &str) -> String {
    repo().join(rel).to_string_lossy().into_owned()
}

/// The demo as the test runs it: built already, a smaller dataset, no bandwidth cap.
fn demo() -> anyhow::Result<String> {
    must(
        &script("tests/demo/run.sh"),
        &[],
        &[
            ("DEMO_SKIP_BUILD", "1"),
            ("DEMO_FILES", "300"),
            ("DEMO_LARGE_MIB", "24"),
            ("DEMO_BANDWIDTH_LIMIT", ""),
        ],
    )
}

/// The number after `label` in the demo's figures ("..., 6 blocks (...) from node-b's block store").
fn dedup_blocks(demo_output: &str) -> anyhow::Result<u64> {
    let line = demo_output
        .lines()
        .find(|l| l.contains("from node-b's block store"))
        .with_context(|| format!("no block-store figure in the demo's output:\n{demo_output}"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "blocks")
        .context("no 'blocks'")?;
    Ok(words[at - 1].parse()?)
}

/// Names of the release's objects of `kind` (cluster-wide), by its instance label.
fn release_objects(kind: &str) -> anyhow::Result<String> {
    kubectl(&[
        "get",
        kind,
        "-A",
        "-l",
        "app.kubernetes.io/instance=ferry",
        "-o",
        "name",
    ])
}

/// Leaves the cluster to the other tests if a step fails: no chart operator, no finalizer
/// waiting for one.
struct UninstallUnlessDone {
    done: bool,
}

impl Drop for UninstallUnlessDone {
    fn drop(&mut self) {
        if !self.done {
            let _ = helm(&[
                "uninstall",
                "ferry",
                "-n",
                RELEASE_NS,
                "--no-hooks",
                "--wait",
            ]);
            if let Ok(names) = kubectl(&["get", "transfers", "-n", "demo", "-o", "name"]) {
                for n in names.lines() {
                    let _ = kubectl(&[
                        "patch",
                        "-n",
                        "demo",
                        n,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ]);
                }
            }
        }
    }
}

async fn operator_pods() -> anyhow::Result<Vec<String>> {
    Ok(kubectl(&[
        "get",
        "pods",
        "-n",
        RELEASE_NS,
        "-l",
        "app.kubernetes.io/instance=ferry,app.kubernetes.io/component=operator",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].args}{\"\\n\"}{end}",
    ])?
    .lines()
    .map(str::to_owned)
    .collect())
}

#[tokio::test]
async fn chart_install_demo_upgrade_and_uninstall() -> anyhow::Result<()> {
    let mut guard = UninstallUnlessDone { done: false };
    let helm_bin = k8s_tool("helm")?;
    let helm_bin = helm_bin.to_str().context("helm path")?;

    // 1. What the chart renders passes the apiserver's validation and admission (no changes).
    let rendered = must(
        helm_bin,
        &[
            "template",
            "ferry",
            &script("charts/ferry"),
            "-n",
            RELEASE_NS,
            "-f",
            &script("charts/ferry/ci/local-values.yaml"),
        ],
        &[],
    )?;
    let manifest = cluster_dir().join("ferry-chart-rendered.yaml");
    std::fs::write(&manifest, &rendered)?;
    if kubectl(&["get", "namespace", RELEASE_NS]).is_err() {
        kubectl(&["create", "namespace", RELEASE_NS])?;
    }
    let dry = kubectl(&[
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "-n",
        RELEASE_NS,
        "-f",
        manifest.to_str().context("path")?,
    ])?;
    for kind in [
        "customresourcedefinition",
        "deployment",
        "clusterrole",
        "job",
    ] {
        assert!(
            dry.to_lowercase().contains(kind),
            "--dry-run=server did not cover a {kind}:\n{dry}"
        );
    }

    // An older CRD applied with kubectl (no printer columns): the chart adopts it and brings it
    // up to date, as `helm upgrade` does for every later CRD change.
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &script("crds/ferry.dev_transfers.yaml"),
    ])?;
    kubectl(&[
        "patch",
        "crd",
        "transfers.ferry.dev",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/versions/0/additionalPrinterColumns"}]"#,
    ])?;
    let columns = || {
        kubectl(&[
            "get",
            "crd",
            "transfers.ferry.dev",
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
        ])
    };
    assert!(columns()?.trim().is_empty());

    // 2. The demo: installs the chart, moves a dataset node-a -> node-b, verifies it.
    let first = demo()?;
    assert!(
        first.contains("node-b's copy is identical"),
        "demo output:\n{first}"
    );
    assert!(first.contains("phase Succeeded"), "demo output:\n{first}");
    assert!(
        columns()?.contains("Progress"),
        "the chart did not update the CRD: columns {:?}",
        columns()?
    );
    let pods = operator_pods().await?;
    assert_eq!(pods.len(), 1, "one operator pod: {pods:?}");
    assert!(pods[0].contains("Running"), "{pods:?}");
    // The operator runs under the chart's service account (it logs whom the apiserver sees).
    let pod_name = pods[0].split_whitespace().next().context("pod name")?;
    let log = container_log(RELEASE_NS, pod_name, "operator").await;
    assert!(
        log.contains("user=system:serviceaccount:ferry-system:ferry-operator"),
        "operator log:\n{log}"
    );

    // The chart's admission policy keeps the operator's Secret writes to its own labelled ones:
    // its service account may not delete someone else's Secret (RBAC alone would let it).
    kubectl(&["create", "namespace", "ferry-policy-test"]).ok();
    kubectl(&[
        "-n",
        "ferry-policy-test",
        "create",
        "secret",
        "generic",
        "tenant-secret",
        "--from-literal=k=v",
    ])?;
    let operator_sa = format!("--as=system:serviceaccount:{RELEASE_NS}:ferry-operator");
    let refused = kubectl(&[
        "-n",
        "ferry-policy-test",
        "delete",
        "secret",
        "tenant-secret",
        &operator_sa,
    ]);
    let message = format!("{refused:?}");
    assert!(
        message.contains("ferry-operator-secrets") && message.contains("managed-by=ferry-operator"),
        "the operator deleted a tenant's Secret: {message}"
    );
    kubectl(&["-n", "ferry-policy-test", "get", "secret", "tenant-secret"])?;
    kubectl(&["delete", "namespace", "ferry-policy-test", "--wait=false"])?;

    // The example Transfers pass the CRD's schema and CEL rules (in a namespace of the test's).
    kubectl(&["create", "namespace", "ferry-examples"]).ok();
    let mut examples = 0;
    for entry in std::fs::read_dir(repo().join("deploy/examples"))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let text = text
            .replace("namespace: ml", "namespace: ferry-examples")
            .replace("namespace: db", "namespace: ferry-examples");
        let copy = cluster_dir().join("example.yaml");
        std::fs::write(&copy, text)?;
        let out = kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            copy.to_str().context("path")?,
        ])
        .with_context(|| format!("example {}", path.display()))?;
        assert!(out.contains("created (server dry run)"), "{out}");
        examples += 1;
    }
    assert!(examples >= 5, "only {examples} examples");
    kubectl(&["delete", "namespace", "ferry-examples", "--wait=false"])?;

    // 3. helm upgrade with a changed value rolls the operator onto the new arguments.
    must(
        &script("tests/demo/deploy-local.sh"),
        &["--set", "maxActive=7"],
        &[],
    )?;
    wait_until(
        Duration::from_secs(120),
        "the upgraded operator pod alone",
        || async {
            let pods = operator_pods().await?;
            Ok(
                pods.len() == 1
                    && pods[0].contains("--max-active=7")
                    && pods[0].contains("Running"),
            )
        },
    )
    .await?;

    // 4. The demo again, under the upgraded operator: the blocks come from node-b's block store.
    let second = demo()?;
    assert!(
        second.contains("node-b's copy is identical"),
        "demo output:\n{second}"
    );
    assert!(
        dedup_blocks(&second)? > 0,
        "no block-store hits the second time:\n{second}"
    );

    // 5. Uninstall refuses while a Transfer exists, naming it, and changes nothing else.
    let (ok, out) = helm(&["uninstall", "ferry", "-n", RELEASE_NS, "--timeout", "2m"])?;
    assert!(
        !ok,
        "helm uninstall succeeded with a Transfer in place:\n{out}"
    );
    let message = kubectl(&[
        "get",
        "pods",
        "-n",
        RELEASE_NS,
        "-l",
        "app.kubernetes.io/component=pre-delete",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[0].state.terminated.message}",
    ])?;
    assert!(
        message.contains("demo/stage-imagenet") && message.contains("deleteTransfers=true"),
        "the hook's message does not name the Transfer and the way out: {message:?}\nhelm: {out}"
    );
    kubectl(&["get", "transfer", "-n", "demo", "stage-imagenet"])?;
    assert_eq!(
        operator_pods().await?.len(),
        1,
        "the operator must keep running"
    );
    // Helm leaves a release whose pre-delete hook failed as 'uninstalling'; a rollback makes it
    // deployed again (the way out the refusal names).
    let (_, status) = helm(&["status", "ferry", "-n", RELEASE_NS])?;
    assert!(status.contains("STATUS: uninstalling"), "{status}");
    let (ok, out) = helm(&["rollback", "ferry", "-n", RELEASE_NS, "--wait"])?;
    assert!(ok, "helm rollback failed:\n{out}");
    let (ok, status) = helm(&["status", "ferry", "-n", RELEASE_NS])?;
    assert!(ok && status.contains("STATUS: deployed"), "{status}");

    // 6. Told to, the uninstall deletes the Transfers (the operator cleans them up), then leaves
    //    nothing of the release but the kept CRD; the demo namespace deletes without hanging.
    must(
        &script("tests/demo/deploy-local.sh"),
        &["--reuse-values", "--set", "uninstall.deleteTransfers=true"],
        &[],
    )?;
    let (ok, out) = helm(&[
        "uninstall",
        "ferry",
        "-n",
        RELEASE_NS,
        "--wait",
        "--timeout",
        "3m",
    ])?;
    assert!(ok, "helm uninstall failed:\n{out}");
    let left = kubectl(&["get", "transfers", "-A", "-o", "name"])?;
    assert!(left.trim().is_empty(), "Transfers left: {left}");
    for kind in [
        "deployments",
        "pods",
        "serviceaccounts",
        "services",
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
        "jobs",
    ] {
        let objs = release_objects(kind)?;
        // Terminating pods may linger for their grace period; wait for them.
        if !objs.trim().is_empty() {
            wait_until(
                Duration::from_secs(60),
                &format!("no {kind} of the release"),
                || async { Ok(release_objects(kind)?.trim().is_empty()) },
            )
            .await?;
        }
    }
    let secrets = kubectl(&[
        "get",
        "secrets",
        "-A",
        "-l",
        "ferry.dev/transfer",
        "-o",
        "name",
    ])?;
    assert!(secrets.trim().is_empty(), "mover Secrets left: {secrets}");
    kubectl(&["get", "crd", "transfers.ferry.dev"])?;
    kubectl(&["delete", "namespace", "demo", "--wait", "--timeout=60s"])?;
    guard.done = true;
    Ok(())
}
