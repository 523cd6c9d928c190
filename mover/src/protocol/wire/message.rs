//! Typed messages: which protobuf body each frame type carries, and the bulk-frame layout.

use bytes::{BufMut, Bytes, BytesMut};
use ferry_proto::wire::v1 as pb;
use prost::Message as _;

use super::{FRAME_HEADER_LEN, FrameType, RawFrame, WireError, encode_frame_header};

/// A decoded frame.
#[derive(Debug, Clone)]
pub enum Message {
    Hello(pb::Hello),
    Welcome(pb::Welcome),
    Offer(pb::Offer),
    Want(pb::Want),
    /// A block of one file; `data` is stored (possibly compressed) bytes.
    Block {
        header: pb::BlockHeader,
        data: Bytes,
    },
    /// Several whole small files; `data` holds their stored bytes back to back.
    Batch {
        header: pb::BatchHeader,
        data: Bytes,
    },
    DirDone(pb::DirDone),
    Done(pb::Done),
    Finish,
    Summary(pb::Summary),
    Error(pb::Error),
    Keepalive,
    /// Block store dedup: the sender's hashes and proofs of possession for blocks of one file.
    BlockAnnounce(pb::BlockAnnounce),
    /// Block store dedup: which announced blocks the receiver still needs over the wire; also
    /// the answer to a ResumeCheck.
    NeedBlocks(pb::NeedBlocks),
    /// Resume: the sender's hashes of blocks the receiver holds from an earlier run.
    ResumeCheck(pb::ResumeCheck),
    /// Liveness with a work counter (progress capability), either direction.
    Busy(pb::Busy),
    /// Fan-out: blocks the receiver left to a fellow destination that failed, asked of the
    /// sender after all data; an empty one ends the asking.
    Refetch(pb::Refetch),
    /// Fan-out: the small files of one Offer announced as one content-addressed pack.
    PackAnnounce(pb::PackAnnounce),
    /// Fan-out: a pack's stored bytes (its files' contents back to back, maybe compressed).
    Pack {
        header: pb::PackHeader,
        data: Bytes,
    },
}

impl Message {
    /// Decodes the body of a frame. The reserved possession challenge/proof frames are refused
    /// here: proofs travel inside BlockAnnounce, so a peer sending them is out of protocol.
    pub fn decode(frame: RawFrame) -> Result<Self, WireError> {
        let kind = frame.kind;
        let p = frame.payload;
        let pbe = |source| WireError::Protobuf { kind, source };
        Ok(match kind {
            FrameType::Hello => Self::Hello(pb::Hello::decode(p).map_err(pbe)?),
            FrameType::Welcome => Self::Welcome(pb::Welcome::decode(p).map_err(pbe)?),
            FrameType::Offer => Self::Offer(pb::Offer::decode(p).map_err(pbe)?),
            FrameType::Want => Self::Want(pb::Want::decode(p).map_err(pbe)?),
            FrameType::Block => {
                let (h, data) = split_bulk(kind, p)?;
                Self::Block {
                    header: pb::BlockHeader::decode(h).map_err(pbe)?,
                    data,
                }
            }
            FrameType::Batch => {
                let (h, data) = split_bulk(kind, p)?;
                Self::Batch {
                    header: pb::BatchHeader::decode(h).map_err(pbe)?,
                    data,
                }
            }
            FrameType::Pack => {
                let (h, data) = split_bulk(kind, p)?;
                Self::Pack {
                    header: pb::PackHeader::decode(h).map_err(pbe)?,
                    data,
                }
            }
            FrameType::PackAnnounce => {
                Self::PackAnnounce(pb::PackAnnounce::decode(p).map_err(pbe)?)
            }
            FrameType::DirDone => Self::DirDone(pb::DirDone::decode(p).map_err(pbe)?),
            FrameType::Done => Self::Done(pb::Done::decode(p).map_err(pbe)?),
            FrameType::Finish => {
                if !p.is_empty() {
                    return Err(WireError::Malformed {
                        kind,
                        what: "Finish carries no payload",
                    });
                }
                Self::Finish
            }
            FrameType::Keepalive => {
                if !p.is_empty() {
                    return Err(WireError::Malformed {
                        kind,
                        what: "Keepalive carries no payload",
                    });
                }
                Self::Keepalive
            }
            FrameType::Summary => Self::Summary(pb::Summary::decode(p).map_err(pbe)?),
            FrameType::Error => Self::Error(pb::Error::decode(p).map_err(pbe)?),
            FrameType::BlockAnnounce => {
                Self::BlockAnnounce(pb::BlockAnnounce::decode(p).map_err(pbe)?)
            }
            FrameType::NeedBlocks => Self::NeedBlocks(pb::NeedBlocks::decode(p).map_err(pbe)?),
            FrameType::ResumeCheck => Self::ResumeCheck(pb::ResumeCheck::decode(p).map_err(pbe)?),
            FrameType::Refetch => Self::Refetch(pb::Refetch::decode(p).map_err(pbe)?),
            FrameType::Busy => Self::Busy(pb::Busy::decode(p).map_err(pbe)?),
            FrameType::PossessionChallenge | FrameType::PossessionProof => {
                return Err(WireError::Reserved { kind });
            }
        })
    }

