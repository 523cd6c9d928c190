//! Per-block compression: encode with zstd or lz4 and keep the result only if it saves at least
//! 5 %; decode with the output capped at the declared length (itself capped at the block size).
//!
//! `auto` rule: compress (zstd level 1) only while the link's measured goodput is below half of
//! this CPU's measured zstd-1 speed. Goodput is bytes written divided by the time the writers
//! spent inside writes (including bandwidth-limit waits), so a fast link (loopback, 10 GbE) is
//! measured fast and gets raw blocks, and a slow or limited link gets compression. Data that does
//! not compress (media, archives, encrypted files) stops the attempts for a while: after 8 MiB in
//! a row that the 5 % rule kept raw, `auto` sends the next 64 MiB raw without trying, twice that
//! after each further futile run (up to 1 GiB), until an attempt pays again.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::wire::{BLOCK_SIZE, codec};

/// How the sender compresses blocks and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compress {
    Auto,
    Zstd,
    Lz4,
    None,
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("unknown codec {0}")]
    Unknown(u32),
    #[error("codec {0} was not negotiated")]
    NotNegotiated(u32),
    #[error("declared length {0} is above the block size")]
    TooLong(u64),
    #[error(
        "compressed data does not decode to exactly {expected} bytes (zstd/lz4 error or size mismatch)"
    )]
    Decode { expected: usize },
    #[error("zero block carries {0} payload bytes")]
    ZeroWithData(usize),
}

/// Decodes `data` into `out` (cleared, then exactly `raw_len` bytes long).
pub fn decode(
    codec_id: u32,
    data: &[u8],
    raw_len: usize,
    negotiated: u64,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    if raw_len > BLOCK_SIZE {
        return Err(CodecError::TooLong(raw_len as u64));
    }
    out.clear();
    match codec_id {
        codec::RAW => {
            if data.len() != raw_len {
                return Err(CodecError::Decode { expected: raw_len });
            }
            out.extend_from_slice(data);
        }
        codec::ZSTD => {
            if negotiated & crate::wire::caps::ZSTD == 0 {
                return Err(CodecError::NotNegotiated(codec_id));
            }
            out.resize(raw_len, 0);
            // Bulk API with a fixed output: a frame that would expand past raw_len is an error.
            let n = zstd::bulk::Decompressor::new()
                .and_then(|mut d| {
                    d.window_log_max(23)?;
                    d.decompress_to_buffer(data, &mut out[..])
                })
                .map_err(|_| CodecError::Decode { expected: raw_len })?;
            if n != raw_len {
                return Err(CodecError::Decode { expected: raw_len });
            }
        }
        codec::LZ4 => {
            if negotiated & crate::wire::caps::LZ4 == 0 {
                return Err(CodecError::NotNegotiated(codec_id));
            }
            out.resize(raw_len, 0);
            let n = lz4_flex::block::decompress_into(data, &mut out[..])
                .map_err(|_| CodecError::Decode { expected: raw_len })?;
            if n != raw_len {
                return Err(CodecError::Decode { expected: raw_len });
            }
        }
        codec::ZERO => {
            if !data.is_empty() {
                return Err(CodecError::ZeroWithData(data.len()));
            }
            out.resize(raw_len, 0);
        }
        other => return Err(CodecError::Unknown(other)),
    }
    Ok(())
}

/// Compresses with `codec_id`; `None` when the result does not save at least 5 %.
pub fn encode(codec_id: u32, raw: &[u8], level: i32) -> Option<Vec<u8>> {
    let out = match codec_id {
        codec::ZSTD => zstd_compress(raw, level)?,
        codec::LZ4 => lz4_flex::block::compress(raw),
        _ => return None,
    };
    (out.len() * 100 <= raw.len() * 95).then_some(out)
}

/// zstd with one compression context per thread: creating a context costs more than
/// compressing a small file.
fn zstd_compress(raw: &[u8], level: i32) -> Option<Vec<u8>> {
    thread_local! {
        static CONTEXT: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
            const { RefCell::new(None) };
    }
    CONTEXT.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, compressor) = slot.as_mut()?;
        compressor.compress(raw).ok()
    })
}

/// Content below this size is never worth a compression attempt.
const MIN_COMPRESS: usize = 512;
/// `auto`: this many input bytes in a row that did not compress...
const FUTILE_RUN: u64 = 8 << 20;
/// ...make the next this many bytes go raw without an attempt (doubled per further futile run).
const RAW_AFTER_FUTILE: u64 = 64 << 20;
/// At most RAW_AFTER_FUTILE << this (1 GiB).
const MAX_BACKOFF_SHIFT: u64 = 4;

