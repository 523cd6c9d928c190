//! The status patch budget: every change of a Transfer's state (phase, conditions, attempts,
//! mover pods) is written at once, and progress (the moving figures) within a budget. Each
//! running Transfer's progress reaches the apiserver at most once per
//! [`PatchLimiter::progress_interval`], which grows with the number of running Transfers so
//! that all of them together stay near `--status-patch-qps`; a token bucket of that rate
//! spreads them out (a burst after a restart waits its turn).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::api::TransferStatus;

/// Least time between two progress-only status patches of one Transfer.
pub const MIN_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// The default budget of progress patches per second, for the whole operator: a modest share
/// of a shared apiserver (client-go's default client allows 5 per second sustained).
pub const DEFAULT_PATCH_QPS: f64 = 5.0;

/// True when `new` differs from `old` only in the moving figures (progress, throughput, ETA,
/// wire bytes, when the other cluster was last heard, the place in the queue).
pub fn progress_only(old: &TransferStatus, new: &TransferStatus) -> bool {
    let strip = |s: &TransferStatus| TransferStatus {
        progress: None,
        throughput: None,
        eta: None,
        wire: None,
        queue: None,
        remote: s.remote.clone().map(|r| crate::api::RemoteStatus {
            last_heard: None,
            ..r
        }),
        ..s.clone()
    };
    strip(old) == strip(new)
}

/// When each Transfer's status was last patched, and the operator-wide budget.
pub struct PatchLimiter {
    last: Mutex<HashMap<String, Instant>>,
    bucket: Mutex<Bucket>,
    qps: f64,
    /// Transfers whose movers run (kept by the census).
    running: AtomicUsize,
}

struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for PatchLimiter {
    fn default() -> Self {
        PatchLimiter::new(DEFAULT_PATCH_QPS)
    }
}

impl PatchLimiter {
    pub fn new(qps: f64) -> PatchLimiter {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            DEFAULT_PATCH_QPS
        };
        PatchLimiter {
            last: Mutex::default(),
            bucket: Mutex::new(Bucket {
                tokens: burst(qps),
                at: None,
            }),
            qps,
            running: AtomicUsize::new(0),
        }
    }

    pub fn set_running(&self, n: usize) {
        self.running.store(n, Ordering::Relaxed);
    }

    /// Least time between two progress patches of one Transfer now: a second, or longer
    /// when the running Transfers together would exceed the budget.
    pub fn progress_interval(&self) -> Duration {
        let running = self.running.load(Ordering::Relaxed) as f64;
        MIN_PROGRESS_INTERVAL.max(Duration::from_secs_f64(running / self.qps))
    }

    /// `None`: patch now. `Some(wait)`: a progress-only patch that must wait this long.
    pub fn defer(&self, uid: &str, progress_only: bool, now: Instant) -> Option<Duration> {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = bucket
            .at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        bucket.at = Some(now);
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * self.qps).min(burst(self.qps));
        if !progress_only {
            // A change of state is never held back, but it spends from the same budget.
            bucket.tokens -= 1.0;
            return None;
        }
        let interval = self.progress_interval();
        if let Some(last) = self.last.lock().ok()?.get(uid).copied() {
            let since = now.saturating_duration_since(last);
            if since < interval {
                return Some(interval - since);
            }
        }
        if bucket.tokens < 1.0 {
            let short = (1.0 - bucket.tokens) / self.qps;
            return Some(Duration::from_secs_f64(short).max(Duration::from_millis(100)));
        }
        bucket.tokens -= 1.0;
        None
    }

    pub fn patched(&self, uid: &str, now: Instant) {
        if let Ok(mut last) = self.last.lock() {
            last.insert(uid.to_owned(), now);
        }
    }

    pub fn forget(&self, uid: &str) {
        if let Ok(mut last) = self.last.lock() {
            last.remove(uid);
        }
    }
}

/// Patches the bucket holds at most: two seconds' worth, at least one.
fn burst(qps: f64) -> f64 {
    (2.0 * qps).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ProgressStatus};

    #[test]
    fn progress_waits_a_second_other_changes_do_not() {
        let old = TransferStatus::default();
        let mut moved = old.clone();
        moved.progress = Some(ProgressStatus {
            bytes_done: 5,
            ..ProgressStatus::default()
        });
        assert!(progress_only(&old, &moved));
        let mut phased = moved.clone();
        phased.phase = Phase::Succeeded;
        assert!(!progress_only(&old, &phased));

        let l = PatchLimiter::new(100.0);
        let t0 = Instant::now();
        assert_eq!(l.defer("u", true, t0), None, "never patched: now");
        l.patched("u", t0);
        let wait = l.defer("u", true, t0 + Duration::from_millis(300));
        assert_eq!(wait, Some(Duration::from_millis(700)));
        assert_eq!(l.defer("u", false, t0 + Duration::from_millis(300)), None);
        assert_eq!(l.defer("u", true, t0 + Duration::from_secs(1)), None);
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn progress_of_many_transfers_stays_within_the_budget() {
        let l = PatchLimiter::new(5.0);
        l.set_running(100);
        assert_eq!(l.progress_interval(), Duration::from_secs(20));
        let t0 = Instant::now();
        // 100 Transfers report progress every 100 ms for a minute.
        let mut patches = 0;
        for step in 0..600u64 {
            let now = t0 + Duration::from_millis(100 * step);
            for i in 0..100 {
                let uid = format!("u{i}");
                if l.defer(&uid, true, now).is_none() {
                    l.patched(&uid, now);
                    patches += 1;
                }
            }
        }
        // 5 per second for 60 s, plus the initial burst of 10.
        assert!(patches <= 5 * 60 + 10, "{patches} patches");
        assert!(patches >= 250, "the budget is used, not starved: {patches}");
    }

    #[test]
    fn changes_of_state_are_never_held_back_but_spend_the_budget() {
        let l = PatchLimiter::new(1.0);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(l.defer("a", false, t0), None);
        }
        let wait = l.defer("b", true, t0).expect("the budget is spent");
        assert!(wait >= Duration::from_secs(2), "{wait:?}");
    }
}