    pub fn frame_type(&self) -> FrameType {
        match self {
            Self::Hello(_) => FrameType::Hello,
            Self::Welcome(_) => FrameType::Welcome,
            Self::Offer(_) => FrameType::Offer,
            Self::Want(_) => FrameType::Want,
            Self::Block { .. } => FrameType::Block,
            Self::Batch { .. } => FrameType::Batch,
            Self::DirDone(_) => FrameType::DirDone,
            Self::Done(_) => FrameType::Done,
            Self::Finish => FrameType::Finish,
            Self::Summary(_) => FrameType::Summary,
            Self::Error(_) => FrameType::Error,
            Self::Keepalive => FrameType::Keepalive,
            Self::BlockAnnounce(_) => FrameType::BlockAnnounce,
            Self::NeedBlocks(_) => FrameType::NeedBlocks,
            Self::ResumeCheck(_) => FrameType::ResumeCheck,
            Self::Refetch(_) => FrameType::Refetch,
            Self::PackAnnounce(_) => FrameType::PackAnnounce,
            Self::Pack { .. } => FrameType::Pack,
            Self::Busy(_) => FrameType::Busy,
        }
    }

    /// Appends the whole frame to `out` (bulk data is copied; the sender's hot path uses
    /// [`encode_bulk_prefix`] and writes the data slice separately instead).
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), WireError> {
        match self {
            Self::Hello(m) => encode_message(FrameType::Hello, m, out),
            Self::Welcome(m) => encode_message(FrameType::Welcome, m, out),
            Self::Offer(m) => encode_message(FrameType::Offer, m, out),
            Self::Want(m) => encode_message(FrameType::Want, m, out),
            Self::Block { header, data } => {
                encode_bulk_prefix(FrameType::Block, header, data.len(), out)?;
                out.put_slice(data);
                Ok(())
            }
            Self::Batch { header, data } => {
                encode_bulk_prefix(FrameType::Batch, header, data.len(), out)?;
                out.put_slice(data);
                Ok(())
            }
            Self::Pack { header, data } => {
                encode_bulk_prefix(FrameType::Pack, header, data.len(), out)?;
                out.put_slice(data);
                Ok(())
            }
            Self::PackAnnounce(m) => encode_message(FrameType::PackAnnounce, m, out),
            Self::DirDone(m) => encode_message(FrameType::DirDone, m, out),
            Self::Done(m) => encode_message(FrameType::Done, m, out),
            Self::Finish => {
                out.put_slice(&encode_frame_header(FrameType::Finish, 0));
                Ok(())
            }
            Self::Keepalive => {
                out.put_slice(&encode_frame_header(FrameType::Keepalive, 0));
                Ok(())
            }
            Self::Summary(m) => encode_message(FrameType::Summary, m, out),
            Self::Error(m) => encode_message(FrameType::Error, m, out),
            Self::BlockAnnounce(m) => encode_message(FrameType::BlockAnnounce, m, out),
            Self::NeedBlocks(m) => encode_message(FrameType::NeedBlocks, m, out),
            Self::ResumeCheck(m) => encode_message(FrameType::ResumeCheck, m, out),
            Self::Refetch(m) => encode_message(FrameType::Refetch, m, out),
            Self::Busy(m) => encode_message(FrameType::Busy, m, out),
        }
    }
}

