//! The block store proper: open, insert (crash-safe publication), lookup, verified reads.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use rustix::fs::{CWD, RenameFlags, renameat_with};

use super::error::{CasError, Result};
use super::hash::BlockHash;
use super::layout::Layout;
use super::pop::{PopKey, Proof, Secret, secret_of};
use super::{BLOCK_SIZE, gc, lock, usage};

const MARKER_HEADER: &str = "ferry-cas 1";

/// How to open a store.
#[derive(Clone, Debug, Default)]
pub struct CasOptions {
    /// Cap in bytes; recorded in the store so later openers and `cas gc` use it. `None` keeps the
    /// recorded cap (or no cap if none was ever recorded).
    pub cap_bytes: Option<u64>,
    /// fsync each block before publishing it and its directory after, so a published block
    /// survives power loss. Without it a crash can leave a published block with lost content; that
    /// block then fails verification on its next read and is discarded, so correctness never
    /// depends on this flag, only how much may need refetching.
    pub fsync: bool,
}

/// A block found in the store (not yet verified: use [`CasStore::read_verified`] to use it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub hash: BlockHash,
    pub len: u64,
    pub last_used: SystemTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// This call published the block.
    Inserted,
    /// A block with this name was already there (maybe published concurrently by another
    /// process); its last-use time was refreshed.
    AlreadyPresent,
}

/// Where a block read from the store is written: a plain file, or the receiver's staging file
/// (which keeps the block's zero pages as holes).
pub trait BlockSink {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()>;

    /// Whether blocks may be read from the store on several threads at once for this sink (a
    /// file: yes; a network stream that sends one block at a time: no, each extra thread would
    /// only hold one more block in memory).
    fn parallel_reads(&self) -> bool {
        true
    }
}

impl BlockSink for File {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.write_all_at(data, offset)
    }
}

/// What [`CasStore::materialize`] did with one requested block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Materialized {
    /// The verified bytes were written at the offset; the length is returned.
    Written(u64),
    /// Not in the store, or it was there but failed verification and has been discarded.
    Missing,
    /// The proof of possession does not match (whether or not the store has the block: the
    /// check reads no block, so both cost the same and neither changes anything).
    ProofRejected,
}

/// Outcome of [`CasStore::check_proof`] (for local counters only: a peer sees the same answer,
/// after the same work, for all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofCheck {
    Proven,
    Rejected,
    /// No block (or no stored secret) under that hash.
    Absent,
}

/// Extended attribute holding a block's possession secret (`pop::secret_of` of its bytes),
/// set when the block is published.
const SECRET_XATTR: &str = "user.ferry.pop";

/// Secret used when a block has none, so a failed check costs what a real one costs.
const NO_SECRET: Secret = Secret([0x5a; 32]);

/// A per-node block store in a directory; see the module docs for the layout. Cheap to share
/// between threads (`&self` everywhere); several processes may open the same directory.
#[derive(Debug)]
pub struct CasStore {
    layout: Layout,
    cap_bytes: Option<u64>,
    fsync: bool,
    corrupt_discarded: AtomicU64,
    /// Stale temps removed when this handle opened the store, reported by the next gc or verify.
    temps_removed_on_open: AtomicU64,
    /// Throttle for gc triggered by inserts after a gc that could not reach its target (pinned
    /// blocks filled the store): a scan per insert would be quadratic. Purely local pacing, no
    /// shared state lives here.
    gc_backoff_until: std::sync::Mutex<Option<Instant>>,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A temp file in `tmp/`, held under an exclusive flock while we write it so cleaners can tell a
/// live writer from a dead one; unlinked on drop unless published.
pub(crate) struct TempFile {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    published: bool,
}

/// Names tried before [`TempFile::create`] gives up (each lost only to a concurrent cleaner).
/// Cleaners opening the store in a tight loop can win many rounds in a row on a busy machine,
/// so the writer backs off (a yield, then a millisecond) rather than give up early.
const TEMP_CREATE_TRIES: usize = 256;

impl TempFile {
    pub(crate) fn create(tmp_dir: &Path, suffix: &str) -> Result<Self> {
        // Between creating a temp and locking it, another process opening the store may find it
        // unlocked, take it for a dead writer's and unlink it. So a temp counts only once it is
        // locked *and* still the file at its name; otherwise it is given up and a new name tried.
        for attempt in 0..TEMP_CREATE_TRIES {
            if attempt >= 16 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            } else if attempt > 0 {
                std::thread::yield_now();
            }
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
            let path = tmp_dir.join(format!("{}-{nanos}-{seq}.{suffix}", std::process::id()));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
                .map_err(|e| CasError::io("create temp file", &path, e))?;
            // A cleaner holds the lock: it is about to unlink this name.
            if !lock::try_lock_file(&file).map_err(|e| CasError::io("lock temp file", &path, e))? {
                continue;
            }
            let ours = match (file.metadata(), fs::symlink_metadata(&path)) {
                (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
                _ => false,
            };
            if ours {
                return Ok(Self {
                    path,
                    file,
                    published: false,
                });
            }
        }
        Err(CasError::io(
            "create temp file in",
            tmp_dir,
            io::Error::other("temp files kept vanishing (a cleaner raced every attempt)"),
        ))
    }

