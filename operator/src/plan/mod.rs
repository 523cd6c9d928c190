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

mod source_half;

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
use crate::placement::{Blocked, SidePlacement};
use ferry_mover::kind::ErrorKind;
use ferry_proto::progress::v1::{Phase as MoverPhase, ProgressUpdate};

/// First retry delay; each further failure doubles it, up to [`BACKOFF_MAX`].
pub const BACKOFF_BASE: Duration = Duration::from_secs(2);
pub const BACKOFF_MAX: Duration = Duration::from_secs(120);
/// How often a running Transfer is looked at even when nothing announces a change.
pub const RESYNC_RUNNING: Duration = Duration::from_secs(15);
/// How often a blocked Transfer (missing claim, missing node) checks whether the cause is gone.
pub const RESYNC_BLOCKED: Duration = Duration::from_secs(10);
/// How often a source half asks its destination half how things stand.
pub const POLL_REMOTE: Duration = Duration::from_secs(2);
/// How often a half asks again after a call to the other cluster failed for a passing reason.
pub const RETRY_REMOTE: Duration = Duration::from_secs(5);
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
    pub queue: Option<crate::limits::Queued>,
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
}

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
}

/// The bandwidth limit in bytes per second; `Err` names what is wrong with the quantity.
pub fn bandwidth_bytes(spec: &TransferSpec) -> Result<Option<u64>, String> {
    match &spec.bandwidth_limit {
        None => Ok(None),
        Some(q) => match parse_quantity(&q.0) {
            None => Err(format!(
                "bandwidthLimit {:?} is not a quantity of bytes per second (e.g. 50M, 1Gi)",
                q.0
            )),
            // Zero would reach the mover as "no limit": the opposite of what was asked.
            Some(0) => Err(format!(
                "bandwidthLimit {:?} is under 1 byte per second; leave it unset for no limit",
                q.0
            )),
            Some(v) => Ok(Some(v)),
        },
    }
}

pub use ferry_mover::quantity::parse_quantity;

/// Spec fields this operator cannot honour as asked, refused instead of silently ignored.
fn unsupported(spec: &TransferSpec, obs: &Observed) -> Option<Blocked> {
    if spec.read_all_files && !obs.privileged_readers_allowed {
        return Some(Blocked {
            reason: Reason::PrivilegedReadersNotAllowed,
            message: "spec.readAllFiles needs a sender with CAP_DAC_READ_SEARCH, which this \
                      operator does not start (an administrator allows it with the chart's \
                      allowPrivilegedReaders, the operator's --allow-privileged-readers)"
                .into(),
        });
    }
    if let Some(class) = &obs.priority_class_refused {
        return Some(Blocked {
            reason: Reason::PriorityClassNotAllowed,
            message: format!(
                "spec.mover.priorityClassName {class:?} is not one this operator allows (an \
                 administrator lists them with --allowed-priority-class); leave it unset for the \
                 default"
            ),
        });
    }
    if spec.preserve_ownership && !obs.root_movers_allowed {
        return Some(Blocked {
            reason: Reason::RootMoversNotAllowed,
            message: "spec.preserveOwnership needs movers running as root, which this operator \
                      does not start (an administrator allows them with the chart's \
                      allowRootMovers, the operator's --allow-root-movers)"
                .into(),
        });
    }
    let invalid = bandwidth_bytes(spec).err().or_else(|| {
        let rules = spec.exclude.iter().map(|p| (false, p.as_str()));
        ferry_mover::tree::Filter::new(rules)
            .err()
            .map(|e| format!("spec.exclude: {e}"))
    });
    invalid.map(|message| Blocked {
        reason: Reason::InvalidSpec,
        message,
    })
}

/// A half whose Peer is missing or unusable waits with the reason.
fn peer_blocked(obs: &Observed) -> Option<Blocked> {
    obs.remote.as_ref()?.peer.clone()?.err()
}

fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    (BACKOFF_BASE * (1u32 << shift)).min(BACKOFF_MAX)
}

