//! `kubectl ferry` (the `kubectl-ferry` binary of `make build`) against the local cluster, as a
//! user runs it: with the cluster's admin kubeconfig, on Transfers a test operator serves.
//!
//! One `ferry-operator` process (its own leader-election Lease) serves every test of this file;
//! it runs on the host and dies with the test process.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_cluster_tests::operator::workspace_bin;
use ferry_cluster_tests::transfers::{self, NODE_A, NODE_B, SharedOperator, make_tree};
use ferry_cluster_tests::{TestNamespace, cluster_dir};
use ferry_operator::api::{Phase, Transfer};
use kube::api::{Api, PostParams};

/// Host root the test operator grants (to every namespace).
const HOST_ROOT: &str = "/data/ferry-plugin-e2e";
/// Longest any one plugin command may take before the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(240);

/// The operator every test of this file shares.
static OPERATOR: SharedOperator = SharedOperator::new("ferry-operator-plugin-tests", HOST_ROOT);

async fn ensure_operator() -> anyhow::Result<()> {
    OPERATOR.ensure().await
}

/// What one run of the plugin did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

/// Runs `kubectl-ferry args` with the cluster's admin kubeconfig; fails if it does not end
/// within [`COMMAND_TIMEOUT`] or ends by a signal (a crash).
async fn plugin(args: &[&str]) -> anyhow::Result<Run> {
    plugin_with_env(
        args,
        &[("KUBECONFIG", Some(cluster_dir().join("kubeconfig")))],
    )
    .await
}

async fn plugin_with_env(args: &[&str], env: &[(&str, Option<PathBuf>)]) -> anyhow::Result<Run> {
    let mut cmd = tokio::process::Command::new(workspace_bin("kubectl-ferry")?);
    cmd.args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
        .await
        .with_context(|| format!("kubectl ferry {args:?} did not end within {COMMAND_TIMEOUT:?}"))?
        .context("failed to run kubectl-ferry")?;
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if out.status.code().is_none() || run.code == 101 || run.stderr.contains("panicked") {
        bail!("kubectl ferry {args:?} crashed: {run:?}");
    }
    Ok(run)
}

fn node_dir(node: &str, ns: &str, name: &str) -> anyhow::Result<(String, PathBuf)> {
    transfers::node_dir(HOST_ROOT, node, ns, name)
}

/// A Transfer node-a:`src` -> node-b:`dst`.
fn transfer(
    name: &str,
    src: &str,
    dst: &str,
    extra: serde_json::Value,
) -> anyhow::Result<Transfer> {
    transfers::transfer(name, (NODE_A, src), (NODE_B, dst), extra)
}

/// The cells of the first line of `text` whose first cell is `first`.
fn row<'a>(text: &'a str, first: &str) -> Option<Vec<&'a str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
}