    pub(crate) fn mark_published(&mut self) {
        self.published = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CasError::io("create directory", path, e)),
    }
}

fn fsync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| CasError::io("fsync directory", path, e))
}

/// Opens a block file without following a symlink planted under a block name, and without
/// blocking on a FIFO planted there (the caller checks that it is a regular file).
fn open_block(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

impl CasStore {
    /// Opens (creating if needed) the store in `dir` with cap `cap_bytes`, which is recorded.
    pub fn open(dir: &Path, cap_bytes: u64) -> Result<Self> {
        Self::open_with(
            dir,
            CasOptions {
                cap_bytes: Some(cap_bytes),
                fsync: false,
            },
        )
    }

    /// Opens an existing store with its recorded cap (for operators' `cas` commands).
    pub fn open_existing(dir: &Path) -> Result<Self> {
        let layout = Layout::new(dir);
        if !layout.marker().exists() {
            return Err(CasError::NotAStore {
                path: dir.to_path_buf(),
                reason: "FERRY-CAS marker missing".into(),
            });
        }
        Self::open_with(dir, CasOptions::default())
    }

    pub fn open_with(dir: &Path, opts: CasOptions) -> Result<Self> {
        let layout = Layout::new(dir);
        match fs::create_dir_all(dir) {
            Ok(()) => {}
            Err(e) => return Err(CasError::io("create block store directory", dir, e)),
        }
        let recorded = read_marker(&layout)?;
        if recorded.is_none() {
            // Never adopt a directory that already holds something else: gc deletes files here.
            let foreign = fs::read_dir(dir)
                .map_err(|e| CasError::io("list block store directory", dir, e))?
                .filter_map(|e| e.ok())
                .any(|e| {
                    let n = e.file_name();
                    !matches!(
                        n.to_str(),
                        Some("blocks" | "tmp" | "leases" | "lock" | "gc.lock" | "usage")
                    )
                });
            if foreign {
                return Err(CasError::NotAStore {
                    path: dir.to_path_buf(),
                    reason: "directory is not empty and has no FERRY-CAS marker".into(),
                });
            }
        }
        for d in [layout.blocks(), layout.tmp(), layout.leases()] {
            mkdir(&d)?;
        }
        let recorded_cap = recorded.flatten();
        let cap_bytes = opts.cap_bytes.or(recorded_cap);
        if recorded.is_none() || (opts.cap_bytes.is_some() && opts.cap_bytes != recorded_cap) {
            write_marker(&layout, cap_bytes)?;
        }
        let store = Self {
            layout,
            cap_bytes,
            fsync: opts.fsync,
            corrupt_discarded: AtomicU64::new(0),
            temps_removed_on_open: AtomicU64::new(0),
            gc_backoff_until: std::sync::Mutex::new(None),
        };
        // Temps of writers that died (their flock is gone) are garbage; live writers' are kept.
        let removed = gc::clean_stale_temps(&store.layout)?;
        store
            .temps_removed_on_open
            .store(removed, Ordering::Relaxed);
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        self.layout.root()
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Takes (and resets) the count of stale temps removed when the store was opened.
    pub(crate) fn take_temps_removed_on_open(&self) -> u64 {
        self.temps_removed_on_open.swap(0, Ordering::Relaxed)
    }

    pub fn cap_bytes(&self) -> Option<u64> {
        self.cap_bytes
    }

    /// Blocks this handle found corrupt on read and discarded.
    pub fn corrupt_discarded(&self) -> u64 {
        self.corrupt_discarded.load(Ordering::Relaxed)
    }

    /// The path a block has (or would have) in the store.
    pub fn block_path(&self, hash: &BlockHash) -> PathBuf {
        self.layout.block(hash)
    }

    /// Whether the store has a block by that name (not verified, not touched).
    pub fn lookup(&self, hash: &BlockHash) -> Result<Option<BlockRef>> {
        let path = self.layout.block(hash);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => Ok(Some(BlockRef {
                hash: *hash,
                len: m.len(),
                last_used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CasError::io("stat block", path, e)),
        }
    }

    /// Reads a block and re-hashes it. A block whose bytes do not match its name is deleted and
    /// counted, and reported as absent; the caller fetches it elsewhere. A good block's last-use
    /// time is refreshed.
    pub fn read_verified(&self, hash: &BlockHash) -> Result<Option<Vec<u8>>> {
        self.read_checked(hash, true)
    }

    pub(crate) fn read_checked(&self, hash: &BlockHash, touch: bool) -> Result<Option<Vec<u8>>> {
        let path = self.layout.block(hash);
        let file = match open_block(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // ELOOP: a symlink under a block name is never ours; discard it.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                self.discard(hash, 0, "is a symlink");
                return Ok(None);
            }
            Err(e) => return Err(CasError::io("open block", path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| CasError::io("stat block", &path, e))?;
        if !meta.is_file() || meta.len() > BLOCK_SIZE as u64 {
            self.discard(hash, meta.len(), "is not a regular file of at most 4 MiB");
            return Ok(None);
        }
        let mut buf = Vec::with_capacity(meta.len() as usize);
        (&file)
            .take(BLOCK_SIZE as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| CasError::io("read block", &path, e))?;
        if buf.len() > BLOCK_SIZE || BlockHash::of(&buf) != *hash {
            self.discard(hash, buf.len() as u64, "content does not match its hash");
            return Ok(None);
        }
        if touch {
            // LRU clock. Failure (for example a store shared between uids) only costs accuracy.
            if let Err(e) = file.set_modified(SystemTime::now()) {
                tracing::debug!(block = %hash, error = %e, "could not refresh block last-use time");
            }
        }
        Ok(Some(buf))
    }

    /// Removes a block that failed verification. Blocks are immutable and published with
    /// no-replace, so whatever sits under this name now is the bad file we just read (or nothing).
    pub(crate) fn discard(&self, hash: &BlockHash, len: u64, why: &str) {
        self.corrupt_discarded.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(block = %hash, reason = why, "discarding corrupt block from the store");
        let path = self.layout.block(hash);
        let removed = match fs::symlink_metadata(&path) {
            // A directory under a block name would make the hash unstorable: remove it whole
            // (remove_dir_all never follows symlinks).
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path).is_ok(),
            _ => fs::remove_file(&path).is_ok(),
        };
        if removed && len > 0 {
            let _ = usage::add(&self.layout.usage(), -(len as i64));
        }
    }

    /// Writes a verified block into `dst` at `offset`. `Ok(None)` if the store does not have it
    /// (or had only a corrupt copy).
    pub fn copy_into(
        &self,
        hash: &BlockHash,
        dst: &(impl BlockSink + ?Sized),
        offset: u64,
    ) -> Result<Option<u64>> {
        let Some(bytes) = self.read_verified(hash)? else {
            return Ok(None);
        };
        dst.write_block(&bytes, offset)
            .map_err(|source| CasError::Materialize {
                hash: *hash,
                offset,
                source,
            })?;
        Ok(Some(bytes.len() as u64))
    }

    /// The receiver's dedup step for one block: read and verify the stored block, check the
    /// sender's proof of possession against those very bytes, and only then write them to `dst`.
    pub fn materialize(
        &self,
        hash: &BlockHash,
        key: &PopKey,
        proof: &Proof,
        dst: &(impl BlockSink + ?Sized),
        offset: u64,
    ) -> Result<Materialized> {
        match self.check_proof(hash, key, proof) {
            ProofCheck::Proven => {}
            ProofCheck::Rejected => return Ok(Materialized::ProofRejected),
            ProofCheck::Absent => return Ok(Materialized::Missing),
        }
        self.materialize_proven(hash, dst, offset)
    }

    /// Checks a proof of possession against the secret stored beside the block: no block is
    /// read, no last-use time refreshed, and the work is the same for a block the store lacks
    /// (one failed attribute lookup, one keyed hash of 32 bytes, a constant-time compare). A
    /// block stored without a secret (by an older version) fails until it is inserted again.
    pub fn check_proof(&self, hash: &BlockHash, key: &PopKey, proof: &Proof) -> ProofCheck {
        let stored = self.stored_secret(hash);
        let ok = key.verify_secret(stored.as_ref().unwrap_or(&NO_SECRET), proof);
        match (ok, stored.is_some()) {
            (true, true) => ProofCheck::Proven,
            (_, true) => ProofCheck::Rejected,
            (_, false) => ProofCheck::Absent,
        }
    }

    fn stored_secret(&self, hash: &BlockHash) -> Option<Secret> {
        let mut buf = [0u8; 32];
        match rustix::fs::lgetxattr(self.layout.block(hash), SECRET_XATTR, &mut buf[..]) {
            Ok(32) => Some(Secret(buf)),
            _ => None,
        }
    }

    /// Reads and verifies a block whose proof was checked, and writes it into `dst` at
    /// `offset` (refreshing its last-use time). `Missing` if it is gone or corrupt.
    pub fn materialize_proven(
        &self,
        hash: &BlockHash,
        dst: &(impl BlockSink + ?Sized),
        offset: u64,
    ) -> Result<Materialized> {
        let Some(bytes) = self.read_verified(hash)? else {
            return Ok(Materialized::Missing);
        };
        dst.write_block(&bytes, offset)
            .map_err(|source| CasError::Materialize {
                hash: *hash,
                offset,
                source,
            })?;
        Ok(Materialized::Written(bytes.len() as u64))
    }

    /// Adds a block. The caller has verified `data` against `hash` already; it is checked again
    /// here (cheap next to the write) so a caller bug can never put a wrong block under a name.
    pub fn insert(&self, hash: &BlockHash, data: &[u8]) -> Result<InsertOutcome> {
        self.insert_inner(hash, data, None)
    }

    /// Test hook for crash tests: `stall` runs after half the block is written to its temp file,
    /// before publication. The CLI's hidden stall mode uses it to be SIGKILLed mid-insert.
    #[doc(hidden)]
    pub fn insert_with_stall(
        &self,
        hash: &BlockHash,
        data: &[u8],
        stall: &dyn Fn(&Path),
    ) -> Result<InsertOutcome> {
        self.insert_inner(hash, data, Some(stall))
    }

    fn insert_inner(
        &self,
        hash: &BlockHash,
        data: &[u8],
        stall: Option<&dyn Fn(&Path)>,
    ) -> Result<InsertOutcome> {
        if data.len() > BLOCK_SIZE {
            return Err(CasError::BlockTooLarge {
                len: data.len(),
                limit: BLOCK_SIZE,
            });
        }
        let actual = BlockHash::of(data);
        if actual != *hash {
            return Err(CasError::HashMismatch {
                expected: *hash,
                actual,
            });
        }
        let final_path = self.layout.block(hash);
        if self.touch_existing(&final_path) {
            // A block published by an older version has no secret yet: add it.
            if self.stored_secret(hash).is_none() {
                let _ = rustix::fs::lsetxattr(
                    &final_path,
                    SECRET_XATTR,
                    &secret_of(data).0,
                    rustix::fs::XattrFlags::empty(),
                );
            }
            return Ok(InsertOutcome::AlreadyPresent);
        }
        // A concurrent cleaner can only delete our temp in the instant between its creation and
        // our flock; if that happened the rename finds no source and we simply try again.
        let mut last_err = None;
        for _ in 0..3 {
            match self.publish_once(hash, data, &final_path, stall) {
                Ok(Some(outcome)) => {
                    if outcome == InsertOutcome::Inserted {
                        self.after_insert(data.len() as u64);
                    }
                    return Ok(outcome);
                }
                Ok(None) => continue,
                Err(e) => last_err = Some(e),
            }
            break;
        }
        Err(last_err.unwrap_or_else(|| {
            CasError::io(
                "publish block (temp file vanished repeatedly)",
                &final_path,
                io::Error::from(io::ErrorKind::NotFound),
            )
        }))
    }

    /// One attempt: write a temp, publish it under the hash name without replacing anything.
    /// `Ok(None)` means the temp vanished under us (retry).
    fn publish_once(
        &self,
        hash: &BlockHash,
        data: &[u8],
        final_path: &Path,
        stall: Option<&dyn Fn(&Path)>,
    ) -> Result<Option<InsertOutcome>> {
        let mut tmp = TempFile::create(&self.layout.tmp(), "tmp")?;
        let half = data.len() / 2;
        (&tmp.file)
            .write_all(&data[..half])
            .map_err(|e| CasError::io("write temp block", &tmp.path, e))?;
        if let Some(stall) = stall {
            let _ = (&tmp.file).flush();
            stall(&tmp.path);
        }
        (&tmp.file)
            .write_all(&data[half..])
            .map_err(|e| CasError::io("write temp block", &tmp.path, e))?;
        // The possession secret travels with the inode, so it is published atomically with the
        // bytes. Without it the block is stored but never served (proofs cannot be checked).
        if let Err(e) = rustix::fs::fsetxattr(
            &tmp.file,
            SECRET_XATTR,
            &secret_of(data).0,
            rustix::fs::XattrFlags::empty(),
        ) {
            tracing::debug!(error = %e, "could not store a block's possession secret");
        }
        if self.fsync {
            tmp.file
                .sync_data()
                .map_err(|e| CasError::io("fsync temp block", &tmp.path, e))?;
        }
        let shard = self.layout.shard_dir(hash);
        if let Some(parent) = shard.parent() {
            mkdir(parent)?;
        }
        mkdir(&shard)?;
        match renameat_with(CWD, &tmp.path, CWD, final_path, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {
                self.touch_existing(final_path);
                return Ok(Some(InsertOutcome::AlreadyPresent));
            }
            Err(rustix::io::Errno::NOENT) if !tmp.path.exists() => return Ok(None),
            // Filesystems without renameat2 flags: link() also refuses to replace.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
                match fs::hard_link(&tmp.path, final_path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        self.touch_existing(final_path);
                        return Ok(Some(InsertOutcome::AlreadyPresent));
                    }
                    Err(e) => return Err(CasError::io("publish block", final_path, e)),
                }
                // The hard link is published; the temp name goes away on drop.
            }
            Err(e) => return Err(CasError::io("publish block", final_path, e.into())),
        }
        if !tmp.path.exists() {
            // Renamed: nothing left to unlink.
            tmp.mark_published();
        }
        if self.fsync {
            fsync_dir(&shard)?;
        }
        Ok(Some(InsertOutcome::Inserted))
    }

    /// Refreshes the last-use time of an existing block; false if there is none. Anything but a
    /// regular file under the name is discarded (then the caller publishes the real block).
    fn touch_existing(&self, path: &Path) -> bool {
        match open_block(path) {
            Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
                let _ = f.set_modified(SystemTime::now());
                true
            }
            Ok(_) | Err(_) => {
                if let Some(hash) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| BlockHash::parse_hex(n).ok())
                    && fs::symlink_metadata(path).is_ok_and(|m| !m.is_file())
                {
                    self.discard(&hash, 0, "is not a regular file");
                }
                false
            }
        }
    }

    /// Counts the new block and, when the store is over its cap, collects down to 90 % of it so
    /// the next few inserts do not each trigger a scan.
    fn after_insert(&self, len: u64) {
        let Ok(total) = usage::add(&self.layout.usage(), len as i64) else {
            return;
        };
        let Some(cap) = self.cap_bytes else { return };
        if total <= cap {
            return;
        }
        if let Ok(guard) = self.gc_backoff_until.lock()
            && guard.is_some_and(|until| Instant::now() < until)
        {
            return;
        }
        let target = cap / 10 * 9;
        match gc::collect(self, target, false) {
            Ok(Some(report)) if !report.reached_target => {
                tracing::warn!(
                    bytes = report.bytes_after,
                    cap,
                    "block store stays over its cap: the rest is pinned by active transfers"
                );
                if let Ok(mut g) = self.gc_backoff_until.lock() {
                    *g = Some(Instant::now() + std::time::Duration::from_secs(5));
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "block store gc after insert failed"),
        }
    }
}

