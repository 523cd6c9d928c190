//! The pure core of reconcile: from a Transfer and what `observe` saw, the next status and the
//! actions that move the cluster toward it. No I/O; every rule here has a unit test.
//!
//! Lifecycle: a run (one per `spec.trigger` value) has attempts; an attempt is one receiver pod,
//! then one sender pod, with certificates of their own. A failed attempt is replaced by the next
//! after a backoff, which resumes from the receiver's staging (keyed by the run, not the attempt).
//!
//! Cross-cluster: the destination half runs this same lifecycle, with a receiver behind a
//! Service and the other cluster's sender (as its operator reports it) in place of a local one;
//! the source half (`source_half`) follows the destination half's runs and attempts.
//!
//! Here: the types observe fills and apply executes, the entry `plan`, and what every path
//! shares (conditions, deleting children, blocking, finishing, certificates). By concern:
//! `lifecycle` (runs and attempts), `failure` (a failed attempt and its retry), `validation`
//! (what keeps a Transfer from starting), `progress` (the moving figures), `destination_half`
//! and `source_half`; `tenancy` (which store a receiver uses at its node service). Beside them
//! the decisions observe used to make and the fan-out's own plan: `placement` (where each side
//! runs), `overlap` (which Transfers may not run at once), `limits` (admission and fairness),
//! `runs` (schedules and triggers), `provision` (claims to create), `cleanup` (what deletion
//! removes) and `fan_out` (the children of a fan-out, its senders and swarm roles).

pub mod cleanup;
mod destination_half;
mod failure;
pub mod fan_out;
mod fan_out_child;
mod lifecycle;
pub mod limits;
pub mod overlap;
pub mod placement;
mod progress;
pub mod provision;
pub mod runs;
mod source_half;
pub mod tenancy;
#[cfg(test)]
pub(crate) mod tests;
mod validation;

pub use failure::{OTHER_VERDICT_GRACE, set_refused};
pub use ferry_api::human::{human_duration, human_rate};
pub use progress::{fold_progress, percent};
pub use validation::{bandwidth_bytes, parse_quantity};

use failure::{attempt_failure, fail_attempt};
use progress::moving_data;
use validation::blocked;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{
    ConditionType, LastError, MoverRef, OnUnreadable, Phase, ProgressStatus, QueueStatus, Reason,
    ThroughputStatus, Transfer, TransferSpec, TransferStatus, UnreadableStatus, WireStatus,
    set_condition,
};
use crate::names::{self, MoverRole};
use crate::peering::registry::Counterpart;
use crate::peering::wire::{PairResponse, SenderState};
use crate::plan::placement::{Blocked, SidePlacement};
use ferry_proto::kind::ErrorKind;
use ferry_proto::progress::v1::{Phase as MoverPhase, ProgressUpdate};

/// First retry delay; each further failure doubles it, up to [`BACKOFF_MAX`].
pub const BACKOFF_BASE: Duration = Duration::from_secs(2);
pub const BACKOFF_MAX: Duration = Duration::from_secs(120);
/// How often a running Transfer is looked at even when nothing announces a change.
pub const RESYNC_RUNNING: Duration = Duration::from_secs(15);
/// How soon a Transfer looks again after it created its destination claim (claims are not
/// watched per Transfer).
pub const RESYNC_PROVISIONED: Duration = Duration::from_secs(2);
/// How often a blocked Transfer (missing claim, missing node) checks whether the cause is gone.
pub const RESYNC_BLOCKED: Duration = Duration::from_secs(10);
/// How often a source half asks its destination half how things stand.
pub const POLL_REMOTE: Duration = Duration::from_secs(2);
/// How often a half asks again after a call to the other cluster failed for a passing reason.
pub const RETRY_REMOTE: Duration = Duration::from_secs(5);
/// How often a fan-out child waiting for the fan-out's sender looks again (the sender is not
/// watched per child).
pub const RESYNC_FAN_OUT_SENDER: Duration = Duration::from_secs(2);
/// How stale `status.remote.lastHeard` may get before it is written again.
pub const LAST_HEARD_REFRESH: Duration = Duration::from_secs(20);

