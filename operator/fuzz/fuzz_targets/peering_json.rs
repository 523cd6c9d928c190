//! What the other cluster's operator says, as JSON over the cross-cluster API, fed through the
//! pure plan of the half that hears it: a source half follows a `PairResponse` (the destination
//! half's status, run, attempt and receiver address), a destination half follows the
//! `SenderReport` of a `PairRequest`. Four reconciles in a row, pods appearing and going as the
//! plan asks. Must never panic (arithmetic on peer numbers included); the status it writes must
//! stay a valid object for this cluster's API server, which refuses a whole status patch over one
//! bad condition: it serializes, and every condition has a known type, a valid status and
//! reason, and a message within the server's 32 768 bytes.
#![no_main]

use std::time::Duration;

use ferry_operator::api::{Transfer, TransferSpec, is_condition_reason};
use ferry_operator::names::{self, MoverRole};
use ferry_operator::peering::registry::Counterpart;
use ferry_operator::peering::wire::{HalfRef, PairRequest, PairResponse};
use ferry_operator::plan::placement::{SidePlacement, VolumeRef};
use ferry_operator::plan::{self, Action, Observed, PodPhase, PodView, RemoteObserved};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
/// The API server's limit on a condition's message.
const MAX_CONDITION_MESSAGE: usize = 32_768;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, json)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok(answer) = serde_json::from_slice::<PairResponse>(json) {
            source_half(answer, mode);
        }
    } else if let Ok(request) = serde_json::from_slice::<PairRequest>(json) {
        destination_half(request, mode);
    }
});

fn transfer(spec: serde_json::Value) -> Transfer {
    let spec: TransferSpec = serde_json::from_value(spec).expect("spec");
    let mut t = Transfer::new("t", spec);
    t.metadata = ObjectMeta {
        name: Some("t".into()),
        namespace: Some("ml".into()),
        uid: Some(UID.into()),
        generation: Some(1),
        ..ObjectMeta::default()
    };
    t
}

fn observed(secs: i64, placement: (SidePlacement, SidePlacement), remote: RemoteObserved) -> Observed {
    Observed {
        now: Timestamp::from_second(1_800_000_000 + secs).expect("time"),
        placement: Ok(placement),
        pods: Vec::new(),
        secrets: Vec::new(),
        receiver_progress: None,
        sender_progress: None,
        may_start: true,
        queue: None,
        acting_since: Timestamp::from_second(1_800_000_000 - 3600).expect("time"),
        peer_silence_grace: Duration::from_secs(60),
        pending_timeout: Duration::from_secs(300),
        host_path_forbidden: false,
        root_movers_allowed: false,
        privileged_readers_allowed: false,
        priority_class_refused: None,
        remote: Some(remote),
        provision: None,
        fan_out_sender: None,
        swarm: None,
    }
}

fn side(node: Option<&str>, volume: VolumeRef) -> SidePlacement {
    SidePlacement {
        volume,
        sub_path: String::new(),
        node: node.map(Into::into),
    }
}

fn host(node: &str, path: &str) -> SidePlacement {
    side(Some(node), VolumeRef::HostPath { path: path.into() })
}

/// This cluster sends to `gpu/t` of Peer east, which answered `answer`.
fn source_half(answer: PairResponse, mode: u8) {
    let mut t = transfer(serde_json::json!({
        "source": {"hostPath": {"node": "a", "path": "/data/src"}},
        "destination": {"remote": {"peer": "east", "namespace": "gpu", "name": "t"}},
    }));
    let placement = (host("a", "/data/src"), side(None, VolumeRef::Remote));
    let mut pods = Vec::new();
    for round in 0..4 {
        let mut o = observed(
            round,
            placement.clone(),
            RemoteObserved {
                peer: Some(Ok("east".into())),
                answer: Some(Ok(answer.clone())),
                ..RemoteObserved::default()
            },
        );
        o.may_start = mode & 2 == 0;
        o.pods = pods.clone();
        let p = reconcile(&mut t, &o);
        for a in &p.actions {
            if let Action::CreateRemoteSender { run, attempt, address } = a {
                assert_eq!((*run, *attempt), (answer.run, answer.attempt));
                assert_eq!(Some(address), answer.receiver.as_ref());
            }
        }
        follow_pods(&mut pods, &p.actions, mode >> 2);
    }
}

