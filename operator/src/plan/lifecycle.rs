//! The lifecycle of a Transfer in one cluster (and of a destination half): runs and attempts,
//! the deadline, suspend, waiting for a slot, starting the receiver then the sender, and the
//! outcome. A failed attempt is decided in `failure`.

use super::*;

pub(super) fn step(t: &Transfer, uid: &str, cx: &mut Ctx<'_>) -> Option<Duration> {
    let spec = &t.spec;
    let now = cx.obs.now;

    // A new run: the first, a changed trigger after the last finished, or the schedule.
    let decision = crate::plan::runs::decide(t, &cx.st, now);
    if let Some((at, why)) = &decision.skip {
        let note = crate::plan::runs::skip(&mut cx.st, *at, why);
        cx.notes.push(note);
    }
    if decision.start.is_some() {
        cx.st = crate::plan::runs::begin(t, &cx.st, &decision, &cx.now);
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
        if let Some(note) = crate::plan::runs::start_note(&decision, cx.st.run) {
            cx.notes.push(note);
        }
    }
    cx.decision = decision;

    if cx.st.phase.is_finished() {
        cx.retire(uid);
        cx.delete_receiver_service(uid);
        return match ttl_after_finished(
            spec.ttl_seconds_after_finished,
            cx.st.completion_time.as_ref(),
            now,
        ) {
            Ttl::Keep => None,
            Ttl::DeleteNow => {
                cx.actions.push(Action::DeleteTransfer);
                None
            }
            Ttl::Wait(d) => Some(d),
        };
    }

    let blocked = blocked(t, cx.obs);
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

    // The destination claim to provision comes first (a missing one blocks nothing: observe
    // counts it as there).
    if let Some(crate::plan::provision::ProvisionStep::Create(req)) = &cx.obs.provision {
        let message = format!(
            "creating PersistentVolumeClaim {} ({}, {})",
            req.name,
            crate::plan::provision::quantity(req.bytes),
            req.storage_class_name.as_deref().map_or_else(
                || "the default StorageClass".to_owned(),
                |c| format!("StorageClass {c}")
            )
        );
        cx.actions.push(Action::CreateClaim(req.clone()));
        cx.notes.push(Note {
            warning: false,
            reason: "ClaimProvisioned",
            message: message.clone(),
        });
        cx.st.phase = Phase::Pending;
        cx.cond(ConditionType::Ready, false, Reason::Pending, &message);
        return Some(RESYNC_PROVISIONED);
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
    let own_sender = names::pod_name(uid, cx.st.run, cx.st.attempts, MoverRole::Sender);
    let (send, send_name) = if destination_half {
        (cx.remote_sender(), own_sender)
    } else if let Some((pod, name)) = cx.fan_out_sender(&own_sender) {
        (pod, name)
    } else {
        (cx.pod(MoverRole::Sender, uid).cloned(), own_sender)
    };
    // With `onUnreadable: Skip`, a sender that left out only what it may not read (exit 1 with
    // unreadable entries named) finished its job.
    let skipped_only = |s: &PodView| {
        spec.on_unreadable == OnUnreadable::Skip
            && s.phase == PodPhase::Failed
            && s.exit_code == Some(i32::from(ferry_proto::kind::EXIT_FAILED_ENTRIES))
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
    fold_progress(&mut cx.st, cx.obs);

    if let Some(failure) = attempt_failure(cx, recv.as_ref(), send.as_ref(), &recv_name, &send_name)
    {
        return fail_attempt(cx, uid, spec, failure);
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
        // This attempt's pods stay for their logs; its certificates go.
        cx.retire_secret(uid);
        return None;
    }

    if recv.is_none() && send.is_none() && !cx.obs.may_start {
        let queue = cx.obs.queue;
        let limit = queue.map_or(crate::plan::limits::Limit::Cluster, |q| q.limit);
        cx.st.phase = Phase::Pending;
        cx.st.queue = queue.map(|q| QueueStatus {
            position: u32::try_from(q.place).unwrap_or(u32::MAX),
            waiting: u32::try_from(q.waiting).unwrap_or(u32::MAX),
        });
        cx.cond(
            ConditionType::Ready,
            false,
            Reason::Pending,
            &format!("{} {}", crate::plan::limits::QUEUED, limit.describe()),
        );
        return Some(RESYNC_BLOCKED);
    }

    if cx.st.start_time.is_none() {
        cx.st.start_time = Some(cx.now.clone());
    }
    // Receivers reach the block store through their node's service, whatever the namespace's
    // Pod Security level: no condition about it, unless it failed earlier in this run.
    cx.st.conditions.retain(|c| {
        c.type_ != ConditionType::Dedup.as_str() || c.reason == Reason::BlockStoreFailed.as_str()
    });
    let (run, attempt) = (cx.st.run, cx.st.attempts);
    cx.ensure_secret(uid, run, attempt);
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
                (None, true, Some(_)) if let Some(wait) = cx.awaits_fan_out_sender(r) => {
                    cx.st.phase = Phase::Pending;
                    cx.cond(
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
