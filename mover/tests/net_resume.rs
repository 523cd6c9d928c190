//! Resume after `kill -9` of either end, through the real binary: the rerun completes the tree
//! and sends only what was not written before (checked with wire_bytes and resumed_bytes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn spawn_receiver(pki: &Pki, dst: &Path) -> (Child, String, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(BIN)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--root",
        ])
        .arg(dst)
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, out) = bound_addr(&mut c);
    (c, addr, out)
}

fn spawn_sender(pki: &Pki, src: &Path, addr: &str, limit: Option<u64>) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "send",
        "--connect",
        addr,
        "--streams",
        "2",
        "--compress",
        "none",
        "--json",
        "--root",
    ])
    .arg(src)
    .args(pki.args("sender"))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(l) = limit {
        cmd.args(["--bandwidth-limit", &l.to_string()]);
    }
    cmd.spawn().unwrap()
}

fn staged_bytes(dst: &Path) -> u64 {
    let dir = dst.join(".ferry-staging");
    let mut total = 0;
    for e in files_under(&dir) {
        if e.extension().is_some_and(|x| x == "manifest") {
            total += std::fs::metadata(&e).unwrap().len().saturating_sub(64) / 40 * 4 * 1024 * 1024;
        }
    }
    total
}

/// Waits until at least `bytes` of verified blocks are recorded in staging.
fn wait_for_progress(dst: &Path, bytes: u64, deadline: Duration) {
    let start = Instant::now();
    while staged_bytes(dst) < bytes {
        assert!(start.elapsed() < deadline, "transfer made no progress");
        // Poll interval of a condition wait with a deadline, not synchronization.
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rerun(pki: &Pki, src: &Path, dst: &Path) -> serde_json::Value {
    let (mut recv, addr, _out) = spawn_receiver(pki, dst);
    let send = spawn_sender(pki, src, &addr, None)
        .wait_with_output()
        .unwrap();
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    assert!(recv.wait().unwrap().success());
    serde_json::from_slice(&send.stdout).unwrap()
}

fn setup() -> (Pki, tempfile::TempDir, u64) {
    let pki = pki("resume");
    let src = tempfile::tempdir().unwrap();
    write(
        &src.path().join("big1.bin"),
        &random_bytes(48 * 1024 * 1024, 7),
    );
    write(&src.path().join("small/a.txt"), b"small file");
    let total = tree_bytes(src.path());
    (pki, src, total)
}

#[test]
fn resume_after_receiver_is_killed() {
    let (pki, src, total) = setup();
    let dst = tempfile::tempdir().unwrap();
    let (mut recv, addr, _out) = spawn_receiver(&pki, dst.path());
    let mut send = spawn_sender(&pki, src.path(), &addr, Some(12_000_000));
    wait_for_progress(dst.path(), 16 * 1024 * 1024, Duration::from_secs(30));
    recv.kill().unwrap(); // SIGKILL
    recv.wait().unwrap();
    assert!(
        !send.wait().unwrap().success(),
        "sender must fail when the receiver dies"
    );
    assert!(
        !dst.path().join("big1.bin").exists(),
        "no unverified file at a final path"
    );

    let s = rerun(&pki, src.path(), dst.path());
    assert_same_tree(src.path(), dst.path());
    let wire = s["wire_bytes"].as_u64().unwrap();
    let resumed = s["resumed_bytes"].as_u64().unwrap();
    assert!(resumed >= 16 * 1024 * 1024, "resumed only {resumed}");
    assert!(
        wire + resumed / 2 < total,
        "second run sent {wire} wire bytes for a {total}-byte tree"
    );
}

#[test]
fn resume_after_sender_is_killed() {
    let (pki, src, total) = setup();
    let dst = tempfile::tempdir().unwrap();
    let (mut recv, addr, _out) = spawn_receiver(&pki, dst.path());
    let mut send = spawn_sender(&pki, src.path(), &addr, Some(12_000_000));
    wait_for_progress(dst.path(), 16 * 1024 * 1024, Duration::from_secs(30));
    send.kill().unwrap();
    send.wait().unwrap();
    let st = recv.wait().unwrap();
    assert!(!st.success(), "receiver must report the broken session");
    assert!(!dst.path().join("big1.bin").exists());

    let s = rerun(&pki, src.path(), dst.path());
    assert_same_tree(src.path(), dst.path());
    let wire = s["wire_bytes"].as_u64().unwrap();
    assert!(s["resumed_bytes"].as_u64().unwrap() >= 16 * 1024 * 1024);
    assert!(
        wire < total - 12 * 1024 * 1024,
        "second run sent {wire} of {total}"
    );
    assert!(
        !dst.path().join(".ferry-staging").exists(),
        "staging cleaned up"
    );
}
