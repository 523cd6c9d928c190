//! The `Transfer` custom resource (`ferry.dev/v1alpha1`): spec, status and condition helpers.
//!
//! The CRD under `crds/` is generated from these types (`cargo run -p ferry-operator --bin
//! crdgen`); a unit test fails when the committed file drifts.

mod conditions;
mod peer;
mod status;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use conditions::{
    ConditionType, Reason, is_condition_reason, sanitize_peer_conditions, set_condition,
};
pub use peer::{Peer, PeerSpec};
pub use status::{
    DestinationStatus, LastError, MoverRef, Phase, ProgressStatus, QueueStatus, RemoteStatus,
    RunCause, RunRecord, RunResult, RunStart, ThroughputStatus, TransferStatus, UnreadableStatus,
    WireStatus,
};

/// Default number of parallel TLS streams.
pub const DEFAULT_STREAMS: u32 = 4;
/// Default number of retries after a failed attempt.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;

/// A request to copy one directory tree from a source volume to a destination volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Transfer",
    namespaced,
    shortname = "xfer",
    status = "TransferStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.display"}"#,
    printcolumn = r#"{"name":"Throughput","type":"string","jsonPath":".status.throughput.display"}"#,
    printcolumn = r#"{"name":"ETA","type":"string","jsonPath":".status.eta"}"#,
    printcolumn = r#"{"name":"Last Success","type":"date","jsonPath":".status.lastSuccessTime"}"#,
    printcolumn = r#"{"name":"Next Run","type":"string","jsonPath":".status.nextRunTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.spec.source == oldSelf.spec.source").message("spec.source is immutable"),
    validation = Rule::new("self.spec.destination == oldSelf.spec.destination").message("spec.destination is immutable"),
    validation = Rule::new("!has(self.spec.source.remote) || !has(self.spec.destination.remote)").message("at most one side may be remote"),
    validation = Rule::new("!has(self.spec.source.hostPath) || has(self.spec.source.hostPath.node)").message("a source is one node: spec.source.hostPath takes node, not nodes or nodeSelector"),
    validation = Rule::new("!has(self.spec.destination.hostPath) || has(self.spec.destination.hostPath.node) || !has(self.spec.source.remote)").message("a fan-out destination (nodes, nodeSelector) needs a source in this cluster"),
    validation = Rule::new("!has(self.spec.source.pvc) || !has(self.spec.source.pvc.provision)").message("provision creates a destination claim: a source claim must exist"),
    validation = Rule::new("!has(self.spec.destination.pvc) || !has(self.spec.destination.pvc.provision) || self.spec.destination.pvc.provision.capacity != 'fromSource' || has(self.spec.source.pvc)").message("provision.capacity fromSource sizes the claim from the source claim: give a quantity for a hostPath or remote source"),
    validation = Rule::new("!has(self.spec.schedule) || !has(self.spec.destination.remote)").message("a source half follows its destination half's runs: put spec.schedule on the destination half"),
    validation = Rule::new("!has(self.spec.schedule) || !has(self.spec.ttlSecondsAfterFinished)").message("a scheduled Transfer runs again: ttlSecondsAfterFinished would delete it after its first run"),
    validation = Rule::new("!has(self.spec.schedule) || self.spec.schedule.concurrencyPolicy != 'Replace' || !has(self.spec.destination.hostPath) || has(self.spec.destination.hostPath.node)").message("concurrencyPolicy Replace is for one destination: a fan-out's destinations finish their run (use Forbid)")
)]
#[serde(rename_all = "camelCase")]
pub struct TransferSpec {
    /// Where the tree is read from.
    pub source: Endpoint,
    /// Where the tree is written to.
    pub destination: Endpoint,
    /// Parallel mutual-TLS streams between the movers (1-16); unset: the operator's default
    /// (`--default-streams`, 4 unless the admin changed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub streams: Option<u32>,
    /// Per-block compression: `auto` compresses only where the link is slower than the
    /// compressor; unset: the operator's default (`--default-compression`, `auto` unless changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Take blocks the destination node already holds from its block store instead of the wire.
    #[serde(default = "default_true")]
    pub dedup: bool,
    /// Decide "unchanged" by comparing file contents (BLAKE3) instead of size and mtime.
    #[serde(default)]
    pub checksum: bool,
    /// Delete destination entries the source does not have (also allows replacing a non-empty
    /// directory by a file).
    #[serde(default)]
    pub delete_extraneous: bool,
    /// Patterns of source paths to leave out, rsync's rules as the mover's `--exclude`: `*.tmp`
    /// any such name, `/cache/` only the top-level directory, `logs/*.gz` a path tail, `**`
    /// crosses `/`. With deleteExtraneous, destination entries they match are kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Keep file owners (needs a root mover, which the operator's configuration must allow).
    #[serde(default)]
    pub preserve_ownership: bool,
    /// Run the sender with one privilege, CAP_DAC_READ_SEARCH: it reads every file and
    /// directory whatever their permissions, and writes nothing (its volume is mounted
    /// read-only). For sources the movers' uid cannot read, such as root-owned trees. Needs an
    /// operator started with `--allow-privileged-readers` and a namespace whose Pod Security
    /// level admits the capability (privileged).
    #[serde(default)]
    pub read_all_files: bool,
    /// What a source file or directory the sender cannot read (permission denied) does to the
    /// Transfer: `Fail` (the default) fails it at once, naming the entry; `Skip` copies the rest
    /// and lists what was left out in `status.unreadable`.
    #[serde(default)]
    pub on_unreadable: OnUnreadable,
    /// Cap on bytes per second over all streams, as a Kubernetes quantity (`50M`, `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_limit: Option<Quantity>,
    /// fsync every file before it is published (durable, slower).
    #[serde(default)]
    pub sync: bool,
    /// Retries after a failed attempt before the Transfer is Failed.
    #[serde(default = "default_backoff_limit")]
    #[schemars(range(max = 100))]
    pub backoff_limit: u32,
    /// Seconds the Transfer may run (all attempts) before it is Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Delete the Transfer this long after it finished. Off by default; not for Transfers a
    /// GitOps tool manages (it would create them again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
    /// Stop the movers; setting it back to false continues where the Transfer stopped.
    #[serde(default)]
    pub suspend: bool,
    /// Any string; changing it runs a finished Transfer again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Run again on a cron schedule (a sync): each run copies what changed since the last.
    /// The first run starts when the Transfer is created; `suspend` pauses the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    /// Finished runs kept in `status.history` (newest first); unset: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub history_limit: Option<u32>,
    /// Settings for the mover pods (defaults come from the operator's configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
}