#[tokio::test]
async fn watch_get_describe_and_logs_follow_a_transfer_to_success() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("plugin-ok").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 40, 12, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    // Limited to 4 MiB/s, so the watch sees it run for a few seconds.
    api.create(
        &PostParams::default(),
        &transfer(
            "copy",
            &src,
            &dst,
            serde_json::json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false}),
        )?,
    )
    .await?;
    let watch = plugin(&["watch", "copy", "-n", &ns.name, "--timeout", "180s"]).await?;
    assert_eq!(watch.code, 0, "{watch:?}");
    assert!(
        !watch.stdout.contains(['\r', '\x1b']),
        "terminal control characters in piped output: {:?}",
        watch.stdout
    );
    let lines = watch.lines();
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.starts_with("Succeeded: 41 files, "), "{watch:?}");
    let progress: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("] ") && l.contains('%'))
        .collect();
    assert!(
        progress.iter().any(|l| l.starts_with("Running ")),
        "no progress line while running: {watch:?}"
    );
    assert!(
        progress
            .last()
            .is_some_and(|l| l.starts_with("Succeeded ") && l.contains("100%")),
        "{watch:?}"
    );

    let t = api.get("copy").await?;
    let st = t.status.context("status")?;
    assert_eq!(st.phase, Phase::Succeeded);
    let sender = st.sender.context("sender")?.pod;
    let receiver = st.receiver.context("receiver")?.pod;
    let digest = st.digest.context("digest")?;

    let get = plugin(&["get", "copy", "-n", &ns.name]).await?;
    assert_eq!(get.code, 0, "{get:?}");
    let cells = row(&get.stdout, "copy").context(get.stdout.clone())?;
    assert_eq!(cells[1..3], ["Succeeded", "100%"], "{get:?}");
    assert!(get.stdout.starts_with("NAME "), "{get:?}");
    for header in [
        "PROGRESS",
        "FILES",
        "THROUGHPUT",
        "AVG",
        "ETA",
        "ATTEMPTS",
        "AGE",
    ] {
        assert!(get.lines()[0].contains(header), "{header} missing: {get:?}");
    }
    assert!(cells.contains(&"41/41"), "{get:?}");
    let all = plugin(&["get", "-A"]).await?;
    assert_eq!(all.code, 0, "{all:?}");
    assert!(
        row(&all.stdout, &ns.name).is_some_and(|c| c[1] == "copy"),
        "{all:?}"
    );
    let wide = plugin(&["get", "-n", &ns.name, "-o", "wide"]).await?;
    let cells = row(&wide.stdout, "copy").context(wide.stdout.clone())?;
    // Sender and receiver node, digest, and no next run (no schedule).
    assert_eq!(
        cells[cells.len() - 4..],
        [NODE_A, NODE_B, &digest, "-"],
        "{wide:?}"
    );

    // The operator records its Events right after the status: wait for the last one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let describe = loop {
        let run = plugin(&["describe", "copy", "-n", &ns.name]).await?;
        let has_event = run
            .stdout
            .split_once("Events:")
            .is_some_and(|(_, events)| events.contains("Succeeded"));
        if run.code == 0 && has_event {
            break run;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("describe never showed the Succeeded Event: {run:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = &describe.stdout;
    assert!(text.contains("Phase:         Succeeded\n"), "{text}");
    assert!(
        text.contains(&format!("Source:        hostPath {NODE_A}:{src}\n")),
        "{text}"
    );
    let conditions = text
        .split_once("Conditions:")
        .and_then(|(_, rest)| rest.split_once("Mover Pods:"))
        .context(text.clone())?;
    assert_eq!(
        row(conditions.0, "Succeeded").map(|c| c[..3].to_vec()),
        Some(vec!["Succeeded", "True", "Completed"]),
        "{text}"
    );
    for (pod, role, node) in [(&sender, "sender", NODE_A), (&receiver, "receiver", NODE_B)] {
        let cells = row(conditions.1, pod).with_context(|| format!("{pod} missing: {text}"))?;
        assert_eq!(cells[1..], [role, "1-1", node, "Succeeded", "0"], "{text}");
    }

    // The nodes serve the kubelet's log endpoint: the logs come through the apiserver.
    let logs = plugin(&["logs", "copy", "-n", &ns.name]).await?;
    assert_eq!(logs.code, 0, "{logs:?}");
    assert!(
        logs.stdout.contains(&sender) && logs.stdout.contains(&receiver),
        "{logs:?}"
    );
    let one = plugin(&[
        "logs", "copy", "-n", &ns.name, "--role", "sender", "--tail", "2",
    ])
    .await?;
    assert_eq!(one.code, 0, "{one:?}");
    // One pod: its last two lines, without a header; the sender ends with its JSON summary.
    let lines: Vec<&str> = one.stdout.lines().collect();
    assert!(!lines.is_empty() && lines.len() <= 2, "{one:?}");
    assert!(lines.last().unwrap().contains("\"files\":"), "{one:?}");
    assert!(!one.stdout.contains(&receiver), "{one:?}");
    ns.delete().await
}

#[tokio::test]
async fn watch_exits_1_with_the_reason_when_the_transfer_fails() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("plugin-fail").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 3, 1, &ns.name)?;
    transfers::add_unreadable_dir(&src_host)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer("broken", &src, &dst, serde_json::json!({}))?,
    )
    .await?;
    let watch = plugin(&["watch", "broken", "-n", &ns.name, "--timeout", "180s"]).await?;
    assert_eq!(watch.code, 1, "{watch:?}");
    let last = watch.lines().last().copied().unwrap_or_default();
    assert!(
        last.starts_with("Failed: SourceUnreadable: ") && last.contains("private"),
        "{watch:?}"
    );
    let get = plugin(&["get", "broken", "-n", &ns.name]).await?;
    assert_eq!(get.code, 0, "{get:?}");
    assert_eq!(
        row(&get.stdout, "broken").map(|c| c[1]),
        Some("Failed"),
        "{get:?}"
    );
    let describe = plugin(&["describe", "broken", "-n", &ns.name]).await?;
    assert!(
        describe
            .stdout
            .contains("Last Error:    SourceUnreadable: "),
        "{describe:?}"
    );
    ns.delete().await
}

