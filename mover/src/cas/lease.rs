//! Leases: an active transfer pins the blocks it is about to use so gc never evicts them.
//!
//! A lease is a file `leases/<transfer>-<pid>-….lease` listing pinned hashes, one hex line each.
//! Its holder keeps an exclusive `flock` on it for as long as the [`Lease`] lives. The kernel drops
//! that lock when the holder exits in any way (including SIGKILL), so gc tells live leases from
//! dead ones by trying the lock: no heartbeats, no clocks, no pid reuse problems.
//!
//! Ordering against gc: pins are appended under the store lock held shared, and gc reads the
//! leases and deletes under it held exclusive. So a block pinned and then found by `lookup` is
//! guaranteed to stay until the lease is dropped.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::error::{CasError, Result};
use super::hash::BlockHash;
use super::layout::Layout;
use super::lock;
use super::store::{CasStore, TempFile};

/// A held lease; pins last until it is dropped (or its process dies).
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    /// Holds the flock that marks this lease live.
    _locked: File,
    /// Append-mode descriptor for pins; the mutex keeps concurrent pins from interleaving.
    appender: Mutex<File>,
    lock_path: PathBuf,
}

/// Keeps names short and inert whatever the caller passes as a transfer id.
fn sanitize(id: &str) -> String {
    id.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl CasStore {
    /// Takes a lease for one transfer (the id only names the file, for operators).
    pub fn lease(&self, transfer_id: &str) -> Result<Lease> {
        let layout = self.layout();
        // Created and locked under tmp/, then renamed into leases/: gc never sees an unlocked
        // lease of a live holder.
        let mut tmp = TempFile::create(&layout.tmp(), "lease-tmp")?;
        let name = tmp
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.trim_end_matches(".lease-tmp").to_owned())
            .unwrap_or_default();
        let path = layout
            .leases()
            .join(format!("{}-{name}.lease", sanitize(transfer_id)));
        fs::rename(&tmp.path, &path).map_err(|e| CasError::io("publish lease", &path, e))?;
        tmp.mark_published();
        let locked = tmp
            .file
            .try_clone()
            .map_err(|e| CasError::io("keep lease open", &path, e))?;
        let appender = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| CasError::io("open lease for appending", &path, e))?;
        Ok(Lease {
            path,
            _locked: locked,
            appender: Mutex::new(appender),
            lock_path: layout.lock(),
        })
    }
}

impl Lease {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pins `hashes` until this lease is dropped. Pin before looking blocks up.
    pub fn pin(&self, hashes: &[BlockHash]) -> Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        let mut text = String::with_capacity(hashes.len() * 65);
        for h in hashes {
            text.push_str(&h.to_hex());
            text.push('\n');
        }
        let _shared = lock::shared(&self.lock_path)?;
        let mut f = self
            .appender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.write_all(text.as_bytes())
            .map_err(|e| CasError::io("append to lease", &self.path, e))
    }
}

impl Lease {
    /// Size of the lease file (bytes of pins).
    pub fn len(&self) -> u64 {
        fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// What the lease directory holds right now.
#[derive(Debug, Default)]
pub struct LeaseScan {
    pub pinned: HashSet<BlockHash>,
    pub live: u64,
    pub expired_removed: u64,
}

/// Reads every live lease's pins and deletes leases whose holder has died. Call with the store
/// lock held exclusively when the result decides deletions. Memory is the pins of live leases.
pub fn scan_leases(layout: &Layout, remove_expired: bool) -> Result<LeaseScan> {
    let dir = layout.leases();
    let mut scan = LeaseScan::default();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(scan),
        Err(e) => return Err(CasError::io("list leases in", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| CasError::io("list leases in", &dir, e))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("lease") {
            continue;
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // released meanwhile
            Err(e) => return Err(CasError::io("open lease", path, e)),
        };
        let holder_alive =
            !lock::try_lock_file(&file).map_err(|e| CasError::io("probe lease lock", &path, e))?;
        if !holder_alive {
            if remove_expired {
                let _ = fs::remove_file(&path);
            }
            scan.expired_removed += 1;
            continue;
        }
        scan.live += 1;
        for line in BufReader::new(file).lines() {
            let line = line.map_err(|e| CasError::io("read lease", &path, e))?;
            // A torn last line cannot happen under the lock; skip anything unparsable anyway.
            if let Ok(h) = BlockHash::parse_hex(line.trim()) {
                scan.pinned.insert(h);
            }
        }
    }
    Ok(scan)
}
