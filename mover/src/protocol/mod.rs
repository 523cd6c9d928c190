//! The data protocol without I/O: the frame codec ([`wire`]) and each end's rules, a state that
//! takes the peer's messages and says what is owed, wanted or refused ([`sender`],
//! [`receiver`]). The drivers in `crate::session` feed them from the streams and carry out what
//! they decide; these are unit-tested and fuzzed on their own. They read the block store's and
//! the tree's pure rules (which blocks are announced or stored, a peer path's checks), never a
//! file or a socket.

pub mod receiver;
pub mod sender;
pub mod wire;

/// Files up to this size travel whole inside Batch frames; larger ones are cut into blocks.
pub const SMALL_FILE_MAX: u64 = 1024 * 1024;
/// Most entries per Offer.
pub const MAX_OFFER_ENTRIES: usize = 1024;
/// Most streams a receiver accepts per session.
pub const MAX_STREAMS: u32 = 16;
/// Offers in flight per stream before the sender waits for Wants.
pub const OFFER_WINDOW: usize = 8;