#[tokio::test]
async fn missing_transfers_timeouts_and_kubeconfigs_get_clear_errors() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("plugin-errors").await?;
    for cmd in ["get", "watch", "describe", "logs"] {
        let run = plugin(&[cmd, "nope", "-n", &ns.name]).await?;
        assert_eq!(run.code, 1, "{cmd}: {run:?}");
        assert_eq!(
            run.stderr.trim_end(),
            format!(
                "error: transfer \"nope\" not found in namespace \"{}\"",
                ns.name
            ),
            "{cmd}: {run:?}"
        );
    }
    let empty = plugin(&["get", "-n", &ns.name]).await?;
    assert_eq!(empty.code, 0, "{empty:?}");
    assert!(empty.stderr.contains("No transfers found"), "{empty:?}");

    // A suspended Transfer never finishes: --timeout ends the watch with exit code 2.
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer(
            "held",
            &format!("{HOST_ROOT}/none"),
            &format!("{HOST_ROOT}/none2"),
            serde_json::json!({"suspend": true}),
        )?,
    )
    .await?;
    let watch = plugin(&["watch", "held", "-n", &ns.name, "--timeout", "2s"]).await?;
    assert_eq!(watch.code, 2, "{watch:?}");
    assert!(watch.stderr.contains("timed out after 2s"), "{watch:?}");

    let missing = plugin_with_env(
        &["get"],
        &[("KUBECONFIG", Some(PathBuf::from("/nonexistent/kubeconfig")))],
    )
    .await?;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing
            .stderr
            .contains("the kubeconfig /nonexistent/kubeconfig named by KUBECONFIG does not exist"),
        "{missing:?}"
    );
    let home = std::env::temp_dir().join(format!("plugin-home-{}", std::process::id()));
    std::fs::create_dir_all(&home)?;
    let none = plugin_with_env(
        &["get"],
        &[("KUBECONFIG", None), ("HOME", Some(home.clone()))],
    )
    .await?;
    std::fs::remove_dir_all(&home)?;
    assert_eq!(none.code, 1, "{none:?}");
    assert!(
        none.stderr.contains("no kubeconfig: KUBECONFIG is not set"),
        "{none:?}"
    );
    ns.delete().await
}

