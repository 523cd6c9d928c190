//! `--max-active` shared fairly across namespaces on the real nodes: one namespace's 50 queued
//! Transfers do not starve another namespace's one, which takes the next free slot; queued
//! Transfers show their place in line and why they wait.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::TestNamespace;
use ferry_cluster_tests::transfers::{self, NODE_A, NODE_B, SharedOperator, transfer};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, PostParams};

const HOST_ROOT: &str = "/data/ferry-fair";
const BULK: usize = 50;

static OPERATOR: SharedOperator =
    SharedOperator::with_flags("ferry-operator-fair", HOST_ROOT, &["--max-active", "2"]);

/// A Transfer of `src` (2 MiB) at 1 MiB/s: it holds its slot for about two seconds.
async fn create(api: &Api<Transfer>, ns: &str, name: &str, src: &str) -> anyhow::Result<()> {
    let dst = transfers::node_dir(HOST_ROOT, NODE_B, ns, name)?.0;
    let extra = serde_json::json!({"bandwidthLimit": "1Mi", "compression": "none", "dedup": false});
    api.create(
        &PostParams::default(),
        &transfer(name, (NODE_A, src), (NODE_B, &dst), extra)?,
    )
    .await?;
    Ok(())
}

fn started(t: &Transfer) -> bool {
    t.status.as_ref().is_some_and(|s| s.start_time.is_some())
}

#[tokio::test]
async fn another_namespaces_one_transfer_goes_before_fifty_queued() -> anyhow::Result<()> {
    OPERATOR.ensure().await?;
    let bulk = TestNamespace::create("fair-bulk").await?;
    let solo = TestNamespace::create("fair-solo").await?;
    let (bulk_src, bulk_host) = transfers::node_dir(HOST_ROOT, NODE_A, &bulk.name, "src")?;
    let (solo_src, solo_host) = transfers::node_dir(HOST_ROOT, NODE_A, &solo.name, "src")?;
    for dir in [&bulk_host, &solo_host] {
        let body: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join("data.bin"), body)?;
        std::os::unix::fs::chown(dir.join("data.bin"), Some(65532), Some(65532))?;
    }
    let bulk_api: Api<Transfer> = bulk.api();
    for i in 0..BULK {
        create(&bulk_api, &bulk.name, &format!("b{i:02}"), &bulk_src).await?;
    }
    // The queue forms: two run, the rest wait with their place and reason.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let queued = loop {
        let queued: Vec<Transfer> = bulk_api
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|t| t.status.as_ref().is_some_and(|s| s.queue.is_some()))
            .collect();
        if queued.len() >= BULK / 2 {
            break queued;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no queue of bulk Transfers formed: {} queued",
            queued.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let q = queued[0]
        .status
        .as_ref()
        .and_then(|s| s.queue.clone())
        .context("queue")?;
    assert!(q.position >= 1 && q.position <= q.waiting, "{q:?}");
    let ready = queued[0]
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .context("Ready")?;
    assert!(
        ready.message.starts_with("queued:") && ready.message.contains("limit"),
        "{}",
        ready.message
    );
    // Those of the bulk still waiting when the solo Transfer arrives.
    let waiting_bulk: Vec<String> = bulk_api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|t| !started(t))
        .filter_map(|t| t.metadata.name)
        .collect();
    assert!(waiting_bulk.len() > 10, "{waiting_bulk:?}");
    let solo_api: Api<Transfer> = solo.api();
    create(&solo_api, &solo.name, "one", &solo_src).await?;
    // The solo Transfer takes the next free slot: at most the two slots' worth of bulk
    // Transfers (already on their way when the solo one was applied) start before it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut started_before = Vec::new();
    while !started(&solo_api.get("one").await?) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the solo Transfer did not start; bulk ones started meanwhile: {started_before:?}"
        );
        started_before = bulk_api
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(started)
            .filter_map(|t| t.metadata.name)
            .filter(|n| waiting_bulk.contains(n))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        started_before.len() <= 2,
        "bulk Transfers queued before it started first: {started_before:?}"
    );
    let done =
        transfers::wait_phase(&solo_api, "one", Duration::from_secs(60), Phase::Succeeded).await?;
    assert_eq!(done.status.context("status")?.attempts, 1);
    solo.delete().await?;
    bulk.delete().await
}
