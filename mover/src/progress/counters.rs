//! Counters shared by the session tasks and the progress service.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use ferry_proto::kind::{ErrorKind, Failure};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Connecting = 1,
    Transferring = 2,
    Finishing = 3,
    Succeeded = 4,
    Failed = 5,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    fn from_u8(v: u8) -> Self {
        match v {
            2 => Self::Transferring,
            3 => Self::Finishing,
            4 => Self::Succeeded,
            5 => Self::Failed,
            _ => Self::Connecting,
        }
    }
}

/// Counts what this end did: the live counters of a local copy, a sender or a receiver, read by
/// the TTY bar ([`crate::report::ProgressBar`]) and the gRPC progress service. Totals grow as the
/// walk discovers entries. On the receiver and in a local copy, `bytes_done`/`files_done` are what
/// was written and committed; on the sender they are what was handed to the socket (behind the
/// bandwidth limiter) or found at the receiver, until the receiver's Summary replaces them with
/// what it wrote.
#[derive(Debug)]
pub struct Progress {
    phase: AtomicU8,
    pub files_done: AtomicU64,
    pub files_total: AtomicU64,
    pub bytes_done: AtomicU64,
    pub bytes_total: AtomicU64,
    pub totals_final: AtomicBool,
    pub wire_bytes: std::sync::Arc<AtomicU64>,
    pub skipped: AtomicU64,
    /// Files that could not be copied (local copy; each reported on stderr).
    pub failed: AtomicU64,
    pub resumed_bytes: AtomicU64,
    /// Blocks (and their bytes) the receiver took from its block store instead of the wire.
    pub dedup_blocks: AtomicU64,
    pub dedup_bytes: AtomicU64,
    /// Bytes read only to hash them (the sender's `--checksum` walk and digest reads, the
    /// receiver's digest reads): work that moves no data, reported in Busy frames.
    pub hashed_bytes: AtomicU64,
    last_error: Mutex<String>,
    /// Where the fault behind `last_error` lies.
    error_kind: Mutex<Option<Failure>>,
    /// The transfer digest (hex) once this end computed it.
    digest: Mutex<String>,
    /// Source entries the sender left out because it may not read them (`--skip-unreadable`).
    unreadable: Mutex<Unreadable>,
    start: Mutex<Instant>,
    pub transfer_id: String,
    pub role: String,
    /// Woken when the phase becomes final.
    finished: tokio::sync::Notify,
    /// A progress client has been handed the final update.
    outcome_delivered: AtomicBool,
    /// A long-running receiver's counters, which a session's also count into (see [`Progress::for_session`]).
    parent: Option<std::sync::Arc<Progress>>,
}

/// A consistent-enough copy of the counters.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub phase: Phase,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub totals_final: bool,
    pub wire_bytes: u64,
    pub skipped: u64,
    pub failed: u64,
    pub resumed_bytes: u64,
    pub dedup_blocks: u64,
    pub dedup_bytes: u64,
    pub last_error: String,
    pub error_kind: Option<ErrorKind>,
    /// With `error_kind`: a retry cannot help.
    pub permanent: bool,
    /// The transfer digest (hex), empty until this end computed it.
    pub digest: String,
    pub elapsed: f64,
    /// Source entries left out as unreadable: how many, and the first few names.
    pub unreadable: Unreadable,
}

/// Most unreadable entries named in a progress update and a summary (the count goes on): the
/// operator copies them into a status, which must stay small.
pub const MAX_UNREADABLE_PATHS: usize = 100;

/// Source entries the sender left out because it may not read them (`--skip-unreadable`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unreadable {
    pub count: u64,
    /// The first [`MAX_UNREADABLE_PATHS`], relative to the source root.
    pub paths: Vec<String>,
}

impl Unreadable {
    pub fn add(&mut self, rel: &str) {
        self.count += 1;
        if self.paths.len() < MAX_UNREADABLE_PATHS {
            self.paths.push(rel.to_owned());
        }
    }
}

impl Progress {
    /// A counter that grows while this end moves or hashes data (sent in Busy frames).
    pub fn work(&self) -> u64 {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        l(&self.bytes_done)
            .wrapping_add(l(&self.hashed_bytes))
            .wrapping_add(l(&self.files_done))
            .wrapping_add(l(&self.files_total))
            .wrapping_add(l(&self.skipped))
            .wrapping_add(l(&self.resumed_bytes))
            .wrapping_add(l(&self.dedup_bytes))
    }

