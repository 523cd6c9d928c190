//! Condition types and reasons, and the one helper that sets a condition (its transition time
//! moves only when its status changes).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types a Transfer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionType {
    /// True while movers run or wait for nothing but data; False with the reason it cannot proceed.
    Ready,
    Succeeded,
    Failed,
    /// Set (False) only when dedup was asked for but cannot be used.
    Dedup,
    /// A fan-out only: True once `minAvailable` destinations (default all) hold a verified
    /// copy of this run.
    Available,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Succeeded => "Succeeded",
            ConditionType::Failed => "Failed",
            ConditionType::Dedup => "Dedup",
            ConditionType::Available => "Available",
        }
    }
}

/// Every reason the operator writes into a condition, an Event or `lastError` (docs/crd.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Pending,
    Running,
    Completed,
    Suspended,
    Retrying,
    BackoffLimitExceeded,
    DeadlineExceeded,
    MoverFailed,
    InvalidSpec,
    HostPathNotAllowed,
    SourceClaimNotFound,
    DestinationClaimNotFound,
    NodeNotFound,
    /// Cross-cluster: the other half has not called (destination) or the Peer is missing.
    WaitingForCounterpart,
    CounterpartMissing,
    CounterpartMismatch,
    PeerNotFound,
    PeerInvalid,
    PeerUnreachable,
    PeerUntrusted,
    PeerRefused,
    PeerVersionUnsupported,
    Unsupported,
    /// `preserveOwnership` asks for root movers, which the operator is not allowed to run.
    RootMoversNotAllowed,
    PodSecurityForbidsHostPath,
    DigestMismatch,
    SourceUnreadable,
    DestinationUnwritable,
    /// The source and the destination contain one another.
    SourceDestinationOverlap,
    /// Another Transfer writes the same destination first.
    DestinationInUse,
    /// `readAllFiles` asks for a privileged reader, which the operator is not allowed to run.
    PrivilegedReadersNotAllowed,
    /// A mover pod cannot be scheduled.
    MoverUnschedulable,
    /// A mover pod's volume cannot be mounted (a missing host root, an unattachable claim).
    MoverVolumeMountFailed,
    /// A mover pod's image cannot be pulled.
    MoverImagePullFailed,
    /// A mover pod's container cannot be created from its spec.
    MoverConfigError,
    /// The API server refused a mover pod (admission: quota, LimitRange, Pod Security, a missing
    /// priority class) or another object the operator writes.
    MoverRejected,
    /// `spec.mover.priorityClassName` names a class the admin does not allow.
    PriorityClassNotAllowed,
    /// The node's block store failed; the run goes on without it (`Dedup=False`).
    BlockStoreFailed,
    /// A fan-out Transfer finished with at least one destination failed.
    DestinationFailed,
    /// The destination claim is smaller than `provision.capacity` asks; ferry does not resize.
    ClaimTooSmall,
    /// A fan-out's `Available`: at least `minAvailable` destinations succeeded in this run.
    MinimumDestinationsAvailable,
    /// A fan-out's `Available`: fewer than `minAvailable` destinations succeeded so far.
    MinimumDestinationsUnavailable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Pending => "Pending",
            Reason::Running => "Running",
            Reason::Completed => "Completed",
            Reason::Suspended => "Suspended",
            Reason::Retrying => "Retrying",
            Reason::BackoffLimitExceeded => "BackoffLimitExceeded",
            Reason::DeadlineExceeded => "DeadlineExceeded",
            Reason::MoverFailed => "MoverFailed",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::HostPathNotAllowed => "HostPathNotAllowed",
            Reason::SourceClaimNotFound => "SourceClaimNotFound",
            Reason::DestinationClaimNotFound => "DestinationClaimNotFound",
            Reason::NodeNotFound => "NodeNotFound",
            Reason::WaitingForCounterpart => "WaitingForCounterpart",
            Reason::CounterpartMissing => "CounterpartMissing",
            Reason::CounterpartMismatch => "CounterpartMismatch",
            Reason::PeerNotFound => "PeerNotFound",
            Reason::PeerInvalid => "PeerInvalid",
            Reason::PeerUnreachable => "PeerUnreachable",
            Reason::PeerUntrusted => "PeerUntrusted",
            Reason::PeerRefused => "PeerRefused",
            Reason::PeerVersionUnsupported => "PeerVersionUnsupported",
            Reason::Unsupported => "Unsupported",
            Reason::RootMoversNotAllowed => "RootMoversNotAllowed",
            Reason::PodSecurityForbidsHostPath => "PodSecurityForbidsHostPath",
            Reason::DigestMismatch => "DigestMismatch",
            Reason::SourceUnreadable => "SourceUnreadable",
            Reason::DestinationUnwritable => "DestinationUnwritable",
            Reason::SourceDestinationOverlap => "SourceDestinationOverlap",
            Reason::DestinationInUse => "DestinationInUse",
            Reason::DestinationFailed => "DestinationFailed",
            Reason::PrivilegedReadersNotAllowed => "PrivilegedReadersNotAllowed",
            Reason::MoverUnschedulable => "MoverUnschedulable",
            Reason::MoverVolumeMountFailed => "MoverVolumeMountFailed",
            Reason::MoverImagePullFailed => "MoverImagePullFailed",
            Reason::MoverConfigError => "MoverConfigError",
            Reason::MoverRejected => "MoverRejected",
            Reason::PriorityClassNotAllowed => "PriorityClassNotAllowed",
            Reason::BlockStoreFailed => "BlockStoreFailed",
            Reason::ClaimTooSmall => "ClaimTooSmall",
            Reason::MinimumDestinationsAvailable => "MinimumDestinationsAvailable",
            Reason::MinimumDestinationsUnavailable => "MinimumDestinationsUnavailable",
        }
    }
}

