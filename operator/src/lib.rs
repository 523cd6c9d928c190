//! ferry-operator: reconciles `Transfer` resources (`ferry.dev/v1alpha1`) into a receiver pod
//! next to the destination and a sender pod next to the source, issues their certificates,
//! follows their progress and writes it into the Transfer's status. See docs/operator.md.
//!
//! One reconcile, by stage: [`reconcile`] (the wiring, error policy, finalizer) runs
//! [`observe`] (reads the caches, decides nothing), [`plan`] (every decision, pure),
//! [`apply`] (carries the decisions out, decides nothing) and [`status`] (the writer, the patch
//! budget, Events).

pub mod api_metrics;
pub mod apply;
pub mod cache;
pub mod census;
pub mod config;
pub mod context;
pub mod leader;
pub mod metrics;
pub mod node_service;
pub mod observe;
pub mod peering;
pub mod pki;
pub mod plan;
pub mod progress;
pub mod reconcile;
pub mod status;
pub mod store_volumes;
pub mod uninstall;

pub use ferry_api as api;
pub use ferry_api::names;
pub use ferry_api::{API_GROUP, API_VERSION, crd_yaml, peer_crd_yaml};

/// The user the apiserver sees for `client` (a SelfSubjectReview).
pub async fn whoami(client: &kube::Client) -> Result<String, kube::Error> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = api
        .create(&Default::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}
