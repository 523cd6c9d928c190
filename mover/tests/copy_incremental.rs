//! Incremental runs: unchanged files (size + mtime) are skipped, changed ones recopied;
//! `--checksum` catches a same-size, same-mtime content change that size + mtime cannot see.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod copy_support;

use copy_support::*;

#[test]
fn second_run_copies_nothing_and_changes_are_picked_up() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    for i in 0..50 {
        write(
            &src.join(format!("d{}/f{i}", i % 5)),
            format!("file {i}").as_bytes(),
        );
    }
    let first = copy_ok(&src, &dst, &[]);
    assert_eq!(first.n("files"), 50);
    let second = copy_ok(&src, &dst, &[]);
    assert_eq!(
        (second.n("files"), second.n("skipped"), second.n("bytes")),
        (0, 50, 0)
    );

    write(&src.join("d1/f1"), b"changed and longer");
    let third = copy_ok(&src, &dst, &[]);
    assert_eq!((third.n("files"), third.n("skipped")), (1, 49));
    assert_eq!(
        std::fs::read(dst.join("d1/f1")).unwrap(),
        b"changed and longer"
    );
    assert_same_tree(&src, &dst);
}

#[test]
fn checksum_catches_same_size_same_mtime_change() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    write(&src.join("f"), b"AAAA");
    write(&src.join("g"), b"same");
    set_mtime(&src.join("f"), 1_500_000_000, 1);
    copy_ok(&src, &dst, &[]);
    write(&src.join("f"), b"BBBB");
    set_mtime(&src.join("f"), 1_500_000_000, 1);

    let quick = copy_ok(&src, &dst, &[]);
    assert_eq!(quick.n("files"), 0, "size+mtime cannot see the change");
    assert_eq!(std::fs::read(dst.join("f")).unwrap(), b"AAAA");

    let sum = copy_ok(&src, &dst, &["--checksum"]);
    assert_eq!((sum.n("files"), sum.n("skipped")), (1, 1));
    assert_eq!(std::fs::read(dst.join("f")).unwrap(), b"BBBB");
}