/// A pod's state as far as the plan cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub phase: PodPhase,
    pub ready: bool,
    pub ip: Option<String>,
    pub node: Option<String>,
    /// The container's termination message (the mover's last error lines).
    pub message: Option<String>,
    /// The container's exit status once it terminated (the mover's status says the error kind).
    pub exit_code: Option<i32>,
    /// When the container terminated.
    pub finished_at: Option<Timestamp>,
    /// When the pod was created (how long it has been pending).
    pub created: Option<Timestamp>,
    /// Why the pod does not start, as the cluster says it (scheduler, kubelet, image pull).
    pub stuck: Option<Stuck>,
    /// Being deleted already.
    pub deleting: bool,
}

/// Why a mover pod does not start, with the cluster's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    pub reason: Reason,
    /// The cluster's reason (`ErrImagePull`, `Unschedulable`, `FailedMount`, ...).
    pub cause: String,
    /// The object's own message (the scheduler's condition, the container's waiting state, the
    /// kubelet's Event).
    pub message: String,
}

/// Everything reconcile observed, for one Transfer.
#[derive(Debug, Clone)]
pub struct Observed {
    pub now: Timestamp,
    /// Source and destination placement, or why they cannot be placed.
    pub placement: Result<(SidePlacement, SidePlacement), Blocked>,
    /// Every pod and Secret of this Transfer (any run or attempt).
    pub pods: Vec<PodView>,
    pub secrets: Vec<String>,
    /// The latest progress updates of the current attempt's movers.
    pub receiver_progress: Option<ProgressUpdate>,
    pub sender_progress: Option<ProgressUpdate>,
    /// Whether the concurrency limits let this Transfer start movers now.
    pub may_start: bool,
    /// Where it waits when they do not.
    pub queue: Option<crate::plan::limits::Queued>,
    /// When this operator began to act: nothing said by the other cluster before was heard by
    /// it, so a silence counts from here at the earliest.
    pub acting_since: Timestamp,
    /// How long the other half of a cross-cluster Transfer may stay silent before this half
    /// stops its mover (`--peer-silence-grace`).
    pub peer_silence_grace: Duration,
    /// How long a mover pod may stay pending before its attempt fails (`--mover-pending-timeout`).
    pub pending_timeout: Duration,
    /// The namespace's Pod Security level forbids hostPath volumes (baseline or restricted).
    pub host_path_forbidden: bool,
    /// The operator may run root movers (`--allow-root-movers`), which `preserveOwnership`
    /// needs.
    pub root_movers_allowed: bool,
    /// The priority class `spec.mover.priorityClassName` asks for, when the admin does not allow
    /// it (`--allowed-priority-class`).
    pub priority_class_refused: Option<String>,
    /// The operator may run senders with CAP_DAC_READ_SEARCH (`--allow-privileged-readers`),
    /// which `readAllFiles` needs.
    pub privileged_readers_allowed: bool,
    /// Set for a half of a cross-cluster Transfer.
    pub remote: Option<RemoteObserved>,
    /// A destination claim to provision (`destination.pvc.provision`): what to do about it.
    pub provision: Option<crate::plan::provision::ProvisionStep>,
    /// A fan-out child's first attempt: the fan-out's sender of the run, which reads the source
    /// once for every destination it serves.
    pub fan_out_sender: Option<FanOutSender>,
    /// A fan-out child on a node with a block service: its siblings' services, which its
    /// receiver may take blocks from.
    pub swarm: Option<crate::plan::fan_out::Swarm>,
}

/// The senders a fan-out starts for the first attempts of its run's children, as one child sees
/// them (`fan_out::sender` decides whom each serves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOutSender {
    /// The one whose certificate names this child's first attempt, if any.
    pub serving: Option<PodView>,
    /// Whether the fan-out started its senders for the run (a child none serves runs its own).
    pub started: bool,
}

