//! Cross-cluster Transfers on the two local clusters: `ferry` plays cluster west (the source)
//! and `peer` cluster east (the destination). Each runs its own operator process (host
//! processes with each cluster's kubeconfig, their cross-cluster APIs on loopback), and each
//! cluster has a Peer naming the other with its CA certificate: nothing secret is copied.
//! The data goes from west's sender pod to east's receiver through east's NodePort Service.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::cross::*;
use ferry_cluster_tests::operator::kubectl_in;
use ferry_cluster_tests::transfers::{assert_same_tree, make_tree};
use ferry_cluster_tests::{TestNamespace, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

static PAIR: tokio::sync::OnceCell<Result<Pair, String>> = tokio::sync::OnceCell::const_new();

/// Both operators and both Peers, set up once for every test of this file.
async fn pair() -> anyhow::Result<&'static Pair> {
    let p = PAIR
        .get_or_init(|| async { setup("xc", &[]).await.map_err(|e| format!("{e:#}")) })
        .await;
    match p {
        Ok(p) => Ok(p),
        Err(e) => bail!("the two operators did not start: {e}"),
    }
}

#[tokio::test]
async fn a_dataset_crosses_clusters_through_the_receivers_node_port() -> anyhow::Result<()> {
    let p = pair().await?;
    let Crossing {
        west,
        east,
        src_host,
        dst_host,
    } = start_crossing("xc-data", "data", 300, 24, serde_json::json!({})).await?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());

    // While it runs: the sender connects to a node address of east and the Service's NodePort,
    // never to the receiver pod, whose address west cannot reach at all.
    let (west_pods, east_pods): (Api<Pod>, Api<Pod>) = (west.api(), east.api());
    let services: Api<Service> = east.api();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let seen = loop {
        let senders = ferry_pods(&west_pods).await?;
        let receivers = ferry_pods(&east_pods).await?;
        let svc = services.list(&ListParams::default()).await?.items;
        if let (Some(s), Some(r), Some(svc)) = (senders.first(), receivers.first(), svc.first())
            && r.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
        {
            break Some((s.clone(), r.clone(), svc.clone()));
        }
        if tokio::time::Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (sender, receiver, svc) =
        seen.context("no sender pod in west and receiver with its Service in east")?;
    let connect = connect_arg(&sender);
    let node_port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .and_then(|p| p.node_port)
        .context("nodePort")?;
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.type_.clone()).as_deref(),
        Some("NodePort")
    );
    assert!(
        connect.ends_with(&format!(":{node_port}")),
        "sender connects to {connect}, the Service's NodePort is {node_port}"
    );
    assert!(
        connect.starts_with("10.101."),
        "not an address of east's node network: {connect}"
    );
    let receiver_ip = receiver
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    assert!(!receiver_ip.is_empty() && !connect.starts_with(&format!("{receiver_ip}:")));
    // From west's node, east's pod addresses are filtered; its node addresses are not.
    let probe = |addr: &str| {
        std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                "ferry0-node-a",
                "timeout",
                "3",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{}", addr.replace(':', "/")),
            ])
            .status()
            .map(|s| s.success())
    };
    assert!(
        !probe(&format!("{receiver_ip}:7400"))?,
        "west reached east's receiver pod {receiver_ip} directly"
    );

    let t_east = wait_phase(&east_api, "data", Phase::Succeeded).await?;
    let t_west = wait_phase(&west_api, "data", Phase::Succeeded).await?;
    let n = assert_same_tree(&src_host, &dst_host)?;
    assert!(n >= 300, "{n} files");
    let (se, sw) = (
        t_east.status.context("east status")?,
        t_west.status.context("west status")?,
    );
    assert!(
        se.digest.is_some(),
        "the destination verified no digest: {se:?}"
    );
    assert_eq!(
        se.digest, sw.digest,
        "the source half shows the destination's digest"
    );
    assert_eq!(
        se.progress, sw.progress,
        "the source half shows the destination's figures"
    );
    assert_eq!(
        sw.remote.as_ref().map(|r| r.cluster.as_str()),
        Some(p.east_name.as_str())
    );
    assert_eq!(
        se.remote.as_ref().map(|r| r.cluster.as_str()),
        Some(p.west_name.as_str())
    );
    // Finished: the movers exited (their pods stay for the logs, as in one cluster); no
    // certificates and no Service stay behind.
    for pod in ferry_pods(&west_pods)
        .await?
        .iter()
        .chain(&ferry_pods(&east_pods).await?)
    {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        assert_eq!(
            phase.as_deref(),
            Some("Succeeded"),
            "{:?}",
            pod.metadata.name
        );
    }
    wait_until(
        Duration::from_secs(60),
        "certificates and Service removed",
        || {
            let (w, e, s) = (
                west.api::<Secret>(),
                east.api::<Secret>(),
                east.api::<Service>(),
            );
            async move {
                let lp =
                    ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator");
                Ok(w.list(&lp).await?.items.is_empty()
                    && e.list(&lp).await?.items.is_empty()
                    && s.list(&lp).await?.items.is_empty())
            }
        },
    )
    .await?;
    west.delete().await?;
    east.delete().await
}

