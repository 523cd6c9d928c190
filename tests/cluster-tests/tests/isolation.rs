//! Tenant isolation on the real nodes: a Transfer reaches only what its namespace was granted.
//! Symlinks on the way to a host path are refused (the kubelet would follow them), a destination
//! that contains its source is refused before any pod runs, read-only and per-namespace grants
//! hold, a new destination directory is created beneath its granted root, and two Transfers
//! never write one destination at once.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::transfers::{
    self, MOVER_UID, NODE_A, NODE_B, SharedOperator, assert_same_tree, make_tree, transfer,
    wait_phase,
};
use ferry_cluster_tests::{TestNamespace, node_root};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

/// The read-write root every namespace is granted.
const HOST_ROOT: &str = "/data/ferry-iso";

static OPERATOR: SharedOperator = SharedOperator::with_flags(
    "ferry-operator-iso",
    HOST_ROOT,
    &[
        "--host-root",
        "*=/data/ferry-iso-shared:ro",
        "--host-root",
        "*=/data/ferry-iso-tenants/{namespace}",
        "--allow-privileged-readers",
    ],
);

fn node_dir(node: &str, ns: &str, name: &str) -> anyhow::Result<(String, std::path::PathBuf)> {
    transfers::node_dir(HOST_ROOT, node, ns, name)
}

async fn mover_pods(ns: &TestNamespace) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = ns.api();
    Ok(pods
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator"))
        .await?
        .items)
}

/// Waits until the Transfer's Ready condition has `reason`; returns its message.
async fn wait_reason(api: &Api<Transfer>, name: &str, reason: &str) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let t = api.get(name).await?;
        let st = t.status.unwrap_or_default();
        if let Some(c) = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == reason)
        {
            return Ok(c.message.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{name} did not report {reason}: {:?}",
            st.conditions
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every file under `dir` with its content, to show nothing changed.
fn snapshot(dir: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for entry in walk(dir)? {
        let rel = entry.strip_prefix(dir)?.display().to_string();
        let content = if entry.is_file() {
            std::fs::read(&entry)?
        } else {
            Vec::new()
        };
        out.push((rel, content));
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p)?);
        }
        out.push(p);
    }
    Ok(out)
}

#[tokio::test]
async fn a_symlink_on_the_way_to_a_host_path_is_refused_and_nothing_outside_is_touched()
-> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-symlink").await?;
    // Outside every grant, on both nodes: what an escaping Transfer would read or write.
    let outside_rel = format!("data/ferry-iso-outside/{}", ns.name);
    for node in [NODE_A, NODE_B] {
        let outside = node_root(node).join(&outside_rel);
        std::fs::create_dir_all(outside.join("sub"))?;
        std::fs::write(outside.join("secret.txt"), b"node's own file")?;
        std::os::unix::fs::chown(&outside, Some(MOVER_UID), Some(MOVER_UID))?;
        std::os::unix::fs::chown(outside.join("sub"), Some(MOVER_UID), Some(MOVER_UID))?;
    }
    let before_b = snapshot(&node_root(NODE_B).join(&outside_rel))?;
    // A tenant planted `esc -> /data/ferry-iso-outside/<ns>` inside its granted directory.
    let (tenant_a, tenant_a_host) = node_dir(NODE_A, &ns.name, "t")?;
    let (tenant_b, tenant_b_host) = node_dir(NODE_B, &ns.name, "t")?;
    for host in [&tenant_a_host, &tenant_b_host] {
        std::os::unix::fs::symlink(format!("/{outside_rel}"), host.join("esc"))?;
    }
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 20, 1, &ns.name)?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();
    let cases = [
        // Writing through the link, at its end and in the middle of the path.
        (
            "write-last",
            (NODE_A, src.clone()),
            (NODE_B, format!("{tenant_b}/esc")),
        ),
        (
            "write-mid",
            (NODE_A, src.clone()),
            (NODE_B, format!("{tenant_b}/esc/sub")),
        ),
        // Reading through it.
        (
            "read",
            (NODE_A, format!("{tenant_a}/esc")),
            (NODE_B, dst.clone()),
        ),
    ];
    for (name, s, d) in &cases {
        api.create(
            &PostParams::default(),
            &transfer(
                name,
                (s.0, &s.1),
                (d.0, &d.1),
                serde_json::json!({"deleteExtraneous": true}),
            )?,
        )
        .await?;
    }
    for (name, _, _) in &cases {
        let t = wait_phase(&api, name, Duration::from_secs(120), Phase::Failed).await?;
        let st = t.status.context("status")?;
        let text = format!("{:?}", st.conditions);
        assert!(
            text.contains("symbolic link"),
            "{name}: the status does not say why: {text}"
        );
        assert_eq!(st.attempts, 1, "{name}: a symlink is no reason to retry");
    }
    assert_eq!(
        snapshot(&node_root(NODE_B).join(&outside_rel))?,
        before_b,
        "a Transfer wrote outside its grant"
    );
    assert!(
        std::fs::read_dir(&dst_host)?.next().is_none(),
        "the node's own files were read into the destination"
    );
    ns.delete().await
}

