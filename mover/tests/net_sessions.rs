//! A receiver that serves many sessions (no `--once`) reports each session's own figures: of three
//! identical sends the first moves 16 files and the others skip 16, instead of counters that grow
//! from one session to the next.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use ferry_mover::net::{self, Role};
use ferry_mover::progress::Progress;
use ferry_mover::session::{self, ReceiverConfig};

#[tokio::test]
async fn each_session_of_a_long_running_receiver_reports_its_own_counts() {
    let pki = pki("sessions");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    for i in 0..16u64 {
        write(
            &src.path().join(format!("f{i}")),
            &random_bytes(10_000 + i as usize, i),
        );
    }
    let files = pki.files(Role::Receiver);
    let server = Arc::new(net::server_config(&files, &[Role::Sender]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = ReceiverConfig {
        root: dst.path().to_owned(),
        transfer_id: pki.transfer.clone(),
        timeouts: fast_timeouts(),
        sync: false,
        cas: None,
        block_service: None,
        swarm: None,
        identity: Some(files.identity.clone()),
        keep: Default::default(),
        shutdown: ferry_mover::session::Shutdown::never(),
    };
    let progress = Arc::new(Progress::new(&pki.transfer, "receiver"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let receiver_progress = progress.clone();
    let receiver = tokio::spawn(async move {
        session::serve(
            listener,
            tokio_rustls::TlsAcceptor::from(server),
            cfg,
            false,
            receiver_progress,
            |r| {
                let _ = tx.send(match r {
                    Ok(s) => Ok(s.clone()),
                    Err(e) => Err(e.to_string()),
                });
            },
        )
        .await
    });

    let total: u64 = (0..16u64).map(|i| 10_000 + i).sum();
    let mut wire = Vec::new();
    for round in 0..3 {
        let sent = send(&pki, src.path(), addr, &SendOpts::default())
            .await
            .unwrap();
        let received = rx.recv().await.unwrap().unwrap();
        let (files, bytes, skipped) = if round == 0 {
            (16, total, 0)
        } else {
            (0, 0, 16)
        };
        assert_eq!(
            (received.files, received.bytes, received.skipped),
            (files, bytes, skipped),
            "round {round}: {received:?}"
        );
        assert_eq!(
            (sent.files, sent.skipped),
            (files, skipped),
            "round {round}: {sent:?}"
        );
        wire.push(received.wire_bytes);
    }
    // The first session carried the data; the skipped ones only the file list.
    assert!(wire[0] > total, "{wire:?}");
    assert!(wire[1] < total / 4 && wire[2] < total / 4, "{wire:?}");
    // The receiver's own counters (its bar and progress service) saw all three sessions.
    let all = progress.snapshot();
    assert_eq!((all.files_done, all.skipped), (16, 32), "{all:?}");
    assert!(
        all.wire_bytes >= wire.iter().sum::<u64>(),
        "{all:?} {wire:?}"
    );
    receiver.abort();
}
