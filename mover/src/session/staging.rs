//! Receiver-side staging under `<root>/.ferry-staging/<transfer-id>/`: temp files that become
//! final files by one atomic rename, and for large files a manifest of written blocks so a rerun
//! after `kill -9` of either end need not move those blocks again.
//!
//! Manifest layout: `FERRYMF2`, u64 size, i64 mtime_sec, u32 mtime_nsec, u32 path length, path
//! bytes, then an array of 32-byte BLAKE3 hashes at fixed offsets, one per block (at the header
//! length plus 32 times the index), all zeros for a block never written. A record is written after the block's
//! bytes, with the hash of exactly those bytes.
//!
//! Nothing found here is trusted: a manifest and part file may have been left by a hostile
//! session of the same transfer, or edited on disk. On resume the manifest only says which
//! blocks *may* be held; each is kept only when the sender's hash of its source block equals the
//! hash of the bytes re-read here (`verify_held`), otherwise it is fetched again. So a file at
//! its final path always has the sender's content.
//!
//! Memory does not grow with the size a peer declares: the part file is not sized up front
//! (it is extended by writes and set to its size at commit), and block hashes live in the
//! manifest on disk, read back in fixed chunks.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, FallocateFlags, FlockOperation, Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use crate::digest::Hash;
use crate::tree::DirFd;
use crate::tree::RelPath;
use crate::tree::peer_dest::{DestError, PeerDest};
use crate::tree::peer_path::{PeerPath, STAGING_DIR};
use crate::wire::{BLOCK_SIZE, BlockSet, MAX_WANT_RANGES};

pub use crate::wire::{block_count, block_len};

const MAGIC: &[u8; 8] = b"FERRYMF2";
const RECORD: u64 = 32;
/// Manifest bytes read at once when scanning or hashing it.
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error("staging {what} for {path} failed")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is being received by another session of this transfer")]
    Busy(String),
    #[error("staging manifest of {0} lacks a block that was written")]
    Incomplete(String),
}

fn serr<'a>(what: &'static str, path: &'a str) -> impl FnOnce(std::io::Error) -> StagingError + 'a {
    move |source| StagingError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The staging directory of one transfer.
pub struct StagingDir {
    dir: DirFd,
    /// `.ferry-staging/<transfer-id>`, relative to the root.
    pub rel: RelPath,
    /// This directory's (device, inode): sessions of this process that use it are counted
    /// under it, so cleanup keeps the directory while another one runs.
    key: (u64, u64),
}

/// Sessions of this process per staging directory.
static USERS: std::sync::Mutex<Vec<((u64, u64), usize)>> = std::sync::Mutex::new(Vec::new());

fn users() -> std::sync::MutexGuard<'static, Vec<((u64, u64), usize)>> {
    USERS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        let mut u = users();
        if let Some(at) = u.iter().position(|(k, _)| *k == self.key) {
            u[at].1 -= 1;
            if u[at].1 == 0 {
                u.swap_remove(at);
            }
        }
    }
}

/// A large file being assembled: its staging data file and manifest.
pub struct LargeStaging {
    pub data: File,
    manifest: File,
    /// Where the hash array starts in the manifest.
    base: u64,
    pub part_name: String,
    manifest_name: String,
    /// The part file existed before this session: its bytes are unknown, so an all-zero block
    /// must be written (or punched), not left as it is.
    pub reused: bool,
}

/// The staging state of a large file and the blocks an earlier run may have left in it.
pub struct Opened {
    pub staging: LargeStaging,
    /// Blocks the manifest says were written (unverified: see [`LargeStaging::verify_held`]).
    pub held: BlockSet,
}

impl StagingDir {
    /// The staging directory's handle (the receiver's digest spills its sort runs here).
    pub fn dir(&self) -> &DirFd {
        &self.dir
    }

