//! Per-node content-addressed block store.
//!
//! Blocks of up to [`BLOCK_SIZE`] bytes, named by their BLAKE3 hash, in a directory shared by every
//! receiver on the node (see `docs/cas.md` for the layout, the crash-safety argument, the LRU and
//! lease rules, proof of possession and the protocol flow).
//!
//! - [`store`]: open, insert with crash-safe publication, lookup, verified reads, materialising;
//! - [`lease`]: pins of active transfers that gc must not evict;
//! - [`gc`]: LRU eviction down to the cap, cleanup of dead writers' temps and dead leases;
//! - [`verify`]: statistics and a full scrub for operators;
//! - [`pop`]: proof of possession (pure functions);
//! - [`dedup`]: the per-transfer sender and receiver helpers the network protocol calls;
//! - [`lru`]: the eviction policy, pure.

pub mod dedup;
mod error;
pub mod gc;
mod hash;
mod layout;
pub mod lease;
mod lock;
pub mod lru;
pub mod pop;
mod scan;
pub mod store;
mod usage;
pub mod verify;

pub use error::{CasError, Result};
pub use gc::GcReport;
pub use hash::{BlockHash, ParseHashError};
pub use lease::Lease;
pub use store::{BlockRef, CasOptions, CasStore, InsertOutcome, Materialized};
pub use verify::{StoreStats, VerifyReport};

/// The largest block the store holds, and the block size of the network protocol: files with at
/// least one full block of this size take part in dedup.
pub const BLOCK_SIZE: usize = 4 << 20;
/// The shortest block the store holds: a file's last block of at least this size is kept and
/// announced in a fan-out (capability `tails`). Shorter tails travel from the source, which
/// costs little, and bound the store's entries to its cap over this size.
pub const MIN_STORED_BLOCK: usize = 1 << 20;

/// Whether a block of `len` bytes may be kept in a store: a full block, or a long tail.
pub fn storable(len: usize) -> bool {
    (MIN_STORED_BLOCK..=BLOCK_SIZE).contains(&len)
}

/// Whether a block of `len` bytes is announced (the sender) and may be (the receiver): a full
/// block always, a long tail only with the `tails` capability.
pub fn announceable(len: u64, tails: bool) -> bool {
    len == BLOCK_SIZE as u64 || (tails && storable(len as usize))
}
