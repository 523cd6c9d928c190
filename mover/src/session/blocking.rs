//! The blocking work of one session. Every filesystem call a stream waits for (answering an
//! Offer, an announce or a resume check, applying directory metadata, reading a block, building
//! a batch or an announce, the digest at the end) goes through [`BlockingPool::run`]: at most a
//! fixed number at once per session, on tokio's blocking threads, so a session never holds more
//! threads than its streams need however its peer paces it. Work that lives as long as the
//! session has a thread of its own instead: the sender's walk, each receiver stream's data
//! writer (it overlaps decryption of the next frame with writing this one), and the digest
//! readers (`digest::HashPool`).

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinError;

#[derive(Debug, Clone)]
pub(crate) struct BlockingPool {
    permits: Arc<Semaphore>,
}

impl BlockingPool {
    /// A pool for a session of `streams` streams: two calls per stream (a stream's request and
    /// its block reads overlap) and at least one per core.
    pub fn for_streams(streams: u32) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_limit((2 * streams as usize).max(cores))
    }

    pub fn with_limit(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit.max(1))),
        }
    }

    /// Runs `f` on a blocking thread once one of the session's slots is free.
    pub async fn run<T, F>(&self, f: F) -> Result<T, JoinError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // The semaphore is never closed, so acquiring only ever waits.
        let permit = self.permits.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _slot = permit;
            f()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_the_limit_runs_at_once() {
        let pool = BlockingPool::with_limit(3);
        let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let calls = (0..12).map(|_| {
            let (running, peak, pool) = (running.clone(), peak.clone(), pool.clone());
            async move {
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }
        });
        for r in futures::future::join_all(calls).await {
            r.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }
}