    pub fn open(dest: &PeerDest, transfer_id: &str) -> Result<Self, StagingError> {
        // A transfer id is one plain name (its certificate's rules), checked here again.
        let rel = RelPath::parse(format!("{STAGING_DIR}/{transfer_id}").as_bytes())
            .map_err(DestError::from)?;
        let dir = dest.create_dirs(&rel)?;
        let st = rustix::fs::fstat(&dir).map_err(|e| serr("open", &rel.to_string())(e.into()))?;
        let key = (st.st_dev, st.st_ino);
        let mut u = users();
        match u.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => u.push((key, 1)),
        }
        drop(u);
        Ok(Self { dir, rel, key })
    }

    /// Whether another session of this process uses this staging directory now.
    pub fn shared(&self) -> bool {
        users().iter().any(|(k, n)| *k == self.key && *n > 1)
    }

    pub fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
    }

    /// Opens the staging state of a large file. With `resume`, an earlier run's part file and
    /// manifest for the same path, size and mtime are reused and the blocks they claim are
    /// returned as `held` (at most [`MAX_WANT_RANGES`] ranges of them, so the Want that excludes
    /// them fits its frame); nothing in them is trusted yet. Otherwise staging starts empty.
    pub fn open_large(
        &self,
        path: &PeerPath,
        size: u64,
        mtime: (i64, u32),
        resume: bool,
    ) -> Result<Opened, StagingError> {
        let key = blake3::hash(path.as_bytes()).to_hex();
        let base_name = &key.as_str()[..32];
        let part_name = format!("{base_name}.part");
        let manifest_name = format!("{base_name}.manifest");
        let header = manifest_header(path, size, mtime);
        let shown = path.to_string();
        let shown = shown.as_str();

        if resume
            && let Some((data, manifest)) =
                self.try_resume(&part_name, &manifest_name, &header, size, shown)?
        {
            let base = header.len() as u64;
            let held = scan_records(&manifest, base, block_count(size))
                .map_err(serr("read manifest", shown))?;
            return Ok(Opened {
                staging: LargeStaging {
                    data,
                    manifest,
                    base,
                    part_name,
                    manifest_name,
                    reused: true,
                },
                held,
            });
        }

        // Locked before it is truncated, so a concurrent session's file is never cut under it.
        let data = open_locked(&self.dir, &part_name, shown)?;
        data.set_len(0).map_err(serr("truncate part file", shown))?;
        // Not sized up front: a size the peer declares costs nothing until blocks arrive; the
        // commit sets the final size (all-zero blocks stay holes). A fresh manifest replaces
        // whatever has its name (created exclusively: never a FIFO or a link left there).
        self.remove(&manifest_name);
        let mut manifest = create_new(&self.dir, &manifest_name)
            .map_err(|e| serr("create manifest", shown)(e.into()))?;
        manifest
            .write_all(&header)
            .map_err(serr("write manifest", shown))?;
        Ok(Opened {
            staging: LargeStaging {
                data,
                manifest,
                base: header.len() as u64,
                part_name,
                manifest_name,
                reused: false,
            },
            held: BlockSet::new(),
        })
    }

    fn try_resume(
        &self,
        part: &str,
        manifest: &str,
        header: &[u8],
        size: u64,
        shown: &str,
    ) -> Result<Option<(File, File)>, StagingError> {
        let Some(m) = open_own(&self.dir, manifest) else {
            return Ok(None);
        };
        let mut got = vec![0u8; header.len()];
        if m.read_exact_at(&mut got, 0).is_err() || got != header {
            return Ok(None);
        }
        let data = match open_locked(&self.dir, part, shown) {
            Ok(d) => d,
            Err(e @ StagingError::Busy(_)) => return Err(e),
            Err(_) => return Ok(None),
        };
        match data.metadata() {
            Ok(md) if md.is_file() && md.len() <= size => Ok(Some((data, m))),
            _ => Ok(None),
        }
    }

    /// Whether another session holds the lock of this part file.
    fn in_use(&self, part: &str) -> bool {
        let Ok(fd) = rustix::fs::openat(
            &self.dir,
            part,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        matches!(
            rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared),
            Err(Errno::WOULDBLOCK)
        )
    }

    /// Drops the manifest of a large file that was renamed into place.
    pub fn finish_large(&self, st: &LargeStaging) {
        self.remove(&st.manifest_name);
    }

    /// Removes this transfer's staging directory (after a complete session).
    /// Part files another session of this transfer is writing (locked) are kept, with their
    /// manifests, and so is the directory while another session of this process uses it.
    pub fn cleanup(&self, dest: &PeerDest) {
        if let Ok(mut d) = rustix::fs::Dir::read_from(&self.dir) {
            let mut names = Vec::new();
            while let Some(Ok(e)) = d.read() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n != "." && n != ".." {
                    names.push(n);
                }
            }
            let busy: Vec<String> = names
                .iter()
                .filter_map(|n| n.strip_suffix(".part"))
                .filter(|base| self.in_use(&format!("{base}.part")))
                .map(str::to_owned)
                .collect();
            for n in names {
                if !busy.iter().any(|b| n.starts_with(b.as_str())) {
                    self.remove(&n);
                }
            }
        }
        if self.shared() {
            return;
        }
        if let Ok(parent) = dest.open_dir(self.rel.parent().as_ref()) {
            let _ = rustix::fs::unlinkat(&parent, self.rel.file_name(), AtFlags::REMOVEDIR);
            if let Ok(root) = dest.open_dir(None) {
                match rustix::fs::unlinkat(&root, STAGING_DIR, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOTEMPTY) | Err(_) => {}
                }
            }
        }
    }
}

