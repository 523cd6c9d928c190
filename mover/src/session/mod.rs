//! Sender and receiver of one transfer over N parallel streams.
//!
//! Both are generic over `AsyncRead + AsyncWrite` streams, so tests drive them over in-memory
//! duplex pipes or real TLS connections alike. Per stream: Hello/Welcome, then the sender
//! pipelines Offers (groups of entries) and the receiver answers each with a Want; small wanted
//! files travel whole in Batch frames, large ones as 4 MiB Blocks striped over all streams and
//! written at their offsets. After every stream said Done, stream 0 carries directory metadata
//! (and `--delete` listings), then Finish; the receiver answers with a Summary of what it wrote.

mod blocking;
mod buffers;
pub mod compress;
mod framed;
mod handshake;
mod listen;
pub mod receiver;
mod scan;
pub mod sender;
pub mod staging;

use std::time::Duration;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::progress::{Phase, Progress};
use crate::wire::Message;
use ferry_proto::kind::{ErrorKind, Failure};

pub use compress::Compress;
pub use ferry_proto::error_chain;
pub use ferry_proto::shutdown::{Shutdown, ShutdownTrigger};
pub use framed::{FrameReader, FrameWriter, FramedError};
pub use handshake::{HandshakeError, accept_hello, send_hello};
pub use listen::{ListenError, MAX_HANDSHAKES, MAX_QUEUED_SESSIONS, serve};
pub use receiver::{
    Accepted, Keep, MAX_REPORTED_FAILURES, ReceiveError, ReceiverConfig, accept_stream,
    failure_message, receive_session,
};
pub use scan::{OnUnreadable, ScanError};
pub use sender::{ReceiverViolation, SendError, SenderConfig, send_session, send_session_gated};

pub use crate::protocol::{MAX_OFFER_ENTRIES, MAX_STREAMS, OFFER_WINDOW, SMALL_FILE_MAX};

/// How long a failing end waits for the peer's pending Error frame, and how long it spends
/// telling the peer why it fails (both best effort).
pub const PEER_GRACE: Duration = Duration::from_secs(2);
/// How long the receiver reads what the sender still sends after it reported its failure, so its
/// close does not reset the connection under the Error frame.
const DRAIN: Duration = Duration::from_millis(500);
/// Longest message carried in an Error frame (the frame's cap is 64 KiB).
const MAX_ERROR_MESSAGE: usize = 16 * 1024;

/// Why a session failed, recorded by the first stream that fails: the other streams stop, and
/// every stream tells the peer (unless the peer is the one that said it).
#[derive(Debug, Clone)]
pub(crate) struct Reason {
    pub failure: Failure,
    pub message: String,
    /// The peer reported it: do not send it back.
    pub from_peer: bool,
}

/// How one stream of a session failed.
pub(crate) enum StreamFailure<'a> {
    /// Another stream failed first.
    Aborted,
    /// The peer said why (its Error frame).
    Peer { failure: Failure, message: &'a str },
    /// This end failed.
    Local { failure: Failure, message: String },
}

#[derive(Default)]
pub(crate) struct Abort {
    reason: std::sync::Mutex<Option<Reason>>,
    notify: tokio::sync::Notify,
}

impl Abort {
    /// Records the session's failure (the first one wins) and wakes every stream.
    pub fn set(&self, reason: Reason) {
        if let Ok(mut r) = self.reason.lock()
            && r.is_none()
        {
            *r = Some(reason);
        }
        self.notify.notify_waiters();
    }

    /// Records a failure of this end (a walk that failed, a stalled peer, a shutdown) as the
    /// session's, unless one is recorded already.
    pub fn set_local(&self, failure: ferry_proto::kind::Failure, message: String) {
        self.set(Reason {
            failure,
            message,
            from_peer: false,
        });
    }

    pub fn reason(&self) -> Option<Reason> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }

    /// A stream failed: records why (the first failure of the session wins) and returns what
    /// this stream must tell its peer, if anything (never the peer's own reason back).
    pub fn stream_failed(&self, failure: StreamFailure<'_>) -> Option<Reason> {
        match failure {
            StreamFailure::Aborted => self.reason().filter(|r| !r.from_peer),
            StreamFailure::Peer { failure, message } => {
                self.set(Reason {
                    failure,
                    message: message.to_owned(),
                    from_peer: true,
                });
                None
            }
            StreamFailure::Local { failure, message } => {
                let reason = Reason {
                    failure,
                    message,
                    from_peer: false,
                };
                self.set(reason.clone());
                Some(reason)
            }
        }
    }

    /// Returns once a failure was recorded.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.reason().is_some() {
                return;
            }
            notified.await;
        }
    }
}

