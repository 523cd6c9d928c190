//! A file that cannot be read is named on stderr, counted, and makes the exit status non-zero,
//! while everything else is still copied.
//!
//! Tests run as root, which can read anything, so the copy itself runs as `nobody` (setpriv)
//! over a tree that `nobody` may traverse but where one file is root-only (mode 000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use copy_support::*;

#[test]
fn unreadable_file_is_reported_and_the_rest_is_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = base.join("src");
    let dst = base.join("dst");
    write(&src.join("ok-1"), b"fine");
    write(&src.join("dir/ok-2"), b"fine too");
    write(&src.join("dir/locked"), b"nobody may read this");
    std::fs::set_permissions(
        src.join("dir/locked"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();

    let run = if is_root() {
        std::fs::create_dir(&dst).unwrap();
        std::os::unix::fs::chown(&dst, Some(65534), Some(65534)).unwrap();
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(BIN)
            .args(["copy", "--json"])
            .arg(&src)
            .arg(&dst)
            .output()
            .expect("setpriv");
        parse(out)
    } else {
        copy(&src, &dst, &[])
    };
    assert_eq!(
        run.status.code(),
        Some(1),
        "exit status; stderr: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("dir/locked"),
        "stderr must name the file: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Permission denied"),
        "stderr must give the cause: {}",
        run.stderr
    );
    assert_eq!(run.n("failed"), 1);
    assert_eq!(run.n("files"), 2);
    assert_eq!(std::fs::read(dst.join("ok-1")).unwrap(), b"fine");
    assert_eq!(std::fs::read(dst.join("dir/ok-2")).unwrap(), b"fine too");
    assert!(!dst.join("dir/locked").exists());
    assert!(
        temp_names(&dst).is_empty(),
        "no temp file may be left: {:?}",
        temp_names(&dst)
    );
}

#[test]
fn missing_source_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let run = copy(&tmp.path().join("nope"), &tmp.path().join("dst"), &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stderr.contains("nope"), "{}", run.stderr);
}