/// Blocks taken from the block store keep their zero pages as holes too.
impl crate::cas::store::BlockSink for LargeStaging {
    fn write_block(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        LargeStaging::write_block(self, offset, data)
    }
}

impl LargeStaging {
    /// Records block `index` as written with `hash` (the hash of the bytes written).
    pub fn record(&self, index: u64, hash: &Hash) -> std::io::Result<()> {
        let off = index
            .checked_mul(RECORD)
            .and_then(|o| o.checked_add(self.base))
            .ok_or_else(|| std::io::Error::other("block index out of range"))?;
        self.manifest.write_all_at(hash, off)
    }

    /// Writes a verified block at `off`, its all-zero pages left as holes (skipped in a fresh
    /// part file, punched out of one an earlier run left, whose bytes there are unknown).
    pub fn write_block(&self, off: u64, data: &[u8]) -> std::io::Result<()> {
        crate::tree::data::write_keeping_holes(self.data.as_fd(), data, off, !self.reused)
            .map_err(Into::into)
    }

    /// An all-zero block: in a fresh part file it is a hole already; in a reused one whatever an
    /// earlier run left there is punched out (or overwritten with zeros where the filesystem
    /// cannot punch).
    pub fn write_zeros(&self, off: u64, len: u64) -> std::io::Result<()> {
        if !self.reused {
            return Ok(());
        }
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.data, flags, off, len) {
            Ok(()) => Ok(()),
            Err(_) => {
                let zeros = vec![0u8; len as usize];
                self.data.write_all_at(&zeros, off)
            }
        }
    }

    /// Re-reads the blocks in `indexes` from the part file and keeps each whose hash equals the
    /// sender's (its record rewritten with that hash); returns, parallel to `indexes`, whether
    /// each must still come over the wire.
    pub fn verify_held(&self, size: u64, indexes: &[u64], hashes: &[Hash]) -> Vec<bool> {
        let pairs: Vec<(u64, &Hash)> = indexes.iter().copied().zip(hashes).collect();
        let parts = crate::cas::dedup::par_chunks(&pairs, |part| {
            let mut buf = vec![0u8; BLOCK_SIZE];
            part.iter()
                .map(|(index, theirs)| {
                    let len = block_len(size, *index) as usize;
                    let off = index.saturating_mul(BLOCK_SIZE as u64);
                    let same = self.data.read_exact_at(&mut buf[..len], off).is_ok()
                        && blake3::hash(&buf[..len]).as_bytes() == *theirs
                        && self.record(*index, theirs).is_ok();
                    !same
                })
                .collect::<Vec<bool>>()
        });
        parts.into_iter().flatten().collect()
    }

    /// The file's digest content hash from the manifest's records of all `nblocks` blocks
    /// (each the hash of the bytes written, or re-read and confirmed, by this session).
    pub fn content_hash(&self, nblocks: u64, shown: &str) -> Result<Hash, StagingError> {
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let total = nblocks
            .checked_mul(RECORD)
            .ok_or_else(|| StagingError::Incomplete(shown.to_owned()))?;
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(READ_CHUNK as u64) as usize;
            self.manifest
                .read_exact_at(&mut buf[..n], self.base + done)
                .map_err(serr("read manifest", shown))?;
            if buf[..n]
                .chunks_exact(RECORD as usize)
                .any(|r| r == [0u8; 32])
            {
                return Err(StagingError::Incomplete(shown.to_owned()));
            }
            h.update(&buf[..n]);
            done += n as u64;
        }
        Ok(*h.finalize().as_bytes())
    }
}

