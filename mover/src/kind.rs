//! Where a failure lies and whether a retry can help: one [`ErrorKind`] and one permanence flag
//! per error, carried in the data protocol's Error frame (`ferry.wire.v1.ErrorKind`,
//! `Error.permanent`), on the progress service (`ProgressUpdate.error_kind`, `.permanent`) and in
//! the exit status of `send` and `receive` ([`exit_status`]).
//!
//! Every error type of the network path maps to a kind and a permanence here, in one place:
//! [`SendError::kind`] / [`SendError::permanent`], [`ReceiveError::kind`] /
//! [`ReceiveError::permanent`] and their parts. The operator retries by permanence, not by kind:
//! a full disk (destination) and a missing source are permanent, a digest mismatch
//! (destination) and a file that changed during the copy (source) are not.

use std::fmt;

use ferry_proto::wire::v1 as pb;

use crate::net::TransportError;
use crate::session::staging::StagingError;
use crate::session::{FramedError, HandshakeError, ListenError, ReceiveError, SendError};
use crate::tree::DestError;

/// Where the fault behind a failed session lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The other mover broke the protocol or refused the session: an invalid path, frame or
    /// block, another transfer, an identity it does not accept.
    Peer,
    /// The source tree could not be read.
    Source,
    /// The destination could not be written: permission denied, disk full, a file system error.
    Destination,
    /// The connection failed: refused, reset or closed.
    Network,
    /// A deadline passed: handshake, idle or write timeout.
    Timeout,
    /// A bug or an impossible state in the mover (a poisoned lock, a failed task).
    Internal,
    /// The node's block store failed: the `--cas` directory is unusable or a block is corrupt.
    Store,
}

/// A failed session as the operator sees it: where the fault lies and whether a retry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Failure {
    pub kind: ErrorKind,
    /// A retry cannot help (see [`is_permanent_errno`] and each error's `permanent()`).
    pub permanent: bool,
}

impl Failure {
    pub fn new(kind: ErrorKind, permanent: bool) -> Failure {
        Failure { kind, permanent }
    }
    pub fn exit_status(self) -> u8 {
        exit_status(self.kind, self.permanent)
    }
}

impl Failure {
    /// What an Error frame claims (the claim only: see [`ReceiveError::permanent`]).
    pub fn from_pb(e: &pb::Error) -> Failure {
        Failure::new(ErrorKind::from_pb(e.kind), e.permanent)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.permanent {
            write!(f, "{}, permanent", self.kind)
        } else {
            write!(f, "{}", self.kind)
        }
    }
}

/// How far the exit status of a fault a retry cannot help lies above the kind's own.
const PERMANENT_OFFSET: u8 = 10;

/// Exit status of `send`/`receive` for a failed session: the kind's code (10-16) when a retry may
/// help, 10 more (20-26) when it cannot.
pub fn exit_status(kind: ErrorKind, permanent: bool) -> u8 {
    if permanent {
        kind.exit_code() + PERMANENT_OFFSET
    } else {
        kind.exit_code()
    }
}

/// The kind and permanence an exit status stands for; `None` for 0, 1, 2, signals and anything
/// else not in the table.
pub fn from_exit_status(code: i32) -> Option<(ErrorKind, bool)> {
    ErrorKind::ALL.into_iter().find_map(|k| {
        let base = i32::from(k.exit_code());
        if code == base {
            Some((k, false))
        } else if code == base + i32::from(PERMANENT_OFFSET) {
            Some((k, true))
        } else {
            None
        }
    })
}

/// OS errors a retry cannot fix: permission denied, a full disk or quota, a read-only file
/// system. They stay until someone changes the tree, the grant or the volume.
pub fn is_permanent_errno(code: i32) -> bool {
    matches!(
        code,
        libc::EACCES | libc::EPERM | libc::ENOSPC | libc::EDQUOT | libc::EROFS
    )
}