/// When a Transfer runs again by itself, as a Kubernetes CronJob's schedule.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// Five fields, `minute hour day-of-month month day-of-week` (`*`, `?`, `a-b`, `*/n`,
    /// lists, `jan`-`dec`, `sun`-`sat`; day of week 0 and 7 are Sunday), or `@hourly`,
    /// `@daily` (`@midnight`), `@weekly`, `@monthly`, `@yearly` (`@annually`).
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(
        "self.matches('^[ \\t]*(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9A-Za-z*?/,-]+([ \\t]+[0-9A-Za-z*?/,-]+){4})[ \\t]*$')"
    ).message("schedule.cron takes five fields (minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\") or a macro such as @daily"))]
    pub cron: String,
    /// An IANA time zone (`Europe/Berlin`) the fields are read in; unset: UTC. A wall-clock
    /// time the zone skips (spring forward) does not fire; one it repeats fires once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$')").message("schedule.timeZone is an IANA zone name such as Europe/Berlin or UTC"))]
    pub time_zone: Option<String>,
    /// A scheduled time that comes while a run is still going: `Forbid` (the default) skips
    /// it (counted in `status.skippedRuns`); `Replace` stops the run (recorded as Replaced;
    /// the next resumes from what it wrote) and starts a new one.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// A run that cannot start within this many seconds of its scheduled time (the operator
    /// was down, the Transfer suspended) is skipped. Unset: a missed time is caught up, once
    /// however many were missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub starting_deadline_seconds: Option<i64>,
}

/// What a due scheduled run does to a run still going.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConcurrencyPolicy {
    #[default]
    Forbid,
    Replace,
}

fn default_true() -> bool {
    true
}
fn default_backoff_limit() -> u32 {
    DEFAULT_BACKOFF_LIMIT
}

/// One side of a Transfer: exactly one of `pvc`, `hostPath` or `remote`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.pvc) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + (has(self.remote) ? 1 : 0) == 1"
).message("set exactly one of pvc, hostPath or remote"))]
pub struct Endpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathEndpoint>,
    /// The other half of a cross-cluster Transfer: a Transfer in the cluster a `Peer` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteEndpoint>,
}

