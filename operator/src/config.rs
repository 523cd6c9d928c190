//! The operator's configuration: mover image and user, which namespaces may use which host
//! roots, the node block store, concurrency limits and pod defaults. Flags of `ferry-operator`
//! (and the Helm chart's values) fill it.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};

use crate::api::{Compression, DEFAULT_STREAMS};

/// The placeholder a grant's root may contain: each namespace gets its own directory.
pub const NAMESPACE_PLACEHOLDER: &str = "{namespace}";

/// One grant: namespaces `namespace` (or `*`) may use host paths under `root`, for reading
/// only when `read_only`. `root` may contain `{namespace}`, replaced by the Transfer's namespace,
/// so that one line (`*=/data/tenants/{namespace}`) gives every namespace a root of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRootGrant {
    pub namespace: String,
    pub root: String,
    pub read_only: bool,
}

impl HostRootGrant {
    /// Parses `NAMESPACE=/ROOT[:ro]` (`*=/data` grants every namespace; `:ro` only for sources).
    pub fn parse(s: &str) -> Result<HostRootGrant, String> {
        let (ns, root) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAMESPACE=/ROOT[:ro]"))?;
        let (root, read_only) = match root.strip_suffix(":ro") {
            Some(r) => (r, true),
            None => (root.strip_suffix(":rw").unwrap_or(root), false),
        };
        if ns.is_empty() || !root.starts_with('/') || has_dot_dot(root) {
            return Err(format!(
                "{s:?}: expected NAMESPACE=/ROOT[:ro] with an absolute root"
            ));
        }
        let without = root.replace(NAMESPACE_PLACEHOLDER, "");
        if without.contains(['{', '}']) {
            return Err(format!(
                "{s:?}: the only placeholder a root may contain is {NAMESPACE_PLACEHOLDER}"
            ));
        }
        if root.contains(NAMESPACE_PLACEHOLDER)
            && root
                .split('/')
                .any(|c| c.contains(NAMESPACE_PLACEHOLDER) && c != NAMESPACE_PLACEHOLDER)
        {
            return Err(format!(
                "{s:?}: {NAMESPACE_PLACEHOLDER} must be a whole path component (/data/{NAMESPACE_PLACEHOLDER}/x)"
            ));
        }
        Ok(HostRootGrant {
            namespace: ns.to_owned(),
            root: root.trim_end_matches('/').to_owned(),
            read_only,
        })
    }

    /// The root this grant gives `namespace`, if it grants it anything.
    fn root_for(&self, namespace: &str) -> Option<String> {
        (self.namespace == "*" || self.namespace == namespace)
            .then(|| self.root.replace(NAMESPACE_PLACEHOLDER, namespace))
    }
}

/// A host path resolved against the grants: the granted root a mover mounts, and the directory
/// beneath it that the mover opens itself (refusing symlinks on the way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedPath {
    pub root: String,
    /// Without leading or trailing `/`; empty for the root itself.
    pub sub_path: String,
}

/// Why a host path is not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantRefusal {
    /// No grant of this namespace covers the path.
    NotGranted,
    /// Only read-only grants cover it, and the side writes.
    ReadOnly { root: String },
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
    /// Whether a Transfer may ask for a sender with CAP_DAC_READ_SEARCH (`readAllFiles`).
    pub allow_privileged_readers: bool,
    pub host_roots: Vec<HostRootGrant>,
    /// HOST:PORT of the node services (the `ferry-node` DaemonSet behind a Service that keeps
    /// traffic on the node) that receivers take blocks from; `None` turns dedup off everywhere.
    pub block_service: Option<String>,
    /// Whether to pre-bind each node-service pod's store claim to its node's PersistentVolume
    /// (labelled `ferry.dev/node-store`), so a node's store outlives its pod
    /// ([`crate::store_volumes`]).
    pub node_store_volumes: bool,
    /// Transfers with running movers at once, in the cluster and per node (0 = no limit).
    pub max_active: usize,
    pub max_active_per_node: usize,
    pub max_active_per_namespace: usize,
    /// How long a mover pod may stay pending (unschedulable, image not pulled, volume not
    /// mounted) before its attempt fails and is retried.
    pub mover_pending_timeout: std::time::Duration,
    pub default_tolerations: Vec<Toleration>,
    pub default_resources: Option<ResourceRequirements>,
    pub default_priority_class: Option<String>,
    /// Priority classes a Transfer may ask for besides the default.
    pub allowed_priority_classes: Vec<String>,
    /// Days a mover certificate stays valid.
    pub cert_days: u32,
    /// Ports the movers listen on (data, progress).
    pub data_port: u16,
    pub progress_port: u16,
    /// Whether each Transfer gets a NetworkPolicy that admits only ferry's own traffic to its
    /// movers ([`crate::apply::network_policy`]).
    pub network_policies: bool,
    /// Address blocks (CIDR) admitted to the movers' progress port besides the operator's
    /// namespace: an operator that runs outside the cluster.
    pub network_policy_peers: Vec<String>,
    pub extra_labels: BTreeMap<String, String>,
    /// Streams and compression of Transfers that set none.
    pub default_streams: u32,
    pub default_compression: Compression,
    /// Where the cross-cluster API listens (`None`: this cluster serves no destination halves).
    pub peering_listen: Option<std::net::SocketAddr>,
    /// Type of the Service in front of a cross-cluster destination's receiver.
    pub peering_service_type: String,
    /// Progress status patches per second for the whole operator (changes of state are never
    /// held back).
    pub status_patch_qps: f64,
    /// Progress streams read at once.
    pub max_progress_watchers: usize,
    /// How long the other half of a cross-cluster Transfer may stay silent (unreachable,
    /// answering 429 or 503) before this half stops its mover; measured from this operator's
    /// own start at the earliest.
    pub peer_silence_grace: std::time::Duration,
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
            allow_privileged_readers: false,
            host_roots: Vec::new(),
            block_service: Some("ferry-node.ferry-system.svc:7443".into()),
            node_store_volumes: false,
            max_active: 0,
            max_active_per_node: 0,
            max_active_per_namespace: 0,
            mover_pending_timeout: std::time::Duration::from_secs(300),
            default_tolerations: Vec::new(),
            default_resources: None,
            default_priority_class: None,
            allowed_priority_classes: Vec::new(),
            cert_days: 2,
            data_port: 7400,
            progress_port: 7401,
            network_policies: false,
            network_policy_peers: Vec::new(),
            extra_labels: BTreeMap::new(),
            default_streams: DEFAULT_STREAMS,
            default_compression: Compression::Auto,
            peering_listen: None,
            peering_service_type: "NodePort".into(),
            status_patch_qps: crate::status::DEFAULT_PATCH_QPS,
            max_progress_watchers: 1000,
            peer_silence_grace: std::time::Duration::from_secs(60),
        }
    }
}

