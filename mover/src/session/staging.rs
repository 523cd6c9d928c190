//! Receiver-side staging under `<root>/.ferry-staging/<transfer-id>/`: temp files that become
//! final files by one atomic rename, and for large files a manifest of verified blocks so a
//! rerun after `kill -9` of either end asks only for blocks that were never written.
//!
//! Manifest layout: `FERRYMF1`, u64 size, i64 mtime_sec, u32 mtime_nsec, u32 path length, path
//! bytes, then one record per verified block: u64 index, 32-byte BLAKE3. Records are appended
//! after the block's bytes were written; on resume each recorded block is re-read and re-hashed,
//! so a torn or poisoned staging file only costs a resend, never a wrong final file.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::dest::{DestError, DestRoot};
use super::relpath::{PeerPath, STAGING_DIR};
use crate::tree::DirFd;
use crate::wire::BLOCK_SIZE;

const MAGIC: &[u8; 8] = b"FERRYMF1";
const RECORD: usize = 8 + 32;

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
}

fn serr<'a>(what: &'static str, path: &'a str) -> impl FnOnce(std::io::Error) -> StagingError + 'a {
    move |source| StagingError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The staging directory of one transfer.
pub struct Staging {
    dir: DirFd,
    /// `.ferry-staging/<transfer-id>`, relative to the root.
    pub rel: String,
}

/// A large file being assembled: its staging data file and manifest.
pub struct LargeStaging {
    pub data: File,
    manifest: File,
    pub part_name: String,
    manifest_name: String,
}

/// What an earlier interrupted run already left verified.
pub struct Resumed {
    pub staging: LargeStaging,
    /// `true` for every block still needed.
    pub need: Vec<bool>,
    /// BLAKE3 of each block re-read and verified here (zeros for blocks still needed).
    pub hashes: Vec<[u8; 32]>,
    pub resumed_bytes: u64,
}

pub fn block_count(size: u64) -> u64 {
    size.div_ceil(BLOCK_SIZE as u64)
}

pub fn block_len(size: u64, index: u64) -> u64 {
    let start = index * BLOCK_SIZE as u64;
    size.saturating_sub(start).min(BLOCK_SIZE as u64)
}

impl Staging {
    /// The staging directory's handle (the receiver's digest spills its sort runs here).
    pub fn dir(&self) -> &DirFd {
        &self.dir
    }

    pub fn open(dest: &DestRoot, transfer_id: &str) -> Result<Self, StagingError> {
        let rel = format!("{STAGING_DIR}/{transfer_id}");
        let dir = dest.create_dirs(&rel)?;
        Ok(Self { dir, rel })
    }

    pub fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
    }

    /// Opens the staging state of a large file, reusing verified blocks of an earlier run if
    /// the manifest names the same path, size and mtime.
    pub fn open_large(
        &self,
        path: &PeerPath,
        size: u64,
        mtime: (i64, u32),
    ) -> Result<Resumed, StagingError> {
        let key = blake3::hash(path.as_str().as_bytes()).to_hex();
        let base = &key.as_str()[..32];
        let part_name = format!("{base}.part");
        let manifest_name = format!("{base}.manifest");
        let header = manifest_header(path, size, mtime);
        let nblocks = block_count(size) as usize;
        let mut need = vec![true; nblocks];
        let mut hashes = vec![[0u8; 32]; nblocks];
        let mut resumed_bytes = 0;

        if let Some((data, manifest)) = self.try_resume(&part_name, &manifest_name, &header, size) {
            let records = read_records(&manifest, header.len() as u64).unwrap_or_default();
            let mut buf = vec![0u8; BLOCK_SIZE];
            for (index, hash) in records {
                let Some(slot) = need.get_mut(index as usize) else {
                    continue;
                };
                if !*slot {
                    continue;
                }
                let len = block_len(size, index) as usize;
                let off = index * BLOCK_SIZE as u64;
                if data.read_exact_at(&mut buf[..len], off).is_ok()
                    && blake3::hash(&buf[..len]).as_bytes() == &hash
                {
                    *slot = false;
                    hashes[index as usize] = hash;
                    resumed_bytes += len as u64;
                }
            }
            return Ok(Resumed {
                staging: LargeStaging {
                    data,
                    manifest,
                    part_name,
                    manifest_name,
                },
                need,
                hashes,
                resumed_bytes,
            });
        }

        let open = |name: &str| {
            rustix::fs::openat(
                &self.dir,
                name,
                OFlags::CREATE | OFlags::TRUNC | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map(File::from)
            .map_err(std::io::Error::from)
        };
        let shown = path.as_str();
        let data = open(&part_name).map_err(serr("create part file", shown))?;
        // Sized up front: blocks land at their offsets, all-zero blocks stay holes.
        data.set_len(size).map_err(serr("size part file", shown))?;
        let mut manifest = open(&manifest_name).map_err(serr("create manifest", shown))?;
        manifest
            .write_all(&header)
            .map_err(serr("write manifest", shown))?;
        Ok(Resumed {
            staging: LargeStaging {
                data,
                manifest,
                part_name,
                manifest_name,
            },
            need,
            hashes,
            resumed_bytes,
        })
    }

    fn try_resume(
        &self,
        part: &str,
        manifest: &str,
        header: &[u8],
        size: u64,
    ) -> Option<(File, File)> {
        let open = |name: &str| {
            rustix::fs::openat(
                &self.dir,
                name,
                OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
            .map(File::from)
        };
        let mut m = open(manifest)?;
        let data = open(part)?;
        let mut got = vec![0u8; header.len()];
        m.read_exact(&mut got).ok()?;
        if got != header || data.metadata().ok()?.len() != size {
            return None;
        }
        Some((data, m))
    }

    /// Drops the manifest of a large file that was renamed into place.
    pub fn finish_large(&self, st: &LargeStaging) {
        self.remove(&st.manifest_name);
    }

    /// Removes this transfer's staging directory (after a complete session).
    pub fn cleanup(&self, dest: &DestRoot) {
        if let Ok(mut d) = rustix::fs::Dir::read_from(&self.dir) {
            let mut names = Vec::new();
            while let Some(Ok(e)) = d.read() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n != "." && n != ".." {
                    names.push(n);
                }
            }
            for n in names {
                self.remove(&n);
            }
        }
        if let Ok(parent) = dest.open_dir(Some(STAGING_DIR)) {
            if let Some(leaf) = self.rel.rsplit('/').next() {
                let _ = rustix::fs::unlinkat(&parent, leaf, AtFlags::REMOVEDIR);
            }
            if let Ok(root) = dest.open_dir(None) {
                match rustix::fs::unlinkat(&root, STAGING_DIR, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOTEMPTY) | Err(_) => {}
                }
            }
        }
    }
}