/// How long a fan-out child's first attempt waits, from its receiver's start, for the
/// fan-out's sender before it starts one of its own (the fan-out gathers its children's
/// receivers for at most `fan_out::sender::GATHER`).
pub const FAN_OUT_SENDER_WAIT: Duration = Duration::from_secs(60);

/// What observe saw of the other cluster.
#[derive(Debug, Clone, Default)]
pub struct RemoteObserved {
    /// The cluster name of the Peer the spec names, or why that Peer cannot be used.
    pub peer: Option<Result<String, Blocked>>,
    /// Destination half: the source half as it last called.
    pub counterpart: Option<Counterpart>,
    /// Destination half: the receiver Service's `host:port`, once it has one.
    pub receiver_address: Option<String>,
    /// Destination half: whether the receiver's Service exists.
    pub service_exists: bool,
    /// Source half: the destination half's answer (none when the Peer is unusable).
    pub answer: Option<Result<PairResponse, Blocked>>,
}

/// A change the apply step makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Issue certificates for (run, attempt) and store them in the attempt's Secret.
    CreateSecret {
        run: u32,
        attempt: u32,
    },
    CreateReceiver {
        run: u32,
        attempt: u32,
    },
    CreateSender {
        run: u32,
        attempt: u32,
        receiver_ip: String,
    },
    /// A source half's sender, connecting to the receiver's Service in the other cluster.
    CreateRemoteSender {
        run: u32,
        attempt: u32,
        address: String,
    },
    /// A destination half's Service in front of the receiver of (run, attempt).
    ApplyReceiverService {
        run: u32,
        attempt: u32,
    },
    DeleteService(String),
    DeletePod(String),
    DeleteSecret(String),
    /// `ttlSecondsAfterFinished` ran out.
    DeleteTransfer,
    /// Create the destination claim (`destination.pvc.provision`).
    CreateClaim(crate::plan::provision::ClaimRequest),
}

/// An Event to record (events.k8s.io).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub status: TransferStatus,
    pub actions: Vec<Action>,
    /// Whether the receiver may use the node's block store (a hostPath volume).
    pub dedup: bool,
    pub requeue: Option<Duration>,
    pub notes: Vec<Note>,
    /// The siblings this attempt's receiver takes blocks from: a fan-out child's, with the
    /// node's block store, until an attempt failed (a retry asks the source for all it lacks;
    /// a sibling may be what failed).
    pub swarm: Option<crate::plan::fan_out::Swarm>,
}

/// `t + d`, or the end of time when that is past it (a deadline near i64::MAX seconds is "far
/// away", never "now").
fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// What `ttlSecondsAfterFinished` asks of a Transfer that finished at `done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ttl {
    /// No TTL (or no completion time): keep it.
    Keep,
    DeleteNow,
    /// Look again after this long.
    Wait(Duration),
}

pub(crate) fn ttl_after_finished(ttl: Option<i64>, done: Option<&Time>, now: Timestamp) -> Ttl {
    let (Some(ttl), Some(done)) = (ttl, done) else {
        return Ttl::Keep;
    };
    let expires = add(done.0, Duration::from_secs(ttl.max(0) as u64));
    if now >= expires {
        Ttl::DeleteNow
    } else {
        Ttl::Wait(until(now, expires))
    }
}

/// The longest wait a plan asks for: a far deadline is looked at again now and then.
const MAX_WAIT: Duration = Duration::from_secs(3600);

pub(crate) fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now))
        .unwrap_or(Duration::ZERO)
        .min(MAX_WAIT)
}

struct Ctx<'a> {
    st: TransferStatus,
    actions: Vec<Action>,
    notes: Vec<Note>,
    now: Time,
    generation: Option<i64>,
    obs: &'a Observed,
    /// What the run rules decided (a new run, a skipped scheduled time, the next one).
    decision: crate::plan::runs::Decision,
}