/// Chooses the codec for each block of a session.
pub struct CodecPolicy {
    mode: Compress,
    negotiated: u64,
    bandwidth_limit: Option<u64>,
    /// Bytes written and nanoseconds spent writing, summed over all streams.
    pub written: AtomicU64,
    pub write_nanos: AtomicU64,
    /// Input bytes seen by [`CodecPolicy::compress`].
    seen: AtomicU64,
    /// Consecutive input bytes whose compression did not pay.
    futile: AtomicU64,
    /// `auto` sends raw without trying while `seen` is below this.
    raw_until: AtomicU64,
    /// Futile runs since compression last paid.
    futile_runs: AtomicU64,
}

/// Measured zstd-1 speed of this CPU (bytes/s) on text-like data, computed once per process.
pub fn zstd_speed() -> f64 {
    static SPEED: OnceLock<f64> = OnceLock::new();
    *SPEED.get_or_init(|| {
        let mut sample = Vec::with_capacity(1 << 20);
        let mut x: u32 = 12345;
        let words: [&[u8]; 8] = [
            b"transfer ",
            b"block ",
            b"receiver ",
            b"the ",
            b"of ",
            b"stream\n",
            b"file ",
            b"42 ",
        ];
        while sample.len() < (1 << 20) {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            sample.extend_from_slice(words[(x >> 16) as usize % words.len()]);
        }
        // Best of 5: on a shared machine a single timing mostly measures preemption.
        let mut best = f64::MAX;
        for chunk in sample
            .chunks(256 * 1024)
            .chain(sample.chunks(256 * 1024).take(1))
        {
            let t = Instant::now();
            let _ = zstd::bulk::compress(chunk, 1);
            best = best.min(t.elapsed().as_secs_f64().max(1e-7) / chunk.len() as f64);
        }
        1.0 / best
    })
}

impl CodecPolicy {
    pub fn new(mode: Compress, negotiated: u64, bandwidth_limit: Option<u64>) -> Self {
        Self {
            mode,
            negotiated,
            bandwidth_limit,
            written: AtomicU64::new(0),
            write_nanos: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            futile: AtomicU64::new(0),
            raw_until: AtomicU64::new(0),
            futile_runs: AtomicU64::new(0),
        }
    }

    /// Compresses `raw` if the policy says so and it pays: `Some((codec, bytes))`, or `None` to
    /// send it raw.
    pub fn compress(&self, raw: &[u8]) -> Option<(u32, Vec<u8>)> {
        if raw.len() < MIN_COMPRESS {
            return None;
        }
        let len = raw.len() as u64;
        let seen = self.seen.fetch_add(len, Ordering::Relaxed) + len;
        let (codec_id, level) = self.choose();
        if codec_id == codec::RAW {
            return None;
        }
        let auto = self.mode == Compress::Auto;
        if auto && seen < self.raw_until.load(Ordering::Relaxed) {
            return None;
        }
        let out = encode(codec_id, raw, level);
        if auto {
            if out.is_some() {
                self.futile.store(0, Ordering::Relaxed);
                self.futile_runs.store(0, Ordering::Relaxed);
            } else if self.futile.fetch_add(len, Ordering::Relaxed) + len >= FUTILE_RUN {
                self.futile.store(0, Ordering::Relaxed);
                let runs = self.futile_runs.fetch_add(1, Ordering::Relaxed);
                let span = RAW_AFTER_FUTILE << runs.min(MAX_BACKOFF_SHIFT);
                self.raw_until.store(seen + span, Ordering::Relaxed);
            }
        }
        out.map(|o| (codec_id, o))
    }

