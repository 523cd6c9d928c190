//! What `trigger`, `suspend`, `resume` and `delete` change, decided from the Transfer as read:
//! the merge patch to send (none when it would change nothing) and the line to print. The
//! commands module reads, sends and prints.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use serde_json::{Value, json};

use ferry_api::Transfer;
use ferry_api::names::LABEL_FAN_OUT_OF;

/// A change to one field of a Transfer's spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecVerb {
    /// A new `spec.trigger`: a finished Transfer runs again (a running one after its run).
    Trigger,
    Suspend,
    Resume,
}

/// The outcome of planning a verb.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The merge patch to send, or `None` when the Transfer already is as asked.
    pub patch: Option<Value>,
    /// What to tell the user once the patch (if any) was accepted.
    pub message: String,
}

/// Why a verb is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A fan-out's destination: its spec is the fan-out's (written back on every change).
    #[error(
        "transfer {namespace}/{name} is a destination of fan-out {fan_out}: its fan-out rewrites its spec, so {verb} {fan_out} instead"
    )]
    FanOutChild {
        namespace: String,
        name: String,
        fan_out: String,
        verb: &'static str,
    },
}

impl SpecVerb {
    pub fn name(self) -> &'static str {
        match self {
            SpecVerb::Trigger => "trigger",
            SpecVerb::Suspend => "suspend",
            SpecVerb::Resume => "resume",
        }
    }
}

/// The fan-out that owns `t`, when it is one's destination.
fn fan_out_parent(t: &Transfer) -> Option<String> {
    t.labels().get(LABEL_FAN_OUT_OF)?;
    Some(
        t.owner_references()
            .iter()
            .find(|o| o.kind == "Transfer")
            .map_or_else(|| "its fan-out".to_owned(), |o| o.name.clone()),
    )
}

/// Refuses a verb on a fan-out's destination, naming the fan-out to act on.
pub fn refuse_child(t: &Transfer, verb: &'static str) -> Result<(), Refused> {
    match fan_out_parent(t) {
        Some(fan_out) => Err(Refused::FanOutChild {
            namespace: t.namespace().unwrap_or_default(),
            name: t.name_any(),
            fan_out,
            verb,
        }),
        None => Ok(()),
    }
}

