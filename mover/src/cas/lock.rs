//! Advisory `flock` locks between processes sharing a store. A lock belongs to an open file
//! description, so each acquisition opens its own descriptor: two threads of one process then
//! exclude each other exactly like two processes do, and a crashed holder's locks vanish with it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

use super::error::{CasError, Result};

/// A held lock; released when dropped (the descriptor closes).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CasError::io("open lock file", path, e))
}

pub fn shared(path: &Path) -> Result<FileLock> {
    let file = open_lock_file(path)?;
    flock(&file, FlockOperation::LockShared)
        .map_err(|e| CasError::io("take shared lock on", path, e.into()))?;
    Ok(FileLock { _file: file })
}

pub fn exclusive(path: &Path) -> Result<FileLock> {
    let file = open_lock_file(path)?;
    flock(&file, FlockOperation::LockExclusive)
        .map_err(|e| CasError::io("take exclusive lock on", path, e.into()))?;
    Ok(FileLock { _file: file })
}

/// `None` when somebody else holds it.
pub fn try_exclusive(path: &Path) -> Result<Option<FileLock>> {
    let file = open_lock_file(path)?;
    match try_lock_file(&file) {
        Ok(true) => Ok(Some(FileLock { _file: file })),
        Ok(false) => Ok(None),
        Err(e) => Err(CasError::io("take exclusive lock on", path, e)),
    }
}

/// Tries an exclusive lock on an already open file: `Ok(false)` when another descriptor holds a
/// lock on it (its owner is alive), `Ok(true)` when we got it (any previous owner is gone).
pub fn try_lock_file(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
