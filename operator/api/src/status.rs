//! What the operator reports in `Transfer.status`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The Transfer's lifecycle in one word (conditions carry the detail).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    /// Accepted, movers not running yet (placement, certificates, an invalid spec waiting for a fix).
    #[default]
    Pending,
    /// Movers are running.
    Running,
    /// A failed attempt is waiting for its retry.
    Retrying,
    /// `spec.suspend` is set; no movers run.
    Suspended,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn is_finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A waiting Transfer's place in line (the operator's fair order across namespaces).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// 1 goes next.
    pub position: u32,
    /// Transfers waiting, this one included.
    pub waiting: u32,
}

/// What `onUnreadable: Skip` left out.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableStatus {
    /// How many entries were left out.
    pub count: u64,
    /// The first of them (at most 100), relative to the source directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TransferStatus {
    #[serde(default)]
    pub phase: Phase,
    /// `Ready`, `Succeeded` and `Failed` (metav1.Condition), usable with `kubectl wait`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `spec.trigger` the current or last run was started for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_trigger: Option<String>,
    /// Runs started so far (a changed trigger starts a new run).
    #[serde(default)]
    pub run: u32,
    /// Attempts of the current run (1 for the first; each retry or resume adds one).
    #[serde(default)]
    pub attempts: u32,
    /// Failed attempts of the current run (counted against `spec.backoffLimit`).
    #[serde(default)]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// When the current failed attempt may be retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<ThroughputStatus>,
    /// Time left at the average throughput, once the totals are final ("1m20s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<WireStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
    /// The end-to-end digest (docs/protocol.md "Transfer digest") both movers reported for the
    /// finished run: the sender's over the source, the receiver's over what it committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<MoverRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<MoverRef>,
    /// Source entries the sender could not read and left out (`onUnreadable: Skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<UnreadableStatus>,
    /// A cross-cluster Transfer's pairing with its other half.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteStatus>,
    /// A fan-out Transfer's destinations: the nodes this run writes to (resolved when it
    /// started, kept for the run), each with its own Transfer and how it stands. The figures
    /// above (progress, throughput, wire) are their totals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub destinations: Vec<DestinationStatus>,
    /// Why the current run started, and for which scheduled time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<RunStart>,
    /// A scheduled Transfer: when its schedule starts the next run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_time: Option<Time>,
    /// The latest scheduled time acted on (a run started for it, or it was skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When a run last succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_time: Option<Time>,
    /// Scheduled times that started no run: a run was still going (`Forbid`), or the time
    /// passed its starting deadline.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_runs: u32,
    /// The latest finished runs, newest first (`spec.historyLimit`, 10 by default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RunRecord>,
    /// Where a Transfer that waits for a slot (`--max-active` and the other limits) stands;
    /// absent once it runs. Updated within the status budget, like progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What started a run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RunCause {
    /// The Transfer's first run.
    #[default]
    Created,
    /// `spec.trigger` changed.
    Triggered,
    /// `spec.schedule` fired.
    Scheduled,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunStart {
    pub cause: RunCause,
    /// The schedule's time this run is for (a late start, a catch-up, shows against it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_time: Option<Time>,
}

/// How a run ended.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RunResult {
    #[default]
    Succeeded,
    Failed,
    /// A scheduled run took its place (`concurrencyPolicy: Replace`).
    Replaced,
}

/// One finished run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub run: u32,
    pub cause: RunCause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    pub result: RunResult,
    /// Files and bytes written (files the destination already had are not counted).
    pub files: u64,
    pub bytes: u64,
    /// Bytes on the network, and bytes taken from a node's block store instead.
    pub wire_bytes: u64,
    pub dedup_bytes: u64,
    pub attempts: u32,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How a cross-cluster half pairs with the other.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RemoteStatus {
    /// The other cluster's name (its Peer's clusterName).
    pub cluster: String,
    /// The transfer id both clusters' movers carry (the destination half's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_id: Option<String>,
    /// `host:port` of the receiver's Service the sender connects to, once it accepts
    /// connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver_address: Option<String>,
    /// When the other half was last heard from (a destination half: the source half's last
    /// call; a source half: the destination half's last answer). Kept in the API, so that an
    /// operator that restarts or takes over the lead knows the pairing was alive, and measures
    /// a silence from its own start at the earliest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heard: Option<Time>,
}

/// What the receiver has written (the truth), against what the sender found.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProgressStatus {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_total: u64,
    /// Files left alone because the destination already had them.
    #[serde(default)]
    pub files_skipped: u64,
    /// 0-100, from bytes (files when there are no bytes).
    pub percent: u32,
    /// False while the sender is still walking the source: the totals may still grow.
    pub totals_final: bool,
    /// "42%" (a printer column).
    pub display: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputStatus {
    /// Bytes per second over the mover's last interval.
    pub current_bytes_per_second: u64,
    /// Bytes per second since the movers started.
    pub average_bytes_per_second: u64,
    /// "48.0 MiB/s" (a printer column).
    pub display: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WireStatus {
    /// Bytes the receiver read off the network (all streams, framing and TLS payload).
    pub bytes: u64,
    /// Bytes written per byte on the wire ("2.47"; below 1 means framing outweighed data).
    pub compression_ratio: String,
    /// Blocks and bytes taken from the destination node's block store instead of the wire.
    pub dedup_blocks: u64,
    pub dedup_bytes: u64,
    /// Bytes kept from an earlier interrupted attempt.
    #[serde(default)]
    pub resumed_bytes: u64,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    /// A CamelCase reason (`MoverFailed`, `HostPathNotAllowed`, ...).
    pub reason: String,
    pub message: String,
}

/// A mover pod of the current attempt.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MoverRef {
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// One destination node of a fan-out Transfer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DestinationStatus {
    pub node: String,
    /// The Transfer (same namespace) that writes to this node: its status has the detail.
    pub transfer: String,
    #[serde(default)]
    pub phase: Phase,
    /// Attempts of this destination's current run.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub bytes_total: u64,
    /// "42%".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub progress: String,
    /// Bytes per second over the mover's last interval.
    #[serde(default)]
    pub bytes_per_second: u64,
    /// Blocks taken from a node store (this node's, or another destination's) instead of the
    /// source.
    #[serde(default)]
    pub dedup_bytes: u64,
    /// The end-to-end digest once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Why it is not moving, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
