//! Waiting for the receiver's next reply on a stream: Keepalive and Busy frames pass, and a
//! receiver that makes no progress (or is busy for longer than any honest one could be) ends
//! the wait with an error.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncRead;

use super::effects::Ctx;
use super::{BUSY_MIN_RATE, BUSY_TIMEOUTS, SendError};
use crate::session::framed::FrameReader;
use crate::wire::Message;

/// How long a receiver's Busy frames may hold the progress deadline off while this end waits for
/// one reply, when the source holds `source_bytes`: [`BUSY_TIMEOUTS`] progress timeouts (`limit`),
/// plus the time to read the whole source at [`BUSY_MIN_RATE`]. An honest receiver is busy that
/// long at most: hashing for `--checksum`, reading unchanged files for its digest at Finish, or
/// waiting for its fan-out peers' blocks, it reads or writes no more than the source holds (at
/// the rate of a slow disk or link). A receiver that sends growing Busy counters for ever (any
/// receiver can count up) so fails, with [`SendError::BusyTooLong`], rather than holding the
/// sender, and in a fan-out the other destinations' shared sender, for ever.
fn busy_allowance(limit: Duration, source_bytes: u64) -> Duration {
    limit * BUSY_TIMEOUTS + Duration::from_secs(source_bytes / BUSY_MIN_RATE)
}

/// The receiver's next reply on this stream, past Keepalive and Busy frames. Fails when the
/// receiver makes no progress for the session's progress timeout: no reply, and no Busy frame
/// whose work counter grew (keepalives and trickled bytes do not count); and when Busy frames
/// held the deadline off for longer than [`busy_allowance`].
pub(super) async fn next_reply<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    ctx: &Ctx,
    last_work: &mut u64,
) -> Result<Message, SendError> {
    let source_bytes = ctx.progress.bytes_total.load(Ordering::Relaxed);
    reply_within(reader, ctx.progress_timeout, source_bytes, last_work).await
}

/// [`next_reply`] with the progress timeout `limit`, for a source of `source_bytes`.
async fn reply_within<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    limit: Duration,
    source_bytes: u64,
    last_work: &mut u64,
) -> Result<Message, SendError> {
    let started = tokio::time::Instant::now();
    let ceiling = started + busy_allowance(limit, source_bytes);
    let mut deadline = started + limit;
    loop {
        let msg = match tokio::time::timeout_at(deadline, reader.expect()).await {
            Ok(msg) => msg?,
            Err(_) if deadline >= ceiling => {
                return Err(SendError::BusyTooLong {
                    stream: reader.stream(),
                    secs: started.elapsed().as_secs(),
                });
            }
            Err(_) => {
                return Err(SendError::NoProgress {
                    stream: reader.stream(),
                    secs: limit.as_secs(),
                });
            }
        };
        match msg {
            Message::Keepalive => {}
            Message::Busy(b) => {
                if b.work > *last_work {
                    *last_work = b.work;
                    deadline = (tokio::time::Instant::now() + limit).min(ceiling);
                }
            }
            m => return Ok(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::framed::FrameWriter;
    use ferry_proto::wire::v1 as pb;

    /// A receiver on the far end of a pipe that sends a Busy frame every second for `busy_for`
    /// (its counter growing when `grows`), then a Done frame (never, with `None`).
    fn busy_receiver(
        busy_for: Option<Duration>,
        grows: bool,
    ) -> FrameReader<tokio::io::DuplexStream> {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut w = FrameWriter::new(theirs, 0, Duration::from_secs(3600), Default::default());
            let started = tokio::time::Instant::now();
            let mut work = 0;
            while busy_for.is_none_or(|b| started.elapsed() < b) {
                work += u64::from(grows);
                if w.send(&Message::Busy(pb::Busy { work })).await.is_err()
                    || w.flush().await.is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let _ = w.send(&Message::Done(pb::Done::default())).await;
            let _ = w.flush().await;
            // Keeps the pipe open until the reader is done with it.
            std::future::pending::<()>().await;
        });
        FrameReader::new(ours, 0, Duration::from_secs(3600), Default::default())
    }

    /// Growing Busy counters hold the deadline off (an honest receiver busy hashing), but for
    /// one reply no longer than the busy allowance: four timeouts plus the source at 16 MiB/s.
    /// Busy frames whose counter does not grow buy nothing.
    #[tokio::test(start_paused = true)]
    async fn busy_frames_hold_the_deadline_off_for_a_bounded_time() {
        let limit = Duration::from_secs(10);
        let secs = |t: tokio::time::Instant| t.elapsed().as_secs();
        // Busy for three timeouts, then the reply: it is waited for.
        let mut r = busy_receiver(Some(Duration::from_secs(30)), true);
        let (t, mut work) = (tokio::time::Instant::now(), 0);
        let got = reply_within(&mut r, limit, 0, &mut work).await;
        assert!(matches!(got, Ok(Message::Done(_))), "{got:?}");
        assert_eq!(secs(t), 30);
        // Busy for ever: cut off at four timeouts.
        let mut r = busy_receiver(None, true);
        let (t, mut work) = (tokio::time::Instant::now(), 0);
        let err = reply_within(&mut r, limit, 0, &mut work)
            .await
            .expect_err("held for ever");
        assert!(
            matches!(err, SendError::BusyTooLong { secs: 40, .. }),
            "{err}"
        );
        assert_eq!(secs(t), 40);
        assert!(err.to_string().contains("only Busy frames"), "{err}");
        // A source of 160 MiB allows 10 s more.
        let mut r = busy_receiver(None, true);
        let (t, mut work) = (tokio::time::Instant::now(), 0);
        let err = reply_within(&mut r, limit, 160 << 20, &mut work)
            .await
            .expect_err("held for ever");
        assert!(matches!(err, SendError::BusyTooLong { .. }), "{err}");
        assert_eq!(secs(t), 50);
        // Busy without work: one timeout.
        let mut r = busy_receiver(None, false);
        let (t, mut work) = (tokio::time::Instant::now(), 0);
        let err = reply_within(&mut r, limit, 0, &mut work)
            .await
            .expect_err("no progress");
        assert!(matches!(err, SendError::NoProgress { .. }), "{err}");
        assert_eq!(secs(t), 10);
    }
}
