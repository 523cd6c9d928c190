//! Pod status as the kubelet reports it: phase from the containers' states and the restart policy,
//! conditions (Initialized, ContainersReady, Ready, PodReadyToStartContainers), container statuses
//! with exit codes, restart counts and termination messages.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// How a container ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started: Timestamp,
    pub finished: Timestamp,
}

/// A container's current state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started: Timestamp,
    },
    Terminated(Terminated),
}

/// What status needs to know about one container.
#[derive(Debug, Clone)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub state: State,
    pub last_terminated: Option<Terminated>,
    pub restart_count: i32,
    pub ready: bool,
    /// Whether a restart is scheduled (restartPolicy allows it after the last exit).
    pub restart_pending: bool,
}

impl ContainerView {
    fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    fn final_exit(&self) -> Option<i32> {
        match &self.state {
            State::Terminated(t) if !self.restart_pending => Some(t.exit_code),
            _ => None,
        }
    }
}

/// Whether restartPolicy restarts a container that exited with `exit_code`.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The pod phase. `init` are the init containers in order, `main` the app containers.
pub fn phase(init: &[ContainerView], main: &[ContainerView]) -> &'static str {
    if init
        .iter()
        .any(|c| matches!(c.final_exit(), Some(code) if code != 0))
    {
        return "Failed";
    }
    if !init.iter().all(|c| c.final_exit() == Some(0)) {
        return "Pending";
    }
    if main.iter().any(|c| c.is_running() || c.restart_pending) {
        return "Running";
    }
    let exits: Vec<Option<i32>> = main.iter().map(ContainerView::final_exit).collect();
    if !exits.is_empty() && exits.iter().all(Option::is_some) {
        return if exits.iter().all(|e| *e == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    "Pending"
}

fn terminated_state(t: &Terminated) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        message: t.message.clone(),
        started_at: Some(Time(t.started)),
        finished_at: Some(Time(t.finished)),
        container_id: None,
    }
}

fn container_status(c: &ContainerView) -> ContainerStatus {
    let state = match &c.state {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        State::Running { started } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started)),
            }),
            ..Default::default()
        },
        State::Terminated(t) => ContainerState {
            terminated: Some(terminated_state(t)),
            ..Default::default()
        },
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: String::new(),
        ready: c.ready,
        started: Some(c.is_running()),
        restart_count: c.restart_count,
        state: Some(state),
        last_state: c.last_terminated.as_ref().map(|t| ContainerState {
            terminated: Some(terminated_state(t)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn condition(type_: &str, ok: bool, now: Timestamp) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    }
}

/// The phase a pod ends in when it is deleted: Succeeded when every app container exited 0,
/// otherwise Failed, as the kubelet writes it before the object goes.
pub fn terminal_phase(main: &[ContainerView]) -> &'static str {
    let all_zero = !main.is_empty()
        && main
            .iter()
            .all(|c| matches!(&c.state, State::Terminated(t) if t.exit_code == 0));
    if all_zero { "Succeeded" } else { "Failed" }
}

/// Everything that goes into one status patch.
pub struct PodStatusInput<'a> {
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub start_time: Timestamp,
    pub init: &'a [ContainerView],
    pub main: &'a [ContainerView],
    /// Set while the pod cannot start (volume or env errors): shown as the containers' waiting message.
    pub blocked: Option<&'a str>,
}

/// The strategic-merge patch body for the pod's status subresource.
pub fn patch(input: &PodStatusInput<'_>) -> serde_json::Value {
    let now = Timestamp::now();
    let phase = phase(input.init, input.main);
    let inits_done = input.init.iter().all(|c| c.final_exit() == Some(0));
    let all_ready = !input.main.is_empty() && input.main.iter().all(|c| c.ready);
    let ready = all_ready && phase == "Running";
    let mut conditions = vec![
        condition("PodReadyToStartContainers", input.blocked.is_none(), now),
        condition("Initialized", inits_done, now),
        condition("ContainersReady", ready, now),
        condition("Ready", ready, now),
    ];
    if let Some(msg) = input.blocked {
        for c in &mut conditions {
            if c.type_ == "PodReadyToStartContainers" {
                c.reason = Some("ContainerCreating".into());
                c.message = Some(msg.to_string());
            }
        }
    }
    serde_json::json!({
        "status": {
            "phase": phase,
            "hostIP": input.host_ip,
            "hostIPs": [HostIP { ip: input.host_ip.to_string() }],
            "podIP": input.pod_ip,
            "podIPs": [PodIP { ip: input.pod_ip.to_string() }],
            "startTime": Time(input.start_time),
            "conditions": conditions,
            "initContainerStatuses": input.init.iter().map(container_status).collect::<Vec<_>>(),
            "containerStatuses": input.main.iter().map(container_status).collect::<Vec<_>>(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: State, restart_pending: bool) -> ContainerView {
        ContainerView {
            name: "c".into(),
            image: "i".into(),
            state,
            last_terminated: None,
            restart_count: 0,
            ready: false,
            restart_pending,
        }
    }

    fn exited(code: i32) -> State {
        State::Terminated(Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started: Timestamp::now(),
            finished: Timestamp::now(),
        })
    }

    #[test]
    fn phase_follows_containers_and_restart_policy() {
        let waiting = State::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        };
        let running = State::Running {
            started: Timestamp::now(),
        };
        assert_eq!(phase(&[], &[view(waiting.clone(), false)]), "Pending");
        assert_eq!(
            phase(&[], &[view(running.clone(), false), view(exited(0), false)]),
            "Running"
        );
        assert_eq!(
            phase(&[], &[view(exited(0), false), view(exited(0), false)]),
            "Succeeded"
        );
        assert_eq!(
            phase(&[], &[view(exited(0), false), view(exited(3), false)]),
            "Failed"
        );
        assert_eq!(phase(&[], &[view(exited(3), true)]), "Running");
        assert_eq!(
            phase(&[view(running, false)], &[view(waiting.clone(), false)]),
            "Pending"
        );
        assert_eq!(
            phase(&[view(exited(1), false)], &[view(waiting, false)]),
            "Failed"
        );
    }

    #[test]
    fn restart_policy_decides_on_exit_code() {
        assert!(should_restart("Always", 0));
        assert!(!should_restart("OnFailure", 0));
        assert!(should_restart("OnFailure", 2));
        assert!(!should_restart("Never", 2));
    }

    #[test]
    fn patch_reports_exit_code_message_and_ready_condition() {
        let mut done = view(exited(7), false);
        if let State::Terminated(t) = &mut done.state {
            t.message = Some("boom".into());
        }
        let body = patch(&PodStatusInput {
            pod_ip: "127.1.0.2",
            host_ip: "127.1.0.1",
            start_time: Timestamp::now(),
            init: &[],
            main: &[done],
            blocked: None,
        });
        let status = &body["status"];
        assert_eq!(status["phase"], "Failed");
        assert_eq!(status["podIP"], "127.1.0.2");
        let term = &status["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["exitCode"], 7);
        assert_eq!(term["message"], "boom");
        let ready = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
    }
}
