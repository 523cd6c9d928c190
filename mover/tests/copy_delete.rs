//! `--delete` removes destination entries missing from the source, and only those.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn delete_removes_extras_only() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let outside = tmp.path().join("outside");
    write(&outside.join("keep-me"), b"outside");
    write(&src.join("keep"), b"k");
    write(&src.join("sub/keep2"), b"k2");
    copy_ok(&src, &dst, &[]);
    write(&dst.join("extra-file"), b"x");
    write(&dst.join("extra-dir/deep/file"), b"x");
    write(&dst.join("sub/extra"), b"x");
    std::os::unix::fs::symlink(&outside, dst.join("extra-link")).unwrap();

    let without = copy_ok(&src, &dst, &[]);
    assert_eq!(without.n("deleted"), 0);
    assert!(dst.join("extra-file").exists(), "no --delete: extras stay");

    let run = copy_ok(&src, &dst, &["--delete"]);
    assert_eq!(run.n("deleted"), 4);
    assert_same_tree(&src, &dst);
    assert!(
        outside.join("keep-me").is_file(),
        "deleting a link must not touch its target"
    );
}