/// Plans `verb` on `t` at `now`. The trigger is `now` to the nanosecond, so two triggers in a
/// row are two changes.
pub fn plan(verb: SpecVerb, t: &Transfer, now: Timestamp) -> Result<Change, Refused> {
    refuse_child(t, verb.name())?;
    let who = format!("transfer.ferry.dev/{}", t.name_any());
    let status = t.status.clone().unwrap_or_default();
    Ok(match verb {
        SpecVerb::Trigger => {
            let mut message = if status.run == 0 {
                format!("{who} triggered: its first run has not started yet")
            } else if status.phase.is_finished() {
                format!("{who} triggered: run {} starts", status.run + 1)
            } else {
                format!(
                    "{who} triggered: run {} starts when run {} finishes",
                    status.run + 1,
                    status.run
                )
            };
            if t.spec.suspend {
                message.push_str(" (it is suspended: `kubectl ferry resume` lets it run)");
            }
            Change {
                patch: Some(json!({"spec": {"trigger": now.to_string()}})),
                message,
            }
        }
        SpecVerb::Suspend if t.spec.suspend => Change {
            patch: None,
            message: format!("{who} is suspended already"),
        },
        SpecVerb::Suspend => Change {
            patch: Some(json!({"spec": {"suspend": true}})),
            message: format!(
                "{who} suspended: its movers stop; `kubectl ferry resume {}` continues where it stopped",
                t.name_any()
            ),
        },
        SpecVerb::Resume if !t.spec.suspend => Change {
            patch: None,
            message: format!("{who} is not suspended"),
        },
        SpecVerb::Resume => Change {
            patch: Some(json!({"spec": {"suspend": false}})),
            message: format!("{who} resumed"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{Phase, TransferStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn transfer(run: u32, phase: Phase, suspend: bool) -> Transfer {
        let spec: ferry_api::TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"hostPath": {"node": "a", "path": "/data/src"}},
            "destination": {"hostPath": {"node": "b", "path": "/data/dst"}},
        }))
        .expect("spec");
        let mut t = Transfer::new("t", spec);
        t.metadata.namespace = Some("ml".into());
        t.metadata.uid = Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into());
        t.metadata.generation = Some(1);
        t.spec.suspend = suspend;
        t.status = Some(TransferStatus {
            run,
            phase,
            ..TransferStatus::default()
        });
        t
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("time")
    }

    #[test]
    fn a_trigger_is_always_a_new_value_and_says_when_the_run_starts() {
        let finished = plan(
            SpecVerb::Trigger,
            &transfer(3, Phase::Succeeded, false),
            now(),
        )
        .expect("plan");
        assert_eq!(
            finished.patch,
            Some(json!({"spec": {"trigger": "2027-01-15T08:00:00Z"}}))
        );
        assert_eq!(
            finished.message,
            "transfer.ferry.dev/t triggered: run 4 starts"
        );
        let later = plan(
            SpecVerb::Trigger,
            &transfer(3, Phase::Succeeded, false),
            now() + std::time::Duration::from_nanos(1),
        )
        .expect("plan");
        assert_ne!(
            later.patch, finished.patch,
            "a second trigger must change the field"
        );

        let running = plan(
            SpecVerb::Trigger,
            &transfer(2, Phase::Running, false),
            now(),
        )
        .expect("plan");
        assert_eq!(
            running.message,
            "transfer.ferry.dev/t triggered: run 3 starts when run 2 finishes"
        );
        let new = plan(SpecVerb::Trigger, &transfer(0, Phase::Pending, true), now()).expect("plan");
        assert!(
            new.message.contains("first run has not started"),
            "{}",
            new.message
        );
        assert!(new.message.contains("it is suspended"), "{}", new.message);
    }

    #[test]
    fn suspend_and_resume_patch_only_what_changes() {
        let running = transfer(1, Phase::Running, false);
        let p = plan(SpecVerb::Suspend, &running, now()).expect("plan");
        assert_eq!(p.patch, Some(json!({"spec": {"suspend": true}})));
        assert!(
            p.message.contains("kubectl ferry resume t"),
            "{}",
            p.message
        );
        let p = plan(SpecVerb::Resume, &running, now()).expect("plan");
        assert_eq!(p.patch, None);
        assert_eq!(p.message, "transfer.ferry.dev/t is not suspended");

        let suspended = transfer(1, Phase::Running, true);
        assert_eq!(
            plan(SpecVerb::Suspend, &suspended, now())
                .expect("plan")
                .patch,
            None
        );
        assert_eq!(
            plan(SpecVerb::Resume, &suspended, now())
                .expect("plan")
                .patch,
            Some(json!({"spec": {"suspend": false}}))
        );
    }

    #[test]
    fn a_fan_out_destination_is_refused_naming_its_fan_out() {
        let mut child = transfer(1, Phase::Running, false);
        child
            .labels_mut()
            .insert(LABEL_FAN_OUT_OF.to_owned(), "uid-1".to_owned());
        child.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "ferry.dev/v1alpha1".into(),
            kind: "Transfer".into(),
            name: "imagenet".into(),
            uid: "uid-1".into(),
            ..OwnerReference::default()
        }]);
        for verb in [SpecVerb::Trigger, SpecVerb::Suspend, SpecVerb::Resume] {
            let err = plan(verb, &child, now()).expect_err("a child is refused");
            assert_eq!(
                err.to_string(),
                format!(
                    "transfer ml/t is a destination of fan-out imagenet: its fan-out rewrites its spec, so {} imagenet instead",
                    verb.name()
                )
            );
        }
        assert!(refuse_child(&child, "delete").is_err());
        assert!(refuse_child(&transfer(1, Phase::Running, false), "delete").is_ok());
    }
}
