//! What one hostile Offer can cost a receiver: declared sizes are bounded and never allocated
//! per block, and memory and staging files per session stay bounded whatever the peer declares.
//! The peer is a real sender certificate speaking the codec directly to the `receive` binary,
//! whose peak RSS is read from /proc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use ferry_mover::wire::{Message, caps};
use ferry_proto::wire::v1 as pb;

struct Receiver {
    child: Child,
    addr: std::net::SocketAddr,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A long-running receiver (it serves session after session).
fn spawn_receiver(pki: &Pki, dst: &Path) -> Receiver {
    let mut child = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--json", "--root"])
        .arg(dst)
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, _) = bound_addr(&mut child);
    Receiver {
        child,
        addr: addr.parse().unwrap(),
    }
}

/// `VmHWM` (peak resident set) and `VmRSS` of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let field = |name| proc_status_kib(pid, name).unwrap();
    (field("VmHWM"), field("VmRSS"))
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().unwrap().is_dir() {
                n += count_files(&e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}

/// Connects as the sender, sends one Offer of `entries`, and returns what the receiver answered
/// (a Want, or its Error) once it closed the stream or answered.
async fn offer_to(pki: &Pki, addr: std::net::SocketAddr, entries: Vec<pb::Entry>) -> Message {
    let (mut reader, mut writer, _) = greet(
        connect_as_sender(pki, addr).await,
        Duration::from_secs(20),
        hello(&pki.transfer, caps::SUPPORTED, rand_id(), 0, 1),
    )
    .await;
    let offer = Message::Offer(pb::Offer {
        offer_id: 1,
        entries,
    });
    writer.send(&offer).await.unwrap();
    writer.flush().await.unwrap();
    loop {
        match reader.expect().await {
            Ok(Message::Keepalive) => {}
            Ok(m) => return m,
            Err(e) => panic!("receiver closed without an answer: {e}"),
        }
    }
}

fn rand_id() -> Vec<u8> {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    t.to_le_bytes().to_vec()
}

fn file(path: String, size: u64) -> pb::Entry {
    pb::Entry {
        path: path.into(),
        kind: pb::EntryKind::File as i32,
        mode: 0o644,
        mtime_sec: 1_700_000_000,
        size,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_offer_with_absurd_sizes_ends_in_a_clear_error_and_the_receiver_lives() {
    let pki = pki("absurd-size");
    let dst = tempfile::tempdir().unwrap();
    let mut recv = spawn_receiver(&pki, dst.path());
    for size in [u64::MAX, 1u64 << 63] {
        match offer_to(&pki, recv.addr, vec![file("huge".into(), size)]).await {
            Message::Error(e) => assert!(e.message.contains("declared size"), "{}", e.message),
            other => panic!("size {size}: expected an error, got {other:?}"),
        }
    }
    // 2^62 is a valid file offset: accepted (without allocating per block), nothing written.
    match offer_to(&pki, recv.addr, vec![file("huge".into(), 1 << 62)]).await {
        Message::Want(w) => assert!(!w.entries[0].skip),
        other => panic!("expected a Want, got {other:?}"),
    }
    assert!(
        recv.child.try_wait().unwrap().is_none(),
        "the receiver is still serving"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_staging_files_per_session_are_bounded_whatever_the_offer_declares() {
    let pki = pki("offer-bomb");
    let dst = tempfile::tempdir().unwrap();
    let recv = spawn_receiver(&pki, dst.path());
    let pid = recv.child.id();
    // Measured once it printed its address: bound and idle, its baseline.
    let (_, before) = memory_kib(pid);
    // About 30 KB on the wire: 1024 files of 15 TiB each.
    let entries: Vec<_> = (0..1024)
        .map(|i| file(format!("d/f{i:04}"), 15 << 40))
        .collect();
    let answer = offer_to(&pki, recv.addr, entries).await;
    let Message::Error(e) = answer else {
        panic!("expected an error, got {answer:?}");
    };
    assert!(e.message.contains("large files in flight"), "{}", e.message);
    let (peak, _) = memory_kib(pid);
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "receiver RSS before {} MiB, peak under the hostile Offer {} MiB",
        before / 1024,
        peak / 1024
    );
    assert!(
        grown_mib < 64,
        "peak RSS grew by {grown_mib} MiB under one hostile Offer"
    );
    let staging = count_files(&dst.path().join(".ferry-staging"));
    assert!(
        staging <= 2 * 160,
        "{staging} staging files for one session"
    );
    let apparent: u64 = walk_sizes(&dst.path().join(".ferry-staging"));
    assert!(
        apparent < 1 << 30,
        "staging files have {apparent} bytes of apparent size"
    );
}

fn walk_sizes(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let md = e.metadata().unwrap();
            if md.is_dir() {
                n += walk_sizes(&e.path());
            } else {
                n += md.len();
            }
        }
    }
    n
}