fn checked_len(kind: FrameType, len: usize) -> Result<u32, WireError> {
    let cap = kind.payload_cap();
    match u32::try_from(len) {
        Ok(l) if l <= cap => Ok(l),
        _ => Err(WireError::TooLarge {
            kind,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            cap,
        }),
    }
}

/// Appends a frame carrying one protobuf message.
pub fn encode_message<M: prost::Message>(
    kind: FrameType,
    msg: &M,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    let len = checked_len(kind, msg.encoded_len())?;
    out.reserve(FRAME_HEADER_LEN + len as usize);
    out.put_slice(&encode_frame_header(kind, len));
    // Cannot fail: capacity was reserved above.
    msg.encode_raw(out);
    Ok(())
}

/// Appends frame header, header length and header of a bulk frame whose `data_len` bytes the
/// caller writes right after (so file data is never copied into a frame buffer).
pub fn encode_bulk_prefix<M: prost::Message>(
    kind: FrameType,
    header: &M,
    data_len: usize,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    let hlen = header.encoded_len();
    let total = 4usize
        .checked_add(hlen)
        .and_then(|v| v.checked_add(data_len))
        .unwrap_or(usize::MAX);
    let len = checked_len(kind, total)?;
    out.reserve(FRAME_HEADER_LEN + 4 + hlen);
    out.put_slice(&encode_frame_header(kind, len));
    out.put_u32_le(hlen as u32);
    header.encode_raw(out);
    Ok(())
}

