//! Several sessions of one sender start sending together.
//!
//! A receiver gives each connection one deadline for its TLS handshake and Hello. When one
//! sender serves many destinations, the sessions that greeted first would start sending at once
//! and take the sender's CPU from the handshakes of those still greeting; on a busy or
//! CPU-limited node those then miss their receivers' deadlines. So each session, once greeted,
//! waits for the others to be greeted too (or to have failed), and at most `wait`: a
//! destination still trying to connect after that does not hold the others.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The sessions of one sender that have not yet passed (see the module's documentation).
#[derive(Debug)]
pub struct StartGate {
    to_pass: watch::Sender<usize>,
    wait: Duration,
}

/// One session's place at the gate: it passes once, when greeted, or when dropped (the
/// session failed before that).
#[derive(Debug)]
pub struct Ticket {
    gate: Option<Arc<StartGate>>,
}

impl StartGate {
    /// A gate for `sessions` sessions, with one ticket each.
    pub fn tickets(sessions: usize, wait: Duration) -> Vec<Ticket> {
        let gate = Arc::new(StartGate {
            to_pass: watch::Sender::new(sessions),
            wait,
        });
        (0..sessions)
            .map(|_| Ticket {
                gate: Some(gate.clone()),
            })
            .collect()
    }

    fn pass(&self) {
        self.to_pass.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Ticket {
    /// This session is greeted: waits until every session passed, or `wait`.
    pub async fn pass_and_wait(mut self) {
        let Some(gate) = self.gate.take() else {
            return;
        };
        let mut open = gate.to_pass.subscribe();
        gate.pass();
        let _ = tokio::time::timeout(gate.wait, open.wait_for(|&n| n == 0)).await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.pass();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn opens_when_every_session_passed() {
        let mut tickets = StartGate::tickets(3, Duration::from_secs(10));
        let (c, b, a) = (
            tickets.pop().unwrap(),
            tickets.pop().unwrap(),
            tickets.pop().unwrap(),
        );
        let start = Instant::now();
        let first = tokio::spawn(a.pass_and_wait());
        let second = tokio::spawn(b.pass_and_wait());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!first.is_finished() && !second.is_finished());
        c.pass_and_wait().await;
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_failed_passes_when_its_ticket_drops() {
        let mut tickets = StartGate::tickets(2, Duration::from_secs(10));
        let (failed, greeted) = (tickets.pop().unwrap(), tickets.pop().unwrap());
        let start = Instant::now();
        let waiting = tokio::spawn(greeted.pass_and_wait());
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(failed);
        waiting.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_does_not_wait_longer_than_the_wait_for_one_still_connecting() {
        let mut tickets = StartGate::tickets(2, Duration::from_secs(10));
        let (_connecting, greeted) = (tickets.pop().unwrap(), tickets.pop().unwrap());
        let start = Instant::now();
        greeted.pass_and_wait().await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_to_pass_does_not_wait() {
        let tickets = StartGate::tickets(1, Duration::from_secs(10));
        let start = Instant::now();
        for t in tickets {
            t.pass_and_wait().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