/// `None`: no marker. `Some(cap)`: a store, with its recorded cap if any.
fn read_marker(layout: &Layout) -> Result<Option<Option<u64>>> {
    let path = layout.marker();
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CasError::io("read store marker", path, e)),
    };
    let mut lines = text.lines();
    if lines.next() != Some(MARKER_HEADER) {
        return Err(CasError::NotAStore {
            path: layout.root().to_path_buf(),
            reason: format!("first line is not {MARKER_HEADER:?}"),
        });
    }
    let mut cap = None;
    for line in lines {
        if let Some(v) = line.strip_prefix("cap_bytes ") {
            cap = Some(v.trim().parse::<u64>().map_err(|_| CasError::NotAStore {
                path: layout.root().to_path_buf(),
                reason: format!("bad cap_bytes line {line:?}"),
            })?);
        }
    }
    Ok(Some(cap))
}

/// Rewrites the marker atomically (temp + rename), so a concurrent opener reads old or new.
fn write_marker(layout: &Layout, cap: Option<u64>) -> Result<()> {
    let mut text = format!("{MARKER_HEADER}\n");
    if let Some(cap) = cap {
        text.push_str(&format!("cap_bytes {cap}\n"));
    }
    let mut tmp = TempFile::create(&layout.tmp(), "marker")?;
    (&tmp.file)
        .write_all(text.as_bytes())
        .map_err(|e| CasError::io("write store marker", &tmp.path, e))?;
    fs::rename(&tmp.path, layout.marker())
        .map_err(|e| CasError::io("publish store marker", layout.marker(), e))?;
    tmp.mark_published();
    Ok(())
}