/// A directory inside a PersistentVolumeClaim of the Transfer's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PvcEndpoint {
    /// A DNS subdomain name, as every object name.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub claim_name: String,
    /// Directory inside the volume (`/` or empty is the volume's root).
    #[serde(default)]
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("!self.matches('(^|/)[.][.](/|$)')").message("path must not contain '..'"))]
    pub path: String,
    /// Destination only: create the claim when it does not exist (and wait for nothing else:
    /// the receiver is its first consumer, so a WaitForFirstConsumer class binds it on the
    /// receiver's node). The claim belongs to nobody: deleting the Transfer leaves it and its
    /// data. ferry never resizes a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision: Option<ClaimProvision>,
}

/// The claim the operator creates for a destination.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClaimProvision {
    /// A quantity of bytes (`50Gi`, `500G`), or `fromSource`: the source claim's capacity plus
    /// `headroomPercent`.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self == 'fromSource' || isQuantity(self)").message("provision.capacity is a quantity such as 50Gi, or fromSource"))]
    #[x_kube(validation = Rule::new("self == 'fromSource' || !isQuantity(self) || quantity(self).isGreaterThan(quantity('0'))").message("provision.capacity must be more than 0"))]
    pub capacity: String,
    /// With `capacity: fromSource`: how much larger than the source claim (0-100, default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub headroom_percent: Option<u32>,
    /// Unset: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// Unset: `[ReadWriteOnce]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub access_modes: Vec<ClaimAccessMode>,
    /// Only `Filesystem`: a tree needs a file system (a raw block volume holds none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<ClaimVolumeMode>,
}

/// How a provisioned claim may be mounted (a destination is written, so no ReadOnlyMany).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimAccessMode {
    #[default]
    ReadWriteOnce,
    ReadWriteOncePod,
    ReadWriteMany,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimVolumeMode {
    #[default]
    Filesystem,
}

impl ClaimProvision {
    /// The default percent a `fromSource` claim is larger than its source.
    pub const DEFAULT_HEADROOM_PERCENT: u32 = 10;
    pub const FROM_SOURCE: &'static str = "fromSource";
}

/// A directory on one node's filesystem, under a root the operator's configuration allows; as
/// a destination, the same directory on many nodes (fan-out): exactly one of `node`, `nodes` or
/// `nodeSelector`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.node) ? 1 : 0) + (has(self.nodes) ? 1 : 0) + (has(self.nodeSelector) ? 1 : 0) == 1"
).message("set exactly one of node, nodes or nodeSelector"))]
#[x_kube(validation = Rule::new("!has(self.minAvailable) || !has(self.node)").message("minAvailable is for a fan-out: set nodes or nodeSelector"))]
#[x_kube(validation = Rule::new("!has(self.minAvailable) || !has(self.nodes) || self.minAvailable <= size(self.nodes)").message("minAvailable must not exceed the number of nodes"))]
pub struct HostPathEndpoint {
    /// A node's name (a DNS subdomain name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub node: String,
    /// Fan-out (destination only): every one of these nodes gets the tree. The source sends
    /// about one copy; the destinations take from each other what one of them already received.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self.all(n, self.exists_one(m, m == n))").message("nodes must not repeat"))]
    pub nodes: Vec<NodeName>,
    /// Fan-out (destination only): the nodes these labels select when a run starts (the set
    /// is recorded in `status.destinations` and kept for the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeLabelSelector>,
    /// Fan-out (destination only): how many destinations must hold a verified copy for the run
    /// to succeed; the others still run to the end. The `Available` condition turns True as
    /// soon as this many have it. Default: every destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_available: Option<u32>,
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')").message("path must be absolute and must not contain '..'"))]
    pub path: String,
}

/// Nodes by their labels: a Kubernetes label selector (`matchLabels`, `matchExpressions`),
/// with bounds so that the API server can check the Transfer's rules cheaply.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeLabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub match_labels: BTreeMap<String, LabelValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub match_expressions: Vec<NodeLabelRequirement>,
}

/// `key operator values`, as in a Kubernetes label selector.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeLabelRequirement {
    #[schemars(length(min = 1, max = 317))]
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub values: Vec<LabelValue>,
}

