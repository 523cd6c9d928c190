//! The plan's rules, one scenario each.

use super::*;
use crate::api::{Endpoint, HostPathEndpoint, TransferSpec};
use crate::plan::placement::VolumeRef;
use kube::api::ObjectMeta;

pub(crate) fn transfer() -> Transfer {
    let host = |node: &str, path: &str| Endpoint {
        host_path: Some(HostPathEndpoint {
            node: node.into(),
            path: path.into(),
            ..HostPathEndpoint::default()
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
        provision: None,
        fan_out_sender: None,
        swarm: None,
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
    status_condition(&p.status, kind)
}

/// Condition `kind` of a status (panics naming the conditions there are when it is missing).
pub(crate) fn status_condition<'a>(
    st: &'a TransferStatus,
    kind: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    st.conditions
        .iter()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("no {kind} in {:?}", st.conditions))
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
fn pod_security_refuses_host_paths_and_keeps_dedup_through_the_node_service() {
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
    assert!(
        p.dedup,
        "the receiver mounts no store: the node service serves it"
    );
    assert!(p.status.conditions.iter().all(|c| c.type_ != "Dedup"));
    assert!(
        p.actions
            .contains(&Action::CreateReceiver { run: 1, attempt: 1 })
    );
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
    use crate::plan::limits::{Limit, Queued};
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

/// A Transfer on a five-minute schedule, created at `obs(0)` (a whole five minutes).
fn every_five_minutes() -> Transfer {
    let mut t = transfer();
    t.spec.schedule = Some(crate::api::ScheduleSpec {
        cron: "*/5 * * * *".into(),
        ..crate::api::ScheduleSpec::default()
    });
    t.metadata.creation_timestamp = Some(Time(obs(0).now));
    t
}

/// Runs `t`'s current run to success at `secs`.
fn succeed(t: &mut Transfer, secs: i64) -> Plan {
    let run = t.status.as_ref().map_or(1, |s| s.run);
    let mut o = obs(secs);
    o.pods = vec![
        pod(run, 1, MoverRole::Receiver, PodPhase::Succeeded, false),
        pod(run, 1, MoverRole::Sender, PodPhase::Succeeded, false),
    ];
    o.receiver_progress = Some(ProgressUpdate {
        phase: MoverPhase::Succeeded as i32,
        files_done: 3,
        bytes_done: 300,
        wire_bytes: 150,
        ..ProgressUpdate::default()
    });
    advance(t, &o)
}

#[test]
fn a_scheduled_transfer_records_its_run_and_starts_the_next_when_the_schedule_fires() {
    let mut t = every_five_minutes();
    let p = advance(&mut t, &obs(1));
    assert_eq!(p.status.run, 1);
    assert_eq!(p.status.next_run_time, Some(Time(obs(300).now)));
    let done = succeed(&mut t, 60);
    assert_eq!(done.status.phase, Phase::Succeeded);
    assert_eq!(done.status.history.len(), 1);
    let h = &done.status.history[0];
    assert_eq!(
        (h.run, h.result, h.files, h.bytes),
        (1, crate::api::RunResult::Succeeded, 3, 300)
    );
    assert_eq!(h.cause, crate::api::RunCause::Created);
    assert_eq!(done.status.last_success_time, Some(Time(obs(60).now)));
    // Between runs the plan sleeps until the schedule's time, and changes nothing meanwhile.
    assert_eq!(done.requeue, Some(Duration::from_secs(240)));
    let quiet = plan(&t, &obs(200));
    assert_eq!(quiet.status, done.status);
    assert!(quiet.actions.is_empty());

    let p = advance(&mut t, &obs(300));
    assert_eq!(p.status.run, 2);
    assert_eq!(p.status.phase, Phase::Pending);
    assert_eq!(p.status.history.len(), 1, "the history is kept across runs");
    assert_eq!(p.status.next_run_time, Some(Time(obs(600).now)));
    assert!(
        p.actions
            .contains(&Action::CreateReceiver { run: 2, attempt: 1 })
    );
    let note = p
        .notes
        .iter()
        .find(|n| n.reason == "Scheduled")
        .expect("note");
    assert!(note.message.contains("run 2 starts"), "{}", note.message);
    let done = succeed(&mut t, 330);
    let runs: Vec<u32> = done.status.history.iter().map(|h| h.run).collect();
    assert_eq!(runs, [2, 1]);
}

#[test]
fn forbid_skips_a_scheduled_time_while_the_run_is_going() {
    let mut t = every_five_minutes();
    advance(&mut t, &obs(1));
    let mut o = obs(301);
    o.pods = vec![pod(1, 1, MoverRole::Receiver, PodPhase::Running, true)];
    let p = advance(&mut t, &o);
    assert_eq!(p.status.run, 1);
    assert_eq!(p.status.skipped_runs, 1);
    assert_eq!(p.status.last_schedule_time, Some(Time(obs(300).now)));
    assert!(
        p.notes
            .iter()
            .any(|n| n.reason == "RunSkipped" && n.warning)
    );
    assert!(!p.actions.iter().any(|a| matches!(a, Action::DeletePod(_))));
    // Counted once.
    let p = advance(&mut t, &o);
    assert_eq!(p.status.skipped_runs, 1);
}

#[test]
fn replace_stops_the_going_run_and_starts_the_scheduled_one() {
    let mut t = every_five_minutes();
    t.spec
        .schedule
        .as_mut()
        .expect("schedule")
        .concurrency_policy = crate::api::ConcurrencyPolicy::Replace;
    advance(&mut t, &obs(1));
    let mut o = obs(301);
    o.pods = vec![
        pod(1, 1, MoverRole::Receiver, PodPhase::Running, true),
        pod(1, 1, MoverRole::Sender, PodPhase::Running, true),
    ];
    let p = advance(&mut t, &o);
    assert_eq!(p.status.run, 2);
    assert_eq!(p.status.history[0].result, crate::api::RunResult::Replaced);
    for role in [MoverRole::Receiver, MoverRole::Sender] {
        assert!(
            p.actions
                .contains(&Action::DeletePod(names::pod_name(UID, 1, 1, role)))
        );
    }
    assert!(
        p.actions
            .contains(&Action::CreateReceiver { run: 2, attempt: 1 })
    );
}

#[test]
fn a_schedule_in_a_time_zone_that_does_not_exist_creates_nothing() {
    let mut t = every_five_minutes();
    t.spec.schedule.as_mut().expect("schedule").time_zone = Some("Europe/Atlantis".into());
    let p = advance(&mut t, &obs(1));
    assert_eq!(p.status.phase, Phase::Pending);
    assert_eq!(cond(&p, "Ready").reason, "InvalidSpec");
    assert!(
        cond(&p, "Ready")
            .message
            .contains("\"Europe/Atlantis\" is not a time zone")
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.status.next_run_time, None);
}

#[test]
fn a_missing_provisioned_claim_is_created_first_and_a_small_one_blocks() {
    use crate::plan::provision::{ClaimRequest, ProvisionStep};
    let mut t = transfer();
    let mut o = obs(1);
    let req = ClaimRequest {
        name: "copy".into(),
        bytes: 1 << 30,
        storage_class_name: Some("local-path".into()),
        access_modes: vec![crate::api::ClaimAccessMode::ReadWriteOnce],
    };
    o.provision = Some(ProvisionStep::Create(req.clone()));
    // A suspended Transfer creates nothing, its claim included.
    t.spec.suspend = true;
    let p = plan(&t, &o);
    assert_eq!(p.status.phase, Phase::Suspended);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    t.spec.suspend = false;
    let p = advance(&mut t, &o);
    assert_eq!(p.actions, vec![Action::CreateClaim(req)]);
    assert_eq!(p.status.phase, Phase::Pending);
    assert_eq!(
        cond(&p, "Ready").message,
        "creating PersistentVolumeClaim copy (1024Mi, StorageClass local-path)"
    );
    assert!(
        p.notes
            .iter()
            .any(|n| n.reason == "ClaimProvisioned" && !n.warning)
    );
    assert_eq!(p.requeue, Some(RESYNC_PROVISIONED));

    o.provision = Some(ProvisionStep::Blocked(Blocked {
        reason: Reason::ClaimTooSmall,
        message: "too small".into(),
    }));
    let p = advance(&mut t, &o);
    assert_eq!(cond(&p, "Ready").reason, "ClaimTooSmall");
    assert!(p.actions.is_empty(), "{:?}", p.actions);

    o.provision = Some(ProvisionStep::Ready);
    let p = advance(&mut t, &o);
    assert!(
        p.actions
            .contains(&Action::CreateReceiver { run: 1, attempt: 1 })
    );
}

#[test]
fn a_source_half_mirrors_only_conditions_its_api_server_accepts() {
    let mut t = source_half();
    let mut a = answer(1, Phase::Running, None);
    let c = |type_: &str, reason: &str, message: String| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            message,
            observed_generation: None,
            last_transition_time: Time(Timestamp::from_second(1_800_000_000).expect("time")),
        }
    };
    a.status.conditions = vec![
        c("Ready", "Running", "m".repeat(40_000)),
        c("Injected", "Running", String::new()),
        c("Failed", "not a reason", String::new()),
    ];
    let p = advance(&mut t, &source_obs(0, Ok(a)));
    let kinds: Vec<&str> = p
        .status
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(kinds, ["Ready"]);
    assert_eq!(cond(&p, "Ready").message.len(), 1024);
}

/// A fan-out child at `secs`, its receiver ready since 0 and the fan-out's sender as given.
fn fan_out_obs(secs: i64, sender: Option<PodView>, serves_this: bool) -> Observed {
    let started = sender.is_some();
    let mut o = obs(secs);
    o.secrets = vec![names::secret_name(UID, 1, 1)];
    let mut recv = pod(1, 1, MoverRole::Receiver, PodPhase::Running, true);
    recv.created = Some(Timestamp::from_second(1_800_000_000).expect("time"));
    o.pods = vec![recv];
    o.fan_out_sender = Some(FanOutSender {
        serving: sender.filter(|_| serves_this),
        started,
    });
    o
}

const FAN_OUT_SENDER: &str = "ferry-parent-1-1-send";

fn fan_out_sender_pod(phase: PodPhase) -> PodView {
    PodView {
        name: FAN_OUT_SENDER.into(),
        node: Some("a".into()),
        ..pod(1, 1, MoverRole::Sender, phase, false)
    }
}

fn session(phase: MoverPhase, digest: &str) -> ProgressUpdate {
    ProgressUpdate {
        phase: phase as i32,
        digest: digest.into(),
        ..ProgressUpdate::default()
    }
}

/// A fan-out child served by the fan-out's sender, its session moving data; what it observed.
fn served_child(t: &mut Transfer) -> (Plan, Observed) {
    advance(t, &obs(0));
    let mut o = fan_out_obs(5, Some(fan_out_sender_pod(PodPhase::Running)), true);
    o.sender_progress = Some(session(MoverPhase::Transferring, ""));
    (advance(t, &o), o)
}

#[test]
fn a_fan_out_child_waits_for_the_fan_outs_sender_then_starts_its_own() {
    let mut t = transfer();
    advance(&mut t, &obs(0));
    let p = advance(&mut t, &fan_out_obs(5, None, false));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        cond(&p, "Ready")
            .message
            .contains("waiting for the fan-out's sender"),
        "{}",
        cond(&p, "Ready").message
    );
    assert_eq!(p.requeue, Some(RESYNC_FAN_OUT_SENDER));
    // The wait is up: a sender of its own.
    let p = advance(&mut t, &fan_out_obs(61, None, false));
    assert!(
        matches!(p.actions[..], [Action::CreateSender { .. }]),
        "{:?}",
        p.actions
    );
    // The fan-out's sender exists and serves others only: its own at once.
    let mut t = transfer();
    advance(&mut t, &obs(0));
    let o = fan_out_obs(5, Some(fan_out_sender_pod(PodPhase::Running)), false);
    let p = advance(&mut t, &o);
    assert!(
        matches!(p.actions[..], [Action::CreateSender { .. }]),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_fan_out_child_served_by_the_fan_outs_sender_succeeds_with_its_sessions_digest() {
    let mut t = transfer();
    let (p, mut o) = served_child(&mut t);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.status.phase, Phase::Running);
    assert_eq!(
        p.status.sender.as_ref().map(|s| s.pod.as_str()),
        Some(FAN_OUT_SENDER)
    );
    // Its session ended while the pod still serves the others: done, with that digest.
    o.sender_progress = Some(session(MoverPhase::Succeeded, "d1"));
    o.receiver_progress = Some(session(MoverPhase::Succeeded, "d1"));
    o.pods[0].phase = PodPhase::Succeeded;
    let p = advance(&mut t, &o);
    assert_eq!(
        p.status.phase,
        Phase::Succeeded,
        "{:?}",
        p.status.conditions
    );
    assert_eq!(p.status.digest.as_deref(), Some("d1"));
}

#[test]
fn a_fan_out_child_whose_session_failed_retries_with_a_sender_of_its_own() {
    let mut t = transfer();
    let (_, mut o) = served_child(&mut t);
    o.sender_progress = Some(ProgressUpdate {
        last_error: "receiver reset the connection".into(),
        error_kind: ferry_proto::wire::v1::ErrorKind::Network as i32,
        ..session(MoverPhase::Failed, "")
    });
    o.pods[0].phase = PodPhase::Failed;
    let p = advance(&mut t, &o);
    assert_eq!(p.status.phase, Phase::Retrying, "{:?}", p.status.conditions);
    assert!(
        p.status
            .last_error
            .as_ref()
            .is_some_and(|e| e.message.contains("receiver reset the connection")),
        "{:?}",
        p.status.last_error
    );
    // The fan-out's sender is not this child's to delete.
    assert!(
        !p.actions
            .contains(&Action::DeletePod(FAN_OUT_SENDER.into())),
        "{:?}",
        p.actions
    );
    // The next attempt is not served: a sender of its own.
    let mut o = fan_out_obs(600, Some(fan_out_sender_pod(PodPhase::Running)), true);
    o.pods = vec![pod(1, 2, MoverRole::Receiver, PodPhase::Running, true)];
    o.secrets = vec![names::secret_name(UID, 1, 2)];
    let p = advance(&mut t, &o);
    let p = if p.actions.is_empty() {
        advance(&mut t, &o)
    } else {
        p
    };
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::CreateSender { attempt: 2, .. })),
        "{:?}",
        p.actions
    );
}

#[test]
fn a_fan_out_child_whose_served_sender_is_gone_fails_the_attempt() {
    let mut t = transfer();
    served_child(&mut t);
    let mut o = fan_out_obs(6, None, false);
    o.sender_progress = None;
    let p = advance(&mut t, &o);
    assert_eq!(p.status.phase, Phase::Retrying, "{:?}", p.status.conditions);
    assert!(
        p.status.last_error.as_ref().is_some_and(|e| e
            .message
            .contains(&format!("sender pod {FAN_OUT_SENDER} disappeared"))),
        "{:?}",
        p.status.last_error
    );
}
