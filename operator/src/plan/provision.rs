//! Destination claims the operator creates (`destination.pvc.provision`), pure: from the spec
//! and the two claims as the API server has them, create one, go on, or say why not.
//!
//! The claim is created once and then left to its owner, the user: no owner reference (deleting
//! the Transfer keeps the data), and never resized, since a volume that shrinks or grows under
//! a copy is worse than a clear condition.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::{ClaimAccessMode, ClaimProvision, Reason, Transfer};
use crate::plan::parse_quantity;
use crate::plan::placement::Blocked;

/// A claim as far as provisioning cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimView {
    /// Bytes: the bound volume's (`status.capacity.storage`), else what the claim requests.
    pub capacity: Option<u64>,
}

/// The claim to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub name: String,
    pub bytes: u64,
    pub storage_class_name: Option<String>,
    pub access_modes: Vec<ClaimAccessMode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvisionStep {
    /// The claim exists and is large enough: place the receiver on it.
    Ready,
    Create(ClaimRequest),
    Blocked(Blocked),
}

/// Sizes are rounded up to whole MiB, which every provisioner accepts.
const MIB: u64 = 1 << 20;

/// The next step for destination claim `name` provisioned as `spec`; `destination` and
/// `source` are the claims as they exist (`source` is read for `capacity: fromSource` only).
pub fn step(
    spec: &ClaimProvision,
    name: &str,
    destination: Option<&ClaimView>,
    source: Option<(&str, Option<&ClaimView>)>,
) -> ProvisionStep {
    let wanted = match wanted_bytes(spec, source) {
        Ok(b) => b,
        Err(b) => return ProvisionStep::Blocked(b),
    };
    match destination {
        None => ProvisionStep::Create(ClaimRequest {
            name: name.to_owned(),
            bytes: wanted,
            storage_class_name: spec.storage_class_name.clone(),
            access_modes: if spec.access_modes.is_empty() {
                vec![ClaimAccessMode::ReadWriteOnce]
            } else {
                spec.access_modes.clone()
            },
        }),
        Some(ClaimView {
            capacity: Some(have),
        }) if *have < wanted => ProvisionStep::Blocked(Blocked {
            reason: Reason::ClaimTooSmall,
            message: format!(
                "PersistentVolumeClaim {name} holds {have} bytes and provision.capacity asks for {wanted}: \
                 ferry does not resize claims; expand it (kubectl patch pvc {name} with a larger \
                 spec.resources.requests.storage, where its StorageClass allows expansion) or lower \
                 provision.capacity"
            ),
        }),
        Some(_) => ProvisionStep::Ready,
    }
}

fn wanted_bytes(
    spec: &ClaimProvision,
    source: Option<(&str, Option<&ClaimView>)>,
) -> Result<u64, Blocked> {
    if spec.capacity != ClaimProvision::FROM_SOURCE {
        return match parse_quantity(&spec.capacity) {
            Some(b) if b > 0 => Ok(round_up(b)),
            _ => Err(Blocked {
                reason: Reason::InvalidSpec,
                message: format!(
                    "destination.pvc.provision.capacity {:?} is not a quantity of bytes ferry reads \
                     (a number with k M G T P, Ki Mi Gi Ti Pi), nor fromSource",
                    spec.capacity
                ),
            }),
        };
    }
    let Some((source_name, source)) = source else {
        return Err(Blocked {
            reason: Reason::InvalidSpec,
            message: "destination.pvc.provision.capacity fromSource needs a source claim".into(),
        });
    };
    let Some(source) = source else {
        return Err(Blocked {
            reason: Reason::SourceClaimNotFound,
            message: format!(
                "PersistentVolumeClaim {source_name} does not exist, and the destination claim is sized from it; the Transfer starts once it does"
            ),
        });
    };
    let Some(have) = source.capacity else {
        return Err(Blocked {
            reason: Reason::InvalidSpec,
            message: format!(
                "PersistentVolumeClaim {source_name} states no storage size to size the destination from; give provision.capacity"
            ),
        });
    };
    let headroom = spec
        .headroom_percent
        .unwrap_or(ClaimProvision::DEFAULT_HEADROOM_PERCENT);
    let grown = u128::from(have) * u128::from(100 + headroom) / 100;
    Ok(round_up(u64::try_from(grown).unwrap_or(u64::MAX)))
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(MIB).saturating_mul(MIB)
}

/// Label on a claim the operator created: the Transfer (same namespace) it was made for.
pub const LABEL_PROVISIONED_FOR: &str = "ferry.dev/provisioned-for";

