//! Which directories two sides name, and whether they overlap (pure).
//!
//! A destination inside its own source (or the other way round) copies the tree into itself,
//! and with `deleteExtraneous` deletes the source's files; two Transfers writing one destination
//! at once interleave their renames and deletions. Both are refused before any mover runs.
//!
//! Paths are compared as written (after normalisation): the movers refuse symlinks on the way
//! to a Transfer's directory, so a path names one directory on its volume.

use std::path::Path;

use crate::api::{Endpoint, Phase, Transfer};
use crate::plan::placement::clean_sub_path;

/// The directory one side of a Transfer names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An absolute path on a node.
    Host { node: String, path: String },
    /// A path (relative, normalised) inside a claim.
    Claim {
        namespace: String,
        claim: String,
        path: String,
    },
}

impl Location {
    /// The side's directory, or `None` for a side in another cluster or an invalid one.
    pub fn of(endpoint: &Endpoint, namespace: &str) -> Option<Location> {
        match (&endpoint.host_path, &endpoint.pvc) {
            // A fan-out's own destination is many nodes; its children each name one.
            (Some(hp), None) if hp.node.is_empty() => None,
            (Some(hp), None) => Some(Location::Host {
                node: hp.node.clone(),
                path: format!("/{}", clean_sub_path(&hp.path)?),
            }),
            (None, Some(pvc)) => Some(Location::Claim {
                namespace: namespace.to_owned(),
                claim: pvc.claim_name.clone(),
                path: clean_sub_path(&pvc.path)?,
            }),
            _ => None,
        }
    }

    /// Whether one contains the other (or both are the same directory).
    pub fn overlaps(&self, other: &Location) -> bool {
        let nested = |a: &str, b: &str| {
            let (a, b) = (Path::new(a), Path::new(b));
            a.starts_with(b) || b.starts_with(a)
        };
        match (self, other) {
            (Location::Host { node, path }, Location::Host { node: n, path: p }) => {
                node == n && nested(path, p)
            }
            (
                Location::Claim {
                    namespace,
                    claim,
                    path,
                },
                Location::Claim {
                    namespace: ns,
                    claim: c,
                    path: p,
                },
            ) => namespace == ns && claim == c && nested(path, p),
            _ => false,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Location::Host { node, path } => format!("{path} on node {node}"),
            Location::Claim { claim, path, .. } if path.is_empty() => format!("claim {claim}"),
            Location::Claim { claim, path, .. } => format!("{path} in claim {claim}"),
        }
    }
}

/// Why a Transfer's source and destination cannot be used together, if they overlap.
pub fn source_destination_overlap(t: &Transfer, namespace: &str) -> Option<String> {
    let source = Location::of(&t.spec.source, namespace)?;
    let destination = Location::of(&t.spec.destination, namespace)?;
    source.overlaps(&destination).then(|| {
        format!(
            "the destination ({}) and the source ({}) overlap: one contains the other, so the copy would write into what it reads (and deleteExtraneous would delete the source's files); choose directories apart",
            destination.describe(),
            source.describe()
        )
    })
}

/// Whether `other` writes its destination now, or will before `mine` (it is older): then `mine`
/// waits for it when their destinations overlap.
fn goes_first(other: &Transfer, mine: &Transfer) -> bool {
    let phase = other.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if phase.is_finished()
        || phase == Phase::Suspended
        || other.metadata.deletion_timestamp.is_some()
    {
        return false;
    }
    let started = other
        .status
        .as_ref()
        .is_some_and(|s| s.start_time.is_some());
    let active = matches!(phase, Phase::Running | Phase::Retrying) || started;
    let older = (&other.metadata.creation_timestamp, &other.metadata.name)
        < (&mine.metadata.creation_timestamp, &mine.metadata.name);
    active || older
}

