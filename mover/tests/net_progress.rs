//! The progress service of the real binaries (`--progress-listen`), as the operator will use it:
//! an operator certificate watches both ends of a running transfer over mutual TLS and sees the
//! counters move and the final outcome, which the movers stay up to deliver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_proto::progress::v1::{Phase, ProgressUpdate};

/// Reads stderr lines until the "progress service on ADDR" line; the rest is drained in the
/// background so the child never blocks on a full pipe.
fn progress_addr(child: &mut Child) -> SocketAddr {
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no progress address");
        if let Some(addr) = line.trim().strip_prefix("progress service on ") {
            let addr = addr.parse().unwrap();
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = err.read_to_end(&mut sink);
            });
            return addr;
        }
    }
}

fn mover(pki: &Pki, role: &str, args: &[&str], root: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .args(["--json", "--progress-listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .args(pki.args(role))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn check(updates: &[ProgressUpdate], role: &str, files: u64, bytes: u64) {
    let last = updates.last().expect("no update");
    assert_eq!(last.phase, Phase::Succeeded as i32, "{role}: {last:?}");
    assert_eq!(
        (last.error_kind, last.last_error.as_str()),
        (0, ""),
        "{role}"
    );
    assert_eq!(last.role, role);
    assert_eq!(last.transfer_id, "watched");
    assert_eq!((last.files_done, last.bytes_done), (files, bytes), "{role}");
    assert!(last.wire_bytes >= bytes, "{role}: wire {}", last.wire_bytes);
    let moving = updates
        .iter()
        .filter(|u| u.phase == Phase::Transferring as i32 && u.bytes_done > 0)
        .count();
    assert!(
        moving >= 3,
        "{role}: only {moving} updates while data flowed"
    );
    for pair in updates.windows(2) {
        assert!(
            pair[1].bytes_done >= pair[0].bytes_done,
            "{role}: counter went back"
        );
        assert!(pair[1].elapsed_seconds >= pair[0].elapsed_seconds);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_watches_both_binaries_to_the_outcome() {
    let pki = Arc::new(pki("watched"));
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    for i in 0..3 {
        write(&src.join(format!("d/big{i}")), &random_bytes(3 << 20, i));
    }
    for i in 0..50 {
        write(
            &src.join(format!("small/{i}")),
            &random_bytes(1000 + i, 100 + i as u64),
        );
    }
    let (files, bytes) = (53, tree_bytes(&src));

    let mut receiver = mover(
        &pki,
        "receiver",
        &["receive", "--listen", "127.0.0.1:0", "--once"],
        &dst,
    );
    let mut out = BufReader::new(receiver.stdout.take().unwrap());
    let mut data_addr = String::new();
    out.read_line(&mut data_addr).unwrap();
    let recv_progress = progress_addr(&mut receiver);
    let recv_watch = tokio::spawn({
        let pki = pki.clone();
        async move { watch_progress(&pki, recv_progress).await }
    });

    // About 4 s, so a watcher that connects late under load still sees data flow.
    let limit = (bytes / 4).to_string();
    let mut sender = mover(
        &pki,
        "sender",
        &[
            "send",
            "--connect",
            data_addr.trim(),
            "--streams",
            "2",
            "--compress",
            "none",
            "--bandwidth-limit",
            &limit,
        ],
        &src,
    );
    let send_progress = progress_addr(&mut sender);
    let send_updates = watch_progress(&pki, send_progress).await;
    let recv_updates = tokio::time::timeout(Duration::from_secs(60), recv_watch)
        .await
        .expect("receiver watch never ended")
        .unwrap();

    assert!(sender.wait().unwrap().success());
    assert!(receiver.wait().unwrap().success());
    check(&recv_updates, "receiver", files, bytes);
    check(&send_updates, "sender", files, bytes);
    // The sender's bar follows what left behind the bandwidth limit, not what it read ahead:
    // at a quarter of the data per second it cannot be full in under ~4 s (3 s leaves room for
    // the limiter's burst and socket buffers; load only makes it later).
    let full_at = send_updates
        .iter()
        .find(|u| u.bytes_done >= bytes)
        .map(|u| u.elapsed_seconds)
        .unwrap();
    assert!(full_at >= 3.0, "sender bar full after {full_at:.2} s");
    // The receiver counts what it wrote: its done counter never ran ahead of the total.
    assert!(recv_updates.iter().all(|u| u.bytes_done <= bytes));
    // Both final updates carry the transfer digest, and they agree; none before the end.
    let (s, r) = (send_updates.last().unwrap(), recv_updates.last().unwrap());
    assert_eq!(s.digest.len(), 64, "sender digest {:?}", s.digest);
    assert_eq!(s.digest, r.digest);
    assert!(
        recv_updates
            .iter()
            .filter(|u| u.phase == Phase::Transferring as i32)
            .all(|u| u.digest.is_empty())
    );
    assert_same_tree(&src, &dst);
}
