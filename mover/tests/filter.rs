//! `--exclude` / `--include` through the binary, for `copy` and for `send`/`receive`: what is
//! left out, the first matching rule deciding (command-line order), and `--delete` keeping the
//! destination entries an exclude rule matches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn exists(root: &Path, rel: &str) -> bool {
    root.join(rel).symlink_metadata().is_ok()
}

/// Source and destination as a user would have them before a filtered `--delete` run.
fn setup(base: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, dst) = (base.join("src"), base.join("dst"));
    for rel in [
        "keep.txt",
        "a.tmp",
        "sub/b.tmp",
        "sub/c.txt",
        "cache/big.bin",
        "logs/x.gz",
        "logs/y.txt",
        "deep/cache/z",
    ] {
        write(&src.join(rel), rel.as_bytes());
    }
    for rel in ["extra.txt", "old.tmp", "cache/old", "sub/gone"] {
        write(&dst.join(rel), b"was here");
    }
    (src, dst)
}

const RULES: [&str; 8] = [
    "--exclude",
    "*.tmp",
    "--exclude",
    "/cache/",
    "--include",
    "logs/*.txt",
    "--exclude",
    "logs/*",
];

fn check(src: &Path, dst: &Path) {
    for rel in ["keep.txt", "sub/c.txt", "logs/y.txt", "deep/cache/z"] {
        assert_eq!(
            std::fs::read(dst.join(rel)).unwrap(),
            std::fs::read(src.join(rel)).unwrap(),
            "{rel}"
        );
    }
    for rel in ["a.tmp", "sub/b.tmp", "cache/big.bin", "logs/x.gz"] {
        assert!(!exists(dst, rel), "{rel} was excluded yet copied");
    }
    for rel in ["old.tmp", "cache/old"] {
        assert_eq!(
            std::fs::read(dst.join(rel)).unwrap(),
            b"was here",
            "{rel}: --delete removed an excluded destination entry"
        );
    }
    for rel in ["extra.txt", "sub/gone"] {
        assert!(!exists(dst, rel), "{rel} not deleted by --delete");
    }
}

#[test]
fn copy_leaves_out_excluded_entries_and_delete_keeps_them() {
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let out = Command::new(BIN)
        .args(["copy", "--delete", "--json"])
        .args(RULES)
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    check(&src, &dst);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["files"], 4, "{summary}");
    assert_eq!(summary["deleted"], 2, "{summary}");
}

#[test]
fn send_leaves_out_excluded_entries_and_the_receiver_keeps_them_from_delete() {
    let pki = pki("filter-net");
    let base = tempfile::tempdir().unwrap();
    let (src, dst) = setup(base.path());
    let (mut recv, addr, _out) = spawn_receiver(&pki, &dst, &["--json"]);
    let flags = [&["-q", "--delete"][..], &RULES].concat();
    let send = run_sender(&pki, &src, &addr, &flags);
    let status = recv.wait().unwrap();
    assert!(send.status.success(), "{send:?}");
    assert!(status.success());
    check(&src, &dst);
}

/// The same two rules in the two orders: the first that matches decides.
#[test]
fn the_first_matching_rule_decides_in_command_line_order() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    write(&src.join("a.txt"), b"a");
    write(&src.join("b.txt"), b"b");
    let run = |dst: &Path, rules: &[&str]| {
        let out = Command::new(BIN)
            .arg("copy")
            .args(rules)
            .arg(&src)
            .arg(dst)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let first_include = base.path().join("d1");
    run(
        &first_include,
        &["--include", "a.txt", "--exclude", "*.txt"],
    );
    assert!(exists(&first_include, "a.txt") && !exists(&first_include, "b.txt"));
    let first_exclude = base.path().join("d2");
    run(
        &first_exclude,
        &["--exclude", "*.txt", "--include", "a.txt"],
    );
    assert!(!exists(&first_exclude, "a.txt") && !exists(&first_exclude, "b.txt"));
}

#[test]
fn a_bad_pattern_is_refused_before_anything_is_written() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    write(&src.join("a"), b"a");
    let dst = base.path().join("dst");
    let out = Command::new(BIN)
        .args(["copy", "--exclude", "x[y"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--exclude pattern \"x[y\": unclosed"), "{err}");
    assert!(!exists(&dst, ""), "the destination was created");
}
