//! The source half of a cross-cluster Transfer. The destination half, in the other cluster,
//! decides runs and attempts and holds the figures that count (what was written); this half
//! mirrors its status and runs the sender of each attempt once the receiver's Service accepts
//! connections. Its sender's state reaches the destination with the next call.

use super::*;
use crate::api::RemoteStatus;

/// How often a finished source half still asks (a new run may start over there).
const POLL_FINISHED: Duration = Duration::from_secs(30);

pub(super) fn step(t: &Transfer, uid: &str, cx: &mut Ctx<'_>) -> Option<Duration> {
    let remote = cx.obs.remote.clone().unwrap_or_default();
    let blocked = blocked(t, cx.obs);
    if let Some(b) = blocked {
        return Some(wait(uid, cx, b));
    }
    let peer_cluster = cx.peer_cluster();
    match remote.answer {
        Some(Ok(answer)) => Some(follow(uid, cx, &answer, &peer_cluster)),
        // The sender keeps going, and the status stays as the destination last said it.
        Some(Err(b)) if passing(&b) && keeps_going(uid, cx) => Some(RETRY_REMOTE),
        Some(Err(b)) => Some(wait(uid, cx, b)),
        None => Some(wait(
            uid,
            cx,
            Blocked {
                reason: Reason::PeerUnreachable,
                message: "the destination half was not asked yet".into(),
            },
        )),
    }
}

/// A call that failed for a reason that passes (a timeout, a refused or reset connection, 429
/// from the rate limit, 503 from an operator that is starting): the other cluster may well
/// answer the next one. Anything else is an explicit refusal (no such Transfer, a mismatch, a
/// refused certificate, an unsupported version).
fn passing(b: &Blocked) -> bool {
    b.reason == Reason::PeerUnreachable
}

/// Whether the sender stays while the destination half does not answer: the halves were paired
/// (a sender of this attempt exists, or the destination was heard) and the silence is shorter
/// than the grace.
fn keeps_going(uid: &str, cx: &Ctx<'_>) -> bool {
    let paired = cx.pod(MoverRole::Sender, uid).is_some()
        || cx
            .st
            .remote
            .as_ref()
            .is_some_and(|r| r.last_heard.is_some());
    !cx.st.phase.is_finished() && paired && cx.silence(None) < cx.obs.peer_silence_grace
}

/// No usable answer: the sender stops, and the half waits with the reason. A finished half
/// keeps its outcome (the destination half may be gone because it finished).
fn wait(uid: &str, cx: &mut Ctx<'_>, b: Blocked) -> Duration {
    cx.delete_children(uid, false);
    if cx.st.phase.is_finished() {
        return POLL_FINISHED;
    }
    cx.block(&b);
    cx.st.sender = None;
    cx.st.throughput = None;
    cx.st.eta = None;
    if let Some(r) = cx.st.remote.as_mut() {
        r.receiver_address = None;
    }
    // A missing counterpart is usually being created right now.
    if b.reason == Reason::CounterpartMissing {
        POLL_REMOTE
    } else {
        RESYNC_BLOCKED
    }
}

/// Mirrors the destination half and runs the sender its current attempt needs.
fn follow(uid: &str, cx: &mut Ctx<'_>, answer: &PairResponse, peer_cluster: &str) -> Duration {
    let mut st = answer.status.clone();
    crate::api::sanitize_peer_conditions(&mut st.conditions);
    st.observed_generation = cx.generation;
    for c in &mut st.conditions {
        c.observed_generation = cx.generation;
    }
    st.sender = None;
    st.remote = Some(RemoteStatus {
        cluster: peer_cluster.to_owned(),
        transfer_id: Some(answer.transfer_id.clone()),
        receiver_address: answer.receiver.clone(),
        last_heard: None,
    });
    st.receiver = st.receiver.map(|r| MoverRef {
        pod: format!("{peer_cluster}/{}", r.pod),
        node: r.node,
    });
    cx.st = st;
    if cx.st.phase.is_finished() {
        // As in one cluster: the last sender pod stays for its logs, its certificates go.
        cx.retire(uid);
        return POLL_FINISHED;
    }
    if cx.st.phase == Phase::Suspended {
        cx.delete_children(uid, false);
        return POLL_REMOTE;
    }
    // Children of other attempts go; the current attempt's sender stays whatever its state
    // (the destination half decides what a failure means).
    cx.delete_children(uid, true);
    let (run, attempt) = (answer.run, answer.attempt);
    match (cx.pod(MoverRole::Sender, uid).cloned(), &answer.receiver) {
        (Some(p), _) => {
            cx.st.sender = Some(MoverRef {
                pod: p.name,
                node: p.node,
            });
        }
        (None, Some(address)) if cx.obs.may_start => {
            cx.ensure_secret(uid, run, attempt);
            cx.actions.push(Action::CreateRemoteSender {
                run,
                attempt,
                address: address.clone(),
            });
            cx.st.sender = Some(MoverRef {
                pod: names::pod_name(uid, run, attempt, MoverRole::Sender),
                node: None,
            });
        }
        (None, _) => {}
    }
    POLL_REMOTE
}
