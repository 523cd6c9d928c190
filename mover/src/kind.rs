//! Where a failure lies: one [`ErrorKind`] per error, carried in the data protocol's Error frame
//! (`ferry.wire.v1.ErrorKind`), on the progress service (`ProgressUpdate.error_kind`) and in the
//! exit status of `send` and `receive`.
//!
//! Every error type of the network path maps to a kind here, in one place: [`SendError::kind`],
//! [`ReceiveError::kind`] and their parts.

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
}

/// Exit status of `send` and `receive` when entries were left out but the rest was transferred.
pub const EXIT_FAILED_ENTRIES: u8 = 1;
/// Exit status for usage errors and failures before a session starts (bad flags, unreadable
/// certificates, a source root that is not a directory).
pub const EXIT_OTHER: u8 = 2;

/// The exit status table, for `--help` (keep in step with docs/protocol.md).
pub const EXIT_STATUS_HELP: &str = "\
Exit status (receive: 10-15 only with --once):
  0   success (send: the transfer digests agree)
  1   finished, but some entries were left out (each named)
  2   usage error, or a failure before the session (flags, certificates, source root)
  10  peer: the other mover broke the protocol or refused the session
  11  source: the source could not be read
  12  destination: the destination could not be written (permission, disk full), or the
      transfer digests differ
  13  network: the connection failed, or either end was stopped (SIGTERM, SIGINT)
  14  timeout: a handshake, idle or write deadline passed
  15  internal: a bug in the mover
A failure is printed as `ferry-mover: error (<kind>): <message>`; a failure the receiver
reported is printed by the sender too, with the receiver's message.";

impl ErrorKind {
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::Peer,
        ErrorKind::Source,
        ErrorKind::Destination,
        ErrorKind::Network,
        ErrorKind::Timeout,
        ErrorKind::Internal,
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
}

impl crate::session::ScanError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            crate::session::ScanError::Closed => ErrorKind::Network,
            _ => ErrorKind::Source,
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

impl SendError {
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
            SendError::Read { .. } | SendError::Changed(_) | SendError::Digest(_) => {
                ErrorKind::Source
            }
            // The destination does not hold what the source holds.
            SendError::DigestMismatch { .. } => ErrorKind::Destination,
            SendError::NoProgress { .. } => ErrorKind::Timeout,
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
    pub fn kind(&self) -> ErrorKind {
        match self {
            ReceiveError::Framed(e) => e.kind(),
            ReceiveError::Handshake(e) => e.kind(),
            ReceiveError::Remote { kind, .. } => *kind,
            ReceiveError::Path(_)
            | ReceiveError::Protocol(_)
            | ReceiveError::Codec { .. }
            | ReceiveError::HashMismatch { .. } => ErrorKind::Peer,
            ReceiveError::NoProgress { .. } => ErrorKind::Timeout,
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
            | ReceiveError::Cas(_)
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
}

#[cfg(test)]
mod tests;
