//! What several sessions of one sender (one source, several destinations) share so that each
//! block of the source is read and hashed once, whatever the number of destinations.
//!
//! Every session announces every full block of a large file to its receiver: its hash and a
//! proof of possession keyed by that receiver's nonce. Both come from two passes over the
//! block's bytes (its BLAKE3 and its possession secret); the proof itself is one keyed hash of
//! the 32-byte secret. So the sessions share the (hash, secret) of each block: the first session
//! to reach a block reads it, the others wait for its result instead of reading it again. A pack
//! of small files (a fan-out's Offer whose small files travel as one block) is shared the same
//! way, with its files' hashes for each session's digest.
//!
//! Memory is bounded whatever the size of the source: an entry goes once every live session has
//! taken it, and beyond [`MAX_ENTRIES`] (or [`MAX_PACK_FILES`] files' hashes of packs: a session
//! that lags far behind the others) a block or pack is read again rather than remembered.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::cas::pop::Secret;
use crate::digest::Hash;

/// Blocks remembered at most: 16 Ki entries of about 150 bytes, for sessions up to 64 GiB apart.
const MAX_ENTRIES: usize = 16 * 1024;
/// Files' hashes of packs remembered at most (8 MiB): packs of 4 MiB, some 1 GiB of them, for
/// files of 16 KiB and more; fewer for smaller files.
const MAX_PACK_FILES: usize = 256 * 1024;
/// How long a session waits for another's read of a block before reading it itself: a read
/// takes milliseconds, so only a source that hangs (a stalled network volume) makes it wait
/// this long, and then each session should meet the hang, and report it, on its own.
const WAIT_FOR_READER: Duration = Duration::from_secs(10);

/// A source file as it was when a block of it was read: a file rewritten since has another
/// ctime (or size), so no session takes a hash of its old content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileKey {
    pub fn of(f: &std::fs::File) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// A block as every session announces it: `None` when it is all zeros (sent, not announced).
pub type BlockRead = Option<(Hash, Secret)>;

/// A pack as every session announces it: the hash and possession secret of its bytes, and each
/// file's BLAKE3 (for the digest), in the pack's order.
#[derive(Debug, PartialEq, Eq)]
pub struct PackRead {
    pub hash: Hash,
    pub secret: Secret,
    pub files: Vec<Hash>,
}

/// The small files of a pack as they were when read: the [`FileKey`]s of its files, in order,
/// hashed (see [`PackKey::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackKey([u8; 32]);

impl PackKey {
    pub fn of(files: &[FileKey]) -> Self {
        let mut h = blake3::Hasher::new();
        for k in files {
            for n in [k.dev, k.ino, k.size] {
                h.update(&n.to_le_bytes());
            }
            for t in [k.mtime_ns, k.ctime_ns] {
                h.update(&t.to_le_bytes());
            }
        }
        Self(*h.finalize().as_bytes())
    }
}

/// What one entry holds, and how many files' hashes of packs that is.
trait Remembered: Clone {
    fn files(&self) -> usize;
}

impl Remembered for BlockRead {
    fn files(&self) -> usize {
        0
    }
}

impl Remembered for std::sync::Arc<PackRead> {
    fn files(&self) -> usize {
        self.files.len()
    }
}

enum Slot<T> {
    /// A session is reading it; the others wait on [`SharedReads::ready`].
    Reading,
    Read {
        value: T,
        taken: usize,
    },
}

/// Drops the entries every live session took; returns the files' hashes they held.
fn release<K, T: Remembered>(slots: &mut HashMap<K, Slot<T>>, live: usize) -> usize {
    let mut released = 0;
    slots.retain(|_, s| match s {
        Slot::Read { taken, value } if *taken >= live => {
            released += value.files();
            false
        }
        _ => true,
    });
    released
}

