//! Hello/Welcome on each stream: version, capabilities, transfer id, session id, stream index.

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

use super::framed::{FrameReader, FrameWriter, FramedError};
use crate::cas::pop::{self, Nonce};
use crate::wire::{BLOCK_SIZE, Message, PROTOCOL_VERSION, caps};

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Framed(#[from] FramedError),
    #[error("stream {stream}: expected {expected}, peer sent a {got:?} frame")]
    Unexpected {
        stream: u32,
        expected: &'static str,
        got: crate::wire::FrameType,
    },
    #[error("peer speaks protocol version {peer}, this end speaks {ours}")]
    Version { peer: u32, ours: u32 },
    #[error("peer's Hello is for transfer {peer:?}, this receiver serves {ours:?}")]
    Transfer { peer: String, ours: String },
    #[error("peer announced {count} streams with index {index}; at most {max} streams are allowed")]
    Streams { index: u32, count: u32, max: u32 },
    #[error("peer uses block size {0}, this end requires {BLOCK_SIZE}")]
    BlockSize(u32),
    #[error("receiver refused the session: {message}")]
    Refused {
        kind: ferry_proto::kind::ErrorKind,
        permanent: bool,
        message: String,
    },
    #[error("session id must be 16 bytes, got {0}")]
    SessionId(usize),
}

/// Sender side: write Hello, read Welcome; returns the negotiated capabilities and, with dedup,
/// the receiver's proof-of-possession nonce for this stream.
pub async fn send_hello<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    hello: pb::Hello,
) -> Result<(u64, Option<Nonce>), HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let stream = hello.stream_index;
    writer.send(&Message::Hello(hello.clone())).await?;
    writer.flush().await?;
    match reader.expect().await? {
        Message::Welcome(w) => {
            if w.version != PROTOCOL_VERSION {
                return Err(HandshakeError::Version {
                    peer: w.version,
                    ours: PROTOCOL_VERSION,
                });
            }
            let negotiated = w.capabilities & hello.capabilities;
            if negotiated & caps::DEDUP == 0 {
                return Ok((negotiated, None));
            }
            // Dedup without a well-formed nonce is not offered: fall back to sending everything.
            match <[u8; 32]>::try_from(w.dedup_nonce.as_slice()) {
                Ok(n) => Ok((negotiated, Some(Nonce(n)))),
                Err(_) => Ok((negotiated & !caps::DEDUP, None)),
            }
        }
        Message::Error(e) => Err(HandshakeError::Refused {
            kind: ferry_proto::kind::ErrorKind::from_pb(e.kind),
            permanent: e.permanent,
            message: super::escape_text(&e.message),
        }),
        other => Err(HandshakeError::Unexpected {
            stream,
            expected: "Welcome",
            got: other.frame_type(),
        }),
    }
}

/// Receiver side: read and validate Hello, answer Welcome with the intersection of the peer's
/// capabilities and `supported`. With dedup negotiated, a fresh proof-of-possession nonce for
/// this stream goes into the Welcome and is returned.
pub async fn accept_hello<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    transfer_id: &str,
    max_streams: u32,
    supported: u64,
) -> Result<(pb::Hello, u64, Option<Nonce>), HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let stream = reader.stream();
    let hello = match reader.expect().await? {
        Message::Hello(h) => h,
        other => {
            return Err(HandshakeError::Unexpected {
                stream,
                expected: "Hello",
                got: other.frame_type(),
            });
        }
    };
    let refuse = |e: HandshakeError| e;
    let check = || -> Result<(), HandshakeError> {
        if hello.version != PROTOCOL_VERSION {
            return Err(HandshakeError::Version {
                peer: hello.version,
                ours: PROTOCOL_VERSION,
            });
        }
        if hello.transfer_id != transfer_id {
            return Err(HandshakeError::Transfer {
                peer: hello.transfer_id.chars().take(128).collect(),
                ours: transfer_id.to_owned(),
            });
        }
        if hello.stream_count == 0
            || hello.stream_count > max_streams
            || hello.stream_index >= hello.stream_count
        {
            return Err(HandshakeError::Streams {
                index: hello.stream_index,
                count: hello.stream_count,
                max: max_streams,
            });
        }
        if hello.block_size as usize != BLOCK_SIZE {
            return Err(HandshakeError::BlockSize(hello.block_size));
        }
        if hello.session_id.len() != 16 {
            return Err(HandshakeError::SessionId(hello.session_id.len()));
        }
        Ok(())
    };
    if let Err(e) = check() {
        let _ = writer
            .send(&Message::Error(pb::Error {
                message: e.to_string(),
                kind: e.kind().to_pb() as i32,
                permanent: e.permanent(),
            }))
            .await;
        let _ = writer.flush().await;
        return Err(refuse(e));
    }
    let negotiated = hello.capabilities & supported;
    let nonce = (negotiated & caps::DEDUP != 0).then(pop::challenge);
    writer
        .send(&Message::Welcome(pb::Welcome {
            version: PROTOCOL_VERSION,
            capabilities: negotiated,
            session_id: hello.session_id.clone(),
            stream_index: hello.stream_index,
            block_size: BLOCK_SIZE as u32,
            dedup_nonce: nonce.map(|n| n.0.to_vec()).unwrap_or_default(),
        }))
        .await?;
    writer.flush().await?;
    Ok((hello, negotiated, nonce))
}