impl LargeStaging {
    /// Appends the record of a verified, written block.
    pub fn record(&mut self, index: u64, hash: &[u8; 32]) -> std::io::Result<()> {
        let mut rec = [0u8; RECORD];
        rec[..8].copy_from_slice(&index.to_le_bytes());
        rec[8..].copy_from_slice(hash);
        self.manifest.write_all(&rec)
    }
}

fn manifest_header(path: &PeerPath, size: u64, mtime: (i64, u32)) -> Vec<u8> {
    let p = path.as_str().as_bytes();
    let mut h = Vec::with_capacity(32 + p.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&mtime.0.to_le_bytes());
    h.extend_from_slice(&mtime.1.to_le_bytes());
    h.extend_from_slice(&(p.len() as u32).to_le_bytes());
    h.extend_from_slice(p);
    h
}

/// Reads the block records (bounded by the file's own length; a torn last record is ignored).
fn read_records(m: &File, start: u64) -> std::io::Result<Vec<(u64, [u8; 32])>> {
    let len = m.metadata()?.len();
    let mut out = Vec::new();
    let mut off = start;
    let mut rec = [0u8; RECORD];
    while off + RECORD as u64 <= len {
        m.read_exact_at(&mut rec, off)?;
        let mut idx = [0u8; 8];
        idx.copy_from_slice(&rec[..8]);
        let mut h = [0u8; 32];
        h.copy_from_slice(&rec[8..]);
        out.push((u64::from_le_bytes(idx), h));
        off += RECORD as u64;
    }
    Ok(out)
}