    pub fn new(transfer_id: &str, role: &str) -> Self {
        Self {
            phase: AtomicU8::new(Phase::Connecting as u8),
            files_done: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            totals_final: AtomicBool::new(false),
            wire_bytes: Default::default(),
            skipped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            resumed_bytes: AtomicU64::new(0),
            dedup_blocks: AtomicU64::new(0),
            dedup_bytes: AtomicU64::new(0),
            hashed_bytes: AtomicU64::new(0),
            last_error: Mutex::new(String::new()),
            error_kind: Mutex::new(None),
            digest: Mutex::new(String::new()),
            unreadable: Mutex::new(Unreadable::default()),
            start: Mutex::new(Instant::now()),
            transfer_id: transfer_id.to_owned(),
            role: role.to_owned(),
            finished: tokio::sync::Notify::new(),
            outcome_delivered: AtomicBool::new(false),
            parent: None,
        }
    }

    /// One session's counters beneath a receiver that serves many: each session's summary counts
    /// only its own files and bytes, while what it adds also counts in `parent`, which the
    /// receiver's progress bar and service follow. The wire counter is the session's own (its
    /// streams count into it once the session is assembled); [`Progress::close_session`] adds it
    /// to the parent's.
    pub fn for_session(parent: &std::sync::Arc<Progress>) -> std::sync::Arc<Progress> {
        Self::for_session_as(parent, &parent.transfer_id)
    }

    /// [`Progress::for_session`] for the session of another Transfer (a sender serving several
    /// reports each one's session under its own transfer id).
    pub fn for_session_as(
        parent: &std::sync::Arc<Progress>,
        transfer_id: &str,
    ) -> std::sync::Arc<Progress> {
        let mut p = Progress::new(transfer_id, &parent.role);
        p.parent = Some(parent.clone());
        std::sync::Arc::new(p)
    }

