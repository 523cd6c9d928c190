//! The destination half of a cross-cluster Transfer runs the lifecycle of one cluster with the
//! other cluster's sender (as its operator reports it) in place of a local one: it waits for
//! the source half to call, publishes its receiver behind a Service, and stops its receiver
//! when the source half withdraws or stays silent longer than the grace.

use super::*;

impl Ctx<'_> {
    /// Destination half: the other cluster's sender of the current attempt, as its operator
    /// last reported it, seen as a pod of this attempt.
    pub(super) fn remote_sender(&self) -> Option<PodView> {
        let c = self.obs.remote.as_ref()?.counterpart.as_ref()?;
        let r = c.report.as_ref()?;
        if (r.run, r.attempt) != (self.st.run, self.st.attempts) {
            return None;
        }
        let phase = match r.state {
            SenderState::Pending => PodPhase::Pending,
            SenderState::Running => PodPhase::Running,
            SenderState::Succeeded => PodPhase::Succeeded,
            SenderState::Failed => PodPhase::Failed,
        };
        Some(PodView {
            name: format!("{}/{}", c.source.namespace, r.pod),
            phase,
            ready: phase == PodPhase::Running,
            ip: None,
            node: None,
            message: r.message.clone(),
            exit_code: r.exit_code,
            finished_at: None,
            created: None,
            stuck: None,
            deleting: false,
        })
    }

    /// Destination half: waits (receiver stopped) while the source half has not called, or
    /// has gone silent (longer than the grace) or withdrew (at once). A receiver that runs is left alone
    /// while this operator has not heard the source half yet but the grace is not up (it just
    /// started or took the lead, or the source cluster's operator is restarting).
    pub(super) fn await_counterpart(&mut self, t: &Transfer, uid: &str) -> Option<Duration> {
        let grace = self.obs.peer_silence_grace;
        let counterpart = self
            .obs
            .remote
            .as_ref()
            .and_then(|r| r.counterpart.as_ref());
        let withdrawn = counterpart.is_some_and(|c| c.withdrawn);
        let silence = self.silence(counterpart.map(|c| c.last_call));
        if counterpart.is_some() && !withdrawn && silence < grace {
            return None;
        }
        let paired = self.pod(MoverRole::Receiver, uid).is_some()
            || self
                .st
                .remote
                .as_ref()
                .is_some_and(|r| r.last_heard.is_some());
        if counterpart.is_none() && paired && silence < grace {
            return Some(POLL_REMOTE);
        }
        let remote = t.spec.source.remote.clone().unwrap_or_default();
        let peer = self.peer_cluster();
        self.stop_attempt(uid);
        self.st.phase = Phase::Pending;
        self.st.remote = Some(crate::api::RemoteStatus {
            cluster: peer.clone(),
            transfer_id: Some(names::transfer_id(uid, self.st.run)),
            receiver_address: None,
            last_heard: None,
        });
        self.cond(
            ConditionType::Ready,
            false,
            Reason::WaitingForCounterpart,
            &format!(
                "waiting for Transfer {}/{} in cluster {peer} (Peer {}) to pair: its operator has not called this cluster's cross-cluster endpoint in the last {} s (create that Transfer with destination.remote naming this one)",
                remote.namespace,
                remote.name,
                remote.peer,
                grace.as_secs()
            ),
        );
        Some(RESYNC_BLOCKED)
    }

    /// Destination half: the Service in front of the current receiver, and its address in
    /// status once the receiver accepts connections (the source half reads it from there).
    pub(super) fn publish_receiver(&mut self, uid: &str, recv: Option<&PodView>) {
        let (run, attempt) = (self.st.run, self.st.attempts);
        let remote = self.obs.remote.clone().unwrap_or_default();
        // Applied with each new receiver: the selector names the attempt.
        if recv.is_none() || !remote.service_exists {
            self.actions
                .push(Action::ApplyReceiverService { run, attempt });
        }
        let ready = recv.is_some_and(|r| r.ready && r.phase == PodPhase::Running);
        self.st.remote = Some(crate::api::RemoteStatus {
            cluster: self.peer_cluster(),
            transfer_id: Some(names::transfer_id(uid, run)),
            receiver_address: remote.receiver_address.filter(|_| ready),
            last_heard: None,
        });
    }

    pub(super) fn delete_receiver_service(&mut self, uid: &str) {
        if self.obs.remote.as_ref().is_some_and(|r| r.service_exists) {
            self.actions
                .push(Action::DeleteService(names::service_name(uid, self.st.run)));
        }
    }
}
