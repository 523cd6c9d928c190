//! Keeps the node services' certificate Secret (`ferry-node-tls` in the operator's namespace)
//! issued and fresh: created when missing, reissued when half its life has passed or the CA
//! changed. The `ferry-node` DaemonSet mounts it; the service reads it again every minute.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};

use crate::pki::Authority;

pub const NODE_SECRET: &str = "ferry-node-tls";
/// When the certificate in the Secret should be replaced (RFC 3339).
const RENEW_AFTER: &str = "ferry.dev/renew-after";
const CHECK_EVERY: Duration = Duration::from_secs(600);

/// Whether the stored Secret must be (re)issued: missing, past its renewal time, unreadable, or
/// from another CA. Pure.
pub fn needs_issue(stored: Option<&Secret>, ca_pem: &str, now: Timestamp) -> bool {
    let Some(s) = stored else { return true };
    let renew_after = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RENEW_AFTER))
        .and_then(|t| t.parse::<Timestamp>().ok());
    let ca = s
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| b.0.as_slice());
    renew_after.is_none_or(|t| now >= t) || ca != Some(ca_pem.as_bytes())
}

/// The Secret for `files`, to be renewed after half of `cert_days`.
pub fn secret(
    namespace: &str,
    files: BTreeMap<String, String>,
    now: Timestamp,
    cert_days: u32,
) -> Secret {
    let half = Duration::from_secs(u64::from(cert_days) * 86_400 / 2);
    let renew = now
        .checked_add(half)
        .unwrap_or(now)
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(now);
    Secret {
        metadata: ObjectMeta {
            name: Some(NODE_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "ferry-operator".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                RENEW_AFTER.to_owned(),
                renew.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            files
                .into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Checks the Secret now and every ten minutes until the process ends.
pub fn spawn_keeper(client: kube::Client, namespace: String, authority: Arc<Authority>, days: u32) {
    tokio::spawn(async move {
        let api: Api<Secret> = Api::namespaced(client, &namespace);
        loop {
            if let Err(e) = keep(&api, &namespace, &authority, days).await {
                tracing::warn!(error = %e, "could not check the node services' certificate");
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    });
}

async fn keep(
    api: &Api<Secret>,
    namespace: &str,
    authority: &Authority,
    days: u32,
) -> anyhow::Result<()> {
    let stored = api.get_opt(NODE_SECRET).await?;
    let now = Timestamp::now();
    if !needs_issue(stored.as_ref(), authority.ca_pem(), now) {
        return Ok(());
    }
    let s = secret(namespace, authority.node_service_files()?, now, days);
    api.patch(
        NODE_SECRET,
        &PatchParams::apply(crate::names::MANAGER).force(),
        &Patch::Apply(&s),
    )
    .await?;
    tracing::info!(
        secret = NODE_SECRET,
        "issued the node services' certificate"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_when_missing_stale_or_from_another_ca() {
        let now: Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let files = BTreeMap::from([("ca.crt".to_owned(), "CA1".to_owned())]);
        let s = secret("ferry-system", files, now, 2);
        assert!(needs_issue(None, "CA1", now));
        assert!(!needs_issue(Some(&s), "CA1", now));
        let day_later: Timestamp = "2026-11-28T00:00:00Z".parse().unwrap();
        assert!(
            needs_issue(Some(&s), "CA1", day_later),
            "half of two days passed"
        );
        assert!(needs_issue(Some(&s), "CA2", now), "the CA changed");
        let mut bare = s.clone();
        bare.metadata.annotations = None;
        assert!(needs_issue(Some(&bare), "CA1", now));
    }
}
