//! The status patch limiter: a running Transfer's progress reaches the apiserver at most about
//! once per [`MIN_PROGRESS_INTERVAL`], however many movers report; every other change (phase,
//! conditions, attempts, mover pods) is written at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::TransferStatus;

/// Least time between two progress-only status patches of one Transfer.
pub const MIN_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// True when `new` differs from `old` only in the moving figures (progress, throughput, ETA,
/// wire bytes).
pub fn progress_only(old: &TransferStatus, new: &TransferStatus) -> bool {
    let strip = |s: &TransferStatus| TransferStatus {
        progress: None,
        throughput: None,
        eta: None,
        wire: None,
        ..s.clone()
    };
    strip(old) == strip(new)
}

/// When each Transfer's status was last patched.
#[derive(Default)]
pub struct PatchLimiter {
    last: Mutex<HashMap<String, Instant>>,
}

impl PatchLimiter {
    /// `None`: patch now. `Some(wait)`: a progress-only patch that must wait this long.
    pub fn defer(&self, uid: &str, progress_only: bool, now: Instant) -> Option<Duration> {
        if !progress_only {
            return None;
        }
        let last = self.last.lock().ok()?.get(uid).copied()?;
        let since = now.saturating_duration_since(last);
        (since < MIN_PROGRESS_INTERVAL).then(|| MIN_PROGRESS_INTERVAL - since)
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

        let l = PatchLimiter::default();
        let t0 = Instant::now();
        assert_eq!(l.defer("u", true, t0), None, "never patched: now");
        l.patched("u", t0);
        let wait = l.defer("u", true, t0 + Duration::from_millis(300));
        assert_eq!(wait, Some(Duration::from_millis(700)));
        assert_eq!(l.defer("u", false, t0 + Duration::from_millis(300)), None);
        assert_eq!(l.defer("u", true, t0 + Duration::from_secs(1)), None);
    }
}
