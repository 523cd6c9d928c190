//! A token bucket shared by all streams of a sender (`--bandwidth-limit`).

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

pub struct Limiter {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Limiter {
    /// `rate` bytes per second, with a burst of 1/20 s worth (at least 256 KiB).
    pub fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1) as f64,
            state: Mutex::new((0.0, Instant::now())),
        }
    }

    fn burst(&self) -> f64 {
        (self.rate / 20.0).max(256.0 * 1024.0)
    }

    /// Waits until `n` bytes may be written.
    pub async fn take(&self, n: usize) {
        let wait = {
            let mut st = self.state.lock().await;
            let now = Instant::now();
            let (ref mut tokens, ref mut last) = *st;
            *tokens =
                (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(self.burst());
            *last = now;
            *tokens -= n as f64;
            if *tokens < 0.0 {
                Duration::from_secs_f64(-*tokens / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}