/// A label value (at most 63 characters).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(transparent)]
pub struct LabelValue(#[schemars(length(max = 63))] pub String);

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SelectorOperator {
    #[default]
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl NodeLabelSelector {
    /// The same selector as Kubernetes' own type.
    pub fn to_label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: (!self.match_labels.is_empty()).then(|| {
                self.match_labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect()
            }),
            match_expressions: (!self.match_expressions.is_empty()).then(|| {
                self.match_expressions
                    .iter()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: format!("{:?}", r.operator),
                        values: (!r.values.is_empty())
                            .then(|| r.values.iter().map(|v| v.0.clone()).collect()),
                    })
                    .collect()
            }),
        }
    }
}

/// A node's name (a DNS subdomain name).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct NodeName(
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub String,
);

/// The other half of a cross-cluster Transfer. Both clusters declare their half: the
/// destination's names the source Transfer, the source's names the destination Transfer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RemoteEndpoint {
    /// The cluster-scoped `Peer` naming the other cluster.
    #[schemars(length(min = 1, max = 253))]
    pub peer: String,
    /// Namespace and name of the Transfer in that cluster.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What an unreadable source entry does to a Transfer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnUnreadable {
    #[default]
    Fail,
    Skip,
}

/// Per-block compression.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    Auto,
    Zstd,
    Lz4,
    None,
}

impl Compression {
    /// The mover's `--compress` value.
    pub fn flag(self) -> &'static str {
        match self {
            Compression::Auto => "auto",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::None => "none",
        }
    }
}

/// Mover pod settings; each one unset falls back to the operator's defaults.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MoverSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Which side of a Transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Source,
    Destination,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Destination => "destination",
        }
    }
}

impl HostPathEndpoint {
    /// Whether this names many nodes (a fan-out destination).
    pub fn is_fan_out(&self) -> bool {
        !self.nodes.is_empty() || self.node_selector.is_some()
    }
}

impl Transfer {
    /// A fan-out Transfer: its destination names many nodes. The operator runs it as one
    /// child Transfer per node and reports them together.
    pub fn is_fan_out(&self) -> bool {
        self.spec
            .destination
            .host_path
            .as_ref()
            .is_some_and(HostPathEndpoint::is_fan_out)
    }

    /// The source half of a cross-cluster Transfer (its destination is in another cluster).
    pub fn is_source_half(&self) -> bool {
        self.spec.destination.remote.is_some()
    }

    /// The destination half of a cross-cluster Transfer (its source is in another cluster).
    pub fn is_destination_half(&self) -> bool {
        self.spec.source.remote.is_some()
    }

    /// The remote side's reference, if this is a half.
    pub fn remote(&self) -> Option<&RemoteEndpoint> {
        self.spec
            .source
            .remote
            .as_ref()
            .or(self.spec.destination.remote.as_ref())
    }

    pub fn endpoint(&self, side: Side) -> &Endpoint {
        match side {
            Side::Source => &self.spec.source,
            Side::Destination => &self.spec.destination,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn committed_crd_matches_the_types() {
        let generated = crate::crd_yaml().expect("render CRD");
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../crds/ferry.dev_transfers.yaml"
        );
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/ferry.dev_transfers.yaml is stale: run `make crds`"
        );
    }

    #[test]
    fn committed_peer_crd_matches_the_types() {
        let generated = crate::peer_crd_yaml().expect("render CRD");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/ferry.dev_peers.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/ferry.dev_peers.yaml is stale: run `make crds`"
        );
    }

    #[test]
    fn crd_has_cel_rules_short_name_and_columns() {
        let crd = serde_json::to_string(&Transfer::crd()).expect("json");
        assert!(crd.contains("set exactly one of pvc, hostPath or remote"));
        assert!(crd.contains("spec.source is immutable"));
        assert!(crd.contains("\"xfer\""));
        assert!(crd.contains(".status.progress.display"));
    }

    #[test]
    fn defaults_fill_an_empty_spec() {
        let spec: TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/x"}},
            "destination": {"pvc": {"claimName": "c"}}
        }))
        .expect("parse");
        // Streams and compression are the operator's defaults (its flags), not the schema's.
        assert_eq!(spec.streams, None);
        assert!(spec.dedup);
        assert_eq!(spec.backoff_limit, 3);
        assert_eq!(spec.compression, None);
    }
}
