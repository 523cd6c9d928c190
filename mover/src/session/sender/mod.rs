//! The sending end: walks the tree while streams carry data, pipelines Offers, reads Wants, and
//! stripes the blocks of large files over all streams.
//!
//! - [`state`]: the replies a stream is owed and what each asks for, without I/O;
//! - `effects`: reading, hashing and encoding the source;
//! - `driver`: the tasks of each stream and the session's end.

mod driver;
mod effects;
mod packs;
mod refetch;
mod reply;
pub mod shared;
pub mod start_gate;
pub use crate::protocol::sender as state;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Timeouts;
use super::compress::Compress;
use super::framed::FramedError;
use super::handshake::HandshakeError;
use super::scan::{OnUnreadable, ScanError};
use crate::digest::HashError;
use crate::tree::Filter;
use ferry_proto::kind::ErrorKind;

/// Keepalive after this much silence on a stream, well below any sane idle timeout.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// Bytes of small-file content per Batch frame.
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// A Batch frame's buffer: its content, and room for the file that crosses `BATCH_BYTES`.
const BATCH_BUFFER: usize = BATCH_BYTES + super::SMALL_FILE_MAX as usize + 1;
/// Blocks per BlockAnnounce (the receiver accepts up to 65 536). Small enough that the receiver
/// materialises one chunk while the sender hashes the next.
const ANNOUNCE_CHUNK: usize = 16;
/// Blocks per ResumeCheck (about 40 KiB of hashes; the receiver accepts up to 65 536).
const RESUME_CHUNK: usize = 1024;
/// A receiver's Busy frames hold the wait for one reply off for at most this many progress
/// timeouts (8 min at the default 120 s), for work that does not grow with the source (its
/// directory metadata, fsync with `--sync`, a burst of other sessions), plus the time to read
/// the whole source at [`BUSY_MIN_RATE`] bytes per second: see `reply::busy_allowance`.
const BUSY_TIMEOUTS: u32 = 4;
/// 16 MiB/s: slower than any disk or link a destination reads or fetches a source's worth of
/// data from while it is busy (1 TiB of source allows a busy receiver about 18 h per reply).
const BUSY_MIN_RATE: u64 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Framed(#[from] FramedError),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The receiver broke the protocol (seen here).
    #[error("receiver broke the protocol: {0}")]
    Peer(#[from] ReceiverViolation),
    /// The receiver failed and said why (its Error frame).
    #[error("receiver: {message}")]
    Remote {
        kind: ErrorKind,
        /// The receiver says a retry cannot help (it knows its destination).
        permanent: bool,
        message: String,
    },
    /// The sender was asked to stop (a signal).
    #[error("stopped: the sender is shutting down ({0}); a rerun resumes")]
    ShutDown(&'static str),
    /// This stream stopped because another one failed (never the reported error when the real
    /// one is known).
    #[error("stopped: another stream of the session failed")]
    Aborted,
    #[error(
        "stream {stream}: the receiver made no progress for {secs} s (no answer and no growing \
         work counter)"
    )]
    NoProgress { stream: u32, secs: u64 },
    #[error(
        "stream {stream}: the receiver answered nothing for {secs} s, only Busy frames; a \
         receiver's Busy frames hold this end's progress deadline off for at most {BUSY_TIMEOUTS} \
         progress timeouts plus the time to read the source at 16 MiB/s (a larger \
         --progress-timeout allows a receiver that is busy longer)"
    )]
    BusyTooLong { stream: u32, secs: u64 },
    #[error("failed to read source file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("source file {0} changed size during the transfer")]
    Changed(PathBuf),
    #[error(
        "the {files} small source files from {first} on changed since they were announced as \
         one pack (a rerun sends them as they are now), or the receiver named files that were \
         never announced together"
    )]
    PackChanged { first: PathBuf, files: usize },
    #[error(
        "the receiver asks again for block {index} of {path} as it was announced, and the source \
         no longer holds that: it changed since (a rerun sends it as it is now), or the receiver \
         named a block it was never announced"
    )]
    RefetchMismatch { path: PathBuf, index: u64 },
    #[error(transparent)]
    Digest(#[from] HashError),
    #[error(
        "transfer digests differ: sender {sender}, receiver {receiver}; the destination does not \
         hold what the source holds (a destination file changed without changing its size and \
         mtime, or the source changed during the transfer; rerun, with --checksum for the former)"
    )]
    DigestMismatch { sender: String, receiver: String },
    #[error(
        "the receiver sent no transfer digest (it is older than this sender), so the transfer cannot be verified"
    )]
    NoPeerDigest,
    #[error("the receiver sent a malformed transfer digest ({0} bytes)")]
    BadPeerDigest(usize),
    #[error("internal error: the transfer digest is incomplete")]
    DigestIncomplete,
    #[error(
        "the receiver does not support --exclude/--include with --delete (it would delete the \
         excluded entries); upgrade it or leave out --delete"
    )]
    FilterUnsupported,
    #[error("the receiver does not support --dry-run (it would write); upgrade it")]
    DryRunUnsupported,
    #[error("internal channel closed")]
    Channel,
    #[error("a blocking task failed")]
    Join(#[from] tokio::task::JoinError),
}