/// Mover pods of the Transfers in `api`'s namespace.
async fn no_movers(api: &Api<Pod>) -> anyhow::Result<()> {
    let pods = ferry_pods(api).await?;
    if !pods.is_empty() {
        bail!(
            "movers started: {:?}",
            pods.iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}

#[tokio::test]
async fn refused_or_unpaired_halves_wait_with_a_reason_and_move_nothing() -> anyhow::Result<()> {
    let p = pair().await?;
    let west = TestNamespace::create_in(WEST, "xc-refuse").await?;
    let east = TestNamespace::create_in(EAST, "xc-refuse").await?;
    let (src, _) = node_dir(WEST, WEST_NODE, &west.name, "src")?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());
    let half = |name: &str, peer: &str, remote: &str| {
        ferry_cluster_tests::from_json::<Transfer>(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name},
            "spec": {
                "source": {"hostPath": {"node": WEST_NODE, "path": src}},
                "destination": {"remote": {"peer": peer, "namespace": east.name, "name": remote}},
            },
        }))
    };
    // A Peer whose caBundle is not east's CA (it is west's own).
    apply_peer(
        WEST,
        "east-wrong-ca",
        &p.east_name,
        &p.west_ca,
        &p.east_endpoint,
    )?;
    // East's half of "lonely" names a source that never calls.
    let (_, lonely) = halves(
        "lonely",
        &west.name,
        &east.name,
        &src,
        serde_json::json!({"hostPath": {"node": EAST_NODE, "path": format!("{HOST_ROOT}/{}/lonely", east.name)}}),
        serde_json::json!({}),
    )?;
    let mut lonely = lonely;
    if let Some(r) = lonely.spec.source.remote.as_mut() {
        r.name = "nobody".into();
    }
    east_api.create(&PostParams::default(), &lonely).await?;
    for (name, peer, remote) in [
        ("orphan", "east", "missing"),
        ("untrusted", "east-wrong-ca", "missing"),
        ("ghost", "no-such-peer", "missing"),
        ("mismatch", "east", "lonely"),
    ] {
        west_api
            .create(&PostParams::default(), &half(name, peer, remote)?)
            .await?;
    }
    let expect = [
        ("orphan", "CounterpartMissing", "has no Transfer"),
        ("untrusted", "PeerUntrusted", "caBundle"),
        ("ghost", "PeerNotFound", "no Peer no-such-peer"),
        ("mismatch", "CounterpartMismatch", "nobody"),
    ];
    for (name, reason, words) in expect {
        let t = wait_reason(&west_api, name, reason).await?;
        let (_, message) = ready(&t);
        assert!(message.contains(words), "{name}: {message}");
    }
    let t = wait_reason(&east_api, "lonely", "WaitingForCounterpart").await?;
    assert!(ready(&t).1.contains("nobody"), "{:?}", ready(&t));

    // A cluster no Peer here names is refused in the TLS handshake, before any request.
    let stranger = std::sync::Arc::new(ferry_operator::pki::Authority::ephemeral("north")?);
    let client = ferry_operator::peering::client::PeerClient::new(stranger);
    let east_peer = ferry_operator::peering::trust::peer_entry(&ferry_cluster_tests::from_json(
        serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Peer",
            "metadata": {"name": "east"},
            "spec": {"clusterName": p.east_name, "caBundle": p.east_ca, "endpoint": p.east_endpoint},
        }),
    )?)
    .map_err(anyhow::Error::msg)?;
    let req = ferry_operator::peering::wire::PairRequest {
        destination: ferry_operator::peering::wire::HalfRef {
            namespace: east.name.clone(),
            name: "lonely".into(),
        },
        source: ferry_operator::peering::wire::HalfRef {
            namespace: west.name.clone(),
            name: "nobody".into(),
        },
        sender: None,
    };
    let refused = client
        .pair(&east_peer, &req)
        .await
        .expect_err("a stranger was answered");
    assert_eq!(
        refused.reason.as_str(),
        "PeerRefused",
        "{}",
        refused.message
    );
    let log = std::fs::read_to_string(&p.east.log)?;
    assert!(
        log.contains("refused a caller from a cluster no Peer names"),
        "east's log"
    );
    // The stranger's call did not count as the counterpart calling.
    assert_eq!(
        ready(&east_api.get("lonely").await?).0,
        "WaitingForCounterpart"
    );

    no_movers(&west.api()).await?;
    no_movers(&east.api()).await?;
    kubectl_in(WEST, &["delete", "peer", "east-wrong-ca"])?;
    west.delete().await?;
    east.delete().await
}