impl Ctx<'_> {
    fn cond(&mut self, kind: ConditionType, status: bool, reason: Reason, message: &str) {
        set_condition(
            &mut self.st.conditions,
            kind,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    fn pod(&self, role: MoverRole, uid: &str) -> Option<&PodView> {
        let name = names::pod_name(uid, self.st.run, self.st.attempts, role);
        self.obs.pods.iter().find(|p| p.name == name)
    }

    /// Deletes every pod and Secret that is not of the current attempt (or all of them).
    fn delete_children(&mut self, uid: &str, keep_current: bool) {
        let (run, attempt) = (self.st.run, self.st.attempts);
        let current = [
            names::pod_name(uid, run, attempt, MoverRole::Receiver),
            names::pod_name(uid, run, attempt, MoverRole::Sender),
        ];
        for p in &self.obs.pods {
            if !(p.deleting || keep_current && current.contains(&p.name)) {
                self.actions.push(Action::DeletePod(p.name.clone()));
            }
        }
        let secret = names::secret_name(uid, run, attempt);
        for s in &self.obs.secrets {
            if !(keep_current && *s == secret) {
                self.actions.push(Action::DeleteSecret(s.clone()));
            }
        }
    }

    /// Stops the current attempt without counting it as failed (suspend, a spec that became
    /// invalid): its movers go, and the next attempt gets new names and certificates and
    /// resumes from the staging data. A Retrying attempt's movers are gone already.
    fn stop_attempt(&mut self, uid: &str) {
        let running = self.pod(MoverRole::Receiver, uid).is_some()
            || self.pod(MoverRole::Sender, uid).is_some();
        if running || self.st.phase == Phase::Retrying {
            self.st.attempts += 1;
        }
        self.st.receiver = None;
        self.st.sender = None;
        self.st.retry_after = None;
        self.st.throughput = None;
        self.st.eta = None;
        self.delete_children(uid, false);
    }

    /// Pending with the reason it cannot proceed (`Ready=False`, `lastError`); a Warning Event
    /// when the reason is new, not on every re-check.
    fn block(&mut self, b: &Blocked) {
        let reported = self
            .st
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == b.reason.as_str());
        if !reported {
            self.notes.push(Note {
                warning: true,
                reason: b.reason.as_str(),
                message: b.message.clone(),
            });
        }
        self.st.phase = Phase::Pending;
        self.cond(ConditionType::Ready, false, b.reason, &b.message);
        self.st.last_error = Some(LastError {
            reason: b.reason.as_str().to_owned(),
            message: b.message.clone(),
        });
    }

    /// The other cluster's name (a half's Peer), for messages.
    fn peer_cluster(&self) -> String {
        self.obs
            .remote
            .as_ref()
            .and_then(|r| r.peer.clone())
            .and_then(|p| p.ok())
            .unwrap_or_else(|| "?".into())
    }

    /// How long the other half has been silent: since this process last heard it
    /// (`heard_now`), else since the status says it was heard, and never since before this
    /// operator began to act (what was said before, it could not hear).
    fn silence(&self, heard_now: Option<Timestamp>) -> Duration {
        let kept = self
            .st
            .remote
            .as_ref()
            .and_then(|r| r.last_heard.as_ref())
            .map(|t| t.0);
        let since = self.obs.acting_since;
        let heard = heard_now.or(kept).map_or(since, |h| h.max(since));
        until(heard, self.obs.now)
    }

    /// A finished run: the current attempt's pods stay for their logs; every other pod and
    /// Secret goes, and the current attempt's certificates too.
    fn retire(&mut self, uid: &str) {
        self.delete_children(uid, true);
        self.retire_secret(uid);
    }

    fn retire_secret(&mut self, uid: &str) {
        let secret = names::secret_name(uid, self.st.run, self.st.attempts);
        if self.obs.secrets.contains(&secret) {
            self.actions.push(Action::DeleteSecret(secret));
        }
    }

    /// The certificates of (run, attempt), unless they exist.
    fn ensure_secret(&mut self, uid: &str, run: u32, attempt: u32) {
        if !self
            .obs
            .secrets
            .contains(&names::secret_name(uid, run, attempt))
        {
            self.actions.push(Action::CreateSecret { run, attempt });
        }
    }

    fn finish(&mut self, phase: Phase, reason: Reason, message: &str) {
        self.st.phase = phase;
        self.st.completion_time = Some(self.now.clone());
        self.st.retry_after = None;
        self.st.eta = None;
        let ok = phase == Phase::Succeeded;
        self.cond(ConditionType::Succeeded, ok, reason, message);
        self.cond(ConditionType::Failed, !ok, reason, message);
        self.cond(ConditionType::Ready, ok, reason, message);
        if !ok {
            self.st.last_error = Some(LastError {
                reason: reason.as_str().to_owned(),
                message: message.to_owned(),
            });
        }
        self.notes.push(Note {
            warning: !ok,
            reason: if ok { "Succeeded" } else { "Failed" },
            message: message.to_owned(),
        });
    }
}

