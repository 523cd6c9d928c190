//! Sans-IO frame codec of the ferry data protocol (docs/protocol.md).
//!
//! A frame is `[u32 LE payload length][u8 type][payload]`. The decoder looks at a byte buffer and
//! answers "need more bytes", "here is a frame" or "this is not a valid frame"; it never performs
//! I/O and never allocates for a frame before the header passed the length cap of its type, so a
//! peer cannot make the receiver reserve 4 GiB by writing a 5-byte header.
//!
//! Control messages are protobuf (`ferry.wire.v1`); bulk frames (`Block`, `Batch`, `Pack`) carry
//! `[u32 LE header length][protobuf header][raw bytes]` so file data is never copied through prost.

mod blocks;
mod frame;
mod message;

pub use blocks::{
    Bitmap, BlockSet, BlockSetError, MAX_WANT_RANGES, block_count, block_len, zero_block_hash,
};

pub use frame::{
    FRAME_HEADER_LEN, FrameType, MAX_CONTROL_PAYLOAD, MAX_FRAME_PAYLOAD, RawFrame, decode_frame,
    encode_frame_header, peek_header,
};
pub use message::{Message, encode_bulk_prefix, encode_message};

/// Protocol version carried in Hello/Welcome; a mismatch ends the session.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest block a file is cut into and the cap on any decoded (decompressed) block.
pub const BLOCK_SIZE: usize = 4 * 1024 * 1024;

/// Capability bits exchanged in Hello/Welcome; the session uses the intersection.
pub mod caps {
    pub const ZSTD: u64 = 1 << 0;
    pub const LZ4: u64 = 1 << 1;
    /// Block store dedup: a receiver offers it only when it has a store.
    pub const DEDUP: u64 = 1 << 2;
    pub const VERIFY: u64 = 1 << 3;
    pub const SYNC: u64 = 1 << 4;
    pub const DELETE: u64 = 1 << 5;
    pub const CHECKSUM: u64 = 1 << 6;
    /// Resume that trusts nothing the receiver holds: the Want names needed blocks as ranges
    /// and the sender confirms every held block with a ResumeCheck. Without it the receiver
    /// does not resume (it asks for every block).
    pub const RESUME: u64 = 1 << 7;
    /// Busy frames (with a work counter) replace keepalives, and each end holds the other to a
    /// progress deadline.
    pub const PROGRESS: u64 = 1 << 8;
    /// Hello carries the sender's filter rules; `--delete` keeps what they exclude.
    pub const FILTER: u64 = 1 << 9;
    /// `send --dry-run`: the receiver answers every offer with "skip", counts and lists what it
    /// would write and delete, and changes nothing.
    pub const DRY_RUN: u64 = 1 << 10;
    /// The receiver keeps `user.*` xattrs (`receive --xattrs`): only then does the sender read
    /// them (one listxattr per entry costs ~14 % on small files) and put them in entries.
    pub const XATTRS: u64 = 1 << 11;
    /// Fan-out: after stream 0's Done the sender waits for Refetch frames, and sends the
    /// blocks they name, until an empty one. A receiver grants it only in a fan-out, so a
    /// fellow destination that fails costs its siblings no retry.
    pub const REFETCH: u64 = 1 << 12;
    /// Fan-out: a large file's last block of at least 1 MiB (`cas::MIN_STORED_BLOCK`) is
    /// announced like a full block, so one destination takes it from the source and the others
    /// from its node service. A receiver grants it only in a fan-out.
    pub const TAILS: u64 = 1 << 13;
    /// Fan-out: the small files of an Offer that the receiver wants whole, when they come to
    /// 1 to 4 MiB, are announced as one pack (PackAnnounce) and sent, if still needed, as one
    /// Pack frame, so one destination takes them from the source and the others from its node
    /// service. A receiver grants it only in a fan-out.
    pub const PACKS: u64 = 1 << 14;
    /// Everything this implementation understands. DEDUP is added per receiver (only with a
    /// block store) and always requested by senders.
    pub const SUPPORTED: u64 =
        ZSTD | LZ4 | VERIFY | SYNC | DELETE | CHECKSUM | RESUME | PROGRESS | FILTER;
    /// Modes a receiver accepts beyond [`SUPPORTED`]: a sender asking for "everything
    /// supported" gets a real transfer, never a dry run by accident.
    pub const MODES: u64 = DRY_RUN;
}

/// Codec identifiers in Block and Batch headers.
pub mod codec {
    pub const RAW: u32 = 0;
    pub const ZSTD: u32 = 1;
    pub const LZ4: u32 = 2;
    /// An all-zero block, sent with no payload: the receiver leaves a hole.
    pub const ZERO: u32 = 3;
}

/// Why bytes from a peer are not a valid frame or message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("unknown frame type 0x{0:02x}")]
    UnknownType(u8),
    #[error("frame type {kind:?} announces {len} payload bytes, above its cap of {cap}")]
    TooLarge { kind: FrameType, len: u32, cap: u32 },
    #[error("frame type {kind:?} is reserved for the block store and not accepted")]
    Reserved { kind: FrameType },
    #[error("malformed {kind:?} frame: {what}")]
    Malformed { kind: FrameType, what: &'static str },
    #[error("malformed {kind:?} frame: protobuf decode failed")]
    Protobuf {
        kind: FrameType,
        #[source]
        source: prost::DecodeError,
    },
}
