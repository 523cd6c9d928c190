//! What every reconcile shares (the clients, caches and limiters), and what can go wrong in one,
//! by category.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::Recorder;

use crate::api::{Peer, Transfer};
use crate::cache::{Caches, OwnWrites, SecretBook};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::peering::client::PeerClient;
use crate::peering::registry::Registry;
use crate::pki::Authority;
use crate::progress::Watchers;

/// What went wrong in one reconcile, by category (metric label and requeue policy).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("certificates: {0}")]
    Pki(#[from] crate::pki::PkiError),
    #[error("the Transfer has no {0}")]
    Malformed(&'static str),
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Pki(_) => "pki",
            Error::Malformed(_) => "invalid",
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub config: Config,
    pub authority: Arc<Authority>,
    /// The Peers of this cluster (cluster-scoped), kept by a reflector.
    pub peers: kube::runtime::reflector::Store<Peer>,
    /// What the source halves calling this cluster last reported.
    pub registry: Arc<Registry>,
    pub peer_client: PeerClient,
    pub watchers: Watchers,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Transfers the controller knows (for the concurrency limit).
    pub store: kube::runtime::reflector::Store<Transfer>,
    pub limiter: Arc<crate::status::PatchLimiter>,
    /// Everything else reconcile observes.
    pub caches: Caches,
    pub secrets: SecretBook,
    pub own_writes: OwnWrites,
    /// When this operator began to act (it leads): silences of the other cluster are measured
    /// from here at the earliest, since nothing before was heard by this process.
    pub acting_since: Timestamp,
    /// Reconciles that failed in a row, per Transfer UID (the error policy's backoff).
    pub failing: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}