/// Text from a peer (its Error message, its Summary's failures) or naming a peer's path, made
/// safe for a terminal and a log line: every control character (newline, carriage return,
/// escape and the C1 controls that start ANSI sequences, ...) is shown escaped (`\n`,
/// `\u{1b}`), and the text is cut to [`MAX_ERROR_MESSAGE`] bytes. Applying it twice changes
/// nothing more.
pub fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_ERROR_MESSAGE));
    for c in s.chars() {
        if out.len() >= MAX_ERROR_MESSAGE {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Best effort, bounded by [`PEER_GRACE`]: sends `Error{kind, permanent, message}` and closes
/// the stream (TLS close_notify), so the peer can report why instead of a broken connection.
pub(crate) async fn tell_peer<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    failure: Failure,
    message: &str,
) {
    // The peer knows the directories by the paths the user gave, not by held handles.
    let mut message = crate::tree::subpath::shown_text(message);
    if message.len() > MAX_ERROR_MESSAGE {
        let mut end = MAX_ERROR_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    let _ = tokio::time::timeout(PEER_GRACE, async {
        let error = Message::Error(pb::Error {
            message,
            kind: failure.kind.to_pb() as i32,
            permanent: failure.permanent,
        });
        if writer.send(&error).await.is_ok() {
            let _ = writer.flush().await;
        }
        writer.shutdown().await;
    })
    .await;
}

/// Reads what the peer still sent, for at most `grace`: its Error frame (kind, permanence and
/// message), if it sent one before the connection failed. Other frames are skipped.
pub(crate) async fn pending_peer_error<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    grace: Duration,
) -> Option<(Failure, String)> {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        match tokio::time::timeout_at(deadline, reader.next()).await {
            Ok(Ok(Some(Message::Error(e)))) => {
                return Some((Failure::from_pb(&e), escape_text(&e.message)));
            }
            Ok(Ok(Some(_))) => continue,
            _ => return None,
        }
    }
}

/// Timeouts shared by both ends.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TLS handshake plus Hello/Welcome.
    pub handshake: Duration,
    /// Longest silence on a stream (reads) or refusal to accept data (writes).
    pub idle: Duration,
    /// Longest time the peer may make no progress: move no data and report no growing work
    /// counter (keepalives and trickled bytes do not count). The receiver holds a whole session
    /// to it, the sender each stream it is waiting on.
    pub progress: Duration,
}

/// Default of [`Timeouts::progress`].
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            progress: DEFAULT_PROGRESS_TIMEOUT,
        }
    }
}

/// How often a busy end tells its peer it is working (Busy frames, progress capability).
pub(crate) const BUSY_EVERY: Duration = Duration::from_secs(5);

/// When the sender last made progress (the receiver's session deadline): a frame that moves the
/// session forward. A sender's Busy frames do not count (see `receiver::effects::Session::saw`).
pub(crate) struct ProgressClock {
    last: std::sync::Mutex<tokio::time::Instant>,
}