/// Longest condition message ferry writes (the API server allows 32 768 bytes).
const MAX_MESSAGE_CHARS: usize = 1024;

/// Sets condition `kind` in `conditions`. `lastTransitionTime` is `now` only when the status
/// changed (or the condition is new); reason and message follow the latest call.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: ConditionType,
    status: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let message: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
    match conditions.iter_mut().find(|c| c.type_ == kind.as_str()) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status;
            c.reason = reason.as_str().to_owned();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: kind.as_str().to_owned(),
            status,
            reason: reason.as_str().to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

/// Conditions another cluster's operator sent (a source half mirrors its destination's status),
/// made fit for this cluster's API server, which refuses the whole status patch over one bad
/// condition: only ferry's own condition types, a status of True, False or Unknown and a reason
/// in the API's shape stay; messages are cut to ferry's length.
pub fn sanitize_peer_conditions(conditions: &mut Vec<Condition>) {
    const TYPES: [ConditionType; 5] = [
        ConditionType::Ready,
        ConditionType::Succeeded,
        ConditionType::Failed,
        ConditionType::Dedup,
        ConditionType::Available,
    ];
    let mut seen = Vec::new();
    conditions.retain(|c| {
        let keep = TYPES.iter().any(|t| t.as_str() == c.type_)
            && !seen.contains(&c.type_)
            && matches!(c.status.as_str(), "True" | "False" | "Unknown")
            && is_condition_reason(&c.reason);
        if keep {
            seen.push(c.type_.clone());
        }
        keep
    });
    for c in conditions {
        if c.message.chars().count() > MAX_MESSAGE_CHARS {
            c.message = c.message.chars().take(MAX_MESSAGE_CHARS).collect();
        }
    }
}

/// A condition reason as the API server validates it: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`,
/// at most 1 024 bytes.
pub fn is_condition_reason(r: &str) -> bool {
    let b = r.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            b.len() <= 1024
                && first.is_ascii_alphabetic()
                && (b.len() == 1 || last.is_ascii_alphanumeric() || *last == b'_')
                && b.iter().all(inner)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_conditions_keep_only_what_the_api_server_accepts() {
        let c = |type_: &str, status: &str, reason: &str, message: String| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let mut cs = vec![
            c("Ready", "True", "Running", "x".repeat(40_000)),
            c("Ready", "False", "Pending", String::new()),
            c("Succeeded", "Maybe", "Completed", String::new()),
            c("Failed", "False", "Bad reason", String::new()),
            c("Failed", "False", "MoverFailed:x,y_1", "é".repeat(2000)),
            c("Dedup", "Unknown", "", String::new()),
            c("Custom", "True", "Running", String::new()),
        ];
        sanitize_peer_conditions(&mut cs);
        let kept: Vec<(&str, &str)> = cs
            .iter()
            .map(|c| (c.type_.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(
            kept,
            [("Ready", "Running"), ("Failed", "MoverFailed:x,y_1")]
        );
        assert_eq!(cs[0].message.len(), 1024);
        assert_eq!(cs[1].message.chars().count(), 1024);
        for r in ["A", "Running", "a_b", "x:1"] {
            assert!(is_condition_reason(r), "{r}");
        }
        for r in ["", "1a", "a:", "a b", "a-b", &"a".repeat(1025)] {
            assert!(!is_condition_reason(r), "{r}");
        }
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
    }

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let mut c = Vec::new();
        set_condition(
            &mut c,
            ConditionType::Ready,
            false,
            Reason::Pending,
            "a",
            Some(1),
            &at(10),
        );
        set_condition(
            &mut c,
            ConditionType::Ready,
            false,
            Reason::Pending,
            "b",
            Some(1),
            &at(20),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].message, "b");
        set_condition(
            &mut c,
            ConditionType::Ready,
            true,
            Reason::Running,
            "c",
            Some(2),
            &at(30),
        );
        assert_eq!(c[0].last_transition_time, at(30));
        assert_eq!(c[0].reason, "Running");
    }
}
