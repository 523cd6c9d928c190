//! How the mover's errors map to the error-kind vocabulary of [`ferry_proto::kind`]: one
//! [`ErrorKind`] and one permanence flag per error, in one place: [`SendError::kind`] /
//! [`SendError::permanent`], [`ReceiveError::kind`] / [`ReceiveError::permanent`] and their parts.

pub use ferry_proto::kind::*;

use crate::session::staging::StagingError;
use crate::session::{FramedError, HandshakeError, ListenError, ReceiveError, SendError};
use crate::tree::DestError;

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
