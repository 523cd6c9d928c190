//! What the node service counts while it serves, read by its metrics and its statistics.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// What the service counted since it started (the store's own figures come from a scan).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    /// Blocks asked for and not handed out: absent, not proven or corrupt, counted alike once
    /// a Take ends (a counter of refused proofs alone would tell a prober whether a node
    /// holds a block it named with a wrong proof).
    pub misses: AtomicU64,
    pub inserted: AtomicU64,
    pub put_refused: AtomicU64,
    pub last_gc_unix: AtomicU64,
    pub evicted: AtomicU64,
    /// Blocks dropped because their client did not take them in time.
    pub sends_expired: Arc<AtomicU64>,
}