#[tokio::test]
async fn a_destination_that_contains_its_source_is_refused_before_any_pod() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-overlap").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "data")?;
    make_tree(&src_host, 10, 1, &ns.name)?;
    let before = snapshot(&src_host)?;
    let api: Api<Transfer> = ns.api();
    let parent = Path::new(&src)
        .parent()
        .context("parent")?
        .display()
        .to_string();
    for (name, dst) in [
        ("into-itself", format!("{src}/copy")),
        ("around-it", parent),
    ] {
        api.create(
            &PostParams::default(),
            &transfer(
                name,
                (NODE_A, &src),
                (NODE_A, &dst),
                serde_json::json!({"deleteExtraneous": true}),
            )?,
        )
        .await?;
        let message = wait_reason(&api, name, "SourceDestinationOverlap").await?;
        assert!(message.contains("overlap"), "{message}");
    }
    assert!(mover_pods(&ns).await?.is_empty(), "a mover pod ran");
    assert_eq!(snapshot(&src_host)?, before, "the source changed");
    ns.delete().await
}

#[tokio::test]
async fn read_only_and_per_namespace_grants_hold() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-grants").await?;
    let (src, _) = node_dir(NODE_A, &ns.name, "src")?;
    let api: Api<Transfer> = ns.api();
    let cases = [
        (
            "into-shared",
            "/data/ferry-iso-shared/out".to_owned(),
            "may only read",
        ),
        (
            "into-another-tenant",
            "/data/ferry-iso-tenants/someone-else/x".to_owned(),
            "not under a host root granted",
        ),
    ];
    for (name, dst, _) in &cases {
        api.create(
            &PostParams::default(),
            &transfer(name, (NODE_A, &src), (NODE_B, dst), serde_json::json!({}))?,
        )
        .await?;
    }
    for (name, _, says) in &cases {
        let message = wait_reason(&api, name, "HostPathNotAllowed").await?;
        assert!(message.contains(says), "{name}: {message}");
    }
    assert!(mover_pods(&ns).await?.is_empty(), "a mover pod ran");
    ns.delete().await
}

#[tokio::test]
async fn a_new_destination_directory_is_created_beneath_the_granted_root() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-newdir").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 30, 2, &ns.name)?;
    // Nothing of the destination exists yet but the granted root (prepared by the test's admin
    // step, owned by the movers' uid).
    let dst = format!("{HOST_ROOT}/{}/fresh/deeper/dst", ns.name);
    let dst_host = node_root(NODE_B).join(dst.trim_start_matches('/'));
    assert!(!dst_host.exists());
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "fresh",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    wait_phase(&api, "fresh", Duration::from_secs(120), Phase::Succeeded).await?;
    assert_eq!(assert_same_tree(&src_host, &dst_host)?, 31);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&dst_host)?.uid(), MOVER_UID);
    ns.delete().await
}

#[tokio::test]
async fn a_missing_source_fails_at_once_and_is_never_ready() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-missing").await?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    let (parent, _) = node_dir(NODE_A, &ns.name, "here")?;
    let src = format!("{parent}/no-such-dir");
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "missing",
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let mut seen_ready = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let st = loop {
        let st = api.get("missing").await?.status.unwrap_or_default();
        seen_ready |= st
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if st.phase == Phase::Failed {
            break st;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the Transfer did not fail: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!seen_ready, "a Transfer without a source showed Ready=True");
    assert_eq!(st.attempts, 1, "a missing source is no reason to retry");
    let text = format!("{:?}", st.conditions);
    assert!(text.contains("no-such-dir"), "{text}");
    ns.delete().await
}

