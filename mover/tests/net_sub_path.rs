//! `--sub-path`: a Transfer's directory beneath a granted root, resolved without following any
//! symlink on either end. A symlink on the way fails the mover with a permanent status before
//! anything is read or written; nothing outside the root changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// `receive --once --root ROOT --sub-path SUB FLAGS`, waited for, with the sender's output.
fn transfer(
    pki: &Pki,
    src: &Path,
    src_sub: Option<&str>,
    dst: &Path,
    dst_sub: Option<&str>,
    send_flags: &[&str],
) -> (std::process::Output, std::process::ExitStatus, String) {
    let mut recv_flags = vec!["--json"];
    if let Some(s) = dst_sub {
        recv_flags.extend(["--sub-path", s]);
    }
    let (mut recv, addr, _out) = spawn_receiver(pki, dst, &recv_flags);
    let mut flags = send_flags.to_vec();
    if let Some(s) = src_sub {
        flags.extend(["--sub-path", s]);
    }
    let send = run_sender(pki, src, &addr, &flags);
    let status = recv.wait().unwrap();
    let mut log = String::new();
    recv.stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    (send, status, log)
}

/// A mover run that fails before it connects or listens.
fn run(pki: &Pki, role: &str, root: &Path, sub: &str) -> std::process::Output {
    run_with(pki, role, root, sub, &[])
}

fn run_with(pki: &Pki, role: &str, root: &Path, sub: &str, extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    match role {
        "sender" => cmd.args(["send", "--connect", "127.0.0.1:9"]),
        _ => cmd.args(["receive", "--listen", "127.0.0.1:0", "--once"]),
    };
    cmd.arg("--root")
        .arg(root)
        .args(["--sub-path", sub])
        .args(pki.args(role))
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_sub_path_is_sent_and_received_and_missing_directories_are_created() {
    let pki = pki("sub-1");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    mixed_tree(&src.join("data/x"));
    write(&src.join("other/not-sent"), b"outside the sub path");
    std::fs::create_dir_all(&dst).unwrap();
    let (send, status, log) = transfer(&pki, &src, Some("data//x/"), &dst, Some("tenant/a/b"), &[]);
    let stderr = String::from_utf8_lossy(&send.stderr);
    assert_eq!(send.status.code(), Some(0), "{stderr}\n{log}");
    assert!(status.success(), "{log}");
    assert_same_tree(&src.join("data/x"), &dst.join("tenant/a/b"));
    for d in ["tenant", "tenant/a", "tenant/a/b"] {
        let mode = std::fs::metadata(dst.join(d)).unwrap().permissions().mode();
        // The sender's root mode may apply to the sub path itself; its parents are created 0755.
        if d != "tenant/a/b" {
            assert_eq!(mode & 0o7777, 0o755, "{d}");
        }
    }
    assert!(!dst.join("tenant/a/b/.ferry-staging").exists());
    assert!(!dst.join("not-sent").exists() && !dst.join("tenant/a/b/not-sent").exists());
    // Messages name the user's paths, never the held handle.
    assert!(!stderr.contains("/proc/self/fd") && !log.contains("/proc/self/fd"));

    // --delete works on the sub path alone: an extra entry goes, the root's siblings stay.
    write(&dst.join("tenant/a/b/extra"), b"x");
    write(&dst.join("tenant/a/sibling"), b"kept");
    let (send, status, log) = transfer(
        &pki,
        &src,
        Some("data/x"),
        &dst,
        Some("tenant/a/b"),
        &["--delete"],
    );
    assert_eq!(
        send.status.code(),
        Some(0),
        "{}\n{log}",
        String::from_utf8_lossy(&send.stderr)
    );
    assert!(status.success());
    assert!(!dst.join("tenant/a/b/extra").exists());
    assert_eq!(
        std::fs::read(dst.join("tenant/a/sibling")).unwrap(),
        b"kept"
    );
    assert_same_tree(&src.join("data/x"), &dst.join("tenant/a/b"));
}

#[test]
fn a_sub_path_naming_a_file_sends_that_file() {
    let pki = pki("sub-2");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    let data = random_bytes(5 << 20, 3);
    write(&src.join("data/one.bin"), &data);
    write(&src.join("data/two.bin"), b"not sent");
    std::fs::create_dir_all(&dst).unwrap();
    let (send, status, log) = transfer(&pki, &src, Some("data/one.bin"), &dst, Some("in"), &[]);
    assert_eq!(
        send.status.code(),
        Some(0),
        "{}\n{log}",
        String::from_utf8_lossy(&send.stderr)
    );
    assert!(status.success());
    assert_eq!(std::fs::read(dst.join("in/one.bin")).unwrap(), data);
    assert!(!dst.join("in/two.bin").exists());
}

/// `outside` holds one file; returns its listing to compare after the run.
fn outside_dir(base: &Path) -> (std::path::PathBuf, Vec<(String, Vec<u8>)>) {
    let outside = base.join("outside");
    write(&outside.join("victim"), b"must not change");
    let l = listing(&outside);
    (outside, l)
}

fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let data = std::fs::read(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), data)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_symlink_on_the_receivers_sub_path_is_refused_and_nothing_is_written_outside() {
    let pki = pki("sub-3");
    let base = tempfile::tempdir().unwrap();
    let (outside, before) = outside_dir(base.path());
    let dst = base.path().join("dst");
    std::fs::create_dir_all(dst.join("data/x")).unwrap();
    // Middle component and last component.
    std::os::unix::fs::symlink(&outside, dst.join("data/mid")).unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("data/x/esc")).unwrap();
    for (sub, component) in [("data/mid/y/z", "data/mid"), ("data/x/esc", "data/x/esc")] {
        let out = run(&pki, "receiver", &dst, sub);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(22), "{sub}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "destination path {component} (beneath {}) is a symbolic link; ferry does not \
                 follow symlinks on the way to a Transfer's directory",
                dst.display()
            )),
            "{stderr}"
        );
        assert!(
            stderr.contains("error (destination, permanent)"),
            "{stderr}"
        );
        // It never listened: no address on stdout.
        assert!(out.stdout.is_empty(), "{sub}");
    }
    assert_eq!(listing(&outside), before, "the symlink's target changed");
}

