//! The receiver keeps accepting honest senders under pressure from unauthenticated peers: idle
//! connections that never send a ClientHello, and running out of descriptors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// 200 idle TCP connections hold nothing an honest sender needs: its transfer starts at once,
/// not after the idle ones' handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_do_not_starve_an_honest_handshake() {
    let pki = pki("slowloris");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    let (addr, recv) = start_receiver(&pki, dst.path()).await;
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // The receiver accepted them all (they hold handshake slots, not the kernel's queue).
    let port = addr.port();
    let accepted =
        tokio::task::spawn_blocking(move || wait_until_accepted(port, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(accepted, "the receiver did not accept the idle connections");
    let started = Instant::now();
    let sent = send(&pki, src.path(), addr, &SendOpts::default()).await;
    let took = started.elapsed();
    eprintln!("honest sender under 200 idle connections: done in {took:?}");
    sent.expect("send");
    recv.await.unwrap().expect("receive");
    // fast_timeouts(): the idle connections would hold their slots for 3 s.
    assert!(
        took < Duration::from_secs(2),
        "the honest sender waited {took:?}"
    );
    drop(idle);
}

/// The receiver runs out of descriptors (EMFILE on accept) and serves the next sender once
/// descriptors are free again.
#[test]
fn the_listener_survives_running_out_of_descriptors() {
    let pki = pki("emfile");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    write(&src.path().join("d/b.txt"), b"world");
    // A small descriptor limit for the receiver alone.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"ulimit -n 40 && exec "$0" "$@""#)
        .arg(BIN)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--root",
        ])
        .arg(dst.path())
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut recv = cmd.spawn().unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let log = stderr_lines(&mut recv);

    // More connections than descriptors: accept fails with EMFILE for some of them.
    let flood: Vec<TcpStream> = (0..80)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    let mut seen = String::new();
    assert!(
        wait_for_line(&log, Duration::from_secs(10), &mut seen, |l| l
            .contains("accept failed")),
        "the receiver never ran out of descriptors: {seen}"
    );
    drop(flood);
    // Descriptors are free again once it accepted (and closed) what the flood left queued.
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        wait_until_accepted(port, Duration::from_secs(20)),
        "the receiver stopped accepting"
    );

    let send = Command::new(BIN)
        .args(["send", "--connect", &addr, "--json", "--root"])
        .arg(src.path())
        .args(pki.args("sender"))
        .output()
        .unwrap();
    assert!(
        send.status.success(),
        "sender failed after the receiver ran out of descriptors: {}",
        String::from_utf8_lossy(&send.stderr)
    );
    let status = recv.wait().unwrap();
    seen.extend(log.iter().map(|l| l + "\n"));
    assert!(status.success(), "{seen}");
    assert_same_tree(src.path(), dst.path());
}

/// One stream of a two-stream session arrives and the other never does: the receiver drops the
/// half-assembled session after twice its handshake timeout, without waiting for another
/// connection to arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_assembled_session_is_dropped_after_its_deadline() {
    use ferry_mover::wire::caps;

    let pki = pki("half-session");
    let dst = tempfile::tempdir().unwrap();
    let (addr, _recv) = start_receiver(&pki, dst.path()).await;
    let (mut reader, _writer, _) = greet(
        connect_as_sender(&pki, addr).await,
        Duration::from_secs(30),
        hello(&pki.transfer, caps::SUPPORTED, vec![3; 16], 0, 2),
    )
    .await;
    let started = Instant::now();
    // fast_timeouts(): handshake 3 s, so the receiver lets go after about 6 s.
    let end = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match reader.next().await {
                Ok(Some(_)) => {}
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    let took = started.elapsed();
    assert!(
        end.is_ok(),
        "the half-assembled session was kept for {took:?}"
    );
    assert!(took < Duration::from_secs(9), "dropped after {took:?}");
}

/// An authenticated sender that holds its session open (keepalives only) does not hold the
/// receiver: an honest session runs beside it and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_session_does_not_block_an_honest_one() {
    use ferry_mover::wire::{Message, caps};
    use ferry_proto::wire::v1 as pb;

    let pki = pki("stalled-beside");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a.txt"), b"hello");
    write(
        &src.path().join("big.bin"),
        &random_bytes(9 * 1024 * 1024, 4),
    );
    let (addr, recv) = start_receiver(&pki, dst.path()).await;
    let (mut reader, mut writer, _) = greet(
        connect_as_sender(&pki, addr).await,
        Duration::from_secs(60),
        hello(&pki.transfer, caps::SUPPORTED, vec![4; 16], 0, 1),
    )
    .await;
    // The stalled session runs before the honest one starts: the receiver answers its Offer
    // (the file's data never comes).
    let offer = Message::Offer(pb::Offer {
        offer_id: 1,
        entries: vec![pb::Entry {
            path: b"stalled.txt".to_vec(),
            kind: pb::EntryKind::File as i32,
            mode: 0o644,
            size: 5,
            mtime_sec: 1_600_000_000,
            ..Default::default()
        }],
    });
    writer.send(&offer).await.unwrap();
    writer.flush().await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), reader.expect())
            .await
            .expect("the stalled session answers its Offer")
            .unwrap()
        {
            Message::Want(_) => break,
            Message::Keepalive | Message::Busy(_) => {}
            other => panic!("expected a Want, got {other:?}"),
        }
    }
    let stall = tokio::spawn(async move {
        loop {
            if writer.send(&Message::Keepalive).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            // The stalling peer's pace (keepalives inside the idle timeout), not
            // synchronization.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let started = Instant::now();
    let sent = tokio::time::timeout(
        Duration::from_secs(20),
        send(&pki, src.path(), addr, &SendOpts::default()),
    )
    .await
    .expect("the honest send waited behind the stalled session");
    sent.expect("send");
    let received = recv.await.unwrap().expect("the honest session's summary");
    assert_eq!(received.files, 2);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_same_tree(src.path(), dst.path());
    stall.abort();
    drop(reader);
}
