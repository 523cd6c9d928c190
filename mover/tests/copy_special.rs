//! FIFOs (and sockets, devices) are skipped with a warning naming them; the rest is copied.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn fifo_is_skipped_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("file"), b"x");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("the-fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(src.join("the-socket")).unwrap();

    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("specials_skipped"), 2);
    assert_eq!(run.n("files"), 1);
    assert!(
        run.stderr.contains("the-fifo"),
        "warning must name the FIFO: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("the-socket"),
        "warning must name the socket: {}",
        run.stderr
    );
    assert!(!dst.join("the-fifo").exists() && dst.join("file").is_file());
}