fn split_bulk(kind: FrameType, mut p: Bytes) -> Result<(Bytes, Bytes), WireError> {
    if p.len() < 4 {
        return Err(WireError::Malformed {
            kind,
            what: "missing header length",
        });
    }
    let hlen = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
    if hlen > p.len() - 4 {
        return Err(WireError::Malformed {
            kind,
            what: "header length beyond the frame",
        });
    }
    let _ = p.split_to(4);
    let header = p.split_to(hlen);
    Ok((header, p))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_largest_filter_rules_allowed_fit_a_hello_frame() {
        use crate::tree::filter::{Filter, MAX_PATTERN};
        let long = "x".repeat(MAX_PATTERN);
        let fits: Vec<(bool, &str)> = (0..14).map(|_| (false, long.as_str())).collect();
        let f = Filter::new(fits).expect("rules");
        f.check_wire_size().expect("56 KiB fits");
        // What the check allows really fits in a Hello frame with the rest of it.
        let hello = ferry_proto::wire::v1::Hello {
            transfer_id: "t".repeat(253),
            session_id: vec![0; 16],
            filter_rules: f.to_wire(),
            ..Default::default()
        };
        let mut buf = bytes::BytesMut::new();
        crate::wire::Message::Hello(hello)
            .encode(&mut buf)
            .expect("encode");
        let payload = buf.len() - crate::wire::FRAME_HEADER_LEN;
        assert!(
            payload <= crate::wire::MAX_CONTROL_PAYLOAD as usize,
            "{payload}"
        );
    }

    use super::super::{MAX_FRAME_PAYLOAD, decode_frame};
    use super::*;

    fn roundtrip(m: &Message) -> Message {
        let mut buf = BytesMut::new();
        m.encode(&mut buf).unwrap();
        let frame = decode_frame(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty(), "decoder must consume exactly one frame");
        Message::decode(frame).unwrap()
    }

    fn sample_session() -> Vec<Message> {
        vec![
            Message::Hello(pb::Hello {
                version: 1,
                capabilities: 3,
                transfer_id: "t-1".into(),
                session_id: vec![7; 16],
                stream_index: 0,
                stream_count: 2,
                block_size: 4 << 20,
                filter_rules: Vec::new(),
            }),
            Message::Offer(pb::Offer {
                offer_id: 9,
                entries: vec![pb::Entry {
                    path: "a/b".into(),
                    kind: pb::EntryKind::File as i32,
                    size: 5,
                    ..Default::default()
                }],
            }),
            Message::Block {
                header: pb::BlockHeader {
                    file_id: 1,
                    index: 2,
                    raw_len: 5,
                    codec: 0,
                    hash: vec![1; 32],
                },
                data: Bytes::from_static(b"hello"),
            },
            Message::Finish,
        ]
    }

    #[test]
    fn messages_round_trip() {
        for m in sample_session() {
            let back = roundtrip(&m);
            assert_eq!(format!("{m:?}"), format!("{back:?}"));
        }
    }

    #[test]
    fn bulk_data_survives_round_trip() {
        let data = Bytes::from(vec![0xab; 100_000]);
        let m = Message::Batch {
            header: pb::BatchHeader { files: vec![] },
            data: data.clone(),
        };
        match roundtrip(&m) {
            Message::Batch { data: d, .. } => assert_eq!(d, data),
            other => panic!("wrong message {other:?}"),
        }
    }

    #[test]
    fn every_prefix_of_a_session_needs_more_and_never_errors() {
        let mut whole = BytesMut::new();
        for m in sample_session() {
            m.encode(&mut whole).unwrap();
        }
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            let mut frames = 0;
            while let Some(f) = decode_frame(&mut buf).unwrap() {
                Message::decode(f).unwrap();
                frames += 1;
            }
            assert!(frames < 4, "a strict prefix cannot hold all four frames");
        }
    }

    #[test]
    fn four_gib_length_is_refused_before_allocation() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, FrameType::Block as u8][..]);
        let cap_before = buf.capacity();
        let err = decode_frame(&mut buf).unwrap_err();
        assert!(
            matches!(err, WireError::TooLarge { len: u32::MAX, .. }),
            "{err}"
        );
        assert_eq!(
            buf.capacity(),
            cap_before,
            "nothing reserved for a refused frame"
        );
    }

    #[test]
    fn control_frames_have_a_small_cap() {
        let len = MAX_FRAME_PAYLOAD.to_le_bytes();
        let mut buf = BytesMut::from(&[len[0], len[1], len[2], len[3], FrameType::Hello as u8][..]);
        assert!(matches!(
            decode_frame(&mut buf),
            Err(WireError::TooLarge {
                kind: FrameType::Hello,
                ..
            })
        ));
    }

    #[test]
    fn unknown_and_reserved_types_are_errors() {
        let mut buf = BytesMut::from(&[0, 0, 0, 0, 0x7f][..]);
        assert!(matches!(
            decode_frame(&mut buf),
            Err(WireError::UnknownType(0x7f))
        ));
        let mut buf = BytesMut::from(&[0, 0, 0, 0, 0x22][..]);
        let f = decode_frame(&mut buf).unwrap().unwrap();
        assert!(matches!(
            Message::decode(f),
            Err(WireError::Reserved { .. })
        ));
    }

    #[test]
    fn bulk_header_length_past_the_end_is_malformed() {
        let mut buf = BytesMut::new();
        buf.put_slice(&encode_frame_header(FrameType::Block, 6));
        buf.put_u32_le(1000);
        buf.put_slice(&[0, 0]);
        let f = decode_frame(&mut buf).unwrap().unwrap();
        assert!(matches!(
            Message::decode(f),
            Err(WireError::Malformed { .. })
        ));
    }

    #[test]
    fn garbage_protobuf_is_an_error_not_a_panic() {
        let mut buf = BytesMut::new();
        buf.put_slice(&encode_frame_header(FrameType::Offer, 3));
        buf.put_slice(&[0xff, 0xff, 0xff]);
        let f = decode_frame(&mut buf).unwrap().unwrap();
        assert!(matches!(
            Message::decode(f),
            Err(WireError::Protobuf { .. })
        ));
    }
}
