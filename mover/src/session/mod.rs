//! Sender and receiver of one transfer over N parallel streams.
//!
//! Both are generic over `AsyncRead + AsyncWrite` streams, so tests drive them over in-memory
//! duplex pipes or real TLS connections alike. Per stream: Hello/Welcome, then the sender
//! pipelines Offers (groups of entries) and the receiver answers each with a Want; small wanted
//! files travel whole in Batch frames, large ones as 4 MiB Blocks striped over all streams and
//! written at their offsets. After every stream said Done, stream 0 carries directory metadata
//! (and `--delete` listings), then Finish; the receiver answers with a Summary of what it wrote.

pub mod compress;
pub mod dest;
mod dircache;
mod framed;
mod handshake;
mod limiter;
mod listen;
mod receiver;
pub mod relpath;
mod scan;
mod sender;
pub mod staging;

use std::time::Duration;

pub use compress::Compress;
pub use framed::{FrameReader, FrameWriter, FramedError};
pub use handshake::{HandshakeError, accept_hello, send_hello};
pub use listen::{ListenError, anyhow_chain, serve};
pub use receiver::{
    Accepted, BlockSource, ReceiveError, ReceiverConfig, accept_stream, receive_session,
};
pub use sender::{SendError, SenderConfig, send_session};

/// Files up to this size travel whole inside Batch frames; larger ones are cut into blocks.
pub const SMALL_FILE_MAX: u64 = 1024 * 1024;
/// Most entries per Offer.
pub const MAX_OFFER_ENTRIES: usize = 1024;
/// Most streams a receiver accepts per session.
pub const MAX_STREAMS: u32 = 16;
/// Offers in flight per stream before the sender waits for Wants.
pub const OFFER_WINDOW: usize = 8;

/// Timeouts shared by both ends.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TLS handshake plus Hello/Welcome.
    pub handshake: Duration,
    /// Longest silence on a stream (reads) or refusal to accept data (writes).
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }
}

/// What a finished session did (both ends report the receiver's counts for files and bytes).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Summary {
    pub files: u64,
    pub bytes: u64,
    pub wire_bytes: u64,
    pub seconds: f64,
    pub streams: u32,
    pub skipped: u64,
    pub resumed_bytes: u64,
    pub dedup_blocks: u64,
    pub dedup_bytes: u64,
}
