//! Failures travel between the binaries with their kind: the receiver reports why it fails in
//! an Error frame on every stream before it closes, and the sender prints that reason (not a
//! broken pipe) and exits with the kind's status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// A receive command that cannot write into `dst/d`: as root (which ignores permission bits)
/// the receiver runs as `nobody`, owner of `dst` but not of the root-owned `dst/d`; otherwise
/// `dst/d` is made read-only. Never skipped (see [`unprivileged_mover`]).
fn receiver_that_cannot_write_d(pki: &Pki, base: &Path, dst: &Path) -> Command {
    std::fs::create_dir_all(dst.join("d")).unwrap();
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(dst, Some(NOBODY), Some(NOBODY)).unwrap();
    } else {
        chmod(&dst.join("d"), 0o555);
    }
    unprivileged_mover(pki, &[base])
}

#[test]
fn an_unwritable_destination_fails_the_sender_with_the_receivers_reason() {
    let pki = pki("errors-1");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    // The receiver can create `d/big.bin` in its staging directory but not rename it into `d/`:
    // it fails only once that file's blocks are in, while the other large files keep every
    // stream busy writing, so the sender's writes fail too; it must still report the
    // receiver's reason.
    for i in 0..2 {
        write(
            &src.join(format!("a{i}/big.bin")),
            &random_bytes(24 << 20, i),
        );
    }
    write(&src.join("d/big.bin"), &random_bytes(24 << 20, 9));
    std::fs::create_dir_all(&dst).unwrap();
    let mut recv = receiver_that_cannot_write_d(&pki, base.path(), &dst);
    let mut recv = recv
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--json",
            "--root",
        ])
        .arg(&dst)
        .args(pki.args("receiver"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let mut recv_err = recv.stderr.take().unwrap();
    let recv_log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = recv_err.read_to_string(&mut s);
        s
    });
    let send = Command::new(BIN)
        .args([
            "send",
            "--connect",
            addr.trim(),
            "--streams",
            "4",
            "--compress",
            "none",
            "--root",
        ])
        .arg(&src)
        .args(pki.args("sender"))
        .output()
        .unwrap();
    let status = recv.wait().unwrap();
    let recv_log = recv_log.join().unwrap();
    let stderr = String::from_utf8_lossy(&send.stderr);
    assert_eq!(
        send.status.code(),
        Some(22),
        "sender: {stderr}\nreceiver: {recv_log}"
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ferry-mover: error"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        line.starts_with("ferry-mover: error (destination, permanent): "),
        "{line}"
    );
    assert!(line.contains("d/big.bin"), "names the path: {line}");
    assert!(line.contains("Permission denied"), "{line}");
    for noise in [
        "close_notify",
        "Broken pipe",
        "Connection reset",
        "closed by peer",
    ] {
        assert!(!line.contains(noise), "{line}");
    }
    // The receiver fails the same way and says so.
    assert_eq!(status.code(), Some(22), "receiver: {recv_log}");
    assert!(
        recv_log.contains("error (destination, permanent)") && recv_log.contains("d/big.bin"),
        "{recv_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_tells_the_receiver_why_it_stops() {
    // An unreadable source directory ends the walk: the sender fails with kind source and the
    // receiver hears why (instead of a connection closed under it). The sender runs as an
    // unprivileged uid (nobody through setpriv as root, which reads any directory).
    let pki = pki("errors-2");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    write(&src.join("ok/f"), b"x");
    write(&src.join("locked/f"), b"x");
    chmod(&src.join("locked"), 0o000);
    std::fs::create_dir_all(&dst).unwrap();
    let (addr, recv) = start_receiver(&pki, &dst).await;
    let mut sender = unprivileged_mover(&pki, &[base.path()]);
    sender
        .args(["send", "--connect", &addr.to_string(), "--root"])
        .arg(&src)
        .args(pki.args("sender"));
    let out = tokio::task::spawn_blocking(move || sender.output().unwrap())
        .await
        .unwrap();
    chmod(&src.join("locked"), 0o755);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(21), "{err}");
    assert!(
        err.contains("error (source, permanent)") && err.contains("locked"),
        "{err}"
    );
    let r = recv.await.unwrap().unwrap_err();
    assert!(r.contains("sender (source") && r.contains("locked"), "{r}");
}

/// A sender holding the certificate of an earlier attempt refuses the receiver's certificate
/// during the TLS handshake; the receiver only gets an alert, so it logs the identity it
/// presented and the one it expects (the sender's own error names both sides).
#[test]
fn an_identity_mismatch_is_explained_on_both_ends() {
    use ferry_mover::net::{Ca, Identity, Role};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("east", 1).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
    let issue = |name: &str, role: Role, attempt: u32| {
        let id = Identity::scoped("uid.7", role, "east", attempt).unwrap();
        let (cert, key) = ca.issue_for(&id).unwrap();
        std::fs::write(dir.path().join(format!("{name}.crt")), cert).unwrap();
        std::fs::write(dir.path().join(format!("{name}.key")), key).unwrap();
        vec![
            "--ca".to_owned(),
            dir.path().join("ca.crt").display().to_string(),
            "--cert".to_owned(),
            dir.path().join(format!("{name}.crt")).display().to_string(),
            "--key".to_owned(),
            dir.path().join(format!("{name}.key")).display().to_string(),
            "--transfer".to_owned(),
            "uid.7".to_owned(),
        ]
    };
    let receiver_args = issue("r2", Role::Receiver, 2);
    let stale_sender_args = issue("s1", Role::Sender, 1);
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("f"), b"x");
    let mut recv = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--root"])
        .arg(dst.path())
        .args(&receiver_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let recv_lines = stderr_lines(&mut recv);
    let send = Command::new(BIN)
        .args(["send", "--connect", addr.trim(), "--streams", "1", "--root"])
        .arg(src.path())
        .args(&stale_sender_args)
        .output()
        .unwrap();
    // The receiver logs the refused handshake; then it is stopped.
    let mut log = String::new();
    let logged = wait_for_line(
        &recv_lines,
        std::time::Duration::from_secs(10),
        &mut log,
        |l| l.contains("refused connection"),
    );
    recv.kill().unwrap();
    let _ = recv.wait();
    assert!(logged, "no refusal logged within 10 s: {log}");
    let stderr = String::from_utf8_lossy(&send.stderr);
    // A refused identity stays refused: a retry with the same certificates cannot help.
    assert_eq!(send.status.code(), Some(20), "{stderr}");
    assert!(
        stderr.contains("ferry-mover: error (peer, permanent): "),
        "{stderr}"
    );
    let receiver_uri = "urn:ferry:cluster:east:transfer:uid.7:attempt:2:role:receiver";
    let sender_uri = "urn:ferry:cluster:east:transfer:uid.7:attempt:2:role:sender";
    assert!(stderr.contains(receiver_uri), "{stderr}");
    assert!(stderr.contains(":attempt:1:role:sender"), "{stderr}");
    let line = log
        .lines()
        .find(|l| l.contains("refused connection"))
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(
        line.contains("refused this receiver's certificate"),
        "{line}"
    );
    assert!(line.contains(receiver_uri), "presented: {line}");
    assert!(line.contains(sender_uri), "expected: {line}");
}
