use std::io;

use super::*;
use crate::digest::HashError;
use crate::net::TransportError;
use crate::session::failure_message;
use crate::tree::NonEmptyDir;
use crate::wire::FrameType;

fn os(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn dest_io(code: i32) -> DestError {
    DestError::Io {
        op: "create directory",
        path: "d/sub".into(),
        source: os(code),
    }
}

#[test]
fn exit_codes_are_distinct_and_documented() {
    let codes: Vec<u8> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
    assert_eq!(codes, [10, 11, 12, 13, 14, 15, 16]);
    for k in ErrorKind::ALL {
        assert!(
            EXIT_STATUS_HELP.contains(&format!("{}  {}:", k.exit_code(), k.as_str())),
            "{k} missing from --help"
        );
        assert_eq!(ErrorKind::from_pb(k.to_pb() as i32), k, "proto round trip");
        for permanent in [false, true] {
            let status = exit_status(k, permanent);
            assert_eq!(
                from_exit_status(i32::from(status)),
                Some((k, permanent)),
                "{k} {permanent}"
            );
            assert_eq!(status >= 20, permanent, "{k}: {status}");
        }
    }
    assert_eq!(exit_status(ErrorKind::Store, true), 26);
    assert!(!codes.contains(&EXIT_FAILED_ENTRIES) && !codes.contains(&EXIT_OTHER));
    // Not session failures: success, left-out entries, usage, signals (128 + n).
    for other in [0, 1, 2, 9, 17, 19, 27, 137, 143, -1] {
        assert_eq!(from_exit_status(other), None, "{other}");
    }
    // A mover older than the field sends no kind: read as the peer's.
    assert_eq!(ErrorKind::from_pb(0), ErrorKind::Peer);
    assert_eq!(ErrorKind::from_pb(99), ErrorKind::Peer);
}

#[test]
fn framed_and_handshake_errors() {
    let k = |e: FramedError| e.kind();
    assert_eq!(
        k(FramedError::IdleTimeout { stream: 0, secs: 1 }),
        ErrorKind::Timeout
    );
    assert_eq!(
        k(FramedError::WriteTimeout { stream: 0, secs: 1 }),
        ErrorKind::Timeout
    );
    assert_eq!(
        k(FramedError::Closed {
            stream: 0,
            mid_frame: false
        }),
        ErrorKind::Network
    );
    assert_eq!(
        k(FramedError::Write {
            stream: 0,
            source: io::Error::from(io::ErrorKind::BrokenPipe)
        }),
        ErrorKind::Network
    );
    assert_eq!(
        k(FramedError::Wire {
            stream: 0,
            source: crate::wire::WireError::UnknownType(0x7f)
        }),
        ErrorKind::Peer
    );
    assert_eq!(
        HandshakeError::Transfer {
            peer: "a".into(),
            ours: "b".into()
        }
        .kind(),
        ErrorKind::Peer
    );
    // The receiver's refusal keeps the kind it gave.
    assert_eq!(
        HandshakeError::Refused {
            kind: ErrorKind::Destination,
            permanent: false,
            message: "x".into()
        }
        .kind(),
        ErrorKind::Destination
    );
}

#[test]
fn sender_errors() {
    assert_eq!(
        SendError::Read {
            path: "/src/f".into(),
            source: os(libc::EACCES)
        }
        .kind(),
        ErrorKind::Source
    );
    assert_eq!(
        SendError::Changed("/src/f".into()).kind(),
        ErrorKind::Source
    );
    assert_eq!(
        SendError::Digest(HashError::new("/src/f", os(libc::EIO))).kind(),
        ErrorKind::Source
    );
    let remote = SendError::Remote {
        kind: ErrorKind::Destination,
        permanent: true,
        message: "failed to create directory d/sub: Permission denied (os error 13)".into(),
    };
    assert_eq!(remote.kind(), ErrorKind::Destination);
    // The sender adopts the receiver's judgement of its own destination.
    assert!(remote.permanent());
    assert!(remote.to_string().contains("d/sub"), "{remote}");
    assert_eq!(
        SendError::DigestMismatch {
            sender: "a".into(),
            receiver: "b".into()
        }
        .kind(),
        ErrorKind::Destination
    );
    assert_eq!(SendError::NoPeerDigest.kind(), ErrorKind::Peer);
    assert_eq!(
        SendError::Peer(crate::session::ReceiverViolation::Unexpected {
            stream: 0,
            kind: FrameType::Welcome,
            expected: "Want"
        })
        .kind(),
        ErrorKind::Peer
    );
    assert_eq!(
        SendError::Framed(FramedError::IdleTimeout {
            stream: 1,
            secs: 60
        })
        .kind(),
        ErrorKind::Timeout
    );
    assert_eq!(SendError::Channel.kind(), ErrorKind::Internal);
    assert_eq!(SendError::Aborted.kind(), ErrorKind::Internal);
    assert_eq!(SendError::DigestIncomplete.kind(), ErrorKind::Internal);
}

#[test]
fn receiver_errors() {
    assert_eq!(
        ReceiveError::Dest(dest_io(libc::EACCES)).kind(),
        ErrorKind::Destination
    );
    assert_eq!(
        ReceiveError::Dest(DestError::NonEmptyDir(NonEmptyDir {
            path: "d".into(),
            with: "a file"
        }))
        .kind(),
        ErrorKind::Destination
    );
    assert_eq!(
        ReceiveError::Write {
            path: "f".into(),
            source: os(libc::EIO)
        }
        .kind(),
        ErrorKind::Destination
    );
    assert_eq!(
        ReceiveError::Staging(StagingError::Dest(dest_io(libc::EROFS))).kind(),
        ErrorKind::Destination
    );
    assert_eq!(
        ReceiveError::Protocol(crate::session::receiver::SenderViolation::Duplicate(
            "a".into()
        ))
        .kind(),
        ErrorKind::Peer
    );
    assert_eq!(
        ReceiveError::HashMismatch {
            path: "f".into(),
            index: 0
        }
        .kind(),
        ErrorKind::Peer
    );
    let bad_path = crate::tree::peer_path::PeerPath::parse(b"../x").expect_err("refused");
    assert_eq!(ReceiveError::Path(bad_path).kind(), ErrorKind::Peer);
    assert_eq!(
        ReceiveError::Framed(FramedError::Closed {
            stream: 2,
            mid_frame: true
        })
        .kind(),
        ErrorKind::Network
    );
    // A poisoned lock is the receiver's own bug, not the peer's doing.
    assert_eq!(ReceiveError::Poisoned.kind(), ErrorKind::Internal);
    assert_eq!(
        ReceiveError::Internal("a batch writer thread panicked").kind(),
        ErrorKind::Internal
    );
    // A sender's Error frame never decides this receiver's kind or permanence.
    let remote = ReceiveError::Remote {
        kind: ErrorKind::Destination,
        message: "disk full".into(),
    };
    assert_eq!(remote.kind(), ErrorKind::Peer);
    assert!(!remote.permanent());
    assert!(remote.to_string().contains("disk full"), "{remote}");
    let refused = ReceiveError::Handshake(HandshakeError::Refused {
        kind: ErrorKind::Destination,
        permanent: true,
        message: "x".into(),
    });
    assert_eq!(refused.failure(), Failure::new(ErrorKind::Peer, false));
    assert_eq!(
        ReceiveError::Cas(crate::cas::CasError::BlockTooLarge { len: 9, limit: 1 }).kind(),
        ErrorKind::Store
    );
    assert_eq!(
        ListenError::Session(ReceiveError::Poisoned).kind(),
        ErrorKind::Internal
    );
    assert_eq!(
        ListenError::Accept(os(libc::EMFILE)).kind(),
        ErrorKind::Network
    );
}

#[test]
fn a_full_destination_says_where_the_resume_state_is() {
    for e in [
        ReceiveError::Dest(dest_io(libc::ENOSPC)),
        ReceiveError::Write {
            path: "big.bin".into(),
            source: os(libc::ENOSPC),
        },
        ReceiveError::Staging(StagingError::Io {
            what: "size part file",
            path: "big.bin".into(),
            source: os(libc::EDQUOT),
        }),
    ] {
        assert_eq!(e.kind(), ErrorKind::Destination);
        assert!(is_no_space(&e));
        let msg = failure_message(&e, "t-1");
        assert!(msg.contains(".ferry-staging/t-1/"), "{msg}");
        assert!(msg.contains("out of space"), "{msg}");
    }
    let e = ReceiveError::Dest(dest_io(libc::EACCES));
    assert!(!is_no_space(&e));
    let msg = failure_message(&e, "t-1");
    assert_eq!(
        msg,
        "failed to create directory d/sub: Permission denied (os error 13)"
    );
}

#[test]
fn transport_errors() {
    let addr = "127.0.0.1:1".parse().expect("addr");
    assert_eq!(
        TransportError::Connect {
            addr,
            source: io::Error::from(io::ErrorKind::ConnectionRefused)
        }
        .kind(),
        ErrorKind::Network
    );
    assert_eq!(
        TransportError::Timeout { addr, secs: 10 }.kind(),
        ErrorKind::Timeout
    );
    let refused = TransportError::Handshake {
        addr,
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate),
        ),
    };
    assert_eq!(refused.kind(), ErrorKind::Peer);
    assert_eq!(
        peer_alert(&refused),
        Some(rustls::AlertDescription::BadCertificate)
    );
    let reset = TransportError::Handshake {
        addr,
        source: io::Error::from(io::ErrorKind::ConnectionReset),
    };
    assert_eq!(reset.kind(), ErrorKind::Network);
    assert_eq!(peer_alert(&reset), None);
}

