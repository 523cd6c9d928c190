//! Frame buffers handed back after their frame was written. A Batch buffer is a few MiB: glibc
//! maps an allocation that large on its own and unmaps it when freed, so every fresh buffer costs
//! one page fault (and a zeroed page) per 4 KiB as it fills, about a tenth of the sender's CPU on
//! small files. A buffer that comes back is filled again without faults.
//!
//! Memory: a buffer is either in flight (as before) or idle in the pool, and `take` reuses an
//! idle one before allocating, so the peak is the most buffers ever in flight at once, as
//! without the pool. At most `keep` idle buffers are kept; more are freed.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

pub struct BufferPool {
    idle: Mutex<Vec<Vec<u8>>>,
    capacity: usize,
    keep: usize,
}

impl BufferPool {
    /// Buffers of `capacity` bytes, at most `keep` of them idle.
    pub fn new(capacity: usize, keep: usize) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(Vec::new()),
            capacity,
            keep,
        })
    }

    /// An empty buffer with room for at least `len` bytes (and the pool's capacity): an idle
    /// one if there is one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut buf = reused.unwrap_or_else(|| Vec::with_capacity(self.capacity.max(len)));
        buf.reserve(len);
        buf
    }

    /// The buffer as a frame's payload; it comes back to the pool when the last handle to the
    /// payload is dropped.
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// Keeps `buf` for a later `take` (a buffer that was not frozen into a payload).
    pub fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() < self.capacity {
            return;
        }
        buf.clear();
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.keep
        {
            idle.push(buf);
        }
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().map_or(0, |i| i.len())
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_comes_back_empty_when_its_last_handle_goes() {
        let pool = BufferPool::new(64, 2);
        let mut b = pool.take(0);
        b.extend_from_slice(b"frame");
        let ptr = b.as_ptr();
        let payload = pool.freeze(b);
        let slice = payload.slice(1..3);
        drop(payload);
        assert_eq!(pool.idle(), 0, "a slice still holds it");
        assert_eq!(&slice[..], b"ra");
        drop(slice);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(0);
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), ptr, "the same allocation, filled again");
        assert!(again.capacity() >= 64);
    }

    #[test]
    fn no_more_than_keep_buffers_stay_idle() {
        let pool = BufferPool::new(16, 2);
        let payloads: Vec<Bytes> = (0..5).map(|_| pool.freeze(pool.take(0))).collect();
        drop(payloads);
        assert_eq!(pool.idle(), 2);
    }

    #[test]
    fn a_buffer_that_shrank_is_not_kept() {
        let pool = BufferPool::new(1024, 2);
        let mut b = pool.take(0);
        b.shrink_to(8);
        drop(pool.freeze(b));
        assert_eq!(pool.idle(), 0);
    }
}