/// A permanent OS error ([`is_permanent_errno`]) somewhere in `e`'s chain.
pub fn has_permanent_os_error(e: &(dyn std::error::Error + 'static)) -> bool {
    os_error(e).is_some_and(is_permanent_errno)
}

/// Exit status of `send` and `receive` when entries were left out but the rest was transferred.
pub const EXIT_FAILED_ENTRIES: u8 = 1;
/// Exit status for usage errors and failures before a session starts (bad flags, unreadable
/// certificates, a source root that is not a directory).
pub const EXIT_OTHER: u8 = 2;

/// The exit status table, for `--help` (keep in step with docs/protocol.md).
pub const EXIT_STATUS_HELP: &str = "\
Exit status (receive: 10-26 only with --once):
  0   success (send: the transfer digests agree)
  1   finished, but some entries were left out (each named)
  2   usage error, or a failure before the session (flags, certificates, --sub-path)
  10  peer: the other mover broke the protocol or refused the session
  11  source: the source could not be read
  12  destination: the destination could not be written, or the transfer digests differ
  13  network: the connection failed, or either end was stopped (SIGTERM, SIGINT)
  14  timeout: a handshake, idle, write or progress deadline passed
  15  internal: a bug in the mover
  16  store: the node's block store (--cas) failed
10-16: a retry may help. 20-26 (the same kind + 10): a retry cannot help until someone
changes something: permission denied, a missing source or --sub-path, a symlink on the
--sub-path, a full disk or quota, a read-only file system, a refused identity.
A failure is printed as `ferry-mover: error (<kind>[, permanent]): <message>`; a failure the
receiver reported is printed by the sender too, with the receiver's message.";

impl ErrorKind {
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Peer,
        ErrorKind::Source,
        ErrorKind::Destination,
        ErrorKind::Network,
        ErrorKind::Timeout,
        ErrorKind::Internal,
        ErrorKind::Store,
    ];

    /// Exit status of `send`/`receive` for a session that failed with this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Peer => 10,
            ErrorKind::Source => 11,
            ErrorKind::Destination => 12,
            ErrorKind::Network => 13,
            ErrorKind::Timeout => 14,
            ErrorKind::Internal => 15,
            ErrorKind::Store => 16,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Peer => "peer",
            ErrorKind::Source => "source",
            ErrorKind::Destination => "destination",
            ErrorKind::Network => "network",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
            ErrorKind::Store => "store",
        }
    }

    pub fn to_pb(self) -> pb::ErrorKind {
        match self {
            ErrorKind::Peer => pb::ErrorKind::Peer,
            ErrorKind::Source => pb::ErrorKind::Source,
            ErrorKind::Destination => pb::ErrorKind::Destination,
            ErrorKind::Network => pb::ErrorKind::Network,
            ErrorKind::Timeout => pb::ErrorKind::Timeout,
            ErrorKind::Internal => pb::ErrorKind::Internal,
            ErrorKind::Store => pb::ErrorKind::Store,
        }
    }

    /// The kind in an Error frame; unspecified (an older mover) or unknown reads as `Peer`.
    pub fn from_pb(v: i32) -> ErrorKind {
        match pb::ErrorKind::try_from(v) {
            Ok(pb::ErrorKind::Source) => ErrorKind::Source,
            Ok(pb::ErrorKind::Destination) => ErrorKind::Destination,
            Ok(pb::ErrorKind::Network) => ErrorKind::Network,
            Ok(pb::ErrorKind::Timeout) => ErrorKind::Timeout,
            Ok(pb::ErrorKind::Internal) => ErrorKind::Internal,
            Ok(pb::ErrorKind::Store) => ErrorKind::Store,
            Ok(pb::ErrorKind::Peer | pb::ErrorKind::Unspecified) | Err(_) => ErrorKind::Peer,
        }
    }

    /// A failure of the connection itself: the peer may have said why before it closed.
    pub fn is_transport(self) -> bool {
        matches!(self, ErrorKind::Network | ErrorKind::Timeout)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The OS error somewhere in `e`'s chain, if any.
pub fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(code) = io.raw_os_error()
        {
            return Some(code);
        }
        if let Some(errno) = err.downcast_ref::<rustix::io::Errno>() {
            return Some(errno.raw_os_error());
        }
        cur = err.source();
    }
    None
}

/// The destination file system is full (or the quota is used up).
pub fn is_no_space(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(os_error(e), Some(libc::ENOSPC | libc::EDQUOT))
}

/// A TLS alert the peer sent during the handshake (it refused our certificate), if that is
/// what ended `e`.
pub fn peer_alert(e: &(dyn std::error::Error + 'static)) -> Option<rustls::AlertDescription> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::AlertReceived(alert)) = tls {
            return Some(*alert);
        }
        cur = err.source();
    }
    None
}

/// A TLS-level refusal (certificate chain, identity, alert) somewhere in `e`'s chain.
fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if tls.is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