impl Config {
    /// Whether a Transfer may run its movers at priority class `name`: the admin's default or
    /// one the admin allows (a tenant must not preempt others' pods by choosing a high one).
    pub fn priority_class_allowed(&self, name: &str) -> bool {
        self.default_priority_class.as_deref() == Some(name)
            || self.allowed_priority_classes.iter().any(|c| c == name)
    }

    /// The grant that covers `path` for `namespace`: the deepest granted root containing it that
    /// allows writing when `write` is asked for.
    pub fn grant_for(
        &self,
        namespace: &str,
        path: &str,
        write: bool,
    ) -> Result<GrantedPath, GrantRefusal> {
        if !path.starts_with('/') || has_dot_dot(path) {
            return Err(GrantRefusal::NotGranted);
        }
        let covering: Vec<(String, bool)> = self
            .host_roots
            .iter()
            .filter_map(|g| g.root_for(namespace).map(|r| (r, g.read_only)))
            .filter(|(root, _)| Path::new(path).starts_with(root))
            .collect();
        let usable = covering
            .iter()
            .filter(|(_, read_only)| !(write && *read_only))
            .max_by_key(|(root, _)| Path::new(root).components().count());
        match usable {
            Some((root, _)) => {
                let rest = Path::new(path)
                    .strip_prefix(root)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Ok(GrantedPath {
                    root: root.clone(),
                    sub_path: rest.trim_matches('/').to_owned(),
                })
            }
            None => match covering.into_iter().next() {
                Some((root, _)) => Err(GrantRefusal::ReadOnly { root }),
                None => Err(GrantRefusal::NotGranted),
            },
        }
    }

    /// Whether `namespace` may use the host path `path` (absolute, no `..`) at least for reading.
    pub fn host_path_allowed(&self, namespace: &str, path: &str) -> bool {
        self.grant_for(namespace, path, false).is_ok()
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

    #[test]
    fn the_namespace_placeholder_gives_each_namespace_its_own_root() {
        let cfg = Config {
            host_roots: vec![HostRootGrant::parse("*=/data/tenants/{namespace}").expect("grant")],
            ..Config::default()
        };
        assert_eq!(
            cfg.grant_for("ml", "/data/tenants/ml/sets/a", true),
            Ok(GrantedPath {
                root: "/data/tenants/ml".into(),
                sub_path: "sets/a".into()
            })
        );
        assert_eq!(
            cfg.grant_for("web", "/data/tenants/ml/sets/a", false),
            Err(GrantRefusal::NotGranted)
        );
        assert!(cfg.host_path_allowed("web", "/data/tenants/web"));
        assert!(!cfg.host_path_allowed("web", "/data/tenants"));
        for bad in [
            "*=/data/x{namespace}",
            "*=/data/{name}",
            "*=/data/{namespace",
        ] {
            assert!(HostRootGrant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn read_only_grants_serve_sources_only_and_the_deepest_usable_root_is_mounted() {
        let cfg = Config {
            host_roots: vec![
                HostRootGrant::parse("*=/data/shared:ro").expect("grant"),
                HostRootGrant::parse("ml=/data").expect("grant"),
                HostRootGrant::parse("ml=/data/ml:rw").expect("grant"),
            ],
            ..Config::default()
        };
        assert!(cfg.host_roots[0].read_only && !cfg.host_roots[2].read_only);
        assert_eq!(
            cfg.grant_for("web", "/data/shared/imagenet", false),
            Ok(GrantedPath {
                root: "/data/shared".into(),
                sub_path: "imagenet".into()
            })
        );
        assert_eq!(
            cfg.grant_for("web", "/data/shared/imagenet", true),
            Err(GrantRefusal::ReadOnly {
                root: "/data/shared".into()
            })
        );
        // ml writes there through its own wider grant.
        assert_eq!(
            cfg.grant_for("ml", "/data/shared/out", true)
                .map(|g| g.root),
            Ok("/data".into())
        );
        assert_eq!(
            cfg.grant_for("ml", "/data/ml/x", true),
            Ok(GrantedPath {
                root: "/data/ml".into(),
                sub_path: "x".into()
            })
        );
        assert_eq!(
            cfg.grant_for("ml", "/data", true),
            Ok(GrantedPath {
                root: "/data".into(),
                sub_path: String::new()
            })
        );
    }
}
