//! Frames over any byte stream: a reader that decodes with the sans-IO codec under an idle
//! timeout, a writer that writes whole frames under the same timeout, and wire-byte counting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::buffers::BufferPool;
use crate::wire::{self, FRAME_HEADER_LEN, FrameType, Message, RawFrame, WireError};

/// Payloads from this size on (Blocks, Batches) are read into a buffer of their own, taken from
/// the reader's pool and given back once the frame was handled: no fresh pages to fault in per
/// frame, and the read buffer stays small.
const LARGE_PAYLOAD: usize = 256 * 1024;
/// A pooled payload buffer: the largest Batch (4 MiB of content, the file that crosses it and
/// its header) or Block.
const PAYLOAD_BUFFER: usize = 6 * 1024 * 1024;
/// Idle payload buffers a reader of its own keeps (one being handled, one being read, one
/// queued).
const PAYLOAD_BUFFERS_KEPT: usize = 3;

/// A pool of large payload buffers for the readers of `streams` streams of one session.
pub fn payload_pool(streams: usize) -> Arc<BufferPool> {
    BufferPool::new(PAYLOAD_BUFFER, PAYLOAD_BUFFERS_KEPT.max(2 * streams + 1))
}

#[derive(Debug, thiserror::Error)]
pub enum FramedError {
    #[error("stream {stream}: peer sent nothing for {secs} s (idle timeout)")]
    IdleTimeout { stream: u32, secs: u64 },
    #[error("stream {stream}: peer did not accept data for {secs} s (write timeout)")]
    WriteTimeout { stream: u32, secs: u64 },
    #[error("stream {stream}: connection closed by peer{}", if *.mid_frame { " in the middle of a frame" } else { "" })]
    Closed { stream: u32, mid_frame: bool },
    #[error("stream {stream}: read failed")]
    Read {
        stream: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("stream {stream}: write failed")]
    Write {
        stream: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("stream {stream}: invalid frame from peer")]
    Wire {
        stream: u32,
        #[source]
        source: WireError,
    },
}

/// Reads whole frames; memory is the 16 MiB frame cap plus one read chunk.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    payloads: Arc<BufferPool>,
    idle: Duration,
    stream: u32,
    wire_bytes: Arc<AtomicU64>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, stream: u32, idle: Duration, wire_bytes: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(64 * 1024),
            payloads: BufferPool::new(PAYLOAD_BUFFER, PAYLOAD_BUFFERS_KEPT),
            idle,
            stream,
            wire_bytes,
        }
    }

    /// Next frame, or `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Message>, FramedError> {
        let stream = self.stream;
        loop {
            let header = wire::peek_header(&self.buf);
            let frame = match header {
                Ok(Some((kind, len)))
                    if len as usize >= LARGE_PAYLOAD
                        && self.buf.len() < FRAME_HEADER_LEN + len as usize =>
                {
                    Ok(Some(self.read_large(kind, len as usize).await?))
                }
                Ok(_) => wire::decode_frame(&mut self.buf),
                Err(e) => Err(e),
            };
            match frame {
                Ok(Some(frame)) => {
                    self.wire_bytes.fetch_add(
                        (FRAME_HEADER_LEN + frame.payload.len()) as u64,
                        Ordering::Relaxed,
                    );
                    return Message::decode(frame)
                        .map(Some)
                        .map_err(|source| FramedError::Wire { stream, source });
                }
                Ok(None) => {}
                Err(source) => return Err(FramedError::Wire { stream, source }),
            }
            if self.buf.capacity() - self.buf.len() < 16 * 1024 {
                self.buf.reserve(64 * 1024);
            }
            if self.read_some(None).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(FramedError::Closed {
                    stream,
                    mid_frame: true,
                });
            }
        }
    }

    /// The rest of a large frame whose header is at the front of the read buffer, read into a
    /// pooled buffer of its own.
    async fn read_large(&mut self, kind: FrameType, len: usize) -> Result<RawFrame, FramedError> {
        self.buf.advance(FRAME_HEADER_LEN);
        let mut payload = self.payloads.take(len);
        // Everything buffered belongs to this frame (it is not complete yet).
        payload.extend_from_slice(&self.buf);
        self.buf.clear();
        while payload.len() < len {
            let want = len - payload.len();
            if self.read_some(Some((&mut payload, want))).await? == 0 {
                return Err(FramedError::Closed {
                    stream: self.stream,
                    mid_frame: true,
                });
            }
        }
        Ok(RawFrame {
            kind,
            payload: self.payloads.freeze(payload),
        })
    }

    /// One read under the idle timeout: into the read buffer, or at most `want` bytes onto the
    /// end of `into`.
    async fn read_some(
        &mut self,
        into: Option<(&mut Vec<u8>, usize)>,
    ) -> Result<usize, FramedError> {
        let stream = self.stream;
        let read = match into {
            None => tokio::time::timeout(self.idle, self.inner.read_buf(&mut self.buf)).await,
            Some((v, want)) => {
                let mut limited = v.limit(want);
                tokio::time::timeout(self.idle, self.inner.read_buf(&mut limited)).await
            }
        };
        match read {
            Err(_) => Err(FramedError::IdleTimeout {
                stream,
                secs: self.idle.as_secs(),
            }),
            Ok(Err(source)) => Err(FramedError::Read { stream, source }),
            Ok(Ok(n)) => Ok(n),
        }
    }

    /// Next frame; end of stream is an error here.
    pub async fn expect(&mut self) -> Result<Message, FramedError> {
        match self.next().await? {
            Some(m) => Ok(m),
            None => Err(FramedError::Closed {
                stream: self.stream,
                mid_frame: false,
            }),
        }
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// Switches from the handshake deadline to the idle timeout once the stream is known.
    pub fn set_stream(&mut self, stream: u32, idle: Duration) {
        self.stream = stream;
        self.idle = idle;
    }

    /// Takes large payload buffers from `pool` from now on (one pool for a session's streams).
    pub fn share_payloads(&mut self, pool: Arc<BufferPool>) {
        self.payloads = pool;
    }

    /// Counts the frames read from now on into `wire_bytes` (a session's own counter).
    pub fn set_wire_counter(&mut self, wire_bytes: Arc<AtomicU64>) {
        self.wire_bytes = wire_bytes;
    }
}