/// `nodes` shows each node's store against its cap, and what a Transfer adds to it.
#[tokio::test]
async fn nodes_shows_each_node_store_and_what_a_transfer_added() -> anyhow::Result<()> {
    ensure_operator().await?;
    ferry_cluster_tests::operator::wait_node_service_in(
        ferry_cluster_tests::Cluster::Main,
        &[NODE_A, NODE_B],
    )
    .await?;
    // Columns: NODE READY BLOCKS STORED(2) CAP(2) USED HITS HIT-BYTES(2) ADDED EVICTED LAST-GC
    let added_on_b = |run: &Run| -> anyhow::Result<u64> {
        let r = row(&run.stdout, NODE_B).with_context(|| format!("no {NODE_B} row: {run:?}"))?;
        Ok(r[11].parse()?)
    };
    let before = plugin(&["nodes"]).await?;
    assert_eq!(before.code, 0, "{before:?}");
    assert!(before.lines()[0].starts_with("NODE"), "{before:?}");
    for node in [NODE_A, NODE_B] {
        let r = row(&before.stdout, node).with_context(|| format!("no {node} row: {before:?}"))?;
        assert_eq!(r[1], "yes", "{before:?}");
        assert_eq!((r[5], r[6]), ("4.0", "GiB"), "the chart's cap: {before:?}");
    }
    let added = added_on_b(&before)?;

    let ns = TestNamespace::create("plugin-nodes").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, _) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 2, 12, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    api.create(
        &PostParams::default(),
        &transfer("fill", &src, &dst, serde_json::json!({}))?,
    )
    .await?;
    transfers::wait_phase(&api, "fill", Duration::from_secs(120), Phase::Succeeded).await?;
    // 12 MiB of unique content: three full blocks reached node-b's store.
    let after = plugin(&["nodes"]).await?;
    assert_eq!(added_on_b(&after)?, added + 3, "{before:?}\n{after:?}");
    ns.delete().await
}

/// The verbs that act: `suspend` stops a running Transfer's movers and `resume` lets it finish,
/// each saying so once and nothing the second time; `trigger` runs the finished Transfer again
/// (its new run resumes: no file data moves); `delete` returns once it is gone.
#[tokio::test]
async fn suspend_resume_trigger_and_delete_act_on_a_transfer() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("plugin-act").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    // 40 MiB at 4 MiB/s: running for about 10 s, long enough to be suspended mid-run.
    make_tree(&src_host, 10, 40, &ns.name)?;
    let api: Api<Transfer> = ns.api();
    let spec = serde_json::json!({"bandwidthLimit": "4Mi", "compression": "none", "dedup": false});
    api.create(&PostParams::default(), &transfer("act", &src, &dst, spec)?)
        .await?;
    transfers::wait_phase(&api, "act", Duration::from_secs(120), Phase::Running).await?;

    let suspend = plugin(&["suspend", "act", "-n", &ns.name]).await?;
    assert_eq!(suspend.code, 0, "{suspend:?}");
    assert_eq!(
        suspend.stdout,
        "transfer.ferry.dev/act suspended: its movers stop; `kubectl ferry resume act` continues where it stopped\n"
    );
    let t = transfers::wait_phase(&api, "act", Duration::from_secs(60), Phase::Suspended).await?;
    assert!(t.spec.suspend);
    let again = plugin(&["suspend", "act", "-n", &ns.name]).await?;
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "transfer.ferry.dev/act is suspended already\n")
    );

    let resume = plugin(&["resume", "act", "-n", &ns.name]).await?;
    assert_eq!(
        (resume.code, resume.stdout.as_str()),
        (0, "transfer.ferry.dev/act resumed\n")
    );
    let first =
        transfers::wait_phase(&api, "act", Duration::from_secs(180), Phase::Succeeded).await?;
    transfers::assert_same_tree(&src_host, &dst_host)?;
    let first_status = first.status.context("status")?;
    let not_suspended = plugin(&["resume", "act", "-n", &ns.name]).await?;
    assert_eq!(
        not_suspended.stdout,
        "transfer.ferry.dev/act is not suspended\n"
    );

    let trigger = plugin(&["trigger", "act", "-n", &ns.name]).await?;
    assert_eq!(trigger.code, 0, "{trigger:?}");
    assert_eq!(
        trigger.stdout,
        format!(
            "transfer.ferry.dev/act triggered: run {} starts\n",
            first_status.run + 1
        )
    );
    let run = first_status.run + 1;
    ferry_cluster_tests::wait_until(Duration::from_secs(180), "the next run to succeed", || {
        let api = api.clone();
        async move {
            let st = api.get("act").await?.status.unwrap_or_default();
            if st.run == run && st.phase == Phase::Failed {
                bail!("run {run} failed: {st:?}");
            }
            Ok(st.run == run && st.phase == Phase::Succeeded)
        }
    })
    .await?;
    let second = api.get("act").await?.status.context("status")?;
    let wire = second.wire.context("wire figures")?;
    assert!(
        wire.bytes < 1 << 20,
        "the unchanged tree moved {} bytes over the wire again",
        wire.bytes
    );

    let delete = plugin(&["delete", "act", "-n", &ns.name]).await?;
    assert_eq!(
        (delete.code, delete.stdout.as_str()),
        (0, "transfer.ferry.dev/act deleted\n"),
        "{delete:?}"
    );
    assert!(
        api.get_opt("act").await?.is_none(),
        "delete returned before the Transfer was gone"
    );
    let missing = plugin(&["delete", "act", "-n", &ns.name]).await?;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing.stderr.contains(&format!(
            "transfer \"act\" not found in namespace \"{}\"",
            ns.name
        )),
        "{missing:?}"
    );
    ns.delete().await
}