/// The next status and actions for `t` given what was observed.
pub fn plan(t: &Transfer, obs: &Observed) -> Plan {
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let before = t.status.clone().unwrap_or_default();
    let mut cx = Ctx {
        st: before.clone(),
        actions: Vec::new(),
        notes: Vec::new(),
        now: Time(obs.now),
        generation: t.metadata.generation,
        obs,
        decision: crate::plan::runs::Decision::default(),
    };
    cx.st.observed_generation = t.metadata.generation;
    // Set again below while the Transfer waits for a slot.
    cx.st.queue = None;
    let requeue = if t.is_source_half() {
        source_half::step(t, &uid, &mut cx)
    } else {
        lifecycle::step(t, &uid, &mut cx)
    };
    keep_last_heard(t, &before, &mut cx);
    crate::plan::runs::after_plan(t, &before, &mut cx.st, &cx.decision);
    let requeue = match (requeue, cx.decision.next) {
        (r, Some(next)) => Some(r.map_or(until(obs.now, next), |r| r.min(until(obs.now, next)))),
        (r, None) => r,
    };
    if cx.st.phase != before.phase {
        let reason = cx
            .st
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        if !cx.st.phase.is_finished() {
            cx.notes.push(Note {
                warning: matches!(cx.st.phase, Phase::Retrying),
                reason: phase_event_reason(cx.st.phase),
                message: reason,
            });
        }
    }
    let store_failed = cx.st.conditions.iter().any(|c| {
        c.type_ == ConditionType::Dedup.as_str() && c.reason == Reason::BlockStoreFailed.as_str()
    });
    let dedup = t.spec.dedup && !store_failed;
    let swarm = obs
        .swarm
        .clone()
        .filter(|_| tenancy::store_scope(t, dedup).is_some() && cx.st.failures == 0);
    Plan {
        status: cx.st,
        actions: cx.actions,
        dedup,
        requeue,
        notes: cx.notes,
        swarm,
    }
}

/// Writes when the other half was last heard into `status.remote` (coarsely: a write every
/// [`LAST_HEARD_REFRESH`] at most), so that an operator that restarts or takes over knows the
/// pairing was alive.
fn keep_last_heard(t: &Transfer, before: &TransferStatus, cx: &mut Ctx<'_>) {
    let Some(remote) = &cx.obs.remote else {
        return;
    };
    let heard_now = if t.is_source_half() {
        matches!(remote.answer, Some(Ok(_))).then_some(cx.obs.now)
    } else {
        remote.counterpart.as_ref().map(|c| c.last_call)
    };
    let kept = before.remote.as_ref().and_then(|r| r.last_heard.clone());
    let Some(r) = cx.st.remote.as_mut() else {
        return;
    };
    r.last_heard = match (heard_now, kept) {
        (Some(h), Some(k)) if until(k.0, h) < LAST_HEARD_REFRESH => Some(k),
        (Some(h), _) => Some(Time(h)),
        (None, k) => k,
    };
}

fn phase_event_reason(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Running => "Started",
        Phase::Retrying => "Retrying",
        Phase::Suspended => "Suspended",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
    }
}
