//! Where a failure lies and whether a retry can help: one [`ErrorKind`] and one permanence flag
//! per error, carried in the data protocol's Error frame (`ferry.wire.v1.ErrorKind`,
//! `Error.permanent`), on the progress service (`ProgressUpdate.error_kind`, `.permanent`) and in
//! the exit status of `send` and `receive` ([`exit_status`]).
//!
//! Every error type of the mover's network path maps to a kind and a permanence in one place,
//! the mover's `kind` module. The operator retries by permanence, not by kind:
//! a full disk (destination) and a missing source are permanent, a digest mismatch
//! (destination) and a file that changed during the copy (source) are not.

use std::fmt;

use crate::wire::v1 as pb;

use crate::net::TransportError;

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
    /// What an Error frame claims (the claim only: a receiver re-judges it).
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

/// The rustls errors in `e`'s chain (directly, or inside an I/O error), outermost first.
fn tls_errors<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a rustls::Error> {
    std::iter::successors(Some(e), |err| err.source()).filter_map(|err| {
        err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })
}

/// A TLS alert the peer sent during the handshake (it refused our certificate), if that is
/// what ended `e`.
pub fn peer_alert(e: &(dyn std::error::Error + 'static)) -> Option<rustls::AlertDescription> {
    tls_errors(e).find_map(|tls| match tls {
        rustls::Error::AlertReceived(alert) => Some(*alert),
        _ => None,
    })
}

/// A TLS-level refusal (certificate chain, identity, alert) somewhere in `e`'s chain.
pub fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    tls_errors(e).next().is_some()
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
