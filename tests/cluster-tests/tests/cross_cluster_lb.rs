//! A cross-cluster Transfer whose receiver sits behind a LoadBalancer Service (MetalLB in the
//! local clusters) instead of a NodePort: east's operator runs with
//! `--peering-service-type LoadBalancer`, and west's sender connects to the load balancer's
//! address.

use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::cross::*;
use ferry_cluster_tests::transfers::assert_same_tree;
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};

#[tokio::test]
async fn a_dataset_crosses_clusters_through_the_receivers_load_balancer() -> anyhow::Result<()> {
    let _operators = setup("xclb", &["--peering-service-type", "LoadBalancer"]).await?;
    let Crossing {
        west,
        east,
        src_host,
        dst_host,
    } = start_crossing("xc-lb", "lb", 50, 8, serde_json::json!({})).await?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());

    // The sender's address is the load balancer's ingress and the data port.
    let (west_pods, services): (Api<Pod>, Api<Service>) = (west.api(), east.api());
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (sender, svc) = loop {
        let senders = ferry_pods(&west_pods).await?;
        let svc = services.list(&ListParams::default()).await?.items;
        if let (Some(s), Some(svc)) = (senders.first(), svc.first()) {
            break (s.clone(), svc.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no sender pod in west and Service in east"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let spec = svc.spec.clone().context("spec")?;
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip.clone())
        .context("the receiver's Service has no load-balancer address")?;
    let connect = connect_arg(&sender);
    assert_eq!(connect, format!("{ingress}:7400"));
    assert!(
        ingress.starts_with("10.101.0.2"),
        "not east's address pool: {ingress}"
    );

    let te = wait_phase(&east_api, "lb", Phase::Succeeded).await?;
    let tw = wait_phase(&west_api, "lb", Phase::Succeeded).await?;
    assert_same_tree(&src_host, &dst_host)?;
    let (se, sw) = (te.status.context("east")?, tw.status.context("west")?);
    assert!(se.digest.is_some());
    assert_eq!(se.digest, sw.digest);
    west.delete().await?;
    east.delete().await
}
