//! Frame boundaries: header layout, per-type caps, decode from a buffer, encode a header.

use bytes::{Buf, Bytes, BytesMut};

use super::WireError;

/// `u32` length + `u8` type.
pub const FRAME_HEADER_LEN: usize = 5;
/// Hard cap on any payload (16 MiB), checked on the header before anything is allocated.
pub const MAX_FRAME_PAYLOAD: u32 = 16 * 1024 * 1024;
/// Cap for small control frames (Hello, Welcome, Done, ...).
pub const MAX_CONTROL_PAYLOAD: u32 = 64 * 1024;

/// Every frame type of protocol version 1. Values are the on-wire type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    Hello = 0x01,
    Welcome = 0x02,
    Offer = 0x03,
    Want = 0x04,
    Block = 0x05,
    Batch = 0x06,
    DirDone = 0x07,
    Done = 0x08,
    Finish = 0x09,
    Summary = 0x0a,
    Error = 0x0b,
    /// Liveness on a quiet stream; carries nothing.
    Keepalive = 0x0c,
    /// Resume: the sender's hashes of blocks the receiver holds from an earlier run.
    ResumeCheck = 0x0d,
    /// Liveness with a work counter (progress capability).
    Busy = 0x0e,
    /// Block store: the sender announces hashes (and proofs of possession) of full blocks.
    BlockAnnounce = 0x20,
    /// Block store or resume: the receiver answers which announced blocks must still come.
    NeedBlocks = 0x21,
    /// Reserved (a challenge-response proof of possession; proofs now ride in BlockAnnounce).
    PossessionChallenge = 0x22,
    /// Reserved, as [`FrameType::PossessionChallenge`].
    PossessionProof = 0x23,
    /// Fan-out (refetch capability): after all data, the receiver asks for blocks it had left
    /// to a fellow destination that did not deliver them.
    Refetch = 0x24,
    /// Fan-out (packs capability): the small files of an Offer announced as one pack.
    PackAnnounce = 0x25,
    /// Fan-out (packs capability): a pack's bytes (its files' contents back to back).
    Pack = 0x26,
}

impl FrameType {
    pub fn from_byte(byte: u8) -> Result<Self, WireError> {
        Ok(match byte {
            0x01 => Self::Hello,
            0x02 => Self::Welcome,
            0x03 => Self::Offer,
            0x04 => Self::Want,
            0x05 => Self::Block,
            0x06 => Self::Batch,
            0x07 => Self::DirDone,
            0x08 => Self::Done,
            0x09 => Self::Finish,
            0x0a => Self::Summary,
            0x0b => Self::Error,
            0x0c => Self::Keepalive,
            0x0d => Self::ResumeCheck,
            0x0e => Self::Busy,
            0x20 => Self::BlockAnnounce,
            0x21 => Self::NeedBlocks,
            0x22 => Self::PossessionChallenge,
            0x23 => Self::PossessionProof,
            0x24 => Self::Refetch,
            0x25 => Self::PackAnnounce,
            0x26 => Self::Pack,
            other => return Err(WireError::UnknownType(other)),
        })
    }

    /// Largest payload a frame of this type may announce.
    pub fn payload_cap(self) -> u32 {
        match self {
            Self::Offer
            | Self::Block
            | Self::Batch
            | Self::Pack
            | Self::DirDone
            | Self::BlockAnnounce
            | Self::ResumeCheck => MAX_FRAME_PAYLOAD,
            _ => MAX_CONTROL_PAYLOAD,
        }
    }
}

/// One whole frame cut out of the input buffer (payload shares the buffer's allocation).
#[derive(Debug, Clone)]
pub struct RawFrame {
    pub kind: FrameType,
    pub payload: Bytes,
}

/// The kind and payload length of the frame at the front of `buf`, once its header is there
/// and has passed the kind's cap.
pub fn peek_header(buf: &[u8]) -> Result<Option<(FrameType, u32)>, WireError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let kind = FrameType::from_byte(buf[4])?;
    let cap = kind.payload_cap();
    if len > cap {
        return Err(WireError::TooLarge { kind, len, cap });
    }
    Ok(Some((kind, len)))
}

/// Tries to cut one frame off the front of `buf`.
///
/// `Ok(None)` means more bytes are needed; in that case `buf` has been reserved for the whole
/// frame (only once its header passed the cap), so the caller can read straight into it.
pub fn decode_frame(buf: &mut BytesMut) -> Result<Option<RawFrame>, WireError> {
    let Some((kind, len)) = peek_header(buf)? else {
        return Ok(None);
    };
    let total = FRAME_HEADER_LEN + len as usize;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    buf.advance(FRAME_HEADER_LEN);
    let payload = buf.split_to(len as usize).freeze();
    Ok(Some(RawFrame { kind, payload }))
}

/// Writes the 5-byte header of a frame whose payload is `payload_len` bytes.
pub fn encode_frame_header(kind: FrameType, payload_len: u32) -> [u8; FRAME_HEADER_LEN] {
    let l = payload_len.to_le_bytes();
    [l[0], l[1], l[2], l[3], kind as u8]
}
