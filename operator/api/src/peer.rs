//! The `Peer` custom resource (`ferry.dev/v1alpha1`, cluster-scoped): another cluster this
//! cluster exchanges Transfers with. It holds only public data (the peer operator's CA
//! certificates and the address of its cross-cluster endpoint), so both Peers can live in Git.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Another cluster ferry pairs Transfers with.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Peer",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PeerSpec {
    /// The peer's cluster name, as its operator writes it into every certificate it issues (its
    /// `--cluster-name`, the chart's `clusterName`). The peer's CA is trusted for identities of
    /// this cluster only.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9._-]+$')").message("clusterName may use A-Z a-z 0-9 . _ - only"))]
    pub cluster_name: String,
    /// PEM certificates of the peer operator's CA (public; `kubectl get secret ferry-ca -o
    /// jsonpath='{.data.tls\.crt}'` in the peer cluster). During a CA rotation, the old and the
    /// new one.
    #[schemars(length(min = 1, max = 65536))]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')").message("caBundle must hold PEM certificates"))]
    pub ca_bundle: String,
    /// `host:port` of the peer's cross-cluster endpoint (a NodePort or LoadBalancer Service in
    /// front of its operator).
    #[schemars(length(min = 3, max = 261))]
    pub endpoint: String,
}