/// A staging file this receiver can trust as its own: a regular file with a single link, owned
/// by this process's effective uid. A second link (a hard link planted in the staging directory
/// to a file elsewhere) or another owner would let a write meant for staging land in a file
/// beyond it, so such a file is never opened for writing.
fn is_own(st: &rustix::fs::Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
        && st.st_nlink == 1
        && st.st_uid == rustix::process::geteuid().as_raw()
}

/// Opens the existing staging file `name` for reading and writing only if it is this
/// receiver's own ([`is_own`], checked before opening, so no FIFO or device is opened, and
/// again on the open file, so a link made in between is seen). Anything else there is unlinked:
/// discarded and recreated by the caller, never written through. `None` when there is no usable
/// file (no symlink is followed).
fn open_own(dir: &DirFd, name: &str) -> Option<File> {
    let discard = || {
        tracing::warn!(
            name,
            "discarding a staging file that is not this receiver's own"
        );
        let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
    };
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(_) => return None,
        Ok(st) if !is_own(&st) => {
            discard();
            return None;
        }
        Ok(_) => {}
    }
    let opened = rustix::fs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    );
    match opened.and_then(|fd| rustix::fs::fstat(&fd).map(|st| (fd, st))) {
        Ok((fd, st)) if is_own(&st) => Some(File::from(fd)),
        Ok(_) => {
            discard();
            None
        }
        Err(_) => None,
    }
}

/// Creates the staging file `name` afresh (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600): a name that
/// appeared since [`open_own`] discarded it fails the open instead of being written through.
fn create_new(dir: &DirFd, name: &str) -> rustix::io::Result<File> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map(File::from)
}

/// Opens this receiver's own part file ([`open_own`]) or creates one, and takes its exclusive
/// lock: two sessions of one transfer never write one staging file.
fn open_locked(dir: &DirFd, name: &str, shown: &str) -> Result<File, StagingError> {
    let f = match open_own(dir, name) {
        Some(f) => f,
        None => create_new(dir, name).map_err(|e| serr("create part file", shown)(e.into()))?,
    };
    match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(Errno::WOULDBLOCK) => Err(StagingError::Busy(shown.to_owned())),
        Err(e) => Err(serr("lock part file", shown)(e.into())),
    }
}

fn manifest_header(path: &PeerPath, size: u64, mtime: (i64, u32)) -> Vec<u8> {
    let p = path.as_bytes();
    let mut h = Vec::with_capacity(32 + p.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&mtime.0.to_le_bytes());
    h.extend_from_slice(&mtime.1.to_le_bytes());
    h.extend_from_slice(&(p.len() as u32).to_le_bytes());
    h.extend_from_slice(p);
    h
}

/// The blocks a manifest claims were written, at most [`MAX_WANT_RANGES`] ranges of them.
/// Holes of the (sparse) manifest are skipped with `SEEK_DATA`, so a manifest of a huge file
/// costs what was written into it, not its apparent size.
fn scan_records(m: &File, base: u64, nblocks: u64) -> std::io::Result<BlockSet> {
    let mut held = BlockSet::new();
    let end = nblocks.saturating_mul(RECORD).saturating_add(base);
    let len = m.metadata()?.len().min(end);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut off = base;
    while off < len {
        // Next data at or after `off` (the whole rest when the filesystem cannot tell).
        match rustix::fs::seek(m, SeekFrom::Data(off)) {
            Ok(d) if d >= len => break,
            Ok(d) => off = off.max(base + (d - base) / RECORD * RECORD),
            Err(Errno::NXIO) => break,
            Err(_) => {}
        }
        let n = ((len - off) as usize).min(READ_CHUNK) / RECORD as usize * RECORD as usize;
        if n == 0 {
            break;
        }
        m.read_exact_at(&mut buf[..n], off)?;
        for (k, rec) in buf[..n].chunks_exact(RECORD as usize).enumerate() {
            if rec == [0u8; 32] {
                continue;
            }
            let index = (off - base) / RECORD + k as u64;
            let new_range = index == 0 || !held.contains(index - 1);
            if new_range && held.range_count() >= MAX_WANT_RANGES {
                return Ok(held);
            }
            held.insert(index);
        }
        off += n as u64;
    }
    Ok(held)
}
