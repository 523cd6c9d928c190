//! A few threads that read and hash files for the digest off the protocol's critical path: on
//! the sender the source files the receiver skipped (unchanged) and blocks it did not ask for
//! (resumed), on the receiver the destination files it left unchanged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc;

/// Reading a file for the digest failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to read {path} for the transfer digest")]
pub struct HashError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

impl HashError {
    pub fn new(path: impl Into<String>, source: std::io::Error) -> Self {
        Self {
            path: path.into(),
            source,
        }
    }
}

type Job = Box<dyn FnOnce() -> Result<(), HashError> + Send>;

#[derive(Default)]
struct State {
    first_error: Mutex<Option<HashError>>,
    failed: AtomicBool,
    cancelled: AtomicBool,
}

/// Runs hashing jobs on a few threads; [`HashPool::finish`] waits for all of them.
pub struct HashPool {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    state: Arc<State>,
}

impl HashPool {
    /// `threads` workers (at least one) and a queue of twice as many jobs.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::channel::<Job>(2 * threads);
        let rx = Arc::new(Mutex::new(rx));
        let state = Arc::new(State::default());
        let workers = (0..threads)
            .map(|_| {
                let (rx, state) = (rx.clone(), state.clone());
                std::thread::spawn(move || worker(&rx, &state))
            })
            .collect();
        Self {
            tx: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
            state,
        }
    }

    /// One worker per core, at most four.
    pub fn per_core() -> Self {
        Self::new(std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
    }

    fn sender(&self) -> Result<mpsc::Sender<Job>, HashError> {
        if self.state.failed.load(Ordering::Relaxed) {
            return Err(self.take_error());
        }
        self.tx
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .ok_or_else(stopped)
    }

    /// Queues a job (waits while the queue is full). Fails with an earlier job's error.
    pub async fn submit(
        &self,
        job: impl FnOnce() -> Result<(), HashError> + Send + 'static,
    ) -> Result<(), HashError> {
        self.sender()?
            .send(Box::new(job))
            .await
            .map_err(|_| stopped())
    }

    /// [`HashPool::submit`] from a blocking thread.
    pub fn blocking_submit(
        &self,
        job: impl FnOnce() -> Result<(), HashError> + Send + 'static,
    ) -> Result<(), HashError> {
        self.sender()?
            .blocking_send(Box::new(job))
            .map_err(|_| stopped())
    }

    /// Waits (blocking) until every queued job ran; the first error of any job.
    pub fn finish(&self) -> Result<(), HashError> {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let workers = self
            .workers
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        for w in workers {
            let _ = w.join();
        }
        if self.state.failed.load(Ordering::Relaxed) {
            return Err(self.take_error());
        }
        Ok(())
    }

    /// Drops the queued jobs (the session failed); workers exit once the queue is empty.
    pub fn cancel(&self) {
        self.state.cancelled.store(true, Ordering::Relaxed);
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
    }

    fn take_error(&self) -> HashError {
        self.state
            .first_error
            .lock()
            .ok()
            .and_then(|mut e| e.take())
            .unwrap_or_else(|| HashError::new("", std::io::Error::other("an earlier read failed")))
    }
}

impl Drop for HashPool {
    fn drop(&mut self) {
        self.cancel();
    }
}

fn stopped() -> HashError {
    HashError::new("", std::io::Error::other("the digest workers stopped"))
}

fn worker(rx: &Mutex<mpsc::Receiver<Job>>, state: &State) {
    loop {
        let job = match rx.lock() {
            Ok(mut rx) => rx.blocking_recv(),
            Err(_) => return,
        };
        let Some(job) = job else { return };
        if state.cancelled.load(Ordering::Relaxed) || state.failed.load(Ordering::Relaxed) {
            continue;
        }
        if let Err(e) = job() {
            if let Ok(mut first) = state.first_error.lock()
                && first.is_none()
            {
                *first = Some(e);
            }
            state.failed.store(true, Ordering::Relaxed);
        }
    }
}
