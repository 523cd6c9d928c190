//! Bandwidth limits (`--bandwidth-limit`): one token bucket, shared by all streams of a sender
//! ([`Limiter`], async) or by all workers of a local copy ([`BlockingLimiter`], threads).

use std::time::{Duration, Instant};

/// `rate` bytes per second with a burst of 1/20 s worth (at least 256 KiB). Pure: the caller
/// passes the time, so the arithmetic is tested without sleeping.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: u64, now: Instant) -> Self {
        TokenBucket {
            rate: rate.max(1) as f64,
            tokens: 0.0,
            last: now,
        }
    }

    fn burst(&self) -> f64 {
        (self.rate / 20.0).max(256.0 * 1024.0)
    }

    /// Takes `n` bytes' worth at `now`; how long the caller must wait before sending them.
    pub fn debit(&mut self, n: u64, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst());
        self.last = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            Duration::from_secs_f64(-self.tokens / self.rate)
        } else {
            Duration::ZERO
        }
    }
}

/// The bucket for async senders.
pub struct Limiter {
    state: tokio::sync::Mutex<TokenBucket>,
}

impl Limiter {
    pub fn new(rate: u64) -> Self {
        Self {
            state: tokio::sync::Mutex::new(TokenBucket::new(rate, Instant::now())),
        }
    }

    /// Waits until `n` bytes may be written.
    pub async fn take(&self, n: usize) {
        let wait = self.state.lock().await.debit(n as u64, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The bucket for copy's worker threads.
#[derive(Debug)]
pub struct BlockingLimiter {
    state: std::sync::Mutex<TokenBucket>,
}

impl BlockingLimiter {
    pub fn new(rate: u64) -> Self {
        Self {
            state: std::sync::Mutex::new(TokenBucket::new(rate, Instant::now())),
        }
    }

    /// Blocks until `n` bytes may be written.
    pub fn take(&self, n: u64) {
        let wait = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .debit(n, Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1_000_000, t0);
        // Nothing saved up at the start: 500 KB wait half a second.
        assert_eq!(b.debit(500_000, t0), Duration::from_millis(500));
        // After two idle seconds the bucket holds its burst (256 KiB), not two seconds' worth.
        let later = t0 + Duration::from_secs(2);
        let mut b = TokenBucket::new(1_000_000, later);
        let t = later + Duration::from_secs(2);
        assert_eq!(b.debit(262_144, t), Duration::ZERO);
        let wait = b.debit(100_000, t);
        assert_eq!(wait, Duration::from_millis(100));
    }
}
