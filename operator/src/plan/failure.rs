//! A failed attempt: what each mover reported and where the fault lies, whether a retry can
//! help, how long to back off, and a change the API server refused.

use super::*;

pub(super) fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    (BACKOFF_BASE * (1u32 << shift)).min(BACKOFF_MAX)
}

/// A failed attempt: what happened, and where the fault lies when a mover said so.
pub(super) struct Failure {
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
        Some(code) => ferry_proto::kind::from_exit_status(code),
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

/// Why the current attempt failed, if it did: a mover exited non-zero, or a mover this attempt
/// had is gone (its pod was deleted or its node lost it).
pub(super) fn attempt_failure(
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

/// A failed attempt: at once for good (a fault a retry cannot fix, or the backoff limit is
/// used up), or retried after the backoff, resuming; while the other mover may still report a
/// verdict of its own, the decision waits for it.
pub(super) fn fail_attempt(
    cx: &mut Ctx<'_>,
    uid: &str,
    spec: &TransferSpec,
    failure: Failure,
) -> Option<Duration> {
    let Failure {
        message,
        permanent,
        settled,
        store_fault,
    } = failure;
    let now = cx.obs.now;
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
    Some(wait)
}
