//! Destination claims the operator provisions, bound by the local cluster's real dynamic
//! provisioner (local-path, the default StorageClass, WaitForFirstConsumer): created when
//! missing, filled, identical to the source, kept when the Transfer goes; sized from a source
//! claim; never resized (a claim too small is a condition); a capacity that is not a quantity
//! refused at apply.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::transfers::{
    NODE_A, SharedOperator, assert_same_tree, claim_request, make_tree, node_dir, wait_phase,
    wait_status,
};
use ferry_cluster_tests::{TestNamespace, events_of, node_root, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const HOST_ROOT: &str = "/data/ferry-provision";
static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-provision", HOST_ROOT);

fn transfer(
    name: &str,
    source: serde_json::Value,
    claim: &str,
    provision: serde_json::Value,
) -> anyhow::Result<Transfer> {
    ferry_cluster_tests::from_json(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name},
        "spec": {
            "source": source,
            "destination": {"pvc": {"claimName": claim, "provision": provision}},
        }
    }))
}

/// The directory on its node's disk of the volume bound to claim `name`.
async fn volume_dir(ns: &TestNamespace, name: &str) -> anyhow::Result<PathBuf> {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let claim = claims.get(name).await?;
    let pv_name = claim
        .spec
        .and_then(|s| s.volume_name)
        .context("the claim is not bound")?;
    let pvs: Api<PersistentVolume> = Api::all(ns.client.clone());
    let pv = pvs.get(&pv_name).await?;
    let spec = pv.spec.context("PV spec")?;
    let path = spec
        .local
        .map(|l| l.path)
        .or(spec.host_path.map(|h| h.path))
        .context("a local-path volume has a local or hostPath path")?;
    let node = spec
        .node_affinity
        .and_then(|a| a.required)
        .and_then(|r| r.node_selector_terms.into_iter().next())
        .and_then(|t| t.match_expressions)
        .and_then(|e| e.into_iter().find(|e| e.key == "kubernetes.io/hostname"))
        .and_then(|e| e.values)
        .and_then(|v| v.into_iter().next())
        .context("a local volume is pinned to its node")?;
    Ok(node_root(&node).join(path.trim_start_matches('/')))
}

async fn claim_phase(ns: &TestNamespace, name: &str) -> anyhow::Result<Option<String>> {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    Ok(claims
        .get_opt(name)
        .await?
        .and_then(|c| c.status)
        .and_then(|s| s.phase))
}

#[tokio::test]
async fn a_provisioned_claim_is_created_bound_filled_kept_and_sizes_the_next_from_it()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("provision").await?;
    let (src, src_host) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 30, 4, "provision")?;
    let api: Api<Transfer> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    anyhow::ensure!(claims.get_opt("copy").await?.is_none());

    let first = transfer(
        "fill",
        json!({"hostPath": {"node": NODE_A, "path": src}}),
        "copy",
        json!({"capacity": "64Mi"}),
    )?;
    api.create(&PostParams::default(), &first).await?;
    wait_phase(&api, "fill", Duration::from_secs(120), Phase::Succeeded).await?;
    let claim = claims.get("copy").await?;
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("ferry.dev/provisioned-for").map(String::as_str),
        Some("fill")
    );
    assert!(claim.metadata.owner_references.is_none(), "{claim:?}");
    let spec = claim.spec.clone().context("spec")?;
    assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
    assert_eq!(claim_phase(&ns, "copy").await?.as_deref(), Some("Bound"));
    let copy_dir = volume_dir(&ns, "copy").await?;
    assert_eq!(assert_same_tree(&src_host, &copy_dir)?, 30 + 1);
    let notes = events_of(&ns.name, "fill", "ClaimProvisioned").await?;
    assert!(
        notes
            .iter()
            .any(|n| n == "creating PersistentVolumeClaim copy (64Mi, the default StorageClass)"),
        "{notes:?}"
    );

    // Deleting the Transfer leaves the claim and its data.
    api.delete("fill", &DeleteParams::default()).await?;
    wait_until(Duration::from_secs(60), "the Transfer gone", || {
        let api = api.clone();
        async move { Ok(api.get_opt("fill").await?.is_none()) }
    })
    .await?;
    assert_eq!(claim_phase(&ns, "copy").await?.as_deref(), Some("Bound"));
    assert_same_tree(&src_host, &copy_dir)?;

    // A claim sized from that one: 64 MiB and 10 % headroom, in whole MiB.
    let second = transfer(
        "clone",
        json!({"pvc": {"claimName": "copy"}}),
        "copy-2",
        json!({"capacity": "fromSource"}),
    )?;
    api.create(&PostParams::default(), &second).await?;
    wait_phase(&api, "clone", Duration::from_secs(120), Phase::Succeeded).await?;
    let request = claim_request(&claims, "copy-2").await?;
    assert_eq!(request, "71Mi");
    assert_same_tree(&src_host, &volume_dir(&ns, "copy-2").await?)?;
    Ok(())
}

#[tokio::test]
async fn a_claim_too_small_is_not_resized_and_a_capacity_that_is_no_quantity_is_refused()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("provision-bad").await?;
    let (src, _) = node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    let api: Api<Transfer> = ns.api();
    let source = json!({"hostPath": {"node": NODE_A, "path": src}});

    // Sent as written (a typed Transfer could not even hold some of them).
    for (name, source, provision, message) in [
        (
            "words",
            &source,
            json!({"capacity": "lots"}),
            "provision.capacity is a quantity",
        ),
        (
            "zero",
            &source,
            json!({"capacity": "0"}),
            "provision.capacity must be more than 0",
        ),
        (
            "block",
            &source,
            json!({"capacity": "1Gi", "volumeMode": "Block"}),
            "Unsupported value: \"Block\"",
        ),
        (
            "from-host",
            &source,
            json!({"capacity": "fromSource"}),
            "give a quantity for a hostPath",
        ),
        (
            "on-source",
            &json!({"pvc": {"claimName": "in", "provision": {"capacity": "1Gi"}}}),
            json!({"capacity": "1Gi"}),
            "provision creates a destination claim",
        ),
    ] {
        let manifest = json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name},
            "spec": {
                "source": source,
                "destination": {"pvc": {"claimName": name, "provision": provision}},
            }
        });
        let err = api
            .patch(
                name,
                &PatchParams::apply("provision-test"),
                &Patch::Apply(&manifest),
            )
            .await
            .expect_err(&format!("{name} was accepted"));
        assert!(err.to_string().contains(message), "{name}: {err}");
    }

    // An existing claim of 8 MiB, asked to hold 1 GiB: a condition, nothing created.
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let small: PersistentVolumeClaim = ferry_cluster_tests::from_json(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "small"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}}},
    }))?;
    claims.create(&PostParams::default(), &small).await?;
    let t = transfer("too-small", source, "small", json!({"capacity": "1Gi"}))?;
    api.create(&PostParams::default(), &t).await?;
    let st = wait_status(
        &api,
        "too-small",
        Duration::from_secs(60),
        "the ClaimTooSmall condition",
        |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "ClaimTooSmall")
        },
    )
    .await?;
    let message = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("ferry does not resize claims"),
        "{message}"
    );
    let request = claim_request(&claims, "small").await?;
    assert_eq!(request, "8Mi", "the claim was resized");
    let pods: Api<Pod> = ns.api();
    assert!(pods.list(&ListParams::default()).await?.items.is_empty());
    Ok(())
}