impl SendError {
    /// The receiver's Error frame: it failed and said why.
    pub(super) fn from_peer(e: ferry_proto::wire::v1::Error) -> Self {
        SendError::Remote {
            kind: ErrorKind::from_pb(e.kind),
            permanent: e.permanent,
            message: super::escape_text(&e.message),
        }
    }
}

/// Sender settings.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub root: PathBuf,
    pub transfer_id: String,
    pub compress: Compress,
    pub delete: bool,
    pub checksum: bool,
    pub sync: bool,
    pub bandwidth_limit: Option<u64>,
    pub timeouts: Timeouts,
    /// `--exclude` / `--include`: left out of the walk, and (sent to the receiver) kept from
    /// `--delete`.
    pub filter: Arc<Filter>,
    /// Ask the receiver what it would write and delete; send no data, change nothing.
    pub dry_run: bool,
    /// A source entry this mover may not read: fail at once, or leave it out and name it.
    pub on_unreadable: OnUnreadable,
    /// Ends the session, telling the receiver why.
    pub shutdown: crate::session::Shutdown,
    /// The blocks this session shares with the other sessions of the same sender (one source,
    /// several destinations), so that each is read once; None for a lone session.
    pub shared: Option<Arc<shared::SharedReads>>,
    /// A single file given as the source (a sub path naming a file), opened without following
    /// a symlink when the source was resolved: the session sends this handle's file under the
    /// last component of `root` and never looks that name up (a symlink swapped in for it
    /// since would otherwise be followed). None: `root` is looked up as given, a directory or
    /// a single file.
    pub source_file: Option<Arc<std::fs::File>>,
}

impl SenderConfig {
    /// The directory the session walks and, for a single-file source, the one name it sends
    /// from there: without a lookup when the file is held (`source_file`), else as
    /// [`crate::tree::split_source`] finds it.
    pub(crate) fn source_parts(&self) -> (PathBuf, Option<Vec<u8>>) {
        use std::os::unix::ffi::OsStrExt as _;
        match (&self.source_file, self.root.file_name()) {
            (Some(_), Some(name)) => {
                let dir = match self.root.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                    _ => PathBuf::from("."),
                };
                (dir, Some(name.as_bytes().to_vec()))
            }
            _ => crate::tree::split_source(&self.root),
        }
    }
}

pub use driver::{send_session, send_session_gated};
pub use state::ReceiverViolation;

#[cfg(test)]
mod tests {
    use super::driver::check_peer_digest;
    use super::effects::*;
    use super::*;
    use crate::digest;
    use crate::tree::DirFd;

    #[test]
    fn the_receivers_digest_must_match_ours() {
        let ours = [1u8; 32];
        assert!(check_peer_digest(&ours, &ours).is_ok());
        let err = check_peer_digest(&ours, &[2u8; 32]).expect_err("mismatch");
        assert!(matches!(err, SendError::DigestMismatch { .. }));
        let msg = err.to_string();
        assert!(msg.contains(&digest::hex(&ours)), "{msg}");
        assert!(msg.contains(&digest::hex(&[2u8; 32])), "{msg}");
        assert!(matches!(
            check_peer_digest(&ours, &[]),
            Err(SendError::NoPeerDigest)
        ));
        assert!(matches!(
            check_peer_digest(&ours, &[1u8; 31]),
            Err(SendError::BadPeerDigest(31))
        ));
    }

    #[test]
    fn small_reads_notice_a_size_change_either_way() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("f");
        std::fs::write(&path, b"0123456789").expect("write");
        let open = || std::fs::File::open(&path).expect("open");
        let mut data = b"head".to_vec();
        assert!(read_small_into(&open(), 10, &mut data).expect("read"));
        assert_eq!(data, b"head0123456789");
        for (size, why) in [
            (9, "file grew"),
            (11, "file shrank"),
            (0, "empty file grew"),
        ] {
            let mut data = b"head".to_vec();
            assert!(
                !read_small_into(&open(), size, &mut data).expect("read"),
                "{why}"
            );
            assert_eq!(data, b"head", "{why}: partial content kept");
        }
    }

    #[test]
    fn source_files_open_beneath_the_root_without_following_symlinks() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"s").expect("write");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        std::fs::write(tmp.path().join("a/b/f"), b"x").expect("write");
        std::fs::write(tmp.path().join("top"), b"t").expect("write");
        // A directory swapped for a symlink after the walk must not redirect the read.
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("a/link")).expect("symlink");
        std::os::unix::fs::symlink("b/f", tmp.path().join("a/leaf")).expect("symlink");
        let root: DirFd = Arc::new(std::fs::File::open(tmp.path()).expect("root").into());
        let mut dirs = SourceDirs::new(&root);
        let read = |f: std::fs::File| {
            let mut data = Vec::new();
            assert!(read_small_into(&f, 1, &mut data).expect("read"));
            data
        };
        assert_eq!(read(dirs.open(b"a/b/f").expect("open")), b"x");
        assert_eq!(read(dirs.open(b"top").expect("open")), b"t");
        assert_eq!(read(dirs.open(b"a/b/f").expect("open again")), b"x");
        assert!(
            dirs.open(b"a/link/secret").is_err(),
            "followed a symlinked directory"
        );
        assert!(
            dirs.open(b"a/leaf").is_err(),
            "followed a symlink at the leaf"
        );
        assert!(dirs.open(b"../x").is_err(), "left the root");
    }
}
