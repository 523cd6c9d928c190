//! The two ends of block dedup for one transfer, as the network session calls them. Frame
//! encoding belongs to `wire`/`session`; this module only decides and does the store work.
//!
//! Flow (see `docs/cas.md`): the receiver picks a random nonce per stream and sends it in its
//! Welcome; after a Want that asks for blocks of a file with at least one full block the sender
//! announces `(index, hash, proof)` for those full blocks; the receiver pins them, materialises
//! those it holds *and* whose proof matches its stored bytes, and answers which it still needs. Missing, corrupt and wrongly proven
//! blocks all look the same to the sender, so the answer reveals nothing to a sender that only
//! knows hashes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BLOCK_SIZE;
use super::error::Result;
use super::hash::BlockHash;
use super::lease::Lease;
use super::pop::{Nonce, PopKey, Proof, Secret, secret_of};
use super::store::{CasStore, Materialized, ProofCheck};

/// Most distinct blocks one announce may take from the store (each costs a 4 MiB read and two
/// hashes); the others come over the wire. This sender announces 16 at a time.
pub const MAX_STORE_READS_PER_ANNOUNCE: usize = 256;
/// Pins a transfer's lease may hold (about 4 MiB of lease file, 256 GiB of blocks taken from
/// the store). Beyond it proven blocks are still read, unpinned: one evicted between its proof
/// check and its read comes over the wire instead.
pub const MAX_PINS: u64 = 65536;
/// Rejected proofs are logged at most this often.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// One full block of a file, as the sender announces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnnouncedBlock {
    /// Block index in the file; its offset is `index * BLOCK_SIZE`.
    pub index: u64,
    pub hash: BlockHash,
    pub proof: Proof,
}

/// Sender side: derives the proof key once per transfer from the receiver's nonce.
pub struct DedupSender {
    key: PopKey,
}

impl DedupSender {
    pub fn new(nonce: &Nonce) -> Self {
        Self {
            key: PopKey::derive(nonce),
        }
    }

    /// Proof only (the caller already has the hash).
    pub fn prove(&self, block: &[u8]) -> Proof {
        self.key.prove(block)
    }

    /// Hash and proof for one full block the sender read from its source.
    pub fn announce(&self, index: u64, block: &[u8]) -> AnnouncedBlock {
        self.announce_known(index, BlockHash::of(block), &secret_of(block))
    }

    /// Hash and proof for a block whose hash and possession secret were computed already
    /// (by another session of the same sender): no pass over its bytes.
    pub fn announce_known(&self, index: u64, hash: BlockHash, secret: &Secret) -> AnnouncedBlock {
        AnnouncedBlock {
            index,
            hash,
            proof: self.key.prove_secret(secret),
        }
    }
}

/// Whether a file takes part in dedup: it has at least one full block.
pub fn file_has_full_block(size: u64) -> bool {
    size >= BLOCK_SIZE as u64
}

/// Counters for the summary (`dedup_blocks`, `dedup_bytes`) and for diagnosis.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DedupCounters {
    pub dedup_blocks: u64,
    pub dedup_bytes: u64,
    pub proofs_rejected: u64,
    pub blocks_inserted: u64,
    pub corrupt_discarded: u64,
}

/// Receiver side for one transfer: a lease on the shared store and the transfer's counters. The
/// proof keys are per stream (each stream's Welcome carries its own nonce) and passed in.
pub struct DedupReceiver {
    store: Arc<CasStore>,
    lease: Lease,
    dedup_blocks: AtomicU64,
    dedup_bytes: AtomicU64,
    proofs_rejected: AtomicU64,
    blocks_inserted: AtomicU64,
    /// Pins written to the lease.
    pins: AtomicU64,
    /// When rejected proofs were last logged, and how many since.
    reject_log: Mutex<(Option<Instant>, u64)>,
}

impl DedupReceiver {
    /// Takes a lease named after the transfer.
    pub fn new(store: Arc<CasStore>, transfer_id: &str) -> Result<Self> {
        let lease = store.lease(transfer_id)?;
        Ok(Self {
            store,
            lease,
            dedup_blocks: AtomicU64::new(0),
            dedup_bytes: AtomicU64::new(0),
            proofs_rejected: AtomicU64::new(0),
            blocks_inserted: AtomicU64::new(0),
            pins: AtomicU64::new(0),
            reject_log: Mutex::new((None, 0)),
        })
    }

    pub fn store(&self) -> &CasStore {
        &self.store
    }