#[derive(Default)]
struct Inner {
    blocks: HashMap<(FileKey, u64), Slot<BlockRead>>,
    packs: HashMap<PackKey, Slot<std::sync::Arc<PackRead>>>,
    /// Files' hashes held by `packs`.
    pack_files: usize,
    /// Sessions still running: an entry every one of them took is done with.
    live: usize,
    /// Blocks (packs included) read by any session, and taken from another session's read.
    reads: u64,
    shared: u64,
}

impl Inner {
    fn entries(&self) -> usize {
        self.blocks.len() + self.packs.len()
    }
}

/// The blocks the sessions of one sender share (see the module's documentation).
pub struct SharedReads {
    inner: Mutex<Inner>,
    ready: Condvar,
}

impl std::fmt::Debug for SharedReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("SharedReads")
            .field("live", &inner.live)
            .field("remembered", &inner.entries())
            .finish()
    }
}

/// How many blocks were read and how many were taken from another session's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedCounts {
    pub reads: u64,
    pub shared: u64,
}

impl SharedReads {
    /// For `sessions` sessions, each of which calls [`SharedReads::leave`] when it ends.
    pub fn new(sessions: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                live: sessions,
                ..Inner::default()
            }),
            ready: Condvar::new(),
        }
    }

    /// Block `index` of the file `key`: another session's result when it read it, else
    /// `read()`'s (which the other sessions then take). A failed read is not shared: each
    /// session that needs the block reads it itself and reports its own error.
    pub fn block<E>(
        &self,
        key: FileKey,
        index: u64,
        read: impl FnOnce() -> Result<BlockRead, E>,
    ) -> Result<BlockRead, E> {
        self.shared(|i| &mut i.blocks, (key, index), 0, read)
    }

    /// The pack of small files `key` (of `files` files), as [`Self::block`] does for a block.
    pub fn pack<E>(
        &self,
        key: PackKey,
        files: usize,
        read: impl FnOnce() -> Result<PackRead, E>,
    ) -> Result<std::sync::Arc<PackRead>, E> {
        let read = || read().map(std::sync::Arc::new);
        self.shared(|i| &mut i.packs, key, files, read)
    }

    /// Another session's read of `id` in `table` when there is one, else `read()`'s,
    /// remembered for the others unless the bounds are reached (`files`: the files' hashes it
    /// will hold).
    fn shared<K, T, E>(
        &self,
        table: fn(&mut Inner) -> &mut HashMap<K, Slot<T>>,
        id: K,
        files: usize,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E>
    where
        K: Copy + Eq + std::hash::Hash,
        T: Remembered,
    {
        let mut inner = self.lock();
        let deadline = std::time::Instant::now() + WAIT_FOR_READER;
        loop {
            let full = inner.entries() >= MAX_ENTRIES || inner.pack_files + files > MAX_PACK_FILES;
            let live = inner.live;
            match table(&mut inner).get_mut(&id) {
                Some(Slot::Read { value, taken }) => {
                    let value = value.clone();
                    *taken += 1;
                    if *taken >= live {
                        table(&mut inner).remove(&id);
                        inner.pack_files -= value.files();
                    }
                    inner.shared += 1;
                    return Ok(value);
                }
                Some(Slot::Reading) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        drop(inner);
                        return self.read_unshared(read);
                    }
                    inner = match self.ready.wait_timeout(inner, left) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    };
                }
                None if live <= 1 || full => {
                    drop(inner);
                    return self.read_unshared(read);
                }
                None => break,
            }
        }
        table(&mut inner).insert(id, Slot::Reading);
        drop(inner);
        let result = read();
        let mut inner = self.lock();
        inner.reads += 1;
        match &result {
            Ok(value) => {
                inner.pack_files += value.files();
                let value = value.clone();
                table(&mut inner).insert(id, Slot::Read { value, taken: 1 });
            }
            Err(_) => {
                table(&mut inner).remove(&id);
            }
        }
        drop(inner);
        self.ready.notify_all();
        result
    }

    /// A session ended: what only it had still to take is done with.
    pub fn leave(&self) {
        let mut inner = self.lock();
        inner.live = inner.live.saturating_sub(1);
        let live = inner.live;
        release(&mut inner.blocks, live);
        let released = release(&mut inner.packs, live);
        inner.pack_files -= released;
        drop(inner);
        self.ready.notify_all();
    }

    pub fn counts(&self) -> SharedCounts {
        let inner = self.lock();
        SharedCounts {
            reads: inner.reads,
            shared: inner.shared,
        }
    }

    /// Blocks and packs remembered now (for tests of the bound).
    pub fn remembered(&self) -> usize {
        self.lock().entries()
    }

    fn read_unshared<T, E>(&self, read: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let result = read();
        self.lock().reads += 1;
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state stays consistent at every unlock, so a panicked holder leaves nothing torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn key(ino: u64) -> FileKey {
        FileKey {
            dev: 1,
            ino,
            size: 1 << 30,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    fn block(n: u8) -> BlockRead {
        Some(([n; 32], Secret([n; 32])))
    }

    #[test]
    fn each_block_is_read_once_for_every_session_and_then_forgotten() {
        let shared = SharedReads::new(3);
        let reads = AtomicU64::new(0);
        for session in 0..3 {
            for index in 0..100u64 {
                let got = shared
                    .block(key(7), index, || {
                        reads.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, ()>(block(index as u8))
                    })
                    .unwrap();
                assert_eq!(
                    got.map(|(h, _)| h),
                    Some([index as u8; 32]),
                    "session {session}"
                );
            }
        }
        assert_eq!(reads.load(Ordering::Relaxed), 100);
        assert_eq!(
            shared.counts(),
            SharedCounts {
                reads: 100,
                shared: 200
            }
        );
        assert_eq!(shared.remembered(), 0, "every session took every block");
    }

    #[test]
    fn another_file_or_a_changed_one_is_read_again() {
        let shared = SharedReads::new(2);
        shared.block(key(1), 0, || Ok::<_, ()>(block(1))).unwrap();
        let mut changed = key(1);
        changed.ctime_ns = 5;
        let got = shared.block(changed, 0, || Ok::<_, ()>(block(2))).unwrap();
        assert_eq!(got.map(|(h, _)| h), Some([2; 32]));
        let got = shared.block(key(2), 0, || Ok::<_, ()>(block(3))).unwrap();
        assert_eq!(got.map(|(h, _)| h), Some([3; 32]));
        assert_eq!(shared.counts().reads, 3);
    }

    #[test]
    fn a_failed_read_is_not_shared() {
        let shared = SharedReads::new(2);
        assert!(
            shared
                .block(key(1), 0, || Err::<BlockRead, _>("EIO"))
                .is_err()
        );
        let got = shared.block(key(1), 0, || Ok::<_, &str>(block(4))).unwrap();
        assert_eq!(
            got.map(|(h, _)| h),
            Some([4; 32]),
            "the second session read it itself"
        );
    }

    #[test]
    fn a_session_that_ends_releases_what_only_it_had_left_to_take() {
        let shared = SharedReads::new(3);
        for index in 0..10 {
            shared
                .block(key(1), index, || Ok::<_, ()>(block(1)))
                .unwrap();
            shared
                .block(key(1), index, || Ok::<_, ()>(block(1)))
                .unwrap();
        }
        assert_eq!(shared.remembered(), 10);
        shared.leave();
        assert_eq!(shared.remembered(), 0);
        // Alone now: nothing is remembered any more.
        shared.leave();
        shared.block(key(1), 99, || Ok::<_, ()>(block(1))).unwrap();
        assert_eq!(shared.remembered(), 0);
    }

    #[test]
    fn memory_is_bounded_when_one_session_lags_behind() {
        let shared = SharedReads::new(2);
        for index in 0..(MAX_ENTRIES as u64 + 500) {
            shared.block(key(1), index, || Ok::<_, ()>(None)).unwrap();
        }
        assert_eq!(shared.remembered(), MAX_ENTRIES);
        // The lagging session takes what was remembered and reads the rest itself.
        let reads_before = shared.counts().reads;
        for index in 0..(MAX_ENTRIES as u64 + 500) {
            shared.block(key(1), index, || Ok::<_, ()>(None)).unwrap();
        }
        assert_eq!(shared.counts().reads - reads_before, 500);
        // What it read itself waits for the other session, until that one ends.
        assert_eq!(shared.remembered(), 500);
        shared.leave();
        assert_eq!(shared.remembered(), 0);
    }

    fn pack(n: u8, files: usize) -> PackRead {
        PackRead {
            hash: [n; 32],
            secret: Secret([n; 32]),
            files: vec![[n; 32]; files],
        }
    }

    #[test]
    fn a_pack_is_read_once_for_every_session_and_a_changed_file_makes_another() {
        let shared = SharedReads::new(2);
        let (a, b) = (
            PackKey::of(&[key(1), key(2)]),
            PackKey::of(&[key(1), key(3)]),
        );
        assert_ne!(a, b);
        let mut changed = key(2);
        changed.ctime_ns = 9;
        assert_ne!(
            a,
            PackKey::of(&[key(1), changed]),
            "a rewritten second file"
        );
        let first = shared.pack(a, 2, || Ok::<_, ()>(pack(1, 2))).unwrap();
        let second = shared
            .pack(a, 2, || -> Result<PackRead, ()> { panic!("read again") })
            .unwrap();
        assert_eq!(first, second);
        assert_eq!(second.files.len(), 2);
        assert_eq!(shared.remembered(), 0, "both sessions took it");
        let other = shared.pack(b, 2, || Ok::<_, ()>(pack(2, 2))).unwrap();
        assert_eq!(other.hash, [2; 32]);
        assert_eq!(
            shared.counts(),
            SharedCounts {
                reads: 2,
                shared: 1
            }
        );
    }

    #[test]
    fn the_hashes_packs_keep_are_bounded() {
        let shared = SharedReads::new(2);
        let files = 1024;
        let packs = MAX_PACK_FILES / files;
        for i in 0..packs as u64 + 10 {
            shared
                .pack(PackKey::of(&[key(i)]), files, || {
                    Ok::<_, ()>(pack(1, files))
                })
                .unwrap();
        }
        assert_eq!(
            shared.remembered(),
            packs,
            "beyond the bound, packs are not kept"
        );
        for i in 0..packs as u64 + 10 {
            shared
                .pack(PackKey::of(&[key(i)]), files, || {
                    Ok::<_, ()>(pack(1, files))
                })
                .unwrap();
        }
        assert_eq!(
            shared.remembered(),
            10,
            "what the second session read itself waits for the first"
        );
        shared.leave();
        assert_eq!(shared.remembered(), 0);
    }

    #[test]
    fn concurrent_sessions_wait_for_the_one_reading() {
        let shared = Arc::new(SharedReads::new(4));
        let reads = Arc::new(AtomicU64::new(0));
        let sessions: Vec<_> = (0..4)
            .map(|_| {
                let (shared, reads) = (shared.clone(), reads.clone());
                std::thread::spawn(move || {
                    for index in 0..200u64 {
                        let got = shared
                            .block(key(3), index, || {
                                reads.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                                Ok::<_, ()>(block(index as u8))
                            })
                            .unwrap();
                        assert_eq!(got.map(|(h, _)| h), Some([index as u8; 32]));
                    }
                })
            })
            .collect();
        for s in sessions {
            s.join().unwrap();
        }
        assert_eq!(reads.load(Ordering::Relaxed), 200);
        assert_eq!(shared.remembered(), 0);
    }
}