impl ProgressClock {
    pub fn new() -> Self {
        Self {
            last: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    pub fn mark(&self) {
        if let Ok(mut l) = self.last.lock() {
            *l = tokio::time::Instant::now();
        }
    }

    /// When the progress deadline passes unless something happens first.
    pub fn deadline(&self, timeout: Duration) -> tokio::time::Instant {
        let last = self
            .last
            .lock()
            .map(|l| *l)
            .unwrap_or_else(|_| tokio::time::Instant::now());
        last + timeout
    }
}

/// Runs `fut`; while it takes long, calls `work()` every [`BUSY_EVERY`] and tells the peer that
/// this end is working (a Busy frame with that counter, only when `enabled`), so an honest end
/// that hashes or writes for minutes is not taken for a stalled one (nor blames its peer).
pub(crate) async fn while_busy<W, T>(
    writer: &mut FrameWriter<W>,
    enabled: bool,
    work: impl Fn() -> u64,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, FramedError>
where
    W: AsyncWrite + Unpin,
{
    tokio::pin!(fut);
    loop {
        match tokio::time::timeout(BUSY_EVERY, &mut fut).await {
            Ok(v) => return Ok(v),
            Err(_) => {
                let busy = Message::Busy(pb::Busy { work: work() });
                if enabled {
                    writer.send(&busy).await?;
                    writer.flush().await?;
                }
            }
        }
    }
}

/// What a finished session did (both ends report the receiver's counts for files and bytes).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SessionSummary {
    /// A dry run: the counts say what the receiver would have written and deleted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    pub files: u64,
    pub bytes: u64,
    pub wire_bytes: u64,
    pub seconds: f64,
    pub streams: u32,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub dedup_blocks: u64,
    pub dedup_bytes: u64,
    /// Destination entries removed: not in the source (`--delete`), or a non-empty directory
    /// where the source has a non-directory (only with `--delete`).
    pub deleted: u64,
    /// Entries the receiver left out while the rest was transferred (for example a non-empty
    /// directory it would not replace without `--delete`).
    pub failed: u64,
    /// The first few of those failures' messages (at most [`MAX_REPORTED_FAILURES`]).
    pub failures: Vec<String>,
    /// Sender only (`--skip-unreadable`): source entries left out because this mover may not
    /// read them (permission denied). They are not in `failed`: the receiver never heard of them.
    pub unreadable: u64,
    /// The first [`crate::progress::MAX_UNREADABLE_PATHS`] of them, relative to the source root.
    pub unreadable_paths: Vec<String>,
    /// Receiver only: metadata the sender sent that this receiver did not apply because it was
    /// not asked to (`--special-bits`, `--xattrs`, `--owner`): entries whose setuid/setgid/sticky
    /// bits were masked, extended attributes left out, entries whose owner was not applied.
    pub dropped_special_bits: u64,
    pub dropped_xattrs: u64,
    pub dropped_owners: u64,
    /// This end's transfer digest (hex, docs/protocol.md "Transfer digest"). On the sender it
    /// equals the receiver's, or the session failed.
    pub digest: String,
}

impl SessionSummary {
    /// Records the outcome in `progress`: entries left out make the session a failure (exit
    /// status 1) even though everything else was transferred.
    pub fn set_outcome(&self, progress: &Progress) {
        if !self.digest.is_empty() {
            progress.set_digest(&self.digest);
        }
        match self.failure_line() {
            Some(line) => {
                // Unreadable entries are the source's; other entries are left out for reasons
                // at the destination (a non-empty directory in the way, a hard link whose target
                // is not a file there). Not permanent: the exit status is 1 either way, and a
                // rerun after a chmod or chown copies them.
                let kind = if self.unreadable > 0 {
                    ErrorKind::Source
                } else {
                    ErrorKind::Destination
                };
                progress.set_failure(Failure::new(kind, false), &line);
                progress.set_phase(Phase::Failed);
            }
            None => progress.set_phase(Phase::Succeeded),
        }
    }

    /// Entries were left out (exit status 1): failed at the receiver or unreadable here.
    pub fn left_out(&self) -> bool {
        self.failed > 0 || self.unreadable > 0
    }

    /// "N entries failed, e.g. <first message>" and/or "N source entries unreadable, left out,
    /// e.g. <first path>", or `None` when nothing was left out.
    pub fn failure_line(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.unreadable > 0 {
            let mut line = format!(
                "{} source entries unreadable (permission denied), left out",
                self.unreadable
            );
            if let Some(first) = self.unreadable_paths.first() {
                line.push_str(", e.g. ");
                line.push_str(first);
            }
            parts.push(line);
        }
        if self.failed > 0 {
            let mut line = format!("{} entries failed", self.failed);
            if let Some(first) = self.failures.first() {
                line.push_str(", e.g. ");
                line.push_str(first);
            }
            parts.push(line);
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_text_shows_control_characters_escaped() {
        let evil = "failed\n\u{1b}[31mFAKE: ok\r\u{9b}2J\u{7f}";
        let shown = escape_text(evil);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(shown, "failed\\n\\u{1b}[31mFAKE: ok\\r\\u{9b}2J\\u{7f}");
        assert_eq!(escape_text(&shown), shown, "idempotent");
        assert_eq!(escape_text("naïve — ok"), "naïve — ok");
        let long = escape_text(&"x".repeat(100_000));
        assert!(long.len() <= MAX_ERROR_MESSAGE + 3);
    }
}
