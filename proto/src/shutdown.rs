//! One shutdown signal for all of a mover's tasks. When it fires (SIGTERM from the kubelet
//! deleting the pod, or SIGINT), the receiver stops accepting and every running session stops
//! and tells its peer why, with the kind `network` (the other end may retry, and a rerun
//! resumes), instead of the process dying under its streams and the peer seeing a reset.

use tokio::sync::watch;

/// Waits for the shutdown; cheap to clone, one per task.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<Option<&'static str>>);

/// Fires the [`Shutdown`] it was made with.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<Option<&'static str>>);

impl ShutdownTrigger {
    /// Fires the shutdown (the first reason stays).
    pub fn fire(&self, why: &'static str) {
        self.0.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some(why);
            }
            first
        });
    }
}

impl Shutdown {
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(None);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// A signal that never fires (library callers and tests that stop sessions otherwise).
    pub fn never() -> Shutdown {
        Shutdown::new().1
    }

    /// Fires on SIGTERM or SIGINT; call inside the runtime.
    pub fn on_signals() -> std::io::Result<Shutdown> {
        use tokio::signal::unix::{SignalKind, signal};
        let (trigger, shutdown) = Shutdown::new();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            let why = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::warn!("{why}: stopping; running sessions tell their peers");
            trigger.fire(why);
        });
        Ok(shutdown)
    }

    /// Why it fired, if it did.
    pub fn reason(&self) -> Option<&'static str> {
        *self.0.borrow()
    }

    /// Resolves when the shutdown fires (never, if its trigger is gone unfired).
    pub async fn wait(&self) -> &'static str {
        let mut rx = self.0.clone();
        loop {
            if let Some(why) = *rx.borrow_and_update() {
                return why;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_sees_the_first_reason() {
        let (trigger, shutdown) = Shutdown::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let s = shutdown.clone();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        assert_eq!(shutdown.reason(), None);
        trigger.fire("SIGTERM");
        trigger.fire("SIGINT");
        for w in waiters {
            assert_eq!(w.await.unwrap(), "SIGTERM");
        }
        // A waiter that comes late returns at once.
        assert_eq!(shutdown.wait().await, "SIGTERM");
    }

    #[tokio::test]
    async fn a_signal_that_never_fires_never_resolves() {
        let never = Shutdown::never();
        let r = tokio::time::timeout(std::time::Duration::from_millis(50), never.wait()).await;
        assert!(r.is_err());
        assert_eq!(never.reason(), None);
    }
}