/// This cluster receives from `ml/t` of Peer west, whose operator called with `request`.
fn destination_half(request: PairRequest, mode: u8) {
    let mut t = transfer(serde_json::json!({
        "source": {"remote": {"peer": "west", "namespace": "ml", "name": "t"}},
        "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
    }));
    let placement = (side(None, VolumeRef::Remote), host("b", "/data/dst"));
    let mut pods = Vec::new();
    for round in 0..4 {
        let now = Timestamp::from_second(1_800_000_000 + round).expect("time");
        let mut o = observed(
            round,
            placement.clone(),
            RemoteObserved {
                peer: Some(Ok("west".into())),
                counterpart: Some(Counterpart {
                    peer: "west".into(),
                    source: HalfRef {
                        namespace: request.source.namespace.clone(),
                        name: request.source.name.clone(),
                    },
                    report: request.sender.clone(),
                    last_call: now,
                    withdrawn: mode & 2 != 0 && round == 3,
                }),
                receiver_address: Some("10.101.0.12:30001".into()),
                service_exists: round > 0,
            ..RemoteObserved::default()
            },
        );
        o.pods = pods.clone();
        let p = reconcile(&mut t, &o);
        follow_pods(&mut pods, &p.actions, mode >> 2);
    }
}

/// One reconcile: the plan, checked, its status applied as the status patch would.
fn reconcile(t: &mut Transfer, o: &Observed) -> plan::Plan {
    let p = plan::plan(t, o);
    let json = serde_json::to_vec(&p.status).expect("the status serializes");
    assert!(!json.is_empty());
    for c in &p.status.conditions {
        assert!(
            c.message.len() <= MAX_CONDITION_MESSAGE,
            "condition {} has a {}-byte message",
            c.type_,
            c.message.len()
        );
        assert!(
            matches!(c.type_.as_str(), "Ready" | "Succeeded" | "Failed" | "Dedup"),
            "condition type {:?}",
            c.type_
        );
        assert!(matches!(c.status.as_str(), "True" | "False" | "Unknown"), "{:?}", c.status);
        assert!(is_condition_reason(&c.reason), "condition reason {:?}", c.reason);
    }
    t.status = Some(p.status.clone());
    p
}

/// Pods appear as the plan creates them (in a phase the input picks) and go as it deletes them.
fn follow_pods(pods: &mut Vec<PodView>, actions: &[Action], phase_bits: u8) {
    let phase = match phase_bits % 4 {
        0 => PodPhase::Pending,
        1 => PodPhase::Running,
        2 => PodPhase::Succeeded,
        _ => PodPhase::Failed,
    };
    for a in actions {
        let created = match a {
            Action::CreateRemoteSender { run, attempt, .. } => Some((*run, *attempt, MoverRole::Sender)),
            Action::CreateReceiver { run, attempt } => Some((*run, *attempt, MoverRole::Receiver)),
            Action::DeletePod(name) => {
                pods.retain(|p| &p.name != name);
                None
            }
            _ => None,
        };
        if let Some((run, attempt, role)) = created {
            pods.push(PodView {
                name: names::pod_name(UID, run, attempt, role),
                phase,
                ready: phase == PodPhase::Running,
                ip: Some("127.2.0.5".into()),
                node: Some("b".into()),
                message: (phase == PodPhase::Failed).then(|| "connection reset".into()),
                exit_code: (phase == PodPhase::Failed).then_some(13),
                finished_at: None,
                created: None,
                stuck: None,
                deleting: false,
            });
        }
    }
}
