//! Fan-out Takes waiting for blocks, by run and hash: a Put that stores a block wakes only the
//! Takes of its own run waiting for that block. Waking every waiting Take on every insert cost
//! the service about 20 times the CPU with 256 of them waiting and slowed every honest Take;
//! and a Take woken by another tenant's Put would tell its client when that tenant stored the
//! block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use crate::cas::BlockHash;

#[derive(Debug, Default)]
pub struct Waiters(Mutex<HashMap<Key, Vec<Weak<Notify>>>>);

/// A run and a block hash.
type Key = (String, BlockHash);

/// A Take's registration; dropping it takes the Take's entries out.
pub struct Registration<'a> {
    waiters: &'a Waiters,
    keys: Vec<Key>,
    wake: Arc<Notify>,
}

impl Waiters {
    /// Registers `wake` for each of `hashes` in `run`, until the returned registration is
    /// dropped.
    pub fn register(&self, run: &str, hashes: &[BlockHash], wake: Arc<Notify>) -> Registration<'_> {
        let keys: Vec<_> = hashes.iter().map(|h| (run.to_owned(), *h)).collect();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for k in &keys {
            map.entry(k.clone())
                .or_default()
                .push(Arc::downgrade(&wake));
        }
        drop(map);
        Registration {
            waiters: self,
            keys,
            wake,
        }
    }

    /// Wakes the Takes of `run` waiting for `hash` (a wake-up that finds a Take reading is kept
    /// for it).
    pub fn wake(&self, run: &str, hash: &BlockHash) {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for w in map.get(&(run.to_owned(), *hash)).into_iter().flatten() {
            if let Some(n) = w.upgrade() {
                n.notify_one();
            }
        }
    }

    /// Hashes with a Take waiting (for tests).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.0.lock().unwrap_or_else(|e| e.into_inner());
        for k in &self.keys {
            if let Some(v) = map.get_mut(k) {
                v.retain(|w| w.upgrade().is_some_and(|n| !Arc::ptr_eq(&n, &self.wake)));
                if v.is_empty() {
                    map.remove(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_takes_of_a_run_waiting_for_a_hash_are_woken() {
        let w = Waiters::default();
        let (a, b) = (BlockHash::of(b"a"), BlockHash::of(b"b"));
        let (wa, wb) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let ra = w.register("r", &[a], wa.clone());
        let rb = w.register("r", &[b, a], wb.clone());
        // Another run's Put of `b` wakes nobody here.
        w.wake("other", &b);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), wb.notified())
                .await
                .is_err(),
            "woken by another run's Put"
        );
        w.wake("r", &b);
        // `wb` has a stored wake-up, `wa` none.
        tokio::time::timeout(std::time::Duration::from_secs(1), wb.notified())
            .await
            .unwrap_or_else(|_| panic!("b's waiter not woken"));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), wa.notified())
                .await
                .is_err(),
            "a's waiter woken by b"
        );
        drop(rb);
        assert_eq!(w.len(), 1);
        drop(ra);
        assert!(w.is_empty());
    }
}