#[test]
fn a_symlink_on_the_senders_sub_path_is_refused_and_nothing_outside_is_read() {
    let pki = pki("sub-4");
    let base = tempfile::tempdir().unwrap();
    let (outside, before) = outside_dir(base.path());
    let src = base.path().join("src");
    write(&src.join("data/x/f"), b"x");
    std::os::unix::fs::symlink(&outside, src.join("data/mid")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("data/x/esc")).unwrap();
    let dst = base.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    for (sub, component) in [
        ("data/mid/victim", "data/mid"),
        ("data/x/esc", "data/x/esc"),
    ] {
        // A real receiver: the sender must fail before it sends anything.
        let (send, status, log) = {
            let (mut recv, addr, _out) = spawn_receiver(&pki, &dst, &[]);
            let send = run_sender(&pki, &src, &addr, &["--sub-path", sub]);
            recv.kill().unwrap();
            let status = recv.wait().unwrap();
            let mut log = String::new();
            recv.stderr
                .take()
                .unwrap()
                .read_to_string(&mut log)
                .unwrap();
            (send, status, log)
        };
        let stderr = String::from_utf8_lossy(&send.stderr);
        assert_eq!(send.status.code(), Some(21), "{sub}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "source path {component} (beneath {}) is a symbolic link",
                src.display()
            )),
            "{stderr}"
        );
        assert!(stderr.contains("error (source, permanent)"), "{stderr}");
        assert!(!status.success(), "the receiver was killed: {log}");
        assert!(listing(&dst).is_empty(), "{sub}: something arrived");
    }
    assert_eq!(listing(&outside), before);
    // A sub path that does not exist is permanent too.
    let out = run(&pki, "sender", &src, "data/nope");
    assert_eq!(
        out.status.code(),
        Some(21),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_sub_path_that_leaves_the_root_is_a_usage_error() {
    let pki = pki("sub-5");
    let base = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(base.path().join("root/a")).unwrap();
    for role in ["sender", "receiver"] {
        for sub in ["..", "a/../..", "/etc"] {
            let out = run(&pki, role, &base.path().join("root"), sub);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{role} {sub}: {stderr}");
            assert!(stderr.contains("--sub-path"), "{stderr}");
        }
    }
    assert_eq!(
        std::fs::read_dir(base.path()).unwrap().count(),
        1,
        "nothing created beside the root"
    );
}

#[test]
fn a_second_receiver_of_one_destination_is_refused_while_the_first_runs() {
    let pki = pki("sub-lock");
    let base = tempfile::tempdir().unwrap();
    let dst = base.path().join("dst");
    std::fs::create_dir_all(dst.join("a")).unwrap();
    // The first receiver listens (and holds the lock) until its session, which never comes.
    let (mut first, _addr, _out) = spawn_receiver(&pki, &dst, &["--sub-path", "a"]);
    let second = run_with(&pki, "receiver", &dst, "a", &["--lock-wait", "0"]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    first.kill().unwrap();
    first.wait().unwrap();
    // Destination, retryable: the other receiver may finish.
    assert_eq!(second.status.code(), Some(12), "{stderr}");
    assert!(stderr.contains("in use by another receiver"), "{stderr}");
    // Once the first is gone the destination is free again: the next receiver listens.
    let (mut again, _addr, _out) = spawn_receiver(&pki, &dst, &["--sub-path", "a"]);
    again.kill().unwrap();
    again.wait().unwrap();
}

#[test]
fn clean_staging_never_follows_a_symlinked_sub_path() {
    let base = tempfile::tempdir().unwrap();
    let (root, outside) = (base.path().join("root"), base.path().join("outside"));
    std::fs::create_dir_all(outside.join(".ferry-staging/uid.1")).unwrap();
    std::fs::create_dir_all(root.join("t")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("t/esc")).unwrap();
    let out = Command::new(BIN)
        .args(["clean-staging", "--root"])
        .arg(&root)
        .args(["--sub-path", "t/esc", "--transfer-prefix", "uid."])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symbolic link"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        outside.join(".ferry-staging/uid.1").exists(),
        "cleaned through the link"
    );
}
