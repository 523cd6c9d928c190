//! What the operator's end-to-end tests share: one operator per test file, host directories on
//! the local cluster's nodes, datasets, Transfers and waiting for their phase.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use ferry_operator::api::{Phase, Transfer};
use kube::Api;

use crate::node_root;
use crate::operator::{OperatorProcess, install_crd_and_rbac, prepare_nodes};

/// The uid the operator runs movers as (its default).
pub const MOVER_UID: u32 = 65532;
pub const NODE_A: &str = "node-a";
pub const NODE_B: &str = "node-b";
pub const NODE_C: &str = "node-c";
pub const NODE_E: &str = "node-e";
/// The tainted node (`ferry.dev/disruptive`) that tests may stop: only tolerating pods land there.
pub const NODE_X: &str = "node-x";

/// The operator every test of one file shares, started by the first test that needs it, with
/// its own host root and Lease (as one operator serves a cluster).
pub struct SharedOperator {
    cell: tokio::sync::OnceCell<Result<OperatorProcess, String>>,
    name: &'static str,
    host_root: &'static str,
    extra: &'static [&'static str],
}

impl SharedOperator {
    pub const fn new(name: &'static str, host_root: &'static str) -> SharedOperator {
        SharedOperator::with_flags(name, host_root, &[])
    }

    /// The same, with more operator flags.
    pub const fn with_flags(
        name: &'static str,
        host_root: &'static str,
        extra: &'static [&'static str],
    ) -> SharedOperator {
        SharedOperator {
            cell: tokio::sync::OnceCell::const_new(),
            name,
            host_root,
            extra,
        }
    }

    /// Starts it once (CRD, RBAC, node directories first); later calls return at once.
    pub async fn ensure(&self) -> anyhow::Result<()> {
        let started = self
            .cell
            .get_or_init(|| async {
                async {
                    install_crd_and_rbac()?;
                    prepare_nodes(self.host_root, MOVER_UID, &[NODE_A, NODE_B])?;
                    OperatorProcess::start_in(
                        crate::Cluster::Main,
                        self.name,
                        self.host_root,
                        self.name,
                        self.extra,
                    )
                    .await
                }
                .await
                .map_err(|e| format!("{e:#}"))
            })
            .await;
        match started {
            Ok(_) => Ok(()),
            Err(e) => bail!("the test operator did not start: {e}"),
        }
    }
}

/// A directory `host_root/ns/name` on a node, owned by the movers' uid; returns its path as the
/// Transfer names it and as the host sees it.
pub fn node_dir(
    host_root: &str,
    node: &str,
    ns: &str,
    name: &str,
) -> anyhow::Result<(String, PathBuf)> {
    let rel = format!("{host_root}/{ns}/{name}");
    let on_host = node_root(node).join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(&on_host)?;
    for p in [on_host.parent().context("parent")?, &on_host] {
        std::os::unix::fs::chown(p, Some(MOVER_UID), Some(MOVER_UID))?;
    }
    Ok((rel, on_host))
}

/// Small files in nested directories plus one large file with a deterministic pattern.
/// `seed` makes the large file's content unique, so no test finds another's blocks in a node's
/// block store unless it means to.
pub fn make_tree(root: &Path, small: usize, large_mib: usize, seed: &str) -> anyhow::Result<()> {
    for i in 0..small {
        let dir = root.join(format!("d{:02}", i % 17));
        std::fs::create_dir_all(&dir)?;
        let body: Vec<u8> = (0..(i % 5000 + 1))
            .map(|j| ((i * 31 + j) % 251) as u8)
            .collect();
        std::fs::write(dir.join(format!("f{i}.bin")), body)?;
    }
    if large_mib > 0 {
        let mut big = Vec::with_capacity(large_mib << 20);
        let mut x: u64 =
            u64::from_le_bytes(blake3::hash(seed.as_bytes()).as_bytes()[..8].try_into()?) | 1;
        while big.len() < large_mib << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            big.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(root.join("large.bin"), big)?;
    }
    // A private directory: its mode must arrive too. The data belongs to the movers' user.
    if small > 0 {
        std::fs::set_permissions(root.join("d00"), std::fs::Permissions::from_mode(0o750))?;
    }
    chown_tree(root)
}