/// Starts a bandwidth-limited cross-cluster Transfer of 48 MiB; returns both namespaces, the
/// source and destination directories on the hosts.
async fn limited_pair(
    prefix: &str,
) -> anyhow::Result<(TestNamespace, TestNamespace, PathBuf, PathBuf)> {
    let extra = serde_json::json!({"bandwidthLimit": "8Mi", "compression": "none"});
    let c = start_crossing(prefix, "limited", 20, 48, extra).await?;
    Ok((c.west, c.east, c.src_host, c.dst_host))
}

/// Waits until east's half has written more than `bytes`.
async fn written(api: &Api<Transfer>, bytes: u64) -> anyhow::Result<()> {
    wait_until(TIMEOUT, "data written in east", || {
        let api = api.clone();
        async move {
            let t = api.get("limited").await?;
            Ok(t.status
                .and_then(|s| s.progress)
                .is_some_and(|p| p.bytes_done > bytes))
        }
    })
    .await
}

#[tokio::test]
async fn a_killed_sender_resumes_across_clusters() -> anyhow::Result<()> {
    pair().await?;
    let (west, east, src_host, dst_host) = limited_pair("xc-kill").await?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());
    written(&east_api, 16 << 20).await?;
    let pods: Api<Pod> = west.api();
    let sender = ferry_pods(&pods)
        .await?
        .into_iter()
        .next()
        .context("no sender pod in west")?;
    pods.delete(
        sender.metadata.name.as_deref().unwrap_or_default(),
        &DeleteParams::default().grace_period(0),
    )
    .await?;
    let te = wait_phase(&east_api, "limited", Phase::Succeeded).await?;
    let tw = wait_phase(&west_api, "limited", Phase::Succeeded).await?;
    let (se, sw) = (te.status.context("east")?, tw.status.context("west")?);
    assert_eq!((se.attempts, se.failures), (2, 1), "{se:?}");
    assert_eq!(
        sw.attempts, 2,
        "the source half shows the destination's attempts"
    );
    let wire = se.wire.clone().context("wire")?;
    assert!(wire.resumed_bytes > 0, "the retry kept nothing: {wire:?}");
    assert_eq!(sw.wire, se.wire);
    assert_same_tree(&src_host, &dst_host)?;
    west.delete().await?;
    east.delete().await
}