impl FramedError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FramedError::IdleTimeout { .. } | FramedError::WriteTimeout { .. } => {
                ErrorKind::Timeout
            }
            FramedError::Closed { .. } => ErrorKind::Network,
            FramedError::Read { source, .. } | FramedError::Write { source, .. } => {
                if source.kind() == std::io::ErrorKind::TimedOut {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Network
                }
            }
            FramedError::Wire { .. } => ErrorKind::Peer,
        }
    }

    /// A broken or silent connection, or a bad frame: a rerun may go through.
    pub fn permanent(&self) -> bool {
        false
    }
}

impl HandshakeError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            HandshakeError::Framed(e) => e.kind(),
            HandshakeError::Refused { kind, .. } => *kind,
            HandshakeError::Unexpected { .. }
            | HandshakeError::Version { .. }
            | HandshakeError::Transfer { .. }
            | HandshakeError::Streams { .. }
            | HandshakeError::BlockSize(_)
            | HandshakeError::SessionId(_) => ErrorKind::Peer,
        }
    }

    /// Another transfer or protocol version stays refused; the peer's refusal is as permanent
    /// as it said.
    pub fn permanent(&self) -> bool {
        match self {
            HandshakeError::Framed(e) => e.permanent(),
            HandshakeError::Refused { permanent, .. } => *permanent,
            HandshakeError::Version { .. } | HandshakeError::Transfer { .. } => true,
            HandshakeError::Unexpected { .. }
            | HandshakeError::Streams { .. }
            | HandshakeError::BlockSize(_)
            | HandshakeError::SessionId(_) => false,
        }
    }
}

impl TransportError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            TransportError::Connect { .. } => ErrorKind::Network,
            TransportError::Timeout { .. } => ErrorKind::Timeout,
            // A refused certificate or identity is the other side's; a dropped connection is
            // the network's.
            TransportError::Handshake { .. } if is_tls_refusal(self) => ErrorKind::Peer,
            TransportError::Handshake { .. } => ErrorKind::Network,
        }
    }

    /// A refused certificate or identity stays refused; a failed connection may come up.
    pub fn permanent(&self) -> bool {
        matches!(self, TransportError::Handshake { .. }) && is_tls_refusal(self)
    }
}

impl crate::session::ScanError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            crate::session::ScanError::Closed => ErrorKind::Network,
            _ => ErrorKind::Source,
        }
    }

    /// An unreadable or missing source root stays so; other read errors may pass.
    pub fn permanent(&self) -> bool {
        match self {
            crate::session::ScanError::Closed => false,
            crate::session::ScanError::Unreadable { .. } => true,
            e => has_permanent_os_error(e),
        }
    }
}

fn dest_kind(e: &DestError) -> ErrorKind {
    match e {
        // Peer paths were validated on arrival; one the engine refuses came from the peer.
        DestError::Path(_) => ErrorKind::Peer,
        DestError::Io { .. } | DestError::Meta { .. } | DestError::NonEmptyDir(_) => {
            ErrorKind::Destination
        }
    }
}

fn dest_permanent(e: &DestError) -> bool {
    match e {
        DestError::Path(_) => false,
        e => has_permanent_os_error(e),
    }
}

impl SendError {
    pub fn failure(&self) -> Failure {
        Failure::new(self.kind(), self.permanent())
    }

