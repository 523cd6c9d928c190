//! The Argo CD health check of Transfers (`deploy/argocd/transfer-health.lua`) run by a real Lua
//! interpreter as Argo CD runs it: the object as the global `obj`, the returned status and
//! message. `tests/scripts/argocd-health.lua` does the running; Debian's `lua5.4` and
//! `lua-cjson` come from `make deps`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use ferry_operator::api::Transfer;

/// The health check, relative to the workspace root.
pub const HEALTH_SCRIPT: &str = "deploy/argocd/transfer-health.lua";
/// What runs it on one object, relative to the workspace root.
pub const RUNNER: &str = "tests/scripts/argocd-health.lua";

/// The workspace root (this crate is `tests/cluster-tests`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Argo CD's (status, message) for `t`.
pub fn argocd_health(t: &Transfer) -> anyhow::Result<(String, String)> {
    let json = serde_json::to_value(t).context("failed to serialize the Transfer")?;
    argocd_health_json(&json)
}

/// Argo CD's (status, message) for a Transfer given as JSON, as the API server would return it
/// (every field kept, whether or not the Rust types know it).
pub fn argocd_health_json(obj: &serde_json::Value) -> anyhow::Result<(String, String)> {
    run_health_script(HEALTH_SCRIPT, obj)
}

/// Runs health script `script` (relative to the workspace root, or absolute) on `obj`.
pub fn run_health_script(
    script: &str,
    obj: &serde_json::Value,
) -> anyhow::Result<(String, String)> {
    let mut child = Command::new("lua5.4")
        .args([RUNNER, script])
        .current_dir(workspace_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to run lua5.4 (install it and lua-cjson with `make deps`)")?;
    // The runner reads all of its input before it writes anything.
    let mut stdin = child.stdin.take().context("no stdin")?;
    stdin.write_all(&serde_json::to_vec(obj)?)?;
    drop(stdin);
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "lua5.4 {RUNNER} {script} failed ({}): {}{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    let line = stdout.strip_suffix('\n').unwrap_or(&stdout);
    let (status, message) = line
        .split_once('\t')
        .with_context(|| format!("{RUNNER} printed no status<TAB>message: {stdout:?}"))?;
    Ok((status.to_owned(), message.to_owned()))
}
