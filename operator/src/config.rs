//! The operator's configuration: mover image and user, which namespaces may use which host
//! roots, the node block store, concurrency limits and pod defaults. Flags of `ferry-operator`
//! (and the Helm chart's values) fill it.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};

use crate::api::{Compression, DEFAULT_STREAMS};

/// One grant: namespaces `namespace` (or `*`) may use host paths under `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRootGrant {
    pub namespace: String,
    pub root: String,
}

impl HostRootGrant {
    /// Parses `NAMESPACE=/ROOT` (`*=/data` grants every namespace).
    pub fn parse(s: &str) -> Result<HostRootGrant, String> {
        let (ns, root) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAMESPACE=/ROOT"))?;
        if ns.is_empty() || !root.starts_with('/') || has_dot_dot(root) {
            return Err(format!(
                "{s:?}: expected NAMESPACE=/ROOT with an absolute root"
            ));
        }
        Ok(HostRootGrant {
            namespace: ns.to_owned(),
            root: root.trim_end_matches('/').to_owned(),
        })
    }
}

fn has_dot_dot(p: &str) -> bool {
    Path::new(p).components().any(|c| c == Component::ParentDir)
}

/// The mover image when none is configured: no registry, so the container runtime looks it up
/// under its own default; installations set `--mover-image` to the image they pushed.
pub const DEFAULT_MOVER_IMAGE: &str = concat!("ferry-mover:", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the cluster, written into every certificate the operator issues.
    pub cluster_name: String,
    /// Namespace of the operator (its CA Secret lives there).
    pub namespace: String,
    pub mover_image: String,
    /// Names of the image pull Secrets of every mover pod (and cleanup pod). They are looked up
    /// in the Transfer's namespace; the operator copies no registry credentials there.
    pub mover_image_pull_secrets: Vec<String>,
    /// uid (and gid, fsGroup) of non-root movers.
    pub mover_uid: i64,
    /// Whether a Transfer may ask for a root mover (`preserveOwnership`).
    pub allow_root_movers: bool,
    pub host_roots: Vec<HostRootGrant>,
    /// The node block store's host directory; `None` turns dedup off everywhere.
    pub cas_root: Option<String>,
    pub cas_cap_bytes: Option<u64>,
    /// Transfers with running movers at once, in the cluster and per node (0 = no limit).
    pub max_active: usize,
    pub max_active_per_node: usize,
    pub default_tolerations: Vec<Toleration>,
    pub default_resources: Option<ResourceRequirements>,
    pub default_priority_class: Option<String>,
    /// Days a mover certificate stays valid.
    pub cert_days: u32,
    /// Ports the movers listen on (data, progress).
    pub data_port: u16,
    pub progress_port: u16,
    pub extra_labels: BTreeMap<String, String>,
    /// Streams and compression of Transfers that set none.
    pub default_streams: u32,
    pub default_compression: Compression,
    /// Where the cross-cluster API listens (`None`: this cluster serves no destination halves).
    pub peering_listen: Option<std::net::SocketAddr>,
    /// Type of the Service in front of a cross-cluster destination's receiver.
    pub peering_service_type: String,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            cluster_name: "local".into(),
            namespace: "ferry-system".into(),
            mover_image: DEFAULT_MOVER_IMAGE.into(),
            mover_image_pull_secrets: Vec::new(),
            mover_uid: 65532,
            allow_root_movers: false,
            host_roots: Vec::new(),
            cas_root: Some("/var/lib/ferry/cas".into()),
            cas_cap_bytes: None,
            max_active: 0,
            max_active_per_node: 0,
            default_tolerations: Vec::new(),
            default_resources: None,
            default_priority_class: None,
            cert_days: 2,
            data_port: 7400,
            progress_port: 7401,
            extra_labels: BTreeMap::new(),
            default_streams: DEFAULT_STREAMS,
            default_compression: Compression::Auto,
            peering_listen: None,
            peering_service_type: "NodePort".into(),
        }
    }
}

impl Config {
    /// Whether `namespace` may use the host path `path` (absolute, no `..`).
    pub fn host_path_allowed(&self, namespace: &str, path: &str) -> bool {
        if !path.starts_with('/') || has_dot_dot(path) {
            return false;
        }
        self.host_roots.iter().any(|g| {
            (g.namespace == "*" || g.namespace == namespace) && Path::new(path).starts_with(&g.root)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_roots_are_granted_per_namespace() {
        let cfg = Config {
            host_roots: vec![
                HostRootGrant::parse("ml=/data").expect("grant"),
                HostRootGrant::parse("*=/scratch/").expect("grant"),
            ],
            ..Config::default()
        };
        assert!(cfg.host_path_allowed("ml", "/data/imagenet"));
        assert!(cfg.host_path_allowed("ml", "/data"));
        assert!(!cfg.host_path_allowed("web", "/data/imagenet"));
        assert!(cfg.host_path_allowed("web", "/scratch/x"));
        assert!(
            !cfg.host_path_allowed("ml", "/datax/y"),
            "prefix of a name is not a root"
        );
        assert!(!cfg.host_path_allowed("ml", "/data/../etc"));
        assert!(!cfg.host_path_allowed("ml", "data/x"));
        assert!(HostRootGrant::parse("ml=data").is_err());
        assert!(HostRootGrant::parse("/data").is_err());
    }
}