    pub fn note_write(&self, bytes: u64, nanos: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
        self.write_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Link goodput estimate in bytes/s, once enough has been written to judge.
    pub fn goodput(&self) -> Option<f64> {
        let bytes = self.written.load(Ordering::Relaxed);
        let nanos = self.write_nanos.load(Ordering::Relaxed);
        (bytes >= 8 << 20 && nanos > 0).then(|| bytes as f64 * 1e9 / nanos as f64)
    }

    /// (codec, zstd level) for the next block.
    pub fn choose(&self) -> (u32, i32) {
        let has = |c| self.negotiated & c != 0;
        match self.mode {
            Compress::None => (codec::RAW, 0),
            // Level 1: on these CPUs level 3 costs ~1.5x the time for ~6 % smaller output.
            Compress::Zstd if has(crate::wire::caps::ZSTD) => (codec::ZSTD, 1),
            Compress::Lz4 if has(crate::wire::caps::LZ4) => (codec::LZ4, 0),
            Compress::Zstd | Compress::Lz4 => (codec::RAW, 0),
            Compress::Auto => {
                if !has(crate::wire::caps::ZSTD) {
                    return (codec::RAW, 0);
                }
                let link = match (self.bandwidth_limit, self.goodput()) {
                    (Some(l), Some(g)) => (l as f64).min(g),
                    (Some(l), None) => l as f64,
                    (None, Some(g)) => g,
                    (None, None) => return (codec::RAW, 0),
                };
                if link < zstd_speed() / 2.0 {
                    (codec::ZSTD, 1)
                } else {
                    (codec::RAW, 0)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::caps;

    #[test]
    fn compressible_round_trips_and_random_is_skipped() {
        let text = b"hello ferry ".repeat(10_000);
        for c in [codec::ZSTD, codec::LZ4] {
            let enc = encode(c, &text, 1).unwrap();
            let mut out = Vec::new();
            decode(c, &enc, text.len(), caps::SUPPORTED, &mut out).unwrap();
            assert_eq!(out, text);
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert!(
            encode(codec::LZ4, &random, 1).is_none(),
            "random data kept compressed"
        );
        assert!(
            encode(codec::ZSTD, &random, 1).is_none(),
            "random data kept compressed"
        );
    }

    #[test]
    fn zstd_bomb_past_declared_length_is_refused() {
        let big = vec![0u8; BLOCK_SIZE];
        let enc = zstd::bulk::compress(&big, 3).unwrap();
        let mut out = Vec::new();
        let err = decode(codec::ZSTD, &enc, 1024, caps::SUPPORTED, &mut out).unwrap_err();
        assert!(
            matches!(err, CodecError::Decode { expected: 1024 }),
            "{err}"
        );
        assert!(out.len() <= 1024);
        let err = decode(codec::RAW, &[], BLOCK_SIZE + 1, caps::SUPPORTED, &mut out).unwrap_err();
        assert!(matches!(err, CodecError::TooLong(_)));
    }

    #[test]
    fn auto_sends_raw_on_a_fast_link_and_zstd_on_a_slow_one() {
        let fast = CodecPolicy::new(Compress::Auto, caps::SUPPORTED, None);
        assert_eq!(fast.choose().0, codec::RAW, "no measurement yet: raw");
        fast.note_write(64 << 20, 20_000_000); // 3.2 GB/s
        assert_eq!(fast.choose().0, codec::RAW);
        let slow = CodecPolicy::new(Compress::Auto, caps::SUPPORTED, Some(50_000_000));
        assert_eq!(slow.choose().0, codec::ZSTD);
        let none = CodecPolicy::new(Compress::Zstd, caps::LZ4, None);
        assert_eq!(none.choose().0, codec::RAW, "zstd not negotiated");
    }

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn auto_stops_trying_on_incompressible_data_for_a_while() {
        let slow = CodecPolicy::new(Compress::Auto, caps::SUPPORTED, Some(50_000_000));
        let text = b"ferry moves trees ".repeat(4096);
        assert_eq!(slow.compress(&text).map(|c| c.0), Some(codec::ZSTD));
        let random = noise(1 << 20, 7);
        for _ in 0..(FUTILE_RUN >> 20) {
            assert!(slow.compress(&random).is_none());
        }
        // Now even text goes raw, untried, for RAW_AFTER_FUTILE bytes...
        assert!(slow.compress(&text).is_none(), "attempts did not stop");
        let mut sent = text.len() as u64;
        while sent < RAW_AFTER_FUTILE {
            assert!(slow.compress(&random).is_none());
            sent += random.len() as u64;
        }
        // ...then attempts resume; another futile run backs off twice as long.
        for _ in 0..(FUTILE_RUN >> 20) {
            assert!(slow.compress(&random).is_none());
        }
        let mut sent = 0;
        while sent < 2 * RAW_AFTER_FUTILE - (4 << 20) {
            assert!(slow.compress(&random).is_none());
            sent += random.len() as u64;
        }
        assert!(
            slow.compress(&text).is_none(),
            "second back-off not doubled"
        );
        for _ in 0..4 {
            slow.compress(&random);
        }
        assert_eq!(slow.compress(&text).map(|c| c.0), Some(codec::ZSTD));
        // An explicit choice always tries (the per-block 5 % rule still applies).
        let zstd = CodecPolicy::new(Compress::Zstd, caps::SUPPORTED, None);
        for _ in 0..(FUTILE_RUN >> 20) + 1 {
            assert!(zstd.compress(&random).is_none());
        }
        assert!(zstd.compress(&text).is_some());
        assert!(zstd.compress(&text[..100]).is_none(), "tiny input tried");
    }
}