#[tokio::test]
async fn a_second_transfer_into_the_same_destination_waits_for_the_first() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-exclusive").await?;
    let (src1, src1_host) = node_dir(NODE_A, &ns.name, "src1")?;
    let (src2, src2_host) = node_dir(NODE_A, &ns.name, "src2")?;
    make_tree(&src1_host, 10, 8, &format!("{}-1", ns.name))?;
    make_tree(&src2_host, 10, 1, &format!("{}-2", ns.name))?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    let api: Api<Transfer> = ns.api();
    // The first runs slowly enough to be running when the second arrives.
    api.create(
        &PostParams::default(),
        &transfer(
            "first",
            (NODE_A, &src1),
            (NODE_B, &dst),
            serde_json::json!({"bandwidthLimit": "2Mi"}),
        )?,
    )
    .await?;
    wait_phase(&api, "first", Duration::from_secs(120), Phase::Running).await?;
    api.create(
        &PostParams::default(),
        &transfer(
            "second",
            (NODE_A, &src2),
            (NODE_B, &format!("{dst}/")),
            serde_json::json!({"deleteExtraneous": true}),
        )?,
    )
    .await?;
    let message = wait_reason(&api, "second", "DestinationInUse").await?;
    assert!(message.contains(&format!("{}/first", ns.name)), "{message}");
    let first = wait_phase(&api, "first", Duration::from_secs(180), Phase::Succeeded).await?;
    let second = wait_phase(&api, "second", Duration::from_secs(180), Phase::Succeeded).await?;
    let (f, s) = (
        first
            .status
            .and_then(|s| s.completion_time)
            .context("first done")?,
        second
            .status
            .and_then(|s| s.start_time)
            .context("second started")?,
    );
    assert!(
        s.0 >= f.0,
        "the second started ({s:?}) before the first finished ({f:?})"
    );
    assert_same_tree(&src2_host, &dst_host)?;
    ns.delete().await
}

#[tokio::test]
async fn a_root_owned_source_is_read_only_by_a_privileged_reader() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let ns = TestNamespace::create("iso-reader").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    make_tree(&src_host, 10, 1, &ns.name)?;
    // What the movers' uid cannot read: a root-owned 0640 file in a root-owned 0700 directory.
    let private = src_host.join("private");
    std::fs::create_dir(&private)?;
    std::fs::write(private.join("secret.bin"), b"root's own bytes")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        private.join("secret.bin"),
        std::fs::Permissions::from_mode(0o640),
    )?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let api: Api<Transfer> = ns.api();
    // As the movers' uid it fails at once, naming the directory.
    let (dst1, _) = node_dir(NODE_B, &ns.name, "plain")?;
    api.create(
        &PostParams::default(),
        &transfer(
            "plain",
            (NODE_A, &src),
            (NODE_B, &dst1),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let t = wait_phase(&api, "plain", Duration::from_secs(120), Phase::Failed).await?;
    let st = t.status.context("status")?;
    assert_eq!(st.attempts, 1, "permission denied is no reason to retry");
    let text = format!("{:?}", st.conditions);
    assert!(
        text.contains("SourceUnreadable") && text.contains("private"),
        "{text}"
    );
    // With readAllFiles the sender (uid 0, CAP_DAC_READ_SEARCH alone) reads it all.
    let (dst2, dst2_host) = node_dir(NODE_B, &ns.name, "reader")?;
    api.create(
        &PostParams::default(),
        &transfer(
            "reader",
            (NODE_A, &src),
            (NODE_B, &dst2),
            serde_json::json!({"readAllFiles": true}),
        )?,
    )
    .await?;
    wait_phase(&api, "reader", Duration::from_secs(120), Phase::Succeeded).await?;
    assert_eq!(
        std::fs::read(dst2_host.join("private/secret.bin"))?,
        b"root's own bytes"
    );
    // The source is untouched: the reader writes nothing.
    assert_eq!(
        std::fs::read(private.join("secret.bin"))?,
        b"root's own bytes"
    );
    ns.delete().await
}
