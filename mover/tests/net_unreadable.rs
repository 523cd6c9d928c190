//! Source entries the sender may not read (a root-owned 0640 file on a hostPath): without
//! `--skip-unreadable` the transfer fails at once, permanently, naming the entry; with it the
//! rest arrives, the entries are named (JSON summary, progress service) and the exit status is 1,
//! and a receiver with `--delete` keeps its copies of them.
//!
//! The sender runs as an unprivileged uid (nobody through setpriv when the tests run as root,
//! as in CI), since root reads anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ferry_proto::progress::v1::Phase;
use ferry_proto::wire::v1::ErrorKind as PbKind;

/// `send --connect ADDR FLAGS --root SRC` as an unprivileged uid, to the end.
fn send_unprivileged(pki: &Pki, base: &Path, src: &Path, addr: &str, flags: &[&str]) -> Output {
    unprivileged_mover(pki, &[base])
        .args(["send", "--connect", addr])
        .args(flags)
        .arg("--root")
        .arg(src)
        .args(pki.args("sender"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("ferry-mover: error"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_file_fails_the_transfer_at_once_naming_it() {
    let pki = pki("unreadable-1");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    // 12 MiB behind a 1 MB/s limit: sending it all before failing would take about 12 s.
    for i in 0..3 {
        write(&src.join(format!("big{i}")), &random_bytes(4 << 20, i));
    }
    write(&src.join("secret"), b"root only");
    chmod(&src.join("secret"), 0o000);
    std::fs::create_dir_all(&dst).unwrap();
    let (addr, recv) = start_receiver(&pki, &dst).await;
    let started = Instant::now();
    let (b, s, a) = (base.path().to_owned(), src.clone(), addr.to_string());
    let flags = [
        "--streams",
        "2",
        "--compress",
        "none",
        "--bandwidth-limit",
        "1000000",
    ];
    let out = tokio::task::spawn_blocking(move || {
        (send_unprivileged(&pki, &b, &s, &a, &flags), Instant::now())
    })
    .await
    .unwrap();
    let (out, ended) = out;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(21), "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.starts_with("ferry-mover: error (source, permanent): "),
        "{line}"
    );
    assert!(line.contains("secret"), "names the entry: {line}");
    assert!(
        line.contains("--skip-unreadable"),
        "says the way out: {line}"
    );
    let took = ended - started;
    assert!(
        took < Duration::from_secs(6),
        "failed only after {took:?}: the data was sent first"
    );
    let r = recv.await.unwrap().unwrap_err();
    assert!(r.contains("sender (source") && r.contains("secret"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_directory_fails_the_transfer_naming_it() {
    let pki = pki("unreadable-2");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    write(&src.join("ok/f"), b"x");
    write(&src.join("locked/f"), b"y");
    chmod(&src.join("locked"), 0o000);
    std::fs::create_dir_all(&dst).unwrap();
    let (addr, recv) = start_receiver(&pki, &dst).await;
    let (b, s, a) = (base.path().to_owned(), src.clone(), addr.to_string());
    let out = tokio::task::spawn_blocking(move || send_unprivileged(&pki, &b, &s, &a, &[]))
        .await
        .unwrap();
    chmod(&src.join("locked"), 0o755);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(21), "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.starts_with("ferry-mover: error (source, permanent): ")
            && line.contains("locked")
            && line.contains("--skip-unreadable"),
        "{line}"
    );
    let r = recv.await.unwrap().unwrap_err();
    assert!(r.contains("sender (source") && r.contains("locked"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_unreadable_sends_the_rest_names_what_it_left_out_and_delete_keeps_it() {
    let pki = pki("unreadable-3");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    write(&src.join("a.txt"), b"readable");
    write(&src.join("dir/b.bin"), &random_bytes(2 << 20, 1));
    write(&src.join("secret"), b"new root-only content");
    chmod(&src.join("secret"), 0o000);
    write(&src.join("locked/inner"), b"new inner");
    chmod(&src.join("locked"), 0o000);
    // The destination's copies of the unreadable entries, and one entry --delete must remove.
    write(&dst.join("secret"), b"old copy of the secret");
    write(&dst.join("locked/inner"), b"old inner");
    write(&dst.join("locked/only-here"), b"kept");
    write(&dst.join("gone"), b"not in the source");

    let (addr, recv) = start_receiver(&pki, &dst).await;
    let mut sender = unprivileged_mover(&pki, &[base.path()])
        .args(["send", "--connect", &addr.to_string()])
        .args([
            "--skip-unreadable",
            "--delete",
            "--json",
            "--progress-listen",
            "127.0.0.1:0",
            "--root",
        ])
        .arg(&src)
        .args(pki.args("sender"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (progress, stderr) = progress_addr(&mut sender);
    let updates = watch_progress(&pki, progress).await;
    let out = tokio::task::spawn_blocking(move || sender.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = stderr.join().unwrap();
    let received = recv.await.unwrap();
    chmod(&src.join("locked"), 0o755);
    chmod(&src.join("secret"), 0o644);

    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unreadable, left out: secret")
            && stderr.contains("unreadable, left out: locked"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(json["unreadable"], 2, "{json}");
    let mut named: Vec<&str> = json["unreadable_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(named, ["locked", "secret"], "{json}");
    assert_eq!(json["failed"], 0, "{json}");

    let last = updates.last().expect("no progress update");
    assert_eq!(last.phase, Phase::Failed as i32, "{last:?}");
    assert_eq!(last.error_kind, PbKind::Source as i32, "{last:?}");
    assert_eq!(last.unreadable_count, 2, "{last:?}");
    let mut paths = last.unreadable_paths.clone();
    paths.sort();
    assert_eq!(paths, ["locked", "secret"], "{last:?}");

    // The rest arrived; the receiver itself succeeded.
    let received = received.unwrap();
    assert_eq!(received.failed, 0, "{received:?}");
    assert_eq!(std::fs::read(dst.join("a.txt")).unwrap(), b"readable");
    assert_eq!(
        std::fs::read(dst.join("dir/b.bin")).unwrap(),
        random_bytes(2 << 20, 1)
    );
    // --delete did run, and kept the copies of what the sender could not read.
    assert!(!dst.join("gone").exists(), "--delete did not run");
    assert_eq!(
        std::fs::read(dst.join("secret")).unwrap(),
        b"old copy of the secret"
    );
    assert_eq!(
        std::fs::read(dst.join("locked/inner")).unwrap(),
        b"old inner"
    );
    assert_eq!(
        std::fs::read(dst.join("locked/only-here")).unwrap(),
        b"kept"
    );
}
