//! The pure core of a fan-out Transfer's reconcile: from the Transfer, the nodes its
//! destination resolves to and its child Transfers as observed, the next status and the child
//! Transfers to apply or delete. No I/O.
//!
//! A fan-out runs as one child Transfer per destination node, so that each destination has
//! its own attempts, retries (resuming) and digest, and a slow or failed node never holds the
//! others. The children share the destination node list of the run (an annotation), which
//! makes their receivers take blocks from each other: the source sends about one copy.

pub mod sender;
mod siblings;

pub use siblings::{SiblingRole, Swarm, parent_of, select_nodes, sibling_role, swarm_of};

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::MoverRef;
use crate::api::{
    ConditionType, DestinationStatus, HostPathEndpoint, LastError, Phase, ProgressStatus, Reason,
    ThroughputStatus, Transfer, TransferSpec, TransferStatus, WireStatus, set_condition,
};
use crate::names;
use crate::plan::placement::{Blocked, SidePlacement};
use crate::plan::{
    Note, RESYNC_BLOCKED, RESYNC_RUNNING, Ttl, human_rate, percent, ttl_after_finished,
};
use sender::Served;
use sender::{Candidate, SenderStep};

/// A child Transfer as observed.
#[derive(Debug, Clone)]
pub struct ChildView {
    pub name: String,
    /// Its controller is this fan-out (else it is someone else's Transfer with the name a
    /// child would have, and is left alone).
    pub owned: bool,
    pub spec: TransferSpec,
    /// Its `ferry.dev/fan-out-nodes` annotation.
    pub nodes_annotation: Option<String>,
    pub status: Option<TransferStatus>,
}

#[derive(Debug, Clone)]
pub struct FanOutObserved {
    pub now: Timestamp,
    /// The nodes the destination names now (`nodes` in their order, a selector's matches by
    /// name), or why they cannot be used. Only read when a run starts.
    pub nodes: Result<Vec<String>, Blocked>,
    /// Transfers of the namespace owned by this fan-out or named as one of its children.
    pub children: Vec<ChildView>,
    /// The fan-out's senders and what they need to know of the children.
    pub sender: SenderObserved,
    /// Where the run's senders run (the source's node and volume), or why they cannot.
    pub source: Result<SidePlacement, Blocked>,
}

/// The fan-out's own sender pods and certificates, and its children as candidates for the
/// run's senders.
#[derive(Debug, Clone)]
pub struct SenderObserved {
    /// Its sender pods (any run): name and node.
    pub pods: Vec<(String, Option<String>)>,
    /// Its senders' Secrets that exist.
    pub secrets: Vec<String>,
    /// Each child, with the fan-out run its status is of.
    pub candidates: Vec<(Option<u32>, Candidate)>,
    /// How many destinations one sender serves ([`sender::served_per_sender`]).
    pub per_sender: usize,
}

