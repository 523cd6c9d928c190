//! Deterministic names and labels of everything the operator creates for a Transfer, which the
//! kubectl plugin reads back.
//!
//! Child names depend on the Transfer's UID, run and attempt only, so a restarted operator finds
//! what it created, and a new attempt never collides with the pods of the last one.

use std::collections::BTreeMap;

/// Label carrying the Transfer's UID (names may exceed a label value's 63 characters).
pub const LABEL_TRANSFER_UID: &str = "ferry.dev/transfer-uid";
/// Label carrying the Transfer's name (truncated to 63 characters; informational).
pub const LABEL_TRANSFER: &str = "ferry.dev/transfer";
pub const LABEL_ROLE: &str = "ferry.dev/role";
pub const LABEL_ATTEMPT: &str = "ferry.dev/attempt";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "ferry-operator";
/// Label on a fan-out's child Transfers: the fan-out Transfer's UID.
pub const LABEL_FAN_OUT_OF: &str = "ferry.dev/fan-out-of";
/// Annotation on a fan-out's child Transfers: every destination node of the run, in the order
/// all of them share (a receiver's position in it is its place in the swarm).
pub const ANNOTATION_FAN_OUT_NODES: &str = "ferry.dev/fan-out-nodes";
/// On a fan-out's sender pod: the transfer ids (`<uid>.<run>` of each child) it serves, comma
/// separated; each child's first attempt finds itself there.
pub const ANNOTATION_SERVES: &str = "ferry.dev/serves";
/// The label the chart puts on the node service's pods (a label selector).
pub const NODE_SERVICE_COMPONENT: &str = "app.kubernetes.io/component=node-service";
/// The finalizer that removes staging data before a Transfer goes away.
pub const FINALIZER: &str = "ferry.dev/cleanup";

/// A mover's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoverRole {
    Sender,
    Receiver,
}

impl MoverRole {
    pub fn as_str(self) -> &'static str {
        match self {
            MoverRole::Sender => "sender",
            MoverRole::Receiver => "receiver",
        }
    }
    fn short(self) -> &'static str {
        match self {
            MoverRole::Sender => "send",
            MoverRole::Receiver => "recv",
        }
    }
}

/// The first 12 hex digits of the UID without dashes: unique enough inside one namespace.
fn uid_short(uid: &str) -> String {
    uid.chars().filter(|c| *c != '-').take(12).collect()
}

/// Pod name of `role` in attempt `attempt` of run `run`.
pub fn pod_name(uid: &str, run: u32, attempt: u32, role: MoverRole) -> String {
    format!("ferry-{}-{run}-{attempt}-{}", uid_short(uid), role.short())
}

/// What the names of every pod and Secret of one run of a Transfer start with.
pub fn run_prefix(uid: &str, run: u32) -> String {
    format!("ferry-{}-{run}-", uid_short(uid))
}

/// Secret holding the certificates of one attempt.
pub fn secret_name(uid: &str, run: u32, attempt: u32) -> String {
    format!("ferry-{}-{run}-{attempt}-tls", uid_short(uid))
}

/// Service in front of a cross-cluster destination's receiver (one per run; its selector
/// follows the attempt).
pub fn service_name(uid: &str, run: u32) -> String {
    format!("ferry-{}-{run}-recv", uid_short(uid))
}

/// Pod that removes the receiver's staging data when the Transfer is deleted.
pub fn cleanup_pod_name(uid: &str) -> String {
    format!("ferry-{}-cleanup", uid_short(uid))
}

/// The transfer id both movers carry in their certificates and key their staging by: one per
/// run, so that every attempt of a run resumes from the same staging.
pub fn transfer_id(uid: &str, run: u32) -> String {
    format!("{uid}.{run}")
}

/// The child Transfer of a fan-out that writes to `node`: `<fan-out>-<node>` when that is a
/// valid name, else shortened with a hash of both so that it stays unique.
pub fn fan_out_child_name(parent: &str, node: &str) -> String {
    let name = format!("{parent}-{node}");
    if name.len() <= 253 {
        return name;
    }
    let hash = blake3::hash(name.as_bytes()).to_hex();
    let keep: String = name.chars().take(253 - 13).collect();
    format!("{}-{}", keep.trim_end_matches(['-', '.']), &hash[..12])
}

/// Labels on every child of a Transfer.
pub fn labels(name: &str, uid: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(LABEL_TRANSFER_UID.to_owned(), uid.to_owned());
    l.insert(
        LABEL_TRANSFER.to_owned(),
        name.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches(['-', '.', '_'])
            .to_owned(),
    );
    l.insert(LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned());
    l
}

/// Whether `s` is a DNS subdomain name (what Kubernetes accepts as a node or claim name). The
/// CRD's schema checks it too; this holds when that validation was bypassed.
pub fn is_dns_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_deterministic_and_distinct() {
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let r = pod_name(uid, 1, 2, MoverRole::Receiver);
        assert_eq!(r, "ferry-0f1e2d3c4b5a-1-2-recv");
        assert_ne!(r, pod_name(uid, 1, 3, MoverRole::Receiver));
        assert_ne!(r, pod_name(uid, 1, 2, MoverRole::Sender));
        assert!(r.len() <= 63);
        assert_eq!(transfer_id(uid, 1), format!("{uid}.1"));
        let long = "x".repeat(200);
        assert_eq!(labels(&long, uid)[LABEL_TRANSFER].len(), 63);
    }

    #[test]
    fn fan_out_children_are_named_after_their_node_and_stay_valid_names() {
        assert_eq!(fan_out_child_name("imagenet", "gpu-1"), "imagenet-gpu-1");
        let (a, b) = ("p".repeat(200), "n".repeat(100));
        let long = fan_out_child_name(&a, &b);
        assert!(long.len() <= 253, "{}", long.len());
        assert_ne!(long, fan_out_child_name(&a, &"n".repeat(101)));
        assert!(is_dns_subdomain(&long), "{long}");
    }
}
