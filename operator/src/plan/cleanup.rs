//! What happens when a Transfer is deleted (pure): its movers stop, then a short pod on the
//! destination removes the staging data of its runs, then the finalizer goes. A cleanup that
//! cannot finish (its node is gone) gives up after [`CLEANUP_GIVE_UP`] with a warning, so a
//! Transfer never stays Terminating forever.

use std::time::Duration;

use crate::plan::{Note, PodPhase, PodView};

/// How long a deleted Transfer waits for its cleanup before the finalizer goes anyway.
pub const CLEANUP_GIVE_UP: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupAction {
    DeletePod(String),
    CreateCleanupPod,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupPlan {
    pub actions: Vec<CleanupAction>,
    /// Remove the finalizer now.
    pub done: bool,
    pub note: Option<Note>,
}

/// The next cleanup step. `ran` is whether any run started (else nothing was written);
/// `destination_known` whether the destination can still be placed; `pods` are every pod of the
/// Transfer, including the cleanup pod named `cleaner`.
pub fn plan_cleanup(
    ran: bool,
    destination_known: bool,
    pods: &[PodView],
    cleaner: &str,
    deleting_for: Duration,
) -> CleanupPlan {
    let mut plan = CleanupPlan {
        actions: Vec::new(),
        done: false,
        note: None,
    };
    let movers: Vec<&PodView> = pods.iter().filter(|p| p.name != cleaner).collect();
    let cleanup = pods.iter().find(|p| p.name == cleaner);
    if deleting_for >= CLEANUP_GIVE_UP {
        plan.actions = pods
            .iter()
            .filter(|p| !p.deleting)
            .map(|p| CleanupAction::DeletePod(p.name.clone()))
            .collect();
        plan.done = true;
        plan.note = Some(Note {
            warning: true,
            reason: "CleanupAbandoned",
            message: format!(
                "staging data may remain in the destination: cleanup did not finish within {} s",
                CLEANUP_GIVE_UP.as_secs()
            ),
        });
        return plan;
    }
    if !movers.is_empty() {
        // The receiver must be gone before its staging directory is removed.
        plan.actions = movers
            .iter()
            .filter(|p| !p.deleting)
            .map(|p| CleanupAction::DeletePod(p.name.clone()))
            .collect();
        return plan;
    }
    if !ran || !destination_known {
        plan.done = true;
        return plan;
    }
    match cleanup {
        None => plan.actions.push(CleanupAction::CreateCleanupPod),
        Some(p) if p.phase == PodPhase::Succeeded => {
            plan.actions.push(CleanupAction::DeletePod(p.name.clone()));
            plan.done = true;
        }
        Some(p) if p.phase == PodPhase::Failed => {
            plan.actions.push(CleanupAction::DeletePod(p.name.clone()));
            plan.done = true;
            plan.note = Some(Note {
                warning: true,
                reason: "CleanupFailed",
                message: format!(
                    "staging data could not be removed from the destination: {}",
                    p.message.clone().unwrap_or_else(|| "no message".into())
                ),
            });
        }
        Some(_) => {}
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: PodPhase) -> PodView {
        PodView {
            name: name.into(),
            phase,
            ready: false,
            ip: None,
            node: None,
            message: None,
            exit_code: None,
            finished_at: None,
            created: None,
            stuck: None,
            deleting: false,
        }
    }

    #[test]
    fn movers_go_first_then_the_cleaner_runs_then_the_finalizer_goes() {
        let t = Duration::from_secs(1);
        let p = plan_cleanup(true, true, &[pod("m", PodPhase::Running)], "c", t);
        assert_eq!(p.actions, vec![CleanupAction::DeletePod("m".into())]);
        assert!(!p.done);
        let p = plan_cleanup(true, true, &[], "c", t);
        assert_eq!(p.actions, vec![CleanupAction::CreateCleanupPod]);
        let p = plan_cleanup(true, true, &[pod("c", PodPhase::Running)], "c", t);
        assert!(p.actions.is_empty() && !p.done);
        let p = plan_cleanup(true, true, &[pod("c", PodPhase::Succeeded)], "c", t);
        assert!(p.done && p.note.is_none());
        let p = plan_cleanup(true, true, &[pod("c", PodPhase::Failed)], "c", t);
        assert!(p.done && p.note.as_ref().is_some_and(|n| n.warning));
    }

    #[test]
    fn nothing_to_clean_or_no_way_to_clean_finishes_at_once() {
        let t = Duration::from_secs(1);
        assert!(plan_cleanup(false, true, &[], "c", t).done);
        assert!(plan_cleanup(true, false, &[], "c", t).done);
        let stuck = plan_cleanup(
            true,
            true,
            &[pod("c", PodPhase::Pending)],
            "c",
            CLEANUP_GIVE_UP,
        );
        assert!(stuck.done);
        assert_eq!(stuck.note.map(|n| n.reason), Some("CleanupAbandoned"));
    }
}
