//! Where each mover runs and what it mounts (pure: the facts come from `observe`).
//!
//! A hostPath side runs on its node (node selector). A claim side runs where its volume can be
//! mounted: on the node of a running pod that already mounts the claim (an RWO volume cannot be
//! attached twice elsewhere), otherwise wherever the scheduler puts it (it honours a local PV's
//! node affinity by itself). `nodeName` is never set.

use crate::api::{Endpoint, Reason, Side};
use crate::config::{Config, GrantRefusal};
pub use crate::names::is_dns_subdomain;

/// The volume a mover mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeRef {
    /// A granted host root (never a path below it: see [`SidePlacement::sub_path`]).
    HostPath {
        path: String,
    },
    Claim {
        claim: String,
    },
    /// The side is a Transfer in another cluster: no mover of this cluster serves it.
    Remote,
}

/// Everything a mover pod needs to know about its side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidePlacement {
    pub volume: VolumeRef,
    /// Directory inside the volume, without leading or trailing `/` (empty: the volume root).
    pub sub_path: String,
    /// The node the mover must run on, if any.
    pub node: Option<String>,
}

/// What the cluster says about one side's volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideFacts {
    /// For a claim side: whether the claim exists.
    pub claim_exists: bool,
    /// For a claim side: the node of a running pod (not ferry's) that mounts the claim.
    pub claim_in_use_on: Option<String>,
    /// For a hostPath side: whether the node exists.
    pub node_exists: bool,
}

/// Why a side cannot be placed (a condition reason and a message a person can act on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub reason: Reason,
    pub message: String,
}

fn blocked(reason: Reason, message: String) -> Blocked {
    Blocked { reason, message }
}

