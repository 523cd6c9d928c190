//! A block on its way to a client in a Take's reply, and the deadlines that keep a client that
//! stops reading from holding it. A block holds a place among the service's (and its client's)
//! blocks in flight from when it is read until the stream asks for the message after its last
//! piece (by then HTTP/2 has that piece). A client that leaves its stream unread (or advertises
//! a zero HTTP/2 window) would hold its places, and so every other client's Takes, forever:
//! so each piece must be taken within [`PIECE_DEADLINE`] of the one before (the last one too:
//! the stream must ask for what follows it) and the whole block within [`BLOCK_DEADLINE`], or
//! the block is dropped (its memory and places given back at once, by a watchdog, whether or
//! not the stream is ever polled again), the Take is cancelled (its reader stops, the blocks
//! queued behind give their places back) and the stream ends with `DEADLINE_EXCEEDED`.
//!
//! The pieces are cut into allocations of their own when the block is read (one copy, as
//! before): a piece HTTP/2 still holds for a stalled stream keeps 128 KiB alive, never the
//! whole block.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::blockstore::v1 as pb;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shares::Turn;

/// The longest a client may leave the next piece of a block untaken.
pub const PIECE_DEADLINE: Duration = Duration::from_secs(10);
/// The longest a block may take to go out whole (4 MiB in 60 s: 0.56 Mbit/s).
pub const BLOCK_DEADLINE: Duration = Duration::from_secs(60);

struct State {
    pieces: VecDeque<Bytes>,
    /// The block's place among the blocks in flight; `None` once given back.
    place: Option<Turn>,
    last_progress: Instant,
    expired: bool,
}

/// A block being sent.
pub struct Outgoing {
    position: u32,
    state: Arc<Mutex<State>>,
    watchdog: tokio::task::AbortHandle,
}

/// What the stream sends next for a block.
pub enum Next {
    Piece(pb::TakenBlock),
    /// Every piece went out; the block's place is given back.
    Sent,
    /// The client did not take the block in time.
    Expired,
}

impl Outgoing {
    /// `data` at `position` of the request, cut into pieces of at most `piece` bytes, holding
    /// `place`; its watchdog runs on `runtime`, counts an expiry in `expired` and cancels the
    /// Take with `take`.
    pub fn new(
        position: u32,
        data: &[u8],
        piece: usize,
        place: Turn,
        runtime: &tokio::runtime::Handle,
        expired: Arc<AtomicU64>,
        take: CancellationToken,
    ) -> Self {
        let pieces = data
            .chunks(piece.max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        let state = Arc::new(Mutex::new(State {
            pieces,
            place: Some(place),
            last_progress: Instant::now(),
            expired: false,
        }));
        let watched = Arc::downgrade(&state);
        let watchdog = runtime
            .spawn(async move {
                let started = Instant::now();
                loop {
                    let due = {
                        let Some(state) = watched.upgrade() else {
                            return;
                        };
                        let s = state.lock().unwrap_or_else(|e| e.into_inner());
                        if s.place.is_none() {
                            return;
                        }
                        (s.last_progress + PIECE_DEADLINE).min(started + BLOCK_DEADLINE)
                    };
                    tokio::time::sleep_until(due).await;
                    let Some(state) = watched.upgrade() else {
                        return;
                    };
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    if now >= (s.last_progress + PIECE_DEADLINE).min(started + BLOCK_DEADLINE) {
                        s.expired = true;
                        s.pieces.clear();
                        s.place = None;
                        expired.fetch_add(1, Ordering::Relaxed);
                        take.cancel();
                        return;
                    }
                }
            })
            .abort_handle();
        Self {
            position,
            state,
            watchdog,
        }
    }

    /// The next message for this block.
    pub fn next_message(&mut self) -> Next {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.expired {
            return Next::Expired;
        }
        let Some(data) = s.pieces.pop_front() else {
            s.place = None;
            return Next::Sent;
        };
        s.last_progress = Instant::now();
        Next::Piece(pb::TakenBlock {
            position: self.position,
            data,
            more: !s.pieces.is_empty(),
        })
    }

    /// Whether the block still holds its place (for tests).
    pub fn holds_place(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .place
            .is_some()
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::shares::Shares;

    fn block(data: &[u8], piece: usize, shares: &Shares) -> (Outgoing, Arc<AtomicU64>) {
        let expired = Arc::new(AtomicU64::new(0));
        let place = shares
            .of("c")
            .places
            .try_acquire()
            .unwrap_or_else(|| unreachable!());
        let o = Outgoing::new(
            7,
            data,
            piece,
            place,
            &tokio::runtime::Handle::current(),
            expired.clone(),
            CancellationToken::new(),
        );
        (o, expired)
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_goes_out_in_pieces_in_order_then_gives_its_place_back() {
        let shares = Shares::default();
        let data: Vec<u8> = (0..10u8).collect();
        let (mut o, expired) = block(&data, 4, &shares);
        let mut got = Vec::new();
        loop {
            match o.next_message() {
                Next::Piece(p) => {
                    assert_eq!(p.position, 7);
                    assert!(p.data.len() <= 4);
                    got.extend_from_slice(&p.data);
                    assert_eq!(p.more, got.len() < data.len());
                    assert!(o.holds_place());
                }
                Next::Sent => break,
                Next::Expired => panic!("expired"),
            }
        }
        assert_eq!(got, data);
        assert!(!o.holds_place());
        tokio::time::sleep(BLOCK_DEADLINE * 2).await;
        assert_eq!(expired.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_nobody_takes_gives_its_memory_and_place_back_at_its_deadline() {
        let shares = Shares::default();
        let (mut o, expired) = block(&[1u8; 1000], 100, &shares);
        assert!(matches!(o.next_message(), Next::Piece(_)));
        tokio::time::sleep(PIECE_DEADLINE / 2).await;
        assert!(matches!(o.next_message(), Next::Piece(_)));
        assert!(o.holds_place(), "a piece taken in time moves the deadline");
        tokio::time::sleep(PIECE_DEADLINE + Duration::from_millis(10)).await;
        assert!(!o.holds_place(), "the place is given back without a poll");
        assert_eq!(expired.load(Ordering::Relaxed), 1);
        assert!(matches!(o.next_message(), Next::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_taken_too_slowly_expires_at_the_block_deadline() {
        let shares = Shares::default();
        let (mut o, expired) = block(&[1u8; 1000], 1, &shares);
        let mut pieces = 0;
        // A piece every 7 s, each in time: the block's own deadline ends it.
        let every = Duration::from_secs(7);
        while let Next::Piece(_) = o.next_message() {
            pieces += 1;
            tokio::time::sleep(every).await;
        }
        assert_eq!(pieces, BLOCK_DEADLINE.as_secs() / every.as_secs() + 1);
        assert_eq!(expired.load(Ordering::Relaxed), 1);
    }
}
