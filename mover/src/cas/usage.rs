//! The store's approximate size in bytes, kept on disk so every process sharing the store sees the
//! same figure. Inserts and removals adjust it under a lock; a crash between publishing a block and
//! counting it makes it drift, so every gc scan overwrites it with the exact total.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

use super::error::{CasError, Result};

fn open_locked(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| CasError::io("open usage counter", path, e))?;
    flock(&file, FlockOperation::LockExclusive)
        .map_err(|e| CasError::io("lock usage counter", path, e.into()))?;
    Ok(file)
}

fn read_value(file: &File, path: &Path) -> Result<u64> {
    let mut buf = [0u8; 8];
    match file.read_exact_at(&mut buf, 0) {
        Ok(()) => Ok(u64::from_le_bytes(buf)),
        // A new (or truncated) counter reads as zero; the next gc corrects it.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
        Err(e) => Err(CasError::io("read usage counter", path, e)),
    }
}

fn write_value(file: &File, path: &Path, v: u64) -> Result<()> {
    file.write_all_at(&v.to_le_bytes(), 0)
        .map_err(|e| CasError::io("write usage counter", path, e))
}

pub fn get(path: &Path) -> Result<u64> {
    let file = open_locked(path)?;
    read_value(&file, path)
}

/// Adds `delta` (which may be negative) and returns the new value.
pub fn add(path: &Path, delta: i64) -> Result<u64> {
    let file = open_locked(path)?;
    let v = read_value(&file, path)?.saturating_add_signed(delta);
    write_value(&file, path, v)?;
    Ok(v)
}

pub fn set(path: &Path, v: u64) -> Result<()> {
    let file = open_locked(path)?;
    write_value(&file, path, v)
}
