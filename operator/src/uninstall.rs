//! `ferry-operator pre-uninstall`: the Helm pre-delete hook.
//!
//! Every Transfer carries the finalizer `ferry.dev/cleanup`, which only a running operator removes.
//! Uninstalling the operator while Transfers exist would leave them, and their namespaces, stuck
//! Terminating on a finalizer nobody serves. So the hook runs while the operator still does and
//! either refuses (the default: the uninstall fails and nothing changes) or, when the release
//! says `uninstall.deleteTransfers: true`, deletes every Transfer and waits until the operator has
//! cleaned each one up.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};

use crate::api::Transfer;

/// What to do about the Transfers that exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Fail the uninstall while any Transfer exists.
    Refuse,
    /// Delete them all and wait until they are gone.
    DeleteAll,
}

/// `namespace/name (phase)`, one per Transfer, sorted.
pub fn describe(transfers: &[Transfer]) -> Vec<String> {
    let mut lines: Vec<String> = transfers
        .iter()
        .map(|t| {
            let phase = t
                .status
                .as_ref()
                .map(|s| format!("{:?}", s.phase))
                .unwrap_or_else(|| "New".into());
            format!(
                "{}/{} ({phase})",
                t.namespace().unwrap_or_default(),
                t.name_any()
            )
        })
        .collect();
    lines.sort();
    lines
}

/// The refusal, naming every Transfer and both ways forward.
pub fn refusal(transfers: &[Transfer]) -> String {
    let list = describe(transfers);
    let shown: Vec<&str> = list.iter().take(20).map(String::as_str).collect();
    let more = list.len().saturating_sub(shown.len());
    format!(
        "refusing to uninstall ferry: {} Transfer(s) exist, and without the operator their \
         finalizer would never be removed: {}{}. Nothing was changed and the operator keeps \
         running (Helm shows the release as 'uninstalling'). Either delete the Transfers \
         (kubectl delete transfers --all -A; the data already moved stays) and run helm \
         uninstall again, or let the uninstall delete them: helm rollback RELEASE; helm upgrade \
         RELEASE CHART --reuse-values --set uninstall.deleteTransfers=true; helm uninstall \
         RELEASE.",
        list.len(),
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// Runs the hook. Ok means the uninstall may proceed.
pub async fn run(client: Client, policy: Policy, timeout: Duration) -> anyhow::Result<String> {
    let api: Api<Transfer> = Api::all(client.clone());
    let existing = api
        .list(&ListParams::default())
        .await
        .context("failed to list Transfers")?
        .items;
    if existing.is_empty() {
        return Ok("no Transfers exist; the uninstall may proceed".into());
    }
    if policy == Policy::Refuse {
        bail!(refusal(&existing));
    }
    for t in &existing {
        let ns = t.namespace().unwrap_or_default();
        let api: Api<Transfer> = Api::namespaced(client.clone(), &ns);
        match api.delete(&t.name_any(), &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("failed to delete {ns}/{}", t.name_any()));
            }
        }
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = api.list(&ListParams::default()).await?.items;
        if left.is_empty() {
            return Ok(format!(
                "deleted {} Transfer(s) and the operator cleaned each one up; the uninstall may proceed",
                existing.len()
            ));
        }
        if Instant::now() >= deadline {
            bail!(
                "{} Transfer(s) still exist after {}s (is the operator running?): {}",
                left.len(),
                timeout.as_secs(),
                describe(&left).join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransferSpec;

    fn transfer(ns: &str, name: &str) -> Transfer {
        let spec: TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/x"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/x"}},
        }))
        .expect("spec");
        let mut t = Transfer::new(name, spec);
        t.metadata.namespace = Some(ns.into());
        t
    }

    #[test]
    fn refusal_names_every_transfer_and_both_ways_out() {
        let msg = refusal(&[transfer("ml", "b"), transfer("ml", "a")]);
        assert!(msg.contains("2 Transfer(s) exist"), "{msg}");
        assert!(msg.contains("ml/a (New), ml/b (New)"), "{msg}");
        assert!(msg.contains("kubectl delete transfers --all -A"), "{msg}");
        assert!(msg.contains("uninstall.deleteTransfers=true"), "{msg}");
    }

    #[test]
    fn refusal_caps_the_list() {
        let many: Vec<Transfer> = (0..25)
            .map(|i| transfer("ns", &format!("t{i:02}")))
            .collect();
        let msg = refusal(&many);
        assert!(msg.contains("ns/t19"), "{msg}");
        assert!(!msg.contains("ns/t20"), "{msg}");
        assert!(msg.contains("and 5 more"), "{msg}");
    }
}