/// The claim to create: no owner reference (it outlives the Transfer), a label naming the
/// Transfer it was made for.
pub fn claim_object(t: &Transfer, req: &ClaimRequest) -> PersistentVolumeClaim {
    let mut labels = BTreeMap::new();
    labels.insert(
        LABEL_PROVISIONED_FOR.to_owned(),
        t.metadata.name.clone().unwrap_or_default(),
    );
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(req.name.clone()),
            namespace: t.metadata.namespace.clone(),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(req.access_modes.iter().map(|m| format!("{m:?}")).collect()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(quantity(req.bytes)),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: req.storage_class_name.clone(),
            volume_mode: Some("Filesystem".into()),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// `N Mi`, the quantity a request is written with.
pub fn quantity(bytes: u64) -> String {
    format!("{}Mi", bytes.div_ceil(MIB))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(capacity: &str) -> ClaimProvision {
        ClaimProvision {
            capacity: capacity.into(),
            ..ClaimProvision::default()
        }
    }

    fn claim(bytes: u64) -> ClaimView {
        ClaimView {
            capacity: Some(bytes),
        }
    }

    #[test]
    fn a_missing_claim_is_created_with_the_asked_size_class_and_modes() {
        let mut s = spec("50Gi");
        s.storage_class_name = Some("fast".into());
        let ProvisionStep::Create(req) = step(&s, "copy", None, None) else {
            panic!("no create");
        };
        assert_eq!(req.bytes, 50 << 30);
        assert_eq!(req.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(req.access_modes, [ClaimAccessMode::ReadWriteOnce]);
        assert_eq!(quantity(req.bytes), "51200Mi");
        // An odd size is rounded up to whole MiB.
        let ProvisionStep::Create(req) = step(&spec("1000001"), "copy", None, None) else {
            panic!("no create");
        };
        assert_eq!(req.bytes, MIB);
    }

    #[test]
    fn from_source_is_the_source_claims_size_plus_headroom() {
        let mut s = spec("fromSource");
        let src = claim(10 << 30);
        let ProvisionStep::Create(req) = step(&s, "copy", None, Some(("data", Some(&src)))) else {
            panic!("no create");
        };
        assert_eq!(req.bytes, 11 << 30);
        s.headroom_percent = Some(0);
        let ProvisionStep::Create(req) = step(&s, "copy", None, Some(("data", Some(&src)))) else {
            panic!("no create");
        };
        assert_eq!(req.bytes, 10 << 30);
        let missing = step(&s, "copy", None, Some(("data", None)));
        assert!(
            matches!(&missing, ProvisionStep::Blocked(b) if b.reason == Reason::SourceClaimNotFound),
            "{missing:?}"
        );
    }

    #[test]
    fn an_existing_claim_is_used_when_large_enough_and_never_resized() {
        let s = spec("10Gi");
        assert_eq!(
            step(&s, "copy", Some(&claim(10 << 30)), None),
            ProvisionStep::Ready
        );
        // Size unknown (no status, no request): used as it is.
        assert_eq!(
            step(&s, "copy", Some(&ClaimView::default()), None),
            ProvisionStep::Ready
        );
        let ProvisionStep::Blocked(b) = step(&s, "copy", Some(&claim(5 << 30)), None) else {
            panic!("not blocked");
        };
        assert_eq!(b.reason, Reason::ClaimTooSmall);
        assert!(
            b.message.contains("ferry does not resize claims"),
            "{}",
            b.message
        );
    }

    #[test]
    fn the_claim_object_outlives_the_transfer_and_names_it() {
        let mut t = crate::plan::tests::transfer();
        t.metadata.name = Some("stage".into());
        let claim = claim_object(
            &t,
            &ClaimRequest {
                name: "copy".into(),
                bytes: 3 << 30,
                storage_class_name: None,
                access_modes: vec![ClaimAccessMode::ReadWriteOncePod],
            },
        );
        assert_eq!(claim.metadata.owner_references, None);
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(
            claim
                .metadata
                .labels
                .unwrap()
                .get(LABEL_PROVISIONED_FOR)
                .map(String::as_str),
            Some("stage")
        );
        let spec = claim.spec.unwrap();
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOncePod"]);
        assert_eq!(spec.storage_class_name, None, "the cluster's default class");
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"],
            Quantity("3072Mi".into())
        );
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    }

    #[test]
    fn a_capacity_ferry_cannot_read_blocks_with_invalid_spec() {
        for bad in ["lots", "0", "1e3", "500m"] {
            let ProvisionStep::Blocked(b) = step(&spec(bad), "copy", None, None) else {
                panic!("{bad} not blocked");
            };
            assert_eq!(b.reason, Reason::InvalidSpec, "{bad}");
        }
    }
}