/// `cp` creates a Transfer from its arguments, prints its name and follows it to success; its
/// client-side dry run prints a Transfer that kubectl applies as it is (the GitOps path), a
/// fan-out's included; arguments that name no endpoint are refused before anything is created.
#[tokio::test]
async fn cp_creates_and_follows_a_transfer_and_its_dry_run_applies() -> anyhow::Result<()> {
    ensure_operator().await?;
    let ns = TestNamespace::create("plugin-cp").await?;
    let (src, src_host) = node_dir(NODE_A, &ns.name, "src")?;
    let (dst, dst_host) = node_dir(NODE_B, &ns.name, "dst")?;
    make_tree(&src_host, 12, 2, &ns.name)?;
    let cp = plugin(&[
        "cp",
        &format!("{NODE_A}:{src}"),
        &format!("node/{NODE_B}:{dst}"),
        "-n",
        &ns.name,
        "--timeout",
        "180s",
    ])
    .await?;
    assert_eq!(cp.code, 0, "{cp:?}");
    let lines = cp.lines();
    let name = lines
        .first()
        .and_then(|l| l.strip_prefix("transfer.ferry.dev/"))
        .and_then(|l| l.strip_suffix(" created"))
        .with_context(|| format!("no name first: {cp:?}"))?;
    assert!(name.starts_with("cp-"), "{cp:?}");
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("Succeeded: 13 files, ")),
        "{cp:?}"
    );
    transfers::assert_same_tree(&src_host, &dst_host)?;
    let api: Api<Transfer> = ns.api();
    assert_eq!(
        api.get(name).await?.status.map(|s| s.phase),
        Some(Phase::Succeeded)
    );

    // The dry run's YAML, applied by kubectl, is a Transfer that runs.
    let (dst2, dst2_host) = node_dir(NODE_B, &ns.name, "dst2")?;
    let dry = plugin(&[
        "cp",
        &format!("{NODE_A}:{src}"),
        &format!("{NODE_B}:{dst2}"),
        "--name",
        "from-yaml",
        "--dry-run=client",
        "-o",
        "yaml",
        "-n",
        &ns.name,
    ])
    .await?;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        api.get_opt("from-yaml").await?.is_none(),
        "a dry run created the Transfer"
    );
    let file = cluster_dir().join(format!("{}-from-yaml.yaml", ns.name));
    std::fs::write(&file, &dry.stdout)?;
    ferry_cluster_tests::operator::kubectl(&["apply", "-f", file.to_str().context("path")?])?;
    transfers::wait_phase(
        &api,
        "from-yaml",
        Duration::from_secs(180),
        Phase::Succeeded,
    )
    .await?;
    transfers::assert_same_tree(&src_host, &dst2_host)?;

    // A fan-out's dry run passes the API server's validation.
    let fan = plugin(&[
        "cp",
        &format!("{NODE_A}:{src}"),
        "/data/ferry-plugin-e2e/fan",
        "--to-nodes",
        &format!("{NODE_A},{NODE_B}"),
        "--name",
        "fan",
        "--dry-run=client",
        "-n",
        &ns.name,
    ])
    .await?;
    assert_eq!(fan.code, 0, "{fan:?}");
    let server = server_dry_run(&file, &fan.stdout)?;
    assert!(
        server.contains("transfer.ferry.dev/fan created (server dry run)"),
        "{server}"
    );
    // So does a scheduled copy into a claim it provisions.
    let nightly = plugin(&[
        "cp",
        "pvc/models",
        "pvc/models-copy",
        "--provision",
        "fromSource",
        "--storage-class",
        "local-path",
        "--schedule",
        "0 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--name",
        "nightly",
        "--dry-run=client",
        "-n",
        &ns.name,
    ])
    .await?;
    assert_eq!(nightly.code, 0, "{nightly:?}");
    assert!(
        nightly.stdout.contains("capacity: fromSource"),
        "{nightly:?}"
    );
    let server = server_dry_run(&file, &nightly.stdout)?;
    assert!(
        server.contains("transfer.ferry.dev/nightly created (server dry run)"),
        "{server}"
    );

    let bad = plugin(&["cp", &src, &format!("{NODE_B}:{dst}"), "-n", &ns.name]).await?;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains("write NODE:/PATH, node/NODE:/PATH or pvc/CLAIM[:/PATH]"),
        "{bad:?}"
    );
    assert_eq!(
        api.list(&Default::default()).await?.items.len(),
        2,
        "a refused cp created something"
    );

    // kubectl completes the plugin through `kubectl_complete-ferry`, a link to the binary.
    let bin = tempfile_dir(&ns.name)?;
    for link in ["kubectl-ferry", "kubectl_complete-ferry"] {
        let _ = std::fs::remove_file(bin.join(link));
        std::os::unix::fs::symlink(workspace_bin("kubectl-ferry")?, bin.join(link))?;
    }
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        ferry_cluster_tests::operator::k8s_tool("kubectl")?
            .parent()
            .context("kubectl's directory")?
            .display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let complete = |words: &[&str]| -> anyhow::Result<Vec<String>> {
        let out = std::process::Command::new(ferry_cluster_tests::operator::k8s_tool("kubectl")?)
            .arg("__complete")
            .arg("ferry")
            .args(words)
            .env("PATH", &path)
            .env("KUBECONFIG", cluster_dir().join("kubeconfig"))
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    };
    let commands = complete(&["wa"])?;
    assert_eq!(commands, ["watch", ":4"], "{commands:?}");
    let names = complete(&["describe", "-n", &ns.name, ""])?;
    assert!(
        names.contains(&name.to_owned()) && names.contains(&"from-yaml".to_owned()),
        "{names:?}"
    );
    let names = complete(&["trigger", "-n", &ns.name, "from"])?;
    assert_eq!(names, ["from-yaml", ":4"], "{names:?}");
    ns.delete().await
}

/// A directory of the cluster's for this test's files.
fn tempfile_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = cluster_dir().join("plugin-bin").join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `kubectl apply --dry-run=server` of `manifest`, written to `file` first.
fn server_dry_run(file: &std::path::Path, manifest: &str) -> anyhow::Result<String> {
    std::fs::write(file, manifest)?;
    ferry_cluster_tests::operator::kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        file.to_str().context("path")?,
    ])
}