    /// A session made by [`Progress::for_session`] ended: its wire bytes count in the parent's.
    pub fn close_session(&self) {
        if let Some(parent) = &self.parent {
            parent
                .wire_bytes
                .fetch_add(self.wire_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The counter of `other` that `c` (one of this Progress's counters) stands for.
    fn counterpart<'a>(&self, c: &AtomicU64, other: &'a Progress) -> Option<&'a AtomicU64> {
        let pairs = [
            (&self.files_done, &other.files_done),
            (&self.files_total, &other.files_total),
            (&self.bytes_done, &other.bytes_done),
            (&self.bytes_total, &other.bytes_total),
            (&self.skipped, &other.skipped),
            (&self.failed, &other.failed),
            (&self.resumed_bytes, &other.resumed_bytes),
            (&self.dedup_blocks, &other.dedup_blocks),
            (&self.dedup_bytes, &other.dedup_bytes),
            (&self.hashed_bytes, &other.hashed_bytes),
        ];
        pairs
            .into_iter()
            .find(|(mine, _)| std::ptr::eq(*mine, c))
            .map(|(_, theirs)| theirs)
    }

    pub fn set_phase(&self, p: Phase) {
        if p == Phase::Transferring
            && let Ok(mut s) = self.start.lock()
        {
            *s = Instant::now();
        }
        self.phase.store(p as u8, Ordering::Relaxed);
        if p.is_final() {
            self.finished.notify_waiters();
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// Returns once the phase is Succeeded or Failed.
    pub async fn until_finished(&self) {
        loop {
            let notified = self.finished.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the two is not missed.
            notified.as_mut().enable();
            if self.phase().is_final() {
                return;
            }
            notified.await;
        }
    }

    /// Records that a progress client received the final update.
    pub fn mark_outcome_delivered(&self) {
        self.outcome_delivered.store(true, Ordering::Relaxed);
    }

    /// After the outcome: waits until a progress client (the operator) has received the final
    /// update, or `max` passed, so a mover that exits right after its transfer does not take its
    /// outcome with it.
    pub async fn linger_for_watchers(&self, max: std::time::Duration) {
        self.linger_for_watchers_of(&[], max).await;
    }

    /// [`Progress::linger_for_watchers`] for a sender serving several Transfers, whose
    /// operator reads each one's session: until every session's outcome, or this one's, was
    /// handed to a client.
    pub async fn linger_for_watchers_of(
        &self,
        sessions: &[std::sync::Arc<Progress>],
        max: std::time::Duration,
    ) {
        let delivered = |p: &Progress| p.outcome_delivered.load(Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + max;
        while !(delivered(self) || (!sessions.is_empty() && sessions.iter().all(|s| delivered(s))))
        {
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // The update was handed to the gRPC stack; give it a moment to reach the socket.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    pub fn set_error(&self, e: &str) {
        if let Ok(mut s) = self.last_error.lock() {
            *s = e.chars().take(1024).collect();
        }
    }

    /// Records why this end failed: the message and where the fault lies.
    pub fn set_failure(&self, failure: Failure, message: &str) {
        if let Ok(mut k) = self.error_kind.lock() {
            *k = Some(failure);
        }
        self.set_error(message);
    }

    /// Records the transfer digest (set before the final phase, so the final update has it).
    pub fn set_digest(&self, hex: &str) {
        if let Ok(mut d) = self.digest.lock() {
            *d = hex.to_owned();
        }
    }

    /// The sender left the source entry `rel` out: it may not read it.
    pub fn note_unreadable(&self, rel: &str) {
        if let Ok(mut u) = self.unreadable.lock() {
            u.add(rel);
        }
    }

    pub fn unreadable(&self) -> Unreadable {
        self.unreadable
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default()
    }

    pub fn add(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
        if let Some(parent) = &self.parent
            && let Some(theirs) = self.counterpart(c, parent)
        {
            theirs.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The walk found `files` more files holding `bytes`.
    pub fn add_total(&self, files: u64, bytes: u64) {
        self.add(&self.files_total, files);
        self.add(&self.bytes_total, bytes);
    }

    /// `files` more files holding `bytes` are written.
    pub fn add_done(&self, files: u64, bytes: u64) {
        self.add(&self.files_done, files);
        self.add(&self.bytes_done, bytes);
    }

    pub fn add_skipped(&self, files: u64) {
        self.add(&self.skipped, files);
    }

    pub fn add_failed(&self, files: u64) {
        self.add(&self.failed, files);
    }

    /// The walk is complete: totals are final (the bar can show an ETA).
    pub fn set_totals_known(&self) {
        self.totals_final.store(true, Ordering::Relaxed);
    }

    pub fn elapsed(&self) -> f64 {
        self.start
            .lock()
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0)
    }

    pub fn snapshot(&self) -> Snapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            phase: self.phase(),
            files_done: r(&self.files_done),
            files_total: r(&self.files_total),
            bytes_done: r(&self.bytes_done),
            bytes_total: r(&self.bytes_total),
            totals_final: self.totals_final.load(Ordering::Relaxed),
            wire_bytes: r(&self.wire_bytes),
            skipped: r(&self.skipped),
            failed: r(&self.failed),
            resumed_bytes: r(&self.resumed_bytes),
            dedup_blocks: r(&self.dedup_blocks),
            dedup_bytes: r(&self.dedup_bytes),
            last_error: self
                .last_error
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default(),
            error_kind: self.error_kind.lock().ok().and_then(|k| *k).map(|f| f.kind),
            permanent: self
                .error_kind
                .lock()
                .ok()
                .and_then(|k| *k)
                .is_some_and(|f| f.permanent),
            digest: self.digest.lock().map(|s| s.clone()).unwrap_or_default(),
            elapsed: self.elapsed(),
            unreadable: self.unreadable(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Progress;

    #[tokio::test]
    async fn a_sender_of_several_transfers_lingers_until_each_outcome_was_read() {
        let total = Arc::new(Progress::new("a.1", "sender"));
        let sessions = [
            Progress::for_session_as(&total, "a.1"),
            Progress::for_session_as(&total, "b.1"),
        ];
        assert_eq!(sessions[1].transfer_id, "b.1");
        sessions[0].mark_outcome_delivered();
        let start = tokio::time::Instant::now();
        total
            .linger_for_watchers_of(&sessions, Duration::from_millis(300))
            .await;
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "b's outcome was never read: the whole linger"
        );
        sessions[1].mark_outcome_delivered();
        let start = tokio::time::Instant::now();
        total
            .linger_for_watchers_of(&sessions, Duration::from_secs(60))
            .await;
        assert!(start.elapsed() < Duration::from_secs(30), "both were read");
    }
}
