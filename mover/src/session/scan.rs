//! The sender's walk of its source tree, streamed as groups of entries (no scan phase, memory
//! bounded by one group plus one open directory handle per level).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_proto::wire::v1 as pb;
use tokio::sync::mpsc;

use super::SMALL_FILE_MAX;
use crate::digest::{self, TreeBuilder};
use crate::progress::Progress;
use crate::tree::peer_path::STAGING_DIR;
use crate::tree::{self, DirFd, Filter, Kind, Meta, RelPath, Scanner};

/// Entries per Offer, and the most whole-file bytes one group holds: its small files fit one
/// 4 MiB pack (the packs capability), and its batches stay small.
const GROUP_ENTRIES: usize = 1024;
pub const GROUP_SMALL_BYTES: u64 = 4 * 1024 * 1024;
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
    #[error("failed to walk source {root}")]
    Walk {
        root: PathBuf,
        #[source]
        source: tree::ScanError,
    },
    /// Permission denied on a source entry, without `--skip-unreadable`.
    #[error(
        "cannot read source entry {path}: this mover may not read it (--skip-unreadable leaves \
         such entries out, names them and exits 1)"
    )]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the receiver went away while the tree was being walked")]
    Closed,
}

/// What the sender does with a source entry it may not read (permission denied on its open,
/// its stat or its listing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnUnreadable {
    /// Fail the transfer at once, naming the entry (a permanent source fault).
    #[default]
    Fail,
    /// Leave it out and name it (exit status 1). Its parent's listing still holds its name, so
    /// a receiver with `--delete` keeps its copy, as for an excluded entry.
    Skip,
}

/// The walking process's identity, to judge from a stat alone whether it may read a file.
struct Reader {
    euid: u32,
    groups: Vec<u32>,
}

impl Reader {
    fn of_this_process() -> Reader {
        let mut groups: Vec<u32> = rustix::process::getgroups()
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        groups.push(rustix::process::getegid().as_raw());
        Reader {
            euid: rustix::process::geteuid().as_raw(),
            groups,
        }
    }

    /// Whether the mode bits let this process read `m` (root always may: its capabilities
    /// decide, and a read that fails still fails later).
    fn may_read(&self, m: &crate::tree::Meta) -> bool {
        let bit = if self.euid == m.uid {
            0o400
        } else if self.groups.contains(&m.gid) {
            0o040
        } else {
            0o004
        };
        self.euid == 0 || m.mode & bit != 0
    }
}