/// The Transfer (`namespace/name`) whose destination overlaps `mine`'s and goes first, if any.
pub fn destination_taken_by(
    mine: &Transfer,
    namespace: &str,
    others: &[&Transfer],
) -> Option<String> {
    let dest = Location::of(&mine.spec.destination, namespace)?;
    others
        .iter()
        .filter(|o| o.metadata.uid != mine.metadata.uid)
        .filter(|o| {
            let ns = o.metadata.namespace.as_deref().unwrap_or_default();
            Location::of(&o.spec.destination, ns).is_some_and(|d| d.overlaps(&dest))
        })
        .find(|o| goes_first(o, mine))
        .map(|o| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PvcEndpoint, TransferStatus};
    use crate::plan::placement::tests::host;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn claim(name: &str, path: &str) -> Endpoint {
        Endpoint {
            pvc: Some(PvcEndpoint {
                claim_name: name.into(),
                path: path.into(),
                provision: None,
            }),
            ..Endpoint::default()
        }
    }

    fn transfer(name: &str, created: i64, src: Endpoint, dst: Endpoint) -> Transfer {
        let mut t = crate::plan::tests::transfer();
        t.metadata.name = Some(name.into());
        t.spec.source = src;
        t.spec.destination = dst;
        t.metadata.namespace = Some("ml".into());
        t.metadata.uid = Some(format!("uid-{name}"));
        t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).expect("time")));
        t
    }

    #[test]
    fn a_destination_inside_its_source_or_around_it_is_refused() {
        for (src, dst) in [
            (host("a", "/data/x"), host("a", "/data/x/copy")),
            (host("a", "/data/x/"), host("a", "/data/./x")),
            (host("a", "/data/x/sub"), host("a", "/data")),
            (claim("c", "sets"), claim("c", "/sets/a/")),
            (claim("c", ""), claim("c", "out")),
        ] {
            let t = transfer("t", 1, src.clone(), dst.clone());
            let why = source_destination_overlap(&t, "ml");
            assert!(
                why.as_deref().is_some_and(|w| w.contains("overlap")),
                "{src:?} {dst:?}"
            );
        }
        for (src, dst) in [
            (host("a", "/data/x"), host("b", "/data/x")),
            (host("a", "/data/x"), host("a", "/data/xy")),
            (claim("c", "a"), claim("c", "ab")),
            (claim("c", "a"), claim("d", "a")),
            (host("a", "/data/x"), claim("c", "x")),
        ] {
            let t = transfer("t", 1, src.clone(), dst.clone());
            assert_eq!(
                source_destination_overlap(&t, "ml"),
                None,
                "{src:?} {dst:?}"
            );
        }
    }

    #[test]
    fn the_younger_of_two_writers_of_one_destination_waits_for_the_running_or_older_one() {
        let mut running = transfer("running", 20, host("a", "/data/s1"), host("b", "/data/out"));
        running.status = Some(TransferStatus {
            phase: Phase::Running,
            ..TransferStatus::default()
        });
        let older = transfer(
            "older",
            5,
            host("a", "/data/s2"),
            host("b", "/data/out/sub"),
        );
        let mine = transfer("mine", 10, host("a", "/data/s3"), host("b", "/data/out"));
        let elsewhere = transfer(
            "elsewhere",
            1,
            host("a", "/data/s4"),
            host("c", "/data/out"),
        );
        assert_eq!(
            destination_taken_by(&mine, "ml", &[&elsewhere, &running]),
            Some("ml/running".into())
        );
        assert_eq!(
            destination_taken_by(&mine, "ml", &[&older]),
            Some("ml/older".into())
        );
        // The older one does not wait for a younger one that has not started.
        assert_eq!(destination_taken_by(&older, "ml", &[&mine]), None);
        // Nor for itself, a finished one, or one on another node.
        let mut done = running.clone();
        done.status = Some(TransferStatus {
            phase: Phase::Succeeded,
            ..TransferStatus::default()
        });
        assert_eq!(
            destination_taken_by(&mine, "ml", &[&mine, &done, &elsewhere]),
            None
        );
    }
}
