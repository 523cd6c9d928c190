//! An operator that starts (or takes over) with more Transfers waiting than it reconciles at
//! once: every one is reconciled and succeeds, none waits on a cache that only the busy
//! controller could fill.

use std::time::Duration;

use ferry_cluster_tests::TestNamespace;
use ferry_cluster_tests::operator::{OperatorProcess, install_crd_and_rbac, prepare_nodes};
use ferry_cluster_tests::transfers::{self, MOVER_UID, NODE_A, NODE_B, transfer};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, PostParams};

const HOST_ROOT: &str = "/data/ferry-storm";
/// More than the operator's 16 reconciles at once.
const WAITING: usize = 40;

#[tokio::test]
async fn a_starting_operator_runs_every_waiting_transfer() -> anyhow::Result<()> {
    install_crd_and_rbac()?;
    prepare_nodes(HOST_ROOT, MOVER_UID, &[NODE_A, NODE_B])?;
    let ns = TestNamespace::create("storm").await?;
    let (src, src_host) = transfers::node_dir(HOST_ROOT, NODE_A, &ns.name, "src")?;
    std::fs::write(src_host.join("f"), b"storm")?;
    std::os::unix::fs::chown(src_host.join("f"), Some(MOVER_UID), Some(MOVER_UID))?;
    let api: Api<Transfer> = ns.api();
    for i in 0..WAITING {
        let dst = transfers::node_dir(HOST_ROOT, NODE_B, &ns.name, &format!("d{i}"))?.0;
        let t = transfer(
            &format!("t{i:02}"),
            (NODE_A, &src),
            (NODE_B, &dst),
            serde_json::json!({}),
        )?;
        api.create(&PostParams::default(), &t).await?;
    }
    // Only now does an operator start, and finds them all at once.
    let _op =
        OperatorProcess::start("ferry-operator-storm", HOST_ROOT, "ferry-operator-storm").await?;
    for i in 0..WAITING {
        let t = transfers::wait_phase(
            &api,
            &format!("t{i:02}"),
            Duration::from_secs(300),
            Phase::Succeeded,
        )
        .await?;
        let st = t.status.unwrap_or_default();
        assert_eq!(st.attempts, 1, "t{i:02}: {st:?}");
    }
    ns.delete().await
}
