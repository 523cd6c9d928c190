//! A hostile receiver's error text reaches the sender's terminal with its control characters
//! escaped: no newline to forge extra lines, no ANSI escape to rewrite the screen.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_mover::net::{self, Role};
use ferry_mover::session::{FrameReader, FrameWriter};
use ferry_mover::wire::Message;
use ferry_proto::wire::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receivers_error_text_is_escaped_on_the_senders_terminal() {
    let pki = pki("peer-text");
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    let files = pki.files(Role::Receiver);
    let server = Arc::new(net::server_config(&files, &[Role::Sender]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let evil = "disk on fire\nferry-mover: transfer succeeded \u{1b}[2K\u{1b}[32mOK\u{1b}[0m\r";
    // A receiver that refuses every stream's Hello with that text.
    let fake = tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        loop {
            let (tcp, peer) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = net::accept_tls(tcp, peer, &acceptor, Duration::from_secs(5)).await
                else {
                    return;
                };
                let (r, w) = tokio::io::split(tls);
                let mut reader = FrameReader::new(r, 0, Duration::from_secs(5), Default::default());
                let mut writer = FrameWriter::new(w, 0, Duration::from_secs(5), Default::default());
                let _ = reader.expect().await;
                let error = Message::Error(pb::Error {
                    message: evil.into(),
                    kind: pb::ErrorKind::Destination as i32,
                    permanent: false,
                });
                let _ = writer.send(&error).await;
                let _ = writer.flush().await;
                writer.shutdown().await;
            });
        }
    });
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["send", "--connect", &addr.to_string(), "--root"])
            .arg(src.path())
            .args(pki.args("sender"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    fake.abort();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("disk on fire"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "raw escape on the terminal: {stderr:?}"
    );
    assert!(!stderr.contains('\r'), "raw carriage return: {stderr:?}");
    assert!(
        !stderr
            .lines()
            .any(|l| l.starts_with("ferry-mover: transfer succeeded")),
        "the peer forged a line: {stderr}"
    );
    assert!(
        stderr.contains(r"disk on fire\nferry-mover: transfer succeeded \u{1b}[2K"),
        "{stderr}"
    );
}