/// Permission denied: the mover's uid may not read the entry (a retry cannot help).
fn is_denied(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

/// A walk error that is a permission denial, as the entry it is about and the OS error; any
/// other error back as it was.
fn denial(e: tree::ScanError) -> Result<(String, std::io::Error), tree::ScanError> {
    match e {
        tree::ScanError::Io { path, source, .. } if is_denied(&source) => Ok((path, source)),
        e => Err(e),
    }
}

/// An unreadable entry `rel` met by the walk: with [`OnUnreadable::Skip`] it is counted and
/// named in `progress`, otherwise the walk fails naming it.
fn left_out(
    root: &Path,
    rel: &str,
    source: std::io::Error,
    policy: OnUnreadable,
    progress: &Progress,
) -> Result<(), ScanError> {
    match policy {
        OnUnreadable::Skip => {
            tracing::warn!(path = %rel, "source entry unreadable (permission denied): left out");
            progress.note_unreadable(rel);
            Ok(())
        }
        OnUnreadable::Fail => Err(ScanError::Unreadable {
            path: root.join(rel),
            source,
        }),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScanError + '_ {
    move |source| ScanError::Io {
        path: path.to_owned(),
        source,
    }
}

fn entry_of(rel: Vec<u8>, m: &Meta, kind: pb::EntryKind) -> pb::Entry {
    pb::Entry {
        path: rel,
        kind: kind as i32,
        mode: m.mode & 0o7777,
        mtime_sec: m.mtime_sec,
        mtime_nsec: m.mtime_nsec.min(999_999_999),
        size: if kind == pb::EntryKind::File {
            m.size
        } else {
            0
        },
        target: Vec::new(),
        checksum: Vec::new(),
        // Always sent: whether to apply them is the receiver's choice.
        uid: Some(m.uid),
        gid: Some(m.gid),
        xattrs: Vec::new(),
    }
}

/// `name` in the open directory `dir`, as a path through that handle: what it names cannot move
/// outside the tree whatever happens to the directories above (the l*xattr calls do not follow
/// `name` itself).
fn beneath(dir: &DirFd, name: &[u8]) -> PathBuf {
    use std::os::fd::AsRawFd;
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(std::ffi::OsStr::from_bytes(name));
    p
}

/// Most bytes of extended attribute names and values sent for one entry; an entry with more
/// sends none (the receiver refuses more, so an honest sender stays below it).
pub const MAX_XATTR_BYTES: usize = 64 * 1024;

/// The `user.*` extended attributes of the entry at `path` (not following a symlink there), or
/// none when the filesystem has none, they cannot be read, or they exceed [`MAX_XATTR_BYTES`].
/// Reading them is the sender's duty; whether they are applied is the receiver's choice.
pub fn user_xattrs(path: &Path) -> Vec<pb::Xattr> {
    collect_xattrs(
        &path.display(),
        |names| rustix::fs::llistxattr(path, names),
        |name, value| rustix::fs::lgetxattr(path, name, value),
    )
}

/// [`user_xattrs`] of the file `f` holds (a single file given as the source: read from its
/// handle, never by name).
fn user_xattrs_of(f: &File, shown: &dyn std::fmt::Display) -> Vec<pb::Xattr> {
    collect_xattrs(
        shown,
        |names| rustix::fs::flistxattr(f, names),
        |name, value| rustix::fs::fgetxattr(f, name, value),
    )
}

/// The `user.*` attributes `list` names and `get` reads (see [`user_xattrs`]).
fn collect_xattrs(
    shown: &dyn std::fmt::Display,
    list: impl FnOnce(&mut [u8]) -> rustix::io::Result<usize>,
    get: impl Fn(&[u8], &mut [u8]) -> rustix::io::Result<usize>,
) -> Vec<pb::Xattr> {
    let mut names = vec![0u8; MAX_XATTR_BYTES];
    let len = match list(&mut names[..]) {
        Ok(0) | Err(_) => return Vec::new(),
        Ok(n) => n,
    };
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut value = vec![0u8; MAX_XATTR_BYTES];
    for name in names[..len].split(|&b| b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let n = match get(name, &mut value[..]) {
            Ok(n) => n,
            Err(_) => continue, // removed meanwhile, or too large: not sent
        };
        total += name.len() + n;
        if total > MAX_XATTR_BYTES {
            tracing::warn!(
                path = %shown,
                "extended attributes above {MAX_XATTR_BYTES} bytes: none sent for this entry"
            );
            return Vec::new();
        }
        out.push(pb::Xattr {
            name: name.to_vec(),
            value: value[..n].to_vec(),
        });
    }
    out
}

/// Opens a file the walk met for reading: from the walk's own handle when it holds one (a
/// single file given as the source: see [`tree::Entry::file`]), else by name in its directory.
fn open_entry(entry: &tree::Entry) -> std::io::Result<File> {
    match &entry.file {
        Some(f) => tree::confine::reopen(f),
        None => open_in(&entry.parent, entry.rel.file_name()),
    }
}

/// `root/rel` for messages and for the few opens by path; `rel` is raw bytes as on the wire.
pub fn source_path(root: &Path, rel: &[u8]) -> PathBuf {
    root.join(std::ffi::OsStr::from_bytes(rel))
}

/// What the walk reads beyond each entry's stat, and what it does with an entry it may not
/// read.
#[derive(Debug, Clone, Copy)]
pub struct Collect {
    /// Each file's BLAKE3 (`--checksum`), read during the walk.
    pub checksum: bool,
    /// `user.*` extended attributes (the receiver keeps them).
    pub xattrs: bool,
    /// A source entry this mover may not read: fail, or leave it out and name it.
    pub unreadable: OnUnreadable,
}

/// The single file a file source sends: its name in the directory walked, and the file itself
/// when it is held open already (see [`tree::Scanner::only_file_at_root`]): its name is then
/// not looked up at all.
#[derive(Debug, Clone, Copy)]
pub struct Only<'a> {
    pub name: &'a [u8],
    pub file: Option<&'a Arc<File>>,
}

/// Walks `root`, sending groups of entries; returns the hard links to create at the end. Every
/// stat and open is relative to its directory's handle (the engine's [`Scanner`]), so a file
/// costs no path walk.
///
/// Feeds the digest's `tree`: directories and symlinks as they are met; files as expected
/// entries whose content hash comes later, unless `collect.checksum` (then the walk reads each file
/// anyway and computes both hashes in that one read). Hard links are not part of the tree.
///
/// `only` is the single file a file source sends (see [`Only`]).
pub fn scan(
    root: &Path,
    only: Option<Only<'_>>,
    filter: &Arc<Filter>,
    collect: Collect,
    tx: mpsc::Sender<Vec<pb::Entry>>,
    progress: Arc<Progress>,
    tree: &std::sync::Mutex<TreeBuilder>,
) -> Result<Vec<pb::Entry>, ScanError> {
    let with_tree = |f: &mut dyn FnMut(&mut TreeBuilder)| {
        if let Ok(mut t) = tree.lock() {
            f(&mut t);
        }
    };
    let mut read_buf = Vec::new();
    let mut group: Vec<pb::Entry> = Vec::new();
    let mut group_bytes = 0u64;
    let mut hardlinks = Vec::new();
    let scanner = Scanner::open(root)
        .map_err(|e| walk_error(root, e))?
        .exclude_at_root(STAGING_DIR.as_bytes())
        .with_filter(filter.clone());
    let scanner = match only {
        Some(Only {
            name,
            file: Some(file),
        }) => scanner.only_file_at_root(name, file.clone()),
        Some(Only { name, file: None }) => scanner.only_at_root(name),
        None => scanner,
    };

    let flush = |group: &mut Vec<pb::Entry>, bytes: &mut u64| -> Result<(), ScanError> {
        if !group.is_empty() {
            tx.blocking_send(std::mem::take(group))
                .map_err(|_| ScanError::Closed)?;
        }
        *bytes = 0;
        Ok(())
    };

    let who = Reader::of_this_process();
    for event in scanner {
        // A source that cannot be read completely cannot be transferred faithfully: stop,
        // unless the entry is one this mover may not read and the user said to leave those out.
        let event = match event {
            Ok(event) => event,
            Err(e) => match denial(e) {
                Ok((rel, source)) => {
                    left_out(root, &rel, source, collect.unreadable, &progress)?;
                    continue;
                }
                Err(e) => return Err(walk_error(root, e)),
            },
        };
        let entry = match event {
            tree::ScanEvent::Entry(entry) => entry,
            tree::ScanEvent::DirDone { rel, .. } => {
                let path = rel.as_ref().map(RelPath::as_bytes).unwrap_or_default();
                with_tree(&mut |t| t.close_dir(path));
                continue;
            }
        };
        let rel = entry.rel.as_bytes().to_vec();
        let m = &entry.meta;
        match m.kind {
            Kind::Dir => {
                with_tree(&mut |t| t.open_dir(&rel));
                group.push(entry_of(rel, m, pb::EntryKind::Dir));
            }
            Kind::Symlink => {
                let target = entry.link_target.unwrap_or_default();
                let mut e = entry_of(rel, m, pb::EntryKind::Symlink);
                e.target = target;
                let h = digest::symlink_entry(e.mode, (e.mtime_sec, e.mtime_nsec), &e.target);
                with_tree(&mut |t| t.add(&e.path, h));
                group.push(e);
            }
            Kind::File => {
                // An unreadable file fails the transfer (or is left out) now, before the bytes of
                // the rest are sent, not at 97 %. The stat says so without a syscall; only a
                // file its mode bits deny is opened to confirm (an ACL or a capability may still
                // allow it). Other open errors (removed meanwhile) surface when the data is read.
                let opened = if who.may_read(&entry.meta) {
                    None
                } else {
                    match open_entry(&entry) {
                        Ok(f) => Some(f),
                        Err(e) if is_denied(&e) => {
                            left_out(
                                root,
                                &entry.rel.to_string(),
                                e,
                                collect.unreadable,
                                &progress,
                            )?;
                            continue;
                        }
                        Err(_) => None,
                    }
                };
                if let Some(first) = &entry.hardlink_of
                    && hardlinks.len() < MAX_HARDLINKS
                {
                    let mut e = entry_of(rel, m, pb::EntryKind::Hardlink);
                    e.target = first.as_bytes().to_vec();
                    hardlinks.push(e);
                    continue;
                }
                let mut e = entry_of(rel, m, pb::EntryKind::File);
                if collect.xattrs {
                    e.xattrs = match &entry.file {
                        Some(f) => user_xattrs_of(f, &entry.rel),
                        None => user_xattrs(&beneath(&entry.parent, entry.rel.file_name())),
                    };
                }
                if collect.checksum {
                    let abs = source_path(root, &e.path);
                    let mut f = match opened {
                        Some(f) => f,
                        None => open_entry(&entry).map_err(io(&abs))?,
                    };
                    let mut counted = digest::CountingReader {
                        inner: &mut f,
                        count: &progress.hashed_bytes,
                    };
                    let read =
                        digest::hash_reader(&mut counted, &mut read_buf, true).map_err(io(&abs))?;
                    e.checksum = read.whole.map(|w| w.to_vec()).unwrap_or_default();
                    let h = digest::file_entry(
                        e.size,
                        e.mode,
                        (e.mtime_sec, e.mtime_nsec),
                        &read.content,
                    );
                    with_tree(&mut |t| t.add(&e.path, h));
                } else {
                    with_tree(&mut |t| t.expect(&e.path));
                }
                progress.add(&progress.files_total, 1);
                progress.add(&progress.bytes_total, m.size);
                if m.size <= SMALL_FILE_MAX {
                    // A small file that would take the group past its bytes starts the next.
                    if group_bytes + m.size > GROUP_SMALL_BYTES {
                        flush(&mut group, &mut group_bytes)?;
                    }
                    group_bytes += m.size;
                } else {
                    // A large file ends its group so its blocks start flowing early.
                    group_bytes = GROUP_SMALL_BYTES;
                }
                group.push(e);
            }
            Kind::Special => {
                tracing::warn!(path = %entry.rel, "skipping special file (device, fifo or socket)");
            }
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

fn walk_error(root: &Path, e: tree::ScanError) -> ScanError {
    ScanError::Walk {
        root: root.to_owned(),
        source: e,
    }
}

/// Opens `name` in the directory `dir` for reading, never following a symlink at the leaf,
/// and only a regular file, without blocking on a FIFO ([`tree::confine::open_file_in`]): a
/// FIFO swapped in for a file after the walk saw it, or named by a receiver's Refetch, is
/// refused instead of holding the sender for ever.
pub fn open_in(dir: &DirFd, name: &[u8]) -> std::io::Result<File> {
    tree::confine::open_file_in(dir.as_fd(), name)
}

/// Largest listing sent for `--delete`; a bigger directory keeps its extraneous entries.
const MAX_LISTING_BYTES: usize = 12 * 1024 * 1024;

/// Walks the directories again (after the data) and sends each one's final metadata and, for
/// `--delete`, the names it holds (the tree layer's directories-only walk: fd-relative, no
/// symlink followed, nothing but directories stat-ed). Root first is fine: every DirDone deletes
/// then sets metadata. Subdirectories are visited in name order, so the DirDone frames travel in
/// path order (the digest's `dirs` list is hashed in that order on both ends).
pub fn walk_dirs(
    root: &Path,
    filter: &Arc<Filter>,
    with_names: bool,
    xattrs: bool,
    unreadable: OnUnreadable,
    tx: mpsc::Sender<pb::DirDone>,
) -> Result<(), ScanError> {
    let walk_err = |source| ScanError::Walk {
        root: root.to_owned(),
        source,
    };
    let walk = tree::DirWalk::open(
        root,
        filter.clone(),
        with_names.then_some(MAX_LISTING_BYTES),
    )
    .map_err(walk_err)?
    .exclude_at_root(STAGING_DIR.as_bytes());
    for visit in walk {
        let v = match visit {
            Ok(v) => v,
            // Left out by the scan already (named there): no metadata and, above all, no
            // listing for it, so a receiver with --delete leaves its copy alone.
            Err(e) if unreadable == OnUnreadable::Skip => match denial(e) {
                Ok((rel, _)) => {
                    tracing::debug!(path = %rel, "unreadable directory: no final metadata");
                    continue;
                }
                Err(e) => return Err(walk_err(e)),
            },
            Err(e) => return Err(walk_err(e)),
        };
        let rel = v.rel.as_ref().map_or(&[][..], RelPath::as_bytes);
        let mut dir = entry_of(rel.to_vec(), &v.meta, pb::EntryKind::Dir);
        // A directory's xattrs travel with its final metadata, here.
        if xattrs {
            dir.xattrs = match &v.parent {
                Some((parent, name)) => user_xattrs(&beneath(parent, name)),
                None => user_xattrs(root),
            };
        }
        tx.blocking_send(pb::DirDone {
            dir: Some(dir),
            complete_listing: v.complete,
            names: v.names,
        })
        .map_err(|_| ScanError::Closed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{Mode, OFlags};
    use std::os::unix::fs::OpenOptionsExt as _;

    /// The groups the walk of `root` sends.
    fn groups(root: &Path) -> Vec<Vec<pb::Entry>> {
        let (tx, mut rx) = mpsc::channel(10_000);
        let progress = Arc::new(Progress::new("t", "sender"));
        let tree = std::sync::Mutex::new(TreeBuilder::new());
        let collect = Collect {
            checksum: false,
            xattrs: false,
            unreadable: OnUnreadable::Fail,
        };
        scan(root, None, &Arc::default(), collect, tx, progress, &tree).expect("scan");
        let mut out = Vec::new();
        while let Ok(g) = rx.try_recv() {
            out.push(g);
        }
        out
    }

    #[test]
    fn a_groups_small_files_fit_one_pack() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // 300 KiB files: a group of 4 MiB would end with the one that crosses it.
        for i in 0..40 {
            std::fs::write(
                tmp.path().join(format!("f{i:02}")),
                vec![i as u8; 300 << 10],
            )
            .expect("write");
        }
        let groups = groups(tmp.path());
        let small = |g: &[pb::Entry]| -> u64 {
            g.iter()
                .filter(|e| e.kind == pb::EntryKind::File as i32 && e.size <= SMALL_FILE_MAX)
                .map(|e| e.size)
                .sum()
        };
        let sizes: Vec<u64> = groups.iter().map(|g| small(g)).collect();
        assert!(
            sizes.iter().all(|&s| s <= GROUP_SMALL_BYTES),
            "small bytes per group: {sizes:?}"
        );
        // Each full group holds as many as fit: 13 files of 300 KiB.
        assert_eq!(sizes[0], 13 * (300 << 10), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<u64>(), 40 * (300 << 10));
    }

    /// A FIFO where a regular file is to be read (swapped in after the walk saw a file, or named
    /// by a receiver) is refused at once: a blocking open would wait for a writer forever. On
    /// failure the test opens the FIFO's write end itself, so a blocked open returns and the
    /// test fails instead of hanging.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fifo = tmp.path().join("pipe");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        std::fs::write(tmp.path().join("file"), b"x").expect("write");
        let dir: DirFd = Arc::new(File::open(tmp.path()).expect("dir").into());
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(open_in(&d, b"pipe").map(|_| ()));
        });
        let got = match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(got) => got,
            Err(_) => {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo);
                panic!("opening a FIFO blocked");
            }
        };
        let err = got.expect_err("a FIFO was opened for reading");
        assert!(tree::confine::is_not_regular(&err), "{err}");
        assert!(err.to_string().contains("FIFO"), "{err}");
        // A regular file opens, in blocking mode again.
        let f = open_in(&dir, b"file").expect("a regular file");
        let flags = rustix::fs::fcntl_getfl(&f).expect("flags");
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
    }
}
