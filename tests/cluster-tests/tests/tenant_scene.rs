//! The node services under a hostile tenant, on the real nodes. Namespace `mallory` turns the
//! receiver certificates of its own Transfers (it reads their attempt Secrets, as any tenant
//! can) against every node's service, from pods labelled as receivers (the labels are a
//! tenant's to set, so the NetworkPolicy lets them through): Takes of its own blocks it never
//! reads, Puts held just short of their end, and probes of blocks it does not hold. Meanwhile
//! namespace `alice` runs a fan-out and two copies into provisioned claims, all with dedup. Alice's
//! Transfers succeed in at most 1.5x the time they took without mallory, and mallory's probes of
//! blocks alice stored read the same as its probes of blocks no one stored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferry_cluster_tests::transfers::{
    self, NODE_A, NODE_B, NODE_C, SharedOperator, make_tree, wait_phase,
};
use ferry_cluster_tests::*;
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const HOST_ROOT: &str = "/data/ferry-scene";
const BLOCK: usize = 4 << 20;

static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-scene", HOST_ROOT);

/// Alice's work: a fan-out from node-a to node-b and node-c and two copies into claims, of a
/// tree of fresh content (seeded by `tag`); returns how long until all three succeeded, and the
/// hashes of the fan-out's first blocks (what the stores of node-b and node-c now hold).
async fn alice(ns: &TestNamespace, tag: &str) -> anyhow::Result<(Duration, Vec<String>)> {
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, &format!("src-{tag}"))?;
    make_tree(&src_host, 20, 24, &format!("{}-{tag}", ns.name))?;
    let (dst, _) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, &format!("dst-{tag}"))?;
    for n in [NODE_B, NODE_C] {
        transfers::node_dir(HOST_ROOT, n, &ns.name, &format!("dst-{tag}"))?;
    }
    let source = json!({"hostPath": {"node": NODE_A, "path": src}});
    let api: Api<Transfer> = ns.api();
    let specs = [
        (
            format!("fan-{tag}"),
            json!({"hostPath": {"nodes": [NODE_B, NODE_C], "path": dst}}),
        ),
        (
            format!("claim1-{tag}"),
            json!({"pvc": {"claimName": format!("c1-{tag}"), "provision": {"capacity": "1Gi"}}}),
        ),
        (
            format!("claim2-{tag}"),
            json!({"pvc": {"claimName": format!("c2-{tag}"), "provision": {"capacity": "1Gi"}}}),
        ),
    ];
    let started = Instant::now();
    for (name, destination) in &specs {
        let t: Transfer = from_json(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name},
            "spec": {"source": source, "destination": destination, "dedup": true},
        }))?;
        api.create(&PostParams::default(), &t).await?;
    }
    for (name, _) in &specs {
        wait_phase(&api, name, Duration::from_secs(300), Phase::Succeeded).await?;
    }
    let took = started.elapsed();
    // The tree's large files are its blocks: the first block of each.
    let mut hashes = Vec::new();
    for entry in walk(&src_host)? {
        let data = std::fs::read(&entry)?;
        if data.len() >= BLOCK {
            hashes.push(blake3::hash(&data[..BLOCK]).to_hex().to_string());
        }
    }
    anyhow::ensure!(!hashes.is_empty(), "alice's tree has no full block");
    Ok((took, hashes))
}

