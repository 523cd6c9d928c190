//! Walking every block in the store, streaming: memory does not grow with the number of blocks.

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::error::{CasError, Result};
use super::hash::BlockHash;
use super::layout::Layout;
use super::lru::Candidate;

/// Files under `blocks/` that are not named like a block in its right shard (left alone).
#[derive(Debug, Default, Clone)]
pub struct ScanExtra {
    pub stray_files: u64,
    /// Block names that hold something other than a regular file (a directory, a FIFO, a
    /// symlink, ...): never served; `verify` discards and reports them. At most 4096 listed.
    pub not_regular: Vec<BlockHash>,
}

/// Most non-regular block names a scan lists (all are counted in `stray_files`).
const MAX_NOT_REGULAR: usize = 4096;

fn is_shard_name(name: &str) -> bool {
    name.len() == 2
        && name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn read_dir_or_empty(path: &Path) -> Result<Option<fs::ReadDir>> {
    match fs::read_dir(path) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CasError::io("list store directory", path, e)),
    }
}

/// Calls `f` for each block: its hash, length and last-use time (not verified).
pub fn scan_blocks(
    layout: &Layout,
    mut f: impl FnMut(Candidate) -> Result<()>,
) -> Result<ScanExtra> {
    let mut extra = ScanExtra::default();
    let blocks = layout.blocks();
    let Some(level1) = read_dir_or_empty(&blocks)? else {
        return Ok(extra);
    };
    for d1 in level1 {
        let d1 = d1.map_err(|e| CasError::io("list store directory", &blocks, e))?;
        let n1 = d1.file_name();
        let Some(n1) = n1.to_str().filter(|n| is_shard_name(n)) else {
            extra.stray_files += 1;
            continue;
        };
        let Some(level2) = read_dir_or_empty(&d1.path())? else {
            continue;
        };
        for d2 in level2 {
            let d2 = d2.map_err(|e| CasError::io("list store directory", d1.path(), e))?;
            let n2 = d2.file_name();
            let Some(n2) = n2.to_str().filter(|n| is_shard_name(n)) else {
                extra.stray_files += 1;
                continue;
            };
            let Some(files) = read_dir_or_empty(&d2.path())? else {
                continue;
            };
            for file in files {
                let file = file.map_err(|e| CasError::io("list store directory", d2.path(), e))?;
                let name = file.file_name();
                let hash = name.to_str().and_then(|n| {
                    let h = BlockHash::parse_hex(n).ok()?;
                    (n.starts_with(n1) && n[2..].starts_with(n2) && h.to_hex() == n).then_some(h)
                });
                let Some(hash) = hash else {
                    extra.stray_files += 1;
                    continue;
                };
                let meta = match fs::symlink_metadata(file.path()) {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // evicted meanwhile
                    Err(e) => return Err(CasError::io("stat block", file.path(), e)),
                };
                if !meta.is_file() {
                    extra.stray_files += 1;
                    if extra.not_regular.len() < MAX_NOT_REGULAR {
                        extra.not_regular.push(hash);
                    }
                    continue;
                }
                f(Candidate {
                    last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    hash,
                    len: meta.len(),
                })?;
            }
        }
    }
    Ok(extra)
}