/// `count` files of `len` bytes of incompressible content under `root` (100 to a directory,
/// as image datasets are laid out), owned by the movers' user, different for each `seed`.
pub fn add_small_files(root: &Path, count: usize, len: usize, seed: &str) -> anyhow::Result<()> {
    let mut x: u64 =
        u64::from_le_bytes(blake3::hash(seed.as_bytes()).as_bytes()[..8].try_into()?) | 1;
    for i in 0..count {
        let dir = root.join(format!("{:04}", i / 100));
        std::fs::create_dir_all(&dir)?;
        let mut body = Vec::with_capacity(len + 8);
        while body.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            body.extend_from_slice(&x.to_le_bytes());
        }
        body.truncate(len);
        std::fs::write(dir.join(format!("img-{i:05}.jpg")), body)?;
    }
    chown_tree(root)
}

/// A directory `private` in `root` (owned by root, mode 0700) that the movers' user cannot read:
/// a source fault no retry fixes.
pub fn add_unreadable_dir(root: &Path) -> anyhow::Result<()> {
    let private = root.join("private");
    std::fs::create_dir(&private)?;
    std::fs::write(private.join("secret"), b"x")?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

pub fn chown_tree(root: &Path) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(root, Some(MOVER_UID), Some(MOVER_UID))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for e in std::fs::read_dir(root)? {
            chown_tree(&e?.path())?;
        }
    }
    Ok(())
}

/// Every file of `src` is in `dst` with the same bytes, mode and mtime; returns how many.
pub fn assert_same_tree(src: &Path, dst: &Path) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(src.join(&rel))? {
            let e = e?;
            let r = rel.join(e.file_name());
            let (a, b) = (src.join(&r), dst.join(&r));
            let (ma, mb) = (
                std::fs::symlink_metadata(&a)?,
                std::fs::symlink_metadata(&b)
                    .with_context(|| format!("{} missing", b.display()))?,
            );
            if ma.is_dir() {
                stack.push(r);
                continue;
            }
            if std::fs::read(&a)? != std::fs::read(&b)? {
                bail!("{} differs", r.display());
            }
            if ma.mode() & 0o777 != mb.mode() & 0o777 || ma.mtime() != mb.mtime() {
                bail!("metadata of {} differs", r.display());
            }
            n += 1;
        }
    }
    Ok(n)
}

/// A hostPath-to-hostPath Transfer `(node, path)` -> `(node, path)`; `extra` adds spec fields.
pub fn transfer(
    name: &str,
    src: (&str, &str),
    dst: (&str, &str),
    extra: serde_json::Value,
) -> anyhow::Result<Transfer> {
    let mut spec = serde_json::json!({
        "source": {"hostPath": {"node": src.0, "path": src.1}},
        "destination": {"hostPath": {"node": dst.0, "path": dst.1}},
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    crate::from_json(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "Transfer",
        "metadata": {"name": name},
        "spec": spec,
    }))
}

/// Waits until Transfer `name` is in phase `want`; fails early when it failed instead.
pub async fn wait_phase(
    api: &Api<Transfer>,
    name: &str,
    timeout: Duration,
    want: Phase,
) -> anyhow::Result<Transfer> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let t = api.get(name).await?;
        let phase = t.status.as_ref().map(|s| s.phase);
        if phase == Some(want) {
            return Ok(t);
        }
        if phase == Some(Phase::Failed) || tokio::time::Instant::now() >= deadline {
            bail!("Transfer {name} is not {want:?}; status: {:?}", t.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `check` holds for Transfer `name`'s status; returns that status, or fails with
/// the last one seen.
pub async fn wait_status(
    api: &Api<Transfer>,
    name: &str,
    timeout: Duration,
    what: &str,
    check: impl Fn(&ferry_operator::api::TransferStatus) -> bool,
) -> anyhow::Result<ferry_operator::api::TransferStatus> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let st = api.get(name).await?.status.unwrap_or_default();
        if check(&st) {
            return Ok(st);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{name}: timed out after {timeout:?} waiting for {what}; last status {st:#?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Unix second of the `n`-th whole minute after now (1: the next one).
pub fn minute_boundary(n: i64) -> i64 {
    (k8s_openapi::jiff::Timestamp::now().as_second() / 60 + n) * 60
}

/// Waits until the clock is `margin` seconds past Unix second `at`.
pub async fn wait_past(at: i64, margin: i64) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(
        u64::try_from(at + margin - k8s_openapi::jiff::Timestamp::now().as_second()).unwrap_or(0)
            + 5,
    );
    crate::wait_until(timeout, "a minute boundary to pass", || async move {
        Ok(k8s_openapi::jiff::Timestamp::now().as_second() > at + margin)
    })
    .await
}

/// The storage a claim requests (`spec.resources.requests.storage`).
pub async fn claim_request(
    claims: &Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    name: &str,
) -> anyhow::Result<String> {
    claims
        .get(name)
        .await?
        .spec
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned())
        .map(|q| q.0)
        .with_context(|| format!("claim {name} requests no storage"))
}
