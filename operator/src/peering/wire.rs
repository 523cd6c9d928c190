//! The messages of the cross-cluster API (JSON over HTTP/1.1 inside mutual TLS).
//!
//! `GET /ferry/versions` lists the API versions a server speaks; a client picks the newest one
//! it speaks too, or refuses with `PeerVersionUnsupported`. Version `v1`:
//! - `POST /ferry/v1/pair`: the source half asks the destination half how things stand and
//!   reports its sender; the answer is the destination's status, its transfer id and attempt,
//!   and the receiver's address once it accepts connections.
//! - `POST /ferry/v1/withdraw`: the source half was deleted; the destination stops its receiver.
//!
//! Fields are only ever added (with defaults), so a newer peer of the same version still parses.

use ferry_proto::progress::v1::ProgressUpdate;
use serde::{Deserialize, Serialize};

use crate::api::TransferStatus;

/// Versions this build speaks, newest first.
pub const VERSIONS: &[&str] = &["v1"];
pub const VERSIONS_PATH: &str = "/ferry/versions";

pub fn pair_path(version: &str) -> String {
    format!("/ferry/{version}/pair")
}
pub fn withdraw_path(version: &str) -> String {
    format!("/ferry/{version}/withdraw")
}

/// The newest version both sides speak.
pub fn negotiate(theirs: &[String]) -> Option<&'static str> {
    VERSIONS
        .iter()
        .copied()
        .find(|v| theirs.iter().any(|t| t == v))
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub versions: Vec<String>,
}

/// A Transfer by namespace and name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HalfRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for HalfRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairRequest {
    /// The Transfer in the called (destination) cluster.
    pub destination: HalfRef,
    /// The caller's Transfer (its `destination.remote` names `destination`).
    pub source: HalfRef,
    /// The caller's sender of the attempt it last ran, if any.
    #[serde(default)]
    pub sender: Option<SenderReport>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WithdrawRequest {
    pub destination: HalfRef,
    pub source: HalfRef,
}

/// How the source cluster's sender of one attempt is doing.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SenderReport {
    pub run: u32,
    pub attempt: u32,
    /// The sender pod's name in its cluster (shown in the destination's status).
    pub pod: String,
    pub state: SenderState,
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The sender's last error lines (its termination message).
    #[serde(default)]
    pub message: Option<String>,
    /// The sender's figures: totals of the source walk, its digest, its error kind.
    #[serde(default)]
    pub progress: Option<SenderFigures>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderState {
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// The fields of the sender's progress update the destination uses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SenderFigures {
    pub phase: i32,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub totals_final: bool,
    pub skipped: u64,
    pub throughput_current: f64,
    pub throughput_average: f64,
    pub last_error: String,
    pub error_kind: i32,
    /// Whether the sender judged its failure one a retry cannot fix (absent from older
    /// operators: retryable).
    #[serde(default)]
    pub permanent: bool,
    pub digest: String,
}

impl From<&ProgressUpdate> for SenderFigures {
    fn from(u: &ProgressUpdate) -> Self {
        SenderFigures {
            phase: u.phase,
            files_done: u.files_done,
            files_total: u.files_total,
            bytes_done: u.bytes_done,
            bytes_total: u.bytes_total,
            totals_final: u.totals_final,
            skipped: u.skipped,
            throughput_current: u.throughput_current,
            throughput_average: u.throughput_average,
            last_error: u.last_error.clone(),
            error_kind: u.error_kind,
            permanent: u.permanent,
            digest: u.digest.clone(),
        }
    }
}

impl From<&SenderFigures> for ProgressUpdate {
    fn from(f: &SenderFigures) -> Self {
        ProgressUpdate {
            phase: f.phase,
            files_done: f.files_done,
            files_total: f.files_total,
            bytes_done: f.bytes_done,
            bytes_total: f.bytes_total,
            totals_final: f.totals_final,
            skipped: f.skipped,
            throughput_current: f.throughput_current,
            throughput_average: f.throughput_average,
            last_error: f.last_error.clone(),
            error_kind: f.error_kind,
            permanent: f.permanent,
            digest: f.digest.clone(),
            role: "sender".into(),
            ..ProgressUpdate::default()
        }
    }
}

/// The destination half as it stands.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairResponse {
    /// The transfer id both clusters' movers carry in their certificates (the destination's).
    pub transfer_id: String,
    pub run: u32,
    pub attempt: u32,
    /// `host:port` of the receiver's Service, once the receiver of `attempt` accepts
    /// connections.
    #[serde(default)]
    pub receiver: Option<String>,
    /// The destination Transfer's status: its figures are the truth for both halves.
    pub status: TransferStatus,
}

/// Why a call was refused (any non-2xx answer).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// A condition reason: `CounterpartMissing`, `CounterpartMismatch`, `RateLimited`,
    /// `BadRequest`.
    pub reason: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_the_newest_common_version_or_none() {
        assert_eq!(negotiate(&["v0".into(), "v1".into()]), Some("v1"));
        assert_eq!(negotiate(&["v2".into()]), None);
        assert_eq!(negotiate(&[]), None);
    }

    #[test]
    fn sender_figures_round_trip_through_a_progress_update() {
        let u = ProgressUpdate {
            files_total: 7,
            bytes_total: 9,
            totals_final: true,
            digest: "ab".into(),
            error_kind: 3,
            permanent: true,
            ..ProgressUpdate::default()
        };
        let back = ProgressUpdate::from(&SenderFigures::from(&u));
        assert_eq!(
            (back.files_total, back.bytes_total, back.totals_final),
            (7, 9, true)
        );
        assert_eq!(
            (back.digest.as_str(), back.error_kind, back.permanent),
            ("ab", 3, true)
        );
    }

    #[test]
    fn an_older_request_without_new_fields_parses() {
        let r: PairRequest = serde_json::from_str(
            r#"{"destination":{"namespace":"a","name":"b"},"source":{"namespace":"c","name":"d"}}"#,
        )
        .expect("parse");
        assert!(r.sender.is_none());
    }
}