/// Writes frames; bulk data is written from the caller's buffer without copying into a frame.
pub struct FrameWriter<W> {
    inner: W,
    buf: BytesMut,
    idle: Duration,
    stream: u32,
    wire_bytes: Arc<AtomicU64>,
}

/// rustls performs best when fed plaintext in pieces of at most 64 KiB (engine.md §5.2).
const WRITE_PIECE: usize = 64 * 1024;

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W, stream: u32, idle: Duration, wire_bytes: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(4096),
            idle,
            stream,
            wire_bytes,
        }
    }

    pub async fn send(&mut self, msg: &Message) -> Result<(), FramedError> {
        let stream = self.stream;
        self.buf.clear();
        match msg {
            // Bulk: prefix from our small buffer, data straight from the message's buffer.
            Message::Block { header, data } => {
                self.send_bulk(FrameType::Block, header, data).await?
            }
            Message::Batch { header, data } => {
                self.send_bulk(FrameType::Batch, header, data).await?
            }
            Message::Pack { header, data } => self.send_bulk(FrameType::Pack, header, data).await?,
            other => {
                other
                    .encode(&mut self.buf)
                    .map_err(|source| FramedError::Wire { stream, source })?;
                let frame = self.buf.split().freeze();
                self.write_all(&frame).await?;
            }
        }
        Ok(())
    }

    /// A bulk frame: its prefix (header, header length, protobuf header) from this writer's
    /// buffer, then `data` as it is, never copied into a frame buffer.
    async fn send_bulk<M: prost::Message>(
        &mut self,
        kind: FrameType,
        header: &M,
        data: &[u8],
    ) -> Result<(), FramedError> {
        let stream = self.stream;
        wire::encode_bulk_prefix(kind, header, data.len(), &mut self.buf)
            .map_err(|source| FramedError::Wire { stream, source })?;
        let prefix = self.buf.split().freeze();
        self.write_all(&prefix).await?;
        self.write_all(data).await
    }

    /// Writes raw bytes (used by tests that speak a broken protocol on purpose).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), FramedError> {
        self.write_all(bytes).await?;
        self.flush().await
    }

    async fn write_all(&mut self, mut data: &[u8]) -> Result<(), FramedError> {
        let stream = self.stream;
        while !data.is_empty() {
            let n = data.len().min(WRITE_PIECE);
            match tokio::time::timeout(self.idle, self.inner.write_all(&data[..n])).await {
                Err(_) => {
                    return Err(FramedError::WriteTimeout {
                        stream,
                        secs: self.idle.as_secs(),
                    });
                }
                Ok(Err(source)) => return Err(FramedError::Write { stream, source }),
                Ok(Ok(())) => {}
            }
            self.wire_bytes.fetch_add(n as u64, Ordering::Relaxed);
            data = &data[n..];
        }
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<(), FramedError> {
        let stream = self.stream;
        match tokio::time::timeout(self.idle, self.inner.flush()).await {
            Err(_) => Err(FramedError::WriteTimeout {
                stream,
                secs: self.idle.as_secs(),
            }),
            Ok(r) => r.map_err(|source| FramedError::Write { stream, source }),
        }
    }

    pub async fn shutdown(&mut self) {
        let _ = tokio::time::timeout(self.idle, self.inner.shutdown()).await;
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    pub fn set_stream(&mut self, stream: u32, idle: Duration) {
        self.stream = stream;
        self.idle = idle;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use ferry_proto::wire::v1 as pb;

    fn batch(len: usize, seed: u8) -> Message {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        Message::Batch {
            header: pb::BatchHeader { files: vec![] },
            data: Bytes::from(data),
        }
    }

    fn data(m: &Message) -> &[u8] {
        match m {
            Message::Batch { data, .. } => data,
            other => panic!("not a batch: {other:?}"),
        }
    }

    /// Large and small frames, written in pieces of every size, read back whole and in order;
    /// the large ones through pooled buffers that are reused once dropped.
    #[tokio::test]
    async fn large_frames_arrive_whole_through_reused_buffers() {
        let sizes = [
            LARGE_PAYLOAD + 1,
            10,
            3 << 20,
            LARGE_PAYLOAD - 8,
            4 << 20,
            0,
        ];
        let sent: Vec<Message> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| batch(n, i as u8))
            .collect();
        let mut wire = BytesMut::new();
        for m in &sent {
            m.encode(&mut wire).expect("encode");
        }
        let wire = wire.freeze();
        // A 7 KiB pipe: every large frame arrives over many reads, its header with a few bytes.
        let (mut tx, rx) = tokio::io::duplex(7 * 1024);
        let writer = tokio::spawn(async move {
            for piece in wire.chunks(5000) {
                tx.write_all(piece).await.expect("write");
            }
        });
        let counted = Arc::new(AtomicU64::new(0));
        let mut r = FrameReader::new(rx, 0, Duration::from_secs(10), counted.clone());
        let pool = payload_pool(1);
        r.share_payloads(pool.clone());
        let mut first_large = None;
        for (i, m) in sent.iter().enumerate() {
            let got = r.expect().await.expect("frame");
            assert_eq!(data(&got), data(m), "frame {i}");
            if sizes[i] >= LARGE_PAYLOAD {
                let ptr = data(&got).as_ptr();
                match first_large {
                    // Dropped before the next large frame: that one reuses its buffer.
                    Some(p) => assert_eq!(ptr, p, "frame {i} reuses the pooled buffer"),
                    None => first_large = Some(ptr),
                }
            }
            drop(got);
        }
        assert!(r.next().await.expect("clean end").is_none());
        writer.await.expect("writer");
        let total: usize = sizes.iter().map(|n| FRAME_HEADER_LEN + 4 + n).sum();
        assert_eq!(counted.load(Ordering::Relaxed), total as u64);
    }

    #[tokio::test]
    async fn a_large_frame_cut_short_is_a_closed_stream_mid_frame() {
        let mut wire = BytesMut::new();
        batch(1 << 20, 1).encode(&mut wire).expect("encode");
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let cut = wire.len() / 2;
        tokio::spawn(async move {
            tx.write_all(&wire[..cut]).await.expect("write");
        });
        let mut r = FrameReader::new(rx, 3, Duration::from_secs(10), Default::default());
        match r.next().await {
            Err(FramedError::Closed {
                stream: 3,
                mid_frame: true,
            }) => {}
            other => panic!("expected a close mid-frame, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_large_frame_that_stalls_times_out() {
        let mut wire = BytesMut::new();
        batch(1 << 20, 2).encode(&mut wire).expect("encode");
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        tx.write_all(&wire[..1000]).await.expect("write");
        let mut r = FrameReader::new(rx, 1, Duration::from_millis(300), Default::default());
        match r.next().await {
            Err(FramedError::IdleTimeout { stream: 1, .. }) => {}
            other => panic!("expected the idle timeout, got {other:?}"),
        }
        drop(tx);
    }

    #[tokio::test]
    async fn a_header_past_the_cap_is_refused_before_any_allocation() {
        let mut wire = BytesMut::new();
        wire.put_slice(&wire::encode_frame_header(FrameType::Batch, 0));
        wire[..4].copy_from_slice(&(wire::MAX_FRAME_PAYLOAD + 1).to_le_bytes());
        let (mut tx, rx) = tokio::io::duplex(1024);
        tx.write_all(&wire).await.expect("write");
        let mut r = FrameReader::new(rx, 0, Duration::from_secs(10), Default::default());
        assert!(matches!(
            r.next().await,
            Err(FramedError::Wire {
                source: WireError::TooLarge { .. },
                ..
            })
        ));
    }
}