/// `t + d`, or the end of time when that is past it (a deadline near i64::MAX seconds is "far
/// away", never "now").
fn add(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// The longest wait a plan asks for: a far deadline is looked at again now and then.
const MAX_WAIT: Duration = Duration::from_secs(3600);

fn until(now: Timestamp, then: Timestamp) -> Duration {
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

    /// Destination half: the other cluster's sender of the current attempt, as its operator
    /// last reported it, seen as a pod of this attempt.
    fn remote_sender(&self) -> Option<PodView> {
        let c = self.obs.remote.as_ref()?.counterpart.as_ref()?;
        let r = c.report.as_ref()?;
        if (r.run, r.attempt) != (self.st.run, self.st.attempts) {
            return None;
        }
        let phase = match r.state {
            SenderState::Pending => PodPhase::Pending,
            SenderState::Running => PodPhase::Running,
            SenderState::Succeeded => PodPhase::Succeeded,
            SenderState::Failed => PodPhase::Failed,
        };
        Some(PodView {
            name: format!("{}/{}", c.source.namespace, r.pod),
            phase,
            ready: phase == PodPhase::Running,
            ip: None,
            node: None,
            message: r.message.clone(),
            exit_code: r.exit_code,
            finished_at: None,
            created: None,
            stuck: None,
            deleting: false,
        })
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

    /// Destination half: waits (receiver stopped) while the source half has not called, or
    /// has gone silent (longer than the grace) or withdrew (at once). A receiver that runs is left alone
    /// while this operator has not heard the source half yet but the grace is not up (it just
    /// started or took the lead, or the source cluster's operator is restarting).
    fn await_counterpart(&mut self, t: &Transfer, uid: &str) -> Option<Duration> {
        let grace = self.obs.peer_silence_grace;
        let counterpart = self
            .obs
            .remote
            .as_ref()
            .and_then(|r| r.counterpart.as_ref());
        let withdrawn = counterpart.is_some_and(|c| c.withdrawn);
        let silence = self.silence(counterpart.map(|c| c.last_call));
        if counterpart.is_some() && !withdrawn && silence < grace {
            return None;
        }
        let paired = self.pod(MoverRole::Receiver, uid).is_some()
            || self
                .st
                .remote
                .as_ref()
                .is_some_and(|r| r.last_heard.is_some());
        if counterpart.is_none() && paired && silence < grace {
            return Some(POLL_REMOTE);
        }
        let remote = t.spec.source.remote.clone().unwrap_or_default();
        let peer = self.peer_cluster();
        self.stop_attempt(uid);
        self.st.phase = Phase::Pending;
        self.st.remote = Some(crate::api::RemoteStatus {
            cluster: peer.clone(),
            transfer_id: Some(names::transfer_id(uid, self.st.run)),
            receiver_address: None,
            last_heard: None,
        });
        self.cond(
            ConditionType::Ready,
            false,
            Reason::WaitingForCounterpart,
            &format!(
                "waiting for Transfer {}/{} in cluster {peer} (Peer {}) to pair: its operator has not called this cluster's cross-cluster endpoint in the last {} s (create that Transfer with destination.remote naming this one)",
                remote.namespace,
                remote.name,
                remote.peer,
                grace.as_secs()
            ),
        );
        Some(RESYNC_BLOCKED)
    }

    /// Destination half: the Service in front of the current receiver, and its address in
    /// status once the receiver accepts connections (the source half reads it from there).
    fn publish_receiver(&mut self, uid: &str, recv: Option<&PodView>) {
        let (run, attempt) = (self.st.run, self.st.attempts);
        let remote = self.obs.remote.clone().unwrap_or_default();
        // Applied with each new receiver: the selector names the attempt.
        if recv.is_none() || !remote.service_exists {
            self.actions
                .push(Action::ApplyReceiverService { run, attempt });
        }
        let ready = recv.is_some_and(|r| r.ready && r.phase == PodPhase::Running);
        self.st.remote = Some(crate::api::RemoteStatus {
            cluster: self.peer_cluster(),
            transfer_id: Some(names::transfer_id(uid, run)),
            receiver_address: remote.receiver_address.filter(|_| ready),
            last_heard: None,
        });
    }

    fn delete_receiver_service(&mut self, uid: &str) {
        if self.obs.remote.as_ref().is_some_and(|r| r.service_exists) {
            self.actions
                .push(Action::DeleteService(names::service_name(uid, self.st.run)));
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
    };
    cx.st.observed_generation = t.metadata.generation;
    // Set again below while the Transfer waits for a slot.
    cx.st.queue = None;
    let requeue = if t.is_source_half() {
        source_half::step(t, &uid, &mut cx)
    } else {
        step(t, &uid, &mut cx)
    };
    keep_last_heard(t, &before, &mut cx);
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
    Plan {
        status: cx.st,
        actions: cx.actions,
        dedup: t.spec.dedup && !obs.host_path_forbidden && !store_failed,
        requeue,
        notes: cx.notes,
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

fn step(t: &Transfer, uid: &str, cx: &mut Ctx<'_>) -> Option<Duration> {
    let spec = &t.spec;
    let now = cx.obs.now;

    // A new run: the first one, or a finished Transfer whose trigger changed.
    if cx.st.run == 0 || (cx.st.phase.is_finished() && spec.trigger != cx.st.observed_trigger) {
        let run = cx.st.run + 1;
        let conditions = std::mem::take(&mut cx.st.conditions);
        cx.st = TransferStatus {
            run,
            attempts: 1,
            observed_trigger: spec.trigger.clone(),
            observed_generation: t.metadata.generation,
            conditions,
            ..TransferStatus::default()
        };
        cx.cond(
            ConditionType::Succeeded,
            false,
            Reason::Pending,
            "not finished",
        );
        cx.cond(
            ConditionType::Failed,
            false,
            Reason::Pending,
            "not finished",
        );
        if run > 1 {
            cx.notes.push(Note {
                warning: false,
                reason: "Triggered",
                message: format!("spec.trigger changed: run {run} starts"),
            });
        }
    }

    if cx.st.phase.is_finished() {
        cx.delete_children(uid, true);
        let secret = names::secret_name(uid, cx.st.run, cx.st.attempts);
        if cx.obs.secrets.contains(&secret) {
            cx.actions.push(Action::DeleteSecret(secret));
        }
        cx.delete_receiver_service(uid);
        let (Some(ttl), Some(done)) = (spec.ttl_seconds_after_finished, &cx.st.completion_time)
        else {
            return None;
        };
        let expires = add(done.0, Duration::from_secs(ttl.max(0) as u64));
        if now >= expires {
            cx.actions.push(Action::DeleteTransfer);
            return None;
        }
        return Some(until(now, expires));
    }

    let uses_host_path = spec.source.host_path.is_some() || spec.destination.host_path.is_some();
    let psa = (cx.obs.host_path_forbidden && uses_host_path).then(|| Blocked {
        reason: Reason::PodSecurityForbidsHostPath,
        message: "the namespace's Pod Security level (baseline or restricted) forbids hostPath volumes: use claims here, or a namespace at the privileged level".into(),
    });
    let blocked = unsupported(spec, cx.obs)
        .or(psa)
        .or_else(|| cx.obs.placement.clone().err())
        .or_else(|| peer_blocked(cx.obs));
    if let Some(b) = blocked {
        cx.stop_attempt(uid);
        cx.block(&b);
        return Some(RESYNC_BLOCKED);
    }

    if let (Some(limit), Some(start)) = (spec.active_deadline_seconds, &cx.st.start_time)
        && now >= add(start.0, Duration::from_secs(limit.max(0) as u64))
    {
        cx.delete_children(uid, false);
        cx.finish(
            Phase::Failed,
            Reason::DeadlineExceeded,
            &format!("the Transfer ran longer than activeDeadlineSeconds ({limit} s)"),
        );
        return None;
    }

    if spec.suspend {
        if cx.st.phase != Phase::Suspended {
            cx.stop_attempt(uid);
        } else {
            cx.delete_children(uid, false);
        }
        cx.st.phase = Phase::Suspended;
        cx.cond(
            ConditionType::Ready,
            false,
            Reason::Suspended,
            "spec.suspend is set: movers stopped; clear it to continue where the Transfer stopped",
        );
        // The deadline keeps running while suspended.
        return spec.active_deadline_seconds.map(|_| RESYNC_BLOCKED);
    }
    if cx.st.phase == Phase::Suspended {
        cx.st.phase = Phase::Pending;
    }

    if cx.st.phase == Phase::Retrying {
        if let Some(at) = &cx.st.retry_after
            && now < at.0
        {
            return Some(until(now, at.0));
        }
        cx.st.attempts += 1;
        cx.st.retry_after = None;
        cx.st.phase = Phase::Pending;
        cx.st.sender = None;
        cx.st.receiver = None;
    }
    cx.delete_children(uid, true);

    let destination_half = t.is_destination_half();
    if destination_half && let Some(wait) = cx.await_counterpart(t, uid) {
        return Some(wait);
    }

    let recv = cx.pod(MoverRole::Receiver, uid).cloned();
    let send = if destination_half {
        cx.remote_sender()
    } else {
        cx.pod(MoverRole::Sender, uid).cloned()
    };
    // With `onUnreadable: Skip`, a sender that left out only what it may not read (exit 1 with
    // unreadable entries named) finished its job.
    let skipped_only = |s: &PodView| {
        spec.on_unreadable == OnUnreadable::Skip
            && s.phase == PodPhase::Failed
            && s.exit_code == Some(i32::from(ferry_mover::kind::EXIT_FAILED_ENTRIES))
            && cx
                .obs
                .sender_progress
                .as_ref()
                .is_some_and(|u| u.unreadable_count > 0)
    };
    let send = send.map(|mut s| {
        if skipped_only(&s) {
            s.phase = PodPhase::Succeeded;
        }
        s
    });
    let recv_name = names::pod_name(uid, cx.st.run, cx.st.attempts, MoverRole::Receiver);
    let send_name = names::pod_name(uid, cx.st.run, cx.st.attempts, MoverRole::Sender);
    fold_progress(&mut cx.st, cx.obs);

    if let Some(Failure {
        message,
        permanent,
        settled,
        store_fault,
    }) = attempt_failure(cx, recv.as_ref(), send.as_ref(), &recv_name, &send_name)
    {
        if !settled {
            // The other mover's exit (a pod change) wakes the reconcile; this is the fallback.
            cx.cond(
                ConditionType::Ready,
                false,
                Reason::MoverFailed,
                &format!("attempt {} failing: {message}", cx.st.attempts),
            );
            return Some(OTHER_VERDICT_GRACE);
        }
        cx.st.throughput = None;
        cx.st.eta = None;
        let failures = cx.st.failures + 1;
        cx.st.failures = failures;
        cx.delete_children(uid, false);
        if let Some(kind) = permanent {
            let reason = match kind {
                ErrorKind::Source => Reason::SourceUnreadable,
                ErrorKind::Destination => Reason::DestinationUnwritable,
                // A refused identity, an incompatible mover: neither side's data is at fault.
                _ => Reason::MoverFailed,
            };
            cx.finish(
                Phase::Failed,
                reason,
                &format!(
                    "attempt {} failed ({kind}), which a retry cannot fix: {message}",
                    cx.st.attempts
                ),
            );
            return None;
        }
        if failures > spec.backoff_limit {
            cx.finish(
                Phase::Failed,
                Reason::BackoffLimitExceeded,
                &format!(
                    "attempt {} failed and backoffLimit ({}) is used up: {message}",
                    cx.st.attempts, spec.backoff_limit
                ),
            );
            return None;
        }
        if store_fault {
            cx.cond(
                ConditionType::Dedup,
                false,
                Reason::BlockStoreFailed,
                &format!(
                    "attempt {} failed in the node's block store; the rest of this run goes on without it: {message}",
                    cx.st.attempts
                ),
            );
        }
        let wait = backoff(failures);
        cx.st.phase = Phase::Retrying;
        cx.st.retry_after = Some(Time(add(now, wait)));
        cx.st.last_error = Some(LastError {
            reason: Reason::MoverFailed.as_str().to_owned(),
            message: message.clone(),
        });
        cx.cond(
            ConditionType::Ready,
            false,
            Reason::Retrying,
            &format!(
                "attempt {} failed ({message}); attempt {} starts in {} s and resumes",
                cx.st.attempts,
                cx.st.attempts + 1,
                wait.as_secs()
            ),
        );
        return Some(wait);
    }

    // A mover pod that cannot start says why (the scheduler, the kubelet, the image pull): the
    // Transfer is not running, and its status carries the cluster's own words.
    if let Some((pod, stuck)) = [&recv, &send]
        .into_iter()
        .flatten()
        .filter(|p| p.phase == PodPhase::Pending && !p.deleting)
        .find_map(|p| p.stuck.as_ref().map(|s| (p.name.clone(), s.clone())))
    {
        let message = format!(
            "attempt {}: mover pod {pod} cannot start: {}: {}",
            cx.st.attempts, stuck.cause, stuck.message
        );
        let already =
            cx.st.conditions.iter().any(|c| {
                c.type_ == ConditionType::Ready.as_str() && c.reason == stuck.reason.as_str()
            });
        if !already {
            cx.notes.push(Note {
                warning: true,
                reason: stuck.reason.as_str(),
                message: message.clone(),
            });
        }
        cx.st.phase = Phase::Pending;
        cx.cond(ConditionType::Ready, false, stuck.reason, &message);
        cx.st.last_error = Some(LastError {
            reason: stuck.reason.as_str().to_owned(),
            message,
        });
        return Some(RESYNC_BLOCKED);
    }

    if let (Some(r), Some(s)) = (&recv, &send)
        && r.phase == PodPhase::Succeeded
        && s.phase == PodPhase::Succeeded
    {
        let digest = |u: &Option<ProgressUpdate>| {
            u.as_ref()
                .map(|u| u.digest.clone())
                .filter(|d| !d.is_empty())
        };
        match (
            digest(&cx.obs.receiver_progress),
            digest(&cx.obs.sender_progress),
        ) {
            (Some(r), Some(s)) if r != s => {
                cx.finish(
                    Phase::Failed,
                    Reason::DigestMismatch,
                    &format!(
                        "the receiver's digest {r} of what it wrote differs from the sender's {s} of the source"
                    ),
                );
                return None;
            }
            (Some(r), Some(_)) => cx.st.digest = Some(r),
            // A mover whose final update was not read (the operator was down meanwhile):
            // nothing to compare, so no digest is claimed.
            _ => cx.st.digest = None,
        }
        if let Some(p) = &mut cx.st.progress {
            p.percent = 100;
            p.display = "100%".into();
            p.totals_final = true;
        }
        let mut message = match &cx.st.progress {
            Some(p) => format!("{} files, {} bytes transferred", p.files_done, p.bytes_done),
            None => "transfer complete".to_owned(),
        };
        if let Some(u) = &cx.st.unreadable {
            message.push_str(&format!(
                "; {} source entries could not be read and were left out (status.unreadable)",
                u.count
            ));
            cx.notes.push(Note {
                warning: true,
                reason: "EntriesSkipped",
                message: format!(
                    "{} unreadable source entries left out, first: {}",
                    u.count,
                    u.paths.first().map(String::as_str).unwrap_or("?")
                ),
            });
        }
        cx.finish(Phase::Succeeded, Reason::Completed, &message);
        let secret = names::secret_name(uid, cx.st.run, cx.st.attempts);
        if cx.obs.secrets.contains(&secret) {
            cx.actions.push(Action::DeleteSecret(secret));
        }
        return None;
    }

    if recv.is_none() && send.is_none() && !cx.obs.may_start {
        let queue = cx.obs.queue;
        let limit = queue.map_or(crate::limits::Limit::Cluster, |q| q.limit);
        cx.st.phase = Phase::Pending;
        cx.st.queue = queue.map(|q| QueueStatus {
            position: u32::try_from(q.place).unwrap_or(u32::MAX),
            waiting: u32::try_from(q.waiting).unwrap_or(u32::MAX),
        });
        cx.cond(
            ConditionType::Ready,
            false,
            Reason::Pending,
            &format!("{} {}", crate::limits::QUEUED, limit.describe()),
        );
        return Some(RESYNC_BLOCKED);
    }

    if cx.st.start_time.is_none() {
        cx.st.start_time = Some(cx.now.clone());
    }
    if !(spec.dedup && cx.obs.host_path_forbidden) {
        // The block store is usable again (or not wanted): no condition about it, unless it
        // failed earlier in this run.
        cx.st.conditions.retain(|c| {
            c.type_ != ConditionType::Dedup.as_str()
                || c.reason == Reason::BlockStoreFailed.as_str()
        });
    } else {
        cx.cond(
            ConditionType::Dedup,
            false,
            Reason::PodSecurityForbidsHostPath,
            "running without the node's block store: the namespace's Pod Security level forbids the hostPath volume it lives on",
        );
    }
    let (run, attempt) = (cx.st.run, cx.st.attempts);
    if !cx
        .obs
        .secrets
        .contains(&names::secret_name(uid, run, attempt))
    {
        cx.actions.push(Action::CreateSecret { run, attempt });
    }
    if destination_half {
        cx.publish_receiver(uid, recv.as_ref());
    }
    match &recv {
        None => {
            cx.actions.push(Action::CreateReceiver { run, attempt });
            cx.st.phase = Phase::Pending;
            cx.cond(
                ConditionType::Ready,
                false,
                Reason::Pending,
                &format!("attempt {attempt}: starting the movers"),
            );
        }
        Some(r) => {
            cx.st.receiver = Some(MoverRef {
                pod: r.name.clone(),
                node: r.node.clone(),
            });
            match (&send, r.ready, &r.ip) {
                (None, true, Some(_)) if destination_half => {
                    let peer = cx.peer_cluster();
                    cx.st.phase = Phase::Pending;
                    cx.cond(
                        ConditionType::Ready,
                        false,
                        Reason::Pending,
                        &format!(
                            "attempt {attempt}: the receiver is ready; waiting for the sender in cluster {peer}"
                        ),
                    );
                }
                (None, true, Some(ip)) => {
                    cx.actions.push(Action::CreateSender {
                        run,
                        attempt,
                        receiver_ip: ip.clone(),
                    });
                    cx.st.phase = Phase::Pending;
                    cx.cond(
                        ConditionType::Ready,
                        false,
                        Reason::Pending,
                        &format!("attempt {attempt}: the receiver is ready; starting the sender"),
                    );
                }
                (None, _, _) => {
                    cx.st.phase = Phase::Pending;
                    cx.cond(
                        ConditionType::Ready,
                        false,
                        Reason::Pending,
                        &format!("attempt {attempt}: starting the movers"),
                    );
                }
                (Some(s), _, _) => {
                    cx.st.sender = Some(MoverRef {
                        pod: s.name.clone(),
                        node: s.node.clone(),
                    });
                    // Running (and Ready) only once data moves: a sender that cannot open its
                    // source, or a pod that never starts, is never reported as running.
                    if moving_data(cx.obs) {
                        cx.st.phase = Phase::Running;
                        cx.cond(
                            ConditionType::Ready,
                            true,
                            Reason::Running,
                            &format!("attempt {attempt}: moving data"),
                        );
                    } else {
                        cx.st.phase = Phase::Pending;
                        cx.cond(
                            ConditionType::Ready,
                            false,
                            Reason::Pending,
                            &format!(
                                "attempt {attempt}: the receiver is ready; the sender is starting and connecting"
                            ),
                        );
                    }
                }
            }
        }
    }
    Some(RESYNC_RUNNING)
}

/// Why the current attempt failed, if it did: a mover exited non-zero, or a mover this attempt
/// had is gone (its pod was deleted or its node lost it).
/// A failed attempt: what happened, and where the fault lies when a mover said so.
struct Failure {
    message: String,
    /// Where the fault lies, when a mover reported one that a retry cannot fix.
    permanent: Option<ErrorKind>,
    /// False while the other mover may still report a verdict of its own: decide later.
    settled: bool,
    /// A mover reported a fault of the node's block store (a cache: the next attempt goes on
    /// without it).
    store_fault: bool,
}

/// The error kind a failed mover reported and whether a retry can help: its exit status (which
/// survives in the pod status; 1 and a signal's 137 name none), or without one its final
/// progress update.
fn reported_kind(p: &PodView, progress: &Option<ProgressUpdate>) -> Option<(ErrorKind, bool)> {
    match p.exit_code {
        Some(code) => ferry_mover::kind::from_exit_status(code),
        None => progress
            .as_ref()
            .filter(|u| u.error_kind != 0)
            .map(|u| (ErrorKind::from_pb(u.error_kind), u.permanent)),
    }
}

/// A fault a retry cannot fix, as the mover judged it (permission denied, a missing source, a
/// full disk, a symlink on the sub path, a refused identity): the Transfer fails at once; fixing
/// the cause and changing `spec.trigger` runs it again, resuming. The kind alone does not decide:
/// digests that differ (destination) or a file changed during the copy (source) are retried.
fn is_permanent(reported: Option<(ErrorKind, bool)>) -> Option<ErrorKind> {
    reported.and_then(|(kind, permanent)| permanent.then_some(kind))
}

fn attempt_failure(
    cx: &Ctx<'_>,
    recv: Option<&PodView>,
    send: Option<&PodView>,
    recv_name: &str,
    send_name: &str,
) -> Option<Failure> {
    let had = |r: &Option<MoverRef>, name: &str| r.as_ref().is_some_and(|m| m.pod == name);
    let text = |p: &PodView, role: &str, progress: &Option<ProgressUpdate>| {
        let from_progress = progress
            .as_ref()
            .map(|u| u.last_error.trim().to_owned())
            .filter(|e| !e.is_empty());
        let detail = from_progress
            .or_else(|| p.message.as_ref().map(|m| last_lines(m, 3)))
            .unwrap_or_else(|| "no message".into());
        format!("{role} {} failed: {detail}", p.name)
    };
    // Both sides usually fail together; the text of each helps (one names the cause, the
    // other what it saw of it).
    let failed: Vec<(String, Option<ErrorKind>)> = [
        recv.filter(|p| p.phase == PodPhase::Failed).map(|p| {
            let progress = &cx.obs.receiver_progress;
            (
                text(p, "receiver", progress),
                is_permanent(reported_kind(p, progress)),
            )
        }),
        send.filter(|p| p.phase == PodPhase::Failed).map(|p| {
            let progress = &cx.obs.sender_progress;
            (
                text(p, "sender", progress),
                is_permanent(reported_kind(p, progress)),
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    let store_fault = [
        recv.map(|p| (p, &cx.obs.receiver_progress)),
        send.map(|p| (p, &cx.obs.sender_progress)),
    ]
    .into_iter()
    .flatten()
    .filter(|(p, _)| p.phase == PodPhase::Failed)
    .any(|(p, progress)| {
        reported_kind(p, progress).is_some_and(|(kind, _)| kind == ErrorKind::Store)
    });
    if !failed.is_empty() {
        // A permanent fault on either side decides.
        let permanent = failed.iter().find_map(|(_, k)| *k);
        // Each mover judges only its own faults (a receiver reports what its sender told it as a
        // retryable peer fault): while the other one is still finishing, wait a moment for its
        // own verdict, which may be that no retry can help.
        let message = failed
            .into_iter()
            .map(|(m, _)| m)
            .collect::<Vec<_>>()
            .join("; ");
        if permanent.is_none() && awaits_other_verdict(cx.obs.now, recv, send) {
            return Some(Failure {
                message,
                permanent: None,
                settled: false,
                store_fault,
            });
        }
        return Some(Failure {
            message,
            permanent,
            settled: true,
            store_fault,
        });
    }
    // A pod that never starts fails its attempt after the pending timeout: retried with
    // backoff (an image may be pushed, a node may free up), and no slot is held meanwhile.
    let timeout = cx.obs.pending_timeout;
    if let Some(p) = [recv, send].into_iter().flatten().find(|p| {
        p.phase == PodPhase::Pending
            && !p.deleting
            && p.created.is_some_and(|at| until(at, cx.obs.now) >= timeout)
    }) {
        let why = p
            .stuck
            .as_ref()
            .map(|s| format!("{}: {}", s.cause, s.message))
            .unwrap_or_else(|| "still Pending".into());
        return Some(Failure {
            message: format!(
                "mover pod {} did not start within {} s ({why})",
                p.name,
                timeout.as_secs()
            ),
            permanent: None,
            settled: true,
            store_fault: false,
        });
    }
    let lost = |what: &str, name: &str| Failure {
        message: format!("{what} pod {name} disappeared"),
        permanent: None,
        settled: true,
        store_fault: false,
    };
    if recv.is_none_or(|p| p.deleting) && had(&cx.st.receiver, recv_name) {
        return Some(lost("receiver", recv_name));
    }
    if send.is_none_or(|p| p.deleting) && had(&cx.st.sender, send_name) {
        return Some(lost("sender", send_name));
    }
    None
}

/// Whether the current attempt's movers report that data moves (connected, past the handshake).
fn moving_data(obs: &Observed) -> bool {
    let moving = |u: &Option<ProgressUpdate>| {
        u.as_ref().is_some_and(|u| {
            matches!(
                MoverPhase::try_from(u.phase),
                Ok(MoverPhase::Transferring | MoverPhase::Finishing | MoverPhase::Succeeded)
            )
        })
    };
    moving(&obs.sender_progress) || moving(&obs.receiver_progress)
}

/// How long a failed attempt waits for the other mover to exit with its own verdict.
pub const OTHER_VERDICT_GRACE: Duration = Duration::from_secs(10);

/// Whether one mover failed recently and the other still runs (its exit may say more).
fn awaits_other_verdict(now: Timestamp, recv: Option<&PodView>, send: Option<&PodView>) -> bool {
    let recent = |p: &PodView| {
        p.phase == PodPhase::Failed
            && p.finished_at
                .is_some_and(|at| until(at, now) < OTHER_VERDICT_GRACE)
    };
    let running = |p: Option<&PodView>| {
        p.is_some_and(|p| matches!(p.phase, PodPhase::Pending | PodPhase::Running) && !p.deleting)
    };
    match (recv, send) {
        (Some(r), s) if recent(r) && running(s) => true,
        (r, Some(s)) if recent(s) && running(r) => true,
        _ => false,
    }
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The status of a Transfer whose change the API server refused (`message` names the object
/// and the API server's reason).
pub fn set_refused(st: &mut TransferStatus, message: &str, generation: Option<i64>) {
    let now = Time(Timestamp::now());
    set_condition(
        &mut st.conditions,
        ConditionType::Ready,
        false,
        Reason::MoverRejected,
        message,
        generation,
        &now,
    );
    st.last_error = Some(LastError {
        reason: Reason::MoverRejected.as_str().to_owned(),
        message: message.to_owned(),
    });
}

/// Folds the movers' latest updates into status. The receiver's figures (what was written) are
/// the truth; the totals come from the sender, which walks the source. Missing updates keep the
/// previous figures, so a finished Transfer keeps its totals.
pub fn fold_progress(st: &mut TransferStatus, obs: &Observed) {
    let (recv, send) = (obs.receiver_progress.as_ref(), obs.sender_progress.as_ref());
    if let Some(u) = send.filter(|u| u.unreadable_count > 0) {
        st.unreadable = Some(UnreadableStatus {
            count: u.unreadable_count,
            paths: u.unreadable_paths.iter().take(100).cloned().collect(),
        });
    }
    if recv.is_none() && send.is_none() {
        return;
    }
    let done = recv.or(send);
    let mut p = st.progress.clone().unwrap_or_default();
    if let Some(d) = done {
        p.bytes_done = d.bytes_done;
        p.files_done = d.files_done;
        p.files_skipped = d.skipped;
    }
    if let Some(s) = send {
        p.bytes_total = s.bytes_total.max(p.bytes_total);
        p.files_total = s.files_total.max(p.files_total);
        p.totals_final = s.totals_final;
    }
    p.bytes_total = p.bytes_total.max(p.bytes_done);
    p.files_total = p.files_total.max(p.files_done + p.files_skipped);
    p.percent = percent(&p);
    p.display = format!("{}%", p.percent);
    st.progress = Some(p.clone());

    if let Some(d) = done {
        let running = MoverPhase::try_from(d.phase).is_ok_and(|ph| {
            matches!(
                ph,
                MoverPhase::Transferring | MoverPhase::Finishing | MoverPhase::Connecting
            )
        });
        let avg = d.throughput_average.max(0.0) as u64;
        let cur = if running {
            d.throughput_current.max(0.0) as u64
        } else {
            0
        };
        st.throughput = Some(ThroughputStatus {
            current_bytes_per_second: cur,
            average_bytes_per_second: avg,
            display: human_rate(if running { cur } else { avg }),
        });
        st.eta = (running && p.totals_final && avg > 0)
            .then(|| human_duration(p.bytes_total.saturating_sub(p.bytes_done) / avg));
    }
    if let Some(r) = recv {
        let ratio = if r.wire_bytes > 0 {
            format!("{:.2}", r.bytes_done as f64 / r.wire_bytes as f64)
        } else {
            "0".into()
        };
        st.wire = Some(WireStatus {
            bytes: r.wire_bytes,
            compression_ratio: ratio,
            dedup_blocks: r.dedup_blocks,
            dedup_bytes: r.dedup_bytes,
            resumed_bytes: r.resumed_bytes,
        });
    }
}

fn percent(p: &ProgressStatus) -> u32 {
    let pct = (p.bytes_done.saturating_mul(100))
        .checked_div(p.bytes_total)
        .or_else(|| {
            (p.files_done + p.files_skipped)
                .saturating_mul(100)
                .checked_div(p.files_total)
        })
        .unwrap_or(0);
    // 100 % only once the totals are final and everything is in.
    let complete = p.totals_final && p.bytes_done >= p.bytes_total;
    (pct.min(if complete { 100 } else { 99 })) as u32
}

/// "48.0 MiB/s".
pub fn human_rate(bytes_per_second: u64) -> String {
    let v = bytes_per_second as f64;
    let units = [
        ("GiB/s", 1u64 << 30),
        ("MiB/s", 1 << 20),
        ("KiB/s", 1 << 10),
    ];
    for (unit, size) in units {
        if bytes_per_second >= size {
            return format!("{:.1} {unit}", v / size as f64);
        }
    }
    format!("{bytes_per_second} B/s")
}

/// "1h2m3s", "4m5s", "6s".
pub fn human_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{Endpoint, HostPathEndpoint, TransferSpec};
    use crate::placement::VolumeRef;
    use kube::api::ObjectMeta;

    pub(crate) fn transfer() -> Transfer {
        let host = |node: &str, path: &str| Endpoint {
            host_path: Some(HostPathEndpoint {
                node: node.into(),
                path: path.into(),
            }),
            ..Endpoint::default()
        };
        let spec: TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/src"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
        }))
        .expect("spec");
        assert_eq!(spec.source, host("a", "/data/src"));
        let mut t = Transfer::new("t", spec);
        t.metadata = ObjectMeta {
            name: Some("t".into()),
            namespace: Some("ml".into()),
            uid: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
            generation: Some(1),
            ..ObjectMeta::default()
        };
        t
    }

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn placed() -> (SidePlacement, SidePlacement) {
        let side = |node: &str, path: &str| SidePlacement {
            volume: VolumeRef::HostPath { path: path.into() },
            sub_path: String::new(),
            node: Some(node.into()),
        };
        (side("a", "/data/src"), side("b", "/data/dst"))
    }

    fn obs(secs: i64) -> Observed {
        Observed {
            now: Timestamp::from_second(1_800_000_000 + secs).expect("time"),
            placement: Ok(placed()),
            pods: Vec::new(),
            secrets: Vec::new(),
            receiver_progress: None,
            sender_progress: None,
            may_start: true,
            queue: None,
            // The operator has been acting for an hour.
            acting_since: Timestamp::from_second(1_800_000_000 - 3600).expect("time"),
            peer_silence_grace: Duration::from_secs(60),
            pending_timeout: Duration::from_secs(300),
            host_path_forbidden: false,
            root_movers_allowed: false,
            privileged_readers_allowed: false,
            priority_class_refused: None,
            remote: None,
        }
    }

    fn pod(run: u32, attempt: u32, role: MoverRole, phase: PodPhase, ready: bool) -> PodView {
        PodView {
            name: names::pod_name(UID, run, attempt, role),
            phase,
            ready,
            ip: Some("127.2.0.5".into()),
            node: Some("b".into()),
            message: None,
            exit_code: None,
            finished_at: None,
            created: None,
            stuck: None,
            deleting: false,
        }
    }

    /// Applies a plan's status to the Transfer, as the status patch would.
    fn advance(t: &mut Transfer, o: &Observed) -> Plan {
        let p = plan(t, o);
        t.status = Some(p.status.clone());
        p
    }

    fn cond<'a>(
        p: &'a Plan,
        kind: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        p.status
            .conditions
            .iter()
            .find(|c| c.type_ == kind)
            .expect("condition")
    }

    #[test]
    fn a_new_transfer_gets_a_secret_and_a_receiver_first() {
        let mut t = transfer();
        let p = advance(&mut t, &obs(0));
        assert_eq!(p.status.run, 1);
        assert_eq!(p.status.attempts, 1);
        assert_eq!(
            p.actions,
            vec![
                Action::CreateSecret { run: 1, attempt: 1 },
                Action::CreateReceiver { run: 1, attempt: 1 }
            ]
        );
        assert_eq!(p.status.phase, Phase::Pending);
        assert_eq!(cond(&p, "Succeeded").status, "False");
    }

    #[test]
    fn the_sender_starts_only_when_the_receiver_is_ready_and_gets_its_ip() {
        let mut t = transfer();
        advance(&mut t, &obs(0));
        let mut o = obs(1);
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, false)];
        let p = advance(&mut t, &o);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        let p = advance(&mut t, &o);
        assert_eq!(
            p.actions,
            vec![Action::CreateSender {
                run: 1,
                attempt: 1,
                receiver_ip: "127.2.0.5".into()
            }]
        );
        // Created is not running: Ready only once the movers report that data moves.
        assert_eq!(p.status.phase, Phase::Pending);
        assert_eq!(cond(&p, "Ready").status, "False");
        o.pods
            .push(pod(1, 1, MoverRole::Sender, PodPhase::Running, false));
        let p = advance(&mut t, &o);
        assert_eq!(
            p.status.phase,
            Phase::Pending,
            "a running pod is not yet moving data"
        );
        o.sender_progress = Some(ProgressUpdate {
            phase: MoverPhase::Connecting as i32,
            ..ProgressUpdate::default()
        });
        assert_eq!(advance(&mut t, &o).status.phase, Phase::Pending);
        o.sender_progress = Some(ProgressUpdate {
            phase: MoverPhase::Transferring as i32,
            ..ProgressUpdate::default()
        });
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Running);
        assert_eq!(cond(&p, "Ready").status, "True");
    }

    #[test]
    fn both_movers_done_is_success_and_reapplying_is_a_no_op() {
        let mut t = transfer();
        advance(&mut t, &obs(0));
        let mut o = obs(5);
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![
            pod(1, 1, MoverRole::Receiver, PodPhase::Succeeded, false),
            pod(1, 1, MoverRole::Sender, PodPhase::Succeeded, false),
        ];
        o.receiver_progress = Some(ProgressUpdate {
            phase: MoverPhase::Succeeded as i32,
            files_done: 3,
            bytes_done: 300,
            wire_bytes: 150,
            throughput_average: 100.0,
            ..ProgressUpdate::default()
        });
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Succeeded);
        assert_eq!(cond(&p, "Succeeded").status, "True");
        assert_eq!(p.status.progress.as_ref().map(|p| p.percent), Some(100));
        assert_eq!(
            p.status.wire.as_ref().map(|w| w.compression_ratio.as_str()),
            Some("2.00")
        );
        assert!(
            p.actions
                .contains(&Action::DeleteSecret(names::secret_name(UID, 1, 1)))
        );
        assert!(p.notes.iter().any(|n| n.reason == "Succeeded"));
        // A later reconcile (operator restart, re-sync) changes nothing.
        let mut o2 = obs(500);
        o2.pods = o.pods.clone();
        let again = plan(&t, &o2);
        assert_eq!(again.status, p.status);
        assert!(again.actions.is_empty(), "{:?}", again.actions);
    }

    #[test]
    fn success_carries_the_agreed_digest_and_a_disagreement_fails() {
        let finished = |recv_digest: &str, send_digest: &str| {
            let mut t = transfer();
            advance(&mut t, &obs(0));
            let mut o = obs(5);
            o.pods = vec![
                pod(1, 1, MoverRole::Receiver, PodPhase::Succeeded, false),
                pod(1, 1, MoverRole::Sender, PodPhase::Succeeded, false),
            ];
            let update = |d: &str| ProgressUpdate {
                phase: MoverPhase::Succeeded as i32,
                digest: d.into(),
                ..ProgressUpdate::default()
            };
            o.receiver_progress = Some(update(recv_digest));
            o.sender_progress = Some(update(send_digest));
            plan(&t, &o)
        };
        let ok = finished("ab12", "ab12");
        assert_eq!(ok.status.phase, Phase::Succeeded);
        assert_eq!(ok.status.digest.as_deref(), Some("ab12"));
        let bad = finished("ab12", "cd34");
        assert_eq!(bad.status.phase, Phase::Failed);
        assert_eq!(cond(&bad, "Failed").reason, "DigestMismatch");
        let unknown = finished("ab12", "");
        assert_eq!(unknown.status.phase, Phase::Succeeded);
        assert_eq!(unknown.status.digest, None);
    }

    #[test]
    fn a_changed_trigger_starts_a_new_run() {
        let mut t = transfer();
        advance(&mut t, &obs(0));
        let mut o = obs(5);
        o.pods = vec![
            pod(1, 1, MoverRole::Receiver, PodPhase::Succeeded, false),
            pod(1, 1, MoverRole::Sender, PodPhase::Succeeded, false),
        ];
        advance(&mut t, &o);
        t.spec.trigger = Some("v2".into());
        let p = advance(&mut t, &o);
        assert_eq!(p.status.run, 2);
        assert_eq!(p.status.phase, Phase::Pending);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 2, attempt: 1 })
        );
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Sender
        ))));
    }

    #[test]
    fn a_failed_mover_retries_with_backoff_then_fails_past_the_limit() {
        let mut t = transfer();
        t.spec.backoff_limit = 1;
        advance(&mut t, &obs(0));
        let mut o = obs(1);
        o.pods = vec![
            pod(1, 1, MoverRole::Receiver, PodPhase::Running, true),
            pod(1, 1, MoverRole::Sender, PodPhase::Failed, false),
        ];
        o.pods[1].message = Some("error: connection reset".into());
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Retrying);
        assert_eq!(p.requeue, Some(BACKOFF_BASE));
        assert!(
            p.status
                .last_error
                .as_ref()
                .is_some_and(|e| e.message.contains("connection reset"))
        );
        assert_eq!(p.actions.len(), 2, "both movers go: {:?}", p.actions);
        // Before the backoff ran out nothing happens.
        let p = advance(&mut t, &obs(2));
        assert_eq!(p.status.phase, Phase::Retrying);
        assert!(p.actions.is_empty());
        // After it, attempt 2 starts with new names.
        let p = advance(&mut t, &obs(4));
        assert_eq!(p.status.attempts, 2);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 2 })
        );
        // Attempt 2 loses its receiver pod: past the limit.
        let mut o = obs(5);
        o.pods = vec![pod(1, 2, MoverRole::Receiver, PodPhase::Running, true)];
        advance(&mut t, &o);
        let p = advance(&mut t, &obs(6));
        assert_eq!(p.status.phase, Phase::Failed);
        assert_eq!(cond(&p, "Failed").reason, "BackoffLimitExceeded");
        assert!(cond(&p, "Failed").message.contains("disappeared"));
    }

    #[test]
    fn a_retryable_failure_waits_briefly_for_the_other_movers_own_verdict() {
        // The receiver exits first, reporting its sender's fault as a retryable peer fault; the
        // sender's own exit a moment later says no retry can help.
        let mut t = transfer();
        advance(&mut t, &obs(0));
        let at = |secs: i64| {
            let mut o = obs(secs);
            o.pods = vec![
                pod(1, 1, MoverRole::Receiver, PodPhase::Failed, false),
                pod(1, 1, MoverRole::Sender, PodPhase::Running, false),
            ];
            o.pods[0].exit_code = Some(10);
            o.pods[0].finished_at = Some(obs(1).now);
            o
        };
        let waiting = plan(&t, &at(3));
        assert_ne!(waiting.status.phase, Phase::Retrying);
        assert_eq!(cond(&waiting, "Ready").status, "False");
        assert_eq!(cond(&waiting, "Ready").reason, "MoverFailed");
        assert!(waiting.actions.is_empty(), "{:?}", waiting.actions);
        let mut o = at(4);
        o.pods[1].phase = PodPhase::Failed;
        o.pods[1].exit_code = Some(21);
        let failed = plan(&t, &o);
        assert_eq!(failed.status.phase, Phase::Failed);
        assert_eq!(cond(&failed, "Failed").reason, "SourceUnreadable");
        // A sender that does not finish within the grace is not waited for.
        let later = plan(&t, &at(1 + OTHER_VERDICT_GRACE.as_secs() as i64 + 1));
        assert_eq!(later.status.phase, Phase::Retrying);
    }

    #[test]
    fn a_mover_that_cannot_start_is_named_and_times_out_into_a_retry() {
        let mut t = transfer();
        advance(&mut t, &obs(0));
        let mut o = obs(10);
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        let mut recv = pod(1, 1, MoverRole::Receiver, PodPhase::Pending, false);
        recv.created = Some(obs(1).now);
        recv.stuck = Some(Stuck {
            reason: Reason::MoverImagePullFailed,
            cause: "ImagePullBackOff".into(),
            message: "Back-off pulling image \"r/ferry-mover:x\"".into(),
        });
        o.pods = vec![recv];
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Pending);
        let ready = cond(&p, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "MoverImagePullFailed")
        );
        assert!(ready.message.contains("-recv") && ready.message.contains("ImagePullBackOff"));
        assert!(
            p.notes
                .iter()
                .any(|n| n.warning && n.reason == "MoverImagePullFailed")
        );
        // Said once, not at every reconcile.
        let again = advance(&mut t, &o);
        assert!(again.notes.is_empty(), "{:?}", again.notes);
        // Past the pending timeout the attempt fails and is retried.
        let mut late = o.clone();
        late.now = obs(1 + o.pending_timeout.as_secs() as i64).now;
        let p = advance(&mut t, &late);
        assert_eq!(p.status.phase, Phase::Retrying);
        assert!(
            cond(&p, "Ready")
                .message
                .contains("did not start within 300 s")
        );
    }

    #[test]
    fn unreadable_entries_skipped_on_request_end_in_success_and_are_listed() {
        let finished = |skip: bool| {
            let mut t = transfer();
            if skip {
                t.spec.on_unreadable = OnUnreadable::Skip;
            }
            advance(&mut t, &obs(0));
            let mut o = obs(5);
            o.secrets = vec![names::secret_name(UID, 1, 1)];
            o.pods = vec![
                pod(1, 1, MoverRole::Receiver, PodPhase::Succeeded, false),
                pod(1, 1, MoverRole::Sender, PodPhase::Failed, false),
            ];
            o.pods[1].exit_code = Some(1);
            o.sender_progress = Some(ProgressUpdate {
                phase: MoverPhase::Succeeded as i32,
                unreadable_count: 2,
                unreadable_paths: vec!["private/a".into(), "private/b".into()],
                ..ProgressUpdate::default()
            });
            plan(&t, &o)
        };
        let p = finished(true);
        assert_eq!(p.status.phase, Phase::Succeeded);
        let u = p.status.unreadable.clone().expect("listed");
        assert_eq!((u.count, u.paths.len()), (2, 2));
        assert!(
            cond(&p, "Succeeded")
                .message
                .contains("2 source entries could not be read")
        );
        assert!(
            p.notes
                .iter()
                .any(|n| n.warning && n.reason == "EntriesSkipped")
        );
        // Without Skip the same exit is a failed attempt.
        assert_eq!(finished(false).status.phase, Phase::Retrying);
    }

    #[test]
    fn a_block_store_fault_is_retried_without_the_store() {
        let mut t = transfer();
        let p = advance(&mut t, &obs(0));
        assert!(p.dedup);
        let mut o = obs(1);
        o.pods = vec![
            pod(1, 1, MoverRole::Receiver, PodPhase::Failed, false),
            pod(1, 1, MoverRole::Sender, PodPhase::Failed, false),
        ];
        o.pods[0].exit_code = Some(16);
        o.pods[1].exit_code = Some(10);
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Retrying);
        let dedup = cond(&p, "Dedup");
        assert_eq!(
            (dedup.status.as_str(), dedup.reason.as_str()),
            ("False", "BlockStoreFailed")
        );
        assert!(!p.dedup, "the next attempt goes on without the store");
        // The next attempt starts its receiver without the store, and the condition stays.
        let p = advance(&mut t, &obs(30));
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 2 }),
            "{:?}",
            p.actions
        );
        assert!(!p.dedup);
        assert_eq!(cond(&p, "Dedup").reason, "BlockStoreFailed");
    }

    #[test]
    fn far_deadlines_are_far_and_a_limit_under_one_byte_is_refused() {
        let mut t = transfer();
        t.spec.active_deadline_seconds = Some(i64::MAX);
        t.spec.ttl_seconds_after_finished = Some(i64::MAX - 1);
        advance(&mut t, &obs(0));
        let mut o = obs(100);
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, false)];
        let p = advance(&mut t, &o);
        assert_ne!(p.status.phase, Phase::Failed, "{:?}", p.status.conditions);
        assert!(p.requeue.is_some_and(|d| d <= MAX_WAIT));
        assert_eq!(add(obs(0).now, Duration::MAX), Timestamp::MAX);
        let with_limit = |q: &str| {
            let mut t = transfer();
            t.spec.bandwidth_limit = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                q.into(),
            ));
            bandwidth_bytes(&t.spec)
        };
        assert_eq!(with_limit("0.6"), Ok(Some(1)));
        for under in ["0", "0.4", "0.0001k"] {
            let e = with_limit(under).unwrap_err();
            assert!(e.contains("under 1 byte per second"), "{under}: {e}");
        }
    }

    #[test]
    fn faults_a_retry_cannot_fix_fail_at_once_others_retry() {
        let failed_with = |code: i32| {
            let mut t = transfer();
            advance(&mut t, &obs(0));
            let mut o = obs(1);
            o.pods = vec![
                pod(1, 1, MoverRole::Receiver, PodPhase::Failed, false),
                pod(1, 1, MoverRole::Sender, PodPhase::Failed, false),
            ];
            o.pods[0].exit_code = Some(code);
            o.pods[1].exit_code = Some(13);
            plan(&t, &o)
        };
        let dest = failed_with(22);
        assert_eq!(dest.status.phase, Phase::Failed);
        assert_eq!(cond(&dest, "Failed").reason, "DestinationUnwritable");
        assert!(
            cond(&dest, "Failed").message.contains("destination"),
            "{:?}",
            dest.status
        );
        let src = failed_with(21);
        assert_eq!(cond(&src, "Failed").reason, "SourceUnreadable");
        // A refused identity is permanent too; it is not a source fault.
        let refused = failed_with(20);
        assert_eq!(refused.status.phase, Phase::Failed);
        assert_eq!(cond(&refused, "Failed").reason, "MoverFailed");
        // The kind alone does not decide: digests that differ (12) and a file changed during the
        // copy (11) may pass on a retry, as may a block store fault (16).
        for retryable in [10, 11, 12, 13, 14, 15, 16, 1, 137] {
            assert_eq!(
                failed_with(retryable).status.phase,
                Phase::Retrying,
                "exit {retryable}"
            );
        }
        // Without an exit status, the final progress update's kind and permanence count.
        let from_progress = |permanent: bool| {
            let mut t = transfer();
            advance(&mut t, &obs(0));
            let mut o = obs(1);
            o.pods = vec![pod(1, 1, MoverRole::Sender, PodPhase::Failed, false)];
            o.sender_progress = Some(ProgressUpdate {
                error_kind: ferry_proto::wire::v1::ErrorKind::Source as i32,
                permanent,
                last_error: "failed to open source".into(),
                ..ProgressUpdate::default()
            });
            plan(&t, &o)
        };
        assert_eq!(
            cond(&from_progress(true), "Failed").reason,
            "SourceUnreadable"
        );
        // Retryable, as from an older mover without the field.
        assert_eq!(from_progress(false).status.phase, Phase::Retrying);
    }

    #[test]
    fn blocked_specs_create_nothing_and_say_why() {
        let mut t = transfer();
        let mut o = obs(0);
        o.placement = Err(Blocked {
            reason: Reason::HostPathNotAllowed,
            message: "not granted".into(),
        });
        let p = advance(&mut t, &o);
        assert!(p.actions.is_empty());
        assert_eq!(cond(&p, "Ready").reason, "HostPathNotAllowed");
        assert_eq!(p.requeue, Some(RESYNC_BLOCKED));
        assert!(
            p.notes
                .iter()
                .any(|n| n.warning && n.reason == "HostPathNotAllowed")
        );
        // Reported once, not on every resync.
        assert!(plan(&t, &o).notes.is_empty());
        // Once the cause is gone the Transfer proceeds by itself.
        let p = advance(&mut t, &obs(20));
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 1 })
        );
        t.spec.exclude = vec!["*.tmp".into(), "cache[".into()];
        let planned = plan(&t, &obs(21));
        let ready = cond(&planned, "Ready");
        assert_eq!(ready.reason, "InvalidSpec");
        assert!(ready.message.contains("unclosed"), "{}", ready.message);
        t.spec.exclude.pop();
        assert_ne!(cond(&plan(&t, &obs(22)), "Ready").reason, "InvalidSpec");
    }

    #[test]
    fn preserved_ownership_waits_for_root_movers_to_be_allowed() {
        let mut t = transfer();
        t.spec.preserve_ownership = true;
        let p = plan(&t, &obs(1));
        let ready = cond(&p, "Ready");
        assert_eq!(ready.reason, "RootMoversNotAllowed");
        assert!(
            ready.message.contains("allowRootMovers"),
            "{}",
            ready.message
        );
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        let mut allowed = obs(2);
        allowed.root_movers_allowed = true;
        let p = plan(&t, &allowed);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 1 }),
            "{:?}",
            p.actions
        );
    }

    #[test]
    fn suspend_stops_movers_and_resume_uses_a_new_attempt() {
        let mut t = transfer();
        advance(&mut t, &obs(0));
        t.spec.suspend = true;
        let mut o = obs(1);
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Suspended);
        assert_eq!(
            p.actions,
            vec![Action::DeletePod(names::pod_name(
                UID,
                1,
                1,
                MoverRole::Receiver
            ))]
        );
        t.spec.suspend = false;
        let p = advance(&mut t, &obs(2));
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 2 })
        );
    }

    #[test]
    fn suspending_a_retrying_transfer_or_blocking_a_running_one_is_no_failure() {
        let mut t = transfer();
        t.spec.backoff_limit = 1;
        advance(&mut t, &obs(0));
        let mut o = obs(1);
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        advance(&mut t, &o);
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Failed, false)];
        let p = advance(&mut t, &o);
        assert_eq!((p.status.phase, p.status.failures), (Phase::Retrying, 1));
        t.spec.suspend = true;
        advance(&mut t, &obs(2));
        t.spec.suspend = false;
        let p = advance(&mut t, &obs(3));
        assert_eq!(p.status.failures, 1, "{:?}", p.status);
        assert_eq!(p.status.attempts, 2);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 2 })
        );
        // Running attempt 2, then the spec becomes unserviceable and later fine again.
        let mut o = obs(4);
        o.pods = vec![pod(1, 2, MoverRole::Receiver, PodPhase::Running, true)];
        advance(&mut t, &o);
        o.placement = Err(Blocked {
            reason: Reason::NodeNotFound,
            message: "gone".into(),
        });
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Pending);
        let p = advance(&mut t, &obs(5));
        assert_ne!(p.status.phase, Phase::Failed, "{:?}", p.status);
        assert_eq!(p.status.failures, 1);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 3 })
        );
    }

    #[test]
    fn pod_security_turns_dedup_off_and_refuses_host_paths() {
        let mut t = transfer();
        let mut o = obs(0);
        o.host_path_forbidden = true;
        let p = plan(&t, &o);
        assert_eq!(cond(&p, "Ready").reason, "PodSecurityForbidsHostPath");
        assert!(p.actions.is_empty());
        t.spec = serde_json::from_value(serde_json::json!({
            "source": {"pvc": {"claimName": "a"}},
            "destination": {"pvc": {"claimName": "b"}},
        }))
        .expect("spec");
        let p = plan(&t, &o);
        assert!(!p.dedup);
        assert_eq!(cond(&p, "Dedup").reason, "PodSecurityForbidsHostPath");
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 1 })
        );
        o.host_path_forbidden = false;
        assert!(plan(&t, &o).dedup);
    }

    #[test]
    fn queued_when_the_limit_is_reached() {
        let mut t = transfer();
        let mut o = obs(0);
        o.may_start = false;
        let p = advance(&mut t, &o);
        assert!(p.actions.is_empty());
        assert!(cond(&p, "Ready").message.contains("queued"));
    }

    #[test]
    fn deadline_and_ttl() {
        let mut t = transfer();
        t.spec.active_deadline_seconds = Some(10);
        t.spec.ttl_seconds_after_finished = Some(60);
        advance(&mut t, &obs(0));
        let p = advance(&mut t, &obs(11));
        assert_eq!(p.status.phase, Phase::Failed);
        assert_eq!(cond(&p, "Failed").reason, "DeadlineExceeded");
        assert_eq!(plan(&t, &obs(30)).requeue, Some(Duration::from_secs(41)));
        assert_eq!(plan(&t, &obs(71)).actions, vec![Action::DeleteTransfer]);
    }

    #[test]
    fn progress_percent_eta_and_quantities() {
        let mut st = TransferStatus::default();
        let mut o = obs(0);
        o.receiver_progress = Some(ProgressUpdate {
            phase: MoverPhase::Transferring as i32,
            bytes_done: 50,
            files_done: 1,
            throughput_current: 10.0,
            throughput_average: 10.0,
            ..ProgressUpdate::default()
        });
        o.sender_progress = Some(ProgressUpdate {
            phase: MoverPhase::Transferring as i32,
            bytes_total: 200,
            files_total: 4,
            totals_final: true,
            ..ProgressUpdate::default()
        });
        fold_progress(&mut st, &o);
        let p = st.progress.as_ref().expect("progress");
        assert_eq!((p.percent, p.display.as_str()), (25, "25%"));
        assert_eq!(st.eta.as_deref(), Some("15s"));
        assert_eq!(parse_quantity("10M"), Some(10_000_000));
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("1.5k"), Some(1500));
        assert_eq!(parse_quantity("12"), Some(12));
        assert_eq!(parse_quantity("1X"), None);
        assert_eq!(human_rate(3 << 20), "3.0 MiB/s");
        assert_eq!(human_duration(3725), "1h2m5s");
    }

    /// The destination half of a cross-cluster Transfer: its source is `ml/t` of Peer west.
    fn destination_half() -> Transfer {
        let mut t = transfer();
        t.spec.source = serde_json::from_value(
            serde_json::json!({"remote": {"peer": "west", "namespace": "ml", "name": "t"}}),
        )
        .expect("remote");
        t
    }

    fn remote_obs(secs: i64) -> Observed {
        let mut o = obs(secs);
        let dst = placed().1;
        o.placement = Ok((
            SidePlacement {
                volume: VolumeRef::Remote,
                sub_path: String::new(),
                node: None,
            },
            dst,
        ));
        o.remote = Some(RemoteObserved {
            peer: Some(Ok("west".into())),
            ..RemoteObserved::default()
        });
        o
    }

    fn called(o: &mut Observed, report: Option<crate::peering::wire::SenderReport>) {
        let now = o.now;
        if let Some(r) = o.remote.as_mut() {
            r.counterpart = Some(Counterpart {
                peer: "west".into(),
                source: crate::peering::wire::HalfRef {
                    namespace: "ml".into(),
                    name: "t".into(),
                },
                report,
                last_call: now,
                withdrawn: false,
            });
        }
    }

    fn report(attempt: u32, state: SenderState) -> crate::peering::wire::SenderReport {
        crate::peering::wire::SenderReport {
            run: 1,
            attempt,
            pod: format!("send-{attempt}"),
            state,
            exit_code: (state == SenderState::Failed).then_some(13),
            message: (state == SenderState::Failed).then(|| "connection reset".into()),
            progress: None,
        }
    }

    #[test]
    fn a_destination_half_waits_for_its_source_then_publishes_its_receiver() {
        let mut t = destination_half();
        // Nobody called: no receiver, a reason naming the counterpart.
        let p = advance(&mut t, &remote_obs(0));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(cond(&p, "Ready").reason, "WaitingForCounterpart");
        assert!(cond(&p, "Ready").message.contains("ml/t in cluster west"));

        // The source half called: receiver, its Service, and its address once ready.
        let mut o = remote_obs(1);
        called(&mut o, None);
        let p = advance(&mut t, &o);
        assert_eq!(
            p.actions,
            vec![
                Action::CreateSecret { run: 1, attempt: 1 },
                Action::ApplyReceiverService { run: 1, attempt: 1 },
                Action::CreateReceiver { run: 1, attempt: 1 },
            ]
        );
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        if let Some(r) = o.remote.as_mut() {
            r.service_exists = true;
            r.receiver_address = Some("10.101.0.12:30001".into());
        }
        let p = advance(&mut t, &o);
        assert!(
            p.actions.is_empty(),
            "never a local sender: {:?}",
            p.actions
        );
        let remote = p.status.remote.clone().expect("remote status");
        assert_eq!(
            remote.receiver_address.as_deref(),
            Some("10.101.0.12:30001")
        );
        assert_eq!(remote.transfer_id, Some(names::transfer_id(UID, 1)));
        let message = &cond(&p, "Ready").message;
        assert!(
            message.contains("waiting for the sender in cluster west"),
            "{message}"
        );
    }

    #[test]
    fn a_destination_half_retries_when_the_remote_sender_fails_and_succeeds_with_it() {
        let mut t = destination_half();
        let mut o = remote_obs(0);
        called(&mut o, None);
        advance(&mut t, &o);
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        called(&mut o, Some(report(1, SenderState::Running)));
        o.sender_progress = Some(ProgressUpdate {
            phase: MoverPhase::Transferring as i32,
            ..ProgressUpdate::default()
        });
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Running);
        assert_eq!(
            p.status.sender.as_ref().map(|s| s.pod.as_str()),
            Some("ml/send-1")
        );
        // The other cluster's sender failed: the attempt fails, its receiver goes.
        called(&mut o, Some(report(1, SenderState::Failed)));
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Retrying);
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Receiver
        ))));
        assert!(cond(&p, "Ready").message.contains("connection reset"));
        // A report of an earlier attempt means nothing for the next one.
        let mut o = remote_obs(10);
        called(&mut o, Some(report(1, SenderState::Failed)));
        let p = advance(&mut t, &o);
        assert_eq!(p.status.attempts, 2);
        assert_eq!(p.status.phase, Phase::Pending);
        // Attempt 2: both ends succeed.
        o.secrets = vec![names::secret_name(UID, 1, 2)];
        o.pods = vec![pod(1, 2, MoverRole::Receiver, PodPhase::Succeeded, false)];
        called(&mut o, Some(report(2, SenderState::Succeeded)));
        let p = advance(&mut t, &o);
        assert_eq!(
            p.status.phase,
            Phase::Succeeded,
            "{:?}",
            p.status.conditions
        );
    }

    #[test]
    fn a_silent_source_half_stops_the_receiver() {
        let mut t = destination_half();
        let mut o = remote_obs(0);
        called(&mut o, None);
        advance(&mut t, &o);
        let mut o = remote_obs(61);
        called(&mut o, None);
        if let Some(c) = o.remote.as_mut().and_then(|r| r.counterpart.as_mut()) {
            c.last_call = obs(0).now;
        }
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        let p = advance(&mut t, &o);
        assert_eq!(cond(&p, "Ready").reason, "WaitingForCounterpart");
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Receiver
        ))));
    }

    /// The source half: `ml/t` here sends to `gpu/t` of Peer east.
    fn source_half() -> Transfer {
        let mut t = transfer();
        t.spec.destination = serde_json::from_value(
            serde_json::json!({"remote": {"peer": "east", "namespace": "gpu", "name": "t"}}),
        )
        .expect("remote");
        t
    }

    fn answer(attempt: u32, phase: Phase, receiver: Option<&str>) -> PairResponse {
        PairResponse {
            transfer_id: "east-uid.1".into(),
            run: 1,
            attempt,
            receiver: receiver.map(Into::into),
            status: TransferStatus {
                phase,
                run: 1,
                attempts: attempt,
                progress: Some(ProgressStatus {
                    bytes_done: 7,
                    ..ProgressStatus::default()
                }),
                ..TransferStatus::default()
            },
        }
    }

    fn source_obs(secs: i64, a: Result<PairResponse, Blocked>) -> Observed {
        let mut o = obs(secs);
        o.remote = Some(RemoteObserved {
            peer: Some(Ok("east".into())),
            answer: Some(a),
            ..RemoteObserved::default()
        });
        o
    }

    #[test]
    fn a_source_half_mirrors_the_destination_and_runs_the_sender_it_asks_for() {
        let mut t = source_half();
        let missing = Blocked {
            reason: Reason::CounterpartMissing,
            message: "cluster east has no Transfer gpu/t".into(),
        };
        let p = advance(&mut t, &source_obs(0, Err(missing)));
        assert!(p.actions.is_empty());
        assert_eq!(cond(&p, "Ready").reason, "CounterpartMissing");
        assert_eq!(p.requeue, Some(POLL_REMOTE));

        // The receiver is not ready yet: nothing to start.
        let p = advance(&mut t, &source_obs(1, Ok(answer(1, Phase::Pending, None))));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        let p = advance(
            &mut t,
            &source_obs(2, Ok(answer(1, Phase::Pending, Some("10.101.0.12:30001")))),
        );
        assert_eq!(
            p.actions,
            vec![
                Action::CreateSecret { run: 1, attempt: 1 },
                Action::CreateRemoteSender {
                    run: 1,
                    attempt: 1,
                    address: "10.101.0.12:30001".into()
                },
            ]
        );
        assert_eq!(p.status.progress.as_ref().map(|p| p.bytes_done), Some(7));
        assert_eq!(
            p.status.remote.as_ref().and_then(|r| r.transfer_id.clone()),
            Some("east-uid.1".into())
        );
        // Attempt 2 over there: attempt 1's sender and Secret go, attempt 2's sender starts.
        let mut o = source_obs(3, Ok(answer(2, Phase::Pending, Some("10.101.0.12:30002"))));
        o.pods = vec![pod(1, 1, MoverRole::Sender, PodPhase::Failed, false)];
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        let p = advance(&mut t, &o);
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Sender
        ))));
        assert!(
            p.actions
                .contains(&Action::DeleteSecret(names::secret_name(UID, 1, 1)))
        );
        assert!(p.actions.contains(&Action::CreateRemoteSender {
            run: 1,
            attempt: 2,
            address: "10.101.0.12:30002".into()
        }));
        // Finished over there: finished here; the destination half vanishing later changes
        // nothing.
        let p = advance(
            &mut t,
            &source_obs(4, Ok(answer(2, Phase::Succeeded, None))),
        );
        assert_eq!(p.status.phase, Phase::Succeeded);
        let gone = Blocked {
            reason: Reason::CounterpartMissing,
            message: "gone".into(),
        };
        let p = advance(&mut t, &source_obs(5, Err(gone)));
        assert_eq!(p.status.phase, Phase::Succeeded);
    }

    #[test]
    fn a_source_half_whose_counterpart_vanishes_mid_run_stops_its_sender() {
        let mut t = source_half();
        advance(
            &mut t,
            &source_obs(0, Ok(answer(1, Phase::Running, Some("10.101.0.12:30001")))),
        );
        let gone = Blocked {
            reason: Reason::CounterpartMissing,
            message: "cluster east has no Transfer gpu/t".into(),
        };
        let mut o = source_obs(1, Err(gone));
        o.pods = vec![pod(1, 1, MoverRole::Sender, PodPhase::Running, true)];
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        let p = advance(&mut t, &o);
        assert_eq!(p.status.phase, Phase::Pending);
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Sender
        ))));
        assert!(
            p.actions
                .contains(&Action::DeleteSecret(names::secret_name(UID, 1, 1)))
        );
    }

    #[test]
    fn a_restarted_destination_operator_keeps_the_receiver_until_the_source_calls_again() {
        let mut t = destination_half();
        let mut o = remote_obs(0);
        called(&mut o, Some(report(1, SenderState::Running)));
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        advance(&mut t, &o);
        let heard = t.status.as_ref().and_then(|s| s.remote.clone());
        assert!(
            heard.and_then(|r| r.last_heard).is_some(),
            "kept in the API"
        );
        // A new operator, acting for 5 s, has not heard the source half (the registry is empty).
        let mut o = remote_obs(40);
        o.acting_since = obs(35).now;
        o.secrets = vec![names::secret_name(UID, 1, 1)];
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        let before = t.status.clone();
        let p = advance(&mut t, &o);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(Some(p.status), before, "the status is left as it was");
        assert_eq!(p.requeue, Some(POLL_REMOTE));
        // A withdrawal (the source half was deleted) stops the receiver at once.
        let mut gone = o.clone();
        called(&mut gone, None);
        if let Some(c) = gone.remote.as_mut().and_then(|r| r.counterpart.as_mut()) {
            c.withdrawn = true;
        }
        let p = advance(&mut t.clone(), &gone);
        assert_eq!(cond(&p, "Ready").reason, "WaitingForCounterpart");
        assert!(p.actions.contains(&Action::DeletePod(names::pod_name(
            UID,
            1,
            1,
            MoverRole::Receiver
        ))));
        // Still unheard a whole grace after its start: the receiver stops.
        let mut o = remote_obs(96);
        o.acting_since = obs(35).now;
        o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
        let p = advance(&mut t, &o);
        assert_eq!(cond(&p, "Ready").reason, "WaitingForCounterpart");
        assert!(!p.actions.is_empty());
    }

    #[test]
    fn last_heard_is_written_coarsely() {
        let mut t = destination_half();
        let mut o = remote_obs(0);
        called(&mut o, None);
        advance(&mut t, &o);
        let first = t
            .status
            .as_ref()
            .and_then(|s| s.remote.clone())
            .and_then(|r| r.last_heard);
        let mut o = remote_obs(5);
        called(&mut o, None);
        advance(&mut t, &o);
        let again = t
            .status
            .as_ref()
            .and_then(|s| s.remote.clone())
            .and_then(|r| r.last_heard);
        assert_eq!(again, first, "5 s later: not written again");
        let mut o = remote_obs(25);
        called(&mut o, None);
        advance(&mut t, &o);
        let later = t
            .status
            .as_ref()
            .and_then(|s| s.remote.clone())
            .and_then(|r| r.last_heard);
        assert_eq!(later.map(|t| t.0), Some(obs(25).now));
    }

    #[test]
    fn a_passing_peering_error_keeps_the_sender_an_explicit_refusal_or_a_long_silence_does_not() {
        let sender = names::pod_name(UID, 1, 1, MoverRole::Sender);
        let running = |secs, answer| {
            let mut o = source_obs(secs, answer);
            o.pods = vec![pod(1, 1, MoverRole::Sender, PodPhase::Running, true)];
            o.secrets = vec![names::secret_name(UID, 1, 1)];
            o
        };
        let mut t = source_half();
        advance(
            &mut t,
            &running(0, Ok(answer(1, Phase::Running, Some("10.101.0.12:30001")))),
        );
        for message in [
            "Peer east answered 429 Too Many Requests: cluster west calls faster than 100 requests per second",
            "Peer east answered 503 Service Unavailable: cluster east is starting; ask again",
            "cannot reach the endpoint 10.0.0.1:7443 of Peer east: Connection refused",
            "the endpoint 10.0.0.1:7443 of Peer east did not answer within 15 s",
        ] {
            let blip = Blocked {
                reason: Reason::PeerUnreachable,
                message: message.into(),
            };
            let before = t.status.clone();
            let p = advance(&mut t, &running(30, Err(blip)));
            assert!(p.actions.is_empty(), "{message}: {:?}", p.actions);
            assert_eq!(Some(p.status), before, "{message}");
            assert_eq!(p.requeue, Some(RETRY_REMOTE));
        }
        // Past the grace since the destination was last heard: the sender stops.
        let blip = Blocked {
            reason: Reason::PeerUnreachable,
            message: "did not answer".into(),
        };
        let p = advance(&mut t.clone(), &running(61, Err(blip)));
        assert!(p.actions.contains(&Action::DeletePod(sender.clone())));
        assert_eq!(cond(&p, "Ready").reason, "PeerUnreachable");
        // An explicit refusal acts at once.
        let refused = Blocked {
            reason: Reason::PeerRefused,
            message: "the endpoint refused this cluster's certificate".into(),
        };
        let p = advance(&mut t, &running(31, Err(refused)));
        assert!(p.actions.contains(&Action::DeletePod(sender)));
    }

    #[test]
    fn a_queued_transfer_shows_its_place_and_the_limit_it_waits_for() {
        use crate::limits::{Limit, Queued};
        let mut t = transfer();
        let mut o = obs(0);
        o.may_start = false;
        o.queue = Some(Queued {
            place: 3,
            waiting: 51,
            limit: Limit::Namespace,
        });
        let p = advance(&mut t, &o);
        assert!(p.actions.is_empty());
        assert_eq!(
            p.status.queue,
            Some(QueueStatus {
                position: 3,
                waiting: 51
            })
        );
        let message = &cond(&p, "Ready").message;
        assert!(
            message.starts_with("queued:") && message.contains("per namespace"),
            "{message}"
        );
        // Its turn: the place goes, the movers start.
        let p = advance(&mut t, &obs(1));
        assert_eq!(p.status.queue, None);
        assert!(
            p.actions
                .contains(&Action::CreateReceiver { run: 1, attempt: 1 })
        );
    }
}
