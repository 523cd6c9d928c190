//! The lifecycle of a Transfer in one cluster (and of a destination half): runs and attempts,
//! the deadline, suspend, waiting for a slot, starting the receiver then the sender, and the
//! outcome. A failed attempt is decided in `failure`.
//!
//! One step goes through the stages in order, each either deciding the step (`Break` with when
//! to look again) or letting the next one look: a new run, a finished one, what holds the
//! Transfer (a block, the deadline, suspend), the claim to provision, the backoff before the
//! next attempt, then this attempt's pods: failed, stuck, succeeded, queued, or started and
//! followed.

use std::ops::ControlFlow::{self, Break, Continue};

use super::*;

/// One stage of a step: `Break` ends the step with its requeue, `Continue` goes on.
type Stage = ControlFlow<Option<Duration>>;

pub(super) fn step(t: &Transfer, uid: &str, cx: &mut Ctx<'_>) -> Option<Duration> {
    cx.begin_run(t);
    if let Break(requeue) = cx.finished_run(t, uid) {
        return requeue;
    }
    if let Break(requeue) = cx.held(t, uid) {
        return requeue;
    }
    if let Break(requeue) = cx.provision_claim() {
        return requeue;
    }
    if let Break(requeue) = cx.next_attempt_due() {
        return requeue;
    }
    cx.delete_children(uid, true);

    let destination_half = t.is_destination_half();
    if destination_half && let Some(wait) = cx.await_counterpart(t, uid) {
        return Some(wait);
    }
    let pods = cx.attempt_pods(t, uid, destination_half);
    fold_progress(&mut cx.st, cx.obs);
    if let Some(failure) = attempt_failure(
        cx,
        pods.recv.as_ref(),
        pods.send.as_ref(),
        &pods.recv_name,
        &pods.send_name,
    ) {
        return fail_attempt(cx, uid, &t.spec, failure);
    }
    if let Break(requeue) = cx.mover_stuck(&pods) {
        return requeue;
    }
    if let Break(requeue) = cx.attempt_succeeded(uid, &pods) {
        return requeue;
    }
    if let Break(requeue) = cx.queued(&pods) {
        return requeue;
    }
    cx.start_or_follow(uid, &pods, destination_half)
}

/// This attempt's mover pods as the step sees them, with their names.
struct AttemptPods {
    recv: Option<PodView>,
    /// The own sender, the fan-out's sender serving this child, or the other cluster's.
    send: Option<PodView>,
    recv_name: String,
    send_name: String,
}

