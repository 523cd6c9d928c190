//! Metadata survives a copy: modes, mtimes with nanoseconds (files and directories, the latter
//! set after their children), owners when root, empty directories.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use copy_support::*;

#[test]
fn modes_mtimes_owners_and_empty_dirs_are_preserved() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("a/b/c.txt"), b"hello");
    write(&src.join("exec"), b"#!/bin/sh\n");
    write(&src.join("private"), b"secret");
    std::fs::create_dir_all(src.join("empty/nested-empty")).unwrap();
    std::fs::set_permissions(src.join("exec"), std::fs::Permissions::from_mode(0o751)).unwrap();
    std::fs::set_permissions(src.join("private"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(src.join("a/b"), std::fs::Permissions::from_mode(0o710)).unwrap();
    if is_root() {
        std::os::unix::fs::lchown(src.join("a/b/c.txt"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(src.join("a"), Some(4321), Some(8765)).unwrap();
    }
    set_mtime(&src.join("a/b/c.txt"), 1_000_000_000, 123_456_789);
    set_mtime(&src.join("exec"), 1_100_000_000, 1);
    set_mtime(&src.join("private"), 1_200_000_000, 999_999_999);
    // Directory mtimes are set last in the source too, after their contents exist.
    set_mtime(&src.join("empty/nested-empty"), 1_300_000_000, 5);
    set_mtime(&src.join("empty"), 1_300_000_001, 6);
    set_mtime(&src.join("a/b"), 1_400_000_000, 7);
    set_mtime(&src.join("a"), 1_400_000_001, 8);

    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("files"), 3);
    assert_same_tree(&src, &dst);
    let md = std::fs::metadata(dst.join("a/b/c.txt")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));
    let dir = std::fs::metadata(dst.join("a/b")).unwrap();
    assert_eq!(dir.mode() & 0o7777, 0o710);
    assert_eq!((dir.mtime(), dir.mtime_nsec()), (1_400_000_000, 7));
    assert!(dst.join("empty/nested-empty").is_dir());
    if is_root() {
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        let a = std::fs::metadata(dst.join("a")).unwrap();
        assert_eq!((a.uid(), a.gid()), (4321, 8765));
    }
}

#[test]
fn unchanged_file_with_new_mode_gets_the_mode_updated() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("f"), b"x");
    copy_ok(&src, &dst, &[]);
    std::fs::set_permissions(src.join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let run = copy_ok(&src, &dst, &[]);
    assert_eq!(run.n("files"), 0);
    assert_eq!(
        std::fs::metadata(dst.join("f")).unwrap().mode() & 0o777,
        0o640
    );
}