#[test]
fn permanence_is_whether_a_retry_can_help_not_where_the_fault_lies() {
    let permanent = |e: &ReceiveError| e.permanent();
    for code in [
        libc::EACCES,
        libc::EPERM,
        libc::ENOSPC,
        libc::EDQUOT,
        libc::EROFS,
    ] {
        assert!(permanent(&ReceiveError::Dest(dest_io(code))), "{code}");
        assert!(
            permanent(&ReceiveError::Write {
                path: "f".into(),
                source: os(code)
            }),
            "{code}"
        );
    }
    assert!(!permanent(&ReceiveError::Dest(dest_io(libc::EIO))));
    assert!(!permanent(&ReceiveError::HashMismatch {
        path: "f".into(),
        index: 0
    }));
    assert!(!permanent(&ReceiveError::Framed(
        FramedError::IdleTimeout { stream: 0, secs: 1 }
    )));
    let read = |code| SendError::Read {
        path: "/src/f".into(),
        source: os(code),
    };
    assert!(read(libc::EACCES).permanent());
    assert!(!read(libc::EIO).permanent());
    assert!(!SendError::Changed("/src/f".into()).permanent());
    let mismatch = SendError::DigestMismatch {
        sender: "a".into(),
        receiver: "b".into(),
    };
    assert_eq!(
        mismatch.failure(),
        Failure::new(ErrorKind::Destination, false)
    );
    assert!(
        HandshakeError::Transfer {
            peer: "a".into(),
            ours: "b".into()
        }
        .permanent()
    );
    let addr = "127.0.0.1:1".parse().expect("addr");
    let refused = TransportError::Handshake {
        addr,
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate),
        ),
    };
    assert!(refused.permanent());
    assert!(
        !TransportError::Connect {
            addr,
            source: io::Error::from(io::ErrorKind::ConnectionRefused)
        }
        .permanent()
    );
    assert_eq!(Failure::new(ErrorKind::Source, true).exit_status(), 21);
    assert_eq!(
        Failure::new(ErrorKind::Source, true).to_string(),
        "source, permanent"
    );
}
