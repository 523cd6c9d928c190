//! Ownership, setuid/setgid/sticky bits and user.* xattrs over the network: the sender always
//! sends them, the receiver applies each only when it asked for it (`--owner`,
//! `--special-bits`, `--xattrs`) and counts what it dropped in its summary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use ferry_mover::session::{Keep, SessionSummary};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The receiver's summary, after checking the sender reports the same drops.
async fn transfer(pki: &Pki, src: &Path, dst: &Path, keep: Keep) -> SessionSummary {
    let (addr, recv) = start_receiver_keep(pki, dst, keep).await;
    let sent = send(pki, src, addr, &SendOpts::default())
        .await
        .expect("send");
    let got = recv.await.unwrap().expect("receive");
    let drops = |s: &SessionSummary| (s.dropped_special_bits, s.dropped_xattrs, s.dropped_owners);
    assert_eq!(
        drops(&sent),
        drops(&got),
        "the sender shows what the receiver dropped"
    );
    got
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_bits_are_masked_and_counted_unless_the_receiver_keeps_them() {
    let pki = pki("meta-1");
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("bin/tool"), b"#!/bin/sh\n");
    chmod(&src.path().join("bin/tool"), 0o4755);
    write(&src.path().join("big-setgid"), &random_bytes(2 << 20, 3));
    chmod(&src.path().join("big-setgid"), 0o2750);
    std::fs::create_dir(src.path().join("shared")).unwrap();
    chmod(&src.path().join("shared"), 0o1777);
    write(&src.path().join("plain"), b"x");

    let dst = tempfile::tempdir().unwrap();
    let got = transfer(&pki, src.path(), dst.path(), Keep::default()).await;
    assert_eq!(mode(&dst.path().join("bin/tool")), 0o755);
    assert_eq!(mode(&dst.path().join("big-setgid")), 0o750);
    assert_eq!(mode(&dst.path().join("shared")), 0o777);
    assert_eq!(got.dropped_special_bits, 3, "{got:?}");
    assert_eq!(got.dropped_xattrs, 0);

    let dst = tempfile::tempdir().unwrap();
    let keep = Keep {
        special_bits: true,
        ..Keep::default()
    };
    let got = transfer(&pki, src.path(), dst.path(), keep).await;
    assert_eq!(mode(&dst.path().join("bin/tool")), 0o4755);
    assert_eq!(mode(&dst.path().join("big-setgid")), 0o2750);
    assert_eq!(mode(&dst.path().join("shared")), 0o1777);
    assert_eq!(
        mode(&dst.path().join("plain")),
        mode(&src.path().join("plain"))
    );
    assert_eq!(got.dropped_special_bits, 0, "{got:?}");
}

/// A directory where user xattrs work: the temp dir, else others tried in turn. Fails (never
/// skips) when none does, naming where it looked.
fn xattr_dir() -> tempfile::TempDir {
    let mut tried = Vec::new();
    let candidates: Vec<PathBuf> = [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        std::env::current_dir().unwrap(),
    ]
    .into();
    for base in candidates {
        let Ok(dir) = tempfile::tempdir_in(&base) else {
            tried.push(format!("{} (not writable)", base.display()));
            continue;
        };
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        match rustix::fs::setxattr(&probe, "user.ferry", b"1", rustix::fs::XattrFlags::empty()) {
            Ok(()) => return dir,
            Err(e) => tried.push(format!("{}: {e}", base.display())),
        }
    }
    panic!("no directory with user xattrs found: {tried:?}");
}

fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    let n = rustix::fs::lgetxattr(p, name, &mut buf[..]).ok()?;
    Some(buf[..n].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xattrs_arrive_only_with_the_receivers_consent() {
    let pki = pki("meta-2");
    let work = xattr_dir();
    let src = work.path().join("src");
    write(&src.join("small.txt"), b"small");
    write(&src.join("d/large.bin"), &random_bytes(3 << 20, 5));
    let set = |rel: &str, name: &str, value: &[u8]| {
        rustix::fs::setxattr(src.join(rel), name, value, rustix::fs::XattrFlags::empty()).unwrap()
    };
    set("small.txt", "user.origin", b"lab 7");
    set("small.txt", "user.empty", b"");
    set("d/large.bin", "user.checksum", &[0xff, 0, 1]);
    set("d", "user.project", b"ferry");

    let dst = work.path().join("dst-plain");
    let got = transfer(&pki, &src, &dst, Keep::default()).await;
    assert_eq!(get_xattr(&dst.join("small.txt"), "user.origin"), None);
    assert_eq!(get_xattr(&dst.join("d"), "user.project"), None);
    // A receiver that does not keep xattrs does not get them: the sender does not read them.
    assert_eq!(got.dropped_xattrs, 0, "{got:?}");

    let dst = work.path().join("dst-xattrs");
    let keep = Keep {
        xattrs: true,
        ..Keep::default()
    };
    let got = transfer(&pki, &src, &dst, keep).await;
    assert_eq!(got.dropped_xattrs, 0, "{got:?}");
    assert_eq!(
        get_xattr(&dst.join("small.txt"), "user.origin").as_deref(),
        Some(&b"lab 7"[..])
    );
    assert_eq!(
        get_xattr(&dst.join("small.txt"), "user.empty").as_deref(),
        Some(&b""[..])
    );
    assert_eq!(
        get_xattr(&dst.join("d/large.bin"), "user.checksum").as_deref(),
        Some(&[0xff, 0, 1][..])
    );
    assert_eq!(
        get_xattr(&dst.join("d"), "user.project").as_deref(),
        Some(&b"ferry"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_is_applied_only_with_owner_as_root() {
    assert_eq!(
        rustix::process::geteuid().as_raw(),
        0,
        "this test needs root (chown to another user); run the suite as root"
    );
    let pki = pki("meta-3");
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("owned.txt"), b"mine");
    write(&src.path().join("sub/large.bin"), &random_bytes(2 << 20, 9));
    std::os::unix::fs::symlink("owned.txt", src.path().join("link")).unwrap();
    for rel in ["owned.txt", "sub/large.bin", "sub"] {
        std::os::unix::fs::chown(src.path().join(rel), Some(1234), Some(5678)).unwrap();
    }
    std::os::unix::fs::lchown(src.path().join("link"), Some(4321), Some(8765)).unwrap();
    let owner = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    };

    let dst = tempfile::tempdir().unwrap();
    let got = transfer(&pki, src.path(), dst.path(), Keep::default()).await;
    assert_eq!(owner(&dst.path().join("owned.txt")), (0, 0));
    assert_eq!(owner(&dst.path().join("link")), (0, 0));
    assert_eq!(got.dropped_owners, 4, "{got:?}");

    let dst = tempfile::tempdir().unwrap();
    let keep = Keep {
        owner: true,
        ..Keep::default()
    };
    let got = transfer(&pki, src.path(), dst.path(), keep).await;
    assert_eq!(got.dropped_owners, 0, "{got:?}");
    assert_eq!(owner(&dst.path().join("owned.txt")), (1234, 5678));
    assert_eq!(owner(&dst.path().join("sub/large.bin")), (1234, 5678));
    assert_eq!(owner(&dst.path().join("sub")), (1234, 5678));
    assert_eq!(owner(&dst.path().join("link")), (4321, 8765));
}

#[test]
fn receive_summary_names_what_was_dropped_and_owner_needs_root() {
    let pki = pki("meta-4");
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("tool"), b"#!/bin/sh\n");
    chmod(&src.path().join("tool"), 0o6755);
    let (mut recv, addr, mut out) = spawn_receiver(&pki, dst.path(), &["--json"]);
    let send = run_sender(&pki, src.path(), &addr, &[]);
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(recv.wait().unwrap().success());
    let r: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(r["dropped_special_bits"], 1, "{line}");
    assert_eq!(r["dropped_xattrs"], 0, "{line}");
    assert_eq!(mode(&dst.path().join("tool")), 0o755);

    // The human summary on stderr names them too.
    let dst2 = tempfile::tempdir().unwrap();
    let mut recv = std::process::Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--once", "--root"])
        .arg(dst2.path())
        .args(pki.args("receiver"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _out) = bound_addr(&mut recv);
    let send = std::process::Command::new(BIN)
        .args(["send", "--connect", &addr, "--root"])
        .arg(src.path())
        .args(pki.args("sender"))
        .output()
        .unwrap();
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    let recv = recv.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&recv.stderr);
    assert!(
        err.contains("received: dropped: 1 setuid/setgid/sticky bits (--special-bits)"),
        "{err}"
    );

    // Without root, --owner is refused before anything listens.
    let nobody = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(BIN)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--owner",
            "--root",
        ])
        .arg(dst.path())
        .args(pki.args("receiver"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert_eq!(nobody.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--owner needs the receiver to run as root"),
        "{err}"
    );
}