#[tokio::test]
async fn deleting_the_destination_half_stops_the_sender_and_cleans_both_clusters()
-> anyhow::Result<()> {
    pair().await?;
    let (west, east, _, _) = limited_pair("xc-delete").await?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());
    written(&east_api, 4 << 20).await?;
    east_api.delete("limited", &DeleteParams::default()).await?;
    wait_until(
        TIMEOUT,
        "east's half gone with its movers and Service",
        || {
            let (t, pods, svc) = (east_api.clone(), east.api::<Pod>(), east.api::<Service>());
            async move {
                let lp =
                    ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator");
                Ok(t.get_opt("limited").await?.is_none()
                    && pods.list(&lp).await?.items.is_empty()
                    && svc.list(&lp).await?.items.is_empty())
            }
        },
    )
    .await?;
    let t = wait_reason(&west_api, "limited", "CounterpartMissing").await?;
    assert_ne!(t.status.map(|s| s.phase), Some(Phase::Succeeded));
    wait_until(TIMEOUT, "west's sender and certificates gone", || {
        let (pods, secrets) = (west.api::<Pod>(), west.api::<Secret>());
        async move {
            let lp = ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator");
            Ok(pods.list(&lp).await?.items.is_empty() && secrets.list(&lp).await?.items.is_empty())
        }
    })
    .await?;
    west.delete().await?;
    east.delete().await
}

#[tokio::test]
async fn a_repeated_dataset_reports_block_store_hits_on_both_sides() -> anyhow::Result<()> {
    pair().await?;
    ferry_cluster_tests::operator::wait_node_service_in(EAST, &[EAST_NODE]).await?;
    let west = TestNamespace::create_in(WEST, "xc-dedup").await?;
    let east = TestNamespace::create_in(EAST, "xc-dedup").await?;
    let (src, src_host) = node_dir(WEST, WEST_NODE, &west.name, "src")?;
    make_tree(&src_host, 10, 24, &west.name)?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());
    for name in ["first", "again"] {
        let (dst, dst_host) = node_dir(EAST, EAST_NODE, &east.name, name)?;
        create_halves(&west, &east, name, &src, &dst, serde_json::json!({})).await?;
        wait_phase(&east_api, name, Phase::Succeeded).await?;
        wait_phase(&west_api, name, Phase::Succeeded).await?;
        assert_same_tree(&src_host, &dst_host)?;
    }
    let (te, tw) = (east_api.get("again").await?, west_api.get("again").await?);
    let we = te.status.and_then(|s| s.wire).context("east wire")?;
    let ww = tw.status.and_then(|s| s.wire).context("west wire")?;
    assert!(
        we.dedup_blocks >= 6,
        "24 MiB again took {} blocks from the store",
        we.dedup_blocks
    );
    assert_eq!(
        ww.dedup_blocks, we.dedup_blocks,
        "the source half shows the hits"
    );
    assert!(we.bytes < 4 << 20, "{} bytes crossed the network", we.bytes);
    west.delete().await?;
    east.delete().await
}

#[tokio::test]
async fn deleting_the_source_half_stops_the_receiver_which_then_waits() -> anyhow::Result<()> {
    pair().await?;
    let (west, east, _, _) = limited_pair("xc-withdraw").await?;
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (west.api(), east.api());
    written(&east_api, 4 << 20).await?;
    west_api.delete("limited", &DeleteParams::default()).await?;
    wait_until(TIMEOUT, "west's half gone with its sender", || {
        let (t, pods) = (west_api.clone(), west.api::<Pod>());
        async move {
            let lp = ListParams::default().labels("app.kubernetes.io/managed-by=ferry-operator");
            Ok(t.get_opt("limited").await?.is_none() && pods.list(&lp).await?.items.is_empty())
        }
    })
    .await?;
    // The withdrawal reached east at once (not after 60 s of silence): its receiver stops.
    let t = wait_reason(&east_api, "limited", "WaitingForCounterpart").await?;
    assert_eq!(t.status.map(|s| s.phase), Some(Phase::Pending));
    wait_until(Duration::from_secs(30), "east's receiver stopped", || {
        let pods = east.api::<Pod>();
        async move {
            let running = ferry_pods(&pods).await?.into_iter().any(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
            });
            Ok(!running)
        }
    })
    .await?;
    west.delete().await?;
    east.delete().await
}