/// Normalises a path inside a volume; `None` if it tries to leave it.
pub fn clean_sub_path(path: &str) -> Option<String> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// Places one side, or says why it cannot be placed.
pub fn place_side(
    side: Side,
    endpoint: &Endpoint,
    namespace: &str,
    config: &Config,
    facts: &SideFacts,
) -> Result<SidePlacement, Blocked> {
    let which = side.as_str();
    match (&endpoint.pvc, &endpoint.host_path, &endpoint.remote) {
        (Some(pvc), None, None) => {
            if !is_dns_subdomain(&pvc.claim_name) {
                return Err(blocked(
                    Reason::InvalidSpec,
                    format!(
                        "{which}.pvc.claimName {:?} is not a valid object name (a DNS subdomain)",
                        pvc.claim_name
                    ),
                ));
            }
            let sub_path = clean_sub_path(&pvc.path).ok_or_else(|| {
                blocked(
                    Reason::InvalidSpec,
                    format!("{which}.pvc.path {:?} must not contain '..'", pvc.path),
                )
            })?;
            if !facts.claim_exists {
                let reason = match side {
                    Side::Source => Reason::SourceClaimNotFound,
                    Side::Destination => Reason::DestinationClaimNotFound,
                };
                return Err(blocked(
                    reason,
                    format!(
                        "PersistentVolumeClaim {namespace}/{} does not exist; the Transfer starts once it does",
                        pvc.claim_name
                    ),
                ));
            }
            Ok(SidePlacement {
                volume: VolumeRef::Claim {
                    claim: pvc.claim_name.clone(),
                },
                sub_path,
                node: facts.claim_in_use_on.clone(),
            })
        }
        (None, Some(hp), None) => {
            if !is_dns_subdomain(&hp.node) {
                return Err(blocked(
                    Reason::InvalidSpec,
                    format!(
                        "{which}.hostPath.node {:?} is not a valid node name (a DNS subdomain)",
                        hp.node
                    ),
                ));
            }
            if clean_sub_path(&hp.path).is_none() || !hp.path.starts_with('/') {
                return Err(blocked(
                    Reason::InvalidSpec,
                    format!(
                        "{which}.hostPath.path {:?} must be absolute without '..'",
                        hp.path
                    ),
                ));
            }
            let write = side == Side::Destination;
            let granted = config
                .grant_for(namespace, &hp.path, write)
                .map_err(|refusal| match refusal {
                    GrantRefusal::NotGranted => blocked(
                        Reason::HostPathNotAllowed,
                        format!(
                            "{which}.hostPath.path {} is not under a host root granted to namespace {namespace} (ask the cluster admin to add one to the operator's hostRoots)",
                            hp.path
                        ),
                    ),
                    GrantRefusal::ReadOnly { root } => blocked(
                        Reason::HostPathNotAllowed,
                        format!(
                            "{which}.hostPath.path {} is under {root}, which namespace {namespace} may only read: a destination needs a read-write host root",
                            hp.path
                        ),
                    ),
                })?;
            if !facts.node_exists {
                return Err(blocked(
                    Reason::NodeNotFound,
                    format!(
                        "{which}.hostPath.node {} is not a node of this cluster",
                        hp.node
                    ),
                ));
            }
            // The mover mounts the granted root and opens the rest itself, refusing symlinks:
            // the kubelet would follow a symlink in the requested path out of the grant.
            Ok(SidePlacement {
                volume: VolumeRef::HostPath { path: granted.root },
                sub_path: granted.sub_path,
                node: Some(hp.node.clone()),
            })
        }
        (None, None, Some(_)) => Ok(SidePlacement {
            volume: VolumeRef::Remote,
            sub_path: String::new(),
            node: None,
        }),
        _ => Err(blocked(
            Reason::InvalidSpec,
            format!("{which} must set exactly one of pvc, hostPath or remote"),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{HostPathEndpoint, PvcEndpoint};
    use crate::config::HostRootGrant;

    fn cfg() -> Config {
        Config {
            host_roots: vec![HostRootGrant::parse("ml=/data").expect("grant")],
            ..Config::default()
        }
    }

    pub(crate) fn host(node: &str, path: &str) -> Endpoint {
        Endpoint {
            host_path: Some(HostPathEndpoint {
                node: node.into(),
                path: path.into(),
                ..HostPathEndpoint::default()
            }),
            ..Endpoint::default()
        }
    }

    #[test]
    fn host_paths_need_a_grant_and_a_node() {
        let facts = SideFacts {
            node_exists: true,
            ..SideFacts::default()
        };
        let ok = place_side(Side::Source, &host("a", "/data/x/y"), "ml", &cfg(), &facts)
            .expect("placed");
        assert_eq!(ok.node.as_deref(), Some("a"));
        // The granted root is mounted; the mover descends to the rest itself.
        assert_eq!(
            ok.volume,
            VolumeRef::HostPath {
                path: "/data".into()
            }
        );
        assert_eq!(ok.sub_path, "x/y");
        let e = place_side(Side::Source, &host("a", "/etc"), "ml", &cfg(), &facts).unwrap_err();
        assert_eq!(e.reason, Reason::HostPathNotAllowed);
        let e = place_side(Side::Source, &host("a", "/data/x"), "web", &cfg(), &facts).unwrap_err();
        assert_eq!(e.reason, Reason::HostPathNotAllowed);
        let e = place_side(
            Side::Source,
            &host("a", "/data/../etc"),
            "ml",
            &cfg(),
            &facts,
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::InvalidSpec);
        let e = place_side(
            Side::Source,
            &host("a", "/data/x"),
            "ml",
            &cfg(),
            &SideFacts::default(),
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::NodeNotFound);
    }

    #[test]
    fn node_and_claim_names_must_be_dns_subdomains() {
        for ok in ["node-a", "a.b-c.d", "0"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "Node",
            "-a",
            "a-",
            "a..b",
            "a_b",
            "a/b",
            &"x".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        let facts = SideFacts {
            node_exists: true,
            ..SideFacts::default()
        };
        let e = place_side(
            Side::Source,
            &host("--help", "/data/x"),
            "ml",
            &cfg(),
            &facts,
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::InvalidSpec);
    }

    #[test]
    fn claims_follow_the_pod_that_mounts_them() {
        let ep = Endpoint {
            pvc: Some(PvcEndpoint {
                claim_name: "c".into(),
                path: "/sets//a/".into(),
                provision: None,
            }),
            ..Endpoint::default()
        };
        let e =
            place_side(Side::Destination, &ep, "ml", &cfg(), &SideFacts::default()).unwrap_err();
        assert_eq!(e.reason, Reason::DestinationClaimNotFound);
        let facts = SideFacts {
            claim_exists: true,
            claim_in_use_on: Some("b".into()),
            node_exists: false,
        };
        let p = place_side(Side::Destination, &ep, "ml", &cfg(), &facts).expect("placed");
        assert_eq!(p.sub_path, "sets/a");
        assert_eq!(p.node.as_deref(), Some("b"));
        let both = Endpoint {
            host_path: Some(HostPathEndpoint::default()),
            ..ep.clone()
        };
        assert_eq!(
            place_side(Side::Source, &both, "ml", &cfg(), &facts)
                .unwrap_err()
                .reason,
            Reason::InvalidSpec
        );
    }
}
