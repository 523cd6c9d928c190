//! Cross-cluster Transfers through the events a platform sees every week: either cluster's
//! operator killed and restarted mid-Transfer, the other cluster's API unreachable or hanging
//! for 30 s, the destination's leader replaced by its standby. In each, the movers that run are
//! never deleted and the Transfer succeeds with its one attempt.
//!
//! West (the source) reaches east's cross-cluster API through a TCP proxy of this test, which
//! can refuse connections, hang them, or forward to another replica. The tests share one pair
//! of operators and run one at a time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use ferry_cluster_tests::cross::*;
use ferry_cluster_tests::operator::OperatorProcess;
use ferry_cluster_tests::transfers::assert_same_tree;
use ferry_cluster_tests::{Cluster, TestNamespace, wait_until};
use ferry_operator::api::{Phase, Transfer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const TAG: &str = "blip";

/// What a connection to the proxy meets.
#[derive(Clone, Debug)]
enum Mode {
    Forward(String),
    /// Accepted and closed at once (the client sees the connection end mid-handshake).
    Refuse,
    /// Accepted and never answered (the client's call times out).
    Hang,
}

/// A TCP proxy on loopback, on a thread of its own (it outlives each test's runtime).
struct Proxy {
    addr: String,
    mode: Arc<Mutex<Mode>>,
}

impl Proxy {
    fn start(target: &str) -> anyhow::Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?.to_string();
        let mode = Arc::new(Mutex::new(Mode::Forward(target.to_owned())));
        let shared = mode.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    let mode = shared.lock().map(|m| m.clone()).unwrap_or(Mode::Refuse);
                    tokio::spawn(async move {
                        match mode {
                            Mode::Refuse => drop(inbound),
                            Mode::Hang => {
                                tokio::time::sleep(Duration::from_secs(120)).await;
                                drop(inbound);
                            }
                            Mode::Forward(target) => {
                                if let Ok(mut out) = tokio::net::TcpStream::connect(&target).await {
                                    let _ =
                                        tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                                }
                            }
                        }
                    });
                }
            });
        });
        Ok(Proxy { addr, mode })
    }

    fn set(&self, mode: Mode) {
        if let Ok(mut m) = self.mode.lock() {
            *m = mode;
        }
    }
}

/// The shared pair: west's Peer of east points at the proxy.
struct Blips {
    pair: Pair,
    proxy: Proxy,
    /// The name of east's leading operator process (a standby may have taken over).
    east_op: String,
}

static BLIPS: tokio::sync::Mutex<Option<Blips>> = tokio::sync::Mutex::const_new(None);

async fn blips(slot: &mut Option<Blips>) -> anyhow::Result<&mut Blips> {
    if slot.is_none() {
        let pair = setup(TAG, &[]).await?;
        let proxy = Proxy::start(&pair.east_endpoint)?;
        apply_peer(WEST, "east", &pair.east_name, &pair.east_ca, &proxy.addr)?;
        *slot = Some(Blips {
            pair,
            proxy,
            east_op: format!("ferry-{TAG}-east"),
        });
    }
    slot.as_mut().context("no pair")
}

/// Kills the operator of `cluster` and starts it again on the same cross-cluster address and
/// Lease (the new process waits for the Lease to expire before it acts).
async fn restart(b: &mut Blips, cluster: Cluster) -> anyhow::Result<()> {
    let (name, cluster_name, address) = if cluster == WEST {
        b.pair.west.kill();
        (
            format!("ferry-{TAG}-west"),
            "west",
            b.pair.west_endpoint.clone(),
        )
    } else {
        b.pair.east.kill();
        (b.east_op.clone(), "east", b.pair.east_endpoint.clone())
    };
    let lease = if cluster == WEST {
        format!("ferry-{TAG}-west")
    } else {
        format!("ferry-{TAG}-east")
    };
    let flags = ["--cluster-name", cluster_name, "--peering-listen", &address];
    let op = OperatorProcess::start_in(cluster, &name, HOST_ROOT, &lease, &flags).await?;
    if cluster == WEST {
        b.pair.west = op;
    } else {
        b.pair.east = op;
    }
    Ok(())
}

/// A 40 MiB Transfer at 1 MiB/s (long enough to live through the event), moving.
async fn slow_crossing(prefix: &str) -> anyhow::Result<Crossing> {
    let extra = serde_json::json!({"bandwidthLimit": "1Mi", "compression": "none"});
    let c = start_crossing(prefix, "steady", 10, 40, extra).await?;
    let east: Api<Transfer> = c.east.api();
    wait_until(TIMEOUT, "data moving into east", || {
        let api = east.clone();
        async move {
            let t = api.get("steady").await?;
            Ok(t.status
                .and_then(|s| s.progress)
                .is_some_and(|p| p.bytes_done > 3 << 20))
        }
    })
    .await?;
    Ok(c)
}

