//! The gRPC `ferry.progress.v1.Progress` service over mutual TLS, and a client for it (used by
//! the operator and by tests).

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::progress::v1 as pb;
use ferry_proto::progress::v1::progress_server::{Progress as ProgressApi, ProgressServer};
use futures::Stream;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::counters::{Phase, Progress, Snapshot};
use crate::net::PeerIdentity;

#[derive(Debug, thiserror::Error)]
pub enum ProgressServiceError {
    #[error("progress service failed")]
    Serve(#[source] tonic::transport::Error),
}

fn to_pb(p: &Progress, s: &Snapshot, current: f64) -> pb::ProgressUpdate {
    let phase = match s.phase {
        Phase::Connecting => pb::Phase::Connecting,
        Phase::Transferring => pb::Phase::Transferring,
        Phase::Finishing => pb::Phase::Finishing,
        Phase::Succeeded => pb::Phase::Succeeded,
        Phase::Failed => pb::Phase::Failed,
    };
    pb::ProgressUpdate {
        phase: phase as i32,
        files_done: s.files_done,
        files_total: s.files_total,
        bytes_done: s.bytes_done,
        bytes_total: s.bytes_total,
        totals_final: s.totals_final,
        wire_bytes: s.wire_bytes,
        throughput_current: current,
        throughput_average: if s.elapsed > 0.0 {
            s.bytes_done as f64 / s.elapsed
        } else {
            0.0
        },
        last_error: s.last_error.clone(),
        error_kind: s.error_kind.map_or(0, |k| k.to_pb() as i32),
        permanent: s.permanent,
        skipped: s.skipped,
        resumed_bytes: s.resumed_bytes,
        elapsed_seconds: s.elapsed,
        transfer_id: p.transfer_id.clone(),
        role: p.role.clone(),
        dedup_blocks: s.dedup_blocks,
        dedup_bytes: s.dedup_bytes,
        digest: s.digest.clone(),
        unreadable_paths: s.unreadable.paths.clone(),
        unreadable_count: s.unreadable.count,
    }
}

struct Service {
    progress: Arc<Progress>,
    /// A sender serving several Transfers: each one's session, by its transfer id.
    sessions: Arc<BTreeMap<String, Arc<Progress>>>,
}

impl Service {
    /// What a client is shown: the session of the Transfer its certificate names (its operator
    /// asking about that destination), or else the whole process's counters.
    fn progress_for<T>(&self, req: &Request<T>) -> Arc<Progress> {
        req.extensions()
            .get::<PeerIdentity>()
            .and_then(|p| p.identity.as_ref())
            .and_then(|id| self.sessions.get(&id.transfer_id))
            .unwrap_or(&self.progress)
            .clone()
    }
}

/// The window "current throughput" is measured over. Bytes are counted per verified block
/// (up to 4 MiB), so a window shorter than a few blocks' time would swing between zero and
/// double the real rate.
const RATE_WINDOW: Duration = Duration::from_secs(3);

/// Adds a sample and returns bytes per second since the oldest sample within [`RATE_WINDOW`].
fn current_rate(window: &mut VecDeque<(u64, Instant)>, bytes: u64, now: Instant) -> f64 {
    window.push_back((bytes, now));
    while window.len() > 2
        && window
            .get(1)
            .is_some_and(|(_, t)| now.duration_since(*t) >= RATE_WINDOW)
    {
        window.pop_front();
    }
    match window.front() {
        Some(&(b, t)) if now > t => {
            bytes.saturating_sub(b) as f64 / now.duration_since(t).as_secs_f64().max(1e-3)
        }
        _ => 0.0,
    }
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::ProgressUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl ProgressApi for Service {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        req: Request<pb::ProgressRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let interval =
            Duration::from_millis(u64::from(req.get_ref().interval_ms.clamp(100, 60_000)));
        let progress = self.progress_for(&req);
        // State: recent (bytes, instant) samples, finished.
        let init = (VecDeque::<(u64, Instant)>::new(), false);
        let stream = futures::stream::unfold(init, move |(mut window, finished)| {
            let progress = progress.clone();
            async move {
                if finished {
                    // Polled again after the final update: the client has it.
                    progress.mark_outcome_delivered();
                    return None;
                }
                if !window.is_empty() {
                    // The final update goes out at once, not at the next tick.
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = progress.until_finished() => {}
                    }
                }
                let s = progress.snapshot();
                let now = Instant::now();
                let current = current_rate(&mut window, s.bytes_done, now);
                let done = matches!(s.phase, Phase::Succeeded | Phase::Failed);
                let update = to_pb(&progress, &s, current);
                Some((Ok(update), (window, done)))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get(
        &self,
        req: Request<pb::ProgressRequest>,
    ) -> Result<Response<pb::ProgressUpdate>, Status> {
        let progress = self.progress_for(&req);
        let s = progress.snapshot();
        if s.phase.is_final() {
            progress.mark_outcome_delivered();
        }
        Ok(Response::new(to_pb(&progress, &s, 0.0)))
    }
}

/// Serves the progress service on `listener`; `tls` must require client certificates (build it
/// with `net::server_config(files, &[Role::Operator])`). Handshakes that fail or stall are
/// dropped after 10 s without affecting other clients.
pub async fn serve_progress(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    progress: Arc<Progress>,
) -> Result<(), ProgressServiceError> {
    serve_progress_of_sessions(listener, tls, progress, BTreeMap::new()).await
}

/// [`serve_progress`] for a sender serving several Transfers: an operator whose certificate
/// names one of `sessions`' transfer ids is shown that session alone (its destination's
/// progress and outcome); any other is shown `progress`, the sum.
pub async fn serve_progress_of_sessions(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    progress: Arc<Progress>,
    sessions: BTreeMap<String, Arc<Progress>>,
) -> Result<(), ProgressServiceError> {
    let incoming = crate::net::tls_incoming(
        listener,
        move || tls.clone(),
        "progress",
        // The operator keeps one progress stream open for a session's life: never idle.
        crate::net::AcceptLimits {
            idle: Duration::MAX,
            ..crate::net::AcceptLimits::default()
        }
        .within_fd_limit(),
    );
    let sessions = Arc::new(sessions);
    tonic::transport::Server::builder()
        .add_service(ProgressServer::new(Service { progress, sessions }))
        .serve_with_incoming(incoming)
        .await
        .map_err(ProgressServiceError::Serve)
}

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn current_rate_spans_block_sized_steps() {
        let t0 = Instant::now();
        let mut w = VecDeque::new();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(current_rate(&mut w, 0, at(0)), 0.0);
        // 4 MiB arrive once a second; samples every 500 ms see steps, not a zero rate.
        let mut last = 0.0;
        for i in 1..=8u64 {
            let bytes = (i / 2) * (4 << 20);
            last = current_rate(&mut w, bytes, at(i * 500));
            if i >= 2 {
                assert!(last > 1e6, "sample {i}: {last}");
            }
        }
        assert!((2.5e6..6e6).contains(&last), "{last}");
        assert!(w.len() <= 8, "the window stays bounded: {}", w.len());
    }
}