    /// This transfer's lease (its pins).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Handles one announcement for the file open as `dst`, proofs checked under `key` (from the
    /// nonce of the stream it arrived on) and returns, parallel to `announced`, whether each
    /// block must still come over the wire.
    ///
    /// Proofs are checked first, against the secrets stored beside the blocks: a wrong proof
    /// reads no block, refreshes no last-use time and pins nothing, and costs the same whether
    /// or not the store holds the block. Each distinct hash is checked once (a repeat comes over
    /// the wire), at most [`MAX_STORE_READS_PER_ANNOUNCE`] proven blocks are read, and only
    /// those are pinned (at most [`MAX_PINS`] per transfer), then read, verified and written (on
    /// every core).
    pub fn materialize_announced(
        &self,
        key: &PopKey,
        dst: &(impl super::store::BlockSink + Sync + ?Sized),
        announced: &[AnnouncedBlock],
    ) -> Result<Vec<bool>> {
        let mut need = vec![true; announced.len()];
        let mut seen = HashSet::with_capacity(announced.len().min(MAX_STORE_READS_PER_ANNOUNCE));
        let mut proven: Vec<usize> = Vec::new();
        let mut rejected = 0u64;
        for (i, a) in announced.iter().enumerate() {
            if seen.len() >= MAX_STORE_READS_PER_ANNOUNCE || !seen.insert(a.hash) {
                continue;
            }
            match self.store.check_proof(&a.hash, key, &a.proof) {
                ProofCheck::Proven => proven.push(i),
                ProofCheck::Rejected => rejected += 1,
                ProofCheck::Absent => {}
            }
        }
        if rejected > 0 {
            self.proofs_rejected.fetch_add(rejected, Ordering::Relaxed);
            self.log_rejected(rejected);
        }
        if proven.is_empty() {
            return Ok(need);
        }
        // Pinned before they are read, so gc cannot evict them under the read, and kept for the
        // transfer (up to MAX_PINS): only proven blocks, so a forged announce pins nothing.
        let room = MAX_PINS.saturating_sub(self.pins.load(Ordering::Relaxed)) as usize;
        let hashes: Vec<BlockHash> = proven
            .iter()
            .take(room)
            .map(|&i| announced[i].hash)
            .collect();
        self.pins.fetch_add(hashes.len() as u64, Ordering::Relaxed);
        self.lease.pin(&hashes)?;
        let read = |part: &[usize]| -> Result<Vec<(usize, bool)>> {
            part.iter()
                .map(|&i| {
                    let a = &announced[i];
                    let offset = a.index.saturating_mul(BLOCK_SIZE as u64);
                    Ok((
                        i,
                        match self.store.materialize_proven(&a.hash, dst, offset)? {
                            Materialized::Written(len) => {
                                self.dedup_blocks.fetch_add(1, Ordering::Relaxed);
                                self.dedup_bytes.fetch_add(len, Ordering::Relaxed);
                                false
                            }
                            Materialized::Missing | Materialized::ProofRejected => true,
                        },
                    ))
                })
                .collect()
        };
        let parts = if dst.parallel_reads() {
            par_chunks(&proven, read)
        } else {
            vec![read(&proven)]
        };
        for part in parts {
            for (i, n) in part? {
                need[i] = n;
            }
        }
        Ok(need)
    }

    /// Rejected proofs are logged at most every 10 s, with how many there were since.
    fn log_rejected(&self, n: u64) {
        let mut log = self.reject_log.lock().unwrap_or_else(|e| e.into_inner());
        log.1 += n;
        if log.0.is_none_or(|t| t.elapsed() >= REJECT_LOG_EVERY) {
            tracing::warn!(
                rejected = log.1,
                "proofs of possession did not match stored blocks (fetched over the wire \
                 instead); a sender that knows hashes but not content may be probing the store"
            );
            *log = (Some(std::time::Instant::now()), 0);
        }
    }

    /// Adds a block that arrived over the wire and that the caller has verified against `hash`.
    /// Only blocks that can be announced are stored (full ones, long tails).
    pub fn insert_received(&self, hash: &BlockHash, bytes: &[u8]) -> Result<()> {
        if !super::storable(bytes.len()) {
            return Ok(());
        }
        if self.store.insert(hash, bytes)? == super::InsertOutcome::Inserted {
            self.blocks_inserted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn counters(&self) -> DedupCounters {
        DedupCounters {
            dedup_blocks: self.dedup_blocks.load(Ordering::Relaxed),
            dedup_bytes: self.dedup_bytes.load(Ordering::Relaxed),
            proofs_rejected: self.proofs_rejected.load(Ordering::Relaxed),
            blocks_inserted: self.blocks_inserted.load(Ordering::Relaxed),
            corrupt_discarded: self.store.corrupt_discarded(),
        }
    }
}

/// Runs `f` over up to four contiguous parts of `items` on scoped threads (one part per core),
/// returning the parts' results in order. Blocks are hashed twice per side; on two cores this
/// halves the wall time of an announce.
pub fn par_chunks<T: Sync, R: Send>(items: &[T], f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    if workers == 1 || items.len() < 2 {
        return vec![f(items)];
    }
    let size = items.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .chunks(size)
            .map(|part| scope.spawn(move || f(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                // A panic in a worker is a bug; surface it where it happened.
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}
