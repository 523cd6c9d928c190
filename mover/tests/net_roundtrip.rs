//! Round trips over real TLS on 127.0.0.1, in one process and through the binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::*;
use ferry_mover::session::Compress;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_tree_round_trips_with_1_and_4_streams_and_every_codec() {
    let pki = pki("rt-1");
    let src = tempfile::tempdir().unwrap();
    mixed_tree(src.path());
    let cases = [
        (1, Compress::None),
        (4, Compress::Auto),
        (2, Compress::Zstd),
        (3, Compress::Lz4),
    ];
    for (streams, compress) in cases {
        let dst = tempfile::tempdir().unwrap();
        let o = SendOpts {
            streams,
            compress,
            ..Default::default()
        };
        let (sent, recv) = round_trip(&pki, src.path(), dst.path(), &o).await;
        assert_same_tree(src.path(), dst.path());
        assert_eq!(sent.files, recv.files);
        assert_eq!(sent.streams, streams);
        assert_eq!(
            recv.bytes,
            tree_bytes(src.path()) - 12,
            "hard link's bytes not sent twice"
        );
        assert!(
            !dst.path().join(".ferry-staging").exists(),
            "staging removed after success"
        );
        // Sparse file keeps its hole.
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(dst.path().join("sparse"))
            .unwrap()
            .blocks();
        assert!(
            blocks * 512 < 1024 * 1024,
            "sparse file materialised: {blocks} blocks"
        );
        match compress {
            Compress::Zstd | Compress::Lz4 => assert!(
                sent.wire_bytes < recv.bytes,
                "{compress:?} should shrink the text files: wire {} payload {}",
                sent.wire_bytes,
                recv.bytes
            ),
            // Raw: the random 14 MiB dominate, so wire >= payload minus the zero blocks.
            _ => assert!(sent.wire_bytes > 14 * 1024 * 1024),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_run_sends_no_payload_and_delete_removes_extras() {
    let pki = pki("rt-2");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    mixed_tree(src.path());
    let (first, _) = round_trip(&pki, src.path(), dst.path(), &SendOpts::default()).await;
    assert!(first.wire_bytes > 14 * 1024 * 1024);

    write(&dst.path().join("extra/junk.txt"), b"not in source");
    write(&dst.path().join("dir/stale"), b"old");
    let o = SendOpts {
        delete: true,
        ..Default::default()
    };
    let (second, recv) = round_trip(&pki, src.path(), dst.path(), &o).await;
    assert_eq!(recv.files, 0, "nothing rewritten");
    assert_eq!(recv.bytes, 0);
    assert!(second.skipped >= 300, "skipped {}", second.skipped);
    assert!(
        second.wire_bytes < 200 * 1024,
        "incremental run sent {} wire bytes",
        second.wire_bytes
    );
    assert!(!dst.path().join("extra").exists());
    assert!(!dst.path().join("dir/stale").exists());
    assert_same_tree(src.path(), dst.path());

    // A changed file is resent; --checksum catches same-size same-mtime content changes.
    let p = dst.path().join("many/f0001");
    let md = std::fs::metadata(&p).unwrap();
    std::fs::write(&p, b"FILE 1\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(md.modified().unwrap())
        .unwrap();
    let o = SendOpts {
        checksum: true,
        ..Default::default()
    };
    let (_, recv) = round_trip(&pki, src.path(), dst.path(), &o).await;
    assert_eq!(recv.files, 1);
    assert_same_tree(src.path(), dst.path());
}

#[test]
fn binary_round_trip_with_json_summaries() {
    let pki = pki("rt-bin");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    mixed_tree(src.path());
    let mut recv = Command::new(BIN)
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
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, mut out) = bound_addr(&mut recv);
    let send = Command::new(BIN)
        .args([
            "send",
            "--connect",
            addr.trim(),
            "--streams",
            "4",
            "--compress",
            "auto",
            "--json",
            "--root",
        ])
        .arg(src.path())
        .args(pki.args("sender"))
        .output()
        .unwrap();
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(recv.wait().unwrap().success());
    let s: serde_json::Value = serde_json::from_slice(&send.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&line).unwrap();
    for k in [
        "files",
        "bytes",
        "wire_bytes",
        "seconds",
        "streams",
        "skipped",
        "resumed_bytes",
        "dedup_blocks",
        "dedup_bytes",
    ] {
        assert!(
            s.get(k).is_some() && r.get(k).is_some(),
            "summary lacks {k}"
        );
    }
    assert_eq!(s["files"], r["files"]);
    assert_eq!(s["streams"], 4);
    let digest = s["digest"].as_str().unwrap();
    assert_eq!(digest.len(), 64, "digest {digest:?}");
    assert_eq!(s["digest"], r["digest"], "both ends print the same digest");
    assert_same_tree(src.path(), dst.path());
}

#[test]
fn certs_command_writes_all_files() {
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new(BIN)
        .args(["certs", "--transfer", "abc", "--out"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    for f in [
        "ca.crt",
        "sender.crt",
        "sender.key",
        "receiver.crt",
        "receiver.key",
        "operator.crt",
        "operator.key",
    ] {
        assert!(dir.path().join(f).metadata().unwrap().len() > 100, "{f}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = dir
        .path()
        .join("sender.key")
        .metadata()
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "key readable by others");
    let bad = Command::new(BIN)
        .args(["certs", "--transfer", "../x", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid transfer id"));
}