impl Ctx<'_> {
    /// A new run: the first, a changed trigger after the last finished, or the schedule.
    fn begin_run(&mut self, t: &Transfer) {
        let decision = crate::plan::runs::decide(t, &self.st, self.obs.now);
        if let Some((at, why)) = &decision.skip {
            let note = crate::plan::runs::skip(&mut self.st, *at, why);
            self.notes.push(note);
        }
        if decision.start.is_some() {
            self.st = crate::plan::runs::begin(t, &self.st, &decision, &self.now);
            self.cond(
                ConditionType::Succeeded,
                false,
                Reason::Pending,
                "not finished",
            );
            self.cond(
                ConditionType::Failed,
                false,
                Reason::Pending,
                "not finished",
            );
            if let Some(note) = crate::plan::runs::start_note(&decision, self.st.run) {
                self.notes.push(note);
            }
        }
        self.decision = decision;
    }

    /// A finished run: its movers and certificates go, and `ttlSecondsAfterFinished` is kept.
    fn finished_run(&mut self, t: &Transfer, uid: &str) -> Stage {
        if self.st.phase.is_finished() {
            self.retire(uid);
            self.delete_receiver_service(uid);
            return Break(
                match ttl_after_finished(
                    t.spec.ttl_seconds_after_finished,
                    self.st.completion_time.as_ref(),
                    self.obs.now,
                ) {
                    Ttl::Keep => None,
                    Ttl::DeleteNow => {
                        self.actions.push(Action::DeleteTransfer);
                        None
                    }
                    Ttl::Wait(d) => Some(d),
                },
            );
        }
        Continue(())
    }

    /// What keeps the Transfer from running: a block, the deadline passed, suspend.
    fn held(&mut self, t: &Transfer, uid: &str) -> Stage {
        let spec = &t.spec;
        let blocked = blocked(t, self.obs);
        if let Some(b) = blocked {
            self.stop_attempt(uid);
            self.block(&b);
            return Break(Some(RESYNC_BLOCKED));
        }

        if let (Some(limit), Some(start)) = (spec.active_deadline_seconds, &self.st.start_time)
            && self.obs.now >= add(start.0, Duration::from_secs(limit.max(0) as u64))
        {
            self.delete_children(uid, false);
            self.finish(
                Phase::Failed,
                Reason::DeadlineExceeded,
                &format!("the Transfer ran longer than activeDeadlineSeconds ({limit} s)"),
            );
            return Break(None);
        }

        if spec.suspend {
            if self.st.phase != Phase::Suspended {
                self.stop_attempt(uid);
            } else {
                self.delete_children(uid, false);
            }
            self.st.phase = Phase::Suspended;
            self.cond(
                ConditionType::Ready,
                false,
                Reason::Suspended,
                "spec.suspend is set: movers stopped; clear it to continue where the Transfer stopped",
            );
            // The deadline keeps running while suspended.
            return Break(spec.active_deadline_seconds.map(|_| RESYNC_BLOCKED));
        }
        if self.st.phase == Phase::Suspended {
            self.st.phase = Phase::Pending;
        }
        Continue(())
    }

    /// The destination claim to provision comes first (a missing one blocks nothing: observe
    /// counts it as there).
    fn provision_claim(&mut self) -> Stage {
        if let Some(crate::plan::provision::ProvisionStep::Create(req)) = &self.obs.provision {
            let message = format!(
                "creating PersistentVolumeClaim {} ({}, {})",
                req.name,
                crate::plan::provision::quantity(req.bytes),
                req.storage_class_name.as_deref().map_or_else(
                    || "the default StorageClass".to_owned(),
                    |c| format!("StorageClass {c}")
                )
            );
            self.actions.push(Action::CreateClaim(req.clone()));
            self.notes.push(Note {
                warning: false,
                reason: "ClaimProvisioned",
                message: message.clone(),
            });
            self.st.phase = Phase::Pending;
            self.cond(ConditionType::Ready, false, Reason::Pending, &message);
            return Break(Some(RESYNC_PROVISIONED));
        }
        Continue(())
    }

    /// After a failed attempt: the backoff, then the next attempt.
    fn next_attempt_due(&mut self) -> Stage {
        if self.st.phase == Phase::Retrying {
            if let Some(at) = &self.st.retry_after
                && self.obs.now < at.0
            {
                return Break(Some(until(self.obs.now, at.0)));
            }
            self.st.attempts += 1;
            self.st.retry_after = None;
            self.st.phase = Phase::Pending;
            self.st.sender = None;
            self.st.receiver = None;
        }
        Continue(())
    }

    /// The attempt's receiver and sender (its own, the fan-out's, or the other cluster's).
    fn attempt_pods(&self, t: &Transfer, uid: &str, destination_half: bool) -> AttemptPods {
        let recv = self.pod(MoverRole::Receiver, uid).cloned();
        let own_sender = names::pod_name(uid, self.st.run, self.st.attempts, MoverRole::Sender);
        let (send, send_name) = if destination_half {
            (self.remote_sender(), own_sender)
        } else if let Some((pod, name)) = self.fan_out_sender(&own_sender) {
            (pod, name)
        } else {
            (self.pod(MoverRole::Sender, uid).cloned(), own_sender)
        };
        // With `onUnreadable: Skip`, a sender that left out only what it may not read (exit 1 with
        // unreadable entries named) finished its job.
        let skipped_only = |s: &PodView| {
            t.spec.on_unreadable == OnUnreadable::Skip
                && s.phase == PodPhase::Failed
                && s.exit_code == Some(i32::from(ferry_proto::kind::EXIT_FAILED_ENTRIES))
                && self
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
        let recv_name = names::pod_name(uid, self.st.run, self.st.attempts, MoverRole::Receiver);
        AttemptPods {
            recv,
            send,
            recv_name,
            send_name,
        }
    }

    /// A mover pod that cannot start says why (the scheduler, the kubelet, the image pull):
    /// the Transfer is not running, and its status carries the cluster's own words.
    fn mover_stuck(&mut self, pods: &AttemptPods) -> Stage {
        if let Some((pod, stuck)) = [&pods.recv, &pods.send]
            .into_iter()
            .flatten()
            .filter(|p| p.phase == PodPhase::Pending && !p.deleting)
            .find_map(|p| p.stuck.as_ref().map(|s| (p.name.clone(), s.clone())))
        {
            let message = format!(
                "attempt {}: mover pod {pod} cannot start: {}: {}",
                self.st.attempts, stuck.cause, stuck.message
            );
            let already = self.st.conditions.iter().any(|c| {
                c.type_ == ConditionType::Ready.as_str() && c.reason == stuck.reason.as_str()
            });
            if !already {
                self.notes.push(Note {
                    warning: true,
                    reason: stuck.reason.as_str(),
                    message: message.clone(),
                });
            }
            self.st.phase = Phase::Pending;
            self.cond(ConditionType::Ready, false, stuck.reason, &message);
            self.st.last_error = Some(LastError {
                reason: stuck.reason.as_str().to_owned(),
                message,
            });
            return Break(Some(RESYNC_BLOCKED));
        }
        Continue(())
    }

    /// Both movers succeeded: the digests compared, the run finished.
    fn attempt_succeeded(&mut self, uid: &str, pods: &AttemptPods) -> Stage {
        if let (Some(r), Some(s)) = (&pods.recv, &pods.send)
            && r.phase == PodPhase::Succeeded
            && s.phase == PodPhase::Succeeded
        {
            let digest = |u: &Option<ProgressUpdate>| {
                u.as_ref()
                    .map(|u| u.digest.clone())
                    .filter(|d| !d.is_empty())
            };
            match (
                digest(&self.obs.receiver_progress),
                digest(&self.obs.sender_progress),
            ) {
                (Some(r), Some(s)) if r != s => {
                    self.finish(
                        Phase::Failed,
                        Reason::DigestMismatch,
                        &format!(
                            "the receiver's digest {r} of what it wrote differs from the sender's {s} of the source"
                        ),
                    );
                    return Break(None);
                }
                (Some(r), Some(_)) => self.st.digest = Some(r),
                // A mover whose final update was not read (the operator was down meanwhile):
                // nothing to compare, so no digest is claimed.
                _ => self.st.digest = None,
            }
            if let Some(p) = &mut self.st.progress {
                p.percent = 100;
                p.display = "100%".into();
                p.totals_final = true;
            }
            let mut message = match &self.st.progress {
                Some(p) => format!("{} files, {} bytes transferred", p.files_done, p.bytes_done),
                None => "transfer complete".to_owned(),
            };
            if let Some(u) = &self.st.unreadable {
                message.push_str(&format!(
                    "; {} source entries could not be read and were left out (status.unreadable)",
                    u.count
                ));
                self.notes.push(Note {
                    warning: true,
                    reason: "EntriesSkipped",
                    message: format!(
                        "{} unreadable source entries left out, first: {}",
                        u.count,
                        u.paths.first().map(String::as_str).unwrap_or("?")
                    ),
                });
            }
            self.finish(Phase::Succeeded, Reason::Completed, &message);
            // This attempt's pods stay for their logs; its certificates go.
            self.retire_secret(uid);
            return Break(None);
        }
        Continue(())
    }

    /// No mover yet and no slot: the Transfer waits in the queue.
    fn queued(&mut self, pods: &AttemptPods) -> Stage {
        if pods.recv.is_none() && pods.send.is_none() && !self.obs.may_start {
            let queue = self.obs.queue;
            let limit = queue.map_or(crate::plan::limits::Limit::Cluster, |q| q.limit);
            self.st.phase = Phase::Pending;
            self.st.queue = queue.map(|q| QueueStatus {
                position: u32::try_from(q.place).unwrap_or(u32::MAX),
                waiting: u32::try_from(q.waiting).unwrap_or(u32::MAX),
            });
            self.cond(
                ConditionType::Ready,
                false,
                Reason::Pending,
                &format!("{} {}", crate::plan::limits::QUEUED, limit.describe()),
            );
            return Break(Some(RESYNC_BLOCKED));
        }
        Continue(())
    }

    /// The attempt's certificates, then its receiver, then (once that is ready) its sender;
    /// the phase says which of them runs.
    fn start_or_follow(
        &mut self,
        uid: &str,
        pods: &AttemptPods,
        destination_half: bool,
    ) -> Option<Duration> {
        if self.st.start_time.is_none() {
            self.st.start_time = Some(self.now.clone());
        }
        // Receivers reach the block store through their node's service, whatever the namespace's
        // Pod Security level: no condition about it, unless it failed earlier in this run.
        self.st.conditions.retain(|c| {
            c.type_ != ConditionType::Dedup.as_str()
                || c.reason == Reason::BlockStoreFailed.as_str()
        });
        let (run, attempt) = (self.st.run, self.st.attempts);
        self.ensure_secret(uid, run, attempt);
        if destination_half {
            self.publish_receiver(uid, pods.recv.as_ref());
        }
        match &pods.recv {
            None => {
                self.actions.push(Action::CreateReceiver { run, attempt });
                self.st.phase = Phase::Pending;
                self.cond(
                    ConditionType::Ready,
                    false,
                    Reason::Pending,
                    &format!("attempt {attempt}: starting the movers"),
                );
            }
            Some(r) => {
                self.st.receiver = Some(MoverRef {
                    pod: r.name.clone(),
                    node: r.node.clone(),
                });
                match (&pods.send, r.ready, &r.ip) {
                    (None, true, Some(_)) if destination_half => {
                        let peer = self.peer_cluster();
                        self.st.phase = Phase::Pending;
                        self.cond(
                            ConditionType::Ready,
                            false,
                            Reason::Pending,
                            &format!(
                                "attempt {attempt}: the receiver is ready; waiting for the sender in cluster {peer}"
                            ),
                        );
                    }
                    (None, true, Some(_)) if let Some(wait) = self.awaits_fan_out_sender(r) => {
                        self.st.phase = Phase::Pending;
                        self.cond(
                            ConditionType::Ready,
                            false,
                            Reason::Pending,
                            &format!(
                                "attempt {attempt}: the receiver is ready; waiting for the fan-out's sender, which reads the source once for every destination"
                            ),
                        );
                        return Some(wait.min(RESYNC_FAN_OUT_SENDER));
                    }
                    (None, true, Some(ip)) => {
                        self.actions.push(Action::CreateSender {
                            run,
                            attempt,
                            receiver_ip: ip.clone(),
                        });
                        self.st.phase = Phase::Pending;
                        self.cond(
                            ConditionType::Ready,
                            false,
                            Reason::Pending,
                            &format!(
                                "attempt {attempt}: the receiver is ready; starting the sender"
                            ),
                        );
                    }
                    (None, _, _) => {
                        self.st.phase = Phase::Pending;
                        self.cond(
                            ConditionType::Ready,
                            false,
                            Reason::Pending,
                            &format!("attempt {attempt}: starting the movers"),
                        );
                    }
                    (Some(s), _, _) => {
                        self.st.sender = Some(MoverRef {
                            pod: s.name.clone(),
                            node: s.node.clone(),
                        });
                        // Running (and Ready) only once data moves: a sender that cannot open its
                        // source, or a pod that never starts, is never reported as running.
                        if moving_data(self.obs) {
                            self.st.phase = Phase::Running;
                            self.cond(
                                ConditionType::Ready,
                                true,
                                Reason::Running,
                                &format!("attempt {attempt}: moving data"),
                            );
                        } else {
                            self.st.phase = Phase::Pending;
                            self.cond(
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
}