impl Default for SenderObserved {
    fn default() -> Self {
        Self {
            pods: Vec::new(),
            secrets: Vec::new(),
            candidates: Vec::new(),
            per_sender: sender::MAX_SERVED,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum FanOutAction {
    /// Create or update a child (server-side apply).
    ApplyChild {
        name: String,
        spec: Box<TransferSpec>,
        nodes_annotation: String,
    },
    DeleteChild(String),
    /// `ttlSecondsAfterFinished` ran out.
    DeleteSelf,
    /// Start one of the run's senders (`batch` from 1) for these destinations: its
    /// certificates, then its pod.
    StartSender {
        run: u32,
        batch: u32,
        serves: Vec<Served>,
    },
    DeletePod(String),
    DeleteSecret(String),
}

#[derive(Debug, Clone)]
pub struct FanOutPlan {
    pub status: TransferStatus,
    pub actions: Vec<FanOutAction>,
    pub requeue: Option<Duration>,
    pub notes: Vec<Note>,
}

/// The child's trigger for run `run` of the fan-out: a new run re-runs every child.
pub fn child_trigger(run: u32) -> String {
    format!("fan-out-run-{run}")
}

/// The fan-out run a child's trigger names (the inverse of [`child_trigger`]).
pub fn run_of_trigger(trigger: &str) -> Option<u32> {
    trigger.strip_prefix("fan-out-run-")?.parse().ok()
}

/// The spec of the child writing to `node`: the fan-out's, with one destination node.
pub fn child_spec(spec: &TransferSpec, node: &str, run: u32) -> TransferSpec {
    let mut child = spec.clone();
    if let Some(hp) = &spec.destination.host_path {
        child.destination.host_path = Some(HostPathEndpoint {
            node: node.to_owned(),
            path: hp.path.clone(),
            ..HostPathEndpoint::default()
        });
    }
    child.trigger = Some(child_trigger(run));
    // The fan-out runs the schedule and keeps the history; each child runs when told.
    child.schedule = None;
    child.history_limit = None;
    // The fan-out's own lifetime governs; a child deleted on its own would be created again.
    child.ttl_seconds_after_finished = None;
    child
}

fn cond(
    st: &mut TransferStatus,
    t: &Transfer,
    now: &Time,
    kind: ConditionType,
    ok: bool,
    reason: Reason,
    msg: &str,
) {
    set_condition(
        &mut st.conditions,
        kind,
        ok,
        reason,
        msg,
        t.metadata.generation,
        now,
    );
}

/// `spec.destination.hostPath.minAvailable`, when set.
fn min_available(t: &Transfer) -> Option<usize> {
    let m = t.spec.destination.host_path.as_ref()?.min_available?;
    usize::try_from(m).ok()
}

pub fn plan(t: &Transfer, obs: &FanOutObserved) -> FanOutPlan {
    let before = t.status.clone().unwrap_or_default();
    let decision = crate::plan::runs::decide(t, &before, obs.now);
    let mut p = step(t, obs, &before, &decision);
    crate::plan::runs::after_plan(t, &before, &mut p.status, &decision);
    run_sender(t, obs, &mut p);
    if let Some(next) = decision.next {
        let wait = crate::plan::until(obs.now, next);
        p.requeue = Some(p.requeue.map_or(wait, |r| r.min(wait)));
    }
    p
}

/// The run's senders ([`sender`]): started once the children's receivers are gathered
/// (one per `per_sender` destinations), stopped when the fan-out is suspended; an earlier run's
/// go, and their certificates go once the run finished (its pods stay for their logs).
fn run_sender(t: &Transfer, obs: &FanOutObserved, p: &mut FanOutPlan) {
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let run = p.status.run;
    let this_run = names::run_prefix(&uid, run);
    let active = run > 0 && !p.status.phase.is_finished() && !t.spec.suspend;
    for (pod, _) in &obs.sender.pods {
        if !pod.starts_with(&this_run) || t.spec.suspend {
            p.actions.push(FanOutAction::DeletePod(pod.clone()));
        }
    }
    for s in &obs.sender.secrets {
        if !s.starts_with(&this_run) || !active {
            p.actions.push(FanOutAction::DeleteSecret(s.clone()));
        }
    }
    let mut running: Vec<&(String, Option<String>)> = obs
        .sender
        .pods
        .iter()
        .filter(|(pod, _)| pod.starts_with(&this_run))
        .collect();
    running.sort();
    if let Some((pod, node)) = running.first() {
        p.status.sender = Some(MoverRef {
            pod: pod.clone(),
            node: node.clone(),
        });
    }
    if !active {
        return;
    }
    let candidates: Vec<Candidate> = obs
        .sender
        .candidates
        .iter()
        .filter(|(r, _)| *r == Some(run))
        .map(|(_, c)| c.clone())
        .collect();
    match sender::step(
        &candidates,
        p.status.destinations.len(),
        !running.is_empty(),
        obs.now,
    ) {
        SenderStep::Idle => {}
        SenderStep::Wait(d) => p.requeue = Some(p.requeue.map_or(d, |r| r.min(d))),
        SenderStep::Start(serves) => {
            let batches: Vec<&[Served]> = serves.chunks(obs.sender.per_sender.max(1)).collect();
            p.notes.push(Note {
                warning: false,
                reason: "FanOutSender",
                message: format!(
                    "run {run}: {} reading the source once for {} of {} destinations",
                    match batches.len() {
                        1 => "one sender".to_owned(),
                        n => format!("{n} senders, each"),
                    },
                    serves.len(),
                    p.status.destinations.len()
                ),
            });
            for (batch, serves) in (1u32..).zip(batches) {
                p.actions.push(FanOutAction::StartSender {
                    run,
                    batch,
                    serves: serves.to_vec(),
                });
            }
        }
    }
}

fn step(
    t: &Transfer,
    obs: &FanOutObserved,
    before: &TransferStatus,
    decision: &crate::plan::runs::Decision,
) -> FanOutPlan {
    let now = Time(obs.now);
    let mut st = before.clone();
    st.observed_generation = t.metadata.generation;
    let mut actions = Vec::new();
    let mut notes = Vec::new();

    if let Some((at, why)) = &decision.skip {
        notes.push(crate::plan::runs::skip(&mut st, *at, why));
    }
    if decision.start.is_some()
        && let Err(b) = begin_run(t, obs, decision, &mut st, &mut notes, &now)
    {
        blocked(t, &mut st, &mut notes, &now, b);
        return FanOutPlan {
            status: st,
            actions,
            requeue: Some(RESYNC_BLOCKED),
            notes,
        };
    }
    // A finished run keeps its rows as they were: a child deleted since is not created again
    // (it would run again), and a spec edit waits for the next run.
    if st.phase.is_finished() {
        return finished(t, st, actions, notes, obs.now);
    }
    let sums = children(t, obs, &mut st, &mut actions);
    totals(&mut st, &sums);
    outcome(t, &mut st, &mut notes, &now);
    if st.phase.is_finished() {
        return finished(t, st, actions, notes, obs.now);
    }
    FanOutPlan {
        status: st,
        actions,
        requeue: Some(RESYNC_RUNNING),
        notes,
    }
}

/// A new run (the first, a changed trigger, the schedule) fixes the destination nodes for the
/// run; `Err` when there are none (or too few) to start with.
fn begin_run(
    t: &Transfer,
    obs: &FanOutObserved,
    decision: &crate::plan::runs::Decision,
    st: &mut TransferStatus,
    notes: &mut Vec<Note>,
    now: &Time,
) -> Result<(), Blocked> {
    let nodes = match &obs.nodes {
        Ok(n) if n.is_empty() => Err(Blocked {
            reason: Reason::NodeNotFound,
            message: "spec.destination.hostPath.nodeSelector selects no node; the Transfer starts once it does".into(),
        }),
        Ok(n) if min_available(t).is_some_and(|m| m > n.len()) => Err(Blocked {
            reason: Reason::NodeNotFound,
            message: format!(
                "spec.destination.hostPath.nodeSelector selects {} nodes, fewer than minAvailable {}; the Transfer starts once it selects enough",
                n.len(),
                min_available(t).unwrap_or_default()
            ),
        }),
        other => other.clone(),
    };
    let nodes = nodes?;
    *st = TransferStatus {
        // A fan-out's attempts are its destinations' own.
        attempts: 0,
        start_time: Some(now.clone()),
        destinations: nodes
            .iter()
            .map(|n| DestinationStatus {
                node: n.clone(),
                transfer: names::fan_out_child_name(
                    &t.metadata.name.clone().unwrap_or_default(),
                    n,
                ),
                ..DestinationStatus::default()
            })
            .collect(),
        ..crate::plan::runs::begin(t, st, decision, now)
    };
    let run = st.run;
    cond(
        st,
        t,
        now,
        ConditionType::Succeeded,
        false,
        Reason::Pending,
        "not finished",
    );
    cond(
        st,
        t,
        now,
        ConditionType::Failed,
        false,
        Reason::Pending,
        "not finished",
    );
    notes.push(Note {
        warning: false,
        reason: "FanOut",
        message: format!(
            "run {run} writes to {} nodes: {}",
            nodes.len(),
            nodes.join(", ")
        ),
    });
    notes.extend(crate::plan::runs::start_note(decision, run));
    Ok(())
}

/// A run that cannot start yet: Pending, and why in Ready, `lastError` and (once) an Event.
fn blocked(t: &Transfer, st: &mut TransferStatus, notes: &mut Vec<Note>, now: &Time, b: Blocked) {
    if !st
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == b.reason.as_str())
    {
        notes.push(Note {
            warning: true,
            reason: b.reason.as_str(),
            message: b.message.clone(),
        });
    }
    st.phase = Phase::Pending;
    cond(
        st,
        t,
        now,
        ConditionType::Ready,
        false,
        b.reason,
        &b.message,
    );
    st.last_error = Some(LastError {
        reason: b.reason.as_str().into(),
        message: b.message,
    });
}

/// Each destination's child Transfer as it should be (applied when it differs, so a steady
/// state writes nothing; children of an earlier run's node set go), and its row from the
/// child's status of this run.
fn children(
    t: &Transfer,
    obs: &FanOutObserved,
    st: &mut TransferStatus,
    actions: &mut Vec<FanOutAction>,
) -> Sums {
    let run = st.run;
    let trigger = child_trigger(run);
    let annotation: String = st
        .destinations
        .iter()
        .map(|d| d.node.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let wanted: Vec<String> = st.destinations.iter().map(|d| d.transfer.clone()).collect();

    for c in obs
        .children
        .iter()
        .filter(|c| c.owned && !wanted.contains(&c.name))
    {
        actions.push(FanOutAction::DeleteChild(c.name.clone()));
    }
    let mut destinations = std::mem::take(&mut st.destinations);
    let mut sums = Sums::default();
    for d in &mut destinations {
        let child = obs.children.iter().find(|c| c.name == d.transfer);
        if let Some(c) = child.filter(|c| !c.owned) {
            sums.finals = false;
            d.phase = Phase::Pending;
            d.message = Some(format!(
                "Transfer {} exists and is not part of this fan-out; rename or delete it",
                c.name
            ));
            continue;
        }
        let spec = child_spec(&t.spec, &d.node, run);
        let current = child.is_some_and(|c| {
            c.spec == spec && c.nodes_annotation.as_deref() == Some(annotation.as_str())
        });
        if !current {
            actions.push(FanOutAction::ApplyChild {
                name: d.transfer.clone(),
                spec: Box::new(spec),
                nodes_annotation: annotation.clone(),
            });
        }
        let cs = child
            .and_then(|c| c.status.clone())
            .filter(|s| s.observed_trigger.as_deref() == Some(trigger.as_str()))
            .unwrap_or_default();
        fill_destination(d, &cs);
        sums.add(&cs);
    }
    st.destinations = destinations;
    sums
}

/// The run's phase and conditions from its destinations' rows: Available once `minAvailable`
/// hold the data, finished once every destination is.
fn outcome(t: &Transfer, st: &mut TransferStatus, notes: &mut Vec<Note>, now: &Time) {
    let all = st.destinations.clone();
    let finished_all = all.iter().all(|d| d.phase.is_finished());
    let failed: Vec<&DestinationStatus> = all.iter().filter(|d| d.phase == Phase::Failed).collect();
    let succeeded: Vec<&DestinationStatus> =
        all.iter().filter(|d| d.phase == Phase::Succeeded).collect();
    let needed = min_available(t).unwrap_or(all.len()).min(all.len());
    let available = succeeded.len() >= needed;
    cond(
        st,
        t,
        now,
        ConditionType::Available,
        available,
        if available {
            Reason::MinimumDestinationsAvailable
        } else {
            Reason::MinimumDestinationsUnavailable
        },
        &format!(
            "{} of {} destinations hold this run's data; {needed} needed",
            succeeded.len(),
            all.len()
        ),
    );
    let failures = || {
        failed
            .iter()
            .map(|d| {
                format!(
                    "{}: {}",
                    d.node,
                    d.message.clone().unwrap_or_else(|| "failed".into())
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    if t.spec.suspend {
        st.phase = Phase::Suspended;
        cond(
            st,
            t,
            now,
            ConditionType::Ready,
            false,
            Reason::Suspended,
            "spec.suspend is set: no movers run",
        );
    } else if finished_all && available {
        let digests: std::collections::BTreeSet<_> =
            succeeded.iter().map(|d| d.digest.clone()).collect();
        st.digest = if digests.len() == 1 {
            digests.into_iter().next().flatten()
        } else {
            None
        };
        let msg = if failed.is_empty() {
            format!("all {} destinations succeeded", all.len())
        } else {
            let msg = format!(
                "{} of {} destinations succeeded (minAvailable {needed}); failed: {}",
                succeeded.len(),
                all.len(),
                failures()
            );
            notes.push(Note {
                warning: true,
                reason: Reason::DestinationFailed.as_str(),
                message: msg.clone(),
            });
            msg
        };
        finish(st, t, now, notes, Phase::Succeeded, Reason::Completed, &msg);
    } else if finished_all {
        let msg = format!(
            "{} of {} destinations failed ({needed} must succeed): {}",
            failed.len(),
            all.len(),
            failures()
        );
        finish(
            st,
            t,
            now,
            notes,
            Phase::Failed,
            Reason::DestinationFailed,
            &msg,
        );
    } else {
        let moving = all
            .iter()
            .any(|d| matches!(d.phase, Phase::Running | Phase::Retrying));
        st.phase = if moving {
            Phase::Running
        } else {
            Phase::Pending
        };
        let done = all.iter().filter(|d| d.phase == Phase::Succeeded).count();
        let msg = format!("{done} of {} destinations done", all.len());
        let reason = if moving {
            Reason::Running
        } else {
            Reason::Pending
        };
        cond(st, t, now, ConditionType::Ready, false, reason, &msg);
        // The first failure of a destination that still retries is worth a look.
        st.last_error = all.iter().find_map(|d| {
            (d.phase == Phase::Retrying).then(|| LastError {
                reason: Reason::Retrying.as_str().into(),
                message: format!("{}: {}", d.node, d.message.clone().unwrap_or_default()),
            })
        });
    }
}

fn finish(
    st: &mut TransferStatus,
    t: &Transfer,
    now: &Time,
    notes: &mut Vec<Note>,
    phase: Phase,
    reason: Reason,
    msg: &str,
) {
    st.phase = phase;
    st.completion_time = Some(now.clone());
    let ok = phase == Phase::Succeeded;
    cond(st, t, now, ConditionType::Succeeded, ok, reason, msg);
    cond(st, t, now, ConditionType::Failed, !ok, reason, msg);
    cond(st, t, now, ConditionType::Ready, ok, reason, msg);
    st.last_error = (!ok).then(|| LastError {
        reason: reason.as_str().into(),
        message: msg.into(),
    });
    notes.push(Note {
        warning: !ok,
        reason: if ok { "Succeeded" } else { "Failed" },
        message: msg.into(),
    });
}

/// A finished fan-out: only its TTL is left to watch.
fn finished(
    t: &Transfer,
    st: TransferStatus,
    mut actions: Vec<FanOutAction>,
    notes: Vec<Note>,
    now: Timestamp,
) -> FanOutPlan {
    let requeue = match ttl_after_finished(
        t.spec.ttl_seconds_after_finished,
        st.completion_time.as_ref(),
        now,
    ) {
        Ttl::Keep => None,
        Ttl::DeleteNow => {
            actions.push(FanOutAction::DeleteSelf);
            None
        }
        Ttl::Wait(d) => Some(d),
    };
    FanOutPlan {
        status: st,
        actions,
        requeue,
        notes,
    }
}

/// One destination's row, from its child's status of this run.
fn fill_destination(d: &mut DestinationStatus, cs: &TransferStatus) {
    d.phase = cs.phase;
    d.attempts = cs.attempts;
    let p = cs.progress.clone().unwrap_or_default();
    d.bytes_done = p.bytes_done;
    d.bytes_total = p.bytes_total;
    d.progress = p.display;
    d.bytes_per_second = cs
        .throughput
        .as_ref()
        .map_or(0, |t| t.current_bytes_per_second);
    d.dedup_bytes = cs.wire.as_ref().map_or(0, |w| w.dedup_bytes);
    d.digest = (cs.phase == Phase::Succeeded)
        .then(|| cs.digest.clone())
        .flatten();
    d.message = if cs.phase == Phase::Succeeded {
        None
    } else {
        cs.last_error
            .as_ref()
            .map(|e| format!("{}: {}", e.reason, e.message))
    };
}

/// What the destinations' rows do not keep, summed over the children.
struct Sums {
    /// Every child's totals are final.
    finals: bool,
    average_bytes_per_second: u64,
    wire_bytes: u64,
}

impl Default for Sums {
    fn default() -> Self {
        Self {
            finals: true,
            average_bytes_per_second: 0,
            wire_bytes: 0,
        }
    }
}

impl Sums {
    fn add(&mut self, cs: &TransferStatus) {
        self.finals &=
            cs.phase == Phase::Succeeded || cs.progress.as_ref().is_some_and(|p| p.totals_final);
        self.average_bytes_per_second += cs
            .throughput
            .as_ref()
            .map_or(0, |t| t.average_bytes_per_second);
        self.wire_bytes += cs.wire.as_ref().map_or(0, |w| w.bytes);
    }
}

/// The fan-out's own figures: the sums over its destinations.
fn totals(st: &mut TransferStatus, sums: &Sums) {
    let ds = &st.destinations;
    let mut p = ProgressStatus {
        bytes_done: ds.iter().map(|d| d.bytes_done).sum(),
        bytes_total: ds.iter().map(|d| d.bytes_total).sum(),
        totals_final: !ds.is_empty() && sums.finals,
        ..ProgressStatus::default()
    };
    p.bytes_total = p.bytes_total.max(p.bytes_done);
    p.percent = percent(&p);
    p.display = format!("{}%", p.percent);
    let rate: u64 = ds.iter().map(|d| d.bytes_per_second).sum();
    let running = ds.iter().any(|d| d.phase == Phase::Running);
    st.throughput = Some(ThroughputStatus {
        current_bytes_per_second: rate,
        average_bytes_per_second: sums.average_bytes_per_second,
        display: human_rate(if running {
            rate
        } else {
            sums.average_bytes_per_second
        }),
    });
    let ratio = if sums.wire_bytes > 0 {
        format!("{:.2}", p.bytes_done as f64 / sums.wire_bytes as f64)
    } else {
        "0".into()
    };
    st.progress = Some(p);
    st.wire = Some(WireStatus {
        bytes: sums.wire_bytes,
        compression_ratio: ratio,
        dedup_blocks: 0,
        dedup_bytes: ds.iter().map(|d| d.dedup_bytes).sum(),
        resumed_bytes: 0,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeName;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn fan_out(nodes: &[&str]) -> Transfer {
        let mut t = crate::plan::tests::transfer();
        t.metadata.name = Some("imagenet".into());
        let hp = t.spec.destination.host_path.as_mut().unwrap();
        hp.node = String::new();
        hp.nodes = nodes.iter().map(|n| NodeName((*n).into())).collect();
        t
    }

    fn obs(nodes: &[&str], children: Vec<ChildView>) -> FanOutObserved {
        FanOutObserved {
            now: "2026-11-27T10:00:00Z".parse().unwrap(),
            nodes: Ok(nodes.iter().map(|n| (*n).to_owned()).collect()),
            children,
            sender: SenderObserved::default(),
            source: Err(Blocked {
                reason: Reason::InvalidSpec,
                message: "not placed in these tests".into(),
            }),
        }
    }

    /// The child a previous plan applied, with `status` as its own reconcile wrote it.
    fn child_from(action: &FanOutAction, status: Option<TransferStatus>) -> ChildView {
        let FanOutAction::ApplyChild {
            name,
            spec,
            nodes_annotation,
        } = action
        else {
            panic!("{action:?}");
        };
        ChildView {
            name: name.clone(),
            owned: true,
            spec: (**spec).clone(),
            nodes_annotation: Some(nodes_annotation.clone()),
            status,
        }
    }

    fn child_status(phase: Phase, done: u64, total: u64) -> TransferStatus {
        TransferStatus {
            phase,
            attempts: 1,
            observed_trigger: Some(child_trigger(1)),
            progress: Some(ProgressStatus {
                bytes_done: done,
                bytes_total: total,
                totals_final: true,
                ..Default::default()
            }),
            digest: (phase == Phase::Succeeded).then(|| "d1".to_owned()),
            ..Default::default()
        }
    }

    /// Plans once from nothing, then again with the children as applied and `statuses`.
    fn plan_again(
        t: &mut Transfer,
        nodes: &[&str],
        statuses: Vec<Option<TransferStatus>>,
    ) -> FanOutPlan {
        let first = plan(t, &obs(nodes, vec![]));
        t.status = Some(first.status);
        let children = first
            .actions
            .iter()
            .zip(statuses)
            .map(|(a, s)| child_from(a, s))
            .collect();
        plan(t, &obs(nodes, children))
    }

    fn second_plan(t: &mut Transfer, statuses: Vec<Option<TransferStatus>>) -> FanOutPlan {
        plan_again(t, &["gpu-1", "gpu-2"], statuses)
    }

    /// The second plan of a run on gpu-1 and gpu-2, with the children's receivers as given
    /// (ready since `ready`, None: not ready) and the fan-out's sender pods.
    fn sender_plan(
        t: &mut Transfer,
        ready: [Option<i64>; 2],
        pods: Vec<(String, Option<String>)>,
        secrets: Vec<String>,
    ) -> FanOutPlan {
        let first = plan(t, &obs(&["gpu-1", "gpu-2"], vec![]));
        t.status = Some(first.status);
        let mut o = obs(&["gpu-1", "gpu-2"], vec![]);
        let at = |s: i64| {
            o.now
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .unwrap()
        };
        o.sender = SenderObserved {
            pods,
            secrets,
            per_sender: crate::plan::fan_out::sender::MAX_SERVED,
            candidates: ready
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    (
                        Some(1),
                        Candidate {
                            transfer_id: format!("child-{i}.1"),
                            waiting: true,
                            receiver: r.map(|s| (format!("10.0.0.{i}"), at(s))),
                        },
                    )
                })
                .collect(),
        };
        plan(t, &o)
    }

    use crate::names::MoverRole;

    /// The senders a plan starts.
    fn starts(p: &FanOutPlan) -> Vec<&FanOutAction> {
        p.actions
            .iter()
            .filter(|a| matches!(a, FanOutAction::StartSender { .. }))
            .collect()
    }

    fn sender_name(t: &Transfer, run: u32) -> String {
        names::pod_name(
            t.metadata.uid.as_deref().unwrap(),
            run,
            1,
            MoverRole::Sender,
        )
    }

    #[test]
    fn one_sender_starts_for_the_run_once_the_receivers_are_ready() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let p = sender_plan(&mut t, [Some(1), None], vec![], vec![]);
        assert!(starts(&p).is_empty(), "{:?}", p.actions);
        assert!(p.requeue.is_some_and(|r| r <= Duration::from_secs(2)));
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let p = sender_plan(&mut t, [Some(1), Some(0)], vec![], vec![]);
        let started = starts(&p);
        assert_eq!(
            started,
            [&FanOutAction::StartSender {
                run: 1,
                batch: 1,
                serves: vec![
                    Served {
                        transfer_id: "child-0.1".into(),
                        ip: "10.0.0.0".into()
                    },
                    Served {
                        transfer_id: "child-1.1".into(),
                        ip: "10.0.0.1".into()
                    },
                ],
            }]
        );
        assert!(p.notes.iter().any(|n| n.reason == "FanOutSender"));
        // One sender per `per_sender` destinations (the movers' memory limit).
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let first = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]));
        t.status = Some(first.status);
        let mut o = obs(&["gpu-1", "gpu-2"], vec![]);
        o.sender = SenderObserved {
            per_sender: 1,
            candidates: ["a.1", "b.1"]
                .iter()
                .map(|id| {
                    (
                        Some(1),
                        Candidate {
                            transfer_id: (*id).into(),
                            waiting: true,
                            receiver: Some(("10.0.0.9".into(), o.now)),
                        },
                    )
                })
                .collect(),
            ..SenderObserved::default()
        };
        let batches: Vec<(u32, usize)> = plan(&t, &o)
            .actions
            .iter()
            .filter_map(|a| match a {
                FanOutAction::StartSender { batch, serves, .. } => Some((*batch, serves.len())),
                _ => None,
            })
            .collect();
        assert_eq!(batches, [(1, 1), (2, 1)]);
        // Once it runs: named in the status, started no more.
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let name = sender_name(&t, 1);
        let pods = vec![(name.clone(), Some("src-node".to_owned()))];
        let p = sender_plan(&mut t, [Some(1), Some(0)], pods, vec![]);
        assert!(starts(&p).is_empty(), "{:?}", p.actions);
        assert_eq!(
            p.status.sender,
            Some(MoverRef {
                pod: name,
                node: Some("src-node".into())
            })
        );
    }

    #[test]
    fn an_earlier_runs_sender_goes_and_a_suspended_fan_out_stops_its_own() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let (old, current) = (sender_name(&t, 0), sender_name(&t, 1));
        let uid = t.metadata.uid.clone().unwrap();
        let (old_secret, secret) = (
            names::secret_name(&uid, 0, 1),
            names::secret_name(&uid, 1, 1),
        );
        let pods = vec![(old.clone(), None), (current.clone(), None)];
        let p = sender_plan(
            &mut t,
            [Some(1), Some(0)],
            pods.clone(),
            vec![old_secret.clone(), secret.clone()],
        );
        let deletes: Vec<&FanOutAction> = p
            .actions
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    FanOutAction::DeletePod(_) | FanOutAction::DeleteSecret(_)
                )
            })
            .collect();
        assert_eq!(
            deletes,
            [
                &FanOutAction::DeletePod(old.clone()),
                &FanOutAction::DeleteSecret(old_secret)
            ]
        );
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        t.spec.suspend = true;
        let p = sender_plan(&mut t, [Some(1), Some(0)], pods, vec![secret.clone()]);
        assert!(p.actions.contains(&FanOutAction::DeletePod(current)));
        assert!(p.actions.contains(&FanOutAction::DeleteSecret(secret)));
        assert!(starts(&p).is_empty(), "{:?}", p.actions);
    }

    #[test]
    fn a_run_records_its_nodes_and_applies_one_child_per_node_once() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let p = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]));
        assert_eq!(p.status.run, 1);
        let nodes: Vec<&str> = p
            .status
            .destinations
            .iter()
            .map(|d| d.node.as_str())
            .collect();
        assert_eq!(nodes, ["gpu-1", "gpu-2"]);
        assert_eq!(p.actions.len(), 2);
        let FanOutAction::ApplyChild {
            name,
            spec,
            nodes_annotation,
        } = &p.actions[1]
        else {
            panic!()
        };
        assert_eq!(name, "imagenet-gpu-2");
        assert_eq!(nodes_annotation, "gpu-1,gpu-2");
        let hp = spec.destination.host_path.as_ref().unwrap();
        assert_eq!((hp.node.as_str(), hp.nodes.len()), ("gpu-2", 0));
        assert_eq!(spec.trigger.as_deref(), Some("fan-out-run-1"));
        assert_eq!(spec.source, t.spec.source);
        // Applied children that match write nothing again.
        let again = second_plan(&mut t, vec![None, None]);
        assert!(again.actions.is_empty(), "{:?}", again.actions);
        assert_eq!(again.status.phase, Phase::Pending);
    }

    #[test]
    fn a_failing_destination_retries_alone_and_the_fan_out_waits_for_it() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let mut retrying = child_status(Phase::Retrying, 10, 100);
        retrying.last_error = Some(LastError {
            reason: "MoverFailed".into(),
            message: "node went away".into(),
        });
        let p = second_plan(
            &mut t,
            vec![
                Some(child_status(Phase::Succeeded, 100, 100)),
                Some(retrying),
            ],
        );
        assert_eq!(p.status.phase, Phase::Running);
        assert_eq!(p.status.destinations[0].phase, Phase::Succeeded);
        assert_eq!(p.status.destinations[1].phase, Phase::Retrying);
        let err = p.status.last_error.unwrap();
        assert!(
            err.message
                .starts_with("gpu-2: MoverFailed: node went away"),
            "{}",
            err.message
        );
        let prog = p.status.progress.unwrap();
        assert_eq!(
            (prog.bytes_done, prog.bytes_total, prog.percent),
            (110, 200, 55)
        );
    }

    #[test]
    fn all_destinations_succeeded_is_success_with_their_shared_digest() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let ok = || Some(child_status(Phase::Succeeded, 100, 100));
        let p = second_plan(&mut t, vec![ok(), ok()]);
        assert_eq!(p.status.phase, Phase::Succeeded);
        assert_eq!(p.status.digest.as_deref(), Some("d1"));
        assert_eq!(p.status.progress.unwrap().percent, 100);
        let succeeded = p
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Succeeded")
            .unwrap();
        assert_eq!(succeeded.status, "True");
    }

    #[test]
    fn a_failed_destination_fails_the_fan_out_once_the_others_finished() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let p = second_plan(
            &mut t,
            vec![Some(child_status(Phase::Running, 50, 100)), failed_child()],
        );
        assert_eq!(
            p.status.phase,
            Phase::Running,
            "the other destination goes on"
        );
        let p = second_plan(
            &mut fan_out(&["gpu-1", "gpu-2"]),
            vec![
                Some(child_status(Phase::Succeeded, 100, 100)),
                failed_child(),
            ],
        );
        assert_eq!(p.status.phase, Phase::Failed);
        let err = p.status.last_error.unwrap();
        assert_eq!(err.reason, "DestinationFailed");
        assert!(
            err.message
                .contains("1 of 2 destinations failed (2 must succeed): gpu-2"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_childs_status_of_an_earlier_run_does_not_count() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let mut old = child_status(Phase::Succeeded, 100, 100);
        old.observed_trigger = Some(child_trigger(0));
        let p = second_plan(&mut t, vec![Some(old.clone()), Some(old)]);
        assert_eq!(p.status.phase, Phase::Pending);
        assert!(
            p.status
                .destinations
                .iter()
                .all(|d| d.phase == Phase::Pending)
        );
    }

    #[test]
    fn a_finished_fan_out_keeps_its_rows_and_recreates_no_child() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let ok = || Some(child_status(Phase::Succeeded, 100, 100));
        let done = second_plan(&mut t, vec![ok(), ok()]);
        t.status = Some(done.status.clone());
        // Both children deleted by hand since.
        let p = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.status, done.status);
    }

    /// A fan-out to `nodes` that needs `min` of them, planned once from nothing and then with
    /// its children as applied and `statuses`.
    fn plan_with(
        min: Option<u32>,
        nodes: &[&str],
        statuses: Vec<Option<TransferStatus>>,
    ) -> FanOutPlan {
        let mut t = fan_out(nodes);
        t.spec.destination.host_path.as_mut().unwrap().min_available = min;
        plan_again(&mut t, nodes, statuses)
    }

    fn failed_child() -> Option<TransferStatus> {
        let mut failed = child_status(Phase::Failed, 0, 100);
        failed.last_error = Some(LastError {
            reason: "BackoffLimitExceeded".into(),
            message: "3 attempts".into(),
        });
        Some(failed)
    }

    fn condition<'a>(p: &'a FanOutPlan, kind: &str) -> &'a Condition {
        crate::plan::tests::status_condition(&p.status, kind)
    }

    #[test]
    fn min_available_turns_available_early_and_succeeds_despite_a_failed_node() {
        let nodes = ["gpu-1", "gpu-2", "gpu-3"];
        let ok = || Some(child_status(Phase::Succeeded, 100, 100));
        let running = || Some(child_status(Phase::Running, 50, 100));

        // One of the two needed is there: not available yet.
        let p = plan_with(Some(2), &nodes, vec![ok(), running(), running()]);
        assert_eq!(condition(&p, "Available").status, "False");
        assert_eq!(
            condition(&p, "Available").reason,
            "MinimumDestinationsUnavailable"
        );
        assert_eq!(p.status.phase, Phase::Running);

        // Two are: available while the third still runs; the run itself is not finished.
        let p = plan_with(Some(2), &nodes, vec![ok(), running(), ok()]);
        let available = condition(&p, "Available");
        assert_eq!(available.status, "True");
        assert_eq!(available.reason, "MinimumDestinationsAvailable");
        assert!(
            available.message.starts_with("2 of 3 destinations"),
            "{}",
            available.message
        );
        assert_eq!(
            p.status.phase,
            Phase::Running,
            "the third node still gets the data"
        );
        assert_eq!(condition(&p, "Succeeded").status, "False");

        let child = child_spec(&fan_out(&nodes).spec, "gpu-1", 1);
        assert_eq!(
            child.destination.host_path.unwrap().min_available,
            None,
            "a child is one node"
        );

        // The third fails for good: the run succeeded, says which node failed, and warns.
        let p = plan_with(Some(2), &nodes, vec![ok(), failed_child(), ok()]);
        assert_eq!(p.status.phase, Phase::Succeeded);
        assert_eq!(
            p.status.digest.as_deref(),
            Some("d1"),
            "the succeeded ones' digest"
        );
        let done = condition(&p, "Succeeded");
        assert_eq!(done.status, "True");
        assert!(
            done.message
                .contains("2 of 3 destinations succeeded (minAvailable 2); failed: gpu-2: "),
            "{}",
            done.message
        );
        assert!(
            p.notes
                .iter()
                .any(|n| n.warning && n.reason == "DestinationFailed"),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn without_min_available_every_destination_must_succeed() {
        let nodes = ["gpu-1", "gpu-2", "gpu-3"];
        let ok = || Some(child_status(Phase::Succeeded, 100, 100));
        let p = plan_with(
            None,
            &nodes,
            vec![ok(), Some(child_status(Phase::Running, 5, 100)), ok()],
        );
        assert_eq!(condition(&p, "Available").status, "False");
        let p = plan_with(None, &nodes, vec![ok(), failed_child(), ok()]);
        assert_eq!(p.status.phase, Phase::Failed);
        assert!(
            p.status
                .last_error
                .unwrap()
                .message
                .starts_with("1 of 3 destinations failed (3 must succeed)")
        );
        // Too few succeeded for the threshold: failed too.
        let p = plan_with(Some(2), &nodes, vec![ok(), failed_child(), failed_child()]);
        assert_eq!(p.status.phase, Phase::Failed);
        assert_eq!(condition(&p, "Available").status, "False");
        let p = plan_with(None, &nodes, vec![ok(), ok(), ok()]);
        assert_eq!(p.status.phase, Phase::Succeeded);
        assert_eq!(condition(&p, "Available").status, "True");
    }

    #[test]
    fn a_selector_with_fewer_nodes_than_min_available_waits() {
        let mut t = fan_out(&[]);
        t.spec.destination.host_path.as_mut().unwrap().min_available = Some(3);
        let p = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]));
        assert_eq!(p.status.run, 0);
        assert_eq!(p.status.phase, Phase::Pending);
        let err = p.status.last_error.unwrap();
        assert_eq!(err.reason, "NodeNotFound");
        assert!(
            err.message
                .contains("selects 2 nodes, fewer than minAvailable 3"),
            "{}",
            err.message
        );
        assert!(p.actions.is_empty());
    }

    #[test]
    fn a_selector_that_picks_nothing_waits_with_a_reason() {
        let t = fan_out(&[]);
        let p = plan(&t, &obs(&[], vec![]));
        assert_eq!(p.status.run, 0);
        assert_eq!(p.status.phase, Phase::Pending);
        assert_eq!(p.status.last_error.unwrap().reason, "NodeNotFound");
        assert!(p.actions.is_empty());
        assert_eq!(p.requeue, Some(RESYNC_BLOCKED));
    }

    #[test]
    fn someone_elses_transfer_with_a_childs_name_is_left_alone_and_reported() {
        let t = fan_out(&["gpu-1"]);
        let foreign = ChildView {
            name: "imagenet-gpu-1".into(),
            owned: false,
            spec: t.spec.clone(),
            nodes_annotation: None,
            status: None,
        };
        let p = plan(&t, &obs(&["gpu-1"], vec![foreign]));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        let msg = p.status.destinations[0].message.clone().unwrap();
        assert!(msg.contains("not part of this fan-out"), "{msg}");
    }

    #[test]
    fn a_new_run_replaces_children_of_nodes_it_no_longer_has() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let ok = || Some(child_status(Phase::Succeeded, 1, 1));
        let done = second_plan(&mut t, vec![ok(), ok()]);
        let old_children: Vec<ChildView> = plan(
            &fan_out(&["gpu-1", "gpu-2"]),
            &obs(&["gpu-1", "gpu-2"], vec![]),
        )
        .actions
        .iter()
        .map(|a| child_from(a, ok()))
        .collect();
        t.status = Some(done.status);
        t.spec.trigger = Some("again".into());
        let p = plan(&t, &obs(&["gpu-1", "gpu-3"], old_children));
        assert_eq!(p.status.run, 2);
        assert!(
            p.actions
                .contains(&FanOutAction::DeleteChild("imagenet-gpu-2".into())),
            "{:?}",
            p.actions
        );
        let applied: Vec<&str> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                FanOutAction::ApplyChild { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            applied,
            ["imagenet-gpu-1", "imagenet-gpu-3"],
            "gpu-1 runs again with the new trigger"
        );
    }

    #[test]
    fn a_scheduled_fan_out_runs_its_children_again_when_the_schedule_fires() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        t.spec.schedule = Some(crate::api::ScheduleSpec {
            cron: "0 * * * *".into(),
            ..Default::default()
        });
        t.metadata.creation_timestamp = Some(Time("2026-11-27T09:59:00Z".parse().unwrap()));
        let ok = || Some(child_status(Phase::Succeeded, 1, 1));
        let done = second_plan(&mut t, vec![ok(), ok()]);
        assert_eq!(done.status.phase, Phase::Succeeded);
        assert_eq!(done.status.history.len(), 1);
        assert_eq!(
            done.status.next_run_time,
            Some(Time("2026-11-27T11:00:00Z".parse().unwrap()))
        );
        assert_eq!(done.requeue, Some(Duration::from_secs(3600)));
        let children: Vec<ChildView> = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]))
            .actions
            .iter()
            .map(|a| child_from(a, ok()))
            .collect();
        t.status = Some(done.status);
        let mut later = obs(&["gpu-1", "gpu-2"], children);
        later.now = "2026-11-27T11:00:05Z".parse().unwrap();
        let p = plan(&t, &later);
        assert_eq!(p.status.run, 2);
        assert_eq!(p.status.history.len(), 1);
        let specs: Vec<&TransferSpec> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                FanOutAction::ApplyChild { spec, .. } => Some(&**spec),
                _ => None,
            })
            .collect();
        assert_eq!(specs.len(), 2, "{:?}", p.actions);
        for spec in specs {
            assert_eq!(spec.trigger.as_deref(), Some("fan-out-run-2"));
            assert!(
                spec.schedule.is_none(),
                "the fan-out alone keeps the schedule"
            );
        }
    }

    #[test]
    fn suspending_the_fan_out_suspends_every_child() {
        let mut t = fan_out(&["gpu-1", "gpu-2"]);
        let first = plan(&t, &obs(&["gpu-1", "gpu-2"], vec![]));
        let children: Vec<ChildView> = first.actions.iter().map(|a| child_from(a, None)).collect();
        t.status = Some(first.status);
        t.spec.suspend = true;
        let p = plan(&t, &obs(&["gpu-1", "gpu-2"], children));
        assert_eq!(p.status.phase, Phase::Suspended);
        assert_eq!(p.actions.len(), 2);
        assert!(
            p.actions
                .iter()
                .all(|a| matches!(a, FanOutAction::ApplyChild { spec, .. } if spec.suspend))
        );
    }
}