/// ferry's pods of a namespace by name, with their UIDs.
async fn movers(ns: &TestNamespace) -> anyhow::Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = ns.api();
    Ok(ferry_pods(&pods)
        .await?
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect())
}

/// Both halves Succeeded with their first attempt, the movers that ran at `before` the same
/// pods throughout, and the data whole.
async fn succeeded_once(
    c: &Crossing,
    before: &(BTreeMap<String, String>, BTreeMap<String, String>),
) -> anyhow::Result<()> {
    let (west_api, east_api): (Api<Transfer>, Api<Transfer>) = (c.west.api(), c.east.api());
    let te = wait_phase(&east_api, "steady", Phase::Succeeded).await?;
    let tw = wait_phase(&west_api, "steady", Phase::Succeeded).await?;
    let (se, sw) = (te.status.context("east")?, tw.status.context("west")?);
    assert_eq!((se.attempts, se.failures), (1, 0), "east: {se:?}");
    assert_eq!((sw.attempts, sw.failures), (1, 0), "west: {sw:?}");
    assert_eq!(
        movers(&c.west).await?,
        before.0,
        "west's sender was replaced"
    );
    assert_eq!(
        movers(&c.east).await?,
        before.1,
        "east's receiver was replaced"
    );
    assert_same_tree(&c.src_host, &c.dst_host)?;
    Ok(())
}

async fn mover_pods(
    c: &Crossing,
) -> anyhow::Result<(BTreeMap<String, String>, BTreeMap<String, String>)> {
    let before = (movers(&c.west).await?, movers(&c.east).await?);
    assert_eq!(before.0.len(), 1, "one sender in west: {:?}", before.0);
    assert_eq!(before.1.len(), 1, "one receiver in east: {:?}", before.1);
    Ok(before)
}

#[tokio::test]
async fn a_restarted_destination_operator_leaves_the_transfer_running() -> anyhow::Result<()> {
    let mut slot = BLIPS.lock().await;
    let b = blips(&mut slot).await?;
    let c = slow_crossing("blip-dst").await?;
    let before = mover_pods(&c).await?;
    restart(b, EAST).await?;
    succeeded_once(&c, &before).await?;
    c.west.delete().await?;
    c.east.delete().await
}

#[tokio::test]
async fn a_restarted_source_operator_leaves_the_transfer_running() -> anyhow::Result<()> {
    let mut slot = BLIPS.lock().await;
    let b = blips(&mut slot).await?;
    let c = slow_crossing("blip-src").await?;
    let before = mover_pods(&c).await?;
    restart(b, WEST).await?;
    succeeded_once(&c, &before).await?;
    c.west.delete().await?;
    c.east.delete().await
}

#[tokio::test]
async fn thirty_seconds_without_the_other_clusters_api_delete_no_mover() -> anyhow::Result<()> {
    let mut slot = BLIPS.lock().await;
    let b = blips(&mut slot).await?;
    let c = slow_crossing("blip-net").await?;
    let before = mover_pods(&c).await?;
    // 15 s of connections closed at once, then 15 s of calls that never get an answer.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    b.proxy.set(Mode::Refuse);
    let mut hanging = false;
    while tokio::time::Instant::now() < until {
        if !hanging && until - tokio::time::Instant::now() < Duration::from_secs(15) {
            b.proxy.set(Mode::Hang);
            hanging = true;
        }
        let now = (movers(&c.west).await?, movers(&c.east).await?);
        // A finished mover stays; none is deleted or replaced.
        assert_eq!(now, before, "a mover was deleted during the blip");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    b.proxy.set(Mode::Forward(b.pair.east_endpoint.clone()));
    succeeded_once(&c, &before).await?;
    c.west.delete().await?;
    c.east.delete().await
}

#[tokio::test]
async fn the_destinations_standby_takes_over_and_the_transfer_goes_on() -> anyhow::Result<()> {
    let mut slot = BLIPS.lock().await;
    let b = blips(&mut slot).await?;
    // A second replica of east's operator, waiting for the same Lease.
    let standby = format!("ferry-{TAG}-east-standby");
    let lease = format!("ferry-{TAG}-east");
    let flags = ["--cluster-name", "east", "--peering-listen", "127.0.0.1:0"];
    let replica = OperatorProcess::start_in(EAST, &standby, HOST_ROOT, &lease, &flags).await?;
    let c = slow_crossing("blip-lead").await?;
    let before = mover_pods(&c).await?;
    b.pair.east.kill();
    // The standby leads once the Lease stays unrenewed for its duration; the proxy plays the
    // peering Service, which follows the leader's label.
    let address = api_address(&replica, &standby).await?;
    b.proxy.set(Mode::Forward(address.clone()));
    b.pair.east = replica;
    b.pair.east_endpoint = address;
    b.east_op = standby;
    succeeded_once(&c, &before).await?;
    c.west.delete().await?;
    c.east.delete().await
}