fn walk(dir: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

/// Mallory's receiver certificate at node `node`: a Transfer to that node slowed to a crawl,
/// whose attempt Secret mallory copies while its receiver runs. Returns the copy's name and the
/// transfer id the certificate names.
async fn loot(ns: &TestNamespace, node: &str, src: &str) -> anyhow::Result<(String, String)> {
    let name = format!("m-{node}");
    let (dst, _) = transfers::node_dir(HOST_ROOT, node, &ns.name, &name)?;
    let api: Api<Transfer> = ns.api();
    let t = create(
        &api,
        json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name},
            "spec": {
                "source": {"hostPath": {"node": NODE_A, "path": src}},
                "destination": {"hostPath": {"node": node, "path": dst}},
                "dedup": true, "bandwidthLimit": "1Ki",
            }
        }),
    )
    .await?;
    let uid = t.metadata.uid.context("uid")?;
    let secret = ferry_operator::names::secret_name(&uid, 1, 1);
    let secrets: Api<Secret> = ns.api();
    let deadline = Instant::now() + Duration::from_secs(120);
    let data = loop {
        if let Some(s) = secrets.get_opt(&secret).await?
            && let Some(d) = s.data
        {
            break d;
        }
        anyhow::ensure!(Instant::now() < deadline, "no attempt Secret {secret}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let copy = format!("loot-{node}");
    let keep: BTreeMap<_, _> = data
        .into_iter()
        .filter(|(k, _)| matches!(k.as_str(), "ca.crt" | "receiver.crt" | "receiver.key"))
        .collect();
    create(&secrets, json!({"metadata": {"name": copy}, "data": keep})).await?;
    Ok((copy, ferry_operator::names::transfer_id(&uid, 1)))
}

#[tokio::test]
async fn a_hostile_tenant_neither_slows_another_much_nor_learns_what_it_stores()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let nodes = [NODE_A, NODE_B, NODE_C];
    operator::wait_node_service_in(Cluster::Main, &nodes).await?;
    let alice_ns = TestNamespace::create("alice").await?;
    let mallory_ns = TestNamespace::create("mallory").await?;

    // The first run pays for what later ones find ready (images on the nodes, the
    // provisioner's helper): it is not the measure.
    alice(&alice_ns, "warm").await?;
    let (quiet, held) = alice(&alice_ns, "quiet").await?;

    // Mallory's certificates, one per node, then its clients against every node's service.
    let (m_src, m_src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &mallory_ns.name, "src")?;
    make_tree(&m_src_host, 0, 8, &mallory_ns.name)?;
    let attack_seconds = 150;
    let pods: Api<Pod> = mallory_ns.api();
    for node in nodes {
        let (secret, transfer_id) = loot(&mallory_ns, node, &m_src).await?;
        let service = pod_ip(
            &operator::node_service_pod(node)
                .await?
                .context("node service")?,
        );
        create(
            &pods,
            json!({
                "metadata": {
                    "name": format!("mallory-{node}"),
                    // What a receiver carries: mallory's own pods may carry it too.
                    "labels": {"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/role": "receiver"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{
                        "name": "main", "image": probe_image(),
                        "args": ["mallory", "--service", format!("{service}:7443"),
                                 "--certs", "/certs", "--transfer-id", transfer_id,
                                 "--seconds", attack_seconds.to_string(),
                                 "--present", held.join(",")],
                        // A tenant's pods run within its quota.
                        "resources": {"limits": {"cpu": "100m", "memory": "512Mi"}},
                        "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": true}],
                    }],
                    "volumes": [{"name": "certs", "secret": {"secretName": secret}}],
                }
            }),
        )
        .await?;
    }
    for node in nodes {
        wait_for_pod(
            &pods,
            &format!("mallory-{node}"),
            Duration::from_secs(120),
            "running",
            |p| phase(p) == "Running",
        )
        .await?;
    }
    // The attack in place (its stalls open within a second or two).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let attack_started = Instant::now();
    let (loud, _) = alice(&alice_ns, "loud").await?;
    let ratio = loud.as_secs_f64() / quiet.as_secs_f64();
    eprintln!(
        "alice's fan-out and two claim copies: {:.1} s alone, {:.1} s beside mallory: {ratio:.2}x",
        quiet.as_secs_f64(),
        loud.as_secs_f64()
    );
    anyhow::ensure!(
        attack_started.elapsed() < Duration::from_secs(attack_seconds),
        "alice finished after mallory stopped: the attack did not cover the run"
    );
    assert!(ratio <= 1.5, "alice took {ratio:.2}x beside mallory");

    for node in nodes {
        let name = format!("mallory-{node}");
        wait_succeeded(&pods, &mallory_ns.name, &name, Duration::from_secs(300)).await?;
        let log = container_log(&mallory_ns.name, &name, "main").await;
        let report: serde_json::Value = serde_json::from_str(log.lines().last().unwrap_or(""))
            .with_context(|| format!("{name}'s report: {log}"))?;
        eprintln!("{name}: {report}");
        // The attack was real: it held Takes of its own blocks and opened partial Puts.
        assert!(report["takes_held"].as_u64() > Some(0), "{report}");
        assert!(report["partial_puts"].as_u64() > Some(0), "{report}");
        // And learned nothing: no bytes either way, the same time either way.
        let p = &report["probes"];
        assert!(p["probes"].as_u64() > Some(100), "{report}");
        assert_eq!(p["held_bytes"], 0, "{report}");
        assert_eq!(p["absent_bytes"], 0, "{report}");
        let (h, a) = (
            p["held_ms"].as_f64().unwrap(),
            p["absent_ms"].as_f64().unwrap(),
        );
        assert!(
            (h - a).abs() <= 1.0 + 0.25 * h.max(a),
            "probes of held blocks took {h:.2} ms, of absent ones {a:.2} ms"
        );
    }
    let _ = pods
        .delete_collection(&Default::default(), &ListParams::default())
        .await;
    Ok(())
}
