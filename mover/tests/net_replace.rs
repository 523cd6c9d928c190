//! The replacement rule over the network: the receiver never replaces a non-empty directory by a
//! file, symlink or hard link unless the sender asked for `--delete`; a refused entry is skipped
//! and counted as failed, the rest of the transfer finishes, and both ends report the failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod replace_matrix;

use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_over_every_kind_without_delete() {
    let pki = pki("replace-1");
    let w = replace_matrix::world();
    let (sent, recv) = round_trip(&pki, &w.src, &w.dst, &SendOpts::default()).await;
    let failed = replace_matrix::expected_failed(false);
    for (end, s) in [("sender", &sent), ("receiver", &recv)] {
        assert_eq!(s.failed, failed, "{end}: {:?}", s.failures);
        assert_eq!(s.failures.len() as u64, failed, "{end}: every message kept");
        assert_eq!(s.deleted, 0, "{end}");
    }
    assert_eq!(
        sent.failures, recv.failures,
        "the sender sees the receiver's reasons"
    );
    let messages = recv.failures.join("\n");
    for n in replace_matrix::HARD_LINKS {
        assert!(messages.contains(n), "{n} not in {messages}");
    }
    w.check(false, &messages);
    // Nothing is left over to redo: a second run refuses the same entries and writes nothing.
    let (_, again) = round_trip(&pki, &w.src, &w.dst, &SendOpts::default()).await;
    assert_eq!((again.failed, again.files), (failed, 0));
    w.check(false, &again.failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_over_every_kind_with_delete() {
    let pki = pki("replace-2");
    let w = replace_matrix::world();
    let o = SendOpts {
        delete: true,
        ..Default::default()
    };
    let (sent, recv) = round_trip(&pki, &w.src, &w.dst, &o).await;
    for (end, s) in [("sender", &sent), ("receiver", &recv)] {
        assert_eq!(s.failed, 0, "{end}: {:?}", s.failures);
        assert_eq!(s.deleted, replace_matrix::expected_deleted(true), "{end}");
    }
    w.check(true, "");
}

/// A non-empty directory deeper in the tree, a large file (published from the staging area) and
/// more refusals than the Summary carries messages for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_large_and_many_refusals() {
    let pki = pki("replace-3");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(
        &src.path().join("a/b/big"),
        &random_bytes(5 * 1024 * 1024, 3),
    );
    write(&dst.path().join("a/b/big/keep"), b"z");
    for i in 0..12 {
        write(&src.path().join(format!("many/f{i:02}")), b"new");
        write(&dst.path().join(format!("many/f{i:02}/keep")), b"z");
    }
    write(&src.path().join("a/ok"), b"ok");
    let (sent, recv) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert_eq!((sent.failed, recv.failed), (13, 13));
    assert_eq!(
        sent.failures.len(),
        8,
        "messages capped: {:?}",
        sent.failures
    );
    assert_eq!(recv.files, 1, "a/ok");
    // Refused when offered, so the refused files' data never crossed the wire.
    assert!(
        sent.wire_bytes < 1024 * 1024,
        "sent {} bytes",
        sent.wire_bytes
    );
    assert_eq!(
        std::fs::read(dst.path().join("a/b/big/keep")).unwrap(),
        b"z"
    );
    assert_eq!(
        std::fs::read(dst.path().join("many/f07/keep")).unwrap(),
        b"z"
    );
    assert_eq!(std::fs::read(dst.path().join("a/ok")).unwrap(), b"ok");

    let o = SendOpts {
        delete: true,
        ..Default::default()
    };
    let (sent, recv) = round_trip(&pki, src.path(), dst.path(), &o).await;
    assert_eq!((sent.failed, recv.deleted, sent.deleted), (0, 13, 13));
    assert_same_tree(src.path(), dst.path());
}

/// The report's reproduction through both binaries: both exit 1, the sender names `f`, and
/// `f/inner` keeps its contents.
#[test]
fn both_binaries_fail_and_the_sender_names_the_refused_path() {
    let pki = pki("replace-bin");
    let ts = tempfile::tempdir().unwrap();
    let td = tempfile::tempdir().unwrap();
    write(&ts.path().join("f"), b"x\n");
    write(&ts.path().join("g"), b"the rest\n");
    write(&td.path().join("f/inner"), b"z\n");
    let mut recv = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--root"])
        .arg(td.path())
        .args(pki.args("receiver"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let send = Command::new(BIN)
        .args(["send", "--connect", addr.trim(), "--json", "--root"])
        .arg(ts.path())
        .args(pki.args("sender"))
        .output()
        .unwrap();
    let received = recv.wait_with_output().unwrap();
    let send_err = String::from_utf8_lossy(&send.stderr);
    let recv_err = String::from_utf8_lossy(&received.stderr);
    assert_eq!(send.status.code(), Some(1), "{send_err}");
    assert_eq!(received.status.code(), Some(1), "{recv_err}");
    let refusal = "refusing to replace non-empty directory f with a file; pass --delete";
    assert!(send_err.contains(refusal), "sender: {send_err}");
    assert!(recv_err.contains(refusal), "receiver: {recv_err}");
    let s: serde_json::Value = serde_json::from_slice(&send.stdout).unwrap();
    assert_eq!(
        (s["failed"].as_u64(), s["files"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(std::fs::read(td.path().join("f/inner")).unwrap(), b"z\n");
    assert_eq!(std::fs::read(td.path().join("g")).unwrap(), b"the rest\n");
}
