//! The sender's walk of its source tree, streamed as groups of entries (no scan phase, memory
//! bounded by one group plus one open directory handle per level).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_proto::wire::v1 as pb;
use tokio::sync::mpsc;

use super::SMALL_FILE_MAX;
use super::relpath::STAGING_DIR;
use crate::progress::Progress;

/// Entries per Offer and whole-file bytes per group (keeps one group's batches small).
const GROUP_ENTRIES: usize = 1024;
const GROUP_SMALL_BYTES: u64 = 4 * 1024 * 1024;
/// Hard links remembered for the final phase; beyond this, extra links travel as copies.
const MAX_HARDLINKS: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("failed to read source {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("source path {0} is not valid UTF-8; ferry transfers UTF-8 names only")]
    NotUtf8(PathBuf),
    #[error("the receiver went away while the tree was being walked")]
    Closed,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScanError + '_ {
    move |source| ScanError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Opens a source file without following a symlink swapped in at the leaf.
pub fn open_source(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

fn entry_of(rel: String, md: &std::fs::Metadata, kind: pb::EntryKind) -> pb::Entry {
    pb::Entry {
        path: rel,
        kind: kind as i32,
        mode: md.mode() & 0o7777,
        mtime_sec: md.mtime(),
        mtime_nsec: md.mtime_nsec().clamp(0, 999_999_999) as u32,
        size: if kind == pb::EntryKind::File {
            md.size()
        } else {
            0
        },
        target: String::new(),
        checksum: Vec::new(),
    }
}

fn rel_string(rel: &Path) -> Result<String, ScanError> {
    rel.to_str()
        .map(str::to_owned)
        .ok_or_else(|| ScanError::NotUtf8(rel.to_owned()))
}

/// Walks `root`, sending groups of entries; returns the hard links to create at the end.
pub fn scan(
    root: &Path,
    checksum: bool,
    tx: mpsc::Sender<Vec<pb::Entry>>,
    progress: Arc<Progress>,
) -> Result<Vec<pb::Entry>, ScanError> {
    let mut group: Vec<pb::Entry> = Vec::new();
    let mut group_bytes = 0u64;
    let mut links: HashMap<(u64, u64), String> = HashMap::new();
    let mut hardlinks = Vec::new();
    let mut stack: Vec<(PathBuf, std::fs::ReadDir)> =
        vec![(PathBuf::new(), std::fs::read_dir(root).map_err(io(root))?)];

    let flush = |group: &mut Vec<pb::Entry>, bytes: &mut u64| -> Result<(), ScanError> {
        if !group.is_empty() {
            tx.blocking_send(std::mem::take(group))
                .map_err(|_| ScanError::Closed)?;
        }
        *bytes = 0;
        Ok(())
    };

    while let Some((dir_rel, rd)) = stack.last_mut() {
        let Some(next) = rd.next() else {
            stack.pop();
            continue;
        };
        let dir_abs = root.join(&*dir_rel);
        let ent = next.map_err(io(&dir_abs))?;
        let name = ent.file_name();
        if dir_rel.as_os_str().is_empty() && name == STAGING_DIR {
            continue;
        }
        let rel_path = dir_rel.join(&name);
        let abs = root.join(&rel_path);
        let md = std::fs::symlink_metadata(&abs).map_err(io(&abs))?;
        let rel = rel_string(&rel_path)?;
        let ft = md.file_type();
        if ft.is_dir() {
            group.push(entry_of(rel, &md, pb::EntryKind::Dir));
            let rd = std::fs::read_dir(&abs).map_err(io(&abs))?;
            stack.push((rel_path, rd));
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&abs).map_err(io(&abs))?;
            let mut e = entry_of(rel, &md, pb::EntryKind::Symlink);
            e.target = rel_string(&target)?;
            group.push(e);
        } else if ft.is_file() {
            if md.nlink() > 1 {
                let key = (md.dev(), md.ino());
                if let Some(first) = links.get(&key) {
                    let mut e = entry_of(rel, &md, pb::EntryKind::Hardlink);
                    e.target = first.clone();
                    hardlinks.push(e);
                    continue;
                }
                if links.len() < MAX_HARDLINKS {
                    links.insert(key, rel.clone());
                }
            }
            let mut e = entry_of(rel, &md, pb::EntryKind::File);
            if checksum {
                let mut f = open_source(&abs).map_err(io(&abs))?;
                let mut h = blake3::Hasher::new();
                h.update_reader(&mut f).map_err(io(&abs))?;
                e.checksum = h.finalize().as_bytes().to_vec();
            }
            progress.add(&progress.files_total, 1);
            progress.add(&progress.bytes_total, md.size());
            if md.size() <= SMALL_FILE_MAX {
                group_bytes += md.size();
            } else {
                // A large file ends its group so its blocks start flowing early.
                group_bytes = GROUP_SMALL_BYTES;
            }
            group.push(e);
        } else {
            tracing::warn!(path = %abs.display(), "skipping special file (device, fifo or socket)");
        }
        if group.len() >= GROUP_ENTRIES || group_bytes >= GROUP_SMALL_BYTES {
            flush(&mut group, &mut group_bytes)?;
        }
    }
    flush(&mut group, &mut group_bytes)?;
    progress
        .totals_final
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(hardlinks)
}

/// Largest listing sent for `--delete`; a bigger directory keeps its extraneous entries.
const MAX_LISTING_BYTES: usize = 12 * 1024 * 1024;

/// Walks the directories again (after the data) and sends each one's final metadata and, for
/// `--delete`, the names it holds. Root first is fine: every DirDone deletes then sets metadata.
pub fn walk_dirs(
    root: &Path,
    with_names: bool,
    tx: mpsc::Sender<pb::DirDone>,
) -> Result<(), ScanError> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        let md = std::fs::symlink_metadata(&abs).map_err(io(&abs))?;
        let mut names = Vec::new();
        let mut listing_bytes = 0usize;
        for ent in std::fs::read_dir(&abs).map_err(io(&abs))? {
            let ent = ent.map_err(io(&abs))?;
            let name = ent.file_name();
            if rel.as_os_str().is_empty() && name == STAGING_DIR {
                continue;
            }
            let ft = ent.file_type().map_err(io(&abs))?;
            if ft.is_dir() {
                stack.push(rel.join(&name));
            }
            if with_names && listing_bytes <= MAX_LISTING_BYTES {
                let n = name
                    .to_str()
                    .ok_or_else(|| ScanError::NotUtf8(rel.join(&name)))?
                    .to_owned();
                listing_bytes += n.len() + 4;
                names.push(n);
            }
        }
        let complete = with_names && listing_bytes <= MAX_LISTING_BYTES;
        if !complete {
            names.clear();
        }
        let dir = entry_of(rel_string(&rel)?, &md, pb::EntryKind::Dir);
        tx.blocking_send(pb::DirDone {
            dir: Some(dir),
            complete_listing: complete,
            names,
        })
        .map_err(|_| ScanError::Closed)?;
    }
    Ok(())
}
