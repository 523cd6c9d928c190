//! SIGTERM (what the kubelet sends a pod it deletes) to either end of a running transfer: that
//! end stops its session, tells the other why with the kind `network`, both exit with the
//! network status, and a rerun resumes what was written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const NETWORK_EXIT: i32 = 13;
const PEER_EXIT: i32 = 10;
const MIB: usize = 1 << 20;

/// Collects a child's stderr in the background (so it never blocks on a full pipe).
fn stderr_of(child: &mut Child) -> std::thread::JoinHandle<String> {
    let mut err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    })
}

fn spawn_sender(pki: &Pki, src: &Path, addr: &str, flags: &[&str]) -> Child {
    Command::new(BIN)
        .args([
            "send",
            "--connect",
            addr,
            "--streams",
            "1",
            "--compress",
            "none",
        ])
        .args(flags)
        .arg("--root")
        .arg(src)
        .args(pki.args("sender"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (up to a minute) until the receiver's staging holds at least one whole block.
fn wait_for_staged_block(dst: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let staged = files_under(&dst.join(".ferry-staging"))
            .iter()
            .any(|f| f.metadata().is_ok_and(|m| m.len() >= 4 * MIB as u64));
        if staged {
            return;
        }
        assert!(Instant::now() < deadline, "no block was staged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// The child's exit code, waiting at most `secs`.
fn exit_within(child: &mut Child, secs: u64) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().expect("exited, not killed");
        }
        assert!(Instant::now() < deadline, "still running after {secs} s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A 24 MiB file at 4 MB/s: about 6 s, long enough to be stopped in the middle.
fn slow_source(root: &Path) -> std::path::PathBuf {
    let src = root.join("src");
    write(&src.join("data.bin"), &random_bytes(24 * MIB, 7));
    src
}

fn resume_and_check(pki: &Pki, src: &Path, dst: &Path) {
    let (mut receiver, addr, _out) = spawn_receiver(pki, dst, &[]);
    let out = run_sender(pki, src, &addr, &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(receiver.wait().unwrap().success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json["resumed_bytes"].as_u64().unwrap() >= 4 * MIB as u64,
        "nothing resumed: {json}"
    );
    assert_same_tree(src, dst);
}

#[derive(Clone, Copy, PartialEq)]
enum End {
    Sender,
    Receiver,
}

/// Starts a 6 s transfer, sends SIGTERM to `stopped` once a block is staged, checks both ends
/// exit with the network status within 15 s, and returns (sender's, receiver's) stderr; then a
/// rerun resumes.
fn stop_mid_transfer(transfer: &str, stopped: End) -> (String, String) {
    let pki = pki(transfer);
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (slow_source(tmp.path()), tmp.path().join("dst"));
    let (mut receiver, addr, _out) = spawn_receiver(&pki, &dst, &[]);
    let receiver_err = stderr_of(&mut receiver);
    let mut sender = spawn_sender(&pki, &src, &addr, &["--bandwidth-limit", "4M"]);
    let sender_err = stderr_of(&mut sender);
    wait_for_staged_block(&dst);

    let (first, second) = match stopped {
        End::Receiver => (&mut receiver, &mut sender),
        End::Sender => (&mut sender, &mut receiver),
    };
    sigterm(first);
    assert_eq!(exit_within(first, 15), NETWORK_EXIT);
    // A receiver reports the sender's reason as the peer's, in its own terms; a sender takes
    // the receiver's reason as it is.
    let second_exit = match stopped {
        End::Receiver => NETWORK_EXIT,
        End::Sender => PEER_EXIT,
    };
    assert_eq!(exit_within(second, 15), second_exit);
    let errs = (sender_err.join().unwrap(), receiver_err.join().unwrap());
    resume_and_check(&pki, &src, &dst);
    errs
}

#[test]
fn a_receiver_told_to_stop_tells_the_sender_and_a_rerun_resumes() {
    let (s, r) = stop_mid_transfer("shutdown-r", End::Receiver);
    assert!(
        r.contains("the receiver is shutting down (SIGTERM)"),
        "receiver: {r}"
    );
    assert!(
        s.contains("error (network): receiver: stopped: the receiver is shutting down (SIGTERM)"),
        "sender: {s}"
    );
}

#[test]
fn a_sender_told_to_stop_tells_the_receiver_and_a_rerun_resumes() {
    let (s, r) = stop_mid_transfer("shutdown-s", End::Sender);
    assert!(
        s.contains("error (network): stopped: the sender is shutting down (SIGTERM)"),
        "sender: {s}"
    );
    assert!(
        r.contains(
            "error (peer): sender (network): stopped: the sender is shutting down (SIGTERM)"
        ),
        "receiver: {r}"
    );
}
