//! A fan-out child's first attempt is served by the fan-out's sender of the run: one pod that
//! reads the source once for every destination it serves, with one session per destination.
//! The child sees that pod as its own sender, with its own session's outcome as the exit: its
//! operator identity reads that session alone from the pod's progress port, so its digest,
//! error and verdict are its destination's. A retry runs a sender of its own.

use super::*;

impl Ctx<'_> {
    /// The fan-out's sender as this attempt's sender, and its pod name: while it serves this
    /// child, or after it served it (gone: the attempt lost its sender). `own` is the name of
    /// the child's own sender of this attempt.
    pub(super) fn fan_out_sender(&self, own: &str) -> Option<(Option<PodView>, String)> {
        let fos = self.obs.fan_out_sender.as_ref()?;
        if self.st.attempts != 1 {
            return None;
        }
        if let Some(pod) = &fos.serving {
            let view = served_view(pod, self.obs.sender_progress.as_ref());
            return Some((Some(view), pod.name.clone()));
        }
        let served_before = self.st.sender.as_ref().filter(|s| s.pod != own)?;
        Some((None, served_before.pod.clone()))
    }

    /// How much longer this attempt waits for the fan-out's sender before it starts one of its
    /// own, with its receiver `recv` ready: None when it does not wait (a retry, a sender that
    /// exists and serves others, the wait is up).
    pub(super) fn awaits_fan_out_sender(&self, recv: &PodView) -> Option<Duration> {
        let fos = self.obs.fan_out_sender.as_ref()?;
        if self.st.attempts != 1 || fos.started {
            return None;
        }
        let since = recv.created.unwrap_or(self.obs.now);
        let waited = until(since, self.obs.now);
        (waited < FAN_OUT_SENDER_WAIT).then(|| FAN_OUT_SENDER_WAIT - waited)
    }
}

/// The fan-out's sender pod as one destination's sender: the pod while this destination's
/// session runs; Succeeded or Failed once the session ended, whatever the other destinations'
/// sessions do. It carries no exit status: the pod's is not this session's, and the session's
/// error kind and permanence are read from its final progress update, as for any mover
/// without one.
pub(super) fn served_view(pod: &PodView, session: Option<&ProgressUpdate>) -> PodView {
    let mut view = pod.clone();
    let Some(u) = session else {
        return view;
    };
    match MoverPhase::try_from(u.phase) {
        Ok(MoverPhase::Succeeded) => {
            view.phase = PodPhase::Succeeded;
            view.exit_code = None;
            view.message = None;
        }
        Ok(MoverPhase::Failed) => {
            view.phase = PodPhase::Failed;
            view.exit_code = None;
            view.message = Some(u.last_error.clone());
        }
        _ => {}
    }
    view
}
