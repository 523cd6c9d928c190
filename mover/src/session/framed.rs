//! Frames over any byte stream: a reader that decodes with the sans-IO codec under an idle
//! timeout, a writer that writes whole frames under the same timeout, and wire-byte counting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::wire::{self, FRAME_HEADER_LEN, FrameType, Message, WireError};

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
    idle: Duration,
    stream: u32,
    wire_bytes: Arc<AtomicU64>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, stream: u32, idle: Duration, wire_bytes: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(64 * 1024),
            idle,
            stream,
            wire_bytes,
        }
    }

    /// Next frame, or `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Message>, FramedError> {
        let stream = self.stream;
        loop {
            match wire::decode_frame(&mut self.buf) {
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
            let read = tokio::time::timeout(self.idle, self.inner.read_buf(&mut self.buf)).await;
            match read {
                Err(_) => {
                    return Err(FramedError::IdleTimeout {
                        stream,
                        secs: self.idle.as_secs(),
                    });
                }
                Ok(Err(source)) => return Err(FramedError::Read { stream, source }),
                Ok(Ok(0)) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    return Err(FramedError::Closed {
                        stream,
                        mid_frame: true,
                    });
                }
                Ok(Ok(_)) => {}
            }
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
                wire::encode_bulk_prefix(FrameType::Block, header, data.len(), &mut self.buf)
                    .map_err(|source| FramedError::Wire { stream, source })?;
                let prefix = self.buf.split().freeze();
                self.write_all(&prefix).await?;
                self.write_all(data).await?;
            }
            Message::Batch { header, data } => {
                wire::encode_bulk_prefix(FrameType::Batch, header, data.len(), &mut self.buf)
                    .map_err(|source| FramedError::Wire { stream, source })?;
                let prefix = self.buf.split().freeze();
                self.write_all(&prefix).await?;
                self.write_all(data).await?;
            }
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