    /// Retryable: a file that changed during the copy, a digest mismatch, the network, a
    /// timeout, an internal fault. Permanent: the receiver's permanent fault, a source it is
    /// denied to read.
    pub fn permanent(&self) -> bool {
        match self {
            SendError::Framed(e) => e.permanent(),
            SendError::Handshake(e) => e.permanent(),
            SendError::Scan(e) => e.permanent(),
            SendError::Remote { permanent, .. } => *permanent,
            SendError::Read { .. } | SendError::Digest(_) => has_permanent_os_error(self),
            SendError::Peer(_)
            | SendError::NoPeerDigest
            | SendError::BadPeerDigest(_)
            | SendError::Changed(_)
            | SendError::PackChanged { .. }
            | SendError::RefetchMismatch { .. }
            | SendError::DigestMismatch { .. }
            | SendError::NoProgress { .. }
            | SendError::BusyTooLong { .. }
            | SendError::ShutDown(_)
            | SendError::DigestIncomplete
            | SendError::Channel
            | SendError::Join(_)
            | SendError::Aborted => false,
            // An older receiver stays older until someone upgrades it.
            SendError::FilterUnsupported | SendError::DryRunUnsupported => true,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            SendError::Framed(e) => e.kind(),
            SendError::Handshake(e) => e.kind(),
            SendError::Scan(e) => e.kind(),
            SendError::Remote { kind, .. } => *kind,
            SendError::Peer(_)
            | SendError::NoPeerDigest
            | SendError::BadPeerDigest(_)
            | SendError::FilterUnsupported
            | SendError::DryRunUnsupported => ErrorKind::Peer,
            SendError::Read { .. }
            | SendError::Changed(_)
            | SendError::PackChanged { .. }
            | SendError::RefetchMismatch { .. }
            | SendError::Digest(_) => ErrorKind::Source,
            // The destination does not hold what the source holds.
            SendError::DigestMismatch { .. } => ErrorKind::Destination,
            SendError::NoProgress { .. } | SendError::BusyTooLong { .. } => ErrorKind::Timeout,
            // The peer may retry; a rerun resumes.
            SendError::ShutDown(_) => ErrorKind::Network,
            SendError::DigestIncomplete
            | SendError::Channel
            | SendError::Join(_)
            | SendError::Aborted => ErrorKind::Internal,
        }
    }
}

impl ReceiveError {
    pub fn failure(&self) -> Failure {
        Failure::new(self.kind(), self.permanent())
    }

    /// Permanent: the destination denies writing, is full or read-only. The sender's own
    /// failure (its Error frame) is never adopted: a sender must not make this receiver report
    /// a permanent fault.
    pub fn permanent(&self) -> bool {
        match self {
            ReceiveError::Framed(e) => e.permanent(),
            ReceiveError::Handshake(HandshakeError::Refused { .. }) => false,
            ReceiveError::Handshake(e) => e.permanent(),
            ReceiveError::Dest(e) | ReceiveError::Publish { source: e, .. } => dest_permanent(e),
            ReceiveError::Staging(StagingError::Dest(e)) => dest_permanent(e),
            ReceiveError::Staging(StagingError::Io { .. })
            | ReceiveError::Commit { .. }
            | ReceiveError::Write { .. }
            | ReceiveError::Scratch { .. }
            | ReceiveError::Digest(_) => has_permanent_os_error(self),
            _ => false,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            ReceiveError::Framed(e) => e.kind(),
            // The sender's words are kept in the message; its kind says nothing about this end.
            ReceiveError::Handshake(HandshakeError::Refused { .. }) => ErrorKind::Peer,
            ReceiveError::Handshake(e) => e.kind(),
            ReceiveError::Remote { .. } => ErrorKind::Peer,
            ReceiveError::Cas(_) => ErrorKind::Store,
            ReceiveError::Path(_)
            | ReceiveError::Protocol(_)
            | ReceiveError::Codec { .. }
            | ReceiveError::HashMismatch { .. }
            | ReceiveError::PackHashMismatch { .. } => ErrorKind::Peer,
            ReceiveError::NoProgress { .. } | ReceiveError::PeerBlocks(_) => ErrorKind::Timeout,
            // The peer may retry; a rerun resumes.
            ReceiveError::ShutDown(_) => ErrorKind::Network,
            ReceiveError::Dest(e) | ReceiveError::Publish { source: e, .. } => dest_kind(e),
            ReceiveError::Staging(StagingError::Dest(e)) => dest_kind(e),
            ReceiveError::Staging(StagingError::Busy(_)) => ErrorKind::Peer,
            ReceiveError::Staging(StagingError::Io { .. })
            | ReceiveError::Staging(StagingError::Incomplete(_))
            | ReceiveError::Commit { .. }
            | ReceiveError::Write { .. }
            | ReceiveError::Scratch { .. }
            | ReceiveError::Digest(_)
            | ReceiveError::ReadBack(_) => ErrorKind::Destination,
            ReceiveError::Poisoned
            | ReceiveError::Internal(_)
            | ReceiveError::Join(_)
            | ReceiveError::Aborted => ErrorKind::Internal,
        }
    }
}

impl ListenError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ListenError::Accept(_) => ErrorKind::Network,
            ListenError::Session(e) => e.kind(),
            ListenError::ShutDown(_) => ErrorKind::Network,
        }
    }

    pub fn failure(&self) -> Failure {
        match self {
            ListenError::Session(e) => e.failure(),
            e => Failure::new(e.kind(), false),
        }
    }
}

#[cfg(test)]
mod tests;
