//! The receiving end: validates every name and every block, writes beneath the destination root
//! only, publishes each file by one rename after all of its content verified, and keeps resume
//! state in the staging directory.
//!
//! - [`state`]: the protocol rules, without I/O (unit-tested and fuzzed on their own);
//! - `effects`: the filesystem work those rules ask for;
//! - `driver`: the async loop over a session's streams.

mod block_store;
mod driver;
mod effects;
mod packs;
mod refetch;
pub use crate::protocol::receiver as state;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};

use super::compress::CodecError;
use super::framed::{FrameReader, FrameWriter, FramedError};
use super::handshake::{HandshakeError, accept_hello};
use super::staging::StagingError;
use super::{MAX_STREAMS, Timeouts, error_chain};
use crate::cas::pop::Nonce;
use crate::cas::{CasError, CasStore};
use crate::digest::HashError;
use crate::tree::CommitError;
use crate::tree::peer_dest::DestError;
use crate::tree::peer_path::PeerPathError;
use crate::wire::caps;
use ferry_proto::kind::{ErrorKind, is_no_space};

pub use driver::receive_session;
pub use state::SenderViolation;

/// Failure messages the receiver keeps for its Summary (all are counted and logged).
pub const MAX_REPORTED_FAILURES: usize = 8;
/// Extended attribute bytes (names and values) one entry may carry; more is a protocol error.
pub const MAX_XATTR_BYTES: usize = super::scan::MAX_XATTR_BYTES;
/// Extended attribute bytes held for files in flight (only with `--xattrs`); more is a protocol
/// error (an honest sender's in-flight files stay far below it).
const MAX_XATTR_BYTES_IN_FLIGHT: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error(transparent)]
    Framed(#[from] FramedError),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Path(#[from] PeerPathError),
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    /// The sender broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(#[from] SenderViolation),
    #[error("block {index} of {path}: {source}")]
    Codec {
        path: String,
        index: u64,
        #[source]
        source: CodecError,
    },
    #[error("{path}: block {index} does not match its BLAKE3 hash; nothing was written")]
    HashMismatch { path: String, index: u64 },
    #[error(
        "the pack of {files} small files from {path} on does not match its BLAKE3 hash; nothing \
         was written"
    )]
    PackHashMismatch { path: String, files: usize },
    #[error("failed to publish {path}")]
    Commit {
        path: String,
        #[source]
        source: CommitError,
    },
    /// A large file could not be moved from the staging directory to its path.
    #[error("failed to publish {path}")]
    Publish {
        path: String,
        #[source]
        source: DestError,
    },
    #[error("failed to write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to create the dry run's scratch directory {path}")]
    Scratch {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The sender failed and said why (its Error frame).
    /// Reported as a peer failure in this receiver's terms: `kind` is only the sender's claim,
    /// shown in the text.
    #[error("sender ({kind}): {message}")]
    Remote { kind: ErrorKind, message: String },
    #[error(
        "the sender made no progress for {secs} s (no data moved; Busy frames, \
         keepalives and trickled bytes do not count)"
    )]
    NoProgress { secs: u64 },
    #[error("a blocking filesystem task failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("block store")]
    Cas(#[from] CasError),
    #[error("failed to compute the transfer digest (its sort files are kept in .ferry-staging/)")]
    Digest(#[source] std::io::Error),
    #[error(transparent)]
    ReadBack(#[from] HashError),
    /// A fan-out peer did not hand over blocks this receiver left to it.
    #[error("{0}")]
    PeerBlocks(String),
    #[error("internal error: a lock was poisoned by a panic")]
    Poisoned,
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The receiver was asked to stop (a signal).
    #[error("stopped: the receiver is shutting down ({0}); a rerun resumes")]
    ShutDown(&'static str),
    /// This stream stopped because another one failed (never the reported error when the real
    /// one is known).
    #[error("stopped: another stream of the session failed")]
    Aborted,
}

/// The message a receiver reports for `e` (logs, Error frame, progress): the whole chain, and
/// for a full destination where the resume state stays.
pub fn failure_message(e: &ReceiveError, transfer_id: &str) -> String {
    let mut msg = error_chain(e);
    if is_no_space(e) {
        msg.push_str(&format!(
            "; the destination is out of space. The resume state of this transfer was kept in \
             .ferry-staging/{transfer_id}/ and may occupy space: a rerun resumes from it, \
             `ferry-mover clean-staging --transfer-prefix {transfer_id}` removes it"
        ));
    }
    msg
}

/// Which of two failures of one session to report: the sender's own reason first, then a
/// failure seen here, then a broken connection, and never "another stream failed".
impl ReceiveError {
    /// The sender's Error frame: it failed and said why.
    fn from_peer(e: pb::Error) -> Self {
        ReceiveError::Remote {
            kind: ErrorKind::from_pb(e.kind),
            message: super::escape_text(&e.message),
        }
    }
}

fn more_telling(a: ReceiveError, b: ReceiveError) -> ReceiveError {
    let rank = |e: &ReceiveError| match e {
        ReceiveError::Remote { .. } => 0,
        ReceiveError::Aborted => 3,
        e if e.kind().is_transport() => 2,
        _ => 1,
    };
    if rank(&b) < rank(&a) { b } else { a }
}

/// Receiver settings.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub root: PathBuf,
    pub transfer_id: String,
    pub timeouts: Timeouts,
    /// fsync each file before its rename (durable commits).
    pub sync: bool,
    /// The node's block store: with it the receiver offers dedup, materialises announced blocks
    /// it holds (after proof of possession) and adds verified full blocks from the wire.
    pub cas: Option<Arc<CasStore>>,
    /// The node's block store service, used when there is no `cas`: the same dedup, with the
    /// store owned by the node service instead of this process.
    pub block_service: Option<crate::node::client::NodeStoreClient>,
    /// Fan-out: the node services of every destination of the Transfer (with `block_service`).
    pub swarm: Option<Arc<crate::node::swarm::SwarmPeers>>,
    /// This receiver's own identity (from its certificate), named in the log when a peer
    /// refuses the handshake.
    pub identity: Option<crate::net::Identity>,
    /// Metadata beyond permission bits and times that this receiver applies.
    pub keep: Keep,
    /// Stops accepting and ends running sessions, each telling its sender why.
    pub shutdown: super::Shutdown,
}

/// What a receiver keeps of the metadata every sender sends beyond permission bits and times.
/// Each is off by default: the receiver decides, never the sender, so a hostile sender cannot
/// plant a setuid file, a foreign owner or attributes unless the receiver asked for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// Owner and group (applied only when the receiver runs as root).
    pub owner: bool,
    /// setuid, setgid and sticky bits.
    pub special_bits: bool,
    /// `user.*` extended attributes.
    pub xattrs: bool,
}

/// One stream past Hello/Welcome.
pub struct Accepted<S> {
    pub reader: FrameReader<ReadHalf<S>>,
    pub writer: FrameWriter<WriteHalf<S>>,
    pub hello: pb::Hello,
    pub caps: u64,
    /// The proof-of-possession nonce sent in this stream's Welcome (dedup only).
    pub dedup_nonce: Option<Nonce>,
}

/// Reads Hello on a fresh stream (under the handshake timeout) and answers Welcome.
pub async fn accept_stream<S>(
    stream: S,
    cfg: &ReceiverConfig,
    wire_bytes: Arc<AtomicU64>,
    index_hint: u32,
) -> Result<Accepted<S>, ReceiveError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let mut reader = FrameReader::new(r, index_hint, cfg.timeouts.handshake, wire_bytes);
    let mut writer = FrameWriter::new(w, index_hint, cfg.timeouts.handshake, Default::default());
    let mut supported = caps::SUPPORTED | caps::MODES;
    if cfg.cas.is_some() || cfg.block_service.is_some() {
        supported |= caps::DEDUP;
    }
    if cfg.keep.xattrs {
        supported |= caps::XATTRS;
    }
    if cfg.swarm.is_some() {
        supported |= caps::REFETCH | caps::TAILS | caps::PACKS;
    }
    let fut = accept_hello(
        &mut reader,
        &mut writer,
        &cfg.transfer_id,
        MAX_STREAMS,
        supported,
    );
    let (hello, caps, dedup_nonce) = match tokio::time::timeout(cfg.timeouts.handshake, fut).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(FramedError::IdleTimeout {
                stream: index_hint,
                secs: cfg.timeouts.handshake.as_secs(),
            }
            .into());
        }
    };
    let idx = hello.stream_index;
    reader.set_stream(idx, cfg.timeouts.idle);
    writer.set_stream(idx, cfg.timeouts.idle);
    Ok(Accepted {
        reader,
        writer,
        hello,
        caps,
        dedup_nonce,
    })
}
